/* hopper/bwd_kernel.cuh — cuda-hopper's dK/dV kernel, second version: the backward's default at head dims ≤ 128 outside
 * deterministic mode (docs/hopper.md, "The D = 128 kernel (LAG + BIAS)" and "The D = 64 kernel"). Included by
 * hopper/bwd_launch.cuh only, after its device helpers (fc_hpb_*), whose names, tile layouts and dQ sum it shares.
 *
 * Same maths, masks, tiles and producer as fc_hopper_bwd_det_kernel (D = 128: Br = 64; D = 64: Br = 128, Bc = 128
 * both); dQ goes through a shared-memory tile and one bulk reduce-add per tile into a blocked fp32 sum, and each
 * consumer warpgroup's wgmma groups are ordered so that its CUDA-core work runs beside its own tensor work instead of
 * between waits for all of it (FlashAttention-3's order). Per block i, with the groups still pending after each step on
 * the right: (BIAS: Sᵀ's and dPᵀ's accumulators set to −lse2_i/c and −D_i; else lse2_i loaded into registers) Sᵀ, dPᵀ
 * issued (two groups); wait 1: Sᵀ done                                               [dPᵀ] Pᵀ = 2^(c·Sᵀ − lse2_i),
 * masked                              beside dPᵀ EARLY_DV: dV_j += Pᵀ·dO_i issued; wait 1: dPᵀ done [dV] else:     wait
 * 0: dPᵀ done                                                                 [] dSᵀ = Pᵀ∘(dPᵀ − D_i), packed EARLY_DV:
 * beside dV else:     dV_j += Pᵀ·dO_i issued                                                           [dV] dSᵀ → sdS[i
 * % 2]; arrive at READY (this warpgroup's rows of block i are in) wait at READY of the other warpgroup's rows of block
 * i − 1 dQ_{i−1} = dS·K_j and dK_j += dSᵀ·Q_i issued                                               [dV, dQ, dK] (D =
 * 128: columns 64·c .. of dQ; D = 64: query rows 64·c .., all 64 columns; all 128 keys) wait 1: dV, dQ done; arrive at
 * FREE (buffer (i − 1) % 2 is read) dQ → sdQ, one bulk reduce-add                               beside dK wait 0: dK
 * done; release the stage                                                         [] D = 128 runs EARLY_DV and BIAS. At
 * D = 64 (Br = 128) EARLY_DV's packed Pᵀ (32 registers), live beside Sᵀ's and dPᵀ's fp32 accumulators (64 + 64) and dK,
 * dV (64), spilled 4 bytes; lse2_i is loaded at the block's start there. LAG, the dQ of block i − 1 issued in block i:
 * the barrier of both warpgroups per block becomes pairwise named barriers (READY: the other's dSᵀ rows of a block are
 * in; FREE: its dQ has read a buffer the other writes next) and the warpgroups drift apart; block 0 is peeled (FIRST),
 * fc_hpb_lag_tail issues the last block's dQ (tests/models/bwd_lag_model.py checks the pairwise barriers,
 * bwd_kernel_model.py the whole kernel's protocol, under random interleavings). sdS is double-buffered: dSᵀ of block i
 * goes to buffer i % 2, whose last readers (block i − 2's dQ wgmmas, issued in block i − 1 by both warpgroups) each
 * arrived at FREE after their wait. The issuing thread waits for the last bulk add's read of its warpgroup's sdQ tile
 * before the tile is written again. Shared memory: sK, sV 2 × 16·D/64 KB + sQ, sdO 2 × 2 × 16 KB + sdS 2 × Bc·Br·2
 * bytes (2 × 16 KB; D = 64: 2 × 32 KB)
 * + sdQ 2 × 16 KB + sLD 2 × 2·Br·4 + barriers + 1 KB slack: D = 128 198696 bytes, D = 64 199720 (a third stage:
 * 231992 and 233528, the latter past the 232448 an H100 block may have). The losing orders of this kernel (the next
 * block's Sᵀ issued behind dK, earlier still, a ping-pong of the two warpgroups' Pᵀ/dSᵀ phases) and its persistent
 * form are rows of docs/experiments.md, their code at commit d79fa1c. */
#ifndef FLASHC_CUDA_HOPPER_BWD_KERNEL_CUH
#define FLASHC_CUDA_HOPPER_BWD_KERNEL_CUH

#if FC_HOPPER_ARCH
/* acc (64 × D) += A·B over Br queries: A from registers (Pᵀ or dSᵀ packed, k-step kb = queries 16·kb ..),
 * B = dO_i or Q_i MN-major (imm-trans-b = 1): one of fc_hpb_dkdv's two chains (dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i). */
template <typename T, int D, int BR>
static __device__ __forceinline__ void fc_hpb_rs_chain(float (&acc)[D / 2], const uint32_t (&a)[BR / 16][4],
                                                       uint32_t b_tile) {
#pragma unroll
  for (int kb = 0; kb < BR / 16; kb++)
    fc_wgmma_rs<T, D>(acc, a[kb], fc_wgmma_desc_off(b_tile, kb * 16 * FC_HPB_ROW_BYTES, BR * FC_HPB_ROW_BYTES, 1024));
}
#endif /* FC_HOPPER_ARCH */

#if FC_HOPPER_ARCH
/* A warpgroup's dQ product (64 × 64 fp32 in dq) → its sdQ tile → one bulk reduce-add into the blocked sum, for the
 * query block at row qq of head hq. D = 64 (Br = 128): rows qq + 64·cw .., all 64 columns (two w = 32 tiles,
 * contiguous); D = 128 (Br = 64): rows qq .., columns 64·cw .. */
template <int D>
static __device__ __forceinline__ void fc_hpb_lag_dq_add(const fc_hopper_bwd_args &a, const float (&dq)[32],
                                                         uint32_t sdQ, int hq, int64_t pad0, int qq, int cw, int warp,
                                                         int g, int t, int ct) {
  constexpr int NQ = 64;
  static_assert(D == 64 || D == 128, "the second version's head dims");
  const uint32_t tile = sdQ + cw * (FC_BWD_DQ_TILE * NQ * 4);
  float *const rows = a.dq_accum + ((int64_t)hq * a.total_pad + pad0 + qq) * D;
  if constexpr (D == 64)
    fc_hpb_dq_tile_add<NQ, D / 2>(dq, tile, rows + 64 * cw * D, warp, g, t, ct, FC_HPB_BAR_DS + cw);
  else
    fc_hpb_dq_tile_add<NQ>(dq, tile, rows + NQ * cw * FC_BWD_DQ_TILE, warp, g, t, ct, FC_HPB_BAR_DS + cw);
}

/* The same FULL/EMPTY as the kernel below (identical redefinitions there). */
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))
/* One block (one trip of the loop) of fc_hopper_bwd_kernel: block `it` of the tile's n_iter (query head, query
 * block) pairs, in stage it % STAGES of the Q/dO ring, in the header's order. FIRST: block 0 (no dQ of an earlier
 * block to issue). */
template <typename T, int D, bool FIRST = false, bool SCORE_MOD = false, bool ADD = false, bool DROP = false>
static __device__ __forceinline__ void
fc_hpb_lag_block(const fc_hopper_bwd_args &a, int it, int n_iter, int n_i, int i_begin, int h0, int64_t pad0, int k0,
                 int key0, int sq, int sk, int64_t shift, float c, int cw, int ct, int warp, int g, int t, uint32_t sQ,
                 uint32_t sdO, uint32_t sdS, uint32_t sdQ, uint32_t sLD, uint32_t bars, uint32_t k_rows,
                 uint32_t v_rows, uint32_t k_cols, float (&st)[(D == 64 ? 128 : FC_HPB_BR) / 2],
                 float (&dpt)[(D == 64 ? 128 : FC_HPB_BR) / 2], float (&dk)[D / 2], float (&dv)[D / 2],
                 const float *alibi_b = nullptr, int64_t b = 0) {
  constexpr int STAGES = FC_HPB_LAG_STAGES, BR = D == 64 ? 128 : FC_HPB_BR;
  /* SCORE_MOD (hopper/score_mod.cuh): Sᵀ is not biased (the modifiers act on the raw score, before lse2 is
   * subtracted), the P pass packs Pᵀ (for dV) and Pᵀ∘(1 − tanh²) (for dSᵀ) to 16 bits itself, so dV goes early as at
   * D = 128; lse2_i is read in the P pass (no registers for it beside the packed tiles). */
  constexpr bool EARLY_DV = D == 128 || SCORE_MOD, BIAS = D == 128, BIAS_S = BIAS && !SCORE_MOD;
  constexpr bool L2_PRE = !BIAS && !SCORE_MOD;
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : D / 2;
  static_assert(NQ == 64, "a 64 × 64 fp32 dQ product per warpgroup (fc_hpb_lag_dq_add)");
  constexpr uint32_t Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2;
  constexpr uint32_t DS_HALF = FC_HPB_BC * FC_HPB_ROW_BYTES;
  const int s = it % STAGES, u = it / STAGES;
  const int hh = h0 + it / n_i, q0 = (i_begin + it % n_i) * BR;
  const uint32_t q_tile = sQ + s * Q_BYTES, do_tile = sdO + s * Q_BYTES;
  const uint32_t sL = sLD + s * 2 * ROWS_BYTES, sD = sL + ROWS_BYTES;
  const uint32_t ds_buf = sdS + (it & 1) * DS_BYTES; /* this block's dSᵀ, both warpgroups' rows */
#define MARK(k)                                                                                                        \
  do {                                                                                                                 \
    if (ct == 0) FC_HPB_MARK_AT(1 + cw, it, k);                                                                        \
  } while (0)
  MARK(1);
  float2 l2_pre[BR / 8]; /* !BIAS: lse2_i, loaded before Sᵀ and dPᵀ are issued (below) */
  /* Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ: two groups */
  fc_mbar_wait(FULL(s), u & 1); /* Q_i, dO_i, lse2_i, D_i have landed */
  /* lse2_i now, while shared memory is quiet: loaded in the P pass, behind the operand reads of Sᵀ's and dPᵀ's
   * wgmmas, they made it wait (H100, D = 64: 1.023-1.032x, bench/results/configs/hopper-bwd-lag-d64-2026-11-24.txt).
   * Not D_i too (+16 registers: spills at D = 64). */
  if constexpr (BIAS) {
    fc_hpb_bias_init<BR, BIAS_S, true>(st, dpt, sL, sD, 1.0f / c, t);
    /* each accumulator its own register before the fence (else ptxas sinks the copies of a pair's shared bias
     * between the two products' wgmmas and injects waits there: C7517/C7519) */
    if constexpr (BIAS_S) fc_fence_regs(st);
    fc_fence_regs(dpt);
  }
  if constexpr (L2_PRE) fc_hpb_ld_rows<BR>(l2_pre, sL, t);
  /* SCORE_MOD: this block's query head's ALiBi slope (alibi_b: the sequence's slopes), loaded before the wgmmas */
  const float slope = SCORE_MOD && alibi_b ? __ldg(alibi_b + hh) : 0.0f;
  /* and the block's attn_mask (fc_hpb_mask_block) */
  [[maybe_unused]] fc_hpb_mblock<BR> mb;
  [[maybe_unused]] const int mcls =
      SCORE_MOD ? fc_hpb_mask_block<BR, FC_HPB_BC>(a.mod, b, hh, q0, k0, key0, t, sq, sk, &mb) : (int)FC_MT_ALL;
  /* and, DROP, its dropout keep bits (hopper/bwd_launch.cuh, fc_hpb_drop_bits) */
  [[maybe_unused]] fc_hpb_drop<BR> kd;
  if constexpr (DROP) fc_hpb_drop_bits<BR>(kd, a.mod, (uint64_t)(b * a.heads_q + hh), q0, key0, sk, g, t);
  fc_fence_regs(dk);
  fc_fence_regs(dv);
  fc_wgmma_fence();
  fc_hp_ss_kmajor<T, D, BR, !BIAS_S>(st, k_rows, q_tile);
  fc_wgmma_commit();
  fc_hp_ss_kmajor<T, D, BR, !BIAS>(dpt, v_rows, do_tile);
  fc_wgmma_commit();
  fc_wgmma_wait<1>(); /* Sᵀ; dPᵀ may still run */
  fc_fence_regs(st);
  MARK(2);

  /* Pᵀ = 2^(c·Sᵀ − lse2_i), masked, while dPᵀ's wgmma runs on (fc_hpb_p_pass says which keys and queries this
   * thread holds). */
  /* Packed to 16 bits as A fragments (query columns 16·kb .. 16·kb + 15 are A's registers of k-step kb). */
  uint32_t pp[BR / 16][4], dsp[BR / 16][4], pg[SCORE_MOD ? BR / 16 : 1][4];
  if constexpr (SCORE_MOD) {
    /* pp ← Pᵀ, pg ← Pᵀ∘(1 − tanh²), packed */
    fc_hpb_p_from_s_mod<T, BR, FC_HPB_MOD_PACK, FC_HPB_BC, ADD>(st, dpt, pp, pg, sL, sD, t, q0, k0, key0, sq, sk, shift,
                                                                a.window_left, a.window_right, a.mod, slope, b, hh,
                                                                mcls, mb);
    if constexpr (DROP) fc_hpb_drop_packed<BR>(pp, kd); /* dV from Pᵀ∘keep (1/(1 − p): on dV at the end) */
  } else {
    const float2 no_l2[BR / 8] = {}; /* BIAS: −0 is subtracted (Sᵀ holds Sᵀ − lse2_i/c already) */
    fc_hpb_p_from_s<BR, false, FC_HPB_BC, D == 128 ? 1 : 0>(st, dpt, sL, sD, c, t, q0, k0, key0, sq, sk, shift,
                                                            a.window_left, a.window_right, BIAS ? no_l2 : l2_pre);
  }
  MARK(3);
  if constexpr (EARLY_DV) {
    if constexpr (!SCORE_MOD) {
#pragma unroll
      for (int kb = 0; kb < BR / 16; kb++)
#pragma unroll
        for (int r = 0; r < 4; r++) pp[kb][r] = fc_pack2<T>(st[8 * kb + 2 * r], st[8 * kb + 2 * r + 1]);
    }

    /* dV_j += Pᵀ·dO_i: queued behind dPᵀ, it runs while dSᵀ is formed and stored */
    fc_wgmma_fence();
    fc_hpb_rs_chain<T, D, BR>(dv, pp, do_tile);
    fc_wgmma_commit();
    fc_wgmma_wait<1>(); /* dPᵀ; dV may still run */
  } else {
    fc_wgmma_wait<0>(); /* dPᵀ */
  }
  fc_fence_regs(dpt);
  MARK(4);

  if constexpr (DROP) { /* dSᵀ = (Pᵀ∘(1 − tanh²))∘(Z∘dPᵀ − D_i) */
    fc_hpb_drop_apply<BR, BIAS>(dpt, kd, a.mod.drop_rp, sD, t);
    fc_hpb_ds_from_pg<T, BR, false>(dpt, pg, sD, t);
  } else if constexpr (SCORE_MOD)
    fc_hpb_ds_from_pg<T, BR, BIAS>(dpt, pg, sD, t); /* dSᵀ = (Pᵀ∘(1 − tanh²))∘(dPᵀ − D_i) */
  else
    fc_hpb_ds_from_dp<BR, BIAS>(dpt, st, sD, t); /* dSᵀ = Pᵀ∘(dPᵀ − D_i) */
  if constexpr (ADD)
    if (a.mod.dbias) fc_hpb_dbias_put<T, BR>(a.mod, b, hh, dpt, q0, key0, sq, sk, t);
#pragma unroll
  for (int kb = 0; kb < BR / 16; kb++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      if constexpr (!EARLY_DV) pp[kb][r] = fc_pack2<T>(st[8 * kb + 2 * r], st[8 * kb + 2 * r + 1]);
      dsp[kb][r] = fc_pack2<T>(dpt[8 * kb + 2 * r], dpt[8 * kb + 2 * r + 1]);
    }
  MARK(5);
  if constexpr (!EARLY_DV) {
    /* dV_j += Pᵀ·dO_i: it runs while dSᵀ is stored and the warpgroups meet */
    fc_wgmma_fence();
    fc_hpb_rs_chain<T, D, BR>(dv, pp, do_tile);
    fc_wgmma_commit();
  }

  /* The last reader of the buffer this block's dSᵀ goes to, the other warpgroup's dQ of block it − 2, is done
   * (this warpgroup's retired in block it − 1). The barrier also makes thread 0's wait for the last bulk add's read
   * of the warpgroup's sdQ tile (block it − 2's dQ) everyone's, before the tile is written below (at it = 1 there
   * was no add). */
  if constexpr (!FIRST) {
    if (ct == 0) fc_bulk_wait_read<0>();
    if (it >= 2) fc_named_barrier(FC_HPB_BAR_FREE + 2 * (1 - cw) + (it & 1), 256);
  }
  /* dSᵀ into this warpgroup's 64 rows of buffer it % 2, swizzled as TMA would write it: in half x / 8
   * (queries 64·(x / 8) .., DS_HALF bytes apart; Br = 64: one), row r (a key), 16-byte chunk x % 8 (queries
   * 8x .. 8x + 7) at r·128 + (((x % 8) ^ (r % 8))·16). dsp[j][i] is the fragment of the 8 × 8 matrix of chunk
   * x = 2j + i / 2 and rows 16·warp + 8·(i % 2) .. + 7, so one stmatrix.x4 per j stores four of them; this lane
   * addresses row mr of matrix mi. The buffer's last readers (block it − 2's dQ wgmmas) are done (the header says
   * why). */
  fc_fence_proxy_async(); /* after the async proxy's reads of this buffer, before these writes */
  {
    const int mi = (4 * g + t) / 8, mr = (4 * g + t) % 8, r = 64 * cw + 16 * warp + 8 * (mi % 2) + mr;
#pragma unroll
    for (int j = 0; j < BR / 16; j++) {
      const int x = 2 * j + mi / 2;
      fc_stmatrix_x4(ds_buf + (x / 8) * DS_HALF + r * FC_HPB_ROW_BYTES + (((x % 8) ^ mr) << 4), dsp[j]);
    }
  }
  fc_fence_proxy_async(); /* these generic writes, before the async proxy (wgmma) reads them */
  MARK(6);
  fc_named_barrier_arrive_if(FC_HPB_BAR_READY + 2 * cw + (it & 1), 256, true); /* bar.arrive orders the writes */
  MARK(7);

  /* Block it − 1's dQ (D = 128: columns 64·cw ..; D = 64: queries 64·cw .., half cw of the buffer) = dS·K_j over
   * keys 0 .. 63 (warpgroup 0's rows of dSᵀ), then 64 .. 127, once the other warpgroup's rows of that block are in
   * (written a block ago unless it runs a block behind); then dK_j += dSᵀ·Q_i. dQ first: it is done (with dV) while
   * dK runs on. */
  const uint32_t ds_a = sdS + ((it + 1) & 1) * DS_BYTES + (ROWSPLIT ? cw * DS_HALF : 0);
  float dq[NQ / 2];
  if constexpr (!FIRST) fc_named_barrier(FC_HPB_BAR_READY + 2 * (1 - cw) + ((it + 1) & 1), 256);
  fc_wgmma_fence();
  if constexpr (!FIRST) {
    fc_hpb_dq<T, NQ>(dq, ds_a, k_cols);
    fc_hpb_dq<T, NQ, false>(dq, ds_a + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
    fc_wgmma_commit();
  }
  fc_hpb_rs_chain<T, D, BR>(dk, dsp, q_tile);
  fc_wgmma_commit();
  fc_wgmma_wait<1>(); /* dV, block it − 1's dQ (none in block 0); dK may still run */
  fc_fence_regs(dv);
  if constexpr (!FIRST) fc_fence_regs(dq);
  MARK(8);
  /* This warpgroup's dQ has read buffer (it − 1) % 2, which the other writes next at block it + 1 */
  if constexpr (!FIRST) fc_named_barrier_arrive_if(FC_HPB_BAR_FREE + 2 * cw + ((it + 1) & 1), 256, it + 2 <= n_iter);
  if constexpr (!FIRST) {
    /* The dQ tile's head hq and query block qq: block it − 1's, from this block's (no second division) */
    const int r = it % n_i;
    const int hq = r == 0 ? hh - 1 : hh, qq = r == 0 ? (i_begin + n_i - 1) * BR : q0 - BR;
    fc_hpb_lag_dq_add<D>(a, dq, sdQ, hq, pad0, qq, cw, warp, g, t, ct);
  }

  MARK(9);
  fc_wgmma_wait<0>(); /* dK */
  fc_fence_regs(dk);
  MARK(10);
  /* Q_i, dO_i, lse2_i, D_i of stage s are read: every consumer thread arrives (an arrive releases only the
   * arriving thread's own reads of sLD). */
  fc_mbar_arrive_if(EMPTY(s), true);
#undef MARK
}
#undef FULL
#undef EMPTY

/* LAG: the last block's dQ (block `it`), after the loop: as a block's, without a next block to run beside it. */
template <typename T, int D>
static __device__ __forceinline__ void fc_hpb_lag_tail(const fc_hopper_bwd_args &a, int it, int n_i, int i_begin,
                                                       int h0, int64_t pad0, int cw, int ct, int warp, int g, int t,
                                                       uint32_t sdS, uint32_t sdQ, uint32_t k_cols) {
  constexpr int NQ = 64, BR = D == 64 ? 128 : FC_HPB_BR;
  /* buffer it % 2; D = 64 (Br = 128): this warpgroup's 64 queries of it (its half) */
  const uint32_t ds = sdS + (it & 1) * (FC_HPB_BC * BR * 2) + (D == 64 ? cw * FC_HPB_BC * FC_HPB_ROW_BYTES : 0);
  float dq[NQ / 2];
  fc_named_barrier(FC_HPB_BAR_READY + 2 * (1 - cw) + (it & 1), 256); /* the other's rows of block it */
  fc_wgmma_fence();
  fc_hpb_dq<T, NQ>(dq, ds, k_cols);
  fc_hpb_dq<T, NQ, false>(dq, ds + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
  fc_wgmma_commit();
  fc_wgmma_wait<0>(); /* dQ */
  fc_fence_regs(dq);
  if (ct == 0) fc_bulk_wait_read<0>();       /* the last add has read sdQ ... */
  fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... before anyone writes it */
  fc_hpb_lag_dq_add<D>(a, dq, sdQ, h0 + it / n_i, pad0, (i_begin + it % n_i) * BR, cw, warp, g, t, ct);
}
#endif /* FC_HOPPER_ARCH */

/* D = 128: Br = 64; D = 64: Br = 128; 2 Q/dO stages either way (FC_HPB_LAG_STAGES). D = 128 issues dV before the dPᵀ
 * wait (EARLY_DV) and starts the Sᵀ/dPᵀ accumulators at −lse2_i/c, −D_i (BIAS); D = 64 issues dV after dSᵀ is formed
 * (its packed Pᵀ beside Sᵀ's and dPᵀ's accumulators would not fit 240 registers) and loads lse2_i at the block's
 * start. Both issue each block's dQ a block later (LAG). */
template <typename T, int D, bool SCORE_MOD = false, bool ADD = false, bool DV_COLS = false, bool DROP = false>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                         const fc_hopper_bwd_args a) {
#if FC_HOPPER_ARCH
  constexpr int STAGES = FC_HPB_LAG_STAGES, BR = D == 64 ? 128 : FC_HPB_BR;
  /* D = 128: warpgroup c's dQ product is columns 64·c .. of dQ_i (all Br = 64 queries); D = 64 (Br = 128): rows
   * 64·c .. (all 64 columns). Either way a 64 × 64 fp32 tile. */
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : D / 2; /* columns of one dQ product */
  static_assert(D == 64 || D == 128, "the shared-memory budgets above");
  constexpr uint32_t DQ_TILE_BYTES = FC_BWD_DQ_TILE * NQ * 4; /* 64 rows × NQ columns, fp32 */
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2; /* one buffer of sdS: dSᵀ, Bc keys × Br queries */
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
  const uint32_t sdQ = sdS + 2 * DS_BYTES; /* one DQ_TILE_BYTES tile per consumer warpgroup */
  const uint32_t sLD = sdQ + 2 * DQ_TILE_BYTES, bars = sLD + STAGES * 2 * ROWS_BYTES;
  const uint32_t kv_full = bars;

  /* Which tile (fc_hpb_tile_of_cta, as the first version; SCORE_MOD: cut to a boolean attn_mask's query blocks). */
  fc_hpb_tile ti;
  if (!fc_hpb_tile_of_cta<BR, FC_HPB_BC, SCORE_MOD>(a, &ti)) return; /* the whole CTA, before any barrier */
  const int sq = ti.sq, sk = ti.sk, k0 = ti.k0;
  const int i_begin = ti.i_begin, n_i = ti.n_i, n_iter = ti.n_iter;
  const int64_t pad0 = ti.pad0, shift = ti.shift;

  fc_hpb_start<STAGES>(bars);
  if (threadIdx.x < 128) {
    fc_hpb_producer<D, BR, STAGES, ADD>(a, ti, &tm_q, &tm_k, &tm_v, &tm_do, sK, sV, sQ, sdO, sLD, bars);
  } else { /* the consumers */
    const auto [cw, ct, warp, lane, g, t] = fc_hpb_consumer();
    const uint32_t k_rows = sK + 64 * cw * FC_HPB_ROW_BYTES; /* this warpgroup's 64 keys (in each half) */
    const uint32_t v_rows = sV + 64 * cw * FC_HPB_ROW_BYTES;
    /* dQ's B: columns 64·cw .. of K_j (D = 64: all of them), all 128 keys */
    const uint32_t k_cols = ROWSPLIT ? sK : sK + cw * FC_HPB_KV_HALF;
    const int key0 = k0 + 64 * cw + 16 * warp + g; /* this thread's keys: key0, key0 + 8 */
    const float c = a.scale_log2;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int x = 0; x < D / 2; x++) dk[x] = dv[x] = 0.0f;
    /* The zeros are in dK's and dV's registers before block 0's Sᵀ is issued: without this the compiler may sink
     * the moves below that issue, into a wgmma's flight (C7515 forbids non-wgmma definitions of accumulator
     * registers there). */
    fc_fence_regs(dk);
    fc_fence_regs(dv);
    if (n_iter > 0) fc_mbar_wait(kv_full, 0); /* K_j, V_j have landed */

    float st[BR / 2], dpt[BR / 2];
    /* Every path through the body commits the same groups in the same order (no test of `it` around an issue
     * or a wait): ptxas must see which groups each wait retires, else it adds waits (C7517) or serialises
     * (C7514). Block 0 has no dQ of a block before it to issue (its own comes in block 1), the tail the last
     * block's. */
    /* SCORE_MOD: the sequence's ALiBi slopes (NULL: none) */
    const float *alibi_b = SCORE_MOD && a.mod.alibi ? a.mod.alibi + ti.b * a.mod.alibi_sb : nullptr;
    if (n_iter > 0) {
      fc_hpb_lag_block<T, D, true, SCORE_MOD, ADD, DROP>(a, 0, n_iter, n_i, i_begin, ti.h0, pad0, k0, key0, sq, sk,
                                                         shift, c, cw, ct, warp, g, t, sQ, sdO, sdS, sdQ, sLD, bars,
                                                         k_rows, v_rows, k_cols, st, dpt, dk, dv, alibi_b, ti.b);
      for (int it = 1; it < n_iter; it++)
        fc_hpb_lag_block<T, D, false, SCORE_MOD, ADD, DROP>(a, it, n_iter, n_i, i_begin, ti.h0, pad0, k0, key0, sq, sk,
                                                            shift, c, cw, ct, warp, g, t, sQ, sdO, sdS, sdQ, sLD, bars,
                                                            k_rows, v_rows, k_cols, st, dpt, dk, dv, alibi_b, ti.b);
      fc_hpb_lag_tail<T, D>(a, n_iter - 1, n_i, i_begin, ti.h0, pad0, cw, ct, warp, g, t, sdS, sdQ, k_cols);
    }
    /* The CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
    if (ct == 0) fc_bulk_wait<0>();

    /* DROP: dV = Σ (Pᵀ∘keep)·dO / (1 − p), the blocks summed Pᵀ∘keep (fc_hpb_drop_packed) */
    if constexpr (DROP) {
#pragma unroll
      for (int x = 0; x < D / 2; x++) dv[x] *= a.mod.drop_rp;
    }
    uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti);
    uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti);
    static_assert(2 * STAGES * Q_BYTES >= 2 * 2 * 64 * D * 2, "the stage ring holds both warpgroups' dK, dV tiles");
    fc_hpb_store_dkdv<T, D, DV_COLS>(dk, dv, sQ, a, dK, dV, k0, sk, cw, ct);
  }
#endif /* FC_HOPPER_ARCH */
}

#endif /* FLASHC_CUDA_HOPPER_BWD_KERNEL_CUH */
