/*
 * engine_int.h - the engine's state, shared by its files: engine.c (the
 * cycle loop), engine_life.c (start, commands, stop), engine_submit.c,
 * engine_timeline.c and execute.c (running agreed collectives: fusion
 * groups, joined ranks' stubs, completion). Nothing outside
 * lib/core/engine*.c and execute.c includes it.
 */
#ifndef HVD_CORE_ENGINE_INT_H
#define HVD_CORE_ENGINE_INT_H

#include <pthread.h>

#include "base/errors.h"
#include "base/table.h"
#include "core/autotune.h"
#include "core/controller.h"
#include "core/engine.h"
#include "core/fastpath.h"
#include "core/queue.h"
#include "core/timeline.h"

#define HVD__MAX_EXECUTORS 8

/* A device group left in flight (asynchronous completion): its requests,
 * completed when its executor's reap says it has ended. */
#define HVD__MAX_FLIGHTS 16
typedef struct hvd__flight {
  hvd_request_t **reqs;
  int m;
  int which; /* its executor */
  int coll;
  double t0; /* when it started (timeline) */
} hvd__flight_t;

struct hvd__engine {
  hvd__exec_env_t env;
  hvd__settings_t settings;
  pthread_t thread;

  /* guarded by mu */
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* wakes the engine thread */
  int poked;          /* a caller started blocking in hvd_wait */
  int defer;          /* one rank: host work waits for a caller or the cycle */
  int urgent;         /* the queue holds work that should start now */
  hvd__queue_t queue; /* submitted, not yet taken by a cycle */
  hvd__table_t *inflight; /* name -> request, from submit to completion */
  int stop_requested;     /* 0, or why: HVD__STOP_BY_* (message.h) */
  int gate; /* the world's thread waits at 0: 1 run, -1 end (its start
              failed on some rank, engine_life.c start_thread) */
  int stopped;
  hvd_result_t stop_rc;
  char stop_reason[HVD__ERRMSG_MAX];
  hvd__burst_t burst; /* autotune's accounting (start under mu) */
  /* hvd_timeline_start/stop: a command for the engine thread, its result */
  int tl_cmd; /* 0 none, 1 start tl_path, 2 stop */
  char tl_path[HVD__PATH_MAX];
  unsigned tl_gen; /* commands done */
  hvd_result_t tl_rc;
  char tl_msg[HVD__ERRMSG_MAX];
  pthread_cond_t tl_cv;
  /* e->tl changes on the engine thread only, under tl_mu, which the
   * program's marks take to write into it */
  pthread_mutex_t tl_mu;
  /* process sets: the world's engine thread drives every set's engine
   * (they have no thread), so that every communicator's collectives and
   * device launches are issued in one order on every rank */
  hvd__engine_t *driver; /* a set's engine: the world's; the world's: NULL */
  int set_work;          /* the world's: a set's engine has something new */
  int ended;             /* a set's: its loop ended, it left the driver (cv) */
  /* hvd__engine_command: run on the engine thread in the cycle in which
   * every rank has one; waiters sleep on tl_cv */
  hvd__engine_cmd_t cmd;
  int cmd_pending;
  double cmd_since; /* when it was posted */
  unsigned cmd_gen; /* commands done */
  hvd_result_t cmd_rc;
  char cmd_msg[HVD__ERRMSG_MAX];

  /* engine thread only */
  hvd__engine_t **sets; /* the world's: the sets' engines, by creation */
  int nsets;
  size_t sets_bytes;
  int world_done; /* the world agreed to shut down; its sets still run */
  /* a command some rank has not posted: its stall times (rank 0's, as
   * the stall inspector's are, learnt at the engine's start) and whether
   * the warning was given (engine_command.c) */
  double cmd_check_s, cmd_shutdown_s;
  int cmd_warned;
  int64_t *cmd_rows;         /* the commands' exchanges: a row of each rank's */
#define HVD__CMD_STALL_ROW 6 /* int64 a rank in a command's stall exchange */
  hvd__controller_t *ctl;
  void *exec_state[HVD__MAX_EXECUTORS];
  int joined;            /* this rank has a join in flight */
  int failed;            /* the engine stopped on an error, not agreement */
  hvd__queue_t slow;     /* waiting for the coordinator */
  hvd_request_t **fresh; /* array form of `slow` for the controller */
  int fresh_cap;
  hvd__fastpath_t *fast; /* the response cache and its vector */
  /* a group's requests and allgather rows for its work, group_cap of
   * each: the same cap on every rank (execute.c, group_room) */
  hvd_request_t **group;
  const int64_t **group_dims;
  int group_cap;
  /* autotune: rank 0 decides; every rank applies what the vector says */
  hvd__autotune_t *tune; /* rank 0 only */
  int tuning;            /* some rank autotunes: the vector carries params */
  hvd__tune_params_t params;
  double cycle_s;
  /* timeline */
  double epoch;        /* aligned clock zero: leaving a barrier at start */
  int timeline_any;    /* some rank writes a timeline: gather ready times */
  hvd__timeline_t *tl; /* this rank's file, or NULL (see tl_mu) */
  long cycles;
  /* device groups in flight, oldest first: flights[(fl_head + k) %
   * HVD__MAX_FLIGHTS] for k < fl_n */
  hvd__flight_t flights[HVD__MAX_FLIGHTS];
  int fl_head, fl_n;
};

/* The execution span of r on its tensor's track, with its bytes, dtype
 * and the number of tensors run with it (the fused group); the executors'
 * trace hook (env.trace) is the same. Engine thread. */
/* engine_timeline.c: the timeline opened at the engine's start, a
 * hvd_timeline_start (cmd 1, path) or stop (2) done on the engine thread
 * between cycles, and the spans the executors report. */
hvd_result_t hvd__engine_start_timeline(hvd__engine_t *e);
void hvd__engine_timeline_command(hvd__engine_t *e, int cmd, const char *path);
void hvd__engine_trace_span(hvd__engine_t *e, const hvd_request_t *r,
                            const char *phase, double t0, double t1);
void hvd__engine_trace_hook(void *ctx, const hvd_request_t *r,
                            const char *phase, double t0, double t1);

/* engine_command.c, on the engine thread: runs the command every rank
 * has (the flags said so); whether this rank's command has waited past a
 * stall time (the fast path's CMDWAIT); and, when some rank said so, the
 * exchange in which every rank tells whether it has one (has) and for how
 * long: rank 0 warns past HVD_STALL_CHECK_TIME, naming the ranks that have
 * none, and past HVD_STALL_SHUTDOWN_TIME every rank stops (HVD_ERR_STALL);
 * returns 1 when e stopped. */
void hvd__engine_run_command(hvd__engine_t *e);
int hvd__engine_command_overdue(const hvd__engine_t *e);
int hvd__engine_command_stall(hvd__engine_t *e, int has);

/* How a list of responses ends the loop, if it does: the first shutdown
 * or stall response in the list decides. */
typedef enum hvd__stop_kind {
  HVD__RUN_ON,        /* no stop */
  HVD__STOP_SHUTDOWN, /* every rank agreed to stop: rank asked first */
  HVD__STOP_STALL     /* the stall inspector stopped hvd (done already) */
} hvd__stop_kind_t;

typedef struct hvd__stop {
  hvd__stop_kind_t kind;
  int rank;        /* HVD__STOP_SHUTDOWN: the rank that asked first */
  int by_shutdown; /* ... with hvd_shutdown (not a set's destroy) */
} hvd__stop_t;

/* execute.c: runs the agreed responses in order, fusing runs of
 * compatible allreduces up to HVD_FUSION_THRESHOLD bytes, and completes
 * their requests; `learn`: cache what ran (coordinator-agreed lists). */
hvd__stop_t hvd__engine_execute(hvd__engine_t *e, hvd__response_t *xs, int n,
                                int learn, double agreed);

/* execute.c: stops the engine for good: every request still in flight
 * completes with rc and "<label>: <in_flight_msg>"; later submissions get
 * "<label>: <reason>". */
void hvd__engine_stop_all(hvd__engine_t *e, hvd_result_t rc, const char *reason,
                          const char *in_flight_msg);

/* execute.c: the engine failed (rc, message set): stops it as above with
 * "hvd's engine failed: <message>". */
void hvd__engine_fail(hvd__engine_t *e, hvd_result_t rc);

/* A set's engine (e->driver set) has new work or a stop request: wakes
 * the world's engine thread, which drives it. Called without e->mu. */
void hvd__engine_wake_driver(hvd__engine_t *e);

/* engine.c: the engine thread's loop (arg: the world's engine). */
void *hvd__engine_main(void *arg);

/* execute.c: completes the device groups in flight in e that have ended
 * (all of them, waiting, with `wait`); 1 when one completed. */
int hvd__engine_reap(hvd__engine_t *e, int wait);

/* execute.c: hvd__exec_env_t's quiesce: every group in flight, in the
 * world's engine and in every set it drives, completes (ctx: an engine). */
void hvd__engine_quiesce(void *ctx);

/* execute.c: closes every executor; `collective` as hvd__executor_t's
 * close says. */
void hvd__engine_close_executors(hvd__engine_t *e, int collective);

#endif /* HVD_CORE_ENGINE_INT_H */
