/*
 * crash_rename.c - an LD_PRELOAD shim for t/mpi/checkpoint_crash.sh and
 * t/mpi/elastic.sh: a process that renames anything onto the path in
 * HVD_TEST_CRASH_RENAME dies by SIGKILL instead, as a crash between
 * writing a checkpoint's temporary file and renaming it over the old one.
 * HVD_TEST_CRASH_SKIP=N lets the process's first N such renames through;
 * HVD_TEST_CRASH_LAUNCH=K crashes only in the K-th launch of an elastic
 * job (HVD_ELASTIC_RESTARTS, unset: 0). A rename onto the path in
 * HVD_TEST_SLOW_RENAME waits 2 s first: a background save still writing
 * when its program ends. Every other rename goes through (as renameat, so
 * no dlsym is needed).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? strtol(v, NULL, 10) : dflt;
}

int rename(const char *from, const char *to) {
  static long seen;
  const char *victim = getenv("HVD_TEST_CRASH_RENAME");
  const char *slow = getenv("HVD_TEST_SLOW_RENAME");
  if (slow != NULL && to != NULL && strcmp(to, slow) == 0)
    sleep(2);
  if (victim != NULL && to != NULL && strcmp(to, victim) == 0 &&
      seen++ >= env_long("HVD_TEST_CRASH_SKIP", 0) &&
      env_long("HVD_ELASTIC_RESTARTS", 0) ==
          env_long("HVD_TEST_CRASH_LAUNCH", 0))
    raise(SIGKILL);
  return renameat(AT_FDCWD, from, AT_FDCWD, to);
}
