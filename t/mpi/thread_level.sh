#!/bin/sh
# thread_level.sh - a program that initialises MPI below
# MPI_THREAD_MULTIPLE (MPI_Init, or MPI_Init_thread at FUNNELED or
# SERIALIZED) cannot start hvd: t/mpi/thread_level at np 2 for each, every
# rank's checks passing (its exit status), within the test timeout.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/thread_level
need_prog "$prog"
make_tmp thread_level

for level in single funneled serialized; do
  run_np 2 "$tmp/$level.out" "$tmp/$level.err" "$prog" $level
  tap_through "$level" "$tmp/$level.out"
  [ $rc = 0 ]
  check $? "$level: every rank's checks pass (exit $rc)" ||
    show "$tmp/$level.err" stderr
done
echo "1..$n"
exit $failed
