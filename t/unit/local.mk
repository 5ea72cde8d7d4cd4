## t/unit/local.mk - single-process tests (conventions in t/local.mk).
##  errors   results, strings, tensors, the build, the version, the JSON
##           escaper, every call before hvd_init
##  taplib   the TAP library itself (links only it)
##  host_mem hvd_alloc_host / hvd_free_host: the shared arena; built again
##           as host_mem_private (HVD_HOST_ARENA=0: private huge pages)
##  settings the HVD_* values without hvd_init: each kind's parser
##           (hvd_setting_check), hvd_setting_unknown's suggestions,
##           HVD_HOST_ARENA as hvd_alloc_host reads it
##  sampler  the distributed sampler
##  timeline_json  the tests' timeline reader (t/util/hvdtest.c): JSON
##           with its keys in any order, unknown keys, escapes, no "]"
##  timeline_file  lib/core/timeline.c's file, read by python3: valid
##           JSON after every flush of a full buffer, never past
##           HVD_TIMELINE_MAX_BYTES (one TIMELINE_CAP at every cap; caps
##           too small refused), names not UTF-8, a failed write cut back
##           to valid JSON with one warning (linked statically); also the
##           program of timeline_fs.sh: a kill at each write of a flush
##           (strace) leaves valid JSON
##  optim    the plain optimizers (lib/optim): SGD and Adam/AdamW against
##           torch.optim's formulas, custom ops and their state, the
##           validation messages; CUDA flags only to count the GPUs (the
##           messages refusing a device parameter depend on it)
##  checksum lib/base/checksum.h's sum: its definition, pieces, every
##           single-bit change (linked statically: not exported)
##  ranks    lib/base/errors.h's list of disagreeing ranks in mismatch
##           messages: exact text, eight named then a count, cut at the
##           buffer; a list of ranks alone (linked statically)
##  rows_total  lib/base/tensor.h's sum of the ranks' rows that sizes an
##           allgather's or alltoall's output, at its exact limits
##           (linked statically)
##  message  the negotiation's wire codec: a descriptor goes through
##           whole, one with an enum or a group's size or index out of
##           range is refused; a response list with a count below 0 or
##           past its bytes, or a kind out of range, is malformed (linked
##           statically: the codec is not exported)
##  autotune lib/core/autotune.c's tuner fed bursts by hand: the defaults
##           it compares with are the untuned run's (HVD_CHUNK_SIZE=0
##           carried as 0, HVD_CYCLE_TIME below 1 us as 1 us), in its
##           parameters and its log; a log write that fails is one
##           warning (linked statically)
##  stall    lib/core/stall.c's messages on 200 ranks: eight of each list
##           named, then ", and N more ranks" (linked statically)
##  bert_grad, bert_data  examples/bert's model gradients and data (with
##           a CBLAS only, as examples/bert is)
##  bert_mixed  examples/bert in bfloat16 and float16 on the CPU: the
##           conversions, the rules of layers.h's "Precisions" exactly,
##           the model and 40 AdamW steps against float32
##  flash_simt  examples/bert/flash_mma.h's CUDA kernels, their own source,
##           run on the CPU (t/unit/simt.h: a coroutine per lane, the PTX
##           fragment layouts) against the CPU's attention (C++: the
##           kernels are templates)
##  softmax_simt  examples/bert/softmax_rows.h's CUDA kernels (the
##           attention's row softmaxes in registers) the same way, bit for
##           bit against a model of the loop kernels they replace

check_PROGRAMS += t/unit/errors t/unit/taplib t/unit/sampler t/unit/optim \
	t/unit/host_mem t/unit/host_mem_private t/unit/timeline_json \
	t/unit/message t/unit/checksum t/unit/ranks t/unit/settings \
	t/unit/rows_total t/unit/timeline_file t/unit/autotune t/unit/stall
UNIT_TESTS += t/unit/errors.t t/unit/taplib.t t/unit/sampler.t \
	t/unit/optim.t t/unit/host_mem.t t/unit/host_mem_private.t \
	t/unit/timeline_json.t t/unit/message.t t/unit/checksum.t \
	t/unit/ranks.t t/unit/settings.t t/unit/rows_total.t \
	t/unit/timeline_file.t t/unit/autotune.t t/unit/stall.t
t_unit_message_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_message_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_message_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_checksum_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_checksum_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_checksum_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_ranks_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_ranks_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_ranks_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_rows_total_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_rows_total_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_rows_total_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_timeline_file_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_timeline_file_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_timeline_file_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_autotune_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_autotune_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_autotune_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
t_unit_stall_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_unit_stall_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_unit_stall_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
TESTS_SH += t/unit/timeline_fs.sh
t_unit_host_mem_private_SOURCES = t/unit/host_mem.c
t_unit_host_mem_private_CPPFLAGS = $(TEST_CPPFLAGS) -DHOST_MEM_PRIVATE
t_unit_taplib_LDADD = t/tap/libtap.la $(MPI_LIBS)
t_unit_optim_CPPFLAGS = $(TEST_CPPFLAGS) $(CUDA_CPPFLAGS)
t_unit_optim_LDFLAGS = $(TEST_LDFLAGS) $(CUDA_LDFLAGS)
t_unit_optim_LDADD = $(TEST_LDADD) $(CUDA_LIBS)

if HAVE_BLAS
check_PROGRAMS += t/unit/bert_grad t/unit/bert_data t/unit/bert_mixed
UNIT_TESTS += t/unit/bert_grad.t t/unit/bert_data.t t/unit/bert_mixed.t
t_unit_bert_grad_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_bert_grad_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_bert_grad_LDADD = $(BERT_LIBS) $(TEST_LDADD)
t_unit_bert_data_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_bert_data_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_bert_data_LDADD = $(BERT_LIBS) $(TEST_LDADD)
t_unit_bert_mixed_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_bert_mixed_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_bert_mixed_LDADD = $(BERT_LIBS) $(TEST_LDADD)
check_PROGRAMS += t/unit/flash_simt
UNIT_TESTS += t/unit/flash_simt.t
t_unit_flash_simt_SOURCES = t/unit/flash_simt.cc t/unit/simt.h \
	examples/bert/flash_mma.h
t_unit_flash_simt_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_flash_simt_CXXFLAGS = -Wall -Wextra
t_unit_flash_simt_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_flash_simt_LDADD = $(BERT_LIBS) $(TEST_LDADD)
check_PROGRAMS += t/unit/softmax_simt
UNIT_TESTS += t/unit/softmax_simt.t
t_unit_softmax_simt_SOURCES = t/unit/softmax_simt.cc t/unit/simt.h \
	examples/bert/softmax_rows.h examples/bert/flash_mma.h
t_unit_softmax_simt_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_unit_softmax_simt_CXXFLAGS = -Wall -Wextra
t_unit_softmax_simt_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_unit_softmax_simt_LDADD = $(BERT_LIBS) $(TEST_LDADD)
endif
