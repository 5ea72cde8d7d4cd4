/*
 * zero_copy.c - the zero-copy allreduce (lib/ops/mpi_ops.c, "zero-copy"):
 * groups whose tensors are hvd_alloc_host memory on every rank are reduced
 * in place from the peers' arenas; any other group takes the shared
 * segment's slots. Which path ran is read from rank 0's timeline (the
 * SHM_ZERO_COPY_ALLREDUCE span of each tensor), and every result is exact.
 *
 * Cases, each a burst of NT tensors fused into groups (many pieces of
 * HVD_CHUNK_SIZE=4 KiB, tensors straddling them):
 *   arena      all hvd_alloc_host: sum, average, postscale 0.5, in place and
 *              out of place, float32 / float64 / int32 (sum, min, max) /
 *              float16                                     -> zero copy
 *   mixed      one tensor malloc'd on every rank: that tensor takes the
 *              slots (so does its group; whether others share that group
 *              depends on how the cycles cut the burst, so only the
 *              malloc'd tensor's path is asserted)           -> slots
 *   one rank   every tensor malloc'd on the last rank only  -> slots
 *   recv       out of place into malloc'd buffers on rank 0 only: the
 *              sends are arena memory everywhere, but the summers' results
 *              must be too                                  -> slots
 *   prescale   prescale 2 (the slots apply it on the way in) -> slots
 *   realloc    every tensor freed and allocated again between two rounds
 *              under the same names (new addresses, cached) -> zero copy
 *   2 nodes    at np 4, HVD_HOSTNAME makes 2 nodes of 2: the segments are
 *              allreduced across nodes                       -> zero copy
 *   off        HVD_ZERO_COPY=0                               -> slots
 * Groups with a tensor outside the arenas (mixed, one rank, recv) take
 * cross-memory attach instead of the slots (their SHM_CMA_ALLREDUCE
 * spans) on one node where the kernel lets a process read its peers'
 * memory (this test checks that as hvd does, with a child reading its
 * parent: else those cases expect the slots); never across 2 nodes, nor
 * with prescale or HVD_ZERO_COPY=0.
 * At np 1 there is no peer: nothing is zero-copy and every sum is exact.
 *
 * Inputs: element i of tensor t on rank r is (t + i) % 5 + r + 1: sums,
 * minima and maxima are exact in every dtype; sums stay below 2048
 * (float16's exact integers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P;

enum { NT = 6 };
/* Pieces of HVD_CHUNK_SIZE=4096 bytes: 1024 float32 elements, 2048
 * float16. A group below one piece takes the slots; every tensor is above
 * it, so however the engine's cycles cut a burst into groups, each group
 * of an arena case is zero-copy. */
static const int64_t sizes[NT] = {20000, 2100, 16383, 40000, 2111, 9000};

enum { ARENA, MIXED, ONE_RANK, RECV_PLAIN };

typedef struct tcase {
  const char *label;
  hvd_dtype_t dtype;
  hvd_op_t op;
  double prescale, postscale;
  int out_of_place, where; /* ARENA, MIXED, ONE_RANK, RECV_PLAIN */
} tcase_t;

static char tl_path[256];

static double input(int t, int64_t i, int r) {
  return (double)((t + i) % 5 + r + 1);
}

static double expect(const tcase_t *c, int t, int64_t i) {
  double v = 0, lo = 0, hi = 0;
  for (int r = 0; r < P; r++) {
    double x = input(t, i, r) * c->prescale;
    v += x;
    lo = r == 0 || x < lo ? x : lo;
    hi = r == 0 || x > hi ? x : hi;
  }
  if (c->op == HVD_MIN)
    v = lo;
  else if (c->op == HVD_MAX)
    v = hi;
  else if (c->op == HVD_AVERAGE)
    v /= P;
  return v * c->postscale;
}

static size_t esize(hvd_dtype_t d) { return hvd_dtype_size(d); }

static void put(hvd_dtype_t d, void *p, int64_t i, double v) {
  switch (d) {
  case HVD_FLOAT64:
    ((double *)p)[i] = v;
    break;
  case HVD_INT32:
    ((int32_t *)p)[i] = (int32_t)v;
    break;
  case HVD_FLOAT16: { /* small integers: exact */
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t e = ((b >> 23) & 0xff) - 127 + 15, m = (b >> 13) & 0x3ff;
    ((uint16_t *)p)[i] = v == 0 ? 0 : (uint16_t)((e << 10) | m);
    break;
  }
  default:
    ((float *)p)[i] = (float)v;
  }
}

static double get(hvd_dtype_t d, const void *p, int64_t i) {
  switch (d) {
  case HVD_FLOAT64:
    return ((const double *)p)[i];
  case HVD_INT32:
    return ((const int32_t *)p)[i];
  case HVD_FLOAT16: {
    uint16_t h = ((const uint16_t *)p)[i];
    if (h == 0)
      return 0;
    uint32_t b = ((uint32_t)((h >> 10) & 0x1f) - 15 + 127) << 23 |
                 (uint32_t)(h & 0x3ff) << 13;
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  default:
    return ((const float *)p)[i];
  }
}

/* Whether tensor t's send (recv = 0) or recv (recv = 1) buffer is
 * malloc'd on this rank rather than arena memory. */
static int plain(const tcase_t *c, int t, int recv) {
  switch (c->where) {
  case MIXED:
    return t == 3;
  case ONE_RANK:
    return R == P - 1;
  case RECV_PLAIN:
    return recv && R == 0;
  default:
    return 0;
  }
}

static void *alloc_t(const tcase_t *c, int t, int recv) {
  size_t bytes = esize(c->dtype) * (size_t)sizes[t];
  return plain(c, t, recv) ? malloc(bytes) : hvd_alloc_host(bytes);
}

static void free_t(const tcase_t *c, int t, int recv, void *p) {
  if (plain(c, t, recv))
    free(p);
  else
    hvd_free_host(p);
}

/* One burst of the case under names tag.t; 0 or the first wrong value. */
static int burst(const tcase_t *c, const char *tag, void **x, void **y,
                 char *why, size_t len) {
  hvd_request_t *req[NT];
  for (int t = 0; t < NT; t++)
    for (int64_t i = 0; i < sizes[t]; i++)
      put(c->dtype, x[t], i, input(t, i, R));
  for (int t = NT - 1; t >= 0; t--) {
    char name[64];
    snprintf(name, sizeof name, "%s.%d", tag, t);
    hvd_tensor_t a = hvd_tensor_make(x[t], c->dtype, 1, &sizes[t]);
    hvd_tensor_t b =
        hvd_tensor_make(c->out_of_place ? y[t] : x[t], c->dtype, 1, &sizes[t]);
    if (hvd_allreduce_async(name, &a, &b, c->op, c->prescale, c->postscale,
                            &req[t]) != HVD_SUCCESS) {
      snprintf(why, len, "submit %s: %s", name, hvd_last_error());
      return 1;
    }
  }
  int bad = 0;
  for (int t = 0; t < NT; t++) {
    hvd_result_t rc = hvd_wait(req[t]);
    const void *out = c->out_of_place ? y[t] : x[t];
    if (rc != HVD_SUCCESS && !bad) {
      snprintf(why, len, "%s.%d: %s", tag, t, hvd_last_error());
      bad = 1;
    }
    for (int64_t i = 0; rc == HVD_SUCCESS && !bad && i < sizes[t]; i++)
      if (get(c->dtype, out, i) != expect(c, t, i)) {
        snprintf(why, len, "%s.%d[%lld] is %g, expected %g", tag, t,
                 (long long)i, get(c->dtype, out, i), expect(c, t, i));
        bad = 1;
      }
  }
  return bad;
}

static void alloc_all(const tcase_t *c, void **x, void **y) {
  for (int t = 0; t < NT; t++) {
    x[t] = alloc_t(c, t, 0);
    y[t] = c->out_of_place ? alloc_t(c, t, 1) : NULL;
  }
}

static void free_all(const tcase_t *c, void **x, void **y) {
  for (int t = 0; t < NT; t++) {
    free_t(c, t, 0, x[t]);
    if (y[t] != NULL)
      free_t(c, t, 1, y[t]);
  }
}

/* Runs a case twice (the second time through the response cache), on the
 * same blocks or, with `realloc_between`, on new ones; 1 if all exact. */
static int run_case(const tcase_t *c, const char *tag, int realloc_between,
                    char *why, size_t len) {
  void *x[NT], *y[NT];
  int bad = 0;
  alloc_all(c, x, y);
  bad = burst(c, tag, x, y, why, len);
  if (realloc_between) {
    free_all(c, x, y);
    alloc_all(c, x, y);
  }
  bad = bad || burst(c, tag, x, y, why, len);
  free_all(c, x, y);
  return !bad;
}

/* How many of the tag's tensors in `mask` have a `span` span. */
static int spans_of(const char *text, const char *tag, unsigned mask,
                    const char *span) {
  int n = 0;
  for (int t = 0; t < NT; t++) {
    if (!(mask >> t & 1))
      continue;
    char name[64];
    snprintf(name, sizeof name, "%s.%d", tag, t);
    n += hvdt_timeline_span(text, name, span, NULL);
  }
  return n;
}

/* Whether this kernel lets a process read another's memory as hvd's
 * cross-memory attach does (PR_SET_PTRACER_ANY, then process_vm_readv). */
static int cma_here(void) {
  static volatile int probe = 42;
  int fds[2], ok = 0;
  char r = 0;
  if (pipe(fds) != 0)
    return 0;
#ifdef PR_SET_PTRACER
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
  pid_t parent = getpid(), child = fork();
  if (child == 0) {
    int v = 0;
    struct iovec l = {&v, sizeof v}, rm = {(void *)&probe, sizeof v};
    char c = process_vm_readv(parent, &l, 1, &rm, 1, 0) == sizeof v && v == 42;
    (void)!write(fds[1], &c, 1);
    _exit(0);
  }
  if (child > 0 && read(fds[0], &r, 1) == 1)
    ok = r;
  if (child > 0)
    waitpid(child, NULL, 0);
  close(fds[0]);
  close(fds[1]);
  return ok;
}

typedef struct planned {
  tcase_t c;
  const char *tag;
  int realloc_between;
  int zc;        /* expected with peers and HVD_ZERO_COPY=1 */
  unsigned mask; /* the tensors whose path is asserted (0: all NT) */
  int cma;       /* cross-memory attach expected (one node, cma_here) */
} planned_t;

static const planned_t cases[] = {
    {{"arena: float32 sum in place", HVD_FLOAT32, HVD_SUM, 1, 1, 0, ARENA},
     "zs",
     0,
     1,
     0,
     0},
    {{"arena: float32 average in place", HVD_FLOAT32, HVD_AVERAGE, 1, 1, 0,
      ARENA},
     "za",
     0,
     1,
     0,
     0},
    {{"arena: float32 sum, postscale 0.5, out of place", HVD_FLOAT32, HVD_SUM,
      1, 0.5, 1, ARENA},
     "zo",
     0,
     1,
     0,
     0},
    {{"arena: float64 average out of place", HVD_FLOAT64, HVD_AVERAGE, 1, 1, 1,
      ARENA},
     "zd",
     0,
     1,
     0,
     0},
    {{"arena: int32 min in place", HVD_INT32, HVD_MIN, 1, 1, 0, ARENA},
     "zmin",
     0,
     1,
     0,
     0},
    {{"arena: int32 max out of place", HVD_INT32, HVD_MAX, 1, 1, 1, ARENA},
     "zmax",
     0,
     1,
     0,
     0},
    {{"arena: float16 sum in place", HVD_FLOAT16, HVD_SUM, 1, 1, 0, ARENA},
     "zh",
     0,
     1,
     0,
     0},
    {{"mixed: one tensor malloc'd", HVD_FLOAT32, HVD_SUM, 1, 1, 0, MIXED},
     "mx",
     0,
     0,
     1u << 3,
     1},
    {{"one rank: every tensor malloc'd on the last rank", HVD_FLOAT32,
      HVD_AVERAGE, 1, 1, 0, ONE_RANK},
     "or",
     0,
     0,
     0,
     1},
    {{"recv: out of place into malloc'd buffers on rank 0", HVD_FLOAT32,
      HVD_SUM, 1, 1, 1, RECV_PLAIN},
     "rp",
     0,
     0,
     0,
     1},
    {{"prescale 2", HVD_FLOAT32, HVD_SUM, 2, 1, 0, ARENA}, "pre", 0, 0, 0, 0},
    {{"realloc: new blocks, same names", HVD_FLOAT32, HVD_SUM, 1, 1, 0, ARENA},
     "re",
     1,
     1,
     0,
     0},
};
enum { NPLAN = sizeof cases / sizeof cases[0] };

/* Every planned case under hvd_init with the environment as set; then the
 * timeline says which went zero-copy. */
static int cma; /* cma_here(), asked once */

static void run_plan(const char *setting, int zc_on) {
  char why[256];
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init (%s): %s", setting, hvd_last_error());
  int peers = hvd_local_size() > 1;
  int one_node = hvd_local_size() == hvd_size();
  for (int k = 0; k < NPLAN; k++) {
    why[0] = '\0';
    ok(run_case(&cases[k].c, cases[k].tag, cases[k].realloc_between, why,
                sizeof why),
       "%s, np=%d: %s: exact", setting, P, cases[k].c.label);
    if (why[0])
      tap_note("%s", why);
  }
  hvd_shutdown();
  char *text = NULL;
  if (R == 0)
    text = hvdt_slurp(tl_path);
  for (int k = 0; k < NPLAN; k++) {
    unsigned mask = cases[k].mask ? cases[k].mask : (1u << NT) - 1;
    int asserted = __builtin_popcount(mask);
    int want = peers && zc_on && cases[k].zc ? asserted : 0;
    int got = R == 0 && text ? spans_of(text, cases[k].tag, mask,
                                        "SHM_ZERO_COPY_ALLREDUCE")
                             : -1;
    /* collective: rank 0 judges, the others agree */
    ok(R != 0 || got == want, "%s, np=%d: %s: %d of %d %s zero-copy (got %d)",
       setting, P, cases[k].c.label, want, asserted,
       asserted == 1 ? "asserted tensor" : "tensors", got);
    int cwant =
        peers && zc_on && one_node && cma && cases[k].cma ? asserted : 0;
    int cgot = R == 0 && text
                   ? spans_of(text, cases[k].tag, mask, "SHM_CMA_ALLREDUCE")
                   : -1;
    ok(R != 0 || cgot == cwant,
       "%s, np=%d: %s: %d of %d %s by cross-memory attach (got %d)", setting, P,
       cases[k].c.label, cwant, asserted,
       asserted == 1 ? "asserted tensor" : "tensors", cgot);
  }
  free(text);
  if (R == 0)
    unlink(tl_path);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  snprintf(tl_path, sizeof tl_path, "/tmp/hvd-zc-%d-timeline.json",
           (int)getppid());
  setenv("HVD_TIMELINE", tl_path, 1);
  setenv("HVD_CHUNK_SIZE", "4096", 1);
  cma = cma_here();
  tap_note("cross-memory attach %s here", cma ? "works" : "is refused");

  run_plan("one node", 1);

  if (P == 4) { /* nodes A A B B: one segment per local rank, across nodes */
    setenv("HVD_HOSTNAME", R < 2 ? "nodeA" : "nodeB", 1);
    run_plan("2 nodes x 2", 1);
    unsetenv("HVD_HOSTNAME");
  }

  setenv("HVD_ZERO_COPY", "0", 1);
  run_plan("HVD_ZERO_COPY=0", 0);
  unsetenv("HVD_ZERO_COPY");
  return tap_mpi_finish();
}
