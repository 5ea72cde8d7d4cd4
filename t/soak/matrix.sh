#!/bin/sh
# matrix.sh - the soak (t/soak/soak.c) under each setting a user may
# change, one configuration per check: HVD_SOAK_MATRIX_OPS collectives
# (default 4000, about 5 s each on 2 cores) at np 2, 3 or 4, tensors from
# hvd_alloc_host on some ranks and malloc on others (--alloc mixed: the
# zero-copy, cross-memory-attach and slot paths meet in one group), nodes
# simulated with HVD_HOSTNAME where hierarchical allreduce is on, and two
# process sets running their own collectives on threads of their own
# beside the world's (--sets). Each
# configuration has its own fixed seed (HVD_SOAK_SEED adds to it), so a
# failure reruns as printed. make check-soak runs it, as CI does.

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
need_prog "$HVD_TOP_BUILDDIR/t/soak/soak"
make_tmp soak_matrix
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
HVD_SOAK_RSS_SLACK_KIB=off
export HVD_SOAK_RSS_SLACK_KIB
ops=${HVD_SOAK_MATRIX_OPS:-4000}
prog=$HVD_TOP_BUILDDIR/t/soak/soak
seed=${HVD_SOAK_SEED:-0}
for k in 1 2; do
  nodes_of $k "$prog" "$tmp/nodes$k"
done

# soak_under NP NODES ALLOC SETTINGS...: the soak on NP ranks (NODES: 0,
# one node; K, nodes of K ranks), every check passing and exit 0.
soak_under() {
  np=$1 nodes=$2 alloc=$3
  shift 3
  seed=$((seed + 1))
  p=$prog
  [ "$nodes" != 0 ] && p=$tmp/nodes$nodes
  (
    for v in "$@"; do export "$v"; done
    hvd_mpirun "$np" "$p" --ops "$ops" --alloc "$alloc" --seed "$seed" \
      --checkpoint-every 1000 --sets $((ops / 4))
  ) >"$tmp/out" 2>&1
  rc=$?
  where="np $np"
  [ "$nodes" != 0 ] && where="$where, nodes of $nodes"
  soak_passed "$tmp/out" "${*:-defaults}, $where, --alloc $alloc, seed $seed: every check of the soak passes (exit $rc)"
}

# Groups of at least one piece (HVD_CHUNK_SIZE, else 4 MiB: more than
# the soak's largest tensor) take the zero-copy paths: through the
# arenas when every tensor is in one, else by cross-memory attach.
soak_under 2 0 hvd HVD_CHUNK_SIZE=65536 HVD_TIMELINE="$tmp/zc.json"
grep -q '"SHM_ZERO_COPY_ALLREDUCE"' "$tmp/zc.json"
check $? "--alloc hvd at np 2 took the arenas' zero-copy allreduce (rank 0's timeline names SHM_ZERO_COPY_ALLREDUCE)"
soak_under 3 0 mixed HVD_CHUNK_SIZE=65536 HVD_TIMELINE="$tmp/cma.json" \
  HVD_LOG_LEVEL=info
if grep -q 'no cross-memory attach here' "$tmp/out"; then
  echo "ok $((n += 1)) # SKIP the kernel refuses cross-memory attach here"
else
  grep -q '"SHM_CMA_ALLREDUCE"' "$tmp/cma.json"
  check $? "--alloc mixed at np 3 took the cross-memory-attach allreduce (SHM_CMA_ALLREDUCE)"
fi
soak_under 4 0 mixed
soak_under 3 0 mixed HVD_FUSION_THRESHOLD=1024
soak_under 4 0 mixed HVD_FUSION_THRESHOLD=0
soak_under 3 0 mixed HVD_CHUNK_SIZE=4100
soak_under 4 0 mixed HVD_CACHE_CAPACITY=1
soak_under 3 0 mixed HVD_CACHE_CAPACITY=0
soak_under 4 0 mixed HVD_SHM_ALLREDUCE=0
soak_under 3 0 mixed HVD_ZERO_COPY=0
soak_under 4 0 mixed HVD_HOST_ARENA=0
soak_under 3 0 mixed HVD_CYCLE_TIME=0
soak_under 4 0 mixed HVD_AUTOTUNE=1
soak_under 4 2 mixed HVD_HIERARCHICAL_ALLREDUCE=1
soak_under 3 2 mixed HVD_HIERARCHICAL_ALLREDUCE=1 HVD_FUSION_THRESHOLD=3000 HVD_CHUNK_SIZE=1000
soak_under 4 1 mixed HVD_HIERARCHICAL_ALLREDUCE=1 HVD_CACHE_CAPACITY=2
soak_under 4 2 malloc HVD_SHM_ALLREDUCE=1 HVD_ZERO_COPY=1
echo "1..$n"
exit $failed
