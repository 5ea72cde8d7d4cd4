# sanitized.sh - sourced by leaks.sh and races.sh: the soak's shorter run
# under a sanitizer.
#
# sanitized_start SYMBOL BUILD OPTION TMPNAME skips unless t/soak/soak holds
# SYMBOL (the sanitizer's runtime: "BUILD build", configure's
# --enable-sanitizer=OPTION); then makes $tmp, loads t/mpirun-test's
# hvd_mpirun and turns the soak's resident-memory check off (ASan's
# quarantine keeps freed memory; TSan's shadow and history grow).
sanitized_start() {
  prog=$HVD_TOP_BUILDDIR/t/soak/soak
  sanitized_symbol=$1
  if ! grep -q "$1" "$prog" 2>/dev/null; then
    skip_all "not $2 build (./configure --enable-sanitizer=$3)"
  fi
  make_tmp "$4"
  HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-900}
  export HVD_TEST_TIMEOUT
  HVD_MPIRUN_TEST_LIB=1
  . "$HVD_MPIRUN_TEST"
  unset HVD_LOG_LEVEL
  HVD_SOAK_RSS_SLACK_KIB=off
  export HVD_SOAK_RSS_SLACK_KIB
}

# sanitized_soak OPS PATTERN REPORT runs OPS collectives (a checkpoint
# every 250) at np 4, and OPS / 4 on each of two process sets on threads
# of their own (--sets), and checks two things: every check of the soak
# passes, and no line matches PATTERN (the sanitizer's report; "REPORT"
# says what its absence means) with exit 0. Then the same two for half as
# many on the stand-in's GPUs at np 3 (t/standin/soak --device mixed, with
# NCCL's order rule checked), in a build that has it (CUDA and NCCL);
# skipped otherwise.
sanitized_soak() {
  echo "1..4"
  sanitized_run "$prog" 4 "$1" "$2" "$3" "at np 4"
  dev=$HVD_TOP_BUILDDIR/t/standin/soak
  if grep -q "$sanitized_symbol" "$dev" 2>/dev/null; then
    HVD_STANDIN_NCCL_ORDER=1 sanitized_run "$dev" 3 $(($1 / 2)) "$2" "$3" \
      "at np 3 on the stand-in's GPUs (--device mixed)" --device mixed
  else
    echo "ok 3 # SKIP no t/standin/soak (a build without CUDA or NCCL)"
    echo "ok 4 # SKIP no t/standin/soak (a build without CUDA or NCCL)"
  fi
  exit $failed
}

# sanitized_run PROG NP OPS PATTERN REPORT WHERE [ARGS...]: the two checks.
sanitized_run() {
  p=$1 np=$2 ops=$3 pat=$4 report=$5 where=$6
  shift 6
  hvd_mpirun "$np" "$p" --ops "$ops" --checkpoint-every 250 \
    --sets $((ops / 4)) "$@" >"$tmp/out" 2>&1
  rc=$?
  ! grep -q '^not ok' "$tmp/out" && grep -q '^ok ' "$tmp/out"
  check $? "$ops collectives $where: every check of the soak passes (exit $rc)" ||
    show "$tmp/out" output
  ! grep -q "$pat" "$tmp/out" && [ $rc = 0 ]
  check $? "$report $where" || show "$tmp/out" output
}
