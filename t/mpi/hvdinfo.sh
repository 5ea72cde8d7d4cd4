#!/bin/sh
# hvd-info: the version, the backends, and every HVD_* variable of the
# HVD__SETTINGS list in lib/base/settings.h with the environment's value
# when set and its default otherwise; --json is valid JSON; --build prints
# the backends only. No mpirun needed.
info="$HVD_TOP_BUILDDIR/bin/hvd-info"
settings_h="$HVD_TOP_SRCDIR/lib/base/settings.h"

n=0
ok() {
  n=$((n + 1))
  if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
  return $1
}
has() { printf '%s\n' "$out" | grep -q -e "$1"; }
show() { printf '%s\n' "$out" | sed 's/^/# /'; }

# The list's rows, "NAME DEFAULT", read from the source.
rows=$(sed -n 's/^ *X(\(HVD_[A-Z0-9_]*\), "\([^"]*\)",.*/\1 \2/p' "$settings_h")
names=$(printf '%s\n' "$rows" | cut -d' ' -f1)
[ -n "$names" ]
ok $? "the list in settings.h has $(printf '%s\n' "$names" | wc -l) rows"

# Clear every variable of the table, then set two of them.
for v in $names; do unset "$v"; done
HVD_CYCLE_TIME=3
HVD_TIMELINE=/tmp/tl.json
export HVD_CYCLE_TIME HVD_TIMELINE

out=$("$info" 2>&1)
ok $? "hvd-info exits 0" || show
version=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"/\1/p' "$HVD_TOP_BUILDDIR/config.h")
has "^hvd $version\$"
ok $? "version line: hvd $version" || show
has '^  MPI: yes' && has '^  CUDA: \(no\|yes, runtime [0-9]\)' &&
  has '^  NCCL: \(no\|yes, [0-9]\)' && has '^  cuBLAS: \(yes\|no\)$'
ok $? "backends: MPI, CUDA, NCCL, cuBLAS" || show
if grep -q '^#define HVD_HAVE_CUDA 1' "$HVD_TOP_BUILDDIR/config.h"; then
  has '^  CUDA: yes' && has '^  cuBLAS: yes'
else
  has '^  CUDA: no' && has '^  cuBLAS: no'
fi
ok $? "CUDA and cuBLAS as configured" || show
has '^GPUs visible: [0-9][0-9]*'
ok $? "GPUs visible" || show

# Every row: the environment's value, or the default.
bad=
while read -r name def; do
  case $name in
    HVD_CYCLE_TIME) line="  HVD_CYCLE_TIME=3 (from the environment; default $def)" ;;
    HVD_TIMELINE) line="  HVD_TIMELINE=/tmp/tl.json (from the environment; default $def)" ;;
    *) if [ "$def" = "(unset)" ]; then line="  $name unset (default)"
       else line="  $name=$def (default)"; fi ;;
  esac
  printf '%s\n' "$out" | grep -qxF -e "$line" || bad="$bad $name"
done <<ROWS
$rows
ROWS
[ -z "$bad" ]
ok $? "every HVD_* variable with its value or default${bad:+ (wrong:$bad)}" || show
has '^      milliseconds between negotiation cycles'
ok $? "meanings are printed" || show

# --json
if command -v python3 >/dev/null 2>&1; then
  "$info" --json | python3 -m json.tool >/dev/null
  ok $? "--json is valid JSON (python3 -m json.tool)"
  "$info" --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
names = sys.argv[1].split()
s = {r["name"]: r for r in d["settings"]}
assert [r["name"] for r in d["settings"]] == names, "names"
assert s["HVD_CYCLE_TIME"]["value"] == "3", "HVD_CYCLE_TIME"
assert s["HVD_CYCLE_TIME"]["source"] == "environment"
assert s["HVD_LOG_LEVEL"]["value"] == s["HVD_LOG_LEVEL"]["default"]
assert all(r["meaning"] for r in d["settings"])
assert d["backends"]["mpi"] is True
assert d["version"] == sys.argv[2]
assert isinstance(d["gpus_visible"], int)
' "$names" "$version"
  ok $? "--json: every setting, values, backends, version"
  out=$("$info" --build --json)
  printf '%s\n' "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert list(d) == ["backends"] and d["backends"]["mpi"] is True
'
  ok $? "--build --json: the backends only" || show
else
  n=$((n + 1)); echo "ok $n # SKIP no python3"
  n=$((n + 1)); echo "ok $n # SKIP no python3"
  n=$((n + 1)); echo "ok $n # SKIP no python3"
fi

# --build
out=$("$info" --build 2>&1)
[ $? = 0 ] && [ "$(printf '%s\n' "$out" | cut -d: -f1 | tr '\n' ' ')" = "MPI CUDA NCCL cuBLAS " ]
ok $? "--build: MPI, CUDA, NCCL, cuBLAS lines only" || show

# values hvd_init would refuse: shown with the reason, exit 1; sizes with
# a suffix are good
out=$(HVD_FUSION_THRESHOLD=banana HVD_CYCLE_TIME=-5 "$info" 2>/dev/null)
rc=$?
err=$(HVD_FUSION_THRESHOLD=banana HVD_CYCLE_TIME=-5 "$info" 2>&1 >/dev/null)
[ $rc = 1 ] &&
  has "^  HVD_FUSION_THRESHOLD=banana (from the environment) INVALID: HVD_FUSION_THRESHOLD='banana' is not a size (bytes, or with K, M, G, T); hvd_init() would fail\$" &&
  has "^  HVD_CYCLE_TIME=-5 (from the environment) INVALID: HVD_CYCLE_TIME='-5' is out of range 0..10000; hvd_init() would fail\$" &&
  [ "$err" = "hvd-info: HVD_CYCLE_TIME='-5' is out of range 0..10000 (hvd_init would fail)
hvd-info: HVD_FUSION_THRESHOLD='banana' is not a size (bytes, or with K, M, G, T) (hvd_init would fail)" ]
ok $? "invalid values: each shown with hvd_init's reason, on stderr too, exit 1 (got $rc)" ||
  { show; printf '%s\n' "$err" | sed 's/^/# /'; }
out=$(HVD_FUSION_THRESHOLD=64M HVD_CHUNK_SIZE=256KiB "$info" 2>&1)
rc=$?
[ $rc = 0 ] && has "^  HVD_FUSION_THRESHOLD=64M (from the environment; default 134217728)\$" &&
  ! has INVALID
ok $? "sizes with K, M suffixes are good (exit $rc)" || show
out=$(HVD_FUSION_THRESHHOLD=1 HOROVOD_CYCLE_TIME=2 HOROVOD_STALL_CHECK_TIME_SECONDS=5 HVD_QQQQQQQQQQ=1 \
  HVD_SOAK_OPS=9 HVD_NEGOTIATION_ROUNDS=2 HVD_BLAME_ROUNDS=1 HVD_SHARE_BUILD=x "$info" 2>&1)
rc=$?
[ $rc = 0 ] && has "^not read by hvd:\$" &&
  ! has "HVD_SOAK_OPS" && ! has "HVD_NEGOTIATION_ROUNDS" &&
  ! has "HVD_BLAME_ROUNDS" && ! has "HVD_SHARE_BUILD" &&
  has "^  HVD_FUSION_THRESHHOLD is not an hvd variable: did you mean HVD_FUSION_THRESHOLD?\$" &&
  has "^  HOROVOD_CYCLE_TIME is Horovod's and hvd does not read it: hvd's is HVD_CYCLE_TIME\$" &&
  has "^  HOROVOD_STALL_CHECK_TIME_SECONDS is Horovod's and hvd does not read it: hvd's is HVD_STALL_CHECK_TIME\$" &&
  has "^  HVD_QQQQQQQQQQ is not an hvd variable and is ignored (hvd-info lists them)\$"
ok $? "names hvd does not read: listed with the nearest hvd variable; the tests' and tools' own (HVD_SOAK_*, HVD_NEGOTIATION_*, HVD_BLAME_*, HVD_SHARE_*) are not (exit $rc)" || show

out=$("$info" --bogus 2>&1)
rc=$?
[ $rc = 2 ] && has "^hvd-info: unknown option '--bogus'"
ok $? "an unknown option exits 2" || show

echo "1..$n"
