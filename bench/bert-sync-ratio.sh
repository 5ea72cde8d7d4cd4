#!/bin/sh
# bench/bert-sync-ratio.sh - examples/bert_train's throughput with gradient
# averaging against --no-sync (no reduction: the compute ceiling of the
# ranks sharing this machine), in alternating runs, so that both see the
# same machine: a VM's speed drifts by more than the difference between
# the two. Prints each pair and the median and mean of the ratios.
#
# Each --no-sync run also logs every rank's step times (--log-json with
# %r), from which a pair's "lock-step ceiling" is computed: rank 0's time
# over the sum, step by step, of the slowest rank's time (steps 3 on, as
# bert_train's tokens/s). It is the ratio that averaging would reach if
# reducing cost nothing but the ranks still had to wait for each other
# every step: what synchronous training loses to per-step jitter alone.
# "of ceiling" is the ratio over it: what the reduction itself costs.
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
  -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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
# The lock-step ceiling of the per-rank logs $1.0.jsonl .. $1.(np-1).jsonl
ceiling() {
  awk -v np="$np" '
    { step = $0; sub(/.*"step":/, "", step); sub(/,.*/, "", step)
      t = $0; sub(/.*"step_time":/, "", t); sub(/,.*/, "", t)
      if (step + 0 <= 2) next
      if (FILENAME ~ /\.0\.jsonl$/) own[step] = t
      if (!(step in max) || t + 0 > max[step]) max[step] = t; seen[step]++ }
    END { for (s in own) if (seen[s] == np) { a += own[s]; b += max[s] }
          if (b > 0) printf "%.3f", a / b }' "$1".*.jsonl
}
logs=$(mktemp -d) || exit 1
trap 'rm -rf "$logs"' EXIT
ratios= ceilings= ofs=
echo "# bert_train at np=$np, $* : averaging vs --no-sync tokens/s, alternating"
for i in $(seq "$pairs"); do
  rm -f "$logs"/ns.*
  s=$(run "$@") && [ -n "$s" ] &&
    n=$(run --no-sync --log-json "$logs/ns.%r.jsonl" "$@") && [ -n "$n" ] &&
    c=$(ceiling "$logs/ns") && [ -n "$c" ] ||
    { echo "bert-sync-ratio.sh: a run failed" >&2; exit 1; }
  r=$(awk -v s="$s" -v n="$n" 'BEGIN { printf "%.3f", s / n }')
  f=$(awk -v r="$r" -v c="$c" 'BEGIN { printf "%.3f", r / c }')
  ratios="$ratios $r" ceilings="$ceilings $c" ofs="$ofs $f"
  echo "pair $i: averaging $s  no-sync $n  ratio $r  lock-step ceiling $c  of ceiling $f"
done
ratio_summary "ratio" "$ratios"
ratio_summary "lock-step ceiling" "$ceilings"
ratio_summary "ratio of ceiling" "$ofs"
