/*
 * host_mem.c - hvd_alloc_host / hvd_free_host (lib/base/host_mem.c):
 * alignment, zero fill, refusals with their messages, many blocks, two
 * threads at once; in the shared arena (the default) the memfd mapping,
 * pages given back on free, free ranges merged; built again with
 * HOST_MEM_PRIVATE (t/unit/host_mem_private, HVD_HOST_ARENA=0): the
 * huge-page advice as the kernel records it (/proc/self/smaps) and the
 * exact private mapping. One process, never calls hvd_init.
 */
#include "hvd.h"
#include "tap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)

#ifdef HOST_MEM_PRIVATE
static const int arena = 0;
#else
static const int arena = 1;
#endif

static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0)
      return 0;
  return 1;
}

/* The smaps entry of the mapping that starts at p: its size in KiB and
 * whether VmFlags has `hg` (MADV_HUGEPAGE). 0 when there is none. */
static int smaps_of(const void *p, long *kib, int *hg) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512];
  int in = 0, found = 0;
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') &&
        line[0] != ' ') {
      in = lo == (unsigned long)(uintptr_t)p;
      if (in) {
        *kib = (long)((hi - lo) / 1024);
        found = 1;
      }
    } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
      *hg = strstr(line, " hg") != NULL;
    }
  }
  fclose(f);
  return found;
}

/* The /proc/self/maps line of the mapping holding p, into line. */
static int maps_line(const void *p, char *line, size_t cap) {
  FILE *f = fopen("/proc/self/maps", "r");
  int found = 0;
  if (f == NULL)
    return 0;
  while (!found && fgets(line, (int)cap, f) != NULL) {
    unsigned long lo, hi;
    found = sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
            lo <= (unsigned long)(uintptr_t)p &&
            (unsigned long)(uintptr_t)p < hi;
  }
  fclose(f);
  return found;
}

/* kB of RssShmem in /proc/self/status; -1 if absent. */
static long rss_shmem_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "RssShmem: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

/* The arena: one shared memfd mapping; freed pages go back; free ranges
 * merge, so three freed neighbours hold a block of their joint size. */
static void arena_blocks(void) {
  char line[512] = "";
  unsigned char *p = hvd_alloc_host(100);
  is_int(0, (long long)((uintptr_t)p % 4096), "arena: 100 bytes take a page");
  ok(maps_line(p, line, sizeof line) &&
         strstr(line, "/memfd:hvd-host-arena") != NULL,
     "arena: the block is in the memfd hvd-host-arena");
  ok(strstr(line, " rw-s ") != NULL, "arena: mapped shared, read-write");
  hvd_free_host(p);

  long before = rss_shmem_kib();
  unsigned char *big = hvd_alloc_host(8 * MIB);
  memset(big, 0x77, 8 * MIB);
  long touched = rss_shmem_kib();
  ok(touched - before >= 8 * 1024,
     "arena: 8 MiB written are 8 MiB of shared memory");
  hvd_free_host(big);
  ok(touched - rss_shmem_kib() >= 8 * 1024,
     "arena: freed, the 8 MiB go back to the system");
  unsigned char *again = hvd_alloc_host(8 * MIB);
  ok(again == big, "arena: the same range is handed out again");
  ok(all_zero(again, 8 * MIB), "arena: and reads as zero");
  hvd_free_host(again);

  unsigned char *a = hvd_alloc_host(2 * MIB), *b = hvd_alloc_host(2 * MIB),
                *c = hvd_alloc_host(2 * MIB);
  ok(b == a + 2 * MIB && c == b + 2 * MIB,
     "arena: 3 x 2 MiB lie side by side");
  hvd_free_host(b);
  hvd_free_host(a);
  hvd_free_host(c);
  unsigned char *abc = hvd_alloc_host(6 * MIB);
  ok(abc == a, "arena: freed b, a, c merge into one range of 6 MiB");
  hvd_free_host(abc);

  char want[160];
  unsigned char *q = hvd_alloc_host(3 * MIB);
  snprintf(want, sizeof want,
           "hvd_free_host: %p was not allocated by hvd_alloc_host (or was "
           "freed already)",
           (void *)(q + 4096));
  is_int(HVD_ERR_INVALID_ARG, hvd_free_host(q + 4096),
         "arena: a pointer inside a block: refused");
  is_string(want, hvd_last_error(), "arena: ... the message names it");
  is_int(HVD_SUCCESS, hvd_free_host(q), "arena: the block itself: freed");
}

static int thp_available(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  char buf[128] = "";
  if (f == NULL)
    return 0;
  if (fgets(buf, sizeof buf, f) == NULL)
    buf[0] = '\0';
  fclose(f);
  return strstr(buf, "[never]") == NULL && buf[0] != '\0';
}

static void small_blocks(void) {
  unsigned char *p = hvd_alloc_host(100);
  ok(p != NULL, "100 bytes: a block");
  is_int(0, (long long)((uintptr_t)p % 64), "100 bytes: 64-byte aligned");
  ok(all_zero(p, 100), "100 bytes: zero-filled");
  memset(p, 0xab, 100);
  is_int(HVD_SUCCESS, hvd_free_host(p), "100 bytes: freed");

  void *z = hvd_alloc_host(0);
  ok(z != NULL, "0 bytes: a valid block");
  is_int(HVD_SUCCESS, hvd_free_host(z), "0 bytes: freed");
  is_int(HVD_SUCCESS, hvd_free_host(NULL), "NULL: accepted");

  unsigned char *q = hvd_alloc_host(2 * MIB - 1);
  is_int(0, (long long)((uintptr_t)q % 64), "2 MiB - 1: 64-byte aligned");
  ok(all_zero(q, 2 * MIB - 1), "2 MiB - 1: zero-filled");
  is_int(HVD_SUCCESS, hvd_free_host(q), "2 MiB - 1: freed");
}

static void huge_blocks(void) {
  size_t n = 5 * MIB + 3;
  unsigned char *p = hvd_alloc_host(n);
  long kib = 0;
  int hg = 0;
  ok(p != NULL, "5 MiB + 3: a block");
  is_int(0, (long long)((uintptr_t)p % (2 * MIB)),
         "5 MiB + 3: 2 MiB-aligned");
  ok(all_zero(p, n), "5 MiB + 3: zero-filled");
  memset(p, 0x5a, n);
  ok(p[0] == 0x5a && p[n - 1] == 0x5a, "5 MiB + 3: every byte writable");
  /* without the advice, the kernel may merge the mapping with a neighbour */
  if (arena) {
    is_int(HVD_SUCCESS, hvd_free_host(p), "5 MiB + 3: freed");
    skip(6, "the arena is one mapping (checked in arena_blocks)");
    return;
  }
  if (thp_available()) {
    ok(smaps_of(p, &kib, &hg), "5 MiB + 3: a mapping of its own starts there");
    is_int(5 * 1024 + 4, kib, "5 MiB + 3: rounded up to 4 KiB, no more");
    ok(hg, "5 MiB + 3: marked MADV_HUGEPAGE (VmFlags hg)");
  } else {
    skip(3, "transparent huge pages are off here");
  }
  is_int(HVD_SUCCESS, hvd_free_host(p), "5 MiB + 3: freed");
  kib = 0;
  ok(!smaps_of(p, &kib, &hg), "5 MiB + 3: unmapped once freed");

  unsigned char *e = hvd_alloc_host(4 * MIB);
  if (thp_available())
    ok(e != NULL && smaps_of(e, &kib, &hg) && kib == 4 * 1024,
       "exactly 4 MiB: a 4 MiB mapping");
  else
    skip(1, "transparent huge pages are off here");
  is_int(HVD_SUCCESS, hvd_free_host(e), "4 MiB: freed");
}

static void refusals(void) {
  char want[160];
  void *p = hvd_alloc_host(64);
  hvd_free_host(p);
  snprintf(want, sizeof want,
           "hvd_free_host: %p was not allocated by hvd_alloc_host (or was "
           "freed already)",
           p);
  is_int(HVD_ERR_INVALID_ARG, hvd_free_host(p), "freed twice: refused");
  is_string(want, hvd_last_error(), "freed twice: the message names it");

  int *m = malloc(sizeof *m * 4);
  m[3] = 7;
  snprintf(want, sizeof want,
           "hvd_free_host: %p was not allocated by hvd_alloc_host (or was "
           "freed already)",
           (void *)m);
  is_int(HVD_ERR_INVALID_ARG, hvd_free_host(m), "a malloc'd block: refused");
  is_string(want, hvd_last_error(), "a malloc'd block: the message names it");
  is_int(7, m[3], "a malloc'd block: left alone");
  free(m);

  ok(hvd_alloc_host(SIZE_MAX) == NULL, "SIZE_MAX bytes: NULL");
  snprintf(want, sizeof want, "hvd_alloc_host: %zu bytes", (size_t)SIZE_MAX);
  is_string(want, hvd_last_error(), "SIZE_MAX bytes: the message");
}

/* 1000 small and 8 huge blocks, each stamped with its index, freed in a
 * shuffled order after every stamp was checked. */
static void many(void) {
  enum { N = 1008 };
  static unsigned char *b[N];
  static int order[N];
  int bad = 0;
  for (int i = 0; i < N; i++) {
    size_t n = i < 1000 ? (size_t)(i % 97) * 13 + 8 : 2 * MIB + (size_t)i;
    b[i] = hvd_alloc_host(n);
    if (b[i] == NULL)
      bad++;
    else
      memset(b[i], i & 0xff, 8);
    order[i] = i;
  }
  srand(7);
  for (int i = N - 1; i > 0; i--) {
    int j = rand() % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int k = 0; k < N; k++) {
    int i = order[k];
    if (b[i] != NULL && (b[i][7] != (i & 0xff) || hvd_free_host(b[i])))
      bad++;
  }
  is_int(0, bad, "1008 blocks: all made, stamps intact, all freed");
}

static void *churn(void *arg) {
  long bad = 0;
  unsigned char *mine[64];
  for (int round = 0; round < 50; round++) {
    for (int i = 0; i < 64; i++) {
      mine[i] = hvd_alloc_host((size_t)(i + 1) * 100);
      if (mine[i] == NULL)
        bad++;
      else
        mine[i][0] = (unsigned char)(uintptr_t)arg;
    }
    for (int i = 0; i < 64; i++)
      if (mine[i] != NULL && (mine[i][0] != (unsigned char)(uintptr_t)arg ||
                              hvd_free_host(mine[i]) != HVD_SUCCESS))
        bad++;
  }
  return (void *)bad;
}

static void threads(void) {
  pthread_t t[2];
  void *bad[2] = {(void *)1, (void *)1};
  for (int i = 0; i < 2; i++)
    pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], &bad[i]);
  ok(bad[0] == NULL && bad[1] == NULL,
     "two threads, 3200 blocks each: no failure, no block shared");
}

int main(void) {
  if (!arena)
    setenv("HVD_HOST_ARENA", "0", 1); /* before the first allocation */
  else
    unsetenv("HVD_HOST_ARENA");
  small_blocks();
  if (arena)
    arena_blocks();
  else
    skip(12, "HVD_HOST_ARENA=0: no arena");
  huge_blocks();
  refusals();
  many();
  threads();
  is_int(0, hvd_is_initialized(), "all of it without hvd_init");
  done_testing();
  return tap_exit_status();
}
