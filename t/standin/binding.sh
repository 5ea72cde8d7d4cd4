#!/bin/sh
# binding.sh - hvd_init's GPU binding on the host stand-in (t/standin): the
# cases of t/gpu/binding.sh (which see) with t/standin/binding, t/gpu's
# binding.c linked against the stand-in, whose pretend GPUs
# (HVD_STANDIN_DEVICES, 4 unless set) have distinct PCI bus ids and UUIDs
# and honour CUDA_VISIBLE_DEVICES: np 1 bound to device 0; np 2 on one
# visible GPU fails naming both ranks and the bus id; the same with
# HVD_NO_BIND=1 works; np 2 on all of them binds devices 0 and 1.

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_TOP_SRCDIR:?run me from make check}"
HVD_BINDING_PROG=$HVD_TOP_BUILDDIR/t/standin/binding
export HVD_BINDING_PROG
exec "${SHELL:-/bin/sh}" "$HVD_TOP_SRCDIR/t/gpu/binding.sh"
