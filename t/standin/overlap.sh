#!/bin/sh
# overlap.sh - the stand-in is stricter than NCCL about buffers
# (t/standin/nccl.c, check_overlap): a call whose send and receive buffers
# overlap other than in place ends the process, naming the call, both
# buffers and the in-place rule (NCCL would give undefined results); in
# place and apart run. t/standin/selftest overlap CALL WHERE makes each
# call at one rank.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
tmp=`mktemp -d "${TMPDIR:-/tmp}/overlap.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
echo "1..9"
n=0
for call in allgather reducescatter allreduce; do
  case $call in
  allgather) name=ncclAllGather rule='sendbuff == recvbuff \+ rank \* sendcount' sn=16 rn=16 ;;
  reducescatter) name=ncclReduceScatter rule='recvbuff == sendbuff \+ rank \* recvcount' sn=16 rn=16 ;;
  allreduce) name=ncclAllReduce rule='recvbuff == sendbuff' sn=16 rn=16 ;;
  esac
  for where in inplace apart; do
    n=`expr $n + 1`
    HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 1 "$prog" overlap $call $where \
      >"$tmp/out" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -q '^overlap: done$' "$tmp/out"; then
      echo "ok $n - $call, buffers $where: runs"
    else
      echo "not ok $n - $call, buffers $where: runs (status $rc)"
      sed 's/^/#   /' "$tmp/out"
    fi
  done
  n=`expr $n + 1`
  HVD_TEST_TIMEOUT=60 "$HVD_MPIRUN_TEST" --np 1 "$prog" overlap $call shifted \
    >"$tmp/out" 2>&1
  rc=$?
  if [ $rc != 0 ] && ! grep -q '^overlap: done' "$tmp/out" &&
    grep -Eq "^hvd stand-in: $name on rank 0: sendbuff 0x[0-9a-f]+ \($sn bytes\) and recvbuff 0x[0-9a-f]+ \($rn bytes\) overlap, but not in place \($rule\): NCCL's result would be undefined$" "$tmp/out"; then
    echo "ok $n - $call, recvbuff one float past in place: ends the process, naming the rule (status $rc)"
  else
    echo "not ok $n - $call, recvbuff one float past in place: ends the process, naming the rule (status $rc)"
    sed 's/^/#   /' "$tmp/out"
  fi
done
