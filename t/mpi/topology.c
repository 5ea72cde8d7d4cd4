/*
 * topology.c - hvd_rank, hvd_size, local and cross ranks and sizes, and
 * hvd_is_homogeneous: on one machine, then with nodes simulated through
 * HVD_HOSTNAME (set per rank before hvd_init), then over a
 * sub-communicator with hvd_init_comm.
 *
 * Every layout is checked against a small model of the rules: local =
 * ranks with the same node name, numbered in rank order; cross = ranks
 * with the same local rank, numbered in node order (each node's lowest
 * rank), the same on every local rank; homogeneous = every node has as
 * many ranks. Run at 1 to 4 ranks.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvd_mpi.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MAX_RANKS 64

static int rank, size;

/* Sum over the ranks of the current hvd world of contrib. */
static void allreduce_sums(const char *name, int contrib, int want,
                           const char *what) {
  int32_t x[2] = {contrib, 2 * contrib}, y[2] = {-1, -1};
  int64_t shape[1] = {2};
  hvd_tensor_t s = hvd_tensor_make(x, HVD_INT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_INT32, 1, shape);
  hvd_result_t rc = hvd_allreduce(name, &s, &r, HVD_SUM, 1.0, 1.0);
  tap_note("rc %d: %s; y = {%d, %d}", rc, hvd_last_error(), (int)y[0],
           (int)y[1]);
  ok(rc == HVD_SUCCESS && y[0] == want && y[1] == 2 * want, "%s: allreduce",
     what);
}

/* Runs hvd with rank q on node[q] (HVD_HOSTNAME) and checks everything. */
static void check_layout(char node[][32], const char *layout) {
  struct hvdt_topo want = hvdt_topo_model(node, size, rank);
  if (setenv("HVD_HOSTNAME", node[rank], 1) != 0)
    bail("setenv failed");
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", layout))
    bail("hvd_init failed");
  hvdt_is_topo(&want, layout);
  allreduce_sums(layout, rank + 1, size * (size + 1) / 2, layout);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", layout);
}

int main(int argc, char **argv) {
  char node[MAX_RANKS][32];
  hvd_result_t rc;

  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (size > MAX_RANKS)
    bail("at most %d ranks", MAX_RANKS);

  /* One machine, HVD_HOSTNAME unset: everybody is local. */
  unsetenv("HVD_HOSTNAME");
  rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  {
    struct hvdt_topo one = {rank, size, rank, size, 0, 1, 1};
    hvdt_is_topo(&one, "one node");
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "one node: hvd_shutdown");
  is_int(-1, hvd_local_rank(), "hvd_local_rank is -1 after shutdown");

  /* Two nodes in blocks: ranks 0..ceil(size/2)-1 on nodeA, the rest on
   * nodeB. At 4 ranks homogeneous; at 3, nodeA has 2 ranks and nodeB 1. */
  for (int q = 0; q < size; q++)
    snprintf(node[q], 32, "%s", q < (size + 1) / 2 ? "nodeA" : "nodeB");
  check_layout(node, "blocks");
  if (size == 4) {
    /* The layouts of the brief, spelled out, in case the model is wrong. */
    struct hvdt_topo m = hvdt_topo_model(node, size, rank);
    ok(m.local_rank == rank % 2 && m.local_size == 2 &&
           m.cross_rank == rank / 2 && m.cross_size == 2 && m.homog == 1,
       "model: 4 ranks as 2 + 2");
  } else if (size == 3) {
    struct hvdt_topo m = hvdt_topo_model(node, size, rank);
    ok(m.homog == 0 && m.cross_size == (m.local_rank == 0 ? 2 : 1) &&
           m.local_size == (rank < 2 ? 2 : 1),
       "model: 3 ranks as 2 + 1");
  } else {
    skip(1, "the model is spelled out at 3 and 4 ranks");
  }

  /* Node names that sort against rank order: numbering is by rank. */
  for (int q = 0; q < size; q++)
    snprintf(node[q], 32, "%s", q < (size + 1) / 2 ? "zz-node" : "aa-node");
  check_layout(node, "blocks, names reversed");

  /* Interleaved: even ranks on one node, odd on the other, so the local
   * rank comes from the node, not from the rank order. */
  for (int q = 0; q < size; q++)
    snprintf(node[q], 32, "%s", q % 2 ? "nodeB" : "nodeA");
  check_layout(node, "interleaved");

  /* A mirror: ranks q and size-1-q on one node, so local rank 1's node
   * order (by the node's lowest rank) is not its rank order. */
  for (int q = 0; q < size; q++)
    snprintf(node[q], 32, "node%d", q < size - 1 - q ? q : size - 1 - q);
  check_layout(node, "mirror");
  if (size == 4) {
    struct hvdt_topo m = hvdt_topo_model(node, size, rank);
    ok(m.cross_rank == (rank == 0 || rank == 3 ? 0 : 1),
       "model: mirror A B B A, cross rank = the node's index");
  } else {
    skip(1, "the mirror is spelled out at 4 ranks");
  }

  /* One rank per node. */
  for (int q = 0; q < size; q++)
    snprintf(node[q], 32, "node%d", q);
  check_layout(node, "one rank per node");
  unsetenv("HVD_HOSTNAME");

  /* hvd_init_comm over two halves of MPI_COMM_WORLD. */
  if (size >= 2) {
    MPI_Comm half;
    int color = rank < (size + 1) / 2 ? 0 : 1;
    int first = color ? (size + 1) / 2 : 0;
    int n = color ? size / 2 : (size + 1) / 2;
    int want_sum = 0;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
    rc = hvd_init_comm(half);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "halves: hvd_init_comm");
    struct hvdt_topo want = {rank - first, n, rank - first, n, 0, 1, 1};
    hvdt_is_topo(&want, "halves");
    for (int q = first; q < first + n; q++)
      want_sum += q + 1;
    /* The same name in both halves: each sums only its own. */
    allreduce_sums("half", rank + 1, want_sum, "halves");
    is_int(HVD_SUCCESS, hvd_shutdown(), "halves: hvd_shutdown");
    MPI_Comm_free(&half);
  } else {
    skip(10, "hvd_init_comm over halves needs 2 ranks");
  }

  /* And the whole world once more afterwards. */
  rc = hvd_init();
  tap_note("%s", hvd_last_error());
  is_int(HVD_SUCCESS, rc, "world again: hvd_init");
  is_int(size, hvd_size(), "world again: hvd_size");
  allreduce_sums("world", rank + 1, size * (size + 1) / 2, "world again");
  is_int(HVD_SUCCESS, hvd_shutdown(), "world again: hvd_shutdown");
  return tap_mpi_finish();
}
