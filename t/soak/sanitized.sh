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
# says what its absence means) with exit 0.
sanitized_soak() {
  echo "1..2"
  hvd_mpirun 4 "$prog" --ops "$1" --checkpoint-every 250 --sets $(($1 / 4)) \
    >"$tmp/out" 2>&1
  rc=$?
  ! grep -q '^not ok' "$tmp/out" && grep -q '^ok ' "$tmp/out"
  check $? "$1 collectives at np 4: every check of the soak passes (exit $rc)" ||
    show "$tmp/out" output
  ! grep -q "$2" "$tmp/out" && [ $rc = 0 ]
  check $? "$3" || show "$tmp/out" output
  exit $failed
}
