#!/bin/sh
# bench/cluster-ratio.sh - hvd's allreduce against raw MPI across hosts:
# bench/allreduce-ratio.sh run on the test cluster of t/util/cluster.sh
# (network namespaces, each a host with its own name and address on a
# private bridge; Open MPI reaches other hosts only over TCP), launched
# from node1. Needs root. Prints what allreduce-ratio.sh prints, then the
# cross-host bandwidth of each side's median.
#
#   bench/cluster-ratio.sh [-n ROUNDS] [-t TENSORS] [--layout 2x1|2x2]
#                          [-- mpirun options]
#
# Defaults: 5 rounds, bench/workloads/bert-base.tensors, 2x1 (one rank
# on each of two hosts: every byte crosses the link). Run it from a
# built tree with nothing else running. Exit status as allreduce-ratio.sh;
# 1 if no cluster can be made here.
set -u
rounds=5 tensors=bench/workloads/bert-base.tensors layout=2x1
while [ $# -gt 0 ]; do
  case $1 in
  -n) rounds=${2:?-n needs a value}; shift 2 ;;
  -t) tensors=${2:?-t needs a value}; shift 2 ;;
  --layout) layout=${2:?--layout needs a value}; shift 2 ;;
  --) shift; break ;;
  -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "cluster-ratio.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case $layout in
  2x1) hosts=node1:1,node2:1 np=2 ;;
  2x2) hosts=node1:2,node2:2 np=4 ;;
  *) echo "cluster-ratio.sh: --layout 2x1 or 2x2, not '$layout'" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/t/util/cluster.sh"
why=$(cluster_why_not) || { echo "cluster-ratio.sh: no cluster: $why" >&2; exit 1; }
trap 'cluster_down' EXIT
trap 'exit 1' INT TERM
cluster_up 2 || exit 1
# the launcher: mpirun on node1, remote ranks through the agent
launcher="$cluster_dir/mpirun"
cat >"$launcher" <<EOS
#!/bin/sh
exec ip netns exec $cluster_prefix-1 unshare --uts sh -c 'hostname node1 && exec mpirun --mca plm_rsh_agent $cluster_agent -H $hosts --bind-to none "\$@"' mpirun "\$@"
EOS
chmod +x "$launcher"
out=$(mktemp) || exit 1
HVD_BENCH_MPIRUN=$launcher sh "$here/bench/allreduce-ratio.sh" -n "$rounds" \
  -np "$np" -t "$tensors" -- "$@" >"$out"
rc=$?
cat "$out"
bytes=$(awk '/^#/ || NF < 2 { next } { n = 1; for (i = 2; i <= NF; i++) n *= $i; s += n * 4 } END { print s }' "$tensors" 2>/dev/null)
sed -n 's/^medians over .*: hvd \([0-9.]*\) ms, best raw \([0-9.]*\) ms.*/\1 \2/p' "$out" |
  awk -v b="$bytes" '{ printf "cross-host: %.1f MB of float32 per allreduce; hvd %.2f GB/s, best raw MPI %.2f GB/s (bytes / median time)\n", b / 1e6, b / $1 / 1e6, b / $2 / 1e6 }'
rm -f "$out"
exit $rc
