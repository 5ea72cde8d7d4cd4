#!/bin/sh
# negotiation.sh - the negotiation's cost per cycle against world size
# (doc/scale.md). Not a test: run by hand after make check's build,
#
#   sh t/mpi/negotiation.sh [NP...]      (default 2 4 8 16 32 64)
#
# For each NP, t/mpi/negotiation cold and cached (ROUNDS rounds of BURST
# one-element allreduces; HVD_NEGOTIATION_ROUNDS, default 20, and
# HVD_NEGOTIATION_BURST, default 8) on one host, oversubscribed, with
# t/mpi/mpicount.la preloaded; one line per run: the engine cycles of
# the counted rounds (fast-path MPI_Iallreduce(BOR) calls on rank 0),
# and per cycle: the bit vector's bytes, the slow path's calls (rank 0),
# the bytes rank 0 received through MPI_Igatherv and the largest any
# other rank sent, the bytes of the response list (MPI_Ibcast) and of the
# size exchange (MPI_Iallgather, received per rank); per cold name, the
# bytes rank 0 received (MPI_Igatherv) and sent (MPI_Ibcast); then the
# time per round (a 2-core machine oversubscribed: the counts, not the time, are
# what carries over to a cluster).
top=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${HVD_NEGOTIATION_ROUNDS:-20}
burst=${HVD_NEGOTIATION_BURST:-8}
dir=$(mktemp -d "${TMPDIR:-/tmp}/hvd-negotiation.XXXXXX") || exit 1
trap 'rm -rf "$dir"' 0
[ "$(id -u)" != 0 ] ||
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf '%-4s %-6s %6s %8s %6s %10s %10s %8s %9s %9s %8s %9s\n' np mode \
  cycles bv_bytes slow gv_recv_r0 gv_sent_mx bcast_b agather_b \
  gv_r0/nm bc/nm ms/round
for np in ${*:-2 4 8 16 32 64}; do
  for mode in ${HVD_NEGOTIATION_MODES:-cold cached grouped}; do
    rm -f "$dir"/rank.*
    out=$(MPICOUNT_DIR=$dir timeout 600 mpirun -np "$np" --oversubscribe \
      --bind-to none -x MPICOUNT_DIR \
      -x LD_PRELOAD="$top/t/mpi/.libs/mpicount.so" \
      "$top/t/mpi/negotiation" "$mode" "$rounds" "$burst" 2>&1) || {
      echo "np $np $mode: failed: $out" >&2
      continue
    }
    secs=$(printf '%s\n' "$out" | sed -n 's/.* seconds \([0-9.]*\)$/\1/p')
    awk -v np="$np" -v mode="$mode" -v secs="$secs" -v rounds="$rounds" \
      -v burst="$burst" '
      { r = FILENAME; sub(/.*rank\./, "", r) }
      r == 0 && $1 == "fastpath_bor" { cyc = $2; bv = $2 ? $3 / $2 : 0 }
      r == 0 && $1 == "igatherv" { slow = $2; gv0 = $4 }
      r != 0 && $1 == "igatherv" && $3 > gvmx { gvmx = $3 }
      r == 0 && $1 == "ibcast" { bc = $3 }
      r == 0 && $1 == "iallgather" { ag = $4 }
      END {
        c = cyc ? cyc : 1
        names = mode == "cold" ? rounds * burst : 0
        printf "%-4d %-6s %6d %8.0f %6d %10.0f %10.0f %8.0f %9.0f %9.0f %8.0f %9.3f\n",
          np, mode, cyc, bv, slow, gv0 / c, gvmx / c, bc / c, ag / c,
          names ? gv0 / names : 0, names ? bc / names : 0,
          secs * 1000 / rounds }' "$dir"/rank.*
  done
done
