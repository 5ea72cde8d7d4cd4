/*
 * hvd.h - the public API of libhvd, data-parallel training collectives.
 *
 * One process per GPU (or CPU core group), launched by mpirun or hvdrun.
 * Call hvd_init(), then run collectives on named tensors; a background
 * engine negotiates readiness across ranks and executes them over MPI
 * (host memory) or NCCL (device memory).
 *
 * Conventions
 *  - Every call returns hvd_result_t (HVD_SUCCESS == 0), except the
 *    topology queries, which return -1 before hvd_init().
 *  - hvd_strerror(rc) gives a fixed string for a result; hvd_last_error()
 *    gives the detailed message of the calling thread's last failure.
 *  - The caller owns every buffer it passes. An _async call borrows its
 *    buffers (and the name) until the request completes. send == recv
 *    (same data pointer) means in place.
 *  - Every function here is thread-safe unless its comment says otherwise.
 *  - A child made by fork() after hvd_init (a data-loader worker, a
 *    helper that does not exec) has none of hvd's threads, and MPI and
 *    NCCL are its parent's. In it the topology queries still answer the
 *    parent's rank and size and hvd_is_initialized() is 0; every call that
 *    communicates or waits on hvd (collectives, hvd_wait and hvd_test,
 *    process sets, the optimizer's reductions, checkpoints, the timeline)
 *    fails at once with HVD_ERR_NOT_INITIALIZED, "hvd_allreduce: this
 *    process (pid C) was forked from rank R (pid P) after hvd_init; ...";
 *    hvd_init is HVD_ERR_UNSUPPORTED; hvd_shutdown and its exit leave MPI
 *    and the parent's files alone; hvd_alloc_host gives it private blocks
 *    and hvd_free_host of its parent's block leaves the parent's data.
 *  - libhvd, once loaded, stays loaded: dlclose of a handle that dlopen
 *    gave leaves it mapped (it is linked with -z nodelete), since MPI and
 *    the C library keep pointers into it (MPI_Finalize shuts hvd down
 *    through it, its fork handlers, its engine threads while running).
 *
 * This header compiles without MPI or CUDA installed.
 */
#ifndef HVD_H
#define HVD_H

#include <stddef.h>
#include <stdint.h>

#include "hvd_version.h" /* HVD_VERSION_MAJOR ... HVD_VERSION, from configure */

#ifdef __cplusplus
extern "C" {
#endif

/* Results. One list generates the enum and the strings (hvd_strerror). */
#define HVD_RESULT_LIST(X)                                                     \
  X(HVD_SUCCESS, 0, "success")                                                 \
  X(HVD_ERR_NOT_INITIALIZED, 1, "hvd_init() has not been called")              \
  X(HVD_ERR_INVALID_ARG, 2, "invalid argument")                                \
  X(HVD_ERR_MISMATCH, 3, "ranks disagree on a collective")                     \
  X(HVD_ERR_SHUTDOWN, 4, "hvd has been shut down")                             \
  X(HVD_ERR_MPI, 5, "MPI call failed")                                         \
  X(HVD_ERR_NO_MEMORY, 6, "out of memory")                                     \
  X(HVD_ERR_SYSTEM, 7, "system call failed")                                   \
  X(HVD_ERR_UNSUPPORTED, 8, "not supported by this build or backend")          \
  X(HVD_ERR_STALL, 9, "collective stalled: some ranks never submitted it")     \
  X(HVD_ERR_CUDA, 10, "CUDA call failed")                                      \
  X(HVD_ERR_NCCL, 11, "NCCL call failed")                                      \
  X(HVD_ERR_IO, 12, "file input/output failed")                                \
  X(HVD_ERR_CORRUPT, 13, "data is corrupt or does not match")                  \
  X(HVD_ERR_INTERNAL, 14, "internal error in hvd")

typedef enum hvd_result {
#define HVD__RESULT_ENUM(name, code, text) name = code,
  /* clang-format off */ /* (the list's expansion ends with a comma) */
  HVD_RESULT_LIST(HVD__RESULT_ENUM)
#undef HVD__RESULT_ENUM
  HVD_RESULT_COUNT
  /* clang-format on */
} hvd_result_t;

/* Element types. */
typedef enum hvd_dtype {
  HVD_UINT8 = 0,
  HVD_INT8 = 1,
  HVD_INT32 = 2,
  HVD_INT64 = 3,
  HVD_FLOAT16 = 4,  /* IEEE binary16; each addition in float, rounded */
  HVD_BFLOAT16 = 5, /* bfloat16; each addition in float, rounded */
  HVD_FLOAT32 = 6,
  HVD_FLOAT64 = 7,
  HVD_DTYPE_COUNT
} hvd_dtype_t;

/* Reduction operations. On integer dtypes sums and products wrap in the
 * element type, as MPI's do; HVD_AVERAGE is that sum divided by the
 * world size in integer arithmetic (truncated toward zero), and scale
 * factors other than 1.0 are rejected. On floating types HVD_AVERAGE
 * multiplies the sum by postscale / size, computed in double: float32
 * by that factor rounded to float (one rounding more than a division, so
 * the average of three equal values x need not be x), float16 and
 * bfloat16 in double, rounded to float and then to the type; float64
 * divides by the size, then multiplies by postscale. Host and GPU paths
 * round alike.
 *
 * HVD_MIN and HVD_MAX on floating types are C's fmin and fmax, as NCCL
 * computes them on the GPU: a NaN loses to a number, so the result is a
 * NaN only where every rank's element is, and it does not depend on which
 * rank holds a NaN (an inf is a number: max(inf, 1) is inf). Look for
 * NaNs with HVD_SUM or HVD_PRODUCT, which carry them.
 *
 * HVD_ADASUM is Horovod's Adasum (hvd.Adasum; Maleki et al., "Scaling
 * Distributed Training with Adaptive Summation"), an allreduce op for
 * gradients: the ranks' tensors are combined two by two, adasum(a, b) =
 * (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b, over a binary tree
 * of the ranks (lib/ops/adasum.c gives it exactly; any world size), each
 * tensor on its own even when fused. Orthogonal tensors add up, equal
 * ones give themselves back: large batches without retuning the
 * learning rate. Every rank gets the same bits, run after run. Float32
 * and float64 tensors, allreduce only (with prescale and postscale), on
 * the host or the rank's GPU: NCCL has no Adasum, so device tensors are
 * staged through pinned host memory into the same tree whatever
 * HVD_GPU_OPERATIONS says (the host's bits; two copies of each tensor
 * over PCIe, where Horovod reduces within a node over NCCL first).
 * Anything else is refused with HVD_ERR_INVALID_ARG naming the tensor:
 * "allreduce 'g': HVD_ADASUM needs float32 or float64, not int32",
 * "reducescatter 'g': HVD_ADASUM is an allreduce op". */
typedef enum hvd_op {
  HVD_SUM = 0,
  HVD_AVERAGE = 1,
  HVD_MIN = 2,
  HVD_MAX = 3,
  HVD_PRODUCT = 4,
  HVD_ADASUM = 5,
  HVD_OP_COUNT
} hvd_op_t;

/* tensor.device for host memory; >= 0 is a CUDA ordinal */
#define HVD_CPU (-1)
#define HVD_MAX_DIMS 8

/* A tensor descriptor. Row-major, contiguous. The data is the caller's,
 * except in tensors that hvd allocated for an output (allgather,
 * alltoall, reducescatter; on the input's device), which the caller frees
 * with hvd_tensor_free.
 *
 * Device tensors (builds with CUDA): device must be the rank's own GPU,
 * hvd_cuda_device() or, with HVD_NO_BIND=1, the calling thread's current
 * device; any other is HVD_ERR_INVALID_ARG ("<kind> '<name>': tensor is
 * on cuda:1 but this rank uses cuda:0"): hvd never copies between GPUs.
 * Device ordering: a device collective reads its tensors only after the
 * work that the submitting thread's stream (hvd_cuda_set_stream) had
 * enqueued when it was submitted, ordered on the device (hvd records an
 * event there and makes its own stream wait for it; the host waits for
 * nothing), as Horovod's ready events and DDP's current-stream event do.
 * By default that stream is the legacy default stream (stream 0), which
 * also covers the blocking streams made by cudaStreamCreate and, in
 * programs built with --default-stream per-thread, the per-thread
 * streams; work on a cudaStreamNonBlocking stream is covered only when
 * that stream is set. Synchronising the writer before submitting, the
 * rule before 0.1, still works. When the request completes, the results
 * are complete for every stream. Ranks agree on host versus device per
 * name, not on the ordinal. A build without CUDA refuses device tensors
 * with HVD_ERR_UNSUPPORTED. */
typedef struct hvd_tensor {
  void *data;
  hvd_dtype_t dtype;
  int ndim; /* 0 (a scalar) .. HVD_MAX_DIMS */
  int64_t shape[HVD_MAX_DIMS];
  int device; /* HVD_CPU or a CUDA device ordinal */
} hvd_tensor_t;

/* An in-flight collective, returned by the _async calls; freed by
 * hvd_wait, or by hvd_test once it reports completion. */
typedef struct hvd_request hvd_request_t;

/* ---- Lifecycle -------------------------------------------------------- */

/* Initialise hvd on all ranks (collective). Idempotent. Initialises MPI
 * (asking for MPI_THREAD_MULTIPLE) only if the program has not, and then
 * finalises it when the process exits, so hvd_shutdown() followed by
 * hvd_init() works; but if hvd stopped on a failure (a stall: some rank
 * may never come), the process ends the job with MPI_Abort(MPI_COMM_WORLD,
 * the failure's code) instead of waiting in MPI_Finalize (doc/errors.md).
 * hvd works on a duplicate of MPI_COMM_WORLD. MPI that the program
 * initialised itself must run at MPI_THREAD_MULTIPLE (hvd's engine calls
 * it from its own thread): below it, HVD_ERR_UNSUPPORTED, "hvd_init: MPI
 * was initialised at MPI_THREAD_SINGLE (MPI_Query_thread); ...". */
hvd_result_t hvd_init(void);

/* Stop the engine (collective in spirit: the first rank to call it stops
 * the engine on every rank). Requests still in flight on any rank complete
 * with HVD_ERR_SHUTDOWN. Idempotent; returns HVD_SUCCESS if not
 * initialised. A program that initialised MPI itself and calls
 * MPI_Finalize with hvd still running gets this done first, inside
 * MPI_Finalize (an attribute of MPI_COMM_SELF, which MPI deletes before
 * anything else). */
hvd_result_t hvd_shutdown(void);

/* 1 between a successful hvd_init() and hvd_shutdown(), else 0. */
int hvd_is_initialized(void);

/* ---- Topology (each returns -1 before hvd_init) ------------------------ */
int hvd_rank(void);
int hvd_size(void);
int hvd_local_rank(void); /* rank among the ranks of this node */
int hvd_local_size(void); /* ranks on this node */
/* The index of this rank's node among the nodes that have a rank with
 * this local rank, the nodes ordered by their lowest rank: the same order
 * on every local rank, whatever the layout (ranks 0..5 on nodes
 * A B C C B A: 0, 1, 2 on A, B, C for local ranks 0 and 1 alike). */
int hvd_cross_rank(void);
int hvd_cross_size(void); /* ranks with this local rank (one per node) */
/* 1 if every node runs the same number of ranks */
int hvd_is_homogeneous(void);
/* The CUDA device hvd_init bound this process to, or -1 (before hvd_init,
 * in a build without CUDA, with no GPU visible, or with HVD_NO_BIND=1).
 * hvd_init binds local rank r to device r % (visible devices), making it
 * the current device of the thread that called hvd_init (other threads
 * call cudaSetDevice themselves), and fails with HVD_ERR_CUDA on every
 * rank if two ranks of one node would share a GPU. */
int hvd_cuda_device(void);

/* The stream that this thread's device collectives are ordered after
 * (see hvd_tensor_t, "Device ordering"): a cudaStream_t of the tensors'
 * device, or NULL for the legacy default stream (the default). Set it to
 * the stream a framework computes on (PyTorch's current stream) so that a
 * gradient can be submitted right after the kernel that writes it is
 * enqueued. Thread-local; needs no hvd_init. HVD_ERR_UNSUPPORTED in a
 * build without CUDA. */
hvd_result_t hvd_cuda_set_stream(void *stream);
/* This thread's stream as set, NULL for the legacy default stream. */
void *hvd_cuda_stream(void);

/* Why this process has no CUDA device to use, in words, or NULL when the
 * CUDA runtime sees one: "no NVIDIA driver or GPU found
 * (cudaGetDeviceCount: CUDA driver version is insufficient for CUDA
 * runtime version)", another CUDA error with its name, or "this build has
 * no CUDA (...)". A thread-local string, valid until the next call;
 * needs no hvd_init. */
const char *hvd_cuda_unavailable(void);

/* ---- Build facts (valid at any time) ----------------------------------- */
int hvd_mpi_built(void);  /* 1: libhvd has the MPI executor */
int hvd_cuda_built(void); /* CUDA runtime version code (e.g. 13000), or 0 */
int hvd_nccl_built(void); /* NCCL version code (e.g. 22703), or 0 */
const char *hvd_version(void); /* "0.1.0" */

/* ---- Settings (valid at any time) -------------------------------------- *
 * The HVD_* environment variables that hvd_init() reads, as hvd-info lists
 * them. hvd_setting_info sets each non-NULL out-parameter to a static
 * string owned by hvd: the variable's name, its default ("(unset)" when
 * it has none) and a one-line meaning. i runs from 0 to
 * hvd_setting_count() - 1; another i is HVD_ERR_INVALID_ARG. */
int hvd_setting_count(void);
hvd_result_t hvd_setting_info(int i, const char **name,
                              const char **default_value, const char **meaning);
/* Setting i's value in the environment, parsed as hvd_init() parses it:
 * HVD_SUCCESS (unset counts as good), or what hvd_init() would fail with
 * (HVD_ERR_INVALID_ARG, e.g. "HVD_CYCLE_TIME='-5' is out of range
 * 0..10000"). Sizes in bytes take K, M, G or T (x 1024): "64M". */
hvd_result_t hvd_setting_check(int i);
/* The k-th (0, 1, ...) variable of the environment that looks like a
 * setting but is not read: an HVD_* name that is no hvd variable ("HVD_X
 * is not an hvd variable: did you mean HVD_Y?", HVD_Y the setting whose
 * name begins with HVD_X, else the nearest by spelling) or a HOROVOD_* one
 * ("... is Horovod's and hvd does not read it: hvd's is HVD_Y" when hvd
 * has that setting, "... is Horovod's and hvd has no such setting
 * (hvd-info lists hvd's variables)" when it has not): 1 with the
 * message in message[0..len), 0 when there is no k-th. hvd_init() logs
 * each as a warning on rank 0. */
int hvd_setting_unknown(int k, char *message, size_t len);

/* ---- Errors ------------------------------------------------------------ */

/* A fixed string for rc; "unknown result" for a value out of range. */
const char *hvd_strerror(hvd_result_t rc);

/* The message of the calling thread's last failed hvd call, e.g.
 * "allreduce 'w': rank 0 shape [17] vs rank 1 shape [18]". Empty string if
 * none. Owned by hvd; valid until this thread's next hvd call. */
const char *hvd_last_error(void);

/* ---- Tensors ----------------------------------------------------------- */

/* Bytes per element; 0 for an unknown dtype. */
size_t hvd_dtype_size(hvd_dtype_t dtype);
/* "float32" etc.; "unknown" for an unknown dtype. */
const char *hvd_dtype_name(hvd_dtype_t dtype);
/* "sum" etc.; "unknown" for an unknown op. */
const char *hvd_op_name(hvd_op_t op);

/* A host tensor descriptor over the caller's data (no copy). ndim is
 * clamped to 0..HVD_MAX_DIMS; hvd validates it again when used. */
hvd_tensor_t hvd_tensor_make(void *data, hvd_dtype_t dtype, int ndim,
                             const int64_t *shape);
/* Number of elements (product of the shape; 1 for a scalar); -1 when a
 * dimension is negative or the product exceeds INT64_MAX. The collectives
 * refuse a tensor of more than PTRDIFF_MAX bytes (HVD_ERR_INVALID_ARG,
 * "allreduce 'x': send shape [4294967296, 4294967296] of float32 is more
 * than PTRDIFF_MAX bytes"). */
int64_t hvd_tensor_numel(const hvd_tensor_t *t);
/* Frees the data of a tensor that hvd allocated (and sets it to NULL):
 * host memory, or device memory (cudaFree) when t->device >= 0. Accepts
 * NULL and a tensor with NULL data. */
void hvd_tensor_free(hvd_tensor_t *t);

/* Host memory for tensors that every step reads and writes in full
 * (gradients, parameters, optimizer state), zero-filled. It lives in this
 * process's shared arena (an anonymous memfd mapping, gone with the
 * process), which the other ranks of the node map too, readable and
 * writable, as threads of one program would share it: an allreduce whose
 * tensors (send and recv) are all hvd_alloc_host memory on every rank of
 * the node is reduced in place, each rank summing its share straight from
 * the peers' tensors and writing the result into every peer's recv, with
 * no copy through a staging buffer (HVD_ZERO_COPY; doc/bench.md,
 * "Zero-copy allreduce"). Other tensors are
 * reduced as before, and may be mixed freely with these. Blocks are
 * page-aligned (2 MiB-aligned from 2 MiB up) and take whole 4 KiB pages;
 * freed pages go back to the system. Because the arena is MAP_SHARED, a
 * child made by fork() shares these blocks with its parent instead of
 * getting a copy. HVD_HOST_ARENA=0 (read at the first call) makes
 * blocks private instead: from 2 MiB up on transparent huge pages
 * (madvise), smaller ones 64-byte aligned. Needs no hvd_init and no MPI;
 * thread-safe. Returns NULL when the memory cannot be had (hvd_last_error
 * says why); 0 bytes gives a valid block. */
void *hvd_alloc_host(size_t bytes);
/* Frees a block of hvd_alloc_host; NULL is accepted. Any other pointer
 * (or one freed already) is HVD_ERR_INVALID_ARG, naming it. */
hvd_result_t hvd_free_host(void *p);

/* ---- Collectives ------------------------------------------------------- *
 * Each has an _async form that returns a request, and a blocking form
 * (the _async form followed by hvd_wait). A name identifies the tensor
 * across ranks: every rank must submit the same name with agreeing
 * parameters, in any order. A name already in flight on this rank is
 * rejected with HVD_ERR_INVALID_ARG. "hvd.barrier" and "hvd.join" name
 * hvd_barrier's and hvd_join's own requests and are no tensor's: every
 * collective refuses them with HVD_ERR_INVALID_ARG ("allreduce
 * 'hvd.join': the name is reserved for hvd_join"); other names beginning
 * "hvd." are the user's (hvd's optimizers use some, as "hvd.grad.<name>").
 * Disagreement between ranks completes the request on every rank with
 * HVD_ERR_MISMATCH. The name is copied. */

/* recv = postscale * op_over_ranks(prescale * send). recv must have send's
 * dtype and shape; recv->data == send->data reduces in place. Otherwise
 * recv's bytes must not meet send's: a recv that partly overlaps send is
 * refused, HVD_ERR_INVALID_ARG ("allreduce 'x': recv overlaps send
 * without being it (in place is recv->data == send->data)").
 *
 * Reproducibility. On the host, and for device tensors staged through it
 * (HVD_GPU_OPERATIONS=mpi), every reduction (allreduce, reducescatter,
 * their grouped and process-set forms, compressed ones in the wire dtype)
 * folds each element over the ranks in one fixed order, one rounding per
 * step in the dtype (float16 and bfloat16 are rounded after each
 * addition): on one node in rank order 0..P-1, the bits of a loop over
 * the ranks' values in one process; on several nodes each node's ranks in
 * local-rank order, then the nodes' results in node order (each node's
 * lowest rank first, as hvd_cross_rank counts them), where the
 * shared-memory path runs (HVD_SHM_ALLREDUCE on and every node with the
 * same number of ranks) or HVD_HIERARCHICAL_ALLREDUCE=1; otherwise in
 * rank order (a reducescatter: rank order always). The order thus
 * follows those settings and the layout of ranks on nodes, which are the
 * same from run to run. So an element's result does not
 * depend on fusion, pieces, cycle timing, the response cache, autotune or
 * in-place use: the same inputs on the same ranks and nodes give the same
 * bits, run after run. Over NCCL (device tensors, the default on a GPU)
 * the order follows NCCL's algorithm and the fused buffer's layout, and
 * results may differ in the last bits from run to run. */
hvd_result_t hvd_allreduce_async(const char *name, const hvd_tensor_t *send,
                                 hvd_tensor_t *recv, hvd_op_t op,
                                 double prescale, double postscale,
                                 hvd_request_t **req);
hvd_result_t hvd_allreduce(const char *name, const hvd_tensor_t *send,
                           hvd_tensor_t *recv, hvd_op_t op, double prescale,
                           double postscale);

/* In place: root's tensor is copied into every other rank's tensor. */
hvd_result_t hvd_broadcast_async(const char *name, hvd_tensor_t *tensor,
                                 int root, hvd_request_t **req);
hvd_result_t hvd_broadcast(const char *name, hvd_tensor_t *tensor, int root);

/* Concatenates every rank's send along dimension 0, in rank order. The
 * first dimension may differ per rank; the others must agree. *recv is
 * filled in at completion with a tensor hvd allocated (hvd_tensor_free).
 * First dimensions that sum past INT64_MAX rows, or an output past
 * PTRDIFF_MAX bytes, fail it on every rank (HVD_ERR_INVALID_ARG, "...:
 * the first dimensions of the 2 ranks sum past the largest tensor ..."). */
hvd_result_t hvd_allgather_async(const char *name, const hvd_tensor_t *send,
                                 hvd_tensor_t *recv, hvd_request_t **req);
hvd_result_t hvd_allgather(const char *name, const hvd_tensor_t *send,
                           hvd_tensor_t *recv);

/* Rank r sends splits[j] rows (slices of dimension 0) of send to rank j,
 * in order; splits has hvd_size() entries summing to send->shape[0], or is
 * NULL for an even split (shape[0] must then divide by the size). At
 * completion *recv holds the received rows in rank order (hvd allocates;
 * hvd_tensor_free), and recv_splits (hvd_size() entries, may be NULL)
 * says how many rows came from each rank. Splits sent to one rank that
 * sum past INT64_MAX rows (or its output past PTRDIFF_MAX bytes) fail it
 * on every rank (HVD_ERR_INVALID_ARG, "...: rank 1 would receive more
 * rows than a tensor holds ..."). */
hvd_result_t hvd_alltoall_async(const char *name, const hvd_tensor_t *send,
                                const int64_t *splits, hvd_tensor_t *recv,
                                int64_t *recv_splits, hvd_request_t **req);
hvd_result_t hvd_alltoall(const char *name, const hvd_tensor_t *send,
                          const int64_t *splits, hvd_tensor_t *recv,
                          int64_t *recv_splits);

/* Reduces send (same shape on every rank) with op, then gives rank r its
 * block of dimension 0. With N = shape[0] and P = hvd_size(), rank r gets
 * N / P rows, plus one more if r < N % P; blocks are in rank order. *recv
 * is allocated by hvd (hvd_tensor_free). Scale factors as for allreduce. */
hvd_result_t hvd_reducescatter_async(const char *name, const hvd_tensor_t *send,
                                     hvd_tensor_t *recv, hvd_op_t op,
                                     double prescale, double postscale,
                                     hvd_request_t **req);
hvd_result_t hvd_reducescatter(const char *name, const hvd_tensor_t *send,
                               hvd_tensor_t *recv, hvd_op_t op, double prescale,
                               double postscale);

/* Returns once every rank has entered the barrier. */
hvd_result_t hvd_barrier_async(hvd_request_t **req);
hvd_result_t hvd_barrier(void);

/* Says this rank has run out of data. Until every rank has joined, the
 * other ranks' allreduces go on, with a joined rank contributing the
 * identity of the op (0 for sum and average, 1 for product, the largest
 * or smallest value for min and max); an average still divides by the
 * world size. Other collectives submitted while some rank has joined fail
 * with HVD_ERR_MISMATCH. Completes when all ranks have joined; then
 * *last_rank (may be NULL) is the rank that joined last. A rank that
 * joined early missed the others' updates: before training on, broadcast
 * the parameters and the optimizer state from the last rank to join
 * (hvd_broadcast_parameters and hvd_broadcast_optimizer_state from
 * *last_rank), or the next step names the update count that differs. */
hvd_result_t hvd_join_async(int *last_rank, hvd_request_t **req);
hvd_result_t hvd_join(int *last_rank);

/* ---- Process sets ------------------------------------------------------
 * Horovod's ProcessSet: collectives among a subset of the ranks (e.g. the
 * data-parallel groups inside model parallelism). A set's members get a
 * communicator and an engine of their own, so its names are its own (the
 * same name may be in flight in two sets), and its response cache,
 * fusion and stall inspector work on its collectives alone, independently
 * of the world's and of other sets'; error messages name world ranks.
 * Sets may overlap. Host and device tensors as in the world.
 *
 * Making a set (create, split, split_node) is collective over every rank,
 * and every rank must make the same call at the same point: ranks whose
 * calls differ (one creates while another splits) all fail with
 * HVD_ERR_MISMATCH, "hvd_process_set_split: rank 0 calls
 * hvd_process_set_create but rank 1 calls hvd_process_set_split" (each
 * rank's message starts with its own call). A call that some rank never
 * makes obeys the stall times as a collective does: after
 * HVD_STALL_CHECK_TIME rank 0 logs "stall: hvd_process_set_create has
 * waited 60.0 s for rank(s) 1; called by rank(s) 0, 2", after
 * HVD_STALL_SHUTDOWN_TIME hvd stops on every rank and the call returns
 * HVD_ERR_STALL ("hvd_process_set_create: hvd stopped:
 * hvd_process_set_create stalled for 300.0 s: rank(s) 1 never called it
 * (HVD_STALL_SHUTDOWN_TIME=300)").
 *
 * Cost: every live set costs its members one negotiation round (a small
 * MPI allreduce over the set) in every cycle of the world's engine, busy
 * or idle, since the world's thread drives each set's cycle after its
 * own. A few sets cost little; hundreds make every collective slow (a
 * 4-float world allreduce at np 2 on a loaded 2-core machine: 17 us with
 * no set, 1.2 ms with 100 idle sets, 25 ms with 300, 117 ms with 1000).
 * Destroy the sets you no longer use, and prefer one split to many
 * creates. */
typedef struct hvd_process_set hvd_process_set_t;

/* Collective over every rank, which must all pass the same ranks (world
 * ranks, distinct, ascending; HVD_ERR_MISMATCH naming the first rank that
 * differs from rank 0). A rank's bad arguments (a list not ascending or
 * out of range, out NULL) fail every rank alike, HVD_ERR_INVALID_ARG
 * naming it ("...: rank 2 passes ranks[1] = 0; the ranks are distinct,
 * ascending, in 0..3"). Every rank gets a handle, members and others.
 * Each call makes a new set with a new id (1, 2, ...), even for ranks
 * that an existing set already has: its own communicator, engine and
 * names; destroy the sets you no longer use. */
hvd_result_t hvd_process_set_create(const int *ranks, int n,
                                    hvd_process_set_t **out);
/* Collective over every rank, MPI_Comm_split for sets (DDP's
 * new_subgroups_by_enumeration; its new_subgroups(k) is color rank / k):
 * the ranks that pass the same color form one set, in world rank order.
 * One call makes a set per distinct color, with ids given in ascending
 * color order, the same on every rank; *out is the caller's (a member's
 * handle: it has none for the others). A color below 0 (INT_MIN too) or
 * an out NULL on any rank: HVD_ERR_INVALID_ARG on every rank, naming the
 * rank ("...: rank 2 passes color -1; colors are >= 0"), and no set.
 * Every rank must call this (hvd_process_set_split_node is another call:
 * see above). Every rank
 * destroys its own set at the same point: hvd_process_set_destroy. */
hvd_result_t hvd_process_set_split(int color, hvd_process_set_t **out);
/* hvd_process_set_split by node (DDP's new_subgroups() default, e.g. for
 * local SGD's group): the ranks of the caller's node, so its rank in the
 * set is hvd_local_rank() and its size hvd_local_size(). Nodes are as
 * hvd_init found them: shared memory, or equal HVD_HOSTNAME. */
hvd_result_t hvd_process_set_split_node(hvd_process_set_t **out);
/* Collective over every rank: stops the set (its members' requests still
 * in flight complete with HVD_ERR_SHUTDOWN) and frees the handle. NULL is
 * a no-op. hvd_shutdown stops every set; their handles are then only good
 * for destroy. */
hvd_result_t hvd_process_set_destroy(hvd_process_set_t *ps);
int hvd_process_set_rank(const hvd_process_set_t *ps); /* -1: not a member */
int hvd_process_set_size(const hvd_process_set_t *ps);
int hvd_process_set_id(const hvd_process_set_t *ps); /* 1, 2, ... */

/* The collectives on a set: as the world's, among its members, with ranks
 * (broadcast's root, alltoall's splits, reducescatter's blocks) counted
 * within the set. A rank outside it gets HVD_ERR_INVALID_ARG ("allreduce
 * 'x': rank 3 is not in process set 1 (ranks 0, 1)") before any check of
 * its other arguments but the name's. Errors before the call reaches the
 * set name the call itself ("hvd_ps_allreduce: hvd_init() has not been
 * called"). A member's collective ended by another member's hvd_shutdown
 * says "allreduce 'x': hvd was shut down by rank 2 before this collective
 * completed", by its destroy "... process set 1 was destroyed (rank 2
 * destroyed it first) before ...". */
hvd_result_t hvd_ps_allreduce_async(const hvd_process_set_t *ps,
                                    const char *name, const hvd_tensor_t *send,
                                    hvd_tensor_t *recv, hvd_op_t op,
                                    double prescale, double postscale,
                                    hvd_request_t **req);
hvd_result_t hvd_ps_allreduce(const hvd_process_set_t *ps, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv,
                              hvd_op_t op, double prescale, double postscale);
hvd_result_t hvd_ps_broadcast_async(const hvd_process_set_t *ps,
                                    const char *name, hvd_tensor_t *tensor,
                                    int root, hvd_request_t **req);
hvd_result_t hvd_ps_broadcast(const hvd_process_set_t *ps, const char *name,
                              hvd_tensor_t *tensor, int root);
hvd_result_t hvd_ps_allgather_async(const hvd_process_set_t *ps,
                                    const char *name, const hvd_tensor_t *send,
                                    hvd_tensor_t *recv, hvd_request_t **req);
hvd_result_t hvd_ps_allgather(const hvd_process_set_t *ps, const char *name,
                              const hvd_tensor_t *send, hvd_tensor_t *recv);
hvd_result_t hvd_ps_alltoall_async(const hvd_process_set_t *ps,
                                   const char *name, const hvd_tensor_t *send,
                                   const int64_t *splits, hvd_tensor_t *recv,
                                   int64_t *recv_splits, hvd_request_t **req);
hvd_result_t hvd_ps_alltoall(const hvd_process_set_t *ps, const char *name,
                             const hvd_tensor_t *send, const int64_t *splits,
                             hvd_tensor_t *recv, int64_t *recv_splits);
hvd_result_t hvd_ps_reducescatter_async(const hvd_process_set_t *ps,
                                        const char *name,
                                        const hvd_tensor_t *send,
                                        hvd_tensor_t *recv, hvd_op_t op,
                                        double prescale, double postscale,
                                        hvd_request_t **req);
hvd_result_t hvd_ps_reducescatter(const hvd_process_set_t *ps, const char *name,
                                  const hvd_tensor_t *send, hvd_tensor_t *recv,
                                  hvd_op_t op, double prescale,
                                  double postscale);
hvd_result_t hvd_ps_barrier(const hvd_process_set_t *ps);

/* ---- Grouped collectives ----------------------------------------------
 * Horovod's grouped_allreduce (and allgather, reducescatter): n tensors
 * (1 to 1048576: HVD_ERR_INVALID_ARG otherwise) negotiated as one unit
 * and run together. The members are submitted in
 * one step; the coordinator answers for none of them until every rank has
 * submitted every member, then runs them back to back in one cycle, the
 * allreduces fused together (up to HVD_FUSION_THRESHOLD, in chunks as
 * any fused group). Each member is the collective of its name, with its
 * own request in reqs[i] (hvd_wait each); the blocking forms wait for all
 * and return the first failure. Ranks must form the same group (the same
 * names in the same order), else every member fails with HVD_ERR_MISMATCH
 * naming the ranks ("group 1 of 2 (#1a2b) vs ... group none") once every
 * rank has submitted it (a member that some rank never submits waits for
 * the stall inspector, as any collective would); a member
 * whose other arguments differ between ranks (a shape, a dtype) fails as a
 * single collective would, naming them, and the other members run. An
 * invalid member (its message prefixed "<call>: tensor i: "), two
 * members with one name, or a grouped allreduce where a member's recv
 * meets another member's send (sends may share memory, as may recvs;
 * "hvd_grouped_allreduce: tensor 0's send overlaps tensor 1's recv")
 * submit nothing. A group that ran once is in the
 * response cache, as single collectives are: the next time it is agreed
 * by the cache's bit vector, without the coordinator, whole or not at all
 * (a member evicted or changed sends every member to the coordinator). */
hvd_result_t hvd_grouped_allreduce_async(int n, const char *const *names,
                                         const hvd_tensor_t *sends,
                                         hvd_tensor_t *recvs, hvd_op_t op,
                                         double prescale, double postscale,
                                         hvd_request_t **reqs);
hvd_result_t hvd_grouped_allreduce(int n, const char *const *names,
                                   const hvd_tensor_t *sends,
                                   hvd_tensor_t *recvs, hvd_op_t op,
                                   double prescale, double postscale);
hvd_result_t hvd_grouped_allgather_async(int n, const char *const *names,
                                         const hvd_tensor_t *sends,
                                         hvd_tensor_t *recvs,
                                         hvd_request_t **reqs);
hvd_result_t hvd_grouped_allgather(int n, const char *const *names,
                                   const hvd_tensor_t *sends,
                                   hvd_tensor_t *recvs);
hvd_result_t hvd_grouped_reducescatter_async(int n, const char *const *names,
                                             const hvd_tensor_t *sends,
                                             hvd_tensor_t *recvs, hvd_op_t op,
                                             double prescale, double postscale,
                                             hvd_request_t **reqs);
hvd_result_t hvd_grouped_reducescatter(int n, const char *const *names,
                                       const hvd_tensor_t *sends,
                                       hvd_tensor_t *recvs, hvd_op_t op,
                                       double prescale, double postscale);

/* ---- Byte objects -------------------------------------------------------
 * Horovod's broadcast_object and allgather_object for C: opaque bytes
 * (a config struct, a vocabulary, file names) whose sizes the receivers
 * do not know. The lengths travel first, then the bytes, as collectives
 * named "hvd.object.<name>.size" and "hvd.object.<name>". Host memory
 * only; the results are malloc'd copies, on every rank alike, which the
 * caller frees with free(). Blocking. */

/* Root's len bytes at data (ignored on the other ranks, may be NULL
 * there) reach every rank: *out gets a copy, *out_len its length. A root
 * outside 0..size-1 is HVD_ERR_INVALID_ARG; ranks that name different
 * roots get HVD_ERR_MISMATCH naming them. */
hvd_result_t hvd_broadcast_object(const char *name, const void *data,
                                  size_t len, int root, void **out,
                                  size_t *out_len);

/* Every rank's len bytes at data, concatenated in rank order into *out;
 * lens (hvd_size() entries, may be NULL) gets each rank's length. Ranks
 * may send different lengths, 0 included. */
hvd_result_t hvd_allgather_object(const char *name, const void *data,
                                  size_t len, void **out, size_t *lens);

/* ---- Grouped and object collectives on a process set ------------------
 * As hvd_grouped_* and hvd_*_object, among the set's members (roots and
 * lengths counted within the set: lens gets hvd_process_set_size
 * entries). The set's engine negotiates and fuses a group as the world's
 * does. A rank outside the set gets HVD_ERR_INVALID_ARG: for a group its
 * first member's error ("allreduce 'g.a': rank 3 is not in process set
 * 1 (ranks 0, 1)"), for an object "hvd_ps_broadcast_object 'cfg': rank 3
 * is not in process set 1 (ranks 0, 1)". Declared after the world's
 * forms, which they follow. */
hvd_result_t hvd_ps_grouped_allreduce_async(const hvd_process_set_t *ps, int n,
                                            const char *const *names,
                                            const hvd_tensor_t *sends,
                                            hvd_tensor_t *recvs, hvd_op_t op,
                                            double prescale, double postscale,
                                            hvd_request_t **reqs);
hvd_result_t hvd_ps_grouped_allreduce(const hvd_process_set_t *ps, int n,
                                      const char *const *names,
                                      const hvd_tensor_t *sends,
                                      hvd_tensor_t *recvs, hvd_op_t op,
                                      double prescale, double postscale);
hvd_result_t hvd_ps_grouped_allgather_async(const hvd_process_set_t *ps, int n,
                                            const char *const *names,
                                            const hvd_tensor_t *sends,
                                            hvd_tensor_t *recvs,
                                            hvd_request_t **reqs);
hvd_result_t hvd_ps_grouped_allgather(const hvd_process_set_t *ps, int n,
                                      const char *const *names,
                                      const hvd_tensor_t *sends,
                                      hvd_tensor_t *recvs);
hvd_result_t hvd_ps_grouped_reducescatter_async(
    const hvd_process_set_t *ps, int n, const char *const *names,
    const hvd_tensor_t *sends, hvd_tensor_t *recvs, hvd_op_t op,
    double prescale, double postscale, hvd_request_t **reqs);
hvd_result_t hvd_ps_grouped_reducescatter(const hvd_process_set_t *ps, int n,
                                          const char *const *names,
                                          const hvd_tensor_t *sends,
                                          hvd_tensor_t *recvs, hvd_op_t op,
                                          double prescale, double postscale);
hvd_result_t hvd_ps_broadcast_object(const hvd_process_set_t *ps,
                                     const char *name, const void *data,
                                     size_t len, int root, void **out,
                                     size_t *out_len);
hvd_result_t hvd_ps_allgather_object(const hvd_process_set_t *ps,
                                     const char *name, const void *data,
                                     size_t len, void **out, size_t *lens);

/* ---- The timeline, from the program -------------------------------------
 * Horovod's start_timeline/stop_timeline, and marks of the program's own.
 * HVD_TIMELINE starts one at hvd_init; these start one later (closing any
 * open one), or stop it: rank 0 writes PATH (with HVD_TIMELINE_ALL_RANKS
 * every rank its own, the rank before the extension); they return when
 * the file is open or closed (a valid JSON array). Each rank's readiness
 * ticks (READY) are gathered only when HVD_TIMELINE was set at hvd_init.
 * A file stops at HVD_TIMELINE_MAX_BYTES (default 1G) with a TIMELINE_CAP
 * event. A write that fails (a full disk) ends the file at its last whole
 * event, still valid JSON, with one warning. HVD_ERR_IO
 * "hvd_timeline_start: ..." when PATH cannot be created or written;
 * HVD_ERR_NOT_INITIALIZED before hvd_init. */
hvd_result_t hvd_timeline_start(const char *path);
hvd_result_t hvd_timeline_stop(void);
/* An instant event `name` on the timeline's USER track (a phase of the
 * program: "forward", "step 12"), and a counter (Chrome's counter track:
 * loss, lr...). No-ops when this rank writes no timeline; any thread. */
void hvd_timeline_mark(const char *name);
void hvd_timeline_counter(const char *name, double value);

/* ---- Device group timing ------------------------------------------------
 * With HVD_GPU_TIMING=1 every device group (the tensors one collective of
 * the device executors runs together on hvd's stream) is timed with CUDA
 * events on that stream, and this rank's groups of every process set are
 * added up. groups: how many were timed (a failed one is not); busy_s:
 * the stream's time inside them; idle_s: between them (from one group's
 * end to the next group's start, which waits for its inputs' ready
 * events); lag_s: the part of idle_s after the next group's inputs were
 * already ready on the device, hvd's own delay (negotiation, fusion,
 * launch); max_lag_s: the largest of one group. The first group of a
 * stream (or the first after a failed one) counts in busy_s only; on
 * NCCL its busy time includes the communicator's setup. */
typedef struct hvd_gpu_timing_totals { /* not hvd_gpu_timing: C++ */
  int64_t groups;
  double busy_s, idle_s, lag_s, max_lag_s;
} hvd_gpu_timing_t;

/* Copies the totals since hvd_init (or the last reset) into *out; with
 * reset 1 they are zeroed after. Groups count once their completion was
 * seen (hvd_wait returned). Any thread. HVD_ERR_INVALID_ARG "hvd_gpu_timing:
 * out is NULL"; HVD_ERR_UNSUPPORTED "hvd_gpu_timing: hvd was built without
 * CUDA"; HVD_ERR_NOT_INITIALIZED before hvd_init; HVD_ERR_INVALID_ARG
 * "hvd_gpu_timing: HVD_GPU_TIMING is not set (1 turns device group timing
 * on)". hvd_shutdown logs the totals at info level (HVD_LOG_LEVEL=info):
 * "GPU timing: N groups, busy B s, idle between groups I s, of which hvd's
 * lag L s (max M ms)". */
hvd_result_t hvd_gpu_timing(hvd_gpu_timing_t *out, int reset);

/* ---- Requests ---------------------------------------------------------- */

/* Blocks until req completes (without using the CPU), frees it and returns
 * its result; on failure hvd_last_error() has the message. */
hvd_result_t hvd_wait(hvd_request_t *req);

/* Sets *done. When *done is 1 the request has been freed and the return
 * value is its result, as from hvd_wait; when 0 it returns HVD_SUCCESS. */
hvd_result_t hvd_test(hvd_request_t *req, int *done);

/* Orders the work enqueued next on `stream` (a cudaStream_t of the
 * result's device; NULL: this thread's hvd_cuda_stream()) after req's
 * device result, without waiting for the device: as DDP's work.wait() and
 * llm.c's event between its NCCL and compute streams. Returns once req's
 * collective is enqueued on hvd's stream (the host waits for the ranks to
 * agree on it, not for the GPU), or at once when it has completed; with
 * the host-staged executor (HVD_GPU_OPERATIONS=mpi), which completes its
 * collectives on the host, that is when it has completed. req stays the
 * caller's, to hvd_wait or hvd_test as usual (which then frees it; until
 * then its result may not be complete on the host). A request that
 * failed returns its error here too (req not freed); a host tensor's is
 * HVD_ERR_INVALID_ARG; a build without CUDA HVD_ERR_UNSUPPORTED. */
hvd_result_t hvd_cuda_stream_wait(hvd_request_t *req, void *stream);

/* ---- Synchronized batch normalization (lib/optim) -----------------------
 * torch.nn.SyncBatchNorm and Horovod's SyncBatchNorm in training mode:
 * batch statistics over the batches of all ranks together, so that small
 * per-rank batches normalize as one big one. x is a host tensor [N, C] or
 * [N, C, ...] (NCHW: each channel's values are its N x H x W entries),
 * float32, float16 or bfloat16; the statistics, weight, bias and running
 * buffers are float32 [C] (accumulated in double). Ranks may hold
 * different N, 0 included, and must all call (collectives named
 * "hvd.sync_bn.<name>.stats" and ".grad"); ranks with different C get
 * HVD_ERR_MISMATCH naming them. Device tensors (the rank's GPU): x and
 * y, dy, dx on it, and weight, bias, the running buffers, save_mean,
 * save_invstd, dweight and dbias device memory [C] on it too; the sums are
 * kernels, the per-channel [C] arithmetic runs on the host, and the call
 * has finished with the device when it returns. The device work runs on
 * the calling thread's stream (hvd_cuda_set_stream; the legacy default
 * stream when none is set), after what was enqueued there (the
 * collectives' "Device ordering"), and its scratch is kept between calls:
 * no cudaMalloc or cudaFree per call, each of which would wait for the
 * whole device (a gradient reduction in flight included). */

/* y = (x - mean) / sqrt(var + eps) * weight + bias per channel, with mean
 * and (biased) var over every rank's batch; weight and bias NULL mean 1
 * and 0. running_mean/running_var (both or neither) become
 * (1 - momentum) * old + momentum * batch value, the variance unbiased
 * (n / (n - 1)), as torch. save_mean and save_invstd (may be NULL) get
 * the batch mean and 1 / sqrt(var + eps) for the backward. Fewer than 2
 * values per channel over all ranks is HVD_ERR_INVALID_ARG on every rank.
 * y may be x (in place), but the backward needs the forward's input: run
 * in place only when there will be no backward (evaluation), or keep a
 * copy of x for it. */
hvd_result_t hvd_sync_batch_norm_forward(
    const char *name, const hvd_tensor_t *x, const float *weight,
    const float *bias, float *running_mean, float *running_var, double momentum,
    double eps, hvd_tensor_t *y, float *save_mean, float *save_invstd);

/* From dy (x's shape and dtype): dx (may be NULL; may be dy) over the
 * global batch, and this rank's share of the parameter gradients ADDED
 * into dweight and dbias (may be NULL): sum(dy * xhat) and sum(dy) over
 * its own samples, which the distributed optimizer then reduces like any
 * gradient. weight as in the forward; save_mean/save_invstd from it. x is
 * the forward's input as it was (xhat = (x - save_mean) * save_invstd):
 * after an in-place forward x holds y, and the gradients would be wrong
 * without an error; pass the copy kept before the forward. */
hvd_result_t
hvd_sync_batch_norm_backward(const char *name, const hvd_tensor_t *x,
                             const hvd_tensor_t *dy, const float *weight,
                             const float *save_mean, const float *save_invstd,
                             hvd_tensor_t *dx, float *dweight, float *dbias);

/* The same over process set ps's ranks (torch's SyncBatchNorm with
 * process_group=, e.g. the ranks of a node): the batch is its members'
 * samples together, and the collectives are the set's. Collective over
 * the set's members; any other rank gets HVD_ERR_INVALID_ARG
 * ("hvd_ps_sync_batch_norm_forward: rank 3 is not in process set 1"). */
hvd_result_t hvd_ps_sync_batch_norm_forward(
    const hvd_process_set_t *ps, const char *name, const hvd_tensor_t *x,
    const float *weight, const float *bias, float *running_mean,
    float *running_var, double momentum, double eps, hvd_tensor_t *y,
    float *save_mean, float *save_invstd);
hvd_result_t hvd_ps_sync_batch_norm_backward(
    const hvd_process_set_t *ps, const char *name, const hvd_tensor_t *x,
    const hvd_tensor_t *dy, const float *weight, const float *save_mean,
    const float *save_invstd, hvd_tensor_t *dx, float *dweight, float *dbias);

/* ---- Optimizers (lib/optim) --------------------------------------------- *
 * Parameters are float32 tensors (or float16/bfloat16: mixed precision,
 * below), on the host or on the rank's GPU, each
 * parameter on its own: one list may mix them. A parameter's value and
 * grad are on the same device. A device parameter follows the collectives'
 * rule: its device must be hvd_cuda_device() (before hvd_init, or with
 * HVD_NO_BIND=1, the calling thread's current device), else the create
 * call fails with HVD_ERR_INVALID_ARG ("hvd_sgd_create: param 'w' value is
 * on cuda:1 but this rank uses cuda:0"); a build without CUDA refuses it
 * with HVD_ERR_UNSUPPORTED ("... is on cuda:0 but this build has no
 * CUDA"). A device parameter's optimizer state lives on its device; the
 * built-ins update all device parameters with one kernel launch (the
 * host's math, bit for bit) on a stream of the optimizer's own, while the
 * host parameters are updated on the CPU. Device gradients follow the
 * collectives' "Device ordering": hvd_optimizer_step and
 * hvd_optimizer_grad_ready order their device work (reductions, the
 * float32 copies of reduce_fp32, PowerSGD, the update) after what the
 * calling thread's stream (hvd_cuda_set_stream) has enqueued, on the
 * device, so a gradient may be handed over while the kernels that write
 * it are still queued (synchronising first still works);
 * hvd_optimizer_zero_grad zeroes after it too, and a mixed-precision
 * optimizer's creation reads the values for its masters after it; every
 * optimizer call that touches device memory (create, step, zero_grad) has
 * finished with it when it returns, so the caller may read values on any
 * stream.
 *
 * Gradients ACCUMULATE in param.grad between hvd_optimizer_zero_grad()
 * calls, as in PyTorch: a backward pass adds into them. The optimizer
 * borrows the params array and its tensors: they must outlive it and keep
 * their shapes and devices. Optimizer calls are not thread-safe: one
 * thread drives one optimizer. Several optimizers may step at once, each
 * on its own thread (a GAN's generator and discriminator): every
 * collective of a distributed optimizer's step is named after its own
 * parameters ("hvd.grad.<name>"; "<kind>.<first parameter's name>" for
 * the hyperparameter check, loss scaling's inf/NaN agreement and a
 * sharded step's clipping and LAMB norms), so give the optimizers
 * parameters of different names. The broadcasts, verification,
 * checkpoints and hvd_state of optimizers or parameters use fixed names
 * within their process set: on one set, run them from one thread at a
 * time. */

typedef struct hvd_param {
  const char *name;   /* identifies it across ranks and in checkpoints */
  hvd_tensor_t value; /* float32, or float16/bfloat16 (mixed precision) */
  hvd_tensor_t grad;  /* value's dtype and shape */
} hvd_param_t;

typedef struct hvd_optimizer hvd_optimizer_t;

/* Mixed precision (lib/optim/mixed.c), as apex's and DeepSpeed's: a
 * parameter's value and grad may be float16 or bfloat16 (one dtype for
 * both), on the host or the GPU. The optimizer then keeps a float32
 * master copy of that value (made from it at create) and float32 state;
 * each step converts the gradient to float32 (unscaled, below), updates
 * the master with the same math as a float32 parameter's, and writes the
 * master back into the value rounded to nearest even. float32 parameters
 * behave exactly as before, bit for bit; a list may mix dtypes.
 * A distributed optimizer reduces such gradients in their own dtype, or
 * with reduce_fp32 = 1 converted to float32 first (compression then
 * applies to them); checkpoints hold the master weights, so a file saved
 * from a bfloat16 model is a float32 model's file (it loads into either
 * with its optimizer, at any world size; without an optimizer only into
 * float32 parameters: a bfloat16 one is refused, "'w' has dtype float32
 * in the file but bfloat16 in the model"), and a float32 file loads into
 * a bfloat16 model's masters (the values are the masters rounded). A
 * float16 model loads float32 values beyond float16's range (|x| >=
 * 65520) as it would round them in a step: the master keeps the file's
 * value and the parameter's value is +-inf (as torch's load_state_dict
 * into a .half() model); a file from a float32 run wants a look at its
 * range first. With
 * shard_optimizer_state the masters, the optimizer state and the
 * gradients are sharded (DeepSpeed's ZeRO-1 with float32 partitions): a
 * block's gradient is scattered in its dtype (or float32 with
 * reduce_fp32), each rank keeps and updates only its block of each
 * master, rounds it into its block of the value, and the values are
 * allgathered in their own dtype. On one node the results equal the
 * unsharded optimizer's bit for bit; over several nodes up to float
 * rounding (a reducescatter folds in rank order, an allreduce node by
 * node: see the reproducibility note). No rank but 0 ever holds a whole
 * master: a
 * checkpoint save sends each rank's blocks of the masters and the state
 * to rank 0, a load rounds each piece of a master into the value as it
 * arrives and keeps the rank's block, hvd_state copies each rank's
 * blocks, and hvd_broadcast_optimizer_state has nothing to send but the
 * scalars. hvd_optimizer_state_bytes counts the
 * masters (4 bytes an
 * element of this rank's part) with the state.
 * A master is made from its value when the optimizer is made. When
 * hvd_broadcast_parameters later writes a value, each element of every
 * live optimizer's master that no longer rounds to the written value
 * becomes that value (elsewhere the master keeps the precision the value
 * lacks), so broadcasting after creating the optimizer, as Horovod's
 * examples do, starts every rank from root's values.
 * hvd_broadcast_optimizer_state sends root's masters too. A value
 * changed by other means after the optimizer was made is overwritten by
 * the next step's rounded master.
 *
 * Loss scaling (torch.cuda.amp.GradScaler's rules), needed for float16
 * (bfloat16 has float32's exponent range and needs none): the caller
 * multiplies its loss by hvd_optimizer_loss_scale() before backward; the
 * step multiplies every gradient by 1 / scale as it converts it (float32
 * ones in place), before the update and before anything else looks at
 * it. A step whose gradients hold an inf or a NaN on any rank is skipped
 * on every rank (the ranks agree in one tiny MAX allreduce, named
 * "hvd.loss_scale.found_inf.<first parameter's name>", in the step of a
 * distributed optimizer, no-sync steps too: hvd_optimizer_set_sync): no
 * update, no state change, hvd_optimizer_steps unchanged,
 * hvd_optimizer_step_skipped 1, and the scale times backoff_factor. After
 * growth_interval steps in a row without one, the scale grows by
 * growth_factor. The scale and the count of clean steps are checkpointed
 * (the counters "hvd.loss_scale" and "hvd.loss_scale.clean"). */
typedef struct hvd_loss_scale_options {
  double init_scale;       /* 65536 (2^16) */
  double growth_factor;    /* 2 (> 1; 1 with backoff 1: a fixed scale) */
  double backoff_factor;   /* 0.5 (in (0, 1]) */
  int64_t growth_interval; /* 2000 (>= 1) */
} hvd_loss_scale_options_t;

void hvd_loss_scale_options_init(hvd_loss_scale_options_t *o);
/* Turns loss scaling on (o NULL: the defaults) on any optimizer, plain or
 * distributed; HVD_ERR_INVALID_ARG naming an option out of range. */
hvd_result_t hvd_optimizer_set_loss_scaling(hvd_optimizer_t *opt,
                                            const hvd_loss_scale_options_t *o);
/* The scale to multiply the loss by: 1 without loss scaling, NAN for
 * NULL. */
double hvd_optimizer_loss_scale(const hvd_optimizer_t *opt);
/* 1 when the last hvd_optimizer_step returned HVD_SUCCESS having found
 * an inf or NaN and skipped its update; 0 otherwise: after a step that
 * updated, a step that failed (its error says why), and after the
 * optimizer's state was restored (hvd_checkpoint_load with it,
 * hvd_state_restore, hvd_broadcast_optimizer_state), which no step of
 * the restored state has followed yet; 0 for NULL. */
int hvd_optimizer_step_skipped(const hvd_optimizer_t *opt);

/* Per-parameter weight decay, what torch's parameter groups are mostly
 * for (BERT's and GPT's recipes: {"params": no_decay, "weight_decay":
 * 0.0} for the biases and LayerNorm weights): parameter i of a built-in
 * optimizer (SGD, Adam, AdamW, LAMB; plain or distributed, whose index is
 * its base's) takes weight_decay instead of its options' (SGD's and Adam's
 * L2 term, AdamW's and LAMB's decoupled decay alike; LAMB's trust ratio
 * follows it), from the next step on; NAN puts
 * the options' back. Parameters with the same decay are updated as one
 * group: the same bits as an optimizer made with that weight_decay, one
 * batched device launch per distinct pair of decay and learning rate
 * (LAMB: one for all). Checkpointed: a save keeps it and a load sets
 * it (NAN in the file unsets the program's), as torch's param_groups
 * in optimizer.state_dict(). HVD_ERR_INVALID_ARG for i out of range or
 * weight_decay not in [0, inf) and not NAN; HVD_ERR_UNSUPPORTED for a custom
 * optimizer
 * ("... optimizer 'X' is a custom one: its step reads its own options").
 * hvd_optimizer_param_weight_decay: parameter i's decay now (NAN for NULL,
 * a custom optimizer or i out of range). */
hvd_result_t hvd_optimizer_set_param_weight_decay(hvd_optimizer_t *opt, int i,
                                                  double weight_decay);
double hvd_optimizer_param_weight_decay(const hvd_optimizer_t *opt, int i);

/* Per-parameter learning rate, torch's parameter groups' other use
 * (layer-wise learning-rate decay when fine-tuning BERT, a new head
 * trained faster than its backbone): parameter i of a built-in optimizer
 * (plain or distributed, its base's index) takes scale times the
 * optimizer's learning rate (hvd_optimizer_set_lr's, so a schedule moves
 * every group alike, as torch's schedulers scale each group's own lr),
 * from the next step on; NAN puts 1 back. Everything that the learning
 * rate scales follows it: SGD's step, Adam's step size, AdamW's
 * decoupled decay (1 - lr * scale * wd), LAMB's step (lr * scale times
 * |w| / |u|). A
 * parameter updates as under an optimizer made with lr * scale (the
 * same double) and its decay, bit for bit; the device updates are one
 * batched launch per distinct pair of decay and rate. Checkpointed,
 * as the weight decay above. HVD_ERR_INVALID_ARG for i out of range or scale
 * not in [0, inf) and not NAN ("... scale -1 is out of range [0, inf) (NAN: 1,
 * the optimizer's learning rate)"); HVD_ERR_UNSUPPORTED for a custom
 * optimizer, as above. hvd_optimizer_param_lr_scale: parameter i's
 * scale now (1 where none was set; NAN for NULL, a custom optimizer or
 * i out of range). */
hvd_result_t hvd_optimizer_set_param_lr_scale(hvd_optimizer_t *opt, int i,
                                              double scale);
double hvd_optimizer_param_lr_scale(const hvd_optimizer_t *opt, int i);

/* Gradient clipping by the global norm (lib/optim/clip.c), what
 * torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type) does
 * between backward and step, done by every step of opt (plain or
 * distributed) where the gradients are final: after the reductions, and
 * after loss scaling's unscale and inf/NaN check (a skipped step clips
 * nothing). The norm of all the parameters' gradients together,
 * norm_type 2 (Euclidean, over every element) or INFINITY (the largest
 * magnitude); when max_norm / (norm + 1e-6) is below 1, every gradient
 * is multiplied by it (rounded to float32 once), in place, before the
 * update: a float32 parameter's grad, a float16/bfloat16 one's float32
 * master gradient (its grad is left alone).
 * - Squares are summed in double in one order (chunks of 16384 elements,
 *   then the parameters in order), the same on the host and the GPU: a
 *   run repeats bit for bit, and device parameters clip as host ones.
 * - Distributed: every rank holds the same averaged gradients and
 *   computes the same norm, with no communication. Sharded
 *   (shard_optimizer_state) each rank holds its blocks, and one
 *   allreduce of a double, "hvd.clip.norm.<first parameter's name>",
 *   makes the total (summed in
 *   other groups than the unsharded norm: the same to a double's
 *   rounding, and the same coefficient once rounded to float32 unless
 *   that rounding is a tie between them).
 * - An inf or a NaN in a gradient makes the norm non-finite; the step
 *   then fails, nothing updated (torch would scale every gradient to
 *   NaN): HVD_ERR_INVALID_ARG "hvd_optimizer_step: gradient clipping: the
 *   gradient norm is not finite (parameter 'w' holds an inf or a NaN);
 *   nothing was updated". Distributed, on every rank alike (sharded: the
 *   lowest rank whose blocks hold it names the parameter, " (on rank R)"
 *   added when R is not 0; a rank that could not compute its part fails
 *   them all with its own message); in no-sync mode each rank's own
 *   gradients decide. With loss scaling such a step is skipped before
 *   clipping, as GradScaler's.
 * max_norm 0 turns clipping off; INFINITY measures the norm and clips
 * nothing (torch's clip_grad_norm_(params, inf), to log it); otherwise
 * max_norm must be positive, and norm_type 2 or INFINITY:
 * HVD_ERR_INVALID_ARG naming the value. max_norm and norm_type are
 * checkpointed: a load into an optimizer that clips sets them from the
 * file; whether it clips stays the program's (a load neither turns
 * clipping on nor off). */
hvd_result_t hvd_optimizer_set_grad_clipping(hvd_optimizer_t *opt,
                                             double max_norm, double norm_type);
/* The last step's gradient norm before clipping (what clip_grad_norm_
 * returns, to log): NAN before the first clipped step, after a failed
 * or skipped step, after a restore of the optimizer's state (as
 * hvd_optimizer_step_skipped), without clipping, and for NULL. */
double hvd_optimizer_grad_norm(const hvd_optimizer_t *opt);

/* A user optimizer. hvd allocates, for every parameter, `nstate` state
 * tensors of the parameter's shape, zero-filled, named by state_names
 * (they are broadcast and checkpointed like the built-ins' state), on the
 * parameter's device: for a device parameter they are device tensors
 * (cudaMalloc'd, device = the parameter's), which step() updates with its
 * own kernels or copies. Its device work must be complete when step()
 * returns (synchronise its stream); hvd's own work on the gradients
 * (reductions, zero_grad, no-sync scaling) is complete when step() is
 * called. step()
 * applies one update to every parameter from its grad; `state` holds
 * n * nstate tensors, parameter i's at state[i * nstate + k]; `step` is the
 * 1-based count of updates including this one; `lr` the current learning
 * rate. destroy(ctx), if not NULL, runs at hvd_optimizer_destroy. */
typedef struct hvd_optimizer_ops {
  const char *name;
  int nstate;
  const char *const *state_names;
  hvd_result_t (*step)(void *ctx, hvd_param_t *params, int n,
                       hvd_tensor_t *state, int64_t step, double lr);
  void (*destroy)(void *ctx);
} hvd_optimizer_ops_t;

/* SGD as in torch.optim.SGD: d = grad + weight_decay * value; with
 * momentum, buf = momentum * buf + (1 - dampening) * d (buf = d on the
 * first step) and d = nesterov ? d + momentum * buf : buf; then
 * value -= lr * d. State: "momentum_buffer" when momentum != 0. */
typedef struct hvd_sgd_options {
  double lr, momentum, dampening, weight_decay;
  int nesterov;
} hvd_sgd_options_t;

/* Adam (decoupled = 0, weight decay added to the gradient) and AdamW
 * (decoupled = 1: value *= 1 - lr * weight_decay first), both with bias
 * correction, as torch.optim.Adam/AdamW. State: "exp_avg", "exp_avg_sq". */
typedef struct hvd_adam_options {
  double lr, beta1, beta2, eps, weight_decay;
  int decoupled;
} hvd_adam_options_t;

/* LAMB (You et al., "Large Batch Optimization for Deep Learning"), the
 * large-batch BERT optimizer, as apex's FusedLAMB (adam_w_mode, gradient
 * averaging): per parameter, m = beta1 m + (1 - beta1) g, s = beta2 s +
 * (1 - beta2) g^2, u = (m / bc1) / (sqrt(s / bc2) + eps) +
 * weight_decay * value (bc1 = 1 - beta1^t and bc2 = 1 - beta2^t with
 * bias_correction, else 1), then value -= lr * (|value| / |u|) * u: the
 * trust ratio of the parameter's Euclidean norms, lr alone where either
 * norm is 0, and where the parameter's weight decay is 0 unless
 * always_adapt (apex's use_nvlamb). State: "exp_avg", "exp_avg_sq".
 * - apex clips the gradients to a global norm of 1 inside the step (its
 *   max_grad_norm); here that is hvd_optimizer_set_grad_clipping(opt, 1,
 *   2), which runs before the update.
 * - The norms are sums of squares in double in a fixed order (gradient
 *   clipping's chunks), the same on the host and the GPU: a run repeats
 *   bit for bit, and device parameters update as host ones.
 * - Distributed and sharded (shard_optimizer_state), each rank's blocks
 *   give parts of every norm: one allreduce of 2 n doubles,
 *   "hvd.lamb.norms.<first parameter's name>", makes the totals. Not
 *   sharded, every rank holds the
 *   same gradients and computes the same norms alone.
 * - A non-finite norm fails the step with nothing updated (apex would
 *   write NaN into the parameter): HVD_ERR_INVALID_ARG
 *   "hvd_optimizer_step: LAMB: the update of parameter 'w' is not finite
 *   (an inf or a NaN in its gradient); nothing was updated", or "...:
 *   LAMB: parameter 'w' holds an inf or a NaN; nothing was updated";
 *   sharded, on every rank alike (" (on rank R)" added for the lowest
 *   rank whose blocks hold it, when R is not 0). Loss scaling skips such
 *   a step before the update, as for every optimizer.
 * A device step waits for its norms (one copy to the host per step). */
typedef struct hvd_lamb_options {
  double lr, beta1, beta2, eps, weight_decay;
  int bias_correction; /* 1 (default): divide by 1 - beta^t */
  int always_adapt;    /* 0 (default): no trust ratio where decay is 0 */
} hvd_lamb_options_t;

/* Defaults: SGD lr 0.01, others 0; Adam lr 0.001, betas 0.9/0.999,
 * eps 1e-8, weight decay 0 (AdamW: set decoupled and e.g. 0.01); LAMB
 * apex's: lr 0.001, betas 0.9/0.999, eps 1e-6, weight decay 0.01, bias
 * correction. */
void hvd_sgd_options_init(hvd_sgd_options_t *o);
void hvd_adam_options_init(hvd_adam_options_t *o);
void hvd_lamb_options_init(hvd_lamb_options_t *o);

/* Each creates an optimizer over params[0..n) (borrowed) into *out; free
 * it with hvd_optimizer_destroy. These need no hvd_init(). A custom
 * optimizer starts at learning rate 0: set it with hvd_optimizer_set_lr.
 * The first step after creation needs no hvd_optimizer_zero_grad. */
hvd_result_t hvd_sgd_create(hvd_param_t *params, int n,
                            const hvd_sgd_options_t *o, hvd_optimizer_t **out);
hvd_result_t hvd_adam_create(hvd_param_t *params, int n,
                             const hvd_adam_options_t *o,
                             hvd_optimizer_t **out);
hvd_result_t hvd_lamb_create(hvd_param_t *params, int n,
                             const hvd_lamb_options_t *o,
                             hvd_optimizer_t **out);
hvd_result_t hvd_optimizer_custom(hvd_param_t *params, int n,
                                  const hvd_optimizer_ops_t *ops, void *ctx,
                                  hvd_optimizer_t **out);

/* Gradient compression. FP16 and BF16 cast on the wire (the cast is fused
 * into the copies). POWERSGD is PyTorch DDP's powerSGD_hook (Vogels et
 * al., 2019): see hvd_powersgd_options_t. */
typedef enum hvd_compression {
  HVD_COMPRESS_NONE = 0,
  HVD_COMPRESS_FP16 = 1,
  HVD_COMPRESS_BF16 = 2,
  HVD_COMPRESS_POWERSGD = 3
} hvd_compression_t;

/* PowerSGD, as DDP's PowerSGDState. A gradient of two or more dimensions
 * is viewed as a matrix M of n = shape[0] rows and m = numel / n columns;
 * with r = min(rank, n, m) it is compressed when r (n + m) times
 * min_compression_rate is below n m, else (and every gradient of one
 * dimension) it is all-reduced whole, as without compression. Each step,
 * for a compressed M (this rank's gradient plus its error feedback):
 *   P = M Q, all-reduced (a sum); P orthonormalised by Gram-Schmidt (a
 *   column of norm 0 stays 0); Q = M^T P, all-reduced; the gradient
 *   becomes P Q^T times the op's factor (HVD_AVERAGE: the mean), and the
 *   error feedback M - P Q^T / size.
 * Q starts as normal random values from seed, the same on every rank;
 * with warm_start the next step starts from this step's mean Q. Two small
 * all-reductions, of r (n + m) values, replace one of n m. Until the
 * optimizer has taken start_step steps every gradient is all-reduced
 * whole (DDP's start_powerSGD_iter: the early steps are the ones low
 * rank approximates worst). A step whose P or Q is not finite (an
 * overflow under fp16 loss scaling) leaves a non-finite gradient, which
 * loss scaling skips, and keeps the error feedback and draws a new Q.
 * With wire float16 or bfloat16, P, Q and the gradients averaged whole
 * travel so (DDP's fp16_compress_wrapper(powerSGD_hook)); the arithmetic
 * stays float32. Float32 gradients (or reduce_fp32's copies) of the
 * compressed parameters, on the host or the rank's GPU (there the products are
 * kernels on the optimizer's stream, the same bits as the host's; P and Q
 * are copied to the host for Gram-Schmidt); no sharding, no op
 * HVD_ADASUM. Checkpoints hold the state (their PowerSGD section): the
 * ranks' mean error feedback (what the averaged gradient still owes; the
 * result depends on the ranks' errors only through their sum), the warm
 * start's Q and the count of Qs drawn. A load gives every rank that mean,
 * at any world size: the resumed run is the uninterrupted one to rounding
 * (bit for bit at one rank). A file without the state (saved without
 * PowerSGD) starts it afresh: zero error, a new Q.
 * hvd_state's in-memory commits keep each rank's own error, exactly. */
typedef struct hvd_powersgd_options {
  int rank;                    /* r >= 1 (default 1) */
  int64_t start_step;          /* >= 0 (default 1000) */
  double min_compression_rate; /* >= 0 (default 2) */
  int error_feedback;          /* 1 (default) or 0 */
  int warm_start;              /* 1 (default) or 0 */
  uint64_t seed;               /* Q's random values (default 0) */
  hvd_dtype_t wire;            /* HVD_FLOAT32 (default), HVD_FLOAT16 or
                                  HVD_BFLOAT16: what P, Q and the whole
                                  gradients travel as (DDP's
                                  fp16_compress_wrapper and
                                  bf16_compress_wrapper, but the
                                  arithmetic stays float32) */
} hvd_powersgd_options_t;

/* Post-local SGD, as DDP's post_localSGD_hook with PostLocalSGDOptimizer
 * and PeriodicModelAverager (Lin et al., "Don't Use Large Mini-Batches,
 * Use Local SGD", 2020). Until the optimizer has taken start_step steps,
 * gradients are reduced over all ranks as without it. From then on each
 * step reduces them only within group (DDP's subgroup, e.g. the ranks of
 * one node: hvd_process_set_split_node; the op's average is over the group),
 * or not at all when group is NULL, and updates locally; after the
 * update of step c (counting from 0), when (c - start_step) % period is
 * 0, every parameter (a mixed-precision one's float32 master) is averaged
 * over all ranks ("hvd.lsgd.<name>"), so the first local step ends
 * averaged, then every period-th (a step that loss scaling skips for an
 * inf is no step: it neither counts nor averages, as DDP's averager is
 * not called when GradScaler skips). Between averages the ranks' parameters
 * differ: a checkpoint saves rank 0's, and hvd_verify_parameters finds
 * the difference; the optimizer state (momentum, Adam's moments) stays
 * each rank's own, as DDP's does. Each rank may pass its own group (one
 * it is a member of; HVD_ERR_INVALID_ARG otherwise). A no-sync step
 * (hvd_optimizer_set_sync 0) reduces and averages nothing (but for loss
 * scaling's inf/NaN agreement, as every step with it). The
 * distributed optimizer's creation and destruction stay local (the group
 * is yours to create and destroy, after the optimizer). Not with sharding,
 * compression or op HVD_ADASUM (HVD_ERR_UNSUPPORTED). Host and device
 * parameters. */
typedef struct hvd_local_sgd_options {
  int period;                     /* >= 1; 0 (default): off */
  int64_t start_step;             /* >= 0 (default 0) */
  const hvd_process_set_t *group; /* NULL (default): no reduction */
} hvd_local_sgd_options_t;

typedef struct hvd_distributed_options {
  hvd_op_t op;                          /* HVD_AVERAGE (default), HVD_SUM, or
                                           HVD_ADASUM (Horovod's
                                           op=hvd.Adasum: float32 gradients,
                                           host or GPU, or reduce_fp32; no
                                           compression, sharding or
                                           predivision) */
  hvd_compression_t compression;        /* default HVD_COMPRESS_NONE */
  int backward_passes_per_step;         /* k >= 1 (default 1) */
  int average_passes;                   /* 1 (default): divide the k accumulated
                                           passes by k; 0: sum them */
  double gradient_predivide_factor;     /* f (default 1): gradients are divided
                                           by f before the sum and by size/f
                                           after (average) */
  int shard_optimizer_state;            /* 1: ZeRO stage 1 (default 0): each
                                           rank keeps the optimizer state of
                                           its 1/size block of every parameter;
                                           see below */
  int reduce_fp32;                      /* 1: float16/bfloat16 gradients are
                                           converted to float32 and reduced so
                                           (default 0: in their own dtype) */
  hvd_powersgd_options_t powersgd;      /* compression HVD_COMPRESS_POWERSGD */
  hvd_local_sgd_options_t local_sgd;    /* off unless period >= 1 */
  int check_hparams;                    /* 1 (default): each reducing step
                                           checks that the ranks' optimizers
                                           agree (below); 0: off */
  const hvd_process_set_t *process_set; /* NULL (default): the world;
                                        else the set the gradients are
                                        averaged over (below) */
  int num_groups;                       /* Horovod's groups=k: k >= 1 splits
                                           the parameters, in order, into k
                                           groups of consecutive ones (below);
                                           0 (default): none */
  const int *groups;                    /* Horovod's groups=[[...], ...]: one
                                           entry per parameter, its group id
                                           (>= 0) or -1 for none; NULL
                                           (default). Not with num_groups */
} hvd_distributed_options_t;

void hvd_distributed_options_init(hvd_distributed_options_t *o);

/* Wraps base (taking ownership: destroying the wrapper destroys base) so
 * that gradients are reduced across ranks through hvd's engine (fused,
 * overlapped with backward) before each update. Needs hvd_init(). Each
 * rank's wrapper reduces tensors named "hvd.grad.<param name>". Device
 * gradients go through the device executors (NCCL, or host-staged MPI
 * with HVD_GPU_OPERATIONS=mpi), host ones through MPI; ranks must agree on
 * host versus device per parameter.
 *
 * Ranks that update the same averaged gradients with different
 * hyperparameters drift apart in silence (a schedule fed a rank's own
 * count, a setting read differently, a restore on one rank, a rank that
 * joined early and missed updates). So each step that reduces also
 * all-reduces a digest of the optimizer's: its learning rate, update
 * count, options (momentum, betas, eps, weight decay, ...), each
 * parameter's learning-rate scale and weight decay in effect, loss
 * scaling's scale, count and options, clipping's max_norm and norm_type,
 * and which optimizer it is with loss scaling and clipping on or off.
 * It is one 16-byte MAX allreduce, "hvd.hparams.<first parameter's
 * name>", submitted with the step's last gradients and negotiated in the
 * same cycle (within the local-SGD group on its local steps; a no-sync
 * step checks nothing). Where the ranks differ, the step fails on every
 * rank with HVD_ERR_MISMATCH after its reductions, nothing updated and
 * no update counted, naming the first thing that differs, rank 0's value
 * (the group's lowest rank) and the ranks that differ with theirs:
 * "hvd_optimizer_step: the ranks' optimizers differ in lr: rank 0 0.125
 * vs rank 1 0.25; nothing was updated (each rank must set the same;
 * hvd_broadcast_optimizer_state gives every rank root's, the update
 * count included)" (likewise "momentum: ...", "update count: rank 0 1
 * vs rank 3 0", "the learning-rate scale of parameter 'b': ...", "loss
 * scaling: rank 0 on vs rank 1 off"). A custom optimizer's own options
 * are not seen; the rest is. It costs about 20 us a step on a 2-core
 * machine's shared memory (doc/bench.md, "optim"): nothing at BERT-mini's
 * 16 ms step, 6-9 % of a 0.3 ms one; check_hparams = 0 turns it off.
 *
 * process_set (Horovod's DistributedOptimizer(process_set=...)): the
 * data-parallel group of a model split across ranks, e.g. pipeline stage
 * s's replicas as one set per stage (hvd_process_set_split(s)); each
 * stage's optimizer then averages its own parameters' gradients among the
 * ranks that hold them. Only the set's members make the optimizer (any
 * other rank: HVD_ERR_INVALID_ARG "hvd_distributed_optimizer:
 * process_set: rank 3 is not in process set 1"); the set must outlive it.
 * Everything the optimizer does collectively happens within the set, on
 * its engine and communicators: the gradients (averaged over the set's
 * size), the hyperparameter check, loss scaling's inf/NaN agreement,
 * clipping's and LAMB's norms, PowerSGD, ZeRO-1's blocks (by the set's
 * size and rank), local SGD's periodic averages (local_sgd.group must lie
 * within the set), and the calls given the optimizer:
 * hvd_broadcast_optimizer_state (root counted within the set, as
 * hvd_ps_broadcast's), hvd_checkpoint_save/_save_async/_load and
 * hvd_state's commit and restore (the set's first rank writes and reads
 * the file: give each set its own path). Sets may run their optimizers
 * at the same time, on their own. Messages name world ranks. The
 * parameters' broadcast and check: hvd_ps_broadcast_parameters and
 * hvd_ps_verify_parameters.
 *
 * num_groups and groups (Horovod's groups=): explicit gradient groups.
 * num_groups k splits the parameters in their order into k groups of
 * consecutive ones (as Horovod's split: the first n % k one longer; k
 * above n is one per parameter); groups gives each parameter its group
 * id (any ids >= 0; -1: none). A group's gradients are reduced as one
 * grouped allreduce (hvd_grouped_allreduce_async), submitted once its
 * last member's gradient is ready (hvd_optimizer_grad_ready) or at the
 * step: negotiated as one, fused together, and from the second step on
 * agreed by the response cache. The values are the same as without
 * groups, bit for bit. Ranks must form the same groups (else the step
 * fails with HVD_ERR_MISMATCH naming the group field and "(the ranks'
 * distributed optimizers differ in num_groups or groups)"). Not with
 * shard_optimizer_state, PowerSGD or op HVD_ADASUM; with fp16/bf16
 * compression only on float32 gradients (or reduce_fp32)
 * (HVD_ERR_UNSUPPORTED). */
hvd_result_t hvd_distributed_optimizer(hvd_optimizer_t *base,
                                       const hvd_distributed_options_t *o,
                                       hvd_optimizer_t **out);

/* shard_optimizer_state = 1 (DeepSpeed's ZeRO stage 1, torch's
 * ZeroRedundancyOptimizer): every parameter, flattened, is split in
 * blocks as hvd_reducescatter splits rows (rank r: n/size elements, one
 * more if r < n % size); the base's state is kept for this rank's blocks
 * only (hvd_optimizer_state_bytes: about 1/size). Each gradient is
 * reduce-scattered (named hvd.grad.<name>, started by grad_ready as the
 * allreduce would be), the base's update runs on the blocks (its step()
 * must be elementwise, as SGD and Adam are; LAMB, whose norms span a
 * whole parameter, sums its blocks' parts over the ranks), and every
 * parameter is then
 * allgathered (hvd.zero.<name>). Results equal the unsharded optimizer's
 * up to float rounding. A checkpoint save sends every rank's blocks to
 * rank 0 a parameter at a time as it writes them, so rank 0 holds one
 * parameter's full state at most (on the parameter's device); a load
 * writes each rank's blocks straight from the file's bytes (no rank
 * holds the full state); an hvd_state commit copies each rank's
 * blocks; hvd_broadcast_optimizer_state sends the scalars only. Files
 * are the same as unsharded ones and load at any world size, sharded or
 * not. Host and device parameters alike (a device parameter's blocks,
 * state and reduced gradient stay on its GPU); no compression; no no-sync
 * mode; sparse rows only before grad_ready. */

/* Bytes of optimizer state this rank holds (a sharded optimizer: its
 * blocks'; with PowerSGD also its error feedback and Q, 4 (n m + r m)
 * bytes per compressed n x m parameter, 4 r m without error feedback);
 * -1 for NULL. */
int64_t hvd_optimizer_state_bytes(const hvd_optimizer_t *opt);

/* A distributed optimizer's gradient values per step, as DDP's
 * PowerSGDState.compression_stats(): *before, every gradient's elements
 * (what a step reduces uncompressed); *after, the values a step reduces
 * with its compression on (powersgd, from its start_step: r (n + m) per
 * compressed matrix, the others whole; the steps before send *before;
 * without powersgd *after is *before: the casts, fp16 and bf16, and
 * powersgd.wire change bytes, not values). Either pointer may be NULL.
 * HVD_ERR_INVALID_ARG for NULL opt or an optimizer that is not distributed. */
hvd_result_t hvd_optimizer_compression_stats(const hvd_optimizer_t *opt,
                                             int64_t *before, int64_t *after);

/* Distributed only: parameter i's gradient is complete for this backward
 * pass. On the k-th pass since the last step its reduction starts at once,
 * overlapping the rest of backward. */
hvd_result_t hvd_optimizer_grad_ready(hvd_optimizer_t *opt, int i);

/* Sparse rows of parameter i's gradient, such as an embedding lookup's
 * (TensorFlow's IndexedSlices, torch's sparse embedding grads): the
 * gradient viewed as shape[0] rows of numel/shape[0] elements gets
 * values[k * row_len ...] added to row rows[k], for k < nrows, in order
 * (a row may repeat). Host parameters only (HVD_ERR_UNSUPPORTED for a
 * device one); rows outside 0..shape[0]-1 are HVD_ERR_INVALID_ARG naming
 * the entry, and nothing is added. Both arrays are read before it returns.
 *
 * Plain optimizer: added at once. Distributed: if the parameter's
 * reduction has not started, added at once and reduced with the rest;
 * if it has (grad_ready was called on this pass's dense share), kept and
 * allgathered at hvd_optimizer_step, every rank's rows added to the
 * reduced gradient with the same scaling (1/size for the average). So a
 * model whose tied embedding has a dense share ready early in backward
 * (a decoder) hands that over at once and sends only the lookup's rows
 * at the end: an allgather of the batch's rows instead of an allreduce of
 * the whole table after backward. Every rank must make the same calls per
 * parameter and step (collectives "hvd.sparse.<name>.rows"/".values");
 * the sums equal the dense path's up to float rounding order (exactly at
 * one rank). */
hvd_result_t hvd_optimizer_sparse_grad(hvd_optimizer_t *opt, int i,
                                       const int64_t *rows, int64_t nrows,
                                       const float *values);

/* Distributed: starts the reductions not yet started, waits for all, then
 * applies the base update. A failed or mismatched reduction returns its
 * error and leaves every parameter untouched. Plain: applies the update.
 * Calling it again before new gradients (hvd_optimizer_zero_grad, then
 * backward) is HVD_ERR_INVALID_ARG. */
hvd_result_t hvd_optimizer_step(hvd_optimizer_t *opt);

/* Zeroes every gradient. HVD_ERR_INVALID_ARG while reductions are in
 * flight (between grad_ready and step). */
hvd_result_t hvd_optimizer_zero_grad(hvd_optimizer_t *opt);

/* sync 0: no-sync mode, steps use local gradients without any reduction
 * of them (local accumulation; the compute ceiling); 1 (default): reduce.
 * With loss scaling a no-sync step still makes one collective, the inf/NaN
 * agreement (one int32 MAX allreduce, "hvd.loss_scale.found_inf.<first
 * parameter's name>"), so that every rank skips alike and the ranks'
 * scales and update counts stay equal for the synced steps after
 * (deciding alone, a rank's scale and count would part from its peers',
 * and the next synced step would fail the hyperparameter check). So
 * every rank must take as many no-sync steps: one that takes more waits
 * for its peers in that allreduce, and fails with
 * "hvd_optimizer_step: loss scaling's inf/NaN agreement, which every
 * rank's step joins (no-sync steps too: every rank must take as many),
 * failed: ..." when they shut down (or the stall inspector names it).
 * Without loss scaling a no-sync step makes none. */
hvd_result_t hvd_optimizer_set_sync(hvd_optimizer_t *opt, int sync);

hvd_result_t hvd_optimizer_set_lr(hvd_optimizer_t *opt, double lr);
double hvd_optimizer_lr(const hvd_optimizer_t *opt);     /* NAN for NULL */
int64_t hvd_optimizer_steps(const hvd_optimizer_t *opt); /* updates done */
void hvd_optimizer_destroy(hvd_optimizer_t *opt);        /* accepts NULL */

/* ---- Initial state ------------------------------------------------------ */

/* Broadcasts every parameter's value from root (collective, any root),
 * then verifies that every rank holds identical bytes: a checksum per
 * parameter is all-reduced, and a difference is HVD_ERR_CORRUPT naming the
 * first parameter that differs and the ranks. Device values are broadcast
 * on the device; their checksums are computed after a copy to the host.
 * A bad argument on one rank (a parameter without a name, a root out of
 * range) fails every rank with that rank's message, "(on rank R)" added
 * where R is not 0; so does hvd_verify_parameters's and
 * hvd_broadcast_optimizer_state's root. */
hvd_result_t hvd_broadcast_parameters(hvd_param_t *params, int n, int root);

/* Verifies that every rank holds identical parameter values (collective):
 * HVD_ERR_CORRUPT naming the first parameter that differs and the ranks
 * whose bytes differ from the lowest rank's; HVD_ERR_MISMATCH when the
 * ranks' parameter lists (count, names, shapes) differ. */
hvd_result_t hvd_verify_parameters(const hvd_param_t *params, int n);

/* The same within process set ps (Horovod's broadcast_parameters with
 * process_set=): root counted within the set, as hvd_ps_broadcast's;
 * messages name world ranks. Collective over the set's members; any other
 * rank gets HVD_ERR_INVALID_ARG ("hvd_ps_broadcast_parameters: rank 3 is
 * not in process set 1"). */
hvd_result_t hvd_ps_broadcast_parameters(const hvd_process_set_t *ps,
                                         hvd_param_t *params, int n, int root);
hvd_result_t hvd_ps_verify_parameters(const hvd_process_set_t *ps,
                                      const hvd_param_t *params, int n);

/* Broadcasts the optimizer's state tensors from root (allocating them
 * where a rank has none yet), verified the same way, and its
 * hyperparameters, as Horovod's broadcast_optimizer_state sends its
 * param_groups' options: the update count, the learning rate, a built-in's
 * options (momentum, betas, eps, weight decay, nesterov, ...), each
 * parameter's learning-rate scale and weight decay (set or not, as on
 * root), loss scaling's scale, count of clean steps and options, and
 * clipping's max_norm and norm_type: afterwards every rank's optimizer
 * updates as root's (what hvd_optimizer_step checks, see
 * hvd_distributed_optimizer). Which optimizer it is, its parameters and
 * state, and whether loss scaling and clipping are on must already agree:
 * otherwise HVD_ERR_MISMATCH, "hvd_broadcast_optimizer_state: ranks
 * disagree on the optimizer (type, parameters, state, loss scaling and
 * clipping on or off): rank 0 and rank 1 differ in one of them", and
 * nothing changes. A sharded optimizer (shard_optimizer_state) sends the
 * scalars only: each block of its state and masters has one owner, so
 * root's whole state is every rank's already, and no rank is unsharded.
 * A distributed optimizer on a process set (its process_set option):
 * collective over the set, root counted within it. opt NULL on some
 * ranks: HVD_ERR_INVALID_ARG on every rank, "hvd_broadcast_optimizer_state:
 * opt is NULL (on rank 1)" naming the lowest such rank (its own message
 * there), as for any rank's bad argument; the ranks with an optimizer
 * must then have it on the world (a NULL rank knows no set). */
hvd_result_t hvd_broadcast_optimizer_state(hvd_optimizer_t *opt, int root);

/* ---- Checkpoints -------------------------------------------------------- *
 * Format: doc/checkpoint-format.md. Names are kept exactly as given, and a
 * checkpoint written at one world size loads at any other. Parameters and
 * optimizer state may be on the host or the rank's GPU: rank 0 copies
 * device tensors to the host to write them; a load reads into host memory
 * first, then copies to each rank's own GPU. The file does not depend on
 * where the tensors were, so a checkpoint saved from GPU parameters loads
 * into host ones and the reverse. Device tensors follow the collectives'
 * "Device ordering": a save reads them, a load writes them, after what
 * the calling thread's stream (hvd_cuda_set_stream) had enqueued (the
 * host waits for it), so a model written or read by kernels still queued
 * there is saved or loaded whole; the same for hvd_state's copies and
 * the checksums of hvd_broadcast_parameters and hvd_verify_parameters.
 * Given a distributed optimizer on a process set (its process_set
 * option), a save, load or hvd_state commit and restore is collective
 * over that set alone, and "rank 0" below is the set's first rank: each
 * set (a pipeline stage) saves its own file. */

/* Root 0 writes path atomically (temporary file, fsync, rename): a crash
 * leaves the previous file intact. A process saves a path once at a
 * time: a save of a path it is saving already, however spelt (the
 * directory resolved: dir/./a.ckpt is dir/a.ckpt; another process set's
 * whose first rank it is, from another thread, or a background save not
 * waited for) is HVD_ERR_INVALID_ARG on every rank of the set ("...: a
 * save of this path is under way in this process ..."); saves of one
 * path from different processes are each atomic, the last one winning.
 * opt may be NULL; else its state, and
 * its hyperparameters, as torch's optimizer.state_dict() has its
 * param_groups' options: lr, update count, a built-in's options
 * (momentum, betas, eps, weight decay, ...), each parameter's learning
 * rate scale and weight decay, loss scaling's and clipping's options.
 * With PowerSGD, its state too (hvd_powersgd_options_t; the error
 * feedback averaged over the ranks first). Collective. */
hvd_result_t hvd_checkpoint_save(const char *path, const hvd_param_t *params,
                                 int n, const hvd_optimizer_t *opt,
                                 int64_t step);

/* hvd_checkpoint_save with the file written in the background (PyTorch
 * DCP's async_save): the call does the collective part and rank 0 copies
 * the whole file into host memory (device tensors through the host), so
 * the parameters and the optimizer may change as soon as it returns; a
 * thread of rank 0's then takes its checksum, writes, syncs and renames
 * the file as hvd_checkpoint_save does (atomically). Rank 0 keeps the
 * copy's memory (the file's size, on huge pages) from its first
 * background save on, for the next to reuse; a save made while another
 * process set's write still uses it copies into memory of its own, freed
 * once its file is written. *out: the save in flight;
 * hvd_checkpoint_wait(*out), collective, ends it. An error the call finds
 * (arguments, a device copy, memory) is its result on every rank, and
 * *out is NULL. One save at a time per process set (the optimizer's;
 * the world's for opt NULL): any save on that set (either form, and
 * hvd_state's) before the wait is HVD_ERR_INVALID_ARG on every rank of
 * the set ("...: the background save of 'a.ckpt' is not waited for yet
 * (hvd_checkpoint_wait)"). Saves on other sets go on, from other threads
 * too (as two torch process groups' async_save): two sets whose first
 * rank is one process, each saving its own optimizer to its own path at
 * once, both succeed, each file its own set's state. A process that
 * exits with saves in flight finishes their files first. Collective. */
typedef struct hvd_checkpoint_request hvd_checkpoint_request_t;
hvd_result_t hvd_checkpoint_save_async(const char *path,
                                       const hvd_param_t *params, int n,
                                       const hvd_optimizer_t *opt, int64_t step,
                                       hvd_checkpoint_request_t **out);
/* Waits for the write and frees req (NULL: nothing): every rank gets the
 * write's result, as hvd_checkpoint_save's, with the call named
 * hvd_checkpoint_save_async ("...: '/x/a.ckpt': cannot create
 * '/x/a.ckpt.tmp.123': No such file or directory"). Collective (over the
 * optimizer's process set, as the save); after hvd_shutdown, or once
 * that set was destroyed (on every rank, before the wait: the write is
 * rank 0's and outlives the set, as torch's async_save future outlives
 * its process group), rank 0 waits and gets its own result, the others
 * HVD_SUCCESS. */
hvd_result_t hvd_checkpoint_wait(hvd_checkpoint_request_t *req);

/* Rank 0 reads and checks path (magic, version, checksum), every rank
 * receives its outline (names, dtypes, shapes, and every number the load
 * would set, against the range its setter takes: "...: beta1 2 is out
 * of range [0, 1)", HVD_ERR_CORRUPT) and checks it; on any error nothing
 * is changed and the message names what differs. Then the
 * tensors' bytes arrive in broadcasts of at most HVD_CHECKPOINT_PIECE
 * bytes, which rank 0 reads from the file as they go, straight into host
 * tensors: no rank holds the file (a sharded optimizer's rank takes only
 * its blocks of the state). A file rewritten in place meanwhile fails
 * the load on every rank (HVD_ERR_CORRUPT), the model then mixed. opt and step
 * may be NULL. opt takes the file's state and hyperparameters (as torch's
 * load_state_dict: set any you want changed after the load); which
 * optimizer it is, and loss scaling and clipping on or off, stay the
 * program's, and a file from before format version 5 leaves its options
 * but lr and the update count as they were. A PowerSGD optimizer takes the
 * file's PowerSGD state, or starts it afresh when the file has none; an
 * optimizer without PowerSGD skips it. Collective. Every member passes
 * its copy of the same optimizer, or NULL on every rank. A mix is the
 * caller's error: NULL against an optimizer on the world is refused
 * ("...: opt is NULL here but not NULL on rank 0"), but an optimizer on
 * a process set against NULL or another set's puts the ranks in
 * different collectives, and they stall until HVD_STALL_SHUTDOWN_TIME
 * (a known limitation). */
hvd_result_t hvd_checkpoint_load(const char *path, hvd_param_t *params, int n,
                                 hvd_optimizer_t *opt, int64_t *step);

/* ---- Elastic training: committed state (lib/optim/state.c) -------------
 * Horovod Elastic's state.commit()/restore() and torchrun's restarts, on
 * top of whole-job relaunches by hvdrun (--max-restarts, doc/elastic.md):
 * a state is one model's parameters, their optimizer (may be NULL) and
 * named int64 progress counters (epoch, step, position in the epoch).
 * hvd_state_commit copies them in memory (every rank; with a sharded
 * optimizer, each rank's blocks of its state: no full state) and, every
 * save_every-th commit, writes them to path as a checkpoint (with the
 * counters; rank 0 writes a temporary file, fsyncs and renames
 * it, so a failure during the save leaves the previous file whole).
 * hvd_state_restore puts back this process's newest commit, or else (a
 * relaunched job) the file's, or else nothing (*restored 0). Both are
 * collective; a file loads at any world size, and hvd_checkpoint_load
 * reads it too (ignoring the counters). A commit is agreed by the ranks,
 * in memory only (path NULL) too: a copy that fails on one rank (out of
 * memory) fails the commit on every rank with that rank's error,
 * "hvd_state_commit: out of memory for the committed copy (on rank 2)",
 * none counts it, and no rank keeps an in-memory commit (a restore then
 * reads the file, if any), so the ranks always restore the same. A state
 * NULL on one rank fails the commit on every rank the same way
 * ("hvd_state_commit: state is NULL (on rank 2)"; on the world, which a
 * NULL state names: a state whose optimizer is on a process set waits
 * for the stall inspector instead). A restore's arguments are agreed
 * the same way before anything else (one small allreduce): a state or
 * restored NULL on one rank fails the restore on every rank,
 * "hvd_state_restore: state is NULL (on rank 2)", and restores nothing
 * (on the world, as for the commit: with an optimizer on a process set
 * the others wait for the stall inspector).
 * A restore of a commit in memory is agreed as a file's load is: a copy
 * back that fails on one rank (a device tensor's) fails the restore on
 * every rank with that rank's error and *restored 0 (the other ranks'
 * copies are back, that rank's in part); the commit stays, to restore
 * again. A parameter whose size differs from the commit's on some rank
 * fails the restore on every rank before anything is copied back
 * ("hvd_state_restore: parameter 'w' has 8 bytes but 16 at the commit
 * (on rank 1)", HVD_ERR_INVALID_ARG); a commit takes each parameter at
 * its size then. */
typedef struct hvd_state hvd_state_t;

/* path NULL: in memory only; save_every >= 1. */
hvd_result_t hvd_state_create(const char *path, int save_every,
                              hvd_state_t **out);
/* The model (once per state): params[0..n), opt over the same params or
 * NULL. The arrays must outlive the state. */
hvd_result_t hvd_state_add_params(hvd_state_t *st, hvd_param_t *params, int n,
                                  hvd_optimizer_t *opt);
/* A counter (at most 16, distinct names) read at commit and written at
 * restore through value. Names starting with "hvd." are hvd's own (the
 * loss scaler's counters share the file): HVD_ERR_INVALID_ARG
 * ("hvd_state_add_counter: counter 'hvd.x': names starting with 'hvd.'
 * are hvd's own (the loss scaler's counters)"). */
hvd_result_t hvd_state_add_counter(hvd_state_t *st, const char *name,
                                   int64_t *value);
hvd_result_t hvd_state_commit(hvd_state_t *st);
hvd_result_t hvd_state_restore(hvd_state_t *st, int *restored);
/* on 1: the file commits are written in the background, as
 * hvd_checkpoint_save_async writes (torch.distributed.checkpoint's
 * async_save): such a commit returns once rank 0 holds a copy of the
 * file's bytes, and a thread writes, syncs and renames it; until then
 * the previous file stays whole, and a job that dies meanwhile restores
 * from it. The next file commit, hvd_state_restore and hvd_state_wait
 * (all collective) wait for the write first, and hvd_state_destroy (not
 * collective: rank 0 waits for its thread); a failed write is the
 * result of the first of them (the next commit's own write starts all
 * the same; destroy logs it on rank 0), its message naming
 * hvd_state_commit.
 * While it is in flight, any other checkpoint save fails on every rank
 * with HVD_ERR_INVALID_ARG ("...: the background save of 's.ckpt' is not
 * waited for yet (hvd_state_wait)"). 0 (the default): written in the
 * commit. Not collective; call it alike on every rank. */
hvd_result_t hvd_state_set_background(hvd_state_t *st, int on);
/* Waits for the state's background file write, if one is in flight
 * (collective): its result on every rank; HVD_SUCCESS when none. */
hvd_result_t hvd_state_wait(hvd_state_t *st);
int64_t hvd_state_commits(const hvd_state_t *st); /* so far, file's included */
void hvd_state_destroy(hvd_state_t *st);          /* accepts NULL */

/* The launch a job is in: 0 on the first, k after hvdrun's k-th relaunch
 * (HVD_ELASTIC_RESTARTS), and the world size of the launch before (0 on
 * the first; HVD_ELASTIC_PREVIOUS_SIZE). Valid at any time. */
int hvd_elastic_restarts(void);
int hvd_elastic_previous_size(void);

/* ---- Data sharding ------------------------------------------------------ *
 * As torch.utils.data.DistributedSampler: with shuffle, the indices
 * 0..size-1 are permuted from (seed, epoch); without drop_last the list is
 * padded by repeating its start up to a multiple of the world size, with
 * drop_last its tail is dropped to one; rank r takes every world-size-th
 * index from r. */
typedef struct hvd_sampler hvd_sampler_t;

/* ranks/rank: the world (e.g. hvd_size(), hvd_rank()); needs no init. */
hvd_result_t hvd_sampler_create(int64_t dataset_size, int ranks, int rank,
                                int shuffle, uint64_t seed, int drop_last,
                                hvd_sampler_t **out);
/* Starts an epoch: the only way to get indices, so every epoch is
 * reshuffled. *indices (owned by the sampler, valid until the next call
 * or destroy) gets *count indices for this rank. */
hvd_result_t hvd_sampler_epoch(hvd_sampler_t *s, int64_t epoch,
                               const int64_t **indices, int64_t *count);
/* The rest of an epoch after its first `from` samples (0..dataset size)
 * of the epoch's order were trained on, at this or another world size:
 * the remaining ones are dealt out as at the start of an epoch (padded or
 * dropped to a multiple of the world size, rank r every world-size-th from
 * r), so a job resumed mid-epoch at another world size neither repeats nor
 * skips samples (but the padding, which repeats the rest's start). With
 * drop_last, the world size unchanged and from a multiple of it, this
 * rank's list is the tail of its whole-epoch list.
 * *count is at most hvd_sampler_num_samples(s); from 0 is
 * hvd_sampler_epoch. */
hvd_result_t hvd_sampler_epoch_from(hvd_sampler_t *s, int64_t epoch,
                                    int64_t from, const int64_t **indices,
                                    int64_t *count);
int64_t hvd_sampler_num_samples(const hvd_sampler_t *s); /* per rank */
void hvd_sampler_destroy(hvd_sampler_t *s);              /* accepts NULL */

#ifdef __cplusplus
}
#endif

#endif /* HVD_H */
