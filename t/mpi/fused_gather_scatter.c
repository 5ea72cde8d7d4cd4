/*
 * fused_gather_scatter.c - host allgathers fused into one MPI_Allgatherv
 * and host reducescatters fused into one MPI_Reduce_scatter
 * (lib/ops/mpi_ops.c, allgather_fused and reducescatter_fused): exact
 * results whatever the mix.
 *
 * Allgathers: 24 tensors, every dtype, 1 to 3 dimensions, 0 to 3 rows per
 * rank (one with no rows anywhere). Reducescatters: 24 tensors, 1 to 3
 * dimensions, 0 to 2P+1 rows (fewer rows than ranks too, one with none),
 * half of them float32 and half of every dtype. Each set is submitted
 * asynchronously in an order shuffled per rank and waited for in another:
 * first with new names (the coordinator gives an allgather's rows), then
 * again (the response cache: the executor learns the rows itself), then
 * with the even ones changing their rows (a group mixing both) and, for
 * reducescatters, the ops mixed (sum, min, max, and a sum with prescale 2
 * and postscale 0.25 for the floats) so that groups split where dtype, op
 * or scaling change. Then a grouped allgather and a grouped
 * reducescatter of 6, whose members must each run as one: in rank 0's
 * timeline they all start at the same time and each span says
 * "tensors":6. Runs at 1..4 ranks.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NT 24
#define NG 6

enum { AG, RS };
static const char *const coll_name[] = {"allgather", "reducescatter"};
static int P, R;
static char tl_path[600];

static const hvd_dtype_t dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};

/* Tensor t's rows on rank q in round k (round 2: the even ones change).
 * An allgather's differ per rank, a reducescatter's may not. */
static int64_t rows_of(int c, int t, int q, int k) {
  int more = k == 2 && t % 2 == 0;
  if (c == RS)
    return (t * 5 + more) % (2 * P + 2);
  return t == 7 ? 0 : (t + q + more) % 4;
}
/* Elements per row: [rows], [rows, 3] or [rows, 2, 2]. */
static int64_t width(int t) { return t % 3 == 0 ? 1 : t % 3 == 1 ? 3 : 4; }
static double value(int t, int q, int k, int64_t i) {
  return (double)((t * 7 + q * 3 + k * 5 + i) % 11);
}

struct item {
  char name[32];
  int c, t, k;
  hvd_dtype_t dt;
  hvd_op_t op;
  double pre, post;
  void *send;
  hvd_tensor_t st, rt;
  hvd_request_t *req;
  hvd_result_t rc;
};

static void setup(struct item *it, const char *prefix, int c, int t, int k) {
  int64_t rows = rows_of(c, t, R, k), shape[3] = {rows, 3, 2};
  int ndim = 1 + t % 3;
  if (ndim == 3)
    shape[1] = shape[2] = 2;
  snprintf(it->name, sizeof it->name, "%s.%02d", prefix, t);
  it->c = c, it->t = t, it->k = k;
  it->dt = c == RS && t < NT / 2 ? HVD_FLOAT32 : dtypes[t % 8];
  it->op = HVD_SUM;
  it->pre = it->post = 1.0;
  if (c == RS && k == 2 && t % 4 != 0) {
    static const hvd_op_t ops[] = {HVD_SUM, HVD_MIN, HVD_MAX, HVD_SUM};
    it->op = ops[t % 4];
    if (t % 4 == 3 && hvdt_is_float(it->dt))
      it->pre = 2.0, it->post = 0.25;
  }
  it->send = hvdt_calloc((size_t)(rows * width(t)) + 1, hvdt_size(it->dt));
  for (int64_t i = 0; i < rows * width(t); i++)
    hvdt_put(it->dt, it->send, i, value(t, R, k, i));
  it->st = hvd_tensor_make(it->send, it->dt, ndim, shape);
  memset(&it->rt, 0, sizeof it->rt);
  it->req = NULL;
  it->rc = HVD_ERR_INTERNAL;
}

static hvd_result_t submit(struct item *it) {
  if (it->c == AG)
    return hvd_allgather_async(it->name, &it->st, &it->rt, &it->req);
  return hvd_reducescatter_async(it->name, &it->st, &it->rt, it->op, it->pre,
                                 it->post, &it->req);
}

/* Element i of the right result: an allgather's every rank's rows in
 * rank order; a reducescatter's this rank's block reduced over the
 * ranks. */
static double want_at(const struct item *it, int64_t i) {
  int64_t w = width(it->t);
  if (it->c == AG) {
    int q = 0;
    while (i >= rows_of(AG, it->t, q, it->k) * w)
      i -= rows_of(AG, it->t, q++, it->k) * w;
    return hvdt_as_dtype(it->dt, value(it->t, q, it->k, i));
  }
  int64_t rows = rows_of(RS, it->t, R, it->k);
  int64_t first = R * (rows / P) + (R < rows % P ? R : rows % P);
  int64_t at = first * w + i; /* in the whole tensor */
  double acc = value(it->t, 0, it->k, at) * it->pre;
  for (int q = 1; q < P; q++)
    acc = hvdt_fold(it->op, acc, value(it->t, q, it->k, at) * it->pre);
  return hvdt_as_dtype(it->dt, acc * it->post);
}

/* 1 if it holds the right result; else 0 with why. Frees the buffers. */
static int check_item(struct item *it, char *why, size_t len) {
  int64_t rows = 0;
  if (it->c == AG)
    for (int q = 0; q < P; q++)
      rows += rows_of(AG, it->t, q, it->k);
  else
    rows = it->st.shape[0] / P + (R < it->st.shape[0] % P);
  int good = 1;
  if (it->rc != HVD_SUCCESS) {
    snprintf(why, len, "%s: result %d", it->name, it->rc);
    good = 0;
  } else if (it->rt.dtype != it->dt || it->rt.ndim != it->st.ndim ||
             it->rt.shape[0] != rows ||
             (it->st.ndim > 1 && it->rt.shape[1] != it->st.shape[1])) {
    snprintf(why, len, "%s: %d dims, %lld rows; want %d, %lld", it->name,
             it->rt.ndim, (long long)it->rt.shape[0], it->st.ndim,
             (long long)rows);
    good = 0;
  } else {
    for (int64_t i = 0; i < rows * width(it->t) && good; i++) {
      double got = hvdt_get(it->dt, it->rt.data, i), want = want_at(it, i);
      if (got != want) {
        snprintf(why, len, "%s: element %lld is %g, want %g", it->name,
                 (long long)i, got, want);
        good = 0;
      }
    }
  }
  free(it->send);
  if (it->rc == HVD_SUCCESS)
    hvd_tensor_free(&it->rt);
  return good;
}

static void burst(int c, int k, const char *what) {
  static struct item items[NT];
  int order[NT], worder[NT], bad = 0;
  char why[256], prefix[8];
  hvdt_shuffle(order, NT, (unsigned)R * 31u + (unsigned)(k + 10 * c));
  hvdt_shuffle(worder, NT, (unsigned)R * 17u + 1000u + (unsigned)(k + 10 * c));
  snprintf(prefix, sizeof prefix, "%s", c == AG ? "ag" : "rs");
  for (int t = 0; t < NT; t++)
    setup(&items[t], prefix, c, t, k);
  for (int s = 0; s < NT; s++) {
    struct item *it = &items[order[s]];
    if ((it->rc = submit(it)) != HVD_SUCCESS)
      it->req = NULL;
  }
  for (int s = 0; s < NT; s++) {
    struct item *it = &items[worder[s]];
    if (it->req != NULL)
      it->rc = hvd_wait(it->req);
  }
  for (int t = 0; t < NT; t++)
    if (!check_item(&items[t], why, sizeof why) && bad++ == 0)
      diag_all("%s", why);
  ok(bad == 0, "%ss, %s: %d of them, 0-%d rows, exact", coll_name[c], what, NT,
     c == AG ? 3 : 2 * P + 1);
}

/* A grouped collective of NG members (their names in names[]). */
static void grouped(int c, const char **names) {
  static struct item group[2][NG]; /* names[] outlive the call */
  struct item *items = group[c];
  hvd_tensor_t sends[NG], recvs[NG];
  char why[256];
  int bad = 0;
  for (int t = 0; t < NG; t++) { /* reducescatters: float32 */
    setup(&items[t], c == AG ? "ag.group" : "rs.group", c, t, 0);
    sends[t] = items[t].st;
    names[t] = items[t].name;
  }
  hvd_result_t rc = c == AG ? hvd_grouped_allgather(NG, names, sends, recvs)
                            : hvd_grouped_reducescatter(NG, names, sends, recvs,
                                                        HVD_SUM, 1.0, 1.0);
  for (int t = 0; t < NG; t++) {
    items[t].rc = rc;
    items[t].rt = recvs[t];
    if (!check_item(&items[t], why, sizeof why) && bad++ == 0)
      diag_all("%s", why);
  }
  ok(rc == HVD_SUCCESS && bad == 0, "a grouped %s of %d: every member exact",
     coll_name[c], NG);
}

int main(int argc, char **argv) {
  static const char *spans[] = {"ALLGATHER", "REDUCESCATTER"};
  const char *names[2][NG];
  char dir[512];
  tap_mpi_init(&argc, &argv);
  P = tap_size();
  R = tap_rank();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-fused-gather-scatter");
  snprintf(tl_path, sizeof tl_path, "%s/timeline.json", dir);
  setenv("HVD_TIMELINE", tl_path, 1);
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init failed: %s", hvd_last_error());
  for (int c = AG; c <= RS; c++) {
    burst(c, 0, "new names");
    burst(c, 1, "the same again (from the response cache)");
    burst(c, 2,
          c == AG ? "half of them with other rows (cached and not, mixed)"
                  : "half of them with other rows, ops and scaling mixed");
  }
  grouped(AG, names[AG]);
  grouped(RS, names[RS]);
  hvd_shutdown(); /* flushes the timeline */
  char *text = R == 0 ? hvdt_slurp(tl_path) : NULL;
  for (int c = AG; c <= RS; c++) /* rank 0 reads it; the others pass */
    ok(R != 0 || hvdt_timeline_fused(text, names[c], NG, spans[c]),
       "the grouped %s's members ran as one fused %s (rank 0's timeline: "
       "one start, \"tensors\":%d)",
       coll_name[c], coll_name[c], NG);
  free(text);
  hvdt_remove_tmpdir(dir);
  return tap_mpi_finish();
}
