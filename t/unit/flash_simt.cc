/*
 * flash_simt.cc - the GPU's flash attention kernels (examples/bert/
 * flash_mma.h), their own source, run on the CPU through t/unit/simt.h
 * (a lane per coroutine, the PTX fragment layouts, a warp at a time up
 * to each barrier), against the CPU's model of the same attention
 * (bert_cpu_backend(p), layers_lp.c) in bfloat16 and float16, every case
 * twice: cp.async landing at its wait, then at its issue:
 *
 * - forward: ctx within the tolerance of t/gpu/bert_layers (the same
 *   test, there on the device: 2^-6 relative for bfloat16, 2^-9 for
 *   float16, a scale of the tensor's largest), the copy of ctx bit for
 *   bit, the lengths, and each row's log-sum-exp within 1e-5 of one
 *   computed in double from the same rounded inputs;
 * - backward from that forward: dQ, dK and dV within the tolerance;
 * - shapes: a last tile of 16 keys and padding (lengths 80 and 37), a
 *   sequence of length 0 (uniform weights), three tiles, a last tile of
 *   8 rows, one padded key in a tile of 2; 1 to 3 heads; so tiles with
 *   and without masked keys (the kernels' two paths) in every kernel;
 * - the twin's strictness: a read of a cp.async destination before its
 *   wait sees the old bytes, and after it the copied ones.
 *
 * A kernel's fault (a wrong lane mapping, a missing wait or barrier, a
 * mask off by one) gives errors of the order of the values themselves,
 * far beyond the tolerance.
 */
#include "simt.h"

#include "../../examples/bert/flash_mma.h"

extern "C" {
#include "hvdtest.h"
#include "model.h"
#include "tap.h"
#include "util.h"
}

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

namespace {

bert_rng_t rng;
int P;        /* the precision: BERT_BF16 or BERT_FP16 */
double R_TOL; /* t/gpu/bert_layers.c's */

const char *plabel(void) { return P == BERT_BF16 ? "bf16" : "fp16"; }

typedef std::vector<uint16_t> Half;

Half trandn(int64_t n) {
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; i++)
    f[i] = (float)bert__rng_normal(&rng);
  Half h(n);
  bert_from_float(P, f.data(), h.data(), n);
  return h;
}

std::vector<float> tof(const Half &h) {
  std::vector<float> f(h.size());
  bert_to_float(P, h.data(), f.data(), (int64_t)h.size());
  return f;
}

/* within t/gpu/bert_layers' tolerance (hvdt_rounding_err, R_TOL) */
void near(const char *name, const char *what, const Half &got,
          const Half &want) {
  const std::vector<float> g = tof(got), c = tof(want);
  const double e =
      hvdt_rounding_err(g.data(), c.data(), (int64_t)g.size(), R_TOL);
  ok(e <= 1, "%s %s: %s: %.2f of the tolerance", plabel(), name, what, e);
}

/* The log-sum-exp of each query row (b, h, s) in double, from the same
 * rounded q and k as the kernels: layers_cuda.cu's scores, masked keys
 * BERT_MASK_VALUE (0 in a sequence of length 0). */
std::vector<double> lse_ref(const Half &q, const Half &k,
                            const int32_t *lengths, int B, int S, int A) {
  const std::vector<float> fq = tof(q), fk = tof(k);
  const int H = A * 64;
  std::vector<double> out((size_t)B * A * S);
  for (int b = 0; b < B; b++) {
    const int len = lengths != NULL ? lengths[b] : S;
    for (int h = 0; h < A; h++)
      for (int s = 0; s < S; s++) {
        std::vector<double> x(S);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < S; j++) {
          double dot = 0;
          for (int e = 0; e < 64; e++)
            dot += (double)fq[((size_t)b * S + s) * H + h * 64 + e] *
                   fk[((size_t)b * S + j) * H + h * 64 + e];
          x[j] = j < len ? dot / 8 : len > 0 ? BERT_MASK_VALUE : 0.0;
          mx = fmax(mx, x[j]);
        }
        for (int j = 0; j < S; j++)
          sum += exp(x[j] - mx);
        out[((size_t)b * A + h) * S + s] = mx + log(sum);
      }
  }
  return out;
}

template <typename T>
void flash_case(int B, int S, int A, const int32_t *lengths) {
  const int64_t nh = (int64_t)B * S * A * 64, np = (int64_t)B * A * S * S;
  const int rows = B * A * S, tiles = (S + 63) / 64;
  const float scale = 0.125f; /* 1 / sqrt(64) */
  char name[96];
  snprintf(name, sizeof name, "flash B=%d S=%d A=%d%s, copies landing %s", B, S,
           A, lengths != NULL ? " (padding)" : "",
           simt::land_early ? "early" : "late");
  const bert_backend_t *C = bert_cpu_backend(P);
  Half q = trandn(nh), k = trandn(nh), v = trandn(nh), dctx = trandn(nh);
  Half probs(np), ctx(nh), dq(nh), dk(nh), dv(nh);
  std::vector<float> scratch((size_t)S * S);
  C->attention_fwd(q.data(), k.data(), v.data(), lengths, probs.data(),
                   ctx.data(), B, S, A, 64);
  C->attention_bwd(q.data(), k.data(), v.data(), probs.data(), dctx.data(),
                   dq.data(), dk.data(), dv.data(), scratch.data(), B, S, A,
                   64);

  const T *tq = (const T *)q.data(), *tk = (const T *)k.data();
  const T *tv = (const T *)v.data(), *tdo = (const T *)dctx.data();
  Half gctx(nh, 0xffff), gcopy(nh, 0xfffe), gdq(nh, 0xffff), gdk(nh, 0xffff);
  Half gdv(nh, 0xffff);
  std::vector<float> lse(rows, NAN), d(rows);
  std::vector<int32_t> lens(B, -1);
  simt::run(tiles, B * A, fa::fa_smem(0), [&] {
    fa::fa_fwd_kernel<T>(tq, tk, tv, lengths, (T *)gctx.data(), lse.data(),
                         lens.data(), (T *)gcopy.data(), S, A, scale);
  });
  near(name, "ctx", gctx, ctx);
  ok(gcopy == gctx, "%s %s: the kept copy of ctx is ctx bit for bit", plabel(),
     name);
  int same_lens = 1;
  for (int b = 0; b < B; b++)
    same_lens &= lens[b] == (lengths != NULL ? lengths[b] : S);
  ok(same_lens, "%s %s: the lengths kept for backward", plabel(), name);
  const std::vector<double> want = lse_ref(q, k, lengths, B, S, A);
  double worst = 0;
  for (int r = 0; r < rows; r++)
    worst = fmax(worst, fabs(lse[r] - want[r]) / fmax(1.0, fabs(want[r])));
  ok(worst <= 1e-5, "%s %s: every row's log-sum-exp within 1e-5 (%.1e)",
     plabel(), name, worst);

  /* d = rowsum(dctx ctx) per row, as flash_rowdot_kernel */
  const std::vector<float> fo = tof(gcopy), fd = tof(dctx);
  for (int r = 0; r < rows; r++) {
    const int64_t bh = r / S, s = r % S;
    const int64_t off = (bh / A * S + s) * A * 64 + bh % A * 64;
    float x = 0;
    for (int e = 0; e < 64; e++)
      x += fd[off + e] * fo[off + e];
    d[r] = x;
  }
  simt::run(tiles, B * A, fa::fa_smem(1), [&] {
    fa::fa_dq_kernel<T>(tq, tk, tv, tdo, lens.data(), lse.data(), d.data(),
                        (T *)gdq.data(), S, A, scale);
  });
  simt::run(tiles, B * A, fa::fa_smem(2), [&] {
    fa::fa_dkdv_kernel<T>(tq, tk, tv, tdo, lens.data(), lse.data(), d.data(),
                          (T *)gdk.data(), (T *)gdv.data(), S, A, scale);
  });
  near(name, "dq", gdq, dq);
  near(name, "dk", gdk, dk);
  near(name, "dv", gdv, dv);
}

template <typename T> void flash_cases(bool early) {
  static const int32_t len2[2] = {80, 37}, len0[1] = {0}, len3[1] = {129};
  simt::land_early = early;
  flash_case<T>(2, 80, 1, len2);
  flash_case<T>(1, 72, 2, len0);
  flash_case<T>(1, 150, 1, NULL);
  flash_case<T>(1, 130, 3, len3);
}

/* cp.async lands at its wait, not before: a tile read between the two
 * sees the old bytes (0xff: shared memory's start), after it the new. */
void test_strict_copies(void) {
  alignas(16) static uint16_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  uint16_t before = 0, after = 0;
  simt::land_early = false;
  simt::run(1, 1, 16 * fa::kThreads, [&] {
    FA_SMEM(smem);
    uint16_t *mine = (uint16_t *)(smem + 16 * fa_tid());
    fa_cp16(mine, src);
    fa_cp_commit();
    fa_sync();
    if (fa_tid() == 5)
      before = mine[2];
    fa_cp_wait<0>();
    fa_sync();
    if (fa_tid() == 5)
      after = mine[2];
  });
  is_int(0xffff, before,
         "simt: a cp.async destination read before its wait "
         "holds the old bytes");
  is_int(3, after, "simt: ... and after it the copied ones");
}

} /* namespace */

int main(void) {
  uint64_t seed = 31;
  bert__rng_seed(&rng, &seed, 1);
  bert_set_threads(1);
  test_strict_copies();
  P = BERT_BF16, R_TOL = 0x1p-6;
  flash_cases<simt_bf16>(false);
  flash_cases<simt_bf16>(true);
  P = BERT_FP16, R_TOL = 0x1p-9;
  flash_cases<simt_fp16>(false);
  flash_cases<simt_fp16>(true);
  done_testing();
  return tap_exit_status();
}
