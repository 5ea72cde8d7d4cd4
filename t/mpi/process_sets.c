/*
 * process_sets.c - collectives on subsets of the ranks: two disjoint sets
 * (even and odd ranks) reducing under the same name as each other and as
 * the world, concurrently; overlapping sets (the first size-1 ranks and
 * the last size-1) with every collective, roots counted in the set; a
 * rank outside a set; a mismatch inside a set named by world ranks; ranks
 * that disagree on a set; grouped and object collectives on a set (and an
 * outsider's errors for both); an outsider refused before the checks
 * that count the set's ranks (root, splits); destroy with work in
 * flight; a peer's hvd_shutdown with set work in flight (named as a
 * shutdown, not a destroy); hvd_shutdown with sets alive, and the
 * blocking forms afterwards naming themselves; every _async form on a
 * set whose ranks differ from the world's, beside the world's grouped
 * allgather. Exact values throughout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

static int rank, size;

/* The ranks r with r % 2 == parity. */
static int parity_set(int parity, int *out) {
  int n = 0;
  for (int r = parity; r < size; r += 2)
    out[n++] = r;
  return n;
}

static hvd_process_set_t *make(const int *ranks, int n, const char *what) {
  hvd_process_set_t *ps = NULL;
  hvd_result_t rc = hvd_process_set_create(ranks, n, &ps);
  if (rc != HVD_SUCCESS)
    bail("%s: %s", what, hvd_last_error());
  return ps;
}

static void test_disjoint(void) {
  int ev[8] = {0}, od[8] = {0};
  int ne = parity_set(0, ev), no = parity_set(1, od);
  hvd_process_set_t *even = make(ev, ne, "evens");
  hvd_process_set_t *odd = no > 0 ? make(od, no, "odds") : NULL;
  hvd_process_set_t *mine = rank % 2 == 0 ? even : odd;
  is_int(rank / 2, hvd_process_set_rank(mine), "my rank in my parity set");
  is_int(rank % 2 == 0 ? ne : no, hvd_process_set_size(mine),
         "my parity set's size");
  is_int(-1, hvd_process_set_rank(rank % 2 == 0 ? odd : even),
         "not a member of the other");

  /* the same name in my set and in the world, at the same time */
  double x[3], y[3], w[3], wy[3];
  for (int i = 0; i < 3; i++)
    x[i] = w[i] = 100 * rank + i;
  int64_t three = 3;
  hvd_tensor_t tx = hvd_tensor_make(x, HVD_FLOAT64, 1, &three);
  hvd_tensor_t ty = hvd_tensor_make(y, HVD_FLOAT64, 1, &three);
  hvd_tensor_t tw = hvd_tensor_make(w, HVD_FLOAT64, 1, &three);
  hvd_tensor_t twy = hvd_tensor_make(wy, HVD_FLOAT64, 1, &three);
  hvd_request_t *rs = NULL, *rw = NULL;
  hvd_result_t a =
      hvd_ps_allreduce_async(mine, "x", &tx, &ty, HVD_SUM, 1, 1, &rs);
  hvd_result_t b = hvd_allreduce_async("x", &tw, &twy, HVD_SUM, 1, 1, &rw);
  is_int(HVD_SUCCESS, a, "allreduce 'x' in my set submitted");
  is_int(HVD_SUCCESS, b, "allreduce 'x' in the world submitted beside it");
  is_int(HVD_SUCCESS, hvd_wait(rs), "  the set's completes");
  is_int(HVD_SUCCESS, hvd_wait(rw), "  the world's completes");
  int good = 1;
  for (int i = 0; i < 3; i++) {
    double set_sum = 0, world_sum = 0;
    for (int r = 0; r < size; r++) {
      world_sum += 100 * r + i;
      if (r % 2 == rank % 2)
        set_sum += 100 * r + i;
    }
    good &= y[i] == set_sum && wy[i] == world_sum;
  }
  ok(good, "each set summed its own ranks, the world all of them");

  /* many rounds, the two sets at their own pace */
  good = 1;
  for (int k = 0; k < 50; k++) {
    char name[32];
    snprintf(name, sizeof name, "round.%d", k % 7);
    x[0] = rank + k;
    if (hvd_ps_allreduce(mine, name, &tx, &ty, HVD_SUM, 1, 1) != HVD_SUCCESS)
      good = 0;
    double want = 0;
    for (int r = rank % 2; r < size; r += 2)
      want += r + k;
    good &= y[0] == want;
  }
  ok(good, "50 rounds in each set, cached names, exact");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(even), "destroy evens");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(odd), "destroy odds");
}

static void test_overlapping(void) {
  if (size < 2)
    return;
  int lo[8] = {0}, hi[8] = {0}, n = size - 1;
  for (int i = 0; i < n; i++)
    lo[i] = i, hi[i] = i + 1;
  hvd_process_set_t *A = make(lo, n, "low"), *B = make(hi, n, "high");
  int inA = rank<n, inB = rank> 0;
  float v = (float)(rank + 1), ra = 0, rb = 0;
  int64_t one = 1;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  hvd_tensor_t ta = hvd_tensor_make(&ra, HVD_FLOAT32, 1, &one);
  hvd_tensor_t tb = hvd_tensor_make(&rb, HVD_FLOAT32, 1, &one);
  hvd_request_t *qa = NULL, *qb = NULL;
  if (inA)
    hvd_ps_allreduce_async(A, "ov", &tv, &ta, HVD_SUM, 1, 1, &qa);
  if (inB)
    hvd_ps_allreduce_async(B, "ov", &tv, &tb, HVD_SUM, 1, 1, &qb);
  int good = (!inA || hvd_wait(qa) == HVD_SUCCESS) &&
             (!inB || hvd_wait(qb) == HVD_SUCCESS);
  float sa = (float)(n * (n + 1) / 2), sb = sa + n; /* 1..n and 2..n+1 */
  good &= (!inA || ra == sa) && (!inB || rb == sb);
  ok(good, "overlapping sets, both in flight on the ranks in both: exact");

  /* Each check below is made by the high set's members; rank 0, outside
   * it, holds them vacuously (the checks are collective in the TAP
   * harness) and makes the outsider's check, which the members hold
   * vacuously in turn. */
  int bc = 1, ag = 1, rs = 1, a2a = 1, bar = 1, outsider = 1, mm = 1;
  char got[512] = "", want[512] = "";
  if (inB) {
    int me = hvd_process_set_rank(B);
    int64_t nn = n, two = 2;
    /* broadcast from the set's rank 1: world rank 2 */
    int32_t b[2] = {rank, -rank};
    hvd_tensor_t tb2 = hvd_tensor_make(b, HVD_INT32, 1, &two);
    if (n > 1)
      bc = hvd_ps_broadcast(B, "bc", &tb2, 1) == HVD_SUCCESS && b[0] == 2 &&
           b[1] == -2;
    /* allgather in the set's rank order */
    int32_t g = rank * 3;
    hvd_tensor_t tg = hvd_tensor_make(&g, HVD_INT32, 1, &one), out;
    hvd_result_t rc = hvd_ps_allgather(B, "ag", &tg, &out);
    ag = rc == HVD_SUCCESS && out.shape[0] == n;
    for (int i = 0; ag && i < n; i++)
      ag = ((int32_t *)out.data)[i] == (i + 1) * 3;
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&out);
    /* reducescatter: block i of the set's sum to the set's rank i */
    float rsv[8];
    for (int i = 0; i < n; i++)
      rsv[i] = (float)(rank * 10 + i);
    hvd_tensor_t trs = hvd_tensor_make(rsv, HVD_FLOAT32, 1, &nn), rso;
    rc = hvd_ps_reducescatter(B, "rs", &trs, &rso, HVD_SUM, 1, 1);
    float sum = 0;
    for (int r = 1; r <= n; r++)
      sum += (float)(r * 10 + me);
    rs =
        rc == HVD_SUCCESS && rso.shape[0] == 1 && ((float *)rso.data)[0] == sum;
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&rso);
    /* alltoall: member i sends 100 * world rank + j to member j */
    int32_t sa2[8];
    for (int j = 0; j < n; j++)
      sa2[j] = 100 * rank + j;
    hvd_tensor_t tsa = hvd_tensor_make(sa2, HVD_INT32, 1, &nn), tao;
    rc = hvd_ps_alltoall(B, "a2a", &tsa, NULL, &tao, NULL);
    a2a = rc == HVD_SUCCESS && tao.shape[0] == n;
    for (int i = 0; a2a && i < n; i++)
      a2a = ((int32_t *)tao.data)[i] == 100 * (i + 1) + me;
    if (rc == HVD_SUCCESS)
      hvd_tensor_free(&tao);
    bar = hvd_ps_barrier(B) == HVD_SUCCESS;
    /* a mismatch inside the set, named by world ranks */
    if (n > 1) {
      float m[3] = {0};
      int64_t len = rank == 1 ? 2 : 3;
      hvd_tensor_t tm = hvd_tensor_make(m, HVD_FLOAT32, 1, &len);
      rc = hvd_ps_allreduce(B, "mm", &tm, &tm, HVD_SUM, 1, 1);
      snprintf(got, sizeof got, "%s", hvd_last_error());
      size_t at = (size_t)snprintf(want, sizeof want,
                                   "allreduce 'mm': rank 1 shape [2] vs");
      for (int r = 2; r <= n; r++)
        at += (size_t)snprintf(want + at, sizeof want - at,
                               "%s rank %d shape [3]", r > 2 ? "," : "", r);
      mm = rc == HVD_ERR_MISMATCH && strcmp(got, want) == 0;
      if (!mm)
        diag("got '%s', wanted '%s'", got, want);
    }
  } else { /* rank 0, outside the high set */
    hvd_request_t *q = NULL;
    hvd_result_t rc =
        hvd_ps_allreduce_async(B, "nm", &tv, &tb, HVD_SUM, 1, 1, &q);
    snprintf(got, sizeof got, "%s", hvd_last_error());
    size_t at = (size_t)snprintf(
        want, sizeof want,
        "allreduce 'nm': rank 0 is not in process set %d (ranks ",
        hvd_process_set_id(B));
    for (int i = 0; i < n; i++)
      at += (size_t)snprintf(want + at, sizeof want - at, "%s%d", i ? ", " : "",
                             hi[i]);
    snprintf(want + at, sizeof want - at, ")");
    outsider = rc == HVD_ERR_INVALID_ARG && strcmp(got, want) == 0;
    if (!outsider)
      diag("got '%s', wanted '%s'", got, want);
    /* a barrier has no user name: "barrier: ...", as the world's says */
    rc = hvd_ps_barrier(B);
    snprintf(got, sizeof got, "%s", hvd_last_error());
    memmove(want + strlen("barrier"), want + strlen("allreduce 'nm'"),
            strlen(want + strlen("allreduce 'nm'")) + 1);
    memcpy(want, "barrier", strlen("barrier"));
    outsider = outsider && rc == HVD_ERR_INVALID_ARG && strcmp(got, want) == 0;
    if (rc != HVD_ERR_INVALID_ARG || strcmp(got, want) != 0)
      diag("barrier: got '%s', wanted '%s'", got, want);
  }
  ok(bc, "broadcast from the set's rank 1 (world rank 2) to its members");
  ok(ag, "allgather in the set: its members' rows in set order");
  ok(rs, "reducescatter in the set: each member's block");
  ok(a2a, "alltoall in the set, split by the set's size");
  ok(bar, "barrier in the set");
  ok(mm, "a mismatch in the set names world ranks");
  ok(outsider, "a rank outside the set is refused, the set's ranks named "
               "(its barrier without hvd's internal name)");
  hvd_process_set_destroy(A);
  hvd_process_set_destroy(B);
}

/* The even ranks' set: a group of three allreduces, a group of two
 * allgathers, a grouped reducescatter, an object broadcast from the set's
 * last member and an object allgather of different lengths. The odd
 * ranks, outside it, get the errors (each check holds on every rank:
 * exact results on the members, exact errors on the others). */
static void test_grouped_objects(void) {
  int ev[8] = {0};
  int n = parity_set(0, ev);
  hvd_process_set_t *ps = make(ev, n, "evens");
  int me = hvd_process_set_rank(ps), in = me >= 0, id = hvd_process_set_id(ps);
  char list[64] = "", want[256];
  for (int i = 0, at = 0; i < n; i++)
    at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", i ? ", " : "",
                   ev[i]);

  /* three allreduces as one group */
  static const char *const names[3] = {"g.a", "g.b", "g.c"};
  float a[2], b[5], c[1];
  int64_t la = 2, lb = 5, lc = 1;
  for (int i = 0; i < 5; i++) {
    if (i < 2)
      a[i] = (float)(rank + i);
    b[i] = (float)(10 * rank + i);
  }
  c[0] = 1.0f;
  hvd_tensor_t t[3] = {hvd_tensor_make(a, HVD_FLOAT32, 1, &la),
                       hvd_tensor_make(b, HVD_FLOAT32, 1, &lb),
                       hvd_tensor_make(c, HVD_FLOAT32, 1, &lc)};
  hvd_result_t rc = hvd_ps_grouped_allreduce(ps, 3, names, t, t, HVD_SUM, 1, 1);
  int good;
  if (in) {
    good = rc == HVD_SUCCESS && c[0] == (float)n;
    for (int i = 0; i < 5; i++) {
      float sa = 0, sb = 0;
      for (int k = 0; k < n; k++)
        sa += (float)(ev[k] + i), sb += (float)(10 * ev[k] + i);
      good &= (i >= 2 || a[i] == sa) && b[i] == sb;
    }
  } else {
    snprintf(want, sizeof want,
             "allreduce 'g.a': rank %d is not in process set %d (ranks %s)",
             rank, id, list);
    good = rc == HVD_ERR_INVALID_ARG && strcmp(hvd_last_error(), want) == 0;
    if (!good)
      diag("got %d '%s'", rc, hvd_last_error());
  }
  ok(good, "grouped allreduce of 3 in the evens' set: exact sums (outsiders: "
           "the error names the first member)");

  /* two allgathers as one group: member m sends m + 1 rows of each */
  static const char *const gn[2] = {"gg.x", "gg.y"};
  int32_t gx[8], gy[16];
  int64_t rx = me + 1, ry[2] = {me + 1, 2};
  for (int i = 0; i < 8; i++)
    gx[i] = 100 * me + i;
  for (int i = 0; i < 16; i++)
    gy[i] = -(100 * me + i);
  hvd_tensor_t gs[2] = {hvd_tensor_make(gx, HVD_INT32, 1, &rx),
                        hvd_tensor_make(gy, HVD_INT32, 2, ry)};
  hvd_tensor_t gr[2] = {{.data = NULL}, {.data = NULL}};
  good = 1;
  if (in) {
    good = hvd_ps_grouped_allgather(ps, 2, gn, gs, gr) == HVD_SUCCESS &&
           gr[0].shape[0] == (int64_t)n * (n + 1) / 2 &&
           gr[1].shape[0] == gr[0].shape[0] && gr[1].shape[1] == 2;
    const int32_t *ox = gr[0].data, *oy = gr[1].data;
    for (int m = 0, at = 0; good && m < n; m++)
      for (int j = 0; j <= m; j++, at++)
        good &= ox[at] == 100 * m + j && oy[2 * at] == -(100 * m + 2 * j) &&
                oy[2 * at + 1] == -(100 * m + 2 * j + 1);
    hvd_tensor_free(&gr[0]);
    hvd_tensor_free(&gr[1]);
  }
  ok(good, "grouped allgather of 2 in the set: each member's rows, in set "
           "rank order");

  /* a grouped reducescatter of 2n + 1 rows */
  static const char *const rn[1] = {"gr.z"};
  double z[17], zo[17];
  int64_t rows = 2 * n + 1;
  for (int i = 0; i < rows; i++)
    z[i] = 1000.0 * me + i;
  hvd_tensor_t zs = hvd_tensor_make(z, HVD_FLOAT64, 1, &rows);
  hvd_tensor_t zr = {.data = NULL};
  good = 1;
  if (in) {
    (void)zo;
    good = hvd_ps_grouped_reducescatter(ps, 1, rn, &zs, &zr, HVD_SUM, 1, 1) ==
           HVD_SUCCESS;
    int64_t mine = 2 + (me < 1), first = 2 * me + (me < 1 ? me : 1);
    good &= good && zr.shape[0] == mine;
    const double *o = zr.data;
    for (int64_t i = 0; good && i < mine; i++)
      good &= o[i] == 1000.0 * n * (n - 1) / 2 + (double)n * (first + i);
    hvd_tensor_free(&zr);
  }
  ok(good, "grouped reducescatter of %d rows in the set: this member's block",
     2 * n + 1);

  /* objects: from the set's last member; then one of each length */
  char cfg[32];
  snprintf(cfg, sizeof cfg, "config of set rank %d", me);
  void *out = NULL;
  size_t len = 0;
  rc = hvd_ps_broadcast_object(ps, "cfg", cfg, strlen(cfg) + 1, n - 1, &out,
                               &len);
  if (in) {
    snprintf(want, sizeof want, "config of set rank %d", n - 1);
    good =
        rc == HVD_SUCCESS && len == strlen(want) + 1 && strcmp(out, want) == 0;
  } else {
    snprintf(want, sizeof want,
             "hvd_ps_broadcast_object 'cfg': rank %d is not in process set "
             "%d (ranks %s)",
             rank, id, list);
    good = rc == HVD_ERR_INVALID_ARG && strcmp(hvd_last_error(), want) == 0 &&
           out == NULL;
    if (!good)
      diag("got %d '%s'", rc, hvd_last_error());
  }
  free(out);
  ok(good, "broadcast_object in the set from its last member (outsiders: "
           "the error names the call)");
  size_t lens[8] = {0};
  char mine[8];
  memset(mine, 'a' + (me < 0 ? 0 : me), sizeof mine);
  out = NULL;
  rc = hvd_ps_allgather_object(ps, "lens", mine, (size_t)(me + 1), &out, lens);
  good = 1;
  if (in) {
    good = rc == HVD_SUCCESS;
    const char *o = out;
    for (int m = 0, at = 0; good && m < n; m++) {
      good &= lens[m] == (size_t)(m + 1);
      for (int j = 0; j <= m; j++)
        good &= o[at++] == 'a' + m;
    }
    good &= lens[n] == 0; /* n entries only */
  } else {
    snprintf(want, sizeof want,
             "hvd_ps_allgather_object 'lens': rank %d is not in process set "
             "%d (ranks %s)",
             rank, id, list);
    good = rc == HVD_ERR_INVALID_ARG && strcmp(hvd_last_error(), want) == 0;
  }
  free(out);
  ok(good, "allgather_object in the set: %d lengths, in set rank order", n);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "destroy the evens' set");
}

static void test_create_errors(void) {
  hvd_process_set_t *ps = (hvd_process_set_t *)&rank;
  int bad[2] = {1, 0}, out_of[1] = {size};
  is_int(HVD_ERR_INVALID_ARG, hvd_process_set_create(bad, 2, &ps),
         "unsorted ranks: code");
  char want[160];
  if (size >= 2)
    snprintf(want, sizeof want,
             "hvd_process_set_create: rank 0 passes ranks[1] = 0; the ranks "
             "are distinct, ascending, in 0..%d",
             size - 1);
  else
    snprintf(want, sizeof want,
             "hvd_process_set_create: rank 0 passes 2 ranks; a set has 1 to "
             "1");
  is_string(want, hvd_last_error(), "unsorted ranks: message");
  ok(ps == NULL, "  *out is NULL");
  is_int(HVD_ERR_INVALID_ARG, hvd_process_set_create(out_of, 1, &ps),
         "a rank out of range: code");
  snprintf(want, sizeof want,
           "hvd_process_set_create: rank 0 passes ranks[0] = %d; the ranks "
           "are distinct, ascending, in 0..%d",
           size, size - 1);
  is_string(want, hvd_last_error(), "a rank out of range: message");
  is_int(HVD_ERR_INVALID_ARG, hvd_process_set_create(out_of, 0, &ps),
         "no ranks: code");
  snprintf(want, sizeof want,
           "hvd_process_set_create: rank 0 passes 0 ranks; a set has 1 to %d",
           size);
  is_string(want, hvd_last_error(), "no ranks: message");

  /* One rank's bad arguments fail every rank, naming it (it once
   * returned alone and left the others in the collective for ever). */
  int last = size - 1, all[4] = {0, 1, 2, 3}, rev[2] = {last, 0};
  int mine = rank == last && size > 1;
  hvd_result_t rc = hvd_process_set_create(mine ? rev : all, mine ? 2 : size,
                                           &ps);
  snprintf(want, sizeof want,
           "hvd_process_set_create: rank %d passes ranks[1] = 0; the ranks "
           "are distinct, ascending, in 0..%d",
           last, last);
  ok(size == 1 ? rc == HVD_SUCCESS
               : rc == HVD_ERR_INVALID_ARG &&
                     strcmp(hvd_last_error(), want) == 0 && ps == NULL,
     "the last rank's unsorted list: every rank fails naming it (rc %d)", rc);
  if (size == 1)
    hvd_process_set_destroy(ps);
  rc = hvd_process_set_create(all, size, rank == last ? NULL : &ps);
  snprintf(want, sizeof want, "hvd_process_set_create: rank %d passes out NULL",
           last);
  is_int(HVD_ERR_INVALID_ARG, rc, "the last rank's out NULL: every rank fails");
  is_string(want, hvd_last_error(), "  naming it");
  ok(rank == last || ps == NULL, "  *out is NULL");
  int none[1] = {0};
  rc = hvd_process_set_create(rank == last ? NULL : none, 1, &ps);
  snprintf(want, sizeof want,
           "hvd_process_set_create: rank %d passes 1 ranks (ranks NULL); a "
           "set has 1 to %d",
           last, size);
  is_int(HVD_ERR_INVALID_ARG, rc, "the last rank's ranks NULL: every rank");
  is_string(want, hvd_last_error(), "  naming it");

  /* rank 0 lists fewer ranks than the others */
  if (size > 2) {
    int list[3] = {0, 1, 2};
    rc = hvd_process_set_create(list, rank == 0 ? 2 : 3, &ps);
    is_int(HVD_ERR_MISMATCH, rc, "ranks disagree on the set: code");
    is_string("hvd_process_set_create: rank 0 lists 2 ranks but rank 1 lists 3",
              hvd_last_error(), "ranks disagree on the set: message");
  }
}

/* rc and hvd_last_error() of the call just made: HVD_ERR_INVALID_ARG and
 * "<head>: <outsider>" on rank 0, "<head>: <member>" on the others. */
static void refused_as(hvd_result_t rc, const char *head, const char *outsider,
                       const char *member, const char *what) {
  char want[256];
  snprintf(want, sizeof want, "%s: %s", head, rank == 0 ? outsider : member);
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: result", what);
  is_string(want, hvd_last_error(), "%s: message", what);
}

/* The set of ranks 1..size-1: rank 0, outside it, is told so before
 * any check that counts the set's ranks (a root or splits out of range
 * for it, which it once got instead); the members get those checks. */
static void test_outsider_first(void) {
  if (size < 2)
    return;
  int hi[8], n = size - 1;
  char list[64] = "", outsider[128], member[128];
  for (int i = 0, at = 0; i < n; i++) {
    hi[i] = i + 1;
    at += snprintf(list + at, sizeof list - (size_t)at, "%s%d", i ? ", " : "",
                   hi[i]);
  }
  hvd_process_set_t *B = make(hi, n, "high");
  snprintf(outsider, sizeof outsider,
           "rank 0 is not in process set %d (ranks %s)", hvd_process_set_id(B),
           list);
  float x[8] = {0};
  int64_t rows = n + 1, splits[8], rsplits[8];
  for (int i = 0; i < n; i++)
    splits[i] = 1; /* n rows of n + 1 */
  hvd_tensor_t tx = hvd_tensor_make(x, HVD_FLOAT32, 1, &rows), out;
  hvd_request_t *q = NULL;
  snprintf(member, sizeof member, "splits sum to %d but shape[0] is %d", n,
           n + 1);
  refused_as(hvd_ps_alltoall(B, "o.a2a", &tx, splits, &out, rsplits),
             "alltoall 'o.a2a'", outsider, member, "alltoall, splits");
  refused_as(hvd_ps_alltoall_async(B, "o.a2a", &tx, splits, &out, rsplits, &q),
             "alltoall 'o.a2a'", outsider, member, "alltoall_async, splits");
  snprintf(member, sizeof member, "root %d is out of range for %d ranks", n,
           n);
  refused_as(hvd_ps_broadcast(B, "o.bc", &tx, n), "broadcast 'o.bc'",
             outsider, member, "broadcast, root");
  refused_as(hvd_ps_broadcast_async(B, "o.bc", &tx, n, &q), "broadcast 'o.bc'",
             outsider, member, "broadcast_async, root");
  hvd_process_set_destroy(B);
}

static void test_destroy_in_flight(void) {
  if (size < 2)
    return;
  int pair[2] = {0, 1};
  hvd_process_set_t *ps = make(pair, 2, "pair");
  float v = 1, r = 0;
  int64_t one = 1;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  hvd_tensor_t tr = hvd_tensor_make(&r, HVD_FLOAT32, 1, &one);
  hvd_request_t *q = NULL;
  int id = hvd_process_set_id(ps);
  if (rank == 0) /* rank 1 never submits it */
    hvd_ps_allreduce_async(ps, "pending", &tv, &tr, HVD_SUM, 1, 1, &q);
  /* nobody destroys it before rank 0 has submitted: a destroy that the
   * set's engine agrees on first stops the set, and the submission would
   * be refused instead (seen in CI under load) */
  is_int(HVD_SUCCESS, hvd_barrier(), "  a world barrier once it is in flight");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps),
         "destroy with work in flight");
  /* rank 0 holds the request; rank 1 none (vacuous there) */
  hvd_result_t waited = rank == 0 ? hvd_wait(q) : HVD_ERR_SHUTDOWN;
  is_int(HVD_ERR_SHUTDOWN, waited,
         "  the request in flight ends with HVD_ERR_SHUTDOWN");
  char want0[256], want1[256], got[512] = "";
  for (int first = 0; first < 2; first++)
    snprintf(first ? want1 : want0, sizeof want0,
             "allreduce 'pending': process set %d was destroyed (rank %d "
             "destroyed it first) before this collective completed",
             id, first);
  snprintf(got, sizeof got, "%s", rank == 0 ? hvd_last_error() : want0);
  ok(strcmp(got, want0) == 0 || strcmp(got, want1) == 0,
     "  saying that the set was destroyed, not hvd shut down ('%s')", got);
  /* the world goes on */
  float s = 1, t = 0;
  hvd_tensor_t ts = hvd_tensor_make(&s, HVD_FLOAT32, 1, &one);
  hvd_tensor_t tt = hvd_tensor_make(&t, HVD_FLOAT32, 1, &one);
  ok(hvd_allreduce("after", &ts, &tt, HVD_SUM, 1, 1) == HVD_SUCCESS &&
         t == (float)size,
     "the world's collectives go on");
}

/* The set of ranks 1..size-1 (rank 0 alone at np 1), so that set ranks
 * differ from world ranks: every _async form on it at once, then every
 * request waited. Member i of m is world rank S[i]. */
typedef struct {
  hvd_request_t *q[9];
  int32_t bc[2], a2a_in[8], ga_in[2][8];
  float rs_in[8], grs_in[2][16];
  double gar_in[3];
  int32_t gar2_in[2];
  hvd_tensor_t a2a_out, rs_out, gar_out[2], ga_out[2], grs_out[2];
  double gar_res[3];
  int32_t gar2_res[2];
} async_t;

static void submit_async(hvd_process_set_t *S, int m, int me, async_t *a) {
  int64_t two = 2, three = 3, mm = m, m2 = 2 * m, rows = me + 1;
  a->bc[0] = rank, a->bc[1] = -rank;
  hvd_tensor_t tb = hvd_tensor_make(a->bc, HVD_INT32, 1, &two);
  for (int j = 0; j < m; j++) {
    a->a2a_in[j] = 100 * rank + j;
    a->rs_in[j] = (float)(rank * 10 + j);
  }
  hvd_tensor_t ta = hvd_tensor_make(a->a2a_in, HVD_INT32, 1, &mm);
  hvd_tensor_t tr = hvd_tensor_make(a->rs_in, HVD_FLOAT32, 1, &mm);
  is_int(HVD_SUCCESS, hvd_ps_broadcast_async(S, "as.bc", &tb, m - 1, &a->q[0]),
         "hvd_ps_broadcast_async");
  is_int(HVD_SUCCESS,
         hvd_ps_alltoall_async(S, "as.a2a", &ta, NULL, &a->a2a_out, NULL,
                               &a->q[1]),
         "hvd_ps_alltoall_async");
  is_int(HVD_SUCCESS,
         hvd_ps_reducescatter_async(S, "as.rs", &tr, &a->rs_out, HVD_SUM, 1, 1,
                                    &a->q[2]),
         "hvd_ps_reducescatter_async");
  for (int k = 0; k < 3; k++)
    a->gar_in[k] = rank + k;
  a->gar2_in[0] = a->gar2_in[1] = 2 * rank;
  hvd_tensor_t gs[2] = {hvd_tensor_make(a->gar_in, HVD_FLOAT64, 1, &three),
                        hvd_tensor_make(a->gar2_in, HVD_INT32, 1, &two)};
  a->gar_out[0] = hvd_tensor_make(a->gar_res, HVD_FLOAT64, 1, &three);
  a->gar_out[1] = hvd_tensor_make(a->gar2_res, HVD_INT32, 1, &two);
  const char *gn[2] = {"as.g0", "as.g1"}, *an[2] = {"as.a0", "as.a1"},
             *rn[2] = {"as.r0", "as.r1"};
  is_int(HVD_SUCCESS,
         hvd_ps_grouped_allreduce_async(S, 2, gn, gs, a->gar_out, HVD_SUM, 1, 1,
                                        &a->q[3]),
         "hvd_ps_grouped_allreduce_async");
  for (int t = 0; t < 2; t++)
    for (int i = 0; i <= me; i++)
      a->ga_in[t][i] = rank * (t + 1);
  hvd_tensor_t as[2] = {hvd_tensor_make(a->ga_in[0], HVD_INT32, 1, &rows),
                        hvd_tensor_make(a->ga_in[1], HVD_INT32, 1, &rows)};
  is_int(HVD_SUCCESS,
         hvd_ps_grouped_allgather_async(S, 2, an, as, a->ga_out, &a->q[5]),
         "hvd_ps_grouped_allgather_async");
  for (int t = 0; t < 2; t++)
    for (int j = 0; j < 2 * m; j++)
      a->grs_in[t][j] = (float)(rank * 100 + j + 1000 * t);
  hvd_tensor_t rs[2] = {hvd_tensor_make(a->grs_in[0], HVD_FLOAT32, 1, &m2),
                        hvd_tensor_make(a->grs_in[1], HVD_FLOAT32, 1, &m2)};
  is_int(HVD_SUCCESS,
         hvd_ps_grouped_reducescatter_async(S, 2, rn, rs, a->grs_out, HVD_SUM,
                                            1, 1, &a->q[7]),
         "hvd_ps_grouped_reducescatter_async");
}

/* 1 when every result of submit_async is exact; S[i]: member i. */
static int check_async(const int *S, int m, int me, async_t *a) {
  int good = a->bc[0] == S[m - 1] && a->bc[1] == -S[m - 1];
  good &= a->a2a_out.shape[0] == m;
  for (int i = 0; good && i < m; i++)
    good = ((int32_t *)a->a2a_out.data)[i] == 100 * S[i] + me;
  float rsum = 0;
  int wsum = 0;
  for (int i = 0; i < m; i++)
    rsum += (float)(S[i] * 10 + me), wsum += S[i];
  good &= a->rs_out.shape[0] == 1 && ((float *)a->rs_out.data)[0] == rsum;
  for (int k = 0; k < 3; k++)
    good &= a->gar_res[k] == (double)(wsum + m * k);
  good &= a->gar2_res[0] == 2 * wsum && a->gar2_res[1] == 2 * wsum;
  for (int t = 0; t < 2; t++) {
    good &= a->ga_out[t].shape[0] == m * (m + 1) / 2;
    int at = 0;
    for (int i = 0; good && i < m; i++)
      for (int j = 0; good && j <= i; j++)
        good = ((int32_t *)a->ga_out[t].data)[at++] == S[i] * (t + 1);
    float want[2] = {0, 0};
    for (int i = 0; i < m; i++)
      for (int u = 0; u < 2; u++)
        want[u] += (float)(S[i] * 100 + 2 * me + u + 1000 * t);
    good &= a->grs_out[t].shape[0] == 2 &&
            ((float *)a->grs_out[t].data)[0] == want[0] &&
            ((float *)a->grs_out[t].data)[1] == want[1];
  }
  return good;
}

static void test_async_forms(void) {
  int S[8], m = 0;
  for (int r = size > 1 ? 1 : 0; r < size; r++)
    S[m++] = r;
  hvd_process_set_t *set = make(S, m, "ranks 1..size-1");
  int me = hvd_process_set_rank(set);
  async_t a;
  memset(&a, 0, sizeof a);
  if (me >= 0)
    submit_async(set, m, me, &a);
  else { /* the checks are collective: rank 0 holds them vacuously */
    static const char *const calls[6] = {
        "hvd_ps_broadcast_async",         "hvd_ps_alltoall_async",
        "hvd_ps_reducescatter_async",     "hvd_ps_grouped_allreduce_async",
        "hvd_ps_grouped_allgather_async", "hvd_ps_grouped_reducescatter_async"};
    for (int k = 0; k < 6; k++)
      ok(1, "%s", calls[k]);
  }
  /* The world's grouped allgather, in flight with the set's: 1 row of
   * rank and 2 of rank + 0.5 from every rank. */
  int32_t w0 = rank;
  float w1[2] = {rank + 0.5f, rank + 0.5f};
  int64_t one = 1, two = 2;
  hvd_tensor_t ws[2] = {hvd_tensor_make(&w0, HVD_INT32, 1, &one),
                        hvd_tensor_make(w1, HVD_FLOAT32, 1, &two)},
               wo[2];
  hvd_request_t *wq[2] = {NULL, NULL};
  const char *wn[2] = {"as.w0", "as.w1"};
  is_int(HVD_SUCCESS, hvd_grouped_allgather_async(2, wn, ws, wo, wq),
         "hvd_grouped_allgather_async in the world");
  int waited = 1;
  for (int k = 0; me >= 0 && k < 9; k++) /* grouped: 2 requests each */
    waited &= a.q[k] != NULL && hvd_wait(a.q[k]) == HVD_SUCCESS;
  ok(waited, "every request on the set completes");
  ok(me < 0 || check_async(S, m, me, &a),
     "broadcast, alltoall, reducescatter and the grouped forms on the set: "
     "exact, in set order");
  int wgood = hvd_wait(wq[0]) == HVD_SUCCESS &&
              hvd_wait(wq[1]) == HVD_SUCCESS && wo[0].shape[0] == size &&
              wo[1].shape[0] == 2 * size;
  for (int r = 0; wgood && r < size; r++)
    wgood = ((int32_t *)wo[0].data)[r] == r &&
            ((float *)wo[1].data)[2 * r] == r + 0.5f &&
            ((float *)wo[1].data)[2 * r + 1] == r + 0.5f;
  ok(wgood, "the world's grouped allgather beside them: exact, rank order");
  if (wgood)
    hvd_tensor_free(&wo[0]), hvd_tensor_free(&wo[1]);
  if (me >= 0 && waited) {
    hvd_tensor_free(&a.a2a_out);
    hvd_tensor_free(&a.rs_out);
    for (int t = 0; t < 2; t++)
      hvd_tensor_free(&a.ga_out[t]), hvd_tensor_free(&a.grs_out[t]);
  }
  hvd_process_set_destroy(set);
}

/* Every rank but 0 has an allreduce in flight in a set of all ranks;
 * rank 0's hvd_shutdown ends it, and the set's message says so (it
 * once said that rank 0 had destroyed the set). */
static void test_peer_shutdown(void) {
  if (size < 2)
    return;
  int all[8];
  for (int i = 0; i < size; i++)
    all[i] = i;
  hvd_process_set_t *ps = make(all, size, "everyone");
  float v = 1, r = 0;
  int64_t one = 1;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  hvd_tensor_t tr = hvd_tensor_make(&r, HVD_FLOAT32, 1, &one);
  hvd_request_t *q = NULL;
  if (rank > 0) /* rank 0 never submits it */
    hvd_ps_allreduce_async(ps, "ps.pending", &tv, &tr, HVD_SUM, 1, 1, &q);
  is_int(HVD_SUCCESS, hvd_barrier(), "peer shutdown: a world barrier first");
  hvd_result_t rc = rank == 0 ? hvd_shutdown() : hvd_wait(q);
  is_int(rank == 0 ? HVD_SUCCESS : HVD_ERR_SHUTDOWN, rc,
         "peer shutdown: rank 0 shuts down; the others' set allreduce ends");
  is_string(rank == 0 ? "" : "allreduce 'ps.pending': hvd was shut down by "
                             "rank 0 before this collective completed",
            rank == 0 ? "" : hvd_last_error(), "peer shutdown: message");
  if (rank > 0)
    hvd_shutdown();
  hvd_process_set_destroy(ps);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init again: %s", hvd_last_error());
}

static void test_shutdown_with_sets(void) {
  int all[8];
  for (int i = 0; i < size; i++)
    all[i] = i;
  hvd_process_set_t *ps = make(all, size, "everyone");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown with a set alive");
  float v = 1;
  int64_t one = 1;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_FLOAT32, 1, &one);
  is_int(HVD_ERR_NOT_INITIALIZED,
         hvd_ps_allreduce(ps, "z", &tv, &tv, HVD_SUM, 1, 1),
         "after hvd_shutdown the set takes nothing");
  /* each blocking form names itself, not the world's call inside it */
  is_string("hvd_ps_allreduce: hvd_init() has not been called",
            hvd_last_error(), "  hvd_ps_allreduce names itself");
  hvd_ps_broadcast(ps, "z", &tv, 0);
  is_string("hvd_ps_broadcast: hvd_init() has not been called",
            hvd_last_error(), "  hvd_ps_broadcast names itself");
  is_int(HVD_ERR_NOT_INITIALIZED, hvd_ps_barrier(ps), "  hvd_ps_barrier: code");
  is_string("hvd_ps_barrier: hvd_init() has not been called",
            hvd_last_error(), "  hvd_ps_barrier names itself");
  const char *names[1] = {"z"};
  hvd_ps_grouped_allreduce(ps, 1, names, &tv, &tv, HVD_SUM, 1, 1);
  is_string("hvd_ps_grouped_allreduce: hvd_init() has not been called",
            hvd_last_error(), "  hvd_ps_grouped_allreduce names itself");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "and destroy frees it");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init again");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 8)
    bail("at most 8 ranks, not %d", size);
  hvd_process_set_t *ps = NULL;
  int zero = 0;
  is_int(HVD_ERR_NOT_INITIALIZED, hvd_process_set_create(&zero, 1, &ps),
         "before hvd_init: not initialized");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_disjoint();
  test_overlapping();
  test_grouped_objects();
  test_async_forms();
  test_create_errors();
  test_outsider_first();
  test_destroy_in_flight();
  test_peer_shutdown();
  test_shutdown_with_sets();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
