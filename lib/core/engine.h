/*
 * engine.h - the background engine: a request queue and the one thread
 * that talks to MPI. Callers submit; the thread negotiates each cycle
 * (controller.c) and executes the agreed responses (lib/ops).
 */
#ifndef HVD_CORE_ENGINE_H
#define HVD_CORE_ENGINE_H

#include <mpi.h>

#include "base/settings.h"
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

/* A collective step for the engine thread: fn(arg) runs there, between
 * collectives, in the first cycle in which every rank of e has a command
 * waiting (the fast path's CMD/NOCMD flags), so that the MPI and NCCL
 * calls it makes meet at the same point of every rank's order. Blocks
 * until it ran; returns its result (and message), or the engine's stop
 * error. One at a time per engine. */
typedef hvd_result_t (*hvd__engine_cmd_fn)(void *arg);
hvd_result_t hvd__engine_command(hvd__engine_t *e, hvd__engine_cmd_fn fn,
                                 void *arg);

/* Asks every rank's engine to stop (in-flight requests complete with
 * HVD_ERR_SHUTDOWN), joins the thread (a set's: waits until the world's
 * thread has let it go) and frees the engine. Not on the engine thread. */
void hvd__engine_stop(hvd__engine_t *e);

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
