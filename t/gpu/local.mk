## t/gpu/local.mk - the GPU tests (doc/gpu-testing.md: how to run them on
## a machine with a GPU), the one place they are registered (conventions
## in t/local.mk). Each test says "1..0 # SKIP no CUDA device: WHY" when
## cudaGetDeviceCount finds none (or fails: no driver), and in a build
## without CUDA, where its programs are built as stubs that only skip.
## t/standin/local.mk builds the same sources against a host stand-in.
##
##  kernels      every device kernel (lib/ops/cuda_kernels.cu,
##               lib/optim/optim_kernels.cu) against the host code it
##               mirrors, on random data; -static links libhvd.a, whose
##               hvd__* internals it calls (libhvd.so exports hvd_* only)
##  binding      hvd_init's GPU binding (not a test itself: binding.sh runs
##               it on 1 and 2 ranks, with one GPU visible and with all)
##  collectives  every collective on device tensors through each device
##               executor (NCCL at np 1, and at np N with N GPUs;
##               host-staged MPI at every np, ranks sharing a GPU) against
##               exact host expectations, and a process set's device
##               allreduce beside the world's (a subset communicator);
##               -static: it calls hvd__allreduce_wire_async (compression)
##  optim        the optimizer stack on device parameters (lib/optim)
##               against the same on host parameters: plain optimizers,
##               then per device executor the distributed optimizer,
##               parameter and state broadcast, checkpoints between GPU
##               and CPU; synchronized batch norm on device tensors against
##               the same on host tensors
##  bert_layers  examples/bert's GPU backend (layers_cuda.cu): every layer
##               against the CPU's, and the whole model (with a CBLAS only)
##  cnn          examples/cnn's GPU backend (cnn_cuda.cu) against its CPU
##               model (with a CBLAS only), sync and per-rank batch norm:
##               forward, backward, eval, three distributed SGD steps
##  soak.sh      the soak (t/soak/soak.c built with SOAK_CUDA as t/gpu/soak)
##               with its tensors on the GPU, all or half of them, at np
##               2-4, every rank on one GPU (HVD_GPU_SHARE=1, NCCL over
##               sockets)
##  optim_soak.sh  the optimizer soak (t/soak/optim_soak.c built with
##               SOAK_CUDA as t/gpu/optim_soak), about half of each random
##               configuration's parameters on the GPU, at np 1 and at np 2
##               on one GPU (HVD_GPU_SHARE=1)
##  bench.sh     hvd-bench's GPU modes: the skip line without a GPU, a
##               small real run with one; bad arguments exit 2; no libcuda
##               among the program's needs
##  bert_device.sh  examples/bert_train --device gpu: a clean failure
##               (exit 1, one line) without CUDA or a GPU; a short run with
##               one
##  cifar_device.sh  examples/cifar_train --device gpu: the same, and on a
##               GPU 5 steps whose losses follow the CPU's

check_PROGRAMS += t/gpu/kernels t/gpu/binding t/gpu/collectives t/gpu/optim
UNIT_TESTS += t/gpu/kernels.t
NP_TESTS += t/gpu/collectives.np1 t/gpu/collectives.np2 \
	t/gpu/collectives.np4 t/gpu/optim.np1 t/gpu/optim.np2 t/gpu/optim.np4
## share.sh: the multi-rank programs with every rank on one GPU and
## HVD_GPU_SHARE=1, their NCCL pass included (NCCL over sockets).
TESTS_SH += t/gpu/binding.sh t/gpu/bench.sh t/gpu/bert_device.sh \
	t/gpu/share.sh t/gpu/soak.sh
check_PROGRAMS += t/gpu/soak
t_gpu_soak_SOURCES = t/soak/soak.c
t_gpu_soak_CPPFLAGS = $(GPU_TEST_CPPFLAGS) -DSOAK_CUDA
t_gpu_soak_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_gpu_soak_LDADD = $(TEST_LDADD) $(CUDA_LIBS)
TESTS_SH += t/gpu/optim_soak.sh
check_PROGRAMS += t/gpu/optim_soak
t_gpu_optim_soak_SOURCES = t/soak/optim_soak.c
t_gpu_optim_soak_CPPFLAGS = $(GPU_TEST_CPPFLAGS) -DSOAK_CUDA
t_gpu_optim_soak_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_gpu_optim_soak_LDADD = $(TEST_LDADD) $(CUDA_LIBS)

GPU_TEST_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_gpu_kernels_CPPFLAGS = $(GPU_TEST_CPPFLAGS)
t_gpu_kernels_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS)
t_gpu_kernels_LDADD = $(TEST_LDADD) $(CUDA_LIBS)
t_gpu_binding_CPPFLAGS = $(GPU_TEST_CPPFLAGS)
## -export-dynamic: binding.c's cudaMalloc (binding oom's fault) is found
## before libcudart's, by libhvd's calls too
t_gpu_binding_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS) -export-dynamic
t_gpu_binding_LDADD = $(TEST_LDADD) $(CUDA_LIBS) -ldl
t_gpu_collectives_CPPFLAGS = $(GPU_TEST_CPPFLAGS)
t_gpu_collectives_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_gpu_collectives_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_gpu_optim_CPPFLAGS = $(GPU_TEST_CPPFLAGS)
t_gpu_optim_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_gpu_optim_LDADD = $(TEST_LDADD) $(CUDA_LIBS)

if HAVE_BLAS
check_PROGRAMS += t/gpu/bert_layers
UNIT_TESTS += t/gpu/bert_layers.t
t_gpu_bert_layers_CPPFLAGS = $(GPU_TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_gpu_bert_layers_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_gpu_bert_layers_LDADD = $(BERT_LIBS) $(TEST_LDADD)
check_PROGRAMS += t/gpu/cnn
NP_TESTS += t/gpu/cnn.np1 t/gpu/cnn.np2
TESTS_SH += t/gpu/cifar_device.sh
t_gpu_cnn_CPPFLAGS = $(GPU_TEST_CPPFLAGS) $(CNN_CPPFLAGS)
t_gpu_cnn_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_gpu_cnn_LDADD = $(CNN_LIBS) $(TEST_LDADD)
endif
