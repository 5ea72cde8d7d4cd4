#!/bin/sh
# cifar_train.sh - examples/cifar_train end to end (doc/cifar_train.md).
#  1. synchronized batch norm makes the world size invisible: 10 steps at
#     np 1 with 16 images and at np 2 with 8 per rank give the same loss
#     at every step (1e-5 relative); with --local-bn np 2 does not;
#  2. the quick run learns: after 3 epochs of the synthetic set at np 2
#     the test accuracy is at least 0.5 (chance: 0.1), printed per epoch;
#  3. a checkpoint of np 2 (step 5 of 10) resumes at np 1 with the same
#     global batch and continues the curve (1e-5); at another global batch
#     it keeps the job's steps and schedule and goes on from its place in
#     the data (the .bn.ckpt's progress), and a checkpoint of before the
#     progress was kept still resumes;
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
# step_lr FILE: each record's step and learning rate, a line each.
step_lr() {
  sed -n 's/.*"step":\([0-9]*\),.*"lr":\([^,}]*\).*/\1 \2/p' "$1"
}
# agree A B TOL [FIRST]: runs A and B have the same losses (testlib.sh).
agree() {
  losses_agree "$tmp/$1.json" "$tmp/$2.json" "$3" "${4:-1}"
}

echo "1..17"

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

# at another global batch: np 2 x 32 (4 steps an epoch, 12 planned),
# its step-6 checkpoint resumed at np 1 x 32 keeps the job's 12 steps and
# their learning rates, and goes on from image 128 of epoch 2's order
# (before: 24 steps planned from the new epoch length, epoch 1 again);
# the resumed run's step-12 checkpoint holds where it stopped (image 64
# of epoch 3); its step-9 one, 32 images before epoch 2's end, at np 2
# drops them, as an epoch's tail, and goes on with epoch 3; a .bn.ckpt of
# before the progress (the file less that tensor: an older cifar_train's,
# byte for byte) still resumes, its position from the step, as then
g="--synthetic 256 --synthetic-test 64 --batch-size 32 --width 4"
train g64 2 $g --checkpoint "$tmp/g64" --checkpoint-every 6 &&
  train g32 1 $g --resume "$tmp/g64/step-000006.ckpt" \
    --checkpoint "$tmp/g32" --checkpoint-every 3 &&
  grep -q "^cifar_train: width 4, .* (x0.1 at 50% and 75% of 12 steps)" "$tmp/g32.out" &&
  grep -qx "cifar_train: resumed from $tmp/g64/step-000006.ckpt at step 6 (epoch 2, image 128 of its order)" "$tmp/g32.out" &&
  grep -qx "cifar_train: its job's global batch was 64, this run's is 32: the data goes on from there, the learning rate by the job's schedule (--epochs counts its epochs' steps)" "$tmp/g32.out" &&
  grep -q "^done  steps 12 " "$tmp/g32.out" &&
  step_lr "$tmp/g64.json" | sed -n '7,12p' >"$tmp/g64.lr" &&
  step_lr "$tmp/g32.json" >"$tmp/g32.lr" && cmp -s "$tmp/g64.lr" "$tmp/g32.lr" &&
  [ "`wc -l <"$tmp/g32.lr"`" -eq 6 ] &&
  train g32b 2 $g --steps 14 --resume "$tmp/g32/step-000012.ckpt" &&
  grep -qx "cifar_train: resumed from $tmp/g32/step-000012.ckpt at step 12 (epoch 3, image 64 of its order)" "$tmp/g32b.out" &&
  train g32c 2 $g --steps 10 --resume "$tmp/g32/step-000009.ckpt" &&
  grep -qx "cifar_train: resumed from $tmp/g32/step-000009.ckpt at step 9 (epoch 2, image 224 of its order)" "$tmp/g32c.out" &&
  grep -qx "cifar_train: the 32 images left of epoch 2 make no step of 64: dropped, as an epoch's tail" "$tmp/g32c.out" &&
  grep -q "^done  steps 10 " "$tmp/g32c.out"
check $? "np 2 x 32's step-6 checkpoint at np 1 x 32: the job's 12 steps and learning rates, from image 128 of epoch 2; back at np 2, an epoch's 32 images left dropped" ||
  { explain g64; explain g32; explain g32b; explain g32c; }
mkdir "$tmp/old"
cp "$tmp/g64/step-000006.ckpt" "$tmp/old/"
python3 - "$tmp/g64/step-000006.bn.ckpt" "$tmp/old/step-000006.bn.ckpt" <<'PY' &&
import struct, sys
M = (1 << 64) - 1
K1, K2, K3 = 0x9e3779b97f4a7c15, 0xbf58476d1ce4e5b9, 0x94d049bb133111eb
def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M
def fin(z):
    z = ((z ^ (z >> 30)) * K2) & M
    z = ((z ^ (z >> 27)) * K3) & M
    return z ^ (z >> 31)
def sum64(b):
    lanes = [(K1 * i) & M for i in (1, 2, 3, 4)]
    p = b + bytes(-len(b) % 32)
    for k in range(len(p) // 8):
        w, = struct.unpack_from('<Q', p, 8 * k)
        lanes[k % 4] = (rotl((lanes[k % 4] + w * K2) & M, 31) * K1) & M
    h = fin(len(b) ^ K3)
    for x in lanes:
        h = fin(h ^ x)
    return h
# the file less its last parameter, "cifar_train.progress" (int64 [4]):
# what cifar_train wrote before it kept its progress
b = bytearray(open(sys.argv[1], 'rb').read())
name = b'cifar_train.progress'
cut = 4 + len(name) + 4 + 4 + 8 + 8 * 4
at = len(b) - 12 - cut
assert b[at + 4:at + 4 + len(name)] == name
b = b[:at] + b[len(b) - 12:len(b) - 8]
count, = struct.unpack_from('<I', b, 12)
struct.pack_into('<I', b, 12, count - 1)
struct.pack_into('<Q', b, 16, len(b) + 8)
b += struct.pack('<Q', sum64(bytes(b)))
open(sys.argv[2], 'wb').write(b)
PY
  train old 1 $g --steps 8 --resume "$tmp/old/step-000006.ckpt" &&
  grep -qx "cifar_train: resumed from $tmp/old/step-000006.ckpt at step 6 (epoch 1, image 192 of its order)" "$tmp/old.out" &&
  grep -qx "cifar_train: its .bn.ckpt holds no position in the data (an older cifar_train's): taken from the step, at this global batch 32" "$tmp/old.out" &&
  grep -q "^done  steps 8 " "$tmp/old.out"
check $? "a checkpoint without the progress resumes, its position from the step (as before)" ||
  explain old

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
