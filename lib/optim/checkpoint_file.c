/*
 * checkpoint_file.c - rank 0's file during hvd_checkpoint_load, read a
 * part at a time so that no rank holds the whole file (checkpoint.c,
 * checkpoint_bulk.c).
 *
 *   open:    open and fstat; magic, size, version from the first bytes;
 *            then the checksum of everything, read in CHUNK-byte parts
 *            (the first failure is the message, as doc/checkpoint-format
 *            .md lists them).
 *   at:      the walk that makes the outline reads the small parts
 *            (names, shapes, scalars) through a window of the file (64
 *            KiB at least a read: it reads once per parameter).
 *   read:    checkpoint_bulk.c reads the tensors' bytes a piece at a
 *            time, and the bytes between them, taking the checksum again
 *            (hvd__ckpt_sum_t), so that a file changed after it was
 *            checked is found, not loaded in silence.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "optim/checkpoint_int.h"

#define CHUNK ((size_t)8 << 20) /* bytes a checksum read takes */
/* Bytes a window read takes at least: a parameter's name and shape sit
 * between its tensors, so each such read is mostly tensor bytes. */
#define WINDOW ((size_t)64 << 10)

int hvd__ckpt_file_read(hvd__ckpt_file_t *f, uint64_t off, void *dst,
                        size_t k) {
  unsigned char *d = dst;
  while (k > 0) {
    ssize_t got = pread(f->fd, d, k, (off_t)off);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      f->err = got < 0 ? errno : EIO; /* 0: the file ended early */
      return 0;
    }
    d += got;
    off += (uint64_t)got;
    k -= (size_t)got;
  }
  return 1;
}

static hvd_result_t read_failed(const char *fn, hvd__ckpt_file_t *f) {
  return hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot read: %s", fn, f->path,
                        strerror(f->err ? f->err : EIO));
}

/* The checksum of the file's first `bytes` bytes into *sum (its
 * version's kind), read CHUNK bytes at a time. */
static hvd_result_t sum_file(const char *fn, hvd__ckpt_file_t *f,
                             uint64_t bytes, uint64_t *sum) {
  hvd__ckpt_sum_t s;
  size_t cap = bytes < CHUNK ? (size_t)bytes : CHUNK;
  unsigned char *buf = malloc(cap ? cap : 1);
  if (buf == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: '%s': cannot allocate %zu bytes", fn, f->path,
                          cap);
  hvd__ckpt_sum_init(&s, f->version);
  for (uint64_t at = 0; at < bytes;) {
    size_t k = bytes - at < cap ? (size_t)(bytes - at) : cap;
    if (!hvd__ckpt_file_read(f, at, buf, k)) {
      free(buf);
      return read_failed(fn, f);
    }
    hvd__ckpt_sum_add(&s, buf, k);
    at += k;
  }
  free(buf);
  *sum = hvd__ckpt_sum_end(&s);
  return HVD_SUCCESS;
}

/* Magic, size, version and checksum, in that order. */
static hvd_result_t check(const char *fn, hvd__ckpt_file_t *f) {
  unsigned char *head = f->head, tail[CKPT_SUM];
  size_t m = f->size < CKPT_HEADER ? (size_t)f->size : CKPT_HEADER;
  uint64_t sum = 0;
  hvd_result_t rc;
  if (!hvd__ckpt_file_read(f, 0, head, m))
    return read_failed(fn, f);
  if (memcmp(head, CKPT_MAGIC, m < 8 ? m : 8) != 0)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': not an hvd checkpoint (bad magic)", fn,
                          f->path);
  if (f->size < CKPT_HEADER + 4 + CKPT_SUM)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': truncated (read %llu of at least %d "
                          "bytes)",
                          fn, f->path, (unsigned long long)f->size,
                          CKPT_HEADER + 4 + CKPT_SUM);
  f->version = (uint32_t)hvd__get_le(head + 8, 4);
  if (f->version < CKPT_VERSION || f->version > CKPT_VERSION5)
    return hvd__set_error(HVD_ERR_UNSUPPORTED,
                          "%s: '%s': format version %u is not supported "
                          "(this hvd reads versions %u to %u)",
                          fn, f->path, f->version, CKPT_VERSION, CKPT_VERSION5);
  uint64_t want = hvd__get_le(head + 16, 8);
  if ((rc = sum_file(fn, f, f->size - CKPT_SUM, &sum)) != HVD_SUCCESS)
    return rc;
  if (!hvd__ckpt_file_read(f, f->size - CKPT_SUM, tail, CKPT_SUM))
    return read_failed(fn, f);
  if (sum != hvd__get_le(tail, 8)) {
    if (want > f->size)
      return hvd__set_error(
          HVD_ERR_CORRUPT, "%s: '%s': truncated (read %llu of %llu bytes)", fn,
          f->path, (unsigned long long)f->size, (unsigned long long)want);
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': checksum mismatch (file corrupt)", fn,
                          f->path);
  }
  if (want != f->size)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': malformed: %llu bytes but the header "
                          "says %llu",
                          fn, f->path, (unsigned long long)f->size,
                          (unsigned long long)want);
  f->sum = sum;
  return HVD_SUCCESS;
}

hvd_result_t hvd__ckpt_file_open(const char *fn, const char *path,
                                 hvd__ckpt_file_t *f) {
  struct stat st;
  memset(f, 0, sizeof *f);
  f->fd = -1;
  f->path = path;
  /* O_NONBLOCK: a FIFO's open would wait for a writer (forever, every
   * rank behind this one); a regular file's reads then block as usual */
  if ((f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)) < 0)
    return hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot open: %s", fn, path,
                          strerror(errno));
  if (fstat(f->fd, &st) != 0)
    return hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot stat: %s", fn, path,
                          strerror(errno));
  if (!S_ISREG(st.st_mode))
    return hvd__set_error(HVD_ERR_IO, "%s: '%s': not a regular file", fn, path);
  int fl = fcntl(f->fd, F_GETFL);
  if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
    return hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot open: %s", fn, path,
                          strerror(errno));
  f->size = (uint64_t)st.st_size;
  return check(fn, f);
}

const unsigned char *hvd__ckpt_file_at(hvd__ckpt_file_t *f, uint64_t off,
                                       size_t k) {
  static const unsigned char none[1];
  if (k == 0) /* an empty string: no read, but not NULL */
    return none;
  if (off >= f->wbase && off - f->wbase <= f->wlen &&
      k <= f->wlen - (size_t)(off - f->wbase))
    return f->win + (off - f->wbase);
  if (off > f->size || k > f->size - off)
    return NULL;
  size_t len = k > WINDOW ? k : WINDOW;
  if (len > f->size - off)
    len = (size_t)(f->size - off);
  if (len > f->wcap) {
    unsigned char *w = realloc(f->win, len ? len : 1);
    if (w == NULL) {
      f->err = ENOMEM;
      return NULL;
    }
    f->win = w;
    f->wcap = len;
  }
  f->wbase = off;
  f->wlen = 0;
  if (!hvd__ckpt_file_read(f, off, f->win, len))
    return NULL;
  f->wlen = len;
  return f->win;
}

void hvd__ckpt_file_close(hvd__ckpt_file_t *f) {
  if (f->fd >= 0)
    close(f->fd);
  free(f->win);
  f->fd = -1;
  f->win = NULL;
  f->wcap = f->wlen = 0;
}
