/*
 * crash_rename.c - an LD_PRELOAD shim for t/mpi/checkpoint_crash.sh: a
 * process that renames anything onto the path in HVD_TEST_CRASH_RENAME
 * dies by SIGKILL instead, as a crash between writing a checkpoint's
 * temporary file and renaming it over the old one. Every other rename
 * goes through (as renameat, so no dlsym is needed).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rename(const char *from, const char *to) {
  const char *victim = getenv("HVD_TEST_CRASH_RENAME");
  if (victim != NULL && to != NULL && strcmp(to, victim) == 0)
    raise(SIGKILL);
  return renameat(AT_FDCWD, from, AT_FDCWD, to);
}
