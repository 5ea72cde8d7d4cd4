/*
 * checkpoint_int.h - what checkpoint.c (load, the arguments, the
 * agreement) and checkpoint_save.c (save, synchronous and in the
 * background) share: the format's constants (doc/checkpoint-format.md)
 * and versions 1 to 3's checksum (the byte order: base/le.h; version 4's
 * checksum: base/checksum.h).
 */
#ifndef HVD_OPTIM_CHECKPOINT_INT_H
#define HVD_OPTIM_CHECKPOINT_INT_H

#include <stdint.h>
#include <string.h>

#include "base/checksum.h"
#include "base/le.h"
#include "optim/optimizer.h"

#define CKPT_MAGIC "HVDCKPT" /* 8 bytes with its NUL */
#define CKPT_VERSION 1u      /* without counters */
#define CKPT_VERSION2 2u     /* with a counters section (hvd_state) */
#define CKPT_VERSION3 3u     /* and PowerSGD's section */
#define CKPT_VERSION4 4u     /* version 3's layout, hvd__sum64's checksum */
#define CKPT_HEADER 32       /* magic, version, count, file size, step */
#define CKPT_SUM 8           /* the trailing checksum */
#define FNV_BASIS 0xcbf29ce484222325ull
#define FNV_PRIME 0x00000100000001b3ull

/* Counters a file may hold: hvd_state's and the loss scaler's. */
#define HVD__CKPT_MAX_COUNTERS 64
extern const char *const hvd__ckpt_scaler_names[2];

/* ---- bytes --------------------------------------------------------------- */

static inline uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * FNV_PRIME;
  return h;
}

/* ---- agreement and arguments (checkpoint.c) ---- */

/* hvd__optim_agree under "hvd.ckpt.<what>": every rank gets the result
 * and message of the lowest failing rank. */
hvd_result_t hvd__ckpt_agree(const char *what, hvd_result_t local);
/* The checks of save and load on this rank's arguments (fn names the
 * call in the message). */
hvd_result_t hvd__ckpt_check_args(const char *fn, const char *path,
                                  const hvd_param_t *params, int n,
                                  const hvd_optimizer_t *opt);

/* ---- a load's tensor bytes (checkpoint_bulk.c) ---- */

/* The tensor bytes of a file being loaded, from rank 0 to every rank.
 * Every rank makes one (rank 0 with the whole file, the others with NULL;
 * body: the file's size, which bounds the bounce buffer), adds the same
 * ranges in the same order, and ends it; a failed new is agreed on. */
typedef struct hvd__ckpt_bulk hvd__ckpt_bulk_t;
hvd_result_t hvd__ckpt_bulk_new(const char *fn, unsigned char *file,
                                uint64_t body, hvd__ckpt_bulk_t **out);
/* A tensor's bytes in the file, [off, off + bytes), little-endian
 * elements of esize bytes: their bytes [lo, hi) into t from its byte 0
 * (the whole: 0, bytes; a ZeRO-1 block: its part), the rest nowhere (t
 * NULL: all of them). Every rank sends or receives all of them, in
 * pieces; done by the next flush or end at the latest. */
void hvd__ckpt_bulk_add(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                        uint64_t bytes, size_t esize, uint64_t lo, uint64_t hi);
/* Remembers rc with hvd_last_error() when it is this rank's first
 * failure (HVD_SUCCESS: nothing). */
void hvd__ckpt_bulk_fail(hvd__ckpt_bulk_t *b, hvd_result_t rc);
/* Completes every range added: HVD_SUCCESS, or this rank's first failure
 * so far (the rank still takes part in what follows). */
hvd_result_t hvd__ckpt_bulk_flush(hvd__ckpt_bulk_t *b);
/* Flushes, frees b (NULL: nothing) and returns the first failure, with
 * its message. */
hvd_result_t hvd__ckpt_bulk_end(hvd__ckpt_bulk_t *b);

#endif /* HVD_OPTIM_CHECKPOINT_INT_H */
