/*
 * errors.h - result codes and the per-thread detailed message behind
 * hvd_last_error(). Every failure path sets the message with
 * hvd__set_error() and returns its code; foreign codes (MPI, pthread,
 * errno) are converted here so their text is kept.
 */
#ifndef HVD_BASE_ERRORS_H
#define HVD_BASE_ERRORS_H

#include "internal.h"

#define HVD__ERRMSG_MAX 1024

/* Sets this thread's message and returns rc. */
hvd_result_t hvd__set_error(hvd_result_t rc, const char *fmt, ...)
    HVD__PRINTF(2, 3);
/* Copies msg verbatim as this thread's message; returns rc. */
hvd_result_t hvd__set_error_msg(hvd_result_t rc, const char *msg);
void hvd__clear_error(void);

/* The failure that stopped hvd in this process (a stall, the engine's
 * MPI or NCCL failing), kept past hvd_shutdown: at exit the process must
 * not wait for peers that hvd gave up on (runtime.c's exit handler). The
 * first one set is kept; hvd__fatal returns HVD_SUCCESS when none, else
 * its code with its reason copied into reason[len]. */
void hvd__fatal_set(hvd_result_t rc, const char *reason);
hvd_result_t hvd__fatal(char *reason, size_t len);

/* A buffer kept across calls: *buf grown to at least n bytes (*cap says
 * how many it has); HVD_ERR_NO_MEMORY "could not allocate N bytes for
 * the <what>" when it cannot be, *buf then unchanged. */
hvd_result_t hvd__grow(void **buf, size_t *cap, size_t n, const char *what);

/* The ranks that disagree with a reference rank, and their values, as
 * hvd's mismatch messages list them: "<head> vs rank 2 W, rank 3 X",
 * at most HVD__RANKS_LISTED ranks named, then ", and N more ranks".
 * hvd__ranks_begin empties l; hvd__ranks_add adds a rank and its value in
 * words; hvd__ranks_write writes the message into out when a rank was
 * added and returns how many were (0: nothing written).
 * A list of ranks alone ("waited for rank(s) 1, 3"): values NULL, each
 * item its number; hvd__ranks_list writes "1, 3", or "1, ..., 8, and N
 * more ranks" past HVD__RANKS_LISTED ("" when none), and returns how
 * many ranks were added. */
#define HVD__RANKS_LISTED 8
typedef struct hvd__ranks {
  char items[HVD__ERRMSG_MAX];
  size_t at;
  int listed, more;
} hvd__ranks_t;
void hvd__ranks_begin(hvd__ranks_t *l);
void hvd__ranks_add(hvd__ranks_t *l, int rank, const char *value);
int hvd__ranks_write(const hvd__ranks_t *l, const char *head, char *out,
                     size_t cap);
int hvd__ranks_list(const hvd__ranks_t *l, char *out, size_t cap);

/* HVD_ERR_MPI with "<what>: <MPI's error string>". */
hvd_result_t hvd__mpi_error(int mpi_rc, const char *what);

/* Jump to the function's `fail:` label when an MPI call fails. Needs a
 * local `hvd_result_t rc`. */
#define HVD__MPI_CHECK(call)                                                   \
  do {                                                                         \
    int hvd__mpi_rc_ = (call);                                                 \
    if (hvd__mpi_rc_ != 0) {                                                   \
      rc = hvd__mpi_error(hvd__mpi_rc_, #call);                                \
      goto fail;                                                               \
    }                                                                          \
  } while (0)

/* Jump to `fail:` when an hvd call fails (the message is already set). */
#define HVD__CHECK(call)                                                       \
  do {                                                                         \
    rc = (call);                                                               \
    if (rc != HVD_SUCCESS)                                                     \
      goto fail;                                                               \
  } while (0)

#endif /* HVD_BASE_ERRORS_H */
