/*
 * engine_submit.c - submission, the engine's only entry from callers'
 * threads: a request (or a group's, all or none) enters the in-flight
 * table and the queue under the engine's lock, and the engine thread is
 * woken unless it defers.
 */
#include <stdio.h>

#include "base/errors.h"
#include "core/engine.h"
#include "core/engine_int.h"

/* The error paths of submission format the request's label; the common
 * path does not. */
static hvd_result_t submit_error(hvd_result_t rc, const hvd_request_t *r,
                                 const char *why) {
  char lab[300];
  hvd__request_label(r, lab, sizeof lab);
  return hvd__set_error(rc, "%s: %s", lab, why);
}

/* The member that hvd__engine_submit_many refused, per thread. */
static _Thread_local int refused = -1;

int hvd__engine_refused(void) { return refused; }

hvd_result_t hvd__engine_submit(hvd__engine_t *e, hvd_request_t *r) {
  return hvd__engine_submit_many(e, &r, 1);
}

hvd_result_t hvd__engine_submit_many(hvd__engine_t *e, hvd_request_t *const *rs,
                                     int n) {
  hvd_result_t rc = HVD_SUCCESS;
  double now = hvd__now();
  int put = 0;
  refused = -1;
  pthread_mutex_lock(&e->mu);
  if (e->stopped) {
    rc = submit_error(e->stop_rc, rs[0], e->stop_reason);
  } else if (e->stop_requested) {
    rc = submit_error(HVD_ERR_SHUTDOWN, rs[0], "hvd is shutting down");
  } else {
    for (; put < n && rc == HVD_SUCCESS; put++) {
      hvd_request_t *r = rs[put];
      if (hvd__table_get(e->inflight, r->name) != NULL) {
        char why[HVD__ERRMSG_MAX];
        snprintf(why, sizeof why,
                 "a collective named '%.900s' is already in flight on this "
                 "rank",
                 r->name);
        rc = submit_error(HVD_ERR_INVALID_ARG, r, why);
        refused = put;
        break;
      }
      if (hvd__table_put(e->inflight, r->name, r) != 0) {
        rc = submit_error(HVD_ERR_NO_MEMORY, r, "request table");
        break;
      }
    }
  }
  if (rc != HVD_SUCCESS) { /* all or nothing */
    for (int i = 0; i < put; i++)
      hvd__table_remove(e->inflight, rs[i]->name);
    pthread_mutex_unlock(&e->mu);
    return rc;
  }
  int wake = 0;
  if (hvd__table_count(e->inflight) == (size_t)n) /* just these: a burst */
    hvd__burst_begin(&e->burst, now);
  for (int i = 0; i < n; i++) {
    rs[i]->t_submit = now;
    rs[i]->t_ready = now - e->epoch;
    hvd__queue_push(&e->queue, rs[i]);
    wake |= !e->defer || rs[i]->desc.device != HVD_CPU;
  }
  if (wake) {
    e->urgent = 1;
    pthread_cond_signal(&e->cv);
  }
  pthread_mutex_unlock(&e->mu);
  if (wake && e->driver != NULL) /* a set's: the world's thread runs it */
    hvd__engine_wake_driver(e);
  return rc;
}
