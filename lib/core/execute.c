/*
 * execute.c - the engine's execution phase: the responses a cycle agreed
 * run in one order on every rank, consecutive compatible allreduces fused
 * into one group of at most HVD_FUSION_THRESHOLD bytes, each group through
 * the executor of its device (ops/executor.h). A rank that joined takes
 * part in allreduces with a stub holding the op's identity. Requests
 * complete here, and here the engine stops for good (stop_all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/tensor.h"
#include "core/engine_int.h"

/* ---- completion --------------------------------------------------------- */

/* Under mu: a burst ends when nothing is in flight, before the caller
 * wakes and starts the next one. */
static void burst_end_check(hvd__engine_t *e) {
  if (e->tune != NULL && hvd__table_count(e->inflight) == 0)
    hvd__burst_end(&e->burst, hvd__now());
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

/* The groups in flight are forgotten: their requests are in e->inflight,
 * and complete with the engine's error (engine thread). */
static void drop_flights(hvd__engine_t *e) {
  for (; e->fl_n > 0; e->fl_n--) {
    free(e->flights[e->fl_head].reqs);
    e->fl_head = (e->fl_head + 1) % HVD__MAX_FLIGHTS;
  }
}

void hvd__engine_stop_all(hvd__engine_t *e, hvd_result_t rc, const char *reason,
                          const char *in_flight_msg) {
  hvd_request_t *list = NULL;
  if (rc != HVD_ERR_SHUTDOWN) /* a failure, not a peer's hvd_shutdown */
    hvd__fatal_set(rc, reason);
  drop_flights(e);
  pthread_mutex_lock(&e->mu);
  e->stopped = 1;
  e->stop_rc = rc;
  snprintf(e->stop_reason, sizeof e->stop_reason, "%s", reason);
  hvd__table_each(e->inflight, collect, &list);
  hvd__table_destroy(e->inflight);
  e->inflight = hvd__table_create_borrowing();
  (void)hvd__queue_take(&e->queue); /* queued requests are in inflight too */
  e->urgent = 0;
  pthread_cond_broadcast(&e->tl_cv); /* a timeline command waits no more */
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

void hvd__engine_fail(hvd__engine_t *e, hvd_result_t rc) {
  e->failed = 1;
  char reason[HVD__ERRMSG_MAX];
  snprintf(reason, sizeof reason, "hvd's engine failed: %s", hvd_last_error());
  HVD__LOG(HVD__LOG_ERROR, "%s", reason);
  hvd__engine_stop_all(e, rc, reason, reason);
}

void hvd__engine_close_executors(hvd__engine_t *e, int collective) {
  for (int i = 0; hvd__executors[i] != NULL; i++)
    if (e->exec_state[i] != NULL)
      hvd__executors[i]->close(e->exec_state[i], collective);
  memset(e->exec_state, 0, sizeof e->exec_state);
}

/* ---- one group ---------------------------------------------------------- */

/* The executor for collective d (hvd__executor_for), or NULL; *which its
 * index. */
static const hvd__executor_t *executor(const hvd__engine_t *e,
                                       const hvd__desc_t *d, int *which) {
  *which = hvd__executor_for(&e->env, d);
  return *which >= 0 ? hvd__executors[*which] : NULL;
}

/* What a rank that joined contributes to an allreduce: the op's identity,
 * in the memory of the executor that runs it. */
static hvd_result_t make_stub(hvd__engine_t *e, const char *name,
                              const hvd__desc_t *d, hvd_request_t **out) {
  int which;
  const hvd__executor_t *ex = executor(e, d, &which);
  hvd_request_t *r = hvd__fault("stub") ? NULL : hvd__request_new(name);
  if (r == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "stub for '%s': out of memory",
                          name);
  r->desc = *d;
  r->is_stub = 1;
  r->send.dtype = d->dtype;
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
  const hvd__executor_t *ex = executor(e, &r->desc, &which);
  ex->stub_free(e->exec_state[which], r);
  hvd__request_free(r);
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
    for (int k = 0, any = 0; k < e->env.size && at < sizeof args - 32; k++)
      if (x->ready[k] >= 0) /* else a joined rank: none */
        at += (size_t)snprintf(args + at, sizeof args - at, "%s\"%d\":%.3f",
                               any++ ? "," : "", k, x->ready[k] * 1e3);
    snprintf(args + at, sizeof args - at, "}");
  }
  hvd__timeline_span(e->tl, r->name, "NEGOTIATE", r->t_submit, agreed,
                     args[0] ? args : NULL);
  /* each rank's readiness, as an instant on the tensor's track (as
   * Horovod's NEGOTIATE ticks) */
  for (int k = 0; x->ready != NULL && k < e->env.size; k++) {
    char who[32];
    if (x->ready[k] < 0) /* a joined rank */
      continue;
    snprintf(who, sizeof who, "\"rank\":%d", k);
    hvd__timeline_instant(e->tl, r->name, "READY", e->epoch + x->ready[k], who);
  }
  hvd__timeline_span(e->tl, r->name, "QUEUE", agreed, start, NULL);
}

/* The execution span of every request but allreduces (whose executors
 * trace their own phases), named after the collective in capitals. */
static void trace_run(hvd__engine_t *e, hvd_request_t *const *reqs, int m,
                      int coll, double t0) {
  char phase[32];
  const char *k = hvd__coll_name(coll);
  int i = 0;
  for (; k[i] && i < 31; i++)
    phase[i] = (char)(k[i] >= 'a' && k[i] <= 'z' ? k[i] - 32 : k[i]);
  phase[i] = '\0';
  double t1 = hvd__now();
  for (int q = 0; q < m; q++)
    if (!reqs[q]->is_stub)
      hvd__engine_trace_span(e, reqs[q], phase, t0, t1);
}

/* hvd_barrier's and hvd_join's own requests. */
static int internal_coll(int coll) {
  return coll == HVD__BARRIER || coll == HVD__JOIN;
}

/* r, if a response about a collective of kind coll may complete it: a
 * run of exactly its kind; an error of its kind, or for a tensor's
 * request of any tensor's kind (the ranks may disagree on the kind).
 * hvd's barrier and join never answer for a tensor, nor a tensor for
 * them, whatever the names (check_name keeps them apart too). */
static hvd_request_t *of_kind(hvd_request_t *r, int coll, int run) {
  if (r == NULL || (int)r->desc.coll == coll)
    return r;
  if (run || internal_coll(coll) || internal_coll(r->desc.coll))
    return NULL;
  return r;
}

/* This rank's requests of the group's n responses into reqs (a stub
 * where it joined); *m of them. A response with no request here (or
 * one of another kind under its name) fails the group. */
static hvd_result_t take_requests(hvd__engine_t *e, const hvd__response_t *xs,
                                  int n, double agreed, hvd_request_t **reqs,
                                  int *m) {
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&e->mu); /* one lock for the group's lookups */
  for (int i = 0; i < n; i++)
    reqs[i] = xs[i].req != NULL
                  ? xs[i].req
                  : of_kind(hvd__table_get(e->inflight, xs[i].names[0]),
                            xs[i].desc.coll, 1);
  pthread_mutex_unlock(&e->mu);
  *m = 0;
  for (int i = 0; i < n; i++) {
    const char *name = xs[i].names[0];
    hvd_request_t *r = reqs[i];
    hvd_result_t src = HVD_SUCCESS;
    if (r == NULL && e->joined)
      src = make_stub(e, name, &xs[i].desc, &r);
    else if (r == NULL)
      src = hvd__set_error(HVD_ERR_INTERNAL,
                           "%s '%s' was agreed but is not in flight here",
                           hvd__coll_name(xs[0].desc.coll), name);
    if (src != HVD_SUCCESS) {
      rc = src;
      HVD__LOG(HVD__LOG_ERROR, "%s", hvd_last_error());
      continue;
    }
    if (e->tl != NULL && !r->is_stub)
      trace_negotiation(e, r, &xs[i], agreed, hvd__now());
    reqs[(*m)++] = r;
  }
  return rc;
}

/* Whether a joined rank takes part in the group: the same answer on every
 * rank (njoined is in the agreed list). */
static int joined_group(const hvd__response_t *xs, int n) {
  for (int i = 0; i < n; i++)
    if (xs[i].njoined > 0)
      return 1;
  return 0;
}

/* A group that joined ranks take part in: whether every rank has its
 * part (a joined rank its stubs, in host or device memory it may not
 * get), agreed in one MPI_Allreduce before any executor runs. A joined
 * rank that skipped the executor alone would leave its peers waiting for
 * it for good, in the executor's MPI steps or its NCCL calls. When one
 * failed, every rank fails the group with its code and words: "rank R
 * could not take part in the collective[ as a joined rank]: <R's error>;
 * nothing was launched" (R a world rank). Joins are rare and such groups
 * take the slow path anyway: one small allreduce more costs nothing. */
static hvd_result_t agree_stubs(hvd__engine_t *e, hvd_result_t mine) {
  struct {
    int rc, joined;
    char why[HVD__ERRMSG_MAX - 128];
  } msg;
  hvd_result_t rc = HVD_SUCCESS;
  int v = mine == HVD_SUCCESS ? e->env.size : e->env.rank, first = 0;
  HVD__MPI_CHECK(MPI_Allreduce(&v, &first, 1, MPI_INT, MPI_MIN, e->env.comm));
  if (first == e->env.size)
    return HVD_SUCCESS;
  memset(&msg, 0, sizeof msg);
  msg.rc = (int)mine;
  msg.joined = e->joined;
  if (e->env.rank == first)
    snprintf(msg.why, sizeof msg.why, "%.*s", (int)sizeof msg.why - 1,
             hvd_last_error());
  HVD__MPI_CHECK(
      MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, first, e->env.comm));
  int who = hvd__env_world_rank(&e->env, first);
  HVD__LOG(HVD__LOG_ERROR, "rank %d could not take part in a collective: %s",
           who, msg.why);
  return hvd__set_error((hvd_result_t)msg.rc,
                        "rank %d could not take part in the collective%s: %s; "
                        "nothing was launched",
                        who, msg.joined ? " as a joined rank" : "", msg.why);
fail:
  return rc;
}

/* Room for one more group in flight on executor `which`: the oldest
 * completes first while its executor has as many as it allows. */
static void flight_room(hvd__engine_t *e, const hvd__executor_t *ex) {
  while (e->fl_n > 0 &&
         (e->fl_n >= HVD__MAX_FLIGHTS || e->fl_n >= ex->max_in_flight))
    hvd__engine_reap(e, 1);
}

/* Runs the group; defer->deferred when its executor left it in flight,
 * its requests then copied into *keep (the flight's record, allocated
 * here first: without it, or with stubs, whose memory is freed when the
 * group ends here, the group is not left in flight). */
static hvd_result_t run(hvd__engine_t *e, const hvd__response_t *xs,
                        hvd_request_t *const *reqs, int m, int *which,
                        struct hvd__defer *defer, hvd_request_t ***keep) {
  const hvd__response_t *x = &xs[0];
  const hvd__executor_t *ex = executor(e, &x->desc, which);
  if (ex == NULL || ex->run[x->desc.coll] == NULL)
    return hvd__set_error(HVD_ERR_UNSUPPORTED, "no executor for device %d",
                          x->desc.device);
  const int64_t *stack[64], **dims0s = NULL;
  if (x->desc.coll == HVD__ALLGATHER) {       /* m == n: no stubs */
    dims0s = m <= 64 ? stack : e->group_dims; /* group_room's */
    for (int i = 0; i < m; i++)
      dims0s[i] = xs[i].dims0;
  }
  int stubs = 0;
  for (int q = 0; q < m; q++) {
    reqs[q]->batch_n = m;
    stubs += reqs[q]->is_stub;
  }
  hvd__work_t w = {&x->desc, reqs, m, dims0s, NULL};
  if (ex->reap != NULL && stubs == 0 &&
      (*keep = malloc((size_t)m * sizeof **keep)) != NULL) {
    flight_room(e, ex);
    w.defer = defer;
  }
  hvd_result_t rc = ex->run[x->desc.coll](e->exec_state[*which], &e->env, &w);
  if (defer->deferred)
    memcpy(*keep, reqs, (size_t)m * sizeof **keep);
  else {
    free(*keep);
    *keep = NULL;
  }
  return rc;
}

/* Frees the stubs and completes the group's requests with rc (the
 * message labelled with each request). */
static void finish(hvd__engine_t *e, hvd_request_t **reqs, int m,
                   hvd_result_t rc) {
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
}

/* A group its executor left in flight (reqs: its record's copy, owned
 * from now on): kept, oldest first, until hvd__engine_reap completes it. */
static void keep_flight(hvd__engine_t *e, hvd_request_t **reqs, int m,
                        int which, int coll, double t0) {
  e->flights[(e->fl_head + e->fl_n) % HVD__MAX_FLIGHTS] =
      (hvd__flight_t){reqs, m, which, coll, t0};
  e->fl_n++;
}

int hvd__engine_reap(hvd__engine_t *e, int wait) {
  int any = 0;
  while (e->fl_n > 0) {
    hvd__flight_t f = e->flights[e->fl_head];
    hvd_result_t rc;
    if (!hvd__executors[f.which]->reap(e->exec_state[f.which], &e->env, wait,
                                       &rc))
      break;
    e->fl_head = (e->fl_head + 1) % HVD__MAX_FLIGHTS;
    e->fl_n--;
    if (e->tl != NULL)
      trace_run(e, f.reqs, f.m, f.coll, f.t0);
    finish(e, f.reqs, f.m, rc);
    free(f.reqs);
    any = 1;
  }
  return any;
}

void hvd__engine_quiesce(void *ctx) {
  hvd__engine_t *e = ctx, *w = e->driver != NULL ? e->driver : e;
  hvd__engine_reap(w, 1);
  for (int i = 0; i < w->nsets; i++)
    hvd__engine_reap(w->sets[i], 1);
}

/* Runs n RUN responses as one group (n > 1 only for compatible
 * allreduces, allgathers or reducescatters; n <= 64 or group_cap) and
 * completes their requests, now or, for a group left in flight, when it
 * ends. */
static void run_group(hvd__engine_t *e, const hvd__response_t *xs, int n,
                      double agreed) {
  hvd_request_t *stack[64], **reqs = n <= 64 ? stack : e->group;
  int m, which = -1;
  struct hvd__defer defer = {0, NULL};
  hvd_request_t **keep = NULL;
  const hvd__response_t *x = &xs[0];
  hvd_result_t rc = take_requests(e, xs, n, agreed, reqs, &m);
  if (joined_group(xs, n)) /* every rank, whatever its own rc */
    rc = agree_stubs(e, rc);
  double t_exec = hvd__now();
  if (rc == HVD_SUCCESS)
    rc = run(e, xs, reqs, m, &which, &defer, &keep);
  if (defer.deferred) {
    hvd__requests_launched(reqs, m, defer.event);
    keep_flight(e, keep, m, which, x->desc.coll, t_exec);
  } else {
    if (e->tl != NULL && x->desc.coll != HVD__ALLREDUCE)
      trace_run(e, reqs, m, x->desc.coll, t_exec);
    finish(e, reqs, m, rc);
  }
}

/* ---- grouping ----------------------------------------------------------- */

/* b may join a's group: allreduces of one dtype, device, op, scaling and
 * wire format; allgathers of one device whose executor fuses them (any
 * dtypes and rows); reducescatters of one device, dtype, op and scaling
 * whose executor fuses them (any shapes). */
static int fusable(const hvd__engine_t *e, const hvd__response_t *a,
                   const hvd__response_t *b) {
  if (a->kind != HVD__RESP_RUN || b->kind != HVD__RESP_RUN ||
      a->desc.coll != b->desc.coll || a->desc.device != b->desc.device)
    return 0;
  int c = a->desc.coll, which;
  if (c != HVD__ALLREDUCE && c != HVD__ALLGATHER && c != HVD__REDUCESCATTER)
    return 0;
  if (c != HVD__ALLREDUCE) {
    const hvd__executor_t *ex = executor(e, &a->desc, &which);
    if (ex == NULL || !(ex->fuses & (1u << c)))
      return 0;
    if (c == HVD__ALLGATHER)
      return 1;
  }
  return a->desc.dtype == b->desc.dtype && a->desc.op == b->desc.op &&
         a->desc.prescale == b->desc.prescale &&
         a->desc.postscale == b->desc.postscale &&
         (c != HVD__ALLREDUCE || a->desc.wire == b->desc.wire);
}

/* What a member adds to its group: an allreduce's or reducescatter's
 * input bytes; an allgather's result, estimated from the reference shape
 * (the size times the rows of the rank whose descriptor it is), INT64_MAX
 * past it (rows of 0 bytes claim any count: such a sum is refused later,
 * hvd__rows_total). */
static int64_t resp_bytes(const hvd__engine_t *e, const hvd__response_t *x) {
  int64_t n = (int64_t)hvd_dtype_size(x->desc.dtype);
  for (int i = 0; i < x->desc.ndim; i++)
    if (x->desc.shape[i] == 0)
      return 0;
  for (int i = 0; i < x->desc.ndim; i++)
    if (__builtin_mul_overflow(n, x->desc.shape[i], &n))
      return INT64_MAX;
  if (x->desc.coll == HVD__ALLGATHER &&
      __builtin_mul_overflow(n, (int64_t)e->env.size, &n))
    return INT64_MAX;
  return n;
}

/* Runs the group that starts at xs[0]: it and the compatible collectives
 * after it, up to the fusion threshold. Returns how many it took. */
static int run_fused(hvd__engine_t *e, hvd__response_t *xs, int n,
                     double agreed) {
  int g = 1, max = e->group_cap > 64 ? e->group_cap : 64;
  int64_t bytes = resp_bytes(e, &xs[0]), limit = e->settings.fusion_threshold;
  while (g < n && g < max && limit > 0 && fusable(e, &xs[0], &xs[g]) &&
         resp_bytes(e, &xs[g]) <= limit - bytes) { /* both >= 0: no overflow */
    bytes += resp_bytes(e, &xs[g]);
    g++;
  }
  if (xs[0].desc.coll == HVD__ALLREDUCE)
    hvd__burst_add(&e->burst, bytes); /* before complete() ends the burst */
  run_group(e, xs, g, agreed);
  return g;
}

/* Every request named by an error response fails with its message. */
static void fail_named(hvd__engine_t *e, const hvd__response_t *x) {
  HVD__LOG(HVD__LOG_DEBUG, "%s", x->errmsg);
  for (int k = 0; k < x->nnames; k++) {
    hvd_request_t *r = of_kind(lookup(e, x->names[k]), x->desc.coll, 0);
    if (r != NULL)
      complete(e, r, x->err, x->errmsg);
  }
}

static void join_done(hvd__engine_t *e, const hvd__response_t *x) {
  hvd_request_t *r = of_kind(lookup(e, HVD__JOIN_NAME), HVD__JOIN, 1);
  e->joined = 0;
  if (r != NULL) {
    r->last_rank = x->arg;
    complete(e, r, HVD_SUCCESS, NULL);
  }
}

/* The stall inspector's verdict: hvd stops, naming what stalled. */
static void stall_stop(hvd__engine_t *e, const hvd__response_t *x) {
  HVD__LOG(HVD__LOG_ERROR, "%s", x->errmsg);
  char reason[HVD__ERRMSG_MAX];
  snprintf(reason, sizeof reason, "hvd stopped: %s", x->errmsg);
  hvd__engine_stop_all(e, HVD_ERR_STALL, reason, reason);
}

/* Room for a group as long as the list: its requests and rows (64 on the
 * stack). Which groups a list makes must be the same on every rank, or
 * they make different MPI steps (a fused group's agreement, one per
 * group) and wait in them for good; so the cap is. It only grows, from
 * the list's length, the same on every rank; when it does (rarely),
 * whether it could on every rank is agreed in one MPI_Allreduce, and when
 * one could not, every rank keeps the cap it had: the list runs in
 * smaller groups everywhere (a warning names the rank). */
static void group_room(hvd__engine_t *e, int n) {
  if (n <= 64 || n <= e->group_cap)
    return;
  hvd_request_t **g = NULL;
  const int64_t **d = NULL;
  int ok = !hvd__fault("group");
  if (ok && (g = realloc(e->group, (size_t)n * sizeof *g)) != NULL)
    e->group = g;
  if (ok && (d = realloc(e->group_dims, (size_t)n * sizeof *d)) != NULL)
    e->group_dims = d;
  int v = g != NULL && d != NULL ? e->env.size : e->env.rank, first = 0;
  if (MPI_Allreduce(&v, &first, 1, MPI_INT, MPI_MIN, e->env.comm) !=
      MPI_SUCCESS) /* hvd's next MPI step fails too, on every rank */
    return;
  if (first == e->env.size) {
    e->group_cap = n;
    return;
  }
  HVD__LOG(HVD__LOG_WARNING,
           "rank %d has no memory for a group of %d requests: groups of at "
           "most %d",
           hvd__env_world_rank(&e->env, first), n,
           e->group_cap > 64 ? e->group_cap : 64);
}

hvd__stop_t hvd__engine_execute(hvd__engine_t *e, hvd__response_t *xs, int n,
                                int learn, double agreed) {
  hvd__stop_t stop = {HVD__RUN_ON, -1, 0};
  const hvd__response_t *stalled = NULL;
  group_room(e, n);
  for (int i = 0; i < n;) {
    hvd__response_t *x = &xs[i];
    if (x->kind == HVD__RESP_RUN) {
      int g = run_fused(e, x, n - i, agreed);
      for (int k = 0; learn && k < g; k++)
        hvd__fastpath_learn(e->fast, &xs[i + k], &e->slow);
      i += g;
      continue;
    }
    if (x->kind == HVD__RESP_ERROR)
      fail_named(e, x);
    else if (x->kind == HVD__RESP_JOIN_DONE)
      join_done(e, x);
    else if (stop.kind == HVD__RUN_ON && x->kind == HVD__RESP_STALL)
      stop = (hvd__stop_t){HVD__STOP_STALL, -1, 0}, stalled = x;
    else if (stop.kind == HVD__RUN_ON && x->kind == HVD__RESP_SHUTDOWN)
      stop =
          (hvd__stop_t){HVD__STOP_SHUTDOWN, x->arg, x->err == HVD_ERR_SHUTDOWN};
    i++;
  }
  if (stalled != NULL) /* remembered: stop after the list */
    stall_stop(e, stalled);
  return stop;
}
