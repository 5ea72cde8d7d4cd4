/*
 * tap.h - a small TAP (Test Anything Protocol) library for hvd's tests.
 *
 * Plain mode (the default): one process prints TAP on stdout.
 *
 *   plan(2);
 *   is_int(4, 2 + 2, "two and two");
 *   ok(p != NULL, "got a pointer");
 *   return tap_exit_status();
 *
 * MPI mode (after tap_mpi_init): every check is collective over
 * MPI_COMM_WORLD, so every rank must run the same checks in the same
 * order. Only rank 0 prints TAP. A check passes only if it passes on every
 * rank; when it fails, each failing rank's diagnostic is gathered to rank 0
 * and printed as "#   rank R: expected X, got Y".
 *
 *   tap_mpi_init(&argc, &argv);
 *   is_int(0, hvd_init(), "hvd_init");
 *   ...
 *   return tap_mpi_finish();
 *
 * Each check returns 1 if it passed (everywhere, in MPI mode), else 0.
 * Nothing here is thread-safe: run checks from one thread per process.
 */
#ifndef HVD_TAP_H
#define HVD_TAP_H

#if defined(__GNUC__)
#define TAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define TAP_NORETURN __attribute__((noreturn))
#else
#define TAP_PRINTF(f, a)
#define TAP_NORETURN
#endif

/* Prints "1..n". Call once, before or after the checks. */
void plan(int n);
/* Prints "1..<checks run>" if plan() was not called. */
void done_testing(void);

int ok(int cond, const char *fmt, ...) TAP_PRINTF(2, 3);
int is_int(long long expected, long long seen, const char *fmt, ...)
    TAP_PRINTF(3, 4);
/* Passes if |expected - seen| <= tol (tol 0 asks for equality). */
int is_double(double expected, double seen, double tol, const char *fmt, ...)
    TAP_PRINTF(4, 5);
/* NULL-safe: two NULLs are equal, NULL and a string are not. */
int is_string(const char *expected, const char *seen, const char *fmt, ...)
    TAP_PRINTF(3, 4);

/* Attaches a note to this process's next check, printed (as the rank's
 * diagnostic line in MPI mode) only if that check fails. */
void tap_note(const char *fmt, ...) TAP_PRINTF(1, 2);

/* "# ..." on stdout; in MPI mode on rank 0 only. */
void diag(const char *fmt, ...) TAP_PRINTF(1, 2);
/* "# rank R: ..." on stderr from every rank that calls it (debugging). */
void diag_all(const char *fmt, ...) TAP_PRINTF(1, 2);

/* Counts n checks as passed, printing "ok N # SKIP reason" for each. */
void skip(int n, const char *fmt, ...) TAP_PRINTF(2, 3);
/* Prints "1..0 # SKIP reason" and exits 0. In MPI mode every rank must
 * call it (after hvd_shutdown); it finalises MPI first. */
void skip_all(const char *fmt, ...) TAP_PRINTF(1, 2) TAP_NORETURN;
/* Prints "Bail out! reason" and stops: MPI_Abort(MPI_COMM_WORLD, 255) in
 * MPI mode (any one rank may call it), else exit(255). */
void bail(const char *fmt, ...) TAP_PRINTF(1, 2) TAP_NORETURN;

/* 0 if every check passed and the plan matched the checks run, else 1. */
int tap_exit_status(void);

/* MPI mode. tap_mpi_init calls MPI_Init_thread(MPI_THREAD_MULTIPLE) unless
 * MPI is already initialised, and bails if the thread level is lower.
 * tap_mpi_finish calls done_testing() if no plan was printed, finalises
 * MPI if tap_mpi_init initialised it, and returns tap_exit_status(), the
 * same on every rank. */
void tap_mpi_init(int *argc, char ***argv);
/* As a program that owns MPI: MPI_Init_thread(MPI_THREAD_MULTIPLE) made
 * here, as the program's own, then tap_mpi_init, which leaves it to the
 * program (tap_mpi_finish does not finalise it). */
void tap_mpi_init_program(int *argc, char ***argv);
int tap_mpi_finish(void);
/* This process's rank and the world size (0 and 1 in plain mode). */
int tap_rank(void);
int tap_size(void);

#endif /* HVD_TAP_H */
