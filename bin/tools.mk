## bin/tools.mk - the user tools: hvdrun, the launcher (a script made by
## configure from bin/hvdrun.in), and hvd-info, which prints the build's
## backends and the effective HVD_* settings. Included by Makefile.am.
##
##   hvdrun -np 4 ./train          hvdrun --dry-run -np 4 ./train
##   hvd-info [--build] [--json]
##   hvd-plot [-o loss.svg] train.jsonl   (a loss curve as an SVG chart)
##   hvd-timeline-merge -o all.json tl.0.json tl.1.json   (one trace)

## (Makefile.am defines neither variable; the first definition is here.)
bin_SCRIPTS = bin/hvdrun
dist_man1_MANS = doc/hvdrun.1 doc/hvd-info.1 doc/hvd-bench.1 doc/hvd-plot.1

bin_PROGRAMS += bin/hvd-info
bin_hvd_info_SOURCES = bin/hvd-info.c
bin_hvd_info_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(CUDA_CPPFLAGS)
bin_hvd_info_LDFLAGS = $(HVD_LDFLAGS) $(CUDA_LDFLAGS)
bin_hvd_info_LDADD = $(HVD_PROG_LDADD)
if HAVE_CUDA
## cudaGetDeviceCount, for the GPUs visible.
bin_hvd_info_LDADD += -lcudart
endif

bin_PROGRAMS += bin/hvd-plot
bin_hvd_plot_SOURCES = bin/hvd-plot.c
bin_hvd_plot_LDADD = -lm

bin_PROGRAMS += bin/hvd-timeline-merge
bin_hvd_timeline_merge_SOURCES = bin/hvd-timeline-merge.c
