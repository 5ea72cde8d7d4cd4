## examples/bert_train.mk - the BERT pretraining example (examples/
## bert_train.c, manual in doc/bert_train.md) and its end-to-end test.
## Included by Makefile.am right after examples/bert/local.mk (BERT_CPPFLAGS,
## BERT_LIBS); the test follows t/local.mk's conventions for shell tests
## (listed in EXTRA_DIST, as dist_check_SCRIPTS is only defined there).

noinst_PROGRAMS += examples/bert_train
examples_bert_train_SOURCES = examples/bert_train.c
examples_bert_train_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(BERT_CPPFLAGS)
examples_bert_train_LDFLAGS = $(AM_LDFLAGS) $(BERT_LINK_OPTS)
examples_bert_train_LDADD = $(BERT_LIBS) $(HVD_PROG_LDADD)

## Loss falls at np 1 and 2; np 1/2/4 agree step by step on one global
## batch; resume continues the curve (same and other world size); bad
## --data and bad command lines fail cleanly.
EXTRA_DIST += t/mpi/bert_train.sh
TESTS += t/mpi/bert_train.sh

## bench/bert-sync-ratio.sh: its output and its errors (not the speed).
EXTRA_DIST += t/mpi/bert_sync_ratio.sh
TESTS += t/mpi/bert_sync_ratio.sh
