/*
 * cnn.h - a small residual CNN for 32x32 images (examples/cifar_train),
 * on the CPU: 3x3 convolutions as im2col + BLAS, synchronized batch norm
 * (hvd_sync_batch_norm_*: statistics over every rank's batch), ReLU,
 * max pooling, a residual block, global average pooling, a linear
 * classifier and softmax cross-entropy.
 *
 *   conv1 3->W, bn1, relu, maxpool 2    32x32 -> 16x16
 *   conv2 W->W, bn2, relu, conv3 W->W, bn3, + skip, relu
 *   global average pool, fc W->10
 *
 * Usage, per step (after hvd_init, which sync batch norm needs):
 *   cnn_forward(m, x, n, labels, &loss, &correct);   // training mode
 *   cnn_backward(m, ready, ctx);                      // grads += d loss
 * loss is the mean over this rank's n images; batch norm normalizes with
 * the mean and variance of the batches of all ranks together (or of this
 * rank's alone: cnn_set_sync_bn).
 */
#ifndef CNN_H
#define CNN_H

#include <stddef.h>
#include <stdint.h>

#include "hvd.h"

#define CNN_CLASSES 10
#define CNN_SIDE 32
#define CNN_PIXELS (3 * CNN_SIDE * CNN_SIDE)

typedef struct cnn cnn_t;

/* A model of width w (channels of every convolution), weights from seed
 * (He-normal convolutions and classifier, BN weight 1 and bias 0), batches
 * of up to max_batch images. NULL when out of memory. */
cnn_t *cnn_create(int width, int max_batch, uint64_t seed);
void cnn_destroy(cnn_t *m);

/* The same model (the same weights for the same seed) on `device`:
 * HVD_CPU as cnn_create, a CUDA ordinal, or CNN_CURRENT_GPU (the calling
 * thread's current device): parameters, gradients and
 * buffers are device tensors there, the convolutions cuBLAS GEMMs over
 * im2col columns, batch norm hvd's synchronized one on device tensors (or
 * kernels of its own for per-rank statistics), the classifier (10 x W) on
 * the host. Inputs and labels stay host arrays. NULL with the reason in
 * msg: "this build has no CUDA (...)", "no CUDA device: ...", out of
 * memory. Each gradient is complete on the device when ready() is called,
 * as hvd's optimizers require. */
#define CNN_CURRENT_GPU (-2) /* cnn_create_on: the current CUDA device */
cnn_t *cnn_create_on(int width, int max_batch, uint64_t seed, int device,
                     char *msg, size_t len);

/* HVD_CPU or the model's CUDA device. */
int cnn_device(const cnn_t *m);

/* The reason of the model's last failure ("" if none or an hvd one:
 * then hvd_last_error()). */
const char *cnn_last_error(const cnn_t *m);

/* The trainable parameters (conv1.weight, bn1.weight, ...: 11 of them) and
 * the batch norm buffers (bn1.running_mean, ...: 6). Owned by the model. */
hvd_param_t *cnn_params(cnn_t *m, int *n);
hvd_param_t *cnn_buffers(cnn_t *m, int *n);

/* sync 1 (the default): batch norm statistics over every rank's batch
 * (hvd_sync_batch_norm_*, collective); 0: over this rank's batch only,
 * as torch's BatchNorm2d under DDP without SyncBatchNorm. */
void cnn_set_sync_bn(cnn_t *m, int sync);

/* Training forward over n images (x: n x 3 x 32 x 32 floats; n may be 0
 * on a rank while others have images): batch statistics over all ranks
 * (collective), running statistics updated. *loss: the mean cross-entropy
 * over the n images (0 when n is 0), *correct: how many were classified
 * right. */
hvd_result_t cnn_forward(cnn_t *m, const float *x, int n, const int32_t *labels,
                         double *loss, int *correct);

/* Evaluation: running statistics, no collectives; *correct right of n. */
hvd_result_t cnn_eval(cnn_t *m, const float *x, int n, const int32_t *labels,
                      int *correct);

/* Backward of the last training forward: ADDS d(loss)/d(param) into the
 * grads, calling ready(ctx, i) as each parameter's gradient is final
 * (the classifier first). Collective (sync batch norm). */
typedef void (*cnn_ready_fn)(void *ctx, int param_index);
hvd_result_t cnn_backward(cnn_t *m, cnn_ready_fn ready, void *ctx);

#endif /* CNN_H */
