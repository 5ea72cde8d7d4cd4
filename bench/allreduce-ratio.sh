#!/bin/sh
# bench/allreduce-ratio.sh - hvd's allreduce of a workload against the best
# raw MPI way, each in a process of its own, in alternating runs: round i
# runs `hvd-bench list` (hvd) then `hvd-bench mpi-list` (a plain MPI
# program that never calls hvd_init: per-tensor blocking, per-tensor
# nonblocking + Waitall, packed, and DDP's 25 MiB buckets). Prints each
# round's medians and ratios, then the median of each ratio:
#   hvd/best   hvd's median over the fastest raw way's, same round
#   hvd/floor  hvd's median over the memory-traffic floor that hvd-bench
#              works out from a memcpy timed in the same process
#
#   bench/allreduce-ratio.sh [-n ROUNDS] [-np RANKS] [-t TENSORS]
#                            [--alloc malloc|hvd|both] [-- mpirun options]
#
# Defaults: 5 rounds, 2 ranks, bench/workloads/bert-base.tensors,
# --alloc both (each round runs malloc'd tensors, then hvd_alloc_host
# ones, each side with the same memory; a summary line for each),
# Open MPI's defaults.
# Options after -- go to mpirun, e.g.
#   -- --mca btl_vader_single_copy_mechanism none
# ITERS (default 10) is hvd-bench's --iters; HVD_BENCH_MPIRUN (default
# mpirun) the launcher command (bench/cluster-ratio.sh points it at the
# test cluster's hosts). Run it from a built tree with
# nothing else running. Exit status 0; 1 if a run failed or a result was
# wrong; 2 a bad argument.
set -u
bad() { echo "allreduce-ratio.sh: $*" >&2; exit 2; }
rounds=5 np=2 tensors=bench/workloads/bert-base.tensors alloc=both
while [ $# -gt 0 ]; do
  case $1 in
  -n | -np | -t | --alloc)
    [ $# -ge 2 ] || bad "$1 needs a value"
    case $1 in
    -n) rounds=$2 ;;
    -np) np=$2 ;;
    -t) tensors=$2 ;;
    --alloc) alloc=$2 ;;
    esac
    shift 2 ;;
  --) shift; break ;;
  -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) bad "unknown argument '$1' (try --help)" ;;
  esac
done
for v in "$rounds" "$np"; do
  case $v in '' | *[!0-9]* | 0*) bad "-n and -np take a positive number, not '$v'" ;; esac
done
[ -x bin/hvd-bench ] || { echo "allreduce-ratio.sh: no bin/hvd-bench here: run it from a built tree" >&2; exit 1; }
[ -r "$tensors" ] || bad "no workload $tensors"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
over=
[ "$np" -gt "$(nproc)" ] && over=--oversubscribe
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
# runs hvd-bench MODE; prints its summary line's key=value pairs
bench() {
  mode=$1; shift
  ${HVD_BENCH_MPIRUN:-mpirun} -np "$np" $over "$@" bin/hvd-bench "$mode" --alloc "$alloc" \
    --iters "${ITERS:-10}" --tensors "$tensors" >"$out" 2>&1 &&
    grep -q '^summary: ' "$out" ||
    { echo "allreduce-ratio.sh: hvd-bench $mode failed:" >&2; cat "$out" >&2; exit 1; }
  sed -n 's/^summary: //p' "$out"
}
val() { echo "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
case $alloc in
both) allocs="malloc hvd" ;;
malloc | hvd) allocs=$alloc ;;
*) bad "--alloc takes malloc, hvd or both, not '$alloc'" ;;
esac
echo "# $tensors at np=$np, --alloc $alloc, ${HVD_BENCH_MPIRUN:-mpirun} $over $*; hvd-bench list and mpi-list alternating, ${ITERS:-10} iters each"
printf '%5s %-6s %9s %9s %-15s %9s %9s %9s %9s\n' round alloc hvd_ms best_ms best copy_ms floor_ms hvd/best hvd/floor
all=
for i in $(seq "$rounds"); do
  for alloc in $allocs; do
    h=$(bench list "$@") || exit 1
    m=$(bench mpi-list "$@") || exit 1
    hvd=$(val "$h" hvd_ms) floor=$(val "$h" floor_ms) copy=$(val "$h" copy_ms)
    best=$(val "$m" best_ms) name=$(val "$m" best)
    line=$(awk -v h="$hvd" -v b="$best" -v f="$floor" \
      'BEGIN { printf "%.3f %.3f", h / b, h / f }')
    printf '%5d %-6s %9s %9s %-15s %9s %9s %9s %9s\n' "$i" "$alloc" "$hvd" \
      "$best" "$name" "$copy" "$floor" $line
    all="$all$alloc $hvd $best $line
"
  done
done
for alloc in $allocs; do
  printf '%s' "$all" | awk -v a="$alloc" '
    function med(a, n,   i, j, t) {
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
        if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    $1 == a { n++; h[n] = $2; b[n] = $3; r[n] = $4; f[n] = $5 }
    END { lo = h[1]; hi = h[1]; rmax = r[1]
          for (i = 2; i <= n; i++) {
            if (h[i] < lo) lo = h[i]; if (h[i] > hi) hi = h[i]
            if (r[i] > rmax) rmax = r[i] }
          printf "%s: medians over %d rounds: hvd %.3f ms, best raw %.3f ms, hvd/best %.3f (worst %.3f), hvd/floor %.3f; hvd max/min %.2f\n",
            a, n, med(h, n), med(b, n), med(r, n), rmax, med(f, n), hi / lo }'
done
