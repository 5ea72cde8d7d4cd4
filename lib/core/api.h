/*
 * api.h - what lib/core exports to the layer above it (lib/optim) besides
 * the public API of hvd.h. lib/optim includes no other header of core; the
 * layering check (t/layers.sh) allows it only the hvd__ names declared here.
 */
#ifndef HVD_CORE_API_H
#define HVD_CORE_API_H

#include "internal.h"

/* hvd_allreduce_async with a wire dtype: float32 tensors are reduced as
 * float16 or bfloat16 (wire = HVD_FLOAT16 / HVD_BFLOAT16), cast inside
 * the fusion copies (and back); wire == send->dtype is a plain allreduce.
 * Ranks must agree on the wire dtype (a mismatch names it). */
hvd_result_t hvd__allreduce_wire_async(const char *name,
                                       const hvd_tensor_t *send,
                                       hvd_tensor_t *recv, hvd_op_t op,
                                       double prescale, double postscale,
                                       hvd_dtype_t wire, hvd_request_t **req);
/* hvd_grouped_allreduce_async with a wire dtype for every member (each a
 * float32 tensor), as hvd__allreduce_wire_async's. */
hvd_result_t hvd__grouped_allreduce_wire_async(
    int n, const char *const *names, const hvd_tensor_t *sends,
    hvd_tensor_t *recvs, hvd_op_t op, double prescale, double postscale,
    hvd_dtype_t wire, hvd_request_t **reqs);

/* hvd_allgather_async and hvd_reducescatter_async writing the result into
 * memory the caller gives: *out (send's dtype and device; its shape must
 * be the result's, else the request fails with "<coll> '<name>': the
 * output given has shape ... but the result has ..."). Nothing is
 * allocated, and out stays the caller's, also on failure. An allgather
 * whose send is this rank's rows inside out (where they belong) runs in
 * place. ZeRO-1 (optim/zero.c) gathers parameters and scatters gradients
 * this way, without an allocation per parameter. */
hvd_result_t hvd__allgather_into_async(const char *name,
                                       const hvd_tensor_t *send,
                                       const hvd_tensor_t *out,
                                       hvd_request_t **req);
hvd_result_t hvd__reducescatter_into_async(const char *name,
                                           const hvd_tensor_t *send,
                                           const hvd_tensor_t *out, hvd_op_t op,
                                           double pre, double post,
                                           hvd_request_t **req);

/* on = 1: this thread's next device submissions read data that the host
 * has already seen complete on the device (it synchronised the stream
 * that wrote it), so they get no ready event (hvd.h, "Device ordering")
 * and hvd's stream waits for nothing: a cudaEventRecord and a
 * cudaStreamWaitEvent less per tensor. on = 0 (the default) ends it.
 * ZeRO-1's allgather of the values after its synchronised update. */
void hvd__device_settled(int on);

/* HVD_ERR_NOT_INITIALIZED with "<fn>: hvd_init() has not been called". */
hvd_result_t hvd__not_initialized(const char *fn);

/* This rank and the number of ranks of the collective being built on this
 * thread: the world's, or (inside an hvd_ps_* call) the set's; the rank
 * is -1 outside the set. */
int hvd__coll_rank(void);
int hvd__coll_size(void);

/* Puts the collectives this thread builds from now on (the world's
 * entry points: hvd_allreduce_async, ...) on process set ps, NULL: the
 * world; returns the set they were on, for the caller to put back. An
 * hvd_ps_* call inside runs on its own set and puts this one back. The
 * distributed optimizer runs each of its calls on its process_set so
 * (optim/optimizer.h, HVD__ON_SET). */
const hvd_process_set_t *hvd__coll_set(const hvd_process_set_t *ps);
/* The world rank of rank r of the collectives' current set (r itself on
 * the world; -1 out of range): for messages, which name world ranks. */
int hvd__coll_world_rank(int r);

/* The world rank of ps's rank r (NULL: the world's, r itself; -1 out of
 * range), and whether ps has world rank w (1 for NULL). */
int hvd__process_set_world_rank(const hvd_process_set_t *ps, int r);
int hvd__process_set_has(const hvd_process_set_t *ps, int w);
/* This rank's live handle of the set whose id is id (hvd_process_set_id),
 * or NULL once it was destroyed (or hvd shut down): for what outlives a
 * handle, as a background checkpoint's request does. Ids are never
 * reused within a process. */
const hvd_process_set_t *hvd__process_set_find(int id);

/* HVD_CHECKPOINT_PIECE, rounded down to a multiple of 16 (hvd_init must
 * have succeeded). */
size_t hvd__checkpoint_piece(void);

#endif /* HVD_CORE_API_H */
