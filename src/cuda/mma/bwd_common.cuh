/* mma/bwd_common.cuh — what every configuration of cuda-mma's backward shares (mma/bwd_launch.cuh includes it, then
 * the configurations' kernels): the kernels' argument block, one sequence's offsets, the mask test, and the
 * loader of one query block (Q_i, dO_i, lse2_i, D_i) into shared memory. */
#ifndef FLASHC_CUDA_MMA_BWD_COMMON_CUH
#define FLASHC_CUDA_MMA_BWD_COMMON_CUH

#include "common/tail_order.cuh"
#include "common/common.cuh"
#include "common/gqa.cuh"
#include "mma/score_mod.cuh"
#include "mma/tile.cuh"

enum { FC_BWD_PADR = 128, FC_BWD_DQ_WARPS = 8, FC_BWD_DQ_THREADS = FC_BWD_DQ_WARPS * 32, FC_BWD_DQ_BR = 128 };

/* The dK/dV kernels (step 2 of mma/bwd.cu); steps 1, 3, 3' and 4 are the same for all. */
typedef enum fc_mma_bwd_kernel {
  FC_MMA_BWD_FA2, /* fc_mma_bwd_fa2_kernel (mma/bwd_kernel.cuh): FlashAttention-2's tiles; atomic or deterministic dQ */
  FC_MMA_BWD_FA2P,  /* fa2 with Pᵀ's exponentials between dPᵀ's MMAs (PDP); atomic dQ */
  FC_MMA_BWD_FA2PB, /* fa2p with each block's dQ added by one bulk reduce-add (sm_90): a blocked dQ sum */
  FC_MMA_BWD_BASE   /* fc_mma_bwd_dkdv_kernel: smaller tiles, where fa2's do not fit the device */
} fc_mma_bwd_kernel;

/* Whether the image of this library's device code built for code_sm (fc_device_props) holds `kernel` (an
 * fc_mma_bwd_kernel): the sm_90 image holds fa2 and fa2pb, every other image (sm_80, whose SASS also runs on sm_86 and
 * sm_89 and whose PTX later GPUs JIT-compile) fa2, fa2p and base. The plan picks among the kernels of the image the
 * device runs; in the others a kernel compiles to a trap (FC_KERNEL_IN_IMAGE), which no call reaches. */
static constexpr bool fc_mma_bwd_in_image(int code_sm, int kernel) {
  return code_sm / 10 == 9 ? kernel == FC_MMA_BWD_FA2 || kernel == FC_MMA_BWD_FA2PB : kernel != FC_MMA_BWD_FA2PB;
}

typedef struct fc_mma_bwd_args {
  const uint16_t *q, *k, *v, *o, *dout;
  uint16_t *dq, *dk, *dv;
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh, do_sb, do_ss, do_sh;
  int64_t dq_sb, dq_ss, dq_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  const float *lse;   /* the forward's: [b, hq, sq], or [hq, total_q] when varlen */
  float *lse2, *dsum; /* [hq][total_pad]: lse·log2(e) (+inf: P = 0) and D, rows
                         padded per sequence */
  float *dq_accum;    /* [total_q][hq][dq_ld] fp32 (atomic mode); dq_ld = D, so rows are 16-byte aligned */
  int dq_ld;
  int dq_tile_w; /* > 0 (fa2pb's bulk adds): dq_accum is [hq][total_pad][dq_ld] in fc_bwd_dq_blocked_index's
                    layout with w = dq_tile_w (common/bwd_rows.cuh) */
  /* varlen: sequence b's rows are [cu_q[b], end_q[b]) of q, [cu_k[b], end_k[b]) of k (mma/host.cuh) */
  const int32_t *cu_q, *cu_k, *end_q, *end_k;
  const int64_t *cu_pad; /* varlen: first padded row of each sequence in
                            lse2/dsum; NULL when dense */
  int seqlen_q, seqlen_k;
  int64_t total_q, total_pad, sq_pad;
  /* GQA split into kv_split parts per kv head (common/gqa.cu): heads_kv counts the parts, group the query heads of a kv
   * head; a dK/dV tile's hk is a part, reading K/V head hk / kv_split and its query heads (fc_gqa_part_heads) */
  int heads_q, heads_kv, group, head_dim;
  int kv_split;
  int n_blocks;     /* row blocks per (head, sequence) in the kernel's grid */
  int n_pairs;      /* dK/dV grids: (sequence, kv head) pairs, batch·heads_kv */
  int tail_from;    /* dK/dV grids: the first pair walked key block by key block (common/tail_order.cuh) */
  float scale;      /* signed */
  float scale_log2; /* |scale|·log2(e) */
  int negate_q;     /* scale < 0: scores from −Q with |scale| */
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
  /* Softcap and ALiBi (mma/score_mod.cuh), read by the SCORE_MOD kernels only; last, so that the plain kernels'
   * arguments keep their offsets. */
  fc_score_mod mod;
  /* V's head dim: the columns of v, dout, o and dv (head_dim: of q, k, dq, dk). The kernels run at the compiled
   * max(head_dim, head_dim_v) built with DV_COLS (mma/bwd.cu), each tensor's columns past its own head dim read as
   * zeros: they add nothing to Sᵀ = K·Qᵀ or dPᵀ = V·dOᵀ, and the gradients' columns there are zeros, not stored. */
  int head_dim_v;
} fc_mma_bwd_args;

/* Columns of V, dO and dV: head_dim_v in the kernels built for a call whose V's head dim differs (DV_COLS), else
 * head_dim, so that the other kernels' code is what it was before V's head dim could differ (a second column count
 * held beside the first made ptxas spill more in a quarter of them). */
template <bool DV_COLS> static __device__ __forceinline__ int fc_bwd_v_cols(const fc_mma_bwd_args &a) {
  if constexpr (DV_COLS)
    return a.head_dim_v;
  else
    return a.head_dim;
}

/* One sequence: where its rows start in q (and the packed dQ buffer), k, and
 * the padded row buffers, and how many it has (varlen: the used rows of its slots). */
typedef struct fc_bwd_seq {
  int64_t q_start, k_start, q_row0, pad0;
  int sq, sk;
} fc_bwd_seq;

static __device__ __forceinline__ fc_bwd_seq fc_bwd_seq_of(const int32_t *cu_q, const int32_t *cu_k,
                                                           const int32_t *end_q, const int32_t *end_k,
                                                           const int64_t *cu_pad, int seqlen_q, int seqlen_k,
                                                           int64_t sq_pad, int64_t b) {
  fc_bwd_seq s;
  if (cu_q) {
    s.q_start = cu_q[b], s.sq = end_q[b] - (int)s.q_start;
    s.k_start = cu_k[b], s.sk = end_k[b] - (int)s.k_start;
    s.q_row0 = s.q_start, s.pad0 = cu_pad[b];
  } else {
    s.q_start = 0, s.sq = seqlen_q, s.k_start = 0, s.sk = seqlen_k;
    s.q_row0 = b * seqlen_q, s.pad0 = b * sq_pad;
  }
  return s;
}
#define FC_BWD_SEQ(a, b) fc_bwd_seq_of(a.cu_q, a.cu_k, a.end_q, a.end_k, a.cu_pad, a.seqlen_q, a.seqlen_k, a.sq_pad, b)

static __device__ __forceinline__ bool fc_bwd_visible(int64_t i, int64_t j, int64_t shift, int64_t wl, int64_t wr) {
  return (wl < 0 || j >= i + shift - wl) && (wr < 0 || j <= i + shift + wr);
}

/* The key block of a dK/dV CTA (the grid's order: common/tail_order.cuh): key block jb of sequence b and kv head part
 * hk, whose query heads are h0 .. h0 + nh − 1 (common/gqa.cuh). */
static __device__ __forceinline__ void fc_bwd_kv_of_cta(const fc_mma_bwd_args &a, int *jb, int64_t *b, int *hk, int *h0,
                                                        int *nh) {
  int64_t bh;
  fc_tail_tile_of_cta(a.n_blocks, a.n_pairs, a.tail_from, jb, &bh);
  *hk = (int)(bh % a.heads_kv);
  fc_gqa_part_heads(*hk, a.group, a.kv_split, h0, nh);
  *b = bh / a.heads_kv;
}

/* The query blocks of BR rows with some row that sees a key of [k0, k0 + BC) (i − wr ≤ j − shift ≤ i + wl):
 * [i_begin, i_begin + n_i). */
template <int BR, int BC>
static __device__ __forceinline__ void fc_bwd_query_blocks(const fc_mma_bwd_args &a, const fc_bwd_seq &s, int k0,
                                                           int64_t shift, int *i_begin, int *n_i) {
  int64_t i_lo = a.window_right < 0 ? 0 : k0 - shift - a.window_right;
  int64_t i_hi = a.window_left < 0 ? s.sq : (int64_t)min(k0 + BC, s.sk) - 1 - shift + a.window_left + 1;
  i_lo = max(i_lo, (int64_t)0), i_hi = min(i_hi, (int64_t)s.sq);
  *i_begin = (int)(i_lo / BR);
  *n_i = i_lo < i_hi ? (int)((i_hi + BR - 1) / BR) - *i_begin : 0;
}

/* x = y = 0: the two accumulators of a pair of products (fc_bwd_mma2) that start from zero. */
template <int N> static __device__ __forceinline__ void fc_bwd_zero2(float (&x)[N][4], float (&y)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int e = 0; e < 4; e++) x[i][e] = y[i][e] = 0.0f;
}

/* Two products that share one loop, Sᵀ and dPᵀ (or S and dP, dV and dK): x += A_x·B_x and y += A_y·B_y over KS
 * k-steps, for MT M-tiles of A (rows a_row0 + 16m of the tiles xa, ya: stride DSA, lane offsets a_lane) and NP pairs of
 * n-blocks of B (the tiles xb, yb: stride DSB, rows b_row0 + 16p through the lane offsets b_off, or TRANS: ldmatrix
 * .trans at the columns b_off[p]), each B fragment serving the MT tiles. NEG_A, NEG_B: A_x's or B_x's signs flipped by
 * `neg` (−Q for a negative scale). The fragments' registers are the caller's (ax, ay: MT each; bx, by), declared where
 * the loop stood: as the helper's own locals they changed the large kernels' register allocation. */
template <typename T, int KS, int MT, int NP, int DSA, int DSB, bool TRANS, bool NEG_A, bool NEG_B>
static __device__ __forceinline__ void fc_bwd_mma2(float (*x)[2 * NP][4], float (*y)[2 * NP][4], uint32_t (*ax)[4],
                                                   uint32_t (*ay)[4], uint32_t bx[4], uint32_t by[4], uint32_t xa,
                                                   uint32_t ya, const uint32_t a_lane[4], int a_row0, uint32_t xb,
                                                   uint32_t yb, const uint32_t *b_off, int b_row0, uint32_t neg) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
#pragma unroll
    for (int m = 0; m < MT; m++) {
      fc_ldmatrix_x4(ax[m], fc_frag_addr<DSA>(xa, a_lane, a_row0 + 16 * m, kk));
      fc_ldmatrix_x4(ay[m], fc_frag_addr<DSA>(ya, a_lane, a_row0 + 16 * m, kk));
    }
    if constexpr (NEG_A) {
#pragma unroll
      for (int m = 0; m < MT; m++)
#pragma unroll
        for (int e = 0; e < 4; e++) ax[m][e] ^= neg;
    }
#pragma unroll
    for (int p = 0; p < NP; p++) {
      if constexpr (TRANS) {
        fc_ldmatrix_x4_trans(bx, fc_frag_addr_at<DSB>(xb, b_off[p], 16 * kk));
        fc_ldmatrix_x4_trans(by, fc_frag_addr_at<DSB>(yb, b_off[p], 16 * kk));
      } else {
        fc_ldmatrix_x4(bx, fc_frag_addr<DSB>(xb, b_off, b_row0 + 16 * p, kk));
        fc_ldmatrix_x4(by, fc_frag_addr<DSB>(yb, b_off, b_row0 + 16 * p, kk));
      }
#pragma unroll
      for (int m = 0; m < MT; m++) {
        if constexpr (NEG_B) {
          fc_mma<T>(x[m][2 * p], ax[m], bx[0] ^ neg, bx[1] ^ neg);
          fc_mma<T>(x[m][2 * p + 1], ax[m], bx[2] ^ neg, bx[3] ^ neg);
        } else {
          fc_mma<T>(x[m][2 * p], ax[m], bx[0], bx[1]);
          fc_mma<T>(x[m][2 * p + 1], ax[m], bx[2], bx[3]);
        }
        fc_mma<T>(y[m][2 * p], ay[m], by[0], by[1]);
        fc_mma<T>(y[m][2 * p + 1], ay[m], by[2], by[3]);
      }
    }
  }
}

/* One query block of one head for dkdv: Q_i and dO_i tiles (cp.async; d and dv columns: Q's and dO's head dims) and the
 * 16-byte-aligned padded lse2, D rows (always present: the buffers are padded to whole blocks). */
template <int BR, int D, int NT>
static __device__ __forceinline__ void fc_bwd_load_q(uint16_t *sQ, uint16_t *sdO, float *sL, float *sD,
                                                     const uint16_t *q, const uint16_t *dout, const float *lse2,
                                                     const float *dsum, int64_t q_seq, int64_t do_seq, int64_t q_ss,
                                                     int64_t do_ss, int64_t q_sh, int64_t do_sh, int hh, int q0, int sq,
                                                     int d, int dv, int64_t total_pad, int64_t pad0, int tid) {
  const uint16_t *Q = q + q_seq + q0 * q_ss + hh * q_sh, *dO = dout + do_seq + q0 * do_ss + hh * do_sh;
  fc_load_tile<BR, D, NT>(sQ, Q, q_ss, sq - q0, d, tid, Q);
  fc_load_tile<BR, D, NT>(sdO, dO, do_ss, sq - q0, dv, tid, dO);
  const int64_t at = hh * total_pad + pad0 + q0;
  if (tid < BR / 4)
    fc_cp_async16(fc_smem_u32(sL + 4 * tid), lse2 + at + 4 * tid, 16);
  else if (tid < BR / 2)
    fc_cp_async16(fc_smem_u32(sD + 4 * (tid - BR / 4)), dsum + at + 4 * (tid - BR / 4), 16);
}

/* dK_j, dV_j of key block k0 of sequence s (batch entry b, kv head hk) from their staged tiles sdK, sdV (BC rows of
 * stride DS) to a.dk, a.dv, as whole 16-byte chunks of rows where the head dim has them (a head dim's last part chunk
 * element by element), rows past the sequence left: every dK/dV kernel's last step. DV_COLS: dV's chunks with V's own
 * head dim. */
template <int BC, int D, int DS, int NT, bool DV_COLS = false>
static __device__ __forceinline__ void fc_bwd_store_dkdv(const fc_mma_bwd_args &a, const fc_bwd_seq &s, int64_t b,
                                                         int hk, int k0, uint16_t *sdK, uint16_t *sdV, int tid) {
  uint16_t *dK = a.dk + b * a.dk_sb + (s.k_start + k0) * a.dk_ss + (int64_t)hk * a.dk_sh;
  uint16_t *dV = a.dv + b * a.dv_sb + (s.k_start + k0) * a.dv_ss + (int64_t)hk * a.dv_sh;
  for (int idx = tid; idx < BC * (D / 8); idx += NT) {
    const int r = idx / (D / 8), c = idx % (D / 8), cols = min(a.head_dim - 8 * c, 8);
    if constexpr (DV_COLS) { /* dK's chunk and dV's each with its own columns */
      if (k0 + r >= s.sk) continue;
      const int cols_v = min(a.head_dim_v - 8 * c, 8);
      const uint16_t *fk = sdK + fc_tile_off<DS>(r, c), *fv = sdV + fc_tile_off<DS>(r, c);
      uint16_t *tk = dK + (int64_t)r * a.dk_ss + 8 * c, *tv = dV + (int64_t)r * a.dv_ss + 8 * c;
      if (cols == 8)
        *(uint4 *)tk = *(const uint4 *)fk;
      else
        for (int x = 0; x < cols; x++) tk[x] = fk[x];
      if (cols_v == 8)
        *(uint4 *)tv = *(const uint4 *)fv;
      else
        for (int x = 0; x < cols_v; x++) tv[x] = fv[x];
      continue;
    }
    if (k0 + r >= s.sk || cols <= 0) continue;
    const uint16_t *fk = sdK + fc_tile_off<DS>(r, c), *fv = sdV + fc_tile_off<DS>(r, c);
    uint16_t *tk = dK + (int64_t)r * a.dk_ss + 8 * c, *tv = dV + (int64_t)r * a.dv_ss + 8 * c;
    if (cols == 8) {
      *(uint4 *)tk = *(const uint4 *)fk;
      *(uint4 *)tv = *(const uint4 *)fv;
    } else {
      for (int x = 0; x < cols; x++) tk[x] = fk[x], tv[x] = fv[x];
    }
  }
}

#endif /* FLASHC_CUDA_MMA_BWD_COMMON_CUH */
