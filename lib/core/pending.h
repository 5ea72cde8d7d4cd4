/*
 * pending.h - the coordinator's record of one name that some ranks have
 * submitted and others not yet: what each rank sent, and since when. The
 * controller keeps them in order of first submission; the stall inspector
 * (stall.c) reads them.
 */
#ifndef HVD_CORE_PENDING_H
#define HVD_CORE_PENDING_H

#include <stdio.h>

#include "core/request.h"

typedef struct hvd__pending {
  char *name;
  hvd__desc_t *desc;   /* per rank */
  double *ready;       /* per rank: submission time, aligned clock */
  unsigned char *have; /* per rank */
  int count;
  double first_seen; /* the first submission (hvd__now()), whenever it
                        reached the coordinator */
  int warned;        /* the stall inspector has warned about it */
  struct hvd__pending *prev, *next; /* in order of first submission */
} hvd__pending_t;

/* "<kind> '<name>'" or just "<kind>" for barrier and join: how messages
 * name the collective. */
static inline void hvd__pending_label(const hvd__pending_t *p, int coll,
                                      char *buf, size_t n) {
  if (coll == HVD__BARRIER || coll == HVD__JOIN)
    snprintf(buf, n, "%s", hvd__coll_name(coll));
  else
    snprintf(buf, n, "%s '%s'", hvd__coll_name(coll), p->name);
}

#endif /* HVD_CORE_PENDING_H */
