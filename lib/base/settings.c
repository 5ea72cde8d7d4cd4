/* settings.c - the table of HVD_* variables and their parsers. */
#include "base/settings.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/errors.h"
#include "base/log.h"

static const hvd__setting_info_t table[] = {
    {"HVD_LOG_LEVEL", "warning",
     "logging threshold: trace, debug, info, warning or error"},
    {"HVD_CYCLE_TIME", "1",
     "milliseconds between negotiation cycles when idle (woken early by "
     "new work; with one rank, host work by a caller that waits)"},
    {"HVD_HOSTNAME", "(unset)",
     "when set, ranks with equal values form one node (instead of shared "
     "memory); used to simulate several nodes on one machine"},
    {"HVD_FUSION_THRESHOLD", "134217728",
     "bytes of allreduce tensors executed as one fused group; 0 disables "
     "fusion"},
    {"HVD_CHUNK_SIZE", "0",
     "bytes per pipelined chunk of a fused group; 0 = the backend's default "
     "(MPI: 262144)"},
    {"HVD_CACHE_CAPACITY", "1024",
     "collectives remembered by the response cache; 0 disables it"},
    {"HVD_STALL_CHECK_TIME", "60",
     "seconds a collective may wait for missing ranks before rank 0 names "
     "them; 0 disables the check"},
    {"HVD_STALL_SHUTDOWN_TIME", "300",
     "seconds after which a stalled collective stops hvd on every rank with "
     "HVD_ERR_STALL; 0 = never"},
    {"HVD_HIERARCHICAL_ALLREDUCE", "0",
     "1: allreduce within each node, across nodes among local roots, then "
     "broadcast within the node"},
    {"HVD_TIMELINE", "(unset)",
     "path of a Chrome-trace/Perfetto JSON timeline written by rank 0"},
    {"HVD_TIMELINE_ALL_RANKS", "0",
     "1: every rank writes its own timeline (rank inserted before the "
     "extension)"},
    {"HVD_AUTOTUNE", "0",
     "1: tune fusion threshold, chunk size and cycle time online"},
    {"HVD_AUTOTUNE_LOG", "(unset)", "path of the autotuner's CSV log"},
    {"HVD_ENGINE_NICE", "10",
     "nice value added to hvd's thread (0..19) so that compute sharing its "
     "core keeps priority"},
    {"HVD_SHM_ALLREDUCE", "1",
     "1: host allreduce within a node through a shared segment "
     "(MPI_Win_allocate_shared), MPI only between nodes; 0: MPI only"},
    {"HVD_NO_BIND", "0",
     "1: hvd_init leaves the CUDA device alone; 0: it binds each rank to GPU "
     "local_rank % device count and fails if two local ranks share a GPU"},
    {"HVD_GPU_OPERATIONS", "nccl",
     "device tensors: nccl (NCCL on hvd's own stream) or mpi (MPI through "
     "pinned host buffers, so several ranks may share a GPU); mpi in a CUDA "
     "build without NCCL"},
    {"HVD_NCCL_TIMEOUT", "300",
     "seconds a device collective (and NCCL's init, first-use connections "
     "and finalize) may wait for NCCL before the communicator is aborted "
     "and the collective fails with HVD_ERR_NCCL; 0 = never"},
    {NULL, NULL, NULL},
};

const hvd__setting_info_t *hvd__settings_table(void) { return table; }

int hvd_setting_count(void) {
  return (int)(sizeof table / sizeof table[0]) - 1; /* less the NULL row */
}

hvd_result_t hvd_setting_info(int i, const char **name,
                              const char **default_value,
                              const char **meaning) {
  if (i < 0 || i >= hvd_setting_count())
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_setting_info: index %d is out of range 0..%d", i,
                          hvd_setting_count() - 1);
  if (name != NULL)
    *name = table[i].name;
  if (default_value != NULL)
    *default_value = table[i].default_value;
  if (meaning != NULL)
    *meaning = table[i].meaning;
  return HVD_SUCCESS;
}

static hvd_result_t parse_path(const char *name, char *out, size_t n) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0')
    return HVD_SUCCESS;
  if (strlen(v) >= n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s is longer than %zu characters", name, n - 1);
  snprintf(out, n, "%s", v);
  return HVD_SUCCESS;
}

static hvd_result_t parse_double(const char *name, double min, double max,
                                 double *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0')
    return HVD_SUCCESS;
  char *end = NULL;
  errno = 0;
  double d = strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !isfinite(d))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is not a number", name,
                          v);
  if (d < min || d > max)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s='%s' is out of range %g..%g",
                          name, v, min, max);
  *out = d;
  return HVD_SUCCESS;
}

/* HVD_GPU_OPERATIONS: nccl or mpi (case-insensitive); nccl by default in
 * builds with NCCL, else mpi. nccl in a CUDA build without NCCL is an
 * error; in a build without CUDA the value is only checked for spelling
 * (there are no device tensors to route). */
static hvd_result_t parse_gpu_ops(int *out) {
  *out = hvd_nccl_built() ? HVD__GPU_OPS_NCCL : HVD__GPU_OPS_MPI;
  const char *v = getenv("HVD_GPU_OPERATIONS");
  if (v == NULL || *v == '\0')
    return HVD_SUCCESS;
  if (strcasecmp(v, "mpi") == 0) {
    *out = HVD__GPU_OPS_MPI;
    return HVD_SUCCESS;
  }
  if (strcasecmp(v, "nccl") != 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "HVD_GPU_OPERATIONS='%s' is not one of nccl, mpi", v);
  if (hvd_cuda_built() && !hvd_nccl_built())
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "HVD_GPU_OPERATIONS='%s': this build has no NCCL "
                          "(use mpi)",
                          v);
  if (hvd_nccl_built())
    *out = HVD__GPU_OPS_NCCL;
  return HVD_SUCCESS;
}

hvd_result_t hvd__settings_load(hvd__settings_t *s) {
  hvd_result_t rc;
  memset(s, 0, sizeof *s);
  s->log_level = HVD__LOG_WARNING;
  s->cycle_time_ms = 1.0;

  const char *v = getenv("HVD_LOG_LEVEL");
  if (v != NULL && *v != '\0') {
    s->log_level = hvd__log_parse_level(v);
    if (s->log_level < 0)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "HVD_LOG_LEVEL='%s' is not one of trace, debug, "
                            "info, warning, error",
                            v);
  }
  s->fusion_threshold = (int64_t)128 << 20;
  s->cache_capacity = 1024;
  s->stall_check_s = 60;
  s->stall_shutdown_s = 300;
  s->engine_nice = 10;
  s->shm_allreduce = 1;
  s->nccl_timeout_s = 300;
  double d;
  HVD__CHECK(parse_double("HVD_CYCLE_TIME", 0.0, 10000.0, &s->cycle_time_ms));
  d = (double)s->fusion_threshold;
  HVD__CHECK(parse_double("HVD_FUSION_THRESHOLD", 0, 1e15, &d));
  s->fusion_threshold = (int64_t)d;
  d = 0;
  HVD__CHECK(parse_double("HVD_CHUNK_SIZE", 0, 1e12, &d));
  s->chunk_size = (int64_t)d;
  d = s->cache_capacity;
  HVD__CHECK(parse_double("HVD_CACHE_CAPACITY", 0, 1 << 20, &d));
  s->cache_capacity = (int)d;
  HVD__CHECK(parse_double("HVD_STALL_CHECK_TIME", 0, 1e9, &s->stall_check_s));
  HVD__CHECK(
      parse_double("HVD_STALL_SHUTDOWN_TIME", 0, 1e9, &s->stall_shutdown_s));
  d = 0;
  HVD__CHECK(parse_double("HVD_HIERARCHICAL_ALLREDUCE", 0, 1, &d));
  s->hierarchical = d != 0;
  HVD__CHECK(parse_path("HVD_TIMELINE", s->timeline, sizeof s->timeline));
  d = 0;
  HVD__CHECK(parse_double("HVD_TIMELINE_ALL_RANKS", 0, 1, &d));
  s->timeline_all_ranks = d != 0;
  d = 0;
  HVD__CHECK(parse_double("HVD_AUTOTUNE", 0, 1, &d));
  s->autotune = d != 0;
  HVD__CHECK(
      parse_path("HVD_AUTOTUNE_LOG", s->autotune_log, sizeof s->autotune_log));
  d = s->engine_nice;
  HVD__CHECK(parse_double("HVD_ENGINE_NICE", 0, 19, &d));
  s->engine_nice = (int)d;
  d = s->shm_allreduce;
  HVD__CHECK(parse_double("HVD_SHM_ALLREDUCE", 0, 1, &d));
  s->shm_allreduce = d != 0;
  d = 0;
  HVD__CHECK(parse_double("HVD_NO_BIND", 0, 1, &d));
  s->no_bind = d != 0;
  HVD__CHECK(parse_gpu_ops(&s->gpu_ops));
  HVD__CHECK(parse_double("HVD_NCCL_TIMEOUT", 0, 1e9, &s->nccl_timeout_s));
  v = getenv("HVD_HOSTNAME");
  if (v != NULL && *v != '\0') {
    if (strlen(v) >= sizeof s->hostname)
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "HVD_HOSTNAME is longer than %zu characters",
                            sizeof s->hostname - 1);
    snprintf(s->hostname, sizeof s->hostname, "%s", v);
  }
  return HVD_SUCCESS;
fail:
  return rc;
}

void hvd__settings_log(const hvd__settings_t *s) {
  HVD__LOG(HVD__LOG_INFO,
           "settings: HVD_LOG_LEVEL=%s HVD_CYCLE_TIME=%g HVD_HOSTNAME=%s "
           "HVD_FUSION_THRESHOLD=%lld HVD_CHUNK_SIZE=%lld "
           "HVD_CACHE_CAPACITY=%d HVD_STALL_CHECK_TIME=%g "
           "HVD_STALL_SHUTDOWN_TIME=%g HVD_HIERARCHICAL_ALLREDUCE=%d "
           "HVD_TIMELINE=%s HVD_TIMELINE_ALL_RANKS=%d HVD_AUTOTUNE=%d "
           "HVD_AUTOTUNE_LOG=%s HVD_ENGINE_NICE=%d HVD_SHM_ALLREDUCE=%d "
           "HVD_NO_BIND=%d HVD_GPU_OPERATIONS=%s HVD_NCCL_TIMEOUT=%g",
           hvd__log_level_name(s->log_level), s->cycle_time_ms,
           s->hostname[0] ? s->hostname : "(unset)",
           (long long)s->fusion_threshold, (long long)s->chunk_size,
           s->cache_capacity, s->stall_check_s, s->stall_shutdown_s,
           s->hierarchical, s->timeline[0] ? s->timeline : "(unset)",
           s->timeline_all_ranks, s->autotune,
           s->autotune_log[0] ? s->autotune_log : "(unset)", s->engine_nice,
           s->shm_allreduce, s->no_bind,
           s->gpu_ops == HVD__GPU_OPS_NCCL ? "nccl" : "mpi", s->nccl_timeout_s);
}
