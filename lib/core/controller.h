/*
 * controller.h - negotiation: each cycle, every rank sends the descriptors
 * of its new requests to the coordinator (rank 0), which counts them per
 * name; once every rank (or every rank that has not joined) has a name,
 * it checks that they agree and answers with the ordered response list
 * that all ranks then execute in the same order.
 */
#ifndef HVD_CORE_CONTROLLER_H
#define HVD_CORE_CONTROLLER_H

#include <mpi.h>

#include "base/settings.h"
#include "core/message.h"
#include "core/request.h"

typedef struct hvd__controller hvd__controller_t;

/* comm and s are borrowed. With `timeline`, responses carry every rank's
 * ready time. `epoch` is this rank's hvd__now() at the aligned clock's
 * zero (the ready times' clock): the stall inspector counts a name's
 * wait from its first submission, not from its arrival here (a cached
 * one arrives after its hit waited). Messages name comm rank r as
 * world_ranks[r] (borrowed; NULL: as r). NULL when out of memory. */
hvd__controller_t *hvd__controller_create(MPI_Comm comm, int rank, int size,
                                          const hvd__settings_t *s,
                                          int timeline, double epoch,
                                          const int *world_ranks);

/* 1 when the coordinator wants a slow-path round even if no rank has new
 * requests: something is pending and a stall check is due (rank 0). */
int hvd__controller_busy(hvd__controller_t *c);
void hvd__controller_destroy(hvd__controller_t *c); /* accepts NULL */

/* One negotiation round; collective over comm. fresh are this rank's
 * requests submitted since the last round; want_shutdown: 0, or why this
 * rank stops (HVD__STOP_BY_*, message.h). On success *out holds *nout
 * responses (free with hvd__responses_free). */
hvd_result_t hvd__controller_negotiate(hvd__controller_t *c,
                                       hvd_request_t *const *fresh, int nfresh,
                                       int want_shutdown, hvd__response_t **out,
                                       int *nout);

#endif /* HVD_CORE_CONTROLLER_H */
