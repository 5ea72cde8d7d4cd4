# t/layers.sh - libhvd's layers hold (build-aux/check-layers over this
# build's objects and the source tree), and the check itself catches each
# kind of offence: a tiny fake tree with one offence per rule must fail
# exactly that rule, naming the file, the symbol or include, and why.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"

checker=$HVD_TOP_SRCDIR/build-aux/check-layers
command -v nm >/dev/null 2>&1 || skip_all "no nm"
command -v tsort >/dev/null 2>&1 || skip_all "no tsort"
make_tmp layers

# ---- this build ------------------------------------------------------------
"$checker" -b "$HVD_TOP_BUILDDIR" -s "$HVD_TOP_SRCDIR" >"$tmp/real" 2>&1
rc=$?
check $rc "check-layers passes on this build (status $rc)" ||
  show "$tmp/real" "check-layers"
grep -q '^ok 6 - no circle between folders$' "$tmp/real"
check $? "it checked for circles between folders"

# ---- a fake tree: one offence per rule ---------------------------------------
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || {
  echo "1..$n # the fake tree needs a C compiler"
  exit $failed
}
f=$tmp/fake
mkdir -p "$f/lib/base" "$f/lib/ops" "$f/lib/core" "$f/lib/optim" "$f/t/util"
# obj DIR NAME CODE: compiles CODE into DIR/NAME.o (libtool's name shape)
obj() {
  printf '%s\n' "$3" >"$f/$1/$2.c"
  "$cc" -c -I"$f/lib" -o "$f/$1/libhvd_la-$2.o" "$f/$1/$2.c" || exit 99
}
: >"$f/lib/core/engine.h"
: >"$f/lib/core/runtime.h"
printf '/* the interface */\nvoid hvd__exec_run(void);\n' >"$f/lib/ops/executor.h"
printf '/* exports */\nvoid hvd__core_export(void);\n' >"$f/lib/core/api.h"
obj lib/base b 'void hvd__core_private(void);
void hvd__base_fn(void) {}
void hvd__base_up(void) { hvd__core_private(); }'
obj lib/ops o '#include "core/engine.h"
void hvd__exec_run(void) {}
void hvd__ops_private(void) {}'
obj lib/core c 'void hvd__ops_private(void); void hvd__exec_run(void);
void hvd__base_fn(void);
void hvd__core_private(void) { hvd__ops_private(); hvd__exec_run(); }
void hvd__core_export(void) { hvd__base_fn(); }'
obj lib/optim p '#include "core/runtime.h"
void hvd__core_private(void); void hvd__core_export(void);
void hvd__ops_private(void); void hvd__test_only(void);
void hvd__optim_fn(void) {
  hvd__core_private(); hvd__core_export(); hvd__ops_private();
  hvd__test_only();
}'
obj t/util u 'void hvd__test_only(void) {}
int rename(const char *a, const char *b) { (void)a; (void)b; return 0; }'
obj lib/optim q 'int rename(const char *a, const char *b);
int hvd__optim_renames(void) { return rename("a", "b"); }'

"$checker" -b "$f" -s "$f" >"$tmp/fake.out" 2>&1
rc=$?
check $((rc != 1)) "check-layers fails on the fake tree (status $rc, want 1)" ||
  show "$tmp/fake.out" "check-layers"
cat >"$tmp/want" <<'EOF'
not ok 1 - no file of lib/ uses a symbol of a layer above its own
# lib/base/b.o uses hvd__core_private of lib/core/c.o (lib/core is above lib/base)
not ok 2 - lib/core uses lib/ops only through ops/executor.h
# lib/core/c.o uses hvd__ops_private of lib/ops/o.o (not in ops/executor.h)
not ok 3 - lib/optim uses only the public API, lib/base and core/api.h
# lib/optim/p.o uses hvd__core_private of lib/core/c.o (not public, not in core/api.h)
# lib/optim/p.o uses hvd__ops_private of lib/ops/o.o (lib/optim may not use lib/ops)
not ok 4 - nothing in lib/ uses a symbol that only t/ defines
# lib/optim/p.o uses hvd__test_only of t/util/u.o
not ok 5 - #include lines follow the layers
# lib/ops/o.c:1: #include "core/engine.h" (core is above ops)
# lib/optim/p.c:1: #include "core/runtime.h" (optim includes only core/api.h of core)
not ok 6 - no circle between folders
EOF
sed -n '/^not ok 6/q; p' "$tmp/fake.out" >"$tmp/got"
echo 'not ok 6 - no circle between folders' >>"$tmp/got"
grep -q '^not ok 6 - no circle between folders$' "$tmp/fake.out" ||
  echo '(rule 6 did not fail)' >>"$tmp/got"
diff "$tmp/want" "$tmp/got" >"$tmp/diff"
check $? "each rule fails with exactly its offences (allowed uses and the rename stand-in pass)" ||
  show "$tmp/diff" "want vs got"
grep -q 'tsort: .*loop' "$tmp/fake.out"
check $? "the circle lib/base -> lib/core -> lib/base is reported by tsort" ||
  show "$tmp/fake.out" "check-layers"

# ---- no objects: a clear refusal ----------------------------------------------
"$checker" -b "$tmp/nothing" -s "$f" >"$tmp/none.out" 2>&1
rc=$?
check $((rc != 2)) "no objects: status $rc, want 2"
grep -q '^check-layers: no objects of lib/base under .* (build first)$' "$tmp/none.out"
check $? "no objects: says to build first" || show "$tmp/none.out" "output"

echo "1..$n"
exit $failed
