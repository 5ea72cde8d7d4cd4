/*
 * zero-copy-probe.c - would a zero-copy allreduce beat hvd's shared-memory
 * one on this machine? Two processes (fork), N bytes of float32 each,
 * summed in place, timed three ways, alternating, median of --iters:
 *
 *   copy    each process memcpy's its N bytes into another buffer: the
 *           memory system's speed (hvd-bench's floor comes from it)
 *   window  both tensors live in one shared mapping (memfd, MAP_SHARED:
 *           what an arena in the node's shared-memory window would be; on
 *           this kernel shared memory gets 4 KiB pages, THP shmem_enabled
 *           permitting); per chunk, each process sums its half of the
 *           chunk straight from the peer's tensor into its own, a barrier,
 *           then copies the peer's summed half into its own tensor
 *   cma     the tensors are private (hvd_alloc_host's kind: 2 MiB-aligned,
 *           MADV_HUGEPAGE); the peer's half comes through process_vm_readv
 *           (Linux CMA) into a cache-sized buffer, then as above, the
 *           summed half read straight into the own tensor
 *
 * hvd's own path (copy into a 256 KiB slot of the shared window, reduce,
 * copy out) is measured by `hvd-bench list` on the same tensors.
 *
 *   cc -O2 -o zero-copy-probe bench/zero-copy-probe.c && ./zero-copy-probe
 *      [MiB (default 418: bert-base)] [iters (default 10)] [chunk KiB (256)]
 *
 * Prints one line per method: median, min, max ms of the slower process.
 * Exit status 1 if a sum was wrong or CMA is not permitted (ptrace rules).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct ctl {
  _Atomic unsigned arrived[2]; /* barrier generation per process */
  pid_t pid[2];
  float *priv[2]; /* cma: each process's private tensor */
  double ms[3][2][64];
  int wrong[2];
} ctl_t;

enum { M_COPY, M_WINDOW, M_CMA };
static const char *const names[] = {"copy", "window (shared, in place)",
                                    "cma (process_vm_readv)"};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void barrier(ctl_t *c, int me, unsigned *gen) {
  ++*gen;
  atomic_store(&c->arrived[me], *gen);
  while (atomic_load(&c->arrived[!me]) < *gen)
    ;
}

static void *huge_private(size_t n) {
  size_t h = (size_t)2 << 20;
  char *raw = mmap(NULL, n + h, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return NULL;
  char *p = (char *)(((uintptr_t)raw + h - 1) & ~(uintptr_t)(h - 1));
  madvise(p, n, MADV_HUGEPAGE);
  return p;
}

static void fill(float *x, size_t n, int me) {
  for (size_t i = 0; i < n; i++)
    x[i] = (float)(me + 1);
}

static int check(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != 3.0f)
      return 0;
  return 1;
}

static void sum_into(float *restrict d, const float *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++)
    d[i] += s[i];
}

/* One allreduce of n floats, in chunks; own/peer for window, cma uses
 * process_vm_readv from the peer's private tensor. */
static int run(int m, ctl_t *c, int me, unsigned *gen, float *own,
               const float *peer, float *tmp, size_t n, size_t chunk) {
  for (size_t at = 0; at < n; at += chunk) {
    size_t len = n - at < chunk ? n - at : chunk, half = len / 2;
    size_t mine = me == 0 ? at : at + half, mlen = me == 0 ? half : len - half;
    size_t other = me == 0 ? at + half : at, olen = len - mlen;
    if (m == M_WINDOW) {
      sum_into(own + mine, peer + mine, mlen);
    } else {
      struct iovec l = {tmp, mlen * sizeof(float)};
      struct iovec r = {c->priv[!me] + mine, mlen * sizeof(float)};
      if (process_vm_readv(c->pid[!me], &l, 1, &r, 1, 0) !=
          (ssize_t)(mlen * sizeof(float)))
        return -1;
      sum_into(own + mine, tmp, mlen);
    }
    barrier(c, me, gen);
    if (m == M_WINDOW) {
      memcpy(own + other, peer + other, olen * sizeof(float));
    } else {
      struct iovec l = {own + other, olen * sizeof(float)};
      struct iovec r = {c->priv[!me] + other, olen * sizeof(float)};
      if (process_vm_readv(c->pid[!me], &l, 1, &r, 1, 0) !=
          (ssize_t)(olen * sizeof(float)))
        return -1;
    }
  }
  barrier(c, me, gen); /* the peer may reuse its tensor after this */
  return 0;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 418;
  int iters = argc > 2 ? atoi(argv[2]) : 10;
  size_t chunk = (argc > 3 ? strtoul(argv[3], NULL, 10) : 256) * 1024 / 4;
  size_t n = mib * 1024 * 1024 / sizeof(float);
  if (iters < 1 || iters > 64 || n < 2 || chunk < 2) {
    fprintf(stderr, "usage: zero-copy-probe [MiB] [iters 1..64] [chunk KiB]\n");
    return 2;
  }
  ctl_t *c = mmap(NULL, sizeof(ctl_t), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  float *win = mmap(NULL, 2 * n * sizeof(float), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (c == MAP_FAILED || win == MAP_FAILED)
    return perror("mmap"), 1;
  memset(c, 0, sizeof *c);
  pid_t child = fork();
  int me = child == 0;
  unsigned gen = 0;
  c->pid[me] = getpid();
  float *priv = huge_private(n * sizeof(float));
  float *dst = huge_private(n * sizeof(float));
  float *tmp = malloc(chunk * sizeof(float));
  c->priv[me] = priv;
  fill(priv, n, me);
  fill(win + me * n, n, me);
  memset(dst, 0, n * sizeof(float));
  barrier(c, me, &gen);
  for (int it = -1; it < iters; it++) {
    for (int m = 0; m < 3; m++) {
      float *own = m == M_WINDOW ? win + me * n : priv;
      fill(own, n, me);
      barrier(c, me, &gen);
      double t0 = now();
      int rc = 0;
      if (m == M_COPY)
        memcpy(dst, own, n * sizeof(float));
      else
        rc = run(m, c, me, &gen, own, win + (!me) * n, tmp, n, chunk);
      double t = (now() - t0) * 1e3;
      if (rc != 0) {
        fprintf(stderr, "process_vm_readv: %s\n", strerror(errno));
        c->wrong[me] = 2;
        m = 3;
        it = iters;
        break;
      }
      if (it < 0 && m != M_COPY && !check(own, n))
        c->wrong[me] = 1;
      if (it >= 0)
        c->ms[m][me][it] = t;
      barrier(c, me, &gen);
    }
  }
  if (me == 1)
    return 0;
  waitpid(child, NULL, 0);
  printf("# zero-copy-probe: 2 processes, %zu MiB float32 each, chunks of %zu "
         "KiB, %d iters (slower process)\n",
         mib, chunk * 4 / 1024, iters);
  for (int m = 0; m < 3; m++) {
    double t[64];
    for (int i = 0; i < iters; i++)
      t[i] = c->ms[m][0][i] > c->ms[m][1][i] ? c->ms[m][0][i] : c->ms[m][1][i];
    qsort(t, (size_t)iters, sizeof *t, cmp);
    printf("%-28s median %8.2f ms  min %8.2f  max %8.2f\n", names[m],
           t[iters / 2], t[0], t[iters - 1]);
  }
  if (c->wrong[0] || c->wrong[1])
    printf("WRONG: a sum was wrong or process_vm_readv failed\n");
  return c->wrong[0] || c->wrong[1];
}
