#!/bin/sh
# The quick start's demonstration program passes its own checks at 1-3 ranks.
echo "1..3"
n=0
for np in 1 2 3; do
  n=$((n + 1))
  if out=$("$HVD_MPIRUN_TEST" --np $np "$HVD_TOP_BUILDDIR/examples/collectives_demo" 2>&1) &&
     echo "$out" | grep -q "all 9 checks passed on $np rank"; then
    echo "ok $n - collectives_demo at np=$np"
  else
    echo "not ok $n - collectives_demo at np=$np"
    echo "$out" | sed 's/^/# /'
  fi
done
