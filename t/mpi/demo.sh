#!/bin/sh
# The quick start's demonstration program passes its own checks at 1-3 ranks.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
make_tmp demo
echo "1..3"
for np in 1 2 3; do
  run_np $np "$tmp/out" "$tmp/out" "$HVD_TOP_BUILDDIR/examples/collectives_demo"
  [ $rc = 0 ] && grep -q "all 9 checks passed on $np rank" "$tmp/out"
  check $? "collectives_demo at np=$np" || show "$tmp/out" output
done
exit $failed
