/*
 * staged_ops.c - the host-staged device executor ("mpi-staged"): device
 * tensors go through pinned host memory into the MPI executor's own
 * collectives (mpi_ops.c, through hvd__mpi_executor.run with a state of
 * its own) and back. Nothing here is per-GPU exclusive, so several ranks
 * may share one GPU (HVD_GPU_OPERATIONS=mpi with HVD_NO_BIND=1).
 *
 * Per collective: the inputs are copied device -> pinned buffer on hvd's
 * stream (cudaMemcpyAsync, one persistent buffer grown as needed), the
 * copies waited for; the MPI executor runs on host requests that mirror
 * the real ones (same name, stub flag, splits; tensors in the pinned
 * buffer, in place for allreduce and broadcast), so fusion, the
 * shared-memory allreduce, prescale/average/postscale and compression are
 * exactly the host's; then results are copied back (host -> device) and
 * waited for. Outputs that the MPI executor allocates (allgather, alltoall,
 * reducescatter) come back in its host memory and are copied into device
 * memory hvd allocates (hvd_tensor_free).
 *
 * The MPI executor's state is opened on the first device collective, which
 * every rank runs at the same point (its open is collective), after every
 * rank's GPU set up (agreed over MPI).
 */
#include <config.h>

#include "ops/staged_ops.h"

#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/tensor.h"
#include "ops/gpu_ops.h"
#include "ops/mpi_ops.h"

typedef struct staged_state {
  hvd__gpu_t gpu; /* first: hvd__gpu_stub_alloc/free take the state as one */
  void *inner;    /* the MPI executor's state; NULL before first use */
  char *pin;      /* pinned staging buffer */
  size_t pin_cap;
  hvd_request_t *hreqs; /* host mirrors of a group's requests */
  hvd_request_t **hptrs;
  int hcap;
} staged_state_t;

/* s->pin holds at least n bytes (between collectives only). */
static hvd_result_t pinned(staged_state_t *s, size_t n) {
  hvd_result_t rc = HVD_SUCCESS;
  if (n <= s->pin_cap)
    return HVD_SUCCESS;
  size_t cap = n < ((size_t)1 << 20) ? (size_t)1 << 20 : n;
  cudaFreeHost(s->pin);
  s->pin = NULL;
  s->pin_cap = 0;
  HVD__CUDA_CHECK(cudaHostAlloc((void **)&s->pin, cap, cudaHostAllocDefault));
  s->pin_cap = cap;
fail:
  return rc;
}

/* Room for n host mirrors. */
static hvd_result_t mirrors(staged_state_t *s, int n) {
  if (n <= s->hcap)
    return HVD_SUCCESS;
  hvd_request_t *h = realloc(s->hreqs, (size_t)n * sizeof *h);
  if (h != NULL)
    s->hreqs = h;
  hvd_request_t **p = realloc(s->hptrs, (size_t)n * sizeof *p);
  if (p != NULL)
    s->hptrs = p;
  if (h == NULL || p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "staging requests");
  s->hcap = n;
  return HVD_SUCCESS;
}

/* First use: every rank's GPU set up, then the MPI executor's state. */
static hvd_result_t staged_enter(staged_state_t *s, const hvd__exec_env_t *env,
                                 const hvd__work_t *w) {
  hvd_result_t rc = hvd__gpu_enter(&s->gpu, w, "host-staged MPI");
  if (s->inner != NULL)
    return rc;
  int mine = rc == HVD_SUCCESS ? env->size : env->rank, first = 0;
  int mrc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, env->comm);
  if (mrc != MPI_SUCCESS)
    return hvd__mpi_error(mrc, "MPI_Allreduce");
  if (rc != HVD_SUCCESS)
    return rc;
  if (first < env->size)
    return hvd__set_error(HVD_ERR_CUDA,
                          "host-staged MPI: rank %d could not set up its GPU "
                          "(its hvd_last_error says why)",
                          first);
  return hvd__mpi_executor.open(env, &s->inner);
}

/* Host mirror i of r: the same request, its input in the pinned buffer at
 * `at` (device -> host copy enqueued when copy_in), in place; outputs and
 * received splits not yet made. */
static hvd_result_t mirror(staged_state_t *s, int i, hvd_request_t *r,
                           size_t at, int copy_in) {
  hvd_result_t rc = HVD_SUCCESS;
  hvd_request_t *h = &s->hreqs[i];
  size_t bytes = hvd__tensor_bytes(&r->send);
  *h = *r;
  h->next = NULL;
  h->errmsg = NULL;
  h->recv_splits = NULL;
  h->recv_given = 0; /* the host output is the inner executor's */
  h->send.data = s->pin + at;
  h->send.device = HVD_CPU;
  h->recv = h->send;
  s->hptrs[i] = h;
  if (copy_in && bytes > 0)
    HVD__CUDA_CHECK(cudaMemcpyAsync(h->send.data, r->send.data, bytes,
                                    cudaMemcpyDeviceToHost, s->gpu.stream));
fail:
  return rc;
}

/* Waits for the copies enqueued so far; `last`: the group ends with them
 * (gpu_ops.h: its timing under HVD_GPU_TIMING, which also counts the host
 * collective between the copies as the group's). */
static hvd_result_t wait_copies(staged_state_t *s, int last) {
  const char *what = "host-staged MPI: cudaMemcpyAsync";
  return last ? hvd__gpu_wait(&s->gpu, what, NULL, NULL)
              : hvd__gpu_sync(&s->gpu, what);
}

/* Enters the executor and mirrors every request of w into one pinned
 * host buffer, packed in order; with copy_in the device data is copied
 * there too (asynchronously: wait_copies before the host reads it). */
static hvd_result_t stage_in(staged_state_t *s, const hvd__exec_env_t *env,
                             const hvd__work_t *w, int copy_in) {
  hvd_result_t rc;
  size_t total = 0, at = 0;
  HVD__CHECK(staged_enter(s, env, w));
  for (int i = 0; i < w->n; i++)
    total += hvd__tensor_bytes(&w->reqs[i]->send);
  HVD__CHECK(pinned(s, total));
  HVD__CHECK(mirrors(s, w->n));
  for (int i = 0; i < w->n; i++) {
    HVD__CHECK(mirror(s, i, w->reqs[i], at, copy_in));
    at += hvd__tensor_bytes(&w->reqs[i]->send);
  }
fail:
  return rc;
}

static hvd_result_t staged_allreduce(void *state, const hvd__exec_env_t *env,
                                     const hvd__work_t *w) {
  staged_state_t *s = state;
  hvd_result_t rc;
  HVD__CHECK(stage_in(s, env, w, 1));
  HVD__CHECK(wait_copies(s, 0));
  hvd__work_t hw = {w->desc, s->hptrs, w->n, w->dims0s, NULL};
  HVD__CHECK(hvd__mpi_executor.run[HVD__ALLREDUCE](s->inner, env, &hw));
  for (int i = 0; i < w->n; i++) {
    hvd_request_t *r = w->reqs[i];
    size_t bytes = hvd__tensor_bytes(&r->send);
    if (r->is_stub || bytes == 0)
      continue;
    HVD__CUDA_CHECK(cudaMemcpyAsync(r->recv.data, s->hreqs[i].recv.data, bytes,
                                    cudaMemcpyHostToDevice, s->gpu.stream));
  }
  HVD__CHECK(wait_copies(s, 1)); /* nothing copied: the stream is idle */
fail:
  return rc;
}

static hvd_result_t staged_broadcast(void *state, const hvd__exec_env_t *env,
                                     const hvd__work_t *w) {
  staged_state_t *s = state;
  hvd_result_t rc;
  int is_root = env->rank == w->desc->root;
  HVD__CHECK(stage_in(s, env, w, is_root)); /* only the root's data matters */
  if (is_root)
    HVD__CHECK(wait_copies(s, 0));
  hvd__work_t hw = {w->desc, s->hptrs, w->n, w->dims0s, NULL};
  HVD__CHECK(hvd__mpi_executor.run[HVD__BROADCAST](s->inner, env, &hw));
  for (int i = 0; i < w->n && !is_root; i++) {
    size_t bytes = hvd__tensor_bytes(&w->reqs[i]->send);
    if (bytes > 0)
      HVD__CUDA_CHECK(cudaMemcpyAsync(w->reqs[i]->send.data,
                                      s->hreqs[i].send.data, bytes,
                                      cudaMemcpyHostToDevice, s->gpu.stream));
  }
  HVD__CHECK(wait_copies(s, 1));
fail:
  return rc;
}

/* Allgather, alltoall, reducescatter: one request whose output the MPI
 * executor allocates on the host; it is copied into device memory. */
static hvd_result_t staged_with_output(staged_state_t *s,
                                       const hvd__exec_env_t *env,
                                       const hvd__work_t *w, int coll) {
  hvd_result_t rc;
  hvd_request_t *r = w->reqs[0], *h = NULL;
  HVD__CHECK(stage_in(s, env, w, 1)); /* w->n is 1 */
  h = &s->hreqs[0];
  memset(&h->recv, 0, sizeof h->recv);
  HVD__CHECK(wait_copies(s, 0));
  hvd__work_t hw = {w->desc, s->hptrs, 1, w->dims0s, NULL};
  rc = hvd__mpi_executor.run[coll](s->inner, env, &hw);
  r->recv_splits = h->recv_splits; /* alltoall: the request's now */
  h->recv_splits = NULL;
  if (rc != HVD_SUCCESS)
    goto fail;
  HVD__CHECK(hvd__gpu_alloc_output(&s->gpu, r, h->recv.ndim, h->recv.shape));
  size_t bytes = hvd__tensor_bytes(&h->recv);
  if (bytes > 0)
    HVD__CUDA_CHECK(cudaMemcpyAsync(r->recv.data, h->recv.data, bytes,
                                    cudaMemcpyHostToDevice, s->gpu.stream));
  HVD__CHECK(wait_copies(s, 1));
fail:
  if (h != NULL) {
    free(h->recv.data); /* host output of the MPI executor */
    h->recv.data = NULL;
  }
  return rc;
}

static hvd_result_t staged_allgather(void *state, const hvd__exec_env_t *env,
                                     const hvd__work_t *w) {
  return staged_with_output(state, env, w, HVD__ALLGATHER);
}

static hvd_result_t staged_alltoall(void *state, const hvd__exec_env_t *env,
                                    const hvd__work_t *w) {
  return staged_with_output(state, env, w, HVD__ALLTOALL);
}

static hvd_result_t staged_reducescatter(void *state,
                                         const hvd__exec_env_t *env,
                                         const hvd__work_t *w) {
  return staged_with_output(state, env, w, HVD__REDUCESCATTER);
}

/* Nothing collective and nothing CUDA here: a CUDA build on a machine
 * without a GPU opens it too. */
static hvd_result_t staged_open(const hvd__exec_env_t *env, void **state) {
  staged_state_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY, "host-staged executor state");
  hvd__gpu_init(&s->gpu, env);
  *state = s;
  return HVD_SUCCESS;
}

static void staged_close(void *state, int collective) {
  staged_state_t *s = state;
  if (s == NULL)
    return;
  if (s->inner != NULL)
    hvd__mpi_executor.close(s->inner, collective);
  if (s->pin != NULL) {
    cudaFreeHost(s->pin);
    (void)cudaGetLastError();
  }
  hvd__gpu_close(&s->gpu);
  free(s->hreqs);
  free(s->hptrs);
  free(s);
}

const hvd__executor_t hvd__staged_executor = {
    .name = "mpi-staged",
    .open = staged_open,
    .close = staged_close,
    .run =
        {
            [HVD__ALLREDUCE] = staged_allreduce,
            [HVD__BROADCAST] = staged_broadcast,
            [HVD__ALLGATHER] = staged_allgather,
            [HVD__ALLTOALL] = staged_alltoall,
            [HVD__REDUCESCATTER] = staged_reducescatter,
            /* no tensor: MPI, as on the host */
            [HVD__BARRIER] = hvd__mpi_barrier,
        },
    .stub_alloc = hvd__gpu_stub_alloc,
    .stub_free = hvd__gpu_stub_free,
};
