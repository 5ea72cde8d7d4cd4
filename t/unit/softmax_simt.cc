/*
 * softmax_simt.cc - the attention's register-resident row softmaxes
 * (examples/bert/softmax_rows.h), their own CUDA source, run on the CPU
 * through t/unit/simt.h (a coroutine per lane, the warp's shuffles as
 * collectives), in float32, bfloat16 and float16:
 *
 * - softmax_lanes: the fewest values per lane (4, 8, 16, 32) that hold
 *   S keys, 0 past 1024;
 * - forward and backward bit for bit against a host model of
 *   layers_cuda.cu's loop kernels (softmax_fwd_kernel, softmax_bwd_kernel:
 *   each lane's keys in order, then the warp's butterfly), which the
 *   registers replace up to S 1024: the same bits is what they promise;
 * - every N that holds a row gives those bits (a row of 13 at N 4 and
 *   32), float32 in place (P over the scores, dS over dP);
 * - and the model itself against a softmax in double: float32
 *   probabilities within 1e-6, masked keys exactly 0, a sequence of
 *   length 0 uniform;
 * - shapes: S of 1, 13, 32, 33, 130, 257, 600 and 1024 (every N, a row
 *   that ends inside a lane's last value and one that fills it), several
 *   heads and sequences, lengths of 0, 1, S and in between; more rows
 *   than a block takes, and a last block with fewer.
 */
#include "simt.h"

#include "../../examples/bert/softmax_rows.h"

extern "C" {
#include "model.h"
#include "tap.h"
#include "util.h"
}

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

namespace {

bert_rng_t rng;

template <typename T> const char *tname(void);
template <> const char *tname<float>(void) { return "f32"; }
template <> const char *tname<simt_bf16>(void) { return "bf16"; }
template <> const char *tname<simt_fp16>(void) { return "fp16"; }

/* The warp's butterfly over 32 lanes' values: every lane ends with the
 * same bits; lane 0's. */
float butterfly_sum(float v[32]) {
  for (int o = 16; o > 0; o /= 2) {
    float w[32];
    for (int l = 0; l < 32; l++)
      w[l] = v[l] + v[l ^ o];
    memcpy(v, w, sizeof w);
  }
  return v[0];
}

/* layers_cuda.cu's softmax_fwd_kernel for one row, as its lanes run it */
template <typename T>
void model_fwd_row(const float *r, T *pr, int len, int S) {
  float mx = -INFINITY, part[32];
  for (int j = 0; j < S; j++)
    mx = fmaxf(mx, j < len ? r[j] : BERT_MASK_VALUE);
  std::vector<float> e(S);
  for (int l = 0; l < 32; l++) {
    part[l] = 0;
    for (int j = l; j < S; j += 32) {
      e[j] = expf((j < len ? r[j] : BERT_MASK_VALUE) - mx);
      part[l] += e[j];
    }
  }
  const float inv = 1.0f / butterfly_sum(part);
  for (int j = 0; j < S; j++)
    fa_st<T>(pr + j, e[j] * inv);
}

/* softmax_bwd_kernel for one row */
template <typename T>
void model_bwd_row(const T *pr, const float *dr, T *sr, int S) {
  float part[32];
  for (int l = 0; l < 32; l++) {
    part[l] = 0;
    for (int j = l; j < S; j += 32)
      part[l] += fa_ld<T>(pr + j) * dr[j];
  }
  const float dot = butterfly_sum(part);
  for (int j = 0; j < S; j++)
    fa_st<T>(sr + j, fa_ld<T>(pr + j) * (dr[j] - dot));
}

std::vector<float> randn(int64_t n, double scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)(scale * bert__rng_normal(&rng));
  return v;
}

template <typename T, int N>
void run_fwd(const float *sc, T *p, const int32_t *lengths, int64_t rows, int S,
             int A) {
  simt::run((int)((rows + fa::kRows - 1) / fa::kRows), 1, 0,
            [&] { fa::softmax_fwd_rows<T, N>(sc, p, lengths, rows, S, A); });
}

template <typename T, int N>
void run_bwd(const T *p, const float *dp, T *ds, int64_t rows, int S) {
  simt::run((int)((rows + fa::kRows - 1) / fa::kRows), 1, 0,
            [&] { fa::softmax_bwd_rows<T, N>(p, dp, ds, rows, S); });
}

/* The kernels at N values per lane (any that holds S), as layers_cuda.cu
 * launches them: a grid of rows / kRows blocks, rounded up. */
template <typename T>
void fwd_at(int N, const float *sc, T *p, const int32_t *lengths, int64_t rows,
            int S, int A) {
  switch (N) {
  case 4:
    return run_fwd<T, 4>(sc, p, lengths, rows, S, A);
  case 8:
    return run_fwd<T, 8>(sc, p, lengths, rows, S, A);
  case 16:
    return run_fwd<T, 16>(sc, p, lengths, rows, S, A);
  default:
    return run_fwd<T, 32>(sc, p, lengths, rows, S, A);
  }
}

template <typename T>
void bwd_at(int N, const T *p, const float *dp, T *ds, int64_t rows, int S) {
  switch (N) {
  case 4:
    return run_bwd<T, 4>(p, dp, ds, rows, S);
  case 8:
    return run_bwd<T, 8>(p, dp, ds, rows, S);
  case 16:
    return run_bwd<T, 16>(p, dp, ds, rows, S);
  default:
    return run_bwd<T, 32>(p, dp, ds, rows, S);
  }
}

template <typename T> bool same_bits(const std::vector<T> &a, const T *b) {
  return memcmp(a.data(), b, a.size() * sizeof(T)) == 0;
}

/* The first element where two rows of T differ, for the message. */
template <typename T>
int64_t first_diff(const std::vector<T> &a, const std::vector<T> &b) {
  for (size_t i = 0; i < a.size(); i++)
    if (memcmp(&a[i], &b[i], sizeof(T)) != 0)
      return (int64_t)i;
  return -1;
}

template <typename T>
void softmax_case(int B, int A, int S, const int32_t *lengths, int N) {
  const int64_t rows = (int64_t)B * A * S, n = rows * S;
  char name[96];
  snprintf(name, sizeof name, "%s B=%d A=%d S=%d%s, %d a lane", tname<T>(), B,
           A, S, lengths != NULL ? " (padding)" : "", N);
  const std::vector<float> sc = randn(n, 3), dp = randn(n, 1);
  std::vector<T> want(n), got(n), dwant(n), dgot(n);
  for (int64_t r = 0; r < rows; r++) {
    const int len = lengths != NULL ? lengths[r / ((int64_t)A * S)] : S;
    model_fwd_row<T>(sc.data() + r * S, want.data() + r * S, len, S);
  }
  memset((void *)got.data(), 0xff, n * sizeof(T));
  fwd_at<T>(N, sc.data(), got.data(), lengths, rows, S, A);
  const int64_t at = first_diff(want, got);
  ok(at < 0, "%s: forward bit for bit as the loop kernel (first apart: %lld)",
     name, (long long)at);

  for (int64_t r = 0; r < rows; r++)
    model_bwd_row<T>(want.data() + r * S, dp.data() + r * S,
                     dwant.data() + r * S, S);
  memset((void *)dgot.data(), 0xff, n * sizeof(T));
  bwd_at<T>(N, want.data(), dp.data(), dgot.data(), rows, S);
  const int64_t bat = first_diff(dwant, dgot);
  ok(bat < 0, "%s: backward bit for bit (first apart: %lld)", name,
     (long long)bat);
}

/* float32 in place, as layers_cuda.cu runs it: P over the scores, then
 * dS over dP. */
void in_place_case(int B, int A, int S, const int32_t *lengths) {
  const int64_t rows = (int64_t)B * A * S, n = rows * S;
  const int N = fa::softmax_lanes(S);
  std::vector<float> sc = randn(n, 3), dp = randn(n, 1);
  std::vector<float> want(n), dwant(n);
  for (int64_t r = 0; r < rows; r++) {
    const int len = lengths != NULL ? lengths[r / ((int64_t)A * S)] : S;
    model_fwd_row<float>(sc.data() + r * S, want.data() + r * S, len, S);
    model_bwd_row<float>(want.data() + r * S, dp.data() + r * S,
                         dwant.data() + r * S, S);
  }
  fwd_at<float>(N, sc.data(), sc.data(), lengths, rows, S, A);
  ok(same_bits(want, sc.data()),
     "f32 B=%d A=%d S=%d: forward in place (P over the scores)", B, A, S);
  bwd_at<float>(N, sc.data(), dp.data(), dp.data(), rows, S);
  ok(same_bits(dwant, dp.data()),
     "f32 B=%d A=%d S=%d: backward in place (dS over dP)", B, A, S);
}

/* The host model against a softmax in double: what "the same bits" is
 * the same as. */
void model_against_double(void) {
  const int S = 257;
  const int32_t lens[3] = {257, 100, 0};
  const std::vector<float> sc = randn(3 * S, 3);
  double worst = 0;
  int masked_zero = 1, uniform = 1;
  for (int b = 0; b < 3; b++) {
    std::vector<float> p(S);
    model_fwd_row<float>(sc.data() + b * S, p.data(), lens[b], S);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < lens[b]; j++)
      mx = fmax(mx, sc[b * S + j]);
    for (int j = 0; j < lens[b]; j++)
      sum += exp(sc[b * S + j] - mx);
    for (int j = 0; j < S; j++) {
      if (lens[b] == 0)
        uniform &= fabs(p[j] - 1.0 / S) <= 1e-9;
      else if (j >= lens[b])
        masked_zero &= p[j] == 0.0f;
      else
        worst = fmax(worst, fabs(p[j] - exp(sc[b * S + j] - mx) / sum));
    }
  }
  ok(worst <= 1e-6,
     "the model: float32 probabilities within 1e-6 of double "
     "(%.1e)",
     worst);
  ok(masked_zero, "the model: masked keys weigh exactly 0");
  ok(uniform, "the model: a sequence of length 0 weighs its keys 1/S");
}

template <typename T> void cases(void) {
  static const int32_t len2[2] = {13, 5}, len1[1] = {1}, len0[2] = {0, 32};
  static const int32_t len130[2] = {129, 7}, len600[1] = {511};
  softmax_case<T>(2, 3, 13, len2, 4);
  softmax_case<T>(2, 3, 13, len2, 32);
  softmax_case<T>(1, 2, 1, len1, 4);
  softmax_case<T>(2, 1, 32, len0, 4);
  softmax_case<T>(1, 1, 33, NULL, 4);
  softmax_case<T>(2, 2, 130, len130, 8);
  softmax_case<T>(1, 1, 257, NULL, 16);
  softmax_case<T>(1, 1, 600, len600, 32);
  softmax_case<T>(1, 1, 1024, NULL, 32);
}

} /* namespace */

int main(void) {
  uint64_t seed = 17;
  bert__rng_seed(&rng, &seed, 1);
  static const int S[9] = {1, 128, 129, 256, 257, 512, 513, 1024, 1025};
  static const int N[9] = {4, 4, 8, 8, 16, 16, 32, 32, 0};
  for (int i = 0; i < 9; i++)
    is_int(N[i], fa::softmax_lanes(S[i]), "softmax_lanes(%d)", S[i]);
  model_against_double();
  cases<float>();
  cases<simt_bf16>();
  cases<simt_fp16>();
  in_place_case(2, 3, 13, NULL);
  in_place_case(1, 2, 600, NULL);
  done_testing();
  return tap_exit_status();
}
