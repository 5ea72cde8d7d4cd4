/*
 * internal.h - what every layer of libhvd shares: the collective kinds and
 * a few helpers. Non-static internals are named hvd__*.
 */
#ifndef HVD_INTERNAL_H
#define HVD_INTERNAL_H

#include "hvd.h"

#define HVD__UNUSED __attribute__((unused))
#define HVD__PRINTF(f, a) __attribute__((format(printf, f, a)))

/* The kinds of collective the engine negotiates and executes. */
#define HVD__COLL_LIST(X)                                                      \
  X(HVD__ALLREDUCE, "allreduce")                                               \
  X(HVD__BROADCAST, "broadcast")                                               \
  X(HVD__ALLGATHER, "allgather")                                               \
  X(HVD__ALLTOALL, "alltoall")                                                 \
  X(HVD__REDUCESCATTER, "reducescatter")                                       \
  X(HVD__BARRIER, "barrier")                                                   \
  X(HVD__JOIN, "join")

typedef enum hvd__coll {
#define HVD__COLL_ENUM(id, word) id,
  /* clang-format off */ /* (the list's expansion ends with a comma) */
  HVD__COLL_LIST(HVD__COLL_ENUM)
#undef HVD__COLL_ENUM
  HVD__COLL_COUNT
  /* clang-format on */
} hvd__coll_t;

/* "allreduce" etc.; "unknown" out of range. */
const char *hvd__coll_name(int coll);

/* Monotonic clock in seconds (lib/base/clock.c). */
double hvd__now(void);

struct timespec;
/* hvd__now() time t as a timespec of CLOCK_MONOTONIC, for a condition
 * variable whose clock that is (pthread_condattr_setclock). */
void hvd__timespec_at(double t, struct timespec *ts);

#endif /* HVD_INTERNAL_H */
