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
#     binary, an empty test_batch.bin, a directory by that name, or a
#     directory without data_batch_1.bin, ends the job with exit 1 and the
#     reason;
#  5. --help exits 0; a bad option exits 2, and so do a missing value
#     (once "unknown option") and an empty file name (once exit 1 after
#     MPI started), with their reasons;
#  6. --synthetic-test 0 says there is no test set (it printed a measured
#     "test accuracy 0.000").
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/cifar_train
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-90}
export HVD_TEST_TIMEOUT
grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h" ||
  skip_all "examples/cifar_train is not built: configure found no CBLAS"
need_prog "$prog"
make_tmp cifar_train

# train NAME NP ARGS...: stdout in $tmp/NAME.out, stderr in .err, the
# loss log in .json; rc its status.
train() {
  train_name=$1 train_np=$2
  shift 2
  run_np "$train_np" "$tmp/$train_name.out" "$tmp/$train_name.err" "$prog" \
    --log-json "$tmp/$train_name.json" "$@"
  return $rc
}
# explain NAME: a run's output as TAP comments.
explain() {
  show "$tmp/$1.out" "$1: stdout"
  show "$tmp/$1.err" "$1: stderr"
}
# agree A B TOL [FIRST]: runs A and B have the same losses (testlib.sh).
agree() {
  losses_agree "$tmp/$1.json" "$tmp/$2.json" "$3" "${4:-1}"
}

echo "1..15"

# ---- 1. world-size equivalence ----------------------------------------
common="--steps 10 --synthetic 640 --synthetic-test 64 --quiet"
train one 1 $common --batch-size 16 && train two 2 $common --batch-size 8 &&
  agree one two 1e-5
check $? "sync BN: np 2 x 8 images has np 1 x 16's losses (1e-5)" ||
  { explain one; explain two; }
train local 2 $common --batch-size 8 --local-bn && ! agree one local 1e-4 >/dev/null
check $? "--local-bn: np 2 x 8 differs from np 1 x 16 (per-rank statistics)" ||
  explain local

# ---- 2. it learns -------------------------------------------------------
train learn 2 --epochs 3 --synthetic 1280 --synthetic-test 256 &&
  [ `grep -c '^epoch [0-9]* ' "$tmp/learn.out"` -eq 3 ] &&
  acc=`sed -n 's/^done .*test accuracy \([0-9.]*\) .*/\1/p' "$tmp/learn.out"` &&
  between "$acc" 0.5 1
check $? "3 epochs at np 2, one line each: test accuracy '$acc' >= 0.5 (chance 0.1)" ||
  explain learn

# ---- 3. resume at another world size ----------------------------------
ck=$tmp/ckpt
train full 2 $common --batch-size 8 --checkpoint "$ck" --checkpoint-every 5 &&
  [ -f "$ck/step-000005.ckpt" ] && [ -f "$ck/step-000005.bn.ckpt" ]
check $? "checkpoints with their batch norm buffers (step-000005.ckpt, .bn.ckpt)" ||
  { explain full; ls -l "$ck" 2>&1 | sed 's/^/#   /'; }
train resumed 1 --steps 10 --synthetic 640 --synthetic-test 64 \
  --batch-size 16 --resume "$ck/step-000005.ckpt" &&
  grep -q "resumed from .*step-000005.ckpt at step 5" "$tmp/resumed.out" &&
  agree full resumed 1e-5 6
check $? "np 2's step-5 checkpoint resumed at np 1: steps 6-10 as uninterrupted" ||
  explain resumed

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
train files 2 --data "$tmp/cifar" --epochs 1 --batch-size 10 &&
  grep -q "^cifar_train: $tmp/cifar: 200 training images, 40 test;" "$tmp/files.out" &&
  grep -q '^done  steps 10 ' "$tmp/files.out"
check $? "--data DIR: 200 training and 40 test images, 10 steps of 2 x 10" ||
  explain files
train badfile 2 --data "$tmp/bad"
[ $rc = 1 ] && grep -q "'$tmp/bad/data_batch_1.bin' is not CIFAR-10 binary: its 3000 bytes are not a multiple of 3073" "$tmp/badfile.err"
check $? "a truncated file: exit 1 (got $rc), named, with its size" ||
  explain badfile
# an empty test_batch.bin is empty, not "0 bytes are not a multiple of
# 3073"; a directory by that name cannot be read (it said "4096 bytes")
mkdir "$tmp/emptytest" "$tmp/dirtest"
cp "$tmp/cifar/data_batch_1.bin" "$tmp/emptytest/"
cp "$tmp/cifar/data_batch_1.bin" "$tmp/dirtest/"
: >"$tmp/emptytest/test_batch.bin"
mkdir "$tmp/dirtest/test_batch.bin"
train emptytest 2 --data "$tmp/emptytest" --steps 1
[ $rc = 1 ] && grep -qx "cifar_train: --data: '$tmp/emptytest/test_batch.bin' is empty (CIFAR-10 binary: 3073 bytes an image)" "$tmp/emptytest.err"
check $? "an empty test_batch.bin: exit 1 (got $rc), 'is empty'" ||
  explain emptytest
train dirtest 2 --data "$tmp/dirtest" --steps 1
[ $rc = 1 ] && grep -qx "cifar_train: --data: cannot read '$tmp/dirtest/test_batch.bin': Is a directory" "$tmp/dirtest.err"
check $? "a directory named test_batch.bin: exit 1 (got $rc), 'Is a directory'" ||
  explain dirtest
train nofile 2 --data "$tmp/none"
[ $rc = 1 ] && grep -q "no '$tmp/none/data_batch_1.bin'" "$tmp/nofile.err"
check $? "a directory without data_batch_1.bin: exit 1 (got $rc), named" ||
  explain nofile

# ---- 5. the command line -----------------------------------------------
"$prog" --help >"$tmp/help.out" 2>&1 && grep -q '^usage: cifar_train' "$tmp/help.out"
check $? "--help: exit 0 with the usage"
"$prog" --epochs zero >"$tmp/opt.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "^cifar_train: --epochs takes an integer in 1..100000, not 'zero' (try --help)" "$tmp/opt.out"
check $? "a bad option value: exit 2 (got $rc) with the reason" ||
  show "$tmp/opt.out" "output"
"$prog" --steps >"$tmp/opt.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -qx "cifar_train: option '--steps' needs a value (try --help)" "$tmp/opt.out"
check $? "a missing value: exit 2 (got $rc), 'needs a value'" ||
  show "$tmp/opt.out" "output"
"$prog" --resume '' >"$tmp/opt.out" 2>&1
rc=$?
[ $rc = 2 ] && grep -qx "cifar_train: --resume needs a checkpoint file (try --help)" "$tmp/opt.out"
check $? "an empty --resume: exit 2 (got $rc) with the reason" ||
  show "$tmp/opt.out" "output"

# ---- 6. no test set ------------------------------------------------------
train notest 1 --steps 2 --synthetic 64 --synthetic-test 0
[ $rc = 0 ] &&
  grep -q "^done  steps 2  .*  test accuracy none (no test set)  images/s " "$tmp/notest.out"
check $? "--synthetic-test 0: exit $rc, 'test accuracy none (no test set)'" ||
  explain notest
exit $failed
