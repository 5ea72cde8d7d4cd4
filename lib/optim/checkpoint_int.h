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
#define CKPT_VERSION5 5u     /* and the hyperparameters' section */
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

/* The checksum of a file of format version `version`: FNV-1a to version
 * 3, hvd__sum64 from 4, taken a part at a time. */
typedef struct hvd__ckpt_sum {
  int words; /* 1: hvd__sum64 */
  uint64_t fnv;
  hvd__sum_t s;
} hvd__ckpt_sum_t;

static inline void hvd__ckpt_sum_init(hvd__ckpt_sum_t *s, uint32_t version) {
  s->words = version >= CKPT_VERSION4;
  s->fnv = FNV_BASIS;
  hvd__sum_init(&s->s);
}

static inline void hvd__ckpt_sum_add(hvd__ckpt_sum_t *s, const void *p,
                                     size_t n) {
  if (s->words)
    hvd__sum_add(&s->s, p, n);
  else
    s->fnv = fnv1a(s->fnv, p, n);
}

static inline uint64_t hvd__ckpt_sum_end(const hvd__ckpt_sum_t *s) {
  return s->words ? hvd__sum_end(&s->s) : s->fnv;
}

/* ---- rank 0's file during a load (checkpoint_file.c) ---- */

typedef struct hvd__ckpt_file {
  const char *path;
  int fd;        /* -1: not open (every rank but 0) */
  uint64_t size; /* at the open */
  uint32_t version;
  uint64_t sum;                    /* its checksum, checked */
  unsigned char head[CKPT_HEADER]; /* its header, as checked */
  int err;            /* errno of the last failed read (EIO: too short) */
  unsigned char *win; /* hvd__ckpt_file_at's window */
  uint64_t wbase;
  size_t wlen, wcap;
} hvd__ckpt_file_t;

/* Opens path and checks magic, size, version and checksum (the messages
 * of doc/checkpoint-format.md, fn naming the call); f is closed by
 * hvd__ckpt_file_close in any case. */
hvd_result_t hvd__ckpt_file_open(const char *fn, const char *path,
                                 hvd__ckpt_file_t *f);
/* k bytes at off through the window, valid until the next call; NULL
 * past the end or when a read fails (f->err). */
const unsigned char *hvd__ckpt_file_at(hvd__ckpt_file_t *f, uint64_t off,
                                       size_t k);
/* k bytes at off into dst: 1, or 0 (f->err) when a read fails. */
int hvd__ckpt_file_read(hvd__ckpt_file_t *f, uint64_t off, void *dst, size_t k);
void hvd__ckpt_file_close(hvd__ckpt_file_t *f);

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
 * Every rank makes one (rank 0 with its open file, the others with NULL;
 * ol: the outline every rank checked), adds or skips every tensor range
 * of the file in the file's order, the same on every rank, and ends it;
 * a failed new is agreed on. */
typedef struct hvd__ckpt_bulk hvd__ckpt_bulk_t;
hvd_result_t hvd__ckpt_bulk_new(const char *fn, hvd__ckpt_file_t *file,
                                const unsigned char *ol, size_t olsize,
                                hvd__ckpt_bulk_t **out);
/* A tensor range of the file that no rank takes (rank 0 reads it for the
 * checksum; nothing is sent). */
void hvd__ckpt_bulk_skip(hvd__ckpt_bulk_t *b, uint64_t off, uint64_t bytes);
/* A tensor's bytes in the file, [off, off + bytes), little-endian
 * elements of esize bytes: their bytes [lo, hi) into t from its byte 0
 * (the whole: 0, bytes; a ZeRO-1 block: its part), the rest nowhere (t
 * NULL: all of them). Every rank sends or receives all of them, in
 * pieces; done by the next flush or end at the latest. */
void hvd__ckpt_bulk_add(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                        uint64_t bytes, size_t esize, uint64_t lo, uint64_t hi);
/* A ZeRO-1 core's float32 master of a low-precision parameter in the
 * file, [off, off + bytes): its bytes [lo, hi) into this rank's block t
 * (as hvd__ckpt_bulk_add), and every element rounded into low (the
 * float16 or bfloat16 value of bytes / 4 elements), in pieces. */
void hvd__ckpt_bulk_add_low(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                            uint64_t bytes, uint64_t lo, uint64_t hi,
                            hvd_tensor_t *low);
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
