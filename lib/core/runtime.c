/*
 * runtime.c - hvd_init/hvd_shutdown, topology and build facts.
 *
 * MPI is initialised only if the program has not, and then finalised at
 * process exit (not in hvd_shutdown), so hvd_shutdown() followed by
 * hvd_init() works. hvd always works on its own duplicate of the
 * communicator, with MPI_ERRORS_RETURN.
 */
#include "core/runtime.h"
#include "core/api.h"

#include <config.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/device.h"
#include "base/end_record.h"
#include "base/errors.h"
#include "base/forked.h"
#include "base/log.h"
#include "base/settings.h"
#include "core/start.h"
#include "hvd_mpi.h"

static struct {
  pthread_mutex_t mu;  /* serialises init and shutdown */
  pthread_rwlock_t rw; /* submissions (read) vs. shutdown (write) */
  atomic_int initialized;
  int owns_mpi;
  int atexit_registered;
  MPI_Comm comm, local_comm, cross_comm;
  int rank, size, local_rank, local_size, cross_rank, cross_size;
  int homogeneous;
  hvd__settings_t settings;
  hvd__engine_t *engine;
  MPI_Comm ctl; /* process sets are split from it (the app's thread) */
  int node;     /* the lowest world rank on this rank's node */
  int next_set; /* the last process set's id */
  hvd_process_set_t *sets;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .rw = PTHREAD_RWLOCK_INITIALIZER};

/* A process set: its ranks (world ranks, ascending), and on its members
 * a communicator of their own with an engine of its own, so that its
 * names, cache, fusion and stall inspector are its own and its work goes
 * on independently of the world's and other sets'. */
struct hvd_process_set {
  int id, size, rank; /* rank: this rank's in the set, -1 outside it */
  int *ranks;
  int stopped; /* hvd_shutdown stopped it; destroy only frees it */
  MPI_Comm comm, local_comm, cross_comm;
  hvd__engine_t *engine; /* members only */
  hvd_process_set_t *next;
};

static void free_comm(MPI_Comm *c);

/* hvd runs in this process: initialised, and not a child forked since
 * (base/forked.h), which has a copy of g but none of its threads. */
static int running(void) {
  return atomic_load(&g.initialized) && !hvd__forked();
}

hvd__engine_t *hvd__runtime_engine(void) { return running() ? g.engine : NULL; }

hvd_result_t hvd__runtime_submit(const char *fn, hvd_request_t *r) {
  if (hvd__forked()) /* before the lock, which a parent thread may hold */
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = atomic_load(&g.initialized)
                        ? hvd__engine_submit(g.engine, r)
                        : hvd__not_initialized(fn);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

hvd_result_t hvd__runtime_submit_many(const char *fn, hvd_request_t *const *rs,
                                      int n) {
  if (hvd__forked())
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = atomic_load(&g.initialized)
                        ? hvd__engine_submit_many(g.engine, rs, n)
                        : hvd__not_initialized(fn);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

/* Whether this rank may use ps (g.rw held): HVD_SUCCESS, or the error
 * "<kind> '<name>': ..." set; "<kind>: ..." for a barrier and a join,
 * whose names are hvd's own (doc/errors.md), as the world's say. */
static hvd_result_t set_usable(const char *fn, const char *kind,
                               const char *name, const hvd_process_set_t *ps) {
  int bare = strcmp(kind, "barrier") == 0 || strcmp(kind, "join") == 0;
  const char *open = bare ? "" : " '", *shown = bare ? "" : name,
             *close = bare ? "" : "'";
  if (!running())
    return hvd__not_initialized(fn);
  if (ps->stopped || (ps->rank >= 0 && ps->engine == NULL))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s%s%s%s: process set %d was stopped (hvd_shutdown)",
                          kind, open, shown, close, ps->id);
  if (ps->rank < 0) {
    char list[256];
    size_t at = 0;
    list[0] = '\0';
    for (int i = 0; i < ps->size && at < sizeof list; i++)
      at += (size_t)snprintf(list + at, sizeof list - at, "%s%d", i ? ", " : "",
                             ps->ranks[i]);
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s%s%s%s: rank %d is not in process set %d (ranks "
                          "%s)",
                          kind, open, shown, close, g.rank, ps->id, list);
  }
  return HVD_SUCCESS;
}

hvd_result_t hvd__runtime_set_check(const char *fn, const char *kind,
                                    const char *name,
                                    const hvd_process_set_t *ps) {
  if (hvd__forked())
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = set_usable(fn, kind, name, ps);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

hvd_result_t hvd__runtime_submit_set(const char *fn, const char *kind,
                                     const char *name,
                                     const hvd_process_set_t *ps,
                                     hvd_request_t *const *rs, int n) {
  if (hvd__forked())
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = set_usable(fn, kind, name, ps);
  if (rc == HVD_SUCCESS)
    rc = hvd__engine_submit_many(ps->engine, rs, n);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

/* ---- the timeline, from the program ----------------------------------------
 */

static hvd_result_t timeline_cmd(const char *fn, int cmd, const char *path) {
  if (cmd == 1 && (path == NULL || path[0] == '\0'))
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: path is empty or NULL", fn);
  if (cmd == 1 && strlen(path) >= HVD__PATH_MAX)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: path is longer than %d characters", fn,
                          HVD__PATH_MAX - 1);
  if (hvd__forked())
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = atomic_load(&g.initialized)
                        ? hvd__engine_timeline(g.engine, cmd, path)
                        : hvd__not_initialized(fn);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

hvd_result_t hvd_timeline_start(const char *path) {
  return timeline_cmd(__func__, 1, path);
}

hvd_result_t hvd_timeline_stop(void) { return timeline_cmd(__func__, 2, NULL); }

static void timeline_mark(const char *name, int counter, double value) {
  if (name == NULL || name[0] == '\0' || hvd__forked())
    return; /* a forked child's marks would go into the parent's file */
  pthread_rwlock_rdlock(&g.rw);
  if (atomic_load(&g.initialized))
    hvd__engine_timeline_mark(g.engine, name, counter, value);
  pthread_rwlock_unlock(&g.rw);
}

void hvd_timeline_mark(const char *name) { timeline_mark(name, 0, 0); }

void hvd_timeline_counter(const char *name, double value) {
  timeline_mark(name, 1, value);
}

/* ---- device group timing (HVD_GPU_TIMING; ops/gpu_timing.c) ------------ */

hvd_result_t hvd_gpu_timing(hvd_gpu_timing_t *out, int reset) {
  const char *fn = "hvd_gpu_timing";
  if (out == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", fn);
#ifndef HVD_HAVE_CUDA
  (void)reset;
  return hvd__set_error(HVD_ERR_UNSUPPORTED, "%s: hvd was built without CUDA",
                        fn);
#else
  hvd_result_t rc = HVD_SUCCESS;
  if (hvd__forked())
    return hvd__not_initialized(fn);
  pthread_rwlock_rdlock(&g.rw);
  if (!atomic_load(&g.initialized))
    rc = hvd__not_initialized(fn);
  else if (!g.settings.gpu_timing)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: HVD_GPU_TIMING is not set (1 turns device "
                        "group timing on)",
                        fn);
  else
    hvd__gpu_timing_totals(out, reset);
  pthread_rwlock_unlock(&g.rw);
  return rc;
#endif
}

/* hvd_shutdown, every engine stopped: this rank's totals, when timed. */
static void log_gpu_timing(void) {
#ifdef HVD_HAVE_CUDA
  hvd_gpu_timing_t t;
  hvd__gpu_timing_totals(&t, 0);
  if (g.settings.gpu_timing && t.groups > 0)
    HVD__LOG(HVD__LOG_INFO,
             "GPU timing: %lld groups, busy %.6f s, idle between groups "
             "%.6f s, of which hvd's lag %.6f s (max %.3f ms)",
             (long long)t.groups, t.busy_s, t.idle_s, t.lag_s,
             t.max_lag_s * 1e3);
#endif
}

int hvd_process_set_rank(const hvd_process_set_t *ps) {
  return ps != NULL ? ps->rank : -1;
}

int hvd_process_set_size(const hvd_process_set_t *ps) {
  return ps != NULL ? ps->size : -1;
}

int hvd_process_set_id(const hvd_process_set_t *ps) {
  return ps != NULL ? ps->id : -1;
}

int hvd__process_set_world_rank(const hvd_process_set_t *ps, int r) {
  if (ps == NULL)
    return r >= 0 && r < hvd_size() ? r : -1;
  return r >= 0 && r < ps->size ? ps->ranks[r] : -1;
}

int hvd__process_set_has(const hvd_process_set_t *ps, int world_rank) {
  for (int r = 0; ps != NULL && r < ps->size; r++)
    if (ps->ranks[r] == world_rank)
      return 1;
  return ps == NULL;
}

/* Under g.rw, not g.mu: g.mu is held across the collectives of a set's
 * creation and destruction, which may wait for a rank that is itself in
 * a checkpoint wait here (g.sets changes under g.rw's write lock too). */
const hvd_process_set_t *hvd__process_set_find(int id) {
  const hvd_process_set_t *found = NULL;
  pthread_rwlock_rdlock(&g.rw);
  for (const hvd_process_set_t *ps = g.sets; ps != NULL && found == NULL;
       ps = ps->next)
    if (ps->id == id)
      found = ps;
  pthread_rwlock_unlock(&g.rw);
  return found;
}

/* Stops a member's engine (why: HVD__STOP_BY_*) and frees its
 * communicators (ps stays). */
static void set_stop(hvd_process_set_t *ps, int why) {
  hvd__engine_stop(ps->engine, why);
  ps->engine = NULL;
  free_comm(&ps->cross_comm);
  free_comm(&ps->local_comm);
  free_comm(&ps->comm);
}

static void set_free(hvd_process_set_t *ps) {
  if (ps == NULL)
    return;
  set_stop(ps, HVD__STOP_BY_DESTROY);
  free(ps->ranks);
  free(ps);
}

/* What is wrong with one rank's arguments to hvd_process_set_create
 * (kind, then an index and a value), found on that rank alone but
 * reported by every rank: a rank that returned at once would leave the
 * others waiting in the collective for ever. */
enum { CREATE_OK, CREATE_NO_OUT, CREATE_COUNT, CREATE_RANK };

/* hvd_process_set_create's args in its engine command's exchange: the
 * list's length and hash, then its fault (3 values). */
enum { C_N, C_HASH, C_FAULT };

static void create_args(const int *ranks, int n, int has_out, int64_t *a) {
  int64_t *f = a + C_FAULT;
  uint64_t h = 1469598103934665603ull;
  f[0] = CREATE_OK, f[1] = n, f[2] = ranks == NULL;
  a[C_N] = n;
  if (!has_out) {
    f[0] = CREATE_NO_OUT;
  } else if (ranks == NULL || n < 1 || n > g.size) {
    f[0] = CREATE_COUNT;
  } else {
    for (int i = 0; i < n && f[0] == CREATE_OK; i++)
      if (ranks[i] < 0 || ranks[i] >= g.size ||
          (i > 0 && ranks[i] <= ranks[i - 1]))
        f[0] = CREATE_RANK, f[1] = i, f[2] = ranks[i];
  }
  for (int i = 0; f[0] == CREATE_OK && i < n; i++)
    h = (h ^ (uint64_t)(unsigned)ranks[i]) * 1099511628211ull;
  a[C_HASH] = (int64_t)h;
}

/* The error of rank r's fault f, the same text on every rank. */
static hvd_result_t create_fault_error(const char *fn, int r,
                                       const int64_t *f) {
  if (f[0] == CREATE_NO_OUT)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: rank %d passes out NULL",
                          fn, r);
  if (f[0] == CREATE_COUNT)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: rank %d passes %lld ranks%s; a set has 1 to %d",
                          fn, r, (long long)f[1], f[2] ? " (ranks NULL)" : "",
                          g.size);
  return hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: rank %d passes ranks[%lld] = %lld; the ranks are "
                        "distinct, ascending, in 0..%d",
                        fn, r, (long long)f[1], (long long)f[2], g.size - 1);
}

/* Rank r's args in an engine command's exchange (hvd__engine_command). */
static const int64_t *cmd_args(const int64_t *all, int r) {
  return all + HVD__CMD_ROW * r + 1;
}

/* Every rank must pass valid arguments (the first rank whose are not is
 * named) and the same list: the lists' lengths and hashes, from the
 * command's exchange; the first rank that differs from rank 0 is named. */
static hvd_result_t set_agree(const char *fn, const int64_t *all) {
  const int64_t *a0 = cmd_args(all, 0);
  for (int r = 0; r < g.size; r++)
    if (cmd_args(all, r)[C_FAULT] != CREATE_OK)
      return create_fault_error(fn, r, cmd_args(all, r) + C_FAULT);
  for (int r = 1; r < g.size; r++) {
    const int64_t *a = cmd_args(all, r);
    if (a[C_N] != a0[C_N])
      return hvd__set_error(
          HVD_ERR_MISMATCH,
          "%s: rank 0 lists %lld ranks but rank %d lists %lld", fn,
          (long long)a0[C_N], r, (long long)a[C_N]);
    if (a[C_HASH] != a0[C_HASH])
      return hvd__set_error(HVD_ERR_MISMATCH,
                            "%s: rank 0 and rank %d list different ranks", fn,
                            r);
  }
  return HVD_SUCCESS;
}

/* A set's handle: its ranks and id, and this rank's place in it. */
static hvd_result_t set_new(const char *fn, const int *ranks, int n, int id,
                            hvd_process_set_t **out) {
  hvd_process_set_t *ps = calloc(1, sizeof *ps);
  if (ps == NULL ||
      (ps->ranks = malloc((size_t)n * sizeof *ps->ranks)) == NULL) {
    free(ps);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  }
  memcpy(ps->ranks, ranks, (size_t)n * sizeof *ranks);
  ps->size = n;
  ps->rank = -1;
  ps->comm = ps->local_comm = ps->cross_comm = MPI_COMM_NULL;
  for (int i = 0; i < n; i++)
    if (ranks[i] == g.rank)
      ps->rank = i;
  ps->id = id;
  *out = ps;
  return HVD_SUCCESS;
}

/* A member's communicators and engine; comm (the set's ranks in world
 * order, split from g.ctl) becomes the set's. */
static hvd_result_t set_join(hvd_process_set_t *ps, MPI_Comm comm) {
  hvd_result_t rc = HVD_SUCCESS;
  int local_rank, local_size, node;
  ps->comm = comm;
  HVD__MPI_CHECK(MPI_Comm_set_errhandler(ps->comm, MPI_ERRORS_RETURN));
  HVD__MPI_CHECK(MPI_Comm_split(ps->comm, g.node, ps->rank, &ps->local_comm));
  HVD__MPI_CHECK(MPI_Comm_rank(ps->local_comm, &local_rank));
  HVD__MPI_CHECK(MPI_Comm_size(ps->local_comm, &local_size));
  /* the nodes in one order on every local rank, as the world's */
  HVD__MPI_CHECK(
      MPI_Allreduce(&ps->rank, &node, 1, MPI_INT, MPI_MIN, ps->local_comm));
  HVD__MPI_CHECK(MPI_Comm_split(ps->comm, local_rank, node, &ps->cross_comm));
  hvd__exec_env_t env = {.comm = ps->comm,
                         .rank = ps->rank,
                         .size = ps->size,
                         .local_comm = ps->local_comm,
                         .cross_comm = ps->cross_comm,
                         .local_rank = local_rank,
                         .local_size = local_size,
                         .world_ranks = ps->ranks,
                         .set_id = ps->id};
  hvd__settings_t s = g.settings; /* the world's timeline and tuning only */
  s.timeline[0] = '\0';
  s.autotune = 0;
  rc = hvd__engine_start_set(g.engine, &env, &s, &ps->engine);
fail:
  return rc;
}

/* What a set's creation needs on the engine thread. */
typedef struct set_build {
  const char *fn;
  const int *ranks;
  int n;
  int color;             /* hvd_process_set_split's */
  hvd_process_set_t *ps; /* out */
} set_build_t;

/* The world's engine command (hvd__engine_command) that makes a set: on
 * the engine thread, in the same cycle on every rank, so the set's
 * communicators (MPI's splits, NCCL's inits in the executors' open) are
 * made at one point of the order in which that thread issues every
 * communicator's work. all: every rank's args (create_args). */
static hvd_result_t set_build(void *arg, const int64_t *all) {
  set_build_t *b = arg;
  hvd_result_t rc = HVD_SUCCESS;
  hvd_process_set_t *ps = NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  HVD__CHECK(set_agree(b->fn, all));
  HVD__CHECK(set_new(b->fn, b->ranks, b->n, ++g.next_set, &ps));
  HVD__MPI_CHECK(
      MPI_Comm_split(g.ctl, ps->rank >= 0 ? 0 : MPI_UNDEFINED, g.rank, &comm));
  if (ps->rank >= 0)
    HVD__CHECK(set_join(ps, comm));
  b->ps = ps;
  return HVD_SUCCESS;
fail:
  if (ps == NULL || ps->comm != comm)
    free_comm(&comm);
  set_free(ps); /* no engine yet: nothing to wait for */
  return rc;
}

/* hvd_process_set_split's args in its command's exchange: the color, and
 * whether out is not NULL (a rank whose out is NULL still takes part, so
 * that every rank fails alike rather than some waiting for it). */
enum { S_COLOR, S_HAS_OUT };

static int int_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Every rank's color (all: the command's exchange), the same checks on
 * every rank, and the caller's set: its ranks (*n of them into ranks)
 * and its id, the distinct colors counted in ascending order after
 * g.next_set, which moves past them all. */
static hvd_result_t split_colors(const char *fn, const int64_t *all, int color,
                                 int *ranks, int *n, int *id) {
  hvd_result_t rc = HVD_SUCCESS;
  int *sorted = malloc(sizeof *sorted * (size_t)g.size);
  if (sorted == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  for (int r = 0; r < g.size; r++) {
    const int64_t *a = cmd_args(all, r);
    if (!a[S_HAS_OUT]) {
      rc = hvd__set_error(HVD_ERR_INVALID_ARG, "%s: rank %d passes out NULL",
                          fn, r);
      goto fail;
    }
    if (a[S_COLOR] < 0) {
      rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: rank %d passes color %lld; colors are >= 0", fn,
                          r, (long long)a[S_COLOR]);
      goto fail;
    }
    sorted[r] = (int)a[S_COLOR];
  }
  *n = 0;
  for (int r = 0; r < g.size; r++)
    if (sorted[r] == color)
      ranks[(*n)++] = r;
  qsort(sorted, (size_t)g.size, sizeof *sorted, int_cmp);
  int distinct = 0, below = 0;
  for (int i = 0; i < g.size; i++)
    if (i == 0 || sorted[i] != sorted[i - 1]) {
      below += sorted[i] < color;
      distinct++;
    }
  *id = g.next_set + 1 + below;
  g.next_set += distinct;
fail:
  free(sorted);
  return rc;
}

/* hvd_process_set_split's engine command: one MPI_Comm_split of g.ctl
 * gives every set its communicator at once. */
static hvd_result_t split_build(void *arg, const int64_t *all) {
  set_build_t *b = arg;
  hvd_result_t rc = HVD_SUCCESS;
  hvd_process_set_t *ps = NULL;
  MPI_Comm comm = MPI_COMM_NULL;
  int n = 0, id = 0, *ranks = malloc(sizeof *ranks * (size_t)g.size);
  if (ranks == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", b->fn);
  HVD__CHECK(split_colors(b->fn, all, b->color, ranks, &n, &id));
  HVD__CHECK(set_new(b->fn, ranks, n, id, &ps));
  HVD__MPI_CHECK(MPI_Comm_split(g.ctl, b->color, g.rank, &comm));
  HVD__CHECK(set_join(ps, comm));
  b->ps = ps;
  free(ranks);
  return HVD_SUCCESS;
fail:
  if (ps == NULL || ps->comm != comm)
    free_comm(&comm);
  set_free(ps);
  free(ranks);
  return rc;
}

/* Runs build on the world's engine thread and lists the set it made. */
static hvd_result_t set_make_locked(const hvd__engine_cmd_t *cmd,
                                    set_build_t *b, hvd_process_set_t **out) {
  hvd_result_t rc = hvd__engine_command(g.engine, cmd);
  if (rc != HVD_SUCCESS)
    return rc;
  pthread_rwlock_wrlock(&g.rw); /* hvd__process_set_find reads under it */
  b->ps->next = g.sets;
  g.sets = b->ps;
  pthread_rwlock_unlock(&g.rw);
  *out = b->ps;
  return HVD_SUCCESS;
}

static hvd_result_t set_create_locked(const char *fn, const int *ranks, int n,
                                      hvd_process_set_t **out) {
  set_build_t b = {.fn = fn, .ranks = ranks, .n = n};
  hvd__engine_cmd_t cmd = {
      .kind = HVD__CMD_SET_CREATE, .fn = set_build, .arg = &b};
  hvd_process_set_t *ps = NULL;
  create_args(ranks, n, out != NULL, cmd.args); /* agreed on, not returned */
  hvd_result_t rc = set_make_locked(&cmd, &b, &ps);
  if (out != NULL)
    *out = ps;
  return rc;
}

hvd_result_t hvd_process_set_create(const int *ranks, int n,
                                    hvd_process_set_t **out) {
  static const char fn[] = "hvd_process_set_create";
  if (hvd__forked()) {
    if (out != NULL)
      *out = NULL;
    return hvd__not_initialized(fn);
  }
  pthread_mutex_lock(&g.mu);
  hvd_result_t rc = atomic_load(&g.initialized)
                        ? set_create_locked(fn, ranks, n, out)
                        : hvd__not_initialized(fn);
  pthread_mutex_unlock(&g.mu);
  return rc;
}

static hvd_result_t split_locked(int kind, int color, hvd_process_set_t **out) {
  const char *fn = hvd__cmd_name(kind);
  if (out != NULL)
    *out = NULL;
  if (!atomic_load(&g.initialized))
    return hvd__not_initialized(fn);
  hvd_process_set_t *ps = NULL;
  set_build_t b = {.fn = fn, .color = color};
  hvd__engine_cmd_t cmd = {
      .kind = (hvd__cmd_kind_t)kind,
      .args = {[S_COLOR] = color, [S_HAS_OUT] = out != NULL},
      .fn = split_build,
      .arg = &b};
  hvd_result_t rc = set_make_locked(&cmd, &b, &ps);
  if (out != NULL)
    *out = ps;
  return rc;
}

/* A split in a forked child: refused, *out NULL. */
static hvd_result_t split_in_child(const char *fn, hvd_process_set_t **out) {
  if (out != NULL)
    *out = NULL;
  return hvd__not_initialized(fn);
}

hvd_result_t hvd_process_set_split(int color, hvd_process_set_t **out) {
  if (hvd__forked())
    return split_in_child("hvd_process_set_split", out);
  pthread_mutex_lock(&g.mu);
  hvd_result_t rc = split_locked(HVD__CMD_SET_SPLIT, color, out);
  pthread_mutex_unlock(&g.mu);
  return rc;
}

hvd_result_t hvd_process_set_split_node(hvd_process_set_t **out) {
  if (hvd__forked())
    return split_in_child("hvd_process_set_split_node", out);
  pthread_mutex_lock(&g.mu);
  hvd_result_t rc = split_locked(HVD__CMD_SET_SPLIT_NODE,
                                 atomic_load(&g.initialized) ? g.node : 0, out);
  pthread_mutex_unlock(&g.mu);
  return rc;
}

hvd_result_t hvd_process_set_destroy(hvd_process_set_t *ps) {
  if (ps == NULL)
    return HVD_SUCCESS;
  if (hvd__forked()) /* the set's engine and communicators are the parent's */
    return hvd__not_initialized("hvd_process_set_destroy");
  pthread_mutex_lock(&g.mu);
  pthread_rwlock_wrlock(&g.rw); /* no submission to it is half done */
  for (hvd_process_set_t **p = &g.sets; *p != NULL; p = &(*p)->next)
    if (*p == ps) {
      *p = ps->next;
      break;
    }
  ps->stopped = 1;
  pthread_rwlock_unlock(&g.rw);
  set_free(ps);
  pthread_mutex_unlock(&g.mu);
  return HVD_SUCCESS;
}

hvd_result_t hvd__not_initialized(const char *fn) {
  if (hvd__forked())
    return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                          "%s: this process (pid %ld) was forked from rank "
                          "%d (pid %ld) after hvd_init; hvd's engine, MPI "
                          "and NCCL stay with that process, so collectives "
                          "can only be made there",
                          fn, (long)getpid(), g.rank, hvd__fork_parent());
  return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                        "%s: hvd_init() has not been called", fn);
}

int hvd_is_initialized(void) { return running(); }

int hvd_cuda_device(void) {
  return hvd_is_initialized() ? hvd__cuda_device() : -1;
}

#define QUERY(fn, field)                                                       \
  int fn(void) { return atomic_load(&g.initialized) ? g.field : -1; }
QUERY(hvd_rank, rank)
QUERY(hvd_size, size)
QUERY(hvd_local_rank, local_rank)
QUERY(hvd_local_size, local_size)
QUERY(hvd_cross_rank, cross_rank)
QUERY(hvd_cross_size, cross_size)
QUERY(hvd_is_homogeneous, homogeneous)

size_t hvd__checkpoint_piece(void) {
  return (size_t)g.settings.checkpoint_piece / 16 * 16;
}

int hvd_mpi_built(void) { return 1; }
const char *hvd_version(void) { return PACKAGE_VERSION; }

static void free_comm(MPI_Comm *c) {
  if (*c != MPI_COMM_NULL)
    MPI_Comm_free(c);
  *c = MPI_COMM_NULL;
}

/* Local = same node: shared memory, or equal HVD_HOSTNAME. Cross = same
 * local rank, ranked by node (each node's lowest rank first). */
static hvd_result_t topology(void) {
  hvd_result_t rc = HVD_SUCCESS;
  char *names = NULL;
  int set = g.settings.hostname[0] != '\0', minmax[2] = {set, -set};
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_INT, MPI_MAX, g.comm));
  if (minmax[0] != -minmax[1]) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "HVD_HOSTNAME is set on some ranks but not on others "
                        "(rank %d: %s)",
                        g.rank, set ? g.settings.hostname : "unset");
    goto fail;
  }
  if (set) {
    names = malloc((size_t)g.size * HVD__HOSTNAME_MAX);
    if (names == NULL) {
      rc = hvd__set_error(HVD_ERR_NO_MEMORY, "host names");
      goto fail;
    }
    HVD__MPI_CHECK(MPI_Allgather(g.settings.hostname, HVD__HOSTNAME_MAX,
                                 MPI_CHAR, names, HVD__HOSTNAME_MAX, MPI_CHAR,
                                 g.comm));
    int color = 0;
    while (strcmp(names + (size_t)color * HVD__HOSTNAME_MAX,
                  g.settings.hostname) != 0)
      color++;
    HVD__MPI_CHECK(MPI_Comm_split(g.comm, color, g.rank, &g.local_comm));
  } else {
    HVD__MPI_CHECK(MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank,
                                       MPI_INFO_NULL, &g.local_comm));
  }
  HVD__MPI_CHECK(MPI_Comm_rank(g.local_comm, &g.local_rank));
  HVD__MPI_CHECK(MPI_Comm_size(g.local_comm, &g.local_size));
  /* Every local rank's cross communicator ranks the nodes alike, by
   * their lowest rank (g.node): segment k of a piece is folded over the
   * nodes by local rank k, so an element's order of nodes does not move
   * with the pieces, whatever the layout (hvd.h, "Reproducibility"). */
  HVD__MPI_CHECK(
      MPI_Allreduce(&g.rank, &g.node, 1, MPI_INT, MPI_MIN, g.local_comm));
  HVD__MPI_CHECK(MPI_Comm_split(g.comm, g.local_rank, g.node, &g.cross_comm));
  HVD__MPI_CHECK(MPI_Comm_rank(g.cross_comm, &g.cross_rank));
  HVD__MPI_CHECK(MPI_Comm_size(g.cross_comm, &g.cross_size));
  minmax[0] = g.local_size;
  minmax[1] = -g.local_size;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_INT, MPI_MAX, g.comm));
  g.homogeneous = minmax[0] == -minmax[1];
fail:
  free(names);
  return rc;
}

/* hvdrun --start-timeout waits for this file: every rank has reached
 * hvd_init (the engine's start is collective), so the job has started. A
 * failure to write it only costs the launcher's patience: logged. */
static void started(const char *path) {
  FILE *f = fopen(path, "w");
  int bad = f == NULL;
  if (f != NULL) {
    bad = fprintf(f, "%d ranks started\n", g.size) < 0;
    bad = fclose(f) != 0 || bad;
  }
  if (bad)
    HVD__LOG(HVD__LOG_WARNING, "HVD_START_FILE '%s' could not be written: %s",
             path, strerror(errno));
}

/* MPI_Finalize deletes MPI_COMM_SELF's attributes first, with MPI still
 * whole: a program that finalises MPI without hvd_shutdown gets hvd shut
 * down there, instead of its engine calling a finalised MPI (a crash). */
static int on_finalize(MPI_Comm comm, int keyval, void *value, void *extra) {
  (void)comm;
  (void)keyval;
  (void)value;
  (void)extra;
  if (hvd_is_initialized()) {
    HVD__LOG(HVD__LOG_INFO,
             "MPI_Finalize with hvd running: hvd_shutdown first");
    hvd_shutdown();
  }
  return MPI_SUCCESS;
}

/* Once per MPI (setting the attribute again would delete the old one, a
 * shutdown): on_finalize as MPI_COMM_SELF's attribute. */
static hvd_result_t hook_finalize(void) {
  static int hooked;
  hvd_result_t rc = HVD_SUCCESS;
  int keyval = MPI_KEYVAL_INVALID;
  if (hooked)
    return HVD_SUCCESS;
  HVD__MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_finalize,
                                        &keyval, NULL));
  HVD__MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, NULL));
  hooked = 1;
fail:
  return rc;
}

static hvd_result_t init_locked(MPI_Comm comm) {
  hvd_result_t rc = HVD_SUCCESS;
  double preconnect_ms = -1; /* < 0: not done */
  char why[HVD__ERRMSG_MAX];
  hvd__fork_watch();
  g.comm = g.local_comm = g.cross_comm = g.ctl = MPI_COMM_NULL;
  hvd_result_t loaded = hvd__settings_load(&g.settings);
  snprintf(why, sizeof why, "%s",
           loaded != HVD_SUCCESS ? hvd_last_error() : "");
  hvd__log_threshold = g.settings.log_level;
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &g.rank)); /* the same in g.comm */
  hvd__log_set_rank(g.rank);
  HVD__CHECK(hook_finalize());
  /* The settings are each rank's own (a program may set HVD_HOSTNAME per
   * rank), so one rank may fail to read them, or differ in
   * HVD_MPI_PRECONNECT, while the others go on into MPI_Comm_dup and wait
   * there for it for ever (no engine yet, so no stall check). So the
   * preconnect first (hvd's first messages on comm, by its design), with
   * whatever settings this rank could read, then the ranks agree, every
   * wait bounded (start.h): every rank fails alike, naming the rank. */
  HVD__CHECK(hvd__start_agree(comm, &g.settings, loaded, why, &preconnect_ms));
  HVD__MPI_CHECK(MPI_Comm_dup(comm, &g.comm));
  HVD__MPI_CHECK(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN));
  HVD__MPI_CHECK(MPI_Comm_size(g.comm, &g.size));
  HVD__CHECK(topology());
  HVD__MPI_CHECK(MPI_Comm_dup(g.comm, &g.ctl));
  HVD__CHECK(hvd__cuda_bind(g.comm, g.local_comm, g.settings.no_bind,
                            g.settings.gpu_share));
  hvd__cuda_ready_timing(g.settings.gpu_timing);
#ifdef HVD_HAVE_CUDA
  hvd__gpu_timing_totals(NULL, 1); /* "since hvd_init" */
#endif
  hvd__exec_env_t env = {.comm = g.comm,
                         .rank = g.rank,
                         .size = g.size,
                         .local_comm = g.local_comm,
                         .cross_comm = g.cross_comm,
                         .local_rank = g.local_rank,
                         .local_size = g.local_size};
  HVD__CHECK(hvd__engine_start(&env, &g.settings, &g.engine));
  if (g.rank == 0) {
    hvd__settings_warn_unknown();
    hvd__settings_log(&g.settings);
    HVD__LOG(HVD__LOG_INFO,
             "hvd %s: %d ranks, %d per node (homogeneous %d), %d GPUs "
             "visible, CUDA %d, NCCL %d",
             PACKAGE_VERSION, g.size, g.local_size, g.homogeneous,
             hvd__cuda_device_count(), hvd_cuda_built(), hvd_nccl_built());
    if (preconnect_ms >= 0)
      HVD__LOG(HVD__LOG_INFO,
               "hvd_init connected every pair of the %d ranks, the lower "
               "rank first, in %.1f ms (HVD_MPI_PRECONNECT)",
               g.size, preconnect_ms);
  }
  if (g.rank == 0 && g.settings.start_file[0])
    started(g.settings.start_file);
  atomic_store(&g.initialized, 1);
  return HVD_SUCCESS;
fail:
  free_comm(&g.ctl);
  free_comm(&g.cross_comm);
  free_comm(&g.local_comm);
  free_comm(&g.comm);
  return rc;
}

/* hvd's engine calls MPI from a thread of its own while the program's
 * threads (and hvd's calls on them) may call it too: MPI must run at
 * MPI_THREAD_MULTIPLE, or its calls race inside it. `ours`: hvd_init
 * asked MPI_Init_thread for it. */
static hvd_result_t thread_level(const char *fn, int ours) {
  int level = MPI_THREAD_SINGLE;
  int mrc = MPI_Query_thread(&level);
  if (mrc != MPI_SUCCESS)
    return hvd__mpi_error(mrc, "MPI_Query_thread");
  if (level >= MPI_THREAD_MULTIPLE)
    return HVD_SUCCESS;
  const char *name = level == MPI_THREAD_FUNNELED     ? "MPI_THREAD_FUNNELED"
                     : level == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                                      : "MPI_THREAD_SINGLE";
  if (ours)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: this MPI gives %s at most (MPI_Init_thread "
                          "asked for MPI_THREAD_MULTIPLE); hvd's engine "
                          "calls MPI from a thread of its own, which needs "
                          "MPI_THREAD_MULTIPLE: use an MPI built with thread "
                          "support",
                          fn, name);
  return hvd__set_error(HVD_ERR_UNSUPPORTED,
                        "%s: MPI was initialised at %s (MPI_Query_thread); "
                        "hvd's engine calls MPI from a thread of its own "
                        "beside the program's, which needs "
                        "MPI_THREAD_MULTIPLE: initialise MPI with "
                        "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, "
                        "&provided) instead of MPI_Init, or leave it to "
                        "hvd_init",
                        fn, name);
}

/* hvd_init in a child forked after hvd_init: refused. */
static hvd_result_t start_in_child(const char *fn) {
  return hvd__set_error(HVD_ERR_UNSUPPORTED,
                        "%s: this process (pid %ld) was forked from rank %d "
                        "(pid %ld) after hvd_init; hvd cannot start again in "
                        "it (MPI is that process's): fork before hvd_init, "
                        "or exec a program",
                        fn, (long)getpid(), g.rank, hvd__fork_parent());
}

hvd_result_t hvd_init_comm(MPI_Comm comm) {
  if (hvd__forked())
    return start_in_child("hvd_init_comm");
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (!up || down)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_init_comm: MPI is %s; call MPI_Init first or "
                          "use hvd_init()",
                          down ? "finalized" : "not initialized");
  if (comm == MPI_COMM_NULL) /* MPI_Comm_rank would abort the job */
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_init_comm: comm is MPI_COMM_NULL; pass the "
                          "communicator of the ranks that train together "
                          "(MPI_COMM_WORLD, or one split from it)");
  pthread_mutex_lock(&g.mu);
  hvd_result_t rc = HVD_SUCCESS;
  if (!atomic_load(&g.initialized) &&
      (rc = thread_level("hvd_init_comm", 0)) == HVD_SUCCESS)
    rc = init_locked(comm);
  pthread_mutex_unlock(&g.mu);
  return rc;
}

/* The tag of at_exit's "this rank came" messages on MPI_COMM_WORLD; no
 * user message is pending when the process exits after a failure. */
#define EXIT_TAG 0x4856 /* "HV" */

/* Tells every higher rank of MPI_COMM_WORLD that this one came to its
 * end (nonblocking; the job is aborted after, so nothing completes them). */
static void announce_arrival(int rank) {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  static char none;
  for (int r = rank + 1; r < size; r++) {
    MPI_Request req;
    if (MPI_Isend(&none, 0, MPI_BYTE, r, EXIT_TAG, MPI_COMM_WORLD, &req) ==
        MPI_SUCCESS)
      MPI_Request_free(&req);
  }
}

/* 1 when some lower rank announced that it came to its end. */
static int lower_rank_came(int rank) {
  for (int r = 0; r < rank; r++) {
    int flag = 0;
    if (MPI_Iprobe(r, EXIT_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE) ==
            MPI_SUCCESS &&
        flag)
      return 1;
  }
  return 0;
}

/* 1 when every rank of MPI_COMM_WORLD reaches this call within `grace`
 * seconds (a nonblocking barrier, polled); 0 if some rank does not. */
static int all_arrive(double grace) {
  MPI_Request req;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS)
    return 0;
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return 0;
    if (done)
      return 1;
    clock_gettime(CLOCK_MONOTONIC, &t);
    if ((double)(t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) * 1e-9 >
        grace)
      return 0;
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
}

/* At process exit, for the MPI that hvd_init started. MPI_Finalize waits
 * for every rank; after hvd stopped on a failure (a stall, the engine's
 * MPI failing) some rank may never come (stuck in its own code, or gone),
 * so the job is ended instead with MPI_Abort and the failure's code, which
 * mpirun makes the job's exit status after stopping every rank. First
 * the exiting ranks wait up to HVD_EXIT_GRACE_TIME for each other, so
 * that none is killed while it still saves its work. One rank says why
 * the job ends and aborts: rank 0 if all came; if not, the lowest rank
 * that came, known by the messages each rank sends its higher ranks on
 * arrival. The others abort silently after 5 s, should that rank's abort
 * not reach them (a lower rank that came just after the grace ended may
 * make two say it). A normal run, or one where a rank called
 * hvd_shutdown early, finalizes as usual. */
static void at_exit(void) {
  if (hvd__forked()) /* MPI is the parent's, to finalise there */
    return;
  int rank = g.rank;
  double grace = g.settings.exit_grace_s;
  hvd_shutdown();
  int down = 0;
  MPI_Finalized(&down);
  if (!g.owns_mpi || down)
    return;
  char reason[HVD__ERRMSG_MAX];
  hvd_result_t why = hvd__fatal(reason, sizeof reason);
  if (why != HVD_SUCCESS) {
    announce_arrival(rank);
    int all = all_arrive(grace);
    int speaks = all ? rank == 0 : !lower_rank_came(rank);
    if (!speaks) /* the speaking rank's abort ends this one; a fallback */
      nanosleep(&(struct timespec){5, 0}, NULL);
    hvd__end_record_abort((int)why);
    if (speaks)
      HVD__LOG(HVD__LOG_ERROR,
               "ending the job with MPI_Abort(%d) at exit, not "
               "MPI_Finalize, %s: %s",
               (int)why,
               all ? "after every rank came to its end"
                   : "as some rank did not come within HVD_EXIT_GRACE_TIME",
               reason);
    MPI_Abort(MPI_COMM_WORLD, (int)why);
  }
  MPI_Finalize();
}

hvd_result_t hvd_init(void) {
  hvd_result_t rc = HVD_SUCCESS;
  if (hvd__forked())
    return start_in_child("hvd_init");
  pthread_mutex_lock(&g.mu);
  if (atomic_load(&g.initialized))
    goto done;
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (down) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "hvd_init: MPI has been finalized; hvd cannot start "
                        "after MPI_Finalize()");
    goto done;
  }
  if (!up) {
    int provided = 0;
    int mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (mrc != MPI_SUCCESS) {
      rc = hvd__mpi_error(mrc, "MPI_Init_thread");
      goto done;
    }
    g.owns_mpi = 1;
    if (!g.atexit_registered && atexit(at_exit) == 0)
      g.atexit_registered = 1;
  }
  if ((rc = thread_level("hvd_init", g.owns_mpi)) != HVD_SUCCESS)
    goto done;
  hvd__end_record_init(); /* after at_exit: its record comes first */
  rc = init_locked(MPI_COMM_WORLD);
done:
  pthread_mutex_unlock(&g.mu);
  return rc;
}

hvd_result_t hvd_shutdown(void) {
  if (hvd__forked()) /* nothing of hvd runs here: the parent's to stop */
    return HVD_SUCCESS;
  pthread_mutex_lock(&g.mu);
  if (atomic_load(&g.initialized)) {
    pthread_rwlock_wrlock(&g.rw); /* no submission is half done */
    atomic_store(&g.initialized, 0);
    hvd_process_set_t *sets = g.sets;
    g.sets = NULL;
    for (hvd_process_set_t *ps = sets; ps != NULL; ps = ps->next)
      ps->stopped = 1;
    pthread_rwlock_unlock(&g.rw);
    /* the sets' engines first; the handles stay for destroy to free */
    for (hvd_process_set_t *ps = sets, *next; ps != NULL; ps = next) {
      next = ps->next;
      set_stop(ps, HVD__STOP_BY_SHUTDOWN);
      ps->next = NULL;
    }
    hvd__engine_stop(g.engine, HVD__STOP_BY_SHUTDOWN);
    g.engine = NULL;
    log_gpu_timing();
    hvd__cuda_ready_drain();
    free_comm(&g.ctl);
    free_comm(&g.cross_comm);
    free_comm(&g.local_comm);
    free_comm(&g.comm);
  }
  pthread_mutex_unlock(&g.mu);
  return HVD_SUCCESS;
}
