/*
 * fastpath.c - grouped collectives in the response cache, white box: the
 * fast path (lib/core/fastpath.c) driven by hand on MPI_COMM_WORLD, no
 * engine (linked against libhvd.a; its functions are not exported).
 *
 *  1. A group that ran is a hit next time: no coordinator, every member
 *     ready in one round, after the single collectives and in group order
 *     although its entries' bits lie around a single one's, so that the
 *     members fuse as the coordinator's do.
 *  2. A group the last rank submits a round later runs then, on every rank.
 *  3. A member submitted with other parameters on rank 0 alone: every
 *     member goes to the coordinator on every rank (none runs from the
 *     cache), and every rank has dropped the group's entries after it.
 *  4. A member evicted: its whole group leaves the cache, and a group
 *     waiting on its entries goes to the coordinator, every member.
 *  5. A group's member submitted alone is not a hit, nor a single
 *     collective's name submitted in a group.
 *
 * Every rank holds the same cache (the entries are learned in the same
 * order), as the engine's ranks do. np 1-4.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "core/fastpath.h"
#include "core/message.h"
#include "core/queue.h"
#include "hvd.h"
#include "tap.h"

static int R, P;

enum { MAXR = 8 };
static const uint64_t GID = 0x5eedf00dull;

static hvd__desc_t single(hvd_dtype_t dt, int64_t n) {
  hvd__desc_t d;
  memset(&d, 0, sizeof d);
  d.coll = HVD__ALLREDUCE;
  d.dtype = dt;
  d.device = HVD_CPU;
  d.ndim = 1;
  d.shape[0] = n;
  d.op = HVD_SUM;
  d.prescale = d.postscale = 1.0;
  d.wire = dt;
  return d;
}

/* Member i of the group of "g.0", "g.1", "g.2" (float32 [4] each). */
static hvd__desc_t member(int i) {
  hvd__desc_t d = single(HVD_FLOAT32, 4);
  d.group_n = 3;
  d.group_i = i;
  d.group_id = GID;
  return d;
}

static const char *const G[3] = {"g.0", "g.1", "g.2"};

static hvd__fastpath_t *make(int capacity) {
  hvd__fastpath_config_t cfg = {.comm = MPI_COMM_WORLD,
                                .rank = R,
                                .capacity = capacity,
                                .size = P};
  hvd__fastpath_t *f = hvd__fastpath_create(&cfg);
  if (f == NULL)
    bail("hvd__fastpath_create: %s", hvd_last_error());
  return f;
}

/* The names on a list linked through `next`, space-separated. */
static void names_of(const hvd_request_t *r, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (; r != NULL && at < cap; r = r->next)
    at += (size_t)snprintf(buf + at, cap - at, "%s%s", at ? " " : "", r->name);
}

/* What the coordinator agreed on (name, d) ran: the cache learns it.
 * Hits it sent back to the coordinator are named in slow (may be NULL). */
static void learn(hvd__fastpath_t *f, const char *name, hvd__desc_t d,
                  char *slow, size_t cap) {
  hvd__response_t x;
  memset(&x, 0, sizeof x);
  char *nm = (char *)name;
  x.kind = HVD__RESP_RUN;
  x.desc = d;
  x.nnames = 1;
  x.names = &nm;
  hvd__queue_t q = {NULL, NULL};
  hvd__fastpath_learn(f, &x, &q);
  if (slow != NULL)
    names_of(q.head, slow, cap);
}

/* This rank's requests for one round. */
typedef struct batch {
  int n;
  hvd_request_t *r[MAXR];
} batch_t;

static void add(batch_t *b, const char *name, hvd__desc_t d) {
  hvd_request_t *r = hvd__request_new(name);
  if (r == NULL || b->n == MAXR)
    bail("request '%s'", name);
  r->desc = d;
  b->r[b->n++] = r;
}

static void add_group(batch_t *b) {
  for (int i = 0; i < 3; i++)
    add(b, G[i], member(i));
}

static void batch_free(batch_t *b) {
  for (int i = 0; i < b->n; i++)
    hvd__request_free(b->r[i]);
  b->n = 0;
}

/* Puts b's requests in (linked as the engine's queue links them). */
static void sort(hvd__fastpath_t *f, batch_t *b, hvd__queue_t *slow) {
  for (int i = 0; i < b->n; i++)
    b->r[i]->next = i + 1 < b->n ? b->r[i + 1] : NULL;
  int joined = 0;
  hvd__fastpath_sort(f, b->n > 0 ? b->r[0] : NULL, &joined, slow);
}

/* The round after sort: the names that every rank runs from the cache,
 * in order, into ran; those sent to the coordinator into slow. */
static void run(hvd__fastpath_t *f, hvd__queue_t *q, char *ran, char *slow,
                size_t cap) {
  hvd__fast_outcome_t out;
  if (hvd__fastpath_run(f, HVD__FAST_NOCMD, NULL, 0, q, &out) != HVD_SUCCESS)
    bail("hvd__fastpath_run: %s", hvd_last_error());
  size_t at = 0;
  ran[0] = '\0';
  for (int k = 0; k < out.nready && at < cap; k++)
    at += (size_t)snprintf(ran + at, cap - at, "%s%s", k ? " " : "",
                           out.ready[k].names[0]);
  names_of(q->head, slow, cap);
  hvd__responses_free(out.ready, out.nready);
}

/* sort + run, with this rank's batch b. */
static void round_(hvd__fastpath_t *f, batch_t *b, char *ran, char *slow,
                   size_t cap) {
  hvd__queue_t q = {NULL, NULL};
  sort(f, b, &q);
  run(f, &q, ran, slow, cap);
}

static void learn_group(hvd__fastpath_t *f) {
  for (int i = 0; i < 3; i++)
    learn(f, G[i], member(i), NULL, 0);
}

static void test_hit_in_order(void) {
  hvd__fastpath_t *f = make(16);
  char ran[256], slow[256];
  batch_t b = {0};
  /* bits: g.0 (cached alone first, then as a member: the same entry),
   * x, g.1, g.2 */
  learn(f, "g.0", single(HVD_FLOAT32, 4), NULL, 0);
  learn(f, "x", single(HVD_INT32, 3), NULL, 0);
  learn_group(f);
  add(&b, "x", single(HVD_INT32, 3));
  add_group(&b);
  round_(f, &b, ran, slow, sizeof ran);
  is_string("x g.0 g.1 g.2", ran,
            "a cached group: every member from the cache in one round, "
            "after the single one, in group order");
  is_string("", slow, "  nothing for the coordinator");
  batch_free(&b);
  add_group(&b); /* and again, alone */
  round_(f, &b, ran, slow, sizeof ran);
  is_string("g.0 g.1 g.2", ran, "  and the next step too");
  batch_free(&b);
  hvd__fastpath_destroy(f);
}

static void test_late_rank(void) {
  hvd__fastpath_t *f = make(16);
  char ran[256], slow[256];
  batch_t b = {0};
  learn_group(f);
  if (R < P - 1)
    add_group(&b);
  round_(f, &b, ran, slow, sizeof ran);
  is_string("", ran,
            "a group the last rank has not submitted: nothing runs");
  batch_free(&b);
  if (R == P - 1)
    add_group(&b);
  round_(f, &b, ran, slow, sizeof ran);
  is_string("g.0 g.1 g.2", ran, "  the round it has: the whole group");
  is_string("", slow, "  nothing for the coordinator");
  batch_free(&b);
  hvd__fastpath_destroy(f);
}

static void test_stale_member(void) {
  hvd__fastpath_t *f = make(16);
  char ran[256], slow[256];
  batch_t b = {0};
  learn_group(f);
  add_group(&b);
  if (R == 0) /* g.1 with another shape here only */
    b.r[1]->desc.shape[0] = 5;
  round_(f, &b, ran, slow, sizeof ran);
  is_string("", ran, "a member changed on rank 0: nothing from the cache");
  is_string("g.0 g.1 g.2", slow, "  every member to the coordinator");
  batch_free(&b);
  add_group(&b); /* as cached before: every entry went on every rank */
  round_(f, &b, ran, slow, sizeof ran);
  is_string("g.0 g.1 g.2", slow, "  then the group is cached no more");
  batch_free(&b);
  hvd__fastpath_destroy(f);
}

static void test_evicted_member(void) {
  hvd__fastpath_t *f = make(4);
  char ran[256], slow[256];
  batch_t b = {0};
  hvd__queue_t q = {NULL, NULL};
  learn_group(f);
  learn(f, "y", single(HVD_FLOAT64, 2), NULL, 0);
  add_group(&b);
  sort(f, &b, &q); /* hits, waiting for a round */
  learn(f, "z", single(HVD_FLOAT64, 2), slow, sizeof slow); /* evicts g.0 */
  is_string("g.0 g.1 g.2", slow,
            "g.0 evicted: the group waiting on it to the coordinator");
  run(f, &q, ran, slow, sizeof ran);
  is_string("", ran, "  none of it from the cache");
  batch_free(&b);
  add_group(&b);
  round_(f, &b, ran, slow, sizeof ran);
  is_string("g.0 g.1 g.2", slow,
            "  g.1 and g.2 left the cache with it (a full miss)");
  batch_free(&b);
  add(&b, "y", single(HVD_FLOAT64, 2));
  round_(f, &b, ran, slow, sizeof ran);
  is_string("y", ran, "  another entry stays");
  batch_free(&b);
  hvd__fastpath_destroy(f);
}

static void test_alone_vs_grouped(void) {
  hvd__fastpath_t *f = make(16);
  char ran[256], slow[256];
  batch_t b = {0};
  learn_group(f);
  add(&b, "g.0", single(HVD_FLOAT32, 4));
  round_(f, &b, ran, slow, sizeof ran);
  is_string("g.0", slow, "a cached member submitted alone: no hit");
  is_string("", ran, "  nothing from the cache");
  batch_free(&b);
  learn(f, "s.0", single(HVD_FLOAT32, 4), NULL, 0);
  add(&b, "s.0", member(0));
  b.r[0]->desc.group_n = 1;
  round_(f, &b, ran, slow, sizeof ran);
  is_string("s.0", slow, "a cached single collective in a group: no hit");
  batch_free(&b);
  hvd__fastpath_destroy(f);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  test_hit_in_order();
  test_late_rank();
  test_stale_member();
  test_evicted_member();
  test_alone_vs_grouped();
  return tap_mpi_finish();
}
