/*
 * taplib.c - tests of the TAP library itself (plain mode): each scenario
 * runs in a child process whose stdout and exit status are compared with
 * the exact expected ones.
 */
#include "tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct scenario {
  const char *name;
  int (*run)(void);
  const char *out; /* exact stdout */
  int status;      /* exit status */
};

static int mixed(void) {
  plan(4);
  ok(1, "a");
  is_int(2, 3, "b %d", 2);
  is_string(NULL, "x", "c");
  is_string("y", NULL, "d");
  return tap_exit_status();
}

static int passing(void) {
  ok(1, "x");
  ok(1, "%s", "");
  is_double(1.0, 1.05, 0.1, "near");
  is_double(0.5, 0.5, 0, "equal");
  is_string(NULL, NULL, "nulls");
  is_string("abc", "abc", "strings");
  is_int(-5, -5, "ints");
  ok(tap_rank() == 0 && tap_size() == 1, "rank and size");
  done_testing();
  return tap_exit_status();
}

static int doubles(void) {
  plan(1);
  is_double(1.0, 1.25, 0.1, "far");
  return tap_exit_status();
}

static int short_plan(void) {
  plan(2);
  ok(1, "only");
  return tap_exit_status();
}

static int no_plan(void) {
  ok(1, "unplanned");
  return tap_exit_status();
}

static int notes(void) {
  plan(3);
  tap_note("element %d", 3);
  ok(0, "n");
  tap_note("index 4");
  is_int(1, 2, "i");
  tap_note("dropped");
  ok(1, "passes, note dropped");
  return tap_exit_status();
}

static int skips(void) {
  plan(3);
  skip(2, "no %s", "gpu");
  diag("x\ny");
  ok(1, "after");
  return tap_exit_status();
}

static int skips_all(void) {
  skip_all("nothing to %s", "do");
}

static int bails(void) {
  plan(2);
  ok(1, "first");
  bail("boom %d", 7);
}

static const struct scenario scenarios[] = {
    {"mixed", mixed,
     "1..4\nok 1 - a\nnot ok 2 - b 2\n#   expected 2, got 3\n"
     "not ok 3 - c\n#   expected NULL, got \"x\"\n"
     "not ok 4 - d\n#   expected \"y\", got NULL\n",
     1},
    {"passing", passing,
     "ok 1 - x\nok 2\nok 3 - near\nok 4 - equal\nok 5 - nulls\n"
     "ok 6 - strings\nok 7 - ints\nok 8 - rank and size\n1..8\n",
     0},
    {"doubles", doubles, "1..1\nnot ok 1 - far\n#   expected 1, got 1.25\n", 1},
    {"short plan", short_plan,
     "1..2\nok 1 - only\n# planned 2 checks but ran 1\n", 1},
    {"no plan", no_plan, "ok 1 - unplanned\n", 1},
    {"notes", notes,
     "1..3\nnot ok 1 - n\n#   element 3\nnot ok 2 - i\n"
     "#   expected 1, got 2; index 4\nok 3 - passes, note dropped\n",
     1},
    {"skips", skips,
     "1..3\nok 1 # SKIP no gpu\nok 2 # SKIP no gpu\n# x\n# y\nok 3 - after\n",
     0},
    {"skip_all", skips_all, "1..0 # SKIP nothing to do\n", 0},
    {"bail", bails, "1..2\nok 1 - first\nBail out! boom 7\n", 255},
};
#define NSCENARIOS ((int)(sizeof scenarios / sizeof scenarios[0]))

static char *outs[NSCENARIOS]; /* global: reachable in every child */

/* Runs s in a child; returns its stdout (malloc'd) and sets *status. */
static char *run_child(const struct scenario *s, int *status) {
  int fds[2];
  size_t len = 0, cap = 4096;
  char *out;
  pid_t pid;
  ssize_t n;

  fflush(stdout);
  if (pipe(fds) != 0)
    bail("pipe failed");
  pid = fork();
  if (pid < 0)
    bail("fork failed");
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[1]);
    exit(s->run());
  }
  close(fds[1]);
  if (!(out = calloc(1, cap)))
    bail("out of memory");
  while ((n = read(fds[0], out + len, cap - len - 1)) > 0) {
    len += (size_t)n;
    if (cap - len < 2 && !(out = realloc(out, cap *= 2)))
      bail("out of memory");
  }
  out[len] = '\0';
  close(fds[0]);
  if (waitpid(pid, status, 0) != pid)
    bail("waitpid failed");
  *status = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
  return out;
}

int main(void) {
  int status[NSCENARIOS];

  /* Fork every child before this process runs a check, so that each
   * child starts with the library's state untouched. */
  for (int i = 0; i < NSCENARIOS; i++)
    outs[i] = run_child(&scenarios[i], &status[i]);

  plan(2 * NSCENARIOS);
  for (int i = 0; i < NSCENARIOS; i++) {
    is_string(scenarios[i].out, outs[i], "%s: output", scenarios[i].name);
    is_int(scenarios[i].status, status[i], "%s: exit status",
           scenarios[i].name);
    free(outs[i]);
  }
  return tap_exit_status();
}
