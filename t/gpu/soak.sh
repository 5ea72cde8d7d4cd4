#!/bin/sh
# soak.sh - the soak (t/soak/soak.c) with its tensors on a real GPU
# (t/gpu/soak): HVD_SOAK_GPU_OPS collectives (default 1000) at np 2
# (--device all), 3 and 4 (--device mixed: NCCL's groups and MPI's in one
# window), with two process sets running their own on threads of their
# own (--sets: subset communicators beside the world's), every rank on
# the first visible GPU with HVD_GPU_SHARE=1 (NCCL
# between the ranks over its socket transport, as t/gpu/share.sh), then
# at np 2 through the MPI device executor. Every result exact, as in the
# soak. Skips without a GPU (t/standin/soak.sh runs the same on the
# stand-in in every CUDA build).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
dir=$HVD_TOP_BUILDDIR/t/gpu
need_prog "$dir/soak"
need_gpu
make_tmp gpu_soak
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
first=${CUDA_VISIBLE_DEVICES:-0}
CUDA_VISIBLE_DEVICES=${first%%,*}
HVD_SOAK_RSS_SLACK_KIB=off
HVD_GPU_SHARE=1
export CUDA_VISIBLE_DEVICES HVD_SOAK_RSS_SLACK_KIB HVD_GPU_SHARE
ops=${HVD_SOAK_GPU_OPS:-1000}
seed=${HVD_SOAK_SEED:-0}

gpu_soak() { # NP DEVICE [SETTINGS...]
  np=$1 devs=$2
  shift 2
  seed=$((seed + 1))
  (
    for v in "$@"; do export "$v"; done
    hvd_mpirun "$np" "$dir/soak" --ops "$ops" --device "$devs" \
      --alloc mixed --seed "$seed" --checkpoint-every 500 --sets $((ops / 3))
  ) >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np on one GPU, --device $devs${*:+, $*}, seed $seed: every check of the soak passes (exit $rc)"
}

gpu_soak 2 all
gpu_soak 3 mixed
gpu_soak 4 mixed HVD_FUSION_THRESHOLD=65536
gpu_soak 2 all HVD_GPU_OPERATIONS=mpi
echo "1..$n"
exit $failed
