/*
 * fastpath.h - the per-cycle negotiation of cached collectives (Horovod's
 * response cache with its bit vector). Every rank contributes one vector
 * to one MPI_Allreduce(BOR):
 *
 *   [flags][tuned parameters][not-ready bits][invalidate bits][has bits]
 *
 * the flags word (HVD__FAST_SLOW, HVD__FAST_STOP, ...), rank 0's autotuned
 * parameters when tuning (the others add zeros), then one bit per cache
 * entry: "not ready here", "drop this entry" and "a request waits on it
 * here". A not-ready bit that is 0 on every rank (a rank that has joined
 * is ready for every cached allreduce) with a has bit set on some rank is
 * a collective every rank has; it runs without the coordinator. The
 * layout is computed once, at creation.
 *
 * Owned by the engine thread; nothing here locks.
 */
#ifndef HVD_CORE_FASTPATH_H
#define HVD_CORE_FASTPATH_H

#include <mpi.h>

#include "core/autotune.h"
#include "core/controller.h"
#include "core/queue.h"
#include "core/request.h"

/* The flags word: someone has requests for the coordinator; someone
 * called hvd_shutdown; someone has an engine command waiting
 * (hvd__engine_command); someone has none (a command runs when CMD is
 * set and NOCMD is not: every rank has one); someone has joined (its
 * allreduces' stubs are agreed before they run: the responses of the
 * round then say njoined 1, so every rank knows); someone's command has
 * waited past a stall time for ranks that have none (every rank then
 * tells how long it waited: engine_command.c); someone could not cache
 * what every rank agreed (hvd__fastpath_learn, out of memory: its bits
 * may now mean other names than its peers'), so every rank empties its
 * cache in this round before anything runs from it, its hits going to the
 * coordinator. */
#define HVD__FAST_SLOW 1u
#define HVD__FAST_STOP 2u
#define HVD__FAST_CMD 4u
#define HVD__FAST_NOCMD 8u
#define HVD__FAST_JOINED 16u
#define HVD__FAST_CMDWAIT 32u
#define HVD__FAST_FLUSH 64u

typedef struct hvd__fastpath hvd__fastpath_t;

typedef struct hvd__fastpath_config {
  MPI_Comm comm;
  int rank;
  int capacity;     /* cache entries (HVD_CACHE_CAPACITY; 0: no cache) */
  int tuning;       /* carry the autotuned parameters */
  double stall_s;   /* a hit waiting longer goes to the coordinator (the
                       first of the stall inspector's times; 0: never) */
  int timeline_any; /* gather every rank's ready times (rank 0) */
  int size;
} hvd__fastpath_config_t;

/* NULL with the message set when out of memory. */
hvd__fastpath_t *hvd__fastpath_create(const hvd__fastpath_config_t *cfg);
void hvd__fastpath_destroy(hvd__fastpath_t *f); /* accepts NULL */

/* Starts a cycle with this rank's new requests (linked through `next`):
 * cache hits wait for their bit, the rest go to `slow` for the
 * coordinator; a join sets *joined. */
void hvd__fastpath_sort(hvd__fastpath_t *f, hvd_request_t *list, int *joined,
                        hvd__queue_t *slow);

/* What one fast-path round agreed. */
typedef struct hvd__fast_outcome {
  unsigned flags;            /* every rank's flags, OR'ed */
  hvd__tune_params_t params; /* rank 0's parameters (when tuning) */
  hvd__response_t *ready;    /* the cached collectives to run now */
  int nready;
} hvd__fast_outcome_t;

/* The collective round: `flags` are this rank's, `params` rank 0's (NULL
 * elsewhere or when not tuning); a joined rank counts as ready for every
 * cached allreduce. Hits whose entry was dropped go back to `slow`. On
 * failure (HVD_ERR_MPI, HVD_ERR_NO_MEMORY, message set) out->ready may
 * hold responses all the same: the caller frees them either way
 * (hvd__responses_free). */
hvd_result_t hvd__fastpath_run(hvd__fastpath_t *f, unsigned flags,
                               const hvd__tune_params_t *params, int joined,
                               hvd__queue_t *slow, hvd__fast_outcome_t *out);

/* After a collective agreed by the coordinator ran on every rank: cache
 * it, so that next time it is a one-bit hit. A hit waiting on the entry
 * it evicts goes back to `slow`. When this rank cannot (out of memory) its
 * cache is left as it was, and its next round carries HVD__FAST_FLUSH. */
void hvd__fastpath_learn(hvd__fastpath_t *f, const hvd__response_t *x,
                         hvd__queue_t *slow);

#endif /* HVD_CORE_FASTPATH_H */
