## examples/bert/local.mk - the BERT masked-language model of
## examples/bert_train (model, kernels, tokenizer, data), as a static
## library built here only, when configure found a CBLAS (HAVE_BLAS; its
## tests are in t/unit/local.mk and t/gpu/local.mk). Included by
## Makefile.am.
##
## A program using it:
##   prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(BERT_CPPFLAGS)
##   prog_LDADD = $(BERT_LIBS) $(HVD_PROG_LDADD)

noinst_LIBRARIES =
if HAVE_BLAS
noinst_LIBRARIES += examples/bert/libbert.a
examples_bert_libbert_a_SOURCES = \
	examples/bert/util.c examples/bert/util.h \
	examples/bert/layers.c examples/bert/layers.h \
	examples/bert/layers_lp.c \
	examples/bert/model.c examples/bert/model.h \
	examples/bert/tokenizer.c examples/bert/tokenizer.h \
	examples/bert/data.c examples/bert/data.h
examples_bert_libbert_a_CPPFLAGS = $(HVD_CPPFLAGS)
endif

## The GPU backend (layers_cuda.cu; layers.c says "no CUDA" without it;
## the rule serves examples/cnn/cnn_cuda.cu too),
## compiled by nvcc like lib/ops/*.cu (Makefile.am: NVCC_GENCODE,
## -fmad=false, build-aux/nvcc-wrapper), into a plain object: libbert.a is
## not a libtool library.
if HAVE_BLAS
if HAVE_CUDA
examples_bert_libbert_a_SOURCES += examples/bert/layers_cuda.cu
endif
endif
.cu.o:
	$(AM_V_NVCC)$(NVCC_WRAPPER) $(NVCC) $(NVCC_GENCODE) $(AM_NVCCFLAGS) \
	  $(NVCCFLAGS) -- $(DEFS) $(DEFAULT_INCLUDES) $(INCLUDES) \
	  $(HVD_CPPFLAGS) -I$(top_srcdir)/examples/bert \
	  -I$(top_srcdir)/examples/cnn $(CUDA_CPPFLAGS) \
	  $(CPPFLAGS) $(AM_CFLAGS) $(CFLAGS) -c -o $@ $<
examples/bert/layers_cuda.o: examples/bert/layers.h examples/bert/flash_mma.h \
	examples/bert/softmax_rows.h config.h

## The same model in PyTorch eager, for throughput comparisons
## (doc/bert_train.md, "Against PyTorch eager"); not built.
EXTRA_DIST += examples/bert/torch_bert.py

BERT_CPPFLAGS = -I$(top_srcdir)/examples/bert
## A program using it links cuBLAS and the CUDA runtime too in a CUDA
## build (empty otherwise): prog_LDFLAGS = ... $(BERT_LINK_OPTS). Only
## the model uses cuBLAS; libhvd does not link it.
BERT_LIBS = examples/bert/libbert.a $(BLAS_LIBS) $(CUBLAS_LIBS) $(CUDA_LIBS) -lm
BERT_LINK_OPTS = $(CUDA_LDFLAGS)
