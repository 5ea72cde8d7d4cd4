/*
 * clock.c - hvd's one clock (internal.h): monotonic seconds, for cycle
 * deadlines, stall times, back-off, timeouts and the timeline.
 */
#include <time.h>

#include "internal.h"

double hvd__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void hvd__timespec_at(double t, struct timespec *ts) {
  ts->tv_sec = (time_t)t;
  ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}
