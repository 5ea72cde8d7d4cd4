/*
 * grouped.c - hvd_grouped_allreduce / allgather / reducescatter: exact
 * results of mixed groups, the members of an allreduce group fused into
 * one execution (rank 0's timeline: one span start for all), a name the
 * response cache knew taken into a group, ranks that do not form the same
 * group (HVD_ERR_MISMATCH naming them), a member whose shape differs (it
 * fails, the other member runs), and the argument errors (nothing
 * submitted: the names are free again at once).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int rank, size;
static char tl_path[256];

static double value(int r, int t, int i) { return (r + 1) * 10 + t * 3 + i; }

/* A group of three allreduces: float32 [5], int32 [3, 2], float64 [7]. */
static void test_allreduce(const char *tag, hvd_op_t op, double post) {
  float a[5], ra[5];
  int32_t b[6], rb[6];
  double c[7], rc_[7];
  for (int i = 0; i < 5; i++)
    a[i] = (float)value(rank, 0, i);
  for (int i = 0; i < 6; i++)
    b[i] = (int32_t)value(rank, 1, i);
  for (int i = 0; i < 7; i++)
    c[i] = value(rank, 2, i);
  int64_t s5 = 5, s32[2] = {3, 2}, s7 = 7;
  hvd_tensor_t sends[3] = {hvd_tensor_make(a, HVD_FLOAT32, 1, &s5),
                           hvd_tensor_make(b, HVD_INT32, 2, s32),
                           hvd_tensor_make(c, HVD_FLOAT64, 1, &s7)};
  hvd_tensor_t recvs[3] = {hvd_tensor_make(ra, HVD_FLOAT32, 1, &s5),
                           hvd_tensor_make(rb, HVD_INT32, 2, s32),
                           hvd_tensor_make(rc_, HVD_FLOAT64, 1, &s7)};
  char n0[64], n1[64], n2[64];
  snprintf(n0, sizeof n0, "%s.a", tag);
  snprintf(n1, sizeof n1, "%s.b", tag);
  snprintf(n2, sizeof n2, "%s.c", tag);
  const char *names[3] = {n0, n1, n2};
  hvd_result_t rc;
  if (op == HVD_SUM) {
    rc = hvd_grouped_allreduce(3, names, sends, recvs, op, 1.0, post);
  } else {
    hvd_request_t *reqs[3];
    rc = hvd_grouped_allreduce_async(3, names, sends, recvs, op, 1.0, post,
                                     reqs);
    for (int i = 0; i < 3 && rc == HVD_SUCCESS; i++)
      rc = hvd_wait(reqs[i]);
  }
  if (rc != HVD_SUCCESS)
    diag("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "%s: grouped allreduce of 3", tag);
  int good = 1;
  for (int i = 0; i < 5; i++) {
    double want = 0;
    for (int r = 0; r < size; r++)
      want += value(r, 0, i);
    want = (op == HVD_AVERAGE ? want / size : want) * post;
    good &= fabs(ra[i] - want) <= 1e-6 * fabs(want);
  }
  for (int i = 0; i < 6; i++) {
    int64_t want = 0;
    for (int r = 0; r < size; r++)
      want += (int64_t)value(r, 1, i);
    want = op == HVD_AVERAGE ? want / size : want;
    good &= rb[i] == (int32_t)want;
  }
  for (int i = 0; i < 7; i++) {
    double want = 0;
    for (int r = 0; r < size; r++)
      want += value(r, 2, i);
    want = (op == HVD_AVERAGE ? want / size : want) * post;
    good &= fabs(rc_[i] - want) <= 1e-12 * fabs(want);
  }
  ok(good, "%s: every member exact", tag);
}

static void test_allgather_reducescatter(void) {
  /* allgather: rank r sends r + 1 rows of [2] and 1 row of [3] */
  float a[8], b[3];
  for (int i = 0; i < 2 * (rank + 1); i++)
    a[i] = (float)(rank * 100 + i);
  for (int i = 0; i < 3; i++)
    b[i] = (float)(rank * 10 + i);
  int64_t sa[2] = {rank + 1, 2}, sb[2] = {1, 3};
  hvd_tensor_t sends[2] = {hvd_tensor_make(a, HVD_FLOAT32, 2, sa),
                           hvd_tensor_make(b, HVD_FLOAT32, 2, sb)};
  hvd_tensor_t recvs[2];
  const char *names[2] = {"ag.a", "ag.b"};
  hvd_result_t rc = hvd_grouped_allgather(2, names, sends, recvs);
  is_int(HVD_SUCCESS, rc, "grouped allgather of 2");
  int good = rc == HVD_SUCCESS;
  if (good) {
    const float *ga = recvs[0].data, *gb = recvs[1].data;
    int at = 0;
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 2 * (r + 1); i++)
        good &= ga[at++] == (float)(r * 100 + i);
    good &= recvs[0].shape[0] == size * (size + 1) / 2;
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 3; i++)
        good &= gb[r * 3 + i] == (float)(r * 10 + i);
    hvd_tensor_free(&recvs[0]);
    hvd_tensor_free(&recvs[1]);
  }
  ok(good, "grouped allgather: both members exact, in rank order");

  /* reducescatter: [2 size, 2] and [size] of rank-dependent values */
  float c[16], d[4];
  for (int i = 0; i < 4 * size; i++)
    c[i] = (float)(rank + i);
  for (int i = 0; i < size; i++)
    d[i] = (float)(rank * i);
  int64_t sc[2] = {2 * size, 2}, sd[1] = {size};
  hvd_tensor_t rs_send[2] = {hvd_tensor_make(c, HVD_FLOAT32, 2, sc),
                             hvd_tensor_make(d, HVD_FLOAT32, 1, sd)};
  hvd_tensor_t rs_recv[2];
  const char *rs_names[2] = {"rs.c", "rs.d"};
  hvd_request_t *reqs[2];
  rc = hvd_grouped_reducescatter_async(2, rs_names, rs_send, rs_recv, HVD_SUM,
                                       1.0, 1.0, reqs);
  is_int(HVD_SUCCESS, rc, "grouped reducescatter of 2: submitted");
  good = rc == HVD_SUCCESS && hvd_wait(reqs[0]) == HVD_SUCCESS &&
         hvd_wait(reqs[1]) == HVD_SUCCESS;
  if (good) {
    const float *gc = rs_recv[0].data, *gd = rs_recv[1].data;
    int sum_r = size * (size - 1) / 2;
    for (int i = 0; i < 4; i++) /* rows 2 rank, 2 rank + 1 */
      good &= gc[i] == (float)(sum_r + size * (4 * rank + i));
    good &= gd[0] == (float)(sum_r * rank);
    hvd_tensor_free(&rs_recv[0]);
    hvd_tensor_free(&rs_recv[1]);
  }
  ok(good, "grouped reducescatter: both members exact, this rank's block");
}

/* The group's allreduces share one execution: in rank 0's timeline every
 * member's ALLREDUCE span starts at the same time. */

/* The "ts" of the last span named `span` on tensor `name`'s track, or -1. */
static double span_ts(const char *text, const char *name, const char *span) {
  double ts = -1;
  (void)hvdt_timeline_span(text, name, span, &ts);
  return ts;
}

static void test_fused(void) {
  /* eight small float32 tensors, one group; the first four ran alone
   * before, so that the response cache knows them: alone they would run
   * from the cache, apart from the other four */
  float x[8][4], y[8][4];
  hvd_tensor_t s[8], r[8];
  char buf[8][32];
  const char *names[8];
  int64_t four = 4;
  for (int t = 0; t < 8; t++) {
    for (int i = 0; i < 4; i++)
      x[t][i] = (float)(rank + t + i);
    s[t] = hvd_tensor_make(x[t], HVD_FLOAT32, 1, &four);
    r[t] = hvd_tensor_make(y[t], HVD_FLOAT32, 1, &four);
    snprintf(buf[t], sizeof buf[t], "fused.%d", t);
    names[t] = buf[t];
  }
  for (int k = 0; k < 2; k++)
    for (int t = 0; t < 4; t++)
      hvd_allreduce(names[t], &s[t], &r[t], HVD_SUM, 1, 1);
  is_int(HVD_SUCCESS, hvd_grouped_allreduce(8, names, s, r, HVD_SUM, 1, 1),
         "a group of 8 small allreduces");
  hvd_shutdown(); /* flushes the timeline */
  int same = 1;   /* rank 0 reads its timeline; the others hold it vacuously */
  if (rank == 0) {
    char *text = hvdt_slurp(tl_path);
    double t0 = text ? span_ts(text, "fused.0", "ALLREDUCE") : -1;
    same = t0 > 0;
    for (int t = 1; t < 8 && same; t++) {
      double tt = span_ts(text, names[t], "ALLREDUCE");
      if (tt != t0)
        diag("fused.%d starts at %.3f, fused.0 at %.3f", t, tt, t0);
      same = tt == t0;
    }
    free(text);
    unlink(tl_path);
  }
  ok(same, "the 8 members ran as one fused allreduce (one span start in rank "
           "0's timeline)");
  unsetenv("HVD_TIMELINE"); /* the rest needs none: no file left behind */
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init again: %s", hvd_last_error());
}

/* A name the response cache knows, then in a group. */
static void test_cached_name(void) {
  float v = (float)(rank + 1), w = 0, u = 2, z = 0;
  int64_t one = 1;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  hvd_tensor_t tw = hvd_tensor_make(&w, HVD_FLOAT32, 1, &one);
  for (int k = 0; k < 3; k++)
    hvd_allreduce("cached", &tv, &tw, HVD_SUM, 1, 1);
  hvd_tensor_t s[2] = {tv, hvd_tensor_make(&u, HVD_FLOAT32, 1, &one)};
  hvd_tensor_t r[2] = {tw, hvd_tensor_make(&z, HVD_FLOAT32, 1, &one)};
  const char *names[2] = {"cached", "fresh"};
  w = 0;
  hvd_result_t rc = hvd_grouped_allreduce(2, names, s, r, HVD_SUM, 1, 1);
  is_int(HVD_SUCCESS, rc, "a cached name in a group");
  ok(w == (float)(size * (size + 1) / 2) && z == (float)(2 * size),
     "  both exact");
  w = 0;
  hvd_allreduce("cached", &tv, &tw, HVD_SUM, 1, 1);
  ok(w == (float)(size * (size + 1) / 2), "  and alone again after it");
}

/* FNV-1a as hvd computes a group's id (its last 4 hex digits in
 * messages). */
static unsigned short group_tag(int n, const char *const *names) {
  unsigned long long h = 1469598103934665603ull;
  for (int i = 0; i < n; i++)
    for (const unsigned char *p = (const unsigned char *)names[i];; p++) {
      h = (h ^ *p) * 1099511628211ull;
      if (*p == '\0')
        break;
    }
  return (unsigned short)(h & 0xffff);
}

static void test_mismatch(void) {
  if (size < 2)
    return;
  float a = 1, b = 2, ra, rb;
  int64_t one = 1;
  hvd_tensor_t s[2] = {hvd_tensor_make(&a, HVD_FLOAT32, 1, &one),
                       hvd_tensor_make(&b, HVD_FLOAT32, 1, &one)};
  hvd_tensor_t r[2] = {hvd_tensor_make(&ra, HVD_FLOAT32, 1, &one),
                       hvd_tensor_make(&rb, HVD_FLOAT32, 1, &one)};
  const char *names[2] = {"m.a", "m.b"};
  hvd_request_t *reqs[2];
  hvd_result_t rc[2];
  char msg[2][512];
  if (rank == 0) { /* rank 0 groups them, the others do not */
    if (hvd_grouped_allreduce_async(2, names, s, r, HVD_SUM, 1, 1, reqs) !=
        HVD_SUCCESS)
      bail("grouped submit: %s", hvd_last_error());
  } else {
    for (int i = 0; i < 2; i++)
      if (hvd_allreduce_async(names[i], &s[i], &r[i], HVD_SUM, 1, 1,
                              &reqs[i]) != HVD_SUCCESS)
        bail("submit: %s", hvd_last_error());
  }
  for (int i = 0; i < 2; i++) {
    rc[i] = hvd_wait(reqs[i]);
    snprintf(msg[i], sizeof msg[i], "%s", hvd_last_error());
  }
  unsigned tag = group_tag(2, names);
  for (int i = 0; i < 2; i++) {
    is_int(HVD_ERR_MISMATCH, rc[i], "grouped on rank 0 only: %s fails",
           names[i]);
    char want[512];
    size_t at = (size_t)snprintf(want, sizeof want,
                                 "allreduce '%s': rank 0 group %d of 2 "
                                 "(#%04x) vs",
                                 names[i], i + 1, tag);
    for (int q = 1; q < size; q++)
      at += (size_t)snprintf(want + at, sizeof want - at,
                             "%s rank %d group none", q > 1 ? "," : "", q);
    is_string(want, msg[i], "  the message names the ranks");
  }
}

/* A group whose first member's shape differs on rank 0: that member
 * fails on every rank naming the shapes, the other runs (before, it was
 * never answered: a hang past the stall inspector, which does not stop a
 * group's member). */
static void test_member_mismatch(void) {
  if (size < 2)
    return;
  float a[2] = {1, 1}, ra[2], b = (float)(rank + 1), rb = 0;
  int64_t na = rank == 0 ? 1 : 2, one = 1;
  hvd_tensor_t s[2] = {hvd_tensor_make(a, HVD_FLOAT32, 1, &na),
                       hvd_tensor_make(&b, HVD_FLOAT32, 1, &one)};
  hvd_tensor_t r[2] = {hvd_tensor_make(ra, HVD_FLOAT32, 1, &na),
                       hvd_tensor_make(&rb, HVD_FLOAT32, 1, &one)};
  const char *names[2] = {"mm.a", "mm.b"};
  hvd_request_t *reqs[2];
  if (hvd_grouped_allreduce_async(2, names, s, r, HVD_SUM, 1, 1, reqs) !=
      HVD_SUCCESS)
    bail("grouped submit: %s", hvd_last_error());
  hvd_result_t rc0 = hvd_wait(reqs[0]);
  char msg[512];
  snprintf(msg, sizeof msg, "%s", hvd_last_error());
  hvd_result_t rc1 = hvd_wait(reqs[1]);
  is_int(HVD_ERR_MISMATCH, rc0, "a member's shape differs on rank 0: it fails");
  char want[512];
  size_t at = (size_t)snprintf(want, sizeof want,
                               "allreduce 'mm.a': rank 0 shape [1] vs");
  for (int q = 1; q < size; q++)
    at += (size_t)snprintf(want + at, sizeof want - at, "%s rank %d shape [2]",
                           q > 1 ? "," : "", q);
  is_string(want, msg, "  naming the ranks and shapes");
  is_int(HVD_SUCCESS, rc1, "  the other member runs");
  ok(rb == (float)(size * (size + 1) / 2), "  exact (%g)", (double)rb);
  rb = 0; /* the blocking form: the member's error */
  is_int(HVD_ERR_MISMATCH, hvd_grouped_allreduce(2, names, s, r, HVD_SUM, 1, 1),
         "  hvd_grouped_allreduce returns it");
  ok(rb == (float)(size * (size + 1) / 2), "  the other member exact again");
}

static void test_errors(void) {
  float a = 1, ra;
  int32_t bad;
  int64_t one = 1;
  hvd_tensor_t s[2] = {hvd_tensor_make(&a, HVD_FLOAT32, 1, &one),
                       hvd_tensor_make(&a, HVD_FLOAT32, 1, &one)};
  hvd_tensor_t r[2] = {hvd_tensor_make(&ra, HVD_FLOAT32, 1, &one),
                       hvd_tensor_make(&bad, HVD_INT32, 1, &one)};
  const char *names[2] = {"e.a", "e.b"};
  const char *same[2] = {"e.a", "e.a"};
  hvd_request_t *reqs[2];
  struct {
    const char *what;
    hvd_result_t got;
    const char *msg;
  } c[6];
  char msgs[6][300];
  c[0].got = hvd_grouped_allreduce_async(2, names, s, r, HVD_SUM, 1, 1, reqs);
  snprintf(msgs[0], sizeof msgs[0], "%s", hvd_last_error());
  c[0].what = "a bad member";
  c[0].msg = "hvd_grouped_allreduce_async: tensor 1: allreduce 'e.b': recv "
             "dtype int32 differs from send dtype float32";
  r[1] = hvd_tensor_make(&ra, HVD_FLOAT32, 1, &one);
  c[1].got = hvd_grouped_allreduce_async(2, same, s, r, HVD_SUM, 1, 1, reqs);
  snprintf(msgs[1], sizeof msgs[1], "%s", hvd_last_error());
  c[1].what = "two members, one name";
  c[1].msg = "hvd_grouped_allreduce_async: tensors 0 and 1 are both named "
             "'e.a'";
  c[2].got = hvd_grouped_allreduce(0, names, s, r, HVD_SUM, 1, 1);
  snprintf(msgs[2], sizeof msgs[2], "%s", hvd_last_error());
  c[2].what = "no tensors";
  c[2].msg = "hvd_grouped_allreduce: 0 tensors; a group has at least 1 and "
             "at most 1048576";
  c[3].got = hvd_grouped_allgather(2, NULL, s, r);
  snprintf(msgs[3], sizeof msgs[3], "%s", hvd_last_error());
  c[3].what = "names NULL";
  c[3].msg = "hvd_grouped_allgather: names is NULL";
  c[4].got =
      hvd_grouped_reducescatter_async(2, names, s, r, HVD_SUM, 1, 1, NULL);
  snprintf(msgs[4], sizeof msgs[4], "%s", hvd_last_error());
  c[4].what = "reqs NULL";
  c[4].msg = "hvd_grouped_reducescatter_async: reqs is NULL";
  c[5].got = hvd_grouped_allreduce(1048577, names, s, r, HVD_SUM, 1, 1);
  snprintf(msgs[5], sizeof msgs[5], "%s", hvd_last_error());
  c[5].what = "more tensors than a group may have";
  c[5].msg = "hvd_grouped_allreduce: 1048577 tensors; a group has at least 1 "
             "and at most 1048576";
  for (int k = 0; k < 6; k++) {
    is_int(HVD_ERR_INVALID_ARG, c[k].got, "%s: code", c[k].what);
    is_string(c[k].msg, msgs[k], "%s: message", c[k].what);
  }
  /* nothing was submitted: the same names work at once */
  is_int(HVD_SUCCESS, hvd_grouped_allreduce(2, names, s, r, HVD_SUM, 1, 1),
         "after the refusals the names are free");
  /* a member whose name is in flight: refused with the member's prefix,
   * the others not submitted either. Each rank in turn holds 'e.b' while
   * the others wait in an MPI barrier, so that it cannot complete before
   * the group is tried (were every rank to submit it at once, a slow
   * rank could find it complete already) */
  hvd_result_t held_rc = HVD_SUCCESS, group_rc = HVD_SUCCESS,
               wait_rc = HVD_SUCCESS;
  char group_msg[300] = "";
  for (int turn = 0; turn < size; turn++) {
    hvd_request_t *held = NULL, *g[2];
    if (rank == turn) {
      held_rc = hvd_allreduce_async("e.b", &s[0], &r[0], HVD_SUM, 1, 1, &held);
      group_rc = hvd_grouped_allreduce_async(2, names, s, r, HVD_SUM, 1, 1, g);
      snprintf(group_msg, sizeof group_msg, "%s", hvd_last_error());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    hvd_result_t rc = HVD_SUCCESS;
    if (rank != turn)
      rc = hvd_allreduce_async("e.b", &s[0], &r[0], HVD_SUM, 1, 1, &held);
    if (rc == HVD_SUCCESS)
      rc = hvd_wait(held);
    if (rc != HVD_SUCCESS && wait_rc == HVD_SUCCESS)
      wait_rc = rc;
  }
  is_int(HVD_SUCCESS, held_rc, "'e.b' alone in flight");
  is_int(HVD_ERR_INVALID_ARG, group_rc, "a group with 'e.b' in it: code");
  is_string("hvd_grouped_allreduce_async: tensor 1: allreduce 'e.b': a "
            "collective named 'e.b' is already in flight on this rank",
            group_msg, "a group with 'e.b' in it: message");
  is_int(HVD_SUCCESS, wait_rc, "'e.b' completes in every turn");
  is_int(HVD_SUCCESS, hvd_grouped_allreduce(2, names, s, r, HVD_SUM, 1, 1),
         "then the group goes through");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  snprintf(tl_path, sizeof tl_path, "/tmp/hvd-grouped-%d-timeline.json",
           (int)getppid());
  setenv("HVD_TIMELINE", tl_path, 1);
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_fused();
  test_allreduce("sum", HVD_SUM, 1.0);
  test_allreduce("avg", HVD_AVERAGE, 1.0);
  test_allgather_reducescatter();
  test_cached_name();
  test_mismatch();
  test_member_mismatch();
  test_errors();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
