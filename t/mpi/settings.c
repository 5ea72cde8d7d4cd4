/*
 * settings.c - malformed HVD_* values make hvd_init fail, on every rank,
 * with HVD_ERR_INVALID_ARG and a message naming the variable and the
 * value; nothing is left initialised; once the variable is fixed (unset,
 * or set to a valid value) hvd_init works and so does an allreduce.
 *
 * Settings are read by hvd_init, so each case is setenv, hvd_init,
 * unsetenv (or fix), hvd_init, allreduce, hvd_shutdown. Run at 1 and 2
 * ranks (every rank sets the same values). And hvd_gpu_timing after
 * hvd_init in every build: "hvd was built without CUDA" without CUDA;
 * with it, the HVD_GPU_TIMING message when unset, all zero when 1. An
 * HVD_AUTOTUNE_LOG that rank 0 cannot open (HVD_ERR_IO everywhere); the
 * settings that must be equal on every rank, set on rank 0 alone; an
 * over-long HVD_HOSTNAME; a malformed value on one rank alone (every
 * rank fails, naming it); HVD_MPI_PRECONNECT differing or malformed on
 * one rank (every rank fails within HVD_STALL_SHUTDOWN_TIME, naming the
 * ranks and values, and hvd_init works after); hvd_init_comm(MPI_COMM_NULL); hvd_setting_info
 * and hvd_setting_check out of range.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "hvd_mpi.h"
#include "hvdtest.h"
#include "tap/tap.h"

static int rank, size;

/* An allreduce that must give the sum over ranks of rank + 1 + i. */
static void allreduce_works(const char *what) {
  static int seq;
  char name[32], why[200];
  int right;
  snprintf(name, sizeof name, "s.%d", seq++);
  hvd_result_t rc =
      hvdt_sum_allreduce(name, HVD_FLOAT32, 4, &right, why, sizeof why);
  tap_note("rc %d (%s); %s", rc, hvd_last_error(), why);
  ok(rc == HVD_SUCCESS && right, "%s: allreduce works", what);
}

/* var=value makes hvd_init fail with want_rc (named rc_name) and exactly
 * msg on every rank; then (with var set to fixed, or unset when fixed is
 * NULL) hvd_init works. */
static void bad_value_rc(const char *var, const char *value,
                         hvd_result_t want_rc, const char *rc_name,
                         const char *msg, const char *fixed) {
  char what[160];
  snprintf(what, sizeof what, "%s='%s'", var, value);
  setenv(var, value, 1);
  hvd_result_t rc = hvd_init();
  char seen[1024];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(want_rc, rc, "%s: hvd_init fails with %s", what, rc_name);
  is_string(msg, seen, "%s: message", what);
  is_int(0, hvd_is_initialized(), "%s: not initialised", what);
  is_int(-1, hvd_rank(), "%s: hvd_rank is -1", what);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  if (fixed != NULL)
    setenv(var, fixed, 1);
  else
    unsetenv(var);
  rc = hvd_init();
  tap_note("%s", hvd_last_error());
  snprintf(what, sizeof what, "%s then %s%s%s", var, fixed ? "'" : "unset",
           fixed ? fixed : "", fixed ? "'" : "");
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init works", what))
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", what);
  unsetenv(var);
}

/* var=value on rank 0 alone, the others at the default (shown as dflt):
 * hvd_init fails on every rank, naming rank 0's value and the others';
 * then, unset, hvd_init works. */
static void differs(const char *var, const char *value, const char *v0,
                    const char *dflt) {
  char want[1024], what[160];
  size_t at =
      (size_t)snprintf(want, sizeof want,
                       "%s must be equal on every rank: rank 0 %s vs", var, v0);
  for (int r = 1; r < size; r++)
    at += (size_t)snprintf(want + at, sizeof want - at, "%s rank %d %s",
                           r > 1 ? "," : "", r, dflt);
  snprintf(what, sizeof what, "%s='%s' on rank 0 alone", var, value);
  if (rank == 0)
    setenv(var, value, 1);
  hvd_result_t rc = hvd_init();
  char seen[1024];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: hvd_init fails on every rank", what);
  is_string(want, seen, "%s: message", what);
  is_int(0, hvd_is_initialized(), "%s: not initialised", what);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  unsetenv(var);
  rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s then unset: hvd_init works", var))
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s then unset: hvd_shutdown", var);
}

/* var=value on rank `bad` alone (valid elsewhere: settings are per rank):
 * hvd_init fails on every rank instead of hanging the others in it; rank
 * `bad` with its own message, the others naming it; then, unset, hvd_init
 * works. */
static void bad_on_one(int bad, const char *var, const char *value,
                       const char *msg) {
  char want[1024], what[160], seen[1024];
  snprintf(what, sizeof what, "%s='%s' on rank %d alone", var, value, bad);
  if (rank == bad) {
    setenv(var, value, 1);
    snprintf(want, sizeof want, "%s", msg);
  } else {
    snprintf(want, sizeof want, "hvd_init: rank %d: %s", bad, msg);
  }
  hvd_result_t rc = hvd_init();
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(HVD_ERR_INVALID_ARG, rc, "%s: hvd_init fails on every rank", what);
  is_string(want, seen, "%s: message", what);
  is_int(0, hvd_is_initialized(), "%s: not initialised", what);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  unsetenv(var);
  rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s then unset: hvd_init works", what))
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s then unset: hvd_shutdown", what);
}

/* HVD_MPI_PRECONNECT=value on rank `odd` alone (`others` elsewhere,
 * NULL: unset), with HVD_STALL_SHUTDOWN_TIME=1 on every rank: the ranks
 * that preconnect wait for the ones that do not, which wait in the
 * agreement (before: in a blocking allreduce, for ever). Every rank fails
 * within seconds with want_rc and want, or, on rank odd, odd_want (NULL:
 * want); then, unset, hvd_init works (nothing of the failed preconnect is
 * left on MPI_COMM_WORLD to match the new one's messages). */
static void preconnect_differs(int odd, const char *value, const char *others,
                               hvd_result_t want_rc, const char *want,
                               const char *odd_want) {
  char what[160], seen[1024];
  snprintf(what, sizeof what, "HVD_MPI_PRECONNECT='%s' on rank %d alone%s%s",
           value, odd, others ? ", the others " : "", others ? others : "");
  if (rank == odd)
    setenv("HVD_MPI_PRECONNECT", value, 1);
  else if (others != NULL)
    setenv("HVD_MPI_PRECONNECT", others, 1);
  setenv("HVD_STALL_SHUTDOWN_TIME", "1", 1);
  double t0 = MPI_Wtime();
  hvd_result_t rc = hvd_init();
  double took = MPI_Wtime() - t0;
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  is_int(want_rc, rc, "%s: hvd_init fails on every rank", what);
  is_string(rank == odd && odd_want != NULL ? odd_want : want, seen,
            "%s: message", what);
  ok(took < 10, "%s: within 10 s (%.1f s)", what, took);
  if (rc == HVD_SUCCESS)
    hvd_shutdown();
  unsetenv("HVD_MPI_PRECONNECT");
  unsetenv("HVD_STALL_SHUTDOWN_TIME");
  rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "%s then unset: hvd_init works", what))
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s then unset: hvd_shutdown", what);
}

static void bad_value(const char *var, const char *value, const char *msg,
                      const char *fixed) {
  bad_value_rc(var, value, HVD_ERR_INVALID_ARG, "HVD_ERR_INVALID_ARG", msg,
               fixed);
}

/* var=value is accepted. */
static void good_value(const char *var, const char *value) {
  char what[160];
  snprintf(what, sizeof what, "%s='%s'", var, value);
  setenv(var, value, 1);
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "%s: hvd_init works", what))
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", what);
  unsetenv(var);
}

/* hvd_gpu_timing after hvd_init with HVD_GPU_TIMING=timing (NULL: unset):
 * a build without CUDA refuses it either way; one with CUDA needs the
 * setting, and then counts no group for host collectives. */
static void test_gpu_timing(const char *timing) {
  hvd_gpu_timing_t t = {-1, -1, -1, -1, -1};
  const char *what =
      timing != NULL ? "HVD_GPU_TIMING=1" : "HVD_GPU_TIMING unset";
  if (timing != NULL)
    setenv("HVD_GPU_TIMING", timing, 1);
  if (hvd_init() != HVD_SUCCESS)
    bail("hvd_init: %s", hvd_last_error());
  allreduce_works(what);
  hvd_result_t rc = hvd_gpu_timing(&t, 0);
  char seen[1024];
  snprintf(seen, sizeof seen, "%s", hvd_last_error());
  if (!hvd_cuda_built()) {
    is_int(HVD_ERR_UNSUPPORTED, rc, "%s, no CUDA: hvd_gpu_timing fails", what);
    is_string("hvd_gpu_timing: hvd was built without CUDA", seen,
              "%s, no CUDA: message", what);
  } else if (timing == NULL) {
    is_int(HVD_ERR_INVALID_ARG, rc, "%s: hvd_gpu_timing fails", what);
    is_string("hvd_gpu_timing: HVD_GPU_TIMING is not set (1 turns device "
              "group timing on)",
              seen, "%s: message", what);
  } else {
    is_int(HVD_SUCCESS, rc, "%s: hvd_gpu_timing works", what);
    ok(t.groups == 0 && t.busy_s == 0 && t.idle_s == 0 && t.lag_s == 0 &&
           t.max_lag_s == 0,
       "%s: no device group (%lld), all zero", what, (long long)t.groups);
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "%s: hvd_shutdown", what);
  unsetenv("HVD_GPU_TIMING");
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();

  /* The three of the specification. */
  bad_value("HVD_FUSION_THRESHOLD", "abc",
            "HVD_FUSION_THRESHOLD='abc' is not a size (bytes, or with K, M, "
            "G, T)",
            NULL);
  bad_value("HVD_CYCLE_TIME", "-1",
            "HVD_CYCLE_TIME='-1' is out of range 0..10000", NULL);
  bad_value("HVD_LOG_LEVEL", "loud",
            "HVD_LOG_LEVEL='loud' is not one of trace, debug, info, warning, "
            "error",
            NULL);

  /* More of the same parsers: trailing junk, not finite, above the
   * maximum, and then valid values (fixed rather than unset). */
  bad_value("HVD_CHUNK_SIZE", "4096x",
            "HVD_CHUNK_SIZE='4096x' is not a size (bytes, or with K, M, G, T)",
            "4096");
  bad_value("HVD_CHUNK_SIZE", "1.3K",
            "HVD_CHUNK_SIZE='1.3K' is out of range 0..1000000000000 bytes "
            "(whole)",
            "4096");
  bad_value("HVD_FUSION_THRESHOLD", "2P",
            "HVD_FUSION_THRESHOLD='2P' is not a size (bytes, or with K, M, G, "
            "T)",
            NULL);
  bad_value("HVD_CYCLE_TIME", "nan", "HVD_CYCLE_TIME='nan' is not a number",
            "0.5");
  bad_value("HVD_CYCLE_TIME", "10001",
            "HVD_CYCLE_TIME='10001' is out of range 0..10000", "10000");
  bad_value("HVD_ENGINE_NICE", "20",
            "HVD_ENGINE_NICE='20' is out of range 0..19", "19");
  bad_value("HVD_HIERARCHICAL_ALLREDUCE", "2",
            "HVD_HIERARCHICAL_ALLREDUCE='2' is not 0 or 1", "0");
  bad_value("HVD_STALL_CHECK_TIME", "-0.5",
            "HVD_STALL_CHECK_TIME='-0.5' is out of range 0..1000000000", "0");

  /* The device settings (accepted, and checked, in every build). */
  bad_value("HVD_GPU_OPERATIONS", "gloo",
            "HVD_GPU_OPERATIONS='gloo' is not one of nccl, mpi", "mpi");
  bad_value("HVD_NCCL_TIMEOUT", "-1",
            "HVD_NCCL_TIMEOUT='-1' is out of range 0..1000000000", "0");
  bad_value("HVD_EXIT_GRACE_TIME", "4000",
            "HVD_EXIT_GRACE_TIME='4000' is out of range 0..3600", "10");
  bad_value("HVD_MPI_PRECONNECT", "-1",
            "HVD_MPI_PRECONNECT='-1' is out of range 0..65536", "0");
  bad_value("HVD_GPU_TIMING", "2", "HVD_GPU_TIMING='2' is not 0 or 1", "1");
  bad_value("HVD_CHECKPOINT_PIECE", "8",
            "HVD_CHECKPOINT_PIECE='8' is out of range 16..1000000000000 bytes "
            "(whole)",
            "16");
  /* A timeline's cap: 0 (none) or room for its TIMELINE_CAP event. */
  bad_value("HVD_TIMELINE_MAX_BYTES", "100",
            "HVD_TIMELINE_MAX_BYTES='100' is below the smallest limit, 512 "
            "bytes (0: no limit)",
            "512");
  bad_value("HVD_TIMELINE_MAX_BYTES", "1",
            "HVD_TIMELINE_MAX_BYTES='1' is below the smallest limit, 512 "
            "bytes (0: no limit)",
            "0");
  test_gpu_timing(NULL);
  test_gpu_timing("1");
  if (hvd_cuda_built() && !hvd_nccl_built())
    bad_value("HVD_GPU_OPERATIONS", "nccl",
              "HVD_GPU_OPERATIONS='nccl': this build has no NCCL (use mpi)",
              "MPI");
  else
    good_value("HVD_GPU_OPERATIONS", "NCCL");

  /* Ranks must agree on HVD_GPU_OPERATIONS (builds with NCCL: without,
   * every rank has mpi). */
  if (hvd_nccl_built() && size > 1)
    differs("HVD_GPU_OPERATIONS", "mpi", "mpi", "nccl");
  else
    skip(6, "ranks that differ on HVD_GPU_OPERATIONS: needs 2 ranks and "
            "a build with NCCL");

  /* Valid spellings: empty means unset; levels are case-insensitive. */
  good_value("HVD_FUSION_THRESHOLD", "");
  good_value("HVD_FUSION_THRESHOLD", "64M");
  good_value("HVD_FUSION_THRESHOLD", "1GiB");
  good_value("HVD_CHUNK_SIZE", "256k");
  good_value("HVD_LOG_LEVEL", "");
  good_value("HVD_LOG_LEVEL", "ERROR");
  good_value("HVD_CACHE_CAPACITY", "1e3");
  bad_value("HVD_ZERO_COPY", "yes", "HVD_ZERO_COPY='yes' is not 0 or 1", "0");
  bad_value("HVD_HOST_ARENA", "2", "HVD_HOST_ARENA='2' is not 0 or 1", "1");
  /* Settings that change what a rank sends must be equal on every rank
   * (before: wrong sums, a hang or a crash). */
  if (size > 1) {
    differs("HVD_FUSION_THRESHOLD", "1K", "1024", "134217728");
    differs("HVD_CHUNK_SIZE", "4096", "4096", "0");
    differs("HVD_CACHE_CAPACITY", "0", "0", "1024");
    differs("HVD_SHM_ALLREDUCE", "0", "0", "1");
    differs("HVD_CHECKPOINT_PIECE", "16", "16", "67108864");
  } else {
    skip(5 * 6, "settings that differ between ranks: needs 2 ranks");
  }

  /* A malformed value on one rank only: the others used to wait in
   * hvd_init for ever. The lowest failing rank is named. */
  if (size > 1) {
    bad_on_one(1, "HVD_CYCLE_TIME", "abc",
               "HVD_CYCLE_TIME='abc' is not a number");
    bad_on_one(size - 1, "HVD_ZERO_COPY", "0.5",
               "HVD_ZERO_COPY='0.5' is not 0 or 1");
  } else {
    skip(2 * 6, "a bad value on one rank: needs 2 ranks");
  }
  /* HVD_MPI_PRECONNECT differing, or malformed, on one rank: the ranks
   * that preconnect and the others wait for each other (before: those
   * that skipped it for ever); every rank names the ranks and values */
  if (size > 1) {
    char want[256];
    snprintf(want, sizeof want,
             "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 64 vs "
             "rank %d 0",
             size - 1);
    preconnect_differs(size - 1, "0", NULL, HVD_ERR_INVALID_ARG, want, NULL);
    snprintf(want, sizeof want,
             "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 0 vs "
             "rank 1 64%s",
             size > 2 ? ", rank 2 64" : "");
    preconnect_differs(0, "0", NULL, HVD_ERR_INVALID_ARG, want, NULL);
    /* equal decisions, different values: refused all the same */
    snprintf(want, sizeof want,
             "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 64 vs "
             "rank %d 32",
             size - 1);
    preconnect_differs(size - 1, "32", NULL, HVD_ERR_INVALID_ARG, want, NULL);
    snprintf(want, sizeof want,
             "hvd_init: rank %d: HVD_MPI_PRECONNECT='abc' is not a "
             "number",
             size - 1);
    preconnect_differs(size - 1, "abc", "0", HVD_ERR_INVALID_ARG, want,
                       "HVD_MPI_PRECONNECT='abc' is not a number");
  } else {
    skip(4 * 6, "HVD_MPI_PRECONNECT on one rank: needs 2 ranks");
  }
  /* MPI_Comm_rank(MPI_COMM_NULL) aborted the job */
  is_int(HVD_ERR_INVALID_ARG, hvd_init_comm(MPI_COMM_NULL),
         "hvd_init_comm(MPI_COMM_NULL): result");
  is_string("hvd_init_comm: comm is MPI_COMM_NULL; pass the communicator of "
            "the ranks that train together (MPI_COMM_WORLD, or one split "
            "from it)",
            hvd_last_error(), "hvd_init_comm(MPI_COMM_NULL): message");
  is_int(0, hvd_is_initialized(), "hvd_init_comm(MPI_COMM_NULL): no hvd");

  /* An autotune log rank 0 cannot open: every rank fails with its message
   * (the others used to start and wait for rank 0's engine forever). */
  setenv("HVD_AUTOTUNE", "1", 1);
  bad_value_rc("HVD_AUTOTUNE_LOG", "/nonexistent-hvd/at.csv", HVD_ERR_IO,
               "HVD_ERR_IO",
               "HVD_AUTOTUNE_LOG: cannot open '/nonexistent-hvd/at.csv': No "
               "such file or directory",
               NULL);
  unsetenv("HVD_AUTOTUNE");

  /* A host name of 256 characters, one more than fits; and the index
   * checks of the settings table's readers (at any time). */
  char host[258];
  memset(host, 'h', 256);
  host[256] = '\0';
  bad_value("HVD_HOSTNAME", host, "HVD_HOSTNAME is longer than 255 characters",
            "node1");
  unsetenv("HVD_HOSTNAME");
  int n = hvd_setting_count();
  char want[128];
  snprintf(want, sizeof want,
           "hvd_setting_info: index %d is out of range 0..%d", n, n - 1);
  is_int(HVD_ERR_INVALID_ARG, hvd_setting_info(n, NULL, NULL, NULL),
         "hvd_setting_info(count): result");
  is_string(want, hvd_last_error(), "hvd_setting_info(count): message");
  snprintf(want, sizeof want,
           "hvd_setting_check: index -1 is out of range 0..%d", n - 1);
  is_int(HVD_ERR_INVALID_ARG, hvd_setting_check(-1),
         "hvd_setting_check(-1): result");
  is_string(want, hvd_last_error(), "hvd_setting_check(-1): message");
  /* Last: it ends with HVD_NO_BIND unset, which binds ranks to GPUs. */
  bad_value("HVD_NO_BIND", "2", "HVD_NO_BIND='2' is not 0 or 1", "1");
  return tap_mpi_finish();
}
