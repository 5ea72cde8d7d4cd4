/*
 * objects.c - hvd_broadcast_object and hvd_allgather_object: bytes whose
 * sizes the receivers do not know, exact on every rank, from every root;
 * empty objects; a config struct; a 4 MiB object; ranks that name
 * different roots; every argument error with its message.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"
#include "tap/tap.h"

static int rank, size;

static unsigned char pattern(int who, size_t i) {
  return (unsigned char)((i * 7 + (size_t)who * 31 + 1) & 0xff);
}

static unsigned char *make(int who, size_t n) {
  unsigned char *p = malloc(n > 0 ? n : 1);
  if (p == NULL)
    bail("out of memory");
  for (size_t i = 0; i < n; i++)
    p[i] = pattern(who, i);
  return p;
}

/* 1 if n bytes at p are who's pattern; else says where they differ. */
static int is_pattern(const unsigned char *p, int who, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(who, i)) {
      diag("byte %zu is %d, expected %d", i, p[i], pattern(who, i));
      return 0;
    }
  return 1;
}

static void test_broadcast(void) {
  for (int root = 0; root < size; root++)
    for (int big = 0; big < 3; big++) {
      size_t n = big == 0 ? 0 : big == 1 ? 1000 * (size_t)root + 37 : 4u << 20;
      unsigned char *mine = rank == root ? make(root, n) : NULL;
      void *out = NULL;
      size_t got = 12345;
      char name[64];
      snprintf(name, sizeof name, "obj.%d.%d", root, big);
      hvd_result_t rc = hvd_broadcast_object(name, mine, n, root, &out, &got);
      is_int(HVD_SUCCESS, rc, "broadcast of %zu bytes from root %d", n, root);
      if (rc != HVD_SUCCESS)
        diag("%s", hvd_last_error());
      is_int((long long)n, (long long)got, "  its length");
      ok(out != NULL && is_pattern(out, root, got), "  its bytes");
      ok(out != (void *)mine, "  a copy, on the root too");
      free(out);
      free(mine);
    }

  /* a config struct, the receivers passing NULL */
  typedef struct config {
    int layers;
    double lr;
    char name[16];
  } config_t;
  config_t cfg = {0}, *got = NULL;
  int root = size - 1;
  if (rank == root)
    cfg = (config_t){.layers = 12, .lr = 0.00125, .name = "bert-base"};
  size_t len = 0;
  is_int(HVD_SUCCESS,
         hvd_broadcast_object("config", rank == root ? &cfg : NULL,
                              rank == root ? sizeof cfg : 0, root,
                              (void **)&got, &len),
         "config struct from rank %d", root);
  ok(len == sizeof cfg && got != NULL && got->layers == 12 &&
         got->lr == 0.00125 && strcmp(got->name, "bert-base") == 0,
     "  every field arrived");
  free(got);
}

static void test_allgather(void) {
  /* rank r sends 333 r bytes: rank 0 none */
  size_t n = 333 * (size_t)rank;
  unsigned char *mine = make(rank, n);
  size_t *lens = calloc((size_t)size, sizeof *lens);
  void *out = NULL;
  hvd_result_t rc = hvd_allgather_object("gather", mine, n, &out, lens);
  is_int(HVD_SUCCESS, rc, "allgather of 333 x rank bytes");
  int lens_ok = 1, bytes_ok = out != NULL;
  size_t at = 0;
  for (int r = 0; r < size; r++) {
    lens_ok &= lens[r] == 333 * (size_t)r;
    if (bytes_ok)
      bytes_ok = is_pattern((unsigned char *)out + at, r, 333 * (size_t)r);
    at += 333 * (size_t)r;
  }
  ok(lens_ok, "  each rank's length");
  ok(bytes_ok, "  the bytes in rank order");
  free(out);

  /* lens may be NULL */
  out = NULL;
  is_int(HVD_SUCCESS, hvd_allgather_object("gather2", mine, n, &out, NULL),
         "allgather with lens NULL");
  size_t last = 333 * (size_t)(size - 1) * (size_t)(size - 2) / 2;
  ok(out != NULL && is_pattern((unsigned char *)out + last, size - 1,
                               333 * (size_t)(size - 1)),
     "  the last rank's bytes at the end");
  free(out);

  /* nobody sends anything */
  out = NULL;
  for (int r = 0; r < size; r++)
    lens[r] = 99;
  is_int(HVD_SUCCESS, hvd_allgather_object("empty", NULL, 0, &out, lens),
         "allgather of nothing");
  int zero = 1;
  for (int r = 0; r < size; r++)
    zero &= lens[r] == 0;
  ok(out != NULL && zero, "  a buffer to free, every length 0");
  free(out);
  free(lens);
  free(mine);
}

static void test_errors(void) {
  void *out = (void *)&rank;
  size_t len = 0;
  char c = 'x';
  static const struct {
    const char *what, *name;
    int root, null_out, null_len, null_data;
    const char *msg;
  } bcast[] = {
      {"NULL name", NULL, 0, 0, 0, 0,
       "hvd_broadcast_object: the name is NULL"},
      {"empty name", "", 0, 0, 0, 0, "hvd_broadcast_object: the name is empty"},
      {"out NULL", "e", 0, 1, 0, 0, "hvd_broadcast_object 'e': out is NULL"},
      {"out_len NULL", "e", 0, 0, 1, 0,
       "hvd_broadcast_object 'e': out_len is NULL"},
      {"root -1", "e", -1, 0, 0, 0, NULL},
      {"root = size", "e", -2, 0, 0, 0, NULL},
  };
  for (size_t k = 0; k < sizeof bcast / sizeof bcast[0]; k++) {
    int root = bcast[k].root == -2 ? size : bcast[k].root;
    char want[128];
    if (bcast[k].msg != NULL)
      snprintf(want, sizeof want, "%s", bcast[k].msg);
    else
      snprintf(want, sizeof want,
               "hvd_broadcast_object 'e': root %d is out of range 0..%d", root,
               size - 1);
    hvd_result_t rc = hvd_broadcast_object(
        bcast[k].name, &c, 1, root, bcast[k].null_out ? NULL : &out,
        bcast[k].null_len ? NULL : &len);
    is_int(HVD_ERR_INVALID_ARG, rc, "broadcast, %s: code", bcast[k].what);
    is_string(want, hvd_last_error(), "broadcast, %s: message", bcast[k].what);
  }
  /* data NULL with bytes: an error on the root only, so every rank plays
   * the root here */
  hvd_result_t rc = hvd_broadcast_object("e", NULL, 5, rank, &out, &len);
  is_int(HVD_ERR_INVALID_ARG, rc, "broadcast, data NULL on the root: code");
  is_string("hvd_broadcast_object 'e': data is NULL with 5 bytes",
            hvd_last_error(), "broadcast, data NULL on the root: message");

  rc = hvd_allgather_object("g", NULL, 5, &out, NULL);
  is_int(HVD_ERR_INVALID_ARG, rc, "allgather, data NULL: code");
  is_string("hvd_allgather_object 'g': data is NULL with 5 bytes",
            hvd_last_error(), "allgather, data NULL: message");
  rc = hvd_allgather_object("g", &c, 1, NULL, NULL);
  is_int(HVD_ERR_INVALID_ARG, rc, "allgather, out NULL: code");
  is_string("hvd_allgather_object 'g': out is NULL", hvd_last_error(),
            "allgather, out NULL: message");

  /* ranks that name different roots: rank 0 says 0, the others 1 */
  if (size > 1) {
    int root = rank == 0 ? 0 : 1;
    out = NULL;
    rc = hvd_broadcast_object("roots", &c, 1, root, &out, &len);
    is_int(HVD_ERR_MISMATCH, rc, "different roots: HVD_ERR_MISMATCH");
    char want[256];
    size_t at = (size_t)snprintf(
        want, sizeof want,
        "broadcast 'hvd.object.roots.size': rank 0 root 0 vs");
    for (int r = 1; r < size; r++)
      at += (size_t)snprintf(want + at, sizeof want - at, "%s rank %d root 1",
                             r > 1 ? "," : "", r);
    is_string(want, hvd_last_error(), "different roots: the message");
    ok(out == NULL, "different roots: no object");
  }
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  void *out = NULL;
  size_t len;
  is_int(HVD_ERR_NOT_INITIALIZED,
         hvd_broadcast_object("x", "a", 1, 0, &out, &len),
         "before hvd_init: not initialized");
  is_string("hvd_broadcast_object: hvd_init() has not been called",
            hvd_last_error(), "before hvd_init: message");
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  test_broadcast();
  test_allgather();
  test_errors();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
