#!/bin/sh
# share.sh - NCCL between ranks that share one GPU (HVD_GPU_SHARE=1: each
# rank gets its own NCCL_HOSTID, so NCCL takes the ranks for separate hosts
# and connects them over its socket transport; doc/gpu-testing.md). The
# multi-rank GPU tests, their NCCL pass included, with every rank on the
# first visible GPU: t/gpu/collectives and t/gpu/optim at np 2, 3 and 4,
# t/gpu/cnn at np 2. One check per run: the program passes, and its NCCL
# pass ran (hvd_init of the "nccl" pass is an "ok" line, not a skip).
#
# Skips without a GPU. HVD_SHARE_BUILD names another build of the programs
# and HVD_SHARE_ENV the variable that leaves one GPU visible
# (t/standin/share.sh: the stand-in's, HVD_STANDIN_DEVICES=1); by default
# t/gpu's and CUDA_VISIBLE_DEVICES=<the first visible>.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
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
echo "1..$n"
exit $failed
