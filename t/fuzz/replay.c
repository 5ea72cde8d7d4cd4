/*
 * replay.c - a fuzz target without libFuzzer: each file named on the
 * command line (or each file of a directory named) goes through
 * LLVMFuzzerTestOneInput once. The seeds and the inputs that once crashed
 * (t/fuzz/corpus/TARGET/) run this way in every make check; a crash or a
 * sanitizer report fails it. Prints how many inputs ran (and, with
 * FUZZ_VERBOSE set, each input's path before it runs).
 */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int one(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return -1;
  }
  size_t cap = 4096, n = 0, got;
  uint8_t *buf = malloc(cap);
  while (buf != NULL && (got = fread(buf + n, 1, cap - n, f)) > 0)
    if ((n += got) == cap) {
      uint8_t *p = realloc(buf, cap *= 2);
      if (p == NULL) {
        free(buf);
        buf = NULL;
      } else {
        buf = p;
      }
    }
  fclose(f);
  if (buf == NULL)
    return -1;
  if (getenv("FUZZ_VERBOSE") != NULL)
    printf("input %s\n", path);
  fflush(stdout);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int ran = 0;
  LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      DIR *d = opendir(argv[i]);
      struct dirent *e;
      while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
          continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
        if (one(path) != 0)
          return 1;
        ran++;
      }
      if (d != NULL)
        closedir(d);
    } else {
      if (one(argv[i]) != 0)
        return 1;
      ran++;
    }
  }
  printf("replay: %d inputs\n", ran);
  return 0;
}
