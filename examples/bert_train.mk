## examples/bert_train.mk - the BERT pretraining example (examples/
## bert_train.c, manual in doc/bert_train.md), built when configure found
## a CBLAS (HAVE_BLAS). Included by Makefile.am right after
## examples/bert/local.mk (BERT_CPPFLAGS, BERT_LIBS). Its tests
## (t/mpi/bert_train.sh, bert_sync_ratio.sh) are in t/mpi/local.mk.

if HAVE_BLAS
noinst_PROGRAMS += examples/bert_train
examples_bert_train_SOURCES = examples/bert_train.c
examples_bert_train_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(BERT_CPPFLAGS) \
	$(CLI_CPPFLAGS)
examples_bert_train_LDFLAGS = $(HVD_LDFLAGS) $(BERT_LINK_OPTS)
examples_bert_train_LDADD = $(BERT_LIBS) $(CLI_LIBS) $(HVD_PROG_LDADD)
endif
