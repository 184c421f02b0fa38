/* mma/score_mod.cuh — cuda-mma's score modifiers, softcap and ALiBi, in the m16n8k16 accumulator layout (the design
 * and the layout-free functions: common/score_mod.cuh). The kernels built with SCORE_MOD run on S' = (±Q)·Kᵀ with
 * |scale| (a negative scale negates Q: mma/fwd.cu, mma/bwd.cu), so the host gives them k_in = |scale| / cap (or
 * |scale|): cap·tanh(|scale|·S' / cap) = cap·tanh(scale·q·k / cap). */
#ifndef FLASHC_CUDA_MMA_SCORE_MOD_CUH
#define FLASHC_CUDA_MMA_SCORE_MOD_CUH

#include "common/score_mod.cuh"
#include "mma/ptx.cuh"
#include "../../philox.h"

#include <math.h>

/* The modifiers of problem p for the cuda-mma kernels (k_in of |scale|: see above), and whether it has any. */
static inline bool fc_mma_score_mod_of(const fc_problem *p, fc_score_mod *m) {
  const bool on = fc_score_mod_of(p, m);
  m->k_in = fabsf(m->k_in);
  /* attn_mask: keys 2t, 2t + 1 of the forward's layout as one word where every such pair is whole and aligned */
  if (m->bias) {
    const int64_t es = m->bias_bool ? 1 : 2, *st = m->bias_st;
    m->bias_pair = st[3] == 1 && p->seqlen_k % 2 == 0 && st[0] % 2 == 0 && st[1] % 2 == 0 && st[2] % 2 == 0 &&
                   (uintptr_t)m->bias % (uintptr_t)(2 * es) == 0;
  }
  return on;
}

/* The forward's S (one block of keys from k0; per M-tile mt, s[mt][x][e] is row g + 8·(e >> 1) of the tile and key
 * k0 + 8x + 2t + (e & 1)) → x in place. dist0[mt][rh] = i + sk − sq − 2t of the thread's row i of tile mt and half
 * rh, so that key j is at distance |dist0 − k0 − 8x − (e & 1)|: exact in fp32 for sequences below 2^24 rows. Masked
 * keys get any value: the mask overwrites them with −inf afterwards. Softcap and ALiBi are each one uniform branch
 * around the whole block. */
template <int MT, int NS>
static __device__ __forceinline__ void fc_mma_mod_scores(float (*s)[NS][4], const fc_score_mod &md, float slope,
                                                         const float (*dist0)[2], int k0) {
  if (md.k_out > 0.0f) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int x = 0; x < NS; x++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[mt][x][e] = md.k_out * fc_tanh(s[mt][x][e] * md.k_in);
  } else {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int x = 0; x < NS; x++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[mt][x][e] *= md.k_in;
  }
  if (md.alibi) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const float v = dist0[mt][rh] - (float)k0;
#pragma unroll
        for (int x = 0; x < NS; x++)
#pragma unroll
          for (int e = 2 * rh; e < 2 * rh + 2; e++)
            s[mt][x][e] = fmaf(-slope, fabsf(v - (float)(8 * x + (e & 1))), s[mt][x][e]);
      }
  }
}

/* ---- attn_mask (flashc.h: after softcap and ALiBi, s ← s + bias, or the key removed where a boolean mask is 0) ----
 * Each thread reads the elements it holds from global memory, where the mask lives (no staging through shared
 * memory): in the forward's layout the 4 lanes of a quad hold keys 2t, 2t + 1 of 8 consecutive keys of a row, one
 * word each (bias_pair), so that a warp's load reads 16 bytes (bool: 8) of each of 8 rows; in the backward's Sᵀ
 * layout a lane's two elements of an n-block are one key of two queries, loaded one at a time (the 8 lanes of a t:
 * 8 consecutive keys of one row). */

/* The plane of (sequence b, query head h) in the mask, and in dbias. */
static __device__ __forceinline__ const void *fc_bias_plane(const fc_score_mod &md, int64_t b, int h) {
  return (const uint8_t *)md.bias + (b * md.bias_st[0] + h * md.bias_st[1]) * (md.bias_bool ? 1 : 2);
}
static __device__ __forceinline__ void *fc_dbias_plane(const fc_score_mod &md, int64_t b, int h) {
  return (uint8_t *)md.dbias + (b * md.dbias_st[0] + h * md.dbias_st[1]) * (md.dbias_f32 ? 4 : 2);
}

/* Element off of a plane of the mask: *add, a bias's value (0 for a boolean mask), and whether the key stays. */
template <typename T>
static __device__ __forceinline__ bool fc_bias_one(const fc_score_mod &md, const void *plane, int64_t off, float *add) {
  if (md.bias_bool) {
    *add = 0.0f;
    return __ldg((const unsigned char *)plane + off) != 0;
  }
  *add = fc_to_float<T>(__ldg((const unsigned short *)plane + off));
  return true;
}

/* dbias element off of its plane gets dS: stored in the call's dtype, or added to the fp32 buffer. */
template <typename T>
static __device__ __forceinline__ void fc_dbias_put(const fc_score_mod &md, void *plane, int64_t off, float ds) {
  if (md.dbias_f32)
    atomicAdd((float *)plane + off, ds);
  else
    ((uint16_t *)plane)[off] = fc_from_float<T>(ds);
}

/* The forward's S (fc_mma_mod_scores' layout; rows row0 + 16·mt + 8·rh, keys k0 + 8x + 2t + (e & 1)) → s + bias, or
 * −inf where a boolean mask removes the key. Rows past sq (never stored) and keys past sk (the mask hides them after)
 * are left as they are, unread. MODE 0: pairs of a bias, 1: pairs of a boolean mask (bias_pair), 2: one element at a
 * time (any strides); one uniform branch picks it for the whole block. */
template <typename T, int MODE, int MT, int NS>
static __device__ __forceinline__ void fc_mma_bias_block(float (*s)[NS][4], const fc_score_mod &md, const void *plane,
                                                         int row0, int sq, int sk, int k0, int t) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int row = row0 + 16 * mt + 8 * rh;
      if (row >= sq) continue;
      const int64_t ro = (int64_t)row * md.bias_st[2];
#pragma unroll
      for (int x = 0; x < NS; x++) {
        const int key = k0 + 8 * x + 2 * t;
        float add[2] = {0.0f, 0.0f};
        bool keep[2] = {true, true};
        if constexpr (MODE == 0) {
          if (key < sk) { /* sk is even: key + 1 < sk too */
            const uint32_t w = __ldg((const unsigned int *)((const uint16_t *)plane + ro + key));
            add[0] = fc_to_float<T>((uint16_t)(w & 0xffffu)), add[1] = fc_to_float<T>((uint16_t)(w >> 16));
          }
        } else if constexpr (MODE == 1) {
          if (key < sk) {
            const uint32_t w = __ldg((const unsigned short *)((const uint8_t *)plane + ro + key));
            keep[0] = (w & 0xffu) != 0, keep[1] = (w >> 8) != 0;
          }
        } else {
#pragma unroll
          for (int e1 = 0; e1 < 2; e1++)
            if (key + e1 < sk) keep[e1] = fc_bias_one<T>(md, plane, ro + (int64_t)(key + e1) * md.bias_st[3], &add[e1]);
        }
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) s[mt][x][2 * rh + e1] = keep[e1] ? s[mt][x][2 * rh + e1] + add[e1] : -INFINITY;
      }
    }
}
template <typename T, int MT, int NS>
static __device__ __forceinline__ void fc_mma_bias_scores(float (*s)[NS][4], const fc_score_mod &md, const void *plane,
                                                          int row0, int sq, int sk, int k0, int t) {
  if (md.bias_pair && !md.bias_bool)
    fc_mma_bias_block<T, 0, MT, NS>(s, md, plane, row0, sq, sk, k0, t);
  else if (md.bias_pair)
    fc_mma_bias_block<T, 1, MT, NS>(s, md, plane, row0, sq, sk, k0, t);
  else
    fc_mma_bias_block<T, 2, MT, NS>(s, md, plane, row0, sq, sk, k0, t);
}

/* ---- dropout (flashc.h, "Dropout"; philox.h's rule, bit for bit) ------------------------------------------------
 * keep of element (b, h, i, j) is half j mod 8 of Philox block i·⌈sk/8⌉ + ⌊j/8⌋: the keys 8c .. 8c + 7 of a row share
 * one block. A warp's keys start at a multiple of 8, so its run of 8·C keys of a row is exactly C blocks, and the
 * lanes that hold the row's keys form a group that holds the whole run: the forward's and the dQ pass's quad (G = 4
 * lanes t, keys 8x + 2t and 8x + 2t + 1: halves 2t, 2t + 1 of block x), the fa2 kernels' Sᵀ (G = 8 lanes g, keys
 * g + 8c: half g of block c). The group's R runs × C blocks, q = r·C + c, are each computed once: lane lg of the
 * group takes blocks lg, lg + G, ... (R·C/G Philox calls), each into a byte of 8 keep bits (fc_dropout_block_bits,
 * byte k for block G·k + lg), and a transpose across the group (log2 G shuffle steps; each swaps one bit of the lane
 * index with one bit of the half index, trading half of every word with one partner) leaves lane lg the bits of its
 * own halves of every block: bit (8/G)·q + e is its e-th half of block q. */
template <int G, int R, int C> struct fc_drop_group {
  static_assert(G == 4 || G == 8, "a group is a quad's 4 lanes or a t's 8");
  static_assert((C % G == 0 || G % C == 0) && R * C % G == 0, "whole blocks per lane, powers of 2");
  static constexpr int Q = R * C;                 /* blocks */
  static constexpr int W = (8 * Q / G + 31) / 32; /* 32-bit words of a lane's bits */
};

/* The keep bits of the group's R runs of C blocks: run r is row row0 + hi·⌊r/2⌋ + lo·(r mod 2) of a sequence with sk
 * keys (the forward's rows 16·mt + 8·rh: hi 16, lo 8; Sᵀ's queries 8x + e1: hi 8, lo 1), keys 8·kb .. 8·(kb + C) − 1;
 * lg: the lane's index in its group (G = 4: lanes that differ in bits 0–1, G = 8: in bits 2–4). Every lane of the
 * warp must call it (the shuffles): a uniform branch only. */
template <int G, int R, int C>
static __device__ __forceinline__ void fc_drop_group_bits(uint32_t (&km)[fc_drop_group<G, R, C>::W],
                                                          const fc_score_mod &md, uint64_t bh, int64_t row0, int hi,
                                                          int lo, int64_t sk, int64_t kb, int lg) {
  constexpr int Q = fc_drop_group<G, R, C>::Q, W = fc_drop_group<G, R, C>::W, EW = 8 / G;
  const uint64_t nb = fc_dropout_row_blocks(sk);
  /* Lane lg's blocks q = G·k + lg: run G·k/C + r0, block G·k mod C + c0 (C | G or G | C; where C < G, G·k/C is
   * even, so the row offsets of the two parts add). */
  const int r0 = lg / C, c0 = lg % C;
  const uint64_t base =
      md.drop_offset + (uint64_t)(row0 + hi * (r0 >> 1) + lo * (r0 & 1)) * nb + (uint64_t)(kb + c0); /* mod 2^64 */
#pragma unroll
  for (int w = 0; w < W; w++) km[w] = 0u;
#pragma unroll
  for (int k = 0; k < Q / G; k++) {
    const int a = G * k / C, c = G * k % C;
    const fc_philox4 u =
        fc_dropout_block(md.drop_seed, base, bh, (uint64_t)(hi * (a >> 1) + lo * (a & 1)) * nb + (uint64_t)c);
    km[k / 4] |= fc_dropout_block_bits(u, md.drop_t) << (8 * (k % 4));
  }
  /* The transpose: step d exchanges, with the lane whose index differs in bit d, the entries (EW bits each) whose half
   * index differs from this lane's in bit d; afterwards bit d of an entry's place names its source lane. */
#pragma unroll
  for (int d = G / 2; d >= 1; d >>= 1) {
    const int sh = d * EW;
    const uint32_t low = sh == 4 ? 0x0f0f0f0fu : sh == 2 ? 0x33333333u : 0x55555555u; /* entries whose bit d is 0 */
    const bool up = (lg & d) != 0;
#pragma unroll
    for (int w = 0; w < W; w++) {
      const uint32_t send = up ? (km[w] & low) << sh : (km[w] >> sh) & low;
      const uint32_t got = __shfl_xor_sync(0xffffffffu, send, G == 4 ? d : 4 * d);
      km[w] = (km[w] & (up ? ~low : low)) | got;
    }
  }
}

/* The keep bits of this thread's elements of the forward's layout (s[mt][x][e]: row row0 + 16·mt + 8·(e >> 1), key
 * k0 + 8x + 2t + (e & 1), rows of a sequence with sk keys; k0 a multiple of 8), element (mt, x, e) at bit
 * fc_mma_drop_bit<NS>(mt, x, e) of km: the quad's 2·MT rows × NS blocks, q = (2·mt + rh)·NS + x, whose bits 2q, 2q + 1
 * are this lane's halves 2t, 2t + 1 (fc_drop_group_bits). The forward and the dQ pass call it before S = Q·Kᵀ, so
 * that the Philox rounds need no registers beside S's (applied after the exponentials, they made the SCORE_MOD
 * kernels spill). Rows and keys past the sequence get bits too, never used (their P is 0). */
template <int NS> static __device__ __forceinline__ constexpr int fc_mma_drop_bit(int mt, int x, int e) {
  return ((mt * 2 + (e >> 1)) * NS + x) * 2 + (e & 1);
}
template <int MT, int NS>
static __device__ __forceinline__ void fc_mma_drop_bits(uint32_t (&km)[(MT * NS * 4 + 31) / 32], const fc_score_mod &md,
                                                        uint64_t bh, int64_t row0, int64_t sk, int k0, int t) {
  static_assert(fc_drop_group<4, 2 * MT, NS>::W == (MT * NS * 4 + 31) / 32, "one bit per element");
  fc_drop_group_bits<4, 2 * MT, NS>(km, md, bh, row0, 16, 8, sk, k0 / 8, t);
}
/* y ← keep ? y·mul : 0 over the forward's layout, keep from fc_mma_drop_bits: the forward's P (mul 1; 1/(1 − p) is
 * applied to O at the end) and the dQ pass's dP (mul 1/(1 − p): Z∘dP). */
template <int MT, int NS>
static __device__ __forceinline__ void fc_mma_drop_apply(float (*y)[NS][4],
                                                         const uint32_t (&km)[(MT * NS * 4 + 31) / 32], float mul) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < NS; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = fc_mma_drop_bit<NS>(mt, x, e);
        y[mt][x][e] = (km[i / 32] >> (i % 32)) & 1u ? y[mt][x][e] * mul : 0.0f;
      }
}

#endif /* FLASHC_CUDA_MMA_SCORE_MOD_CUH */
