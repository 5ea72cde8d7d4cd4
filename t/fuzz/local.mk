## t/fuzz/local.mk - the readers of untrusted files and strings, fuzzed
## (doc/fuzzing.md): checkpoints and elastic states (fuzz_checkpoint.c),
## bert_train's vocabulary and corpus readers (fuzz_text.c), the HVD_*
## parsers (fuzz_settings.c). Each target is LLVMFuzzerTestOneInput.
##
## In every build: t/fuzz/replay_TARGET runs the target over
## t/fuzz/corpus/TARGET/ (the seeds, and every input that once crashed),
## in make check (t/fuzz/replay.sh). With --enable-fuzz (CC=clang; CI
## does it with ASan and UBSan): t/fuzz/fuzz_TARGET, libFuzzer's binaries,
## and `make fuzz-run FUZZ_SECONDS=60`, which fuzzes each for that long
## from the seeds and fails on any crash (saved as t/fuzz/crashes/...).

FUZZ_COMMON = t/fuzz/fuzz.h t/fuzz/fuzz_file.c
check_PROGRAMS += t/fuzz/replay_checkpoint t/fuzz/replay_settings
TESTS_SH += t/fuzz/replay.sh
EXTRA_DIST += t/fuzz/corpus
t_fuzz_replay_checkpoint_SOURCES = t/fuzz/replay.c t/fuzz/fuzz_checkpoint.c \
	$(FUZZ_COMMON)
t_fuzz_replay_checkpoint_CPPFLAGS = $(TEST_CPPFLAGS)
t_fuzz_replay_checkpoint_LDFLAGS = $(TEST_LDFLAGS)
t_fuzz_replay_checkpoint_LDADD = $(TEST_LDADD)
t_fuzz_replay_settings_SOURCES = t/fuzz/replay.c t/fuzz/fuzz_settings.c \
	$(FUZZ_COMMON)
t_fuzz_replay_settings_CPPFLAGS = $(TEST_CPPFLAGS)
t_fuzz_replay_settings_LDFLAGS = $(TEST_LDFLAGS)
t_fuzz_replay_settings_LDADD = $(TEST_LDADD)
if HAVE_BLAS
check_PROGRAMS += t/fuzz/replay_text
t_fuzz_replay_text_SOURCES = t/fuzz/replay.c t/fuzz/fuzz_text.c $(FUZZ_COMMON)
t_fuzz_replay_text_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_fuzz_replay_text_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS)
t_fuzz_replay_text_LDADD = $(BERT_LIBS) $(TEST_LDADD)
endif

FUZZ_SECONDS = 60
if HVD_FUZZ
FUZZ_TARGETS = checkpoint settings
noinst_PROGRAMS += t/fuzz/fuzz_checkpoint t/fuzz/fuzz_settings
t_fuzz_fuzz_checkpoint_SOURCES = t/fuzz/fuzz_checkpoint.c $(FUZZ_COMMON)
t_fuzz_fuzz_checkpoint_CPPFLAGS = $(TEST_CPPFLAGS)
t_fuzz_fuzz_checkpoint_LDFLAGS = $(TEST_LDFLAGS) -fsanitize=fuzzer
t_fuzz_fuzz_checkpoint_LDADD = $(TEST_LDADD)
t_fuzz_fuzz_settings_SOURCES = t/fuzz/fuzz_settings.c $(FUZZ_COMMON)
t_fuzz_fuzz_settings_CPPFLAGS = $(TEST_CPPFLAGS)
t_fuzz_fuzz_settings_LDFLAGS = $(TEST_LDFLAGS) -fsanitize=fuzzer
t_fuzz_fuzz_settings_LDADD = $(TEST_LDADD)
if HAVE_BLAS
FUZZ_TARGETS += text
noinst_PROGRAMS += t/fuzz/fuzz_text
t_fuzz_fuzz_text_SOURCES = t/fuzz/fuzz_text.c $(FUZZ_COMMON)
t_fuzz_fuzz_text_CPPFLAGS = $(TEST_CPPFLAGS) $(BERT_CPPFLAGS)
t_fuzz_fuzz_text_LDFLAGS = $(TEST_LDFLAGS) $(BERT_LINK_OPTS) -fsanitize=fuzzer
t_fuzz_fuzz_text_LDADD = $(BERT_LIBS) $(TEST_LDADD)
endif

## Each target for FUZZ_SECONDS from its seeds (a scratch corpus under
## t/fuzz/run/), within 256 MiB per allocation and 2 GiB in all: a crash,
## a leak, a sanitizer report or a limit ends it, the input saved as
## t/fuzz/crashes/TARGET-crash-... (copy it into t/fuzz/corpus/TARGET/ once
## fixed: replay.sh keeps it fixed).
## Leaks: libFuzzer's check after each input that allocated more than it
## freed; LeakSanitizer's at exit is off, as it would report what MPI's
## threads keep (fuzz_checkpoint runs hvd_init and never finalizes).
fuzz-run: $(FUZZ_TARGETS:%=t/fuzz/fuzz_%)
	@set -e; mkdir -p t/fuzz/crashes; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p t/fuzz/run/$$t; \
	  echo "fuzz-run: $$t for $(FUZZ_SECONDS) s"; \
	  rc=0; HVD_LOG_LEVEL=error \
	  LSAN_OPTIONS="leak_check_at_exit=0$${LSAN_OPTIONS:+:$$LSAN_OPTIONS}" \
	  ./t/fuzz/fuzz_$$t \
	    -max_total_time=$(FUZZ_SECONDS) -malloc_limit_mb=256 \
	    -rss_limit_mb=2048 -print_final_stats=1 \
	    -artifact_prefix=t/fuzz/crashes/$$t- t/fuzz/run/$$t \
	    $(srcdir)/t/fuzz/corpus/$$t >t/fuzz/run/$$t.log 2>&1 || rc=$$?; \
	  tail -n 25 t/fuzz/run/$$t.log; \
	  test $$rc = 0 || { echo "fuzz-run: $$t failed (status $$rc)"; exit 1; }; \
	  if ls t/fuzz/crashes/$$t-* >/dev/null 2>&1; then \
	    echo "fuzz-run: $$t crashed: see t/fuzz/crashes/"; exit 1; fi; \
	done; echo "fuzz-run: every target ran $(FUZZ_SECONDS) s without a finding"
else
fuzz-run:
	@echo "fuzz-run: this build has no fuzz targets: configure with CC=clang --enable-fuzz (doc/fuzzing.md)"; exit 1
endif
.PHONY: fuzz-run
## fuzz-run's scratch corpus and findings
clean-local: clean-fuzz-run
clean-fuzz-run:
	-rm -rf t/fuzz/run t/fuzz/crashes
.PHONY: clean-fuzz-run
