/*
 * settings.h - every HVD_* environment variable, declared once in the
 * HVD__SETTINGS list below and read in one place (settings.c).
 */
#ifndef HVD_BASE_SETTINGS_H
#define HVD_BASE_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "internal.h"

#define HVD__HOSTNAME_MAX 256

#define HVD__PATH_MAX 4096

/* The smallest HVD_TIMELINE_MAX_BYTES but 0: room for the array's
 * brackets and its TIMELINE_CAP event (core/timeline.c's CAP_ROOM). */
#define HVD__TIMELINE_MIN_BYTES 512

/* Every HVD_* variable, declared once: X(NAME, shown default, field, kind,
 * default, min, max, meaning). The settings struct, the defaults, the
 * parsing (in this order), the info log line and hvd_setting_info are
 * generated from it (settings.c): adding a variable is one line here (and
 * the use of its field). Kinds:
 *   DOUBLE  a number in [min, max] ("%s='%s' is not a number" / "is out
 *           of range")
 *   INT64, INT  the same, truncated to the field's type
 *   BYTES   an INT64 that may end in K, M, G or T (powers of 1024)
 *   LIMIT   BYTES that are 0 (no limit) or at least min
 *   BOOL    0 or 1
 *   PATH, HOST  a string ("" when unset) of at most HVD__PATH_MAX-1 or
 *           HVD__HOSTNAME_MAX-1 bytes
 *   LEVEL   HVD_LOG_LEVEL's names (log.h); GPUOPS HVD_GPU_OPERATIONS's */
#define HVD__SETTINGS(X)                                                       \
  X(HVD_LOG_LEVEL, "warning", log_level, LEVEL, HVD__LOG_WARNING, 0, 0,        \
    "logging threshold: trace, debug, info, warning or error")                 \
  X(HVD_CYCLE_TIME, "1", cycle_time_ms, DOUBLE, 1.0, 0.0, 10000.0,             \
    "milliseconds between negotiation cycles when idle, doubling up to 16 "    \
    "times that while cycles stay idle (woken early by new work; with one "    \
    "rank, host work by a caller that waits)")                                 \
  X(HVD_HOSTNAME, "(unset)", hostname, HOST, 0, 0, 0,                          \
    "when set, ranks with equal values form one node (instead of shared "      \
    "memory); used to simulate several nodes on one machine")                  \
  X(HVD_FUSION_THRESHOLD, "134217728", fusion_threshold, BYTES, 128 << 20, 0,  \
    1e15,                                                                      \
    "bytes of allreduce tensors executed as one fused group (64M, 1G...); "    \
    "0 disables fusion; equal on every rank")                                  \
  X(HVD_CHUNK_SIZE, "0", chunk_size, BYTES, 0, 0, 1e12,                        \
    "bytes per pipelined chunk of a fused group (256K...); 0 = the "           \
    "backend's default (MPI: 262144); equal on every rank")                    \
  X(HVD_CACHE_CAPACITY, "1024", cache_capacity, INT, 1024, 0, 1 << 20,         \
    "collectives remembered by the response cache; 0 disables it; equal "      \
    "on every rank")                                                           \
  X(HVD_STALL_CHECK_TIME, "60", stall_check_s, DOUBLE, 60, 0, 1e9,             \
    "seconds a collective may wait for missing ranks before rank 0 "           \
    "names them; 0 disables the check")                                        \
  X(HVD_STALL_SHUTDOWN_TIME, "300", stall_shutdown_s, DOUBLE, 300, 0, 1e9,     \
    "seconds after which a stalled collective stops hvd on every rank "        \
    "with HVD_ERR_STALL; 0 = never")                                           \
  X(HVD_HIERARCHICAL_ALLREDUCE, "0", hierarchical, BOOL, 0, 0, 1,              \
    "1: allreduce within each node, across nodes among local roots, "          \
    "then broadcast within the node")                                          \
  X(HVD_TIMELINE, "(unset)", timeline, PATH, 0, 0, 0,                          \
    "path of a Chrome-trace/Perfetto JSON timeline written by rank 0")         \
  X(HVD_TIMELINE_ALL_RANKS, "0", timeline_all_ranks, BOOL, 0, 0, 1,            \
    "1: every rank writes its own timeline (rank inserted before the "         \
    "extension)")                                                              \
  X(HVD_TIMELINE_MAX_BYTES, "1073741824", timeline_max_bytes, LIMIT,           \
    (double)(1 << 30), HVD__TIMELINE_MIN_BYTES, 1e15,                          \
    "a timeline file stops at this size with a TIMELINE_CAP event "            \
    "(64M, 1G...; at least 512); 0 = no limit")                                \
  X(HVD_AUTOTUNE, "0", autotune, BOOL, 0, 0, 1,                                \
    "1: tune fusion threshold, chunk size and cycle time online")              \
  X(HVD_AUTOTUNE_LOG, "(unset)", autotune_log, PATH, 0, 0, 0,                  \
    "path of the autotuner's CSV log")                                         \
  X(HVD_ENGINE_NICE, "10", engine_nice, INT, 10, 0, 19,                        \
    "nice value added to hvd's thread (0..19) so that compute sharing "        \
    "its core keeps priority")                                                 \
  X(HVD_SHM_ALLREDUCE, "1", shm_allreduce, BOOL, 1, 0, 1,                      \
    "1: host allreduce within a node through a shared segment "                \
    "(MPI_Win_allocate_shared), MPI only between nodes; 0: MPI only; "         \
    "equal on every rank")                                                     \
  X(HVD_ZERO_COPY, "1", zero_copy, BOOL, 1, 0, 1,                              \
    "1: an allreduce whose tensors are hvd_alloc_host memory on every "        \
    "rank of the node reads the peers' tensors and writes their results in "   \
    "place (no copy through the shared segment); other tensors (malloc) "      \
    "the same way through cross-memory attach (process_vm_readv/writev) "      \
    "on one node where the kernel allows it (the log says which); 0: "         \
    "always through the segment")                                              \
  X(HVD_HOST_ARENA, "1", host_arena, BOOL, 1, 0, 1,                            \
    "1: hvd_alloc_host memory lives in a shared arena the node's ranks "       \
    "can read (4 KiB pages unless THP shmem is enabled); 0: private "          \
    "memory on transparent huge pages (read when first allocating)")           \
  X(HVD_NO_BIND, "0", no_bind, BOOL, 0, 0, 1,                                  \
    "1: hvd_init leaves the CUDA device alone; 0: it binds each rank to "      \
    "GPU local_rank % device count and fails if two local ranks share a "      \
    "GPU")                                                                     \
  X(HVD_GPU_SHARE, "0", gpu_share, BOOL, 0, 0, 1,                              \
    "1: local ranks may share a GPU (for tests and one-GPU development: "      \
    "correctness, not speed): binding does not refuse it, and each rank "      \
    "gets NCCL_HOSTID=<host>-hvd-rank<R> (unless NCCL_HOSTID is set) and "     \
    "NCCL_IB_DISABLE=1 (unless set), so that NCCL takes the ranks for "        \
    "separate hosts and talks over its socket transport")                      \
  X(HVD_GPU_OPERATIONS, "nccl", gpu_ops, GPUOPS, 0, 0, 0,                      \
    "device tensors: nccl (NCCL on hvd's own stream) or mpi (MPI "             \
    "through pinned host buffers, so several ranks may share a GPU); "         \
    "mpi in a CUDA build without NCCL; equal on every rank")                   \
  X(HVD_EXIT_GRACE_TIME, "10", exit_grace_s, DOUBLE, 10, 0, 3600,              \
    "after hvd stopped on a failure: seconds the exiting ranks wait for "      \
    "each other (to finish what they save) before MPI_Abort ends the job"      \
    " without the ranks that never came")                                      \
  X(HVD_MPI_PRECONNECT, "64", preconnect, INT, 64, 0, 65536,                   \
    "in jobs of at most this many ranks, hvd_init first connects every "       \
    "pair of ranks in one order, the lower rank first (a byte each way, "      \
    "tag 0x4850 on the communicator given), so that no two ranks connect "     \
    "to each other at once later: Open MPI 4.1's TCP transport can then "      \
    "leave a message unread (doc/slurm.md); must be equal on every rank "      \
    "(else hvd_init fails on every rank naming the values, within "            \
    "HVD_STALL_SHUTDOWN_TIME); 0 = never")                                     \
  X(HVD_START_FILE, "(unset)", start_file, PATH, 0, 0, 0,                      \
    "a file rank 0 creates once every rank has passed hvd_init (set by "       \
    "hvdrun --start-timeout, which waits for it)")                             \
  X(HVD_END_DIR, "(unset)", end_dir, PATH, 0, 0, 0,                            \
    "a directory where each rank keeps rank.R, its own account of how it "     \
    "ended (exit status, signal, hvd's fatal error); set by hvdrun, which "    \
    "reads them to say which rank failed (lib/base/end_record.h)")             \
  X(HVD_NCCL_TIMEOUT, "300", nccl_timeout_s, DOUBLE, 300, 0, 1e9,              \
    "seconds a device collective (and NCCL's init, first-use "                 \
    "connections and finalize) may wait for NCCL before the "                  \
    "communicator is aborted and the collective fails with "                   \
    "HVD_ERR_NCCL; 0 = never")                                                 \
  X(HVD_GPU_TIMING, "0", gpu_timing, BOOL, 0, 0, 1,                            \
    "1: time every device group with CUDA events (hvd_gpu_timing); costs "     \
    "a few events per group")                                                  \
  X(HVD_CHECKPOINT_PIECE, "67108864", checkpoint_piece, BYTES, 64 << 20, 16,   \
    1e12,                                                                      \
    "bytes of a checkpoint that hvd_checkpoint_load sends per broadcast "      \
    "(rounded down to a multiple of 16): the most of the file that a rank "    \
    "other than 0 holds at once; equal on every rank")

/* The C type of each kind's field. */
#define HVD__SETTING_FIELD_LEVEL(f) int f
#define HVD__SETTING_FIELD_DOUBLE(f) double f
#define HVD__SETTING_FIELD_INT64(f) int64_t f
#define HVD__SETTING_FIELD_BYTES(f) int64_t f /* K, M, G, T suffixes */
#define HVD__SETTING_FIELD_LIMIT(f) int64_t f /* BYTES, 0: no limit */
#define HVD__SETTING_FIELD_INT(f) int f
#define HVD__SETTING_FIELD_BOOL(f) int f
#define HVD__SETTING_FIELD_PATH(f) char f[HVD__PATH_MAX]
#define HVD__SETTING_FIELD_HOST(f) char f[HVD__HOSTNAME_MAX]
#define HVD__SETTING_FIELD_GPUOPS(f) int f /* HVD__GPU_OPS_* */

/* Every variable's value, a field per row of HVD__SETTINGS. */
typedef struct hvd__settings {
#define HVD__SETTING_DECLARE(name, shown, field, kind, def, lo, hi, meaning)   \
  HVD__SETTING_FIELD_##kind(field);
  HVD__SETTINGS(HVD__SETTING_DECLARE)
#undef HVD__SETTING_DECLARE
} hvd__settings_t;

/* HVD_GPU_OPERATIONS: how device tensors are reduced. */
#define HVD__GPU_OPS_NCCL 0 /* NCCL (builds with NCCL) */
#define HVD__GPU_OPS_MPI 1  /* MPI through pinned host buffers */

/* Reads every variable; a malformed value is HVD_ERR_INVALID_ARG with a
 * message naming the (first) variable and the value, its field left at
 * the default. The good values are read even then: hvd_init still
 * connects the ranks with them (HVD_MPI_PRECONNECT, the stall times)
 * before they agree to fail. */
hvd_result_t hvd__settings_load(hvd__settings_t *s);

/* BOOL setting `name` read as hvd__settings_load reads it, for code that
 * needs it without hvd_init (hvd_alloc_host: HVD_HOST_ARENA), so that a
 * value means one thing everywhere: its default when unset, or when
 * malformed (which hvd_init refuses), with the reason in why[0..n) (""
 * otherwise). The thread's last error is left as it was. */
int hvd__setting_bool(const char *name, char *why, size_t n);

/* Logs the effective settings at info level. */
void hvd__settings_log(const hvd__settings_t *s);

/* Logs a warning for every HVD_* name in the environment that is not an
 * hvd variable (the nearest one named) and every HOROVOD_* one (hvd's
 * equivalent named): hvd_setting_unknown's messages. */
void hvd__settings_warn_unknown(void);

#endif /* HVD_BASE_SETTINGS_H */
