#!/bin/sh
# slurm.sh - hvd under a real Slurm (slurmctld, slurmd, munge: Debian's
# slurm-wlm) on the network-namespace hosts of t/util/cluster.sh, started
# by t/util/slurm.sh: slurmctld on node1, slurmd on node1, node2 and
# node3 (2 CPUs each, so -N 2 -n 4 is 2 tasks on each of node1 and
# node2). Needs root and slurm-wlm and munge; skipped with the reason
# otherwise.
#
#  1. The cluster comes up: every node idle (the time it took is logged).
#  2. salloc -N 2 -n 4 hvdrun t/mpi/slurm_ranks: hvdrun takes the
#     allocation by itself (its line "hvdrun: Slurm job J: 2 nodes
#     (node[1-2]), 4 tasks: -H node1:2,node2:2"); each rank's rank, size,
#     local_rank, local_size and host are exactly those of 2 x 2; mpirun
#     starts its remote daemon through srun (no launch agent is given).
#     -np 5 in the same allocation: exit 2 and its one line.
#  3. sbatch -N 2 -n 4 --wait of a script that runs hvdrun
#     t/mpi/cluster_check (topology from the real host names, allreduce
#     bursts exact on every path) and hvdrun t/mpi/collectives (every
#     collective exact): both exit 0 and all their checks pass; and
#     every TCP connect of the collectives run (Open MPI's
#     btl_base_verbose lines) goes from node1 to node2, each of node1's
#     two ranks to each of node2's (hvd_init's preconnect).
#  4. Direct launch without mpirun: srun --mpi=pmix -N 2 -n 4
#     t/mpi/slurm_ranks gives the same exact lines as 2; hvd-info under
#     srun shows each task's job line. (srun --mpi=pmi2 cannot start an
#     Open MPI program with Debian's packages: doc/slurm.md; its first
#     error line is logged.)
#  5. scancel of a running job (slurm_ranks --loop on 2 x 2: every rank
#     in an allreduce loop), started by sbatch through hvdrun and through
#     srun --mpi=pmix: every process of the job (the batch shell, hvdrun,
#     mpirun, orted, srun, slurmstepd, the ranks) is gone within 10 s of
#     scancel (KillWait=2: SIGKILL 2 s after SIGTERM), and Slurm records
#     the job CANCELLED.
#  5b. sbatch --requeue of bert_train resuming from its newest checkpoint
#     (doc/slurm.md's script): once step-000020.ckpt exists, scontrol
#     requeue; the job starts again (SLURM_RESTART_COUNT 1; cred_expire=10
#     lets it start 10 s later), bert_train says "resumed at step N", goes
#     on to step 60 and the job ends COMPLETED. Needs bert_train.
#  6. Elastic in an allocation: salloc -N 3 -n 3 hvdrun --max-restarts 1
#     --min-np 2 bert_train --elastic; node3's link taken down mid-run:
#     hvdrun names node3, relaunches on node1 and node2, bert_train
#     restores its newest commit and trains to the end (exit 0); no rank,
#     orted, mpirun, hvdrun or srun left (node3's slurmstepd may wait for
#     its controller a while: Slurm's, not hvd's). Needs bert_train.
#  7. After each job of 2-5 no process but the daemons (slurmctld,
#     slurmscriptd, slurmd) is left on any host (within 5 s), and
#     slurm_down leaves no process and no namespace.
# Every command runs under a timeout (HVD_TEST_TIMEOUT, default 120 s).

. "${HVD_TOP_SRCDIR:?run me from make check}/t/util/testlib.sh"
. "$HVD_TOP_SRCDIR/t/util/cluster.sh"
. "$HVD_TOP_SRCDIR/t/util/slurm.sh"

ranks="$HVD_TOP_BUILDDIR/t/mpi/slurm_ranks"
need_prog "$ranks"
need_prog "$HVD_TOP_BUILDDIR/t/mpi/cluster_check"
need_prog "$HVD_TOP_BUILDDIR/t/mpi/collectives"
why=$(slurm_why_not) || skip_all "no Slurm test cluster here: $why"

make_tmp hvd-slurm
chmod 755 "$tmp"
trap 'slurm_down; rm -rf "$tmp"' 0
trap 'exit 1' INT TERM
unset HVD_HOSTNAME SLURM_JOB_ID SLURM_JOBID SLURM_JOB_NODELIST \
  SLURM_NODELIST SLURM_TASKS_PER_NODE
limit=${HVD_TEST_TIMEOUT:-120}
hvdrun="$HVD_TOP_BUILDDIR/bin/hvdrun"
cd "$tmp" || exit 1

# ---- 1. the cluster -----------------------------------------------------------
slurm_up 3 || {
  echo "Bail out! cannot start the Slurm test cluster (see stderr)"
  exit 1
}
echo "# the Slurm cluster (3 hosts, munged, slurmctld, 3 slurmd) was up and idle in $slurm_start_s s"
check 0 "Slurm: node1, node2 and node3 idle ($slurm_start_s s)"

# on1 OUT ERR CMD...: CMD on node1 under the timeout; sets rc.
on1() {
  o=$1
  e=$2
  shift 2
  slurm_on node1 timeout -k 5 "$limit" "$@" >"$o" 2>"$e" </dev/null
  rc=$?
}

# job_pids: the processes on the hosts but the daemons (slurmctld, its
# slurmscriptd, slurmd), in left.
job_pids() {
  left=
  for p in $(cluster_pids); do
    case $(cat "/proc/$p/comm" 2>/dev/null) in
      slurmctld | slurmscriptd | slurmd | "") ;;
      *) left="$left $p" ;;
    esac
  done
}

# strays LABEL: no process left on any host but the daemons, within 5 s
# of the command's end (a step's slurmstepd may be ending as srun
# returns: a zombie until slurmd reaps it).
strays() {
  i=0
  job_pids
  while [ -n "$left" ] && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
    job_pids
  done
  [ -z "$left" ] || ps -o pid,args -p $left | sed 's/^/# /'
  check $([ -z "$left" ]; echo $?) "$1: no process left on any host but the daemons (within 5 s)"
}

cat >"$tmp/want" <<'EOF'
rank 0 size 4 local_rank 0 local_size 2 host node1
rank 1 size 4 local_rank 1 local_size 2 host node1
rank 2 size 4 local_rank 0 local_size 2 host node2
rank 3 size 4 local_rank 1 local_size 2 host node2
EOF

# same_ranks LABEL OUT: OUT's lines, sorted, are exactly $tmp/want.
same_ranks() {
  sort "$2" >"$tmp/got"
  check $(cmp -s "$tmp/want" "$tmp/got"; echo $?) \
    "$1: rank, size, local_rank, local_size, host of 2 x 2, exactly" || {
    show "$2" output
    show "$tmp/want" expected
  }
}

# ---- 2. salloc + hvdrun ---------------------------------------------------------
on1 "$tmp/a.out" "$tmp/a.err" salloc -N 2 -n 4 "$hvdrun" "$ranks"
check $([ $rc = 0 ]; echo $?) "salloc -N 2 -n 4 hvdrun slurm_ranks: exit 0 (status $rc)" ||
  show "$tmp/a.err" stderr
same_ranks "salloc + hvdrun" "$tmp/a.out"
check $(grep -Eqx 'hvdrun: Slurm job [0-9]+: 2 nodes \(node\[1-2\]\), 4 tasks: -H node1:2,node2:2' "$tmp/a.err"; echo $?) \
  "salloc + hvdrun: 'hvdrun: Slurm job J: 2 nodes (node[1-2]), 4 tasks: -H node1:2,node2:2'" ||
  show "$tmp/a.err" stderr
strays "salloc + hvdrun"

on1 "$tmp/a5.out" "$tmp/a5.err" salloc -N 2 -n 4 "$hvdrun" -np 5 "$ranks"
check $([ $rc = 2 ] && [ ! -s "$tmp/a5.out" ] &&
  grep -Eqx 'hvdrun: -np 5 is more than the 4 tasks of Slurm job [0-9]+ \(node\[1-2\], tasks per node 2\(x2\)\); ask salloc or sbatch for more \(-n\), or give fewer ranks' "$tmp/a5.err"; echo $?) \
  "salloc -N 2 -n 4 hvdrun -np 5: exit 2, the one line (status $rc)" ||
  show "$tmp/a5.err" stderr

# ---- 3. sbatch: every collective, the topology ------------------------------------
cat >"$tmp/job.sh" <<EOF
#!/bin/sh
"$hvdrun" "$HVD_TOP_BUILDDIR/t/mpi/cluster_check" >"$tmp/check.out" 2>"$tmp/check.err"
echo \$? >"$tmp/check.rc"
OMPI_MCA_btl_base_verbose=30 "$hvdrun" "$HVD_TOP_BUILDDIR/t/mpi/collectives" >"$tmp/coll.out" 2>"$tmp/coll.err"
echo \$? >"$tmp/coll.rc"
EOF
on1 "$tmp/sb.out" "$tmp/sb.err" sbatch -N 2 -n 4 --wait -o "$tmp/job.out" \
  "$tmp/job.sh"
check $([ $rc = 0 ] && [ "$(cat "$tmp/check.rc")" = 0 ] &&
  [ "$(cat "$tmp/coll.rc")" = 0 ]; echo $?) \
  "sbatch -N 2 -n 4 --wait: cluster_check and collectives exit 0 (sbatch $rc, $(cat "$tmp/check.rc" "$tmp/coll.rc" | paste -sd' ' -))" || {
  show "$tmp/sb.err" "sbatch's stderr"
  show "$tmp/check.err" "cluster_check's stderr"
  show "$tmp/coll.err" "collectives' stderr"
}
tap_through "sbatch: cluster_check" "$tmp/check.out"
tap_through "sbatch: collectives" "$tmp/coll.out"
cluster_connects "$tmp/coll.err" >"$tmp/conn.got"
printf 'node1 2\nnode1 2\nnode1 3\nnode1 3\n' >"$tmp/conn.want"
check $(cmp -s "$tmp/conn.want" "$tmp/conn.got"; echo $?) \
  "sbatch: every TCP connect goes from node1's ranks to node2's, each pair once (hvd_init's preconnect)" ||
  show "$tmp/conn.got" "connects (host, to rank)"
strays "sbatch"

# ---- 4. direct launch: srun --mpi=pmix ---------------------------------------------
on1 "$tmp/s.out" "$tmp/s.err" srun --mpi=pmix -N 2 -n 4 "$ranks"
check $([ $rc = 0 ]; echo $?) "srun --mpi=pmix -N 2 -n 4 slurm_ranks: exit 0 (status $rc)" ||
  show "$tmp/s.err" stderr
same_ranks "srun --mpi=pmix" "$tmp/s.out"
strays "srun --mpi=pmix"

on1 "$tmp/i.out" "$tmp/i.err" srun -N 2 -n 4 "$HVD_TOP_BUILDDIR/bin/hvd-info"
job=$(sed -n 's/^Slurm job: \([0-9]*\),.*/\1/p' "$tmp/i.out" | sort -u)
for r in 0 1 2 3; do
  echo "Slurm job: $job, 2 nodes (node[1-2]), 4 tasks (per node 2(x2)); this task: SLURM_PROCID $r, SLURM_LOCALID $((r % 2))"
done >"$tmp/want.i"
grep '^Slurm' "$tmp/i.out" | sort >"$tmp/got.i"
check $([ $rc = 0 ] && [ -n "$job" ] && cmp -s "$tmp/want.i" "$tmp/got.i"; echo $?) \
  "srun -N 2 -n 4 hvd-info: each task's line, job $job, SLURM_PROCID 0-3" || {
  show "$tmp/got.i" got
  show "$tmp/want.i" expected
}

on1 "$tmp/p2.out" "$tmp/p2.err" srun --mpi=pmi2 -N 1 -n 1 "$ranks"
echo "# srun --mpi=pmi2 (not supported by Debian's Open MPI: doc/slurm.md): status $rc, $(grep -m1 'OMPI was not built' "$tmp/p2.err" || head -n 1 "$tmp/p2.err")"
strays "srun --mpi=pmi2"

# ---- 5. scancel -----------------------------------------------------------------------
# cancel LABEL COMMAND: a batch job of -N 2 -n 4 running COMMAND (which
# starts slurm_ranks --loop on 4 ranks); once every rank loops, scancel;
# then every process of the job gone within 10 s, the job CANCELLED.
cancel() {
  rm -f "$tmp/loop.out"
  on1 "$tmp/c.out" "$tmp/c.err" sbatch --parsable -N 2 -n 4 \
    -o "$tmp/loop.out" --wrap "$2"
  id=$(cut -d';' -f1 "$tmp/c.out")
  i=0
  while [ "$(grep -c ' looping$' "$tmp/loop.out" 2>/dev/null)" != 4 ] &&
    [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  check $([ "$(grep -c ' looping$' "$tmp/loop.out" 2>/dev/null)" = 4 ]; echo $?) \
    "$1: job $id: all 4 ranks running" || { show "$tmp/loop.out" "the job's output"; show "$tmp/c.err" stderr; }
  t0=$(date +%s.%N)
  slurm_on node1 scancel "$id"
  i=0
  while [ $i -lt 300 ]; do
    job_pids
    [ -n "$left" ] || break
    sleep 0.1
    i=$((i + 1))
  done
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "# $1: the last of the job's processes was gone $took s after scancel"
  [ -z "$left" ] || ps -o pid,args -p $left | sed 's/^/# /'
  check $([ -z "$left" ] && between "$took" 0 10; echo $?) \
    "$1: scancel ends every process of the job within 10 s ($took s)"
  i=0 # its processes are gone; Slurm may still be COMPLETING it
  while [ $i -lt 100 ]; do
    state=$(slurm_on node1 scontrol show job "$id" 2>/dev/null |
      sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    [ "$state" = COMPLETING ] || break
    sleep 0.1
    i=$((i + 1))
  done
  check $([ "$state" = CANCELLED ]; echo $?) "$1: job $id is CANCELLED ($state)"
}
cancel "scancel, sbatch + hvdrun" "\"$hvdrun\" \"$ranks\" --loop"
cancel "scancel, sbatch + srun --mpi=pmix" "srun --mpi=pmix \"$ranks\" --loop"

# ---- 5b. sbatch --requeue: bert_train resumes from its newest checkpoint -----
if grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h"; then
  rm -rf "$tmp/rq" "$tmp/rq.out" "$tmp/rq.json"
  mkdir -p "$tmp/rq"
  {
    echo '#!/bin/sh'
    echo '# doc/slurm.md: resume from the newest checkpoint when there is one'
    echo 'resume='
    echo "ls \"$tmp/rq\"/step-*.ckpt >/dev/null 2>&1 && resume=\"--resume $tmp/rq\""
    echo 'echo "start ${SLURM_RESTART_COUNT:-0}"'
    echo "exec \"$hvdrun\" \"$HVD_TOP_BUILDDIR/examples/bert_train\" --steps 60 --quiet --checkpoint \"$tmp/rq\" --checkpoint-every 10 --log-json \"$tmp/rq.json\" \$resume"
  } >"$tmp/rq.sh"
  chmod +x "$tmp/rq.sh"
  on1 "$tmp/rq.sb" "$tmp/rq.err" sbatch --parsable --requeue \
    --open-mode=append -N 2 -n 2 -o "$tmp/rq.out" "$tmp/rq.sh"
  id=$(cut -d';' -f1 "$tmp/rq.sb")
  i=0
  while [ ! -f "$tmp/rq/step-000020.ckpt" ] && [ $i -lt 900 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  slurm_on node1 scontrol requeue "$id"
  i=0
  state=
  while [ $i -lt 900 ]; do
    state=$(slurm_on node1 scontrol show job "$id" 2>/dev/null |
      sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT) break ;; esac
    sleep 0.2
    i=$((i + 1))
  done
  check $([ "$state" = COMPLETED ] && grep -qx 'start 0' "$tmp/rq.out" &&
    grep -qx 'start 1' "$tmp/rq.out"; echo $?) \
    "sbatch --requeue: job $id requeued after step 20 started again and COMPLETED ($state)" ||
    { show "$tmp/rq.out" "the job's output"; show "$tmp/rq.err" stderr; }
  check $(grep -Eq "^bert_train: resumed at step [2-5][0-9] from $tmp/rq/step-0000[2-5]0.ckpt" "$tmp/rq.out" &&
    grep -q '"step":60,' "$tmp/rq.json"; echo $?) \
    "sbatch --requeue: bert_train resumed from its newest checkpoint and trained to step 60" ||
    show "$tmp/rq.out" "the job's output"
  strays "sbatch --requeue"
else
  for what in requeued resumed; do
    n=$((n + 1))
    echo "ok $n # SKIP sbatch --requeue: $what: no bert_train (no CBLAS)"
  done
fi

# ---- 6. elastic: a node lost, the job goes on in the allocation ------------------
# salloc -N 3 -n 3 hvdrun --max-restarts 1 --min-np 2 bert_train --elastic:
# once 3 steps are logged node3's link goes down; hvdrun names node3 (its
# probes share the failed step's CPUs: SLURM_OVERLAP), relaunches on
# node1 and node2 of the allocation, and bert_train trains on from its
# newest commit to the last step.
if grep -q '^#define HVD_HAVE_BLAS 1' "$HVD_TOP_BUILDDIR/config.h"; then
  rm -f "$tmp/e.json"
  (HVD_STALL_CHECK_TIME=2 HVD_STALL_SHUTDOWN_TIME=5 \
    on1 "$tmp/e.out" "$tmp/e.err" salloc -N 3 -n 3 "$hvdrun" --host-timeout 4 \
    --max-restarts 1 --min-np 2 "$HVD_TOP_BUILDDIR/examples/bert_train" \
    --steps 300 --quiet --elastic "$tmp/e.state" --log-json "$tmp/e.json"
  echo "$rc" >"$tmp/e.rc") &
  bg=$!
  i=0
  while [ "$(cat "$tmp/e.json" 2>/dev/null | wc -l)" -lt 3 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  struck=$(date +%s)
  cluster_link node3 down
  wait $bg
  took=$(($(date +%s) - struck))
  cluster_link node3 up
  erc=$(cat "$tmp/e.rc")
  check $([ "$erc" = 0 ] &&
    grep -Eqx 'hvdrun: Slurm job [0-9]+: 3 nodes \(node\[1-3\]\), 3 tasks: -H node1:1,node2:1,node3:1' "$tmp/e.err" &&
    grep -q "^hvdrun: lost contact with host node3 (rank 2)" "$tmp/e.err" &&
    grep -q "^hvdrun: restart 1 of 1 after host node3 was lost: relaunching on 2 ranks (node1:1,node2:1) at " "$tmp/e.err"; echo $?) \
    "elastic in salloc -N 3: node3's link down: relaunched on node1 and node2, exit 0 (status $erc, $took s after)" ||
    { show "$tmp/e.out" stdout; show "$tmp/e.err" stderr; }
  check $(grep -q "^bert_train: restored the state committed after step [0-9]* .*launch 2, the last one had 3 ranks$" "$tmp/e.out" &&
    grep -q '"step":300,' "$tmp/e.json"; echo $?) \
    "elastic in salloc: the relaunch restored its newest commit and trained to step 300" ||
    show "$tmp/e.out" stdout
  sleep 6 # node3's rank, cut off, ends itself (the stall shutdown)
  left=
  for p in $(cluster_pids); do
    case $(cat "/proc/$p/comm" 2>/dev/null) in
      bert_train | orted | mpirun | hvdrun | srun | salloc) left="$left $p" ;;
    esac
  done
  [ -z "$left" ] || ps -o pid,args -p $left | sed 's/^/# /'
  check $([ -z "$left" ]; echo $?) \
    "elastic in salloc: no rank, orted, mpirun, hvdrun or srun left on any host"
else
  for what in relaunch restored strays; do
    n=$((n + 1))
    echo "ok $n # SKIP elastic in salloc: $what: no bert_train (no CBLAS)"
  done
fi

# ---- 7. nothing left ----------------------------------------------------------------
prefix=$cluster_prefix
munged_pid=$slurm_munged_pid
slurm_down
check $([ -z "$(ip netns list | grep "^$prefix-")" ] &&
  ! kill -0 "$munged_pid" 2>/dev/null; echo $?) \
  "slurm_down: no namespace of the cluster left, munged ($munged_pid) gone"

echo "1..$n"
exit $failed
