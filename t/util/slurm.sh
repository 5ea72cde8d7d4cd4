# t/util/slurm.sh - a real Slurm on t/util/cluster.sh's hosts, for tests
# of hvd under a scheduler. Source t/util/cluster.sh first, then this (as
# root); it defines:
#
#   slurm_why_not     prints why no Slurm cluster can be made here (no
#                     test cluster, or no slurmctld, slurmd, munged or
#                     the client commands) and returns 1; returns 0
#                     silently if one can
#   slurm_up N        cluster_up N, then munged, slurmctld on node1 and
#                     slurmd on node1..nodeN; returns once sinfo shows
#                     every node idle (30 s at most), else non-zero with
#                     a message on stderr (and the daemons' logs)
#   slurm_down        stops the daemons (SIGTERM, then SIGKILL after 5 s),
#                     munged, then cluster_down; removes the files
#   slurm_on HOST CMD...  CMD on HOST with this cluster's SLURM_CONF
#                     (cluster_on): salloc, sbatch, srun, sinfo, scancel
#   slurm_log NAME    prints a daemon's log: slurmctld, slurmd.nodeK
#
# and sets slurm_dir (everything it made: slurm.conf, the munge key and
# socket, state, spool and log directories) and slurm_start_s (seconds
# that slurm_up took, with cluster_up; one decimal).
#
# The parts. munged runs on the machine itself, not in a host, with a key
# made for this cluster (1 KiB of /dev/urandom) and its own socket,
# pid, log and seed files under slurm_dir: a socket bound to a path is
# reached from every network namespace, so one munged serves every host,
# as a cluster whose hosts share one key. slurm.conf names it
# (AuthInfo=socket=...). Each host is a NodeName with its address
# (10.78.0.K) and 2 CPUs, so that -N 2 -n 4 is 2 tasks on each
# (SlurmdParameters=config_overrides: slurmd takes them as given, whatever
# the machine has), in one partition "hvd" of all. No cgroup is used:
# ProctrackType=proctrack/linuxproc (a job's processes are found by their
# parents in /proc), TaskPlugin=task/none,
# JobAcctGatherType=jobacct_gather/none; MpiDefault=none; no accounting
# database. But slurmd 22.05 loads a cgroup plugin at start whatever the
# others are, and its "autodetect" fails in a host, whose /sys (made by
# ip netns exec) has nothing mounted on /sys/fs/cgroup ("No filesystem
# mounted on /sys/fs/cgroup", "Unable to initialize cgroup plugin"); a
# cgroup2 mounted there is refused too ("Hybrid mode is not supported"
# on a machine with v1 controllers), so cgroup.conf names cgroup/v1 with
# CgroupAutomount=no, which starts and, with these plugins, is never
# used. KillWait=2: a cancelled job's steps get SIGKILL 2 s after SIGTERM
# (default 30). Each daemon runs as root in its host (slurmd's spool, pid
# and log files per node: %n). PMIx (srun --mpi=pmix): every step's
# slurmstepd makes its clients' directory spmix_appdir_UID_JOB.STEP under
# PMIxCliTmpDirBase (mpi.conf), which on one machine the hosts' stepds of
# one step would share ("File exists"); so each slurmd runs with its own
# directory mounted there (a bind mount in the mount namespace that ip
# netns exec made for it), as each node of a cluster has its own /tmp.
# The client commands reach slurmctld at 10.78.0.1, which only the hosts
# can: run them with slurm_on.

slurm_dir=
slurm_start_s=
slurm_munged_pid=

slurm_why_not() {
  local p why
  why=$(cluster_why_not) || {
    echo "$why"
    return 1
  }
  for p in slurmctld slurmd munged munge sinfo salloc srun sbatch scancel scontrol; do
    if ! command -v "$p" >/dev/null 2>&1 &&
      ! [ -x "/usr/sbin/$p" ]; then
      echo "no $p (Debian: apt-get install slurm-wlm munge)"
      return 1
    fi
  done
  return 0
}

# slurm_bin NAME: the daemon's path (/usr/sbin is not on every PATH).
slurm_bin() {
  command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"
}

slurm_log() {
  case $1 in
    slurmctld) cat "$slurm_dir/slurmctld.log" 2>/dev/null ;;
    slurmd.*) cat "$slurm_dir/slurmd.${1#slurmd.}.log" 2>/dev/null ;;
  esac
}

slurm_up() {
  local n k t0 i idle conf
  n=$1
  t0=$(date +%s.%N)
  cluster_up "$n" || return 1
  slurm_dir="$cluster_dir/slurm"
  # munged wants every directory above its socket searchable by all, its key
  # readable by its owner only
  mkdir -p "$slurm_dir/state" "$slurm_dir/spool" &&
    chmod 711 "$cluster_dir" "$slurm_dir" ||
    return 1
  dd if=/dev/urandom of="$slurm_dir/munge.key" bs=1024 count=1 2>/dev/null &&
    chmod 400 "$slurm_dir/munge.key" || return 1
  "$(slurm_bin munged)" --socket="$slurm_dir/munge.sock" \
    --key-file="$slurm_dir/munge.key" --pid-file="$slurm_dir/munged.pid" \
    --log-file="$slurm_dir/munged.log" --seed-file="$slurm_dir/munged.seed" || {
    echo "slurm: munged did not start:" >&2
    cat "$slurm_dir/munged.log" >&2
    return 1
  }
  slurm_munged_pid=$(cat "$slurm_dir/munged.pid")
  conf="$slurm_dir/slurm.conf"
  {
    echo "# written by t/util/slurm.sh"
    echo "ClusterName=hvdtest"
    echo "SlurmctldHost=node1(10.78.0.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    # cred_expire: how long a requeued job waits to start again (120 s)
    echo "AuthInfo=socket=$slurm_dir/munge.sock,cred_expire=10"
    echo "StateSaveLocation=$slurm_dir/state"
    echo "SlurmdSpoolDir=$slurm_dir/spool/%n"
    echo "SlurmctldPidFile=$slurm_dir/slurmctld.pid"
    echo "SlurmdPidFile=$slurm_dir/slurmd.%n.pid"
    echo "SlurmctldLogFile=$slurm_dir/slurmctld.log"
    echo "SlurmdLogFile=$slurm_dir/slurmd.%n.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "SchedulerType=sched/builtin"
    echo "MpiDefault=none"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "KillWait=2"
    echo "MinJobAge=10"
    echo "InactiveLimit=0"
    k=1
    while [ $k -le "$n" ]; do
      echo "NodeName=node$k NodeAddr=10.78.0.$k CPUs=2 State=UNKNOWN"
      k=$((k + 1))
    done
    echo "PartitionName=hvd Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$conf" || return 1
  {
    echo "# written by t/util/slurm.sh"
    echo "CgroupPlugin=cgroup/v1"
    echo "CgroupAutomount=no"
  } >"$slurm_dir/cgroup.conf" || return 1
  mkdir -p "$slurm_dir/pmix" &&
    echo "PMIxCliTmpDirBase=$slurm_dir/pmix" >"$slurm_dir/mpi.conf" || return 1
  SLURM_CONF=$conf
  export SLURM_CONF
  cluster_on node1 "$(slurm_bin slurmctld)" -c -f "$conf" </dev/null || {
    echo "slurm: slurmctld did not start on node1:" >&2
    slurm_log slurmctld >&2
    return 1
  }
  k=1
  while [ $k -le "$n" ]; do
    mkdir -p "$slurm_dir/spool/node$k" "$slurm_dir/pmix.node$k" &&
      cluster_on "node$k" sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
        sh "$slurm_dir/pmix.node$k" "$slurm_dir/pmix" \
        "$(slurm_bin slurmd)" -N "node$k" -f "$conf" </dev/null || {
      echo "slurm: slurmd did not start on node$k:" >&2
      slurm_log "slurmd.node$k" >&2
      return 1
    }
    k=$((k + 1))
  done
  # every node idle (sinfo -N: one line per node)
  i=0
  while [ $i -lt 300 ]; do
    idle=$(cluster_on node1 sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')
    [ "$idle" = "$n" ] && break
    sleep 0.1
    i=$((i + 1))
  done
  if [ "$idle" != "$n" ]; then
    echo "slurm: after 30 s, $idle of $n nodes idle:" >&2
    cluster_on node1 sinfo -N >&2
    slurm_log slurmctld | tail -n 20 >&2
    return 1
  fi
  slurm_start_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  return 0
}

slurm_on() {
  cluster_on "$@"
}

# slurm_down: every host's processes get SIGTERM (the daemons save their
# state and leave; a job's processes end), SIGKILL after 5 s for what is
# left (cluster_down); munged before that; cluster_down removes the files.
slurm_down() {
  local i left
  left=$(cluster_pids)
  if [ -n "$left" ]; then
    kill -TERM $left 2>/dev/null
    i=0
    while [ $i -lt 50 ] && [ -n "$(cluster_pids)" ]; do
      sleep 0.1
      i=$((i + 1))
    done
  fi
  if [ -n "$slurm_munged_pid" ]; then
    kill -TERM "$slurm_munged_pid" 2>/dev/null
    i=0
    while [ $i -lt 50 ] && kill -0 "$slurm_munged_pid" 2>/dev/null; do
      sleep 0.1
      i=$((i + 1))
    done
    kill -KILL "$slurm_munged_pid" 2>/dev/null
    slurm_munged_pid=
  fi
  cluster_down
  slurm_dir=
}
