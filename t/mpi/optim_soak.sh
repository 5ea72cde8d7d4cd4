#!/bin/sh
# optim_soak.sh - the optimizer soak (t/soak/optim_soak.c): the distributed
# optimizer under random combinations of its options (optimizer, groups,
# passes, op, predivision, ZeRO-1, reduce_fp32, a 16-bit wire, float16
# and bfloat16 parameters, clipping, loss scaling with an injected inf,
# sparse rows, a checkpoint round trip or an hvd_state commit and
# restore), each against a plain optimizer fed the average by hand,
# HVD_SOAK_OPTIM_CONFIGS configurations (default 300) of 8 steps
# at np 1, 2, 3 and 4 with fixed seeds (HVD_SOAK_SEED shifts them); then
# each configuration's end saved at np 3 and resumed at np 2 and 4. Part
# of make check (about 10 s); make check-soak runs 3000 of 12 steps
# (t/soak/optim_long.sh).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
need_prog "$HVD_TOP_BUILDDIR/t/soak/optim_soak"
make_tmp optim_soak
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
configs=${HVD_SOAK_OPTIM_CONFIGS:-300}
steps=${HVD_SOAK_OPTIM_STEPS:-8}
seed=${HVD_SOAK_SEED:-0}

for np in 1 2 3 4; do
  s=$((seed + 100 + np))
  hvd_mpirun "$np" "$HVD_TOP_BUILDDIR/t/soak/optim_soak" --configs "$configs" \
    --steps "$steps" --seed "$s" >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np, $configs configurations of $steps steps, seed $s: each as the reference (exit $rc; $(soak_summary "$tmp/out"))"
done

# Checkpoints at another world size: each configuration's end saved at
# np 3, then every one resumed at np 2 and at np 4 (both sides load it)
# and trained on against the reference.
s=$((seed + 110))
mkdir "$tmp/ckpt"
for np in 3 2 4; do
  if [ $np = 3 ]; then dir="--save-dir"; else dir="--resume-dir"; fi
  hvd_mpirun "$np" "$HVD_TOP_BUILDDIR/t/soak/optim_soak" --configs "$configs" \
    --steps "$steps" --seed "$s" "$dir" "$tmp/ckpt" >"$tmp/out" 2>&1
  rc=$?
  soak_passed "$tmp/out" "np $np, $dir, seed $s: each as the reference (exit $rc; $(soak_summary "$tmp/out"))"
done
echo "1..$n"
exit $failed
