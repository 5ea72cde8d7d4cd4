/*
 * checkpoint.c - hvd_checkpoint_load, and what it shares with
 * hvd_checkpoint_save (checkpoint_save.c): the agreement, the checks of
 * the arguments. The format is
 * doc/checkpoint-format.md: a little-endian header, the optimizer's
 * scalars and state names, every parameter (name exactly as given, dtype,
 * shape, data, then its state tensors' data) and a checksum of all that
 * precedes it (FNV-1a-64 to version 3, hvd__sum64 from version 4).
 *
 * Both calls are collectives built from hvd's own collectives (names
 * "hvd.ckpt.*"). Every step that can fail on some rank ends in agree(),
 * which gives every rank the result and message of the lowest failing
 * rank, so that no rank goes on to a collective that another has left.
 *
 *   save: check the arguments (agree); rank 0 writes "<path>.tmp.<pid>",
 *         fflush, fsync, rename over path, fsync the directory (agree).
 *   load: check the arguments (agree), and that opt is NULL, and uses
 *         PowerSGD, on every rank or on none (agree); rank 0 opens the
 *         file, checks magic, version and checksum (checkpoint_file.c:
 *         a part at a time, never the whole file in memory), walks
 *         through its structure and makes its outline: the bytes that
 *         are no tensor's (agree); every rank receives the outline
 *         (agree on its buffer between the size and the bytes) and
 *         checks it against its model and optimizer (agree); then every
 *         rank walks through it again and takes each tensor's bytes from
 *         rank 0, which reads them as they go, a piece at a time
 *         (checkpoint_bulk.c), straight into host tensors (agree); only
 *         then the numbers (version 5's hyperparameters, lr, steps,
 *         *step, the counters; agree).
 *
 * Device tensors (parameters on the rank's GPU and their optimizer state)
 * are copied to the host to be written, a chunk at a time, by rank 0, and
 * loaded from host memory (each rank's bounce buffer) by cudaMemcpy to
 * the rank's own GPU, a piece at a time: the file is the
 * same either way, so a checkpoint saved from GPU parameters loads into
 * host ones and the reverse.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/checkpoint_int.h"
#include "optim/optimizer.h"

static const char load_fn[] = "hvd_checkpoint_load";

const char *const hvd__ckpt_scaler_names[2] = {"hvd.loss_scale",
                                               "hvd.loss_scale.clean"};

static hvd_result_t load_checked(const char *path, hvd_param_t *params,
                                 hvd_param_t *views, int n,
                                 hvd_optimizer_t *opt, int64_t *step,
                                 hvd__counters_t *ctr);
static int find_counter(const unsigned char *ol, size_t size, const char *name,
                        int64_t *v);

/* ---- bytes --------------------------------------------------------------- */

/* numel * esize of a shape, or 0 with *ok = 0 past INT64_MAX. */
static uint64_t shape_bytes(int ndim, const int64_t *shape, size_t esize,
                            int *ok) {
  uint64_t b = esize;
  *ok = 1;
  for (int d = 0; d < ndim; d++) {
    uint64_t s = (uint64_t)shape[d];
    if (s != 0 && b > (uint64_t)INT64_MAX / s) {
      *ok = 0;
      return 0;
    }
    b *= s;
  }
  return b;
}

/* ---- agreement ----------------------------------------------------------- */

hvd_result_t hvd__ckpt_agree(const char *what, hvd_result_t local) {
  char name[64];
  snprintf(name, sizeof name, "hvd.ckpt.%s", what);
  return hvd__optim_agree(name, local);
}

/* ---- arguments ----------------------------------------------------------- */

hvd_result_t hvd__ckpt_check_args(const char *fn, const char *path,
                                  const hvd_param_t *params, int n,
                                  const hvd_optimizer_t *opt) {
  char a[HVD__SHAPE_STR_MAX], b[HVD__SHAPE_STR_MAX];
  hvd_result_t rc;
  if (path == NULL || path[0] == '\0')
    return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: path is NULL or empty", fn);
  if (n < 0 || (n > 0 && params == NULL))
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: params is NULL or n (%d) is negative", fn, n);
  for (int i = 0; i < n; i++) {
    const hvd_param_t *p = &params[i];
    if (p->name == NULL || p->name[0] == '\0')
      return hvd__set_error(HVD_ERR_INVALID_ARG, "%s: parameter %d has no name",
                            fn, i);
    if ((rc = hvd__check_tensor(fn, p->name, "value", &p->value)) != 0)
      return rc;
  }
  if (opt == NULL)
    return HVD_SUCCESS;
  const hvd_optimizer_t *c = hvd__optim_core_const(opt);
  int ns = c->ops.nstate;
  if (c->n != n)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: the optimizer has %d parameters but n is %d", fn,
                          c->n, n);
  if (ns > 0 && c->state == NULL)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: the optimizer has no state tensors", fn);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < ns; k++) {
      const hvd_tensor_t *s = &c->state[i * ns + k], *v = &params[i].value;
      /* mixed precision: a low-precision parameter's state is float32 */
      hvd_dtype_t want =
          c->mixed != NULL && hvd__mixed_low(v->dtype) ? HVD_FLOAT32 : v->dtype;
      if (s->dtype == want && s->ndim == v->ndim &&
          memcmp(s->shape, v->shape, (size_t)v->ndim * sizeof v->shape[0]) ==
              0 &&
          (s->data != NULL || hvd_tensor_numel(v) == 0 ||
           hvd__optim_sharded(opt))) /* gathered after the checks */
        continue;
      hvd__shape_str(s->ndim, s->shape, a, sizeof a);
      hvd__shape_str(v->ndim, v->shape, b, sizeof b);
      return hvd__set_error(HVD_ERR_INVALID_ARG,
                            "%s: optimizer state '%s' of '%s' is %s %s%s but "
                            "the parameter is %s %s",
                            fn, c->ops.state_names[k], params[i].name,
                            hvd_dtype_name(s->dtype), a,
                            s->data == NULL ? " without data" : "",
                            hvd_dtype_name(v->dtype), b);
    }
  return HVD_SUCCESS;
}

/* ---- load ---------------------------------------------------------------- */

/* A walk through a file, or through its outline: the same bytes without
 * the tensors' (the parameters', their state's, PowerSGD's), which every
 * rank checks before rank 0 sends the rest (checkpoint_bulk.c). */
typedef struct reader {
  hvd__ckpt_file_t *file; /* rank 0's file, read through its window */
  const unsigned char *p; /* or the outline's bytes */
  size_t size, at;        /* p's size short of the checksum; the next byte */
  uint64_t off, end;      /* the same in the file */
  unsigned char *out;     /* while rank 0 makes an outline: its bytes */
  size_t nout;            /* the outline's size so far */
} reader_t;

/* The next k bytes (not a tensor's), or NULL if there are fewer. */
static const unsigned char *take(reader_t *r, uint64_t k) {
  const unsigned char *q;
  if (k > r->end - r->off)
    return NULL;
  if (r->file != NULL) {
    if ((q = hvd__ckpt_file_at(r->file, r->off, (size_t)k)) == NULL)
      return NULL;
  } else {
    if (k > r->size - r->at)
      return NULL;
    q = r->p + r->at;
    r->at += (size_t)k;
  }
  r->off += k;
  if (r->out != NULL)
    memcpy(r->out + r->nout, q, (size_t)k);
  r->nout += (size_t)k;
  return q;
}

/* The next k bytes of a tensor: 1 with their place in the file in *where,
 * or 0 if there are fewer. An outline has none of them. */
static int take_bulk(reader_t *r, uint64_t k, uint64_t *where) {
  if (k > r->end - r->off)
    return 0;
  *where = r->off;
  r->off += k;
  return 1;
}

static int take_int(reader_t *r, int bytes, uint64_t *v) {
  const unsigned char *q = take(r, (uint64_t)bytes);
  if (q != NULL)
    *v = hvd__get_le(q, bytes);
  return q != NULL;
}

static int take_str(reader_t *r, const char **s, uint32_t *len) {
  uint64_t v;
  if (!take_int(r, 4, &v))
    return 0;
  *len = (uint32_t)v;
  *s = (const char *)take(r, v);
  return *s != NULL;
}

/* A string of the file in a message: %.*s with at most 200 bytes. */
#define SHOWN(len) ((int)((len) > 200 ? 200 : (len)))

static int same_str(const char *s, uint32_t len, const char *z) {
  return strlen(z) == len && memcmp(s, z, len) == 0;
}

#define MALFORMED(r, what)                                                     \
  hvd__set_error(HVD_ERR_CORRUPT, "%s: '%s': malformed at byte %llu (%s)",     \
                 load_fn, path, (unsigned long long)(r)->off, what)

/* The optimizer part of a file: its name, scalars and state count; names
 * reads the state names again. present 0: saved without. */
typedef struct file_opt {
  int present;
  const char *name;
  uint32_t len;
  uint64_t lr_bits, steps, ns;
  reader_t names;
} file_opt_t;

/* One parameter of a file: its name, and where its bytes are. */
typedef struct file_param {
  const char *name;
  uint32_t len;
  uint64_t dtype, ndim, bytes;
  int64_t shape[HVD_MAX_DIMS];
  size_t esize;
  uint64_t data, state; /* the value's offset; then ns state tensors' */
} file_param_t;

/* A reader past the header of rank 0's file, which
 * hvd__ckpt_file_open() checked. */
static reader_t file_reader(hvd__ckpt_file_t *f) {
  return (reader_t){.file = f, .off = CKPT_HEADER, .end = f->size - CKPT_SUM};
}

/* A reader past the header of an outline that outline_of() made: its
 * header is the file's, with the file's size. */
static reader_t outline_reader(const unsigned char *ol, size_t size) {
  return (reader_t){.p = ol,
                    .size = size - CKPT_SUM,
                    .at = CKPT_HEADER,
                    .off = CKPT_HEADER,
                    .end = hvd__get_le(ol + 16, 8) - CKPT_SUM};
}

static hvd_result_t next_opt(const char *path, reader_t *r, file_opt_t *o) {
  uint64_t flag;
  const char *s;
  uint32_t len;
  memset(o, 0, sizeof *o);
  if (!take_int(r, 4, &flag) || flag > 1)
    return MALFORMED(r, "optimizer flag");
  if ((o->present = (int)flag) == 0)
    return HVD_SUCCESS;
  if (!take_str(r, &o->name, &o->len) || !take_int(r, 8, &o->lr_bits) ||
      !take_int(r, 8, &o->steps) || !take_int(r, 4, &o->ns))
    return MALFORMED(r, "optimizer");
  o->names = *r;
  o->names.out = NULL; /* read again, never copied twice */
  for (uint64_t k = 0; k < o->ns; k++)
    if (!take_str(r, &s, &len))
      return MALFORMED(r, "state names");
  return HVD_SUCCESS;
}

static hvd_result_t next_param(const char *path, reader_t *r, uint64_t ns,
                               file_param_t *p) {
  uint64_t v;
  int ok;
  if (!take_str(r, &p->name, &p->len) || !take_int(r, 4, &p->dtype) ||
      !take_int(r, 4, &p->ndim))
    return MALFORMED(r, "parameter header");
  if (!hvd__dtype_valid((int)p->dtype) || p->ndim > HVD_MAX_DIMS)
    return MALFORMED(r, "dtype or ndim");
  for (uint64_t d = 0; d < p->ndim; d++) {
    if (!take_int(r, 8, &v) || v > (uint64_t)INT64_MAX)
      return MALFORMED(r, "shape");
    p->shape[d] = (int64_t)v;
  }
  p->esize = hvd_dtype_size((hvd_dtype_t)p->dtype);
  p->bytes = shape_bytes((int)p->ndim, p->shape, p->esize, &ok);
  if (!ok || !take_bulk(r, p->bytes, &p->data) ||
      (ns > 0 && p->bytes > (uint64_t)INT64_MAX / ns) ||
      !take_bulk(r, p->bytes * ns, &p->state))
    return MALFORMED(r, "parameter data");
  return HVD_SUCCESS;
}

/* A version 2+ file's counters section (after the optimizer's): checked
 * against the program's ctr (every counter it asks for must be there,
 * by name), and with set, copied into ctr->values. Version 1: none. */
static hvd_result_t next_counters(const char *path, reader_t *r,
                                  const unsigned char *buf,
                                  hvd__counters_t *ctr, int set) {
  uint64_t nc = 0, v = 0;
  const char *s = "";
  uint32_t len = 0;
  reader_t start;
  if (hvd__get_le(buf + 8, 4) >= CKPT_VERSION2 && !take_int(r, 4, &nc))
    return MALFORMED(r, "counters");
  start = *r;
  start.out = NULL;
  for (uint64_t k = 0; k < nc; k++)
    if (!take_str(r, &s, &len) || !take_int(r, 8, &v))
      return MALFORMED(r, "counters");
  for (int i = 0; ctr != NULL && i < ctr->n; i++) {
    reader_t q = start;
    int found = 0;
    for (uint64_t k = 0; k < nc && !found; k++) {
      take_str(&q, &s, &len);
      take_int(&q, 8, &v);
      if (same_str(s, len, ctr->names[i])) {
        found = 1;
        if (set)
          ctr->values[i] = (int64_t)v;
      }
    }
    if (!found)
      return hvd__set_error(HVD_ERR_CORRUPT,
                            "%s: '%s': the file has no counter '%s' (it was "
                            "not saved by hvd_state_commit)",
                            load_fn, path, ctr->names[i]);
  }
  return HVD_SUCCESS;
}

/* The float64 whose bits are v. */
static double f64_of(uint64_t v) {
  double x;
  memcpy(&x, &v, sizeof x);
  return x;
}

/* A value of the file that its place does not take (what: its words;
 * range: what its setter takes): refused before anything changes. */
static hvd_result_t out_of_range(const char *path, const char *what, double x,
                                 hvd__hp_range_t range) {
  return hvd__set_error(HVD_ERR_CORRUPT, "%s: '%s': %s %g is out of range %s",
                        load_fn, path, what, x, hvd__hp_range_words(range));
}

/* The file's learning-rate scale and weight decay of c's parameter i
 * (a built-in's): NaN (none set) or what their setters take. */
static hvd_result_t check_param_hp(const char *path, const hvd_optimizer_t *c,
                                   uint64_t i, const double v[2]) {
  static const char *const what[2] = {"the learning-rate scale",
                                      "the weight decay"};
  for (int k = 0; k < 2; k++)
    if (v[k] == v[k] && !hvd__hp_in_range(HVD__HP_NONNEG, v[k]))
      return hvd__set_error(HVD_ERR_CORRUPT,
                            "%s: '%s': %s of parameter '%s' %g is out of "
                            "range [0, inf) (NaN: none set)",
                            load_fn, path, what[k], c->params[i].name, v[k]);
  return HVD_SUCCESS;
}

/* SGD's rule across its values (sgd.c's check_sgd): nesterov needs
 * momentum > 0 and dampening 0, with the file's values where it has
 * them (v[j] for c's hp[j], NaN where the file has none), else c's. */
static hvd_result_t check_nesterov(const char *path, const hvd__hp_t *hp, int n,
                                   const double *v) {
  double x[3] = {NAN, NAN, NAN}; /* nesterov, momentum, dampening */
  static const char *const label[3] = {"nesterov", "momentum", "dampening"};
  for (int j = HVD__HP_SHAPE; j < n; j++)
    for (int k = 0; k < 3; k++)
      if (strcmp(hp[j].label, label[k]) == 0)
        x[k] = v[j] == v[j] ? v[j] : hvd__hp_get(&hp[j]);
  if (!(x[0] > 0) || (x[1] > 0 && x[2] == 0))
    return HVD_SUCCESS; /* no nesterov, or not an SGD */
  return hvd__set_error(HVD_ERR_CORRUPT,
                        "%s: '%s': nesterov needs momentum > 0 and dampening "
                        "0 (momentum %g, dampening %g)",
                        load_fn, path, x[1], x[2]);
}

/* 1 when x fits hyperparameter h: any double, or a whole number in
 * range for an int's or an int64_t's place. */
static int fits(const hvd__hp_t *h, double x) {
  if (h->type == 'i')
    return x >= INT_MIN && x <= INT_MAX && x == floor(x);
  if (h->type == 'l')
    return x >= -0x1p63 && x < 0x1p63 && x == floor(x);
  return 1;
}

/* A version 5+ file's hyperparameters' section (after the counters),
 * checked: with c (an optimizer's core) each label that c's list has too
 * (hparams.c, past the shape) must hold a value that fits its place;
 * with set, too, those values made c's, then each parameter's
 * learning-rate scale and weight decay where the file or c set one (as
 * hvd_broadcast_optimizer_state does). Earlier versions: none. */
static hvd_result_t next_hparams(const char *path, reader_t *r,
                                 const unsigned char *buf, hvd_optimizer_t *c,
                                 int set) {
  uint64_t nh = 0, np = 0, v[2];
  const char *s;
  uint32_t len;
  hvd__hp_t hp[HVD__HP_MAX];
  double got[HVD__HP_MAX]; /* the file's value of hp[j], NaN: none */
  const int n = c != NULL ? hvd__hp_list(c, hp) : 0;
  hvd_result_t rc = HVD_SUCCESS;
  for (int j = 0; j < HVD__HP_MAX; j++)
    got[j] = NAN;
  if (hvd__get_le(buf + 8, 4) < CKPT_VERSION5)
    return HVD_SUCCESS;
  if (!take_int(r, 4, &nh))
    return MALFORMED(r, "hyperparameters");
  for (uint64_t k = 0; k < nh; k++) {
    if (!take_str(r, &s, &len) || !take_int(r, 8, &v[0]))
      return MALFORMED(r, "hyperparameters");
    for (int j = HVD__HP_SHAPE; j < n; j++) {
      if (!same_str(s, len, hp[j].label))
        continue;
      if (!fits(&hp[j], f64_of(v[0])))
        return MALFORMED(r, "a hyperparameter out of its range");
      if (!hvd__hp_in_range(hp[j].range, f64_of(v[0])))
        return out_of_range(path, hp[j].label, f64_of(v[0]), hp[j].range);
      got[j] = f64_of(v[0]);
      if (set) /* a flag as 0 or 1, whatever int an earlier build wrote */
        hvd__hp_set(&hp[j], hp[j].range == HVD__HP_FLAG ? f64_of(v[0]) != 0
                                                        : f64_of(v[0]));
    }
  }
  if (!set && check_nesterov(path, hp, n, got) != HVD_SUCCESS)
    return HVD_ERR_CORRUPT; /* message set */
  if (!take_int(r, 4, &np))
    return MALFORMED(r, "parameters' hyperparameters");
  for (uint64_t i = 0; i < np; i++) {
    if (!take_int(r, 8, &v[0]) || !take_int(r, 8, &v[1]))
      return MALFORMED(r, "parameters' hyperparameters");
    const double file[2] = {f64_of(v[0]), f64_of(v[1])};
    if (c == NULL || i >= (uint64_t)c->n || hvd__optim_builtin(c) == NULL)
      continue; /* taken by no parameter */
    if (check_param_hp(path, c, i, file) != HVD_SUCCESS)
      return HVD_ERR_CORRUPT; /* message set */
    if (set && rc == HVD_SUCCESS)
      rc = hvd__hp_param_take(c, (int)i, file);
  }
  return rc;
}

/* 1 when the file (its outline ol, checked already) has counter `name`,
 * the value of its last one in *v: hvd writes its own counters after the
 * program's, and a file of an earlier build may have a program's counter
 * of the same name before them (hvd_state_add_counter took "hvd." names
 * then). */
static int find_counter(const unsigned char *ol, size_t size, const char *name,
                        int64_t *v) {
  reader_t r = outline_reader(ol, size);
  file_opt_t o;
  uint64_t nc = 0, x = 0;
  const char *s = "";
  uint32_t len = 0;
  int found = 0;
  if (hvd__get_le(ol + 8, 4) < CKPT_VERSION2 || next_opt("", &r, &o) != 0 ||
      !take_int(&r, 4, &nc))
    return 0;
  for (uint64_t k = 0; k < nc; k++) {
    if (!take_str(&r, &s, &len) || !take_int(&r, 8, &x))
      return 0;
    if (same_str(s, len, name)) {
      *v = (int64_t)x;
      found = 1;
    }
  }
  return found;
}

/* The loss scaler's counters into v, when the file has them and c
 * scales (1; else 0: the scaler is left as it is). */
static int scaler_of(const unsigned char *ol, size_t size,
                     const hvd_optimizer_t *c, int64_t v[2]) {
  return c != NULL && hvd__mixed_scaling(c) &&
         find_counter(ol, size, hvd__ckpt_scaler_names[0], &v[0]) &&
         find_counter(ol, size, hvd__ckpt_scaler_names[1], &v[1]);
}

/* The loss scaler's counters that a load would set (scaler_of), in
 * range: a scale that is finite and positive (its options' init_scale
 * is), a count of clean steps not negative. */
static hvd_result_t check_scaler(const char *path, const unsigned char *ol,
                                 size_t size, const hvd_optimizer_t *c) {
  int64_t v[2];
  double scale;
  if (!scaler_of(ol, size, c, v))
    return HVD_SUCCESS;
  memcpy(&scale, &v[0], sizeof scale);
  if (!hvd__hp_in_range(HVD__HP_NONNEG, scale)) /* backoffs can reach 0 */
    return out_of_range(path, "loss scale", scale, HVD__HP_NONNEG);
  if (v[1] < 0)
    return out_of_range(path, "loss scale's clean steps", (double)v[1],
                        HVD__HP_NONNEG);
  return HVD_SUCCESS;
}

/* One record of a version 3+ file's PowerSGD section. */
typedef struct file_psgd {
  const char *name;
  uint32_t len;
  uint64_t r, n, m, draws, flags; /* flags: bit 0 Q, bit 1 the error */
  uint64_t qt, e, qbytes, ebytes; /* their offsets and sizes, when there */
} file_psgd_t;

static hvd_result_t next_psgd(const char *path, reader_t *r, file_psgd_t *f) {
  int ok = 1;
  if (!take_str(r, &f->name, &f->len) || !take_int(r, 4, &f->r) ||
      !take_int(r, 8, &f->n) || !take_int(r, 8, &f->m) ||
      !take_int(r, 8, &f->draws) || !take_int(r, 4, &f->flags))
    return MALFORMED(r, "PowerSGD record");
  if (f->flags > 3 || f->r < 1 || f->r > f->n || f->r > f->m ||
      f->n > (uint64_t)INT64_MAX || f->m > (uint64_t)INT64_MAX)
    return MALFORMED(r, "PowerSGD record");
  int64_t qs[2] = {(int64_t)f->r, (int64_t)f->m},
          es[2] = {(int64_t)f->n, (int64_t)f->m};
  f->qbytes = shape_bytes(2, qs, sizeof(float), &ok);
  f->ebytes = ok ? shape_bytes(2, es, sizeof(float), &ok) : 0;
  f->qt = f->e = 0;
  if (!ok || ((f->flags & 1) && !take_bulk(r, f->qbytes, &f->qt)) ||
      ((f->flags & 2) && !take_bulk(r, f->ebytes, &f->e)))
    return MALFORMED(r, "PowerSGD data");
  return HVD_SUCCESS;
}

/* A version 3+ file's PowerSGD section, read through; each record of a
 * parameter that ps compresses checked against its matrix view. */
static hvd_result_t check_psgd(const char *path, reader_t *r,
                               const hvd__psgd_t *ps) {
  uint64_t count;
  file_psgd_t f;
  hvd__psgd_record_t rec;
  hvd_result_t rc;
  if (!take_int(r, 4, &count))
    return MALFORMED(r, "PowerSGD section");
  for (uint64_t k = 0; k < count; k++) {
    HVD__CHECK(next_psgd(path, r, &f));
    int i = hvd__psgd_find(ps, f.name, f.len);
    if (i < 0 || !hvd__psgd_record(ps, i, &rec) ||
        ((uint64_t)rec.n == f.n && (uint64_t)rec.m == f.m))
      continue;
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': the PowerSGD state of '%s' is %llu x "
                          "%llu in the file but the program views it as "
                          "%lld x %lld",
                          load_fn, path, rec.name, (unsigned long long)f.n,
                          (unsigned long long)f.m, (long long)rec.n,
                          (long long)rec.m);
  }
  return HVD_SUCCESS;
fail:
  return rc;
}

/* A float32 block of a record, when it has one (has): *out in host
 * memory, filled by the next flush of b. A block that cannot be allocated
 * goes nowhere, the failure remembered in b; so does one that want says
 * this rank has no use for. */
static void floats_of(hvd__ckpt_bulk_t *b, int has, int want, uint64_t off,
                      uint64_t bytes, hvd_tensor_t *view, float **out) {
  *out = NULL;
  if (!has)
    return;
  if (want && (*out = malloc(bytes ? (size_t)bytes : 1)) == NULL)
    hvd__ckpt_bulk_fail(b,
                        hvd__set_error(HVD_ERR_NO_MEMORY, "%s: %llu floats",
                                       load_fn, (unsigned long long)bytes / 4));
  int64_t count = (int64_t)(bytes / sizeof(float));
  *view = hvd_tensor_make(*out, HVD_FLOAT32, 1, &count);
  hvd__ckpt_bulk_add(b, *out != NULL ? view : NULL, off, bytes, sizeof(float),
                     0, bytes);
}

/* A version 3+ file's PowerSGD section, every rank through every record
 * alike (their bytes are broadcast); each parameter that ps (may be NULL)
 * compresses takes its state from its record, or starts fresh (no record,
 * or a version 1 or 2 file); without ps no record's bytes are sent.
 * Failures are remembered in b. */
static void apply_psgd(const char *path, reader_t *r, const unsigned char *ol,
                       hvd__psgd_t *ps, hvd__ckpt_bulk_t *b) {
  uint64_t count = 0;
  file_psgd_t f;
  hvd_result_t rc = ps != NULL ? hvd__psgd_reset(ps, load_fn) : HVD_SUCCESS;
  hvd__ckpt_bulk_fail(b, rc);
  /* the outline was walked through already: these cannot fail */
  if (hvd__get_le(ol + 8, 4) >= CKPT_VERSION3)
    take_int(r, 4, &count);
  for (uint64_t k = 0; k < count; k++) {
    if (next_psgd(path, r, &f) != HVD_SUCCESS)
      return;
    if (ps == NULL) { /* on every rank (same_parts): nothing is sent */
      if (f.flags & 1)
        hvd__ckpt_bulk_skip(b, f.qt, f.qbytes);
      if (f.flags & 2)
        hvd__ckpt_bulk_skip(b, f.e, f.ebytes);
      continue;
    }
    int i = hvd__psgd_find(ps, f.name, f.len);
    int want = i >= 0 && rc == HVD_SUCCESS;
    float *qt = NULL, *e = NULL;
    hvd_tensor_t vq, ve;
    floats_of(b, f.flags & 1, want, f.qt, f.qbytes, &vq, &qt);
    floats_of(b, (f.flags & 2) != 0, want, f.e, f.ebytes, &ve, &e);
    hvd__psgd_record_t rec = {.name = NULL,
                              .n = (int64_t)f.n,
                              .m = (int64_t)f.m,
                              .r = (int)f.r,
                              .draws = f.draws,
                              .qt = qt,
                              .e = e};
    if (hvd__ckpt_bulk_flush(b) == HVD_SUCCESS && want)
      hvd__ckpt_bulk_fail(b, hvd__psgd_load(ps, load_fn, i, &rec));
    free(qt);
    free(e);
  }
}

/* The file's optimizer against the program's (c, may be NULL). */
static hvd_result_t check_opt(const char *path, const file_opt_t *o,
                              const hvd_optimizer_t *c) {
  if (c == NULL)
    return HVD_SUCCESS;
  if (!o->present)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': the file has no optimizer state (it "
                          "was saved without an optimizer)",
                          load_fn, path);
  const char *cname = c->ops.name ? c->ops.name : "", *s = "";
  uint32_t len = 0;
  if (!same_str(o->name, o->len, cname))
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': optimizer is '%.*s' in the file but "
                          "'%s' in the program",
                          load_fn, path, SHOWN(o->len), o->name, cname);
  if (o->ns != (uint64_t)c->ops.nstate)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': optimizer '%s' has %llu state "
                          "tensors per parameter in the file but %d in "
                          "the program",
                          load_fn, path, cname, (unsigned long long)o->ns,
                          c->ops.nstate);
  reader_t r = o->names; /* next_opt read them already: they are there */
  for (uint64_t k = 0; k < o->ns; k++) {
    take_str(&r, &s, &len);
    if (!same_str(s, len, c->ops.state_names[k]))
      return hvd__set_error(HVD_ERR_CORRUPT,
                            "%s: '%s': optimizer state %llu is '%.*s' in "
                            "the file but '%s' in the program",
                            load_fn, path, (unsigned long long)k, SHOWN(len), s,
                            c->ops.state_names[k]);
  }
  return HVD_SUCCESS;
}

/* The optimizer section's lr and update count, which a load gives c
 * exactly: what hvd_optimizer_set_lr takes, and a count not negative. */
static hvd_result_t check_opt_numbers(const char *path, const file_opt_t *o,
                                      const hvd_optimizer_t *c) {
  double lr;
  memcpy(&lr, &o->lr_bits, sizeof lr);
  if (c == NULL)
    return HVD_SUCCESS;
  if (!hvd__hp_in_range(HVD__HP_NONNEG, lr))
    return out_of_range(path, "lr", lr, HVD__HP_NONNEG);
  if ((int64_t)o->steps < 0)
    return out_of_range(path, "update count", (double)(int64_t)o->steps,
                        HVD__HP_NONNEG);
  return HVD_SUCCESS;
}

/* Parameter i of the file against the model's p. */
static hvd_result_t check_param(const char *path, uint64_t i,
                                const file_param_t *f, const hvd_param_t *p) {
  char a[HVD__SHAPE_STR_MAX], b[HVD__SHAPE_STR_MAX];
  const hvd_tensor_t *t = &p->value;
  if (!same_str(f->name, f->len, p->name))
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': parameter %llu is '%.*s' in the "
                          "file but '%s' in the model",
                          load_fn, path, (unsigned long long)i, SHOWN(f->len),
                          f->name, p->name);
  if (f->dtype != (uint64_t)t->dtype)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': '%s' has dtype %s in the file but "
                          "%s in the model",
                          load_fn, path, p->name,
                          hvd_dtype_name((hvd_dtype_t)f->dtype),
                          hvd_dtype_name(t->dtype));
  if (f->ndim != (uint64_t)t->ndim ||
      memcmp(f->shape, t->shape, (size_t)f->ndim * sizeof f->shape[0]) != 0) {
    hvd__shape_str((int)f->ndim, f->shape, a, sizeof a);
    hvd__shape_str(t->ndim, t->shape, b, sizeof b);
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': '%s' has shape %s in the file but "
                          "%s in the model",
                          load_fn, path, p->name, a, b);
  }
  return HVD_SUCCESS;
}

/* Rank 0's walk through its file (head: its header): its structure,
 * whatever the model (the first malformation named). With r->out set,
 * the bytes that are no tensor's go there: the outline. */
static hvd_result_t walk(const char *path, reader_t *r,
                         const unsigned char *head) {
  hvd_result_t rc;
  uint64_t count = hvd__get_le(head + 12, 4), np = 0;
  file_opt_t o;
  file_param_t f;
  file_psgd_t g;
  HVD__CHECK(next_opt(path, r, &o));
  HVD__CHECK(next_counters(path, r, head, NULL, 0));
  HVD__CHECK(next_hparams(path, r, head, NULL, 0));
  for (uint64_t i = 0; i < count; i++)
    HVD__CHECK(next_param(path, r, o.ns, &f));
  if (hvd__get_le(head + 8, 4) >= CKPT_VERSION3) {
    if (!take_int(r, 4, &np))
      return MALFORMED(r, "PowerSGD section");
    for (uint64_t k = 0; k < np; k++)
      HVD__CHECK(next_psgd(path, r, &g));
  }
  if (r->off != r->end)
    return MALFORMED(r, "bytes after the last parameter");
  return HVD_SUCCESS;
fail:
  return rc;
}

/* walk() through rank 0's file; a read that failed is named as such. */
static hvd_result_t walk_file(const char *path, hvd__ckpt_file_t *f,
                              unsigned char *out, size_t *nout,
                              const unsigned char *head) {
  reader_t r = file_reader(f);
  r.out = out;
  r.nout = CKPT_HEADER;
  f->err = 0;
  hvd_result_t rc = walk(path, &r, head);
  *nout = r.nout;
  if (rc != HVD_SUCCESS && f->err != 0)
    return hvd__set_error(HVD_ERR_IO, "%s: '%s': cannot read: %s", load_fn,
                          path, strerror(f->err));
  return rc;
}

/* The outline of rank 0's file, which hvd__ckpt_file_open() checked: its
 * header, the bytes walk() keeps, its checksum; in *ol (malloc'd),
 * *olsize. */
static hvd_result_t outline_of(const char *path, hvd__ckpt_file_t *f,
                               unsigned char **ol, size_t *olsize) {
  hvd_result_t rc;
  const unsigned char *head = f->head;
  size_t n = 0;
  HVD__CHECK(walk_file(path, f, NULL, &n, head)); /* its size */
  *olsize = n + CKPT_SUM;
  if ((*ol = malloc(*olsize)) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "%s: '%s': cannot allocate %zu bytes", load_fn, path,
                          *olsize);
  memcpy(*ol, head, CKPT_HEADER);
  hvd__put_le(*ol + n, f->sum, CKPT_SUM);
  return walk_file(path, f, *ol, &n, head); /* the same walk again */
fail:
  return rc;
}

/* Goes through a file's outline (rank 0 walked through the file) and
 * checks it against the model (params, the optimizer core c, may be
 * NULL): the message names the first difference. Changes nothing. */
static hvd_result_t validate(const char *path, const unsigned char *ol,
                             size_t size, const hvd_param_t *params, int n,
                             const hvd_optimizer_t *c, const hvd__psgd_t *ps,
                             hvd__counters_t *ctr) {
  hvd_result_t rc;
  reader_t r = outline_reader(ol, size);
  uint64_t count = hvd__get_le(ol + 12, 4);
  file_opt_t o;
  file_param_t f;
  HVD__CHECK(next_opt(path, &r, &o));
  HVD__CHECK(check_opt(path, &o, c));
  HVD__CHECK(check_opt_numbers(path, &o, c));
  HVD__CHECK(next_counters(path, &r, ol, ctr, 0));
  HVD__CHECK(check_scaler(path, ol, size, c));
  /* (the list points into c; set 0 only reads through it) */
  HVD__CHECK(next_hparams(path, &r, ol, (hvd_optimizer_t *)c, 0));
  for (uint64_t i = 0; i < count; i++) {
    HVD__CHECK(next_param(path, &r, o.ns, &f));
    if (i < (uint64_t)n)
      HVD__CHECK(check_param(path, i, &f, &params[i]));
  }
  if (hvd__get_le(ol + 8, 4) >= CKPT_VERSION3)
    HVD__CHECK(check_psgd(path, &r, ps));
  if (count != (uint64_t)n)
    return hvd__set_error(HVD_ERR_CORRUPT,
                          "%s: '%s': the file has %llu parameters but the "
                          "model has %d",
                          load_fn, path, (unsigned long long)count, n);
  return HVD_SUCCESS;
fail:
  return rc;
}

/* The tensors' bytes of a file that every rank validated, into the
 * model and the optimizer's state, through b, which keeps the first
 * failure (every rank walks through everything, to take part in every
 * broadcast). The numbers follow once every rank succeeded
 * (apply_numbers). */
static void apply(const char *path, const unsigned char *ol, size_t size,
                  hvd_param_t *params, hvd_param_t *views, int n,
                  hvd_optimizer_t *opt, hvd__psgd_t *ps, hvd__ckpt_bulk_t *b) {
  hvd_optimizer_t *c = opt != NULL ? hvd__optim_core(opt) : NULL;
  reader_t r = outline_reader(ol, size);
  uint64_t count = hvd__get_le(ol + 12, 4);
  file_opt_t o;
  file_param_t f;
  /* validate() walked through the outline already: these cannot fail */
  if (next_opt(path, &r, &o) != HVD_SUCCESS ||
      next_counters(path, &r, ol, NULL, 0) != HVD_SUCCESS ||
      next_hparams(path, &r, ol, NULL, 0) != HVD_SUCCESS)
    return;
  for (uint64_t i = 0; i < count && i < (uint64_t)n; i++) {
    if (next_param(path, &r, o.ns, &f) != HVD_SUCCESS)
      return;
    hvd_tensor_t *blk; /* ZeRO-1 and mixed: this rank's master block */
    int64_t mlo, mhi;
    if (hvd__mixed_ckpt_target(c, (int)i, &params[i], &blk, &mlo, &mhi))
      hvd__ckpt_bulk_add_low(b, blk, f.data, f.bytes,
                             (uint64_t)mlo * sizeof(float),
                             (uint64_t)mhi * sizeof(float), &params[i].value);
    else
      hvd__ckpt_bulk_add(b, &views[i].value, f.data, f.bytes, f.esize, 0,
                         f.bytes);
    if (c == NULL) /* on every rank (same_parts): nothing is sent */
      hvd__ckpt_bulk_skip(b, f.state, f.bytes * o.ns);
    for (uint64_t k = 0; c != NULL && k < o.ns; k++) {
      int64_t lo, hi; /* the elements this rank keeps (ZeRO-1: its block) */
      hvd_tensor_t *t =
          hvd__optim_state_target(opt, (int)(i * o.ns + k), &lo, &hi);
      hvd__ckpt_bulk_add(b, t, f.state + k * f.bytes, f.bytes, f.esize,
                         (uint64_t)lo * f.esize, (uint64_t)hi * f.esize);
    }
  }
  apply_psgd(path, &r, ol, ps, b);
}

/* After every rank took the tensors: the file's numbers (the
 * hyperparameters, lr, the update count, *step, the counters) on every
 * rank alike. validate() walked through them already; only making a
 * parameter's setting may fail (out of memory). */
static hvd_result_t apply_numbers(const char *path, const unsigned char *ol,
                                  size_t size, hvd_optimizer_t *c,
                                  int64_t *step, hvd__counters_t *ctr) {
  reader_t r = outline_reader(ol, size);
  file_opt_t o;
  hvd_result_t rc;
  if (next_opt(path, &r, &o) != HVD_SUCCESS ||
      next_counters(path, &r, ol, ctr, 1) != HVD_SUCCESS)
    return HVD_SUCCESS;
  rc = next_hparams(path, &r, ol, c, 1);
  if (c != NULL) { /* exactly the optimizer section's */
    memcpy(&c->lr, &o.lr_bits, sizeof c->lr);
    c->steps = (int64_t)o.steps;
  }
  if (step != NULL)
    *step = (int64_t)hvd__get_le(ol + 24, 8);
  return rc;
}
#undef MALFORMED

static hvd_result_t load_ex(const char *path, hvd_param_t *params, int n,
                            hvd_optimizer_t *opt, int64_t *step,
                            hvd__counters_t *ctr);

hvd_result_t hvd_checkpoint_load(const char *path, hvd_param_t *params, int n,
                                 hvd_optimizer_t *opt, int64_t *step) {
  return hvd__checkpoint_load_ex(path, params, n, opt, step, NULL);
}

/* On the optimizer's process set: its first rank reads the file. */
hvd_result_t hvd__checkpoint_load_ex(const char *path, hvd_param_t *params,
                                     int n, hvd_optimizer_t *opt, int64_t *step,
                                     hvd__counters_t *ctr) {
  hvd_result_t rc;
  HVD__ON_SET(hvd__optim_set(opt), rc,
              load_ex(path, params, n, opt, step, ctr));
  return rc;
}

static hvd_result_t load_ex(const char *path, hvd_param_t *params, int n,
                            hvd_optimizer_t *opt, int64_t *step,
                            hvd__counters_t *ctr) {
  if (!hvd_is_initialized())
    return hvd__not_initialized(load_fn);
  hvd_optimizer_t *c = opt ? hvd__optim_core(opt) : NULL;
  hvd_param_t *views = NULL; /* mixed precision: load into the masters */
  hvd_result_t rc = hvd__ckpt_agree(
      "load.prep", hvd__mixed_ckpt_params(c, params, n, &views));
  if (rc == HVD_SUCCESS)
    rc = load_checked(path, params, views ? views : params, n, opt, step, ctr);
  /* the values from the masters (a sharded core's are already: the load
   * rounded each whole master into its value as it went) */
  if (rc == HVD_SUCCESS && views != NULL && !hvd__optim_sharded(opt))
    rc = hvd__ckpt_agree("load.values", hvd__mixed_values_from_masters(c));
  if (rc == HVD_SUCCESS && c != NULL)
    hvd__optim_forget_step(c); /* the file's state: no step of it yet */
  free(views);
  return rc;
}

static void load_scaler(const unsigned char *ol, size_t size,
                        hvd_optimizer_t *c) {
  int64_t v[2];
  if (scaler_of(ol, size, c, v))
    hvd__mixed_set_counters(c, v);
}

/* Whether opt is NULL, and whether it compresses with PowerSGD, on rank
 * 0 against this rank: the tensors sent depend on them. */
static hvd_result_t same_parts(const hvd_optimizer_t *opt,
                               const hvd__psgd_t *ps) {
  int32_t mine[2] = {opt != NULL, ps != NULL}, r0[2] = {mine[0], mine[1]};
  int64_t two = 2;
  hvd_tensor_t t = hvd_tensor_make(r0, HVD_INT32, 1, &two);
  hvd_result_t rc = hvd_broadcast("hvd.ckpt.load.parts", &t, 0);
  if (rc != HVD_SUCCESS)
    return rc;
  /* hvd__ckpt_agree adds " (on rank R)" */
  if (r0[0] != mine[0])
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: opt is %sNULL here but %sNULL on rank %d",
                          load_fn, mine[0] ? "not " : "", r0[0] ? "not " : "",
                          hvd__coll_world_rank(0));
  if (r0[1] != mine[1])
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "%s: opt %s with PowerSGD here but %s on rank %d",
                          load_fn, mine[1] ? "compresses" : "does not compress",
                          r0[1] ? "does" : "does not", hvd__coll_world_rank(0));
  return HVD_SUCCESS;
}

/* Rank 0 opens and checks the file (f, left open) and makes its
 * outline; every rank receives the outline (*ol, *olsize). */
static hvd_result_t share_outline(const char *path, hvd__ckpt_file_t *f,
                                  unsigned char **ol, size_t *olsize) {
  hvd_result_t rc = HVD_SUCCESS;
  int64_t one = 1, bytes = 0;
  if (hvd__coll_rank() == 0) { /* the set's first (hvd__optim_set) */
    rc = hvd__ckpt_file_open(load_fn, path, f);
    if (rc == HVD_SUCCESS)
      rc = outline_of(path, f, ol, olsize);
  }
  HVD__CHECK(hvd__ckpt_agree("load.file", rc));
  bytes = (int64_t)*olsize;
  hvd_tensor_t t = hvd_tensor_make(&bytes, HVD_INT64, 1, &one);
  HVD__CHECK(hvd_broadcast("hvd.ckpt.load.size", &t, 0));
  *olsize = (size_t)bytes;
  if (hvd__coll_rank() != 0 && (*ol = malloc(*olsize)) == NULL)
    rc =
        hvd__set_error(HVD_ERR_NO_MEMORY, "%s: '%s': cannot allocate %zu bytes",
                       load_fn, path, *olsize);
  HVD__CHECK(hvd__ckpt_agree("load.buffer", rc));
  t = hvd_tensor_make(*ol, HVD_UINT8, 1, &bytes);
  return hvd_broadcast("hvd.ckpt.load.outline", &t, 0);
fail:
  return rc;
}

/* params: the caller's; views: what the file holds of them (mixed
 * precision: the masters; else params). */
static hvd_result_t load_checked(const char *path, hvd_param_t *params,
                                 hvd_param_t *views, int n,
                                 hvd_optimizer_t *opt, int64_t *step,
                                 hvd__counters_t *ctr) {
  hvd_optimizer_t *c = opt ? hvd__optim_core(opt) : NULL;
  hvd__psgd_t *ps = opt ? hvd__optim_psgd(opt) : NULL;
  hvd__ckpt_file_t file = {.fd = -1};
  unsigned char *ol = NULL;
  size_t olsize = 0;
  hvd__ckpt_bulk_t *b = NULL;
  hvd_result_t rc = hvd__ckpt_check_args(load_fn, path, params, n, opt);
  HVD__CHECK(hvd__ckpt_agree("load.args", rc));
  HVD__CHECK(hvd__ckpt_agree("load.parts", same_parts(opt, ps)));
  HVD__CHECK(share_outline(path, &file, &ol, &olsize));
  rc = validate(path, ol, olsize, views, n, c, ps, ctr);
  HVD__CHECK(hvd__ckpt_agree("load.check", rc));
  rc = hvd__ckpt_agree(
      "load.bounce",
      hvd__ckpt_bulk_new(load_fn, file.fd >= 0 ? &file : NULL, ol, olsize, &b));
  if (rc == HVD_SUCCESS)
    apply(path, ol, olsize, params, views, n, opt, ps, b);
  hvd_result_t done = hvd__ckpt_bulk_end(b); /* frees b in any case */
  if (rc == HVD_SUCCESS) /* a failed copy to a GPU is known to every rank */
    rc = hvd__ckpt_agree("load.apply", done);
  if (rc == HVD_SUCCESS) {
    rc = hvd__ckpt_agree("load.numbers",
                         apply_numbers(path, ol, olsize, c, step, ctr));
    load_scaler(ol, olsize, c);
  }
fail:
  hvd__ckpt_file_close(&file);
  free(ol);
  return rc;
}
