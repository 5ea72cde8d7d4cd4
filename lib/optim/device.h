/*
 * device.h - lib/optim's device side: the device context of an optimizer
 * (the rank's GPU, a stream of the optimizer's own, the span arrays of the
 * batched update and conversion kernels of optim_kernels.cu) and synchronous
 * copies between host memory and a device tensor, for checksums and
 * checkpoints.
 *
 * Device tensors are those with device >= 0; the callers have checked that
 * the device is the rank's GPU. Every call makes that device current on
 * the calling thread for its duration and puts the caller's current device
 * back. CUDA failures are HVD_ERR_CUDA "<who>: <call>: <CUDA's string>
 * (<CUDA's error name>)".
 *
 * In a build without CUDA every call but hvd__odev_close/hvd__odev_free
 * fails with HVD_ERR_UNSUPPORTED; no caller gets there, since optimizers
 * and collectives refuse device tensors in such a build.
 */
#ifndef HVD_OPTIM_DEVICE_H
#define HVD_OPTIM_DEVICE_H

#include "internal.h"

typedef struct hvd__odev hvd__odev_t;

/* A context on device dev: a cudaStreamNonBlocking stream. It waits for
 * the caller's stream (hvd__odev_after_caller) once per
 * hvd_optimizer_step and before each gradient that grad_ready reads on
 * it, as the collectives do; every optimizer call waits for this stream
 * before it returns. */
hvd_result_t hvd__odev_open(const char *who, int dev, hvd__odev_t **out);
/* Waits for the stream, then frees everything. Accepts NULL. */
void hvd__odev_close(hvd__odev_t *d);

/* *out = `bytes` zeroed bytes of device memory on d's device (at least
 * one byte, so never NULL), complete on return. Free with hvd__odev_free. */
hvd_result_t hvd__odev_calloc(const char *who, hvd__odev_t *d, size_t bytes,
                              void **out);
void hvd__odev_free(int dev, void *p); /* cudaFree on dev; accepts NULL */

/* Enqueued on d's stream (hvd__odev_sync waits): zero `bytes` bytes at p;
 * x[0..n) *= (float)factor, as the host's float loop. */
hvd_result_t hvd__odev_zero(const char *who, hvd__odev_t *d, void *p,
                            size_t bytes);
hvd_result_t hvd__odev_scale(const char *who, hvd__odev_t *d, float *x,
                             int64_t n, double factor);

/* The built-in updates of the device parameters among params[0..n) (host
 * ones are skipped, and those with only[i] 0 when only is not NULL), one
 * batched launch on d's stream: state holds nstate tensors per parameter
 * (parameter i's at state[i * nstate + k]). kind 0: SGD (options:
 * hvd_sgd_options_t), 1: Adam/AdamW (hvd_adam_options_t). */
hvd_result_t hvd__odev_update(const char *who, hvd__odev_t *d, int kind,
                              const void *options, const hvd_param_t *params,
                              int n, const hvd_tensor_t *state, int nstate,
                              int64_t step, double lr,
                              const unsigned char *only);

/* Mixed precision (mixed.c), on d's stream: a found-inf flag in device
 * memory, cleared (made the first time) and read (waits for the stream);
 * float32 masters from values or gradients of dtype (float32, float16,
 * bfloat16) times factor, setting the flag on an inf or NaN. */
hvd_result_t hvd__odev_flag_reset(const char *who, hvd__odev_t *d);
hvd_result_t hvd__odev_flag_read(const char *who, hvd__odev_t *d, int *out);
hvd_result_t hvd__odev_to_master(const char *who, hvd__odev_t *d,
                                 const void *src, hvd_dtype_t dtype, float *dst,
                                 int64_t n, double factor);

/* One device tensor of a batched conversion: n elements from src into
 * dst; dtype is the source's for to_master (float32, float16, bfloat16;
 * src may be dst when float32) and the destination's for from_master
 * (float16, bfloat16), the other side float32. The tensors of one batch
 * touch disjoint memory. */
typedef struct hvd__odev_convert {
  const void *src;
  void *dst;
  hvd_dtype_t dtype;
  int64_t n;
} hvd__odev_convert_t;

/* One launch for c[0..n) (none when n is 0): every hvd__odev_to_master
 * with the same factor and flag; or every value from its master, rounded
 * to nearest even. */
hvd_result_t hvd__odev_to_master_batch(const char *who, hvd__odev_t *d,
                                       const hvd__odev_convert_t *c, int n,
                                       double factor);
hvd_result_t hvd__odev_from_master_batch(const char *who, hvd__odev_t *d,
                                         const hvd__odev_convert_t *c, int n);
/* A master element that no longer rounds to its value (float16 or
 * bfloat16) becomes that value (hvd__cuda_refresh_master). */
hvd_result_t hvd__odev_refresh_master(const char *who, hvd__odev_t *d,
                                      const void *value, hvd_dtype_t dtype,
                                      float *master, int64_t n);

/* Gradient clipping (clip.c): for each of x[0..n) (device float32, count[i]
 * elements), out[2 i] its sum of squares and out[2 i + 1] its largest
 * magnitude (host memory; optim_math.h's order, the host's bits), after
 * everything enqueued on d's stream before; waits for the stream. */
hvd_result_t hvd__odev_norm_batch(const char *who, hvd__odev_t *d,
                                  const float *const *x, const int64_t *count,
                                  int n, double *out);

/* LAMB (lamb.c): one device parameter, or block, of a batch: n float32
 * elements of value, grad and the moments m, s; its weight decay, and
 * its step size (the second pass's). */
typedef struct hvd__odev_lamb {
  float *value;
  const float *grad;
  float *m, *s;
  int64_t n;
  float wd, ratio;
} hvd__odev_lamb_t;

/* The first pass over p[0..n), which writes nothing of theirs: out[2 i]
 * and out[2 i + 1] (host memory) the sums of value^2 and u^2, by
 * optim_math.h's order (the host's bits), after everything enqueued on
 * d's stream before; waits for the stream. */
hvd_result_t hvd__odev_lamb_norms(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step,
                                  double *out);
/* The second pass over p[0..n) (m, s, value written), one launch
 * enqueued on d's stream. */
hvd_result_t hvd__odev_lamb_apply(const char *who, hvd__odev_t *d,
                                  const hvd__odev_lamb_t *p, int n,
                                  const hvd_lamb_options_t *o, int64_t step);

/* PowerSGD (powersgd.c): one compressed parameter's device buffers, all
 * float32 on d's device: the gradient M (n x m), its error feedback e
 * (NULL: none), P (n x r), Q transposed (r x m), and the scratch of
 * Q^T's chunks of rows (optim_kernels.h; NULL for one chunk). */
typedef struct hvd__odev_psgd {
  float *M, *e, *P, *Qt, *parts;
  int64_t n, m;
  int r;
} hvd__odev_psgd_t;

typedef enum hvd__odev_psgd_op {
  HVD__PSGD_PREPARE, /* M = M * factor + e */
  HVD__PSGD_MQ,      /* P = M Q */
  HVD__PSGD_MTP,     /* Q^T = P^T M */
  HVD__PSGD_FINISH   /* e = M - P Q^T * inv (keep), M = P Q^T * factor */
} hvd__odev_psgd_op_t;

/* One of them enqueued on d's stream (optim_kernels.h's hvd__cuda_psgd_*,
 * optim_math.h's arithmetic: the host's bits). */
hvd_result_t hvd__odev_psgd(const char *who, hvd__odev_t *d,
                            hvd__odev_psgd_op_t op, const hvd__odev_psgd_t *x,
                            double factor, float inv, int keep);
/* bytes from src to dst (one side device memory on d's device, the other
 * host memory), enqueued on d's stream: ordered with its kernels. A copy
 * to the host is complete once hvd__odev_sync returns. */
hvd_result_t hvd__odev_copy_async(const char *who, hvd__odev_t *d, void *dst,
                                  const void *src, size_t bytes, int to_device);

/* d's stream waits, on the device, for what the calling thread's stream
 * (hvd_cuda_set_stream; the legacy default stream unless set) has
 * enqueued so far: the gradients the caller may still be computing (the
 * collectives' ordering rule, hvd.h "Device ordering"). The host waits
 * for nothing. */
hvd_result_t hvd__odev_after_caller(const char *who, hvd__odev_t *d);

/* d's stream (a cudaStream_t), for hvd_cuda_set_stream: a collective
 * submitted under it reads what d's kernels wrote, ordered on the device.
 * NULL in a build without CUDA. */
void *hvd__odev_stream(const hvd__odev_t *d);

/* An allreduce of t in place (prescale and postscale 1), on a wire of
 * dtype wire (t's own, or float16/bfloat16 for a float32 t). A device t's
 * is submitted with d's stream as the calling thread's hvd stream, so it
 * reads t after d's kernels wrote it, on the device, the host waiting for
 * nothing; the thread's stream is then set back. */
hvd_result_t hvd__odev_allreduce_async(hvd__odev_t *d, const char *name,
                                       hvd_tensor_t *t, hvd_op_t op,
                                       hvd_dtype_t wire, hvd_request_t **req);

/* Waits until d's stream has done everything enqueued. */
hvd_result_t hvd__odev_sync(const char *who, hvd__odev_t *d);

/* Synchronous copies of `bytes` bytes at byte `offset` of device tensor
 * t's data, to / from host memory, after the calling thread's stream
 * (hvd_cuda_set_stream) has done what it had enqueued (the host waits
 * for it): checkpoints, hvd_state and hvd_verify_parameters follow the
 * collectives' "Device ordering". */
hvd_result_t hvd__odev_read(const char *who, void *dst, const hvd_tensor_t *t,
                            size_t offset, size_t bytes);
hvd_result_t hvd__odev_write(const char *who, hvd_tensor_t *t, size_t offset,
                             const void *src, size_t bytes);
/* The same from device memory src on t's device (complete on return). */
hvd_result_t hvd__odev_copy(const char *who, hvd_tensor_t *t, size_t offset,
                            const void *src, size_t bytes);

#endif /* HVD_OPTIM_DEVICE_H */
