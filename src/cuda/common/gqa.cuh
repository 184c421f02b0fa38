/* common/gqa.cuh — the GQA backward's group split (common/gqa.cu says why and how). */
#ifndef FLASHC_CUDA_GQA_CUH
#define FLASHC_CUDA_GQA_CUH

#include "../../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How many parts (CTAs) each kv head's query heads are split into for a dK/dV grid of key_blocks per (sequence,
 * kv head), ctas_per_sm of its CTAs fitting on an SM, at most max_heads query heads per CTA (0: any): a divisor
 * of the group where one fits, else parts of sizes that differ by one (fc_gqa_part_heads); 1 for MHA. */
int fc_gqa_split(const fc_problem *p, int64_t key_blocks, int ctas_per_sm, int max_heads);
/* The device workspace the parts' dK and dV take (0 when split is 1). */
size_t fc_gqa_workspace_bytes(const fc_problem *p, int split);
/* Views of the parts' dK and dV in `ws` (fc_gqa_workspace_bytes of it): [rows_k, heads_kv·split, head_dim],
 * contiguous, 256-byte aligned; kv head h's parts are heads h·split .. h·split + split − 1. */
void fc_gqa_part_views(const fc_problem *p, int split, void *ws, fc_view *dk, fc_view *dv);
/* p->dk, p->dv = the sums of the parts, on the problem's stream. */
flashc_status fc_gqa_reduce(const fc_problem *p, int split, const fc_view *dk_parts, const fc_view *dv_parts);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
/* The query heads of dK/dV part hk (of heads_kv·split parts): part hk % split of kv head hk / split's `group` query
 * heads, h0 .. h0 + nh − 1. The parts split the group as evenly as their count allows (sizes differ by at most one),
 * so that a group of 7 can run as 4 + 3 heads. */
static __device__ __forceinline__ void fc_gqa_part_heads(int hk, int group, int split, int *h0, int *nh) {
  const int kv = hk / split, part = hk - kv * split;
  const int first = part * group / split;
  *h0 = kv * group + first;
  *nh = (part + 1) * group / split - first;
}
#endif
#endif /* FLASHC_CUDA_GQA_CUH */
