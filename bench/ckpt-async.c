/*
 * ckpt-async.c - what a checkpoint costs the training loop, written in the
 * caller (hvd_checkpoint_save) against in the background
 * (hvd_checkpoint_save_async) (doc/bench.md, "Checkpoints in the
 * background"): BERT-base-shaped float32 parameters (the word embeddings,
 * the positions, and 12 layers of four 768 x 768 and two 768 x 3072
 * matrices: 74 tensors, 108.8 M elements) under AdamW after one step (two
 * state tensors each: a 1.3 GB file), saved to DIR/bench.ckpt I rounds
 * (default 5, the first a warm-up), the two ways alternately, a barrier
 * before each. Rank 0 prints per round the synchronous save's time, the
 * background save's call (what the loop waits for: the collective part
 * and rank 0's copy of the file) and the time until its wait returned
 * (the file written, synced and renamed), and a hvd_checkpoint_load of
 * the file (every rank takes its tensors a piece at a time), then the
 * medians and the ratio of the calls.
 *
 * With "zero" after I, the AdamW is sharded (ZeRO-1, behind
 * hvd_distributed_optimizer): each rank keeps its blocks of the state, a
 * save sends them to rank 0, a load takes each rank's blocks. With
 * "bf16" the parameters are bfloat16 (mixed precision: the file holds the
 * float32 masters, the same 1.3 GB), and "zero-bf16" shards those (each
 * rank keeps its blocks of the masters too). At the end rank 0 prints
 * the peak resident size (VmHWM) of rank 0 and the largest of the others.
 *
 * With "state" after the kind (or "-" for plain float32), the rounds time
 * hvd_state_commit instead, alternately through a state that writes its
 * file in the commit and one that writes it in the background
 * (hvd_state_set_background), every commit a file: the commit's time,
 * and the background one's wait after it.
 *
 *   mpirun -np 2 bench/ckpt-async DIR [I [zero|bf16|zero-bf16|-] [state]]
 */
#include "hvd.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NT 74
#define MAXR 64

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* x's bfloat16 bits, rounded to nearest even (x finite). */
static uint16_t bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The peak resident size of this process in MiB (VmHWM), or -1. */
static double peak_mib(void) {
  char line[256];
  double kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "VmHWM:", 6) == 0)
      kb = atof(line + 6);
  if (f != NULL)
    fclose(f);
  return kb < 0 ? -1 : kb / 1024;
}

/* The model: BERT-base's matrices, float32 or bfloat16 (low), gradient
 * 1e-3 so that Adam's state is not zero. */
static hvd_param_t *model(int *n, int low) {
  static hvd_param_t p[NT];
  static char names[NT][32];
  int64_t len[NT];
  int k = 0;
  len[k++] = 30522LL * 768;
  len[k++] = 512 * 768;
  for (int l = 0; l < 12; l++) {
    for (int j = 0; j < 4; j++)
      len[k++] = 768 * 768;
    len[k++] = 768 * 3072;
    len[k++] = 3072 * 768;
  }
  hvd_dtype_t dt = low ? HVD_BFLOAT16 : HVD_FLOAT32;
  size_t es = low ? 2 : 4;
  for (int i = 0; i < k; i++) {
    unsigned char *v = malloc((size_t)len[i] * es);
    unsigned char *g = malloc((size_t)len[i] * es);
    if (v == NULL || g == NULL)
      return NULL;
    for (int64_t j = 0; j < len[i]; j++) {
      float x = (float)((j * 7 + i) % 13 - 6) * 1e-2f, y = 1e-3f;
      if (low) {
        ((uint16_t *)v)[j] = bf16(x);
        ((uint16_t *)g)[j] = bf16(y);
      } else {
        ((float *)v)[j] = x;
        ((float *)g)[j] = y;
      }
    }
    snprintf(names[i], sizeof names[i], "p%d", i);
    p[i].name = names[i];
    p[i].value = hvd_tensor_make(v, dt, 1, &len[i]);
    p[i].grad = hvd_tensor_make(g, dt, 1, &len[i]);
  }
  *n = k;
  return p;
}

/* hvd_state commits, synchronous and in the background, alternately. */
static void bench_state(hvd_param_t *p, int n, hvd_optimizer_t *opt,
                        int rounds, const char *dir) {
  char pf[4200], pb[4200];
  snprintf(pf, sizeof pf, "%s/fg.state", dir);
  snprintf(pb, sizeof pb, "%s/bg.state", dir);
  hvd_state_t *st[2] = {NULL, NULL};
  for (int k = 0; k < 2; k++)
    if (hvd_state_create(k ? pb : pf, 1, &st[k]) != HVD_SUCCESS ||
        hvd_state_add_params(st[k], p, n, opt) != HVD_SUCCESS ||
        hvd_state_set_background(st[k], k) != HVD_SUCCESS) {
      fprintf(stderr, "hvd_state: %s\n", hvd_last_error());
      exit(1);
    }
  double fg[MAXR], bg[MAXR], bw[MAXR];
  int kept = 0;
  for (int it = 0; it < rounds; it++) {
    double t[3] = {0, 0, 0};
    for (int j = 0; j < 2; j++) {
      const int k = (it + j) % 2; /* the order swapped every round */
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      hvd_result_t rc = hvd_state_commit(st[k]);
      t[k] = MPI_Wtime() - t0;
      if (rc == HVD_SUCCESS && k == 1) {
        rc = hvd_state_wait(st[k]);
        t[2] = MPI_Wtime() - t0;
      }
      if (rc != HVD_SUCCESS) {
        fprintf(stderr, "commit: %s\n", hvd_last_error());
        exit(1);
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, t, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (hvd_rank() == 0)
      printf("round %d%s: commit %.0f ms; in the background %.0f ms, its "
             "file written at %.0f ms\n",
             it, it == 0 ? " (warm-up)" : "", t[0] * 1e3, t[1] * 1e3,
             t[2] * 1e3);
    if (it > 0)
      fg[kept] = t[0], bg[kept] = t[1], bw[kept++] = t[2];
  }
  if (hvd_rank() == 0) {
    double a = median(fg, kept), b = median(bg, kept), c = median(bw, kept);
    printf("median of %d rounds at np %d: hvd_state_commit %.0f ms, in the "
           "background %.0f ms (%.2fx), its file written at %.0f ms\n",
           kept, hvd_size(), a * 1e3, b * 1e3, b / a, c * 1e3);
  }
  hvd_state_destroy(st[0]);
  hvd_state_destroy(st[1]);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: ckpt-async DIR [ROUNDS [zero|bf16|zero-bf16]]\n");
    return 2;
  }
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (rounds < 2 || rounds > MAXR)
    rounds = 5;
  char path[4096];
  snprintf(path, sizeof path, "%s/bench.ckpt", argv[1]);
  if (hvd_init() != HVD_SUCCESS) {
    fprintf(stderr, "hvd_init: %s\n", hvd_last_error());
    return 1;
  }
  const char *kind = argc > 3 ? argv[3] : "";
  int zero = strcmp(kind, "zero") == 0 || strcmp(kind, "zero-bf16") == 0;
  int low = strcmp(kind, "bf16") == 0 || strcmp(kind, "zero-bf16") == 0;
  int n = 0;
  hvd_param_t *p = model(&n, low);
  hvd_adam_options_t ao;
  hvd_adam_options_init(&ao);
  ao.decoupled = 1;
  hvd_optimizer_t *opt = NULL, *base = NULL;
  hvd_distributed_options_t d;
  hvd_distributed_options_init(&d);
  d.shard_optimizer_state = 1;
  if (p == NULL || hvd_adam_create(p, n, &ao, zero ? &base : &opt) != 0 ||
      (zero && hvd_distributed_optimizer(base, &d, &opt) != 0) ||
      hvd_optimizer_step(opt) != HVD_SUCCESS) {
    fprintf(stderr, "the model: %s\n", p ? hvd_last_error() : "no memory");
    return 1;
  }
  if (argc > 4 && strcmp(argv[4], "state") == 0) {
    bench_state(p, n, opt, rounds, argv[1]);
    hvd_optimizer_destroy(opt);
    hvd_shutdown();
    return 0;
  }
  double sync_s[MAXR], call_s[MAXR], total_s[MAXR], load_s[MAXR];
  int kept = 0;
  for (int it = 0; it < rounds; it++) {
    double t[4] = {0, 0, 0, 0};
    for (int k = 0; k < 2; k++) {
      const int bg = (it + k) % 2; /* the order swapped every round */
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      hvd_result_t rc;
      if (!bg) {
        rc = hvd_checkpoint_save(path, p, n, opt, it);
        t[0] = MPI_Wtime() - t0;
      } else {
        hvd_checkpoint_request_t *q = NULL;
        rc = hvd_checkpoint_save_async(path, p, n, opt, it, &q);
        t[1] = MPI_Wtime() - t0;
        if (rc == HVD_SUCCESS)
          rc = hvd_checkpoint_wait(q);
        t[2] = MPI_Wtime() - t0;
      }
      if (rc != HVD_SUCCESS) {
        fprintf(stderr, "save: %s\n", hvd_last_error());
        return 1;
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    int64_t step = -1;
    if (hvd_checkpoint_load(path, p, n, opt, &step) != HVD_SUCCESS ||
        step != it) {
      fprintf(stderr, "load: %s\n", hvd_last_error());
      return 1;
    }
    t[3] = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, t, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (hvd_rank() == 0)
      printf("round %d%s: save %.0f ms; save_async's call %.0f ms, its "
             "wait done at %.0f ms; load %.0f ms\n",
             it, it == 0 ? " (warm-up)" : "", t[0] * 1e3, t[1] * 1e3,
             t[2] * 1e3, t[3] * 1e3);
    if (it > 0) {
      sync_s[kept] = t[0];
      call_s[kept] = t[1];
      load_s[kept] = t[3];
      total_s[kept++] = t[2];
    }
  }
  if (hvd_rank() == 0) {
    double ms = median(sync_s, kept), mc = median(call_s, kept),
           mt = median(total_s, kept), ml = median(load_s, kept);
    printf("median of %d rounds at np %d%s%s: save %.0f ms, save_async's call "
           "%.0f ms (%.2fx of save's), written at %.0f ms; load %.0f ms\n",
           kept, hvd_size(), zero ? " (ZeRO-1)" : "", low ? " (bfloat16)" : "",
           ms * 1e3, mc * 1e3, mc / ms, mt * 1e3, ml * 1e3);
  }
  double peak = peak_mib(), others = hvd_rank() == 0 ? -1 : peak;
  MPI_Allreduce(MPI_IN_PLACE, &others, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (hvd_rank() == 0)
    printf("peak resident%s%s: rank 0 %.0f MiB, the others at most %.0f MiB\n",
           zero ? " (ZeRO-1)" : "", low ? " (bfloat16)" : "", peak, others);
  hvd_optimizer_destroy(opt);
  hvd_shutdown();
  return 0;
}
