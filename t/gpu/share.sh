#!/bin/sh
# share.sh - NCCL between ranks that share one GPU (HVD_GPU_SHARE=1: each
# rank gets its own NCCL_HOSTID, so NCCL takes the ranks for separate hosts
# and connects them over its socket transport; doc/gpu-testing.md). The
# multi-rank GPU tests, their NCCL pass included, with every rank on the
# first visible GPU: t/gpu/collectives and t/gpu/optim at np 2, 3 and 4,
# t/gpu/cnn at np 2. One check per run: the program passes, and its NCCL
# pass ran (hvd_init of the "nccl" pass is an "ok" line, not a skip).
# Then, over the same NCCL (issue 26):
#  - `binding oom` at np 2 and 3: the last rank's device allocations of
#    more than 64 KiB fail; its allgather and grouped allreduce fail on
#    every rank within 2 s with the same words naming it, and a device
#    allreduce works after each (nothing was launched, NCCL kept);
#  - a rank SIGKILLed during a device allreduce (`binding kill 1` under
#    hvdrun at np 3, HVD_NCCL_TIMEOUT at its default 300 s): status 137,
#    hvdrun's line naming rank 1, no rank reaching the end, within 20 s;
#  - on a real GPU (not the stand-in: the examples link the real CUDA
#    runtime), examples/bert_train --device gpu: fp32 at np 2 x 4 follows
#    np 1 x 8 to 1e-5 at every one of 20 steps (issue 26's bound), bf16
#    to 5e-3 (its gradients are summed in bfloat16); examples/cifar_train
#    --device gpu at np 2 x 8 follows np 1 x 16 to 1e-3 (sync BN).
#
# Skips without a GPU. HVD_SHARE_BUILD names another build of the programs
# and HVD_SHARE_ENV the variable that leaves one GPU visible
# (t/standin/share.sh: the stand-in's, HVD_STANDIN_DEVICES=1); by default
# t/gpu's and CUDA_VISIBLE_DEVICES=<the first visible>.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh" # losses_agree
dir=${HVD_SHARE_BUILD:-$HVD_TOP_BUILDDIR/t/gpu}
first=${CUDA_VISIBLE_DEVICES:-0}
one=${HVD_SHARE_ENV:-CUDA_VISIBLE_DEVICES=${first%%,*}}
progs="collectives:2 collectives:3 collectives:4 optim:2 optim:3 optim:4 cnn:2"

if [ ! -x "$dir/collectives" ]; then
  echo "1..0 # SKIP no $dir/collectives (run make check)"
  exit 0
fi
if [ ! -x "$dir/binding" ] || [ "`"$dir/binding" count | cut -d' ' -f1`" = 0 ]; then
  echo "1..0 # SKIP no CUDA device: `"$dir/binding" count 2>&1 | cut -d' ' -f2-`"
  exit 0
fi
tmp=`mktemp -d "${TMPDIR:-/tmp}/share.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

n=0
failed=0
for pn in $progs; do
  p=${pn%%:*}
  np=${pn##*:}
  [ -x "$dir/$p" ] || continue
  n=$((n + 1))
  (
    HVD_GPU_SHARE=1
    export HVD_GPU_SHARE "$one"
    "$HVD_MPIRUN_TEST" --np "$np" "$dir/$p"
  ) >"$tmp/out" 2>&1
  rc=$?
  checks=`grep -c '^ok ' "$tmp/out"`
  if [ $rc = 0 ] && ! grep -q '^not ok' "$tmp/out" &&
    grep -q '^ok [0-9]* - nccl: hvd_init' "$tmp/out"; then
    echo "ok $n - $p at np $np on one GPU, NCCL pass included ($checks checks)"
  else
    echo "not ok $n - $p at np $np on one GPU, NCCL pass included (status $rc)"
    failed=1
    sed 's/^/#   /' "$tmp/out" | grep -v '^#   ok ' | head -60
  fi
done
# share_run OUT ERR PROG ARGS...: PROG under the test launcher with every
# rank on the one GPU (HVD_GPU_SHARE=1); its status in rc.
share_run() {
  o=$1
  e=$2
  shift 2
  (
    HVD_GPU_SHARE=1
    export HVD_GPU_SHARE "$one"
    "$@"
  ) >"$o" 2>"$e"
  rc=$?
}
# ---- a rank whose device allocations fail, over NCCL ------------------------
# (`binding oom`: the last rank's cudaMalloc of more than 64 KiB fails, by
# binding.c's own cudaMalloc on a GPU, HVD_STANDIN_CUDA_MALLOC_LIMIT on the
# stand-in): its allgather and grouped allreduce fail on every rank within
# 2 s naming it, and NCCL works after each.
if [ -x "$dir/binding" ]; then
  for np in 2 3; do
    # bound by hvd_init (HVD_NO_BIND=0), as a user of HVD_GPU_SHARE=1 is:
    # hvd_cuda_device says where the tensors are
    share_run "$tmp/oom.out" "$tmp/oom.err" env HVD_NO_BIND=0 "$HVD_MPIRUN_TEST" --np $np "$dir/binding" oom
    checks=`grep -c '^ok ' "$tmp/oom.out"`
    [ $rc = 0 ] && ! grep -q '^not ok' "$tmp/oom.out" && [ "$checks" = 11 ]
    check $? "rank $((np - 1)) of $np cannot allocate device memory: its allgather and grouped allreduce fail on every rank within 2 s naming it, NCCL works after each ($checks of 11 checks, status $rc)" ||
      { grep -v '^ok ' "$tmp/oom.out" | sed 's/^/#   /' | head -30; sed 's/^/#   /' "$tmp/oom.err" | head -10; }
  done
fi

# ---- a rank killed during a device allreduce over NCCL ----------------------
hvdrun=$HVD_TOP_BUILDDIR/bin/hvdrun
if [ -x "$hvdrun" ]; then
  t0=`date +%s`
  (
    HVD_GPU_SHARE=1
    export HVD_GPU_SHARE "$one"
    unset HVD_NCCL_TIMEOUT
    HVD_RUN_NO_CMA=${HVD_RUN_NO_CMA-1}
    export HVD_RUN_NO_CMA
    HVD_MPIRUN_TEST_LIB=1 . "$HVD_MPIRUN_TEST"
    hvd_mpirun 0 "$hvdrun" -np 3 "$dir/binding" kill 1
  ) >"$tmp/kill.out" 2>"$tmp/kill.err"
  rc=$?
  took=$((`date +%s` - t0))
  [ $rc = 137 ] &&
    grep -q "^hvdrun: rank 1 (`hostname`) was killed by signal 9 (Killed); ranks 0, 2 were stopped$" "$tmp/kill.err" &&
    ! grep -q "^kill: done" "$tmp/kill.out" && [ $took -le 20 ]
  check $? "rank 1 of 3 SIGKILLed in a device allreduce over NCCL on one GPU: status 137 (got $rc), hvdrun names it, no rank at the end, $took s (<= 20)" ||
    sed 's/^/#   /' "$tmp/kill.err" | head -20
fi

# ---- the examples on the one GPU over NCCL (a real GPU only) --------------
ex=$HVD_TOP_BUILDDIR/examples
if [ -z "${HVD_SHARE_BUILD:-}" ] && [ -x "$ex/bert_train" ]; then
  for p in "fp32 1e-5" "bf16 5e-3"; do
    set -- $p
    c="--steps 20 --seed 7 --device gpu --precision $1"
    share_run "$tmp/b1.out" "$tmp/b1.err" "$HVD_MPIRUN_TEST" --np 1 \
      "$ex/bert_train" $c --batch-size 8 --log-json "$tmp/b1.json" &&
      share_run "$tmp/b2.out" "$tmp/b2.err" "$HVD_MPIRUN_TEST" --np 2 \
        "$ex/bert_train" $c --batch-size 4 --log-json "$tmp/b2.json" &&
      losses_agree "$tmp/b1.json" "$tmp/b2.json" $2 >"$tmp/agree" 2>&1
    check $? "bert_train --device gpu --precision $1: np 2 x 4 over NCCL on one GPU follows np 1 x 8 to $2 over 20 steps (`tail -n 1 "$tmp/agree" | sed 's/^# //'`)" ||
      { sed 's/^/#   /' "$tmp/b2.err" | head -20; cat "$tmp/agree"; }
  done
fi
if [ -z "${HVD_SHARE_BUILD:-}" ] && [ -x "$ex/cifar_train" ]; then
  c="--steps 10 --synthetic 640 --synthetic-test 64 --quiet --device gpu"
  share_run "$tmp/c1.out" "$tmp/c1.err" "$HVD_MPIRUN_TEST" --np 1 \
    "$ex/cifar_train" $c --batch-size 16 --log-json "$tmp/c1.json" &&
    share_run "$tmp/c2.out" "$tmp/c2.err" "$HVD_MPIRUN_TEST" --np 2 \
      "$ex/cifar_train" $c --batch-size 8 --log-json "$tmp/c2.json" &&
    losses_agree "$tmp/c1.json" "$tmp/c2.json" 1e-3 >"$tmp/agree" 2>&1
  check $? "cifar_train --device gpu: np 2 x 8 over NCCL on one GPU (sync BN) follows np 1 x 16 to 1e-3 (`tail -n 1 "$tmp/agree" | sed 's/^# //'`)" ||
    { sed 's/^/#   /' "$tmp/c2.err" | head -20; cat "$tmp/agree"; }
fi

echo "1..$n"
exit $failed
