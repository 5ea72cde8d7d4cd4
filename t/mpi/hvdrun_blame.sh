#!/bin/sh
# hvdrun_blame.sh - hvdrun names the rank that failed, from the ranks' own
# records of their end (HVD_END_DIR, lib/base/end_record.h), not from
# Open MPI's words. t/mpi/die on 4 ranks: each rank in turn is the victim,
# HVD_BLAME_ROUNDS times (default 5) by exit(3) and by SIGKILL, once by a
# segmentation fault. After an exit the other ranks' allreduces fail at
# once and they exit 1 too: the race in which mpirun names whichever exit
# it noticed first (the old awk parser of its messages named the wrong
# rank 15 times in 20); then MPI_Abort directly and through a wrapper
# script (below).
# Every run must end with exactly
#   hvdrun: rank V (HOST) exited with status 3; ranks ... were stopped
#   hvdrun: rank V (HOST) was killed by signal 9 (Killed); ...
#   hvdrun: rank V (HOST) was killed by signal 11 (Segmentation fault); ...
# and hvdrun's status must be the victim's (3, 137, 139; in an ASan build
# the fault is ASan's report and _exit(1), which leaves no record: "ended
# without a word ... status 1"). One check per
# mode and victim; a failure shows the runs that went wrong. Then the
# records' own lines.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
die=$HVD_TOP_BUILDDIR/t/mpi/die
hvdrun=$HVD_TOP_BUILDDIR/bin/hvdrun
need_prog "$die"
make_tmp hvdrun_blame
rounds=${HVD_BLAME_ROUNDS:-5}
host=$(hostname)
HVD_RUN_NO_CMA=${HVD_RUN_NO_CMA-1}
export HVD_RUN_NO_CMA
HVD_MPIRUN_TEST_LIB=1 . "$HVD_MPIRUN_TEST"

# others V: "ranks A, B, C were stopped" (every rank of 4 but V)
others() {
  echo "ranks $(for r in 0 1 2 3; do [ $r = $1 ] || printf '%s, ' $r; done |
    sed 's/, $//') were stopped"
}

for mode in exit kill segv; do
  case $mode in
    exit) how="exited with status 3" want_rc=3 times=$rounds ;;
    kill) how="was killed by signal 9 (Killed)" want_rc=137 times=$rounds ;;
    segv)
      how="was killed by signal 11 (Segmentation fault)" want_rc=139 times=1
      case ${HVD_TEST_SANITIZER-} in
        *address*) # ASan reports the fault and _exits 1: no record of it
          how="ended without a word (no record of its end: MPI_Abort from the program or MPI itself, or killed before it could say) and the job ended with status 1"
          want_rc=1 ;;
      esac ;;
  esac
  for v in 0 1 2 3; do
    want="hvdrun: rank $v ($host) $how; $(others $v)"
    bad=0
    : >"$tmp/bad"
    i=0
    while [ $i -lt $times ]; do
      i=$((i + 1))
      hvd_mpirun 0 "$hvdrun" -np 4 "$die" $mode $v >"$tmp/out" 2>&1
      rc=$?
      last=$(grep '^hvdrun:' "$tmp/out" | tail -n 1)
      if [ $rc != $want_rc ] || [ "$last" != "$want" ]; then
        bad=$((bad + 1))
        echo "run $i: status $rc, '$last'" >>"$tmp/bad"
      fi
    done
    check $bad "rank $v by $mode, $times runs: hvdrun names it, exit $want_rc ($bad wrong)" ||
      { echo "#   wanted: '$want'"; show "$tmp/bad" "the wrong runs"; }
  done
done
# Through a wrapper script that runs the program as its child (as users
# do to set a variable per rank): Open MPI signals the wrapper's process
# group, so the program's parent is not the launcher; the records must
# still say "by launcher". The victim calls MPI_Abort(5), so mpirun stops
# the others while they wait: hvdrun must say what it says without the
# wrapper (before, a stopped rank's SIGTERM read as its own failure, and
# hvdrun named that rank, "killed by signal 15 ... sent by pid N"). Either
# line below: the victim is stopped by mpirun too (a record of that), or
# ends by itself before it can say so (no record: then it is named).
printf '#!/bin/sh\n"$@"\nexit $?\n' >"$tmp/wrap.sh"
chmod +x "$tmp/wrap.sh"
want="hvdrun: the job ended with status 5, but no rank failed by itself: every rank that kept a record was stopped by mpirun (a rank that called MPI_Abort?)"
for wrap in "" "$tmp/wrap.sh"; do
  bad=0
  : >"$tmp/bad"
  i=0
  while [ $i -lt $rounds ]; do
    i=$((i + 1))
    v=$((i % 4))
    hvd_mpirun 0 "$hvdrun" -np 4 $wrap "$die" abort $v >"$tmp/out" 2>&1
    rc=$?
    last=$(grep '^hvdrun:' "$tmp/out" | tail -n 1)
    named="hvdrun: rank $v ($host) ended without a word (no record of its end: MPI_Abort from the program or MPI itself, or killed before it could say) and the job ended with status 5; $(others $v)"
    if [ $rc != 5 ] || { [ "$last" != "$want" ] && [ "$last" != "$named" ]; }; then
      bad=$((bad + 1))
      echo "run $i: status $rc, '$last'" >>"$tmp/bad"
    fi
  done
  check $bad "MPI_Abort(5)${wrap:+ through a wrapper script}, $rounds runs: nobody else blamed, exit 5 ($bad wrong)" ||
    { echo "#   wanted: '$want'"; show "$tmp/bad" "the wrong runs"; }
done

# A fault before hvd_init on rank 1 while rank 0 is still starting (a
# wrapper script sleeps 2 s first, as a Python rank importing would): rank
# 0 has no record, so hvdrun cannot know it did not fail first (its record
# may be on another host's file system): it blames no rank, says that
# rank 0 left none, keeps mpirun's status, and gives rank 1's fault as the
# first failure its records show (before, the silent rank 0 was blamed).
case ${HVD_TEST_SANITIZER-} in
  *address*) echo "ok $((n + 1)) # SKIP ASan reports the fault itself"
    n=$((n + 1)) ;;
  *)
    printf '#!/bin/sh\n[ "$OMPI_COMM_WORLD_RANK" != 0 ] || sleep 2\nexec "$@"\n' \
      >"$tmp/slow0.sh"
    chmod +x "$tmp/slow0.sh"
    hvd_mpirun 0 "$hvdrun" -np 2 "$tmp/slow0.sh" "$die" early 1 >"$tmp/out" 2>&1
    rc=$?
    last=$(grep '^hvdrun:' "$tmp/out" | tail -n 1)
    [ $rc = 139 ] && [ "$last" = "hvdrun: rank 0 left no end record (is HVD_END_DIR on a file system every host shares? hvdrun makes it under TMPDIR), so which rank failed first is not known; mpirun reported exit status 139; the first failure that the records here show: rank 1 ($host) was killed by signal 11 (Segmentation fault)" ]
    check $? "a fault before hvd_init while rank 0 still starts: rank 0 left no record, rank 1's fault shown, exit 139 (status $rc)" ||
      echo "#   got: '$last'" ;;
esac

# exit(-1): the status the launcher sees, 255, not "-1"
hvd_mpirun 0 "$hvdrun" -np 4 "$die" neg 2 >"$tmp/out" 2>&1
rc=$?
last=$(grep '^hvdrun:' "$tmp/out" | tail -n 1)
[ $rc = 255 ] && [ "$last" = "hvdrun: rank 2 ($host) exited with status 255; $(others 2)" ]
check $? "exit(-1) on rank 2: 'exited with status 255', exit 255 (status $rc)" ||
  echo "#   got: '$last'"

# The records themselves (lib/base/end_record.h), written by t/mpi/die on 3
# ranks under mpirun with HVD_END_DIR: the victim's says it exited 3, with
# its rank, host, pid and time; each other rank's says it ended by itself
# (exit 1 after the shutdown error) or was being stopped by the launcher.
mkdir "$tmp/ends"
HVD_END_DIR=$tmp/ends
export HVD_END_DIR
hvd_mpirun 3 "$die" exit 1 >"$tmp/out" 2>&1
unset HVD_END_DIR
rec1=$(tr '\n' ' ' <"$tmp/ends/rank.1" 2>/dev/null)
printf '%s\n' "$rec1" |
  grep -Eqx "rank 1 host $host pid [0-9]+ state exited status 3 time [0-9]+\.[0-9]{6} "
check $? "rank 1's record: rank, host, pid, exited, status 3, time" ||
  echo "#   got: '$rec1'"
good=0
for r in 0 2; do
  rec=$(tr '\n' ' ' <"$tmp/ends/rank.$r" 2>/dev/null)
  case $rec in
    "rank $r host $host pid "*" state exited status 1 time "* | \
      "rank $r host $host pid "*" state signal signal 15 by launcher time "* | \
      "rank $r host $host pid "*" state stopping signal 18 by launcher ") ;;
    *) good=1; echo "#   rank $r: '$rec'" ;;
  esac
done
check $good "ranks 0 and 2's records: exited 1, or stopped by the launcher"

echo "1..$n"
exit $failed
