/*
 * start.c - hvd_init's first traffic on the communicator it is given
 * (start.h): the preconnect, the ranks' agreement on their settings, and
 * the drain that leaves nothing of a failed start on the communicator.
 *
 * A rank decides alone whether it preconnects (its HVD_MPI_PRECONNECT
 * and the size), and it must: the preconnect exists to be the first
 * traffic, so nothing may be agreed before it. When ranks decide
 * differently, those that preconnect wait for bytes the others never
 * send, while the others wait in the agreement. Both waits are bounded:
 * the preconnect by HVD_STALL_SHUTDOWN_TIME from the start, after which
 * the rank goes on into the agreement with its stall; the agreement by
 * twice that, so a rank that skipped the preconnect outwaits the ones
 * still in theirs. The agreement then names the setting, the ranks and
 * their values on every rank. The preconnect's messages left unmatched
 * (a byte to a rank that skipped it, a receive from one) would be
 * matched by a later hvd_init's preconnect on the same communicator, or
 * by the program's own MPI_ANY_TAG receive: every rank knows from the
 * agreement what each other rank sent, so it receives what was sent to
 * it and cancels the receives that nothing will match.
 */
#include <config.h>

#include "core/start.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/end_record.h"
#include "base/log.h"
#include "internal.h"

/* The tag of the preconnect's messages (hvd's first on the communicator
 * given to hvd_init; at_exit's use EXIT_TAG). */
#define PRECONNECT_TAG 0x4850 /* "HP" */

/* How far a rank's preconnect got: nothing (not in it: no pair, too many
 * ranks, or HVD_MPI_PRECONNECT 0); its byte sent to every higher rank
 * and the lower ranks' asked for (SENT); its replies sent to the lower
 * ranks and the higher ones' asked for (REPLIED); all of it done. So a
 * lower rank p has sent this rank a byte once p is at SENT, a higher
 * rank its reply once at REPLIED: at most one message each way. */
enum { NONE, SENT, REPLIED, DONE };

/* What each rank gives the agreement: whether it failed (FAILED_*), its
 * HVD_MPI_PRECONNECT and its preconnect's stage. */
enum { REC_FAILED, REC_VALUE, REC_STAGE, REC_N };
enum { FAILED_NOT, FAILED_SETTINGS, FAILED_PRECONNECT };

typedef struct pc {
  MPI_Comm comm;
  int rank, size, stage, value, warned;
  int pending; /* a fatal stall left requests pending (their buffers stay) */
  MPI_Request *reqs; /* size receives, by peer, then size sends */
  char *in;          /* a byte from each peer */
  double t0, check, shutdown;
} pc_t;

/* Tests reqs[0..n) until all are done (1) or hvd__now() passes until (0;
 * until 0: never); -1 with the error set when MPI fails. */
static int poll(MPI_Request *reqs, int n, double until) {
  for (;;) {
    int done = 0, mrc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (mrc != MPI_SUCCESS)
      return hvd__mpi_error(mrc, "MPI_Testall"), -1;
    if (done)
      return 1;
    if (until > 0 && hvd__now() > until)
      return 0;
    nanosleep(&(struct timespec){0, 200000}, NULL);
  }
}

/* poll() until stop, calling say(pc, age) once HVD_STALL_CHECK_TIME after
 * since (the wait's start) when still waiting then (never when *warned). */
static int poll_warned(MPI_Request *reqs, int n, const pc_t *pc, double since,
                       double stop, int *warned,
                       void (*say)(const pc_t *, double)) {
  double warn = pc->check > 0 && !*warned ? since + pc->check : 0;
  if (warn > 0 && (stop == 0 || warn < stop)) {
    int got = poll(reqs, n, warn);
    if (got != 0)
      return got;
    say(pc, hvd__now() - since);
    *warned = 1;
  }
  return poll(reqs, n, stop);
}

/* The peers whose preconnect message to or from this rank is pending,
 * as "1, 3" (eight, then ", and N more ranks"). */
static void pending_ranks(const pc_t *pc, char *out, size_t cap) {
  hvd__ranks_t l;
  hvd__ranks_begin(&l);
  for (int p = 0; p < pc->size; p++) {
    int in = 1, sent = 1;
    if (pc->reqs[p] != MPI_REQUEST_NULL)
      MPI_Request_get_status(pc->reqs[p], &in, MPI_STATUS_IGNORE);
    if (pc->reqs[pc->size + p] != MPI_REQUEST_NULL)
      MPI_Request_get_status(pc->reqs[pc->size + p], &sent, MPI_STATUS_IGNORE);
    if (!in || !sent)
      hvd__ranks_add(&l, p, NULL);
  }
  hvd__ranks_list(&l, out, cap);
}

static void say_preconnect(const pc_t *pc, double age) {
  char who[256];
  pending_ranks(pc, who, sizeof who);
  HVD__LOG(HVD__LOG_WARNING,
           "hvd_init has waited %.1f s for rank(s) %s to connect "
           "(HVD_MPI_PRECONNECT): not yet in hvd_init, or with another "
           "HVD_MPI_PRECONNECT? It must be equal on every rank",
           age, who);
}

/* Waits for pc->reqs[0..n) until HVD_STALL_SHUTDOWN_TIME after the start:
 * after HVD_STALL_CHECK_TIME it names the ranks it waits for (not yet in
 * hvd_init, or with another HVD_MPI_PRECONNECT, which skipped it), then
 * fails with HVD_ERR_STALL naming them, leaving the requests pending for
 * the drain. */
static hvd_result_t wait_reqs(pc_t *pc, int n) {
  char who[256];
  double stop = pc->shutdown > 0 ? pc->t0 + pc->shutdown : 0;
  int got =
      poll_warned(pc->reqs, n, pc, pc->t0, stop, &pc->warned, say_preconnect);
  if (got > 0)
    return HVD_SUCCESS;
  if (got < 0)
    return HVD_ERR_MPI;
  pending_ranks(pc, who, sizeof who);
  return hvd__set_error(HVD_ERR_STALL,
                        "rank(s) %s did not connect within %.1f s "
                        "(HVD_MPI_PRECONNECT=%d here; it must be equal on "
                        "every rank; HVD_STALL_SHUTDOWN_TIME=%g)",
                        who, hvd__now() - pc->t0, pc->value, pc->shutdown);
}

/* Connects every pair of comm's ranks in one order, before hvd's first
 * collective (MPI_Comm_dup is one): each rank sends a byte to every
 * higher rank, and replies to a lower one only once that rank's byte has
 * come. So the lower rank of each pair makes the connection, and no two
 * ranks connect to each other at once. Open MPI (4.1.4) connects a pair
 * over TCP lazily, at its first message; when both ranks of a pair send
 * first at the same moment (as in any allreduce), the connections cross,
 * and under load its TCP transport has been seen to leave a later
 * message unread in the receiver's socket for good: a collective that
 * never ends (doc/slurm.md). Each rank sends and receives size - 1 bytes
 * each way (within a node through shared memory). In jobs of more than
 * HVD_MPI_PRECONNECT ranks (default 64) it does nothing: Open MPI then
 * keeps its lazy connections, each rank connecting to the peers it uses. */
static hvd_result_t exchange(pc_t *pc) {
  hvd_result_t rc = HVD_SUCCESS;
  static const char out = 1; /* outlives a send left pending */
  int r = pc->rank, n = pc->size;
  MPI_Request *recv = pc->reqs, *send = pc->reqs + n;
  /* the lower ranks' bytes; this rank's to the higher ones */
  for (int p = 0; p < n; p++)
    if (p < r)
      HVD__MPI_CHECK(MPI_Irecv(&pc->in[p], 1, MPI_BYTE, p, PRECONNECT_TAG,
                               pc->comm, &recv[p]));
    else if (p > r)
      HVD__MPI_CHECK(
          MPI_Isend(&out, 1, MPI_BYTE, p, PRECONNECT_TAG, pc->comm, &send[p]));
  pc->stage = SENT;
  HVD__CHECK(wait_reqs(pc, r));
  /* then, over the connections those made, the replies */
  for (int p = 0; p < n; p++)
    if (p < r)
      HVD__MPI_CHECK(
          MPI_Isend(&out, 1, MPI_BYTE, p, PRECONNECT_TAG, pc->comm, &send[p]));
    else if (p > r)
      HVD__MPI_CHECK(MPI_Irecv(&pc->in[p], 1, MPI_BYTE, p, PRECONNECT_TAG,
                               pc->comm, &recv[p]));
  pc->stage = REPLIED;
  HVD__CHECK(wait_reqs(pc, 2 * n));
  pc->stage = DONE;
fail:
  return rc;
}

/* exchange under MPI_ERRORS_RETURN (the communicator's own handler
 * restored after). A send that fails is a rank that cannot reach
 * another (Open MPI found no transport to it): the peers wait for its
 * bytes, and its own later MPI calls would hang on the broken pair, so
 * it says so and ends the job with MPI_Abort, after a second that gives
 * Open MPI's own reason (its help message, on its way to mpirun) a chance
 * to get out. Under MPI_ERRORS_ARE_FATAL the abort inside MPI_Isend lost
 * that message about one run in two; mpirun still loses it now and then
 * ("ORTE_ERROR_LOG: Data unpack ... show_help.c"), hence hvd's line. */
static hvd_result_t preconnect(pc_t *pc, double *ms) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Errhandler user = MPI_ERRHANDLER_NULL;
  double t = hvd__now();
  HVD__MPI_CHECK(MPI_Comm_get_errhandler(pc->comm, &user));
  HVD__MPI_CHECK(MPI_Comm_set_errhandler(pc->comm, MPI_ERRORS_RETURN));
  rc = exchange(pc);
  MPI_Comm_set_errhandler(pc->comm, user);
  MPI_Errhandler_free(&user);
  if (rc == HVD_SUCCESS)
    *ms = (hvd__now() - t) * 1e3;
  if (rc == HVD_ERR_MPI) {
    char why[HVD__ERRMSG_MAX];
    snprintf(why, sizeof why, "%s", hvd_last_error());
    rc = hvd__set_error(HVD_ERR_MPI,
                        "hvd_init: rank %d could not send its first message "
                        "to every other rank (HVD_MPI_PRECONNECT): %s; Open "
                        "MPI's reason, when it gives one, is on stderr",
                        pc->rank, why);
    HVD__LOG(HVD__LOG_ERROR, "%s; ending the job with MPI_Abort(%d)",
             hvd_last_error(), (int)rc);
    hvd__end_record_error(hvd_last_error());
    hvd__end_record_abort((int)rc);
    nanosleep(&(struct timespec){1, 0}, NULL);
    MPI_Abort(pc->comm, (int)rc);
  }
fail:
  return rc;
}

/* A fatal HVD_ERR_STALL: requests stay pending on comm (pc->pending: with
 * their buffers), so the job must end at exit (at_exit) rather than have
 * a rank wait in MPI for ever. */
static hvd_result_t stalled(pc_t *pc, const char *what, double age) {
  hvd_result_t rc =
      hvd__set_error(HVD_ERR_STALL,
                     "hvd_init: %s within %.1f s (HVD_STALL_SHUTDOWN_TIME=%g): "
                     "some rank is not in hvd_init",
                     what, age, pc->shutdown);
  hvd__fatal_set(rc, hvd_last_error());
  pc->pending = 1;
  return rc;
}

/* After the agreement (all: every rank's record): every preconnect
 * message sent to this rank received, every receive that no message
 * will match cancelled, and this rank's sends completed (every peer now
 * receives them), so that nothing of this start stays on comm. */
static hvd_result_t drain(pc_t *pc, const int *all) {
  hvd_result_t rc = HVD_SUCCESS;
  int r = pc->rank, n = pc->size;
  for (int p = 0; p < n; p++) {
    int from = p < r ? SENT : REPLIED; /* the stage that sends to r */
    int sent = p != r && all[p * REC_N + REC_STAGE] >= from;
    int asked = p != r && pc->stage >= (p < r ? SENT : REPLIED);
    if (asked && !sent && pc->reqs[p] != MPI_REQUEST_NULL)
      HVD__MPI_CHECK(MPI_Cancel(&pc->reqs[p]));
    else if (!asked && sent)
      HVD__MPI_CHECK(MPI_Irecv(&pc->in[p], 1, MPI_BYTE, p, PRECONNECT_TAG,
                               pc->comm, &pc->reqs[p]));
  }
  double t = hvd__now();
  int got = poll(pc->reqs, 2 * n, pc->shutdown > 0 ? t + pc->shutdown : 0);
  if (got < 0)
    rc = HVD_ERR_MPI;
  else if (got == 0)
    rc = stalled(pc, "the preconnect's messages were not all received",
                 hvd__now() - t);
fail:
  return rc;
}

static void say_agreement(const pc_t *pc, double age) {
  HVD__LOG(HVD__LOG_WARNING,
           "hvd_init has waited %.1f s for the other ranks to agree on "
           "their settings: not yet in hvd_init, or still in their "
           "preconnect (HVD_MPI_PRECONNECT=%d here; it must be equal on "
           "every rank)",
           age, pc->value);
}

/* Every rank's REC_N values into all[0..size * REC_N) (mine at its
 * end), one MPI_Iallgather polled until twice HVD_STALL_SHUTDOWN_TIME
 * after the start: a rank that skipped the preconnect waits for the
 * others' preconnects to stall first. */
static hvd_result_t gather(pc_t *pc, int *all) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request req = MPI_REQUEST_NULL;
  const int *mine = all + (size_t)pc->size * REC_N;
  double stop = pc->shutdown > 0 ? pc->t0 + 2 * pc->shutdown : 0;
  int warned = 0; /* its own warning, after the preconnect's */
  HVD__MPI_CHECK(MPI_Iallgather(mine, REC_N, MPI_INT, all, REC_N, MPI_INT,
                                pc->comm, &req));
  int got = poll_warned(&req, 1, pc, hvd__now(), stop, &warned, say_agreement);
  if (got < 0)
    rc = HVD_ERR_MPI;
  else if (got == 0)
    rc = stalled(pc, "the ranks did not all agree on their settings",
                 hvd__now() - pc->t0);
fail:
  return rc;
}

/* rank `first`'s message msg (HVD__ERRMSG_MAX bytes) to every rank, one
 * MPI_Ibcast bounded as the drain (a rank that gave up at a fatal stall
 * and left hvd_init would never send it). */
static hvd_result_t tell(pc_t *pc, int first, char *msg) {
  hvd_result_t rc = HVD_SUCCESS;
  MPI_Request req = MPI_REQUEST_NULL;
  char *buf = malloc(HVD__ERRMSG_MAX); /* stays with a request left pending */
  if (buf == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_init: the agreement");
  memcpy(buf, msg, HVD__ERRMSG_MAX);
  HVD__MPI_CHECK(
      MPI_Ibcast(buf, HVD__ERRMSG_MAX, MPI_CHAR, first, pc->comm, &req));
  double t = hvd__now();
  int got = poll(&req, 1, pc->shutdown > 0 ? t + pc->shutdown : 0);
  if (got < 0)
    rc = HVD_ERR_MPI;
  if (got == 0) {
    char what[64];
    snprintf(what, sizeof what, "rank %d's error did not come", first);
    return stalled(pc, what, hvd__now() - t);
  }
  memcpy(msg, buf, HVD__ERRMSG_MAX);
  msg[HVD__ERRMSG_MAX - 1] = '\0';
fail:
  free(buf);
  return rc;
}

/* The lowest rank whose record says `failed`, or -1. */
static int lowest(const pc_t *pc, const int *all, int failed) {
  for (int r = 0; r < pc->size; r++)
    if (all[r * REC_N + REC_FAILED] == failed)
      return r;
  return -1;
}

/* Every rank's one result from the records (start.h): a settings error
 * (each failing rank its own), the values of HVD_MPI_PRECONNECT that
 * differ, a preconnect's stall. msg: this rank's message. */
static hvd_result_t verdict(pc_t *pc, const int *all, hvd_result_t mine,
                            char *msg) {
  hvd_result_t rc = HVD_SUCCESS;
  int first = lowest(pc, all, FAILED_SETTINGS);
  char v[32], head[128], out[HVD__ERRMSG_MAX];
  if (first >= 0) {
    char own[HVD__ERRMSG_MAX];
    snprintf(own, sizeof own, "%s", msg);
    HVD__CHECK(tell(pc, first, msg));
    if (mine != HVD_SUCCESS && all[pc->rank * REC_N] == FAILED_SETTINGS)
      return hvd__set_error_msg(mine, own);
    return hvd__set_error(HVD_ERR_INVALID_ARG, "hvd_init: rank %d: %s", first,
                          msg);
  }
  hvd__ranks_t l;
  hvd__ranks_begin(&l);
  for (int r = 1; r < pc->size; r++)
    if (all[r * REC_N + REC_VALUE] != all[REC_VALUE]) {
      snprintf(v, sizeof v, "%d", all[r * REC_N + REC_VALUE]);
      hvd__ranks_add(&l, r, v);
    }
  snprintf(head, sizeof head,
           "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 %d",
           all[REC_VALUE]);
  if (hvd__ranks_write(&l, head, out, sizeof out) > 0)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s", out);
  if ((first = lowest(pc, all, FAILED_PRECONNECT)) >= 0) {
    HVD__CHECK(tell(pc, first, msg));
    return hvd__set_error(HVD_ERR_STALL, "hvd_init: rank %d: %s", first, msg);
  }
fail:
  return rc;
}

/* The agreement, the drain, the verdict. mine: this rank's failure (its
 * message in msg), as `failed` (FAILED_*). */
static hvd_result_t agree(pc_t *pc, hvd_result_t mine, int failed, char *msg) {
  hvd_result_t rc = HVD_SUCCESS;
  int *all = calloc((size_t)(pc->size + 1) * REC_N, sizeof *all);
  if (all == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_init: the agreement");
  int *rec = all + (size_t)pc->size * REC_N;
  rec[REC_FAILED] = failed;
  rec[REC_VALUE] = pc->value;
  rec[REC_STAGE] = pc->stage;
  rc = gather(pc, all);
  if (rc == HVD_SUCCESS)
    rc = drain(pc, all);
  if (rc == HVD_SUCCESS)
    rc = verdict(pc, all, mine, msg);
  if (!pc->pending) /* else the allgather may still write it */
    free(all);
  return rc;
}

hvd_result_t hvd__start_agree(MPI_Comm comm, const hvd__settings_t *s,
                              hvd_result_t loaded, const char *why,
                              double *ms) {
  hvd_result_t rc = HVD_SUCCESS, mine = loaded;
  pc_t pc = {.comm = comm,
             .value = s->preconnect,
             .t0 = hvd__now(),
             .check = s->stall_check_s,
             .shutdown = s->stall_shutdown_s};
  char msg[HVD__ERRMSG_MAX];
  int failed = loaded != HVD_SUCCESS ? FAILED_SETTINGS : FAILED_NOT;
  snprintf(msg, sizeof msg, "%s", loaded != HVD_SUCCESS ? why : "");
  *ms = -1;
  HVD__MPI_CHECK(MPI_Comm_rank(comm, &pc.rank));
  HVD__MPI_CHECK(MPI_Comm_size(comm, &pc.size));
  pc.reqs = malloc((size_t)pc.size * 2 * sizeof *pc.reqs);
  pc.in = malloc((size_t)pc.size);
  if (pc.reqs == NULL || pc.in == NULL) {
    free(pc.in);
    free(pc.reqs);
    return hvd__set_error(HVD_ERR_NO_MEMORY, "hvd_init: preconnect requests");
  }
  for (int p = 0; p < 2 * pc.size; p++)
    pc.reqs[p] = MPI_REQUEST_NULL;
  if (pc.size >= 2 && pc.size <= pc.value &&
      (rc = preconnect(&pc, ms)) != HVD_SUCCESS && failed == FAILED_NOT) {
    mine = rc;
    failed = FAILED_PRECONNECT;
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  }
  rc = agree(&pc, mine, failed, msg);
  if (pc.pending) /* their buffers stay with them */
    return rc;
  free(pc.in);
  free(pc.reqs);
fail:
  return rc;
}
