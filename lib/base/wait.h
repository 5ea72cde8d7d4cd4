/*
 * wait.h - the waiting policy of every hvd thread (see wait.c): callers
 * blocked in hvd_wait, the engine's naps that such a caller cuts short,
 * and the back-off of every poll loop (MPI requests, CUDA events, NCCL).
 */
#ifndef HVD_BASE_WAIT_H
#define HVD_BASE_WAIT_H

#include <mpi.h>
#include <stdatomic.h>
#include <stdint.h>

#include "internal.h"

/* ---- callers blocked in hvd_wait ---------------------------------------- */

/* Non-zero while some application thread is blocked in hvd_wait. */
int hvd__callers_waiting(void);

/* Sleeps up to `seconds`, returning early when an application thread
 * starts waiting (so a back-off never delays the moment it matters). */
void hvd__nap(double seconds);

/* fn(arg) runs (under an internal lock: it must only signal) each time an
 * application thread starts blocking in hvd_wait; NULL removes it. Once
 * hvd__set_wake(NULL, NULL) returns, the previous fn is not running and
 * will not run again. */
void hvd__set_wake(void (*fn)(void *), void *arg);

/* An application thread is about to block (hvd_wait): wakes whoever naps
 * and runs the wake function. hvd__caller_unblocks when it stops. */
void hvd__caller_blocks(void);
void hvd__caller_unblocks(void);

/* ---- poll loops -----------------------------------------------------------
 */

/* Completes *req: polls MPI_Test briefly, then yields, then sleeps in
 * short steps, so a rank waiting for slower peers gives its core back. */
hvd_result_t hvd__mpi_wait(MPI_Request *req, const char *what);

/* That policy, for any poll loop: call after the spin-th unsuccessful poll
 * (0, 1, ...). Returns at once for the first 100, yields the core for the
 * next 200, then sleeps 20 us, and 200 us from the 2000th on. The device
 * executors wait on CUDA events with it. */
void hvd__wait_backoff(unsigned spin);

/* ---- a barrier of processes in shared memory ---------------------------- */

/* Lives in memory that the n processes share, zeroed before its first
 * use, and is reused: every process calls hvd__shm_barrier(b, n) in
 * turn. */
typedef struct hvd__shm_barrier {
  _Atomic uint32_t arrived;  /* of this round */
  _Atomic uint32_t round;    /* the futex word: bumped by the last arriver */
  _Atomic uint32_t sleepers; /* processes in futex_wait, to skip the wake */
} hvd__shm_barrier_t;

/* Returns once all n processes have called it for this round; orders
 * memory like a full fence (writes before it are seen by every process
 * after it). A waiter spins briefly, then sleeps on a futex (Linux; a
 * short nap elsewhere) which the last arriver wakes: a waiter that is
 * asleep costs no CPU, and the kernel runs it as soon as it is woken,
 * even with other work on its core, which a polled MPI barrier cannot
 * get (it must be scheduled to notice). */
void hvd__shm_barrier(hvd__shm_barrier_t *b, int n);

#endif /* HVD_BASE_WAIT_H */
