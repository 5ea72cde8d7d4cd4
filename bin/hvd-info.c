/*
 * hvd-info - what this hvd was built with and how it is configured:
 *
 *   hvd-info [--build] [--json]
 *
 * Prints hvd's version, the backends libhvd was built with (MPI; CUDA
 * runtime, NCCL and cuBLAS with their versions, or no), the number of GPUs
 * the CUDA runtime sees (0 without a GPU, a driver, or CUDA in the build),
 * and the effective value of every HVD_* variable: the environment's when
 * set, else the default, with its meaning. --build prints the backends
 * only; --json prints the same as one JSON document.
 *
 * Each variable set in the environment is parsed as hvd_init() would
 * (hvd_setting_check): a value hvd_init() would refuse is shown with the
 * reason and makes the exit status 1 (the reason on stderr too). HVD_*
 * names hvd does not read and HOROVOD_* ones are listed with the nearest
 * hvd variable (hvd_setting_unknown), as hvd_init() warns.
 *
 * Inside a Slurm job (SLURM_JOB_ID set) one line says which: its id, its
 * nodes (SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST), its tasks
 * (SLURM_NTASKS) and tasks per node (SLURM_TASKS_PER_NODE, e.g.
 * "2(x3),1"), and in a step's task (srun) that task's SLURM_PROCID and
 * SLURM_LOCALID; "?" for a variable that is not set. --json: "slurm", an
 * object of those strings (null when unset), or null outside a job.
 *
 * Needs no mpirun: hvd_init() is never called (the build facts and the
 * settings table are valid at any time). Exit status: 0; 1 when a setting
 * is invalid or the output could not be written; 2 for a bad command
 * line.
 */
#include <config.h>

#include <hvd.h>
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

#ifdef HVD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static const char usage_text[] =
    "usage: hvd-info [--build] [--json]\n"
    "\n"
    "Prints hvd's version, the backends libhvd was built with, the GPUs\n"
    "visible, the Slurm job when inside one, and every HVD_* variable with\n"
    "its effective value (from the environment, else the default) and\n"
    "meaning.\n"
    "\n"
    "  --build      print only the backends\n"
    "  --json       print one JSON document\n"
    "  --version    print the version\n"
    "  -h, --help   this text\n";

/* The facts, gathered once. */
typedef struct info {
  int cuda;   /* CUDA runtime version code, or 0 */
  int nccl;   /* NCCL version code, or 0 */
  int cublas; /* configure builds cuBLAS in exactly when CUDA */
  char mpi_library[MPI_MAX_LIBRARY_VERSION_STRING];
  int gpus;
  const char *gpus_note; /* why gpus is 0, or NULL */
} info_t;

static void gather(info_t *in) {
  memset(in, 0, sizeof *in);
  in->cuda = hvd_cuda_built();
  in->nccl = hvd_nccl_built();
  in->cublas = in->cuda != 0;

  /* Valid before MPI_Init (MPI 3.0); keep the first line only. */
  int len = 0;
  if (MPI_Get_library_version(in->mpi_library, &len) != MPI_SUCCESS)
    in->mpi_library[0] = '\0';
  in->mpi_library[strcspn(in->mpi_library, "\r\n")] = '\0';
  len = (int)strlen(in->mpi_library);
  while (len > 0 &&
         (in->mpi_library[len - 1] == ' ' || in->mpi_library[len - 1] == ','))
    in->mpi_library[--len] = '\0';

#ifdef HVD_HAVE_CUDA
  cudaError_t e = cudaGetDeviceCount(&in->gpus);
  if (e != cudaSuccess) {
    in->gpus = 0;
    (void)cudaGetLastError(); /* clear the sticky error */
    in->gpus_note = hvd_cuda_unavailable();
  }
#else
  in->gpus_note = "built without CUDA";
#endif
}

/* "12.4" from CUDART_VERSION 12040. */
static void cuda_version(int v, char *buf, size_t n) {
  snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* "2.27.3" from NCCL_VERSION_CODE 22703 (2.9 and later), or 2708 (older). */
static void nccl_version(int v, char *buf, size_t n) {
  if (v >= 20900)
    snprintf(buf, n, "%d.%d.%d", v / 10000, (v % 10000) / 100, v % 100);
  else
    snprintf(buf, n, "%d.%d.%d", v / 1000, (v % 1000) / 100, v % 100);
}

/* The value of setting i from the environment, or NULL when unset (empty
 * counts as unset, as for hvd_init). */
static const char *env_value(const char *name) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? v : NULL;
}

/* ---- the Slurm job (salloc, sbatch, srun), from its variables ---- */

static const char *const slurm_vars[] = {
    "SLURM_JOB_ID",  "SLURM_JOB_NUM_NODES",  "SLURM_JOB_NODELIST",
    "SLURM_NTASKS",  "SLURM_TASKS_PER_NODE", "SLURM_PROCID",
    "SLURM_LOCALID",
};
#define SLURM_NVARS (int)(sizeof slurm_vars / sizeof slurm_vars[0])

static const char *or_unknown(const char *v) { return v != NULL ? v : "?"; }

static void print_slurm(void) {
  const char *v[SLURM_NVARS];
  for (int i = 0; i < SLURM_NVARS; i++)
    v[i] = env_value(slurm_vars[i]);
  if (v[0] == NULL)
    return;
  printf("Slurm job: %s, %s nodes (%s), %s tasks (per node %s)", v[0],
         or_unknown(v[1]), or_unknown(v[2]), or_unknown(v[3]),
         or_unknown(v[4]));
  if (v[5] != NULL)
    printf("; this task: SLURM_PROCID %s, SLURM_LOCALID %s", v[5],
           or_unknown(v[6]));
  putchar('\n');
}

static int is_unset(const char *default_value) {
  return strcmp(default_value, "(unset)") == 0;
}

/* ---- text ---- */

static void print_backends(const info_t *in, const char *indent) {
  char ver[32];
  /* "Open MPI v4.1.4, package: ..., ident: ...": up to the first comma. */
  if (in->mpi_library[0] != '\0')
    printf("%sMPI: yes (%.*s)\n", indent, (int)strcspn(in->mpi_library, ","),
           in->mpi_library);
  else
    printf("%sMPI: yes\n", indent);
  if (in->cuda != 0) {
    cuda_version(in->cuda, ver, sizeof ver);
    printf("%sCUDA: yes, runtime %s (%d)\n", indent, ver, in->cuda);
  } else {
    printf("%sCUDA: no\n", indent);
  }
  if (in->nccl != 0) {
    nccl_version(in->nccl, ver, sizeof ver);
    printf("%sNCCL: yes, %s (%d)\n", indent, ver, in->nccl);
  } else {
    printf("%sNCCL: no\n", indent);
  }
  printf("%scuBLAS: %s\n", indent, in->cublas ? "yes" : "no");
}

/* The reason setting i would fail hvd_init(), or NULL. */
static const char *invalid(int i) {
  return hvd_setting_check(i) != HVD_SUCCESS ? hvd_last_error() : NULL;
}

static void print_text(const info_t *in) {
  printf("hvd %s\n", hvd_version());
  printf("backends:\n");
  print_backends(in, "  ");
  if (in->gpus_note != NULL)
    printf("GPUs visible: %d (%s)\n", in->gpus, in->gpus_note);
  else
    printf("GPUs visible: %d\n", in->gpus);
  print_slurm();
  printf("settings (the value from the environment, else the default):\n");
  for (int i = 0; i < hvd_setting_count(); i++) {
    const char *name, *def, *meaning;
    if (hvd_setting_info(i, &name, &def, &meaning) != HVD_SUCCESS)
      continue;
    const char *v = env_value(name);
    const char *bad = invalid(i);
    if (bad != NULL)
      printf("  %s=%s (from the environment) INVALID: %s; hvd_init() would "
             "fail\n",
             name, v, bad);
    else if (v != NULL)
      printf("  %s=%s (from the environment; default %s)\n", name, v, def);
    else if (is_unset(def))
      printf("  %s unset (default)\n", name);
    else
      printf("  %s=%s (default)\n", name, def);
    printf("      %s\n", meaning);
  }
  char msg[512];
  for (int k = 0; hvd_setting_unknown(k, msg, sizeof msg); k++)
    printf("%s  %s\n", k == 0 ? "not read by hvd:\n" : "", msg);
}

/* ---- JSON ---- */

static void json_string(const char *s) {
  if (s == NULL) {
    fputs("null", stdout);
    return;
  }
  putchar('"');
  hvd__json_escape(s, hvd__json_put_file, stdout);
  putchar('"');
}

static void json_backends(const info_t *in) {
  char ver[32];
  printf("{\"mpi\": true, \"mpi_library\": ");
  json_string(in->mpi_library[0] != '\0' ? in->mpi_library : NULL);
  printf(", \"cuda\": %s, \"cuda_runtime_version\": ",
         in->cuda ? "true" : "false");
  cuda_version(in->cuda, ver, sizeof ver);
  json_string(in->cuda ? ver : NULL);
  printf(", \"cuda_runtime_version_code\": %d", in->cuda);
  printf(", \"nccl\": %s, \"nccl_version\": ", in->nccl ? "true" : "false");
  nccl_version(in->nccl, ver, sizeof ver);
  json_string(in->nccl ? ver : NULL);
  printf(", \"nccl_version_code\": %d", in->nccl);
  printf(", \"cublas\": %s}", in->cublas ? "true" : "false");
}

static void json_slurm(void) {
  if (env_value(slurm_vars[0]) == NULL) {
    fputs("null", stdout);
    return;
  }
  putchar('{');
  for (int i = 0; i < SLURM_NVARS; i++) {
    printf("%s", i ? ", " : "");
    json_string(slurm_vars[i]);
    printf(": ");
    json_string(env_value(slurm_vars[i]));
  }
  putchar('}');
}

static void print_json(const info_t *in, int build_only) {
  if (build_only) {
    printf("{\"backends\": ");
    json_backends(in);
    printf("}\n");
    return;
  }
  printf("{\n  \"version\": ");
  json_string(hvd_version());
  printf(",\n  \"backends\": ");
  json_backends(in);
  printf(",\n  \"gpus_visible\": %d,\n  \"gpus_note\": ", in->gpus);
  json_string(in->gpus_note);
  printf(",\n  \"slurm\": ");
  json_slurm();
  printf(",\n  \"settings\": [");
  int first = 1;
  for (int i = 0; i < hvd_setting_count(); i++) {
    const char *name, *def, *meaning;
    if (hvd_setting_info(i, &name, &def, &meaning) != HVD_SUCCESS)
      continue;
    const char *v = env_value(name);
    const char *d = is_unset(def) ? NULL : def;
    printf("%s\n    {\"name\": ", first ? "" : ",");
    first = 0;
    json_string(name);
    printf(", \"value\": ");
    json_string(v != NULL ? v : d);
    printf(", \"default\": ");
    json_string(d);
    printf(", \"source\": \"%s\", \"meaning\": ",
           v != NULL ? "environment" : "default");
    json_string(meaning);
    printf(", \"error\": ");
    json_string(invalid(i));
    putchar('}');
  }
  printf("\n  ],\n  \"unknown\": [");
  char msg[512];
  for (int k = 0; hvd_setting_unknown(k, msg, sizeof msg); k++) {
    printf("%s", k ? ", " : "");
    json_string(msg);
  }
  printf("]\n}\n");
}

int main(int argc, char **argv) {
  int build_only = 0, json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--build") == 0) {
      build_only = 1;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = 1;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      fputs(usage_text, stdout);
      return 0;
    } else if (strcmp(argv[i], "--version") == 0) {
      printf("hvd-info (hvd) %s\n", hvd_version());
      return 0;
    } else {
      fprintf(stderr, "hvd-info: unknown option '%s' (try hvd-info --help)\n",
              argv[i]);
      return 2;
    }
  }
  info_t in;
  gather(&in);
  if (json)
    print_json(&in, build_only);
  else if (build_only)
    print_backends(&in, "");
  else
    print_text(&in);
  int bad = 0;
  for (int i = 0; !build_only && i < hvd_setting_count(); i++)
    if (invalid(i) != NULL) {
      fprintf(stderr, "hvd-info: %s (hvd_init would fail)\n", hvd_last_error());
      bad = 1;
    }
  return fflush(stdout) == 0 && !bad ? 0 : 1;
}
