/*
 * local_sgd.c - post-local SGD in the distributed optimizer
 * (hvd_local_sgd_options_t, lib/optim/local_sgd.c) at np 1..4, against a
 * simulation of every rank in double.
 *
 * SGD at lr 0.5 on float32 "w" [6] and "v" [2, 3], rank q's gradient at
 * step t sin(0.3 (i + 1) (q + 1) + 0.7 t) (+ 0.1 for v): the ranks differ.
 * Cases, five steps each, every rank checking its own values after every
 * step (2e-6 of the largest):
 *  - period 2 from step 1, no group: step 0 averages gradients over all
 *    ranks; steps 1-4 update on the rank's own gradient, and steps 1 and
 *    3 end with the parameters averaged over all ranks (the same bits on
 *    every rank), while after steps 2 and 4 the ranks differ (np >= 2);
 *  - period 3 from step 0, groups of two ranks (process sets {0, 1},
 *    {2, 3}; {2} alone at np 3): each local step averages gradients within
 *    the pair; steps 0 and 3 end averaged over all ranks;
 *  - a bfloat16 parameter, period 1: its float32 master is averaged and
 *    the value rounded from it: the same bits on every rank, within 2e-2
 *    of the simulation;
 *  - the same pairs as nodes (HVD_HOSTNAME), the group
 *    hvd_process_set_split_node's (DDP's default subgroups);
 *  - refusals with their messages: period -1, start_step -1, sharding,
 *    compression, op adasum, and (np >= 2) a group without this rank.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NV 12 /* w's 6 and v's 6 values */
#define MAXR 8
#define STEPS 5
static int rank, size;

/* Rank q's gradient at step t, element k of the 12. */
static double grad(int q, int t, int k) {
  return sin(0.3 * (k % 6 + 1) * (q + 1) + 0.7 * t) + (k >= 6 ? 0.1 : 0);
}

/* The world's ranks simulated: sim[q][k]. */
typedef struct sim {
  double w[MAXR][NV];
} sim_t;

/* The group of rank q: pairs, or (pairs 0) q alone / the world. */
static int same_group(int pairs, int a, int b) {
  return pairs && a / 2 == b / 2;
}

/* One step c of the simulation (lr 0.5). */
static void sim_step(sim_t *s, int c, int period, int64_t start, int pairs,
                     int nv) {
  double g[MAXR][NV];
  for (int q = 0; q < size; q++)
    for (int k = 0; k < nv; k++) {
      double sum = 0;
      int n = 0;
      for (int r = 0; r < size; r++)
        if (c < start || r == q || same_group(pairs, q, r)) {
          sum += grad(r, c, k);
          n++;
        }
      g[q][k] = sum / n;
    }
  for (int q = 0; q < size; q++)
    for (int k = 0; k < nv; k++)
      s->w[q][k] -= 0.5 * g[q][k];
  if (c >= start && (c - start) % period == 0)
    for (int k = 0; k < nv; k++) {
      double m = 0;
      for (int q = 0; q < size; q++)
        m += s->w[q][k];
      for (int q = 0; q < size; q++)
        s->w[q][k] = m / size;
    }
}

static hvd_distributed_options_t lsgd(int period, int64_t start,
                                      const hvd_process_set_t *group) {
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.local_sgd.period = period;
  d.local_sgd.start_step = start;
  d.local_sgd.group = group;
  return d;
}

/* Five steps of w and v against the simulation. */
static void run_case(const char *what, int period, int64_t start,
                     const hvd_process_set_t *group, int pairs) {
  float w[6] = {0}, v[6] = {0}, gw[6], gv[6];
  const int64_t s6 = 6, s23[2] = {2, 3};
  hvd_param_t p[2] = {{"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &s6),
                       hvd_tensor_make(gw, HVD_FLOAT32, 1, &s6)},
                      {"v", hvd_tensor_make(v, HVD_FLOAT32, 2, s23),
                       hvd_tensor_make(gv, HVD_FLOAT32, 2, s23)}};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_distributed_options_t d = lsgd(period, start, group);
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(p, 2, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("%s: %s", what, hvd_last_error());
  sim_t s;
  memset(&s, 0, sizeof s);
  for (int c = 0; c < STEPS; c++) {
    for (int k = 0; k < 6; k++) {
      gw[k] = (float)grad(rank, c, k);
      gv[k] = (float)grad(rank, c, k + 6);
    }
    if (hvd_optimizer_grad_ready(opt, 1) != HVD_SUCCESS ||
        hvd_optimizer_step(opt) != HVD_SUCCESS ||
        hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      bail("%s step %d: %s", what, c, hvd_last_error());
    sim_step(&s, c, period, start, pairs, NV);
    double worst = 0, big = 0;
    for (int k = 0; k < NV; k++) {
      double got = k < 6 ? w[k] : v[k - 6], want = s.w[rank][k];
      worst = fmax(worst, fabs(got - want));
      big = fmax(big, fabs(want));
    }
    const int averaged = c >= start && (c - start) % period == 0;
    const int same = hvdt_same_on_all_ranks(w, sizeof w) &&
                     hvdt_same_on_all_ranks(v, sizeof v);
    /* a local step leaves the ranks apart unless its group is the world */
    const int apart =
        !averaged && c >= start && size > 1 && !(pairs && size == 2);
    ok(worst <= 2e-6 * big && (apart ? !same : same),
       "%s, step %d%s: the simulation's values to 2e-6 (%.2g)%s", what, c,
       c < start  ? " (plain)"
       : averaged ? " (averaged)"
                  : " (local)",
       worst / big,
       apart ? ", the ranks differ" : ", the same bits on every rank");
  }
  hvd_optimizer_destroy(opt);
}

/* A bfloat16 parameter at period 1: its master averaged, the value
 * rounded from it. */
static void test_bf16(void) {
  uint16_t h[4] = {0}, gh[4];
  const int64_t s4 = 4;
  hvd_param_t p = {"h", hvd_tensor_make(h, HVD_BFLOAT16, 1, &s4),
                   hvd_tensor_make(gh, HVD_BFLOAT16, 1, &s4)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  hvd_distributed_options_t d = lsgd(1, 0, NULL);
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("bf16: %s", hvd_last_error());
  sim_t s;
  memset(&s, 0, sizeof s);
  int good = 1;
  double worst = 0;
  for (int c = 0; c < 3; c++) {
    for (int k = 0; k < 4; k++)
      gh[k] = hvdt_f32_to_bf16((float)grad(rank, c, k));
    if (hvd_optimizer_step(opt) != HVD_SUCCESS ||
        hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      bail("bf16 step %d: %s", c, hvd_last_error());
    sim_step(&s, c, 1, 0, 0, 4);
    good &= hvdt_same_on_all_ranks(h, sizeof h);
    for (int k = 0; k < 4; k++)
      worst = fmax(worst, fabs(hvdt_bf16_to_f32(h[k]) - s.w[rank][k]));
  }
  ok(good && worst <= 2e-2,
     "bfloat16, period 1: the same bits on every rank after each step, "
     "within 2e-2 of the simulation (%.2g)",
     worst);
  hvd_optimizer_destroy(opt);
}

static void test_refusals(const hvd_process_set_t *other) {
  static const char fn[] = "hvd_distributed_optimizer: ";
  float w[4] = {0}, g[4] = {0};
  const int64_t s4 = 4;
  hvd_param_t p = {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &s4),
                   hvd_tensor_make(g, HVD_FLOAT32, 1, &s4)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  char want[256];
  for (int k = 0; k < 6; k++) {
    hvd_distributed_options_t d = lsgd(2, 0, NULL);
    const char *msg = NULL;
    hvd_result_t rc = HVD_ERR_UNSUPPORTED;
    switch (k) {
    case 0:
      d.local_sgd.period = -1;
      msg = "local_sgd.period -1 is negative";
      rc = HVD_ERR_INVALID_ARG;
      break;
    case 1:
      d.local_sgd.start_step = -1;
      msg = "local_sgd.start_step -1 is negative";
      rc = HVD_ERR_INVALID_ARG;
      break;
    case 2:
      d.shard_optimizer_state = 1;
      msg = "local_sgd averages whole gradients within its group: no "
            "shard_optimizer_state";
      break;
    case 3:
      d.compression = HVD_COMPRESS_FP16;
      msg = "local_sgd averages whole gradients within its group: no "
            "compression";
      break;
    case 4:
      d.op = HVD_ADASUM;
      msg = "local_sgd averages whole gradients within its group: no op "
            "adasum";
      break;
    case 5:
      if (other == NULL) {
        skip(2, "a group without this rank needs np >= 2");
        continue;
      }
      d.local_sgd.group = other;
      snprintf(want, sizeof want,
               "local_sgd.group: rank %d is not in process set %d", rank,
               hvd_process_set_id(other));
      msg = want;
      rc = HVD_ERR_INVALID_ARG;
      break;
    }
    hvd_optimizer_t *base = NULL, *opt = NULL;
    if (hvd_sgd_create(&p, 1, &so, &base) != HVD_SUCCESS)
      bail("sgd: %s", hvd_last_error());
    char full[512];
    snprintf(full, sizeof full, "%s%s", fn, msg);
    hvdt_refused(rc, hvd_distributed_optimizer(base, &d, &opt), full,
                 k == 5 ? "a group without this rank" : msg);
    hvd_optimizer_destroy(base);
  }
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > MAXR)
    bail("at most %d ranks", MAXR);
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  run_case("period 2 from step 1, no group", 2, 1, NULL, 0);
  /* the pairs, every rank creating each in order; its own kept */
  hvd_process_set_t *sets[MAXR] = {NULL}, *mine = NULL, *other = NULL;
  int nsets = (size + 1) / 2;
  for (int j = 0; j < nsets; j++) {
    int ranks[2] = {2 * j, 2 * j + 1};
    if (hvd_process_set_create(ranks, 2 * j + 1 < size ? 2 : 1, &sets[j]) !=
        HVD_SUCCESS)
      bail("process set %d: %s", j, hvd_last_error());
    if (j == rank / 2)
      mine = sets[j];
    else if (other == NULL)
      other = sets[j];
  }
  run_case("period 3 from step 0, pairs", 3, 0, mine, 1);
  test_bf16();
  test_refusals(other);
  for (int j = 0; j < nsets; j++)
    is_int(HVD_SUCCESS, hvd_process_set_destroy(sets[j]),
           "process set %d destroyed", j);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");

  /* the pairs as nodes (HVD_HOSTNAME), the group split by node */
  hvdt_init_nodes_of(2);
  hvd_process_set_t *local = NULL;
  is_int(HVD_SUCCESS, hvd_process_set_split_node(&local), "split by node");
  run_case("period 3 from step 0, each node's ranks", 3, 0, local, 1);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(local), "node's set destroyed");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
