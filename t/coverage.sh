# t/coverage.sh - build-aux/coverage-report (make coverage) on a fake tree:
# one source compiled into two objects that run different branches counts
# both as run (the merge of libhvd's objects with the stand-in's), the
# line that neither ran is the one listed in its .missed file, a source
# outside lib/ is left out, an exported function that nothing called is
# named (an internal one is not), and a tree without counts is refused.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"

report=$HVD_TOP_SRCDIR/build-aux/coverage-report
cc=${CC:-cc}
command -v python3 >/dev/null 2>&1 || skip_all "no python3"
command -v gcov >/dev/null 2>&1 || skip_all "no gcov"
command -v "$cc" >/dev/null 2>&1 || skip_all "no C compiler"
"$cc" --version 2>/dev/null | grep -qi clang && skip_all "CC is clang (gcov reads gcc's notes)"
make_tmp coverage
echo "1..7"

src=$tmp/src
b=$tmp/build
mkdir -p "$src/lib/core" "$src/other" "$b/lib/core/.libs" "$b/lib/core/standin"
cat >"$src/lib/core/pick.c" <<'EOF'
#include "../../other/side.h"
int hvd_pick(int a) {
  if (a > 5)
    return 3;
  if (a > 0)
    return 1;
  return side(a);
}
int main(int argc, char **argv) {
  (void)argv;
  return hvd_pick(argc - 1) == 9;
}
EOF
cat >"$src/lib/core/never.c" <<'EOF'
int hvd_never(void);
int hvd__never_internal(void);
int hvd_never(void) {
  return 7;
}
int hvd__never_internal(void) {
  return 8;
}
EOF
cat >"$src/other/side.h" <<'EOF'
static inline int side(int a) {
  return a + 2;
}
EOF
# obj DIR: pick.c into DIR/libhvd_la-pick (as libtool names objects)
obj() {
  (cd "$1" && "$cc" -O0 -fprofile-arcs -ftest-coverage -o libhvd_la-pick \
    "$src/lib/core/pick.c" "$src/lib/core/never.c") || exit 99
}
# No counts yet: refused.
obj "$b/lib/core/.libs"
obj "$b/lib/core/standin"
"$report" --out "$tmp/out0" "$b" "$src" >"$tmp/none.out" 2>"$tmp/none.err"
rc=$?
[ $rc = 2 ] && grep -q "^coverage-report: no .gcda under $b/lib: configure with --enable-coverage and run make check first$" "$tmp/none.err"
check $? "no .gcda: status 2 and the reason (got $rc)" || show "$tmp/none.err" stderr

# One object runs pick(0) (side), the other pick(1): line 4 alone not run.
(cd "$b/lib/core/.libs" && ./libhvd_la-pick)
(cd "$b/lib/core/standin" && ./libhvd_la-pick x)
"$report" --out "$tmp/out" "$b" "$src" >"$tmp/report" 2>"$tmp/report.err"
rc=$?
check $rc "the report runs (status $rc)" || show "$tmp/report.err" stderr
row=`grep '^lib/core/pick.c ' "$tmp/report"`
set -- $row
[ "$#" = 5 ] && [ "$4" = "$(awk -v r="$3" -v n="$2" 'BEGIN { printf "%.1f%%", 100 * r / n }')" ] &&
  [ "$5" = 1 ] && [ "$3" = $(($2 - 1)) ]
check $? "pick.c: every line run by one object or the other but one (row: $row)"
printf 'lib/core/pick.c:4-4\n     4      return 3;\n' >"$tmp/want"
cmp -s "$tmp/want" "$tmp/out/lib/core/pick.c.missed"
check $? "pick.c.missed lists line 4 alone, with its text" ||
  show "$tmp/out/lib/core/pick.c.missed" missed
! grep -q 'side.h' "$tmp/report" && grep -q "^total (2 files, 4 objects) " "$tmp/report"
check $? "a header outside lib/ is left out; the total counts 2 files, 4 objects" ||
  show "$tmp/report" report
printf 'exported functions no test called: 1\n  lib/core/never.c hvd_never\n' >"$tmp/want"
sed -n '/^exported functions/,$p' "$tmp/out/SUMMARY" | cmp -s - "$tmp/want"
check $? "hvd_never, exported and not called, is named; hvd__never_internal is not" ||
  show "$tmp/out/SUMMARY" SUMMARY
head -n -1 "$tmp/report" | cmp -s - "$tmp/out/SUMMARY"
check $? "SUMMARY holds the table printed" || show "$tmp/out/SUMMARY" SUMMARY
exit $failed
