/*
 * binding.c - hvd_init's GPU binding, one case per run; t/gpu/binding.sh
 * (which see) chooses the case, the rank count and the environment.
 *
 *   binding count    prints "N WHY": the CUDA devices this process sees,
 *                    and why none when N is 0 (no MPI, no TAP)
 *   binding bind     hvd_init works; every rank is on device
 *                    local_rank % count (hvd_cuda_device and
 *                    cudaGetDevice); -1 again after hvd_shutdown
 *   binding shared   (2 ranks, one GPU) hvd_init fails on every rank with
 *                    HVD_ERR_CUDA and "hvd_init: local ranks 0 and 1 are
 *                    both bound to GPU <bus id>; give each rank its own
 *                    GPU (HVD_NO_BIND=1 leaves binding to you)"
 *   binding nobind   (HVD_NO_BIND=1) hvd_init works, hvd_cuda_device is
 *                    -1, and an allreduce works
 *   binding share    (HVD_GPU_SHARE=1, one GPU) hvd_init works, every
 *                    rank on device 0, NCCL_HOSTID is "<host>-hvd-rank<R>"
 *                    (or the user's, kept) and NCCL_IB_DISABLE 1; a device
 *                    allreduce over NCCL is exact, or, when every rank was
 *                    given the same NCCL_HOSTID, fails with HVD_ERR_NCCL
 *                    and NCCL's "Duplicate GPU detected"
 *
 * In a build without CUDA, count prints 0 and the other cases skip.
 */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gputest.h"
#include "hvd.h"
#include "tap.h"

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Devices this process sees; why (n bytes) says why when none. */
static int device_count(char *why, size_t n) {
#ifdef HVD_HAVE_CUDA
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    snprintf(why, n, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return 0;
  }
  snprintf(why, n, "%s", count ? "" : "cudaGetDeviceCount found none");
  return count;
#else
  snprintf(why, n, "this build has no CUDA");
  return 0;
#endif
}

#ifdef HVD_HAVE_CUDA

/* Device 0's PCI bus id, in lower case as hvd prints it. */
static void bus_id(char *buf, int n) {
  if (cudaDeviceGetPCIBusId(buf, n, 0) != cudaSuccess)
    snprintf(buf, (size_t)n, "(unknown)");
  for (char *p = buf; *p; p++)
    if (*p >= 'A' && *p <= 'F')
      *p = (char)(*p - 'A' + 'a');
}

static void allreduce_works(void) {
  float x[3], y[3];
  int64_t shape[1] = {3};
  int size = tap_size();
  for (int i = 0; i < 3; i++)
    x[i] = (float)(tap_rank() + i);
  hvd_tensor_t s = hvd_tensor_make(x, HVD_FLOAT32, 1, shape);
  hvd_tensor_t r = hvd_tensor_make(y, HVD_FLOAT32, 1, shape);
  hvd_result_t rc = hvd_allreduce("b", &s, &r, HVD_SUM, 1.0, 1.0);
  int good = rc == HVD_SUCCESS;
  for (int i = 0; i < 3 && good; i++)
    good = y[i] == (float)(size * (size - 1) / 2 + size * i);
  tap_note("rc %d (%s), y = {%g, %g, %g}", rc, hvd_last_error(), y[0], y[1],
           y[2]);
  ok(good, "an allreduce works");
}

static void case_bind(int count) {
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "hvd_init works"))
    bail("hvd_init: %s", hvd_last_error());
  int want = hvd_local_rank() % count, current = -1;
  is_int(want, hvd_cuda_device(), "hvd_cuda_device is local rank %% %d", count);
  cudaGetDevice(&current);
  is_int(want, current, "and so is the current device");
  allreduce_works();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
  is_int(-1, hvd_cuda_device(), "hvd_cuda_device is -1 after hvd_shutdown");
}

static void case_shared(void) {
  char id[64], want[256];
  bus_id(id, sizeof id);
  snprintf(want, sizeof want,
           "hvd_init: local ranks 0 and 1 are both bound to GPU %s; give "
           "each rank its own GPU (HVD_NO_BIND=1 leaves binding to you; "
           "HVD_GPU_SHARE=1 allows it, for tests)",
           id);
  hvd_result_t rc = hvd_init();
  is_int(HVD_ERR_CUDA, rc, "hvd_init fails with HVD_ERR_CUDA");
  is_string(want, hvd_last_error(), "naming both ranks and the GPU");
  is_int(0, hvd_is_initialized(), "hvd is not initialised");
  is_int(-1, hvd_cuda_device(), "hvd_cuda_device is -1");
}

static void case_nobind(void) {
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "hvd_init works"))
    bail("hvd_init: %s", hvd_last_error());
  is_int(-1, hvd_cuda_device(), "hvd_cuda_device is -1: nothing bound");
  allreduce_works();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
}

/* A device allreduce of 4 floats, rank r giving r + i: its result, with
 * its values checked when it succeeds. */
static hvd_result_t device_allreduce(int *right) {
  float h[4], got[4] = {0};
  int64_t four = 4;
  float *d = NULL;
  int size = tap_size();
  for (int i = 0; i < 4; i++)
    h[i] = (float)(tap_rank() + i);
  *right = 0;
  if (cudaMalloc((void **)&d, sizeof h) != cudaSuccess ||
      cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice) != cudaSuccess)
    bail("cudaMalloc/cudaMemcpy of the device tensor failed");
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &four);
  t.device = hvd_cuda_device();
  hvd_result_t rc = hvd_allreduce("dev", &t, &t, HVD_SUM, 1.0, 1.0);
  if (rc == HVD_SUCCESS &&
      cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess) {
    *right = 1;
    for (int i = 0; i < 4; i++)
      *right &= got[i] == (float)(size * (size - 1) / 2 + size * i);
  }
  cudaFree(d);
  return rc;
}

static void case_share(void) {
  const char *user = getenv("NCCL_HOSTID");
  char host[256] = "localhost", want[320];
  gethostname(host, sizeof host - 1);
  if (user != NULL)
    snprintf(want, sizeof want, "%s", user);
  else
    snprintf(want, sizeof want, "%s-hvd-rank%d", host, tap_rank());
  hvd_result_t rc = hvd_init();
  tap_note("%s", hvd_last_error());
  if (!is_int(HVD_SUCCESS, rc, "hvd_init works with HVD_GPU_SHARE=1"))
    bail("hvd_init: %s", hvd_last_error());
  is_int(0, hvd_cuda_device(), "every rank is on device 0");
  const char *id = getenv("NCCL_HOSTID"), *ib = getenv("NCCL_IB_DISABLE");
  is_string(want, id ? id : "(unset)",
            user ? "the user's NCCL_HOSTID is kept"
                 : "NCCL_HOSTID is <host>-hvd-rank<rank>");
  is_string("1", ib ? ib : "(unset)", "NCCL_IB_DISABLE is 1");
  if (!hvd_nccl_built()) {
    skip(2, "this build has no NCCL");
  } else if (user == NULL) {
    int right = 0;
    rc = device_allreduce(&right);
    tap_note("%s", hvd_last_error());
    is_int(HVD_SUCCESS, rc, "a device allreduce over NCCL between the ranks");
    ok(right, "and its sums are exact");
  } else {
    int right = 0;
    rc = device_allreduce(&right);
    is_int(HVD_ERR_NCCL, rc,
           "one NCCL_HOSTID for all: the device allreduce fails");
    ok(strstr(hvd_last_error(), "Duplicate GPU detected") != NULL,
       "with NCCL's 'Duplicate GPU detected' (%s)", hvd_last_error());
  }
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
}

#endif /* HVD_HAVE_CUDA */

int main(int argc, char **argv) {
  char why[256];
  int count = device_count(why, sizeof why);
  if (argc > 1 && strcmp(argv[1], "count") == 0) {
    printf("%d %s\n", count, why);
    return 0;
  }
#ifdef HVD_HAVE_CUDA
  if (argc > 2 && strcmp(argv[1], "kill") == 0) /* every rank on GPU 0 */
    return gpu_kill_main(atoi(argv[2]), 0);
#endif
  tap_mpi_init(&argc, &argv);
  if (count == 0)
    skip_all("no CUDA device: %s", why);
#ifdef HVD_HAVE_CUDA
  const char *mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "bind") == 0)
    case_bind(count);
  else if (strcmp(mode, "shared") == 0)
    case_shared();
  else if (strcmp(mode, "nobind") == 0)
    case_nobind();
  else if (strcmp(mode, "share") == 0)
    case_share();
  else
    bail("usage: binding count|bind|shared|nobind|share (not '%s')", mode);
#else
  bail("no CUDA, yet %d devices", count);
#endif
  return tap_mpi_finish();
}
