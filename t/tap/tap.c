/*
 * tap.c - the TAP library of hvd's tests (see tap.h).
 *
 * Every check goes through one function, report(): in MPI mode it agrees on
 * the result with an MPI_Allreduce(MIN) and, when some rank failed, gathers
 * each rank's diagnostic to rank 0, which prints everything. The counters
 * therefore stay identical on all ranks.
 */
#include "tap.h"

#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAP_LINE 512 /* longest diagnostic kept per rank and check */

static int planned = -1; /* the plan printed, or -1 */
static int checks;       /* checks run (and skipped) */
static int failures;
static int plan_warned;
static int mpi_mode;  /* tap_mpi_init was called */
static int mpi_owned; /* ... and initialised MPI */
static int my_rank;
static int world_size = 1;
/* A duplicate of MPI_COMM_WORLD, made at the first check (every check is
 * collective), not in tap_mpi_init: MPI_Comm_dup communicates, and a
 * program's first messages should be hvd_init's, which connects the ranks
 * in order (HVD_MPI_PRECONNECT). */
static MPI_Comm comm = MPI_COMM_NULL;

static MPI_Comm tap_comm(void) {
  if (comm == MPI_COMM_NULL)
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return comm;
}
static char note[TAP_LINE]; /* tap_note() for the next check */

/* Prints text on f, each line preceded by prefix. */
static void print_lines(FILE *f, const char *prefix, const char *text) {
  const char *p = text;
  do {
    const char *nl = strchr(p, '\n');
    int len = nl ? (int)(nl - p) : (int)strlen(p);
    fprintf(f, "%s%.*s\n", prefix, len, p);
    p = nl ? nl + 1 : NULL;
  } while (p && *p);
  fflush(f);
}

static void vformat(char *buf, size_t n, const char *fmt, va_list ap) {
  if (!fmt) {
    buf[0] = '\0';
    return;
  }
  vsnprintf(buf, n, fmt, ap);
  for (char *c = buf; *c; c++) /* a description is one line */
    if (*c == '\n')
      *c = ' ';
}

/* Records one check. passed and detail (may be NULL) are this process's;
 * the description (fmt, ap) is rank 0's. Returns the agreed result. */
static int report(int passed, const char *detail, const char *fmt, va_list ap) {
  char desc[TAP_LINE], mine[TAP_LINE];
  char *all = NULL;
  int agreed = passed ? 1 : 0;

  vformat(desc, sizeof desc, fmt, ap);
  mine[0] = '\0';
  if (!passed) {
    const char *d = detail && *detail ? detail : note[0] ? NULL : "failed";
    snprintf(mine, sizeof mine, "%.300s%s%.200s", d ? d : "",
             d && note[0] ? "; " : "", note);
  }
  note[0] = '\0';

  if (mpi_mode) {
    int mine_ok = agreed;
    MPI_Allreduce(&mine_ok, &agreed, 1, MPI_INT, MPI_MIN, tap_comm());
    if (!agreed) {
      if (my_rank == 0)
        all = malloc((size_t)world_size * TAP_LINE);
      MPI_Gather(mine, TAP_LINE, MPI_CHAR, all, TAP_LINE, MPI_CHAR, 0,
                 tap_comm());
    }
  }
  checks++;
  if (!agreed)
    failures++;
  if (my_rank != 0)
    return agreed;

  printf("%sok %d%s%s\n", agreed ? "" : "not ", checks, desc[0] ? " - " : "",
         desc);
  if (!agreed && mpi_mode) {
    for (int r = 0; all && r < world_size; r++) {
      const char *line = all + (size_t)r * TAP_LINE;
      if (line[0])
        printf("#   rank %d: %.*s\n", r, TAP_LINE, line);
    }
  } else if (!agreed) {
    print_lines(stdout, "#   ", mine);
  }
  fflush(stdout);
  free(all);
  return agreed;
}

void plan(int n) {
  if (planned >= 0)
    bail("plan() called twice");
  planned = n;
  if (my_rank == 0) {
    printf("1..%d\n", n);
    fflush(stdout);
  }
}

void done_testing(void) {
  if (planned < 0)
    plan(checks);
}

int ok(int cond, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = report(cond, NULL, fmt, ap);
  va_end(ap);
  return r;
}

int is_int(long long expected, long long seen, const char *fmt, ...) {
  char detail[TAP_LINE];
  va_list ap;
  snprintf(detail, sizeof detail, "expected %lld, got %lld", expected, seen);
  va_start(ap, fmt);
  int r = report(expected == seen, detail, fmt, ap);
  va_end(ap);
  return r;
}

int is_double(double expected, double seen, double tol, const char *fmt, ...) {
  char detail[TAP_LINE];
  va_list ap;
  snprintf(detail, sizeof detail, "expected %.17g, got %.17g", expected, seen);
  va_start(ap, fmt);
  int r =
      report(expected == seen || fabs(expected - seen) <= tol, detail, fmt, ap);
  va_end(ap);
  return r;
}

int is_string(const char *expected, const char *seen, const char *fmt, ...) {
  char detail[TAP_LINE];
  va_list ap;
  int same =
      (expected && seen) ? strcmp(expected, seen) == 0 : expected == seen;
  snprintf(detail, sizeof detail, "expected %s%s%s, got %s%s%s",
           expected ? "\"" : "", expected ? expected : "NULL",
           expected ? "\"" : "", seen ? "\"" : "", seen ? seen : "NULL",
           seen ? "\"" : "");
  va_start(ap, fmt);
  int r = report(same, detail, fmt, ap);
  va_end(ap);
  return r;
}

void tap_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(note, sizeof note, fmt, ap);
  va_end(ap);
}

void diag(const char *fmt, ...) {
  char buf[4 * TAP_LINE];
  va_list ap;
  if (my_rank != 0)
    return;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  print_lines(stdout, "# ", buf);
}

void diag_all(const char *fmt, ...) {
  char buf[4 * TAP_LINE], prefix[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  snprintf(prefix, sizeof prefix, "# rank %d: ", my_rank);
  print_lines(stderr, prefix, buf);
}

void skip(int n, const char *fmt, ...) {
  char why[TAP_LINE];
  va_list ap;
  va_start(ap, fmt);
  vformat(why, sizeof why, fmt, ap);
  va_end(ap);
  for (int i = 0; i < n; i++) {
    checks++;
    if (my_rank == 0)
      printf("ok %d # SKIP %s\n", checks, why);
  }
  fflush(stdout);
}

/* Frees tap's communicator and finalises MPI if tap initialised it. */
static void mpi_close(void) {
  int finalized = 0;
  if (!mpi_mode)
    return;
  MPI_Finalized(&finalized);
  if (!finalized && comm != MPI_COMM_NULL)
    MPI_Comm_free(&comm);
  if (!finalized && mpi_owned)
    MPI_Finalize();
  mpi_mode = 0;
}

void skip_all(const char *fmt, ...) {
  char why[TAP_LINE];
  va_list ap;
  va_start(ap, fmt);
  vformat(why, sizeof why, fmt, ap);
  va_end(ap);
  if (my_rank == 0) {
    printf("1..0 # SKIP %s\n", why);
    fflush(stdout);
  }
  mpi_close();
  exit(0);
}

void bail(const char *fmt, ...) {
  char why[TAP_LINE];
  va_list ap;
  va_start(ap, fmt);
  vformat(why, sizeof why, fmt, ap);
  va_end(ap);
  if (mpi_mode && world_size > 1)
    printf("Bail out! rank %d: %s\n", my_rank, why);
  else
    printf("Bail out! %s\n", why);
  fflush(stdout);
  if (mpi_mode) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Abort(MPI_COMM_WORLD, 255);
  }
  exit(255);
}

int tap_exit_status(void) {
  if (planned >= 0 && planned != checks && !plan_warned) {
    plan_warned = 1;
    diag("planned %d checks but ran %d", planned, checks);
  }
  return (failures == 0 && planned == checks) ? 0 : 1;
}

void tap_mpi_init(int *argc, char ***argv) {
  int initialized = 0, provided = MPI_THREAD_SINGLE;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
        MPI_SUCCESS)
      bail("MPI_Init_thread failed");
    mpi_owned = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  mpi_mode = 1;
  if (provided < MPI_THREAD_MULTIPLE)
    bail("MPI gives thread level %d, tests need MPI_THREAD_MULTIPLE", provided);
}

void tap_mpi_init_program(int *argc, char ***argv) {
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) !=
      MPI_SUCCESS)
    bail("MPI_Init_thread failed");
  tap_mpi_init(argc, argv); /* MPI is the program's: tap leaves it */
}

int tap_mpi_finish(void) {
  int mine, status;
  done_testing();
  mine = tap_exit_status();
  status = mine;
  if (mpi_mode)
    MPI_Allreduce(&mine, &status, 1, MPI_INT, MPI_MAX, tap_comm());
  mpi_close();
  return status;
}

int tap_rank(void) { return my_rank; }
int tap_size(void) { return world_size; }
