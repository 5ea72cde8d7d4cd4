/*
 * bench_gpu.c - the GPU modes of hvd-bench (doc/bench.md, "GPU modes"):
 *
 *   gpu-pack  the fusion buffer's batched kernels (hvd__cuda_pack and
 *             hvd__cuda_unpack, lib/ops/cuda_kernels.h: many tensors per
 *             launch) against cudaMemcpyAsync of the same bytes, one copy
 *             and one copy per tensor; over tensor counts x sizes, and the
 *             --tensors workload. Rank 0's GPU only.
 *   staged    device tensors through the host-staged executor
 *             (HVD_GPU_OPERATIONS=mpi, which hvd-bench.c sets) against the
 *             copies it is made of: every tensor device -> pinned host,
 *             then back, cudaMemcpyAsync on one stream.
 *   list --device gpu   the --tensors workload on device tensors through
 *             hvd (allreduce_async each, wait all; NCCL unless
 *             HVD_GPU_OPERATIONS=mpi) against one device-to-device
 *             cudaMemcpy of the same total bytes, and the pack + unpack
 *             kernels of that workload alone.
 *
 * GPU times are CUDA events around the work on one stream, after warmup,
 * median of --iters; gpu-pack flushes the L2 (a memset of a buffer four
 * times its size) before every timed launch, so that no case is measured
 * out of the cache. hvd's own times are the host clock from the first
 * submission to the last hvd_wait (hvd completes on its own stream, which
 * no event of ours can bracket), slowest rank's. Every method's first
 * result is checked against the host's expectation, bit for bit.
 *
 * Built twice (bench/local.mk): into the installed bin/hvd-bench, linked
 * with libhvd.so, and with HVD_BENCH_KERNELS into bin/hvd-bench-kernels,
 * linked with libhvd.a and not installed, which alone times the pack
 * kernels (internals that libhvd.so does not export). Only the CUDA
 * runtime is linked, never the driver library.
 */
#include <config.h>

#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef HVD_HAVE_CUDA

int bench_gpu_unavailable(char *why, size_t len) {
  snprintf(why, len, "this build has no CUDA (configured without it)");
  return 1;
}

/* Not reached: hvd-bench.c skips first. */
static int no_cuda(const char *mode) {
  if (bench_rank == 0)
    printf("# SKIP hvd-bench %s: this build has no CUDA\n", mode);
  return 0;
}

int bench_gpu_pack(const bench_opts_t *o) {
  (void)o;
  return no_cuda("gpu-pack");
}

int bench_staged(const bench_opts_t *o) {
  (void)o;
  return no_cuda("staged");
}

int bench_list_gpu(const bench_opts_t *o) {
  (void)o;
  return no_cuda("list --device gpu");
}

#else /* HVD_HAVE_CUDA */

#include <cuda_runtime_api.h>

#include "ops/cuda_kernels.h"

#define BENCH_CUDA(call)                                                       \
  do {                                                                         \
    cudaError_t bench__e = (call);                                             \
    if (bench__e != cudaSuccess)                                               \
      bench_fail("%s failed: %s (%s)", #call, cudaGetErrorString(bench__e),    \
                 cudaGetErrorName(bench__e));                                  \
  } while (0)

#define PACK_TARGET 0.80             /* pack/memcpy bandwidth, at least */
#define LIST_TARGET 1.20             /* hvd / cudaMemcpy time, at most */
#define STAGED_TARGET 0.70           /* staged / copies bandwidth, at least */
#define MAX_TOTAL (INT64_C(1) << 30) /* gpu-pack: bytes per case */
#define ALIGN_ELEMS 64 /* tensors 256-byte aligned, as cudaMalloc */

int bench_gpu_unavailable(char *why, size_t len) {
  const char *reason = hvd_cuda_unavailable();
  if (reason == NULL)
    return 0;
  snprintf(why, len, "no CUDA device: %s", reason);
  for (char *p = why; *p; p++) /* it goes into JSON unescaped */
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
      *p = '\'';
  return 1;
}

/* ---- helpers ------------------------------------------------------------ */

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  BENCH_CUDA(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  return p;
}

/* The rank's GPU current on this thread; "NAME (cc X.Y, N SMs, L2 M MiB,
 * G GiB)" into buf; its L2 bytes. */
static int64_t use_device(char *buf, size_t len) {
  struct cudaDeviceProp p;
  int d = hvd_cuda_device();
  if (d >= 0)
    BENCH_CUDA(cudaSetDevice(d));
  BENCH_CUDA(cudaGetDevice(&d));
  BENCH_CUDA(cudaGetDeviceProperties(&p, d));
  snprintf(buf, len, "cuda:%d %.128s (cc %d.%d, %d SMs, L2 %.0f MiB, %.0f GiB)",
           d, p.name, p.major, p.minor, p.multiProcessorCount,
           p.l2CacheSize / 1048576.0, (double)p.totalGlobalMem / 1073741824.0);
  return p.l2CacheSize;
}

/* Event timing on one stream, with an optional L2 flush before. */
typedef struct gclock {
  cudaStream_t s;
  cudaEvent_t a, b;
  void *flush;
  size_t flush_bytes;
  int flushes;
} gclock_t;

static void gclock_init(gclock_t *g, size_t flush_bytes) {
  memset(g, 0, sizeof *g);
  BENCH_CUDA(cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking));
  BENCH_CUDA(cudaEventCreate(&g->a));
  BENCH_CUDA(cudaEventCreate(&g->b));
  if (flush_bytes > 0) {
    g->flush = dev_alloc(flush_bytes);
    g->flush_bytes = flush_bytes;
  }
}

static void gclock_free(gclock_t *g) {
  BENCH_CUDA(cudaStreamSynchronize(g->s));
  BENCH_CUDA(cudaEventDestroy(g->a));
  BENCH_CUDA(cudaEventDestroy(g->b));
  BENCH_CUDA(cudaStreamDestroy(g->s));
  BENCH_CUDA(cudaFree(g->flush));
}

/* Before the work: the flush (not timed), then the first event. */
static void gclock_start(gclock_t *g) {
  if (g->flush != NULL)
    BENCH_CUDA(
        cudaMemsetAsync(g->flush, g->flushes++ & 0xff, g->flush_bytes, g->s));
  BENCH_CUDA(cudaEventRecord(g->a, g->s));
}

/* After the work: milliseconds between the events. */
static double gclock_stop(gclock_t *g) {
  float ms = 0;
  BENCH_CUDA(cudaEventRecord(g->b, g->s));
  BENCH_CUDA(cudaEventSynchronize(g->b));
  BENCH_CUDA(cudaEventElapsedTime(&ms, g->a, g->b));
  return ms;
}

#ifdef HVD_BENCH_KERNELS
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* Random finite floats of any mantissa, |v| < 2 (bit 30 cleared): never
 * zeros, and no NaN that a copy might not preserve. */
static void random_floats(float *v, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t x = rng_state += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    uint32_t b = (uint32_t)(x >> 32) & 0xbfffffffu;
    memcpy(&v[i], &b, sizeof b);
  }
}

static double median_of(double *v, int n) { return bench_stats(v, n).median; }
#endif

static int iters_or(const bench_opts_t *o, int dflt) {
  return o->iters > 0 ? o->iters : dflt;
}
static int warmup_or(const bench_opts_t *o, int dflt) {
  return o->warmup >= 0 ? o->warmup : dflt;
}

/* ---- gpu-pack ----------------------------------------------------------- */

/* gpu-pack and the "kernels alone" row of list --device gpu time libhvd's
 * internal kernels (hvd__cuda_pack/unpack), which libhvd.so does not
 * export: only bin/hvd-bench-kernels, linked with libhvd.a and not
 * installed, has them (HVD_BENCH_KERNELS). */
#ifndef HVD_BENCH_KERNELS
int bench_gpu_pack(const bench_opts_t *o) {
  (void)o;
  if (bench_rank == 0)
    fprintf(stderr, "hvd-bench: gpu-pack times libhvd's internal kernels: "
                    "run bin/hvd-bench-kernels of the build tree\n");
  return 2;
}
#else
enum { P_PACK, P_UNPACK, P_COPY, P_EACH, P_N };
static const char *const pack_keys[P_N] = {"pack", "unpack", "memcpy",
                                           "memcpy_each"};

typedef struct pcase {
  char label[96];
  int n;          /* tensors */
  int64_t *count; /* elements of each */
  int64_t total;  /* elements in all */
  int64_t maxc;   /* the largest count */
} pcase_t;

typedef struct presult {
  double us[P_N]; /* medians */
  int ok;
} presult_t;

/* One case's memory: tensors in a source arena (each 256-byte aligned),
 * packed into a fusion buffer (back to back, as hvd packs), unpacked into
 * a third arena laid out as the first; the spans of both launches. The
 * helpers below name these as locals of the same names, so that the calls
 * BENCH_CUDA and BENCH_HVD quote on failure read as they always have. */
typedef struct parena {
  int64_t *off;  /* each tensor's place in the arenas */
  int64_t *at;   /* and in the fusion buffer */
  int64_t arena; /* elements of an arena */
  size_t bytes;  /* of the fusion buffer */
  float *src, *dst, *buf;
  float *hsrc, *hout;
  size_t span_bytes;
  hvd__cuda_span_t *sp, *dsp; /* pack's n spans, then unpack's n */
} parena_t;

/* The arenas laid out and allocated, the source filled with random
 * floats, the spans on the device. */
static void parena_make(parena_t *a, const pcase_t *c) {
  int64_t *off = bench_alloc(sizeof *off * (size_t)c->n);
  int64_t *at = bench_alloc(sizeof *at * (size_t)c->n);
  int64_t arena = 0, pos = 0;
  for (int i = 0; i < c->n; i++) {
    off[i] = arena;
    at[i] = pos;
    arena += (c->count[i] + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    pos += c->count[i];
  }
  size_t bytes = sizeof(float) * (size_t)c->total;
  float *src = dev_alloc(sizeof(float) * (size_t)arena);
  float *dst = dev_alloc(sizeof(float) * (size_t)arena);
  float *buf = dev_alloc(bytes);
  float *hsrc = bench_alloc(sizeof(float) * (size_t)arena);
  float *hout = bench_alloc(sizeof(float) * (size_t)arena);
  size_t span_bytes = sizeof(hvd__cuda_span_t) * (size_t)c->n;
  hvd__cuda_span_t *sp = bench_alloc(2 * span_bytes);
  hvd__cuda_span_t *dsp = dev_alloc(2 * span_bytes);
  for (int i = 0; i < c->n; i++) {
    sp[i] = (hvd__cuda_span_t){src + off[i], buf + at[i], c->count[i]};
    sp[c->n + i] = (hvd__cuda_span_t){buf + at[i], dst + off[i], c->count[i]};
  }
  BENCH_CUDA(cudaMemcpy(dsp, sp, 2 * span_bytes, cudaMemcpyHostToDevice));
  random_floats(hsrc, arena);
  BENCH_CUDA(cudaMemcpy(src, hsrc, sizeof(float) * (size_t)arena,
                        cudaMemcpyHostToDevice));
  *a = (parena_t){.off = off,
                  .at = at,
                  .arena = arena,
                  .bytes = bytes,
                  .src = src,
                  .dst = dst,
                  .buf = buf,
                  .hsrc = hsrc,
                  .hout = hout,
                  .span_bytes = span_bytes,
                  .sp = sp,
                  .dsp = dsp};
}

static void parena_free(parena_t *a) {
  hvd__cuda_span_t *dsp = a->dsp;
  float *src = a->src, *dst = a->dst, *buf = a->buf;
  free(a->sp);
  free(a->hsrc);
  free(a->hout);
  free(a->off);
  free(a->at);
  BENCH_CUDA(cudaFree(dsp));
  BENCH_CUDA(cudaFree(src));
  BENCH_CUDA(cudaFree(dst));
  BENCH_CUDA(cudaFree(buf));
}

/* The check: pack into a poisoned buffer, unpack (x 0.5, the average over
 * 2 ranks) into a poisoned arena; 1 if both came out bit for bit. g->s
 * does not wait for the legacy stream that cudaMemcpy and cudaMemset use:
 * synchronise first. */
static int pack_check(const pcase_t *c, const parena_t *a, gclock_t *g) {
  const int64_t *off = a->off, *at = a->at;
  int64_t arena = a->arena, wrong = 0;
  size_t bytes = a->bytes;
  float *dst = a->dst, *buf = a->buf, *hsrc = a->hsrc, *hout = a->hout;
  hvd__cuda_span_t *dsp = a->dsp;
  BENCH_CUDA(cudaMemset(buf, 0xff, bytes));
  BENCH_CUDA(cudaMemset(dst, 0xff, sizeof(float) * (size_t)arena));
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_HVD(
      hvd__cuda_pack(dsp, c->n, c->maxc, HVD_FLOAT32, HVD_FLOAT32, 1.0, g->s));
  BENCH_HVD(hvd__cuda_unpack(dsp + c->n, c->n, c->maxc, HVD_FLOAT32,
                             HVD_FLOAT32, HVD_AVERAGE, 1.0, 2, g->s));
  BENCH_CUDA(cudaStreamSynchronize(g->s));
  BENCH_CUDA(cudaMemcpy(hout, buf, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < c->n; i++)
    if (memcmp(hout + at[i], hsrc + off[i], sizeof(float) * c->count[i]) != 0)
      if (wrong++ == 0)
        fprintf(stderr, "[rank %d] gpu-pack %s: pack of tensor %d is wrong\n",
                bench_rank, c->label, i);
  BENCH_CUDA(cudaMemcpy(hout, dst, sizeof(float) * (size_t)arena,
                        cudaMemcpyDeviceToHost));
  for (int i = 0; i < c->n; i++)
    for (int64_t k = 0; k < c->count[i]; k++) {
      float want = hsrc[off[i] + k] * 0.5f;
      if (memcmp(&hout[off[i] + k], &want, sizeof want) != 0 && wrong++ == 0)
        fprintf(stderr,
                "[rank %d] gpu-pack %s: unpack of tensor %d [%lld] is %g, "
                "expected %g\n",
                bench_rank, c->label, i, (long long)k, (double)hout[off[i] + k],
                (double)want);
    }
  return wrong == 0;
}

/* One launch of method m (a P_ value) on g's stream. */
static void pack_method(const pcase_t *c, const parena_t *a, gclock_t *g,
                        int m) {
  const int64_t *off = a->off, *at = a->at;
  size_t bytes = a->bytes;
  float *src = a->src, *buf = a->buf;
  hvd__cuda_span_t *dsp = a->dsp;
  switch (m) {
  case P_PACK:
    BENCH_HVD(hvd__cuda_pack(dsp, c->n, c->maxc, HVD_FLOAT32, HVD_FLOAT32, 1.0,
                             g->s));
    break;
  case P_UNPACK:
    BENCH_HVD(hvd__cuda_unpack(dsp + c->n, c->n, c->maxc, HVD_FLOAT32,
                               HVD_FLOAT32, HVD_AVERAGE, 1.0, 2, g->s));
    break;
  case P_COPY:
    BENCH_CUDA(
        cudaMemcpyAsync(buf, src, bytes, cudaMemcpyDeviceToDevice, g->s));
    break;
  default:
    for (int i = 0; i < c->n; i++)
      BENCH_CUDA(cudaMemcpyAsync(buf + at[i], src + off[i],
                                 sizeof(float) * (size_t)c->count[i],
                                 cudaMemcpyDeviceToDevice, g->s));
    break;
  }
}

/* Timed: the methods in turn, each after an L2 flush; their medians (us)
 * into us[P_N]. */
static void pack_time(const pcase_t *c, const parena_t *a, gclock_t *g,
                      int iters, int warmup, double *us) {
  double *t = bench_alloc(sizeof *t * (size_t)iters * P_N);
  for (int k = -warmup; k < iters; k++)
    for (int m = 0; m < P_N; m++) {
      gclock_start(g);
      pack_method(c, a, g, m);
      double ms = gclock_stop(g);
      if (k >= 0)
        t[(size_t)m * iters + k] = ms;
    }
  for (int m = 0; m < P_N; m++)
    us[m] = 1e3 * median_of(t + (size_t)m * iters, iters);
  free(t);
}

/* One case: its memory made, checked, timed, freed. */
static presult_t pack_case(const pcase_t *c, gclock_t *g, int iters,
                           int warmup) {
  presult_t r;
  parena_t a;
  parena_make(&a, c);
  r.ok = pack_check(c, &a, g);
  pack_time(c, &a, g, iters, warmup, r.us);
  parena_free(&a);
  return r;
}

/* Why a case misses the target, from its own numbers (doc/bench.md). */
static const char *pack_note(const pcase_t *c, const presult_t *r,
                             double floor_us) {
  double ratio = r->us[P_COPY] / r->us[P_PACK];
  double uratio = r->us[P_COPY] / r->us[P_UNPACK];
  if (ratio >= PACK_TARGET && uratio >= PACK_TARGET)
    return "ok";
  if (r->us[P_PACK] < 3 * floor_us)
    return "launch-bound";
  if (4.0 * (double)c->total / c->n < 256.0 * 1024)
    return "small-tensors";
  return "bandwidth";
}

/* gpu-pack's state: the options, the device, the cases and their results,
 * and the tallies the reports share. */
typedef struct pbench {
  const bench_opts_t *o;
  int iters, warmup;
  char dev[256];
  size_t flush; /* bytes memset before each timed launch */
  workload_t w;
  int have_w;
  int64_t one; /* the launch floor's one element */
  pcase_t *cs; /* cs[0] the launch floor (not a row), the workload last */
  presult_t *res;
  int ncase, ok, met, rows;
  double floor_pack, floor_copy, w_ratio, w_uratio;
} pbench_t;

/* The cases: the launch floor first (not a row), then counts x sizes,
 * then the workload. */
static void pack_cases(pbench_t *pb) {
  const bench_opts_t *o = pb->o;
  char sz[32];
  int ncase = 0, cap = 2 + o->ncounts * 64;
  pcase_t *cs = bench_alloc(sizeof *cs * (size_t)cap);
  pb->one = 1;
  cs[ncase++] =
      (pcase_t){"launch floor: 1 tensor of 1 element", 1, &pb->one, 1, 1};
  for (int ci = 0; ci < o->ncounts; ci++)
    for (int64_t b = o->min_bytes; b <= o->max_bytes; b *= o->step_factor) {
      int n = o->counts[ci];
      int64_t e = b / 4 > 0 ? b / 4 : 1;
      if (e * 4 * n > MAX_TOTAL || ncase == cap - 1)
        continue;
      pcase_t *c = &cs[ncase++];
      c->n = n;
      c->count = bench_alloc(sizeof *c->count * (size_t)n);
      for (int i = 0; i < n; i++)
        c->count[i] = e;
      c->total = e * n;
      c->maxc = e;
      snprintf(c->label, sizeof c->label, "%d x %s", n,
               bench_bytes_str(4.0 * (double)e, sz, sizeof sz));
      if (b > INT64_MAX / o->step_factor)
        break;
    }
  if (pb->have_w) {
    const workload_t *w = &pb->w;
    pcase_t *c = &cs[ncase++];
    const char *base = strrchr(o->tensors, '/');
    c->n = w->count;
    c->count = bench_alloc(sizeof *c->count * (size_t)w->count);
    c->total = 0;
    c->maxc = 0;
    for (int i = 0; i < w->count; i++) { /* reverse order, as backward */
      c->count[i] = w->t[w->count - 1 - i].n;
      c->total += c->count[i];
      c->maxc = c->count[i] > c->maxc ? c->count[i] : c->maxc;
    }
    snprintf(c->label, sizeof c->label, "%s", base ? base + 1 : o->tensors);
  }
  pb->cs = cs;
  pb->ncase = ncase;
}

/* The launch floor, and how many rows (and the workload) meet the
 * target. */
static void pack_tally(pbench_t *pb) {
  const presult_t *res = pb->res;
  int ncase = pb->ncase;
  pb->floor_pack = res[0].us[P_PACK];
  pb->floor_copy = res[0].us[P_COPY];
  pb->met = 0;
  pb->rows = ncase - 1;
  pb->w_ratio = -1;
  pb->w_uratio = -1;
  for (int i = 1; i < ncase; i++) {
    double ratio = res[i].us[P_COPY] / res[i].us[P_PACK];
    double uratio = res[i].us[P_COPY] / res[i].us[P_UNPACK];
    pb->met += ratio >= PACK_TARGET && uratio >= PACK_TARGET;
    if (pb->have_w && i == ncase - 1) {
      pb->w_ratio = ratio;
      pb->w_uratio = uratio;
    }
  }
}

/* One row of the JSON report. */
static void pack_json_row(const pbench_t *pb, int i) {
  const pcase_t *c = &pb->cs[i];
  const presult_t *res = pb->res;
  double bytes = 4.0 * (double)c->total;
  bench_json_open(NULL, '{');
  bench_json_str("case", c->label);
  bench_json_bool("workload", pb->have_w && i == pb->ncase - 1);
  bench_json_int("tensors", c->n);
  bench_json_int("bytes", (int64_t)bytes);
  bench_json_int("max_tensor_bytes", 4 * c->maxc);
  for (int m = 0; m < P_N; m++) {
    char key[64];
    snprintf(key, sizeof key, "%s_us", pack_keys[m]);
    bench_json_num(key, res[i].us[m]);
    snprintf(key, sizeof key, "%s_gbps", pack_keys[m]);
    bench_json_num(key, 2 * bytes / (res[i].us[m] * 1e-6) / 1e9);
  }
  bench_json_num("pack_over_memcpy", res[i].us[P_COPY] / res[i].us[P_PACK]);
  bench_json_num("unpack_over_memcpy", res[i].us[P_COPY] / res[i].us[P_UNPACK]);
  bench_json_str("note", pack_note(c, &res[i], pb->floor_pack));
  bench_json_bool("correct", res[i].ok);
  bench_json_close('}');
}

static void pack_json(const pbench_t *pb) {
  bench_json_header("gpu-pack");
  bench_json_str("device", pb->dev);
  bench_json_int("iters", pb->iters);
  bench_json_int("warmup", pb->warmup);
  bench_json_int("l2_flush_bytes", (int64_t)pb->flush);
  bench_json_num("launch_floor_pack_us", pb->floor_pack);
  bench_json_num("launch_floor_memcpy_us", pb->floor_copy);
  bench_json_num("target_pack_over_memcpy", PACK_TARGET);
  bench_json_open("rows", '[');
  for (int i = 1; i < pb->ncase; i++)
    pack_json_row(pb, i);
  bench_json_close(']');
  bench_json_int("cases", pb->rows);
  bench_json_int("cases_meeting_target", pb->met);
  if (pb->have_w) {
    bench_json_num("workload_pack_over_memcpy", pb->w_ratio);
    bench_json_num("workload_unpack_over_memcpy", pb->w_uratio);
  }
  bench_json_bool("correct", pb->ok);
  bench_json_close('}');
}

static void pack_text(const pbench_t *pb) {
  const pcase_t *cs = pb->cs;
  const presult_t *res = pb->res;
  int ncase = pb->ncase;
  char sz[32], sz2[32];
  printf("# hvd-bench gpu-pack: %s; hvd %s\n", pb->dev, hvd_version());
  printf("# float32; median of %d after %d warmup, CUDA events; L2 flushed "
         "(%s memset) before each; GB/s count bytes read + written\n",
         pb->iters, pb->warmup,
         bench_bytes_str((double)pb->flush, sz, sizeof sz));
  printf("# pack: hvd__cuda_pack (copy); unpack: hvd__cuda_unpack (average "
         "over 2 ranks, x 0.5); memcpy: one cudaMemcpyAsync D2D of all the "
         "bytes; each: one per tensor\n");
  printf("# launch floor (1 element): pack %.2f us, cudaMemcpyAsync %.2f "
         "us\n",
         pb->floor_pack, pb->floor_copy);
  printf("%-26s %12s %9s %9s %9s %10s %9s %9s %8s %8s %5s %s\n", "case",
         "total", "pack_us", "unpack_us", "memcpy_us", "each_us", "pack_GBps",
         "mcpy_GBps", "pk/mcpy", "upk/mcpy", "check", "note");
  for (int i = 1; i < ncase; i++) {
    const pcase_t *c = &cs[i];
    double bytes = 4.0 * (double)c->total;
    printf("%-26s %12s %9.2f %9.2f %9.2f %10.2f %9.1f %9.1f %8.3f %8.3f %5s "
           "%s\n",
           c->label, bench_bytes_str(bytes, sz, sizeof sz), res[i].us[P_PACK],
           res[i].us[P_UNPACK], res[i].us[P_COPY], res[i].us[P_EACH],
           2 * bytes / (res[i].us[P_PACK] * 1e-6) / 1e9,
           2 * bytes / (res[i].us[P_COPY] * 1e-6) / 1e9,
           res[i].us[P_COPY] / res[i].us[P_PACK],
           res[i].us[P_COPY] / res[i].us[P_UNPACK], res[i].ok ? "ok" : "WRONG",
           pack_note(c, &res[i], pb->floor_pack));
  }
  printf("gpu-pack: %d of %d cases at pack/memcpy and unpack/memcpy >= "
         "%.2f",
         pb->met, pb->rows, PACK_TARGET);
  if (pb->have_w)
    printf("; workload %s (%s): pack/memcpy %.3f, unpack/memcpy %.3f: "
           "target %s",
           cs[ncase - 1].label,
           bench_bytes_str(4.0 * (double)cs[ncase - 1].total, sz2, sizeof sz2),
           pb->w_ratio, pb->w_uratio,
           pb->w_ratio >= PACK_TARGET && pb->w_uratio >= PACK_TARGET
               ? "met"
               : "NOT met");
  printf("\n");
  fflush(stdout);
}

/* Rank 0's part: every case on its GPU, then the report; pb->ok says
 * whether every case was right. */
static void pack_measure(pbench_t *pb) {
  int64_t l2 = use_device(pb->dev, sizeof pb->dev);
  gclock_t g;
  pb->flush = (size_t)(l2 > 0 ? 4 * l2 : 256 << 20);
  gclock_init(&g, pb->flush);
  pack_cases(pb);
  pb->res = bench_alloc(sizeof *pb->res * (size_t)pb->ncase);
  for (int i = 0; i < pb->ncase; i++) {
    pb->res[i] = pack_case(&pb->cs[i], &g, pb->iters, pb->warmup);
    pb->ok &= pb->res[i].ok;
  }
  pack_tally(pb);
  if (pb->o->json)
    pack_json(pb);
  else
    pack_text(pb);
  for (int i = 1; i < pb->ncase; i++)
    free(pb->cs[i].count);
  free(pb->cs);
  free(pb->res);
  gclock_free(&g);
}

int bench_gpu_pack(const bench_opts_t *o) {
  pbench_t pb;
  memset(&pb, 0, sizeof pb);
  pb.o = o;
  pb.iters = iters_or(o, 30);
  pb.warmup = warmup_or(o, 3);
  pb.ok = 1;
  if (o->tensors != NULL) {
    if (!bench_load_workload(o->tensors, &pb.w, BENCH_DATA_NONE))
      return 2;
    pb.have_w = 1;
  }
  /* one GPU's kernels: rank 0 measures, the others wait at the barrier */
  if (bench_rank == 0)
    pack_measure(&pb);
  if (pb.have_w)
    bench_free_workload(&pb.w);
  BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
  return bench_all_ok(pb.ok) ? 0 : 1;
}
#endif /* HVD_BENCH_KERNELS */

/* ---- device workloads (list --device gpu, staged) ------------------------ */

/* Tensors on the device, one cudaMalloc each (hvd sees them as a training
 * program's gradients), with a host image of the inputs. */
typedef struct dwork {
  int n;
  char **names;
  int64_t (*shape)[2];
  int *nd;
  int64_t *count;
  int64_t total;
  float **d;   /* device tensors */
  float **hin; /* this rank's inputs */
  hvd_request_t **req;
} dwork_t;

static void dwork_make(dwork_t *x, const workload_t *w) {
  memset(x, 0, sizeof *x);
  x->n = w->count;
  x->names = bench_alloc(sizeof *x->names * (size_t)x->n);
  x->shape = bench_alloc(sizeof *x->shape * (size_t)x->n);
  x->nd = bench_alloc(sizeof *x->nd * (size_t)x->n);
  x->count = bench_alloc(sizeof *x->count * (size_t)x->n);
  x->d = bench_alloc(sizeof *x->d * (size_t)x->n);
  x->hin = bench_alloc(sizeof *x->hin * (size_t)x->n);
  x->req = bench_alloc(sizeof *x->req * (size_t)x->n);
  for (int t = 0; t < x->n; t++) {
    x->names[t] = w->t[t].name;
    x->nd[t] = w->t[t].ndim;
    x->shape[t][0] = w->t[t].shape[0];
    x->shape[t][1] = w->t[t].shape[1];
    x->count[t] = w->t[t].n;
    x->total += x->count[t];
    x->d[t] = dev_alloc(sizeof(float) * (size_t)x->count[t]);
    x->hin[t] = bench_alloc(sizeof(float) * (size_t)x->count[t]);
    for (int64_t i = 0; i < x->count[t]; i++)
      x->hin[t][i] = bench_input_value(t, i, bench_rank);
  }
}

/* One tensor of `bytes` as a workload, named "staged.<bytes>" (the name
 * lives until the next call). */
static void dwork_one(dwork_t *x, int64_t bytes) {
  static char name[64];
  workload_t w;
  ltensor_t t;
  snprintf(name, sizeof name, "staged.%lld", (long long)bytes);
  memset(&t, 0, sizeof t);
  t.name = name;
  t.ndim = 1;
  t.n = bytes / 4 > 0 ? bytes / 4 : 1;
  t.shape[0] = t.n;
  w.t = &t;
  w.count = 1;
  w.elems = t.n;
  w.packed = NULL;
  dwork_make(x, &w);
}

static void dwork_free(dwork_t *x) {
  for (int t = 0; t < x->n; t++) {
    BENCH_CUDA(cudaFree(x->d[t]));
    free(x->hin[t]);
  }
  free(x->names);
  free(x->shape);
  free(x->nd);
  free(x->count);
  free(x->d);
  free(x->hin);
  free(x->req);
  memset(x, 0, sizeof *x);
}

/* The inputs onto the device, complete before hvd sees them (a copy from
 * pageable memory may return before its DMA is done; hvd's stream waits
 * for no other). */
static void dwork_fill(dwork_t *x) {
  for (int t = 0; t < x->n; t++)
    BENCH_CUDA(cudaMemcpy(x->d[t], x->hin[t], sizeof(float) * x->count[t],
                          cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaDeviceSynchronize());
}

/* Every tensor holds its base values (the average over the ranks)? */
static int dwork_check(const dwork_t *x, const char *what) {
  int64_t wrong = 0;
  for (int t = 0; t < x->n; t++) {
    float *h = bench_alloc(sizeof(float) * (size_t)x->count[t]);
    BENCH_CUDA(cudaMemcpy(h, x->d[t], sizeof(float) * x->count[t],
                          cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < x->count[t]; i++)
      if (h[i] != bench_base_value(t, i) && wrong++ == 0)
        fprintf(stderr, "[rank %d] %s: %s[%lld] is %g, expected %g\n",
                bench_rank, what, x->names[t], (long long)i, (double)h[i],
                (double)bench_base_value(t, i));
    free(h);
  }
  if (wrong > 0)
    fprintf(stderr, "[rank %d] %s: %lld elements wrong\n", bench_rank, what,
            (long long)wrong);
  return bench_all_ok(wrong == 0);
}

/* hvd: every tensor allreduce_async (average, in place) in reverse order,
 * then every request waited for. Seconds, this rank's. */
static double run_hvd(dwork_t *x, int dev) {
  double t0 = bench_now();
  int k = 0;
  for (int t = x->n - 1; t >= 0; t--) {
    hvd_tensor_t v =
        hvd_tensor_make(x->d[t], HVD_FLOAT32, x->nd[t], x->shape[t]);
    v.device = dev;
    BENCH_HVD(hvd_allreduce_async(x->names[t], &v, &v, HVD_AVERAGE, 1.0, 1.0,
                                  &x->req[k++]));
  }
  for (int i = 0; i < k; i++)
    BENCH_HVD(hvd_wait(x->req[i]));
  return bench_now() - t0;
}

/* hvd's times (ms, slowest rank's) over iters after warmup, a barrier
 * before each; the first run, from fresh inputs, is checked. */
static bench_stats_t time_hvd(dwork_t *x, int dev, int iters, int warmup,
                              const char *what, int *ok) {
  double *t = bench_alloc(sizeof *t * (size_t)iters);
  dwork_fill(x);
  BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
  run_hvd(x, dev);
  *ok = dwork_check(x, what);
  for (int k = 1; k < warmup; k++)
    run_hvd(x, dev);
  for (int k = 0; k < iters; k++) {
    BENCH_MPI(MPI_Barrier(MPI_COMM_WORLD));
    t[k] = 1e3 * run_hvd(x, dev);
  }
  bench_max_over_ranks(t, iters);
  bench_stats_t st = bench_stats(t, iters);
  free(t);
  return st;
}

/* Event and host-clock times (ms, slowest rank's) of fn over iters after
 * warmup. */
typedef void (*gwork_fn)(void *ctx, cudaStream_t s);
typedef struct gtimes {
  bench_stats_t ev, host;
} gtimes_t;

static gtimes_t time_gpu(gclock_t *g, gwork_fn fn, void *ctx, int iters,
                         int warmup) {
  double *ev = bench_alloc(sizeof *ev * (size_t)iters);
  double *host = bench_alloc(sizeof *host * (size_t)iters);
  gtimes_t r;
  for (int k = -warmup; k < iters; k++) {
    double t0 = bench_now();
    gclock_start(g);
    fn(ctx, g->s);
    double ms = gclock_stop(g); /* synchronises */
    if (k >= 0) {
      ev[k] = ms;
      host[k] = 1e3 * (bench_now() - t0);
    }
  }
  bench_max_over_ranks(ev, iters);
  bench_max_over_ranks(host, iters);
  r.ev = bench_stats(ev, iters);
  r.host = bench_stats(host, iters);
  free(ev);
  free(host);
  return r;
}

static int64_t dev_free_bytes(void) {
  size_t fr = 0, tot = 0;
  BENCH_CUDA(cudaMemGetInfo(&fr, &tot));
  return (int64_t)fr;
}

/* ---- list --device gpu -------------------------------------------------- */

typedef struct lctx {
  dwork_t *x;
  float *a, *b; /* packed copies: total floats each */
  hvd__cuda_span_t *dsp;
} lctx_t;

static void one_memcpy(void *p, cudaStream_t s) {
  lctx_t *c = p;
  BENCH_CUDA(cudaMemcpyAsync(c->b, c->a, sizeof(float) * (size_t)c->x->total,
                             cudaMemcpyDeviceToDevice, s));
}

#ifdef HVD_BENCH_KERNELS
static int64_t max_count(const dwork_t *x) {
  int64_t m = 0;
  for (int t = 0; t < x->n; t++)
    m = x->count[t] > m ? x->count[t] : m;
  return m;
}
#endif

#ifdef HVD_BENCH_KERNELS
static void pack_unpack(void *p, cudaStream_t s) {
  lctx_t *c = p;
  int64_t m = max_count(c->x);
  BENCH_HVD(
      hvd__cuda_pack(c->dsp, c->x->n, m, HVD_FLOAT32, HVD_FLOAT32, 1.0, s));
  BENCH_HVD(hvd__cuda_unpack(c->dsp + c->x->n, c->x->n, m, HVD_FLOAT32,
                             HVD_FLOAT32, HVD_AVERAGE, 1.0, bench_size, s));
}
#endif

/* list --device gpu's state: the workload on the device, hvd's times and
 * the baselines'. */
typedef struct lgpu {
  const bench_opts_t *o;
  int iters, warmup;
  workload_t w;
  dwork_t x;
  char dev[256];
  int ok_hvd;
  const char *exec;  /* the executor hvd uses: "nccl" or "mpi-staged" */
  bench_stats_t h;   /* hvd */
  int64_t hvd_added; /* device bytes */
  size_t bytes;      /* of the workload */
  lctx_t c;
  hvd__cuda_span_t *sp;
  gtimes_t mc, pu; /* one memcpy; the pack + unpack kernels */
} lgpu_t;

/* The baselines, after hvd: one packed copy, and the kernels alone. */
static void list_gpu_baselines(lgpu_t *l) {
  dwork_t *x = &l->x;
  size_t bytes = sizeof(float) * (size_t)x->total;
  lctx_t c = {x, dev_alloc(bytes), dev_alloc(bytes), NULL};
  size_t span_bytes = sizeof(hvd__cuda_span_t) * (size_t)x->n;
  hvd__cuda_span_t *sp = bench_alloc(2 * span_bytes);
  int64_t at = 0;
  for (int t = x->n - 1, i = 0; t >= 0; t--, i++) { /* reverse, as hvd */
    sp[i] = (hvd__cuda_span_t){x->d[t], c.a + at, x->count[t]};
    sp[x->n + i] = (hvd__cuda_span_t){c.a + at, x->d[t], x->count[t]};
    at += x->count[t];
  }
  c.dsp = dev_alloc(2 * span_bytes);
  BENCH_CUDA(cudaMemcpy(c.dsp, sp, 2 * span_bytes, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemset(c.a, 0, bytes));
  BENCH_CUDA(cudaDeviceSynchronize()); /* before g.s, which waits for none */
  gclock_t g;
  gclock_init(&g, 0); /* the workload is far larger than the L2 */
  gtimes_t mc = time_gpu(&g, one_memcpy, &c, l->iters, l->warmup);
#ifdef HVD_BENCH_KERNELS
  gtimes_t pu = time_gpu(&g, pack_unpack, &c, l->iters, l->warmup);
#else
  gtimes_t pu; /* not measured here: NaN, shown as "nan" and null */
  pu.ev.median = pu.ev.min = pu.ev.max = pu.host.median = NAN;
#endif
  gclock_free(&g);
  l->bytes = bytes;
  l->c = c;
  l->sp = sp;
  l->mc = mc;
  l->pu = pu;
}

static void list_gpu_json(const lgpu_t *l) {
  const bench_stats_t *h = &l->h;
  bench_json_header("list-gpu");
  bench_json_str("device", l->dev);
  bench_json_str("executor", l->exec);
  bench_json_open("workload", '{');
  bench_json_str("file", l->o->tensors);
  bench_json_int("tensors", l->x.n);
  bench_json_int("elements", l->x.total);
  bench_json_int("bytes", (int64_t)l->bytes);
  bench_json_close('}');
  bench_json_int("iters", l->iters);
  bench_json_int("warmup", l->warmup);
  bench_json_num("hvd_median_ms", h->median);
  bench_json_num("hvd_min_ms", h->min);
  bench_json_num("hvd_max_ms", h->max);
  bench_json_bool("hvd_correct", l->ok_hvd);
  bench_json_num("memcpy_event_median_ms", l->mc.ev.median);
  bench_json_num("memcpy_host_median_ms", l->mc.host.median);
  bench_json_num("pack_unpack_event_median_ms", l->pu.ev.median);
  bench_json_num("pack_unpack_host_median_ms", l->pu.host.median);
  bench_json_num("hvd_over_memcpy", h->median / l->mc.ev.median);
  bench_json_num("hvd_over_memcpy_host", h->median / l->mc.host.median);
  bench_json_num("target_hvd_over_memcpy", LIST_TARGET);
  bench_json_int("hvd_device_bytes_added", l->hvd_added);
  bench_json_bool("correct", l->ok_hvd);
  bench_json_close('}');
}

static void list_gpu_text(const lgpu_t *l) {
  const bench_stats_t *h = &l->h;
  const gtimes_t *mc = &l->mc, *pu = &l->pu;
  double ratio = h->median / mc->ev.median;
  char sz[32], env[512];
  printf("# hvd-bench list --device gpu: %s: %d tensors, %s float32; %d "
         "rank%s; executor %s; %s; hvd %s\n",
         l->o->tensors, l->x.n,
         bench_bytes_str((double)l->bytes, sz, sizeof sz), bench_size,
         bench_size == 1 ? "" : "s", l->exec, l->dev, hvd_version());
  printf("# median of %d after %d warmup, slowest rank's; hvd: host clock, "
         "submit to last wait; the others: CUDA events (host clock "
         "beside); env: %s\n",
         l->iters, l->warmup, bench_env_line(env, sizeof env));
  printf("%-50s %10s %10s %10s %9s %5s\n", "method", "median_ms", "min_ms",
         "max_ms", "host_ms", "check");
  printf("%-50s %10.3f %10.3f %10.3f %9.3f %5s\n",
         "hvd: allreduce_async each (average) + wait all", h->median, h->min,
         h->max, h->median, l->ok_hvd ? "ok" : "WRONG");
  printf("%-50s %10.3f %10.3f %10.3f %9.3f %5s\n",
         "cudaMemcpyAsync D2D of all the bytes (one copy)", mc->ev.median,
         mc->ev.min, mc->ev.max, mc->host.median, "-");
  printf("%-50s %10.3f %10.3f %10.3f %9.3f %5s\n",
         "hvd's pack + unpack kernels alone", pu->ev.median, pu->ev.min,
         pu->ev.max, pu->host.median, "-");
  printf("hvd / cudaMemcpy: %.3f (target <= %.2f: %s); against the copy's "
         "host-clock time %.3f; hvd added %.1f MiB of device memory\n",
         ratio, LIST_TARGET, ratio <= LIST_TARGET ? "met" : "NOT met",
         h->median / mc->host.median, (double)l->hvd_added / 1048576.0);
  fflush(stdout);
}

int bench_list_gpu(const bench_opts_t *o) {
  lgpu_t l;
  int dev_id;
  memset(&l, 0, sizeof l);
  l.o = o;
  l.iters = iters_or(o, 20);
  l.warmup = warmup_or(o, 3);
  if (!bench_load_workload(o->tensors, &l.w, BENCH_DATA_NONE))
    return 2;
  use_device(l.dev, sizeof l.dev);
  BENCH_CUDA(cudaGetDevice(&dev_id));
  dwork_make(&l.x, &l.w);
  l.exec = "nccl";
  const char *v = getenv("HVD_GPU_OPERATIONS");
  if (!hvd_nccl_built() || (v != NULL && strcasecmp(v, "mpi") == 0))
    l.exec = "mpi-staged";

  BENCH_CUDA(cudaDeviceSynchronize());
  int64_t free0 = dev_free_bytes();
  l.h =
      time_hvd(&l.x, dev_id, l.iters, l.warmup, "list --device gpu", &l.ok_hvd);
  l.hvd_added = free0 - dev_free_bytes();
  list_gpu_baselines(&l);

  if (bench_rank == 0 && o->json)
    list_gpu_json(&l);
  else if (bench_rank == 0)
    list_gpu_text(&l);
  lctx_t c = l.c;
  free(l.sp);
  BENCH_CUDA(cudaFree(c.a));
  BENCH_CUDA(cudaFree(c.b));
  BENCH_CUDA(cudaFree(c.dsp));
  dwork_free(&l.x);
  bench_free_workload(&l.w);
  return l.ok_hvd ? 0 : 1;
}

/* ---- staged ------------------------------------------------------------- */

typedef struct sctx {
  dwork_t *x;
  char *pin; /* pinned, total floats */
} sctx_t;

/* What the host-staged executor copies: every tensor to the pinned buffer,
 * then every tensor back. */
static void staged_copies(void *p, cudaStream_t s) {
  sctx_t *c = p;
  size_t at = 0;
  for (int t = 0; t < c->x->n; t++) {
    size_t b = sizeof(float) * (size_t)c->x->count[t];
    BENCH_CUDA(
        cudaMemcpyAsync(c->pin + at, c->x->d[t], b, cudaMemcpyDeviceToHost, s));
    at += b;
  }
  at = 0;
  for (int t = 0; t < c->x->n; t++) {
    size_t b = sizeof(float) * (size_t)c->x->count[t];
    BENCH_CUDA(
        cudaMemcpyAsync(c->x->d[t], c->pin + at, b, cudaMemcpyHostToDevice, s));
    at += b;
  }
}

typedef struct sresult {
  char label[96];
  int64_t bytes;
  int tensors;
  bench_stats_t hvd;
  gtimes_t copy;
  int ok;
} sresult_t;

static sresult_t staged_case(dwork_t *x, int dev, int iters, int warmup,
                             gclock_t *g) {
  sresult_t r;
  memset(&r, 0, sizeof r);
  r.bytes = (int64_t)sizeof(float) * x->total;
  r.tensors = x->n;
  r.hvd = time_hvd(x, dev, iters, warmup, "staged", &r.ok);
  sctx_t c = {x, NULL};
  BENCH_CUDA(
      cudaHostAlloc((void **)&c.pin, (size_t)r.bytes, cudaHostAllocDefault));
  BENCH_CUDA(cudaDeviceSynchronize());
  r.copy = time_gpu(g, staged_copies, &c, iters, warmup);
  BENCH_CUDA(cudaFreeHost(c.pin));
  return r;
}

/* staged's state: the options, the device and the cases' results (the
 * sizes, then the workload). */
typedef struct sbench {
  const bench_opts_t *o;
  int iters, warmup;
  char dev[256];
  int n, ok, met;
  sresult_t res[64];
} sbench_t;

/* One tensor of each size. */
static void staged_sizes(sbench_t *sb, int dev_id, gclock_t *g) {
  const bench_opts_t *o = sb->o;
  sresult_t *res = sb->res;
  int n = sb->n;
  char sz[32];
  dwork_t x;
  for (int64_t b = o->min_bytes; b <= o->max_bytes && n < 63;
       b *= o->step_factor) {
    dwork_one(&x, b);
    res[n] = staged_case(&x, dev_id, sb->iters, sb->warmup, g);
    snprintf(res[n].label, sizeof res[n].label, "1 x %s",
             bench_bytes_str((double)res[n].bytes, sz, sizeof sz));
    n++;
    dwork_free(&x);
  }
  sb->n = n;
}

/* The --tensors workload, the last case. */
static void staged_workload(sbench_t *sb, const workload_t *w, int dev_id,
                            gclock_t *g) {
  const bench_opts_t *o = sb->o;
  sresult_t *res = sb->res;
  int n = sb->n;
  dwork_t x;
  const char *base = strrchr(o->tensors, '/');
  dwork_make(&x, w);
  res[n] = staged_case(&x, dev_id, sb->iters, sb->warmup, g);
  snprintf(res[n].label, sizeof res[n].label, "%s",
           base ? base + 1 : o->tensors);
  n++;
  dwork_free(&x);
  sb->n = n;
}

static void staged_json(const sbench_t *sb) {
  const sresult_t *res = sb->res;
  int n = sb->n;
  bench_json_header("staged");
  bench_json_str("device", sb->dev);
  bench_json_int("iters", sb->iters);
  bench_json_int("warmup", sb->warmup);
  bench_json_num("target_staged_over_copies", STAGED_TARGET);
  bench_json_open("rows", '[');
  for (int i = 0; i < n; i++) {
    double b = (double)res[i].bytes;
    bench_json_open(NULL, '{');
    bench_json_str("case", res[i].label);
    bench_json_bool("workload", sb->o->tensors != NULL && i == n - 1);
    bench_json_int("tensors", res[i].tensors);
    bench_json_int("bytes", res[i].bytes);
    bench_json_num("staged_median_ms", res[i].hvd.median);
    bench_json_num("staged_min_ms", res[i].hvd.min);
    bench_json_num("staged_max_ms", res[i].hvd.max);
    bench_json_num("copies_event_median_ms", res[i].copy.ev.median);
    bench_json_num("copies_host_median_ms", res[i].copy.host.median);
    bench_json_num("staged_gbps", b / (res[i].hvd.median * 1e-3) / 1e9);
    bench_json_num("copies_gbps", b / (res[i].copy.ev.median * 1e-3) / 1e9);
    bench_json_num("staged_over_copies",
                   res[i].copy.ev.median / res[i].hvd.median);
    bench_json_num("staged_over_copies_host",
                   res[i].copy.host.median / res[i].hvd.median);
    bench_json_bool("correct", res[i].ok);
    bench_json_close('}');
  }
  bench_json_close(']');
  bench_json_int("cases_meeting_target", sb->met);
  bench_json_bool("correct", sb->ok);
  bench_json_close('}');
}

static void staged_text(const sbench_t *sb) {
  const sresult_t *res = sb->res;
  int n = sb->n;
  char sz[32], env[512];
  printf("# hvd-bench staged: HVD_GPU_OPERATIONS=mpi; %s; %d rank%s; hvd "
         "%s\n",
         sb->dev, bench_size, bench_size == 1 ? "" : "s", hvd_version());
  printf("# median of %d after %d warmup, slowest rank's; staged: host "
         "clock, submit to last wait; copies: every tensor D2H to pinned "
         "then H2D back, CUDA events (host clock beside); GB/s: tensor "
         "bytes / time; env: %s\n",
         sb->iters, sb->warmup, bench_env_line(env, sizeof env));
  printf("%-26s %8s %12s %10s %10s %10s %10s %10s %8s %5s\n", "case", "tensors",
         "bytes", "staged_ms", "copies_ms", "copy_host", "stgd_GBps",
         "copy_GBps", "ratio", "check");
  for (int i = 0; i < n; i++) {
    double b = (double)res[i].bytes;
    printf("%-26s %8d %12s %10.3f %10.3f %10.3f %10.2f %10.2f %8.3f %5s\n",
           res[i].label, res[i].tensors, bench_bytes_str(b, sz, sizeof sz),
           res[i].hvd.median, res[i].copy.ev.median, res[i].copy.host.median,
           b / (res[i].hvd.median * 1e-3) / 1e9,
           b / (res[i].copy.ev.median * 1e-3) / 1e9,
           res[i].copy.ev.median / res[i].hvd.median,
           res[i].ok ? "ok" : "WRONG");
  }
  printf("staged: %d of %d cases at staged/copies >= %.2f\n", sb->met, n,
         STAGED_TARGET);
  fflush(stdout);
}

int bench_staged(const bench_opts_t *o) {
  sbench_t sb;
  int dev_id;
  workload_t w;
  gclock_t g;

  memset(&sb, 0, sizeof sb);
  sb.o = o;
  sb.iters = iters_or(o, 20);
  sb.warmup = warmup_or(o, 3);
  sb.ok = 1;
  if (o->tensors != NULL &&
      !bench_load_workload(o->tensors, &w, BENCH_DATA_NONE))
    return 2;
  use_device(sb.dev, sizeof sb.dev);
  BENCH_CUDA(cudaGetDevice(&dev_id));
  gclock_init(&g, 0);
  staged_sizes(&sb, dev_id, &g);
  if (o->tensors != NULL) {
    staged_workload(&sb, &w, dev_id, &g);
    bench_free_workload(&w);
  }
  gclock_free(&g);
  for (int i = 0; i < sb.n; i++) {
    sb.ok &= sb.res[i].ok;
    sb.met += sb.res[i].copy.ev.median / sb.res[i].hvd.median >= STAGED_TARGET;
  }

  if (bench_rank == 0 && o->json)
    staged_json(&sb);
  else if (bench_rank == 0)
    staged_text(&sb);
  return sb.ok ? 0 : 1;
}

#endif /* HVD_HAVE_CUDA */
