## t/mpi/local.mk - multi-rank tests (conventions in t/local.mk), the one
## place they are registered. Every program below builds from
## t/mpi/NAME.c with the default flags unless its variables say otherwise.

## The collectives and the engine:
##  collectives  every collective, dtype and op against exact values
##  order        per-rank random submission orders
##  cache        the response cache: shapes and dtypes changing under one
##               name, eviction (HVD_CACHE_CAPACITY=4), no cache, a
##               mismatch on a cached name
##  fusion       mixed bursts under HVD_CHUNK_SIZE x HVD_FUSION_THRESHOLD,
##               every op, scaling, in and out of place; join
##  hierarchical HVD_HIERARCHICAL_ALLREDUCE=1 on nodes simulated by
##               HVD_HOSTNAME
##  settings     malformed HVD_* values: hvd_init fails with the message
##  host_mem     collectives on hvd_alloc_host memory mixed with malloc'd
##               tensors; freed and allocated again; shutdown in flight
##  zero_copy    the zero-copy allreduce: which groups take it (rank 0's
##               timeline) and exact results, on one node and two
##  objects      hvd_broadcast_object / hvd_allgather_object: sizes unknown
##               to the receivers, every root, empty, errors
##  grouped      grouped allreduce/allgather/reducescatter: exact, fused
##               (timeline), a cached name in a group, a group on one rank
##               only, errors
##  process_sets collectives on disjoint and overlapping subsets beside the
##               world's, outsiders, mismatches named by world ranks,
##               destroy in flight, shutdown with sets
##  process_set_split hvd_process_set_split by color (ids, members,
##               collectives, refusals named on every rank) and by node,
##               on one machine and on nodes simulated by HVD_HOSTNAME
##  reproducible every host allreduce and reducescatter folds each element
##               in rank order (per node, then node order, for 2 nodes),
##               bit for bit, however the bursts are fused: slots, zero
##               copy, no fusion, MPI, hierarchical, autotune
##  node_order   nodes in a mirror layout (A B C C B A): every local rank
##               orders the nodes alike (cross rank = node index), and the
##               bits do not move with the pieces or the fusion
##  overlap      an allreduce output that overlaps its input without being
##               it (alone, grouped, in a set) refused with its message;
##               exact in place still sums exactly
##  fused_gather_scatter host allgathers fused into one MPI_Allgatherv,
##               reducescatters into one MPI_Reduce_scatter: dtypes, shapes,
##               rows, ops and scaling mixed; new, cached and mixed; grouped
##               ones run as one (timeline)
##  gather_rows  allgather and alltoall outputs whose rows, summed over
##               the ranks (0-byte rows), reach INT64_MAX and pass it:
##               refused on every rank, naming the tensor (and the rank)
##  threads      the API from several threads at once: submitters at their
##               own pace, waits on another thread, errors per thread,
##               process sets each on a thread, the arena, the timeline,
##               shutdown with threads waiting
##  fork         a child forked after hvd_init: queries answer, every call
##               that communicates fails at once naming the fork, its exit
##               leaves MPI and the rank's end record alone (fork.sh: with
##               HVD_END_DIR), the parent's arena and timeline untouched
##  thread_level MPI initialised by the program below MPI_THREAD_MULTIPLE:
##               hvd_init and hvd_init_comm refuse, naming the level
##               (thread_level.sh)
##  finalize     a program that owns MPI ends with MPI_Finalize and no
##               hvd_shutdown: hvd shuts down inside it, a waiter ends
##               with HVD_ERR_SHUTDOWN
##  dlclose      libhvd loaded with dlopen and closed with dlclose, after
##               hvd_shutdown and with hvd running: it stays mapped (-z
##               nodelete), so a fork and MPI_Finalize find its code
check_PROGRAMS += t/mpi/collectives t/mpi/order t/mpi/cache t/mpi/fusion \
	t/mpi/hierarchical t/mpi/settings t/mpi/host_mem t/mpi/zero_copy \
	t/mpi/objects t/mpi/grouped t/mpi/process_sets t/mpi/process_set_split \
	t/mpi/fused_gather_scatter t/mpi/reproducible t/mpi/threads t/mpi/fork \
	t/mpi/thread_level t/mpi/finalize t/mpi/dlclose t/mpi/gather_rows \
	t/mpi/node_order t/mpi/overlap
NP_TESTS += t/mpi/collectives.np1 t/mpi/collectives.np2 \
	t/mpi/collectives.np3 t/mpi/collectives.np4 \
	t/mpi/order.np1 t/mpi/order.np2 t/mpi/order.np3 t/mpi/order.np4 \
	t/mpi/cache.np1 t/mpi/cache.np2 t/mpi/cache.np3 t/mpi/cache.np4 \
	t/mpi/fusion.np1 t/mpi/fusion.np2 t/mpi/fusion.np3 t/mpi/fusion.np4 \
	t/mpi/hierarchical.np4 t/mpi/hierarchical.np6 \
	t/mpi/settings.np1 t/mpi/settings.np2 t/mpi/settings.np3 \
	t/mpi/host_mem.np1 t/mpi/host_mem.np2 t/mpi/host_mem.np3 \
	t/mpi/host_mem.np4 \
	t/mpi/zero_copy.np1 t/mpi/zero_copy.np2 t/mpi/zero_copy.np3 \
	t/mpi/zero_copy.np4 \
	t/mpi/objects.np1 t/mpi/objects.np2 t/mpi/objects.np3 \
	t/mpi/objects.np4 \
	t/mpi/grouped.np1 t/mpi/grouped.np2 t/mpi/grouped.np3 \
	t/mpi/grouped.np4 \
	t/mpi/process_sets.np1 t/mpi/process_sets.np2 \
	t/mpi/process_sets.np3 t/mpi/process_sets.np4 \
	t/mpi/process_set_split.np1 t/mpi/process_set_split.np2 \
	t/mpi/process_set_split.np3 t/mpi/process_set_split.np4 \
	t/mpi/fused_gather_scatter.np1 t/mpi/fused_gather_scatter.np2 \
	t/mpi/fused_gather_scatter.np3 t/mpi/fused_gather_scatter.np4 \
	t/mpi/gather_rows.np2 t/mpi/gather_rows.np3 \
	t/mpi/reproducible.np1 t/mpi/reproducible.np2 \
	t/mpi/reproducible.np3 t/mpi/reproducible.np4 \
	t/mpi/node_order.np4 t/mpi/node_order.np6 \
	t/mpi/overlap.np1 t/mpi/overlap.np2 t/mpi/overlap.np3 \
	t/mpi/threads.np1 t/mpi/threads.np2 t/mpi/threads.np3 \
	t/mpi/threads.np4 t/mpi/fork.np1 t/mpi/fork.np2 t/mpi/fork.np3 \
	t/mpi/finalize.np1 t/mpi/finalize.np2 t/mpi/finalize.np3 \
	t/mpi/dlclose.np1 t/mpi/dlclose.np2 t/mpi/dlclose.np3
## dlclose links no libhvd (it opens the build tree's), only the TAP
## library and MPI.
t_mpi_dlclose_CPPFLAGS = $(TEST_CPPFLAGS) \
	-DHVD_TEST_LIBDIR='"$(abs_top_builddir)/lib"'
t_mpi_dlclose_LDADD = t/tap/libtap.la $(MPI_LIBS) $(DL_LIBS)
TESTS_SH += t/mpi/fork.sh t/mpi/thread_level.sh

## fastpath  grouped collectives in the response cache, white box: the fast
##           path driven by hand (linked against libhvd.a); and through
##           the engine, counting the negotiation's MPI calls
##           (grouped_cache.sh, with t/mpi/negotiation and mpicount below)
check_PROGRAMS += t/mpi/fastpath
NP_TESTS += t/mpi/fastpath.np1 t/mpi/fastpath.np2 t/mpi/fastpath.np3 \
	t/mpi/fastpath.np4
t_mpi_fastpath_CPPFLAGS = $(TEST_CPPFLAGS) -I$(top_srcdir)/lib
t_mpi_fastpath_LDFLAGS = $(TEST_LDFLAGS) -static $(CUDA_LDFLAGS) \
	$(NCCL_LDFLAGS)
t_mpi_fastpath_LDADD = $(TEST_LDADD) $(NCCL_LIBS) $(CUDA_LIBS)
TESTS_SH += t/mpi/grouped_cache.sh

## Errors and the lifecycle:
##  mismatch  ranks that disagree: HVD_ERR_MISMATCH naming the ranks
##  invalid   every invalid argument: rc and message; then a valid one
##  shutdown  hvd_shutdown with requests in flight, twice, init again,
##            by one rank
##  topology  local/cross ranks on one node, on nodes simulated by
##            HVD_HOSTNAME, and over a sub-communicator (hvd_init_comm)
##  join      hvd_join with ranks running out of data at different steps
##  reserved  "hvd.join" and "hvd.barrier" refused as tensor names, also
##            while ranks have joined
##  join_cache  hvd_join and the response cache: a joined rank's stubs run
##            what another rank submits, never what nobody did
##  init_mpi  hvd_init initialising (and at exit finalising) MPI itself
check_PROGRAMS += t/mpi/mismatch t/mpi/invalid t/mpi/shutdown \
	t/mpi/topology t/mpi/join t/mpi/init_mpi t/mpi/reserved \
	t/mpi/join_cache
NP_TESTS += t/mpi/mismatch.np2 t/mpi/mismatch.np3 t/mpi/mismatch.np4 \
	t/mpi/invalid.np1 t/mpi/invalid.np2 \
	t/mpi/shutdown.np2 t/mpi/shutdown.np3 \
	t/mpi/topology.np1 t/mpi/topology.np2 t/mpi/topology.np3 \
	t/mpi/topology.np4 \
	t/mpi/join.np2 t/mpi/join.np3 t/mpi/join.np4 \
	t/mpi/reserved.np2 t/mpi/reserved.np3 t/mpi/reserved.np4 \
	t/mpi/join_cache.np2 t/mpi/join_cache.np3 t/mpi/join_cache.np4 \
	t/mpi/init_mpi.np2

## Training on top: the distributed optimizer against a single-process
## reference (SGD momentum, AdamW; accumulation over passes, predivide,
## op sum, no-sync, fp16/bf16 compression, every error path); the
## broadcast and verification of parameters and optimizer state;
## checkpoints (save and resume bit for bit, every failure with its message
## and nothing changed; also the program of checkpoint.sh and
## checkpoint_crash.sh); sparse gradient rows (hvd_optimizer_sparse_grad)
## before and after their parameter's reduction started, exact sums;
## synchronized batch norm against one process's over the whole batch;
## the sharded optimizer (ZeRO-1) against the unsharded one, its state
## bytes and crossed checkpoints; hvd_state_* (elastic training's
## commits: memory, file, restore, counters); mixed precision (mixed:
## masters, loss scaling; mixed_shard: masters sharded by ZeRO-1 and
## following the values that hvd_broadcast_parameters writes); gradient
## clipping by the global norm (clip: against an unclipped run, sharded
## and not, non-finite norms, loss scaling, bfloat16); per-parameter
## weight decay (weight_decay: each group as its own optimizer, sharded
## and not, refusals); LAMB (lamb: against a reference, the trust ratio,
## sharded and not, non-finite norms, bfloat16, checkpoints, refusals);
## HVD_ADASUM (adasum: exact cases, a reference, groups, scaling, zeros
## and a joined rank, the distributed optimizer, refusals); PowerSGD
## (powersgd: exact low-rank recovery, error feedback, start_step,
## scaling, a NaN step, refusals; powersgd_ckpt: its state through a
## checkpoint and an hvd_state commit, a corrupt record; also the program
## of powersgd_ckpt.sh); post-local SGD (local_sgd: against a simulation
## of every rank, without a group and with pairs, bfloat16, refusals);
## the ranks' hyperparameters (hparams: each kind of difference named by
## the step, then made root's by hvd_broadcast_optimizer_state; sharded,
## a joined rank, the check turned off); on a process set (optim_ps: two
## pipeline stages, each averaging, sharding, checking, broadcasting and
## checkpointing within its own set; refusals); the hyperparameters a
## checkpoint keeps (ckpt_hparams: restored, a version 4 file, malformed);
## checkpoints that outlive their set or share a writing process
## (ckpt_sets: a background save waited for after the set's destroy;
## two sets' threads saving one path, and two paths at once);
## every number of a checkpoint checked against its setter's range before
## a load changes anything (ckpt_range);
## explicit gradient groups (optim_groups: num_groups and groups, the
## values, one grouped call per group in the timeline, refusals);
## two optimizers stepping at once on two threads (optim_threads: loss
## scaling's skips, sharded clipping and LAMB, each optimizer's own
## collectives, the values of one thread's run).
check_PROGRAMS += t/mpi/optim t/mpi/bcast_params t/mpi/checkpoint \
	t/mpi/sparse_grad t/mpi/sync_bn t/mpi/zero t/mpi/state t/mpi/mixed \
	t/mpi/mixed_shard t/mpi/clip t/mpi/weight_decay t/mpi/lamb t/mpi/adasum \
	t/mpi/powersgd t/mpi/powersgd_ckpt t/mpi/local_sgd t/mpi/hparams \
	t/mpi/optim_ps t/mpi/ckpt_hparams t/mpi/optim_groups t/mpi/ckpt_sets \
	t/mpi/ckpt_range t/mpi/optim_threads
NP_TESTS += t/mpi/optim.np1 t/mpi/optim.np2 t/mpi/optim.np3 \
	t/mpi/optim.np4 \
	t/mpi/sparse_grad.np1 t/mpi/sparse_grad.np2 t/mpi/sparse_grad.np3 \
	t/mpi/sparse_grad.np4 \
	t/mpi/sync_bn.np1 t/mpi/sync_bn.np2 t/mpi/sync_bn.np3 \
	t/mpi/sync_bn.np4 \
	t/mpi/zero.np1 t/mpi/zero.np2 t/mpi/zero.np3 t/mpi/zero.np4 \
	t/mpi/state.np1 t/mpi/state.np2 t/mpi/state.np3 t/mpi/state.np4 \
	t/mpi/mixed.np1 t/mpi/mixed.np2 t/mpi/mixed.np3 t/mpi/mixed.np4 \
	t/mpi/mixed_shard.np1 t/mpi/mixed_shard.np2 t/mpi/mixed_shard.np3 \
	t/mpi/mixed_shard.np4 \
	t/mpi/clip.np1 t/mpi/clip.np2 t/mpi/clip.np3 t/mpi/clip.np4 \
	t/mpi/weight_decay.np1 t/mpi/weight_decay.np2 t/mpi/weight_decay.np3 \
	t/mpi/weight_decay.np4 \
	t/mpi/lamb.np1 t/mpi/lamb.np2 t/mpi/lamb.np3 t/mpi/lamb.np4 \
	t/mpi/adasum.np1 t/mpi/adasum.np2 t/mpi/adasum.np3 t/mpi/adasum.np4 \
	t/mpi/powersgd.np1 t/mpi/powersgd.np2 t/mpi/powersgd.np3 \
	t/mpi/powersgd.np4 \
	t/mpi/powersgd_ckpt.np1 t/mpi/powersgd_ckpt.np2 \
	t/mpi/powersgd_ckpt.np3 t/mpi/powersgd_ckpt.np4 \
	t/mpi/local_sgd.np1 t/mpi/local_sgd.np2 t/mpi/local_sgd.np3 \
	t/mpi/local_sgd.np4 \
	t/mpi/hparams.np1 t/mpi/hparams.np2 t/mpi/hparams.np3 \
	t/mpi/hparams.np4 \
	t/mpi/optim_ps.np1 t/mpi/optim_ps.np2 t/mpi/optim_ps.np3 \
	t/mpi/optim_ps.np4 \
	t/mpi/ckpt_hparams.np1 t/mpi/ckpt_hparams.np2 t/mpi/ckpt_hparams.np3 \
	t/mpi/ckpt_hparams.np4 \
	t/mpi/ckpt_sets.np1 t/mpi/ckpt_sets.np2 t/mpi/ckpt_sets.np3 \
	t/mpi/ckpt_sets.np4 \
	t/mpi/ckpt_range.np1 t/mpi/ckpt_range.np2 t/mpi/ckpt_range.np3 \
	t/mpi/ckpt_range.np4 \
	t/mpi/optim_groups.np1 t/mpi/optim_groups.np2 \
	t/mpi/optim_groups.np3 t/mpi/optim_groups.np4 \
	t/mpi/optim_threads.np1 t/mpi/optim_threads.np2 \
	t/mpi/optim_threads.np3 t/mpi/optim_threads.np4 \
	t/mpi/bcast_params.np1 t/mpi/bcast_params.np2 \
	t/mpi/bcast_params.np3 t/mpi/bcast_params.np4 \
	t/mpi/checkpoint.np1 t/mpi/checkpoint.np2 t/mpi/checkpoint.np3 t/mpi/checkpoint.np4
## The optimizer soak (t/soak/optim_soak.c): random combinations of the
## distributed optimizer's options against a plain optimizer fed the
## average by hand, 300 configurations at np 1-4.
TESTS_SH += t/mpi/optim_soak.sh
## the model both PowerSGD tests train
t_mpi_powersgd_SOURCES = t/mpi/powersgd.c t/mpi/psgd_model.c \
	t/mpi/psgd_model.h
t_mpi_powersgd_ckpt_SOURCES = t/mpi/powersgd_ckpt.c t/mpi/psgd_model.c \
	t/mpi/psgd_model.h
## the one-parameter model both mixed-precision tests train
t_mpi_mixed_SOURCES = t/mpi/mixed.c t/mpi/mixed_model.c t/mpi/mixed_model.h
t_mpi_mixed_shard_SOURCES = t/mpi/mixed_shard.c t/mpi/mixed_model.c \
	t/mpi/mixed_model.h

## examples/cifar_train's CNN: every parameter's gradient against central
## differences of the ranks' summed loss, sync and per-rank batch norm
## (CNN_LIBS: only with a CBLAS).
if HAVE_BLAS
check_PROGRAMS += t/mpi/cnn_grad
NP_TESTS += t/mpi/cnn_grad.np1 t/mpi/cnn_grad.np2 t/mpi/cnn_grad.np3
t_mpi_cnn_grad_CPPFLAGS = $(TEST_CPPFLAGS) $(CNN_CPPFLAGS)
t_mpi_cnn_grad_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_mpi_cnn_grad_LDADD = $(CNN_LIBS) $(TEST_LDADD)
endif

## Programs that shell tests run (not tests themselves): a rank dying
## mid-job (rank_death.sh; libhvd alone), the stall inspector (stall.sh)
## and the timeline (timeline.sh), the last two as users' programs; an hvd
## program whose rank 1 exits 3 (hvdrun.sh's failure summary); the
## checks of hvd across hosts that cluster.sh runs on its test cluster; a
## job whose last rank is stuck (straggler.sh); what each rank is under
## Slurm (slurm.sh).
check_PROGRAMS += t/mpi/die t/mpi/stall_prog t/mpi/timeline_prog \
	t/mpi/exit_code t/mpi/cluster_check t/mpi/straggler t/mpi/slurm_ranks
t_mpi_slurm_ranks_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_slurm_ranks_LDADD = $(HVD_PROG_LDADD)
t_mpi_die_LDADD = $(HVD_PROG_LDADD)
t_mpi_exit_code_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_exit_code_LDADD = $(HVD_PROG_LDADD)
t_mpi_stall_prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_stall_prog_LDADD = $(HVD_PROG_LDADD)
t_mpi_timeline_prog_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_timeline_prog_LDADD = $(HVD_PROG_LDADD)

## A crash between the temporary file and the rename leaves the previous
## checkpoint loadable (checkpoint_crash.sh): the LD_PRELOAD shim
## t/mpi/crash_rename.la (a shared module; built without sanitizers, as it
## is preloaded) kills the process at that rename.
check_LTLIBRARIES += t/mpi/crash_rename.la
t_mpi_crash_rename_la_SOURCES = t/mpi/crash_rename.c
t_mpi_crash_rename_la_CPPFLAGS = -D_GNU_SOURCE
t_mpi_crash_rename_la_CFLAGS = $(HVD_WARN_CFLAGS)
t_mpi_crash_rename_la_LDFLAGS = -module -avoid-version -shared \
	-rpath $(abs_builddir)/t/mpi

## The negotiation's cost per cycle against world size (doc/scale.md;
## t/mpi/negotiation.sh, run by hand, not a test): a program of cold,
## cached or grouped allreduce rounds (also grouped_cache.sh's), and a PMPI layer, preloaded, that counts the
## calls and bytes of the negotiation's collectives.
check_PROGRAMS += t/mpi/negotiation
check_LTLIBRARIES += t/mpi/mpicount.la
t_mpi_mpicount_la_SOURCES = t/mpi/mpicount.c
t_mpi_mpicount_la_CPPFLAGS = $(MPI_CFLAGS)
t_mpi_mpicount_la_CFLAGS = $(HVD_WARN_CFLAGS)
t_mpi_mpicount_la_LDFLAGS = -module -avoid-version -shared \
	-rpath $(abs_builddir)/t/mpi
t_mpi_mpicount_la_LIBADD = $(MPI_LIBS)
EXTRA_DIST += t/mpi/negotiation.sh

## Shell tests:
##  rank_death        a rank dying mid-job
##  stall             the stall inspector's warning and shutdown
##  timeline          the timeline's JSON (timeline_check.py; python3)
##  checkpoint        saved at np 2, loaded at np 1, 2 and 3
##  powersgd_ckpt     PowerSGD's state saved at np 2, resumed at np 1-4
##  checkpoint_crash  see crash_rename above
##  ckpt_overlap      two sets' background saves of two paths from two
##                    threads, set A's write held up by crash_rename
##  demo              the quick start's demonstration program
##  bench             hvd-bench's correctness self-check
##  hvdrun, hvdinfo   hvdrun's command lines, bad arguments and a real run;
##                    hvd-info's text, JSON and --build output
##  bert_train        examples/bert_train end to end (skips without it:
##                    a build without a CBLAS)
##  bert_sync_ratio   bench/bert-sync-ratio.sh's output and errors
##  bert_precision    bert_train --precision bf16/fp16 on the CPU (the
##                    GPU's numerical model) against fp32, np 1-3
##  straggler         a stuck rank: the job still ends (MPI_Abort at exit)
##  cifar_train       examples/cifar_train: sync BN's world-size
##                    equivalence, learning, resume at np 1, CIFAR files
##  first             README's first program: the same as examples/first.c,
##                    and its output at np 1-3
##  elastic           hvdrun --max-restarts with bert_train --elastic: a
##                    rank killed mid-run, too many failures, --min-np,
##                    a program's own failure, a crash during a save
##  hvdrun_blame      hvdrun names the failed rank of 4 from the ranks'
##                    records: each rank by exit, SIGKILL and SIGSEGV
##  cluster           hvd on 2-3 hosts made of network namespaces
##                    (t/util/cluster.sh; root only, else skipped)
##  slurm_env         hvdrun and hvd-info in a Slurm job, from fake SLURM_*
##                    variables (no daemon; the hvdrun part needs scontrol)
##  preconnect        hvd_init connects every pair of ranks first
##                    (HVD_MPI_PRECONNECT), and a rank whose value differs
##                    fails hvd_init on every rank, named with its value
##  slurm             hvd under a real Slurm on those hosts
##                    (t/util/slurm.sh): salloc + hvdrun, sbatch, srun
##                    --mpi=pmix, scancel, a node lost in an elastic job
##                    (root and slurm-wlm, else skipped)
TESTS_SH += t/mpi/rank_death.sh t/mpi/timeline.sh \
	t/mpi/timeline_api.sh \
	t/mpi/checkpoint.sh t/mpi/checkpoint_crash.sh t/mpi/ckpt_overlap.sh \
	t/mpi/demo.sh \
	t/mpi/hvdrun.sh t/mpi/hvdinfo.sh t/mpi/hvdplot.sh \
	t/mpi/bert_train.sh t/mpi/first.sh \
	t/mpi/bert_sync_ratio.sh t/mpi/slurm_env.sh t/mpi/bert_precision.sh \
	t/mpi/preconnect.sh t/mpi/powersgd_ckpt.sh

## The long ones (each 18-122 s of a 2-core machine: build-aux/test-times)
## are not in make check, so that it stays quick; `make check-long` runs
## them, and CI runs both (.ci/run):
##   stall, straggler, elastic, hvdrun_blame, cluster, autotune, bench,
##   cifar_train, slurm, bert_learns, big
LONG_TESTS = t/mpi/stall.sh t/mpi/straggler.sh t/mpi/elastic.sh \
	t/mpi/hvdrun_blame.sh t/mpi/cluster.sh t/mpi/autotune.sh \
	t/mpi/bench.sh t/mpi/cifar_train.sh t/mpi/slurm.sh t/mpi/bert_learns.sh \
	t/mpi/big.sh
## big.sh's program: collectives beyond MPI's int counts (about 5 GB)
check_PROGRAMS += t/mpi/big_gather
t_mpi_big_gather_CPPFLAGS = $(HVD_PROG_CPPFLAGS)
t_mpi_big_gather_LDADD = $(HVD_PROG_LDADD)
dist_check_SCRIPTS += $(LONG_TESTS)
check-long:
	$(MAKE) $(AM_MAKEFLAGS) check TESTS='$(LONG_TESTS)'
## the list, for .ci/run to count their results
print-long-tests:
	@echo $(LONG_TESTS)
.PHONY: check-long print-long-tests
## not in TESTS: automake's cleaning does not know their logs (as the soak's)
CLEANFILES += $(LONG_TESTS:.sh=.log) $(LONG_TESTS:.sh=.trs)
EXTRA_DIST += t/mpi/timeline_check.py
