# t/util/testlib.sh - functions of hvd's shell tests (t/mpi/*.sh). Source
# it; make check sets HVD_TOP_SRCDIR, HVD_TOP_BUILDDIR, HVD_MPIRUN_TEST:
#
#   . "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
#
#   need_prog PATH         1..0 # SKIP unless PATH is executable
#   need_gpu               1..0 # SKIP unless t/gpu/binding counts a CUDA
#                          device (the reason is its answer)
#   skip_all REASON        1..0 # SKIP REASON, and exit 0
#   make_tmp NAME          tmp: a new directory, removed at exit
#   check STATUS DESC      a TAP line, ok if STATUS is 0; counts n and
#                          sets failed to 1 if not; returns 0 if ok
#   between X LO HI        status 0 if LO <= X <= HI (decimals)
#   show FILE LABEL        "# LABEL:", then FILE as TAP comments
#   losses FILE            the "loss" of every line of a JSON-lines log
#   loss_falls FILE NP     status 0 if the log's last 5 losses average at
#                          least 20 % below its first 5 (NP: for the "# "
#                          line that says both)
#   losses_agree A B TOL [FIRST]
#                          status 0 if log B's losses are log A's from step
#                          FIRST (default 1) on, each to TOL relative, and
#                          B ends where A does; "# " lines say the largest
#                          difference and any step beyond TOL
#   nodes_of K PROG FILE   FILE: an executable wrapper that runs PROG with
#                          HVD_HOSTNAME=node<rank / K>, nodes of K ranks
#                          simulated on one host (Open MPI's rank)
#   soak_passed OUT DESC   a check that the soak (t/soak/soak.c) whose
#                          output is OUT exited with $rc = 0 and passed
#                          every check of its own; if not, its failures,
#                          comments and error lines shown
#   soak_summary OUT       the optimizer soak's (t/soak/optim_soak.c)
#                          summary line in OUT, without its "# "
#   run_np NP OUT ERR PROG [ARGS...]
#                          PROG on NP ranks through t/mpirun-test, its
#                          stdout into OUT and stderr into ERR (OUT again:
#                          both into OUT); sets rc (its status) and
#                          elapsed (whole seconds it took)
#
# A test ends with `echo "1..$n"` (unless it printed its plan first) and
# `exit $failed`.

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"

n=0
failed=0

skip_all() {
  echo "1..0 # SKIP $1"
  exit 0
}

need_prog() {
  [ -x "$1" ] || skip_all "no $1 (run make check)"
}

need_gpu() {
  need_gpu_b=$HVD_TOP_BUILDDIR/t/gpu/binding
  if [ ! -x "$need_gpu_b" ] || [ "`"$need_gpu_b" count | cut -d' ' -f1`" = 0 ]; then
    skip_all "no CUDA device: `"$need_gpu_b" count 2>&1 | cut -d' ' -f2-`"
  fi
}

# examples/bert_train, which a build without a CBLAS leaves out.
need_bert_train() {
  grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h" ||
    skip_all "examples/bert_train is not built: configure found no CBLAS (or --without-blas)"
  need_prog "$HVD_TOP_BUILDDIR/examples/bert_train"
}

make_tmp() {
  tmp=`mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX"` || exit 99
  trap 'rm -rf "$tmp"' 0
}

check() {
  n=$((n + 1))
  if [ "$1" = 0 ]; then
    echo "ok $n - $2"
    return 0
  fi
  echo "not ok $n - $2"
  failed=1
  return 1
}

between() {
  awk -v x="$1" -v lo="$2" -v hi="$3" \
    'BEGIN { exit !(x != "" && x + 0 >= lo + 0 && x + 0 <= hi + 0) }'
}

show() {
  echo "# $2:"
  sed 's/^/#   /' "$1"
}

# tap_through LABEL FILE: FILE's TAP lines (a program run apart, e.g. on
# a test cluster) as checks of ours, described "LABEL: ...", its comments
# and a Bail out! passed on as comments; then that its plan was met.
tap_through() {
  plan=$(sed -n 's/^1\.\.\([0-9][0-9]*\).*/\1/p' "$2")
  seen=0
  while IFS= read -r line; do
    case $line in
      "ok "*) seen=$((seen + 1)); check 0 "$1: ${line#ok * - }" ;;
      "not ok "*) seen=$((seen + 1)); check 1 "$1: ${line#not ok * - }" ;;
      "#"*) echo "$line" ;;
      "Bail out!"*) echo "# $line" ;;
    esac
  done <"$2"
  check $([ -n "$plan" ] && [ "$seen" = "$plan" ]; echo $?) \
    "$1: all ${plan:-?} of its checks ran (saw $seen)"
}

losses() {
  sed -n 's/.*"loss":\([^,}]*\).*/\1/p' "$1"
}

loss_falls() {
  losses "$1" | awk -v np="$2" '
    { l[NR] = $1 }
    END {
      if (NR < 10) { print "# only " NR " steps logged"; exit 1 }
      for (i = 1; i <= 5; i++) { a += l[i]; b += l[NR - 5 + i] }
      a /= 5; b /= 5
      printf "# np=%d: %d steps, mean loss of the first 5 %.4f, last 5 %.4f\n",
        np, NR, a, b
      exit !(b < 0.8 * a)
    }'
}

losses_agree() {
  losses "$1" >"$1.losses"
  losses "$2" >"$2.losses"
  awk -v tol="$3" -v first="${4:-1}" '
    NR == FNR { a[NR] = $1; na = NR; next }
    {
      nb++
      x = a[first + nb - 1]
      if (x == "" || x == 0) { printf "# step %d: %s vs %s\n", first + nb - 1, x, $1; bad = 1; next }
      d = x - $1; if (d < 0) d = -d
      r = d / (x < 0 ? -x : x); if (r > worst) worst = r
      if (r > tol) { printf "# step %d: %s vs %s (relative %.3g)\n", first + nb - 1, x, $1, r; bad = 1 }
    }
    END {
      if (nb == 0 || first + nb - 1 != na) { printf "# %d steps vs %d from step %d\n", na, nb, first; bad = 1 }
      printf "# largest relative difference %.3g over %d steps\n", worst, nb
      exit bad
    }' "$1.losses" "$2.losses"
}

nodes_of() {
  printf '#!/bin/sh\nHVD_HOSTNAME=node$((OMPI_COMM_WORLD_RANK / %d)) exec "%s" "$@"\n' \
    "$1" "$2" >"$3" && chmod +x "$3"
}

soak_passed() {
  ! grep -q '^not ok' "$1" && grep -q '^ok ' "$1" && [ "$rc" = 0 ]
  check $? "$2" || {
    grep '^not ok\|^#\|Bail\|rror\|stand-in\|NCCL' "$1" | head -40 >"$1.why"
    show "$1.why" output
  }
}

soak_summary() {
  sed -n 's/^# \([0-9]* configurations: .*\)/\1/p' "$1"
}

run_np() {
  run_np_np=$1
  run_np_out=$2
  run_np_err=$3
  shift 3
  run_np_start=`date +%s`
  if [ "$run_np_err" = "$run_np_out" ]; then
    "$HVD_MPIRUN_TEST" --np "$run_np_np" "$@" >"$run_np_out" 2>&1
  else
    "$HVD_MPIRUN_TEST" --np "$run_np_np" "$@" >"$run_np_out" 2>"$run_np_err"
  fi
  rc=$?
  elapsed=$((`date +%s` - run_np_start))
}

# show_run NAME: run NAME's $tmp/NAME.out and .err as TAP comments.
show_run() {
  for f in "$tmp/$1.out" "$tmp/$1.err"; do
    [ -f "$f" ] && sed 's/^/#   /' "$f"
  done
}

# train NAME NP ARGS...: $prog (bert_train) on NP ranks (0: no mpiexec)
# with --log-json $tmp/NAME.json; stdout and stderr in $tmp/NAME.out and
# .err. Returns its exit status.
train() {
  train_name=$1
  train_np=$2
  shift 2
  "$HVD_MPIRUN_TEST" --np "$train_np" "$prog" --log-json "$tmp/$train_name.json" "$@" \
    >"$tmp/$train_name.out" 2>"$tmp/$train_name.err"
}
