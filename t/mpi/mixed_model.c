/* mixed_model.c - the mixed-precision tests' model (mixed_model.h). */
#include "mixed_model.h"

#include <stdlib.h>

#include "hvdtest.h"
#include "tap/tap.h"

void model_make(model_t *m, hvd_dtype_t dt, int64_t n, double init) {
  m->dt = dt;
  m->w = hvdt_calloc((size_t)n, hvdt_size(dt));
  m->g = hvdt_calloc((size_t)n, hvdt_size(dt));
  for (int64_t i = 0; i < n; i++)
    hvdt_put(dt, m->w, i, init);
  m->p.name = "w";
  m->p.value = hvd_tensor_make(m->w, dt, 1, &n);
  m->p.grad = hvd_tensor_make(m->g, dt, 1, &n);
}

void model_free(model_t *m) {
  free(m->w);
  free(m->g);
}

hvd_optimizer_t *model_adamw(model_t *m, int reduce_fp32, int scaling,
                             int shard) {
  hvd_adam_options_t ao;
  hvd_distributed_options_t dopt;
  hvd_optimizer_t *base = NULL, *opt = NULL;
  hvd_adam_options_init(&ao);
  ao.lr = 0.02;
  ao.decoupled = 1;
  ao.weight_decay = 0.01;
  if (hvd_adam_create(&m->p, 1, &ao, &base) != HVD_SUCCESS)
    bail("hvd_adam_create: %s", hvd_last_error());
  hvd_distributed_options_init(&dopt);
  dopt.reduce_fp32 = reduce_fp32;
  dopt.shard_optimizer_state = shard;
  if (hvd_distributed_optimizer(base, &dopt, &opt) != HVD_SUCCESS)
    bail("hvd_distributed_optimizer: %s", hvd_last_error());
  if (scaling && hvd_optimizer_set_loss_scaling(opt, NULL) != HVD_SUCCESS)
    bail("hvd_optimizer_set_loss_scaling: %s", hvd_last_error());
  return opt;
}
