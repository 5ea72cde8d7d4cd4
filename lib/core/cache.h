/*
 * cache.h - the response cache. Every rank holds the same cache: entries
 * are added when an agreed collective executes, in the same order on every
 * rank, and evicted (least recently executed) identically. A request whose
 * name is cached with an equal descriptor is a hit and is negotiated by one
 * bit in a vector that all ranks OR together; no coordinator round trip.
 * A grouped collective's member is an entry of its own, its group part of
 * its descriptor (fastpath.c keeps a group whole or out).
 */
#ifndef HVD_CORE_CACHE_H
#define HVD_CORE_CACHE_H

#include "core/request.h"

typedef struct hvd__cache hvd__cache_t;

enum { HVD__CACHE_MISS = -1, HVD__CACHE_STALE = -2 };

/* NULL when capacity is 0 (caching off) or out of memory. */
hvd__cache_t *hvd__cache_create(int capacity);
void hvd__cache_destroy(hvd__cache_t *c); /* accepts NULL */
int hvd__cache_capacity(const hvd__cache_t *c);

/* The bit of name when cached with a descriptor equal to d; else
 * HVD__CACHE_STALE (cached with another descriptor; *bit is set) or
 * HVD__CACHE_MISS. */
int hvd__cache_lookup(const hvd__cache_t *c, const char *name,
                      const hvd__desc_t *d, int *bit);

/* Caches (name, d) and returns its bit. When full, the least recently used
 * entry is evicted first: its bit is the one returned, *evicted gets its
 * name (malloc'd; the caller frees) and *evicted_desc its descriptor;
 * else *evicted is NULL. -1 when out of memory: the cache is then as it
 * was (nothing evicted). */
int hvd__cache_put(hvd__cache_t *c, const char *name, const hvd__desc_t *d,
                   char **evicted, hvd__desc_t *evicted_desc);

void hvd__cache_touch(hvd__cache_t *c, int bit); /* executed again */
void hvd__cache_erase(hvd__cache_t *c, int bit);
int hvd__cache_valid(const hvd__cache_t *c, int bit);
const char *hvd__cache_name(const hvd__cache_t *c, int bit);
const hvd__desc_t *hvd__cache_desc(const hvd__cache_t *c, int bit);

#endif /* HVD_CORE_CACHE_H */
