## examples/util/local.mk - what hvd's programs share about their command
## line (cli.c: the "PROG: " lines, usage errors, option numbers), as a
## static library built here only, for examples/bert_train,
## examples/cifar_train and bin/hvd-bench. Included by Makefile.am after
## examples/bert/local.mk (which starts noinst_LIBRARIES).
##
## A program using it:
##   prog_CPPFLAGS = ... $(CLI_CPPFLAGS)
##   prog_LDADD = $(CLI_LIBS) ...

noinst_LIBRARIES += examples/util/libcli.a
examples_util_libcli_a_SOURCES = examples/util/cli.c examples/util/cli.h
CLI_CPPFLAGS = -I$(top_srcdir)/examples/util
CLI_LIBS = examples/util/libcli.a
