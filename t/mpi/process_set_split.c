/*
 * process_set_split.c - hvd_process_set_split and
 * hvd_process_set_split_node at np 1..4:
 *  - split by rank % 2: each rank's set holds the ranks of its color in
 *    world order; the ids follow the colors ascending after the sets
 *    made before, the same on every rank, and the next set's id follows
 *    them all; an allreduce and a broadcast (root counted in the set)
 *    inside each set, exact, beside a world allreduce of the same name;
 *  - colors that do not start at 0, with gaps, in reverse rank order
 *    (every rank alone), and DDP's new_subgroups(2), color rank / 2;
 *  - refusals on every rank with the rank named: a negative color on
 *    the last rank (-1, INT_MIN), out NULL on rank 0; no id is used up;
 *  - ranks that make different calls at once (a create beside a split,
 *    a split beside a split by node): every rank fails alike naming
 *    rank 0's call and the first rank whose call differs; no set, no id
 *    used up, and the world goes on;
 *  - split by node on one machine (every rank), then on nodes of two
 *    ranks simulated by HVD_HOSTNAME: the set is the node's ranks, its
 *    rank hvd_local_rank(), and an allreduce sums the node.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MAXR 8
static int rank, size;

static hvd_process_set_t *split(int color, const char *what) {
  hvd_process_set_t *ps = NULL;
  if (hvd_process_set_split(color, &ps) != HVD_SUCCESS)
    bail("%s: %s", what, hvd_last_error());
  return ps;
}

/* A set made now gets this id: the next free one. */
static int next_id(void) {
  hvd_process_set_t *ps = NULL;
  int ranks[MAXR];
  for (int r = 0; r < size; r++)
    ranks[r] = r;
  if (hvd_process_set_create(ranks, size, &ps) != HVD_SUCCESS)
    bail("next_id: %s", hvd_last_error());
  int id = hvd_process_set_id(ps);
  hvd_process_set_destroy(ps);
  return id;
}

/* The set's members are exactly the ranks r with color(r) == color(me),
 * in world order; my rank in it is my index among them. */
static void check_members(const hvd_process_set_t *ps, const int *color,
                          const char *what) {
  int n = 0, me = -1;
  for (int r = 0; r < size; r++)
    if (color[r] == color[rank]) {
      if (r == rank)
        me = n;
      n++;
    }
  is_int(n, hvd_process_set_size(ps), "%s: my set's size", what);
  is_int(me, hvd_process_set_rank(ps), "%s: my rank in it", what);
}

/* My set's id is base + 1 + the number of distinct colors below mine. */
static void check_id(const hvd_process_set_t *ps, const int *color, int base,
                     const char *what) {
  int below = 0;
  for (int c = 0; c < color[rank]; c++)
    for (int r = 0; r < size; r++)
      if (color[r] == c) {
        below++;
        break;
      }
  is_int(base + 1 + below, hvd_process_set_id(ps), "%s: my set's id", what);
}

/* Sums (world rank + 1) over my set, and broadcasts from its last member,
 * while the world sums the same name. */
static void check_collectives(const hvd_process_set_t *ps, const int *color,
                              const char *what) {
  double x = rank + 1, y = 0, w = rank + 1, wy = 0, want = 0;
  int last = -1;
  for (int r = 0; r < size; r++)
    if (color[r] == color[rank]) {
      want += r + 1;
      last = r;
    }
  int64_t one = 1;
  hvd_tensor_t tx = hvd_tensor_make(&x, HVD_FLOAT64, 1, &one);
  hvd_tensor_t ty = hvd_tensor_make(&y, HVD_FLOAT64, 1, &one);
  hvd_tensor_t tw = hvd_tensor_make(&w, HVD_FLOAT64, 1, &one);
  hvd_tensor_t twy = hvd_tensor_make(&wy, HVD_FLOAT64, 1, &one);
  hvd_request_t *rs = NULL, *rw = NULL;
  hvd_result_t a = hvd_ps_allreduce_async(ps, "s", &tx, &ty, HVD_SUM, 1, 1,
                                          &rs);
  hvd_result_t b = hvd_allreduce_async("s", &tw, &twy, HVD_SUM, 1, 1, &rw);
  ok(a == HVD_SUCCESS && b == HVD_SUCCESS && hvd_wait(rs) == HVD_SUCCESS &&
         hvd_wait(rw) == HVD_SUCCESS,
     "%s: allreduce 's' in my set and in the world", what);
  ok(y == want && wy == size * (size + 1) / 2.0,
     "%s: my set summed its ranks (%g, want %g), the world all", what, y,
     want);
  int32_t v = rank;
  hvd_tensor_t tv = hvd_tensor_make(&v, HVD_INT32, 1, &one);
  hvd_result_t rc =
      hvd_ps_broadcast(ps, "b", &tv, hvd_process_set_size(ps) - 1);
  ok(rc == HVD_SUCCESS && v == last,
     "%s: broadcast from my set's last member, world rank %d (got %d)", what,
     last, (int)v);
}

static void test_parity(void) {
  int color[MAXR], base = next_id();
  for (int r = 0; r < size; r++)
    color[r] = r % 2;
  hvd_process_set_t *ps = split(color[rank], "parity");
  check_members(ps, color, "rank % 2");
  check_id(ps, color, base, "rank % 2");
  check_collectives(ps, color, "rank % 2");
  is_int(base + (size > 1 ? 2 : 1) + 1, next_id(),
         "rank %% 2: the next set's id follows both");
  /* every rank agrees on every set's id */
  ok(hvdt_same_on_all_ranks(&base, sizeof base), "the same base everywhere");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "rank %% 2: destroyed");
}

static void test_colors(void) {
  int color[MAXR], base = next_id();
  for (int r = 0; r < size; r++)
    color[r] = 7 + 10 * (size - 1 - r); /* 37, 27, 17, 7 at np 4 */
  hvd_process_set_t *ps = split(color[rank], "alone");
  check_members(ps, color, "alone, colors reversed");
  is_int(base + size - rank, hvd_process_set_id(ps),
         "alone: the last rank's color is the lowest: its id the first");
  check_collectives(ps, color, "alone");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "alone: destroyed");

  base = next_id();
  for (int r = 0; r < size; r++)
    color[r] = r / 2; /* DDP's new_subgroups(2) */
  ps = split(color[rank], "pairs");
  check_members(ps, color, "rank / 2");
  check_id(ps, color, base, "rank / 2");
  check_collectives(ps, color, "rank / 2");
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "rank / 2: destroyed");
}

static void test_refusals(void) {
  char msg[160];
  int base = next_id();
  hvd_process_set_t *ps = (hvd_process_set_t *)&ps; /* overwritten */
  hvd_result_t rc = hvd_process_set_split(rank == size - 1 ? -1 : 0, &ps);
  snprintf(msg, sizeof msg,
           "hvd_process_set_split: rank %d passes color -1; colors are >= 0",
           size - 1);
  hvdt_refused(HVD_ERR_INVALID_ARG, rc, msg, "a negative color");
  ok(ps == NULL, "a negative color: no set");
  /* INT_MIN is a color like any other, not a sign of out NULL */
  rc = hvd_process_set_split(rank == size - 1 ? INT_MIN : 0, &ps);
  snprintf(msg, sizeof msg,
           "hvd_process_set_split: rank %d passes color -2147483648; colors "
           "are >= 0",
           size - 1);
  hvdt_refused(HVD_ERR_INVALID_ARG, rc, msg, "color INT_MIN");
  ok(ps == NULL, "color INT_MIN: no set");
  rc = hvd_process_set_split(0, rank == 0 ? NULL : &ps);
  hvdt_refused(HVD_ERR_INVALID_ARG, rc,
               "hvd_process_set_split: rank 0 passes out NULL", "out NULL");
  ok(ps == NULL, "out NULL: no set");
  is_int(base + 1, next_id(), "the refusals used up no id");
  hvd_shutdown();
  rc = hvd_process_set_split_node(&ps);
  hvdt_refused(HVD_ERR_NOT_INITIALIZED, rc,
               "hvd_process_set_split_node: hvd_init() has not been called",
               "before hvd_init");
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init again: %s", hvd_last_error());
}

/* Rank `odd` calls `other` (create, split or split by node), the
 * others call `mine`: every rank fails with HVD_ERR_MISMATCH, its own
 * call named first. */
enum { CREATE, SPLIT, SPLIT_NODE };
static const char *const call_name[] = {"hvd_process_set_create",
                                        "hvd_process_set_split",
                                        "hvd_process_set_split_node"};

static void mixed(int mine, int odd, int other, const char *what) {
  int all[MAXR], call = rank == odd ? other : mine;
  for (int r = 0; r < size; r++)
    all[r] = r;
  hvd_process_set_t *ps = (hvd_process_set_t *)&ps; /* overwritten */
  hvd_result_t rc = call == CREATE  ? hvd_process_set_create(all, size, &ps)
                    : call == SPLIT ? hvd_process_set_split(0, &ps)
                                    : hvd_process_set_split_node(&ps);
  char msg[200];
  snprintf(msg, sizeof msg, "%s: rank 0 calls %s but rank %d calls %s",
           call_name[call], call_name[odd == 0 ? other : mine],
           odd == 0 ? 1 : odd, call_name[odd == 0 ? mine : other]);
  hvdt_refused(HVD_ERR_MISMATCH, rc, msg, what);
  ok(ps == NULL, "%s: no set", what);
}

/* Ranks whose calls differ once waited in different collectives: at np 3
 * and 4 for ever, at np 2 with a wrong message and MPI_ERR_TRUNCATE. */
static void test_mixed_calls(void) {
  if (size < 2)
    return;
  int base = next_id();
  mixed(SPLIT, 0, CREATE, "rank 0 creates, the others split");
  mixed(SPLIT, size - 1, CREATE, "the last rank creates, the others split");
  mixed(CREATE, size - 1, SPLIT_NODE,
        "the last rank splits by node, the others create");
  mixed(SPLIT, 0, SPLIT_NODE, "rank 0 splits by node, the others by color");
  is_int(base + 1, next_id(), "the mixed calls used up no id");
  double x = 1, y = 0;
  int64_t one = 1;
  hvd_tensor_t tx = hvd_tensor_make(&x, HVD_FLOAT64, 1, &one);
  hvd_tensor_t ty = hvd_tensor_make(&y, HVD_FLOAT64, 1, &one);
  hvd_result_t rc = hvd_allreduce("after.mixed", &tx, &ty, HVD_SUM, 1, 1);
  ok(rc == HVD_SUCCESS && y == size, "the world goes on after them (sum %g)",
     y);
}

static void check_node(const char *what) {
  hvd_process_set_t *ps = NULL;
  hvd_result_t rc = hvd_process_set_split_node(&ps);
  if (!is_int(HVD_SUCCESS, rc, "%s: split by node", what))
    bail("split_node: %s", hvd_last_error());
  is_int(hvd_local_size(), hvd_process_set_size(ps), "%s: the node's size",
         what);
  is_int(hvd_local_rank(), hvd_process_set_rank(ps), "%s: my local rank",
         what);
  int color[MAXR], mine = rank - hvd_local_rank(); /* nodes hold runs */
  for (int r = 0; r < size; r++)
    color[r] = r >= mine && r < mine + hvd_local_size() ? 0 : 1;
  check_collectives(ps, color, what);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(ps), "%s: destroyed", what);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > MAXR)
    bail("at most %d ranks", MAXR);
  unsetenv("HVD_HOSTNAME");
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  test_parity();
  test_colors();
  test_refusals();
  test_mixed_calls();
  check_node("one machine");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");

  hvdt_init_nodes_of(2);
  is_int(size - rank / 2 * 2 < 2 ? 1 : 2, hvd_local_size(),
         "nodes of two: my node's size");
  check_node("nodes of two");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
