#!/bin/sh
# tracked.sh - no file that git tracks is a build output: a libtool
# wrapper script ("temporary wrapper script for .libs/..."), an ELF object
# or program, an object or archive by name (.o .lo .la .a .so), a test log
# (.log .trs), Python byte code (.pyc). One check; skipped outside a git checkout (a tarball).
: "${HVD_TOP_SRCDIR:?run me from make check}"
cd "$HVD_TOP_SRCDIR" || exit 99
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "1..0 # SKIP not a git checkout"
  exit 0
fi
echo "1..1"
bad=$(git ls-files -z | xargs -0 -r sh -c '
  for f; do
    [ -f "$f" ] || continue
    case $f in
      *.o | *.lo | *.la | *.a | *.so | *.so.* | *.log | *.trs | *.pyc) echo "$f"; continue ;;
    esac
    head -c 4 "$f" | grep -q "^.ELF" && { echo "$f"; continue; }
    head -n 3 "$f" | grep -q "^# [^ ]* - temporary wrapper script for \\.libs/" && echo "$f"
  done' sh)
if [ -z "$bad" ]; then
  echo "ok 1 - no tracked file is a build output"
else
  echo "not ok 1 - no tracked file is a build output"
  printf '%s\n' "$bad" | sed 's/^/#   tracked build output: /'
  exit 1
fi
