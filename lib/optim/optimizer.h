/*
 * optimizer.h - what the files of lib/optim share. An hvd_optimizer_t is
 * either a plain optimizer (params, ops, state) or a distributed wrapper
 * (dist != NULL) around a plain one (base), which holds params and state.
 */
#ifndef HVD_OPTIM_OPTIMIZER_H
#define HVD_OPTIM_OPTIMIZER_H

#include "core/api.h"
#include "internal.h"
#include "optim/device.h"

typedef struct hvd__dist hvd__dist_t;   /* distributed.c */
typedef struct hvd__mixed hvd__mixed_t; /* mixed.c */
typedef struct hvd__clip hvd__clip_t;   /* clip.c */

/* The collectives a distributed optimizer's core issues inside its step
 * besides the gradients' (loss scaling's inf/NaN agreement, a sharded
 * step's clipping and LAMB norms), each named after the optimizer's first
 * parameter, "<kind>.<name>" (as "hvd.hparams.<name>"): two optimizers
 * stepping at once on two threads (a GAN's generator and discriminator)
 * never submit one name twice. Made by hvd_distributed_optimizer
 * (hvd__optim_name_steps); NULL in a plain optimizer, which issues none
 * of them. One allocation, `block`. */
typedef struct hvd__step_names {
  char *block;
  const char *found_inf;      /* "hvd.loss_scale.found_inf.<name>" */
  const char *clip_norm;      /* "hvd.clip.norm.<name>" */
  const char *clip_nonfinite; /* "hvd.clip.nonfinite.<name>" */
  const char *lamb_norms;     /* "hvd.lamb.norms.<name>" */
  const char *lamb_nonfinite; /* "hvd.lamb.nonfinite.<name>" */
} hvd__step_names_t;

/* What an optimizer does, by kind: the plain one (optimizer.c) updates
 * its parameters; the distributed wrapper (distributed.c) reduces the
 * gradients first and steps its base. The public calls check their
 * arguments' presence and dispatch here; no other code asks which kind
 * an optimizer is. */
typedef struct hvd__optim_class {
  hvd_result_t (*step)(hvd_optimizer_t *opt);
  hvd_result_t (*zero_grad)(hvd_optimizer_t *opt);
  hvd_result_t (*grad_ready)(hvd_optimizer_t *opt, int i);
  /* rows checked by the public call (hvd__optim_sparse_check) */
  hvd_result_t (*sparse_grad)(hvd_optimizer_t *opt, int i, const int64_t *rows,
                              int64_t nrows, const float *values);
  hvd_result_t (*set_sync)(hvd_optimizer_t *opt, int sync);
  void (*destroy)(hvd_optimizer_t *opt);
} hvd__optim_class_t;

extern const hvd__optim_class_t hvd__plain_class; /* optimizer.c */
extern const hvd__optim_class_t hvd__dist_class;  /* distributed.c */

struct hvd_optimizer {
  const hvd__optim_class_t *cls;
  /* plain optimizer */
  hvd_param_t *params; /* borrowed */
  int n;
  hvd_optimizer_ops_t ops; /* copied; ops.state_names borrowed (static) */
  void *ctx;               /* ops' context (built-ins: their options) */
  hvd_tensor_t *state;     /* n * ops.nstate tensors, data owned by hvd,
                              each on its parameter's device */
  hvd__odev_t *odev;       /* the device context when some parameter is on
                              the GPU (device.h), else NULL */
  int64_t steps;           /* updates applied */
  double lr;
  int fresh; /* gradients changed since the last step (zero_grad/ready) */
  hvd__mixed_t *mixed; /* float16/bfloat16 parameters' masters, loss
                          scaling (mixed.c); NULL: neither */
  int agree_inf;       /* a distributed optimizer's core: the ranks agree
                          on a step's inf/NaN (loss scaling) */
  hvd__clip_t *clip;   /* gradient clipping (clip.c); NULL: off */
  int sharded;         /* a sharded distributed optimizer's core: its
                          updates see blocks (zero.c) */
  /* a distributed optimizer's core: its step's collectives' names (block
   * NULL: none) */
  hvd__step_names_t names;
  /* distributed wrapper */
  hvd_optimizer_t *base; /* owned */
  hvd__dist_t *dist;
  /* the process set a distributed optimizer (and its core) reduces over,
   * NULL: the world (hvd_distributed_options_t.process_set, borrowed) */
  const hvd_process_set_t *ps;
};

/* rc = call, with the collectives this thread builds meanwhile on process
 * set ps (NULL: the world; hvd__coll_set). Each public call of a
 * distributed optimizer, and the broadcasts, checkpoints and states given
 * one, run so on its process_set: every collective inside (gradients,
 * found_inf, norms, agreement, ZeRO's blocks, PowerSGD, broadcasts) is
 * the set's, with ranks and sizes counted in it (hvd__coll_rank/size). */
/* The ps of an hvd_ps_* call of lib/optim: hvd initialised, ps given and
 * this rank in it ("<fn>: rank 3 is not in process set 1"). */
hvd_result_t hvd__optim_check_set(const char *fn, const hvd_process_set_t *ps);

/* The process set opt's calls run on (opt NULL or plain: the world). */
static inline const hvd_process_set_t *
hvd__optim_set(const hvd_optimizer_t *opt) {
  return opt != NULL ? opt->ps : NULL;
}

#define HVD__ON_SET(ps, rc, call)                                              \
  do {                                                                         \
    const hvd_process_set_t *was_ = hvd__coll_set(ps);                         \
    (rc) = (call);                                                             \
    hvd__coll_set(was_);                                                       \
  } while (0)

/* Steps need new gradients: the message of both the plain and the
 * distributed step. */
#define HVD__NO_NEW_GRADS                                                      \
  "hvd_optimizer_step: no new gradients since the last step (call "            \
  "hvd_optimizer_zero_grad and run backward first)"

/* The plain optimizer that holds params and state (opt itself or its
 * base). */
/* Collective over the world, or the set of HVD__ON_SET (optimizer.c). Every
 * rank passes its own result (its message in hvd_last_error() when it failed);
 * every rank returns the result and message of the lowest failing rank, with "
 * (on rank R)" added when R (its world rank) is not 0: a step that can fail on
 * one rank (an allocation) is agreed before the collectives that need it on
 * all, so a rank that failed never strands its peers in them. name names the
 * collectives ("<name>" and "<name>.error"). A failure of the collectives
 * themselves is returned as is. */
hvd_result_t hvd__optim_agree(const char *name, hvd_result_t local);

/* core->names made from its first parameter's name (which the caller
 * checked; "" without parameters), replacing any it had. Nothing changes
 * on failure (HVD_ERR_NO_MEMORY naming fn). */
hvd_result_t hvd__optim_name_steps(const char *fn, hvd_optimizer_t *core);

hvd_optimizer_t *hvd__optim_core(hvd_optimizer_t *opt);
const hvd_optimizer_t *hvd__optim_core_const(const hvd_optimizer_t *opt);

/* What the last step left to ask about forgotten: whether it was skipped
 * (loss scaling, hvd_optimizer_step_skipped 0) and its gradient norm
 * (clipping, NAN). A step starts, or the optimizer's state was restored
 * (a checkpoint's load, hvd_state's restore, a state broadcast), after
 * which no step of the restored state has run yet. */
void hvd__optim_forget_step(hvd_optimizer_t *core);

/* One local update of a plain optimizer from its params' grads (steps++).
 * Used by the distributed wrapper after its reductions. */
hvd_result_t hvd__optim_apply(hvd_optimizer_t *core);
/* The same update over other parameter views and state of core's count
 * (the sharded optimizer's blocks). */
hvd_result_t hvd__optim_apply_on(hvd_optimizer_t *core, hvd_param_t *params,
                                 hvd_tensor_t *state);

/* Adds sparse rows into parameter i's host gradient, each value times
 * scale: grad[rows[k]] += scale * values[k] (rows of row_len elements),
 * in order k = 0, 1, ...; the rows were checked. */
void hvd__optim_sparse_add(hvd_tensor_t *grad, const int64_t *rows,
                           int64_t nrows, const float *values, float scale);

/* ---- mixed precision (mixed.c) ------------------------------------------ */

/* 1 for float16 and bfloat16. */
int hvd__mixed_low(hvd_dtype_t t);
/* core->mixed for core's low-precision parameters (masters made from
 * their values), or with force (loss scaling) even without any. */
hvd_result_t hvd__mixed_create(const char *who, hvd_optimizer_t *core,
                               int force);
void hvd__mixed_free(hvd__mixed_t *m); /* accepts NULL */
/* A step of a core with mixed: gradients to float32 times factor / scale,
 * the inf/NaN check (agreed with agree_inf), the update on float32 views,
 * the values from the masters, the scale's update. */
hvd_result_t hvd__mixed_apply(hvd_optimizer_t *core, double factor);
/* The sharded optimizer's step (zero.c): gradients grads[i] (this rank's
 * reduced blocks) to float32 dsts[i] unscaled, the agreed inf/NaN check,
 * then ops->step on the block views (*updated 1) or the skip; then
 * finish_blocks rounds each master block into its value's block and
 * updates the scale (zero.c then allgathers the values). */
hvd_result_t hvd__mixed_step_blocks(hvd_optimizer_t *core,
                                    const hvd_tensor_t *grads,
                                    float *const *dsts, hvd_param_t *views,
                                    hvd_tensor_t *state, int *updated);
hvd_result_t hvd__mixed_finish_blocks(hvd_optimizer_t *core);
/* Parameter i's float32 master (sharded: this rank's block of it), or
 * NULL (float32 parameter, no mixed). */
hvd_tensor_t *hvd__mixed_master(hvd_optimizer_t *core, int i);
/* ZeRO-1 (zero.c): each master cut to this rank's block, len[i] elements
 * at element off[i]; the whole master gradients freed unless keep_mgrad
 * (reduce_fp32 reduces from them). Nothing changes on failure. */
hvd_result_t hvd__mixed_shard(const char *who, hvd_optimizer_t *core,
                              const int64_t *off, const int64_t *len,
                              int keep_mgrad);
/* reduce_fp32: parameter i's float32 gradient to reduce (*out: its master
 * gradient, filled from the low-precision one now; the grad itself for a
 * float32 parameter). */
hvd_result_t hvd__mixed_grad32(hvd_optimizer_t *core, int i,
                               hvd_tensor_t **out);
/* The gradients of a step are spent without an update (the step failed,
 * or zero_grad): no float32 copy made by hvd__mixed_grad32 stands for
 * the next one. Accepts a core without mixed. */
void hvd__mixed_forget_grads(hvd_optimizer_t *core);
/* Checkpoints and the state broadcast: a copy of params (free it) whose
 * low-precision values of core's own parameters are their whole float32
 * masters (*views NULL without mixed). A sharded core has no whole
 * master: its view is the whole's shape (hvd__mixed_full), with data
 * only on rank 0 while a save writes it (hvd__zero_root_param), NULL
 * elsewhere; a load takes it with hvd__mixed_ckpt_target. After a load
 * of an unsharded core, every value rounded from its master. */
hvd_result_t hvd__mixed_ckpt_params(hvd_optimizer_t *core,
                                    const hvd_param_t *params, int n,
                                    hvd_param_t **views);
/* The caller's parameter p, the i-th of the list given with the
 * optimizer, as a parameter of core: core's i-th when that holds p's
 * value and name, else the one holding p's value (and name, when the
 * value's data is NULL, as every empty one's may be).
 * hvd__mixed_index: a sharded core's such parameter whose master is
 * sharded (low precision): its index, or -1. */
int hvd__mixed_index(const hvd_optimizer_t *core, int i, const hvd_param_t *p);
/* A load into a sharded core: 1 when p (as above) is one of its
 * low-precision parameters, whose master's elements [*lo, *hi) are this
 * rank's block *blk (elements from 0); else 0. */
int hvd__mixed_ckpt_target(hvd_optimizer_t *core, int i, const hvd_param_t *p,
                           hvd_tensor_t **blk, int64_t *lo, int64_t *hi);
/* Bytes of core's masters on this rank (blocks when sharded; 0 without
 * mixed). */
int64_t hvd__mixed_bytes(const hvd_optimizer_t *core);
/* A sharded core's whole master of parameter i: its shape and device,
 * data for zero.c to set and free (NULL: a float32 parameter, or not
 * sharded). */
hvd_tensor_t *hvd__mixed_full(hvd_optimizer_t *core, int i);
/* Every low-precision value rounded from its master (block, when
 * sharded). */
hvd_result_t hvd__mixed_values_from_masters(hvd_optimizer_t *core);
/* hvd_broadcast_parameters wrote params[0..n) on this rank: in every
 * live optimizer's master of one of those values (a registry), each
 * element that no longer rounds to the value becomes the value. */
hvd_result_t hvd__mixed_refresh(const hvd_param_t *params, int n,
                                const char *who);
/* The loss scaler's counters ("hvd.loss_scale": the scale's bits,
 * "hvd.loss_scale.clean"): *n 2, or 0 without loss scaling. */
void hvd__mixed_counters(const hvd_optimizer_t *core, int64_t values[2],
                         int *n);
void hvd__mixed_set_counters(hvd_optimizer_t *core, const int64_t values[2]);
/* The last step counts as not skipped (hvd__optim_forget_step); accepts a
 * core without mixed. */
void hvd__mixed_forget_skip(hvd_optimizer_t *core);

/* ---- hyperparameters (hparams.c) ---------------------------------------- */

/* The values a hyperparameter may take: its setter's range, which a
 * checkpoint's load checks the file's value against (hvd__hp_in_range,
 * hvd__hp_range_words). */
typedef enum hvd__hp_range {
  HVD__HP_ANY,      /* a constant: not set from outside */
  HVD__HP_NONNEG,   /* [0, inf): lr, momentum, weight_decay, counts */
  HVD__HP_FINITE,   /* (-inf, inf): SGD's dampening */
  HVD__HP_POS,      /* (0, inf): eps, a loss scale */
  HVD__HP_UNIT,     /* [0, 1): beta1, beta2 */
  HVD__HP_FLAG,     /* an int, on if not 0 (saved as 0 or 1; earlier
                       builds saved the options' int) */
  HVD__HP_GE1,      /* [1, inf): growth_factor, growth_interval */
  HVD__HP_BACKOFF,  /* (0, 1]: backoff_factor */
  HVD__HP_MAXNORM,  /* (0, inf]: max_norm with clipping on */
  HVD__HP_NORMTYPE, /* 2 or inf: norm_type */
} hvd__hp_range_t;

/* 1 when x is in range r; its words ("[0, 1)") for a message. */
int hvd__hp_in_range(hvd__hp_range_t r, double x);
const char *hvd__hp_range_words(hvd__hp_range_t r);

/* One of an optimizer's hyperparameters: a label ("lr", "momentum") and
 * where its value lives (type 'd' double, 'i' int, 'l' int64_t), or a
 * constant v (type 'c': what the optimizer is, read-only); range: the
 * values its setter takes. */
typedef struct hvd__hp {
  const char *label;
  char type;
  void *at;
  double v;
  hvd__hp_range_t range;
} hvd__hp_t;

#define HVD__HP_MAX 24 /* the longest list */
#define HVD__HP_SHAPE                                                          \
  4 /* its first entries, on which the rest depends:                           \
       the optimizer, its parameter count, loss scaling                        \
       and clipping on or off */

/* core's hyperparameters in a fixed order into hp: the count. */
int hvd__hp_list(hvd_optimizer_t *core, hvd__hp_t hp[HVD__HP_MAX]);
double hvd__hp_get(const hvd__hp_t *h);
void hvd__hp_set(const hvd__hp_t *h, double v); /* not for constants */
/* Parameter i's learning-rate scale and weight decay as set (NAN where
 * none was, and for a custom optimizer). */
void hvd__hp_param_raw(const hvd_optimizer_t *core, int i, double *lr_scale,
                       double *wd);
/* Parameter i's learning-rate scale and weight decay made v[0] and v[1]
 * (as hvd__hp_param_raw gives them: NAN, none) where v or core has one
 * set: what a broadcast, a load or a restore of them does. Fails only
 * out of memory (the per-parameter arrays' first setting). */
hvd_result_t hvd__hp_param_take(hvd_optimizer_t *core, int i,
                                const double v[2]);
/* The list's values (zeros after its end) and each parameter's pair as
 * hvd__hp_param_raw gives it, in HVD__HP_VALUES(core->n) doubles: what
 * hvd_broadcast_optimizer_state sends and hvd_state keeps. hvd__hp_restore
 * makes them core's (the list past its shape, then each pair as
 * hvd__hp_param_take); it fails only as that may. */
#define HVD__HP_VALUES(n) (HVD__HP_MAX + 2 * (size_t)(n))
void hvd__hp_save(hvd_optimizer_t *core, double *v);
hvd_result_t hvd__hp_restore(hvd_optimizer_t *core, const double *v);
/* A digest of the list and every parameter's pair, in [0, 2^62). */
int64_t hvd__hp_digest(hvd_optimizer_t *core);
/* After the ranks' digests differed within ps (NULL: the world):
 * HVD_ERR_MISMATCH naming the first hyperparameter that differs, the
 * ranks and their values (collective: two MAX allreduces of every
 * member's row, named name.values and name.params, which leave out a
 * rank that has joined). */
hvd_result_t hvd__hp_mismatch(hvd_optimizer_t *core,
                              const hvd_process_set_t *ps, const char *name);
/* Loss scaling's entries (mixed.c) and clipping's (clip.c; c may be
 * NULL) appended at hp: their count. */
int hvd__mixed_scaling(const hvd_optimizer_t *core);
int hvd__mixed_hparams(hvd_optimizer_t *core, hvd__hp_t *hp);
int hvd__clip_hparams(hvd__clip_t *c, hvd__hp_t *hp);

/* ---- gradient clipping (clip.c) ------------------------------------------ */

/* Before an update of core->clip's core on params (float32 views of its
 * parameters, or a sharded optimizer's blocks): the global norm of their
 * gradients (agreed over the ranks when sharded), and the gradients
 * scaled in place when it exceeds max_norm. A non-finite norm fails,
 * alike on every rank. */
hvd_result_t hvd__clip_apply(hvd_optimizer_t *core, hvd_param_t *params);
void hvd__clip_free(hvd__clip_t *c); /* accepts NULL */
/* The last norm forgotten (NAN): a step starts, or its update failed.
 * Accepts NULL. */
void hvd__clip_forget(hvd__clip_t *c);

/* ---- sharded state (zero.c): a distributed optimizer's ZeRO-1 part ---- */

typedef struct hvd__zero hvd__zero_t;

/* Splits every parameter of core (host only) into this rank's block and
 * makes block-sized state; on success the core's full state tensors keep
 * their shapes but lose their data (NULL). */
hvd_result_t hvd__zero_create(const char *fn, hvd_optimizer_t *core,
                              int reduce_fp32, hvd__zero_t **out);
void hvd__zero_free(hvd__zero_t *z); /* accepts NULL */
/* Parameter i's gradient g (its grad, or the float32 copy of a
 * low-precision one with reduce_fp32) reduce-scattered into this rank's
 * block. */
hvd_result_t hvd__zero_reduce_async(hvd__zero_t *z, const hvd_tensor_t *g,
                                    int i, const char *name, double pre,
                                    double post, hvd_request_t **req);
/* After the reductions: the base update on the blocks (steps++), then
 * every parameter allgathered. */
hvd_result_t hvd__zero_apply(hvd__zero_t *z, hvd_optimizer_t *core);
int64_t hvd__zero_state_bytes(const hvd__zero_t *z);
/* For a save: parameter i's full state tensors on rank 0 only, and with
 * m >= 0 the whole master m (hvd__mixed_full's) (collective, every rank
 * for every parameter in the same order: each rank's blocks to rank 0,
 * nothing whole elsewhere); then released. */
hvd_result_t hvd__zero_root_param(hvd__zero_t *z, hvd_optimizer_t *core, int i,
                                  int m);
void hvd__zero_release_param(hvd__zero_t *z, hvd_optimizer_t *core, int i,
                             int m);
/* State tensor s's block on this rank: the whole tensor's elements
 * [*lo, *hi) are its elements from 0. */
hvd_tensor_t *hvd__zero_state_block(hvd__zero_t *z, int s, int64_t *lo,
                                    int64_t *hi);

/* Explicit gradient groups (grad_groups.c): the distributed optimizer's
 * num_groups and groups. create: *out NULL without groups; refuses what
 * groups cannot go with (sharding, PowerSGD, Adasum; compression with a
 * gradient that is not float32). of: parameter i's group, -1 none.
 * ready: member i of group k is ready this step; 1 when it was the last.
 * members: group k's parameters in order (*idx), their count. scratch:
 * arrays of n names, tensors and requests for a group's submission. */
typedef struct hvd__ggroups hvd__ggroups_t;

hvd_result_t hvd__ggroups_create(const char *fn,
                                 const hvd_distributed_options_t *o,
                                 const hvd_optimizer_t *base,
                                 hvd__ggroups_t **out);
void hvd__ggroups_free(hvd__ggroups_t *g);           /* accepts NULL */
int hvd__ggroups_of(const hvd__ggroups_t *g, int i); /* accepts NULL: -1 */
int hvd__ggroups_ready(hvd__ggroups_t *g, int k);
void hvd__ggroups_reset(hvd__ggroups_t *g); /* accepts NULL */
int hvd__ggroups_members(const hvd__ggroups_t *g, int k, const int **idx);
void hvd__ggroups_scratch(hvd__ggroups_t *g, const char ***names,
                          hvd_tensor_t **t, hvd_request_t ***reqs);

/* PowerSGD (powersgd.c): the distributed optimizer's compression
 * HVD_COMPRESS_POWERSGD. takes: parameter i is compressed at step count
 * steps. start: M = prescale g + e, P = M Q, P's allreduce submitted
 * (*req, waited for by the caller). finish, after every phase-1 request
 * was waited for: with keep, Q's allreduces, then each gradient replaced
 * by its approximation times postscale; without, the step's compressions
 * are dropped. */
typedef struct hvd__psgd hvd__psgd_t;

hvd_result_t hvd__psgd_create(const char *fn, const hvd_powersgd_options_t *o,
                              const hvd_optimizer_t *base, int reduce_fp32,
                              hvd__psgd_t **out);
void hvd__psgd_free(hvd__psgd_t *s); /* accepts NULL */
int hvd__psgd_takes(const hvd__psgd_t *s, int i, int64_t steps);
/* The values parameter i's reduction sends once compression is on:
 * r (n + m) when it is compressed, else numel. */
int64_t hvd__psgd_values(const hvd__psgd_t *s, int i, int64_t numel);
hvd_result_t hvd__psgd_start(hvd__psgd_t *s, int i, hvd_tensor_t *g,
                             double prescale, hvd_request_t **req);
hvd_result_t hvd__psgd_finish(hvd__psgd_t *s, int keep, double postscale);

/* PowerSGD's state in checkpoints (doc/checkpoint-format.md, its section):
 * per compressed parameter, the draws of Q so far, the warm start's Q^T
 * (r x m; NULL without one) and the ranks' mean error feedback (n x m;
 * NULL without error feedback or before the first compression). */
typedef struct hvd__psgd_record {
  const char *name;
  int64_t n, m;
  int r;
  uint64_t draws;
  const float *qt, *e;
} hvd__psgd_record_t;

/* Bytes of the state that outlives a step (e, Q), on this rank; 0 for
 * NULL. */
int64_t hvd__psgd_state_bytes(const hvd__psgd_t *s);
/* The distributed optimizer's PowerSGD, else NULL. */
hvd__psgd_t *hvd__optim_psgd(const hvd_optimizer_t *opt);
/* A save (collective, agreed): every record's data made on the host (e
 * averaged over the ranks), until release. record: parameter i's, 0 if it
 * is not compressed. */
hvd_result_t hvd__psgd_gather(hvd__psgd_t *s);
int hvd__psgd_record(const hvd__psgd_t *s, int i, hvd__psgd_record_t *rec);
void hvd__psgd_release(hvd__psgd_t *s); /* accepts NULL */
/* A load (every rank): reset makes every compressed parameter's state
 * fresh (zero e, no warm Q, no draws); find gives the compressed
 * parameter named name[0..len), else -1; load sets parameter i's from rec
 * (rec's n and m are its; a Q of another rank r is dropped). */
hvd_result_t hvd__psgd_reset(hvd__psgd_t *s, const char *who);
int hvd__psgd_find(const hvd__psgd_t *s, const char *name, size_t len);
hvd_result_t hvd__psgd_load(hvd__psgd_t *s, const char *who, int i,
                            const hvd__psgd_record_t *rec);
/* hvd_state's in-memory commits: this rank's state into *copy (to_live
 * 0; made at the first call) or back (1). */
typedef struct hvd__psgd_copy hvd__psgd_copy_t;
hvd_result_t hvd__psgd_keep(hvd__psgd_t *s, const char *who,
                            hvd__psgd_copy_t **copy, int to_live);
void hvd__psgd_copy_free(hvd__psgd_copy_t *c); /* accepts NULL */

/* Post-local SGD (local_sgd.c): every parameter of core (a mixed one's
 * master, its value rounded from it after) averaged over all ranks, in
 * place, device ones after the update on the optimizer's stream. */
hvd_result_t hvd__lsgd_average(hvd_optimizer_t *core);

/* 1 for a sharded optimizer, whose full state has no data (but on rank 0
 * during a save). */
int hvd__optim_sharded(const hvd_optimizer_t *opt);
/* For a save, parameter i's (its value's data: value) full state on rank
 * 0 only (a sharded optimizer's blocks sent to rank 0; collective, in
 * parameter order), and *master the whole master of a sharded
 * low-precision one (data on rank 0), else NULL; then dropped. No-ops
 * unless sharded. */
hvd_result_t hvd__optim_root_param(hvd_optimizer_t *opt, int i,
                                   const hvd_param_t *p, hvd_tensor_t **master);
void hvd__optim_drop_param(hvd_optimizer_t *opt, int i, const hvd_param_t *p);
/* Where this rank keeps the core's state tensor s: the whole tensor, or
 * a sharded optimizer's block, whose elements from 0 are the whole's
 * [*lo, *hi) (a load writes only those, without the full state). */
hvd_tensor_t *hvd__optim_state_target(hvd_optimizer_t *opt, int s, int64_t *lo,
                                      int64_t *hi);

/* ---- checkpoints with counters (hvd_state, state.c) -------------------- */

/* Named int64 progress counters: a checkpoint file's counters section
 * holds them, after the optimizer section (doc/checkpoint-format.md). */
typedef struct hvd__counters {
  int n;
  const char *const *names;
  int64_t *values;
} hvd__counters_t;

/* hvd_checkpoint_save / _load with counters (NULL or n 0: as those, an
 * empty section). Loading needs every counter of ctr in the file. */
hvd_result_t hvd__checkpoint_save_ex(const char *path,
                                     const hvd_param_t *params, int n,
                                     const hvd_optimizer_t *opt, int64_t step,
                                     const hvd__counters_t *ctr);
hvd_result_t hvd__checkpoint_load_ex(const char *path, hvd_param_t *params,
                                     int n, hvd_optimizer_t *opt, int64_t *step,
                                     hvd__counters_t *ctr);
/* hvd_checkpoint_save_async with counters, named fn in its messages, and
 * ended by hvd_checkpoint_wait, which a refused save names as
 * hvd_state_wait (hvd_state's background file commits). */
hvd_result_t hvd__checkpoint_save_async_ex(const char *fn, const char *path,
                                           const hvd_param_t *params, int n,
                                           const hvd_optimizer_t *opt,
                                           int64_t step,
                                           const hvd__counters_t *ctr,
                                           hvd_checkpoint_request_t **out);
/* hvd_checkpoint_wait on this rank alone (not collective): rank 0 waits
 * for its write; the result is this rank's (the others': HVD_SUCCESS). */
hvd_result_t hvd__checkpoint_wait_here(hvd_checkpoint_request_t *req);

/* ---- for the built-ins (sgd.c, adam.c, lamb.c) --------------------------- */

/* Who a built-in's step failures name. */
#define HVD__STEP_WHO "hvd_optimizer_step"

/* x in [lo, hi), or (lo, hi) when lo_open; NaN is never in range.
 * HVD_ERR_INVALID_ARG "<who>: <what> <x> is out of range [lo, hi)". */
hvd_result_t hvd__optim_check_range(const char *who, const char *what, double x,
                                    double lo, int lo_open, double hi);

/* The options Adam and LAMB share, each in its range as check_range says:
 * lr [0, inf), beta1 and beta2 [0, 1), eps (0, inf), weight_decay
 * [0, inf). */
hvd_result_t hvd__optim_check_adam_like(const char *who, double lr,
                                        double beta1, double beta2, double eps,
                                        double weight_decay);

/* First of every create: out must be there, and is NULL until success. */
hvd_result_t hvd__optim_check_out(const char *who, hvd_optimizer_t **out);

/* LAMB's scratch (lamb.c), made with it: n parameters' parts and totals
 * ([n][2]: sums of w^2 and u^2), and the device ones of a pass (their
 * spans, indices, and results). */
typedef struct hvd__optim_lamb {
  double *part, *total, *dev;
  hvd__odev_lamb_t *span;
  int *which;
} hvd__optim_lamb_t;

void hvd__optim_lamb_free(hvd__optim_lamb_t *l); /* accepts NULL */

/* A built-in's ctx: a copy of its options and the optimizer's device
 * context (NULL when every parameter is on the host), which the ops'
 * step cannot otherwise see. */
typedef struct hvd__optim_builtin {
  union {
    hvd_sgd_options_t sgd;
    hvd_adam_options_t adam;
    hvd_lamb_options_t lamb;
  } o;
  hvd__odev_t *odev;       /* the optimizer's; not owned */
  const int *sharded;      /* the optimizer's flag: its step sees blocks */
  hvd__optim_lamb_t *lamb; /* LAMB's scratch; NULL for the others */
  int n;                   /* the optimizer's parameters */
  const double *wd0;       /* the options' weight decay (in o; what
                              hvd_broadcast_optimizer_state may set) */
  double *wd;              /* n weight decays (NAN: the options'), or NULL when
                              hvd_optimizer_set_param_weight_decay set none */
  double *lrs;             /* n learning-rate scales (NAN: 1), or NULL when
                              hvd_optimizer_set_param_lr_scale set none */
  unsigned char *only;     /* with wd or lrs: 2 n flags, a group's device
                              update and the parameters already updated */
  /* the optimizer's step collectives' names (LAMB's norms when sharded) */
  const hvd__step_names_t *names;
} hvd__optim_builtin_t;

/* A built-in's ops.destroy: frees ctx and what it holds. */
void hvd__optim_builtin_free(void *ctx);
/* opt's (its core's) built-in context, or NULL for a custom optimizer. */
hvd__optim_builtin_t *hvd__optim_builtin(const hvd_optimizer_t *opt);

/* Parameter i's weight decay: its own, or the options' (dflt). */
static inline double hvd__optim_wd(const hvd__optim_builtin_t *b, int i,
                                   double dflt) {
  return b->wd != NULL && b->wd[i] == b->wd[i] ? b->wd[i] : dflt;
}

/* Parameter i's learning rate: lr times its scale (lr itself, the same
 * bits, without one). */
static inline double hvd__optim_lr(const hvd__optim_builtin_t *b, int i,
                                   double lr) {
  return b->lrs != NULL && b->lrs[i] == b->lrs[i] ? lr * b->lrs[i] : lr;
}

/* The built-in's device update (hvd__odev_update of kind on options, whose
 * weight decay *wd is set to each value in turn): one batched launch per
 * distinct pair of weight decay and learning rate among the device
 * parameters; one launch when every parameter has the options' and lr.
 * *wd is as it was on return. */
hvd_result_t hvd__optim_update_device(const hvd__optim_builtin_t *b, int kind,
                                      void *options, double *wd,
                                      const hvd_param_t *params, int n,
                                      const hvd_tensor_t *state, int nstate,
                                      int64_t step, double lr);

/* A built-in: ctx is a malloc'd hvd__optim_builtin_t holding a copy of
 * its options (size bytes; their weight decay at byte wd_offset), freed by
 * hvd__optim_builtin_free (the ops' destroy, whatever ops says), or here
 * on failure. */
hvd_result_t hvd__optim_create_builtin(const char *who, hvd_param_t *params,
                                       int n, const void *options, size_t size,
                                       const hvd_optimizer_ops_t *ops,
                                       double lr, size_t wd_offset,
                                       hvd_optimizer_t **out);

#endif /* HVD_OPTIM_OPTIMIZER_H */
