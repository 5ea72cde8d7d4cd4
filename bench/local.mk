## bench/local.mk - hvd-bench, the benchmark and correctness sweep of hvd's
## collectives (doc/bench.md). Included by Makefile.am.
##
##   mpirun -np 2 bin/hvd-bench sweep | list --tensors FILE | latency
##   mpirun -np 2 bin/hvd-bench overlap | optim --tensors FILE
##   bin/hvd-bench --quick     (exit status 0: every result was right)
##   bin/hvd-bench gpu-pack | staged | list --device gpu --tensors FILE
##                             (on a GPU; without one: "# SKIP ...", exit 0)
##
## -static links libhvd.a: the GPU modes call the fusion buffer's pack
## kernels (hvd__cuda_pack/unpack), internals that libhvd.so does not
## export (it exports hvd_* only). Only the CUDA runtime is linked, never
## the driver library (libcuda).

bin_PROGRAMS += bin/hvd-bench
bin_hvd_bench_SOURCES = \
	bin/hvd-bench.c \
	bin/bench.h \
	bin/bench_util.c \
	bin/bench_sweep.c \
	bin/bench_list.c \
	bin/bench_latency.c bin/bench_overlap.c bin/bench_optim.c \
	bin/bench_gpu.c
bin_hvd_bench_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(CUDA_CPPFLAGS)
bin_hvd_bench_LDFLAGS = $(AM_LDFLAGS) -static $(CUDA_LDFLAGS) $(NCCL_LDFLAGS)
bin_hvd_bench_LDADD = $(HVD_PROG_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)

## The GPU modes: the skip line without a GPU (or CUDA), a small real run
## with one; bad arguments exit 2; no libcuda among the program's needs.
dist_check_SCRIPTS += t/gpu/bench.sh
TESTS += t/gpu/bench.sh

## The GPU machine's preparation and its one command (doc/gpu-testing.md).
EXTRA_DIST += bench/prepare-gpu-carry.sh bench/gpu-session.sh bench/bert-sync-ratio.sh
