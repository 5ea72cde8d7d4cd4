/* fuzz_file.c - fuzz.h's file of the current input, removed at exit. */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char path[256];

static void remove_file(void) { unlink(path); }

const char *fuzz_file(const uint8_t *data, size_t size) {
  if (path[0] == '\0') {
    const char *t = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/hvd-fuzz.%ld", t && *t ? t : "/tmp",
             (long)getpid());
    atexit(remove_file);
  }
  FILE *f = fopen(path, "wb");
  if (f == NULL || (size > 0 && fwrite(data, 1, size, f) != size) ||
      fclose(f) != 0) {
    perror(path);
    abort();
  }
  return path;
}
