## bench/local.mk - hvd-bench, the benchmark and correctness sweep of hvd's
## collectives (doc/bench.md). Included by Makefile.am.
##
##   mpirun -np 2 bin/hvd-bench sweep | list --tensors FILE | latency
##   mpirun -np 2 bin/hvd-bench overlap | optim --tensors FILE
##   bin/hvd-bench --quick     (exit status 0: every result was right)

bin_PROGRAMS += bin/hvd-bench
bin_hvd_bench_SOURCES = \
	bin/hvd-bench.c \
	bin/bench.h \
	bin/bench_util.c \
	bin/bench_sweep.c \
	bin/bench_list.c \
	bin/bench_latency.c bin/bench_overlap.c bin/bench_optim.c
bin_hvd_bench_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
bin_hvd_bench_LDADD = $(HVD_PROG_LDADD)
