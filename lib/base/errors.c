/* errors.c - result strings (from HVD_RESULT_LIST) and hvd_last_error(). */
#include "base/errors.h"

#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/end_record.h"

static _Thread_local char last_error[HVD__ERRMSG_MAX];

const char *hvd_strerror(hvd_result_t rc) {
  switch (rc) {
#define HVD__RESULT_CASE(name, code, text)                                     \
  case name:                                                                   \
    return text;
    HVD_RESULT_LIST(HVD__RESULT_CASE)
#undef HVD__RESULT_CASE
  default:
    return "unknown result";
  }
}

const char *hvd_last_error(void) { return last_error; }

hvd_result_t hvd__set_error(hvd_result_t rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return rc;
}

hvd_result_t hvd__set_error_msg(hvd_result_t rc, const char *msg) {
  if (msg != last_error)
    snprintf(last_error, sizeof last_error, "%s", msg ? msg : "");
  return rc;
}

void hvd__clear_error(void) { last_error[0] = '\0'; }

hvd_result_t hvd__mpi_error(int mpi_rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING] = "";
  int len = 0;
  if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error %d", mpi_rc);
  int fn = (int)strcspn(what, "("); /* "MPI_Allreduce(a, b)" -> the name */
  return hvd__set_error(HVD_ERR_MPI, "%.*s: %s", fn, what, text);
}

const char *hvd__coll_name(int coll) {
  static const char *const names[] = {
#define HVD__COLL_WORD(id, word) word,
      HVD__COLL_LIST(HVD__COLL_WORD)
#undef HVD__COLL_WORD
  };
  if (coll < 0 || coll >= HVD__COLL_COUNT)
    return "unknown";
  return names[coll];
}

static pthread_mutex_t fatal_mu = PTHREAD_MUTEX_INITIALIZER;
static hvd_result_t fatal_rc = HVD_SUCCESS;
static char fatal_reason[HVD__ERRMSG_MAX];

void hvd__fatal_set(hvd_result_t rc, const char *reason) {
  pthread_mutex_lock(&fatal_mu);
  if (fatal_rc == HVD_SUCCESS && rc != HVD_SUCCESS) {
    fatal_rc = rc;
    snprintf(fatal_reason, sizeof fatal_reason, "%s", reason);
    hvd__end_record_error(fatal_reason); /* for hvdrun, should it die */
  }
  pthread_mutex_unlock(&fatal_mu);
}

hvd_result_t hvd__grow(void **buf, size_t *cap, size_t n, const char *what) {
  if (n <= *cap)
    return HVD_SUCCESS;
  void *p = realloc(*buf, n);
  if (p == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "could not allocate %zu bytes for the %s", n, what);
  *buf = p;
  *cap = n;
  return HVD_SUCCESS;
}

hvd_result_t hvd__fatal(char *reason, size_t len) {
  pthread_mutex_lock(&fatal_mu);
  hvd_result_t rc = fatal_rc;
  if (len > 0)
    snprintf(reason, len, "%s", fatal_reason);
  pthread_mutex_unlock(&fatal_mu);
  return rc;
}

void hvd__ranks_begin(hvd__ranks_t *l) {
  l->items[0] = '\0';
  l->at = 0;
  l->listed = l->more = 0;
}

void hvd__ranks_add(hvd__ranks_t *l, int rank, const char *value) {
  if (l->listed == HVD__RANKS_LISTED) {
    l->more++;
    return;
  }
  char *at = l->items + l->at;
  size_t room = sizeof l->items - l->at;
  const char *sep = l->listed ? ", " : "";
  if (l->at < sizeof l->items)
    l->at += (size_t)(value != NULL
                          ? snprintf(at, room, "%srank %d %s", sep, rank, value)
                          : snprintf(at, room, "%s%d", sep, rank));
  l->listed++;
}

int hvd__ranks_list(const hvd__ranks_t *l, char *out, size_t cap) {
  if (l->more)
    snprintf(out, cap, "%s, and %d more ranks", l->items, l->more);
  else
    snprintf(out, cap, "%s", l->items);
  return l->listed + l->more;
}

int hvd__ranks_write(const hvd__ranks_t *l, const char *head, char *out,
                     size_t cap) {
  if (l->listed == 0)
    return 0;
  if (l->more)
    snprintf(out, cap, "%s vs %s, and %d more ranks", head, l->items, l->more);
  else
    snprintf(out, cap, "%s vs %s", head, l->items);
  return l->listed + l->more;
}
