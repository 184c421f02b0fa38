/* hopper/bwd_dropout.cu — cuda-hopper backward's dK/dV kernels with dropout (DROP, with SCORE_MOD: softcap, ALiBi and a
 * boolean attn_mask too), at D = 64 and 128: hopper/bwd_launch.cuh's, instantiated here for hopper/bwd.cu's
 * fc_hpb_run. */
#include "hopper/bwd_launch.cuh"

flashc_status fc_hpb_launch_dropout(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                    const fc_hopper_bwd_args *a, int grid) {
  return fc_hpb_launch_dtype<true, false, true>(p, pl, maps, a, grid);
}
