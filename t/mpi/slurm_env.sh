#!/bin/sh
# slurm_env.sh - hvdrun and hvd-info inside a Slurm job, from the job's
# variables alone (fake SLURM_*; no Slurm daemon): hvdrun --dry-run takes
# the allocation's nodes and tasks when neither -H nor --hostfile is given
# (SLURM_JOB_NODELIST through `scontrol show hostnames`, counts from
# SLURM_TASKS_PER_NODE), says what it found in one line, checks -np
# against the tasks, and refuses variables that do not make sense, each
# with its exact message; hvd-info shows the job. The hvdrun checks need
# scontrol (Debian: slurm-client), given a slurm.conf of the test's own
# (scontrol reads one before it expands a list); skipped without it. The
# real jobs are t/mpi/slurm.sh's.
hvdrun="$HVD_TOP_BUILDDIR/bin/hvdrun"
info="$HVD_TOP_BUILDDIR/bin/hvd-info"
tmp=${TMPDIR:-/tmp}/hvd-slurm-env.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT

n=0
ok() {
  n=$((n + 1))
  if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; fi
  return $1
}
skip() {
  n=$((n + 1))
  echo "ok $n # SKIP $1"
}
show() {
  printf '%s\n' "$out" | sed 's/^/# stdout: /'
  sed 's/^/# stderr: /' "$tmp/err"
}
unset SLURM_JOB_ID SLURM_JOBID SLURM_JOB_NODELIST SLURM_NODELIST \
  SLURM_TASKS_PER_NODE SLURM_JOB_NUM_NODES SLURM_NTASKS SLURM_PROCID \
  SLURM_LOCALID HVD_RUN_NO_CMA HVD_FOO
root=
[ "$(id -u)" != 0 ] ||
  root="OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
mpiexec=$(sed -n 's/^hvd_mpiexec="\(.*\)"$/\1/p' "$hvdrun")
# the keepalive options hvdrun adds for several hosts (--host-timeout 20)
ka="--mca oob_tcp_keepalive_time 10 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 10"

# slurm NODELIST TASKS_PER_NODE HVDRUN_ARGS...: hvdrun --dry-run in job 12
# with those variables (TASKS_PER_NODE "-" leaves it unset); out is its
# stdout without the harness's HVD_* variables (-x HVD_TOP_BUILDDIR ...),
# $tmp/err its stderr, rc its status.
slurm() {
  nodes=$1
  tpn=$2
  shift 2
  if [ "$tpn" = - ]; then
    out=$(env -u LD_LIBRARY_PATH SLURM_CONF="$tmp/slurm.conf" SLURM_JOB_ID=12 \
      SLURM_JOB_NODELIST="$nodes" "$hvdrun" --dry-run "$@" 2>"$tmp/err")
  else
    out=$(env -u LD_LIBRARY_PATH SLURM_CONF="$tmp/slurm.conf" SLURM_JOB_ID=12 \
      SLURM_JOB_NODELIST="$nodes" SLURM_TASKS_PER_NODE="$tpn" \
      "$hvdrun" --dry-run "$@" 2>"$tmp/err")
  fi
  rc=$?
  out=$(printf '%s\n' "$out" | sed 's/ -x HVD_[A-Za-z0-9_]*//g')
}
# err_is TEXT: stderr is exactly that one line
err_is() { [ "$(cat "$tmp/err")" = "$1" ]; }

cat >"$tmp/slurm.conf" <<'EOF'
ClusterName=fake
SlurmctldHost=localhost
NodeName=node[1-2] CPUs=1
PartitionName=p Nodes=ALL
EOF

if ! command -v scontrol >/dev/null 2>&1; then
  i=0
  while [ $i -lt 12 ]; do
    skip "hvdrun in a Slurm job: no scontrol here (Debian: apt-get install slurm-client)"
    i=$((i + 1))
  done
else
  slurm 'node[1-2]' '2(x2)' ./prog
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 4 -H node1:2,node2:2 $ka -x PATH ./prog" ]
  ok $? "salloc -N 2 -n 4: -np 4 -H node1:2,node2:2, keepalive, no --oversubscribe" || show
  err_is "hvdrun: Slurm job 12: 2 nodes (node[1-2]), 4 tasks: -H node1:2,node2:2"
  ok $? "says what it found, one line on stderr" || show

  slurm 'node[1-2],gpu[01-03]' '2(x2),1(x3)' ./prog a
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 7 -H node1:2,node2:2,gpu01:1,gpu02:1,gpu03:1 $ka -x PATH ./prog a" ] &&
    err_is "hvdrun: Slurm job 12: 5 nodes (node[1-2],gpu[01-03]), 7 tasks: -H node1:2,node2:2,gpu01:1,gpu02:1,gpu03:1"
  ok $? "two ranges of names, 2(x2),1(x3): -np 7 over 5 hosts" || show

  slurm 'node7' '1' ./prog
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 1 -H node7:1 -x PATH ./prog" ] &&
    err_is "hvdrun: Slurm job 12: 1 node (node7), 1 task: -H node7:1"
  ok $? "one node, one task: -np 1 -H node7:1, no keepalive" || show

  slurm 'node[1-2]' '2(x2)' -np 3 ./prog
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 3 -H node1:2,node2:2 $ka -x PATH ./prog" ]
  ok $? "-np 3 within 4 tasks: -np 3 -H node1:2,node2:2" || show

  slurm 'node[1-2]' '2(x2)' -np 5 ./prog
  [ $rc = 2 ] && [ -z "$out" ] &&
    err_is "hvdrun: -np 5 is more than the 4 tasks of Slurm job 12 (node[1-2], tasks per node 2(x2)); ask salloc or sbatch for more (-n), or give fewer ranks"
  ok $? "-np 5 over 4 tasks: exit 2, one line ($rc)" || show

  slurm 'node[1-2]' '2(x2)' -np 2 -H a:1,b:1 ./prog
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 2 -H a:1,b:1 $ka -x PATH ./prog" ] &&
    [ ! -s "$tmp/err" ]
  ok $? "-H wins over the allocation, nothing said" || show

  printf 'h1 slots=3\n' >"$tmp/hosts"
  slurm 'node[1-2]' '2(x2)' --hostfile "$tmp/hosts" ./prog
  [ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 3 --hostfile $tmp/hosts -x PATH ./prog" ] &&
    [ ! -s "$tmp/err" ]
  ok $? "--hostfile wins over the allocation" || show

  slurm 'node[1-2]' '2(x2' ./prog
  [ $rc = 2 ] &&
    err_is "hvdrun: Slurm job 12: SLURM_TASKS_PER_NODE '2(x2' is not of the form N or N(xM),..."
  ok $? "SLURM_TASKS_PER_NODE '2(x2': exit 2, one line" || show

  slurm 'node[1-2]' - ./prog
  [ $rc = 2 ] &&
    err_is "hvdrun: Slurm job 12: SLURM_TASKS_PER_NODE is not set; give -H or run inside salloc or sbatch"
  ok $? "no SLURM_TASKS_PER_NODE: exit 2, one line" || show

  slurm 'node[1-3]' '2(x2)' ./prog
  [ $rc = 2 ] &&
    err_is "hvdrun: Slurm job 12: SLURM_TASKS_PER_NODE '2(x2)' gives 2 nodes, SLURM_JOB_NODELIST 'node[1-3]' has 3"
  ok $? "3 nodes, counts for 2: exit 2, one line" || show

  slurm 'node[1-' '1' ./prog
  [ $rc = 2 ] &&
    err_is "hvdrun: Slurm job 12: scontrol show hostnames cannot expand SLURM_JOB_NODELIST 'node[1-'"
  ok $? "a node list cut short, node[1-: exit 2, one line" || show
fi

# SLURM_JOB_ID without a node list (not an allocation): the local cores
out=$(env -u LD_LIBRARY_PATH SLURM_JOB_ID=12 "$hvdrun" --dry-run -np 1 ./prog 2>"$tmp/err")
rc=$?
out=$(printf '%s\n' "$out" | sed 's/ -x HVD_[A-Za-z0-9_]*//g')
[ $rc = 0 ] && [ "$out" = "$root$mpiexec -np 1 -x PATH ./prog" ] && [ ! -s "$tmp/err" ]
ok $? "SLURM_JOB_ID alone: no hosts from Slurm" || show

# ---- hvd-info ----
out=$(SLURM_JOB_ID=12 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='node[1-2]' \
  SLURM_NTASKS=4 SLURM_TASKS_PER_NODE='2(x2)' "$info" 2>"$tmp/err")
[ $? = 0 ] && [ "$(printf '%s\n' "$out" | grep '^Slurm')" = "Slurm job: 12, 2 nodes (node[1-2]), 4 tasks (per node 2(x2))" ]
ok $? "hvd-info in job 12: 'Slurm job: 12, 2 nodes (node[1-2]), 4 tasks (per node 2(x2))'" || show
out=$(SLURM_JOB_ID=7 SLURM_PROCID=3 SLURM_LOCALID=1 "$info" 2>"$tmp/err")
[ "$(printf '%s\n' "$out" | grep '^Slurm')" = "Slurm job: 7, ? nodes (?), ? tasks (per node ?); this task: SLURM_PROCID 3, SLURM_LOCALID 1" ]
ok $? "hvd-info in a step's task: its SLURM_PROCID and SLURM_LOCALID, ? for what is unset" || show
out=$("$info" 2>"$tmp/err")
! printf '%s\n' "$out" | grep -q Slurm
ok $? "hvd-info outside a job: no Slurm line" || show
out=$(SLURM_JOB_ID=12 SLURM_JOB_NODELIST='node[1-2]' SLURM_TASKS_PER_NODE='2(x2)' \
  "$info" --json 2>"$tmp/err")
printf '%s\n' "$out" | grep -qxF '  "slurm": {"SLURM_JOB_ID": "12", "SLURM_JOB_NUM_NODES": null, "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NTASKS": null, "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": null, "SLURM_LOCALID": null},'
ok $? "hvd-info --json: the slurm object" || show
out=$("$info" --json 2>"$tmp/err")
printf '%s\n' "$out" | grep -qxF '  "slurm": null,'
ok $? "hvd-info --json outside a job: \"slurm\": null" || show

echo "1..$n"
