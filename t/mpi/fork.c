/*
 * fork.c - a child made by fork() after hvd_init (a data-loader worker,
 * a helper that never execs) has a copy of hvd's memory but none of its
 * threads, and MPI is the parent's. In it:
 *   - the topology queries answer the parent's rank and size, and
 *     hvd_is_initialized() is 0;
 *   - every call that communicates or waits (a collective, an async one,
 *     hvd_wait and hvd_test on the parent's request, a process set,
 *     hvd_broadcast_parameters, the timeline, hvd_checkpoint_wait on the
 *     parent's save) fails at once with HVD_ERR_NOT_INITIALIZED and a
 *     message naming the fork, instead of waiting for ever;
 *   - hvd_init refuses (HVD_ERR_UNSUPPORTED), hvd_shutdown does nothing;
 *   - its timeline marks go nowhere (not into the parent's file);
 *   - hvd_alloc_host gives it private blocks, and freeing the parent's
 *     block leaves the parent's data as it was;
 *   - it exits with exit(), through hvd's exit handlers, with status 0
 *     (before: a crash in MPI_Finalize, or a hang joining the parent's
 *     checkpoint writer), and with HVD_END_DIR set it writes nothing in
 *     the rank's end record (t/mpi/fork.sh).
 * The parent then goes on: collectives, its checkpoint, hvd_shutdown.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd.h"
#include "hvdtest.h"
#include "tap/tap.h"

#define MSG_LEN 512

static int rank, size;

/* What the child saw, in memory it shares with the parent. */
struct report {
  int checks, failures;
  char first[MSG_LEN];
};

static struct report *rep;

static void child_fail(const char *fmt, ...) TAP_PRINTF(1, 2);
static void child_fail(const char *fmt, ...) {
  if (rep->failures++ > 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rep->first, sizeof rep->first, fmt, ap);
  va_end(ap);
}

/* In the child: rc and the message of the call just made. */
static void expect(hvd_result_t rc, hvd_result_t want_rc, const char *want,
                   const char *what) {
  rep->checks++;
  if (rc != want_rc || strcmp(hvd_last_error(), want) != 0)
    child_fail("%s: %s '%s', expected %s '%s'", what, hvd_strerror(rc),
               hvd_last_error(), hvd_strerror(want_rc), want);
}

/* "<fn>: this process (pid C) was forked from rank R (pid P) after
 * hvd_init; ..." */
static void forked_msg(char *out, size_t len, const char *fn, long parent) {
  snprintf(out, len,
           "%s: this process (pid %ld) was forked from rank %d (pid %ld) "
           "after hvd_init; hvd's engine, MPI and NCCL stay with that "
           "process, so collectives can only be made there",
           fn, (long)getpid(), rank, parent);
}

/* What the parent left the child: a request in flight, a save in flight
 * (rank 0's writer thread), an arena block with a pattern. */
struct inherited {
  long parent;
  hvd_request_t *pending;
  hvd_checkpoint_request_t *save;
  hvd_process_set_t *set; /* every rank's, by hvd_process_set_split */
  hvd_optimizer_t *opt;   /* a distributed SGD */
  float *block;
  int64_t n;
};

static void child_calls(const struct inherited *in) {
  char want[MSG_LEN];
  float x[4] = {1, 2, 3, 4};
  int64_t four = 4;
  hvd_tensor_t t = hvd_tensor_make(x, HVD_FLOAT32, 1, &four);
  hvd_request_t *req = NULL;
  rep->checks++;
  if (hvd_is_initialized() != 0 || hvd_rank() != rank || hvd_size() != size)
    child_fail("hvd_is_initialized %d (expected 0), rank %d, size %d",
               hvd_is_initialized(), hvd_rank(), hvd_size());
  forked_msg(want, sizeof want, "hvd_allreduce", in->parent);
  expect(hvd_allreduce("c", &t, &t, HVD_SUM, 1, 1), HVD_ERR_NOT_INITIALIZED,
         want, "hvd_allreduce");
  forked_msg(want, sizeof want, "hvd_allreduce_async", in->parent);
  expect(hvd_allreduce_async("c", &t, &t, HVD_SUM, 1, 1, &req),
         HVD_ERR_NOT_INITIALIZED, want, "hvd_allreduce_async");
  forked_msg(want, sizeof want, "hvd_barrier", in->parent);
  expect(hvd_barrier(), HVD_ERR_NOT_INITIALIZED, want, "hvd_barrier");
  forked_msg(want, sizeof want, "hvd_wait", in->parent);
  expect(hvd_wait(in->pending), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_wait on the parent's request");
  int done = -1;
  forked_msg(want, sizeof want, "hvd_test", in->parent);
  expect(hvd_test(in->pending, &done), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_test on the parent's request");
  rep->checks++;
  if (done != 0)
    child_fail("hvd_test set *done to %d, expected 0", done);
  int ranks[1] = {0};
  hvd_process_set_t *ps = (hvd_process_set_t *)(uintptr_t)1; /* not NULL */
  forked_msg(want, sizeof want, "hvd_process_set_create", in->parent);
  expect(hvd_process_set_create(ranks, 1, &ps), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_process_set_create");
  hvd_process_set_t *split = ps;
  forked_msg(want, sizeof want, "hvd_process_set_split", in->parent);
  expect(hvd_process_set_split(0, &split), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_process_set_split");
  rep->checks++;
  if (ps != NULL || split != NULL)
    child_fail("a refused process set's *out is not NULL");
  hvd_param_t p = {"w", t, t};
  forked_msg(want, sizeof want, "hvd_broadcast_parameters", in->parent);
  expect(hvd_broadcast_parameters(&p, 1, 0), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_broadcast_parameters");
  /* a set's and a distributed optimizer's calls, in their own names
   * (they once named the collective under them) */
  forked_msg(want, sizeof want, "hvd_ps_allreduce", in->parent);
  expect(hvd_ps_allreduce(in->set, "c", &t, &t, HVD_SUM, 1, 1),
         HVD_ERR_NOT_INITIALIZED, want, "hvd_ps_allreduce");
  forked_msg(want, sizeof want, "hvd_optimizer_grad_ready", in->parent);
  expect(hvd_optimizer_grad_ready(in->opt, 0), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_optimizer_grad_ready");
  forked_msg(want, sizeof want, "hvd_optimizer_step", in->parent);
  expect(hvd_optimizer_step(in->opt), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_optimizer_step");
  forked_msg(want, sizeof want, "hvd_timeline_stop", in->parent);
  expect(hvd_timeline_stop(), HVD_ERR_NOT_INITIALIZED, want,
         "hvd_timeline_stop");
  hvd_timeline_mark("child.mark"); /* nowhere: checked in the file */
  if (in->save != NULL) {
    forked_msg(want, sizeof want, "hvd_checkpoint_wait", in->parent);
    expect(hvd_checkpoint_wait(in->save), HVD_ERR_NOT_INITIALIZED, want,
           "hvd_checkpoint_wait on the parent's save");
  }
  snprintf(want, sizeof want,
           "hvd_init: this process (pid %ld) was forked from rank %d (pid "
           "%ld) after hvd_init; hvd cannot start again in it (MPI is that "
           "process's): fork before hvd_init, or exec a program",
           (long)getpid(), rank, in->parent);
  expect(hvd_init(), HVD_ERR_UNSUPPORTED, want, "hvd_init");
  rep->checks++;
  if (hvd_shutdown() != HVD_SUCCESS)
    child_fail("hvd_shutdown: %s", hvd_last_error());
}

/* In the child: its own blocks are private, and freeing the parent's
 * block touches nothing of the parent's. */
static void child_memory(const struct inherited *in) {
  rep->checks++;
  float *mine = hvd_alloc_host((size_t)in->n * sizeof(float));
  if (mine == NULL) {
    child_fail("hvd_alloc_host: %s", hvd_last_error());
    return;
  }
  for (int64_t i = 0; i < in->n; i++)
    mine[i] = -7.0f; /* would show in the parent's next block if shared */
  if (hvd_free_host(in->block) != HVD_SUCCESS)
    child_fail("hvd_free_host(the parent's block): %s", hvd_last_error());
  /* mine is not freed: the exit leaves it, as a worker would */
}

/* The parent: waits up to 30 s for the child; 1 when it exited 0. */
static int reap(pid_t c, char *why, size_t len) {
  int st = 0;
  for (int k = 0; k < 3000; k++) {
    pid_t r = waitpid(c, &st, WNOHANG);
    if (r == c) {
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 1;
      snprintf(why, len, "the child %s %d",
               WIFSIGNALED(st) ? "died of signal" : "exited with status",
               WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      return 0;
    }
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  kill(c, SIGKILL);
  waitpid(c, &st, 0);
  snprintf(why, len, "the child hung (killed after 30 s)");
  return 0;
}

/* A save in flight on every rank (rank 0's file written by its thread). */
static hvd_checkpoint_request_t *start_save(const char *dir, hvd_param_t *p) {
  char path[300];
  hvd_checkpoint_request_t *q = NULL;
  snprintf(path, sizeof path, "%s/a.ckpt", dir);
  if (hvd_checkpoint_save_async(path, p, 1, NULL, 1, &q) != HVD_SUCCESS)
    bail("hvd_checkpoint_save_async: %s", hvd_last_error());
  return q;
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  if (!is_int(HVD_SUCCESS, hvd_init(), "hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  char dir[256], tl[300];
  hvdt_shared_tmpdir(dir, sizeof dir, "hvd-fork");
  snprintf(tl, sizeof tl, "%s/timeline.json", dir);
  is_int(HVD_SUCCESS, hvd_timeline_start(tl), "hvd_timeline_start");
  rep = mmap(NULL, sizeof *rep, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (rep == MAP_FAILED)
    bail("mmap: %s", strerror(errno));
  memset(rep, 0, sizeof *rep);

  struct inherited in = {.parent = (long)getpid(), .n = 100000};
  static float w[1 << 16];
  int64_t wn = 1 << 16;
  hvd_param_t p = {"w", hvd_tensor_make(w, HVD_FLOAT32, 1, &wn),
                   hvd_tensor_make(w, HVD_FLOAT32, 1, &wn)};
  in.block = hvd_alloc_host((size_t)in.n * sizeof(float));
  if (in.block == NULL)
    bail("hvd_alloc_host: %s", hvd_last_error());
  for (int64_t i = 0; i < in.n; i++)
    in.block[i] = (float)(i % 1000);
  /* a name only this rank submits (more than one rank): still pending */
  char pname[32];
  float px[4] = {0};
  int64_t four = 4;
  hvd_tensor_t pt = hvd_tensor_make(px, HVD_FLOAT32, 1, &four);
  snprintf(pname, sizeof pname, "pending.r%d", rank);
  if (hvd_allreduce_async(pname, &pt, &pt, HVD_SUM, 1, 1, &in.pending) !=
      HVD_SUCCESS)
    bail("%s: %s", pname, hvd_last_error());
  in.save = start_save(dir, &p);
  if (hvd_process_set_split(0, &in.set) != HVD_SUCCESS)
    bail("hvd_process_set_split: %s", hvd_last_error());
  static float ow[8], og[8];
  int64_t eight = 8;
  hvd_param_t op = {"o", hvd_tensor_make(ow, HVD_FLOAT32, 1, &eight),
                    hvd_tensor_make(og, HVD_FLOAT32, 1, &eight)};
  hvd_sgd_options_t so;
  hvd_sgd_options_init(&so);
  hvd_distributed_options_t dopt;
  hvd_distributed_options_init(&dopt);
  hvd_optimizer_t *base = NULL;
  if (hvd_sgd_create(&op, 1, &so, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &dopt, &in.opt) != HVD_SUCCESS)
    bail("a distributed SGD: %s", hvd_last_error());

  fflush(NULL);
  pid_t c = fork();
  if (c == 0) {
    child_calls(&in);
    child_memory(&in);
    if (getenv("HVD_END_DIR") != NULL && rank == 0)
      abort(); /* its signal must not become rank 0's record (fork.sh) */
    exit(0);   /* through the exit handlers */
  }
  if (c < 0)
    bail("fork: %s", strerror(errno));
  char why[200] = "";
  int crash = getenv("HVD_END_DIR") != NULL && rank == 0;
  int ended = reap(c, why, sizeof why);
  tap_note("%s", why);
  ok(crash ? !ended && strstr(why, "signal 6") != NULL : ended, "the child %s",
     crash ? "dies of SIGABRT (HVD_END_DIR set, rank 0)"
           : "exits with status 0 through the exit "
             "handlers, within 30 s");
  if (crash) { /* the child's abort said nothing for rank 0 */
    char rec[300];
    snprintf(rec, sizeof rec, "%s/rank.0", getenv("HVD_END_DIR"));
    char *text = hvdt_slurp(rec);
    tap_note("%s: %s", rec, text ? text : "cannot read");
    ok(text != NULL && strstr(text, "state running\n") != NULL &&
           strstr(text, "signal") == NULL,
       "rank 0's end record still says running, not the child's signal");
    free(text);
  } else if (getenv("HVD_END_DIR") != NULL) {
    ok(1, "rank 0's end record still says running, not the child's signal");
  }
  tap_note("%s", rep->first);
  is_int(0, rep->failures,
         "in the child, of %d checks: queries answer; every call that "
         "communicates or waits fails at once naming the fork; hvd_init "
         "refused; hvd_shutdown a no-op",
         rep->checks);

  /* the parent's block is as it was; its next block is its own */
  int same = 1;
  for (int64_t i = 0; i < in.n && same; i++)
    same = in.block[i] == (float)(i % 1000);
  ok(same, "the parent's block is untouched by the child's hvd_free_host");
  float *next = hvd_alloc_host((size_t)in.n * sizeof(float));
  int clean = next != NULL;
  for (int64_t i = 0; clean && i < in.n; i++)
    clean = next[i] == 0.0f;
  ok(clean, "the parent's next block is zero-filled (not the child's)");
  hvd_free_host(next);
  hvd_free_host(in.block);

  is_int(HVD_SUCCESS, hvd_checkpoint_wait(in.save),
         "the parent's save completes");
  hvdt_allreduce_works(NULL, HVD_FLOAT32, 5, "the parent's allreduce");
  hvd_optimizer_destroy(in.opt);
  is_int(HVD_SUCCESS, hvd_process_set_destroy(in.set),
         "the parent's process set is destroyed");
  is_int(HVD_SUCCESS, hvd_timeline_stop(), "hvd_timeline_stop");
  int clean_tl = 1;
  if (rank == 0) {
    char *text = hvdt_slurp(tl);
    int n = 0;
    struct hvdt_event *ev = text ? hvdt_timeline_parse(text, &n) : NULL;
    clean_tl = ev != NULL && strstr(text, "child.mark") == NULL;
    free(ev);
    free(text);
  }
  ok(clean_tl, "the timeline is JSON, without the child's mark");
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  /* the pending request ends with the shutdown (more than one rank) */
  hvd_result_t prc = hvd_wait(in.pending);
  is_int(size > 1 ? HVD_ERR_SHUTDOWN : HVD_SUCCESS, prc,
         "the parent's pending request ends with its shutdown");
  hvdt_remove_tmpdir(dir);
  munmap(rep, sizeof *rep);
  return tap_mpi_finish();
}
