/*
 * fault.h - test-only faults of host allocations whose failure one rank
 * must survive in step with its peers (a collective's MPI steps need
 * their memory). Only the stand-in's build of libhvd has them
 * (t/standin/local.mk: HVD_FAULTS and fault.c; t/standin/hostalloc for
 * the host collectives); in libhvd itself hvd__fault is the constant 0
 * and costs nothing.
 *
 * HVD_STANDIN_HOST_ALLOC_FAIL=R:SITE: on world rank R (Open MPI's
 * OMPI_COMM_WORLD_RANK), every allocation at SITE fails as malloc's would
 * (read at every call, as HVD_STANDIN_CUDA_MALLOC_LIMIT). The sites:
 *   engine      an engine's state, at hvd_init or a process set's
 *               creation (core/engine_life.c, engine_alloc)
 *   executor    the MPI executor's state, at an engine's start
 *               (ops/mpi_ops.c, mpi_open)
 *   autotune    the autotuner's state, at an engine's start on its rank
 *               0 with HVD_AUTOTUNE=1 (core/autotune.c)
 *   thread      the world's engine thread: pthread_create fails with
 *               EAGAIN, as at a process or thread limit (engine_life.c)
 *   cache       the response cache's copy of a name it learns
 *               (core/cache.c, hvd__cache_put)
 *   stub        a joined rank's stub (core/execute.c, make_stub)
 *   group       the engine's request list of a group of more than 64
 *               (core/execute.c)
 *   scratch     the NCCL executor's host memory for the answers of its
 *               MPI steps (a fused allgather's rows)
 *   splits      an alltoall's received splits (ops/executor.c,
 *               hvd__exchange_splits)
 *   output      a host collective's output: allgather, alltoall,
 *               reducescatter (ops/executor.c, hvd__alloc_output)
 *   grow        the growth of a host executor's buffer whose size every
 *               rank computes alike (ops/executor.c, hvd__grow_agreed:
 *               a fused allgather's first dimensions)
 *   fusion      the growth of the host allreduce's fusion buffer (a fused
 *               or compressed group's staging chunk: ops/mpi_ops.c,
 *               reserve_stage)
 *   reduction   the growth of the room of the host allreduce's ordered
 *               reductions over MPI (ops/mpi_ops.c, reserve_reduction:
 *               ordered.c's buffer and counts; over every rank, or across
 *               the nodes after the shared-memory path)
 *   adasum      the growth of HVD_ADASUM's buffer of a peer's tensor
 *               (ops/adasum.c)
 */
#ifndef HVD_BASE_FAULT_H
#define HVD_BASE_FAULT_H

#ifdef HVD_FAULTS
/* 1 when the allocation at `site` must fail on this rank. */
int hvd__fault(const char *site);
#else
#define hvd__fault(site) 0
#endif

#endif /* HVD_BASE_FAULT_H */
