## bench/local.mk - hvd-bench, the benchmark and correctness sweep of hvd's
## collectives (doc/bench.md). Included by Makefile.am.
##
##   mpirun -np 2 bin/hvd-bench sweep | list --tensors FILE | latency
##   mpirun -np 2 bin/hvd-bench mpi-list --tensors FILE  (raw MPI, no hvd)
##   bench/allreduce-ratio.sh  (list and mpi-list alternating: the ratios)
##   bench/cluster-ratio.sh    (the same across hosts of network namespaces)
##   bench/powersgd-link.sh    (bert_train with PowerSGD and without, over a slow link)
##   mpirun -np 2 bin/hvd-bench overlap | optim --tensors FILE
##   bin/hvd-bench --quick     (exit status 0: every result was right)
##   bin/hvd-bench staged | list --device gpu --tensors FILE
##   bin/hvd-bench-kernels gpu-pack
##                             (on a GPU; without one: "# SKIP ...", exit 0)
##
## The installed hvd-bench links libhvd.so like any user program. The
## modes that time libhvd's internal kernels (gpu-pack, and the "kernels
## alone" row of list --device gpu: hvd__cuda_pack/unpack, which libhvd.so
## does not export) are in bin/hvd-bench-kernels alone: the same sources
## built with HVD_BENCH_KERNELS and linked with libhvd.a (-static), not
## installed. Only the CUDA runtime is linked, never the driver library
## (libcuda).

HVD_BENCH_SOURCES = \
	bin/hvd-bench.c \
	bin/bench.h \
	bin/bench_util.c \
	bin/bench_sweep.c \
	bin/bench_list.c \
	bin/bench_latency.c bin/bench_overlap.c bin/bench_optim.c \
	bin/bench_gpu.c
## The workloads, installed for --tensors NAME (bench/workloads in a build
## that is not installed).
workloadsdir = $(pkgdatadir)/workloads
workloads_DATA = bench/workloads/bert-tiny.tensors \
	bench/workloads/bert-mini.tensors bench/workloads/bert-base.tensors \
	bench/workloads/bert-large.tensors
HVD_BENCH_DIRS = -DHVD_WORKLOADS_DIR='"$(workloadsdir)"' \
	-DHVD_SRC_WORKLOADS_DIR='"$(abs_top_srcdir)/bench/workloads"'
bin_PROGRAMS += bin/hvd-bench
bin_hvd_bench_SOURCES = $(HVD_BENCH_SOURCES)
bin_hvd_bench_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(CUDA_CPPFLAGS) $(HVD_BENCH_DIRS) \
	$(CLI_CPPFLAGS)
bin_hvd_bench_LDFLAGS = $(HVD_LDFLAGS) $(CUDA_LDFLAGS)
bin_hvd_bench_LDADD = $(CLI_LIBS) $(HVD_PROG_LDADD) $(CUDA_LIBS)

noinst_PROGRAMS += bin/hvd-bench-kernels
bin_hvd_bench_kernels_SOURCES = $(HVD_BENCH_SOURCES)
bin_hvd_bench_kernels_CPPFLAGS = $(bin_hvd_bench_CPPFLAGS) -DHVD_BENCH_KERNELS
bin_hvd_bench_kernels_LDFLAGS = $(HVD_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
bin_hvd_bench_kernels_LDADD = $(CLI_LIBS) $(HVD_PROG_LDADD) $(NCCL_LIBS) \
	$(CUDA_LIBS)

## bench/bert-ops: the time of each kernel entry an encoder layer of
## bert_train calls on the GPU, at one batch shape (bench/bert_ops.c;
## "# SKIP" without a GPU). Not installed; gpu-session.sh's bert stage
## runs it.
if HAVE_BLAS
noinst_PROGRAMS += bench/bert-ops
bench_bert_ops_SOURCES = bench/bert_ops.c
bench_bert_ops_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(BERT_CPPFLAGS)
bench_bert_ops_LDFLAGS = $(HVD_LDFLAGS) $(BERT_LINK_OPTS)
bench_bert_ops_LDADD = $(BERT_LIBS) $(HVD_PROG_LDADD)
endif

## bench/ckpt-async: what a checkpoint blocks the training loop for, saved
## in the caller against in the background (bench/ckpt-async.c; doc/bench.md,
## "Checkpoints in the background"). Built, not installed:
##   mpirun -np 2 bench/ckpt-async DIR [ROUNDS]
noinst_PROGRAMS += bench/ckpt-async
bench_ckpt_async_SOURCES = bench/ckpt-async.c
bench_ckpt_async_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
bench_ckpt_async_LDADD = $(HVD_PROG_LDADD)

## The GPU machine's preparation and its one command (doc/gpu-testing.md).
EXTRA_DIST += bench/prepare-gpu-carry.sh bench/gpu-session.sh bench/bert-sync-ratio.sh \
	bench/allreduce-ratio.sh bench/zero-copy-probe.c bench/ratio-summary.sh \
	bench/cluster-ratio.sh bench/burst.c bench/adasum.c bench/powersgd-link.sh

## bert_train against PyTorch DDP on the CPU (doc/bench.md, "hvd vs PyTorch
## DDP on CPU"): the corpus generator, the DDP trainer, the alternating
## runner. Not built; the trainer needs python3 with torch.
EXTRA_DIST += bench/make-corpus.py bench/ddp_bert.py bench/ddp-vs-hvd.sh
