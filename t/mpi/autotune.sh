#!/bin/sh
# autotune.sh - HVD_AUTOTUNE on a small model (TAP): bert_train tiny at np
# 2, whose bursts of allreduces are under 1 MiB, 400 steps with
# HVD_AUTOTUNE=1 and HVD_AUTOTUNE_LOG: rank 0 says at info level that
# samples join bursts, the log has a header and one row per sample, each
# of at least 1 MiB, through the search and the final comparison, and the
# tuner finishes ("autotune done after 68 samples"; the log's last row
# final-tuned or final-defaults); the losses are those of the run without
# autotune to 1e-6 (tuning changes chunking and fusion, which may change
# the order of the sums). The defaults it compares with are the untuned
# run's: with HVD_CHUNK_SIZE unset, the 8 verify-default rows say chunk
# 0 (the executor's default), and a final-defaults row too.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/bert_train
need_bert_train
make_tmp autotune
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-120}
export HVD_TEST_TIMEOUT

echo "1..5"
HVD_AUTOTUNE=1 HVD_AUTOTUNE_LOG=$tmp/at.csv HVD_LOG_LEVEL=info
export HVD_AUTOTUNE HVD_AUTOTUNE_LOG HVD_LOG_LEVEL
run_np 2 "$tmp/out" "$tmp/err" "$prog" --steps 400 --quiet --log-json "$tmp/tuned.json"
unset HVD_AUTOTUNE HVD_AUTOTUNE_LOG HVD_LOG_LEVEL
[ $rc = 0 ] &&
  grep -q "^\[hvd 0\] info: autotune: bursts of allreduces under 1048576 bytes (this one: [0-9]*): each sample joins consecutive bursts until it has 1048576 bytes$" "$tmp/err"
check $? "tiny's small bursts: said once at info level (exit $rc)" ||
  { show "$tmp/out" stdout; show "$tmp/err" stderr; }
[ "`head -n 1 "$tmp/at.csv"`" = "sample,phase,chunk_bytes,fusion_threshold,cycle_us,bytes,seconds,gb_per_s" ] &&
  awk -F, 'NR > 1 && $2 != "final-tuned" && $2 != "final-defaults" {
             n++; if ($6 < 1048576) bad++ }
           END { exit !(n == 68 && bad == 0) }' "$tmp/at.csv"
check $? "the log: 68 samples (search and comparison), each of at least 1 MiB" ||
  sed 's/^/#   /' "$tmp/at.csv" | head -10
grep -q "^\[hvd 0\] info: autotune done after 68 samples: chunk [0-9]*, fusion [0-9]*, cycle [0-9]* us" "$tmp/err" &&
  tail -n 1 "$tmp/at.csv" | grep -Eq '^68,final-(tuned|defaults),'
check $? "the tuner finished: its choice on rank 0's log and the last row" ||
  { show "$tmp/err" stderr; tail -3 "$tmp/at.csv" | sed 's/^/#   /'; }
awk -F, '$2 == "verify-default" { n++; if ($3 != 0) bad++ }
         $2 == "final-defaults" && $3 != 0 { bad++ }
         END { exit !(n == 8 && bad == 0) }' "$tmp/at.csv"
check $? "the defaults it compares with: chunk 0, as untuned (8 verify-default rows)" ||
  grep -e -default "$tmp/at.csv" | sed 's/^/#   /'
run_np 2 "$tmp/out2" "$tmp/err2" "$prog" --steps 400 --quiet --log-json "$tmp/plain.json"
[ $rc = 0 ] && losses_agree "$tmp/plain.json" "$tmp/tuned.json" 1e-6
check $? "the losses of the run without autotune, to 1e-6"
exit $failed
