#!/bin/sh
# bench/ddp-vs-hvd.sh - examples/bert_train (hvd, bin/hvdrun) against
# PyTorch DistributedDataParallel on the CPU (gloo, bench/ddp_bert.py):
# the same model, batch, data and optimizer, run alternately (the order
# swapped every pair) so that both see the same machine: a VM's speed
# drifts by more than the difference measured. Prints each pair's
# tokens/s and ratio hvd/DDP, then the median and mean of the ratios.
#
#   bench/ddp-vs-hvd.sh [-n PAIRS] [-np RANKS] [--steps N] [--data FILE]
#                       [--no-sync] [--recipe]
#
# Run it from a built tree (it uses bin/hvdrun and examples/bert_train),
# with nothing else running. Defaults: 5 pairs, 2 ranks, 30 steps, preset
# mini, vocabulary 30,522 (--data: a corpus from bench/make-corpus.py,
# made in a temporary file when not given), --seq-len 128, --batch-size 8
# per rank, 1 thread per rank, AdamW with bert_train's defaults; tokens/s
# leave the first 2 steps out in both. --no-sync: both without gradient
# reduction (the compute ceilings). --recipe: both with BERT's recipe,
# no weight decay for biases and LayerNorm weights and the gradients
# clipped to norm 1.0 (bert_train --no-decay bias,LayerNorm.weight
# --clip-grad-norm 1; clip_grad_norm_ in DDP). PYTHON: the python with torch
# (default: the first of python3, /usr/bin/python3 that imports it);
# HVDRUN replaces bin/hvdrun; DDP_OPTS adds options to ddp_bert.py (e.g.
# "--bucket-cap-mb 50 --gradient-as-bucket-view"). Exit status 0; 1 if a
# run failed or the two models differ; 2 a bad argument.
set -u
. "$(dirname "$0")/ratio-summary.sh"
bad() { echo "ddp-vs-hvd.sh: $*" >&2; exit 2; }
fail() { echo "ddp-vs-hvd.sh: $*" >&2; exit 1; }
count() { # a positive number for option $1, or exit 2
  case $2 in '' | *[!0-9]* | 0*) bad "$1 takes a positive number, not '$2'" ;; esac
}
pairs=5 np=2 steps=30 data= nosync= recipe=
while [ $# -gt 0 ]; do
  case $1 in
  -n | -np | --steps)
    [ $# -ge 2 ] || bad "$1 needs a value"
    count "$1" "$2"
    case $1 in -n) pairs=$2 ;; -np) np=$2 ;; *) steps=$2 ;; esac
    shift 2 ;;
  --data)
    [ $# -ge 2 ] || bad "$1 needs a value"
    data=$2; shift 2 ;;
  --no-sync) nosync=--no-sync; shift ;;
  --recipe) recipe="--no-decay bias,LayerNorm.weight --clip-grad-norm 1"; shift ;;
  -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) bad "unknown argument '$1' (try --help)" ;;
  esac
done
[ "$steps" -gt 2 ] || bad "--steps must be above 2 (the first 2 are not timed)"
here=$(cd "$(dirname "$0")" && pwd)
[ -x examples/bert_train ] ||
  fail "no examples/bert_train here: run it from a built tree"
[ -n "${HVDRUN:-}" ] || [ -x bin/hvdrun ] || fail "no bin/hvdrun here"
hvdrun=${HVDRUN:-bin/hvdrun}
if [ -z "${PYTHON:-}" ]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch' 2>/dev/null; then PYTHON=$p; break; fi
  done
  [ -n "${PYTHON:-}" ] ||
    fail "no python3 with torch (apt-get install python3-torch, or set PYTHON)"
fi
tmp=$(mktemp -d) || fail "mktemp failed"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM
if [ -z "$data" ]; then
  data=$tmp/corpus.txt
  "$PYTHON" "$here/make-corpus.py" >"$data" 2>"$tmp/corpus.err" ||
    fail "make-corpus.py failed: $(cat "$tmp/corpus.err")"
fi
[ -r "$data" ] || fail "cannot read --data '$data'"

# "tokens/s N (mean, first 2 steps excluded)" from the summary line; the
# whole output is kept in $tmp/$1.out for the model check
tps() {
  sed -n 's/^done .* tokens\/s \([0-9]*\) (mean.*/\1/p' "$tmp/$1.out"
}
hvd() {
  $hvdrun -np "$np" examples/bert_train --quiet --preset mini \
    --data "$data" --vocab-size 30522 --seq-len 128 --batch-size 8 \
    --threads 1 --steps "$steps" $nosync $recipe >"$tmp/hvd.out" 2>&1 &&
    tps hvd
}
ddp() {
  "$PYTHON" "$here/ddp_bert.py" --nproc "$np" --preset mini \
    --data "$data" --vocab-size 30522 --seq 128 --batch 8 \
    --threads 1 --steps "$steps" $nosync $recipe ${DDP_OPTS:-} \
    >"$tmp/ddp.out" 2>&1 &&
    tps ddp
}
# the model's dimensions from each banner: "(L=4 ... B=8), 11201594 weights"
dims() { sed -n 's/^[a-z_]*: preset .*\((L=.*), [0-9]* weights\).*/\1/p' "$tmp/$1.out"; }
show() { echo "--- $1 output:" >&2; tail -5 "$tmp/$1.out" >&2; }

ratios=
echo "# np=$np, preset mini, V 30522, S 128, B 8 per rank, $steps steps," \
  "1 thread per rank${nosync:+, --no-sync}${recipe:+, $recipe};" \
  "hvd bert_train vs $PYTHON" \
  "bench/ddp_bert.py${DDP_OPTS:+ $DDP_OPTS} (torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
for i in $(seq "$pairs"); do
  if [ $((i % 2)) -eq 1 ]; then
    h=$(hvd) && [ -n "$h" ] || { show hvd; fail "the hvd run failed"; }
    d=$(ddp) && [ -n "$d" ] || { show ddp; fail "the DDP run failed"; }
    order="hvd first"
  else
    d=$(ddp) && [ -n "$d" ] || { show ddp; fail "the DDP run failed"; }
    h=$(hvd) && [ -n "$h" ] || { show hvd; fail "the hvd run failed"; }
    order="DDP first"
  fi
  if [ "$i" -eq 1 ]; then
    echo "# hvd: $(dims hvd)"
    echo "# DDP: $(dims ddp)"
    [ "$(dims hvd)" = "$(dims ddp)" ] || fail "the two models differ"
  fi
  r=$(awk -v h="$h" -v d="$d" 'BEGIN { printf "%.3f", h / d }')
  ratios="$ratios $r"
  echo "pair $i ($order): hvd $h  DDP $d  tokens/s  ratio hvd/DDP $r"
done
ratio_summary "ratio hvd/DDP" "$ratios"
