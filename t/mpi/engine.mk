## t/mpi/engine.mk - multi-rank tests of the engine's settings and paths:
## response cache, fusion and chunking, hierarchical allreduce, the stall
## inspector, the timeline, malformed HVD_* values. Conventions in
## t/local.mk; included by Makefile.am after t/mpi/extra.mk.

## Response cache: shapes and dtypes changing under one name, eviction
## (HVD_CACHE_CAPACITY=4), no cache, a mismatch on a cached name.
check_PROGRAMS += t/mpi/cache
t_mpi_cache_SOURCES = t/mpi/cache.c
t_mpi_cache_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_cache_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_cache_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/cache.np1 t/mpi/cache.np2 t/mpi/cache.np3 \
	t/mpi/cache.np4

## Fusion and chunking: mixed bursts under HVD_CHUNK_SIZE x
## HVD_FUSION_THRESHOLD, every op, scaling, in and out of place; join.
check_PROGRAMS += t/mpi/fusion
t_mpi_fusion_SOURCES = t/mpi/fusion.c
t_mpi_fusion_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_fusion_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_fusion_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/fusion.np1 t/mpi/fusion.np2 t/mpi/fusion.np3 \
	t/mpi/fusion.np4

## HVD_HIERARCHICAL_ALLREDUCE=1 on nodes simulated by HVD_HOSTNAME.
check_PROGRAMS += t/mpi/hierarchical
t_mpi_hierarchical_SOURCES = t/mpi/hierarchical.c
t_mpi_hierarchical_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_hierarchical_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_hierarchical_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/hierarchical.np4 t/mpi/hierarchical.np6

## Malformed HVD_* values: hvd_init fails with the exact message.
check_PROGRAMS += t/mpi/settings
t_mpi_settings_SOURCES = t/mpi/settings.c
t_mpi_settings_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_settings_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_settings_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/settings.np1 t/mpi/settings.np2

## The stall inspector: stall.sh runs t/mpi/stall_prog (not a test itself).
check_PROGRAMS += t/mpi/stall_prog
t_mpi_stall_prog_SOURCES = t/mpi/stall_prog.c
t_mpi_stall_prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_stall_prog_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_stall_prog_LDADD = $(HVD_PROG_LDADD)
dist_check_SCRIPTS += t/mpi/stall.sh
TESTS += t/mpi/stall.sh

## The timeline: timeline.sh runs t/mpi/timeline_prog and checks the JSON
## with t/mpi/timeline_check.py (python3; skipped without it).
check_PROGRAMS += t/mpi/timeline_prog
t_mpi_timeline_prog_SOURCES = t/mpi/timeline_prog.c
t_mpi_timeline_prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_timeline_prog_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_timeline_prog_LDADD = $(HVD_PROG_LDADD)
dist_check_SCRIPTS += t/mpi/timeline.sh
EXTRA_DIST += t/mpi/timeline_check.py
TESTS += t/mpi/timeline.sh

## hvd-bench's correctness self-check.
dist_check_SCRIPTS += t/mpi/bench.sh
TESTS += t/mpi/bench.sh
