#!/bin/sh
# ckpt_pieces.sh - hvd_checkpoint_load into device tensors a piece at a
# time: t/standin/optim (t/gpu/optim.c on the stand-in) at np 2 with
# HVD_CHECKPOINT_PIECE=48, so that each device tensor's bytes arrive in
# pieces of 48 bytes, each copied to its offset in the tensor from the
# bounce buffer (lib/optim/checkpoint_bulk.c); every check of the program,
# its checkpoints loaded into device models included, passes.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/standin/optim
tmp=`mktemp -d "${TMPDIR:-/tmp}/ckpt_pieces.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
echo "1..1"
HVD_CHECKPOINT_PIECE=48 HVD_TEST_TIMEOUT=120 "$HVD_MPIRUN_TEST" --np 2 \
  "$prog" >"$tmp/out" 2>&1
rc=$?
oks=`grep -c '^ok' "$tmp/out"`
if [ $rc = 0 ] && [ "$oks" -gt 100 ] && ! grep -q '^not ok' "$tmp/out" &&
  grep -q '^ok .* - checkpoint: save from device, in the background' "$tmp/out"; then
  echo "ok 1 - t/standin/optim at np 2 with HVD_CHECKPOINT_PIECE=48: all $oks checks pass"
else
  echo "not ok 1 - t/standin/optim at np 2 with HVD_CHECKPOINT_PIECE=48 (status $rc, $oks ok)"
  grep -v '^ok' "$tmp/out" | sed 's/^/#   /' | head -60
  exit 1
fi
