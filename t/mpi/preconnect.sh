#!/bin/sh
# preconnect.sh - hvd_init's preconnect (HVD_MPI_PRECONNECT, lib/core/
# runtime.c): before its first collective, hvd_init connects every pair of
# ranks, the lower rank first, and rank 0 says so at info level, with the
# number of ranks. examples/first at np 1-4 (the average is right):
#  1. np 2, 3, 4: exactly one line "hvd_init connected every pair of the
#     N ranks, the lower rank first, in T ms (HVD_MPI_PRECONNECT)", from
#     rank 0; np 1: none (no pair).
#  2. HVD_MPI_PRECONNECT=3: done at np 3, not at np 4; =0: not at np 2.
#  3. A rank whose HVD_MPI_PRECONNECT differs (0 on one rank): with
#     HVD_STALL_CHECK_TIME=1 and HVD_STALL_SHUTDOWN_TIME=3, the others say
#     after 1 s which rank they wait for, and hvd_init fails on every
#     rank, the one that skipped the preconnect included, naming the
#     ranks and their values ("HVD_MPI_PRECONNECT must be equal on every
#     rank: rank 0 64 vs rank 2 0"); the job ends, non-zero, within 30 s
#     (no hang), without MPI_Abort (nothing was left pending). Once with
#     rank 0 skipping, once with rank 2 of 3. (t/mpi/settings: the
#     result codes, and hvd_init called again.)
# (t/mpi/cluster.sh checks, with Open MPI's own account of its TCP
# connects, that the lower rank of each pair makes the connection.)

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/first
need_prog "$prog"
make_tmp preconnect

echo "1..9"
line="hvd_init connected every pair of the \([0-9]*\) ranks, the lower rank first, in [0-9.]* ms (HVD_MPI_PRECONNECT)"

# said NP: exit 0, the right average on every rank, and the number of
# ranks in rank 0's preconnect lines (none: empty); sets got.
said() {
  HVD_LOG_LEVEL=info run_np $1 "$tmp/out" "$tmp/err" "$prog"
  avg=$(awk -v p=$1 'BEGIN { printf "%.2f", (p - 1) / 2 }')
  got=$(sed -n "s/^\[hvd 0\] info: $line\$/\1/p" "$tmp/err" | paste -sd' ' -)
  [ $rc = 0 ] && [ "$(grep -c "average $avg (expected $avg)" "$tmp/out")" = $1 ] &&
    [ "$(grep -c "$line" "$tmp/err")" = "$(echo $got | wc -w)" ]
}

for np in 1 2 3 4; do
  want=$([ $np -gt 1 ] && echo $np)
  said $np
  check $([ $? = 0 ] && [ "$got" = "$want" ]; echo $?) \
    "np $np: $([ -n "$want" ] && echo "rank 0 connected every pair of the $np ranks, once" || echo "no preconnect (no pair)") (exit $rc; said '$got')" ||
    { show "$tmp/out" stdout; show "$tmp/err" stderr; }
done

HVD_MPI_PRECONNECT=3
export HVD_MPI_PRECONNECT
said 3
check $([ $? = 0 ] && [ "$got" = 3 ]; echo $?) \
  "HVD_MPI_PRECONNECT=3, np 3: connected (said '$got')" || show "$tmp/err" stderr
said 4
check $([ $? = 0 ] && [ -z "$got" ]; echo $?) \
  "HVD_MPI_PRECONNECT=3, np 4: not connected, and the job works (exit $rc; said '$got')" ||
  show "$tmp/err" stderr
HVD_MPI_PRECONNECT=0
said 2
check $([ $? = 0 ] && [ -z "$got" ]; echo $?) \
  "HVD_MPI_PRECONNECT=0, np 2: not connected, and the job works (exit $rc; said '$got')" ||
  show "$tmp/err" stderr
unset HVD_MPI_PRECONNECT

# differ NP SKIPPER WAITERS WANT: rank SKIPPER has HVD_MPI_PRECONNECT=0;
# the ranks WAITERS (e.g. "0 1") name it after 1 s, every rank fails
# with WANT, and the job ends
differ() {
  HVD_STALL_CHECK_TIME=1 HVD_STALL_SHUTDOWN_TIME=3
  export HVD_STALL_CHECK_TIME HVD_STALL_SHUTDOWN_TIME
  run_np $1 "$tmp/out" "$tmp/err" timeout -k 5 60 sh -c \
    "[ \"\$OMPI_COMM_WORLD_RANK\" = $2 ] && export HVD_MPI_PRECONNECT=0; exec '$prog'"
  unset HVD_STALL_CHECK_TIME HVD_STALL_SHUTDOWN_TIME
  good=$([ $rc != 0 ] && [ $elapsed -le 30 ]; echo $?)
  for w in $3; do
    grep -q "^\[hvd $w\] warning: hvd_init has waited [0-9.]* s for rank(s) $2 to connect (HVD_MPI_PRECONNECT): not yet in hvd_init, or with another HVD_MPI_PRECONNECT? It must be equal on every rank$" "$tmp/err" || good=1
  done
  [ "$(grep -c "^hvd_init: $4\$" "$tmp/err")" = $1 ] || good=1
  ! grep -q MPI_ABORT "$tmp/err" || good=1
  check $good "np $1, HVD_MPI_PRECONNECT=0 on rank $2 alone: rank(s) $3 name it after 1 s, hvd_init fails on all $1 ranks naming the values, and the job ends (exit $rc after $elapsed s)" ||
    show "$tmp/err" stderr
}
differ 2 0 1 "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 0 vs rank 1 64"
differ 3 2 "0 1" "HVD_MPI_PRECONNECT must be equal on every rank: rank 0 64 vs rank 2 0"
