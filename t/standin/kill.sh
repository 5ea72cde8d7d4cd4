#!/bin/sh
# kill.sh - a rank SIGKILLed during a device allreduce over NCCL (issue 26's
# faults; the stand-in's NCCL, a GPU per rank): `selftest kill 1` under
# hvdrun at np 3 with HVD_NCCL_TIMEOUT at its default (300 s). Rank 1 dies
# right after submitting its fourth allreduce, while ranks 0 and 2 are in
# it. Open MPI's mpirun sees rank 1's death and stops the others; hvdrun
# names rank 1 from the ranks' end records. Expected: exit status 137
# (128 + 9), the line "hvdrun: rank 1 (HOST) was killed by signal 9
# (Killed); ranks 0, 2 were stopped", no rank going on to the end, no
# process of the job left, all within 20 s (HVD_NCCL_TIMEOUT plays no
# part: the job ends at mpirun's pace, a few seconds here).
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
hvdrun=$HVD_TOP_BUILDDIR/bin/hvdrun
need_prog "$prog"
need_prog "$hvdrun"
make_tmp kill
unset HVD_NCCL_TIMEOUT HVD_STANDIN_NCCL_HANG HVD_STANDIN_NCCL_ASYNC_ERROR
host=`hostname`
echo "1..4"
t0=`date +%s`
(
  HVD_MPIRUN_TEST_LIB=1 . "$HVD_MPIRUN_TEST"
  HVD_RUN_NO_CMA=${HVD_RUN_NO_CMA-1}
  export HVD_RUN_NO_CMA
  hvd_mpirun 0 "$hvdrun" -np 3 "$prog" kill 1
) >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$((`date +%s` - t0))
[ $rc = 137 ]
check $? "the job's status is 137: rank 1's SIGKILL (got $rc)" ||
  show "$tmp/err" stderr
grep -q "^hvdrun: rank 1 ($host) was killed by signal 9 (Killed); ranks 0, 2 were stopped$" "$tmp/err"
check $? "hvdrun names rank 1, killed by signal 9, the others stopped" ||
  show "$tmp/err" stderr
! grep -q "^kill: done" "$tmp/out" && ! pgrep -f "selftest kill 1" >/dev/null
check $? "no rank went on to the end; no process of the job is left" ||
  show "$tmp/out" stdout
[ $took -le 20 ]
check $? "the job ended within 20 s (took $took s; HVD_NCCL_TIMEOUT is 300 s)"
