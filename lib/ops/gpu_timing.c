/*
 * gpu_timing.c - HVD_GPU_TIMING=1: how long hvd's stream sits idle
 * between device groups, and how much of that is hvd's own delay
 * (gpu_ops.h, "HVD_GPU_TIMING=1"). Built only with CUDA.
 *
 * Accounting needs the events to have fired: a group is accounted once
 * its `done` was seen (hvd__gpu_wait, or hvd__gpu_retire for a group left
 * in flight). Groups end in launch order on one stream, so when one has
 * run every group before it has too; a failed one is skipped, and the
 * next group's idle is not counted (its previous end is unknown).
 */
#include <config.h>

#include "ops/gpu_ops.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/errors.h"

/* The process's totals: every engine's streams (process sets have their
 * own) add into them. */
static pthread_mutex_t totals_mu = PTHREAD_MUTEX_INITIALIZER;
static hvd_gpu_timing_t totals;

void hvd__gpu_timing_totals(hvd_gpu_timing_t *out, int reset) {
  pthread_mutex_lock(&totals_mu);
  if (out != NULL)
    *out = totals;
  if (reset)
    totals = (hvd_gpu_timing_t){0, 0, 0, 0, 0};
  pthread_mutex_unlock(&totals_mu);
}

/* busy, idle and lag in milliseconds; idle or lag < 0: not known. */
static void add_totals(float busy, float idle, float lag) {
  pthread_mutex_lock(&totals_mu);
  totals.groups++;
  totals.busy_s += busy / 1e3;
  if (idle >= 0)
    totals.idle_s += idle / 1e3;
  if (lag >= 0) {
    totals.lag_s += lag / 1e3;
    if (lag / 1e3 > totals.max_lag_s)
      totals.max_lag_s = lag / 1e3;
  }
  pthread_mutex_unlock(&totals_mu);
}

static cudaError_t make_event(cudaEvent_t *e) {
  return cudaEventCreateWithFlags(e, cudaEventDefault); /* timing on */
}

hvd_result_t hvd__gpu_timing_open(hvd__gpu_t *g) {
  cudaError_t err = cudaSuccess;
  if (!g->timing)
    return HVD_SUCCESS;
  err = make_event(&g->last_end);
  for (int i = 0; i < HVD__GPU_TIMED && err == cudaSuccess; i++) {
    err = make_event(&g->timed[i].start);
    if (err == cudaSuccess)
      err = make_event(&g->timed[i].end);
  }
  if (err == cudaSuccess)
    return HVD_SUCCESS;
  hvd_result_t rc = hvd__cuda_error(err, "cudaEventCreateWithFlags");
  hvd__gpu_timing_close(g);
  return rc;
}

static void destroy(cudaEvent_t *e) {
  if (*e != NULL)
    cudaEventDestroy(*e);
  *e = NULL;
}

void hvd__gpu_timing_close(hvd__gpu_t *g) {
  destroy(&g->last_end);
  for (int i = 0; i < HVD__GPU_TIMED; i++) {
    destroy(&g->timed[i].start);
    destroy(&g->timed[i].end);
    free(g->timed[i].ready);
    g->timed[i].ready = NULL;
    g->timed[i].nready = g->timed[i].ready_cap = 0;
  }
  g->t_next = g->t_acct = 0;
  g->t_open = g->t_prev = g->t_gap = 0;
}

/* t's ready list: the ready events of w's requests (stubs have none). */
static hvd_result_t copy_ready(hvd__gpu_timed_t *t, const hvd__work_t *w) {
  t->nready = 0;
  if (w->n > t->ready_cap) {
    cudaEvent_t *p = realloc(t->ready, (size_t)w->n * sizeof *p);
    if (p == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "HVD_GPU_TIMING: %d events",
                            w->n);
    t->ready = p;
    t->ready_cap = w->n;
  }
  for (int i = 0; i < w->n; i++)
    if (!w->reqs[i]->is_stub && w->reqs[i]->ready != NULL)
      t->ready[t->nready++] = (cudaEvent_t)w->reqs[i]->ready;
  return HVD_SUCCESS;
}

hvd_result_t hvd__gpu_timing_start(hvd__gpu_t *g, const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  g->t_open = 0; /* a group that failed before it ended is dropped */
  if (!g->timing || w == NULL)
    return HVD_SUCCESS;
  if (g->t_next - g->t_acct >= HVD__GPU_TIMED) { /* never, by the slots */
    g->t_gap = 1;
    return HVD_SUCCESS;
  }
  hvd__gpu_timed_t *t = &g->timed[g->t_next % HVD__GPU_TIMED];
  HVD__CHECK(copy_ready(t, w));
  HVD__CUDA_CHECK(cudaEventRecord(t->start, g->stream));
  t->restart = g->t_gap;
  g->t_gap = 0;
  g->t_open = 1;
fail:
  return rc;
}

hvd_result_t hvd__gpu_timing_end(hvd__gpu_t *g, int64_t *timed) {
  *timed = -1;
  if (!g->t_open)
    return HVD_SUCCESS;
  g->t_open = 0;
  hvd__gpu_timed_t *t = &g->timed[g->t_next % HVD__GPU_TIMED];
  cudaError_t err = cudaEventRecord(t->end, g->stream);
  if (err != cudaSuccess) {
    g->t_gap = 1;
    return hvd__cuda_error(err, "cudaEventRecord");
  }
  t->state = 0;
  *timed = g->t_next++;
  return HVD_SUCCESS;
}

/* 1 with *ms = b - a (both fired, both timed), 0 when CUDA cannot say. */
static int elapsed(cudaEvent_t a, cudaEvent_t b, float *ms) {
  if (cudaEventElapsedTime(ms, a, b) == cudaSuccess)
    return 1;
  (void)cudaGetLastError(); /* not a failure of the next call */
  return 0;
}

/* The part of idle (ms) after t's last input was ready; -1: no input
 * with a ready event to say. */
static float lag_of(const hvd__gpu_timed_t *t, float idle) {
  float lag = idle, r;
  int any = 0;
  for (int i = 0; i < t->nready; i++)
    if (elapsed(t->ready[i], t->start, &r)) {
      any = 1;
      if (r < lag)
        lag = r > 0 ? r : 0;
    }
  return any ? lag : -1;
}

/* t, the oldest group not yet accounted, is over. */
static void account(hvd__gpu_t *g, hvd__gpu_timed_t *t) {
  float busy, idle = -1, lag = -1;
  int prev = g->t_prev && !t->restart;
  g->t_prev = 0;
  if (t->state != 1 || !elapsed(t->start, t->end, &busy))
    return; /* the next group's idle is not known */
  if (prev && elapsed(g->last_end, t->start, &idle)) {
    idle = idle > 0 ? idle : 0;
    lag = lag_of(t, idle);
  } else {
    idle = -1;
  }
  cudaEvent_t e = g->last_end; /* its end stays until the next's start */
  g->last_end = t->end;
  t->end = e;
  g->t_prev = 1;
  add_totals(busy > 0 ? busy : 0, idle, lag);
}

void hvd__gpu_timing_over(hvd__gpu_t *g, int64_t timed, int ran) {
  if (!g->timing || timed < g->t_acct || timed >= g->t_next)
    return; /* untimed, or accounted already (an earlier group ran) */
  g->timed[timed % HVD__GPU_TIMED].state = ran ? 1 : 2;
  for (int64_t k = g->t_acct; ran && k < timed; k++) /* one stream */
    if (g->timed[k % HVD__GPU_TIMED].state == 0)
      g->timed[k % HVD__GPU_TIMED].state = 1;
  while (g->t_acct < g->t_next &&
         g->timed[g->t_acct % HVD__GPU_TIMED].state != 0)
    account(g, &g->timed[g->t_acct++ % HVD__GPU_TIMED]);
}
