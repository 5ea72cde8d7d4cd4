/*
 * mpicount.c - a PMPI layer (LD_PRELOAD) that counts the calls and the
 * payload bytes of the MPI collectives hvd's negotiation uses, for
 * t/mpi/negotiation.sh (doc/scale.md). Not part of libhvd.
 *
 * Counted per process while counting is on: MPI_Iallreduce with MPI_BOR
 * (the fast path's bit vector, one per engine cycle) apart from other
 * MPI_Iallreduce calls; MPI_Iallgather, MPI_Igatherv and MPI_Ibcast (the
 * slow path: sizes, messages to the coordinator, the response list);
 * every other nonblocking collective hvd's host executor uses
 * (MPI_Ialltoallv, MPI_Iallgatherv) under "data". Bytes are the payload
 * this process hands to MPI (sent) and gets from it (received), as the
 * call's counts say: not what the algorithm puts on the wire.
 *
 * MPI_Pcontrol(1) clears the counters and starts counting; MPI_Pcontrol(0)
 * stops. At MPI_Finalize each process writes
 * $MPICOUNT_DIR/rank.R, one line per kind: "KIND CALLS SENT RECEIVED".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

enum { K_BOR, K_ALLREDUCE, K_ALLGATHER, K_GATHERV, K_BCAST, K_DATA, K_N };
static const char *const kind_name[K_N] = {
    "fastpath_bor", "iallreduce_other", "iallgather",
    "igatherv",     "ibcast",           "data"};
static long long calls[K_N], sent[K_N], recvd[K_N];
static int counting;

static long long bytes(int count, MPI_Datatype t) {
  int size = 0;
  PMPI_Type_size(t, &size);
  return (long long)count * size;
}

static void add(int k, long long s, long long r) {
  if (!__atomic_load_n(&counting, __ATOMIC_RELAXED))
    return;
  __atomic_add_fetch(&calls[k], 1, __ATOMIC_RELAXED);
  __atomic_add_fetch(&sent[k], s, __ATOMIC_RELAXED);
  __atomic_add_fetch(&recvd[k], r, __ATOMIC_RELAXED);
}

int MPI_Pcontrol(const int level, ...) {
  if (level != 0)
    for (int k = 0; k < K_N; k++)
      calls[k] = sent[k] = recvd[k] = 0;
  __atomic_store_n(&counting, level != 0, __ATOMIC_SEQ_CST);
  return MPI_SUCCESS;
}

int MPI_Iallreduce(const void *sb, void *rb, int count, MPI_Datatype t,
                   MPI_Op op, MPI_Comm comm, MPI_Request *req) {
  long long b = bytes(count, t);
  add(op == MPI_BOR ? K_BOR : K_ALLREDUCE, b, b);
  return PMPI_Iallreduce(sb, rb, count, t, op, comm, req);
}

int MPI_Iallgather(const void *sb, int sc, MPI_Datatype st, void *rb, int rc,
                   MPI_Datatype rt, MPI_Comm comm, MPI_Request *req) {
  int p = 1;
  PMPI_Comm_size(comm, &p);
  add(K_ALLGATHER, bytes(sc, st), bytes(rc, rt) * p);
  return PMPI_Iallgather(sb, sc, st, rb, rc, rt, comm, req);
}

int MPI_Igatherv(const void *sb, int sc, MPI_Datatype st, void *rb,
                 const int rcs[], const int displs[], MPI_Datatype rt,
                 int root, MPI_Comm comm, MPI_Request *req) {
  int me = 0, p = 1;
  long long r = 0;
  PMPI_Comm_rank(comm, &me);
  PMPI_Comm_size(comm, &p);
  if (me == root)
    for (int i = 0; i < p; i++)
      r += bytes(rcs[i], rt);
  add(K_GATHERV, bytes(sc, st), r);
  return PMPI_Igatherv(sb, sc, st, rb, rcs, displs, rt, root, comm, req);
}

int MPI_Ibcast(void *b, int count, MPI_Datatype t, int root, MPI_Comm comm,
               MPI_Request *req) {
  int me = 0;
  PMPI_Comm_rank(comm, &me);
  long long n = bytes(count, t);
  add(K_BCAST, me == root ? n : 0, me == root ? 0 : n);
  return PMPI_Ibcast(b, count, t, root, comm, req);
}

int MPI_Ialltoallv(const void *sb, const int scs[], const int sd[],
                   MPI_Datatype st, void *rb, const int rcs[], const int rd[],
                   MPI_Datatype rt, MPI_Comm comm, MPI_Request *req) {
  add(K_DATA, 0, 0);
  return PMPI_Ialltoallv(sb, scs, sd, st, rb, rcs, rd, rt, comm, req);
}

int MPI_Iallgatherv(const void *sb, int sc, MPI_Datatype st, void *rb,
                    const int rcs[], const int displs[], MPI_Datatype rt,
                    MPI_Comm comm, MPI_Request *req) {
  add(K_DATA, 0, 0);
  return PMPI_Iallgatherv(sb, sc, st, rb, rcs, displs, rt, comm, req);
}

int MPI_Finalize(void) {
  const char *dir = getenv("MPICOUNT_DIR");
  int me = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (dir != NULL) {
    char path[4096];
    snprintf(path, sizeof path, "%s/rank.%d", dir, me);
    FILE *f = fopen(path, "w");
    if (f != NULL) {
      for (int k = 0; k < K_N; k++)
        fprintf(f, "%s %lld %lld %lld\n", kind_name[k], calls[k], sent[k],
                recvd[k]);
      fclose(f);
    }
  }
  return PMPI_Finalize();
}
