#!/bin/sh
# bench/powersgd-link.sh - PowerSGD where it is meant to pay: two hosts
# joined by a slow link. Makes a 2-host namespace cluster
# (t/util/cluster.sh; root), limits each host's eth0 to RATE with a token
# bucket (tc tbf), and runs bert_train on node1:1,node2:1 alternately
# without compression and with --powersgd R (from step 0), PAIRS times,
# printing each run's tokens/s and each pair's ratio (PowerSGD / plain).
# With PSGD_WIRE=fp16 (or bf16) set, each pair is PowerSGD on its float32
# wire against PowerSGD on that wire (--fp16-allreduce: P, Q and the
# whole gradients halved), the ratio the latter's over the former's.
#
#   sh bench/powersgd-link.sh [RATE [R [PAIRS [bert_train args...]]]]
#
# Defaults: RATE 1gbit, R 4, PAIRS 3, --preset mini --steps 20
# --synthetic-lines 2000. From the top of a built tree (make).
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
rate=${1:-1gbit}
r=${2:-4}
pairs=${3:-3}
[ $# -gt 3 ] && shift 3 || set --
[ $# -gt 0 ] || set -- --preset mini --steps 20 --synthetic-lines 2000
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
. "$top/t/util/cluster.sh"
cluster_why_not || exit 77
trap 'cluster_down' 0
cluster_up 2 || exit 1
for h in node1 node2; do
  cluster_on "$h" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb \
    latency 50ms || exit 1
done
out=$(mktemp -d "${TMPDIR:-/tmp}/psgdlink.XXXXXX") || exit 1
run() { # run NAME ARGS...: tokens/s of one bert_train run on the 2 hosts
  name=$1
  shift
  cluster_on node1 timeout -k 5 600 "$top/bin/hvdrun" -H node1:1,node2:1 \
    --mca plm_rsh_agent "$cluster_agent" --mpi-args "--bind-to none" \
    "$top/examples/bert_train" "$@" >"$out/$name.out" 2>"$out/$name.err" \
    </dev/null
  sed -n 's/^done .* tokens\/s \([0-9]*\) .*/\1/p' "$out/$name.out"
}
wire=${PSGD_WIRE:-}
echo "# link $rate per host, 2 hosts x 1 rank, bert_train $*${wire:+ (PowerSGD's float32 wire against $wire)}"
i=1
while [ $i -le "$pairs" ]; do
  if [ -n "$wire" ]; then
    a=$(run plain$i "$@" --powersgd "$r" --powersgd-start 0)
    b=$(run psgd$i "$@" --powersgd "$r" --powersgd-start 0 --$wire-allreduce)
  else
    a=$(run plain$i "$@")
    b=$(run psgd$i "$@" --powersgd "$r" --powersgd-start 0)
  fi
  if [ -z "$a" ] || [ -z "$b" ]; then
    echo "pair $i: a run failed; its stderr:" >&2
    cat "$out/plain$i.err" "$out/psgd$i.err" >&2
    exit 1
  fi
  if [ -n "$wire" ]; then
    echo "pair $i: powersgd rank $r float32 wire $a tokens/s, $wire wire $b tokens/s, ratio $(awk "BEGIN { printf \"%.2f\", $b / $a }")"
  else
    echo "pair $i: plain $a tokens/s, powersgd rank $r $b tokens/s, ratio $(awk "BEGIN { printf \"%.2f\", $b / $a }")"
  fi
  i=$((i + 1))
done
rm -rf "$out"
