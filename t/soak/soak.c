/*
 * soak.c - a bounded soak (make check-soak; t/soak/soak.sh runs it at np 4).
 *
 *   soak [--ops N] [--seed S] [--checkpoint-every K] [--alloc A]
 *        [--device none|all|mixed] [--sets K]
 *
 * N collectives (default 20000) in windows of 1..40: allreduces (every
 * dtype and op, 0 to 262144 elements), broadcasts (every root),
 * allgathers and alltoalls (rows per rank from 0 to 3), reducescatters
 * (fewer rows than ranks too) and barriers. Every rank draws the same
 * windows from the seed; each submits its window in its own shuffled
 * order, now and then sleeping between submissions, waits in another
 * order, and checks every element of every result exactly. Names are
 * reused window after window with other shapes and dtypes, and every
 * 16th window takes new ones (the response cache evicts). --alloc says
 * where the inputs and outputs of allreduces, broadcasts, allgathers,
 * alltoalls and reducescatters live: malloc (the default), hvd
 * (hvd_alloc_host, the node's shared arena, for the zero-copy paths) or
 * mixed (each rank draws its own per buffer, so that an allreduce's
 * tensors are in the arena on some ranks only).
 *
 * --sets K: two process sets, the ranks of one parity
 * (hvd_process_set_split) and every rank but the last, each run K
 * collectives of their own (windows drawn as the world's, no barriers) on
 * a thread of their own while the main thread runs the world's; a check
 * per set, then both destroyed before the tail.
 *
 * --device (t/standin/soak on the stand-in GPUs, t/gpu/soak on a GPU:
 * this source built with SOAK_CUDA; it skips without a GPU): the collectives' tensors on the
 * rank's GPU, all of them or about half (mixed: drawn per collective, the
 * same on every rank), so the device executor's groups (NCCL) meet the
 * host executor's in one window. Inputs are copied to the device before
 * the submission, results back after the wait, and checked there.
 *
 * Each window also trains: a distributed SGD step with momentum on three
 * parameters. Every K collectives (default 500) the model is saved, spoilt
 * and loaded back: bytes and step exact, the ranks identical.
 *
 * At the end the ranks run out of data in turn (rank r after 3 (P - r)
 * more allreduces, each summed over the ranks still in) and hvd_join;
 * rank 0 joins last. Resident memory is sampled once a tenth of the work
 * is done and at the end: the growth is printed and must stay within
 * HVD_SOAK_RSS_SLACK_KIB (default 8192; "off": printed only). Open file
 * descriptors and threads are counted before hvd_init, after the warm-up, at
 * the end, after hvd_shutdown and after a second init and shutdown: none may be
 * left. Checks are per kind (counts in their names), so the plan does not
 * depend on N.
 */
#ifdef SOAK_CUDA
#include <config.h>
#ifndef HVD_HAVE_CUDA /* t/gpu/soak in a build without CUDA: --device skips */
#undef SOAK_CUDA
#define SOAK_NO_CUDA 1
#endif
#endif

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#if defined(SOAK_CUDA) || defined(SOAK_NO_CUDA)
#include "gputest.h"
#endif

#include <dirent.h>
#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WINDOW_MAX 40

enum kind { AR, BC, AG, A2A, RS, BAR, NKINDS };
static const char *const kind_name[NKINDS] = {"allreduce",     "broadcast",
                                              "allgather",     "alltoall",
                                              "reducescatter", "barrier"};

static int P, R;
static uint64_t seed = 1;
enum alloc { ALLOC_MALLOC, ALLOC_HVD, ALLOC_MIXED };
static enum alloc alloc_mode = ALLOC_MALLOC;
static const char *const alloc_names[] = {"malloc", "hvd", "mixed", NULL};
enum devmode { DEV_NONE, DEV_ALL, DEV_MIXED };
static enum devmode dev_mode = DEV_NONE;
static const char *const dev_names[] = {"none", "all", "mixed", NULL};

/* ---- Draws (the same on every rank) ---- */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* A draw in [0, n) for (a, b, c) under the seed. */
static int64_t draw(uint64_t a, uint64_t b, uint64_t c, int64_t n) {
  return (int64_t)(mix(seed ^ mix(a ^ mix(b ^ mix(c)))) % (uint64_t)n);
}

static const hvd_dtype_t dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_INT32,
                                     HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                     HVD_FLOAT32, HVD_FLOAT64};
static const hvd_op_t rops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX,
                                HVD_PRODUCT};

/* Where collectives run: the world, or a process set (its handle, size,
 * this rank's place in it, and a key that gives its windows draws of
 * their own, the same on its members). */
struct group {
  const hvd_process_set_t *ps; /* NULL: the world */
  int p, r;
  uint64_t key;
};

struct op {
  enum kind kind;
  const struct group *g;
  char name[48];
  hvd_dtype_t dt;
  hvd_op_t rop;
  int64_t n, w; /* elements (allreduce, broadcast) or rows of w */
  int root, inplace;
  uint64_t salt;
  int arena; /* bit 0: send, bit 1: recv are hvd_alloc_host blocks */
  int on_dev; /* tensors on the GPU: dsend, drecv mirror send, recv */
  void *dsend, *drecv, *rt_dev;

  void *send, *recv;
  hvd_tensor_t st, rt;
  int64_t splits[64], rsplits[64];
  hvd_request_t *req;
  hvd_result_t rc;
};

/* Rank q's element i of a reduction's input: small integers, exact in
 * every dtype over 4 ranks; a product's factors in {-2, -1, 1, 2} ({1, 2,
 * 3} for uint8); a float average's inputs sum to a multiple of P. */
static double red_value(const struct op *o, int q, int64_t i) {
  int64_t h = i + (int64_t)(o->salt % 1000);
  int s = o->dt != HVD_UINT8;
  if (o->rop == HVD_PRODUCT)
    return s ? (double)((h + q) % 5 - 2 ? (h + q) % 5 - 2 : 1)
             : (double)((h + 2 * q) % 3 + 1);
  if (o->rop == HVD_AVERAGE && hvdt_is_float(o->dt))
    return (double)(h % 9 - 4 +
                    (q < o->g->p - 1 ? q : -(o->g->p - 1) * (o->g->p - 2) / 2));
  return (double)((h * 7 + q * 3) % 11 - (s ? 5 : 0));
}

static double red_want(const struct op *o, int64_t i) {
  double acc = red_value(o, 0, i);
  for (int q = 1; q < o->g->p; q++)
    acc = hvdt_fold(o->rop, acc, red_value(o, q, i));
  return hvdt_finish(o->rop, o->dt, acc, o->g->p, 1.0);
}

/* Element i of rank q's data for the other collectives (row-major; for an
 * alltoall, j is the destination). */
static double data_value(const struct op *o, int q, int j, int64_t i) {
  int64_t v = (q * 13 + j * 5 + i + (int64_t)(o->salt % 97)) % 11;
  return (double)(o->dt == HVD_UINT8 ? v : v - 5);
}

/* Rows rank q gives in an allgather, or sends to rank j in an alltoall. */
static int64_t rows_of(const struct op *o, int q, int j) {
  return (int64_t)((o->salt + (uint64_t)q + 2u * (uint64_t)j) % 4);
}

/* Op k of window win (run_window's, keyed by the group): its kind, name
 * and shape. At most one barrier per window (no_barrier set: an allreduce
 * instead): barriers share one name, and a second one submitted after the
 * first completed would be accepted on some ranks only. */
static void draw_op(struct op *o, const struct group *g, int64_t win, int k,
                    int no_barrier) {
  memset(o, 0, sizeof *o);
  o->g = g;
  int64_t c = draw(win, k, 1, 100);
  o->kind = c < 60   ? AR
            : c < 70 ? BC
            : c < 80 ? AG
            : c < 88 ? A2A
            : c < 96 ? RS
                     : BAR;
  if (o->kind == BAR && (no_barrier || g->ps != NULL))
    o->kind = AR; /* (a set's barrier has no _async form) */
  o->salt = (uint64_t)draw(win, k, 2, 1 << 30);
  o->dt = dtypes[draw(win, k, 3, 8)];
  o->rop = rops[draw(win, k, 4, 5)];
  int64_t sz = draw(win, k, 5, 100);
  o->n = sz < 70   ? draw(win, k, 6, 257)
         : sz < 95 ? 257 + draw(win, k, 6, 16128)
                   : 16385 + draw(win, k, 6, 245760);
  o->w = 1 + draw(win, k, 7, 64);
  o->root = (int)draw(win, k, 8, g->p);
  o->inplace = draw(win, k, 9, 2) != 0;
  if (o->kind == RS) {                 /* rows 0 .. 3P, fewer than P included */
    o->rop = rops[draw(win, k, 4, 4)]; /* no product: kept small */
    o->n = draw(win, k, 6, 3 * g->p + 1);
  }
  o->arena = alloc_mode == ALLOC_HVD     ? 3
             : alloc_mode == ALLOC_MIXED ? (int)draw(win, k, 100 + (uint64_t)R, 4)
                                         : 0;
  o->on_dev = o->kind != BAR && (dev_mode == DEV_ALL ||
                                 (dev_mode == DEV_MIXED && draw(win, k, 10, 2)));
  if (win % 16 == 15)
    snprintf(o->name, sizeof o->name, "soak.w%lld.%d",
             (long long)(win & 0xffffffffff), k);
  else
    snprintf(o->name, sizeof o->name, "soak.%s.%d", kind_name[o->kind], k);
}

/* ---- Submission and checks ---- */

/* n zeroed elements of es bytes: from hvd_alloc_host where o->arena has
 * bit (1 send, 2 recv), else from calloc. */
static void *buf_alloc(const struct op *o, int bit, int64_t n, size_t es) {
  if (!(o->arena & bit))
    return hvdt_calloc((size_t)n, es);
  size_t bytes = (size_t)n * es;
  void *p = hvd_alloc_host(bytes ? bytes : 1);
  if (p == NULL)
    bail("hvd_alloc_host(%zu): %s", bytes, hvd_last_error());
  memset(p, 0, bytes);
  return p;
}

static void buf_free(const struct op *o, int bit, void *p) {
  if (o->arena & bit)
    hvd_free_host(p);
  else
    free(p);
}

#ifdef SOAK_CUDA
static int dev = HVD_CPU; /* the rank's GPU, with --device */

/* The bytes of t's elements. */
static size_t tensor_bytes(const hvd_tensor_t *t) {
  return (size_t)hvd_tensor_numel(t) * hvdt_size(t->dtype);
}

/* A device copy of host[0..bytes) (bytes may be 0). */
static void *to_dev(const void *host, size_t bytes) {
  void *d = NULL;
  cuda_ok(cudaMalloc(&d, bytes ? bytes : 1), "cudaMalloc");
  if (bytes)
    cuda_ok(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice),
            "cudaMemcpy to the device");
  return d;
}

static void from_dev(void *host, const void *d, size_t bytes) {
  if (bytes)
    cuda_ok(cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost),
            "cudaMemcpy to the host");
}

/* o's host buffers (filled) mirrored on the device, its tensors moved
 * there: send (and an out-of-place allreduce's recv, left as cudaMalloc
 * gives it). */
static void move_to_dev(struct op *o) {
  size_t bytes = tensor_bytes(&o->st);
  o->dsend = to_dev(o->send, bytes);
  o->st.data = o->dsend;
  o->st.device = dev;
  if (o->kind == AR && !o->inplace) {
    cuda_ok(cudaMalloc(&o->drecv, bytes ? bytes : 1), "cudaMalloc");
    o->rt.data = o->drecv;
    o->rt.device = dev;
  }
}

/* After the wait: the device results into the host buffers (an output
 * hvd allocated, into a host copy that o->rt points to until free_dev). */
static void fetch_dev(struct op *o) {
  size_t bytes = tensor_bytes(&o->st);
  from_dev(o->send, o->dsend, bytes);
  if (o->kind == AR && !o->inplace)
    from_dev(o->recv, o->drecv, bytes);
  if ((o->kind == AG || o->kind == A2A || o->kind == RS) &&
      o->rc == HVD_SUCCESS) {
    size_t rb = tensor_bytes(&o->rt);
    void *h = hvdt_calloc(rb ? rb : 1, 1);
    from_dev(h, o->rt.data, rb);
    o->rt_dev = o->rt.data;
    o->rt.data = h;
  }
}

static void free_dev(struct op *o) {
  if (o->rt_dev != NULL) {
    free(o->rt.data);
    o->rt.data = o->rt_dev;
  }
  cuda_ok(cudaFree(o->dsend), "cudaFree");
  if (o->drecv != NULL)
    cuda_ok(cudaFree(o->drecv), "cudaFree");
}

/* Moves o's tensors to the GPU when o->on_dev (after they were filled). */
static void place(struct op *o) {
  if (o->on_dev)
    move_to_dev(o);
}
#else
static void place(struct op *o) { (void)o; }
#endif

static void fill(const struct op *o, void *buf, int64_t n, int q, int j) {
  for (int64_t i = 0; i < n; i++)
    hvdt_put(o->dt, buf, i, data_value(o, q, j, i));
}

static hvd_result_t submit(struct op *o) {
  size_t es = hvdt_size(o->dt);
  const hvd_process_set_t *ps = o->g->ps;
  const int gr = o->g->r, gp = o->g->p; /* in the op's group */
  int64_t shape[2];
  switch (o->kind) {
  case AR:
    o->send = buf_alloc(o, 1, o->n, es);
    for (int64_t i = 0; i < o->n; i++)
      hvdt_put(o->dt, o->send, i, red_value(o, gr, i));
    o->recv = o->inplace ? o->send : buf_alloc(o, 2, o->n, es);
    shape[0] = o->n;
    o->st = hvd_tensor_make(o->send, o->dt, 1, shape);
    o->rt = hvd_tensor_make(o->recv, o->dt, 1, shape);
    place(o);
    hvd_tensor_t *out = o->inplace ? &o->st : &o->rt;
    return ps != NULL ? hvd_ps_allreduce_async(ps, o->name, &o->st, out,
                                               o->rop, 1.0, 1.0, &o->req)
                      : hvd_allreduce_async(o->name, &o->st, out, o->rop, 1.0,
                                            1.0, &o->req);
  case BC:
    o->send = buf_alloc(o, 1, o->n, es);
    if (gr == o->root)
      fill(o, o->send, o->n, o->root, 0);
    else
      for (int64_t i = 0; i < o->n; i++)
        hvdt_put(o->dt, o->send, i, 3);
    shape[0] = o->n;
    o->st = hvd_tensor_make(o->send, o->dt, 1, shape);
    place(o);
    return ps != NULL
               ? hvd_ps_broadcast_async(ps, o->name, &o->st, o->root, &o->req)
               : hvd_broadcast_async(o->name, &o->st, o->root, &o->req);
  case AG:
    shape[0] = rows_of(o, gr, 0);
    shape[1] = o->w;
    o->send = buf_alloc(o, 1, shape[0] * o->w, es);
    fill(o, o->send, shape[0] * o->w, gr, 0);
    o->st = hvd_tensor_make(o->send, o->dt, 2, shape);
    place(o);
    return ps != NULL
               ? hvd_ps_allgather_async(ps, o->name, &o->st, &o->rt, &o->req)
               : hvd_allgather_async(o->name, &o->st, &o->rt, &o->req);
  case A2A: {
    int64_t rows = 0;
    for (int j = 0; j < gp; j++)
      rows += o->splits[j] = rows_of(o, gr, j);
    shape[0] = rows;
    shape[1] = o->w;
    o->send = buf_alloc(o, 1, rows * o->w, es);
    int64_t at = 0;
    for (int j = 0; j < gp; j++) {
      fill(o, (char *)o->send + (size_t)(at * o->w) * es, o->splits[j] * o->w,
           gr, j);
      at += o->splits[j];
    }
    o->st = hvd_tensor_make(o->send, o->dt, 2, shape);
    place(o);
    return ps != NULL ? hvd_ps_alltoall_async(ps, o->name, &o->st, o->splits,
                                              &o->rt, o->rsplits, &o->req)
                      : hvd_alltoall_async(o->name, &o->st, o->splits, &o->rt,
                                           o->rsplits, &o->req);
  }
  case RS:
    shape[0] = o->n;
    shape[1] = o->w;
    o->send = buf_alloc(o, 1, o->n * o->w, es);
    for (int64_t i = 0; i < o->n * o->w; i++)
      hvdt_put(o->dt, o->send, i, red_value(o, gr, i));
    o->st = hvd_tensor_make(o->send, o->dt, 2, shape);
    place(o);
    return ps != NULL
               ? hvd_ps_reducescatter_async(ps, o->name, &o->st, &o->rt, o->rop,
                                            1.0, 1.0, &o->req)
               : hvd_reducescatter_async(o->name, &o->st, &o->rt, o->rop, 1.0,
                                         1.0, &o->req);
  case BAR:
  default:
    return hvd_barrier_async(&o->req);
  }
}

/* The first element of buf[0..n) that is not want(i), or -1. */
static int64_t first_wrong(const struct op *o, const void *buf, int64_t n,
                           double (*want)(const struct op *, int64_t, void *),
                           void *ctx, double *got, double *w) {
  for (int64_t i = 0; i < n; i++) {
    *got = hvdt_get(o->dt, buf, i);
    *w = hvdt_as_dtype(o->dt, want(o, i, ctx));
    if (*got != *w)
      return i;
  }
  return -1;
}

static double want_red(const struct op *o, int64_t i, void *ctx) {
  int64_t off = *(const int64_t *)ctx;
  return red_want(o, off + i);
}
static double want_bc(const struct op *o, int64_t i, void *ctx) {
  (void)ctx;
  return data_value(o, o->root, 0, i);
}
/* ctx: the row each element's rank starts at, per rank, then the rank
 * whose rows are at element i is found by walking them. */
struct rows_ctx {
  int64_t start[65]; /* rows: rank q's are [start[q], start[q + 1]) */
  int a2a;
};
static double want_rows(const struct op *o, int64_t i, void *ctx) {
  const struct rows_ctx *c = ctx;
  int64_t row = i / o->w;
  int q = 0;
  while (row >= c->start[q + 1])
    q++;
  return data_value(o, q, c->a2a ? o->g->r : 0,
                    (row - c->start[q]) * o->w + i % o->w);
}

/* Checks o's result; returns 1 if right, else 0 with why. Frees o. */
static int finish(struct op *o, char *why, size_t len) {
  const int gr = o->g->r, gp = o->g->p; /* in the op's group */
  int right = 1;
  double got = 0, w = 0;
  int64_t at = -1;
#ifdef SOAK_CUDA
  if (o->on_dev)
    fetch_dev(o);
#endif
  if (o->rc != HVD_SUCCESS) {
    snprintf(why, len, "%s %s: result %d: %s", kind_name[o->kind], o->name,
             o->rc, hvd_last_error());
    right = 0;
  } else if (o->kind == AR) {
    int64_t off = 0;
    at = first_wrong(o, o->recv, o->n, want_red, &off, &got, &w);
    if (at < 0 && !o->inplace)
      for (int64_t i = 0; i < o->n && at < 0; i++)
        if (hvdt_get(o->dt, o->send, i) != red_value(o, gr, i))
          at = i, got = hvdt_get(o->dt, o->send, i), w = red_value(o, gr, i);
  } else if (o->kind == BC) {
    at = first_wrong(o, o->send, o->n, want_bc, NULL, &got, &w);
  } else if (o->kind == AG || o->kind == A2A) {
    struct rows_ctx c = {.a2a = o->kind == A2A};
    c.start[0] = 0;
    for (int q = 0; q < gp; q++) {
      int64_t rq = o->kind == A2A ? rows_of(o, q, gr) : rows_of(o, q, 0);
      c.start[q + 1] = c.start[q] + rq;
      if (o->kind == A2A && o->rsplits[q] != rq) {
        snprintf(why, len, "alltoall %s: recv_splits[%d] %lld, want %lld",
                 o->name, q, (long long)o->rsplits[q], (long long)rq);
        right = 0;
      }
    }
    if (right && (o->rt.dtype != o->dt || o->rt.ndim != 2 ||
                  o->rt.shape[0] != c.start[gp] || o->rt.shape[1] != o->w)) {
      snprintf(why, len, "%s %s: shape [%lld, %lld], want [%lld, %lld]",
               kind_name[o->kind], o->name, (long long)o->rt.shape[0],
               (long long)(o->rt.ndim > 1 ? o->rt.shape[1] : -1),
               (long long)c.start[gp], (long long)o->w);
      right = 0;
    }
    if (right)
      at = first_wrong(o, o->rt.data, c.start[gp] * o->w, want_rows, &c, &got,
                       &w);
  } else if (o->kind == RS) {
    int64_t rows = o->n / gp + (gr < o->n % gp), off = 0;
    for (int q = 0; q < gr; q++)
      off += o->n / gp + (q < o->n % gp);
    off *= o->w;
    if (o->rt.ndim != 2 || o->rt.shape[0] != rows || o->rt.shape[1] != o->w) {
      snprintf(
          why, len, "reducescatter %s: shape [%lld, ...], want [%lld, %lld]",
          o->name, (long long)o->rt.shape[0], (long long)rows, (long long)o->w);
      right = 0;
    } else {
      at = first_wrong(o, o->rt.data, rows * o->w, want_red, &off, &got, &w);
    }
  }
  if (right && at >= 0) {
    snprintf(why, len, "%s %s %s %s: element %lld is %g, want %g",
             kind_name[o->kind], o->name, hvd_dtype_name(o->dt),
             hvd_op_name(o->rop), (long long)at, got, w);
    right = 0;
  }
#ifdef SOAK_CUDA
  if (o->on_dev)
    free_dev(o);
#endif
  buf_free(o, 1, o->send); /* NULL for a barrier */
  if (o->kind == AR && !o->inplace)
    buf_free(o, 2, o->recv);
  if (o->kind == AG || o->kind == A2A || o->kind == RS)
    if (o->rc == HVD_SUCCESS)
      hvd_tensor_free(&o->rt);
  return right;
}

/* ---- The model ---- */

#define NPARAM 3
static const int64_t psize[NPARAM] = {1000, 37, 512};
static float pv[NPARAM][1000], pg[NPARAM][1000], saved[NPARAM][1000];
static hvd_param_t params[NPARAM];
static hvd_optimizer_t *opt;

static void model_create(void) {
  static const char *const names[NPARAM] = {"soak.w", "soak.b", "soak.e"};
  for (int i = 0; i < NPARAM; i++) {
    for (int64_t j = 0; j < psize[i]; j++)
      pv[i][j] = (float)((i * 31 + j) % 17 - 8) * 0.25f;
    params[i].name = names[i];
    params[i].value = hvd_tensor_make(pv[i], HVD_FLOAT32, 1, &psize[i]);
    params[i].grad = hvd_tensor_make(pg[i], HVD_FLOAT32, 1, &psize[i]);
  }
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  so.lr = 0.01;
  so.momentum = 0.9;
  hvd_optimizer_t *base = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  if (hvd_sgd_create(params, NPARAM, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    bail("the model: %s", hvd_last_error());
}

/* One step: this rank's gradients, ready last parameter first. */
static int train_step(int64_t step) {
  for (int i = NPARAM - 1; i >= 0; i--) {
    for (int64_t j = 0; j < psize[i]; j++)
      pg[i][j] = (float)((R * 5 + j + step) % 7 - 3) * 0.125f;
    if (hvd_optimizer_grad_ready(opt, i) != HVD_SUCCESS)
      return 0;
  }
  return hvd_optimizer_step(opt) == HVD_SUCCESS;
}

/* Save, spoil, load back: 1 if bytes and step came back and the ranks
 * agree, else 0 with why. */
static int checkpoint_round(const char *path, int64_t step, char *why,
                            size_t len) {
  int64_t got = -1;
  if (hvd_checkpoint_save(path, params, NPARAM, opt, step) != HVD_SUCCESS) {
    snprintf(why, len, "save at step %lld: %s", (long long)step,
             hvd_last_error());
    return 0;
  }
  memcpy(saved, pv, sizeof pv);
  for (int i = 0; i < NPARAM; i++)
    for (int64_t j = 0; j < psize[i]; j++)
      pv[i][j] += 1.0f;
  if (hvd_checkpoint_load(path, params, NPARAM, opt, &got) != HVD_SUCCESS) {
    snprintf(why, len, "load at step %lld: %s", (long long)step,
             hvd_last_error());
    return 0;
  }
  if (got != step || memcmp(saved, pv, sizeof pv) != 0) {
    snprintf(why, len, "load at step %lld: step %lld, bytes %s",
             (long long)step, (long long)got,
             memcmp(saved, pv, sizeof pv) ? "differ" : "equal");
    return 0;
  }
  if (hvd_verify_parameters(params, NPARAM) != HVD_SUCCESS) {
    snprintf(why, len, "verify at step %lld: %s", (long long)step,
             hvd_last_error());
    return 0;
  }
  return 1;
}

/* ---- The process's resources ---- */

/* Entries of a /proc directory; with skip, not those that are links to a
 * target starting with skip. */
static long count_dir(const char *path, const char *skip) {
  DIR *d = opendir(path);
  long n = 0;
  if (d == NULL)
    return -1;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char link[600], to[256];
    ssize_t len;
    if (e->d_name[0] == '.')
      continue;
    snprintf(link, sizeof link, "%s/%s", path, e->d_name);
    if (skip != NULL && (len = readlink(link, to, sizeof to - 1)) > 0) {
      to[len] = '\0';
      if (strncmp(to, skip, strlen(skip)) == 0)
        continue;
    }
    n++;
  }
  closedir(d);
  return n;
}
/* Open descriptors, less the one reading the directory and hvd's host
 * arena (lib/base/host_mem.c: one memfd made on first use, kept as long
 * as the process, since blocks from hvd_alloc_host may outlive
 * hvd_shutdown); arenas() counts those. */
static long fds(void) {
  return count_dir("/proc/self/fd", "/memfd:hvd-host-arena") - 1;
}
static long arenas(void) {
  return count_dir("/proc/self/fd", NULL) - 1 - fds();
}
static long threads(void) { return count_dir("/proc/self/task", NULL); }
static long rss_kib(void) {
  long pages = 0, res = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL)
    return -1;
  if (fscanf(f, "%ld %ld", &pages, &res) != 2)
    res = -1;
  fclose(f);
  return res < 0 ? -1 : res * (sysconf(_SC_PAGESIZE) / 1024);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The tail: rank q stays in for 3 (P - q) allreduces. */
static double tail_value(const struct hvdt_ar *a, int q, int64_t i) {
  return (double)(q + 1) * 10 + (double)i + a->salt;
}

/* What a run of windows saw, per kind. */
struct tally {
  long count[NKINDS], wrong[NKINDS], rejected;
};

/* Window win of group g: its collectives drawn, submitted in this rank's
 * own shuffled order (now and then a sleep between two), between(win)
 * called (the world's training step), waited for in another order,
 * checked and counted; the first refusal and wrong result said on
 * stderr. Returns how many collectives it had (at most left). */
static int run_window(const struct group *g, int64_t win, int64_t left,
                      struct op *ops, unsigned *sh, struct tally *t,
                      void (*between)(int64_t)) {
  int order[WINDOW_MAX], worder[WINDOW_MAX];
  char why[1024];
  win += (int64_t)(g->key << 40); /* a set's windows are its own */
  int n = 1 + (int)draw(win, 0, 0, WINDOW_MAX);
  if (n > left)
    n = (int)left;
  for (int k = 0, bar = 0; k < n; k++) {
    draw_op(&ops[k], g, win, k, bar);
    bar |= ops[k].kind == BAR;
  }
  *sh = hvdt_shuffle(order, n, *sh);
  *sh = hvdt_shuffle(worder, n, *sh);
  for (int s = 0; s < n; s++) {
    struct op *o = &ops[order[s]];
    if ((*sh = *sh * 1103515245u + 12345u) >> 28 == 0) /* 1 in 16 */
      usleep((*sh >> 8) % 500);
    o->rc = submit(o);
    if (o->rc != HVD_SUCCESS) {
      if (t->rejected++ == 0)
        diag_all("%s %s refused: %s", kind_name[o->kind], o->name,
                 hvd_last_error());
      o->req = NULL;
    }
  }
  if (between != NULL)
    between(win);
  for (int s = 0; s < n; s++) {
    struct op *o = &ops[worder[s]];
    if (o->req != NULL)
      o->rc = hvd_wait(o->req);
  }
  for (int k = 0; k < n; k++) {
    t->count[ops[k].kind]++;
    if (!finish(&ops[k], why, sizeof why) && t->wrong[ops[k].kind]++ == 0)
      diag_all("%s", why);
  }
  return n;
}

static struct group world;
static long steps, bad_steps;

/* Between a world window's submissions and its waits: a training step. */
static void train_between(int64_t win) {
  if (!train_step(win) && bad_steps++ == 0)
    diag_all("training step %lld: %s", (long long)win, hvd_last_error());
  steps++;
}

/* ---- Process sets on threads of their own (--sets) ---- */

/* A thread that runs windows on a process set beside the world's, then
 * waits to be released (so that the threads counted at the warm-up are
 * still there at the end). */
struct worker {
  struct group g;
  int member; /* this rank is in the set: the thread runs */
  int64_t nops;
  struct tally t;
  pthread_t th;
};
static pthread_mutex_t release_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t release_cv = PTHREAD_COND_INITIALIZER;
static int released;

static void *worker_main(void *arg) {
  struct worker *wk = arg;
  static _Thread_local struct op ops[WINDOW_MAX];
  unsigned sh = (unsigned)R * 7919u + (unsigned)seed + (unsigned)wk->g.key;
#ifdef SOAK_CUDA
  if (dev_mode != DEV_NONE) /* the current device is per thread */
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
#endif
  for (int64_t win = 0, done = 0; done < wk->nops; win++)
    done += run_window(&wk->g, win, wk->nops - done, ops, &sh, &wk->t, NULL);
  pthread_mutex_lock(&release_mu);
  while (!released)
    pthread_cond_wait(&release_cv, &release_mu);
  pthread_mutex_unlock(&release_mu);
  return NULL;
}

/* The sets (collective): the ranks of this one's parity
 * (hvd_process_set_split) and every rank but the last (all of a lone
 * rank); both destroyed at the end by every rank. */
static hvd_process_set_t *sets[2];

/* wk[k] for sets[k]: a thread for each set this rank is in, running
 * nops collectives on it. */
static void start_workers(struct worker *wk, int64_t nops) {
  int ranks[64], m = P > 1 ? P - 1 : 1;
  for (int i = 0; i < m; i++)
    ranks[i] = i;
  if (hvd_process_set_split(R % 2, &sets[0]) != HVD_SUCCESS ||
      hvd_process_set_create(ranks, m, &sets[1]) != HVD_SUCCESS)
    bail("process sets: %s", hvd_last_error());
  for (int k = 0; k < 2; k++) {
    int r = hvd_process_set_rank(sets[k]);
    uint64_t key = k == 0 ? 1 + (uint64_t)(R % 2) : 3;
    wk[k] = (struct worker){
        .g = {sets[k], hvd_process_set_size(sets[k]), r, key},
        .member = r >= 0,
        .nops = nops};
    if (wk[k].member && pthread_create(&wk[k].th, NULL, worker_main, &wk[k]))
      bail("pthread_create failed");
  }
}

/* Releases and joins the threads; a check per set (every rank), and the
 * sets destroyed. */
static void stop_workers(struct worker *wk) {
  static const char *const what[2] = {"the ranks of one parity",
                                      "every rank but the last"};
  pthread_mutex_lock(&release_mu);
  released = 1;
  pthread_cond_broadcast(&release_cv);
  pthread_mutex_unlock(&release_mu);
  for (int k = 0; k < 2; k++) {
    long n = 0, bad = wk[k].t.rejected;
    if (wk[k].member)
      pthread_join(wk[k].th, NULL);
    for (int j = 0; j < NKINDS; j++)
      n += wk[k].t.count[j], bad += wk[k].t.wrong[j];
    ok(bad == 0 && n == (wk[k].member ? wk[k].nops : 0),
       "process set %d (%s): %lld collectives on a thread of their own, "
       "beside the world's, every one exact",
       k + 1, what[k], (long long)wk[k].nops);
    if (bad != 0)
      diag_all("set %d: %ld of %ld wrong or refused", k + 1, bad, n);
    if (hvd_process_set_destroy(sets[k]) != HVD_SUCCESS)
      diag_all("hvd_process_set_destroy: %s", hvd_last_error());
  }
}

static void usage(void) {
  fprintf(stderr, "usage: soak [--ops N] [--seed S] [--checkpoint-every K] "
                  "[--alloc malloc|hvd|mixed] [--device none|all|mixed] "
                  "[--sets K]\n");
  exit(2);
}

/* The index of a in names (NULL-terminated), else the usage. */
static int choice(const char *a, const char *const *names) {
  for (int i = 0; names[i] != NULL; i++)
    if (strcmp(a, names[i]) == 0)
      return i;
  usage();
  return 0;
}

int main(int argc, char **argv) {
  int64_t nops = 20000, every = 500, set_ops = 0;
#ifdef SOAK_CUDA
  int ndev = 0;
  cudaError_t dev_err = cudaGetDeviceCount(&ndev); /* before MPI starts */
#endif
  tap_mpi_init(&argc, &argv);
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc)
      usage();
    if (strcmp(argv[i], "--alloc") == 0) {
      alloc_mode = (enum alloc)choice(argv[i + 1], alloc_names);
      continue;
    }
    if (strcmp(argv[i], "--device") == 0) {
      dev_mode = (enum devmode)choice(argv[i + 1], dev_names);
      continue;
    }
    char *end;
    long long v = strtoll(argv[i + 1], &end, 10);
    if (*end != '\0' || v < 1)
      usage();
    if (strcmp(argv[i], "--ops") == 0)
      nops = v;
    else if (strcmp(argv[i], "--seed") == 0)
      seed = (uint64_t)v;
    else if (strcmp(argv[i], "--checkpoint-every") == 0)
      every = v;
    else if (strcmp(argv[i], "--sets") == 0)
      set_ops = v;
    else
      usage();
  }
  P = tap_size();
  R = tap_rank();
  if (P > 64)
    skip_all("at most 64 ranks");
#ifdef SOAK_CUDA
  if (dev_mode != DEV_NONE) { /* a GPU each, else all on the first */
    gpu_devices_or_skip(dev_err, ndev);
    dev = ndev >= P ? R % ndev : 0;
    cuda_ok(cudaSetDevice(dev), "cudaSetDevice");
  }
#elif defined(SOAK_NO_CUDA)
  if (dev_mode != DEV_NONE)
    skip_all("%s", GPU_TEST_NO_CUDA);
#else
  if (dev_mode != DEV_NONE)
    bail("--device: this soak was built without CUDA (t/standin/soak and "
         "t/gpu/soak have it)");
#endif
  /* "off": reported, not checked (AddressSanitizer's quarantine keeps
   * freed memory resident: t/soak/leaks.sh) */
  const char *slack_s = getenv("HVD_SOAK_RSS_SLACK_KIB");
  long slack = slack_s && *slack_s ? atol(slack_s) : 8192;
  int rss_checked = !(slack_s && strcmp(slack_s, "off") == 0);

  char dir[512], path[600];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-soak");
  snprintf(path, sizeof path, "%s/soak.ckpt", dir);

  long fd0 = fds(), th0 = threads();
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init failed: %s", hvd_last_error());
  model_create();

  static struct op ops[WINDOW_MAX];
  static struct worker wk[2];
  struct tally t = {{0}, {0}, 0};
  const long *count = t.count, *wrong = t.wrong;
  long ckpts = 0, bad_ckpts = 0;
  long rss_warm = -1, fd_warm = -1, th_warm = -1;
  char why[1024];
  int64_t done = 0, next_ckpt = every;
  double t0 = now(), last_report = t0;
  unsigned sh = (unsigned)R * 7919u + (unsigned)seed;
  world = (struct group){NULL, P, R, 0};
  if (set_ops > 0)
    start_workers(wk, set_ops);

  for (int64_t win = 0; done < nops; win++) {
    done += run_window(&world, win, nops - done, ops, &sh, &t, train_between);
    if (done >= next_ckpt) {
      next_ckpt += every;
      ckpts++;
      if (!checkpoint_round(path, win, why, sizeof why) && bad_ckpts++ == 0)
        diag_all("checkpoint: %s", why);
    }
    if (rss_warm < 0 && done >= nops / 10) {
      rss_warm = rss_kib();
      fd_warm = fds();
      th_warm = threads();
    }
    if (now() - last_report >= 30) {
      last_report = now();
      diag("%lld of %lld collectives, %.0f s", (long long)done, (long long)nops,
           last_report - t0);
    }
  }
  long rss_end = rss_kib(), fd_end = fds(), th_end = threads();
  double secs = now() - t0;
  if (set_ops > 0)
    stop_workers(wk);

  for (int k = 0; k < NKINDS; k++)
    ok(wrong[k] == 0, "%ld %ss exact", count[k], kind_name[k]);
  ok(t.rejected == 0, "all %lld collectives accepted", (long long)nops);
  ok(bad_steps == 0, "%ld distributed SGD steps", steps);
  ok(bad_ckpts == 0 && ckpts > 0,
     "%ld checkpoints saved, spoilt and loaded back exactly", ckpts);
  diag("%lld collectives and %ld steps in %.1f s at np %d", (long long)nops,
       steps, secs, P);

  /* The tail and the join. */
  struct hvdt_ar tail[12];
  int mine = 3 * (P - R), tail_bad = 0;
  for (int j = 0; j < mine; j++) {
    memset(&tail[0], 0, sizeof tail[0]);
    snprintf(tail[0].name, sizeof tail[0].name, "soak.tail.%d", j);
    tail[0].dtype = HVD_FLOAT32;
    tail[0].op = HVD_SUM;
    tail[0].ndim = 1;
    tail[0].n = 100 + j;
    tail[0].pre = tail[0].post = 1.0;
    tail[0].salt = j;
    hvdt_ar_submit(&tail[0], tail_value, -1);
    hvdt_ar_wait(&tail[0]);
    if (!hvdt_ar_check(&tail[0], tail_value, P - j / 3, why, sizeof why) &&
        tail_bad++ == 0)
      diag_all("tail %d: %s", j, why);
    hvdt_ar_free(&tail[0]);
  }
  int last = -1;
  hvd_result_t jrc = hvd_join(&last);
  ok(tail_bad == 0, "the tail: rank r's 3 (P - r) allreduces exact");
  ok(jrc == HVD_SUCCESS && last == 0, "hvd_join: rank 0 joined last (%d, %d)",
     jrc, last);

  /* Resources. */
  long growth = rss_end - rss_warm, most = 0;
  MPI_Allreduce(&growth, &most, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  diag("resident memory after the warm-up %ld KiB, at the end %ld KiB on "
       "rank 0; the most any rank grew over the last %lld collectives: "
       "%+ld KiB",
       rss_warm, rss_end, (long long)(nops - nops / 10), most);
  if (rss_checked) {
    ok(rss_warm > 0 && growth <= slack,
       "resident memory grows at most %ld KiB after the warm-up", slack);
    if (growth > slack)
      diag_all("resident %ld KiB -> %ld KiB", rss_warm, rss_end);
  } else {
    skip(1, "resident memory not checked (HVD_SOAK_RSS_SLACK_KIB=off)");
  }
  ok(fd_end == fd_warm && th_end == th_warm,
     "no descriptors or threads made while running");
  if (fd_end != fd_warm || th_end != th_warm)
    diag_all("after the warm-up %ld fds, %ld threads; at the end %ld, %ld",
             fd_warm, th_warm, fd_end, th_end);
  hvd_optimizer_destroy(opt);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  long fd1 = fds(), th1 = threads();
  ok(fd1 == fd0 && th1 == th0 && arenas() <= 1,
     "hvd_shutdown leaves the descriptors and threads hvd_init found (and "
     "its host arena)");
  if (fd1 != fd0 || th1 != th0)
    diag_all("before hvd_init %ld fds, %ld threads; after shutdown %ld, %ld",
             fd0, th0, fd1, th1);
  /* Once more, to see that nothing accumulates per init; without a
   * timeline, which would replace the main run's (t/soak/matrix.sh reads
   * it). */
  unsetenv("HVD_TIMELINE");
  int again = hvd_init() == HVD_SUCCESS;
  if (again)
    hvdt_allreduce_works("soak.again", HVD_INT32, 8, "again: an allreduce");
  else
    skip(2, "hvd_init failed: %s", hvd_last_error());
  again = hvd_shutdown() == HVD_SUCCESS && again;
  long fd2 = fds(), th2 = threads();
  ok(again && fd2 == fd0 && th2 == th0 && arenas() <= 1,
     "a second init and shutdown leave them too");
  if (fd2 != fd0 || th2 != th0)
    diag_all("before %ld fds, %ld threads; after %ld, %ld", fd0, th0, fd2, th2);
  hvdt_remove_tmpdir(dir);
  return tap_mpi_finish();
}
