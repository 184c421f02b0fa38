/* hopper/fwd_dropout.cu — cuda-hopper forward's kernels with dropout (DROP; with SCORE_MOD: softcap, ALiBi and
 * attn_mask too): hopper/fwd_launch.cuh's, instantiated here for hopper/fwd.cu's hopper_forward. */
#include "hopper/fwd_launch.cuh"

flashc_status fc_hp_forward_dropout(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a,
                                    const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                    const fc_hp_split_mem *split, int grid) {
  return fc_hp_forward_dtype<true, true>(p, maps, a, md, pl, claim, split, grid);
}
