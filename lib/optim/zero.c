/*
 * zero.c - a distributed optimizer's state in shards (ZeRO stage 1, as
 * DeepSpeed's and torch's ZeroRedundancyOptimizer): each rank keeps the
 * optimizer state of only its block of every parameter.
 *
 * Parameter i, flattened to n elements, is split as hvd_reducescatter
 * splits rows: rank r owns n / P elements, one more if r < n % P, in rank
 * order. A step is then
 *   1. each gradient reduce-scattered (with the wrapper's scaling), so
 *      that rank r receives the reduced gradient of its block only;
 *   2. the base optimizer's own update on the blocks: its ops->step over
 *      "parameters" that are views of each value's block, the reduced
 *      block as their gradient, and block-sized state (an elementwise
 *      update gives what the whole would);
 *   3. every parameter allgathered from its blocks (collectives named
 *      "hvd.zero.<name>").
 * The core optimizer keeps its full-shaped state tensors with no data. A
 * checkpoint save fills them on rank 0 only, a parameter at a time as it
 * writes the file, from every rank's blocks (hvd__zero_root_param; mixed
 * precision's masters the same way), so that rank 0 holds one
 * parameter's full state at most, and a
 * load writes each rank's blocks directly (hvd__zero_state_block, and
 * hvd__mixed_ckpt_target for the masters), so files are the same as an
 * unsharded optimizer's and load at any world size, sharded or not, and
 * no other rank ever holds the full state or a whole master.
 *
 * A device parameter's blocks, state and reduced gradient live on its GPU
 * (the base's update runs its device kernels on the block views): the
 * same collectives through the device executors. Nothing is allocated or
 * copied per step: each gradient is reduce-scattered into its block made
 * at creation, each parameter allgathered in place from its block (a view
 * of it), all through hvd's _into calls, so that the executors fuse a
 * step's reduce-scatters into one group and its allgathers into another
 * (one NCCL group each on a GPU, as llm.c's ZeRO).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "core/api.h"
#include "optim/device.h"
#include "optim/optimizer.h"

#define ZERO_PREFIX "hvd.zero."

struct hvd__zero {
  int n, ns;
  int64_t *off, *len;  /* this rank's block of each parameter */
  hvd_tensor_t *recv;  /* the reduced gradient blocks: made once, written
                          by every step's reduce-scatter (in the gradient's
                          dtype, or float32 with reduce_fp32) */
  hvd_tensor_t *gblk;  /* mixed precision: a low-precision parameter's
                          block gradient in float32 (else data NULL) */
  float **gdst;        /* mixed precision: each block gradient's float32
                          (gblk, or recv in place) */
  hvd_param_t *block;  /* views: value block (a low-precision parameter's
                          master block), recv as grad */
  hvd_tensor_t *vblk;  /* each value's block in its own dtype: what the
                          allgather sends (in place) */
  hvd_tensor_t *state; /* n * ns block-sized state tensors */
  char **names;        /* "hvd.zero.<name>" */
  char **snames;       /* n * ns: "hvd.zero.<name>.state<k>" */
  char **mnames;       /* "hvd.zero.<name>.master" */
};

/* Zeroed memory for state tensor st (shape set) on dev: host or device. */
static hvd_result_t alloc_state(const char *who, hvd_optimizer_t *core,
                                hvd_tensor_t *st, int dev) {
  size_t bytes = hvd__tensor_bytes(st);
  st->device = dev;
  if (dev != HVD_CPU)
    return hvd__odev_calloc(who, core->odev, bytes, &st->data);
  /* zero-filled, never NULL (NULL means none) */
  if ((st->data = hvd_alloc_host(bytes > 0 ? bytes : 1)) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", who);
  return HVD_SUCCESS;
}

static void free_state(hvd_tensor_t *st) {
  if (st->device == HVD_CPU)
    (void)hvd_free_host(st->data);
  else
    hvd__odev_free(st->device, st->data);
  st->data = NULL;
}

void hvd__zero_free(hvd__zero_t *z) {
  if (z == NULL)
    return;
  for (int i = 0; i < z->n; i++) {
    if (z->recv != NULL && z->recv[i].data != NULL)
      free_state(&z->recv[i]);
    if (z->gblk != NULL && z->gblk[i].data != NULL)
      free_state(&z->gblk[i]);
    if (z->names != NULL)
      free(z->names[i]);
    if (z->mnames != NULL)
      free(z->mnames[i]);
  }
  for (int s = 0; z->snames != NULL && s < z->n * z->ns; s++)
    free(z->snames[s]);
  free(z->snames);
  for (int s = 0; z->state != NULL && s < z->n * z->ns; s++)
    free_state(&z->state[s]);
  free(z->off);
  free(z->len);
  free(z->recv);
  free(z->gblk);
  free(z->gdst);
  free(z->block);
  free(z->vblk);
  free(z->state);
  free(z->names);
  free(z->mnames);
  free(z);
}

/* Parameter i's block: its reduced gradient (in the gradient's dtype, or
 * float32 with reduce_fp32; a low-precision one's float32 copy in gblk),
 * the view of the value's block, the collectives' names and the state. */
static hvd_result_t make_block(const char *fn, hvd__zero_t *z,
                               hvd_optimizer_t *core, int i, int reduce_fp32) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_param_t *p = &core->params[i];
  int dev = p->value.device, ns = z->ns;
  int low = core->mixed != NULL && hvd__mixed_low(p->value.dtype);
  hvd_dtype_t rdt = low && !reduce_fp32 ? p->grad.dtype : HVD_FLOAT32;
  z->recv[i] = hvd_tensor_make(NULL, rdt, 1, &z->len[i]);
  HVD__CHECK(alloc_state(fn, core, &z->recv[i], dev));
  if (low) {
    z->gblk[i] = hvd_tensor_make(NULL, HVD_FLOAT32, 1, &z->len[i]);
    HVD__CHECK(alloc_state(fn, core, &z->gblk[i], dev));
  }
  char *v = p->value.data; /* NULL for an empty one */
  z->vblk[i] = hvd_tensor_make(
      v != NULL ? v + z->off[i] * hvd_dtype_size(p->value.dtype) : NULL,
      p->value.dtype, 1, &z->len[i]);
  z->vblk[i].device = dev;
  size_t len = sizeof ZERO_PREFIX + strlen(p->name);
  if ((z->names[i] = malloc(len)) == NULL ||
      (z->mnames[i] = malloc(len + sizeof ".master")) == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
  snprintf(z->names[i], len, "%s%s", ZERO_PREFIX, p->name);
  snprintf(z->mnames[i], len + sizeof ".master", "%s.master", z->names[i]);
  for (int k = 0; k < ns; k++) {
    size_t slen = len + sizeof ".state" + 11;
    if ((z->snames[i * ns + k] = malloc(slen)) == NULL)
      return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
    snprintf(z->snames[i * ns + k], slen, "%s.state%d", z->names[i], k);
    hvd_tensor_t *st = &z->state[i * ns + k];
    *st = hvd_tensor_make(NULL, HVD_FLOAT32, 1, &z->len[i]);
    HVD__CHECK(alloc_state(fn, core, st, dev));
  }
fail:
  return rc;
}

hvd_result_t hvd__zero_create(const char *fn, hvd_optimizer_t *core,
                              int reduce_fp32, hvd__zero_t **out) {
  hvd_result_t rc;
  *out = NULL;
  hvd__zero_t *z = calloc(1, sizeof *z);
  if (z == NULL)
    goto oom;
  int n = z->n = core->n, ns = z->ns = core->ops.nstate;
  size_t cnt = n > 0 ? (size_t)n : 1;
  z->off = calloc(cnt, sizeof *z->off);
  z->len = calloc(cnt, sizeof *z->len);
  z->recv = calloc(cnt, sizeof *z->recv);
  z->gblk = calloc(cnt, sizeof *z->gblk);
  z->gdst = calloc(cnt, sizeof *z->gdst);
  z->block = calloc(cnt, sizeof *z->block);
  z->vblk = calloc(cnt, sizeof *z->vblk);
  z->names = calloc(cnt, sizeof *z->names);
  z->mnames = calloc(cnt, sizeof *z->mnames);
  z->state = calloc(cnt * (ns > 0 ? (size_t)ns : 1), sizeof *z->state);
  z->snames = calloc(cnt * (ns > 0 ? (size_t)ns : 1), sizeof *z->snames);
  if (!z->off || !z->len || !z->recv || !z->gblk || !z->gdst || !z->block ||
      !z->vblk || !z->names || !z->mnames || !z->state || !z->snames)
    goto oom;
  int64_t P = hvd__coll_size(), r = hvd__coll_rank(); /* the set's */
  for (int i = 0; i < n; i++) {
    int64_t numel = hvd_tensor_numel(&core->params[i].value);
    int64_t q = numel / P, m = numel % P;
    z->len[i] = q + (r < m);
    z->off[i] = r * q + (r < m ? r : m);
    if ((rc = make_block(fn, z, core, i, reduce_fp32)) != HVD_SUCCESS)
      goto fail;
  }
  /* mixed precision: each rank keeps its block of every master (the last
   * step that can fail: it changes nothing when it does) */
  if (core->mixed != NULL &&
      (rc = hvd__mixed_shard(fn, core, z->off, z->len, reduce_fp32)) !=
          HVD_SUCCESS)
    goto fail;
  for (int i = 0; i < n; i++) { /* the update's views: master or value */
    hvd_tensor_t *master = hvd__mixed_master(core, i);
    z->block[i].name = core->params[i].name;
    z->block[i].value = master != NULL ? *master : z->vblk[i];
    z->block[i].grad = hvd_tensor_make(NULL, HVD_FLOAT32, 1, &z->len[i]);
    z->block[i].grad.device = z->vblk[i].device;
  }
  /* the core's full state: shapes only from now on */
  for (int s = 0; s < n * ns; s++)
    free_state(&core->state[s]);
  *out = z;
  return HVD_SUCCESS;
oom:
  rc = hvd__set_error(HVD_ERR_NO_MEMORY, "%s: out of memory", fn);
fail:
  hvd__zero_free(z);
  return rc;
}

hvd_result_t hvd__zero_reduce_async(hvd__zero_t *z, const hvd_tensor_t *g,
                                    int i, const char *name, double pre,
                                    double post, hvd_request_t **req) {
  int64_t numel = hvd_tensor_numel(g);
  hvd_tensor_t flat = hvd_tensor_make(g->data, g->dtype, 1, &numel);
  flat.device = g->device;
  return hvd__reducescatter_into_async(name, &flat, &z->recv[i], HVD_SUM, pre,
                                       post, req);
}

/* Keeps rc and hvd_last_error() in *first and msg (HVD__ERRMSG_MAX
 * bytes) when rc is the first failure. */
static void first_failure(hvd_result_t rc, hvd_result_t *first, char *msg) {
  if (rc != HVD_SUCCESS && *first == HVD_SUCCESS) {
    *first = rc;
    snprintf(msg, HVD__ERRMSG_MAX, "%s", hvd_last_error());
  }
}

/* Allgathers every parameter's value from its blocks, written there
 * directly (hvd__allgather_into_async: each block a view of its value,
 * nothing allocated, nothing copied). Submits them all, so that they
 * fuse, then waits for every one, even after a failure, and returns the
 * first failure's code and message. The values follow an update that
 * synchronised its stream (the base's step, or the rounding into
 * low-precision values): they are settled on the device, so no ready
 * event per block (hvd__device_settled). */
static hvd_result_t gather_blocks(hvd__zero_t *z, hvd_optimizer_t *core) {
  int count = z->n;
  hvd_result_t first = HVD_SUCCESS;
  char msg[HVD__ERRMSG_MAX];
  hvd_request_t **req = calloc(count > 0 ? (size_t)count : 1, sizeof *req);
  if (req == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "gathering the optimizer's blocks: out of memory");
  hvd__device_settled(1);
  for (int k = 0; k < count; k++) {
    const hvd_tensor_t *w = &core->params[k].value;
    int64_t numel = hvd_tensor_numel(w);
    hvd_tensor_t whole = hvd_tensor_make(w->data, w->dtype, 1, &numel);
    whole.device = w->device;
    first_failure(
        hvd__allgather_into_async(z->names[k], &z->vblk[k], &whole, &req[k]),
        &first, msg);
  }
  hvd__device_settled(0);
  for (int k = 0; k < count; k++)
    first_failure(req[k] != NULL ? hvd_wait(req[k]) : HVD_SUCCESS, &first, msg);
  free(req);
  return first == HVD_SUCCESS ? first : hvd__set_error_msg(first, msg);
}

/* Mixed precision (core->mixed): the blocks' gradients to float32,
 * unscaled, the ranks' agreed inf/NaN check, the update on the master
 * blocks (or the skip: nothing gathered), each rounded into its value's
 * block, then the values allgathered in their own dtype (half the bytes
 * of float32 masters for a low-precision parameter). Rounding is
 * elementwise, so the values are the unsharded optimizer's bit for bit. */
static hvd_result_t apply_mixed(hvd__zero_t *z, hvd_optimizer_t *core) {
  int updated = 0;
  for (int i = 0; i < z->n; i++) { /* low precision: into gblk */
    z->gdst[i] = z->gblk[i].data != NULL ? z->gblk[i].data : z->recv[i].data;
    z->block[i].grad.data = z->gdst[i];
  }
  hvd_result_t rc = hvd__mixed_step_blocks(core, z->recv, z->gdst, z->block,
                                           z->state, &updated);
  for (int i = 0; i < z->n; i++)
    z->block[i].grad.data = NULL;
  if (rc == HVD_SUCCESS && updated)
    rc = hvd__mixed_finish_blocks(core);
  if (rc == HVD_SUCCESS && updated)
    rc = gather_blocks(z, core);
  return rc;
}

hvd_result_t hvd__zero_apply(hvd__zero_t *z, hvd_optimizer_t *core) {
  if (core->mixed != NULL)
    return apply_mixed(z, core);
  for (int i = 0; i < z->n; i++)
    z->block[i].grad.data = z->recv[i].data;
  hvd_result_t rc = hvd__optim_apply_on(core, z->block, z->state);
  for (int i = 0; i < z->n; i++)
    z->block[i].grad.data = NULL;
  return rc == HVD_SUCCESS ? gather_blocks(z, core) : rc;
}

/* What a save gathers on rank 0, item j of n * ns + n: state tensor j,
 * then (mixed) parameter j - n * ns's master. Its block here and its
 * length, its collective's name, and the whole that rank 0 fills (a
 * shape: its data is set to the gathered); 0 when there is nothing. */
static int root_item(hvd__zero_t *z, hvd_optimizer_t *core, int j,
                     hvd_tensor_t **blk, int64_t *len, const char **name,
                     hvd_tensor_t **whole) {
  if (j < z->n * z->ns) {
    *blk = &z->state[j];
    *len = z->len[j / z->ns];
    *name = z->snames[j];
    *whole = &core->state[j];
    return 1;
  }
  int k = j - z->n * z->ns;
  if (k < 0 || k >= z->n || (*whole = hvd__mixed_full(core, k)) == NULL)
    return 0;
  *blk = hvd__mixed_master(core, k);
  *len = z->len[k];
  *name = z->mnames[k];
  return 1;
}

/* Submits item j's alltoall to rank 0 (each rank's block to rank 0 only;
 * hvd allocates rank 0's output: the whole, flat, in rank order). */
static hvd_result_t to_root_async(hvd__zero_t *z, hvd_optimizer_t *core, int j,
                                  hvd_tensor_t *out, hvd_request_t **req) {
  char label[HVD__ERRMSG_MAX];
  hvd_tensor_t *blk, *whole;
  const char *name;
  int64_t len;
  if (!root_item(z, core, j, &blk, &len, &name, &whole))
    return HVD_SUCCESS;
  int64_t *splits = calloc((size_t)hvd__coll_size(), sizeof *splits);
  if (splits == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "%s: splits", name);
  splits[0] = len;
  snprintf(label, sizeof label, "%s.root", name);
  hvd_result_t rc = hvd_alltoall_async(label, blk, splits, out, NULL, req);
  free(splits);
  return rc;
}

/* Item q of parameter i's (root_item's numbers): its ns state tensors,
 * then master m (-1: none); param_count of them. */
static int param_item(const hvd__zero_t *z, int i, int m, int q) {
  return q < z->ns ? i * z->ns + q : z->n * z->ns + m;
}

static int param_count(const hvd__zero_t *z, int m) { return z->ns + (m >= 0); }

hvd_result_t hvd__zero_root_param(hvd__zero_t *z, hvd_optimizer_t *core, int i,
                                  int m) {
  int count = param_count(z, m);
  hvd_result_t first = HVD_SUCCESS, rc;
  char msg[HVD__ERRMSG_MAX] = "";
  hvd_request_t **req = calloc((size_t)count + 1, sizeof *req);
  hvd_tensor_t *out = calloc((size_t)count + 1, sizeof *out);
  if (req == NULL || out == NULL) {
    free(req);
    free(out);
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "gathering the optimizer's blocks: out of memory");
  }
  for (int q = 0; q < count; q++)
    first_failure(
        to_root_async(z, core, param_item(z, i, m, q), &out[q], &req[q]),
        &first, msg);
  for (int q = 0; q < count; q++) {
    hvd_tensor_t *blk, *whole;
    const char *name;
    int64_t len;
    rc = req[q] != NULL ? hvd_wait(req[q]) : HVD_SUCCESS;
    first_failure(rc, &first, msg);
    if (req[q] != NULL && rc == HVD_SUCCESS && hvd__coll_rank() == 0 &&
        root_item(z, core, param_item(z, i, m, q), &blk, &len, &name, &whole))
      whole->data = out[q].data,
      whole->device = out[q].device; /* shape stays */
    else
      hvd_tensor_free(&out[q]);
  }
  free(req);
  free(out);
  if (first != HVD_SUCCESS) {
    hvd__set_error(first, "the full optimizer state on rank %d: %s",
                   hvd__coll_world_rank(0), msg);
    hvd__zero_release_param(z, core, i, m);
  }
  return first;
}

void hvd__zero_release_param(hvd__zero_t *z, hvd_optimizer_t *core, int i,
                             int m) {
  for (int q = 0; q < param_count(z, m); q++) {
    hvd_tensor_t *blk, *whole;
    const char *name;
    int64_t len;
    if (!root_item(z, core, param_item(z, i, m, q), &blk, &len, &name, &whole))
      continue;
    hvd_tensor_t t = *whole; /* hvd allocated it (or NULL) */
    hvd_tensor_free(&t);
    whole->data = NULL;
  }
}

hvd_tensor_t *hvd__zero_state_block(hvd__zero_t *z, int s, int64_t *lo,
                                    int64_t *hi) {
  *lo = z->off[s / z->ns];
  *hi = *lo + z->len[s / z->ns];
  return &z->state[s];
}

int64_t hvd__zero_state_bytes(const hvd__zero_t *z) {
  int64_t b = 0;
  for (int s = 0; s < z->n * z->ns; s++)
    b += z->len[s / z->ns] * (int64_t)sizeof(float);
  return b;
}
