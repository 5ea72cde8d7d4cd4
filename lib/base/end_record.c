/* end_record.c - the rank's own account of its end (see end_record.h). */
#include "base/end_record.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h> /* rename */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/settings.h"

/* Small buffers: a handler runs on whatever stack the signalled thread
 * has. A longer HVD_END_DIR gets no record. */
#define PATH_CAP 1024

/* What the record says; written by whichever thread or handler ends the
 * process, so plain fields read whole (no lock: a handler cannot take
 * one). */
static struct {
  int on;                      /* HVD_END_DIR set and a rank known */
  char path[PATH_CAP];         /* DIR/rank.R */
  char head[512];              /* "rank R\nhost H\npid P\n" */
  char error[1024];            /* "error ...\n" or "" */
  volatile sig_atomic_t ended; /* the state has left running */
  char when[32];               /* "time S.U\n" of that moment */
  int hooked;                  /* hvd__end_record_init's on_exit */
  long pid;                    /* this process's: a child forked from it
                                  has the same fields, and must not speak
                                  for the rank */
  long group_parent;           /* the parent of this process group's
                                  leader when that is not this process (a
                                  rank started through a wrapper script,
                                  which Open MPI signals as a group), else
                                  0 */
} rec;

static const int signals[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGABRT,
                              SIGSEGV, SIGBUS, SIGFPE, SIGILL,  SIGCONT};
enum { NSIGNALS = sizeof signals / sizeof signals[0] };
static struct sigaction before[NSIGNALS];

/* ---- async-signal-safe text ---------------------------------------------- */

typedef struct text {
  char *p;
  size_t n, cap;
} text_t;

static void put(text_t *t, const char *s) {
  while (*s != '\0' && t->n + 1 < t->cap)
    t->p[t->n++] = *s++;
  t->p[t->n] = '\0';
}

static void put_num(text_t *t, long long v) {
  char d[24];
  int k = 0;
  unsigned long long u =
      v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
  do {
    d[k++] = (char)('0' + u % 10);
    u /= 10;
  } while (u > 0);
  if (v < 0)
    put(t, "-");
  while (k > 0) {
    char c[2] = {d[--k], '\0'};
    put(t, c);
  }
}

/* The moment, once: "time S.U\n" (six digits of microseconds). */
static void stamp(void) {
  if (rec.ended)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  text_t t = {rec.when, 0, sizeof rec.when};
  put(&t, "time ");
  put_num(&t, (long long)ts.tv_sec);
  put(&t, ".");
  for (long us = ts.tv_nsec / 1000, div = 100000; div > 0; div /= 10) {
    char c[2] = {(char)('0' + us / div % 10), '\0'};
    put(&t, c);
  }
  put(&t, "\n");
  rec.ended = 1;
}

/* Replaces the record with head + state lines + time + error: written to
 * a file of this thread's own, then renamed over the record. */
static void write_record(const char *state) {
  char body[sizeof rec.head + 128 + sizeof rec.when + sizeof rec.error];
  char tmp[PATH_CAP + 24];
  text_t b = {body, 0, sizeof body}, p = {tmp, 0, sizeof tmp};
  put(&b, rec.head);
  put(&b, state);
  if (rec.ended)
    put(&b, rec.when);
  put(&b, rec.error);
  put(&p, rec.path);
  put(&p, ".");
  put_num(&p, (long long)syscall(SYS_gettid));
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return; /* nothing to say it with: the launcher sees no end */
  ssize_t w = write(fd, body, b.n);
  if (close(fd) == 0 && w == (ssize_t)b.n)
    rename(tmp, rec.path);
  else
    unlink(tmp);
}

/* "state KIND\nWHAT N\n" */
static void write_state(const char *kind, const char *what, long long n) {
  char s[128];
  text_t t = {s, 0, sizeof s};
  put(&t, "state ");
  put(&t, kind);
  put(&t, "\n");
  if (what != NULL) {
    put(&t, what);
    put(&t, " ");
    put_num(&t, n);
    put(&t, "\n");
  }
  write_record(s);
}

/* ---- the ends ----------------------------------------------------------- */

/* The record is this process's to write: on, and not a forked child's. */
static int mine(void) { return rec.on && rec.pid == (long)getpid(); }

static void on_exit_status(int status, void *arg) {
  (void)arg;
  if (!mine() || rec.ended)
    return; /* the first end said it (an exit after a handled signal
               rewrites nothing: the signal's record stays) */
  stamp();
  write_state("exited", "status", status & 0xff); /* what the parent sees */
}

/* The start of a small file into buf (cap bytes, terminated); "" when it
 * cannot be read. */
static void read_small(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : 0;
  if (fd >= 0)
    close(fd);
  buf[n > 0 ? n : 0] = '\0';
}

/* Whether a signal came from the launcher: this process's parent, or,
 * started through a wrapper script, the parent of its group's leader. */
static int by_launcher(const siginfo_t *si) {
  return si->si_pid == getppid() ||
         (rec.group_parent > 0 && si->si_pid == rec.group_parent);
}

/* The parent of this process group's leader (not this process), from
 * /proc/PGID/stat: "pid (comm) state ppid ..."; 0 when it cannot say. */
static long group_parent(void) {
  pid_t g = getpgrp();
  if (g == getpid() || g <= 0)
    return 0;
  char path[64], buf[512];
  text_t t = {path, 0, sizeof path};
  put(&t, "/proc/");
  put_num(&t, (long long)g);
  put(&t, "/stat");
  read_small(path, buf, sizeof buf);
  const char *p = strrchr(buf, ')'); /* the command may hold anything */
  long ppid = 0;
  if (p != NULL && p[1] == ' ' && p[2] != '\0' && p[3] == ' ')
    ppid = strtol(p + 4, NULL, 10);
  return ppid > 1 ? ppid : 0;
}

/* The launcher's SIGCONT: Open MPI stops a job with SIGCONT, a second,
 * SIGTERM, then SIGKILL as soon as any rank has died of the SIGTERM, so
 * a rank may never get to record the SIGTERM; the SIGCONT, a second
 * ahead, says "stopping" (not an end: a later one replaces it). */
static void on_cont(const siginfo_t *si) {
  if (mine() && !rec.ended && si != NULL && si->si_code <= 0 &&
      by_launcher(si)) {
    char s[64];
    text_t t = {s, 0, sizeof s};
    put(&t, "state stopping\nsignal ");
    put_num(&t, SIGCONT);
    put(&t, "\nby launcher\n");
    write_record(s);
  }
}

static void on_signal(int sig, siginfo_t *si, void *ctx) {
  int saved = errno; /* the interrupted code's, when this returns */
  int k = 0;
  while (k < NSIGNALS && signals[k] != sig)
    k++;
  if (sig == SIGCONT) {
    on_cont(si);
  } else if (mine() && !rec.ended) {
    char s[128];
    text_t t = {s, 0, sizeof s};
    put(&t, "state signal\nsignal ");
    put_num(&t, sig);
    put(&t, "\nby ");
    if (si == NULL || si->si_code > 0) /* raised by the kernel: a fault */
      put(&t, "kernel");
    else if (by_launcher(si))
      put(&t, "launcher");
    else {
      put(&t, "pid ");
      put_num(&t, (long long)si->si_pid);
    }
    put(&t, "\n");
    stamp();
    write_record(s);
  }
  const struct sigaction *o = &before[k < NSIGNALS ? k : 0];
  if (k < NSIGNALS && (o->sa_flags & SA_SIGINFO) && o->sa_sigaction != NULL) {
    o->sa_sigaction(sig, si, ctx);
  } else if (k < NSIGNALS && o->sa_handler != SIG_DFL &&
             o->sa_handler != SIG_IGN) {
    o->sa_handler(sig);
  } else if (sig != SIGCONT) { /* the default: die of it, as without us */
    signal(sig, SIG_DFL);
    raise(sig);
  }
  errno = saved;
}

/* The launcher's rank of this process, or -1. */
static long launcher_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                      "PMI_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    char *end;
    if (v != NULL && *v != '\0') {
      long r = strtol(v, &end, 10);
      if (*end == '\0' && r >= 0)
        return r;
    }
  }
  return -1;
}

/* Whether path is the record of another live process: a child that a rank
 * starts inherits its rank and HVD_END_DIR, and must not speak for it. */
static int taken(const char *path) {
  char buf[512];
  read_small(path, buf, sizeof buf);
  const char *p = strstr(buf, "\npid ");
  long pid = p != NULL ? strtol(p + 5, NULL, 10) : 0;
  return pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) == 0;
}

/* When libhvd loads: under a launcher, with HVD_END_DIR, the record says
 * "running" and every end is watched. */
__attribute__((constructor)) static void end_record_load(void) {
  hvd__settings_t *s = malloc(sizeof *s);
  long rank = launcher_rank();
  if (s == NULL || rank < 0 || hvd__settings_load(s) != HVD_SUCCESS ||
      s->end_dir[0] == '\0' || strlen(s->end_dir) > PATH_CAP - 32) {
    free(s);
    return;
  }
  text_t p = {rec.path, 0, sizeof rec.path}, h = {rec.head, 0, sizeof rec.head};
  put(&p, s->end_dir);
  put(&p, "/rank.");
  put_num(&p, rank);
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  put(&h, "rank ");
  put_num(&h, rank);
  put(&h, "\nhost ");
  put(&h, s->hostname[0] ? s->hostname : host);
  put(&h, "\npid ");
  put_num(&h, (long long)getpid());
  put(&h, "\n");
  free(s);
  if (taken(rec.path))
    return;
  rec.pid = (long)getpid();
  rec.group_parent = group_parent();
  rec.on = 1;
  write_state("running", NULL, 0);
  on_exit(on_exit_status, NULL);
  for (int k = 0; k < NSIGNALS; k++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(signals[k], NULL, &before[k]) == 0 &&
        before[k].sa_handler != SIG_IGN)
      sigaction(signals[k], &sa, NULL);
  }
}

void hvd__end_record_init(void) {
  if (rec.on && !rec.hooked && on_exit(on_exit_status, NULL) == 0)
    rec.hooked = 1;
}

void hvd__end_record_error(const char *reason) {
  if (!mine())
    return;
  char e[sizeof rec.error];
  text_t t = {e, 0, sizeof e};
  put(&t, "error ");
  put(&t, reason);
  for (size_t i = 6; i < t.n; i++)
    if (e[i] == '\n')
      e[i] = ' ';
  put(&t, "\n");
  memcpy(rec.error, e, sizeof e);
  if (!rec.ended)
    write_state("running", NULL, 0);
}

void hvd__end_record_abort(int code) {
  if (!mine())
    return;
  stamp(); /* the exit's moment, if it came first */
  write_state("aborted", "status", code);
}
