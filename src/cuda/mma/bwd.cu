/* mma/bwd.cu — cuda-mma backward: FlashAttention-2's backward on tensor cores (mma.sync, sm_80+).
 *
 * With P = softmax(scale·Q·Kᵀ) recomputed from the forward's lse, and D = rowsum(dO∘O):
 *   dV = Pᵀ·dO      dP = dO·Vᵀ      dS = P∘(dP − D)      dK = scale·dSᵀ·Q      dQ = scale·dS·K
 *
 * Kernels, in order:
 *   1. prep:    per query row, D = rowsum(dO∘O) and lse·log2(e) into fp32 buffers padded per sequence to
 *               128 rows (0 and +inf on padding and on rows that see no key, so that their P is 0).
 *   2. dkdv:    one CTA per key block K_j, V_j (Bc keys) and kv head. It walks the query blocks Q_i (Br rows)
 *               that see the block, for every query head of its GQA group, and keeps dK_j, dV_j in registers:
 *                 Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ            warps: 16 keys × Br/WN queries
 *                 Pᵀ = 2^(c·Sᵀ − lse·log2 e), dSᵀ = Pᵀ∘(dPᵀ − D)   → shared memory, 16-bit
 *                 dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i           warps: 16 keys × D/WN columns
 *                 dQ_i += dS·K_j into an fp32 buffer          warps: 16 queries × D/WQ columns; red.v4
 *               This file's kernel has the small tiles of devices with less shared memory (sm_86/89, and d256
 *               on sm_80); elsewhere the fa2 family (mma/bwd_kernel.cuh) runs the same steps with FlashAttention-2's
 *               tiles. fc_mma_bwd_plan_of picks the kernel.
 *   3. convert: dQ = scale·(fp32 buffer) → 16-bit.
 * Deterministic mode (bit-identical gradients run to run) replaces the atomic dQ of 2 and 3 by
 *   3'. dq:     one CTA per query block walks the key blocks in order, as the forward does: S, dP = dO·V_jᵀ,
 *               dS, dQ += dS·K_j, all in registers. More work (S and dP are computed twice), no atomics.
 * The fp32 buffers are O(b·h·s) (lse, D) and O(b·h·s·d) (dQ): nothing grows with s².
 *
 * Shared memory of dkdv (16-bit, XOR-swizzled rows as in mma/tile.cuh):
 *   sK, sV [Bc][DS]           the CTA's key block, loaded once: A of Sᵀ and dPᵀ, B of dS·K_j
 *   sQ, sdO [QSTAGES][Br][DS] the query block, double-buffered by cp.async where shared memory allows
 *   sP, sdS [Bc][Br]          Pᵀ and dSᵀ: A of dV and dK; dSᵀ read with ldmatrix.trans is dS, A of dQ
 *   sL, sD [QSTAGES][Br] fp32 lse·log2(e) and D of the query block */
#include "mma/bwd_launch.cuh"

/* ---- the plan (its tiles: mma/bwd_launch.cuh) ---------------------------------------------------------- */
static flashc_status fc_mma_bwd_plan_of(const fc_problem *p, fc_mma_bwd_plan *pl) {
  /* V's head dim different from Q/K's: the kernels of the larger built with DV_COLS, each tensor's other columns zeros
   * (mma/bwd_common.cuh, head_dim_v); mma/fwd.cu's fc_mma_dv_pair has refused the pairs the forward has no kernel
   * for, so d is 128 or 192 (fc_mma_bwd_dv_dim). */
  const int d = fc_mma_compiled_dim(p->head_dim_v > p->head_dim ? p->head_dim_v : p->head_dim);
  pl->dim = -1;
  for (int i = 0; i < FC_MMA_NDIMS; i++)
    if (fc_mma_dims[i] == d) pl->dim = i;
  if (pl->dim < 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds 256 on backend cuda-mma", (long long)p->head_dim);
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  /* fa2p, fa2pb start Sᵀ's accumulators at −lse2/c (c = |scale|·log2 e), which needs a finite 1/c, and have no
   * deterministic dQ: fa2 runs those calls. fa2p over fa2: 0.98–1.45×, median 1.09× (H100, 72 cells,
   * configs/mma-bwd-fa2p-configs.csv). On sm_90 fa2pb: 1.12–1.23× fa2p at d64/d128 (configs/mma-bwd-fa2pb.txt),
   * 1.29–1.50× at d256 with one Q/dO buffer (mma-bwd-fa2pb-d256.txt). fa2p with 4 warps, 64 × 64 tiles and 2 CTAs
   * per SM (fa2x2): 0.82–1.16× fa2p (mma-bwd-fa2p-configs.csv). */
  /* Those fa2 calls take the deterministic dQ whether asked or not: calls with |scale| < 1e-30 are too rare to build
   * fa2's atomic-dQ kernels for (28 in each image). */
  pl->det_dq = p->deterministic || !(fabsf(p->scale) >= 1e-30f);
  if (pl->det_dq)
    pl->kernel = FC_MMA_BWD_FA2;
  else
    pl->kernel = fc_mma_bwd_in_image(props.code_sm, FC_MMA_BWD_FA2PB) ? FC_MMA_BWD_FA2PB : FC_MMA_BWD_FA2P;
  const fc_mma_bwd_fa2_tile t = fc_mma_bwd_fa2_tiles[pl->dim];
  const bool bulk = pl->kernel == FC_MMA_BWD_FA2PB;
  size_t bytes = fc_bwd_fa2_smem(d, t.br, t.bc, fc_mma_bwd_fa2_qstages(d, t.br, t.bc, bulk), bulk);
  /* Softcap, ALiBi, dropout and attn_mask: the fa2 family and the dQ pass only (SCORE_MOD, mma/score_mod.cuh); base
   * has none. */
  const bool mod = p->softcap > 0.0f || p->alibi_slopes != NULL || p->dropout_p > 0.0f || p->attn_mask != NULL;
  if (bytes > props.smem_per_block_optin && fc_mma_bwd_base_tiles[pl->dim].br > 0 &&
      fc_mma_bwd_in_image(props.code_sm, FC_MMA_BWD_BASE) && !mod) {
    pl->kernel = FC_MMA_BWD_BASE;
    bytes = fc_mma_bwd_base_smem(d, fc_mma_bwd_base_tiles[pl->dim]);
  }
  if (pl->det_dq) { /* the dQ pass runs after dK/dV: refused before anything runs */
    const size_t dq = fc_mma_bwd_dq_smem(d, fc_mma_bwd_dq_bc[pl->dim]);
    if (dq > bytes) bytes = dq;
  }
  if (bytes > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: head_dim %d on backend cuda-mma needs %zu bytes of shared memory per block%s%s; "
                    "device %d (sm_%d) allows %zu",
                    d, bytes, pl->det_dq ? " (with the deterministic dQ pass)" : "",
                    mod ? " (with softcap, ALiBi, dropout or attn_mask)" : "", props.device, props.sm,
                    props.smem_per_block_optin);
  pl->dq_tile_w = pl->kernel == FC_MMA_BWD_FA2PB ? FC_MMA_DQ_TILE_W : 0;
  return FLASHC_OK;
}

flashc_status fc_mma_bwd_supports(const fc_problem *p) {
  fc_mma_bwd_plan pl;
  return fc_mma_bwd_plan_of(p, &pl);
}

static size_t fc_round256(size_t n) { return (n + 255) / 256 * 256; }

flashc_status fc_mma_backward(const fc_problem *p) {
  fc_mma_bwd_plan pl;
  FC_CHECK(fc_mma_bwd_plan_of(p, &pl));
  fc_mma_bwd_args a;
  memset(&a, 0, sizeof a);
  /* Padded row buffers: each sequence's rows rounded up to FC_BWD_PADR, the row passes' FC_BWD_ROWS_PAD. */
  static_assert((int)FC_BWD_PADR == (int)FC_BWD_ROWS_PAD,
                "one padding of the row buffers for the kernels and the row passes");
  int64_t *cu_pad_host;
  FC_CHECK(fc_bwd_rows_pad(p, &cu_pad_host, &a.sq_pad, &a.total_pad));
  const size_t cu_bytes = fc_mma_cu_seqlens_bytes(p);
  /* the padded offsets: copied from the host's, or written on the device (device cu_seqlens) */
  const size_t pad_bytes = p->cu_seqlens_q ? fc_round256((size_t)(p->batch + 1) * sizeof(int64_t)) : 0;
  const size_t row_bytes = fc_round256((size_t)(p->heads_q * a.total_pad) * sizeof(float));
  a.dq_ld = fc_mma_compiled_dim(p->head_dim_v > p->head_dim ? p->head_dim_v : p->head_dim); /* the kernels' D */
  a.dq_tile_w = pl.dq_tile_w;
  /* blocked: every padded row, whole 64-row tiles (the bulk adds cover whole query blocks, padding included) */
  const int64_t dq_rows = a.dq_tile_w ? p->heads_q * a.total_pad : p->total_q * p->heads_q;
  const size_t dq_bytes = pl.det_dq ? 0 : (size_t)(dq_rows * a.dq_ld) * sizeof(float);
  /* GQA: the group split (common/gqa.cu), sized for 64-key blocks and two CTAs per SM; none where V's head dim differs
   * (the parts' workspace has head_dim columns for dK and dV alike) */
  const int split = p->head_dim_v != p->head_dim ? 1 : fc_gqa_split(p, fc_cdiv(p->seqlen_k, 64), 2, 0);
  /* dbias's fp32 sums where it sums a dim (mma/bwd_score_mod.cu), after the GQA parts */
  const size_t gqa_at = cu_bytes + pad_bytes + 2 * row_bytes + fc_round256(dq_bytes);
  const size_t dbias_at = gqa_at + fc_round256(fc_gqa_workspace_bytes(p, split)), dbias_bytes = fc_mma_dbias_bytes(p);
  /* a boolean attn_mask's tiles (mma/bwd_score_mod.cu), last */
  const size_t tiles_at = dbias_at + fc_round256(dbias_bytes), tiles_bytes = fc_mma_bwd_tiles_bytes(p, &pl);
  /* q, k, v, dout, dq, dk, dv whose rows are not on 16 bytes: staged copies (mma/host.cuh), last; dK/dV of split
   * groups go to the parts (whose rows are) and fc_gqa_reduce writes the caller's. o is read by the row pass alone. */
  size_t stage_at = tiles_at + fc_round256(tiles_bytes);
  fc_mma_stage sq, sk, sv, sdo, sdq, sdk = {}, sdv = {};
  fc_mma_stage_plan(p, &p->q, false, p->head_dim, &stage_at, &sq);
  fc_mma_stage_plan(p, &p->k, true, p->head_dim, &stage_at, &sk);
  fc_mma_stage_plan(p, &p->v, true, p->head_dim_v, &stage_at, &sv);
  fc_mma_stage_plan(p, &p->dout, false, p->head_dim_v, &stage_at, &sdo);
  fc_mma_stage_plan(p, &p->dq, false, p->head_dim, &stage_at, &sdq);
  if (split == 1) {
    fc_mma_stage_plan(p, &p->dk, true, p->head_dim, &stage_at, &sdk);
    fc_mma_stage_plan(p, &p->dv, true, p->head_dim_v, &stage_at, &sdv);
  }
  char *ws = NULL;
  FC_CHECK(fc_device_workspace(p, stage_at, (void **)&ws));
  fc_view dk = p->dk, dv = p->dv; /* split GQA groups: each part's dK/dV (rows on 16 bytes), summed by fc_gqa_reduce */
  if (split > 1) {
    fc_gqa_part_views(p, split, ws + gqa_at, &dk, &dv);
    sdk.view = dk, sdk.bytes = 0, sdv.view = dv, sdv.bytes = 0;
  }
  /* the gradients: every row written (those past seqused by api.c afterwards; past a device offset's cut unspecified)
   */
  FC_CHECK(fc_mma_stage_in(p, ws, &sq, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sk, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sv, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sdo, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sdq, false));
  FC_CHECK(fc_mma_stage_in(p, ws, &sdk, false));
  FC_CHECK(fc_mma_stage_in(p, ws, &sdv, false));
  const cudaStream_t stream = fc_stream(p);
  fc_mma_seqs seqs;
  int64_t *pad_on_device = p->cu_seqlens_device ? (int64_t *)(ws + cu_bytes) : NULL;
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, pad_on_device, &seqs));
  a.cu_q = seqs.cu_q, a.cu_k = seqs.cu_k, a.end_q = seqs.end_q, a.end_k = seqs.end_k;
  a.cu_pad = pad_on_device;
  if (cu_pad_host) {
    FC_CUDA_CHECK(cudaMemcpyAsync(ws + cu_bytes, cu_pad_host, (size_t)(p->batch + 1) * sizeof(int64_t),
                                  cudaMemcpyHostToDevice, stream));
    a.cu_pad = (const int64_t *)(ws + cu_bytes);
  }
  a.lse2 = (float *)(ws + cu_bytes + pad_bytes);
  a.dsum = (float *)(ws + cu_bytes + pad_bytes + row_bytes);
  if (dq_bytes) { /* the blocked sum is zeroed by prep (fc_mma_bwd_prep) */
    a.dq_accum = (float *)(ws + cu_bytes + pad_bytes + 2 * row_bytes);
    if (!a.dq_tile_w) FC_CUDA_CHECK(cudaMemsetAsync(a.dq_accum, 0, dq_bytes, stream));
  }
  const fc_view *q = &sq.view, *k = &sk.view, *v = &sv.view, *dout = &sdo.view, *dq = &sdq.view;
  const fc_view *dk_k = &sdk.view, *dv_k = &sdv.view; /* what the kernels write: the parts, a copy, or the caller's */
  a.q = (const uint16_t *)q->data, a.k = (const uint16_t *)k->data, a.v = (const uint16_t *)v->data;
  a.o = (const uint16_t *)p->o.data, a.dout = (const uint16_t *)dout->data;
  a.dq = (uint16_t *)dq->data, a.dk = (uint16_t *)dk_k->data, a.dv = (uint16_t *)dv_k->data;
  a.q_sb = q->stride_b, a.q_ss = q->stride_s, a.q_sh = q->stride_h;
  a.k_sb = k->stride_b, a.k_ss = k->stride_s, a.k_sh = k->stride_h;
  a.v_sb = v->stride_b, a.v_ss = v->stride_s, a.v_sh = v->stride_h;
  a.o_sb = p->o.stride_b, a.o_ss = p->o.stride_s, a.o_sh = p->o.stride_h;
  a.do_sb = dout->stride_b, a.do_ss = dout->stride_s, a.do_sh = dout->stride_h;
  a.dq_sb = dq->stride_b, a.dq_ss = dq->stride_s, a.dq_sh = dq->stride_h;
  a.dk_sb = dk_k->stride_b, a.dk_ss = dk_k->stride_s, a.dk_sh = dk_k->stride_h;
  a.dv_sb = dv_k->stride_b, a.dv_ss = dv_k->stride_s, a.dv_sh = dv_k->stride_h;
  a.lse = p->lse;
  a.seqlen_q = (int)p->seqlen_q, a.seqlen_k = (int)p->seqlen_k;
  a.total_q = p->total_q;
  a.heads_q = (int)p->heads_q, a.heads_kv = (int)p->heads_kv * split;
  a.group = (int)(p->heads_q / p->heads_kv), a.kv_split = split;
  a.head_dim = (int)p->head_dim;
  a.head_dim_v = (int)p->head_dim_v;
  a.scale = p->scale;
  a.scale_log2 = fabsf(p->scale) * 1.4426950408889634f;
  a.negate_q = p->scale < 0.0f;
  a.window_left = p->window_left, a.window_right = p->window_right, a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  /* Softcap, ALiBi, dropout or attn_mask: the plan's kernels built with SCORE_MOD (mma/score_mod.cuh). */
  if (fc_mma_score_mod_of(p, &a.mod)) {
    FC_CHECK(fc_mma_bwd_score_mod(p, &a, &pl, dbias_bytes ? ws + dbias_at : NULL, tiles_bytes ? ws + tiles_at : NULL));
  } else if (p->head_dim_v != p->head_dim) { /* V's own head dim: the kernels built with DV_COLS */
    if (p->dtype == FLASHC_F16)
      FC_CHECK((fc_mma_bwd_dispatch<__half, false, true>(p, &a, &pl)));
    else
      FC_CHECK((fc_mma_bwd_dispatch<__nv_bfloat16, false, true>(p, &a, &pl)));
  } else if (p->dtype == FLASHC_F16) {
    FC_CHECK((fc_mma_bwd_dispatch<__half, false>(p, &a, &pl)));
  } else {
    FC_CHECK((fc_mma_bwd_dispatch<__nv_bfloat16, false>(p, &a, &pl)));
  }
  FC_CHECK(fc_mma_stage_out(p, &sdq));
  if (split > 1) return fc_gqa_reduce(p, split, &dk, &dv);
  FC_CHECK(fc_mma_stage_out(p, &sdk));
  return fc_mma_stage_out(p, &sdv);
}
