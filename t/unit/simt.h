/*
 * simt.h - runs a CUDA kernel's own source on the CPU: the warp
 * primitives of examples/bert/flash_mma.h (FA_HOST_SIMT) over a block of
 * 128 lanes, each a coroutine (ucontext) that runs until it reaches a
 * collective (an mma, an ldmatrix, a shuffle, the block barrier). When
 * every lane of its warp (or of the block, for the barrier) is there,
 * the collective is carried out on all their inputs at once, by the PTX
 * ISA's fragment layouts, and the lanes go on. One lane at a time, a
 * warp as far as it goes before the next (run_block), in a fixed order:
 * the same results every run.
 *
 * Stricter than the hardware, so that what only a GPU would show fails
 * here:
 *  - cp.async copies nothing until the fa_cp_wait that covers its group
 *    (a read before the wait sees the tile's old bytes), or with
 *    land_early everything at its issue (a refill before every reader is
 *    done overwrites what they read); a lane that ends with copies
 *    outstanding is a failure;
 *  - warp 0 runs to the block barrier before warp 1 starts, and so on:
 *    a warp gets as far ahead of the others as the barriers allow;
 *  - shared memory starts as 0xff bytes (NaN in bfloat16 and float16),
 *    so a read of what nobody wrote shows in the results;
 *  - an ldmatrix row or a cp.async outside the block's shared memory or
 *    not 16-byte aligned, lanes of a warp at different collectives, and
 *    a barrier that not every lane reaches end the program with a
 *    message naming the lane and the operation.
 *
 * Header-only, for the test programs of examples/bert's kernels
 * (t/unit/flash_simt.cc, t/unit/softmax_simt.cc).
 */
#ifndef HVD_T_SIMT_H
#define HVD_T_SIMT_H

#define FA_HOST_SIMT 1

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <type_traits>
#include <vector>

#include "base/half.h"

/* The 16-bit types of the host kernels: their bits. */
struct simt_bf16 {
  uint16_t bits;
};
struct simt_fp16 {
  uint16_t bits;
};

namespace simt {

typedef uint32_t u32;

const int kLanes = 128; /* a block: 4 warps */
const size_t kStack = 256 << 10;

enum Op { RUN, SYNC, MMA_BF16, MMA_FP16, LDSM, LDSM_T, SHFL, DONE };
static const char *const op_name[] = {
    "running",  "__syncthreads",  "mma (bf16)", "mma (fp16)",
    "ldmatrix", "ldmatrix.trans", "shfl.xor",   "exited"};

struct Copy {
  void *dst;
  const void *src;
  int group;
};

struct Lane {
  ucontext_t ctx;
  char *stack;
  Op op;
  u32 a[4], b[2], r[4];
  float d[4], f;
  int mask;
  const void *addr;
  std::vector<Copy> copies;
  int committed;
};

struct Block {
  int bx, by;
  unsigned char *smem;
  size_t bytes;
  int cur;
  ucontext_t sched;
  std::function<void()> body;
  Lane lane[kLanes];
};

static Block *blk;
/* When a cp.async's bytes land: at its wait (the latest the hardware
 * may) or at its issue (the earliest). */
static bool land_early;

[[noreturn]] static void die(const char *fmt, const char *what, int lane) {
  fprintf(stderr, "simt: block (%d, %d) lane %d: ", blk->bx, blk->by, lane);
  fprintf(stderr, fmt, what);
  fputc('\n', stderr);
  abort();
}

/* [p, p + n) inside the block's shared memory and p 16-byte aligned. */
static void check_smem(const void *p, size_t n, const char *what) {
  const unsigned char *c = (const unsigned char *)p;
  if (c < blk->smem || c + n > blk->smem + blk->bytes)
    die("%s outside shared memory", what, blk->cur);
  if ((uintptr_t)c % 16 != 0)
    die("%s not 16-byte aligned", what, blk->cur);
}

static Lane &me(void) { return blk->lane[blk->cur]; }

/* Parks this lane at op until the scheduler has carried it out. */
static void wait_at(Op op) {
  Lane &L = me();
  L.op = op;
  swapcontext(&L.ctx, &blk->sched);
}

template <typename T> float to_f(uint16_t h);
template <> inline float to_f<simt_bf16>(uint16_t h) {
  return hvd__bf16_to_f32(h);
}
template <> inline float to_f<simt_fp16>(uint16_t h) {
  return hvd__f16_to_f32(h);
}
template <typename T> uint16_t from_f(float x);
template <> inline uint16_t from_f<simt_bf16>(float x) {
  return hvd__f32_to_bf16(x);
}
template <> inline uint16_t from_f<simt_fp16>(float x) {
  return hvd__f32_to_f16(x);
}

static uint16_t half_of(u32 r, int hi) { return (uint16_t)(hi ? r >> 16 : r); }

/* D += A B over the warp at w (lanes w*32..): A 16 x 16 and B 16 x 8
 * gathered from every lane's fragments, each product exact and the sum
 * in double, rounded to float once. */
template <typename T> void mma_warp(Lane *W) {
  float A[16][16], B[16][8];
  for (int r = 0; r < 16; r++)
    for (int k = 0; k < 16; k++) {
      const Lane &L = W[(r % 8) * 4 + (k % 8) / 2];
      A[r][k] = to_f<T>(half_of(L.a[r / 8 + 2 * (k / 8)], k % 2));
    }
  for (int k = 0; k < 16; k++)
    for (int n = 0; n < 8; n++)
      B[k][n] = to_f<T>(half_of(W[n * 4 + (k % 8) / 2].b[k / 8], k % 2));
  for (int l = 0; l < 32; l++)
    for (int e = 0; e < 4; e++) {
      const int r = l / 4 + 8 * (e / 2), n = 2 * (l % 4) + e % 2;
      double s = W[l].d[e];
      for (int k = 0; k < 16; k++)
        s += (double)A[r][k] * B[k][n];
      W[l].d[e] = (float)s;
    }
}

/* ldmatrix x4 over the warp: matrix i's rows at the addresses of lanes
 * 8i..8i+7. */
static void ldsm_warp(Lane *W, bool trans) {
  for (int l = 0; l < 32; l++) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
      uint16_t lo, hi;
      if (!trans) {
        const uint16_t *row = (const uint16_t *)W[8 * i + g].addr;
        lo = row[2 * t], hi = row[2 * t + 1];
      } else {
        lo = ((const uint16_t *)W[8 * i + 2 * t].addr)[g];
        hi = ((const uint16_t *)W[8 * i + 2 * t + 1].addr)[g];
      }
      W[l].r[i] = (u32)lo | (u32)hi << 16;
    }
  }
}

static void shfl_warp(Lane *W) {
  float v[32];
  for (int l = 0; l < 32; l++)
    v[l] = W[l].f;
  for (int l = 0; l < 32; l++)
    W[l].f = v[l ^ W[l].mask];
}

/* Carries out warp w's collective if its 32 lanes are all at one;
 * whether it did. Lanes at different ones end the program. */
static bool release_warp(int w) {
  Lane *W = blk->lane + 32 * w;
  const Op op = W[0].op;
  for (int l = 1; l < 32; l++)
    if (W[l].op != op)
      die("at %s while lane 0 of its warp is at another collective",
          op_name[W[l].op], 32 * w + l);
  switch (op) {
  case MMA_BF16:
    mma_warp<simt_bf16>(W);
    break;
  case MMA_FP16:
    mma_warp<simt_fp16>(W);
    break;
  case LDSM:
  case LDSM_T:
    ldsm_warp(W, op == LDSM_T);
    break;
  case SHFL:
    shfl_warp(W);
    break;
  default:
    return false;
  }
  for (int l = 0; l < 32; l++)
    W[l].op = RUN;
  return true;
}

static void trampoline(void) {
  blk->body();
  Lane &L = me();
  if (!L.copies.empty())
    die("%s with cp.async copies never waited for", "exited", blk->cur);
  L.op = DONE;
}

/* Runs body as block (bx, by) of kLanes lanes with `bytes` of shared
 * memory (0xff bytes at the start). */
inline void run_block(int bx, int by, size_t bytes,
                      const std::function<void()> &body) {
  static Block b;
  static std::vector<unsigned char> smem;
  blk = &b;
  smem.assign(bytes + 16, 0xff);
  b.bx = bx, b.by = by, b.bytes = bytes, b.body = body;
  b.smem = smem.data() + (16 - (uintptr_t)smem.data() % 16) % 16;
  for (int i = 0; i < kLanes; i++) {
    Lane &L = b.lane[i];
    if (L.stack == NULL)
      L.stack = (char *)malloc(kStack);
    L.copies.clear();
    L.committed = 0;
    L.op = RUN;
    getcontext(&L.ctx);
    L.ctx.uc_stack.ss_sp = L.stack;
    L.ctx.uc_stack.ss_size = kStack;
    L.ctx.uc_link = &b.sched;
    makecontext(&L.ctx, trampoline, 0);
  }
  /* A warp at a time, as far as it goes (its collectives carried out
   * as it reaches them) until the block barrier: warp 0 gets as far
   * ahead of warp 3 as the barriers allow. */
  for (;;) {
    for (int w = 0; w < kLanes / 32; w++)
      do
        for (int i = 32 * w; i < 32 * w + 32; i++)
          if (b.lane[i].op == RUN) {
            b.cur = i;
            swapcontext(&b.sched, &b.lane[i].ctx);
          }
      while (release_warp(w));
    int done = 0, sync = 0;
    for (int i = 0; i < kLanes; i++) {
      done += b.lane[i].op == DONE;
      sync += b.lane[i].op == SYNC;
    }
    if (done == kLanes)
      return;
    if (sync != kLanes)
      die("%s: a barrier that not every lane reaches", op_name[b.lane[0].op],
          0);
    for (int i = 0; i < kLanes; i++)
      b.lane[i].op = RUN;
  }
}

/* A grid of gx x gy blocks, one after another. */
inline void run(int gx, int gy, size_t bytes,
                const std::function<void()> &body) {
  for (int y = 0; y < gy; y++)
    for (int x = 0; x < gx; x++)
      run_block(x, y, bytes, body);
}

} /* namespace simt */

/* ---- the primitives flash_mma.h asks of a host ------------------------- */

#define FA_DEV inline
#define FA_KERNEL void
#define FA_KERNEL_MIN(blocks) void
#define FA_SMEM(name) unsigned char *name = simt::blk->smem

inline int fa_tid(void) { return simt::blk->cur; }
inline int fa_bx(void) { return simt::blk->bx; }
inline int fa_by(void) { return simt::blk->by; }
inline void fa_sync(void) { simt::wait_at(simt::SYNC); }

inline float fa_shfl_xor(float v, int m) {
  simt::Lane &L = simt::me();
  L.f = v, L.mask = m;
  simt::wait_at(simt::SHFL);
  return L.f;
}

namespace simt {
static void ldsm(u32 r[4], const void *p, Op op) {
  check_smem(p, 16, op == LDSM ? "ldmatrix row" : "ldmatrix.trans row");
  me().addr = p;
  wait_at(op);
  memcpy(r, me().r, sizeof me().r);
}
} /* namespace simt */
inline void fa_ldsm4(uint32_t r[4], const void *p) {
  simt::ldsm(r, p, simt::LDSM);
}
inline void fa_ldsm4_t(uint32_t r[4], const void *p) {
  simt::ldsm(r, p, simt::LDSM_T);
}

inline void fa_cp16(void *dst, const void *src) {
  simt::check_smem(dst, 16, "cp.async destination");
  if ((uintptr_t)src % 16 != 0)
    simt::die("%s not 16-byte aligned", "cp.async source", simt::blk->cur);
  simt::Lane &L = simt::me();
  if (simt::land_early)
    memcpy(dst, src, 16);
  else
    L.copies.push_back(simt::Copy{dst, src, L.committed});
}
inline void fa_cp_commit(void) { simt::me().committed++; }
/* Copies the groups older than the newest N, as they complete. */
template <int N> inline void fa_cp_wait(void) {
  simt::Lane &L = simt::me();
  std::vector<simt::Copy> left;
  for (const simt::Copy &c : L.copies)
    if (c.group < L.committed - N)
      memcpy(c.dst, c.src, 16);
    else
      left.push_back(c);
  L.copies.swap(left);
}
inline void fa_zero16(void *dst) {
  simt::check_smem(dst, 16, "shared store");
  memset(dst, 0, 16);
}

template <typename T>
inline void fa_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  simt::Lane &L = simt::me();
  memcpy(L.a, a, sizeof L.a);
  L.b[0] = b0, L.b[1] = b1;
  memcpy(L.d, d, sizeof L.d);
  simt::wait_at(std::is_same<T, simt_bf16>::value ? simt::MMA_BF16
                                                  : simt::MMA_FP16);
  memcpy(d, L.d, sizeof L.d);
}

/* the host's 2^x for the device's ex2.approx (both within 2 ulp) */
inline float fa_exp2(float x) { return exp2f(x); }

template <typename T> inline uint32_t fa_pack(float lo, float hi) {
  return (uint32_t)simt::from_f<T>(lo) | (uint32_t)simt::from_f<T>(hi) << 16;
}
template <typename T> inline float fa_round(float x) {
  return simt::to_f<T>(simt::from_f<T>(x));
}

/* an element of T to float and back (softmax_rows.h) */
template <typename T> inline float fa_ld(const T *p) {
  return simt::to_f<T>(p->bits);
}
template <> inline float fa_ld<float>(const float *p) { return *p; }
template <typename T> inline void fa_st(T *p, float x) {
  p->bits = simt::from_f<T>(x);
}
template <> inline void fa_st<float>(float *p, float x) { *p = x; }

#endif
