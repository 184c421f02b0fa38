/* mma/bwd_common.cuh — what every configuration of cuda-mma's backward shares (mma/bwd_launch.cuh includes it, then
 * the configurations' kernels): the kernels' argument block, one sequence's offsets, the mask test, and the
 * loader of one query block (Q_i, dO_i, lse2_i, D_i) into shared memory. */
#ifndef FLASHC_CUDA_MMA_BWD_COMMON_CUH
#define FLASHC_CUDA_MMA_BWD_COMMON_CUH

#include "common/tail_order.cuh"
#include "common/common.cuh"
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

#endif /* FLASHC_CUDA_MMA_BWD_COMMON_CUH */
