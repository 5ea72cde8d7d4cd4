/*
 * mixed_model.h - the one-parameter model of the mixed-precision tests
 * (t/mpi/mixed.c, t/mpi/mixed_shard.c): a parameter "w" of n elements of
 * dtype dt with its grad, and the distributed AdamW (lr 0.02, weight
 * decay 0.01, decoupled) both tests train it with.
 */
#ifndef HVD_TEST_MIXED_MODEL_H
#define HVD_TEST_MIXED_MODEL_H

#include <stdint.h>

#include "hvd.h"

typedef struct model {
  hvd_dtype_t dt;
  void *w, *g; /* n elements each, calloc'd */
  hvd_param_t p;
} model_t;

/* w filled with init (rounded to dt), g zero; bails when out of memory. */
void model_make(model_t *m, hvd_dtype_t dt, int64_t n, double init);
void model_free(model_t *m);
/* A distributed AdamW over m->p (shard: ZeRO-1; scaling: the default loss
 * scaling); bails on failure. Destroy it with hvd_optimizer_destroy. */
hvd_optimizer_t *model_adamw(model_t *m, int reduce_fp32, int scaling,
                             int shard);

#endif
