/*
 * psgd_model.h - the model that t/mpi/powersgd and t/mpi/powersgd_ckpt
 * train: float32 "w" 12 x 20, "b" [12], "s" 3 x 4 and "x" 4 x 5 x 6 (a
 * 4 x 30 matrix to PowerSGD); at rank 1 w and x are compressed, at rank
 * 2 w alone (r (n + m) * 2 < n m).
 */
#ifndef HVD_T_MPI_PSGD_MODEL_H
#define HVD_T_MPI_PSGD_MODEL_H

#include "hvd.h"

#define NP 4
extern const char *const psgd_names[NP];
extern const int psgd_ndims[NP];
extern const int64_t psgd_shapes[NP][3];

typedef struct model {
  float *w[NP], *g[NP];
  int64_t len[NP];
  hvd_param_t p[NP];
} model_t;

/* Every value `fill`, every gradient 0. */
void psgd_model_make(model_t *m, float fill);
void psgd_model_drop(model_t *m);

#endif
