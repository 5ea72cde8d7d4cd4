/*
 * host_mem.c - hvd_alloc_host / hvd_free_host: host memory for tensors
 * that are read and written in full every step (gradients, parameters,
 * optimizer state), kept where the other ranks of the node can read it.
 *
 * Where: the process's arena, one memfd (shared memory with no name, gone
 * with the process) of HVD__ARENA_SIZE bytes, sparse, mapped once
 * MAP_SHARED at a 2 MiB-aligned address. A block is a range of it: 2 MiB-
 * aligned from 2 MiB up, page-aligned below (a block takes whole pages).
 * The MPI executor maps each peer's arena (through /proc/<pid>/fd/<fd>)
 * when it opens, so an allreduce whose tensors are all in arenas on every
 * rank of the node reads the peers' tensors and writes their results
 * where they are instead of copying them through a shared segment
 * (ops/mpi_ops.c, "zero-copy"). Freeing punches the range out of the file
 * (the pages go back to the system and read as zero next time) and
 * returns it to a free list (first fit, merged with its neighbours).
 *
 * Without an arena (HVD_HOST_ARENA=0, memfd_create or the mapping refused,
 * or the arena full) a block of HVD__HOST_HUGE bytes or more is its own
 * private anonymous mapping, 2 MiB-aligned, marked MADV_HUGEPAGE, its
 * length rounded up to 4 KiB (rounding to 2 MiB cost bert-base's gradients
 * 122 MiB per rank); smaller blocks come from posix_memalign, 64-byte
 * aligned. The trade: shared memory gets huge pages only where the kernel
 * allows them for shmem (THP shmem_enabled "advise" or more); measured in
 * doc/bench.md ("Zero-copy allreduce"). Both kinds are zero-filled. A list
 * of live blocks tells hvd_free_host which is which and refuses pointers it
 * did not hand out.
 */
#include "base/host_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/settings.h"

#define HUGE_PAGE ((size_t)2 << 20)
#define HVD__HOST_HUGE HUGE_PAGE /* blocks from here on get huge pages */
#define SMALL_PAGE ((size_t)4096)
#define SMALL_ALIGN 64

enum { IN_ARENA, MAPPED, MEMALIGNED };

typedef struct block {
  void *p;
  size_t len; /* arena: the range's length; MAPPED: the mapping's */
  int kind;
} block_t;

typedef struct range {
  uint64_t off, len;
} range_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static block_t *blocks;
static size_t nblocks, cap;

/* mu is held across fork(), so that a child never starts with it taken
 * by a thread it does not have. */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void fork_lock(void) { pthread_mutex_lock(&mu); }
static void fork_unlock(void) { pthread_mutex_unlock(&mu); }
static void fork_safe(void) {
  (void)pthread_atfork(fork_lock, fork_unlock, fork_unlock);
}

/* The arena: made on first use; state 1 ready, -1 none (for good). */
static struct {
  int state;
  long pid; /* the process that made it */
  int fd;
  char *base;
  range_t *free; /* sorted by offset, never adjacent */
  size_t nfree, capfree;
} arena;

/* bytes rounded up to whole 4 KiB pages; p rounded up to 2 MiB. */
static size_t page_round(size_t bytes) {
  return (bytes + SMALL_PAGE - 1) / SMALL_PAGE * SMALL_PAGE;
}

static char *huge_align(char *p) {
  return (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
}

static int grow(void **a, size_t *capp, size_t n, size_t each) {
  if (n < *capp)
    return 1;
  size_t ncap = *capp ? 2 * *capp : 64;
  void *na = realloc(*a, ncap * each);
  if (na == NULL)
    return 0;
  *a = na;
  *capp = ncap;
  return 1;
}

static int remember(void *p, size_t len, int kind) {
  pthread_mutex_lock(&mu);
  int ok = grow((void **)&blocks, &cap, nblocks, sizeof *blocks);
  if (ok)
    blocks[nblocks++] = (block_t){p, len, kind};
  pthread_mutex_unlock(&mu);
  return ok;
}

/* Removes p from the list into *b. 0: not ours. */
static int forget(void *p, block_t *b) {
  pthread_mutex_lock(&mu);
  for (size_t i = nblocks; i-- > 0;) /* the newest first */
    if (blocks[i].p == p) {
      *b = blocks[i];
      blocks[i] = blocks[--nblocks];
      pthread_mutex_unlock(&mu);
      return 1;
    }
  pthread_mutex_unlock(&mu);
  return 0;
}

/* ---- the arena ----------------------------------------------------------- */

/* HVD_HOST_ARENA: read here, since hvd_alloc_host needs no hvd_init, by
 * the settings' own parser, so that what hvd_init reports and logs is
 * what happens ("00" and "0.0" are 0 there, and turned the arena off only
 * there once this read just "0"). A malformed value, which hvd_init will
 * refuse, leaves the arena on (the default), with a warning. */
static int arena_wanted(void) {
  char why[HVD__ERRMSG_MAX];
  int on = hvd__setting_bool("HVD_HOST_ARENA", why, sizeof why);
  if (why[0] != '\0')
    HVD__LOG(HVD__LOG_WARNING,
             "hvd_alloc_host: %s; the shared arena is used (its default)", why);
  return on;
}

/* With mu held. */
static int arena_ready(void) {
  if (arena.state != 0)
    return arena.state > 0;
  arena.state = -1;
  if (!arena_wanted())
    return 0;
  int fd = memfd_create("hvd-host-arena", MFD_CLOEXEC);
  if (fd < 0) {
    HVD__LOG(HVD__LOG_INFO,
             "hvd_alloc_host: no shared arena (memfd_create: %s)",
             strerror(errno));
    return 0;
  }
  /* reserve size + 2 MiB, then put the file at the aligned address */
  size_t size = (size_t)HVD__ARENA_SIZE;
  char *raw = mmap(NULL, size + HUGE_PAGE, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  char *at = MAP_FAILED;
  if (ftruncate(fd, (off_t)size) == 0 && raw != MAP_FAILED) {
    at = mmap(huge_align(raw), size, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, 0);
  }
  if (at == MAP_FAILED) {
    HVD__LOG(HVD__LOG_INFO, "hvd_alloc_host: no shared arena (%s)",
             strerror(errno));
    if (raw != MAP_FAILED)
      munmap(raw, size + HUGE_PAGE);
    close(fd);
    return 0;
  }
  size_t head = (size_t)(at - raw);
  if (head > 0)
    munmap(raw, head);
  munmap(at + size, HUGE_PAGE - head);
#ifdef MADV_HUGEPAGE
  (void)madvise(at, size, MADV_HUGEPAGE); /* shmem THP "advise" honours it */
#endif
#ifdef MADV_DONTDUMP
  (void)madvise(at, size, MADV_DONTDUMP); /* a core holds the blocks only */
#endif
  arena.free = malloc(64 * sizeof *arena.free);
  if (arena.free == NULL) {
    munmap(at, size);
    close(fd);
    return 0;
  }
  arena.capfree = 64;
  arena.free[0] = (range_t){0, size};
  arena.nfree = 1;
  arena.fd = fd;
  arena.base = at;
  arena.pid = (long)getpid();
  arena.state = 1;
  return 1;
}

/* First fit of len bytes aligned to align; UINT64_MAX when full. */
static uint64_t arena_take(uint64_t len, uint64_t align) {
  for (size_t i = 0; i < arena.nfree; i++) {
    range_t *r = &arena.free[i];
    uint64_t at = (r->off + align - 1) / align * align, end = r->off + r->len;
    if (at > end || end - at < len)
      continue;
    uint64_t head = at - r->off, tail = end - at - len;
    if (head > 0 && tail > 0) { /* split in two */
      if (!grow((void **)&arena.free, &arena.capfree, arena.nfree,
                sizeof *arena.free))
        return UINT64_MAX;
      r = &arena.free[i];
      memmove(r + 2, r + 1, (arena.nfree - i - 1) * sizeof *r);
      arena.nfree++;
      r[0].len = head;
      r[1] = (range_t){at + len, tail};
    } else if (head > 0) {
      r->len = head;
    } else if (tail > 0) {
      *r = (range_t){at + len, tail};
    } else {
      memmove(r, r + 1, (arena.nfree - i - 1) * sizeof *r);
      arena.nfree--;
    }
    return at;
  }
  return UINT64_MAX;
}

/* Gives [off, off + len) back, merged with its neighbours. 0: no memory
 * for the list (the range is then lost to the arena, not to the system). */
static int arena_give(uint64_t off, uint64_t len) {
  size_t i = 0;
  while (i < arena.nfree && arena.free[i].off < off)
    i++;
  int before = i > 0 && arena.free[i - 1].off + arena.free[i - 1].len == off;
  int after = i < arena.nfree && off + len == arena.free[i].off;
  if (before && after) {
    arena.free[i - 1].len += len + arena.free[i].len;
    memmove(&arena.free[i], &arena.free[i + 1],
            (arena.nfree - i - 1) * sizeof *arena.free);
    arena.nfree--;
  } else if (before) {
    arena.free[i - 1].len += len;
  } else if (after) {
    arena.free[i].off = off;
    arena.free[i].len += len;
  } else {
    if (!grow((void **)&arena.free, &arena.capfree, arena.nfree,
              sizeof *arena.free))
      return 0;
    memmove(&arena.free[i + 1], &arena.free[i],
            (arena.nfree - i) * sizeof *arena.free);
    arena.free[i] = (range_t){off, len};
    arena.nfree++;
  }
  return 1;
}

/* Whether the arena is this process's: a child forked from the process
 * that made it shares its pages (MAP_SHARED) but has a copy of its free
 * list, so that a block both took, or a hole one punched, would be the
 * other's too. The child's blocks are private; its frees of the parent's
 * blocks touch nothing. arena.pid is set once, under mu, before any block
 * of the arena exists (and a block reaches release through mu). */
static int arena_ours(void) { return arena.pid == (long)getpid(); }

/* A block of the arena, or NULL (no arena, or full). */
static void *arena_alloc(size_t bytes, size_t *len) {
  void *p = NULL;
  *len = page_round(bytes > 0 ? bytes : 1);
  pthread_mutex_lock(&mu);
  if (arena_ready() && arena_ours()) {
    uint64_t off = arena_take(*len, *len >= HUGE_PAGE ? HUGE_PAGE : SMALL_PAGE);
    if (off != UINT64_MAX)
      p = arena.base + off;
  }
  pthread_mutex_unlock(&mu);
#ifdef MADV_DODUMP
  if (p != NULL)
    (void)madvise(p, *len, MADV_DODUMP);
#endif
  return p;
}

static void arena_free(void *p, size_t len) {
  uint64_t off = (uint64_t)((char *)p - arena.base);
#ifdef MADV_DONTDUMP
  (void)madvise(p, len, MADV_DONTDUMP);
#endif
  /* the pages go back to the system; the range reads as zero again */
  if (fallocate(arena.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                (off_t)off, (off_t)len) != 0)
    memset(p, 0, len); /* zero-filled all the same */
  pthread_mutex_lock(&mu);
  (void)arena_give(off, len);
  pthread_mutex_unlock(&mu);
}

int hvd__host_arena(int *fd, char **base, uint64_t *size) {
  pthread_mutex_lock(&mu);
  int ok = arena_ready();
  if (ok) {
    *fd = arena.fd;
    *base = arena.base;
    *size = HVD__ARENA_SIZE;
  }
  pthread_mutex_unlock(&mu);
  return ok;
}

/* ---- without an arena -----------------------------------------------------
 */

/* A 2 MiB-aligned anonymous mapping of len bytes (a multiple of 4 KiB):
 * map len + 2 MiB, then unmap what lies outside the aligned part. */
static void *map_aligned(size_t len) {
  char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    return NULL;
  char *at = huge_align(raw);
  size_t head = (size_t)(at - raw);
  if (head > 0)
    munmap(raw, head);
  munmap(at + len, HUGE_PAGE - head); /* head < 2 MiB */
#ifdef MADV_HUGEPAGE
  (void)madvise(at, len, MADV_HUGEPAGE); /* advice; may be refused */
#endif
  return at;
}

static void *private_alloc(size_t bytes, size_t *len, int *kind) {
  void *p = NULL;
  if (bytes >= HVD__HOST_HUGE) {
    *kind = MAPPED;
    *len = page_round(bytes);
    return map_aligned(*len);
  }
  *kind = MEMALIGNED;
  *len = bytes;
  if (posix_memalign(&p, SMALL_ALIGN, bytes > 0 ? bytes : 1) != 0)
    return NULL;
  memset(p, 0, bytes);
  return p;
}

static void release(const block_t *b) {
  if (b->kind == IN_ARENA) {
    if (arena_ours()) /* else the parent's block, in a forked child */
      arena_free(b->p, b->len);
  } else if (b->kind == MAPPED)
    munmap(b->p, b->len);
  else
    free(b->p);
}

void *hvd_alloc_host(size_t bytes) {
  block_t b = {NULL, 0, IN_ARENA};
  pthread_once(&fork_once, fork_safe);
  if (bytes > SIZE_MAX - 2 * HUGE_PAGE) {
    hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_alloc_host: %zu bytes", bytes);
    return NULL;
  }
  if (bytes <= HVD__ARENA_SIZE)
    b.p = arena_alloc(bytes, &b.len);
  if (b.p == NULL)
    b.p = private_alloc(bytes, &b.len, &b.kind);
  if (b.p == NULL) {
    hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_alloc_host: %zu bytes: %s", bytes,
                   strerror(errno ? errno : ENOMEM));
    return NULL;
  }
  if (!remember(b.p, b.len, b.kind)) {
    release(&b);
    hvd__set_error(HVD_ERR_NO_MEMORY,
                   "hvd_alloc_host: %zu bytes: no memory to record the block",
                   bytes);
    return NULL;
  }
  return b.p;
}

hvd_result_t hvd_free_host(void *p) {
  block_t b;
  if (p == NULL)
    return HVD_SUCCESS;
  if (!forget(p, &b))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_free_host: %p was not allocated by "
                          "hvd_alloc_host (or was freed already)",
                          p);
  release(&b);
  return HVD_SUCCESS;
}
