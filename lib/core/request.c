/* request.c - request allocation, completion and hvd_wait/hvd_test. */
#include "core/request.h"
#include "base/wait.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/forked.h"
#include "core/runtime.h"

/* One completion lock and condition for every request: requests outlive
 * the engine (hvd_wait after hvd_shutdown), and one broadcast can wake the
 * waiter of a whole group. */
static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;

hvd_request_t *hvd__request_new(const char *name) {
  hvd_request_t *r = calloc(1, sizeof *r);
  if (r == NULL)
    return NULL;
  size_t len = strlen(name) + 1;
  r->name = len <= sizeof r->inline_name ? r->inline_name : malloc(len);
  if (r->name == NULL) {
    free(r);
    return NULL;
  }
  memcpy(r->name, name, len);
  r->last_rank = -1;
  return r;
}

void hvd__request_free(hvd_request_t *r) {
  if (r == NULL)
    return;
  if (r->name != r->inline_name)
    free(r->name);
  free(r->splits);
  free(r->recv_splits);
  free(r->errmsg);
  hvd__cuda_ready_put(r->desc.device, r->ready);
  free(r);
}

void hvd__request_set_result(hvd_request_t *r, hvd_result_t rc,
                             const char *msg) {
  r->rc = rc;
  if (rc != HVD_SUCCESS) {
    r->errmsg = strdup(msg ? msg : hvd_strerror(rc));
    if (r->recv_out != NULL)
      hvd_tensor_free(&r->recv); /* an output hvd allocated */
  }
}

void hvd__requests_done(hvd_request_t *const *rs, int n) {
  pthread_mutex_lock(&done_mu);
  for (int i = 0; i < n; i++)
    rs[i]->done = 1;
  pthread_mutex_unlock(&done_mu);
  pthread_cond_broadcast(&done_cv);
}

void hvd__requests_launched(hvd_request_t *const *rs, int n, void *event) {
  pthread_mutex_lock(&done_mu);
  for (int i = 0; i < n; i++)
    rs[i]->launched = event;
  pthread_mutex_unlock(&done_mu);
  pthread_cond_broadcast(&done_cv);
}

void hvd__request_complete(hvd_request_t *r, hvd_result_t rc, const char *msg) {
  hvd__request_set_result(r, rc, msg);
  hvd__requests_done(&r, 1);
}

/* Hands the outputs to the caller, sets this thread's message, frees r. */
static hvd_result_t finish(hvd_request_t *r) {
  hvd_result_t rc = r->rc;
  if (rc == HVD_SUCCESS) {
    if (r->recv_out != NULL) {
      *r->recv_out = r->recv;
      r->recv.data = NULL;
    }
    if (r->recv_splits_out != NULL && r->recv_splits != NULL)
      memcpy(r->recv_splits_out, r->recv_splits,
             (size_t)r->nranks * sizeof *r->recv_splits);
    if (r->last_rank_out != NULL)
      *r->last_rank_out = r->last_rank;
    hvd__clear_error();
  } else {
    hvd__set_error_msg(rc, r->errmsg);
  }
  hvd__request_free(r);
  return rc;
}

hvd_result_t hvd_wait(hvd_request_t *req) {
  if (hvd__forked()) /* the engine that would complete req is the parent's */
    return hvd__not_initialized("hvd_wait");
  if (req == NULL) {
    if (!hvd_is_initialized())
      return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                            "hvd_wait: hvd_init() has not been called");
    return hvd__set_error(HVD_ERR_INVALID_ARG, "hvd_wait: req is NULL");
  }
  pthread_mutex_lock(&done_mu);
  if (!req->done) {
    pthread_mutex_unlock(&done_mu);
    hvd__caller_blocks();
    pthread_mutex_lock(&done_mu);
    while (!req->done)
      pthread_cond_wait(&done_cv, &done_mu);
    hvd__caller_unblocks();
  }
  pthread_mutex_unlock(&done_mu);
  return finish(req);
}

/* Under done_mu, with req neither done nor launched: until one of them. */
static void wait_launched(hvd_request_t *req) {
  pthread_mutex_unlock(&done_mu);
  hvd__caller_blocks(); /* the engine cycles at once: no back-off */
  pthread_mutex_lock(&done_mu);
  while (!req->done && req->launched == NULL)
    pthread_cond_wait(&done_cv, &done_mu);
  hvd__caller_unblocks();
}

hvd_result_t hvd_cuda_stream_wait(hvd_request_t *req, void *stream) {
  if (hvd__forked())
    return hvd__not_initialized("hvd_cuda_stream_wait");
  if (req == NULL) {
    if (!hvd_is_initialized())
      return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                            "hvd_cuda_stream_wait: hvd_init() has not been "
                            "called");
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_cuda_stream_wait: req is NULL");
  }
  if (!hvd_cuda_built())
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "hvd_cuda_stream_wait: this build has no CUDA");
  char lab[300];
  hvd__request_label(req, lab, sizeof lab);
  if (req->desc.device < 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_cuda_stream_wait: %s is on the host: it has no "
                          "device result to wait for (hvd_wait it)",
                          lab);
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&done_mu);
  if (!req->done && req->launched == NULL)
    wait_launched(req);
  if (!req->done) /* in flight: the group's event cannot be reused until
                     it completes, which needs done_mu */
    rc = hvd__cuda_stream_wait_event(
        req->desc.device, stream != NULL ? stream : hvd_cuda_stream(),
        req->launched);
  else if (req->rc != HVD_SUCCESS)
    rc = hvd__set_error_msg(req->rc, req->errmsg);
  pthread_mutex_unlock(&done_mu);
  if (rc == HVD_SUCCESS)
    hvd__clear_error();
  return rc;
}

hvd_result_t hvd_test(hvd_request_t *req, int *done) {
  if (hvd__forked()) {
    if (done != NULL)
      *done = 0;
    return hvd__not_initialized("hvd_test");
  }
  if (req == NULL || done == NULL) {
    if (done != NULL)
      *done = 0;
    if (!hvd_is_initialized())
      return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                            "hvd_test: hvd_init() has not been called");
    return hvd__set_error(HVD_ERR_INVALID_ARG, "hvd_test: %s is NULL",
                          req == NULL ? "req" : "done");
  }
  pthread_mutex_lock(&done_mu);
  int d = req->done;
  pthread_mutex_unlock(&done_mu);
  *done = d;
  return d ? finish(req) : HVD_SUCCESS;
}

void hvd__request_label(const hvd_request_t *r, char *buf, size_t n) {
  if (r->desc.coll == HVD__BARRIER || r->desc.coll == HVD__JOIN)
    snprintf(buf, n, "%s", hvd__coll_name(r->desc.coll));
  else
    snprintf(buf, n, "%s '%s'", hvd__coll_name(r->desc.coll), r->name);
}
