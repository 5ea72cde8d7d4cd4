/*
 * pace.h - the pace of the engine's loop (pace.c): when the next cycle
 * starts. While this rank has requests in flight it waits for its peers,
 * which need it in a cycle, so the next cycle comes after a short
 * back-off that doubles while cycles make no progress, up to the cycle
 * time. With nothing in flight it sleeps the cycle time, then twice, four
 * times ... up to 16 times that while cycles stay idle: an idle round
 * costs every rank a collective, 1000 a second at the default 1 ms, which
 * is CPU taken from forward passes and data loading. Sleeping longer
 * delays nothing: a submission wakes the thread at once (engine.c), and a
 * peer's new work waits for this rank's own submission of the same
 * collective anyway.
 */
#ifndef HVD_CORE_PACE_H
#define HVD_CORE_PACE_H

#include <stddef.h>

typedef struct hvd__pace {
  double backoff; /* while in flight: the next wait */
  int idle;       /* the idle sleep, in cycle times: 1, 2, 4 ... 16 */
  double settled; /* when the last negotiation ended: about the same
                     moment on every rank, so idle sleeps counted from it
                     keep the ranks' rounds aligned (counted from each
                     rank's own start, an early rank would wait for a late
                     one in every round) */
  double next;    /* deadline of the next cycle */
} hvd__pace_t;

/* The cycle time (HVD_CYCLE_TIME, which autotune may change) is passed
 * in seconds each time. A loop that starts at `now`: */
void hvd__pace_init(hvd__pace_t *p, double cycle, double now);
/* Before waiting: the deadline for `inflight` requests in flight; with
 * callers blocked in hvd_wait the core is this thread's, so no back-off
 * (the next cycle meets a late peer the moment it arrives). */
void hvd__pace_deadline(hvd__pace_t *p, double cycle, size_t inflight,
                        int callers_waiting);
/* A caller poked the engine (it blocked): the back-off starts again. */
void hvd__pace_poked(hvd__pace_t *p);
/* A cycle starts at `now`: the next one no later than a cycle time on. */
void hvd__pace_start(hvd__pace_t *p, double cycle, double now);
/* A cycle ended; `progress` (new work, or something agreed) resets the
 * back-off and the idle sleep; `settled` is when its negotiation ended. */
void hvd__pace_end(hvd__pace_t *p, int progress, double settled);

#endif /* HVD_CORE_PACE_H */
