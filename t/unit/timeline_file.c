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
 * Linked against libhvd.a (the writer is not exported).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/timeline.h"
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

int main(void) {
  if (system("python3 -c 'import json' 2>/dev/null") != 0)
    skip_all("no python3 to read the JSON");
  snprintf(path, sizeof path, "/tmp/hvd-timeline_file.%ld.json",
           (long)getpid());
  test_flushes();
  test_cap((size_t)2 << 20, 10, 1 << 20);
  test_cap(100, 1000, 4096);
  test_utf8();
  unlink(path);
  done_testing();
  return tap_exit_status();
}
