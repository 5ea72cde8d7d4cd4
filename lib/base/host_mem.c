/*
 * host_mem.c - hvd_alloc_host / hvd_free_host: host memory for tensors
 * that are read and written in full every step (gradients, parameters,
 * optimizer state).
 *
 * Why: on a virtual machine every TLB miss walks two page tables (the
 * guest's and the host's). Streaming 400 MB of gradients through 4 KiB
 * pages costs a walk every 4 KiB, and how much each walk costs depends on
 * where the run's pages happen to land: measured on the 2-core KVM VM
 * (doc/bench.md, "Huge pages"), the same allreduce of bert-base's
 * gradients took 63-70 ms in some runs and 140-155 ms in others, the
 * whole run one way or the other. On 2 MiB pages (transparent huge pages,
 * asked for with madvise) ten runs in a row stayed within 7 %.
 *
 * How: a block of HVD__HOST_HUGE bytes or more is its own anonymous
 * mapping, 2 MiB-aligned, marked MADV_HUGEPAGE (the kernel may still give
 * 4 KiB pages: THP "never", or no free huge page at fault time). Its
 * length is rounded up to 4 KiB only: the last, partial 2 MiB of a block
 * takes 4 KiB pages. Rounding up to 2 MiB instead cost bert-base's
 * gradients 122 MiB per rank (72 tensors of 2.25 MiB each taking 4 MiB).
 * Smaller blocks are not worth a huge page each: they come from posix_memalign,
 * 64-byte aligned. Both are zero-filled. A list of live blocks tells
 * hvd_free_host which is which and refuses pointers it did not hand out.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/errors.h"
#include "internal.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define HVD__HOST_HUGE HUGE_PAGE /* blocks from here on get huge pages */
#define SMALL_PAGE ((size_t)4096)
#define SMALL_ALIGN 64

typedef struct block {
  void *p;
  size_t map_len; /* 0: posix_memalign'd */
} block_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block_t *blocks;
static size_t nblocks, cap;

static int remember(void *p, size_t map_len) {
  pthread_mutex_lock(&mu);
  if (nblocks == cap) {
    size_t ncap = cap ? 2 * cap : 64;
    block_t *nb = realloc(blocks, ncap * sizeof *nb);
    if (nb == NULL) {
      pthread_mutex_unlock(&mu);
      return 0;
    }
    blocks = nb;
    cap = ncap;
  }
  blocks[nblocks++] = (block_t){p, map_len};
  pthread_mutex_unlock(&mu);
  return 1;
}

/* Removes p from the list; *map_len says how it was made. 0: not ours. */
static int forget(void *p, size_t *map_len) {
  pthread_mutex_lock(&mu);
  for (size_t i = nblocks; i-- > 0;) /* the newest first */
    if (blocks[i].p == p) {
      *map_len = blocks[i].map_len;
      blocks[i] = blocks[--nblocks];
      pthread_mutex_unlock(&mu);
      return 1;
    }
  pthread_mutex_unlock(&mu);
  return 0;
}

/* A 2 MiB-aligned anonymous mapping of len bytes (a multiple of 4 KiB):
 * map len + 2 MiB, then unmap what lies outside the aligned part. */
static void *map_aligned(size_t len) {
  char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return NULL;
  uintptr_t at = ((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  size_t head = at - (uintptr_t)raw;
  if (head > 0)
    munmap(raw, head);
  munmap((char *)at + len, HUGE_PAGE - head); /* head < 2 MiB */
#ifdef MADV_HUGEPAGE
  (void)madvise((void *)at, len, MADV_HUGEPAGE); /* advice; may be refused */
#endif
  return (void *)at;
}

void *hvd_alloc_host(size_t bytes) {
  void *p = NULL;
  size_t map_len = 0;
  if (bytes >= HVD__HOST_HUGE) {
    if (bytes > SIZE_MAX - 2 * HUGE_PAGE) {
      hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_alloc_host: %zu bytes", bytes);
      return NULL;
    }
    map_len = (bytes + SMALL_PAGE - 1) / SMALL_PAGE * SMALL_PAGE;
    p = map_aligned(map_len);
  } else {
    int err = posix_memalign(&p, SMALL_ALIGN, bytes > 0 ? bytes : 1);
    if (err != 0)
      p = NULL;
    else
      memset(p, 0, bytes);
  }
  if (p == NULL) {
    hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_alloc_host: %zu bytes: %s", bytes,
                   strerror(errno ? errno : ENOMEM));
    return NULL;
  }
  if (!remember(p, map_len)) {
    if (map_len > 0)
      munmap(p, map_len);
    else
      free(p);
    hvd__set_error(HVD_ERR_NO_MEMORY,
                   "hvd_alloc_host: %zu bytes: no memory to record the block",
                   bytes);
    return NULL;
  }
  return p;
}

hvd_result_t hvd_free_host(void *p) {
  size_t map_len = 0;
  if (p == NULL)
    return HVD_SUCCESS;
  if (!forget(p, &map_len))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_free_host: %p was not allocated by "
                          "hvd_alloc_host (or was freed already)",
                          p);
  if (map_len > 0)
    munmap(p, map_len);
  else
    free(p);
  return HVD_SUCCESS;
}
