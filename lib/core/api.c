/*
 * api.c - the collective entry points: validate on the caller's thread,
 * build a request, hand it to the engine. Blocking forms are the async
 * form followed by hvd_wait.
 */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/forked.h"
#include "base/tensor.h"
#include "core/api.h"
#include "core/engine.h"
#include "core/runtime.h"

/* ---- argument checks ---------------------------------------------------- */

/* A tensor's name: not NULL, not empty, and not one of the names of
 * hvd_barrier's and hvd_join's own requests (executor.h), which share
 * the in-flight table and the coordinator's with the tensors. */
static hvd_result_t check_name(const char *kind, const char *name) {
  if (name == NULL || name[0] == '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: name is NULL or empty",
                          kind);
  if (strcmp(name, HVD__BARRIER_NAME) == 0 || strcmp(name, HVD__JOIN_NAME) == 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': the name is reserved for hvd_%s", kind,
                          name, name + 4);
  return HVD_SUCCESS;
}

static hvd_result_t check_req(const char *kind, const char *name,
                              hvd_request_t **req) {
  if (req != NULL)
    return HVD_SUCCESS;
  if (name == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: req is NULL", kind);
  return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': req is NULL", kind,
                        name);
}

static hvd_result_t check_op(const char *kind, const char *name, int op) {
  if (op < 0 || op >= HVD_OP_COUNT)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': unknown op %d", kind,
                          name, op);
  return HVD_SUCCESS;
}

/* HVD_ADASUM's tensors: float32 or float64 (on the host, or on the
 * rank's GPU: staged through host memory), on a wire of their own dtype
 * (lib/ops/adasum.c). */
static hvd_result_t check_adasum(const char *kind, const char *name,
                                 const hvd_tensor_t *t, int wire) {
  if (t->dtype != HVD_FLOAT32 && t->dtype != HVD_FLOAT64)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': HVD_ADASUM needs float32 or float64, not "
                          "%s",
                          kind, name, hvd_dtype_name(t->dtype));
  if (wire != (int)t->dtype)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': HVD_ADASUM combines the tensors as they "
                          "are: no %s wire",
                          kind, name, hvd_dtype_name((hvd_dtype_t)wire));
  return HVD_SUCCESS;
}

static hvd_result_t check_scale(const char *kind, const char *name,
                                const char *which, double f,
                                hvd_dtype_t dtype) {
  if (f == 1.0)
    return HVD_SUCCESS;
  if (!hvd__dtype_is_float(dtype))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': %s %g needs a floating-point dtype, not %s",
                          kind, name, which, f, hvd_dtype_name(dtype));
  if (!isfinite(f))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': %s %g is not finite",
                          kind, name, which, f);
  return HVD_SUCCESS;
}

static hvd_result_t check_rows(const char *kind, const char *name,
                               const hvd_tensor_t *t) {
  if (t->ndim < 1)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': needs at least 1 dimension", kind, name);
  if (!hvd__row_size(t->dtype, t->ndim, t->shape, NULL)) {
    /* 0 rows pass the tensor's size check whatever the others */
    char shape[HVD__SHAPE_STR_MAX];
    hvd__shape_str(t->ndim, t->shape, shape, sizeof shape);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': a row of send shape %s of %s (dimensions "
                          "1..) is more than PTRDIFF_MAX bytes",
                          kind, name, shape, hvd_dtype_name(t->dtype));
  }
  return HVD_SUCCESS;
}

static hvd_result_t check_out(const char *kind, const char *name,
                              const hvd_tensor_t *recv) {
  if (recv == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': recv tensor is NULL",
                          kind, name);
  return HVD_SUCCESS;
}

/* Whether a's and b's bytes intersect (an empty tensor meets nothing). */
static int overlaps(const hvd_tensor_t *a, const hvd_tensor_t *b) {
  uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
  size_t na = hvd__tensor_bytes(a), nb = hvd__tensor_bytes(b);
  return na != 0 && nb != 0 && a0 < b0 + nb && b0 < a0 + na;
}

/* An output that overlaps the input would be written while it is still
 * read (by this rank's fold, or a peer's through shared memory): only
 * the exact in-place form is safe. */
static hvd_result_t check_overlap(const char *k, const char *name,
                                  const hvd_tensor_t *send,
                                  const hvd_tensor_t *recv) {
  if (recv->data != send->data && overlaps(recv, send))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': recv overlaps send without being it (in "
                          "place is recv->data == send->data)",
                          k, name);
  return HVD_SUCCESS;
}

/* The output of the hvd__*_into_async call running on this thread (NULL:
 * hvd allocates the output): the builders hand it to the request. */
static _Thread_local const hvd_tensor_t *given_out;

/* The checks every named collective starts with: name, req, send (whose
 * placement is not asked again when it lies in a given output, checked
 * first: ZeRO's allgathers). */
static hvd_result_t check_common(const char *k, const char *name,
                                 hvd_request_t **req,
                                 const hvd_tensor_t *send) {
  hvd_result_t rc;
  HVD__CHECK(check_name(k, name));
  HVD__CHECK(check_req(k, name, req));
  HVD__CHECK(hvd__check_tensor_in(k, name, "send", send, given_out));
fail:
  return rc;
}

/* ---- building and submitting -------------------------------------------- */

/* The process set of the hvd_ps_* call running on this thread (NULL: the
 * world): the builders below count ranks in it and submit to its engine. */
static _Thread_local const hvd_process_set_t *cur_ps;

/* r's output: the caller's slot for one hvd allocates, or given_out. */
static void set_output(hvd_request_t *r, hvd_tensor_t *recv) {
  if (r == NULL)
    return;
  if (given_out != NULL) {
    r->recv = *given_out;
    r->recv_given = 1;
  } else {
    r->recv_out = recv;
  }
}

static int coll_size(void) {
  return cur_ps != NULL ? hvd_process_set_size(cur_ps) : hvd_size();
}

int hvd__coll_size(void) { return coll_size(); }

int hvd__coll_rank(void) {
  return cur_ps != NULL ? hvd_process_set_rank(cur_ps) : hvd_rank();
}

const hvd_process_set_t *hvd__coll_set(const hvd_process_set_t *ps) {
  const hvd_process_set_t *was = cur_ps;
  cur_ps = ps;
  return was;
}

int hvd__coll_world_rank(int r) {
  return hvd__process_set_world_rank(cur_ps, r);
}

/* 1 while this thread's device data is settled (hvd__device_settled). */
static _Thread_local int settled;

void hvd__device_settled(int on) { settled = on; }

/* Hands n built requests to the world's engine or cur_ps's. */
static hvd_result_t submit_to(const char *fn, hvd_request_t *const *rs, int n) {
  for (int i = 0; i < n; i++) /* ordered after the caller's device work */
    if (rs[i]->desc.device >= 0 && rs[i]->ready == NULL && !settled &&
        hvd__cuda_ready_event(rs[i]->desc.device, &rs[i]->ready) !=
            HVD_SUCCESS) {
      char why[HVD__ERRMSG_MAX];
      snprintf(why, sizeof why, "%s", hvd_last_error());
      return hvd__set_error(HVD_ERR_CUDA,
                            "%s '%s': the ready event on the submitting "
                            "thread's stream (hvd_cuda_set_stream): %s",
                            fn, rs[i]->name, why);
    }
  if (cur_ps == NULL)
    return n == 1 ? hvd__runtime_submit(fn, rs[0])
                  : hvd__runtime_submit_many(fn, rs, n);
  return hvd__runtime_submit_set(fn, hvd__coll_name(rs[0]->desc.coll),
                                 rs[0]->name, cur_ps, rs, n);
}

static hvd_request_t *new_request(const char *name, int coll,
                                  const hvd_tensor_t *t, int op, double pre,
                                  double post, int root) {
  hvd_request_t *r = hvd__request_new(name);
  if (r == NULL)
    return NULL;
  r->desc.coll = coll;
  r->desc.op = op;
  r->desc.prescale = pre;
  r->desc.postscale = post;
  r->desc.root = root;
  r->desc.device = HVD_CPU;
  r->nranks = coll_size();
  if (t != NULL) {
    r->send = *t;
    r->desc.dtype = t->dtype;
    r->desc.device = t->device;
    r->desc.ndim = t->ndim;
    r->desc.wire = t->dtype;
    memcpy(r->desc.shape, t->shape, sizeof t->shape);
  }
  return r;
}

/* The end of every builder: submits r (now) or hands it to the grouped
 * calls (!now), which submit their members together. */
static hvd_result_t submit(const char *fn, hvd_request_t *r,
                           hvd_request_t **req, int now) {
  if (!now) {
    if (r == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: request", fn);
    *req = r;
    return HVD_SUCCESS;
  }
  if (r == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: request", fn);
  hvd_result_t rc = submit_to(fn, &r, 1);
  if (rc != HVD_SUCCESS) {
    hvd__request_free(r);
    return rc;
  }
  *req = r;
  return HVD_SUCCESS;
}

/* The blocking forms: `rc` must be computed (and *r set) before this is
 * called, hence a macro over two statements rather than a function. */
#define WAIT_IF(rc_expr)                                                       \
  do {                                                                         \
    hvd_result_t rc_ = (rc_expr);                                              \
    return rc_ == HVD_SUCCESS ? hvd_wait(r) : rc_;                             \
  } while (0)

#define REQUIRE_INIT(fn)                                                       \
  do {                                                                         \
    if (!hvd_is_initialized())                                                 \
      return hvd__not_initialized(fn);                                         \
  } while (0)

/* ---- allreduce ---------------------------------------------------------- */

static hvd_result_t make_allreduce(const char *fn, const char *name,
                                   const hvd_tensor_t *send, hvd_tensor_t *recv,
                                   hvd_op_t op, double pre, double post,
                                   int wire, hvd_request_t **req, int now) {
  const char *k = "allreduce";
  hvd_result_t rc;
  REQUIRE_INIT(fn);
  HVD__CHECK(check_common(k, name, req, send));
  HVD__CHECK(hvd__check_tensor_in(k, name, "recv", recv, send));
  HVD__CHECK(check_op(k, name, (int)op));
  if (recv->dtype != send->dtype)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': recv dtype %s differs from send dtype %s",
                          k, name, hvd_dtype_name(recv->dtype),
                          hvd_dtype_name(send->dtype));
  if (recv->device != send->device) {
    char a[32], b[32];
    hvd__device_str(recv->device, a, sizeof a);
    hvd__device_str(send->device, b, sizeof b);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': recv is on %s but send is on %s", k, name,
                          a, b);
  }
  if (recv->ndim != send->ndim ||
      memcmp(recv->shape, send->shape,
             (size_t)send->ndim * sizeof *send->shape) != 0) {
    char a[HVD__SHAPE_STR_MAX], b[HVD__SHAPE_STR_MAX];
    hvd__shape_str(recv->ndim, recv->shape, a, sizeof a);
    hvd__shape_str(send->ndim, send->shape, b, sizeof b);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': recv shape %s differs from send shape %s",
                          k, name, a, b);
  }
  HVD__CHECK(check_overlap(k, name, send, recv));
  HVD__CHECK(check_scale(k, name, "prescale", pre, send->dtype));
  HVD__CHECK(check_scale(k, name, "postscale", post, send->dtype));
  if (wire < 0)
    wire = send->dtype;
  if (op == HVD_ADASUM)
    HVD__CHECK(check_adasum(k, name, send, wire));
  if (wire != (int)send->dtype &&
      (send->dtype != HVD_FLOAT32 ||
       (wire != HVD_FLOAT16 && wire != HVD_BFLOAT16)))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': a %s wire needs a float32 tensor and "
                          "float16 or bfloat16 on the wire, not %s",
                          k, name, hvd_dtype_name((hvd_dtype_t)wire),
                          hvd_dtype_name(send->dtype));
  hvd_request_t *r = new_request(name, HVD__ALLREDUCE, send, op, pre, post, 0);
  if (r != NULL) {
    r->recv = *recv;
    r->desc.wire = wire;
  }
  return submit(fn, r, req, now);
fail:
  return rc;
}

static hvd_result_t allreduce(const char *fn, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv,
                              hvd_op_t op, double pre, double post, int wire,
                              hvd_request_t **req) {
  return make_allreduce(fn, name, send, recv, op, pre, post, wire, req, 1);
}

hvd_result_t hvd_allreduce_async(const char *name, const hvd_tensor_t *send,
                                 hvd_tensor_t *recv, hvd_op_t op,
                                 double prescale, double postscale,
                                 hvd_request_t **req) {
  return allreduce(__func__, name, send, recv, op, prescale, postscale, -1,
                   req);
}

hvd_result_t hvd__allreduce_wire_async(const char *name,
                                       const hvd_tensor_t *send,
                                       hvd_tensor_t *recv, hvd_op_t op,
                                       double prescale, double postscale,
                                       hvd_dtype_t wire, hvd_request_t **req) {
  return allreduce("hvd_allreduce_async", name, send, recv, op, prescale,
                   postscale, (int)wire, req);
}

hvd_result_t hvd_allreduce(const char *name, const hvd_tensor_t *send,
                           hvd_tensor_t *recv, hvd_op_t op, double prescale,
                           double postscale) {
  hvd_request_t *r = NULL;
  WAIT_IF(
      allreduce(__func__, name, send, recv, op, prescale, postscale, -1, &r));
}

/* ---- broadcast ---------------------------------------------------------- */

static hvd_result_t broadcast(const char *fn, const char *name, hvd_tensor_t *t,
                              int root, hvd_request_t **req) {
  const char *k = "broadcast";
  hvd_result_t rc;
  REQUIRE_INIT(fn);
  HVD__CHECK(check_name(k, name));
  HVD__CHECK(check_req(k, name, req));
  HVD__CHECK(hvd__check_tensor(k, name, "", t));
  if (root < 0 || root >= coll_size())
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': root %d is out of range for %d ranks", k,
                          name, root, coll_size());
  return submit(fn, new_request(name, HVD__BROADCAST, t, 0, 1, 1, root), req,
                1);
fail:
  return rc;
}

hvd_result_t hvd_broadcast_async(const char *name, hvd_tensor_t *tensor,
                                 int root, hvd_request_t **req) {
  return broadcast(__func__, name, tensor, root, req);
}

hvd_result_t hvd_broadcast(const char *name, hvd_tensor_t *tensor, int root) {
  hvd_request_t *r = NULL;
  WAIT_IF(broadcast(__func__, name, tensor, root, &r));
}

/* ---- allgather ---------------------------------------------------------- */

static hvd_result_t make_allgather(const char *fn, const char *name,
                                   const hvd_tensor_t *send, hvd_tensor_t *recv,
                                   hvd_request_t **req, int now) {
  const char *k = "allgather";
  hvd_result_t rc;
  REQUIRE_INIT(fn);
  HVD__CHECK(check_common(k, name, req, send));
  HVD__CHECK(check_out(k, name, recv));
  HVD__CHECK(check_rows(k, name, send));
  hvd_request_t *r = new_request(name, HVD__ALLGATHER, send, 0, 1, 1, 0);
  set_output(r, recv);
  return submit(fn, r, req, now);
fail:
  return rc;
}

static hvd_result_t allgather(const char *fn, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv,
                              hvd_request_t **req) {
  return make_allgather(fn, name, send, recv, req, 1);
}

hvd_result_t hvd_allgather_async(const char *name, const hvd_tensor_t *send,
                                 hvd_tensor_t *recv, hvd_request_t **req) {
  return allgather(__func__, name, send, recv, req);
}

hvd_result_t hvd_allgather(const char *name, const hvd_tensor_t *send,
                           hvd_tensor_t *recv) {
  hvd_request_t *r = NULL;
  WAIT_IF(allgather(__func__, name, send, recv, &r));
}

/* An output the caller gives: a tensor of send's dtype on send's device
 * (its shape is checked against the result's by the executor). */
static hvd_result_t check_given(const char *k, const char *name,
                                const hvd_tensor_t *send,
                                const hvd_tensor_t *out) {
  hvd_result_t rc;
  HVD__CHECK(hvd__check_tensor(k, name, "out", out));
  if (send != NULL &&
      (out->dtype != send->dtype || out->device != send->device))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': out is %s on device %d but send is %s on "
                          "device %d",
                          k, name, hvd_dtype_name(out->dtype), out->device,
                          hvd_dtype_name(send->dtype), send->device);
fail:
  return rc;
}

hvd_result_t hvd__allgather_into_async(const char *name,
                                       const hvd_tensor_t *send,
                                       const hvd_tensor_t *out,
                                       hvd_request_t **req) {
  REQUIRE_INIT(__func__);
  hvd_result_t rc = check_given("allgather", name, send, out);
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_tensor_t unused;
  given_out = out;
  rc = make_allgather(__func__, name, send, &unused, req, 1);
  given_out = NULL;
  return rc;
}

/* ---- alltoall ----------------------------------------------------------- */

static hvd_result_t alltoall(const char *fn, const char *name,
                             const hvd_tensor_t *send, const int64_t *splits,
                             hvd_tensor_t *recv, int64_t *recv_splits,
                             hvd_request_t **req) {
  const char *k = "alltoall";
  hvd_result_t rc;
  REQUIRE_INIT(fn);
  HVD__CHECK(check_common(k, name, req, send));
  HVD__CHECK(check_out(k, name, recv));
  HVD__CHECK(check_rows(k, name, send));
  int size = coll_size();
  int64_t rows = send->shape[0], sum = 0;
  if (splits == NULL && rows % size != 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': shape[0] %lld does not divide evenly among "
                          "%d ranks; pass splits",
                          k, name, (long long)rows, size);
  for (int i = 0; splits != NULL && i < size; i++) {
    if (splits[i] < 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG, "%s '%s': splits[%d] is %lld",
                            k, name, i, (long long)splits[i]);
    if (__builtin_add_overflow(sum, splits[i], &sum)) /* it used to wrap */
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s '%s': splits sum to more than INT64_MAX but "
                            "shape[0] is %lld",
                            k, name, (long long)rows);
  }
  if (splits != NULL && sum != rows)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': splits sum to %lld but shape[0] is %lld", k,
                          name, (long long)sum, (long long)rows);
  hvd_request_t *r = new_request(name, HVD__ALLTOALL, send, 0, 1, 1, 0);
  if (r != NULL) {
    r->recv_out = recv;
    r->recv_splits_out = recv_splits;
    r->splits = malloc((size_t)size * sizeof *r->splits);
    if (r->splits == NULL) {
      hvd__request_free(r);
      r = NULL;
    } else {
      for (int i = 0; i < size; i++)
        r->splits[i] = splits ? splits[i] : rows / size;
    }
  }
  return submit(fn, r, req, 1);
fail:
  return rc;
}

hvd_result_t hvd_alltoall_async(const char *name, const hvd_tensor_t *send,
                                const int64_t *splits, hvd_tensor_t *recv,
                                int64_t *recv_splits, hvd_request_t **req) {
  return alltoall(__func__, name, send, splits, recv, recv_splits, req);
}

hvd_result_t hvd_alltoall(const char *name, const hvd_tensor_t *send,
                          const int64_t *splits, hvd_tensor_t *recv,
                          int64_t *recv_splits) {
  hvd_request_t *r = NULL;
  WAIT_IF(alltoall(__func__, name, send, splits, recv, recv_splits, &r));
}

/* ---- reducescatter ------------------------------------------------------ */

static hvd_result_t make_reducescatter(const char *fn, const char *name,
                                       const hvd_tensor_t *send,
                                       hvd_tensor_t *recv, hvd_op_t op,
                                       double pre, double post,
                                       hvd_request_t **req, int now) {
  const char *k = "reducescatter";
  hvd_result_t rc;
  REQUIRE_INIT(fn);
  HVD__CHECK(check_common(k, name, req, send));
  HVD__CHECK(check_out(k, name, recv));
  HVD__CHECK(check_rows(k, name, send));
  HVD__CHECK(check_op(k, name, (int)op));
  if (op == HVD_ADASUM)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s '%s': HVD_ADASUM is an allreduce op", k, name);
  HVD__CHECK(check_scale(k, name, "prescale", pre, send->dtype));
  HVD__CHECK(check_scale(k, name, "postscale", post, send->dtype));
  hvd_request_t *r =
      new_request(name, HVD__REDUCESCATTER, send, op, pre, post, 0);
  set_output(r, recv);
  return submit(fn, r, req, now);
fail:
  return rc;
}

hvd_result_t hvd__reducescatter_into_async(const char *name,
                                           const hvd_tensor_t *send,
                                           const hvd_tensor_t *out, hvd_op_t op,
                                           double pre, double post,
                                           hvd_request_t **req) {
  REQUIRE_INIT(__func__);
  hvd_result_t rc = check_given("reducescatter", name, send, out);
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_tensor_t unused;
  given_out = out;
  rc = make_reducescatter(__func__, name, send, &unused, op, pre, post, req, 1);
  given_out = NULL;
  return rc;
}

static hvd_result_t reducescatter(const char *fn, const char *name,
                                  const hvd_tensor_t *send, hvd_tensor_t *recv,
                                  hvd_op_t op, double pre, double post,
                                  hvd_request_t **req) {
  return make_reducescatter(fn, name, send, recv, op, pre, post, req, 1);
}

hvd_result_t hvd_reducescatter_async(const char *name, const hvd_tensor_t *send,
                                     hvd_tensor_t *recv, hvd_op_t op,
                                     double prescale, double postscale,
                                     hvd_request_t **req) {
  return reducescatter(__func__, name, send, recv, op, prescale, postscale,
                       req);
}

hvd_result_t hvd_reducescatter(const char *name, const hvd_tensor_t *send,
                               hvd_tensor_t *recv, hvd_op_t op, double prescale,
                               double postscale) {
  hvd_request_t *r = NULL;
  WAIT_IF(
      reducescatter(__func__, name, send, recv, op, prescale, postscale, &r));
}

/* ---- barrier and join --------------------------------------------------- */

static hvd_result_t barrier(const char *fn, hvd_request_t **req) {
  REQUIRE_INIT(fn);
  if (req == NULL)
    return check_req("barrier", NULL, req);
  return submit(fn,
                new_request(HVD__BARRIER_NAME, HVD__BARRIER, NULL, 0, 1, 1, 0),
                req, 1);
}

hvd_result_t hvd_barrier_async(hvd_request_t **req) {
  return barrier(__func__, req);
}

hvd_result_t hvd_barrier(void) {
  hvd_request_t *r = NULL;
  WAIT_IF(barrier(__func__, &r));
}

static hvd_result_t join(const char *fn, int *last_rank, hvd_request_t **req) {
  REQUIRE_INIT(fn);
  if (req == NULL)
    return check_req("join", NULL, req);
  hvd_request_t *r = new_request(HVD__JOIN_NAME, HVD__JOIN, NULL, 0, 1, 1, 0);
  if (r != NULL)
    r->last_rank_out = last_rank;
  return submit(fn, r, req, 1);
}

hvd_result_t hvd_join_async(int *last_rank, hvd_request_t **req) {
  return join(__func__, last_rank, req);
}

hvd_result_t hvd_join(int *last_rank) {
  hvd_request_t *r = NULL;
  WAIT_IF(join(__func__, last_rank, &r));
}

/* ---- grouped collectives ------------------------------------------------ */

/* FNV-1a over the members' names in order, each with its terminator: the
 * group's identity, which every rank computes alike. */
static uint64_t group_hash(int n, const char *const *names) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++)
    for (const unsigned char *p = (const unsigned char *)names[i];; p++) {
      h = (h ^ *p) * 1099511628211ull;
      if (*p == '\0')
        break;
    }
  return h;
}

enum { G_ALLREDUCE, G_ALLGATHER, G_REDUCESCATTER };

/* A byte range of a grouped allreduce: tensor i's send, its recv, or
 * both (in place). */
typedef struct span {
  uintptr_t lo, hi;
  int i, send, recv;
} span_t;

static int span_cmp(const void *a, const void *b) {
  const span_t *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* No member's recv meets another member's send (sends may share memory,
 * and so may recvs): sorted by start, a recv must begin past every send
 * before it, a send past every recv before it. */
static hvd_result_t group_overlap(const char *fn, int n,
                                  const hvd_tensor_t *sends,
                                  const hvd_tensor_t *recvs) {
  span_t *sp = malloc((size_t)n * 2 * sizeof *sp), in = {0}, out = {0};
  int m = 0;
  if (sp == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: %d tensors", fn, n);
  for (int i = 0; i < n; i++) {
    int same = sends[i].data == recvs[i].data;
    for (int r = same; r < 2; r++) {
      const hvd_tensor_t *t = r ? &recvs[i] : &sends[i];
      size_t bytes = hvd__tensor_bytes(t);
      if (bytes != 0)
        sp[m++] = (span_t){(uintptr_t)t->data, (uintptr_t)t->data + bytes, i,
                           !r || same, r};
    }
  }
  qsort(sp, (size_t)m, sizeof *sp, span_cmp);
  for (int k = 0; k < m; k++) {
    span_t c = sp[k];
    int hit_in = c.recv && in.hi > c.lo, hit_out = c.send && out.hi > c.lo;
    if (hit_in || hit_out) {
      int si = hit_in ? in.i : c.i, ri = hit_in ? c.i : out.i;
      free(sp);
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: tensor %d's %s overlaps tensor %d's %s", fn,
                            si < ri ? si : ri, si < ri ? "send" : "recv",
                            si < ri ? ri : si, si < ri ? "recv" : "send");
    }
    if (c.send && c.hi > in.hi)
      in = c;
    if (c.recv && c.hi > out.hi)
      out = c;
  }
  free(sp);
  return HVD_SUCCESS;
}

/* Builds every member (nothing submitted if one is invalid), marks them
 * as one group, and submits them together. */
static hvd_result_t grouped(const char *fn, int kind, int n,
                            const char *const *names, const hvd_tensor_t *sends,
                            hvd_tensor_t *recvs, hvd_op_t op, double pre,
                            double post, int wire, hvd_request_t **reqs) {
  hvd_result_t rc = HVD_SUCCESS;
  REQUIRE_INIT(fn);
  if (n < 1 || n > HVD__GROUP_MAX)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: %d tensors; a group has at least 1 and at "
                          "most %d",
                          fn, n, HVD__GROUP_MAX);
  const char *null = names == NULL   ? "names"
                     : sends == NULL ? "sends"
                     : recvs == NULL ? "recvs"
                     : reqs == NULL  ? "reqs"
                                     : NULL;
  if (null != NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %s is NULL", fn, null);
  hvd_request_t **rs = calloc((size_t)n, sizeof *rs);
  if (rs == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: %d requests", fn, n);
  int built = 0;
  for (; built < n && rc == HVD_SUCCESS; built++) {
    const hvd_tensor_t *s = &sends[built];
    hvd_tensor_t *r = &recvs[built];
    const char *name = names[built];
    if (kind == G_ALLREDUCE)
      rc = make_allreduce(fn, name, s, r, op, pre, post, wire, &rs[built], 0);
    else if (kind == G_ALLGATHER)
      rc = make_allgather(fn, name, s, r, &rs[built], 0);
    else
      rc = make_reducescatter(fn, name, s, r, op, pre, post, &rs[built], 0);
    if (rc != HVD_SUCCESS) {
      char msg[HVD__ERRMSG_MAX];
      snprintf(msg, sizeof msg, "%s: tensor %d: %s", fn, built,
               hvd_last_error());
      hvd__set_error_msg(rc, msg);
      break;
    }
  }
  if (rc == HVD_SUCCESS && kind == G_ALLREDUCE)
    rc = group_overlap(fn, n, sends, recvs);
  for (int i = 0; i < n && rc == HVD_SUCCESS; i++)
    for (int j = i + 1; j < n && rc == HVD_SUCCESS; j++)
      if (strcmp(names[i], names[j]) == 0)
        rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: tensors %d and %d are both named '%s'", fn, i,
                            j, names[i]);
  if (rc == HVD_SUCCESS) {
    uint64_t id = group_hash(n, names);
    for (int i = 0; i < n; i++) {
      rs[i]->desc.group_n = n;
      rs[i]->desc.group_i = i;
      rs[i]->desc.group_id = id;
    }
    rc = submit_to(fn, rs, n);
    int bad = rc != HVD_SUCCESS ? hvd__engine_refused() : -1;
    if (bad >= 0) { /* a member's own refusal: "<call>: tensor i: ..." */
      char msg[HVD__ERRMSG_MAX];
      snprintf(msg, sizeof msg, "%s: tensor %d: %s", fn, bad, hvd_last_error());
      hvd__set_error_msg(rc, msg);
    }
  }
  if (rc == HVD_SUCCESS)
    memcpy(reqs, rs, (size_t)n * sizeof *rs);
  else
    for (int i = 0; i < n; i++)
      hvd__request_free(rs[i]);
  free(rs);
  return rc;
}

/* Waits for all n (every one, even after a failure); the first failure's
 * code and message. */
static hvd_result_t wait_all(int n, hvd_request_t **rs) {
  hvd_result_t first = HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX];
  for (int i = 0; i < n; i++) {
    hvd_result_t rc = hvd_wait(rs[i]);
    if (rc != HVD_SUCCESS && first == HVD_SUCCESS) {
      first = rc;
      snprintf(msg, sizeof msg, "%s", hvd_last_error());
    }
  }
  return first == HVD_SUCCESS ? first : hvd__set_error_msg(first, msg);
}

/* The blocking forms: submit into a request array of their own, then
 * wait for all. */
static hvd_result_t grouped_wait(const char *fn, int kind, int n,
                                 const char *const *names,
                                 const hvd_tensor_t *sends, hvd_tensor_t *recvs,
                                 hvd_op_t op, double pre, double post) {
  hvd_request_t **rs = calloc(n > 0 ? (size_t)n : 1, sizeof *rs);
  if (rs == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: %d requests", fn, n);
  hvd_result_t rc =
      grouped(fn, kind, n, names, sends, recvs, op, pre, post, -1, rs);
  if (rc == HVD_SUCCESS)
    rc = wait_all(n, rs);
  free(rs);
  return rc;
}

hvd_result_t hvd_grouped_allreduce_async(int n, const char *const *names,
                                         const hvd_tensor_t *sends,
                                         hvd_tensor_t *recvs, hvd_op_t op,
                                         double prescale, double postscale,
                                         hvd_request_t **reqs) {
  return grouped(__func__, G_ALLREDUCE, n, names, sends, recvs, op, prescale,
                 postscale, -1, reqs);
}

hvd_result_t hvd__grouped_allreduce_wire_async(
    int n, const char *const *names, const hvd_tensor_t *sends,
    hvd_tensor_t *recvs, hvd_op_t op, double prescale, double postscale,
    hvd_dtype_t wire, hvd_request_t **reqs) {
  return grouped("hvd_grouped_allreduce_async", G_ALLREDUCE, n, names, sends,
                 recvs, op, prescale, postscale, (int)wire, reqs);
}

hvd_result_t hvd_grouped_allreduce(int n, const char *const *names,
                                   const hvd_tensor_t *sends,
                                   hvd_tensor_t *recvs, hvd_op_t op,
                                   double prescale, double postscale) {
  return grouped_wait(__func__, G_ALLREDUCE, n, names, sends, recvs, op,
                      prescale, postscale);
}

hvd_result_t hvd_grouped_allgather_async(int n, const char *const *names,
                                         const hvd_tensor_t *sends,
                                         hvd_tensor_t *recvs,
                                         hvd_request_t **reqs) {
  return grouped(__func__, G_ALLGATHER, n, names, sends, recvs, HVD_SUM, 1, 1,
                 -1, reqs);
}

hvd_result_t hvd_grouped_allgather(int n, const char *const *names,
                                   const hvd_tensor_t *sends,
                                   hvd_tensor_t *recvs) {
  return grouped_wait(__func__, G_ALLGATHER, n, names, sends, recvs, HVD_SUM, 1,
                      1);
}

hvd_result_t hvd_grouped_reducescatter_async(int n, const char *const *names,
                                             const hvd_tensor_t *sends,
                                             hvd_tensor_t *recvs, hvd_op_t op,
                                             double prescale, double postscale,
                                             hvd_request_t **reqs) {
  return grouped(__func__, G_REDUCESCATTER, n, names, sends, recvs, op,
                 prescale, postscale, -1, reqs);
}

hvd_result_t hvd_grouped_reducescatter(int n, const char *const *names,
                                       const hvd_tensor_t *sends,
                                       hvd_tensor_t *recvs, hvd_op_t op,
                                       double prescale, double postscale) {
  return grouped_wait(__func__, G_REDUCESCATTER, n, names, sends, recvs, op,
                      prescale, postscale);
}

/* ---- on a process set ---------------------------------------------------- */

/* A rank outside ps is refused before the call's own checks, which would
 * count ranks in a set it is not in ("rank 2 is not in process set 1"
 * rather than a root or splits out of range); a name the call refuses
 * anyway ("<kind>: name is NULL or empty") is left to it. A barrier's
 * name is hvd's own. */
static hvd_result_t member_first(const char *fn, const char *kind,
                                 const char *name,
                                 const hvd_process_set_t *ps) {
  if (strcmp(kind, "barrier") != 0 && (name == NULL || name[0] == '\0'))
    return HVD_SUCCESS;
  return hvd__runtime_set_check(fn, kind, name, ps);
}

/* Runs `call` (a world entry point) with cur_ps = ps on this thread, and
 * puts back the set it was on (hvd__coll_set); errors before it name the
 * public call (__func__), and a rank outside ps is refused first. */
#define ON_SET(ps, kind, name, call)                                           \
  do {                                                                         \
    if (!hvd_is_initialized()) /* forked too: the public call's name */        \
      return hvd__not_initialized(__func__);                                   \
    if ((ps) == NULL)                                                          \
      return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: ps is NULL", __func__);  \
    hvd_result_t rc_ = member_first(__func__, kind, name, ps);                 \
    if (rc_ != HVD_SUCCESS)                                                    \
      return rc_;                                                              \
    const hvd_process_set_t *was_ = hvd__coll_set(ps);                         \
    rc_ = (call);                                                              \
    hvd__coll_set(was_);                                                       \
    return rc_;                                                                \
  } while (0)

/* The first member's name of a grouped call, if it has one. */
static const char *first_name(int n, const char *const *names) {
  return n > 0 && names != NULL ? names[0] : NULL;
}

hvd_result_t hvd_ps_allreduce_async(const hvd_process_set_t *ps,
                                    const char *name, const hvd_tensor_t *send,
                                    hvd_tensor_t *recv, hvd_op_t op,
                                    double prescale, double postscale,
                                    hvd_request_t **req) {
  ON_SET(
      ps, "allreduce", name,
      allreduce(__func__, name, send, recv, op, prescale, postscale, -1, req));
}

hvd_result_t hvd_ps_allreduce(const hvd_process_set_t *ps, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv,
                              hvd_op_t op, double prescale, double postscale) {
  ON_SET(ps, "allreduce", name,
         hvd_allreduce(name, send, recv, op, prescale, postscale));
}

hvd_result_t hvd_ps_broadcast_async(const hvd_process_set_t *ps,
                                    const char *name, hvd_tensor_t *tensor,
                                    int root, hvd_request_t **req) {
  ON_SET(ps, "broadcast", name, broadcast(__func__, name, tensor, root, req));
}

hvd_result_t hvd_ps_broadcast(const hvd_process_set_t *ps, const char *name,
                              hvd_tensor_t *tensor, int root) {
  ON_SET(ps, "broadcast", name, hvd_broadcast(name, tensor, root));
}

hvd_result_t hvd_ps_allgather_async(const hvd_process_set_t *ps,
                                    const char *name, const hvd_tensor_t *send,
                                    hvd_tensor_t *recv, hvd_request_t **req) {
  ON_SET(ps, "allgather", name, allgather(__func__, name, send, recv, req));
}

hvd_result_t hvd_ps_allgather(const hvd_process_set_t *ps, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv) {
  ON_SET(ps, "allgather", name, hvd_allgather(name, send, recv));
}

hvd_result_t hvd_ps_alltoall_async(const hvd_process_set_t *ps,
                                   const char *name, const hvd_tensor_t *send,
                                   const int64_t *splits, hvd_tensor_t *recv,
                                   int64_t *recv_splits, hvd_request_t **req) {
  ON_SET(ps, "alltoall", name,
         alltoall(__func__, name, send, splits, recv, recv_splits, req));
}

hvd_result_t hvd_ps_alltoall(const hvd_process_set_t *ps, const char *name,
                             const hvd_tensor_t *send, const int64_t *splits,
                             hvd_tensor_t *recv, int64_t *recv_splits) {
  ON_SET(ps, "alltoall", name,
         hvd_alltoall(name, send, splits, recv, recv_splits));
}

hvd_result_t hvd_ps_reducescatter_async(const hvd_process_set_t *ps,
                                        const char *name,
                                        const hvd_tensor_t *send,
                                        hvd_tensor_t *recv, hvd_op_t op,
                                        double prescale, double postscale,
                                        hvd_request_t **req) {
  ON_SET(
      ps, "reducescatter", name,
      reducescatter(__func__, name, send, recv, op, prescale, postscale, req));
}

hvd_result_t hvd_ps_reducescatter(const hvd_process_set_t *ps, const char *name,
                                  const hvd_tensor_t *send, hvd_tensor_t *recv,
                                  hvd_op_t op, double prescale,
                                  double postscale) {
  ON_SET(ps, "reducescatter", name,
         hvd_reducescatter(name, send, recv, op, prescale, postscale));
}

hvd_result_t hvd_ps_barrier(const hvd_process_set_t *ps) {
  ON_SET(ps, "barrier", NULL, hvd_barrier());
}

/* Grouped collectives on a set: the members go to the set's engine
 * together (submit_to), so they fuse and complete as in the world. */
hvd_result_t hvd_ps_grouped_allreduce_async(const hvd_process_set_t *ps, int n,
                                            const char *const *names,
                                            const hvd_tensor_t *sends,
                                            hvd_tensor_t *recvs, hvd_op_t op,
                                            double prescale, double postscale,
                                            hvd_request_t **reqs) {
  ON_SET(ps, "allreduce", first_name(n, names),
         hvd_grouped_allreduce_async(n, names, sends, recvs, op, prescale,
                                     postscale, reqs));
}

hvd_result_t hvd_ps_grouped_allreduce(const hvd_process_set_t *ps, int n,
                                      const char *const *names,
                                      const hvd_tensor_t *sends,
                                      hvd_tensor_t *recvs, hvd_op_t op,
                                      double prescale, double postscale) {
  ON_SET(
      ps, "allreduce", first_name(n, names),
      hvd_grouped_allreduce(n, names, sends, recvs, op, prescale, postscale));
}

hvd_result_t hvd_ps_grouped_allgather_async(const hvd_process_set_t *ps, int n,
                                            const char *const *names,
                                            const hvd_tensor_t *sends,
                                            hvd_tensor_t *recvs,
                                            hvd_request_t **reqs) {
  ON_SET(ps, "allgather", first_name(n, names),
         hvd_grouped_allgather_async(n, names, sends, recvs, reqs));
}

hvd_result_t hvd_ps_grouped_allgather(const hvd_process_set_t *ps, int n,
                                      const char *const *names,
                                      const hvd_tensor_t *sends,
                                      hvd_tensor_t *recvs) {
  ON_SET(ps, "allgather", first_name(n, names),
         hvd_grouped_allgather(n, names, sends, recvs));
}

hvd_result_t hvd_ps_grouped_reducescatter_async(
    const hvd_process_set_t *ps, int n, const char *const *names,
    const hvd_tensor_t *sends, hvd_tensor_t *recvs, hvd_op_t op,
    double prescale, double postscale, hvd_request_t **reqs) {
  ON_SET(ps, "reducescatter", first_name(n, names),
         hvd_grouped_reducescatter_async(n, names, sends, recvs, op, prescale,
                                         postscale, reqs));
}

hvd_result_t hvd_ps_grouped_reducescatter(const hvd_process_set_t *ps, int n,
                                          const char *const *names,
                                          const hvd_tensor_t *sends,
                                          hvd_tensor_t *recvs, hvd_op_t op,
                                          double prescale, double postscale) {
  ON_SET(ps, "reducescatter", first_name(n, names),
         hvd_grouped_reducescatter(n, names, sends, recvs, op, prescale,
                                   postscale));
}

/* Byte objects on a set: membership checked first (ON_SET), so that an
 * outsider's error names the call and the object, not the inner
 * collectives. */
hvd_result_t hvd_ps_broadcast_object(const hvd_process_set_t *ps,
                                     const char *name, const void *data,
                                     size_t len, int root, void **out,
                                     size_t *out_len) {
  ON_SET(ps, "hvd_ps_broadcast_object", name,
         hvd_broadcast_object(name, data, len, root, out, out_len));
}

hvd_result_t hvd_ps_allgather_object(const hvd_process_set_t *ps,
                                     const char *name, const void *data,
                                     size_t len, void **out, size_t *lens) {
  ON_SET(ps, "hvd_ps_allgather_object", name,
         hvd_allgather_object(name, data, len, out, lens));
}
