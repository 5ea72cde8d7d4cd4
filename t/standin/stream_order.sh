#!/bin/sh
# stream_order.sh - the stand-in's stream order (t/standin/cudart.c,
# HVD_STANDIN_STREAM_ORDER, on by default): work runs at the call, but
# a read of device memory that a GPU could run before the write it needs
# ends the process, naming both streams. t/standin/selftest race MODE
# writes on stream A and reads elsewhere (selftest.c says how).
: "${HVD_TOP_BUILDDIR:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
tmp=`mktemp -d "${TMPDIR:-/tmp}/stream_order.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
echo "1..7"
n=0
dies() { # mode, the reader's message, what
  n=`expr $n + 1`
  HVD_STANDIN_STREAM_ORDER=1 "$prog" race "$1" >"$tmp/out" 2>&1
  rc=$?
  if [ $rc != 0 ] && ! grep -q '^race: done' "$tmp/out" &&
    grep -Eq "^hvd stand-in: $2 \(64 bytes at 0x[0-9a-f]+\) on stream [0-9]+, which stream [0-9]+ wrote \(cudaMemsetAsync, its operation [0-9]+\) with nothing ordering the two: record an event after the write and cudaStreamWaitEvent on it, or synchronise \(on a GPU this reads or overwrites the data at an unknown moment\)$" "$tmp/out"; then
    echo "ok $n - $3 (status $rc)"
  else
    echo "not ok $n - $3 (status $rc)"
    sed 's/^/#   /' "$tmp/out"
  fi
}
passes() { # mode, what [, environment assignment]
  n=`expr $n + 1`
  env ${3:-HVD_STANDIN_STREAM_ORDER=1} "$prog" race "$1" >"$tmp/out" 2>&1
  rc=$?
  if [ $rc = 0 ] && [ "`cat "$tmp/out"`" = "race: done (7)" ]; then
    echo "ok $n - $2"
  else
    echo "not ok $n - $2 (status $rc)"
    sed 's/^/#   /' "$tmp/out"
  fi
}
dies unordered "cudaMemcpyAsync reads src" \
  "a read on stream B of stream A's write, nothing between: ends the process"
dies legacy "cudaMemcpy reads src" \
  "a synchronous copy of a non-blocking stream's write: ends the process"
passes event "B waits for an event recorded after the write: passes"
passes synced "B after the host synchronised A: passes"
passes blocking "a synchronous copy of a blocking stream's write: passes"
passes unordered "HVD_STANDIN_STREAM_ORDER=0: no check" \
  HVD_STANDIN_STREAM_ORDER=0
passes legacy "HVD_STANDIN_STREAM_ORDER=0: no check (legacy)" \
  HVD_STANDIN_STREAM_ORDER=0
