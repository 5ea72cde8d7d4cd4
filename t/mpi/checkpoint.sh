#!/bin/sh
# checkpoint.sh - a checkpoint saved at one world size loads at any other.
# t/mpi/checkpoint (which see) saves 3 AdamW steps at np 2, then loads the
# file at np 1, 2 and 3 behind a distributed optimizer; every rank of each
# load checks the bits of the values, the optimizer state, lr, the step
# count and the step against its own 3 local steps; at np 3 and 2 again
# with the tensors' bytes sent in pieces of 48 and 100 (96) bytes
# (HVD_CHECKPOINT_PIECE), so that every tensor is split and batches fill
# up; a load into a sharded AdamW (ZeRO-1) at np 2 and 3 in 1 MiB pieces
# raises no rank's peak but 0's by 8 MiB, with the blocks the file's
# (checkpoint zero-memory). The same save with hvd_checkpoint_save_async, never waited for, is
# finished by the exit.
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/mpi/checkpoint
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT

if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make check)"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/checkpoint.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

n=0
failed=0
# run DESCRIPTION NP ARGS...: a TAP line, ok if the program exits 0; its
# output as TAP comments otherwise.
run() {
  what=$1
  np=$2
  shift 2
  n=$((n + 1))
  if "$HVD_MPIRUN_TEST" --np "$np" "$prog" "$@" >"$tmp/out" 2>&1; then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what"
    sed 's/^/#   /' "$tmp/out"
    failed=1
  fi
}

echo "1..11"
run "save at np 2" 2 save "$tmp/model.ckpt" 3
for np in 1 2 3; do
  run "load at np $np: every rank has the saved bits" $np \
    load "$tmp/model.ckpt" 3
done
for piece in 48:3 100:2; do
  HVD_CHECKPOINT_PIECE=${piece%:*}
  export HVD_CHECKPOINT_PIECE
  run "load at np ${piece#*:} in pieces of ${piece%:*} bytes: the saved bits" \
    ${piece#*:} load "$tmp/model.ckpt" 3
done
for np in 2 3; do
  HVD_CHECKPOINT_PIECE=1M
  export HVD_CHECKPOINT_PIECE
  run "a load into a ZeRO-1 AdamW at np $np in 1 MiB pieces holds no full state" \
    $np zero-memory "$tmp/zero$np.ckpt" 0
done
unset HVD_CHECKPOINT_PIECE
# hvd_checkpoint_save_async never waited for: the program ends with the
# write in flight, and its exit finishes the file
run "save_async at np 2, no wait: the program exits 0" 2 \
  save-async "$tmp/bg.ckpt" 3
run "... the file loads at np 3 with the saved bits" 3 load "$tmp/bg.ckpt" 3
n=$((n + 1))
if cmp -s "$tmp/model.ckpt" "$tmp/bg.ckpt"; then
  echo "ok $n - ... byte for byte the synchronous save's file"
else
  echo "not ok $n - ... byte for byte the synchronous save's file"
  failed=1
fi
exit $failed
