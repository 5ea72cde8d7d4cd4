/*
 * optim_groups.c - the distributed optimizer's explicit gradient groups
 * (hvd_distributed_options_t's num_groups and groups, Horovod's
 * DistributedOptimizer(groups=...)), at np 1..4.
 *
 * A model of five float32 parameters of different lengths; each rank's
 * gradients are its own multiples of 1/8, so every sum is exact whatever
 * the order. Cases:
 *  - values: SGD (momentum 0.5) over four steps, some gradients handed
 *    over by grad_ready (backward order, some of a group only) and the
 *    rest at the step, with num_groups 2, num_groups 9 (more than the
 *    parameters: one each), groups {7, -1, 7, 3, 3} (ids in any order,
 *    one parameter in none), two backward passes per step, a bfloat16
 *    wire (compression), reduce_fp32 with bfloat16 parameters, and a
 *    post-local-SGD group: every value bit for bit the run without
 *    groups;
 *  - a group is one grouped allreduce, submitted when its last gradient
 *    is ready: with groups {0, 0, 1, 1, -1} and the gradients handed
 *    over one at a time (each followed by a barrier and a pause), rank
 *    0's timeline shows each group's two members starting their
 *    allreduce together and the groups apart (without groups, every
 *    parameter on its own: the check fails);
 *  - a gradient handed over twice while its group waits: refused as for
 *    one in flight;
 *  - ranks that group differently (np >= 2): the step fails on every
 *    rank naming the group field and the options;
 *  - refusals, each with its exact message: num_groups -1, both set, an
 *    id below -1, with shard_optimizer_state, PowerSGD, Adasum, and
 *    compression with a bfloat16 gradient.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#define NP 5
#define MAXLEN 9
static int rank, size;
static char tl_path[256];

typedef struct model {
  hvd_dtype_t dt;
  float w[NP][MAXLEN], g[NP][MAXLEN]; /* float32, or bfloat16 in place */
  char names[NP][16];
  int64_t len[NP];
  hvd_param_t p[NP];
} model_t;

static void make(model_t *m, hvd_dtype_t dt) {
  memset(m, 0, sizeof *m);
  m->dt = dt;
  for (int k = 0; k < NP; k++) {
    m->len[k] = 3 + (k * 5) % 7;
    snprintf(m->names[k], sizeof m->names[k], "g%d", k);
    for (int64_t i = 0; i < m->len[k]; i++)
      hvdt_put(dt, m->w[k], i, (double)((i * 3 + k) % 7 - 3) / 4);
    m->p[k].name = m->names[k];
    m->p[k].value = hvd_tensor_make(m->w[k], dt, 1, &m->len[k]);
    m->p[k].grad = hvd_tensor_make(m->g[k], dt, 1, &m->len[k]);
  }
}

/* Rank r's gradient element i of parameter k at step t (and pass q). */
static double grad_of(int r, int k, int64_t i, int t, int q) {
  return (double)((i + k + 3 * r + t + 2 * q) % 7 - 3) / 8;
}

static void set_grads(model_t *m, int k, int t, int q) {
  for (int64_t i = 0; i < m->len[k]; i++)
    hvdt_put(m->dt, m->g[k], i,
             hvdt_get(m->dt, m->g[k], i) + grad_of(rank, k, i, t, q));
}

typedef struct cfg {
  const char *what;
  hvd_dtype_t dt;
  int num_groups;
  const int *groups;
  int passes;
  int compress_bf16, reduce_fp32, local_sgd;
} cfg_t;

static hvd_optimizer_t *make_opt(model_t *m, const cfg_t *c, int grouped,
                                 hvd_process_set_t *lgroup) {
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.5;
  so.momentum = 0.5;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.backward_passes_per_step = c->passes;
  o.compression = c->compress_bf16 ? HVD_COMPRESS_BF16 : HVD_COMPRESS_NONE;
  o.reduce_fp32 = c->reduce_fp32;
  if (c->local_sgd) {
    o.local_sgd.period = 2;
    o.local_sgd.start_step = 1;
    o.local_sgd.group = lgroup;
  }
  if (grouped) {
    o.num_groups = c->num_groups;
    o.groups = c->groups;
  }
  if (hvd_sgd_create(m->p, NP, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &opt) != HVD_SUCCESS)
    bail("%s: %s", c->what, hvd_last_error());
  return opt;
}

/* Four steps; at step t the gradients of parameters t % NP .. NP - 1 are
 * handed over in backward order (the rest at the step). */
static int train(model_t *m, hvd_optimizer_t *opt, const cfg_t *c) {
  for (int t = 0; t < 4; t++) {
    if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      return 0;
    for (int q = 0; q < c->passes; q++)
      for (int k = NP - 1; k >= 0; k--) {
        set_grads(m, k, t, q);
        if (k >= t % NP && hvd_optimizer_grad_ready(opt, k) != HVD_SUCCESS)
          return 0;
      }
    if (hvd_optimizer_step(opt) != HVD_SUCCESS) {
      tap_note("%s: step %d: %s", c->what, t, hvd_last_error());
      return 0;
    }
  }
  return 1;
}

static void test_values(hvd_process_set_t *lgroup) {
  static const int ids[NP] = {7, -1, 7, 3, 3};
  static const cfg_t cs[] = {
      {"num_groups 2", HVD_FLOAT32, 2, NULL, 1, 0, 0, 0},
      {"num_groups 9", HVD_FLOAT32, 9, NULL, 1, 0, 0, 0},
      {"groups {7, -1, 7, 3, 3}", HVD_FLOAT32, 0, ids, 1, 0, 0, 0},
      {"num_groups 2, 2 passes", HVD_FLOAT32, 2, NULL, 2, 0, 0, 0},
      {"groups, bfloat16 wire", HVD_FLOAT32, 0, ids, 1, 1, 0, 0},
      {"num_groups 2, bfloat16, reduce_fp32", HVD_BFLOAT16, 2, NULL, 1, 0, 1,
       0},
      {"groups, local SGD group", HVD_FLOAT32, 0, ids, 1, 0, 0, 1},
  };
  for (size_t j = 0; j < sizeof cs / sizeof cs[0]; j++) {
    model_t a, b;
    make(&a, cs[j].dt);
    make(&b, cs[j].dt);
    hvd_optimizer_t *oa = make_opt(&a, &cs[j], 0, lgroup);
    hvd_optimizer_t *ob = make_opt(&b, &cs[j], 1, lgroup);
    int good = train(&a, oa, &cs[j]) && train(&b, ob, &cs[j]);
    ok(good && memcmp(a.w, b.w, sizeof a.w) == 0,
       "%s: the values bit for bit those without groups", cs[j].what);
    hvd_optimizer_destroy(oa);
    hvd_optimizer_destroy(ob);
  }
}

static void pause_ms(int ms) {
  struct timespec ts = {0, (long)ms * 1000000L};
  nanosleep(&ts, NULL);
}

/* The last ALLREDUCE span's start of each parameter's reduction, from
 * rank 0's timeline (-1 elsewhere). */
static void starts(double *ts) {
  char *text = rank == 0 ? hvdt_slurp(tl_path) : NULL;
  for (int k = 0; k < NP; k++) {
    char name[32];
    snprintf(name, sizeof name, "hvd.grad.g%d", k);
    ts[k] = -1;
    if (text != NULL)
      (void)hvdt_timeline_span(text, name, "ALLREDUCE", &ts[k]);
  }
  free(text);
}

static void test_one_call(void) {
  static const int ids[NP] = {0, 0, 1, 1, -1};
  cfg_t c = {"groups {0, 0, 1, 1, -1}", HVD_FLOAT32, 0, ids, 1, 0, 0, 0};
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = make_opt(&m, &c, 1, NULL);
  if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  int good = 1;
  for (int k = NP - 1; k >= 0; k--) { /* one at a time */
    set_grads(&m, k, 0, 0);
    good &= hvd_optimizer_grad_ready(opt, k) == HVD_SUCCESS;
    MPI_Barrier(MPI_COMM_WORLD);
    pause_ms(30);
  }
  good &= hvd_optimizer_step(opt) == HVD_SUCCESS;
  hvd_optimizer_destroy(opt);
  hvd_shutdown(); /* flushes the timeline */
  double ts[NP];
  starts(ts);
  int same = ts[0] == ts[1] && ts[2] == ts[3];
  int apart = ts[1] != ts[2] && ts[3] != ts[4];
  if (rank == 0 && !(same && apart))
    diag("starts: %.3f %.3f %.3f %.3f %.3f", ts[0], ts[1], ts[2], ts[3],
         ts[4]);
  ok(good, "handed over one at a time: the step works");
  ok(rank != 0 || (ts[0] > 0 && same),
     "each group's members start their allreduce together");
  ok(rank != 0 || apart, "  the groups and the lone parameter apart");
  unlink(tl_path);
  unsetenv("HVD_TIMELINE");
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init again: %s", hvd_last_error());
}

static void test_twice(void) {
  static const int ids[NP] = {0, 0, 1, 1, -1};
  cfg_t c = {"twice", HVD_FLOAT32, 0, ids, 1, 0, 0, 0};
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = make_opt(&m, &c, 1, NULL);
  hvd_optimizer_zero_grad(opt);
  hvd_optimizer_grad_ready(opt, 0);
  hvdt_refused(HVD_ERR_INVALID_ARG, hvd_optimizer_grad_ready(opt, 0),
               "hvd_optimizer_grad_ready: the gradient of parameter 0 ('g0') "
               "is already being reduced (backward_passes_per_step 1; call "
               "hvd_optimizer_step first)",
               "a gradient handed over twice while its group waits");
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "  the step then works");
  hvd_optimizer_destroy(opt);
}

/* FNV-1a as hvd computes a group's id (its last 4 hex digits). */
static unsigned group_tag(int n, const char *const *names) {
  unsigned long long h = 1469598103934665603ull;
  for (int i = 0; i < n; i++)
    for (const unsigned char *p = (const unsigned char *)names[i];; p++) {
      h = (h ^ *p) * 1099511628211ull;
      if (*p == '\0')
        break;
    }
  return (unsigned)(h & 0xffff);
}

static void test_differ(void) {
  if (size < 2)
    return;
  cfg_t c = {"differ", HVD_FLOAT32, rank == 0 ? 2 : 0, NULL, 1, 0, 0, 0};
  model_t m;
  make(&m, HVD_FLOAT32);
  hvd_optimizer_t *opt = make_opt(&m, &c, 1, NULL);
  hvd_optimizer_zero_grad(opt);
  for (int k = 0; k < NP; k++)
    set_grads(&m, k, 0, 0);
  hvd_result_t rc = hvd_optimizer_step(opt);
  char got[1024];
  snprintf(got, sizeof got, "%s", hvd_last_error());
  /* the first failure waited for: the last parameter, member 2 of rank
   * 0's second group {g3, g4} */
  const char *g2[2] = {"hvd.grad.g3", "hvd.grad.g4"};
  char want[1024];
  size_t at = (size_t)snprintf(want, sizeof want,
                               "allreduce 'hvd.grad.g4': rank 0 group 2 of 2 "
                               "(#%04x) vs",
                               group_tag(2, g2));
  for (int q = 1; q < size; q++)
    at += (size_t)snprintf(want + at, sizeof want - at, "%s rank %d group none",
                           q > 1 ? "," : "", q);
  snprintf(want + at, sizeof want - at,
           " (the ranks' distributed optimizers differ in num_groups or "
           "groups)");
  is_int(HVD_ERR_MISMATCH, rc, "rank 0 groups, the others not: the step fails");
  is_string(want, got, "  naming the group field and the options");
  hvd_optimizer_destroy(opt);
}

static void refused(hvd_distributed_options_t *o, hvd_dtype_t dt,
                    hvd_result_t code, const char *msg, const char *what) {
  model_t m;
  make(&m, dt);
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_sgd_create(m.p, NP, &so, &base) != HVD_SUCCESS)
    bail("sgd: %s", hvd_last_error());
  hvdt_refused(code, hvd_distributed_optimizer(base, o, &opt), msg, what);
  hvd_optimizer_destroy(opt != NULL ? opt : base);
}

static void test_refusals(void) {
  static const int bad[NP] = {0, -2, 0, 1, 1};
  static const int ok_ids[NP] = {0, 0, 1, 1, 1};
  hvd_distributed_options_t o;
  hvd_distributed_options_init(&o);
  o.num_groups = -1;
  refused(&o, HVD_FLOAT32, HVD_ERR_INVALID_ARG,
          "hvd_distributed_optimizer: num_groups -1 is below 0",
          "num_groups -1");
  o.num_groups = 2;
  o.groups = ok_ids;
  refused(&o, HVD_FLOAT32, HVD_ERR_INVALID_ARG,
          "hvd_distributed_optimizer: num_groups and groups are both set; "
          "set one",
          "num_groups and groups");
  o.num_groups = 0;
  o.groups = bad;
  refused(&o, HVD_FLOAT32, HVD_ERR_INVALID_ARG,
          "hvd_distributed_optimizer: groups[1] (parameter 'g1') is -2; a "
          "group is 0 or more, or -1 for none",
          "an id below -1");
  o.groups = NULL;
  o.num_groups = 2;
  o.shard_optimizer_state = 1;
  refused(&o, HVD_FLOAT32, HVD_ERR_UNSUPPORTED,
          "hvd_distributed_optimizer: groups: not with shard_optimizer_state "
          "(ZeRO-1 reduce-scatters each gradient)",
          "with ZeRO-1");
  o.shard_optimizer_state = 0;
  o.compression = HVD_COMPRESS_POWERSGD;
  refused(&o, HVD_FLOAT32, HVD_ERR_UNSUPPORTED,
          "hvd_distributed_optimizer: groups: not with compression powersgd "
          "(its own two rounds)",
          "with PowerSGD");
  o.compression = HVD_COMPRESS_NONE;
  o.op = HVD_ADASUM;
  refused(&o, HVD_FLOAT32, HVD_ERR_UNSUPPORTED,
          "hvd_distributed_optimizer: groups: not with op adasum (whole "
          "gradients, one by one)",
          "with Adasum");
  o.op = HVD_AVERAGE;
  o.compression = HVD_COMPRESS_FP16;
  refused(&o, HVD_BFLOAT16, HVD_ERR_UNSUPPORTED,
          "hvd_distributed_optimizer: groups with compression need float32 "
          "gradients (set reduce_fp32); parameter 'g0' has bfloat16",
          "compression with bfloat16 gradients");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  snprintf(tl_path, sizeof tl_path, "/tmp/hvd-optim-groups-%d-timeline.json",
           (int)getppid());
  setenv("HVD_TIMELINE", tl_path, 1);
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_one_call();
  hvd_process_set_t *lgroup = NULL; /* local SGD's: ranks of one parity */
  if (hvd_process_set_split(rank % 2, &lgroup) != HVD_SUCCESS)
    bail("split: %s", hvd_last_error());
  test_values(lgroup);
  test_twice();
  test_differ();
  test_refusals();
  hvd_process_set_destroy(lgroup);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
