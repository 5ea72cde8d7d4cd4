#!/bin/sh
# overlap.sh - the stand-in is stricter than NCCL about buffers
# (t/standin/nccl.c, check_overlap): a call whose send and receive buffers
# overlap other than in place ends the process, naming the call, both
# buffers and the in-place rule (NCCL would give undefined results); in
# place and apart run. t/standin/selftest overlap CALL WHERE makes each
# call at one rank.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
need_prog "$prog"
make_tmp overlap
for call in allgather reducescatter allreduce; do
  case $call in
  allgather) name=ncclAllGather rule='sendbuff == recvbuff \+ rank \* sendcount' ;;
  reducescatter) name=ncclReduceScatter rule='recvbuff == sendbuff \+ rank \* recvcount' ;;
  allreduce) name=ncclAllReduce rule='recvbuff == sendbuff' ;;
  esac
  for where in inplace apart shifted; do
    run_np 1 "$tmp/out" "$tmp/out" "$prog" overlap $call $where
    if [ $where = shifted ]; then
      [ $rc != 0 ] && ! grep -q '^overlap: done' "$tmp/out" &&
        grep -Eq "^hvd stand-in: $name on rank 0: sendbuff 0x[0-9a-f]+ \(16 bytes\) and recvbuff 0x[0-9a-f]+ \(16 bytes\) overlap, but not in place \($rule\): NCCL's result would be undefined$" "$tmp/out"
      check $? "$call, recvbuff one float past in place: ends the process, naming the rule (status $rc)"
    else
      [ $rc = 0 ] && grep -q '^overlap: done$' "$tmp/out"
      check $? "$call, buffers $where: runs (status $rc)"
    fi || show "$tmp/out" output
  done
done
echo "1..$n"
exit $failed
