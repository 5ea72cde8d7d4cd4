#!/bin/sh
# powersgd_ckpt.sh - PowerSGD's state in a checkpoint saved at one world
# size resumes at any other. t/mpi/powersgd_ckpt (which see) saves 3 steps
# at np 2, every rank with the same gradients (so that the training does
# not depend on the world size), then at np 1, 2, 3 and 4 loads the file,
# takes the remaining 2 steps and compares them with the uninterrupted 5
# steps at that np (2e-6 of the largest value).
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/mpi/powersgd_ckpt
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT

if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make check)"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/powersgd_ckpt.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

n=0
failed=0
# run DESCRIPTION NP ARGS...: a TAP line, ok if the program exits 0; its
# output as TAP comments.
run() {
  what=$1
  np=$2
  shift 2
  n=$((n + 1))
  if "$HVD_MPIRUN_TEST" --np "$np" "$prog" "$@" >"$tmp/out" 2>&1; then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what"
    failed=1
  fi
  sed 's/^/#   /' "$tmp/out"
}

echo "1..5"
run "save 3 PowerSGD steps at np 2" 2 save "$tmp/psgd.ckpt"
for np in 1 2 3 4; do
  run "load at np $np: 2 more steps are the uninterrupted run's" $np \
    load "$tmp/psgd.ckpt"
done
exit $failed
