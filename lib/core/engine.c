/*
 * engine.c - the cycle. Every rank runs cycles in lockstep, because the
 * negotiation is collective:
 *
 *   1. wait for new work, a local shutdown, or the cycle deadline;
 *   2. sort new requests: a name cached with the same parameters is a hit
 *      (one bit); anything else goes to the coordinator (the slow path);
 *   3. fast path: one MPI_Allreduce(BOR) of a small vector: a flags word,
 *      a "not ready here" bit and an "invalidate" bit per cache entry. A
 *      bit that is 0 on every rank is a collective every rank has;
 *   4. slow path, only when some rank needs it: controller.c;
 *   5. execute the agreed collectives in one order on every rank,
 *      consecutive compatible allreduces fused into one group.
 */
#include "core/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/autotune.h"
#include "core/cache.h"
#include "core/controller.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/table.h"
#include "base/tensor.h"
#include "core/timeline.h"
#include "ops/executor.h"
#include "base/wait.h"

#define MAX_EXECUTORS 8

/* Flags word of the fast-path vector. */
#define FLAG_SLOW 1u /* someone has requests for the coordinator */
#define FLAG_STOP 2u /* someone called hvd_shutdown */

struct hvd__engine {
  hvd__exec_env_t env;
  hvd__settings_t settings;
  pthread_t thread;

  /* guarded by mu */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* wakes the engine thread */
  int poked;         /* (mu) a caller started blocking in hvd_wait */
  int defer;         /* one rank: host work waits for a caller or the cycle */
  int urgent;        /* (mu) the queue holds work that should start now */
  hvd_request_t *qhead, *qtail;
  hvd__table_t *inflight; /* name -> request, from submit to completion */
  int stop_requested;
  int stopped;
  hvd_result_t stop_rc;
  char stop_reason[HVD__ERRMSG_MAX];

  /* engine thread only */
  hvd__controller_t *ctl;
  void *exec_state[MAX_EXECUTORS];
  int joined;             /* this rank has a join in flight */
  int failed;             /* the engine stopped on an error, not agreement */
  hvd_request_t *slow, *slow_tail; /* waiting for the coordinator, FIFO */
  hvd_request_t **fresh;  /* array form of `slow` for the controller */
  int fresh_cap;
  hvd__cache_t *cache;
  char **fast_names;    /* per cache bit: names lent to fast-path responses */
  const hvd__response_t **group; /* the fused group being built */
  int group_cap;
  hvd_request_t **hits; /* per cache bit: this rank's request waiting on it */
  double *hit_since;
  uint64_t *vec; /* flags, tuned parameters, not-ready bits, invalidate bits */
  int words;     /* words per bit set (0 without a cache) */
  int nparams;   /* 3 when autotuning, else 0 */
  /* autotune (rank 0 decides; every rank applies what the vector says) */
  hvd__autotune_t *tune;
  hvd__tune_params_t params;
  double cycle_s;
  double burst_start; /* guarded by mu: first submission while idle */
  int64_t burst_bytes; /* allreduce bytes executed in the current burst */
  int64_t ended_bytes; /* the last finished burst, not yet scored */
  double ended_seconds;
  /* timeline */
  double epoch;        /* aligned clock zero: leaving a barrier at start */
  int timeline_any;    /* some rank writes a timeline: gather ready times */
  hvd__timeline_t *tl; /* this rank's file, or NULL */
  long cycles;
};

/* ---- completion --------------------------------------------------------- */

/* Autotune, under mu: a burst ends when nothing is in flight, before the
 * caller wakes and starts the next one. */
static void burst_end_check(hvd__engine_t *e) {
  if (e->tune != NULL && hvd__table_count(e->inflight) == 0 &&
      e->burst_bytes > 0) {
    e->ended_bytes += e->burst_bytes;
    e->ended_seconds += hvd__now() - e->burst_start;
    e->burst_bytes = 0;
  }
}

static void complete(hvd__engine_t *e, hvd_request_t *r, hvd_result_t rc,
                     const char *msg) {
  pthread_mutex_lock(&e->mu);
  hvd__table_remove(e->inflight, r->name);
  burst_end_check(e);
  pthread_mutex_unlock(&e->mu);
  hvd__request_complete(r, rc, msg);
}

/* Completes requests whose results are set: out of the in-flight table
 * under one lock, then all woken at once. */
static void complete_all(hvd__engine_t *e, hvd_request_t *const *rs, int n) {
  pthread_mutex_lock(&e->mu);
  for (int i = 0; i < n; i++)
    hvd__table_remove(e->inflight, rs[i]->name);
  burst_end_check(e);
  pthread_mutex_unlock(&e->mu);
  hvd__requests_done(rs, n);
}

static hvd_request_t *lookup(hvd__engine_t *e, const char *name) {
  pthread_mutex_lock(&e->mu);
  hvd_request_t *r = hvd__table_get(e->inflight, name);
  pthread_mutex_unlock(&e->mu);
  return r;
}

static void collect(const char *key, void *value, void *arg) {
  (void)key;
  hvd_request_t **list = arg;
  hvd_request_t *r = value;
  r->next = *list;
  *list = r;
}

/* Stops the engine for good: every request still in flight completes with
 * rc and "<label>: <in_flight_msg>"; later submissions get
 * "<label>: <reason>". */
static void stop_all(hvd__engine_t *e, hvd_result_t rc, const char *reason,
                     const char *in_flight_msg) {
  hvd_request_t *list = NULL;
  pthread_mutex_lock(&e->mu);
  e->stopped = 1;
  e->stop_rc = rc;
  snprintf(e->stop_reason, sizeof e->stop_reason, "%s", reason);
  hvd__table_each(e->inflight, collect, &list);
  hvd__table_destroy(e->inflight);
  e->inflight = hvd__table_create_borrowing();
  e->qhead = e->qtail = NULL; /* queued requests are in inflight too */
  e->urgent = 0;
  pthread_mutex_unlock(&e->mu);
  while (list != NULL) {
    hvd_request_t *r = list;
    list = r->next;
    char lab[300], msg[HVD__ERRMSG_MAX];
    hvd__request_label(r, lab, sizeof lab);
    snprintf(msg, sizeof msg, "%s: %s", lab, in_flight_msg);
    hvd__request_complete(r, rc, msg);
  }
}

static void push_slow(hvd__engine_t *e, hvd_request_t *r) {
  r->next = NULL;
  if (e->slow_tail)
    e->slow_tail->next = r;
  else
    e->slow = r;
  e->slow_tail = r;
}

/* ---- executing responses ------------------------------------------------ */

/* The executor for device (hvd__executor_for), or NULL; *which its index. */
static const hvd__executor_t *executor(const hvd__engine_t *e, int device,
                                       int *which) {
  *which = hvd__executor_for(&e->env, device);
  return *which >= 0 ? hvd__executors[*which] : NULL;
}

/* What a rank that joined contributes to an allreduce: the op's identity,
 * in the memory of the executor that runs it. */
static hvd_result_t make_stub(hvd__engine_t *e, const char *name,
                              const hvd__desc_t *d, hvd_request_t **out) {
  int which;
  const hvd__executor_t *ex = executor(e, d->device, &which);
  hvd_request_t *r = hvd__request_new(name);
  if (r == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "stub for '%s'", name);
  r->desc = *d;
  r->is_stub = 1;
  r->send.dtype = (hvd_dtype_t)d->dtype;
  r->send.ndim = d->ndim;
  memcpy(r->send.shape, d->shape, sizeof d->shape);
  r->send.device = HVD_CPU;
  hvd_result_t rc = ex->stub_alloc(e->exec_state[which], &e->env, r);
  if (rc != HVD_SUCCESS) {
    hvd__request_free(r);
    return rc;
  }
  *out = r;
  return HVD_SUCCESS;
}

static void free_stub(hvd__engine_t *e, hvd_request_t *r) {
  int which;
  const hvd__executor_t *ex = executor(e, r->desc.device, &which);
  ex->stub_free(e->exec_state[which], r);
  hvd__request_free(r);
}

static void trace_hook(void *ctx, const hvd_request_t *r, const char *phase,
                       double t0, double t1) {
  hvd__engine_t *e = ctx;
  hvd__timeline_span(e->tl, r->name, phase, t0, t1, NULL);
}

/* NEGOTIATE (submission to agreement, with every rank's ready time in ms
 * of the aligned clock) and QUEUE (agreement to execution). */
static void trace_negotiation(hvd__engine_t *e, const hvd_request_t *r,
                              const hvd__response_t *x, double agreed,
                              double start) {
  char args[4096];
  size_t at = 0;
  args[0] = '\0';
  if (x->ready != NULL) {
    at += (size_t)snprintf(args, sizeof args, "\"ready_ms\":{");
    for (int k = 0; k < e->env.size && at < sizeof args - 32; k++)
      at += (size_t)snprintf(args + at, sizeof args - at, "%s\"%d\":%.3f",
                             k ? "," : "", k, x->ready[k] * 1e3);
    snprintf(args + at, sizeof args - at, "}");
  }
  hvd__timeline_span(e->tl, r->name, "NEGOTIATE", r->t_submit, agreed,
                     args[0] ? args : NULL);
  hvd__timeline_span(e->tl, r->name, "QUEUE", agreed, start, NULL);
}

/* Runs n RUN responses as one group (n > 1 only for compatible
 * allreduces) and completes their requests. */
static void run_group(hvd__engine_t *e, const hvd__response_t *const *xs,
                      int n, double agreed) {
  hvd_request_t *stack[64], **reqs = stack;
  const hvd__response_t *x = xs[0];
  if (n > 64 && !(reqs = calloc((size_t)n, sizeof *reqs))) {
    reqs = stack; /* run them one by one instead */
    for (int i = 0; i < n; i++)
      run_group(e, &xs[i], 1, agreed);
    return;
  }
  int m = 0;
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&e->mu); /* one lock for the group's lookups */
  for (int i = 0; i < n; i++)
    reqs[i] = xs[i]->req != NULL ? xs[i]->req
                                 : hvd__table_get(e->inflight, xs[i]->names[0]);
  pthread_mutex_unlock(&e->mu);
  for (int i = 0; i < n; i++) {
    const char *name = xs[i]->names[0];
    hvd_request_t *r = reqs[i];
    if (r == NULL && e->joined) {
      hvd_result_t src = make_stub(e, name, &xs[i]->desc, &r);
      if (src != HVD_SUCCESS) {
        rc = src;
        HVD__LOG(HVD__LOG_ERROR, "%s", hvd_last_error());
        continue;
      }
    }
    if (r == NULL) {
      rc = hvd__set_error(HVD_ERR_INTERNAL,
                          "%s '%s' was agreed but is not in flight here",
                          hvd__coll_name(x->desc.coll), name);
      HVD__LOG(HVD__LOG_ERROR, "%s", hvd_last_error());
      continue;
    }
    if (e->tl != NULL && !r->is_stub)
      trace_negotiation(e, r, xs[i], agreed, hvd__now());
    reqs[m++] = r;
  }
  double t_exec = hvd__now();
  int which;
  const hvd__executor_t *ex = executor(e, x->desc.device, &which);
  if (rc == HVD_SUCCESS) {
    if (ex == NULL || ex->run[x->desc.coll] == NULL) {
      rc = hvd__set_error(HVD_ERR_UNSUPPORTED, "no executor for device %d",
                          x->desc.device);
    } else {
      hvd__work_t w = {&x->desc, reqs, m, x->dims0};
      rc = ex->run[x->desc.coll](e->exec_state[which], &e->env, &w);
    }
  }
  if (e->tl != NULL && x->desc.coll != HVD__ALLREDUCE) {
    char phase[32];
    const char *k = hvd__coll_name(x->desc.coll);
    int i = 0;
    for (; k[i] && i < 31; i++)
      phase[i] = (char)(k[i] >= 'a' && k[i] <= 'z' ? k[i] - 32 : k[i]);
    phase[i] = '\0';
    double t_end = hvd__now();
    for (int q = 0; q < m; q++)
      if (!reqs[q]->is_stub)
        hvd__timeline_span(e->tl, reqs[q]->name, phase, t_exec, t_end, NULL);
  }
  char msg[HVD__ERRMSG_MAX] = "", why[HVD__ERRMSG_MAX];
  if (rc != HVD_SUCCESS)
    snprintf(why, sizeof why, "%s", hvd_last_error());
  int live = 0;
  for (int i = 0; i < m; i++) {
    if (reqs[i]->is_stub) {
      free_stub(e, reqs[i]);
      continue;
    }
    if (rc != HVD_SUCCESS) {
      char lab[300];
      hvd__request_label(reqs[i], lab, sizeof lab);
      snprintf(msg, sizeof msg, "%s: %.700s", lab, why);
    }
    hvd__request_set_result(reqs[i], rc, msg);
    reqs[live++] = reqs[i];
  }
  complete_all(e, reqs, live);
  if (reqs != stack)
    free(reqs);
}

/* After a slow-path collective ran on every rank: remember it, so that the
 * next time it is a one-bit hit. A request waiting on an evicted entry
 * goes back to the slow path. */
static void cache_agreed(hvd__engine_t *e, const hvd__response_t *x) {
  if (e->cache == NULL || x->kind != HVD__RESP_RUN || x->njoined > 0)
    return;
  char *evicted = NULL;
  int bit = hvd__cache_put(e->cache, x->names[0], &x->desc, &evicted);
  if (bit >= 0 && evicted != NULL && e->hits[bit] != NULL) {
    push_slow(e, e->hits[bit]);
    e->hits[bit] = NULL;
  }
  free(evicted);
}

static int fusable(const hvd__response_t *a, const hvd__response_t *b) {
  return a->kind == HVD__RESP_RUN && b->kind == HVD__RESP_RUN &&
         a->desc.coll == HVD__ALLREDUCE && b->desc.coll == HVD__ALLREDUCE &&
         a->desc.dtype == b->desc.dtype && a->desc.device == b->desc.device &&
         a->desc.op == b->desc.op && a->desc.prescale == b->desc.prescale &&
         a->desc.postscale == b->desc.postscale &&
         a->desc.wire == b->desc.wire;
}

static int64_t resp_bytes(const hvd__response_t *x) {
  int64_t n = (int64_t)hvd_dtype_size((hvd_dtype_t)x->desc.dtype);
  for (int i = 0; i < x->desc.ndim; i++)
    n *= x->desc.shape[i];
  return n;
}

/* Executes a list of responses in order, fusing runs of compatible
 * allreduces up to HVD_FUSION_THRESHOLD bytes. Returns the rank that asked
 * for a shutdown, or -1; a stall response stops the engine itself. */
static int execute_all(hvd__engine_t *e, hvd__response_t *xs, int n,
                       int from_slow, double agreed) {
  int stop_by = -1;
  if (n > e->group_cap) { /* room for a group as long as the list */
    const hvd__response_t **g = realloc(e->group, (size_t)n * sizeof *g);
    if (g != NULL) {
      e->group = g;
      e->group_cap = n;
    }
  }
  for (int i = 0; i < n;) {
    hvd__response_t *x = &xs[i];
    switch (x->kind) {
    case HVD__RESP_RUN: {
      int g = 1;
      int64_t bytes = resp_bytes(x);
      const hvd__response_t *one = x, **group = e->group ? e->group : &one;
      int max = e->group ? e->group_cap : 1;
      group[0] = x;
      while (i + g < n && g < max && e->settings.fusion_threshold > 0 &&
             fusable(x, &xs[i + g]) &&
             bytes + resp_bytes(&xs[i + g]) <= e->settings.fusion_threshold) {
        bytes += resp_bytes(&xs[i + g]);
        group[g] = &xs[i + g];
        g++;
      }
      if (x->desc.coll == HVD__ALLREDUCE)
        e->burst_bytes += bytes; /* before complete() can end the burst */
      run_group(e, group, g, agreed);
      for (int k = 0; k < g; k++)
        if (from_slow)
          cache_agreed(e, &xs[i + k]);
      i += g;
      continue;
    }
    case HVD__RESP_ERROR:
      HVD__LOG(HVD__LOG_DEBUG, "%s", x->errmsg);
      for (int k = 0; k < x->nnames; k++) {
        hvd_request_t *r = lookup(e, x->names[k]);
        if (r != NULL)
          complete(e, r, x->err, x->errmsg);
      }
      break;
    case HVD__RESP_JOIN_DONE: {
      hvd_request_t *r = lookup(e, HVD__JOIN_NAME);
      e->joined = 0;
      if (r != NULL) {
        r->last_rank = x->arg;
        complete(e, r, HVD_SUCCESS, NULL);
      }
      break;
    }
    case HVD__RESP_STALL:
      if (stop_by < 0)
        stop_by = -2 - i; /* remembered: stop after the list */
      break;
    case HVD__RESP_SHUTDOWN:
      if (stop_by == -1)
        stop_by = x->arg;
      break;
    }
    i++;
  }
  if (stop_by <= -2) {
    const hvd__response_t *x = &xs[-2 - stop_by];
    HVD__LOG(HVD__LOG_ERROR, "%s", x->errmsg);
    char reason[HVD__ERRMSG_MAX];
    snprintf(reason, sizeof reason, "hvd stopped: %s", x->errmsg);
    stop_all(e, HVD_ERR_STALL, reason, reason);
    return -2;
  }
  return stop_by;
}

/* ---- one cycle ----------------------------------------------------------- */

static int bit_get(const uint64_t *v, int b) { return (v[b >> 6] >> (b & 63)) & 1; }
static void bit_set(uint64_t *v, int b) { v[b >> 6] |= 1ull << (b & 63); }

/* Sorts new requests into cache hits and slow-path requests. */
static void sort_new(hvd__engine_t *e, hvd_request_t *list, uint64_t *inval) {
  double now = hvd__now();
  while (list != NULL) {
    hvd_request_t *r = list;
    list = r->next;
    if (r->desc.coll == HVD__JOIN)
      e->joined = 1;
    int bit = -1, k = HVD__CACHE_MISS;
    if (e->cache != NULL && r->desc.coll != HVD__JOIN)
      k = hvd__cache_lookup(e->cache, r->name, &r->desc, &bit);
    if (k == HVD__CACHE_MISS || inval == NULL) {
      push_slow(e, r);
      continue;
    }
    if (k >= 0) {
      e->hits[bit] = r;
      e->hit_since[bit] = now;
      continue;
    }
    if (k == HVD__CACHE_STALE)
      bit_set(inval, bit); /* parameters changed: every rank drops it */
    push_slow(e, r);
  }
}

/* Timeline: rank 0 learns every rank's ready time (aligned clock) of the
 * collectives agreed through the cache; mine[k] is this rank's for list[k]. */
static hvd_result_t gather_ready(hvd__engine_t *e, hvd__response_t *list,
                                 int n, const double *mine) {
  hvd_result_t rc = HVD_SUCCESS;
  double *all = NULL;
  if (e->env.rank == 0) {
    all = malloc((size_t)n * (size_t)e->env.size * sizeof *all);
    if (all == NULL) /* still take part in the gather */
      HVD__LOG(HVD__LOG_WARNING, "timeline: no memory for ready times");
  }
  HVD__MPI_CHECK(MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0,
                            e->env.comm));
  for (int k = 0; k < n && all != NULL; k++) {
    list[k].ready = malloc((size_t)e->env.size * sizeof *list[k].ready);
    for (int r = 0; r < e->env.size && list[k].ready; r++)
      list[k].ready[r] = all[(size_t)r * (size_t)n + (size_t)k];
  }
fail:
  free(all);
  return rc;
}

/* The fast path. Returns the OR of every rank's flags, or -1 on failure;
 * the ready cached collectives are appended to *out. */
static int fast_path(hvd__engine_t *e, unsigned flags, hvd__response_t **out,
                     int *nout) {
  int w = e->words;
  uint64_t *tuned = e->vec + 1, *notready = tuned + e->nparams,
           *inval = notready + w;
  e->vec[0] = flags;
  if (e->nparams > 0 && e->env.rank == 0) { /* the others add zeros */
    tuned[0] = (uint64_t)e->params.fusion_threshold;
    tuned[1] = (uint64_t)e->params.chunk_bytes;
    tuned[2] = (uint64_t)e->params.cycle_us;
  }
  int cap = hvd__cache_capacity(e->cache);
  for (int i = 0; i < w; i++)
    notready[i] = ~0ull;
  /* a stale bit is set in inval by sort_new; what every rank sees after
   * the OR decides */
  double now = hvd__now();
  for (int b = 0; b < cap; b++) {
    int ready = e->hits[b] != NULL;
    if (!ready && e->joined && hvd__cache_valid(e->cache, b))
      ready = hvd__cache_desc(e->cache, b)->coll == HVD__ALLREDUCE;
    if (ready)
      notready[b >> 6] &= ~(1ull << (b & 63));
    /* a hit waiting too long: demote it so the stall inspector sees it */
    if (e->hits[b] != NULL && e->settings.stall_check_s > 0 &&
        now - e->hit_since[b] > e->settings.stall_check_s)
      bit_set(inval, b);
  }
  MPI_Request mr;
  int mrc = MPI_Iallreduce(MPI_IN_PLACE, e->vec, 1 + e->nparams + 2 * w,
                           MPI_UINT64_T, MPI_BOR, e->env.comm, &mr);
  if (mrc != MPI_SUCCESS) {
    hvd__mpi_error(mrc, "MPI_Iallreduce");
    return -1;
  }
  if (hvd__mpi_wait(&mr, "negotiation") != HVD_SUCCESS)
    return -1;
  if (e->nparams > 0) { /* rank 0's parameters, on every rank at once */
    e->settings.fusion_threshold = (int64_t)tuned[0];
    e->env.chunk_bytes = (int64_t)tuned[1];
    e->cycle_s = (double)tuned[2] / 1e6;
  }
  int nready = 0;
  for (int b = 0; b < cap; b++) {
    if (bit_get(inval, b)) {
      if (e->hits[b] != NULL)
        push_slow(e, e->hits[b]);
      e->hits[b] = NULL;
      hvd__cache_erase(e->cache, b);
    } else if (!bit_get(notready, b) && hvd__cache_valid(e->cache, b)) {
      nready++;
    }
  }
  if (nready > 0) {
    hvd__response_t *list = calloc((size_t)nready, sizeof *list);
    double *mine = e->timeline_any ? calloc((size_t)nready, sizeof *mine) : NULL;
    if (list == NULL || (e->timeline_any && mine == NULL)) {
      free(list);
      free(mine);
      hvd__set_error(HVD_ERR_NO_MEMORY, "response list");
      return -1;
    }
    int k = 0;
    for (int b = 0; b < cap && k < nready; b++) {
      if (bit_get(inval, b) || bit_get(notready, b) ||
          !hvd__cache_valid(e->cache, b))
        continue;
      hvd__response_t *x = &list[k];
      x->kind = HVD__RESP_RUN;
      x->desc = *hvd__cache_desc(e->cache, b);
      x->nnames = 1;
      x->borrowed = 1; /* the cache's name, in the engine's array */
      e->fast_names[k++] = (char *)hvd__cache_name(e->cache, b);
      x->names = &e->fast_names[k - 1];
      if (mine != NULL) /* a joined rank has none: -1 */
        mine[k - 1] = e->hits[b] != NULL ? e->hits[b]->t_ready : -1;
      x->req = e->hits[b];
      e->hits[b] = NULL; /* it runs now */
      hvd__cache_touch(e->cache, b);
    }
    *out = list;
    *nout = nready;
    hvd_result_t rc = e->timeline_any ? gather_ready(e, list, nready, mine)
                                      : HVD_SUCCESS;
    free(mine);
    if (rc != HVD_SUCCESS)
      return -1;
  }
  return (int)e->vec[0];
}

/* The slow path: sends e->slow to the coordinator. */
static hvd_result_t slow_path(hvd__engine_t *e, int want_stop,
                              hvd__response_t **out, int *nout) {
  int n = 0;
  for (hvd_request_t *r = e->slow; r != NULL; r = r->next)
    n++;
  if (n > e->fresh_cap) {
    hvd_request_t **p = realloc(e->fresh, (size_t)n * sizeof *p);
    if (p == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation list");
    e->fresh = p;
    e->fresh_cap = n;
  }
  n = 0;
  for (hvd_request_t *r = e->slow; r != NULL; r = r->next)
    e->fresh[n++] = r;
  hvd_result_t rc = hvd__controller_negotiate(e->ctl, e->fresh, n, want_stop,
                                              out, nout);
  if (rc == HVD_SUCCESS)
    e->slow = e->slow_tail = NULL; /* the coordinator has them now */
  return rc;
}

static int list_len(const hvd_request_t *r) {
  int n = 0;
  for (; r != NULL; r = r->next)
    n++;
  return n;
}

/* Rank 0, autotuning: scores the burst that complete() saw end. */
static void tune_burst(hvd__engine_t *e) {
  if (e->ended_bytes == 0)
    return;
  hvd__autotune_record(e->tune, e->ended_bytes, e->ended_seconds, &e->params);
  e->ended_bytes = 0;
  e->ended_seconds = 0;
}

static void deadline_to_timespec(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static void fail_engine(hvd__engine_t *e, hvd_result_t rc) {
  e->failed = 1;
  char reason[HVD__ERRMSG_MAX];
  snprintf(reason, sizeof reason, "hvd's engine failed: %s", hvd_last_error());
  HVD__LOG(HVD__LOG_ERROR, "%s", reason);
  stop_all(e, rc, reason, reason);
}

static void close_executors(hvd__engine_t *e, int collective) {
  for (int i = 0; hvd__executors[i] != NULL; i++)
    if (e->exec_state[i] != NULL)
      hvd__executors[i]->close(e->exec_state[i], collective);
  memset(e->exec_state, 0, sizeof e->exec_state);
}

/* hvd__set_wake's callback: a caller blocked, so cycle now rather than at
 * the end of a back-off that assumed the core was the caller's. */
static void engine_poke(void *arg) {
  hvd__engine_t *e = arg;
  pthread_mutex_lock(&e->mu);
  e->poked = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void *engine_main(void *arg) {
  hvd__engine_t *e = arg;
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL); /* short sleeps stay short */
  /* Compute sharing this core keeps priority; when the caller blocks in
   * hvd_wait this thread is alone and runs at full speed. */
  if (e->settings.engine_nice > 0)
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid),
                e->settings.engine_nice);
#endif
  /* While this rank has requests in flight it waits for its peers, which
   * need it in a cycle: the next cycle comes after a short back-off that
   * doubles while cycles make no progress, up to the cycle time. With
   * nothing in flight it sleeps the whole cycle time (or until work). */
  const double backoff_min = 50e-6;
  double backoff = backoff_min;
  double next = hvd__now() + e->cycle_s;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    if (hvd__table_count(e->inflight) > 0 && !e->defer) {
      /* a caller blocked in hvd_wait leaves the core to this thread: no
       * back-off, the next cycle starts at once and meets a late peer
       * the moment it arrives (the wait inside a cycle yields the core) */
      double cap = hvd__callers_waiting() ? 0 : e->cycle_s;
      double soon = hvd__now() + (backoff < cap ? backoff : cap);
      if (soon < next)
        next = soon;
    }
    while (!e->urgent && e->slow == NULL && !e->stop_requested &&
           !(e->poked && hvd__table_count(e->inflight) > 0) &&
           hvd__now() < next) {
      struct timespec ts;
      deadline_to_timespec(next, &ts);
      pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    if (e->poked) {
      e->poked = 0;
      backoff = backoff_min;
    }
    hvd_request_t *list = e->qhead;
    e->qhead = e->qtail = NULL;
    e->urgent = 0;
    int want_stop = e->stop_requested;
    pthread_mutex_unlock(&e->mu);
    double cycle_start = hvd__now();
    int nnew = hvd__log_threshold <= HVD__LOG_TRACE ? list_len(list) : 0;
    next = cycle_start + e->cycle_s;

    hvd__response_t *fast = NULL, *slow = NULL;
    int nfast = 0, nslow = 0, stop_by = -1;
    hvd_result_t rc = HVD_SUCCESS;
    unsigned flags = FLAG_STOP * (unsigned)want_stop;
    memset(e->vec, 0,
           (size_t)(1 + e->nparams + 2 * e->words) * sizeof *e->vec);
    sort_new(e, list, e->vec + 1 + e->nparams + e->words);
    if (e->slow != NULL || hvd__controller_busy(e->ctl))
      flags |= FLAG_SLOW;
    int all = fast_path(e, flags, &fast, &nfast);
    if (all < 0)
      rc = HVD_ERR_MPI;
    else
      flags = (unsigned)all;
    if (rc == HVD_SUCCESS && (flags & (FLAG_SLOW | FLAG_STOP)))
      rc = slow_path(e, want_stop, &slow, &nslow);
    if (rc != HVD_SUCCESS) {
      hvd__responses_free(fast, nfast);
      fail_engine(e, rc);
      break;
    }
    double agreed = hvd__now();
    if (nnew + nfast + nslow > 0)
      HVD__LOG(HVD__LOG_TRACE,
               "cycle %ld: %d new, %d agreed by cache, %d by coordinator, "
               "%.1f us negotiating",
               e->cycles, nnew, nfast, nslow, (agreed - cycle_start) * 1e6);
    if (e->tl != NULL && (list != NULL || nfast + nslow > 0))
      hvd__timeline_cycle(e->tl, cycle_start, e->cycles);
    e->cycles++;
    stop_by = execute_all(e, fast, nfast, 0, agreed);
    if (stop_by == -1)
      stop_by = execute_all(e, slow, nslow, 1, agreed);
    hvd__timeline_flush(e->tl, 1.0);
    if (e->tune != NULL)
      tune_burst(e);
    hvd__responses_free(fast, nfast);
    hvd__responses_free(slow, nslow);
    /* progress (new work or something agreed) resets the back-off */
    backoff = list != NULL || nfast + nslow > 0 ? backoff_min : 2 * backoff;
    if (stop_by == -2)
      break; /* stalled: execute_all stopped the engine */
    if (stop_by >= 0) {
      char reason[128], in_flight[200];
      snprintf(reason, sizeof reason, "hvd was shut down by rank %d", stop_by);
      snprintf(in_flight, sizeof in_flight,
               "%s before this collective completed", reason);
      HVD__LOG(HVD__LOG_DEBUG, "%s", reason);
      stop_all(e, HVD_ERR_SHUTDOWN, reason, in_flight);
      break;
    }
  }
  /* every rank leaves the loop in the same cycle, except after a failure */
  close_executors(e, !e->failed);
  return NULL;
}

/* ---- lifecycle and submission ------------------------------------------ */

static void engine_free(hvd__engine_t *e) {
  close_executors(e, 0); /* still open only after a failure */
  hvd__controller_destroy(e->ctl);
  hvd__table_destroy(e->inflight);
  hvd__cache_destroy(e->cache);
  hvd__timeline_close(e->tl);
  hvd__autotune_destroy(e->tune);
  free(e->hits);
  free(e->hit_since);
  free(e->fast_names);
  free(e->group);
  free(e->vec);
  free(e->fresh);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}

hvd_result_t hvd__engine_start(const hvd__exec_env_t *env,
                               const hvd__settings_t *s, hvd__engine_t **out) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd__engine_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "engine");
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_condattr_destroy(&ca);
  e->settings = *s;
  e->env = *env;
  /* With one rank a host collective has no peer to meet, so starting it
   * early gains nothing, while waking this thread for each submission costs
   * the caller's core a switch each time (bert_train tiny at np=1: 3 to 5%
   * of its step): host work waits for a caller to block in hvd_wait, or for
   * the next cycle. With peers, or on a GPU (whose work runs beside the
   * caller's), it starts at once. */
  e->defer = env->size == 1;
  e->env.chunk_bytes = s->chunk_size;
  e->env.shm = s->shm_allreduce;
  e->env.gpu_ops = s->gpu_ops;
  e->env.nccl_timeout_s = s->nccl_timeout_s;
  /* hierarchical only where it applies, decided for all ranks together (a
   * rank alone on its node must still take the three phases); [2], [3]:
   * max and -min of HVD_GPU_OPERATIONS, which must agree (ranks on
   * different device executors would wait for each other forever) */
  int mine[5] = {s->hierarchical, env->local_size, s->gpu_ops, -s->gpu_ops,
                 env->local_rank == 0},
      all[5];
  HVD__MPI_CHECK(MPI_Allreduce(mine, all, 4, MPI_INT, MPI_MAX, env->comm));
  HVD__MPI_CHECK(
      MPI_Allreduce(&mine[4], &all[4], 1, MPI_INT, MPI_SUM, env->comm));
  e->env.hierarchical = all[0] && all[1] > 1 && all[4] > 1;
  if (all[2] != -all[3]) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "HVD_GPU_OPERATIONS differs between ranks (nccl on "
                        "some, mpi on others)");
    goto fail;
  }
  /* the aligned clock: every rank leaves this barrier at about the same
   * moment and takes that as zero */
  int tl_here = s->timeline[0] != '\0' && (env->rank == 0 || s->timeline_all_ranks);
  HVD__MPI_CHECK(MPI_Allreduce(&tl_here, &e->timeline_any, 1, MPI_INT,
                               MPI_MAX, env->comm));
  HVD__MPI_CHECK(MPI_Barrier(env->comm));
  e->epoch = hvd__now();
  if (tl_here) {
    char path[HVD__PATH_MAX + 16];
    if (s->timeline_all_ranks)
      hvd__timeline_rank_path(s->timeline, env->rank, path, sizeof path);
    else
      snprintf(path, sizeof path, "%s", s->timeline);
    e->tl = hvd__timeline_open(path, env->rank, e->epoch);
    if (e->tl != NULL) {
      e->env.trace = trace_hook;
      e->env.trace_ctx = e;
    }
  }
  /* every rank fails init together if a timeline could not be opened,
   * naming the first rank that failed and its file */
  int bad = tl_here && e->tl == NULL ? env->rank : env->size, first_bad = 0;
  HVD__MPI_CHECK(
      MPI_Allreduce(&bad, &first_bad, 1, MPI_INT, MPI_MIN, env->comm));
  if (first_bad < env->size) {
    if (bad != env->rank) {
      char path[HVD__PATH_MAX + 16];
      if (s->timeline_all_ranks)
        hvd__timeline_rank_path(s->timeline, first_bad, path, sizeof path);
      else
        snprintf(path, sizeof path, "%s", s->timeline);
      hvd__set_error(HVD_ERR_IO, "HVD_TIMELINE: rank %d cannot open '%s'",
                     first_bad, path);
    }
    rc = HVD_ERR_IO;
    goto fail;
  }
  e->inflight = hvd__table_create_borrowing(); /* keys: the requests' names */
  e->ctl = hvd__controller_create(env->comm, env->rank, env->size, s,
                                  e->timeline_any);
  if (e->inflight == NULL || e->ctl == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "engine");
    goto fail;
  }
  e->cycle_s = s->cycle_time_ms / 1000.0;
  int tune_any = 0;
  HVD__MPI_CHECK(MPI_Allreduce(&e->settings.autotune, &tune_any, 1, MPI_INT,
                               MPI_MAX, env->comm));
  if (tune_any) {
    e->nparams = 3;
    e->params.fusion_threshold = s->fusion_threshold;
    int64_t chunk0 = hvd__executors[0]->default_chunk; /* the host's */
    e->params.chunk_bytes = s->chunk_size > 0 ? s->chunk_size : chunk0;
    e->params.cycle_us = (int64_t)(s->cycle_time_ms * 1000);
    if (env->rank == 0) {
      e->tune = hvd__autotune_create(s, chunk0);
      if (e->tune == NULL) {
        rc = HVD_ERR_IO;
        goto fail;
      }
      hvd__autotune_record(e->tune, 0, 0, &e->params); /* first candidate */
    }
  }
  if (s->cache_capacity > 0) {
    int cap = s->cache_capacity;
    e->cache = hvd__cache_create(cap);
    e->words = (cap + 63) / 64;
    e->hits = calloc((size_t)cap, sizeof *e->hits);
    e->hit_since = calloc((size_t)cap, sizeof *e->hit_since);
    e->fast_names = calloc((size_t)cap, sizeof *e->fast_names);
    if (!e->cache || !e->hits || !e->hit_since || !e->fast_names) {
      rc = hvd__set_error(HVD_ERR_NO_MEMORY, "response cache");
      goto fail;
    }
  }
  e->vec = calloc((size_t)(1 + e->nparams + 2 * e->words), sizeof *e->vec);
  if (e->vec == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation vector");
    goto fail;
  }
  for (int i = 0; hvd__executors[i] != NULL; i++)
    HVD__CHECK(hvd__executors[i]->open(&e->env, &e->exec_state[i]));
  int err = pthread_create(&e->thread, NULL, engine_main, e);
  if (err != 0) {
    rc = hvd__set_error(HVD_ERR_SYSTEM, "pthread_create: %s", strerror(err));
    goto fail;
  }
  hvd__set_wake(engine_poke, e);
  *out = e;
  return HVD_SUCCESS;
fail:
  engine_free(e);
  return rc;
}

void hvd__engine_stop(hvd__engine_t *e) {
  if (e == NULL)
    return;
  hvd__set_wake(NULL, NULL); /* before e->mu: engine_poke locks nap, then mu */
  pthread_mutex_lock(&e->mu);
  e->stop_requested = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  engine_free(e);
}

/* The error paths of submission format the request's label; the common
 * path does not. */
static hvd_result_t submit_error(hvd_result_t rc, const hvd_request_t *r,
                                 const char *why) {
  char lab[300];
  hvd__request_label(r, lab, sizeof lab);
  return hvd__set_error(rc, "%s: %s", lab, why);
}

hvd_result_t hvd__engine_submit(hvd__engine_t *e, hvd_request_t *r) {
  hvd_result_t rc = HVD_SUCCESS;
  double now = hvd__now();
  pthread_mutex_lock(&e->mu);
  if (e->stopped) {
    rc = submit_error(e->stop_rc, r, e->stop_reason);
  } else if (e->stop_requested) {
    rc = submit_error(HVD_ERR_SHUTDOWN, r, "hvd is shutting down");
  } else if (hvd__table_get(e->inflight, r->name) != NULL) {
    char why[HVD__ERRMSG_MAX];
    snprintf(why, sizeof why,
             "a collective named '%.900s' is already in flight on this rank",
             r->name);
    rc = submit_error(HVD_ERR_INVALID_ARG, r, why);
  } else if (hvd__table_put(e->inflight, r->name, r) != 0) {
    rc = submit_error(HVD_ERR_NO_MEMORY, r, "request table");
  } else {
    r->t_submit = now;
    r->t_ready = now - e->epoch;
    if (hvd__table_count(e->inflight) == 1) /* just this one: a new burst */
      e->burst_start = now;
    r->next = NULL;
    if (e->qtail)
      e->qtail->next = r;
    else
      e->qhead = r;
    e->qtail = r;
    if (!e->defer || r->desc.device != HVD_CPU) {
      e->urgent = 1;
      pthread_cond_signal(&e->cv);
    }
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}
