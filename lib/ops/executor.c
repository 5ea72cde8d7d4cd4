/* executor.c - the table of backends. */
#include "ops/executor.h"

#include <stdlib.h>
#include <string.h>

#include "core/errors.h"
#include "core/tensor.h"
#include "ops/mpi_ops.h"

const hvd__executor_t *const hvd__executors[] = {&hvd__mpi_executor, NULL};

int hvd__executor_for(int device) {
  if (device == HVD_CPU)
    return 0;
  return -1; /* device executors (NCCL, host-staged MPI) plug in here */
}

hvd_result_t hvd__alloc_output(hvd_request_t *r, int ndim,
                               const int64_t *shape) {
  hvd_tensor_t *t = &r->recv;
  memset(t, 0, sizeof *t);
  t->dtype = (hvd_dtype_t)r->desc.dtype;
  t->device = HVD_CPU;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  size_t bytes = hvd__tensor_bytes(t);
  t->data = malloc(bytes ? bytes : 1);
  if (t->data == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "output of %zu bytes", bytes);
  return HVD_SUCCESS;
}
