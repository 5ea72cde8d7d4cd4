/*
 * flash_mma.h - flash attention's three kernels (forward, dQ, dK and dV)
 * for heads of 64 in a 16-bit T, register-resident on tensor cores:
 * FlashAttention-2's layout on mma.sync.m16n8k16 (float32 accumulation).
 *
 * Each block has 4 warps and takes 64 rows of one (sequence, head):
 * queries (forward, dQ) or keys (dK and dV); each warp keeps its 16 rows
 * as A fragments in registers and walks the other side in tiles of 64
 * rows, loaded into shared memory by cp.async one tile ahead of use
 * (double buffered). The scores, the probabilities and the accumulators
 * never leave the registers: a score tile's C fragment, rounded to T, is
 * the A fragment of the next product as it stands (FlashAttention-2's
 * trick: the m16n8 C layout of two adjacent n8 tiles is the m16k16 A
 * layout). Numerics are layers_cuda.cu's "flash attention": the scores
 * in float32, P rounded to T for each product, the rows' sums unrounded.
 *
 * The kernels are written against a handful of warp primitives (fa_mma,
 * fa_ldsm4, fa_ldsm4_t, fa_shfl_xor, fa_cp16 and its groups, the block
 * barrier). nvcc gets them here, as the instructions themselves; a host
 * program may define FA_HOST_SIMT and give its own, and then runs the
 * same kernel source on the CPU, a coroutine per lane (t/unit/flash_simt.cc:
 * the host twin that checks these kernels where there is no GPU).
 *
 * Fragments (PTX ISA, mma.m16n8k16, 16-bit A and B): lane l, g = l / 4,
 * t = l % 4. A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g + 8, 2t..),
 * a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..). B (16 x 8): b0 = (2t..2t+1,
 * g), b1 = (2t + 8.., g). C (16 x 8, float): c0, c1 = (g, 2t..2t+1),
 * c2, c3 = (g + 8, 2t..). A pair's lower index is the register's lower
 * half.
 */
#ifndef BERT_FLASH_MMA_H
#define BERT_FLASH_MMA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "layers.h"

#ifndef FA_HOST_SIMT
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace fa {

typedef uint32_t u32;

const int kD = 64;                  /* the head width */
const int kTile = 64;               /* rows of a block's tile */
const int kThreads = 128;           /* 4 warps of 16 rows */
const int kLd = kD + 8;             /* a T tile's row in shared memory: */
const int kTileElems = kTile * kLd; /* 144 bytes, ldmatrix conflict-free */
/* The softmax runs in base 2: exp(x) = 2^(x log2 e), the scale and
 * log2 e folded into one multiply-add per score (FlashAttention's way:
 * on an H100 the exponentials' unit, not the tensor cores, bounds heads
 * of 64, so every instruction per score counts). The LSE kept for
 * backward is in base e. */
const float kLog2e = 1.44269504088896341f;
const float kLn2 = 0.693147180559945309f;

#ifndef FA_HOST_SIMT

#define FA_DEV __device__ __forceinline__
/* A kernel of kThreads threads; FA_KERNEL_MIN: at least `blocks` of them
 * resident per SM (the register budget ptxas aims for). */
#define FA_KERNEL __global__ void __launch_bounds__(fa::kThreads)
#define FA_KERNEL_MIN(blocks)                                                  \
  __global__ void __launch_bounds__(fa::kThreads, blocks)
#define FA_SMEM(name) extern __shared__ __align__(128) unsigned char name[]

FA_DEV int fa_tid(void) { return threadIdx.x; }
FA_DEV int fa_bx(void) { return blockIdx.x; }
FA_DEV int fa_by(void) { return blockIdx.y; }
FA_DEV void fa_sync(void) { __syncthreads(); }
FA_DEV float fa_shfl_xor(float v, int m) {
  return __shfl_xor_sync(0xffffffffu, v, m);
}

/* The shared-memory address of p, for ldmatrix and cp.async. */
FA_DEV u32 fa_saddr(const void *p) { return (u32)__cvta_generic_to_shared(p); }

/* ldmatrix x4: lane l gives the address of row l % 8 of matrix l / 8;
 * r[i] is matrix i's element pair (l / 4, 2 (l % 4)..+1), or with _t
 * (transposed) the pair (2 (l % 4)..+1, l / 4). */
FA_DEV void fa_ldsm4(u32 r[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(fa_saddr(p)));
}
FA_DEV void fa_ldsm4_t(u32 r[4], const void *p) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(fa_saddr(p)));
}

/* 16 bytes from global to shared, asynchronously; fa_cp_commit closes a
 * group, fa_cp_wait<N> waits for all but the newest N groups. */
FA_DEV void fa_cp16(void *dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(fa_saddr(dst)),
               "l"(src));
}
FA_DEV void fa_cp_commit(void) { asm volatile("cp.async.commit_group;"); }
template <int N> FA_DEV void fa_cp_wait(void) {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
FA_DEV void fa_zero16(void *dst) { *(uint4 *)dst = make_uint4(0, 0, 0, 0); }

/* 2^x, the hardware's approximation (about 2 ulp; results below 2^-126
 * flush to 0, which a softmax weight rounded to 16 bits never misses). */
FA_DEV float fa_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* d += A B, one m16n8k16 product of T with float32 accumulation. */
template <typename T>
FA_DEV void fa_mma(float d[4], const u32 a[4], u32 b0, u32 b1);
template <>
FA_DEV void fa_mma<__nv_bfloat16>(float d[4], const u32 a[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
FA_DEV void fa_mma<__half>(float d[4], const u32 a[4], u32 b0, u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* lo and hi rounded to T (to nearest even), lo in the lower half. */
template <typename T> FA_DEV u32 fa_pack(float lo, float hi);
template <> FA_DEV u32 fa_pack<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *(u32 *)&v;
}
template <> FA_DEV u32 fa_pack<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *(u32 *)&v;
}
/* x rounded to T and back. */
template <typename T> FA_DEV float fa_round(float x);
template <> FA_DEV float fa_round<__nv_bfloat16>(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
template <> FA_DEV float fa_round<__half>(float x) {
  return __half2float(__float2half_rn(x));
}

#endif /* !FA_HOST_SIMT */

/* ---- tiles --------------------------------------------------------------- */

/* Rows [r0, r0 + 64) of one head (src: its row 0, rows H apart) into a
 * shared tile by cp.async (the caller commits); rows at or past S are
 * zeros. src and H*sizeof(T) are multiples of 16 bytes (flash_fits and
 * flash_aligned). The whole block. */
template <typename T>
FA_DEV void fa_load(T *dst, const T *src, int r0, int S, int H) {
  const int per = kD / 8; /* 16-byte pieces per row */
  for (int i = fa_tid(); i < kTile * per; i += kThreads) {
    const int r = i / per, e = (i % per) * 8;
    if (r0 + r < S)
      fa_cp16(dst + r * kLd + e, src + (int64_t)(r0 + r) * H + e);
    else
      fa_zero16(dst + r * kLd + e);
  }
}

/* Lane addressing of ldmatrix x4 over a 16 x 16 block at (row, col) of
 * a tile: fa_arow/fa_acol give A's four 8 x 8 matrices (rows 0-7, 8-15
 * of columns 0-7, then of 8-15) and, transposed, B's from a [k][n] tile
 * (two n8 tiles: r[0..1], r[2..3]); fa_brow/fa_bcol give B's from an
 * [n][k] tile, untransposed (n 0-7 at k 0-7, 8-15; then n 8-15). */
FA_DEV int fa_arow(int lane) { return lane % 8 + (lane / 8 % 2) * 8; }
FA_DEV int fa_acol(int lane) { return lane / 16 * 8; }
FA_DEV int fa_brow(int lane) { return lane % 8 + lane / 16 * 8; }
FA_DEV int fa_bcol(int lane) { return lane / 8 % 2 * 8; }

/* The score of a masked key: BERT_MASK_VALUE, except in a sequence of
 * length 0, where every key is masked and the softmax is uniform either
 * way; there 0, so that the row's log-sum-exp stays exact (with -1e9 it,
 * -1e9 + log S, rounds to -1e9 in float, and backward's exp(score - LSE)
 * would be 1 rather than 1/S). */
FA_DEV float fa_mask_value(int len) { return len > 0 ? BERT_MASK_VALUE : 0.0f; }

/* A block's (sequence, head) and its place in it: the lane's thread,
 * warp and group (g: the C fragment's row), the row width H, the head's
 * offset (base: its row 0 in q, k, v and the outputs), the first row of
 * the block's 64 (queries or keys), the sequence's length and masked
 * score, and the tiles of 64 that S makes. */
struct FaBlock {
  int tid, w, g, H, bh, b, r0, len, tiles;
  int64_t base;
  float mv2; /* the masked score in base 2 (fa_mask_value log2 e) */
};
FA_DEV FaBlock fa_block(const int32_t *lengths, int S, int A) {
  FaBlock f;
  f.tid = fa_tid(), f.w = f.tid / 32, f.g = f.tid % 32 / 4;
  f.H = A * kD, f.bh = fa_by(), f.b = f.bh / A, f.r0 = fa_bx() * kTile;
  f.len = lengths != NULL ? lengths[f.b] : S;
  f.base = (int64_t)f.b * S * f.H + (int64_t)(f.bh % A) * kD;
  f.mv2 = fa_mask_value(f.len) * kLog2e;
  f.tiles = (S + kTile - 1) / kTile;
  return f;
}

/* The row (query or key) of this lane's C fragment half h (g or g + 8). */
FA_DEV int fa_row(const FaBlock &f, int h) {
  return f.r0 + 16 * f.w + f.g + 8 * h;
}

/* Step i of a walk over the other side's tiles: two tensors a and b (K
 * and V, or Q and dO) in two stages of st (stage i % 2: a's tile at 2 (i %
 * 2) tiles, b's after it), tile 0 loaded and committed before step 0:
 * tile i + 1 into the other stage, then the wait for tile i and the
 * barrier. Stage i's tile of a. The whole block. */
template <typename T>
FA_DEV const T *fa_step(T *st, const T *a, const T *b, int i, int tiles, int S,
                        int H) {
  if (i + 1 < tiles) {
    T *next = st + (i + 1) % 2 * 2 * kTileElems;
    fa_load(next, a, (i + 1) * kTile, S, H);
    fa_load(next + kTileElems, b, (i + 1) * kTile, S, H);
    fa_cp_commit();
    fa_cp_wait<1>();
  } else {
    fa_cp_wait<0>();
  }
  fa_sync();
  return st + i % 2 * 2 * kTileElems;
}

FA_DEV void fa_zero(float x[8][4]) {
  for (int j = 0; j < 8; j++)
    x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
}

/* The A fragments of a warp's 16 rows (at row 16 w of tile s): 4 of k16
 * across the 64 columns. */
template <typename T> FA_DEV void fa_frag_a(u32 a[4][4], const T *s, int w) {
  const int lane = fa_tid() % 32;
  for (int kk = 0; kk < 4; kk++)
    fa_ldsm4(a[kk],
             s + (16 * w + fa_arow(lane)) * kLd + 16 * kk + fa_acol(lane));
}

/* c (16 x 64 float: 8 n8 tiles) = A (16 x 64, fragments a) times the
 * transpose of tile s (64 rows: c's columns; 64 columns: the k). */
template <typename T>
FA_DEV void fa_mma_nt(float c[8][4], const u32 a[4][4], const T *s) {
  const int lane = fa_tid() % 32;
  fa_zero(c);
  for (int kk = 0; kk < 4; kk++)
    for (int n = 0; n < 4; n++) {
      u32 b[4];
      fa_ldsm4(b, s + (16 * n + fa_brow(lane)) * kLd + 16 * kk + fa_bcol(lane));
      fa_mma<T>(c[2 * n], a[kk], b[0], b[1]);
      fa_mma<T>(c[2 * n + 1], a[kk], b[2], b[3]);
    }
}

/* acc (16 x 64) += P (16 x 64 of T: fragments p, k along the tile's
 * rows) times tile s (64 x 64, rows the k). */
template <typename T>
FA_DEV void fa_mma_nn(float acc[8][4], const u32 p[4][4], const T *s) {
  const int lane = fa_tid() % 32;
  for (int kk = 0; kk < 4; kk++)
    for (int n = 0; n < 4; n++) {
      u32 b[4];
      fa_ldsm4_t(b,
                 s + (16 * kk + fa_arow(lane)) * kLd + 16 * n + fa_acol(lane));
      fa_mma<T>(acc[2 * n], p[kk], b[0], b[1]);
      fa_mma<T>(acc[2 * n + 1], p[kk], b[2], b[3]);
    }
}

/* The A fragments of x (16 x 64 float, C layout) rounded to T. */
template <typename T> FA_DEV void fa_to_a(u32 a[4][4], const float x[8][4]) {
  for (int kk = 0; kk < 4; kk++) {
    a[kk][0] = fa_pack<T>(x[2 * kk][0], x[2 * kk][1]);
    a[kk][1] = fa_pack<T>(x[2 * kk][2], x[2 * kk][3]);
    a[kk][2] = fa_pack<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    a[kk][3] = fa_pack<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

/* One row of a head's output (at out) from the C fragment half h (row g
 * or g + 8) of x times mul, rounded to T: this lane's two columns of each
 * n8 tile. */
template <typename T>
FA_DEV void fa_store_row(T *out, const float x[8][4], int h, float mul) {
  const int t = fa_tid() % 4;
  for (int j = 0; j < 8; j++)
    *(u32 *)(out + 8 * j + 2 * t) =
        fa_pack<T>(x[j][2 * h] * mul, x[j][2 * h + 1] * mul);
}

/* The column (key or query index within a tile) of element e of n8 tile
 * j of this lane's C fragment. */
FA_DEV int fa_ccol(int j, int e) { return 8 * j + 2 * (fa_tid() % 4) + e % 2; }

/* Whether the key tile at k0 holds only real keys (below S and the
 * sequence's length): no score of it is masked. The same for the whole
 * block, so a branch on it does not diverge. */
FA_DEV bool fa_full_tile(int k0, int S, int len) {
  return k0 + kTile <= S && k0 + kTile <= len;
}

/* ---- forward ------------------------------------------------------------- */

/* grid (query tiles, B*A), kThreads threads, fa_smem(0) bytes. ctx and a
 * copy of it (ocopy), the LSE of every query row, and the sequences'
 * lengths (lens) for backward. */
template <typename T>
FA_KERNEL fa_fwd_kernel(const T *q, const T *k, const T *v,
                        const int32_t *lengths, T *ctx, float *lse,
                        int32_t *lens, T *ocopy, int S, int A, float scale) {
  FA_SMEM(smem);
  T *sq = (T *)smem, *skv = sq + kTileElems; /* stage i: K, V at 2 i */
  const FaBlock f = fa_block(lengths, S, A);
  const int H = f.H, len = f.len;
  const int64_t base = f.base;
  if (f.r0 == 0 && f.bh % A == 0 && f.tid == 0)
    lens[f.b] = len; /* for backward, which is not given lengths */
  fa_load(sq, q + base, f.r0, S, H);
  fa_load(skv, k + base, 0, S, H);
  fa_load(skv + kTileElems, v + base, 0, S, H);
  fa_cp_commit();
  const float c = scale * kLog2e;
  u32 qa[4][4], pa[4][4];
  float o[8][4], s[8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  fa_zero(o);
  for (int i = 0; i < f.tiles; i++) {
    const T *sk = fa_step(skv, k + base, v + base, i, f.tiles, S, H);
    const T *sv = sk + kTileElems;
    if (i == 0)
      fa_frag_a(qa, sq, f.w);
    fa_mma_nt<T>(s, qa, sk);
    /* the scores in base 2 (s times c), the masked ones set, unless the
     * tile is full: then s stays the product, and cs = c scales it in
     * the exponent's multiply-add below */
    float mx[2] = {-INFINITY, -INFINITY}, cs = 1.0f;
    if (fa_full_tile(i * kTile, S, len)) {
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++)
          mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
      mx[0] *= c, mx[1] *= c, cs = c;
    } else {
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
          const int key = i * kTile + fa_ccol(j, e);
          const float x = key >= S    ? -INFINITY
                          : key < len ? s[j][e] * c
                                      : f.mv2;
          s[j][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
    }
    float alpha[2];
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(mx[h], fa_shfl_xor(mx[h], 1));
      mx[h] = fmaxf(mx[h], fa_shfl_xor(mx[h], 2));
      const float mnew = fmaxf(m[h], mx[h]);
      alpha[h] = fa_exp2(m[h] - mnew);
      m[h] = mnew;
      l[h] *= alpha[h];
    }
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++) {
        const float p = fa_exp2(fmaf(s[j][e], cs, -m[e / 2]));
        s[j][e] = p;
        l[e / 2] += p;
        o[j][e] *= alpha[e / 2];
      }
    fa_to_a<T>(pa, s);
    fa_mma_nn<T>(o, pa, sv);
    fa_sync(); /* every warp is done with this stage before it refills */
  }
  for (int h = 0; h < 2; h++) {
    l[h] += fa_shfl_xor(l[h], 1);
    l[h] += fa_shfl_xor(l[h], 2);
    const int row = fa_row(f, h);
    if (row >= S)
      continue;
    const int64_t at = base + (int64_t)row * H;
    fa_store_row<T>(ctx + at, o, h, 1.0f / l[h]);
    fa_store_row<T>(ocopy + at, o, h, 1.0f / l[h]);
    if (f.tid % 4 == 0)
      lse[(int64_t)f.bh * S + row] = (m[h] + log2f(l[h])) * kLn2;
  }
}

/* ---- backward ------------------------------------------------------------ */

/* dQ: grid (query tiles, B*A), fa_smem(1) bytes. d: rowsum(dctx ctx)
 * per query row (flash_rowdot_kernel). Both backward kernels are bounded
 * to three blocks per SM, as many as forward gets unbounded (134
 * registers): ptxas (sm_90) fits each in 168 registers with 4 to 8
 * bytes spilled, where unbounded it takes 169 to 239 and two fit. */
template <typename T>
FA_KERNEL_MIN(3)
fa_dq_kernel(const T *q, const T *k, const T *v, const T *dout,
             const int32_t *lengths, const float *lse, const float *d, T *dq,
             int S, int A, float scale) {
  FA_SMEM(smem);
  T *sq = (T *)smem, *sdo = sq + kTileElems, *skv = sdo + kTileElems;
  const FaBlock f = fa_block(lengths, S, A);
  const int H = f.H;
  const int64_t base = f.base;
  /* L2: each row's LSE in base 2, +inf past S (every weight 0 there) */
  const float c = scale * kLog2e;
  float L2[2], D[2];
  bool valid[2];
  for (int h = 0; h < 2; h++) {
    const int row = fa_row(f, h);
    valid[h] = row < S;
    L2[h] = valid[h] ? lse[(int64_t)f.bh * S + row] * kLog2e : INFINITY;
    D[h] = valid[h] ? d[(int64_t)f.bh * S + row] : 0.0f;
  }
  fa_load(sq, q + base, f.r0, S, H);
  fa_load(sdo, dout + base, f.r0, S, H);
  fa_load(skv, k + base, 0, S, H);
  fa_load(skv + kTileElems, v + base, 0, S, H);
  fa_cp_commit();
  u32 qa[4][4], doa[4][4], sa[4][4];
  float acc[8][4], s[8][4], dp[8][4];
  fa_zero(acc);
  for (int i = 0; i < f.tiles; i++) {
    const T *sk = fa_step(skv, k + base, v + base, i, f.tiles, S, H);
    const T *sv = sk + kTileElems;
    if (i == 0) {
      fa_frag_a(qa, sq, f.w);
      fa_frag_a(doa, sdo, f.w);
    }
    fa_mma_nt<T>(s, qa, sk);
    fa_mma_nt<T>(dp, doa, sv);
    if (fa_full_tile(i * kTile, S, f.len)) {
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
          const float p = fa_exp2(fmaf(s[j][e], c, -L2[e / 2]));
          s[j][e] = fa_round<T>(p) * (dp[j][e] - D[e / 2]);
        }
    } else { /* the tile's real keys, then those below S (the rest: 0) */
      const int real = (f.len < S ? f.len : S) - i * kTile, in = S - i * kTile;
      for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
          const int col = fa_ccol(j, e);
          const float x = col < real ? s[j][e] * c : f.mv2;
          const float p = col < in ? fa_exp2(x - L2[e / 2]) : 0.0f;
          s[j][e] = fa_round<T>(p) * (dp[j][e] - D[e / 2]);
        }
    }
    fa_to_a<T>(sa, s);
    fa_mma_nn<T>(acc, sa, sk);
    fa_sync();
  }
  for (int h = 0; h < 2; h++)
    if (valid[h])
      fa_store_row<T>(dq + base + (int64_t)fa_row(f, h) * H, acc, h, scale);
}

/* Query rows [r0, r0 + 64)'s LSE, in base 2 (+inf past S: a weight of
 * 0), into l[0..64) and their d into l[64..128) (0 past S). The whole
 * block; plain stores, seen after the next barrier. */
FA_DEV void fa_rows(float *l, const float *lse, const float *d,
                    const FaBlock &f, int r0, int S) {
  for (int r = f.tid; r < kTile; r += kThreads) {
    const bool in = r0 + r < S;
    const int64_t at = (int64_t)f.bh * S + r0 + r;
    l[r] = in ? lse[at] * kLog2e : INFINITY;
    l[kTile + r] = in ? d[at] : 0.0f;
  }
}

/* dK and dV: grid (key tiles, B*A), fa_smem(2) bytes (three blocks per
 * SM: above). */
template <typename T>
FA_KERNEL_MIN(3)
fa_dkdv_kernel(const T *q, const T *k, const T *v, const T *dout,
               const int32_t *lengths, const float *lse, const float *d, T *dk,
               T *dv, int S, int A, float scale) {
  FA_SMEM(smem);
  T *sk = (T *)smem, *sv = sk + kTileElems, *sqd = sv + kTileElems;
  float *sld = (float *)(sqd + 4 * kTileElems); /* stage i: LSE, d */
  const FaBlock f = fa_block(lengths, S, A);
  const int H = f.H, k0 = f.r0;
  const int64_t base = f.base;
  /* a key row's score in base 2 is st cr + br: st c for a real key, the
   * masked score for a padded one, -inf past S (a weight of 0) */
  bool key[2];
  float cr[2], br[2];
  for (int h = 0; h < 2; h++) {
    const int j = fa_row(f, h);
    key[h] = j < S;
    cr[h] = key[h] && j < f.len ? scale * kLog2e : 0.0f;
    br[h] = !key[h] ? -INFINITY : j < f.len ? 0.0f : f.mv2;
  }
  fa_load(sk, k + base, k0, S, H);
  fa_load(sv, v + base, k0, S, H);
  fa_load(sqd, q + base, 0, S, H);
  fa_load(sqd + kTileElems, dout + base, 0, S, H);
  fa_rows(sld, lse, d, f, 0, S);
  fa_cp_commit();
  u32 ka[4][4], va[4][4], pa[4][4];
  float dka[8][4], dva[8][4], st[8][4], dpt[8][4];
  fa_zero(dka);
  fa_zero(dva);
  for (int i = 0; i < f.tiles; i++) {
    /* query tile i + 1's LSE and d into the other stage (last read in
     * step i - 1, before its closing barrier), then its Q and dO by
     * fa_step, which waits for tile i's */
    if (i + 1 < f.tiles)
      fa_rows(sld + (i + 1) % 2 * 2 * kTile, lse, d, f, (i + 1) * kTile, S);
    const T *sq = fa_step(sqd, q + base, dout + base, i, f.tiles, S, H);
    const T *sdo = sq + kTileElems;
    const float *sl = sld + i % 2 * 2 * kTile, *sd = sl + kTile;
    if (i == 0) {
      fa_frag_a(ka, sk, f.w);
      fa_frag_a(va, sv, f.w);
    }
    /* dV first, then dP^T: fewer accumulators live at once */
    fa_mma_nt<T>(st, ka, sq); /* S^T = K Q^T: a row per key */
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++) {
        const int h = e / 2;
        st[j][e] = fa_round<T>(
            fa_exp2(fmaf(st[j][e], cr[h], br[h] - sl[fa_ccol(j, e)])));
      }
    fa_to_a<T>(pa, st);
    fa_mma_nn<T>(dva, pa, sdo);
    fa_mma_nt<T>(dpt, va, sdo); /* dP^T = V dO^T */
    for (int j = 0; j < 8; j++)
      for (int e = 0; e < 4; e++)
        dpt[j][e] = st[j][e] * (dpt[j][e] - sd[fa_ccol(j, e)]);
    fa_to_a<T>(pa, dpt);
    fa_mma_nn<T>(dka, pa, sq);
    fa_sync();
  }
  for (int h = 0; h < 2; h++)
    if (key[h]) {
      const int64_t at = base + (int64_t)fa_row(f, h) * H;
      fa_store_row<T>(dk + at, dka, h, scale);
      fa_store_row<T>(dv + at, dva, h, 1.0f);
    }
}

/* Dynamic shared memory of each kernel (bytes): forward Q and two
 * stages of K, V; dQ Q, dO and two stages of K, V; dK dV K, V and two
 * stages of Q, dO and 64 LSEs and d. */
inline size_t fa_smem(int kind) {
  const size_t t = sizeof(uint16_t) * kTileElems;
  return kind == 0   ? 5 * t
         : kind == 1 ? 6 * t
                     : 6 * t + 2 * 2 * sizeof(float) * kTile;
}

} /* namespace fa */

#endif
