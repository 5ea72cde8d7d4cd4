#!/bin/sh
# cifar_train.sh - examples/cifar_train end to end (doc/cifar_train.md).
#  1. synchronized batch norm makes the world size invisible: 10 steps at
#     np 1 with 16 images and at np 2 with 8 per rank give the same loss
#     at every step (1e-5 relative); with --local-bn np 2 does not;
#  2. the quick run learns: after 3 epochs of the synthetic set at np 2
#     the test accuracy is at least 0.5 (chance: 0.1), printed per epoch;
#  3. a checkpoint of np 2 (step 5 of 10) resumes at np 1 with the same
#     global batch and continues the curve (1e-5);
#  4. --data DIR with CIFAR-10 binary files (made here: 200 training and
#     40 test images) trains and counts them; a file that is not CIFAR-10
#     binary, or a directory without data_batch_1.bin, ends the job with
#     exit 1 and the reason;
#  5. --help exits 0; a bad option exits 2.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/examples/cifar_train
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-90}
export HVD_TEST_TIMEOUT

if ! grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h"; then
  echo "1..0 # SKIP examples/cifar_train is not built: configure found no CBLAS"
  exit 0
fi
if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make)"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/cifar_train.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0

n=0
failed=0
pass() { n=$((n + 1)); echo "ok $n - $1"; }
fail() { n=$((n + 1)); echo "not ok $n - $1"; failed=1; }
show() {
  for f in "$tmp/$1.out" "$tmp/$1.err"; do
    [ -f "$f" ] && sed 's/^/#   /' "$f"
  done
}
# train NAME NP ARGS...: stdout/stderr in $tmp/NAME.out/.err, the loss
# log in $tmp/NAME.json; returns the exit status.
train() {
  name=$1 np=$2
  shift 2
  "$HVD_MPIRUN_TEST" --np "$np" "$prog" --log-json "$tmp/$name.json" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.err"
}
losses() { sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$tmp/$1.json"; }
# agree A B TOL [FIRST]: B's losses are A's from step FIRST on, to TOL.
agree() {
  losses "$1" >"$tmp/a.txt"
  losses "$2" >"$tmp/b.txt"
  awk -v tol="$3" -v first="${4:-1}" '
    NR == FNR { a[NR] = $1; na = NR; next }
    { nb++; x = a[first + nb - 1]; d = x - $1; if (d < 0) d = -d
      r = d / (x < 0 ? -x : x); if (r > worst) worst = r
      if (r > tol) { printf "# step %d: %s vs %s\n", first + nb - 1, x, $1; bad = 1 } }
    END { if (nb == 0 || first + nb - 1 != na) bad = 1
          printf "# largest relative difference %.3g over %d steps\n", worst, nb
          exit bad }' "$tmp/a.txt" "$tmp/b.txt"
}

echo "1..10"

# ---- 1. world-size equivalence ----------------------------------------
common="--steps 10 --synthetic 640 --synthetic-test 64 --quiet"
if train one 1 $common --batch-size 16 && train two 2 $common --batch-size 8 &&
  agree one two 1e-5; then
  pass "sync BN: np 2 x 8 images has np 1 x 16's losses (1e-5)"
else
  fail "sync BN: np 2 x 8 images has np 1 x 16's losses (1e-5)"
  show one; show two
fi
if train local 2 $common --batch-size 8 --local-bn && ! agree one local 1e-4 >/dev/null; then
  pass "--local-bn: np 2 x 8 differs from np 1 x 16 (per-rank statistics)"
else
  fail "--local-bn: np 2 x 8 differs from np 1 x 16 (per-rank statistics)"
  show local
fi

# ---- 2. it learns -------------------------------------------------------
if train learn 2 --epochs 3 --synthetic 1280 --synthetic-test 256 &&
  [ `grep -c '^epoch [0-9]* ' "$tmp/learn.out"` -eq 3 ] &&
  acc=`sed -n 's/^done .*test accuracy \([0-9.]*\) .*/\1/p' "$tmp/learn.out"` &&
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.5) }'; then
  pass "3 epochs at np 2: test accuracy $acc >= 0.5 (chance 0.1)"
else
  fail "3 epochs at np 2: test accuracy >= 0.5 (chance 0.1)"
  show learn
fi

# ---- 3. resume at another world size ----------------------------------
ck=$tmp/ckpt
if train full 2 $common --batch-size 8 --checkpoint "$ck" --checkpoint-every 5 &&
  [ -f "$ck/step-000005.ckpt" ] && [ -f "$ck/step-000005.bn.ckpt" ]; then
  pass "checkpoints with their batch norm buffers (step-000005.ckpt, .bn.ckpt)"
else
  fail "checkpoints with their batch norm buffers (step-000005.ckpt, .bn.ckpt)"
  show full; ls -l "$ck" 2>&1 | sed 's/^/#   /'
fi
if train resumed 1 --steps 10 --synthetic 640 --synthetic-test 64 \
  --batch-size 16 --resume "$ck/step-000005.ckpt" &&
  grep -q "resumed from .*step-000005.ckpt at step 5" "$tmp/resumed.out" &&
  agree full resumed 1e-5 6; then
  pass "np 2's step-5 checkpoint resumed at np 1: steps 6-10 as uninterrupted"
else
  fail "np 2's step-5 checkpoint resumed at np 1: steps 6-10 as uninterrupted"
  show resumed
fi

# ---- 4. CIFAR-10 binary files -------------------------------------------
mkdir "$tmp/cifar" "$tmp/bad" "$tmp/none"
python3 - "$tmp/cifar" <<'PY'
import os, sys
d = sys.argv[1]
def write(name, n, seed):
    with open(os.path.join(d, name), "wb") as f:
        for i in range(n):
            label = (i * 7 + seed) % 10
            f.write(bytes([label]) + bytes(((label * 25 + j * (seed + 1)) % 256) for j in range(3072)))
write("data_batch_1.bin", 120, 1)
write("data_batch_2.bin", 80, 2)
write("test_batch.bin", 40, 3)
PY
head -c 3000 "$tmp/cifar/data_batch_1.bin" >"$tmp/bad/data_batch_1.bin"
if train files 2 --data "$tmp/cifar" --epochs 1 --batch-size 10 &&
  grep -q "^cifar_train: $tmp/cifar: 200 training images, 40 test;" "$tmp/files.out" &&
  grep -q '^done  steps 10 ' "$tmp/files.out"; then
  pass "--data DIR: 200 training and 40 test images, 10 steps of 2 x 10"
else
  fail "--data DIR: 200 training and 40 test images, 10 steps of 2 x 10"
  show files
fi
train badfile 2 --data "$tmp/bad"
rc=$?
if [ $rc = 1 ] && grep -q "'$tmp/bad/data_batch_1.bin' is not CIFAR-10 binary: its 3000 bytes are not a multiple of 3073" "$tmp/badfile.err"; then
  pass "a truncated file: exit 1, named, with its size"
else
  fail "a truncated file: exit 1, named, with its size (status $rc)"
  show badfile
fi
train nofile 2 --data "$tmp/none"
rc=$?
if [ $rc = 1 ] && grep -q "no '$tmp/none/data_batch_1.bin'" "$tmp/nofile.err"; then
  pass "a directory without data_batch_1.bin: exit 1, named"
else
  fail "a directory without data_batch_1.bin: exit 1, named (status $rc)"
  show nofile
fi

# ---- 5. the command line -----------------------------------------------
if "$prog" --help >"$tmp/help.out" 2>&1 && grep -q '^usage: cifar_train' "$tmp/help.out"; then
  pass "--help: exit 0 with the usage"
else
  fail "--help: exit 0 with the usage"
fi
"$prog" --epochs zero >"$tmp/opt.out" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "^cifar_train: --epochs takes an integer in 1..100000, not 'zero' (try --help)" "$tmp/opt.out"; then
  pass "a bad option value: exit 2 with the reason"
else
  fail "a bad option value: exit 2 with the reason (status $rc)"
  sed 's/^/#   /' "$tmp/opt.out"
fi
exit $failed
