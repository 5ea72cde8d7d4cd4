#!/bin/sh
# replay.sh - every fuzz target (t/fuzz/local.mk) over its corpus,
# t/fuzz/corpus/TARGET/: the seeds and every input that once crashed one,
# without libFuzzer (TAP). Each must run them all and exit 0, with no
# sanitizer report in a sanitizer build.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
make_tmp fuzz_replay
unset HVD_LOG_LEVEL
HVD_LOG_LEVEL=error
export HVD_LOG_LEVEL

echo "1..4"
for t in checkpoint settings text; do
  prog=$HVD_TOP_BUILDDIR/t/fuzz/replay_$t
  corpus=$HVD_TOP_SRCDIR/t/fuzz/corpus/$t
  if [ ! -x "$prog" ]; then
    n=$((n + 1))
    echo "ok $n # SKIP no $prog (the text target needs a CBLAS build)"
    continue
  fi
  want=`ls "$corpus" | wc -l`
  "$prog" "$corpus" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 0 ] && grep -qx "replay: $want inputs" "$tmp/out"
  check $? "$t: the $want inputs of t/fuzz/corpus/$t replay cleanly (exit $rc)" ||
    show "$tmp/out" output
done
# The seeds reach the reader's end: the valid ones load (else the
# fuzzer would only ever see a refusal at the first bytes).
prog=$HVD_TOP_BUILDDIR/t/fuzz/replay_checkpoint
FUZZ_VERBOSE=1 "$prog" "$HVD_TOP_SRCDIR/t/fuzz/corpus/checkpoint/v1-model.ckpt" \
  "$HVD_TOP_SRCDIR/t/fuzz/corpus/checkpoint/v2-state.ckpt" \
  "$HVD_TOP_SRCDIR/t/fuzz/corpus/checkpoint/v5-state.ckpt" >"$tmp/out" 2>&1
printf '%s\n' "checkpoint: loaded" "state: restored" "state: restored" \
  >"$tmp/want"
grep -A2 'v1-model.ckpt$' "$tmp/out" | sed -n 2p >"$tmp/got"
grep -A2 'v2-state.ckpt$' "$tmp/out" | sed -n 3p >>"$tmp/got"
grep -A2 'v5-state.ckpt$' "$tmp/out" | sed -n 3p >>"$tmp/got"
cmp -s "$tmp/want" "$tmp/got"
check $? "checkpoint: the seed v1-model.ckpt loads, v2-state.ckpt and v5-state.ckpt restore" ||
  show "$tmp/out" output
exit $failed
