## t/soak/local.mk - the soak (t/soak/soak.c): `make check-soak`, not part
## of make check; CI runs it after the suite (.ci/run), and its LeakSanitizer
## run (t/soak/leaks.sh) in build-asan/ and its ThreadSanitizer run
## (t/soak/races.sh) in build-tsan/.
##   make check-soak                         the tests below
##   make check-soak HVD_SOAK_OPS=5000       a shorter soak
##   make check-soak SOAK_TESTS=t/soak/leaks.sh
##  soak.sh   100000 collectives at np 4 (t/soak/soak.c says what)
##  leaks.sh  2000 of them under LeakSanitizer (sanitizer builds only)
##  races.sh  3000 of them under ThreadSanitizer (thread builds only)
##  matrix.sh 4000 at np 2-4 under each setting a user may change, tensors
##            from hvd_alloc_host and malloc mixed (HVD_SOAK_MATRIX_OPS)
##  optim_long.sh  the optimizer soak (t/soak/optim_soak.c), 3000 random
##            configurations of 12 steps at np 1-4 (t/mpi/optim_soak.sh,
##            which make check runs with 300 of 8)

check_PROGRAMS += t/soak/soak t/soak/optim_soak
EXTRA_DIST += t/soak/soak.sh t/soak/leaks.sh t/soak/races.sh \
	t/soak/sanitized.sh t/soak/lsan.supp t/soak/matrix.sh \
	t/soak/optim_long.sh
SOAK_TESTS = t/soak/soak.sh t/soak/leaks.sh t/soak/races.sh \
	t/soak/matrix.sh t/soak/optim_long.sh
check-soak:
	$(MAKE) $(AM_MAKEFLAGS) check TESTS='$(SOAK_TESTS)'
.PHONY: check-soak
## Their logs are not in TESTS, so automake's cleaning does not know them;
## left in the source tree, a VPATH build's make would take them for its
## own (up to date) and never run the tests.
CLEANFILES += t/soak/soak.log t/soak/soak.trs t/soak/leaks.log \
	t/soak/leaks.trs t/soak/races.log t/soak/races.trs t/soak/matrix.log \
	t/soak/matrix.trs t/soak/optim_long.log t/soak/optim_long.trs
