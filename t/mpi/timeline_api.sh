#!/bin/sh
# timeline_api.sh - the timeline from the program and what the events say
# (t/mpi/timeline_prog, python3 to read the JSON), at np 2:
#
#  1. "api" without HVD_TIMELINE: hvd_timeline_start before hvd_init is
#     HVD_ERR_NOT_INITIALIZED; on an unwritable path HVD_ERR_IO naming it
#     (rank 0, which writes); then the file has "api.x"'s ALLREDUCE with
#     bytes 4000, dtype float32, tensors 1, the four fused "api.s*" with
#     tensors 4, the USER track's "phase.a" instant and the "loss" counter
#     at 1.5; nothing after hvd_timeline_stop ("api.after", "after.stop");
#  2. with HVD_TIMELINE at hvd_init: a READY instant for each rank on each
#     tensor's track;
#  3. HVD_TIMELINE_MAX_BYTES=4K: the file stays valid JSON, ends with a
#     TIMELINE_CAP event and is at most a few KiB over;
#  4. HVD_TIMELINE_ALL_RANKS=1: bin/hvd-timeline-merge makes one trace of
#     the two files, with both ranks' events;
#  5. hvd-timeline-merge reads JSON, not brackets: a file cut short inside
#     its array gives its complete events (a ']' in a tensor name once
#     passed for the array's end: invalid JSON, exit 0) and a note; a
#     bracket that closes nothing and text after the array are refused,
#     naming the byte.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/mpi/timeline_prog
merge=$HVD_TOP_BUILDDIR/bin/hvd-timeline-merge
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT
unset HVD_TIMELINE HVD_TIMELINE_ALL_RANKS HVD_TIMELINE_MAX_BYTES \
  HVD_CACHE_CAPACITY HVD_FUSION_THRESHOLD HVD_CHUNK_SIZE HVD_CYCLE_TIME
need_prog "$prog"
need_prog "$merge"
command -v python3 >/dev/null 2>&1 || skip_all "no python3 to read the JSON"
make_tmp timeline_api

# py FILE CODE: runs CODE with `ev`, the file's events; its exit status.
py() {
  python3 - "$1" "$2" <<'PY'
import json, sys
ev = json.load(open(sys.argv[1]))
tracks = {}
for e in ev:
    if e.get("ph") == "M" and e.get("name") == "thread_name":
        tracks[(e["pid"], e["tid"])] = e["args"]["name"]
def on(e):
    return tracks.get((e.get("pid"), e.get("tid")))
ok = eval(sys.argv[2])
sys.exit(0 if ok else 1)
PY
}

echo "1..12"
run_np 2 "$tmp/api.out" "$tmp/api.err" "$prog" api "$tmp/api.json" "$tmp/no/such/dir/x.json"
[ $rc = 0 ] && [ "`grep -c '^timeline_prog\[[01]\]: done$' "$tmp/api.out"`" = 2 ] &&
  ! grep -q FAIL "$tmp/api.out"
check $? "api: start before init, on a bad path, then a file; every result right (exit $rc)" ||
  { show "$tmp/api.out" stdout; show "$tmp/api.err" stderr; }
py "$tmp/api.json" '[e["args"] for e in ev if e.get("name") == "ALLREDUCE" and on(e) == "api.x"] == [{"bytes": 4000, "dtype": "float32", "tensors": 1}]'
check $? "api.x's ALLREDUCE: bytes 4000, dtype float32, tensors 1"
py "$tmp/api.json" 'sorted(on(e) for e in ev if e.get("ph") == "X" and e.get("args", {}).get("tensors") == 4 and e.get("name") == "ALLREDUCE") == ["api.s0", "api.s1", "api.s2", "api.s3"]'
check $? "the four small ones fused: their ALLREDUCE says tensors 4"
py "$tmp/api.json" '[(on(e), e["name"]) for e in ev if e.get("ph") == "i" and on(e) == "USER"] == [("USER", "phase.a")] and [e["args"]["value"] for e in ev if e.get("ph") == "C" and e["name"] == "loss"] == [1.5]'
check $? "the program's mark (USER track) and counter (loss = 1.5)"
py "$tmp/api.json" 'not any(on(e) == "api.after" or e.get("name") == "after.stop" for e in ev) and not any(e.get("name") == "READY" for e in ev)'
check $? "nothing after hvd_timeline_stop; no READY ticks (HVD_TIMELINE was not set at init)"

HVD_TIMELINE=$tmp/init.json
export HVD_TIMELINE
run_np 2 "$tmp/init.out" "$tmp/init.err" "$prog" run
unset HVD_TIMELINE
[ $rc = 0 ] && py "$tmp/init.json" 'all(sorted(e["args"]["rank"] for e in ev if e.get("name") == "READY" and on(e) == t) == [0, 0, 0, 1, 1, 1] for t in ("large", "small.0"))'
check $? "with HVD_TIMELINE at init: each rank's READY tick on each tensor's track, per round (exit $rc)" ||
  show "$tmp/init.err" stderr

HVD_TIMELINE=$tmp/cap.json HVD_TIMELINE_MAX_BYTES=4K
export HVD_TIMELINE HVD_TIMELINE_MAX_BYTES
run_np 2 "$tmp/cap.out" "$tmp/cap.err" "$prog" run
unset HVD_TIMELINE HVD_TIMELINE_MAX_BYTES
bytes=`wc -c <"$tmp/cap.json"`
[ $rc = 0 ] && [ "$bytes" -lt 8192 ] &&
  py "$tmp/cap.json" 'ev[-1]["name"] == "TIMELINE_CAP" and ev[-1]["args"]["max_bytes"] == 4096' &&
  grep -q "timeline: $tmp/cap.json reached HVD_TIMELINE_MAX_BYTES (4096 bytes); nothing more is written to it" "$tmp/cap.err"
check $? "HVD_TIMELINE_MAX_BYTES=4K: $bytes bytes, valid JSON ending in TIMELINE_CAP, a warning (exit $rc)" ||
  show "$tmp/cap.err" stderr

HVD_TIMELINE_ALL_RANKS=1
export HVD_TIMELINE_ALL_RANKS
run_np 2 "$tmp/all.out" "$tmp/all.err" "$prog" api "$tmp/all.json" "$tmp/no/such/dir/x.json"
unset HVD_TIMELINE_ALL_RANKS
[ $rc = 0 ] && [ -f "$tmp/all.0.json" ] && [ -f "$tmp/all.1.json" ] &&
  "$merge" -o "$tmp/merged.json" "$tmp/all.0.json" "$tmp/all.1.json" >"$tmp/merge.out" 2>&1 &&
  grep -qx "hvd-timeline-merge: wrote $tmp/merged.json from 2 files" "$tmp/merge.out" &&
  py "$tmp/merged.json" 'sorted({e["pid"] for e in ev if e.get("name") == "ALLREDUCE"}) == [0, 1] and len([e for e in ev if e.get("name") == "ALLREDUCE"]) == 10'
check $? "HVD_TIMELINE_ALL_RANKS=1: hvd-timeline-merge makes one trace of both ranks (exit $rc)" ||
  { show "$tmp/all.out" stdout; show "$tmp/all.err" stderr; show "$tmp/merge.out" merge; }
printf 'not json' >"$tmp/bad.json"
"$merge" -o "$tmp/m2.json" "$tmp/bad.json" >"$tmp/merge.out" 2>&1
mrc=$?
[ $mrc = 1 ] && grep -qx "hvd-timeline-merge: '$tmp/bad.json' is not a JSON array (an hvd timeline?): it does not start with a JSON array (byte 0)" "$tmp/merge.out" &&
  [ ! -e "$tmp/m2.json" ]
check $? "hvd-timeline-merge on a file that is no array: exit 1 and the reason" ||
  show "$tmp/merge.out" merge

printf '%s' '[{"name":"A","ph":"i","pid":0,"tid":0,"ts":1,"args":{"tensor":"w[0]"}},
{"name":"B","ph":"i","pid":0,"tid":0,"ts":2,"args":{"s":"]}\"["}},
{"name":"NEGOT' >"$tmp/cut.json"
printf '%s\n' '[{"name":"C","ph":"i","pid":1,"tid":0,"ts":3}]' >"$tmp/one.json"
"$merge" -o "$tmp/m3.json" "$tmp/cut.json" "$tmp/one.json" >"$tmp/merge.out" 2>&1
mrc=$?
[ $mrc = 0 ] &&
  grep -qx "hvd-timeline-merge: note: '$tmp/cut.json' ends inside its array (cut short while written?): its complete events are kept" "$tmp/merge.out" &&
  py "$tmp/m3.json" '[e["name"] for e in ev] == ["A", "B", "C"] and ev[0]["args"]["tensor"] == "w[0]" and ev[1]["args"]["s"] == "]}\"["'
check $? "a file cut short: its 2 complete events and the other file's, valid JSON, a note (exit $mrc)" ||
  show "$tmp/merge.out" merge

printf '%s' '[{"name":"A"]]' >"$tmp/bad2.json"
"$merge" -o "$tmp/m4.json" "$tmp/bad2.json" >"$tmp/merge.out" 2>&1
mrc=$?
[ $mrc = 1 ] && [ ! -e "$tmp/m4.json" ] &&
  grep -qx "hvd-timeline-merge: '$tmp/bad2.json' is not a JSON array (an hvd timeline?): it has a bracket that closes nothing open (byte 12)" "$tmp/merge.out"
check $? "a bracket that closes nothing: exit $mrc, named with its byte" ||
  show "$tmp/merge.out" merge

printf '%s\n' '[{"name":"A"}]' 'x' >"$tmp/bad3.json"
"$merge" -o "$tmp/m5.json" "$tmp/bad3.json" >"$tmp/merge.out" 2>&1
mrc=$?
[ $mrc = 1 ] && [ ! -e "$tmp/m5.json" ] &&
  grep -qx "hvd-timeline-merge: '$tmp/bad3.json' is not a JSON array (an hvd timeline?): it has text after its JSON array (byte 15)" "$tmp/merge.out"
check $? "text after the array: exit $mrc, named with its byte" ||
  show "$tmp/merge.out" merge
exit $failed
