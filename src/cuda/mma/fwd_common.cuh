/* mma/fwd_common.cuh — what cuda-mma's forward kernels (mma/fwd.cu's and the lean
 * one of mma/fwd_kernel.cuh) share: their arguments, which tile a CTA computes,
 * and the end of a CTA (O = O / l, lse, O stored through shared memory). */
#ifndef FLASHC_CUDA_MMA_FWD_COMMON_CUH
#define FLASHC_CUDA_MMA_FWD_COMMON_CUH

#include "mma/fwd_steps.cuh"
#include "mma/score_mod.cuh"
#include "common/tail_order.cuh"

#include <math.h>

enum { FC_MMA_BR = 128 }; /* query rows per CTA: warps × M-tiles per warp × 16 */

typedef struct fc_mma_fwd_args {
  const uint16_t *q, *k, *v;
  uint16_t *o;
  float *lse; /* NULL: not wanted */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
  const int32_t *cu_q, *cu_k;   /* device copies of cu_seqlens, or NULL (dense) */
  const int32_t *end_q, *end_k; /* varlen: where each sequence's rows end (mma/host.cuh: seqused) */
  int seqlen_q, seqlen_k;       /* dense sizes */
  int64_t total_q;              /* varlen lse row stride */
  int heads_q, group;           /* group = heads_q / heads_kv */
  int head_dim, m_blocks;
  int n_pairs;      /* (sequence, query head) pairs: batch·heads_q */
  int tail_from;    /* the first pair walked tile by tile (common/tail_order.cuh) */
  float scale_log2; /* |scale|·log2(e): exponent of S in base 2 */
  float scale;      /* |scale| */
  int negate_q;     /* scale < 0: use −Q and |scale| (the scores are the same) */
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
  /* Split keys (mma/fwd_split.cuh): n_splits > 1 runs each tile as n_splits CTAs (blockIdx.y) over equal parts of
   * its key blocks, each writing O / l and lse of its part to split_o, split_lse; a second kernel combines them. */
  int n_splits;
  float *split_o, *split_lse;
  /* Softcap and ALiBi (mma/score_mod.cuh), read by the SCORE_MOD kernels only; last, so that the plain kernels'
   * arguments keep their offsets. Their calls run with scale 1 and scale_log2 = log2 e: S becomes the modified score
   * x, and lse = m + ln l. */
  fc_score_mod mod;
  /* V's head dim (v, o: head_dim_v columns), read by the kernels compiled with DV ≠ D and by the split's combine; the
   * kernels with DV = D read head_dim for every tensor. After mod, as mod is after the rest. */
  int head_dim_v;
} fc_mma_fwd_args;

/* Columns of a row of V and O: head_dim_v where V's compiled head dim DV differs from Q/K's D, else head_dim (the
 * kernels with DV = D, so that their code is the code they had before V's head dim could differ). */
template <int D, int DV> static __device__ __forceinline__ int fc_fwd_v_cols(const fc_mma_fwd_args &a) {
  if constexpr (DV == D)
    return a.head_dim;
  else
    return a.head_dim_v;
}

/* Which tile a CTA computes: row blocks vary fastest (CTAs running together
 * share K and V in L2), the heaviest causal block of each head first, the last
 * pairs row block by row block (common/tail_order.cuh: a short tail). Sequence b's rows are [q_start, q_start + sq) of
 * q and its keys [k_start, k_start + sk) of k and v (varlen: the used rows of its slots). */
typedef struct fc_fwd_where {
  int64_t b, q_start, k_start;
  int h, mb, sq, sk;
} fc_fwd_where;
static __device__ __forceinline__ fc_fwd_where fc_fwd_locate(const fc_mma_fwd_args &a) {
  fc_fwd_where w;
  int blk; /* 0: the pair's heaviest query block (the last, under a causal mask); the grid's order:
              common/tail_order.cuh */
  int64_t bh;
  fc_tail_tile_of_cta(a.m_blocks, a.n_pairs, a.tail_from, &blk, &bh);
  w.mb = a.m_blocks - 1 - blk;
  w.h = (int)(bh % a.heads_q);
  w.b = bh / a.heads_q;
  w.q_start = w.k_start = 0;
  w.sq = a.seqlen_q, w.sk = a.seqlen_k;
  if (a.cu_q) {
    w.q_start = a.cu_q[w.b];
    w.sq = a.end_q[w.b] - (int)w.q_start;
    w.k_start = a.cu_k[w.b];
    w.sk = a.end_k[w.b] - (int)w.k_start;
  }
  return w;
}

/* The rest of a forward row block's place, after fc_fwd_locate (w) and its first row i0 (the SMALL and the lean
 * kernels): row 0 of its sequence in Q (head h) and in K, V (head h / group), the diagonal's shift, its last row (rows
 * past sq are padding) and the key blocks visible to some of its rows, [j_begin, j_end). */
template <int BR, int BC>
static __device__ __forceinline__ void fc_fwd_block(const fc_mma_fwd_args &a, const fc_fwd_where &w, int i0,
                                                    const uint16_t **Q, const uint16_t **K, const uint16_t **V,
                                                    int64_t *shift, int *i_last, int *j_begin, int *j_end) {
  const int hk = w.h / a.group;
  *Q = a.q + w.b * a.q_sb + w.q_start * a.q_ss + (int64_t)w.h * a.q_sh;
  *K = a.k + w.b * a.k_sb + w.k_start * a.k_ss + (int64_t)hk * a.k_sh;
  *V = a.v + w.b * a.v_sb + w.k_start * a.v_ss + (int64_t)hk * a.v_sh;
  *shift = (a.bottom_right ? (int64_t)w.sk - w.sq : 0) + a.mask_offset;
  *i_last = min(i0 + BR, w.sq) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  fc_row_keys(i0, *shift, a.window_left, a.window_right, w.sk, &lo_first, &hi_first);
  fc_row_keys(*i_last, *shift, a.window_left, a.window_right, w.sk, &lo_last, &hi_last);
  *j_begin = lo_first / BC;
  *j_end = lo_first < hi_last ? (hi_last + BC - 1) / BC : *j_begin;
}

/* A row's l summed over the quad of threads that hold its columns, and its lse = scale·m + ln l (−inf where m = −inf:
 * the row saw no key; NaN where m or l is NaN). Shared by the one-pass end below and the split keys'
 * (mma/fwd_split.cuh). */
static __device__ __forceinline__ float fc_fwd_quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
static __device__ __forceinline__ float fc_fwd_row_lse(float m, float l, float scale) {
  /* __fmul_rn: not contracted into fma(m, scale, ln l). Past fp32's range (scale·m > 3.4e38) every P underflowed
   * and l = 0: the fma's exact product plus −inf gave −inf, "no key seen", and the backward then gave zero
   * gradients; the rounded product is +inf, inf − inf = NaN, and the overflow shows. */
  return m != -INFINITY ? __fmul_rn(m, scale) + logf(l) : -INFINITY;
}

/* The end of a CTA: O = O / l and lse = scale·m + ln l (a row that saw no key
 * has m = −inf and l = 0: O = 0, lse = −inf), then O stored through shared memory, so that
 * global stores are whole 16-byte chunks of a row. Each warp stages its rows in
 * the rows of sO (= sQ) that only it has read (its Q fragments): a warp
 * barrier is enough. With V's head dim DV ≠ D, O's rows (stride fc_tile_stride(DV)) no longer lie on the warp's own
 * rows of sQ: a block barrier first, after which every warp is done with sQ, sK and sV and O may take any of them
 * (sO is the start of shared memory; the kernel asserts that Br rows of O fit). */
template <typename T, int D, int MT, int DV = D>
static __device__ __forceinline__ void fc_fwd_finish(const fc_mma_fwd_args &a, const fc_fwd_where &w, int i0, int wrow,
                                                     float (*o)[DV / 8][4], const float (*m)[2], const float (*l)[2],
                                                     uint16_t *sO, int lane) {
  constexpr int NO = DV / 8, DS = fc_tile_stride(DV);
  const int g = lane / 4, t = lane % 4;
  const int64_t b = w.b, q_start = w.q_start;
  const int h = w.h, sq = w.sq;
  uint16_t *O = a.o + b * a.o_sb + q_start * a.o_ss + (int64_t)h * a.o_sh;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const float lr = fc_fwd_quad_sum(l[mt][rh]);
      const float inv = m[mt][rh] != -INFINITY ? 1.0f / lr : 0.0f;
#pragma unroll
      for (int x = 0; x < NO; x++) {
        o[mt][x][2 * rh] *= inv;
        o[mt][x][2 * rh + 1] *= inv;
      }
      const int row = i0 + wrow + 16 * mt + g + 8 * rh;
      if (a.lse && t == 0 && row < sq) {
        const int64_t at =
            a.cu_q ? (int64_t)h * a.total_q + q_start + row : ((int64_t)b * a.heads_q + h) * a.seqlen_q + row;
        a.lse[at] = fc_fwd_row_lse(m[mt][rh], lr, a.scale);
      }
    }

  if constexpr (DV != D)
    __syncthreads(); /* O's rows overlap other warps' rows of sQ (and sK, sV): every warp is past its key loop */
  else
    __syncwarp(); /* lanes wrote rows other lanes read through ldmatrix at the
                     start: order them explicitly */
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < NO; x++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const int r = wrow + 16 * mt + g + 8 * rh;
        *(uint32_t *)(sO + fc_tile_off<DS>(r, x) + 2 * t) = fc_pack2<T>(o[mt][x][2 * rh], o[mt][x][2 * rh + 1]);
      }
  __syncwarp();
  for (int idx = lane; idx < 16 * MT * NO; idx += 32) {
    const int r = wrow + idx / NO, c = idx % NO, row = i0 + r;
    const int cols = min(fc_fwd_v_cols<D, DV>(a) - 8 * c, 8);
    if (row >= sq || cols <= 0) continue;
    const uint16_t *from = sO + fc_tile_off<DS>(r, c);
    uint16_t *to = O + (int64_t)row * a.o_ss + 8 * c;
    if (cols == 8) {
      *(uint4 *)to = *(const uint4 *)from;
    } else {
      for (int x = 0; x < cols; x++) to[x] = from[x];
    }
  }
}

/* K and V of key block j into stage `stage` of the ring (keys past sk as zeros): the copy both forward kernels issue
 * for a block. V's rows are DV columns wide (stride fc_tile_stride(DV)). */
template <int BC, int D, int NT, int DV = D>
static __device__ __forceinline__ void fc_fwd_load_kv(uint16_t *sK, uint16_t *sV, const uint16_t *K, const uint16_t *V,
                                                      const fc_mma_fwd_args &a, int sk, int tid, int j, int stage) {
  constexpr int DS = fc_tile_stride(D), DSV = fc_tile_stride(DV);
  fc_fwd_load_tile<BC, D, NT>(sK + stage * BC * DS, K + (int64_t)j * BC * a.k_ss, a.k_ss, sk - j * BC, a.head_dim, tid,
                              K);
  fc_fwd_load_tile<BC, DV, NT>(sV + stage * BC * DSV, V + (int64_t)j * BC * a.v_ss, a.v_ss, sk - j * BC,
                               fc_fwd_v_cols<D, DV>(a), tid, V);
}

/* Q_i (rows i0.., those past sq as zeros), then the first STAGES − 1 key blocks from j_begin, one commit group each
 * (empty groups keep the count); on return every thread's part of Q_i has landed (Q's group is the oldest). */
template <int BR, int BC, int D, int NT, int STAGES, int DV = D>
static __device__ __forceinline__ void fc_fwd_prologue(uint16_t *sQ, uint16_t *sK, uint16_t *sV, const uint16_t *Q,
                                                       const uint16_t *K, const uint16_t *V, const fc_mma_fwd_args &a,
                                                       int i0, int sq, int sk, int j_begin, int j_end, int tid) {
  fc_fwd_load_tile<BR, D, NT>(sQ, Q + (int64_t)i0 * a.q_ss, a.q_ss, sq - i0, a.head_dim, tid, Q);
  fc_cp_async_commit();
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    const int j = j_begin + s;
    if (j < j_end) fc_fwd_load_kv<BC, D, NT, DV>(sK, sV, K, V, a, sk, tid, j, s);
    fc_cp_async_commit();
  }
  fc_cp_async_wait<STAGES - 1>();
  __syncthreads();
}

#endif /* FLASHC_CUDA_MMA_FWD_COMMON_CUH */
