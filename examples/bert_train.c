/*
 * bert_train.c - data-parallel pretraining of the BERT masked-language
 * model of examples/bert with hvd: the example that puts every piece of
 * the toolkit together (doc/bert_train.md is its manual).
 *
 *   bin/hvdrun -np 2 examples/bert_train            # tiny, synthetic data
 *   bin/hvdrun -np 4 examples/bert_train --preset mini --data corpus.txt \
 *       --steps 1000 --checkpoint ckpt --checkpoint-every 100
 *   bin/hvdrun -np 8 examples/bert_train --device gpu --preset base
 *
 * One step, on every rank:
 *   1. its micro-batches: rank r takes, from hvd_sampler's shard of this
 *      epoch's permutation, K consecutive runs of B indices (K =
 *      --accumulate, B = --batch-size); over the ranks that is always the
 *      same contiguous block of P*K*B positions of the permutation, so the
 *      global batch of a step does not depend on how it is split;
 *   2. the masked positions of the whole global batch, M, because the
 *      loss is the mean over all of them (counted locally, no collective:
 *      see count_global);
 *   3. per micro-batch: forward, backward with the loss weighted (see
 *      on_grad_ready); each gradient, once final, is handed to
 *      hvd_optimizer_grad_ready, which starts its reduction while the
 *      backward pass goes on;
 *   4. hvd_optimizer_step waits for the reductions and applies AdamW with
 *      the learning rate of the schedule.
 * Rank 0 prints progress and writes the JSON log; checkpoints are written
 * by rank 0 inside hvd_checkpoint_save. With --device gpu the model's
 * parameters, gradients and activations live on the GPU hvd_init bound
 * the rank to, and hvd reduces, broadcasts and saves them there.
 *
 * Exit status: 0 done; 1 a failure (data, checkpoint, hvd) on any rank,
 * reported before training when it can be; 2 a bad command line.
 *
 * A test hook, not an option (t/mpi/elastic.sh; hvdrun forwards HVD_*
 * variables to the ranks): HVD_TEST_KILL_AT=STEP:RANK makes rank RANK kill
 * itself with SIGKILL before step STEP, in the first HVD_TEST_KILL_LAUNCHES
 * launches of an elastic job (default 1).
 */
#include "cli.h"
#include "data.h"
#include "model.h"
#include "tokenizer.h"

#include <hvd.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define PROG "bert_train"
#define LAST_N 10    /* the final loss is the mean of this many steps */
#define SPARK_W 40   /* columns of the summary's loss sparkline */
#define SKIP_STEPS 2 /* steps left out of the mean throughput */
#define VOCAB_FILE "vocab.txt"

/* ---- options -------------------------------------------------------- */

/* A dimension flag, applied to the preset after all flags are read. */
typedef struct dim_flag {
  const char *flag; /* "--seq-len" */
  const char *key;  /* bert_config_set key: "seq_len" */
  const char *value;
} dim_flag_t;

typedef struct options {
  const char *preset;
  dim_flag_t dims[16];
  int ndims;
  int max_position_set;
  int64_t steps;
  double lr, weight_decay, beta1, beta2, eps;
  int64_t warmup; /* -1: steps / 10 */
  int no_sync;
  int dense_embeddings; /* --dense-embeddings */
  int host_fences;      /* --host-fences */
  int zero;             /* --zero 1: sharded AdamW state */
  hvd_compression_t compression;
  int accumulate;
  const char *data;
  int64_t sentences; /* synthetic corpus lines */
  const char *checkpoint;
  int64_t checkpoint_every;
  int keep;
  const char *resume;
  const char *log_json;
  const char *elastic;  /* --elastic FILE: the committed state */
  int64_t commit_every; /* --commit-every N (steps) */
  int save_every;       /* --save-every K (commits) */
  uint64_t seed;
  int threads;
  int gpu;  /* --device gpu */
  int tf32; /* --tf32 */
  int quiet;
} options_t;

static const char usage_text[] =
    "usage: " PROG " [options]\n"
    "  Pretrains BERT (masked-language model) with hvd; run it on N ranks\n"
    "  with bin/hvdrun -np N " PROG " or mpirun. Every option is optional.\n"
    "\n"
    "model (a preset, then per-dimension overrides):\n"
    "  --preset NAME          tiny (default), mini or base\n"
    "  --layers N  --hidden N  --heads N  --ffn N  --seq-len N\n"
    "  --max-position N       position table rows (default: the preset's,\n"
    "                         raised to --seq-len when that is longer)\n"
    "  --vocab-size N         cap of the vocabulary built from the data\n"
    "  --batch-size N         sequences per rank and micro-batch\n"
    "\n"
    "training:\n"
    "  --steps N              optimizer steps (default 1000)\n"
    "  --lr X                 peak learning rate (default 0.002)\n"
    "  --warmup-steps N       linear warmup, then linear decay to 0\n"
    "                         (default steps/10)\n"
    "  --weight-decay X       AdamW decoupled weight decay (default 0.01)\n"
    "  --beta1 X --beta2 X --eps X   AdamW (default 0.9, 0.999, 1e-8)\n"
    "  --accumulate K         backward passes per step (default 1)\n"
    "  --zero 1               ZeRO stage 1: each rank keeps the AdamW state\n"
    "                         of its 1/N block of every parameter (cpu)\n"
    "  --no-sync              no gradient reduction: each rank trains on\n"
    "                         its own (the compute ceiling)\n"
    "  --dense-embeddings     cpu: reduce the word embeddings' gradient\n"
    "                         whole at the end of backward, as other\n"
    "                         parameters (default: the decoder's share\n"
    "                         early, the input lookup's rows allgathered)\n"
    "  --host-fences          gpu: hand each gradient to hvd only after the\n"
    "                         host saw its stage finish (an event per\n"
    "                         stage), not at once with hvd ordering the\n"
    "                         collective on the device (for comparison)\n"
    "  --fp16-allreduce       gradients travel as float16\n"
    "  --bf16-allreduce       gradients travel as bfloat16\n"
    "  --seed N               weights, data, masking, order (default 42)\n"
    "  --threads N            BLAS threads per rank (default 1)\n"
    "  --device cpu|gpu       where the model runs (default cpu); gpu: the\n"
    "                         GPU hvd binds each rank to (cuBLAS, CUDA)\n"
    "  --tf32                 gpu: TF32 tensor cores for the float32 matrix\n"
    "                         products (default: plain float32)\n"
    "\n"
    "data:\n"
    "  --data FILE            UTF-8 text, one sentence or document per\n"
    "                         line (default: the built-in synthetic corpus)\n"
    "  --synthetic-lines N    lines of the synthetic corpus (default 20000)\n"
    "\n"
    "checkpoints and logs:\n"
    "  --checkpoint DIR       write DIR/step-NNNNNN.ckpt (and DIR/" VOCAB_FILE
    ")\n"
    "  --checkpoint-every N   every N steps (and after the last one)\n"
    "  --keep N               keep only the newest N checkpoints (0: all)\n"
    "  --resume PATH          continue from a checkpoint file, or from the\n"
    "                         newest one in directory PATH\n"
    "  --log-json FILE        one JSON record per step (rank 0; with %r in\n"
    "                         FILE, every rank to its own, %r its rank)\n"
    "elastic training (with hvdrun --max-restarts, doc/elastic.md):\n"
    "  --elastic FILE         commit the model, AdamW and the position in\n"
    "                         the data to FILE; a relaunched job resumes\n"
    "                         from its newest commit, at any world size\n"
    "  --commit-every N       commit every N steps (default 1)\n"
    "  --save-every K         write every K-th commit to FILE (default 1)\n"
    "  --quiet                no progress lines, only the summary\n"
    "  -h, --help             this text\n"
    "\n"
    "Exit status: 0 done, 1 failure, 2 bad command line.\n";

/* The wording of this program's messages (examples/util/cli.h). */
static const cli_t cli = {.prog = PROG, .hint = "\nTry '" PROG " --help'."};

enum {
  O_PRESET = 256,
  O_LAYERS,
  O_HIDDEN,
  O_HEADS,
  O_FFN,
  O_SEQ_LEN,
  O_MAX_POSITION,
  O_VOCAB_SIZE,
  O_BATCH_SIZE,
  O_STEPS,
  O_LR,
  O_WARMUP,
  O_WEIGHT_DECAY,
  O_BETA1,
  O_BETA2,
  O_EPS,
  O_ACCUMULATE,
  O_ZERO,
  O_NO_SYNC,
  O_DENSE_EMB,
  O_HOST_FENCES,
  O_FP16,
  O_BF16,
  O_SEED,
  O_THREADS,
  O_DEVICE,
  O_TF32,
  O_DATA,
  O_SENTENCES,
  O_CHECKPOINT,
  O_CHECKPOINT_EVERY,
  O_KEEP,
  O_RESUME,
  O_LOG_JSON,
  O_ELASTIC,
  O_COMMIT_EVERY,
  O_SAVE_EVERY,
  O_QUIET
};

static const struct option long_options[] = {
    {"preset", required_argument, NULL, O_PRESET},
    {"layers", required_argument, NULL, O_LAYERS},
    {"hidden", required_argument, NULL, O_HIDDEN},
    {"heads", required_argument, NULL, O_HEADS},
    {"ffn", required_argument, NULL, O_FFN},
    {"seq-len", required_argument, NULL, O_SEQ_LEN},
    {"max-position", required_argument, NULL, O_MAX_POSITION},
    {"vocab-size", required_argument, NULL, O_VOCAB_SIZE},
    {"batch-size", required_argument, NULL, O_BATCH_SIZE},
    {"steps", required_argument, NULL, O_STEPS},
    {"lr", required_argument, NULL, O_LR},
    {"warmup-steps", required_argument, NULL, O_WARMUP},
    {"weight-decay", required_argument, NULL, O_WEIGHT_DECAY},
    {"beta1", required_argument, NULL, O_BETA1},
    {"beta2", required_argument, NULL, O_BETA2},
    {"eps", required_argument, NULL, O_EPS},
    {"accumulate", required_argument, NULL, O_ACCUMULATE},
    {"zero", required_argument, NULL, O_ZERO},
    {"no-sync", no_argument, NULL, O_NO_SYNC},
    {"dense-embeddings", no_argument, NULL, O_DENSE_EMB},
    {"host-fences", no_argument, NULL, O_HOST_FENCES},
    {"fp16-allreduce", no_argument, NULL, O_FP16},
    {"bf16-allreduce", no_argument, NULL, O_BF16},
    {"seed", required_argument, NULL, O_SEED},
    {"threads", required_argument, NULL, O_THREADS},
    {"device", required_argument, NULL, O_DEVICE},
    {"tf32", no_argument, NULL, O_TF32},
    {"data", required_argument, NULL, O_DATA},
    {"synthetic-lines", required_argument, NULL, O_SENTENCES},
    {"checkpoint", required_argument, NULL, O_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, O_CHECKPOINT_EVERY},
    {"keep", required_argument, NULL, O_KEEP},
    {"resume", required_argument, NULL, O_RESUME},
    {"log-json", required_argument, NULL, O_LOG_JSON},
    {"elastic", required_argument, NULL, O_ELASTIC},
    {"commit-every", required_argument, NULL, O_COMMIT_EVERY},
    {"save-every", required_argument, NULL, O_SAVE_EVERY},
    {"quiet", no_argument, NULL, O_QUIET},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

static void add_dim(options_t *o, const char *flag, const char *key,
                    const char *value) {
  if (o->ndims == (int)(sizeof o->dims / sizeof o->dims[0]))
    cli_usage_error("too many model dimension options");
  o->dims[o->ndims].flag = flag;
  o->dims[o->ndims].key = key;
  o->dims[o->ndims].value = value;
  o->ndims++;
}

/* Reads the command line into o and the model config into c; exits 0
 * for --help and 2 for anything wrong (before hvd_init: no MPI needed). */
static void parse_options(int argc, char **argv, options_t *o,
                          bert_config_t *c) {
  cli_init(&cli);
  memset(o, 0, sizeof *o);
  o->preset = "tiny";
  o->steps = 1000;
  o->lr = 2e-3;
  o->warmup = -1;
  o->weight_decay = 0.01;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->accumulate = 1;
  o->compression = HVD_COMPRESS_NONE;
  o->sentences = 20000;
  o->seed = 42;
  o->threads = 1;

  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
    const char *a = optarg;
    switch (ch) {
    case 'h':
      fputs(usage_text, stdout);
      exit(0);
    case O_PRESET:
      o->preset = a;
      break;
    case O_LAYERS:
      add_dim(o, "--layers", "layers", a);
      break;
    case O_HIDDEN:
      add_dim(o, "--hidden", "hidden", a);
      break;
    case O_HEADS:
      add_dim(o, "--heads", "heads", a);
      break;
    case O_FFN:
      add_dim(o, "--ffn", "ffn", a);
      break;
    case O_SEQ_LEN:
      add_dim(o, "--seq-len", "seq_len", a);
      break;
    case O_MAX_POSITION:
      add_dim(o, "--max-position", "max_position", a);
      o->max_position_set = 1;
      break;
    case O_VOCAB_SIZE:
      add_dim(o, "--vocab-size", "vocab_size", a);
      break;
    case O_BATCH_SIZE:
      add_dim(o, "--batch-size", "batch", a);
      break;
    case O_STEPS:
      o->steps = cli_int("--steps", a, 1, INT32_MAX);
      break;
    case O_LR:
      o->lr = cli_real("--lr", a, 0, 1e3);
      break;
    case O_WARMUP:
      o->warmup = cli_int("--warmup-steps", a, 0, INT32_MAX);
      break;
    case O_WEIGHT_DECAY:
      o->weight_decay = cli_real("--weight-decay", a, 0, 1e3);
      break;
    case O_BETA1:
      o->beta1 = cli_real("--beta1", a, 0, 0.999999);
      break;
    case O_BETA2:
      o->beta2 = cli_real("--beta2", a, 0, 0.999999999);
      break;
    case O_EPS:
      o->eps = cli_real("--eps", a, 0, 1);
      break;
    case O_ACCUMULATE:
      o->accumulate = (int)cli_int("--accumulate", a, 1, 1024);
      break;
    case O_ZERO:
      o->zero = (int)cli_int("--zero", a, 0, 1);
      break;
    case O_NO_SYNC:
      o->no_sync = 1;
      break;
    case O_DENSE_EMB:
      o->dense_embeddings = 1;
      break;
    case O_HOST_FENCES:
      o->host_fences = 1;
      break;
    case O_FP16:
    case O_BF16:
      if (o->compression != HVD_COMPRESS_NONE)
        cli_usage_error("--fp16-allreduce and --bf16-allreduce exclude each "
                        "other");
      o->compression = ch == O_FP16 ? HVD_COMPRESS_FP16 : HVD_COMPRESS_BF16;
      break;
    case O_SEED:
      o->seed = (uint64_t)cli_int("--seed", a, 0, INT64_MAX);
      break;
    case O_THREADS:
      o->threads = (int)cli_int("--threads", a, 1, 1024);
      break;
    case O_DEVICE:
      if (strcmp(a, "cpu") != 0 && strcmp(a, "gpu") != 0)
        cli_usage_error("--device needs cpu or gpu, not '%s'", a);
      o->gpu = strcmp(a, "gpu") == 0;
      break;
    case O_TF32:
      o->tf32 = 1;
      break;
    case O_DATA:
      if (*a == '\0')
        cli_usage_error("--data needs a file name");
      o->data = a;
      break;
    case O_SENTENCES:
      o->sentences = cli_int("--synthetic-lines", a, 1, INT32_MAX);
      break;
    case O_CHECKPOINT:
      if (*a == '\0')
        cli_usage_error("--checkpoint needs a directory");
      o->checkpoint = a;
      break;
    case O_CHECKPOINT_EVERY:
      o->checkpoint_every = cli_int("--checkpoint-every", a, 1, INT32_MAX);
      break;
    case O_KEEP:
      o->keep = (int)cli_int("--keep", a, 0, INT32_MAX);
      break;
    case O_RESUME:
      if (*a == '\0')
        cli_usage_error("--resume needs a checkpoint file or directory");
      o->resume = a;
      break;
    case O_LOG_JSON:
      if (*a == '\0')
        cli_usage_error("--log-json needs a file name");
      o->log_json = a;
      break;
    case O_ELASTIC:
      if (*a == '\0')
        cli_usage_error("--elastic needs a state file name");
      o->elastic = a;
      break;
    case O_COMMIT_EVERY:
      o->commit_every = cli_int("--commit-every", a, 1, INT32_MAX);
      break;
    case O_SAVE_EVERY:
      o->save_every = (int)cli_int("--save-every", a, 1, INT32_MAX);
      break;
    case O_QUIET:
      o->quiet = 1;
      break;
    case ':':
      cli_usage_error("option '%s' needs a value", argv[optind - 1]);
      break;
    default:
      if (optopt != 0)
        cli_usage_error("unknown option '-%c'", optopt);
      cli_usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    cli_usage_error("unexpected argument '%s' (every setting is an option)",
                    argv[optind]);
  if (o->checkpoint_every > 0 && o->checkpoint == NULL)
    cli_usage_error("--checkpoint-every needs --checkpoint DIR");
  if ((o->commit_every > 0 || o->save_every > 0) && o->elastic == NULL)
    cli_usage_error("--commit-every and --save-every need --elastic FILE");
  if (o->elastic != NULL && o->resume != NULL)
    cli_usage_error("--elastic resumes from its own state: not with --resume");
  if (o->commit_every == 0)
    o->commit_every = 1;
  if (o->save_every == 0)
    o->save_every = 1;
  if (o->keep > 0 && o->checkpoint == NULL)
    cli_usage_error("--keep needs --checkpoint DIR");
  if (o->no_sync && o->compression != HVD_COMPRESS_NONE)
    cli_usage_error("--no-sync reduces nothing, so it takes no compression");
  if (o->tf32 && !o->gpu)
    cli_usage_error("--tf32 needs --device gpu");
  if (o->zero && o->no_sync)
    cli_usage_error(
        "--zero 1 shards what the reduction updates, so it takes no "
        "--no-sync");
  if (o->zero && o->compression != HVD_COMPRESS_NONE)
    cli_usage_error(
        "--zero 1 reduce-scatters float32 gradients: no compression");
  if (o->warmup < 0)
    o->warmup = o->steps / 10;
  if (o->warmup > o->steps)
    cli_usage_error("--warmup-steps %lld is more than --steps %lld",
                    (long long)o->warmup, (long long)o->steps);

  if (bert_config_preset(c, o->preset) != HVD_SUCCESS)
    cli_usage_error("unknown preset '%s' (tiny, mini or base)", o->preset);
  for (int i = 0; i < o->ndims; i++)
    if (bert_config_set(c, o->dims[i].key, o->dims[i].value) != HVD_SUCCESS)
      cli_usage_error("%s: %s", o->dims[i].flag, bert_last_error());
  if (!o->max_position_set && c->max_position < c->seq_len)
    c->max_position = c->seq_len;
  c->seed = o->seed;
  c->threads = o->threads;
  if (bert_config_check(c) != HVD_SUCCESS)
    cli_usage_error("%s", bert_last_error());
}

/* ---- the test hook ---------------------------------------------------- */

/* HVD_TEST_KILL_AT=STEP:RANK, HVD_TEST_KILL_LAUNCHES=L: a test's fault
 * (see the top of the file), read from the environment so that it stays
 * out of the options a user reads and copies. */
typedef struct kill_at {
  int64_t step; /* -1: none */
  int rank, launches;
} kill_at_t;

/* Reads the hook's variables into k; a malformed value is a usage error
 * (exit 2), as a bad option is. */
static void kill_at_read(kill_at_t *k) {
  const char *a = getenv("HVD_TEST_KILL_AT");
  const char *l = getenv("HVD_TEST_KILL_LAUNCHES");
  *k = (kill_at_t){.step = -1, .rank = 0, .launches = 1};
  if (l != NULL && *l != '\0')
    k->launches = (int)cli_int("HVD_TEST_KILL_LAUNCHES", l, 1, 1 << 20);
  if (a == NULL || *a == '\0')
    return;
  char step[32];
  const char *colon = strchr(a, ':');
  if (colon == NULL || colon == a || (size_t)(colon - a) >= sizeof step)
    cli_usage_error("HVD_TEST_KILL_AT needs STEP:RANK, not '%s'", a);
  snprintf(step, sizeof step, "%.*s", (int)(colon - a), a);
  k->step = cli_int("HVD_TEST_KILL_AT (step)", step, 0, INT64_MAX / 2);
  k->rank = (int)cli_int("HVD_TEST_KILL_AT (rank)", colon + 1, 0, 1 << 20);
}

/* Before step s: SIGKILL this rank if the hook says so. */
static void kill_at_step(const kill_at_t *k, int64_t s, int rank) {
  if (k->step != s || rank != k->rank || hvd_elastic_restarts() >= k->launches)
    return;
  cli_say(
      "HVD_TEST_KILL_AT %lld:%d: killing this rank (SIGKILL) before step %lld",
      (long long)s, rank, (long long)s);
  fflush(stdout);
  raise(SIGKILL);
}

/* ---- helpers ---------------------------------------------------------- */

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Ends the job on this rank: hvd_shutdown stops the engine everywhere, so
 * ranks waiting on this one fail instead of hanging. */
static void die(void) {
  hvd_shutdown();
  exit(1);
}

/* A failed hvd call that every rank sees alike (the collectives of
 * lib/optim agree on their result): rank 0 says it, everyone leaves. */
static void check_agreed(hvd_result_t rc, const char *what) {
  if (rc == HVD_SUCCESS)
    return;
  if (hvd_rank() == 0)
    cli_say("%s: %s", what, hvd_last_error());
  die();
}

/* A failure that may be this rank's alone: this rank says it. */
static void check_local(hvd_result_t rc, const char *what, const char *msg) {
  if (rc == HVD_SUCCESS)
    return;
  if (hvd_size() > 1)
    cli_say("rank %d: %s: %s", hvd_rank(), what, msg);
  else
    cli_say("%s: %s", what, msg);
  die();
}

/* Every rank says whether its part of a phase worked (ok) and, if not,
 * why (msg). Returns 1 on every rank when all worked; else the lowest
 * failing rank prints its message and every rank returns 0, so that no
 * rank goes on to a collective that another has left. */
static int agree(int ok, const char *msg) {
  int32_t v = ok ? hvd_size() : hvd_rank();
  int64_t one = 1;
  hvd_tensor_t t = hvd_tensor_make(&v, HVD_INT32, 1, &one);
  hvd_result_t rc =
      hvd_allreduce("bert_train.agree", &t, &t, HVD_MIN, 1.0, 1.0);
  check_local(rc, "agreeing with the other ranks", hvd_last_error());
  if (v == hvd_size())
    return 1;
  if (v == hvd_rank()) {
    if (v == 0)
      cli_say("%s", msg);
    else
      cli_say("rank %d: %s", (int)v, msg);
  }
  return 0;
}

/* FNV-1a over the vocabulary's tokens (each ended by a newline). */
static uint64_t vocab_hash(const bert_vocab_t *v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int i = 0; i < bert_vocab_size(v); i++) {
    for (const char *s = bert_vocab_token(v, i); *s != '\0'; s++)
      h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    h = (h ^ '\n') * 0x100000001b3ull;
  }
  return h;
}

/* Whether two vocabularies hold the same tokens; if not, why in msg. */
static int same_vocab(const bert_vocab_t *a, const bert_vocab_t *b,
                      const char *b_name, char *msg, size_t len) {
  int na = bert_vocab_size(a), nb = bert_vocab_size(b);
  for (int i = 0; i < na && i < nb; i++)
    if (strcmp(bert_vocab_token(a, i), bert_vocab_token(b, i)) != 0) {
      snprintf(msg, len,
               "the data's vocabulary differs from the checkpoint's (%s): "
               "token %d is '%s' here and '%s' there",
               b_name, i, bert_vocab_token(a, i), bert_vocab_token(b, i));
      return 0;
    }
  if (na != nb) {
    snprintf(msg, len,
             "the data's vocabulary has %d tokens, the checkpoint's (%s) %d",
             na, b_name, nb);
    return 0;
  }
  return 1;
}

/* "DIR/step-000005.ckpt" into buf. */
static void checkpoint_name(char *buf, size_t len, const char *dir,
                            int64_t step) {
  snprintf(buf, len, "%s/step-%06lld.ckpt", dir, (long long)step);
}

/* The step of a file name "step-NNNNNN.ckpt", or -1. */
static int64_t checkpoint_step(const char *name) {
  long long step;
  int end = 0;
  if (sscanf(name, "step-%lld.ckpt%n", &step, &end) == 1 && name[end] == '\0' &&
      step >= 0 && strncmp(name, "step-", 5) == 0 && name[5] >= '0' &&
      name[5] <= '9')
    return step;
  return -1;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* The steps of the checkpoints in dir up to step `upto`, ascending, into
 * *steps (malloc'ed, the caller frees; NULL when none). Returns their
 * count, or -1 (errno) when dir cannot be read. */
static int64_t list_checkpoints(const char *dir, int64_t upto,
                                int64_t **steps) {
  *steps = NULL;
  DIR *d = opendir(dir);
  if (d == NULL)
    return -1;
  int64_t *all = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    int64_t s = checkpoint_step(e->d_name);
    if (s < 0 || s > upto)
      continue;
    if (n == cap) {
      int64_t *p = realloc(all, (cap = cap ? 2 * cap : 16) * sizeof *all);
      if (p == NULL) {
        free(all);
        closedir(d);
        errno = ENOMEM;
        return -1;
      }
      all = p;
    }
    all[n++] = s;
  }
  closedir(d);
  if (n > 0)
    qsort(all, n, sizeof *all, cmp_i64);
  *steps = all;
  return (int64_t)n;
}

/* Rank 0, after saving step `upto`: removes all but the newest `keep`
 * checkpoints up to that step (newer files, of an earlier run, stay). */
static void prune_checkpoints(const char *dir, int64_t upto, int keep) {
  int64_t *steps;
  int64_t n = list_checkpoints(dir, upto, &steps);
  for (int64_t i = 0; i + keep < n; i++) {
    char old[4096];
    checkpoint_name(old, sizeof old, dir, steps[i]);
    if (remove(old) != 0)
      cli_say("cannot remove the old checkpoint '%s': %s", old,
              strerror(errno));
  }
  free(steps);
}

/* ---- the learning rate ------------------------------------------------ */

/* Of 0-based step s: (s + 1) / W of the peak during W warmup steps, then
 * a linear decay that would reach 0 at step T. */
static double lr_at(const options_t *o, int64_t s) {
  if (s < o->warmup)
    return o->lr * (double)(s + 1) / (double)o->warmup;
  return o->lr * (double)(o->steps - s) / (double)(o->steps - o->warmup);
}

/* ---- the gradient-ready callback ---------------------------------------- */

/* The loss of a step is the mean over the masked positions of the whole
 * global batch (what one process computing the whole batch would get),
 * but the model's backward pass yields the gradient of each micro-batch's
 * own mean. With M_j masked positions in micro-batch j of this rank and
 * M in the global batch, the global gradient is
 *     sum over ranks and passes of (M_j / M) g_j
 *   = average over P ranks and K passes of (P K M_j / M) g_j,
 * so pass j's gradient is weighted by w_j = P K M_j / M before the
 * distributed optimizer averages (and w_j = K M_j / M_rank with --no-sync).
 * The weight multiplies pass j's loss (bert_model_backward_scaled), so
 * the backward pass adds exactly w_j g_j to the gradients accumulated
 * over the K passes, with no pass over the gradient buffers (which may be
 * on a GPU). */
typedef struct ready_ctx {
  hvd_optimizer_t *opt;
  hvd_result_t rc;
  char msg[512]; /* the first failure's message */
  int64_t *rows; /* on_sparse_grad's token ids as int64 */
  int64_t cap;
} ready_ctx_t;

static void ready_failed(ready_ctx_t *r, hvd_result_t rc) {
  if (rc != HVD_SUCCESS && r->rc == HVD_SUCCESS) {
    r->rc = rc;
    snprintf(r->msg, sizeof r->msg, "%s", hvd_last_error());
  }
}

static void on_grad_ready(void *ctx, int i) {
  ready_ctx_t *r = ctx;
  ready_failed(r, hvd_optimizer_grad_ready(r->opt, i));
}

/* The word embeddings' lookup rows (bert_model_set_sparse_embeddings):
 * the decoder's share of their gradient was handed over first, so only
 * the batch's rows travel at the end of backward (an allgather). */
static void on_sparse_grad(void *ctx, int i, const int32_t *rows, int64_t n,
                           const float *values) {
  ready_ctx_t *r = ctx;
  if (n > r->cap) {
    int64_t *p = realloc(r->rows, (size_t)n * sizeof *p);
    if (p == NULL) {
      r->rc = HVD_ERR_NO_MEMORY;
      snprintf(r->msg, sizeof r->msg, "out of memory for %lld rows",
               (long long)n);
      return;
    }
    r->rows = p;
    r->cap = n;
  }
  for (int64_t k = 0; k < n; k++)
    r->rows[k] = rows[k];
  ready_failed(r, hvd_optimizer_sparse_grad(r->opt, i, r->rows, n, values));
}

/* ---- the global batch's masked positions ------------------------------- */

/* Weighting the gradients (above) needs M, the masked positions of the
 * whole global batch, before the backward pass. Rather than a blocking
 * allreduce per step, every rank counts them itself: hvd_sampler's
 * permutation of an epoch does not depend on the world size (rank r's
 * shard is its entries r, r + P, r + 2P, ...), so the global batch of
 * step s is the contiguous block [G s', G (s' + 1)) of the permutation
 * (s' the step within the epoch, G the global batch), and the masking is
 * a function of (seed, sample, epoch) that any rank can evaluate. */
typedef struct global_view {
  const bert_dataset_t *ds;
  hvd_sampler_t *whole; /* one rank: the epoch's whole permutation */
  int size, rank;
  int64_t epoch;
  const int64_t *order;            /* this epoch's permutation */
  int32_t *ids, *labels, *lengths; /* one global batch */
} global_view_t;

static int global_view_init(global_view_t *g, int64_t global_batch, int S) {
  size_t n = (size_t)global_batch * (size_t)S;
  g->ids = malloc(n * sizeof *g->ids);
  g->labels = malloc(n * sizeof *g->labels);
  g->lengths = malloc((size_t)global_batch * sizeof *g->lengths);
  return g->ids == NULL || g->labels == NULL || g->lengths == NULL ? -1 : 0;
}

/* Starts an epoch, checking that this rank's shard (mine, count) is what
 * the relation above says. */
static hvd_result_t global_view_epoch(global_view_t *g, int64_t epoch,
                                      int64_t from, const int64_t *mine,
                                      int64_t count) {
  int64_t n;
  hvd_result_t rc = hvd_sampler_epoch(g->whole, epoch, &g->order, &n);
  if (rc != HVD_SUCCESS)
    return rc;
  g->epoch = epoch;
  for (int64_t i = 0; i < count; i++)
    if (from + g->rank + i * g->size >= n ||
        mine[i] != g->order[from + g->rank + i * g->size])
      check_local(HVD_ERR_INTERNAL, "the global batch",
                  "this rank's shard is not every world-size-th index of the "
                  "epoch's permutation");
  return HVD_SUCCESS;
}

/* The masked positions of the G samples from position `first` of the
 * epoch's permutation into *masked. */
static hvd_result_t count_global(global_view_t *g, int64_t first, int64_t G,
                                 int64_t *masked) {
  int S = bert_dataset_seq_len(g->ds);
  hvd_result_t rc =
      bert_dataset_batch(g->ds, g->order + first, (int)G, g->epoch, g->ids,
                         NULL, g->labels, g->lengths);
  if (rc != HVD_SUCCESS)
    return rc;
  int64_t m = 0;
  for (int64_t t = 0; t < G * S; t++)
    m += g->labels[t] != BERT_LABEL_IGNORE;
  *masked = m;
  return HVD_SUCCESS;
}

/* ---- reporting ---------------------------------------------------------- */

typedef struct report {
  int64_t first_step, total_steps; /* steps of this run: first..total-1 */
  double start;                    /* of the loop */
  double last_print;
  int64_t tokens_since_print;
  double losses[LAST_N]; /* ring of the last losses */
  int64_t nlosses;
  double first_loss;
  int printed;               /* progress lines so far */
  double spark_sum[SPARK_W]; /* the run's losses, bucketed */
  int64_t spark_n[SPARK_W];
  int64_t timed_steps; /* after the first SKIP_STEPS */
  double timed_tokens, timed_seconds;
  FILE *json;
} report_t;

/* One --log-json record (nothing without a file); flushed, so that a job
 * killed later keeps its curve. */
static void json_step(FILE *json, int64_t s, double loss, double lr,
                      int64_t tokens, double step_time, double comm_wait) {
  if (json == NULL)
    return;
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  fprintf(json,
          "{\"step\":%lld,\"loss\":%.17g,\"lr\":%.9g,\"tokens\":%lld,"
          "\"step_time\":%.6f,\"comm_wait_time\":%.6f,\"wall\":%.3f}\n",
          (long long)(s + 1), loss, lr, (long long)tokens, step_time, comm_wait,
          (double)wall.tv_sec + wall.tv_nsec * 1e-9);
  fflush(json);
}

/* --log-json's file on this rank: the name itself on rank 0, or on every
 * rank the name with each "%r" replaced by the rank; 0: none here; -1
 * (errno ENAMETOOLONG, out holding the name as given): it does not fit. */
static int json_path(char *out, size_t len, const char *name, int rank) {
  if (name == NULL || (rank != 0 && strstr(name, "%r") == NULL))
    return 0;
  size_t at = 0;
  for (const char *c = name; *c != '\0'; c++) {
    if (at + 12 >= len) { /* room for a rank and the end */
      snprintf(out, len, "%s", name);
      errno = ENAMETOOLONG;
      return -1;
    }
    if (c[0] == '%' && c[1] == 'r') {
      at += (size_t)snprintf(out + at, len - at, "%d", rank);
      c++;
    } else {
      out[at++] = *c;
    }
  }
  out[at] = '\0';
  return 1;
}

static void report_step(report_t *r, const options_t *o, int64_t s, double loss,
                        double lr, int64_t tokens, double step_time,
                        double comm_wait) {
  double t = now();
  int64_t done = s + 1 - r->first_step;
  if (r->nlosses == 0)
    r->first_loss = loss;
  r->losses[r->nlosses++ % LAST_N] = loss;
  int64_t span = r->total_steps - r->first_step;
  if (span > 0 && isfinite(loss)) {
    int64_t b = (done - 1) * SPARK_W / span;
    r->spark_sum[b < SPARK_W ? b : SPARK_W - 1] += loss;
    r->spark_n[b < SPARK_W ? b : SPARK_W - 1]++;
  }
  if (done > SKIP_STEPS) {
    r->timed_steps++;
    r->timed_tokens += (double)tokens;
    r->timed_seconds += step_time;
  }
  json_step(r->json, s, loss, lr, tokens, step_time, comm_wait);
  r->tokens_since_print += tokens;
  /* every second, and the last step of a run that printed none yet */
  if (!o->quiet && (t - r->last_print >= 1.0 ||
                    (s + 1 == r->total_steps && r->printed == 0))) {
    double elapsed = t - r->start;
    double eta = elapsed / (double)done * (double)(r->total_steps - s - 1);
    printf("step %lld/%lld  loss %.4f  tokens/s %.0f  elapsed %.1fs  eta "
           "%.1fs\n",
           (long long)(s + 1), (long long)r->total_steps, loss,
           (double)r->tokens_since_print / (t - r->last_print), elapsed, eta);
    fflush(stdout);
    r->last_print = t;
    r->tokens_since_print = 0;
    r->printed++;
  }
}

/* The run's loss as one line of block characters, a column per bucket of
 * steps, low to high between the run's smallest and largest bucket means
 * ("" when there were fewer than 2 steps). */
static void sparkline(const report_t *r, char *out, size_t n) {
  static const char *const bars[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                      "\u2585", "\u2586", "\u2587", "\u2588"};
  double lo = INFINITY, hi = -INFINITY, m[SPARK_W];
  int cols = 0;
  out[0] = '\0';
  for (int b = 0; b < SPARK_W; b++)
    if (r->spark_n[b] > 0) {
      m[cols] = r->spark_sum[b] / (double)r->spark_n[b];
      lo = fmin(lo, m[cols]), hi = fmax(hi, m[cols]);
      cols++;
    }
  if (cols < 2)
    return;
  size_t at = 0;
  for (int c = 0; c < cols && at + 4 < n; c++) {
    int k = hi > lo ? (int)((m[c] - lo) / (hi - lo) * 7.999) : 0;
    at += (size_t)snprintf(out + at, n - at, "%s", bars[k]);
  }
}

static void report_done(const report_t *r, const options_t *o, int size,
                        double tokens_per_step, double total_time) {
  int64_t done = r->total_steps - r->first_step;
  int64_t k = r->nlosses < LAST_N ? r->nlosses : LAST_N;
  double sum = 0;
  for (int64_t i = 0; i < k; i++)
    sum += r->losses[i];
  double tps = r->timed_seconds > 0
                   ? r->timed_tokens / r->timed_seconds
                   : tokens_per_step * (double)done / total_time;
  char run[96] = "";
  if (r->first_step > 0) /* resumed: the steps are the job's */
    snprintf(run, sizeof run, " (%lld in this run, from step %lld)",
             (long long)done, (long long)r->first_step);
  char spark[4 * SPARK_W + 1];
  sparkline(r, spark, sizeof spark);
  printf("done  steps %lld%s  final loss %.4f (mean of last %lld)  tokens/s "
         "%.0f (mean, first %d steps excluded)  world size %d  preset %s  "
         "time %.1fs%s\n",
         (long long)r->total_steps, run, k > 0 ? sum / (double)k : NAN,
         (long long)k, tps, SKIP_STEPS, size, o->preset, total_time,
         o->no_sync ? "  (--no-sync: rank 0's own loss)" : "");
  if (spark[0] != '\0')
    printf("loss  %s  (%.4f to %.4f over this run's %lld steps)\n", spark,
           r->first_loss, r->losses[(r->nlosses - 1) % LAST_N],
           (long long)done);
  fflush(stdout);
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  options_t o;
  bert_config_t cfg;
  char msg[8192] = ""; /* room for a path and more */
  char path[4096];
  hvd_result_t rc;

  parse_options(argc, argv, &o, &cfg);
  kill_at_t kill;
  kill_at_read(&kill);
  if ((rc = hvd_init()) != HVD_SUCCESS) {
    cli_say("hvd_init: %s", hvd_last_error());
    return 1;
  }
  const int rank = hvd_rank(), size = hvd_size();

  /* --device gpu: the GPU hvd_init bound this rank to (or, with
   * HVD_NO_BIND=1, the current one) must be usable on every rank. */
  int device = HVD_CPU;
  if (o.gpu) {
    device = hvd_cuda_device();
    rc = bert_gpu_check(&device);
    snprintf(msg, sizeof msg, "--device gpu: %s", bert_last_error());
    if (!agree(rc == HVD_SUCCESS, msg))
      die();
    bert_set_tf32(o.tf32);
  }
  const int B = cfg.batch, S = cfg.seq_len, K = o.accumulate;
  const int sync = !o.no_sync;
  const int64_t global_batch = (int64_t)size * K * B; /* sequences */

  /* The data. Every rank reads the corpus and builds the vocabulary
   * itself: the tokenizer is deterministic, so all get the same ids
   * without a shared file system (checked below). */
  bert_data_options_t dopt;
  bert_data_options_init(&dopt);
  dopt.corpus_path = o.data;
  dopt.synthetic_sentences = o.sentences;
  dopt.seed = o.seed;
  dopt.seq_len = S;
  dopt.vocab_max = cfg.vocab_size;
  dopt.min_samples = global_batch;
  bert_dataset_t *ds = NULL;
  rc = bert_dataset_create(&dopt, &ds);
  if (rc != HVD_SUCCESS)
    snprintf(msg, sizeof msg, "%s%s%s", o.data != NULL ? "--data: " : "",
             bert_last_error(),
             strstr(bert_last_error(), "too small") == NULL
                 ? ""
                 : " (one global batch: --batch-size x ranks x --accumulate)");
  if (!agree(rc == HVD_SUCCESS, msg))
    die();
  const bert_vocab_t *vocab = bert_dataset_vocab(ds);
  const int64_t nsamples = bert_dataset_size(ds);
  {
    int64_t lo[2] = {(int64_t)vocab_hash(vocab), nsamples};
    int64_t hi[2] = {lo[0], lo[1]}, two = 2;
    hvd_tensor_t tl = hvd_tensor_make(lo, HVD_INT64, 1, &two);
    hvd_tensor_t th = hvd_tensor_make(hi, HVD_INT64, 1, &two);
    check_agreed(hvd_allreduce("bert_train.data.min", &tl, &tl, HVD_MIN, 1, 1),
                 "comparing the data of the ranks");
    check_agreed(hvd_allreduce("bert_train.data.max", &th, &th, HVD_MAX, 1, 1),
                 "comparing the data of the ranks");
    if (lo[0] != hi[0] || lo[1] != hi[1]) {
      if (rank == 0)
        cli_say("the ranks read different data (%lld to %lld samples, or other "
                "words): every rank needs the same --data file",
                (long long)lo[1], (long long)hi[1]);
      die();
    }
  }
  cfg.vocab_size = bert_vocab_size(vocab);

  /* Files rank 0 writes (and --log-json's on every rank with "%r"):
   * check them before training. */
  FILE *json = NULL;
  int ok = 1;
  char json_name[PATH_MAX];
  int jp = json_path(json_name, sizeof json_name, o.log_json, rank);
  if (jp != 0 &&
      (jp < 0 ||
       (json = fopen(json_name, o.resume != NULL || (o.elastic != NULL &&
                                                     hvd_elastic_restarts() > 0)
                                    ? "a" /* a resumed run: the curve goes on */
                                    : "w")) == NULL)) {
    snprintf(msg, sizeof msg, "--log-json: cannot open '%s': %s", json_name,
             strerror(errno));
    ok = 0;
  }
  if (ok && rank == 0 && o.checkpoint != NULL) {
    struct stat st;
    if (mkdir(o.checkpoint, 0777) != 0 &&
        !(errno == EEXIST && stat(o.checkpoint, &st) == 0 &&
          S_ISDIR(st.st_mode))) {
      snprintf(msg, sizeof msg, "--checkpoint: cannot make directory '%s': %s",
               o.checkpoint,
               errno == EEXIST ? "a file has that name" : strerror(errno));
      ok = 0;
    } else {
      snprintf(path, sizeof path, "%s/" VOCAB_FILE, o.checkpoint);
      if (bert_vocab_save(vocab, path) != HVD_SUCCESS) {
        snprintf(msg, sizeof msg, "--checkpoint: %s", bert_last_error());
        ok = 0;
      }
    }
  }
  if (!agree(ok, msg))
    die();

  /* The model and the optimizer: AdamW inside the distributed wrapper. */
  bert_model_t *model = NULL;
  rc = bert_model_create_on(&cfg, device, &model);
  check_local(rc, "bert_model_create", bert_last_error());
  int nparams;
  hvd_param_t *params = bert_model_params(model, &nparams);
  hvd_adam_options_t aopt;
  hvd_adam_options_init(&aopt);
  aopt.lr = lr_at(&o, 0);
  aopt.beta1 = o.beta1;
  aopt.beta2 = o.beta2;
  aopt.eps = o.eps;
  aopt.weight_decay = o.weight_decay;
  aopt.decoupled = 1;
  hvd_optimizer_t *adam = NULL, *opt = NULL;
  rc = hvd_adam_create(params, nparams, &aopt, &adam);
  check_local(rc, "hvd_adam_create", hvd_last_error());
  hvd_distributed_options_t dist;
  hvd_distributed_options_init(&dist);
  dist.compression = o.compression;
  dist.backward_passes_per_step = K;
  dist.shard_optimizer_state = o.zero;
  rc = hvd_distributed_optimizer(adam, &dist, &opt);
  check_local(rc, "hvd_distributed_optimizer", hvd_last_error());
  if (!sync)
    check_local(hvd_optimizer_set_sync(opt, 0), "hvd_optimizer_set_sync",
                hvd_last_error());

  /* The starting state: a checkpoint, or rank 0's initial weights. */
  int64_t start = 0;
  char resumed_from[4096] = "";
  if (o.resume != NULL) {
    const char *file = o.resume;
    ok = 1;
    if (rank == 0) {
      struct stat st;
      if (stat(o.resume, &st) == 0 && S_ISDIR(st.st_mode)) {
        int64_t *steps;
        int64_t k = list_checkpoints(o.resume, INT64_MAX, &steps);
        if (k > 0) {
          checkpoint_name(path, sizeof path, o.resume, steps[k - 1]);
          file = path;
        } else {
          snprintf(msg, sizeof msg, "--resume: %s '%s'",
                   k < 0 ? strerror(errno) : "no step-NNNNNN.ckpt in",
                   o.resume);
          ok = 0;
        }
        free(steps);
      }
      /* The vocabulary saved next to the checkpoint must be the one the
       * data gives now, or the token ids would mean other words. */
      char vpath[4096 + 16];
      const char *slash = strrchr(file, '/');
      snprintf(vpath, sizeof vpath, "%.*s" VOCAB_FILE,
               slash ? (int)(slash - file + 1) : 0, file);
      bert_vocab_t *saved = NULL;
      if (ok && stat(vpath, &st) == 0) {
        if (bert_vocab_load(vpath, &saved) != HVD_SUCCESS) {
          snprintf(msg, sizeof msg, "--resume: %s", bert_last_error());
          ok = 0;
        } else if (!same_vocab(vocab, saved, vpath, msg, sizeof msg)) {
          ok = 0;
        }
      }
      bert_vocab_destroy(saved);
    }
    if (!agree(ok, msg))
      die();
    snprintf(resumed_from, sizeof resumed_from, "%s", file);
    if ((rc = hvd_checkpoint_load(file, params, nparams, opt, &start)) !=
        HVD_SUCCESS) {
      if (rank == 0)
        cli_say("--resume: %s", hvd_last_error());
      die();
    }
  }
  /* --elastic: the newest committed state (a relaunched job), if any */
  hvd_state_t *state = NULL;
  int64_t c_step = 0, c_epoch = 0, c_consumed = 0;
  int restored = 0;
  if (o.elastic != NULL) {
    check_local(hvd_state_create(o.elastic, o.save_every, &state),
                "hvd_state_create", hvd_last_error());
    check_local(hvd_state_add_params(state, params, nparams, opt),
                "hvd_state_add_params", hvd_last_error());
    check_local(hvd_state_add_counter(state, "step", &c_step),
                "hvd_state_add_counter", hvd_last_error());
    check_local(hvd_state_add_counter(state, "epoch", &c_epoch),
                "hvd_state_add_counter", hvd_last_error());
    check_local(hvd_state_add_counter(state, "consumed", &c_consumed),
                "hvd_state_add_counter", hvd_last_error());
    check_agreed(hvd_state_restore(state, &restored), "--elastic");
    if (restored)
      start = c_step;
  }
  if (o.resume == NULL && !restored) {
    check_agreed(hvd_broadcast_parameters(params, nparams, 0),
                 "hvd_broadcast_parameters");
    check_agreed(hvd_broadcast_optimizer_state(opt, 0),
                 "hvd_broadcast_optimizer_state");
  }

  /* Each rank's shard; drop_last so that every rank has the same number
   * of steps per epoch, floor(N / (P K B)) whatever P. With (sync, P > 1)
   * also the whole permutation (a sampler of one rank), to count the
   * masked positions of the global batch (see count_global). */
  hvd_sampler_t *sampler = NULL, *whole = NULL;
  rc = hvd_sampler_create(nsamples, size, rank, 1, o.seed, 1, &sampler);
  check_local(rc, "hvd_sampler_create", hvd_last_error());
  const int count_all = sync && size > 1;
  if (count_all) {
    rc = hvd_sampler_create(nsamples, 1, 0, 1, o.seed, 1, &whole);
    check_local(rc, "hvd_sampler_create", hvd_last_error());
  }
  const int64_t per_epoch = hvd_sampler_num_samples(sampler) / ((int64_t)K * B);

  if (rank == 0) {
    char desc[256];
    bert_config_describe(&cfg, desc, sizeof desc);
    char where[64];
    if (o.gpu)
      snprintf(where, sizeof where, "GPU cuda:%d%s", device,
               o.tf32 ? " (TF32)" : "");
    else
      snprintf(where, sizeof where, "BLAS threads %d", o.threads);
    printf(PROG ": preset %s (%s), %lld weights; %d rank%s, %s\n", o.preset,
           desc, (long long)bert_model_num_weights(model), size,
           size == 1 ? "" : "s", where);
    printf(PROG ": data %s: %lld sequences of %d tokens, vocabulary %d; "
                "global batch %lld = %d per rank x %d rank%s x %d pass%s, %lld "
                "steps per epoch\n",
           o.data != NULL ? o.data : "synthetic", (long long)nsamples, S,
           cfg.vocab_size, (long long)global_batch, B, size,
           size == 1 ? "" : "s", K, K == 1 ? "" : "es", (long long)per_epoch);
    printf(PROG ": AdamW lr %g, warmup %lld then linear decay to 0 at step "
                "%lld, weight decay %g; gradients %s\n",
           o.lr, (long long)o.warmup, (long long)o.steps, o.weight_decay,
           !sync                                ? "not reduced (--no-sync)"
           : o.compression == HVD_COMPRESS_FP16 ? "averaged as float16"
           : o.compression == HVD_COMPRESS_BF16 ? "averaged as bfloat16"
                                                : "averaged as float32");
    printf(PROG ": optimizer state %.1f MiB on this rank%s\n",
           (double)hvd_optimizer_state_bytes(opt) / (1 << 20),
           o.zero ? " (sharded, --zero 1)" : "");
    if (o.resume != NULL)
      printf(PROG ": resumed at step %lld from %s\n", (long long)start,
             resumed_from);
    if (o.elastic != NULL && restored)
      printf(PROG ": restored the state committed after step %lld (epoch "
                  "%lld, sample %lld of its order) from %s; launch %d, the "
                  "last one had %d ranks\n",
             (long long)c_step, (long long)c_epoch, (long long)c_consumed,
             o.elastic, hvd_elastic_restarts() + 1,
             hvd_elastic_previous_size());
    else if (o.elastic != NULL)
      printf(PROG ": elastic: no committed state in %s: a fresh start\n",
             o.elastic);
    fflush(stdout);
  }
  if (start >= o.steps) {
    if (rank == 0)
      printf(PROG ": the checkpoint is at step %lld and --steps is %lld: "
                  "nothing to do\n",
             (long long)start, (long long)o.steps);
    hvd_state_destroy(state);
    hvd_sampler_destroy(sampler);
    hvd_sampler_destroy(whole);
    hvd_optimizer_destroy(opt);
    bert_model_destroy(model);
    bert_dataset_destroy(ds);
    if (json != NULL)
      fclose(json);
    hvd_shutdown();
    return 0;
  }

  /* Buffers of one step: K micro-batches of B sequences. */
  const size_t ntok = (size_t)K * B * S;
  int32_t *ids = malloc(ntok * sizeof *ids);
  int32_t *labels = malloc(ntok * sizeof *labels);
  int32_t *lengths = malloc((size_t)K * B * sizeof *lengths);
  int64_t *masked = malloc((size_t)K * sizeof *masked);
  global_view_t gv = {.ds = ds, .whole = whole, .size = size, .rank = rank};
  if (ids == NULL || labels == NULL || lengths == NULL || masked == NULL ||
      (count_all && global_view_init(&gv, global_batch, S) != 0))
    check_local(HVD_ERR_NO_MEMORY, "buffers", "out of memory");
  const int64_t tokens_per_step = global_batch * S;

  report_t rep;
  memset(&rep, 0, sizeof rep);
  rep.first_step = start;
  rep.total_steps = o.steps;
  rep.json = json;
  rep.start = rep.last_print = now();

  /* Where the data stands: the epoch, and how many samples of its order
   * the steps so far took (global batches of whatever world size ran
   * them); hvd_sampler_epoch_from deals out the rest. From a checkpoint's
   * step, at one world size, that is step / per_epoch and the steps into
   * the epoch times the global batch. */
  int64_t epoch = start / per_epoch,
          consumed = (start % per_epoch) * global_batch;
  if (restored)
    epoch = c_epoch, consumed = c_consumed;
  const int64_t *idx = NULL;
  int64_t count = 0, in_epoch = 0, left = 0; /* steps: done, left */
  int fetch = 1;
  ready_ctx_t ready = {.opt = opt, .rc = HVD_SUCCESS};
  bert_model_set_host_fences(model, o.host_fences);
  if (!o.gpu && !o.dense_embeddings && !o.zero) /* rows after grad_ready */
    check_local(bert_model_set_sparse_embeddings(model, on_sparse_grad, &ready),
                "bert_model_set_sparse_embeddings", bert_last_error());
  for (int64_t s = start; s < o.steps; s++) {
    double t0 = now();
    kill_at_step(&kill, s, rank);
    if (fetch || in_epoch == left) {
      if (!fetch)
        epoch++, consumed = 0;
      fetch = 0;
      check_local(
          hvd_sampler_epoch_from(sampler, epoch, consumed, &idx, &count),
          "hvd_sampler_epoch", hvd_last_error());
      in_epoch = 0;
      left = count / ((int64_t)K * B);
      if (count_all)
        check_local(global_view_epoch(&gv, epoch, consumed, idx, count),
                    "hvd_sampler_epoch", hvd_last_error());
      if (left == 0) /* fewer samples left than a global batch */
        check_local(HVD_ERR_INVALID_ARG, "the data",
                    "an epoch holds no step of this global batch");
    }
    /* This rank's K micro-batches and their masked positions. */
    int64_t local_masked = 0;
    for (int j = 0; j < K; j++) {
      const int64_t *first = idx + (in_epoch * K + j) * B;
      size_t off = (size_t)j * B * S;
      rc = bert_dataset_batch(ds, first, B, epoch, ids + off, NULL,
                              labels + off, lengths + (size_t)j * B);
      check_local(rc, "bert_dataset_batch", bert_last_error());
      masked[j] = 0;
      for (size_t t = 0; t < (size_t)B * S; t++)
        masked[j] += labels[off + t] != BERT_LABEL_IGNORE;
      local_masked += masked[j];
    }
    int64_t total_masked = local_masked, one = 1;
    if (count_all)
      check_local(count_global(&gv, consumed, global_batch, &total_masked),
                  "bert_dataset_batch", bert_last_error());
    const double lr = lr_at(&o, s);
    check_local(hvd_optimizer_set_lr(opt, lr), "hvd_optimizer_set_lr",
                hvd_last_error());
    check_local(hvd_optimizer_zero_grad(opt), "hvd_optimizer_zero_grad",
                hvd_last_error());

    double loss_sum = 0; /* sum of the masked positions' losses */
    hvd_request_t *loss_req = NULL;
    hvd_tensor_t loss_t = hvd_tensor_make(&loss_sum, HVD_FLOAT64, 1, &one);
    ready.rc = HVD_SUCCESS;
    for (int j = 0; j < K; j++) {
      size_t off = (size_t)j * B * S;
      bert_batch_t b = {.batch = B,
                        .seq_len = S,
                        .input_ids = ids + off,
                        .token_type_ids = NULL,
                        .lengths = lengths + (size_t)j * B,
                        .labels = labels + off};
      bert_output_t out;
      rc = bert_model_forward(model, &b, &out);
      check_local(rc, "bert_model_forward", bert_last_error());
      loss_sum += out.loss * (double)out.masked;
      if (j == K - 1 && sync && size > 1) /* overlaps the last backward */
        check_local(hvd_allreduce_async("bert_train.loss", &loss_t, &loss_t,
                                        HVD_SUM, 1, 1, &loss_req),
                    "summing the loss", hvd_last_error());
      double w = (double)(sync ? size : 1) * K * (double)masked[j] /
                 (double)(sync ? total_masked : local_masked);
      rc = bert_model_backward_scaled(model, (float)w, on_grad_ready, &ready);
      check_local(rc, "bert_model_backward", bert_last_error());
      check_local(ready.rc, "hvd_optimizer_grad_ready", ready.msg);
    }
    double tw = now();
    rc = hvd_optimizer_step(opt);
    double comm_wait = now() - tw;
    check_local(rc, "hvd_optimizer_step", hvd_last_error());
    if (loss_req != NULL)
      check_local(hvd_wait(loss_req), "summing the loss", hvd_last_error());
    const double loss = loss_sum / (double)(sync ? total_masked : local_masked);
    const double step_time = now() - t0; /* without the checkpoint */

    if (o.checkpoint != NULL &&
        ((o.checkpoint_every > 0 && (s + 1) % o.checkpoint_every == 0) ||
         s + 1 == o.steps)) {
      checkpoint_name(path, sizeof path, o.checkpoint, s + 1);
      check_agreed(hvd_checkpoint_save(path, params, nparams, opt, s + 1),
                   "hvd_checkpoint_save");
      if (rank == 0 && !o.quiet) {
        printf(PROG ": saved %s\n", path);
        fflush(stdout);
      }
      if (rank == 0 && o.keep > 0)
        prune_checkpoints(o.checkpoint, s + 1, o.keep);
    }
    in_epoch++;
    consumed += global_batch;
    if (state != NULL && ((s + 1) % o.commit_every == 0 || s + 1 == o.steps)) {
      c_step = s + 1;
      c_epoch = in_epoch == left ? epoch + 1 : epoch;
      c_consumed = in_epoch == left ? 0 : consumed;
      check_agreed(hvd_state_commit(state), "--elastic: hvd_state_commit");
    }
    if (rank == 0)
      report_step(&rep, &o, s, loss, lr, tokens_per_step, step_time, comm_wait);
    else
      json_step(json, s, loss, lr, tokens_per_step, step_time, comm_wait);
  }
  double total_time = now() - rep.start;
  if (rank == 0)
    report_done(&rep, &o, size, (double)tokens_per_step, total_time);

  if (json != NULL && fclose(json) != 0)
    fprintf(stderr, PROG "[%d]: --log-json: writing '%s': %s\n", rank,
            json_name, strerror(errno));
  free(ids);
  free(labels);
  free(lengths);
  free(masked);
  free(gv.ids);
  free(gv.labels);
  free(gv.lengths);
  hvd_state_destroy(state);
  hvd_sampler_destroy(sampler);
  hvd_sampler_destroy(whole);
  hvd_optimizer_destroy(opt);
  free(ready.rows);
  bert_model_destroy(model);
  bert_dataset_destroy(ds);
  hvd_shutdown();
  return 0;
}
