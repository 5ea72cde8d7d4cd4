/*
 * request.h - one submitted collective: what the caller asked for, the
 * descriptor that is negotiated across ranks, and its completion state.
 */
#ifndef HVD_CORE_REQUEST_H
#define HVD_CORE_REQUEST_H

#include <pthread.h>
#include <stddef.h>

#include "internal.h"

/* What a rank says about one collective. Negotiation compares these. */
typedef struct hvd__desc {
  int coll;        /* hvd__coll_t */
  int dtype;       /* hvd_dtype_t */
  int device;      /* HVD_CPU or CUDA ordinal */
  int ndim;
  int64_t shape[HVD_MAX_DIMS];
  int op;          /* hvd_op_t */
  double prescale, postscale;
  int root;
} hvd__desc_t;

/* Names of the collectives that have no user name. */
#define HVD__BARRIER_NAME "hvd.barrier"
#define HVD__JOIN_NAME "hvd.join"

struct hvd_request {
  char *name;
  hvd__desc_t desc;
  hvd_tensor_t send;        /* input; broadcast's in-place tensor */
  hvd_tensor_t recv;        /* allreduce: caller's output; else hvd's output */
  hvd_tensor_t *recv_out;   /* caller's slot for an output hvd allocates */
  int64_t *splits;          /* alltoall: copy of the caller's splits */
  int64_t *recv_splits;     /* alltoall: rows received per rank (hvd's) */
  int64_t *recv_splits_out; /* caller's array, may be NULL */
  int *last_rank_out;       /* join: caller's slot, may be NULL */
  int last_rank;
  int nranks;               /* world size when submitted */
  int is_stub;              /* made by the engine for a rank that joined */
  double t_submit;          /* hvd__now() at submission (timeline) */
  double t_ready;           /* t_submit on the aligned timeline clock */

  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  hvd_result_t rc;
  char *errmsg;
  hvd_request_t *next; /* engine queue link */
};

/* A zeroed request with its own copy of name; NULL when out of memory. */
hvd_request_t *hvd__request_new(const char *name);
/* Frees the request and everything it owns except recv's data when the
 * caller took it. Accepts NULL. */
void hvd__request_free(hvd_request_t *r);
/* Marks r done with rc (and msg when rc fails) and wakes its waiter. On
 * failure, outputs hvd allocated are released. */
void hvd__request_complete(hvd_request_t *r, hvd_result_t rc, const char *msg);

/* "allreduce 'w'", or just "barrier" / "join" for those without a name. */
void hvd__request_label(const hvd_request_t *r, char *buf, size_t n);

#endif /* HVD_CORE_REQUEST_H */
