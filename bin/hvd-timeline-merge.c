/*
 * hvd-timeline-merge - the per-rank timelines of one job as one trace:
 *
 *   hvd-timeline-merge -o merged.json tl.0.json tl.1.json ...
 *
 * HVD_TIMELINE_ALL_RANKS=1 makes every rank write its own file (the rank
 * before the extension). Each is a JSON array of Chrome-trace events whose
 * process id is the rank and whose times are on the clock every rank
 * aligned at hvd_init, so one trace is their events together: this writes
 * them as one array (atomically: a temporary file renamed over the
 * output), for chrome://tracing or Perfetto, where each rank is a process.
 *
 * Each input is scanned as JSON (strings, escapes, nesting), not searched
 * for brackets: a file cut short inside its array (a rank killed while it
 * wrote, a full disk) gives its complete events and a note on stderr;
 * one whose brackets do not match, or with text after its array, is
 * refused.
 *
 * Exit status: 0 written; 1 an input unreadable or not a JSON array, or
 * the output not written; 2 a bad command line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The whole file, NUL-terminated, or NULL with the reason printed. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "hvd-timeline-merge: cannot open '%s': %s\n", path,
            strerror(errno));
    return NULL;
  }
  size_t cap = 1 << 16, n = 0, got;
  char *buf = malloc(cap + 1);
  while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      char *p = realloc(buf, 2 * cap + 1);
      if (p == NULL) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = p, cap *= 2;
    }
  }
  fclose(f);
  if (buf == NULL) {
    fprintf(stderr, "hvd-timeline-merge: out of memory reading '%s'\n", path);
    return NULL;
  }
  buf[n] = '\0';
  *len = n;
  return buf;
}

/* The events of buf's top-level array: [*a, *b) between its brackets,
 * or up to the end of its last complete event when the file ends inside
 * the array (*cut 1). 0, or -1 with *why (and *at, a byte offset) when
 * buf is no JSON array. */
static int scan(const char *buf, size_t len, size_t *a, size_t *b, int *cut,
                const char **why, size_t *at) {
  char stack[64]; /* the open brackets */
  int depth = 0, in_str = 0;
  size_t i = 0, last = 0;
  while (i < len && strchr(" \t\r\n", buf[i]) != NULL)
    i++;
  if (i == len || buf[i] != '[')
    return *why = "does not start with a JSON array", *at = i, -1;
  *a = i + 1, *cut = 0;
  for (; i < len; i++) {
    char ch = buf[i];
    if (in_str) {
      if (ch == '\\')
        i++;
      else if (ch == '"')
        in_str = 0;
      continue;
    }
    if (ch == '"') {
      in_str = 1;
    } else if (ch == '[' || ch == '{') {
      if (depth == (int)sizeof stack)
        return *why = "nests too deep", *at = i, -1;
      stack[depth++] = ch;
    } else if (ch == ']' || ch == '}') {
      if (depth == 0 || stack[depth - 1] != (ch == ']' ? '[' : '{'))
        return *why = "has a bracket that closes nothing open", *at = i, -1;
      if (--depth == 1)
        last = i + 1; /* the end of a complete event */
      if (depth == 0)
        break;
    } else if (ch == '\0') {
      return *why = "holds a NUL byte", *at = i, -1;
    }
  }
  if (depth > 0) { /* cut short inside the array */
    *b = last > *a ? last : *a;
    *cut = 1;
    return 0;
  }
  *b = i;
  for (i++; i < len; i++)
    if (strchr(" \t\r\n", buf[i]) == NULL)
      return *why = "has text after its JSON array", *at = i, -1;
  return 0;
}

int main(int argc, char **argv) {
  const char *out = NULL;
  int first = 1;
  if (argc >= 2 &&
      (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    puts("usage: hvd-timeline-merge -o OUT.json RANK0.json RANK1.json ...\n"
         "  the per-rank timelines of one job (HVD_TIMELINE_ALL_RANKS=1) as "
         "one trace");
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "-o") == 0 && argv[2][0] != '\0') {
    out = argv[2];
    first = 3;
  }
  if (out == NULL || first >= argc) {
    fprintf(stderr, "usage: hvd-timeline-merge -o OUT.json RANK0.json "
                    "RANK1.json ...\n");
    return 2;
  }
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
  FILE *f = fopen(tmp, "w");
  if (f == NULL) {
    fprintf(stderr, "hvd-timeline-merge: cannot create '%s': %s\n", tmp,
            strerror(errno));
    return 1;
  }
  int events = 0, bad = 0;
  fputs("[", f);
  for (int i = first; i < argc && !bad; i++) {
    size_t len;
    char *buf = slurp(argv[i], &len);
    if (buf == NULL) {
      bad = 1;
      break;
    }
    size_t a = 0, b = 0, at = 0;
    int cut = 0;
    const char *why = NULL;
    if (scan(buf, len, &a, &b, &cut, &why, &at) != 0) {
      fprintf(stderr,
              "hvd-timeline-merge: '%s' is not a JSON array (an hvd "
              "timeline?): it %s (byte %zu)\n",
              argv[i], why, at);
      bad = 1;
    } else {
      if (cut)
        fprintf(stderr,
                "hvd-timeline-merge: note: '%s' ends inside its array (cut "
                "short while written?): its complete events are kept\n",
                argv[i]);
      while (a < b && strchr(" \t\r\n", buf[a]) != NULL)
        a++;
      while (b > a && strchr(" \t\r\n,", buf[b - 1]) != NULL)
        b--;
      if (b > a) {
        fputs(events ? ",\n" : "\n", f);
        fwrite(buf + a, 1, b - a, f);
        events++;
      }
    }
    free(buf);
  }
  fputs("\n]\n", f);
  if (bad) {
    fclose(f);
    unlink(tmp);
    return 1;
  }
  if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0 ||
      rename(tmp, out) != 0) {
    fprintf(stderr, "hvd-timeline-merge: cannot write '%s': %s\n", out,
            strerror(errno));
    unlink(tmp);
    return 1;
  }
  printf("hvd-timeline-merge: wrote %s from %d file%s\n", out, argc - first,
         argc - first == 1 ? "" : "s");
  return 0;
}
