/* mma/bwd_score_mod.cu — cuda-mma backward's kernels with softcap and ALiBi (SCORE_MOD, mma/score_mod.cuh): the plan
 * and the launches of mma/bwd.cu, instantiated in a file of their own so that they compile beside the plain ones. */
#include "mma/bwd_launch.cuh"

flashc_status fc_mma_bwd_score_mod(const fc_problem *p, const fc_mma_bwd_args *a, bool aligned,
                                   const fc_mma_bwd_plan *pl) {
  if (p->dtype == FLASHC_F16) return fc_mma_bwd_dispatch<__half, true>(p, a, aligned, pl);
  return fc_mma_bwd_dispatch<__nv_bfloat16, true>(p, a, aligned, pl);
}
