/* hopper/bwd.cu — cuda-hopper backward: FlashAttention-3's backward on H100/H200 (sm_90a) with TMA, wgmma and
 * warp specialisation (docs/hopper.md, "The backward"). Verified on an H100 with tools/hopper/check_bwd.py.
 *
 * With P = softmax(scale·Q·Kᵀ) recomputed from the forward's lse, and D = rowsum(dO∘O):
 *   dV = Pᵀ·dO      dP = dO·Vᵀ      dS = P∘(dP − D)      dK = scale·dSᵀ·Q      dQ = scale·dS·K
 *
 * Kernels, in order:
 *   1. prep (common/bwd_rows.cuh): D and lse2 = lse·log2(e) per query row, padded per sequence;
 *   2. dkdv: one CTA per key block K_j, V_j (Bc = 128 keys) of one kv head of one sequence; 3 warpgroups:
 *        warpgroup 0, producer (24 registers): one thread loads K_j, V_j once and then, into a ring of STAGES
 *          stages, Q_i, dO_i (TMA, Br = 64 rows; 128 in the second version at D = 64) and lse2_i, D_i (bulk
 *          copies) of every (query head of the GQA group, query block i) that sees the key block, in order;
 *        warpgroups 1, 2, consumers (240 registers): keys 64·c .. 64·c + 63 of K_j each; per query block:
 *          Sᵀ = K_j·Q_iᵀ,  dPᵀ = V_j·dO_iᵀ                       wgmma m64nBrk16, all operands in shared memory
 *          Pᵀ = 2^(c·Sᵀ − lse2_i),  dSᵀ = Pᵀ∘(dPᵀ − D_i)         registers (c = scale·log2 e), masked
 *          dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i                    wgmma m64nDk16, Pᵀ/dSᵀ from registers
 *          dQ_i += dS·K_j                                       dSᵀ → shared memory; a 64 × 64 fp32 product per
 *                                                               warpgroup over all 128 keys (D = 128: columns
 *                                                               64·c ..; D = 64, Br = 128: rows 64·c ..), both
 *                                                               operands MN-major
 *        dK_j = scale·dK_j, dV_j at the end: through the free Q/dO ring, stored as 16-byte chunks (fc_hpb_store_dkdv);
 *   3. convert (common/bwd_rows.cuh): dQ = scale·(the fp32 sum) → 16 bits.
 * The dK/dV kernels (fc_hpb_plan chooses; docs/hopper.md, "The backward"):
 *   fc_hopper_bwd_kernel (hopper/bwd_kernel.cuh), D = 64 and 128: each warpgroup's wgmma groups ordered so that its
 *     CUDA-core work runs beside its own tensor work (FlashAttention-3's order), each block's dQ issued a block later
 *     (LAG: pairwise barriers of the two warpgroups instead of one of both per block), the dQ product into a
 *     shared-memory tile and one bulk reduce-add per tile into a blocked fp32 sum;
 *   fc_hopper_bwd_det_kernel (hopper/bwd_launch.cuh), deterministic mode (bit-identical gradients run to run),
 *     D = 64 and 128: every wgmma group waited for as soon as it is issued; dQ split by columns, added with
 *     red.global.add in a fixed order, key block by key block, warpgroup 0 then 1, through a ticket per (query head,
 *     query block) in global memory (fc_flag_wait); dK, dV are sums in registers in a fixed order anyway;
 *   fc_hopper_bwd_d256_kernel (hopper/bwd_d256.cuh), head dims 129 .. 256: Bc = 64 keys per CTA, Sᵀ and dPᵀ one
 *     consumer warpgroup each, dK/dV/dQ split by head-dim columns, Pᵀ and dSᵀ through shared memory, with the same
 *     prep, blocked dQ sum (w = 64) and convert.
 *
 * Shared memory of fc_hopper_bwd_det_kernel (tiles in 64-column halves of 128-byte rows, 128-byte swizzle, 1024-byte
 * aligned):
 *   sK, sV [D/64][Bc][64]                    K_j, V_j (A of Sᵀ, dPᵀ; K_j also B of dQ, MN-major)
 *   sQ, sdO [STAGES][D/64][Br][64]           Q_i, dO_i ring (B of Sᵀ, dPᵀ K-major; B of dK, dV MN-major)
 *   sdS [Bc][64]                             dSᵀ, each consumer's 64 key rows (A of dQ, MN-major)
 *   sLD [STAGES][2][Br] fp32                 lse2_i, D_i
 *   mbarriers: kv_full, full[STAGES], empty[STAGES]
 * The second version adds a second sdS buffer and sdQ [2][64][64] fp32 (each consumer's dQ product, bank-swizzled:
 * fc_bwd_dq_blocked_index). The experiments that lost (other dQ paths and block heights, the next block's Sᵀ issued
 * early, a ping-pong of the warpgroups, a persistent kernel, other D = 256 orders) are rows of docs/experiments.md;
 * their code is at commit d79fa1c. The kernels, their device helpers and their launch are hopper/bwd_launch.cuh's;
 * this file holds the plan, the workspace, the entry points and the plain kernels' instantiations (the feature forms':
 * hopper/bwd_score_mod.cu, hopper/bwd_bias.cu, hopper/bwd_dropout.cu). */
#include "hopper/bwd_launch.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- host ------------------------------------------------------------------------------------------------ */
/* Dynamic shared memory of one CTA of fc_hopper_bwd_det_kernel (red.global.add dQ): the tiles, lse2/D rows, barriers,
 * and 1024 bytes of slack for the alignment. D = 128, 2 stages: 64 + 64 + 16 + 1 KB + … = 146 KB; D = 64, 3 stages:
 * 32 + 48 + 16 + … = 98 KB. */
static size_t fc_hpb_smem_bytes(int d, int stages) {
  return (size_t)2 * FC_HPB_BC * d * 2 + (size_t)stages * 2 * FC_HPB_BR * d * 2 + (size_t)FC_HPB_BC * FC_HPB_BR * 2 +
         (size_t)stages * 2 * FC_HPB_BR * 4 + 8 * (1 + 2 * stages) + 1024;
}

/* The second version (hopper/bwd_kernel.cuh), 2 stages: sK, sV, the stages, sdS twice, sdQ 2 × 16 KB, lse2/D rows,
 * barriers and the alignment slack. D = 128 (Br = 64): 198696 bytes. D = 64 (Br = 128): 32 + 64 + 64 + 32 KB + 2 KB
 * + 40 + 1024 = 199720 bytes (3 stages would need 233528, past the 232448 allowed). */
static size_t fc_hpb_lag_smem_bytes(int d) {
  const size_t br = d == 64 ? 128 : FC_HPB_BR, stages = 2;
  return 2 * FC_HPB_BC * (size_t)d * 2 + stages * 2 * br * d * 2 + 2 * FC_HPB_BC * br * 2 +
         2 * FC_BWD_DQ_TILE * (size_t)64 * 4 + stages * 2 * br * 4 + 8 * (1 + 2 * stages) + 1024;
}

/* The head dim a call's backward runs at: the larger of Q/K's and V's (hopper_supports' pairs: 192/128 and 64/256 at
 * D = 256, 128/64 and 64/128 at D = 128), the smaller one's columns zeros; dV is stored for head_dim_v columns only.
 * 192/128 (head_dim 129..192, head_dim_v 65..128) runs the D = 256 kernel on the halves it has (FC_HPB_D192_128): in
 * all of D = 256's it did 4/3 of Sᵀ's, dQ's and dK's work and twice dPᵀ's and dV's. */
static int64_t fc_hpb_dim(const fc_problem *p) { return p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v; }

/* The one choice of kernel and tile per call (measured on the H100, bf16; the losers' code is at d79fa1c,
 * docs/experiments.md has their rows). Grid: one CTA per (key block of Bc = 128 keys; 64 at D = 256, kv head part,
 * sequence), fc_hpb_bc. */
static fc_hpb_plan_t fc_hpb_plan(const fc_problem *p) {
  fc_hpb_plan_t pl;
  const int64_t dim = fc_hpb_dim(p);
  if (dim > 128) {
    /* EDV: +0.9..2.0 % over WHOLE (dV after barrier B), which ran +0.9..5.9 % over the split products at N = 32
     * (1.0–1.26x cuDNN), those without the next block's Sᵀ issued early 0.88–0.99x
     * (bench/results/configs/hopper-bwd-d256-edv-2026-11-24.txt, hopper-bwd-d256.txt). Not deterministic
     * (fc_hopper_bwd_supports refuses it). */
    const bool d192 = p->head_dim <= 192 && p->head_dim_v <= 128; /* the pair 192/128 (fc_hpb_dim > 128) */
    pl.kernel = d192 ? FC_HPB_D192_128 : FC_HPB_D256, pl.br = FC_HPB_BR, pl.dq_tile_w = FC_HPB256_DQ_W;
    pl.smem = d192 ? fc_hpb256_smem(3, 2) : fc_hpb256_smem(4, 4);
    pl.name = "launch of fc_hopper_bwd_d256_kernel";
  } else if (p->deterministic) {
    /* The first kernel: dQ split by columns between the warpgroups, added with red.global.add in a fixed order
     * through the tickets (bulk adds have no order to fix; the split ran 1.20–1.31x every warpgroup adding its own
     * keys' share at D = 128, bench/results/configs/hopper-bwd-dq-split-h100.txt). */
    const int d = dim > 64 ? 128 : 64;
    pl.kernel = d == 128 ? FC_HPB_DET_D128 : FC_HPB_DET_D64, pl.br = FC_HPB_BR, pl.dq_tile_w = 0;
    pl.smem = fc_hpb_smem_bytes(d, d == 128 ? 2 : 3), pl.name = "launch of fc_hopper_bwd_det_kernel";
  } else if (dim > 64) {
    /* The second version, LAG and BIAS: +0.5..1.6 % over LAG + BIAS with the next block's Sᵀ issued behind dK
     * (NEXT; it spills 8 bytes), which ran +2.9..6.6 % over NEXT alone, NEXT +3.7..9.4 % over the first kernel with
     * bulk dQ (bench/results/configs/hopper-bwd-lag-d64-2026-11-24.txt part 6, hopper-bwd-lag-bias-2026-11-24.txt,
     * hopper-bwd-v2.txt); its persistent form (one CTA per SM) 0.95–1.04x (hopper-bwd-persist.txt). */
    pl.kernel = FC_HPB_D128, pl.br = FC_HPB_BR, pl.dq_tile_w = 64, pl.smem = fc_hpb_lag_smem_bytes(128);
    pl.name = "launch of fc_hopper_bwd_kernel";
  } else {
    /* The second version at Br = 128 with LAG: +6.8..13.1 % over it without, LAG + NEXT only +3.9..8.0 %
     * (hopper-bwd-lag-d64-2026-11-24.txt); without LAG the NEXT, EARLY_S and EARLY_DV orders within ±2 % of the plain
     * one (hopper-bwd-v2-d64.txt); Br = 128 ran 1.04–1.13x Br = 64 (hopper-bwd-br128.txt). */
    pl.kernel = FC_HPB_D64, pl.br = 128, pl.dq_tile_w = 32, pl.smem = fc_hpb_lag_smem_bytes(64);
    pl.name = "launch of fc_hopper_bwd_kernel";
  }
  return pl;
}

/* prep (D, lse2 rows), the plan's dK/dV kernel in the call's form (hopper/bwd_launch.cuh, fc_hpb_launch), convert
 * (dQ to 16 bits). */
template <typename T>
static flashc_status fc_hpb_run(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                const fc_hopper_bwd_args *a, const fc_bwd_rows_args *rows, int grid) {
  FC_CHECK(fc_bwd_rows_prep<T>(p, *rows));
  const bool mod = a->mod.alibi || a->mod.k_out > 0.0f || a->mod.bias, add = a->mod.bias && !a->mod.bias_bool;
  const flashc_status st = p->head_dim_v != p->head_dim ? fc_hpb_launch<T, false>(p, pl, maps, a, grid)
                           : a->mod.drop_on             ? fc_hpb_launch_dropout(p, pl, maps, a, grid)
                           : add                        ? fc_hpb_launch_bias(p, pl, maps, a, grid)
                           : mod                        ? fc_hpb_launch_score_mod(p, pl, maps, a, grid)
                                                        : fc_hpb_launch<T, false>(p, pl, maps, a, grid);
  FC_CHECK(st);
  return fc_bwd_rows_convert<T>(p, rows);
}

static size_t fc_hpb_round256(size_t n) { return (n + 255) / 256 * 256; }

/* Two neighbouring elements of a row can be one aligned 32-bit store. */
static int fc_hpb_vec16(const fc_view *v) {
  return (uintptr_t)v->data % 16 == 0 && v->stride_b % 8 == 0 && v->stride_s % 8 == 0 && v->stride_h % 8 == 0;
}

/* The keys per CTA (Bc) of the dK/dV kernel that runs this head dim. */
static int fc_hpb_bc(int64_t head_dim) { return head_dim > 128 ? (int)FC_HPB256_BC : (int)FC_HPB_BC; }

flashc_status fc_hopper_bwd_supports(const fc_problem *p) {
  if (p->heads_kv > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_kv %lld exceeds 2^31-1 on backend cuda-hopper",
                    (long long)p->heads_kv);
  if (p->head_dim > 128 && p->deterministic) /* the D = 256 kernel adds dQ in bulk, in no fixed order */
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "deterministic backward at head_dim %lld (> 128) is not built on backend cuda-hopper",
                    (long long)p->head_dim);
  if (p->head_dim_v > 128 && p->deterministic) /* 64/256 runs the D = 256 kernel too */
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "deterministic backward at head_dim_v %lld (> 128) is not built on backend cuda-hopper",
                    (long long)p->head_dim_v);
  /* Dropout has kernels at D = 64, 128 without a float attn_mask (fc_hpb_kernel): `auto` runs the rest on cuda-mma */
  if (p->dropout_p > 0.0f && p->head_dim > 128)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: dropout_p %g at head_dim %lld (> 128) is not supported on backend cuda-hopper",
                    (double)p->dropout_p, (long long)p->head_dim);
  if (p->dropout_p > 0.0f && p->attn_mask && !p->attn_mask_is_bool)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: dropout_p %g with a float attn_mask is not supported on backend cuda-hopper",
                    (double)p->dropout_p);
  /* attn_mask's gradient: every kernel's ADD form writes dS (fc_hpb_dbias_put), not through softcap's factor, whose
   * dS they form (`auto` runs such a call on cuda-mma) */
  if (p->dbias && p->softcap > 0.0f)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "flashc_backward: dbias (the gradient of a float attn_mask) with softcap "
                                            "is not supported on backend cuda-hopper");
  int grid = 0;
  FC_CHECK(
      fc_mma_grid("flashc_backward", fc_cdiv(p->seqlen_k, fc_hpb_bc(fc_hpb_dim(p))), p->heads_kv, p->batch, &grid));
  FC_CHECK(fc_hp_check_view(p, &p->dout, true, "dout"));
  return FLASHC_OK;
}

flashc_status fc_hopper_backward(const fc_problem *p) {
  const fc_hpb_plan_t plan = fc_hpb_plan(p);
  fc_bwd_rows_args rows;
  memset(&rows, 0, sizeof rows);
  int64_t *cu_pad_host;
  FC_CHECK(fc_bwd_rows_pad(p, &cu_pad_host, &rows.sq_pad, &rows.total_pad));
  const int D = fc_hp_d_tile(fc_hpb_dim(p));
  const int dq_tile_w = plan.dq_tile_w;
  /* seqused: the sequences' own tensor maps (fc_hp_seq_maps) right after the offsets, where the kernels' int reaches
   * them from cu_q (the workspace's start: fc_mma_upload_cu_seqlens) */
  const size_t offs_bytes = fc_mma_cu_seqlens_bytes(p), maps_bytes = fc_hpb_round256(fc_hp_seq_maps_bytes(p));
  const size_t cu_bytes = offs_bytes + maps_bytes;
  /* the padded offsets: copied from the host's, or written on the device (device cu_seqlens) */
  const size_t pad_bytes = p->cu_seqlens_q ? fc_hpb_round256((size_t)(p->batch + 1) * sizeof(int64_t)) : 0;
  const size_t row_bytes = fc_hpb_round256((size_t)(p->heads_q * rows.total_pad) * sizeof(float));
  /* The dQ sum: [total_q][hq][D] (deterministic), or blocked over the padded rows (bulk adds) */
  const int64_t dq_rows = dq_tile_w > 0 ? p->heads_q * rows.total_pad : p->total_q * p->heads_q;
  const size_t dq_bytes = fc_hpb_round256((size_t)(dq_rows * D) * sizeof(float));
  const size_t ticket_bytes = p->deterministic ? (size_t)(p->heads_q * rows.total_pad / FC_HPB_BR) * sizeof(int) : 0;
  const int n_blocks = (int)fc_cdiv(p->seqlen_k, fc_hpb_bc(fc_hpb_dim(p)));
  /* one dK/dV CTA per SM (its shared memory); no split with V's head dim of its own (common/gqa.cu's parts have Q/K's
   * head dim), as on cuda-mma */
  const int split = p->head_dim_v != p->head_dim ? 1 : fc_gqa_split(p, n_blocks, 1, 4);
  const size_t gqa_at = cu_bytes + pad_bytes + 2 * row_bytes + dq_bytes + fc_hpb_round256(ticket_bytes);
  /* A boolean attn_mask's tiles at the dK/dV kernel's blocks (Br queries × Bc keys), after the GQA parts */
  const size_t tiles_at = gqa_at + fc_hpb_round256(fc_gqa_workspace_bytes(p, split));
  const size_t tiles_bytes = fc_mask_tiles_bytes(p, plan.br, fc_hpb_bc(fc_hpb_dim(p)));
  /* dbias's fp32 sums (where it sums a dim: mma/bwd_score_mod.cu), after the tiles */
  const size_t dbias_at = tiles_at + fc_hpb_round256(tiles_bytes), dbias_bytes = fc_mma_dbias_bytes(p);
  char *ws = NULL;
  FC_CHECK(fc_device_workspace(p, dbias_at + dbias_bytes, (void **)&ws));
  const cudaStream_t stream = fc_stream(p);
  fc_mma_seqs seqs;
  int64_t *pad_on_device = p->cu_seqlens_device ? (int64_t *)(ws + cu_bytes) : NULL;
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, pad_on_device, &seqs));
  const int64_t *cu_pad = pad_on_device;
  if (cu_pad_host) {
    FC_CUDA_CHECK(cudaMemcpyAsync(ws + cu_bytes, cu_pad_host, (size_t)(p->batch + 1) * sizeof(int64_t),
                                  cudaMemcpyHostToDevice, stream));
    cu_pad = (const int64_t *)(ws + cu_bytes);
  }
  float *lse2 = (float *)(ws + cu_bytes + pad_bytes), *dsum = (float *)(ws + cu_bytes + pad_bytes + row_bytes);
  float *dq_accum = (float *)(ws + cu_bytes + pad_bytes + 2 * row_bytes);
  const bool blocked = dq_tile_w > 0; /* then prep zeroes the sum (rows.dq_zero) */
  if (!blocked) FC_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, dq_bytes, stream));
  int *dq_ticket = NULL;
  if (ticket_bytes) {
    dq_ticket = (int *)(ws + cu_bytes + pad_bytes + 2 * row_bytes + dq_bytes);
    FC_CUDA_CHECK(cudaMemsetAsync(dq_ticket, 0, ticket_bytes, stream));
  }

  rows.o = (const uint16_t *)p->o.data, rows.dout = (const uint16_t *)p->dout.data;
  rows.dq = (uint16_t *)p->dq.data;
  rows.o_sb = p->o.stride_b, rows.o_ss = p->o.stride_s, rows.o_sh = p->o.stride_h;
  rows.do_sb = p->dout.stride_b, rows.do_ss = p->dout.stride_s, rows.do_sh = p->dout.stride_h;
  rows.dq_sb = p->dq.stride_b, rows.dq_ss = p->dq.stride_s, rows.dq_sh = p->dq.stride_h;
  rows.lse = p->lse, rows.lse2 = lse2, rows.dsum = dsum;
  rows.dq_accum = dq_accum, rows.dq_ld = D, rows.dq_tile_w = dq_tile_w;
  rows.dq_zero = blocked ? dq_accum : NULL;
  rows.cu_q = seqs.cu_q, rows.end_q = seqs.end_q, rows.cu_pad = cu_pad;
  rows.seqlen_q = (int)p->seqlen_q, rows.total_q = p->total_q;
  rows.heads_q = (int)p->heads_q, rows.head_dim = (int)p->head_dim;
  rows.scale = p->scale;

  fc_hopper_bwd_args a;
  memset(&a, 0, sizeof a);
  fc_view dk = p->dk, dv = p->dv; /* split GQA groups: each part's dK/dV, summed by fc_gqa_reduce */
  if (split > 1) fc_gqa_part_views(p, split, ws + gqa_at, &dk, &dv);
  a.dk = (uint16_t *)dk.data, a.dv = (uint16_t *)dv.data;
  a.dk_sb = dk.stride_b, a.dk_ss = dk.stride_s, a.dk_sh = dk.stride_h;
  a.dv_sb = dv.stride_b, a.dv_ss = dv.stride_s, a.dv_sh = dv.stride_h;
  a.lse2 = lse2, a.dsum = dsum, a.dq_accum = dq_accum, a.dq_ticket = dq_ticket;
  a.cu_q = seqs.cu_q, a.cu_k = seqs.cu_k, a.end_q = seqs.end_q, a.end_k = seqs.end_k, a.cu_pad = cu_pad;
  a.seqlen_q = (int)p->seqlen_q, a.seqlen_k = (int)p->seqlen_k;
  a.sq_pad = rows.sq_pad, a.total_pad = rows.total_pad;
  a.heads_q = (int)p->heads_q, a.heads_kv = (int)p->heads_kv * split;
  a.group = (int)(p->heads_q / p->heads_kv), a.kv_split = split;
  a.head_dim = (int)p->head_dim, a.head_dim_v = (int)p->head_dim_v;
  a.n_blocks = n_blocks;
  a.scale = p->scale;
  a.scale_log2 = p->scale * 1.4426950408889634f;
  a.window_left = p->window_left, a.window_right = p->window_right, a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  a.dk_vec = fc_hpb_vec16(&dk), a.dv_vec = fc_hpb_vec16(&dv);
  fc_score_mod_of(p, &a.mod);
  if (tiles_bytes) FC_CHECK(fc_mask_tiles_build(p, plan.br, fc_hpb_bc(fc_hpb_dim(p)), ws + tiles_at, &a.mod.tiles));

  int grid = 0;
  FC_CHECK(fc_mma_grid("flashc_backward", a.n_blocks, a.heads_kv, p->batch, &grid));
  a.n_pairs = (int)(p->batch * a.heads_kv); /* fits: fc_mma_grid refused a grid past 2^31 − 1 CTAs */
  FC_CHECK(fc_tail_from(p, a.n_blocks, a.n_pairs, NULL, 0, 0, &a.tail_from)); /* one CTA per SM */
  CUtensorMap maps[4];
  FC_CHECK(fc_hp_seq_maps(p, plan.br, fc_hpb_bc(p->head_dim), "flashc_backward", ws, offs_bytes, &a.seq_maps_at));
  FC_CHECK(fc_hp_encode_box(p, &p->q, true, "q", plan.br, "flashc_backward", &maps[0]));
  FC_CHECK(fc_hp_encode_box(p, &p->k, false, "k", fc_hpb_bc(fc_hpb_dim(p)), "flashc_backward", &maps[1]));
  FC_CHECK(fc_hp_encode_box(p, &p->v, false, "v", fc_hpb_bc(fc_hpb_dim(p)), "flashc_backward", &maps[2]));
  FC_CHECK(fc_hp_encode_box(p, &p->dout, true, "dout", plan.br, "flashc_backward", &maps[3]));
  FC_CHECK(fc_mma_dbias_begin(p, &a.mod, dbias_bytes ? ws + dbias_at : NULL));
  if (p->dtype == FLASHC_F16)
    FC_CHECK(fc_hpb_run<__half>(p, &plan, maps, &a, &rows, grid));
  else
    FC_CHECK(fc_hpb_run<__nv_bfloat16>(p, &plan, maps, &a, &rows, grid));
  FC_CHECK(fc_mma_dbias_finish(p, &a.mod));
  return split > 1 ? fc_gqa_reduce(p, split, &dk, &dv) : FLASHC_OK;
}

#if FC_HP_TRACE
/* fc_hopper_bwd_trace_reset, fc_hopper_bwd_trace_read (tools/hopper/trace_bwd.py): the buffer of this file's kernels,
 * the plain ones; the feature forms' kernels (bwd_score_mod.cu, bwd_bias.cu, bwd_dropout.cu) mark their own file's
 * copy of fc_hp_trace_buf, which nothing reads */
FC_HP_TRACE_READERS(fc_hopper_bwd)
#endif
