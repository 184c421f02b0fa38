/* mma/bwd_kernel.cuh — cuda-mma's dK/dV kernel with FlashAttention-2's block shapes (the fa2 family; mma/bwd.cu's
 * fc_mma_bwd_plan_of picks one): the base kernel's algorithm (mma/bwd.cu, step 2) with larger tiles, so that each
 * operand read from shared memory feeds more tensor-core work.
 *   fa2    as below; the deterministic dQ's (and |scale| < 1e-30's) kernel.
 *   fa2p   PDP: Sᵀ's MMAs first, then dPᵀ's with the exponentials of Pᵀ spread between them (one basic block
 *          where the mask does not cut), the accumulators started at −lse2/c and −D. In fa2 the SFU and the
 *          FMAs of Pᵀ run after all MMAs, while no warp of the CTA (the only one on its SM) has an MMA to issue.
 *   fa2pb  fa2p with BULK_DQ (sm_90): each warp stores its dQ fragment into sdQ, the CTA's Br × D product in
 *          fp32, and one thread adds the whole tile into the sum with one cp.reduce.async.bulk (the copy engine
 *          makes the adds) in place of Br·D/4 red.global.add.v4 from every thread (cuda-hopper's bulk dQ).
 *          At d ≤ 128 (Bc = 128) with LEAN: the same maths in fewer registers held across the loop (without it
 *          the d64 kernels spilled 48-72 bytes at 255 registers; these have no stack frame). At d64, Sᵀ, dPᵀ
 *          (128 fp32 per thread) and dK_j, dV_j (64) leave ~60 registers for the rest at the exponentials' peak,
 *          and the compiler hoists every loop invariant it finds, so LEAN has fewer of them: Pᵀ/dSᵀ stored by
 *          stmatrix at the dV/dK loop's ldmatrix addresses (d ≤ 64; not 8 per-column offsets), the mask test in
 *          32 bits from 4 values made per block (not 8 64-bit query indices), the Q_i/dO_i copies from one row
 *          and column per thread (d ≠ 96; not 4 chunk indices and row offsets), the (head, block) counters
 *          stepped (not divided), and the sequence's numbers made warp-uniform (redux.sync) so that the loop's
 *          bookkeeping lives in uniform registers. Each of the five is needed at d64: without any one, 4-56
 *          bytes spill again.
 *
 * One CTA of NW warps per key block K_j, V_j (Bc keys) and kv head; dK_j, dV_j stay in registers while it
 * walks the query blocks Q_i (Br rows) that see the block, for every query head of the GQA group:
 *   Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ                        warps: WS along the keys × NW/WS along the queries
 *   Pᵀ = 2^(c·Sᵀ − lse·log2 e), dSᵀ = Pᵀ∘(dPᵀ − D)       → shared memory once, 16-bit
 *   dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i                      warps: WD along the keys × NW/WD along the columns
 *   dQ_i += dS·K_j, fp32 reductions (red.v4 on sm_90)     warps: WQ along the queries × NW/WQ along the columns
 * Each warp owns a tile of several 16-row m-tiles, not one: a fragment read by ldmatrix feeds every m-tile
 * (A) or every n-block (B) of the warp's tile. Per query block, shared-memory reads are
 *   (NW/WS + WS·Br/Bc)·2·Bc·D + (NW/WD + WD·D/Bc)·2·Bc·Br + (NW/WQ·Bc/D·NCH + WQ)·Bc·D  elements,
 * e.g. d128, Br 64, Bc 128: 640 KB for 10.5 MFLOP (the base kernel's 64×64 tiles: 480 KB for 5.2).
 * Two barriers per query block: Q_i landed (and the last block's buffers are free), Pᵀ/dSᵀ written. Q_i,
 * dO_i of the next block are copied by cp.async while this one is computed (QSTAGES = 2; fa2pb at d256,
 * where two buffers and the dQ tile do not fit: one buffer, refilled while dQ_i is computed).
 *
 * Shared memory (16-bit, XOR-swizzled rows as in mma/tile.cuh), the base kernel's layout:
 *   sK, sV [Bc][DS]            the CTA's key block: A of Sᵀ and dPᵀ, B of dS·K_j
 *   sQ, sdO [QSTAGES][Br][DS]  the query block: B of Sᵀ, dPᵀ, dK, dV; at the end, the staging of dK_j, dV_j
 *   sP, sdS [Bc][Br]           Pᵀ and dSᵀ: A of dV and dK; dSᵀ read with ldmatrix.trans is dS, A of dQ
 *   sL, sD [QSTAGES][Br] fp32  lse·log2(e) and D of the query block
 *   sdQ [Br × D] fp32          BULK_DQ: dS·K_j of the block, in the blocked layout of the fp32 sum
 *                              (fc_bwd_dq_blocked_offset, tiles of 64 rows × FC_MMA_DQ_TILE_W columns, the
 *                              16-byte chunks XOR-swizzled by row: a warp's stores of a fragment hit every bank
 *                              twice, the least for 256 bytes), so that the block's rows of the sum are one
 *                              contiguous range that one bulk add covers.
 * BULK_DQ, the order that makes sdQ race-free with one barrier less than a barrier per write would need: the
 * tile of block it is written after the Pᵀ/dSᵀ barrier of it, each writer then fences the async proxy; thread 0
 * issues its bulk add after the next barrier every thread passes (the top of it + 1, or after the loop), and
 * waits for the add to have read sdQ (wait_group.read) before the Pᵀ/dSᵀ barrier of it + 1, behind which the
 * tile is written again; the add has the Sᵀ/dPᵀ MMAs of it + 1 to read its 16-48 KB. Before the CTA exits,
 * thread 0 waits for the last add to complete (its shared memory must outlive the read).
 * Included by mma/bwd_launch.cuh after mma/bwd_common.cuh and common/bwd_rows.cuh. */
#ifndef FLASHC_CUDA_MMA_BWD_FA2_CUH
#define FLASHC_CUDA_MMA_BWD_FA2_CUH

#include "common/bwd_rows.cuh"
#include "hopper/ptx.cuh"
#include "mma/bwd_common.cuh"

/* BULK_DQ: the columns of one tile of the blocked fp32 sum; a power of two (the swizzle XORs chunk numbers below
 * w / 4) dividing every compiled head dim. */
enum { FC_MMA_DQ_TILE_W = 32 };
/* The most dynamic shared memory one CTA may have on sm_90 (227 KB), where fa2pb runs. */
#define FC_SM90_SMEM_OPTIN ((size_t)232448)

/* Shared-memory bytes of the kernel below (BULK_DQ: + the Br × D fp32 dQ tile). */
static constexpr size_t fc_bwd_fa2_smem(int D, int BR, int BC, int QSTAGES, bool BULK_DQ = false) {
  return (size_t)(2 * BC + 2 * QSTAGES * BR) * fc_tile_stride(D) * 2 + (size_t)2 * BC * fc_tile_stride(BR) * 2 +
         (size_t)2 * QSTAGES * BR * sizeof(float) + (BULK_DQ ? (size_t)BR * D * sizeof(float) : 0);
}

/* What the mask test of a block needs: the diagonal's shift, the window, the block's first query and key, the
 * sequence's lengths. */
typedef struct fc_bwd_pmask {
  int64_t shift, wl, wr;
  int q0, k0, sq, sk;
} fc_bwd_pmask;

/* LEAN: the same test in 32 bits, made per block and thread before the block's MMAs, so that nothing of it is held
 * in registers across the loop. Pair (kc, qc) of the thread's elements (kc = 16m + 8·(e/2) keys and qc = 8x + e%2
 * queries past its first, compile-time) is seen when kr + kc < 0 (a key of the sequence), qr + qc < 0 (a query of
 * it), lo + kc − qc ≥ 0 and hi + kc − qc ≤ 0 (key − query against shift − wl and shift + wr: the difference of the
 * first key and query, less each bound, clamped to ±(2^31 − 513), which keeps every comparison's result for
 * |kc − qc| < 512). Every sum stays inside 32 bits. */
typedef struct fc_bwd_pmask32 {
  int kr, qr, lo, hi;
} fc_bwd_pmask32;

/* kt, qt: the thread's first key and query in the block (ks·MS + g, ns·NS + 2t). */
static __device__ __forceinline__ fc_bwd_pmask32 fc_bwd_pmask32_of(const fc_bwd_pmask &mk, int kt, int qt) {
  const int64_t lim = 2147483647 - 512, dd = ((int64_t)mk.k0 + kt) - ((int64_t)mk.q0 + qt);
  fc_bwd_pmask32 r;
  r.kr = (mk.k0 - mk.sk) + kt, r.qr = (mk.q0 - mk.sq) + qt;
  r.lo = mk.wl < 0 ? (int)lim : (int)max(-lim, min(lim, dd - (mk.shift - mk.wl)));
  r.hi = mk.wr < 0 ? (int)-lim : (int)max(-lim, min(lim, dd - (mk.shift + mk.wr)));
  return r;
}

/* dPᵀ (− D) = V_j·dO_iᵀ for the warp's MS keys × NS queries, and in place of Sᵀ − lse2/c, Pᵀ = 2^(c·that): the NE
 * exponentials of the warp's tile are spread evenly over dPᵀ's D/16 k-steps, so that with MASKED false the
 * whole is one basic block in which the scheduler can put each exponential between independent MMAs.
 * MASKED: pairs hidden by the mask or past a sequence's end get P = 0 (a branch per pair); MASK is fc_bwd_pmask or
 * (M32, LEAN) fc_bwd_pmask32. */
template <typename T, int D, int DS, int MS, int NS, int MT_S, int NSX, bool MASKED, bool M32 = false,
          typename MASK = fc_bwd_pmask>
static __device__ __forceinline__ void fc_bwd_fa2_p_dp(float (&sT)[MT_S][NSX][4], float (&dpT)[MT_S][NSX][4],
                                                       uint32_t sV_u, uint32_t sdO_u, const uint32_t kv_lane[4],
                                                       const uint32_t qb_lane[4], const MASK &mk, float c, int ks,
                                                       int ns, int g, int t) {
  constexpr int KS = D / 16, NE = MT_S * NSX * 4, PER = (NE + KS - 1) / KS;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    uint32_t va[MT_S][4];
#pragma unroll
    for (int m = 0; m < MT_S; m++) fc_ldmatrix_x4(va[m], fc_frag_addr<DS>(sV_u, kv_lane, ks * MS + 16 * m, kk));
#pragma unroll
    for (int p = 0; p < NSX / 2; p++) {
      uint32_t ob[4];
      fc_ldmatrix_x4(ob, fc_frag_addr<DS>(sdO_u, qb_lane, ns * NS + 16 * p, kk));
#pragma unroll
      for (int m = 0; m < MT_S; m++) {
        fc_mma<T>(dpT[m][2 * p], va[m], ob[0], ob[1]);
        fc_mma<T>(dpT[m][2 * p + 1], va[m], ob[2], ob[3]);
      }
    }
#pragma unroll
    for (int u = 0; u < PER; u++) {
      const int idx = kk * PER + u; /* element (m, x, e) of the warp's tile, x outermost */
      if (idx < NE) {
        const int x = idx / (MT_S * 4), m = idx / 4 % MT_S, e = idx % 4;
        const int qi = ns * NS + 8 * x + 2 * t + (e & 1), kj = ks * MS + 16 * m + g + 8 * (e >> 1);
        float p = fc_exp2(sT[m][x][e] * c);
        if constexpr (M32) {
          const int qc = 8 * x + (e & 1), kc = 16 * m + 8 * (e >> 1); /* compile-time */
          if (MASKED && !(mk.kr < -kc && mk.qr < -qc && mk.lo >= qc - kc && mk.hi <= qc - kc)) p = 0.0f;
        } else {
          if (MASKED && !(mk.k0 + kj < mk.sk && mk.q0 + qi < mk.sq &&
                          fc_bwd_visible(mk.q0 + qi, mk.k0 + kj, mk.shift, mk.wl, mk.wr)))
            p = 0.0f;
        }
        sT[m][x][e] = p;
      }
    }
  }
}

/* SCORE_MOD (mma/score_mod.cuh): Pᵀ = 2^(x·log2 e − lse2) of the modified score x of Sᵀ (recomputed with the
 * forward's fc_tanh), masked as the plain pass (mk, where the block is not full), and dSᵀ = Pᵀ∘g∘(dPᵀ − D) in place of
 * dPᵀ, g = 1 − tanh² (CAP; 1 without softcap). BIAS (attn_mask): x gains the bias of bias_plane (or P = 0 where a
 * boolean mask removes the pair), and with dbias, Pᵀ∘(dPᵀ − D) of every pair inside the sequence goes to
 * dbias_plane (the only CTA that computes the pair writes it). kt, qt: the thread's first key and query in the block
 * (ks·MS + g, ns·NS + 2t); w = i + sk − sq − j of that pair, so that key kt + kc and query qt + qc are |w + qc − kc|
 * apart (ALiBi; exact in fp32 below 2^24). L, Dr: lse2 and D of the block's queries. */
template <typename T, int MT_S, int NSX, bool BIAS>
static __device__ __forceinline__ void fc_bwd_fa2_p_mod(float (&sT)[MT_S][NSX][4], float (&dpT)[MT_S][NSX][4],
                                                        const float *L, const float *Dr, const fc_score_mod &md,
                                                        float slope, float w, const fc_bwd_pmask &mk, bool full, int kt,
                                                        int qt, const void *bias_plane, void *dbias_plane) {
#pragma unroll
  for (int x = 0; x < NSX; x++) {
    const int qc = qt + 8 * x; /* this lane's two query columns: qc, qc + 1 */
    const float2 l2 = *(const float2 *)(L + qc), dr = *(const float2 *)(Dr + qc);
#pragma unroll
    for (int m = 0; m < MT_S; m++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int qi = qc + (e & 1), kj = kt + 16 * m + 8 * (e >> 1);
        float g;
        float xs =
            fc_mod_score_any(sT[m][x][e], md, slope, fabsf(w + (float)(8 * x + (e & 1) - 16 * m - 8 * (e >> 1))), &g);
        /* BIAS: the pair's element of attn_mask (its offset in the plane: in = inside the sequence) */
        [[maybe_unused]] bool keep = true, in = true;
        [[maybe_unused]] int64_t at_i = 0, at_j = 0;
        if constexpr (BIAS) {
          in = mk.k0 + kj < mk.sk && mk.q0 + qi < mk.sq;
          at_i = (int64_t)(mk.q0 + qi), at_j = (int64_t)(mk.k0 + kj);
          float add = 0.0f;
          if (in) keep = fc_bias_one<T>(md, bias_plane, at_i * md.bias_st[2] + at_j * md.bias_st[3], &add);
          xs += add;
        }
        float p = fc_exp2(fmaf(xs, 1.4426950408889634f, -(e & 1 ? l2.y : l2.x)));
        if (!full && !(mk.k0 + kj < mk.sk && mk.q0 + qi < mk.sq &&
                       fc_bwd_visible(mk.q0 + qi, mk.k0 + kj, mk.shift, mk.wl, mk.wr)))
          p = 0.0f;
        if constexpr (BIAS) {
          if (!keep) p = 0.0f;
          /* dbias = dS before softcap's factor g (cpu-ref's definition): the bias is added after the modifiers */
          const float ds = p * (dpT[m][x][e] - (e & 1 ? dr.y : dr.x));
          if (md.dbias && in) fc_dbias_put<T>(md, dbias_plane, at_i * md.dbias_st[2] + at_j * md.dbias_st[3], ds);
          sT[m][x][e] = p;
          dpT[m][x][e] = ds * g;
        } else {
          sT[m][x][e] = p;
          dpT[m][x][e] = p * g * (dpT[m][x][e] - (e & 1 ? dr.y : dr.x));
        }
      }
  }
}

/* Dropout in Sᵀ's layout (sT[m][x][e]: key k_first + g + 16m + 8·(e >> 1), query q_first + 8x + (e & 1); k_first =
 * k0 + ks·MS, a multiple of 8, q_first = q0 + ns·NS + 2t): the keep bits of the thread's elements, element (m, x, e)
 * at bit fc_drop_bit_t<MT_S>(m, x, e) of km. The 8 lanes of one t (g = 0..7) hold the same 2·NSX queries, and each
 * query's MS keys are MS/8 whole Philox blocks, key g + 8c being half g of block c = 2m + (e >> 1): the group's
 * blocks q = (2x + (e & 1))·2·MT_S + c, bit q of this lane's half g (fc_drop_group_bits, mma/score_mod.cuh). Every
 * lane must call it (a uniform branch). */
template <int MT_S> static __device__ __forceinline__ constexpr int fc_drop_bit_t(int m, int x, int e) {
  return ((x * 2 + (e & 1)) * MT_S + m) * 2 + (e >> 1);
}
template <int MT_S, int NSX>
static __device__ __forceinline__ void fc_mma_drop_bits_t(uint32_t (&km)[(MT_S * NSX * 4 + 31) / 32],
                                                          const fc_score_mod &md, uint64_t bh, int64_t q_first,
                                                          int64_t k_first, int64_t sk, int g) {
  static_assert(fc_drop_group<8, 2 * NSX, 2 * MT_S>::W == (MT_S * NSX * 4 + 31) / 32, "one bit per element");
  fc_drop_group_bits<8, 2 * NSX, 2 * MT_S>(km, md, bh, q_first, 8, 1, sk, k_first / 8, g);
}
/* y ← keep ? y·mul : 0 over Sᵀ's layout, keep from fc_mma_drop_bits_t. */
template <int MT_S, int NSX>
static __device__ __forceinline__ void
fc_mma_drop_apply_t(float (&y)[MT_S][NSX][4], const uint32_t (&km)[(MT_S * NSX * 4 + 31) / 32], float mul) {
#pragma unroll
  for (int x = 0; x < NSX; x++)
#pragma unroll
    for (int m = 0; m < MT_S; m++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = fc_drop_bit_t<MT_S>(m, x, e);
        y[m][x][e] = (km[i / 32] >> (i % 32)) & 1u ? y[m][x][e] * mul : 0.0f;
      }
}

#if FC_BULK_ARCH
/* BULK_DQ: this thread's byte addresses in sdQ (the blocked layout with w = 32: fc_bwd_dq_blocked_offset) of
 * row 16·R0 + g, column c0 + 8v + 2t for v = 0..3, where the warp's dQ tile starts at row 16·R0 (R0 a multiple
 * of MT_Q, MT_Q dividing 4: the tile's rows stay in one 64-row tile) and column c0 (a multiple of 16). Any
 * other fragment is at[v] + a compile-time offset: + 2048·m, + 1024·rh bytes (16 or 8 rows of 128 bytes),
 * + 8192 per 32 columns (the next column tile). Only bits 5-6 (the 16-byte chunk's pair within the row) are
 * swizzled, by 2·(row % 4) = 2·(g % 4) chunks; c0 % 32 = 16 shifts the pair by 2 (bit 6 flipped, v ≥ 2
 * carried into the next column tile). Per thread once: every store is then one st.shared.v2 [reg + imm]. */
static __device__ __forceinline__ void fc_bwd_fa2_sdq_at(uint32_t (&at)[4], uint32_t sdq, int D, int R0, int c0, int g,
                                                         int t) {
  const uint32_t row = sdq + (uint32_t)(R0 / 4) * (FC_BWD_DQ_TILE * D * 4) + (uint32_t)(R0 % 4) * 2048u +
                       (uint32_t)g * 128u + 8u * t + (uint32_t)(c0 / 32) * (FC_BWD_DQ_TILE * 32 * 4);
  const uint32_t sw = (32u * (g % 4)) ^ (4u * (c0 & 16)), carry = (c0 & 16) ? FC_BWD_DQ_TILE * 32 * 4 : 0u;
#pragma unroll
  for (int v = 0; v < 4; v++) at[v] = row + (v >= 2 ? carry : 0u) + ((32u * v) ^ sw);
}
/* stmatrix.x4: four 8×8 16-bit matrices, lanes 8q..8q+7 giving the row addresses of matrix q and each thread its
 * pair (lane / 4, 2·(lane % 4)..+1) of each: ldmatrix.x4's layout, the other way. */
static __device__ __forceinline__ void fc_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                      uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
/* LEAN: Pᵀ and dSᵀ of the warp's tile (keys row0.., queries 16·kk0..) into sP and sdS by stmatrix: the 16 × 16
 * block of m-tile m and n-blocks 2i, 2i + 1 is one x4 store at the address from which the dV/dK loop's ldmatrix
 * reads it back (k-step kk0 + i): p_lane's 4 offsets in place of 8 per-column ones held across the loop, and a
 * quarter of the store instructions. */
template <typename T, int PS, int MT_S, int NSX>
static __device__ __forceinline__ void fc_bwd_fa2_st_p_ds(const float (&sT)[MT_S][NSX][4],
                                                          const float (&dpT)[MT_S][NSX][4], uint32_t sP_u,
                                                          uint32_t sdS_u, const uint32_t p_lane[4], int row0, int kk0) {
#pragma unroll
  for (int m = 0; m < MT_S; m++)
#pragma unroll
    for (int i = 0; i < NSX / 2; i++) {
      const float(&p0)[4] = sT[m][2 * i], (&p1)[4] = sT[m][2 * i + 1];
      const float(&d0)[4] = dpT[m][2 * i], (&d1)[4] = dpT[m][2 * i + 1];
      fc_stmatrix_x4(fc_frag_addr<PS>(sP_u, p_lane, row0 + 16 * m, kk0 + i), fc_pack2<T>(p0[0], p0[1]),
                     fc_pack2<T>(p0[2], p0[3]), fc_pack2<T>(p1[0], p1[1]), fc_pack2<T>(p1[2], p1[3]));
      fc_stmatrix_x4(fc_frag_addr<PS>(sdS_u, p_lane, row0 + 16 * m, kk0 + i), fc_pack2<T>(d0[0], d0[1]),
                     fc_pack2<T>(d0[2], d0[3]), fc_pack2<T>(d1[0], d1[1]), fc_pack2<T>(d1[2], d1[3]));
    }
}
/* threadIdx.x read again where it is used, meant to have the sdQ addresses derived from it recomputed per query
 * block instead of held in registers across the loop's MMAs. ptxas hoists the S2R out of the loop all the same
 * (SASS of the d64 fa2pb kernel, 2026-11-22): at 255 registers those values are spilled (the register-lean
 * kernels, LEAN, avoid the spills by other means). */
static __device__ __forceinline__ int fc_bwd_fa2_tid_again(void) {
  uint32_t v;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(v));
  return (int)v;
}
/* BULK_DQ, thread 0: adds sdQ, the tile of query head hh's block from row q0, into the blocked sum: Br head-rows
 * from hh·total_pad + pad0 + q0, one contiguous range (a multiple of 64: padded sequences start on multiples of
 * FC_BWD_PADR), with one bulk add in a bulk group of its own. */
template <int BR, int D>
static __device__ __forceinline__ void fc_bwd_fa2_sdq_add(const fc_mma_bwd_args &a, int64_t pad0, int hh, int q0,
                                                          uint32_t sdq) {
  fc_bulk_reduce_add_f32(a.dq_accum + ((int64_t)hh * a.total_pad + pad0 + q0) * D, sdq, BR * D * sizeof(float));
  fc_bulk_commit();
}
#endif

/* LEAN: fc_bwd_load_q with a thread's chunks of a tile found as rows r0 + k·RP of one column c (CH = D/8 chunks per
 * row; the first fc_walk_threads of the NT threads copy, RP = that / CH rows a pass): one shared offset plus constants,
 * and the global rows taken from q0 + r0 each time, so that no per-thread row offset or column is held in registers
 * across the loop (fc_load_tile's chunk indices, compiled separately per chunk, were 8-12 registers there). */
template <int BR, int D, int NT>
static __device__ __forceinline__ void
fc_bwd_fa2_load_q_rows(uint16_t *sQ, uint16_t *sdO, float *sL, float *sD, const uint16_t *q, const uint16_t *dout,
                       const float *lse2, const float *dsum, int64_t q_seq, int64_t do_seq, int64_t q_ss, int64_t do_ss,
                       int64_t q_sh, int64_t do_sh, int hh, int q0, int sq, int d, int dv, int64_t total_pad,
                       int64_t pad0, int tid) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, NTL = fc_walk_threads<D, NT>(), RP = NTL / CH;
  static_assert(NTL > 0 && BR % RP == 0, "whole rows of chunks per pass");
  const int r0 = tid / CH, c = tid % CH, off = fc_tile_off<DS>(r0, c);
  const int cols = min(max(d - 8 * c, 0), 8), cols_v = min(max(dv - 8 * c, 0), 8); /* of Q's chunk, of dO's */
  const uint16_t *Qh = q + q_seq + hh * q_sh, *dOh = dout + do_seq + hh * do_sh;
  const uint16_t *Q = Qh + (int64_t)(q0 + r0) * q_ss + 8 * c, *dO = dOh + (int64_t)(q0 + r0) * do_ss + 8 * c;
  const uint16_t *safe = Qh + (int64_t)q0 * q_ss; /* row q0 < sq: readable */
#pragma unroll
  for (int k = 0; k < BR / RP; k++) {
    if (NTL < NT && tid >= NTL) break; /* d 96: 192 of 256 threads copy */
    const bool in = r0 + k * RP < sq - q0;
    const int n = in ? cols : 0, nv = in ? cols_v : 0; /* valid elements of the chunk of Q, of dO */
    const uint16_t *fq = Q + (int64_t)(k * RP) * q_ss, *fo = dO + (int64_t)(k * RP) * do_ss;
    uint16_t *tq = sQ + off + k * RP * DS, *to = sdO + off + k * RP * DS;
    fc_cp_async16(fc_smem_u32(tq), n > 0 ? fq : safe, 2 * n);
    fc_cp_async16(fc_smem_u32(to), nv > 0 ? fo : safe, 2 * nv);
  }
  const int64_t at = hh * total_pad + pad0 + q0;
  if (tid < BR / 4)
    fc_cp_async16(fc_smem_u32(sL + 4 * tid), lse2 + at + 4 * tid, 16);
  else if (tid < BR / 2)
    fc_cp_async16(fc_smem_u32(sD + 4 * (tid - BR / 4)), dsum + at + 4 * (tid - BR / 4), 16);
}

/* LEAN: the sequence's numbers in uniform registers (fc_warp_same, mma/ptx.cuh). */
static __device__ __forceinline__ fc_bwd_seq fc_bwd_seq_uniform(fc_bwd_seq s) {
  s.q_start = fc_warp_same64(s.q_start), s.k_start = fc_warp_same64(s.k_start), s.q_row0 = fc_warp_same64(s.q_row0);
  s.pad0 = fc_warp_same64(s.pad0), s.sq = fc_warp_same(s.sq), s.sk = fc_warp_same(s.sk);
  return s;
}

/* NQC: the columns of a warp's dQ tile accumulated at once (a divisor of its D·WQ/NW columns, so that dQ's
 * registers need not sit beside dK's and dV's all at once: d256 adds its 64 columns in two passes).
 * BULK_DQ (with ATOMIC_DQ; the host launches it on sm_90 only): dQ through sdQ and bulk adds into the blocked
 * sum. Compiled for an older architecture (a JIT of the sm_80 PTX), the same kernel adds with red.global.add.v4
 * into the same blocked layout, so that the sum's layout never depends on the pass that ran.
 * SCORE_MOD: softcap and ALiBi (fc_bwd_fa2_p_mod), Sᵀ and dPᵀ as fa2 computes them (the modifiers act on the raw
 * score, so PDP's start at −lse2/c does not apply), with the dQ of the kernel the plan picked (PDP, BULK_DQ); and
 * dropout, a third run-time branch of the same variant (fc_mma_drop_bits_t), attn_mask and dbias a fourth. */
template <typename T, int D, int BR, int BC, int NW, int QSTAGES, int WS, int WD, int WQ, int NQC, bool PDP,
          bool ATOMIC_DQ, bool BULK_DQ, bool LEAN, bool SCORE_MOD = false, bool DV_COLS = false>
__global__ void __launch_bounds__(NW * 32, 1) fc_mma_bwd_fa2_kernel(const fc_mma_bwd_args a) {
  FC_KERNEL_IN_IMAGE(
      fc_mma_bwd_in_image(FC_CODE_SM, PDP ? (BULK_DQ ? FC_MMA_BWD_FA2PB : FC_MMA_BWD_FA2P) : FC_MMA_BWD_FA2))
  constexpr int NT = NW * 32, DS = fc_tile_stride(D), PS = fc_tile_stride(BR);
  constexpr int MS = BC / WS, MT_S = MS / 16, NS = BR / (NW / WS), NSX = NS / 8; /* Sᵀ, dPᵀ warp tile */
  constexpr int MD = BC / WD, MT_D = MD / 16, ND = D / (NW / WD), NDV = ND / 8;  /* dK, dV warp tile */
  constexpr int MQ = BR / WQ, MT_Q = MQ / 16, NQ = D / (NW / WQ), NQX = NQC / 8; /* dQ warp tile */
  constexpr bool PDP_S = PDP && !SCORE_MOD; /* Sᵀ, dPᵀ and Pᵀ as fa2p computes them */
  static_assert(NW % WS == 0 && NW % WD == 0 && NW % WQ == 0, "warps must tile every product");
  static_assert(MS % 16 == 0 && MD % 16 == 0 && MQ % 16 == 0, "warp tiles are whole m-tiles");
  static_assert(NS % 16 == 0 && ND % 16 == 0 && NQC % 16 == 0 && NQ % NQC == 0, "n-blocks come in pairs");
  static_assert(MS * WS == BC && NS * (NW / WS) == BR, "Sᵀ's keys and queries split evenly");
  static_assert(ND * (NW / WD) == D && NQ * (NW / WQ) == D, "dK/dV's and dQ's columns split evenly");
  static_assert(QSTAGES * BR >= BC, "dK and dV are staged through the sQ and sdO buffers");
  static_assert(FC_BWD_PADR % BR == 0, "query blocks stay inside the padded row buffers");
  static_assert(BR / 2 <= NT, "one thread per 4 floats of lse2_i and D_i");
  static_assert(!BULK_DQ || (ATOMIC_DQ && BR % FC_BWD_DQ_TILE == 0 && D % FC_MMA_DQ_TILE_W == 0 &&
                             FC_BWD_PADR % FC_BWD_DQ_TILE == 0),
                "bulk dQ: the block's rows are whole 64-row tiles of the blocked sum");
  static_assert(!BULK_DQ || (FC_MMA_DQ_TILE_W == 32 && 4 % MT_Q == 0 && NQ % 16 == 0 && NQC % 8 == 0),
                "bulk dQ: fc_bwd_fa2_sdq_at's layout (w = 32, a warp's rows inside one 64-row tile)");
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sK = smem, *sV = sK + BC * DS, *sQ = sV + BC * DS, *sdO = sQ + QSTAGES * BR * DS;
  uint16_t *sP = sdO + QSTAGES * BR * DS, *sdS = sP + BC * PS;
  float *sL = (float *)(sdS + BC * PS), *sD = sL + QSTAGES * BR;
  [[maybe_unused]] float *sdQ = sD + QSTAGES * BR; /* BULK_DQ: Br × D fp32 */
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int ks = warp % WS, ns = warp / WS; /* Sᵀ: keys ks·MS.., queries ns·NS.. */
  const int kd = warp % WD, nd = warp / WD; /* dK, dV: keys kd·MD.., columns nd·ND.. */
  const int qm = warp % WQ, qn = warp / WQ; /* dQ: queries qm·MQ.., columns qn·NQ.. */

  int jb, hk, h0, nh; /* the key block, its kv head part and the part's query heads (fc_bwd_kv_of_cta) */
  int64_t b;
  fc_bwd_kv_of_cta(a, &jb, &b, &hk, &h0, &nh);
  const fc_bwd_seq s = LEAN ? fc_bwd_seq_uniform(FC_BWD_SEQ(a, b)) : FC_BWD_SEQ(a, b);
  const int k0 = jb * BC;
  if (k0 >= s.sk) return;
  const int64_t shift = (a.bottom_right ? (int64_t)s.sk - s.sq : 0) + a.mask_offset;
  int i_begin, n_i; /* the query blocks that see the key block */
  fc_bwd_query_blocks<BR, BC>(a, s, k0, shift, &i_begin, &n_i);
  /* SCORE_MOD with a boolean attn_mask's tiles (built at Br × Bc: mma/bwd_score_mod.cu; the design:
   * common/mask_tiles.cuh): only the query blocks that keep some pair of this key block. The walk is one block range
   * for every query head of the part (head-major), so it takes the union of their columns' ranges (one plane where
   * the mask has no head dim). No range left: no iteration, and dK_j = dV_j = 0 are stored, as for keys that no query
   * sees. Then whether every (head, block) of the walk keeps all its pairs (a padding mask's key blocks before the
   * sequence's end): the loop reads no mask element then, else it reads them in every block (NONE and SOME). One flag
   * per CTA, kept in shared memory and read where it is used: a class read per block, or the flag held in a register
   * across the loop, made ptxas spill up to 2.9× as much (sm_90a, d64-d256). */
  [[maybe_unused]] volatile int *mask_whole = nullptr;
  if constexpr (SCORE_MOD) {
    __shared__ int s_mask_whole;
    mask_whole = &s_mask_whole;
    if (a.mod.tiles.cls && n_i > 0) {
      int lo = i_begin + n_i, hi = i_begin; /* lo ≥ hi until a range is found: none found leaves no block */
      for (int x = 0; x < (a.mod.tiles.per_h ? nh : 1); x++) {
        const int2 kept = fc_mask_col_range(a.mod.tiles, b, h0 + x, jb);
        if (kept.x < kept.y) lo = min(lo, kept.x), hi = max(hi, kept.y);
      }
      const int first = max(i_begin, lo), last = min(i_begin + n_i, hi);
      n_i = first < last ? last - first : 0;
      i_begin = first < last ? first : i_begin;
    }
    int whole = a.mod.tiles.cls != nullptr;
    if (whole)
      for (int x = tid; x < nh * n_i; x += NT)
        whole &= fc_mask_tile(a.mod.tiles, b, h0 + x / n_i, i_begin + x % n_i, jb) == FC_MT_ALL;
    whole = __syncthreads_and(whole);
    if (tid == 0) s_mask_whole = whole; /* read after the loop's first barrier */
  }
  const int n_iter = nh * n_i; /* (query head, query block) pairs, head-major */

  const uint16_t *K = a.k + b * a.k_sb + (s.k_start + k0) * a.k_ss + (int64_t)(hk / a.kv_split) * a.k_sh;
  const uint16_t *V = a.v + b * a.v_sb + (s.k_start + k0) * a.v_ss + (int64_t)(hk / a.kv_split) * a.v_sh;
  fc_load_tile<BC, D, NT>(sK, K, a.k_ss, s.sk - k0, a.head_dim, tid, K);
  fc_load_tile<BC, D, NT>(sV, V, a.v_ss, s.sk - k0, fc_bwd_v_cols<DV_COLS>(a), tid, V);

  const int64_t q_seq = b * a.q_sb + s.q_start * a.q_ss, do_seq = b * a.do_sb + s.q_start * a.do_ss;
  if (n_iter > 0)
    fc_bwd_load_q<BR, D, NT>(sQ, sdO, sL, sD, a.q, a.dout, a.lse2, a.dsum, q_seq, do_seq, a.q_ss, a.do_ss, a.q_sh,
                             a.do_sh, h0, i_begin * BR, s.sq, a.head_dim, fc_bwd_v_cols<DV_COLS>(a), a.total_pad,
                             s.pad0, tid);
  fc_cp_async_commit();

  const uint32_t neg = a.negate_q ? 0x80008000u : 0u;
  uint32_t kv_lane[4], qb_lane[4], p_lane[4], bt_cols[NDV / 2], kt_cols[NQ / 16], ds_t[MT_Q];
  fc_frag_lane<DS>(kv_lane, FC_FRAG_A, lane);                           /* K_j, V_j rows as A (Sᵀ, dPᵀ) */
  fc_frag_lane<DS>(qb_lane, FC_FRAG_B, lane);                           /* Q_i, dO_i rows as B (Sᵀ, dPᵀ) */
  fc_frag_lane<PS>(p_lane, FC_FRAG_A, lane);                            /* Pᵀ, dSᵀ as A (dV, dK) */
  fc_frag_cols<DS, NDV / 2>(bt_cols, FC_FRAG_BT, lane, nd * (ND / 16)); /* dO_i, Q_i as B (dV, dK) */
  fc_frag_cols<DS, NQ / 16>(kt_cols, FC_FRAG_BT, lane, qn * (NQ / 16)); /* K_j as B (dQ) */
  fc_frag_cols<PS, MT_Q>(ds_t, FC_FRAG_B, lane, qm * MT_Q);             /* dSᵀ read transposed: dS as A (dQ) */
  const uint32_t sK_u = fc_smem_u32(sK), sV_u = fc_smem_u32(sV), sP_u = fc_smem_u32(sP), sdS_u = fc_smem_u32(sdS);

  float dk[MT_D][NDV][4], dv[MT_D][NDV][4];
#pragma unroll
  for (int m = 0; m < MT_D; m++)
#pragma unroll
    for (int x = 0; x < NDV; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) dk[m][x][e] = dv[m][x][e] = 0.0f;

  /* LEAN: it / n_i and it % n_i carried from one iteration to the next (and stepped for it ± 1) instead of divided
   * three times per iteration, whose divisor state is held across the loop. */
  int it_h = 0, it_b = 0;
  for (int it = 0; it < n_iter; it++) {
    const int st = QSTAGES == 2 ? it % 2 : 0;
    const int nx_h = LEAN ? it_h + (it_b + 1 == n_i) : (it + 1) / n_i,
              nx_b = LEAN ? (it_b + 1 == n_i ? 0 : it_b + 1) : (it + 1) % n_i;
    const int hh = h0 + (LEAN ? it_h : it / n_i), q0 = (i_begin + (LEAN ? it_b : it % n_i)) * BR;
    fc_cp_async_wait<0>(); /* this thread's copies of Q_i, dO_i (and K_j, V_j) have landed */
    /* Everyone's copies are visible, and every warp is done with iteration it − 1: its Q/dO buffer and
     * sP, sdS may be overwritten. */
    __syncthreads();
    if (QSTAGES == 2 && it + 1 < n_iter) {
      const int nx = it + 1, nst = nx % 2;
      if constexpr (LEAN && fc_walk_threads<D, NT>() > 0)
        fc_bwd_fa2_load_q_rows<BR, D, NT>(sQ + nst * BR * DS, sdO + nst * BR * DS, sL + nst * BR, sD + nst * BR, a.q,
                                          a.dout, a.lse2, a.dsum, q_seq, do_seq, a.q_ss, a.do_ss, a.q_sh, a.do_sh,
                                          h0 + nx_h, (i_begin + nx_b) * BR, s.sq, a.head_dim, fc_bwd_v_cols<DV_COLS>(a),
                                          a.total_pad, s.pad0, tid);
      else
        fc_bwd_load_q<BR, D, NT>(sQ + nst * BR * DS, sdO + nst * BR * DS, sL + nst * BR, sD + nst * BR, a.q, a.dout,
                                 a.lse2, a.dsum, q_seq, do_seq, a.q_ss, a.do_ss, a.q_sh, a.do_sh, h0 + nx / n_i,
                                 (i_begin + nx % n_i) * BR, s.sq, a.head_dim, fc_bwd_v_cols<DV_COLS>(a), a.total_pad,
                                 s.pad0, tid);
    }
    fc_cp_async_commit();
#if FC_BULK_ARCH
    /* Every warp's tile of block it − 1 and its proxy fence are behind the barrier above: add the tile (its
     * head and block rebuilt here rather than kept live across the loop). */
    if (BULK_DQ && tid == 0 && it > 0)
      fc_bwd_fa2_sdq_add<BR, D>(a, s.pad0, h0 + (LEAN ? it_h - (it_b == 0) : (it - 1) / n_i),
                                (i_begin + (LEAN ? (it_b == 0 ? n_i : it_b) - 1 : (it - 1) % n_i)) * BR,
                                fc_smem_u32(sdQ));
#endif
    const uint32_t sQ_u = fc_smem_u32(sQ + st * BR * DS), sdO_u = fc_smem_u32(sdO + st * BR * DS);
    const float *L = sL + st * BR, *Dr = sD + st * BR;
    const float inv_c = 1.0f / a.scale_log2;

    /* Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ for this warp's MS keys × NS queries. PDP starts the accumulators
     * at −lse2/c and −D instead of 0, so that they end as Sᵀ − lse2/c and dPᵀ − D: lse2 and D are not needed
     * (nor held in registers) during the MMAs, and P = 2^(c·acc) is one multiply and one exponential. */
    /* SCORE_MOD with dropout: this block's keep bits, before Sᵀ and dPᵀ exist: the Philox rounds then need no
     * registers beside theirs (computed after the MMAs, they made these kernels spill) */
    [[maybe_unused]] uint32_t km[(MT_S * NSX * 4 + 31) / 32];
    if constexpr (SCORE_MOD) {
      if (a.mod.drop_on)
        fc_mma_drop_bits_t<MT_S, NSX>(km, a.mod, (uint64_t)(b * a.heads_q + hh), (int64_t)q0 + ns * NS + 2 * t,
                                      (int64_t)k0 + ks * MS, s.sk, g);
    }
    float sT[MT_S][NSX][4], dpT[MT_S][NSX][4];
#pragma unroll
    for (int x = 0; x < NSX; x++) {
      const int qc = ns * NS + 8 * x + 2 * t; /* this lane's two query columns: qc, qc + 1 */
      float l0 = 0.0f, l1 = 0.0f, d0 = 0.0f, d1 = 0.0f;
      if constexpr (PDP_S) {
        const float2 l2 = *(const float2 *)(L + qc), dr = *(const float2 *)(Dr + qc);
        l0 = -l2.x * inv_c, l1 = -l2.y * inv_c, d0 = -dr.x, d1 = -dr.y; /* lse2 = +inf: acc = −inf, P = 0 */
      }
#pragma unroll
      for (int m = 0; m < MT_S; m++) {
        sT[m][x][0] = sT[m][x][2] = l0, sT[m][x][1] = sT[m][x][3] = l1;
        dpT[m][x][0] = dpT[m][x][2] = d0, dpT[m][x][1] = dpT[m][x][3] = d1;
      }
    }
    /* Masked pairs only in blocks the mask cuts. */
    const bool full = k0 + BC <= s.sk && q0 + BR <= s.sq &&
                      (a.window_right < 0 || k0 + BC - 1 <= q0 + shift + a.window_right) &&
                      (a.window_left < 0 || k0 >= q0 + BR - 1 + shift - a.window_left);
    if constexpr (!PDP_S) {
      /* fc_bwd_mma2's loop written out: through the helper, ptxas scheduled the sm_90a code of the d32 SCORE_MOD LEAN
       * kernels differently. */
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t ka[MT_S][4], va[MT_S][4];
#pragma unroll
        for (int m = 0; m < MT_S; m++) {
          fc_ldmatrix_x4(ka[m], fc_frag_addr<DS>(sK_u, kv_lane, ks * MS + 16 * m, kk));
          fc_ldmatrix_x4(va[m], fc_frag_addr<DS>(sV_u, kv_lane, ks * MS + 16 * m, kk));
        }
#pragma unroll
        for (int p = 0; p < NSX / 2; p++) {
          uint32_t qb[4], ob[4];
          fc_ldmatrix_x4(qb, fc_frag_addr<DS>(sQ_u, qb_lane, ns * NS + 16 * p, kk));
          fc_ldmatrix_x4(ob, fc_frag_addr<DS>(sdO_u, qb_lane, ns * NS + 16 * p, kk));
#pragma unroll
          for (int m = 0; m < MT_S; m++) {
            fc_mma<T>(sT[m][2 * p], ka[m], qb[0] ^ neg, qb[1] ^ neg);
            fc_mma<T>(sT[m][2 * p + 1], ka[m], qb[2] ^ neg, qb[3] ^ neg);
            fc_mma<T>(dpT[m][2 * p], va[m], ob[0], ob[1]);
            fc_mma<T>(dpT[m][2 * p + 1], va[m], ob[2], ob[3]);
          }
        }
      }
      if constexpr (SCORE_MOD) { /* Pᵀ of the modified score, and dSᵀ */
        const fc_bwd_pmask mk = {shift, a.window_left, a.window_right, q0, k0, s.sq, s.sk};
        const int kt = ks * MS + g, qt = ns * NS + 2 * t;
        const float slope = fc_score_mod_slope(a.mod, b, hh);
        const float w = (float)((int64_t)q0 + qt + s.sk - s.sq - k0 - kt);
        /* Dropout (flash_bwd.c's form): dSᵀ = Pᵀ∘g∘(Z∘dPᵀ − D) and Pᵀ∘Z for dV, Z = keep/(1 − p) */
        if (a.mod.drop_on) fc_mma_drop_apply_t<MT_S, NSX>(dpT, km, a.mod.drop_rp);
        /* attn_mask: the planes of query head hh; none read where a boolean mask keeps every pair of the walk
         * (it adds nothing where it keeps a pair, and has no dbias) */
        if (a.mod.bias && !*mask_whole) {
          const void *bp = fc_bias_plane(a.mod, b, hh);
          void *dbp = a.mod.dbias ? fc_dbias_plane(a.mod, b, hh) : nullptr;
          fc_bwd_fa2_p_mod<T, MT_S, NSX, true>(sT, dpT, L, Dr, a.mod, slope, w, mk, full, kt, qt, bp, dbp);
        } else {
          fc_bwd_fa2_p_mod<T, MT_S, NSX, false>(sT, dpT, L, Dr, a.mod, slope, w, mk, full, kt, qt, nullptr, nullptr);
        }
        if (a.mod.drop_on) fc_mma_drop_apply_t<MT_S, NSX>(sT, km, a.mod.drop_rp);
      }
      /* Pᵀ = 2^(Sᵀ·c − lse2) */
#pragma unroll
      for (int x = 0; x < NSX && !SCORE_MOD; x++) {
        const int qc = ns * NS + 8 * x + 2 * t; /* this lane's two query columns: qc, qc + 1 */
        const float2 l2 = *(const float2 *)(L + qc);
#pragma unroll
        for (int m = 0; m < MT_S; m++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int qi = qc + (e & 1), kj = ks * MS + 16 * m + g + 8 * (e >> 1);
            float p = fc_exp2(fmaf(sT[m][x][e], a.scale_log2, -(e & 1 ? l2.y : l2.x)));
            if (!full && !(k0 + kj < s.sk && q0 + qi < s.sq &&
                           fc_bwd_visible(q0 + qi, k0 + kj, shift, a.window_left, a.window_right)))
              p = 0.0f;
            sT[m][x][e] = p;
          }
      }
    } else {
      /* Sᵀ first, alone; then dPᵀ's MMAs with Pᵀ = 2^(Sᵀ·c − lse2) spread over its k-steps: in a block the
       * mask does not cut, both are one branch-free basic block, so the exponentials (SFU) and their FMAs
       * issue between independent MMAs instead of after all of them. Same operands, same registers. */
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t ka[MT_S][4];
#pragma unroll
        for (int m = 0; m < MT_S; m++) fc_ldmatrix_x4(ka[m], fc_frag_addr<DS>(sK_u, kv_lane, ks * MS + 16 * m, kk));
#pragma unroll
        for (int p = 0; p < NSX / 2; p++) {
          uint32_t qb[4];
          fc_ldmatrix_x4(qb, fc_frag_addr<DS>(sQ_u, qb_lane, ns * NS + 16 * p, kk));
#pragma unroll
          for (int m = 0; m < MT_S; m++) {
            fc_mma<T>(sT[m][2 * p], ka[m], qb[0] ^ neg, qb[1] ^ neg);
            fc_mma<T>(sT[m][2 * p + 1], ka[m], qb[2] ^ neg, qb[3] ^ neg);
          }
        }
      }
      const fc_bwd_pmask mk = {shift, a.window_left, a.window_right, q0, k0, s.sq, s.sk};
      if (full)
        fc_bwd_fa2_p_dp<T, D, DS, MS, NS, MT_S, NSX, false>(sT, dpT, sV_u, sdO_u, kv_lane, qb_lane, mk, a.scale_log2,
                                                            ks, ns, g, t);
      else if constexpr (LEAN)
        fc_bwd_fa2_p_dp<T, D, DS, MS, NS, MT_S, NSX, true, true>(sT, dpT, sV_u, sdO_u, kv_lane, qb_lane,
                                                                 fc_bwd_pmask32_of(mk, ks * MS + g, ns * NS + 2 * t),
                                                                 a.scale_log2, ks, ns, g, t);
      else
        fc_bwd_fa2_p_dp<T, D, DS, MS, NS, MT_S, NSX, true>(sT, dpT, sV_u, sdO_u, kv_lane, qb_lane, mk, a.scale_log2, ks,
                                                           ns, g, t);
    }

    /* dSᵀ = Pᵀ∘(dPᵀ − D) (PDP: the accumulator already holds dPᵀ − D; SCORE_MOD: made above) */
#pragma unroll
    for (int x = 0; x < NSX && !SCORE_MOD; x++) {
      const float2 dr = PDP ? make_float2(0.0f, 0.0f) : *(const float2 *)(Dr + ns * NS + 8 * x + 2 * t);
#pragma unroll
      for (int m = 0; m < MT_S; m++)
#pragma unroll
        for (int e = 0; e < 4; e++) dpT[m][x][e] = sT[m][x][e] * (dpT[m][x][e] - (e & 1 ? dr.y : dr.x));
    }
    if constexpr (LEAN && FC_BULK_ARCH && NS % 64 == 0) { /* k-step kk0 + i: p_lane[i] */
#if FC_BULK_ARCH
      fc_bwd_fa2_st_p_ds<T, PS, MT_S, NSX>(sT, dpT, sP_u, sdS_u, p_lane, ks * MS, ns * (NS / 16));
#endif
    } else {
#pragma unroll
      for (int m = 0; m < MT_S; m++)
#pragma unroll
        for (int x = 0; x < NSX; x++)
#pragma unroll
          for (int rh = 0; rh < 2; rh++) {
            const int r = ks * MS + 16 * m + g + 8 * rh, c = (ns * NS + 8 * x) / 8;
            *(uint32_t *)(sP + fc_tile_off<PS>(r, c) + 2 * t) = fc_pack2<T>(sT[m][x][2 * rh], sT[m][x][2 * rh + 1]);
            *(uint32_t *)(sdS + fc_tile_off<PS>(r, c) + 2 * t) = fc_pack2<T>(dpT[m][x][2 * rh], dpT[m][x][2 * rh + 1]);
          }
    }
#if FC_BULK_ARCH
    /* The last block's bulk add has read sdQ before the barrier below, behind which sdQ is written again. */
    if (BULK_DQ) fc_bulk_wait_read0_in_thread0(tid);
#endif
    __syncthreads(); /* Pᵀ and dSᵀ of all warps are in shared memory */

    /* dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i (dK's scale is applied once at the end). */
    uint32_t pa[MT_D][4], da[MT_D][4], ob[4], qb[4];
    fc_bwd_mma2<T, BR / 16, MT_D, NDV / 2, PS, DS, true, false, false>(dv, dk, pa, da, ob, qb, sP_u, sdS_u, p_lane,
                                                                       kd * MD, sdO_u, sQ_u, bt_cols, 0, 0u);

    if (QSTAGES == 1 && it + 1 < n_iter) {
      /* One Q/dO buffer (fa2pb at d256): every warp is done with Q_i, dO_i, lse2_i and D_i (dQ below reads
       * only dSᵀ and K_j), so the next block's copies run beside this block's dQ. */
      __syncthreads();
      const int nx = it + 1;
      fc_bwd_load_q<BR, D, NT>(sQ, sdO, sL, sD, a.q, a.dout, a.lse2, a.dsum, q_seq, do_seq, a.q_ss, a.do_ss, a.q_sh,
                               a.do_sh, h0 + nx / n_i, (i_begin + nx % n_i) * BR, s.sq, a.head_dim,
                               fc_bwd_v_cols<DV_COLS>(a), a.total_pad, s.pad0, tid);
      fc_cp_async_commit();
    }

    /* dQ_i += dS·K_j: this warp's MQ queries × NQ columns, NQC columns at a time, added to the fp32
     * buffer. */
    if constexpr (ATOMIC_DQ) {
#pragma unroll
      for (int ch = 0; ch < NQ / NQC; ch++) {
        float dq[MT_Q][NQX][4];
#pragma unroll
        for (int m = 0; m < MT_Q; m++)
#pragma unroll
          for (int x = 0; x < NQX; x++) dq[m][x][0] = dq[m][x][1] = dq[m][x][2] = dq[m][x][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BC / 16; kk++) {
          uint32_t dsa[MT_Q][4];
#pragma unroll
          for (int m = 0; m < MT_Q; m++) fc_ldmatrix_x4_trans(dsa[m], fc_frag_addr_at<PS>(sdS_u, ds_t[m], 16 * kk));
#pragma unroll
          for (int i = 0; i < NQX / 2; i++) {
            uint32_t kb[4];
            fc_ldmatrix_x4_trans(kb, fc_frag_addr_at<DS>(sK_u, kt_cols[ch * (NQX / 2) + i], 16 * kk));
#pragma unroll
            for (int m = 0; m < MT_Q; m++) {
              fc_mma<T>(dq[m][2 * i], dsa[m], kb[0], kb[1]);
              fc_mma<T>(dq[m][2 * i + 1], dsa[m], kb[2], kb[3]);
            }
          }
        }
        if constexpr (BULK_DQ && FC_BULK_ARCH) {
#if FC_BULK_ARCH /* the helpers exist in the sm_90 pass only */
          /* Row qm·MQ + 16m + g + 8rh, columns qn·NQ + ch·NQC + 8x + 2t, + 1 of the block's tile as one 8-byte
           * store into sdQ's blocked layout (fc_bwd_dq_blocked_offset), at a per-thread base plus a constant.
           * Rows past the sequence are stored too: their dS is 0 (P = 0 on padding rows) and the padded rows
           * of the sum are the sequence's own. */
          const int tid_q = fc_bwd_fa2_tid_again(), w_q = tid_q / 32, l_q = tid_q % 32;
          uint32_t at[4];
          fc_bwd_fa2_sdq_at(at, fc_smem_u32(sdQ), D, (w_q % WQ) * MT_Q, (w_q / WQ) * NQ, l_q / 4, l_q % 4);
#pragma unroll
          for (int m = 0; m < MT_Q; m++)
#pragma unroll
            for (int x = 0; x < NQX; x++)
#pragma unroll
              for (int rh = 0; rh < 2; rh++) {
                constexpr int TW = FC_BWD_DQ_TILE * 32 * 4; /* bytes of one 64 × 32 column tile */
                const int c0 = ch * NQC + 8 * x;            /* compile-time */
                fc_st_shared_f32x2(at[(c0 / 8) % 4] + (c0 / 32) * TW + 2048 * m + 1024 * rh, dq[m][x][2 * rh],
                                   dq[m][x][2 * rh + 1]);
              }
#endif
        } else if constexpr (BULK_DQ) {
          /* Compiled below sm_90 (no bulk add): fa2p's red.global.add.v4 below at the blocked sum's addresses
           * (4 columns stay contiguous in it). */
          const bool odd = t & 1;
#pragma unroll
          for (int m = 0; m < MT_Q; m++) {
            const int i = q0 + qm * MQ + 16 * m + g + (odd ? 8 : 0);
            const int64_t hr = (int64_t)hh * a.total_pad + s.pad0 + i;
#pragma unroll
            for (int x = 0; x < NQX; x++) {
              const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[m][x][0] : dq[m][x][2], 1);
              const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[m][x][1] : dq[m][x][3], 1);
              float *to = a.dq_accum +
                          fc_bwd_dq_blocked_index(hr, qn * NQ + ch * NQC + 4 * (t >> 1) + 8 * x, D, FC_MMA_DQ_TILE_W);
              if (i < s.sq) {
                if (odd)
                  fc_red_add4(to, r0, r1, dq[m][x][2], dq[m][x][3]);
                else
                  fc_red_add4(to, dq[m][x][0], dq[m][x][1], r0, r1);
              }
            }
          }
        } else {
          /* Four consecutive columns per red: lanes t and t^1 swap halves, so that the even lane holds row g
           * and the odd lane row g + 8, columns 8x + 4·(t/2) .. +3 of each. Columns past d add zeros. */
          const bool odd = t & 1;
#pragma unroll
          for (int m = 0; m < MT_Q; m++) {
            const int i = q0 + qm * MQ + 16 * m + g + (odd ? 8 : 0);
            float *row =
                a.dq_accum + ((s.q_row0 + i) * a.heads_q + hh) * (int64_t)D + qn * NQ + ch * NQC + 4 * (t >> 1);
#pragma unroll
            for (int x = 0; x < NQX; x++) {
              const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[m][x][0] : dq[m][x][2], 1);
              const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[m][x][1] : dq[m][x][3], 1);
              if (i < s.sq) {
                if (odd)
                  fc_red_add4(row + 8 * x, r0, r1, dq[m][x][2], dq[m][x][3]);
                else
                  fc_red_add4(row + 8 * x, dq[m][x][0], dq[m][x][1], r0, r1);
              }
            }
          }
        }
      }
#if FC_BULK_ARCH
      if constexpr (BULK_DQ) {
        fc_fence_proxy_async(); /* this thread's sdQ stores, before the copy engine reads them; thread 0 adds
                                   the tile after the next barrier (fc_bwd_fa2_sdq_add) */
      }
#endif
    }
    if (LEAN) it_h = nx_h, it_b = nx_b;
  }

  /* dK_j = scale·(dSᵀ·Q summed), dV_j: staged through sQ and sdO (a CTA barrier: other warps may still read
   * them), then stored as whole 16-byte chunks of rows. */
  fc_cp_async_wait<0>(); /* nothing may still land in shared memory (with no iteration, K_j, V_j may) */
  __syncthreads();
#if FC_BULK_ARCH
  /* The last block's tile is behind the barrier above; sdQ is not the staging of dK_j, dV_j below. */
  if (BULK_DQ && tid == 0 && n_iter > 0)
    fc_bwd_fa2_sdq_add<BR, D>(a, s.pad0, h0 + (n_iter - 1) / n_i, (i_begin + (n_iter - 1) % n_i) * BR,
                              fc_smem_u32(sdQ));
#endif
  uint16_t *sdK = sQ, *sdV = sdO;
#pragma unroll
  for (int m = 0; m < MT_D; m++)
#pragma unroll
    for (int x = 0; x < NDV; x++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const int r = kd * MD + 16 * m + g + 8 * rh, c = (nd * ND + 8 * x) / 8;
        *(uint32_t *)(sdK + fc_tile_off<DS>(r, c) + 2 * t) =
            fc_pack2<T>(a.scale * dk[m][x][2 * rh], a.scale * dk[m][x][2 * rh + 1]);
        *(uint32_t *)(sdV + fc_tile_off<DS>(r, c) + 2 * t) = fc_pack2<T>(dv[m][x][2 * rh], dv[m][x][2 * rh + 1]);
      }
  __syncthreads(); /* dK_j, dV_j of all warps are staged */
  fc_bwd_store_dkdv<BC, D, DS, NT, DV_COLS>(a, s, b, hk, k0, sdK, sdV, tid);
#if FC_BULK_ARCH
  /* The CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
  if (BULK_DQ && tid == 0) fc_bulk_wait<0>();
#endif
}

#endif /* FLASHC_CUDA_MMA_BWD_FA2_CUH */
