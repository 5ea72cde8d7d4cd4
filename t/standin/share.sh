#!/bin/sh
# share.sh - t/gpu/share.sh (which see) on the host stand-in: its one GPU
# is HVD_STANDIN_DEVICES=1, whose NCCL refuses two ranks on it as NCCL
# does ("Duplicate GPU detected") unless their NCCL_HOSTIDs differ.
: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_TOP_SRCDIR:?run me from make check}"
HVD_SHARE_BUILD=$HVD_TOP_BUILDDIR/t/standin
HVD_SHARE_ENV=HVD_STANDIN_DEVICES=1
export HVD_SHARE_BUILD HVD_SHARE_ENV
exec "${SHELL:-/bin/sh}" "$HVD_TOP_SRCDIR/t/gpu/share.sh"
