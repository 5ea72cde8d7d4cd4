/*
 * nccl_fail.c - how the NCCL executor fails, and fails within a bound
 * (nccl_ops.c's header says what each failure does): waiting for the
 * non-blocking communicator within HVD_NCCL_TIMEOUT, aborting it, the
 * abort notices a rank sends its peers over MPI so that they stop
 * waiting for it at once, and the agreement on a group's allocations and
 * on every rank's NCCL before anything is launched.
 */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/log.h"
#include "base/wait.h"
#include "ops/nccl_int.h"

/* HVD_ERR_NCCL "<what>: <ncclGetErrorString> (<ncclGetLastError>)", what
 * cut at its first '(' as for hvd__mpi_error. */
hvd_result_t hvd__nccl_error(ncclResult_t r, const char *what) {
  const char *last = ncclGetLastError(NULL);
  int fn = (int)strcspn(what, "(");
  if (last != NULL && last[0] != '\0')
    return hvd__set_error(HVD_ERR_NCCL, "%.*s: %s (%s)", fn, what,
                          ncclGetErrorString(r), last);
  return hvd__set_error(HVD_ERR_NCCL, "%.*s: %s", fn, what,
                        ncclGetErrorString(r));
}

/* The communicator is non-blocking (ncclConfig_t.blocking = 0): a call that
 * has to wait for peers (making the communicator, the connections NCCL
 * makes on first use, a collective's enqueue behind them, finalize)
 * returns ncclInProgress and goes on in NCCL's own threads. Until
 * ncclCommGetAsyncError no longer says ncclInProgress, no other NCCL call
 * and no kernel on hvd's stream may be issued. Waiting here (with
 * hvd__wait_backoff) bounds that wait by HVD_NCCL_TIMEOUT: a blocking
 * communicator would block inside NCCL, with no timeout, when a peer never
 * comes. Returns the call's final result; *timed_out when it gave up. */
ncclResult_t hvd__nccl_settle_wait(ncclComm_t comm, ncclResult_t r,
                                   double timeout_s, int *timed_out) {
  double t0 = hvd__now();
  *timed_out = 0;
  for (unsigned spin = 0; r == ncclInProgress; spin++) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess)
      return q;
    if (state != ncclInProgress)
      return state;
    if (timeout_s > 0 && hvd__now() - t0 > timeout_s) {
      *timed_out = 1;
      return ncclInProgress;
    }
    hvd__wait_backoff(spin);
  }
  return r;
}

/* hvd__nccl_settle_wait() as an hvd result: NCCL's error, or HVD_ERR_NCCL
 * "<what>: still in progress after <t> s (HVD_NCCL_TIMEOUT): ...". */
hvd_result_t hvd__nccl_settle(nccl_state_t *s, ncclResult_t r,
                              const char *what) {
  int timed_out = 0;
  r = hvd__nccl_settle_wait(s->comm, r, s->timeout_s, &timed_out);
  if (timed_out)
    return hvd__set_error(HVD_ERR_NCCL,
                          "%.*s: still in progress after %g s "
                          "(HVD_NCCL_TIMEOUT): a peer failed, is gone or is "
                          "stuck",
                          (int)strcspn(what, "("), what, s->timeout_s);
  return r == ncclSuccess ? HVD_SUCCESS : hvd__nccl_error(r, what);
}

/* The tag of abort notices on the executor's MPI communicator (nothing
 * else there uses point-to-point messages). */
#define NOTICE_TAG 0x4e43

/* Reads a peer's abort notice, if one came: its reason into why[len], its
 * world rank into *from; 1 when there was one. A peer whose communicator
 * is gone never comes to the collectives this rank waits in; without the
 * notice this rank would learn it only from HVD_NCCL_TIMEOUT. */
static int recv_notice(nccl_state_t *s, char *why, size_t len, int *from) {
  int flag = 0;
  MPI_Status st;
  if (s->size < 2 ||
      MPI_Iprobe(MPI_ANY_SOURCE, NOTICE_TAG, s->mpi, &flag, &st) !=
          MPI_SUCCESS ||
      !flag)
    return 0;
  memset(why, 0, len);
  if (MPI_Recv(why, (int)len - 1, MPI_CHAR, st.MPI_SOURCE, NOTICE_TAG, s->mpi,
               MPI_STATUS_IGNORE) != MPI_SUCCESS)
    snprintf(why, len, "(its notice could not be read)");
  *from =
      s->world_ranks != NULL ? s->world_ranks[st.MPI_SOURCE] : st.MPI_SOURCE;
  return 1;
}

/* 1 when a peer's notice has come (kept in s->heard*; heard_at is a
 * clock time, not one wait's: every collective in flight gets the same
 * grace from it, whichever of them was polled when it came). */
static int heard(nccl_state_t *s) {
  if (!s->heard &&
      recv_notice(s, s->heard_why, sizeof s->heard_why, &s->heard_from)) {
    s->heard = 1;
    s->heard_at = hvd__now();
  }
  return s->heard;
}

/* A peer's notice, acted on: HVD_ERR_NCCL "rank R aborted its NCCL
 * communicator: <its reason>" (R a world rank). */
hvd_result_t hvd__nccl_peer_notice(nccl_state_t *s) {
  if (!heard(s))
    return HVD_SUCCESS;
  s->from_peer = 1;
  return hvd__set_error(HVD_ERR_NCCL,
                        "rank %d aborted its NCCL communicator: %s",
                        s->heard_from, s->heard_why);
}

/* A collective in flight when a peer's notice comes may still finish (the
 * peer did its part before it failed): it gets this long to. */
#define NOTICE_GRACE_S 0.25

/* This rank aborted on a failure of its own: every peer is told why. */
static void send_notices(nccl_state_t *s, const char *why) {
  if (s->size < 2 || s->sent != NULL ||
      (s->sent = malloc((size_t)s->size * sizeof *s->sent)) == NULL)
    return;
  snprintf(s->notice, sizeof s->notice, "%.*s", (int)sizeof s->notice - 1, why);
  for (int q = 0; q < s->size; q++) {
    s->sent[q] = MPI_REQUEST_NULL;
    if (q != s->rank)
      MPI_Isend(s->notice, (int)strlen(s->notice) + 1, MPI_CHAR, q, NOTICE_TAG,
                s->mpi, &s->sent[q]);
  }
}

/* At close: the notices sent are finished (within a second: a peer gone
 * never takes them; then the requests are let go, and the state with its
 * buffer kept), and those that came and were not read are read. Returns 0
 * when the state must be kept. */
int hvd__nccl_end_notices(nccl_state_t *s) {
  int done = 1;
  if (s->sent != NULL) {
    double t0 = hvd__now();
    for (unsigned spin = 0;; spin++) {
      if (MPI_Testall(s->size, s->sent, &done, MPI_STATUSES_IGNORE) !=
              MPI_SUCCESS ||
          done || hvd__now() - t0 > 1.0)
        break;
      hvd__wait_backoff(spin);
    }
    for (int q = 0; !done && q < s->size; q++)
      if (s->sent[q] != MPI_REQUEST_NULL)
        MPI_Request_free(&s->sent[q]);
  }
  char why[HVD__NCCL_WHY_MAX];
  int from;
  while (recv_notice(s, why, sizeof why, &from))
    ; /* notices that came and were not read */
  return done;
}

/* While waiting: NCCL's asynchronous error, a peer's abort notice, and
 * the timeout. */
hvd_result_t hvd__nccl_poll(void *ctx, double waited_s) {
  nccl_state_t *s = ctx;
  if (heard(s) && hvd__now() - s->heard_at > NOTICE_GRACE_S)
    return hvd__nccl_peer_notice(s);
  ncclResult_t st = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(s->comm, &st);
  if (r != ncclSuccess)
    return hvd__nccl_error(r, "ncclCommGetAsyncError");
  if (st != ncclSuccess && st != ncclInProgress)
    return hvd__nccl_error(st, "asynchronous error");
  if (s->timeout_s > 0 && waited_s > s->timeout_s)
    return hvd__set_error(HVD_ERR_NCCL,
                          "no completion after %g s (HVD_NCCL_TIMEOUT): a "
                          "peer failed, is gone or is stuck",
                          s->timeout_s);
  return HVD_SUCCESS;
}

/* After a failure once the communicator exists: aborts it and remembers
 * why. Returns rc with "NCCL: <why>; the communicator was aborted". */
hvd_result_t hvd__nccl_abandon(nccl_state_t *s, hvd_result_t rc) {
  char why[HVD__ERRMSG_MAX];
  snprintf(why, sizeof why, "%s", hvd_last_error());
  hvd__gpu_mark_failed(&s->gpu); /* before the abort ends their kernels */
  ncclCommAbort(s->comm);
  s->comm = NULL;
  if (!s->from_peer)
    send_notices(s, why);
  (void)cudaGetLastError();
  snprintf(s->failed, sizeof s->failed, "%s", why);
  HVD__LOG(HVD__LOG_ERROR, "NCCL: %s; the communicator was aborted", why);
  return hvd__set_error(rc, "NCCL: %.900s; the communicator was aborted", why);
}

/* MPI_MIN over the ranks of (ok ? size : rank): the first rank that
 * failed, or size. */
hvd_result_t hvd__nccl_first_failed(const hvd__exec_env_t *env, int ok,
                                    int *first) {
  hvd_result_t rc = HVD_SUCCESS;
  int mine = ok ? env->size : env->rank;
  HVD__MPI_CHECK(MPI_Allreduce(&mine, first, 1, MPI_INT, MPI_MIN, env->comm));
fail:
  return rc;
}

/* The scratch only grows, from sizes every rank computes alike (the
 * group's members and ranks), so whether it grows is the same on every
 * rank; when it does (rarely), whether it could on every rank is agreed in
 * one MPI_Allreduce. When some rank could not, every rank drops it, so
 * that they grow alike again, and *ok is 0 everywhere. Every rank grows
 * it, also one whose NCCL failed: its next growth must be the others'. */
hvd_result_t hvd__nccl_scratch(nccl_state_t *s, const hvd__exec_env_t *env,
                               size_t bytes, const char *what, int *ok,
                               hvd_result_t *mine) {
  hvd_result_t rc = HVD_SUCCESS;
  int first = env->size;
  *ok = 1;
  if (bytes <= s->fdims_bytes)
    return HVD_SUCCESS;
  int64_t *p = hvd__fault("scratch") ? NULL : realloc(s->fdims, bytes);
  if (p != NULL) {
    s->fdims = p;
    s->fdims_bytes = bytes;
  }
  HVD__CHECK(hvd__nccl_first_failed(env, p != NULL, &first));
  if (first == env->size)
    return HVD_SUCCESS;
  free(s->fdims);
  s->fdims = NULL;
  s->fdims_bytes = 0;
  *ok = 0;
  if (p == NULL && *mine == HVD_SUCCESS)
    *mine = hvd__set_error(HVD_ERR_NO_MEMORY,
                           "%s: no host memory for %zu bytes", what, bytes);
fail:
  return rc;
}

hvd_result_t hvd__nccl_unusable(const nccl_state_t *s) {
  return hvd__set_error(HVD_ERR_NCCL,
                        "NCCL is unusable after an earlier failure: %.900s",
                        s->failed);
}

/* What a rank brings to an agreement, the most telling first: its NCCL
 * aborted on a failure of its own; aborted, or about to be, on a peer's
 * word (never the one named while the peer itself takes part); a failure
 * that launched nothing (an allocation, or nccl_enter's own check); ready.
 * MPI_MIN over the ranks of class * size + rank picks the rank that every
 * rank then names. */
enum { GONE_OWN, GONE_PEER, UNPREPARED, READY };

/* What the rank an agreement names sends every rank. */
struct agree_msg {
  int rc;
  char why[HVD__NCCL_WHY_MAX];
};

static int agree_class(const nccl_state_t *s, hvd_result_t mine) {
  if (s->failed[0] != '\0' || s->from_peer)
    return s->from_peer ? GONE_PEER : GONE_OWN;
  return mine == HVD_SUCCESS ? READY : UNPREPARED;
}

/* Every rank has learnt in one agreement that rank `first`'s NCCL is gone,
 * so NCCL is unusable everywhere, and every rank knows it (all_failed:
 * later device collectives fail at once on every rank, with no MPI step).
 * A rank whose communicator still worked aborts it with the words a
 * notice would have given it, and sends none (every peer learnt it here);
 * one that had failed already says so. */
static hvd_result_t agreed_gone(nccl_state_t *s, const hvd__exec_env_t *env,
                                int first, const char *why) {
  int from =
      s->world_ranks != NULL ? s->world_ranks[first] : first; /* as notices */
  s->all_failed = 1;
  if (s->failed[0] != '\0')
    return hvd__nccl_unusable(s);
  if (env->rank == first) /* a peer's notice, acted on at entry */
    hvd__set_error(HVD_ERR_NCCL, "%s", why);
  else
    hvd__set_error(HVD_ERR_NCCL, "rank %d aborted its NCCL communicator: %s",
                   from, why);
  s->from_peer = 1;
  return hvd__nccl_abandon(s, HVD_ERR_NCCL);
}

/* One round of the agreement: MPI_MIN over the ranks of agree_class *
 * size + rank into *least; when that is not READY, the rank it names
 * sends every rank its reason (its NCCL's, or its error) in *msg. */
static hvd_result_t agree_round(nccl_state_t *s, const hvd__exec_env_t *env,
                                hvd_result_t mine, int *least,
                                struct agree_msg *msg) {
  hvd_result_t rc = HVD_SUCCESS;
  int v = agree_class(s, mine) * env->size + env->rank;
  *least = READY * env->size;
  HVD__MPI_CHECK(MPI_Allreduce(&v, least, 1, MPI_INT, MPI_MIN, env->comm));
  if (*least / env->size == READY)
    return HVD_SUCCESS;
  int first = *least % env->size;
  memset(msg, 0, sizeof *msg);
  msg->rc = (int)mine;
  if (env->rank == first)
    snprintf(msg->why, sizeof msg->why, "%.*s", (int)sizeof msg->why - 1,
             s->failed[0] != '\0' ? s->failed : hvd_last_error());
  HVD__MPI_CHECK(MPI_Bcast(msg, (int)sizeof *msg, MPI_BYTE, first, env->comm));
fail:
  return rc;
}

/* Before anything of a group is launched: its allocations (outputs, the
 * fusion buffer, span arrays; `allocated` when this group may have made
 * one, which every rank decides alike) and the state of every rank's NCCL
 * agreed over MPI. Every rank takes part, also one whose NCCL failed
 * earlier (nccl_run passes its failure in as `mine`), so that no rank
 * waits here for a peer that will never come. When some rank's NCCL is
 * gone (aborted: on its own failure, before or while this group quiesced,
 * or on a notice), every rank fails the group and NCCL for good
 * (agreed_gone): its words are "rank R aborted its NCCL communicator:
 * <R's reason>", as a notice's. Else a rank that could not prepare sends
 * its error to all, every rank drops its device scratch (which quiesces:
 * a group in flight may fail there and abort NCCL on its rank, so NCCL's
 * state is agreed once more, and a loss is agreed_gone's as above), and
 * every rank fails the group with the same words: "rank R could not
 * prepare the collective on its GPU: <R's error>; nothing was launched,
 * NCCL is still usable", which is then true on every rank; the
 * communicator is not aborted (an abort would cost the peers
 * HVD_NCCL_TIMEOUT and NCCL for good). */
hvd_result_t hvd__nccl_agree_prepared(nccl_state_t *s,
                                      const hvd__exec_env_t *env, int allocated,
                                      hvd_result_t mine) {
  struct agree_msg msg, again;
  int least = 0;
  hvd_result_t rc = HVD_SUCCESS;
  if (mine == HVD_SUCCESS && s->failed[0] != '\0') /* while quiescing */
    mine = hvd__nccl_unusable(s);
  if (!allocated)
    return mine;
  HVD__CHECK(agree_round(s, env, mine, &least, &msg));
  if (least / env->size == READY)
    return HVD_SUCCESS;
  int first = least % env->size;
  if (least / env->size != UNPREPARED)
    return agreed_gone(s, env, first, msg.why);
  hvd__gpu_release(&s->gpu); /* every rank grows from nothing again */
  HVD__CHECK(agree_round(s, env, mine, &least, &again));
  if (least / env->size < UNPREPARED) /* lost in the release's quiesce */
    return agreed_gone(s, env, least % env->size, again.why);
  s->unlaunched = 1;
  HVD__LOG(HVD__LOG_ERROR,
           "rank %d could not prepare a device collective: %s; nothing was "
           "launched",
           first, msg.why);
  return hvd__set_error((hvd_result_t)msg.rc,
                        "rank %d could not prepare the collective on its "
                        "GPU: %s; nothing was launched, NCCL is still usable",
                        first, msg.why);
fail:
  return rc;
}
