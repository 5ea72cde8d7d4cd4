/*
 * checkpoint.c - hvd_checkpoint_save / hvd_checkpoint_load.
 *
 * Without arguments (t/mpi/checkpoint.npN, N = 1..3):
 *  - before hvd_init both calls fail with HVD_ERR_NOT_INITIALIZED;
 *  - save and resume: 10 AdamW steps through a distributed optimizer,
 *    against 5 steps, save, a new optimizer (other lr) and a scrambled
 *    model, load, 5 more steps: the same bits (values, and the two final
 *    checkpoints byte for byte: state, lr, step count);
 *  - a file saved without an optimizer, loads with opt NULL and step NULL;
 *  - every way a load can fail, each with its exact message and result on
 *    every rank, and the model, optimizer state, lr, steps and step
 *    untouched on every rank: truncated (inside the header, in the data),
 *    one byte flipped, bad magic, another version, a missing file, a
 *    directory, a FIFO no one writes (refused at once, not waited on),
 *    another parameter name / shape / dtype / count, another
 *    optimizer (type, state count, state names), no optimizer state;
 *  - save: an argument error on one rank fails on every rank with that
 *    rank's message; an unwritable path and a path that is a directory
 *    fail with HVD_ERR_IO on every rank and leave no temporary file; a
 *    stray "<path>.tmp.<pid>" of a crashed save breaks nothing and is left
 *    alone (it may be a live save's);
 *  - save_async: the file is the synchronous save's byte for byte though
 *    the model, state and lr changed right after the call; any save
 *    before the wait is refused on every rank with its message; an
 *    argument error on one rank, and out NULL, fail the call on every
 *    rank; a write that fails (a missing directory) fails the wait with
 *    HVD_ERR_IO on every rank, naming the file; a wait after
 *    hvd_shutdown finishes the file;
 *  - a load of a 72 MiB file holds less than 24 MiB more on a rank other
 *    than 0, 32 MiB on rank 0; opt NULL on one rank only fails on every
 *    rank;
 *  - a new file's mode is 0666 less the umask; a save over a file of mode
 *    0600 keeps 0600 (it once took the umask's, readable by all).
 *
 * Modes for t/mpi/checkpoint.sh and checkpoint_crash.sh (any rank count):
 *   checkpoint save PATH K   K plain AdamW steps, then save at step K
 *   checkpoint save-async PATH K  the same with hvd_checkpoint_save_async,
 *                            never waited for (the exit finishes it)
 *   checkpoint load PATH K   load into a scrambled model behind a
 *                            distributed optimizer and check, on every
 *                            rank, the bits of K local AdamW steps
 *   checkpoint zero-memory PATH 0  a load into a sharded optimizer holds
 *                            no full state (mode_zero_memory)
 *   checkpoint zero-mixed-memory PATH 0  nor, with mixed precision, a
 *                            whole master (mode_zero_mixed_memory)
 *   checkpoint zero-save-memory PATH 0  a sharded save holds one
 *                            parameter's full state on rank 0
 *                            (mode_zero_save_memory)
 * Only rank 0 touches files; the others get the same path.
 */
#include "base/half.h" /* bfloat16 values */
#include "hvd.h"
#include "hvdtest.h"
#include "optim/optimizer.h" /* the state tensors, to compare their bytes */
#include "tap.h"

#include <dirent.h>
#include <errno.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the model ----------------------------------------------------------- */

#define NP 6

typedef struct model {
  hvd_param_t p[NP];
  float *buf[2 * NP];
} model_t;

static const char *const names[NP] = {
    "encoder.layer.0.weight", "encoder.layer.0.bias",   "head.weight", "scale",
    "buffers.empty",          "decoder.out.proj.weight"};
static const int ndims[NP] = {2, 1, 2, 0, 2, 3};
static const int64_t shapes[NP][3] = {{8, 4}, {8},    {3, 8},
                                      {0},    {0, 5}, {2, 3, 4}};

/* Values that depend on `seed` only (the same on every rank). */
static void model_fill(model_t *m, int seed) {
  for (int i = 0; i < NP; i++) {
    int64_t k = hvd_tensor_numel(&m->p[i].value);
    for (int64_t j = 0; j < k; j++)
      m->buf[2 * i][j] = (float)((i * 31 + j * 17 + seed * 7) % 23 - 11) / 8;
  }
}

static void model_init(model_t *m, int seed) {
  for (int i = 0; i < NP; i++) {
    hvd_param_t *p = &m->p[i];
    p->name = names[i];
    p->value = hvd_tensor_make(NULL, HVD_FLOAT32, ndims[i], shapes[i]);
    p->grad = p->value;
    int64_t k = hvd_tensor_numel(&p->value);
    m->buf[2 * i] = calloc((size_t)k + 1, sizeof(float));
    m->buf[2 * i + 1] = calloc((size_t)k + 1, sizeof(float));
    p->value.data = m->buf[2 * i];
    p->grad.data = m->buf[2 * i + 1];
  }
  model_fill(m, seed);
}

static void model_free(model_t *m) {
  for (int i = 0; i < 2 * NP; i++)
    free(m->buf[i]);
}

/* One training step: grad = value - target (0.5 |value - target|^2). */
static int train(model_t *m, hvd_optimizer_t *opt, int steps) {
  for (int s = 0; s < steps; s++) {
    if (hvd_optimizer_zero_grad(opt) != HVD_SUCCESS)
      return 0;
    for (int i = 0; i < NP; i++) {
      int64_t k = hvd_tensor_numel(&m->p[i].value);
      float *v = m->p[i].value.data, *g = m->p[i].grad.data;
      for (int64_t j = 0; j < k; j++)
        g[j] += v[j] - (float)((j * 5 + i) % 7) / 4;
    }
    if (hvd_optimizer_step(opt) != HVD_SUCCESS)
      return 0;
  }
  return 1;
}

static hvd_optimizer_t *adamw(model_t *m, double lr, int distributed) {
  hvd_adam_options_t o;
  hvd_adam_options_init(&o);
  o.lr = lr;
  o.decoupled = 1;
  o.weight_decay = 0.01;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_adam_create(m->p, NP, &o, &base) != HVD_SUCCESS)
    bail("hvd_adam_create: %s", hvd_last_error());
  if (!distributed)
    return base;
  if (hvd_distributed_optimizer(base, NULL, &opt) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  return opt;
}

/* Everything a load may change, as bytes: values, state, lr, steps, step. */
typedef struct snap {
  unsigned char *b;
  size_t n;
} snap_t;

static void snap_add(snap_t *s, const void *p, size_t k) {
  s->b = realloc(s->b, s->n + k + 1);
  memcpy(s->b + s->n, p, k);
  s->n += k;
}

static snap_t snapshot(const hvd_param_t *p, int n, hvd_optimizer_t *opt,
                       int64_t step) {
  snap_t s = {NULL, 0};
  for (int i = 0; i < n; i++)
    snap_add(&s, p[i].value.data,
             (size_t)hvd_tensor_numel(&p[i].value) *
                 hvd_dtype_size(p[i].value.dtype));
  if (opt != NULL) {
    /* hvd__optim_core(), which libhvd does not export */
    const hvd_optimizer_t *c = opt->base ? opt->base : opt;
    for (int i = 0; i < c->n * c->ops.nstate; i++)
      snap_add(&s, c->state[i].data,
               (size_t)hvd_tensor_numel(&c->state[i]) * sizeof(float));
    snap_add(&s, &c->lr, sizeof c->lr);
    snap_add(&s, &c->steps, sizeof c->steps);
  }
  snap_add(&s, &step, sizeof step);
  return s;
}

static int snap_same(const snap_t *a, const snap_t *b) {
  return a->n == b->n && memcmp(a->b, b->b, a->n) == 0;
}

/* ---- files (rank 0) ------------------------------------------------------ */

static int rank;
static char dir[1024];

/* dir/name, in one of 4 rotating buffers (copy what must live longer). */
static char *at(const char *name) {
  static char path[4][1200];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, sizeof path[0], "%s/%s", dir, name);
  return p;
}

/* Number of entries of dir whose name contains ".tmp." (rank 0). */
static int temp_files(void) {
  int count = 0;
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d != NULL && (e = readdir(d)) != NULL)
    count += strstr(e->d_name, ".tmp.") != NULL;
  if (d != NULL)
    closedir(d);
  return count;
}

static long long root_ll(long long v) {
  MPI_Bcast(&v, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  return v;
}

/* What every rank is told of a save into bad, a path in a missing
 * directory: rank 0's message, with rank 0's pid (*pid0). Collective. */
static void missing_dir_msg(char *out, size_t n, const char *bad,
                            pid_t *pid0) {
  *pid0 = (pid_t)root_ll(getpid());
  snprintf(out, n,
           "hvd_checkpoint_save: '%s': cannot create '%s.tmp.%ld': No such "
           "file or directory",
           bad, bad, (long)*pid0);
}

/* ---- loads that must fail ------------------------------------------------ */

/* Loads path into (p, n, opt) and checks the result, the exact message
 * and that nothing changed, on every rank. */
static void load_fails(const char *what, const char *path, hvd_param_t *p,
                       int n, hvd_optimizer_t *opt, hvd_result_t want,
                       const char *msg) {
  int64_t step = -77;
  snap_t before = snapshot(p, n, opt, step);
  hvd_result_t rc = hvd_checkpoint_load(path, p, n, opt, &step);
  snap_t after = snapshot(p, n, opt, step);
  is_int(want, rc, "%s: %s", what, hvd_strerror(want));
  is_string(msg, hvd_last_error(), "%s: the message", what);
  ok(snap_same(&before, &after),
     "%s: model, state, lr, steps and step untouched", what);
  free(before.b);
  free(after.b);
}

/* "<fn>: '<path>': <tail>" (one buffer). */
static const char *amsg(const char *fn, const char *path, const char *tail) {
  static char buf[8192];
  snprintf(buf, sizeof buf, "%s: '%s': %s", fn, path, tail);
  return buf;
}

/* "hvd_checkpoint_load: '<path>': <tail>" */
static const char *lmsg(const char *path, const char *tail) {
  return amsg("hvd_checkpoint_load", path, tail);
}

static hvd_result_t toy_step(void *ctx, hvd_param_t *p, int n, hvd_tensor_t *s,
                             int64_t step, double lr) {
  (void)ctx, (void)p, (void)n, (void)s, (void)step, (void)lr;
  return HVD_SUCCESS;
}

static void failures(void) {
  model_t m, x;
  model_init(&m, 1);
  hvd_optimizer_t *opt = adamw(&m, 0.01, 0);
  ok(train(&m, opt, 3), "train 3 steps");
  char good[1200];
  snprintf(good, sizeof good, "%s", at("good.ckpt"));
  is_int(HVD_SUCCESS, hvd_checkpoint_save(good, m.p, NP, opt, 3), "save");
  hvd_optimizer_destroy(opt);

  /* the victim: other values, a fresh optimizer with another lr */
  model_init(&x, 2);
  opt = adamw(&x, 0.5, 1);
  size_t size = 0;
  unsigned char *img = rank == 0 ? hvdt_read_bytes(good, &size) : NULL;
  long long full = root_ll((long long)size);
  char tail[4096], path[1300];

  /* truncated in the data, and inside the header */
  if (rank == 0)
    hvdt_write_bytes(at("short.ckpt"), img, size - 100);
  snprintf(tail, sizeof tail, "truncated (read %lld of %lld bytes)", full - 100,
           full);
  load_fails("truncated", at("short.ckpt"), x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(at("short.ckpt"), tail));
  if (rank == 0)
    hvdt_write_bytes(at("tiny.ckpt"), img, 20);
  load_fails("truncated in the header", at("tiny.ckpt"), x.p, NP, opt,
             HVD_ERR_CORRUPT,
             lmsg(at("tiny.ckpt"), "truncated (read 20 of at least 44 bytes)"));
  if (rank == 0)
    hvdt_write_bytes(at("empty.ckpt"), img, 0);
  load_fails("empty file", at("empty.ckpt"), x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(at("empty.ckpt"), "truncated (read 0 of at least 44 bytes)"));

  /* one byte flipped in the data; bad magic; another version */
  if (rank == 0) {
    img[size / 2] ^= 0x10;
    hvdt_write_bytes(at("flip.ckpt"), img, size);
    img[size / 2] ^= 0x10;
  }
  load_fails("one byte flipped", at("flip.ckpt"), x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(at("flip.ckpt"), "checksum mismatch (file corrupt)"));
  if (rank == 0) {
    img[0] = 'X';
    hvdt_write_bytes(at("magic.ckpt"), img, size);
    img[0] = 'H';
    hvdt_write_bytes(at("text.ckpt"), "hello, world\n", 13);
  }
  load_fails("bad magic", at("magic.ckpt"), x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(at("magic.ckpt"), "not an hvd checkpoint (bad magic)"));
  load_fails("a text file", at("text.ckpt"), x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(at("text.ckpt"), "not an hvd checkpoint (bad magic)"));
  if (rank == 0) {
    unsigned char version = img[8];
    img[8] = 6;
    hvdt_write_bytes(at("v6.ckpt"), img, size);
    img[8] = version;
  }
  load_fails("version 6", at("v6.ckpt"), x.p, NP, opt, HVD_ERR_UNSUPPORTED,
             lmsg(at("v6.ckpt"), "format version 6 is not supported (this "
                                 "hvd reads versions 1 to 5)"));

  /* no file; a directory */
  load_fails("missing file", at("nothing.ckpt"), x.p, NP, opt, HVD_ERR_IO,
             lmsg(at("nothing.ckpt"), "cannot open: No such file or "
                                      "directory"));
  load_fails("a directory", dir, x.p, NP, opt, HVD_ERR_IO,
             lmsg(dir, "not a regular file"));
  /* a FIFO no one writes: refused at once (its open once waited for a
   * writer forever, rank 0 in open and every other rank behind it) */
  if (rank == 0 && mkfifo(at("fifo.ckpt"), 0600) != 0)
    bail("mkfifo %s: %s", at("fifo.ckpt"), strerror(errno));
  load_fails("a FIFO", at("fifo.ckpt"), x.p, NP, opt, HVD_ERR_IO,
             lmsg(at("fifo.ckpt"), "not a regular file"));

  /* the model differs: a name, a shape, a dtype, the count */
  x.p[2].name = "head.w";
  load_fails("another name", good, x.p, NP, opt, HVD_ERR_CORRUPT,
             lmsg(good, "parameter 2 is 'head.weight' in the file but "
                        "'head.w' in the model"));
  x.p[2].name = names[2];
  x.p[2].value.shape[0] = 8, x.p[2].value.shape[1] = 3;
  load_fails("another shape", good, x.p, NP, NULL, HVD_ERR_CORRUPT,
             lmsg(good, "'head.weight' has shape [3, 8] in the file but "
                        "[8, 3] in the model"));
  x.p[2].value.shape[0] = 3, x.p[2].value.shape[1] = 8;
  double d[1] = {0};
  hvd_param_t saved = x.p[3];
  x.p[3].value = hvd_tensor_make(d, HVD_FLOAT64, 0, NULL);
  load_fails("another dtype", good, x.p, NP, NULL, HVD_ERR_CORRUPT,
             lmsg(good, "'scale' has dtype float32 in the file but float64 "
                        "in the model"));
  x.p[3] = saved;
  load_fails("one parameter fewer", good, x.p, NP - 1, NULL, HVD_ERR_CORRUPT,
             lmsg(good, "the file has 6 parameters but the model has 5"));

  /* the optimizer differs */
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.momentum = 0.9;
  hvd_optimizer_t *sgd = NULL;
  hvd_sgd_create(x.p, NP, &so, &sgd);
  load_fails("SGD instead of AdamW", good, x.p, NP, sgd, HVD_ERR_CORRUPT,
             lmsg(good, "optimizer is 'AdamW' in the file but 'SGD' in the "
                        "program"));
  hvd_optimizer_destroy(sgd);
  static const char *const one[] = {"exp_avg"};
  static const char *const two[] = {"exp_avg", "momentum"};
  hvd_optimizer_ops_t ops = {"AdamW", 1, one, toy_step, NULL};
  hvd_optimizer_t *toy = NULL;
  hvd_optimizer_custom(x.p, NP, &ops, NULL, &toy);
  load_fails("another state count", good, x.p, NP, toy, HVD_ERR_CORRUPT,
             lmsg(good, "optimizer 'AdamW' has 2 state tensors per parameter "
                        "in the file but 1 in the program"));
  hvd_optimizer_destroy(toy);
  ops.nstate = 2, ops.state_names = two;
  hvd_optimizer_custom(x.p, NP, &ops, NULL, &toy);
  load_fails("another state name", good, x.p, NP, toy, HVD_ERR_CORRUPT,
             lmsg(good, "optimizer state 1 is 'exp_avg_sq' in the file but "
                        "'momentum' in the program"));
  hvd_optimizer_destroy(toy);

  /* no optimizer state in the file */
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("bare.ckpt"), m.p, NP, NULL, 9),
         "save without an optimizer");
  load_fails("no state in the file", at("bare.ckpt"), x.p, NP, opt,
             HVD_ERR_CORRUPT,
             lmsg(at("bare.ckpt"), "the file has no optimizer state (it was "
                                   "saved without an optimizer)"));

  /* bad arguments */
  load_fails("n -1", good, x.p, -1, NULL, HVD_ERR_INVALID_ARG,
             "hvd_checkpoint_load: params is NULL or n (-1) is negative");
  load_fails("opt over 6 parameters, n 5", good, x.p, NP - 1, opt,
             HVD_ERR_INVALID_ARG,
             "hvd_checkpoint_load: the optimizer has 6 parameters but n is 5");

  /* the state is ignored with opt NULL; step may be NULL */
  is_int(HVD_SUCCESS, hvd_checkpoint_load(good, x.p, NP, NULL, NULL),
         "load with opt NULL and step NULL");
  int same = 1;
  for (int i = 0; i < NP; i++)
    same &= memcmp(x.p[i].value.data, m.p[i].value.data,
                   (size_t)hvd_tensor_numel(&m.p[i].value) * 4) == 0;
  ok(same, "... the values are the saved ones");
  ok(hvd_optimizer_steps(opt) == 0 && hvd_optimizer_lr(opt) == 0.5,
     "... the optimizer is untouched");
  model_fill(&x, 2);
  int64_t step = -1;
  is_int(HVD_SUCCESS,
         hvd_checkpoint_load(at("bare.ckpt"), x.p, NP, NULL, &step),
         "load a file without state, opt NULL");
  is_int(9, step, "... step 9");

  /* saves that fail */
  pid_t pid0;
  snprintf(path, sizeof path, "%s/no/such/dir.ckpt", dir);
  missing_dir_msg(tail, sizeof tail, path, &pid0);
  is_int(HVD_ERR_IO, hvd_checkpoint_save(path, m.p, NP, NULL, 1),
         "save into a missing directory");
  is_string(tail, hvd_last_error(), "... the message");
  if (rank == 0)
    mkdir(at("adir"), 0755);
  snprintf(tail, sizeof tail,
           "hvd_checkpoint_save: '%s': cannot rename '%s.tmp.%ld' over it: "
           "Is a directory",
           at("adir"), at("adir"), (long)pid0);
  is_int(HVD_ERR_IO, hvd_checkpoint_save(at("adir"), m.p, NP, opt, 1),
         "save over a directory");
  is_string(tail, hvd_last_error(), "... the message");
  is_int(0, root_ll(temp_files()), "... no temporary file is left");
  int last = tap_size() - 1;
  hvd_param_t keep = m.p[1];
  if (rank == last)
    m.p[1].name = NULL;
  char want[128] = "hvd_checkpoint_save: parameter 1 has no name";
  if (last != 0) /* the message of a rank other than 0 says which */
    snprintf(want, sizeof want,
             "hvd_checkpoint_save: parameter 1 has no name (on rank %d)", last);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_checkpoint_save(at("args.ckpt"), m.p, NP, NULL, 1),
         "a bad argument on the last rank only");
  is_string(want, hvd_last_error(), "... fails on every rank with its message");
  m.p[1] = keep;
  ok(root_ll(access(at("args.ckpt"), F_OK) == 0) == 0,
     "... and writes nothing");
  is_int(HVD_ERR_INVALID_ARG, hvd_checkpoint_save("", m.p, NP, NULL, 1),
         "save to an empty path");
  is_string("hvd_checkpoint_save: path is NULL or empty", hvd_last_error(),
            "... the message");

  /* a file of our temporary name (a crashed save's, or a live one of
   * another host's process with our pid) breaks nothing, and is left
   * alone: the save takes another name */
  snprintf(path, sizeof path, "%s.tmp.%ld", good, (long)pid0);
  if (rank == 0)
    hvdt_write_bytes(path, "junk", 4);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(good, m.p, NP, NULL, 4),
         "save next to a file of its temporary name (our own pid's)");
  model_fill(&x, 2);
  step = 0;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(good, x.p, NP, NULL, &step),
         "... loads");
  is_int(4, step, "... the new one");
  char *junk = rank == 0 ? hvdt_slurp(path) : NULL;
  ok(root_ll(junk != NULL && strcmp(junk, "junk") == 0),
     "... that file is left as it was");
  free(junk);
  is_int(1, root_ll(temp_files()), "... and no other temporary file");
  if (rank == 0)
    unlink(path);

  if (rank == 0)
    free(img);
  hvd_optimizer_destroy(opt);
  model_free(&m);
  model_free(&x);
}

/* ---- save and resume ----------------------------------------------------- */

static void resume(void) {
  model_t a, b;
  model_init(&a, 3);
  model_init(&b, 3);
  hvd_optimizer_t *oa = adamw(&a, 0.01, 1), *ob = adamw(&b, 0.01, 1);
  ok(train(&a, oa, 10), "uninterrupted: 10 steps");
  ok(train(&b, ob, 5), "interrupted: 5 steps");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("r5.ckpt"), b.p, NP, ob, 5),
         "save after 5");
  hvd_optimizer_destroy(ob);
  model_fill(&b, 8); /* other values */
  ob = adamw(&b, 0.25, 1);
  int64_t step = 0;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(at("r5.ckpt"), b.p, NP, ob, &step),
         "load into a new optimizer");
  is_int(5, step, "... step 5");
  is_int(5, hvd_optimizer_steps(ob), "... 5 optimizer steps");
  ok(hvd_optimizer_lr(ob) == 0.01, "... lr 0.01 (not the new optimizer's)");
  ok(train(&b, ob, 5), "5 more steps");
  int same = 1;
  for (int i = 0; i < NP; i++)
    same &= memcmp(a.p[i].value.data, b.p[i].value.data,
                   (size_t)hvd_tensor_numel(&a.p[i].value) * 4) == 0;
  ok(same, "the values are bit-identical to the uninterrupted run's");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("a10.ckpt"), a.p, NP, oa, 10),
         "save both after 10");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("b10.ckpt"), b.p, NP, ob, 10),
         "...");
  size_t na = 0, nb = 0;
  unsigned char *fa = rank == 0 ? hvdt_read_bytes(at("a10.ckpt"), &na) : NULL;
  unsigned char *fb = rank == 0 ? hvdt_read_bytes(at("b10.ckpt"), &nb) : NULL;
  ok(root_ll(na > 0 && na == nb && memcmp(fa, fb, na) == 0),
     "the two checkpoints are byte-identical (state, lr, steps too)");
  free(fa);
  free(fb);
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  model_free(&a);
  model_free(&b);
}

/* ---- in the background --------------------------------------------------- */

/* hvd_checkpoint_save_async: the file is the synchronous save's byte for
 * byte although the model changed right after the call; saves before the
 * wait are refused; errors of the call and of the write. */
static void background(void) {
  model_t a, b;
  model_init(&a, 4);
  model_init(&b, 4);
  hvd_optimizer_t *oa = adamw(&a, 0.01, 1), *ob = adamw(&b, 0.01, 1);
  ok(train(&a, oa, 5) && train(&b, ob, 5), "two models, 5 steps each");
  hvd_checkpoint_request_t *q = NULL;
  char bg[1200];
  snprintf(bg, sizeof bg, "%s", at("bg5.ckpt"));
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(bg, a.p, NP, oa, 5, &q),
         "save_async after 5");
  ok(q != NULL, "... a request");
  /* the model moves on at once: values, state, lr, steps */
  model_fill(&a, 9);
  ok(train(&a, oa, 2), "... and the model trains on, 2 steps");
  hvd_optimizer_set_lr(oa, 0.5);
  is_int(HVD_ERR_INVALID_ARG,
         hvd_checkpoint_save(at("x.ckpt"), a.p, NP, oa, 7),
         "a save before the wait: refused");
  char want[8192];
  snprintf(want, sizeof want,
           "hvd_checkpoint_save: '%s': the background save of '%s' is not "
           "waited for yet (hvd_checkpoint_wait)",
           at("x.ckpt"), bg);
  is_string(want, hvd_last_error(), "... the message, on every rank");
  hvd_checkpoint_request_t *q2 = (hvd_checkpoint_request_t *)&q2;
  is_int(HVD_ERR_INVALID_ARG,
         hvd_checkpoint_save_async(at("x.ckpt"), a.p, NP, oa, 7, &q2),
         "a second save_async before the wait: refused");
  ok(q2 == NULL, "... no request");
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(q), "wait: the write succeeded");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("fg5.ckpt"), b.p, NP, ob, 5),
         "the synchronous save of the same state");
  size_t na = 0, nb = 0;
  unsigned char *fa = rank == 0 ? hvdt_read_bytes(bg, &na) : NULL;
  unsigned char *fb = rank == 0 ? hvdt_read_bytes(at("fg5.ckpt"), &nb) : NULL;
  ok(root_ll(na > 0 && na == nb && memcmp(fa, fb, na) == 0),
     "the background file is the synchronous one byte for byte (the state "
     "at the call)");
  free(fa);
  free(fb);
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(NULL), "wait(NULL): nothing");

  /* the call's own errors: on every rank, no request */
  q2 = (hvd_checkpoint_request_t *)&q2;
  is_int(HVD_ERR_INVALID_ARG,
         hvd_checkpoint_save_async(bg, a.p, rank == tap_size() - 1 ? -1 : NP,
                                   oa, 7, &q2),
         "n -1 on the last rank: refused on every rank");
  int n = snprintf(want, sizeof want, "hvd_checkpoint_save_async: params "
                                      "is NULL or n (-1) is negative");
  if (tap_size() > 1) /* the lowest failing rank, when not rank 0 */
    snprintf(want + n, sizeof want - (size_t)n, " (on rank %d)",
             tap_size() - 1);
  is_string(want, hvd_last_error(), "... with that rank's message");
  ok(q2 == NULL, "... no request");
  is_int(HVD_ERR_INVALID_ARG,
         hvd_checkpoint_save_async(bg, a.p, NP, oa, 7,
                                   rank == 0 ? NULL : &q2),
         "out NULL on rank 0: refused on every rank");
  is_string("hvd_checkpoint_save_async: out is NULL", hvd_last_error(),
            "... the message");

  /* the write's error: the call succeeds, the wait says why */
  char bad[1200], tmpname[1300];
  snprintf(bad, sizeof bad, "%s", at("no-such-dir/y.ckpt"));
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(bad, a.p, NP, oa, 7, &q),
         "save_async into a missing directory: the call succeeds");
  snprintf(tmpname, sizeof tmpname, "cannot create '%s.tmp.%lld': %s", bad,
           root_ll(getpid()), strerror(ENOENT));
  is_int(HVD_ERR_IO, hvd_checkpoint_wait(q), "... the wait fails, HVD_ERR_IO");
  is_string(amsg("hvd_checkpoint_save_async", bad, tmpname), hvd_last_error(),
            "... on every rank, naming the file");
  is_int(HVD_SUCCESS, hvd_checkpoint_save(at("x.ckpt"), a.p, NP, oa, 7),
         "after the wait, saves go on");
  is_int(0, root_ll(temp_files()), "no temporary file is left");

  /* a save in flight across hvd_shutdown: the wait is local then */
  is_int(HVD_SUCCESS,
         hvd_checkpoint_save_async(at("late.ckpt"), b.p, NP, ob, 5, &q),
         "save_async, then hvd_shutdown");
  hvd_optimizer_destroy(oa);
  hvd_optimizer_destroy(ob);
  hvd_shutdown();
  is_int(HVD_SUCCESS, hvd_checkpoint_wait(q), "... the wait after it");
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init again: %s", hvd_last_error());
  fa = rank == 0 ? hvdt_read_bytes(at("late.ckpt"), &na) : NULL;
  fb = rank == 0 ? hvdt_read_bytes(at("fg5.ckpt"), &nb) : NULL;
  ok(root_ll(na > 0 && na == nb && memcmp(fa, fb, na) == 0),
     "... wrote the whole file");
  free(fa);
  free(fb);
  model_free(&a);
  model_free(&b);
}

/* ---- what a rank holds while it loads ------------------------------------ */

/* The kB of a line of /proc/self/status ("VmRSS", "VmHWM"), or -1. */
static long long status_kb(const char *key) {
  char line[256];
  long long kb = -1;
  size_t k = strlen(key);
  FILE *f = fopen("/proc/self/status", "r");
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, key, k) == 0 && line[k] == ':')
      kb = atoll(line + k + 1);
  if (f != NULL)
    fclose(f);
  return kb;
}

/* Resets VmHWM to VmRSS; 0 where the kernel cannot. */
static int reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  int done = f != NULL && fputs("5", f) >= 0;
  return f != NULL && fclose(f) == 0 && done;
}

/* Peak kB over the resident size before, of what fn does: measured into
 * *extra, -1 when the kernel cannot reset the peak. */
#define PEAK_OF(extra, fn)                                                     \
  do {                                                                         \
    int can_ = reset_peak();                                                   \
    long long before_ = status_kb("VmRSS");                                    \
    fn;                                                                        \
    *(extra) = can_ && before_ > 0 ? status_kb("VmHWM") - before_ : -1;        \
  } while (0)

/* A check that extra (PEAK_OF's) is below cap0 KiB on rank 0 (< 0: not
 * checked there) and cap KiB elsewhere; skipped where no rank could
 * measure. */
__attribute__((format(printf, 4, 5))) static void
peak_ok(long long extra, long long cap0, long long cap, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (root_ll(extra >= 0) == 0) {
    skip(1, "no /proc/self/clear_refs to reset VmHWM");
    return;
  }
  tap_note("%lld KiB more", extra);
  ok(rank == 0 ? cap0 < 0 || extra < cap0 : extra < cap, "%s", what);
}

/* That rank 0 reads the same bytes from files a and b. */
static void same_file_ok(const char *a, const char *b, const char *what) {
  size_t na = 0, nb = 0;
  unsigned char *fa = rank == 0 ? hvdt_read_bytes(a, &na) : NULL,
                *fb = rank == 0 ? hvdt_read_bytes(b, &nb) : NULL;
  ok(root_ll(fa != NULL && fb != NULL && na == nb &&
             memcmp(fa, fb, na) == 0),
     "%s", what);
  free(fa);
  free(fb);
}

/* Element j of tensor t (0 the value, 1 and 2 the state) of "big". */
static float big_at(int64_t j, int t, int seed) {
  return (float)((j * 13 + t * 5 + seed * 3) % 101 - 50) / 64;
}

static void big_fill(float *const *bufs, int64_t n, int seed) {
  for (int t = 0; t < 3; t++)
    for (int64_t j = 0; j < n; j++)
      bufs[t][j] = big_at(j, t, seed);
}

/* A model of 6M floats (24 MiB) with AdamW: its file is 72 MiB. Every
 * rank, rank 0 that reads the file too, takes the tensors' bytes
 * straight into its tensors, so its peak resident size during the load
 * (VmHWM, reset by writing 5 to /proc/self/clear_refs) exceeds its size
 * before by less than 24 MiB (rank 0: 32 MiB), where rank 0 used to read
 * the whole file into memory and every rank to receive all of it; every
 * value and state element is the saved one. (Measured: ~200 KiB on ranks
 * 1-3, ~9 MiB on rank 0, whose checksum reads 8 MiB at a time; with
 * AddressSanitizer 8.5 and 19 MiB, its shadow of the 64 MiB bounce
 * buffer and of the reads. A mutation that receives every piece through
 * the bounce buffer: 48 MiB.) Then opt NULL on the last rank only fails on every rank
 * (the tensors sent depend on it). */
static void memory(void) {
  enum { BIG = 6 << 20 };
  int64_t n = BIG;
  long long file_kb = 0;
  hvd_param_t p = {.name = "big"};
  float *v = malloc(BIG * sizeof(float)), *g = calloc(BIG, sizeof(float));
  p.value = hvd_tensor_make(v, HVD_FLOAT32, 1, &n);
  p.grad = hvd_tensor_make(g, HVD_FLOAT32, 1, &n);
  hvd_adam_options_t o;
  hvd_adam_options_init(&o);
  hvd_optimizer_t *opt = NULL;
  if (v == NULL || g == NULL || hvd_adam_create(&p, 1, &o, &opt) != 0)
    bail("the big model: %s", hvd_last_error());
  float *bufs[3] = {v, opt->state[0].data, opt->state[1].data};
  big_fill(bufs, n, 1);
  char path[1200];
  snprintf(path, sizeof path, "%s", at("big.ckpt"));
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, &p, 1, opt, 7),
         "save a model of 6M floats with AdamW");
  struct stat st;
  if (rank == 0 && stat(path, &st) == 0)
    file_kb = (long long)st.st_size / 1024;
  file_kb = root_ll(file_kb);
  big_fill(bufs, n, 2); /* other values, every page resident */
  int64_t step = 0;
  long long extra;
  hvd_result_t rc;
  PEAK_OF(&extra, rc = hvd_checkpoint_load(path, &p, 1, opt, &step));
  is_int(HVD_SUCCESS, rc, "... loads (%lld KiB)", file_kb);
  int same = step == 7;
  for (int t = 0; t < 3; t++)
    for (int64_t j = 0; j < n && same; j++)
      same = bufs[t][j] == big_at(j, t, 1);
  ok(same, "... every value and state element is the saved one");
  peak_ok(extra, 32 * 1024, 24 * 1024,
          "... no rank holds the file (72 MiB): rank 0 less than 32 MiB more "
          "while it loads, the others less than 24 MiB");
  int last = tap_size() - 1;
  char want[160];
  snprintf(want, sizeof want,
           "hvd_checkpoint_load: opt is NULL here but not NULL on rank 0 (on "
           "rank %d)",
           last);
  if (last > 0) {
    is_int(HVD_ERR_INVALID_ARG,
           hvd_checkpoint_load(path, &p, 1, rank == last ? NULL : opt, NULL),
           "opt NULL on the last rank only fails on every rank");
    is_string(want, hvd_last_error(), "... with that rank's message");
  } else
    skip(2, "opt NULL on one rank of several needs 2 ranks");
  hvd_optimizer_destroy(opt);
  free(v);
  free(g);
}

/* ---- modes for the shell tests ------------------------------------------- */

/* checkpoint zero-memory PATH: the big model of memory() saved from a
 * plain AdamW, then loaded into a sharded one (ZeRO-1) that has taken a
 * step (its blocks resident): a rank other than 0 holds less than 8 MiB
 * more while it loads (it used to gather the whole state, 48 MiB, to
 * keep its block; checkpoint.sh runs this with 1 MiB pieces), the values
 * are the saved ones; saved again from the sharded optimizer, such a
 * rank again holds less than 8 MiB more (it used to allgather the whole
 * state too), and the file is the first byte for byte (its state blocks
 * were the saved ones); an hvd_state commit holds a copy of the values
 * and of the rank's blocks only (it used to gather and copy the whole
 * state), and restores the values. */
static int mode_zero_memory(const char *path) {
  enum { BIG = 6 << 20 };
  int64_t n = BIG, step = 0;
  hvd_param_t p = {.name = "big"};
  float *v = malloc(BIG * sizeof(float)), *g = calloc(BIG, sizeof(float));
  p.value = hvd_tensor_make(v, HVD_FLOAT32, 1, &n);
  p.grad = hvd_tensor_make(g, HVD_FLOAT32, 1, &n);
  hvd_adam_options_t o;
  hvd_distributed_options_t d;
  hvd_adam_options_init(&o);
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = 1;
  hvd_optimizer_t *plain = NULL, *base = NULL, *zero = NULL;
  if (v == NULL || g == NULL || hvd_adam_create(&p, 1, &o, &plain) != 0 ||
      hvd_adam_create(&p, 1, &o, &base) != 0 ||
      hvd_distributed_optimizer(base, &d, &zero) != 0)
    bail("the big model: %s", hvd_last_error());
  float *bufs[3] = {v, plain->state[0].data, plain->state[1].data};
  big_fill(bufs, n, 1);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, &p, 1, plain, 7),
         "save a model of 6M floats with AdamW");
  for (int64_t j = 0; j < n; j++)
    g[j] = 1e-3f;
  is_int(HVD_SUCCESS, hvd_optimizer_step(zero),
         "a step of a sharded AdamW: its state blocks are resident");
  big_fill(bufs, n, 2); /* other values, every page resident */
  long long extra;
  hvd_result_t rc;
  PEAK_OF(&extra, rc = hvd_checkpoint_load(path, &p, 1, zero, &step));
  is_int(HVD_SUCCESS, rc, "the file loads into the sharded AdamW at np %d",
         tap_size());
  int same = step == 7;
  for (int64_t j = 0; j < n && same; j++)
    same = v[j] == big_at(j, 0, 1);
  ok(same, "... every value is the saved one");
  peak_ok(extra, -1, 8 * 1024,
          "... a rank other than 0 holds less than 8 MiB more while it loads");
  char again[1300];
  snprintf(again, sizeof again, "%s.again", path);
  PEAK_OF(&extra, rc = hvd_checkpoint_save(again, &p, 1, zero, 7));
  is_int(HVD_SUCCESS, rc, "... saved again from the sharded AdamW");
  peak_ok(extra, -1, 8 * 1024,
          "... a rank other than 0 holds less than 8 MiB more while it saves "
          "(it sends its blocks to rank 0)");
  same_file_ok(path, again,
               "... the same file byte for byte: every block was loaded");
  /* an hvd_state commit copies the values and this rank's blocks */
  hvd_state_t *st = NULL;
  if (hvd_state_create(NULL, 1, &st) != 0 ||
      hvd_state_add_params(st, &p, 1, zero) != 0)
    bail("hvd_state: %s", hvd_last_error());
  PEAK_OF(&extra, rc = hvd_state_commit(st));
  is_int(HVD_SUCCESS, rc, "an hvd_state commit");
  long long cap = (24 + 48 / tap_size() + 8) * 1024LL;
  peak_ok(extra, cap, cap,
          "... holds the values (24 MiB) and this rank's blocks of the state "
          "(48 MiB / %d), no full state",
          tap_size());
  big_fill(bufs, n, 3);
  int restored = 0;
  is_int(HVD_SUCCESS, hvd_state_restore(st, &restored), "... restores");
  same = restored == 1;
  for (int64_t j = 0; j < n && same; j++)
    same = v[j] == big_at(j, 0, 1);
  ok(same, "... the committed values");
  hvd_state_destroy(st);
  hvd_optimizer_destroy(zero);
  hvd_optimizer_destroy(plain);
  free(v);
  free(g);
  return 0;
}

static int mode_save(const char *path, int k) {
  model_t m;
  model_init(&m, 5);
  hvd_optimizer_t *opt = adamw(&m, 0.02, 0);
  ok(train(&m, opt, k), "%d local AdamW steps", k);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, m.p, NP, opt, k),
         "save at np %d", tap_size());
  if (hvd_last_error()[0])
    diag("%s", hvd_last_error());
  hvd_optimizer_destroy(opt);
  model_free(&m);
  return 0;
}

/* save, but in the background, and leave without the wait: the process's
 * exit finishes the file. */
static int mode_save_async(const char *path, int k) {
  model_t m;
  model_init(&m, 5);
  hvd_optimizer_t *opt = adamw(&m, 0.02, 0);
  hvd_checkpoint_request_t *q = NULL;
  ok(train(&m, opt, k), "%d local AdamW steps", k);
  is_int(HVD_SUCCESS, hvd_checkpoint_save_async(path, m.p, NP, opt, k, &q),
         "save_async at np %d, never waited for", tap_size());
  model_fill(&m, 9); /* changes nothing in the file */
  hvd_optimizer_destroy(opt);
  model_free(&m);
  return 0;
}

static int mode_load(const char *path, int k) {
  model_t ref, m;
  model_init(&ref, 5);
  hvd_optimizer_t *oref = adamw(&ref, 0.02, 0);
  ok(train(&ref, oref, k), "the reference: %d local AdamW steps", k);
  snap_t want = snapshot(ref.p, NP, oref, k);
  model_init(&m, 6);
  hvd_optimizer_t *opt = adamw(&m, 0.7, 1);
  int64_t step = -1;
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, m.p, NP, opt, &step),
         "load at np %d", tap_size());
  if (hvd_last_error()[0])
    diag("%s", hvd_last_error());
  snap_t got = snapshot(m.p, NP, opt, step);
  is_int(k, step, "step %d", k);
  ok(snap_same(&want, &got),
     "values, state, lr, steps and step are the reference's bits");
  free(want.b);
  free(got.b);
  hvd_optimizer_destroy(oref);
  hvd_optimizer_destroy(opt);
  model_free(&ref);
  model_free(&m);
  return 0;
}

/* A bfloat16 parameter of BIG elements (16 MiB) and its gradient, with
 * AdamW in mixed precision (float32 masters and state: 96 MiB in all),
 * sharded (ZeRO-1) or not. */
static hvd_optimizer_t *mixed_big(hvd_param_t *p, uint16_t *v, uint16_t *g,
                                  int64_t *n, int shard) {
  hvd_adam_options_t o;
  hvd_distributed_options_t d;
  hvd_adam_options_init(&o);
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = 1;
  p->name = "big";
  p->value = hvd_tensor_make(v, HVD_BFLOAT16, 1, n);
  p->grad = hvd_tensor_make(g, HVD_BFLOAT16, 1, n);
  hvd_optimizer_t *base = NULL, *opt = NULL;
  if (hvd_adam_create(p, 1, &o, &base) != 0 ||
      (shard && hvd_distributed_optimizer(base, &d, &opt) != 0))
    bail("the big bfloat16 model: %s", hvd_last_error());
  return shard ? opt : base;
}

/* checkpoint zero-mixed-memory PATH: mixed precision under ZeRO-1, where
 * each rank keeps the float32 masters of its blocks only. A bfloat16
 * model of 8M elements, sharded AdamW, one step (the masters then hold
 * more than the values); saved: a rank other than 0 holds less than 8
 * MiB more (it sends its blocks of the masters and state to rank 0; it
 * used to allgather every whole master, 32 MiB); the file loads into an
 * unsharded mixed AdamW, the reference; its values overwritten, the
 * sharded one loads it: again less than 8 MiB more on such a rank (it
 * rounds each piece of a master into its value as it comes and keeps its
 * block; it used to make every whole master), its values are the
 * reference's bit for bit, and a second save is the first file byte for
 * byte (the master and state blocks were the file's). */
static int mode_zero_mixed_memory(const char *path) {
  enum { BIG = 8 << 20 };
  int64_t n = BIG;
  long long extra;
  hvd_param_t p, q;
  uint16_t *v = malloc(BIG * 2), *g = malloc(BIG * 2), *rv = calloc(BIG, 2),
           *rg = calloc(BIG, 2);
  if (v == NULL || g == NULL || rv == NULL || rg == NULL)
    bail("the big bfloat16 model: out of memory");
  for (int64_t j = 0; j < n; j++) {
    v[j] = hvd__f32_to_bf16(big_at(j, 0, 1));
    g[j] = hvd__f32_to_bf16((float)(j % 7 - 3) / 64);
  }
  hvd_optimizer_t *zero = mixed_big(&p, v, g, &n, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(zero),
         "a step of a sharded bfloat16 AdamW at np %d", tap_size());
  hvd_result_t rc;
  PEAK_OF(&extra, rc = hvd_checkpoint_save(path, &p, 1, zero, 7));
  is_int(HVD_SUCCESS, rc, "... saved (float32 masters and state: 96 MiB)");
  peak_ok(extra, -1, 8 * 1024,
          "... a rank other than 0 holds less than 8 MiB more while it saves "
          "(it sends its blocks to rank 0)");
  hvd_optimizer_t *plain = mixed_big(&q, rv, rg, &n, 0);
  is_int(HVD_SUCCESS, hvd_checkpoint_load(path, &q, 1, plain, NULL),
         "... loads into an unsharded bfloat16 AdamW (the reference)");
  for (int64_t j = 0; j < n; j++) /* other values, every page resident */
    v[j] = hvd__f32_to_bf16(big_at(j, 0, 2));
  int64_t step = 0;
  PEAK_OF(&extra, rc = hvd_checkpoint_load(path, &p, 1, zero, &step));
  is_int(HVD_SUCCESS, rc, "... and into the sharded one");
  peak_ok(extra, -1, 8 * 1024,
          "... a rank other than 0 holds less than 8 MiB more while it loads "
          "(no whole master)");
  ok(step == 7 && memcmp(v, rv, BIG * 2) == 0,
     "... its values are the reference's, bit for bit");
  char again[1300];
  snprintf(again, sizeof again, "%s.again", path);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(again, &p, 1, zero, 7),
         "... saved again from the sharded AdamW");
  same_file_ok(path, again,
               "... the same file byte for byte: every master and state block "
               "was loaded");
  hvd_optimizer_destroy(zero);
  hvd_optimizer_destroy(plain);
  free(v);
  free(g);
  free(rv);
  free(rg);
  return 0;
}

/* checkpoint zero-save-memory PATH: a sharded AdamW (ZeRO-1) over 8
 * parameters of 1M floats (the full state: 64 MiB) gathers each
 * parameter's state on rank 0 as it writes it. A save into a missing
 * directory fails on every rank with rank 0's message and no rank left
 * waiting for a gather (rank 0 takes part in every one without
 * writing); then a save raises rank 0's peak by less than 24 MiB (one
 * parameter's state is 8 MiB; it used to gather all of it first) and no
 * other rank's by 8 MiB, and the file is byte for byte the one of an
 * unsharded AdamW that took the same step. */
static int mode_zero_save_memory(const char *path) {
  enum { NPAR = 8, LEN = 1 << 20 };
  int64_t n = LEN;
  long long extra;
  hvd_param_t p[NPAR], q[NPAR];
  char pname[NPAR][16];
  hvd_adam_options_t o;
  hvd_distributed_options_t d;
  hvd_adam_options_init(&o);
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = 1;
  for (int i = 0; i < NPAR; i++) {
    float *v = malloc(LEN * 4), *g = malloc(LEN * 4), *cv = malloc(LEN * 4),
          *cg = malloc(LEN * 4);
    if (v == NULL || g == NULL || cv == NULL || cg == NULL)
      bail("the model: out of memory");
    for (int64_t j = 0; j < LEN; j++) {
      cv[j] = v[j] = big_at(j, 0, i);
      cg[j] = g[j] = big_at(j, 1, i) / 8;
    }
    snprintf(pname[i], sizeof pname[i], "p%d", i);
    p[i] = (hvd_param_t){pname[i], hvd_tensor_make(v, HVD_FLOAT32, 1, &n),
                         hvd_tensor_make(g, HVD_FLOAT32, 1, &n)};
    q[i] = (hvd_param_t){pname[i], hvd_tensor_make(cv, HVD_FLOAT32, 1, &n),
                         hvd_tensor_make(cg, HVD_FLOAT32, 1, &n)};
  }
  hvd_optimizer_t *base = NULL, *zero = NULL, *plain = NULL;
  if (hvd_adam_create(p, NPAR, &o, &base) != 0 ||
      hvd_distributed_optimizer(base, &d, &zero) != 0 ||
      hvd_adam_create(q, NPAR, &o, &plain) != 0)
    bail("the optimizers: %s", hvd_last_error());
  is_int(HVD_SUCCESS, hvd_optimizer_step(zero),
         "a step of a sharded AdamW over 8 x 1M floats at np %d", tap_size());
  is_int(HVD_SUCCESS, hvd_optimizer_step(plain),
         "... and of an unsharded one on a copy");
  char bad[1100], want[3400];
  pid_t pid0;
  snprintf(bad, sizeof bad, "%s.nodir/x.ckpt", path);
  missing_dir_msg(want, sizeof want, bad, &pid0);
  is_int(HVD_ERR_IO, hvd_checkpoint_save(bad, p, NPAR, zero, 1),
         "a save into a missing directory fails on every rank");
  is_string(want, hvd_last_error(), "... with rank 0's message");
  hvd_result_t rc;
  PEAK_OF(&extra, rc = hvd_checkpoint_save(path, p, NPAR, zero, 1));
  is_int(HVD_SUCCESS, rc, "... then a save works");
  peak_ok(extra, 24 * 1024, 8 * 1024,
          "... rank 0 holds less than 24 MiB more while it saves (the full "
          "state: 64 MiB), the others less than 8 MiB");
  char again[1300];
  snprintf(again, sizeof again, "%s.plain", path);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(again, q, NPAR, plain, 1),
         "... and the unsharded AdamW's save");
  same_file_ok(path, again, "... the same file byte for byte");
  hvd_optimizer_destroy(zero);
  hvd_optimizer_destroy(plain);
  for (int i = 0; i < NPAR; i++) {
    free(p[i].value.data), free(p[i].grad.data);
    free(q[i].value.data), free(q[i].grad.data);
  }
  return 0;
}

/* A save that replaces a file keeps its permissions, as an overwrite in
 * place would: a 0600 checkpoint stays 0600 (the new file once took
 * 0666 less the umask, readable by all). A new file takes the umask's. */
static void permissions(void) {
  model_t m;
  model_init(&m, 0);
  const char *path = at("mode.ckpt");
  mode_t was = umask(022);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, m.p, NP, NULL, 1),
         "a new file");
  struct stat st = {0};
  ok(root_ll(stat(path, &st) == 0 ? (long long)(st.st_mode & 07777) : -1) ==
         0644,
     "... takes 0666 less the umask (022): 0644");
  if (rank == 0)
    chmod(path, 0600);
  is_int(HVD_SUCCESS, hvd_checkpoint_save(path, m.p, NP, NULL, 2),
         "a save over a file of mode 0600");
  ok(root_ll(stat(path, &st) == 0 ? (long long)(st.st_mode & 07777) : -1) ==
         0600,
     "... keeps 0600");
  umask(was);
  model_free(&m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  if (argc == 4) {
    is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
    if (strcmp(argv[1], "save") == 0)
      mode_save(argv[2], atoi(argv[3]));
    else if (strcmp(argv[1], "save-async") == 0)
      mode_save_async(argv[2], atoi(argv[3]));
    else if (strcmp(argv[1], "zero-memory") == 0)
      mode_zero_memory(argv[2]);
    else if (strcmp(argv[1], "zero-mixed-memory") == 0)
      mode_zero_mixed_memory(argv[2]);
    else if (strcmp(argv[1], "zero-save-memory") == 0)
      mode_zero_save_memory(argv[2]);
    else
      mode_load(argv[2], atoi(argv[3]));
    hvd_shutdown();
    return tap_mpi_finish();
  }

  model_t m;
  model_init(&m, 0);
  int64_t step = 0;
  is_int(HVD_ERR_NOT_INITIALIZED,
         hvd_checkpoint_save("x.ckpt", m.p, NP, NULL, 0), "save before init");
  is_string("hvd_checkpoint_save: hvd_init() has not been called",
            hvd_last_error(), "... the message");
  is_int(HVD_ERR_NOT_INITIALIZED,
         hvd_checkpoint_load("x.ckpt", m.p, NP, NULL, &step),
         "load before init");
  is_string("hvd_checkpoint_load: hvd_init() has not been called",
            hvd_last_error(), "... the message");
  model_free(&m);

  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  hvdt_shared_tmpdir(dir, sizeof dir, "ckpt");
  resume();
  failures();
  background();
  memory();
  permissions();
  hvdt_remove_tmpdir(dir);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
