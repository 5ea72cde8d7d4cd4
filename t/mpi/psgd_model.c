/* psgd_model.c - see psgd_model.h. */
#include "psgd_model.h"

#include <stdlib.h>

#include "hvdtest.h"

const char *const psgd_names[NP] = {"w", "b", "s", "x"};
const int psgd_ndims[NP] = {2, 1, 2, 3};
const int64_t psgd_shapes[NP][3] = {{12, 20}, {12}, {3, 4}, {4, 5, 6}};

void psgd_model_make(model_t *m, float fill) {
  for (int k = 0; k < NP; k++) {
    m->len[k] = 1;
    for (int d = 0; d < psgd_ndims[k]; d++)
      m->len[k] *= psgd_shapes[k][d];
    m->w[k] = hvdt_calloc((size_t)m->len[k], sizeof(float));
    m->g[k] = hvdt_calloc((size_t)m->len[k], sizeof(float));
    for (int64_t i = 0; i < m->len[k]; i++)
      m->w[k][i] = fill;
    m->p[k].name = psgd_names[k];
    m->p[k].value =
        hvd_tensor_make(m->w[k], HVD_FLOAT32, psgd_ndims[k], psgd_shapes[k]);
    m->p[k].grad =
        hvd_tensor_make(m->g[k], HVD_FLOAT32, psgd_ndims[k], psgd_shapes[k]);
  }
}

void psgd_model_drop(model_t *m) {
  for (int k = 0; k < NP; k++) {
    free(m->w[k]);
    free(m->g[k]);
  }
}
