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

#include <type_traits>

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

/* One reduction of fc_gqa_reduce_kernel: the parts (of rows of ld elements) and the caller's dK or dV. */
typedef struct fc_gqa_sum {
  const uint16_t *parts;
  uint16_t *out;
  int64_t sb, ss, sh;
} fc_gqa_sum;

/* out[b, s, h, c] = Σ_part parts[(b·S + s), h·split + part, c], part 0 first, in fp32; blockIdx.y picks dK or dV.
 * W elements (16 bytes at W = 8) per thread and row: the threads of the grid are `rows_per_pass` rows of `per_row`
 * = heads_kv·head_dim / W threads each (the rest idle), and each walks its column down the rows, so its (head,
 * column) cost no division in the loop, its next row's sequence one only where it crosses into another. An element
 * per thread with its five 64-bit divisions was bound by their instructions: 0.7 TB/s on the H200. */
template <typename T, int W>
static __global__ void fc_gqa_reduce_kernel(fc_gqa_sum dk, fc_gqa_sum dv, int64_t rows_per_b, int64_t n_rows,
                                            int rows_per_pass, int heads_kv, int split, int head_dim, int ld) {
  typedef typename std::conditional<W == 8, uint4, uint16_t>::type vec;
  const fc_gqa_sum x = blockIdx.y == 0 ? dk : dv;
  const int per_row = heads_kv * (head_dim / W);
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows_per_pass * per_row) return;
  const int col = t % per_row, h = col / (head_dim / W), c = (col - h * (head_dim / W)) * W;
  int64_t r = t / per_row, b = r / rows_per_b, s = r - b * rows_per_b;
  const int64_t part_row = (int64_t)heads_kv * split * ld; /* elements of one row of the parts */
  const uint16_t *src = x.parts + r * part_row + ((int64_t)h * split) * ld + c;
  for (; r < n_rows; r += rows_per_pass, src += rows_per_pass * part_row) {
    float sum[W];
    for (int e = 0; e < W; e++) sum[e] = 0.f;
    for (int part = 0; part < split; part++) {
      const vec v = *(const vec *)(src + (int64_t)part * ld);
      const uint16_t *u = (const uint16_t *)&v;
      for (int e = 0; e < W; e++) sum[e] += fc_to_float<T>(u[e]);
    }
    vec o;
    uint16_t *u = (uint16_t *)&o;
    for (int e = 0; e < W; e++) u[e] = fc_from_float<T>(sum[e]);
    *(vec *)(x.out + b * x.sb + s * x.ss + h * x.sh + c) = o;
    s += rows_per_pass; /* the next row's sequence */
    if (s >= rows_per_b) {
      const int64_t q = s / rows_per_b;
      b += q, s -= q * rows_per_b;
    }
  }
}

/* 16-byte rows: the views' start and strides on 16 bytes and whole 8-element columns. */
static bool fc_gqa_vec8(const fc_view *v, int64_t head_dim) {
  return head_dim % 8 == 0 && (uintptr_t)v->data % 16 == 0 && v->stride_b % 8 == 0 && v->stride_s % 8 == 0 &&
         v->stride_h % 8 == 0;
}

template <typename T, int W>
static flashc_status fc_gqa_reduce_launch(const fc_problem *p, int split, fc_gqa_sum dk, fc_gqa_sum dv) {
  const int64_t rows_per_b = p->cu_seqlens_k ? p->total_k : p->seqlen_k, n_rows = p->total_k;
  const int threads = 256;
  const int64_t per_row = p->heads_kv * (p->head_dim / W); /* threads per row: an int in the kernel */
  if (per_row > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: %lld KV heads x head_dim %lld exceed the GQA sum's 2^31-1",
                    (long long)p->heads_kv, (long long)p->head_dim);
  fc_device_props props;
  const int sms = fc_device_get_props(&props) == FLASHC_OK ? props.num_sms : 132;
  /* 8 CTAs of 256 threads per SM (full occupancy), at least one row per pass, at most every row in one */
  int64_t total = (int64_t)sms * 8 * threads;
  if (total < per_row) total = per_row;
  int64_t rows_per_pass = total / per_row;
  if (rows_per_pass > n_rows) rows_per_pass = n_rows;
  /* rows_per_pass · per_row ≤ total: at most sms · 8 CTAs, or one row's */
  const unsigned blocks = (unsigned)((rows_per_pass * per_row + threads - 1) / threads);
  fc_gqa_reduce_kernel<T, W><<<dim3(blocks, 2), threads, 0, (cudaStream_t)p->stream>>>(
      dk, dv, rows_per_b, n_rows, (int)rows_per_pass, (int)p->heads_kv, split, (int)p->head_dim, (int)fc_gqa_ld(p));
  FC_LAUNCH_CHECK("fc_gqa_reduce_kernel");
  return FLASHC_OK;
}

template <typename T>
static flashc_status fc_gqa_reduce_as(const fc_problem *p, int split, fc_gqa_sum dk, fc_gqa_sum dv) {
  if (fc_gqa_vec8(&p->dk, p->head_dim) && fc_gqa_vec8(&p->dv, p->head_dim))
    return fc_gqa_reduce_launch<T, 8>(p, split, dk, dv);
  return fc_gqa_reduce_launch<T, 1>(p, split, dk, dv);
}

flashc_status fc_gqa_reduce(const fc_problem *p, int split, const fc_view *dk_parts, const fc_view *dv_parts) {
  if (p->total_k * p->heads_kv * p->head_dim == 0) return FLASHC_OK;
  const fc_gqa_sum dk = {(const uint16_t *)dk_parts->data, (uint16_t *)p->dk.data, p->dk.stride_b, p->dk.stride_s,
                         p->dk.stride_h};
  const fc_gqa_sum dv = {(const uint16_t *)dv_parts->data, (uint16_t *)p->dv.data, p->dv.stride_b, p->dv.stride_s,
                         p->dv.stride_h};
  return p->dtype == FLASHC_F16 ? fc_gqa_reduce_as<__half>(p, split, dk, dv)
                                : fc_gqa_reduce_as<__nv_bfloat16>(p, split, dk, dv);
}
