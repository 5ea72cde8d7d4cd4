#!/bin/sh
# order.sh - the stand-in's check of NCCL's order rule (t/standin/nccl.c,
# HVD_STANDIN_NCCL_ORDER=1): calls on communicators that ranks share must
# be issued in one order on every rank. t/standin/selftest order breaks it
# from two threads per rank without deadlocking: with the check, the job
# fails and the stand-in names both communicators and both ranks' counts;
# without it, the same program runs to its end (what a GPU would usually
# do too, until the day the kernels cannot both be resident). selftest
# twothreads: a second thread's call on a communicator while a first
# thread is in one ends the job; after the first returned, it is fine.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
tmp=`mktemp -d "${TMPDIR:-/tmp}/order.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
echo "1..4"
HVD_STANDIN_NCCL_ORDER=1 HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 2 \
  "$prog" order >"$tmp/on" 2>&1
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && ! grep -q '^order: done' "$tmp/on" &&
  grep -Eq "^hvd stand-in: NCCL's order rule broken: world rank [01] began its exchange 1 on communicator [0-9a-f]{16} \(2 ranks\) after [01] on communicator [0-9a-f]{16}, world rank [01] after [01]: ranks must issue calls on the communicators they share in one order$" "$tmp/on"; then
  echo "ok 1 - HVD_STANDIN_NCCL_ORDER=1: opposite orders end the job, naming both communicators (status $rc)"
else
  echo "not ok 1 - HVD_STANDIN_NCCL_ORDER=1: opposite orders end the job, naming both communicators (status $rc)"
  sed 's/^/#   /' "$tmp/on"
fi
HVD_STANDIN_NCCL_ORDER=0 HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 2 \
  "$prog" order >"$tmp/off" 2>&1
rc=$?
if [ $rc = 0 ] && [ "`grep -c '^order: done' "$tmp/off"`" = 2 ]; then
  echo "ok 2 - without the check the same program runs to its end"
else
  echo "not ok 2 - without the check the same program runs to its end (status $rc)"
  sed 's/^/#   /' "$tmp/off"
fi
HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 2 "$prog" twothreads \
  at-once >"$tmp/two" 2>&1
rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && ! grep -q '^twothreads: done' "$tmp/two" &&
  grep -Eq "^hvd stand-in: ncclAllReduce on rank 0: another thread is in a call on the same communicator: NCCL's communicators are not for two threads at once$" "$tmp/two"; then
  echo "ok 3 - two threads in calls on one communicator at once end the job (status $rc)"
else
  echo "not ok 3 - two threads in calls on one communicator at once end the job (status $rc)"
  sed 's/^/#   /' "$tmp/two"
fi
HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 2 "$prog" twothreads after \
  >"$tmp/seq" 2>&1
rc=$?
if [ $rc = 0 ] && [ "`grep -c '^twothreads: done' "$tmp/seq"`" = 2 ]; then
  echo "ok 4 - a second thread's call after the first returned: runs to its end"
else
  echo "not ok 4 - a second thread's call after the first returned: runs to its end (status $rc)"
  sed 's/^/#   /' "$tmp/seq"
fi
