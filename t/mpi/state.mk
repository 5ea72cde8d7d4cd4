## t/mpi/state.mk - the initial state: broadcast and verification of
## parameters and optimizer state. Conventions in t/local.mk.
check_PROGRAMS += t/mpi/bcast_params
t_mpi_bcast_params_SOURCES = t/mpi/bcast_params.c
t_mpi_bcast_params_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_bcast_params_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_bcast_params_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/bcast_params.np1 t/mpi/bcast_params.np2 \
	t/mpi/bcast_params.np3 t/mpi/bcast_params.np4
