/*
 * ckpt_sets.c - checkpoints of a distributed optimizer on a process set
 * that outlive the set, or that share a writing process; np 1..4.
 *
 *  - A background save (hvd_checkpoint_save_async) of an optimizer on a
 *    set of every rank, the optimizer and the set destroyed before
 *    hvd_checkpoint_wait: the wait returns each rank's own result, as
 *    after hvd_shutdown (the set's collectives are gone): the write's on
 *    rank 0, which the file then holds (it loads: the values and the
 *    step), HVD_SUCCESS on the others; a write that failed (a missing
 *    directory) is rank 0's HVD_ERR_IO with its message, and the others'
 *    HVD_SUCCESS. Before, the wait agreed within the freed set (a
 *    garbage set id in its message, or a crash).
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LEN 6
static int rank, size;
static char dir[1024];

typedef struct model {
  float w[LEN], g[LEN];
  int64_t len;
  hvd_param_t p;
} model_t;

static void make(model_t *m, float fill) {
  memset(m, 0, sizeof *m);
  m->len = LEN;
  for (int i = 0; i < LEN; i++)
    m->w[i] = fill + (float)i / 4;
  m->p.name = "w";
  m->p.value = hvd_tensor_make(m->w, HVD_FLOAT32, 1, &m->len);
  m->p.grad = hvd_tensor_make(m->g, HVD_FLOAT32, 1, &m->len);
}

/* A set of every rank. */
static hvd_process_set_t *set_of_all(void) {
  int all[4] = {0, 1, 2, 3};
  hvd_process_set_t *s = NULL;
  if (hvd_process_set_create(all, size, &s) != HVD_SUCCESS)
    bail("hvd_process_set_create: %s", hvd_last_error());
  return s;
}

/* Distributed SGD over m on set s. */
static hvd_optimizer_t *sgd_on(model_t *m, hvd_process_set_t *s) {
  hvd_sgd_options_t so;
  hvd_distributed_options_t o;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_sgd_options_init(&so);
  hvd_distributed_options_init(&o);
  o.process_set = s;
  if (hvd_sgd_create(&m->p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &opt) != HVD_SUCCESS)
    bail("the optimizer: %s", hvd_last_error());
  return opt;
}

static long long root_ll(long long v) {
  int64_t one = 1, x = v;
  hvd_tensor_t t = hvd_tensor_make(&x, HVD_INT64, 1, &one);
  if (hvd_broadcast("root_ll", &t, 0) != HVD_SUCCESS)
    bail("%s", hvd_last_error());
  return x;
}

/* A background save whose set is destroyed before the wait. */
static void wait_after_destroy(void) {
  char path[1100], bad[1100], want[2600];
  snprintf(path, sizeof path, "%s/a.ckpt", dir);
  snprintf(bad, sizeof bad, "%s/no/such/dir.ckpt", dir);
  model_t m, x;
  make(&m, 1);
  hvd_process_set_t *s = set_of_all();
  hvd_optimizer_t *opt = sgd_on(&m, s);
  hvd_checkpoint_request_t *q = NULL;
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(path, &m.p, 1, opt, 42, &q),
         "save_async of an optimizer on a set");
  hvd_optimizer_destroy(opt);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(s), "... the set destroyed");
  hvd_result_t rc = hvd_checkpoint_wait(q);
  is_int(HVD_SUCCESS, rc, "... the wait returns each rank's own result");
  is_string("", rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... with no message");
  make(&x, -5);
  int64_t step = -1;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, &x.p, 1, NULL, &step),
         "... the file loads");
  ok(memcmp(x.w, m.w, sizeof m.w) == 0 && step == 42,
     "... the values and step 42 saved");

  /* a write that fails: rank 0's own failure, the others' success */
  s = set_of_all();
  opt = sgd_on(&m, s);
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(bad, &m.p, 1, opt, 7, &q),
         "save_async into a missing directory");
  hvd_optimizer_destroy(opt);
  hvd_process_set_destroy(s);
  snprintf(want, sizeof want,
           "hvd_checkpoint_save_async: '%s': cannot create '%s.tmp.%lld': %s",
           bad, bad, root_ll(getpid()), strerror(ENOENT));
  rc = hvd_checkpoint_wait(q);
  is_int(rank == 0 ? HVD_ERR_IO : HVD_SUCCESS, rc,
         "... the wait after the set's destroy: rank 0's failure on rank 0 "
         "only");
  is_string(rank == 0 ? want : "", rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... with its message");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, &m.p, 1, NULL, 8),
         "... after which saves go on");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  size = hvd_size();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-ckpt-sets");
  wait_after_destroy();
  hvdt_remove_tmpdir(dir);
  hvd_shutdown();
  return tap_mpi_finish();
}
