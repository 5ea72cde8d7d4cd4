/*
 * dlclose.c - a program that loads libhvd with dlopen and unloads it with
 * dlclose, as a plugin host or an interpreter unloading a module does.
 * hvd_init leaves code of libhvd's behind that outlives the handle: the
 * attribute on MPI_COMM_SELF whose delete callback MPI_Finalize runs, its
 * fork handlers and, without hvd_shutdown, its engine threads. libhvd is
 * linked with -z nodelete, so dlclose keeps it mapped (before: a
 * segmentation fault in dlclose with the engine running, or in
 * MPI_Finalize after an hvd_shutdown).
 *
 * The program links no libhvd: it reads the shared library's name from the
 * build tree's lib/libhvd.la (dlname) and skips when the build made none.
 * Round one: hvd_init, an allreduce, hvd_shutdown, dlclose. Round two: the
 * library opened again, hvd_init again, an allreduce, dlclose with the
 * engine running, a fork, MPI_Finalize (which shuts hvd down). The checks
 * after MPI_Finalize cannot be collective: a rank that fails one says so
 * on stderr and exits 1.
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hvd.h"
#include "tap/tap.h"

#ifndef HVD_TEST_LIBDIR
#error "HVD_TEST_LIBDIR: the build tree's lib directory"
#endif

/* The calls this test makes, looked up in the loaded library. */
struct api {
  hvd_result_t (*init)(void);
  hvd_result_t (*shutdown)(void);
  int (*is_initialized)(void);
  const char *(*last_error)(void);
  hvd_tensor_t (*tensor_make)(void *, hvd_dtype_t, int, const int64_t *);
  hvd_result_t (*allreduce)(const char *, const hvd_tensor_t *, hvd_tensor_t *,
                            hvd_op_t, double, double);
};

static int rank, size;

/* The shared library's path from libtool's dlname='...' line of
 * lib/libhvd.la; 0 when there is none (a static-only build). */
static int library_path(char *out, size_t n) {
  FILE *f = fopen(HVD_TEST_LIBDIR "/libhvd.la", "r");
  if (f == NULL)
    bail("cannot open %s/libhvd.la", HVD_TEST_LIBDIR);
  char line[512], name[256] = "";
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "dlname='%255[^']'", name) == 1)
      break;
  fclose(f);
  if (name[0] == '\0')
    return 0;
  snprintf(out, n, "%s/.libs/%s", HVD_TEST_LIBDIR, name);
  return 1;
}

static void *must_sym(void *h, const char *name) {
  void *p = dlsym(h, name);
  if (p == NULL)
    bail("dlsym %s: %s", name, dlerror());
  return p;
}

static void *open_api(const char *path, struct api *a) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL)
    bail("dlopen %s: %s", path, dlerror());
  /* POSIX lets dlsym's object pointer be cast to a function pointer. */
  a->init = (hvd_result_t(*)(void))must_sym(h, "hvd_init");
  a->shutdown = (hvd_result_t(*)(void))must_sym(h, "hvd_shutdown");
  a->is_initialized = (int (*)(void))must_sym(h, "hvd_is_initialized");
  a->last_error = (const char *(*)(void))must_sym(h, "hvd_last_error");
  a->tensor_make = (hvd_tensor_t(*)(
      void *, hvd_dtype_t, int, const int64_t *))must_sym(h, "hvd_tensor_make");
  a->allreduce =
      (hvd_result_t(*)(const char *, const hvd_tensor_t *, hvd_tensor_t *,
                       hvd_op_t, double, double))must_sym(h, "hvd_allreduce");
  return h;
}

/* hvd_init through the loaded library, then an allreduce of rank + i
 * whose exact sums are checked. */
static void init_and_reduce(const struct api *a, const char *round) {
  if (!is_int(HVD_SUCCESS, a->init(), "%s: hvd_init", round))
    bail("hvd_init: %s", a->last_error());
  float x[5];
  int64_t five = 5;
  for (int i = 0; i < 5; i++)
    x[i] = (float)(rank + i);
  hvd_tensor_t t = a->tensor_make(x, HVD_FLOAT32, 1, &five);
  char name[32];
  snprintf(name, sizeof name, "dl.%s", round);
  is_int(HVD_SUCCESS, a->allreduce(name, &t, &t, HVD_SUM, 1, 1),
         "%s: an allreduce", round);
  int bad = 0;
  for (int i = 0; i < 5; i++)
    bad += x[i] != (float)(size * (size - 1) / 2 + size * i);
  is_int(0, bad, "%s: its sums are exact", round);
}

/* Whether path is still mapped after the dlclose just made. */
static int still_loaded(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (h != NULL)
    dlclose(h);
  return h != NULL;
}

/* A child that exits at once: the fork handlers of the (closed) library
 * run in the parent and the child. 0 when the child exited 0. */
static int fork_child(void) {
  pid_t pid = fork();
  if (pid == 0)
    _exit(0);
  int st = 0;
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
                 WEXITSTATUS(st) == 0
             ? 0
             : 1;
}

int main(int argc, char **argv) {
  tap_mpi_init_program(&argc, &argv);
  rank = tap_rank();
  size = tap_size();
  char path[1024];
  if (!library_path(path, sizeof path))
    skip_all("this build made no shared libhvd");
  struct api a;
  void *h = open_api(path, &a);
  init_and_reduce(&a, "one");
  is_int(HVD_SUCCESS, a.shutdown(), "one: hvd_shutdown");
  is_int(0, dlclose(h), "one: dlclose");
  ok(still_loaded(path), "one: libhvd stays loaded after dlclose");

  h = open_api(path, &a);
  init_and_reduce(&a, "two");
  is_int(0, dlclose(h), "two: dlclose with hvd running");
  ok(still_loaded(path), "two: libhvd stays loaded after dlclose");
  is_int(0, fork_child(), "two: a fork after the dlclose");
  int status = tap_mpi_finish();
  MPI_Finalize(); /* hvd is still running: MPI_Finalize shuts it down */
  if (a.is_initialized()) {
    fprintf(stderr, "dlclose: rank %d: hvd still initialised\n", rank);
    return 1;
  }
  return status;
}
