#!/bin/sh
# timeline.sh - HVD_TIMELINE: t/mpi/timeline_prog (which see) runs at np 2
# and t/mpi/timeline_check.py (which see) checks the JSON it leaves.
#
#  1. HVD_TIMELINE=tl.json: while the program still runs (idle after its
#     collectives, waiting for a "go" file) the file is already valid JSON
#     with their events; after it ends, again, with the last one too. Every
#     tensor has a track, NEGOTIATE (with every rank's ready time), QUEUE
#     and its collective's span; the small fused tensors went through the
#     fusion buffer, the large one did not (HVD_ZERO_COPY=0: the slots'
#     path); CYCLE_START instants; pid 0.
#  2. HVD_TIMELINE_ALL_RANKS=1: tl.0.json and tl.1.json, each valid, each
#     with its rank as pid; no tl.json.
#  3. An unwritable path: hvd_init fails on every rank with HVD_ERR_IO and
#     a message naming the path (with and without ALL_RANKS); hvd_init
#     without HVD_TIMELINE then works.
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/timeline_prog
checker=$HVD_TOP_SRCDIR/t/mpi/timeline_check.py
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT
unset HVD_TIMELINE HVD_TIMELINE_ALL_RANKS HVD_CACHE_CAPACITY \
  HVD_FUSION_THRESHOLD HVD_CHUNK_SIZE HVD_CYCLE_TIME
# the shared slots' path (fusion buffer spans); the program's malloc'd
# tensors would otherwise go by cross-memory attach (t/mpi/zero_copy)
HVD_ZERO_COPY=0
export HVD_ZERO_COPY

need_prog "$prog"
command -v python3 >/dev/null 2>&1 || skip_all "no python3 to read the JSON"
make_tmp timeline

# tlcheck DESCRIPTION FILE ARGS...: one TAP line for timeline_check.py.
tlcheck() {
  what=$1
  shift
  python3 "$checker" "$@" >"$tmp/check.out" 2>&1
  check $? "$what"
  sed 's/^#*/#/' "$tmp/check.out"
}
nap() {
  sleep 0.1 2>/dev/null || sleep 1
}

small=small.0,small.1,small.2,small.3
counts="large:3,small.0:3,small.1:3,small.2:3,small.3:3"
colls="--broadcast bcast:1 --allgather gather:1"

# ---- 1. rank 0's timeline, mid-run and at the end ----
out=$tmp/run.out
err=$tmp/run.err
(
  HVD_TIMELINE=$tmp/tl.json
  export HVD_TIMELINE
  "$HVD_MPIRUN_TEST" --np 2 "$prog" run "$tmp/marker" "$tmp/go" \
    >"$out" 2>"$err"
  echo $? >"$tmp/rc"
) &
job=$!
i=0
while [ ! -f "$tmp/marker" ] && [ ! -f "$tmp/rc" ] && [ $i -lt 450 ]; do
  nap
  i=$((i + 1))
done
[ -f "$tmp/marker" ]
check $? "the program reaches its idle point (marker file)"
[ ! -f "$tmp/rc" ]
check $? "mid-run: the program is still running"
tlcheck "mid-run: tl.json is valid JSON with every collective so far" \
  "$tmp/tl.json" --rank 0 --size 2 --allreduce "$counts" --fused "$small" \
  --direct large $colls --cycles
[ ! -f "$tmp/rc" ]
check $? "mid-run: ... read while the program was still running"
touch "$tmp/go"
wait $job
rc=`cat "$tmp/rc" 2>/dev/null`
[ "$rc" = 0 ]
check $? "the program exits 0 (status $rc)"
count=`grep -c "^timeline_prog\[[01]\]: done\$" "$out"`
[ "$count" = 2 ] && ! grep -q FAIL "$out"
check $? "every result was right on both ranks ($count of 2 done)"
[ "$rc" = 0 ] && [ "$count" = 2 ] || { show "$out" stdout; show "$err" stderr; }
tlcheck "at the end: tl.json is valid JSON with every collective" \
  "$tmp/tl.json" --rank 0 --size 2 --allreduce "$counts,after:1" \
  --fused "$small" --direct large $colls --cycles
[ ! -f "$tmp/tl.0.json" ] && [ ! -f "$tmp/tl.1.json" ]
check $? "without ALL_RANKS only rank 0 writes (no tl.0.json, tl.1.json)"

# ---- 2. every rank's timeline ----
out=$tmp/all.out
err=$tmp/all.err
HVD_TIMELINE=$tmp/all.json HVD_TIMELINE_ALL_RANKS=1 \
  "$HVD_MPIRUN_TEST" --np 2 "$prog" run >"$out" 2>"$err"
rc=$?
check $rc "ALL_RANKS: the program exits 0 (status $rc)"
[ $rc = 0 ] || { show "$out" stdout; show "$err" stderr; }
tlcheck "ALL_RANKS: all.0.json is valid, pid 0, every collective" \
  "$tmp/all.0.json" --rank 0 --size 2 --allreduce "$counts,after:1" \
  --fused "$small" $colls --cycles
# (ready times of cached collectives go to rank 0 only: --no-ready)
tlcheck "ALL_RANKS: all.1.json is valid, pid 1, every collective" \
  "$tmp/all.1.json" --rank 1 --size 2 --no-ready \
  --allreduce "$counts,after:1" --fused "$small" $colls --cycles
[ ! -f "$tmp/all.json" ]
check $? "ALL_RANKS: no all.json without a rank"

# ---- 3. an unwritable path ----
bad=/nonexistent/hvd-timeline-test/x.json
out=$tmp/fail.out
HVD_TIMELINE=$bad "$HVD_MPIRUN_TEST" --np 2 "$prog" initfail "$bad" \
  >"$out" 2>&1
rc=$?
count=`grep -c "^timeline_prog\[[01]\]: hvd_init failed as expected: .*$bad" "$out"`
[ "$count" = 2 ]
check $? "unwritable $bad: hvd_init fails on both ranks with HVD_ERR_IO naming it ($count of 2)"
count2=`grep -c "^timeline_prog\[[01]\]: init works without HVD_TIMELINE\$" "$out"`
[ "$count2" = 2 ]
check $? "unwritable: then hvd_init without HVD_TIMELINE works ($count2 of 2)"
[ $rc = 0 ] && [ "$count" = 2 ] && [ "$count2" = 2 ] || show "$out" output

out=$tmp/failall.out
HVD_TIMELINE=$bad HVD_TIMELINE_ALL_RANKS=1 \
  "$HVD_MPIRUN_TEST" --np 2 "$prog" initfail /nonexistent/hvd-timeline-test/x. \
  >"$out" 2>&1
rc=$?
count=`grep -c "^timeline_prog\[\([01]\)\]: hvd_init failed as expected: .*/nonexistent/hvd-timeline-test/x\.\1\.json" "$out"`
[ $rc = 0 ] && [ "$count" = 2 ]
check $? "unwritable, ALL_RANKS: each rank fails naming its own x.R.json ($count of 2)"
[ $rc = 0 ] && [ "$count" = 2 ] || show "$out" output

echo "1..$n"
exit $failed
