#!/bin/sh
# optim_long.sh - make check-soak's optimizer soak: t/mpi/optim_soak.sh with
# 3000 configurations of 12 steps per world size (unless
# HVD_SOAK_OPTIM_CONFIGS or HVD_SOAK_OPTIM_STEPS say otherwise), each run
# under HVD_TEST_TIMEOUT (default 900 s here: a run at np 4 takes about
# 80 s alone on 2 cores, and more than the usual 120 s beside other work).
HVD_SOAK_OPTIM_CONFIGS=${HVD_SOAK_OPTIM_CONFIGS:-3000}
HVD_SOAK_OPTIM_STEPS=${HVD_SOAK_OPTIM_STEPS:-12}
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-900}
export HVD_SOAK_OPTIM_CONFIGS HVD_SOAK_OPTIM_STEPS HVD_TEST_TIMEOUT
exec sh "${HVD_TOP_SRCDIR:?run me from make check}/t/mpi/optim_soak.sh"
