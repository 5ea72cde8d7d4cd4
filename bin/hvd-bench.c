/*
 * hvd-bench - performance and correctness of hvd's collectives, in the
 * spirit of nccl-tests:
 *
 *   hvdrun -np N bin/hvd-bench MODE [options]   (or mpirun -np N ...)
 *
 *   sweep    every size from --min-bytes to --max-bytes, per collective,
 *            dtype, op and place: time, algbw, busbw, and a checked result
 *   list     one workload (--tensors FILE) through hvd, a memcpy of it
 *            (the memory-traffic floor), and the memory hvd costs
 *   mpi-list the same workload through raw MPI in a plain MPI process
 *            (no hvd_init): the baselines list is compared with
 *   latency  one 4-byte allreduce, hvd against MPI_Allreduce; many
 *            tiny tensors at once (the `small` sub-report); the CPU an
 *            idle engine takes while the ranks sleep (`idle`)
 *   overlap  compute on the main thread while hvd reduces in the background
 *   optim    the distributed optimizer's step against the same by hand
 *   --quick  a tiny sweep of everything, for correctness only (a test)
 *
 * and on a GPU (bench_gpu.c; without one, or in a build without CUDA, they
 * print "# SKIP ..." and exit 0):
 *
 *   gpu-pack the fusion pack/unpack kernels against cudaMemcpyAsync
 *   staged   the host-staged executor (HVD_GPU_OPERATIONS=mpi) against the
 *            pinned device <-> host copies it is made of
 *   list --device gpu   the workload on device tensors through hvd (NCCL)
 *            against one cudaMemcpy of the same bytes
 *
 * This file parses the command line (before MPI starts, so --help and
 * option errors need no mpirun) and runs the mode; see doc/bench.md.
 * Exit status: 0 all good (or a GPU mode skipped), 1 some result was wrong
 * or a call failed, 2 bad command line.
 */
#include "bench.h"
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char usage_text[] =
    "usage: hvdrun -np N hvd-bench MODE [options]   (or mpirun -np N ...)\n"
    "       hvd-bench --quick | --help\n"
    "\n"
    "modes:\n"
    "  sweep        time and check collectives over a range of sizes\n"
    "  list         time hvd's allreduce of one workload (--tensors) and a\n"
    "               memcpy of it (the memory-traffic floor)\n"
    "  mpi-list     the same workload through raw MPI (blocking, nonblocking,\n"
    "               packed, DDP buckets) in a plain MPI process: no hvd_init\n"
    "  latency      4-byte allreduce latency, many tiny tensors at once, and\n"
    "               the CPU an idle engine takes while the ranks sleep\n"
    "  overlap      compute on the main thread while hvd reduces --tensors in\n"
    "               the background: the compute speed it keeps\n"
    "  optim        the distributed optimizer's step on --tensors against\n"
    "               hvd allreduce plus the same update written by hand\n"
    "  quick        same as --quick: a fast correctness self-check of every\n"
    "               collective, dtype and op (exit 1 if anything is wrong)\n"
    "\n"
    "GPU modes (without a GPU or CUDA they print '# SKIP ...' and exit 0):\n"
    "  gpu-pack     the fusion buffer's batched pack/unpack kernels against\n"
    "               cudaMemcpyAsync of the same bytes, over tensor counts\n"
    "               and sizes (and --tensors, if given)\n"
    "  staged       device tensors through the host-staged executor\n"
    "               (HVD_GPU_OPERATIONS=mpi, set by this mode) against\n"
    "               cudaMemcpyAsync device -> pinned host -> device\n"
    "  list --device gpu   the --tensors workload on device tensors through\n"
    "               hvd against one device-to-device cudaMemcpy\n"
    "\n"
    "common options:\n"
    "  --iters N          timed iterations (default: sweep adapts to the\n"
    "                     size, list 10, latency 5000)\n"
    "  --warmup N         untimed iterations first (default: sweep 5 (2\n"
    "                     above 16 MiB), list 2, latency 100)\n"
    "  --json             print one JSON document instead of tables\n"
    "  --quick            run the quick self-check (MODE may be omitted)\n"
    "  --verbose          quick: print every case, not only wrong ones\n"
    "  -h, --help         this text\n"
    "\n"
    "sweep options:\n"
    "  --min-bytes SIZE   smallest message (default 4); SIZE takes K, M, G\n"
    "  --max-bytes SIZE   largest message (default 256M)\n"
    "  --step-factor F    multiply the size by F each step (default 2)\n"
    "  --coll LIST        allreduce (default), broadcast, allgather,\n"
    "                     alltoall, reducescatter, or all; comma-separated\n"
    "  --op LIST          sum (default), average, min, max, product, or all\n"
    "  --dtype LIST       float32 (default), uint8, int8, int32, int64,\n"
    "                     float16, bfloat16, float64, or all\n"
    "  --inplace 0|1|both out of place, in place, or both (default both;\n"
    "                     broadcast is in place only, allgather, alltoall\n"
    "                     and reducescatter out of place only)\n"
    "  --root R           broadcast root (default 0)\n"
    "  (--min-bytes, --max-bytes and --step-factor also choose the sizes of\n"
    "  gpu-pack (per tensor; default 4K to 64M, x4) and of staged (one\n"
    "  tensor; default 1M to 256M, x4))\n"
    "\n"
    "list, mpi-list, overlap and optim options:\n"
    "  --tensors FILE     workload: one tensor per line, `name dim0 [dim1]`,\n"
    "                     float32, '#' starts a comment (required)\n"
    "  --compute-ms MS    overlap: the compute loop's length (default 500)\n"
    "  --device cpu|gpu   list: tensors in host memory (default) or on the\n"
    "                     rank's GPU\n"
    "  --alloc malloc|hvd host tensors from malloc (default) or "
    "hvd_alloc_host\n"
    "                     (2 MiB-aligned, transparent huge pages); list\n"
    "                     without it runs both, malloc first\n"
    "  --bucket-bytes SIZE  mpi-list: DDP-style bucket size (default 25M)\n"
    "  --check-hparams 0|1  optim: the distributed optimizer's check that\n"
    "                     the ranks' hyperparameters agree (default 1)\n"
    "  --num-groups N     optim: the distributed optimizer's num_groups\n"
    "                     (explicit gradient groups; default 0: none)\n"
    "  (gpu-pack and staged take --tensors too: the workload as one more "
    "case)\n"
    "\n"
    "gpu-pack options:\n"
    "  --counts LIST      tensors per case, comma-separated (default\n"
    "                     1,16,256,4096; cases above 1 GiB in all are left "
    "out)\n"
    "\n"
    "latency options:\n"
    "  --small-count N    tensors in the small sub-report (default 1000)\n"
    "  --small-iters N    timed iterations of it (default 20)\n"
    "\n"
    "Only rank 0 prints. Exit status: 0 all results right (or a GPU mode\n"
    "skipped), 1 a result was wrong or a call failed, 2 bad command line.\n";

/* The wording of this program's messages (examples/util/cli.h); a usage
 * error is said on rank 0 only (the launcher's rank: MPI has not started). */
static const cli_t cli = {
    .prog = "hvd-bench",
    .hint = " (hvd-bench --help lists the options)",
    /* (option, lo, hi, value) in this program's order */
    .int_fmt = "%1$s '%4$s': expected an integer in %2$lld..%3$lld"};

static int64_t parse_size(const char *opt, const char *s) {
  int64_t v = bench_parse_bytes(s);
  if (v < 1 || v > (INT64_C(4) << 30))
    cli_usage_error("%s '%s': expected a size from 1 to 4G (e.g. 4, 64K, 256M)",
                    opt, s);
  return v;
}

/* A comma-separated list of names (or "all") as a bit set over the names
 * that name(i) gives for i < count. */
static unsigned parse_set(const char *opt, const char *s, int count,
                          const char *(*name)(int)) {
  unsigned set = 0;
  char buf[256];
  if (strlen(s) >= sizeof buf)
    cli_usage_error("%s: list too long", opt);
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
       tok = strtok_r(NULL, ",", &save)) {
    int found = -1;
    if (strcmp(tok, "all") == 0) {
      set |= (1u << count) - 1;
      continue;
    }
    for (int i = 0; i < count; i++)
      if (strcmp(tok, name(i)) == 0)
        found = i;
    if (found < 0) {
      char names[256] = "";
      for (int i = 0; i < count; i++) {
        strncat(names, name(i), sizeof names - strlen(names) - 1);
        strncat(names, ", ", sizeof names - strlen(names) - 1);
      }
      cli_usage_error("%s: unknown '%s' (one of %sall)", opt, tok, names);
    }
    set |= 1u << found;
  }
  if (set == 0)
    cli_usage_error("%s: empty list", opt);
  return set;
}

static const char *op_name(int i) { return hvd_op_name((hvd_op_t)i); }
static const char *dtype_name(int i) { return hvd_dtype_name((hvd_dtype_t)i); }
static const char *coll_name(int i) {
  return bench_coll_name((enum bench_coll)i);
}

enum {
  OPT_ITERS = 256,
  OPT_WARMUP,
  OPT_JSON,
  OPT_QUICK,
  OPT_VERBOSE,
  OPT_MIN_BYTES,
  OPT_MAX_BYTES,
  OPT_STEP,
  OPT_COLL,
  OPT_OP,
  OPT_DTYPE,
  OPT_INPLACE,
  OPT_ROOT,
  OPT_TENSORS,
  OPT_SMALL_COUNT,
  OPT_SMALL_ITERS,
  OPT_COMPUTE_MS,
  OPT_DEVICE,
  OPT_COUNTS,
  OPT_ALLOC,
  OPT_BUCKET,
  OPT_CHECK_HPARAMS,
  OPT_NUM_GROUPS,
  OPT_LAST = OPT_NUM_GROUPS
};

/* In the order of the enum above (the error messages index it). */
static const struct option long_opts[] = {
    {"iters", required_argument, NULL, OPT_ITERS},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"json", no_argument, NULL, OPT_JSON},
    {"quick", no_argument, NULL, OPT_QUICK},
    {"verbose", no_argument, NULL, OPT_VERBOSE},
    {"min-bytes", required_argument, NULL, OPT_MIN_BYTES},
    {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
    {"step-factor", required_argument, NULL, OPT_STEP},
    {"coll", required_argument, NULL, OPT_COLL},
    {"op", required_argument, NULL, OPT_OP},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"inplace", required_argument, NULL, OPT_INPLACE},
    {"root", required_argument, NULL, OPT_ROOT},
    {"tensors", required_argument, NULL, OPT_TENSORS},
    {"small-count", required_argument, NULL, OPT_SMALL_COUNT},
    {"small-iters", required_argument, NULL, OPT_SMALL_ITERS},
    {"compute-ms", required_argument, NULL, OPT_COMPUTE_MS},
    {"device", required_argument, NULL, OPT_DEVICE},
    {"counts", required_argument, NULL, OPT_COUNTS},
    {"alloc", required_argument, NULL, OPT_ALLOC},
    {"bucket-bytes", required_argument, NULL, OPT_BUCKET},
    {"check-hparams", required_argument, NULL, OPT_CHECK_HPARAMS},
    {"num-groups", required_argument, NULL, OPT_NUM_GROUPS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

#define MODE_BIT(m) (1u << (m))

/* The modes a mode-specific option belongs to, as MODE_BIT bits (0: every
 * mode). --tensors is checked apart. */
static unsigned option_modes(int opt) {
  switch (opt) {
  case OPT_MIN_BYTES:
  case OPT_MAX_BYTES:
  case OPT_STEP:
    return MODE_BIT(BENCH_SWEEP) | MODE_BIT(BENCH_GPU_PACK) |
           MODE_BIT(BENCH_STAGED);
  case OPT_COLL:
  case OPT_OP:
  case OPT_DTYPE:
  case OPT_INPLACE:
  case OPT_ROOT:
    return MODE_BIT(BENCH_SWEEP);
  case OPT_COMPUTE_MS:
    return MODE_BIT(BENCH_OVERLAP);
  case OPT_SMALL_COUNT:
  case OPT_SMALL_ITERS:
    return MODE_BIT(BENCH_LATENCY);
  case OPT_VERBOSE:
    return MODE_BIT(BENCH_QUICK);
  case OPT_DEVICE:
    return MODE_BIT(BENCH_LIST);
  case OPT_COUNTS:
    return MODE_BIT(BENCH_GPU_PACK);
  case OPT_ALLOC:
    return MODE_BIT(BENCH_LIST) | MODE_BIT(BENCH_MPI_LIST) |
           MODE_BIT(BENCH_OPTIM) | MODE_BIT(BENCH_OVERLAP);
  case OPT_BUCKET:
    return MODE_BIT(BENCH_MPI_LIST);
  case OPT_CHECK_HPARAMS:
  case OPT_NUM_GROUPS:
    return MODE_BIT(BENCH_OPTIM);
  default:
    return 0;
  }
}

static const char *const mode_names[] = {"sweep",    "list",    "latency",
                                         "quick",    "overlap", "optim",
                                         "gpu-pack", "staged",  "mpi-list"};

/* "sweep, gpu-pack and staged": the modes of bits. */
static const char *modes_str(unsigned bits, char *buf, size_t len) {
  int k = 0, total = 0;
  for (int m = 0; m < BENCH_COUNT(mode_names); m++)
    total += (bits >> m) & 1u;
  buf[0] = '\0';
  for (int m = 0; m < BENCH_COUNT(mode_names); m++) {
    if (!((bits >> m) & 1u))
      continue;
    k++;
    strncat(buf,
            k == 1       ? ""
            : k == total ? " and "
                         : ", ",
            len - strlen(buf) - 1);
    strncat(buf, mode_names[m], len - strlen(buf) - 1);
  }
  return buf;
}

/* --counts: 1 to 16 tensor counts, each 1..65536. */
static void parse_counts(const char *s, bench_opts_t *o) {
  char buf[256];
  if (strlen(s) >= sizeof buf)
    cli_usage_error("--counts: list too long");
  snprintf(buf, sizeof buf, "%s", s);
  o->ncounts = 0;
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL;
       tok = strtok_r(NULL, ",", &save)) {
    if (o->ncounts == BENCH_COUNT(o->counts))
      cli_usage_error("--counts: at most %d counts", BENCH_COUNT(o->counts));
    o->counts[o->ncounts++] = (int)cli_int("--counts", tok, 1, 65536);
  }
  if (o->ncounts == 0)
    cli_usage_error("--counts: empty list");
}

static void set_defaults(bench_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->warmup = -1;
  o->min_bytes = 4;
  o->max_bytes = INT64_C(256) << 20;
  o->step_factor = 2;
  o->ops = 1u << HVD_SUM;
  o->dtypes = 1u << HVD_FLOAT32;
  o->colls = 1u << BENCH_ALLREDUCE;
  o->places = BENCH_OUT_OF_PLACE | BENCH_IN_PLACE;
  o->small_count = 1000;
  o->small_iters = 20;
  o->compute_ms = 500;
  o->counts[0] = 1;
  o->counts[1] = 16;
  o->counts[2] = 256;
  o->counts[3] = 4096;
  o->ncounts = 4;
  o->alloc = BENCH_DATA_MALLOC;
  o->bucket_bytes = INT64_C(25) << 20;
  o->check_hparams = 1;
}

/* The options of every mode and sweep's. Each returns 1 when option c
 * was one of its own, 0 when not. */
static int sweep_option(bench_opts_t *o, int c, const char *a, int *quick) {
  switch (c) {
  case OPT_ITERS:
    o->iters = (int)cli_int("--iters", a, 1, 100000000);
    return 1;
  case OPT_WARMUP:
    o->warmup = (int)cli_int("--warmup", a, 0, 1000000);
    return 1;
  case OPT_JSON:
    o->json = 1;
    return 1;
  case OPT_VERBOSE:
    o->verbose = 1;
    return 1;
  case OPT_QUICK:
    *quick = 1;
    return 1;
  case OPT_MIN_BYTES:
    o->min_bytes = parse_size("--min-bytes", a);
    return 1;
  case OPT_MAX_BYTES:
    o->max_bytes = parse_size("--max-bytes", a);
    return 1;
  case OPT_STEP:
    o->step_factor = (int)cli_int("--step-factor", a, 2, 1024);
    return 1;
  case OPT_COLL:
    o->colls = parse_set("--coll", a, BENCH_COLL_COUNT, coll_name);
    return 1;
  case OPT_OP:
    /* the elementwise ops: HVD_ADASUM is not swept (its results have no
     * closed form on the sweep's data) */
    o->ops = parse_set("--op", a, HVD_ADASUM, op_name);
    return 1;
  case OPT_DTYPE:
    o->dtypes = parse_set("--dtype", a, HVD_DTYPE_COUNT, dtype_name);
    return 1;
  case OPT_INPLACE:
    if (strcmp(a, "0") == 0)
      o->places = BENCH_OUT_OF_PLACE;
    else if (strcmp(a, "1") == 0)
      o->places = BENCH_IN_PLACE;
    else if (strcmp(a, "both") == 0)
      o->places = BENCH_OUT_OF_PLACE | BENCH_IN_PLACE;
    else
      cli_usage_error("--inplace '%s': expected 0, 1 or both", a);
    return 1;
  case OPT_ROOT:
    o->root = (int)cli_int("--root", a, 0, 1 << 20);
    return 1;
  }
  return 0;
}

/* The options of the workload modes, latency's and gpu-pack's. */
static int workload_option(bench_opts_t *o, int c, const char *a) {
  switch (c) {
  case OPT_TENSORS:
    o->tensors = a;
    return 1;
  case OPT_SMALL_COUNT:
    o->small_count = (int)cli_int("--small-count", a, 1, 1000000);
    return 1;
  case OPT_SMALL_ITERS:
    o->small_iters = (int)cli_int("--small-iters", a, 1, 1000000);
    return 1;
  case OPT_COMPUTE_MS:
    o->compute_ms = (int)cli_int("--compute-ms", a, 1, 100000);
    return 1;
  case OPT_DEVICE:
    if (strcmp(a, "cpu") != 0 && strcmp(a, "gpu") != 0)
      cli_usage_error("--device '%s': expected cpu or gpu", a);
    o->device_gpu = strcmp(a, "gpu") == 0;
    return 1;
  case OPT_COUNTS:
    parse_counts(a, o);
    return 1;
  case OPT_ALLOC:
    if (strcmp(a, "malloc") != 0 && strcmp(a, "hvd") != 0)
      cli_usage_error("--alloc '%s': expected malloc or hvd", a);
    o->alloc = strcmp(a, "hvd") == 0 ? BENCH_DATA_HVD : BENCH_DATA_MALLOC;
    o->alloc_given = 1;
    return 1;
  case OPT_BUCKET:
    o->bucket_bytes = parse_size("--bucket-bytes", a);
    return 1;
  case OPT_CHECK_HPARAMS:
    o->check_hparams = (int)cli_int("--check-hparams", a, 0, 1);
    return 1;
  case OPT_NUM_GROUPS:
    o->num_groups = (int)cli_int("--num-groups", a, 0, 1000000);
    return 1;
  }
  return 0;
}

/* The mode: the first argument left after the options, or --quick. */
static void parse_mode(int argc, char **argv, bench_opts_t *o, int quick) {
  if (optind < argc) {
    const char *m = argv[optind++];
    int found = -1;
    for (int i = 0; i < BENCH_COUNT(mode_names); i++)
      if (strcmp(m, mode_names[i]) == 0)
        found = i;
    if (found < 0)
      cli_usage_error("unknown mode '%s' (sweep, list, mpi-list, latency, "
                      "overlap, optim, quick, gpu-pack or staged)",
                      m);
    if (quick && found != BENCH_QUICK && found != BENCH_SWEEP)
      cli_usage_error("--quick does not go with mode '%s'", m);
    o->mode = quick ? BENCH_QUICK : (enum bench_mode)found;
  } else if (quick) {
    o->mode = BENCH_QUICK;
  } else {
    cli_usage_error("no mode given (sweep, list, mpi-list, latency, overlap, "
                    "optim, gpu-pack, staged, or --quick)");
  }
  if (optind < argc)
    cli_usage_error("unexpected argument '%s'", argv[optind]);
}

/* The options given against the mode: each one's modes, the GPU modes'
 * own size defaults, --tensors. */
static void check_modes(bench_opts_t *o, const int *given) {
  for (int opt = OPT_ITERS; opt <= OPT_LAST; opt++) {
    unsigned m = option_modes(opt);
    char names[128];
    if (given[opt] && m != 0 && !(m & MODE_BIT(o->mode)))
      cli_usage_error("--%s is an option of %s mode%s, not %s",
                      long_opts[opt - OPT_ITERS].name,
                      modes_str(m, names, sizeof names),
                      (m & (m - 1)) ? "s" : "", mode_names[o->mode]);
  }
  if (o->mode == BENCH_GPU_PACK || o->mode == BENCH_STAGED) {
    int pack = o->mode == BENCH_GPU_PACK;
    if (!given[OPT_MIN_BYTES])
      o->min_bytes = pack ? 4 << 10 : 1 << 20;
    if (!given[OPT_MAX_BYTES])
      o->max_bytes = pack ? 64 << 20 : 256 << 20;
    if (!given[OPT_STEP])
      o->step_factor = 4;
    if (o->max_bytes > (INT64_C(1) << 30))
      cli_usage_error("--max-bytes: %s mode goes up to 1G per tensor",
                      mode_names[o->mode]);
  }
  if (o->mode == BENCH_QUICK && (given[OPT_ITERS] || given[OPT_WARMUP]))
    cli_usage_error("--quick runs each case once; --iters and --warmup do "
                    "not apply");
  if (o->min_bytes > o->max_bytes)
    cli_usage_error("--min-bytes (%lld) is above --max-bytes (%lld)",
                    (long long)o->min_bytes, (long long)o->max_bytes);
  int with_tensors = o->mode == BENCH_LIST || o->mode == BENCH_OVERLAP ||
                     o->mode == BENCH_OPTIM || o->mode == BENCH_MPI_LIST;
  int may_tensors = o->mode == BENCH_GPU_PACK || o->mode == BENCH_STAGED;
  if (with_tensors && o->tensors == NULL)
    cli_usage_error("%s mode needs --tensors FILE", mode_names[o->mode]);
  if (given[OPT_TENSORS] && !with_tensors && !may_tensors)
    cli_usage_error("--tensors is an option of list, mpi-list, overlap, "
                    "optim, gpu-pack and staged modes, not %s",
                    mode_names[o->mode]);
}

static void parse_args(int argc, char **argv, bench_opts_t *o) {
  int given[OPT_LAST + 1] = {0};
  int quick = 0, c;
  cli_init(&cli);
  set_defaults(o);
  opterr = 0; /* we say what is wrong ourselves, on rank 0 only */
  while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
    if (c >= OPT_ITERS && c <= OPT_LAST)
      given[c] = 1;
    if (c == 'h') {
      if (cli_launcher_rank() == 0)
        fputs(usage_text, stdout);
      exit(0);
    }
    if (c == ':')
      cli_usage_error("option %s needs a value", argv[optind - 1]);
    if (sweep_option(o, c, optarg, &quick) || workload_option(o, c, optarg))
      continue;
    if (optopt > 0 && optopt < 128 && argv[optind - 1][1] != '-')
      cli_usage_error("unknown option '-%c'", optopt);
    cli_usage_error("unknown option, or a value where none goes: '%s'",
                    argv[optind - 1]);
  }
  parse_mode(argc, argv, o, quick);
  check_modes(o, given);
}

/* The GPU modes, before MPI starts: 1 when there is no device (rank 0
 * said the skip line), else 0; staged's executor set. */
static int gpu_skipped(const bench_opts_t *o) {
  if (o->mode != BENCH_GPU_PACK && o->mode != BENCH_STAGED &&
      !(o->mode == BENCH_LIST && o->device_gpu))
    return 0;
  char why[512];
  const char *name =
      o->mode == BENCH_LIST ? "list --device gpu" : mode_names[o->mode];
  if (bench_gpu_unavailable(why, sizeof why)) {
    if (cli_launcher_rank() == 0) {
      if (o->json) /* the mode as a run's JSON names it */
        printf("{\"mode\": \"%s\", \"skipped\": true, \"reason\": "
               "\"%s\"}\n",
               o->mode == BENCH_LIST ? "list-gpu" : name,
               why); /* why holds no quotes (bench_gpu.c) */
      else
        printf("# SKIP hvd-bench %s: %s\n", name, why);
    }
    return 1;
  }
  /* staged measures the host-staged executor, whatever was asked */
  if (o->mode == BENCH_STAGED) {
    const char *v = getenv("HVD_GPU_OPERATIONS");
    if (v != NULL && *v != '\0' && strcasecmp(v, "mpi") != 0 &&
        cli_launcher_rank() == 0)
      fprintf(stderr,
              "hvd-bench staged: HVD_GPU_OPERATIONS=%s replaced "
              "by mpi\n",
              v);
    setenv("HVD_GPU_OPERATIONS", "mpi", 1);
  }
  return 0;
}

/* The mode's run, after hvd_init; its exit status. */
static int run_mode(const bench_opts_t *o) {
  switch (o->mode) {
  case BENCH_LIST:
    return bench_list(o);
  case BENCH_LATENCY:
    return bench_latency(o);
  case BENCH_OVERLAP:
    return bench_overlap(o);
  case BENCH_OPTIM:
    return bench_optim(o);
  case BENCH_GPU_PACK:
    return bench_gpu_pack(o);
  case BENCH_STAGED:
    return bench_staged(o);
  case BENCH_SWEEP:
  case BENCH_QUICK:
  default:
    return bench_sweep(o);
  }
}

int main(int argc, char **argv) {
  bench_opts_t o;
  int result;

  parse_args(argc, argv, &o);
  if (gpu_skipped(&o))
    return 0;

  if (o.mode == BENCH_MPI_LIST) { /* a plain MPI program: never hvd_init */
    BENCH_MPI(MPI_Init(&argc, &argv));
    MPI_Comm_rank(MPI_COMM_WORLD, &bench_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &bench_size);
    result = bench_mpi_list(&o);
    MPI_Finalize();
    return result;
  }

  hvd_result_t rc = hvd_init();
  if (rc != HVD_SUCCESS) {
    fprintf(stderr, "hvd-bench: hvd_init failed: %s: %s\n", hvd_strerror(rc),
            hvd_last_error());
    return 1;
  }
  bench_rank = hvd_rank();
  bench_size = hvd_size();

  if (o.mode == BENCH_SWEEP && (o.colls & (1u << BENCH_BROADCAST)) &&
      o.root >= bench_size) {
    if (bench_rank == 0)
      fprintf(stderr, "hvd-bench: --root %d: the world has %d rank(s)\n",
              o.root, bench_size);
    hvd_shutdown();
    return 2;
  }
  result = run_mode(&o);
  BENCH_HVD(hvd_shutdown());
  return result;
}
