/*
 * engine_command.c - engine commands (engine.h, hvd__engine_command): a
 * caller posts one and waits; the world's engine thread runs it in the
 * cycle in which every rank has one, after one exchange that makes every
 * rank check that the others make the same call; and while some rank has
 * none, the command's wait obeys the stall times as a collective's does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "core/engine_int.h"

const char *hvd__cmd_name(int kind) {
  switch (kind) {
  case HVD__CMD_SET_CREATE:
    return "hvd_process_set_create";
  case HVD__CMD_SET_SPLIT:
    return "hvd_process_set_split";
  case HVD__CMD_SET_SPLIT_NODE:
    return "hvd_process_set_split_node";
  default:
    return "an unknown engine command";
  }
}

hvd_result_t hvd__engine_command(hvd__engine_t *e,
                                 const hvd__engine_cmd_t *cmd) {
  hvd_result_t rc;
  pthread_mutex_lock(&e->mu);
  while (e->cmd_pending && !e->stopped) /* another thread's, first */
    pthread_cond_wait(&e->tl_cv, &e->mu);
  unsigned gen = e->cmd_gen;
  if (!e->stopped) {
    e->cmd = *cmd;
    e->cmd_since = hvd__now();
    e->cmd_pending = 1;
    e->urgent = 1;
    pthread_cond_signal(&e->cv);
  }
  while (e->cmd_gen == gen && !e->stopped)
    pthread_cond_wait(&e->tl_cv, &e->mu);
  if (e->cmd_gen != gen) {
    rc = e->cmd_rc;
    if (rc != HVD_SUCCESS)
      hvd__set_error(rc, "%s", e->cmd_msg);
  } else {
    e->cmd_pending = 0;
    rc = hvd__set_error(e->stop_rc, "%s: %s", hvd__cmd_name(cmd->kind),
                        e->stop_reason);
  }
  pthread_mutex_unlock(&e->mu);
  return rc;
}

/* Every rank's kind and args (all: HVD__CMD_ROW each); the first rank
 * whose kind is not rank 0's fails every rank alike. */
static hvd_result_t exchange(hvd__engine_t *e, const hvd__engine_cmd_t *cmd,
                             int64_t *all) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t mine[HVD__CMD_ROW] = {cmd->kind};
  memcpy(mine + 1, cmd->args, sizeof cmd->args);
  HVD__MPI_CHECK(MPI_Allgather(mine, HVD__CMD_ROW, MPI_INT64_T, all,
                               HVD__CMD_ROW, MPI_INT64_T, e->env.comm));
  for (int r = 1; r < e->env.size; r++)
    if (all[HVD__CMD_ROW * r] != all[0])
      return hvd__set_error(
          HVD_ERR_MISMATCH, "%s: rank 0 calls %s but rank %d calls %s",
          hvd__cmd_name(cmd->kind), hvd__cmd_name((int)all[0]), r,
          hvd__cmd_name((int)all[HVD__CMD_ROW * r]));
fail:
  return rc;
}

void hvd__engine_run_command(hvd__engine_t *e) {
  pthread_mutex_lock(&e->mu);
  hvd__engine_cmd_t cmd = e->cmd;
  pthread_mutex_unlock(&e->mu);
  int64_t *all = e->cmd_rows; /* made at the start: nothing to fail here */
  hvd_result_t rc = exchange(e, &cmd, all);
  if (rc == HVD_SUCCESS)
    rc = cmd.fn(cmd.arg, all);
  e->cmd_warned = 0;
  pthread_mutex_lock(&e->mu);
  e->cmd_rc = rc;
  snprintf(e->cmd_msg, sizeof e->cmd_msg, "%s",
           rc != HVD_SUCCESS ? hvd_last_error() : "");
  e->cmd_pending = 0;
  e->cmd_gen++;
  pthread_cond_broadcast(&e->tl_cv);
  pthread_mutex_unlock(&e->mu);
}

/* ---- a command some rank has not posted --------------------------------- */

int hvd__engine_command_overdue(const hvd__engine_t *e) {
  double age = hvd__now() - e->cmd_since;
  return (e->cmd_check_s > 0 && age >= e->cmd_check_s && !e->cmd_warned) ||
         (e->cmd_shutdown_s > 0 && age >= e->cmd_shutdown_s);
}

/* A rank's row in the stall exchange. */
enum { S_HAS, S_KIND, S_AGE_US, S_WARNED, S_CHECK_US, S_SHUTDOWN_US, S_ROW };
_Static_assert(S_ROW == HVD__CMD_STALL_ROW, "engine_int.h's row size");

/* "1, 3": the ranks whose has is `want`, by world rank; eight, then ",
 * and N more ranks". */
static void rank_list(const hvd__engine_t *e, const int64_t *all, int want,
                      char *buf, size_t n) {
  hvd__ranks_t l;
  hvd__ranks_begin(&l);
  for (int r = 0; r < e->env.size; r++)
    if (all[S_ROW * r + S_HAS] == want)
      hvd__ranks_add(&l, hvd__env_world_rank(&e->env, r), NULL);
  hvd__ranks_list(&l, buf, n);
}

/* What every rank decides from the same rows: 1 to stop (msg set), and
 * whether rank 0 warns (*warn, msg set). */
static int verdict(hvd__engine_t *e, const int64_t *all, int has, int *warn,
                   char *msg, size_t n) {
  double age = 0, check = (double)all[S_CHECK_US] / 1e6,
         shutdown = (double)all[S_SHUTDOWN_US] / 1e6;
  int ref = -1, warned = 0;
  for (int r = e->env.size - 1; r >= 0; r--) {
    const int64_t *row = all + S_ROW * r;
    if (!row[S_HAS])
      continue;
    ref = r;
    warned |= (int)row[S_WARNED];
    if ((double)row[S_AGE_US] / 1e6 > age)
      age = (double)row[S_AGE_US] / 1e6;
  }
  e->cmd_check_s = check; /* rank 0's times from now on */
  e->cmd_shutdown_s = shutdown;
  *warn = 0;
  if (ref < 0)
    return 0;
  const char *name = hvd__cmd_name((int)all[S_ROW * ref + S_KIND]);
  char missing[256], present[256];
  rank_list(e, all, 0, missing, sizeof missing);
  rank_list(e, all, 1, present, sizeof present);
  if (shutdown > 0 && age >= shutdown) {
    snprintf(msg, n,
             "%s stalled for %.1f s: rank(s) %s never called it "
             "(HVD_STALL_SHUTDOWN_TIME=%g)",
             name, age, missing, shutdown);
    return 1;
  }
  if (check > 0 && age >= check) {
    *warn = !warned;
    if (has)
      e->cmd_warned = 1;
    snprintf(msg, n,
             "stall: %s has waited %.1f s for rank(s) %s; called by "
             "rank(s) %s",
             name, age, missing, present);
  }
  return 0;
}

int hvd__engine_command_stall(hvd__engine_t *e, int has) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t mine[S_ROW] = {has,
                         has ? e->cmd.kind : 0,
                         has ? (int64_t)((hvd__now() - e->cmd_since) * 1e6) : 0,
                         has && e->cmd_warned,
                         (int64_t)(e->settings.stall_check_s * 1e6),
                         (int64_t)(e->settings.stall_shutdown_s * 1e6)};
  int64_t *all = e->cmd_rows;
  HVD__MPI_CHECK(MPI_Allgather(mine, S_ROW, MPI_INT64_T, all, S_ROW,
                               MPI_INT64_T, e->env.comm));
  int warn;
  char msg[HVD__ERRMSG_MAX - 16], reason[HVD__ERRMSG_MAX];
  int stop = verdict(e, all, has, &warn, msg, sizeof msg);
  if (warn && e->env.rank == 0)
    HVD__LOG(HVD__LOG_WARNING, "%s", msg);
  if (stop) {
    HVD__LOG(HVD__LOG_ERROR, "%s", msg);
    snprintf(reason, sizeof reason, "hvd stopped: %s", msg);
    hvd__engine_stop_all(e, HVD_ERR_STALL, reason, reason);
  }
  return stop;
fail:
  hvd__engine_fail(e, rc);
  return 1;
}
