#!/bin/sh
# hvd-bench's GPU modes (doc/bench.md): without a GPU, or in a build
# without CUDA, each prints one "# SKIP hvd-bench MODE: why" line (and a
# {"skipped": true} document with --json) and exits 0; with one, a small
# run of each exits 0 with every result checked. gpu-pack, which times
# libhvd's internal kernels, is bin/hvd-bench-kernels' (not installed);
# the installed hvd-bench says so. Bad arguments exit 2 before MPI
# starts. The programs link the CUDA runtime, never libcuda; the installed
# one links libhvd.so.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
bench="$HVD_TOP_BUILDDIR/bin/hvd-bench"
kernels="$HVD_TOP_BUILDDIR/bin/hvd-bench-kernels"
need_prog "$bench"
need_prog "$kernels"
make_tmp gpubench
mini="$HVD_TOP_SRCDIR/bench/workloads/bert-mini.tensors"

# run_mode NAME SUMMARY PROG ARGS...: one rank; exit 0 and either the skip
# line or the mode's SUMMARY line (a grep pattern), nothing WRONG.
run_mode() {
  name=$1
  summary=$2
  prog=$3
  shift 3
  run_np 1 "$tmp/out" "$tmp/err" "$prog" "$@"
  if grep -q "^# SKIP hvd-bench $name: " "$tmp/out"; then
    # a TAP skip that says why: "ok N - ... # SKIP <reason>"
    [ $rc = 0 ] && [ `wc -l <"$tmp/out"` = 1 ]
    check $? "$name: one skip line, status 0 # SKIP `sed 's/^# SKIP //' \
      "$tmp/out"`" || show "$tmp/err" stderr
    cp "$tmp/out" "$tmp/skipped"
  else
    [ $rc = 0 ] && grep -q "$summary" "$tmp/out" && ! grep -q WRONG "$tmp/out"
    check $? "$name runs on the GPU, status $rc, every result ok" || {
      show "$tmp/out" stdout
      show "$tmp/err" stderr
    }
  fi
}
run_mode gpu-pack '^gpu-pack: ' "$kernels" gpu-pack --max-bytes 64K \
  --counts 1,7 --iters 3 --warmup 1 --tensors "$mini"
run_mode staged '^staged: ' "$bench" staged --min-bytes 64K --max-bytes 1M \
  --iters 3 --warmup 1
run_mode "list --device gpu" '^hvd / cudaMemcpy: ' "$bench" list --device gpu \
  --tensors "$mini" --iters 3 --warmup 1

# the installed hvd-bench has no gpu-pack: the skip line (no GPU here) or
# status 2 and the program that has it
run_np 1 "$tmp/out" "$tmp/err" "$bench" gpu-pack --max-bytes 4K --counts 2
if grep -q '^# SKIP hvd-bench gpu-pack: ' "$tmp/out"; then
  [ $rc = 0 ]
else
  [ $rc = 2 ] && grep -qx "hvd-bench: gpu-pack times libhvd's internal kernels: run bin/hvd-bench-kernels of the build tree" "$tmp/err"
fi
check $? "installed hvd-bench: gpu-pack skips or names hvd-bench-kernels ($rc)" ||
  show "$tmp/err" stderr

# --json: one document, skipped or not
run_np 1 "$tmp/out" "$tmp/err" "$kernels" gpu-pack --json --max-bytes 4K \
  --counts 2 --iters 2
[ $rc = 0 ] && grep -q '"mode": "gpu-pack"' "$tmp/out"
check $? "gpu-pack --json, status $rc" || show "$tmp/out" stdout
if command -v python3 >/dev/null 2>&1; then
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/out"
  check $? "gpu-pack --json is valid JSON" || show "$tmp/out" stdout
fi

# the build says why it skipped (if it did): no CUDA in it, or no device
if [ -f "$tmp/skipped" ]; then
  if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
    grep -q '^# SKIP hvd-bench [a-z -]*: no CUDA device: ' "$tmp/skipped"
  else
    grep -q '^# SKIP hvd-bench [a-z -]*: this build has no CUDA' "$tmp/skipped"
  fi
  check $? "the skip line gives this build's reason" || show "$tmp/skipped" line
fi

# bad arguments: status 2 and one line, no mpirun needed
bad() {
  "$bench" "$@" >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q "^hvd-bench: " "$tmp/out"
  check $? "exit 2: hvd-bench $*" || show "$tmp/out" output
}
bad gpu-pack --counts 0
bad gpu-pack --counts 4,x
bad gpu-pack --counts ''
bad gpu-pack --coll allreduce
bad gpu-pack --device gpu
bad gpu-pack --max-bytes 2G
bad gpu-pack --min-bytes 1M --max-bytes 4K
bad gpu-pack extra
bad gpu-pack --tensors /nonexistent/x.tensors --iters 0
bad staged --counts 4
bad staged --iters -1
bad list --device tpu --tensors "$mini"
bad list --device gpu
bad sweep --device gpu
bad optim --device gpu --tensors "$mini"
# a workload file that does not exist: status 2 from the mode itself
run_np 1 "$tmp/out" "$tmp/out" "$kernels" gpu-pack --tensors /nonexistent/x
grep -q '^# SKIP' "$tmp/out" && [ $rc = 0 ] ||
  { [ $rc = 2 ] && grep -q 'x: No such file' "$tmp/out"; }
check $? "gpu-pack with a missing workload: skip or status 2 ($rc)" ||
  show "$tmp/out" output

# bench/bert-ops (a build with a CBLAS): each kernel entry of an encoder
# layer timed alone. Without a GPU one skip line giving this build's
# reason, status 0; with one, a tiny run: every entry's line in order
# with its time, the layer's sums, the plain kernels' line, and flash
# attention declining dh 32. Bad arguments: status 2 and the usage.
ops="$HVD_TOP_BUILDDIR/bench/bert-ops"
if [ -x "$ops" ]; then
  "$ops" --preset tiny --batch 2 --seq 32 --iters 2 --reps 1 >"$tmp/out" \
    2>"$tmp/err"
  rc=$?
  if grep -q '^# SKIP bert-ops: ' "$tmp/out"; then
    if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
      why='no CUDA device: '
    else
      why='this build has no CUDA'
    fi
    [ $rc = 0 ] && [ `wc -l <"$tmp/out"` = 1 ] &&
      grep -q "^# SKIP bert-ops: $why" "$tmp/out"
    check $? "bert-ops: one skip line with this build's reason, status 0" ||
      show "$tmp/out" stdout
  else
    {
      echo 'bert-ops tiny B2xS32 bf16 (H 64, A 2, F 256): per call, median of 1 reps of 2'
      for op in 'linear H->H forward' 'linear H->H backward' \
        'linear H->F forward' 'linear H->F backward' 'linear F->H forward' \
        'linear F->H backward' 'gelu forward' 'gelu backward' \
        'layernorm forward' 'layernorm backward' 'add + layernorm forward' \
        'layernorm backward + copy' 'attention forward' 'attention backward'; do
        echo "$op"
      done
      echo 'one layer'
      echo 'plain kernels'
      echo 'flash attention: does not fit S 32, dh 32, bf16'
    } >"$tmp/want"
    # each line's words before its figures, in order
    sed -e 's/^  //' -e 's/: forward .*//' -e 's/: add + .*//' \
      -e 's/ *[0-9][0-9.]* ms.*//' "$tmp/out" >"$tmp/got"
    [ $rc = 0 ] && cmp -s "$tmp/want" "$tmp/got" &&
      [ `grep -c ' ms' "$tmp/out"` = 16 ]
    check $? "bert-ops runs on the GPU, status $rc, every entry timed" || {
      diff "$tmp/want" "$tmp/got" >"$tmp/diff"
      show "$tmp/diff" diff
      show "$tmp/err" stderr
    }
  fi
  "$ops" --seq 0 >"$tmp/out" 2>&1
  rc=$?
  [ $rc = 2 ] && grep -q '^usage: bench/bert-ops ' "$tmp/out"
  check $? "bert-ops --seq 0: status 2 and the usage ($rc)" ||
    show "$tmp/out" output
fi

# the CUDA runtime only, never the driver library; the installed program
# links libhvd.so (the kernels one is static: it calls internals)
if command -v readelf >/dev/null 2>&1; then
  # the ELF file behind libtool's wrapper script, where there is one
  elf() { if [ -f "${1%/*}/.libs/${1##*/}" ]; then echo "${1%/*}/.libs/${1##*/}"; else echo "$1"; fi; }
  for p in "$bench" "$kernels"; do
    readelf -d "`elf "$p"`" >"$tmp/dyn" 2>&1
    ! grep -q 'NEEDED.*\[libcuda\.so' "$tmp/dyn"
    check $? "${p##*/} does not link libcuda" || show "$tmp/dyn" readelf
    if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
      grep -q 'NEEDED.*\[libcudart\.so' "$tmp/dyn"
      check $? "${p##*/} links libcudart" || show "$tmp/dyn" readelf
    fi
  done
  readelf -d "`elf "$bench"`" >"$tmp/dyn" 2>&1
  grep -q 'NEEDED.*\[libhvd\.so\.0\]' "$tmp/dyn"
  check $? "hvd-bench links libhvd.so.0" || show "$tmp/dyn" readelf
fi
echo "1..$n"
exit $failed
