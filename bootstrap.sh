#!/usr/bin/env bash
# bootstrap.sh - from a fresh Debian 12 / Ubuntu machine to a running hvd job.
#
#   ./bootstrap.sh                        install, build, run the main job
#   ./bootstrap.sh --no-run               install and build only
#   ./bootstrap.sh --configure-args "--enable-werror --with-cuda=/opt/cuda"
#
# Steps: (1) apt-get installs the build tools and Open MPI when any of them
# is missing (with sudo when not root); (2) autoreconf -fi; (3) ./configure,
# which finds CUDA, cuBLAS and NCCL by itself in /usr/local/cuda; (4) make;
# (5) the main job: examples/bert_train on 2 ranks through bin/hvdrun. Each step stops the
# script with a message naming it if it fails. Running it again is safe: it
# installs nothing that is present and rebuilds only what changed.
set -euo pipefail

PACKAGES="build-essential autoconf automake libtool pkg-config openmpi-bin libopenmpi-dev libopenblas-dev"
NP=2

usage() {
  sed -n '2,13s/^# \{0,1\}//p' "$0"
  cat <<'EOF'

Options:
  --no-run                 install and build, but do not run the main job
  --configure-args "ARGS"  extra arguments for ./configure (quoted as for a shell)
  -h, --help               this text
EOF
}

say() { printf '\n==> bootstrap: %s\n' "$*"; }
die() {
  printf '\nbootstrap: FAILED: %s\n' "$*" >&2
  exit 1
}

run_main=yes
configure_args=
while [ $# -gt 0 ]; do
  case $1 in
  --no-run) run_main=no ;;
  --configure-args)
    [ $# -ge 2 ] || die "--configure-args needs a value, e.g. --configure-args \"--enable-werror\""
    configure_args=$2
    shift
    ;;
  --configure-args=*) configure_args=${1#*=} ;;
  -h | --help)
    usage
    exit 0
    ;;
  *) die "unknown option '$1' (see ./bootstrap.sh --help)" ;;
  esac
  shift
done

cd "$(dirname "$0")" || die "cannot cd to the directory of $0"
if [ ! -f configure.ac ] || [ ! -f include/hvd.h ]; then
  die "run me from an hvd source tree (no configure.ac here: $(pwd))"
fi

# ---- 1. packages ------------------------------------------------------------
say "checking packages: $PACKAGES"
if command -v dpkg-query >/dev/null 2>&1; then
  missing=
  for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
      missing="$missing $p"
  done
  if [ -z "$missing" ]; then
    echo "all present"
  else
    echo "missing:$missing"
    if [ "$(id -u)" -eq 0 ]; then
      as_root=
    elif command -v sudo >/dev/null 2>&1; then
      as_root=sudo
    else
      die "not root and no sudo: install these as root, then run me again:$missing"
    fi
    say "apt-get update"
    $as_root apt-get update </dev/null ||
      die "apt-get update failed (network? /etc/apt/sources.list?)"
    say "apt-get install$missing"
    # shellcheck disable=SC2086 # the list is meant to split
    $as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends $missing </dev/null ||
      die "apt-get install failed for:$missing"
  fi
else
  # Not Debian: trust the tools if they are there.
  for c in cc make autoreconf automake libtoolize pkg-config mpicc mpirun; do
    command -v "$c" >/dev/null 2>&1 ||
      die "no dpkg here, and '$c' is missing: install a C compiler, make, autoconf, automake, libtool, pkg-config and Open MPI (with its headers)"
  done
  echo "no dpkg; the build tools and Open MPI are on PATH"
fi

# ---- 2-4. build ---------------------------------------------------------------
say "autoreconf -fi"
autoreconf -fi || die "autoreconf -fi failed (are autoconf, automake and libtool installed?)"

cargs=()
eval "cargs=($configure_args)" || die "cannot parse --configure-args '$configure_args'"
say "./configure${cargs[*]:+ ${cargs[*]}}"
old_config=$( (./config.status --config) 2>/dev/null || true)
./configure "${cargs[@]}" ||
  die "./configure failed; the reason is at the end of config.log"
if [ -n "$old_config" ] && [ "$old_config" != "$(./config.status --config)" ]; then
  # make rebuilds on changed sources, not on changed flags.
  say "configure options changed (were: $old_config): make clean"
  make clean >/dev/null || die "make clean failed"
fi

jobs=$(nproc 2>/dev/null || echo 2)
say "make -j$jobs"
make -j"$jobs" || die "make failed (the first error above says where)"

if [ $run_main = no ]; then
  say "built; not running the main job (--no-run). Test with: make -j2 check"
  exit 0
fi

# ---- 5. the main job ----------------------------------------------------------
# examples/bert_train (tiny BERT, synthetic corpus, CPU) on 2 ranks through
# hvd's launcher, which adds Open MPI's root variables and --oversubscribe
# as needed.
limit=
command -v timeout >/dev/null 2>&1 && limit="timeout 600"
say "main job: bin/hvdrun -np $NP examples/bert_train"
HVD_RUN_NO_CMA=${HVD_RUN_NO_CMA:-1} $limit bin/hvdrun -np $NP \
  examples/bert_train </dev/null ||
  die "the main job (examples/bert_train on $NP ranks) failed with status $?"
say "done. Run the tests with: make -j2 check"
