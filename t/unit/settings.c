/*
 * settings.c - the HVD_* values' one reading, without hvd_init: each kind's
 * parser through hvd_setting_check (white space refused, a unit only
 * after a letter, booleans exactly 0 or 1, integers whole, ranges
 * printed in full), the
 * names hvd_setting_unknown suggests, and HVD_HOST_ARENA as
 * hvd_alloc_host reads it (a child process per value: the arena is made
 * once per process). One process, no mpiexec, never calls hvd_init().
 */
#include "hvd.h"
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The index of setting `name`; bails when there is none. */
static int setting(const char *name) {
  for (int i = 0; i < hvd_setting_count(); i++) {
    const char *n = NULL;
    if (hvd_setting_info(i, &n, NULL, NULL) == HVD_SUCCESS &&
        strcmp(n, name) == 0)
      return i;
  }
  bail("no setting %s", name);
}

/* name='value' is refused with exactly msg. */
static void refused(const char *name, const char *value, const char *msg) {
  setenv(name, value, 1);
  hvd_result_t rc = hvd_setting_check(setting(name));
  is_int(HVD_ERR_INVALID_ARG, rc, "%s='%s': refused", name, value);
  is_string(msg, rc != HVD_SUCCESS ? hvd_last_error() : "(accepted)",
            "%s='%s': message", name, value);
  unsetenv(name);
}

static void accepted(const char *name, const char *value) {
  setenv(name, value, 1);
  hvd_result_t rc = hvd_setting_check(setting(name));
  is_int(HVD_SUCCESS, rc, "%s='%s': accepted (%s)", name, value,
         rc != HVD_SUCCESS ? hvd_last_error() : "");
  unsetenv(name);
}

static void test_parsers(void) {
  const char *size = "is not a size (bytes, or with K, M, G, T)";
  char want[160];
  /* a space after a size was read as a unit of 1024^5 */
  snprintf(want, sizeof want, "HVD_FUSION_THRESHOLD='0.5 ' %s", size);
  refused("HVD_FUSION_THRESHOLD", "0.5 ", want);
  snprintf(want, sizeof want, "HVD_FUSION_THRESHOLD='5 ' %s", size);
  refused("HVD_FUSION_THRESHOLD", "5 ", want);
  snprintf(want, sizeof want, "HVD_CHUNK_SIZE=' 5' %s", size);
  refused("HVD_CHUNK_SIZE", " 5", want);
  snprintf(want, sizeof want, "HVD_CHUNK_SIZE='1 K' %s", size);
  refused("HVD_CHUNK_SIZE", "1 K", want);
  accepted("HVD_CHUNK_SIZE", "64m");
  accepted("HVD_CHUNK_SIZE", "1KiB");
  accepted("HVD_FUSION_THRESHOLD", "0");
  /* numbers: white space on either side is not one reading of them */
  refused("HVD_CYCLE_TIME", " 1", "HVD_CYCLE_TIME=' 1' is not a number");
  refused("HVD_CYCLE_TIME", "1 ", "HVD_CYCLE_TIME='1 ' is not a number");
  accepted("HVD_CYCLE_TIME", "0.5");
  /* booleans: exactly 0 or 1 ("0.5" read as 1) */
  refused("HVD_NO_BIND", "0.5", "HVD_NO_BIND='0.5' is not 0 or 1");
  refused("HVD_NO_BIND", "2", "HVD_NO_BIND='2' is not 0 or 1");
  refused("HVD_ZERO_COPY", "yes", "HVD_ZERO_COPY='yes' is not 0 or 1");
  refused("HVD_HOST_ARENA", " 0", "HVD_HOST_ARENA=' 0' is not 0 or 1");
  accepted("HVD_NO_BIND", "1.0");
  accepted("HVD_NO_BIND", "-0");
  /* the ranges' bounds in full, not %g's 1.04858e+06 */
  refused("HVD_CACHE_CAPACITY", "-1",
          "HVD_CACHE_CAPACITY='-1' is out of range 0..1048576");
  /* an integer setting takes a whole number ("1.5" once read as 1) */
  refused("HVD_CACHE_CAPACITY", "1.5",
          "HVD_CACHE_CAPACITY='1.5' is not a whole number");
  accepted("HVD_CACHE_CAPACITY", "1e3");
  refused("HVD_STALL_CHECK_TIME", "-1",
          "HVD_STALL_CHECK_TIME='-1' is out of range 0..1000000000");
  refused("HVD_CHUNK_SIZE", "2T",
          "HVD_CHUNK_SIZE='2T' is out of range 0..1000000000000 bytes "
          "(whole)");
}

/* The message hvd_setting_unknown gives for `name` (set to 1 meanwhile),
 * or "(none)". */
static const char *unknown(const char *name) {
  static char seen[512];
  char m[512];
  size_t len = strlen(name);
  snprintf(seen, sizeof seen, "(none)");
  setenv(name, "1", 1);
  for (int k = 0; hvd_setting_unknown(k, m, sizeof m); k++)
    if (strncmp(m, name, len) == 0 && m[len] == ' ')
      snprintf(seen, sizeof seen, "%s", m);
  unsetenv(name);
  return seen;
}

static void test_unknown(void) {
  /* Horovod's: only the exact equivalent, never a near name */
  is_string("HOROVOD_CPU_OPERATIONS is Horovod's and hvd has no such "
            "setting (hvd-info lists hvd's variables)",
            unknown("HOROVOD_CPU_OPERATIONS"), "HOROVOD_CPU_OPERATIONS");
  is_string("HOROVOD_FUSION_THRESHOLD is Horovod's and hvd does not read "
            "it: hvd's is HVD_FUSION_THRESHOLD",
            unknown("HOROVOD_FUSION_THRESHOLD"), "HOROVOD_FUSION_THRESHOLD");
  is_string("HOROVOD_STALL_CHECK_TIME_SECONDS is Horovod's and hvd does not "
            "read it: hvd's is HVD_STALL_CHECK_TIME",
            unknown("HOROVOD_STALL_CHECK_TIME_SECONDS"),
            "HOROVOD_STALL_CHECK_TIME_SECONDS (renamed)");
  /* hvd's: the setting the name begins, then a typo's nearest */
  is_string("HVD_TIMELINE_MAX is not an hvd variable: did you mean "
            "HVD_TIMELINE_MAX_BYTES?",
            unknown("HVD_TIMELINE_MAX"), "HVD_TIMELINE_MAX");
  is_string("HVD_GPU_OPERATION is not an hvd variable: did you mean "
            "HVD_GPU_OPERATIONS?",
            unknown("HVD_GPU_OPERATION"), "HVD_GPU_OPERATION");
  is_string("HVD_FUSION_THRESHHOLD is not an hvd variable: did you mean "
            "HVD_FUSION_THRESHOLD?",
            unknown("HVD_FUSION_THRESHHOLD"), "HVD_FUSION_THRESHHOLD");
  is_string("HVD_QQQQQQQQQQ is not an hvd variable and is ignored (hvd-info "
            "lists them)",
            unknown("HVD_QQQQQQQQQQ"), "HVD_QQQQQQQQQQ");
  is_string("(none)", unknown("HVD_CYCLE_TIME"), "HVD_CYCLE_TIME is known");
}

/* 1 when hvd_alloc_host uses the shared arena with HVD_HOST_ARENA=value
 * (NULL: unset), asked of a child process; -1 when that failed. */
static int arena_used(const char *value) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (value != NULL)
      setenv("HVD_HOST_ARENA", value, 1);
    else
      unsetenv("HVD_HOST_ARENA");
    void *p = hvd_alloc_host(1 << 20);
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int in = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
      in |= strstr(line, "hvd-host-arena") != NULL;
    _exit(p == NULL || f == NULL ? 2 : in);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) ||
      WEXITSTATUS(st) > 1)
    return -1;
  return WEXITSTATUS(st);
}

static void test_arena(void) {
  static const char *const off[] = {"0", "00", "0.0", "-0", "+0"};
  static const char *const on[] = {"1", "1.0", "abc", " 0"};
  for (size_t i = 0; i < sizeof off / sizeof *off; i++)
    is_int(0, arena_used(off[i]), "HVD_HOST_ARENA='%s': no shared arena",
           off[i]);
  for (size_t i = 0; i < sizeof on / sizeof *on; i++)
    is_int(1, arena_used(on[i]),
           "HVD_HOST_ARENA='%s': the shared arena (malformed: the default)",
           on[i]);
  is_int(1, arena_used(NULL), "HVD_HOST_ARENA unset: the shared arena");
}

int main(void) {
  /* none of the caller's HVD_* or HOROVOD_* variables in the way */
  for (int i = 0; environ[i] != NULL;) {
    char name[256];
    size_t k = strcspn(environ[i], "=");
    if ((strncmp(environ[i], "HVD_", 4) == 0 ||
         strncmp(environ[i], "HOROVOD_", 8) == 0) &&
        k < sizeof name) {
      memcpy(name, environ[i], k);
      name[k] = '\0';
      unsetenv(name);
    } else {
      i++;
    }
  }
  test_parsers();
  test_unknown();
  test_arena();
  done_testing();
  return tap_exit_status();
}
