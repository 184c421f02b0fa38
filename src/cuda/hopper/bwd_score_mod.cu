/* hopper/bwd_score_mod.cu — cuda-hopper backward's dK/dV kernels with softcap, ALiBi and a boolean attn_mask
 * (SCORE_MOD, hopper/score_mod.cuh): hopper/bwd_launch.cuh's, instantiated here for hopper/bwd.cu's fc_hpb_run. */
#include "hopper/bwd_launch.cuh"

flashc_status fc_hpb_launch_score_mod(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                      const fc_hopper_bwd_args *a, int grid) {
  return fc_hpb_launch_dtype<true>(p, pl, maps, a, grid);
}
