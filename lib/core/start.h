/*
 * start.h - hvd_init's first traffic on the communicator it is given: the
 * preconnect (HVD_MPI_PRECONNECT) and the ranks' agreement on their
 * settings, both bounded by HVD_STALL_SHUTDOWN_TIME.
 */
#ifndef HVD_CORE_START_H
#define HVD_CORE_START_H

#include <mpi.h>

#include "base/errors.h"
#include "base/settings.h"

/* Collective over comm, before any other message of hvd's there. The
 * preconnect (when 2 <= size <= s->preconnect), then one nonblocking
 * allgather in which every rank gives whether it could read its settings
 * (`loaded`, with its message `why`), its HVD_MPI_PRECONNECT and how far
 * its preconnect got. Every rank then returns the same result: the
 * lowest failing rank's settings error ("hvd_init: rank 1: ..."; its own
 * message there), else HVD_ERR_INVALID_ARG "HVD_MPI_PRECONNECT must be
 * equal on every rank: rank 0 64 vs rank 1 0", else the lowest rank's
 * preconnect stall (HVD_ERR_STALL), after every preconnect message sent
 * was received and every receive left was cancelled, so comm is clean and
 * hvd_init may be called again. Only when the agreement itself does not
 * complete within twice HVD_STALL_SHUTDOWN_TIME of the start (a rank that
 * never came) is the result a fatal HVD_ERR_STALL (hvd__fatal_set: the
 * job ends at exit). A rank that cannot send its preconnect messages ends
 * the job with MPI_Abort. *ms: the preconnect's milliseconds, or -1 when
 * it was not made. */
hvd_result_t hvd__start_agree(MPI_Comm comm, const hvd__settings_t *s,
                              hvd_result_t loaded, const char *why, double *ms);

#endif /* HVD_CORE_START_H */
