#!/bin/sh
# t/function-length.sh - no function of lib/, bin/ or examples/ is over 80
# lines (build-aux/check-function-length over the sources git tracks), and
# the check itself catches an offence: a made-up file with an 81-line
# function must be reported exactly, one with an 80-line function (and a
# long table and a long prototype, which are no functions) must pass.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"

checker=$HVD_TOP_SRCDIR/build-aux/check-function-length
make_tmp function-length

# ---- this tree ---------------------------------------------------------------
# (the top of a git checkout: a distribution, even one unpacked inside a
# checkout by make distcheck, has no list of tracked files)
top=`cd "$HVD_TOP_SRCDIR" && git rev-parse --show-toplevel 2>/dev/null`
if [ -n "$top" ] &&
  [ "`cd "$top" && pwd -P`" = "`cd "$HVD_TOP_SRCDIR" && pwd -P`" ]; then
  "$checker" -s "$HVD_TOP_SRCDIR" >"$tmp/real" 2>&1
  rc=$?
  check $rc "no function of lib/, bin/ or examples/ is over 80 lines (status $rc)" ||
    show "$tmp/real" "check-function-length"
else
  n=$((n + 1))
  echo "ok $n # SKIP not the top of a git checkout: no list of tracked sources"
fi

# ---- made-up files -------------------------------------------------------------
# body N: N lines of a function's body
body() {
  i=0
  while [ $i -lt "$1" ]; do
    echo "  x += $i;"
    i=$((i + 1))
  done
}
# The 81-line function has its signature on two lines, its "{" on the
# second; a table and a prototype before it are longer but are no
# functions.
{
  echo '#include <stdio.h>'
  echo 'static const int table[] = {'
  body 100
  echo '};'
  echo 'int declared(int a,'
  echo '             int b);'
  echo ''
  echo 'static int'
  echo 'too_long(int a,'
  echo '         int b) {'
  echo '  int x = a + b;'
  body 80
  echo '}'
} >"$tmp/long.c"
{
  echo 'int just_fits(void) {'
  echo '  int x = 0;'
  body 78
  echo '  return x;'
  echo '}'
} >"$tmp/fits.c"

(cd "$tmp" && "$checker" long.c fits.c) >"$tmp/fake.out" 2>&1
rc=$?
check $((rc != 1)) "an 81-line function fails the check (status $rc, want 1)"
echo 'long.c:108: function too_long is 81 lines (limit 80)' >"$tmp/want"
diff "$tmp/want" "$tmp/fake.out" >"$tmp/diff"
check $? "it is reported exactly, with its file, line, name and length" ||
  show "$tmp/diff" "want vs got"

(cd "$tmp" && "$checker" fits.c) >"$tmp/fits.out" 2>&1
rc=$?
check $rc "an 80-line function passes (status $rc)" ||
  show "$tmp/fits.out" "check-function-length"
check $((`wc -c <"$tmp/fits.out"`)) "and nothing is printed" ||
  show "$tmp/fits.out" "check-function-length"

"$checker" "$tmp/nothing.c" >"$tmp/none.out" 2>&1
rc=$?
check $((rc != 2)) "a file that is not there: status $rc, want 2"

echo "1..$n"
exit $failed
