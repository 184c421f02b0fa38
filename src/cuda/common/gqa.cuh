/* common/gqa.cuh — the GQA backward's group split (common/gqa.cu says why and how). */
#ifndef FLASHC_CUDA_GQA_CUH
#define FLASHC_CUDA_GQA_CUH

#include "../../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How many parts (CTAs) each kv head's query heads are split into for a dK/dV grid of key_blocks per (sequence,
 * kv head), ctas_per_sm of its CTAs fitting on an SM, at most max_heads query heads per CTA (0: any): a divisor
 * of the group; 1 for MHA. */
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
#endif /* FLASHC_CUDA_GQA_CUH */
