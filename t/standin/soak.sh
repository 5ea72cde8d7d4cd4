#!/bin/sh
# soak.sh - the soak (t/soak/soak.c) with its collectives' tensors on the
# stand-in's GPUs (t/standin/soak, a GPU of its own per rank):
# HVD_SOAK_STANDIN_OPS collectives (default 2000) at np 2, 3 and 4, every
# one on the device (--device all) or about half of them (--device
# mixed: the NCCL executor's groups and the MPI executor's in one window),
# with NCCL's order rule checked (HVD_STANDIN_NCCL_ORDER=1) and the
# stand-in's stream order (on by default), two process sets (the ranks
# of one parity, every rank but the last) running their own random
# collectives on threads of their own beside the world's (--sets: three
# communicators, three threads), under several settings
# (hierarchical allreduce over simulated nodes, the MPI device executor,
# small fusion buffers and chunks, autotuning). Every result exact, the
# training, checkpoints, join, descriptors and threads as in the soak.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
need_prog "$HVD_TOP_BUILDDIR/t/standin/soak"
make_tmp standin_soak
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
HVD_SOAK_RSS_SLACK_KIB=off
HVD_STANDIN_NCCL_ORDER=1
export HVD_SOAK_RSS_SLACK_KIB HVD_STANDIN_NCCL_ORDER
ops=${HVD_SOAK_STANDIN_OPS:-2000}
prog=$HVD_TOP_BUILDDIR/t/standin/soak
seed=${HVD_SOAK_SEED:-0}

# device_soak NP DEVICE [SETTINGS...]
# (NODES_OF=K in SETTINGS: nodes of K ranks, HVD_HOSTNAME per rank)
device_soak() {
  np=$1 devs=$2
  shift 2
  seed=$((seed + 1))
  (
    p=$prog
    for v in "$@"; do
      case $v in
        NODES_OF=*) nodes_of "${v#NODES_OF=}" "$prog" "$tmp/nodes"; p=$tmp/nodes ;;
        *) export "$v" ;;
      esac
    done
    hvd_mpirun "$np" "$p" --ops "$ops" --device "$devs" --alloc mixed \
      --seed "$seed" --checkpoint-every 500 --sets $((ops / 3))
  ) >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np, --device $devs${*:+, $*}, seed $seed: every check of the soak passes (exit $rc)"
}

device_soak 2 all
device_soak 3 mixed
device_soak 4 all
device_soak 4 mixed HVD_FUSION_THRESHOLD=4096 HVD_CACHE_CAPACITY=2
device_soak 3 all HVD_GPU_OPERATIONS=mpi
device_soak 4 mixed NODES_OF=2 HVD_HIERARCHICAL_ALLREDUCE=1
device_soak 3 all NODES_OF=2 HVD_HIERARCHICAL_ALLREDUCE=1 HVD_FUSION_THRESHOLD=3000
device_soak 3 all HVD_CHUNK_SIZE=4100
device_soak 4 mixed HVD_AUTOTUNE=1 HVD_CYCLE_TIME=0
echo "1..$n"
exit $failed
