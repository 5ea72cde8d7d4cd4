/*
 * stall.h - the stall inspector (Horovod's): on the coordinator, a
 * collective that some ranks submitted and others not for longer than
 * HVD_STALL_CHECK_TIME is logged once, naming the ranks it waits for and
 * those that submitted it; past HVD_STALL_SHUTDOWN_TIME one STALL response
 * goes to every rank, on which hvd stops with that message. Checked at
 * most every 0.1 s.
 */
#ifndef HVD_CORE_STALL_H
#define HVD_CORE_STALL_H

#include "base/wire.h"
#include "core/pending.h"

typedef struct hvd__stall {
  double check_s;    /* HVD_STALL_CHECK_TIME (0: off) */
  double shutdown_s; /* HVD_STALL_SHUTDOWN_TIME (0: off) */
  double next_check; /* hvd__now() of the next inspection */
  const int *world;  /* world rank of each rank named, or NULL (itself) */
} hvd__stall_t;

/* 1 when an inspection is due and there is something to inspect. */
int hvd__stall_due(const hvd__stall_t *s, int npending);

/* Inspects the pending list (head; joined[r]: rank r has joined, so it
 * waits for nobody there) of a world of `size` ranks. Writes at most one
 * STALL response to w; returns the number written. */
int hvd__stall_inspect(hvd__stall_t *s, hvd__pending_t *head,
                       const unsigned char *joined, int size, hvd__wbuf_t *w);

#endif /* HVD_CORE_STALL_H */
