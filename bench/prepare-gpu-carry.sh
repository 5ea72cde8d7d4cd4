#!/bin/sh
# bench/prepare-gpu-carry.sh - prepare, on a Debian 12 build machine with
# apt and autotools, what a bare GPU machine needs to build and test hvd
# (doc/gpu-testing.md, "On a GPU machine without Open MPI and without a
# package registry", step 1):
#
#   .ompi/              Open MPI's runtime, headers and the libraries its
#                       core needs, and the reference BLAS with its CBLAS
#                       (configure needs one for examples/bert_train; CUDA
#                       images have none; OpenBLAS would not fit: 37 MB),
#                       unpacked from Debian's packages (apt-get download +
#                       dpkg -x; nothing is installed)
#   hvd-VERSION.tar.gz  `make dist` of this checkout (needs no autotools to
#                       build), made in a private copy under $TMPDIR: the
#                       checkout itself is never configured or built
#
# Both are ignored by git (.gitignore), so a runner that sends the working
# tree takes them only when they are named as carried paths:
# carry [".ompi", "hvd-VERSION.tar.gz"], about 20 MB together.
#
#   bench/prepare-gpu-carry.sh            both (.ompi kept if complete)
#   bench/prepare-gpu-carry.sh --force    .ompi unpacked again
#   bench/prepare-gpu-carry.sh --ompi-only | --dist-only
#
# Run it from anywhere: it works in the checkout that holds it. Exit 0
# with both in place, 1 on any failure (what failed is said on stderr).
set -eu

force=0
do_ompi=1
do_dist=1
for a in "$@"; do
  case $a in
  --force) force=1 ;;
  --ompi-only) do_dist=0 ;;
  --dist-only) do_ompi=0 ;;
  -h | --help)
    sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "prepare-gpu-carry: unknown argument '$a' (--force, --ompi-only," \
      "--dist-only, --help)" >&2
    exit 2
    ;;
  esac
done

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
die() {
  echo "prepare-gpu-carry: $*" >&2
  exit 1
}

# ---- 1. Open MPI into .ompi ------------------------------------------------
# The packages of `apt-cache depends --recurse openmpi-bin libopenmpi3`
# that one node needs; the network transports' libraries (libucx0,
# libfabric1, libibverbs1, libpsm2-2, libpsm-infinipath1, libnl-3-200,
# libhwloc-plugins), openssh-client and what every system has (libc6,
# libgcc-s1, libstdc++6, zlib1g, libudev1) are left out on purpose.
# BLAS: Debian's reference BLAS (libblas.so.3 has the CBLAS functions) and
# its headers, cblas-netlib.h copied as usr/include/cblas/cblas.h (what
# update-alternatives would have pointed cblas.h at).
pkgs="openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
  libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libpmix2 libmunge2
  libblas3 libblas-dev"
libdir=usr/lib/x86_64-linux-gnu

if [ $do_ompi = 1 ]; then
  if [ $force = 0 ] && [ -x .ompi/usr/bin/mpirun ] &&
    [ -f .ompi/$libdir/openmpi/lib/libmpi.so ] &&
    [ -f .ompi/$libdir/blas/libblas.so ] &&
    [ -f .ompi/usr/include/cblas/cblas.h ]; then
    echo "prepare-gpu-carry: .ompi is there ($(du -sh .ompi | cut -f1));" \
      "--force unpacks it again"
  else
    command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
      die "apt-get and dpkg are needed (Debian 12)"
    rm -rf .ompi
    mkdir -p .ompi/debs
    # shellcheck disable=SC2086
    (cd .ompi/debs && apt-get download $pkgs) ||
      die "apt-get download failed (apt-get update first?)"
    for d in .ompi/debs/*.deb; do
      dpkg -x "$d" .ompi || die "dpkg -x $d failed"
    done
    rm -rf .ompi/debs .ompi/usr/share/doc .ompi/usr/share/man \
      .ompi/$libdir/fortran .ompi/$libdir/pkgconfig/blas*.pc
    find .ompi/$libdir/blas -name '*.a' -delete
    mkdir -p .ompi/usr/include/cblas
    cp .ompi/usr/include/x86_64-linux-gnu/cblas_*.h .ompi/usr/include/cblas/ &&
      cp .ompi/usr/include/x86_64-linux-gnu/cblas-netlib.h \
        .ompi/usr/include/cblas/cblas.h || die "no cblas-netlib.h in libblas-dev"
    # the names that update-alternatives would have made
    for p in mpirun mpiexec mpicc; do
      ln -sf $p.openmpi .ompi/usr/bin/$p
    done
    [ -x .ompi/usr/bin/mpirun ] && [ -f .ompi/$libdir/openmpi/lib/libmpi.so ] &&
      [ -f .ompi/$libdir/blas/libblas.so ] ||
      die ".ompi is incomplete: no usr/bin/mpirun, libmpi.so or libblas.so"
    echo "prepare-gpu-carry: .ompi unpacked ($(du -sh .ompi | cut -f1))"
  fi
fi

# ---- 2. the release tarball -------------------------------------------------
if [ $do_dist = 1 ]; then
  for t in autoreconf make tar; do
    command -v $t >/dev/null || die "$t is needed for make dist"
  done
  work=$(mktemp -d "${TMPDIR:-/tmp}/hvd-dist.XXXXXX")
  trap 'rm -rf "$work"' 0
  # the tracked files and the untracked ones git does not ignore, as the
  # runner sends them (so .ompi, builds and tarballs stay out)
  git ls-files -co --exclude-standard -z | xargs -0 tar -cf - |
    (cd "$work" && tar -xf -) || die "copying the checkout failed"
  (cd "$work" && autoreconf -fi >autoreconf.log 2>&1) ||
    die "autoreconf failed: $work/autoreconf.log"
  # configure only to get a Makefile: without CUDA, so that it is quick
  # and works anywhere (make dist takes every source either way)
  (cd "$work" && ./configure --without-cuda >configure.log 2>&1) ||
    die "configure failed (see config.log in a copy)"
  (cd "$work" && make dist >dist.log 2>&1) || die "make dist failed"
  tarball=$(cd "$work" && ls hvd-*.tar.gz)
  rm -f hvd-*.tar.gz
  cp "$work/$tarball" . || die "copying $tarball failed"
  echo "prepare-gpu-carry: $tarball ($(du -h "$tarball" | cut -f1)), made" \
    "from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' + changes')"
fi

# ---- what travels -----------------------------------------------------------
for p in .ompi hvd-*.tar.gz; do
  [ -e "$p" ] || continue
  git check-ignore -q "$p" || die "$p is not ignored by git: it would travel" \
    "with the working tree; add it to .gitignore"
done
tree=$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- |
  tail -1 | cut -f1)
carry=$(du -cb .ompi hvd-*.tar.gz 2>/dev/null | tail -1 | cut -f1)
echo "prepare-gpu-carry: the working tree is $((tree / 1048576)) MiB, the" \
  "carried paths $((carry / 1048576)) MiB: $(((tree + carry) / 1048576)) of" \
  "the 64 MiB that may travel"
[ $((tree + carry)) -lt $((64 * 1048576)) ] ||
  die "over 64 MiB: the runner would refuse it"
