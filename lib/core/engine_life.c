/*
 * engine_life.c - the engine's life: allocation, the collective setup of
 * its parts (agreed settings, timeline, autotune, negotiation,
 * executors), starting its thread (the world's) or joining the world's
 * driver (a process set's), the driver's wake-up, and stopping (engine
 * commands: engine_command.c). The loop the thread runs is engine.c's
 * hvd__engine_main.
 */
#include "core/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/tensor.h"
#include "base/wait.h"
#include "core/engine_int.h"

/* ---- lifecycle ---------------------------------------------------------- */

/* hvd__set_wake's callback: a caller blocked, so cycle now rather than at
 * the end of a back-off that assumed the core was the caller's. */
static void engine_poke(void *arg) {
  hvd__engine_t *e = arg;
  pthread_mutex_lock(&e->mu);
  e->poked = 1;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
}

static void engine_free(hvd__engine_t *e) {
  hvd__engine_close_executors(e, 0); /* open only after a failure */
  hvd__controller_destroy(e->ctl);
  hvd__table_destroy(e->inflight);
  hvd__fastpath_destroy(e->fast);
  hvd__timeline_close(e->tl);
  hvd__autotune_destroy(e->tune);
  free(e->group);
  free(e->group_dims);
  free(e->fresh);
  free(e->sets);
  free(e->cmd_rows);
  pthread_mutex_destroy(&e->mu);
  pthread_cond_destroy(&e->cv);
  pthread_mutex_destroy(&e->tl_mu);
  pthread_cond_destroy(&e->tl_cv);
  free(e);
}

/* The settings that every rank must give the same value: each changes
 * what a rank sends in a collective (which allreduces fuse, the chunks of
 * a fused group, the response cache's bits, the shared-memory path, a
 * checkpoint load's pieces, the device executor), so ranks that differ
 * would compute wrong sums or wait for each other forever. */
#define NAGREED 6

/* What each rank gives the engine's start: its NAGREED settings, then
 * what hierarchical allreduce is decided from (HVD_HIERARCHICAL_ALLREDUCE,
 * its local size, whether it is its node's first rank), then its stall
 * times in microseconds (rank 0's bound the engine commands' waits on
 * every rank, engine_command.c). */
#define NGATHERED (NAGREED + 5)

/* The start's buffer is kept for the engine commands' exchanges, so that
 * no rank can fail to allocate one while its peers make it; it is had
 * with the engine, before the start's first agreement (engine_open). */
_Static_assert(NGATHERED >= HVD__CMD_ROW && NGATHERED >= HVD__CMD_STALL_ROW,
               "the start's buffer holds a command exchange's rows");

static hvd__engine_t *engine_alloc(const hvd__exec_env_t *env,
                                   const hvd__settings_t *s) {
  hvd__engine_t *e = hvd__fault("engine") ? NULL : calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  e->cmd_rows = calloc((size_t)env->size * NGATHERED, sizeof *e->cmd_rows);
  if (e->cmd_rows == NULL) {
    free(e);
    return NULL;
  }
  pthread_mutex_init(&e->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&e->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&e->tl_mu, NULL);
  pthread_cond_init(&e->tl_cv, NULL);
  e->settings = *s;
  e->env = *env;
  /* With one rank a host collective has no peer to meet, so starting it
   * early gains nothing, while waking this thread for each submission costs
   * the caller's core a switch each time (bert_train tiny at np=1: 3 to 5%
   * of its step): host work waits for a caller to block in hvd_wait, or for
   * the next cycle. With peers, or on a GPU (whose work runs beside the
   * caller's), it starts at once. */
  e->defer = env->size == 1 && env->world_ranks == NULL; /* a set: no pokes */
  e->env.chunk_bytes = s->chunk_size;
  e->env.shm = s->shm_allreduce;
  e->env.zero_copy = s->zero_copy;
  e->env.gpu_ops = s->gpu_ops;
  e->env.nccl_timeout_s = s->nccl_timeout_s;
  e->env.gpu_timing = s->gpu_timing;
  e->env.quiesce = hvd__engine_quiesce;
  e->env.quiesce_ctx = e;
  e->cycle_s = s->cycle_time_ms / 1000.0;
  return e;
}

/* NAGREED's names, in the rows' order. */
static const char *const agreed_names[NAGREED] = {
    "HVD_FUSION_THRESHOLD", "HVD_CHUNK_SIZE",       "HVD_CACHE_CAPACITY",
    "HVD_SHM_ALLREDUCE",    "HVD_CHECKPOINT_PIECE", "HVD_GPU_OPERATIONS"};

/* Setting k's value x in words: HVD_GPU_OPERATIONS's name, else x. */
static void agreed_str(int k, int64_t x, char *buf, size_t n) {
  if (k == NAGREED - 1)
    snprintf(buf, n, "%s", x == HVD__GPU_OPS_MPI ? "mpi" : "nccl");
  else
    snprintf(buf, n, "%lld", (long long)x);
}

/* The ranks whose setting k differs from rank 0's, as "rank 0 V vs rank
 * 2 W, rank 3 W" (at most 8 listed, then ", and N more ranks"); 0 when
 * none does. all: every rank's NGATHERED values. */
static int agreed_differ(const hvd__exec_env_t *env, const int64_t *all, int k,
                         char *msg, size_t cap) {
  hvd__ranks_t l;
  char v[32], head[128];
  hvd__ranks_begin(&l);
  for (int r = 1; r < env->size; r++) {
    int64_t x = all[(size_t)r * NGATHERED + (size_t)k];
    if (x == all[k])
      continue;
    agreed_str(k, x, v, sizeof v);
    hvd__ranks_add(&l, hvd__env_world_rank(env, r), v);
  }
  agreed_str(k, all[k], v, sizeof v);
  snprintf(head, sizeof head, "%s must be equal on every rank: rank %d %s",
           agreed_names[k], hvd__env_world_rank(env, 0), v);
  return hvd__ranks_write(&l, head, msg, cap) > 0;
}

/* One MPI_Allgather of every rank's NGATHERED values: the agreed
 * settings compared with rank 0's (HVD_ERR_INVALID_ARG naming the first
 * that differs, its ranks and their values, on every rank), and
 * hierarchical allreduce decided for all ranks together, only where it
 * applies (a rank alone on its node must still take the three phases). */
static hvd_result_t agree(hvd__engine_t *e) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__settings_t *s = &e->settings;
  const hvd__exec_env_t *env = &e->env;
  int64_t mine[NGATHERED] = {s->fusion_threshold,
                             s->chunk_size,
                             s->cache_capacity,
                             s->shm_allreduce,
                             s->checkpoint_piece,
                             s->gpu_ops,
                             s->hierarchical,
                             env->local_size,
                             env->local_rank == 0,
                             (int64_t)(s->stall_check_s * 1e6),
                             (int64_t)(s->stall_shutdown_s * 1e6)},
          *all = e->cmd_rows;
  int64_t hier = 0, local = 0, roots = 0;
  char msg[HVD__ERRMSG_MAX];
  HVD__MPI_CHECK(MPI_Allgather(mine, NGATHERED, MPI_INT64_T, all, NGATHERED,
                               MPI_INT64_T, env->comm));
  for (int r = 0; r < env->size; r++) {
    const int64_t *x = all + (size_t)r * NGATHERED + NAGREED;
    hier |= x[0];
    local = x[1] > local ? x[1] : local;
    roots += x[2];
  }
  e->env.hierarchical = hier && local > 1 && roots > 1;
  e->cmd_check_s = (double)all[NAGREED + 3] / 1e6; /* rank 0's */
  e->cmd_shutdown_s = (double)all[NAGREED + 4] / 1e6;
  for (int k = 0; k < NAGREED && rc == HVD_SUCCESS; k++)
    if (agreed_differ(env, all, k, msg, sizeof msg))
      rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s", msg);
fail:
  return rc;
}

/* Autotune when any rank asks (the vector then carries rank 0's
 * parameters to all); rank 0 keeps the tuner, starting from the settings
 * (HVD_CHUNK_SIZE=0 stays 0: the executor's default, as untuned). Rank
 * 0's failure to make it (its HVD_AUTOTUNE_LOG cannot be opened, or no
 * memory) is every rank's, with its code and message: the others would
 * otherwise start engines that wait for rank 0's. */
static hvd_result_t start_autotune(hvd__engine_t *e) {
  hvd_result_t rc = HVD_SUCCESS;
  const hvd__settings_t *s = &e->settings;
  HVD__MPI_CHECK(MPI_Allreduce(&s->autotune, &e->tuning, 1, MPI_INT, MPI_MAX,
                               e->env.comm));
  if (!e->tuning)
    return HVD_SUCCESS;
  struct {
    int32_t rc;
    char msg[HVD__ERRMSG_MAX];
  } got = {HVD_SUCCESS, ""};
  if (e->env.rank == 0) {
    got.rc = hvd__autotune_create(s, &e->tune);
    if (got.rc == HVD_SUCCESS)
      hvd__autotune_record(e->tune, 0, 0, &e->params); /* first candidate */
    else
      snprintf(got.msg, sizeof got.msg, "%s", hvd_last_error());
  }
  HVD__MPI_CHECK(MPI_Bcast(&got, (int)sizeof got, MPI_BYTE, 0, e->env.comm));
  if (got.rc != HVD_SUCCESS)
    rc = hvd__set_error_msg((hvd_result_t)got.rc, got.msg);
fail:
  return rc;
}

/* The negotiation's parts: the in-flight table, the coordinator, the
 * response cache and its vector. */
static hvd_result_t start_negotiation(hvd__engine_t *e) {
  const hvd__settings_t *s = &e->settings;
  e->inflight = hvd__table_create_borrowing(); /* keys: the requests' names */
  e->ctl =
      hvd__controller_create(e->env.comm, e->env.rank, e->env.size, s,
                             e->timeline_any, e->epoch, e->env.world_ranks);
  if (e->inflight == NULL || e->ctl == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "engine");
  /* a hit waiting past the first of the stall inspector's times goes to
   * the coordinator, where the inspector sees it */
  double drop = s->stall_check_s;
  if (s->stall_shutdown_s > 0 && (drop <= 0 || s->stall_shutdown_s < drop))
    drop = s->stall_shutdown_s;
  hvd__fastpath_config_t fc = {e->env.comm, e->env.rank, s->cache_capacity,
                               e->tuning,   drop,        e->timeline_any,
                               e->env.size};
  e->fast = hvd__fastpath_create(&fc);
  return e->fast != NULL ? HVD_SUCCESS : HVD_ERR_NO_MEMORY;
}

/* The negotiation's and the executors' host memory is each rank's own
 * (a rank can lack it while its peers have it), and what follows each is
 * collective: so whether every rank has it is agreed first
 * (hvd__agree_ready), and a rank that has not fails every rank's start
 * with its words ("rank 1 could not allocate the engine's state; nothing
 * was exchanged") rather than leave them waiting in the next step. */
static hvd_result_t agree_had(const hvd__exec_env_t *env, int had,
                              const char *what) {
  hvd_result_t rc =
      had ? HVD_SUCCESS
          : hvd__set_error(HVD_ERR_NO_MEMORY, "could not allocate %s", what);
  return hvd__agree_ready(env, rc);
}

/* The engine's parts, collectively over env's communicators. `mine`:
 * what the caller's own steps came to (agreed with the engine's memory). */
static hvd_result_t engine_open(const hvd__exec_env_t *env,
                                const hvd__settings_t *s, hvd_result_t mine,
                                hvd__engine_t **out) {
  hvd_result_t rc;
  hvd__engine_t *e = engine_alloc(env, s);
  if (mine == HVD_SUCCESS && e == NULL)
    mine = hvd__set_error(HVD_ERR_NO_MEMORY,
                          "could not allocate the engine's state");
  HVD__CHECK(hvd__agree_ready(env, mine));
  HVD__CHECK(agree(e));
  HVD__CHECK(hvd__engine_start_timeline(e));
  HVD__CHECK(start_autotune(e));
  HVD__CHECK(agree_had(&e->env, start_negotiation(e) == HVD_SUCCESS,
                       "the engine's negotiation state"));
  for (int i = 0; hvd__executors[i] != NULL; i++)
    HVD__CHECK(hvd__executors[i]->open(&e->env, &e->exec_state[i]));
  *out = e;
  return HVD_SUCCESS;
fail:
  if (e != NULL)
    engine_free(e);
  return rc;
}

/* The thread's start, agreed: a rank whose pthread_create fails (a
 * process or thread limit) fails every rank's hvd_init alike, and the
 * threads that did start (held at their gate, engine.c) end unused. */
static hvd_result_t start_thread(hvd__engine_t *e) {
  int err = hvd__fault("thread")
                ? EAGAIN
                : pthread_create(&e->thread, NULL, hvd__engine_main, e);
  hvd_result_t rc = err == 0
                        ? HVD_SUCCESS
                        : hvd__set_error(HVD_ERR_SYSTEM,
                                         "could not start the engine's thread: "
                                         "pthread_create: %s",
                                         strerror(err));
  rc = hvd__agree_ready(&e->env, rc);
  if (err != 0)
    return rc;
  pthread_mutex_lock(&e->mu);
  e->gate = rc == HVD_SUCCESS ? 1 : -1;
  pthread_cond_broadcast(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (rc != HVD_SUCCESS)
    pthread_join(e->thread, NULL);
  return rc;
}

hvd_result_t hvd__engine_start(const hvd__exec_env_t *env,
                               const hvd__settings_t *s, hvd__engine_t **out) {
  hvd_result_t rc;
  hvd__engine_t *e = NULL;
  HVD__CHECK(engine_open(env, s, HVD_SUCCESS, &e));
  HVD__CHECK(start_thread(e));
  if (env->world_ranks == NULL) /* the world's engine: callers poke it */
    hvd__set_wake(engine_poke, e);
  *out = e;
  return HVD_SUCCESS;
fail:
  if (e != NULL)
    engine_free(e);
  return rc;
}

hvd_result_t hvd__engine_start_set(hvd__engine_t *world,
                                   const hvd__exec_env_t *env,
                                   const hvd__settings_t *s,
                                   hvd__engine_t **out) {
  hvd_result_t rc;
  hvd__engine_t *e = NULL;
  hvd_result_t room = hvd__grow(
      (void **)&world->sets, &world->sets_bytes,
      (size_t)(world->nsets + 1) * sizeof *world->sets, "process set engines");
  HVD__CHECK(engine_open(env, s, room, &e));
  e->driver = world;
  world->sets[world->nsets++] = e; /* this is world's thread */
  *out = e;
fail:
  return rc;
}

void hvd__engine_wake_driver(hvd__engine_t *e) {
  hvd__engine_t *w = e->driver;
  pthread_mutex_lock(&w->mu);
  w->set_work = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void hvd__engine_stop(hvd__engine_t *e, int why) {
  if (e == NULL)
    return;
  if (e->env.world_ranks == NULL) /* before e->mu: engine_poke locks nap,
                                     then mu */
    hvd__set_wake(NULL, NULL);
  pthread_mutex_lock(&e->mu);
  if (e->stop_requested == 0)
    e->stop_requested = why;
  pthread_cond_signal(&e->cv);
  pthread_mutex_unlock(&e->mu);
  if (e->driver == NULL) {
    pthread_join(e->thread, NULL);
  } else { /* the world's thread ends it, or has ended it already */
    hvd__engine_wake_driver(e);
    pthread_mutex_lock(&e->mu);
    while (!e->ended)
      pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
  }
  engine_free(e);
}
