#!/bin/sh
# big.sh - collectives beyond MPI's int counts (check-long: about 5 GB of
# memory). t/mpi/big_gather (which see) at np 2: a grouped allgather of
# 2.4 GB whose rows sit on one rank is gathered member by member, through
# the coordinator and then the response cache, its rows checked.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/big_gather
need_prog "$prog"
make_tmp big
HVD_TEST_TIMEOUT=300
export HVD_TEST_TIMEOUT
run_np 2 "$tmp/out" "$tmp/out" "$prog"
check $rc "np 2: a grouped allgather of 2.4 GB, one rank's rows (status $rc, ${elapsed}s)" ||
  show "$tmp/out" output
count=`grep -c '^big_gather\[[01]\]: round [01] ok$' "$tmp/out"`
[ "$count" = 4 ]
check $? "both rounds' rows right on both ranks ($count of 4)" ||
  show "$tmp/out" output
echo "1..$n"
exit $failed
