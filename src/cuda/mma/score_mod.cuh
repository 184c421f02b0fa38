/* mma/score_mod.cuh — cuda-mma's score modifiers, softcap and ALiBi, in the m16n8k16 accumulator layout (the design
 * and the layout-free functions: common/score_mod.cuh). The kernels built with SCORE_MOD run on S' = (±Q)·Kᵀ with
 * |scale| (a negative scale negates Q: mma/fwd.cu, mma/bwd.cu), so the host gives them k_in = |scale| / cap (or
 * |scale|): cap·tanh(|scale|·S' / cap) = cap·tanh(scale·q·k / cap). */
#ifndef FLASHC_CUDA_MMA_SCORE_MOD_CUH
#define FLASHC_CUDA_MMA_SCORE_MOD_CUH

#include "common/score_mod.cuh"

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

#endif /* FLASHC_CUDA_MMA_SCORE_MOD_CUH */
