#!/bin/sh
# bert_device.sh - examples/bert_train --device (TAP):
#
#   1. --device gpu in a build without CUDA, at np 1 and np 2: exit 1, and
#      the program's stderr is exactly one line (mpiexec adds its own
#      report, left out), "bert_train: --device gpu: this build has no
#      CUDA (configure found no toolkit, or --without-cuda)", before any
#      training (no summary on stdout);
#   2. the same in a build with CUDA on a machine without a usable GPU:
#      exit 1 and one line "bert_train: --device gpu: no CUDA device: no
#      NVIDIA driver or GPU found (cudaGetDeviceCount: <the CUDA runtime's
#      reason>)" (hvd_cuda_unavailable);
#      with a GPU instead: 5 steps of the tiny model train (exit 0, the
#      summary line), at np 1;
#   3. --device with another value, and --tf32 without --device gpu:
#      exit 2 with the reason (a bad command line).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/bert_train
need_bert_train
make_tmp bert_device

if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
  cuda=yes
else
  cuda=no
fi
nocuda="bert_train: --device gpu: this build has no CUDA (configure found no toolkit, or --without-cuda)"
nodev="bert_train: --device gpu: no CUDA device: "

# ours FILE: the program's lines of stderr FILE (not mpiexec's).
ours() {
  grep '^bert_train:' "$1"
}
# one_line FILE TEXT: the program said exactly the line TEXT.
one_line() {
  [ "`ours "$1" | wc -l`" -eq 1 ] && [ "`ours "$1"`" = "$2" ]
}

for np in 1 2; do
  run_np $np "$tmp/out" "$tmp/err" "$prog" --device gpu --steps 5
  if [ $cuda = no ]; then
    one_line "$tmp/err" "$nocuda" && [ $rc = 1 ] && ! grep -q '^done' "$tmp/out"
    check $? "np $np, no CUDA in the build: exit 1 (got $rc), one line: $nocuda" ||
      { show "$tmp/out" stdout; show "$tmp/err" stderr; }
    continue
  fi
  if [ $rc != 0 ] && ours "$tmp/err" | head -n 1 | grep -q "^$nodev"; then
    [ "`ours "$tmp/err" | wc -l`" -eq 1 ] && [ $rc = 1 ] &&
      ! grep -q '^done' "$tmp/out"
    check $? "np $np, no GPU: exit 1 (got $rc), one line: `ours "$tmp/err"`" ||
      { show "$tmp/out" stdout; show "$tmp/err" stderr; }
  elif [ $np = 1 ]; then
    [ $rc = 0 ] && grep -q '^done  steps 5 ' "$tmp/out"
    check $? "np 1 on a GPU: 5 steps train (exit $rc)" ||
      { show "$tmp/out" stdout; show "$tmp/err" stderr; }
  else
    n=$((n + 1))
    echo "ok $n # SKIP np 2 on a GPU: covered by np 1 (ranks may share it)"
  fi
done

run_np 0 "$tmp/out" "$tmp/err" "$prog" --device tpu
grep -q "^bert_train: --device needs cpu or gpu, not 'tpu'$" "$tmp/err" &&
  [ $rc = 2 ]
check $? "--device tpu: exit 2 (got $rc) and the reason" ||
  show "$tmp/err" stderr
run_np 0 "$tmp/out" "$tmp/err" "$prog" --tf32
grep -q '^bert_train: --tf32 needs --device gpu$' "$tmp/err" && [ $rc = 2 ]
check $? "--tf32 without --device gpu: exit 2 (got $rc) and the reason" ||
  show "$tmp/err" stderr

echo "1..$n"
exit $failed
