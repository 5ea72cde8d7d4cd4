/*
 * fused_allgather.c - host allgathers fused into one MPI_Allgatherv
 * (lib/ops/mpi_ops.c, allgather_fused): exact results whatever the mix.
 *
 * 24 tensors, every dtype, 1 to 3 dimensions, 0 to 3 rows per rank (one
 * with no rows anywhere), submitted asynchronously in an order shuffled
 * per rank and waited for in another: first with new names (the
 * coordinator gives each member's rows), then again (the response cache:
 * the executor learns the rows itself), then with half of them changing
 * their rows (a group mixing both). Then a grouped allgather of 6, whose
 * members must run as one fused allgather: in rank 0's timeline they all
 * start at the same time and each span says "tensors":6. Runs at 1..4
 * ranks.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NT 24
#define NG 6

static int P, R;
static char tl_path[600];

static const hvd_dtype_t dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};

/* Tensor t's rows on rank q in round k (round 2: the even ones change). */
static int64_t rows_of(int t, int q, int k) {
  if (t == 7)
    return 0;
  return (t + q + (k == 2 && t % 2 == 0)) % 4;
}
/* Elements per row: [rows], [rows, 3] or [rows, 2, 2]. */
static int64_t width(int t) { return t % 3 == 0 ? 1 : t % 3 == 1 ? 3 : 4; }
static double value(int t, int q, int k, int64_t i) {
  return (double)((t * 7 + q * 3 + k * 5 + i) % 11);
}

struct item {
  char name[32];
  hvd_dtype_t dt;
  void *send;
  hvd_tensor_t st, rt;
  hvd_request_t *req;
  hvd_result_t rc;
};

static void setup(struct item *it, const char *prefix, int t, int k) {
  int64_t rows = rows_of(t, R, k), shape[3] = {rows, 3, 2};
  int ndim = 1 + t % 3;
  if (ndim == 3)
    shape[1] = shape[2] = 2;
  snprintf(it->name, sizeof it->name, "%s.%02d", prefix, t);
  it->dt = dtypes[t % 8];
  it->send = hvdt_calloc((size_t)(rows * width(t)) + 1, hvdt_size(it->dt));
  for (int64_t i = 0; i < rows * width(t); i++)
    hvdt_put(it->dt, it->send, i, value(t, R, k, i));
  it->st = hvd_tensor_make(it->send, it->dt, ndim, shape);
  memset(&it->rt, 0, sizeof it->rt);
  it->req = NULL;
  it->rc = HVD_ERR_INTERNAL;
}

/* 1 if it holds every rank's rows of tensor t in round k, in rank order;
 * else 0 with why. Frees the buffers. */
static int check_item(struct item *it, int t, int k, char *why, size_t len) {
  int64_t total = 0, w = width(t);
  int good = 1;
  for (int q = 0; q < P; q++)
    total += rows_of(t, q, k);
  if (it->rc != HVD_SUCCESS) {
    snprintf(why, len, "%s: result %d", it->name, it->rc);
    good = 0;
  } else if (it->rt.dtype != it->dt || it->rt.ndim != it->st.ndim ||
             it->rt.shape[0] != total ||
             (it->st.ndim > 1 && it->rt.shape[1] != it->st.shape[1])) {
    snprintf(why, len, "%s: %d dims, %lld rows; want %d, %lld", it->name,
             it->rt.ndim, (long long)it->rt.shape[0], it->st.ndim,
             (long long)total);
    good = 0;
  } else {
    int64_t at = 0;
    for (int q = 0; q < P && good; q++)
      for (int64_t i = 0; i < rows_of(t, q, k) * w && good; i++, at++) {
        double got = hvdt_get(it->dt, it->rt.data, at);
        double want = hvdt_as_dtype(it->dt, value(t, q, k, i));
        if (got != want) {
          snprintf(why, len, "%s: element %lld (rank %d's %lld) is %g, want %g",
                   it->name, (long long)at, q, (long long)i, got, want);
          good = 0;
        }
      }
  }
  free(it->send);
  if (it->rc == HVD_SUCCESS)
    hvd_tensor_free(&it->rt);
  return good;
}

static void burst(int k, const char *what) {
  static struct item items[NT];
  int order[NT], worder[NT], bad = 0;
  char why[256];
  hvdt_shuffle(order, NT, (unsigned)R * 31u + (unsigned)k);
  hvdt_shuffle(worder, NT, (unsigned)R * 17u + 1000u + (unsigned)k);
  for (int t = 0; t < NT; t++)
    setup(&items[t], "ag", t, k);
  for (int s = 0; s < NT; s++) {
    struct item *it = &items[order[s]];
    it->rc = hvd_allgather_async(it->name, &it->st, &it->rt, &it->req);
    if (it->rc != HVD_SUCCESS)
      it->req = NULL;
  }
  for (int s = 0; s < NT; s++) {
    struct item *it = &items[worder[s]];
    if (it->req != NULL)
      it->rc = hvd_wait(it->req);
  }
  for (int t = 0; t < NT; t++)
    if (!check_item(&items[t], t, k, why, sizeof why) && bad++ == 0)
      diag_all("%s", why);
  ok(bad == 0, "%s: %d allgathers of every dtype, 0-3 rows a rank, exact", what,
     NT);
}

/* The "ts" of the last span named `span` on tensor `name`'s track (-1:
 * none), and whether its args say "tensors":n. */
static double span_ts(const char *text, const char *name, const char *span,
                      int n, int *group_ok) {
  char tensors[32];
  double ts = -1;
  const char *last = hvdt_timeline_span(text, name, span, &ts);
  snprintf(tensors, sizeof tensors, "\"tensors\":%d", n);
  const char *end = last ? strchr(last, '}') : NULL;
  const char *args = last ? strstr(last, "\"tensors\":") : NULL;
  *group_ok = args != NULL && end != NULL && args < end &&
              strncmp(args, tensors, strlen(tensors)) == 0 &&
              (args[strlen(tensors)] == '}' || args[strlen(tensors)] == ',');
  return ts;
}

static void grouped(void) {
  static struct item items[NG];
  hvd_tensor_t sends[NG], recvs[NG];
  const char *names[NG];
  char why[256];
  int bad = 0;
  for (int t = 0; t < NG; t++) {
    setup(&items[t], "ag.group", t, 0);
    sends[t] = items[t].st;
    names[t] = items[t].name;
  }
  hvd_result_t rc = hvd_grouped_allgather(NG, names, sends, recvs);
  for (int t = 0; t < NG; t++) {
    items[t].rc = rc;
    items[t].rt = recvs[t];
    if (!check_item(&items[t], t, 0, why, sizeof why) && bad++ == 0)
      diag_all("%s", why);
  }
  ok(rc == HVD_SUCCESS && bad == 0,
     "a grouped allgather of %d: every member exact", NG);
  hvd_shutdown(); /* flushes the timeline */
  int fused = 1;  /* rank 0 reads it; the others hold it vacuously */
  if (R == 0) {
    char *text = hvdt_slurp(tl_path);
    int g = 0;
    double t0 = text ? span_ts(text, names[0], "ALLGATHER", NG, &g) : -1;
    fused = t0 > 0 && g;
    for (int t = 1; t < NG && fused; t++) {
      double tt = span_ts(text, names[t], "ALLGATHER", NG, &g);
      if (tt != t0 || !g)
        diag("%s starts at %.3f (%s), %s at %.3f", names[t], tt,
             g ? "6 tensors" : "not 6 tensors", names[0], t0);
      fused = tt == t0 && g;
    }
    free(text);
  }
  ok(fused,
     "its members ran as one fused allgather (rank 0's timeline: one "
     "start, \"tensors\":%d)",
     NG);
}

int main(int argc, char **argv) {
  char dir[512];
  tap_mpi_init(&argc, &argv);
  P = tap_size();
  R = tap_rank();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-fused-allgather");
  snprintf(tl_path, sizeof tl_path, "%s/timeline.json", dir);
  setenv("HVD_TIMELINE", tl_path, 1);
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init failed: %s", hvd_last_error());
  burst(0, "new names");
  burst(1, "the same again (from the response cache)");
  burst(2, "half of them with other rows (cached and not, mixed)");
  grouped();
  hvdt_remove_tmpdir(dir);
  return tap_mpi_finish();
}
