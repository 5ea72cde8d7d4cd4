## t/standin/local.mk - hvd's GPU code run without a GPU: libhvd's C
## sources built again (t/standin/libhvd-standin.la) with host stand-ins
## for the CUDA runtime (cudart.c), NCCL over MPI (nccl.c) and the device
## kernels (kernels.c) instead of libcudart, libnccl and
## lib/ops/cuda_kernels.cu; then the GPU tests' own sources (t/gpu/*.c)
## linked against it, and tests of the stand-in's faults. Conventions in
## t/local.mk, which includes it. Only in builds with CUDA
## and NCCL (the code it runs is not built otherwise); without them
## nothing here is built or registered. What it proves and what it cannot:
## doc/gpu-testing.md, "Host stand-in".
##
## The programs run with HVD_NO_BIND=1 (t/mpirun-test) on the stand-in's
## 4 pretend GPUs (HVD_STANDIN_DEVICES), each rank on its own.


if HAVE_NCCL

check_LTLIBRARIES += t/standin/libhvd-standin.la
t_standin_libhvd_standin_la_SOURCES = $(HVD_C_SOURCES) \
	$(HVD_CUDA_C_SOURCES) $(HVD_NCCL_C_SOURCES) lib/ops/cuda_kernels.h lib/optim/optim_kernels.h \
	t/standin/standin.h t/standin/cudart.c t/standin/nccl.c \
	t/standin/kernels.c lib/base/fault.c
## HVD_FAULTS: the host allocation faults of lib/base/fault.h (this build
## of libhvd's sources only).
t_standin_libhvd_standin_la_CPPFLAGS = $(HVD_CPPFLAGS) $(MPI_CFLAGS) \
	$(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS) -DHVD_FAULTS

## Flags of the programs linked against the stand-in (no libhvd, no
## libcudart, no libnccl).
STANDIN_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS) $(NCCL_CPPFLAGS) \
	-I$(top_srcdir)/t/standin
STANDIN_LDADD = t/util/libhvdtest.la t/tap/libtap.la \
	t/standin/libhvd-standin.la $(MPI_LIBS) $(PTHREAD_LIBS) -lm

## The GPU tests, from their own sources: every device kernel against the
## host (t/gpu/kernels.c); every collective through both device executors
## (t/gpu/collectives.c); the optimizer stack on device parameters
## (t/gpu/optim.c); hvd_init's GPU binding (t/gpu/binding.c, run by
## binding.sh through t/gpu/binding.sh).
check_PROGRAMS += t/standin/kernels t/standin/collectives t/standin/optim \
	t/standin/binding
UNIT_TESTS += t/standin/kernels.t
NP_TESTS += t/standin/collectives.np1 t/standin/collectives.np2 \
	t/standin/collectives.np3 t/standin/collectives.np4
NP_TESTS += t/standin/optim.np1 t/standin/optim.np2 t/standin/optim.np3 \
	t/standin/optim.np4
## share.sh: t/gpu/share.sh on the stand-in's one GPU.
## order.sh: the check of NCCL's order rule (HVD_STANDIN_NCCL_ORDER=1).
## stream_order.sh: the stream order between streams (standin_access).
## kill.sh: a rank SIGKILLed during a device allreduce, under hvdrun.
## overlap.sh: send and receive buffers that overlap other than in place.
## ckpt_pieces.sh: checkpoints loaded into device tensors in small pieces.
TESTS_SH += t/standin/binding.sh t/standin/share.sh t/standin/order.sh \
	t/standin/stream_order.sh t/standin/kill.sh t/standin/overlap.sh \
	t/standin/ckpt_pieces.sh
t_standin_kernels_SOURCES = t/gpu/kernels.c
t_standin_kernels_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_kernels_LDADD = $(STANDIN_LDADD)
t_standin_collectives_SOURCES = t/gpu/collectives.c
t_standin_collectives_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_collectives_LDADD = $(STANDIN_LDADD)
t_standin_optim_SOURCES = t/gpu/optim.c
t_standin_optim_CPPFLAGS = $(STANDIN_CPPFLAGS) -DHVD_T_STANDIN
t_standin_optim_LDADD = $(STANDIN_LDADD)
t_standin_binding_SOURCES = t/gpu/binding.c
t_standin_binding_CPPFLAGS = $(STANDIN_CPPFLAGS) -DHVD_T_STANDIN
t_standin_binding_LDADD = $(STANDIN_LDADD)

## NCCL's failures (faults injected by the stand-in): an init that never
## finishes or fails, an asynchronous error, a hung collective; exact
## errors on every rank, no hang, hvd_shutdown after them. And the
## hostalloc  one rank's host allocation failing before a host
##            collective's MPI steps (HVD_STANDIN_HOST_ALLOC_FAIL, which
##            this build of libhvd has): every rank fails it with that
##            rank's words, then the next collectives work. Host tensors
##            only: the stand-in is here for its fault hooks.
check_PROGRAMS += t/standin/hostalloc
NP_TESTS += t/standin/hostalloc.np2 t/standin/hostalloc.np3 \
	t/standin/hostalloc.np4
t_standin_hostalloc_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_hostalloc_LDADD = $(STANDIN_LDADD)

## cachefail  one rank unable to cache what every rank agreed (site
##            "cache"): every rank empties its response cache in the next
##            round, and every sum after it is exact.
check_PROGRAMS += t/standin/cachefail
NP_TESTS += t/standin/cachefail.np2 t/standin/cachefail.np3 \
	t/standin/cachefail.np4
t_standin_cachefail_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_cachefail_LDADD = $(STANDIN_LDADD)

## stand-in's own NCCL and CUDA behaviour (selftest.c), both kinds of
## communicator, which libhvd's code may not reach.
check_PROGRAMS += t/standin/faults t/standin/selftest
NP_TESTS += t/standin/faults.np1 t/standin/faults.np2 t/standin/faults.np3
NP_TESTS += t/standin/selftest.np1 t/standin/selftest.np2 \
	t/standin/selftest.np3
t_standin_faults_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_faults_LDADD = $(STANDIN_LDADD)
t_standin_selftest_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_selftest_LDADD = $(STANDIN_LDADD)

## An NCCL failure on one rank only, its notice not yet read by the
## peers, before each kind of device collective with MPI steps: every rank
## fails it within 2 s (none blocks in MPI), then NCCL fails at once.
check_PROGRAMS += t/standin/onesided
NP_TESTS += t/standin/onesided.np2 t/standin/onesided.np3
t_standin_onesided_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_onesided_LDADD = $(STANDIN_LDADD)

## One rank's host (or a joined rank's device) allocation failing before
## a device collective's MPI steps (lib/base/fault.h): every rank fails it
## within 2 s, naming that rank, or runs it in agreed smaller groups.
check_PROGRAMS += t/standin/allocfail
NP_TESTS += t/standin/allocfail.np2 t/standin/allocfail.np3
t_standin_allocfail_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_allocfail_LDADD = $(STANDIN_LDADD)

## Asynchronous completion: device groups in flight together (exactly
## HVD__GPU_SLOTS), the fusion buffer grown only once they completed, a
## process set's groups beside the world's.
check_PROGRAMS += t/standin/flight
NP_TESTS += t/standin/flight.np1 t/standin/flight.np2 t/standin/flight.np3 \
	t/standin/flight.np4
t_standin_flight_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_flight_LDADD = $(STANDIN_LDADD)

## HVD_GPU_TIMING=1 and hvd_gpu_timing: three device groups with sleeps
## between them, through each device executor; the refusals.
check_PROGRAMS += t/standin/gpu_timing
NP_TESTS += t/standin/gpu_timing.np1 t/standin/gpu_timing.np2 \
	t/standin/gpu_timing.np3 t/standin/gpu_timing.np4
t_standin_gpu_timing_CPPFLAGS = $(STANDIN_CPPFLAGS)
t_standin_gpu_timing_LDADD = $(STANDIN_LDADD)

## The soak (t/soak/soak.c) with its tensors on the stand-in's GPUs, all
## or half of them, NCCL's order rule checked (soak.sh, np 2-4).
check_PROGRAMS += t/standin/soak
TESTS_SH += t/standin/soak.sh
t_standin_soak_SOURCES = t/soak/soak.c
t_standin_soak_CPPFLAGS = $(STANDIN_CPPFLAGS) -DSOAK_CUDA
t_standin_soak_LDADD = $(STANDIN_LDADD)
## The optimizer soak (t/soak/optim_soak.c) with about half of each
## configuration's parameters on the stand-in's GPUs (optim_soak.sh).
check_PROGRAMS += t/standin/optim_soak
TESTS_SH += t/standin/optim_soak.sh
t_standin_optim_soak_SOURCES = t/soak/optim_soak.c
t_standin_optim_soak_CPPFLAGS = $(STANDIN_CPPFLAGS) -DSOAK_CUDA
t_standin_optim_soak_LDADD = $(STANDIN_LDADD)

endif
