/*
 * pending.h - the coordinator's record of one name that some ranks have
 * submitted and others not yet: what each rank sent, and since when. The
 * controller keeps them in order of first submission; the stall inspector
 * (stall.c) reads them.
 */
#ifndef HVD_CORE_PENDING_H
#define HVD_CORE_PENDING_H

#include <stdio.h>
#include <string.h>

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
 * name the collective. A name too long for buf (n >= 32) is cut and ends
 * visibly, its quote kept: "allreduce 'verylongname...'". */
static inline void hvd__pending_label(const hvd__pending_t *p, int coll,
                                      char *buf, size_t n) {
  const char *kind = hvd__coll_name(coll);
  if (coll == HVD__BARRIER || coll == HVD__JOIN) {
    snprintf(buf, n, "%s", kind);
    return;
  }
  size_t k = strlen(kind);
  if (n < k + 8 || strlen(p->name) + k + 4 <= n) { /* " '", "'", NUL */
    snprintf(buf, n, "%s '%s'", kind, p->name);
    return;
  }
  size_t keep = n - k - 7; /* " '", "...'", NUL */
  memcpy(buf, kind, k);
  memcpy(buf + k, " '", 2);
  memcpy(buf + k + 2, p->name, keep);
  memcpy(buf + k + 2 + keep, "...'", 5);
}

#endif /* HVD_CORE_PENDING_H */
