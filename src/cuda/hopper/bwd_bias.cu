/* hopper/bwd_bias.cu — cuda-hopper backward's dK/dV kernels with a float attn_mask added to the scores (ADD, with
 * SCORE_MOD: softcap and ALiBi too), which also write its gradient dbias where asked: hopper/bwd_launch.cuh's,
 * instantiated here for hopper/bwd.cu's fc_hpb_run. */
#include "hopper/bwd_launch.cuh"

flashc_status fc_hpb_launch_bias(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                 const fc_hopper_bwd_args *a, int grid) {
  return fc_hpb_launch_dtype<true, true>(p, pl, maps, a, grid);
}
