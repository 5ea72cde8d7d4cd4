/*
 * join.c - hvd_join: ranks run out of data at different steps. The others'
 * allreduces go on, joined ranks contributing the identity of the op (an
 * average still divides by the world size); other collectives fail while
 * some rank has joined; join completes everywhere once all have joined,
 * naming the last rank; afterwards everything works again.
 *
 * Round 1: rank r joins after r + 1 steps (rank size-1 joins last).
 * Round 2: rank r joins after size - r steps (rank 0 joins last).
 * Then a broadcast the response cache knows fails at once while the last
 * rank has joined; rank 0's timeline (HVD_TIMELINE) shows no readiness of
 * the joined rank for an allreduce it took part in by joining.
 * A rank that has joined is blocked in hvd_join, so results are recorded
 * during the steps and checked (collectively) after the join.
 *
 * Every step reduces each of the eight dtypes under each of the five ops,
 * so the identity a joined rank contributes is checked for every pair.
 *
 * Run at 2, 3 and 4 ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MAX_RANKS 16
#define N 6

static int rank, size;
static char tl_path[256];

static const hvd_op_t ops[5] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                HVD_PRODUCT};

struct result {
  int pass;
  char why[200];
};

#define NDT 8
static const hvd_dtype_t dts[NDT] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};

/* [round][step][dtype][op] */
static struct result res[2][MAX_RANKS][NDT][5];
static hvd_result_t bcast_rc[2];
static char bcast_msg[2][256];

/* Rank q's element i: small, of both signs (but for uint8), so that a
 * wrong identity (0 for min of positives, 0 for max of negatives, 0 in a
 * product) shows; 1 or 2 in magnitude for the 8-bit dtypes, whose product
 * over 4 ranks must not wrap. */
static int value(hvd_dtype_t dt, int q, int i) {
  int sign = i % 2 && dt != HVD_UINT8 ? -1 : 1;
  if (dt == HVD_UINT8 || dt == HVD_INT8)
    return sign * (1 + (q + i) % 2);
  return sign * (q + 2 + i % 3);
}

/* Steps rank q runs before joining in round rd. */
static int steps_of(int rd, int q) { return rd == 0 ? q + 1 : size - q; }

/* Expected element i of op over the ranks still active at step s (an
 * average still divides by the world size). */
struct want {
  int rd, s, op;
  hvd_dtype_t dt;
};
static double expected(const void *ctx, int64_t i) {
  const struct want *w = ctx;
  double acc = 0;
  int first = 1;
  for (int q = 0; q < size; q++) {
    if (steps_of(w->rd, q) <= w->s)
      continue;
    double v = value(w->dt, q, (int)i);
    acc = first ? v : hvdt_fold(ops[w->op], acc, v);
    first = 0;
  }
  return hvdt_finish(ops[w->op], w->dt, acc, size, 1.0);
}

/* One step of allreduces on this (active) rank; results into res. */
static void run_step(int rd, int s) {
  for (int dt = 0; dt < NDT; dt++)
    for (int op = 0; op < 5; op++) {
      struct result *out = &res[rd][s][dt][op];
      char name[64];
      double x[N], y[N]; /* room for N of any dtype */
      int64_t shape[1] = {N};
      snprintf(name, sizeof name, "r%d.s%d.%s.%s", rd + 1, s,
               hvd_dtype_name(dts[dt]), hvd_op_name(ops[op]));
      for (int i = 0; i < N; i++) {
        hvdt_put(dts[dt], x, i, value(dts[dt], rank, i));
        hvdt_put(dts[dt], y, i, 99);
      }
      hvd_tensor_t send = hvd_tensor_make(x, dts[dt], 1, shape);
      hvd_tensor_t recv = hvd_tensor_make(y, dts[dt], 1, shape);
      hvd_result_t rc = hvd_allreduce(name, &send, &recv, ops[op], 1.0, 1.0);
      if (rc != HVD_SUCCESS) {
        out->pass = 0;
        snprintf(out->why, sizeof out->why, "%s: rc %d: %s", name, rc,
                 hvd_last_error());
        continue;
      }
      struct want ctx = {rd, s, op, dts[dt]};
      /* small integers: exact in every dtype but a float average, one
       * rounding of the dtype away */
      struct hvdt_tol tol = {
          0, ops[op] == HVD_AVERAGE && hvdt_is_float(dts[dt]) ? 1 : 0};
      struct hvdt_wrong w;
      if (!hvdt_compare(recv.dtype, recv.data, N, expected, &ctx, tol, &w)) {
        out->pass = 0;
        snprintf(out->why, sizeof out->why,
                 "%s: element %lld is %.9g, expected %.9g", name,
                 (long long)w.at, w.got, w.want);
      }
    }
}

static void round_of_join(int rd) {
  int mine = steps_of(rd, rank), last = -2;
  int last_joiner = rd == 0 ? size - 1 : 0;
  int first_joiner = rd == 0 ? 0 : size - 1;
  char want[256];

  for (int s = 0; s < MAX_RANKS; s++)
    for (int dt = 0; dt < NDT; dt++)
      for (int op = 0; op < 5; op++)
        res[rd][s][dt][op].pass = 1;
  /* Ranks that never reach step 1 have nothing to record there. */
  bcast_rc[rd] = HVD_ERR_MISMATCH;
  snprintf(bcast_msg[rd], sizeof bcast_msg[rd],
           "broadcast 'b%d': rank %d has joined; only allreduce can run until "
           "every rank joins",
           rd + 1, first_joiner);

  for (int s = 0; s < mine; s++) {
    if (s == 1) {
      /* Only first_joiner has joined now (it alone ran 1 step); a
       * broadcast cannot run until everyone joins. */
      float x[3] = {1, 2, 3};
      int64_t shape[1] = {3};
      char name[32];
      hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
      snprintf(name, sizeof name, "b%d", rd + 1);
      bcast_rc[rd] = hvd_broadcast(name, &t, last_joiner);
      snprintf(bcast_msg[rd], sizeof bcast_msg[rd], "%s", hvd_last_error());
    }
    run_step(rd, s);
  }
  hvd_result_t rc = hvd_join(&last);
  tap_note("%s", hvd_last_error());

  /* Everybody is back: check what happened. */
  is_int(HVD_SUCCESS, rc, "round %d: hvd_join", rd + 1);
  is_int(last_joiner, last, "round %d: last rank to join", rd + 1);
  for (int s = 0; s < size; s++)
    for (int dt = 0; dt < NDT; dt++)
      for (int op = 0; op < 5; op++) {
        struct result *r = &res[rd][s][dt][op];
        if (!r->pass)
          tap_note("%s", r->why);
        ok(r->pass, "round %d step %d (%d ranks active): %s %s", rd + 1, s,
           size - s, hvd_dtype_name(dts[dt]), hvd_op_name(ops[op]));
      }
  snprintf(want, sizeof want,
           "broadcast 'b%d': rank %d has joined; only allreduce can run until "
           "every rank joins",
           rd + 1, first_joiner);
  is_int(HVD_ERR_MISMATCH, bcast_rc[rd],
         "round %d: broadcast while rank %d has joined", rd + 1, first_joiner);
  is_string(want, bcast_msg[rd], "round %d: broadcast message", rd + 1);

  /* Afterwards: an allreduce and a broadcast work normally. */
  {
    int32_t x[2] = {rank, rank}, y[2] = {-1, -1};
    int64_t shape[1] = {2};
    char name[32];
    hvd_tensor_t send = hvd_tensor_make(x, HVD_INT32, 1, shape);
    hvd_tensor_t recv = hvd_tensor_make(y, HVD_INT32, 1, shape);
    snprintf(name, sizeof name, "after%d", rd + 1);
    rc = hvd_allreduce(name, &send, &recv, HVD_AVERAGE, 1.0, 1.0);
    tap_note("rc %d: %s; y[0] = %d", rc, hvd_last_error(), (int)y[0]);
    ok(rc == HVD_SUCCESS && y[0] == (size - 1) / 2 && y[1] == (size - 1) / 2,
       "round %d: allreduce after everyone joined", rd + 1);
    x[0] = x[1] = 10 * rank + 7;
    snprintf(name, sizeof name, "afterb%d", rd + 1);
    rc = hvd_broadcast(name, &send, size - 1);
    tap_note("rc %d: %s; x[0] = %d", rc, hvd_last_error(), (int)x[0]);
    ok(rc == HVD_SUCCESS && x[0] == 10 * (size - 1) + 7 &&
           x[1] == 10 * (size - 1) + 7,
       "round %d: broadcast after everyone joined", rd + 1);
  }
}

/* A broadcast the response cache knows, submitted while the last rank
 * has joined: it fails at once, as an uncached one does (before, its hit
 * waited HVD_STALL_CHECK_TIME, 60 s, for the coordinator). */
static void cached_under_join(void) {
  float x[3] = {1, 2, 3};
  int64_t shape[1] = {3};
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  for (int k = 0; k < 2; k++)
    if (hvd_broadcast("cb", &t, 0) != HVD_SUCCESS)
      bail("broadcast 'cb': %s", hvd_last_error());
  hvd_result_t rc = HVD_ERR_MISMATCH;
  char msg[256];
  snprintf(msg, sizeof msg,
           "broadcast 'cb': rank %d has joined; only allreduce can run until "
           "every rank joins",
           size - 1);
  double took = 0;
  if (rank < size - 1) {
    float y[3]; /* the timeline's "tj" (main): agreed by the coordinator */
    hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
    if (hvd_allreduce("tj", &t, &r, HVD_SUM, 1, 1) != HVD_SUCCESS)
      bail("allreduce 'tj': %s", hvd_last_error());
    double t0 = MPI_Wtime();
    rc = hvd_broadcast("cb", &t, 0);
    took = MPI_Wtime() - t0;
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  }
  int last = -2;
  is_int(HVD_SUCCESS, hvd_join(&last), "cached broadcast: hvd_join");
  is_int(HVD_ERR_MISMATCH, rc, "cached broadcast while rank %d has joined",
         size - 1);
  char want[256];
  snprintf(want, sizeof want,
           "broadcast 'cb': rank %d has joined; only allreduce can run until "
           "every rank joins",
           size - 1);
  is_string(want, msg, "  the message");
  ok(took < 10.0, "  at once, not after the stall check's 60 s (%.1f s)",
     took);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size < 2 || size > MAX_RANKS)
    bail("run at 2 to %d ranks", MAX_RANKS);
  snprintf(tl_path, sizeof tl_path, "/tmp/hvd-join-%d-timeline.json",
           (int)getppid());
  setenv("HVD_TIMELINE", tl_path, 1);
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());

  round_of_join(0);
  round_of_join(1);
  cached_under_join();

  /* Everyone joins at once: completes, naming some rank. */
  {
    int last = -2;
    hvd_result_t rc = hvd_join(&last);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "all join at once");
    ok(last >= 0 && last < size, "all join at once: last rank %d is a rank",
       last);
  }

  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  /* rank 0's timeline: "tj" has a READY instant for each rank that
   * submitted it, none for the joined one (it had one at time 0) */
  int ready = size - 1;
  if (rank == 0) {
    char *text = hvdt_slurp(tl_path);
    int n = 0, track = text ? hvdt_timeline_track(text, "tj") : -1;
    struct hvdt_event *ev = text ? hvdt_timeline_parse(text, &n) : NULL;
    ready = 0;
    for (int i = 0; i < n; i++)
      ready += ev[i].tid == track && strcmp(ev[i].name, "READY") == 0;
    free(ev);
    free(text);
    unlink(tl_path);
  }
  is_int(size - 1, ready,
         "timeline: 'tj' ready on the ranks that submitted it, not on the "
         "joined rank");
  return tap_mpi_finish();
}
