/*
 * mpi_ops.c - the MPI executor: collectives on host memory over hvd's
 * communicator. Every reduction folds each element over the ranks in rank
 * order (within a node, then across nodes), whatever the fusion: through
 * the node's shared memory, or ordered.c's reductions over MPI, never
 * MPI_Allreduce, whose order changes with the count. Scale factors are
 * applied in the copies around the reduction; counts beyond INT_MAX go in
 * chunks.
 */
#include "ops/mpi_ops.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/host_mem.h"
#include "base/log.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "ops/ordered.h"
#include "ops/reduce.h"

#define CHUNK_ELEMS ((int64_t)1 << 30)
#define SHM_SLOT ((int64_t)4 << 20)  /* bytes per rank and phase */
#define ZC_BLOCK ((int64_t)64 << 10) /* zc_range's cache block, bytes */
#define SHM_CTL ((int64_t)4096)      /* after the slots: the barrier */

typedef struct mpi_state {
  hvd__ordered_t ord; /* scratch of the reductions over MPI */
  const void **srcs;  /* per local rank: its values, for a fold */
  char *stage;        /* persistent fusion chunk */
  size_t stage_cap;
  /* shared-memory allreduce within the node (see shm_span) */
  int shm;       /* use it; decided for every rank alike */
  int shm_cross; /* several nodes: segments are allreduced over cross_comm */
  MPI_Win win;
  char **slot;             /* per local rank: two phases of SHM_SLOT bytes */
  hvd__shm_barrier_t *bar; /* after local rank 0's slots: shm_barrier */
  int phase;
  /* zero-copy allreduce (see zc_allreduce): every local rank's arena */
  int zc;         /* use it when the tensors allow; decided alike */
  int nlocal, me; /* local size and rank */
  char **arena;   /* per local rank: its arena here (ours, or the peer's) */
  uint64_t *arena_size;
  int *counts, *displs, *counts2, *displs2;
  int64_t *splits;
  /* a fused allgather or reducescatter: the packed rows; an allgather's
   * tensors' first dimensions */
  char *gather;
  size_t gather_cap;
  int64_t *gdims;
  size_t gdims_cap;
} mpi_state_t;

/* ---- the peers' arenas ------------------------------------------------- */

static void zc_close(mpi_state_t *s) {
  for (int k = 0; s->arena != NULL && k < s->nlocal; k++)
    if (k != s->me && s->arena[k] != NULL)
      munmap(s->arena[k], s->arena_size[k]);
  free(s->arena);
  free(s->arena_size);
  s->arena = NULL;
  s->arena_size = NULL;
  s->zc = 0;
}

/* Peer k's arena mapped here, readable and writable (zc_allreduce writes
 * each segment's result into every peer's tensor): its memfd opened
 * through /proc/<pid>/fd/<fd> (the same user: the kernel's ptrace check
 * passes). NULL, logged, when it cannot be. */
static char *zc_map_peer(const int64_t who[3]) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)who[0],
           (long long)who[1]);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  void *v = fd < 0 ? MAP_FAILED
                   : mmap(NULL, (size_t)who[2], PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_NORESERVE, fd, 0);
  int err = errno;
  if (fd >= 0)
    close(fd);
  if (v == MAP_FAILED) {
    HVD__LOG(HVD__LOG_INFO, "zero-copy allreduce: %s: %s", path, strerror(err));
    return NULL;
  }
#ifdef MADV_DONTDUMP
  (void)madvise(v, (size_t)who[2], MADV_DONTDUMP);
#endif
  return v;
}

/* Maps every peer's arena and agrees with every rank that all could: zero
 * copy is used by all the node's ranks or none, and with several nodes by
 * all nodes or none (their segments must line up across nodes). Runs
 * after shm_setup, on every rank alike. */
static hvd_result_t zc_open(mpi_state_t *s, const hvd__exec_env_t *env) {
  hvd_result_t rc = HVD_SUCCESS;
  int n = env->local_size, fd = -1, ok = 0;
  char *base = NULL;
  uint64_t size = 0;
  int64_t me[3], *all = NULL;
  if (!s->shm)
    return HVD_SUCCESS;
  s->nlocal = n;
  s->me = env->local_rank;
  all = calloc((size_t)n * 3, sizeof *all);
  s->arena = calloc((size_t)n, sizeof *s->arena);
  s->arena_size = calloc((size_t)n, sizeof *s->arena_size);
  if (all == NULL || s->arena == NULL || s->arena_size == NULL) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "MPI executor state");
    goto fail;
  }
  if (env->zero_copy)
    ok = hvd__host_arena(&fd, &base, &size);
  me[0] = ok ? (int64_t)getpid() : -1;
  me[1] = fd;
  me[2] = (int64_t)size;
  HVD__MPI_CHECK(
      MPI_Allgather(me, 3, MPI_INT64_T, all, 3, MPI_INT64_T, env->local_comm));
  for (int k = 0; ok && k < n; k++) {
    s->arena_size[k] = (uint64_t)all[3 * k + 2];
    if (k == s->me)
      s->arena[k] = base;
    else if (all[3 * k] > 0)
      s->arena[k] = zc_map_peer(&all[3 * k]);
    ok = s->arena[k] != NULL;
  }
  int v = ok;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, env->comm));
  s->zc = v;
  HVD__LOG(HVD__LOG_INFO, "zero-copy allreduce %s",
           v ? "on"
             : "off (HVD_ZERO_COPY=0, or some rank has no arena its "
               "peers can map)");
fail:
  free(all);
  if (!s->zc)
    zc_close(s);
  return rc;
}

static void mpi_close(void *state, int collective) {
  mpi_state_t *s = state;
  if (s == NULL)
    return;
  hvd__ordered_free(&s->ord);
  free(s->srcs);
  free(s->counts);
  free(s->displs);
  free(s->counts2);
  free(s->displs2);
  free(s->splits);
  free(s->stage);
  free(s->gather);
  free(s->gdims);
  if (s->win != MPI_WIN_NULL && collective) { /* MPI_Win_free: the node */
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
  } /* else left to MPI_Finalize: no collective after a failure */
  free(s->slot);
  zc_close(s);
  free(s);
}

/* The node's shared segment: MPI_Win_allocate_shared over local_comm, two
 * phases of SHM_SLOT bytes per local rank. Used only if every rank has one
 * and the nodes are alike (segments must line up across nodes); otherwise
 * every rank takes the MPI path. */
static hvd_result_t shm_setup(mpi_state_t *s, const hvd__exec_env_t *env) {
  hvd_result_t rc = HVD_SUCCESS;
  int ok = 0;
  if (env->shm && env->local_size > 1) {
    char *base = NULL;
    int err =
        MPI_Win_allocate_shared((MPI_Aint)(2 * SHM_SLOT + SHM_CTL), 1,
                                MPI_INFO_NULL, env->local_comm, &base, &s->win);
    s->slot = calloc((size_t)env->local_size, sizeof *s->slot);
    ok = err == MPI_SUCCESS && s->slot != NULL;
    if (err == MPI_SUCCESS)
      MPI_Win_set_errhandler(s->win, MPI_ERRORS_RETURN);
    for (int k = 0; ok && k < env->local_size; k++) {
      MPI_Aint size = 0;
      int unit = 0;
      ok = MPI_Win_shared_query(s->win, k, &size, &unit, &s->slot[k]) ==
               MPI_SUCCESS &&
           size >= 2 * SHM_SLOT;
    }
    if (ok)
      ok = MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win) == MPI_SUCCESS;
    if (ok) { /* zeroed before the agreement below, which all pass */
      s->bar = (hvd__shm_barrier_t *)(s->slot[0] + 2 * SHM_SLOT);
      if (env->local_rank == 0)
        memset(s->bar, 0, sizeof *s->bar);
    }
    if (!ok)
      HVD__LOG(HVD__LOG_INFO, "shared-memory allreduce unavailable here");
  }
  /* [0]: some rank could not; [1], [2]: max and -min of local_size */
  int v[3] = {env->shm && env->local_size > 1 && !ok, env->local_size,
              -env->local_size};
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MAX, env->comm));
  s->shm = env->shm && v[0] == 0 && v[1] == -v[2] && v[1] > 1;
  s->shm_cross = s->shm && env->local_size < env->size;
  if (s->shm)
    HVD__LOG(HVD__LOG_INFO,
             "allreduce path: shared memory within the node (%d ranks)%s",
             env->local_size,
             s->shm_cross ? ", then MPI across the nodes" : "");
  else if (env->hierarchical)
    HVD__LOG(HVD__LOG_INFO, "allreduce path: MPI, hierarchical (reduce within "
                            "the node, allreduce across, broadcast within)");
  else
    HVD__LOG(HVD__LOG_INFO, "allreduce path: MPI over all %d ranks", env->size);
  if (!s->shm && s->win != MPI_WIN_NULL) {
    if (ok)
      MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
  }
fail:
  return rc;
}

static hvd_result_t mpi_open(const hvd__exec_env_t *env, void **state) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t n = (size_t)env->size;
  mpi_state_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "MPI executor state");
  s->win = MPI_WIN_NULL;
  s->counts = calloc(n, sizeof(int));
  s->displs = calloc(n, sizeof(int));
  s->counts2 = calloc(n, sizeof(int));
  s->displs2 = calloc(n, sizeof(int));
  s->splits = calloc(n, sizeof(int64_t));
  s->srcs = calloc((size_t)env->local_size, sizeof *s->srcs);
  if (!s->counts || !s->displs || !s->counts2 || !s->displs2 || !s->splits ||
      !s->srcs) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "MPI executor state");
    goto fail;
  }
  HVD__CHECK(shm_setup(s, env));
  HVD__CHECK(zc_open(s, env));
  *state = s;
  return HVD_SUCCESS;
fail:
  mpi_close(s, 0);
  return rc;
}

/* ---- helpers ------------------------------------------------------------ */

/* r's output: d's shape with `rows` in dimension 0. */
static hvd_result_t alloc_rows(hvd_request_t *r, const hvd__desc_t *d,
                               int64_t rows) {
  int64_t shape[HVD_MAX_DIMS];
  memcpy(shape, d->shape, sizeof shape);
  shape[0] = rows;
  return hvd__alloc_output(r, d->ndim, shape);
}

static int64_t desc_numel(const hvd__desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->ndim; i++)
    n *= d->shape[i];
  return n;
}

/* A contiguous datatype of one row; fails if a row or a count cannot be
 * expressed in MPI's int. */
static hvd_result_t row_type(int64_t bytes, int64_t rows, MPI_Datatype *t) {
  hvd_result_t rc = HVD_SUCCESS;
  if (bytes > INT_MAX || rows > INT_MAX)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "rows of %lld bytes x %lld rows exceed MPI's int "
                          "counts",
                          (long long)bytes, (long long)rows);
  HVD__MPI_CHECK(MPI_Type_contiguous((int)bytes, MPI_BYTE, t));
  HVD__MPI_CHECK(MPI_Type_commit(t));
fail:
  return rc;
}

/* A barrier of comm's ranks that also orders their shared-memory writes
 * and reads; with `all`, an agreement instead: *all becomes the minimum
 * of every rank's. Nonblocking plus hvd__mpi_wait: a rank waiting for a
 * peer that is descheduled yields its core instead of spinning on it. */
static hvd_result_t shm_sync(const mpi_state_t *s, MPI_Comm comm, int *all) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request mr;
  HVD__MPI_CHECK(MPI_Win_sync(s->win));
  if (all != NULL)
    HVD__MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, all, 1, MPI_INT, MPI_MIN, comm, &mr));
  else
    HVD__MPI_CHECK(MPI_Ibarrier(comm, &mr));
  HVD__CHECK(hvd__mpi_wait(&mr, all ? "MPI_Iallreduce" : "MPI_Ibarrier"));
  HVD__MPI_CHECK(MPI_Win_sync(s->win));
fail:
  return rc;
}

/* A barrier of the node's ranks, in the segment itself (a futex: a rank
 * that waits sleeps, and runs the moment the last one arrives, even with
 * other work on its core); it orders the segment's writes and reads. */
static hvd_result_t shm_barrier(const mpi_state_t *s,
                                const hvd__exec_env_t *env) {
  hvd__shm_barrier(s->bar, env->local_size);
  return HVD_SUCCESS;
}

/* The shared-memory allreduce works on pieces of at most SHM_SLOT bytes:
 *   1. each rank puts its piece into its slot (shm_mine);
 *   2. (barrier) rank k reduces segment k of the piece over every slot, in
 *      place in its own slot, then allreduces it across nodes;
 *   3. (barrier) each rank copies what it needs out of the slots, average
 *      and postscale fused into that copy when `finish` (shm_copy_out);
 *   4. the phase flips (shm_next).
 * Two phases of slots alternate: a rank writing phase p again has passed
 * the first barrier of the piece after, so every rank has copied phase p
 * out. A fused group packs its tensors straight into shm_mine and unpacks
 * them straight from the slots; shm_span does all four for one buffer. */
static char *shm_mine(const mpi_state_t *s, const hvd__exec_env_t *env) {
  return s->slot[env->local_rank] + s->phase * SHM_SLOT;
}

/* Elements per segment of a piece of cnt: cache-line multiples. */
static int64_t shm_per(int64_t cnt, int64_t p) {
  return ((cnt + p - 1) / p + 15) / 16 * 16;
}

/* Local rank k's segment [*lo, *hi) of a piece of cnt elements. */
static void shm_segment(const hvd__exec_env_t *env, int k, int64_t cnt,
                        int64_t *lo, int64_t *hi) {
  int64_t per = shm_per(cnt, env->local_size);
  *lo = k * per < cnt ? k * per : cnt;
  *hi = *lo + per < cnt ? *lo + per : cnt;
}

/* Steps 1 (done by the caller: cnt elements in shm_mine) to 3's barrier:
 * this rank's segment folded over the node's ranks in rank order (its
 * own values read where they are), then across nodes in node order.
 * With `own`, the caller left this rank's segment out of shm_mine: its
 * values are at own (the piece's start), read by the fold in place. */
static hvd_result_t shm_reduce_piece(mpi_state_t *s, const hvd__exec_env_t *env,
                                     int64_t cnt, const hvd__desc_t *d,
                                     const char *own) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  int64_t at = s->phase * SHM_SLOT, lo, hi;
  char *mine = shm_mine(s, env);
  shm_segment(env, env->local_rank, cnt, &lo, &hi);
  HVD__CHECK(shm_barrier(s, env));
  if (hi > lo) {
    for (int k = 0; k < env->local_size; k++)
      s->srcs[k] = s->slot[k] + at + lo * esize;
    if (own != NULL)
      s->srcs[env->local_rank] = own + lo * esize;
    hvd__reduce_ordered(mine + lo * esize, s->srcs, env->local_size, hi - lo,
                        dtype, (hvd_op_t)d->op);
  }
  if (s->shm_cross && hi > lo) /* same segments on every node */
    HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm, MPI_IN_PLACE,
                                      mine + lo * esize, hi - lo, dtype,
                                      (hvd_op_t)d->op));
  HVD__CHECK(shm_barrier(s, env));
fail:
  return rc;
}

/* Step 3: elements [from, from + m) of the reduced piece of cnt to dst. */
static void shm_copy_out(const mpi_state_t *s, const hvd__exec_env_t *env,
                         int64_t cnt, int64_t from, int64_t m, void *dst,
                         const hvd__desc_t *d, int finish) {
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  int64_t per = shm_per(cnt, env->local_size), at = s->phase * SHM_SLOT;
  char *to = dst;
  for (int64_t e = from, end = from + m; e < end;) {
    int64_t k = e / per; /* the segment, and the rank that reduced it */
    int64_t stop = (k + 1) * per < end ? (k + 1) * per : end;
    const char *src = s->slot[k] + at + e * esize;
    if (finish)
      hvd__reduce_finish(to, src, stop - e, dtype, (hvd_op_t)d->op,
                         d->postscale, env->size);
    else
      memcpy(to, src, (size_t)((stop - e) * esize));
    to += (stop - e) * esize;
    e = stop;
  }
}

static void shm_next(mpi_state_t *s) { s->phase ^= 1; }

/* Bytes per piece: HVD_CHUNK_SIZE, at most a slot. */
static int64_t shm_piece_bytes(const hvd__exec_env_t *env) {
  return env->chunk_bytes > 0 && env->chunk_bytes < SHM_SLOT ? env->chunk_bytes
                                                             : SHM_SLOT;
}

/* Allreduce of one buffer through the node's shared segment. */
static hvd_result_t shm_span(mpi_state_t *s, const hvd__exec_env_t *env,
                             const void *src, void *dst, int64_t n,
                             const hvd__desc_t *d, int finish) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t esize = (int64_t)hvd_dtype_size((hvd_dtype_t)d->dtype);
  int64_t piece = shm_piece_bytes(env) / esize;
  if (piece < 1)
    piece = 1;
  const char *in = src == MPI_IN_PLACE ? dst : src;
  for (int64_t off = 0; off < n; off += piece) {
    int64_t cnt = n - off < piece ? n - off : piece, lo, hi;
    const char *from = in + off * esize;
    char *mine = shm_mine(s, env);
    shm_segment(env, env->local_rank, cnt, &lo, &hi); /* the peers' only */
    memcpy(mine, from, (size_t)(lo * esize));
    memcpy(mine + hi * esize, from + hi * esize, (size_t)((cnt - hi) * esize));
    HVD__CHECK(shm_reduce_piece(s, env, cnt, d, from));
    shm_copy_out(s, env, cnt, 0, cnt, (char *)dst + off * esize, d, finish);
    shm_next(s);
  }
fail:
  return rc;
}

/* Allreduce of n elements (src may be MPI_IN_PLACE) with d's dtype and op;
 * with `finish`, average and postscale are applied to dst too. Within a
 * node through shared memory when available; else ordered reductions over
 * MPI in pieces its int can count: over all ranks, or hierarchical (within
 * the node, then among the nodes' local roots, then a broadcast within the
 * node) when asked. Either way each element is folded in one fixed order:
 * rank order, or with hierarchical each node's in local-rank order and
 * then the nodes' in node order. */
static hvd_result_t reduce_span(mpi_state_t *s, const hvd__exec_env_t *env,
                                const void *src, void *dst, int64_t n,
                                const hvd__desc_t *d, int finish) {
  if (s->shm)
    return shm_span(s, env, src, dst, n, d, finish);
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  hvd_op_t op = (hvd_op_t)d->op;
  size_t esize = hvd_dtype_size(dtype);
  int hier = env->hierarchical; /* decided for every rank alike at start */
  for (int64_t off = 0; off < n; off += CHUNK_ELEMS) {
    int64_t count = n - off < CHUNK_ELEMS ? n - off : CHUNK_ELEMS;
    const void *sp =
        src == MPI_IN_PLACE ? MPI_IN_PLACE : (const char *)src + off * esize;
    char *dp = (char *)dst + off * esize;
    if (!hier) {
      HVD__CHECK(
          hvd__ordered_allreduce(&s->ord, env->comm, sp, dp, count, dtype, op));
    } else {
      HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->local_comm, sp, dp, count,
                                        dtype, op));
      if (env->local_rank == 0)
        HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm,
                                          MPI_IN_PLACE, dp, count, dtype, op));
      HVD__MPI_CHECK(
          MPI_Bcast(dp, (int)count, hvd__mpi_dtype(dtype), 0, env->local_comm));
    }
    if (finish)
      hvd__reduce_finish(dp, dp, count, dtype, op, d->postscale, env->size);
  }
fail:
  return rc;
}

static void trace(const hvd__exec_env_t *env, const hvd_request_t *r,
                  const char *phase, double t0, double t1) {
  if (env->trace != NULL && !r->is_stub)
    env->trace(env->trace_ctx, r, phase, t0, t1);
}

/* A staging buffer of at least n bytes, kept across calls. */
static hvd_result_t staging(mpi_state_t *s, size_t n) {
  if (n <= s->stage_cap)
    return HVD_SUCCESS;
  void *p = realloc(s->stage, n);
  if (p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "fusion chunk of %zu bytes", n);
  s->stage = p;
  s->stage_cap = n;
  return HVD_SUCCESS;
}

/* A tensor of at least one chunk (or alone): reduced in the caller's
 * memory, chunk by chunk, each chunk scaled before and finished after
 * while it is in cache. Out of place without prescale, MPI reads send. */
static hvd_result_t reduce_direct(mpi_state_t *s, const hvd__exec_env_t *env,
                                  const hvd__desc_t *d, hvd_request_t *r,
                                  int64_t chunk_elems) {
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  size_t esize = hvd_dtype_size(dtype);
  int64_t n = hvd_tensor_numel(&r->send);
  double t0 = env->trace ? hvd__now() : 0;
  for (int64_t off = 0; off < n; off += chunk_elems) {
    int64_t cnt = n - off < chunk_elems ? n - off : chunk_elems;
    const char *src = (const char *)r->send.data + off * esize;
    char *dst = (char *)r->recv.data + off * esize;
    if (!r->is_stub && d->prescale != 1.0) {
      hvd__scale(dst, src, cnt, dtype, d->prescale);
      src = dst;
    }
    hvd_result_t rc = reduce_span(s, env, src == dst ? MPI_IN_PLACE : src, dst,
                                  cnt, d, !r->is_stub);
    if (rc != HVD_SUCCESS)
      return rc;
  }
  if (env->trace)
    trace(env, r, "ALLREDUCE", t0, hvd__now());
  return HVD_SUCCESS;
}

/* A compressed group (float32 tensors, float16/bfloat16 on the wire):
 * every tensor goes through the staging chunk, cast to the wire with the
 * prescale on the way in and back with average/postscale on the way out;
 * a tensor larger than a chunk is cut into pieces. Stubs (a joined rank)
 * carry the identity, which the casts keep. */
static hvd_result_t allreduce_wire(mpi_state_t *s, const hvd__exec_env_t *env,
                                   const hvd__work_t *w, int64_t chunk_elems) {
  typedef struct piece {
    int req;
    int64_t off, cnt, at;
  } piece_t;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t wire = (hvd_dtype_t)d->wire;
  hvd__desc_t dw = *d; /* what the chunk reduction sees */
  dw.dtype = d->wire;
  hvd_result_t rc = staging(s, (size_t)chunk_elems * sizeof(uint16_t));
  piece_t *pieces = malloc((size_t)(w->n + 1) * sizeof *pieces);
  if (pieces == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "compression pieces");
  uint16_t *stage = (uint16_t *)s->stage;
  int i = 0;
  int64_t off = 0;
  while (rc == HVD_SUCCESS && i < w->n) {
    int np = 0;
    int64_t used = 0;
    while (i < w->n && used < chunk_elems) { /* pack */
      hvd_request_t *r = w->reqs[i];
      int64_t left = hvd_tensor_numel(&r->send) - off;
      int64_t take = left < chunk_elems - used ? left : chunk_elems - used;
      hvd__cast_to_wire(stage + used, (const float *)r->send.data + off, take,
                        wire, r->is_stub ? 1.0 : d->prescale);
      pieces[np++] = (piece_t){i, off, take, used};
      used += take;
      off += take;
      if (off == hvd_tensor_numel(&r->send)) {
        i++;
        off = 0;
      }
    }
    rc = reduce_span(s, env, MPI_IN_PLACE, stage, used, &dw, 0);
    for (int k = 0; k < np && rc == HVD_SUCCESS; k++) { /* unpack */
      hvd_request_t *r = w->reqs[pieces[k].req];
      if (!r->is_stub)
        hvd__cast_from_wire((float *)r->recv.data + pieces[k].off,
                            stage + pieces[k].at, pieces[k].cnt, wire,
                            (hvd_op_t)d->op, d->postscale, env->size);
    }
  }
  free(pieces);
  return rc;
}

/* ---- zero-copy allreduce ------------------------------------------------
 *
 * When every tensor of a group, send and recv, is hvd_alloc_host memory on
 * every rank of the node, no byte goes through the segment's slots. The
 * group is one virtual buffer (its tensors end to end, the same sizes
 * everywhere), cut into pieces of shm_piece_bytes as shm_span's are:
 *   0. each rank writes where its tensors are (offsets in its arena) into
 *      its slot, and every rank agrees (one MPI_Iallreduce over comm, MIN)
 *      that all found their tensors in arenas;
 *   then for each piece, with no barrier between pieces:
 *   1. rank k folds segment k of the piece straight from every local
 *      rank's send tensor, in rank order, into its own recv tensor (64 KiB
 *      at a time, while in cache); with several nodes the segment is
 *      then allreduced over cross_comm, in node order;
 *   2. rank k finishes it (average, postscale) and writes it into every
 *      peer's recv tensor (the peers' arenas are mapped read-write);
 *   and a last barrier: every result is written, nobody reads this rank's
 *   tensors any more, they are the caller's again.
 * Each rank reads its segment of every send once and writes each result
 * byte once, with no copy in or out. Which rank folds an element follows
 * the group's pieces, but the fold's order does not: the bits are the
 * same whatever the fusion.
 * Groups below one piece, prescaled, compressed, or with a joined rank's
 * stub take the slots, as do all groups when zc is off. */

/* Rank k's table: per tensor of the group, its send and recv offsets. */
static const int64_t *zc_table(const mpi_state_t *s, int k) {
  return (const int64_t *)(s->slot[k] + s->phase * SHM_SLOT);
}

/* The offset in this rank's arena of t's bytes, or -1. */
static int64_t zc_offset(const mpi_state_t *s, const hvd_tensor_t *t) {
  const char *p = t->data, *base = s->arena[s->me];
  uint64_t bytes = hvd__tensor_bytes(t), size = s->arena_size[s->me];
  if (p < base || bytes > size || (uint64_t)(p - base) > size - bytes)
    return -1;
  return p - base;
}

/* Where a group's tensors start in its virtual buffer; a cursor that moves
 * forward only, as the pieces do. */
typedef struct zc_cursor {
  const hvd__work_t *w;
  int i;         /* the tensor holding `start` */
  int64_t start; /* its first element in the virtual buffer */
} zc_cursor_t;

/* n elements of tensor i from byte `at`: every local rank's send folded
 * in rank order (this rank's read where it is) into this rank's recv. */
static void zc_sum(const mpi_state_t *s, hvd_request_t *r, int i, int64_t at,
                   int64_t n, hvd_dtype_t dtype, hvd_op_t op) {
  for (int q = 0; q < s->nlocal; q++)
    s->srcs[q] = q == s->me ? (const char *)r->send.data + at
                            : s->arena[q] + zc_table(s, q)[2 * i] + at;
  hvd__reduce_ordered((char *)r->recv.data + at, s->srcs, s->nlocal, n, dtype,
                      op);
}

/* Those n elements finished (average, postscale) and written into every
 * peer's recv. */
static void zc_out(const mpi_state_t *s, const hvd__exec_env_t *env,
                   hvd_request_t *r, int i, int64_t at, int64_t n,
                   const hvd__desc_t *d) {
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  char *to = (char *)r->recv.data + at;
  hvd__reduce_finish(to, to, n, dtype, (hvd_op_t)d->op, d->postscale,
                     env->size);
  for (int q = 0; q < s->nlocal; q++)
    if (q != s->me)
      memcpy(s->arena[q] + zc_table(s, q)[2 * i + 1] + at, to,
             (size_t)n * hvd_dtype_size(dtype));
}

/* Elements [a, b) of the virtual buffer (this rank's segment of a piece),
 * tensor by tensor: summed from every rank's send into this rank's recv,
 * finished, and written into every peer's recv. */
static hvd_result_t zc_range(mpi_state_t *s, const hvd__exec_env_t *env,
                             zc_cursor_t *c, int64_t a, int64_t b) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = c->w->desc;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  hvd_op_t op = (hvd_op_t)d->op;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  while (hvd_tensor_numel(&c->w->reqs[c->i]->send) <= a - c->start) {
    c->start += hvd_tensor_numel(&c->w->reqs[c->i]->send);
    c->i++;
  }
  int i = c->i;
  int64_t start = c->start;
  while (a < b) {
    hvd_request_t *r = c->w->reqs[i];
    int64_t m = hvd_tensor_numel(&r->send);
    int64_t lo = a - start, hi = (b < start + m ? b : start + m) - start;
    int64_t n = hi - lo, at = lo * esize;
    if (!s->shm_cross) { /* block by block, while each is in cache */
      for (int64_t x = 0; x < n; x += ZC_BLOCK / esize) {
        int64_t k = n - x < ZC_BLOCK / esize ? n - x : ZC_BLOCK / esize;
        zc_sum(s, r, i, at + x * esize, k, dtype, op);
        zc_out(s, env, r, i, at + x * esize, k, d);
      }
    } else { /* the range's sums, allreduced across the nodes, then out */
      zc_sum(s, r, i, at, n, dtype, op);
      HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm, MPI_IN_PLACE,
                                        (char *)r->recv.data + at, n, dtype,
                                        op));
      zc_out(s, env, r, i, at, n, d);
    }
    a += n;
    if (a == start + m) {
      start += m;
      i++;
    }
  }
fail:
  return rc;
}

/* The group zero-copy if every rank can (*done set), else nothing. */
static hvd_result_t zc_allreduce(mpi_state_t *s, const hvd__exec_env_t *env,
                                 const hvd__work_t *w, int *done) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  int64_t esize = (int64_t)hvd_dtype_size((hvd_dtype_t)d->dtype), total = 0;
  int64_t piece = shm_piece_bytes(env) / esize;
  *done = 0;
  for (int i = 0; i < w->n; i++)
    total += hvd_tensor_numel(&w->reqs[i]->send);
  /* the same on every rank: sizes, factors and settings are agreed */
  if (!s->zc || d->prescale != 1.0 || piece < 1 || total < piece ||
      (int64_t)(2 * (size_t)w->n * sizeof(int64_t)) > SHM_SLOT)
    return HVD_SUCCESS;
  int64_t *tab = (int64_t *)shm_mine(s, env);
  int ok = 1;
  for (int i = 0; i < w->n; i++) { /* step 0 */
    hvd_request_t *r = w->reqs[i];
    tab[2 * i] = r->is_stub ? -1 : zc_offset(s, &r->send);
    tab[2 * i + 1] = r->is_stub ? -1 : zc_offset(s, &r->recv);
    ok = ok && tab[2 * i] >= 0 && tab[2 * i + 1] >= 0;
  }
  HVD__CHECK(shm_sync(s, env->comm, &ok));
  if (!ok)
    return HVD_SUCCESS; /* every rank takes the slots */
  double t0 = env->trace ? hvd__now() : 0;
  /* Rank k owns segment k of each piece: it reads that segment of every
   * rank's send (no rank writes there: an in-place peer's recv segment k
   * is written by k alone, after k has read it) and writes the result
   * into every rank's recv. No barrier until every piece is done. */
  zc_cursor_t cur = {w, 0, 0};
  for (int64_t off = 0; off < total; off += piece) {
    int64_t cnt = total - off < piece ? total - off : piece, lo, hi;
    shm_segment(env, s->me, cnt, &lo, &hi);
    if (hi > lo)
      HVD__CHECK(zc_range(s, env, &cur, off + lo, off + hi));
  }
  HVD__CHECK(shm_barrier(s, env));
  shm_next(s);
  *done = 1;
  if (env->trace) {
    double t1 = hvd__now();
    for (int i = 0; i < w->n; i++)
      trace(env, w->reqs[i], "SHM_ZERO_COPY_ALLREDUCE", t0, t1);
  }
fail:
  return rc;
}

/* A fused group: tensors of a chunk or more go in place (no copy); runs of
 * smaller tensors are packed into one chunk (prescale fused into the copy),
 * reduced, and unpacked (average and postscale fused into the copy back).
 * With the shared-memory allreduce the chunk is this rank's slot and the
 * unpack reads the slots, so the copies are the only passes over the bytes;
 * otherwise it is a staging buffer. Each chunk is packed, reduced and
 * unpacked while it is hot in cache. */
static hvd_result_t mpi_allreduce(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  mpi_state_t *s = state;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  int64_t chunk = env->chunk_bytes > 0 ? env->chunk_bytes : HVD__MPI_CHUNK;
  int64_t chunk_elems = chunk / esize > 0 ? chunk / esize : 1;
  if (d->wire != d->dtype)
    return allreduce_wire(s, env, w, chunk_elems);
  int zc_done = 0;
  hvd_result_t rc = zc_allreduce(s, env, w, &zc_done);
  if (rc != HVD_SUCCESS || zc_done)
    return rc;
  /* the same choice on every rank: shm is agreed, the chunk is a setting */
  const int direct = s->shm && chunk_elems * esize <= shm_piece_bytes(env);
  if (w->n > 1 && !direct)
    rc = staging(s, (size_t)(chunk_elems * esize));
  /* Packing decisions depend on sizes only, which every rank agrees on; a
   * joined rank's stubs take the same path with identity data. */
  for (int i = 0; i < w->n && rc == HVD_SUCCESS;) {
    hvd_request_t *r = w->reqs[i];
    int64_t n = hvd_tensor_numel(&r->send);
    if (n >= chunk_elems || w->n == 1) {
      rc = reduce_direct(s, env, d, r, chunk_elems);
      i++;
      continue;
    }
    int j = i;
    int64_t used = 0;
    char *buf = direct ? shm_mine(s, env) : s->stage;
    double t0 = env->trace ? hvd__now() : 0, t1;
    for (; j < w->n; j++) { /* pack */
      hvd_request_t *q = w->reqs[j];
      int64_t m = hvd_tensor_numel(&q->send);
      if (m >= chunk_elems || used + m > chunk_elems)
        break;
      hvd__scale(buf + used * esize, q->send.data, m, dtype,
                 q->is_stub ? 1.0 : d->prescale);
      used += m;
      if (env->trace) {
        t1 = hvd__now();
        trace(env, q, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
        t0 = t1;
      }
    }
    rc = direct ? shm_reduce_piece(s, env, used, d, NULL)
                : reduce_span(s, env, MPI_IN_PLACE, buf, used, d, 0);
    if (env->trace) {
      t1 = hvd__now();
      for (int k = i; k < j; k++)
        trace(env, w->reqs[k], "ALLREDUCE", t0, t1);
      t0 = t1;
    }
    for (int64_t at = 0; i < j; i++) { /* unpack */
      hvd_request_t *q = w->reqs[i];
      int64_t m = hvd_tensor_numel(&q->send);
      if (rc == HVD_SUCCESS && !q->is_stub) {
        if (direct)
          shm_copy_out(s, env, used, at, m, q->recv.data, d, 1);
        else
          hvd__reduce_finish(q->recv.data, buf + at * esize, m, dtype,
                             (hvd_op_t)d->op, d->postscale, env->size);
      }
      at += m;
      if (env->trace) {
        t1 = hvd__now();
        trace(env, q, "MEMCPY_OUT_FUSION_BUFFER", t0, t1);
        t0 = t1;
      }
    }
    if (direct)
      shm_next(s); /* the next piece flips, as in shm_span */
  }
  return rc;
}

static hvd_result_t mpi_broadcast(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  (void)state;
  hvd_result_t rc = HVD_SUCCESS;
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    int64_t bytes = (int64_t)hvd__tensor_bytes(&r->send);
    for (int64_t off = 0; off < bytes; off += CHUNK_ELEMS) {
      int count = (int)(bytes - off < CHUNK_ELEMS ? bytes - off : CHUNK_ELEMS);
      HVD__MPI_CHECK(MPI_Bcast((char *)r->send.data + off, count, MPI_BYTE,
                               w->desc->root, env->comm));
    }
  }
fail:
  return rc;
}

/* Grows *buf to at least n bytes (kept for the next time). */
static hvd_result_t grow(void **buf, size_t *cap, size_t n, const char *what) {
  if (n <= *cap)
    return HVD_SUCCESS;
  void *p = realloc(*buf, n);
  if (p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s (%zu bytes)", what, n);
  *buf = p;
  *cap = n;
  return HVD_SUCCESS;
}

/* A fused group of allgathers (w->n > 1, host tensors, any dtypes and
 * rows) in one MPI_Allgatherv of bytes. Rank q's segment holds q's rows of
 * each tensor in the group's order; each result is then copied out of the
 * segments. The first dimensions of members agreed through the cache
 * (dims0s[i] NULL) are learnt in one MPI_Allgather for all of them. */
static hvd_result_t allgather_fused(mpi_state_t *s, const hvd__exec_env_t *env,
                                    const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  int m = w->n, P = env->size, nc = 0;
  HVD__CHECK(grow((void **)&s->gdims, &s->gdims_cap,
                  (size_t)(2 * m + 1) * (size_t)P * sizeof *s->gdims,
                  "fused allgather"));
  int64_t *dims = s->gdims;               /* [i * P + q]: rows */
  int64_t *learnt = dims + (size_t)m * P; /* [q * m + j] */
  memset(learnt + (size_t)env->rank * (size_t)m, 0, (size_t)m * sizeof *learnt);
  for (int i = 0; i < m; i++)
    if (w->dims0s[i] == NULL)
      learnt[(size_t)env->rank * (size_t)m + (size_t)nc++] =
          w->reqs[i]->send.shape[0];
  if (nc > 0) { /* rank q's entries at q * m (stride m >= nc) */
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, m, MPI_INT64_T, learnt, m,
                                 MPI_INT64_T, env->comm));
  }
  for (int i = 0, j = 0; i < m; i++) {
    for (int q = 0; q < P; q++)
      dims[(size_t)i * P + (size_t)q] =
          w->dims0s[i] != NULL ? w->dims0s[i][q]
                               : learnt[(size_t)q * (size_t)m + (size_t)j];
    j += w->dims0s[i] == NULL;
  }
  int64_t total = 0;
  for (int q = 0; q < P; q++) {
    int64_t seg = 0;
    for (int i = 0; i < m; i++)
      seg +=
          dims[(size_t)i * P + (size_t)q] * hvd__row_bytes(&w->reqs[i]->desc);
    if (seg > INT_MAX || total + seg > INT_MAX)
      return hvd__set_error(HVD_ERR_UNSUPPORTED,
                            "a fused allgather of %lld bytes exceeds MPI's "
                            "int counts (lower HVD_FUSION_THRESHOLD)",
                            (long long)(total + seg));
    s->counts[q] = (int)seg;
    s->displs[q] = (int)total;
    total += seg;
  }
  for (int i = 0; i < m; i++) { /* the results */
    int64_t rows = 0;
    for (int q = 0; q < P; q++)
      rows += dims[(size_t)i * P + (size_t)q];
    HVD__CHECK(alloc_rows(w->reqs[i], &w->reqs[i]->desc, rows));
  }
  if (total == 0)
    return HVD_SUCCESS;
  HVD__CHECK(grow((void **)&s->gather, &s->gather_cap, (size_t)total,
                  "fused allgather buffer"));
  char *mine = s->gather + s->displs[env->rank];
  for (int i = 0; i < m; i++) {
    size_t b =
        (size_t)(w->reqs[i]->send.shape[0] * hvd__row_bytes(&w->reqs[i]->desc));
    if (b > 0)
      memcpy(mine, w->reqs[i]->send.data, b);
    mine += b;
  }
  HVD__MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, s->gather, s->counts,
                                s->displs, MPI_BYTE, env->comm));
  for (int q = 0; q < P; q++) {
    const char *from = s->gather + s->displs[q];
    for (int i = 0; i < m; i++) {
      int64_t rb = hvd__row_bytes(&w->reqs[i]->desc), before = 0;
      for (int k = 0; k < q; k++)
        before += dims[(size_t)i * P + (size_t)k];
      size_t b = (size_t)(dims[(size_t)i * P + (size_t)q] * rb);
      if (b > 0)
        memcpy((char *)w->reqs[i]->recv.data + before * rb, from, b);
      from += b;
    }
  }
fail:
  return rc;
}

static hvd_result_t mpi_allgather(void *state, const hvd__exec_env_t *env,
                                  const hvd__work_t *w) {
  mpi_state_t *s = state;
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  if (w->n > 1)
    return allgather_fused(s, env, w);
  MPI_Datatype row = MPI_DATATYPE_NULL;
  hvd_request_t *r = w->reqs[0];
  const int64_t *dims0 = w->dims0;
  if (dims0 == NULL) { /* agreed through the cache: learn them now */
    s->splits[env->rank] = r->send.shape[0];
    HVD__MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 1, MPI_INT64_T, s->splits, 1,
                                 MPI_INT64_T, env->comm));
    dims0 = s->splits;
  }
  int64_t total = 0;
  for (int k = 0; k < env->size; k++)
    total += dims0[k];
  HVD__CHECK(alloc_rows(r, d, total));
  int64_t rb = hvd__row_bytes(d);
  if (rb == 0 || total == 0)
    return HVD_SUCCESS;
  HVD__CHECK(row_type(rb, total, &row));
  for (int k = 0, at = 0; k < env->size; k++) {
    s->counts[k] = (int)dims0[k];
    s->displs[k] = at;
    at += s->counts[k];
  }
  HVD__MPI_CHECK(MPI_Allgatherv(r->send.data, s->counts[env->rank], row,
                                r->recv.data, s->counts, s->displs, row,
                                env->comm));
fail:
  if (row != MPI_DATATYPE_NULL)
    MPI_Type_free(&row);
  return rc;
}

static hvd_result_t mpi_alltoall(void *state, const hvd__exec_env_t *env,
                                 const hvd__work_t *w) {
  mpi_state_t *s = state;
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  MPI_Datatype row = MPI_DATATYPE_NULL;
  hvd_request_t *r = w->reqs[0];
  size_t n = (size_t)env->size;
  int64_t total, sent = 0;
  HVD__CHECK(hvd__exchange_splits(r, env, &total));
  for (size_t k = 0; k < n; k++)
    sent += r->splits[k];
  HVD__CHECK(alloc_rows(r, d, total));
  int64_t rb = hvd__row_bytes(d);
  if (rb == 0)
    return HVD_SUCCESS;
  HVD__CHECK(row_type(rb, total > sent ? total : sent, &row));
  for (size_t k = 0, sat = 0, rat = 0; k < n; k++) {
    s->counts[k] = (int)r->splits[k];
    s->displs[k] = (int)sat;
    s->counts2[k] = (int)r->recv_splits[k];
    s->displs2[k] = (int)rat;
    sat += (size_t)r->splits[k];
    rat += (size_t)r->recv_splits[k];
  }
  HVD__MPI_CHECK(MPI_Alltoallv(r->send.data, s->counts, s->displs, row,
                               r->recv.data, s->counts2, s->displs2, row,
                               env->comm));
fail:
  if (row != MPI_DATATYPE_NULL)
    MPI_Type_free(&row);
  return rc;
}

/* A fused group of reducescatters (w->n > 1, host tensors of one dtype,
 * op and scaling; any shapes) in one ordered reduce-scatter (rank order,
 * as one tensor's alone). The send buffer
 * holds block k of every member, in the group's order, for k = 0..P-1
 * (prescaled as they are packed); this rank's reduced blocks come back
 * after them, are finished (average, postscale) at once and copied out
 * to each member's result. */
static hvd_result_t reducescatter_fused(mpi_state_t *s,
                                        const hvd__exec_env_t *env,
                                        const hvd__work_t *w) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  size_t es = hvd_dtype_size(dtype);
  int64_t P = env->size, total = 0;
  for (int64_t k = 0; k < P; k++) {
    int64_t cnt = 0; /* elements of block k over the group */
    for (int i = 0; i < w->n; i++) {
      const hvd__desc_t *di = &w->reqs[i]->desc;
      cnt += hvd__block_rows(di->shape[0], P, k) *
             (hvd__row_bytes(di) / (int64_t)es);
    }
    if (cnt > INT_MAX)
      return hvd__set_error(HVD_ERR_UNSUPPORTED,
                            "a fused reducescatter block of %lld elements "
                            "exceeds MPI's int counts (lower "
                            "HVD_FUSION_THRESHOLD)",
                            (long long)cnt);
    s->counts[k] = (int)cnt;
    total += cnt;
  }
  int64_t mine = s->counts[env->rank];
  for (int i = 0; i < w->n; i++) { /* the results */
    const hvd__desc_t *di = &w->reqs[i]->desc;
    HVD__CHECK(alloc_rows(w->reqs[i], di,
                          hvd__block_rows(di->shape[0], P, env->rank)));
  }
  if (total == 0)
    return HVD_SUCCESS;
  HVD__CHECK(grow((void **)&s->gather, &s->gather_cap,
                  (size_t)(total + mine) * es, "fused reducescatter buffer"));
  char *at = s->gather, *got = s->gather + (size_t)total * es;
  for (int64_t k = 0; k < P; k++)
    for (int i = 0; i < w->n; i++) {
      const hvd_request_t *r = w->reqs[i];
      int64_t rows = r->desc.shape[0], rb = hvd__row_bytes(&r->desc);
      int64_t n = hvd__block_rows(rows, P, k) * rb / (int64_t)es;
      if (n == 0) /* (an empty tensor's data may be NULL) */
        continue;
      const char *from =
          (const char *)r->send.data + hvd__block_first(rows, P, k) * rb;
      hvd__scale(at, from, n, dtype, d->prescale); /* a copy at 1.0 */
      at += (size_t)n * es;
    }
  HVD__CHECK(hvd__ordered_reduce_scatter(
      &s->ord, env->comm, s->gather, s->counts, got, dtype, (hvd_op_t)d->op));
  hvd__reduce_finish(got, got, mine, dtype, (hvd_op_t)d->op, d->postscale,
                     env->size);
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    size_t b = (size_t)(hvd__block_rows(r->desc.shape[0], P, env->rank) *
                        hvd__row_bytes(&r->desc));
    if (b > 0)
      memcpy(r->recv.data, got, b);
    got += b;
  }
fail:
  return rc;
}

static hvd_result_t mpi_reducescatter(void *state, const hvd__exec_env_t *env,
                                      const hvd__work_t *w) {
  mpi_state_t *s = state;
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  if (w->n > 1)
    return reducescatter_fused(s, env, w);
  hvd_request_t *r = w->reqs[0];
  hvd_dtype_t dtype = (hvd_dtype_t)d->dtype;
  void *scaled = NULL;
  int64_t rows = d->shape[0], p = env->size;
  int64_t row_elems = hvd__row_bytes(d) / (int64_t)hvd_dtype_size(dtype);
  int64_t mine = hvd__block_rows(rows, p, env->rank);
  HVD__CHECK(alloc_rows(r, d, mine));
  if (rows / p * row_elems + row_elems > INT_MAX)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "a reducescatter block exceeds MPI's int counts");
  for (int k = 0; k < env->size; k++)
    s->counts[k] = (int)(hvd__block_rows(rows, p, k) * row_elems);
  const void *src = r->send.data;
  if (d->prescale != 1.0) {
    int64_t n = desc_numel(d);
    scaled = malloc((size_t)n * hvd_dtype_size(dtype) + 1);
    if (scaled == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "reducescatter prescale");
    hvd__scale(scaled, src, n, dtype, d->prescale);
    src = scaled;
  }
  HVD__CHECK(hvd__ordered_reduce_scatter(&s->ord, env->comm, src, s->counts,
                                         r->recv.data, dtype, (hvd_op_t)d->op));
  hvd__reduce_finish(r->recv.data, r->recv.data, mine * row_elems, dtype,
                     (hvd_op_t)d->op, d->postscale, env->size);
fail:
  free(scaled);
  return rc;
}

hvd_result_t hvd__mpi_barrier(void *state, const hvd__exec_env_t *env,
                              const hvd__work_t *w) {
  (void)state;
  (void)w;
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request mr;
  HVD__MPI_CHECK(MPI_Ibarrier(env->comm, &mr));
  rc = hvd__mpi_wait(&mr, "MPI_Ibarrier");
fail:
  return rc;
}

/* A joined rank's contribution on the host: the identity of the op. */
static hvd_result_t mpi_stub_alloc(void *state, const hvd__exec_env_t *env,
                                   hvd_request_t *r) {
  (void)state;
  (void)env;
  int64_t n = hvd_tensor_numel(&r->send);
  r->send.device = HVD_CPU;
  r->send.data = malloc((size_t)n * hvd_dtype_size(r->send.dtype) + 1);
  if (r->send.data == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "stub for '%s'", r->name);
  hvd__fill_identity(r->send.data, n, r->send.dtype, (hvd_op_t)r->desc.op);
  r->recv = r->send;
  return HVD_SUCCESS;
}

static void mpi_stub_free(void *state, hvd_request_t *r) {
  (void)state;
  free(r->send.data);
  r->send.data = r->recv.data = NULL;
}

const hvd__executor_t hvd__mpi_executor = {
    .name = "mpi",
    .open = mpi_open,
    .close = mpi_close,
    .run =
        {
            [HVD__ALLREDUCE] = mpi_allreduce,
            [HVD__BROADCAST] = mpi_broadcast,
            [HVD__ALLGATHER] = mpi_allgather,
            [HVD__ALLTOALL] = mpi_alltoall,
            [HVD__REDUCESCATTER] = mpi_reducescatter,
            [HVD__BARRIER] = hvd__mpi_barrier,
        },
    .stub_alloc = mpi_stub_alloc,
    .stub_free = mpi_stub_free,
    .default_chunk = HVD__MPI_CHUNK,
    .fuses = 1u << HVD__ALLGATHER | 1u << HVD__REDUCESCATTER,
};
