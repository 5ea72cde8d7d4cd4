/*
 * engine.h - the background engine: a request queue and the one thread
 * that talks to MPI. Callers submit; the thread negotiates each cycle
 * (controller.c) and executes the agreed responses (lib/ops).
 */
#ifndef HVD_CORE_ENGINE_H
#define HVD_CORE_ENGINE_H

#include <mpi.h>
#include <stdint.h>

#include "base/settings.h"
#include "core/message.h"
#include "core/request.h"
#include "ops/executor.h"

typedef struct hvd__engine hvd__engine_t;

/* Opens the executors and starts the thread over env's communicators
 * (borrowed; they must outlive the engine). Called with no other thread
 * using them. */
hvd_result_t hvd__engine_start(const hvd__exec_env_t *env,
                               const hvd__settings_t *s, hvd__engine_t **out);

/* A process set's engine, driven by `world`'s thread (no thread of its
 * own): called on world's engine thread only, inside a command
 * (hvd__engine_command), so that every member opens its communicators at
 * the same point of the world's order. */
hvd_result_t hvd__engine_start_set(hvd__engine_t *world,
                                   const hvd__exec_env_t *env,
                                   const hvd__settings_t *s,
                                   hvd__engine_t **out);

/* A collective step for the engine thread: cmd->fn runs there, between
 * collectives, in the first cycle in which every rank of e has a command
 * waiting (the fast path's CMD/NOCMD flags), so that the MPI and NCCL
 * calls it makes meet at the same point of every rank's order. Every
 * command starts with one exchange of the same size on every rank: each
 * rank's kind and args (HVD__CMD_ROW int64 a rank). Ranks whose kinds
 * differ (one creates a set, another splits) all fail alike, with
 * HVD_ERR_MISMATCH "<fn>: rank 0 calls X but rank R calls Y"; else fn
 * gets every rank's row (all[HVD__CMD_ROW * r + 1 + i]: rank r's args[i]).
 * A command that some rank has not posted after HVD_STALL_CHECK_TIME is
 * logged, naming those ranks, and after HVD_STALL_SHUTDOWN_TIME stops
 * hvd on every rank (HVD_ERR_STALL), as the stall inspector does for a
 * collective. Blocks until it ran; returns its result (and message), or
 * "<fn>: <the engine's stop reason>". One at a time per engine. */
typedef enum hvd__cmd_kind {
  HVD__CMD_SET_CREATE = 1, /* hvd_process_set_create */
  HVD__CMD_SET_SPLIT,      /* hvd_process_set_split */
  HVD__CMD_SET_SPLIT_NODE  /* hvd_process_set_split_node */
} hvd__cmd_kind_t;
#define HVD__CMD_ARGS 5
#define HVD__CMD_ROW (1 + HVD__CMD_ARGS)
typedef struct hvd__engine_cmd {
  hvd__cmd_kind_t kind;
  int64_t args[HVD__CMD_ARGS];
  hvd_result_t (*fn)(void *arg, const int64_t *all);
  void *arg;
} hvd__engine_cmd_t;
hvd_result_t hvd__engine_command(hvd__engine_t *e,
                                 const hvd__engine_cmd_t *cmd);
/* The public function a command kind stands for. */
const char *hvd__cmd_name(int kind);

/* Asks every rank's engine to stop (in-flight requests complete with
 * HVD_ERR_SHUTDOWN), joins the thread (a set's: waits until the world's
 * thread has let it go) and frees the engine. Not on the engine thread.
 * why: HVD__STOP_BY_DESTROY (a process set's hvd_process_set_destroy) or
 * HVD__STOP_BY_SHUTDOWN (hvd_shutdown), which the other ranks' messages
 * name (message.h). */
void hvd__engine_stop(hvd__engine_t *e, int why);

/* Queues r. On success the engine owns r until it completes it; on
 * failure (duplicate name, engine stopped) the message is set and the
 * caller still owns r. */
hvd_result_t hvd__engine_submit(hvd__engine_t *e, hvd_request_t *r);

/* hvd_timeline_start (cmd 1, path) and hvd_timeline_stop (2): done by the
 * engine thread at its next cycle; returns when done, with its result. */
hvd_result_t hvd__engine_timeline(hvd__engine_t *e, int cmd, const char *path);
/* The program's mark (an instant on the USER track) or counter in this
 * rank's timeline, if it writes one. Any thread. */
void hvd__engine_timeline_mark(hvd__engine_t *e, const char *name, int counter,
                               double value);
/* n requests at once (a grouped collective): all queued in one critical
 * section, so one cycle takes them all, or none (the first error). */
/* After hvd__engine_submit_many failed on this thread: the index of the
 * member it refused (a name already in flight), or -1 when it refused them
 * all for a reason of the whole (shutting down, stopped). */
int hvd__engine_refused(void);
hvd_result_t hvd__engine_submit_many(hvd__engine_t *e, hvd_request_t *const *rs,
                                     int n);

#endif /* HVD_CORE_ENGINE_H */
