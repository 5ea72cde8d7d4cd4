/*
 * gpu_ops.h - what the two device executors (nccl_ops.c, staged_ops.c)
 * share: the rank's GPU and hvd's own stream on it, waiting for that
 * stream without holding a core, device scratch and span arrays for the
 * batched kernels, outputs and joined-rank stubs in device memory.
 *
 * Only in builds with CUDA (HVD_HAVE_CUDA); needs config.h first. Engine
 * thread only (an executor's state belongs to it), except hvd__gpu_close.
 *
 * Ordering with the caller's work: hvd's stream is cudaStreamNonBlocking
 * and, in hvd__gpu_enter, waits (cudaStreamWaitEvent) for each request's
 * ready event, recorded at submission on the submitting thread's stream
 * (base/device_order.c). Every collective ends by recording an event on
 * hvd's stream; the engine completes its requests once the host has seen
 * that event (waiting for it at once, or later: asynchronous completion,
 * up to HVD__GPU_SLOTS groups in flight), so when hvd_wait returns the
 * results are complete and visible to every stream of the device.
 */
#ifndef HVD_OPS_GPU_OPS_H
#define HVD_OPS_GPU_OPS_H

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "base/device.h"
#include "ops/cuda_kernels.h"
#include "ops/executor.h"

/* Groups one device executor keeps in flight (HVD__GPU_SLOTS at most). */
#define HVD__GPU_SLOTS 4

/* One group's own: what must not change until the device has run it. */
typedef struct hvd__gpu_slot {
  cudaEvent_t done;         /* recorded after the group's work */
  hvd__cuda_span_t *spans;  /* its span arrays, built here (pinned host: */
  hvd__cuda_span_t *dspans; /* the upload reads them when the stream gets */
  int span_cap;             /* there) and uploaded here (device) */
  double launched;          /* hvd__now() when the group was enqueued */
  int failed;               /* in flight when its communicator was aborted */
  int64_t timed;            /* its count in g->timed (HVD_GPU_TIMING); -1 */
} hvd__gpu_slot_t;

/* HVD_GPU_TIMING=1 (gpu_timing.c): the groups that ended and are not yet
 * accounted, by count: every group in flight and one that was waited for
 * (a synchronous group may end while HVD__GPU_SLOTS are in flight). */
#define HVD__GPU_TIMED (HVD__GPU_SLOTS + 1)

/* One group's timing events on hvd's stream, and its requests' ready
 * events (theirs: valid until the requests complete, after the group is
 * accounted). */
typedef struct hvd__gpu_timed {
  cudaEvent_t start; /* after the waits for the ready events */
  cudaEvent_t end;   /* just before the group's `done` */
  cudaEvent_t *ready;
  int nready, ready_cap;
  int state;   /* 0: running; 1: ran; 2: failed (not accounted) */
  int restart; /* a group before it was not timed: no idle, no lag */
} hvd__gpu_timed_t;

typedef struct hvd__gpu {
  int dev;             /* where everything below lives; -1: not yet */
  cudaStream_t stream; /* hvd's stream (non-blocking, greatest priority) */
  /* Groups in flight, in launch order: slot[head], slot[head + 1] ...
   * (`flying` of them, modulo HVD__GPU_SLOTS). cur is the next group's,
   * slot[(head + flying) % HVD__GPU_SLOTS]: not always the same slot on
   * every rank (a joined rank's groups, and one whose flight record could
   * not be allocated, are waited for at once and leave cur where it was),
   * so nothing that decides an MPI step may depend on it. */
  hvd__gpu_slot_t slot[HVD__GPU_SLOTS];
  int head, flying;
  hvd__gpu_slot_t *cur;
  /* device scratch (the fusion buffer, padded blocks), shared by the
   * groups: they run in order on the one stream */
  void *buf;
  size_t buf_cap;
  /* before any allocation or free: every group in flight completes (the
   * engine's hvd__exec_env_t quiesce); NULL: nothing to wait for */
  void (*quiesce)(void *ctx);
  void *quiesce_ctx;
  /* HVD_GPU_TIMING=1: group n's timing is timed[n % HVD__GPU_TIMED];
   * t_next is the next group to end, t_acct the next to account (in
   * launch order), t_open whether timed[t_next] has started; last_end is
   * the end event of the group accounted last (t_prev: it is usable) */
  int timing;
  hvd__gpu_timed_t timed[HVD__GPU_TIMED];
  int64_t t_next, t_acct;
  int t_open, t_prev, t_gap;
  cudaEvent_t last_end;
} hvd__gpu_t;

/* A zeroed hvd__gpu_t with dev -1, quiescing through env's hook. */
void hvd__gpu_init(hvd__gpu_t *g, const hvd__exec_env_t *env);

/* Before a collective: makes the work's device current on this thread
 * (the device of its first real tensor; a stub-only group uses the device
 * already in use, else hvd__cuda_home_device()) and creates the stream and
 * event the first time. Every tensor of a rank must be on one device for
 * the life of hvd: another one fails with HVD_ERR_INVALID_ARG ("<who>:
 * tensor 'n' is on cuda:1 but hvd's GPU resources are on cuda:0"), which
 * with HVD_NO_BIND=1 means the caller changed its current device. */
hvd_result_t hvd__gpu_enter(hvd__gpu_t *g, const hvd__work_t *w,
                            const char *who);

/* Called between polls of hvd__gpu_wait with the seconds waited so far;
 * a failure ends the wait with it. */
typedef hvd_result_t (*hvd__gpu_poll_fn)(void *ctx, double waited_s);

/* Records g->cur's event on hvd's stream and waits for it: cudaEventQuery
 * polled with hvd__mpi_wait's policy (hvd__wait_backoff), poll (may be
 * NULL) called after each unsuccessful query. A CUDA error is
 * HVD_ERR_CUDA "<what>: ...". The group ends here (HVD_GPU_TIMING). */
hvd_result_t hvd__gpu_wait(hvd__gpu_t *g, const char *what,
                           hvd__gpu_poll_fn poll, void *ctx);
/* The same within a group (the host-staged executor's copies in): the
 * group goes on after it. */
hvd_result_t hvd__gpu_sync(hvd__gpu_t *g, const char *what);

/* Asynchronous completion: the group just enqueued stays in flight in
 * g->cur (its event recorded), and cur moves on. The caller (the engine)
 * keeps fewer than HVD__GPU_SLOTS in flight before enqueueing. */
hvd_result_t hvd__gpu_launch(hvd__gpu_t *g);
/* The oldest group in flight (NULL: none). */
hvd__gpu_slot_t *hvd__gpu_oldest(hvd__gpu_t *g);
/* Whether the oldest group's work has run (*ran; with `wait`, until it
 * has): the failure of a CUDA query ("<what>: ...") or of poll, called
 * with the seconds since its launch. */
hvd_result_t hvd__gpu_query(hvd__gpu_t *g, int wait, const char *what,
                            hvd__gpu_poll_fn poll, void *ctx, int *ran);
/* The oldest group is over: its slot is free. */
void hvd__gpu_retire(hvd__gpu_t *g);
/* Every group in flight that has not run yet is marked failed (before
 * its communicator is aborted: the abort ends its kernels early). */
void hvd__gpu_mark_failed(hvd__gpu_t *g);

/* Every group in flight, of every communicator, completes (g->quiesce):
 * until then the device may be mid-collective, and cudaMalloc, cudaFree
 * or a new communicator's setup would wait for it, or deadlock. */
void hvd__gpu_quiesce(hvd__gpu_t *g);

/* g->cur's span arrays hold at least n spans (quiesced first when they
 * grow). */
hvd_result_t hvd__gpu_spans(hvd__gpu_t *g, int n);
/* Copies g->cur's spans[0..n) to its dspans on hvd's stream. */
hvd_result_t hvd__gpu_upload_spans(hvd__gpu_t *g, int n);
/* g->buf holds at least n bytes; when it grows, every group in flight
 * completes first, then the old buffer is freed. */
hvd_result_t hvd__gpu_buffer(hvd__gpu_t *g, size_t n);

/* 1 when hvd__gpu_buffer(buf_bytes) or hvd__gpu_spans(spans) would
 * allocate. Not the same answer on every rank (the span arrays are cur's,
 * and cur may differ: above): with peers, the NCCL executor agrees
 * whether or not this says 1; only at one rank does it decide alone. */
int hvd__gpu_grows(const hvd__gpu_t *g, size_t buf_bytes, int spans);
/* Drops the buffer and every slot's span arrays (quiesced first), so that
 * after a failed allocation every rank grows the same way again. */
void hvd__gpu_release(hvd__gpu_t *g);

/* r's output (as hvd__alloc_output): dtype from r->desc, this shape, in
 * device memory on g->dev (quiesced first); hvd_tensor_free releases
 * it. */
hvd_result_t hvd__gpu_alloc_output(hvd__gpu_t *g, hvd_request_t *r, int ndim,
                                   const int64_t *shape);

/* Both device executors' stub_alloc / stub_free (see executor.h): n
 * elements of the op's identity in device memory on the rank's GPU. Their
 * state must begin with its hvd__gpu_t. */
hvd_result_t hvd__gpu_stub_alloc(void *state, const hvd__exec_env_t *env,
                                 hvd_request_t *r);
void hvd__gpu_stub_free(void *state, hvd_request_t *r);

/* The timeline's span of one request (not for stubs). */
void hvd__gpu_trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                    const char *phase, double t0, double t1);

/* Releases everything (any thread): waits for hvd's stream first. */
void hvd__gpu_close(hvd__gpu_t *g);

/* ---- HVD_GPU_TIMING=1 (gpu_timing.c): the idle time between groups ---
 *
 * Each group gets two timing events on hvd's stream: `start`, recorded in
 * hvd__gpu_enter after the waits for its requests' ready events (so it
 * fires when the inputs are ready and the stream has reached the group),
 * and `end`, recorded just before the group's `done`. Once `done` has
 * fired the group is accounted, in launch order, into the process's
 * totals (hvd__gpu_timing_totals, executor.h): busy = end - start; idle =
 * start - the previous group's end; lag = the part of idle after its
 * last input was ready (start - latest ready, at most idle), hvd's own
 * delay (negotiation, fusion, launch). The first group of a stream, and
 * one after a group that failed or went untimed, counts busy only. Engine
 * thread only, like the rest of hvd__gpu_t. Without g->timing every call
 * does nothing. */

/* Creates the timing events (with the stream). */
hvd_result_t hvd__gpu_timing_open(hvd__gpu_t *g);
/* Destroys them and frees the ready lists (hvd__gpu_close). */
void hvd__gpu_timing_close(hvd__gpu_t *g);
/* After the waits for w's ready events: group t_next starts (w NULL: no
 * group, a stub's copy: whatever had started is dropped). */
hvd_result_t hvd__gpu_timing_start(hvd__gpu_t *g, const hvd__work_t *w);
/* Before `done` is recorded: the group started ends; its count, or -1. */
hvd_result_t hvd__gpu_timing_end(hvd__gpu_t *g, int64_t *timed);
/* Group `timed` (-1: none) is over: its done event fired (ran), or it
 * failed; the groups over so far are accounted in launch order. */
void hvd__gpu_timing_over(hvd__gpu_t *g, int64_t timed, int ran);

#endif /* HVD_HAVE_CUDA */

#endif /* HVD_OPS_GPU_OPS_H */
