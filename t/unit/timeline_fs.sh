#!/bin/sh
# timeline_fs.sh - the timeline's file when its process or its disk
# fails. `t/unit/timeline_file flood PATH` writes 3 MiB of marks (three
# flushes of the 1 MiB buffer, each with the closing "]").
#
#  1. Under strace, which sends SIGKILL on entry to its Nth write, pwrite
#     or writev (N = 2 to 6: before each system call of each flush): the
#     file is valid JSON every time. stdio once split a flush in two
#     writes, so a kill between them left half of it, without its "]".
#     Skipped without strace, or where it cannot trace.
#  2. PATH on a 1 MiB tmpfs (mounted in a mount namespace of its own:
#     unshare -m; skipped where that is refused): the disk fills in the
#     first flush; one warning names the file and "No space left on
#     device", the file is cut back to valid JSON (its header), and the
#     program exits 0.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/t/unit/timeline_file
need_prog "$prog"
command -v python3 >/dev/null 2>&1 || skip_all "no python3 to read the JSON"
make_tmp timeline_fs

# valid FILE: status 0 if FILE is a JSON array that begins with the
# process's name; python3's complaint in $tmp/py.out.
valid() {
  python3 -c 'import json, sys
ev = json.load(open(sys.argv[1], encoding="utf-8"))
sys.exit(0 if ev[0]["name"] == "process_name" else 1)' "$1" \
    >"$tmp/py.out" 2>&1
}

# ---- 1. a kill at each write ----
if ! command -v strace >/dev/null 2>&1; then
  n=$((n + 1))
  echo "ok $n # SKIP no strace"
elif ! strace -f -o /dev/null true >/dev/null 2>&1; then
  n=$((n + 1))
  echo "ok $n # SKIP strace cannot trace here (ptrace refused)"
else for when in 2 3 4 5 6; do
  rm -f "$tmp/tl.json"
  (strace -f -o /dev/null -e trace=write,pwrite64,writev \
    -e inject=write,pwrite64,writev:signal=KILL:when=$when \
    "$prog" flood "$tmp/tl.json" >/dev/null 2>&1) 2>/dev/null
  rc=$?
  valid "$tmp/tl.json"
  check $? "killed at write $when (status $rc): the file is valid JSON" ||
    show "$tmp/py.out" python3
done; fi

# ---- 2. a full disk ----
mkdir "$tmp/small"
unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs "$1" || exit 77
"$2" flood "$1/tl.json" 2>"$3/err"
rc=$?
cp "$1/tl.json" "$3/full.json"
exit $rc' sh "$tmp/small" "$prog" "$tmp" >"$tmp/mount.out" 2>&1
rc=$?
if [ $rc = 77 ] || ! [ -f "$tmp/full.json" ]; then
  n=$((n + 1))
  echo "ok $n # SKIP a 1 MiB tmpfs: unshare -m or mount refused (`head -1 "$tmp/mount.out"`)"
else
  check $rc "full disk: the program exits 0 (status $rc)"
  want="timeline: cannot write '$tmp/small/tl.json': No space left on device; it ends at its last whole event and nothing more is written to it"
  [ "`grep -c 'timeline:' "$tmp/err"`" = 1 ] && grep -qF "$want" "$tmp/err"
  check $? "full disk: one warning naming the file and the error" ||
    show "$tmp/err" stderr
  valid "$tmp/full.json"
  check $? "full disk: the file is valid JSON" || show "$tmp/py.out" python3
fi

echo "1..$n"
exit $failed
