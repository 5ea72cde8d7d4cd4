#!/bin/sh
# races.sh - the soak (t/soak/soak.c) under ThreadSanitizer: a shorter run,
# HVD_SOAK_RACE_OPS collectives (default 3000, a checkpoint every 250) at
# np 4, in a build configured with --enable-sanitizer=thread (CI's
# build-tsan runs it: make check-soak SOAK_TESTS=t/soak/races.sh); other
# builds skip it. Open MPI is suppressed (t/tsan.supp says why); hvd and
# the soak are not.

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
. "$HVD_TOP_SRCDIR/t/soak/sanitized.sh"
sanitized_start __tsan_init "a ThreadSanitizer" thread soak_races
TSAN_OPTIONS="suppressions=$HVD_TOP_SRCDIR/t/tsan.supp history_size=7 ignore_noninstrumented_modules=1"
export TSAN_OPTIONS

sanitized_soak "${HVD_SOAK_RACE_OPS:-3000}" 'WARNING: ThreadSanitizer' \
  "ThreadSanitizer reports no race"
