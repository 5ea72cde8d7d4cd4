/*
 * engine.c - the engine thread and its cycle. Every rank runs cycles in
 * lockstep, because the negotiation is collective. A cycle is a list of
 * named phases (engine_main), as libuv's uv_run is:
 *
 *   1. wait_for_work: new work, a caller blocking, a local shutdown, or
 *      the cycle deadline (pace.c: a back-off while peers are awaited, a
 *      longer sleep while idle);
 *   2. take_queue: the submissions since the last cycle;
 *   3. negotiate: the fast path (fastpath.c: one MPI_Allreduce(BOR) of a
 *      small bit vector for cached collectives, flags and tuned
 *      parameters) and, only when some rank needs it, the slow path
 *      (controller.c: the coordinator);
 *   4. execute: the agreed collectives, in one order on every rank, fused
 *      into groups (execute.c); a device group may be left in flight,
 *      and completes in a later cycle (hvd__engine_reap, at each cycle's
 *      start) once its event has fired;
 *   5. handle_stop: an agreed shutdown or a stall ends the loop.
 *
 * Starting and stopping the engine is engine_life.c; submission (the only
 * entry from callers' threads) engine_submit.c; the timeline's side
 * engine_timeline.c.
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

#include "base/log.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "core/engine_int.h"
#include "core/pace.h"

/* ---- the cycle ---------------------------------------------------------- */

/* What one cycle agreed. */
typedef struct agreed {
  hvd__response_t *fast, *slow;
  int nfast, nslow;
  unsigned flags; /* every rank's flags, OR'ed */
  double at;      /* when the negotiation ended */
} agreed_t;

/* Requests in flight in e and the sets it drives (an engine command
 * waiting counts as one: peers need this rank's cycles to meet it). Under
 * e->mu; takes each set's mu (the order is always world, then set). */
static size_t inflight_total(hvd__engine_t *e) {
  size_t n = hvd__table_count(e->inflight) + (size_t)e->cmd_pending;
  for (int i = 0; i < e->nsets; i++) {
    pthread_mutex_lock(&e->sets[i]->mu);
    n += hvd__table_count(e->sets[i]->inflight);
    pthread_mutex_unlock(&e->sets[i]->mu);
  }
  return n;
}

/* A set waits for its coordinator's answer (engine thread only). */
static int sets_slow(const hvd__engine_t *e) {
  for (int i = 0; i < e->nsets; i++)
    if (!hvd__queue_empty(&e->sets[i]->slow))
      return 1;
  return 0;
}

/* Phase 1, under mu: until work (here or in a set), a poke, a stop or the
 * deadline (the pace's: pace.c). */
static void wait_for_work(hvd__engine_t *e, hvd__pace_t *p) {
  if (!e->defer)
    hvd__pace_deadline(p, e->cycle_s, inflight_total(e),
                       hvd__callers_waiting());
  while (!e->urgent && !e->set_work && hvd__queue_empty(&e->slow) &&
         !sets_slow(e) && !(e->stop_requested && !e->world_done) &&
         !e->tl_cmd && !(e->poked && inflight_total(e) > 0) &&
         hvd__now() < p->next) {
    struct timespec ts;
    hvd__timespec_at(p->next, &ts);
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
  }
  if (e->poked) {
    e->poked = 0;
    hvd__pace_poked(p);
  }
}

/* Phase 2, under mu: the submissions since the last cycle; whether a stop
 * or a command waits. */
static hvd_request_t *take_queue(hvd__engine_t *e, int *want_stop,
                                 int *want_cmd) {
  e->urgent = 0;
  e->set_work = 0; /* the sets' queues are taken after this */
  *want_stop = e->stop_requested;
  *want_cmd = e->cmd_pending;
  return hvd__queue_take(&e->queue);
}

/* The slow path: e->slow to the coordinator. */
static hvd_result_t slow_path(hvd__engine_t *e, int want_stop, agreed_t *a) {
  int n = hvd__list_len(e->slow.head);
  if (n > e->fresh_cap) {
    hvd_request_t **p = realloc(e->fresh, (size_t)n * sizeof *p);
    if (p == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation list");
    e->fresh = p;
    e->fresh_cap = n;
  }
  n = 0;
  for (hvd_request_t *r = e->slow.head; r != NULL; r = r->next)
    e->fresh[n++] = r;
  hvd_result_t rc = hvd__controller_negotiate(e->ctl, e->fresh, n, want_stop,
                                              &a->slow, &a->nslow);
  if (rc == HVD_SUCCESS)
    (void)hvd__queue_take(&e->slow); /* the coordinator has them now */
  return rc;
}

/* Phase 3: sorts the new requests and agrees, with every rank, on what
 * runs now (and on rank 0's tuned parameters, and on a command). */
static hvd_result_t negotiate(hvd__engine_t *e, hvd_request_t *list,
                              int want_stop, int want_cmd, agreed_t *a) {
  hvd_result_t rc;
  hvd__fast_outcome_t out;
  unsigned flags =
      (want_stop ? HVD__FAST_STOP : 0) |
      (want_cmd ? HVD__FAST_CMD : HVD__FAST_NOCMD) |
      (want_cmd && hvd__engine_command_overdue(e) ? HVD__FAST_CMDWAIT : 0);
  hvd__fastpath_sort(e->fast, list, &e->joined, &e->slow);
  if (!hvd__queue_empty(&e->slow) || hvd__controller_busy(e->ctl))
    flags |= HVD__FAST_SLOW;
  rc = hvd__fastpath_run(e->fast, flags, e->tune ? &e->params : NULL, e->joined,
                         &e->slow, &out);
  a->fast = out.ready;
  a->nfast = out.nready;
  a->flags = out.flags;
  if (rc != HVD_SUCCESS)
    return HVD_ERR_MPI; /* as every failure of the round has been */
  if (e->tuning) {      /* rank 0's parameters, on every rank at once */
    e->settings.fusion_threshold = out.params.fusion_threshold;
    e->env.chunk_bytes = out.params.chunk_bytes;
    e->cycle_s = (double)out.params.cycle_us / 1e6;
  }
  if (out.flags & (HVD__FAST_SLOW | HVD__FAST_STOP))
    rc = slow_path(e, want_stop, a);
  a->at = hvd__now();
  return rc;
}

/* nnew: the new requests, counted only when tracing; any: there were. */
static void trace_cycle(hvd__engine_t *e, int any, int nnew, const agreed_t *a,
                        double start) {
  if (nnew + a->nfast + a->nslow > 0)
    HVD__LOG(HVD__LOG_TRACE,
             "cycle %ld: %d new, %d agreed by cache, %d by coordinator, "
             "%.1f us negotiating",
             e->cycles, nnew, a->nfast, a->nslow, (a->at - start) * 1e6);
  if (e->tl != NULL && (any || a->nfast + a->nslow > 0))
    hvd__timeline_cycle(e->tl, start, e->cycles);
  e->cycles++;
}

/* Phase 4: the cache's collectives, then the coordinator's (unless the
 * first list stopped hvd). */
static hvd__stop_t execute(hvd__engine_t *e, agreed_t *a) {
  hvd__stop_t stop = hvd__engine_execute(e, a->fast, a->nfast, 0, a->at);
  if (stop.kind == HVD__RUN_ON)
    stop = hvd__engine_execute(e, a->slow, a->nslow, 1, a->at);
  hvd__timeline_flush(e->tl, 1.0);
  if (e->tune != NULL)
    hvd__autotune_score(e->tune, &e->burst, &e->params);
  hvd__responses_free(a->fast, a->nfast);
  hvd__responses_free(a->slow, a->nslow);
  return stop;
}

/* Phase 5: 1 when the loop ends. A stall has stopped hvd already. */
static int handle_stop(hvd__engine_t *e, hvd__stop_t stop) {
  if (stop.kind != HVD__STOP_SHUTDOWN)
    return stop.kind == HVD__STOP_STALL;
  hvd__engine_reap(e, 1); /* what every rank launched completes */
  char reason[128], in_flight[200];
  if (e->env.world_ranks == NULL)
    snprintf(reason, sizeof reason, "hvd was shut down by rank %d", stop.rank);
  else if (stop.by_shutdown) /* the set ends with its member's hvd */
    snprintf(reason, sizeof reason, "hvd was shut down by rank %d",
             e->env.world_ranks[stop.rank]);
  else /* only this set ends */
    snprintf(reason, sizeof reason,
             "process set %d was destroyed (rank %d destroyed it first)",
             e->env.set_id, e->env.world_ranks[stop.rank]);
  snprintf(in_flight, sizeof in_flight, "%s before this collective completed",
           reason);
  HVD__LOG(HVD__LOG_DEBUG, "%s", reason);
  hvd__engine_stop_all(e, HVD_ERR_SHUTDOWN, reason, in_flight);
  return 1;
}

/* A set's loop ended (agreed, or failed) or the world's did: the set
 * leaves the driver, its executors close (collectively when its members
 * all stopped in this cycle), and hvd__engine_stop may free it. */
static void set_end(hvd__engine_t *w, int i, int collective) {
  hvd__engine_t *s = w->sets[i];
  hvd__engine_quiesce(w); /* closing frees device memory */
  hvd__engine_close_executors(s, collective && !s->failed);
  memmove(&w->sets[i], &w->sets[i + 1],
          (size_t)(w->nsets - i - 1) * sizeof *w->sets);
  w->nsets--;
  pthread_mutex_lock(&s->mu);
  s->ended = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

static int cycle(hvd__engine_t *e, hvd_request_t *list, int want_stop,
                 int want_cmd, int *progress, double *settled,
                 hvd__stop_kind_t *kind);

/* The sets' cycles, after the world's and in the sets' creation order:
 * every rank meets its sets' collectives (and launches their device
 * work) in this one order. Returns 1 when some set made progress. */
static int drive_sets(hvd__engine_t *w) {
  int any = 0;
  for (int i = 0; i < w->nsets;) {
    hvd__engine_t *s = w->sets[i];
    int want_stop, want_cmd, progress = 0;
    double settled;
    pthread_mutex_lock(&s->mu);
    hvd_request_t *list = take_queue(s, &want_stop, &want_cmd);
    pthread_mutex_unlock(&s->mu);
    hvd__stop_kind_t kind;
    int ended = cycle(s, list, want_stop, 0, &progress, &settled, &kind);
    any |= progress;
    if (ended)
      set_end(w, i, 1);
    else
      i++;
  }
  return any;
}

/* Phases 3 to 5 of one cycle of e, whose queue (`list`) is taken; the
 * world's engine also runs an agreed command, then its sets' cycles.
 * Returns 1 when e's loop ends (*kind: an agreed shutdown, a stall, or
 * HVD__RUN_ON for a failure); *progress: new work or something agreed;
 * *settled: when the negotiation ended. */
static int cycle(hvd__engine_t *e, hvd_request_t *list, int want_stop,
                 int want_cmd, int *progress, double *settled,
                 hvd__stop_kind_t *kind) {
  double start = hvd__now();
  int nnew = hvd__log_threshold <= HVD__LOG_TRACE ? hvd__list_len(list) : 0;
  agreed_t a = {NULL, NULL, 0, 0, 0, 0};
  int reaped = hvd__engine_reap(e, 0); /* device groups that have ended */
  hvd_result_t rc = negotiate(e, list, want_stop, want_cmd, &a);
  *kind = HVD__RUN_ON;
  if (rc != HVD_SUCCESS) {
    *settled = hvd__now();
    hvd__responses_free(a.fast, a.nfast);
    hvd__engine_fail(e, rc);
    return 1;
  }
  *settled = a.at;
  trace_cycle(e, list != NULL, nnew, &a, start);
  hvd__stop_t stop = execute(e, &a);
  *progress = reaped || list != NULL || a.nfast + a.nslow > 0;
  if (e->driver == NULL) {
    if ((a.flags & HVD__FAST_CMD) && !(a.flags & HVD__FAST_NOCMD)) {
      hvd__engine_run_command(e);
      *progress = 1;
    } else if ((a.flags & HVD__FAST_CMDWAIT) && stop.kind == HVD__RUN_ON &&
               hvd__engine_command_stall(e, want_cmd)) {
      stop.kind = HVD__STOP_STALL; /* some rank never posted it */
    }
    *progress |= drive_sets(e);
  }
  *kind = stop.kind;
  return handle_stop(e, stop);
}

/* Compute sharing this core keeps priority; when the caller blocks in
 * hvd_wait this thread is alone and runs at full speed. */
static void engine_thread_setup(hvd__engine_t *e) {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL); /* short sleeps stay short */
  if (e->settings.engine_nice > 0)
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid),
                e->settings.engine_nice);
#else
  (void)e;
#endif
}

/* The world's loop has ended: the sets it drove end with it, each
 * request in flight with the world's error. */
static void end_sets(hvd__engine_t *e) {
  char reason[HVD__ERRMSG_MAX];
  pthread_mutex_lock(&e->mu);
  hvd_result_t rc = e->stopped ? e->stop_rc : HVD_ERR_SHUTDOWN;
  snprintf(reason, sizeof reason, "%s",
           e->stopped ? e->stop_reason : "hvd is shutting down");
  pthread_mutex_unlock(&e->mu);
  while (e->nsets > 0) {
    e->sets[0]->failed = 1; /* its peers may be anywhere */
    hvd__engine_stop_all(e->sets[0], rc, reason, reason);
    set_end(e, 0, 0);
  }
}

void *hvd__engine_main(void *arg) {
  hvd__engine_t *e = arg;
  hvd__pace_t pace;
  pthread_mutex_lock(&e->mu); /* until every rank's thread has started */
  while (e->gate == 0)
    pthread_cond_wait(&e->cv, &e->mu);
  int gate = e->gate;
  pthread_mutex_unlock(&e->mu);
  if (gate < 0)
    return NULL;
  hvd__pace_init(&pace, e->cycle_s, hvd__now());
  engine_thread_setup(e);
  for (;;) {
    int want_stop, want_cmd, progress = 0;
    double settled;
    pthread_mutex_lock(&e->mu);
    wait_for_work(e, &pace);
    hvd_request_t *list = take_queue(e, &want_stop, &want_cmd);
    int tl_cmd = e->tl_cmd;
    char tl_path[HVD__PATH_MAX];
    if (tl_cmd != 0)
      snprintf(tl_path, sizeof tl_path, "%s", e->tl_path);
    e->tl_cmd = 0;
    pthread_mutex_unlock(&e->mu);
    if (tl_cmd != 0)
      hvd__engine_timeline_command(e, tl_cmd, tl_path);
    hvd__pace_start(&pace, e->cycle_s, hvd__now());
    int ended = 0;
    if (!e->world_done) {
      hvd__stop_kind_t kind;
      ended = cycle(e, list, want_stop, want_cmd, &progress, &settled, &kind);
      /* an agreed shutdown ends the world's collectives on every rank in
       * this cycle; its sets go on until their members stop them, as
       * when they had threads of their own */
      if (ended && kind == HVD__STOP_SHUTDOWN && e->nsets > 0)
        e->world_done = 1;
    } else {
      progress = drive_sets(e);
      settled = hvd__now();
    }
    if (e->world_done)
      ended = e->nsets == 0;
    hvd__pace_end(&pace, progress, settled);
    if (ended)
      break;
  }
  end_sets(e);
  /* every rank leaves the loop in the same cycle, except after a failure */
  hvd__engine_close_executors(e, !e->failed);
  return NULL;
}
