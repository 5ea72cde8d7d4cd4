/*
 * mpi_int.h - the MPI executor's own (not for the rest of lib/): its state
 * and the helpers that its four files share. mpi_ops.c is the executor
 * (open, close, the run table, the plain collectives, the allreduce's
 * chunking and compression); shm_allreduce.c the shared-memory allreduce
 * within a node, slots and zero copy, with a state of its own;
 * gather_scatter.c the fused allgather and reducescatter; adasum.c
 * HVD_ADASUM's tree.
 */
#ifndef HVD_OPS_MPI_INT_H
#define HVD_OPS_MPI_INT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "base/wait.h"
#include "ops/executor.h"
#include "ops/ordered.h"

/* Elements per MPI call at most (MPI counts are int). */
#define HVD__MPI_MAX_ELEMS ((int64_t)1 << 30)

/* ---- the shared-memory allreduce (shm_allreduce.c) ----------------------- */

typedef struct hvd__shm {
  int on;    /* use it; decided for every rank alike */
  int cross; /* several nodes: segments are allreduced over cross_comm */
  MPI_Win win;
  char **slot;             /* per local rank: two phases of slot bytes */
  hvd__shm_barrier_t *bar; /* after local rank 0's slots */
  int phase;
  /* zero copy: every local rank's arena */
  int zc;         /* use it when the tensors allow; decided alike */
  int nlocal, me; /* local size and rank */
  char **arena;   /* per local rank: its arena here (ours, or the peer's) */
  uint64_t *arena_size;
  const void **srcs; /* per local rank: its values, for a fold */
  int64_t *rows;     /* the open's exchanges: 3 per local rank */
  /* cross-memory attach (process_vm_readv/writev) for tensors outside the
   * arenas, one node only: every local rank's pid, a scratch block per
   * peer; decided alike */
  int cma;
  int mode;  /* this group's: 2 zero copy, 1 cross-memory attach */
  int *pids; /* per local rank */
  char *scratch;
  int ptracer;        /* holds one of the process's PR_SET_PTRACER_ANY users */
  hvd__ordered_t ord; /* across nodes */
} hvd__shm_t;

/* The open's host memory, each rank's own (1 when it has it all): had
 * before the open's first collective step, so that the executor's open
 * agrees on it first (hvd__agree_ready). hvd__shm_close frees it. */
int hvd__shm_alloc(hvd__shm_t *s, const hvd__exec_env_t *env);

/* Sets up the node's segment and maps the peers' arenas (collective over
 * env->comm), after hvd__shm_alloc on every rank; s->on says whether the
 * node's ranks use it. */
hvd_result_t hvd__shm_open(hvd__shm_t *s, const hvd__exec_env_t *env);
/* Frees it; the segment's window only when `collective` (every rank
 * closes together), else MPI_Finalize does. */
void hvd__shm_close(hvd__shm_t *s, int collective);

/* Bytes per piece: HVD_CHUNK_SIZE, at most a slot. */
int64_t hvd__shm_piece_bytes(const hvd__exec_env_t *env);
/* Allreduce of one buffer (src may be MPI_IN_PLACE) through the slots;
 * with `finish`, average and postscale fused into the copy out. */
hvd_result_t hvd__shm_span(hvd__shm_t *s, const hvd__exec_env_t *env,
                           const void *src, void *dst, int64_t n,
                           const hvd__desc_t *d, int finish);
/* A fused chunk packed straight into this rank's slot (hvd__shm_chunk),
 * reduced (hvd__shm_reduce_chunk), unpacked tensor by tensor with
 * average and postscale (hvd__shm_unpack), then hvd__shm_next. */
char *hvd__shm_chunk(const hvd__shm_t *s, const hvd__exec_env_t *env);
hvd_result_t hvd__shm_reduce_chunk(hvd__shm_t *s, const hvd__exec_env_t *env,
                                   int64_t cnt, const hvd__desc_t *d);
void hvd__shm_unpack(const hvd__shm_t *s, const hvd__exec_env_t *env,
                     int64_t cnt, int64_t from, int64_t m, void *dst,
                     const hvd__desc_t *d);
void hvd__shm_next(hvd__shm_t *s);
/* The group zero-copy when every rank of the node can (*done set), else
 * nothing (the caller takes the slots). */
hvd_result_t hvd__zc_allreduce(hvd__shm_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w, int *done);

/* ---- the executor's state (mpi_ops.c) ------------------------------------ */

typedef struct hvd__mpi_state {
  hvd__ordered_t ord; /* scratch of the reductions over MPI */
  hvd__shm_t shm;     /* the shared-memory allreduce within the node */
  char *stage;        /* persistent fusion chunk (without shm) */
  size_t stage_cap;
  int *counts, *displs, *counts2, *displs2; /* per rank of env->comm */
  int64_t *splits;
  /* a fused allgather or reducescatter: the packed rows; an allgather's
   * tensors' first dimensions */
  char *gather;
  size_t gather_cap;
  int64_t *gdims;
  size_t gdims_cap;
  /* HVD_ADASUM (adasum.c): a peer's tensor */
  char *ada_peer;
  size_t ada_peer_cap;
} hvd__mpi_state_t;

/* r's output: d's shape with `rows` in dimension 0. */
hvd_result_t hvd__mpi_alloc_rows(hvd_request_t *r, const hvd__desc_t *d,
                                 int64_t rows);
/* The timeline's span of one request, unless off or a stub. */
void hvd__mpi_trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                    const char *phase, double t0, double t1);

/* ---- HVD_ADASUM (adasum.c) ------------------------------------------------
 */

/* An allreduce group whose op is HVD_ADASUM (float32 or float64, host):
 * every tensor combined over the ranks' tree on its own, prescale before
 * and postscale after. */
hvd_result_t hvd__adasum_allreduce(hvd__mpi_state_t *s,
                                   const hvd__exec_env_t *env,
                                   const hvd__work_t *w);

/* ---- fused gathers and scatters (gather_scatter.c) ----------------------- */

/* *alone: the group's rows are more bytes than MPI's int counts reach in
 * one call (the same answer on every rank, from every rank's rows): the
 * caller gathers each member on its own, member i's rows per rank at
 * s->gdims + i * size. */
hvd_result_t hvd__mpi_allgather_fused(hvd__mpi_state_t *s,
                                      const hvd__exec_env_t *env,
                                      const hvd__work_t *w, int *alone);
hvd_result_t hvd__mpi_reducescatter_fused(hvd__mpi_state_t *s,
                                          const hvd__exec_env_t *env,
                                          const hvd__work_t *w);

#endif /* HVD_OPS_MPI_INT_H */
