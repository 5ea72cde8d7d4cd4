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
 *  - Two sets of every rank, each with its own momentum SGD over a model
 *    of its own size, save two paths in the background from two threads
 *    (round 0: set B's save starts once set A's returned, its write in
 *    flight; rounds 1-3: both at once), then each thread waits for its
 *    own: every save and wait succeeds, and each file is byte for byte
 *    its own set's synchronous save of the same state (values, momentum,
 *    step) and loads back as its values. Before, one background save not
 *    waited for refused every other in the process, whatever its set
 *    ("...: the background save of '.../ta.ckpt' is not waited for
 *    yet"), and two that passed that check at once shared rank 0's one
 *    staging buffer: one save's bytes written into the other's file
 *    (ckpt_overlap.sh holds set A's write up 2 s so that set B's copy is
 *    made meanwhile, every time). `ckpt_sets overlap` runs this part
 *    only.
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

/* ---- two sets' background saves of two paths, at once ---- */

/* A set's model of len floats with momentum SGD on it, and what its
 * thread's save and wait returned. */
typedef struct big {
  float *w, *g;
  int64_t len;
  hvd_param_t p;
  hvd_process_set_t *set;
  hvd_optimizer_t *opt;
  char path[1100], ref[1100];
  int64_t step;
  struct gate *after; /* start once it is open (NULL: at once) */
  struct gate *opens; /* opened once the save returned (or NULL) */
  hvd_result_t save_rc, wait_rc;
  char msg[1400];
} big_t;

/* A one-shot signal between the two threads of a process. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate_t;

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_pass(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  while (!g->open)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void big_make(big_t *v, int64_t len, const char *name) {
  hvd_sgd_options_t so;
  hvd_distributed_options_t o;
  hvd_optimizer_t *base = NULL;
  memset(v, 0, sizeof *v);
  v->len = len;
  v->w = hvdt_calloc((size_t)len, sizeof *v->w);
  v->g = hvdt_calloc((size_t)len, sizeof *v->g);
  v->p.name = "w";
  v->p.value = hvd_tensor_make(v->w, HVD_FLOAT32, 1, &v->len);
  v->p.grad = hvd_tensor_make(v->g, HVD_FLOAT32, 1, &v->len);
  v->set = set_of_all();
  hvd_sgd_options_init(&so);
  so.momentum = 0.9;
  hvd_distributed_options_init(&o);
  o.process_set = v->set;
  if (hvd_sgd_create(&v->p, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &o, &v->opt) != HVD_SUCCESS)
    bail("the optimizer: %s", hvd_last_error());
  snprintf(v->path, sizeof v->path, "%s/%s.ckpt", dir, name);
  snprintf(v->ref, sizeof v->ref, "%s/%s.ref", dir, name);
}

static void big_free(big_t *v) {
  hvd_optimizer_destroy(v->opt);
  hvd_process_set_destroy(v->set);
  free(v->w);
  free(v->g);
}

/* Round r's state: a step from gradients of r (momentum changes), then
 * values of r and step r * 10 + seed; 1 if the step succeeded. */
static int big_round(big_t *v, int r, int seed) {
  int good = hvd_optimizer_zero_grad(v->opt) == HVD_SUCCESS;
  for (int64_t i = 0; i < v->len; i++)
    v->g[i] = (float)((i * 7 + r * 3 + seed) % 23) / 8;
  good = good && hvd_optimizer_step(v->opt) == HVD_SUCCESS;
  for (int64_t i = 0; i < v->len; i++)
    v->w[i] = (float)((i * 5 + r + seed) % 37) / 4 + (float)seed;
  v->step = r * 10 + seed;
  return good;
}

static void *big_run(void *arg) {
  big_t *v = arg;
  hvd_checkpoint_request_t *q = NULL;
  if (v->after != NULL)
    gate_pass(v->after);
  v->save_rc =
      hvd_checkpoint_save_async(v->path, &v->p, 1, v->opt, v->step, &q);
  snprintf(v->msg, sizeof v->msg, "%s",
           v->save_rc != HVD_SUCCESS ? hvd_last_error() : "");
  if (v->opens != NULL)
    gate_open(v->opens);
  v->wait_rc = hvd_checkpoint_wait(q);
  if (v->wait_rc != HVD_SUCCESS)
    snprintf(v->msg, sizeof v->msg, "%s", hvd_last_error());
  return NULL;
}

/* v's file after its thread: saved, and its own state whole (its set's
 * synchronous save of the same state, byte for byte; loaded back, its
 * values and step). */
static void big_check(big_t *v, const char *what, int r) {
  is_int(HVD_SUCCESS, v->save_rc, "round %d: %s's background save", r, what);
  is_int(HVD_SUCCESS, v->wait_rc, "... and its wait");
  is_string("", v->msg, "... with no message");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(v->ref, &v->p, 1, v->opt, v->step),
         "... %s's synchronous save of the same state", what);
  ok(root_ll(rank != 0 || hvdt_same_file(v->path, v->ref)),
     "... the background file is it, byte for byte (values, momentum, "
     "step)");
  float *x = hvdt_calloc((size_t)v->len, sizeof *x);
  hvd_param_t p = v->p;
  p.value = hvd_tensor_make(x, HVD_FLOAT32, 1, &v->len);
  int64_t step = -1;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(v->path, &p, 1, NULL, &step),
         "... it loads");
  ok(memcmp(x, v->w, (size_t)v->len * sizeof *x) == 0 && step == v->step,
     "... as %s's values and step %lld", what, (long long)v->step);
  free(x);
}

/* Sets A and B, each with its own optimizer, save two paths from two
 * threads: round 0 B once A's save returned (A's write in flight), then
 * both at once. */
static void two_paths_two_sets(void) {
  big_t a, b;
  big_make(&a, 100003, "ta");
  big_make(&b, 150001, "tb"); /* bigger: a copy that would outgrow A's */
  for (int r = 0; r < 4; r++) {
    gate_t g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    ok(big_round(&a, r, 1) && big_round(&b, r, 2),
       "round %d: a step of each set's optimizer", r);
    a.opens = r == 0 ? &g : NULL;
    b.after = r == 0 ? &g : NULL;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, big_run, &a);
    pthread_create(&tb, NULL, big_run, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    big_check(&a, "set A", r);
    big_check(&b, "set B", r);
  }
  is_int(0, temp_files(), "no temporary file is left");
  big_free(&a);
  big_free(&b);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  rank = hvd_rank();
  size = hvd_size();
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-ckpt-sets");
  int only_overlap = argc > 1 && strcmp(argv[1], "overlap") == 0;
  if (!only_overlap) {
    wait_after_destroy();
    same_path_two_sets();
  }
  two_paths_two_sets();
  hvdt_remove_tmpdir(dir);
  hvd_shutdown();
  return tap_mpi_finish();
}
