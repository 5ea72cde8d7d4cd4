/*
 * queue.h - a FIFO of requests, linked through their `next` field: the
 * engine's submission queue and its list for the coordinator. A request
 * is on at most one list at a time. Not thread-safe: the owner locks.
 */
#ifndef HVD_CORE_QUEUE_H
#define HVD_CORE_QUEUE_H

#include <stddef.h>

#include "core/request.h"

typedef struct hvd__queue {
  hvd_request_t *head, *tail;
} hvd__queue_t;

static inline int hvd__queue_empty(const hvd__queue_t *q) {
  return q->head == NULL;
}

static inline void hvd__queue_push(hvd__queue_t *q, hvd_request_t *r) {
  r->next = NULL;
  if (q->tail != NULL)
    q->tail->next = r;
  else
    q->head = r;
  q->tail = r;
}

/* Empties q; returns what it held, oldest first, linked through `next`. */
static inline hvd_request_t *hvd__queue_take(hvd__queue_t *q) {
  hvd_request_t *list = q->head;
  q->head = q->tail = NULL;
  return list;
}

/* Requests on a list linked through `next`. */
static inline int hvd__list_len(const hvd_request_t *list) {
  int n = 0;
  for (; list != NULL; list = list->next)
    n++;
  return n;
}

#endif /* HVD_CORE_QUEUE_H */
