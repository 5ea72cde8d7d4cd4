#!/bin/sh
# fork.sh - t/mpi/fork at np 2 with HVD_END_DIR set, as hvdrun sets it:
# rank 0's forked child dies of SIGABRT, and rank 0's end record must
# still say "running" (the child has a copy of the record's state and its
# signal handlers, but is not the rank); then every rank's record says
# it exited 0.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/fork
need_prog "$prog"
make_tmp fork_end
mkdir "$tmp/end" || exit 99
HVD_END_DIR=$tmp/end
export HVD_END_DIR


run_np 2 "$tmp/out" "$tmp/out" "$prog"
tap_through "np 2, HVD_END_DIR set" "$tmp/out"
[ $rc = 0 ]
check $? "the job exits 0 ($rc)" || show "$tmp/out" output
for r in 0 1; do
  grep -q '^state exited$' "$tmp/end/rank.$r" &&
    grep -q '^status 0$' "$tmp/end/rank.$r"
  check $? "rank $r's end record: exited, status 0" ||
    show "$tmp/end/rank.$r" "rank.$r"
done
echo "1..$n"
exit $failed
