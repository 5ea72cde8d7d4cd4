#!/bin/sh
# hvd-bench's --quick self-check (every collective x dtype x op, checked)
# passes at 1-3 ranks, and its bad-option handling exits 2.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
make_tmp bench
echo "1..4"
for np in 1 2 3; do
  run_np $np "$tmp/out" "$tmp/out" "$HVD_TOP_BUILDDIR/bin/hvd-bench" --quick
  [ $rc = 0 ] && grep -q "all results ok" "$tmp/out"
  check $? "hvd-bench --quick at np=$np" || show "$tmp/out" output
done
run_np 0 /dev/null /dev/null "$HVD_TOP_BUILDDIR/bin/hvd-bench" --no-such-option
[ $rc = 2 ]
check $? "a bad option exits 2 (status $rc)"
exit $failed
