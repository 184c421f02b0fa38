/* hopper/score_mod.cuh — cuda-hopper's score modifiers, softcap and ALiBi, in the wgmma accumulator layout, shared by
 * the forward (hopper/fwd.cu, hopper/fwd_persistent.cuh); the design, the arguments (fc_score_mod) and the
 * layout-free functions (fc_tanh, the backward's fc_mod_score) are common/score_mod.cuh's, shared with cuda-mma. */
#ifndef FLASHC_CUDA_HOPPER_SCORE_MOD_CUH
#define FLASHC_CUDA_HOPPER_SCORE_MOD_CUH

#include "common/score_mod.cuh"
#include "hopper/ptx.cuh"

#if FC_HOPPER_ARCH
/* The forward's S (one block of BC keys from k0, the wgmma accumulator layout: s[4x + e] is row rh = e / 2 of this
 * thread's two, column 8x + 2t + e % 2) → x in place. dist0[rh] = i + sk − sq − 2t of the thread's row i (the
 * sequence's lengths), so that key j = k0 + 8x + 2t + e % 2 is at distance |dist0 − k0 − 8x − e % 2|: exact in fp32
 * for sequences below 2^24 rows. Masked keys get any value: the mask overwrites them with −inf afterwards. */
template <int BC>
static __device__ __forceinline__ void fc_hp_mod_scores(float (&s)[BC / 2], const fc_score_mod &md, float slope,
                                                        const float (&dist0)[2], int k0) {
  const float v[2] = {dist0[0] - (float)k0, dist0[1] - (float)k0};
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

#endif /* FC_HOPPER_ARCH */

#endif /* FLASHC_CUDA_HOPPER_SCORE_MOD_CUH */
