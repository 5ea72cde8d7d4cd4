#!/bin/sh
# hvd-bench's --quick self-check (every collective x dtype x op, checked)
# passes at 1-3 ranks and at 32 (oversubscribed: 14 s on 2 cores; the
# scale of doc/scale.md), and its bad-option handling exits 2. list and
# mpi-list on bert-tiny's tensors (--alloc hvd and malloc): every row
# checked ok and the summary line; list without --alloc runs both
# memories (text and --json); mpi-list at 1-4 ranks, and with a
# malformed HVD_* setting that hvd_init would refuse (it never calls it).
# A sweep's closing line; latency's rows, the idle sub-report's too.
# optim with and without the distributed optimizer's hyperparameter check
# (--check-hparams: its header and JSON say which; 2 exits 2), and with
# explicit gradient groups (--num-groups 3: correct, the header and JSON
# say it; -1 exits 2).
. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
make_tmp bench
tiny="$HVD_TOP_SRCDIR/bench/workloads/bert-tiny.tensors"
echo "1..25"
for np in 1 2 3 32; do
  run_np $np "$tmp/out" "$tmp/out" "$HVD_TOP_BUILDDIR/bin/hvd-bench" --quick
  [ $rc = 0 ] && grep -q "all results ok" "$tmp/out"
  check $? "hvd-bench --quick at np=$np" || show "$tmp/out" output
done
run_np 0 /dev/null /dev/null "$HVD_TOP_BUILDDIR/bin/hvd-bench" --no-such-option
[ $rc = 2 ]
check $? "a bad option exits 2 (status $rc)"
# rows ending in " ok", lines WRONG, and the summary's keys
rows_ok() { grep -c ' ok$' "$1"; }
for np in 1 2 3 4; do
  run_np $np "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" mpi-list \
    --tensors "$tiny" --alloc hvd --iters 2 --warmup 1
  [ $rc = 0 ] && [ "`rows_ok "$tmp/out"`" = 6 ] && ! grep -q WRONG "$tmp/out" &&
    grep -Eq '^summary: best=(mpi_allreduce|mpi_iallreduce|pack|bucket) best_ms=[0-9.]+ copy_ms=[0-9.]+ floor_ms=[0-9.]+$' "$tmp/out"
  check $? "mpi-list --alloc hvd at np=$np: 6 rows ok, summary" ||
    { show "$tmp/out" output; show "$tmp/err" stderr; }
done
for alloc in hvd malloc; do
  for np in 2 3; do
    run_np $np "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" list \
      --tensors "$tiny" --alloc $alloc --iters 2 --warmup 1
    [ $rc = 0 ] && [ "`rows_ok "$tmp/out"`" = 2 ] &&
      grep -q "elements, `[ $alloc = hvd ] && echo hvd_alloc_host || echo malloc`); $np ranks" "$tmp/out" &&
      grep -Eq '^summary: hvd_ms=[0-9.]+ copy_ms=[0-9.]+ floor_ms=[0-9.]+ hvd/floor=[0-9.]+$' "$tmp/out"
    check $? "list --alloc $alloc at np=$np: 2 rows ok, summary" ||
      { show "$tmp/out" output; show "$tmp/err" stderr; }
  done
done
# without --alloc: both memories, malloc first, each reported whole; with
# --json one document whose runs are the two
run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" list \
  --tensors "$tiny" --iters 2 --warmup 1
[ $rc = 0 ] && [ "`rows_ok "$tmp/out"`" = 4 ] &&
  [ "`sed -n 's/^# hvd-bench list: .*elements, \([a-z_]*\)); 2 ranks.*/\1/p' "$tmp/out" | tr '\n' ' '`" = "malloc hvd_alloc_host " ] &&
  [ "`grep -Ec '^summary: hvd_ms=[0-9.]+ ' "$tmp/out"`" = 2 ]
check $? "list without --alloc: malloc, then hvd_alloc_host, 4 rows ok" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" list \
  --tensors "$tiny" --iters 2 --warmup 1 --json
[ $rc = 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
allocs = [r["workload"]["alloc"] for r in d["runs"]]
sys.exit(0 if d["mode"] == "list" and allocs == ["malloc", "hvd_alloc_host"] else 1)' "$tmp/out"
check $? "list --json without --alloc: one document, runs malloc and hvd_alloc_host" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
HVD_CYCLE_TIME=banana run_np 2 "$tmp/out" "$tmp/err" \
  "$HVD_TOP_BUILDDIR/bin/hvd-bench" mpi-list --tensors "$tiny" --iters 1
[ $rc = 0 ] && [ "`rows_ok "$tmp/out"`" = 6 ]
check $? "mpi-list never calls hvd_init: HVD_CYCLE_TIME=banana is no matter" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
# a workload by name: the installed ones, or here the source tree's
run_np 1 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" list \
  --tensors bert-tiny --iters 1 --warmup 0
[ $rc = 0 ] && grep -q "^# hvd-bench list: bert-tiny: 42 tensors" "$tmp/out"
check $? "--tensors bert-tiny: the workload found by name" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
run_np 1 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" list \
  --tensors no-such-workload --iters 1
[ $rc != 0 ] && grep -q "^hvd-bench: no-such-workload: No such file or directory (nor is no-such-workload.tensors among the workloads in .*/workloads)$" "$tmp/out" "$tmp/err"
check $? "--tensors with an unknown name: the places looked at (status $rc)" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
# a sweep ends with nccl-tests' average bus bandwidth
run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" sweep \
  --coll allreduce --dtype float32 --op sum --min-bytes 4K --max-bytes 16K --iters 2
[ $rc = 0 ] && grep -Eq "^# Avg bus bandwidth    : [0-9.e+-]+ GB/s \(mean of the [0-9]+ cases' busbw\)$" "$tmp/out"
check $? "sweep: the closing Avg bus bandwidth line" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
# latency's rows all checked, the idle sub-report's row among them
run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" latency \
  --iters 20 --warmup 2 --small-count 10 --small-iters 2
[ $rc = 0 ] && [ "$(rows_ok "$tmp/out")" = 5 ] &&
  grep -Eq '^hvd +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9] +[0-9]+\.[0-9] +ok$' "$tmp/out"
check $? "latency: 5 rows checked ok, the idle row (cpu_ms_per_s, first_us, mpi_first_us)" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
# optim, the check on (the default) and off
for chk in 1 0; do
  run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" optim \
    --tensors "$tiny" --iters 2 --check-hparams $chk --json
  want=`[ $chk = 1 ] && echo true || echo false`
  [ $rc = 0 ] && python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d["mode"] == "optim" and d["correct"] is True and
         d["check_hparams"] is (sys.argv[2] == "true") else 1)' "$tmp/out" "$want"
  check $? "optim --check-hparams $chk: correct, check_hparams $want in the JSON" ||
    { show "$tmp/out" output; show "$tmp/err" stderr; }
done
run_np 0 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" optim \
  --tensors "$tiny" --check-hparams 2
[ $rc = 2 ] && grep -q "^hvd-bench: --check-hparams '2': expected an integer in 0..1" "$tmp/out" "$tmp/err"
check $? "optim --check-hparams 2 exits 2 with the reason (status $rc)" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
# optim with explicit gradient groups
run_np 2 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" optim \
  --tensors "$tiny" --iters 2 --num-groups 3
[ $rc = 0 ] && grep -q "^# hvd-bench optim: .*; num_groups 3; median" "$tmp/out" &&
  ! grep -q WRONG "$tmp/out"
check $? "optim --num-groups 3: correct, said in the header" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
run_np 0 "$tmp/out" "$tmp/err" "$HVD_TOP_BUILDDIR/bin/hvd-bench" optim \
  --tensors "$tiny" --num-groups -1
[ $rc = 2 ] && grep -q "^hvd-bench: --num-groups '-1': expected an integer in 0..1000000" "$tmp/out" "$tmp/err"
check $? "optim --num-groups -1 exits 2 with the reason (status $rc)" ||
  { show "$tmp/out" output; show "$tmp/err" stderr; }
exit $failed
