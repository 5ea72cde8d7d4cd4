/*
 * settings.h - every HVD_* environment variable, read in one place
 * (settings.c holds the table: name, default, meaning).
 */
#ifndef HVD_BASE_SETTINGS_H
#define HVD_BASE_SETTINGS_H

#include <stdint.h>

#include "internal.h"

#define HVD__HOSTNAME_MAX 256

#define HVD__PATH_MAX 4096

typedef struct hvd__settings {
  int log_level;                      /* HVD_LOG_LEVEL */
  double cycle_time_ms;               /* HVD_CYCLE_TIME */
  char hostname[HVD__HOSTNAME_MAX];   /* HVD_HOSTNAME; "" when unset */
  int64_t fusion_threshold;           /* HVD_FUSION_THRESHOLD, bytes */
  int64_t chunk_size;                 /* HVD_CHUNK_SIZE, bytes; 0 = backend's */
  int cache_capacity;                 /* HVD_CACHE_CAPACITY */
  double stall_check_s;               /* HVD_STALL_CHECK_TIME; 0 = off */
  double stall_shutdown_s;            /* HVD_STALL_SHUTDOWN_TIME; 0 = never */
  int hierarchical;                   /* HVD_HIERARCHICAL_ALLREDUCE */
  char timeline[HVD__PATH_MAX];       /* HVD_TIMELINE; "" = off */
  int timeline_all_ranks;             /* HVD_TIMELINE_ALL_RANKS */
  int autotune;                       /* HVD_AUTOTUNE */
  char autotune_log[HVD__PATH_MAX];   /* HVD_AUTOTUNE_LOG; "" = none */
  int engine_nice;                    /* HVD_ENGINE_NICE */
  int shm_allreduce;                  /* HVD_SHM_ALLREDUCE */
  int no_bind;                        /* HVD_NO_BIND */
  int gpu_ops;                        /* HVD_GPU_OPERATIONS: HVD__GPU_OPS_* */
  double nccl_timeout_s;              /* HVD_NCCL_TIMEOUT; 0 = never */
} hvd__settings_t;

/* HVD_GPU_OPERATIONS: how device tensors are reduced. */
#define HVD__GPU_OPS_NCCL 0 /* NCCL (builds with NCCL) */
#define HVD__GPU_OPS_MPI 1  /* MPI through pinned host buffers */

/* One row of the table, for hvd-info and the README. */
typedef struct hvd__setting_info {
  const char *name;
  const char *default_value;
  const char *meaning;
} hvd__setting_info_t;

/* Reads every variable; a malformed value is HVD_ERR_INVALID_ARG with a
 * message naming the variable and the value. */
hvd_result_t hvd__settings_load(hvd__settings_t *s);

/* Logs the effective settings at info level. */
void hvd__settings_log(const hvd__settings_t *s);

/* The table, terminated by a row with a NULL name. */
const hvd__setting_info_t *hvd__settings_table(void);

#endif /* HVD_BASE_SETTINGS_H */
