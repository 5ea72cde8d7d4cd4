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
 *                    and NCCL's "Duplicate GPU detected"; device
 *                    memory given as a host tensor is refused
 *   binding oom      (HVD_GPU_SHARE=1, one GPU, NCCL) the last rank's
 *                    cudaMalloc of more than 64 KiB fails: an allgather
 *                    whose output it cannot allocate and a grouped
 *                    allreduce whose fusion buffer it cannot allocate fail
 *                    on every rank, within 2 s, with HVD_ERR_CUDA and the
 *                    same words naming it; a device allreduce works after
 *                    each (NCCL was kept); t/standin/faults' case E on a
 *                    real GPU
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

#if defined(HVD_HAVE_CUDA) && !defined(HVD_T_STANDIN)
#include <dlfcn.h>

/* binding oom's fault on a real GPU: this program's cudaMalloc comes
 * before libcudart's in the dynamic linker's search, for libhvd's calls
 * too (-export-dynamic, t/gpu/local.mk). With
 * HVD_TEST_CUDA_MALLOC_LIMIT=R:BYTES, world rank R's cudaMalloc of more
 * than BYTES fails with cudaErrorMemoryAllocation, as on a GPU whose
 * memory is used up; read at every call. The stand-in build
 * (HVD_T_STANDIN) has its own, HVD_STANDIN_CUDA_MALLOC_LIMIT. */
cudaError_t CUDARTAPI cudaMalloc(void **p, size_t bytes) {
  static cudaError_t (*real)(void **, size_t);
  const char *v = getenv("HVD_TEST_CUDA_MALLOC_LIMIT");
  const char *me = getenv("OMPI_COMM_WORLD_RANK");
  const char *colon = v != NULL ? strchr(v, ':') : NULL;
  if (colon != NULL && me != NULL && atoi(v) == atoi(me) &&
      bytes > strtoull(colon + 1, NULL, 10))
    return cudaErrorMemoryAllocation;
  if (real == NULL)
    *(void **)&real = dlsym(RTLD_NEXT, "cudaMalloc");
  return real != NULL ? real(p, bytes) : cudaErrorUnknown;
}
#define OOM_LIMIT_VAR "HVD_TEST_CUDA_MALLOC_LIMIT"
#else
#define OOM_LIMIT_VAR "HVD_STANDIN_CUDA_MALLOC_LIMIT"
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

/* Device memory given as a host tensor (the device field left HVD_CPU):
 * refused at submission, never read by host code (a segmentation fault
 * on a GPU). Bound processes only (hvd__cuda_device_memory). */
static void host_flagged_device_memory(void) {
  float *d = NULL;
  int64_t four = 4;
  if (cudaMalloc((void **)&d, 4 * sizeof *d) != cudaSuccess)
    bail("cudaMalloc of 16 bytes");
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, &four);
  hvd_result_t rc = hvd_allreduce("hostdev", &t, &t, HVD_SUM, 1.0, 1.0);
  is_int(HVD_ERR_INVALID_ARG, rc, "device memory as a host tensor: refused");
  is_string("allreduce 'hostdev': send tensor is on cpu but its data is device "
            "memory of cuda:0 (set its device)",
            hvd_last_error(), "naming the tensor and the device");
  cudaFree(d);
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
  host_flagged_device_memory();
  is_int(HVD_SUCCESS, hvd_shutdown(), "hvd_shutdown");
}

/* An allreduce of 4 floats on device 0 (oom's "NCCL was kept"). */
static void oom_works(const char *name) {
  int right = 0;
  hvd_result_t rc = device_allreduce(&right);
  tap_note("%s", hvd_last_error());
  ok(rc == HVD_SUCCESS && right, "oom: %s: a device allreduce works", name);
}

/* One failing collective of case_oom: rc, words and time on every rank. */
static void oom_fails(const char *what, hvd_result_t rc, double took,
                      const char *name, const char *why) {
  char want[1024], got[1024];
  const int size = tap_size();
  snprintf(got, sizeof got, "%s", rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (size == 1) {
    is_int(HVD_SUCCESS, rc, "oom: np 1: the %s needs nothing over the limit",
           what);
  } else {
    snprintf(want, sizeof want, "%s '%s': %s", what, name, why);
    is_int(HVD_ERR_CUDA, rc, "oom: %s: HVD_ERR_CUDA on every rank", what);
    is_string(want, got, "oom: %s: the same words on every rank", what);
  }
  ok(took < 2, "oom: %s: ends within 2 s (%.2f s)", what, took);
}

static void case_oom(void) {
  enum { N = 16384 }; /* 64 KiB of float32: the last rank may allocate it */
  const int last = tap_size() - 1;
  char v[64], why[512];
  setenv("HVD_GPU_OPERATIONS", hvd_nccl_built() ? "nccl" : "mpi", 1);
  hvd_result_t rc = hvd_init();
  if (!is_int(HVD_SUCCESS, rc, "oom: hvd_init"))
    bail("hvd_init: %s", hvd_last_error());
  if (hvd_cuda_device() != 0) /* device_allreduce's tensors are on it */
    bail("oom: hvd_cuda_device is %d, not 0: run with HVD_GPU_SHARE=1 and "
         "HVD_NO_BIND=0",
         hvd_cuda_device());
  oom_works("before");
  snprintf(v, sizeof v, "%d:%d", last, N * 4);
  setenv(OOM_LIMIT_VAR, v, 1);
  snprintf(why, sizeof why,
           "rank %d could not prepare the collective on its GPU: cudaMalloc: "
           "out of memory (cudaErrorMemoryAllocation); nothing was launched, "
           "NCCL is still usable",
           last);
  float *d = NULL, *d2 = NULL;
  if (cudaMalloc((void **)&d, N * sizeof *d) != cudaSuccess ||
      cudaMalloc((void **)&d2, N * sizeof *d2) != cudaSuccess ||
      cudaMemset(d, 0, N * sizeof *d) != cudaSuccess ||
      cudaMemset(d2, 0, N * sizeof *d2) != cudaSuccess)
    bail("oom: 64 KiB of device memory");
  int64_t shape[1] = {N};
  hvd_tensor_t t = hvd_tensor_make(d, HVD_FLOAT32, 1, shape), out;
  hvd_tensor_t t2 = hvd_tensor_make(d2, HVD_FLOAT32, 1, shape);
  t.device = t2.device = 0;
  double t0 = gpu_now_s();
  rc = hvd_allgather("oom.gather", &t, &out);
  oom_fails("allgather", rc, gpu_now_s() - t0, "oom.gather", why);
  if (rc == HVD_SUCCESS)
    hvd_tensor_free(&out);
  oom_works("after the allgather");
  const char *names[2] = {"oom.a", "oom.b"};
  hvd_tensor_t ins[2] = {t, t2};
  t0 = gpu_now_s();
  rc = hvd_grouped_allreduce(2, names, ins, ins, HVD_SUM, 1.0, 1.0);
  oom_fails("allreduce", rc, gpu_now_s() - t0, "oom.a", why);
  oom_works("after the grouped allreduce");
  unsetenv(OOM_LIMIT_VAR);
  cudaFree(d);
  cudaFree(d2);
  is_int(HVD_SUCCESS, hvd_shutdown(), "oom: hvd_shutdown");
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
  else if (strcmp(mode, "oom") == 0)
    case_oom();
  else
    bail("usage: binding count|bind|shared|nobind|share|oom (not '%s')",
         mode);
#else
  bail("no CUDA, yet %d devices", count);
#endif
  return tap_mpi_finish();
}
