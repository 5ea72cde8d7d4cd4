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
 *  - Two sets of every rank (so world rank 0 writes for both) saving one
 *    path (under any spelling: dir/./name is dir/name): a save of the
 *    path while another is under way in the process
 *    (set A's background save, not waited for) is refused on every rank
 *    of its set (HVD_ERR_INVALID_ARG, "...: a save of this path is under
 *    way in this process ..."); A's file is whole, and after A's wait B
 *    saves. Then both sets save 3 times at once from two threads: each
 *    save succeeds or is refused with that message, and the file loads
 *    whole, one thread's values, no temporary file left.
 *    Before, both wrote "<path>.tmp.<pid>", deleting and renaming each
 *    other's: saves failed with HVD_ERR_IO, and a reported success could
 *    be another save's half-written file.
 */
#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
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

/* One set's saver: its model (values fill), optimizer, results. */
typedef struct saver {
  model_t m;
  hvd_process_set_t *set;
  hvd_optimizer_t *opt;
  int64_t step;
  int saves;          /* how many */
  hvd_result_t rc[3]; /* each save's */
  char msg[3][1400];
} saver_t;

static void saver_make(saver_t *v, float fill, int64_t step) {
  memset(v, 0, sizeof *v);
  make(&v->m, fill);
  v->set = set_of_all();
  v->opt = sgd_on(&v->m, v->set);
  v->step = step;
}

static void saver_free(saver_t *v) {
  hvd_optimizer_destroy(v->opt);
  hvd_process_set_destroy(v->set);
}

static char same_path[1100];

static void *saver_run(void *arg) {
  saver_t *v = arg;
  for (int k = 0; k < v->saves; k++) {
    v->rc[k] = hvd_checkpoint_save(same_path, &v->m.p, 1, v->opt, v->step);
    snprintf(v->msg[k], sizeof v->msg[k], "%s",
             v->rc[k] != HVD_SUCCESS ? hvd_last_error() : "");
  }
  return NULL;
}

/* Entries of dir whose name has ".tmp." (rank 0's count, everywhere). */
static long long temp_files(void) {
  long long count = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d != NULL && (e = readdir(d)) != NULL)
    count += strstr(e->d_name, ".tmp.") != NULL;
  if (d != NULL)
    closedir(d);
  return root_ll(count);
}

/* The file at same_path holds one saver's values whole: its step. */
static int64_t loaded_step(const saver_t *a, const saver_t *b) {
  model_t x;
  make(&x, -9);
  int64_t step = -1;
  if (hvd_checkpoint_load(same_path, &x.p, 1, NULL, &step) != HVD_SUCCESS)
    return -2;
  const saver_t *v = step == a->step ? a : b;
  return memcmp(x.w, v->m.w, sizeof x.w) == 0 ? step : -3;
}

/* Set B saves the path while set A's background save of it is not
 * waited for: refused with the path's message (not the one of a save in
 * flight, which a save of another path gets); after the wait it saves. */
static void refused_while_held(saver_t *a, saver_t *b, const char *refusal) {
  hvd_checkpoint_request_t *q = NULL;
  is_int(HVD_SUCCESS,
         hvd_checkpoint_save_async(same_path, &a->m.p, 1, a->opt, a->step, &q),
         "set A's background save of the path");
  hvd_result_t rc =
      hvd_checkpoint_save(same_path, &b->m.p, 1, b->opt, b->step);
  is_int(HVD_ERR_INVALID_ARG, rc, "... set B's save of it meanwhile");
  is_string(refusal, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... is refused on every rank, saying why");
  char alt[1200], also[1600]; /* the path spelt otherwise: the same file */
  const char *slash = strrchr(same_path, '/');
  snprintf(alt, sizeof alt, "%.*s/./%s", (int)(slash - same_path), same_path,
           slash + 1);
  snprintf(also, sizeof also,
           "hvd_checkpoint_save: '%s': a save of this path is under way in "
           "this process (a background save not waited for, or another "
           "process set's: give each set its own path)",
           alt);
  rc = hvd_checkpoint_save(alt, &b->m.p, 1, b->opt, b->step);
  is_int(HVD_ERR_INVALID_ARG, rc, "... and of it spelt '..././same.ckpt'");
  is_string(also, rc != HVD_SUCCESS ? hvd_last_error() : "",
            "... is refused alike");
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(q), "... A's wait succeeds");
  is_int(a->step, loaded_step(a, b), "... the file is A's, whole");
  is_int(HVD_SUCCESS,
         hvd_checkpoint_save(same_path, &b->m.p, 1, b->opt, b->step),
         "... after it, B saves the path");
  is_int(b->step, loaded_step(a, b), "... the file is B's");
}

/* Two sets of every rank save one path from two threads. */
static void same_path_two_sets(void) {
  char refusal[1400];
  snprintf(same_path, sizeof same_path, "%s/same.ckpt", dir);
  snprintf(refusal, sizeof refusal,
           "hvd_checkpoint_save: '%s': a save of this path is under way in "
           "this process (a background save not waited for, or another "
           "process set's: give each set its own path)",
           same_path);
  saver_t a, b;
  saver_make(&a, 1, 11);
  saver_make(&b, 2, 22);
  refused_while_held(&a, &b, refusal);
  pthread_t ta, tb;
  a.saves = b.saves = 3;
  pthread_create(&ta, NULL, saver_run, &a);
  pthread_create(&tb, NULL, saver_run, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  int good = 1, done = 0;
  for (int k = 0; k < 3; k++)
    for (int s = 0; s < 2; s++) {
      const saver_t *v = s == 0 ? &a : &b;
      done += v->rc[k] == HVD_SUCCESS;
      good &= v->rc[k] == HVD_SUCCESS ||
              (v->rc[k] == HVD_ERR_INVALID_ARG &&
               strcmp(v->msg[k], refusal) == 0);
    }
  ok(good && done > 0, "two sets saving at once: each save succeeds or is "
                       "refused, saying why (%d of 6 saved)",
     done);
  int64_t step = loaded_step(&a, &b);
  ok(step == a.step || step == b.step, "... the file is one of them, whole");
  is_int(0, temp_files(), "... no temporary file is left");
  saver_free(&a);
  saver_free(&b);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  size = hvd_size();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-ckpt-sets");
  wait_after_destroy();
  same_path_two_sets();
  hvdt_remove_tmpdir(dir);
  hvd_shutdown();
  return tap_mpi_finish();
}
