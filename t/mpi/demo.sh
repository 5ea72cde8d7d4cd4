#!/bin/sh
# The quick start's demonstration program passes its own checks at 1-3
# ranks; --help prints its usage, an argument (once ignored) exits 2.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
make_tmp demo
echo "1..5"
for np in 1 2 3; do
  run_np $np "$tmp/out" "$tmp/out" "$HVD_TOP_BUILDDIR/examples/collectives_demo"
  [ $rc = 0 ] && grep -q "all 9 checks passed on $np rank" "$tmp/out"
  check $? "collectives_demo at np=$np" || show "$tmp/out" output
done
demo=$HVD_TOP_BUILDDIR/examples/collectives_demo
"$demo" --help >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] && grep -q "^usage: mpirun -np N collectives_demo " "$tmp/out"
check $? "--help: exit $rc, the usage" || show "$tmp/out" output
"$demo" --bogus >"$tmp/out" 2>&1
rc=$?
[ $rc = 2 ] && grep -qx "collectives_demo: unexpected argument '--bogus'" "$tmp/out"
check $? "--bogus: exit $rc, the argument named" || show "$tmp/out" output
exit $failed
