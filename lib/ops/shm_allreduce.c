/*
 * shm_allreduce.c - the MPI executor's allreduce within a node through
 * shared memory (mpi_int.h): each local rank's slots of a segment from
 * MPI_Win_allocate_shared, and the zero-copy path that reads and writes
 * the peers' hvd_alloc_host arenas in place. Every element is folded over
 * the node's ranks in rank order (hvd__reduce_ordered), then over the
 * nodes in node order (hvd__ordered_allreduce over cross_comm), whatever
 * the pieces.
 */
#include "ops/mpi_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "base/errors.h"
#include "base/host_mem.h"
#include "base/log.h"
#include "base/tensor.h"
#include "ops/reduce.h"

#define SHM_SLOT ((int64_t)4 << 20)  /* bytes per rank and phase */
#define ZC_BLOCK ((int64_t)64 << 10) /* zc_range's cache block, bytes */
/* cross-memory attach's block: fewer system calls, still within L2 */
#define CMA_BLOCK ((int64_t)256 << 10)
#define SHM_CTL ((int64_t)4096) /* after the slots: the barrier */

/* ---- the peers' arenas ------------------------------------------------- */

static void zc_close(hvd__shm_t *s) {
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
static hvd_result_t zc_open(hvd__shm_t *s, const hvd__exec_env_t *env) {
  hvd_result_t rc = HVD_SUCCESS;
  int n = env->local_size, fd = -1, ok = 0;
  char *base = NULL;
  uint64_t size = 0;
  int64_t me[3], *all = s->rows;
  if (!s->on)
    return HVD_SUCCESS;
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
  if (!s->zc)
    zc_close(s);
  return rc;
}

/* ---- cross-memory attach: tensors outside the arenas --------------------- */

/* What a peer reads at open to show that it may (the value: its rank). */
static volatile int64_t cma_probe;

/* Yama's ptrace_scope 1 lets a process be read only by its ancestors,
 * unless it names a tracer: PR_SET_PTRACER_ANY opens this process to
 * every process of its user, for as long as one executor of the process
 * may use cross-memory attach (a count under a lock: process sets open
 * and close their own). Without Yama, or at scope 0 (any process of the
 * user already may) or 2 and 3 (no naming helps), nothing is changed. */
static pthread_mutex_t ptracer_mu = PTHREAD_MUTEX_INITIALIZER;
static int ptracer_users;

static int yama_scope(void) {
  FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
  int v = -1;
  if (f != NULL) {
    if (fscanf(f, "%d", &v) != 1)
      v = -1;
    fclose(f);
  }
  return v;
}

static void ptracer_hold(hvd__shm_t *s) {
#ifdef PR_SET_PTRACER
  if (s->ptracer || yama_scope() != 1)
    return;
  pthread_mutex_lock(&ptracer_mu);
  if (ptracer_users++ == 0)
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  pthread_mutex_unlock(&ptracer_mu);
  s->ptracer = 1;
#else
  (void)s;
#endif
}

static void ptracer_release(hvd__shm_t *s) {
#ifdef PR_SET_PTRACER
  if (!s->ptracer)
    return;
  pthread_mutex_lock(&ptracer_mu);
  if (--ptracer_users == 0)
    (void)prctl(PR_SET_PTRACER, 0, 0, 0, 0);
  pthread_mutex_unlock(&ptracer_mu);
  s->ptracer = 0;
#else
  (void)s;
#endif
}

static void cma_close(hvd__shm_t *s) {
  ptracer_release(s);
  free(s->pids);
  free(s->scratch);
  s->pids = NULL;
  s->scratch = NULL;
  s->cma = 0;
}

/* n bytes at `remote` in process pid into local, or the reverse (write):
 * all of them, or -1 with errno. */
static int cma_move(int pid, void *local, const void *remote, size_t n,
                    int write) {
  while (n > 0) {
    struct iovec l = {local, n}, r = {(void *)remote, n};
    ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                        : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0)
      return -1;
    local = (char *)local + got;
    remote = (const char *)remote + got;
    n -= (size_t)got;
  }
  return 0;
}

/* Cross-memory attach on when every rank of every node may read and write
 * its local peers' memory (the same user; under Yama's ptrace_scope 1 a
 * process allows it with PR_SET_PTRACER_ANY, held while it is on and
 * dropped when it ends up off; containers without ptrace rights refuse
 * it): each rank reads every local peer's probe. One node only. */
static hvd_result_t cma_open(hvd__shm_t *s, const hvd__exec_env_t *env) {
  hvd_result_t rc = HVD_SUCCESS;
  int n = env->local_size, ok = s->on && !s->cross && env->zero_copy;
  int64_t me[2], *all = s->rows;
  if (ok)
    ptracer_hold(s);
  cma_probe = env->local_rank;
  me[0] = (int64_t)getpid();
  me[1] = (int64_t)(intptr_t)&cma_probe;
  s->scratch = malloc((size_t)n * (size_t)CMA_BLOCK); /* else: off */
  ok = ok && s->scratch != NULL;
  if (s->on)
    HVD__MPI_CHECK(MPI_Allgather(me, 2, MPI_INT64_T, all, 2, MPI_INT64_T,
                                 env->local_comm));
  for (int k = 0; ok && k < n; k++) {
    int64_t v = -1;
    s->pids[k] = (int)all[2 * k];
    ok = k == env->local_rank ||
         (cma_move(s->pids[k], &v, (const void *)(intptr_t)all[2 * k + 1],
                   sizeof v, 0) == 0 &&
          v == k);
  }
  int v = ok;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, env->comm));
  s->cma = v;
  if (s->on)
    HVD__LOG(HVD__LOG_INFO, "allreduce of tensors outside the arenas: %s",
             v ? "cross-memory attach (process_vm_readv/writev)"
               : "the shared slots (no cross-memory attach here)");
fail:
  if (!s->cma)
    cma_close(s);
  return rc;
}

/* The node's shared segment: MPI_Win_allocate_shared over local_comm, two
 * phases of SHM_SLOT bytes per local rank. Used only if every rank has one
 * and the nodes are alike (segments must line up across nodes); otherwise
 * every rank takes the MPI path. */
static hvd_result_t shm_setup(hvd__shm_t *s, const hvd__exec_env_t *env) {
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
  s->on = env->shm && v[0] == 0 && v[1] == -v[2] && v[1] > 1;
  s->cross = s->on && env->local_size < env->size;
  if (s->on)
    HVD__LOG(HVD__LOG_INFO,
             "allreduce path: shared memory within the node (%d ranks)%s",
             env->local_size, s->cross ? ", then MPI across the nodes" : "");
  else if (env->hierarchical)
    HVD__LOG(HVD__LOG_INFO, "allreduce path: MPI, hierarchical (fold within "
                            "the node, then across the nodes' local roots, "
                            "broadcast within)");
  else
    HVD__LOG(HVD__LOG_INFO, "allreduce path: MPI over all %d ranks", env->size);
  if (!s->on && s->win != MPI_WIN_NULL) {
    if (ok)
      MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
  }
fail:
  return rc;
}

/* A barrier of comm's ranks that also orders their shared-memory writes
 * and reads; with `all`, an agreement instead: *all becomes the minimum
 * of every rank's. Nonblocking plus hvd__mpi_wait: a rank waiting for a
 * peer that is descheduled yields its core instead of spinning on it. */
static hvd_result_t shm_sync(const hvd__shm_t *s, MPI_Comm comm, int *all) {
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
static hvd_result_t shm_barrier(const hvd__shm_t *s,
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
static char *shm_mine(const hvd__shm_t *s, const hvd__exec_env_t *env) {
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
static hvd_result_t shm_reduce_piece(hvd__shm_t *s, const hvd__exec_env_t *env,
                                     int64_t cnt, const hvd__desc_t *d,
                                     const char *own) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_dtype_t dtype = d->dtype;
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
                        dtype, d->op);
  }
  if (s->cross && hi > lo) /* same segments on every node */
    HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm, MPI_IN_PLACE,
                                      mine + lo * esize, hi - lo, dtype,
                                      d->op));
  HVD__CHECK(shm_barrier(s, env));
fail:
  return rc;
}

/* Step 3: elements [from, from + m) of the reduced piece of cnt to dst. */
static void shm_copy_out(const hvd__shm_t *s, const hvd__exec_env_t *env,
                         int64_t cnt, int64_t from, int64_t m, void *dst,
                         const hvd__desc_t *d, int finish) {
  hvd_dtype_t dtype = d->dtype;
  int64_t esize = (int64_t)hvd_dtype_size(dtype);
  int64_t per = shm_per(cnt, env->local_size), at = s->phase * SHM_SLOT;
  char *to = dst;
  for (int64_t e = from, end = from + m; e < end;) {
    int64_t k = e / per; /* the segment, and the rank that reduced it */
    int64_t stop = (k + 1) * per < end ? (k + 1) * per : end;
    const char *src = s->slot[k] + at + e * esize;
    if (finish)
      hvd__reduce_finish(to, src, stop - e, dtype, d->op, d->postscale,
                         env->size);
    else
      memcpy(to, src, (size_t)((stop - e) * esize));
    to += (stop - e) * esize;
    e = stop;
  }
}

void hvd__shm_next(hvd__shm_t *s) { s->phase ^= 1; }

/* Bytes per piece: HVD_CHUNK_SIZE, at most a slot. */
int64_t hvd__shm_piece_bytes(const hvd__exec_env_t *env) {
  return env->chunk_bytes > 0 && env->chunk_bytes < SHM_SLOT ? env->chunk_bytes
                                                             : SHM_SLOT;
}

/* Allreduce of one buffer through the node's shared segment. */
hvd_result_t hvd__shm_span(hvd__shm_t *s, const hvd__exec_env_t *env,
                           const void *src, void *dst, int64_t n,
                           const hvd__desc_t *d, int finish) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t esize = (int64_t)hvd_dtype_size(d->dtype);
  int64_t piece = hvd__shm_piece_bytes(env) / esize;
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
    hvd__shm_next(s);
  }
fail:
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

/* Rank k's table: per tensor of the group, its send and recv offsets in
 * its arena (-1: outside), then their addresses. */
static const int64_t *zc_table(const hvd__shm_t *s, int k) {
  return (const int64_t *)(s->slot[k] + s->phase * SHM_SLOT);
}

/* The offset in this rank's arena of t's bytes, or -1. */
static int64_t zc_offset(const hvd__shm_t *s, const hvd_tensor_t *t) {
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
static hvd_result_t zc_sum(const hvd__shm_t *s, hvd_request_t *r, int i,
                           int64_t at, int64_t n, hvd_dtype_t dtype,
                           hvd_op_t op) {
  size_t bytes = (size_t)n * hvd_dtype_size(dtype);
  for (int q = 0; q < s->nlocal; q++) {
    const int64_t *t = zc_table(s, q) + 4 * i;
    if (q == s->me) {
      s->srcs[q] = (const char *)r->send.data + at;
    } else if (s->mode == 2) {
      s->srcs[q] = s->arena[q] + t[0] + at;
    } else { /* a block (bytes <= CMA_BLOCK) of the peer's send, copied */
      char *buf = s->scratch + (size_t)q * (size_t)CMA_BLOCK;
      if (cma_move(s->pids[q], buf, (const char *)(intptr_t)t[2] + at, bytes,
                   0) != 0)
        return hvd__set_error(HVD_ERR_SYSTEM,
                              "allreduce: process_vm_readv from local rank "
                              "%d: %s",
                              q, strerror(errno));
      s->srcs[q] = buf;
    }
  }
  hvd__reduce_ordered((char *)r->recv.data + at, s->srcs, s->nlocal, n, dtype,
                      op);
  return HVD_SUCCESS;
}

/* Those n elements finished (average, postscale) and written into every
 * peer's recv. */
static hvd_result_t zc_out(const hvd__shm_t *s, const hvd__exec_env_t *env,
                           hvd_request_t *r, int i, int64_t at, int64_t n,
                           const hvd__desc_t *d) {
  hvd_dtype_t dtype = d->dtype;
  char *to = (char *)r->recv.data + at;
  size_t bytes = (size_t)n * hvd_dtype_size(dtype);
  hvd__reduce_finish(to, to, n, dtype, d->op, d->postscale, env->size);
  for (int q = 0; q < s->nlocal; q++) {
    const int64_t *t = zc_table(s, q) + 4 * i;
    if (q == s->me)
      continue;
    if (s->mode == 2)
      memcpy(s->arena[q] + t[1] + at, to, bytes);
    else if (cma_move(s->pids[q], to, (const char *)(intptr_t)t[3] + at, bytes,
                      1) != 0)
      return hvd__set_error(HVD_ERR_SYSTEM,
                            "allreduce: process_vm_writev to local rank %d: "
                            "%s",
                            q, strerror(errno));
  }
  return HVD_SUCCESS;
}

/* Elements [a, b) of the virtual buffer (this rank's segment of a piece),
 * tensor by tensor: summed from every rank's send into this rank's recv,
 * finished, and written into every peer's recv. */
static hvd_result_t zc_range(hvd__shm_t *s, const hvd__exec_env_t *env,
                             zc_cursor_t *c, int64_t a, int64_t b) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = c->w->desc;
  hvd_dtype_t dtype = d->dtype;
  hvd_op_t op = d->op;
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
    if (!s->cross) { /* block by block, while each is in cache */
      int64_t blk = (s->mode == 2 ? ZC_BLOCK : CMA_BLOCK) / esize;
      for (int64_t x = 0; x < n; x += blk) {
        int64_t k = n - x < blk ? n - x : blk;
        HVD__CHECK(zc_sum(s, r, i, at + x * esize, k, dtype, op));
        HVD__CHECK(zc_out(s, env, r, i, at + x * esize, k, d));
      }
    } else { /* the range's sums, allreduced across the nodes, then out */
      HVD__CHECK(zc_sum(s, r, i, at, n, dtype, op));
      HVD__CHECK(hvd__ordered_allreduce(&s->ord, env->cross_comm, MPI_IN_PLACE,
                                        (char *)r->recv.data + at, n, dtype,
                                        op));
      HVD__CHECK(zc_out(s, env, r, i, at, n, d));
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
hvd_result_t hvd__zc_allreduce(hvd__shm_t *s, const hvd__exec_env_t *env,
                               const hvd__work_t *w, int *done) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__desc_t *d = w->desc;
  int64_t esize = (int64_t)hvd_dtype_size(d->dtype), total = 0;
  int64_t piece = hvd__shm_piece_bytes(env) / esize;
  *done = 0;
  for (int i = 0; i < w->n; i++)
    total += hvd_tensor_numel(&w->reqs[i]->send);
  /* the same on every rank: sizes, factors and settings are agreed */
  if ((!s->zc && !s->cma) || d->prescale != 1.0 || piece < 1 || total < piece ||
      (int64_t)(4 * (size_t)w->n * sizeof(int64_t)) > SHM_SLOT)
    return HVD_SUCCESS;
  int64_t *tab = (int64_t *)shm_mine(s, env);
  int in_arena = s->zc, stubs = 0;
  for (int i = 0; i < w->n; i++) { /* step 0 */
    hvd_request_t *r = w->reqs[i];
    stubs += r->is_stub;
    tab[4 * i] = r->is_stub || !s->zc ? -1 : zc_offset(s, &r->send);
    tab[4 * i + 1] = r->is_stub || !s->zc ? -1 : zc_offset(s, &r->recv);
    tab[4 * i + 2] = (int64_t)(intptr_t)r->send.data;
    tab[4 * i + 3] = (int64_t)(intptr_t)r->recv.data;
    in_arena = in_arena && tab[4 * i] >= 0 && tab[4 * i + 1] >= 0;
  }
  /* 2: every tensor in the arenas; 1: cross-memory attach; 0: slots */
  int mode = in_arena ? 2 : s->cma && stubs == 0 ? 1 : 0;
  HVD__CHECK(shm_sync(s, env->comm, &mode));
  if (mode == 0)
    return HVD_SUCCESS; /* every rank takes the slots */
  s->mode = mode;
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
  hvd__shm_next(s);
  *done = 1;
  if (env->trace) {
    double t1 = hvd__now();
    for (int i = 0; i < w->n; i++)
      hvd__mpi_trace(
          env, w->reqs[i],
          mode == 2 ? "SHM_ZERO_COPY_ALLREDUCE" : "SHM_CMA_ALLREDUCE", t0, t1);
  }
fail:
  return rc;
}

/* ---- the executor's side ------------------------------------------------ */

int hvd__shm_alloc(hvd__shm_t *s, const hvd__exec_env_t *env) {
  size_t n = (size_t)env->local_size;
  s->win = MPI_WIN_NULL;
  s->nlocal = env->local_size;
  s->me = env->local_rank;
  s->srcs = calloc(n, sizeof *s->srcs);
  s->rows = calloc(n * 3, sizeof *s->rows);
  s->arena = calloc(n, sizeof *s->arena);
  s->arena_size = calloc(n, sizeof *s->arena_size);
  s->pids = calloc(n, sizeof *s->pids);
  return s->srcs != NULL && s->rows != NULL && s->arena != NULL &&
         s->arena_size != NULL && s->pids != NULL;
}

hvd_result_t hvd__shm_open(hvd__shm_t *s, const hvd__exec_env_t *env) {
  hvd_result_t rc = HVD_SUCCESS;
  HVD__CHECK(shm_setup(s, env));
  HVD__CHECK(zc_open(s, env));
  HVD__CHECK(cma_open(s, env));
fail:
  free(s->rows); /* the open's only */
  s->rows = NULL;
  return rc;
}

void hvd__shm_close(hvd__shm_t *s, int collective) {
  if (s->win != MPI_WIN_NULL && collective) { /* MPI_Win_free: the node */
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
  } /* else left to MPI_Finalize: no collective after a failure */
  free(s->slot);
  s->slot = NULL;
  zc_close(s);
  cma_close(s);
  free(s->srcs);
  s->srcs = NULL;
  free(s->rows);
  s->rows = NULL;
  hvd__ordered_free(&s->ord);
}

char *hvd__shm_chunk(const hvd__shm_t *s, const hvd__exec_env_t *env) {
  return shm_mine(s, env);
}

hvd_result_t hvd__shm_reduce_chunk(hvd__shm_t *s, const hvd__exec_env_t *env,
                                   int64_t cnt, const hvd__desc_t *d) {
  return shm_reduce_piece(s, env, cnt, d, NULL);
}

void hvd__shm_unpack(const hvd__shm_t *s, const hvd__exec_env_t *env,
                     int64_t cnt, int64_t from, int64_t m, void *dst,
                     const hvd__desc_t *d) {
  shm_copy_out(s, env, cnt, from, m, dst, d, 1);
}
