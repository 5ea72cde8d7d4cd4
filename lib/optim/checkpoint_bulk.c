/*
 * checkpoint_bulk.c - the tensor bytes of a checkpoint being loaded, from
 * rank 0's file to every rank, a piece at a time.
 *
 * hvd_checkpoint_load (checkpoint.c) gives every rank the file's outline
 * (the file without its tensor bytes) to check against its model; then
 * the walk that applies it asks for each tensor's bytes here: the file's
 * bytes [off, off + bytes) into tensor t from byte t_off. They travel as
 * uint8 broadcasts "hvd.ckpt.load.<k>" of at most HVD_CHECKPOINT_PIECE
 * bytes (64 MiB), submitted in batches of as many bytes at most and of
 * MAX_BATCH pieces, each batch
 * waited for before the next. Every rank, rank 0 that reads the piece
 * from the file and sends it included, takes it straight into a host
 * tensor when the file's byte order is the host's; otherwise (a device
 * tensor, a big-endian host, bytes no tensor takes) into its bounce
 * buffer of one piece, copied on after the batch. So no rank holds more
 * than a piece of the file, whatever its size. A ZeRO-1 rank's mixed
 * precision master (hvd__ckpt_bulk_add_low) is taken the same way: its
 * block into the master's block, and every piece rounded in the bounce
 * buffer into the low-precision value, so that no rank makes the whole
 * float32 master.
 *
 * Rank 0 reads the file in order: each piece, the bytes between pieces
 * (which must be the outline's, as every rank checked them) and the
 * tensors' bytes a load skips (hvd__ckpt_bulk_skip), and takes the
 * file's checksum again on the way; at the end it must be the one
 * checked at the open. A file rewritten in place during the load thus
 * fails it (on every rank, after the model was written) rather than
 * loading a mix in silence.
 *
 * A copy that fails on one rank (to its GPU, say) is remembered, and the
 * rank goes on taking part in every broadcast: the first failure is the
 * result of hvd__ckpt_bulk_end, and the caller agrees on it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/half.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/checkpoint_int.h"
#include "optim/device.h"

#define MAX_BATCH 256          /* pieces in flight at once */
#define GAP ((size_t)64 << 10) /* rank 0's reads between pieces */

typedef struct piece {
  hvd_tensor_t *t;     /* NULL: the bytes go nowhere */
  size_t bytes, esize; /* on the wire */
  size_t skip, len;    /* what t takes of them: [skip, skip + len) */
  size_t t_off;        /* where in t */
  hvd_tensor_t *low;   /* or NULL: float32 elements all rounded into this
                          float16 or bfloat16 tensor, */
  size_t low_off;      /* from its byte low_off */
  unsigned char *src;  /* where the bytes are once the batch is done */
  int copy;            /* 1: to be copied from src into t */
  hvd_request_t *req;
} piece_t;

struct hvd__ckpt_bulk {
  const char *fn;
  hvd__ckpt_file_t *file;  /* rank 0: the file; elsewhere NULL */
  const unsigned char *ol; /* rank 0: the outline every rank checked */
  size_t olsize, olpos;    /* its size short of the checksum; how far */
  uint64_t rpos;           /* rank 0: the file read up to here */
  hvd__ckpt_sum_t sum;     /* rank 0: of the bytes before rpos */
  unsigned char *gap;      /* rank 0: GAP bytes for the reads between */
  unsigned char *bounce;
  size_t piece;     /* HVD_CHECKPOINT_PIECE: bytes a piece and a batch
                       carry at most */
  size_t cap, used; /* the bounce buffer's size; a batch's bytes */
  piece_t batch[MAX_BATCH];
  int n;
  uint64_t seq;    /* pieces so far: their names */
  hvd_result_t rc; /* the first failure */
  char msg[HVD__ERRMSG_MAX];
};

void hvd__ckpt_bulk_fail(hvd__ckpt_bulk_t *b, hvd_result_t rc) {
  if (rc != HVD_SUCCESS && b->rc == HVD_SUCCESS) {
    b->rc = rc;
    snprintf(b->msg, sizeof b->msg, "%s", hvd_last_error());
  }
}

hvd_result_t hvd__ckpt_bulk_new(const char *fn, hvd__ckpt_file_t *file,
                                const unsigned char *ol, size_t olsize,
                                hvd__ckpt_bulk_t **out) {
  hvd__ckpt_bulk_t *b = calloc(1, sizeof *b);
  uint64_t body = hvd__get_le(ol + 16, 8);
  *out = NULL;
  if (b == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: the load's state", fn);
  b->fn = fn;
  b->file = file;
  b->ol = ol;
  b->olsize = olsize - CKPT_SUM;
  b->piece = hvd__checkpoint_piece();
  b->cap = body < b->piece ? (size_t)body : b->piece;
  if (file != NULL)
    hvd__ckpt_sum_init(&b->sum, file->version);
  /* untouched unless used: a host-only model on a little-endian host
   * never makes these pages resident */
  b->bounce = malloc(b->cap ? b->cap : 1);
  b->gap = file != NULL ? malloc(GAP) : NULL;
  if (b->bounce == NULL || (file != NULL && b->gap == NULL)) {
    size_t cap = b->cap;
    free(b->bounce);
    free(b);
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: cannot allocate %zu bytes to take the file a "
                          "piece at a time",
                          fn, cap);
  }
  *out = b;
  return HVD_SUCCESS;
}

/* Rank 0: the file's next k bytes (at b->rpos) into dst, into the
 * checksum; a read that fails is remembered (dst keeps what it had). */
static void read_on(hvd__ckpt_bulk_t *b, unsigned char *dst, size_t k) {
  if (!hvd__ckpt_file_read(b->file, b->rpos, dst, k))
    hvd__ckpt_bulk_fail(
        b, hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot read: %s", b->fn,
                          b->file->path, strerror(b->file->err)));
  hvd__ckpt_sum_add(&b->sum, dst, k);
  b->rpos += k;
}

static void changed(hvd__ckpt_bulk_t *b) {
  hvd__ckpt_bulk_fail(
      b, hvd__set_error(HVD_ERR_CORRUPT,
                        "%s: '%s': the file changed while it was loaded "
                        "(it no longer matches what was checked); the model "
                        "holds a mix of its old and new bytes",
                        b->fn, b->file->path));
}

/* Rank 0: the file read up to x; the bytes between pieces must be the
 * outline's (skipped: the checksum only). */
static void read_to(hvd__ckpt_bulk_t *b, uint64_t x, int outline) {
  while (b->rpos < x) {
    size_t k = x - b->rpos < GAP ? (size_t)(x - b->rpos) : GAP;
    read_on(b, b->gap, k);
    if (!outline)
      continue;
    if (k > b->olsize - b->olpos || memcmp(b->gap, b->ol + b->olpos, k) != 0)
      changed(b);
    b->olpos = k > b->olsize - b->olpos ? b->olsize : b->olpos + k;
  }
}

void hvd__ckpt_bulk_skip(hvd__ckpt_bulk_t *b, uint64_t off, uint64_t bytes) {
  if (b->file == NULL)
    return;
  read_to(b, off, 1);
  read_to(b, off + bytes, 0);
}

/* Reverses each element's bytes in place (little-endian <-> big). */
static void swap_in_place(unsigned char *p, size_t bytes, size_t esize) {
  for (size_t at = 0; at + esize <= bytes; at += esize)
    for (size_t i = 0, j = esize - 1; i < j; i++, j--) {
      unsigned char c = p[at + i];
      p[at + i] = p[at + j];
      p[at + j] = c;
    }
}

/* A master's piece (float32, host order at src) rounded in place into
 * the low-precision elements, then written into q->low. The elements
 * are read and written through memcpy, in order: element i's two bytes
 * land on bytes that elements up to i had, already read. */
static hvd_result_t round_piece(const char *fn, piece_t *q) {
  size_t n = q->bytes / sizeof(float);
  int f16 = q->low->dtype == HVD_FLOAT16;
  for (size_t i = 0; i < n; i++) {
    float v;
    memcpy(&v, q->src + i * sizeof v, sizeof v);
    uint16_t h = f16 ? hvd__f32_to_f16(v) : hvd__f32_to_bf16(v);
    memcpy(q->src + i * sizeof h, &h, sizeof h);
  }
  if (q->low->device == HVD_CPU) {
    memcpy((unsigned char *)q->low->data + q->low_off, q->src, n * 2);
    return HVD_SUCCESS;
  }
  return hvd__odev_write(fn, q->low, q->low_off, q->src, n * 2);
}

/* The piece's bytes, little-endian at src, into its tensor, and rounded
 * into its low-precision one. */
static hvd_result_t copy_piece(const char *fn, piece_t *q) {
  hvd_result_t rc = HVD_SUCCESS;
  if (!hvd__host_is_le() && q->esize > 1)
    swap_in_place(q->src, q->bytes, q->esize);
  if (q->t != NULL && q->t->device == HVD_CPU)
    memcpy((unsigned char *)q->t->data + q->t_off, q->src + q->skip, q->len);
  else if (q->t != NULL)
    rc = hvd__odev_write(fn, q->t, q->t_off, q->src + q->skip, q->len);
  return rc == HVD_SUCCESS && q->low != NULL ? round_piece(fn, q) : rc;
}

hvd_result_t hvd__ckpt_bulk_flush(hvd__ckpt_bulk_t *b) {
  for (int i = 0; i < b->n; i++)
    if (b->batch[i].req != NULL)
      hvd__ckpt_bulk_fail(b, hvd_wait(b->batch[i].req));
  for (int i = 0; i < b->n && b->rc == HVD_SUCCESS; i++)
    if (b->batch[i].copy)
      hvd__ckpt_bulk_fail(b, copy_piece(b->fn, &b->batch[i]));
  b->n = 0;
  b->used = 0;
  return b->rc;
}

/* One piece: bytes [a, a + bytes) of a tensor's range in the file (at
 * off), of which t takes [lo, hi) from its byte 0. Its broadcast is
 * submitted. */
static void add_piece(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                      uint64_t a, size_t bytes, size_t esize, uint64_t lo,
                      uint64_t hi, hvd_tensor_t *low) {
  if (b->n == MAX_BATCH || b->used + bytes > b->piece)
    hvd__ckpt_bulk_flush(b);
  piece_t *q = &b->batch[b->n++];
  uint64_t from = a > lo ? a : lo, to = a + bytes < hi ? a + bytes : hi;
  *q = (piece_t){.t = from < to ? t : NULL,
                 .bytes = bytes,
                 .esize = esize,
                 .low = low,
                 .low_off = (size_t)(a / 2)}; /* 4 bytes to 2 */
  if (q->t != NULL) {
    q->skip = (size_t)(from - a);
    q->len = (size_t)(to - from);
    q->t_off = (size_t)(from - lo);
  }
  int direct = q->t != NULL && q->t->device == HVD_CPU && q->len == bytes &&
               low == NULL && (hvd__host_is_le() || esize <= 1);
  q->src =
      direct ? (unsigned char *)q->t->data + q->t_off : b->bounce + b->used;
  q->copy = (q->t != NULL || low != NULL) && !direct;
  if (b->file != NULL) { /* rank 0 reads what it sends */
    read_to(b, off + a, 1);
    read_on(b, q->src, bytes);
  }
  b->used += bytes;
  int64_t len = (int64_t)bytes;
  hvd_tensor_t wire = hvd_tensor_make(q->src, HVD_UINT8, 1, &len);
  char name[64];
  snprintf(name, sizeof name, "hvd.ckpt.load.%llu",
           (unsigned long long)b->seq++);
  /* a tensor made here cannot be refused but by a dying engine */
  hvd__ckpt_bulk_fail(b, hvd_broadcast_async(name, &wire, 0, &q->req));
}

static void add_range(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                      uint64_t bytes, size_t esize, uint64_t lo, uint64_t hi,
                      hvd_tensor_t *low) {
  for (uint64_t a = 0; a < bytes;) { /* pieces of a multiple of 16 bytes */
    size_t k = bytes - a < b->piece ? (size_t)(bytes - a) : b->piece;
    add_piece(b, t, off, a, k, esize, lo, hi, low);
    a += k;
  }
}

void hvd__ckpt_bulk_add(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                        uint64_t bytes, size_t esize, uint64_t lo,
                        uint64_t hi) {
  add_range(b, t, off, bytes, esize, lo, hi, NULL);
}

void hvd__ckpt_bulk_add_low(hvd__ckpt_bulk_t *b, hvd_tensor_t *t, uint64_t off,
                            uint64_t bytes, uint64_t lo, uint64_t hi,
                            hvd_tensor_t *low) {
  add_range(b, t, off, bytes, sizeof(float), lo, hi, low);
}

hvd_result_t hvd__ckpt_bulk_end(hvd__ckpt_bulk_t *b) {
  if (b == NULL)
    return HVD_SUCCESS;
  if (b->file != NULL) { /* the rest, and the checksum again */
    read_to(b, b->file->size - CKPT_SUM, 1);
    if (b->olpos != b->olsize || hvd__ckpt_sum_end(&b->sum) != b->file->sum)
      changed(b);
  }
  hvd_result_t rc = hvd__ckpt_bulk_flush(b);
  if (rc != HVD_SUCCESS)
    hvd__set_error_msg(rc, b->msg);
  free(b->bounce);
  free(b->gap);
  free(b);
  return rc;
}
