/*
 * cluster_check.c - hvd across hosts: run by t/mpi/cluster.sh on the test
 * cluster of t/util/cluster.sh, where every host is a network namespace
 * with its own host name and Open MPI reaches other hosts only over TCP.
 * Not a make-check program of its own (it needs that cluster).
 *
 * Under each of three allreduce paths, set before hvd_init:
 *   default        shared memory within a node, then MPI across nodes
 *                  (where every node has as many ranks, more than one);
 *   hierarchical   HVD_SHM_ALLREDUCE=0 HVD_HIERARCHICAL_ALLREDUCE=1;
 *   flat           HVD_SHM_ALLREDUCE=0;
 * it checks
 *   - hvd_rank ... hvd_is_homogeneous against the model of the layout
 *     (hvdt_topo_model) over the host names the ranks really have
 *     (gethostname, gathered with MPI, not through hvd);
 *   - a burst of allreduces (float32, float64, float16, int32 x every op
 *     x a scalar, [7], [3000] and three of [100000], in and out of place,
 *     prescale and postscale on floats; HVD_CHUNK_SIZE=4096 so that
 *     every large tensor is many pieces), then again in another order on
 *     every rank (through the response cache): every element exact.
 * Which path hvd took is its info log's "allreduce path:" line, which the
 * script reads from stderr (HVD_LOG_LEVEL=info).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define NJOBS 160

static int R, P;
static struct hvdt_ar specs[NJOBS], jobs[NJOBS];

/* One burst in order (round 0) or shuffled per rank (round 1); the
 * number of wrong results, the first described in why. */
static int run_round(int n, int round, char *why, size_t len) {
  hvdt_burst_submit(jobs, specs, n, round, 977u * (unsigned)R + 1u,
                    round * 1000);
  int bad = 0;
  why[0] = '\0';
  for (int k = 0; k < n; k++)
    hvdt_ar_wait(&jobs[k]);
  for (int k = 0; k < n; k++) {
    char w[600] = "";
    if (!hvdt_ar_check(&jobs[k], hvdt_burst_value, P, w, sizeof w) &&
        bad++ == 0)
      snprintf(why, len, "%s", w);
    hvdt_ar_free(&jobs[k]);
  }
  return bad;
}

static void run_mode(const char *mode, char node[][32]) {
  static const int64_t sizes[3] = {1, 7, 3000};
  char why[700];
  int n = hvdt_burst(specs, "c", sizes, 3, 5, 3, 100000);
  if (n > NJOBS)
    bail("%d jobs, room for %d", n, NJOBS);
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init", mode))
    bail("hvd_init: %s", hvd_last_error());
  struct hvdt_topo want = hvdt_topo_model(node, P, R);
  hvdt_is_topo(&want, mode);
  for (int round = 0; round < 2; round++) {
    int bad = run_round(n, round, why, sizeof why);
    if (bad)
      tap_note("%d of %d wrong; first: %s", bad, n, why);
    ok(bad == 0, "%s: %s: %d allreduces exact", mode,
       round ? "again, shuffled per rank (cached)" : "burst", n);
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", mode);
}

int main(int argc, char **argv) {
  char node[64][32], me[32] = "";
  tap_mpi_init(&argc, &argv);
  R = tap_rank();
  P = tap_size();
  if (P > 64)
    bail("at most 64 ranks");
  if (getenv("HVD_HOSTNAME") != NULL)
    bail("HVD_HOSTNAME is set: the hosts must name themselves");
  gethostname(me, sizeof me - 1);
  MPI_Allgather(me, 32, MPI_CHAR, node, 32, MPI_CHAR, MPI_COMM_WORLD);
  for (int q = 0; q < P; q++)
    tap_note("rank %d on %s", q, node[q]);
  setenv("HVD_CHUNK_SIZE", "4096", 1);

  run_mode("default", node);
  setenv("HVD_SHM_ALLREDUCE", "0", 1);
  setenv("HVD_HIERARCHICAL_ALLREDUCE", "1", 1);
  run_mode("hierarchical", node);
  setenv("HVD_HIERARCHICAL_ALLREDUCE", "0", 1);
  run_mode("flat", node);
  return tap_mpi_finish();
}
