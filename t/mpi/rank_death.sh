#!/bin/sh
# rank_death.sh - a rank that dies mid-job ends the whole job, promptly,
# with output that names it, and leaves no process behind.
#
# Runs t/mpi/die on 3 ranks through t/mpirun-test, twice:
#   kill: rank 1 SIGKILLs itself after 5 allreduces; mpirun must notice.
#   exit: rank 1 calls exit(3) after 5 allreduces; hvd's exit handler shuts
#         hvd down, so ranks 0 and 2 fail with "... shut down by rank 1".
# Each run is bounded by HVD_TEST_TIMEOUT=40 (timeout -k 5 in the wrapper)
# and must end within 30 s.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
die=$HVD_TOP_BUILDDIR/t/mpi/die
limit=30
HVD_TEST_TIMEOUT=40
export HVD_TEST_TIMEOUT

need_prog "$die"
make_tmp rank_death

echo "1..12"
for mode in kill exit; do
  out=$tmp/$mode.out
  run_np 3 "$out" "$out" "$die" "$mode"
  bad=$failed

  [ $rc != 0 ] && [ $rc != 124 ]
  check $? "$mode: the job fails (status $rc, not a timeout)"
  [ $elapsed -le $limit ]
  check $? "$mode: and ends within ${limit}s (took ${elapsed}s)"
  grep -q "die\[1\]: 5 allreduces done" "$out"
  check $? "$mode: rank 1 died after 5 allreduces"
  grep -Eq "rank 1([^0-9]|\$)" "$out"
  check $? "$mode: the output names rank 1"
  if [ $mode = kill ]; then
    grep -Eq "rank 1 .*signal 9" "$out"
    check $? "$mode: mpirun reports rank 1 killed by signal 9"
  else
    grep -q "hvd was shut down by rank 1" "$out"
    check $? "$mode: the others fail with 'hvd was shut down by rank 1'"
  fi

  # Nothing left running from this program (mpiexec and timeout included,
  # since their command lines hold its path). Give exits a moment.
  stray=
  for i in 1 2 3 4 5 6 7 8 9 10; do
    stray=`pgrep -f -- "$die" | tr '\n' ' '`
    [ -z "$stray" ] && break
    sleep 1
  done
  [ -z "$stray" ]
  check $? "$mode: no stray processes${stray:+ (pids $stray)}"
  if [ -n "$stray" ]; then
    ps -o pid,ppid,etime,args -p `echo $stray | tr ' ' ','` | sed 's/^/#   /'
    kill -9 $stray 2>/dev/null
  fi
  [ $failed = $bad ] || show "$out" "output of the $mode run"
done
exit $failed
