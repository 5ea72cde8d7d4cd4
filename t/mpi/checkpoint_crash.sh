#!/bin/sh
# checkpoint_crash.sh - a save that dies between writing its temporary
# file and renaming it over the checkpoint leaves the previous checkpoint
# intact. With t/mpi/checkpoint (which see), at np 2:
#
#  1. save 3 steps to model.ckpt;
#  2. save 4 steps to it with the shim t/mpi/crash_rename.so preloaded and
#     HVD_TEST_CRASH_RENAME=model.ckpt: rank 0 is killed (SIGKILL) at the
#     rename, the job fails, and model.ckpt.tmp.<pid> remains;
#  3. loading model.ckpt gives the 3-step bits (np 1 and 2);
#  4. with that stray temporary file still there, a normal save of 4 steps
#     works and loads back as the 4-step bits, and the stray file is left
#     alone (hvd never removes another process's temporary files);
#  5. hvd_checkpoint_save_async never waited for, its rename held up 2 s
#     by the shim (HVD_TEST_SLOW_RENAME) so that the program ends first:
#     the exit waits for the write, and the file loads with the 3-step
#     bits.
#  6. A save over a checkpoint of mode 0600 (umask 022), the shim logging
#     the permissions of each temporary file right after its creation
#     (HVD_TEST_CREATE_MODES): 0600 from the open on (it was created 0644
#     and chmod'ed later, so another user could open it in between and
#     read the whole new checkpoint), and the file stays 0600.
#  7. As user 65534 (setpriv; root and setpriv only, else skipped), a
#     save into a directory it may write in but not read (0733) fails on
#     both ranks with HVD_ERR_IO "cannot open directory ...: Permission
#     denied" and leaves the old file as it was, with no temporary file:
#     the directory, which the save syncs, once was opened only after the
#     rename, so the save failed although the file was replaced.
# Each run is bounded by HVD_TEST_TIMEOUT=60 (the wrapper's timeout).

: "${HVD_TOP_BUILDDIR:?run me from make check}"
: "${HVD_MPIRUN_TEST:?run me from make check}"
prog=$HVD_TOP_BUILDDIR/t/mpi/checkpoint
shim=$HVD_TOP_BUILDDIR/t/mpi/.libs/crash_rename.so
HVD_TEST_TIMEOUT=60
export HVD_TEST_TIMEOUT
unset HVD_TEST_CRASH_RENAME

if [ ! -x "$prog" ]; then
  echo "1..0 # SKIP no $prog (run make check)"
  exit 0
fi
if [ ! -f "$shim" ]; then
  echo "1..0 # SKIP no shared $shim (configured without shared libraries?)"
  exit 0
fi

tmp=`mktemp -d "${TMPDIR:-/tmp}/checkpoint_crash.XXXXXX"` || exit 99
trap 'rm -rf "$tmp"' 0
ckpt=$tmp/model.ckpt

n=0
failed=0
# check STATUS DESCRIPTION: a TAP line, ok if STATUS is 0.
check() {
  n=$((n + 1))
  if [ "$1" = 0 ]; then
    echo "ok $n - $2"
  else
    echo "not ok $n - $2"
    failed=1
  fi
}
# run DESCRIPTION NP ARGS...: ok if the program exits 0, else its output.
run() {
  what=$1
  np=$2
  shift 2
  "$HVD_MPIRUN_TEST" --np "$np" "$prog" "$@" >"$tmp/out" 2>&1
  rc=$?
  check $rc "$what"
  [ $rc = 0 ] || sed 's/^/#   /' "$tmp/out"
}

echo "1..19"
run "save 3 steps" 2 save "$ckpt" 3
before=`cksum <"$ckpt"`

# The preloaded shim reaches the ranks only (-x), not mpiexec. ASan, when
# built in, must tolerate a library preloaded ahead of it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x HVD_TEST_CRASH_RENAME=$ckpt" \
  "$HVD_MPIRUN_TEST" --np 2 "$prog" save "$ckpt" 4 >"$tmp/crash" 2>&1
rc=$?
[ $rc != 0 ] && [ $rc != 124 ]
check $? "save 4 steps, killed at the rename: the job fails (status $rc)"
[ $rc != 0 ] && [ $rc != 124 ] || sed 's/^/#   /' "$tmp/crash"
! grep -q "save at np" "$tmp/crash"
check $? "... before the save returned"
ls "$ckpt".tmp.* >/dev/null 2>&1
check $? "... leaving its temporary file"
[ "`cksum <"$ckpt"`" = "$before" ]
check $? "... and the checkpoint untouched"

run "load at np 2: the 3-step bits" 2 load "$ckpt" 3
run "load at np 1: the 3-step bits" 1 load "$ckpt" 3
run "a normal save of 4 steps next to the stray temporary file" 2 \
  save "$ckpt" 4
run "loads as the 4-step bits" 2 load "$ckpt" 4
ls "$ckpt".tmp.* >/dev/null 2>&1
check $? "the stray temporary file is left alone"

bg=$tmp/bg.ckpt
HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x HVD_TEST_SLOW_RENAME=$bg" \
  run "save_async of 3 steps, rename held up 2 s, never waited for: exit 0" \
  2 save-async "$bg" 3
[ -f "$bg" ] && ! ls "$bg".tmp.* >/dev/null 2>&1
check $? "... the exit waited for the write: the file is there, no temporary"
run "... it loads as the 3-step bits" 2 load "$bg" 3

# ---- 6. the temporary file's permissions from its creation on ----
chmod 0600 "$ckpt"
umask 022
HVD_TEST_MPIEXEC_ARGS="$HVD_TEST_MPIEXEC_ARGS -x LD_PRELOAD=$shim -x HVD_TEST_CREATE_MODES=$tmp/modes" \
  run "a save of 5 steps over a file of mode 0600" 2 save "$ckpt" 5
modes=`cat "$tmp/modes" 2>/dev/null`
[ "$modes" = 0600 ]
check $? "... its temporary file was 0600 from its creation on (seen: $modes)"
[ "`stat -c %a "$ckpt"`" = 600 ]
check $? "... and the checkpoint is 0600 (`stat -c %a "$ckpt"`)"

# ---- 7. a directory the saver cannot read ----
if [ "`id -u`" != 0 ] || ! command -v setpriv >/dev/null 2>&1; then
  for i in 1 2 3; do
    n=$((n + 1))
    echo "ok $n # SKIP a save by another user: needs root and setpriv"
  done
  exit $failed
fi
wx=$tmp/wx
mkdir "$wx"
chmod 0711 "$tmp"
run "save 3 steps into wx/" 2 save "$wx/model.ckpt" 3
before=`cksum <"$wx/model.ckpt"`
chmod 0733 "$wx"
setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$wx" \
  "$HVD_MPIRUN_TEST" --np 2 "$prog" save "$wx/model.ckpt" 4 \
  >"$tmp/wx.out" 2>&1
rc=$?
count=`grep -c "expected 0, got 12" "$tmp/wx.out"`
grep -q "^# hvd_checkpoint_save: '$wx/model.ckpt': cannot open directory '$wx': Permission denied\$" "$tmp/wx.out" &&
  [ "$count" = 2 ]
check $? "as user 65534 into a 0733 directory: HVD_ERR_IO on both ranks, naming it (status $rc)" ||
  sed 's/^/#   /' "$tmp/wx.out"
[ "`cksum <"$wx/model.ckpt"`" = "$before" ] && ! ls "$wx"/model.ckpt.tmp.* >/dev/null 2>&1
check $? "... the old file as it was, no temporary file"
exit $failed
