/* cache.c - fixed-capacity table of agreed collectives, LRU eviction. */
#include "core/cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/table.h"
#include "base/tensor.h"

typedef struct entry {
  char *name; /* NULL: free slot */
  hvd__desc_t desc;
  uint64_t used; /* tick of the last execution */
} entry_t;

struct hvd__cache {
  int capacity, count;
  uint64_t tick;
  entry_t *entries;
  hvd__table_t *bits; /* name -> bit + 1 */
};

hvd__cache_t *hvd__cache_create(int capacity) {
  if (capacity <= 0)
    return NULL;
  hvd__cache_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->capacity = capacity;
  c->entries = calloc((size_t)capacity, sizeof *c->entries);
  c->bits = hvd__table_create();
  if (c->entries == NULL || c->bits == NULL) {
    hvd__cache_destroy(c);
    return NULL;
  }
  return c;
}

void hvd__cache_destroy(hvd__cache_t *c) {
  if (c == NULL)
    return;
  for (int i = 0; c->entries && i < c->capacity; i++)
    free(c->entries[i].name);
  free(c->entries);
  hvd__table_destroy(c->bits);
  free(c);
}

int hvd__cache_capacity(const hvd__cache_t *c) { return c ? c->capacity : 0; }

static int desc_equal(const hvd__desc_t *a, const hvd__desc_t *b) {
  if (a->coll != b->coll || a->dtype != b->dtype ||
      !hvd__device_kind_equal(a->device, b->device) || a->ndim != b->ndim ||
      a->op != b->op || a->prescale != b->prescale ||
      a->postscale != b->postscale || a->root != b->root ||
      a->wire != b->wire || a->group_n != b->group_n ||
      a->group_i != b->group_i || a->group_id != b->group_id)
    return 0; /* a group's member and the same tensor alone differ too */
  /* allgather and alltoall may change their first dimension freely */
  int from = (a->coll == HVD__ALLGATHER || a->coll == HVD__ALLTOALL) ? 1 : 0;
  for (int i = from; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i])
      return 0;
  return 1;
}

int hvd__cache_lookup(const hvd__cache_t *c, const char *name,
                      const hvd__desc_t *d, int *bit) {
  intptr_t v = (intptr_t)hvd__table_get(c->bits, name);
  if (v == 0)
    return HVD__CACHE_MISS;
  *bit = (int)v - 1;
  return desc_equal(&c->entries[*bit].desc, d) ? *bit : HVD__CACHE_STALE;
}

void hvd__cache_erase(hvd__cache_t *c, int bit) {
  entry_t *e = &c->entries[bit];
  if (e->name == NULL)
    return;
  hvd__table_remove(c->bits, e->name);
  free(e->name);
  e->name = NULL;
  c->count--;
}

/* The bit a new entry takes: the first free one, else the least recently
 * executed entry's (evicted). */
static int victim(const hvd__cache_t *c) {
  int bit = 0;
  if (c->count < c->capacity) {
    while (c->entries[bit].name != NULL)
      bit++;
    return bit;
  }
  for (int i = 1; i < c->capacity; i++)
    if (c->entries[i].used < c->entries[bit].used)
      bit = i;
  return bit;
}

int hvd__cache_put(hvd__cache_t *c, const char *name, const hvd__desc_t *d,
                   char **evicted, hvd__desc_t *evicted_desc) {
  *evicted = NULL;
  intptr_t v = (intptr_t)hvd__table_get(c->bits, name);
  if (v != 0) { /* re-agreed with new parameters */
    int bit = (int)v - 1;
    c->entries[bit].desc = *d;
    hvd__cache_touch(c, bit);
    return bit;
  }
  /* What the entry needs is had before anything changes, so that a
   * failure leaves the cache as it was (the name is new to the table). */
  int bit = victim(c);
  char *copy = hvd__fault("cache") ? NULL : strdup(name);
  if (copy == NULL ||
      hvd__table_put(c->bits, name, (void *)(intptr_t)(bit + 1)) != 0) {
    free(copy);
    return -1;
  }
  entry_t *e = &c->entries[bit];
  if (e->name != NULL) { /* full: the least recently executed goes */
    hvd__table_remove(c->bits, e->name);
    *evicted = e->name;
    *evicted_desc = e->desc;
    c->count--;
  }
  e->name = copy;
  e->desc = *d;
  c->count++;
  hvd__cache_touch(c, bit);
  return bit;
}

void hvd__cache_touch(hvd__cache_t *c, int bit) {
  c->entries[bit].used = ++c->tick;
}

int hvd__cache_valid(const hvd__cache_t *c, int bit) {
  return bit >= 0 && bit < c->capacity && c->entries[bit].name != NULL;
}

const char *hvd__cache_name(const hvd__cache_t *c, int bit) {
  return c->entries[bit].name;
}

const hvd__desc_t *hvd__cache_desc(const hvd__cache_t *c, int bit) {
  return &c->entries[bit].desc;
}
