/*
 * timeline_file.c - the timeline's file (lib/core/timeline.c), read by
 * python3's json module (skipped without it). One process, no MPI:
 *
 *  1. Marks of 700-byte names fill the 1 MiB buffer inside an event: the
 *     file is valid JSON after each of three flushes the full buffer
 *     makes (it held half an event and "]" before), and at the end has
 *     every mark.
 *  2. HVD_TIMELINE_MAX_BYTES of 1 MiB and ten marks of 2 MiB names: the
 *     file stays under the cap (the names went around the count: 20 MB)
 *     and ends with TIMELINE_CAP; no mark is in it.
 *  3. A cap of 4 KiB and small marks: the file is at most 4096 bytes (the
 *     event that reached the cap used to go over), valid, ends with
 *     TIMELINE_CAP.
 *  4. A name with bytes that are not UTF-8 reads back with U+FFFD for
 *     each of them.
 *  5. Caps below HVD__TIMELINE_MIN_BYTES (1, 100, 511) are refused; every
 *     cap from 512 to 4096 in steps of 29 bytes, with spans of new
 *     tensors (a track's name, then its span: the name once reached the
 *     cap and the span again, two TIMELINE_CAP events past the cap):
 *     each file at most its cap, valid, one TIMELINE_CAP, last.
 *  6. A write that fails (RLIMIT_FSIZE of 64 KiB, SIGXFSZ ignored: a
 *     short write, then EFBIG, as a full disk gives ENOSPC): one warning
 *     naming the file and the error; the file is cut back to the events
 *     of the flushes before, valid JSON; nothing more is written.
 *  7. A FIFO (as a pipe or a terminal: no place to write at): the events
 *     go out in order, flush after flush, and the closing "]" once, at
 *     close; what the reader got is valid JSON with every mark (pwrite
 *     failed there with ESPIPE and the timeline would not open).
 * `timeline_file flood PATH` (t/unit/timeline_fs.sh) writes 3 MiB of
 * marks to PATH and prints nothing.
 * Linked against libhvd.a (the writer is not exported).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/settings.h"
#include "core/timeline.h"
#include "hvdtest.h"
#include "internal.h"
#include "tap.h"

static char path[64];

/* 1 when python3 reads the file as JSON and the expression (on `ev`, its
 * events) holds. */
static int py(const char *expr) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json, sys\n"
           "ev = json.load(open(sys.argv[1], encoding=\"utf-8\"))\n"
           "sys.exit(0 if (%s) else 1)' '%s'",
           expr, path);
  return system(cmd) == 0;
}

static long long size_of(void) {
  struct stat st;
  return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static char *name_of(size_t n) {
  char *name = malloc(n + 1);
  if (name == NULL) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  memset(name, 'a', n);
  name[n] = '\0';
  return name;
}

static void test_flushes(void) {
  hvd__timeline_t *t = hvd__timeline_open(path, 0, hvd__now(), 0);
  char *name = name_of(700);
  long long last = size_of();
  int flushes = 0, valid = 0, marks = 0;
  for (; marks < 100000 && flushes < 3; marks++) {
    hvd__timeline_instant(t, "USER", name, hvd__now(), NULL);
    if (size_of() != last) { /* the full buffer was flushed */
      flushes++;
      valid += py("len(ev) > 3");
      last = size_of();
    }
  }
  is_int(3, flushes, "full buffer: three flushes in %d marks", marks);
  is_int(3, valid, "full buffer: valid JSON after each flush");
  hvd__timeline_close(t);
  char expr[128];
  snprintf(expr, sizeof expr,
           "sum(e[\"name\"] == \"a\" * 700 for e in ev) == %d", marks);
  ok(py(expr), "full buffer: all %d marks in the file at the end", marks);
  free(name);
}

/* Ten marks of `len`-byte names under a cap of `cap` bytes. */
static void test_cap(size_t len, int count, unsigned long long cap) {
  hvd__timeline_t *t = hvd__timeline_open(path, 0, hvd__now(), cap);
  char *name = name_of(len);
  for (int i = 0; i < count; i++)
    hvd__timeline_instant(t, "USER", name, hvd__now(), NULL);
  hvd__timeline_close(t);
  free(name);
  long long size = size_of();
  ok(size >= 0 && size <= (long long)cap,
     "cap %llu, %d marks of %zu bytes: %lld bytes", cap, count, len, size);
  char expr[256];
  snprintf(expr, sizeof expr,
           "ev[-1][\"name\"] == \"TIMELINE_CAP\" and "
           "ev[-1][\"args\"][\"max_bytes\"] == %llu and "
           "sum(e[\"name\"] == \"TIMELINE_CAP\" for e in ev) == 1",
           cap);
  ok(py(expr), "cap %llu: valid, one TIMELINE_CAP, last", cap);
  snprintf(expr, sizeof expr, "sum(e[\"name\"] == \"a\" * %zu for e in ev) %s",
           len, len > cap ? "== 0" : "> 0");
  ok(py(expr), "cap %llu: %s", cap,
     len > cap ? "no mark of a name past the cap" : "marks up to the cap");
}

static void test_utf8(void) {
  hvd__timeline_t *t = hvd__timeline_open(path, 0, hvd__now(), 0);
  hvd__timeline_instant(t, "USER", "bad\xff\xfe utf8 \xc3\xa9", hvd__now(),
                        NULL);
  hvd__timeline_counter(t, "\xed\xa0\x80", hvd__now(), 1.0);
  hvd__timeline_close(t);
  ok(py("ev[-2][\"name\"] == \"bad\\ufffd\\ufffd utf8 \\u00e9\" and "
        "ev[-1][\"name\"] == \"\\ufffd\" * 3"),
     "bytes not UTF-8 read back as U+FFFD each");
}

/* Caps too small for a timeline are refused; every other cap holds. */
static void test_small_caps(void) {
  static const unsigned long long small[] = {1, 100, HVD__TIMELINE_MIN_BYTES - 1};
  for (int i = 0; i < 3; i++) {
    char want[160];
    hvd__timeline_t *t = hvd__timeline_open(path, 0, hvd__now(), small[i]);
    snprintf(want, sizeof want,
             "HVD_TIMELINE: a cap of %llu bytes is below the smallest "
             "timeline (%d bytes)",
             small[i], HVD__TIMELINE_MIN_BYTES);
    ok(t == NULL, "cap %llu: refused", small[i]);
    is_string(want, hvd_last_error(), "cap %llu: the message", small[i]);
    hvd__timeline_close(t);
  }
  int files = 0;
  for (unsigned cap = HVD__TIMELINE_MIN_BYTES; cap <= 4096; cap += 29) {
    char file[96], tensor[32];
    snprintf(file, sizeof file, "%s.%u", path, cap);
    hvd__timeline_t *t = hvd__timeline_open(file, 0, hvd__now(), cap);
    for (int k = 0; t != NULL && k < 60; k++) {
      snprintf(tensor, sizeof tensor, "tensor.%d", k);
      double at = hvd__now();
      hvd__timeline_span(t, tensor, "ALLREDUCE", at, at + 1e-3, NULL);
    }
    files += t != NULL;
    hvd__timeline_close(t);
  }
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json, os, sys\n"
           "bad = 0\n"
           "for cap in range(%d, 4097, 29):\n"
           "  f = \"%s.%%d\" %% cap\n"
           "  ev = json.load(open(f, encoding=\"utf-8\"))\n"
           "  caps = [e for e in ev if e[\"name\"] == \"TIMELINE_CAP\"]\n"
           "  if os.path.getsize(f) > cap or len(caps) != 1 or ev[-1] != "
           "caps[0]:\n"
           "    print(\"# cap %%d: %%d bytes, %%d TIMELINE_CAP\" %% "
           "(cap, os.path.getsize(f), len(caps))); bad += 1\n"
           "  os.unlink(f)\n"
           "sys.exit(bad)'",
           HVD__TIMELINE_MIN_BYTES, path);
  is_int(124, files, "caps 512 to 4096: every file opens");
  ok(system(cmd) == 0,
     "caps 512 to 4096: each file at most its cap, valid, one TIMELINE_CAP, "
     "last");
}

/* A write that fails: the file cut back to its last good flush, one
 * warning (stderr, read back from a file). */
static void test_write_fails(void) {
  char want[512], got[4096];
  struct rlimit old, lim;
  getrlimit(RLIMIT_FSIZE, &old);
  lim = old;
  lim.rlim_cur = 64 << 10;
  signal(SIGXFSZ, SIG_IGN);
  int saved = hvdt_stderr_begin();
  setrlimit(RLIMIT_FSIZE, &lim);
  hvd__timeline_t *t = hvd__timeline_open(path, 0, hvd__now(), 0);
  char *name = name_of(700);
  for (int i = 0; i < 5; i++)
    hvd__timeline_instant(t, "USER", "early", hvd__now(), NULL);
  hvd__timeline_flush(t, 0);
  for (int i = 0; i < 3000; i++) /* 2 MiB: two flushes, the first fails */
    hvd__timeline_instant(t, "USER", name, hvd__now(), NULL);
  hvd__timeline_close(t);
  setrlimit(RLIMIT_FSIZE, &old);
  hvdt_stderr_end(saved, got, sizeof got);
  free(name);
  snprintf(want, sizeof want,
           "timeline: cannot write '%s': File too large; it ends at its last "
           "whole event and nothing more is written to it",
           path);
  int warnings = 0;
  for (const char *w = got; (w = strstr(w, "timeline:")) != NULL; w++)
    warnings++;
  ok(strstr(got, want) != NULL && warnings == 1,
     "failed write: one warning naming the file and the error");
  if (strstr(got, want) == NULL)
    diag("stderr: %s", got);
  ok(py("len(ev) == 8 and ev[-1][\"name\"] == \"early\""),
     "failed write: valid JSON, the header, the USER track and the 5 marks flushed before");
}

static void test_fifo(void) {
  char fifo[96], cmd[256];
  snprintf(fifo, sizeof fifo, "%s.fifo", path);
  unlink(fifo);
  if (mkfifo(fifo, 0600) != 0) {
    skip(2, "mkfifo: cannot make a FIFO here");
    return;
  }
  snprintf(cmd, sizeof cmd, "cat '%s' > '%s'", fifo, path);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  hvd__timeline_t *t = hvd__timeline_open(fifo, 0, hvd__now(), 0);
  ok(t != NULL, "FIFO: the timeline opens (%s)",
     t != NULL ? "" : hvd_last_error());
  char *name = name_of(700);
  for (int i = 0; t != NULL && i < 3000; i++) /* 2 MiB: flushes */
    hvd__timeline_instant(t, "USER", name, hvd__now(), NULL);
  hvd__timeline_close(t);
  free(name);
  int status = 0;
  if (t == NULL) /* the reader waits for a writer: be one */
    close(open(fifo, O_WRONLY));
  waitpid(pid, &status, 0);
  unlink(fifo);
  ok(py("len(ev) == 3003 and ev[-1][\"name\"] == \"a\" * 700"),
     "FIFO: the reader gets valid JSON, the header, the track, 3000 marks");
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "flood") == 0) {
    hvd__timeline_t *t = hvd__timeline_open(argv[2], 0, hvd__now(), 0);
    char *name = name_of(700);
    for (int i = 0; t != NULL && i < 4500; i++)
      hvd__timeline_instant(t, "USER", name, hvd__now(), NULL);
    hvd__timeline_close(t);
    free(name);
    return t == NULL;
  }
  if (system("python3 -c 'import json' 2>/dev/null") != 0)
    skip_all("no python3 to read the JSON");
  snprintf(path, sizeof path, "/tmp/hvd-timeline_file.%ld.json",
           (long)getpid());
  test_flushes();
  test_cap((size_t)2 << 20, 10, 1 << 20);
  test_cap(100, 1000, 4096);
  test_utf8();
  test_small_caps();
  test_write_fails();
  test_fifo();
  unlink(path);
  done_testing();
  return tap_exit_status();
}
