/*
 * request.h - the life of one submitted collective: made by api.c, handed
 * to the engine, completed, waited for. The request itself and its
 * negotiated descriptor are types an executor sees too, so they are
 * defined in ops/executor.h.
 */
#ifndef HVD_CORE_REQUEST_H
#define HVD_CORE_REQUEST_H

#include <pthread.h>
#include <stddef.h>

#include "internal.h"
#include "ops/executor.h"

/* A zeroed request with its own copy of name; NULL when out of memory. */
hvd_request_t *hvd__request_new(const char *name);
/* Frees the request and everything it owns except recv's data when the
 * caller took it. Accepts NULL. */
void hvd__request_free(hvd_request_t *r);
/* Sets r's result (and msg when rc fails; outputs hvd allocated are then
 * released). The request is not done yet: see hvd__requests_done. */
void hvd__request_set_result(hvd_request_t *r, hvd_result_t rc,
                             const char *msg);

/* Marks n requests done at once and wakes their waiters. A waiter woken
 * by the first finds the rest done too, so a burst completes without one
 * sleep per request. After this the engine must not touch them: a waiter
 * may free them at once. */
void hvd__requests_done(hvd_request_t *const *rs, int n);

/* The requests' device group is in flight: `event` fires when their
 * results are complete (waiters in hvd_cuda_stream_wait wake). */
void hvd__requests_launched(hvd_request_t *const *rs, int n, void *event);

/* hvd__request_set_result + hvd__requests_done for one request. */
void hvd__request_complete(hvd_request_t *r, hvd_result_t rc, const char *msg);

/* "allreduce 'w'", or just "barrier" / "join" for those without a name. */
void hvd__request_label(const hvd_request_t *r, char *buf, size_t n);

#endif /* HVD_CORE_REQUEST_H */
