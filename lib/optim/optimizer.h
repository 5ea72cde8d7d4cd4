/*
 * optimizer.h - what the files of lib/optim share. An hvd_optimizer_t is
 * either a plain optimizer (params, ops, state) or a distributed wrapper
 * (dist != NULL) around a plain one (base), which holds params and state.
 */
#ifndef HVD_OPTIM_OPTIMIZER_H
#define HVD_OPTIM_OPTIMIZER_H

#include "internal.h"
#include "optim/device.h"

typedef struct hvd__dist hvd__dist_t; /* distributed.c */

struct hvd_optimizer {
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
  /* distributed wrapper */
  hvd_optimizer_t *base; /* owned */
  hvd__dist_t *dist;
};

/* Steps need new gradients: the message of both the plain and the
 * distributed step. */
#define HVD__NO_NEW_GRADS                                                      \
  "hvd_optimizer_step: no new gradients since the last step (call "            \
  "hvd_optimizer_zero_grad and run backward first)"

/* The plain optimizer that holds params and state (opt itself or its
 * base). */
hvd_optimizer_t *hvd__optim_core(hvd_optimizer_t *opt);
const hvd_optimizer_t *hvd__optim_core_const(const hvd_optimizer_t *opt);

/* One local update of a plain optimizer from its params' grads (steps++).
 * Used by the distributed wrapper after its reductions. */
hvd_result_t hvd__optim_apply(hvd_optimizer_t *core);

/* distributed.c: the wrapper's step, zero_grad, grad_ready, sync, destroy */
hvd_result_t hvd__dist_step(hvd_optimizer_t *opt);
hvd_result_t hvd__dist_zero_grad(hvd_optimizer_t *opt);
void hvd__dist_destroy(hvd__dist_t *d);

#endif /* HVD_OPTIM_OPTIMIZER_H */
