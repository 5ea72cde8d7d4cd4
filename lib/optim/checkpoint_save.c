/*
 * checkpoint_save.c - hvd_checkpoint_save (the format:
 * doc/checkpoint-format.md; the steps and their agreement: checkpoint.c).
 * Rank 0 streams the file from the tensors themselves, device ones
 * through a bounce buffer, into "<path>.tmp.<pid>" (made new: O_EXCL), then
 * fflush, fsync, rename over path and fsync the directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/forked.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/checkpoint_int.h"
#include "optim/optimizer.h"

static const char save_fn[] = "hvd_checkpoint_save";

static hvd_result_t with_scaler(const char *fn, const hvd_optimizer_t *core,
                                const hvd__counters_t *ctr,
                                hvd__counters_t *all, const char **names,
                                int64_t *values);

/* ---- save ---------------------------------------------------------------- */

/* A sharded optimizer's full state reaches rank 0 a parameter at a time,
 * as the file is written (hvd__optim_root_param: its state tensors and,
 * with mixed precision, its whole master), and goes as soon as it is
 * written, so that rank 0 holds one parameter's at most. The gathers are
 * collectives: every rank takes part in every parameter's, in order,
 * whatever failed (feed_finish). */
typedef struct feed {
  hvd_optimizer_t *o;      /* sharded; NULL: nothing to gather */
  const hvd_param_t *user; /* the caller's parameters */
  hvd_param_t *views;      /* mixed precision's, pointed at the whole
                              masters as they arrive; or NULL */
  int next;                /* parameters gathered so far */
  hvd_result_t rc;         /* the first failure */
  char msg[HVD__ERRMSG_MAX];
} feed_t;

/* Parameter i's full state on rank 0 (and its view's master): 1, or 0
 * when this or an earlier gather failed. */
static int feed_take(feed_t *f, int i) {
  if (f == NULL || f->o == NULL)
    return 1;
  hvd_tensor_t *master = NULL;
  hvd_result_t rc = hvd__optim_root_param(f->o, i, &f->user[i], &master);
  f->next = i + 1;
  if (rc != HVD_SUCCESS && f->rc == HVD_SUCCESS) {
    f->rc = rc;
    snprintf(f->msg, sizeof f->msg, "%s", hvd_last_error());
  }
  if (f->views != NULL && master != NULL)
    f->views[i].value = *master; /* its data: rank 0's, or NULL */
  return f->rc == HVD_SUCCESS;
}

static void feed_drop(feed_t *f, int i) {
  if (f != NULL && f->o != NULL)
    hvd__optim_drop_param(f->o, i, &f->user[i]);
}

/* The gathers that this rank has not taken part in yet (all of them but
 * on a rank 0 that wrote the file), in order. */
static void feed_finish(feed_t *f, int n) {
  for (int i = f->next; f->o != NULL && i < n; i++) {
    (void)feed_take(f, i);
    feed_drop(f, i);
  }
}

typedef struct writer {
  const char *fn; /* the call, for messages */
  FILE *f;
  unsigned char *mem; /* in place of f: a snapshot of cap bytes */
  uint64_t cap;
  int nosum;      /* the snapshot's checksum is the writer thread's to take */
  hvd__sum_t sum; /* of what was put (hvd__sum64's, version 4) */
  uint64_t written;
  int err;                       /* errno of the first failed write */
  hvd_result_t dev_rc;           /* a failed copy from the device, or gather */
  char dev_msg[HVD__ERRMSG_MAX]; /* its message (set again at the end) */
  unsigned char *bounce;         /* BOUNCE bytes for device tensors, or NULL */
  feed_t *feed;                  /* a sharded optimizer's state, or NULL */
} writer_t;

#define BOUNCE ((size_t)4 << 20) /* a multiple of every element size */

/* rc with its message, kept in w (the writer stops at its next put). */
__attribute__((format(printf, 3, 4))) static hvd_result_t
writer_fail(writer_t *w, hvd_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->dev_msg, sizeof w->dev_msg, fmt, ap);
  va_end(ap);
  return hvd__set_error_msg(rc, w->dev_msg);
}

static void put(writer_t *w, const void *p, size_t n) {
  if (w->err != 0 || n == 0)
    return;
  if (!w->nosum)
    hvd__sum_add(&w->sum, p, n);
  errno = 0;
  if (w->mem == NULL && fwrite(p, 1, n, w->f) != n)
    w->err = errno != 0 ? errno : EIO;
  else if (w->mem != NULL && w->written + n > w->cap)
    w->err = EOVERFLOW; /* a bug in file_size(), never the memory */
  else if (w->mem != NULL)
    memcpy(w->mem + w->written, p, n);
  w->written += n;
}

static void put_int(writer_t *w, uint64_t v, int bytes) {
  unsigned char b[8];
  hvd__put_le(b, v, bytes);
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
  if (hvd__host_is_le() || esize <= 1) {
    put(w, data, bytes);
    return;
  }
  unsigned char tmp[4096];
  size_t step = sizeof tmp / esize * esize;
  for (size_t at = 0; at < bytes; at += step) {
    size_t k = bytes - at < step ? bytes - at : step;
    hvd__copy_le(tmp, (const unsigned char *)data + at, k, esize);
    put(w, tmp, k);
  }
}

/* A tensor's data: a device tensor's through w->bounce, a chunk at a
 * time; a failed copy stops the writer (w->dev_rc). */
static void put_tensor(writer_t *w, const hvd_tensor_t *t, size_t bytes,
                       size_t esize) {
  if (w->err != 0) /* stopped: t may have no data (a failed gather) */
    return;
  if (t->device == HVD_CPU) {
    put_data(w, t->data, bytes, esize);
    return;
  }
  if (w->bounce == NULL && bytes > 0 && (w->bounce = malloc(BOUNCE)) == NULL) {
    w->dev_rc =
        writer_fail(w, HVD_ERR_NO_MEMORY,
                    "%s: a %zu-byte buffer for device tensors", w->fn, BOUNCE);
    w->err = ENOMEM;
    return;
  }
  for (size_t at = 0; at < bytes && w->err == 0; at += BOUNCE) {
    size_t k = bytes - at < BOUNCE ? bytes - at : BOUNCE;
    hvd_result_t rc = hvd__odev_read(w->fn, w->bounce, t, at, k);
    if (rc != HVD_SUCCESS) {
      w->dev_rc = writer_fail(w, rc, "%s", hvd_last_error());
      w->err = EIO;
      return;
    }
    put_data(w, w->bounce, k, esize);
  }
}

/* What a file holds besides the model and the optimizer: counters and
 * PowerSGD's state (each section there, empty or not). */
typedef struct extras {
  const hvd__counters_t *ctr; /* may be NULL */
  const hvd__psgd_t *psgd;    /* gathered (hvd__psgd_gather), or NULL */
} extras_t;

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

/* The hyperparameters' section (version 5): the optimizer's list past its
 * shape (hparams.c: lr, update count, a built-in's options, loss
 * scaling's, clipping's) as labelled float64s, then each parameter's
 * learning-rate scale and weight decay as set (NAN: none). Nothing
 * without an optimizer. */
static int hp_of(const hvd_optimizer_t *c, hvd__hp_t hp[HVD__HP_MAX]) {
  /* the list points into c; the writer only reads through it */
  return c != NULL ? hvd__hp_list((hvd_optimizer_t *)c, hp) : 0;
}

static uint64_t hparams_size(const hvd_optimizer_t *c) {
  hvd__hp_t hp[HVD__HP_MAX];
  const int nh = hp_of(c, hp);
  uint64_t size = 4 + 4 + (c != NULL ? 16 * (uint64_t)c->n : 0);
  for (int k = HVD__HP_SHAPE; k < nh; k++)
    size += 4 + strlen(hp[k].label) + 8;
  return size;
}

static void put_f64(writer_t *w, double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  put_int(w, bits, 8);
}

static void write_hparams(writer_t *w, const hvd_optimizer_t *c) {
  hvd__hp_t hp[HVD__HP_MAX];
  const int nh = hp_of(c, hp);
  put_int(w, (uint32_t)(nh > HVD__HP_SHAPE ? nh - HVD__HP_SHAPE : 0), 4);
  for (int k = HVD__HP_SHAPE; k < nh; k++) {
    double x = hvd__hp_get(&hp[k]);
    put_str(w, hp[k].label);
    /* a flag as the format has it, whatever int the options held */
    put_f64(w, hp[k].range == HVD__HP_FLAG ? x != 0 : x);
  }
  put_int(w, c != NULL ? (uint32_t)c->n : 0, 4);
  for (int i = 0; c != NULL && i < c->n; i++) {
    double x[2];
    hvd__hp_param_raw(c, i, &x[0], &x[1]);
    put_f64(w, x[0]);
    put_f64(w, x[1]);
  }
}

static uint64_t file_size(const hvd_param_t *params, int n,
                          const hvd_optimizer_t *c, const extras_t *x) {
  int ns = c ? c->ops.nstate : 0;
  uint64_t size =
      CKPT_HEADER + 4 + CKPT_SUM + 4 + hparams_size(c) + psgd_size(x, n);
  for (int k = 0; x->ctr != NULL && k < x->ctr->n; k++)
    size += 4 + strlen(x->ctr->names[k]) + 8;
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

/* Everything but the checksum: version 5 (version 4's sections and the
 * hyperparameters', there even when empty). */
static void write_body(writer_t *w, const hvd_param_t *params, int n,
                       const hvd_optimizer_t *c, int64_t step, uint64_t size,
                       const extras_t *x) {
  unsigned char head[CKPT_HEADER];
  const hvd__counters_t *ctr = x->ctr;
  memcpy(head, CKPT_MAGIC, 8);
  hvd__put_le(head + 8, CKPT_VERSION5, 4);
  hvd__put_le(head + 12, (uint32_t)n, 4);
  hvd__put_le(head + 16, size, 8);
  hvd__put_le(head + 24, (uint64_t)step, 8);
  put(w, head, sizeof head);
  int ns = c ? c->ops.nstate : 0;
  put_int(w, c != NULL, 4);
  if (c != NULL) {
    put_str(w, c->ops.name ? c->ops.name : "");
    put_f64(w, c->lr);
    put_int(w, (uint64_t)c->steps, 8);
    put_int(w, (uint32_t)ns, 4);
    for (int k = 0; k < ns; k++)
      put_str(w, c->ops.state_names[k]);
  }
  put_int(w, ctr != NULL ? (uint32_t)ctr->n : 0, 4);
  for (int k = 0; ctr != NULL && k < ctr->n; k++) {
    put_str(w, ctr->names[k]);
    put_int(w, (uint64_t)ctr->values[k], 8);
  }
  write_hparams(w, c);
  for (int i = 0; i < n; i++) { /* every gather, even after a failure */
    int fed = feed_take(w->feed, i);
    if (!fed && w->err == 0) {
      w->dev_rc = writer_fail(w, w->feed->rc, "%s", w->feed->msg);
      w->err = EIO;
    }
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
    feed_drop(w->feed, i);
  }
  if (w->err == 0)
    write_psgd(w, x, n);
  if (w->dev_rc != HVD_SUCCESS) /* later calls may have set another */
    hvd__set_error_msg(w->dev_rc, w->dev_msg);
}

/* Opens the directory that holds path (*dir_out: its name, the caller's
 * to free), to fsync it after the rename so that the rename is durable.
 * Opened before the rename: a directory this process may write in but not
 * read (0733) fails the save with the old file still in place. 0 or an
 * errno. */
static int open_dir(const char *path, char **dir_out, int *fd) {
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
  *fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return *fd < 0 ? errno : 0;
}

/* fsync of the directory (open_dir), closed. Filesystems that cannot sync
 * a directory (EINVAL) are let be. 0 or an errno. */
static int sync_dir(int fd) {
  int err = fsync(fd) == 0 || errno == EINVAL ? 0 : errno;
  close(fd);
  return err;
}

/* Numbers the temporary names taken when "<path>.tmp.<pid>" exists. */
static atomic_uint tmp_seq;

/* Creates a temporary file next to path, named into tmp (tlen bytes):
 * "<path>.tmp.<pid>", or when that exists "<path>.tmp.<pid>.<n>", n from
 * a counter of this process. O_EXCL: a save writes only a file it made,
 * never follows a link planted there, and never deletes another's: an
 * existing name may be a live save's (this process's under another
 * spelling of path, or one of another host with our pid on a shared
 * filesystem), or a crashed one's, left alone as any stray. 0 or an
 * errno; *created says whether tmp exists. */
static int create_tmp(const char *path, char *tmp, size_t tlen, FILE **f,
                      int *created) {
  int fd = -1;
  /* The file it replaces keeps its permissions, as an overwrite in place
   * would (a 0600 checkpoint stays 0600), from the open on: created with
   * 0666, another user could open it before a later chmod and read the
   * whole new checkpoint through that descriptor. */
  struct stat old;
  int had_old = stat(path, &old) == 0 && S_ISREG(old.st_mode);
  mode_t mode = had_old ? old.st_mode & 0777 : 0666;
  snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
  for (int tries = 0; tries < 1000; tries++) {
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd >= 0 || errno != EEXIST)
      break;
    snprintf(tmp, tlen, "%s.tmp.%ld.%u", path, (long)getpid(),
             atomic_fetch_add(&tmp_seq, 1) + 1);
  }
  *created = fd >= 0;
  if (fd >= 0 && had_old)
    (void)fchmod(fd, old.st_mode & 07777); /* the umask's bits back */
  if (fd < 0 || (*f = fdopen(fd, "wb")) == NULL) {
    int err = errno;
    if (fd >= 0)
      close(fd);
    return err;
  }
  setvbuf(*f, NULL, _IOFBF, 1 << 20);
  return 0;
}

/* One save: what rank 0 writes and where. */
typedef struct save {
  const char *fn; /* the call, for messages */
  const char *path;
  const hvd_param_t *params;
  int n;
  const hvd_optimizer_t *c; /* the core optimizer, or NULL */
  int64_t step;
  extras_t x;
  const unsigned char *bytes; /* the whole file already (a snapshot), or
                                 NULL: written from the tensors */
  uint64_t size;              /* the snapshot's */
  feed_t *feed;               /* a sharded optimizer's state, or NULL */
} save_t;

/* Writes the file's bytes, then flushes, syncs and closes w->f. Failures
 * of the file: *err (an errno) with *doing what failed; others (a device
 * copy, a wrong size) are the result, message set. */
static hvd_result_t write_synced(writer_t *w, const save_t *s,
                                 const char **doing, int *err) {
  uint64_t size =
      s->bytes != NULL ? s->size : file_size(s->params, s->n, s->c, &s->x);
  *doing = "write";
  if (s->bytes != NULL) { /* its checksum is in it */
    w->nosum = 1;
    put(w, s->bytes, (size_t)size);
  } else {
    write_body(w, s->params, s->n, s->c, s->step, size, &s->x);
    put_int(w, hvd__sum_end(&w->sum), 8);
  }
  if (w->dev_rc != HVD_SUCCESS || (*err = w->err) != 0)
    return w->dev_rc;
  if (w->written != size) /* a bug in file_size(), never the disk */
    return hvd__set_error(
        HVD_ERR_INTERNAL, "%s: '%s': wrote %llu bytes, expected %llu", s->fn,
        s->path, (unsigned long long)w->written, (unsigned long long)size);
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

/* Rank 0's part: the file, written to a temporary file (create_tmp) and
 * renamed over path, then the directory synced. */
static hvd_result_t write_file(const save_t *s) {
  hvd_result_t rc = HVD_SUCCESS;
  size_t tlen = strlen(s->path) + 48;
  char *tmp = malloc(tlen), *dir = NULL;
  writer_t w = {.fn = s->fn, .feed = s->feed};
  hvd__sum_init(&w.sum);
  const char *doing = "create";
  int err = 0, created = 0, dfd = -1;
  if (tmp == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: '%s': out of memory", s->fn,
                          s->path);
  if ((err = create_tmp(s->path, tmp, tlen, &w.f, &created)) != 0)
    goto fail;
  rc = write_synced(&w, s, &doing, &err);
  if (rc != HVD_SUCCESS || err != 0)
    goto fail;
  if ((err = open_dir(s->path, &dir, &dfd)) != 0) {
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot open directory '%s': %s",
                        s->fn, s->path, dir ? dir : "", strerror(err));
    goto fail;
  }
  if (rename(tmp, s->path) != 0) {
    err = errno;
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot rename '%s' over it: %s",
                        s->fn, s->path, tmp, strerror(err));
    goto fail;
  }
  created = 0; /* it is path now */
  if ((err = sync_dir(dfd)) != 0)
    rc = hvd__set_error(HVD_ERR_IO,
                        "%s: '%s': replaced, but cannot sync directory '%s' "
                        "(the new file may not survive a crash): %s",
                        s->fn, s->path, dir, strerror(err));
  free(dir);
  free(tmp);
  free(w.bounce);
  return rc;
fail:
  if (rc == HVD_SUCCESS)
    rc = hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot %s '%s': %s", s->fn,
                        s->path, doing, tmp, strerror(err ? err : EIO));
  if (w.f != NULL)
    fclose(w.f);
  if (created)
    unlink(tmp);
  if (dfd >= 0)
    close(dfd);
  free(dir);
  free(tmp);
  free(w.bounce);
  return rc;
}

/* ---- in the background --------------------------------------------------- */

/* An asynchronous save: on rank 0 the file's bytes and the thread that
 * writes them; on every rank the request that hvd_checkpoint_wait ends. */
struct hvd_checkpoint_request {
  const char *fn;     /* the call that made it, for the write's messages */
  const char *waiter; /* the call that ends it: hvd_checkpoint_wait, or
                         hvd_state_wait for an hvd_state's */
  char *path;
  int set_id;           /* the optimizer's set's id (0: the world), for the
                           wait, which looks it up: the set may be gone */
  int writer;           /* rank 0's: it has a thread or wrote already */
  struct saving *claim; /* rank 0's: its entry in `saving` until the wait */
  unsigned char *bytes; /* the snapshot, until written */
  int staged;           /* bytes are the kept staging buffer (else its own) */
  uint64_t size;
  struct hvd_checkpoint_request *next; /* in `inflight` */
  pthread_t thread;
  int running;     /* the thread is to be joined */
  int joining;     /* its wait joins it, outside inflight_mu */
  hvd_result_t rc; /* the write's */
  char msg[HVD__ERRMSG_MAX];
};

static const char async_fn[] = "hvd_checkpoint_save_async";
/* The background saves not waited for yet, at most one per process set
 * (set_id): a save on a set with one is refused on every rank of the set.
 * A save's entry is reserved by its check (check_inflight), under
 * inflight_mu, before anything of it is copied, so that two threads'
 * saves on two sets (each its own optimizer's) are both in the list and
 * both go on. inflight_mu is never held while taking another lock. */
static pthread_mutex_t inflight_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t joined_cv = PTHREAD_COND_INITIALIZER; /* a join ended */
static hvd_checkpoint_request_t *inflight;
static int exit_hook; /* join_at_exit registered */
/* Rank 0's copy of the file, kept from one background save to the next:
 * filling pages already mapped is ~5x faster than fresh ones (1.3 GB:
 * 0.19 s against 1.05 s on the test VM); private memory on huge pages
 * where the kernel gives them (half the first save's page faults).
 * Owned by one save at a time (staging_busy, under staging_mu, a lock of
 * its own: a writer thread gives it back while wait_here may hold
 * inflight_mu to join that thread), from its snapshot to the end of its
 * write; another set's save meanwhile copies into memory of its own,
 * freed after its write. */
static pthread_mutex_t staging_mu = PTHREAD_MUTEX_INITIALIZER;
static void *staging;
static size_t staging_cap;
static int staging_busy;

/* The paths that this process saves (as some set's first rank), from
 * a save's start to its end, or a background one's wait: two sets whose
 * first rank is this process, saving one path from two threads, would
 * rename each other's half-written file over it. The second is refused,
 * whatever its spelling (key: the directory resolved, then the name);
 * across processes the last rename wins, each save atomic. */
typedef struct saving {
  char *key;
  struct saving *next;
} saving_t;
static pthread_mutex_t saving_mu = PTHREAD_MUTEX_INITIALIZER;
static saving_t *saving;

/* path's file as one spelling: realpath of its directory, '/', its
 * name; path itself when the directory does not resolve (the save
 * fails then). NULL when out of memory. */
static char *path_key(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir =
      slash == NULL ? strdup(".") : strndup(path, (size_t)(slash - path) + 1);
  char *real = dir != NULL ? realpath(dir, NULL) : NULL, *key = NULL;
  const char *name = slash == NULL ? path : slash + 1;
  if (real == NULL)
    key = dir != NULL ? strdup(path) : NULL;
  else if ((key = malloc(strlen(real) + strlen(name) + 2)) != NULL)
    sprintf(key, "%s/%s", real, name);
  free(real);
  free(dir);
  return key;
}

/* path's entry, added to `saving`; NULL with the message set in *rc
 * when it is there already (or out of memory). */
static saving_t *claim_path(const char *fn, const char *path,
                            hvd_result_t *rc) {
  char *key = path_key(path);
  saving_t *e = NULL, *mine = NULL;
  if (key == NULL) {
    *rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
    return NULL;
  }
  pthread_mutex_lock(&saving_mu);
  for (e = saving; e != NULL && strcmp(e->key, key) != 0; e = e->next)
    ;
  if (e != NULL)
    *rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                         "%s: '%s': a save of this path is under way in "
                         "this process (a background save not waited for, "
                         "or another process set's: give each set its own "
                         "path)",
                         fn, path);
  else if ((mine = malloc(sizeof *mine)) == NULL)
    *rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  else
    *mine = (saving_t){key, saving}, saving = mine;
  pthread_mutex_unlock(&saving_mu);
  if (mine == NULL)
    free(key);
  return mine;
}

/* e (claim_path's) leaves `saving`; NULL: nothing. By the entry, not the
 * path: one spelling may name two files over time (a symlink moved). */
static void release_path(saving_t *e) {
  if (e == NULL)
    return;
  pthread_mutex_lock(&saving_mu);
  for (saving_t **p = &saving; *p != NULL; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  pthread_mutex_unlock(&saving_mu);
  free(e->key);
  free(e);
}

/* q's snapshot buffer mem (NULL: none) given back: the kept one for the
 * next save, or q's own freed. */
static void staging_give(hvd_checkpoint_request_t *q, unsigned char *mem) {
  if (!q->staged) {
    free(mem);
    return;
  }
  pthread_mutex_lock(&staging_mu);
  staging_busy = 0;
  pthread_mutex_unlock(&staging_mu);
  q->staged = 0;
}

/* A buffer of at least size bytes for q's snapshot: the kept staging
 * buffer when no other save owns it (a bigger one replaces it; q->staged
 * set), else one of q's own. NULL (message set) when out of memory. */
static unsigned char *staging_take(const char *fn, const char *path,
                                   uint64_t size, hvd_checkpoint_request_t *q) {
  void *mem = NULL;
  pthread_mutex_lock(&staging_mu);
  q->staged = !staging_busy;
  staging_busy = 1;
  pthread_mutex_unlock(&staging_mu);
  if (q->staged && staging_cap >= size)
    return staging; /* owned: no other save reads or replaces it */
  if (q->staged) {
    free(staging);
    staging = NULL;
    staging_cap = 0;
  }
  if (size > SIZE_MAX ||
      posix_memalign(&mem, (size_t)2 << 20, (size_t)size) != 0) {
    staging_give(q, NULL);
    (void)hvd__set_error(HVD_ERR_NO_MEMORY,
                         "%s: '%s': %llu bytes for the file's copy", fn, path,
                         (unsigned long long)size);
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  (void)madvise(mem, (size_t)size, MADV_HUGEPAGE); /* advice only */
#endif
  if (q->staged)
    staging = mem, staging_cap = (size_t)size;
  return mem;
}

/* Rank 0's whole file in memory but for its checksum (the writer thread
 * takes it, a byte at a time being slow: ~2 s a GB): what a background
 * save writes, copied while the caller waits so that the model may change
 * as soon as it returns. */
static hvd_result_t snapshot(const save_t *s, hvd_checkpoint_request_t *q) {
  uint64_t size = file_size(s->params, s->n, s->c, &s->x);
  writer_t w = {.fn = s->fn,
                .mem = staging_take(s->fn, s->path, size, q),
                .cap = size,
                .nosum = 1,
                .feed = s->feed};
  if (w.mem == NULL)
    return HVD_ERR_NO_MEMORY; /* message set */
  write_body(&w, s->params, s->n, s->c, s->step, size, &s->x);
  put_int(&w, 0, 8); /* the checksum's place */
  free(w.bounce);
  hvd_result_t rc = w.dev_rc;
  if (rc == HVD_SUCCESS && (w.err != 0 || w.written != size))
    rc = hvd__set_error(HVD_ERR_INTERNAL,
                        "%s: '%s': a copy of %llu bytes, expected %llu", s->fn,
                        s->path, (unsigned long long)w.written,
                        (unsigned long long)size);
  if (rc != HVD_SUCCESS) {
    staging_give(q, w.mem);
    return rc;
  }
  q->bytes = w.mem;
  q->size = size;
  return HVD_SUCCESS;
}

/* Writes q's snapshot as hvd_checkpoint_save writes a file (its checksum
 * first), and keeps the result and its message. */
static void write_snapshot(hvd_checkpoint_request_t *q) {
  hvd__put_le(q->bytes + q->size - CKPT_SUM,
              hvd__sum64(q->bytes, q->size - CKPT_SUM), CKPT_SUM);
  save_t s = {.fn = q->fn, .path = q->path, .bytes = q->bytes, .size = q->size};
  q->rc = write_file(&s);
  if (q->rc != HVD_SUCCESS)
    snprintf(q->msg, sizeof q->msg, "%s", hvd_last_error());
  staging_give(q, q->bytes);
  q->bytes = NULL;
}

static void *writer_main(void *arg) {
  write_snapshot(arg);
  return NULL;
}

/* Rank 0's write of q ended: its thread joined by q's wait, outside
 * inflight_mu (a write takes seconds, during which other sets' saves
 * check the list). 0 in a child forked since, which has no writer thread
 * to join (the parent finishes the file). */
static int join_write(hvd_checkpoint_request_t *q) {
  pthread_mutex_lock(&inflight_mu);
  const int forked = q->running && hvd__forked();
  const int mine = q->running && !forked; /* join_at_exit's otherwise */
  q->joining = mine;
  pthread_mutex_unlock(&inflight_mu);
  if (mine) {
    pthread_join(q->thread, NULL);
    pthread_mutex_lock(&inflight_mu);
    q->running = q->joining = 0;
    pthread_cond_broadcast(&joined_cv);
    pthread_mutex_unlock(&inflight_mu);
  }
  return !forked;
}

/* A process that ends with saves in flight finishes their files first:
 * each writer joined here, or by the wait joining it already (after
 * which the list is read again: that wait may have freed its entry). */
static void join_at_exit(void) {
  pthread_mutex_lock(&inflight_mu);
  for (hvd_checkpoint_request_t *q = inflight; q != NULL;)
    if (q->joining) {
      pthread_cond_wait(&joined_cv, &inflight_mu);
      q = inflight;
    } else {
      if (q->running && !hvd__forked())
        pthread_join(q->thread, NULL);
      q->running = 0;
      q = q->next;
    }
  pthread_mutex_unlock(&inflight_mu);
}

/* q leaves `inflight` (NULL, or not in it: nothing). */
static void unlist(hvd_checkpoint_request_t *q) {
  pthread_mutex_lock(&inflight_mu);
  for (hvd_checkpoint_request_t **p = &inflight; q != NULL && *p != NULL;
       p = &(*p)->next)
    if (*p == q) {
      *p = q->next;
      q->next = NULL;
      break;
    }
  pthread_mutex_unlock(&inflight_mu);
}

/* Rank 0, once every rank agreed on the snapshot: the writer thread (or,
 * should no thread start, the write itself, here). */
static void start_writer(hvd_checkpoint_request_t *q) {
  pthread_mutex_lock(&inflight_mu);
  if (!exit_hook && atexit(join_at_exit) == 0)
    exit_hook = 1;
  q->running = pthread_create(&q->thread, NULL, writer_main, q) == 0;
  pthread_mutex_unlock(&inflight_mu);
  if (!q->running)
    write_snapshot(q);
}

/* On the set's first rank a save of the same path under way in this
 * process (else *claim: path's entry, this save's now, for
 * release_path), then a background save of the same set (set_id) not
 * waited for yet: refused on every rank. A background save (q) takes its
 * place in `inflight` here, in the same hold of inflight_mu as the
 * check, and leaves it if the agreement fails (or its save does:
 * save_async). */
static hvd_result_t check_inflight(const char *fn, const char *path, int set_id,
                                   hvd_checkpoint_request_t *q,
                                   saving_t **claim) {
  hvd_result_t rc = HVD_SUCCESS;
  *claim = path != NULL && path[0] != '\0' && hvd__coll_rank() == 0
               ? claim_path(fn, path, &rc)
               : NULL;
  pthread_mutex_lock(&inflight_mu);
  const hvd_checkpoint_request_t *e = inflight;
  while (e != NULL && e->set_id != set_id)
    e = e->next;
  if (e != NULL && rc == HVD_SUCCESS)
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "%s: '%s': the background save of '%s' is not "
                        "waited for yet (%s)",
                        fn, path ? path : "(null)", e->path, e->waiter);
  if (rc == HVD_SUCCESS && q != NULL)
    q->next = inflight, inflight = q;
  pthread_mutex_unlock(&inflight_mu);
  rc = hvd__ckpt_agree("save.inflight", rc);
  if (rc != HVD_SUCCESS) {
    unlist(q);
    release_path(*claim);
    *claim = NULL;
  }
  return rc;
}

/* ---- the calls ----------------------------------------------------------- */

static hvd_result_t save_ex(const char *fn, const char *path,
                            const hvd_param_t *params, int n,
                            const hvd_optimizer_t *opt, int64_t step,
                            const hvd__counters_t *ctr,
                            hvd_checkpoint_request_t *q);

hvd_result_t hvd_checkpoint_save(const char *path, const hvd_param_t *params,
                                 int n, const hvd_optimizer_t *opt,
                                 int64_t step) {
  hvd_result_t rc;
  HVD__ON_SET(hvd__optim_set(opt), rc,
              save_ex(save_fn, path, params, n, opt, step, NULL, NULL));
  return rc;
}

hvd_result_t hvd__checkpoint_save_ex(const char *path,
                                     const hvd_param_t *params, int n,
                                     const hvd_optimizer_t *opt, int64_t step,
                                     const hvd__counters_t *ctr) {
  hvd_result_t rc;
  HVD__ON_SET(hvd__optim_set(opt), rc,
              save_ex(save_fn, path, params, n, opt, step, ctr, NULL));
  return rc;
}

/* A background save named fn in its messages, ended by waiter. */
static hvd_result_t save_async(const char *fn, const char *waiter,
                               const char *path, const hvd_param_t *params,
                               int n, const hvd_optimizer_t *opt, int64_t step,
                               const hvd__counters_t *ctr,
                               hvd_checkpoint_request_t **out) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  hvd_checkpoint_request_t *q = calloc(1, sizeof *q);
  hvd_result_t rc =
      out == NULL ? hvd__set_error(HVD_ERR_INVALID_ARG, "%s: out is NULL", fn)
      : q == NULL || (q->path = strdup(path ? path : "")) == NULL
          ? hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn)
          : HVD_SUCCESS;
  if (out != NULL)
    *out = NULL;
  rc = hvd__ckpt_agree("save.request", rc);
  const hvd_process_set_t *set = hvd__optim_set(opt);
  if (q != NULL) {
    q->fn = fn, q->waiter = waiter;
    q->set_id = set != NULL ? hvd_process_set_id(set) : 0;
  }
  if (rc == HVD_SUCCESS)
    rc = save_ex(fn, path, params, n, opt, step, ctr, q);
  if (rc != HVD_SUCCESS) {
    if (q != NULL) {
      unlist(q); /* check_inflight's entry, when it got one */
      staging_give(q, q->bytes);
      free(q->path);
    }
    free(q);
    return rc;
  }
  if (q->writer)
    start_writer(q);
  *out = q;
  return HVD_SUCCESS;
}

hvd_result_t hvd_checkpoint_save_async(const char *path,
                                       const hvd_param_t *params, int n,
                                       const hvd_optimizer_t *opt, int64_t step,
                                       hvd_checkpoint_request_t **out) {
  hvd_result_t rc;
  HVD__ON_SET(hvd__optim_set(opt), rc,
              save_async(async_fn, "hvd_checkpoint_wait", path, params, n, opt,
                         step, NULL, out));
  return rc;
}

hvd_result_t hvd__checkpoint_save_async_ex(const char *fn, const char *path,
                                           const hvd_param_t *params, int n,
                                           const hvd_optimizer_t *opt,
                                           int64_t step,
                                           const hvd__counters_t *ctr,
                                           hvd_checkpoint_request_t **out) {
  hvd_result_t rc;
  HVD__ON_SET(
      hvd__optim_set(opt), rc,
      save_async(fn, "hvd_state_wait", path, params, n, opt, step, ctr, out));
  return rc;
}

/* The write ended (rank 0 joins its thread) and req freed: this rank's
 * result, with its message. */
static hvd_result_t wait_here(hvd_checkpoint_request_t *req) {
  int joined = join_write(req);
  unlist(req);
  release_path(req->claim); /* the path may be saved again */
  req->claim = NULL;
  hvd_result_t rc = !joined ? hvd__not_initialized("hvd_checkpoint_wait")
                    : req->rc != HVD_SUCCESS
                        ? hvd__set_error_msg(req->rc, req->msg)
                        : HVD_SUCCESS;
  free(req->path);
  free(req);
  return rc;
}

hvd_result_t hvd_checkpoint_wait(hvd_checkpoint_request_t *req) {
  if (req == NULL)
    return HVD_SUCCESS;
  if (hvd__forked()) /* the save (and rank 0's writer) are the parent's */
    return hvd__not_initialized("hvd_checkpoint_wait");
  const int set_id = req->set_id;
  hvd_result_t rc = wait_here(req);
  /* every rank gets rank 0's result, within the optimizer's set; a set
   * destroyed since (as after hvd_shutdown) has no collective left to
   * agree with: each rank returns its own */
  const hvd_process_set_t *ps =
      set_id != 0 ? hvd__process_set_find(set_id) : NULL;
  if (hvd_is_initialized() && (set_id == 0 || ps != NULL))
    HVD__ON_SET(ps, rc, hvd__ckpt_agree("save.wait", rc));
  return rc;
}

hvd_result_t hvd__checkpoint_wait_here(hvd_checkpoint_request_t *req) {
  return req != NULL ? wait_here(req) : HVD_SUCCESS;
}

static hvd_result_t save_checked(save_t *s, hvd_optimizer_t *o,
                                 hvd_checkpoint_request_t *q);

static hvd_result_t save_ex(const char *fn, const char *path,
                            const hvd_param_t *params, int n,
                            const hvd_optimizer_t *opt, int64_t step,
                            const hvd__counters_t *ctr,
                            hvd_checkpoint_request_t *q) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(fn);
  saving_t *claim = NULL;
  const hvd_process_set_t *set = hvd__optim_set(opt);
  hvd_result_t rc = check_inflight(
      fn, path, set != NULL ? hvd_process_set_id(set) : 0, q, &claim);
  if (rc != HVD_SUCCESS)
    return rc;
  hvd_optimizer_t *core = opt ? hvd__optim_core((hvd_optimizer_t *)opt) : NULL;
  hvd__counters_t all;
  const char *names[HVD__CKPT_MAX_COUNTERS];
  int64_t values[HVD__CKPT_MAX_COUNTERS];
  rc = hvd__ckpt_agree("save.prep",
                       with_scaler(fn, core, ctr, &all, names, values));
  save_t s = {.fn = fn,
              .path = path,
              .params = params,
              .n = n,
              .c = opt ? hvd__optim_core_const(opt) : NULL,
              .step = step,
              .x = {all.n > 0 ? &all : NULL, NULL}};
  if (rc == HVD_SUCCESS)
    rc = save_checked(&s, (hvd_optimizer_t *)opt, q);
  /* a background save keeps path until its wait (wait_here) */
  if (q != NULL && rc == HVD_SUCCESS && q->writer)
    q->claim = claim;
  else
    release_path(claim);
  return rc;
}

/* The loss scaler's counters after ctr's (all's arrays: the callers'). */
static hvd_result_t with_scaler(const char *fn, const hvd_optimizer_t *core,
                                const hvd__counters_t *ctr,
                                hvd__counters_t *all, const char **names,
                                int64_t *values) {
  int n = ctr != NULL ? ctr->n : 0, ns = 0;
  int64_t sv[2];
  hvd__mixed_counters(core, sv, &ns);
  if (n + ns > HVD__CKPT_MAX_COUNTERS)
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: %d counters (at most %d)",
                          fn, n + ns, HVD__CKPT_MAX_COUNTERS);
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

/* The arguments checked, PowerSGD's state gathered, then rank 0 writes
 * the file (q NULL) or copies it into q, a sharded optimizer's state
 * gathered a parameter at a time as it goes (feed_t). */
static hvd_result_t save_checked(save_t *s, hvd_optimizer_t *o,
                                 hvd_checkpoint_request_t *q) {
  hvd_result_t rc = hvd__ckpt_check_args(s->fn, s->path, s->params, s->n, o);
  if ((rc = hvd__ckpt_agree("save.args", rc)) != HVD_SUCCESS)
    return rc;
  /* mixed precision: the masters are saved in place of the values (a
   * sharded optimizer's whole ones arrive with its state) */
  hvd_param_t *views = NULL;
  rc = hvd__mixed_ckpt_params(o != NULL ? hvd__optim_core(o) : NULL, s->params,
                              s->n, &views);
  /* PowerSGD's error feedback averaged over the ranks (agreed) */
  hvd__psgd_t *ps = o != NULL ? hvd__optim_psgd(o) : NULL;
  s->x.psgd = ps;
  if ((rc = hvd__ckpt_agree("save.views", rc)) == HVD_SUCCESS)
    rc = hvd__psgd_gather(ps);
  feed_t feed = {.o = o != NULL && hvd__optim_sharded(o) ? o : NULL,
                 .user = s->params,
                 .views = views};
  int go = rc == HVD_SUCCESS; /* agreed: alike on every rank */
  if (views != NULL)
    s->params = views;
  s->feed = &feed;
  char msg[HVD__ERRMSG_MAX] = "";
  if (go && hvd__coll_rank() == 0 && /* the set's first writes */
      (rc = q != NULL ? snapshot(s, q) : write_file(s)) != HVD_SUCCESS)
    snprintf(msg, sizeof msg, "%s", hvd_last_error());
  if (go) /* rank 0's gathers that a failed write skipped; the others' */
    feed_finish(&feed, s->n);
  if (rc != HVD_SUCCESS) /* the gathers' calls may have set another */
    hvd__set_error_msg(rc, msg);
  else if (feed.rc != HVD_SUCCESS)
    rc = hvd__set_error_msg(feed.rc, feed.msg);
  if (q != NULL)
    q->writer = rc == HVD_SUCCESS && hvd__coll_rank() == 0;
  hvd__psgd_release(ps);
  free(views);
  return hvd__ckpt_agree("save.result", rc);
}
