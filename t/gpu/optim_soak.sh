#!/bin/sh
# optim_soak.sh - the optimizer soak (t/soak/optim_soak.c) on a real GPU
# (t/gpu/optim_soak --device): about half of each random configuration's
# parameters on the GPU, HVD_SOAK_OPTIM_CONFIGS configurations (default
# 100) of 8 steps at np 1 and at np 2 with both ranks on the first
# visible GPU (HVD_GPU_SHARE=1: NCCL between them over its socket
# transport), each against a plain host optimizer fed the average by
# hand. Skips without a GPU (t/standin/optim_soak.sh runs the same on the
# stand-in in every CUDA build).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
dir=$HVD_TOP_BUILDDIR/t/gpu
need_prog "$dir/optim_soak"
need_gpu
make_tmp gpu_optim_soak
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
first=${CUDA_VISIBLE_DEVICES:-0}
CUDA_VISIBLE_DEVICES=${first%%,*}
HVD_GPU_SHARE=1
export CUDA_VISIBLE_DEVICES HVD_GPU_SHARE
configs=${HVD_SOAK_OPTIM_CONFIGS:-100}
seed=${HVD_SOAK_SEED:-0}

for np in 1 2; do
  s=$((seed + 300 + np))
  hvd_mpirun "$np" "$dir/optim_soak" --device --configs "$configs" \
    --steps 8 --seed "$s" >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np on one GPU, $configs configurations of 8 steps, seed $s: each as the reference (exit $rc; $(soak_summary "$tmp/out"))"
done
echo "1..$n"
exit $failed
