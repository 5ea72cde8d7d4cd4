/*
 * autotune.c - coordinate search with a final check against the defaults.
 *
 * Each configuration is scored by the median of SAMPLES samples after
 * WARMUP samples (the first after a change pays for new buffers). A
 * sample is a burst (allreduces in flight, from the first to none) of at
 * least MIN_BURST_BYTES, or, for a small model, consecutive bursts joined
 * until they reach it (several steps of bert_train tiny: said once at
 * info level).
 * Bounded: (sum of candidates) * (WARMUP + SAMPLES) bursts for the search
 * plus 2 * VERIFY * SAMPLES for the final comparison.
 */
#include "core/autotune.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/fault.h"
#include "base/log.h"

#define WARMUP 1
#define SAMPLES 3
#define VERIFY 2
#define MIN_BURST_BYTES (1 << 20) /* smaller bursts say nothing */
#define NPARAM 3

static const int64_t chunk_candidates[] = {64 << 10, 256 << 10, 1 << 20,
                                           4 << 20};
static const int64_t fusion_candidates[] = {0, 4 << 20, 16 << 20, 64 << 20,
                                            128 << 20};
static const int64_t cycle_candidates[] = {500, 1000, 2000, 5000};

static const struct {
  const char *name;
  const int64_t *values;
  int n;
} params[NPARAM] = {
    {"chunk_bytes", chunk_candidates, 4},
    {"fusion_threshold", fusion_candidates, 5},
    {"cycle_us", cycle_candidates, 4},
};

struct hvd__autotune {
  hvd__tune_params_t defaults, best, cur;
  double best_score;
  int param, cand; /* what is being measured */
  int verify;      /* final comparison round, 0 before */
  int bursts;      /* bursts of the current configuration */
  double scores[SAMPLES];
  double verify_best[VERIFY], verify_default[VERIFY];
  int samples, done;
  int64_t acc_bytes; /* small bursts joined into the next sample */
  double acc_seconds;
  int acc_bursts, said_small;
  FILE *log; /* NULL: none, or no more after a failed write */
  char log_path[HVD__PATH_MAX];
};

static int64_t *field(hvd__tune_params_t *p, int i) {
  return i == 0   ? &p->chunk_bytes
         : i == 1 ? &p->fusion_threshold
                  : &p->cycle_us;
}

int64_t hvd__autotune_cycle_us(double ms) {
  if (!(ms > 0))
    return 0;
  long long us = llround(ms * 1000);
  return us > 0 ? us : 1;
}

/* The log after a write whose fprintf returned `printed`: on its first
 * failure one warning naming the file and the error, and no log after
 * it (a full disk must not stop the tuning). */
static void log_check(hvd__autotune_t *a, int printed) {
  int err = errno;
  if (printed >= 0) {
    if (fflush(a->log) == 0)
      return;
    err = errno;
  }
  HVD__LOG(HVD__LOG_WARNING,
           "HVD_AUTOTUNE_LOG: cannot write '%s': %s; the log ends here",
           a->log_path, strerror(err));
  fclose(a->log);
  a->log = NULL;
}

hvd_result_t hvd__autotune_create(const hvd__settings_t *s,
                                  hvd__autotune_t **out) {
  hvd__autotune_t *a = hvd__fault("autotune") ? NULL : calloc(1, sizeof *a);
  *out = NULL;
  if (a == NULL)
    return hvd__set_error(HVD_ERR_NO_MEMORY,
                          "could not allocate the autotuner's state");
  /* the untuned run's values: chunk 0 is the executor's default (its
   * own algorithm: the shared-memory path's pieces, zero-copy), not a
   * size of its own */
  a->defaults.fusion_threshold = s->fusion_threshold;
  a->defaults.chunk_bytes = s->chunk_size;
  a->defaults.cycle_us = hvd__autotune_cycle_us(s->cycle_time_ms);
  a->best = a->cur = a->defaults;
  *field(&a->cur, 0) = params[0].values[0];
  snprintf(a->log_path, sizeof a->log_path, "%s", s->autotune_log);
  if (s->autotune_log[0] != '\0') {
    a->log = fopen(s->autotune_log, "w");
    if (a->log == NULL) {
      hvd_result_t rc =
          hvd__set_error(HVD_ERR_IO, "HVD_AUTOTUNE_LOG: cannot open '%s': %s",
                         s->autotune_log, strerror(errno));
      free(a);
      return rc;
    }
    log_check(a, fprintf(a->log, "sample,phase,chunk_bytes,fusion_threshold,"
                                 "cycle_us,bytes,seconds,gb_per_s\n"));
  }
  *out = a;
  return HVD_SUCCESS;
}

void hvd__autotune_destroy(hvd__autotune_t *a) {
  if (a == NULL)
    return;
  if (a->log != NULL && fclose(a->log) != 0)
    HVD__LOG(HVD__LOG_WARNING, "HVD_AUTOTUNE_LOG: cannot write '%s': %s",
             a->log_path, strerror(errno));
  free(a);
}

int hvd__autotune_done(const hvd__autotune_t *a) { return a->done; }
int hvd__autotune_samples(const hvd__autotune_t *a) { return a->samples; }

static double median3(double *v) {
  double a = v[0], b = v[1], c = v[2];
  if ((a <= b && b <= c) || (c <= b && b <= a))
    return b;
  if ((b <= a && a <= c) || (c <= a && a <= b))
    return a;
  return c;
}

static void log_row(hvd__autotune_t *a, const char *phase,
                    const hvd__tune_params_t *p, int64_t bytes, double sec) {
  if (a->log == NULL)
    return;
  log_check(a, fprintf(a->log, "%d,%s,%lld,%lld,%lld,%lld,%.6f,%.3f\n",
                       a->samples, phase, (long long)p->chunk_bytes,
                       (long long)p->fusion_threshold, (long long)p->cycle_us,
                       (long long)bytes, sec,
                       sec > 0 ? (double)bytes / sec / 1e9 : 0.0));
}

/* The configuration measured next in the search, or the start of the
 * final comparison when the search is over. */
static void advance(hvd__autotune_t *a) {
  a->bursts = 0;
  if (++a->cand == params[a->param].n) {
    *field(&a->cur, a->param) = *field(&a->best, a->param);
    a->cand = 0;
    if (++a->param == NPARAM) {
      a->verify = 1; /* best vs defaults, alternating */
      a->cur = a->best;
      return;
    }
  }
  *field(&a->cur, a->param) = params[a->param].values[a->cand];
}

void hvd__autotune_record(hvd__autotune_t *a, int64_t bytes, double seconds,
                          hvd__tune_params_t *p) {
  if (a->done || seconds <= 0) {
    *p = a->done ? a->best : a->cur;
    return;
  }
  a->acc_bytes += bytes;
  a->acc_seconds += seconds;
  a->acc_bursts++;
  if (a->acc_bytes < MIN_BURST_BYTES) { /* a small model: join bursts */
    if (!a->said_small) {
      a->said_small = 1;
      HVD__LOG(HVD__LOG_INFO,
               "autotune: bursts of allreduces under %d bytes (this one: "
               "%lld): each sample joins consecutive bursts until it has "
               "%d bytes",
               MIN_BURST_BYTES, (long long)bytes, MIN_BURST_BYTES);
    }
    *p = a->cur;
    return;
  }
  bytes = a->acc_bytes;
  seconds = a->acc_seconds;
  a->acc_bytes = 0;
  a->acc_seconds = 0;
  a->acc_bursts = 0;
  a->samples++;
  int b = a->bursts++;
  double score = (double)bytes / seconds;
  if (!a->verify) {
    log_row(a, b < WARMUP ? "warmup" : "search", &a->cur, bytes, seconds);
    if (b >= WARMUP)
      a->scores[b - WARMUP] = score;
    if (b + 1 == WARMUP + SAMPLES) {
      double s = median3(a->scores);
      if (s > a->best_score) {
        a->best_score = s;
        a->best = a->cur;
      }
      advance(a);
    }
  } else {
    /* verify: WARMUP + SAMPLES bursts each of best and defaults, VERIFY
     * times, alternating; medians compared */
    int per = WARMUP + SAMPLES, round = b / (2 * per), in = b % (2 * per);
    int on_default = in >= per, k = in % per;
    log_row(a, on_default ? "verify-default" : "verify-best", &a->cur, bytes,
            seconds);
    if (k >= WARMUP)
      a->scores[k - WARMUP] = score;
    if (k + 1 == per) {
      double m = median3(a->scores);
      (on_default ? a->verify_default : a->verify_best)[round] = m;
    }
    if (in + 1 == per)
      a->cur = a->defaults;
    else if (in + 1 == 2 * per)
      a->cur = a->best;
    if (b + 1 == VERIFY * 2 * per) {
      double sb = 0, sd = 0;
      for (int i = 0; i < VERIFY; i++) {
        sb += a->verify_best[i];
        sd += a->verify_default[i];
      }
      if (sd >= sb)
        a->best = a->defaults;
      a->done = 1;
      a->cur = a->best;
      log_row(a, sd >= sb ? "final-defaults" : "final-tuned", &a->best, 0, 0);
      HVD__LOG(HVD__LOG_INFO,
               "autotune done after %d samples: chunk %lld, fusion %lld, "
               "cycle %lld us (%.2f vs %.2f GB/s for the defaults)",
               a->samples, (long long)a->best.chunk_bytes,
               (long long)a->best.fusion_threshold, (long long)a->best.cycle_us,
               sb / VERIFY / 1e9, sd / VERIFY / 1e9);
    }
  }
  *p = a->cur;
}

void hvd__burst_end(hvd__burst_t *b, double now) {
  if (b->bytes == 0)
    return;
  b->ended_bytes += b->bytes;
  b->ended_seconds += now - b->start;
  b->bytes = 0;
}

void hvd__autotune_score(hvd__autotune_t *a, hvd__burst_t *b,
                         hvd__tune_params_t *p) {
  if (b->ended_bytes == 0)
    return;
  hvd__autotune_record(a, b->ended_bytes, b->ended_seconds, p);
  b->ended_bytes = 0;
  b->ended_seconds = 0;
}
