/*
 * optim.c - the plain optimizers, one process, no hvd_init(): SGD (momentum,
 * nesterov, dampening, weight decay) and Adam/AdamW against torch.optim's
 * formulas recomputed here in double (relative tolerance 1e-6), a custom
 * ops table and its declared state, learning-rate changes, the "no new
 * gradients" rule, and every validation message. Reads the internal
 * struct (optim/optimizer.h) to check the state tensors.
 *
 * A device parameter is refused here in every build, each with its own
 * message: a build without CUDA (HVD_ERR_UNSUPPORTED), a CUDA build on a
 * machine without a GPU, and (on a GPU machine) an ordinal that is not the
 * current device; t/gpu/optim tests device parameters that work.
 */
#include <config.h>

#include "hvd.h"
#include "optim/optimizer.h"
#include "tap.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* GPUs this process sees (0 without CUDA, driver or device). */
static int cuda_devices(void) {
  int n = 0;
#ifdef HVD_HAVE_CUDA
  if (cudaGetDeviceCount(&n) != cudaSuccess)
    n = 0;
#endif
  return n;
}

#define TOL 1e-6 /* relative */
#define NE 9     /* elements of the model: w [2, 3] then b [3] */

/* A two-parameter model over flat arrays: w = val[0..6), b = val[6..9). */
typedef struct model {
  float val[NE], grad[NE];
  hvd_param_t p[2];
} model_t;

static const float val0[NE] = {1.0f, -0.5f, 2.0f,  0.75f, -1.25f,
                               1.5f, 0.25f, -2.0f, 0.5f};
/* Each gradient's sign is opposite to its value's: values move away from
 * zero, so the relative tolerance never meets a cancellation. */
static const float gbase[NE] = {-0.3f, 0.2f,   -0.5f, -0.1f, 0.4f,
                                -0.6f, -0.15f, 0.35f, -0.45f};

static void model_init(model_t *m) {
  static const int64_t ws[] = {2, 3}, bs[] = {3};
  memcpy(m->val, val0, sizeof m->val);
  memset(m->grad, 0, sizeof m->grad);
  m->p[0] = (hvd_param_t){"w", hvd_tensor_make(m->val, HVD_FLOAT32, 2, ws),
                          hvd_tensor_make(m->grad, HVD_FLOAT32, 2, ws)};
  m->p[1] = (hvd_param_t){"b", hvd_tensor_make(m->val + 6, HVD_FLOAT32, 1, bs),
                          hvd_tensor_make(m->grad + 6, HVD_FLOAT32, 1, bs)};
}

/* A backward pass of step t: adds into the gradients. */
static void backward(model_t *m, int t) {
  for (int e = 0; e < NE; e++)
    m->grad[e] += gbase[e] * (1.0f + 0.25f * (float)t);
}

/* State tensor k of every parameter, flattened like val. */
static const float *state_flat(const hvd_optimizer_t *opt, int k) {
  static float flat[NE];
  const int nstate = opt->ops.nstate;
  memcpy(flat, opt->state[k].data, 6 * sizeof(float));
  memcpy(flat + 6, opt->state[nstate + k].data, 3 * sizeof(float));
  return flat;
}

/* Every element of got within TOL (relative) of want. */
TAP_PRINTF(3, 4)
static int close_all(const double *want, const float *got, const char *fmt,
                     ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  for (int e = 0; e < NE; e++)
    if (fabs(want[e] - got[e]) > TOL * fabs(want[e])) {
      tap_note("element %d: expected %.9g, got %.9g", e, want[e], got[e]);
      return ok(0, "%s", what);
    }
  return ok(1, "%s", what);
}

/* With zero gradients, weight decay alone must still move every value
 * away from val0. */
static void all_moved(const model_t *m, const char *label) {
  int moved = 1;
  for (int e = 0; e < NE; e++)
    moved &= m->val[e] != val0[e];
  ok(moved, "%s: zero gradients with weight decay still move every value",
     label);
}

/* ---- SGD ---------------------------------------------------------------- */

/* Runs nsteps of zero_grad / backward / step (no backward when zero_grads)
 * against torch.optim.SGD in double; at step lr_at the lr becomes new_lr. */
static void run_sgd(const char *label, const hvd_sgd_options_t *o, int nsteps,
                    int lr_at, double new_lr, int zero_grads) {
  model_t m;
  hvd_optimizer_t *opt = NULL;
  double v[NE], buf[NE], lr = o->lr;
  model_init(&m);
  for (int e = 0; e < NE; e++)
    v[e] = val0[e];
  if (!is_int(HVD_SUCCESS, hvd_sgd_create(m.p, 2, o, &opt), "%s: create",
              label))
    return;
  is_string("SGD", opt->ops.name, "%s: ops name", label);
  is_int(o->momentum != 0, opt->ops.nstate, "%s: state tensors", label);
  if (o->momentum != 0) {
    is_string("momentum_buffer", opt->ops.state_names[0], "%s: state name",
              label);
    ok(opt->state[0].ndim == 2 && opt->state[0].shape[0] == 2 &&
           opt->state[0].shape[1] == 3 && opt->state[1].ndim == 1 &&
           opt->state[1].shape[0] == 3 && opt->state[0].dtype == HVD_FLOAT32,
       "%s: state shaped like the values", label);
  } else {
    ok(opt->state == NULL, "%s: no state", label);
  }
  for (int t = 1; t <= nsteps; t++) {
    if (t == lr_at) {
      is_int(HVD_SUCCESS, hvd_optimizer_set_lr(opt, new_lr), "%s: set_lr(%g)",
             label, new_lr);
      lr = new_lr;
    }
    is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "%s: zero_grad %d", label,
           t);
    if (!zero_grads)
      backward(&m, t);
    for (int e = 0; e < NE; e++) {
      double d = m.grad[e];
      if (o->weight_decay != 0)
        d += o->weight_decay * v[e];
      if (o->momentum != 0) {
        buf[e] = t == 1 ? d : o->momentum * buf[e] + (1 - o->dampening) * d;
        d = o->nesterov ? d + o->momentum * buf[e] : buf[e];
      }
      v[e] -= lr * d;
    }
    is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "%s: step %d", label, t);
    close_all(v, m.val, "%s: values after step %d", label, t);
    if (o->momentum != 0)
      close_all(buf, state_flat(opt, 0), "%s: momentum_buffer after step %d",
                label, t);
  }
  is_int(nsteps, hvd_optimizer_steps(opt), "%s: steps", label);
  is_double(lr, hvd_optimizer_lr(opt), 0, "%s: lr", label);
  if (zero_grads)
    all_moved(&m, label);
  hvd_optimizer_destroy(opt);
}

static void test_sgd(void) {
  hvd_sgd_options_t o;
  hvd_sgd_options_init(&o);
  is_double(0.01, o.lr, 0, "SGD default lr");
  ok(o.momentum == 0 && o.dampening == 0 && o.weight_decay == 0 &&
         o.nesterov == 0,
     "SGD defaults: no momentum, dampening, weight decay, nesterov");
  hvd_sgd_options_init(NULL);

  o.lr = 0.1;
  run_sgd("sgd", &o, 2, 0, 0, 0);
  o.momentum = 0.9;
  run_sgd("sgd momentum", &o, 3, 0, 0, 0);
  o.nesterov = 1;
  run_sgd("sgd nesterov", &o, 3, 0, 0, 0);
  o.nesterov = 0;
  o.dampening = 0.5; /* not applied on the first step */
  run_sgd("sgd dampening", &o, 3, 0, 0, 0);
  hvd_sgd_options_init(&o);
  o.lr = 0.1;
  o.weight_decay = 0.01;
  run_sgd("sgd weight decay", &o, 3, 0, 0, 0);
  o.momentum = 0.5;
  run_sgd("sgd momentum weight decay", &o, 3, 0, 0, 0);
  run_sgd("sgd zero grads weight decay", &o, 2, 0, 0, 1);
  run_sgd("sgd set_lr", &o, 3, 3, 0.5, 0);
}

/* ---- Adam and AdamW ------------------------------------------------------ */

static void run_adam(const char *label, const hvd_adam_options_t *o, int nsteps,
                     int lr_at, double new_lr, int zero_grads) {
  model_t m;
  hvd_optimizer_t *opt = NULL;
  double v[NE], ma[NE] = {0}, sa[NE] = {0}, lr = o->lr;
  model_init(&m);
  for (int e = 0; e < NE; e++)
    v[e] = val0[e];
  if (!is_int(HVD_SUCCESS, hvd_adam_create(m.p, 2, o, &opt), "%s: create",
              label))
    return;
  is_string(o->decoupled ? "AdamW" : "Adam", opt->ops.name, "%s: ops name",
            label);
  is_int(2, opt->ops.nstate, "%s: two state tensors", label);
  is_string("exp_avg", opt->ops.state_names[0], "%s: state 0 name", label);
  is_string("exp_avg_sq", opt->ops.state_names[1], "%s: state 1 name", label);
  ok(opt->state[3].ndim == 1 && opt->state[3].shape[0] == 3 &&
         opt->state[2].ndim == 1 && opt->state[1].ndim == 2 &&
         opt->state[1].shape[1] == 3,
     "%s: state shaped like the values", label);
  for (int t = 1; t <= nsteps; t++) {
    if (t == lr_at) {
      is_int(HVD_SUCCESS, hvd_optimizer_set_lr(opt, new_lr), "%s: set_lr(%g)",
             label, new_lr);
      lr = new_lr;
    }
    is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "%s: zero_grad %d", label,
           t);
    if (!zero_grads)
      backward(&m, t);
    double bc1 = 1 - pow(o->beta1, t), bc2 = 1 - pow(o->beta2, t);
    for (int e = 0; e < NE; e++) {
      double g = m.grad[e];
      if (o->decoupled)
        v[e] *= 1 - lr * o->weight_decay;
      else
        g += o->weight_decay * v[e];
      ma[e] = o->beta1 * ma[e] + (1 - o->beta1) * g;
      sa[e] = o->beta2 * sa[e] + (1 - o->beta2) * g * g;
      v[e] -= lr / bc1 * ma[e] / (sqrt(sa[e]) / sqrt(bc2) + o->eps);
    }
    is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "%s: step %d", label, t);
    close_all(v, m.val, "%s: values after step %d", label, t);
    close_all(ma, state_flat(opt, 0), "%s: exp_avg after step %d", label, t);
    close_all(sa, state_flat(opt, 1), "%s: exp_avg_sq after step %d", label, t);
  }
  is_int(nsteps, hvd_optimizer_steps(opt), "%s: steps", label);
  if (zero_grads)
    all_moved(&m, label);
  hvd_optimizer_destroy(opt);
}

static void test_adam(void) {
  hvd_adam_options_t o;
  hvd_adam_options_init(&o);
  ok(o.lr == 0.001 && o.beta1 == 0.9 && o.beta2 == 0.999 && o.eps == 1e-8 &&
         o.weight_decay == 0 && o.decoupled == 0,
     "Adam defaults: lr 0.001, betas 0.9/0.999, eps 1e-8, no weight decay");
  hvd_adam_options_init(NULL);

  o.lr = 0.01;
  run_adam("adam", &o, 3, 0, 0, 0);
  o.weight_decay = 0.01;
  run_adam("adam weight decay", &o, 3, 0, 0, 0);
  run_adam("adam zero grads weight decay", &o, 2, 0, 0, 1);
  o.decoupled = 1;
  o.weight_decay = 0.1;
  o.lr = 0.05;
  run_adam("adamw", &o, 3, 0, 0, 0);
  run_adam("adamw set_lr", &o, 3, 3, 0.2, 0);
  run_adam("adamw zero grads weight decay", &o, 2, 0, 0, 1);
  o.beta1 = 0;
  o.beta2 = 0.5;
  o.eps = 0.1;
  run_adam("adamw beta1 0", &o, 3, 2, 0.01, 0);
}

/* Non-finite values as torch.optim: without L2 decay (AdamW, or Adam with
 * weight_decay 0) the gradient is used as it is, so an infinite value
 * stays infinite and its state finite (g + 0 * v would make them NaN);
 * with L2 decay g + wd * v is infinite. The device kernel does the same
 * (t/gpu/kernels compares them on such values). */
static void test_adam_nonfinite(void) {
  static const int64_t shape[] = {3};
  float val[3], grad[3];
  hvd_param_t p = {"x", hvd_tensor_make(val, HVD_FLOAT32, 1, shape),
                   hvd_tensor_make(grad, HVD_FLOAT32, 1, shape)};
  hvd_adam_options_t o;
  for (int c = 0; c < 3; c++) {
    hvd_optimizer_t *opt = NULL;
    const char *label = c == 0 ? "adam" : c == 1 ? "adamw" : "adam l2";
    hvd_adam_options_init(&o);
    o.decoupled = c == 1;
    o.weight_decay = c == 0 ? 0 : 0.01;
    val[0] = INFINITY;
    val[1] = -INFINITY;
    val[2] = 1.0f;
    grad[0] = grad[1] = 0.5f;
    grad[2] = INFINITY;
    if (!is_int(HVD_SUCCESS, hvd_adam_create(&p, 1, &o, &opt),
                "%s non-finite: create", label))
      continue;
    is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "%s non-finite: step", label);
    const float *m = opt->state[0].data, *sq = opt->state[1].data;
    if (c < 2)
      ok(val[0] == INFINITY && val[1] == -INFINITY && isfinite(m[0]) &&
             isfinite(sq[0]) && isfinite(m[1]) && isfinite(sq[1]),
         "%s non-finite: infinite values stay infinite, state finite", label);
    else
      ok(isnan(val[0]) && isnan(val[1]) && m[0] == INFINITY &&
             m[1] == -INFINITY && sq[0] == INFINITY,
         "%s non-finite: L2 decay makes the gradient of an infinite value "
         "infinite (value NaN)",
         label);
    ok(isnan(val[2]) && m[2] == INFINITY && sq[2] == INFINITY,
       "%s non-finite: an infinite gradient: state infinite, value NaN", label);
    hvd_optimizer_destroy(opt);
  }
}

/* ---- learning rate, fresh gradients, NULL ------------------------------ */

static void test_lr_and_fresh(void) {
  model_t m;
  hvd_optimizer_t *opt = NULL;
  hvd_sgd_options_t o;
  hvd_sgd_options_init(&o);
  model_init(&m);
  is_int(HVD_SUCCESS, hvd_sgd_create(m.p, 2, &o, &opt), "create");
  is_double(0.01, hvd_optimizer_lr(opt), 0, "lr from the options");
  is_int(0, hvd_optimizer_steps(opt), "no steps yet");

  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_set_lr(opt, -0.5), "set_lr(-0.5)");
  is_string("hvd_optimizer_set_lr: lr -0.5 is out of range [0, inf)",
            hvd_last_error(), "set_lr(-0.5): message");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_set_lr(opt, NAN), "set_lr(NaN)");
  is_string("hvd_optimizer_set_lr: lr nan is out of range [0, inf)",
            hvd_last_error(), "set_lr(NaN): message");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_set_lr(opt, INFINITY),
         "set_lr(inf)");
  is_double(0.01, hvd_optimizer_lr(opt), 0, "a refused lr changes nothing");
  is_int(HVD_SUCCESS, hvd_optimizer_set_lr(opt, 0), "set_lr(0)");
  is_double(0, hvd_optimizer_lr(opt), 0, "lr 0");
  is_int(HVD_SUCCESS, hvd_optimizer_set_lr(opt, 1), "set_lr(1)");

  /* The first step needs no zero_grad: nothing was stepped yet. */
  backward(&m, 1);
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "first step without zero_grad");
  float after[NE];
  memcpy(after, m.val, sizeof after);
  backward(&m, 2); /* accumulates, but no zero_grad since the step */
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_step(opt), "step again");
  is_string("hvd_optimizer_step: no new gradients since the last step (call "
            "hvd_optimizer_zero_grad and run backward first)",
            hvd_last_error(), "step again: message");
  ok(memcmp(after, m.val, sizeof after) == 0, "step again: values untouched");
  is_int(1, hvd_optimizer_steps(opt), "step again: not counted");
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "zero_grad");
  int zero = 1;
  for (int e = 0; e < NE; e++)
    zero &= m.grad[e] == 0.0f;
  ok(zero, "zero_grad zeroes every gradient");
  backward(&m, 2);
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "step after zero_grad");
  is_int(2, hvd_optimizer_steps(opt), "two steps");
  hvd_optimizer_destroy(opt);

  hvd_optimizer_destroy(NULL);
  ok(1, "hvd_optimizer_destroy(NULL) returns");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_step(NULL), "step(NULL)");
  is_string("hvd_optimizer_step: opt is NULL", hvd_last_error(),
            "step(NULL): message");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_zero_grad(NULL), "zero_grad(NULL)");
  is_string("hvd_optimizer_zero_grad: opt is NULL", hvd_last_error(),
            "zero_grad(NULL): message");
  is_int(HVD_ERR_INVALID_ARG, hvd_optimizer_set_lr(NULL, 0.1), "set_lr(NULL)");
  is_string("hvd_optimizer_set_lr: opt is NULL", hvd_last_error(),
            "set_lr(NULL): message");
  ok(isnan(hvd_optimizer_lr(NULL)), "lr(NULL) is NaN");
  is_int(-1, hvd_optimizer_steps(NULL), "steps(NULL) is -1");
}

/* ---- a custom optimizer ------------------------------------------------- */

/* signSGD with momentum: buf = 0.9 * buf + g; v -= lr * sign(buf). */
typedef struct sign_ctx {
  int calls, destroyed, state_ok;
  int64_t step;
  double lr;
  hvd_param_t *params;
  hvd_tensor_t *state;
  int n;
  hvd_result_t fail; /* returned (without a message) when set */
} sign_ctx_t;

static hvd_result_t sign_step(void *vctx, hvd_param_t *params, int n,
                              hvd_tensor_t *state, int64_t step, double lr) {
  sign_ctx_t *c = vctx;
  c->calls++;
  c->step = step;
  c->lr = lr;
  c->params = params;
  c->state = state;
  c->n = n;
  if (c->fail != HVD_SUCCESS)
    return c->fail;
  for (int i = 0; i < n; i++) {
    const hvd_tensor_t *v = &params[i].value, *s = &state[i];
    int64_t len = hvd_tensor_numel(v);
    float *buf = s->data, *val = v->data;
    const float *g = params[i].grad.data;
    c->state_ok &= s->dtype == HVD_FLOAT32 && s->device == HVD_CPU &&
                   s->ndim == v->ndim &&
                   memcmp(s->shape, v->shape, sizeof s->shape) == 0;
    for (int64_t j = 0; j < len; j++) {
      if (step == 1)
        c->state_ok &= buf[j] == 0.0f;
      buf[j] = 0.9f * buf[j] + g[j];
      val[j] -= (float)lr * (buf[j] > 0 ? 1.0f : buf[j] < 0 ? -1.0f : 0.0f);
    }
  }
  return HVD_SUCCESS;
}

static void sign_destroy(void *vctx) { ((sign_ctx_t *)vctx)->destroyed++; }

static void test_custom(void) {
  static const char *const names[] = {"sign_momentum"};
  const hvd_optimizer_ops_t ops = {"signSGD", 1, names, sign_step,
                                   sign_destroy};
  sign_ctx_t c = {.state_ok = 1};
  model_t m;
  hvd_optimizer_t *opt = NULL;
  double v[NE], buf[NE] = {0};
  model_init(&m);
  for (int e = 0; e < NE; e++)
    v[e] = val0[e];
  is_int(HVD_SUCCESS, hvd_optimizer_custom(m.p, 2, &ops, &c, &opt),
         "custom: create");
  is_string("signSGD", opt->ops.name, "custom: ops copied");
  is_int(1, opt->ops.nstate, "custom: one state tensor per parameter");
  is_string("sign_momentum", opt->ops.state_names[0], "custom: state name");
  is_double(0, hvd_optimizer_lr(opt), 0, "custom: lr starts at 0");

  const double lrs[] = {0.5, 0.25, 0.125};
  for (int t = 1; t <= 3; t++) {
    is_int(HVD_SUCCESS, hvd_optimizer_set_lr(opt, lrs[t - 1]),
           "custom: set_lr %d", t);
    is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "custom: zero_grad %d",
           t);
    backward(&m, t);
    for (int e = 0; e < NE; e++) {
      buf[e] = 0.9 * buf[e] + m.grad[e];
      v[e] -= lrs[t - 1] * (buf[e] > 0 ? 1 : -1);
    }
    is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "custom: step %d", t);
    is_int(t, c.step, "custom: step() got step %d", t);
    is_double(lrs[t - 1], c.lr, 0, "custom: step() got lr %g", lrs[t - 1]);
    close_all(v, m.val, "custom: values after step %d", t);
    close_all(buf, state_flat(opt, 0), "custom: state after step %d", t);
  }
  ok(c.params == m.p && c.n == 2, "custom: step() got the borrowed params");
  ok(c.state == opt->state, "custom: step() got hvd's state array");
  ok(c.state_ok, "custom: state float32 host, value-shaped, zero at first");

  /* A failing step: not counted, and may be retried. */
  c.fail = HVD_ERR_IO;
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "custom: zero_grad");
  is_int(HVD_ERR_IO, hvd_optimizer_step(opt), "custom: failing step");
  is_string("hvd_optimizer_step: optimizer 'signSGD' step failed: file "
            "input/output failed",
            hvd_last_error(), "custom: failing step: message");
  is_int(3, hvd_optimizer_steps(opt), "custom: a failed step is not counted");
  c.fail = HVD_SUCCESS;
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "custom: retried step");
  is_int(4, c.step, "custom: the retried step is step 4 again");
  is_int(4, hvd_optimizer_steps(opt), "custom: 4 steps");
  is_int(0, c.destroyed, "custom: destroy not called yet");
  hvd_optimizer_destroy(opt);
  is_int(1, c.destroyed, "custom: destroy(ctx) called once");

  /* No parameters, no state, no destroy. */
  const hvd_optimizer_ops_t bare = {NULL, 0, NULL, sign_step, NULL};
  memset(&c, 0, sizeof c);
  is_int(HVD_SUCCESS, hvd_optimizer_custom(NULL, 0, &bare, &c, &opt),
         "custom: empty");
  ok(opt->state == NULL, "custom: empty: no state");
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "custom: empty: step");
  ok(c.calls == 1 && c.n == 0 && c.step == 1, "custom: empty: step() ran");
  is_int(HVD_SUCCESS, hvd_optimizer_zero_grad(opt), "custom: empty: zero_grad");
  hvd_optimizer_destroy(opt);

  /* An empty parameter: NULL data is fine, its state still has data. */
  const int64_t zero[] = {0};
  hvd_param_t e = {"e", hvd_tensor_make(NULL, HVD_FLOAT32, 1, zero),
                   hvd_tensor_make(NULL, HVD_FLOAT32, 1, zero)};
  is_int(HVD_SUCCESS, hvd_optimizer_custom(&e, 1, &ops, &c, &opt),
         "custom: a parameter of shape [0]");
  ok(opt->state[0].data != NULL && opt->state[0].shape[0] == 0,
     "custom: its state is [0] with data");
  is_int(HVD_SUCCESS, hvd_optimizer_step(opt), "custom: [0]: step");
  hvd_optimizer_destroy(opt);
}

/* ---- validation ---------------------------------------------------------- */

static hvd_optimizer_t *const SENTINEL = (hvd_optimizer_t *)&SENTINEL;

/* rc and the message; *out set to NULL. */
static void refused(hvd_result_t want_rc, hvd_result_t rc,
                    hvd_optimizer_t *const *out, const char *want) {
  is_int(want_rc, rc, "refused: %s", want);
  is_string(want, hvd_last_error(), "message: %s", want);
  ok(*out == NULL, "no optimizer: %s", want);
}

#define SGD(params, n, o) (opt = SENTINEL, hvd_sgd_create(params, n, o, &opt))
#define ADAM(params, n, o) (opt = SENTINEL, hvd_adam_create(params, n, o, &opt))
#define CUSTOM(params, n, ops)                                                 \
  (opt = SENTINEL, hvd_optimizer_custom(params, n, ops, &c, &opt))
#define INVALID HVD_ERR_INVALID_ARG

static void test_validation(void) {
  static const char *const names[] = {"a", "b"}, *const dup[] = {"a", "a"},
                           *const empty[] = {"a", ""};
  const hvd_optimizer_ops_t good = {"x", 2, names, sign_step, sign_destroy};
  hvd_optimizer_ops_t ops;
  sign_ctx_t c = {0};
  hvd_optimizer_t *opt;
  model_t m;
  hvd_sgd_options_t so;
  hvd_adam_options_t ao;
  model_init(&m);

  /* SGD options */
  hvd_sgd_options_init(&so);
  refused(INVALID, SGD(m.p, 2, NULL), &opt, "hvd_sgd_create: options are NULL");
  is_int(INVALID, hvd_sgd_create(m.p, 2, &so, NULL), "out NULL");
  is_string("hvd_sgd_create: out is NULL", hvd_last_error(), "out NULL msg");
  so.lr = -0.1;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: lr -0.1 is out of range [0, inf)");
  so.lr = NAN;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: lr nan is out of range [0, inf)");
  so.lr = INFINITY;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: lr inf is out of range [0, inf)");
  hvd_sgd_options_init(&so);
  so.momentum = -0.5;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: momentum -0.5 is out of range [0, inf)");
  hvd_sgd_options_init(&so);
  so.dampening = NAN;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: dampening nan is out of range (-inf, inf)");
  hvd_sgd_options_init(&so);
  so.weight_decay = -1;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: weight_decay -1 is out of range [0, inf)");
  hvd_sgd_options_init(&so);
  so.nesterov = 1;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: nesterov needs momentum > 0 and dampening 0 "
          "(momentum 0, dampening 0)");
  so.momentum = 0.9;
  so.dampening = 0.1;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: nesterov needs momentum > 0 and dampening 0 "
          "(momentum 0.9, dampening 0.1)");
  hvd_sgd_options_init(&so);

  /* Adam options */
  hvd_adam_options_init(&ao);
  refused(INVALID, ADAM(m.p, 2, NULL), &opt,
          "hvd_adam_create: options are NULL");
  ao.lr = -1;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: lr -1 is out of range [0, inf)");
  hvd_adam_options_init(&ao);
  ao.beta1 = 1;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: beta1 1 is out of range [0, 1)");
  ao.beta1 = -0.1;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: beta1 -0.1 is out of range [0, 1)");
  hvd_adam_options_init(&ao);
  ao.beta2 = 1.5;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: beta2 1.5 is out of range [0, 1)");
  hvd_adam_options_init(&ao);
  ao.eps = 0;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: eps 0 is out of range (0, inf)");
  hvd_adam_options_init(&ao);
  ao.weight_decay = -0.01;
  ao.decoupled = 1;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: weight_decay -0.01 is out of range [0, inf)");
  hvd_adam_options_init(&ao);

  /* ops */
  is_int(INVALID, hvd_optimizer_custom(m.p, 2, &good, &c, NULL), "out NULL");
  is_string("hvd_optimizer_custom: out is NULL", hvd_last_error(),
            "out NULL msg");
  refused(INVALID, CUSTOM(m.p, 2, NULL), &opt,
          "hvd_optimizer_custom: ops is NULL");
  ops = good;
  ops.step = NULL;
  refused(INVALID, CUSTOM(m.p, 2, &ops), &opt,
          "hvd_optimizer_custom: ops->step is NULL");
  ops = good;
  ops.nstate = -1;
  refused(INVALID, CUSTOM(m.p, 2, &ops), &opt,
          "hvd_optimizer_custom: ops->nstate is negative (-1)");
  ops = good;
  ops.state_names = NULL;
  refused(INVALID, CUSTOM(m.p, 2, &ops), &opt,
          "hvd_optimizer_custom: ops->state_names is NULL (nstate 2)");
  ops.state_names = empty;
  refused(INVALID, CUSTOM(m.p, 2, &ops), &opt,
          "hvd_optimizer_custom: ops->state_names[1] is NULL or empty");
  ops.state_names = dup;
  refused(INVALID, CUSTOM(m.p, 2, &ops), &opt,
          "hvd_optimizer_custom: ops->state_names[1] 'a' repeats "
          "ops->state_names[0]");

  /* params */
  refused(INVALID, CUSTOM(m.p, -1, &good), &opt,
          "hvd_optimizer_custom: n is negative (-1)");
  refused(INVALID, CUSTOM(NULL, 2, &good), &opt,
          "hvd_optimizer_custom: params is NULL (n 2)");
  m.p[1].name = NULL;
  refused(INVALID, CUSTOM(m.p, 2, &good), &opt,
          "hvd_optimizer_custom: params[1] name is NULL or empty");
  m.p[1].name = "";
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: params[1] name is NULL or empty");
  m.p[1].name = "w";
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: params[1] name 'w' repeats params[0]");
  model_init(&m);
  m.p[0].value.dtype = HVD_INT32;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' value is int32, not float32, float16 or "
          "bfloat16");
  model_init(&m);
  m.p[1].grad.dtype = HVD_FLOAT64;
  refused(INVALID, CUSTOM(m.p, 2, &good), &opt,
          "hvd_optimizer_custom: param 'b' grad is float64, not float32, "
          "float16 or bfloat16");
  model_init(&m);
  m.p[0].value.device = -2;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' value device -2 is neither HVD_CPU nor "
          "a CUDA ordinal");
  model_init(&m);
  if (!hvd_cuda_built()) {
    m.p[0].value.device = 0;
    refused(HVD_ERR_UNSUPPORTED, SGD(m.p, 2, &so), &opt,
            "hvd_sgd_create: param 'w' value is on cuda:0 but this build has "
            "no CUDA");
    model_init(&m);
    m.p[1].grad.device = 0;
    refused(HVD_ERR_UNSUPPORTED, ADAM(m.p, 2, &ao), &opt,
            "hvd_adam_create: param 'b' grad is on cuda:0 but this build has "
            "no CUDA");
  } else if (cuda_devices() == 0) {
    m.p[0].value.device = 0;
    refused(INVALID, SGD(m.p, 2, &so), &opt,
            "hvd_sgd_create: param 'w' value is on cuda:0 but this rank has "
            "no CUDA device");
    model_init(&m);
    m.p[1].grad.device = 0;
    refused(INVALID, ADAM(m.p, 2, &ao), &opt,
            "hvd_adam_create: param 'b' grad is on cuda:0 but this rank has "
            "no CUDA device");
  } else { /* no hvd_init, no cudaSetDevice: this thread is on cuda:0 */
    m.p[0].value.device = 1000;
    refused(INVALID, SGD(m.p, 2, &so), &opt,
            "hvd_sgd_create: param 'w' value is on cuda:1000 but this rank "
            "uses cuda:0");
    model_init(&m);
    m.p[1].grad.device = 0; /* a GPU, but the value is on the host */
    refused(INVALID, ADAM(m.p, 2, &ao), &opt,
            "hvd_adam_create: param 'b' grad is on cuda:0 but value is on "
            "cpu");
  }
  model_init(&m);
  m.p[0].value.ndim = 9;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' value ndim 9 is out of range 0..8");
  model_init(&m);
  m.p[0].grad.shape[1] = -3;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' grad shape [2, -3] has a negative "
          "dimension");
  model_init(&m);
  m.p[1].value.data = NULL;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'b' value data is NULL");
  model_init(&m);
  m.p[1].grad.data = NULL;
  refused(INVALID, ADAM(m.p, 2, &ao), &opt,
          "hvd_adam_create: param 'b' grad data is NULL");
  model_init(&m);
  m.p[0].grad.shape[0] = 3;
  m.p[0].grad.shape[1] = 2;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' grad shape [3, 2] differs from value "
          "shape [2, 3]");
  model_init(&m);
  m.p[1].grad.ndim = 2;
  m.p[1].grad.shape[1] = 1;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'b' grad shape [3, 1] differs from value "
          "shape [3]");
  /* a shape whose bytes wrap (2^32 * 2^32 elements: 0 once) */
  model_init(&m);
  m.p[0].value.shape[0] = m.p[0].grad.shape[0] = (int64_t)1 << 32;
  m.p[0].value.shape[1] = m.p[0].grad.shape[1] = (int64_t)1 << 32;
  refused(INVALID, SGD(m.p, 2, &so), &opt,
          "hvd_sgd_create: param 'w' value shape [4294967296, 4294967296] of "
          "float32 is more than PTRDIFF_MAX bytes");
  is_int(0, c.destroyed, "a refused custom optimizer leaves ctx alone");
  ok(memcmp(m.val, val0, sizeof m.val) == 0, "no value was touched");
}

int main(void) {
  test_sgd();
  test_adam();
  test_adam_nonfinite();
  test_lr_and_fresh();
  test_custom();
  test_validation();
  done_testing();
  return tap_exit_status();
}
