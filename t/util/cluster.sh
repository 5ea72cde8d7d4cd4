# t/util/cluster.sh - a small cluster on one machine, for tests of what
# crosses a network. Source it (as root); it defines:
#
#   cluster_why_not          prints why no cluster can be made here (not
#                            root, no ip or unshare, namespaces refused)
#                            and returns 1; returns 0 silently if one can
#   cluster_up N             hosts node1..nodeN; returns non-zero (with a
#                            message on stderr) if any step failed
#   cluster_down             removes everything cluster_up made: the
#                            namespaces' processes (SIGKILL), the
#                            namespaces, their /etc/netns files, the agent
#   cluster_on HOST CMD...   runs CMD on HOST: inside its network
#                            namespace, in a new UTS namespace whose
#                            hostname is HOST (the way ssh HOST CMD runs)
#   cluster_link HOST up|down   HOST's network link
#   cluster_pids             the processes still inside any host, one per
#                            line (none once a job has ended cleanly)
#   cluster_connects FILE    the TCP connects Open MPI logged in FILE (a
#                            job's stderr with OMPI_MCA_btl_base_verbose=30)
#                            as "HOST RANK" lines, sorted: the host each
#                            connect() came from and the rank it went to
#
# and sets cluster_agent: the launch agent for Open MPI (`--mca
# plm_rsh_agent "$cluster_agent"`), called as `agent HOST COMMAND...`
# like ssh, which runs COMMAND with cluster_on's rules.
#
# Layout: a "switch" namespace holds a bridge; each host is a network
# namespace with a veth pair to the bridge (eth0, 10.78.0.K/24 on host
# K), loopback up, and /etc/netns/NS/hosts naming every host (nodeK, and
# nodeK.hvd.test as its FQDN), which `ip netns exec` puts over /etc/hosts
# inside. The launch agent takes a host by either name or by its address
# (10.78.0.K); the host's own name (`hostname`) is always nodeK.
# Processes share the machine's
# file systems and PID space, as with a shared home directory; Open MPI
# sees N hosts by name and reaches them only over TCP (its shared-memory
# transport is between processes of one host).
#
# Names carry the shell's PID (hvdc<PID>-sw, hvdc<PID>-1, ...), so that
# two test runs do not meet. Call cluster_down from an EXIT trap. The
# functions keep their variables `local` (dash, bash and busybox sh have
# it), so that they do not overwrite the caller's.

cluster_prefix="hvdc$$"
cluster_n=0
cluster_agent=
cluster_dir=

cluster_why_not() {
  local p probe
  if [ "$(id -u 2>/dev/null)" != 0 ]; then
    echo "not root (network namespaces need root)"
    return 1
  fi
  for p in ip unshare; do
    if ! command -v "$p" >/dev/null 2>&1; then
      echo "no $p on PATH (Debian: apt-get install iproute2 util-linux)"
      return 1
    fi
  done
  probe="${cluster_prefix}-probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "ip netns add is refused here (no CAP_SYS_ADMIN?)"
    return 1
  fi
  if ! ip netns exec "$probe" unshare --uts true 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    echo "unshare --uts is refused inside a network namespace"
    return 1
  fi
  if ! ip -n "$probe" link add b0 type bridge 2>/dev/null ||
    ! ip -n "$probe" link add v0 type veth peer name v1 2>/dev/null; then
    ip netns del "$probe" 2>/dev/null
    echo "bridge or veth devices are refused (no kernel support?)"
    return 1
  fi
  ip netns del "$probe"
  if ! mkdir -p "/etc/netns/$probe" 2>/dev/null; then
    echo "cannot write /etc/netns (the hosts' /etc/hosts go there)"
    return 1
  fi
  rmdir "/etc/netns/$probe"
  return 0
}

# cluster_ns HOST: the namespace of HOST (nodeK), or nothing.
cluster_ns() {
  case $1 in
    node[1-9]) [ "${1#node}" -le "$cluster_n" ] && echo "${cluster_prefix}-${1#node}" ;;
  esac
}

cluster_up() {
  local sw hosts k ns
  cluster_n=$1
  sw="${cluster_prefix}-sw"
  cluster_dir=$(mktemp -d "${TMPDIR:-/tmp}/${cluster_prefix}.XXXXXX") ||
    return 1
  ip netns add "$sw" &&
    ip -n "$sw" link add br0 type bridge &&
    ip -n "$sw" link set br0 up || {
    echo "cluster: cannot make the switch namespace $sw" >&2
    return 1
  }
  hosts=
  k=1
  while [ $k -le "$cluster_n" ]; do
    hosts="${hosts}10.78.0.$k node$k node$k.hvd.test
"
    k=$((k + 1))
  done
  k=1
  while [ $k -le "$cluster_n" ]; do
    ns="${cluster_prefix}-$k"
    mkdir -p "/etc/netns/$ns" &&
      printf '127.0.0.1 localhost\n%s' "$hosts" >"/etc/netns/$ns/hosts" &&
      ip netns add "$ns" &&
      ip -n "$sw" link add "h$k" type veth peer name eth0 netns "$ns" &&
      ip -n "$sw" link set "h$k" master br0 &&
      ip -n "$sw" link set "h$k" up &&
      ip -n "$ns" link set lo up &&
      ip -n "$ns" addr add "10.78.0.$k/24" dev eth0 &&
      ip -n "$ns" link set eth0 up || {
      echo "cluster: cannot make host node$k (namespace $ns)" >&2
      return 1
    }
    k=$((k + 1))
  done
  # The agent knows the namespaces by the hosts' names, as ssh knows them
  # by address.
  cluster_agent="$cluster_dir/agent"
  {
    echo '#!/bin/sh'
    echo '# Open MPI launch agent of the test cluster: agent HOST COMMAND...'
    echo 'host=$1'
    echo 'shift'
    echo 'case $host in'
    k=1
    while [ $k -le "$cluster_n" ]; do
      echo "  node$k | node$k.hvd.test | 10.78.0.$k) ns=${cluster_prefix}-$k name=node$k ;;"
      k=$((k + 1))
    done
    echo '  *) echo "agent: no host $host in this cluster" >&2; exit 255 ;;'
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$0" && exec sh -c "$*"'"'"' "$name" "$@"'
  } >"$cluster_agent" && chmod +x "$cluster_agent" || return 1
  # a link comes up asynchronously: wait until each host reaches node1
  k=1
  while [ $k -le "$cluster_n" ]; do
    cluster_wait_link "node$k" || {
      echo "cluster: node$k's link did not come up" >&2
      return 1
    }
    k=$((k + 1))
  done
  return 0
}

# cluster_wait_link HOST: until HOST's eth0 reports LOWER_UP (5 s at most).
cluster_wait_link() {
  local ns i
  ns=$(cluster_ns "$1")
  i=0
  while [ $i -lt 50 ]; do
    ip -n "$ns" link show eth0 2>/dev/null | grep -q LOWER_UP && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

cluster_on() {
  local ns host
  ns=$(cluster_ns "$1")
  [ -n "$ns" ] || {
    echo "cluster_on: no host $1" >&2
    return 255
  }
  host=$1
  shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' \
    "$host" "$@"
}

cluster_link() {
  local ns
  ns=$(cluster_ns "$1")
  [ -n "$ns" ] && ip -n "$ns" link set eth0 "$2"
}

cluster_pids() {
  local k
  k=1
  while [ $k -le "$cluster_n" ]; do
    ip netns pids "${cluster_prefix}-$k" 2>/dev/null
    k=$((k + 1))
  done
}

cluster_connects() {
  sed -n 's/^\[\([a-z0-9]*\):[0-9]*\] btl: tcp: attempting to connect() to \[\[[0-9]*,[0-9]*\],\([0-9]*\)\].*/\1 \2/p' \
    "$1" | sort
}

cluster_down() {
  local k ns p
  k=1
  while [ $k -le "$cluster_n" ]; do
    ns="${cluster_prefix}-$k"
    for p in $(ip netns pids "$ns" 2>/dev/null); do
      kill -9 "$p" 2>/dev/null
    done
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
    k=$((k + 1))
  done
  ip netns del "${cluster_prefix}-sw" 2>/dev/null
  [ -z "$cluster_dir" ] || rm -rf "$cluster_dir"
  cluster_n=0
}
