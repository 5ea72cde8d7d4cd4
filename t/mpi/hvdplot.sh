#!/bin/sh
# hvdplot.sh - bin/hvd-plot (TAP): a JSON-lines log with a line that is no
# record becomes an SVG whose one polyline has a point per record, from
# the plot's left edge to its right, under the escaped title; the summary
# line gives the range and a sparkline; the default file name is the
# log's with .svg; two logs make two curves; a log without records, a
# missing log, no log and a bad option fail with their messages; losses
# a few ulps apart make a flat chart with a few ticks (their step once
# moved no double: a loop that filled the disk); a value beyond 1e300
# fails naming its line (it made NaN coordinates and a crash); a record
# longer than 4 KiB counts.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/bin/hvd-plot
need_prog "$prog"
make_tmp hvdplot

printf '%s\n' '{"step":1,"loss":4.0,"lr":0.001}' 'not a record' \
  '{"step":2,"loss":3.0}' '{"step":3,"loss":2.5,"wall":1.5}' >"$tmp/a.jsonl"
printf '%s\n' '{"step":1,"loss":5.0}' '{"step":3,"loss":1.0}' >"$tmp/b.jsonl"

echo "1..10"
"$prog" -o "$tmp/out.svg" --title 'a <b>' "$tmp/a.jsonl" >"$tmp/out" 2>&1
rc=$?
[ $rc = 0 ] &&
  grep -q "^$tmp/a.jsonl: 3 steps, loss 4 at step 1 to 2.5 at step 3  ...\+$" "$tmp/out" &&
  grep -qx "hvd-plot: wrote $tmp/out.svg" "$tmp/out" &&
  ! ls "$tmp"/out.svg.tmp.* >/dev/null 2>&1
check $? "one log: exit $rc, its range and sparkline, the file named, no temporary left" ||
  show "$tmp/out" output

if command -v python3 >/dev/null 2>&1; then
  python3 - "$tmp/out.svg" <<'PY'
import sys, xml.etree.ElementTree as ET
ns = '{http://www.w3.org/2000/svg}'
root = ET.parse(sys.argv[1]).getroot()
lines = root.findall(ns + 'polyline')
pts = [tuple(map(float, p.split(','))) for p in lines[0].get('points').split()]
title = root.findall(ns + 'text')[0].text
ok = (len(lines) == 1 and len(pts) == 3 and pts[0][0] == 72.0 and
      pts[-1][0] == 776.0 and pts[0][1] < pts[1][1] < pts[2][1] and
      title == 'a <b>')
sys.exit(0 if ok else 1)
PY
  check $? "the SVG parses: one polyline of 3 points, left edge to right edge, falling, title 'a <b>'" ||
    sed 's/^/#   /' "$tmp/out.svg" | head -20
else
  n=$((n + 1)); echo "ok $n # SKIP no python3 to parse the SVG"
fi

"$prog" "$tmp/a.jsonl" >/dev/null 2>&1 && [ -s "$tmp/a.svg" ]
check $? "without -o: a.jsonl makes a.svg"

"$prog" -o "$tmp/two.svg" "$tmp/a.jsonl" "$tmp/b.jsonl" >/dev/null 2>&1 &&
  [ "`grep -c '<polyline' "$tmp/two.svg"`" = 2 ] &&
  grep -q '>b.jsonl</text>' "$tmp/two.svg"
check $? "two logs: two curves, each named in the legend"

printf '%s\n' 'nothing here' >"$tmp/empty.jsonl"
"$prog" "$tmp/empty.jsonl" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -qx "hvd-plot: '$tmp/empty.jsonl' has no {\"step\":N,\"loss\":X} records (a --log-json file?)" "$tmp/out" &&
  [ ! -e "$tmp/empty.svg" ]
check $? "a log without records: exit 1 (got $rc), the reason, no chart" || show "$tmp/out" output

"$prog" "$tmp/missing.jsonl" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && grep -qx "hvd-plot: cannot open '$tmp/missing.jsonl': No such file or directory" "$tmp/out"
check $? "a missing log: exit 1 (got $rc) and the reason" || show "$tmp/out" output

"$prog" >/dev/null 2>&1
a=$?
"$prog" --bogus x >"$tmp/out" 2>&1
b=$?
[ $a = 2 ] && [ $b = 2 ] && grep -qx "hvd-plot: unknown option '--bogus' (try --help)" "$tmp/out"
check $? "no log, a bad option: exit 2 ($a, $b)" || show "$tmp/out" output
printf '%s\n' '{"step":1,"loss":4.3342107574032394}' \
  '{"step":2,"loss":4.3342107574032398}' >"$tmp/ulp.jsonl"
low=`printf '\342\226\201'` # the lowest bar, U+2581
timeout 20 "$prog" -o "$tmp/ulp.svg" "$tmp/ulp.jsonl" >"$tmp/out" 2>&1
rc=$?
ticks=`grep -c '<line' "$tmp/ulp.svg" 2>/dev/null`
[ $rc = 0 ] && [ "$ticks" -ge 4 ] && [ "$ticks" -le 30 ] &&
  grep -q "^$tmp/ulp.jsonl: 2 steps, .*  $low$low\$" "$tmp/out"
check $? "losses 4 ulps apart: exit $rc, $ticks lines, a flat sparkline" ||
  show "$tmp/out" output
rm -f "$tmp"/ulp.svg*

printf '%s\n' '{"step":1,"loss":2}' '{"step":2,"loss":1e308}' >"$tmp/big.jsonl"
"$prog" -o "$tmp/big.svg" "$tmp/big.jsonl" >"$tmp/out" 2>&1
rc=$?
[ $rc = 1 ] && [ ! -e "$tmp/big.svg" ] &&
  grep -qx "hvd-plot: '$tmp/big.jsonl' line 2: step 2, loss 1e+308: beyond the 1e+300 that a chart can scale" "$tmp/out"
check $? "a loss of 1e308: exit 1 (got $rc), its line named, no chart" ||
  show "$tmp/out" output

{
  echo '{"step":1,"loss":2.5}'
  printf '{"step":2,"note":"'
  i=0
  while [ $i -lt 100 ]; do
    printf '%s' 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy'
    i=$((i + 1))
  done
  echo '","loss":2.0}'
  echo '{"step":3,"loss":1.5}'
} >"$tmp/long.jsonl"
"$prog" -o "$tmp/long.svg" "$tmp/long.jsonl" >"$tmp/out" 2>&1
grep -q "^$tmp/long.jsonl: 3 steps, loss 2.5 at step 1 to 1.5 at step 3 " "$tmp/out"
check $? "a record of 5 KB is one of 3 records" || show "$tmp/out" output
exit $failed
