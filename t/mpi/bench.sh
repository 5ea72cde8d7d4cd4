#!/bin/sh
# hvd-bench's --quick self-check (every collective x dtype x op, checked)
# passes at 1-3 ranks, and its bad-option handling exits 2.
echo "1..4"
n=0
for np in 1 2 3; do
  n=$((n + 1))
  if out=$("$HVD_MPIRUN_TEST" --np $np "$HVD_TOP_BUILDDIR/bin/hvd-bench" --quick 2>&1) &&
     echo "$out" | grep -q "all results ok"; then
    echo "ok $n - hvd-bench --quick at np=$np"
  else
    echo "not ok $n - hvd-bench --quick at np=$np"
    echo "$out" | sed 's/^/# /'
  fi
done
"$HVD_TOP_BUILDDIR/bin/hvd-bench" --no-such-option >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then echo "ok 4 - a bad option exits 2"; else echo "not ok 4 - a bad option exits 2 (got $rc)"; fi
