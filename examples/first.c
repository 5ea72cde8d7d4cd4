#include <hvd.h>
#include <stdio.h>

int main(void) {
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  /* This rank's gradient: 1000 copies of its rank number. */
  float grad[1000];
  for (int i = 0; i < 1000; i++)
    grad[i] = (float)hvd_rank();
  int64_t shape[1] = {1000};
  hvd_tensor_t g = hvd_tensor_make(grad, HVD_FLOAT32, 1, shape);

  /* Average it over all ranks, in place: each element becomes the mean
   * of 0, 1, ..., size - 1. */
  hvd_result_t rc = hvd_allreduce("layer1.grad", &g, &g, HVD_AVERAGE, 1.0, 1.0);
  if (rc == HVD_SUCCESS)
    printf("rank %d of %d: average %.2f (expected %.2f)\n", hvd_rank(),
           hvd_size(), grad[999], (hvd_size() - 1) / 2.0);
  else
    fprintf(stderr, "rank %d: %s\n", hvd_rank(), hvd_last_error());

  hvd_shutdown();
  return rc == HVD_SUCCESS ? 0 : 1;
}
