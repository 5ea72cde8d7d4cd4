/*
 * tensor.h - dtype facts, shape formatting and the argument checks shared
 * by every collective.
 */
#ifndef HVD_BASE_TENSOR_H
#define HVD_BASE_TENSOR_H

#include <stddef.h>

#include "internal.h"

#define HVD__SHAPE_STR_MAX (HVD_MAX_DIMS * 22 + 4)

int hvd__dtype_valid(int dtype);
int hvd__dtype_is_float(hvd_dtype_t dtype);
/* 1 when t's bytes (numel * element size) are at most PTRDIFF_MAX, into
 * *bytes (when not NULL); 0 when a dimension is negative or the count or
 * the bytes overflow. Every tensor the API takes is checked so (the
 * argument checks below), so that the sizes computed from it later do
 * not wrap. */
int hvd__tensor_size(const hvd_tensor_t *t, size_t *bytes);
/* 1 when one row of a tensor of dtype and shape (the product of
 * dimensions 1..ndim-1 and the element size) is at most PTRDIFF_MAX
 * bytes, into *bytes (when not NULL); 0 when a dimension is negative or
 * the product would wrap. A tensor of 0 rows passes hvd__tensor_size
 * whatever its other dimensions ([0, 2^40, 2^40]), so the collectives
 * that work in rows check this too. */
int hvd__row_size(hvd_dtype_t dtype, int ndim, const int64_t *shape,
                  int64_t *bytes);
/* The first dimension of an output made of n ranks' rows (an allgather's
 * first dimensions, the splits an alltoall sends one rank): rows[0..n-1]
 * summed into *total, and 1 when each is >= 0, the sum fits in an int64
 * and a tensor of dtype and shape [sum, shape[1], ..., shape[ndim-1]]
 * passes hvd__tensor_size and hvd__row_size; 0 (*total unset) when the
 * sum or the output's elements or bytes, or a row's bytes, would wrap. Each
 * rank's own tensor passed hvd__tensor_size, but their sum need not (rows of 0
 * bytes claim any count). */
int hvd__rows_total(const int64_t *rows, int n, hvd_dtype_t dtype, int ndim,
                    const int64_t *shape, int64_t *total);
/* numel * element size; SIZE_MAX where hvd__tensor_size fails. */
size_t hvd__tensor_bytes(const hvd_tensor_t *t);
/* "[2, 3]", "[]" for a scalar. */
void hvd__shape_str(int ndim, const int64_t *shape, char *buf, size_t n);
/* "cpu" or "cuda:N". */
void hvd__device_str(int device, char *buf, size_t n);

/* 1 when both are host memory or both device memory. Ranks agree on a
 * collective's device in this sense: each rank's GPU has its own ordinal
 * (rank 1 on cuda:1 and rank 0 on cuda:0 agree; cpu and cuda:0 do not). */
int hvd__device_kind_equal(int a, int b);

/* Checks a tensor argument of collective `kind` named `name`; `which` is
 * "send", "recv" or "" (a lone tensor, as in broadcast). Sets the message
 * and returns HVD_ERR_INVALID_ARG (or HVD_ERR_UNSUPPORTED for a device
 * tensor in a build without CUDA). A device tensor must be on this rank's
 * GPU (hvd__cuda_rank_device): "<kind> '<name>': tensor is on cuda:1 but
 * this rank uses cuda:0"; and its data must be where it says
 * (hvd__tensor_misplaced): "<kind> '<name>': tensor is on cpu but its data
 * is device memory of cuda:0 (set its device)". */
hvd_result_t hvd__check_tensor(const char *kind, const char *name,
                               const char *which, const hvd_tensor_t *t);

/* hvd__check_tensor, except that t's placement is not asked of the CUDA
 * runtime again when its bytes lie within those of `home` (checked before
 * it, on the same device): an in-place recv, or a block of the output it
 * is gathered into. One driver call (cudaPointerGetAttributes) fewer per
 * in-place device collective. home may be NULL. */
hvd_result_t hvd__check_tensor_in(const char *kind, const char *name,
                                  const char *which, const hvd_tensor_t *t,
                                  const hvd_tensor_t *home);

/* 1 when t's data is not where t says, as far as the CUDA runtime can
 * tell: device memory in a host tensor of a process bound to a GPU
 * (hvd__cuda_device_memory), or pageable host memory in a device tensor
 * whose GPU cannot reach it (hvd__cuda_unreachable_host); why (n bytes)
 * then says so after the tensor's name: "is on cpu but its data is device
 * memory of cuda:0 (set its device)". 0 otherwise, and for no elements.
 * hvd__check_tensor and the optimizers' parameter check share it. */
int hvd__tensor_misplaced(const hvd_tensor_t *t, char *why, size_t n);

#endif /* HVD_BASE_TENSOR_H */
