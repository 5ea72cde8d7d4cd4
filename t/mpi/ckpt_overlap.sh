#!/bin/sh
# ckpt_overlap.sh - two process sets' background saves of two paths from
# two threads of one process, with set A's write held up 2 s before it
# reads its copy of the file (the shim t/mpi/crash_rename.so preloaded,
# HVD_TEST_SLOW_CREATE=/ta.ckpt.tmp.), so that set B's copy is made
# while set A's write is in flight, every time: `t/mpi/ckpt_sets
# overlap` (which see) at np 2 and 3. Both saves succeed and each file
# is its own set's state, byte for byte. Before, set B's save was
# refused ("...: the background save of '.../ta.ckpt' is not waited for
# yet"), or, past that check at once, B's bytes went into A's file
# through the one staging buffer both used.
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/mpi/ckpt_sets
shim=$HVD_TOP_BUILDDIR/t/mpi/.libs/crash_rename.so
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT

if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make check)"
  exit 0
fi
if [ ! -f "$shim" ]; then
  echo "1..0 # SKIP no shared $shim (configured without shared libraries?)"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/ckpt_overlap.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

# The preloaded shim reaches the ranks only (-x), not mpiexec. ASan, when
# built in, must tolerate a library preloaded ahead of it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x HVD_TEST_SLOW_CREATE=/ta.ckpt.tmp."
export HVD_TEST_MPIEXEC_ARGS

n=0
failed=0
echo "1..2"
for np in 2 3; do
  n=$((n + 1))
  "$HVD_MPIRUN_TEST" --np $np "$prog" overlap >"$tmp/out" 2>&1
  rc=$?
  if [ $rc = 0 ] && ! grep -q '^not ok' "$tmp/out"; then
    echo "ok $n - np $np: two sets' background saves of two paths, set A's write held up: both whole"
  else
    echo "not ok $n - np $np: two sets' background saves of two paths, set A's write held up (status $rc)"
    sed 's/^/#   /' "$tmp/out"
    failed=1
  fi
done
exit $failed
