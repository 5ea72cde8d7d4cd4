#!/bin/sh
# powersgd_ckpt.sh - PowerSGD's state in a checkpoint saved at one world
# size resumes at any other. t/mpi/powersgd_ckpt (which see) saves 3 steps
# at np 2, every rank with the same gradients (so that the training does
# not depend on the world size), then at np 1, 2, 3 and 4 loads the file,
# takes the remaining 2 steps and compares them with the uninterrupted 5
# steps at that np (2e-6 of the largest value; its line says by how much).
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/powersgd_ckpt
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT
need_prog "$prog"
make_tmp powersgd_ckpt

n=0
failed=0
echo "1..5"
run_np 2 "$tmp/out" "$tmp/out" "$prog" save "$tmp/psgd.ckpt"
check $rc "save 3 PowerSGD steps at np 2" || show "$tmp/out" "its output"
for np in 1 2 3 4; do
  run_np $np "$tmp/out" "$tmp/out" "$prog" load "$tmp/psgd.ckpt"
  check $rc "load at np $np: 2 more steps are the uninterrupted run's" ||
    show "$tmp/out" "its output"
  grep '^ok: \|^not ok: ' "$tmp/out" | sed 's/^/# /'
done
exit $failed
