/*
 * bench.h - what the parts of hvd-bench share: the options, the helpers
 * (clock, statistics, element values, output) and the entry point of each
 * mode. hvd-bench.c parses the command line; bench_sweep.c, bench_list.c,
 * bench_latency.c, bench_overlap.c and bench_optim.c run the host modes,
 * bench_gpu.c the GPU ones (gpu-pack, staged, list --device gpu);
 * bench_util.c holds the helpers.
 *
 * Conventions: every rank runs every mode function; only rank 0 prints to
 * stdout; any rank may print what went wrong on stderr, prefixed with
 * "[rank R]". A mode returns 0 when every check held on every rank, 1 when
 * some result was wrong. A failed hvd or MPI call is fatal: bench_fail()
 * prints it and aborts the job (the other ranks would wait forever).
 */
#ifndef HVD_BENCH_H
#define HVD_BENCH_H

#include <hvd.h>
#include <mpi.h>

#include <stddef.h>
#include <stdint.h>

#define BENCH_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Collectives, in the order of --coll all. */
enum bench_coll {
  BENCH_ALLREDUCE,
  BENCH_BROADCAST,
  BENCH_ALLGATHER,
  BENCH_ALLTOALL,
  BENCH_REDUCESCATTER,
  BENCH_COLL_COUNT
};

enum bench_mode {
  BENCH_SWEEP,
  BENCH_LIST,
  BENCH_LATENCY,
  BENCH_QUICK,
  BENCH_OVERLAP,
  BENCH_OPTIM,
  BENCH_GPU_PACK,
  BENCH_STAGED,
  BENCH_MPI_LIST
};

/* Bits of --inplace. */
#define BENCH_OUT_OF_PLACE 1
#define BENCH_IN_PLACE 2

typedef struct bench_opts {
  enum bench_mode mode;
  int json;    /* --json */
  int verbose; /* --verbose: quick prints every row */
  int iters;   /* --iters; 0: the mode's default */
  int warmup;  /* --warmup; -1: the mode's default */
  /* sweep */
  int64_t min_bytes, max_bytes; /* --min-bytes, --max-bytes */
  int step_factor;              /* --step-factor */
  unsigned ops;                 /* --op: bit (1 << hvd_op_t) */
  unsigned dtypes;              /* --dtype: bit (1 << hvd_dtype_t) */
  unsigned colls;               /* --coll: bit (1 << enum bench_coll) */
  unsigned places;              /* --inplace: BENCH_*_PLACE bits */
  int root;                     /* --root (broadcast) */
  /* list, overlap, optim; gpu-pack and staged (optional there) */
  const char *tensors;  /* --tensors FILE */
  int device_gpu;       /* list --device gpu */
  int alloc;            /* --alloc: enum bench_data (list, mpi-list, optim) */
  int alloc_given;      /* --alloc was given (list: else both memories) */
  int64_t bucket_bytes; /* mpi-list --bucket-bytes (DDP's 25 MiB) */
  /* gpu-pack: --counts, tensors per case */
  int counts[16];
  int ncounts;
  /* latency */
  int small_count; /* --small-count: tensors in the `small` sub-report */
  int small_iters; /* --small-iters */
  /* overlap */
  int compute_ms; /* --compute-ms */
  /* optim */
  int check_hparams; /* --check-hparams (hvd_distributed_options_t's) */
  int num_groups;    /* --num-groups (hvd_distributed_options_t's) */
} bench_opts_t;

/* This rank and the world size (set by main after hvd_init). */
extern int bench_rank, bench_size;

/* ---- failures ----------------------------------------------------------- */

/* Fatal: prints "[rank R] what: <hvd error>" and aborts the job (exit 1). */
void bench_fail_hvd(hvd_result_t rc, const char *what);
/* Fatal: prints "[rank R] what: <MPI error string>" and aborts the job. */
void bench_fail_mpi(int err, const char *what);
/* Fatal: prints "[rank R] <message>" and aborts the job. */
void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define BENCH_HVD(call)                                                        \
  do {                                                                         \
    hvd_result_t bench__rc = (call);                                           \
    if (bench__rc != HVD_SUCCESS)                                              \
      bench_fail_hvd(bench__rc, #call);                                        \
  } while (0)
#define BENCH_MPI(call)                                                        \
  do {                                                                         \
    int bench__err = (call);                                                   \
    if (bench__err != MPI_SUCCESS)                                             \
      bench_fail_mpi(bench__err, #call);                                       \
  } while (0)

/* malloc that aborts the job when memory runs out. */
void *bench_alloc(size_t bytes);

/* 1 on every rank if ok is nonzero on every rank, else 0. */
int bench_all_ok(int ok);

/* ---- time and statistics ------------------------------------------------ */

double bench_now(void); /* seconds, monotonic */

/* Replaces each of the n per-rank samples with its maximum over the ranks
 * (the collective took as long as its slowest rank). */
void bench_max_over_ranks(double *samples, int n);

typedef struct bench_stats {
  double median, min, max, p90, p99; /* same unit as the samples */
} bench_stats_t;

/* Statistics of n > 0 samples (sorts them). */
bench_stats_t bench_stats(double *samples, int n);

/* ---- element values ----------------------------------------------------- */

int bench_is_float(hvd_dtype_t dt);
/* Stores the integer v (exactly representable) as element i of buf. */
void bench_put(void *buf, hvd_dtype_t dt, int64_t i, double v);
/* Element i of buf as a double. */
double bench_get(const void *buf, hvd_dtype_t dt, int64_t i);

/* ---- names, sizes, environment ------------------------------------------ */

const char *bench_coll_name(enum bench_coll c);
/* "256M" -> 268435456; -1 when s is not a size. Suffixes K, M, G (powers
 * of 1024), optionally followed by B or iB. */
int64_t bench_parse_bytes(const char *s);
/* "4 B", "64 KiB", "256 MiB" (exact powers print without decimals). */
const char *bench_bytes_str(double bytes, char *buf, size_t len);

/* ---- output (rank 0 only) ----------------------------------------------- *
 * A streaming JSON writer: each call prints one value, with the comma and
 * key in front of it as its container needs. key is NULL inside arrays. */
void bench_json_open(const char *key, char bracket); /* '{' or '[' */
void bench_json_close(char bracket);                 /* '}' or ']' */
void bench_json_str(const char *key, const char *v);
void bench_json_num(const char *key, double v); /* null if not finite */
void bench_json_int(const char *key, int64_t v);
void bench_json_bool(const char *key, int v);
/* Begins the document: {"mode": ..., "world_size": ..., "hvd_version":
 * ..., "settings": {HVD_* environment}; the caller closes it. */
void bench_json_header(const char *mode);

/* The HVD_* variables of the environment as "A=1 B=2" ("(none set)"). */
const char *bench_env_line(char *buf, size_t len);

/* ---- workloads (.tensors files) ------------------------------------------ */

typedef struct ltensor {
  char *name;
  int ndim;
  int64_t shape[2];
  int64_t n; /* elements */
  float *data;
} ltensor_t;

/* Where a workload's tensors live (--alloc). */
enum bench_data {
  BENCH_DATA_NONE,   /* not allocated (the GPU modes allocate their own) */
  BENCH_DATA_MALLOC, /* one malloc each: what a program usually has */
  BENCH_DATA_HVD     /* one hvd_alloc_host each (huge pages from 2 MiB) */
};

typedef struct workload {
  ltensor_t *t;
  int count;
  int64_t elems;
  float *packed; /* elems floats for the pack methods, of host_data's kind */
  int host_data; /* enum bench_data */
} workload_t;

/* bytes of host memory of that kind (BENCH_DATA_MALLOC or _HVD; aborts
 * the job when there is none), and its release (NULL is accepted). */
void *bench_alloc_as(int kind, size_t bytes);
void bench_free_as(int kind, void *p);

/* Reads a .tensors file and allocates its tensors as host_data says
 * (enum bench_data; with BENCH_DATA_NONE every data is NULL); on error
 * rank 0 says why and it returns 0 (on every rank: all read the same
 * file). */
int bench_load_workload(const char *path, workload_t *w, int host_data);
void bench_free_workload(workload_t *w);

/* The inputs of list, overlap, optim and the GPU modes: element i of
 * tensor t on rank r, small integers whose average over the ranks is
 * bench_base_value(t, i) (offsets cancel in pairs of ranks), exact in
 * every dtype and summation order. */
float bench_base_value(int t, int64_t i);
float bench_input_value(int t, int64_t i, int r);

/* ---- modes -------------------------------------------------------------- */

int bench_sweep(const bench_opts_t *o); /* sweep and quick */
int bench_list(const bench_opts_t *o);
/* mpi-list: the raw MPI baselines of list, in a process that never calls
 * hvd_init (main initialises MPI itself, at the default thread level). */
int bench_mpi_list(const bench_opts_t *o);
int bench_latency(const bench_opts_t *o);
int bench_overlap(const bench_opts_t *o);
int bench_optim(const bench_opts_t *o);

/* ---- GPU modes (bench_gpu.c) --------------------------------------------- *
 * Before hvd_init: 0 when a CUDA device is visible to this build, else 1
 * with the reason in why ("this build has no CUDA", "no CUDA device:
 * cudaGetDeviceCount: ..."). The caller prints the skip line and exits 0. */
int bench_gpu_unavailable(char *why, size_t len);
int bench_gpu_pack(const bench_opts_t *o); /* gpu-pack */
int bench_staged(const bench_opts_t *o);   /* staged */
int bench_list_gpu(const bench_opts_t *o); /* list --device gpu */

#endif /* HVD_BENCH_H */
