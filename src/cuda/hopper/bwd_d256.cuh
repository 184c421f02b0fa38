/* hopper/bwd_d256.cuh — cuda-hopper's dK/dV kernel at head dim 256 (d in 129 .. 256; docs/hopper.md,
 * "The D = 256 kernel (WHOLE + EDV)"; verified on the H100: commit 4f55121). Included by hopper/bwd_launch.cuh only,
 * after its device helpers (fc_hpb_*), whose Pᵀ pass, dQ wgmma chain, bulk dQ tile add, dK/dV tile store, blocked dQ
 * sum and row passes it shares.
 *
 * Why not fc_hopper_bwd_det_kernel at D = 256: with Bc = 128 keys and each consumer warpgroup owning 64 keys × all D
 * columns, dK and dV alone are 2 × 64 × 256 fp32 per warpgroup = 256 registers per thread; and sK + sV (128 KB) + one
 * Q/dO stage (64 KB) + sdS + sdQ pass 227 KB. So (FlashAttention-3's hdim-256 backward has the same pressure: Br = 64,
 * Bc = 80, dK/dV "swapAB" so that each warpgroup's accumulators hold a slice of the head dim; our shapes differ):
 *
 * One CTA per key block K_j, V_j of Bc = 64 keys (one kv head of one sequence); query blocks of Br = 64 rows; 384
 * threads: warpgroup 0 the producer (one thread issues every copy), warpgroups 1, 2 the consumers c = 0, 1. Each
 * consumer computes one whole product of the block's first two, the descriptors chosen by c so that both run the same
 * wgmma code, and the later products are split by head-dim columns, so that no fp32 tile is held twice:
 *   c = 0:  Sᵀ  = K_j·Q_iᵀ   64 keys × 64 queries, m64n64k16 SS, K-major both, 16 k-steps; Pᵀ = 2^(c·Sᵀ − lse2_i)
 *           (fc_hpb_p_pass at Br = 64, masked only where the 64 × 64 block is cut) → sP [it % 2]
 *   c = 1:  dPᵀ = V_j·dO_iᵀ  the same shape; after named barrier P, Pᵀ read back from sP (16 bits, the values dV
 *           uses), dSᵀ = Pᵀ∘(dPᵀ − D_i) → sdS [it % 2]
 *   dV_j[:, 128c ..] += Pᵀ·dO_i[:, 128c ..]    64 keys × 128 columns, m64n128k16 SS: A = sP K-major (a row per key,
 *   dK_j[:, 128c ..] += dSᵀ·Q_i[:, 128c ..]    the queries contiguous), B = dO_i / Q_i MN-major (imm-trans-b = 1,
 *                                              fc_wgmma_ss_tb), 4 k-steps of 16 queries
 *   dQ_i[:, 128c + 64h ..] = dS·K_j[:, ...]    h = 0, 1: 64 queries × 64 columns, m64n64k16 SS both MN-major
 *                                              (fc_hpb_dq: A = sdS read as dS, B = K_j), 4 k-steps of 16 keys;
 *                                              each 64 × 64 fp32 product into the warpgroup's sdQ tile and one bulk
 *                                              reduce-add (fc_hpb_dq_tile_add) into the blocked fp32 sum (w = 64)
 * wgmma's operand rules decide the shapes: A from registers must be K-major, so Pᵀ/dSᵀ as A of dV/dK would have to be
 * in registers with the keys as rows, i.e. a warpgroup would need all Br queries of its keys; from shared memory A may
 * be K- or MN-major and B either (16-bit types). sdS is read K-major as dSᵀ (A of dK: M = keys) and MN-major as dS (A
 * of dQ: M = queries), the same bytes (the 128-byte swizzle of a row per key). Tensor work per block and CTA: 5
 * products of 64·64·256 multiply-adds, none duplicated. Sᵀ and dPᵀ whole at N = 64 read A 2 KB + B 2 KB of shared
 * memory per 32 tensor cycles, the ~128 bytes per cycle it serves (split by queries at N = 32 they read 192 and ran
 * tensor 38–43 % busy, shared memory 68–79 %, Nsight Compute). The work is uneven: warpgroup 0 does the exponentials,
 * warpgroup 1 the cheaper dSᵀ but only after Pᵀ.
 *
 * Registers per consumer thread (setmaxnreg 240; producer 24: 128·24 + 256·240 = 64512 ≤ 65536): dK, dV 64 + 64
 * (64 × 128 fp32 each over 128 threads), one 32-register tile (Sᵀ/Pᵀ or dPᵀ/dSᵀ), the two dQ halves 32 + 32; the peak
 * is dK, dV, dQ_1 and the next block's tile in flight: 64 + 64 + 32 + 32 = 192 accumulators + addresses. ptxas (nvcc
 * 13.0, sm_90a): 0 spills, no C75xx advisory, 48 HGMMA (16 + 16 × 64x64x16 for the product before the loop and in
 * it, 16 for dV, dQ, dK).
 *
 * Shared memory (1024-byte aligned tiles, 64-column halves of 128-byte rows, 128-byte swizzle):
 *   sK, sV   [4][64][64]        32 KB each   K_j, V_j (A of Sᵀ, dPᵀ K-major; K_j also B of dQ, MN-major)
 *   sQ       [2][4][64][64]     64 KB        Q_i, 2 stages (B of Sᵀ K-major, of dK MN-major)
 *   sdO      [4][64][64]        32 KB        dO_i, 1 stage (B of dPᵀ K-major, of dV MN-major)
 *   sP, sdS  [2] × [64][64]     2 × 16 KB    Pᵀ, dSᵀ of block i in buffer i % 2: a row per key, the 64 queries
 *                                            contiguous, swizzled by hand
 *   sdQ      [2][64][64] fp32   32 KB        one 64 × 64 dQ tile per consumer warpgroup (fc_bwd_dq_blocked_index)
 *   sLse     [2][64] fp32, sDsum [64] fp32   lse2_i (with Q_i's stage), D_i (with dO_i)
 *   7 mbarriers, + 1 KB alignment slack: 231224 bytes (the H100 allows 232448). A second dO stage (+32 KB) does not
 *   fit; Q gets two because it lives longest (Sᵀ at the start of a block, dK at its end), dO's stage is released in the
 *   middle (after dV), so the next dO streams in while dQ and dK run (FlashAttention-3's choice at this head dim).
 *   sP, sdS are double-buffered (16 KB) so that one 256-thread barrier per block suffices; without that, 214840 bytes
 *   and a second barrier before the writes. One dQ tile per warpgroup (not two, not one 64 × 128): two would need
 *   32 KB more. The epilogue stages dK, dV (2 warpgroups × 2 × 64 × 128 × 2 bytes = 64 KB) in the Q ring.
 *
 * 192/128 (head_dim 129..192 with head_dim_v 65..128: DeepSeek's pair; NQ = 3, NV = 2 halves): the same protocol and
 * order on the halves the pair has. sK and each Q stage hold 3 halves (24 KB), sV and sdO 2 (16 KB): 173880 bytes.
 * Warpgroup 0's Sᵀ takes 12 k-steps, warpgroup 1's dPᵀ 8; dV is split 64 + 64 columns (m64n64k16), dK's three halves
 * 2 + 1 and dQ's 1 + 2 (warpgroup 0 + 1), 28 and 24 m64n64k16 steps per block and warpgroup against 40 at 256/256.
 * Warpgroup 0's second dQ group is empty (committed all the same, so that every wait retires the groups it does at
 * 256/256) and so is its second bulk add. The epilogue stages 128 + 64 and 64 + 64 columns of dK, dV (40 KB).
 *
 * Per block it (query head hh, query block q0) and consumer warpgroup c (groups pending after each wait on the right):
 *   wait 0 → X_c (Sᵀ or dPᵀ, issued by the last trip or before the loop)                           []
 *   c = 0: Pᵀ → sP; fence.proxy.async; bar.arrive P (256); 128-thread barrier of its own (all its threads' stores
 *          precede its wgmma); wait do_full (dO_i, for dV)
 *   c = 1: bar.sync P (256)
 *   dV issued                                                                                       [dV]
 *   c = 1: dSᵀ from sP and dPᵀ → sdS, beside its dV
 *   wait 0 → dV; release dO_i, D_i (do_empty); c = 1: wait q_full[it % 2] (Q_i, for dK); fence.proxy.async
 *   thread 0 of c: wait for the read of c's last bulk dQ add (sdQ is rewritten after the barrier)
 *   B: 256-thread barrier (all of Pᵀ, dSᵀ in shared memory)
 *   dQ_0, dQ_1, dK issued (three groups)
 *   wait 2 → dQ_0; dQ_0 → sdQ, bulk add                                                             [dQ_1, dK]
 *   c = 0: wait q_full of block it + 1, issue its Sᵀ; c = 1: wait do_full of block it + 1, issue its
 *   dPᵀ (the last block: its own again, discarded, so that every trip commits the same groups)      [dQ_1, dK, X_c]
 *   wait 2 → dQ_1; thread 0: wait for dQ_0's bulk read; warpgroup barrier; dQ_1 → sdQ, bulk add     [dK, X_c]
 *   wait 1 → dK; release Q_i, lse2_i (q_empty[it % 2])                                              [X_c]
 * After the loop: wait 0 for the discarded product; wait for the bulk adds; 256-thread barrier; scale·dK, dV → the Q
 * ring → global (16-byte chunks).
 * dV is issued before B (dV_j += Pᵀ·dO_i reads sP and dO_i only), so that each warpgroup releases dO_i before B and
 * the producer refills the single dO buffer a dV and a dQ_0 earlier than with dV after B (warpgroup 1's next dPᵀ
 * waits for that fill): +0.9..2.0 % (H100, bf16, three A/B runs at d256 2k-8k causal and 4k full,
 * bench/results/configs/hopper-bwd-d256-edv-2026-11-24.txt).
 * Buffer it % 2 of sP, sdS is free when block it writes it: its last readers, block it − 2's dV (retired before B of
 * block it − 2), dQ and dK wgmmas of both warpgroups, retired before their warpgroup arrived at barrier B of block
 * it − 1, which the writer has passed. The same barrier orders the sdQ tile (its bulk reader waited for before the
 * issuing thread arrives there, the tile rewritten after it); within a block the warpgroup's own barrier does, after a
 * second wait for the read. The next block's Sᵀ reads Q stage (it + 1) % 2, not the stage block it releases (the last
 * block's discarded Sᵀ reads its own stage, which no fill follows).
 * Barrier P (named barrier 4): 128 arrivals (bar.arrive, warpgroup 0: it goes on without waiting) + 128 (bar.sync,
 * warpgroup 1); bar.arrive orders warpgroup 0's generic writes of sP before warpgroup 1's reads after its bar.sync
 * (FlashAttention-3's dQ hand-over uses the same pair). Warpgroup 0 cannot arrive at P of block it + 1 before
 * warpgroup 1 passed P of block it: in between it passes B of block it, which warpgroup 1 reaches after P. sP [it % 2]
 * is rewritten (block it + 2) only after B of block it + 1, which warpgroup 1 reaches after its reads of block it.
 *
 * Barrier protocol (mbarriers; "every consumer thread" = 256 arrivals, because each thread's generic reads of the
 * lse2/D rows must be done before the copy engine overwrites them, racecheck's lesson of the first kernel):
 *   kv_full      1 arrival (producer's expect_tx) + the K_j, V_j bytes; consumers wait parity 0 once
 *   q_full[s]    1 + the bytes of Q_i and lse2_i; use u of stage s (block it = 2u + s) waits parity u & 1
 *   q_empty[s]   256; every consumer thread after its wait for dK of block it; the producer waits parity (u − 1) & 1
 *                before fill u ≥ 1 of stage s
 *   do_full      1 + the bytes of dO_i and D_i; block it waits parity it & 1
 *   do_empty     256; every consumer thread after its wait for dV of block it; the producer waits parity
 *                (it − 1) & 1 before the dO fill of block it ≥ 1
 * Named barriers: 3 (256 threads, B above and the epilogue's), 1 + c (128, the dQ tile hand-overs of c, and warpgroup
 * 0's own before its dV), 4 (P).
 * Each warpgroup waits for both fills it reads (its own product's, and Q_i for dK, dO_i for dV): the other
 * warpgroup's wait would order the data too (through B), but each reader keeps its own acquire of the fill's barrier.
 * Deadlock-freedom: the producer waits only for releases of earlier fills (before Q of block it: q_empty of block
 * it − 2; before dO of block it: do_empty of block it − 1), and each release is given after waits that need only
 * fills the producer issued before that wait; warpgroup 1's early wait on dO_{i+1} needs only do_empty of block it
 * (released by both before) and q_empty of block it − 1. Consumers wait on fills, their own wgmma groups and bulk
 * reads, and on named barriers that both consumer warpgroups reach equally often (same n_iter, same trips, no early
 * exit after the first barrier); a CTA past the sequence's keys returns before any barrier, a CTA no query block sees
 * (n_iter = 0) loads nothing and stores zeros. Every fill is consumed, so no copy is in flight at exit. Phases cannot
 * be confused: a barrier's phase n + 1 cannot complete before every waiter of phase n has passed it, since its
 * arrivals (releases or fills) come only after those waits. tests/models/bwd_d256_model.py checks these orders under
 * random interleavings, tools/hopper/bwd_d256_layout.py the index arithmetic.
 *
 * Its timeline (tools/hopper/trace_bwd.py, d256 4k full, ~5800 cycles a block): the two dQ tile adds take ~850-930
 * cycles each per warpgroup, the next block's issue ~1000 (the tensor pipe is busy then), warpgroup 0's exponentials
 * ~600 and warpgroup 1's dSᵀ ~700 with little tensor work beside them. The orders that lost (the products split by
 * queries, with and without the next block's Sᵀ issued early; dV after B), dQ added from registers by red.global.add.v4
 * (0.70-0.75×: each add took 1700-2500 cycles) and block it's dK issued at the top of block it + 1 (within 0.4 %: the
 * exponentials slowed by as much; commit 4f55121's message) are rows of docs/experiments.md; the orders' code is at
 * commit d79fa1c. */
#ifndef FLASHC_CUDA_HOPPER_BWD_D256_CUH
#define FLASHC_CUDA_HOPPER_BWD_D256_CUH

enum {
  FC_HPB256_D = 256,
  FC_HPB256_BR = 64,                                       /* query rows per block */
  FC_HPB256_BC = 64,                                       /* keys per CTA */
  FC_HPB256_BAR_P = 4,                                     /* named barrier P: warpgroup 0's Pᵀ is in sP */
  FC_HPB256_HALF = 64 * FC_HPB_ROW_BYTES,                  /* one 64-column half of a 64-row tile: 8 KB */
  FC_HPB256_PS = 64 * FC_HPB_ROW_BYTES,                    /* sP or sdS: 64 keys × 64 queries × 2 bytes */
  FC_HPB256_DQ_W = 64,                                     /* columns of a tile of the blocked dQ sum */
  FC_HPB256_DQ_TILE = FC_BWD_DQ_TILE * FC_HPB256_DQ_W * 4, /* 16 KB */
  FC_HPB256_ROWS = FC_HPB256_BR * 4,                       /* lse2_i or D_i: 256 bytes */
  FC_HPB256_OUT_TILE = 64 * 128 * 2,                       /* epilogue: one warpgroup's dK or dV, 16 bits */
};

/* Shared memory of the kernel with NQ 64-column halves in Q_i, K_j and NV in V_j, dO_i: sK, sV, sQ ×2, sdO,
 * (sP, sdS) ×2, sdQ ×2, lse2 ×2, D, 7 barriers, slack. 231224 bytes at 256/256, 173880 at 192/128. */
static constexpr size_t fc_hpb256_smem(int nq, int nv) {
  return (size_t)(3 * nq + 2 * nv) * FC_HPB256_HALF + 4 * FC_HPB256_PS + 2 * FC_HPB256_DQ_TILE + 3 * FC_HPB256_ROWS +
         7 * 8 + 1024;
}

#if FC_HOPPER_ARCH
/* The producer thread: K_j, V_j once, then per block `it` of the (query head, query block) pairs (head-major) Q_i and
 * lse2_i into stage it % 2 of the Q ring and dO_i, D_i into the single dO buffer (the header's protocol). */
template <int NQ, int NV>
static __device__ __forceinline__ void
fc_hpb256_produce(const CUtensorMap *tm_q, const CUtensorMap *tm_k, const CUtensorMap *tm_v, const CUtensorMap *tm_do,
                  const fc_hopper_bwd_args &a, uint32_t sK, uint32_t sV, uint32_t sQ, uint32_t sdO, uint32_t sLse,
                  uint32_t sDsum, uint32_t bars, int hk, int bt, int k_start, int k0, int q_start, int64_t pad0,
                  int i_begin, int n_i, int n_iter) {
  const uint32_t kv_full = bars, do_full = bars + 8u * 5, do_empty = bars + 8u * 6;
  fc_tma_prefetch_map(tm_q);
  fc_tma_prefetch_map(tm_k);
  fc_tma_prefetch_map(tm_v);
  fc_tma_prefetch_map(tm_do);
  fc_mbar_arrive_expect_tx(kv_full, (NQ + NV) * FC_HPB256_HALF);
#pragma unroll
  for (int hf = 0; hf < (NQ > NV ? NQ : NV); hf++) {
    if (hf < NQ) fc_tma_load_4d(sK + hf * FC_HPB256_HALF, tm_k, 64 * hf, k_start + k0, hk / a.kv_split, bt, kv_full);
    if (hf < NV) fc_tma_load_4d(sV + hf * FC_HPB256_HALF, tm_v, 64 * hf, k_start + k0, hk / a.kv_split, bt, kv_full);
  }
  int h0, nh; /* the part's query heads (common/gqa.cuh) */
  fc_gqa_part_heads(hk, a.group, a.kv_split, &h0, &nh);
  for (int it = 0; it < n_iter; it++) {
    const int s = it & 1, u = it >> 1;
    const uint32_t q_full = bars + 8u * (1 + s), q_empty = bars + 8u * (3 + s);
    const int hh = h0 + it / n_i, q0 = (i_begin + it % n_i) * FC_HPB256_BR;
    /* Padded row buffers: rows q0 .. q0 + 63 exist and start 256-byte aligned (fc_hpb_produce says why). */
    const int64_t at = (int64_t)hh * a.total_pad + pad0 + q0;
    FC_HPB_MARK_AT(0, it, 0);
    if (u > 0) fc_mbar_wait(q_empty, (u - 1) & 1); /* block it − 2 is done with this stage */
    FC_HPB_MARK_AT(0, it, 1);
    fc_mbar_arrive_expect_tx(q_full, NQ * FC_HPB256_HALF + FC_HPB256_ROWS);
#pragma unroll
    for (int hf = 0; hf < NQ; hf++)
      fc_tma_load_4d(sQ + s * NQ * FC_HPB256_HALF + hf * FC_HPB256_HALF, tm_q, 64 * hf, q_start + q0, hh, bt, q_full);
    fc_hpb_bulk_load(sLse + s * FC_HPB256_ROWS, a.lse2 + at, FC_HPB256_ROWS, q_full);
    FC_HPB_MARK_AT(0, it, 2);
    if (it > 0) fc_mbar_wait(do_empty, (it - 1) & 1); /* block it − 1 is done with dO (after its dV) */
    FC_HPB_MARK_AT(0, it, 3);
    fc_mbar_arrive_expect_tx(do_full, NV * FC_HPB256_HALF + FC_HPB256_ROWS);
#pragma unroll
    for (int hf = 0; hf < NV; hf++)
      fc_tma_load_4d(sdO + hf * FC_HPB256_HALF, tm_do, 64 * hf, q_start + q0, hh, bt, do_full);
    fc_hpb_bulk_load(sDsum, a.dsum + at, FC_HPB256_ROWS, do_full);
  }
}

/* acc (64 keys × N queries) = A·Bᵀ over the head dim, 4·H k-steps (H halves): A = K_j or V_j (64 rows, halves 8 KB
 * apart), B = the N = 64 rows of Q_i or dO_i (b_rows). Both K-major; step kk reads columns 16·kk .., 32·(kk % 4)
 * bytes into the rows of half kk / 4. */
template <typename T, int N, int H = 4>
static __device__ __forceinline__ void fc_hpb256_s_chain(float (&acc)[N / 2], uint32_t a_tile, uint32_t b_rows) {
#pragma unroll
  for (int kk = 0; kk < 4 * H; kk++) {
    const uint32_t off = (kk / 4) * FC_HPB256_HALF + (kk % 4) * 32;
    const uint64_t da = fc_wgmma_desc_off(a_tile, off, 16, 1024), db = fc_wgmma_desc_off(b_rows, off, 16, 1024);
    if (kk == 0)
      fc_wgmma_ss_zero<T, N>(acc, da, db);
    else
      fc_wgmma_ss<T, N>(acc, da, db);
  }
}

/* A consumer warpgroup's first product of a block (the header's X_c): warpgroup 0's Sᵀ = K_j·Q_iᵀ (q: Q_i's stage)
 * in 4·NQ k-steps, warpgroup 1's dPᵀ = V_j·dO_iᵀ in 4·NV; with equal head dims one chain whose operands the warpgroup
 * picks. */
template <typename T, int NQ, int NV>
static __device__ __forceinline__ void fc_hpb256_x(float (&acc)[FC_HPB256_BR / 2], int cw, uint32_t sK, uint32_t sV,
                                                   uint32_t q, uint32_t sdO) {
  if constexpr (NQ == NV)
    fc_hpb256_s_chain<T, FC_HPB256_BR, NQ>(acc, cw ? sV : sK, cw ? sdO : q);
  else if (cw)
    fc_hpb256_s_chain<T, FC_HPB256_BR, NV>(acc, sV, sdO);
  else
    fc_hpb256_s_chain<T, FC_HPB256_BR, NQ>(acc, sK, q);
}

/* acc (64 keys × N columns) += A·B over the 64 queries of the block, 4 k-steps of 16: A = sP or sdS K-major (a row
 * of 128 bytes per key; step kb 32·kb bytes into it), B = N columns of dO_i or Q_i from b_cols (a half of the tile)
 * MN-major, N = 128 spanning two halves (leading offset 8 KB) or N = 64, step kb at rows 16·kb (2048·kb bytes), as
 * fc_hpb_dkdv's B. */
template <typename T, int N = 128>
static __device__ __forceinline__ void fc_hpb256_kv_chain(float (&acc)[N / 2], uint32_t a_rows, uint32_t b_cols) {
#pragma unroll
  for (int kb = 0; kb < FC_HPB256_BR / 16; kb++)
    fc_wgmma_ss_tb<T, N>(acc, fc_wgmma_desc_off(a_rows, kb * 32, 16, 1024),
                         fc_wgmma_desc_off(b_cols, kb * 16 * FC_HPB_ROW_BYTES, FC_HPB256_HALF, 1024));
}

/* This thread's 16-bit pairs of a 64 keys × N = 64 queries fragment (queries 8x + 2t, + 1 of keys 16·warp + g +
 * 8·rh) into `tile` (sP or sdS), swizzled as TMA would write a 128-byte-swizzled tile: 16-byte chunk x of row r at
 * r·128 + ((x ^ r % 8)·16); this thread's rows have r % 8 = g. */
template <typename T, int N>
static __device__ __forceinline__ void fc_hpb256_store_ps(const float (&f)[N / 2], uint32_t tile, int warp, int g,
                                                          int t) {
#pragma unroll
  for (int x = 0; x < N / 8; x++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * warp + g + 8 * rh;
      fc_st_shared_u32(tile + r * FC_HPB_ROW_BYTES + ((x ^ g) << 4) + 4 * t,
                       fc_pack2<T>(f[4 * x + 2 * rh], f[4 * x + 2 * rh + 1]));
    }
}

/* dSᵀ = Pᵀ∘(dPᵀ − D_i) in place of dPᵀ (64 keys × 64 queries, this thread's fragment), Pᵀ read back from sP
 * where warpgroup 0 stored it (fc_hpb256_store_ps<T, 64>'s addresses: the same fragment, so each thread reads the
 * pairs it needs), D_i at sD (all 64 queries). Pᵀ comes back rounded to 16 bits (dV uses those values too); the other
 * kernels form dSᵀ from the fp32 Pᵀ. */
template <typename T>
static __device__ __forceinline__ void fc_hpb256_ds_whole(float (&dpt)[32], uint32_t sP, uint32_t sD, int warp, int g,
                                                          int t) {
#pragma unroll
  for (int x = 0; x < 8; x++) {
    const float2 dr = fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t));
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * warp + g + 8 * rh;
      uint32_t pp;
      asm volatile("ld.shared.b32 %0, [%1];\n"
                   : "=r"(pp)
                   : "r"(sP + r * FC_HPB_ROW_BYTES + ((x ^ g) << 4) + 4 * t)
                   : "memory");
      dpt[4 * x + 2 * rh] = fc_to_float<T>((uint16_t)(pp & 0xffffu)) * (dpt[4 * x + 2 * rh] - dr.x);
      dpt[4 * x + 2 * rh + 1] = fc_to_float<T>((uint16_t)(pp >> 16)) * (dpt[4 * x + 2 * rh + 1] - dr.y);
    }
  }
}

/* m·acc (64 keys × W columns, the wgmma accumulator layout) as 16 bits into `tile` for fc_hpb_store_tile<W>: row r at
 * r·2W bytes, 16-byte chunk x at (x ^ r % 8)·16. */
template <typename T, int W>
static __device__ __forceinline__ void fc_hpb256_stage(uint32_t tile, const float (&acc)[W / 2], float m, int warp,
                                                       int g, int t) {
#pragma unroll
  for (int rh = 0; rh < 2; rh++) {
    const int r = 16 * warp + g + 8 * rh;
#pragma unroll
    for (int x = 0; x < W / 8; x++)
      fc_st_shared_u32(tile + r * 2 * W + ((x ^ (r % 8)) << 4) + 4 * t,
                       fc_pack2<T>(m * acc[4 * x + 2 * rh], m * acc[4 * x + 2 * rh + 1]));
  }
}

#endif /* FC_HOPPER_ARCH */

/* The D = 256 dK/dV kernel (the header above): each consumer warpgroup one whole product at N = 64 (Sᵀ or dPᵀ),
 * dV issued before barrier B, the next block's product issued behind dQ_1 and dK. NQ, NV: the 64-column halves of
 * Q/K's and V's head dims, 4 and 4, or 3 and 2 for the pair 192/128 (the header's "192/128"). */
template <typename T, bool SCORE_MOD = false, bool ADD = false, bool DV_COLS = false, int NQ = 4, int NV = 4>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_d256_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                              const fc_hopper_bwd_args a) {
#if FC_HOPPER_ARCH
  constexpr int XN = FC_HPB256_BR; /* queries of this warpgroup's product (Sᵀ or dPᵀ): all of them */
  constexpr bool EVEN = NQ == 4 && NV == 4;
  static_assert(EVEN || (NQ == 3 && NV == 2 && DV_COLS && !SCORE_MOD), "256/256, or 192/128 (no score modifiers)");
  /* Each consumer warpgroup's share of the head-dim halves: dV VH each; dK KH0 (warpgroup 0, from half 0) and KH1
   * (warpgroup 1, after it); dQ QH0 (warpgroup 0, from half 0) and NQ − QH0 (warpgroup 1). At 192/128 warpgroup 0
   * takes dK's first two halves and dQ's first, warpgroup 1 the rest: 12 + 4 + 8 + 4 and 8 + 4 + 4 + 8 of m64n64k16's
   * k-steps per block (Sᵀ or dPᵀ, dV, dK, dQ). */
  constexpr int VH = NV / 2, KH0 = (NQ + 1) / 2, KH1 = NQ / 2, QH0 = NQ / 2;
  constexpr int TQ = NQ * FC_HPB256_HALF, TV = NV * FC_HPB256_HALF; /* K_j or Q_i, V_j or dO_i: 32 KB at 256 */
  static_assert(FC_BWD_ROWS_PAD % FC_HPB256_BR == 0, "a query block stays inside its sequence's padded rows");
  static_assert(fc_hpb256_smem(NQ, NV) <= 232448, "the H100's shared memory per block");
  static_assert(2 * TQ >= 64 * 2 * (64 * NQ + 64 * NV), "the Q ring holds both warpgroups' dK, dV tiles");
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* Aligned by hand to 1024 bytes (the swizzle pattern's period); the launch adds the slack. */
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + TQ, sQ = sV + TV, sdO = sQ + 2 * TQ;
  const uint32_t sPS = sdO + TV, sdQ = sPS + 4 * FC_HPB256_PS; /* sPS: [2] × (sP, sdS) */
  const uint32_t sLse = sdQ + 2 * FC_HPB256_DQ_TILE, sDsum = sLse + 2 * FC_HPB256_ROWS;
  const uint32_t bars = sDsum + FC_HPB256_ROWS;
  const uint32_t kv_full = bars, do_full = bars + 8u * 5, do_empty = bars + 8u * 6;
#define Q_FULL(s)  (bars + 8u * (1 + (s)))
#define Q_EMPTY(s) (bars + 8u * (3 + (s)))

  /* Which tile (fc_hpb_tile_of_cta, as fc_hopper_bwd_det_kernel, with Bc = 64; SCORE_MOD: cut to a boolean
   * attn_mask's query blocks). */
  fc_hpb_tile ti;
  if (!fc_hpb_tile_of_cta<FC_HPB256_BR, FC_HPB256_BC, SCORE_MOD>(a, &ti))
    return; /* the whole CTA, before any barrier */
  const int hk = ti.hk, q_start = ti.q_start, k_start = ti.k_start, sq = ti.sq, sk = ti.sk, k0 = ti.k0, bt = ti.bt;
  const int i_begin = ti.i_begin, n_i = ti.n_i, n_iter = ti.n_iter;
  const int64_t pad0 = ti.pad0, shift = ti.shift;

  if (threadIdx.x == 0) {
    fc_hpb_init_barriers<2>(bars); /* kv_full, q_full[2] (Q_FULL), q_empty[2] (Q_EMPTY): the same places */
    fc_mbar_init(do_full, 1);
    fc_mbar_init(do_empty, 32 * FC_HPB_CONSUMER_WARPS);
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */

  if (threadIdx.x < 128) {
    /* ---- producer ---------------------------------------------------------------------------------- */
    fc_setmaxnreg_dec<FC_HPB_REGS_PRODUCER>();
    if (threadIdx.x == 0 && n_iter > 0) {
      const fc_hpb_maps mp = fc_hpb_maps_of<!ADD>(a, ti, &tm_q, &tm_k, &tm_v, &tm_do); /* seqused: the sequence's own */
      fc_hpb256_produce<NQ, NV>(mp.q, mp.k, mp.v, mp.x, a, sK, sV, sQ, sdO, sLse, sDsum, bars, hk, bt, k_start, k0,
                                q_start, pad0, i_begin, n_i, n_iter);
    }
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    const auto [cw, ct, warp, lane, g, t] = fc_hpb_consumer();
    const int key0 = k0 + 16 * warp + g; /* this thread's keys: key0, key0 + 8 (every warpgroup: all 64 keys) */
    /* its columns of the head dims, as offsets into a tile: dV's, dK's and dQ's first half (256/256: 2c for all
     * three, its 128 columns) */
    const uint32_t dv_cols = cw * VH * FC_HPB256_HALF, dk_cols = cw * KH0 * FC_HPB256_HALF;
    const uint32_t dq_cols = cw * QH0 * FC_HPB256_HALF;
    const uint32_t dq_tile = sdQ + cw * FC_HPB256_DQ_TILE; /* its dQ tile */
    const float c = a.scale_log2;
    const int64_t wl = a.window_left, wr = a.window_right;

    float dk[32 * KH0], dv[32 * VH]; /* dK_j, dV_j: 64 keys × this warpgroup's columns (256/256: 128c .. 128c + 127) */
    float dk1[EVEN ? 1 : 32 * KH1];  /* 192/128: warpgroup 1's dK_j (64 keys × columns 128 .. 191); dk unused there */
#pragma unroll
    for (int x = 0; x < 32 * KH0; x++) dk[x] = 0.0f;
#pragma unroll
    for (int x = 0; x < 32 * VH; x++) dv[x] = 0.0f;
#pragma unroll
    for (int x = 0; x < (EVEN ? 1 : 32 * KH1); x++) dk1[x] = 0.0f;
    fc_fence_regs(dk); /* the zeros are in place before the first wgmma's flight (hopper/bwd_kernel.cuh says why) */
    fc_fence_regs(dv);
    if constexpr (!EVEN) fc_fence_regs(dk1);
    if (n_iter > 0) fc_mbar_wait(kv_full, 0); /* K_j, V_j have landed */

    float st[XN / 2]; /* warpgroup 0's Sᵀ, Pᵀ or warpgroup 1's dPᵀ, dSᵀ */
    if (n_iter > 0) { /* block 0's Sᵀ (warpgroup 0: K_j·Q_0ᵀ) or dPᵀ (warpgroup 1: V_j·dO_0ᵀ), all 64 queries */
      fc_mbar_wait(cw ? do_full : Q_FULL(0), 0);
      fc_wgmma_fence();
      fc_hpb256_x<T, NQ, NV>(st, cw, sK, sV, sQ, sdO);
      fc_wgmma_commit();
    }
    /* Every trip commits the same groups in the same order (no test of `it` around an issue or a wait): ptxas must
     * see which groups each wait retires, else it adds waits (C7517) or serialises (C7514). */
    for (int it = 0; it < n_iter; it++) {
      const int s = it & 1, u = it >> 1;
      const int hh = ti.h0 + it / n_i, q0 = (i_begin + it % n_i) * FC_HPB256_BR;
      const uint32_t q_tile = sQ + s * TQ;
      const uint32_t sP = sPS + s * 2 * FC_HPB256_PS, sdS = sP + FC_HPB256_PS; /* this block's buffer, it % 2 */

#define MARK(k)                                                                                                        \
  do {                                                                                                                 \
    if (ct == 0) FC_HPB_MARK_AT(1 + cw, it, k);                                                                        \
  } while (0)
      MARK(1);
      /* SCORE_MOD: warpgroup 0's attn_mask of this block (fc_hpb_mask_block), loaded before the wait */
      [[maybe_unused]] fc_hpb_mblock<XN> mb;
      [[maybe_unused]] const int mcls =
          SCORE_MOD && cw == 0
              ? fc_hpb_mask_block<FC_HPB256_BR, FC_HPB256_BC>(a.mod, ti.b, hh, q0, k0, key0, t, sq, sk, &mb)
              : (int)FC_MT_ALL;
      /* Warpgroup 0's Sᵀ or warpgroup 1's dPᵀ (issued by the last trip or the prologue); warpgroup 0 forms Pᵀ and
       * hands it to warpgroup 1 through sP and named barrier P (bar.arrive: warpgroup 0 goes on to its dV), which
       * forms dSᵀ from it. Neither touches the other's product. A wait 0 first: ptxas lets a group cross the back
       * edge only when the next trip's first wait retires everything (with a wait 1 it serialised every wgmma:
       * C7515). */
      fc_wgmma_wait<0>();
      fc_fence_regs(st);
      MARK(2);
      fc_fence_proxy_async(); /* after the async proxy's reads of this buffer (block it − 2), before these writes */
      if (cw == 0) {
        /* Pᵀ = 2^(c·Sᵀ − lse2_i) for all 64 queries, masked only when some pair of keys k0 .. k0 + 63 × queries q0
         * .. q0 + 63 is cut */
        const uint32_t sLw = sLse + s * FC_HPB256_ROWS;
        if constexpr (SCORE_MOD) {
          /* Pᵀ of the modified scores → sP (for dV); with softcap Pᵀ∘(1 − tanh²) → sdS, where warpgroup 1 reads it
           * for dSᵀ instead of Pᵀ and writes dSᵀ over it (each thread its own pairs). This block's sdS buffer is free
           * here for the reason sP is (the header: its last readers retired before barrier B of block it − 1). */
          float pg[XN / 2];
          uint32_t unused[XN / 16][4];
          fc_hpb_p_from_s_mod<T, XN, FC_HPB_MOD_TWO, FC_HPB256_BC, ADD>(
              st, pg, unused, unused, sLw, sDsum, t, q0, k0, key0, sq, sk, shift, wl, wr, a.mod,
              fc_score_mod_slope(a.mod, ti.b, hh), ti.b, hh, mcls, mb);
          fc_hpb256_store_ps<T, XN>(st, sP, warp, g, t);
          if (a.mod.k_out > 0.0f) fc_hpb256_store_ps<T, XN>(pg, sdS, warp, g, t);
        } else {
          fc_hpb_p_from_s<XN, false, FC_HPB256_BC>(st, st, sLw, sDsum, c, t, q0, k0, key0, sq, sk, shift, wl, wr);
          fc_hpb256_store_ps<T, XN>(st, sP, warp, g, t);
        }
        MARK(3);
        fc_fence_proxy_async(); /* the writes, before both warpgroups' dV wgmmas read them */
        fc_named_barrier_arrive_if(FC_HPB256_BAR_P, 256, true); /* P */
        fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* all of this warpgroup's Pᵀ is in sP, before its dV */
        /* dO_i for dV: warpgroup 1 waited for it before its dPᵀ; waiting here too keeps each reader's own wait on
         * the fill it reads (it is complete by now) */
        fc_mbar_wait(do_full, it & 1);
      } else {
        fc_named_barrier(FC_HPB256_BAR_P, 256); /* P: warpgroup 0's Pᵀ of this block is in sP */
        MARK(3);
      }
      /* dV_j += Pᵀ·dO_i now, by both warpgroups at the same place (its inputs are in): its wgmmas run beside
       * warpgroup 1's dSᵀ, and dO_i is released before barrier B rather than after it, so that the single dO
       * buffer's next fill (which warpgroup 1's next dPᵀ waits for) starts a dV and a dQ_0 earlier */
      fc_wgmma_fence();
      fc_hpb256_kv_chain<T, 64 * VH>(dv, sP, sdO + dv_cols);
      fc_wgmma_commit();
      MARK(4);
      if (cw == 1) {
        /* dSᵀ = Pᵀ∘(dPᵀ − D_i); SCORE_MOD with softcap: (Pᵀ∘(1 − tanh²))∘(dPᵀ − D_i), from sdS */
        fc_hpb256_ds_whole<T>(st, SCORE_MOD && a.mod.k_out > 0.0f ? sdS : sP, sDsum, warp, g, t);
        if constexpr (ADD)
          if (a.mod.dbias) fc_hpb_dbias_put<T, XN>(a.mod, ti.b, hh, st, q0, key0, sq, sk, t);
        fc_hpb256_store_ps<T, XN>(st, sdS, warp, g, t);
      }
      MARK(5);
      fc_wgmma_wait<0>(); /* dV */
      fc_fence_regs(dv);
      fc_mbar_arrive_if(do_empty, true); /* dO_i, D_i are read: every consumer thread releases them */
      MARK(6);
      if (cw == 1) fc_mbar_wait(Q_FULL(s), u & 1); /* Q_i for dK */
      fc_fence_proxy_async();                      /* these generic writes, before the async proxy (wgmma) reads them */
      /* The last block's second bulk dQ add has read this warpgroup's sdQ tile before it is written again (after
       * barrier B). */
      if (ct == 0) fc_bulk_wait_read<0>();
      fc_named_barrier(FC_HPB_BAR_DS_ALL, 256); /* B: both warpgroups' halves of Pᵀ, dSᵀ are in shared memory */
      MARK(7);

      /* dQ_i = dS·K_j (two 64-column halves of this warpgroup's 128), dK_j += dSᵀ·Q_i: three groups, in the order
       * their results are needed */
      float dq0[32], dq1[32];
      const bool dq_two = EVEN || cw == 1; /* 192/128: warpgroup 0 has one dQ half; its second group is empty */
      fc_wgmma_fence();
      fc_hpb_dq<T, 64>(dq0, sdS, sK + dq_cols);
      fc_wgmma_commit();
      if (dq_two) fc_hpb_dq<T, 64>(dq1, sdS, sK + dq_cols + FC_HPB256_HALF);
      fc_wgmma_commit();
      if constexpr (EVEN)
        fc_hpb256_kv_chain<T, 64 * KH0>(dk, sdS, q_tile + dk_cols);
      else if (cw == 0)
        fc_hpb256_kv_chain<T, 64 * KH0>(dk, sdS, q_tile);
      else
        fc_hpb256_kv_chain<T, 64 * KH1>(dk1, sdS, q_tile + dk_cols);
      fc_wgmma_commit();

      fc_wgmma_wait<2>(); /* dQ_0; dQ_1, dK may still run */
      fc_fence_regs(dq0);
      MARK(8);
      /* the blocked sum's head-rows hh·total_pad + pad0 + q0 (a multiple of 64), tile 2c + h of the row's four */
      float *dq_dst = a.dq_accum + ((int64_t)hh * a.total_pad + pad0 + q0) * FC_HPB256_D +
                      QH0 * cw * FC_BWD_DQ_TILE * FC_HPB256_DQ_W;
      fc_hpb_dq_tile_add<64>(dq0, dq_tile, dq_dst, warp, g, t, ct, FC_HPB_BAR_DS + cw);
      MARK(9);

      {
        /* Block it + 1's Sᵀ (warpgroup 0) or dPᵀ (warpgroup 1) behind dQ_1 and dK, now that dQ_0's registers are
         * free; the last block issues its own again (discarded; its stage is not refilled: there are no more
         * fills), so that every trip commits the same groups. Its Q stage is (it + 1) % 2, not this block's, which
         * is released below. Warpgroup 1's dPᵀ is on dO_{i+1}, whose fill the producer issued once both warpgroups
         * released dO_i above: it may still be landing (the cost of the single dO buffer). */
        const int nx = it + 1 < n_iter ? it + 1 : it;
        fc_mbar_wait(cw ? do_full : Q_FULL(nx & 1), cw ? nx & 1 : (nx >> 1) & 1);
        fc_wgmma_fence();
        fc_hpb256_x<T, NQ, NV>(st, cw, sK, sV, sQ + (nx & 1) * TQ, sdO);
        fc_wgmma_commit();
        MARK(10);
        fc_wgmma_wait<2>(); /* dQ_1; dK, the next Sᵀ may still run */
      }
      if (dq_two) {
        fc_fence_regs(dq1);
        MARK(11);
        if (ct == 0) fc_bulk_wait_read<0>();       /* dQ_0's bulk add has read the tile ... */
        fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... before anyone of the warpgroup writes it again */
        fc_hpb_dq_tile_add<64>(dq1, dq_tile, dq_dst + FC_BWD_DQ_TILE * FC_HPB256_DQ_W, warp, g, t, ct,
                               FC_HPB_BAR_DS + cw);
        MARK(12);
      }

      fc_wgmma_wait<1>(); /* dK; the next Sᵀ may still run */
      fc_fence_regs(dk);
      if constexpr (!EVEN) fc_fence_regs(dk1);
      /* Q_i, lse2_i of stage s are read: every consumer thread releases them */
      fc_mbar_arrive_if(Q_EMPTY(s), true);
      MARK(13);
#undef MARK
    }
    /* the discarded Sᵀ */
    fc_wgmma_wait<0>();
    fc_fence_regs(st);
    /* The CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
    if (ct == 0) fc_bulk_wait<0>();

    /* dK_j = scale·dK_j, dV_j (keys k0 .., columns 128c ..) through the Q ring into global memory as whole 16-byte
     * chunks (fc_hpb_store_dkdv's layout with 128-column rows): warpgroup c's dK tile at sQ + 2c·16 KB, dV after it.
     * The ring is free once both warpgroups are past this barrier: every fill was consumed and every wgmma retired,
     * and the producer issues nothing more. */
    fc_named_barrier(FC_HPB_BAR_DS_ALL, 256);
    fc_fence_proxy_async(); /* after the async proxy's use of this memory, before these writes */
    if constexpr (EVEN) {
      const uint32_t tk = sQ + cw * 2 * FC_HPB256_OUT_TILE, tv = tk + FC_HPB256_OUT_TILE;
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const int r = 16 * warp + g + 8 * rh;
#pragma unroll
        for (int x = 0; x < 16; x++) {
          const uint32_t off = r * 256 + ((x ^ (r % 8)) << 4) + 4 * t;
          fc_st_shared_u32(tk + off, fc_pack2<T>(a.scale * dk[4 * x + 2 * rh], a.scale * dk[4 * x + 2 * rh + 1]));
          fc_st_shared_u32(tv + off, fc_pack2<T>(dv[4 * x + 2 * rh], dv[4 * x + 2 * rh + 1]));
        }
      }
      fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the warpgroup's tiles are written */
      uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti) + 128 * cw; /* this warpgroup's columns */
      uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti) + 128 * cw;
      fc_hpb_store_tile<128>(tk, dK, a.dk_ss, k0, sk, a.head_dim - 128 * cw, a.dk_vec, ct);
      fc_hpb_store_tile<128>(tv, dV, a.dv_ss, k0, sk, (DV_COLS ? a.head_dim_v : a.head_dim) - 128 * cw, a.dv_vec, ct);
    } else {
      /* 192/128: warpgroup 0's dK (128 columns) at sQ, its dV (64) after it; warpgroup 1's dK (64), dV (64) next */
      const uint32_t tk = sQ + cw * (64 * 2) * (64 * KH0 + 64 * VH), tv = tk + (64 * 2) * 64 * (cw ? KH1 : KH0);
      if (cw == 0)
        fc_hpb256_stage<T, 64 * KH0>(tk, dk, a.scale, warp, g, t);
      else
        fc_hpb256_stage<T, 64 * KH1>(tk, dk1, a.scale, warp, g, t);
      fc_hpb256_stage<T, 64 * VH>(tv, dv, 1.0f, warp, g, t);
      fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the warpgroup's tiles are written */
      uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti) + 64 * KH0 * cw; /* its columns */
      uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti) + 64 * VH * cw;
      if (cw == 0)
        fc_hpb_store_tile<64 * KH0>(tk, dK, a.dk_ss, k0, sk, a.head_dim, a.dk_vec, ct);
      else
        fc_hpb_store_tile<64 * KH1>(tk, dK, a.dk_ss, k0, sk, a.head_dim - 64 * KH0, a.dk_vec, ct);
      fc_hpb_store_tile<64 * VH>(tv, dV, a.dv_ss, k0, sk, a.head_dim_v - 64 * VH * cw, a.dv_vec, ct);
    }
  }
#undef Q_FULL
#undef Q_EMPTY
#endif /* FC_HOPPER_ARCH */
}

#endif /* FLASHC_CUDA_HOPPER_BWD_D256_CUH */
