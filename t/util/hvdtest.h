/*
 * hvdtest.h - helpers shared by hvd's C tests (t/util/libhvdtest.la,
 * linked into every test program through TEST_LDADD; see t/local.mk).
 * Independent of the library under test, except for names in messages
 * (hvd_dtype_name, hvd_op_name) and where a helper runs a collective.
 * Helpers that report use t/tap (and bail out when memory runs out).
 *
 *  - Elements: hvdt_get/hvdt_put read and write element i of a buffer of
 *    any hvd dtype as a double; float16 and bfloat16 round to nearest even.
 *  - Expected values: hvdt_fold/hvdt_finish compute a reduction over the
 *    ranks as hvd's contract defines it.
 *  - Comparison: hvdt_compare finds the first element of a buffer that is
 *    not its expected value (exactly, or within a tolerance).
 *  - Allreduce jobs (struct hvdt_ar): one allreduce of generated values,
 *    submitted async, waited for, checked against the exact result; and
 *    bursts of them over every dtype, op and a few sizes (hvdt_burst).
 *  - Checks: a sum allreduce that must work, a mismatch that must fail
 *    with the coordinator's exact message.
 *  - hvdt_shuffle: a seeded permutation (a different order on every rank).
 */
#ifndef HVD_TEST_UTIL_H
#define HVD_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "hvd.h"
#include "tap/tap.h"

/* ---- Elements ---- */

size_t hvdt_size(hvd_dtype_t dt);   /* bytes per element */
int hvdt_is_float(hvd_dtype_t dt);  /* float16, bfloat16, float32, float64 */
int hvdt_is_signed(hvd_dtype_t dt); /* every dtype but uint8 */

/* float16 (IEEE binary16) and bfloat16, rounding to nearest even. */
uint16_t hvdt_f32_to_f16(float f);
float hvdt_f16_to_f32(uint16_t h);
uint16_t hvdt_f32_to_bf16(float f);
float hvdt_bf16_to_f32(uint16_t h);

/* Element i of buf, of dtype dt, as a double; and the reverse (integers
 * are converted by a C cast, floats rounded to nearest even). */
double hvdt_get(hvd_dtype_t dt, const void *buf, int64_t i);
void hvdt_put(hvd_dtype_t dt, void *buf, int64_t i, double v);
/* v as an element of dtype dt holds it (hvdt_put, then hvdt_get). */
double hvdt_as_dtype(hvd_dtype_t dt, double v);

/* How far got is from want (n floats), as a fraction of a tolerance of
 * r max(|g|, |c|) + (r/2) max|want| per element: at most 1 passes; a NaN
 * or an infinity on either side counts as infinitely far. The tolerance
 * of a 16-bit kernel against its CPU model (t/gpu/bert_layers, and
 * t/unit/flash_simt, which holds the same kernels to the same bound). */
double hvdt_rounding_err(const float *got, const float *want, int64_t n,
                         double r);

/* calloc that bails out of the test when it fails; n may be 0. */
void *hvdt_calloc(size_t n, size_t size);

/* A 64-bit hash of (q, t, i): a test's values for rank q, tensor t,
 * element i, alike on every rank and run (splitmix64's finalizer). */
uint64_t hvdt_hash3(int q, int t, int64_t i);

/* What this process writes to stderr between the two calls, caught in a
 * temporary file: hvdt_stderr_begin returns the saved descriptor for
 * hvdt_stderr_end, which puts stderr back and reads what was written
 * into got (cap bytes, NUL-terminated). Both bail on failure. */
int hvdt_stderr_begin(void);
void hvdt_stderr_end(int saved, char *got, size_t cap);

/* A whole file as a NUL-terminated string (malloc'd); NULL if it cannot
 * be read. */
char *hvdt_slurp(const char *path);
/* A whole file's bytes (malloc'd, *n of them, one more allocated), and
 * a file of n bytes written: both bail when they cannot. */
unsigned char *hvdt_read_bytes(const char *path, size_t *n);
void hvdt_write_bytes(const char *path, const void *b, size_t n);
/* 1 when files a and b both open and hold the same bytes. */
int hvdt_same_file(const char *a, const char *b);

/* A fresh directory $TMPDIR/<tag>.XXXXXX (TMPDIR unset: /tmp), made by
 * rank 0 of MPI_COMM_WORLD, its path into dir on every rank: collective;
 * bails on failure. hvdt_remove_tmpdir (collective too): rank 0 removes it
 * and everything in it once every rank is done with it. */
void hvdt_shared_tmpdir(char *dir, size_t len, const char *tag);
void hvdt_remove_tmpdir(const char *dir);
/* 1 on every rank of MPI_COMM_WORLD when every rank's `bytes` bytes at x
 * are rank 0's, else 0 (collective). */
int hvdt_same_on_all_ranks(const void *x, size_t bytes);

/* ---- Timelines: their JSON parsed (lib/core/timeline.c writes it) ---- */

/* One event of a timeline, the fields the tests read. */
struct hvdt_event {
  char name[128];  /* "name" */
  char ph[4];      /* "ph" */
  int tid;         /* "tid"; -1 when absent */
  double ts;       /* "ts"; -1 when absent */
  char track[256]; /* "args":{"name":...} (a thread_name event's track) */
  int tensors;     /* "args":{"tensors":N}; -1 when absent */
};
/* The events of a timeline's text in file order: a JSON array of objects
 * (its "]" may be missing while the file is open), keys in any order, any
 * other keys and values skipped. A malloc'd array of *n; NULL, with a diag
 * naming the offset, when the text is not such JSON. */
struct hvdt_event *hvdt_timeline_parse(const char *text, int *n);

/* The track ("tid") of tensor `name` in a timeline's text (its
 * thread_name event), or -1. */
int hvdt_timeline_track(const char *text, const char *name);
/* 1 if tensor `name`'s track has a complete span (ph "X") named `span`,
 * with the last one's "ts" in *ts (may be NULL); else 0. */
int hvdt_timeline_span(const char *text, const char *name, const char *span,
                       double *ts);
/* 1 if the last `span` of each of the n tensors starts at one time and
 * says "tensors":n (they ran as one fused group); else 0, with a diag
 * naming the first that does not. */
int hvdt_timeline_fused(const char *text, const char *const *names, int n,
                        const char *span);

/* ---- Expected values ---- */

/* acc combined with v by op: sum and average add; min, max, product. */
double hvdt_fold(hvd_op_t op, double acc, double v);
/* The result of a reduction whose fold over the ranks is acc: an average
 * divides by size (truncating toward zero for integer dtypes); then the
 * postscale multiplies. */
double hvdt_finish(hvd_op_t op, hvd_dtype_t dt, double acc, int size,
                   double post);

/* ---- Comparison ---- */

/* The expected element i; ctx is the caller's. */
typedef double (*hvdt_want_fn)(const void *ctx, int64_t i);
/* ... for ctx an array of doubles: ((const double *)ctx)[i]. */
double hvdt_want_array(const void *ctx, int64_t i);

/* How far an element may be from its expected value: within rel * |want|
 * or within ulps units in the last place of want in the dtype ({0, 0}:
 * equal). */
struct hvdt_tol {
  double rel, ulps;
};
#define HVDT_EXACT ((struct hvdt_tol){0, 0})

/* The first wrong element: its index and values. */
struct hvdt_wrong {
  int64_t at;
  double got, want;
};

/* 1 if each of the n elements of buf, of dtype dt, is want(ctx, i) within
 * tol; else 0, with the first wrong element in *w (w may be NULL). */
int hvdt_compare(hvd_dtype_t dt, const void *buf, int64_t n, hvdt_want_fn want,
                 const void *ctx, struct hvdt_tol tol, struct hvdt_wrong *w);

/* ---- Allreduce jobs ---- */

/* One allreduce of generated values. The caller fills in the first block
 * (a struct that starts zeroed), hvdt_ar_submit the rest. */
struct hvdt_ar {
  char name[48];
  hvd_dtype_t dtype;
  hvd_op_t op;
  int ndim;  /* 0 (a scalar, n = 1) or 1 ([n]) */
  int64_t n; /* elements */
  double pre, post;
  int in_place;
  int salt; /* for the caller's value function */

  void *send, *recv; /* recv is send in place */
  hvd_tensor_t ts, tr;
  hvd_request_t *req; /* NULL once done or failed */
  hvd_result_t rc;
  char msg[1024]; /* hvd_last_error() of a failure */
};

/* Rank q's element i of a's input. */
typedef double (*hvdt_value_fn)(const struct hvdt_ar *a, int q, int64_t i);

/* Allocates a's buffers (freeing any it still holds), fills send with this
 * rank's values and, out of place, recv with fill, and submits
 * hvd_allreduce_async; a failure sets rc and msg and leaves req NULL. */
void hvdt_ar_submit(struct hvdt_ar *a, hvdt_value_fn value, double fill);
/* hvd_wait for a submitted job (nothing if req is NULL); sets rc, msg. */
void hvdt_ar_wait(struct hvdt_ar *a);
/* Element i of the exact result when ranks 0..active-1 contribute their
 * values (the others the identity; an average still divides by the world
 * size). */
double hvdt_ar_expected(const struct hvdt_ar *a, hvdt_value_fn value, int64_t i,
                        int active);
/* 1 if a succeeded, every element of its result is hvdt_ar_expected as
 * the dtype holds it (a float32 average within 2 ulps) and, out of place,
 * its send buffer still holds this rank's values; else 0 with why. */
int hvdt_ar_check(const struct hvdt_ar *a, hvdt_value_fn value, int active,
                  char *why, size_t len);
/* Frees a's buffers. */
void hvdt_ar_free(struct hvdt_ar *a);

/* ---- Bursts of allreduces (t/mpi/fusion.c, t/mpi/hierarchical.c) ---- */

/* The dtypes of a burst, in order. */
#define HVDT_BURST_DTYPES 4
extern const hvd_dtype_t hvdt_burst_dtypes[HVDT_BURST_DTYPES];

/* Rank q's element i of burst job a: small integers, {-2, -1, 1, 2} for a
 * product (so that products of 4 ranks, even prescaled, stay exact). */
double hvdt_burst_value(const struct hvdt_ar *a, int q, int64_t i);

/* Writes a burst into out: for each dtype of hvdt_burst_dtypes and each
 * op, one dtype/op group (its scales chosen by dtype and op, none for
 * int32, so that the group can fuse): each size of sizes[0..nsizes)
 * (sizes[0] as a scalar, the others as [size]) out of place, then in
 * place, named "<prefix>.<dtype>.<op>.<size>.<out|in>"; then, while fewer
 * than big have been written, one [big_n] "<prefix>.<dtype>.<op>.big" for
 * sum (in place), average (out of place) and max (in place). Job k's salt
 * is (k + 1) * salt_step. Returns the number of jobs. */
int hvdt_burst(struct hvdt_ar *out, const char *prefix, const int64_t *sizes,
               int nsizes, int salt_step, int big, int64_t big_n);

/* Submits a copy of each of specs[0..n) as jobs[k] (its salt raised by
 * salt_add), with hvdt_burst_value and fill -77: in order, or with
 * `shuffled` in the order hvdt_shuffle(seed) gives. */
void hvdt_burst_submit(struct hvdt_ar *jobs, const struct hvdt_ar *specs, int n,
                       int shuffled, unsigned seed, int salt_add);

/* ---- Checks ---- */

/* A blocking sum allreduce named name of n (at most 64) elements of dtype
 * dt, out of place, rank r giving r + 1 + i at element i. Returns its
 * result; *right says whether every element is the sum over the ranks,
 * size * (size + 1) / 2 + size * i (why names the first that is not). */
hvd_result_t hvdt_sum_allreduce(const char *name, hvd_dtype_t dt, int n,
                                int *right, char *why, size_t len);

/* Two checks of hvdt_sum_allreduce (name NULL: "ok.<k>", the kth such):
 * "<what>" that it succeeds and "<what>: values" that its values are
 * right, what made by printf from fmt. */
void hvdt_allreduce_works(const char *name, hvd_dtype_t dt, int n,
                          const char *fmt, ...) TAP_PRINTF(4, 5);

/* Two checks of a collective that must fail with a mismatch: rc is
 * HVD_ERR_MISMATCH ("<what>: HVD_ERR_MISMATCH on every rank") and seen is
 * "<head>: rank 0 <field> <vals[0]> vs rank r <field> <vals[r]>, ..." for
 * every rank r whose keys[r] differs from rank 0's ("<what>: message");
 * keys NULL: the vals themselves. One entry per rank of the world. */
#define HVDT_VAL_LEN 64
void hvdt_expect_mismatch(hvd_result_t rc, const char *seen, const char *head,
                          const char *field, char vals[][HVDT_VAL_LEN],
                          char keys[][HVDT_VAL_LEN], const char *what);

/* A call refused: its result is want ("<what>: result") and
 * hvd_last_error() is msg exactly ("<what>: message"). */
void hvdt_refused(hvd_result_t want, hvd_result_t rc, const char *msg,
                  const char *what);

/* ---- Topology ---- */

/* What hvd's topology queries return on one rank. */
struct hvdt_topo {
  int rank, size, local_rank, local_size, cross_rank, cross_size, homog;
};

/* What hvd should report on rank r of size ranks when rank q runs on the
 * node named node[q]: local = ranks with the same node name, numbered in
 * rank order; cross = ranks with the same local rank, numbered in node
 * order (by each node's lowest rank); homogeneous = every node has as
 * many ranks. At most 64 ranks. */
struct hvdt_topo hvdt_topo_model(char node[][32], int size, int r);

/* Seven checks: hvd_rank ... hvd_is_homogeneous equal want's, each named
 * "<layout>: hvd_<query>". */
void hvdt_is_topo(const struct hvdt_topo *want, const char *layout);

/* hvd_init with this rank on the node "node<rank / k>" (HVD_HOSTNAME):
 * nodes of k ranks, the last one maybe fewer. A check named "hvd_init on
 * nodes of <k>"; bails out if it fails. */
void hvdt_init_nodes_of(int k);

/* ---- Files ---- */

/* The checksum of checkpoint format version 4 (lib/base/checksum.h,
 * doc/checkpoint-format.md), written plainly from its definition: the
 * bytes as little-endian 64-bit words, zero-padded to 32-byte blocks,
 * word k into lane k % 4 (lane = rotl(lane + w * K2, 31) * K1), then the
 * length and the lanes folded through splitmix64's finalizer. */
uint64_t hvdt_sum64(const void *p, size_t n);

/* ---- Orders ---- */

/* A permutation of 0..n-1 in order (Fisher-Yates driven by a 32-bit LCG
 * from seed); returns the generator's state, to seed the next one. */
unsigned hvdt_shuffle(int *order, int n, unsigned seed);

#endif /* HVD_TEST_UTIL_H */
