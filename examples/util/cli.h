/*
 * cli.h - the command line of hvd's programs (examples/bert_train,
 * examples/cifar_train, bin/hvd-bench): a line on stderr prefixed with
 * the program's name, usage errors (exit 2) and numbers read from option
 * values within a range. Each program states its wording once, in a
 * cli_t given to cli_init; every call after that uses it.
 *
 * None of it needs MPI: a program parses its command line before MPI
 * starts, so that --help and a bad option need no launcher. Not
 * thread-safe (a program parses before it starts threads).
 */
#ifndef HVD_EXAMPLES_CLI_H
#define HVD_EXAMPLES_CLI_H

#include <stdint.h>
#include <stdnoreturn.h>

#if defined(__GNUC__)
#define CLI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_PRINTF(f, a)
#endif

typedef struct cli {
  const char *prog; /* every line starts "PROG: " */
  const char *hint; /* ends a usage error's message (NULL: nothing) */
  /* A bad number: printf formats of (option, lo, hi, value) as (char *,
   * long long, long long, char *) and (char *, double, double, char *);
   * NULL: "%s needs an integer from %lld to %lld, not '%s'" and "%s needs
   * a number from %g to %g, not '%s'". */
  const char *int_fmt, *real_fmt;
} cli_t;

/* The program's wording, for every call below (kept, not copied). */
void cli_init(const cli_t *c);

/* This process's rank as the launcher says it (Open MPI, PMIx, PMI),
 * read before MPI starts; 0 without a launcher. */
int cli_launcher_rank(void);

/* "PROG: message\n" on stderr in one write, so that the lines of ranks
 * sharing a terminal do not interleave (at most 4 KiB). */
void cli_say(const char *fmt, ...) CLI_PRINTF(1, 2);

/* A bad command line: "PROG: message HINT\n" once per job (on the
 * launcher's rank 0), then exit(2) on every rank. */
noreturn void cli_usage_error(const char *fmt, ...) CLI_PRINTF(1, 2);

/* The integer (decimal) or the finite number that the whole of s is,
 * within [lo, hi]; anything else is a usage error naming option opt. */
int64_t cli_int(const char *opt, const char *s, int64_t lo, int64_t hi);
double cli_real(const char *opt, const char *s, double lo, double hi);

/* s, a name (a file, a directory): an empty one is a usage error,
 * "OPT needs WHAT" (an unset shell variable, `--resume ''`). */
const char *cli_name(const char *opt, const char *s, const char *what);

#endif /* HVD_EXAMPLES_CLI_H */
