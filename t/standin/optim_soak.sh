#!/bin/sh
# optim_soak.sh - the optimizer soak (t/soak/optim_soak.c) with about half
# of each configuration's parameters on the stand-in's GPUs (--device; a
# GPU per rank, its streams asynchronous): HVD_SOAK_OPTIM_CONFIGS
# configurations (default 150) of 8 steps at np 1, 2, 3 and 4, each
# against a plain host optimizer fed the average by hand.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
need_prog "$HVD_TOP_BUILDDIR/t/standin/optim_soak"
make_tmp standin_optim_soak
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
configs=${HVD_SOAK_OPTIM_CONFIGS:-150}
seed=${HVD_SOAK_SEED:-0}

for np in 1 2 3 4; do
  s=$((seed + 200 + np))
  hvd_mpirun "$np" "$HVD_TOP_BUILDDIR/t/standin/optim_soak" --device \
    --configs "$configs" --steps 8 --seed "$s" >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np, $configs configurations of 8 steps on the stand-in's GPUs, seed $s: each as the reference (exit $rc; $(soak_summary "$tmp/out"))"
done
echo "1..$n"
exit $failed
