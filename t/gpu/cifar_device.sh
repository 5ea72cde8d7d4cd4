#!/bin/sh
# cifar_device.sh - examples/cifar_train --device (TAP):
#
#   1. --device gpu in a build without CUDA, at np 1 and np 2: exit 1, and
#      the program's stderr is exactly one line per rank, "cifar_train:
#      --device gpu: this build has no CUDA (configure found no toolkit,
#      or --without-cuda)", before any training (no summary on stdout);
#   2. the same in a build with CUDA on a machine without a usable GPU:
#      exit 1 and "cifar_train: --device gpu: no CUDA device: <why>" on
#      each rank; with a GPU instead, at np 1: 10 steps whose losses follow
#      the CPU's run to 1e-3, then np 2 x 8 images (ranks sharing the GPU
#      through the host-staged executor) following np 1 x 16 on the GPU to
#      1e-3 (synchronized batch norm on device tensors);
#   3. --device with another value: exit 2 with the reason.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/cifar_train
grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h" ||
  skip_all "examples/cifar_train is not built: configure found no CBLAS"
need_prog "$prog"
make_tmp cifar_device
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-120}
export HVD_TEST_TIMEOUT

if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
  cuda=yes
else
  cuda=no
fi
nocuda="cifar_train: --device gpu: this build has no CUDA (configure found no toolkit, or --without-cuda)"
nodev="cifar_train: --device gpu: no CUDA device: "
common="--steps 10 --synthetic 640 --synthetic-test 64 --quiet"

# ours FILE: the program's lines of stderr FILE (not mpiexec's).
ours() {
  grep '^cifar_train:' "$1"
}
# train NAME NP ARGS...: stdout in $tmp/NAME.out, stderr .err, losses .json
train() {
  train_name=$1 train_np=$2
  shift 2
  run_np "$train_np" "$tmp/$train_name.out" "$tmp/$train_name.err" "$prog" \
    --log-json "$tmp/$train_name.json" "$@"
  return $rc
}
explain() {
  show "$tmp/$1.out" "$1: stdout"
  show "$tmp/$1.err" "$1: stderr"
}

gpu=unknown
# np 2 may share one GPU: the host-staged device executor (NCCL refuses
# two ranks on one GPU)
HVD_GPU_OPERATIONS=mpi
export HVD_GPU_OPERATIONS
for np in 1 2; do
  train gpu$np $np $common --device gpu --batch-size $((16 / np))
  if [ $cuda = no ]; then
    [ "`ours "$tmp/gpu$np.err" | sort -u`" = "$nocuda" ] &&
      [ "`ours "$tmp/gpu$np.err" | wc -l`" -eq $np ] && [ $rc = 1 ] &&
      ! grep -q '^done' "$tmp/gpu$np.out"
    check $? "np $np, no CUDA in the build: exit 1 (got $rc), on each rank: $nocuda" ||
      explain gpu$np
    continue
  fi
  if [ $rc != 0 ] && ours "$tmp/gpu$np.err" | head -n 1 | grep -q "^$nodev"; then
    gpu=no
    [ "`ours "$tmp/gpu$np.err" | wc -l`" -eq $np ] && [ $rc = 1 ] &&
      ! grep -q '^done' "$tmp/gpu$np.out"
    check $? "np $np, no GPU: exit 1 (got $rc), on each rank: `ours "$tmp/gpu$np.err" | head -n 1`" ||
      explain gpu$np
    continue
  fi
  gpu=yes
  if [ $np = 1 ]; then
    train cpu1 1 $common --batch-size 16 && [ $rc = 0 ] &&
      losses_agree "$tmp/cpu1.json" "$tmp/gpu1.json" 1e-3
    check $? "np 1 on a GPU: 10 steps, the CPU's losses to 1e-3" ||
      { explain gpu1; explain cpu1; }
  else
    [ $rc = 0 ] && losses_agree "$tmp/gpu1.json" "$tmp/gpu2.json" 1e-3
    check $? "np 2 x 8 on the GPU (sync BN): np 1 x 16's losses to 1e-3" ||
      explain gpu2
  fi
done

run_np 0 "$tmp/bad.out" "$tmp/bad.err" "$prog" --device tpu
grep -q "^cifar_train: --device needs cpu or gpu, not 'tpu' (try --help)$" \
  "$tmp/bad.err" && [ $rc = 2 ]
check $? "--device tpu: exit 2 (got $rc) and the reason" || show "$tmp/bad.err" stderr

echo "1..$n"
exit $failed
