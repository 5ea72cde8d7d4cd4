#!/bin/sh
# bench/bert-sync-ratio.sh: one pair of short runs prints both tokens/s and
# their ratio (the averaging run's over the --no-sync run's, to 3 digits),
# the lock-step ceiling from every rank's step times and the ratio over it,
# then the median and mean lines; bad arguments exit 2 and outside a built
# tree it exits 1, each with the reason. Throughput itself is not judged.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
script=$HVD_TOP_SRCDIR/bench/bert-sync-ratio.sh
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-90}
export HVD_TEST_TIMEOUT

need_bert_train
make_tmp bert_sync_ratio
echo "1..7"

# The test launcher in hvdrun's place: HVDRUN -np N PROG ARGS.
cat >"$tmp/launch" <<EOS
#!/bin/sh
[ "\$1" = -np ] || exit 3
np=\$2; shift 2
exec "$HVD_MPIRUN_TEST" --np "\$np" "\$@"
EOS
chmod +x "$tmp/launch"

(cd "$HVD_TOP_BUILDDIR" &&
  HVDRUN=$tmp/launch sh "$script" -n 1 -np 2 -- --steps 12) \
  >"$tmp/out" 2>"$tmp/err"
check $? "one pair of 12-step runs at np=2 exits 0" ||
  { show "$tmp/out" stdout; show "$tmp/err" stderr; }
pair=$(sed -n 's/^pair 1: averaging \([0-9]*\)  no-sync \([0-9]*\)  ratio \([0-9.]*\)  lock-step ceiling \([0-9.]*\)  of ceiling \([0-9.]*\)$/\1 \2 \3 \4 \5/p' "$tmp/out")
set -- $pair
[ $# = 5 ] && [ "$1" -gt 0 ] && [ "$2" -gt 0 ] &&
  [ "$3" = "$(awk -v s="$1" -v n="$2" 'BEGIN { printf "%.3f", s / n }')" ]
check $? "the pair's ratio is its averaging tokens/s over its no-sync tokens/s" ||
  show "$tmp/out" stdout
[ $# = 5 ] && awk -v c="$4" 'BEGIN { exit !(c > 0 && c <= 1) }' &&
  [ "$5" = "$(awk -v r="$3" -v c="$4" 'BEGIN { printf "%.3f", r / c }')" ]
check $? "its lock-step ceiling (from every rank's --log-json) is in (0, 1], and the ratio over it follows" ||
  show "$tmp/out" stdout
grep -qx "ratio: median ${3:-x}  mean ${3:-x}  (1 pairs)" "$tmp/out" &&
  grep -qx "lock-step ceiling: median ${4:-x}  mean ${4:-x}  (1 pairs)" "$tmp/out" &&
  grep -qx "ratio of ceiling: median ${5:-x}  mean ${5:-x}  (1 pairs)" "$tmp/out"
check $? "median and mean of one pair are its ratio, ceiling and ratio of ceiling" ||
  show "$tmp/out" stdout

sh "$script" -n 0 >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] && grep -qx "bert-sync-ratio.sh: -n takes a positive number, not '0'" "$tmp/err"
check $? "-n 0: exit 2 with the reason" || show "$tmp/err" stderr
sh "$script" --pairs 3 >"$tmp/out" 2>"$tmp/err"
[ $? = 2 ] && grep -qx "bert-sync-ratio.sh: unknown argument '--pairs' (try --help)" "$tmp/err"
check $? "an unknown argument: exit 2 with the reason" || show "$tmp/err" stderr
(cd "$tmp" && sh "$script" -n 1) >"$tmp/out" 2>"$tmp/err"
[ $? = 1 ] && grep -qx "bert-sync-ratio.sh: no examples/bert_train here: run it from a built tree" "$tmp/err"
check $? "outside a built tree: exit 1 with the reason" || show "$tmp/err" stderr
exit $failed
