## t/unit/optim.mk - the plain optimizers (lib/optim/optimizer.c): SGD and
## Adam/AdamW against torch.optim's formulas, custom ops and their state,
## the validation messages. One process, no hvd_init. Conventions in
## t/local.mk; included by Makefile.am. CUDA flags only to count the GPUs
## (the messages refusing a device parameter depend on it).
check_PROGRAMS += t/unit/optim
UNIT_TESTS += t/unit/optim.t
t_unit_optim_SOURCES = t/unit/optim.c
t_unit_optim_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_unit_optim_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_unit_optim_LDADD = $(TEST_LDADD) $(CUDA_LIBS)
