/*
 * checkpoint_save.c - hvd_checkpoint_save (the format:
 * doc/checkpoint-format.md; the steps and their agreement: checkpoint.c).
 * Rank 0 streams the file from the tensors themselves, device ones
 * through a bounce buffer, into "<path>.tmp.<pid>", then fflush, fsync,
 * rename over path and fsync the directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/checkpoint_int.h"
#include "optim/optimizer.h"

static const char save_fn[] = "hvd_checkpoint_save";

static hvd_result_t with_scaler(const hvd_optimizer_t *core,
                                const hvd__counters_t *ctr,
                                hvd__counters_t *all, const char **names,
                                int64_t *values);
static hvd_result_t save_checked(const char *path, const hvd_param_t *params,
                                 int n, const hvd_optimizer_t *opt,
                                 int64_t step, const hvd__counters_t *ctr);

/* ---- save ---------------------------------------------------------------- */

typedef struct writer {
  FILE *f;
  uint64_t sum;
  uint64_t written;
  int err;               /* errno of the first failed write */
  hvd_result_t dev_rc;   /* a failed copy from the device (message set) */
  unsigned char *bounce; /* BOUNCE bytes for device tensors, or NULL */
} writer_t;

#define BOUNCE ((size_t)4 << 20) /* a multiple of every element size */

static void put(writer_t *w, const void *p, size_t n) {
  if (w->err != 0 || n == 0)
    return;
  w->sum = fnv1a(w->sum, p, n);
  errno = 0;
  if (fwrite(p, 1, n, w->f) != n)
    w->err = errno != 0 ? errno : EIO;
  w->written += n;
}

static void put_int(writer_t *w, uint64_t v, int bytes) {
  unsigned char b[8];
  put_le(b, v, bytes);
  put(w, b, (size_t)bytes);
}

static void put_str(writer_t *w, const char *s) {
  size_t len = strlen(s);
  put_int(w, (uint32_t)len, 4);
  put(w, s, len);
}

/* Tensor data, little-endian (swapped through a bounce buffer on a
 * big-endian host). */
static void put_data(writer_t *w, const void *data, size_t bytes,
                     size_t esize) {
  if (host_is_le() || esize <= 1) {
    put(w, data, bytes);
    return;
  }
  unsigned char tmp[4096];
  size_t step = sizeof tmp / esize * esize;
  for (size_t at = 0; at < bytes; at += step) {
    size_t k = bytes - at < step ? bytes - at : step;
    copy_le(tmp, (const unsigned char *)data + at, k, esize);
    put(w, tmp, k);
  }
}

/* A tensor's data: a device tensor's through w->bounce, a chunk at a
 * time; a failed copy stops the writer (w->dev_rc). */
static void put_tensor(writer_t *w, const hvd_tensor_t *t, size_t bytes,
                       size_t esize) {
  if (t->device == HVD_CPU) {
    put_data(w, t->data, bytes, esize);
    return;
  }
  if (w->bounce == NULL && bytes > 0 && (w->bounce = malloc(BOUNCE)) == NULL) {
    w->dev_rc = hvd__set_error(HVD_ERR_NO_MEMORY,
                               "%s: a %zu-byte buffer for device tensors",
                               save_fn, BOUNCE);
    w->err = ENOMEM;
    return;
  }
  for (size_t at = 0; at < bytes && w->err == 0; at += BOUNCE) {
    size_t k = bytes - at < BOUNCE ? bytes - at : BOUNCE;
    hvd_result_t rc = hvd__odev_read(save_fn, w->bounce, t, at, k);
    if (rc != HVD_SUCCESS) {
      w->dev_rc = rc;
      w->err = EIO;
      return;
    }
    put_data(w, w->bounce, k, esize);
  }
}

/* What a file holds besides the model and the optimizer: counters
 * (version 2) and PowerSGD's state (version 3, counters section too). */
typedef struct extras {
  const hvd__counters_t *ctr; /* may be NULL */
  const hvd__psgd_t *psgd;    /* gathered (hvd__psgd_gather), or NULL */
} extras_t;

static int has_psgd(const extras_t *x, int n) {
  hvd__psgd_record_t rec;
  for (int i = 0; x->psgd != NULL && i < n; i++)
    if (hvd__psgd_record(x->psgd, i, &rec))
      return 1;
  return 0;
}

static uint32_t version_of(const extras_t *x, int n) {
  if (has_psgd(x, n))
    return CKPT_VERSION3;
  return x->ctr != NULL && x->ctr->n > 0 ? CKPT_VERSION2 : CKPT_VERSION;
}

/* PowerSGD's section: its records, data included. */
static uint64_t psgd_size(const extras_t *x, int n) {
  hvd__psgd_record_t rec;
  uint64_t size = 4;
  for (int i = 0; i < n; i++) {
    if (!hvd__psgd_record(x->psgd, i, &rec))
      continue;
    size += 4 + strlen(rec.name) + 4 + 8 + 8 + 8 + 4;
    if (rec.qt != NULL)
      size += (uint64_t)(rec.r * rec.m) * sizeof(float);
    if (rec.e != NULL)
      size += (uint64_t)(rec.n * rec.m) * sizeof(float);
  }
  return size;
}

static uint64_t file_size(const hvd_param_t *params, int n,
                          const hvd_optimizer_t *c, const extras_t *x) {
  int ns = c ? c->ops.nstate : 0;
  uint32_t version = version_of(x, n);
  uint64_t size = CKPT_HEADER + 4 + CKPT_SUM;
  if (version >= CKPT_VERSION2) {
    size += 4;
    for (int k = 0; x->ctr != NULL && k < x->ctr->n; k++)
      size += 4 + strlen(x->ctr->names[k]) + 8;
  }
  if (version == CKPT_VERSION3)
    size += psgd_size(x, n);
  if (c != NULL) {
    size += 4 + strlen(c->ops.name ? c->ops.name : "") + 8 + 8 + 4;
    for (int k = 0; k < ns; k++)
      size += 4 + strlen(c->ops.state_names[k]);
  }
  for (int i = 0; i < n; i++)
    size += 4 + strlen(params[i].name) + 4 + 4 +
            8 * (uint64_t)params[i].value.ndim +
            (uint64_t)hvd__tensor_bytes(&params[i].value) * (uint64_t)(1 + ns);
  return size;
}

static void write_psgd(writer_t *w, const extras_t *x, int n) {
  hvd__psgd_record_t rec;
  uint32_t count = 0;
  for (int i = 0; i < n; i++)
    count += (uint32_t)hvd__psgd_record(x->psgd, i, &rec);
  put_int(w, count, 4);
  for (int i = 0; i < n && w->err == 0; i++) {
    if (!hvd__psgd_record(x->psgd, i, &rec))
      continue;
    put_str(w, rec.name);
    put_int(w, (uint32_t)rec.r, 4);
    put_int(w, (uint64_t)rec.n, 8);
    put_int(w, (uint64_t)rec.m, 8);
    put_int(w, rec.draws, 8);
    put_int(w, (uint32_t)((rec.qt != NULL) | (rec.e != NULL) << 1), 4);
    if (rec.qt != NULL)
      put_data(w, rec.qt, (size_t)(rec.r * rec.m) * sizeof(float),
               sizeof(float));
    if (rec.e != NULL)
      put_data(w, rec.e, (size_t)(rec.n * rec.m) * sizeof(float),
               sizeof(float));
  }
}

/* Everything but the checksum. */
static void write_body(writer_t *w, const hvd_param_t *params, int n,
                       const hvd_optimizer_t *c, int64_t step, uint64_t size,
                       const extras_t *x) {
  unsigned char head[CKPT_HEADER];
  const hvd__counters_t *ctr = x->ctr;
  const uint32_t version = version_of(x, n);
  memcpy(head, CKPT_MAGIC, 8);
  put_le(head + 8, version, 4);
  put_le(head + 12, (uint32_t)n, 4);
  put_le(head + 16, size, 8);
  put_le(head + 24, (uint64_t)step, 8);
  put(w, head, sizeof head);
  int ns = c ? c->ops.nstate : 0;
  put_int(w, c != NULL, 4);
  if (c != NULL) {
    uint64_t lr_bits;
    memcpy(&lr_bits, &c->lr, sizeof lr_bits);
    put_str(w, c->ops.name ? c->ops.name : "");
    put_int(w, lr_bits, 8);
    put_int(w, (uint64_t)c->steps, 8);
    put_int(w, (uint32_t)ns, 4);
    for (int k = 0; k < ns; k++)
      put_str(w, c->ops.state_names[k]);
  }
  if (version >= CKPT_VERSION2) {
    put_int(w, ctr != NULL ? (uint32_t)ctr->n : 0, 4);
    for (int k = 0; ctr != NULL && k < ctr->n; k++) {
      put_str(w, ctr->names[k]);
      put_int(w, (uint64_t)ctr->values[k], 8);
    }
  }
  for (int i = 0; i < n && w->err == 0; i++) {
    const hvd_tensor_t *v = &params[i].value;
    size_t bytes = hvd__tensor_bytes(v), esize = hvd_dtype_size(v->dtype);
    put_str(w, params[i].name);
    put_int(w, (uint32_t)v->dtype, 4);
    put_int(w, (uint32_t)v->ndim, 4);
    for (int d = 0; d < v->ndim; d++)
      put_int(w, (uint64_t)v->shape[d], 8);
    put_tensor(w, v, bytes, esize);
    for (int k = 0; k < ns; k++)
      put_tensor(w, &c->state[i * ns + k], bytes, esize);
  }
  if (version == CKPT_VERSION3 && w->err == 0)
    write_psgd(w, x, n);
}

/* fsync of the directory that holds path, so that the rename is durable.
 * Filesystems that cannot sync a directory (EINVAL) are let be. */
static int sync_dir(const char *path, char **dir_out) {
  const char *slash = strrchr(path, '/');
  size_t len = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
  char *dir = malloc(len + 1);
  if (dir == NULL)
    return ENOMEM;
  if (slash == NULL)
    memcpy(dir, ".", 2);
  else {
    memcpy(dir, slash == path ? "/" : path, len);
    dir[len] = '\0';
  }
  *dir_out = dir;
  int fd = open(dir, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int err = fsync(fd) == 0 || errno == EINVAL ? 0 : errno;
  close(fd);
  return err;
}

/* Creates tmp for writing. A stale file of this name can only be from a
 * crashed save by a process with our pid: replace it, and never follow a
 * link planted there. 0 or an errno; *created says whether tmp exists. */
static int create_tmp(const char *tmp, FILE **f, int *created) {
  unlink(tmp);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  *created = fd >= 0;
  if (fd < 0 || (*f = fdopen(fd, "wb")) == NULL) {
    int err = errno;
    if (fd >= 0)
      close(fd);
    return err;
  }
  setvbuf(*f, NULL, _IOFBF, 1 << 20);
  return 0;
}

/* Writes the body and checksum, then flushes, syncs and closes w->f.
 * Failures of the file: *err (an errno) with *doing what failed; others
 * (a device copy, a wrong size) are the result, message set. */
static hvd_result_t write_synced(writer_t *w, const char *path,
                                 const hvd_param_t *params, int n,
                                 const hvd_optimizer_t *c, int64_t step,
                                 const extras_t *x, const char **doing,
                                 int *err) {
  uint64_t size = file_size(params, n, c, x);
  *doing = "write";
  write_body(w, params, n, c, step, size, x);
  put_int(w, w->sum, 8);
  if (w->dev_rc != HVD_SUCCESS || (*err = w->err) != 0)
    return w->dev_rc;
  if (w->written != size) /* a bug in file_size(), never the disk */
    return hvd__set_error(
        HVD_ERR_INTERNAL, "%s: '%s': wrote %llu bytes, expected %llu", save_fn,
        path, (unsigned long long)w->written, (unsigned long long)size);
  if (fflush(w->f) != 0 || ((*doing = "sync"), fsync(fileno(w->f)) != 0)) {
    *err = errno;
    return HVD_SUCCESS;
  }
  *doing = "close";
  FILE *f = w->f;
  w->f = NULL;
  if (fclose(f) != 0)
    *err = errno;
  return HVD_SUCCESS;
}

/* Rank 0's part: the file, written to "<path>.tmp.<pid>" and renamed over
 * path, then the directory synced. */
static hvd_result_t write_file(const char *path, const hvd_param_t *params,
                               int n, const hvd_optimizer_t *c, int64_t step,
                               const extras_t *x) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t tlen = strlen(path) + 32;
  char *tmp = malloc(tlen), *dir = NULL;
  writer_t w = {NULL, FNV_BASIS, 0, 0, HVD_SUCCESS, NULL};
  const char *doing = "create";
  int err = 0, created = 0;
  if (tmp == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: '%s': out of memory", save_fn,
                          path);
  snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
  if ((err = create_tmp(tmp, &w.f, &created)) != 0)
    goto fail;
  rc = write_synced(&w, path, params, n, c, step, x, &doing, &err);
  if (rc != HVD_SUCCESS || err != 0)
    goto fail;
  if (rename(tmp, path) != 0) {
    err = errno;
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot rename '%s' over it: %s",
                        save_fn, path, tmp, strerror(err));
    goto fail;
  }
  created = 0; /* it is path now */
  if ((err = sync_dir(path, &dir)) != 0)
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot sync directory '%s': %s",
                        save_fn, path, dir ? dir : "", strerror(err));
  free(dir);
  free(tmp);
  free(w.bounce);
  return rc;
fail:
  if (rc == HVD_SUCCESS)
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot %s '%s': %s", save_fn,
                        path, doing, tmp, strerror(err ? err : EIO));
  if (w.f != NULL)
    fclose(w.f);
  if (created)
    unlink(tmp);
  free(tmp);
  free(w.bounce);
  return rc;
}

hvd_result_t hvd_checkpoint_save(const char *path, const hvd_param_t *params,
                                 int n, const hvd_optimizer_t *opt,
                                 int64_t step) {
  return hvd__checkpoint_save_ex(path, params, n, opt, step, NULL);
}

hvd_result_t hvd__checkpoint_save_ex(const char *path,
                                     const hvd_param_t *params, int n,
                                     const hvd_optimizer_t *opt, int64_t step,
                                     const hvd__counters_t *ctr) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(save_fn);
  /* mixed precision: the masters are saved in place of the values */
  hvd_param_t *views = NULL;
  hvd_optimizer_t *core = opt ? hvd__optim_core((hvd_optimizer_t *)opt) : NULL;
  hvd_result_t rc = hvd__mixed_ckpt_params(core, params, n, &views);
  if (rc == HVD_SUCCESS) {
    hvd__counters_t all;
    const char *names[HVD__CKPT_MAX_COUNTERS];
    int64_t values[HVD__CKPT_MAX_COUNTERS];
    rc = hvd__ckpt_agree("save.prep", with_scaler(core, ctr, &all, names, values));
    if (rc == HVD_SUCCESS)
      rc = save_checked(path, views ? views : params, n, opt, step,
                        all.n > 0 ? &all : NULL);
    free(views);
    hvd__mixed_ckpt_done(core);
    return rc;
  }
  return hvd__ckpt_agree("save.prep", rc);
}

/* The loss scaler's counters after ctr's (all's arrays: the callers'). */
static hvd_result_t with_scaler(const hvd_optimizer_t *core,
                                const hvd__counters_t *ctr,
                                hvd__counters_t *all, const char **names,
                                int64_t *values) {
  int n = ctr != NULL ? ctr->n : 0, ns = 0;
  int64_t sv[2];
  hvd__mixed_counters(core, sv, &ns);
  if (n + ns > HVD__CKPT_MAX_COUNTERS)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %d counters (at most %d)",
                          save_fn, n + ns, HVD__CKPT_MAX_COUNTERS);
  for (int k = 0; k < n; k++) {
    names[k] = ctr->names[k];
    values[k] = ctr->values[k];
  }
  for (int k = 0; k < ns; k++) {
    names[n + k] = hvd__ckpt_scaler_names[k];
    values[n + k] = sv[k];
  }
  all->n = n + ns;
  all->names = names;
  all->values = values;
  return HVD_SUCCESS;
}

static hvd_result_t save_checked(const char *path, const hvd_param_t *params,
                                 int n, const hvd_optimizer_t *opt,
                                 int64_t step, const hvd__counters_t *ctr) {
  hvd_result_t rc = hvd__ckpt_check_args(save_fn, path, params, n, opt);
  if ((rc = hvd__ckpt_agree("save.args", rc)) != HVD_SUCCESS)
    return rc;
  /* a sharded optimizer's full state, for the time of the write */
  hvd_optimizer_t *o = (hvd_optimizer_t *)opt;
  if (o != NULL &&
      (rc = hvd__ckpt_agree("save.state", hvd__optim_state_gather(o))) != HVD_SUCCESS)
    return rc;
  /* PowerSGD's error feedback averaged over the ranks (agreed) */
  hvd__psgd_t *ps = o != NULL ? hvd__optim_psgd(o) : NULL;
  extras_t x = {ctr, ps};
  rc = hvd__psgd_gather(ps);
  if (rc == HVD_SUCCESS && hvd_rank() == 0)
    rc = write_file(path, params, n, opt ? hvd__optim_core_const(opt) : NULL,
                    step, &x);
  hvd__psgd_release(ps);
  if (o != NULL)
    (void)hvd__optim_state_release(o, 0); /* take 0: nothing to fail */
  return hvd__ckpt_agree("save.result", rc);
}
