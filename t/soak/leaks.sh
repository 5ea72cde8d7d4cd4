#!/bin/sh
# leaks.sh - the soak (t/soak/soak.c) under LeakSanitizer: a shorter run,
# HVD_SOAK_LEAK_OPS collectives (default 2000, a checkpoint every 250) at
# np 4, in a build configured with --enable-sanitizer=address (CI's
# build-asan runs it: make check-soak SOAK_TESTS=t/soak/leaks.sh); other
# builds skip it. Open MPI's own allocations that it keeps to the end are
# suppressed by library (t/soak/lsan.supp); hvd's are not.

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/soak/soak
if ! grep -q __asan_init "$prog" 2>/dev/null; then
  skip_all "not an AddressSanitizer build (./configure --enable-sanitizer=address)"
fi
make_tmp soak_leaks
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-900}
export HVD_TEST_TIMEOUT
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
# Full stacks (Debian's Open MPI has no frame pointers: the fast unwinder
# stops at its first frame, which the suppressions would not match), and
# Open MPI's components kept loaded, so that their frames have names.
# The resident-memory check is off: ASan's quarantine keeps freed memory.
ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0
LSAN_OPTIONS=suppressions=$HVD_TOP_SRCDIR/t/soak/lsan.supp:print_suppressions=0
OMPI_MCA_mca_base_component_disable_dlclose=1
HVD_SOAK_RSS_SLACK_KIB=off
export ASAN_OPTIONS LSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose
export HVD_SOAK_RSS_SLACK_KIB

. "$HVD_TOP_SRCDIR/t/soak/sanitized.sh"
sanitized_soak "${HVD_SOAK_LEAK_OPS:-2000}" 'LeakSanitizer\|leak of' \
  "LeakSanitizer reports no leak"
