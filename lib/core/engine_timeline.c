/*
 * engine_timeline.c - the engine's timeline (timeline.c writes the file):
 * opening it at the engine's start, hvd_timeline_start/stop carried out on
 * the engine thread between cycles, user marks and counters, and the
 * spans of each request's phases that the executors report.
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/tensor.h"
#include "core/engine_int.h"

/* The aligned clock and the timeline files (timeline.c). */
hvd_result_t hvd__engine_start_timeline(hvd__engine_t *e) {
  const hvd__settings_t *s = &e->settings;
  hvd__timeline_start_t t;
  hvd_result_t rc = hvd__timeline_start(e->env.comm, e->env.rank, e->env.size,
                                        s->timeline, s->timeline_all_ranks,
                                        (uint64_t)s->timeline_max_bytes, &t);
  e->epoch = t.epoch;
  e->timeline_any = t.any;
  e->tl = t.t;
  if (e->tl != NULL) {
    e->env.trace = hvd__engine_trace_hook;
    e->env.trace_ctx = e;
  }
  return rc;
}

/* A timeline command of hvd_timeline_start/stop (taken under mu), done on
 * this thread: the old file closed, the new one (rank 0's, or every rank's
 * with HVD_TIMELINE_ALL_RANKS) opened; the caller told. */
void hvd__engine_timeline_command(hvd__engine_t *e, int cmd, const char *path) {
  hvd_result_t rc = HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX] = "";
  pthread_mutex_lock(&e->tl_mu);
  hvd__timeline_close(e->tl);
  e->tl = NULL;
  if (cmd == 1 && (e->env.rank == 0 || e->settings.timeline_all_ranks)) {
    char file[HVD__PATH_MAX + 16];
    hvd__timeline_file_of(path, e->settings.timeline_all_ranks, e->env.rank,
                          file, sizeof file);
    e->tl = hvd__timeline_open(file, e->env.rank, e->epoch,
                               (uint64_t)e->settings.timeline_max_bytes);
    if (e->tl == NULL) {
      const char *why = hvd_last_error();
      if (strncmp(why, "HVD_TIMELINE: ", 14) == 0) /* the open's words */
        why += 14;
      rc = HVD_ERR_IO;
      snprintf(msg, sizeof msg, "hvd_timeline_start: %s", why);
    }
  }
  e->env.trace = e->tl != NULL ? hvd__engine_trace_hook : NULL;
  e->env.trace_ctx = e;
  pthread_mutex_unlock(&e->tl_mu);
  pthread_mutex_lock(&e->mu);
  e->tl_rc = rc;
  snprintf(e->tl_msg, sizeof e->tl_msg, "%s", msg);
  e->tl_gen++;
  pthread_cond_broadcast(&e->tl_cv);
  pthread_mutex_unlock(&e->mu);
}

hvd_result_t hvd__engine_timeline(hvd__engine_t *e, int cmd, const char *path) {
  hvd_result_t rc;
  pthread_mutex_lock(&e->mu);
  if (e->stopped) {
    pthread_mutex_unlock(&e->mu);
    return hvd__set_error(HVD_ERR_SHUTDOWN, "hvd_timeline_%s: hvd has stopped",
                          cmd == 1 ? "start" : "stop");
  }
  while (e->tl_cmd != 0) /* another caller's first */
    pthread_cond_wait(&e->tl_cv, &e->mu);
  unsigned gen = e->tl_gen;
  e->tl_cmd = cmd;
  snprintf(e->tl_path, sizeof e->tl_path, "%s", path ? path : "");
  pthread_cond_signal(&e->cv);
  while (e->tl_gen == gen && !e->stopped)
    pthread_cond_wait(&e->tl_cv, &e->mu);
  if (e->tl_gen == gen) {
    e->tl_cmd = 0;
    rc = hvd__set_error(HVD_ERR_SHUTDOWN, "hvd_timeline_%s: hvd has stopped",
                        cmd == 1 ? "start" : "stop");
  } else {
    rc = e->tl_rc;
    if (rc != HVD_SUCCESS)
      hvd__set_error_msg(rc, e->tl_msg);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

void hvd__engine_timeline_mark(hvd__engine_t *e, const char *name, int counter,
                               double value) {
  pthread_mutex_lock(&e->tl_mu);
  if (counter)
    hvd__timeline_counter(e->tl, name, hvd__now(), value);
  else
    hvd__timeline_instant(e->tl, "USER", name, hvd__now(), NULL);
  pthread_mutex_unlock(&e->tl_mu);
}

void hvd__engine_trace_span(hvd__engine_t *e, const hvd_request_t *r,
                            const char *phase, double t0, double t1) {
  char args[160];
  snprintf(args, sizeof args, "\"bytes\":%llu,\"dtype\":\"%s\",\"tensors\":%d",
           (unsigned long long)hvd__tensor_bytes(&r->send),
           hvd_dtype_name(r->desc.dtype), r->batch_n > 0 ? r->batch_n : 1);
  hvd__timeline_span(e->tl, r->name, phase, t0, t1, args);
}

void hvd__engine_trace_hook(void *ctx, const hvd_request_t *r,
                            const char *phase, double t0, double t1) {
  hvd__engine_trace_span(ctx, r, phase, t0, t1);
}
