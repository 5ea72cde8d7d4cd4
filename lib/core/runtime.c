/*
 * runtime.c - hvd_init/hvd_shutdown, topology and build facts.
 *
 * MPI is initialised only if the program has not, and then finalised at
 * process exit (not in hvd_shutdown), so hvd_shutdown() followed by
 * hvd_init() works. hvd always works on its own duplicate of the
 * communicator, with MPI_ERRORS_RETURN.
 */
#include "core/runtime.h"

#include <config.h>
#include <mpi.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/device.h"
#include "base/errors.h"
#include "base/log.h"
#include "base/settings.h"
#include "hvd_mpi.h"

static struct {
  pthread_mutex_t mu;  /* serialises init and shutdown */
  pthread_rwlock_t rw; /* submissions (read) vs. shutdown (write) */
  atomic_int initialized;
  int owns_mpi;
  int atexit_registered;
  MPI_Comm comm, local_comm, cross_comm;
  int rank, size, local_rank, local_size, cross_rank, cross_size;
  int homogeneous;
  hvd__settings_t settings;
  hvd__engine_t *engine;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .rw = PTHREAD_RWLOCK_INITIALIZER};

hvd__engine_t *hvd__runtime_engine(void) {
  return atomic_load(&g.initialized) ? g.engine : NULL;
}

hvd_result_t hvd__runtime_submit(const char *fn, hvd_request_t *r) {
  pthread_rwlock_rdlock(&g.rw);
  hvd_result_t rc = atomic_load(&g.initialized)
                        ? hvd__engine_submit(g.engine, r)
                        : hvd__not_initialized(fn);
  pthread_rwlock_unlock(&g.rw);
  return rc;
}

hvd_result_t hvd__not_initialized(const char *fn) {
  return hvd__set_error(HVD_ERR_NOT_INITIALIZED,
                        "%s: hvd_init() has not been called", fn);
}

int hvd_is_initialized(void) { return atomic_load(&g.initialized); }

int hvd_cuda_device(void) {
  return hvd_is_initialized() ? hvd__cuda_device() : -1;
}

#define QUERY(fn, field)                                                       \
  int fn(void) { return atomic_load(&g.initialized) ? g.field : -1; }
QUERY(hvd_rank, rank)
QUERY(hvd_size, size)
QUERY(hvd_local_rank, local_rank)
QUERY(hvd_local_size, local_size)
QUERY(hvd_cross_rank, cross_rank)
QUERY(hvd_cross_size, cross_size)
QUERY(hvd_is_homogeneous, homogeneous)

int hvd_mpi_built(void) { return 1; }
const char *hvd_version(void) { return PACKAGE_VERSION; }

static void free_comm(MPI_Comm *c) {
  if (*c != MPI_COMM_NULL)
    MPI_Comm_free(c);
  *c = MPI_COMM_NULL;
}

/* Local = same node: shared memory, or equal HVD_HOSTNAME. Cross = same
 * local rank. */
static hvd_result_t topology(void) {
  hvd_result_t rc = HVD_SUCCESS;
  char *names = NULL;
  int set = g.settings.hostname[0] != '\0', minmax[2] = {set, -set};
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_INT, MPI_MAX, g.comm));
  if (minmax[0] != -minmax[1]) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "HVD_HOSTNAME is set on some ranks but not on others "
                        "(rank %d: %s)",
                        g.rank, set ? g.settings.hostname : "unset");
    goto fail;
  }
  if (set) {
    names = malloc((size_t)g.size * HVD__HOSTNAME_MAX);
    if (names == NULL) {
      rc = hvd__set_error(HVD_ERR_NO_MEMORY, "host names");
      goto fail;
    }
    HVD__MPI_CHECK(MPI_Allgather(g.settings.hostname, HVD__HOSTNAME_MAX,
                                 MPI_CHAR, names, HVD__HOSTNAME_MAX, MPI_CHAR,
                                 g.comm));
    int color = 0;
    while (strcmp(names + (size_t)color * HVD__HOSTNAME_MAX,
                  g.settings.hostname) != 0)
      color++;
    HVD__MPI_CHECK(MPI_Comm_split(g.comm, color, g.rank, &g.local_comm));
  } else {
    HVD__MPI_CHECK(MPI_Comm_split_type(g.comm, MPI_COMM_TYPE_SHARED, g.rank,
                                       MPI_INFO_NULL, &g.local_comm));
  }
  HVD__MPI_CHECK(MPI_Comm_rank(g.local_comm, &g.local_rank));
  HVD__MPI_CHECK(MPI_Comm_size(g.local_comm, &g.local_size));
  HVD__MPI_CHECK(MPI_Comm_split(g.comm, g.local_rank, g.rank, &g.cross_comm));
  HVD__MPI_CHECK(MPI_Comm_rank(g.cross_comm, &g.cross_rank));
  HVD__MPI_CHECK(MPI_Comm_size(g.cross_comm, &g.cross_size));
  minmax[0] = g.local_size;
  minmax[1] = -g.local_size;
  HVD__MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, minmax, 2, MPI_INT, MPI_MAX, g.comm));
  g.homogeneous = minmax[0] == -minmax[1];
fail:
  free(names);
  return rc;
}

static hvd_result_t init_locked(MPI_Comm comm) {
  hvd_result_t rc = HVD_SUCCESS;
  g.comm = g.local_comm = g.cross_comm = MPI_COMM_NULL;
  HVD__CHECK(hvd__settings_load(&g.settings));
  hvd__log_threshold = g.settings.log_level;
  HVD__MPI_CHECK(MPI_Comm_dup(comm, &g.comm));
  HVD__MPI_CHECK(MPI_Comm_set_errhandler(g.comm, MPI_ERRORS_RETURN));
  HVD__MPI_CHECK(MPI_Comm_rank(g.comm, &g.rank));
  HVD__MPI_CHECK(MPI_Comm_size(g.comm, &g.size));
  hvd__log_set_rank(g.rank);
  HVD__CHECK(topology());
  HVD__CHECK(hvd__cuda_bind(g.comm, g.local_comm, g.settings.no_bind));
  hvd__exec_env_t env = {.comm = g.comm,
                         .rank = g.rank,
                         .size = g.size,
                         .local_comm = g.local_comm,
                         .cross_comm = g.cross_comm,
                         .local_rank = g.local_rank,
                         .local_size = g.local_size};
  HVD__CHECK(hvd__engine_start(&env, &g.settings, &g.engine));
  if (g.rank == 0) {
    hvd__settings_log(&g.settings);
    HVD__LOG(HVD__LOG_INFO,
             "hvd %s: %d ranks, %d per node (homogeneous %d), %d GPUs "
             "visible, CUDA %d, NCCL %d",
             PACKAGE_VERSION, g.size, g.local_size, g.homogeneous,
             hvd__cuda_device_count(), hvd_cuda_built(), hvd_nccl_built());
  }
  atomic_store(&g.initialized, 1);
  return HVD_SUCCESS;
fail:
  free_comm(&g.cross_comm);
  free_comm(&g.local_comm);
  free_comm(&g.comm);
  return rc;
}

hvd_result_t hvd_init_comm(MPI_Comm comm) {
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (!up || down)
    return hvd__set_error(HVD_ERR_INVALID_ARG,
                          "hvd_init_comm: MPI is %s; call MPI_Init first or "
                          "use hvd_init()",
                          down ? "finalized" : "not initialized");
  pthread_mutex_lock(&g.mu);
  hvd_result_t rc =
      atomic_load(&g.initialized) ? HVD_SUCCESS : init_locked(comm);
  pthread_mutex_unlock(&g.mu);
  return rc;
}

static void at_exit(void) {
  hvd_shutdown();
  int down = 0;
  MPI_Finalized(&down);
  if (g.owns_mpi && !down)
    MPI_Finalize();
}

hvd_result_t hvd_init(void) {
  hvd_result_t rc = HVD_SUCCESS;
  pthread_mutex_lock(&g.mu);
  if (atomic_load(&g.initialized))
    goto done;
  int up = 0, down = 0;
  MPI_Initialized(&up);
  MPI_Finalized(&down);
  if (down) {
    rc = hvd__set_error(HVD_ERR_INVALID_ARG,
                        "hvd_init: MPI has been finalized; hvd cannot start "
                        "after MPI_Finalize()");
    goto done;
  }
  if (!up) {
    int provided = 0;
    int mrc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (mrc != MPI_SUCCESS) {
      rc = hvd__mpi_error(mrc, "MPI_Init_thread");
      goto done;
    }
    g.owns_mpi = 1;
    if (!g.atexit_registered && atexit(at_exit) == 0)
      g.atexit_registered = 1;
  }
  rc = init_locked(MPI_COMM_WORLD);
done:
  pthread_mutex_unlock(&g.mu);
  return rc;
}

hvd_result_t hvd_shutdown(void) {
  pthread_mutex_lock(&g.mu);
  if (atomic_load(&g.initialized)) {
    pthread_rwlock_wrlock(&g.rw); /* no submission is half done */
    atomic_store(&g.initialized, 0);
    pthread_rwlock_unlock(&g.rw);
    hvd__engine_stop(g.engine);
    g.engine = NULL;
    free_comm(&g.cross_comm);
    free_comm(&g.local_comm);
    free_comm(&g.comm);
  }
  pthread_mutex_unlock(&g.mu);
  return HVD_SUCCESS;
}
