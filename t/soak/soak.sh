#!/bin/sh
# soak.sh - the soak (t/soak/soak.c; make check-soak, not make check): its
# TAP, from HVD_SOAK_OPS collectives (default 100000) at np 4 and a
# quarter as many on each of two process sets on threads of their own
# (--sets; about 130 s on 2 cores), oversubscribed on this machine's
# cores, under HVD_TEST_TIMEOUT (default 1200 s here).

. "${HVD_TOP_SRCDIR:?run me from make check-soak}/t/util/testlib.sh"
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-1200}
export HVD_TEST_TIMEOUT
HVD_MPIRUN_TEST_LIB=1
. "$HVD_MPIRUN_TEST"
unset HVD_LOG_LEVEL
ops=${HVD_SOAK_OPS:-100000}
hvd_mpirun 4 "$HVD_TOP_BUILDDIR/t/soak/soak" --ops "$ops" --sets $((ops / 4))
