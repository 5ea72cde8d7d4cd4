#!/usr/bin/env bash
# bench/gpu-session.sh - everything a session on a lent GPU machine runs,
# in one command (doc/gpu-testing.md, "One command on the GPU machine"):
#
#   bash bench/gpu-session.sh [options] [STAGE...]
#
# run from the root of a checkout that holds .ompi/ and hvd-*.tar.gz
# (bench/prepare-gpu-carry.sh makes both; a runner carries them). The GPU
# machine needs a C compiler, make and the CUDA toolkit; no Open MPI, no
# autotools, no network. Stages, in this order whatever the order given:
#
#   env        nvidia-smi, nvcc, compilers, glibc, python3/torch, NCCL
#   build      Open MPI from .ompi (PATH, LD_LIBRARY_PATH, OPAL_PREFIX...
#              as doc/gpu-testing.md says), the tarball unpacked under
#              --work, ./configure --with-cuda (and --with-nccl where NCCL
#              is found: the toolkit, or python3's nvidia-nccl wheel),
#              make -jN; kept for later calls while the machine is warm
#   gpu-tests  make check of the GPU tests (t/gpu/*), share.sh among them:
#              NCCL between 2-4 ranks on the one GPU (HVD_GPU_SHARE=1)
#   bench      hvd-bench-kernels gpu-pack, list --device gpu and staged on
#              bert-base (text and --json)
#   bert       bench/bert-ops (each kernel of an encoder layer timed alone,
#              base at B x 128 and B x 512); then
#              examples/bert_train --device gpu (bf16, --cuda-graphs,
#              --zero 1; fp32 at B 8), mini at B 32 x S 128, base at
#              B 32 x S 128, B 128 x S 128 and B 32 x S 512, tokens/s and
#              MFU (over a bf16 GEMM's peak measured here), against
#              python3 examples/bert/torch_bert.py of this checkout at
#              each shape: AMP bf16 eager with SDPA and fused AdamW, and
#              --best (the same under torch.compile; skipped where it is
#              missing), each with bert_train's ratio to it and issue
#              28's target (met or missed); with time left, at base
#              Hugging Face's BertForMaskedLM (torch_bert.py --hf) the
#              same way as eager, and float32 eager at B 8; each side
#              skipped when absent
#   check      the whole make check
#   all        every stage above (the default)
#
# A stage that needs the build makes it first when it is not there. Each
# stage runs under `timeout` within --budget seconds from the start (default
# 560: a runner's 10-minute command less the time to hand the files back);
# one that does not fit is skipped and says so, so that a later call can
# run it: `bash bench/gpu-session.sh check bert`.
#
# Output, all under $OUT (default /tmp/gpu-session-out), at most 8 files:
#   summary.txt  one block per stage: status, seconds, the lines that matter
#   env.txt  build.log  tests.log (the GPU tests' logs)  bench.txt
#   bench.json  bert.txt  check.tar.gz (every log of the whole suite)
# and summary.txt is printed last. Options:
#   --budget S     seconds for all the stages (default 560)
#   --work DIR     build directory (default /tmp/hvd-gpu-session)
#   --jobs N       make -jN (default: nproc)
#   --dry-run      print what each stage would run, run nothing
# Environment: OUT; BERT_BATCH, BERT_BATCH_BIG (the bert stage's batches,
# default 32 and 128); BERT_STEPS_MINI, BERT_STEPS_BASE (steps per bert run,
# default 200 and 60); TORCH_BERT_ARGS (more arguments for both of
# torch_bert.py's runs).
# Exit status: 0 when every stage that ran passed (skips are not failures),
# 1 otherwise, 2 for a bad command line.
set -u
exec </dev/null 3>&1 # fd 3: the terminal, for --dry-run's commands

start=$(date +%s)
budget=560
work=/tmp/hvd-gpu-session
jobs=$(nproc 2>/dev/null || echo 4)
dry=0
stages=""
usage() { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case $1 in
  --budget) budget=${2:?--budget needs seconds}; shift ;;
  --work) work=${2:?--work needs a directory}; shift ;;
  --jobs) jobs=${2:?--jobs needs a number}; shift ;;
  --dry-run) dry=1 ;;
  -h | --help) usage; exit 0 ;;
  env | build | gpu-tests | bench | bert | check) stages="$stages $1" ;;
  all) stages="$stages env build gpu-tests bench bert check" ;;
  *) echo "gpu-session: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$stages" ] || stages="env build gpu-tests bench bert check"
case $budget$jobs in *[!0-9]*) echo "gpu-session: --budget and --jobs take integers" >&2; exit 2 ;; esac
want() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }

repo=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu-session-out}
mkdir -p "$OUT" "$work" || exit 1
summary=$OUT/summary.txt
: >"$summary"
failed=0

left() { echo $((budget - ($(date +%s) - start))); }
note() { echo "$*" | tee -a "$summary"; }
# stage_begin NAME NEEDS: 1 (and a note) when fewer than NEEDS seconds are
# left; else the stage's header.
stage_begin() {
  stage_t0=$(date +%s)
  if [ "$(left)" -lt "$2" ]; then
    note ""
    note "== $1: SKIPPED, $(left) s left of the budget, it needs about $2 s; run it in another call: bash bench/gpu-session.sh $1"
    return 1
  fi
  note ""
  note "== $1 (at $(($(date +%s) - start)) s)"
  return 0
}
stage_end() { # NAME STATUS
  local s=PASS
  [ "$2" = 0 ] || { s="FAIL (status $2$([ "$2" = 124 ] && echo ': timed out'))"; failed=1; }
  note "== $1: $s in $(($(date +%s) - stage_t0)) s"
}
# limit SECONDS: what a stage may take: SECONDS, or what is left (less 5 s).
limit() {
  local l=$(($(left) - 5))
  [ "$1" -lt "$l" ] && l=$1
  [ "$l" -gt 1 ] || l=1
  echo $l
}
# x CMD...: run (or, with --dry-run, print) a command.
x() {
  if [ $dry = 1 ]; then
    echo "+ $*" >&3
    return 0
  fi
  "$@"
}
# in_src CMD...: x in the build directory.
in_src() {
  if [ $dry = 1 ]; then
    echo "+ (cd $src && $*)" >&3
    return 0
  fi
  (cd "$src" && "$@")
}
# run1 SECONDS PROGRAM ARGS...: PROGRAM on one rank through the build's
# hvdrun (root variables, HVD_* forwarded), under a timeout.
run1() {
  local t=$1
  shift
  x timeout "$t" "$src/bin/hvdrun" -np 1 "$@"
}

# ---- Open MPI from .ompi (doc/gpu-testing.md, step 2) -----------------------
O=$repo/.ompi
sys_ld_path=${LD_LIBRARY_PATH:-} # python3 (torch) runs without .ompi's libraries
ompi_env() {
  [ -x "$O/usr/bin/mpirun" ] || return 1
  export PATH=$O/usr/bin:$PATH
  export LD_LIBRARY_PATH=$O/usr/lib/x86_64-linux-gnu:$O/usr/lib/x86_64-linux-gnu/openmpi/lib:$O/usr/lib/x86_64-linux-gnu/blas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$O/usr
  export OPAL_SYSCONFDIR=$O/etc/openmpi
  export PMIX_PKGLIBDIR=$O/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export PMIX_PKGDATADIR=$O/usr/lib/x86_64-linux-gnu/pmix2/share/pmix
  export OMPI_MCA_mca_base_component_show_load_errors=0
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}
have_ompi=0
ompi_env && have_ompi=1

# ---- CUDA and NCCL -----------------------------------------------------------
cuda_dir() {
  local d
  for d in ${CUDA_HOME:-} /usr/local/cuda; do
    [ -n "$d" ] && [ -f "$d/include/cuda_runtime.h" ] && { echo "$d"; return 0; }
  done
  d=$(command -v nvcc) || return 1
  d=$(dirname "$(dirname "$(readlink -f "$d")")")
  [ -f "$d/include/cuda_runtime.h" ] && echo "$d"
}
# nccl_dir: a directory with include/nccl.h and lib/libnccl.so: the
# toolkit's, or one made under --work from python3's nvidia-nccl wheel
# (which has libnccl.so.2 only).
nccl_dir() {
  local c=$1 h l
  if [ -f "$c/include/nccl.h" ] && ls "$c"/lib*/libnccl.so >/dev/null 2>&1; then
    echo "$c"
    return 0
  fi
  # every nccl.h until one has its library beside it (a toolkit may ship
  # the header without the library, while the wheel has both)
  l=""
  for h in $(timeout 60 find /usr/include /usr/local /opt $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
    -name nccl.h -path '*include*' 2>/dev/null); do
    h=$(dirname "$h")
    l=$(ls "$h"/../lib*/libnccl.so* /usr/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
    [ -n "$l" ] && break
  done
  [ -n "$l" ] || return 1
  mkdir -p "$work/nccl/lib"
  ln -sfn "$h" "$work/nccl/include"
  ln -sf "$(readlink -f "$l")" "$work/nccl/lib/libnccl.so"
  ln -sf "$(readlink -f "$l")" "$work/nccl/lib/libnccl.so.2"
  echo "$work/nccl"
}

tarball=$(ls -t "$repo"/hvd-*.tar.gz 2>/dev/null | head -1)
src=""
[ -n "$tarball" ] && src=$work/$(basename "$tarball" .tar.gz)

# ---- env ---------------------------------------------------------------------
if want env && stage_begin env 10; then
  {
    echo "# date: $(date -u)"
    echo "# uname: $(uname -a)"
    echo "# nproc: $(nproc)  memory: $(free -g 2>/dev/null | awk '/Mem/ {print $2 " GiB"}')"
    echo "# glibc: $(ldd --version 2>&1 | head -1)"
    h=none
    for f in /usr/include/cblas.h /usr/include/x86_64-linux-gnu/cblas.h; do [ -f "$f" ] && h=$f; done
    echo "# cblas.h: $([ "$h" != none ] && echo "$h" || echo 'none on the system (.ompi has the reference BLAS)')"
    for t in gcc cc make nvcc python3 readelf timeout; do
      echo "# $t: $(command -v $t || echo MISSING)"
    done
    nvcc --version 2>&1 | tail -2
    gcc --version 2>&1 | head -1
    echo "# cuda dir: $(cuda_dir || echo none)"
    c=$(cuda_dir) && ls "$c"/lib64/libcublas.so* "$c"/lib64/libcudart.so* 2>&1
    echo "# nccl: $(nccl_dir "$(cuda_dir)" 2>/dev/null || echo none found)"
    echo "# tarball: ${tarball:-NONE}  .ompi: $([ $have_ompi = 1 ] && echo yes || echo MISSING)"
    echo "# mpirun: $(command -v mpirun) $(mpirun --version 2>&1 | head -1)"
    timeout 20 nvidia-smi 2>&1
    timeout 20 nvidia-smi -q -d CLOCK,POWER,PERFORMANCE 2>&1 | head -60
    LD_LIBRARY_PATH=$sys_ld_path timeout 60 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1
  } >"$OUT/env.txt" 2>&1
  grep -E '^# (nvcc|make|gcc|cuda dir|nccl|cblas.h|tarball|mpirun):' "$OUT/env.txt" >>"$summary"
  grep -m1 -E 'NVIDIA H|Tesla|NVIDIA [A-Z]' "$OUT/env.txt" >>"$summary"
  stage_end env 0
fi

# ---- build -------------------------------------------------------------------
built() { [ -n "$src" ] && [ -f "$src/.gpu-session-built" ] &&
  [ "$(cat "$src/.gpu-session-built")" = "$(cksum <"$tarball")" ]; }
do_build() {
  local c n rc nccl_opt=--without-nccl
  [ -n "$tarball" ] || { note "no hvd-*.tar.gz in $repo: run bench/prepare-gpu-carry.sh and carry it"; return 1; }
  [ $have_ompi = 1 ] || { note "no .ompi in $repo: run bench/prepare-gpu-carry.sh and carry it"; return 1; }
  c=$(cuda_dir) || { note "no CUDA toolkit (/usr/local/cuda, CUDA_HOME or nvcc on PATH)"; return 1; }
  n=$(nccl_dir "$c") && nccl_opt=--with-nccl=$n
  # a CBLAS for examples/bert_train: the system's, else .ompi's reference
  # BLAS (the GPU paths use cuBLAS; the CPU ones are only the tests' here)
  local blas=()
  if [ ! -f /usr/include/cblas.h ] && [ ! -f /usr/include/x86_64-linux-gnu/cblas.h ] &&
    [ -f "$O/usr/include/cblas/cblas.h" ]; then
    blas=("CPPFLAGS=-isystem $O/usr/include/cblas"
      "BLAS_LIBS=-L$O/usr/lib/x86_64-linux-gnu/blas -lblas")
    note "CBLAS: none on the system: .ompi's reference BLAS"
  fi
  note "tarball $(basename "$tarball"), CUDA $c, NCCL ${n:-none}, Open MPI $O, make -j$jobs"
  {
    x rm -rf "$src" && x tar -xzf "$tarball" -C "$work" &&
      in_src timeout "$(limit 300)" ./configure --with-cuda="$c" "$nccl_opt" "${blas[@]}" \
        MPI_CFLAGS="-I$O/usr/lib/x86_64-linux-gnu/openmpi/include" \
        MPI_LIBS="-L$O/usr/lib/x86_64-linux-gnu/openmpi/lib -lmpi" &&
      in_src timeout "$(limit 400)" make -j"$jobs" &&
      in_src timeout "$(limit 300)" make -j"$jobs" check TESTS=
  } >"$OUT/build.log" 2>&1
  rc=$?
  sed -n '/^configure:$/,/warnings:/p' "$OUT/build.log" >>"$summary"
  if [ $rc = 0 ] && [ $dry = 0 ]; then
    cksum <"$tarball" >"$src/.gpu-session-built"
  fi
  [ $rc = 0 ] || tail -30 "$OUT/build.log" | tee -a "$summary"
  return $rc
}
build_rc=""
need_build() {
  [ -n "$build_rc" ] && return "$build_rc"
  if built; then
    note ""
    note "== build: already there ($src, from the same tarball)"
    build_rc=0
    return 0
  fi
  if stage_begin build 120; then
    do_build
    build_rc=$?
    stage_end build $build_rc
  else
    build_rc=1
  fi
  return $build_rc
}
want build && need_build

# ---- gpu-tests -----------------------------------------------------------------
# every test of t/gpu (t/gpu/local.mk), and t/unit/optim.t, whose device
# branch needs a GPU
gpu_tests="t/gpu/kernels.t t/gpu/binding.sh t/gpu/share.sh t/gpu/collectives.np1 t/gpu/collectives.np2 t/gpu/collectives.np4 t/gpu/optim.np1 t/gpu/optim.np2 t/gpu/optim.np4 t/gpu/bert_layers.t t/gpu/bert_device.sh t/gpu/cnn.np1 t/gpu/cnn.np2 t/gpu/cifar_device.sh t/gpu/bench.sh t/gpu/soak.sh t/gpu/optim_soak.sh t/unit/optim.t"
# summarize LOG: the harness's counts and what did not pass
summarize() {
  grep -E '^# (TOTAL|PASS|SKIP|XFAIL|FAIL|XPASS|ERROR):' "$1" | tail -7 >>"$summary"
  grep -E '^(FAIL|ERROR|XPASS):' "$1" | head -20 >>"$summary"
  grep -E '^SKIP:' "$1" | head -20 >>"$summary"
}
if want gpu-tests && need_build && stage_begin gpu-tests 60; then
  in_src timeout "$(limit 400)" make -j"$jobs" check TESTS="$gpu_tests" >"$OUT/tests.log" 2>&1
  rc=$?
  summarize "$OUT/tests.log"
  for t in $gpu_tests; do
    l=${t%.t}
    l=${l%.sh}.log
    { echo; echo "======== $l"; cat "$src/$l" 2>&1; } >>"$OUT/tests.log"
  done
  stage_end gpu-tests $rc
fi

# ---- bench -----------------------------------------------------------------------
if want bench && need_build && stage_begin bench 60; then
  wl=$src/bench/workloads/bert-base.tensors
  rc=0
  : >"$OUT/bench.txt"
  json="{"
  for m in "gpu-pack --tensors $wl" "list --device gpu --tensors $wl" "staged --tensors $wl"; do
    key=${m%% *}
    [ "$key" = list ] && key=list-gpu
    # shellcheck disable=SC2086
    { echo "\$ hvd-bench-kernels $m"; run1 "$(limit 200)" "$src/bin/hvd-bench-kernels" $m 2>&1; echo "(status $?)"; echo; } >>"$OUT/bench.txt"
    # shellcheck disable=SC2086
    run1 "$(limit 200)" "$src/bin/hvd-bench-kernels" $m --json >"$OUT/bench.one.json" 2>>"$OUT/bench.txt" || rc=1
    [ -s "$OUT/bench.one.json" ] || echo null >"$OUT/bench.one.json"
    json="$json$([ "$json" = "{" ] || echo ,)\"$key\": $(cat "$OUT/bench.one.json")"
  done
  echo "$json}" >"$OUT/bench.json"
  rm -f "$OUT/bench.one.json"
  grep -q '(status [1-9]' "$OUT/bench.txt" && rc=1
  grep -E '^(gpu-pack|staged|hvd / cudaMemcpy): |^# SKIP|^# launch floor|WRONG|status [1-9]' "$OUT/bench.txt" >>"$summary"
  stage_end bench $rc
fi

# ---- bert ------------------------------------------------------------------------
# torch_bert SECONDS ARGS...: examples/bert/torch_bert.py ARGS (and
# $TORCH_BERT_ARGS) under a limit of SECONDS, its output appended to
# bert.txt and kept in bert.torch.txt for torch_json; its status.
torch_bert() {
  local t=$1 s
  shift
  echo "\$ python3 torch_bert.py $* ${TORCH_BERT_ARGS:-}" >>"$OUT/bert.txt"
  # shellcheck disable=SC2086
  LD_LIBRARY_PATH=$sys_ld_path PYTHONUNBUFFERED=1 x timeout "$(limit "$t")" python3 "$torch_py" "$@" ${TORCH_BERT_ARGS:-} >"$OUT/bert.torch.txt" 2>&1
  s=$?
  cat "$OUT/bert.torch.txt" >>"$OUT/bert.txt"
  echo "(status $s)" >>"$OUT/bert.txt"
  return $s
}
# torch_json KEY: KEY's value in the last torch_bert's JSON line
torch_json() {
  grep '^{' "$OUT/bert.torch.txt" 2>/dev/null | tail -1 | grep -o "\"$1\": [^,}]*" | sed 's/^[^:]*: //'
}
# gemm_peak: the dense bf16 TFLOP/s of a large torch.matmul (8192^3, the
# best of 3 timings of 20) on this GPU, the denominator of MFU; empty
# without torch or CUDA.
gemm_peak() {
  LD_LIBRARY_PATH=$sys_ld_path timeout 60 python3 - <<'PY' 2>/dev/null
import torch
if torch.cuda.is_available():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            a @ b
        e.record()
        torch.cuda.synchronize()
        best = max(best, 20 * 2 * n ** 3 / (s.elapsed_time(e) / 1e3) / 1e12)
    print("%.0f" % best)
PY
}
# mfu TOKENS_PER_S L H F S V: model FLOPs per second over the GEMM peak,
# in percent. Model FLOPs per token of a training step: 3 x the forward's,
# 2 L (4 H^2 + 2 H F + 2 S H) for the encoder (projections, FFN, the two
# attention products) plus 2 x 0.15 (H^2 + H V) for the head on the
# masked 15 %: the same count for bert_train and torch_bert.py.
mfu() {
  [ -n "$peak" ] && [ -n "$1" ] || { echo "?"; return; }
  awk -v t="$1" -v L="$2" -v H="$3" -v F="$4" -v S="$5" -v V="$6" -v p="$peak" 'BEGIN {
    f = 3 * (2 * L * (4 * H * H + 2 * H * F + 2 * S * H) + 2 * 0.15 * (H * H + H * V))
    printf "%.1f", 100 * t * f / (p * 1e12) }'
}
# verdict X Y [TARGET]: X / Y to 2 places and whether it reaches TARGET
# ("1.12 (target >= 1.1: met)"; "1.12" without one); "?" without both.
verdict() {
  awk -v x="$1" -v y="$2" -v w="${3:-}" 'BEGIN {
    if (!(x > 0 && y > 0)) print "?"
    else if (w == "") printf "%.2f", x / y
    else printf "%.2f (target >= %s: %s)", x / y, w, (x / y >= w ? "met" : "missed") }'
}
# dims FILE: "L H F S V" from bert_train's setup line in FILE.
dims() {
  sed -n 's/^bert_train: preset [a-z]* (L=\([0-9]*\) H=\([0-9]*\) A=[0-9]* F=\([0-9]*\) V=\([0-9]*\) P=[0-9]* S=\([0-9]*\) .*/\1 \2 \3 \5 \4/p' "$1" | head -1
}
if want bert && need_build && stage_begin bert 60; then
  rc=0
  : >"$OUT/bert.txt"
  trainer=$src/examples/bert_train
  torch_py=$repo/examples/bert/torch_bert.py
  peak=""
  [ $dry = 1 ] || peak=$(gemm_peak)
  # what each side needs: a CUDA device for bert_train (t/gpu/binding
  # count), torch with CUDA for the references; without, a line each
  gpus=1
  torch_cuda=1
  if [ $dry = 0 ]; then
    gpus=$("$src/t/gpu/binding" count 2>/dev/null | cut -d' ' -f1)
    LD_LIBRARY_PATH=$sys_ld_path timeout 120 python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' >/dev/null 2>&1 || torch_cuda=0
  fi
  [ "${gpus:-0}" -gt 0 ] 2>/dev/null || note "bert: no CUDA device here ($("$src/t/gpu/binding" count 2>&1 | cut -d' ' -f2-)): the C side is skipped"
  [ $torch_cuda = 1 ] || note "bert: python3 has no torch with CUDA here: the PyTorch side is skipped"
  note "bert: dense bf16 GEMM peak ${peak:-?} TFLOP/s (torch.matmul 8192^3; MFU's denominator)"
  # where an encoder layer's time goes, each kernel entry alone
  # (bench/bert-ops: products, LayerNorms fused and plain, GELU, the
  # attention by default and as flash), at base B x 128 and B x 512
  ops=$src/bench/bert-ops
  if [ "${gpus:-0}" -gt 0 ] 2>/dev/null && { [ $dry = 1 ] || [ -x "$ops" ]; }; then
    for s in 128 512; do
      echo "\$ bench/bert-ops --preset base --batch ${BERT_BATCH:-32} --seq $s" >>"$OUT/bert.txt"
      x timeout "$(limit 60)" "$ops" --preset base --batch "${BERT_BATCH:-32}" --seq $s >"$OUT/bert.one.txt" 2>&1
      st=$?
      cat "$OUT/bert.one.txt" >>"$OUT/bert.txt"
      note "bert ops base B${BERT_BATCH:-32}xS$s: $(grep 'one layer' "$OUT/bert.one.txt" | sed 's/^ *//') (status $st)"
      note "bert ops base B${BERT_BATCH:-32}xS$s: $(grep 'flash attention' "$OUT/bert.one.txt" | sed 's/^ *//')"
    done
  fi
  # issue 28's shapes: a batch that fills the GPU (B 32-128) at S 128
  # and 512. mini at B x 128; base at B x 128, BIG x 128 and B x 512.
  B=${BERT_BATCH:-32}
  BIG=${BERT_BATCH_BIG:-128}
  vocab=
  for p in mini base; do
    if [ $p = mini ]; then
      steps=${BERT_STEPS_MINI:-200}
      shapes="$B:128"
    else
      steps=${BERT_STEPS_BASE:-60}
      shapes="$B:128 $BIG:128 $B:512"
    fi
    first=1
    for shape in $shapes; do
      b=${shape%%:*}
      s=${shape##*:}
      tag="$p B${b}xS$s"
      c=""
      d=""
      if ! [ "${gpus:-0}" -gt 0 ] 2>/dev/null; then
        : # said above
      elif [ $dry = 0 ] && [ ! -x "$trainer" ]; then
        note "bert $tag: no $trainer in this build: C side skipped"
      elif [ $dry = 0 ] && ! "$trainer" --help 2>&1 | grep -q -- '--precision'; then
        note "bert $tag: examples/bert_train has no --precision option in this build: C side skipped"
      else
        # bf16 (the GPU's default); --cuda-graphs (each encoder layer's
        # kernels one graph: what launches cost); --zero 1 (the sharded
        # optimizer; issue 27's target: >= 0.9x bf16); at the first shape
        # fp32 at B 8 (before/after), --plain-kernels (what the fused
        # kernels gain), --no-sync (no reduction) and with time left
        # --host-fences (the host waits per stage, the pre-0.1 way) and
        # BERT's recipe (clipping to 1.0 and no decay for biases and
        # LayerNorm weights: what the norm kernel costs) and LAMB with it
        # (NVIDIA's pretraining optimizer: its two passes and the one
        # copy of the norms to the host); at mini with time left PowerSGD
        # at rank 4 from step 5 (its kernels' first run: what the
        # compression costs at one rank) and Adasum (--adasum: every
        # gradient staged through host memory, NCCL having no Adasum: what
        # the staging costs at one rank); at the big batch
        # --no-sync; at S 512 --flash-attention
        case $p:$first:$s in
        mini:1:*) modes="bf16 graphs zero1 fp32-b8 powersgd adasum" ;;
        base:1:*) modes="bf16 graphs zero1 fp32-b8 plain no-sync host-fences recipe lamb" ;;
        base:0:128) modes="bf16 graphs zero1 no-sync" ;;
        *) modes="bf16 graphs flash" ;;
        esac
        for mode in $modes; do
          args="--batch-size $b --seq-len $s"
          case $mode in
          flash) args="$args --flash-attention" ;;
          plain) args="$args --plain-kernels" ;;
          graphs) args="$args --cuda-graphs" ;;
          fp32-b8) args="--batch-size 8 --seq-len $s --precision fp32" ;;
          zero1) args="$args --zero 1" ;;
          host-fences) args="$args --host-fences" ;;
          no-sync) args="$args --no-sync" ;;
          recipe) args="$args --clip-grad-norm 1 --no-decay bias,LayerNorm.weight" ;;
          lamb) args="$args --optimizer lamb --clip-grad-norm 1 --no-decay bias,LayerNorm.weight" ;;
          powersgd) args="$args --powersgd 4 --powersgd-start 5" ;;
          adasum) args="$args --adasum" ;;
          esac
          case $mode in host-fences | recipe | lamb | powersgd | adasum) [ "$(left)" -ge 300 ] || continue ;; esac
          echo "\$ bert_train --device gpu --preset $p --steps $steps $args" >>"$OUT/bert.txt"
          # bf16 and --zero 1 time hvd's device groups too (HVD_GPU_TIMING:
          # issue 27's idle time between groups; a few events per group)
          timing=0
          case $mode in bf16 | zero1) timing=1 ;; esac
          HVD_GPU_TIMING=$timing run1 "$(limit 150)" "$trainer" --device gpu --preset $p --steps "$steps" $args >"$OUT/bert.one.txt" 2>&1
          st=$?
          cat "$OUT/bert.one.txt" >>"$OUT/bert.txt"
          echo "(status $st)" >>"$OUT/bert.txt"
          [ $st = 0 ] || rc=1
          # the corpus sets the vocabulary (synthetic: about 119): torch must use the same V
          v=$(grep -o ' V=[0-9]*' "$OUT/bert.one.txt" | head -1 | tr -dc 0-9)
          [ -n "$v" ] && vocab=$v
          t=$(grep '^done' "$OUT/bert.one.txt" | tail -1 | grep -o 'tokens/s [0-9.]*' | tr -dc 0-9.)
          extra=""
          [ $mode = zero1 ] && extra="; / bf16 = $(verdict "$t" "$c" 0.9)"
          case $mode in recipe | lamb | powersgd | adasum) extra="; / bf16 = $(verdict "$t" "$c")" ;; esac
          note "bert C $tag $mode: tokens/s ${t:-no result}, MFU $(mfu "$t" $(dims "$OUT/bert.one.txt")) % (status $st)$extra"
          gt=$(grep '^gpu timing' "$OUT/bert.one.txt" | tail -1)
          [ $timing = 0 ] || note "bert C $tag $mode: ${gt:-no gpu timing line (HVD_GPU_TIMING=1)}"
          [ $mode = bf16 ] && { c=$t; d=$(dims "$OUT/bert.one.txt"); }
        done
        rm -f "$OUT/bert.one.txt"
      fi
      if [ $torch_cuda = 0 ]; then
        first=0
        continue
      fi
      if [ ! -f "$torch_py" ]; then
        note "bert $tag: no examples/bert/torch_bert.py in this checkout: PyTorch side skipped"
        first=0
        continue
      fi
      targs="--preset $p --steps $steps --batch $b --seq $s${vocab:+ --vocab $vocab}"
      # the references of issue 28, at the same shape: AMP bf16 eager with
      # SDPA and fused AdamW (target: bert_train >= 1.1x), then the same
      # under torch.compile (--best; target >= 1.0x; compiling, 30-60 s at
      # base, is in the untimed warmup)
      for ref in eager best; do
        if [ $ref = eager ]; then
          torch_bert 150 $targs --precision bf16 --sdpa --fused-adamw
        elif ! LD_LIBRARY_PATH=$sys_ld_path x timeout 60 python3 -c 'import sys, torch; sys.exit(not hasattr(torch, "compile"))' >/dev/null 2>&1; then
          note "bert torch-best $tag: this torch has no torch.compile"
          continue
        elif [ "$(left)" -lt 90 ]; then
          note "bert torch-best $tag: no result ($(left) s left of the budget)"
          continue
        else
          torch_bert 240 $targs --best
        fi
        st=$?
        [ $st = 0 ] || rc=1
        t=$(torch_json tokens_per_s)
        want=1.1
        [ $ref = best ] && want=1.0
        note "bert torch-$ref $tag: tokens/s ${t:-no result}, MFU $(mfu "$t" $d) %; bert_train bf16 / this = $(verdict "$c" "$t" $want) (status $st$([ $ref = best ] && echo ", compile $(torch_json compile_s) s, timed recompiles $(torch_json timed_recompiles)"))"
      done
      # a second reference at base, with time left: Hugging Face
      # transformers' BertForMaskedLM (torch_bert.py --hf: the same model
      # and loss, its head on every position as its users run it), AMP
      # bf16 eager with SDPA and fused AdamW; no target
      if [ $p = base ] && [ "$(left)" -ge 120 ]; then
        if ! LD_LIBRARY_PATH=$sys_ld_path x timeout 60 python3 -c 'import transformers' >/dev/null 2>&1; then
          note "bert hf-eager $tag: python3 has no transformers here"
        else
          torch_bert 150 $targs --precision bf16 --sdpa --fused-adamw --hf
          st=$?
          t=$(torch_json tokens_per_s)
          note "bert hf-eager $tag: tokens/s ${t:-no result}; bert_train bf16 / this = $(verdict "$c" "$t") (status $st)"
        fi
      fi
      # float32 eager at B 8, explicit attention: the earlier sessions'
      # reference, for continuity, at the first shape with time left
      if [ $first = 1 ] && [ "$(left)" -ge 150 ]; then
        torch_bert 120 --preset $p --steps $steps --batch 8 --seq $s${vocab:+ --vocab $vocab}
        st=$?
        note "bert torch-fp32-b8 $tag: tokens/s $(torch_json tokens_per_s) (status $st)"
      fi
      first=0
    done
  done
  rm -f "$OUT/bert.torch.txt"
  stage_end bert $rc
fi
# ---- check -------------------------------------------------------------------------
if want check && need_build && stage_begin check 120; then
  in_src timeout "$(limit 500)" make -j"$jobs" check >"$OUT/check.log" 2>&1
  rc=$?
  summarize "$OUT/check.log"
  [ $rc = 124 ] && note "check: stopped by the budget (timeout); the logs so far are in check.tar.gz"
  if [ $dry = 0 ]; then
    mv "$OUT/check.log" "$src/check.log"
    (cd "$src" && { echo check.log; find t examples -name '*.log'; [ -f test-suite.log ] && echo test-suite.log; } |
      tar -czf "$OUT/check.tar.gz" -T -) || note "check: packing the logs failed"
  else
    rm -f "$OUT/check.log"
  fi
  stage_end check $rc
fi

note ""
note "== done in $(($(date +%s) - start)) s of $budget; $([ $failed = 0 ] && echo 'every stage that ran passed' || echo 'SOME STAGE FAILED'); files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
echo
echo "================ summary ($summary)"
cat "$summary"
exit $failed
