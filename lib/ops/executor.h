/*
 * executor.h - the interface every backend implements: how to run one
 * agreed collective on this rank's requests. The engine decides what runs
 * and when; an executor only knows how, on one kind of memory. Adding a
 * backend adds a file in lib/ops/ and a row in executor.c.
 */
#ifndef HVD_OPS_EXECUTOR_H
#define HVD_OPS_EXECUTOR_H

#include <mpi.h>

#include "base/settings.h"
#include "internal.h"

/* ---- what an executor sees of a request ---------------------------------- */

/* What a rank says about one collective. Negotiation compares these. */
/* What ranks compare. The enums hold values in range: the wire codec
 * (core/message.c) refuses a message with one out of range, so that no
 * table is indexed with a peer's bad byte. */
typedef struct hvd__desc {
  hvd__coll_t coll;
  hvd_dtype_t dtype;
  int device; /* HVD_CPU or CUDA ordinal */
  int ndim;
  int64_t shape[HVD_MAX_DIMS];
  hvd_op_t op;
  double prescale, postscale;
  int root;
  hvd_dtype_t wire; /* on the wire: dtype, or f16/bf16 for a compressed f32 */
  /* A grouped collective's member (hvd_grouped_*): index group_i of
   * group_n (0 and 0 when not grouped), group_id a hash of the members'
   * names in order. The coordinator runs a group's members together, once
   * every rank has all of them. At most HVD__GROUP_MAX members (the API
   * refuses more; the wire codec refuses a descriptor out of these
   * bounds). */
  int group_n, group_i;
  uint64_t group_id;
} hvd__desc_t;

/* The most members a grouped collective may have. */
#define HVD__GROUP_MAX (1 << 20)

/* Names of the collectives that have no user name. */
#define HVD__BARRIER_NAME "hvd.barrier"
#define HVD__JOIN_NAME "hvd.join"

#define HVD__INLINE_NAME 64

struct hvd_request {
  char *name; /* inline_name when it fits, else malloc'd */
  char inline_name[HVD__INLINE_NAME];
  hvd__desc_t desc;
  hvd_tensor_t send;        /* input; broadcast's in-place tensor */
  hvd_tensor_t recv;        /* allreduce: caller's output; else hvd's output */
  hvd_tensor_t *recv_out;   /* caller's slot for an output hvd allocates */
  int recv_given;           /* allgather, reducescatter: recv is memory the
                               caller gave (lib/optim's _into calls), its
                               shape the result's: nothing is allocated */
  int64_t *splits;          /* alltoall: copy of the caller's splits */
  int64_t *recv_splits;     /* alltoall: rows received per rank (hvd's) */
  int64_t *recv_splits_out; /* caller's array, may be NULL */
  int *last_rank_out;       /* join: caller's slot, may be NULL */
  int last_rank;
  int nranks;      /* world size when submitted */
  int is_stub;     /* made by the engine for a rank that joined */
  double t_submit; /* hvd__now() at submission (timeline) */
  double t_ready;  /* t_submit on the aligned timeline clock */
  int batch_n;     /* requests executed with it (its fused group): timeline */
  void *ready;     /* device tensors: a cudaEvent_t recorded at submission on
                      the submitting thread's stream; the executor's stream
                      waits for it (base/device_order.c) */
  void *launched;  /* a device group in flight: the cudaEvent_t that fires
                      when its results are complete (hvd_cuda_stream_wait);
                      guarded by the completion lock, meaningless once done */

  int done; /* guarded by the completion lock in request.c */
  hvd_result_t rc;
  char *errmsg;
  hvd_request_t *next; /* engine queue link */
};

/* ---- the interface ---------------------------------------------------------
 */

typedef struct hvd__exec_env {
  MPI_Comm comm; /* hvd's communicator (only the engine thread uses it) */
  int rank, size;
  MPI_Comm local_comm, cross_comm; /* same node; same local rank */
  int local_rank, local_size;
  int hierarchical;    /* HVD_HIERARCHICAL_ALLREDUCE, and it applies: more
                          than one node and some node with several ranks;
                          the same on every rank */
  int64_t chunk_bytes; /* HVD_CHUNK_SIZE (0: the executor's default) */
  int shm;             /* HVD_SHM_ALLREDUCE: may reduce through shared memory */
  int zero_copy;       /* HVD_ZERO_COPY: may read and write peers' arenas */
  int gpu_ops;         /* HVD_GPU_OPERATIONS: HVD__GPU_OPS_NCCL or _MPI */
  double nccl_timeout_s; /* HVD_NCCL_TIMEOUT; 0 = wait forever */
  int gpu_timing;        /* HVD_GPU_TIMING: time the device groups */
  /* A process set's engine: world_ranks[r] is comm rank r's rank in hvd's
   * world (messages name those); NULL for the world's own engine. */
  const int *world_ranks;
  int set_id; /* the process set's id (hvd_process_set_id); 0: the world */
  /* Timeline hook, NULL when off: phase of one request from t0 to t1. */
  void (*trace)(void *ctx, const hvd_request_t *r, const char *phase, double t0,
                double t1);
  void *trace_ctx;
  /* Completes every group left in flight, in every engine the thread
   * drives (each with its own result), before an executor allocates or
   * frees device memory: no cudaMalloc or cudaFree while a communicator
   * may be mid-collective. Engine thread. */
  void (*quiesce)(void *ctx);
  void *quiesce_ctx;
} hvd__exec_env_t;

/* Comm rank r's rank in hvd's world, which messages name. */
static inline int hvd__env_world_rank(const hvd__exec_env_t *env, int r) {
  return env->world_ranks != NULL ? env->world_ranks[r] : r;
}

/* One agreed collective: the reference descriptor, this rank's requests
 * for it (a rank that joined gets stub requests holding the op's identity;
 * req->is_stub is set), and per-rank first dimensions for allgather. An
 * allreduce may carry several requests (a fused group): same dtype, device,
 * op and scale factors, executed as one pipelined stream. So may an
 * allgather, in an executor whose `fuses` says so: any dtypes and row
 * sizes. Every allgather's work carries each request's per-rank first
 * dimensions in dims0s[i] (NULL when agreed through the cache: the
 * executor learns them). So may a
 * reducescatter, in an executor whose `fuses` says so: one dtype, op and
 * scaling, any shapes. */
typedef struct hvd__work {
  const hvd__desc_t *desc;
  hvd_request_t *const *reqs;
  int n;
  const int64_t *const *dims0s; /* allgather: per request; else NULL */
  /* Non-NULL when the engine lets this group complete later (the
   * executor has `reap`): run may enqueue the work, set defer->deferred
   * and return without waiting for it; defer->event is then a cudaEvent_t
   * that fires when the group's results are complete, valid until the
   * group is reaped (hvd_cuda_stream_wait). */
  struct hvd__defer {
    int deferred;
    void *event;
  } * defer;
} hvd__work_t;

typedef hvd_result_t (*hvd__exec_fn)(void *state, const hvd__exec_env_t *env,
                                     const hvd__work_t *w);

typedef struct hvd__executor {
  const char *name;
  /* open: every rank at start (may be collective). close: with
   * `collective`, every rank at the same point (the cycle where all agreed
   * to stop), so collective teardown is safe; without it (a failure on
   * some ranks), only local resources are released. */
  hvd_result_t (*open)(const hvd__exec_env_t *env, void **state);
  void (*close)(void *state, int collective);
  /* One entry per hvd__coll_t (join needs none). On failure the message
   * is set with hvd__set_error; outputs already allocated stay in the
   * requests, which the engine completes (and frees) with the error. */
  hvd__exec_fn run[HVD__COLL_COUNT];
  /* A joined rank's stub request for an allreduce (desc, dtype and shape
   * set) gets data holding the identity of its op in this executor's
   * memory, send and recv the same tensor; stub_free releases it. The
   * stubs of a group exist only while it runs. */
  hvd_result_t (*stub_alloc)(void *state, const hvd__exec_env_t *env,
                             hvd_request_t *r);
  void (*stub_free)(void *state, hvd_request_t *r);
  /* The pipeline chunk in bytes when HVD_CHUNK_SIZE is unset (0: the
   * executor does not chunk); the autotuner starts from it. */
  int64_t default_chunk;
  /* Bits (1 << hvd__coll_t) of the collectives besides allreduce whose
   * run takes a fused group (hvd__work_t). */
  unsigned fuses;
  /* Asynchronous completion (NULL: every run completes its group before
   * it returns). A run that deferred its group (hvd__work_t's deferred)
   * left it in flight; the engine calls reap for the executor's oldest
   * group in flight, in launch order: 1 when it has ended, its result in
   * *rc (message set on failure), 0 while it still runs (never with
   * `wait`). At most max_in_flight groups are in flight: the engine reaps
   * one (waiting) before running another. */
  int (*reap)(void *state, const hvd__exec_env_t *env, int wait,
              hvd_result_t *rc);
  int max_in_flight;
} hvd__executor_t;

/* Every executor this build has, NULL-terminated. */
extern const hvd__executor_t *const hvd__executors[];

/* Index into hvd__executors of the executor for collective d, by its
 * tensors' device (HVD_CPU: the MPI executor; a CUDA ordinal: NCCL or
 * host-staged MPI as env->gpu_ops says, and host-staged MPI for an
 * HVD_ADASUM allreduce, which NCCL has not); -1 when this build has
 * none. */
int hvd__executor_for(const hvd__exec_env_t *env, const hvd__desc_t *d);

/* Allocates the output tensor of a request (host memory), shape given;
 * a given output (r->recv_given) is checked instead (hvd__given_output).
 * HVD_ERR_NO_MEMORY "could not allocate N bytes for the output of
 * <coll> '<name>'" (fault site "output", base/fault.h). A local failure:
 * callers agree on it before their MPI steps (hvd__agree_ready). */
hvd_result_t hvd__alloc_output(hvd_request_t *r, int ndim,
                               const int64_t *shape);

/* A given output must have the result's shape: else HVD_ERR_INVALID_ARG
 * "<coll> '<name>': the output given has shape [a, b] but the result has
 * [c, b]". */
hvd_result_t hvd__given_output(const hvd_request_t *r, int ndim,
                               const int64_t *shape);

/* Bytes of one row (dimensions 1..) of a tensor with d's dtype and shape;
 * -1 past PTRDIFF_MAX (base/tensor.h's hvd__row_size), which the API
 * refuses in every collective that works in rows, so never for a
 * request an executor runs. */
int64_t hvd__row_bytes(const hvd__desc_t *d);

/* Whether every rank has what a collective needs before its data moves:
 * `mine` is this rank's result of its local steps (its allocations; the
 * message set on failure), agreed in one MPI_Allreduce of an int, so
 * that no rank makes an MPI step its peers skip. When some rank failed,
 * the lowest sends every rank its code and words and every rank fails
 * alike: "rank R could not allocate N bytes for the output of allgather
 * 'x'; nothing was exchanged" (an allocation: HVD_ERR_NO_MEMORY), else
 * "rank R: <its words>; nothing was exchanged" (R a world rank). Nothing
 * is lost: the outputs a rank did allocate are freed with its requests.
 * Collective over env->comm. */
hvd_result_t hvd__agree_ready(const hvd__exec_env_t *env, hvd_result_t mine);

/* hvd__grow of a buffer kept across collectives whose size every rank
 * computes alike, so whether it grows is the same on every rank: when it
 * does (rarely), whether it could is agreed (hvd__agree_ready), and when
 * some rank could not, every rank drops the buffer (*buf NULL, *cap 0),
 * so that they grow alike again, and fails with the agreed words. `site`
 * names it for the test builds' faults (base/fault.h). */
hvd_result_t hvd__grow_agreed(const hvd__exec_env_t *env, const char *site,
                              void **buf, size_t *cap, size_t n,
                              const char *what);

/* Rows of block k when `rows` rows are split over p ranks for a
 * reducescatter: the first rows % p blocks hold one row more. */
static inline int64_t hvd__block_rows(int64_t rows, int64_t p, int64_t k) {
  return rows / p + (k < rows % p);
}

/* The first row of that block k: the rows of blocks 0..k-1. */
static inline int64_t hvd__block_first(int64_t rows, int64_t p, int64_t k) {
  return k * (rows / p) + (k < rows % p ? k : rows % p);
}

/* The first step of every alltoall: each rank tells each other how many
 * rows it sends (r->splits); the answers land in `into` (env->size
 * entries of the caller's) and are copied into r->recv_splits (allocated
 * here, freed with the request), and *total is their sum, the rows this
 * rank receives. With `output`, r's host output is allocated too
 * (hvd__alloc_output). One MPI_Allreduce of an int then agrees, over
 * every rank, the most telling of:
 *  - a sum past the largest tensor on some rank (hvd__rows_total; rows
 *    of 0 bytes claim any count): HVD_ERR_INVALID_ARG on every rank,
 *    "rank 1 would receive more rows than a tensor holds (the splits
 *    sent to it sum past INT64_MAX rows or PTRDIFF_MAX bytes)", naming
 *    the lowest such world rank;
 *  - with `output` (the MPI executor, which counts rows and row bytes in
 *    MPI's int), a rank that would send or receive more than INT_MAX
 *    rows, or rows of more than INT_MAX bytes: HVD_ERR_UNSUPPORTED on
 *    every rank, "rank 1 would send or receive more rows, or longer rows,
 *    than MPI's int counts", naming the lowest such world rank;
 *  - with `output`, a rank that could not allocate (r->recv_splits, fault
 *    site "splits", or the output): every rank fails with its words, as
 *    hvd__agree_ready's: "rank 1 could not allocate 24 bytes for the
 *    received splits of alltoall 'x'; nothing was exchanged".
 * Without `output` such a failure is this rank's alone, returned after
 * the agreement: the NCCL executor carries it into its own, so that no
 * peer waits in MPI for it. Collective over env->comm. */
hvd_result_t hvd__exchange_splits(hvd_request_t *r, const hvd__exec_env_t *env,
                                  int64_t *into, int output, int64_t *total);

/* The rows of request r's allgather output: its P ranks' first dimensions
 * (rows[0..P-1], every rank's alike) summed into *total; past the largest
 * tensor (hvd__rows_total) HVD_ERR_INVALID_ARG, on every rank alike: "the
 * first dimensions of the 2 ranks sum past the largest tensor (INT64_MAX
 * rows, PTRDIFF_MAX bytes)", after "tensor '<name>' of its fused group: "
 * when r is one of a fused group (`fused`), whose every member fails. */
hvd_result_t hvd__allgather_rows(const hvd_request_t *r, int fused,
                                 const int64_t *rows, int P, int64_t *total);

/* HVD_GPU_TIMING=1: the device executors' groups of every engine of this
 * process, timed and added up (ops/gpu_timing.c, in builds with CUDA
 * only): *out (when not NULL) gets the totals; `reset` zeroes them after.
 * Any thread. */
void hvd__gpu_timing_totals(hvd_gpu_timing_t *out, int reset);

#endif /* HVD_OPS_EXECUTOR_H */
