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
 *
 * HVD_TEST_SLOW_CREATE=S: an open that may create a file whose path
 * contains S waits 2 s first (a background save's writer held up before
 * it reads its copy: ckpt_overlap.sh). Every open goes on as openat.
 * HVD_TEST_CREATE_MODES=FILE: each open that creates a file whose name
 * has ".tmp." (a save's temporary file) appends to FILE the permissions
 * the file has right after that open ("0644\n"): what another user could
 * open it with before any chmod (checkpoint_crash.sh).
 *
 * HVD_TEST_CHANGE_FILE=PATH (absolute, without links), with
 * HVD_TEST_CHANGE_READ=N and HVD_TEST_CHANGE_AT=OFF: just before the
 * process's N-th pread of PATH, the byte at OFF of PATH is flipped in
 * place, as by another writer rewriting the file while a load reads it.
 * Every pread then goes on (as the system call).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

/* The permissions of fd, a line appended to HVD_TEST_CREATE_MODES. */
static void log_mode(int fd) {
  const char *log = getenv("HVD_TEST_CREATE_MODES");
  struct stat st;
  char line[16];
  if (log == NULL || *log == '\0' || fstat(fd, &st) != 0)
    return;
  int n = snprintf(line, sizeof line, "0%o\n", (unsigned)(st.st_mode & 07777));
  int out = (int)syscall(SYS_openat, AT_FDCWD, log,
                         O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (out < 0)
    return;
  if (write(out, line, (size_t)n) != n)
    fprintf(stderr, "crash_rename: cannot write %s\n", log);
  close(out);
}

/* open and open64 (one symbol or two, by the C library's choice). */
static int slow_open(const char *path, int flags, va_list ap) {
  const char *slow = getenv("HVD_TEST_SLOW_CREATE");
  int creates = (flags & O_CREAT) != 0;
#ifdef O_TMPFILE
  creates |= (flags & O_TMPFILE) == O_TMPFILE;
#endif
  int mode = creates ? va_arg(ap, int) : 0;
  if (creates && slow != NULL && *slow != '\0' && path != NULL &&
      strstr(path, slow) != NULL)
    sleep(2);
  int fd = (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
  if (fd >= 0 && creates && path != NULL && strstr(path, ".tmp.") != NULL)
    log_mode(fd);
  return fd;
}

int open(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int fd = slow_open(path, flags, ap);
  va_end(ap);
  return fd;
}

int open64(const char *path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  int fd = slow_open(path, flags, ap);
  va_end(ap);
  return fd;
}

static ssize_t real_pread(int fd, void *buf, size_t n, off_t off) {
  return (ssize_t)syscall(SYS_pread64, fd, buf, n, off);
}

/* The byte at off of path, flipped in place. */
static void flip(const char *path, off_t off) {
  unsigned char c;
  int fd = open(path, O_RDWR);
  if (fd < 0)
    return;
  if (real_pread(fd, &c, 1, off) == 1) {
    c ^= 0x40;
    if (pwrite(fd, &c, 1, off) != 1)
      fprintf(stderr, "crash_rename: cannot change %s\n", path);
  }
  close(fd);
}

static void maybe_change(int fd) {
  static long reads;
  const char *victim = getenv("HVD_TEST_CHANGE_FILE");
  char link[64], target[4096];
  if (victim == NULL)
    return;
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t len = readlink(link, target, sizeof target - 1);
  if (len <= 0)
    return;
  target[len] = '\0';
  if (strcmp(target, victim) == 0 &&
      ++reads == env_long("HVD_TEST_CHANGE_READ", 0))
    flip(victim, (off_t)env_long("HVD_TEST_CHANGE_AT", 0));
}

ssize_t pread(int fd, void *buf, size_t n, off_t off) {
  maybe_change(fd);
  return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off) {
  maybe_change(fd);
  return real_pread(fd, buf, n, off);
}
