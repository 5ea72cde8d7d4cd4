/*
 * timeline_prog.c - the program timeline.sh runs (not a test itself): a
 * few named collectives, with HVD_TIMELINE set by the script.
 *
 *   timeline_prog run [MARKER GO]
 *       Three rounds of: "large" (float32, 4 Mi elements: several chunks),
 *       then at once "small.0".."small.3" (float32 [16]: fused, through the
 *       fusion buffer; the first round through the coordinator, the
 *       others through the cache), all async; then "bcast" (broadcast
 *       from rank 0) and "gather" (allgather). Every result is checked.
 *       With MARKER and GO: idles 2 s (engine cycles run, the timeline is
 *       flushed at least once a second), then rank 0 creates MARKER and
 *       every rank waits (at most 30 s) for GO to exist; then one more
 *       allreduce "after" and hvd_shutdown.
 *   timeline_prog api PATH BADPATH
 *       hvd_timeline_start/stop/mark/counter (see api() below).
 *   timeline_prog initfail PATH
 *       Expects hvd_init to fail on every rank with HVD_ERR_IO and a
 *       message containing PATH; then unsets HVD_TIMELINE and expects
 *       hvd_init and an allreduce to work.
 *
 * Prints "timeline_prog[R]: ..." lines; a line containing "FAIL" is a
 * failure, and the exit status is then 1 (else 0).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hvd.h"

#define LARGE (4 << 20)

static int me, size, failures;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  va_list ap;
  printf("timeline_prog[%d]: ", me);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  fflush(stdout);
  if (strncmp(fmt, "FAIL", 4) == 0)
    failures++;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Sum allreduce of n floats; element i of rank q is q + i (mod 64). */
static hvd_result_t submit_sum(const char *name, float *x, float *y, int64_t n,
                               hvd_request_t **req) {
  int64_t shape[1] = {n};
  for (int64_t i = 0; i < n; i++) {
    x[i] = (float)(me + i % 64);
    y[i] = -1.0f;
  }
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
  return hvd_allreduce_async(name, &s, &r, HVD_SUM, 1.0, 1.0, req);
}

static void check_sum(const char *name, hvd_result_t rc, const float *y,
                      int64_t n) {
  if (rc != HVD_SUCCESS) {
    say("FAIL: '%s': %s", name, hvd_last_error());
    return;
  }
  for (int64_t i = 0; i < n; i++)
    if (y[i] != (float)(size * (size - 1) / 2 + size * (i % 64))) {
      say("FAIL: '%s': wrong sum", name);
      return;
    }
}

static void collectives(void) {
  static float lx[LARGE], ly[LARGE];
  float sx[4][16], sy[4][16];
  char names[4][16];
  hvd_request_t *lreq = NULL, *sreq[4] = {NULL};
  hvd_result_t rc, src[4];

  for (int round = 0; round < 3; round++) {
    /* the small ones are submitted while "large" runs, so that they meet
     * in one cycle on every rank and are fused */
    rc = submit_sum("large", lx, ly, LARGE, &lreq);
    for (int k = 0; k < 4; k++) {
      snprintf(names[k], sizeof names[k], "small.%d", k);
      src[k] = submit_sum(names[k], sx[k], sy[k], 16, &sreq[k]);
    }
    rc = rc == HVD_SUCCESS ? hvd_wait(lreq) : rc;
    check_sum("large", rc, ly, LARGE);
    for (int k = 0; k < 4; k++) {
      src[k] = src[k] == HVD_SUCCESS ? hvd_wait(sreq[k]) : src[k];
      check_sum(names[k], src[k], sy[k], 16);
    }
  }

  int32_t b[5];
  int64_t bshape[1] = {5};
  for (int i = 0; i < 5; i++)
    b[i] = me == 0 ? 100 + i : -1;
  hvd_tensor_t bt = hvd_tensor_make(b, HVD_INT32, 1, bshape);
  rc = hvd_broadcast("bcast", &bt, 0);
  if (rc != HVD_SUCCESS)
    say("FAIL: 'bcast': %s", hvd_last_error());
  else if (b[0] != 100 || b[4] != 104)
    say("FAIL: 'bcast': wrong values");

  double g[2] = {me, me + 0.5};
  int64_t gshape[1] = {2};
  hvd_tensor_t gt = hvd_tensor_make(g, HVD_FLOAT64, 1, gshape), out;
  memset(&out, 0, sizeof out);
  rc = hvd_allgather("gather", &gt, &out);
  if (rc != HVD_SUCCESS) {
    say("FAIL: 'gather': %s", hvd_last_error());
  } else {
    const double *o = out.data;
    if (out.shape[0] != 2 * size || o[2 * size - 1] != size - 0.5)
      say("FAIL: 'gather': wrong values");
    hvd_tensor_free(&out);
  }
}

/* api: hvd_timeline_start before hvd_init (not initialised), on BADPATH
 * (HVD_ERR_IO naming it where this rank writes, else nothing), then on
 * PATH: "api.x" (float32 [1000]) alone, then "api.s0".."api.s3" (float32
 * [16]) as one grouped allreduce, fused; a mark "phase.a", a counter "loss"
 * = 1.5; stop; then "api.after", which must not be in the file. */
static int api(const char *path, const char *bad) {
  hvd_result_t rc = hvd_timeline_start(path);
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  me = r ? atoi(r) : 0;
  if (rc != HVD_ERR_NOT_INITIALIZED ||
      strcmp(hvd_last_error(),
             "hvd_timeline_start: hvd_init() has not been called") != 0)
    say("FAIL: hvd_timeline_start before hvd_init: %d '%s'", (int)rc,
        hvd_last_error());
  if (hvd_init() != HVD_SUCCESS) {
    say("FAIL: hvd_init: %s", hvd_last_error());
    return 1;
  }
  me = hvd_rank();
  size = hvd_size();
  int writes = me == 0 || getenv("HVD_TIMELINE_ALL_RANKS") != NULL;
  rc = hvd_timeline_start(bad);
  /* "hvd_timeline_start: cannot open 'BAD' (or BAD with the rank before
   * its extension): ..." */
  char want[1200];
  const char *dot = strrchr(bad, '.');
  snprintf(want, sizeof want, "hvd_timeline_start: cannot open '%.*s",
           dot ? (int)(dot - bad) : (int)strlen(bad), bad);
  if (writes ? rc != HVD_ERR_IO ||
                   strncmp(hvd_last_error(), want, strlen(want)) != 0
             : rc != HVD_SUCCESS)
    say("FAIL: hvd_timeline_start(%s): %d '%s'", bad, (int)rc,
        hvd_last_error());
  const char *empty_msg = "hvd_timeline_start: path is empty or NULL";
  rc = hvd_timeline_start("");
  if (rc != HVD_ERR_INVALID_ARG || strcmp(hvd_last_error(), empty_msg) != 0)
    say("FAIL: hvd_timeline_start(\"\"): %d '%s'", (int)rc, hvd_last_error());
  rc = hvd_timeline_start(NULL);
  if (rc != HVD_ERR_INVALID_ARG || strcmp(hvd_last_error(), empty_msg) != 0)
    say("FAIL: hvd_timeline_start(NULL): %d '%s'", (int)rc, hvd_last_error());
  rc = hvd_timeline_start(path);
  if (rc != HVD_SUCCESS)
    say("FAIL: hvd_timeline_start(%s): %s", path, hvd_last_error());
  static float x[1000], y[1000], sx[4][16], sy[4][16];
  hvd_request_t *req = NULL, *reqs[4];
  rc = submit_sum("api.x", x, y, 1000, &req);
  rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
  check_sum("api.x", rc, y, 1000);
  hvd_timeline_mark("phase.a");
  hvd_timeline_counter("loss", 1.5);
  /* one group: submitted one by one, the first could be agreed before
   * the others are submitted (a submission wakes the engine) */
  char name[4][16];
  const char *names[4];
  hvd_tensor_t sends[4], recvs[4];
  int64_t shape[1] = {16};
  for (int k = 0; k < 4; k++) {
    snprintf(name[k], sizeof name[k], "api.s%d", k);
    names[k] = name[k];
    for (int i = 0; i < 16; i++)
      sx[k][i] = (float)(me + i % 64), sy[k][i] = -1.0f;
    sends[k] = hvd_tensor_make(sx[k], HVD_FLOAT32, 1, shape);
    recvs[k] = hvd_tensor_make(sy[k], HVD_FLOAT32, 1, shape);
  }
  if (hvd_grouped_allreduce_async(4, names, sends, recvs, HVD_SUM, 1.0, 1.0,
                                  reqs) != HVD_SUCCESS)
    say("FAIL: submit the group api.s0..3: %s", hvd_last_error());
  for (int k = 0; k < 4; k++)
    check_sum(name[k], hvd_wait(reqs[k]), sy[k], 16);
  rc = hvd_timeline_stop();
  if (rc != HVD_SUCCESS)
    say("FAIL: hvd_timeline_stop: %s", hvd_last_error());
  hvd_timeline_mark("after.stop"); /* no file: nothing */
  rc = submit_sum("api.after", x, y, 16, &req);
  rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
  check_sum("api.after", rc, y, 16);
  hvd_shutdown();
  if (failures == 0)
    say("done");
  return failures != 0;
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "initfail") == 0) {
    const char *path = argv[2];
    hvd_result_t rc = hvd_init();
    /* (the topology queries work without hvd; take MPI's rank) */
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    me = r ? atoi(r) : 0;
    if (rc != HVD_ERR_IO)
      say("FAIL: hvd_init returned %d, not HVD_ERR_IO (12): %s", (int)rc,
          hvd_last_error());
    else if (strstr(hvd_last_error(), path) == NULL)
      say("FAIL: hvd_init's message does not name %s: %s", path,
          hvd_last_error());
    else
      say("hvd_init failed as expected: %s", hvd_last_error());
    if (rc == HVD_SUCCESS)
      hvd_shutdown();
    int before = failures;
    unsetenv("HVD_TIMELINE");
    rc = hvd_init();
    if (rc != HVD_SUCCESS) {
      say("FAIL: hvd_init without HVD_TIMELINE: %s", hvd_last_error());
      return 1;
    }
    me = hvd_rank();
    size = hvd_size();
    float x[16], y[16];
    hvd_request_t *req = NULL;
    rc = submit_sum("after", x, y, 16, &req);
    rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
    check_sum("after", rc, y, 16);
    hvd_shutdown();
    if (failures == before)
      say("init works without HVD_TIMELINE");
    return failures != 0;
  }
  if (argc == 4 && strcmp(argv[1], "api") == 0)
    return api(argv[2], argv[3]);
  if (argc != 2 && !(argc == 4 && strcmp(argv[1], "run") == 0)) {
    fprintf(stderr, "usage: timeline_prog run [MARKER GO] | initfail PATH | "
                    "api PATH BADPATH\n");
    return 2;
  }
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "timeline_prog: hvd_init: %s\n", hvd_last_error());
    return 2;
  }
  me = hvd_rank();
  size = hvd_size();
  collectives();
  if (argc == 4) {
    const char *marker = argv[2], *go = argv[3];
    sleep_s(2.0);
    if (me == 0) {
      FILE *f = fopen(marker, "w");
      if (f == NULL)
        say("FAIL: cannot create %s", marker);
      else
        fclose(f);
    }
    int waited = 0;
    while (access(go, F_OK) != 0 && waited < 3000) {
      sleep_s(0.01);
      waited++;
    }
    if (access(go, F_OK) != 0)
      say("FAIL: no %s after 30 s", go);
  }
  float x[16], y[16];
  hvd_request_t *req = NULL;
  hvd_result_t rc = submit_sum("after", x, y, 16, &req);
  rc = rc == HVD_SUCCESS ? hvd_wait(req) : rc;
  check_sum("after", rc, y, 16);
  hvd_shutdown();
  if (!failures)
    say("done");
  return failures != 0;
}
