#!/bin/sh
# ckpt_pieces.sh - hvd_checkpoint_load into device tensors a piece at a
# time: t/standin/optim (t/gpu/optim.c on the stand-in) at np 2 with
# HVD_CHECKPOINT_PIECE=48, so that each device tensor's bytes arrive in
# pieces of 48 bytes, each copied to its offset in the tensor from the
# bounce buffer (lib/optim/checkpoint_bulk.c). Every check of the program
# passes (testlib.sh's tap_through: its plan met), its checkpoints loaded
# into device models included, and it exits 0.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/standin/optim
need_prog "$prog"
make_tmp ckpt_pieces
HVD_CHECKPOINT_PIECE=48 HVD_TEST_TIMEOUT=120 run_np 2 "$tmp/out" "$tmp/out" \
  "$prog"
tap_through "optim, pieces of 48 bytes" "$tmp/out"
grep -q '^ok .* - checkpoint: save from device, in the background' "$tmp/out"
check $? "... its device checkpoint case ran"
check $rc "... and it exits 0 (status $rc)"
echo "1..$n"
exit $failed
