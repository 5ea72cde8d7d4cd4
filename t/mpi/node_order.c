/*
 * node_order.c - on several nodes every local rank orders the nodes alike
 * (each node's lowest rank first), so an allreduce folds every element
 * over the nodes in one order whatever the fusion and the pieces.
 *
 * The layout is a mirror, node j holding ranks j and P-1-j (HVD_HOSTNAME,
 * "A B C C B A" at np 6): ordered by rank, local rank 1's peers would
 * see the nodes in the opposite order from local rank 0's, and the node
 * that folds an element would depend on which local rank owns its
 * segment, which moves with HVD_CHUNK_SIZE and HVD_FUSION_THRESHOLD.
 * Checked: hvd_cross_rank is the node's index (j) on both local ranks;
 * three float32 allreduces of mixed magnitudes, submitted together,
 * equal bit for bit the fold of each node's two ranks in local-rank order
 * and then of the nodes in node order, under the default pieces, small
 * ones, no fusion, and on arena tensors (zero copy); and the same through
 * a process set of every rank. At np 4 (two nodes, "A B B A") the topology
 * only: two nodes' sums are the same in either order.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int R, P;

enum { NT = 3 };
static const int64_t sizes[NT] = {1000, 5000, 70000};

typedef struct setting {
  const char *label;
  const char *env; /* NAME=VALUE or NULL */
  int arena;       /* tensors from hvd_alloc_host */
} setting_t;

static const setting_t settings[] = {
    {"default pieces", NULL, 0},
    {"1000-byte pieces", "HVD_CHUNK_SIZE=1000", 0},
    {"no fusion", "HVD_FUSION_THRESHOLD=0", 0},
    {"zero copy, 1000-byte pieces", "HVD_CHUNK_SIZE=1000", 1},
};
enum { NSET = sizeof settings / sizeof settings[0] };

/* Rank q's element i of tensor t: signed, exponents from -20 to 20, so
 * that the order of the nodes shows in the last bits. */
static float value(int q, int t, int64_t i) {
  uint64_t x = hvdt_hash3(q, t, i);
  double m = (double)(x >> 40) / 16777216.0 * 2 - 1;
  int e = (int)((x >> 8) % 41) - 20;
  return (float)(m * (double)(1ull << (e + 20)) / 1048576.0);
}

/* Node j's two ranks in local-rank order, then the nodes in order. */
static float want(int t, int64_t i) {
  float acc = 0;
  for (int j = 0; j < P / 2; j++) {
    float node = value(j, t, i) + value(P - 1 - j, t, i);
    acc = j == 0 ? node : acc + node;
  }
  return acc;
}

/* The three allreduces, submitted together, through ps or the world. */
static void reduce(const setting_t *st, const hvd_process_set_t *ps,
                   const char *where) {
  float *send[NT], *recv[NT];
  hvd_request_t *req[NT];
  hvd_result_t rc = HVD_SUCCESS;
  for (int t = 0; t < NT; t++) {
    size_t bytes = (size_t)sizes[t] * sizeof(float);
    send[t] = st->arena ? hvd_alloc_host(bytes) : hvdt_calloc(bytes, 1);
    recv[t] = st->arena ? hvd_alloc_host(bytes) : hvdt_calloc(bytes, 1);
    if (send[t] == NULL || recv[t] == NULL)
      bail("out of memory");
    for (int64_t i = 0; i < sizes[t]; i++)
      send[t][i] = value(R, t, i);
    char name[32];
    snprintf(name, sizeof name, "t%d", t);
    hvd_tensor_t s = hvd_tensor_make(send[t], HVD_FLOAT32, 1, &sizes[t]);
    hvd_tensor_t r = hvd_tensor_make(recv[t], HVD_FLOAT32, 1, &sizes[t]);
    hvd_result_t c =
        ps ? hvd_ps_allreduce_async(ps, name, &s, &r, HVD_SUM, 1, 1, &req[t])
           : hvd_allreduce_async(name, &s, &r, HVD_SUM, 1, 1, &req[t]);
    if (c != HVD_SUCCESS)
      bail("allreduce %s: %s", name, hvd_last_error());
  }
  int64_t bad = 0, first = -1;
  for (int t = 0; t < NT; t++) {
    hvd_result_t c = hvd_wait(req[t]);
    rc = rc == HVD_SUCCESS ? c : rc;
    for (int64_t i = 0; i < sizes[t]; i++) {
      float w = want(t, i);
      if (memcmp(&w, &recv[t][i], sizeof w) != 0 && bad++ == 0)
        first = i;
    }
    if (st->arena) {
      hvd_free_host(send[t]);
      hvd_free_host(recv[t]);
    } else {
      free(send[t]);
      free(recv[t]);
    }
  }
  if (bad)
    diag("rank %d: %lld elements differ, the first at %lld", R, (long long)bad,
         (long long)first);
  ok(rc == HVD_SUCCESS && bad == 0, "%s, %s: the bits of the fold in node order",
     st->label, where);
}

static void run_setting(const setting_t *st) {
  char node[8];
  snprintf(node, sizeof node, "%c", 'A' + (R < P - 1 - R ? R : P - 1 - R));
  setenv("HVD_HOSTNAME", node, 1);
  char name[64] = "";
  if (st->env != NULL) {
    snprintf(name, sizeof name, "%.*s", (int)strcspn(st->env, "="), st->env);
    setenv(name, st->env + strlen(name) + 1, 1);
  }
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init (%s): %s", st->label, hvd_last_error());
  if (st == &settings[0]) {
    int j = R < P - 1 - R ? R : P - 1 - R;
    is_int(j, hvd_cross_rank(), "hvd_cross_rank is the node's index");
    is_int(P / 2, hvd_cross_size(), "hvd_cross_size is the node count");
    is_int(R == j ? 0 : 1, hvd_local_rank(), "hvd_local_rank");
  }
  if (P >= 6) {
    reduce(st, NULL, "world");
    int all[64];
    for (int q = 0; q < P; q++)
      all[q] = q;
    hvd_process_set_t *ps = NULL;
    if (hvd_process_set_create(all, P, &ps) != HVD_SUCCESS)
      bail("hvd_process_set_create: %s", hvd_last_error());
    reduce(st, ps, "process set");
    is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "%s: set destroyed",
           st->label);
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", st->label);
  if (name[0])
    unsetenv(name);
  unsetenv("HVD_HOSTNAME");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P % 2 != 0 || P < 4 || P > 64)
    skip_all("a mirror of nodes needs an even number of ranks, 4 to 64");
  for (int s = 0; s < (P >= 6 ? NSET : 1); s++)
    run_setting(&settings[s]);
  return tap_mpi_finish();
}
