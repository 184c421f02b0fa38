/* hopper/score_mod.cuh — cuda-hopper's score modifiers, softcap, ALiBi and attn_mask, and dropout's keep bits, in the
 * forward's wgmma accumulator layout (the backward's Sᵀ layout has its own: hopper/bwd_launch.cuh, fc_hpb_mask_block
 * and fc_hpb_drop_bits), shared by the forward (hopper/fwd.cu, hopper/fwd_persistent.cuh); the design, the arguments
 * (fc_score_mod) and the layout-free functions (fc_tanh, the backward's fc_mod_score) are common/score_mod.cuh's,
 * shared with cuda-mma; the mask's loads read what cuda-mma's do (mma/score_mod.cuh: fc_mma_bias_block, whose layout
 * for one M-tile is the wgmma accumulator's per 8-column chunk; bias_pair from fc_mma_score_mod_of).
 *
 * attn_mask in the forward: a boolean mask's blocks are classified before the kernel (common/mask_tiles.cuh) at
 * FC_HP_MASK_BM rows × the kernel's Bc keys: one row of blocks per consumer warpgroup, whatever the kernel's Br (128,
 * or 192 with 3 consumers) and wherever its query blocks start (align_end moves them by whole warpgroups). The producer
 * and the consumers walk the same key blocks: the CTA's visible blocks [j_begin, j_begin + n_blocks) intersected with
 * the union of its warpgroups' row ranges (fc_hp_mask_range), worked out in the one-tile kernel by every thread before
 * the roles split, in the persistent kernel by the producer's tile set-up, which the consumers read from the tile ring.
 * Inside the range each warpgroup reads its own block's class once (uniform), one block ahead: ALL runs the plain code,
 * NONE sets the block's scores to −inf, SOME loads the mask's elements into keep bits (fc_hp_mask_bits); every block of
 * a float bias loads it. */
#ifndef FLASHC_CUDA_HOPPER_SCORE_MOD_CUH
#define FLASHC_CUDA_HOPPER_SCORE_MOD_CUH

#include "common/score_mod.cuh"
#include "hopper/ptx.cuh"
#include "mma/score_mod.cuh"

#include <limits.h>

enum { FC_HP_MASK_BM = 64 }; /* rows per block of a boolean mask's tiles: one consumer warpgroup's */

/* Softcap alone (no ALiBi, no float bias): S becomes t = tanh(S·k_in), not x = cap·t, and the cap goes into the
 * softmax's factors as the scale does in the plain kernel's (fc_hp_softmax_factors): one multiply per score less. */
static __device__ __forceinline__ bool fc_hp_cap_t(const fc_score_mod &md) {
  return md.k_out > 0.0f && !md.alibi && !(md.bias && !md.bias_bool);
}

#if FC_HOPPER_ARCH
/* The forward's S (one block of BC keys from k0, the wgmma accumulator layout: s[4x + e] is row rh = e / 2 of this
 * thread's two, column 8x + 2t + e % 2) → x in place (t = tanh(S·k_in) for softcap alone: fc_hp_cap_t). dist0[rh] = i +
 * sk − sq − 2t of the thread's row i (the sequence's lengths), so that key j = k0 + 8x + 2t + e % 2 is at distance
 * |dist0 − k0 − 8x − e % 2|: exact in fp32 for sequences below 2^24 rows. Masked keys get any value: the mask
 * overwrites them with −inf afterwards. lin (fc_hp_alibi_lin): every key the tile's rows see lies at a distance ≥ 0, so
 * ALiBi's −slope·|dist| is the linear slope·(col − v), and row 1's is row 0's less 8·slope, a constant of the row,
 * which the softmax ignores and the kernel takes out of m at the end (lse): both rows add the column's slope·(col −
 * v[0]), one FFMA per score where the general form takes three (scale, distance, |·|·slope). */
template <int BC>
static __device__ __forceinline__ void fc_hp_mod_scores(float (&s)[BC / 2], const fc_score_mod &md, float slope,
                                                        const float (&dist0)[2], int k0, bool lin) {
  const float v[2] = {dist0[0] - (float)k0, dist0[1] - (float)k0};
  if (md.alibi && lin) {
    const float nb = -slope * v[0];
    if (md.k_out > 0.0f) {
#pragma unroll
      for (int x = 0; x < BC / 8; x++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          s[4 * x + e] = fmaf(md.k_out, fc_tanh(s[4 * x + e] * md.k_in), fmaf(slope, (float)(8 * x + (e & 1)), nb));
    } else {
#pragma unroll
      for (int x = 0; x < BC / 8; x++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const float bias = fmaf(slope, (float)(8 * x + c), nb); /* of the column, shared by the two rows */
          s[4 * x + c] = fmaf(s[4 * x + c], md.k_in, bias);
          s[4 * x + 2 + c] = fmaf(s[4 * x + 2 + c], md.k_in, bias);
        }
    }
    return;
  }
  if (fc_hp_cap_t(md)) { /* t = tanh(S·k_in): the cap is in the softmax's factors (fc_hp_softmax_factors) */
#pragma unroll
    for (int e = 0; e < BC / 2; e++) s[e] = fc_tanh(s[e] * md.k_in);
    return;
  }
  if (md.k_out > 0.0f) {
#pragma unroll
    for (int x = 0; x < BC / 8; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[4 * x + e] = md.k_out * fc_tanh(s[4 * x + e] * md.k_in);
  } else {
#pragma unroll
    for (int e = 0; e < BC / 2; e++) s[e] *= md.k_in;
  }
  if (md.alibi) {
#pragma unroll
    for (int x = 0; x < BC / 8; x++)
#pragma unroll
      for (int e = 0; e < 4; e++)
        s[4 * x + e] = fmaf(-slope, fabsf(v[e >> 1] - (float)(8 * x + (e & 1))), s[4 * x + e]);
  }
}

/* Whether a tile of sequence (sq, sk) under shift (the mask's diagonal: hopper/fwd.cu) takes ALiBi's linear form
 * (fc_hp_mod_scores): every visible key j ≤ i + shift + window_right lies at ALiBi's distance i + sk − sq − j ≥ 0, as
 * under a bottom-right causal mask. The form's row offset, returned in *lin_off (0 where it does not apply), comes off
 * m[1] before lse. */
static __device__ __forceinline__ bool fc_hp_alibi_lin(const fc_score_mod &md, int64_t shift, int64_t wr, int sq,
                                                       int sk, float slope, float *lin_off) {
  const bool lin = md.alibi && wr >= 0 && shift + wr <= (int64_t)sk - sq;
  *lin_off = lin ? 8.0f * slope : 0.0f;
  return lin;
}

/* Whether the SCORE_MOD kernel turns S into x = scale·S (+ softcap, ALiBi, a float bias) before the softmax: not for a
 * boolean mask alone, whose −inf needs no scale, so that such a call runs the plain kernel's exponent (c = scale·log2
 * e, lse = scale·m + ln l) and only adds the mask's loads. */
static __device__ __forceinline__ bool fc_hp_mod_x(const fc_score_mod &md) {
  return md.k_out > 0.0f || md.alibi || (md.bias && !md.bias_bool);
}

/* The SCORE_MOD kernels' exponent factor c (P = 2^(c·(s − m))) and lse's factor of m (lse = m_scale·m + ln l) for
 * the scores s that fc_hp_mod_block leaves: x (mod_x: c = log2 e), t (fc_hp_cap_t: c = cap·log2 e, m_scale = cap),
 * or S itself (a boolean mask alone: the plain kernel's scale·log2 e and scale, left in *c and *m_scale). */
static __device__ __forceinline__ void fc_hp_softmax_factors(const fc_score_mod &md, bool mod_x, float *c,
                                                             float *m_scale) {
  if (!mod_x) return;
  const bool cap_t = fc_hp_cap_t(md);
  *c = (cap_t ? md.k_out : 1.0f) * 1.4426950408889634f;
  *m_scale = cap_t ? md.k_out : 1.0f;
}

/* The key blocks [*j_begin, *j_begin + *n_blocks) of a tile of br rows from i0 (rows of the sequence: [0, sq)),
 * intersected with the key blocks that a boolean mask keeps for any of its warpgroups' rows: *n_blocks = 0 where none
 * is left (the tile's rows then give o = 0, lse = −inf, as where no key is visible). Unchanged without tiles (no mask,
 * a float bias). */
static __device__ __forceinline__ void fc_hp_mask_range(const fc_score_mod &md, int64_t b, int h, int i0, int br,
                                                        int sq, int *j_begin, int *n_blocks) {
  if (!md.tiles.cls || *n_blocks <= 0) return;
  int lo = INT_MAX, hi = INT_MIN;
  for (int r = i0; r < i0 + br; r += FC_HP_MASK_BM) {
    if (r < 0 || r >= sq) continue; /* rows before the sequence (align_end) see no key; rows past it are not stored */
    const int2 k = fc_mask_row_range(md.tiles, b, h, r / FC_HP_MASK_BM);
    if (k.x < k.y) lo = min(lo, k.x), hi = max(hi, k.y);
  }
  const int jb = max(*j_begin, lo), je = min(*j_begin + *n_blocks, hi);
  if (jb < je)
    *j_begin = jb, *n_blocks = je - jb;
  else
    *n_blocks = 0;
}

/* The class of key block j for the warpgroup whose rows start at wg_row0 (FC_MT_*; uniform across the warpgroup):
 * ALL without a mask and for a warpgroup outside the sequence's rows (nothing of it is stored, and align_end's rows
 * before it see no key), SOME for a float bias (every block loads it). */
static __device__ __forceinline__ int fc_hp_mask_class(const fc_score_mod &md, int64_t b, int h, int wg_row0, int sq,
                                                       int j) {
  if (!md.bias || wg_row0 < 0 || wg_row0 >= sq) return FC_MT_ALL;
  if (!md.tiles.cls) return FC_MT_SOME;
  return fc_mask_tile(md.tiles, b, h, wg_row0 / FC_HP_MASK_BM, j);
}

/* Row `row` of (sequence b, query head h)'s plane of the mask, worked out where it is read: b, h and row pass through
 * an empty asm volatile statement first, so that the compiler cannot hoist the address out of the kernels' loop and
 * hold it in registers across every block (hoisted, the SCORE_MOD kernels spilled 16–96 bytes more). */
static __device__ __forceinline__ const uint8_t *fc_hp_mask_row(const fc_score_mod &md, int64_t b, int h, int row) {
  asm volatile("" : "+l"(b), "+r"(h), "+r"(row));
  return (const uint8_t *)md.bias +
         (b * md.bias_st[0] + h * md.bias_st[1] + (int64_t)row * md.bias_st[2]) * (md.bias_bool ? 1 : 2);
}

/* A boolean mask's keep bits of this thread's elements of one block of BC keys from k0 (fc_hp_mod_scores' layout:
 * element s[i], i = 4x + e, at bit i % 32 of km[i / 32]), from the block's class cls: ALL every bit set, NONE none,
 * SOME the mask's elements (rows ≥ sq and keys ≥ sk set: never stored / masked by the softmax after). The kernels
 * take them for block j + 1 once block j's S is packed into P, where S's registers are free: the loads (BC / 4 words in
 * flight at BC = 128) made the kernels spill when they sat beside S. row0: this thread's first row (wg_row0 + 16·warp
 * + g) of (sequence b, query head h). Pairs of keys as one load where bias_pair allows. */
template <int BC> struct fc_hp_keep { uint32_t w[(BC / 2 + 31) / 32]; };
template <int BC>
static __device__ __forceinline__ void fc_hp_mask_bits(fc_hp_keep<BC> &km, const fc_score_mod &md, int64_t b, int h,
                                                       int cls, int row0, int sq, int sk, int k0, int t) {
#pragma unroll
  for (int w = 0; w < (BC / 2 + 31) / 32; w++) km.w[w] = cls == FC_MT_NONE ? 0u : ~0u;
  if (cls != FC_MT_SOME || !md.bias_bool) return;
#pragma unroll
  for (int rh = 0; rh < 2; rh++) {
    const int row = row0 + 8 * rh;
    if (row >= sq) continue;
    const uint8_t *r = fc_hp_mask_row(md, b, h, row);
#pragma unroll
    for (int x = 0; x < BC / 8; x++) {
      const int key = k0 + 8 * x + 2 * t, i = 4 * x + 2 * rh;
      bool keep[2] = {true, true};
      if (md.bias_pair) {
        if (key < sk) { /* sk is even: key + 1 < sk too */
          const uint32_t v = __ldg((const unsigned short *)(r + key));
          keep[0] = (v & 0xffu) != 0, keep[1] = (v >> 8) != 0;
        }
      } else {
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++)
          if (key + e1 < sk) keep[e1] = __ldg(r + (int64_t)(key + e1) * md.bias_st[3]) != 0;
      }
#pragma unroll
      for (int e1 = 0; e1 < 2; e1++)
        if (!keep[e1]) km.w[(i + e1) / 32] &= ~(1u << ((i + e1) % 32));
    }
  }
  /* The bits are made here, not where the next block uses them: left to the compiler, the loaded bytes stayed in
   * registers until then, beside the next S, and the kernels spilled. */
#pragma unroll
  for (int w = 0; w < (BC / 2 + 31) / 32; w++) asm volatile("" : "+r"(km.w[w]));
}

/* A float bias added to S (fc_hp_mod_scores' layout) of one block of BC keys from k0: s ← s + bias (−inf hides the
 * key), rows ≥ sq and keys ≥ sk left as they are. Loaded beside S, so in groups of FC_HP_BIAS_GROUP 8-key chunks of
 * both rows, a warp barrier (__syncwarp) between groups keeping each group's loads after the last one's adds (all at
 * once, the BC / 4 words in flight made the D = 128 kernels spill 56–112 bytes; in groups, none). Pairs of keys as one
 * 4-byte load where bias_pair allows. */
enum { FC_HP_BIAS_GROUP = 4 };
template <typename T, int BC>
static __device__ __forceinline__ void fc_hp_bias_add(float (&s)[BC / 2], const fc_score_mod &md, int64_t b, int h,
                                                      int row0, int sq, int sk, int k0, int t) {
  constexpr int G = FC_HP_BIAS_GROUP;
#pragma unroll
  for (int x0 = 0; x0 < BC / 8; x0 += G) {
    if (x0 > 0) __syncwarp();
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int row = row0 + 8 * rh;
      if (row >= sq) continue;
      const uint16_t *r = (const uint16_t *)fc_hp_mask_row(md, b, h, row);
#pragma unroll
      for (int x = x0; x < x0 + G && x < BC / 8; x++) {
        const int key = k0 + 8 * x + 2 * t, i = 4 * x + 2 * rh;
        if (md.bias_pair) {
          if (key < sk) { /* sk is even: key + 1 < sk too */
            const uint32_t w = __ldg((const unsigned int *)(r + key));
            s[i] += fc_to_float<T>((uint16_t)(w & 0xffffu));
            s[i + 1] += fc_to_float<T>((uint16_t)(w >> 16));
          }
        } else {
#pragma unroll
          for (int e1 = 0; e1 < 2; e1++)
            if (key + e1 < sk) s[i + e1] += fc_to_float<T>(__ldg(r + (int64_t)(key + e1) * md.bias_st[3]));
        }
      }
    }
  }
}

/* The SCORE_MOD kernels' step between S and the softmax, for block k0 of class cls: x (when mod_x, fc_hp_mod_x), then
 * attn_mask: a boolean mask's keep bits km (fc_hp_mask_bits) turn the removed keys to −inf, a float bias is loaded and
 * added here (fc_hp_bias_add). */
template <typename T, int BC>
static __device__ __forceinline__ void
fc_hp_mod_block(float (&s)[BC / 2], const fc_score_mod &md, bool mod_x, float slope, const float (&dist0)[2], bool lin,
                int64_t b, int h, int cls, const fc_hp_keep<BC> &km, int row0, int sq, int sk, int k0, int t) {
  if (mod_x) fc_hp_mod_scores<BC>(s, md, slope, dist0, k0, lin);
  if (cls == FC_MT_ALL) return;
  if (md.bias_bool) {
#pragma unroll
    for (int i = 0; i < BC / 2; i++) s[i] = (km.w[i / 32] >> (i % 32)) & 1u ? s[i] : -INFINITY;
  } else {
    fc_hp_bias_add<T, BC>(s, md, b, h, row0, sq, sk, k0, t);
  }
}

/* ---- dropout (flashc.h, "Dropout"; philox.h's rule, bit for bit) ------------------------------------------------
 * In the wgmma accumulator layout a warp holds 16 rows (g, g + 8) of a block of BC keys from k0 (a multiple of 8), each
 * 8-key chunk x of a row held by the 4 lanes t of a quad, keys 8x + 2t, 8x + 2t + 1: halves 2t, 2t + 1 of Philox block
 * (row, k0/8 + x). That is cuda-mma's forward layout for one M-tile, so the quad splits the calls as there
 * (fc_drop_group_bits, mma/score_mod.cuh): its 2 rows × BC/8 blocks are computed once each, lane t taking every 4th,
 * and a 2-step transpose across the quad (two shuffles per word) gives each lane its own halves. Each lane computing
 * all 2·BC/8 calls of its rows and keeping 2 halves of each would cost 4x the Philox rounds, 10 rounds of 2
 * mul.wide each, on the integer pipe that the softmax's FMAs share, against 4 shuffles per block. BC/8 = 10 (D = 256,
 * Bc = 80) is not a multiple of the quad's 4 lanes: its first 8 chunks and its last 2 are two groups (5 calls per
 * lane, as 20/4). The kernels draw the bits at the top of a block, before S = Q·Kᵀ is issued, where S's registers
 * are not live. */
template <int BC> struct fc_hp_drop {
  static constexpr int NS = BC / 8, NS0 = NS - NS % 4, NS1 = NS % 4; /* the two groups' chunks */
  static_assert(NS0 > 0 && (NS1 == 0 || NS1 == 2), "chunks in groups of 4 lanes (fc_drop_group)");
  static constexpr int W0 = fc_drop_group<4, 2, NS0>::W, W = W0 + (NS1 ? 1 : 0);
  uint32_t w[W];
};
/* The bit of element s[4x + e] (row e / 2, key k0 + 8x + 2t + e % 2) in fc_hp_drop::w, as fc_drop_group_bits leaves
 * them: in group 0, block q = rh·NS0 + x at bits 2q, 2q + 1; group 1 likewise from word W0. */
template <int BC> static __device__ __forceinline__ constexpr int fc_hp_drop_bit(int x, int e) {
  using D = fc_hp_drop<BC>;
  return x < D::NS0 ? 2 * ((e >> 1) * D::NS0 + x) + (e & 1)
                    : 32 * D::W0 + 2 * ((e >> 1) * D::NS1 + x - D::NS0) + (e & 1);
}
/* The call's seed, offset and this thread's (sequence, head), row and key count, passed through an empty asm volatile
 * statement where a block's bits are drawn, so that the compiler cannot work out what depends on them alone (Philox's
 * key schedule, 18 words of the seed; the row's counter base) once before the kernels' loop and hold it in registers
 * across every block, as it did for the mask's addresses (fc_hp_mask_row). */
static __device__ __forceinline__ void fc_hp_drop_pin(fc_score_mod &md, uint64_t &bh, int64_t &row0, int64_t &sk) {
  asm volatile("" : "+l"(md.drop_seed), "+l"(md.drop_offset), "+r"(md.drop_t));
  asm volatile("" : "+l"(bh), "+l"(row0), "+l"(sk));
}
/* This thread's keep bits of block k0 (rows row0, row0 + 8 of (sequence, head) bh, whose rows have sk keys). Every
 * lane of the warp calls it (the shuffles): a uniform branch only. Rows and keys past the sequence get bits too, never
 * used (their P is 0 or not stored). */
template <int BC>
static __device__ __forceinline__ void fc_hp_drop_bits(fc_hp_drop<BC> &kd, const fc_score_mod &md0, uint64_t bh,
                                                       int64_t row0, int64_t sk, int k0, int t) {
  using D = fc_hp_drop<BC>;
  fc_score_mod md = md0;
  fc_hp_drop_pin(md, bh, row0, sk);
  fc_drop_group_bits<4, 2, D::NS0>(*reinterpret_cast<uint32_t(*)[D::W0]>(kd.w), md, bh, row0, 16, 8, sk, k0 / 8, t);
  if constexpr (D::NS1 > 0)
    fc_drop_group_bits<4, 2, D::NS1>(*reinterpret_cast<uint32_t(*)[1]>(kd.w + D::W0), md, bh, row0, 16, 8, sk,
                                     k0 / 8 + D::NS0, t);
}
/* P ← P∘keep, after the softmax summed the whole P into l (lse does not change): what multiplies V. The 1/(1 − p)
 * goes into O's final 1/l (one multiply per row, not per element). */
template <int BC>
static __device__ __forceinline__ void fc_hp_drop_apply(float (&s)[BC / 2], const fc_hp_drop<BC> &kd) {
#pragma unroll
  for (int x = 0; x < BC / 8; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = fc_hp_drop_bit<BC>(x, e);
      s[4 * x + e] = (kd.w[i / 32] >> (i % 32)) & 1u ? s[4 * x + e] : 0.0f;
    }
}

#endif /* FC_HOPPER_ARCH */

#endif /* FLASHC_CUDA_HOPPER_SCORE_MOD_CUH */
