/*
 * cifar_train.c - trains the small residual CNN of examples/cnn on
 * CIFAR-10 with hvd, the way a DDP or Horovod user trains a ResNet:
 *
 *   1. hvd_init; rank 0's initial weights broadcast (or a checkpoint);
 *   2. each epoch hvd_sampler reshuffles the training set and gives every
 *      rank its shard; a step takes B images per rank;
 *   3. forward with synchronized batch norm (--sync-bn, the default; or
 *      per-rank statistics with --local-bn), backward handing each
 *      gradient to the distributed optimizer as it is final, SGD with
 *      momentum and weight decay, a multi-step learning-rate schedule;
 *   4. per epoch the training loss and accuracy and the test accuracy,
 *      summed over all ranks; checkpoints (parameters, SGD state, batch
 *      norm buffers, the place in the data and the plan) that resume at
 *      any world size, the data going on from where it stopped.
 *
 * Data: --data DIR with CIFAR-10's binary files (data_batch_1.bin ...
 * data_batch_5.bin, test_batch.bin: records of a label byte and 3072
 * pixel bytes, red, green, blue planes of 32x32), or without it a
 * synthetic set of the same shape, made from --seed (nothing can be
 * downloaded here): each class a pattern of stripes and colours, plus
 * noise. Manual: doc/cifar_train.md.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "cnn.h"
#include "hvd.h"
#include "model.h" /* bert_set_threads: the BLAS's threads */

#define PROG "cifar_train"
#define RECORD (1 + CNN_PIXELS)

/* A checkpoint's .bn.ckpt holds, after the batch norm buffers, the int64
 * tensor "cifar_train.progress": where the data and the plan stand after
 * its step, whatever the world size. */
enum {
  PROG_EPOCH,     /* the epoch of the next step */
  PROG_CONSUMED,  /* images of its order taken (hvd_sampler_epoch_from) */
  PROG_PER_EPOCH, /* the steps of an epoch that --epochs counts: the job's
                     first run's, at its global batch */
  PROG_BATCH,     /* that global batch */
  PROGRESS
};

typedef struct options {
  const char *data, *checkpoint, *resume, *log_json;
  int64_t synthetic, synthetic_test, epochs, steps, checkpoint_every;
  int batch, width, threads, quiet, local_bn, gpu;
  double lr, momentum, weight_decay, gamma;
  double milestones[2]; /* fractions of the steps */
  uint64_t seed;
} options_t;

static int rank, size;

/* The wording of this program's messages (examples/util/cli.h). */
static const cli_t cli = {
    .prog = PROG,
    .hint = " (try --help)",
    .int_fmt = "%s takes an integer in %lld..%lld, not '%s'",
    .real_fmt = "%s takes a number in [%g, %g], not '%s'"};

/* Every rank learns whether all are ok; if not, each prints its own
 * reason (rank 0 for the shared ones) and the job ends with status 1. */
static void check(hvd_result_t rc, const char *what, const char *msg) {
  int bad = rc != HVD_SUCCESS, any = bad;
  int64_t one = 1, v = bad;
  hvd_tensor_t t = hvd_tensor_make(&v, HVD_INT64, 1, &one);
  if (hvd_allreduce("cifar_train.check", &t, &t, HVD_MAX, 1, 1) == HVD_SUCCESS)
    any = v != 0;
  if (bad)
    cli_say("%s: %s", what, msg != NULL && msg[0] ? msg : hvd_strerror(rc));
  if (any) {
    hvd_shutdown();
    exit(1);
  }
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- data ---------------------------------------------------------------- */

typedef struct dataset {
  unsigned char *rec; /* n records of RECORD bytes */
  int64_t n;
} dataset_t;

static uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* n synthetic images: class k has stripes of its own frequency and
 * direction and a colour of its own; every pixel gets noise. */
static int synthetic(dataset_t *d, int64_t n, uint64_t seed) {
  d->n = n;
  d->rec = malloc((size_t)n * RECORD);
  if (d->rec == NULL)
    return -1;
  for (int64_t i = 0; i < n; i++) {
    unsigned char *r = d->rec + (size_t)i * RECORD;
    uint64_t h = mix(seed * 1000003u + (uint64_t)i);
    int k = (int)(h % CNN_CLASSES);
    r[0] = (unsigned char)k;
    double fx = 0.2 + 0.15 * (k % 5), fy = 0.1 * (k / 5), ph = 0.7 * k;
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < CNN_SIDE; y++)
        for (int x = 0; x < CNN_SIDE; x++) {
          uint64_t z = mix(h + (uint64_t)((c * CNN_SIDE + y) * CNN_SIDE + x));
          double noise = ((double)(z % 1000) / 1000.0 - 0.5) * 220;
          double v = 128 + 14 * sin(fx * x + fy * y + ph + c) +
                     6 * cos(0.9 * k + 2.1 * c) + noise;
          r[1 + (c * CNN_SIDE + y) * CNN_SIDE + x] =
              (unsigned char)(v < 0     ? 0
                              : v > 255 ? 255
                                        : v);
        }
  }
  return 0;
}

/* The images of CIFAR-10 binary file f (path), from its size; -1 and a
 * message in msg when it holds none or its size is no whole number of
 * them. */
static int64_t records_in(FILE *f, const char *path, char *msg, size_t len) {
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    snprintf(msg, len, "cannot examine '%s': %s", path, strerror(errno));
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    snprintf(msg, len, "cannot read '%s': %s", path, strerror(EISDIR));
    return -1;
  }
  if (st.st_size == 0) {
    snprintf(msg, len, "'%s' is empty (CIFAR-10 binary: %d bytes an image)",
             path, RECORD);
    return -1;
  }
  if (st.st_size % RECORD != 0) {
    snprintf(msg, len,
             "'%s' is not CIFAR-10 binary: its %lld bytes are not a "
             "multiple of %d (a label byte and 3072 pixels per image)",
             path, (long long)st.st_size, RECORD);
    return -1;
  }
  return st.st_size / RECORD;
}

/* Appends the records of a CIFAR-10 binary file; a message in msg on
 * failure. A missing file is 1 (not an error here), 0 read, -1 bad. */
static int read_cifar(dataset_t *d, const char *path, char *msg, size_t len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    if (errno == ENOENT)
      return 1;
    snprintf(msg, len, "cannot open '%s': %s", path, strerror(errno));
    return -1;
  }
  int64_t n = records_in(f, path, msg, len);
  if (n < 0) {
    fclose(f);
    return -1;
  }
  unsigned char *p = realloc(d->rec, (size_t)(d->n + n) * RECORD);
  if (p == NULL) {
    snprintf(msg, len, "out of memory for '%s'", path);
    fclose(f);
    return -1;
  }
  d->rec = p;
  size_t got = fread(p + (size_t)d->n * RECORD, RECORD, (size_t)n, f);
  fclose(f);
  if (got != (size_t)n) {
    snprintf(msg, len, "'%s': read %zu of %lld images", path, got,
             (long long)n);
    return -1;
  }
  for (int64_t i = 0; i < n; i++)
    if (p[(size_t)(d->n + i) * RECORD] >= CNN_CLASSES) {
      snprintf(msg, len,
               "'%s' is not CIFAR-10 binary: image %lld has label %d (0..9)",
               path, (long long)i, p[(size_t)(d->n + i) * RECORD]);
      return -1;
    }
  d->n += n;
  return 0;
}

/* The training set (data_batch_1..5.bin: at least the first) and the
 * test set (test_batch.bin, else none) of dir. */
static int load_dir(const char *dir, dataset_t *train, dataset_t *test,
                    char *msg, size_t len) {
  char path[4096];
  for (int b = 1; b <= 5; b++) {
    snprintf(path, sizeof path, "%s/data_batch_%d.bin", dir, b);
    int rc = read_cifar(train, path, msg, len);
    if (rc < 0)
      return -1;
    if (rc == 1 && b == 1) {
      snprintf(msg, len,
               "no '%.3000s' (CIFAR-10's binary version: --data "
               "DIR holds data_batch_1.bin ... test_batch.bin)",
               path);
      return -1;
    }
  }
  snprintf(path, sizeof path, "%s/test_batch.bin", dir);
  return read_cifar(test, path, msg, len) < 0 ? -1 : 0;
}

/* Images idx[0..n) of d as normalized floats and labels. */
static void batch(const dataset_t *d, const int64_t *idx, int n, float *x,
                  int32_t *y) {
  for (int i = 0; i < n; i++) {
    const unsigned char *r = d->rec + (size_t)idx[i] * RECORD;
    y[i] = r[0];
    for (int j = 0; j < CNN_PIXELS; j++)
      x[(size_t)i * CNN_PIXELS + j] = ((float)r[1 + j] / 255.0f - 0.5f) / 0.25f;
  }
}

/* ---- options ------------------------------------------------------------- */

static const char usage_text[] =
    "usage: " PROG " [options]\n"
    "  Trains a small residual CNN on CIFAR-10 with hvd; run it on N ranks\n"
    "  with bin/hvdrun -np N " PROG ". Every option is optional.\n"
    "\n"
    "  --data DIR             CIFAR-10 binary files (data_batch_1.bin ...,\n"
    "                         test_batch.bin); default: a synthetic set\n"
    "  --synthetic N          synthetic training images (default 2560)\n"
    "  --synthetic-test N     synthetic test images (default 512)\n"
    "  --epochs N             epochs (default 3)\n"
    "  --steps N              optimizer steps instead of --epochs\n"
    "  --batch-size N         images per rank and step (default 32)\n"
    "  --width N              channels of every convolution (default 16)\n"
    "  --lr X                 learning rate (default 0.1), times --gamma\n"
    "                         (0.1) at 50% and 75% of the steps\n"
    "  --momentum X           SGD momentum (default 0.9)\n"
    "  --weight-decay X       SGD weight decay (default 5e-4)\n"
    "  --sync-bn              batch norm over every rank's batch (default)\n"
    "  --local-bn             batch norm over this rank's batch only\n"
    "  --device cpu|gpu       where the model runs (default cpu); gpu: the\n"
    "                         rank's GPU (cuBLAS convolutions; a CUDA build)\n"
    "  --seed N               weights, synthetic data, order (default 42)\n"
    "  --threads N            BLAS threads per rank (default 1)\n"
    "  --checkpoint DIR       write DIR/step-NNNNNN.ckpt (+ .bn.ckpt)\n"
    "  --checkpoint-every N   every N steps (and after the last)\n"
    "  --resume FILE          continue from a step-NNNNNN.ckpt, at any\n"
    "                         world size: its place in the data and its\n"
    "                         job's steps and schedule\n"
    "  --log-json FILE        one JSON line per step (rank 0)\n"
    "  --quiet                only the summary line\n"
    "  --help\n";

enum {
  O_DATA = 256,
  O_SYN,
  O_SYN_TEST,
  O_EPOCHS,
  O_STEPS,
  O_BATCH,
  O_WIDTH,
  O_LR,
  O_MOMENTUM,
  O_WD,
  O_SYNC,
  O_LOCAL,
  O_DEVICE,
  O_SEED,
  O_THREADS,
  O_CKPT,
  O_CKPT_EVERY,
  O_RESUME,
  O_LOG,
  O_QUIET,
  O_HELP
};

static const struct option long_options[] = {
    {"data", required_argument, NULL, O_DATA},
    {"synthetic", required_argument, NULL, O_SYN},
    {"synthetic-test", required_argument, NULL, O_SYN_TEST},
    {"epochs", required_argument, NULL, O_EPOCHS},
    {"steps", required_argument, NULL, O_STEPS},
    {"batch-size", required_argument, NULL, O_BATCH},
    {"width", required_argument, NULL, O_WIDTH},
    {"lr", required_argument, NULL, O_LR},
    {"momentum", required_argument, NULL, O_MOMENTUM},
    {"weight-decay", required_argument, NULL, O_WD},
    {"sync-bn", no_argument, NULL, O_SYNC},
    {"local-bn", no_argument, NULL, O_LOCAL},
    {"device", required_argument, NULL, O_DEVICE},
    {"seed", required_argument, NULL, O_SEED},
    {"threads", required_argument, NULL, O_THREADS},
    {"checkpoint", required_argument, NULL, O_CKPT},
    {"checkpoint-every", required_argument, NULL, O_CKPT_EVERY},
    {"resume", required_argument, NULL, O_RESUME},
    {"log-json", required_argument, NULL, O_LOG},
    {"quiet", no_argument, NULL, O_QUIET},
    {"help", no_argument, NULL, O_HELP},
    {NULL, 0, NULL, 0}};

/* The model, SGD and where they run. Each returns 1 when option c was one
 * of its own, 0 when not. */
static int model_option(options_t *o, int c, const char *a) {
  switch (c) {
  case O_WIDTH:
    o->width = (int)cli_int("--width", a, 1, 64);
    return 1;
  case O_LR:
    o->lr = cli_real("--lr", a, 0, 100);
    return 1;
  case O_MOMENTUM:
    o->momentum = cli_real("--momentum", a, 0, 0.9999);
    return 1;
  case O_WD:
    o->weight_decay = cli_real("--weight-decay", a, 0, 1);
    return 1;
  case O_SYNC:
  case O_LOCAL:
    o->local_bn = c == O_LOCAL;
    return 1;
  case O_DEVICE:
    if (strcmp(a, "cpu") != 0 && strcmp(a, "gpu") != 0)
      cli_usage_error("--device needs cpu or gpu, not '%s'", a);
    o->gpu = strcmp(a, "gpu") == 0;
    return 1;
  case O_SEED:
    o->seed = (uint64_t)cli_int("--seed", a, 0, INT64_MAX);
    return 1;
  case O_THREADS:
    o->threads = (int)cli_int("--threads", a, 1, 256);
    return 1;
  }
  return 0;
}

/* The data, the length of the run, checkpoints and logs. */
static int run_option(options_t *o, int c, const char *a) {
  switch (c) {
  case O_DATA:
    o->data = cli_name("--data", a, "a file name");
    return 1;
  case O_SYN:
    o->synthetic = cli_int("--synthetic", a, 10, 1 << 22);
    return 1;
  case O_SYN_TEST:
    o->synthetic_test = cli_int("--synthetic-test", a, 0, 1 << 22);
    return 1;
  case O_EPOCHS:
    o->epochs = cli_int("--epochs", a, 1, 100000);
    return 1;
  case O_STEPS:
    o->steps = cli_int("--steps", a, 1, INT64_MAX / 2);
    return 1;
  case O_BATCH:
    o->batch = (int)cli_int("--batch-size", a, 1, 4096);
    return 1;
  case O_CKPT:
    o->checkpoint = cli_name("--checkpoint", a, "a directory");
    return 1;
  case O_CKPT_EVERY:
    o->checkpoint_every = cli_int("--checkpoint-every", a, 1, INT64_MAX);
    return 1;
  case O_RESUME:
    o->resume = cli_name("--resume", a, "a checkpoint file");
    return 1;
  case O_LOG:
    o->log_json = cli_name("--log-json", a, "a file name");
    return 1;
  case O_QUIET:
    o->quiet = 1;
    return 1;
  }
  return 0;
}

/* Reads the command line into o; exits 0 for --help, 2 for anything
 * wrong (before hvd_init: no MPI needed). */
static void parse(int argc, char **argv, options_t *o) {
  cli_init(&cli);
  *o = (options_t){.synthetic = 2560,
                   .synthetic_test = 512,
                   .epochs = 3,
                   .steps = -1,
                   .batch = 32,
                   .width = 16,
                   .threads = 1,
                   .lr = 0.1,
                   .momentum = 0.9,
                   .weight_decay = 5e-4,
                   .gamma = 0.1,
                   .milestones = {0.5, 0.75},
                   .seed = 42};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
    if (c == O_HELP) {
      fputs(usage_text, stdout);
      exit(0);
    }
    if (c == ':')
      cli_usage_error("option '%s' needs a value", argv[optind - 1]);
    if (!model_option(o, c, optarg) && !run_option(o, c, optarg))
      cli_usage_error("unknown option '%s'", argv[optind - 1]);
  }
  if (optind < argc)
    cli_usage_error("unexpected argument '%s'", argv[optind]);
  if (o->checkpoint_every > 0 && o->checkpoint == NULL)
    cli_usage_error("--checkpoint-every needs --checkpoint DIR");
}

/* ---- training ------------------------------------------------------------ */

typedef struct ready_ctx {
  hvd_optimizer_t *opt;
  hvd_result_t rc;
  char msg[512];
} ready_ctx_t;

static void on_ready(void *ctx, int i) {
  ready_ctx_t *r = ctx;
  hvd_result_t rc = hvd_optimizer_grad_ready(r->opt, i);
  if (rc != HVD_SUCCESS && r->rc == HVD_SUCCESS) {
    r->rc = rc;
    snprintf(r->msg, sizeof r->msg, "%s", hvd_last_error());
  }
}

static double lr_at(const options_t *o, int64_t s, int64_t steps) {
  double lr = o->lr;
  for (int k = 0; k < 2; k++)
    if (s >= (int64_t)(o->milestones[k] * (double)steps))
      lr *= o->gamma;
  return lr;
}

/* Sums n doubles over the ranks (in place). */
static void sum_all(const char *name, double *v, int n) {
  int64_t len = n;
  hvd_tensor_t t = hvd_tensor_make(v, HVD_FLOAT64, 1, &len);
  check(hvd_allreduce(name, &t, &t, HVD_SUM, 1, 1), "summing",
        hvd_last_error());
}

static void bn_path(char *out, size_t len, const char *ckpt) {
  size_t n = strlen(ckpt);
  if (n > 5 && strcmp(ckpt + n - 5, ".ckpt") == 0)
    snprintf(out, len, "%.*s.bn.ckpt", (int)(n - 5), ckpt);
  else
    snprintf(out, len, "%s.bn", ckpt);
}

/* Everything a run holds: made by setup, used by the steps, released by
 * teardown (the one way out once hvd is up; a failure that check sees
 * ends the job at once). */
typedef struct run {
  options_t o;
  dataset_t train, test;
  hvd_sampler_t *sampler;
  int64_t per_epoch, steps, start;
  cnn_t *m;
  hvd_param_t *p, *kept; /* parameters; batch norm buffers + progress */
  int np, nb;            /* nb: the buffers, kept[nb] the progress */
  int64_t progress[PROGRESS];
  hvd_optimizer_t *opt;
  FILE *log;
  float *x;
  int32_t *y;
  ready_ctx_t ready;
  const int64_t *idx; /* this rank's list of the epoch's images */
  int64_t count, epoch;
  int64_t consumed;       /* images of the epoch's order the steps took */
  int64_t in_epoch, left; /* steps taken from the list, and it holds */
  int fetch;              /* the next step deals a list */
  int old_ckpt;           /* resumed from a file without the progress */
  double ep[3];           /* this epoch's loss sum, correct, images */
  double t0, images;
} run_t;

/* The checkpoint of step `step`: the parameters and SGD's state; the batch
 * norm buffers and the progress, the position after the step (a list
 * used up: the next epoch's start). */
static void save(run_t *r, int64_t step) {
  const options_t *o = &r->o;
  char path[4096], bpath[4200];
  if (rank == 0)
    mkdir(o->checkpoint, 0777);
  snprintf(path, sizeof path, "%s/step-%06" PRId64 ".ckpt", o->checkpoint,
           step);
  bn_path(bpath, sizeof bpath, path);
  int done = r->in_epoch == r->left;
  r->progress[PROG_EPOCH] = done ? r->epoch + 1 : r->epoch;
  r->progress[PROG_CONSUMED] = done ? 0 : r->consumed;
  /* the buffers first: a step's .ckpt exists only with its .bn.ckpt */
  check(hvd_checkpoint_save(bpath, r->kept, r->nb + 1, NULL, step), "saving",
        hvd_last_error());
  check(hvd_checkpoint_save(path, r->p, r->np, r->opt, step), "saving",
        hvd_last_error());
  if (rank == 0 && !o->quiet)
    printf(PROG ": saved %s\n", path);
}

/* The data: every rank reads or makes the whole set (it is small). */
static void setup_data(run_t *r) {
  const options_t *o = &r->o;
  char msg[4096] = "";
  int bad = o->data != NULL
                ? load_dir(o->data, &r->train, &r->test, msg, sizeof msg)
                : (synthetic(&r->train, o->synthetic, o->seed) ||
                   synthetic(&r->test, o->synthetic_test, ~o->seed));
  if (bad && msg[0] == '\0')
    snprintf(msg, sizeof msg, "out of memory for the synthetic set");
  check(bad ? HVD_ERR_INVALID_ARG : HVD_SUCCESS, "--data", msg);
}

/* --device gpu: the GPU hvd_init bound this rank to (with HVD_NO_BIND=1,
 * the current one); every rank must have it. The model, and SGD inside
 * the distributed wrapper. */
static void setup_model(run_t *r) {
  const options_t *o = &r->o;
  int device = HVD_CPU;
  if (o->gpu) {
    device = hvd_cuda_device();
    if (device < 0)
      device = CNN_CURRENT_GPU;
  }
  char why[300], msg[300];
  r->m = cnn_create_on(o->width, o->batch, o->seed, device, why, sizeof why);
  snprintf(msg, sizeof msg, "%s", why);
  check(r->m == NULL ? HVD_ERR_UNSUPPORTED : HVD_SUCCESS,
        o->gpu ? "--device gpu" : "the model", msg);
  cnn_set_sync_bn(r->m, !o->local_bn);
  r->p = cnn_params(r->m, &r->np);
  const hvd_param_t *bufs = cnn_buffers(r->m, &r->nb);
  r->kept = malloc(sizeof *r->kept * (size_t)(r->nb + 1));
  check(r->kept == NULL ? HVD_ERR_NO_MEMORY : HVD_SUCCESS, "the model",
        "out of memory");
  memcpy(r->kept, bufs, sizeof *r->kept * (size_t)r->nb);
  static const int64_t n_progress = PROGRESS;
  r->kept[r->nb] = (hvd_param_t){
      .name = "cifar_train.progress",
      .value = hvd_tensor_make(r->progress, HVD_INT64, 1, &n_progress),
      .grad = hvd_tensor_make(NULL, HVD_INT64, 1, &n_progress)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = lr_at(o, 0, r->steps);
  so.momentum = o->momentum;
  so.weight_decay = o->weight_decay;
  hvd_optimizer_t *sgd = NULL;
  check(hvd_sgd_create(r->p, r->np, &so, &sgd), "hvd_sgd_create",
        hvd_last_error());
  check(hvd_distributed_optimizer(sgd, NULL, &r->opt),
        "hvd_distributed_optimizer", hvd_last_error());
}

/* The .bn.ckpt of checkpoint `file`: the batch norm buffers and the
 * progress. A file written before the progress was kept has one tensor
 * fewer: its buffers alone, and the position taken from the step at this
 * global batch (as then); 1 for such a file. */
static int load_kept(run_t *r, const char *file) {
  char bpath[4200], why[1024];
  int64_t s2 = -1;
  int old = 0;
  bn_path(bpath, sizeof bpath, file);
  hvd_result_t rc = hvd_checkpoint_load(bpath, r->kept, r->nb + 1, NULL, &s2);
  if (rc != HVD_SUCCESS) { /* every rank alike: each checks the outline */
    snprintf(why, sizeof why, "%s", hvd_last_error());
    if (hvd_checkpoint_load(bpath, r->kept, r->nb, NULL, &s2) != HVD_SUCCESS)
      check(rc, "--resume", why); /* the present layout's reason */
    old = 1;
    r->progress[PROG_EPOCH] = r->start / r->per_epoch;
    r->progress[PROG_CONSUMED] =
        r->start % r->per_epoch * r->progress[PROG_BATCH];
  }
  if (s2 != r->start)
    check(HVD_ERR_CORRUPT, "--resume",
          "the batch norm buffers are of another step");
  return old;
}

/* The starting state: a checkpoint, its batch norm buffers and progress,
 * or rank 0's initial weights at the data's start; the steps of the run
 * (--steps, or --epochs of the job's first run's epochs). */
static void setup_start(run_t *r) {
  const options_t *o = &r->o;
  const char *file = o->resume;
  int64_t *g = r->progress;
  g[PROG_EPOCH] = g[PROG_CONSUMED] = 0;
  g[PROG_PER_EPOCH] = r->per_epoch;
  g[PROG_BATCH] = (int64_t)size * o->batch;
  if (file == NULL) {
    check(hvd_broadcast_parameters(r->p, r->np, 0), "hvd_broadcast_parameters",
          hvd_last_error());
  } else {
    check(hvd_checkpoint_load(file, r->p, r->np, r->opt, &r->start), "--resume",
          hvd_last_error());
    r->old_ckpt = load_kept(r, file);
  }
  r->epoch = g[PROG_EPOCH];
  r->consumed = g[PROG_CONSUMED];
  r->fetch = 1;
  r->steps = o->steps > 0 ? o->steps : o->epochs * g[PROG_PER_EPOCH];
}

/* Rank 0's lines on a resume: where the data goes on, and how it was
 * planned at another global batch. */
static void print_resumed(const run_t *r) {
  const int64_t *g = r->progress, G = (int64_t)size * r->o.batch;
  printf(PROG ": resumed from %s at step %lld (epoch %lld, image %lld of "
              "its order)\n",
         r->o.resume, (long long)r->start, (long long)g[PROG_EPOCH] + 1,
         (long long)g[PROG_CONSUMED]);
  if (r->old_ckpt)
    printf(PROG ": its .bn.ckpt holds no position in the data (an older "
                "cifar_train's): taken from the step, at this global batch "
                "%lld\n",
           (long long)G);
  else if (g[PROG_BATCH] != G)
    printf(PROG ": its job's global batch was %lld, this run's is %lld: the "
                "data goes on from there, the learning rate by the job's "
                "schedule%s\n",
           (long long)g[PROG_BATCH], (long long)G,
           r->o.steps > 0 ? "" : " (--epochs counts its epochs' steps)");
}

/* Rank 0's lines before training. */
static void print_setup(const run_t *r) {
  const options_t *o = &r->o;
  const int B = o->batch;
  printf(PROG ": %s: %lld training images, %lld test; %d rank%s x %d "
              "images = global batch %d, %lld steps per epoch\n",
         o->data ? o->data : "synthetic", (long long)r->train.n,
         (long long)r->test.n, size, size == 1 ? "" : "s", B, size * B,
         (long long)r->per_epoch);
  printf(PROG ": width %d, batch norm %s, on %s; SGD lr %g (x%g at 50%% "
              "and 75%% of %lld steps), momentum %g, weight decay %g\n",
         o->width, o->local_bn ? "per rank (--local-bn)" : "synchronized",
         o->gpu ? "the GPU" : "the CPU", o->lr, o->gamma, (long long)r->steps,
         o->momentum, o->weight_decay);
  if (o->resume != NULL)
    print_resumed(r);
  fflush(stdout);
}

/* Everything before the first step; 0, or 1 when the data makes no step
 * (said by rank 0). */
static int setup(run_t *r) {
  const options_t *o = &r->o;
  if (bert_set_threads(o->threads) != HVD_SUCCESS && rank == 0 && !o->quiet)
    cli_say("--threads: this BLAS cannot be told; set OPENBLAS_NUM_THREADS");
  setup_data(r);
  const int B = o->batch;
  check(hvd_sampler_create(r->train.n, size, rank, 1, o->seed, 1, &r->sampler),
        "hvd_sampler_create", hvd_last_error());
  r->per_epoch = hvd_sampler_num_samples(r->sampler) / B;
  if (r->per_epoch < 1) {
    if (rank == 0)
      cli_say("%lld training images make no step of %d images on %d ranks",
              (long long)r->train.n, B, size);
    return 1;
  }
  r->steps = o->steps > 0 ? o->steps : o->epochs * r->per_epoch;
  setup_model(r);
  setup_start(r); /* the steps again: a resumed job's */
  if (rank == 0 && !o->quiet)
    print_setup(r);
  if (rank == 0 && o->log_json != NULL &&
      (r->log = fopen(o->log_json, r->start > 0 ? "a" : "w")) == NULL)
    cli_say("--log-json: cannot open '%s': %s", o->log_json, strerror(errno));
  r->x = malloc(sizeof(float) * (size_t)B * CNN_PIXELS);
  r->y = malloc(sizeof(int32_t) * (size_t)B);
  r->t0 = now();
  r->ready = (ready_ctx_t){.opt = r->opt};
  return 0;
}

/* The end of an epoch: the test set, in shards of B images per rank
 * (batch norm's running statistics), and rank 0's line; after the last
 * step also its summary. */
static void end_epoch(run_t *r, int64_t s) {
  const int B = r->o.batch;
  const dataset_t *test = &r->test;
  double te[2] = {0, 0};
  for (int64_t i = (int64_t)rank * B; i < test->n; i += (int64_t)size * B) {
    int n = (int)(test->n - i < B ? test->n - i : B);
    int64_t ids[4096];
    for (int k = 0; k < n; k++)
      ids[k] = i + k;
    batch(test, ids, n, r->x, r->y);
    int c2;
    check(cnn_eval(r->m, r->x, n, r->y, &c2), "eval", "");
    te[0] += c2, te[1] += n;
  }
  sum_all("cifar_train.test", te, 2);
  const double *ep = r->ep;
  char acc[32] = "none (no test set)"; /* --synthetic-test 0 */
  if (te[1] > 0)
    snprintf(acc, sizeof acc, "%.3f", te[0] / te[1]);
  if (rank == 0 && !r->o.quiet) {
    printf("epoch %lld  loss %.4f  train accuracy %.3f  test accuracy "
           "%s  lr %g\n",
           (long long)r->epoch + 1, ep[0] / ep[2], ep[1] / ep[2], acc,
           lr_at(&r->o, s, r->steps));
    fflush(stdout);
  }
  if (s + 1 == r->steps && rank == 0) {
    double dt = now() - r->t0;
    printf("done  steps %lld  final loss %.4f  train accuracy %.3f  test "
           "accuracy %s  images/s %.0f  world size %d\n",
           (long long)r->steps, ep[0] / ep[2], ep[1] / ep[2], acc,
           r->images / dt, size);
  }
  r->ep[0] = r->ep[1] = r->ep[2] = 0;
}

/* This rank's list of epoch r->epoch from image r->consumed of its
 * order, and the steps it holds. */
static void deal_epoch(run_t *r) {
  check(hvd_sampler_epoch_from(r->sampler, r->epoch, r->consumed, &r->idx,
                               &r->count),
        "hvd_sampler_epoch_from", hvd_last_error());
  r->in_epoch = 0;
  r->left = r->count / r->o.batch;
}

/* The list at the start and when it is used up (the next epoch). A
 * checkpoint of a smaller global batch can leave fewer images of its
 * epoch than one step of this run takes: those are dropped, as every
 * epoch's tail is (drop_last), and the next epoch begins. An epoch holds
 * a step from its start (setup checked per_epoch). */
static void next_list(run_t *r) {
  if (!r->fetch && r->in_epoch != r->left)
    return;
  if (!r->fetch)
    r->epoch++, r->consumed = 0;
  r->fetch = 0;
  deal_epoch(r);
  if (r->left == 0 && r->consumed > 0) {
    if (rank == 0 && !r->o.quiet)
      printf(PROG ": the %lld images left of epoch %lld make no step of "
                  "%d: dropped, as an epoch's tail\n",
             (long long)(r->train.n - r->consumed), (long long)r->epoch + 1,
             size * r->o.batch);
    r->epoch++, r->consumed = 0;
    deal_epoch(r);
  }
}

/* One step, s (0-based): a batch of this rank's shard, forward and
 * backward, SGD, the loss summed over the ranks; the epoch's end and the
 * checkpoint it is due. */
static void train_step(run_t *r, int64_t s) {
  const options_t *o = &r->o;
  const int B = o->batch;
  next_list(r);
  batch(&r->train, r->idx + r->in_epoch * B, B, r->x, r->y);
  check(hvd_optimizer_set_lr(r->opt, lr_at(o, s, r->steps)), "lr",
        hvd_last_error());
  check(hvd_optimizer_zero_grad(r->opt), "zero_grad", hvd_last_error());
  double loss;
  int correct;
  check(cnn_forward(r->m, r->x, B, r->y, &loss, &correct), "forward",
        hvd_last_error());
  check(cnn_backward(r->m, on_ready, &r->ready), "backward", hvd_last_error());
  check(r->ready.rc, "hvd_optimizer_grad_ready", r->ready.msg);
  check(hvd_optimizer_step(r->opt), "hvd_optimizer_step", hvd_last_error());
  double st[2] = {loss * B, correct};
  sum_all("cifar_train.step", st, 2);
  r->ep[0] += st[0], r->ep[1] += st[1], r->ep[2] += (double)B * size;
  r->images += (double)B * size;
  if (r->log != NULL) {
    fprintf(r->log, "{\"step\":%lld,\"loss\":%.17g,\"lr\":%.9g}\n",
            (long long)(s + 1), st[0] / ((double)B * size),
            lr_at(o, s, r->steps));
    fflush(r->log);
  }
  r->in_epoch++;
  r->consumed += (int64_t)B * size;
  if (r->in_epoch == r->left || s + 1 == r->steps)
    end_epoch(r, s);
  if (o->checkpoint != NULL &&
      ((o->checkpoint_every > 0 && (s + 1) % o->checkpoint_every == 0) ||
       s + 1 == r->steps))
    save(r, s + 1);
}

/* Releases what setup made (what it did not make is NULL), then hvd. */
static void teardown(run_t *r) {
  if (r->log != NULL)
    fclose(r->log);
  free(r->x);
  free(r->y);
  hvd_optimizer_destroy(r->opt);
  free(r->kept);
  hvd_sampler_destroy(r->sampler);
  cnn_destroy(r->m);
  free(r->train.rec);
  free(r->test.rec);
  hvd_shutdown();
}

int main(int argc, char **argv) {
  static run_t run; /* zero: nothing made yet */
  parse(argc, argv, &run.o);
  if (hvd_init() != HVD_SUCCESS) {
    cli_say("hvd_init: %s", hvd_last_error());
    return 1;
  }
  rank = hvd_rank();
  size = hvd_size();
  int status = setup(&run);
  for (int64_t s = run.start; status == 0 && s < run.steps; s++)
    train_step(&run, s);
  teardown(&run);
  return status;
}
