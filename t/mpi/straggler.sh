#!/bin/sh
# straggler.sh - no hang at exit: a job whose last rank is stuck ends
# within HVD_STALL_SHUTDOWN_TIME + 30 s, whatever the stuck rank does and
# however the others end (t/mpi/straggler.c). With HVD_STALL_CHECK_TIME=2
# and HVD_STALL_SHUTDOWN_TIME=5, for each run:
#
#   - rank 0's "x" fails with HVD_ERR_STALL naming 'x' and the last rank;
#   - the job ends with status 9 (HVD_ERR_STALL: hvd's exit handler calls
#     MPI_Abort(9) rather than MPI_Finalize, which would wait for the
#     straggler forever) within 5 + 30 s: the exiting ranks wait
#     HVD_EXIT_GRACE_TIME (3 s here) for each other first;
#   - rank 0 says so, once: "[hvd 0] error: ending the job with
#     MPI_Abort(9) at exit, not MPI_Finalize, as some rank did not come
#     within HVD_EXIT_GRACE_TIME: hvd stopped: allreduce 'x' stalled ..."
#     ("after every rank came to its end" when the late rank comes);
#     when rank 0 is the straggler, rank 1, the lowest that came, says it;
#   - no process of the job is left.
# The straggler sleeps, spins, blocks in a read, or arrives late (after
# the stop: its own allreduce fails at once, not after another wait); the
# others return from main, call exit, or call hvd_shutdown first; at np 2,
# 3 and 4. And a normal end: the last rank calls hvd_shutdown early while
# the others still wait: their "x" fails with HVD_ERR_SHUTDOWN naming that
# rank ("... before this collective completed" when "x" was submitted
# before the shutdown reached the rank, without it when after: on a loaded
# machine a rank may submit only after the last rank's shutdown has
# ended hvd there) and the job exits 0 after MPI_Finalize everywhere.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/straggler
HVD_TEST_TIMEOUT=60
HVD_STALL_CHECK_TIME=2
HVD_STALL_SHUTDOWN_TIME=5
HVD_EXIT_GRACE_TIME=3
export HVD_TEST_TIMEOUT HVD_STALL_CHECK_TIME HVD_STALL_SHUTDOWN_TIME \
  HVD_EXIT_GRACE_TIME
unset HVD_LOG_LEVEL HVD_CACHE_CAPACITY HVD_CYCLE_TIME

need_prog "$prog"
make_tmp straggler

# leftovers: the job's processes still running (none once it has ended)
leftovers() {
  pgrep -f "$prog" | tr '\n' ' '
}

# finish_run: after a run ($what, $out, $err; $bad: $failed before it):
# no process of the job is left (any left are killed); its output shown
# when one of its checks failed.
finish_run() {
  sleep 1
  left=$(leftovers)
  [ -z "$left" ]
  check $? "$what: no process left ($left)"
  [ -z "$left" ] || kill -9 $left 2>/dev/null
  if [ $failed != $bad ]; then
    show "$out" "stdout"
    show "$err" "stderr"
  fi
}

# stuck NP KIND END
stuck() {
  np=$1 kind=$2 how=$3
  what="np $np, straggler $kind, others $how"
  last=$((np - 1))
  out=$tmp/$np-$kind-$how.out
  err=$tmp/$np-$kind-$how.err
  bad=$failed
  run_np "$np" "$out" "$err" "$prog" "$kind" "$how"
  [ "$rc" = 9 ] && [ "$elapsed" -le 35 ]
  check $? "$what: the job ends with status 9 within 5 + 30 s (status $rc after $elapsed s)"
  stop="allreduce 'x' stalled for [0-9.]* s: rank(s) $last never submitted it (HVD_STALL_SHUTDOWN_TIME=5)"
  grep -q "^straggler\[0\]: 'x' rc=9 after [0-9.]* s: allreduce 'x': hvd stopped: $stop\$" "$out"
  check $? "$what: rank 0's 'x' fails with HVD_ERR_STALL naming rank $last"
  if [ "$kind" = late ]; then
    because="after every rank came to its end"
  else
    because="as some rank did not come within HVD_EXIT_GRACE_TIME"
  fi
  abort="^\[hvd 0\] error: ending the job with MPI_Abort(9) at exit, not MPI_Finalize, $because: hvd stopped: $stop\$"
  count=$(grep -c "$abort" "$err")
  others=$(grep -c "MPI_Abort" "$err")
  [ "$count" = 1 ] && [ "$others" = 1 ]
  check $? "$what: rank 0 says once why the job ends ($count of $others)"
  if [ "$kind" = late ]; then
    took=$(sed -n "s/^straggler\[$last\]: 'x' rc=9 after \([0-9.]*\) s: .*hvd stopped: .*/\1/p" "$out")
    between "${took:-0}" 7.9 9.5
    check $? "$what: the late rank's own 'x' fails at once when it comes at 8 s ('$took')"
  fi
  finish_run
}

stuck 2 sleep return
stuck 2 spin exit
stuck 2 read shutdown
stuck 2 late return
stuck 3 sleep exit
stuck 3 spin shutdown
stuck 3 read return
stuck 3 late exit
stuck 4 sleep shutdown
stuck 4 spin return
stuck 4 read exit
stuck 4 late shutdown

# a normal end: the last rank shuts hvd down early
for np in 2 3; do
  what="np $np, the last rank calls hvd_shutdown early"
  out=$tmp/early$np.out
  err=$tmp/early$np.err
  bad=$failed
  run_np "$np" "$out" "$err" "$prog" early return
  check $rc "$what: the job exits 0 (status $rc, after $elapsed s)"
  count=$(grep -c "^straggler\[[0-9]*\]: 'x' rc=4 after [0-9.]* s: allreduce 'x': hvd was shut down by rank $((np - 1))\( before this collective completed\)\{0,1\}\$" "$out")
  [ "$count" = $((np - 1)) ]
  check $? "$what: the others' 'x' fails with HVD_ERR_SHUTDOWN naming it ($count)"
  ! grep -q "MPI_Abort" "$err"
  check $? "$what: no MPI_Abort"
  if [ $failed != $bad ]; then
    show "$out" "stdout"
    show "$err" "stderr"
  fi
done

# rank 0 is the straggler: rank 1, the lowest that came, says why, once
what="np 3, rank 0 the straggler (sleep), others return"
out=$tmp/first.out
err=$tmp/first.err
bad=$failed
STRAGGLER_RANK=0 run_np 3 "$out" "$err" "$prog" sleep return
[ "$rc" = 9 ] && [ "$elapsed" -le 35 ]
check $? "$what: the job ends with status 9 within 5 + 30 s (status $rc after $elapsed s)"
stop="allreduce 'x' stalled for [0-9.]* s: rank(s) 0 never submitted it (HVD_STALL_SHUTDOWN_TIME=5)"
count=$(grep -c "^straggler\[[12]\]: 'x' rc=9 after [0-9.]* s: allreduce 'x': hvd stopped: $stop\$" "$out")
[ "$count" = 2 ]
check $? "$what: ranks 1 and 2's 'x' fail with HVD_ERR_STALL naming rank 0 ($count)"
abort="^\[hvd 1\] error: ending the job with MPI_Abort(9) at exit, not MPI_Finalize, as some rank did not come within HVD_EXIT_GRACE_TIME: hvd stopped: $stop\$"
count=$(grep -c "$abort" "$err")
others=$(grep -c "MPI_Abort" "$err")
[ "$count" = 1 ] && [ "$others" = 1 ]
check $? "$what: rank 1 says once why the job ends ($count of $others)"
finish_run

echo "1..$n"
exit $failed
