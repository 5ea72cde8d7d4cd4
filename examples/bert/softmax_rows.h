/*
 * softmax_rows.h - the attention's row softmaxes, forward and backward,
 * with a row held in registers: a warp per row of S scores, N values per
 * lane (S <= 32 N, N 4 to 32, so S up to 1024).
 *
 * The float32 scores are read once and P (or dS) written once. The loop
 * kernels of layers_cuda.cu (softmax_fwd_kernel, softmax_bwd_kernel),
 * which take any S, read a row's scores twice and write the exponentials
 * back between: about 2.7x the bytes forward (at base B 32 x S 512, 1.6
 * GB against 0.6 GB a layer) and 1.7x backward, on passes that memory
 * bounds. The operations are the loops', in the same order (each lane's
 * keys j = lane + 32 i in increasing i, then the same butterfly across
 * the warp), so the results are theirs bit for bit.
 *
 * Written against flash_mma.h's primitives (fa_tid, fa_bx, fa_shfl_xor)
 * and two of its own (fa_ld, fa_st: an element of T to float and back),
 * so that the host twin runs this source too (t/unit/softmax_simt.cc).
 * A block is fa::kThreads threads: kRows rows; grid (rows / kRows,
 * rounded up).
 */
#ifndef BERT_SOFTMAX_ROWS_H
#define BERT_SOFTMAX_ROWS_H

#include "flash_mma.h"

namespace fa {

const int kRows = kThreads / 32; /* rows per block: a warp each */

/* The values per lane that hold a row of S keys: the fewest of 4, 8, 16
 * and 32 with S <= 32 N; 0 beyond 1024 (the loop kernels). */
inline int softmax_lanes(int S) {
  for (int n = 4; n <= 32; n *= 2)
    if (S <= 32 * n)
      return n;
  return 0;
}

#ifndef FA_HOST_SIMT
/* An element of T as a float (exact), and a float rounded to T (to
 * nearest even; float16 overflows to +-inf): layers_cuda.cu's to_float
 * and from_float. */
template <typename T> FA_DEV float fa_ld(const T *p);
template <> FA_DEV float fa_ld<float>(const float *p) { return *p; }
template <> FA_DEV float fa_ld<__nv_bfloat16>(const __nv_bfloat16 *p) {
  return __bfloat162float(*p);
}
template <> FA_DEV float fa_ld<__half>(const __half *p) {
  return __half2float(*p);
}
template <typename T> FA_DEV void fa_st(T *p, float x);
template <> FA_DEV void fa_st<float>(float *p, float x) { *p = x; }
template <> FA_DEV void fa_st<__nv_bfloat16>(__nv_bfloat16 *p, float x) {
  *p = __float2bfloat16_rn(x);
}
template <> FA_DEV void fa_st<__half>(__half *p, float x) {
  *p = __float2half_rn(x);
}
#endif

/* The warp's sum and maximum, by the butterfly of layers_cuda.cu's
 * warp_sum and warp_max (every lane gets the same bits). */
FA_DEV float fa_warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2)
    v += fa_shfl_xor(v, o);
  return v;
}
FA_DEV float fa_warp_max(float v) {
  for (int o = 16; o > 0; o /= 2)
    v = fmaxf(v, fa_shfl_xor(v, o));
  return v;
}

/* P = softmax of each row of the float32 scores sc ([rows, S]) into p;
 * keys at >= lengths[b] (row / (A S) = b) scored BERT_MASK_VALUE; every
 * key of a row when lengths is NULL. For float32, p may be sc. */
template <typename T, int N>
FA_KERNEL softmax_fwd_rows(const float *sc, T *p, const int32_t *lengths,
                           int64_t rows, int S, int A) {
  const int64_t row = (int64_t)fa_bx() * kRows + fa_tid() / 32;
  const int lane = fa_tid() % 32;
  if (row >= rows) /* the whole warp */
    return;
  const float *r = sc + row * S;
  T *pr = p + row * S;
  const int len = lengths != NULL ? lengths[row / ((int64_t)A * S)] : S;
  float v[N];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; i++) {
    const int j = lane + 32 * i;
    if (j < S) {
      v[i] = j < len ? r[j] : BERT_MASK_VALUE;
      mx = fmaxf(mx, v[i]);
    }
  }
  mx = fa_warp_max(mx);
  float s = 0;
#pragma unroll
  for (int i = 0; i < N; i++)
    if (lane + 32 * i < S) {
      v[i] = expf(v[i] - mx);
      s += v[i];
    }
  s = fa_warp_sum(s);
  const float inv = 1.0f / s;
#pragma unroll
  for (int i = 0; i < N; i++)
    if (lane + 32 * i < S)
      fa_st<T>(pr + lane + 32 * i, v[i] * inv);
}

/* dS = P * (dP - rowsum(P * dP)) of each row, from P (in T) and the
 * float32 dP, into ds (rounded once to T). For float32, ds may be dp. */
template <typename T, int N>
FA_KERNEL softmax_bwd_rows(const T *p, const float *dp, T *ds, int64_t rows,
                           int S) {
  const int64_t row = (int64_t)fa_bx() * kRows + fa_tid() / 32;
  const int lane = fa_tid() % 32;
  if (row >= rows)
    return;
  const T *pr = p + row * S;
  const float *dr = dp + row * S;
  T *sr = ds + row * S;
  float pv[N], dv[N];
  float dot = 0;
#pragma unroll
  for (int i = 0; i < N; i++) {
    const int j = lane + 32 * i;
    if (j < S) {
      pv[i] = fa_ld<T>(pr + j);
      dv[i] = dr[j];
      dot += pv[i] * dv[i];
    }
  }
  dot = fa_warp_sum(dot);
#pragma unroll
  for (int i = 0; i < N; i++)
    if (lane + 32 * i < S)
      fa_st<T>(sr + lane + 32 * i, pv[i] * (dv[i] - dot));
}

} /* namespace fa */

#endif /* BERT_SOFTMAX_ROWS_H */
