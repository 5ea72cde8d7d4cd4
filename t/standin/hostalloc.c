/*
 * hostalloc.c - one rank's host allocation failing before a host
 * collective's MPI steps (lib/base/fault.h's HVD_STANDIN_HOST_ALLOC_FAIL,
 * which the stand-in's build of libhvd has; host tensors only): before, that rank returned alone and its
 * peers waited in MPI (MPI_Allgatherv, MPI_Alltoall, the reduce-scatter's
 * exchange) until the harness's timeout. R is the last rank. In each case
 * every rank fails the collective with HVD_ERR_NO_MEMORY and R's words,
 * the same on every rank:
 *   "<coll> '<name>': rank R could not allocate N bytes for <what>;
 *   nothing was exchanged"
 * and then, R's fault gone, the same collective is exact and an allreduce
 * works. Each case runs between its own hvd_init and hvd_shutdown.
 *  1. allgather of [1 + rank, 4] float32: its output (site "output");
 *  2. the same through the response cache (its rows learnt in the
 *     executor's MPI_Allgather first);
 *  3. a grouped allgather (one fused MPI_Allgatherv): its first member's
 *     output; every member fails naming that one;
 *  4. the same group, R unable to grow the fused group's first dimensions
 *     (site "grow"), before the MPI_Allgather that learns them: every
 *     rank drops them and grows them again for the next group;
 *  5. alltoall: its received splits (site "splits");
 *  6. alltoall: its output;
 *  7. reducescatter: its output; 8. a grouped reducescatter's.
 * The allreduces of 32 float32 elements, each case's first after a small
 * one (the buffers they need grow, which every rank agrees on: only then
 * is there an MPI step more, so R's failure is every rank's):
 *  9. a grouped allreduce of two, without the shared-memory path
 *     (HVD_SHM_ALLREDUCE=0): its fusion buffer (site "fusion"), the next
 *     power of two of its 256 bytes; every member fails naming it;
 * 10. an allreduce with float16 on the wire: its fusion buffer (64
 *     bytes);
 * 11. an allreduce without the shared-memory path: ordered.c's reduction
 *     buffer (site "reduction"; the bytes as reduction_bytes says);
 * 12. the same with the shared-memory path across two nodes (HVD_HOSTNAME,
 *     np 4 only): the reduction across the nodes;
 * 13. an Adasum allreduce (each rank's elements k with k % size == rank
 *     are 1: orthogonal, the result all 1s): its peer buffer (site
 *     "adasum", 128 bytes).
 * An engine's start (each rank's memory had, and agreed, before the
 * start's collective steps that follow it):
 * 14. hvd_init, R without the engine's state (site "engine"): every
 *     rank's init fails, "rank R could not allocate the engine's state;
 *     nothing was exchanged"; then an init without the fault works;
 * 15. the same, the MPI executor's state (site "executor");
 * 16. the engine's thread (site "thread": pthread_create's EAGAIN):
 *     HVD_ERR_SYSTEM, and the threads that started end unused;
 * 17. a process set's creation, its engine's state: the creation fails on
 *     every rank with R's words, and the next creation works;
 * 18. the same, its MPI executor's state;
 * 19. hvd_init with HVD_AUTOTUNE=1, rank 0 (which alone keeps the tuner)
 *     without the tuner's state (site "autotune"): every rank's init
 *     fails with HVD_ERR_NO_MEMORY (before: HVD_ERR_IO) and rank 0's
 *     words, "could not allocate the autotuner's state"; then an init
 *     without the fault works.
 * Registered at np 2, 3 and 4 (t/standin/local.mk); `hostalloc N` runs
 * case N only.
 */
#include "core/api.h" /* hvd__allreduce_wire_async: compression */
#include "hvd.h"
#include "tap/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROWS = 8, COLS = 4 };

static int rank, size, last;
static float in[2][ROWS * COLS];

static hvd_tensor_t tensor(float *p, int64_t rows) {
  int64_t shape[2] = {rows, COLS};
  return hvd_tensor_make(p, HVD_FLOAT32, 2, shape);
}

static void fill(float *p, float v) {
  for (int i = 0; i < ROWS * COLS; i++)
    p[i] = v;
}

/* Every element of p's n is v. */
static int all_are(const float *p, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++)
    if (p[i] != v)
      return 0;
  return 1;
}

static void fault(const char *site) {
  char v[64];
  snprintf(v, sizeof v, "%d:%s", last, site);
  setenv("HVD_STANDIN_HOST_ALLOC_FAIL", v, 1);
}

static void start(const char *what, const char *site) {
  fault(site);
  hvd_result_t rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", what))
    bail("hvd_init: %s", hvd_last_error());
}

/* An allreduce of every rank's 1s is size. */
static void works(const char *name, const char *what) {
  float v[COLS] = {1, 1, 1, 1};
  int64_t shape[1] = {COLS};
  hvd_tensor_t t = hvd_tensor_make(v, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce(name, &t, &t, HVD_SUM, 1.0, 1.0);
  ok(rc == HVD_SUCCESS && all_are(v, COLS, (float)size),
     "%s: an allreduce works after it (%s)", what,
     rc == HVD_SUCCESS ? "exact" : hvd_last_error());
}

static void stop(const char *what) {
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown returns", what);
}

/* rc and hvd_last_error() against HVD_ERR_NO_MEMORY and "<label>: rank R
 * could not allocate <bytes> for <what>; nothing was exchanged". Every
 * rank makes the same checks. */
static void expect(hvd_result_t rc, const char *label, long long bytes,
                   const char *for_what, const char *what) {
  char want[1024], got[1024];
  snprintf(want, sizeof want,
           "%s: rank %d could not allocate %lld bytes for %s; nothing was "
           "exchanged",
           label, last, bytes, for_what);
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  is_int(HVD_ERR_NO_MEMORY, rc, "%s: %s: result", what, label);
  is_string(want, got, "%s: %s: message", what, label);
}

/* Rows of rank q's tensor i in the allgathers: 1 + q, and 2. */
static int64_t gather_rows(int i, int q) { return i == 0 ? 1 + q : 2; }

/* Sum over the ranks of gather_rows(i, q). */
static int64_t gather_total(int i) {
  int64_t t = 0;
  for (int q = 0; q < size; q++)
    t += gather_rows(i, q);
  return t;
}

/* 1 when out (tensor i's allgather) holds each rank's rows of its number. */
static int gathered(const hvd_tensor_t *out, int i) {
  int64_t at = 0;
  if (out->shape[0] != gather_total(i))
    return 0;
  for (int q = 0; q < size; q++) {
    if (!all_are((const float *)out->data + at, gather_rows(i, q) * COLS,
                 (float)q))
      return 0;
    at += gather_rows(i, q) * COLS;
  }
  return 1;
}

/* An allgather of tensor 0 under `name`; *exact when it is. */
static hvd_result_t gather1(const char *name, int *exact) {
  hvd_tensor_t t = tensor(in[0], gather_rows(0, rank)), out;
  memset(&out, 0, sizeof out);
  fill(in[0], (float)rank);
  hvd_result_t rc = hvd_allgather(name, &t, &out);
  *exact = rc == HVD_SUCCESS && gathered(&out, 0);
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  return rc;
}

/* 1, 2: a lone allgather, negotiated or (`cached`) from the cache. */
static void case_gather(int cached, const char *what) {
  char label[64];
  int exact;
  start(what, "none");
  works("g.0", what);
  if (cached) { /* once, so that the cache has it */
    hvd_result_t rc = gather1("g.1", &exact);
    ok(rc == HVD_SUCCESS && exact, "%s: the allgather, first", what);
  }
  fault("output");
  hvd_result_t rc = gather1("g.1", &exact);
  snprintf(label, sizeof label, "allgather 'g.1'");
  expect(rc, label, gather_total(0) * COLS * 4,
         "the output of allgather 'g.1'", what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = gather1("g.1", &exact);
  ok(rc == HVD_SUCCESS && exact, "%s: then exact", what);
  works("g.2", what);
  stop(what);
}

/* A grouped allgather of tensors 0 and 1 as a and b, each member's result
 * into rcs (its message into msgs); *exact when both are. */
static void gather2(const char *a, const char *b, hvd_result_t rcs[2],
                    char msgs[2][1024], int *exact) {
  const char *names[2] = {a, b};
  hvd_tensor_t t[2] = {tensor(in[0], gather_rows(0, rank)),
                       tensor(in[1], gather_rows(1, rank))};
  hvd_tensor_t out[2];
  hvd_request_t *reqs[2];
  memset(out, 0, sizeof out);
  fill(in[0], (float)rank);
  fill(in[1], (float)rank);
  hvd_result_t rc = hvd_grouped_allgather_async(2, names, t, out, reqs);
  if (rc != HVD_SUCCESS)
    bail("hvd_grouped_allgather_async: %s", hvd_last_error());
  *exact = 1;
  for (int i = 0; i < 2; i++) {
    rcs[i] = hvd_wait(reqs[i]);
    snprintf(msgs[i], 1024, "%s",
             rcs[i] == HVD_SUCCESS ? "" : hvd_last_error());
    *exact = *exact && rcs[i] == HVD_SUCCESS && gathered(&out[i], i);
    if (rcs[i] == HVD_SUCCESS)
      hvd_tensor_free(&out[i]);
  }
}

/* 3, 4: a grouped allgather, R without a member's output or the group's
 * first dimensions. */
static void case_gather2(const char *site, const char *what) {
  const char *names[2] = {"f.a", "f.b"};
  hvd_result_t rcs[2];
  char msgs[2][1024], label[64], for_what[128];
  int exact;
  long long bytes;
  start(what, site);
  works("f.0", what);
  gather2(names[0], names[1], rcs, msgs, &exact);
  if (strcmp(site, "output") == 0) {
    bytes = gather_total(0) * COLS * 4;
    snprintf(for_what, sizeof for_what, "the output of allgather 'f.a'");
  } else {
    bytes = (2 * 2 + 1) * size * 8; /* (2m + 1) P int64s */
    snprintf(for_what, sizeof for_what,
             "the first dimensions of a fused allgather");
  }
  for (int i = 0; i < 2; i++) {
    snprintf(label, sizeof label, "allgather '%s'", names[i]);
    char want[1024];
    snprintf(want, sizeof want,
             "%s: rank %d could not allocate %lld bytes for %s; nothing was "
             "exchanged",
             label, last, bytes, for_what);
    is_int(HVD_ERR_NO_MEMORY, rcs[i], "%s: %s: result", what, label);
    is_string(want, msgs[i], "%s: %s: message", what, label);
  }
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  gather2("f.c", "f.d", rcs, msgs, &exact);
  ok(exact, "%s: the next group is exact (%s)", what, msgs[0]);
  works("f.1", what);
  stop(what);
}

/* An alltoall of ROWS rows: one to every other rank, the rest to rank 0;
 * each row the sender's number. *exact when the result is. */
static hvd_result_t alltoall(const char *name, int *exact) {
  int64_t splits[8], rsplits[8];
  hvd_tensor_t t = tensor(in[0], ROWS), out;
  memset(&out, 0, sizeof out);
  fill(in[0], (float)rank);
  for (int q = 0; q < size; q++)
    splits[q] = q == 0 ? ROWS - (size - 1) : 1;
  hvd_result_t rc = hvd_alltoall(name, &t, splits, &out, rsplits);
  *exact = rc == HVD_SUCCESS;
  int64_t at = 0;
  for (int q = 0; rc == HVD_SUCCESS && q < size; q++) {
    *exact = *exact && rsplits[q] == (rank == 0 ? ROWS - (size - 1) : 1) &&
             all_are((float *)out.data + at, rsplits[q] * COLS, (float)q);
    at += rsplits[q] * COLS;
  }
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  return rc;
}

/* 5, 6: R cannot hold an alltoall's received splits, or its output. */
static void case_alltoall(const char *site, const char *what) {
  char for_what[128];
  long long bytes;
  int exact;
  start(what, site);
  works("a.0", what);
  hvd_result_t rc = alltoall("a.1", &exact);
  if (strcmp(site, "splits") == 0) {
    bytes = size * 8;
    snprintf(for_what, sizeof for_what,
             "the received splits of alltoall 'a.1'");
  } else { /* R, the last, gets one row from every rank */
    bytes = size * COLS * 4;
    snprintf(for_what, sizeof for_what, "the output of alltoall 'a.1'");
  }
  expect(rc, "alltoall 'a.1'", bytes, for_what, what);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = alltoall("a.2", &exact);
  ok(rc == HVD_SUCCESS && exact, "%s: the next alltoall is exact", what);
  works("a.3", what);
  stop(what);
}

/* n reducescatters (grouped when 2) of ROWS rows of 1s, named r.<k>.<i>;
 * each member's result into rcs, its message into msgs; *exact when each
 * is size over this rank's block. */
static void scatter(int n, int k, hvd_result_t rcs[2], char msgs[2][1024],
                    int *exact) {
  char names[2][32];
  const char *np[2];
  hvd_tensor_t t[2], out[2];
  hvd_request_t *reqs[2];
  memset(out, 0, sizeof out);
  for (int i = 0; i < n; i++) {
    snprintf(names[i], sizeof names[i], "r.%d.%d", k, i);
    np[i] = names[i];
    fill(in[i], 1);
    t[i] = tensor(in[i], ROWS);
  }
  hvd_result_t rc =
      n == 1 ? hvd_reducescatter_async(np[0], &t[0], &out[0], HVD_SUM, 1.0,
                                       1.0, &reqs[0])
             : hvd_grouped_reducescatter_async(n, np, t, out, HVD_SUM, 1.0,
                                               1.0, reqs);
  if (rc != HVD_SUCCESS)
    bail("reducescatter: %s", hvd_last_error());
  int64_t mine = ROWS / size + (rank < ROWS % size);
  *exact = 1;
  for (int i = 0; i < n; i++) {
    rcs[i] = hvd_wait(reqs[i]);
    snprintf(msgs[i], 1024, "%s",
             rcs[i] == HVD_SUCCESS ? "" : hvd_last_error());
    *exact = *exact && rcs[i] == HVD_SUCCESS && out[i].shape[0] == mine &&
             all_are(out[i].data, mine * COLS, (float)size);
    if (rcs[i] == HVD_SUCCESS)
      hvd_tensor_free(&out[i]);
  }
}

/* 7, 8: R cannot hold a reducescatter's output (the first member's). */
static void case_scatter(int n, const char *what) {
  hvd_result_t rcs[2];
  char msgs[2][1024], label[64], want[1024];
  int exact;
  int64_t last_rows = ROWS / size + (last < ROWS % size);
  start(what, "output");
  works("r.0", what);
  scatter(n, 1, rcs, msgs, &exact);
  for (int i = 0; i < n; i++) {
    snprintf(label, sizeof label, "reducescatter 'r.1.%d'", i);
    snprintf(want, sizeof want,
             "%s: rank %d could not allocate %lld bytes for the output of "
             "reducescatter 'r.1.0'; nothing was exchanged",
             label, last, (long long)(last_rows * COLS * 4));
    is_int(HVD_ERR_NO_MEMORY, rcs[i], "%s: %s: result", what, label);
    is_string(want, msgs[i], "%s: %s: message", what, label);
  }
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  scatter(n, 2, rcs, msgs, &exact);
  ok(exact, "%s: the next reducescatter is exact (%s)", what, msgs[0]);
  works("r.3", what);
  stop(what);
}

/* ---- allreduces ---------------------------------------------------- */

enum { AR = 32 }; /* elements of each allreduce that fails */

/* What an allreduce case varies: its op, wire dtype, members. */
typedef struct ar_case {
  const char *what, *site, *for_what;
  int n;           /* members: 1, or 2 grouped */
  hvd_op_t op;     /* HVD_SUM, or HVD_ADASUM */
  hvd_dtype_t wire;
  long long bytes; /* what R could not allocate */
} ar_case_t;

static float ar_in[2][AR], ar_out[2][AR];

/* This rank's values: 1s (a sum: size), or for Adasum 1 where k % size
 * is the rank (orthogonal: all 1s). */
static void ar_fill(const ar_case_t *c, float *p) {
  for (int k = 0; k < AR; k++)
    p[k] = c->op == HVD_ADASUM ? (float)(k % size == rank) : 1;
}

/* c's allreduce, members named <prefix>.<i>: each member's result into
 * rcs (its message into msgs); *exact when every member's is. */
static void ar_run(const ar_case_t *c, const char *prefix, hvd_result_t rcs[2],
                   char msgs[2][1024], int *exact) {
  char names[2][32];
  const char *np[2];
  hvd_tensor_t t[2], o[2];
  hvd_request_t *reqs[2];
  int64_t shape[1] = {AR};
  for (int i = 0; i < c->n; i++) {
    snprintf(names[i], sizeof names[i], "%s.%d", prefix, i);
    np[i] = names[i];
    ar_fill(c, ar_in[i]);
    memset(ar_out[i], 0, sizeof ar_out[i]);
    t[i] = hvd_tensor_make(ar_in[i], HVD_FLOAT32, 1, shape);
    o[i] = hvd_tensor_make(ar_out[i], HVD_FLOAT32, 1, shape);
  }
  hvd_result_t rc =
      c->n == 2 ? hvd_grouped_allreduce_async(2, np, t, o, c->op, 1.0, 1.0,
                                              reqs)
                : hvd__allreduce_wire_async(np[0], &t[0], &o[0], c->op, 1.0,
                                            1.0, c->wire, &reqs[0]);
  if (rc != HVD_SUCCESS)
    bail("allreduce: %s", hvd_last_error());
  float want = c->op == HVD_ADASUM ? 1 : (float)size;
  *exact = 1;
  for (int i = 0; i < c->n; i++) {
    rcs[i] = hvd_wait(reqs[i]);
    snprintf(msgs[i], 1024, "%s",
             rcs[i] == HVD_SUCCESS ? "" : hvd_last_error());
    *exact = *exact && rcs[i] == HVD_SUCCESS && all_are(ar_out[i], AR, want);
  }
}

/* 9 to 13: R cannot grow a buffer c's allreduce needs. */
static void case_allreduce(const ar_case_t *c) {
  hvd_result_t rcs[2];
  char msgs[2][1024], label[64], want[1024];
  int exact;
  start(c->what, "none");
  works("u.0", c->what);
  fault(c->site);
  ar_run(c, "u.1", rcs, msgs, &exact);
  for (int i = 0; i < c->n; i++) {
    snprintf(label, sizeof label, "allreduce 'u.1.%d'", i);
    snprintf(want, sizeof want,
             "%s: rank %d could not allocate %lld bytes for the %s; nothing "
             "was exchanged",
             label, last, c->bytes, c->for_what);
    is_int(HVD_ERR_NO_MEMORY, rcs[i], "%s: %s: result", c->what, label);
    is_string(want, msgs[i], "%s: %s: message", c->what, label);
  }
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  ar_run(c, "u.1", rcs, msgs, &exact);
  ok(exact, "%s: then the same allreduce is exact (%s)", c->what, msgs[0]);
  works("u.2", c->what);
  stop(c->what);
}

/* The least power of two >= n. */
static long long pow2(long long n) {
  long long p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

/* The reduction buffer ordered.c's allreduce of AR float32 elements is
 * grown to over P ranks: the gather of all (AR * P, at most 64 KiB) or P
 * blocks of ceil(AR / P) (AR + P - 1 at most), the larger, to a power of
 * two (far below its cap, a chunk's). */
static long long reduction_bytes(int p) {
  long long all = (long long)AR * p * 4, blocks = (long long)(AR + p - 1) * 4;
  all = all < 65536 ? all : 65536;
  return pow2(all > blocks ? all : blocks);
}

static void allreduce_cases(int only) {
  const ar_case_t cases[] = {
      {"fused allreduce buffer", "fusion", "fusion buffer", 2, HVD_SUM,
       HVD_FLOAT32, pow2(2 * AR * 4)},
      {"compressed allreduce buffer", "fusion", "fusion buffer", 1, HVD_SUM,
       HVD_FLOAT16, AR * 2},
      {"allreduce reduction buffer", "reduction", "reduction buffer", 1,
       HVD_SUM, HVD_FLOAT32, reduction_bytes(size)},
      {"reduction across nodes", "reduction", "reduction buffer", 1, HVD_SUM,
       HVD_FLOAT32, reduction_bytes(2)},
      {"Adasum peer buffer", "adasum", "Adasum peer buffer", 1, HVD_ADASUM,
       HVD_FLOAT32, AR * 4},
  };
  for (int k = 0; k < 5; k++) {
    if (only && only != 9 + k)
      continue;
    if (k == 0 || k == 2) /* the path over MPI, fusion buffer and all */
      setenv("HVD_SHM_ALLREDUCE", "0", 1);
    if (k == 3 && size != 4) {
      skip(1, "%s: two nodes of two ranks need np 4", cases[k].what);
      continue;
    }
    if (k == 3)
      setenv("HVD_HOSTNAME", rank < 2 ? "hostalloc-a" : "hostalloc-b", 1);
    case_allreduce(&cases[k]);
    unsetenv("HVD_SHM_ALLREDUCE");
    unsetenv("HVD_HOSTNAME");
  }
}

/* hvd_init with R unable to have `site`'s memory (or thread): every
 * rank's init fails with rc and R's words, then one without the fault
 * works. */
static void case_init(const char *site, hvd_result_t want_rc,
                      const char *words, const char *what) {
  char want[512], got[512];
  fault(site);
  hvd_result_t rc = hvd_init();
  snprintf(want, sizeof want, "rank %d%s; nothing was exchanged", last, words);
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  is_int(want_rc, rc, "%s: hvd_init: result", what);
  is_string(want, got, "%s: hvd_init: message", what);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init without the fault", what))
    bail("hvd_init: %s", hvd_last_error());
  works("w", what);
  stop(what);
}

/* A process set of every rank made while R cannot have `site`'s memory:
 * its creation fails on every rank with R's words; then one is made and
 * works. */
static void case_set(const char *site, const char *words, const char *what) {
  int ranks[4] = {0, 1, 2, 3};
  char want[512], got[512];
  hvd_process_set_t *ps = NULL;
  start(what, "none");
  fault(site);
  hvd_result_t rc = hvd_process_set_create(ranks, size, &ps);
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  snprintf(want, sizeof want, "rank %d%s; nothing was exchanged", last,
           words);
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  is_int(HVD_ERR_NO_MEMORY, rc, "%s: result", what);
  is_string(want, got, "%s: message", what);
  if (rc == HVD_SUCCESS)
    hvd_process_set_destroy(ps);
  rc = hvd_process_set_create(ranks, size, &ps);
  ok(rc == HVD_SUCCESS, "%s: a set is made without the fault (%s)", what,
     rc == HVD_SUCCESS ? "made" : hvd_last_error());
  if (rc == HVD_SUCCESS) {
    float v[COLS] = {1, 1, 1, 1};
    int64_t shape[1] = {COLS};
    hvd_tensor_t t = hvd_tensor_make(v, HVD_FLOAT32, 1, shape);
    rc = hvd_ps_allreduce(ps, "p", &t, &t, HVD_SUM, 1.0, 1.0);
    ok(rc == HVD_SUCCESS && all_are(v, COLS, (float)size),
       "%s: the set's allreduce works (%s)", what,
       rc == HVD_SUCCESS ? "exact" : hvd_last_error());
    is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "%s: destroyed", what);
  }
  works("w", what);
  stop(what);
}

/* 19. */
static void case_autotune(void) {
  const char *what = "autotuner at init";
  char got[512];
  setenv("HVD_AUTOTUNE", "1", 1);
  setenv("HVD_STANDIN_HOST_ALLOC_FAIL", "0:autotune", 1);
  hvd_result_t rc = hvd_init();
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  is_int(HVD_ERR_NO_MEMORY, rc, "%s: hvd_init: result", what);
  is_string("could not allocate the autotuner's state", got,
            "%s: hvd_init: message", what);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  unsetenv("HVD_STANDIN_HOST_ALLOC_FAIL");
  rc = hvd_init();
  unsetenv("HVD_AUTOTUNE");
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init without the fault", what))
    bail("hvd_init: %s", hvd_last_error());
  works("w", what);
  stop(what);
}

static void start_cases(int only) {
  if (!only || only == 14)
    case_init("engine", HVD_ERR_NO_MEMORY,
              " could not allocate the engine's state", "engine at init");
  if (!only || only == 15)
    case_init("executor", HVD_ERR_NO_MEMORY,
              " could not allocate the MPI executor's state",
              "executor at init");
  if (!only || only == 16)
    case_init("thread", HVD_ERR_SYSTEM,
              ": could not start the engine's thread: pthread_create: "
              "Resource temporarily unavailable",
              "engine thread");
  if (!only || only == 17)
    case_set("engine", " could not allocate the engine's state",
             "engine of a set");
  if (!only || only == 18)
    case_set("executor", " could not allocate the MPI executor's state",
             "executor of a set");
  if (!only || only == 19)
    case_autotune();
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  last = size - 1;
  int only = argc > 1 ? atoi(argv[1]) : 0;
  if (size < 2)
    skip_all("a one-sided failure needs two ranks (np 2 or more)");
  if (!only || only == 1)
    case_gather(0, "allgather output");
  if (!only || only == 2)
    case_gather(1, "cached allgather output");
  if (!only || only == 3)
    case_gather2("output", "fused allgather output");
  if (!only || only == 4)
    case_gather2("grow", "fused allgather dimensions");
  if (!only || only == 5)
    case_alltoall("splits", "alltoall splits");
  if (!only || only == 6)
    case_alltoall("output", "alltoall output");
  if (!only || only == 7)
    case_scatter(1, "reducescatter output");
  if (!only || only == 8)
    case_scatter(2, "fused reducescatter output");
  allreduce_cases(only);
  start_cases(only);
  return tap_mpi_finish();
}
