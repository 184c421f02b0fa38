/* mma/bwd_score_mod_bf16.cu — cuda-mma backward's SCORE_MOD kernels (softcap, ALiBi, dropout, attn_mask) for bf16: the
 * plan's kernels of mma/bwd_launch.cuh built with SCORE_MOD, called by mma/bwd_score_mod.cu between dbias's passes. */
#include "mma/bwd_launch.cuh"

flashc_status fc_mma_bwd_score_mod_bf16(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                        const fc_mask_tiles *dq_tiles) {
  return fc_mma_bwd_dispatch<__nv_bfloat16, true>(p, a, pl, dq_tiles);
}
