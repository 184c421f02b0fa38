/* hopper_bwd_v2.cuh — cuda-hopper's dK/dV kernel, second version (FLASHC_HOPPER_BWD_V = 2, 3, 4 at head dim 128;
 * 2 .. 6 at head dim ≤ 64; tools/hopper/BWD-NOTES.md, "Head dim 128, version 2" and "Head dim 64, version 2").
 * Included by hopper_bwd.cu only, after its device helpers (fc_hpb_*), whose names, tile layouts and dQ sum it
 * shares; the first version's kernel is untouched.
 *
 * Same maths, masks, tiles, producer and bulk dQ adds as fc_hopper_bwd_kernel<…, bulk, Br> (D = 128: Br = 64;
 * D = 64: Br = 128, Bc = 128 both); what changes is the order of each consumer warpgroup's wgmma groups, so that
 * its CUDA-core work runs beside its own tensor work instead of between waits for all of it (FlashAttention-3's
 * order). Per block i, with the groups still pending after each step on the right:
 *   V = 2:  Sᵀ, dPᵀ issued (two groups); wait 1: Sᵀ done                                       [dPᵀ]
 *   NEXT:   wait 0: Sᵀ done (issued by the last iteration); dPᵀ issued                         [dPᵀ]
 *   Pᵀ = 2^(c·Sᵀ − lse2_i), masked                              beside dPᵀ
 *   EARLY_DV: dV_j += Pᵀ·dO_i issued; wait 1: dPᵀ done                                         [dV]
 *   else:     wait 0: dPᵀ done                                                                 []
 *   dSᵀ = Pᵀ∘(dPᵀ − D_i), packed                                EARLY_DV: beside dV
 *   else:     dV_j += Pᵀ·dO_i issued                                                           [dV]
 *   dSᵀ → sdS[i % 2]                                            beside dV
 *   one 256-thread barrier (both warpgroups' dSᵀ rows written)
 *   dQ_i = dS·K_j and dK_j += dSᵀ·Q_i issued                                                   [dV, dQ, dK]
 *     (D = 128: columns 64·c .. of dQ_i; D = 64: query rows 64·c .., all 64 columns; all 128 keys)
 *   wait 1: dV, dQ done
 *   dQ → sdQ, one bulk reduce-add                               beside dK
 *   V = 2:  wait 0: dK done; release the stage                                                 []
 *   NEXT:   block i + 1's Sᵀ issued behind dK; wait 1: dK done; release the stage              [Sᵀ]
 *   (EARLY_S, D = 64 only: block i + 1's Sᵀ issued right after "wait 1: dV, dQ", so that it runs beside the dQ
 *   store too)
 * EARLY_DV is D = 128's order (always there). At D = 64 its packed Pᵀ (32 registers) is live beside Sᵀ's and dPᵀ's
 * fp32 accumulators (64 + 64) and dK, dV (64): 224 of the 240 a consumer thread has. ptxas fits it without spills
 * in the NEXT kernels only (V = 2 spilled 4 bytes): at D = 64, versions 5 and 6 are 3 and 4 with EARLY_DV, 2 to 4
 * issue dV after dSᵀ is formed.
 * sdS is double-buffered so that one barrier per block suffices: dSᵀ of block i goes to buffer i % 2, whose last
 * readers (the dQ wgmmas of block i − 2, both warpgroups) each finished at its "wait 1: dV, dQ" of block i − 2,
 * before arriving at block i − 1's barrier, which this warpgroup has passed. The same barrier orders sdQ: the
 * issuing thread waits for the last bulk add's read of its warpgroup's tile before arriving there, and the tile
 * is written after it. tools/hopper/bwd_v2_model.py checks these orders by exhaustive interleaving.
 * LAG (D = 128: versions 7, 8, 11 with NEXT, 12, 13 without, 13 the default since session 26; D = 64: 7 without
 * NEXT, the default since session 26, and 8 with it): each warpgroup issues block i − 1's dQ in block i instead of
 * block i's, so the barrier of both warpgroups per block becomes pairwise named barriers (READY: the other's dSᵀ rows
 * of a block are in; FREE: its dQ has read a buffer the other writes next) and the warpgroups drift apart; block 0 is
 * peeled (FIRST), fc_hpb_v2_lag_tail issues the last block's dQ (BWD-NOTES.md has the protocol,
 * tools/hopper/bwd_lag_model.py checks it). BIAS (9, 10, 11, 13): Sᵀ's and dPᵀ's accumulators start at −lse2_i/c and
 * −D_i (fc_hpb_bias_init, beside the previous block's dK with NEXT, after the stage's full-wait without), so that the P
 * pass and dSᵀ load nothing. Shared memory: sK, sV 2 × 16·D/64 KB + sQ, sdO STAGES × 2 × 16 KB + sdS 2 × Bc·Br·2 bytes
 * (2 × 16 KB; D = 64: 2 × 32 KB) + sdQ 2 × 16 KB + sLD STAGES × 2·Br·4 + barriers + 1 KB slack. D = 128: 198696 bytes
 * with 2 stages, 231992 with 3 (of the 232448 an H100 block may have); D = 64: 199720 with 2 stages (3: 233528). */
#ifndef FLASHC_CUDA_HOPPER_BWD_V2_CUH
#define FLASHC_CUDA_HOPPER_BWD_V2_CUH

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
static __device__ __forceinline__ void fc_hpb_v2_dq_add(const fc_hopper_bwd_args &a, const float (&dq)[32],
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

/* The same FULL/EMPTY as the kernels below (identical redefinitions there). */
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))
/* One block (one trip of the loop) of fc_hopper_bwd_v2_kernel: block `it` of the tile's n_iter (query head, query
 * block) pairs, held in fill `ring` of the Q/dO stage ring (ring = it in the single-tile kernel; the persistent one
 * numbers the ring across its tiles). The header's order; st holds this block's Sᵀ on entry when NEXT (issued by the
 * last trip or the prologue) and the next block's on exit. PERSIST: the last block (it + 1 = n_iter) does not
 * release its stage (NEXT's discarded Sᵀ still reads it): the caller does, after that Sᵀ's wait. */
template <typename T, int STAGES, bool NEXT, int D, bool EARLY_S, bool EARLY_DV, bool PERSIST, int LAG = 0,
          bool FIRST = false, int BIAS = 0>
static __device__ __forceinline__ void
fc_hpb_v2_block(const fc_hopper_bwd_args &a, int it, int ring, int n_iter, int n_i, int i_begin, int hk, int64_t pad0,
                int k0, int key0, int sk, int64_t shift, float c, int cw, int ct, int warp, int g, int t, uint32_t sQ,
                uint32_t sdO, uint32_t sdS, uint32_t sdQ, uint32_t sLD, uint32_t bars, uint32_t k_rows, uint32_t v_rows,
                uint32_t k_cols, float (&st)[(D == 64 ? 128 : FC_HPB_BR) / 2],
                float (&dpt)[(D == 64 ? 128 : FC_HPB_BR) / 2], float (&dk)[D / 2], float (&dv)[D / 2]) {
  constexpr int BR = D == 64 ? 128 : FC_HPB_BR;
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : D / 2;
  static_assert(NQ == 64, "a 64 × 64 fp32 dQ product per warpgroup (fc_hpb_v2_dq_add)");
  constexpr uint32_t Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2;
  constexpr uint32_t DS_HALF = FC_HPB_BC * FC_HPB_ROW_BYTES;
  static_assert(!LAG || (!EARLY_S && !PERSIST), "LAG: the single-tile kernels");
  static_assert(LAG != 2 || (D == 128 && NEXT), "the ping-pong: D = 128 with NEXT only");
  static_assert(!BIAS || (!EARLY_S && !PERSIST && (NEXT || BIAS == 1)), "BIAS: the single-tile kernels");
  const int s = ring % STAGES, u = ring / STAGES;
  const int hh = hk * a.group + it / n_i, q0 = (i_begin + it % n_i) * BR;
  const uint32_t q_tile = sQ + s * Q_BYTES, do_tile = sdO + s * Q_BYTES;
  const uint32_t sL = sLD + s * 2 * ROWS_BYTES, sD = sL + ROWS_BYTES;
  const uint32_t ds_buf = sdS + (it & 1) * DS_BYTES; /* this block's dSᵀ, both warpgroups' rows */
#define MARK(k)                                                                                                        \
  do {                                                                                                                 \
    if (ct == 0) FC_HPB_MARK_AT(1 + cw, ring, k);                                                                      \
  } while (0)
  MARK(1);
  float2 l2_pre[BR / 8]; /* !NEXT: lse2_i, loaded before Sᵀ and dPᵀ are issued (below) */
  /* Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ: two groups (NEXT: Sᵀ issued by the last iteration, behind its dK) */
  if constexpr (NEXT) {
    /* A wait 0: ptxas accepts a group in flight across the back edge only when the next iteration's first
     * wait retires everything (with a wait 1 here, dPᵀ issued by the last iteration and Pᵀ's exponentials
     * beside it, it serialised every wgmma: C7515). */
    fc_wgmma_wait<0>(); /* Sᵀ */
    fc_fence_regs(st);
    MARK(2);
    if constexpr (BIAS == 2) fc_hpb_bias_init<BR, false, true>(st, dpt, sL, sD, 1.0f / c, t);
    fc_wgmma_fence();
    fc_hp_ss_kmajor<T, D, BR, !BIAS>(dpt, v_rows, do_tile);
    fc_wgmma_commit();
    MARK(11);
    /* LAG = 2: this warpgroup's Pᵀ/dSᵀ phase waits until the other's is over (the other's GEMMs run beside it) */
    if constexpr (LAG == 2) fc_named_barrier(FC_HPB_BAR_TURN + cw, 256);
  } else {
    fc_mbar_wait(FULL(s), u & 1); /* Q_i, dO_i, lse2_i, D_i have landed */
    /* lse2_i now, while shared memory is quiet: loaded in the P pass, behind the operand reads of Sᵀ's and dPᵀ's
     * wgmmas, they made it wait (H100, session 24: D = 64 1.023-1.032x). Not in the NEXT kernels (D = 128), where
     * loading them at the block's start ran 0.985x and between the wait for Sᵀ and dPᵀ's issue 0.995x, and not D_i
     * too (+16 registers: spills at D = 64). */
    if constexpr (BIAS) {
      fc_hpb_bias_init<BR, true, true>(st, dpt, sL, sD, 1.0f / c, t);
      /* each accumulator its own register before the fence (else ptxas sinks the copies of a pair's shared bias
       * between the two products' wgmmas and injects waits there: C7517/C7519) */
      fc_fence_regs(st);
      fc_fence_regs(dpt);
    } else {
      fc_hpb_ld_rows<BR>(l2_pre, sL, t);
    }
    fc_fence_regs(dk);
    fc_fence_regs(dv);
    fc_wgmma_fence();
    fc_hp_ss_kmajor<T, D, BR, !BIAS>(st, k_rows, q_tile);
    fc_wgmma_commit();
    fc_hp_ss_kmajor<T, D, BR, !BIAS>(dpt, v_rows, do_tile);
    fc_wgmma_commit();
    fc_wgmma_wait<1>(); /* Sᵀ; dPᵀ may still run */
    fc_fence_regs(st);
    MARK(2);
  }

  /* Pᵀ = 2^(c·Sᵀ − lse2_i), masked, while dPᵀ's wgmma runs on (fc_hpb_p_pass says which keys and queries this
   * thread holds). */
  const float2 no_l2[BR / 8] = {}; /* BIAS: −0 is subtracted (Sᵀ holds Sᵀ − lse2_i/c already) */
  fc_hpb_p_from_s<BR, false, FC_HPB_BC, D == 128 ? 1 : 0>(st, dpt, sL, sD, c, t, q0, k0, key0, sk, shift, a.window_left,
                                                          a.window_right,
                                                          BIAS   ? no_l2
                                                          : NEXT ? nullptr
                                                                 : l2_pre);
  MARK(3);
  /* Packed to 16 bits as A fragments (query columns 16·kb .. 16·kb + 15 are A's registers of k-step kb). */
  uint32_t pp[BR / 16][4], dsp[BR / 16][4];
  if constexpr (EARLY_DV) {
#pragma unroll
    for (int kb = 0; kb < BR / 16; kb++)
#pragma unroll
      for (int r = 0; r < 4; r++) pp[kb][r] = fc_pack2<T>(st[8 * kb + 2 * r], st[8 * kb + 2 * r + 1]);

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

  fc_hpb_ds_from_dp<BR, BIAS != 0>(dpt, st, sD, t); /* dSᵀ = Pᵀ∘(dPᵀ − D_i) */
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

  /* LAG: the last reader of the buffer this block's dSᵀ goes to, the other warpgroup's dQ of block it − 2, is done
   * (this warpgroup's retired in block it − 1). The barrier also makes thread 0's wait for the last bulk add's read
   * of the warpgroup's sdQ tile (block it − 2's dQ) everyone's, before the tile is written below (at it = 1 there
   * was no add). */
  if constexpr (LAG && !FIRST) {
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
  if constexpr (LAG) {
    fc_named_barrier_arrive_if(FC_HPB_BAR_READY + 2 * cw + (it & 1), 256, true); /* bar.arrive orders the writes */
    /* LAG = 2: the other warpgroup's Pᵀ/dSᵀ phase may start (warpgroup 1's last block gives no turn: warpgroup 0
     * has none left to take; its first was given before the loop) */
    if constexpr (LAG == 2) fc_named_barrier_arrive_if(FC_HPB_BAR_TURN + 1 - cw, 256, cw == 0 || it + 1 < n_iter);
  } else {
    /* The last block's bulk add has read this warpgroup's sdQ tile before anyone writes it again (after this
     * barrier). */
    if (ct == 0) fc_bulk_wait_read<0>();
    fc_named_barrier(FC_HPB_BAR_DS_ALL, 256); /* both warpgroups' dSᵀ rows are in shared memory */
  }
  MARK(7);

  /* dQ_i (D = 128: columns 64·cw ..; D = 64: queries 64·cw .., half cw of the buffer) = dS·K_j over keys
   * 0 .. 63 (warpgroup 0's rows of dSᵀ), then 64 .. 127; then dK_j += dSᵀ·Q_i. dQ first: it is done (with dV)
   * while dK runs on. */
  /* LAG: block it − 1's dQ (this warpgroup's 64 columns, both warpgroups' dSᵀ rows), once the other warpgroup's
   * rows of that block are in (written a block ago unless it runs a block behind) */
  const uint32_t ds_a = (LAG ? sdS + ((it + 1) & 1) * DS_BYTES : ds_buf) + (ROWSPLIT ? cw * DS_HALF : 0);
  float dq[NQ / 2];
  if constexpr (LAG && !FIRST) fc_named_barrier(FC_HPB_BAR_READY + 2 * (1 - cw) + ((it + 1) & 1), 256);
  fc_wgmma_fence();
  if constexpr (!(LAG && FIRST)) {
    fc_hpb_dq<T, NQ>(dq, ds_a, k_cols);
    fc_hpb_dq<T, NQ, false>(dq, ds_a + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
    fc_wgmma_commit();
  }
  fc_hpb_rs_chain<T, D, BR>(dk, dsp, q_tile);
  fc_wgmma_commit();
  fc_wgmma_wait<1>(); /* dV, dQ (LAG: block it − 1's; none in block 0); dK may still run */
  fc_fence_regs(dv);
  if constexpr (!(LAG && FIRST)) fc_fence_regs(dq);
  MARK(8);
  /* LAG: this warpgroup's dQ has read buffer (it − 1) % 2, which the other writes next at block it + 1 */
  if constexpr (LAG && !FIRST)
    fc_named_barrier_arrive_if(FC_HPB_BAR_FREE + 2 * cw + ((it + 1) & 1), 256, it + 2 <= n_iter);
  if constexpr (EARLY_S) {
    /* Block it + 1's Sᵀ behind dK already, before this block's dQ is stored (as NEXT below, one step earlier:
     * it runs beside the dQ store and bulk add; D = 64 only, where dQ 32 + Sᵀ 64 registers fit beside dK, dV
     * and the dSᵀ fragments) */
    const int nx = it + 1 < n_iter ? ring + 1 : ring, s1 = nx % STAGES;
    fc_mbar_wait(FULL(s1), (nx / STAGES) & 1); /* the last block: its own fill, long complete */
    fc_wgmma_fence();
    fc_hp_ss_kmajor<T, D, BR>(st, k_rows, sQ + s1 * Q_BYTES);
    fc_wgmma_commit();
  }
  if constexpr (!(LAG && FIRST)) {
    /* The dQ tile's head hq and query block qq: this block's, or (LAG) block it − 1's, from this block's (no second
     * division) */
    const int r = it % n_i;
    const int hq = LAG && r == 0 ? hh - 1 : hh, qq = !LAG ? q0 : r == 0 ? (i_begin + n_i - 1) * BR : q0 - BR;
    fc_hpb_v2_dq_add<D>(a, dq, sdQ, hq, pad0, qq, cw, warp, g, t, ct);
  }

  MARK(9);
  if constexpr (NEXT) {
    /* Block it + 1's Sᵀ behind dK (EARLY_S: issued above); the last block issues its own again (discarded;
     * its stage is not refilled), so that every iteration commits the same groups. */
    if constexpr (!EARLY_S) {
      const int nx = it + 1 < n_iter ? ring + 1 : ring, s1 = nx % STAGES;
      fc_mbar_wait(FULL(s1), (nx / STAGES) & 1); /* the last block: its own fill, long complete */
      if constexpr (BIAS) {
        const uint32_t sL1 = sLD + s1 * 2 * ROWS_BYTES;
        fc_hpb_bias_init<BR, true, BIAS == 1>(st, dpt, sL1, sL1 + ROWS_BYTES, 1.0f / c, t);
      }
      fc_wgmma_fence();
      fc_hp_ss_kmajor<T, D, BR, !BIAS>(st, k_rows, sQ + s1 * Q_BYTES);
      fc_wgmma_commit();
    }
    fc_wgmma_wait<1>(); /* dK, while Sᵀ queues up behind it */
    fc_fence_regs(dk);
    MARK(10);
    /* stage s is read (as below); PERSIST: the last block's stage is released after the wait for the discarded
     * Sᵀ, which reads it (the ring is refilled for the next tile) */
    fc_mbar_arrive_if(EMPTY(s), !PERSIST || it + 1 < n_iter);
  } else {
    fc_wgmma_wait<0>(); /* dK */
    fc_fence_regs(dk);
    MARK(10);
    /* Q_i, dO_i, lse2_i, D_i of stage s are read: every consumer thread arrives (an arrive releases only the
     * arriving thread's own reads of sLD). */
    fc_mbar_arrive_if(EMPTY(s), true);
  }
#undef MARK
}
#undef FULL
#undef EMPTY

/* LAG: the last block's dQ (block `it`), after the loop: as a block's, without a next block to run beside it. */
template <typename T, int D>
static __device__ __forceinline__ void fc_hpb_v2_lag_tail(const fc_hopper_bwd_args &a, int it, int n_i, int i_begin,
                                                          int hk, int64_t pad0, int cw, int ct, int warp, int g, int t,
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
  fc_wgmma_wait<0>(); /* dQ, and the discarded Sᵀ (NEXT) */
  fc_fence_regs(dq);
  if (ct == 0) fc_bulk_wait_read<0>();       /* the last add has read sdQ ... */
  fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... before anyone writes it */
  fc_hpb_v2_dq_add<D>(a, dq, sdQ, hk * a.group + it / n_i, pad0, (i_begin + it % n_i) * BR, cw, warp, g, t, ct);
}
#endif /* FC_HOPPER_ARCH */

/* D = 128: Br = 64, STAGES (Q_i/dO_i stages) 2 or 3; D = 64: Br = 128, STAGES 2 (D comes last: the D = 128
 * kernels kept their SASS of before D = 64 was added, byte for byte; only their names grew). NEXT: issue block
 * i + 1's Sᵀ behind block i's dK, so that the tensor pipe has this warpgroup's next product queued while it
 * stores dQ (registers at that point, D = 128: dK, dV 128 + the dSᵀ fragments dK still reads 16 + Sᵀ 32; D = 64:
 * 64 + 32 + 64). EARLY_S (D = 64, FLASHC_HOPPER_BWD_V = 4, 6 there): NEXT with that Sᵀ issued before the dQ
 * store instead of after it (+ dQ 32 registers while it runs). EARLY_DV: the order of the dV issue (header). */
template <typename T, int STAGES, bool NEXT, int D, bool EARLY_S, bool EARLY_DV, int LAG = 0, int BIAS = 0>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_v2_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                            const fc_hopper_bwd_args a) {
#if FC_HOPPER_ARCH
  constexpr int BR = D == 64 ? 128 : FC_HPB_BR;
  /* D = 128: warpgroup c's dQ product is columns 64·c .. of dQ_i (all Br = 64 queries); D = 64 (Br = 128): rows
   * 64·c .. (all 64 columns), as fc_hopper_bwd_kernel<…, BR = 128>. Either way a 64 × 64 fp32 tile. */
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : D / 2; /* columns of one dQ product */
  /* EARLY_DV: dV issued before the dPᵀ wait, Pᵀ packed while Sᵀ's fp32 values still wait for dSᵀ (at D = 64, Br =
   * 128: Sᵀ 64 + dPᵀ 64 + packed Pᵀ 32 + dK, dV 64 registers, which ptxas fits only in the NEXT kernels). */
  static_assert(EARLY_DV ? D == 128 || NEXT : D == 64, "EARLY_DV: always at D = 128, with NEXT only at D = 64");
  static_assert(!EARLY_S || (NEXT && D == 64), "EARLY_S: NEXT's Sᵀ issued earlier, where the registers allow it");
  static_assert((D == 128 && (STAGES == 2 || STAGES == 3)) || (D == 64 && STAGES == 2),
                "the shared-memory budgets above");
  constexpr uint32_t DQ_TILE_BYTES = FC_BWD_DQ_TILE * NQ * 4; /* 64 rows × NQ columns, fp32 */
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2; /* one buffer of sdS: dSᵀ, Bc keys × Br queries */
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
  const uint32_t sdQ = sdS + 2 * DS_BYTES; /* one DQ_TILE_BYTES tile per consumer warpgroup */
  const uint32_t sLD = sdQ + 2 * DQ_TILE_BYTES, bars = sLD + STAGES * 2 * ROWS_BYTES;
  const uint32_t kv_full = bars;
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))

  /* Which tile (fc_hpb_tile_of_cta, as the first version). */
  fc_hpb_tile ti;
  if (!fc_hpb_tile_of_cta<BR>(a, &ti)) return; /* the whole CTA, before any barrier */
  const int hk = ti.hk, q_start = ti.q_start, k_start = ti.k_start, sk = ti.sk, k0 = ti.k0, bt = ti.bt;
  const int i_begin = ti.i_begin, n_i = ti.n_i, n_iter = ti.n_iter;
  const int64_t pad0 = ti.pad0, shift = ti.shift;

  if (threadIdx.x == 0) {
    fc_hpb_init_barriers<STAGES>(bars);
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */

  if (threadIdx.x < 128) {
    /* ---- producer: the first version's (fc_hpb_produce) ---------------------------------------------- */
    fc_setmaxnreg_dec<FC_HPB_REGS_PRODUCER>();
    if (threadIdx.x == 0 && n_iter > 0)
      fc_hpb_produce<D, BR, STAGES>(&tm_q, &tm_k, &tm_v, &tm_do, a, sK, sV, sQ, sdO, sLD, bars, hk, bt, k_start, k0,
                                    q_start, pad0, i_begin, n_i, n_iter);
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    fc_setmaxnreg_inc<FC_HPB_REGS_CONSUMER>();
    /* The warpgroup index through a shuffle: provably warp-uniform (descriptors in uniform registers). */
    const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
    const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t = lane % 4;
    const uint32_t k_rows = sK + 64 * cw * FC_HPB_ROW_BYTES; /* this warpgroup's 64 keys (in each half) */
    const uint32_t v_rows = sV + 64 * cw * FC_HPB_ROW_BYTES;
    /* dQ's B: columns 64·cw .. of K_j (D = 64: all of them), all 128 keys */
    const uint32_t k_cols = ROWSPLIT ? sK : sK + cw * FC_HPB_KV_HALF;
    const int key0 = k0 + 64 * cw + 16 * warp + g; /* this thread's keys: key0, key0 + 8 */
    const float c = a.scale_log2;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int x = 0; x < D / 2; x++) dk[x] = dv[x] = 0.0f;
    /* The zeros are in dK's and dV's registers before block 0's Sᵀ is issued (NEXT): without this the compiler
     * sinks the moves below that issue, into a wgmma's flight (a precaution against C7515, which forbids
     * non-wgmma definitions of accumulator registers there; the cause of the C7515 met here was the loop-top
     * wait below). */
    fc_fence_regs(dk);
    fc_fence_regs(dv);
    if (n_iter > 0) fc_mbar_wait(kv_full, 0); /* K_j, V_j have landed */

    float st[BR / 2], dpt[BR / 2];
    if (NEXT && n_iter > 0) { /* block 0's Sᵀ */
      fc_mbar_wait(FULL(0), 0);
      if constexpr (BIAS) fc_hpb_bias_init<BR, true, BIAS == 1>(st, dpt, sLD, sLD + BR * 4, 1.0f / c, t);
      fc_wgmma_fence();
      fc_hp_ss_kmajor<T, D, BR, !BIAS>(st, k_rows, sQ);
      fc_wgmma_commit();
    }
    /* Every path through the body commits the same groups in the same order (no test of `it` around an issue
     * or a wait): ptxas must see which groups each wait retires, else it adds waits (C7517) or serialises
     * (C7514). */
    if constexpr (LAG) {
      /* Block 0 has no dQ of a block before it to issue (its own comes in block 1), the tail the last block's */
      if (n_iter > 0) {
        if (LAG == 2 && cw == 1) fc_named_barrier_arrive_if(FC_HPB_BAR_TURN, 256, true); /* warpgroup 0 goes first */
        fc_hpb_v2_block<T, STAGES, NEXT, D, EARLY_S, EARLY_DV, false, LAG, true, BIAS>(
            a, 0, 0, n_iter, n_i, i_begin, hk, pad0, k0, key0, sk, shift, c, cw, ct, warp, g, t, sQ, sdO, sdS, sdQ, sLD,
            bars, k_rows, v_rows, k_cols, st, dpt, dk, dv);
        for (int it = 1; it < n_iter; it++)
          fc_hpb_v2_block<T, STAGES, NEXT, D, EARLY_S, EARLY_DV, false, LAG, false, BIAS>(
              a, it, it, n_iter, n_i, i_begin, hk, pad0, k0, key0, sk, shift, c, cw, ct, warp, g, t, sQ, sdO, sdS, sdQ,
              sLD, bars, k_rows, v_rows, k_cols, st, dpt, dk, dv);
        fc_hpb_v2_lag_tail<T, D>(a, n_iter - 1, n_i, i_begin, hk, pad0, cw, ct, warp, g, t, sdS, sdQ, k_cols);
      }
    } else {
      for (int it = 0; it < n_iter; it++)
        fc_hpb_v2_block<T, STAGES, NEXT, D, EARLY_S, EARLY_DV, false, 0, false, BIAS>(
            a, it, it, n_iter, n_i, i_begin, hk, pad0, k0, key0, sk, shift, c, cw, ct, warp, g, t, sQ, sdO, sdS, sdQ,
            sLD, bars, k_rows, v_rows, k_cols, st, dpt, dk, dv);
    }
    if constexpr (NEXT) { /* the discarded Sᵀ */
      fc_wgmma_wait<0>();
      fc_fence_regs(st);
    }
    /* The CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
    if (ct == 0) fc_bulk_wait<0>();

    uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti);
    uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti);
    static_assert(2 * STAGES * Q_BYTES >= 2 * 2 * 64 * D * 2, "the stage ring holds both warpgroups' dK, dV tiles");
    fc_hpb_store_dkdv<T, D>(dk, dv, sQ, a, dK, dV, k0, sk, cw, ct);
  }
#undef FULL
#undef EMPTY
#endif /* FC_HOPPER_ARCH */
}

/* ---- the persistent version (FLASHC_HOPPER_BWD_PERSIST = 1, opt-in; verified on the H100 in session 10) ------------
 * One CTA per SM (grid = min(SMs, tiles)) walking hopper_sched.cuh's order, with a tile = (key block jb, kv head hk,
 * sequence b): the forward's query block mb is our key block jb = n_blocks − 1 − mb. The host sets one (sequence,
 * kv head) pair per group (FLASHC_HOPPER_BWD_SCHED stride, dynamic), so the order is the single-tile kernel's, key
 * block 0 of pair 0, key block 1 of pair 0, ...: the CTAs at work share one pair's Q_i, dO_i and dQ_i rows in L2 (the
 * forward's larger groups, `grouped`, cost 20–25 points of L2 hit rate). Static (stride): CTA x takes tiles x,
 * x + grid, ...; dynamic: after the last fill of each tile the producer claims the next position (fc_hp_claim) and
 * hands it to the consumers through the tile ring, which take it after the tile's epilogue (fc_hp_take): greedy,
 * as the hardware hands out the single-tile kernel's CTAs, which matters with a causal mask (tiles of unequal length).
 * Per tile: the k0 ≥ sk tiles (past a shorter sequence of a varlen batch) are skipped by everyone (nothing to store);
 * the tiles that no query block sees (n_iter = 0) load nothing and store zeros for dK, dV. Protocol (BWD-NOTES.md,
 * "Persistent backward"): the ring of Q/dO stages is numbered across the CTA's tiles (fill `ring`: stage ring % STAGES,
 * parity (ring / STAGES) & 1); kv_full's phase n is the n-th loaded tile's K_j, V_j; kv_empty's phase n is every
 * consumer thread past its last wgmma that reads that K_j, V_j; the producer loads tile n + 1's K, V after phase n of
 * kv_empty, but fills its first STAGES − 1 stages before that wait. dK, dV are staged through sdS (the ring is being
 * refilled): fc_hpb_store_dkdv's 256-thread barrier first (both warpgroups' dQ wgmmas, sdS's last readers, retired),
 * and one more after the stores (every staging read done before the next tile's dSᵀ writes). */
#if FC_HOPPER_ARCH
/* Tile `t` of the persistent kernel's schedule; false: k0 ≥ sk (nothing to do). */
template <int BR>
static __device__ __forceinline__ bool fc_hpb_tile_at(const fc_hopper_bwd_args &a, const fc_hp_sched &sc, int t,
                                                      fc_hpb_tile *ti) {
  int mb, bh;
  fc_hp_tile_at(sc, t, &mb, &bh);
  return fc_hpb_tile_from<BR>(a, a.n_blocks - 1 - mb, bh, ti);
}

#endif /* FC_HOPPER_ARCH */

/* The persistent fc_hopper_bwd_v2_kernel (same template parameters; built for the defaults only: D = 64 <2, false,
 * 64, false, false>, D = 128 <2, true, 128, false, true>). Shared memory: the single-tile kernel's + kv_empty (8
 * bytes). */
template <typename T, int STAGES, bool NEXT, int D, bool EARLY_S, bool EARLY_DV>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_v2p_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                             const fc_hopper_bwd_args a, const fc_hp_sched sc) {
#if FC_HOPPER_ARCH
  constexpr int BR = D == 64 ? 128 : FC_HPB_BR;
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : D / 2;
  static_assert(EARLY_DV ? D == 128 || NEXT : D == 64, "EARLY_DV: always at D = 128, with NEXT only at D = 64");
  static_assert(!EARLY_S || (NEXT && D == 64), "EARLY_S: NEXT's Sᵀ issued earlier, where the registers allow it");
  static_assert((D == 128 && (STAGES == 2 || STAGES == 3)) || (D == 64 && STAGES == 2),
                "the shared-memory budgets above");
  constexpr uint32_t DQ_TILE_BYTES = FC_BWD_DQ_TILE * NQ * 4;
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2;
  /* The epilogue's staging in sdS: both warpgroups' dK and dV tiles at D = 64 (4 × 8 KB of 64 KB), one 16 KB tile
   * per warpgroup at D = 128 (2 × 16 KB of 32 KB: dK, then dV). */
  constexpr bool ONE_AT_A_TIME = 4 * 64 * D * 2 > 2 * DS_BYTES;
  static_assert((ONE_AT_A_TIME ? 2 : 4) * 64 * D * 2 <= 2 * DS_BYTES, "sdS holds the epilogue's tiles");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
  const uint32_t sdQ = sdS + 2 * DS_BYTES;
  const uint32_t sLD = sdQ + 2 * DQ_TILE_BYTES, bars = sLD + STAGES * 2 * ROWS_BYTES;
  const uint32_t kv_full = bars, kv_empty = bars + 8u * (1 + 2 * STAGES);
  const uint32_t tring = kv_empty + 8u; /* the dynamic order's tile ring (hopper_sched.cuh; unused by stride) */
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))

  if (threadIdx.x == 0) {
    fc_hpb_init_barriers<STAGES>(bars);
    fc_mbar_init(kv_empty, 32 * FC_HPB_CONSUMER_WARPS); /* one arrival per consumer thread */
#pragma unroll
    for (int e = 0; e < FC_HP_TILE_RING; e++) {
      fc_mbar_init(tring + 8u * e, 1);                                         /* the producer's claim */
      fc_mbar_init(tring + 8u * (FC_HP_TILE_RING + e), FC_HPB_CONSUMER_WARPS); /* every consumer warp took it */
    }
    fc_mbar_fence_init();
  }
  __syncthreads();

  if (threadIdx.x < 128) {
    /* ---- producer ------------------------------------------------------------------------------------ */
    fc_setmaxnreg_dec<FC_HPB_REGS_PRODUCER>();
    if (threadIdx.x == 0) {
      fc_tma_prefetch_map(&tm_q);
      fc_tma_prefetch_map(&tm_k);
      fc_tma_prefetch_map(&tm_v);
      fc_tma_prefetch_map(&tm_do);
      int ring = 0, kv_n = 0; /* fills issued, K/V tiles loaded */
      uint32_t claims = 0;
      /* Static order: tiles blockIdx.x + k·grid. Dynamic: after the last fill of each tile (skipped ones too) the
       * next position is claimed and handed to the consumers (−1: none left). */
      for (int64_t t = blockIdx.x; t >= 0 && t < sc.tiles;
           t = sc.claim ? fc_hp_claim(sc, tring, claims++) : t + gridDim.x) {
        fc_hpb_tile ti;
        if (!fc_hpb_tile_at<BR>(a, sc, (int)t, &ti) || ti.n_iter == 0) continue;
        /* The first STAGES − 1 fills wait only for releases of blocks before the last tile's last one, given while
         * that block runs: they go ahead of K, V, whose wait needs the whole last tile done. */
        const int pre = min(STAGES - 1, ti.n_iter);
        for (int it = 0; it < pre; it++)
          fc_hpb_fill<D, BR, STAGES>(&tm_q, &tm_do, a, sQ, sdO, sLD, bars, ti.hk, ti.bt, ti.q_start, ti.pad0,
                                     ti.i_begin, ti.n_i, it, ring + it);
        if (kv_n > 0) fc_mbar_wait(kv_empty, (kv_n - 1) & 1); /* the last tile's K_j, V_j are read */
        fc_hpb_load_kv<D>(&tm_k, &tm_v, sK, sV, kv_full, ti.hk / a.kv_split, ti.bt, ti.k_start, ti.k0);
        for (int it = pre; it < ti.n_iter; it++)
          fc_hpb_fill<D, BR, STAGES>(&tm_q, &tm_do, a, sQ, sdO, sLD, bars, ti.hk, ti.bt, ti.q_start, ti.pad0,
                                     ti.i_begin, ti.n_i, it, ring + it);
        ring += ti.n_iter;
        kv_n++;
      }
    }
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    fc_setmaxnreg_inc<FC_HPB_REGS_CONSUMER>();
    const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
    const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t = lane % 4;
    const uint32_t k_rows = sK + 64 * cw * FC_HPB_ROW_BYTES;
    const uint32_t v_rows = sV + 64 * cw * FC_HPB_ROW_BYTES;
    const uint32_t k_cols = ROWSPLIT ? sK : sK + cw * FC_HPB_KV_HALF;
    const float c = a.scale_log2;
    int ring = 0, kv_n = 0; /* as the producer's */
    uint32_t takes = 0;
    /* The producer's sequence of tiles; dynamic: each warp takes the next after its tile's epilogue. */
    for (int64_t tile = blockIdx.x; tile >= 0 && tile < sc.tiles;
         tile = sc.claim ? fc_hp_take(tring, takes++, lane) : tile + gridDim.x) {
      fc_hpb_tile ti;
      if (!fc_hpb_tile_at<BR>(a, sc, (int)tile, &ti)) continue;
      const int k0 = ti.k0, sk = ti.sk, n_iter = ti.n_iter;
      const int key0 = k0 + 64 * cw + 16 * warp + g;

      float dk[D / 2], dv[D / 2];
#pragma unroll
      for (int x = 0; x < D / 2; x++) dk[x] = dv[x] = 0.0f;
      fc_fence_regs(dk);
      fc_fence_regs(dv);
      if (n_iter > 0) fc_mbar_wait(kv_full, kv_n & 1); /* this tile's K_j, V_j have landed */

      float st[BR / 2], dpt[BR / 2];
      if (NEXT && n_iter > 0) { /* block 0's Sᵀ */
        fc_mbar_wait(FULL(ring % STAGES), (ring / STAGES) & 1);
        fc_wgmma_fence();
        fc_hp_ss_kmajor<T, D, BR>(st, k_rows, sQ + (ring % STAGES) * Q_BYTES);
        fc_wgmma_commit();
      }
      for (int it = 0; it < n_iter; it++)
        fc_hpb_v2_block<T, STAGES, NEXT, D, EARLY_S, EARLY_DV, true>(
            a, it, ring + it, n_iter, ti.n_i, ti.i_begin, ti.hk, ti.pad0, k0, key0, sk, ti.shift, c, cw, ct, warp, g, t,
            sQ, sdO, sdS, sdQ, sLD, bars, k_rows, v_rows, k_cols, st, dpt, dk, dv);
      if constexpr (NEXT) { /* the discarded Sᵀ: it read sK and the last block's stage */
        fc_wgmma_wait<0>();
        fc_fence_regs(st);
      }
      if (n_iter > 0) {
        /* NEXT: the last block's stage (fc_hpb_v2_block left it to us); every wgmma of the tile has retired, so
         * K_j, V_j are free for the next tile's */
        if constexpr (NEXT) fc_mbar_arrive_if(EMPTY((ring + n_iter - 1) % STAGES), true);
        fc_mbar_arrive_if(kv_empty, true);
        ring += n_iter;
        kv_n++;
      }

      uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti);
      uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti);
      fc_hpb_store_dkdv<T, D, ONE_AT_A_TIME>(dk, dv, sdS, a, dK, dV, k0, sk, cw, ct);
      /* Every staging read of sdS is done before the next tile's first dSᵀ writes (the other warpgroup's too: its
       * dSᵀ rows and this warpgroup's staging tile share buffers) */
      fc_named_barrier(FC_HPB_BAR_DS_ALL, 256);
    }
    /* The CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
    if (ct == 0) fc_bulk_wait<0>();
  }
#undef FULL
#undef EMPTY
#endif /* FC_HOPPER_ARCH */
}

#endif /* FLASHC_CUDA_HOPPER_BWD_V2_CUH */
