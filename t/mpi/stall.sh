#!/bin/sh
# stall.sh - the stall inspector. With HVD_STALL_CHECK_TIME=2 and
# HVD_STALL_SHUTDOWN_TIME=5, t/mpi/stall_prog (which see) runs:
#
#   never, np 2 and np 3: rank 1 never submits "x" (it waits on "y", which
#     nobody else submits). Rank 0 logs, after 2 s, exactly
#       [hvd 0] warning: stall: allreduce 'x' has waited S s for rank(s) 1;
#       submitted by rank(s) 0[, 2]
#     (one line); after 5 s hvd stops on every rank: every wait returns
#     HVD_ERR_STALL (9) with a message naming 'x' and rank 1, rank 0's
#     within 15 s of the start; every rank shuts down, and at exit hvd
#     ends the job with MPI_Abort(9) rather than wait in MPI_Finalize
#     (straggler.sh has the cases where a rank never comes): status 9.
#   late, np 2: rank 1 submits "x" after 3 s: the warning comes, then "x"
#     completes with the right sum on both ranks, and nothing stops.
#   cached, np 2 and 3: as never with x and y in the response cache: the
#     same warning (once, after 2 s) and the same stop, 5 s after the
#     submission (not 2 + 5 s), and its "stalled for" age is the time
#     since the submission: rank 0's wait returns within 1 s of that
#     age (a hit waited 2 s on its cache bit before the coordinator saw
#     it, which counted the wait from then). Then the same with no check
#     time (below).
#   set, np 3: "x" in a process set of ranks 1 and 2, rank 2 three
#     seconds late: the set's own inspector warns on rank 1 (the set's
#     coordinator), naming world ranks, exactly
#       [hvd 1] warning: stall: allreduce 'x' has waited S s for rank(s) 2;
#       submitted by rank(s) 1
#     then "x" completes with the set's sum on both; rank 0 has nothing
#     in the set and nothing stalls there.
#   create, np 2 and 3: every rank but 1 calls hvd_process_set_create,
#     rank 1 never does (it waits outside hvd). Rank 0 logs exactly
#       [hvd 0] warning: stall: hvd_process_set_create has waited S s for
#       rank(s) 1; called by rank(s) 0[, 2]
#     then every create returns HVD_ERR_STALL (9) naming rank 1, rank 1's
#     hvd_barrier afterwards the same stop at once, every rank logs it
#     as an error, and the job ends with status 9 (an engine command once
#     waited for ever, beyond the stall times). No timing is asserted.
#   create0, np 2 and 3: the same with rank 0 the one that never calls it
#     and the callers' own stall times 0: rank 0's times bound their wait
#     (each rank's own once did, and theirs was none), the same lines
#     naming rank 0.
#
# Each run is bounded by HVD_TEST_TIMEOUT=40 (the wrapper's timeout).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/stall_prog
HVD_TEST_TIMEOUT=40
HVD_STALL_CHECK_TIME=2
HVD_STALL_SHUTDOWN_TIME=5
export HVD_TEST_TIMEOUT HVD_STALL_CHECK_TIME HVD_STALL_SHUTDOWN_TIME
unset HVD_LOG_LEVEL HVD_CACHE_CAPACITY HVD_CYCLE_TIME

need_prog "$prog"
make_tmp stall

# ranks_but R NP: the ranks below NP but R, as "0" or "0, 2", ... (R 1:
# the ranks that submit x).
ranks_but() {
  r=0
  list=
  while [ $r -lt "$2" ]; do
    [ $r != "$1" ] && list="$list${list:+, }$r"
    r=$((r + 1))
  done
  echo "$list"
}

for np in 2 3; do
  out=$tmp/never$np.out
  err=$tmp/never$np.err
  others=`ranks_but 1 $np`
  run_np $np "$out" "$err" "$prog" never
  bad=$failed
  what="never, np $np"

  [ "$rc" = 9 ]
  check $? "$what: the job ends with status 9: MPI_Abort(HVD_ERR_STALL) at exit (status $rc)"
  [ $elapsed -le 25 ]
  check $? "$what: and ends within 25 s (took ${elapsed}s)"

  # the warning: exactly once, from rank 0, after 2 s and before 5 s
  pat="^\[hvd 0\] warning: stall: allreduce 'x' has waited [0-9.]* s for rank(s) 1; submitted by rank(s) $others\$"
  count=`grep -c "$pat" "$err"`
  [ "$count" = 1 ]
  check $? "$what: rank 0 warns once that 'x' waits for rank 1 ($count)"
  waited=`grep "$pat" "$err" | sed "s/.* has waited \([0-9.]*\) s .*/\1/"`
  between "$waited" 2.0 4.9
  check $? "$what: ... after 2 s (after '$waited' s)"

  # rank 0's wait: HVD_ERR_STALL within 15 s, naming 'x' and rank 1
  stop="allreduce 'x' stalled for [0-9.]* s: rank(s) 1 never submitted it (HVD_STALL_SHUTDOWN_TIME=5)"
  line=`grep "^stall_prog\[0\]: 'x' rc=" "$out"`
  echo "$line" | grep -q "^stall_prog\[0\]: 'x' rc=9 after [0-9.]* s: allreduce 'x': hvd stopped: $stop\$"
  check $? "$what: rank 0's 'x' fails with HVD_ERR_STALL naming 'x' and rank 1"
  took=`echo "$line" | sed -n "s/.* after \([0-9.]*\) s: .*/\1/p"`
  between "$took" 4.9 15
  check $? "$what: ... after 5 s, within 15 s (after '$took' s)"
  stalled=`echo "$line" | sed -n "s/.* stalled for \([0-9.]*\) s: .*/\1/p"`
  between "$stalled" 5.0 9.0
  check $? "$what: ... 'stalled for' 5 s ('$stalled')"

  # everyone else: the same reason
  grep -q "^stall_prog\[1\]: 'y' rc=9 after [0-9.]* s: allreduce 'y': hvd stopped: $stop\$" "$out"
  check $? "$what: rank 1's 'y' fails with HVD_ERR_STALL, the same reason"
  if [ $np = 3 ]; then
    grep -q "^stall_prog\[2\]: 'x' rc=9 after [0-9.]* s: allreduce 'x': hvd stopped: $stop\$" "$out"
    check $? "$what: rank 2's 'x' fails with HVD_ERR_STALL, the same reason"
  fi
  count=`grep -c "^\[hvd [0-9]*\] error: $stop\$" "$err"`
  [ "$count" = $np ]
  check $? "$what: every rank logs the stop as an error ($count of $np)"

  count=`grep -c "^stall_prog\[[0-9]*\]: shutdown rc=0\$" "$out"`
  [ "$count" = $np ]
  check $? "$what: every rank shuts down ($count of $np)"

  if [ $failed != $bad ]; then
    show "$out" "stdout of the $what run"
    show "$err" "stderr of the $what run"
  fi
done

# cached_stop WHAT: rank 0's 'x' in $out failed with the stop, 5 s after
# its submission, and the stop's "stalled for" age is that time: the wait
# returned within 1 s of it (the stop's way to the waiter).
cached_stop() {
  line=`grep "^stall_prog\[0\]: 'x' rc=" "$out"`
  echo "$line" | grep -q "^stall_prog\[0\]: 'x' rc=9 after [0-9.]* s: allreduce 'x': hvd stopped: $stop\$"
  check $? "$1: rank 0's 'x' fails with HVD_ERR_STALL naming 'x' and rank 1"
  took=`echo "$line" | sed -n "s/.* after \([0-9.]*\) s: .*/\1/p"`
  between "$took" 4.9 15
  check $? "$1: ... after 5 s, within 15 s (after '$took' s)"
  stalled=`echo "$line" | sed -n "s/.* stalled for \([0-9.]*\) s: .*/\1/p"`
  between "$stalled" 5.0 9.0
  check $? "$1: ... 'stalled for' 5 s ('$stalled')"
  awk -v t="$took" -v s="$stalled" 'BEGIN { exit !(s != "" && t - s <= 1.0) }'
  check $? "$1: ... counted from the submission ('$stalled' s, returned after '$took' s)"
}

for np in 2 3; do
  out=$tmp/cached$np.out
  err=$tmp/cached$np.err
  others=`ranks_but 1 $np`
  run_np $np "$out" "$err" "$prog" cached
  bad=$failed
  what="cached, np $np"
  [ "$rc" = 9 ]
  check $? "$what: the job ends with status 9 (status $rc)"
  pat="^\[hvd 0\] warning: stall: allreduce 'x' has waited [0-9.]* s for rank(s) 1; submitted by rank(s) $others\$"
  count=`grep -c "$pat" "$err"`
  [ "$count" = 1 ]
  check $? "$what: rank 0 warns once that 'x' waits for rank 1 ($count)"
  waited=`grep "$pat" "$err" | sed "s/.* has waited \([0-9.]*\) s .*/\1/"`
  between "$waited" 2.0 4.9
  check $? "$what: ... after 2 s (after '$waited' s)"
  cached_stop "$what"
  if [ $failed != $bad ]; then
    show "$out" "stdout of the $what run"
    show "$err" "stderr of the $what run"
  fi
done

# cached, np 2: as never, with x and y in the response cache and
# HVD_STALL_CHECK_TIME=0 (no warning): a hit waits HVD_STALL_SHUTDOWN_TIME
# (5 s) before it goes to the coordinator, whose inspector stops hvd at
# once, the hit's wait counted; before, the inspector waited 5 s more,
# and earlier still a cached collective never reached it without a
# check time and waited for ever.
out=$tmp/cached.out
err=$tmp/cached.err
HVD_STALL_CHECK_TIME=0 run_np 2 "$out" "$err" "$prog" cached
bad=$failed
what="cached, np 2, no check time"
[ "$rc" = 9 ]
check $? "$what: the job ends with status 9 (status $rc)"
cached_stop "$what"
! grep -q "warning: stall" "$err"
check $? "$what: no warning (no check time)"
if [ $failed != $bad ]; then
  show "$out" "stdout of the $what run"
  show "$err" "stderr of the $what run"
fi

out=$tmp/late.out
err=$tmp/late.err
run_np 2 "$out" "$err" "$prog" late
bad=$failed
what="late, np 2"
check $rc "$what: the job exits 0 (status $rc)"
grep -q "^\[hvd 0\] warning: stall: allreduce 'x' has waited [0-9.]* s for rank(s) 1; submitted by rank(s) 0\$" "$err"
check $? "$what: rank 0 warns that 'x' waits for rank 1"
count=`grep -c "^stall_prog\[[01]\]: 'x' rc=0 after [0-9.]* s: sum ok\$" "$out"`
[ "$count" = 2 ]
check $? "$what: then 'x' completes with the right sum on both ranks ($count)"
took=`sed -n "s/^stall_prog\[0\]: 'x' rc=0 after \([0-9.]*\) s: .*/\1/p" "$out"`
between "$took" 2.9 9.0
check $? "$what: ... once rank 1 submits it, at 3 s (after '$took' s)"
! grep -q "stalled\|error" "$err"
check $? "$what: nothing stops"
count=`grep -c "^stall_prog\[[0-9]*\]: shutdown rc=0\$" "$out"`
[ "$count" = 2 ]
check $? "$what: both ranks shut down ($count of 2)"
if [ $failed != $bad ]; then
  show "$out" "stdout of the $what run"
  show "$err" "stderr of the $what run"
fi

out=$tmp/set.out
err=$tmp/set.err
run_np 3 "$out" "$err" "$prog" set
bad=$failed
what="set, np 3"
check $rc "$what: the job exits 0 (status $rc)"
grep -q "^\[hvd 1\] warning: stall: allreduce 'x' has waited [0-9.]* s for rank(s) 2; submitted by rank(s) 1\$" "$err"
check $? "$what: the set's inspector (rank 1) warns that 'x' waits for world rank 2"
count=`grep -c "^stall_prog\[[12]\]: 'x' rc=0 after [0-9.]* s: sum ok\$" "$out"`
[ "$count" = 2 ]
check $? "$what: then 'x' completes with the set's sum on ranks 1 and 2 ($count)"
grep -q "^stall_prog\[0\]: not in the set\$" "$out" && ! grep -q "hvd 0\].*stall" "$err"
check $? "$what: rank 0, outside the set, sees no stall"
count=`grep -c "^stall_prog\[[0-9]*\]: shutdown rc=0\$" "$out"`
[ "$count" = 3 ]
check $? "$what: every rank shuts down ($count of 3)"
if [ $failed != $bad ]; then
  show "$out" "stdout of the $what run"
  show "$err" "stderr of the $what run"
fi

# create: rank 1 never calls it; create0: rank 0 never does, and the
# callers have no stall times of their own
for mode in create:1 create0:0; do
  absent=${mode#*:}
  mode=${mode%:*}
  for np in 2 3; do
    out=$tmp/$mode.$np.out
    err=$tmp/$mode.$np.err
    others=`ranks_but $absent $np`
    run_np $np "$out" "$err" "$prog" $mode
    bad=$failed
    what="$mode, np $np"
    [ "$rc" = 9 ]
    check $? "$what: the job ends with status 9 (status $rc)"
    pat="^\[hvd 0\] warning: stall: hvd_process_set_create has waited [0-9.]* s for rank(s) $absent; called by rank(s) $others\$"
    count=`grep -c "$pat" "$err"`
    [ "$count" = 1 ]
    check $? "$what: rank 0 warns once that the create waits for rank $absent ($count)"
    stop="hvd_process_set_create stalled for [0-9.]* s: rank(s) $absent never called it (HVD_STALL_SHUTDOWN_TIME=5)"
    count=`grep -c "^stall_prog\[[^$absent]\]: create rc=9: hvd_process_set_create: hvd stopped: $stop\$" "$out"`
    [ "$count" = $((np - 1)) ]
    check $? "$what: every create fails with HVD_ERR_STALL naming rank $absent ($count of $((np - 1)))"
    grep -q "^stall_prog\[$absent\]: barrier rc=9: barrier: hvd stopped: $stop\$" "$out"
    check $? "$what: rank $absent's barrier afterwards fails with the same stop"
    count=`grep -c "^\[hvd [0-9]*\] error: $stop\$" "$err"`
    [ "$count" = $np ]
    check $? "$what: every rank logs the stop as an error ($count of $np)"
    count=`grep -c "^stall_prog\[[0-9]*\]: shutdown rc=0\$" "$out"`
    [ "$count" = $np ]
    check $? "$what: every rank shuts down ($count of $np)"
    if [ $failed != $bad ]; then
      show "$out" "stdout of the $what run"
      show "$err" "stderr of the $what run"
    fi
  done
done

echo "1..$n"
exit $failed
