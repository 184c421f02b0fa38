/* mma/score_mod.cuh — cuda-mma's score modifiers, softcap and ALiBi, in the m16n8k16 accumulator layout (the design
 * and the layout-free functions: common/score_mod.cuh). The kernels built with SCORE_MOD run on S' = (±Q)·Kᵀ with
 * |scale| (a negative scale negates Q: mma/fwd.cu, mma/bwd.cu), so the host gives them k_in = |scale| / cap (or
 * |scale|): cap·tanh(|scale|·S' / cap) = cap·tanh(scale·q·k / cap). */
#ifndef FLASHC_CUDA_MMA_SCORE_MOD_CUH
#define FLASHC_CUDA_MMA_SCORE_MOD_CUH

#include "common/score_mod.cuh"
#include "../../philox.h"

#include <math.h>

/* The modifiers of problem p for the cuda-mma kernels (k_in of |scale|: see above), and whether it has any. */
static inline bool fc_mma_score_mod_of(const fc_problem *p, fc_score_mod *m) {
  const bool on = fc_score_mod_of(p, m);
  m->k_in = fabsf(m->k_in);
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

/* ---- dropout (flashc.h, "Dropout"; philox.h's rule, bit for bit) ------------------------------------------------
 * keep of element (b, h, i, j) is word e mod 4 of Philox block ⌊e / 4⌋, e = i·sk + j: one block serves four keys of
 * a row, and a row's keys are spread over the lanes of a group (the forward and the dQ pass: the 4 lanes of a quad,
 * keys 8x + 2t, 8x + 2t + 1; the fa2 kernels' Sᵀ: the 8 lanes of a t, keys g + 8·(...)). So the group computes each
 * block of its run of L keys once: lane lg of the group takes blocks lg, lg + G, ..., turns each into 4 keep bits,
 * and G − 1 shuffles later every lane holds the run's bits in order (block q's bits at 4q), ⌈(L/4 + 1)/G⌉ Philox calls
 * a lane per run instead of one or two per pair of keys. */
template <int G, int L> struct fc_drop_run {
  static constexpr int R = (L / 4 + 1 + G - 1) / G; /* blocks a lane computes: the run spans ≤ L/4 + 1 blocks */
  static constexpr int W = (4 * G * R + 31) / 32;   /* 32-bit words of the run's bits */
};

/* The keep bits of the run of L keys from element e0 = i·sk + j0 of (sequence, head) bh, which the G lanes of this
 * lane's group call together (lg: the lane's index in it; G = 4: lanes that differ in bits 0–1, G = 8: in bits 2–4),
 * shifted right by off (< 29): bit c of v is the keep of key j0 + off + c. Every lane of the warp must call it (the
 * shuffles): a uniform branch only. */
template <int G, int L>
static __device__ __forceinline__ void fc_drop_run_bits(uint32_t (&v)[fc_drop_run<G, L>::W], const fc_score_mod &md,
                                                        uint64_t bh, uint64_t e0, int lg, int off) {
  static_assert(G == 4 || G == 8, "a group is a quad's 4 lanes or a t's 8");
  constexpr int R = fc_drop_run<G, L>::R, W = fc_drop_run<G, L>::W;
  uint32_t w[W + 1];
#pragma unroll
  for (int k = 0; k <= W; k++) w[k] = 0u;
  const uint64_t n0 = e0 >> 2;
#pragma unroll
  for (int r = 0; r < R; r++) {
    const fc_philox4 u = fc_dropout_block(md.drop_seed, md.drop_offset, bh, n0 + (uint64_t)(lg + G * r));
    const uint32_t nib = (uint32_t)(u.w[0] >= md.drop_t) | (uint32_t)(u.w[1] >= md.drop_t) << 1 |
                         (uint32_t)(u.w[2] >= md.drop_t) << 2 | (uint32_t)(u.w[3] >= md.drop_t) << 3;
    w[G * r / 8] |= nib << (4 * (lg + G * r % 8)); /* block lg + G·r at bit 4·(lg + G·r) */
  }
#pragma unroll
  for (int k = 0; k < W; k++)
#pragma unroll
    for (int x = G == 4 ? 1 : 4; x < (G == 4 ? 4 : 32); x <<= 1) w[k] |= __shfl_xor_sync(0xffffffffu, w[k], x);
  const int sh = (int)(e0 & 3u) + off; /* element e0 is bit e0 mod 4 of block n0 */
#pragma unroll
  for (int k = 0; k < W; k++) v[k] = __funnelshift_r(w[k], w[k + 1], (uint32_t)sh);
}

/* The keep bits of this thread's elements of the forward's layout (s[mt][x][e]: row row0 + 16·mt + 8·(e >> 1), key
 * k0 + 8x + 2t + (e & 1), rows of a sequence with sk keys), one run per row, kept compact: element (mt, x, e) at bit
 * fc_mma_drop_bit<NS>(mt, x, e) of km. The forward and the dQ pass call it before S = Q·Kᵀ, so that the Philox rounds
 * need no registers beside S's (applied after the exponentials, they made the SCORE_MOD kernels spill). Rows and keys
 * past the sequence get bits too, never used (their P is 0). */
template <int NS> static __device__ __forceinline__ constexpr int fc_mma_drop_bit(int mt, int x, int e) {
  return ((mt * 2 + (e >> 1)) * NS + x) * 2 + (e & 1);
}
template <int MT, int NS>
static __device__ __forceinline__ void fc_mma_drop_bits(uint32_t (&km)[(MT * NS * 4 + 31) / 32], const fc_score_mod &md,
                                                        uint64_t bh, int64_t row0, int64_t sk, int k0, int t) {
  constexpr int L = 8 * NS, W = fc_drop_run<4, L>::W;
#pragma unroll
  for (int k = 0; k < (MT * NS * 4 + 31) / 32; k++) km[k] = 0u;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      uint32_t v[W];
      fc_drop_run_bits<4, L>(v, md, bh, (uint64_t)((row0 + 16 * mt + 8 * rh) * sk + k0), t, 2 * t);
#pragma unroll
      for (int x = 0; x < NS; x++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
          const int c = 8 * x + e1, i = fc_mma_drop_bit<NS>(mt, x, 2 * rh + e1);
          km[i / 32] |= ((v[c / 32] >> (c % 32)) & 1u) << (i % 32);
        }
    }
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
