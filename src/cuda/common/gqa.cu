/* common/gqa.cu — the GQA backward's group split, shared by cuda-hopper and cuda-mma.
 *
 * A dK/dV kernel walks, for its key block, every query head that reads the block's kv head. With GQA (group =
 * heads_q / heads_kv query heads per kv head) that is `group` query heads one after another in one CTA: the grid
 * has batch·heads_kv·key-blocks CTAs and each runs `group` times as long as with MHA, so a small grid (MQA: one kv
 * head) leaves most SMs idle. Splitting each group into `split` parts, one CTA each, restores MHA's grid; every part
 * writes its own dK/dV (16-bit, as the kernel stores them) into a workspace [rows_k, heads_kv·split, ld] (ld: head_dim
 * rounded up to 8 elements, so that every row starts on 16 bytes, as cuda-mma's kernels need), and
 * fc_gqa_reduce sums the parts of each kv head in fp32, in a fixed order (deterministic), into the caller's dK/dV.
 * That is FlashAttention-2's dk_expanded sum; its rounding is that of autograd over K/V expanded to the query heads.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/common.cuh"
#include "common/gqa.cuh"
#include "mma/ptx.cuh" /* fc_to_float, fc_from_float */

/* Parts per kv head: the fewest (a divisor of the group where one serves; else parts of sizes differing by one) that
 * give the grid about two waves of the GPU and each CTA at most max_heads query heads (0: no limit). Each part costs a
 * K/V load per key block and its share of the parts' workspace (written, then read by fc_gqa_reduce), so a grid already
 * two waves deep is not split further. H200, bf16, d128, causal 4k, backward
 * (bench/results/gqa-bwd-h200-2026-11-29.csv), cuda-hopper (one CTA per SM): 32 query heads over 8 kv heads run best
 * whole (4 heads per CTA, 256 CTAs; split 2 ways: 0.89x), 64 over 8 (8 heads per CTA, 256 CTAs) 1.10x faster split 2
 * ways and 1.14x split 8 ways, 32 over 1 (MQA, 32 CTAs) 6.0x faster split 8 or 32 ways; hence max_heads 4 there.
 * cuda-mma (two CTAs per SM): 32 over 8 whole, 64 over 8 whole too (split 2 ways: 0.94x), MQA 6.8-6.9x faster split 16
 * or 32 ways. */
int fc_gqa_split(const fc_problem *p, int64_t key_blocks, int ctas_per_sm, int max_heads) {
  const int64_t group = p->heads_q / p->heads_kv;
  if (group <= 1) return 1;
  fc_device_props props;
  if (fc_device_get_props(&props) != FLASHC_OK) return 1;
  const int64_t want = (int64_t)props.num_sms * ctas_per_sm * 19 / 10; /* 1.9 waves: 250 CTAs on 132 SMs */
  const int64_t ctas = key_blocks * p->batch * p->heads_kv;
  for (int64_t split = 1; split < group; split++)
    if (group % split == 0 && (max_heads == 0 || group / split <= max_heads) && ctas * split >= want) return (int)split;
  /* Under a head limit, no divisor but the group itself (one query head per part: a group of 7, Qwen2.5's 28 query
   * heads over 4, on cuda-hopper): parts of unequal sizes (fc_gqa_part_heads: 4 + 3), the fewest whose largest fits
   * max_heads and that fill the waves. */
  for (int64_t split = 2; max_heads > 0 && split < group; split++)
    if ((max_heads == 0 || (group + split - 1) / split <= max_heads) && ctas * split >= want) return (int)split;
  return (int)group;
}

static int64_t fc_gqa_ld(const fc_problem *p) { return (p->head_dim + 7) / 8 * 8; }

size_t fc_gqa_workspace_bytes(const fc_problem *p, int split) {
  if (split <= 1) return 0;
  const size_t one = (size_t)p->total_k * (size_t)(p->heads_kv * split) * (size_t)fc_gqa_ld(p) * 2;
  return 2 * ((one + 255) / 256 * 256); /* dK's parts, then dV's, each 256-byte aligned */
}

void fc_gqa_part_views(const fc_problem *p, int split, void *ws, fc_view *dk, fc_view *dv) {
  const size_t one = (size_t)p->total_k * (size_t)(p->heads_kv * split) * (size_t)fc_gqa_ld(p) * 2;
  dk->data = ws;
  dv->data = (char *)ws + (one + 255) / 256 * 256;
  dk->stride_h = dv->stride_h = fc_gqa_ld(p);
  dk->stride_s = dv->stride_s = p->heads_kv * split * fc_gqa_ld(p);
  /* varlen: stride_b 0, as every varlen view (internal.h): the kernels index sequence s at b = s, row cu_seqlens[s] */
  dk->stride_b = dv->stride_b = p->cu_seqlens_k ? 0 : p->seqlen_k * dk->stride_s;
}

/* out[b, s, h, c] = Σ_part parts[(b·S + s), h·split + part, c] (rows of ld elements), part 0 first. One thread per
 * element of out: consecutive threads take consecutive columns, so both sides are read and written in whole rows. */
template <typename T>
static __global__ void fc_gqa_reduce_kernel(const uint16_t *__restrict__ parts, uint16_t *__restrict__ out, int64_t sb,
                                            int64_t ss, int64_t sh, int64_t rows_per_b, int64_t n_rows, int heads_kv,
                                            int split, int head_dim, int ld) {
  const int64_t n = n_rows * heads_kv * head_dim;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(i % head_dim);
    const int64_t rh = i / head_dim;
    const int h = (int)(rh % heads_kv);
    const int64_t r = rh / heads_kv;
    const uint16_t *src = parts + (r * heads_kv * split + (int64_t)h * split) * ld + c;
    float sum = 0.f;
    for (int part = 0; part < split; part++) sum += fc_to_float<T>(src[(int64_t)part * ld]);
    out[(r / rows_per_b) * sb + (r % rows_per_b) * ss + h * sh + c] = fc_from_float<T>(sum);
  }
}

flashc_status fc_gqa_reduce(const fc_problem *p, int split, const fc_view *dk_parts, const fc_view *dv_parts) {
  const int64_t rows_per_b = p->cu_seqlens_k ? p->total_k : p->seqlen_k;
  const int64_t n_rows = p->total_k, n = n_rows * p->heads_kv * p->head_dim;
  if (n == 0) return FLASHC_OK;
  const int threads = 256;
  const int64_t blocks64 = (n + threads - 1) / threads;
  const int blocks = blocks64 < 65535 * 16 ? (int)blocks64 : 65535 * 16; /* the loop covers the rest */
  const cudaStream_t stream = (cudaStream_t)p->stream;
  const fc_view *parts[2] = {dk_parts, dv_parts}, *outs[2] = {&p->dk, &p->dv};
  for (int x = 0; x < 2; x++) {
    const fc_view *o = outs[x];
    if (p->dtype == FLASHC_F16)
      fc_gqa_reduce_kernel<__half><<<blocks, threads, 0, stream>>>(
          (const uint16_t *)parts[x]->data, (uint16_t *)o->data, o->stride_b, o->stride_s, o->stride_h, rows_per_b,
          n_rows, (int)p->heads_kv, split, (int)p->head_dim, (int)fc_gqa_ld(p));
    else
      fc_gqa_reduce_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
          (const uint16_t *)parts[x]->data, (uint16_t *)o->data, o->stride_b, o->stride_s, o->stride_h, rows_per_b,
          n_rows, (int)p->heads_kv, split, (int)p->head_dim, (int)fc_gqa_ld(p));
    FC_LAUNCH_CHECK("fc_gqa_reduce_kernel");
  }
  return FLASHC_OK;
}
