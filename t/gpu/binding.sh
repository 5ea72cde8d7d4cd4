#!/bin/sh
# binding.sh - hvd_init's GPU binding (TAP), through t/gpu/binding (which
# see), with HVD_NO_BIND set for each run (t/mpirun-test would set it to 1):
#
#   1. np 1, binding on: the rank is on device 0.
#   2. np 2, one GPU visible (CUDA_VISIBLE_DEVICES = the first visible),
#      binding on: hvd_init fails on both ranks with HVD_ERR_CUDA and
#      "hvd_init: local ranks 0 and 1 are both bound to GPU <bus id>; give
#      each rank its own GPU (HVD_NO_BIND=1 leaves binding to you;
#      HVD_GPU_SHARE=1 allows it, for tests)".
#   3. the same with HVD_NO_BIND=1: hvd_init works, nothing is bound.
#   4. np 2 with every GPU visible, when there are two or more: ranks on
#      devices 0 and 1.
#   5. HVD_GPU_SHARE=1 on one visible GPU at np 2, 3 and 4: every rank on
#      device 0, each with its own NCCL_HOSTID, and a device allreduce over
#      NCCL between them is exact (real NCCL over its socket transport on
#      a GPU machine); with one NCCL_HOSTID given to all at np 2, NCCL
#      refuses: "Duplicate GPU detected".
#
# Skips ("no CUDA device: ...") when the build has no CUDA or
# cudaGetDeviceCount finds no device or fails. HVD_BINDING_PROG names
# another build of binding.c to run (t/standin/binding.sh: the stand-in's).

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=${HVD_BINDING_PROG:-$HVD_TOP_BUILDDIR/t/gpu/binding}

if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make check)"
  exit 0
fi
count=`"$prog" count`
why=${count#* }
count=${count%% *}
if [ "$count" = 0 ]; then
  echo "1..0 # SKIP no CUDA device: $why"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/binding.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

n=0
failed=0
# run DESCRIPTION NP NO_BIND VISIBLE MODE [VAR=VALUE...]: one run of the
# program, as one TAP line (its own TAP shown as comments), with the
# variables given. VISIBLE "" keeps CUDA_VISIBLE_DEVICES as it is.
run() {
  n=$((n + 1))
  (
    HVD_NO_BIND=$3
    export HVD_NO_BIND
    np=$2 visible=$4 mode=$5
    shift 5
    for v in "$@"; do export "$v"; done
    set -- x "$np" x "$visible" "$mode"
    if [ -n "$4" ]; then
      CUDA_VISIBLE_DEVICES=$4
      export CUDA_VISIBLE_DEVICES
    fi
    "$HVD_MPIRUN_TEST" --np "$2" "$prog" "$5"
  ) >"$tmp/out" 2>&1
  rc=$?
  if [ $rc = 0 ] && ! grep -q '^not ok' "$tmp/out"; then
    echo "ok $n - $1"
  else
    echo "not ok $n - $1 (status $rc)"
    failed=1
  fi
  sed 's/^/#   /' "$tmp/out"
}

first=${CUDA_VISIBLE_DEVICES:-0}
first=${first%%,*}
run "np 1: bound to device 0" 1 0 "" bind
run "np 2 on one GPU: hvd_init fails, naming both ranks" 2 0 "$first" shared
run "np 2 on one GPU with HVD_NO_BIND=1: hvd_init works" 2 1 "$first" nobind
for np in 2 3 4; do
  run "np $np on one GPU with HVD_GPU_SHARE=1: NCCL between the ranks" $np 0 \
    "$first" share HVD_GPU_SHARE=1
done
run "HVD_GPU_SHARE=1 with one NCCL_HOSTID for all: Duplicate GPU detected" 2 0 \
  "$first" share HVD_GPU_SHARE=1 NCCL_HOSTID=same
if [ "$count" -ge 2 ]; then
  run "np 2 on $count GPUs: ranks on devices 0 and 1" 2 0 "" bind
else
  n=$((n + 1))
  echo "ok $n # SKIP np 2 on two GPUs: $count GPU visible"
fi
echo "1..$n"
exit $failed
