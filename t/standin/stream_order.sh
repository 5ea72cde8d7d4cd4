#!/bin/sh
# stream_order.sh - the stand-in's stream order (t/standin/cudart.c,
# HVD_STANDIN_STREAM_ORDER, on by default): work runs at the call, but
# an access that a GPU could run in the wrong order ends the process,
# naming both streams. t/standin/selftest race MODE writes on stream A
# and reads elsewhere; selftest war MODE reads on A and overwrites
# elsewhere; selftest pinned MODE copies between device and pinned
# memory while the host touches the pinned side; selftest perthread MODE
# reads on cudaStreamPerThread (selftest.c says how).
: "${HVD_TOP_BUILDDIR:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/standin/selftest
tmp=`mktemp -d "${TMPDIR:-/tmp}/stream_order.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
echo "1..21"
n=0
# the end of every unordered-access line
tail_w='with nothing ordering the two: record an event after the write and cudaStreamWaitEvent on it, or synchronise \(on a GPU this reads or overwrites the data at an unknown moment\)$'
tail_r='with nothing ordering the two: record an event after the read and cudaStreamWaitEvent on it, or synchronise \(on a GPU this overwrites the data at an unknown moment\)$'
ends() { # selftest's arguments (split at blanks), the line (ERE), what
  n=`expr $n + 1`
  HVD_STANDIN_STREAM_ORDER=1 "$prog" $1 >"$tmp/out" 2>&1
  rc=$?
  if [ $rc != 0 ] && ! grep -q ': done' "$tmp/out" &&
    grep -Eq "^hvd stand-in: $2" "$tmp/out"; then
    echo "ok $n - $3 (status $rc)"
  else
    echo "not ok $n - $3 (status $rc)"
    sed 's/^/#   /' "$tmp/out"
  fi
}
prints() { # selftest's arguments, the whole output, what [, environment]
  n=`expr $n + 1`
  env ${4:-HVD_STANDIN_STREAM_ORDER=1} "$prog" $1 >"$tmp/out" 2>&1
  rc=$?
  if [ $rc = 0 ] && [ "`cat "$tmp/out"`" = "$2" ]; then
    echo "ok $n - $3"
  else
    echo "not ok $n - $3 (status $rc)"
    sed 's/^/#   /' "$tmp/out"
  fi
}
at='\(64 bytes at 0x[0-9a-f]+\) on stream [0-9]+, which stream [0-9]+'
# read after write
ends "race unordered" "cudaMemcpyAsync reads src $at wrote \(cudaMemsetAsync, its operation [0-9]+\) $tail_w" \
  "a read on stream B of stream A's write, nothing between: ends the process"
ends "race legacy" "cudaMemcpy reads src $at wrote \(cudaMemsetAsync, its operation [0-9]+\) $tail_w" \
  "a synchronous copy of a non-blocking stream's write: ends the process"
prints "race event" "race: done (7)" "B waits for an event recorded after the write: passes"
prints "race synced" "race: done (7)" "B after the host synchronised A: passes"
prints "race blocking" "race: done (7)" "a synchronous copy of a blocking stream's write: passes"
prints "race unordered" "race: done (7)" "HVD_STANDIN_STREAM_ORDER=0: no check" \
  HVD_STANDIN_STREAM_ORDER=0
prints "race legacy" "race: done (7)" "HVD_STANDIN_STREAM_ORDER=0: no check (legacy)" \
  HVD_STANDIN_STREAM_ORDER=0
# write after read
ends "war copy" "cudaMemsetAsync writes devPtr $at read \(cudaMemcpyAsync, its operation [0-9]+\) $tail_r" \
  "stream B overwrites what stream A's copy reads, nothing between: ends the process"
ends "war host" "cudaMemcpy writes dst $at read \(cudaMemcpyAsync, its operation [0-9]+\) $tail_r" \
  "a synchronous copy into what a non-blocking stream's copy reads: ends the process"
ends "war nccl" "cudaMemsetAsync writes devPtr $at read \(ncclAllReduce on rank 0, its operation [0-9]+\) $tail_r" \
  "stream B overwrites stream A's ncclAllReduce's sendbuff, nothing between: ends the process"
prints "war event" "war: done (1)" "B waits for an event recorded after the copy: passes"
prints "war nccl-event" "war: done (1)" "B waits for an event recorded after the allreduce: passes"
# pinned host memory
prints "pinned early" "pinned: early 0xa5, late 0x11, device 0x11" \
  "an asynchronous copy into pinned memory lands when the host synchronises (0xa5 before)"
ends "pinned rewrite" "the host rewrote pinned memory at 0x[0-9a-f]+ \(byte 0 of 64\) that stream [0-9]+'s cudaMemcpyAsync \(its operation [0-9]+\) reads, before it saw that finish: on a GPU the copy may take the new bytes \(synchronise, or see an event recorded after the copy fire, before rewriting it\)$" \
  "the host rewrites a pinned source before it saw the copy finish: ends the process"
prints "pinned rewrite-synced" "pinned: early 0x00, late 0x02, device 0x01" \
  "the host rewrites a pinned source after synchronising: passes"
ends "pinned write" "the host wrote pinned memory at 0x[0-9a-f]+ \(byte 5 of 64\) that stream [0-9]+'s cudaMemcpyAsync \(its operation [0-9]+\) writes, before it saw that finish: on a GPU the copy may land before or after the host's write$" \
  "the host writes a pinned destination before it saw the copy finish: ends the process"
ends "pinned chain" "cudaMemcpyAsync reads src $at wrote \(cudaMemcpyAsync, its operation [0-9]+\) $tail_w" \
  "stream B copies from pinned memory that stream A copies into, nothing between: ends the process"
prints "pinned chain-event" "pinned: early 0xa5, late 0x11, device 0x11" \
  "B waits for an event after A's copies: passes, with A's bytes"
# cudaStreamPerThread
ends "perthread blocking" "cudaMemcpyAsync reads src $at wrote \(cudaMemsetAsync, its operation [0-9]+\) $tail_w" \
  "the per-thread stream reads a blocking stream's write, nothing between: ends the process"
ends "perthread thread" "cudaMemcpyAsync reads src $at wrote \(cudaMemsetAsync, its operation [0-9]+\) $tail_w" \
  "the per-thread stream reads another thread's per-thread write: ends the process"
prints "perthread legacy" "perthread: done" \
  "the per-thread stream reads the legacy stream's write: passes"
