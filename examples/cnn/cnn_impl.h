/*
 * cnn_impl.h - what cnn.c (the model, on the CPU) and cnn_cuda.cu (its
 * GPU backend, in a CUDA build) share: the parameters' order, the sizes,
 * the model's struct, and the backend's entry points. Not for programs:
 * they use cnn.h.
 */
#ifndef CNN_IMPL_H
#define CNN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "cnn.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  P_CONV1,
  P_BN1_W,
  P_BN1_B,
  P_CONV2,
  P_BN2_W,
  P_BN2_B,
  P_CONV3,
  P_BN3_W,
  P_BN3_B,
  P_FC_W,
  P_FC_B,
  NPARAMS
};

#define S1 CNN_SIDE       /* 32: conv1 */
#define S2 (CNN_SIDE / 2) /* 16: after the pool */
#define BN_MOMENTUM 0.1
#define BN_EPS 1e-5

struct cnn_gpu; /* cnn_cuda.cu */

struct cnn {
  int w, maxb, n;
  hvd_param_t p[NPARAMS], b[6];
  float *vals, *grads, *bufs; /* one block each (device memory on a GPU) */
  /* the last training forward, for backward (host models only, but gap,
   * prob and labels: the classifier runs on the host for both) */
  float *x, *c1, *n1, *r1, *p1, *c2, *n2, *r2, *c3, *n3, *s3, *gap, *prob;
  int32_t *argmax, *labels;
  float mean[3][64], invstd[3][64];
  int ready_for_backward;
  int sync_bn;
  /* scratch */
  float *cols, *da, *db, *dc;
  struct cnn_gpu *gpu; /* NULL: the CPU */
  char err[256];       /* the last failure's reason (cnn_last_error) */
};

/* The GPU backend. cnn_gpu_open moves a host-initialized model (values,
 * buffers; gradients zero) to CUDA device `device`: its parameters and
 * buffers become device tensors there. 0, or -1 with m->err set. */
int cnn_gpu_open(cnn_t *m, int device);
void cnn_gpu_close(cnn_t *m);

/* The trunk and the average pool: m->gap (host, [n, W]) for x (host,
 * n images), training (batch statistics, kept for backward) or not. */
hvd_result_t cnn_gpu_features(cnn_t *m, const float *x, int n, int train);

/* The backward from dgap (host [n, W]) and the classifier's gradients
 * (host, dfw [10, W] and dfb [10], added into the device grads first);
 * calls ready(ctx, i) as each gradient is final on the device. */
hvd_result_t cnn_gpu_backward(cnn_t *m, const float *dgap, const float *dfw,
                              const float *dfb, cnn_ready_fn ready, void *ctx);

/* The classifier's weights, copied to the host (fw [10, W], fb [10]). */
hvd_result_t cnn_gpu_fc_weights(cnn_t *m, float *fw, float *fb);

#ifdef __cplusplus
}
#endif

#endif /* CNN_IMPL_H */
