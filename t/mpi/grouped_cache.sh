#!/bin/sh
# grouped_cache.sh - a grouped allreduce that ran once is negotiated by
# the response cache's bit vector from then on, as single collectives
# are: t/mpi/negotiation (which see) in its grouped mode, 5 rounds of one
# group of 8 after a first round, at np 2, 3 and 4, with t/mpi/mpicount
# (a PMPI layer) preloaded on the ranks. Checked: the program's sums are
# exact (its status), rank 0 made one fast-path bit-vector allreduce per
# round or more, and no call of the coordinator's path in the counted
# rounds (MPI_Igatherv and MPI_Ibcast: 0 calls; before grouped
# collectives were cached, one each per round). Then the same with
# HVD_CACHE_CAPACITY=4, smaller than the group: every round goes to the
# coordinator (a group is cached whole or not at all) and the sums are
# still exact.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/negotiation
shim=$HVD_TOP_BUILDDIR/t/mpi/.libs/mpicount.so
need_prog "$prog"
[ -f "$shim" ] || skip_all "no $shim (make check builds it)"
make_tmp grouped-cache
unset HVD_CACHE_CAPACITY
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT
# The shim reaches the ranks only (-x), not mpiexec. ASan, when built in,
# must tolerate a library preloaded ahead of it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
MPICOUNT_DIR=$tmp
export MPICOUNT_DIR

# counted NP: runs the program; rank 0's "KIND CALLS SENT RECEIVED" lines
# in $tmp/counts.
counted() {
  rm -f "$tmp"/rank.*
  HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x MPICOUNT_DIR" \
    run_np "$1" "$tmp/out" "$tmp/out" "$prog" grouped 5 8
  cp "$tmp/rank.0" "$tmp/counts" 2>/dev/null || : >"$tmp/counts"
}
calls() {
  awk -v k="$1" '$1 == k { print $2 }' "$tmp/counts"
}

for np in 2 3 4; do
  counted $np
  check $rc "np $np: 5 rounds of a group of 8, every sum exact"
  [ $rc = 0 ] || show_run out
  bor=`calls fastpath_bor`
  [ -n "$bor" ] && [ "$bor" -ge 5 ]
  check $? "np $np: the bit vector every round ($bor allreduces)"
  gv=`calls igatherv`
  bc=`calls ibcast`
  [ "$gv" = 0 ] && [ "$bc" = 0 ]
  check $? "np $np: the coordinator never asked (igatherv $gv, ibcast $bc)"
done

HVD_CACHE_CAPACITY=4
export HVD_CACHE_CAPACITY
counted 3
check $rc "np 3, cache of 4 entries: the group of 8 still exact"
[ $rc = 0 ] || show_run out
gv=`calls igatherv`
[ -n "$gv" ] && [ "$gv" -ge 5 ]
check $? "np 3, cache of 4: the coordinator every round ($gv gathers)"
echo "1..$n"
exit $failed
