/*
 * fuzz_checkpoint.c - hvd_checkpoint_load and hvd_state_restore on
 * untrusted bytes (one rank, MPI's singleton): a truncated, bit-flipped or
 * hostile file must never crash, never allocate beyond what the file is
 * (libFuzzer's -malloc_limit_mb checks it), and, when refused, never
 * change the model or its optimizer (checked here: abort if it did). The
 * model: float32 "w" [4], "b" [2, 3], "c" [] with Adam, distributed with
 * PowerSGD at rank 1 from step 0 and min_compression_rate 0, so that "b"
 * is compressed and a version 3 file's PowerSGD records are read into
 * it; the state adds the counters "step" and "epoch". With FUZZ_VERBOSE set, it
 * prints whether each input loaded, and why not.
 */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hvd.h"

#define NP 3

static hvd_param_t p[NP];
static float v[NP][6], g[NP][6];
static hvd_optimizer_t *opt;
static hvd_state_t *st;
static int64_t step, epoch;
static int verbose; /* FUZZ_VERBOSE set: say what each input did */

/* LeakSanitizer's switch, in a sanitizer build (weak: absent elsewhere).
 * What MPI_Init allocates and never frees is MPI's, not the reader's: it
 * is made while the check is off. */
void __lsan_disable(void) __attribute__((weak));
void __lsan_enable(void) __attribute__((weak));

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  static const char *const names[NP] = {"w", "b", "c"};
  static const int64_t s0[1] = {4}, s1[2] = {2, 3};
  setenv("HVD_LOG_LEVEL", "error", 0);
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  if (__lsan_disable != NULL)
    __lsan_disable();
  hvd_result_t rc = hvd_init();
  if (__lsan_enable != NULL)
    __lsan_enable();
  if (rc != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    abort();
  }
  for (int i = 0; i < NP; i++) {
    p[i].name = names[i];
    p[i].value = hvd_tensor_make(v[i], HVD_FLOAT32, i == 2 ? 0 : i + 1,
                                 i == 0 ? s0 : s1);
    p[i].grad = hvd_tensor_make(g[i], HVD_FLOAT32, i == 2 ? 0 : i + 1,
                                i == 0 ? s0 : s1);
  }
  hvd_adam_options_t ao;
  hvd_distributed_options_t d;
  hvd_optimizer_t *base = NULL;
  hvd_adam_options_init(&ao);
  hvd_distributed_options_init(&d);
  d.compression = HVD_COMPRESS_POWERSGD;
  d.powersgd.start_step = 0;
  d.powersgd.min_compression_rate = 0;
  if (hvd_adam_create(p, NP, &ao, &base) != HVD_SUCCESS ||
      hvd_distributed_optimizer(base, &d, &opt) != HVD_SUCCESS)
    abort();
  /* the same bytes as an elastic state (format version 2's counters) */
  if (hvd_state_create(fuzz_file(NULL, 0), 1, &st) != HVD_SUCCESS ||
      hvd_state_add_params(st, p, NP, opt) != HVD_SUCCESS ||
      hvd_state_add_counter(st, "step", &step) != HVD_SUCCESS ||
      hvd_state_add_counter(st, "epoch", &epoch) != HVD_SUCCESS)
    abort();
  return 0;
}

/* The model's values, and the optimizer's lr and steps, as bytes. */
static void snapshot(unsigned char *out) {
  memcpy(out, v, sizeof v);
  double lr = hvd_optimizer_lr(opt);
  int64_t steps = hvd_optimizer_steps(opt);
  memcpy(out + sizeof v, &lr, sizeof lr);
  memcpy(out + sizeof v + sizeof lr, &steps, sizeof steps);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size);
  for (int i = 0; i < NP; i++)
    for (int j = 0; j < 6; j++)
      v[i][j] = (float)(i * 10 + j);
  unsigned char before[sizeof v + 16], after[sizeof v + 16];
  snapshot(before);
  int64_t s = -7;
  hvd_result_t rc = hvd_checkpoint_load(path, p, NP, opt, &s);
  if (verbose)
    printf("checkpoint: %s%s\n", rc == HVD_SUCCESS ? "loaded" : "refused: ",
           rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (rc != HVD_SUCCESS) {
    snapshot(after);
    if (memcmp(before, after, sizeof before) != 0 || s != -7) {
      fprintf(stderr, "a refused checkpoint changed the model: %s\n",
              hvd_last_error());
      abort();
    }
  }
  snapshot(before);
  step = epoch = -3;
  int restored = -1;
  rc = hvd_state_restore(st, &restored);
  if (verbose)
    printf("state: %s%s\n", rc == HVD_SUCCESS ? "restored" : "refused: ",
           rc == HVD_SUCCESS ? "" : hvd_last_error());
  if (rc != HVD_SUCCESS) {
    snapshot(after);
    if (memcmp(before, after, sizeof before) != 0 || step != -3 ||
        epoch != -3 || restored != 0) {
      fprintf(stderr, "a refused state changed the model: %s\n",
              hvd_last_error());
      abort();
    }
  }
  return 0;
}
