/* ladder/wmma.cu — cuda-wmma forward: the first tensor-core rung, FlashAttention-2 with the wmma API.
 *
 * The loop is the FlashAttention-2 loop of the CUDA-core rungs; what changes is who multiplies. The two
 * matrix products of a block go to the tensor cores through nvcuda::wmma 16×16×16 fragments (fp16 or bf16
 * in, fp32 out); everything between them (mask, online softmax, rescaling O) is plain code on shared memory,
 * because a wmma fragment's element layout is unspecified and cannot be rescaled row by row.
 *
 *   for each query block Q_i (Br = 64 rows, 4 warps × 16 rows):
 *     for each key block j (Bc = 64 keys) not entirely masked:
 *       S = Q_i·K_jᵀ                                    (wmma, fp32, to shared memory)
 *       m' = max(m, rowmax S);  P = exp(scale·S − scale·m');  l = e^(scale·(m − m'))·l + rowsum P
 *       O = e^(scale·(m − m'))·O + P·V_j                 (wmma; O kept in fp32 shared memory)
 *     O /= l;  lse = scale·m + ln l
 *
 * Shapes: q, o [b, sq, hq, d]; k, v [b, sk, hkv, d] (any strides); head dims 64 and 128; lse [b, hq, sq] or
 * [hq, total_q] (varlen). The next rung, cuda-mma (mma/fwd.cu), keeps S, P and O in registers instead.
 *
 * Shared memory (rows padded by 8 halves / 4 floats so that the 16 rows a fragment reads do not all start
 * in one bank; fragment pointers stay 32-byte aligned, as wmma requires):
 *   sQ, sK, sV [64][D + 8] 16-bit    sS [64][Bc + 4] fp32    sP [64][Bc + 8] 16-bit    sO [64][D + 4] fp32
 *   m, l [64] fp32 */
#include "common/common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>
#include <string.h>
#include <type_traits>

using namespace nvcuda;

enum { WMMA_BR = 64, WMMA_BC = 64, WMMA_WARPS = WMMA_BR / 16, WMMA_THREADS = WMMA_WARPS * 32 };

typedef struct fc_wmma_args {
  const void *q, *k, *v;
  void *o;
  float *lse;
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
  const int32_t *cu_q, *cu_k; /* device copies of cu_seqlens, or NULL */
  int seqlen_q, seqlen_k, heads_q, group, m_blocks;
  int64_t total_q;
  float scale;
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
} fc_wmma_args;

/* acc += A·B for one warp: A is 16 rows × K of a row-major tile (row stride lda), B is K × 16, read in wmma layout L
 * with row stride ldb: col_major for a tile stored [n][k] (K_j for S = Q·K_jᵀ), row_major for one stored [k][n]
 * (V_j for O += P·V_j). Step kk moves 16 along k: 16 elements in a col_major B, 16 rows in a row_major one. */
template <typename T, typename L, int K>
static __device__ __forceinline__ void wmma_warp_mma(wmma::fragment<wmma::accumulator, 16, 16, 16, float> &acc,
                                                     const T *A, int lda, const T *B, int ldb) {
  constexpr bool b_row_major = std::is_same<L, wmma::row_major>::value;
  for (int kk = 0; kk < K / 16; kk++) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, L> b;
    wmma::load_matrix_sync(a, A + kk * 16, lda);
    wmma::load_matrix_sync(b, B + kk * 16 * (b_row_major ? ldb : 1), ldb);
    wmma::mma_sync(acc, a, b, acc);
  }
}

/* Rows [row0, row0 + rows) of one head of a [seq, d] matrix into a padded tile;
 * rows past `valid` are 0. */
template <typename T, int D>
static __device__ void load_rows(T *tile, const T *src, int64_t stride, int row0, int rows, int valid) {
  for (int idx = threadIdx.x; idx < rows * D; idx += WMMA_THREADS) {
    const int r = idx / D, c = idx % D;
    tile[r * (D + 8) + c] = row0 + r < valid ? src[(int64_t)(row0 + r) * stride + c] : T(0.0f);
  }
}

template <typename T, int D> __global__ void __launch_bounds__(WMMA_THREADS) fc_wmma_kernel(const fc_wmma_args a) {
  constexpr int LD = D + 8, LDS = WMMA_BC + 4, LDP = WMMA_BC + 8, LDO = D + 4;
  extern __shared__ __align__(128) unsigned char smem[];
  T *sQ = (T *)smem, *sK = sQ + WMMA_BR * LD, *sV = sK + WMMA_BC * LD;
  float *sS = (float *)(sV + WMMA_BC * LD);
  T *sP = (T *)(sS + WMMA_BR * LDS);
  float *sO = (float *)(sP + WMMA_BR * LDP);
  float *sm = sO + WMMA_BR * LDO, *sl = sm + WMMA_BR;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  const int mb = (int)(blockIdx.x % a.m_blocks);
  const int64_t bh = blockIdx.x / a.m_blocks;
  const int h = (int)(bh % a.heads_q);
  const int64_t b = bh / a.heads_q;
  int64_t q_start = 0, k_start = 0;
  int sq = a.seqlen_q, sk = a.seqlen_k;
  if (a.cu_q) {
    q_start = a.cu_q[b], sq = a.cu_q[b + 1] - (int)q_start;
    k_start = a.cu_k[b], sk = a.cu_k[b + 1] - (int)k_start;
  }
  const int i0 = mb * WMMA_BR;
  if (i0 >= sq) return;
  const int hk = h / a.group;
  const T *Q = (const T *)a.q + b * a.q_sb + q_start * a.q_ss + (int64_t)h * a.q_sh;
  const T *K = (const T *)a.k + b * a.k_sb + k_start * a.k_ss + (int64_t)hk * a.k_sh;
  const T *V = (const T *)a.v + b * a.v_sb + k_start * a.v_ss + (int64_t)hk * a.v_sh;
  T *O = (T *)a.o + b * a.o_sb + q_start * a.o_ss + (int64_t)h * a.o_sh;

  /* Keys any row of this block may see: [lo, hi) (the window and causal bounds
   * move with the row). */
  const int64_t shift = (a.bottom_right ? (int64_t)sk - sq : 0) + a.mask_offset;
  const int64_t i_last = min(i0 + WMMA_BR, sq) - 1;
  int64_t lo = a.window_left < 0 ? 0 : i0 + shift - a.window_left;
  int64_t hi = a.window_right < 0 ? sk : i_last + shift + a.window_right + 1;
  lo = max(lo, (int64_t)0), hi = min(hi, (int64_t)sk);

  load_rows<T, D>(sQ, Q, a.q_ss, i0, WMMA_BR, sq);
  for (int idx = threadIdx.x; idx < WMMA_BR * LDO; idx += WMMA_THREADS) sO[idx] = 0.0f;
  for (int r = threadIdx.x; r < WMMA_BR; r += WMMA_THREADS) sm[r] = -INFINITY, sl[r] = 0.0f;

  for (int64_t k0 = lo < hi ? lo / WMMA_BC * WMMA_BC : hi; k0 < hi; k0 += WMMA_BC) {
    __syncthreads(); /* every warp is done with the previous K_j, V_j (and Q,
                        sO, m, l are written) */
    load_rows<T, D>(sK, K, a.k_ss, (int)k0, WMMA_BC, sk);
    load_rows<T, D>(sV, V, a.v_ss, (int)k0, WMMA_BC, sk);
    __syncthreads(); /* K_j, V_j are in shared memory */

    /* S_w = Q_w·K_jᵀ for this warp's 16 rows: K_j stored [key][d] is K_jᵀ in
     * column-major order. */
    for (int n = 0; n < WMMA_BC / 16; n++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
      wmma::fill_fragment(s, 0.0f);
      wmma_warp_mma<T, wmma::col_major, D>(s, sQ + warp * 16 * LD, LD, sK + n * 16 * LD, LD);
      wmma::store_matrix_sync(sS + warp * 16 * LDS + n * 16, s, LDS, wmma::mem_row_major);
    }
    __syncwarp(); /* the warp's S rows are written */

    /* Online softmax: two lanes per row, each over half of the keys and half of
     * O's columns. A row that has seen no visible key keeps m = −inf; its base
     * is 0 so that exp(−inf) = 0, never exp(−inf + inf). The maxima carry NaN
     * (fc_fmax_nan): a NaN score makes the row NaN, not "no key seen". */
    {
      const int r = warp * 16 + lane / 2, half = lane % 2;
      const int64_t i = i0 + r;
      float *srow = sS + r * LDS;
      float mx = sm[r];
      for (int c = half * 32; c < half * 32 + 32; c++) {
        const int64_t j = k0 + c, dj = j - (i + shift);
        const bool visible =
            j < sk && (a.window_left < 0 || dj >= -a.window_left) && (a.window_right < 0 || dj <= a.window_right);
        srow[c] = visible ? srow[c] * a.scale : -INFINITY;
        mx = fc_fmax_nan(mx, srow[c]);
      }
      mx = fc_fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float alpha = __expf(sm[r] - base);
      float sum = 0.0f;
      for (int c = half * 32; c < half * 32 + 32; c++) {
        const float p = __expf(srow[c] - base);
        sP[r * LDP + c] = T(p);
        sum += p;
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      for (int c = half * (D / 2); c < half * (D / 2) + D / 2; c++) sO[r * LDO + c] *= alpha;
      __syncwarp(); /* both lanes of the row have read the old m */
      if (half == 0) sl[r] = alpha * sl[r] + sum, sm[r] = mx;
    }
    __syncwarp(); /* P and the rescaled O rows are written */

    /* O_w += P_w·V_j, accumulating in place in sO. */
    for (int n = 0; n < D / 16; n++) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
      wmma::load_matrix_sync(o, sO + warp * 16 * LDO + n * 16, LDO, wmma::mem_row_major);
      wmma_warp_mma<T, wmma::row_major, WMMA_BC>(o, sP + warp * 16 * LDP, LDP, sV + n * 16, LD);
      wmma::store_matrix_sync(sO + warp * 16 * LDO + n * 16, o, LDO, wmma::mem_row_major);
    }
  }
  __syncthreads(); /* sO, m, l are final */

  /* O = O / l, lse = m + ln l (m already carries the scale); a row that saw no
   * key (m = −inf): O = 0, lse = −inf; a NaN m or l: NaN. */
  for (int idx = threadIdx.x; idx < WMMA_BR * D; idx += WMMA_THREADS) {
    const int r = idx / D, c = idx % D;
    if (i0 + r >= sq) continue;
    const float l = sl[r];
    O[(int64_t)(i0 + r) * a.o_ss + c] = T(sm[r] != -INFINITY ? sO[r * LDO + c] / l : 0.0f);
  }
  if (a.lse)
    for (int r = threadIdx.x; r < WMMA_BR; r += WMMA_THREADS) {
      const int64_t i = i0 + r;
      if (i >= sq) continue;
      const int64_t at = a.cu_q ? (int64_t)h * a.total_q + q_start + i : ((int64_t)b * a.heads_q + h) * a.seqlen_q + i;
      a.lse[at] = sm[r] != -INFINITY ? sm[r] + logf(sl[r]) : -INFINITY;
    }
}

/* ---- launch -------------------------------------------------------------------------------------------- */
template <typename T, int D> static flashc_status wmma_launch(const fc_problem *p, const fc_wmma_args *a, int grid) {
  const size_t smem = (WMMA_BR + 2 * WMMA_BC) * (D + 8) * sizeof(T) + WMMA_BR * (WMMA_BC + 4) * sizeof(float) +
                      WMMA_BR * (WMMA_BC + 8) * sizeof(T) + WMMA_BR * (D + 4) * sizeof(float) +
                      2 * WMMA_BR * sizeof(float);
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  if (smem > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_forward: cuda-wmma needs %zu bytes of shared memory; device %d "
                    "allows %zu per block",
                    smem, props.device, props.smem_per_block_optin);
  FC_CUDA_CHECK(cudaFuncSetAttribute(fc_wmma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  fc_wmma_kernel<T, D><<<grid, WMMA_THREADS, smem, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_wmma_kernel");
  return FLASHC_OK;
}

static int64_t wmma_grid_size(const fc_problem *p) { return fc_cdiv(p->seqlen_q, WMMA_BR) * p->heads_q * p->batch; }

static flashc_status wmma_supports(const fc_problem *p) {
  if (p->head_dim != 64 && p->head_dim != 128)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld is not 64 or 128 on backend cuda-wmma",
                    (long long)p->head_dim);
  if (p->heads_q > INT32_MAX || wmma_grid_size(p) > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%lld query blocks x %lld heads x %lld sequences exceed 2^31-1 CTAs on "
                    "backend cuda-wmma",
                    (long long)fc_cdiv(p->seqlen_q, WMMA_BR), (long long)p->heads_q, (long long)p->batch);
  return FLASHC_OK;
}

static flashc_status wmma_forward(const fc_problem *p) {
  fc_wmma_args a;
  memset(&a, 0, sizeof a);
  if (p->cu_seqlens_q) { /* the offsets, from the caller's host arrays to the
                            device */
    void *ws = NULL;
    const size_t n = (size_t)(p->batch + 1) * sizeof(int32_t);
    FC_CHECK(fc_device_workspace(p, 2 * n, &ws));
    FC_CUDA_CHECK(cudaMemcpyAsync(ws, p->cu_seqlens_q, n, cudaMemcpyHostToDevice, fc_stream(p)));
    FC_CUDA_CHECK(cudaMemcpyAsync((char *)ws + n, p->cu_seqlens_k, n, cudaMemcpyHostToDevice, fc_stream(p)));
    a.cu_q = (const int32_t *)ws;
    a.cu_k = (const int32_t *)((char *)ws + n);
  }
  a.q = p->q.data, a.k = p->k.data, a.v = p->v.data, a.o = p->o.data, a.lse = p->lse;
  a.q_sb = p->q.stride_b, a.q_ss = p->q.stride_s, a.q_sh = p->q.stride_h;
  a.k_sb = p->k.stride_b, a.k_ss = p->k.stride_s, a.k_sh = p->k.stride_h;
  a.v_sb = p->v.stride_b, a.v_ss = p->v.stride_s, a.v_sh = p->v.stride_h;
  a.o_sb = p->o.stride_b, a.o_ss = p->o.stride_s, a.o_sh = p->o.stride_h;
  a.seqlen_q = (int)p->seqlen_q, a.seqlen_k = (int)p->seqlen_k;
  a.heads_q = (int)p->heads_q, a.group = (int)(p->heads_q / p->heads_kv);
  a.m_blocks = (int)fc_cdiv(p->seqlen_q, WMMA_BR);
  a.total_q = p->total_q;
  a.scale = p->scale;
  a.window_left = p->window_left, a.window_right = p->window_right, a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  const int grid = (int)wmma_grid_size(p);
  if (p->dtype == FLASHC_F16)
    return p->head_dim == 64 ? wmma_launch<__half, 64>(p, &a, grid) : wmma_launch<__half, 128>(p, &a, grid);
  return p->head_dim == 64 ? wmma_launch<__nv_bfloat16, 64>(p, &a, grid) : wmma_launch<__nv_bfloat16, 128>(p, &a, grid);
}

static bool wmma_usable(char *why, size_t len) { return fc_cuda_usable_sm(80, why, len); }

extern "C" const fc_backend fc_backend_cuda_wmma = {
    "cuda-wmma",
    "FlashAttention-2 with the wmma API: tensor-core matrix products, softmax "
    "in shared memory (sm_80+)",
    FLASHC_DEVICE_CUDA,
    (1u << FLASHC_F16) | (1u << FLASHC_BF16),
    64,
    128,
    wmma_usable,
    wmma_supports,
    wmma_forward,
    NULL,
    0,    /* features: the plain call only (validate.c refuses the others) */
    0,    /* max_head_dim_v */
    NULL, /* forward_kvcache */
};
