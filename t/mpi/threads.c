/*
 * threads.c - the API from several threads of one process at once, as a
 * framework calls it from its autograd, data-loader and checkpoint
 * threads (hvd.h: "Every function here is thread-safe"):
 *   - submitters: 4 threads each submit their own allreduces, allgathers,
 *     broadcasts and grouped allreduces at a pace that differs per rank
 *     (so the ranks see them in different orders), waiting in either
 *     order; exact values;
 *   - handoff: one thread submits, another waits (or polls with
 *     hvd_test) and checks;
 *   - errors: one thread's failures (a NULL recv, a shape that differs
 *     between ranks) carry that thread's own messages while another
 *     thread's calls succeed with hvd_last_error() staying empty;
 *   - process sets: the world, a set of the first ranks and a split by
 *     parity, each driven by its own thread under the same names;
 *   - the arena: threads allocate and free hvd_alloc_host blocks of
 *     different sizes and reduce them (the zero-copy path);
 *   - the timeline: threads mark and count while reducing; every event
 *     is in the file, which is valid JSON; started and stopped 6 times
 *     while threads mark without a pause, every file whole;
 *   - shutdown (2+ ranks): threads waiting on collectives that can never
 *     complete are ended with HVD_ERR_SHUTDOWN and the shutdown's
 *     message.
 * The checks run on the main thread (tap is single-threaded): each
 * thread counts its failures and keeps the first one's description.
 * make check-tsan runs it under ThreadSanitizer (t/local.mk).
 */
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define THREADS 4
#define MSG_LEN 512

static int rank, size;

/* What one thread saw. */
struct seen {
  int failures;
  char first[MSG_LEN];
};

static void fail(struct seen *s, const char *fmt, ...) TAP_PRINTF(2, 3);
static void fail(struct seen *s, const char *fmt, ...) {
  if (s->failures++ > 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->first, sizeof s->first, fmt, ap);
  va_end(ap);
}

/* A failed call of the thread's own, with the message hvd gave it. */
static int failed(struct seen *s, hvd_result_t rc, const char *call) {
  if (rc == HVD_SUCCESS)
    return 0;
  fail(s, "%s: %s: %s", call, hvd_strerror(rc), hvd_last_error());
  return 1;
}

/* One check on the main thread that none of n threads failed: thread k
 * saw *(first + k * stride bytes), a struct seen in each one's record. */
static void report(const struct seen *first, size_t stride, int n,
                   const char *what) {
  int failures = 0;
  for (int k = 0; k < n; k++) {
    const struct seen *s =
        (const struct seen *)((const char *)first + (size_t)k * stride);
    failures += s->failures;
    if (s->failures > 0)
      tap_note("thread %d: %d failures, the first: %s", k, s->failures,
               s->first);
  }
  is_int(0, failures, "%s", what);
}

/* Sleeps 0-150 us, differently on every rank and thread, so that the
 * ranks submit in different orders. */
static void jitter(unsigned *seed) {
  *seed = *seed * 1103515245u + 12345u;
  struct timespec ts = {0, (long)((*seed >> 16) % 150) * 1000};
  nanosleep(&ts, NULL);
}

/* Runs fn on n threads, thread k given args + k * each; joins them. */
static void run_threads(int n, void *(*fn)(void *), void *args, size_t each) {
  pthread_t th[THREADS + 2];
  for (int k = 0; k < n; k++)
    if (pthread_create(&th[k], NULL, fn, (char *)args + k * each) != 0)
      bail("pthread_create failed");
  for (int k = 0; k < n; k++)
    pthread_join(th[k], NULL);
}

/* A thread of THREADS that each run fn(k): what it saw. */
struct worker {
  int k;
  struct seen seen;
};

/* Runs fn on THREADS workers, then one check that none failed. */
static void run_workers(void *(*fn)(void *), const char *what) {
  struct worker t[THREADS];
  memset(t, 0, sizeof t);
  for (int k = 0; k < THREADS; k++)
    t[k].k = k;
  run_threads(THREADS, fn, t, sizeof t[0]);
  report(&t[0].seen, sizeof t[0], THREADS, what);
}

/* ---- Submitters ---- */

#define ROUNDS 40

/* An allreduce of int32 x[j] = 1000 rank + 100 k + j over ranks. */
static void sub_allreduce(struct worker *t, int i, int32_t *x, int32_t *y,
                          int64_t n, hvd_request_t **req) {
  char name[64];
  snprintf(name, sizeof name, "sub.t%d.ar%d", t->k, i);
  for (int64_t j = 0; j < n; j++)
    x[j] = 1000 * rank + 100 * t->k + (int32_t)j;
  hvd_tensor_t s = hvd_tensor_make(x, HVD_INT32, 1, &n);
  hvd_tensor_t r = hvd_tensor_make(i % 2 ? x : y, HVD_INT32, 1, &n);
  if (failed(&t->seen, hvd_allreduce_async(name, &s, &r, HVD_SUM, 1, 1, req),
             name))
    *req = NULL;
}

static void sub_check_allreduce(struct worker *t, int i, const int32_t *x,
                                const int32_t *y, int64_t n) {
  const int32_t *got = i % 2 ? x : y;
  for (int64_t j = 0; j < n; j++) {
    int32_t want =
        1000 * size * (size - 1) / 2 + size * (100 * t->k + (int32_t)j);
    if (got[j] != want) {
      fail(&t->seen, "sub.t%d.ar%d: element %lld = %d, expected %d", t->k, i,
           (long long)j, got[j], want);
      return;
    }
  }
}

/* Rank q contributes q + 1 rows of 2 doubles, each q * 10 + k + i / 2. */
static void sub_allgather(struct worker *t, int i, double *x, hvd_tensor_t *out,
                          hvd_request_t **req) {
  char name[64];
  int64_t shape[2] = {rank + 1, 2};
  snprintf(name, sizeof name, "sub.t%d.ag%d", t->k, i);
  for (int j = 0; j < 2 * (rank + 1); j++)
    x[j] = rank * 10 + t->k + i / 2.0;
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT64, 2, shape);
  if (failed(&t->seen, hvd_allgather_async(name, &s, out, req), name))
    *req = NULL;
}

static void sub_check_allgather(struct worker *t, int i,
                                const hvd_tensor_t *out) {
  int64_t rows = (int64_t)size * (size + 1) / 2, at = 0;
  if (out->ndim != 2 || out->shape[0] != rows || out->shape[1] != 2) {
    fail(&t->seen, "sub.t%d.ag%d: shape [%lld, %lld], expected [%lld, 2]", t->k,
         i, (long long)out->shape[0], (long long)out->shape[1],
         (long long)rows);
    return;
  }
  const double *got = out->data;
  for (int q = 0; q < size; q++)
    for (int j = 0; j < 2 * (q + 1); j++, at++)
      if (got[at] != q * 10 + t->k + i / 2.0) {
        fail(&t->seen, "sub.t%d.ag%d: element %lld = %g, expected %g", t->k, i,
             (long long)at, got[at], q * 10 + t->k + i / 2.0);
        return;
      }
}

/* A grouped allreduce of two float32 tensors, every 5th round; blocking. */
static void sub_grouped(struct worker *t, int i) {
  char a[64], b[64];
  float x[2][8], y[2][8];
  int64_t n = 8;
  snprintf(a, sizeof a, "sub.t%d.ga%d", t->k, i);
  snprintf(b, sizeof b, "sub.t%d.gb%d", t->k, i);
  const char *names[2] = {a, b};
  hvd_tensor_t s[2], r[2];
  for (int g = 0; g < 2; g++) {
    for (int j = 0; j < 8; j++)
      x[g][j] = (float)(rank + g + j);
    s[g] = hvd_tensor_make(x[g], HVD_FLOAT32, 1, &n);
    r[g] = hvd_tensor_make(y[g], HVD_FLOAT32, 1, &n);
  }
  if (failed(&t->seen, hvd_grouped_allreduce(2, names, s, r, HVD_SUM, 1, 1), a))
    return;
  for (int g = 0; g < 2; g++)
    for (int j = 0; j < 8; j++)
      if (y[g][j] != (float)(size * (size - 1) / 2 + size * (g + j))) {
        fail(&t->seen, "%s: element %d = %g", names[g], j, y[g][j]);
        return;
      }
}

static void *submitter_main(void *arg) {
  struct worker *t = arg;
  unsigned seed = 77u * (unsigned)rank + 13u * (unsigned)t->k + 1u;
  int32_t x[64], y[64];
  double gx[16];
  int64_t bc[3];
  for (int i = 0; i < ROUNDS; i++) {
    int64_t n = 1 + (t->k * 13 + i * 7) % 50, three = 3;
    int root = (i + t->k) % size;
    char bname[64];
    hvd_request_t *req[3] = {NULL, NULL, NULL};
    hvd_tensor_t gathered = {0};
    jitter(&seed);
    sub_allreduce(t, i, x, y, n, &req[0]);
    jitter(&seed);
    sub_allgather(t, i, gx, &gathered, &req[1]);
    for (int j = 0; j < 3; j++)
      bc[j] = rank * 7 + i + j;
    snprintf(bname, sizeof bname, "sub.t%d.bc%d", t->k, i);
    hvd_tensor_t b = hvd_tensor_make(bc, HVD_INT64, 1, &three);
    if (failed(&t->seen, hvd_broadcast_async(bname, &b, root, &req[2]), bname))
      req[2] = NULL;
    for (int w = 0; w < 3; w++) { /* waits forward, or in reverse */
      int q = i % 2 ? w : 2 - w;
      if (req[q] != NULL && failed(&t->seen, hvd_wait(req[q]), "hvd_wait"))
        req[q] = NULL;
    }
    if (req[0] != NULL)
      sub_check_allreduce(t, i, x, y, n);
    if (req[1] != NULL)
      sub_check_allgather(t, i, &gathered);
    hvd_tensor_free(&gathered);
    for (int j = 0; j < 3 && req[2] != NULL; j++)
      if (bc[j] != root * 7 + i + j)
        fail(&t->seen, "%s: element %d = %lld, expected %d", bname, j,
             (long long)bc[j], root * 7 + i + j);
    if (i % 5 == 4)
      sub_grouped(t, i);
  }
  return NULL;
}

static void test_submitters(void) {
  run_workers(
      submitter_main,
      "4 threads x 40 rounds of allreduce, allgather, broadcast (and a "
      "grouped allreduce every 5th), each thread at its own pace on each "
      "rank: every result exact");
}

/* ---- Handoff: one thread submits, another waits ---- */

#define HANDOFF 64

struct handoff {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  hvd_request_t *req[HANDOFF];
  int pushed; /* requests handed over (a failed submission: NULL) */
  double x[HANDOFF][5], y[HANDOFF][5];
  struct seen producer, consumer;
};

static void *producer_main(void *arg) {
  struct handoff *h = arg;
  int64_t n = 5;
  for (int i = 0; i < HANDOFF; i++) {
    char name[32];
    hvd_request_t *req = NULL;
    snprintf(name, sizeof name, "handoff.%d", i);
    for (int j = 0; j < 5; j++)
      h->x[i][j] = rank + i + j * 0.25;
    hvd_tensor_t s = hvd_tensor_make(h->x[i], HVD_FLOAT64, 1, &n);
    hvd_tensor_t r = hvd_tensor_make(h->y[i], HVD_FLOAT64, 1, &n);
    if (failed(&h->producer,
               hvd_allreduce_async(name, &s, &r, HVD_SUM, 1, 1, &req), name))
      req = NULL;
    pthread_mutex_lock(&h->mu);
    h->req[i] = req;
    h->pushed = i + 1;
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
  }
  return NULL;
}

/* Waits for request i (odd i), or polls it with hvd_test (even i). */
static hvd_result_t finish(hvd_request_t *req, int i) {
  if (i % 2)
    return hvd_wait(req);
  for (;;) {
    int done = 0;
    hvd_result_t rc = hvd_test(req, &done);
    if (done || rc != HVD_SUCCESS)
      return rc;
    sched_yield();
  }
}

static void *consumer_main(void *arg) {
  struct handoff *h = arg;
  for (int i = 0; i < HANDOFF; i++) {
    pthread_mutex_lock(&h->mu);
    while (h->pushed <= i)
      pthread_cond_wait(&h->cv, &h->mu);
    hvd_request_t *req = h->req[i];
    pthread_mutex_unlock(&h->mu);
    if (req == NULL || failed(&h->consumer, finish(req, i), "handoff"))
      continue;
    for (int j = 0; j < 5; j++) {
      double want = size * (size - 1) / 2.0 + size * (i + j * 0.25);
      if (h->y[i][j] != want) {
        fail(&h->consumer, "handoff.%d: element %d = %g, expected %g", i, j,
             h->y[i][j], want);
        break;
      }
    }
  }
  return NULL;
}

static void test_handoff(void) {
  static struct handoff h;
  memset(&h, 0, sizeof h);
  pthread_mutex_init(&h.mu, NULL);
  pthread_cond_init(&h.cv, NULL);
  pthread_t p, c;
  if (pthread_create(&c, NULL, consumer_main, &h) != 0 ||
      pthread_create(&p, NULL, producer_main, &h) != 0)
    bail("pthread_create failed");
  pthread_join(p, NULL);
  pthread_join(c, NULL);
  pthread_mutex_destroy(&h.mu);
  pthread_cond_destroy(&h.cv);
  struct seen s[2] = {h.producer, h.consumer};
  report(s, sizeof s[0], 2,
         "64 allreduces submitted by one thread, waited (odd) or polled "
         "with hvd_test (even) by another: exact sums");
}

/* ---- Errors stay with their thread ---- */

struct errs {
  int k;     /* 0: the failing thread, 1: the succeeding one */
  int made;  /* calls the failing thread made that had to fail */
  int wrong; /* ... and those that did */
  struct seen seen;
};

/* The mismatch message of a float32 allreduce `name` whose shape is
 * [rank + 1] on every rank: hvdt_expect_mismatch's form. */
static void shape_mismatch_message(char *want, size_t len, const char *name) {
  size_t n =
      (size_t)snprintf(want, len, "allreduce '%s': rank 0 shape [1] vs", name);
  for (int r = 1; r < size && n < len; r++)
    n += (size_t)snprintf(want + n, len - n, "%s rank %d shape [%d]",
                          r == 1 ? "" : ",", r, r + 1);
}

/* One failing call: a NULL recv, or (mismatch, with more than one rank) a
 * shape that differs between ranks. The message is read after a yield,
 * giving another thread time to overwrite it were it not this thread's. */
static void fail_once(struct errs *t, int i, int mismatch) {
  char name[32], want[MSG_LEN];
  float x[8] = {0};
  int64_t n = 1 + (mismatch ? rank : 0);
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, &n);
  hvd_result_t rc, want_rc;
  if (mismatch) {
    snprintf(name, sizeof name, "mm.%d", i);
    shape_mismatch_message(want, sizeof want, name);
    rc = hvd_allreduce(name, &s, &s, HVD_SUM, 1, 1);
    want_rc = HVD_ERR_MISMATCH;
  } else {
    snprintf(name, sizeof name, "bad.%d", i);
    snprintf(want, sizeof want, "allreduce '%s': recv tensor is NULL", name);
    rc = hvd_allreduce(name, &s, NULL, HVD_SUM, 1, 1);
    want_rc = HVD_ERR_INVALID_ARG;
  }
  t->made++;
  t->wrong += rc != HVD_SUCCESS;
  sched_yield();
  if (rc != want_rc || strcmp(hvd_last_error(), want) != 0)
    fail(&t->seen, "%s: %s '%s', expected %s '%s'", name, hvd_strerror(rc),
         hvd_last_error(), hvd_strerror(want_rc), want);
}

/* The failing thread: 40 rounds of 50 refused calls, with a mismatch
 * every 8th round (more than one rank). */
static void errs_fail(struct errs *t) {
  for (int i = 0; i < 40; i++) {
    if (i % 8 == 0 && size > 1)
      fail_once(t, i, 1);
    for (int j = 0; j < 50; j++)
      fail_once(t, i * 50 + j, 0);
  }
}

/* The succeeding thread: 40 allreduces, hvd_last_error() read 20 times
 * after each (with yields between). */
static void errs_succeed(struct errs *t) {
  unsigned seed = 31u * (unsigned)rank + 5u;
  for (int i = 0; i < 40; i++) {
    char name[32], why[200];
    int right = 0;
    snprintf(name, sizeof name, "good.%d", i);
    jitter(&seed);
    hvd_result_t rc =
        hvdt_sum_allreduce(name, HVD_INT32, 6, &right, why, sizeof why);
    if (!failed(&t->seen, rc, name) && !right)
      fail(&t->seen, "%s", why);
    for (int k = 0; k < 20; k++, sched_yield())
      if (hvd_last_error()[0] != '\0') {
        fail(&t->seen,
             "%s: hvd_last_error() is '%s' on a thread whose calls all "
             "succeeded",
             name, hvd_last_error());
        break;
      }
  }
}

static void *errs_main(void *arg) {
  struct errs *t = arg;
  if (t->k == 0)
    errs_fail(t);
  else
    errs_succeed(t);
  return NULL;
}

static void test_errors(void) {
  struct errs t[2];
  memset(t, 0, sizeof t);
  t[1].k = 1;
  run_threads(2, errs_main, t, sizeof t[0]);
  report(&t[0].seen, sizeof t[0], 2,
         "one thread's 2000 refused calls (a NULL recv; every 8th round a "
         "shape that differs between ranks) each get their own result and "
         "message, while another thread's 40 allreduces succeed with "
         "hvd_last_error() empty");
  is_int(2000 + (size > 1 ? 5 : 0), t[0].made, "... %d calls made",
         2000 + (size > 1 ? 5 : 0));
  is_int(t[0].made, t[0].wrong, "... and every one of them failed");
}

/* ---- Process sets, each driven by its own thread ---- */

struct set_driver {
  const hvd_process_set_t *ps; /* NULL: the world */
  int member_sum;              /* the sum of (world rank + 1) over members */
  int members;
  int root; /* the world rank of the set's rank 0 */
  struct seen seen;
};

static void *set_main(void *arg) {
  struct set_driver *d = arg;
  unsigned seed = 17u * (unsigned)rank + (unsigned)hvd_process_set_id(d->ps);
  for (int i = 0; i < 30; i++) {
    char name[32];
    int64_t v[4], n = 4, one = 1;
    snprintf(name, sizeof name, "x.%d", i); /* the same names in every set */
    for (int j = 0; j < 4; j++)
      v[j] = (rank + 1) * (j + 1) + i;
    hvd_tensor_t t = hvd_tensor_make(v, HVD_INT64, 1, &n);
    jitter(&seed);
    hvd_result_t rc = d->ps
                          ? hvd_ps_allreduce(d->ps, name, &t, &t, HVD_SUM, 1, 1)
                          : hvd_allreduce(name, &t, &t, HVD_SUM, 1, 1);
    if (failed(&d->seen, rc, name))
      continue;
    for (int j = 0; j < 4; j++)
      if (v[j] != (int64_t)d->member_sum * (j + 1) + (int64_t)d->members * i)
        fail(&d->seen, "set %d: %s element %d = %lld",
             hvd_process_set_id(d->ps), name, j, (long long)v[j]);
    int64_t b = rank * 3 + i; /* broadcast from the set's rank 0 */
    hvd_tensor_t bt = hvd_tensor_make(&b, HVD_INT64, 1, &one);
    snprintf(name, sizeof name, "b.%d", i);
    rc = d->ps ? hvd_ps_broadcast(d->ps, name, &bt, 0)
               : hvd_broadcast(name, &bt, 0);
    if (!failed(&d->seen, rc, name) && b != d->root * 3 + i)
      fail(&d->seen, "set %d: %s = %lld, expected %d",
           hvd_process_set_id(d->ps), name, (long long)b, d->root * 3 + i);
  }
  return NULL;
}

static void test_sets(void) {
  int first[8], nfirst = size > 1 ? size - 1 : 1;
  for (int r = 0; r < nfirst; r++)
    first[r] = r;
  hvd_process_set_t *low = NULL, *parity = NULL;
  if (hvd_process_set_create(first, nfirst, &low) != HVD_SUCCESS ||
      hvd_process_set_split(rank % 2, &parity) != HVD_SUCCESS)
    bail("process sets: %s", hvd_last_error());
  struct set_driver d[3];
  int n = 0;
  memset(d, 0, sizeof d);
  d[n].ps = NULL; /* the world */
  d[n].members = size;
  d[n++].member_sum = size * (size + 1) / 2;
  d[n].ps = parity;
  d[n].root = rank % 2;
  for (int r = rank % 2; r < size; r += 2, d[n].members++)
    d[n].member_sum += r + 1;
  n++;
  if (rank < nfirst) {
    d[n].ps = low;
    d[n].members = nfirst;
    d[n++].member_sum = nfirst * (nfirst + 1) / 2;
  }
  run_threads(n, set_main, d, sizeof d[0]);
  report(&d[0].seen, sizeof d[0], n,
         "the world, a split by parity and a set of the first ranks, each "
         "driven by its own thread under the same names: 30 allreduces "
         "and broadcasts each, exact");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(parity),
         "the parity set destroyed");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(low),
         "the first ranks' set "
         "destroyed");
}

/* ---- The arena from several threads ---- */

static void *arena_main(void *arg) {
  struct worker *t = arg;
  for (int i = 0; i < 30; i++) {
    int64_t n = 1 + (t->k * 977 + i * 131) % 20000; /* the same everywhere */
    char name[48];
    snprintf(name, sizeof name, "arena.t%d.%d", t->k, i);
    float *x = hvd_alloc_host((size_t)n * sizeof(float));
    float *y = i % 3 ? hvd_alloc_host((size_t)n * sizeof(float)) : x;
    if (x == NULL || y == NULL) {
      fail(&t->seen, "%s: hvd_alloc_host: %s", name, hvd_last_error());
      return NULL;
    }
    for (int64_t j = 0; j < n; j++)
      x[j] = (float)(rank + j % 7 + t->k);
    hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, &n);
    hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, &n);
    if (!failed(&t->seen, hvd_allreduce(name, &s, &r, HVD_SUM, 1, 1), name))
      for (int64_t j = 0; j < n; j++) {
        float want = (float)(size * (size - 1) / 2 + size * (j % 7 + t->k));
        if (y[j] != want) {
          fail(&t->seen, "%s: element %lld = %g, expected %g", name,
               (long long)j, y[j], want);
          break;
        }
      }
    if (y != x && failed(&t->seen, hvd_free_host(y), "hvd_free_host"))
      return NULL;
    if (failed(&t->seen, hvd_free_host(x), "hvd_free_host"))
      return NULL;
  }
  return NULL;
}

static void test_arena(void) {
  run_workers(arena_main,
              "4 threads x 30 hvd_alloc_host blocks (1-20000 floats, in place "
              "every 3rd) reduced and freed: exact sums");
}

/* ---- The timeline from several threads ---- */

#define MARKS 25

static void *marker_main(void *arg) {
  struct worker *t = arg;
  char mark[32], count[32];
  snprintf(mark, sizeof mark, "mark.t%d", t->k);
  snprintf(count, sizeof count, "count.t%d", t->k);
  for (int i = 0; i < MARKS; i++) {
    char name[32], why[200];
    int right = 0;
    hvd_timeline_mark(mark);
    hvd_timeline_counter(count, i);
    snprintf(name, sizeof name, "tl.t%d.%d", t->k, i);
    hvd_result_t rc =
        hvdt_sum_allreduce(name, HVD_FLOAT32, 4, &right, why, sizeof why);
    if (!failed(&t->seen, rc, name) && !right)
      fail(&t->seen, "%s", why);
  }
  return NULL;
}

/* On rank 0, the file's events named `name` with phase ph. */
static int count_events(const struct hvdt_event *ev, int n, const char *name,
                        const char *ph) {
  int c = 0;
  for (int i = 0; i < n; i++)
    c += strcmp(ev[i].name, name) == 0 && strcmp(ev[i].ph, ph) == 0;
  return c;
}

static void test_timeline(void) {
  char dir[256], path[300];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-threads");
  snprintf(path, sizeof path, "%s/timeline.json", dir);
  is_int(HVD_SUCCESS, hvd_timeline_start(path), "hvd_timeline_start");
  run_workers(marker_main,
              "4 threads mark, count and reduce 25 times each with the "
              "timeline on: exact sums");
  is_int(HVD_SUCCESS, hvd_timeline_stop(), "hvd_timeline_stop");
  int marks = THREADS * MARKS, counters = THREADS * MARKS, n = 0;
  struct hvdt_event *ev = NULL;
  if (rank == 0) { /* the file is rank 0's */
    char *text = hvdt_slurp(path);
    ev = text ? hvdt_timeline_parse(text, &n) : NULL;
    tap_note("%s: %s", path, text ? "not JSON" : "cannot read");
    free(text);
    marks = counters = 0;
    for (int k = 0; ev != NULL && k < THREADS; k++) {
      char name[32];
      snprintf(name, sizeof name, "mark.t%d", k);
      marks += count_events(ev, n, name, "i") == MARKS;
      snprintf(name, sizeof name, "count.t%d", k);
      counters += count_events(ev, n, name, "C") == MARKS;
    }
    marks *= MARKS;
    counters *= MARKS;
  }
  ok(rank != 0 || ev != NULL, "the timeline written from 5 threads is JSON");
  free(ev);
  is_int(THREADS * MARKS, marks, "... with each thread's 25 marks");
  is_int(THREADS * MARKS, counters, "... and its 25 counter values");
  hvdt_remove_tmpdir(dir);
}

/* The churning threads' flag and count of marks made. */
struct churn {
  atomic_int stop;
  atomic_long marks;
};

/* Marks without a pause until c->stop. */
static void *churn_main(void *arg) {
  struct churn *c = arg;
  for (long i = 0; !atomic_load(&c->stop); i++) {
    hvd_timeline_mark("churn");
    hvd_timeline_counter("churn.count", (double)i);
    atomic_fetch_add(&c->marks, 1);
  }
  return NULL;
}

/* Until more than THREADS marks were made after this call began (so at
 * least one whole call began after it), at most 30 s. */
static void marks_land(struct churn *c) {
  long from = atomic_load(&c->marks);
  for (int k = 0; k < 30000 && atomic_load(&c->marks) <= from + THREADS; k++)
    nanosleep(&(struct timespec){0, 1000000}, NULL);
}

/* hvd_timeline_start and stop, 6 files in turn, while 4 threads mark
 * and count: every file is whole JSON, with marks in it. */
static void test_timeline_churn(void) {
  char dir[256], path[6][300];
  static struct churn c;
  pthread_t th[THREADS];
  atomic_store(&c.stop, 0);
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-threads-churn");
  for (int k = 0; k < THREADS; k++)
    if (pthread_create(&th[k], NULL, churn_main, &c) != 0)
      bail("pthread_create failed");
  int started = 0, stopped = 0;
  for (int f = 0; f < 6; f++) {
    snprintf(path[f], sizeof path[f], "%s/churn%d.json", dir, f);
    started += hvd_timeline_start(path[f]) == HVD_SUCCESS;
    hvdt_allreduce_works(NULL, HVD_INT32, 3, "churn: file %d: an allreduce", f);
    marks_land(&c);
    stopped += hvd_timeline_stop() == HVD_SUCCESS;
  }
  atomic_store(&c.stop, 1);
  for (int k = 0; k < THREADS; k++)
    pthread_join(th[k], NULL);
  is_int(6, started, "churn: 6 hvd_timeline_start while 4 threads mark");
  is_int(6, stopped, "churn: ... and 6 hvd_timeline_stop");
  int whole = 6, marked = 6;
  if (rank == 0)
    for (int f = 0; f < 6; f++) {
      char *text = hvdt_slurp(path[f]);
      int n = 0;
      struct hvdt_event *ev = text ? hvdt_timeline_parse(text, &n) : NULL;
      size_t len = text ? strlen(text) : 0; /* closed: "...]\n" */
      if (ev == NULL || len < 2 || text[len - 2] != ']') {
        whole--;
        tap_note("%s is not a closed JSON array", path[f]);
      }
      marked -= ev == NULL || count_events(ev, n, "churn", "i") == 0;
      free(ev);
      free(text);
    }
  is_int(6, whole, "churn: each file is a closed JSON array");
  is_int(6, marked, "churn: ... with marks in it");
  hvdt_remove_tmpdir(dir);
}

/* ---- Shutdown while threads wait ---- */

struct waiter {
  int k;
  pthread_barrier_t *submitted;
  hvd_result_t rc;
  char msg[MSG_LEN];
  struct seen seen;
};

/* Waits on an allreduce that only this rank submits (its name has the
 * rank in it), which only the shutdown ends. */
static void *waiter_main(void *arg) {
  struct waiter *t = arg;
  char name[48];
  float x[4] = {0};
  int64_t n = 4;
  hvd_request_t *req = NULL;
  snprintf(name, sizeof name, "never.r%d.t%d", rank, t->k);
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, &n);
  t->rc = hvd_allreduce_async(name, &s, &s, HVD_SUM, 1, 1, &req);
  pthread_barrier_wait(t->submitted);
  if (t->rc == HVD_SUCCESS)
    t->rc = hvd_wait(req);
  snprintf(t->msg, sizeof t->msg, "%s", hvd_last_error());
  int by = -1, end = 0;
  char want[128];
  snprintf(want, sizeof want, "allreduce '%s': hvd was shut down by rank",
           name);
  if (t->rc != HVD_ERR_SHUTDOWN || strncmp(t->msg, want, strlen(want)) != 0 ||
      sscanf(t->msg + strlen(want), " %d before this collective completed%n",
             &by, &end) != 1 ||
      t->msg[strlen(want) + (size_t)end] != '\0' || by < 0 || by >= size)
    fail(&t->seen, "%s: %s '%s'", name, hvd_strerror(t->rc), t->msg);
  return NULL;
}

static void test_shutdown(void) {
  pthread_barrier_t submitted;
  pthread_barrier_init(&submitted, NULL, THREADS + 1);
  struct waiter t[THREADS];
  pthread_t th[THREADS];
  memset(t, 0, sizeof t);
  for (int k = 0; k < THREADS; k++) {
    t[k].k = k;
    t[k].submitted = &submitted;
    if (pthread_create(&th[k], NULL, waiter_main, &t[k]) != 0)
      bail("pthread_create failed");
  }
  pthread_barrier_wait(&submitted);
  MPI_Barrier(MPI_COMM_WORLD); /* every rank's threads have submitted */
  hvd_result_t rc = hvd_shutdown();
  for (int k = 0; k < THREADS; k++)
    pthread_join(th[k], NULL);
  pthread_barrier_destroy(&submitted);
  is_int(HVD_SUCCESS, rc, "hvd_shutdown with 4 threads waiting");
  report(&t[0].seen, sizeof t[0], THREADS,
         "... each thread's wait ends with HVD_ERR_SHUTDOWN, \"allreduce "
         "'never.rR.tK': hvd was shut down by rank Q before this collective "
         "completed\"");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > 8)
    bail("at most 8 ranks");
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  test_submitters();
  test_handoff();
  test_errors();
  test_sets();
  test_arena();
  test_timeline();
  test_timeline_churn();
  if (size > 1) {
    test_shutdown();
  } else { /* one rank is every rank: its collectives all complete */
    is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
    skip(1, "shutdown with threads waiting needs a rank that never submits");
  }
  return tap_mpi_finish();
}
