## t/gpu/local.mk - the GPU tests (doc/gpu-testing.md: how to run them on
## a machine with a GPU). Conventions in t/local.mk; included by
## Makefile.am. Each test says "1..0 # SKIP no CUDA device: WHY" when
## cudaGetDeviceCount finds none (or fails: no driver), and in a build
## without CUDA, where its programs are built as stubs that only skip.

## Every device kernel (lib/ops/cuda_kernels.cu) against the host kernel
## it mirrors, on random data. -static links libhvd.a, whose hvd__*
## internals the test calls (libhvd.so exports hvd_* only).
check_PROGRAMS += t/gpu/kernels
UNIT_TESTS += t/gpu/kernels.t
t_gpu_kernels_SOURCES = t/gpu/kernels.c
t_gpu_kernels_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_kernels_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS)
t_gpu_kernels_LDADD = $(TEST_LDADD) $(CUDA_LIBS)

## hvd_init's GPU binding: binding.sh runs t/gpu/binding (not a test
## itself) on 1 and 2 ranks, with one GPU visible and with all.
check_PROGRAMS += t/gpu/binding
t_gpu_binding_SOURCES = t/gpu/binding.c
t_gpu_binding_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_binding_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_gpu_binding_LDADD = $(TEST_LDADD) $(CUDA_LIBS)
dist_check_SCRIPTS += t/gpu/binding.sh
TESTS += t/gpu/binding.sh

## Every collective on device tensors through each device executor (NCCL
## at np 1, and at np N with N GPUs; host-staged MPI at every np, ranks
## sharing a GPU), against exact host expectations. -static: the test
## calls hvd__allreduce_wire_async (compression), an internal of libhvd.a.
check_PROGRAMS += t/gpu/collectives
t_gpu_collectives_SOURCES = t/gpu/collectives.c
t_gpu_collectives_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_collectives_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_gpu_collectives_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
NP_TESTS += t/gpu/collectives.np1 t/gpu/collectives.np2 \
	t/gpu/collectives.np4

## The optimizer stack on device parameters (lib/optim) against the same
## on host parameters: plain optimizers (parity, custom state, zero_grad,
## refusals), then per device executor the distributed optimizer,
## parameter and state broadcast, checkpoints between GPU and CPU.
check_PROGRAMS += t/gpu/optim
t_gpu_optim_SOURCES = t/gpu/optim.c
t_gpu_optim_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_optim_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_gpu_optim_LDADD = $(TEST_LDADD) $(CUDA_LIBS)
NP_TESTS += t/gpu/optim.np1 t/gpu/optim.np2 t/gpu/optim.np4

## The BERT example's GPU backend (examples/bert/layers_cuda.cu): every
## layer against the CPU's, and the whole model on the GPU against the
## CPU model (loss, gradients, gradient-ready calls, SGD steps).
check_PROGRAMS += t/gpu/bert_layers
UNIT_TESTS += t/gpu/bert_layers.t
t_gpu_bert_layers_SOURCES = t/gpu/bert_layers.c
t_gpu_bert_layers_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_bert_layers_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_gpu_bert_layers_LDADD = $(BERT_LIBS) $(TEST_LDADD)

## examples/bert_train --device gpu: a clean failure (exit 1, one line)
## without CUDA in the build or without a GPU; a short run with one.
dist_check_SCRIPTS += t/gpu/bert_device.sh
TESTS += t/gpu/bert_device.sh
