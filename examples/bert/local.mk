## examples/bert/local.mk - the BERT masked-language model of
## examples/bert_train (model, kernels, tokenizer, data), as a static
## library built here only, and its unit tests. Included by Makefile.am
## before t/local.mk, so the tests are added to TESTS directly (the
## UNIT_TESTS list is defined there) with their own stub rule.
##
## A program using it:
##   prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(BERT_CPPFLAGS)
##   prog_LDADD = $(BERT_LIBS) $(HVD_PROG_LDADD)

noinst_LIBRARIES = examples/bert/libbert.a
examples_bert_libbert_a_SOURCES = \
	examples/bert/util.c examples/bert/util.h \
	examples/bert/layers.c examples/bert/layers.h \
	examples/bert/model.c examples/bert/model.h \
	examples/bert/tokenizer.c examples/bert/tokenizer.h \
	examples/bert/data.c examples/bert/data.h
examples_bert_libbert_a_CPPFLAGS = $(AM_CPPFLAGS)

## The GPU backend (layers_cuda.cu; layers.c says "no CUDA" without it),
## compiled by nvcc like lib/ops/*.cu (Makefile.am: NVCC_GENCODE,
## -fmad=false, build-aux/nvcc-wrapper), into a plain object: libbert.a is
## not a libtool library.
if HAVE_CUDA
examples_bert_libbert_a_SOURCES += examples/bert/layers_cuda.cu
endif
.cu.o:
	$(AM_V_NVCC)$(NVCC_WRAPPER) $(NVCC) $(NVCC_GENCODE) $(AM_NVCCFLAGS) \
	  $(NVCCFLAGS) -- $(DEFS) $(DEFAULT_INCLUDES) $(INCLUDES) \
	  $(AM_CPPFLAGS) -I$(top_srcdir)/examples/bert $(CUDA_CPPFLAGS) \
	  $(CPPFLAGS) $(AM_CFLAGS) $(CFLAGS) -c -o $@ $<
examples/bert/layers_cuda.o: examples/bert/layers.h config.h

## The same model in PyTorch eager, for throughput comparisons
## (doc/bert_train.md, "Against PyTorch eager"); not built.
EXTRA_DIST += examples/bert/torch_bert.py

BERT_CPPFLAGS = -I$(top_srcdir)/examples/bert
## A program using it links the CUDA runtime and cuBLAS too in a CUDA
## build (empty otherwise): prog_LDFLAGS = ... $(BERT_LINK_OPTS).
BERT_LIBS = examples/bert/libbert.a $(BLAS_LIBS) $(CUDA_LIBS) -lm
BERT_LINK_OPTS = $(CUDA_LDFLAGS)

BERT_UNIT_TESTS = t/unit/bert_grad.t t/unit/bert_data.t
check_PROGRAMS += t/unit/bert_grad t/unit/bert_data
TESTS += $(BERT_UNIT_TESTS)
CLEANFILES += $(BERT_UNIT_TESTS)
$(BERT_UNIT_TESTS):
	$(AM_V_GEN)$(MKDIR_P) $(@D) && echo '# run by t/mpirun-test' > $@

t_unit_bert_grad_SOURCES = t/unit/bert_grad.c
t_unit_bert_grad_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_bert_grad_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_bert_grad_LDADD = $(BERT_LIBS) $(TEST_LDADD)
t_unit_bert_data_SOURCES = t/unit/bert_data.c
t_unit_bert_data_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_bert_data_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_bert_data_LDADD = $(BERT_LIBS) $(TEST_LDADD)
