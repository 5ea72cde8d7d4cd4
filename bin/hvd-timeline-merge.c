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
    char *open = strchr(buf, '['), *close = strrchr(buf, ']');
    if (open == NULL || close == NULL || close < open) {
      fprintf(stderr,
              "hvd-timeline-merge: '%s' is not a JSON array (an hvd "
              "timeline?)\n",
              argv[i]);
      bad = 1;
    } else {
      char *a = open + 1, *b = close;
      while (a < b && strchr(" \t\r\n", *a) != NULL)
        a++;
      while (b > a && strchr(" \t\r\n,", b[-1]) != NULL)
        b--;
      if (b > a) {
        fputs(events ? ",\n" : "\n", f);
        fwrite(a, 1, (size_t)(b - a), f);
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
