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
# (checkpoint zero-memory); nor, with bfloat16 parameters, do a save and
# a load of their float32 masters (checkpoint zero-mixed-memory); a
# sharded save gathers one parameter's state on rank 0 at a time, and
# one into a missing directory fails on every rank without a hang
# (checkpoint zero-save-memory); t/mpi/mixed_shard passes at np 3 with
# 48-byte pieces (its masters' blocks ending mid-piece). A file changed in place while it loads (the
# shim t/mpi/crash_rename.so flips a byte just before rank 0's N-th read
# of it) fails on every rank with HVD_ERR_CORRUPT (13) and its message: a
# byte of a tensor (the checksum taken again) or of the outline (compared
# as rank 0 reads past it) after the file was checked, and "checksum
# mismatch" before; with no change the shim's load succeeds. The same
# save with hvd_checkpoint_save_async, never waited for, is
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

echo "1..20"
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
  run "a bfloat16 ZeRO-1 AdamW at np $np saves and loads with no whole master" \
    $np zero-mixed-memory "$tmp/mixed$np.ckpt" 0
  # AddressSanitizer, when built in, keeps freed memory resident (its
  # quarantine): here each parameter's gathered state is freed after it
  asan_was=${ASAN_OPTIONS-}
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=0"
  export ASAN_OPTIONS
  run "a ZeRO-1 save at np $np gathers one parameter's state at a time" \
    $np zero-save-memory "$tmp/zsave$np.ckpt" 0
  ASAN_OPTIONS=$asan_was
  rm -f "$tmp/zero$np.ckpt"* "$tmp/mixed$np.ckpt"* "$tmp/zsave$np.ckpt"*
done
# t/mpi/mixed_shard (bfloat16 and float16 masters under ZeRO-1, 257
# elements) at np 3 in pieces of 48 bytes (12 floats): the ranks' blocks
# end mid-piece, and every piece is rounded into the values
HVD_CHECKPOINT_PIECE=48
export HVD_CHECKPOINT_PIECE
n=$((n + 1))
if "$HVD_MPIRUN_TEST" --np 3 "$HVD_TOP_BUILDDIR/t/mpi/mixed_shard" \
  >"$tmp/out" 2>&1; then
  echo "ok $n - mixed_shard at np 3 in pieces of 48 bytes: every check passes"
else
  echo "not ok $n - mixed_shard at np 3 in pieces of 48 bytes"
  sed 's/^/#   /' "$tmp/out"
  failed=1
fi
unset HVD_CHECKPOINT_PIECE
# changed NAME READ AT TAIL: a copy of model.ckpt loaded at np 2 while
# byte AT flips before rank 0's READ-th read of it; TAIL: what every rank
# is told after "hvd_checkpoint_load: '<path>': ", or "" for a load that
# works.
shim=$HVD_TOP_BUILDDIR/t/mpi/.libs/crash_rename.so
real=`cd "$tmp" && pwd -P`
# The shim reaches the ranks only (-x). ASan, when built in, must
# tolerate a library preloaded ahead of it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
changed() {
  cp "$tmp/model.ckpt" "$real/$1.ckpt"
  n=$((n + 1))
  if [ ! -f "$shim" ]; then
    echo "ok $n # SKIP no shared $shim (configured without shared libraries?)"
    return
  fi
  HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x HVD_TEST_CHANGE_FILE=$real/$1.ckpt -x HVD_TEST_CHANGE_READ=$2 -x HVD_TEST_CHANGE_AT=$3" \
    "$HVD_MPIRUN_TEST" --np 2 "$prog" load "$real/$1.ckpt" 3 >"$tmp/out" 2>&1
  rc=$?
  if [ -z "$4" ] && [ $rc = 0 ]; then
    echo "ok $n - $1: the shim's load with no change works"
  elif [ -n "$4" ] && [ $rc != 0 ] &&
    grep -q '^#   rank 0: expected 0, got 13$' "$tmp/out" &&
    grep -q '^#   rank 1: expected 0, got 13$' "$tmp/out" &&
    grep -Fqx "# hvd_checkpoint_load: '$real/$1.ckpt': $4" "$tmp/out"; then
    echo "ok $n - $1: every rank fails with HVD_ERR_CORRUPT: $4"
  else
    echo "not ok $n - $1 (status $rc): $4"
    sed 's/^/#   /' "$tmp/out"
    failed=1
  fi
}
size=`wc -c <"$tmp/model.ckpt"`
mix="the file changed while it was loaded (it no longer matches what was checked); the model holds a mix of its old and new bytes"
# Rank 0's reads of this small file: 1 its header, 2 the checksum's, 3
# the stored checksum, 4 the window the outline is made from; from 5 on
# the load's own, in file order: 5 the header and the bytes before the
# first tensor, 6 the first tensor's piece. A byte flipped before a read
# that passed it already is not a change to the load (it loads).
changed tensor-changed 6 $((size - 100)) "$mix"
changed outline-changed 5 40 "$mix"
changed changed-first 1 $((size - 100)) "checksum mismatch (file corrupt)"
changed unchanged 1000 40 ""

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
