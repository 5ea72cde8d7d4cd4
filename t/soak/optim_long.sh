#!/bin/sh
# optim_long.sh - make check-soak's optimizer soak: t/mpi/optim_soak.sh with
# 3000 configurations of 12 steps per world size (unless
# HVD_SOAK_OPTIM_CONFIGS or HVD_SOAK_OPTIM_STEPS say otherwise).
HVD_SOAK_OPTIM_CONFIGS=${HVD_SOAK_OPTIM_CONFIGS:-3000}
HVD_SOAK_OPTIM_STEPS=${HVD_SOAK_OPTIM_STEPS:-12}
export HVD_SOAK_OPTIM_CONFIGS HVD_SOAK_OPTIM_STEPS
exec sh "${HVD_TOP_SRCDIR:?run me from make check}/t/mpi/optim_soak.sh"
