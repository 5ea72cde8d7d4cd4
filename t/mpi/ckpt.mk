## t/mpi/ckpt.mk - checkpoints and the sampler. Conventions in t/local.mk;
## included by Makefile.am after t/mpi/dist.mk.

## hvd_checkpoint_save/load: save and resume bit for bit, every failure
## with its message and nothing changed; also the program behind
## checkpoint.sh and checkpoint_crash.sh (modes save/load).
check_PROGRAMS += t/mpi/checkpoint
t_mpi_checkpoint_SOURCES = t/mpi/checkpoint.c
t_mpi_checkpoint_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_checkpoint_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_checkpoint_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/checkpoint.np1 t/mpi/checkpoint.np2 t/mpi/checkpoint.np3

## Across world sizes: saved at np 2, loaded at np 1, 2 and 3.
dist_check_SCRIPTS += t/mpi/checkpoint.sh
TESTS += t/mpi/checkpoint.sh

## A crash between the temporary file and the rename leaves the previous
## checkpoint loadable. The LD_PRELOAD shim t/mpi/crash_rename.la (a
## shared module; built without sanitizers, as it is preloaded) kills the
## process at that rename.
check_LTLIBRARIES += t/mpi/crash_rename.la
t_mpi_crash_rename_la_SOURCES = t/mpi/crash_rename.c
t_mpi_crash_rename_la_CPPFLAGS = -D_GNU_SOURCE
t_mpi_crash_rename_la_CFLAGS = $(HVD_WARN_CFLAGS)
t_mpi_crash_rename_la_LDFLAGS = -module -avoid-version -shared \
	-rpath $(abs_builddir)/t/mpi
dist_check_SCRIPTS += t/mpi/checkpoint_crash.sh
TESTS += t/mpi/checkpoint_crash.sh

## The sampler (one process).
check_PROGRAMS += t/unit/sampler
UNIT_TESTS += t/unit/sampler.t
t_unit_sampler_SOURCES = t/unit/sampler.c
t_unit_sampler_CPPFLAGS = $(TEST_CPPFLAGS)
t_unit_sampler_LDFLAGS = $(TEST_LDFLAGS)
t_unit_sampler_LDADD = $(TEST_LDADD)
