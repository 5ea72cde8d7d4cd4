/*
 * nccl_int.h - the NCCL executor's private header: its state, shared by
 * nccl_ops.c (the communicator, the collectives, the executor table),
 * nccl_gather.c (its allgathers and reducescatters) and nccl_fail.c
 * (waiting for NCCL within HVD_NCCL_TIMEOUT, aborting, the abort notices
 * peers send each other, the agreement on a group's allocations before
 * launch). Nothing else includes it. Engine thread only, as the
 * executor's state.
 */
#ifndef HVD_OPS_NCCL_INT_H
#define HVD_OPS_NCCL_INT_H

#include <mpi.h>
#include <nccl.h>

#include "base/errors.h"
#include "ops/executor.h"
#include "ops/gpu_ops.h"

/* A failed rank's reason as it travels to its peers (an abort notice, a
 * failed allocation), with room left for the words around it. */
#define HVD__NCCL_WHY_MAX (HVD__ERRMSG_MAX - 128)

typedef struct nccl_state {
  hvd__gpu_t gpu;   /* first: hvd__gpu_stub_alloc/free take the state as one */
  ncclComm_t comm;  /* NULL before the first collective and after abort */
  double timeout_s; /* HVD_NCCL_TIMEOUT; 0: none */
  char failed[HVD__ERRMSG_MAX]; /* why comm was aborted; "" while usable */
  int unlaunched; /* the failing group launched nothing: keep comm */
  int all_failed; /* every rank knows NCCL failed (agreed): no MPI step */
  /* abort notices (peer_notice, send_notices) on the executor's MPI
   * communicator: a rank that aborts tells every peer why */
  MPI_Comm mpi;
  int rank, size;
  const int *world_ranks; /* a set's: its ranks' world ranks */
  int from_peer;          /* this failure is a peer's notice */
  int heard;              /* a peer's notice came (not yet acted on) */
  int heard_from;         /* its world rank */
  double heard_at;        /* hvd__now() when it came */
  char heard_why[HVD__NCCL_WHY_MAX];
  char notice[HVD__NCCL_WHY_MAX];
  MPI_Request *sent; /* one per peer once sent */
  int64_t *fdims;    /* allgather's rows: [member * size + rank] */
  size_t fdims_bytes;
} nccl_state_t;
/* A call that returned (or will settle) without error. */
#define NCCL_OK(r) ((r) == ncclSuccess || (r) == ncclInProgress)

/* Settles an NCCL call on s->comm; jumps to `fail:` when it fails. Needs
 * `hvd_result_t rc` and `nccl_state_t *s`. */
#define NCCL_CHECK(call)                                                       \
  do {                                                                         \
    rc = hvd__nccl_settle(s, (call), #call);                                   \
    if (rc != HVD_SUCCESS)                                                     \
      goto fail;                                                               \
  } while (0)

/* HVD_ERR_NCCL "<what>: <ncclGetErrorString> (<ncclGetLastError>)", what
 * cut at its first '(' as for hvd__mpi_error. */
hvd_result_t hvd__nccl_error(ncclResult_t r, const char *what);

/* Waits for a call on the non-blocking communicator to settle, within
 * timeout_s (0: forever); its final result, *timed_out when it gave up. */
ncclResult_t hvd__nccl_settle_wait(ncclComm_t comm, ncclResult_t r,
                                   double timeout_s, int *timed_out);
/* The same on s->comm within HVD_NCCL_TIMEOUT, as an hvd result. */
hvd_result_t hvd__nccl_settle(nccl_state_t *s, ncclResult_t r,
                              const char *what);

/* hvd__gpu_wait's poll: NCCL's asynchronous error, a peer's abort notice
 * (after a grace for the collective in flight), HVD_NCCL_TIMEOUT. */
hvd_result_t hvd__nccl_poll(void *ctx, double waited_s);
/* A peer's abort notice, if one came: HVD_ERR_NCCL "rank R aborted its
 * NCCL communicator: <its reason>". */
hvd_result_t hvd__nccl_peer_notice(nccl_state_t *s);
/* After a failure once the communicator exists: aborts it, remembers why,
 * tells the peers (unless a peer's notice was the failure). */
hvd_result_t hvd__nccl_abandon(nccl_state_t *s, hvd_result_t rc);
/* At close: the notices sent finished, those received read; 0 when the
 * state must be kept (MPI may still read its notice). */
int hvd__nccl_end_notices(nccl_state_t *s);

/* HVD_ERR_NCCL "NCCL is unusable after an earlier failure: <s->failed>". */
hvd_result_t hvd__nccl_unusable(const nccl_state_t *s);

/* MPI_MIN over the ranks of (ok ? size : rank): the first rank that
 * failed, or size. */
hvd_result_t hvd__nccl_first_failed(const hvd__exec_env_t *env, int ok,
                                    int *first);
/* Before launching a group: its allocations, and whether NCCL is still
 * usable on every rank, agreed (see nccl_fail.c); every rank makes it,
 * whatever its NCCL's state (nccl_ops.c's header says why). */
hvd_result_t hvd__nccl_agree_prepared(nccl_state_t *s,
                                      const hvd__exec_env_t *env, int allocated,
                                      hvd_result_t mine);

/* s->fdims holds at least `bytes`: host memory for the answers of a
 * collective's MPI step (a fused allgather's rows, alltoall's splits),
 * which a rank must have to make the step (nccl_fail.c says how a rank
 * without it still keeps in step). *ok is 1 when every rank has it; else
 * 0 on every rank, and the rank that could not has its failure in *mine
 * (unless one is there already): the caller then skips the step on every
 * rank and fails in hvd__nccl_agree_prepared. */
hvd_result_t hvd__nccl_scratch(nccl_state_t *s, const hvd__exec_env_t *env,
                               size_t bytes, const char *what, int *ok,
                               hvd_result_t *mine);

/* nccl_ops.c's helpers: NCCL's type and reduction for hvd's; r's output
 * on the device (d's shape with `rows` in dimension 0); the end of a group
 * of NCCL calls whose first failure is r (ncclSuccess when none failed),
 * where the group's work is enqueued and settled. */
ncclDataType_t hvd__nccl_dtype(int dtype);
ncclRedOp_t hvd__nccl_op(int op);
hvd_result_t hvd__nccl_alloc_rows(nccl_state_t *s, hvd_request_t *r,
                                  const hvd__desc_t *d, int64_t rows);
hvd_result_t hvd__nccl_group_end(nccl_state_t *s, ncclResult_t r,
                                 const char *what);

/* nccl_gather.c: a device allgather or reducescatter, alone or a fused
 * group of them, enqueued on hvd's stream (nccl_run's bodies: `entry` is
 * nccl_enter's result; when it failed they make their MPI steps all the
 * same, allocate nothing and fail in the agreement). */
hvd_result_t hvd__nccl_allgather(nccl_state_t *s, const hvd__exec_env_t *env,
                                 const hvd__work_t *w, hvd_result_t entry);
hvd_result_t hvd__nccl_reducescatter(nccl_state_t *s,
                                     const hvd__exec_env_t *env,
                                     const hvd__work_t *w, hvd_result_t entry);

#endif /* HVD_OPS_NCCL_INT_H */
