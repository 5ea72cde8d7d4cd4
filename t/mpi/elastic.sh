#!/bin/sh
# elastic.sh - elastic training end to end (doc/elastic.md): hvdrun
# --max-restarts relaunching examples/bert_train --elastic after a rank
# dies, on one machine (TAP):
#
#  1. 4 ranks, rank 2 SIGKILLs itself before step 30 of 60 (bert_train's
#     test hook HVD_TEST_KILL_AT):
#     hvdrun names the failure, relaunches on 3 ranks and the job ends with
#     status 0; the program restored the state committed after step 30
#     ("launch 2, the last one had 4 ranks"); the loss log holds steps 1
#     to 60, each once (no step lost: a commit per step); the same job run
#     by hand (killed without a relaunch, then started again at 3 ranks
#     from its state file) has the same losses from step 31 on and the
#     same final parameters, to 1e-6 and bit for bit (the reductions fold
#     in rank order however the gradients were fused: include/hvd.h,
#     "Reproducibility"); the time from the last step before
#     the failure to the first after it is reported (a TAP comment);
#  2. more failures than --max-restarts: the job ends with the status of
#     the last one and one line listing every failure;
#  3. fewer ranks left than --min-np: the job ends, saying so;
#  4. a program's own failure (exit status 1) is not relaunched;
#  5. rank 0 killed during a save (t/mpi/crash_rename.so at the state
#     file's rename, in the 4th save): the relaunched job restores the
#     previous commit (step 3) and completes;
#  6. --host-discovery-script: the relaunch takes the hosts the script
#     prints; a script that prints none ends the job; SIGTERM to hvdrun
#     while the script runs: no relaunch;
#  7. bad arguments: exit 2 with the reason; a malformed HVD_TEST_KILL_AT
#     too, and --kill-at is no option of bert_train.

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
prog=$HVD_TOP_BUILDDIR/examples/bert_train
hvdrun=$HVD_TOP_BUILDDIR/bin/hvdrun
shim=$HVD_TOP_BUILDDIR/t/mpi/.libs/crash_rename.so
need_bert_train
need_prog "$hvdrun"
command -v python3 >/dev/null 2>&1 || skip_all "no python3 (to read the checkpoints)"
make_tmp elastic
HVD_TEST_TIMEOUT=${HVD_TEST_TIMEOUT:-120}
export HVD_TEST_TIMEOUT
run_no_cma=${HVD_RUN_NO_CMA-1}
unset HVD_TEST_CRASH_RENAME HVD_ELASTIC_RESTARTS HVD_ELASTIC_PREVIOUS_SIZE \
  HVD_TEST_KILL_AT HVD_TEST_KILL_LAUNCHES

# job NAME ARGS...: hvdrun ARGS under the suite's timeout; stdout in
# $tmp/NAME.out, stderr in $tmp/NAME.err, the status in rc.
job() {
  job_name=$1
  shift
  (
    HVD_MPIRUN_TEST_LIB=1 . "$HVD_MPIRUN_TEST"
    HVD_RUN_NO_CMA=$run_no_cma
    export HVD_RUN_NO_CMA
    hvd_mpirun 0 "$hvdrun" "$@"
  ) >"$tmp/$job_name.out" 2>"$tmp/$job_name.err"
  rc=$?
}
# killed_job STEP:RANK LAUNCHES NAME ARGS...: job NAME ARGS with
# bert_train's test hook set: rank RANK SIGKILLs itself before step STEP in
# the first LAUNCHES launches (hvdrun forwards HVD_* to every rank).
killed_job() {
  HVD_TEST_KILL_AT=$1 HVD_TEST_KILL_LAUNCHES=$2
  export HVD_TEST_KILL_AT HVD_TEST_KILL_LAUNCHES
  shift 2
  job "$@"
  unset HVD_TEST_KILL_AT HVD_TEST_KILL_LAUNCHES
}
explain() {
  show "$tmp/$1.out" "$1: stdout"
  show "$tmp/$1.err" "$1: stderr"
}
host=`hostname`
tiny="--preset tiny --quiet"

# maxdiff A B: the largest relative difference between the float32
# parameters of two checkpoint files (doc/checkpoint-format.md).
maxdiff() {
  python3 - "$1" "$2" <<'PY'
import struct, sys
def params(path):
    b = open(path, 'rb').read()
    ver, count = struct.unpack_from('<II', b, 8)
    at = 32
    has_opt, = struct.unpack_from('<I', b, at); at += 4
    ns = 0
    def s(at):
        n, = struct.unpack_from('<I', b, at)
        return b[at + 4:at + 4 + n].decode(), at + 4 + n
    if has_opt:
        _, at = s(at); at += 16
        ns, = struct.unpack_from('<I', b, at); at += 4
        for _ in range(ns):
            _, at = s(at)
    if ver == 2:
        nc, = struct.unpack_from('<I', b, at); at += 4
        for _ in range(nc):
            _, at = s(at); at += 8
    out = {}
    for _ in range(count):
        name, at = s(at)
        dtype, ndim = struct.unpack_from('<II', b, at); at += 8
        shape = struct.unpack_from('<%dq' % ndim, b, at); at += 8 * ndim
        n = 1
        for d in shape:
            n *= d
        assert dtype == 6, name
        out[name] = struct.unpack_from('<%df' % n, b, at)
        at += 4 * n * (1 + ns)
    return out
a, b = params(sys.argv[1]), params(sys.argv[2])
assert a.keys() == b.keys()
top = max(abs(x) for v in a.values() for x in v)
print('%.3g' % max(abs(x - y) / top for k in a for x, y in zip(a[k], b[k])))
PY
}

echo "1..19"

# ---- 1. a rank killed at step 30 of 60 --------------------------------------
# Fused as by default: which gradients fuse depends on timing, but every
# element is folded in rank order whatever the fusion, so the runs agree
# bit for bit (before the reductions were ordered this needed
# HVD_FUSION_THRESHOLD=0).
killed_job 30:2 1 a -np 4 --max-restarts 2 --min-np 2 "$prog" $tiny \
  --steps 60 --elastic "$tmp/a.state" --log-json "$tmp/a.json" \
  --checkpoint "$tmp/a"
[ $rc = 0 ] &&
  grep -q "^hvdrun: rank 2 ($host) was killed by signal 9 (Killed); ranks 0, 1, 3 were stopped$" "$tmp/a.err" &&
  grep -q "^hvdrun: restart 1 of 2 after rank 2 ($host) was killed by signal 9 (Killed): relaunching on 3 ranks at " "$tmp/a.err"
check $? "rank 2 of 4 killed before step 30: hvdrun names it, relaunches on 3 ranks, exit 0 (got $rc)" ||
  explain a
grep -q "^bert_train: restored the state committed after step 30 (epoch 0, sample 960 of its order) from $tmp/a.state; launch 2, the last one had 4 ranks$" "$tmp/a.out" &&
  grep -q "^done  steps 60 (30 in this run, from step 30)  .* world size 3 " "$tmp/a.out"
check $? "the relaunch restores step 30's commit (HVD_ELASTIC_* say launch 2, 4 ranks before) and ends at 3 ranks" ||
  explain a
[ "`losses "$tmp/a.json" | wc -l`" = 60 ] &&
  [ "`sed -n 's/.*"step":\([0-9]*\),.*/\1/p' "$tmp/a.json" | sort -n | uniq | wc -l`" = 60 ]
check $? "the loss log holds steps 1 to 60, each once: no step lost" ||
  sed 's/^/#   /' "$tmp/a.json" | head -5
gap=`python3 -c '
import json, sys
w = {}
for l in open(sys.argv[1]):
    r = json.loads(l); w[r["step"]] = r["wall"]
print("%.2f s (a step before it: %.3f s)" % (w[31] - w[30], w[30] - w[29]))' "$tmp/a.json" 2>/dev/null`
echo "# from the last step before the failure to the first after it: $gap"

# the same by hand: killed without a relaunch, started again at 3 ranks
killed_job 30:2 1 b1 -np 4 "$prog" $tiny --steps 60 --elastic "$tmp/b.state"
b1=$rc
job b2 -np 3 "$prog" $tiny --steps 60 --elastic "$tmp/b.state" \
  --log-json "$tmp/b.json" --checkpoint "$tmp/b"
[ $b1 = 137 ] && [ $rc = 0 ] && losses_agree "$tmp/a.json" "$tmp/b.json" 1e-6 31
check $? "by hand (killed: $b1, then 3 ranks from the state file: $rc): the same losses from step 31 to 1e-6" ||
  { explain b1; explain b2; }
d=`maxdiff "$tmp/a/step-000060.ckpt" "$tmp/b/step-000060.ckpt" 2>&1`
between "$d" 0 1e-6 && cmp -s "$tmp/a/step-000060.ckpt" "$tmp/b/step-000060.ckpt"
check $? "... and the same final parameters (largest difference $d of the largest value; the files bit for bit)"

# ---- 2. more failures than --max-restarts -----------------------------------------
killed_job 5:1 2 more -np 3 --max-restarts 1 "$prog" $tiny --steps 20 \
  --elastic "$tmp/more.state"
killed="rank 1 ($host) was killed by signal 9 (Killed)"
[ $rc = 137 ] &&
  grep -q "^hvdrun: restart 1 of 1 after $killed: relaunching on 2 ranks at " "$tmp/more.err" &&
  grep -q "^hvdrun: giving up after 2 failures (--max-restarts 1): 1) $killed; 2) $killed$" "$tmp/more.err"
check $? "a second failure with --max-restarts 1: exit 137 (got $rc), every failure listed" ||
  explain more

# ---- 3. fewer ranks than --min-np ---------------------------------------------------
killed_job 3:1 1 few -np 2 --max-restarts 3 --min-np 2 "$prog" $tiny \
  --steps 20 --elastic "$tmp/few.state"
[ $rc = 137 ] &&
  grep -q "^hvdrun: giving up: 1 ranks remain, fewer than --min-np 2 (failures: 1) $killed)$" "$tmp/few.err" &&
  ! grep -q "restart 1" "$tmp/few.err"
check $? "--min-np 2 with 1 rank left: no relaunch, exit 137 (got $rc)" ||
  explain few

# ---- 4. the program's own failure -------------------------------------------------
job own -np 2 --max-restarts 3 "$prog" $tiny --steps 5 --data "$tmp/no-such-file"
[ $rc = 1 ] &&
  grep -q "^hvdrun: not relaunching: rank [01] ($host) exited with status 1, which is the program's own failure, not a lost rank or host (failures: 1) rank [01] ($host) exited with status 1)$" "$tmp/own.err" &&
  ! grep -q "restart 1" "$tmp/own.err"
check $? "a rank exiting with status 1 is not relaunched (exit $rc)" || explain own

# ---- 5. killed during a save ---------------------------------------------------------
if [ -f "$shim" ]; then
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
  export ASAN_OPTIONS
  HVD_TEST_CRASH_RENAME=$tmp/save.state HVD_TEST_CRASH_SKIP=3 \
    HVD_TEST_CRASH_LAUNCH=0
  export HVD_TEST_CRASH_RENAME HVD_TEST_CRASH_SKIP HVD_TEST_CRASH_LAUNCH
  job save -np 3 --max-restarts 1 -x LD_PRELOAD="$shim" "$prog" $tiny \
    --steps 10 --elastic "$tmp/save.state" --log-json "$tmp/save.json"
  unset HVD_TEST_CRASH_RENAME HVD_TEST_CRASH_SKIP HVD_TEST_CRASH_LAUNCH
  [ $rc = 0 ] &&
    grep -q "^hvdrun: rank 0 ($host) was killed by signal 9 (Killed)" "$tmp/save.err" &&
    ls "$tmp"/save.state.tmp.* >/dev/null 2>&1
  check $? "rank 0 killed at the rename of its 4th save: relaunched, exit 0 (got $rc), its temporary file left" ||
    explain save
  grep -q "^bert_train: restored the state committed after step 3 (epoch 0, sample 72 of its order) from $tmp/save.state; launch 2, the last one had 3 ranks$" "$tmp/save.out" &&
    grep -q '"step":10,' "$tmp/save.json"
  check $? "... the previous commit (step 3) stayed loadable and the job went on from it to step 10" ||
    explain save
else
  n=$((n + 1)); echo "ok $n # SKIP no shared $shim"
  n=$((n + 1)); echo "ok $n # SKIP no shared $shim"
fi

# ---- 6. a host discovery script --------------------------------------------------
printf '#!/bin/sh\necho localhost:2\n' >"$tmp/disc.sh"
printf '#!/bin/sh\nexit 0\n' >"$tmp/none.sh"
chmod +x "$tmp/disc.sh" "$tmp/none.sh"
killed_job 4:2 1 disc -H localhost:3 --max-restarts 1 \
  --host-discovery-script "$tmp/disc.sh" \
  "$prog" $tiny --steps 12 --elastic "$tmp/disc.state"
[ $rc = 0 ] &&
  grep -q "^hvdrun: restart 1 of 1 after rank 2 ($host) was killed by signal 9 (Killed): relaunching on 2 ranks (localhost:2) at " "$tmp/disc.err" &&
  grep -q "^bert_train: restored the state committed after step 4 .*launch 2, the last one had 3 ranks$" "$tmp/disc.out"
check $? "--host-discovery-script: the relaunch takes the hosts it prints (localhost:2), exit $rc" ||
  explain disc
killed_job 4:1 1 nohost -H localhost:2 --max-restarts 1 \
  --host-discovery-script "$tmp/none.sh" \
  "$prog" $tiny --steps 12 --elastic "$tmp/nohost.state"
[ $rc = 137 ] &&
  grep -q "^hvdrun: giving up: the host discovery script '$tmp/none.sh' found no host (failures: 1) rank 1 ($host) was killed by signal 9 (Killed))$" "$tmp/nohost.err"
check $? "a discovery script that finds no host: the job ends (exit $rc)" ||
  explain nohost
# SIGTERM to hvdrun while the discovery script runs (between launches):
# no relaunch (before, the signal found no mpirun to stop, and the
# relaunched job ran to its end), and hvdrun ends killed by SIGTERM (143),
# not with the failed launch's 137
printf '#!/bin/sh\n: >"%s"\nsleep 4\necho localhost:2\n' "$tmp/planning" \
  >"$tmp/slow.sh"
chmod +x "$tmp/slow.sh"
(
  HVD_RUN_NO_CMA=$run_no_cma HVD_TEST_KILL_AT=4:1 HVD_TEST_KILL_LAUNCHES=1
  export HVD_RUN_NO_CMA HVD_TEST_KILL_AT HVD_TEST_KILL_LAUNCHES
  exec "$hvdrun" -H localhost:2 --max-restarts 1 \
    --host-discovery-script "$tmp/slow.sh" "$prog" $tiny --steps 12 \
    --elastic "$tmp/term.state"
) >"$tmp/term.out" 2>"$tmp/term.err" &
term_pid=$!
( sleep 100 && kill -KILL $term_pid ) 2>/dev/null &
watchdog=$!
i=0
while [ ! -f "$tmp/planning" ] && [ $i -lt 900 ]; do
  sleep 0.1
  i=$((i + 1))
done
kill -TERM $term_pid 2>/dev/null
wait $term_pid
rc=$?
kill $watchdog 2>/dev/null
[ $rc = 143 ] && grep -q "^hvdrun: not relaunching: hvdrun got SIGTERM$" "$tmp/term.err" &&
  ! grep -q "relaunching on" "$tmp/term.err"
check $? "SIGTERM while the discovery script runs: no relaunch, exit $rc" ||
  explain term

# ---- bad arguments ----------------------------------------------------------------
job bad -np 2 --max-restarts x "$prog"
[ $rc = 2 ] && grep -q "^hvdrun: --max-restarts needs a whole number, not 'x'$" "$tmp/bad.err"
check $? "--max-restarts x: exit 2 (got $rc) and the reason" || explain bad
job bad2 -np 2 --min-np 0 "$prog"
[ $rc = 2 ] && grep -q "^hvdrun: --min-np needs at least 1, not '0'$" "$tmp/bad2.err"
check $? "--min-np 0: exit 2 (got $rc) and the reason" || explain bad2

# bert_train's test hook: a malformed value is a usage error, said once
killed_job 30 1 hook -np 2 "$prog" $tiny --steps 5
[ $rc = 2 ] &&
  [ "`grep -c "^bert_train: HVD_TEST_KILL_AT needs STEP:RANK, not '30'$" "$tmp/hook.err"`" = 1 ]
check $? "HVD_TEST_KILL_AT=30: exit 2 (got $rc), the reason once for the job" ||
  explain hook
killed_job x:1 1 hook2 -np 1 "$prog" $tiny --steps 5
[ $rc = 2 ] && grep -q "^bert_train: HVD_TEST_KILL_AT (step) needs an integer from 0 to [0-9]*, not 'x'$" "$tmp/hook2.err"
check $? "HVD_TEST_KILL_AT=x:1: exit 2 (got $rc) and the reason" || explain hook2
killed_job 3:1 0 hook3 -np 1 "$prog" $tiny --steps 5
[ $rc = 2 ] && grep -q "^bert_train: HVD_TEST_KILL_LAUNCHES needs an integer from 1 to 1048576, not '0'$" "$tmp/hook3.err"
check $? "HVD_TEST_KILL_LAUNCHES=0: exit 2 (got $rc) and the reason" || explain hook3
job opt -np 1 "$prog" $tiny --steps 5 --kill-at 3:0
[ $rc = 2 ] && grep -q "^bert_train: unknown option '--kill-at'$" "$tmp/opt.err"
check $? "--kill-at is no option of bert_train: exit 2 (got $rc)" || explain opt

exit $failed
