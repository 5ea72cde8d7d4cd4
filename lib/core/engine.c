/*
 * engine.c - the cycle: wait for work (or the cycle deadline), negotiate
 * the new requests with every rank, execute the agreed responses in
 * order, complete the requests. Every rank runs cycles in lockstep: the
 * negotiation is a collective.
 */
#include "core/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/controller.h"
#include "core/errors.h"
#include "core/log.h"
#include "core/table.h"
#include "ops/executor.h"
#include "ops/reduce.h"

#define MAX_EXECUTORS 8

struct hvd__engine {
  hvd__exec_env_t env;
  hvd__settings_t settings;
  pthread_t thread;

  /* guarded by mu */
  pthread_mutex_t mu;
  pthread_cond_t cv; /* wakes the engine thread */
  hvd_request_t *qhead, *qtail;
  hvd__table_t *inflight; /* name -> request, from submit to completion */
  int stop_requested;
  int stopped;
  char stop_reason[HVD__ERRMSG_MAX];

  /* engine thread only */
  hvd__controller_t *ctl;
  void *exec_state[MAX_EXECUTORS];
  int joined; /* this rank has a join in flight */
};

/* ---- completion --------------------------------------------------------- */

static void complete(hvd__engine_t *e, hvd_request_t *r, hvd_result_t rc,
                     const char *msg) {
  pthread_mutex_lock(&e->mu);
  hvd__table_remove(e->inflight, r->name);
  pthread_mutex_unlock(&e->mu);
  hvd__request_complete(r, rc, msg);
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
 * rc, "<label>: <in_flight_msg>"; later submissions get "<label>: <reason>". */
static void stop_all(hvd__engine_t *e, hvd_result_t rc, const char *reason,
                     const char *in_flight_msg) {
  hvd_request_t *list = NULL;
  pthread_mutex_lock(&e->mu);
  e->stopped = 1;
  snprintf(e->stop_reason, sizeof e->stop_reason, "%s", reason);
  hvd__table_each(e->inflight, collect, &list);
  hvd__table_destroy(e->inflight);
  e->inflight = hvd__table_create();
  e->qhead = e->qtail = NULL; /* queued requests are in inflight too */
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

/* ---- executing responses ------------------------------------------------ */

/* What a rank that joined contributes to an allreduce: the op's identity. */
static hvd_request_t *make_stub(const char *name, const hvd__desc_t *d) {
  hvd_request_t *r = hvd__request_new(name);
  if (r == NULL)
    return NULL;
  r->desc = *d;
  r->is_stub = 1;
  r->send.dtype = (hvd_dtype_t)d->dtype;
  r->send.ndim = d->ndim;
  memcpy(r->send.shape, d->shape, sizeof d->shape);
  r->send.device = HVD_CPU;
  int64_t n = hvd_tensor_numel(&r->send);
  r->send.data = malloc((size_t)n * hvd_dtype_size(r->send.dtype) + 1);
  if (r->send.data == NULL) {
    hvd__request_free(r);
    return NULL;
  }
  hvd__fill_identity(r->send.data, n, r->send.dtype, (hvd_op_t)d->op);
  r->recv = r->send;
  return r;
}

static void free_stub(hvd_request_t *r) {
  free(r->send.data);
  hvd__request_free(r);
}

static void run(hvd__engine_t *e, const hvd__response_t *x) {
  hvd_request_t *stack[16], **reqs = stack;
  if (x->nnames > 16 && !(reqs = calloc((size_t)x->nnames, sizeof *reqs))) {
    HVD__LOG(HVD__LOG_ERROR, "out of memory running a response");
    return;
  }
  int n = 0;
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < x->nnames; i++) {
    hvd_request_t *r = lookup(e, x->names[i]);
    if (r == NULL && e->joined && x->njoined > 0)
      r = make_stub(x->names[i], &x->desc);
    if (r == NULL) {
      rc = hvd__set_error(HVD_ERR_INTERNAL,
                          "%s '%s' was agreed but is not in flight here",
                          hvd__coll_name(x->desc.coll), x->names[i]);
      HVD__LOG(HVD__LOG_ERROR, "%s", hvd_last_error());
      continue;
    }
    reqs[n++] = r;
  }
  int which = hvd__executor_for(x->desc.device);
  const hvd__executor_t *ex = which >= 0 ? hvd__executors[which] : NULL;
  if (rc == HVD_SUCCESS) {
    if (ex == NULL || ex->run[x->desc.coll] == NULL) {
      rc = hvd__set_error(HVD_ERR_UNSUPPORTED, "no executor for device %d",
                          x->desc.device);
    } else {
      hvd__work_t w = {&x->desc, reqs, n, x->dims0};
      rc = ex->run[x->desc.coll](e->exec_state[which], &e->env, &w);
    }
  }
  char msg[HVD__ERRMSG_MAX] = "";
  for (int i = 0; i < n; i++) {
    if (reqs[i]->is_stub) {
      free_stub(reqs[i]);
      continue;
    }
    if (rc != HVD_SUCCESS) {
      char lab[300];
      hvd__request_label(reqs[i], lab, sizeof lab);
      snprintf(msg, sizeof msg, "%s: %s", lab, hvd_last_error());
    }
    complete(e, reqs[i], rc, msg);
  }
  if (reqs != stack)
    free(reqs);
}

static void execute(hvd__engine_t *e, const hvd__response_t *x) {
  switch (x->kind) {
  case HVD__RESP_RUN:
    run(e, x);
    break;
  case HVD__RESP_ERROR:
    HVD__LOG(HVD__LOG_DEBUG, "%s", x->errmsg);
    for (int i = 0; i < x->nnames; i++) {
      hvd_request_t *r = lookup(e, x->names[i]);
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
  default:
    break;
  }
}

/* ---- the thread --------------------------------------------------------- */

static void deadline_to_timespec(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

static void *engine_main(void *arg) {
  hvd__engine_t *e = arg;
  hvd_request_t **fresh = NULL;
  int cap = 0;
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1000UL); /* short sleeps stay short */
#endif
  double cycle = e->settings.cycle_time_ms / 1000.0;
  double next = hvd__now() + cycle;
  for (;;) {
    pthread_mutex_lock(&e->mu);
    while (e->qhead == NULL && !e->stop_requested && hvd__now() < next) {
      struct timespec ts;
      deadline_to_timespec(next, &ts);
      pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    hvd_request_t *list = e->qhead;
    e->qhead = e->qtail = NULL;
    int want_stop = e->stop_requested;
    pthread_mutex_unlock(&e->mu);
    next = hvd__now() + cycle;

    int n = 0;
    for (hvd_request_t *r = list; r != NULL; r = r->next) {
      if (n == cap) {
        int ncap = cap ? 2 * cap : 64;
        hvd_request_t **p = realloc(fresh, (size_t)ncap * sizeof *p);
        if (p == NULL)
          break; /* the rest stay unsent; stop_all completes them */
        fresh = p;
        cap = ncap;
      }
      fresh[n++] = r;
      if (r->desc.coll == HVD__JOIN)
        e->joined = 1;
    }

    hvd__response_t *resp = NULL;
    int nresp = 0;
    hvd_result_t rc = hvd__controller_negotiate(e->ctl, fresh, n, want_stop,
                                                &resp, &nresp);
    if (rc != HVD_SUCCESS) {
      char reason[HVD__ERRMSG_MAX];
      snprintf(reason, sizeof reason, "hvd's engine failed: %s",
               hvd_last_error());
      HVD__LOG(HVD__LOG_ERROR, "%s", reason);
      stop_all(e, rc, reason, reason);
      break;
    }
    int stop_by = -1;
    for (int i = 0; i < nresp; i++) {
      if (resp[i].kind == HVD__RESP_SHUTDOWN)
        stop_by = resp[i].arg;
      else
        execute(e, &resp[i]);
    }
    hvd__responses_free(resp, nresp);
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
  free(fresh);
  return NULL;
}

/* ---- lifecycle and submission ------------------------------------------ */

static void engine_free(hvd__engine_t *e) {
  for (int i = 0; hvd__executors[i] != NULL; i++)
    if (e->exec_state[i] != NULL)
      hvd__executors[i]->close(e->exec_state[i]);
  hvd__controller_destroy(e->ctl);
  hvd__table_destroy(e->inflight);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  free(e);
}

hvd_result_t hvd__engine_start(MPI_Comm comm, const hvd__settings_t *s,
                               hvd__engine_t **out) {
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
  e->env.comm = comm;
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &e->env.rank));
  HVD__MPI_CHECK(MPI_Comm_size(comm, &e->env.size));
  e->inflight = hvd__table_create();
  e->ctl = hvd__controller_create(comm, e->env.rank, e->env.size);
  if (e->inflight == NULL || e->ctl == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "engine");
    goto fail;
  }
  for (int i = 0; hvd__executors[i] != NULL; i++)
    HVD__CHECK(hvd__executors[i]->open(&e->env, &e->exec_state[i]));
  int err = pthread_create(&e->thread, NULL, engine_main, e);
  if (err != 0) {
    rc = hvd__set_error(HVD_ERR_SYSTEM, "pthread_create: %s", strerror(err));
    goto fail;
  }
  *out = e;
  return HVD_SUCCESS;
fail:
  engine_free(e);
  return rc;
}

void hvd__engine_stop(hvd__engine_t *e) {
  if (e == NULL)
    return;
  pthread_mutex_lock(&e->mu);
  e->stop_requested = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  pthread_join(e->thread, NULL);
  engine_free(e);
}

hvd_result_t hvd__engine_submit(hvd__engine_t *e, hvd_request_t *r) {
  char lab[300];
  hvd__request_label(r, lab, sizeof lab);
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&e->mu);
  if (e->stopped) {
    rc = hvd__set_error(HVD_ERR_SHUTDOWN, "%s: %s", lab, e->stop_reason);
  } else if (e->stop_requested) {
    rc = hvd__set_error(HVD_ERR_SHUTDOWN, "%s: hvd is shutting down", lab);
  } else if (hvd__table_get(e->inflight, r->name) != NULL) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: a collective named '%s' is already in flight on "
                        "this rank",
                        lab, r->name);
  } else if (hvd__table_put(e->inflight, r->name, r) != 0) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: request table", lab);
  } else {
    r->next = NULL;
    if (e->qtail)
      e->qtail->next = r;
    else
      e->qhead = r;
    e->qtail = r;
    pthread_cond_signal(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}
