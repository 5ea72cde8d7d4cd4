/*
 * host_mem.c - collectives on hvd_alloc_host memory at 1..4 ranks: a fused
 * group whose tensors are partly hvd_alloc_host blocks (huge-page ones of
 * 3 MiB and more, small ones) and partly malloc'd, summed and averaged in
 * place and out of place, exact; a tensor freed and allocated again under
 * the same name (a new address, the same cached response) between rounds;
 * hvd_shutdown with hvd_alloc_host tensors in flight, then the blocks
 * freed; hvd_alloc_host and hvd_free_host after shutdown.
 *
 * Inputs: element i of tensor t on rank r is (t + i) % 5 + r, small
 * integers whose sum over the ranks is exact in float32: P((t+i)%5) +
 * P(P-1)/2; the average divides that by P (exact: halves at even P).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

static int R, P;

enum { NT = 8 };
/* elements of each tensor: 3 MiB + 1 float, 1, 1000, 2 MiB / 4, 5 MiB, ... */
static const int64_t sizes[NT] = {
    (3 << 20) / 4 + 1, 1, 1000, (2 << 20) / 4, (5 << 20) / 4, 37, 70000, 3};
/* 1: hvd_alloc_host, 0: malloc */
static const int in_host[NT] = {1, 1, 0, 1, 0, 1, 1, 0};

static float input(int t, int64_t i, int r) {
  return (float)((t + i) % 5 + r);
}

static double sum_of(int t, int64_t i) {
  return (double)P * ((t + i) % 5) + (double)P * (P - 1) / 2.0;
}

static float *alloc_t(int t) {
  size_t bytes = sizeof(float) * (size_t)sizes[t];
  return in_host[t] ? hvd_alloc_host(bytes) : malloc(bytes);
}

static void free_t(int t, float *p) {
  if (in_host[t])
    hvd_free_host(p);
  else
    free(p);
}

/* One round: every tensor submitted (reverse order), waited for, checked.
 * out: out of place into a second set of buffers. Returns wrong tensors. */
static int round_trip(float **x, float **y, hvd_op_t op, int tag, char *why,
                      size_t len) {
  hvd_request_t *req[NT];
  int bad = 0;
  for (int t = 0; t < NT; t++)
    for (int64_t i = 0; i < sizes[t]; i++)
      x[t][i] = input(t, i, R);
  for (int t = NT - 1; t >= 0; t--) {
    char name[32];
    snprintf(name, sizeof name, "hm.%d.%d", tag, t);
    hvd_tensor_t a = hvd_tensor_make(x[t], HVD_FLOAT32, 1, &sizes[t]);
    hvd_tensor_t b = hvd_tensor_make(y ? y[t] : x[t], HVD_FLOAT32, 1, &sizes[t]);
    hvd_result_t rc = hvd_allreduce_async(name, &a, &b, op, 1.0, 1.0, &req[t]);
    if (rc != HVD_SUCCESS) {
      snprintf(why, len, "submit %s: %s", name, hvd_last_error());
      return NT;
    }
  }
  for (int t = 0; t < NT; t++) {
    hvd_result_t rc = hvd_wait(req[t]);
    const float *out = y ? y[t] : x[t];
    for (int64_t i = 0; rc == HVD_SUCCESS && i < sizes[t]; i++) {
      double want = op == HVD_AVERAGE ? sum_of(t, i) / P : sum_of(t, i);
      if (out[i] != (float)want) {
        if (bad == 0)
          snprintf(why, len, "tensor %d (%s) [%lld] is %g, expected %g", t,
                   in_host[t] ? "hvd_alloc_host" : "malloc", (long long)i,
                   (double)out[i], want);
        bad++;
        break;
      }
    }
    if (rc != HVD_SUCCESS && bad++ == 0)
      snprintf(why, len, "wait: %s", hvd_last_error());
  }
  return bad;
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  R = hvd_rank();
  P = hvd_size();
  float *x[NT], *y[NT];
  char why[256] = "";
  for (int t = 0; t < NT; t++) {
    x[t] = alloc_t(t);
    y[t] = alloc_t(t);
    if (x[t] == NULL || y[t] == NULL)
      bail("allocating tensor %d: %s", t, hvd_last_error());
  }

  is_int(0, round_trip(x, NULL, HVD_SUM, 0, why, sizeof why),
         "np=%d: sum in place, hvd_alloc_host and malloc tensors in one "
         "burst %s",
         P, why);
  is_int(0, round_trip(x, NULL, HVD_AVERAGE, 1, why, sizeof why),
         "np=%d: average in place %s", P, why);
  is_int(0, round_trip(x, y, HVD_SUM, 2, why, sizeof why),
         "np=%d: sum out of place %s", P, why);

  /* the same names again, after tensors 0 and 3 (hvd_alloc_host, and a
   * malloc'd one would do the same) were freed and allocated anew, twice:
   * the second round comes through the response cache */
  for (int k = 0; k < 2; k++) {
    int again[2] = {0, 3};
    for (int j = 0; j < 2; j++) {
      int t = again[j];
      free_t(t, x[t]);
      void *spacer = hvd_alloc_host(4096); /* the address may move */
      x[t] = alloc_t(t);
      hvd_free_host(spacer);
      if (x[t] == NULL)
        bail("allocating tensor %d again: %s", t, hvd_last_error());
    }
    is_int(0, round_trip(x, NULL, HVD_SUM, 0, why, sizeof why),
           "np=%d: freed and allocated again, round %d %s", P, k + 1, why);
  }

  /* shutdown with hvd_alloc_host tensors in flight: each request ends
   * (done or HVD_ERR_SHUTDOWN), then the blocks can be freed */
  hvd_request_t *req[NT];
  int submitted = 0;
  for (int t = 0; t < NT; t++) {
    if (!in_host[t])
      continue;
    char name[32];
    snprintf(name, sizeof name, "hm.fly.%d", t);
    hvd_tensor_t a = hvd_tensor_make(x[t], HVD_FLOAT32, 1, &sizes[t]);
    if (hvd_allreduce_async(name, &a, &a, HVD_SUM, 1.0, 1.0,
                            &req[submitted]) == HVD_SUCCESS)
      submitted++;
  }
  is_int(5, submitted, "np=%d: 5 hvd_alloc_host tensors in flight", P);
  is_int(HVD_SUCCESS, hvd_shutdown(), "np=%d: hvd_shutdown with them", P);
  int ended = 0;
  for (int k = 0; k < submitted; k++) {
    hvd_result_t rc = hvd_wait(req[k]);
    ended += rc == HVD_SUCCESS || rc == HVD_ERR_SHUTDOWN;
  }
  is_int(submitted, ended,
         "np=%d: each ended, done or HVD_ERR_SHUTDOWN", P);
  int freed = 0;
  for (int t = 0; t < NT; t++) {
    if (in_host[t])
      freed += hvd_free_host(x[t]) == HVD_SUCCESS &&
               hvd_free_host(y[t]) == HVD_SUCCESS;
    else {
      free(x[t]);
      free(y[t]);
    }
  }
  is_int(5, freed, "np=%d: the blocks free after shutdown", P);
  void *late = hvd_alloc_host(3 << 20);
  ok(late != NULL && hvd_free_host(late) == HVD_SUCCESS,
     "np=%d: hvd_alloc_host and hvd_free_host after shutdown", P);
  return tap_mpi_finish();
}
