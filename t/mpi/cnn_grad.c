/*
 * cnn_grad.c - examples/cnn's backward pass against central differences,
 * layer by layer (every parameter: the convolutions, the three batch
 * norms, the classifier), at several world sizes.
 *
 * Rank r holds 2 + r images. The loss checked is the sum of the ranks'
 * losses; a parameter is nudged alike on every rank, so that with
 * synchronized batch norm each rank's images change every rank's loss.
 * The ranks' gradients, summed, must equal that derivative: the classifier
 * and batch-norm parameters' from each rank's own loss, the convolutions'
 * also through the other ranks' (the cross-rank terms of sync batch
 * norm's backward). With per-rank batch norm (cnn_set_sync_bn(m, 0)) the
 * same holds with no coupling. The model runs in float32, so the
 * differences use h = 1e-3 and a tolerance of 2e-3 + 3 % of the value.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cnn.h"
#include "hvd.h"
#include "tap/tap.h"

#define WIDTH 4
#define PROBES 6 /* coordinates checked per parameter */

static int rank, size, nimg;
static float *x;
static int32_t *labels;

/* The sum over the ranks of their losses (collective). */
static double total_loss(cnn_t *m) {
  double loss, all;
  int correct;
  if (cnn_forward(m, x, nimg, labels, &loss, &correct) != HVD_SUCCESS)
    bail("forward: %s", hvd_last_error());
  MPI_Allreduce(&loss, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return all;
}

static void check_model(int sync) {
  cnn_t *m = cnn_create(WIDTH, nimg, 7);
  if (m == NULL)
    bail("cnn_create");
  cnn_set_sync_bn(m, sync);
  int np;
  hvd_param_t *p = cnn_params(m, &np);
  /* give batch norm's weights and biases values away from 1 and 0 */
  for (int i = 0; i < np; i++)
    if (strncmp(p[i].name, "bn", 2) == 0) {
      float *v = p[i].value.data;
      for (int c = 0; c < WIDTH; c++)
        v[c] += 0.3f * (float)sin(1.0 + c + i);
    }
  for (int i = 0; i < np; i++)
    memset(p[i].grad.data, 0, sizeof(float) * (size_t)hvd_tensor_numel(&p[i].grad));
  double loss;
  int correct;
  if (cnn_forward(m, x, nimg, labels, &loss, &correct) != HVD_SUCCESS ||
      cnn_backward(m, NULL, NULL) != HVD_SUCCESS)
    bail("forward/backward: %s", hvd_last_error());
  for (int i = 0; i < np; i++) {
    int64_t k = hvd_tensor_numel(&p[i].value);
    float *v = p[i].value.data, *g = p[i].grad.data;
    double worst = 0;
    int bad = 0;
    for (int t = 0; t < PROBES && t < k; t++) {
      int64_t j = (int64_t)(t * 7919 % k);
      double an = g[j], sum;
      MPI_Allreduce(&an, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      const float h = 1e-3f;
      float keep = v[j];
      v[j] = keep + h;
      double lp = total_loss(m);
      v[j] = keep - h;
      double lm = total_loss(m);
      v[j] = keep;
      double fd = (lp - lm) / (2 * h), err = fabs(fd - sum);
      if (err > 2e-3 + 0.03 * fabs(fd)) {
        bad++;
        diag("%s[%lld]: backward %.6g, differences %.6g", p[i].name,
             (long long)j, sum, fd);
      }
      worst = fmax(worst, err);
    }
    ok(bad == 0, "%s batch norm: %s gradient (worst error %.1e)",
       sync ? "sync" : "per-rank", p[i].name, worst);
  }
  cnn_destroy(m);
}

int main(int argc, char **argv) {
  tap_mpi_init(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  is_int(HVD_SUCCESS, hvd_init(), "hvd_init");
  nimg = 2 + rank;
  x = malloc(sizeof(float) * (size_t)nimg * CNN_PIXELS);
  labels = malloc(sizeof(int32_t) * (size_t)nimg);
  for (int i = 0; i < nimg; i++) {
    labels[i] = (rank * 3 + i) % CNN_CLASSES;
    for (int j = 0; j < CNN_PIXELS; j++)
      x[(size_t)i * CNN_PIXELS + j] =
          (float)sin(0.01 * j + 1.7 * i + 2.9 * rank) +
          0.2f * (float)labels[i];
  }
  check_model(1);
  check_model(0);
  free(x);
  free(labels);
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  return tap_mpi_finish();
}
