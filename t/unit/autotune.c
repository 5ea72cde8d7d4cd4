/*
 * autotune.c - lib/core/autotune.c's tuner, fed bursts by hand (every
 * sample 1 MiB in 1 ms: every configuration scores alike, so the
 * defaults are kept, as the tuner keeps them on a tie). The defaults it
 * compares with are the untuned run's (hvd__settings_load's values):
 *  1. HVD_CHUNK_SIZE unset (0, the executor's default, whose algorithm
 *     differs from any chunk of its own: 4 MiB shared-memory pieces,
 *     zero-copy) stays 0 in the parameters that the verify-default
 *     samples run with and in the final ones, and in HVD_AUTOTUNE_LOG's
 *     verify-default and final-defaults rows (before: 262144);
 *  2. HVD_CHUNK_SIZE=1048576 stays 1048576 there;
 *  3. HVD_CYCLE_TIME=0.0004 (0.4 us) is 1 us, not 0 (a cycle without a
 *     pause), HVD_CYCLE_TIME=0.0016 is 2 us (to the nearest), 0 stays 0;
 *  4. HVD_AUTOTUNE_LOG=/dev/full: one warning naming the file and the
 *     error (stderr read back from a file), then nothing more said, and
 *     the tuner still finishes.
 * Linked statically (the tuner is not exported). One process.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/settings.h"
#include "core/autotune.h"
#include "hvdtest.h"
#include "tap.h"

/* Samples in all; the search's (13 configurations of 1 + 3 samples). */
enum { SAMPLES = 68, SEARCH = 52 };

/* The tuner made from the environment as hvd_init reads it. */
static hvd__autotune_t *make(const char *chunk, const char *cycle,
                             const char *log) {
  hvd__settings_t s;
  hvd__autotune_t *a = NULL;
  if (chunk != NULL)
    setenv("HVD_CHUNK_SIZE", chunk, 1);
  if (cycle != NULL)
    setenv("HVD_CYCLE_TIME", cycle, 1);
  if (log != NULL)
    setenv("HVD_AUTOTUNE_LOG", log, 1);
  if (hvd__settings_load(&s) != HVD_SUCCESS)
    bail("settings: %s", hvd_last_error());
  unsetenv("HVD_CHUNK_SIZE");
  unsetenv("HVD_CYCLE_TIME");
  unsetenv("HVD_AUTOTUNE_LOG");
  if (hvd__autotune_create(&s, &a) != HVD_SUCCESS)
    bail("hvd__autotune_create: %s", hvd_last_error());
  return a;
}

/* What a run of SAMPLES samples gave: how many of the verify rounds'
 * samples ran on the defaults, whether it finished, the final
 * parameters. */
typedef struct run {
  int defaults_seen, done;
  hvd__tune_params_t final;
} run_t;

/* Feeds SAMPLES equal samples; `want` the defaults' parameters. */
static run_t feed(hvd__autotune_t *a, const hvd__tune_params_t *want) {
  run_t r;
  hvd__tune_params_t p;
  memset(&r, 0, sizeof r);
  hvd__autotune_record(a, 0, 0, &p); /* the first candidate */
  for (int k = 0; k < SAMPLES; k++) {
    r.defaults_seen += k >= SEARCH && memcmp(&p, want, sizeof p) == 0;
    hvd__autotune_record(a, 1 << 20, 1e-3, &p);
  }
  r.done = hvd__autotune_done(a);
  r.final = p;
  return r;
}

/* Rows of the log whose phase is `phase` and whose chunk_bytes and
 * cycle_us are chunk and cycle, and rows of that phase in all. */
static void rows(const char *path, const char *phase, long long chunk,
                 long long cycle, int *match, int *all) {
  char line[512], ph[64];
  FILE *f = fopen(path, "r");
  *match = *all = 0;
  while (f != NULL && fgets(line, sizeof line, f) != NULL) {
    long long c, fu, cy;
    int n;
    if (sscanf(line, "%d,%63[^,],%lld,%lld,%lld", &n, ph, &c, &fu, &cy) != 5 ||
        strcmp(ph, phase) != 0)
      continue;
    (*all)++;
    *match += c == chunk && cy == cycle;
  }
  if (f != NULL)
    fclose(f);
}

/* 1, 2: the defaults' chunk (`chunk`, NULL: unset) is `want`. */
static void chunk_case(const char *chunk, int64_t want, const char *what) {
  char path[64] = "/tmp/hvd-autotune-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    bail("mkstemp: cannot make a temporary file");
  close(fd);
  hvd__autotune_t *a = make(chunk, NULL, path);
  hvd__tune_params_t d = {134217728, want, 1000};
  run_t r = feed(a, &d);
  hvd__autotune_destroy(a);
  ok(r.done && r.defaults_seen == 8,
     "%s: the tuner ran 8 verify-default samples on the defaults (chunk "
     "%lld; %d seen)",
     what, (long long)want, r.defaults_seen);
  is_int(want, r.final.chunk_bytes, "%s: the final chunk is the defaults'",
         what);
  int match, all;
  rows(path, "verify-default", want, 1000, &match, &all);
  ok(all == 8 && match == 8,
     "%s: the log's verify-default rows say %lld (%d of %d)", what,
     (long long)want, match, all);
  rows(path, "final-defaults", want, 1000, &match, &all);
  ok(all == 1 && match == 1, "%s: its final-defaults row says %lld", what,
     (long long)want);
  unlink(path);
}

/* 3: HVD_CYCLE_TIME `cycle` is `want` us in the final parameters. */
static void cycle_case(const char *cycle, int64_t want) {
  hvd__autotune_t *a = make(NULL, cycle, NULL);
  hvd__tune_params_t d = {134217728, 0, want};
  run_t r = feed(a, &d);
  hvd__autotune_destroy(a);
  ok(r.done && r.defaults_seen == 8 && r.final.cycle_us == want,
     "HVD_CYCLE_TIME=%s: the defaults' cycle is %lld us (final %lld, %d "
     "samples on them)",
     cycle, (long long)want, (long long)r.final.cycle_us, r.defaults_seen);
}

/* 4. */
static void full_case(void) {
  char got[4096];
  int saved = hvdt_stderr_begin();
  hvd__autotune_t *a = make(NULL, NULL, "/dev/full");
  hvd__tune_params_t d = {134217728, 0, 1000};
  run_t r = feed(a, &d);
  hvd__autotune_destroy(a);
  hvdt_stderr_end(saved, got, sizeof got);
  const char *want = "warning: HVD_AUTOTUNE_LOG: cannot write '/dev/full': No "
                     "space left on device; the log ends here\n";
  int lines = 0;
  for (const char *p = got; (p = strchr(p, '\n')) != NULL; p++)
    lines++;
  ok(strstr(got, want) != NULL && lines == 1,
     "/dev/full: one warning naming the file and the error");
  if (strstr(got, want) == NULL || lines != 1)
    diag("stderr: %s", got);
  ok(r.done, "/dev/full: the tuner still finishes");
}

int main(void) {
  plan(13);
  chunk_case(NULL, 0, "HVD_CHUNK_SIZE unset");
  chunk_case("1048576", 1048576, "HVD_CHUNK_SIZE=1048576");
  cycle_case("0.0004", 1);
  cycle_case("0.0016", 2);
  cycle_case("0", 0);
  full_case();
  return tap_exit_status();
}
