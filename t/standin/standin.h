/*
 * standin.h - the host stand-in for the CUDA runtime, NCCL and hvd's device
 * kernels (t/standin/cudart.c, nccl.c, kernels.c): what its three parts
 * share, and what a test may ask it (the standin_* queries). Test-only:
 * linked into t/standin's programs instead of libcudart, libnccl and
 * lib/ops/cuda_kernels.cu; doc/gpu-testing.md ("Host stand-in") says what
 * it models and what it cannot prove.
 *
 * "Device memory" is host memory that cudaMalloc handed out and that the
 * stand-in tracks (per device), so that a copy in the wrong direction, a
 * free of the wrong kind, or a device pointer used while another device is
 * current ends the process with a message ("hvd stand-in: ...") instead of
 * silently working. Work on streams runs at the call; only events (and
 * NCCL's asynchronous state) pretend to take time; but the order a GPU
 * would keep between streams is tracked, and work that a GPU could run
 * before the write it reads, or before the read whose bytes it
 * overwrites, ends the process (standin_access). Pinned memory is in that
 * order too: an asynchronous copy into it lands only when the host sees
 * it finish (0xa5 bytes until then), and a host that changes the source
 * of one out of it before then ends the process (cudart.c says how). The
 * thread that made a stream with a priority (hvd's engine thread) must not
 * cudaMalloc, cudaFree, cudaHostAlloc or cudaFreeHost while an event it
 * recorded on such a stream is pending (the host has not seen it fire):
 * on a GPU those wait for the device, mid-collective; the process ends.
 * Only events made with cudaEventDisableTiming count (a group's end, as
 * hvd makes them); timing events (HVD_GPU_TIMING's) mark no work.
 *
 * Environment (read when first needed; the NCCL faults at every
 * ncclCommInitRank*, so a test may change them between hvd_init calls):
 *   HVD_STANDIN_DEVICES   GPUs in the machine (default 4, at most 8);
 *                         CUDA_VISIBLE_DEVICES selects among them as CUDA
 *                         does
 *   HVD_STANDIN_POLLS     how many times cudaEventQuery says
 *                         cudaErrorNotReady for each recorded event, and
 *                         ncclCommGetAsyncError ncclInProgress for each
 *                         non-blocking operation, before they finish
 *                         (default 2)
 *   HVD_STANDIN_STREAM_ORDER=0   no stream-order checks (default 1)
 *   HVD_STANDIN_CUDA_MALLOC_LIMIT=R:BYTES   world rank R's cudaMalloc of
 *                         more than BYTES fails (cudaErrorMemoryAllocation)
 *   HVD_STANDIN_NCCL_INIT_HANG=R    rank R's ncclCommInitRank* never
 *                         finishes (non-blocking communicators only: its
 *                         state stays ncclInProgress until ncclCommAbort)
 *   HVD_STANDIN_NCCL_INIT_FAIL=R    rank R's init fails (ncclSystemError)
 *   HVD_STANDIN_NCCL_ASYNC_ERROR=R:N[:system]   rank R's communication call
 *                         number N+1 does its part, then the communicator's
 *                         asynchronous error becomes ncclRemoteError (or
 *                         ncclSystemError) and its stream never finishes
 *   HVD_STANDIN_NCCL_HANG=R:N   rank R's call number N+1 does its part,
 *                         then its stream never finishes (events stay
 *                         cudaErrorNotReady) until ncclCommAbort
 * A rank whose communicator is aborted tells its peers; a peer that then
 * waits for it in a collective gives up the exchange and its stream never
 * finishes either (so it times out as with a real NCCL).
 */
#ifndef HVD_T_STANDIN_H
#define HVD_T_STANDIN_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

/* ---- for tests ------------------------------------------------------ */

/* 1 if the last communicator made was blocking, 0 if it was non-blocking
 * (ncclCommInitRankConfig with config.blocking = 0), -1 before any. */
int standin_nccl_last_blocking(void);
/* The calls of one kind ("ncclAllGather", "ncclReduceScatter",
 * "ncclBroadcast", "ncclAllReduce", "ncclSend", "ncclRecv") this process
 * has made so far, on every communicator; -1 for another name. */
long standin_nccl_calls(const char *call);
/* Live allocations: cudaMalloc'd (device) and cudaHostAlloc'd (pinned). */
long standin_device_allocations(void);
/* cudaMalloc and cudaFree calls so far (each waits for the device on a
 * GPU: a library's steady state makes none). */
long standin_malloc_calls(void);
long standin_pinned_allocations(void);
/* Live streams and events (created, not yet destroyed). */
long standin_streams(void);
long standin_events(void);
/* How many cudaStreamWaitEvent calls this process made, in all. */
long standin_stream_waits(void);
/* How many cudaPointerGetAttributes calls this process made, in all. */
long standin_pointer_queries(void);
/* How many times cudaEventQuery said cudaErrorNotReady, in all. */
long standin_not_ready_answers(void);
/* The work enqueued on stream s (NULL: the current device's legacy
 * stream) so far takes `seconds` more of device time, as a caller's
 * compute still running would: an event recorded on s after this, and on
 * a stream that waits for such an event (cudaStreamWaitEvent), fires only
 * then (cudaEventQuery says cudaErrorNotReady until then; its time for
 * cudaEventElapsedTime is then); the work itself still runs at the call. */
void standin_stream_busy(cudaStream_t s, double seconds);
/* The most events (made with cudaEventDisableTiming) recorded at once on
 * one stream made with cudaStreamCreateWithPriority (hvd's) that the host
 * had not yet seen fire: the device groups hvd had in flight together. */
int standin_peak_in_flight(void);

/* ---- between the stand-in's parts ---------------------------------------
 */

/* Prints "hvd stand-in: <message>" on stderr and aborts. */
void standin_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)))
__attribute__((noreturn));

/* An unsigned from the environment (def when unset; dies when malformed). */
int standin_env_int(const char *name, int def, int max);

/* The calling thread's current device (dies when there are no devices). */
int standin_current_device(void);

/* Checks that [p, p + n) is device memory (n 0: p may be anything) on the
 * current device; who names the caller in the message. */
void standin_need_device(const void *p, size_t n, const char *who,
                         const char *what);
/* The same on device dev (NCCL: the communicator's device). */
void standin_need_device_on(const void *p, size_t n, int dev, const char *who,
                            const char *what);
/* The device of the device allocation holding p, or -1 (host memory). */
int standin_device_of(const void *p);

/* Checks the stream (NULL and cudaStreamLegacy are the current device's
 * legacy default stream, cudaStreamPerThread the calling thread's own);
 * returns its device. */
int standin_stream_device(cudaStream_t s, const char *who);
/* Stream order (cudart.c): work on `stream` (NULL: the legacy default
 * stream) reads (write 0) or writes [p, p + n); dies when another
 * stream's write of those bytes, or for a write another stream's read of
 * them, is not ordered before it (no event waited for, no synchronisation
 * between). Device and pinned memory are tracked, pageable host memory is
 * not. Off with HVD_STANDIN_STREAM_ORDER=0. */
void standin_access(cudaStream_t stream, const void *p, size_t n, int write,
                    const char *who, const char *what);

/* Every stream's work so far has finished, for the stream order: what
 * cudaFree's implicit synchronisation and ncclCommAbort (whose kernels
 * end) give the host. */
void standin_order_device_idle(void);

/* Marks the stream as stuck behind NCCL communicator `serial` (0: not
 * stuck). Events recorded on it meanwhile never finish while
 * standin_nccl_hanging(serial). */
void standin_stream_hang(cudaStream_t s, unsigned long serial);
/* 1 while communicator `serial` exists and hangs (a fault, or a peer gone). */
int standin_nccl_hanging(unsigned long serial);
/* Communicator `serial` enqueued work on stream s: the events recorded on
 * s from now on (until another communicator's work) are behind it. */
void standin_stream_nccl(cudaStream_t s, unsigned long serial);
/* Communicator `serial` was aborted: the events behind its work fire (as
 * on a GPU, where the abort ends its kernels), unless the stream is still
 * busy before them. */
void standin_nccl_aborted(unsigned long serial);

/* The answers' counts of HVD_STANDIN_POLLS. */
int standin_polls(void);

#endif /* HVD_T_STANDIN_H */
