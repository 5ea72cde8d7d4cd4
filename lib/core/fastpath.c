/*
 * fastpath.c - the response cache's per-cycle round (fastpath.h): which
 * cached collectives are ready on every rank, which entries every rank
 * drops, and rank 0's tuned parameters, in one MPI_Allreduce(BOR).
 */
#include "core/fastpath.h"

#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "base/wait.h"
#include "core/cache.h"

/* Where each part of the vector lies; computed once. */
typedef struct layout {
  int len;         /* words in all */
  int words;       /* words per bit set (0 without a cache) */
  int nparams;     /* tuned parameters (3 when tuning, else 0) */
  uint64_t *flags; /* [0] */
  uint64_t *tuned; /* [1, 1 + nparams) */
  uint64_t *notready;
  uint64_t *inval;
  uint64_t *has; /* some rank has a request waiting on the entry */
} layout_t;

struct hvd__fastpath {
  hvd__fastpath_config_t cfg;
  hvd__cache_t *cache;
  int flush; /* a put failed here: the next round empties every cache */
  uint64_t *vec;
  layout_t at;
  hvd_request_t **hits; /* per bit: this rank's request waiting on it */
  double *hit_since;
  char **names;   /* per ready response: the cache's name, lent */
  struct member { /* per ready group member, to order them (respond) */
    uint64_t id;
    int n, i, bit;
  } * members;
};

static int bit_get(const uint64_t *v, int b) {
  return (int)((v[b >> 6] >> (b & 63)) & 1);
}

static void bit_set(uint64_t *v, int b) { v[b >> 6] |= 1ull << (b & 63); }

static layout_t layout(uint64_t *vec, int capacity, int tuning) {
  layout_t at;
  at.words = (capacity + 63) / 64;
  at.nparams = tuning ? 3 : 0;
  at.len = 1 + at.nparams + 3 * at.words;
  if (vec == NULL) { /* the length alone (no arithmetic on NULL) */
    at.flags = at.tuned = at.notready = at.inval = at.has = NULL;
    return at;
  }
  at.flags = vec;
  at.tuned = vec + 1;
  at.notready = at.tuned + at.nparams;
  at.inval = at.notready + at.words;
  at.has = at.inval + at.words;
  return at;
}

hvd__fastpath_t *hvd__fastpath_create(const hvd__fastpath_config_t *cfg) {
  hvd__fastpath_t *f = calloc(1, sizeof *f);
  if (f == NULL)
    goto fail;
  f->cfg = *cfg;
  int cap = cfg->capacity;
  f->at = layout(NULL, cap, cfg->tuning);
  f->vec = calloc((size_t)f->at.len, sizeof *f->vec);
  if (f->vec == NULL)
    goto fail;
  f->at = layout(f->vec, cap, cfg->tuning);
  if (cap > 0) {
    f->cache = hvd__cache_create(cap);
    f->hits = calloc((size_t)cap, sizeof *f->hits);
    f->hit_since = calloc((size_t)cap, sizeof *f->hit_since);
    f->names = calloc((size_t)cap, sizeof *f->names);
    f->members = calloc((size_t)cap, sizeof *f->members);
    if (!f->cache || !f->hits || !f->hit_since || !f->names || !f->members) {
      hvd__fastpath_destroy(f);
      hvd__set_error(HVD_ERR_NO_MEMORY, "response cache");
      return NULL;
    }
  }
  return f;
fail:
  hvd__fastpath_destroy(f);
  hvd__set_error(HVD_ERR_NO_MEMORY, "negotiation vector");
  return NULL;
}

void hvd__fastpath_destroy(hvd__fastpath_t *f) {
  if (f == NULL)
    return;
  hvd__cache_destroy(f->cache);
  free(f->hits);
  free(f->hit_since);
  free(f->names);
  free(f->members);
  free(f->vec);
  free(f);
}

static int same_group(const hvd__desc_t *a, const hvd__desc_t *b) {
  return a->group_n == b->group_n && a->group_id == b->group_id;
}

/* Erases every entry of the group that d is a member of (d: a copy, as
 * its own entry goes too), sending the hits waiting on them to `slow`.
 * Every rank does the same from the same cache, so that a group is never
 * partly cached when some rank waits on it. */
static void drop_group(hvd__fastpath_t *f, hvd__desc_t d, hvd__queue_t *slow) {
  int cap = hvd__cache_capacity(f->cache);
  for (int b = 0; b < cap; b++) {
    if (!hvd__cache_valid(f->cache, b) ||
        !same_group(hvd__cache_desc(f->cache, b), &d))
      continue;
    if (f->hits[b] != NULL)
      hvd__queue_push(slow, f->hits[b]);
    f->hits[b] = NULL;
    hvd__cache_erase(f->cache, b);
  }
}

/* A group's members, submitted together and so next to each other from
 * `first` on in group order: hits if every one is cached as it is now;
 * else all of them go to the coordinator, and every rank drops the
 * entries that some were cached in. Returns the request after them. */
static hvd_request_t *sort_group(hvd__fastpath_t *f, hvd_request_t *first,
                                 double now, hvd__queue_t *slow) {
  const int n = first->desc.group_n;
  int got = 0, all = f->cache != NULL, bit;
  hvd_request_t *r = first;
  for (; r != NULL && got < n && same_group(&r->desc, &first->desc) &&
         r->desc.group_i == got;
       r = r->next, got++)
    if (all && hvd__cache_lookup(f->cache, r->name, &r->desc, &bit) < 0)
      all = 0;
  hvd_request_t *rest = r;
  all = all && got == n;
  r = first;
  for (int k = 0; k < got; k++) {
    hvd_request_t *next = r->next;
    int c = f->cache != NULL
                ? hvd__cache_lookup(f->cache, r->name, &r->desc, &bit)
                : HVD__CACHE_MISS;
    if (all) {
      f->hits[bit] = r;
      f->hit_since[bit] = now;
    } else {
      if (c != HVD__CACHE_MISS)
        bit_set(f->at.inval, bit);
      hvd__queue_push(slow, r);
    }
    r = next;
  }
  return rest;
}

void hvd__fastpath_sort(hvd__fastpath_t *f, hvd_request_t *list, int *joined,
                        hvd__queue_t *slow) {
  double now = hvd__now();
  memset(f->vec, 0, (size_t)f->at.len * sizeof *f->vec);
  while (list != NULL) {
    hvd_request_t *r = list;
    if (r->desc.group_n > 0) {
      list = sort_group(f, r, now, slow);
      if (list == r) { /* not its group's first: the coordinator's */
        list = r->next;
        hvd__queue_push(slow, r);
      }
      continue;
    }
    list = r->next;
    if (r->desc.coll == HVD__JOIN)
      *joined = 1;
    int bit = -1, k = HVD__CACHE_MISS;
    if (f->cache != NULL && r->desc.coll != HVD__JOIN)
      k = hvd__cache_lookup(f->cache, r->name, &r->desc, &bit);
    if (k >= 0) {
      f->hits[bit] = r;
      f->hit_since[bit] = now;
      continue;
    }
    if (k == HVD__CACHE_STALE)
      bit_set(f->at.inval, bit); /* parameters changed: every rank drops it */
    hvd__queue_push(slow, r);
  }
}

/* This rank's not-ready and has bits; a hit waiting too long is dropped,
 * so that the coordinator's stall inspector sees it. Joined, this rank
 * drops every cached collective but the allreduces, which it takes part
 * in (ready, with a stub, though it has no request: another rank's hit
 * sets the has bit that makes it run): another rank's hit on one of the
 * others goes to the coordinator at once, for the error a joined rank
 * gives it. (A stale bit is already in inval: what every rank sees after
 * the OR decides.) */
static void mark(hvd__fastpath_t *f, int joined) {
  int cap = hvd__cache_capacity(f->cache);
  double now = hvd__now(), stall = f->cfg.stall_s;
  for (int i = 0; i < f->at.words; i++)
    f->at.notready[i] = ~0ull;
  for (int b = 0; b < cap; b++) {
    int ready = f->hits[b] != NULL;
    if (!ready && joined && hvd__cache_valid(f->cache, b)) {
      ready = hvd__cache_desc(f->cache, b)->coll == HVD__ALLREDUCE;
      if (!ready)
        bit_set(f->at.inval, b);
    }
    if (ready)
      f->at.notready[b >> 6] &= ~(1ull << (b & 63));
    if (f->hits[b] != NULL)
      bit_set(f->at.has, b);
    if (f->hits[b] != NULL && stall > 0 && now - f->hit_since[b] > stall)
      bit_set(f->at.inval, b);
  }
}

static hvd_result_t exchange(hvd__fastpath_t *f) {
  MPI_Request mr;
  int mrc = MPI_Iallreduce(MPI_IN_PLACE, f->vec, f->at.len, MPI_UINT64_T,
                           MPI_BOR, f->cfg.comm, &mr);
  if (mrc != MPI_SUCCESS)
    return hvd__mpi_error(mrc, "MPI_Iallreduce");
  return hvd__mpi_wait(&mr, "negotiation");
}

/* Some rank could not cache what every rank agreed, so the bits may mean
 * other names on its peers: every rank drops every entry in the same
 * round, before anything runs from the cache, and its hits go to the
 * coordinator (the cache fills again alike from what it agrees next). */
static void flush(hvd__fastpath_t *f, hvd__queue_t *slow) {
  int cap = hvd__cache_capacity(f->cache);
  for (int b = 0; b < cap; b++) {
    if (f->hits[b] != NULL)
      hvd__queue_push(slow, f->hits[b]);
    f->hits[b] = NULL;
    hvd__cache_erase(f->cache, b);
  }
  f->flush = 0;
}

/* Entry b runs this cycle: kept, ready on every rank, and some rank has
 * a request on it. Without that last, a cycle in which every rank has
 * joined would run every cached allreduce with stubs alone: nobody's. */
static int runs(const hvd__fastpath_t *f, int b) {
  return !bit_get(f->at.inval, b) && !bit_get(f->at.notready, b) &&
         bit_get(f->at.has, b) && hvd__cache_valid(f->cache, b);
}

/* Drops what some rank invalidated (a group's member: the whole group);
 * counts what runs. */
static int settle(hvd__fastpath_t *f, hvd__queue_t *slow) {
  int cap = hvd__cache_capacity(f->cache), nready = 0;
  for (int b = 0; b < cap; b++) {
    if (!bit_get(f->at.inval, b))
      continue;
    if (f->hits[b] != NULL)
      hvd__queue_push(slow, f->hits[b]);
    f->hits[b] = NULL;
    if (hvd__cache_valid(f->cache, b) &&
        hvd__cache_desc(f->cache, b)->group_n > 0)
      drop_group(f, *hvd__cache_desc(f->cache, b), slow);
    hvd__cache_erase(f->cache, b);
  }
  for (int b = 0; b < cap; b++)
    nready += runs(f, b);
  return nready;
}

/* Timeline: rank 0 learns every rank's ready time (aligned clock) of the
 * collectives agreed through the cache; mine[k] is this rank's for list[k]. */
static hvd_result_t gather_ready(hvd__fastpath_t *f, hvd__response_t *list,
                                 int n, const double *mine) {
  hvd_result_t rc = HVD_SUCCESS;
  double *all = NULL;
  int size = f->cfg.size;
  if (f->cfg.rank == 0) {
    all = malloc((size_t)n * (size_t)size * sizeof *all);
    if (all == NULL) /* still take part in the gather */
      HVD__LOG(HVD__LOG_WARNING, "timeline: no memory for ready times");
  }
  HVD__MPI_CHECK(
      MPI_Gather(mine, n, MPI_DOUBLE, all, n, MPI_DOUBLE, 0, f->cfg.comm));
  for (int k = 0; k < n && all != NULL; k++) {
    list[k].ready = malloc((size_t)size * sizeof *list[k].ready);
    for (int r = 0; r < size && list[k].ready; r++)
      list[k].ready[r] = all[(size_t)r * (size_t)n + (size_t)k];
  }
fail:
  free(all);
  return rc;
}

/* Ready entry b as list[k]; its request (if this rank has it) leaves
 * the hits. */
static void emit(hvd__fastpath_t *f, int b, int k, hvd__response_t *list,
                 double *mine) {
  hvd__response_t *x = &list[k];
  x->kind = HVD__RESP_RUN;
  x->desc = *hvd__cache_desc(f->cache, b);
  x->nnames = 1;
  x->borrowed = 1; /* the cache's name, in f->names */
  f->names[k] = (char *)hvd__cache_name(f->cache, b);
  x->names = &f->names[k];
  if (mine != NULL) /* a joined rank has none: -1 */
    mine[k] = f->hits[b] != NULL ? f->hits[b]->t_ready : -1;
  x->req = f->hits[b];
  f->hits[b] = NULL; /* it runs now */
  hvd__cache_touch(f->cache, b);
}

static int member_cmp(const void *pa, const void *pb) {
  const struct member *a = pa, *b = pb;
  if (a->id != b->id)
    return a->id < b->id ? -1 : 1;
  if (a->n != b->n)
    return a->n < b->n ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* The nready responses every rank has: single collectives in bit order,
 * then each group's members together in group order (so that they fuse
 * as the coordinator's do), the same list on every rank. */
static hvd_result_t respond(hvd__fastpath_t *f, int nready,
                            hvd__fast_outcome_t *out) {
  hvd_result_t rc = HVD_SUCCESS;
  int cap = hvd__cache_capacity(f->cache), any = f->cfg.timeline_any;
  hvd__response_t *list = calloc((size_t)nready, sizeof *list);
  double *mine = any ? calloc((size_t)nready, sizeof *mine) : NULL;
  if (list == NULL || (any && mine == NULL)) {
    rc = hvd__set_error(HVD_ERR_NO_MEMORY, "response list");
    goto fail;
  }
  int k = 0, nm = 0;
  for (int b = 0; b < cap && k + nm < nready; b++) {
    if (!runs(f, b))
      continue;
    const hvd__desc_t *d = hvd__cache_desc(f->cache, b);
    if (d->group_n > 0)
      f->members[nm++] =
          (struct member){d->group_id, d->group_n, d->group_i, b};
    else
      emit(f, b, k++, list, mine);
  }
  qsort(f->members, (size_t)nm, sizeof *f->members, member_cmp);
  for (int m = 0; m < nm; m++)
    emit(f, f->members[m].bit, k++, list, mine);
  out->ready = list;
  out->nready = nready;
  list = NULL;
  if (any)
    rc = gather_ready(f, out->ready, nready, mine);
fail:
  free(list);
  free(mine);
  return rc;
}

hvd_result_t hvd__fastpath_run(hvd__fastpath_t *f, unsigned flags,
                               const hvd__tune_params_t *params, int joined,
                               hvd__queue_t *slow, hvd__fast_outcome_t *out) {
  hvd_result_t rc;
  memset(out, 0, sizeof *out);
  f->at.flags[0] = flags | (joined ? HVD__FAST_JOINED : 0u) |
                   (f->flush ? HVD__FAST_FLUSH : 0u);
  if (f->at.nparams > 0 && params != NULL) { /* the others add zeros */
    f->at.tuned[0] = (uint64_t)params->fusion_threshold;
    f->at.tuned[1] = (uint64_t)params->chunk_bytes;
    f->at.tuned[2] = (uint64_t)params->cycle_us;
  }
  mark(f, joined);
  HVD__CHECK(exchange(f));
  out->flags = (unsigned)f->at.flags[0];
  if (f->at.nparams > 0) { /* rank 0's parameters, on every rank at once */
    out->params.fusion_threshold = (int64_t)f->at.tuned[0];
    out->params.chunk_bytes = (int64_t)f->at.tuned[1];
    out->params.cycle_us = (int64_t)f->at.tuned[2];
  }
  if (out->flags & HVD__FAST_FLUSH)
    flush(f, slow);
  int nready = settle(f, slow);
  if (nready > 0)
    HVD__CHECK(respond(f, nready, out));
  for (int k = 0; (out->flags & HVD__FAST_JOINED) && k < out->nready; k++)
    out->ready[k].njoined = 1; /* some rank: its stubs are agreed */
  return HVD_SUCCESS;
fail:
  return rc;
}

void hvd__fastpath_learn(hvd__fastpath_t *f, const hvd__response_t *x,
                         hvd__queue_t *slow) {
  if (f->cache == NULL || x->kind != HVD__RESP_RUN || x->njoined > 0)
    return;
  char *evicted = NULL;
  hvd__desc_t gone;
  int bit = hvd__cache_put(f->cache, x->names[0], &x->desc, &evicted, &gone);
  if (bit < 0) { /* the cache is as it was; every rank's empties next */
    if (!f->flush)
      HVD__LOG(HVD__LOG_WARNING,
               "response cache: no memory for %s '%s': every rank empties "
               "its cache",
               hvd__coll_name(x->desc.coll), x->names[0]);
    f->flush = 1;
    return;
  }
  if (evicted != NULL && f->hits[bit] != NULL) {
    hvd__queue_push(slow, f->hits[bit]);
    f->hits[bit] = NULL;
  }
  if (evicted != NULL && gone.group_n > 0) /* and the rest of its group */
    drop_group(f, gone, slow);
  free(evicted);
}
