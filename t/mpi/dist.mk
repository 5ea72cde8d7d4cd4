## t/mpi/dist.mk - the distributed optimizer (lib/optim/distributed.c).
## Conventions in t/local.mk; included by Makefile.am.

## World-size equivalence against a single-process reference (SGD
## momentum, AdamW), accumulation over passes, predivide, op sum, no-sync,
## fp16/bf16 compression, mismatches and every error path.
check_PROGRAMS += t/mpi/optim
t_mpi_optim_SOURCES = t/mpi/optim.c
t_mpi_optim_CPPFLAGS = $(TEST_CPPFLAGS)
t_mpi_optim_LDFLAGS = $(TEST_LDFLAGS)
t_mpi_optim_LDADD = $(TEST_LDADD)
NP_TESTS += t/mpi/optim.np1 t/mpi/optim.np2 t/mpi/optim.np3 \
	t/mpi/optim.np4
