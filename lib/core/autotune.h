/*
 * autotune.h - online tuning of fusion threshold, chunk size and cycle
 * time (HVD_AUTOTUNE=1). Rank 0 scores each burst of work (from the first
 * submission while idle until nothing is in flight) as bytes reduced per
 * second, tries the candidates of one parameter at a time, keeps the best,
 * and finally checks the result against the defaults head to head, so it
 * never ends worse than them. The engine sends rank 0's parameters to
 * every rank inside the per-cycle negotiation, so all switch together.
 */
#ifndef HVD_CORE_AUTOTUNE_H
#define HVD_CORE_AUTOTUNE_H

#include <stdint.h>

#include "base/settings.h"
#include "internal.h"

typedef struct hvd__tune_params {
  int64_t fusion_threshold; /* bytes */
  int64_t chunk_bytes;      /* 0: the executor's default */
  int64_t cycle_us;
} hvd__tune_params_t;

typedef struct hvd__autotune hvd__autotune_t;

/* Starts from the settings' values, which are the defaults it compares
 * with: the untuned run's, HVD_CHUNK_SIZE=0 included (the executor's
 * default, carried as 0). HVD_AUTOTUNE_LOG may be "" (no log); a write
 * to it that fails is said once (a warning) and ends the log. *out NULL
 * with the message set on failure: HVD_ERR_NO_MEMORY, or HVD_ERR_IO when
 * the log cannot be opened. */
hvd_result_t hvd__autotune_create(const hvd__settings_t *s,
                                  hvd__autotune_t **out);
void hvd__autotune_destroy(hvd__autotune_t *a); /* accepts NULL */

/* HVD_CYCLE_TIME (ms) in whole microseconds as the tuner carries it: to
 * the nearest, and at least 1 unless it is 0 (a time below 1 us must not
 * become 0, a cycle without a pause). */
int64_t hvd__autotune_cycle_us(double ms);

/* Feeds one finished burst; *p gets the parameters to use from now on. */
void hvd__autotune_record(hvd__autotune_t *a, int64_t bytes, double seconds,
                          hvd__tune_params_t *p);
/* 1 once tuning has finished (parameters are final). */
int hvd__autotune_done(const hvd__autotune_t *a);
/* Bursts scored so far. */
int hvd__autotune_samples(const hvd__autotune_t *a);

/* The burst accounting the engine feeds: a burst runs from the first
 * submission while nothing is in flight (begin, under the engine's lock)
 * until nothing is in flight again (end, under the lock too); add counts
 * the allreduce bytes executed meanwhile. Finished bursts wait in ended_*
 * until hvd__autotune_score hands them to the tuner. */
typedef struct hvd__burst {
  double start;        /* first submission while idle */
  int64_t bytes;       /* allreduce bytes executed in the current burst */
  int64_t ended_bytes; /* finished bursts, not yet scored */
  double ended_seconds;
} hvd__burst_t;

static inline void hvd__burst_begin(hvd__burst_t *b, double now) {
  b->start = now;
}

static inline void hvd__burst_add(hvd__burst_t *b, int64_t bytes) {
  b->bytes += bytes;
}

/* The current burst ended at `now` (nothing in flight); nothing when it
 * executed no allreduce. */
void hvd__burst_end(hvd__burst_t *b, double now);

/* Rank 0: scores the bursts that ended since the last call (none: nothing
 * changes); *p gets the parameters to use from now on. */
void hvd__autotune_score(hvd__autotune_t *a, hvd__burst_t *b,
                         hvd__tune_params_t *p);

#endif /* HVD_CORE_AUTOTUNE_H */
