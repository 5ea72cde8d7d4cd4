## examples/cnn/local.mk - the residual CNN of examples/cifar_train
## (examples/cnn/cnn.c: im2col + BLAS convolutions, hvd's synchronized
## batch norm) and the program itself, built when configure found a CBLAS
## (HAVE_BLAS). It borrows bert_set_threads from examples/bert's library.
## Included by Makefile.am after examples/bert/local.mk; its tests
## (t/mpi/cnn_grad, t/mpi/cifar_train.sh) are in t/mpi/local.mk.

CNN_CPPFLAGS = -I$(top_srcdir)/examples/cnn $(BERT_CPPFLAGS)
CNN_LIBS = examples/cnn/libcnn.a $(BERT_LIBS)
if HAVE_BLAS
noinst_LIBRARIES += examples/cnn/libcnn.a
examples_cnn_libcnn_a_SOURCES = examples/cnn/cnn.c examples/cnn/cnn.h \
	examples/cnn/cnn_impl.h
examples_cnn_libcnn_a_CPPFLAGS = $(HVD_CPPFLAGS)
noinst_PROGRAMS += examples/cifar_train
examples_cifar_train_SOURCES = examples/cifar_train.c
examples_cifar_train_CPPFLAGS = $(HVD_PROG_CPPFLAGS) $(CNN_CPPFLAGS) \
	$(CLI_CPPFLAGS)
examples_cifar_train_LDFLAGS = $(HVD_LDFLAGS) $(BERT_LINK_OPTS)
examples_cifar_train_LDADD = $(CNN_LIBS) $(CLI_LIBS) $(HVD_PROG_LDADD)
endif

## The GPU backend (cnn_cuda.cu; cnn.c says "no CUDA" without it), built
## by examples/bert/local.mk's .cu.o rule into a plain object.
if HAVE_BLAS
if HAVE_CUDA
examples_cnn_libcnn_a_SOURCES += examples/cnn/cnn_cuda.cu
endif
endif
examples/cnn/cnn_cuda.o: examples/cnn/cnn.h examples/cnn/cnn_impl.h config.h
