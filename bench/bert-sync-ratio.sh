#!/bin/bash
# bench/bert-sync-ratio.sh - examples/bert_train's throughput with gradient
# averaging against --no-sync (no reduction: the compute ceiling of the
# ranks sharing this machine), in alternating runs, so that both see the
# same machine: a VM's speed drifts by more than the difference between
# the two. Prints each pair and the median and mean of the ratios.
#
#   bench/bert-sync-ratio.sh [-n PAIRS] [-np RANKS] [-- bert_train options]
#
# Run it from a built tree (it uses bin/hvdrun and examples/bert_train),
# with nothing else running. Defaults: 8 pairs, 2 ranks, 1500 steps of the
# default preset (tiny). Exit status 0, or 1 if a run failed.
set -u
pairs=8 np=2
while [ $# -gt 0 ]; do
  case $1 in
  -n) pairs=$2; shift 2 ;;
  -np) np=$2; shift 2 ;;
  --) shift; break ;;
  -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "bert-sync-ratio.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || set -- --steps 1500
for f in bin/hvdrun examples/bert_train; do
  [ -x "$f" ] || { echo "bert-sync-ratio.sh: no $f here: run it from a built tree" >&2; exit 1; }
done
# "tokens/s N (mean, first 2 steps excluded)" from the summary line
run() {
  bin/hvdrun -np "$np" examples/bert_train --quiet "$@" |
    sed -n 's/^done .* tokens\/s \([0-9]*\) (mean.*/\1/p'
}
ratios=
echo "# bert_train at np=$np, $* : averaging vs --no-sync tokens/s, alternating"
for i in $(seq "$pairs"); do
  s=$(run "$@") && n=$(run --no-sync "$@") && [ -n "$s" ] && [ -n "$n" ] ||
    { echo "bert-sync-ratio.sh: a run failed" >&2; exit 1; }
  r=$(awk -v s="$s" -v n="$n" 'BEGIN { printf "%.3f", s / n }')
  ratios="$ratios $r"
  echo "pair $i: averaging $s  no-sync $n  ratio $r"
done
echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | sort -n |
  awk '{ v[NR] = $1; t += $1 }
       END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
             printf "ratio: median %.3f  mean %.3f  (%d pairs)\n", m, t / NR, NR }'
