#!/bin/sh
# bert_learns.sh - examples/bert_train's default run (tiny preset,
# synthetic data, 1000 steps) learns at one rank: the mean loss of its last
# 5 steps is at least 20 % below that of its first 5, and rank 0 prints the
# summary. A long test (14 s of a 2-core machine; make check-long): make
# check's t/mpi/bert_train.sh runs the same default at np 2, the README's
# main job.
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
need_bert_train
prog=$HVD_TOP_BUILDDIR/examples/bert_train
make_tmp bert_learns
echo "1..3"
run_np 1 "$tmp/out" "$tmp/err" "$prog" --log-json "$tmp/log.json"
check $rc "default run at np=1 exits 0" || { show "$tmp/out" stdout; show "$tmp/err" stderr; }
loss_falls "$tmp/log.json" 1
check $? "default run at np=1: the loss falls"
grep -q "^done .*final loss .*tokens/s .*world size 1  *preset tiny" "$tmp/out"
check $? "default run at np=1: rank 0 prints the summary" || show "$tmp/out" stdout
exit $failed
