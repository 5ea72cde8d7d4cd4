#!/bin/sh
# first.sh - README's first program (TAP): the code block under "A first
# program" is examples/first.c, line for line; the program at np 1, 2 and
# 3 prints, on each rank, "rank R of P: average A (expected A)" with A the
# mean of 0..P-1, and exits 0; the same file built against this build tree
# with pkg-config and hvd-uninstalled.pc alone runs the same at np 2. (make
# installcheck builds it against an installed hvd and runs it with the
# installed hvdrun.)

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/first
need_prog "$prog"
make_tmp first

echo "1..7"
awk '/^## A first program/ { inside = 1 } inside && /^```c$/ { code = 1; next }
     code && /^```$/ { exit } code { print }' "$HVD_TOP_SRCDIR/README.md" >"$tmp/readme.c"
cmp -s "$tmp/readme.c" "$HVD_TOP_SRCDIR/examples/first.c"
check $? "README's first program is examples/first.c, line for line" ||
  diff "$tmp/readme.c" "$HVD_TOP_SRCDIR/examples/first.c" | sed 's/^/# /'

for np in 1 2 3; do
  run_np $np "$tmp/out" "$tmp/err" "$prog"
  avg=$(awk -v p=$np 'BEGIN { printf "%.2f", (p - 1) / 2 }')
  good=$([ $rc = 0 ] && [ "`wc -l <"$tmp/out"`" -eq $np ]; echo $?)
  r=0
  while [ $r -lt $np ]; do
    grep -qx "rank $r of $np: average $avg (expected $avg)" "$tmp/out" || good=1
    r=$((r + 1))
  done
  check $good "np $np: every rank prints the average $avg (exit $rc)" ||
    { show "$tmp/out" stdout; show "$tmp/err" stderr; }
done
# names hvd does not read: warned about at hvd_init, once, by rank 0
HVD_FUSION_THRESHHOLD=1 HOROVOD_CYCLE_TIME=1
export HVD_FUSION_THRESHHOLD HOROVOD_CYCLE_TIME
run_np 2 "$tmp/out" "$tmp/err" "$prog"
unset HVD_FUSION_THRESHHOLD HOROVOD_CYCLE_TIME
[ $rc = 0 ] && [ "`grep -c 'not an hvd variable\|is Horovod' "$tmp/err"`" = 2 ] &&
  grep -q "^\[hvd 0\] .*HVD_FUSION_THRESHHOLD is not an hvd variable: did you mean HVD_FUSION_THRESHOLD?$" "$tmp/err" &&
  grep -q "^\[hvd 0\] .*HOROVOD_CYCLE_TIME is Horovod's and hvd does not read it: hvd's is HVD_CYCLE_TIME$" "$tmp/err"
check $? "misspelled HVD_* and HOROVOD_* names: one warning each from rank 0 at hvd_init (exit $rc)" ||
  show "$tmp/err" stderr
# sizes with suffixes: what hvd_init read (its settings line, info level)
HVD_LOG_LEVEL=info HVD_FUSION_THRESHOLD=64M HVD_CHUNK_SIZE=1.5KiB
export HVD_LOG_LEVEL HVD_FUSION_THRESHOLD HVD_CHUNK_SIZE
run_np 1 "$tmp/out" "$tmp/err" "$prog"
unset HVD_LOG_LEVEL HVD_FUSION_THRESHOLD HVD_CHUNK_SIZE
[ $rc = 0 ] && grep -q "settings: .* HVD_FUSION_THRESHOLD=67108864 HVD_CHUNK_SIZE=1536 " "$tmp/err"
check $? "HVD_FUSION_THRESHOLD=64M, HVD_CHUNK_SIZE=1.5KiB: read as 67108864 and 1536 (exit $rc)" ||
  show "$tmp/err" stderr
# pkg-config against the build tree: hvd-uninstalled.pc (no install)
if command -v pkg-config >/dev/null 2>&1; then
  flags=`PKG_CONFIG_PATH=$HVD_TOP_BUILDDIR pkg-config --cflags --libs hvd`
  ${HVD_TEST_CC:-cc} -o "$tmp/first" "$HVD_TOP_SRCDIR/examples/first.c" $flags \
    2>"$tmp/err" && run_np 2 "$tmp/out" "$tmp/err" "$tmp/first"
  [ $? = 0 ] && case " $flags " in *" -I$HVD_TOP_SRCDIR/include "*) true ;; *) false ;; esac &&
    grep -qx "rank 1 of 2: average 0.50 (expected 0.50)" "$tmp/out"
  check $? "built with PKG_CONFIG_PATH=<build> pkg-config hvd (hvd-uninstalled.pc: $flags), it runs at np 2" ||
    { show "$tmp/out" stdout; show "$tmp/err" stderr; }
else
  n=$((n + 1))
  echo "ok $n # SKIP hvd-uninstalled.pc: no pkg-config"
fi
exit $failed
