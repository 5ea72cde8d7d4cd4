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
