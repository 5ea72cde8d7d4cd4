/*
 * wait.c - how every thread of hvd waits: the engine for MPI requests,
 * CUDA events and NCCL, callers for their requests. With one core per
 * rank, the engine shares its core with the caller's compute: while the
 * caller computes, the engine's waits sleep so as not to steal the core;
 * once the caller blocks in hvd_wait the core is the engine's, and every
 * microsecond it sleeps is exposed. The policy (hvd__wait_backoff) and the
 * signal that tells the two cases apart (hvd__caller_blocks) live here
 * together.
 */
#include "base/wait.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/errors.h"

static atomic_int callers_waiting;
static pthread_mutex_t nap_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t nap_cv; /* CLOCK_MONOTONIC, made once */
static pthread_once_t nap_once = PTHREAD_ONCE_INIT;
static unsigned long nap_gen; /* bumped each time a caller starts waiting */
static void (*wake_fn)(void *);
static void *wake_arg;

static void nap_init(void) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&nap_cv, &ca);
  pthread_condattr_destroy(&ca);
}

int hvd__callers_waiting(void) {
  return atomic_load_explicit(&callers_waiting, memory_order_relaxed) > 0;
}

void hvd__nap(double seconds) {
  pthread_once(&nap_once, nap_init);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  long ns = ts.tv_nsec + (long)(seconds * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_mutex_lock(&nap_mu);
  unsigned long gen = nap_gen;
  while (gen == nap_gen)
    if (pthread_cond_timedwait(&nap_cv, &nap_mu, &ts) != 0)
      break; /* timed out */
  pthread_mutex_unlock(&nap_mu);
}

void hvd__set_wake(void (*fn)(void *), void *arg) {
  pthread_mutex_lock(&nap_mu);
  wake_fn = fn;
  wake_arg = arg;
  pthread_mutex_unlock(&nap_mu);
}

void hvd__caller_blocks(void) {
  pthread_once(&nap_once, nap_init);
  atomic_fetch_add_explicit(&callers_waiting, 1, memory_order_relaxed);
  pthread_mutex_lock(&nap_mu);
  nap_gen++;
  pthread_cond_broadcast(&nap_cv);
  if (wake_fn != NULL)
    wake_fn(wake_arg);
  pthread_mutex_unlock(&nap_mu);
}

void hvd__caller_unblocks(void) {
  atomic_fetch_sub_explicit(&callers_waiting, 1, memory_order_relaxed);
}

void hvd__wait_backoff(unsigned spin) {
  if (spin < 100)
    return; /* a peer is usually microseconds away */
  /* While the caller computes, this thread shares its core: after a short
   * spin, yield, then nap. While a caller is blocked in hvd_wait the core
   * is ours and a nap only delays the result: keep yielding (others that
   * share the core still get it) for much longer. */
  if (spin < 300 || (spin < 20000 && hvd__callers_waiting())) {
    sched_yield();
    return;
  }
  hvd__nap(spin < 2000 ? 20e-6 : 200e-6); /* cut short when a caller blocks */
}

hvd_result_t hvd__mpi_wait(MPI_Request *req, const char *what) {
  for (unsigned spin = 0;; spin++) {
    int done = 0;
    int mrc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (mrc != MPI_SUCCESS)
      return hvd__mpi_error(mrc, what);
    if (done)
      return HVD_SUCCESS;
    hvd__wait_backoff(spin);
  }
}

/* ---- a barrier of processes in shared memory ---------------------------- */

/* Sleeps while *word == seen (at most 100 ms: a wake cannot be lost, the
 * kernel compares the word first, but a bound costs nothing). */
static void word_sleep(_Atomic uint32_t *word, uint32_t seen) {
#ifdef __linux__
  struct timespec limit = {0, 100000000L};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &limit, NULL, 0);
#else
  (void)word;
  (void)seen;
  nanosleep(&(struct timespec){0, 20000}, NULL);
#endif
}

static void word_wake(_Atomic uint32_t *word) {
#ifdef __linux__
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#else
  (void)word;
#endif
}

void hvd__shm_barrier(hvd__shm_barrier_t *b, int n) {
  uint32_t round = atomic_load(&b->round);
  if (atomic_fetch_add(&b->arrived, 1) + 1 == (uint32_t)n) {
    atomic_store(&b->arrived, 0); /* before the round moves on */
    atomic_fetch_add(&b->round, 1);
    if (atomic_load(&b->sleepers) > 0)
      word_wake(&b->round);
    return;
  }
  /* A peer is usually microseconds away: spin for 2 us first, no more.
   * Spinning longer (50 us, tried) lets a waiter burn the slice that a
   * descheduled peer needs when the cores are busy: 50 times slower. */
  const long limit_us = 2;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (unsigned spin = 1;; spin++) {
    if (atomic_load(&b->round) != round)
      return;
    if (spin % 64 == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000L + (t.tv_nsec - t0.tv_nsec) / 1000 >=
          limit_us)
        break;
    }
  }
  atomic_fetch_add(&b->sleepers, 1);
  while (atomic_load(&b->round) == round)
    word_sleep(&b->round, round);
  atomic_fetch_sub(&b->sleepers, 1);
}
