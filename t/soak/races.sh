#!/bin/sh
# races.sh - the soak (t/soak/soak.c) under ThreadSanitizer: a shorter run,
# HVD_SOAK_RACE_OPS collectives (default 3000, a checkpoint every 250) at
# np 4, in a build configured with --enable-sanitizer=thread (CI's
# build-tsan runs it: make check-soak SOAK_TESTS=t/soak/races.sh); other
# builds skip it. Open MPI is suppressed (t/tsan.supp says why); hvd and
# the soak are not.

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/soak/soak
if ! grep -q __tsan_init "$prog" 2>/dev/null; then
  skip_all "not a ThreadSanitizer build (./configure --enable-sanitizer=thread)"
fi
make_tmp soak_races
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-900}
export HVD_TEST_TIMEOUT
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
# The resident-memory check is off: TSan's shadow and history grow.
TSAN_OPTIONS="suppressions=$HVD_TOP_SRCDIR/t/tsan.supp history_size=7 ignore_noninstrumented_modules=1"
HVD_SOAK_RSS_SLACK_KIB=off
export TSAN_OPTIONS HVD_SOAK_RSS_SLACK_KIB

. "$HVD_TOP_SRCDIR/t/soak/sanitized.sh"
sanitized_soak "${HVD_SOAK_RACE_OPS:-3000}" 'WARNING: ThreadSanitizer' \
  "ThreadSanitizer reports no race"
