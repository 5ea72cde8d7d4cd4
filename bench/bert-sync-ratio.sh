#!/bin/sh
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
# default preset (tiny). HVDRUN replaces bin/hvdrun (called as HVDRUN -np
# N PROG ARGS). Exit status 0; 1 if a run failed; 2 a bad argument.
set -u
. "$(dirname "$0")/ratio-summary.sh"
bad() { echo "bert-sync-ratio.sh: $*" >&2; exit 2; }
count() { # a positive number for option $1, or exit 2
  case $2 in '' | *[!0-9]* | 0*) bad "$1 takes a positive number, not '$2'" ;; esac
}
pairs=8 np=2
while [ $# -gt 0 ]; do
  case $1 in
  -n | -np)
    [ $# -ge 2 ] || bad "$1 needs a value"
    count "$1" "$2"
    if [ "$1" = -n ]; then pairs=$2; else np=$2; fi
    shift 2 ;;
  --) shift; break ;;
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) bad "unknown argument '$1' (try --help)" ;;
  esac
done
[ $# -gt 0 ] || set -- --steps 1500
need() { # exit 1 unless $1 is an executable of this tree
  [ -x "$1" ] || { echo "bert-sync-ratio.sh: no $1 here: run it from a built tree" >&2; exit 1; }
}
need examples/bert_train
[ -n "${HVDRUN:-}" ] || need bin/hvdrun
hvdrun=${HVDRUN:-bin/hvdrun}
# "tokens/s N (mean, first 2 steps excluded)" from the summary line
run() {
  $hvdrun -np "$np" examples/bert_train --quiet "$@" |
    sed -n 's/^done .* tokens\/s \([0-9]*\) (mean.*/\1/p'
}
ratios=
echo "# bert_train at np=$np, $* : averaging vs --no-sync tokens/s, alternating"
for i in $(seq "$pairs"); do
  s=$(run "$@") && [ -n "$s" ] && n=$(run --no-sync "$@") && [ -n "$n" ] ||
    { echo "bert-sync-ratio.sh: a run failed" >&2; exit 1; }
  r=$(awk -v s="$s" -v n="$n" 'BEGIN { printf "%.3f", s / n }')
  ratios="$ratios $r"
  echo "pair $i: averaging $s  no-sync $n  ratio $r"
done
ratio_summary "ratio" "$ratios"
