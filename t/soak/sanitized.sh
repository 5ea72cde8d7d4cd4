# sanitized.sh - sourced by leaks.sh and races.sh: the soak's shorter run
# under a sanitizer. sanitized_soak OPS PATTERN REPORT runs OPS
# collectives (a checkpoint every 250) at np 4 and checks two things:
# every check of the soak passes, and no line matches PATTERN (the
# sanitizer's report; "REPORT" says what its absence means) with exit 0.
sanitized_soak() {
  echo "1..2"
  hvd_mpirun 4 "$prog" --ops "$1" --checkpoint-every 250 >"$tmp/out" 2>&1
  rc=$?
  ! grep -q '^not ok' "$tmp/out" && grep -q '^ok ' "$tmp/out"
  check $? "$1 collectives at np 4: every check of the soak passes (exit $rc)" ||
    show "$tmp/out" output
  ! grep -q "$2" "$tmp/out" && [ $rc = 0 ]
  check $? "$3" || show "$tmp/out" output
  exit $failed
}
