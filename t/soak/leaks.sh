#!/bin/sh
# leaks.sh - the soak (t/soak/soak.c) under LeakSanitizer: a shorter run,
# HVD_SOAK_LEAK_OPS collectives (default 2000, a checkpoint every 250) at
# np 4, in a build configured with --enable-sanitizer=address (CI's
# build-asan runs it: make check-soak SOAK_TESTS=t/soak/leaks.sh); other
# builds skip it. Open MPI's own allocations that it keeps to the end are
# suppressed by library (t/soak/lsan.supp); hvd's are not.

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
. "$HVD_TOP_SRCDIR/t/soak/sanitized.sh"
sanitized_start __asan_init "an AddressSanitizer" address soak_leaks
# Full stacks (Debian's Open MPI has no frame pointers: the fast unwinder
# stops at its first frame, which the suppressions would not match), and
# Open MPI's components kept loaded, so that their frames have names.
ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0
LSAN_OPTIONS=suppressions=$HVD_TOP_SRCDIR/t/soak/lsan.supp:print_suppressions=0
OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS LSAN_OPTIONS OMPI_MCA_mca_base_component_disable_dlclose

sanitized_soak "${HVD_SOAK_LEAK_OPS:-2000}" 'LeakSanitizer\|leak of' \
  "LeakSanitizer reports no leak"
