## t/local.mk - hvd's test suite: the harness, and one fragment per test
## directory, included at the end (t/unit, t/mpi, t/gpu, t/standin), each
## the one place where its directory's tests are registered. `make check`
## runs it all, with Automake's TAP driver.
##
## Scheme. Every test prints TAP and runs under a timeout.
##  - t/unit/NAME.c: a single-process test. Program t/unit/NAME, test entry
##    t/unit/NAME.t (UNIT_TESTS); no mpiexec.
##  - t/mpi/NAME.c: a multi-rank test. Program t/mpi/NAME, test entries
##    t/mpi/NAME.npN (NP_TESTS) for each rank count N = 1..4 it runs at.
##  - t/DIR/NAME.sh: a shell test, run by $(SHELL) from the source tree,
##    with HVD_TOP_BUILDDIR, HVD_TOP_SRCDIR and HVD_MPIRUN_TEST (the path of
##    t/mpirun-test, which see for its --np mode) in the environment.
##  The .t and .npN entries are one-line stub files made by the rule below
##  (automake wants TESTS entries to be files). Their LOG_COMPILER is
##  t/mpirun-test, which maps a stub back to its program in the build tree
##  and runs it (on N ranks for .npN). Logs are t/unit/NAME.log and
##  t/mpi/NAME.npN.log. .npN is deliberately NOT in TEST_EXTENSIONS:
##  automake strips a registered extension to name the log, so NAME.np1 and
##  NAME.np2 would both write NAME.log.
##
## Run one test:   make check TESTS=t/mpi/collectives.np3
##                 t/mpirun-test t/mpi/collectives.np3   (TAP on stdout)
## Longer timeout: make check HVD_TEST_TIMEOUT=600 (seconds, default 120)
##
## Adding a test is one line in its directory's fragment: a program's
## flags are the defaults (AM_CPPFLAGS, AM_LDFLAGS and LDADD are
## TEST_CPPFLAGS, TEST_LDFLAGS and TEST_LDADD; its source is NAME.c), so
##   check_PROGRAMS += t/mpi/foo        NP_TESTS += t/mpi/foo.np2 t/mpi/foo.np4
## and a shell test
##   TESTS_SH += t/mpi/bar.sh
## Only a test that links something else names its variables.
## Tests include "tap.h" (or "tap/tap.h"); see t/tap/tap.h. Test programs
## share helpers (dtype elements, expected values, comparisons, allreduce
## jobs) in t/util/hvdtest.h, linked through TEST_LDADD; shell tests share
## t/util/testlib.sh (sourced from $HVD_TOP_SRCDIR).

NP_TESTS =
UNIT_TESTS =
TESTS_SH =
dist_check_SCRIPTS = $(TESTS_SH)
TESTS += $(UNIT_TESTS) $(NP_TESTS) $(TESTS_SH)
CLEANFILES += $(UNIT_TESTS) $(NP_TESTS)

## Flags of every test program (TEST_LDFLAGS: -no-install links the real
## executable, not a libtool wrapper script that several ranks would race
## to relink).
TEST_CPPFLAGS = $(HVD_CPPFLAGS) $(MPI_CFLAGS) -I$(top_srcdir)/t/tap \
	-I$(top_srcdir)/t/util -I$(top_srcdir)/t
TEST_LDFLAGS = $(HVD_LDFLAGS) -no-install
TEST_LDADD = t/util/libhvdtest.la t/tap/libtap.la lib/libhvd.la $(MPI_LIBS) \
	$(PTHREAD_LIBS) -lm

## The TAP library.
check_LTLIBRARIES = t/tap/libtap.la
t_tap_libtap_la_SOURCES = t/tap/tap.c t/tap/tap.h
t_tap_libtap_la_CPPFLAGS = $(HVD_CPPFLAGS) $(MPI_CFLAGS)
## (libtool ignores -no-install for a library; using TEST_LDFLAGS here
## only tells automake that the variable is used, not a typo.)
t_tap_libtap_la_LDFLAGS = $(TEST_LDFLAGS)

## The tests' helpers, and the shell tests' functions.
check_LTLIBRARIES += t/util/libhvdtest.la
t_util_libhvdtest_la_SOURCES = t/util/hvdtest.c t/util/hvdtest.h
t_util_libhvdtest_la_CPPFLAGS = $(TEST_CPPFLAGS)
t_util_libhvdtest_la_LDFLAGS = $(TEST_LDFLAGS)
EXTRA_DIST += t/util/testlib.sh t/util/cluster.sh t/util/slurm.sh \
	t/util/gputest.h t/timed \
	build-aux/test-times

## The harness.
HVD_TAP_DRIVER = env AM_TAP_AWK='$(AWK)' $(SHELL) \
	$(top_srcdir)/build-aux/tap-driver.sh
TEST_EXTENSIONS = .t .sh
## t/timed adds "# wall: S s" to every test's log (build-aux/test-times).
LOG_DRIVER = $(HVD_TAP_DRIVER)
LOG_COMPILER = $(SHELL) $(top_srcdir)/t/timed $(top_builddir)/t/mpirun-test
T_LOG_DRIVER = $(HVD_TAP_DRIVER)
T_LOG_COMPILER = $(SHELL) $(top_srcdir)/t/timed $(top_builddir)/t/mpirun-test
SH_LOG_DRIVER = $(HVD_TAP_DRIVER)
SH_LOG_COMPILER = $(SHELL) $(top_srcdir)/t/timed $(SHELL)
## HVD_TEST_CC: the compiler and sanitizer flags of this build, for tests
## that compile a program against it (first.sh); HVD_TEST_SANITIZER: the
## sanitizer flags alone (empty without one). HVD_STANDIN_NCCL_ORDER=1:
## the stand-in checks NCCL's order rule in every test that runs on it
## (t/standin/order.sh turns it off once, to show what it catches).
## The SLURM_* unset: a make check run inside a Slurm job (sbatch) must
## not have hvdrun take that job's nodes for the tests' one-host jobs; the
## Slurm tests make their own.
AM_TESTS_ENVIRONMENT = \
	unset SLURM_JOB_ID SLURM_JOBID SLURM_JOB_NODELIST SLURM_NODELIST \
	  SLURM_TASKS_PER_NODE; \
	HVD_TOP_BUILDDIR='$(abs_top_builddir)'; \
	HVD_TOP_SRCDIR='$(abs_top_srcdir)'; \
	HVD_MPIRUN_TEST='$(abs_top_builddir)/t/mpirun-test'; \
	HVD_TEST_CC='$(CC) $(HVD_SANITIZER_CFLAGS)'; \
	HVD_TEST_SANITIZER='$(HVD_SANITIZER_CFLAGS)'; \
	HVD_STANDIN_NCCL_ORDER=1; \
	export HVD_TOP_BUILDDIR HVD_TOP_SRCDIR HVD_MPIRUN_TEST HVD_TEST_CC \
	  HVD_TEST_SANITIZER HVD_STANDIN_NCCL_ORDER;

## The layers of lib/ hold (build-aux/check-layers over the objects'
## symbol tables and the #include lines), and the check catches offences.
TESTS_SH += t/layers.sh
## tracked.sh: no file git tracks is a build output (a libtool wrapper, an
## object, a log)
TESTS_SH += t/tracked.sh
## No function of lib/, bin/ or examples/ is over 80 lines
## (build-aux/check-function-length), and the check catches one that is.
TESTS_SH += t/function-length.sh
EXTRA_DIST += build-aux/check-layers build-aux/check-function-length \
	build-aux/coverage-report
## build-aux/coverage-report (make coverage) on a fake tree of two objects.
TESTS_SH += t/coverage.sh

## The stubs that stand for test programs in TESTS.
$(UNIT_TESTS) $(NP_TESTS):
	$(AM_V_GEN)$(MKDIR_P) $(@D) && echo '# run by t/mpirun-test' > $@

include t/unit/local.mk
include t/mpi/local.mk
include t/gpu/local.mk
include t/standin/local.mk
include t/fuzz/local.mk
include t/soak/local.mk

## ThreadSanitizer: in a build configured with --enable-sanitizer=thread,
## `make check-tsan` runs the tests that drive hvd from several threads
## at once (the engines of the world and of process sets, user threads,
## hvd_state's background writer, the stand-in's streams) with
## t/tsan.supp, which suppresses Open MPI alone; any report fails its
## test (the program exits 66). CI runs it in build-tsan/ (.ci/run). The
## whole of make check under the same TSAN_OPTIONS takes about 25 minutes
## on 2 cores, too long for CI (README, "Other targets").
TSAN_TESTS = t/mpi/threads.np1 t/mpi/threads.np2 t/mpi/threads.np3 \
	t/mpi/threads.np4 t/mpi/collectives.np2 t/mpi/order.np3 \
	t/mpi/fusion.np3 t/mpi/host_mem.np3 t/mpi/zero_copy.np2 \
	t/mpi/grouped.np2 t/mpi/join.np3 t/mpi/reproducible.np4 \
	t/mpi/process_sets.np3 t/mpi/process_set_split.np4 \
	t/mpi/shutdown.np3 t/mpi/state.np2 t/mpi/state.np4 \
	t/standin/collectives.np2 t/standin/flight.np2 t/standin/optim.np2 \
	t/unit/host_mem.t
EXTRA_DIST += t/tsan.supp
check-tsan:
	@case '$(HVD_SANITIZER_CFLAGS)' in *sanitize=thread*) ;; \
	  *) echo "check-tsan: not a ThreadSanitizer build" \
	    "(./configure --enable-sanitizer=thread)" >&2; exit 1 ;; esac
	TSAN_OPTIONS='suppressions=$(abs_top_srcdir)/t/tsan.supp exitcode=66 history_size=7 ignore_noninstrumented_modules=1' \
	  HVD_TEST_TIMEOUT=600 $(MAKE) $(AM_MAKEFLAGS) check TESTS='$(TSAN_TESTS)'
print-tsan-tests:
	@echo $(TSAN_TESTS)
.PHONY: check-tsan print-tsan-tests

## make coverage: in a build configured with --enable-coverage, after make
## check (or any subset), the lines of lib/ that the tests ran, per file
## and in total, from every object that compiled them (libhvd's and the
## stand-in's); coverage/SUMMARY and coverage/lib/.../FILE.missed (the
## lines not run). make coverage-clean forgets the counts.
coverage:
	@if test -z '$(HVD_COVERAGE_CFLAGS)'; then \
	  echo "coverage: not a coverage build" \
	    "(./configure --enable-coverage CFLAGS='-g -O0')" >&2; exit 1; fi
	rm -rf coverage
	$(PYTHON3) $(top_srcdir)/build-aux/coverage-report --gcov '$(GCOV)' \
	  --out coverage $(top_builddir) $(top_srcdir)
coverage-clean:
	find $(top_builddir) -name '*.gcda' -exec rm -f {} +
	rm -rf coverage
.PHONY: coverage coverage-clean
