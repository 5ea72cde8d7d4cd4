/*
 * reproducible.c - every host reduction folds each element over the ranks
 * in one fixed order, whatever the fusion (issue 29 section 2). A burst of
 * allreduces and one of reducescatters, float32, float64, float16 and
 * bfloat16, with values whose sums depend on the order of addition, is
 * submitted ROUNDS times under each setting: in a different order on every
 * rank and every round, each submission after a random pause, so that the
 * engine cuts the bursts into different fused groups and pieces each time;
 * the first round with a cold response cache, the others warm. Every
 * result must equal, bit for bit, the fold this test computes itself:
 *   - allreduce on one node, or over MPI without hierarchy: ranks
 *     0..P-1 in order, one rounding per step (as one process summing);
 *   - allreduce on 2 nodes x 2 (HVD_HOSTNAME, at np 4), through shared
 *     memory or hierarchical MPI: each node's ranks in order, then the two
 *     nodes' sums in node order;
 *   - reducescatter: ranks 0..P-1 in order, always.
 * Settings: the shared-memory slots (malloc'd tensors) with 4 KiB pieces
 * and with the default ones under autotune; the zero-copy path (arena
 * tensors); no fusion; MPI without shared memory; and at np 4 two nodes
 * through the slots, through the arenas, and hierarchical MPI.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P;

enum { NT = 10, ND = 4, ROUNDS = 3, NJOB = NT * ND };
static const int64_t sizes[NT] = {1,    7,     33,   250,   1000,
                                  4097, 20000, 3000, 70001, 130000};
static const hvd_dtype_t dtypes[ND] = {HVD_FLOAT32, HVD_FLOAT64, HVD_FLOAT16,
                                       HVD_BFLOAT16};

/* A setting: its environment, its memory, and how the allreduce folds. */
typedef struct setting {
  const char *label;
  const char *env[4]; /* NAME=VALUE, NULL-terminated */
  int arena;          /* tensors from hvd_alloc_host */
  int two_nodes;      /* np 4 only: nodes A A B B, folded per node */
} setting_t;

static const setting_t settings[] = {
    {"slots, 4 KiB pieces", {"HVD_CHUNK_SIZE=4096"}, 0, 0},
    {"slots, autotune", {"HVD_AUTOTUNE=1"}, 0, 0},
    {"zero-copy, 4 KiB pieces", {"HVD_CHUNK_SIZE=4096"}, 1, 0},
    {"no fusion", {"HVD_FUSION_THRESHOLD=0"}, 0, 0},
    {"MPI without shared memory", {"HVD_SHM_ALLREDUCE=0"}, 0, 0},
    {"2 nodes x 2, slots", {"HVD_CHUNK_SIZE=4096"}, 0, 1},
    {"2 nodes x 2, zero-copy", {"HVD_CHUNK_SIZE=4096"}, 1, 1},
    {"2 nodes x 2, hierarchical MPI",
     {"HVD_SHM_ALLREDUCE=0", "HVD_HIERARCHICAL_ALLREDUCE=1"},
     0,
     1},
};
enum { NSET = sizeof settings / sizeof settings[0] };

/* A hash of (q, t, i) to [0, 1). */
static double unit(int q, int t, int64_t i) {
  return (double)(hvdt_hash3(q, t, i) >> 11) / 9007199254740992.0;
}

/* Rank q's element i of job t: signed, with exponents over a range wide
 * enough that the order of addition shows in the last bits (float16's
 * kept small enough not to overflow). */
static double value(int q, int t, int64_t i) {
  double m = unit(q, t, i) * 2 - 1;
  int e = (int)(unit(q + 11, t, i) * 16) - 8;
  return m * (double)(1 << (e + 8)) / 256.0;
}

/* acc op= x in dtype's arithmetic, one rounding, as hvd's kernels do. */
static void fold_into(hvd_dtype_t dt, void *acc, int64_t i, const void *x,
                      int64_t j) {
  switch (dt) {
  case HVD_FLOAT32:
    ((float *)acc)[i] = ((float *)acc)[i] + ((const float *)x)[j];
    break;
  case HVD_FLOAT64:
    ((double *)acc)[i] = ((double *)acc)[i] + ((const double *)x)[j];
    break;
  default: { /* float16, bfloat16: in float, rounded back */
    float a = (float)hvdt_get(dt, acc, i), b = (float)hvdt_get(dt, x, j);
    hvdt_put(dt, acc, i, (double)(a + b));
  }
  }
}

/* Rank q's values of job t, n of them from element `first`. */
static void *inputs(hvd_dtype_t dt, int q, int t, int64_t first, int64_t n) {
  void *p = hvdt_calloc((size_t)n + 1, hvdt_size(dt));
  for (int64_t i = 0; i < n; i++)
    hvdt_put(dt, p, i, value(q, t, first + i));
  return p;
}

/* The fold of ranks lo..hi-1's elements [first, first + n) of job t. */
static void *fold_ranks(hvd_dtype_t dt, int t, int64_t first, int64_t n,
                        int lo, int hi) {
  void *acc = inputs(dt, lo, t, first, n);
  for (int q = lo + 1; q < hi; q++) {
    void *x = inputs(dt, q, t, first, n);
    for (int64_t i = 0; i < n; i++)
      fold_into(dt, acc, i, x, i);
    free(x);
  }
  return acc;
}

/* The expected allreduce of job t: rank order, or per node then across. */
static void *want_allreduce(hvd_dtype_t dt, int t, int64_t n, int two_nodes) {
  if (!two_nodes)
    return fold_ranks(dt, t, 0, n, 0, P);
  void *a = fold_ranks(dt, t, 0, n, 0, 2), *b = fold_ranks(dt, t, 0, n, 2, 4);
  for (int64_t i = 0; i < n; i++)
    fold_into(dt, a, i, b, i);
  free(b);
  return a;
}

typedef struct job {
  char name[64];
  hvd_dtype_t dt;
  int t;
  int64_t n;
  void *send, *recv; /* recv == send in place (allreduce) */
  hvd_tensor_t ts, tr;
  hvd_request_t *req;
} job_t;

static void *alloc_buf(size_t bytes, int arena) {
  void *p = arena ? hvd_alloc_host(bytes) : malloc(bytes);
  if (p == NULL)
    bail("allocating %zu bytes (%s): %s", bytes, arena ? "arena" : "malloc",
         arena ? hvd_last_error() : "out of memory");
  return p;
}

static void free_buf(void *p, int arena) {
  if (arena)
    hvd_free_host(p);
  else
    free(p);
}

/* Job k of a burst: its dtype, sizes and buffers (send filled; recv in
 * place for odd k or when `in_place`). */
static void make_job(job_t *j, int k, const char *kind, int arena,
                     int in_place) {
  j->dt = dtypes[k / NT];
  j->t = k;
  j->n = sizes[k % NT];
  snprintf(j->name, sizeof j->name, "%s.%d", kind, k);
  size_t bytes = (size_t)j->n * hvdt_size(j->dt);
  j->send = alloc_buf(bytes, arena);
  void *v = inputs(j->dt, R, k, 0, j->n);
  memcpy(j->send, v, bytes);
  free(v);
  j->recv = k % 2 || in_place ? j->send : alloc_buf(bytes, arena);
  j->ts = (hvd_tensor_t){j->send, j->dt, 1, {j->n}, HVD_CPU};
  j->tr = j->ts;
  j->tr.data = j->recv;
  j->req = NULL;
}

static void free_job(job_t *j, int arena) {
  if (j->recv != j->send)
    free_buf(j->recv, arena);
  free_buf(j->send, arena);
}

/* Submits every job, in a per-rank, per-round order, each after a pause
 * of 0-200 us; then waits for all. Returns the failures. */
static int run_burst(job_t *jobs, int reducescatter, unsigned seed) {
  int order[NJOB], failed = 0;
  unsigned s = hvdt_shuffle(order, NJOB, seed);
  for (int x = 0; x < NJOB; x++) {
    job_t *j = &jobs[order[x]];
    s = s * 1103515245u + 12345u;
    usleep((s >> 16) % 200);
    hvd_result_t rc =
        reducescatter
            ? hvd_reducescatter_async(j->name, &j->ts, &j->tr, HVD_SUM, 1.0,
                                      1.0, &j->req)
            : hvd_allreduce_async(j->name, &j->ts, &j->tr, HVD_SUM, 1.0, 1.0,
                                  &j->req);
    if (rc != HVD_SUCCESS) {
      diag("%s: %s", j->name, hvd_last_error());
      failed++;
      j->req = NULL;
    }
  }
  for (int k = 0; k < NJOB; k++)
    if (jobs[k].req != NULL && hvd_wait(jobs[k].req) != HVD_SUCCESS) {
      diag("%s: %s", jobs[k].name, hvd_last_error());
      failed++;
    }
  return failed;
}

/* The first element of got that is not want's bits, or -1. */
static int64_t first_diff(hvd_dtype_t dt, const void *got, const void *want,
                          int64_t n) {
  size_t es = hvdt_size(dt);
  for (int64_t i = 0; i < n; i++)
    if (memcmp((const char *)got + i * es, (const char *)want + i * es, es))
      return i;
  return -1;
}

static int check_allreduce(const job_t *jobs, void *const *want, char *why,
                           size_t len) {
  for (int k = 0; k < NJOB; k++) {
    const job_t *j = &jobs[k];
    int64_t i = first_diff(j->dt, j->recv, want[k], j->n);
    if (i >= 0) {
      snprintf(why, len, "%s element %lld: %.17g, folded in order %.17g",
               j->name, (long long)i, hvdt_get(j->dt, j->recv, i),
               hvdt_get(j->dt, want[k], i));
      return 0;
    }
  }
  return 1;
}

static int check_reducescatter(job_t *jobs, char *why, size_t len) {
  int good = 1;
  for (int k = 0; k < NJOB; k++) {
    job_t *j = &jobs[k];
    int64_t per = j->n / P, first = R * per + (R < j->n % P ? R : j->n % P);
    int64_t mine = per + (R < j->n % P);
    void *want = fold_ranks(j->dt, k, first, mine, 0, P);
    int64_t i = j->tr.shape[0] == mine ? first_diff(j->dt, j->tr.data, want,
                                                    mine)
                                       : -2;
    if (good && i != -1) {
      snprintf(why, len, "%s: %s %lld", j->name,
               i == -2 ? "rows" : "element", (long long)(i == -2 ? j->tr.shape[0] : i));
      good = 0;
    }
    free(want);
    hvd_tensor_free(&j->tr);
    j->tr = j->ts;
  }
  return good;
}

static void run_setting(const setting_t *st) {
  char why[256];
  for (int e = 0; st->env[e] != NULL; e++) {
    char name[64];
    const char *eq = strchr(st->env[e], '=');
    snprintf(name, sizeof name, "%.*s", (int)(eq - st->env[e]), st->env[e]);
    setenv(name, eq + 1, 1);
  }
  if (st->two_nodes)
    setenv("HVD_HOSTNAME", R < 2 ? "nodeA" : "nodeB", 1);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init (%s): %s", st->label, hvd_last_error());
  job_t ar[NJOB], rs[NJOB];
  void *want[NJOB];
  for (int k = 0; k < NJOB; k++) {
    make_job(&ar[k], k, "ar", st->arena, 0);
    make_job(&rs[k], k, "rs", 0, 1); /* the output is hvd's */
    want[k] = want_allreduce(ar[k].dt, k, ar[k].n, st->two_nodes);
  }
  for (int round = 0; round < ROUNDS; round++) {
    const char *cache = round ? "warm cache" : "cold cache";
    for (int k = 0; k < NJOB; k++) /* in place: the inputs again */
      if (ar[k].recv == ar[k].send) {
        void *v = inputs(ar[k].dt, R, k, 0, ar[k].n);
        memcpy(ar[k].send, v, (size_t)ar[k].n * hvdt_size(ar[k].dt));
        free(v);
      }
    unsigned seed = (unsigned)(R * 7919 + round * 104729 + 1);
    int failed = run_burst(ar, 0, seed);
    why[0] = '\0';
    ok(failed == 0 && check_allreduce(ar, want, why, sizeof why),
       "%s, round %d (%s): %d allreduces, the bits of the fold in %s", st->label,
       round + 1, cache, NJOB, st->two_nodes ? "node order" : "rank order");
    if (why[0])
      diag("rank %d: %s", R, why);
    failed = run_burst(rs, 1, seed + 17);
    why[0] = '\0';
    ok(failed == 0 && check_reducescatter(rs, why, sizeof why),
       "%s, round %d (%s): %d reducescatters, the bits of the fold in rank "
       "order",
       st->label, round + 1, cache, NJOB);
    if (why[0])
      diag("rank %d: %s", R, why);
  }
  for (int k = 0; k < NJOB; k++) {
    free_job(&ar[k], st->arena);
    free_job(&rs[k], 0);
    free(want[k]);
  }
  ok(hvd_shutdown() == HVD_SUCCESS, "%s: hvd_shutdown", st->label);
  for (int e = 0; st->env[e] != NULL; e++) {
    char name[64];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(st->env[e], "="),
             st->env[e]);
    unsetenv(name);
  }
  unsetenv("HVD_HOSTNAME");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  for (int s = 0; s < NSET; s++)
    if (!settings[s].two_nodes || P == 4)
      run_setting(&settings[s]);
  return tap_mpi_finish();
}
