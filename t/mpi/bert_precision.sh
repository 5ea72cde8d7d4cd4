#!/bin/sh
# bert_precision.sh - examples/bert_train --precision on the CPU, where
# bf16 and fp16 run the numerical model of the GPU's mixed precision
# (examples/bert/layers_lp.c) with hvd's float32 master weights:
#  1. 20 steps of one global batch of 8 at np 1 in fp32, bf16 and fp16
#     (fp16 with GradScaler's defaults), and bf16
#     at np 2 (4 per rank) and np 3 (uneven 3 per rank: a batch of 9):
#     every run exits 0 and says its precision; bf16 follows fp32 to 5e-3
#     relative at every step (measured 2.7e-4) and bf16 at np 2 follows
#     bf16 at np 1 to 2e-3 (1.8e-4; its gradients are summed in
#     bfloat16); bf16 --zero 1 at np 2 (float32 masters and AdamW state
#     sharded) gives np 2's losses bit for bit; fp16 logs a finite loss
#     at every step and ends below where it started;
#  2. the command line: --precision fp8, --precision bf16 with --tf32 or
#     --dense-embeddings, --cuda-graphs without --device gpu exit 2 with
#     the reason.
# Each run is bounded by the wrapper's timeout (HVD_TEST_TIMEOUT, 90 s).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/bert_train
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-90}
export HVD_TEST_TIMEOUT
need_bert_train
make_tmp bert_precision

pass() { check 0 "$1"; }
fail() { check 1 "$1"; }

# ---- 1. training ------------------------------------------------------------
common="--steps 20 --seed 7"
for run in "fp32 1 8" "bf16 1 8" "fp16 1 8" "bf16 2 4" "bf16 3 3"; do
  set -- $run
  name=$1np$2
  if train $name $2 $common --batch-size $3 --precision $1 &&
    grep -q "^bert_train: preset tiny (L=2 .* B=$3\( $1\)\{0,1\}), " \
      "$tmp/$name.out" &&
    { [ $1 = fp32 ] || grep -q "B=$3 $1)" "$tmp/$name.out"; }; then
    pass "--precision $1 at np $2 x $3: exit 0, the setup line says $1"
  else
    fail "--precision $1 at np $2 x $3: exit 0, the setup line says $1"
    show_run $name
  fi
done
if losses_agree "$tmp/fp32np1.json" "$tmp/bf16np1.json" 5e-3; then
  pass "bf16 follows fp32 at every step (5e-3)"
else
  fail "bf16 follows fp32 at every step (5e-3)"
fi
if losses_agree "$tmp/bf16np1.json" "$tmp/bf16np2.json" 2e-3; then
  pass "bf16 at np 2 x 4 follows np 1 x 8 (2e-3)"
else
  fail "bf16 at np 2 x 4 follows np 1 x 8 (2e-3)"
fi
if train zero1 2 $common --batch-size 4 --precision bf16 --zero 1 &&
  [ -n "`losses "$tmp/zero1.json"`" ]; then
  pass "bf16 --zero 1 at np 2 x 4: exit 0"
else
  fail "bf16 --zero 1 at np 2 x 4: exit 0"
  show_run zero1
fi
if [ -n "`losses "$tmp/zero1.json"`" ] &&
  [ "`losses "$tmp/zero1.json"`" = "`losses "$tmp/bf16np2.json"`" ]; then
  pass "bf16 --zero 1 (masters and state sharded): np 2's losses bit for bit"
else
  fail "bf16 --zero 1 (masters and state sharded): np 2's losses bit for bit"
fi
if [ "`losses "$tmp/bf16np3.json" | wc -l`" = 20 ]; then
  pass "bf16 at np 3: 20 steps logged"
else
  fail "bf16 at np 3: 20 steps logged"
  show_run bf16np3
fi
if losses "$tmp/fp16np1.json" | awk '
    { n++; if ($1 != $1 + 0 || $1 ~ /nan|inf/) bad = 1; if (n == 1) a = $1; b = $1 }
    END { printf "# fp16: %d steps, %s -> %s\n", n, a, b; exit !(n == 20 && !bad && b < a) }'; then
  pass "fp16 (loss scaling from 2^16): 20 finite losses, the last below the first"
else
  fail "fp16 (loss scaling from 2^16): 20 finite losses, the last below the first"
fi

# ---- 2. command line ------------------------------------------------------
# refused ARGS MESSAGE: exit 2 and MESSAGE as stderr's first line.
refused() {
  "$HVD_MPIRUN_TEST" --np 0 "$prog" $1 >"$tmp/opt.out" 2>"$tmp/opt.err"
  rc=$?
  if [ $rc = 2 ] && [ "`sed -n 1p "$tmp/opt.err"`" = "$2" ]; then
    pass "'$1': exit 2, '$2'"
  else
    fail "'$1': exit 2, '$2' (status $rc)"
    show_run opt
  fi
}
refused "--precision fp8" \
  "bert_train: --precision needs fp32, bf16 or fp16, not 'fp8'"
refused "--device gpu --tf32 --precision bf16" \
  "bert_train: --tf32 is for float32 products: not with --precision bf16"
refused "--precision fp16 --dense-embeddings" \
  "bert_train: --dense-embeddings: --precision fp16 has dense embeddings only"
refused "--precision bf16 --tf32" "bert_train: --tf32 needs --device gpu"
refused "--cuda-graphs" "bert_train: --cuda-graphs needs --device gpu"
refused "--plain-kernels" "bert_train: --plain-kernels needs --device gpu"
echo "1..$n"
exit $failed
