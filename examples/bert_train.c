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
  int lamb;             /* --optimizer lamb (else AdamW) */
  int zero;             /* --zero 1: sharded optimizer state */
  double clip;          /* --clip-grad-norm X (0: off) */
  const char *no_decay; /* --no-decay A,B: names holding A or B: decay 0 */
  hvd_compression_t compression; /* from wire and powersgd_rank */
  hvd_dtype_t wire;  /* --fp16-allreduce, --bf16-allreduce (with --powersgd:
                        its P, Q and whole gradients) */
  int powersgd_rank; /* --powersgd R (compression POWERSGD), else 0 */
  int64_t powersgd_start;  /* --powersgd-start N (-1: the library's 1000) */
  int adasum;              /* --adasum (op HVD_ADASUM) */
  int local_sgd;           /* --local-sgd P: the period, else 0 */
  int64_t local_sgd_start; /* --local-sgd-start N (default 0) */
  int local_sgd_node;      /* --local-sgd-group node (1, default) | none */
  int accumulate;
  const char *data;
  int64_t sentences; /* synthetic corpus lines */
  const char *checkpoint;
  int64_t checkpoint_every;
  int checkpoint_async; /* --checkpoint-async */
  int keep;
  const char *resume;
  const char *log_json;
  const char *elastic;   /* --elastic FILE: the committed state */
  int64_t commit_every;  /* --commit-every N (steps) */
  int save_every;        /* --save-every K (commits) */
  int commit_background; /* --commit-background: file commits written by a
                            thread (hvd_state_set_background) */
  uint64_t seed;
  int threads;
  int gpu;       /* --device gpu */
  int tf32;      /* --tf32 */
  int precision; /* --precision: bert_precision_t, -1 the device's default */
  int graphs;    /* --cuda-graphs */
  int plain;     /* --plain-kernels */
  int flash;     /* --flash-attention */
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
    "  --optimizer NAME       adamw (default) or lamb (apex's FusedLAMB: a\n"
    "                         trust ratio per parameter, for large batches)\n"
    "  --weight-decay X       decoupled weight decay (default 0.01)\n"
    "  --beta1 X --beta2 X --eps X   (default 0.9, 0.999, and eps 1e-8 for\n"
    "                         AdamW, 1e-6 for LAMB)\n"
    "  --accumulate K         backward passes per step (default 1)\n"
    "  --zero 1               ZeRO stage 1: each rank keeps the optimizer "
    "state\n"
    "                         of its 1/N block of every parameter (cpu)\n"
    "  --clip-grad-norm X     clip the averaged gradients to a global L2\n"
    "                         norm of X before each update (default 0: off)\n"
    "  --no-decay A,B         no weight decay for the parameters whose names\n"
    "                         hold A or B (BERT's recipe: "
    "bias,LayerNorm.weight;\n"
    "                         default: every parameter decays, as torch's)\n"
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
    "  --fp16-allreduce       gradients travel as float16 (with --powersgd:\n"
    "                         its factors and the whole gradients)\n"
    "  --bf16-allreduce       gradients travel as bfloat16 (likewise)\n"
    "  --powersgd R           PowerSGD at rank R (DDP's powerSGD_hook): each\n"
    "                         matrix's gradient averaged as two rank-R\n"
    "                         factors, with error feedback\n"
    "  --powersgd-start N     plain averaging for the first N steps\n"
    "                         (default 1000, DDP's start_powerSGD_iter)\n"
    "  --adasum               gradients combined by Adasum (Horovod's\n"
    "                         op=hvd.Adasum), not averaged; whole float32\n"
    "                         gradients (implies --dense-embeddings)\n"
    "  --local-sgd P          post-local SGD (DDP's post_localSGD_hook):\n"
    "                         after --local-sgd-start N steps (default 0),\n"
    "                         gradients are averaged only within each node\n"
    "                         (--local-sgd-group node, the default) or not\n"
    "                         at all (none), and the parameters over every\n"
    "                         rank after every P-th step; float32 wire\n"
    "  --seed N               weights, data, masking, order (default 42)\n"
    "  --threads N            BLAS threads per rank (default 1)\n"
    "  --device cpu|gpu       where the model runs (default cpu); gpu: the\n"
    "                         GPU hvd binds each rank to (cuBLAS, CUDA)\n"
    "  --tf32                 gpu: TF32 tensor cores for the float32 matrix\n"
    "                         products (default: plain float32)\n"
    "  --precision P          fp32, bf16 or fp16: parameters, gradients and\n"
    "                         activations (default bf16 on a GPU, fp32 on\n"
    "                         the CPU); bf16/fp16 keep float32 master\n"
    "                         weights in AdamW, fp16 scales the loss; on\n"
    "                         the CPU they are a numerical model of it;\n"
    "                         --tf32 alone means fp32\n"
    "  --cuda-graphs          gpu: each encoder layer's forward and backward\n"
    "                         as one CUDA graph (experimental: off by\n"
    "                         default)\n"
    "  --plain-kernels        gpu, bf16/fp16: each linear's bias in a pass\n"
    "                         of its own and the attention's heads copied\n"
    "                         (default: the bias in cuBLASLt's epilogue,\n"
    "                         the heads read where they are); to compare\n"
    "  --flash-attention      gpu, bf16/fp16, heads of 64, S >= 70: flash\n"
    "                         attention, no S*S scores in memory\n"
    "                         (experimental: off by default)\n"
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
    "  --checkpoint-async     write each checkpoint in the background\n"
    "                         (hvd_checkpoint_save_async): training goes on\n"
    "                         while rank 0 writes its copy\n"
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
    "  --commit-background    write FILE in the background: a commit\n"
    "                         returns once rank 0 holds the file's bytes\n"
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
  O_OPTIMIZER,
  O_ACCUMULATE,
  O_ZERO,
  O_CLIP,
  O_NO_DECAY,
  O_NO_SYNC,
  O_DENSE_EMB,
  O_HOST_FENCES,
  O_FP16,
  O_BF16,
  O_POWERSGD,
  O_POWERSGD_START,
  O_ADASUM,
  O_LOCAL_SGD,
  O_LOCAL_SGD_START,
  O_LOCAL_SGD_GROUP,
  O_SEED,
  O_THREADS,
  O_DEVICE,
  O_TF32,
  O_PRECISION,
  O_GRAPHS,
  O_PLAIN,
  O_FLASH,
  O_DATA,
  O_SENTENCES,
  O_CHECKPOINT,
  O_CHECKPOINT_EVERY,
  O_KEEP,
  O_CHECKPOINT_ASYNC,
  O_RESUME,
  O_LOG_JSON,
  O_ELASTIC,
  O_COMMIT_EVERY,
  O_SAVE_EVERY,
  O_COMMIT_BACKGROUND,
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
    {"optimizer", required_argument, NULL, O_OPTIMIZER},
    {"accumulate", required_argument, NULL, O_ACCUMULATE},
    {"zero", required_argument, NULL, O_ZERO},
    {"clip-grad-norm", required_argument, NULL, O_CLIP},
    {"no-decay", required_argument, NULL, O_NO_DECAY},
    {"no-sync", no_argument, NULL, O_NO_SYNC},
    {"dense-embeddings", no_argument, NULL, O_DENSE_EMB},
    {"host-fences", no_argument, NULL, O_HOST_FENCES},
    {"fp16-allreduce", no_argument, NULL, O_FP16},
    {"bf16-allreduce", no_argument, NULL, O_BF16},
    {"powersgd", required_argument, NULL, O_POWERSGD},
    {"powersgd-start", required_argument, NULL, O_POWERSGD_START},
    {"adasum", no_argument, NULL, O_ADASUM},
    {"local-sgd", required_argument, NULL, O_LOCAL_SGD},
    {"local-sgd-start", required_argument, NULL, O_LOCAL_SGD_START},
    {"local-sgd-group", required_argument, NULL, O_LOCAL_SGD_GROUP},
    {"seed", required_argument, NULL, O_SEED},
    {"threads", required_argument, NULL, O_THREADS},
    {"device", required_argument, NULL, O_DEVICE},
    {"tf32", no_argument, NULL, O_TF32},
    {"precision", required_argument, NULL, O_PRECISION},
    {"cuda-graphs", no_argument, NULL, O_GRAPHS},
    {"plain-kernels", no_argument, NULL, O_PLAIN},
    {"flash-attention", no_argument, NULL, O_FLASH},
    {"data", required_argument, NULL, O_DATA},
    {"synthetic-lines", required_argument, NULL, O_SENTENCES},
    {"checkpoint", required_argument, NULL, O_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, O_CHECKPOINT_EVERY},
    {"keep", required_argument, NULL, O_KEEP},
    {"checkpoint-async", no_argument, NULL, O_CHECKPOINT_ASYNC},
    {"resume", required_argument, NULL, O_RESUME},
    {"log-json", required_argument, NULL, O_LOG_JSON},
    {"elastic", required_argument, NULL, O_ELASTIC},
    {"commit-every", required_argument, NULL, O_COMMIT_EVERY},
    {"save-every", required_argument, NULL, O_SAVE_EVERY},
    {"commit-background", no_argument, NULL, O_COMMIT_BACKGROUND},
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

/* A value that names a file or a directory: not empty. */
/* The model's options: the preset and its dimensions. Each returns 1 when
 * option ch was one of its own, 0 when not. */
static int model_option(options_t *o, int ch, const char *a) {
  static const struct {
    int ch;
    const char *flag, *key;
  } dims[] = {{O_LAYERS, "--layers", "layers"},
              {O_HIDDEN, "--hidden", "hidden"},
              {O_HEADS, "--heads", "heads"},
              {O_FFN, "--ffn", "ffn"},
              {O_SEQ_LEN, "--seq-len", "seq_len"},
              {O_MAX_POSITION, "--max-position", "max_position"},
              {O_VOCAB_SIZE, "--vocab-size", "vocab_size"},
              {O_BATCH_SIZE, "--batch-size", "batch"}};
  if (ch == O_PRESET) {
    o->preset = a;
    return 1;
  }
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (dims[i].ch == ch) {
      add_dim(o, dims[i].flag, dims[i].key, a);
      o->max_position_set |= ch == O_MAX_POSITION;
      return 1;
    }
  return 0;
}

/* The schedule and AdamW. */
static int optimizer_option(options_t *o, int ch, const char *a) {
  switch (ch) {
  case O_STEPS:
    o->steps = cli_int("--steps", a, 1, INT32_MAX);
    return 1;
  case O_LR:
    o->lr = cli_real("--lr", a, 0, 1e3);
    return 1;
  case O_WARMUP:
    o->warmup = cli_int("--warmup-steps", a, 0, INT32_MAX);
    return 1;
  case O_WEIGHT_DECAY:
    o->weight_decay = cli_real("--weight-decay", a, 0, 1e3);
    return 1;
  case O_BETA1:
    o->beta1 = cli_real("--beta1", a, 0, 0.999999);
    return 1;
  case O_BETA2:
    o->beta2 = cli_real("--beta2", a, 0, 0.999999999);
    return 1;
  case O_EPS:
    o->eps = cli_real("--eps", a, 0, 1);
    return 1;
  case O_OPTIMIZER:
    if (strcmp(a, "adamw") != 0 && strcmp(a, "lamb") != 0)
      cli_usage_error("--optimizer needs adamw or lamb, not '%s'", a);
    o->lamb = strcmp(a, "lamb") == 0;
    return 1;
  case O_ACCUMULATE:
    o->accumulate = (int)cli_int("--accumulate", a, 1, 1024);
    return 1;
  case O_ZERO:
    o->zero = (int)cli_int("--zero", a, 0, 1);
    return 1;
  case O_CLIP:
    o->clip = cli_real("--clip-grad-norm", a, 0, 1e9);
    return 1;
  case O_NO_DECAY:
    o->no_decay = cli_name("--no-decay", a, "comma-separated name parts");
    return 1;
  }
  return 0;
}

/* How the gradients travel, and where and how the model runs. */
static int run_option(options_t *o, int ch, const char *a) {
  switch (ch) {
  case O_NO_SYNC:
    o->no_sync = 1;
    return 1;
  case O_DENSE_EMB:
    o->dense_embeddings = 1;
    return 1;
  case O_HOST_FENCES:
    o->host_fences = 1;
    return 1;
  case O_FP16:
  case O_BF16: { /* the same one twice is said once */
    hvd_dtype_t wire = ch == O_FP16 ? HVD_FLOAT16 : HVD_BFLOAT16;
    if (o->wire != HVD_FLOAT32 && o->wire != wire)
      cli_usage_error("--fp16-allreduce and --bf16-allreduce exclude each "
                      "other");
    o->wire = wire;
    return 1;
  }
  case O_POWERSGD:
    o->powersgd_rank = (int)cli_int("--powersgd", a, 1, 1024);
    return 1;
  case O_POWERSGD_START:
    o->powersgd_start = cli_int("--powersgd-start", a, 0, INT64_MAX);
    return 1;
  case O_ADASUM: /* whole gradients: no rows after grad_ready */
    o->adasum = o->dense_embeddings = 1;
    return 1;
  case O_LOCAL_SGD:
    o->local_sgd = (int)cli_int("--local-sgd", a, 1, INT32_MAX);
    return 1;
  case O_LOCAL_SGD_START:
    o->local_sgd_start = cli_int("--local-sgd-start", a, 0, INT64_MAX);
    return 1;
  case O_LOCAL_SGD_GROUP:
    if (strcmp(a, "node") != 0 && strcmp(a, "none") != 0)
      cli_usage_error("--local-sgd-group is node or none, not '%s'", a);
    o->local_sgd_node = strcmp(a, "node") == 0;
    return 1;
  case O_SEED:
    o->seed = (uint64_t)cli_int("--seed", a, 0, INT64_MAX);
    return 1;
  case O_THREADS:
    o->threads = (int)cli_int("--threads", a, 1, 1024);
    return 1;
  case O_DEVICE:
    if (strcmp(a, "cpu") != 0 && strcmp(a, "gpu") != 0)
      cli_usage_error("--device needs cpu or gpu, not '%s'", a);
    o->gpu = strcmp(a, "gpu") == 0;
    return 1;
  case O_TF32:
    o->tf32 = 1;
    return 1;
  case O_GRAPHS:
    o->graphs = 1;
    return 1;
  case O_PLAIN:
    o->plain = 1;
    return 1;
  case O_FLASH:
    o->flash = 1;
    return 1;
  case O_PRECISION:
    if ((o->precision = bert_precision_parse(a)) < 0)
      cli_usage_error("--precision needs fp32, bf16 or fp16, not '%s'", a);
    return 1;
  case O_QUIET:
    o->quiet = 1;
    return 1;
  }
  return 0;
}

/* The data, checkpoints, logs and the elastic state. */
static int file_option(options_t *o, int ch, const char *a) {
  switch (ch) {
  case O_DATA:
    o->data = cli_name("--data", a, "a file name");
    return 1;
  case O_SENTENCES:
    o->sentences = cli_int("--synthetic-lines", a, 1, INT32_MAX);
    return 1;
  case O_CHECKPOINT:
    o->checkpoint = cli_name("--checkpoint", a, "a directory");
    return 1;
  case O_CHECKPOINT_EVERY:
    o->checkpoint_every = cli_int("--checkpoint-every", a, 1, INT32_MAX);
    return 1;
  case O_KEEP:
    o->keep = (int)cli_int("--keep", a, 0, INT32_MAX);
    return 1;
  case O_CHECKPOINT_ASYNC:
    o->checkpoint_async = 1;
    return 1;
  case O_RESUME:
    o->resume = cli_name("--resume", a, "a checkpoint file or directory");
    return 1;
  case O_LOG_JSON:
    o->log_json = cli_name("--log-json", a, "a file name");
    return 1;
  case O_ELASTIC:
    o->elastic = cli_name("--elastic", a, "a state file name");
    return 1;
  case O_COMMIT_EVERY:
    o->commit_every = cli_int("--commit-every", a, 1, INT32_MAX);
    return 1;
  case O_SAVE_EVERY:
    o->save_every = (int)cli_int("--save-every", a, 1, INT32_MAX);
    return 1;
  case O_COMMIT_BACKGROUND:
    o->commit_background = 1;
    return 1;
  }
  return 0;
}

/* --local-sgd reduces plain gradients, and its other options need it. */
static void check_local_sgd(options_t *o) {
  if (o->local_sgd == 0 && (o->local_sgd_start >= 0 || o->local_sgd_node >= 0))
    cli_usage_error("--local-sgd-%s needs --local-sgd P",
                    o->local_sgd_start >= 0 ? "start" : "group");
  if (o->local_sgd > 0 &&
      (o->zero || o->adasum || o->compression != HVD_COMPRESS_NONE))
    cli_usage_error("--local-sgd averages plain gradients: no %s",
                    o->zero     ? "--zero 1"
                    : o->adasum ? "--adasum"
                    : o->compression == HVD_COMPRESS_POWERSGD
                        ? "--powersgd"
                        : "--fp16-allreduce or --bf16-allreduce");
  if (o->local_sgd_start < 0)
    o->local_sgd_start = 0;
  if (o->local_sgd_node < 0)
    o->local_sgd_node = 1;
}

/* The options that depend on each other, and the defaults that depend on
 * others, once all are read. */
static void check_options(options_t *o) {
  o->compression = o->powersgd_rank > 0      ? HVD_COMPRESS_POWERSGD
                   : o->wire == HVD_FLOAT16  ? HVD_COMPRESS_FP16
                   : o->wire == HVD_BFLOAT16 ? HVD_COMPRESS_BF16
                                             : HVD_COMPRESS_NONE;
  if (o->eps < 0) /* torch's AdamW, apex's FusedLAMB */
    o->eps = o->lamb ? 1e-6 : 1e-8;
  if (o->checkpoint_every > 0 && o->checkpoint == NULL)
    cli_usage_error("--checkpoint-every needs --checkpoint DIR");
  if ((o->commit_every > 0 || o->save_every > 0 || o->commit_background) &&
      o->elastic == NULL)
    cli_usage_error("--commit-every, --save-every and --commit-background "
                    "need --elastic FILE");
  if (o->elastic != NULL && o->resume != NULL)
    cli_usage_error("--elastic resumes from its own state: not with --resume");
  if (o->commit_every == 0)
    o->commit_every = 1;
  if (o->save_every == 0)
    o->save_every = 1;
  if ((o->keep > 0 || o->checkpoint_async) && o->checkpoint == NULL)
    cli_usage_error("%s needs --checkpoint DIR",
                    o->keep > 0 ? "--keep" : "--checkpoint-async");
  if (o->no_sync && o->compression != HVD_COMPRESS_NONE)
    cli_usage_error("--no-sync reduces nothing, so it takes no compression");
  if (o->no_sync && (o->adasum || o->local_sgd > 0))
    cli_usage_error("--no-sync reduces nothing, so it takes no %s",
                    o->adasum ? "--adasum" : "--local-sgd");
  if (o->tf32 && !o->gpu)
    cli_usage_error("--tf32 needs --device gpu");
  if (o->graphs && !o->gpu)
    cli_usage_error("--cuda-graphs needs --device gpu");
  if (o->plain && !o->gpu)
    cli_usage_error("--plain-kernels needs --device gpu");
  if (o->flash && !o->gpu)
    cli_usage_error("--flash-attention needs --device gpu");
  if (o->precision < 0) /* TF32 speeds up float32: --tf32 means it */
    o->precision = o->gpu && !o->tf32 ? BERT_BF16 : BERT_FP32;
  if (o->tf32 && o->precision != BERT_FP32)
    cli_usage_error("--tf32 is for float32 products: not with --precision %s",
                    bert_precision_name(o->precision));
  if (o->dense_embeddings && !o->adasum && o->precision != BERT_FP32)
    cli_usage_error("--dense-embeddings: --precision %s has dense "
                    "embeddings only",
                    bert_precision_name(o->precision));
  if (o->zero && o->no_sync)
    cli_usage_error("--zero 1 shards what the reduction updates, so it takes "
                    "no --no-sync");
  if (o->zero && o->compression != HVD_COMPRESS_NONE)
    cli_usage_error("--zero 1 reduce-scatters float32 gradients: no "
                    "compression");
  if (o->powersgd_start >= 0 && o->compression != HVD_COMPRESS_POWERSGD)
    cli_usage_error("--powersgd-start needs --powersgd R");
  if (o->adasum && (o->compression != HVD_COMPRESS_NONE || o->zero))
    cli_usage_error("--adasum combines whole float32 gradients: no %s",
                    o->zero ? "--zero 1"
                    : o->compression == HVD_COMPRESS_POWERSGD
                        ? "--powersgd"
                        : "--fp16-allreduce or --bf16-allreduce");
  check_local_sgd(o);
  if (o->warmup < 0)
    o->warmup = o->steps / 10;
  if (o->warmup > o->steps)
    cli_usage_error("--warmup-steps %lld is more than --steps %lld",
                    (long long)o->warmup, (long long)o->steps);
}

/* The model config: the preset, then the dimension options in order. */
static void configure_model(const options_t *o, bert_config_t *c) {
  if (bert_config_preset(c, o->preset) != HVD_SUCCESS)
    cli_usage_error("unknown preset '%s' (tiny, mini or base)", o->preset);
  for (int i = 0; i < o->ndims; i++)
    if (bert_config_set(c, o->dims[i].key, o->dims[i].value) != HVD_SUCCESS)
      cli_usage_error("%s: %s", o->dims[i].flag, bert_last_error());
  if (c->vocab_size <= BERT_NUM_SPECIAL) /* the cap of the built one */
    cli_usage_error("--vocab-size %d leaves no room for words beside the %d "
                    "special tokens",
                    c->vocab_size, BERT_NUM_SPECIAL);
  if (!o->max_position_set && c->max_position < c->seq_len)
    c->max_position = c->seq_len;
  c->seed = o->seed;
  c->threads = o->threads;
  c->precision = o->precision;
  if (bert_config_check(c) != HVD_SUCCESS)
    cli_usage_error("%s", bert_last_error());
}

/* Reads the command line into o and the model config into c; exits 0
 * for --help and 2 for anything wrong (before hvd_init: no MPI needed). */
static void parse_options(int argc, char **argv, options_t *o,
                          bert_config_t *c) {
  cli_init(&cli);
  *o = (options_t){.preset = "tiny",
                   .steps = 1000,
                   .lr = 2e-3,
                   .warmup = -1,
                   .weight_decay = 0.01,
                   .beta1 = 0.9,
                   .beta2 = 0.999,
                   .eps = -1, /* the optimizer's */
                   .accumulate = 1,
                   .compression = HVD_COMPRESS_NONE,
                   .wire = HVD_FLOAT32,
                   .powersgd_start = -1,
                   .local_sgd_start = -1,
                   .local_sgd_node = -1,
                   .sentences = 20000,
                   .seed = 42,
                   .threads = 1,
                   .precision = -1};
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", long_options, NULL)) != -1) {
    if (ch == 'h') {
      fputs(usage_text, stdout);
      exit(0);
    }
    if (ch == ':')
      cli_usage_error("option '%s' needs a value", argv[optind - 1]);
    if (model_option(o, ch, optarg) || optimizer_option(o, ch, optarg) ||
        run_option(o, ch, optarg) || file_option(o, ch, optarg))
      continue;
    if (optopt != 0)
      cli_usage_error("unknown option '-%c'", optopt);
    cli_usage_error("unknown option '%s'", argv[optind - 1]);
  }
  if (optind < argc)
    cli_usage_error("unexpected argument '%s' (every setting is an option)",
                    argv[optind]);
  check_options(o);
  configure_model(o, c);
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
  int said_no_loss; /* the note on a step with no masked token */
} report_t;

/* One step's numbers for the log: its loss, learning rate, tokens, time
 * to the loss, time in hvd_optimizer_step, and the gradient norm before
 * clipping (NAN: no clipping, or a skipped step). */
typedef struct step_rec {
  double loss; /* NAN when no token was masked (masked 0) */
  double lr;
  int64_t tokens, masked; /* masked: the tokens the loss is the mean of */
  double step_time, comm_wait, grad_norm;
} step_rec_t;

/* x as a JSON number with `digits` significant digits into out, or null
 * where JSON has no number for it (NaN, infinities). */
static const char *json_num(char *out, size_t n, int digits, double x) {
  if (isfinite(x))
    snprintf(out, n, "%.*g", digits, x);
  else
    snprintf(out, n, "null");
  return out;
}

/* One --log-json record (nothing without a file); flushed, so that a job
 * killed later keeps its curve. A loss that is no number (no masked
 * token, or a diverged run) is null. */
static void json_step(FILE *json, int64_t s, const step_rec_t *x) {
  if (json == NULL)
    return;
  struct timespec wall;
  char norm[48] = "", loss[32], lr[32];
  clock_gettime(CLOCK_REALTIME, &wall);
  if (isfinite(x->grad_norm))
    snprintf(norm, sizeof norm, ",\"grad_norm\":%.17g", x->grad_norm);
  fprintf(json,
          "{\"step\":%lld,\"loss\":%s,\"lr\":%s,\"tokens\":%lld,"
          "\"step_time\":%.6f,\"comm_wait_time\":%.6f%s,\"wall\":%.3f}\n",
          (long long)(s + 1), json_num(loss, sizeof loss, 17, x->loss),
          json_num(lr, sizeof lr, 9, x->lr), (long long)x->tokens, x->step_time,
          x->comm_wait, norm, (double)wall.tv_sec + wall.tv_nsec * 1e-9);
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

/* A step whose batch has no masked token has no loss (a mean over no
 * token): said once, and left out of the losses the report shows. */
static void no_loss_note(report_t *r, int64_t s) {
  if (r->said_no_loss)
    return;
  r->said_no_loss = 1;
  printf(PROG ": step %lld masks no token ([UNK] is never masked): it has "
              "no loss (null in --log-json, left out of the summary); said "
              "once\n",
         (long long)(s + 1));
  fflush(stdout);
}

static void report_step(report_t *r, const options_t *o, int64_t s,
                        const step_rec_t *x) {
  const double loss = x->loss, step_time = x->step_time;
  const int64_t tokens = x->tokens;
  double t = now();
  int64_t done = s + 1 - r->first_step;
  if (x->masked == 0) {
    no_loss_note(r, s);
  } else {
    if (r->nlosses == 0)
      r->first_loss = loss;
    r->losses[r->nlosses++ % LAST_N] = loss;
  }
  int64_t span = r->total_steps - r->first_step;
  if (span > 0 && isfinite(loss)) {
    int64_t b = (done - 1) * SPARK_W / span;
    r->spark_sum[b < SPARK_W ? b : SPARK_W - 1] += loss;
    r->spark_n[b < SPARK_W ? b : SPARK_W - 1]++;
  }
  if (done == SKIP_STEPS) { /* HVD_GPU_TIMING: the timed steps only */
    hvd_gpu_timing_t gt;
    (void)hvd_gpu_timing(&gt, 1);
  }
  if (done > SKIP_STEPS) {
    r->timed_steps++;
    r->timed_tokens += (double)tokens;
    r->timed_seconds += step_time;
  }
  json_step(r->json, s, x);
  r->tokens_since_print += tokens;
  /* every second, and the last step of a run that printed none yet */
  if (!o->quiet && (t - r->last_print >= 1.0 ||
                    (s + 1 == r->total_steps && r->printed == 0))) {
    double elapsed = t - r->start;
    double eta = elapsed / (double)done * (double)(r->total_steps - s - 1);
    char shown[32] = "-"; /* no masked token */
    if (x->masked > 0)
      snprintf(shown, sizeof shown, "%.4f", loss);
    printf("step %lld/%lld  loss %s  tokens/s %.0f  elapsed %.1fs  eta "
           "%.1fs\n",
           (long long)(s + 1), (long long)r->total_steps, shown,
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

/* With HVD_GPU_TIMING=1 (doc/gpu-testing.md), what hvd's device groups of
 * the timed steps did: nothing when it is off or no group ran. */
static void report_gpu_timing(void) {
  hvd_gpu_timing_t t;
  if (hvd_gpu_timing(&t, 0) != HVD_SUCCESS || t.groups == 0)
    return;
  printf("gpu timing  %lld device groups in the timed steps  busy %.3fs  "
         "idle between groups %.3fs  of which hvd's lag %.3fs (max %.2f "
         "ms)\n",
         (long long)t.groups, t.busy_s, t.idle_s, t.lag_s, t.max_lag_s * 1e3);
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
  char spark[4 * SPARK_W + 1], final[64] = "- (no step masked a token)";
  sparkline(r, spark, sizeof spark);
  if (k > 0)
    snprintf(final, sizeof final, "%.4f (mean of last %lld)", sum / (double)k,
             (long long)k);
  printf("done  steps %lld%s  final loss %s  tokens/s %.0f (mean, first %d "
         "steps excluded)  world size %d  preset %s  time %.1fs%s\n",
         (long long)r->total_steps, run, final, tps, SKIP_STEPS, size,
         o->preset, total_time,
         o->no_sync ? "  (--no-sync: rank 0's own loss)" : "");
  if (spark[0] != '\0')
    printf("loss  %s  (%.4f to %.4f over this run's %lld steps)\n", spark,
           r->first_loss, r->losses[(r->nlosses - 1) % LAST_N],
           (long long)done);
  report_gpu_timing();
  fflush(stdout);
}

/* ---- the run ------------------------------------------------------------ */

/* Everything a run holds: made by the setup functions below, used by the
 * steps, released by teardown (the one way out of a run that worked; a
 * failure ends the job at once, in die). */
typedef struct run {
  options_t o;
  bert_config_t cfg;
  kill_at_t kill;
  int rank, size, device; /* device: HVD_CPU or the rank's GPU */
  int B, S, K, sync;      /* --batch-size, --seq-len, --accumulate */
  int count_all;          /* counts the global batch's masked positions */
  int64_t global_batch;   /* sequences of a step, over every rank */
  int64_t tokens_per_step, nsamples, per_epoch;
  char msg[8192]; /* a failure's message: room for a path and more */
  char path[4096];
  bert_dataset_t *ds;
  const bert_vocab_t *vocab;
  FILE *json; /* --log-json's file on this rank, or NULL */
  char json_name[PATH_MAX];
  bert_model_t *model;
  hvd_param_t *params;
  int nparams;
  int no_decay;                     /* parameters --no-decay exempts */
  hvd_optimizer_t *opt;             /* AdamW inside the distributed wrapper */
  hvd_process_set_t *node_set;      /* --local-sgd's group: this node's ranks */
  hvd_checkpoint_request_t *saving; /* --checkpoint-async's in flight */
  int64_t saving_step;              /* its step */
  int64_t start;                    /* the first step of this run */
  char resumed_from[4096];
  hvd_state_t *state;                  /* --elastic's, or NULL */
  int64_t c_step, c_epoch, c_consumed; /* its counters */
  int restored;                        /* from a commit */
  hvd_sampler_t *sampler, *whole;      /* this rank's shard; all (gv) */
  int32_t *ids, *labels, *lengths;     /* one step: K micro-batches of B */
  int64_t *masked;                     /* per micro-batch */
  global_view_t gv;
  ready_ctx_t ready;
  report_t rep;
  /* Where the data stands: the epoch, how many samples of its order the
   * steps so far took, this rank's list for the rest of it and the steps
   * done and left in that list. */
  int64_t epoch, consumed;
  const int64_t *idx;
  int64_t count, in_epoch, left;
  int fetch; /* the list is still to be dealt */
} run_t;

/* --device gpu: the GPU hvd_init bound this rank to (or, with
 * HVD_NO_BIND=1, the current one) must be usable on every rank. */
static void setup_device(run_t *r) {
  r->device = HVD_CPU;
  if (!r->o.gpu)
    return;
  r->device = hvd_cuda_device();
  hvd_result_t rc = bert_gpu_check(&r->device);
  snprintf(r->msg, sizeof r->msg, "--device gpu: %s", bert_last_error());
  if (!agree(rc == HVD_SUCCESS, r->msg))
    die();
  bert_set_tf32(r->o.tf32);
  bert_set_cuda_graphs(r->o.graphs);
  bert_set_plain_kernels(r->o.plain);
  bert_set_flash_attention(r->o.flash);
}

/* The data. Every rank reads the corpus and builds the vocabulary itself:
 * the tokenizer is deterministic, so all get the same ids without a
 * shared file system (compared here, by a hash, over the ranks). */
static void setup_data(run_t *r) {
  bert_data_options_t dopt;
  bert_data_options_init(&dopt);
  dopt.corpus_path = r->o.data;
  dopt.synthetic_sentences = r->o.sentences;
  dopt.seed = r->o.seed;
  dopt.seq_len = r->S;
  dopt.vocab_max = r->cfg.vocab_size;
  dopt.min_samples = r->global_batch;
  hvd_result_t rc = bert_dataset_create(&dopt, &r->ds);
  const char *e = bert_last_error();
  if (rc != HVD_SUCCESS)
    snprintf(r->msg, sizeof r->msg, "%s%s%s",
             r->o.data != NULL ? "--data: " : "", e,
             strstr(e, "too small") == NULL
                 ? ""
                 : " (one global batch: --batch-size x ranks x --accumulate)");
  if (!agree(rc == HVD_SUCCESS, r->msg))
    die();
  r->vocab = bert_dataset_vocab(r->ds);
  r->nsamples = bert_dataset_size(r->ds);
  int64_t lo[2] = {(int64_t)vocab_hash(r->vocab), r->nsamples};
  int64_t hi[2] = {lo[0], lo[1]}, two = 2;
  hvd_tensor_t tl = hvd_tensor_make(lo, HVD_INT64, 1, &two);
  hvd_tensor_t th = hvd_tensor_make(hi, HVD_INT64, 1, &two);
  check_agreed(hvd_allreduce("bert_train.data.min", &tl, &tl, HVD_MIN, 1, 1),
               "comparing the data of the ranks");
  check_agreed(hvd_allreduce("bert_train.data.max", &th, &th, HVD_MAX, 1, 1),
               "comparing the data of the ranks");
  if (lo[0] != hi[0] || lo[1] != hi[1]) {
    if (r->rank == 0)
      cli_say("the ranks read different data (%lld to %lld samples, or other "
              "words): every rank needs the same --data file",
              (long long)lo[1], (long long)hi[1]);
    die();
  }
  r->cfg.vocab_size = bert_vocab_size(r->vocab);
}

/* --checkpoint's directory and the vocabulary in it (rank 0); 0 and why
 * in r->msg when that fails. */
static int make_checkpoint_dir(run_t *r) {
  struct stat st;
  const char *dir = r->o.checkpoint;
  if (mkdir(dir, 0777) != 0 &&
      !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode))) {
    snprintf(r->msg, sizeof r->msg,
             "--checkpoint: cannot make directory '%s': %s", dir,
             errno == EEXIST ? "a file has that name" : strerror(errno));
    return 0;
  }
  snprintf(r->path, sizeof r->path, "%s/" VOCAB_FILE, dir);
  if (bert_vocab_save(r->vocab, r->path) != HVD_SUCCESS) {
    snprintf(r->msg, sizeof r->msg, "--checkpoint: %s", bert_last_error());
    return 0;
  }
  return 1;
}

/* Files rank 0 writes (and --log-json's on every rank with "%r"): checked
 * before training. A resumed run appends to its log: the curve goes on. */
static void open_outputs(run_t *r) {
  int ok = 1;
  int append = r->o.resume != NULL ||
               (r->o.elastic != NULL && hvd_elastic_restarts() > 0);
  int jp = json_path(r->json_name, sizeof r->json_name, r->o.log_json, r->rank);
  if (jp != 0 &&
      (jp < 0 || (r->json = fopen(r->json_name, append ? "a" : "w")) == NULL)) {
    snprintf(r->msg, sizeof r->msg, "--log-json: cannot open '%s': %s",
             r->json_name, strerror(errno));
    ok = 0;
  }
  if (ok && r->rank == 0 && r->o.checkpoint != NULL)
    ok = make_checkpoint_dir(r);
  if (!agree(ok, r->msg))
    die();
}

/* Whether name holds one of the comma-separated parts of list (HF's
 * `any(nd in name for nd in no_decay)`). */
static int name_has_part(const char *name, const char *list) {
  for (const char *p = list; *p != '\0';) {
    size_t n = strcspn(p, ",");
    char part[256];
    if (n > 0 && n < sizeof part) {
      memcpy(part, p, n);
      part[n] = '\0';
      if (strstr(name, part) != NULL)
        return 1;
    }
    p += n + (p[n] == ',');
  }
  return 0;
}

/* AdamW, or LAMB with --optimizer lamb, over the model's parameters. */
static hvd_optimizer_t *base_optimizer(run_t *r) {
  const options_t *o = &r->o;
  hvd_optimizer_t *base = NULL;
  if (o->lamb) {
    hvd_lamb_options_t lopt;
    hvd_lamb_options_init(&lopt);
    lopt.lr = lr_at(o, 0);
    lopt.beta1 = o->beta1;
    lopt.beta2 = o->beta2;
    lopt.eps = o->eps;
    lopt.weight_decay = o->weight_decay;
    check_local(hvd_lamb_create(r->params, r->nparams, &lopt, &base),
                "hvd_lamb_create", hvd_last_error());
    return base;
  }
  hvd_adam_options_t aopt;
  hvd_adam_options_init(&aopt);
  aopt.lr = lr_at(o, 0);
  aopt.beta1 = o->beta1;
  aopt.beta2 = o->beta2;
  aopt.eps = o->eps;
  aopt.weight_decay = o->weight_decay;
  aopt.decoupled = 1;
  check_local(hvd_adam_create(r->params, r->nparams, &aopt, &base),
              "hvd_adam_create", hvd_last_error());
  return base;
}

/* The model and the optimizer: AdamW or LAMB inside the distributed
 * wrapper. */
static void setup_model(run_t *r) {
  const options_t *o = &r->o;
  check_local(bert_model_create_on(&r->cfg, r->device, &r->model),
              "bert_model_create", bert_last_error());
  r->params = bert_model_params(r->model, &r->nparams);
  hvd_optimizer_t *base = base_optimizer(r);
  hvd_distributed_options_t dist;
  hvd_distributed_options_init(&dist);
  dist.compression = o->compression;
  if (o->compression == HVD_COMPRESS_POWERSGD) { /* in float32, as DDP */
    dist.powersgd.rank = o->powersgd_rank;
    dist.powersgd.wire = o->wire; /* DDP's fp16_compress_wrapper */
    if (o->powersgd_start >= 0)
      dist.powersgd.start_step = o->powersgd_start;
    dist.reduce_fp32 = o->precision != BERT_FP32;
  }
  if (o->adasum) { /* float32 gradients: the masters' with bf16/fp16 */
    dist.op = HVD_ADASUM;
    dist.reduce_fp32 = o->precision != BERT_FP32;
  }
  dist.backward_passes_per_step = r->K;
  dist.shard_optimizer_state = o->zero;
  if (o->local_sgd > 0 && o->local_sgd_node) /* every rank, in one order */
    check_local(hvd_process_set_split_node(&r->node_set),
                "hvd_process_set_split_node", hvd_last_error());
  dist.local_sgd.period = o->local_sgd;
  dist.local_sgd.start_step = o->local_sgd_start;
  dist.local_sgd.group = r->node_set;
  check_local(hvd_distributed_optimizer(base, &dist, &r->opt),
              "hvd_distributed_optimizer", hvd_last_error());
  if (!r->sync)
    check_local(hvd_optimizer_set_sync(r->opt, 0), "hvd_optimizer_set_sync",
                hvd_last_error());
  if (o->precision == BERT_FP16) /* GradScaler's defaults */
    check_local(hvd_optimizer_set_loss_scaling(r->opt, NULL),
                "hvd_optimizer_set_loss_scaling", hvd_last_error());
  if (o->clip > 0) /* torch's clip_grad_norm_ between backward and step */
    check_local(hvd_optimizer_set_grad_clipping(r->opt, o->clip, 2),
                "hvd_optimizer_set_grad_clipping", hvd_last_error());
  r->no_decay = 0;
  for (int i = 0; o->no_decay != NULL && i < r->nparams; i++)
    if (name_has_part(r->params[i].name, o->no_decay)) {
      check_local(hvd_optimizer_set_param_weight_decay(r->opt, i, 0),
                  "hvd_optimizer_set_param_weight_decay", hvd_last_error());
      r->no_decay++;
    }
}

/* Rank 0: the checkpoint --resume names (the newest in a directory) into
 * *file, and whether the vocabulary saved next to it is the one the data
 * gives now (or the token ids would mean other words); 0 and why in
 * r->msg when not. */
static int resume_file(run_t *r, const char **file) {
  struct stat st;
  const char *dir = r->o.resume;
  int ok = 1;
  if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
    int64_t *steps;
    int64_t k = list_checkpoints(dir, INT64_MAX, &steps);
    if (k > 0) {
      checkpoint_name(r->path, sizeof r->path, dir, steps[k - 1]);
      *file = r->path;
    } else {
      snprintf(r->msg, sizeof r->msg, "--resume: %s '%s'",
               k < 0 ? strerror(errno) : "no step-NNNNNN.ckpt in", dir);
      ok = 0;
    }
    free(steps);
  }
  char vpath[4096 + 16];
  const char *slash = strrchr(*file, '/');
  snprintf(vpath, sizeof vpath, "%.*s" VOCAB_FILE,
           slash ? (int)(slash - *file + 1) : 0, *file);
  bert_vocab_t *saved = NULL;
  if (ok && stat(vpath, &st) == 0) {
    if (bert_vocab_load(vpath, &saved) != HVD_SUCCESS) {
      snprintf(r->msg, sizeof r->msg, "--resume: %s", bert_last_error());
      ok = 0;
    } else if (!same_vocab(r->vocab, saved, vpath, r->msg, sizeof r->msg)) {
      ok = 0;
    }
  }
  bert_vocab_destroy(saved);
  return ok;
}

/* --resume: the model and AdamW from a checkpoint, and its step. */
static void resume(run_t *r) {
  const char *file = r->o.resume;
  int ok = r->rank != 0 || resume_file(r, &file);
  if (!agree(ok, r->msg))
    die();
  snprintf(r->resumed_from, sizeof r->resumed_from, "%s", file);
  if (hvd_checkpoint_load(file, r->params, r->nparams, r->opt, &r->start) !=
      HVD_SUCCESS) {
    if (r->rank == 0)
      cli_say("--resume: %s", hvd_last_error());
    die();
  }
}

/* --elastic: the state to commit, and the newest committed one (a
 * relaunched job), if any. */
static void restore_elastic(run_t *r) {
  check_local(hvd_state_create(r->o.elastic, r->o.save_every, &r->state),
              "hvd_state_create", hvd_last_error());
  check_local(hvd_state_add_params(r->state, r->params, r->nparams, r->opt),
              "hvd_state_add_params", hvd_last_error());
  check_local(hvd_state_add_counter(r->state, "step", &r->c_step),
              "hvd_state_add_counter", hvd_last_error());
  check_local(hvd_state_add_counter(r->state, "epoch", &r->c_epoch),
              "hvd_state_add_counter", hvd_last_error());
  check_local(hvd_state_add_counter(r->state, "consumed", &r->c_consumed),
              "hvd_state_add_counter", hvd_last_error());
  if (r->o.commit_background)
    check_local(hvd_state_set_background(r->state, 1),
                "hvd_state_set_background", hvd_last_error());
  check_agreed(hvd_state_restore(r->state, &r->restored), "--elastic");
  if (r->restored)
    r->start = r->c_step;
}

/* The starting state: a checkpoint, a commit, or rank 0's initial
 * weights. */
static void setup_start(run_t *r) {
  if (r->o.resume != NULL)
    resume(r);
  if (r->o.elastic != NULL)
    restore_elastic(r);
  if (r->o.resume == NULL && !r->restored) {
    check_agreed(hvd_broadcast_parameters(r->params, r->nparams, 0),
                 "hvd_broadcast_parameters");
    check_agreed(hvd_broadcast_optimizer_state(r->opt, 0),
                 "hvd_broadcast_optimizer_state");
  }
}

/* Each rank's shard; drop_last so that every rank has the same number of
 * steps per epoch, floor(N / (P K B)) whatever P. With (sync, P > 1) also
 * the whole permutation (a sampler of one rank), to count the masked
 * positions of the global batch (see count_global). */
static void setup_samplers(run_t *r) {
  check_local(hvd_sampler_create(r->nsamples, r->size, r->rank, 1, r->o.seed, 1,
                                 &r->sampler),
              "hvd_sampler_create", hvd_last_error());
  r->count_all = r->sync && r->size > 1;
  if (r->count_all)
    check_local(
        hvd_sampler_create(r->nsamples, 1, 0, 1, r->o.seed, 1, &r->whole),
        "hvd_sampler_create", hvd_last_error());
  r->per_epoch = hvd_sampler_num_samples(r->sampler) / ((int64_t)r->K * r->B);
}

/* Rank 0's lines before training: the model, the data, the optimizer. */
static void print_setup(const run_t *r) {
  const options_t *o = &r->o;
  char desc[256], where[160];
  bert_config_describe(&r->cfg, desc, sizeof desc);
  const bert_config_t *c = &r->cfg;
  const char *flash = !o->flash ? ""
                      : bert_cuda_flash_fits(o->precision, c->seq_len, c->heads,
                                             c->hidden / c->heads)
                          ? ", flash attention"
                          : ", no flash attention here (it needs bf16 or "
                            "fp16, heads of 64, S >= 70)";
  if (o->gpu)
    snprintf(where, sizeof where, "GPU cuda:%d%s%s%s%s", r->device,
             o->tf32 ? " (TF32)" : "", o->graphs ? ", CUDA graphs" : "",
             o->plain ? ", plain kernels" : "", flash);
  else
    snprintf(where, sizeof where, "BLAS threads %d", o->threads);
  printf(PROG ": preset %s (%s), %lld weights; %d rank%s, %s\n", o->preset,
         desc, (long long)bert_model_num_weights(r->model), r->size,
         r->size == 1 ? "" : "s", where);
  printf(PROG ": data %s: %lld sequences of %d tokens, vocabulary %d; "
              "global batch %lld = %d per rank x %d rank%s x %d pass%s, %lld "
              "steps per epoch\n",
         o->data != NULL ? o->data : "synthetic", (long long)r->nsamples, r->S,
         r->cfg.vocab_size, (long long)r->global_batch, r->B, r->size,
         r->size == 1 ? "" : "s", r->K, r->K == 1 ? "" : "es",
         (long long)r->per_epoch);
  printf(PROG ": %s lr %g, warmup %lld then linear decay to 0 at step "
              "%lld, weight decay %g; gradients %s\n",
         o->lamb ? "LAMB" : "AdamW", o->lr, (long long)o->warmup,
         (long long)o->steps, o->weight_decay,
         !r->sync                              ? "not reduced (--no-sync)"
         : o->compression == HVD_COMPRESS_FP16 ? "averaged as float16"
         : o->compression == HVD_COMPRESS_BF16 ? "averaged as bfloat16"
         : o->compression == HVD_COMPRESS_POWERSGD
             ? (o->wire == HVD_FLOAT16
                    ? "averaged as float16, matrices by PowerSGD (below)"
                : o->wire == HVD_BFLOAT16
                    ? "averaged as bfloat16, matrices by PowerSGD (below)"
                    : "averaged as float32, matrices by PowerSGD (below)")
         : o->adasum ? "combined by Adasum as float32"
                     : "averaged as float32");
  if (r->sync && o->compression == HVD_COMPRESS_POWERSGD) {
    int64_t all = 0, sent = 0;
    (void)hvd_optimizer_compression_stats(r->opt, &all, &sent);
    printf(PROG ": PowerSGD at rank %d from step %lld, with error feedback "
                "and warm start: %lld of %lld gradient values a step (%.1fx "
                "fewer)\n",
           o->powersgd_rank,
           (long long)(o->powersgd_start >= 0 ? o->powersgd_start : 1000),
           (long long)sent, (long long)all,
           sent > 0 ? (double)all / (double)sent : 0.0);
  }
  if (o->local_sgd > 0)
    printf(PROG ": post-local SGD from step %lld: gradients %s, then the "
                "parameters averaged over all ranks every %d step%s\n",
           (long long)o->local_sgd_start,
           o->local_sgd_node ? "averaged within each node" : "not reduced",
           o->local_sgd, o->local_sgd == 1 ? "" : "s");
  printf(PROG ": optimizer state %.1f MiB on this rank%s\n",
         (double)hvd_optimizer_state_bytes(r->opt) / (1 << 20),
         o->zero ? " (sharded, --zero 1)" : "");
  if (o->clip > 0)
    printf(PROG ": gradients clipped to a global L2 norm of %g before each "
                "update\n",
           o->clip);
  if (o->no_decay != NULL)
    printf(PROG ": no weight decay for %d of %d parameters (--no-decay %s)\n",
           r->no_decay, r->nparams, o->no_decay);
}

/* Rank 0's line on where the run starts, when not at a fresh start. */
static void print_start(const run_t *r) {
  const options_t *o = &r->o;
  if (o->resume != NULL)
    printf(PROG ": resumed at step %lld from %s\n", (long long)r->start,
           r->resumed_from);
  if (o->elastic != NULL && r->restored) {
    printf(PROG ": restored the state committed after step %lld (epoch "
                "%lld, sample %lld of its order) from %s",
           (long long)r->c_step, (long long)r->c_epoch,
           (long long)r->c_consumed, o->elastic);
    if (hvd_elastic_restarts() > 0) /* hvdrun's relaunch, not a new job */
      printf("; launch %d, the last one had %d ranks",
             hvd_elastic_restarts() + 1, hvd_elastic_previous_size());
    printf("\n");
  } else if (o->elastic != NULL)
    printf(PROG ": elastic: no committed state in %s: a fresh start\n",
           o->elastic);
  fflush(stdout);
}

/* Everything before the first step, on every rank. */
static void setup(run_t *r) {
  r->rank = hvd_rank();
  r->size = hvd_size();
  setup_device(r);
  r->B = r->cfg.batch, r->S = r->cfg.seq_len, r->K = r->o.accumulate;
  r->sync = !r->o.no_sync;
  r->global_batch = (int64_t)r->size * r->K * r->B; /* sequences */
  r->tokens_per_step = r->global_batch * r->S;
  setup_data(r);
  open_outputs(r);
  setup_model(r);
  setup_start(r);
  setup_samplers(r);
  if (r->rank == 0) {
    print_setup(r);
    print_start(r);
  }
}

/* The buffers of the steps, the report, and where the data starts: from a
 * commit, its counters; from a checkpoint's step, at one world size, that
 * step / per_epoch and the steps into the epoch times the global batch
 * (hvd_sampler_epoch_from deals out the rest of the epoch). */
static void setup_steps(run_t *r) {
  const size_t ntok = (size_t)r->K * r->B * r->S;
  r->ids = malloc(ntok * sizeof *r->ids);
  r->labels = malloc(ntok * sizeof *r->labels);
  r->lengths = malloc((size_t)r->K * r->B * sizeof *r->lengths);
  r->masked = malloc((size_t)r->K * sizeof *r->masked);
  r->gv = (global_view_t){
      .ds = r->ds, .whole = r->whole, .size = r->size, .rank = r->rank};
  if (r->ids == NULL || r->labels == NULL || r->lengths == NULL ||
      r->masked == NULL ||
      (r->count_all && global_view_init(&r->gv, r->global_batch, r->S) != 0))
    check_local(HVD_ERR_NO_MEMORY, "buffers", "out of memory");
  r->rep = (report_t){
      .first_step = r->start, .total_steps = r->o.steps, .json = r->json};
  r->rep.start = r->rep.last_print = now();
  r->epoch = r->start / r->per_epoch;
  r->consumed = (r->start % r->per_epoch) * r->global_batch;
  if (r->restored)
    r->epoch = r->c_epoch, r->consumed = r->c_consumed;
  r->fetch = 1;
  r->ready = (ready_ctx_t){.opt = r->opt, .rc = HVD_SUCCESS};
  bert_model_set_host_fences(r->model, r->o.host_fences);
  if (!r->o.gpu && !r->o.dense_embeddings && !r->o.zero &&
      r->o.precision == BERT_FP32) /* rows later */
    check_local(
        bert_model_set_sparse_embeddings(r->model, on_sparse_grad, &r->ready),
        "bert_model_set_sparse_embeddings", bert_last_error());
}

/* This rank's list of epoch r->epoch from sample r->consumed of its order,
 * and how many steps it holds. */
static void deal_epoch(run_t *r) {
  check_local(hvd_sampler_epoch_from(r->sampler, r->epoch, r->consumed, &r->idx,
                                     &r->count),
              "hvd_sampler_epoch", hvd_last_error());
  r->in_epoch = 0;
  r->left = r->count / ((int64_t)r->K * r->B);
  if (r->count_all)
    check_local(
        global_view_epoch(&r->gv, r->epoch, r->consumed, r->idx, r->count),
        "hvd_sampler_epoch", hvd_last_error());
}

/* This rank's list of the epoch's samples, at the start and when the
 * list is used up (the next epoch). A commit made at a smaller global
 * batch can leave fewer samples of its epoch than this one's: that
 * remainder is dropped, as drop_last drops every epoch's tail, and the
 * next epoch begins. */
static void next_list(run_t *r) {
  if (!r->fetch && r->in_epoch != r->left)
    return;
  if (!r->fetch)
    r->epoch++, r->consumed = 0;
  r->fetch = 0;
  deal_epoch(r);
  if (r->left == 0 && r->consumed > 0) {
    if (r->rank == 0)
      printf(PROG ": the %lld samples left of epoch %lld make no global "
                  "batch of %lld: dropped, as an epoch's tail; epoch %lld "
                  "begins\n",
             (long long)(r->nsamples - r->consumed), (long long)r->epoch,
             (long long)r->global_batch, (long long)r->epoch + 1);
    r->epoch++, r->consumed = 0;
    deal_epoch(r);
  }
  if (r->left == 0) /* fewer samples in the epoch than a global batch */
    check_local(HVD_ERR_INVALID_ARG, "the data",
                "an epoch holds no step of this global batch");
}

/* This rank's K micro-batches and their masked positions: this rank's
 * into *local, the global batch's into *total. */
static void load_batches(run_t *r, int64_t *local, int64_t *total) {
  const int B = r->B, S = r->S;
  *local = 0;
  for (int j = 0; j < r->K; j++) {
    const int64_t *first = r->idx + (r->in_epoch * r->K + j) * B;
    size_t off = (size_t)j * B * S;
    check_local(bert_dataset_batch(r->ds, first, B, r->epoch, r->ids + off,
                                   NULL, r->labels + off,
                                   r->lengths + (size_t)j * B),
                "bert_dataset_batch", bert_last_error());
    r->masked[j] = 0;
    for (size_t t = 0; t < (size_t)B * S; t++)
      r->masked[j] += r->labels[off + t] != BERT_LABEL_IGNORE;
    *local += r->masked[j];
  }
  *total = *local;
  if (r->count_all)
    check_local(count_global(&r->gv, r->consumed, r->global_batch, total),
                "bert_dataset_batch", bert_last_error());
}

/* The weight of pass j's gradient, P K M_j / M (M_j its masked tokens, M
 * the global batch's, or with --no-sync K M_j / M over this rank's), times
 * fp16's loss scale: the passes of every rank add up to the gradient of
 * the mean loss; 0 when no token is masked (no loss, no gradient). */
static double pass_weight(const run_t *r, int j, int64_t local, int64_t total) {
  const int64_t of = r->sync ? total : local;
  if (of == 0)
    return 0;
  return (double)(r->sync ? r->size : 1) * r->K * (double)r->masked[j] /
         (double)of * hvd_optimizer_loss_scale(r->opt); /* 1 but for fp16 */
}

/* Forward and backward over the K micro-batches, each pass's gradient
 * weighted (see on_grad_ready), then the optimizer's step. The sum of the
 * masked positions' losses into *loss_sum (over every rank when synced);
 * returns the time the step waited for the reductions. */
static double forward_backward(run_t *r, int64_t local, int64_t total,
                               double *loss_sum) {
  const int B = r->B, S = r->S, K = r->K, P = r->size;
  int64_t one = 1;
  hvd_request_t *loss_req = NULL;
  hvd_tensor_t loss_t = hvd_tensor_make(loss_sum, HVD_FLOAT64, 1, &one);
  *loss_sum = 0;
  r->ready.rc = HVD_SUCCESS;
  for (int j = 0; j < K; j++) {
    size_t off = (size_t)j * B * S;
    bert_batch_t b = {.batch = B,
                      .seq_len = S,
                      .input_ids = r->ids + off,
                      .token_type_ids = NULL,
                      .lengths = r->lengths + (size_t)j * B,
                      .labels = r->labels + off};
    bert_output_t out;
    check_local(bert_model_forward(r->model, &b, &out), "bert_model_forward",
                bert_last_error());
    *loss_sum += out.loss * (double)out.masked;
    if (j == K - 1 && r->sync && P > 1) /* overlaps the last backward */
      check_local(hvd_allreduce_async("bert_train.loss", &loss_t, &loss_t,
                                      HVD_SUM, 1, 1, &loss_req),
                  "summing the loss", hvd_last_error());
    double w = pass_weight(r, j, local, total);
    check_local(bert_model_backward_scaled(r->model, (float)w, on_grad_ready,
                                           &r->ready),
                "bert_model_backward", bert_last_error());
    check_local(r->ready.rc, "hvd_optimizer_grad_ready", r->ready.msg);
  }
  double tw = now();
  hvd_result_t rc = hvd_optimizer_step(r->opt);
  double comm_wait = now() - tw;
  check_local(rc, "hvd_optimizer_step", hvd_last_error());
  if (loss_req != NULL)
    check_local(hvd_wait(loss_req), "summing the loss", hvd_last_error());
  return comm_wait;
}

/* The checkpoint of step `step` is written: said, and the old ones
 * pruned. */
static void saved(run_t *r, int64_t step) {
  if (r->rank == 0 && !r->o.quiet) {
    char name[4096];
    checkpoint_name(name, sizeof name, r->o.checkpoint, step);
    printf(PROG ": saved %s\n", name);
    fflush(stdout);
  }
  if (r->rank == 0 && r->o.keep > 0)
    prune_checkpoints(r->o.checkpoint, step, r->o.keep);
}

/* --checkpoint-async: the save in flight, if any, waited for. */
static void finish_checkpoint(run_t *r) {
  if (r->saving == NULL)
    return;
  hvd_checkpoint_request_t *q = r->saving;
  r->saving = NULL;
  check_agreed(hvd_checkpoint_wait(q), "hvd_checkpoint_wait");
  saved(r, r->saving_step);
}

/* --commit-background: waits for the commit's file in flight, if any
 * (collective; its failure, like any, ends the run on every rank). */
static void finish_commit(run_t *r) {
  if (r->state != NULL && r->o.commit_background)
    check_agreed(hvd_state_wait(r->state), "--elastic: hvd_state_wait");
}

/* The checkpoint after step s, if due: written before this returns, or
 * (--checkpoint-async) copied, and written while the next steps run. */
static void checkpoint_due(run_t *r, int64_t s) {
  const options_t *o = &r->o;
  if (o->checkpoint == NULL ||
      !((o->checkpoint_every > 0 && (s + 1) % o->checkpoint_every == 0) ||
        s + 1 == o->steps))
    return;
  finish_checkpoint(r); /* one at a time */
  finish_commit(r);     /* a background commit's file first */
  checkpoint_name(r->path, sizeof r->path, o->checkpoint, s + 1);
  if (!o->checkpoint_async) {
    check_agreed(
        hvd_checkpoint_save(r->path, r->params, r->nparams, r->opt, s + 1),
        "hvd_checkpoint_save");
    saved(r, s + 1);
    return;
  }
  check_agreed(hvd_checkpoint_save_async(r->path, r->params, r->nparams, r->opt,
                                         s + 1, &r->saving),
               "hvd_checkpoint_save_async");
  r->saving_step = s + 1;
}

/* After step s: the checkpoint it is due, the position in the data moved
 * on, and the commit it is due. */
static void after_step(run_t *r, int64_t s) {
  const options_t *o = &r->o;
  checkpoint_due(r, s);
  r->in_epoch++;
  r->consumed += r->global_batch;
  if (r->state != NULL &&
      ((s + 1) % o->commit_every == 0 || s + 1 == o->steps)) {
    if ((hvd_state_commits(r->state) + 1) % o->save_every == 0)
      finish_checkpoint(r); /* the commit writes a file too */
    int epoch_done = r->in_epoch == r->left;
    r->c_step = s + 1;
    r->c_epoch = epoch_done ? r->epoch + 1 : r->epoch;
    r->c_consumed = epoch_done ? 0 : r->consumed;
    check_agreed(hvd_state_commit(r->state), "--elastic: hvd_state_commit");
  }
}

/* One optimizer step, s (0-based), on every rank. */
static void train_step(run_t *r, int64_t s) {
  double t0 = now();
  kill_at_step(&r->kill, s, r->rank);
  next_list(r);
  int64_t local, total;
  load_batches(r, &local, &total);
  const double lr = lr_at(&r->o, s);
  check_local(hvd_optimizer_set_lr(r->opt, lr), "hvd_optimizer_set_lr",
              hvd_last_error());
  check_local(hvd_optimizer_zero_grad(r->opt), "hvd_optimizer_zero_grad",
              hvd_last_error());
  double loss_sum;
  double comm_wait = forward_backward(r, local, total, &loss_sum);
  const int64_t masked = r->sync ? total : local;
  const double loss = masked > 0 ? loss_sum / (double)masked : NAN;
  const double step_time = now() - t0; /* without the checkpoint */
  after_step(r, s);
  const step_rec_t x = {.loss = loss,
                        .lr = lr,
                        .tokens = r->tokens_per_step,
                        .masked = masked,
                        .step_time = step_time,
                        .comm_wait = comm_wait,
                        .grad_norm = hvd_optimizer_grad_norm(r->opt)};
  if (r->rank == 0)
    report_step(&r->rep, &r->o, s, &x);
  else
    json_step(r->json, s, &x);
}

/* The steps from r->start to --steps, and rank 0's summary. */
static void train(run_t *r) {
  setup_steps(r);
  for (int64_t s = r->start; s < r->o.steps; s++)
    train_step(r, s);
  finish_checkpoint(r);
  finish_commit(r);
  double total_time = now() - r->rep.start;
  if (r->rank == 0)
    report_done(&r->rep, &r->o, r->size, (double)r->tokens_per_step,
                total_time);
  if (r->o.graphs && bert_cuda_graphs_off() != NULL) /* measured without */
    cli_say("--cuda-graphs: rank %d ran without graphs: %s", r->rank,
            bert_cuda_graphs_off());
}

/* Releases what setup and train made (what they did not make is NULL),
 * then hvd. */
static void teardown(run_t *r) {
  if (r->json != NULL && fclose(r->json) != 0)
    fprintf(stderr, PROG "[%d]: --log-json: writing '%s': %s\n", r->rank,
            r->json_name, strerror(errno));
  free(r->ids);
  free(r->labels);
  free(r->lengths);
  free(r->masked);
  free(r->gv.ids);
  free(r->gv.labels);
  free(r->gv.lengths);
  hvd_state_destroy(r->state);
  hvd_sampler_destroy(r->sampler);
  hvd_sampler_destroy(r->whole);
  hvd_optimizer_destroy(r->opt);
  hvd_process_set_destroy(r->node_set); /* after the optimizer using it */
  free(r->ready.rows);
  bert_model_destroy(r->model);
  bert_dataset_destroy(r->ds);
  hvd_shutdown();
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  static run_t run; /* zero: nothing made yet */
  parse_options(argc, argv, &run.o, &run.cfg);
  kill_at_read(&run.kill);
  if (hvd_init() != HVD_SUCCESS) {
    cli_say("hvd_init: %s", hvd_last_error());
    return 1;
  }
  setup(&run);
  if (run.start < run.o.steps)
    train(&run);
  else if (run.rank == 0)
    printf(PROG ": the checkpoint is at step %lld and --steps is %lld: "
                "nothing to do\n",
           (long long)run.start, (long long)run.o.steps);
  teardown(&run);
  return 0;
}
