## t/mpi/extra.mk - multi-rank tests of errors and lifecycle: mismatches,
## invalid arguments, shutdown, topology, join, MPI owned by hvd, and a
## rank dying mid-job. Conventions in t/local.mk.

## Ranks that disagree on a collective: HVD_ERR_MISMATCH with the ranks.
check_PROGRAMS += t/mpi/mismatch
t_mpi_mismatch_SOURCES = t/mpi/mismatch.c
t_mpi_mismatch_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_mismatch_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_mismatch_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/mismatch.np2 t/mpi/mismatch.np3 t/mpi/mismatch.np4

## Every invalid argument: rc and exact message; then a valid collective.
check_PROGRAMS += t/mpi/invalid
t_mpi_invalid_SOURCES = t/mpi/invalid.c
t_mpi_invalid_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_invalid_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_invalid_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/invalid.np1 t/mpi/invalid.np2

## hvd_shutdown with requests in flight, twice, init again, by one rank.
check_PROGRAMS += t/mpi/shutdown
t_mpi_shutdown_SOURCES = t/mpi/shutdown.c
t_mpi_shutdown_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_shutdown_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_shutdown_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/shutdown.np2 t/mpi/shutdown.np3

## Local/cross ranks on one node, on nodes simulated by HVD_HOSTNAME, and
## over a sub-communicator (hvd_init_comm).
check_PROGRAMS += t/mpi/topology
t_mpi_topology_SOURCES = t/mpi/topology.c
t_mpi_topology_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_topology_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_topology_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/topology.np1 t/mpi/topology.np2 t/mpi/topology.np3 \
	t/mpi/topology.np4

## hvd_join with ranks running out of data at different steps.
check_PROGRAMS += t/mpi/join
t_mpi_join_SOURCES = t/mpi/join.c
t_mpi_join_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_join_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_join_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/join.np2 t/mpi/join.np3 t/mpi/join.np4

## hvd_init initialising (and at exit finalising) MPI itself.
check_PROGRAMS += t/mpi/init_mpi
t_mpi_init_mpi_SOURCES = t/mpi/init_mpi.c
t_mpi_init_mpi_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_init_mpi_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_init_mpi_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/init_mpi.np2

## A rank dying mid-job: rank_death.sh runs t/mpi/die (not a test itself).
check_PROGRAMS += t/mpi/die
t_mpi_die_SOURCES = t/mpi/die.c
t_mpi_die_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_die_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_die_LDADD = lib/libhvd.la $(MPI_LIBS) $(PTHREAD_LIBS) -lm
dist_check_SCRIPTS += t/mpi/rank_death.sh
TESTS += t/mpi/rank_death.sh

## The quick start's demonstration program.
dist_check_SCRIPTS += t/mpi/demo.sh
TESTS += t/mpi/demo.sh
