/* hopper_bwd.cu — cuda-hopper backward: FlashAttention-3's backward on H100/H200 (sm_90a) with TMA, wgmma and
 * warp specialisation. Verified on an H100 with tools/hopper/check_bwd.py (see tools/hopper/BWD-NOTES.md).
 *
 * With P = softmax(scale·Q·Kᵀ) recomputed from the forward's lse, and D = rowsum(dO∘O):
 *   dV = Pᵀ·dO      dP = dO·Vᵀ      dS = P∘(dP − D)      dK = scale·dSᵀ·Q      dQ = scale·dS·K
 *
 * Kernels, in order:
 *   1. prep (hopper_bwd_rows.cuh): D and lse2 = lse·log2(e) per query row, padded per sequence;
 *   2. dkdv (here): one CTA per key block K_j, V_j (Bc = 128 keys) of one kv head of one sequence; 3 warpgroups:
 *        warpgroup 0, producer (24 registers): one thread loads K_j, V_j once and then, into a ring of STAGES
 *          stages, Q_i, dO_i (TMA, Br = 64 rows; 128 at D = 64 with bulk dQ: FLASHC_HOPPER_BWD_BR) and lse2_i, D_i
 *          (bulk copies) of every (query head of the GQA group, query block i) that sees the key block, in order;
 *        warpgroups 1, 2, consumers (240 registers): keys 64·c .. 64·c + 63 of K_j each; per query block:
 *          Sᵀ = K_j·Q_iᵀ,  dPᵀ = V_j·dO_iᵀ                       wgmma m64nBrk16, all operands in shared memory
 *          Pᵀ = 2^(c·Sᵀ − lse2_i),  dSᵀ = Pᵀ∘(dPᵀ − D_i)         registers (c = scale·log2 e), masked
 *          dV_j += Pᵀ·dO_i,  dK_j += dSᵀ·Q_i                    wgmma m64nDk16, Pᵀ/dSᵀ from registers
 *          dQ_i += dS·K_j                                       dSᵀ → shared memory; warpgroup c: columns
 *                                                               (D/2)·c .. over all 128 keys, wgmma m64n(D/2)k16,
 *                                                               both operands MN-major; the fp32 product into
 *                                                               sdQ, one bulk reduce-add per tile (default; or
 *                                                               red.global.add: FLASHC_HOPPER_BWD_DQ). Br = 128:
 *                                                               warpgroup c rows 64·c .. of dQ_i, all D columns
 *        dK_j = scale·dK_j, dV_j at the end: through the free Q/dO ring, stored as 16-byte chunks (fc_hpb_store_dkdv);
 *   3. convert (hopper_bwd_rows.cuh): dQ = scale·(the fp32 sum) → 16 bits.
 * Deterministic mode (bit-identical gradients run to run): the dQ adds of one query block are made in a fixed
 * order, key block by key block, warpgroup 0 then 1, through a ticket per (query head, query block) in global
 * memory (fc_flag_wait); dK, dV are sums in registers in a fixed order anyway.
 *
 * Shared memory (tiles in 64-column halves of 128-byte rows, 128-byte swizzle, 1024-byte aligned):
 *   sK, sV [D/64][Bc][64]                    K_j, V_j (A of Sᵀ, dPᵀ; K_j also B of dQ, MN-major)
 *   sQ, sdO [STAGES][D/64][Br][64]           Q_i, dO_i ring (B of Sᵀ, dPᵀ K-major; B of dK, dV MN-major)
 *   sdS [Br/64][Bc][64]                      dSᵀ in 64-query halves, each consumer's 64 key rows in each (A of dQ,
 *                                            MN-major: one half per 64-row M-tile)
 *   sdQ [2][64][NQ] fp32                     bulk dQ: each consumer's product, bank-swizzled (fc_bwd_dq_blocked_index)
 *   sLD [STAGES][2][Br] fp32                 lse2_i, D_i
 *   mbarriers: kv_full, full[STAGES], empty[STAGES]
 *
 * This kernel waits for every wgmma group as soon as it is issued (no intra-warpgroup overlap, no ping-pong). At
 * both head dims (bulk dQ, not deterministic) the default is the second version, hopper_bwd_v2.cuh, which orders
 * each warpgroup's groups so that its CUDA-core work runs beside its own tensor work (FLASHC_HOPPER_BWD_V: 13 at
 * D = 128, 7 at D = 64 with Br = 128; both with each block's dQ issued a block later, LAG). Its persistent form,
 * fc_hopper_bwd_v2p_kernel (one CTA per SM walking the tiles; FLASHC_HOPPER_BWD_PERSIST = 1, opt-in: within ±4 % of the
 * single-tile kernel on the H100), runs the same blocks with the Q/dO ring numbered across tiles, a kv_empty barrier
 * before each new K_j, V_j, and dK, dV staged through sdS (tools/hopper/BWD-NOTES.md, "Persistent backward"). Head dims
 * 129 .. 256 (FLASHC_HOPPER_BWD_D256: 1, the default since session 10, 2 or 3): fc_hopper_bwd_d256_kernel
 * (hopper_bwd_d256.cuh: Bc = 64 keys per CTA, Sᵀ/dPᵀ split by queries and dK/dV/dQ by head-dim columns between the
 * consumer warpgroups, Pᵀ and dSᵀ through shared memory), with the same prep, blocked dQ sum (w = 64) and convert. */
#include "tail_order.cuh"
#include "common.cuh"
#include "gqa.cuh"
#include "hopper_bwd_api.cuh"
#include "hopper_bwd_rows.cuh"
#include "hopper_gemm.cuh"
#include "hopper_ptx.cuh"
#include "hopper_sched.cuh"
#include "hopper_tma.cuh"
#include "hopper_trace.cuh"
#include "hopper_wgmma.cuh"
#include "mma_host.cuh"
#include "mma_ptx.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Trace marks (hopper_trace.cuh, built with -DFC_HP_TRACE=1; tools/hopper/trace_bwd.py reads them): mark k of block
 * (or fill) n in slot `slot` (0 the producer, 1 + c consumer warpgroup c's thread 0) at index 16·n + k, tag k. */
#if FC_HP_TRACE
#define FC_HPB_MARK_AT(slot, n, k) fc_hp_mark_at((slot), 16u * (uint32_t)(n) + (k), (k), (uint32_t)(n))
#else
#define FC_HPB_MARK_AT(slot, n, k) ((void)0)
#endif

enum {
  FC_HPB_BR = 64,             /* query rows per block of the loop (Br; 128 at D = 64, bulk: FLASHC_HOPPER_BWD_BR) */
  FC_HPB_BC = 128,            /* keys per CTA: 2 consumer warpgroups × 64 */
  FC_HPB_THREADS = 384,       /* producer + 2 consumer warpgroups */
  FC_HPB_CONSUMER_WARPS = 8,  /* arrivals that release a stage */
  FC_HPB_ROW_BYTES = 128,     /* one swizzled row: 64 16-bit elements */
  FC_HPB_KV_HALF = 128 * 128, /* one 64-column half of K_j or V_j (Bc rows) */
  FC_HPB_Q_HALF = 64 * 128,   /* one 64-column half of Q_i or dO_i (Br = 64 rows; Br·128 bytes in general) */
  FC_HPB_REGS_PRODUCER = 24,  /* setmaxnreg: 128·24 + 256·240 = 64512 ≤ 65536 */
  FC_HPB_REGS_CONSUMER = 240,
  FC_HPB_BAR_DS = 1,     /* named barriers 1, 2: one consumer warpgroup each (its rows of sdS) */
  FC_HPB_BAR_DS_ALL = 3, /* named barrier 3: both consumer warpgroups (split dQ: each reads the other's rows) */
  /* The lagged version (hopper_bwd_v2.cuh, LAG): pairwise barriers of the two consumer warpgroups, 128 arrivals
   * (bar.arrive, warpgroup c) + 128 (bar.sync, the other) each */
  FC_HPB_BAR_READY = 4, /* 4 + 2c + b: warpgroup c's dSᵀ rows are in sdS buffer b */
  FC_HPB_BAR_FREE = 8,  /* 8 + 2c + b: warpgroup c's dQ wgmmas have read sdS buffer b */
  FC_HPB_BAR_TURN = 12, /* 12 + c: warpgroup c may start its Pᵀ/dSᵀ phase (LAG = 2: the ping-pong) */
};

typedef struct fc_hopper_bwd_args {
  uint16_t *dk, *dv;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  const float *lse2, *dsum; /* [hq][total_pad], rows padded per sequence (hopper_bwd_rows.cuh) */
  float *dq_accum;          /* [total_q][hq][D] fp32 */
  int *dq_ticket;           /* deterministic: [hq][total_pad / Br] turns of the dQ adds, zeroed per call */
  const int32_t *cu_q, *cu_k;
  const int64_t *cu_pad;
  int seqlen_q, seqlen_k;
  int64_t sq_pad, total_pad;
  /* GQA: each kv head's query heads are split into kv_split parts of `group` heads, one CTA per part and key block,
   * each writing its part's dK/dV (into a workspace that fc_gqa_reduce sums). heads_kv counts those parts (the real
   * kv heads · kv_split), and a tile's hk is one: it reads K/V head hk / kv_split and query heads hk·group ... */
  int heads_q, heads_kv, group, head_dim;
  int kv_split;     /* query-head parts per kv head; 1: one CTA walks the whole group */
  int n_blocks;     /* key blocks per (kv head part, sequence) */
  int n_pairs;      /* (sequence, kv head part) pairs: batch·heads_kv */
  int tail_from;    /* the single-tile kernels' first pair walked key block by key block (tail_order.cuh) */
  float scale;      /* > 0 (supports refuses a negative one) */
  float scale_log2; /* scale·log2(e) */
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
  int dk_vec, dv_vec; /* eight neighbouring elements may be stored as one 16-byte chunk */
} fc_hopper_bwd_args;

#if FC_HOPPER_ARCH
/* ---- the few instructions the forward does not use ------------------------------------------------------ */
/* Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory through the
 * copy engine; completion counts them against `bar`'s expected transaction bytes. */
static __device__ __forceinline__ void fc_hpb_bulk_load(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"((uint64_t)src), "r"(bytes), "r"(bar)
               : "memory");
}
/* Two neighbouring floats (8-byte aligned) of shared memory. */
static __device__ __forceinline__ float2 fc_hpb_ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}

/* This thread's BR / 4 values of a per-query row buffer in shared memory (lse2_i or D_i at `at`): queries 8x + 2t and
 * + 1, the columns of its Sᵀ fragments (fc_hpb_p_pass), loaded ahead of their use. */
template <int BR> static __device__ __forceinline__ void fc_hpb_ld_rows(float2 (&v)[BR / 8], uint32_t at, int t) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) v[x] = fc_hpb_ld_shared_f32x2(at + 4 * (8 * x + 2 * t));
}

/* The query blocks (Br rows) that see some key of the block [k0, k0 + Bc): [*i_begin, *i_begin + *n_i). Rows
 * i ≥ j − shift − wr see key j from the right edge, i ≤ j − shift + wl from the left (cuda-mma's dkdv walks the
 * same range). BC: 64 for the D = 256 kernel (hopper_bwd_d256.cuh). */
template <int BR, int BC = FC_HPB_BC>
static __device__ __forceinline__ void fc_hpb_query_blocks(int k0, int sq, int sk, int64_t shift, int64_t wl,
                                                           int64_t wr, int *i_begin, int *n_i) {
  int64_t i_lo = wr < 0 ? 0 : k0 - shift - wr;
  int64_t i_hi = wl < 0 ? sq : (int64_t)min(k0 + BC, sk) - 1 - shift + wl + 1;
  i_lo = max(i_lo, (int64_t)0), i_hi = min(i_hi, (int64_t)sq);
  *i_begin = (int)(i_lo / BR);
  *n_i = i_lo < i_hi ? (int)((i_hi + BR - 1) / BR) - *i_begin : 0;
}

/* One tile of the dK/dV kernels: key block jb of kv head hk of sequence b, the sequence's extents (varlen: its rows
 * in cu_q/cu_k, its first padded row in cu_pad) and the (query head, query block) pairs that see the key block. */
struct fc_hpb_tile {
  int jb, hk, k0, sk, sq, q_start, k_start, bt, i_begin, n_i, n_iter;
  int64_t b, pad0, shift;
};

/* Tile (jb, bh = b·heads_kv + hk) of key blocks of BC keys: the single-tile kernels' from blockIdx.x, the persistent
 * one's from its schedule (fc_hpb_tile_at). False: k0 ≥ sk (a key block past a shorter sequence of a varlen batch:
 * nothing to do). */
template <int BR, int BC = FC_HPB_BC>
static __device__ __forceinline__ bool fc_hpb_tile_from(const fc_hopper_bwd_args &a, int jb, int64_t bh,
                                                        fc_hpb_tile *ti) {
  ti->jb = jb;
  /* 32-bit: bh < batch·heads_kv (n_pairs, an int). A 64-bit division is a call whose result ptxas kept on the stack
   * until the epilogue in the D = 256 kernel (8 bytes of local memory per CTA). */
  const int pair = (int)bh;
  ti->hk = pair % a.heads_kv;
  ti->b = pair / a.heads_kv;
  ti->q_start = 0, ti->k_start = 0, ti->sq = a.seqlen_q, ti->sk = a.seqlen_k;
  ti->pad0 = ti->b * a.sq_pad;
  if (a.cu_q) {
    ti->q_start = a.cu_q[ti->b];
    ti->sq = a.cu_q[ti->b + 1] - ti->q_start;
    ti->k_start = a.cu_k[ti->b];
    ti->sk = a.cu_k[ti->b + 1] - ti->k_start;
    ti->pad0 = a.cu_pad[ti->b];
  }
  ti->k0 = jb * BC;
  if (ti->k0 >= ti->sk) return false;
  ti->bt = a.cu_q ? 0 : (int)ti->b; /* batch coordinate of the tensor maps */
  ti->shift = (a.bottom_right ? (int64_t)ti->sk - ti->sq : 0) + a.mask_offset;
  fc_hpb_query_blocks<BR, BC>(ti->k0, ti->sq, ti->sk, ti->shift, a.window_left, a.window_right, &ti->i_begin, &ti->n_i);
  ti->n_iter = a.group * ti->n_i; /* (query head, query block) pairs, head-major */
  return true;
}

/* The tile of this CTA in the single-tile kernels (tail_order.cuh: the grid's last pairs key block by key
 * block where a right mask edge makes the tiles unequal). */
template <int BR, int BC = FC_HPB_BC>
static __device__ __forceinline__ bool fc_hpb_tile_of_cta(const fc_hopper_bwd_args &a, fc_hpb_tile *ti) {
  int jb;
  int64_t bh;
  fc_tail_tile_of_cta(a.n_blocks, a.n_pairs, a.tail_from, &jb, &bh);
  return fc_hpb_tile_from<BR, BC>(a, jb, bh, ti);
}

/* The tile's first key row of dk or dv (g, with that view's strides): where its dK_j or dV_j goes. */
static __device__ __forceinline__ uint16_t *fc_hpb_key_rows(uint16_t *g, int64_t sb, int64_t ss, int64_t sh,
                                                            const fc_hpb_tile &ti) {
  return g + ti.b * sb + (int64_t)ti.k_start * ss + (int64_t)ti.hk * sh;
}

/* The barriers every dK/dV kernel has at `bars`: kv_full, full[STAGES] (the producer's arrive.expect_tx, then the
 * bytes), empty[STAGES] (one arrival per consumer thread). Thread 0, before the fence and the CTA barrier. */
template <int STAGES> static __device__ __forceinline__ void fc_hpb_init_barriers(uint32_t bars) {
  fc_mbar_init(bars, 1);
#pragma unroll
  for (int s = 0; s < STAGES; s++) {
    fc_mbar_init(bars + 8u * (1 + s), 1);
    fc_mbar_init(bars + 8u * (1 + STAGES + s), 32 * FC_HPB_CONSUMER_WARPS);
  }
}

/* K_j, V_j (Bc rows, halves of 64 columns) of kv head hk into sK, sV, counted against kv_full (the producer's; armed
 * here). */
template <int D>
static __device__ __forceinline__ void fc_hpb_load_kv(const CUtensorMap *tm_k, const CUtensorMap *tm_v, uint32_t sK,
                                                      uint32_t sV, uint32_t kv_full, int hk, int bt, int k_start,
                                                      int k0) {
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2;
  fc_mbar_arrive_expect_tx(kv_full, 2 * KV_BYTES);
#pragma unroll
  for (int hf = 0; hf < D / 64; hf++) {
    fc_tma_load_4d(sK + hf * FC_HPB_KV_HALF, tm_k, 64 * hf, k_start + k0, hk, bt, kv_full);
    fc_tma_load_4d(sV + hf * FC_HPB_KV_HALF, tm_v, 64 * hf, k_start + k0, hk, bt, kv_full);
  }
}

/* Fill `ring` of the Q/dO stage ring (stage ring % STAGES, the (ring / STAGES)-th use of it) with block `it` of the
 * tile's (query head, query block) pairs: Q_i, dO_i (TMA) and lse2_i, D_i (bulk copies). It first waits for the end
 * of the stage's last use (every consumer thread released it); `ring` continues across the persistent kernel's tiles.
 * The persistent kernel's (fc_hopper_bwd_v2p_kernel) copy of fc_hpb_produce's loop body, kept apart from it: routing
 * fc_hpb_produce through these two helpers changes how the compiler unrolls its loop (no longer by the 2 stages), and
 * the single-tile kernels ran 0.87–1.01× as fast on the H100 (session 10, mean 0.96;
 * bench/results/configs/hopper-bwd-shared-decode-ab.txt). */
template <int D, int BR, int STAGES>
static __device__ __forceinline__ void fc_hpb_fill(const CUtensorMap *tm_q, const CUtensorMap *tm_do,
                                                   const fc_hopper_bwd_args &a, uint32_t sQ, uint32_t sdO, uint32_t sLD,
                                                   uint32_t bars, int hk, int bt, int q_start, int64_t pad0,
                                                   int i_begin, int n_i, int it, int ring) {
  constexpr int HALVES = D / 64;
  constexpr uint32_t Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t Q_HALF = BR * FC_HPB_ROW_BYTES;          /* one 64-column half of Q_i or dO_i */
  constexpr uint32_t STAGE_TX = 2 * Q_BYTES + 2 * ROWS_BYTES; /* Q_i, dO_i, lse2_i, D_i */
  const uint32_t full = bars + 8u, empty = bars + 8u * (1 + STAGES);
  const int s = ring % STAGES, u = ring / STAGES;
  const int hh = hk * a.group + it / n_i, q0 = (i_begin + it % n_i) * BR;
  if (u > 0) fc_mbar_wait(empty + 8u * s, (u - 1) & 1);
  fc_mbar_arrive_expect_tx(full + 8u * s, STAGE_TX);
#pragma unroll
  for (int hf = 0; hf < HALVES; hf++) {
    fc_tma_load_4d(sQ + s * Q_BYTES + hf * Q_HALF, tm_q, 64 * hf, q_start + q0, hh, bt, full + 8u * s);
    fc_tma_load_4d(sdO + s * Q_BYTES + hf * Q_HALF, tm_do, 64 * hf, q_start + q0, hh, bt, full + 8u * s);
  }
  /* Padded buffers: rows q0 .. q0 + Br − 1 exist (the sequence's rows are padded to FC_BWD_ROWS_PAD, a multiple of
   * Br), 256-byte aligned (pad0 and total_pad are multiples of FC_BWD_ROWS_PAD = 128 rows, q0 of Br = 64 or 128). */
  const int64_t at = (int64_t)hh * a.total_pad + pad0 + q0;
  fc_hpb_bulk_load(sLD + s * 2 * ROWS_BYTES, a.lse2 + at, ROWS_BYTES, full + 8u * s);
  fc_hpb_bulk_load(sLD + s * 2 * ROWS_BYTES + ROWS_BYTES, a.dsum + at, ROWS_BYTES, full + 8u * s);
}

/* The producer thread of the dK/dV kernels (both versions): K_j, V_j once into sK, sV (halves of 64 columns), then
 * into the ring of STAGES stages Q_i, dO_i (TMA) and lse2_i, D_i (bulk copies) of every (query head of the GQA
 * group, query block) pair that sees the key block, head-major; fill u of stage s waits for the end of use u − 1
 * (every consumer thread released it). Barriers at `bars`: kv_full, full[STAGES], empty[STAGES]. */
template <int D, int BR, int STAGES>
static __device__ __forceinline__ void
fc_hpb_produce(const CUtensorMap *tm_q, const CUtensorMap *tm_k, const CUtensorMap *tm_v, const CUtensorMap *tm_do,
               const fc_hopper_bwd_args &a, uint32_t sK, uint32_t sV, uint32_t sQ, uint32_t sdO, uint32_t sLD,
               uint32_t bars, int hk, int bt, int k_start, int k0, int q_start, int64_t pad0, int i_begin, int n_i,
               int n_iter) {
  constexpr int HALVES = D / 64;
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t Q_HALF = BR * FC_HPB_ROW_BYTES;          /* one 64-column half of Q_i or dO_i */
  constexpr uint32_t STAGE_TX = 2 * Q_BYTES + 2 * ROWS_BYTES; /* Q_i, dO_i, lse2_i, D_i */
  const uint32_t kv_full = bars, full = bars + 8u, empty = bars + 8u * (1 + STAGES);
  fc_tma_prefetch_map(tm_q);
  fc_tma_prefetch_map(tm_k);
  fc_tma_prefetch_map(tm_v);
  fc_tma_prefetch_map(tm_do);
  fc_mbar_arrive_expect_tx(kv_full, 2 * KV_BYTES);
#pragma unroll
  for (int hf = 0; hf < HALVES; hf++) {
    fc_tma_load_4d(sK + hf * FC_HPB_KV_HALF, tm_k, 64 * hf, k_start + k0, hk / a.kv_split, bt, kv_full);
    fc_tma_load_4d(sV + hf * FC_HPB_KV_HALF, tm_v, 64 * hf, k_start + k0, hk / a.kv_split, bt, kv_full);
  }
  for (int it = 0; it < n_iter; it++) {
    const int s = it % STAGES, u = it / STAGES;
    const int hh = hk * a.group + it / n_i, q0 = (i_begin + it % n_i) * BR;
    FC_HPB_MARK_AT(0, it, 0);
    if (u > 0) fc_mbar_wait(empty + 8u * s, (u - 1) & 1);
    FC_HPB_MARK_AT(0, it, 1);
    fc_mbar_arrive_expect_tx(full + 8u * s, STAGE_TX);
#pragma unroll
    for (int hf = 0; hf < HALVES; hf++) {
      fc_tma_load_4d(sQ + s * Q_BYTES + hf * Q_HALF, tm_q, 64 * hf, q_start + q0, hh, bt, full + 8u * s);
      fc_tma_load_4d(sdO + s * Q_BYTES + hf * Q_HALF, tm_do, 64 * hf, q_start + q0, hh, bt, full + 8u * s);
    }
    /* Padded buffers: rows q0 .. q0 + Br − 1 exist (the sequence's rows are padded to FC_BWD_ROWS_PAD, a multiple of
     * Br), 256-byte aligned (pad0 and total_pad are multiples of FC_BWD_ROWS_PAD = 128 rows, q0 of Br = 64 or 128). */
    const int64_t at = (int64_t)hh * a.total_pad + pad0 + q0;
    fc_hpb_bulk_load(sLD + s * 2 * ROWS_BYTES, a.lse2 + at, ROWS_BYTES, full + 8u * s);
    fc_hpb_bulk_load(sLD + s * 2 * ROWS_BYTES + ROWS_BYTES, a.dsum + at, ROWS_BYTES, full + 8u * s);
  }
}

/* Deterministic dQ: the adders of one (query head, query block) take turns through a ticket in global memory.
 * The key blocks that see a query block are consecutive (both ends of the range above grow with k0), so the
 * turns go key block by key block, warpgroup 0 then 1: warpgroup c of key block j adds once the ticket reads
 * 2j + c, then posts 2j + c + 1. Only warpgroup 0 of the first key block of the run does not wait. A turn
 * waits only for lower key blocks of the same (kv head, sequence), i.e. CTAs of lower index, which were
 * scheduled no later. The ticket is a flag between CTAs (fc_flag_wait, fc_flag_post). */

/* Key j is visible to query i (the problem's mask, with the sequence's shift). */
static __device__ __forceinline__ bool fc_hpb_visible(int64_t i, int64_t j, int64_t shift, int64_t wl, int64_t wr) {
  return (wl < 0 || j >= i + shift - wl) && (wr < 0 || j <= i + shift + wr);
}

/* Pᵀ = 2^(c·Sᵀ − lse2_i) in place, for this thread's keys key0 (e < 2) and key0 + 8 (e ≥ 2) and queries
 * q0 + 8x + 2t + (e & 1); lse2_i at sL. Queries past the sequence have lse2 = +inf (P = 0); MASKED: keys past it
 * and pairs outside the mask are zeroed. WITH_DS: dSᵀ = Pᵀ∘(dPᵀ − D_i) in the same pass (D_i at sD), when dPᵀ is
 * ready already (version 1 at Br = 64). l2_pre: lse2_i loaded already (fc_hpb_ld_rows), else loaded here. POLY: of
 * every 8 exponentials, how many fc_exp2_poly computes on the FMA pipe (the rest: ex2 on the special-function unit;
 * H100, session 24: 1 of 8 ran 1.005-1.016x at D = 128, 2 or 3 of 8 0.97-0.995x; the forward's softmax lost 6-14 %
 * with 2-4 of 8). */
template <int BR, bool MASKED, bool WITH_DS, int POLY>
static __device__ __forceinline__ void fc_hpb_p_pass(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t sL,
                                                     uint32_t sD, float c, int t, int q0, int key0, int sk,
                                                     int64_t shift, int64_t wl, int64_t wr, const float2 *l2_pre) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    const float2 l2 = l2_pre ? l2_pre[x] : fc_hpb_ld_shared_f32x2(sL + 4 * (8 * x + 2 * t));
    const float2 dr = WITH_DS ? fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t)) : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const float arg = fmaf(st[4 * x + e], c, (e & 1) ? -l2.y : -l2.x);
      float p = (4 * x + e) % 8 < POLY ? fc_exp2_poly(arg) : fc_exp2(arg);
      if constexpr (MASKED) {
        const int qc = 8 * x + 2 * t + (e & 1), key = key0 + 8 * (e >> 1);
        if (!(key < sk && fc_hpb_visible(q0 + qc, key, shift, wl, wr))) p = 0.0f;
      }
      st[4 * x + e] = p;
      if constexpr (WITH_DS) dpt[4 * x + e] = p * (dpt[4 * x + e] - ((e & 1) ? dr.y : dr.x));
    }
  }
}

/* fc_hpb_p_pass for the block of keys k0 .. k0 + BC − 1 and queries q0 .. q0 + BR − 1, masked only where some pair
 * of it is cut. Whether it is whole is tested once, around two loops: with the test inside the loop (`if (!whole
 * && !visible) p = 0`), ptxas branched per element and unmasked blocks ran ~6 instructions per element instead of
 * 2 (session 9's ncu source view: 3x the branches of cuDNN's kernel, the exponentials a third of the samples). */
template <int BR, bool WITH_DS, int BC = FC_HPB_BC, int POLY = 0>
static __device__ __forceinline__ void
fc_hpb_p_from_s(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t sL, uint32_t sD, float c, int t, int q0, int k0,
                int key0, int sk, int64_t shift, int64_t wl, int64_t wr, const float2 *l2_pre = nullptr) {
  const bool whole =
      k0 + BC <= sk && (wr < 0 || k0 + BC - 1 <= q0 + shift + wr) && (wl < 0 || k0 >= q0 + BR - 1 + shift - wl);
  if (whole)
    fc_hpb_p_pass<BR, false, WITH_DS, POLY>(st, dpt, sL, sD, c, t, q0, key0, sk, shift, wl, wr, l2_pre);
  else
    fc_hpb_p_pass<BR, true, WITH_DS, POLY>(st, dpt, sL, sD, c, t, q0, key0, sk, shift, wl, wr, l2_pre);
}

/* dSᵀ = Pᵀ∘(dPᵀ − D_i) in place of dPᵀ (D_i at sD, the same fragment layout as fc_hpb_p_from_s). BIASED: dPᵀ − D_i
 * is what dpt holds already (fc_hpb_bias_init). */
template <int BR, bool BIASED = false>
static __device__ __forceinline__ void fc_hpb_ds_from_dp(float (&dpt)[BR / 2], const float (&st)[BR / 2], uint32_t sD,
                                                         int t) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    const float2 dr = BIASED ? make_float2(0.0f, 0.0f) : fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t));
#pragma unroll
    for (int e = 0; e < 4; e++) dpt[4 * x + e] = st[4 * x + e] * (dpt[4 * x + e] - ((e & 1) ? dr.y : dr.x));
  }
}

/* BIAS (hopper_bwd_v2.cuh): Sᵀ's and dPᵀ's accumulators start at −lse2_i/c (ST) and −D_i (DP) (the stage's rows at
 * sL, sD, this thread's query columns as fc_hpb_p_pass reads them), so that the wgmmas, accumulating from their first
 * k-step, leave Sᵀ − lse2_i/c and dPᵀ − D_i: the P pass and dSᵀ load nothing from shared memory then. lse2 = +inf
 * (queries that see no key, padding) becomes −3.4e38: finite in the tensor core's sums, and still 2^(c·x) = 0. */
template <int BR, bool ST, bool DP>
static __device__ __forceinline__ void fc_hpb_bias_init(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t sL,
                                                        uint32_t sD, float inv_c, int t) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    if constexpr (ST) {
      const float2 l2 = fc_hpb_ld_shared_f32x2(sL + 4 * (8 * x + 2 * t));
      const float bx = fmaxf(-l2.x * inv_c, -3.4e38f), by = fmaxf(-l2.y * inv_c, -3.4e38f);
#pragma unroll
      for (int e = 0; e < 4; e++) st[4 * x + e] = (e & 1) ? by : bx;
    }
    if constexpr (DP) {
      const float2 dr = fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t));
#pragma unroll
      for (int e = 0; e < 4; e++) dpt[4 * x + e] = (e & 1) ? -dr.y : -dr.x;
    }
  }
}

/* Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ for this warpgroup's 64 keys × Br queries (wgmma m64nBrk16): D/16 k-steps
 * over the head dim. Step kk reads columns 16·kk .. 16·kk + 15: 32·(kk % 4) bytes into the rows of half kk / 4
 * (hopper_gemm.cuh's fc_hp_ss_kmajor, two products interleaved, with the halves of the two tiles of different heights:
 * Br·128 bytes for Q_i, dO_i). B is Q_i, dO_i K-major: Br rows of 128 bytes, 8-row groups 1024 bytes apart (Br = 128:
 * the forward's K_j). The first step writes without reading: both are fresh values per block. */
template <typename T, int D, int BR>
static __device__ __forceinline__ void fc_hpb_sdp(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t k_rows,
                                                  uint32_t v_rows, uint32_t q_tile, uint32_t do_tile) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t oa = (kk / 4) * FC_HPB_KV_HALF + (kk % 4) * 32,
                   ob = (kk / 4) * (BR * FC_HPB_ROW_BYTES) + (kk % 4) * 32;
    const uint64_t dk = fc_wgmma_desc_off(k_rows, oa, 16, 1024), dq = fc_wgmma_desc_off(q_tile, ob, 16, 1024);
    const uint64_t dv = fc_wgmma_desc_off(v_rows, oa, 16, 1024), ddo = fc_wgmma_desc_off(do_tile, ob, 16, 1024);
    if (kk == 0) {
      fc_wgmma_ss_zero<T, BR>(st, dk, dq);
      fc_wgmma_ss_zero<T, BR>(dpt, dv, ddo);
    } else {
      fc_wgmma_ss<T, BR>(st, dk, dq);
      fc_wgmma_ss<T, BR>(dpt, dv, ddo);
    }
  }
}

/* dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i: Br/16 k-steps of 16 queries; step kb reads rows 16·kb .. 16·kb + 15 of
 * dO_i, Q_i (MN-major, imm-trans-b = 1: two 8-row groups 1024 bytes apart, the column halves Br·128 bytes
 * apart), as the forward's O += P·V_j. */
template <typename T, int D, int BR>
static __device__ __forceinline__ void fc_hpb_dkdv(float (&dv)[D / 2], float (&dk)[D / 2],
                                                   const uint32_t (&p)[BR / 16][4], const uint32_t (&ds)[BR / 16][4],
                                                   uint32_t q_tile, uint32_t do_tile) {
#pragma unroll
  for (int kb = 0; kb < BR / 16; kb++) {
    fc_wgmma_rs<T, D>(dv, p[kb], fc_wgmma_desc_off(do_tile, kb * 16 * FC_HPB_ROW_BYTES, BR * FC_HPB_ROW_BYTES, 1024));
    fc_wgmma_rs<T, D>(dk, ds[kb], fc_wgmma_desc_off(q_tile, kb * 16 * FC_HPB_ROW_BYTES, BR * FC_HPB_ROW_BYTES, 1024));
  }
}

/* dQ_i (64 queries × N columns from k_cols on) (+)= dS·K_j over 64 keys: 4 k-steps of 16 keys. A = dS is stored
 * as dSᵀ (a row per key, the queries contiguous; Br = 128: ds_rows lies in one 64-query half of sdS, M = 64 so
 * the leading offset is unused): M-major, imm-trans-a = 1; B = K_j (a row per key, the head dim
 * contiguous): N-major, imm-trans-b = 1. Step kb reads key rows 16·kb .. of both (2048 bytes on). N = 32 starts
 * 0 or 64 bytes into a swizzled 128-byte row (the swizzle is of the address, as for the K-major k-steps). ZERO:
 * the first step overwrites dq (else it adds to it). */
template <typename T, int N, bool ZERO = true>
static __device__ __forceinline__ void fc_hpb_dq(float (&dq)[N / 2], uint32_t ds_rows, uint32_t k_cols) {
#pragma unroll
  for (int kb = 0; kb < 4; kb++) {
    const uint64_t da = fc_wgmma_desc_off(ds_rows, kb * 16 * FC_HPB_ROW_BYTES, FC_HPB_Q_HALF, 1024);
    const uint64_t db = fc_wgmma_desc_off(k_cols, kb * 16 * FC_HPB_ROW_BYTES, FC_HPB_KV_HALF, 1024);
    if (ZERO && kb == 0)
      fc_wgmma_ss_tt_zero<T, N>(dq, da, db);
    else
      fc_wgmma_ss_tt<T, N>(dq, da, db);
  }
}

/* BULK: this warpgroup's dQ product (64 rows × NQ columns, the wgmma accumulator layout) into its shared-memory
 * tile, then one thread adds the whole tile to `dst` in the fp32 sum (one bulk reduce-add). The tile is the sum's
 * blocked layout (fc_bwd_dq_blocked_index, w = W): NQ / W tiles of 64 rows × W columns one after the other, which
 * is where the sum keeps them when NQ is all its ld columns (Br = 128: W = 32, NQ = D = 64). Row 16·warp + g +
 * 8·rh, columns 8x + 2t, + 1: in sub-tile x / (W / 8), the row's 16-byte chunk 2·(x % (W / 8)) + t / 2, stored
 * at that chunk ^ (2g % (W / 4)). The caller has made sure the last add from this tile has read it. */
template <int NQ, int W = NQ>
static __device__ __forceinline__ void fc_hpb_dq_tile_add(const float (&dq)[NQ / 2], uint32_t tile, float *dst,
                                                          int warp, int g, int t, int ct, int bar) {
  static_assert(NQ % W == 0 && W % 8 == 0, "whole sub-tiles of whole 16-byte chunks");
#pragma unroll
  for (int x = 0; x < NQ / 8; x++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++)
      fc_st_shared_f32x2(tile + (x / (W / 8)) * (FC_BWD_DQ_TILE * W * 4) + (16 * warp + g + 8 * rh) * (W * 4) +
                             (((2 * (x % (W / 8)) + (t >> 1)) ^ ((2 * g) % (W / 4))) << 4) + 8 * (t & 1),
                         dq[4 * x + 2 * rh], dq[4 * x + 2 * rh + 1]);
  fc_fence_proxy_async();     /* these writes, before the copy engine reads them */
  fc_named_barrier(bar, 128); /* the warpgroup's whole tile is written */
  if (ct == 0) {
    fc_bulk_reduce_add_f32(dst, tile, FC_BWD_DQ_TILE * NQ * 4);
    fc_bulk_commit();
  }
}
#endif /* FC_HOPPER_ARCH */

#if FC_HOPPER_ARCH
/* One 64-key × D tile of 16-bit values (a warpgroup's dK_j or dV_j) from shared memory at `tile` to global memory:
 * row r at r·2D bytes, its 16-byte chunk c at ((c ^ r % 8)·16) (fc_hpb_store_dkdv writes it so), key key_base + r
 * at `to` + (key_base + r)·ss; rows past the sequence (sk) and columns past head_dim are not written. Each thread
 * stores whole chunks (16 bytes when `vec`, else element by element), a warp 4 (D = 64) or 2 (D = 128) rows. */
template <int D>
static __device__ __forceinline__ void fc_hpb_store_tile(uint32_t tile, uint16_t *to, int64_t ss, int key_base, int sk,
                                                         int head_dim, int vec, int ct) {
  constexpr int CH = D / 8; /* 16-byte chunks per row */
#pragma unroll
  for (int i = 0; i < 64 * CH / 128; i++) {
    const int idx = i * 128 + ct, r = idx / CH, ch = idx % CH, key = key_base + r, col = 8 * ch;
    if (key >= sk || col >= head_dim) continue;
    const uint4 v = fc_ld_shared_v4(tile + r * 2 * D + ((ch ^ (r % 8)) << 4));
    uint16_t *dst = to + (int64_t)key * ss + col;
    if (vec && col + 8 <= head_dim) {
      fc_st_global_v4(dst, v);
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (col + e < head_dim) dst[e] = (uint16_t)(w[e / 2] >> (16 * (e % 2)));
    }
  }
}

/* The end of both dK/dV kernels: dK_j = scale·dK_j and dV_j (this warpgroup's keys k0 + 64·cw .., the accumulators'
 * rows 16·warp + g (+ 8), columns 8x + 2t, + 1) into global memory through shared memory, so that the global stores
 * are whole 16-byte chunks of rows: stored from the accumulators as 32-bit pairs, half of every 32-byte sector
 * was wasted (ncu, session 9). `stage` is where they are staged: the single-tile kernels pass the Q/dO stage ring,
 * 2 × 64 × D × 2 bytes per warpgroup at least: free once both consumer warpgroups are past the barrier below (every
 * fill has been consumed and every wgmma retired; the producer issues nothing more). The persistent kernel passes
 * sdS (the producer refills the ring for its next tile meanwhile), free once both warpgroups are past the barrier
 * below (their last dQ wgmmas, its last async-proxy readers, retired before it); with ONE_AT_A_TIME (D = 128, where
 * sdS holds one 64 × D tile per warpgroup) each warpgroup stages dK in its tile, stores it, and then dV in the same
 * tile. The smem tile is swizzled by 16-byte chunks (chunk x of row r at x ^ r % 8) so that both the pair writes and
 * the chunk reads are free of bank conflicts. */
template <typename T, int D, bool ONE_AT_A_TIME = false>
static __device__ __forceinline__ void fc_hpb_store_dkdv(const float (&dk)[D / 2], const float (&dv)[D / 2],
                                                         uint32_t stage, const fc_hopper_bwd_args &a, uint16_t *dK,
                                                         uint16_t *dV, int k0, int sk, int cw, int ct) {
  constexpr uint32_t TILE = 64 * D * 2;
  const int warp = ct / 32, g = ct % 32 / 4, t = ct % 4;
  const uint32_t tk = stage + cw * (ONE_AT_A_TIME ? 1 : 2) * TILE, tv = ONE_AT_A_TIME ? tk : tk + TILE;
  fc_named_barrier(FC_HPB_BAR_DS_ALL, 256); /* both warpgroups are done with the stages */
  fc_fence_proxy_async();                   /* after the async proxy's use of this memory, before these writes */
  if constexpr (!ONE_AT_A_TIME) {
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * warp + g + 8 * rh;
#pragma unroll
      for (int x = 0; x < D / 8; x++) {
        const uint32_t off = r * 2 * D + ((x ^ (r % 8)) << 4) + 4 * t;
        fc_st_shared_u32(tk + off, fc_pack2<T>(a.scale * dk[4 * x + 2 * rh], a.scale * dk[4 * x + 2 * rh + 1]));
        fc_st_shared_u32(tv + off, fc_pack2<T>(dv[4 * x + 2 * rh], dv[4 * x + 2 * rh + 1]));
      }
    }
    fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the warpgroup's tiles are written */
    fc_hpb_store_tile<D>(tk, dK, a.dk_ss, k0 + 64 * cw, sk, a.head_dim, a.dk_vec, ct);
    fc_hpb_store_tile<D>(tv, dV, a.dv_ss, k0 + 64 * cw, sk, a.head_dim, a.dv_vec, ct);
  } else {
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * warp + g + 8 * rh;
#pragma unroll
      for (int x = 0; x < D / 8; x++)
        fc_st_shared_u32(tk + r * 2 * D + ((x ^ (r % 8)) << 4) + 4 * t,
                         fc_pack2<T>(a.scale * dk[4 * x + 2 * rh], a.scale * dk[4 * x + 2 * rh + 1]));
    }
    fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the warpgroup's dK tile is written */
    fc_hpb_store_tile<D>(tk, dK, a.dk_ss, k0 + 64 * cw, sk, a.head_dim, a.dk_vec, ct);
    fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... and read: dV goes into the same tile */
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * warp + g + 8 * rh;
#pragma unroll
      for (int x = 0; x < D / 8; x++)
        fc_st_shared_u32(tv + r * 2 * D + ((x ^ (r % 8)) << 4) + 4 * t,
                         fc_pack2<T>(dv[4 * x + 2 * rh], dv[4 * x + 2 * rh + 1]));
    }
    fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the warpgroup's dV tile is written */
    fc_hpb_store_tile<D>(tv, dV, a.dv_ss, k0 + 64 * cw, sk, a.head_dim, a.dv_vec, ct);
  }
}
#endif /* FC_HOPPER_ARCH */

/* SPLIT: the two consumer warpgroups split dQ_i by columns instead of by keys: warpgroup c computes columns
 * N·c .. N·c + N − 1 (N = D / 2) over all 128 keys of K_j (both warpgroups' rows of dSᵀ), so that every element
 * of dQ_i gets one fp32 reduction per CTA instead of two (ncu: the backward is L2-bound on these reductions). The
 * price: both warpgroups meet at a barrier before and after writing dSᵀ. */
/* BULK (not with DET): each warpgroup writes its 64 × 64 fp32 dQ tile into its own buffer of shared memory and
 * one thread adds the whole tile into the sum with one bulk reduce-add (FlashAttention-3's dQ path), instead of
 * 8 red.global.add.v4 per thread and 64 columns. The sum then has the blocked layout of fc_hpb_dq_tile. */
template <typename T, int D, int STAGES, bool DET, bool SPLIT, bool BULK, int BR>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                         const fc_hopper_bwd_args a) {
#if FC_HOPPER_ARCH
  constexpr int HALVES = D / 64;
  /* BR = 128 (bulk dQ at D = 64 only): warpgroup c's dQ product is query rows 64·c .. 64·c + 63 of dQ_i, all D
   * columns, over all 128 keys (a split by rows, not columns: one m64n64k16 chain, and one bulk add of 16 KB
   * whose destination, two W = 32 tiles of the blocked sum, is contiguous). */
  constexpr bool ROWSPLIT = BR == 128;
  constexpr int NQ = ROWSPLIT ? D : SPLIT ? D / 2 : 64; /* columns of one dQ product */
  constexpr int DQ_W = SPLIT ? D / 2 : 64;              /* BULK: the blocked sum's tile width (fc_hpb_dq_tile_w) */
  static_assert(!(BULK && DET), "the deterministic turns are made with red.global.add");
  static_assert(!BULK || SPLIT, "one sdQ tile per warpgroup: one dQ product per block");
  static_assert(BR == 64 || (BR == 128 && D == 64 && BULK), "Br = 128 is written for the bulk kernel at D = 64");
  static_assert(FC_BWD_ROWS_PAD % BR == 0, "a query block stays inside its sequence's padded rows");
  constexpr uint32_t DQ_TILE_BYTES = FC_BWD_DQ_TILE * NQ * 4; /* BULK: 64 rows × NQ columns, fp32 */
  constexpr int DS_BAR_THREADS = SPLIT ? 256 : 128;
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_HALF = FC_HPB_BC * FC_HPB_ROW_BYTES; /* sdS: the dSᵀ of 64 queries, all Bc keys */
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* Aligned by hand to 1024 bytes (the swizzle pattern's period); the launch adds the slack. */
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
  const uint32_t sdQ = sdS + DS_BYTES; /* BULK: one DQ_TILE_BYTES tile per consumer warpgroup */
  const uint32_t sLD = sdQ + (BULK ? 2 * DQ_TILE_BYTES : 0), bars = sLD + STAGES * 2 * ROWS_BYTES;
  const uint32_t kv_full = bars;
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))

  /* Which tile (fc_hpb_tile_of_cta). */
  fc_hpb_tile ti;
  if (!fc_hpb_tile_of_cta<BR>(a, &ti)) return; /* the whole CTA, before any barrier */
  const int jb = ti.jb, hk = ti.hk, q_start = ti.q_start, k_start = ti.k_start, sq = ti.sq, sk = ti.sk, k0 = ti.k0;
  const int bt = ti.bt, i_begin = ti.i_begin, n_i = ti.n_i, n_iter = ti.n_iter;
  const int64_t pad0 = ti.pad0, shift = ti.shift;
  const int64_t q_row0 = a.cu_q ? q_start : ti.b * a.seqlen_q; /* the sequence's first row of the dQ sum */
  int prev_begin = 0, prev_n = 0;                              /* DET: the previous key block's query blocks */
  if (DET && jb > 0)
    fc_hpb_query_blocks<BR>(k0 - FC_HPB_BC, sq, sk, shift, a.window_left, a.window_right, &prev_begin, &prev_n);

  if (threadIdx.x == 0) {
    fc_hpb_init_barriers<STAGES>(bars);
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */

  if (threadIdx.x < 128) {
    /* ---- producer ---------------------------------------------------------------------------------- */
    fc_setmaxnreg_dec<FC_HPB_REGS_PRODUCER>();
    if (threadIdx.x == 0 && n_iter > 0)
      fc_hpb_produce<D, BR, STAGES>(&tm_q, &tm_k, &tm_v, &tm_do, a, sK, sV, sQ, sdO, sLD, bars, hk, bt, k_start, k0,
                                    q_start, pad0, i_begin, n_i, n_iter);
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    fc_setmaxnreg_inc<FC_HPB_REGS_CONSUMER>();
    /* The warpgroup index through a shuffle: provably warp-uniform, so that the descriptors derived from it
     * live in uniform registers (hopper.cu explains why that matters). */
    const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
    const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t = lane % 4;
    const uint32_t k_rows = sK + 64 * cw * FC_HPB_ROW_BYTES; /* this warpgroup's 64 keys (in each half) */
    const uint32_t v_rows = sV + 64 * cw * FC_HPB_ROW_BYTES;
    const uint32_t ds_rows = sdS + 64 * cw * FC_HPB_ROW_BYTES; /* and its 64 rows of dSᵀ */
    const int key0 = k0 + 64 * cw + 16 * warp + g;             /* this thread's keys: key0, key0 + 8 */
    const float c = a.scale_log2;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int x = 0; x < D / 2; x++) dk[x] = dv[x] = 0.0f;
    if (n_iter > 0) fc_mbar_wait(kv_full, 0); /* K_j, V_j have landed */

    /* PIPE (bulk dQ at D = 64, where the registers allow it): block it + 1's Sᵀ, dPᵀ wgmma is issued right after
     * block it's dK/dV and dQ wgmmas, so that it runs beside this block's dQ tile store, bulk add and stage
     * release (block 0's before the loop). At D = 128 the extra live accumulators would not fit 240 registers.
     * ptxas must be able to see which wgmma groups a wait retires: the loop body commits the same groups on
     * every path (no test of the iteration around them), else it adds waits (C7517) or serialises (C7514). */
    constexpr bool PIPE = BULK && D == 64 && BR == 64; /* BR = 128: Sᵀ, dPᵀ are 64 + 64 registers already */
    float st[BR / 2], dpt[BR / 2];
    if (PIPE && n_iter > 0) { /* block 0's Sᵀ, dPᵀ */
      fc_mbar_wait(FULL(0), 0);
      fc_wgmma_fence();
      fc_hpb_sdp<T, D, BR>(st, dpt, k_rows, v_rows, sQ, sdO);
      fc_wgmma_commit();
    }
    for (int it = 0; it < n_iter; it++) {
      const int s = it % STAGES, u = it / STAGES;
      const int hh = hk * a.group + it / n_i, q0 = (i_begin + it % n_i) * BR;
      const uint32_t q_tile = sQ + s * Q_BYTES, do_tile = sdO + s * Q_BYTES;
      const uint32_t sL = sLD + s * 2 * ROWS_BYTES, sD = sL + ROWS_BYTES;
      float dq_pipe[NQ / 2]; /* PIPE: this block's dQ product, issued in the first half, added in the second */
      int *ticket = NULL;
      /* Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ (PIPE: issued by the last iteration; BR = 128: two groups, Sᵀ first) */
      if constexpr (!PIPE) {
        fc_mbar_wait(FULL(s), u & 1); /* Q_i, dO_i, lse2_i, D_i have landed */
        fc_fence_regs(dk);
        fc_fence_regs(dv);
        fc_wgmma_fence();
        if constexpr (BR == 128) {
          fc_hp_ss_kmajor<T, D, BR>(st, k_rows, q_tile); /* Sᵀ, then dPᵀ: two groups */
          fc_wgmma_commit();
          fc_hp_ss_kmajor<T, D, BR>(dpt, v_rows, do_tile);
        } else {
          fc_hpb_sdp<T, D, BR>(st, dpt, k_rows, v_rows, q_tile, do_tile);
        }
        fc_wgmma_commit();
      }
      if constexpr (BR == 128) { /* Sᵀ only: dPᵀ's wgmma runs on beside Pᵀ's exponentials */
        fc_wgmma_wait<1>();
        fc_fence_regs(st);
      } else {
        fc_wgmma_wait<0>();
        fc_fence_regs(st);
        fc_fence_regs(dpt);
      }

      /* Pᵀ = 2^(c·Sᵀ − lse2_i), masked; dSᵀ = Pᵀ∘(dPᵀ − D_i). BR = 128: Pᵀ first, while dPᵀ's wgmma group still
       * runs, then dSᵀ; BR = 64: both in one pass. */
      constexpr bool P_FIRST = BR == 128;
      fc_hpb_p_from_s<BR, !P_FIRST>(st, dpt, sL, sD, c, t, q0, k0, key0, sk, shift, a.window_left, a.window_right);
      if constexpr (P_FIRST) {
        fc_wgmma_wait<0>(); /* dPᵀ */
        fc_fence_regs(dpt);
        fc_hpb_ds_from_dp<BR>(dpt, st, sD, t);
      }
      /* Packed to 16 bits as A fragments (the accumulators of query columns 16·kb .. 16·kb + 15 are A's registers
       * of k-step kb, as P in the forward). */
      uint32_t pp[BR / 16][4], dsp[BR / 16][4];
#pragma unroll
      for (int kb = 0; kb < BR / 16; kb++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          pp[kb][r] = fc_pack2<T>(st[8 * kb + 2 * r], st[8 * kb + 2 * r + 1]);
          dsp[kb][r] = fc_pack2<T>(dpt[8 * kb + 2 * r], dpt[8 * kb + 2 * r + 1]);
        }

      /* dSᵀ into this warpgroup's rows of sdS, swizzled as TMA would write it: in half x / 8 (queries 64·(x / 8)
       * .., DS_HALF bytes apart; Br = 64: one), row r (a key), 16-byte chunk x % 8 (queries 8x .. 8x + 7) at
       * r·128 + (((x % 8) ^ (r % 8))·16); this thread's rows have r % 8 = g. */
      fc_fence_proxy_async(); /* after the async proxy's reads of sdS (the last dQ wgmma), before these writes */
      /* Every warp of the warpgroup (SPLIT: of both, whose dQ wgmmas read these rows too) is past the last
       * block's dQ wgmma wait: none still reads sdS. */
      const int ds_bar = SPLIT ? (int)FC_HPB_BAR_DS_ALL : FC_HPB_BAR_DS + cw;
      /* BULK: the last block's bulk add has read this warpgroup's sdQ tile before anyone writes it again (below,
       * after this barrier). */
      if (BULK && ct == 0) fc_bulk_wait_read<0>();
      fc_named_barrier(ds_bar, DS_BAR_THREADS);
#pragma unroll
      for (int x = 0; x < BR / 8; x++)
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
          const int r = 16 * warp + g + 8 * rh;
          /* dpt[4x + 2rh], dpt[4x + 2rh + 1], packed above as dsp[x / 2][2·(x % 2) + rh] */
          fc_st_shared_u32(ds_rows + (x / 8) * DS_HALF + r * FC_HPB_ROW_BYTES + (((x % 8) ^ g) << 4) + 4 * t,
                           dsp[x / 2][2 * (x % 2) + rh]);
        }
      fc_fence_proxy_async();                   /* these generic writes, before the async proxy (wgmma) reads them */
      fc_named_barrier(ds_bar, DS_BAR_THREADS); /* the warpgroup's (SPLIT: both's) dSᵀ rows are in shared memory */

      /* dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i */
      fc_wgmma_fence();
      fc_hpb_dkdv<T, D, BR>(dv, dk, pp, dsp, q_tile, do_tile);
      fc_wgmma_commit();

      /* dQ_i += dS·K_j for this warpgroup's keys, 64 columns at a time, added into the fp32 sum: lanes t and
       * t ^ 1 swap halves so that each red adds four consecutive columns of one row (even lane: row g, odd lane:
       * row g + 8). Rows past the sequence are skipped (their dS is 0, but the rows belong to another one). */
      const bool odd = t & 1;
      const int qrow = q0 + 16 * warp + g + (odd ? 8 : 0);
      float *dq_row = a.dq_accum + ((q_row0 + qrow) * a.heads_q + hh) * (int64_t)D + 4 * (t >> 1);
      if constexpr (DET) {
        /* Wait for this warpgroup's turn (fc_flag_wait); the previous key block saw query block q0 / Br
         * iff it lies in that block's range. */
        const int ib = q0 / BR;
        const bool first = cw == 0 && !(prev_n > 0 && ib >= prev_begin && ib < prev_begin + prev_n);
        ticket = a.dq_ticket + ((int64_t)hh * a.total_pad + pad0 + q0) / BR;
        if (ct == 0 && !first) fc_flag_wait(ticket, 2 * jb + cw, 32);
        fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the whole warpgroup adds after the acquire */
      }
      if constexpr (PIPE) { /* SPLIT: both warpgroups' dSᵀ rows, this warpgroup's NQ columns */
        const uint32_t k_cols = sK + NQ * cw * 2;
        fc_wgmma_fence();
        fc_hpb_dq<T, NQ>(dq_pipe, sdS, k_cols);
        fc_hpb_dq<T, NQ, false>(dq_pipe, sdS + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
        fc_wgmma_commit();
      } else {
#pragma unroll
        for (int h = 0; h < (SPLIT ? 1 : HALVES); h++) {
          const int col0 = ROWSPLIT ? 0 : SPLIT ? NQ * cw : 64 * h; /* this product's first column of dQ_i */
          const int row0 = ROWSPLIT ? 64 * cw : 0;                  /* and its first row */
          float dq[NQ / 2];
          fc_wgmma_fence();
          if constexpr (ROWSPLIT) { /* queries 64·cw .. (half cw of sdS); keys 0 .. 63, then 64 .. 127 */
            fc_hpb_dq<T, NQ>(dq, sdS + cw * DS_HALF, sK);
            fc_hpb_dq<T, NQ, false>(dq, sdS + cw * DS_HALF + 64 * FC_HPB_ROW_BYTES, sK + 64 * FC_HPB_ROW_BYTES);
          } else if constexpr (SPLIT) { /* keys 0 .. 63 (warpgroup 0's dSᵀ rows), then 64 .. 127 */
            const uint32_t k_cols = sK + (col0 / 64) * FC_HPB_KV_HALF + (col0 % 64) * 2;
            fc_hpb_dq<T, NQ>(dq, sdS, k_cols);
            fc_hpb_dq<T, NQ, false>(dq, sdS + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
          } else {
            fc_hpb_dq<T, NQ>(dq, ds_rows, k_rows + h * FC_HPB_KV_HALF);
          }
          fc_wgmma_commit();
          fc_wgmma_wait<0>();
          fc_fence_regs(dq);
          if constexpr (BULK) {
            /* the tile of head-rows hh·total_pad + pad0 + q0 + row0 (a multiple of 64) and columns col0 .. */
            fc_hpb_dq_tile_add<NQ, DQ_W>(dq, sdQ + cw * DQ_TILE_BYTES,
                                         a.dq_accum + ((int64_t)hh * a.total_pad + pad0 + q0 + row0) * D +
                                             col0 * FC_BWD_DQ_TILE,
                                         warp, g, t, ct, FC_HPB_BAR_DS + cw);
          } else {
#pragma unroll
            for (int x = 0; x < NQ / 8; x++) {
              const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * x + 0] : dq[4 * x + 2], 1);
              const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[4 * x + 1] : dq[4 * x + 3], 1);
              if (qrow < sq) {
                if (odd)
                  fc_red_add4(dq_row + col0 + 8 * x, r0, r1, dq[4 * x + 2], dq[4 * x + 3]);
                else
                  fc_red_add4(dq_row + col0 + 8 * x, dq[4 * x + 0], dq[4 * x + 1], r0, r1);
              }
            }
          }
        }
      }
      if constexpr (PIPE) {
        /* Block it + 1's Sᵀ, dPᵀ; the last block issues its own again (discarded; its stage is not refilled), so
         * that every iteration commits one group and the waits below are the same on every path (ptxas cannot
         * tell that two tests of it + 1 < n_iter agree, and would add waits). dk, dv are not touched here: their
         * wgmma is in flight. */
        const int nx = it + 1 < n_iter ? it + 1 : it, s1 = nx % STAGES;
        if (it + 1 < n_iter) fc_mbar_wait(FULL(s1), (nx / STAGES) & 1); /* Q_i, dO_i, lse2_i, D_i of block it + 1 */
        fc_wgmma_fence();
        fc_hpb_sdp<T, D, BR>(st, dpt, k_rows, v_rows, sQ + s1 * Q_BYTES, sdO + s1 * Q_BYTES);
        fc_wgmma_commit();
      }
      if constexpr (PIPE) { /* this block's dK/dV and dQ groups are done; the next Sᵀ, dPᵀ may still run */
        fc_wgmma_wait<1>();
        fc_fence_regs(dk);
        fc_fence_regs(dv);
        fc_fence_regs(dq_pipe);
        fc_hpb_dq_tile_add<NQ>(dq_pipe, sdQ + cw * DQ_TILE_BYTES,
                               a.dq_accum + ((int64_t)hh * a.total_pad + pad0 + q0) * D + NQ * cw * FC_BWD_DQ_TILE,
                               warp, g, t, ct, FC_HPB_BAR_DS + cw);
      }
      if constexpr (DET) {
        __threadfence();                           /* this thread's adds are performed ... */
        fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... every thread's, before the turn passes on */
        if (ct == 0) fc_flag_post(ticket, 2 * jb + cw + 1);
      }
      if constexpr (!PIPE) { /* dV, dK of this block are done (the waits above covered them) */
        fc_wgmma_wait<0>();
        fc_fence_regs(dk);
        fc_fence_regs(dv);
      }
      /* Q_i, dO_i, lse2_i, D_i of stage s are read: it may be refilled. Every consumer thread arrives: an
       * arrive releases only the arriving thread's own reads of sL/sD (racecheck found the next bulk fill
       * racing with the other lanes' reads when lane 0 arrived for its warp). */
      fc_mbar_arrive_if(EMPTY(s), true);
    }
    if constexpr (PIPE) fc_wgmma_wait<0>(); /* the last, discarded Sᵀ, dPᵀ (dk, dv were fenced after wait 1) */
    /* BULK: the CTA's shared memory lives until the last bulk add has read it, and the adds are complete. */
    if (BULK && ct == 0) fc_bulk_wait<0>();

    uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti);
    uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti);
    static_assert(2 * STAGES * Q_BYTES >= 2 * 2 * 64 * D * 2, "the stage ring holds both warpgroups' dK, dV tiles");
    fc_hpb_store_dkdv<T, D>(dk, dv, sQ, a, dK, dV, k0, sk, cw, ct);
  }
#undef FULL
#undef EMPTY
#endif /* FC_HOPPER_ARCH */
}

/* The second version of the D = 128 kernel (FLASHC_HOPPER_BWD_V): its own file, sharing the helpers above. */
#include "hopper_bwd_v2.cuh"
/* The D = 256 kernel (FLASHC_HOPPER_BWD_D256): its own file, sharing the helpers above. */
#include "hopper_bwd_d256.cuh"

/* ---- host ------------------------------------------------------------------------------------------------ */
/* How the key blocks add dQ into the fp32 sum (FLASHC_HOPPER_BWD_DQ, read at every call, for comparisons):
 *   each:  every warpgroup its own 64 keys' share of all columns, red.global.add (two reductions per element
 *          per CTA);
 *   split: warpgroup c columns (D / 2)·c .. over all 128 keys, red.global.add (one per element per CTA; H100,
 *          session 5, D = 128: 1.20-1.31x each at seqlen >= 1k);
 *   bulk:  split's products, each a tile in shared memory added with one bulk reduce-add (H100, session 5, seqlen
 *          >= 1k: 1.10-1.26x split at D = 128, 1.05-1.12x at D = 64; at D = 64 each's products with bulk adds
 *          ran as fast, measured and dropped).
 * Unset: bulk. The deterministic mode runs split's (for bulk's) or each's kernel with its turns. */
typedef enum { FC_HPB_DQ_EACH, FC_HPB_DQ_SPLIT, FC_HPB_DQ_BULK } fc_hpb_dq_mode;

static flashc_status fc_hpb_dq_mode_get(const fc_problem *p, fc_hpb_dq_mode *mode) {
  static const char *const names[] = {"each", "split", "bulk"};
  int m = 0;
  FC_CHECK(fc_env_choice("FLASHC_HOPPER_BWD_DQ", names, (int)(sizeof names / sizeof names[0]), FC_HPB_DQ_BULK,
                         "flashc_backward (cuda-hopper)", &m));
  *mode = (fc_hpb_dq_mode)m;
  if (p->deterministic && *mode == FC_HPB_DQ_BULK) *mode = FC_HPB_DQ_SPLIT;
  return FLASHC_OK;
}

/* The query rows per block (FLASHC_HOPPER_BWD_BR, read at every call, for comparisons): 64, or 128 (FlashAttention-3's
 * kBlockM at head dim 64: half the per-block barriers, waits, stage hand-overs and dQ adds per unit of tensor
 * work). 128 is built for the bulk kernel at D = 64 only; elsewhere 64 runs, silently. Unset: 128 (measured on
 * the H100: 1.04-1.13x Br = 64 at head dim 64, bench/results/configs/hopper-bwd-br128.txt). */
static flashc_status fc_hpb_br_get(const fc_problem *p, fc_hpb_dq_mode mode, int *br) {
  static const char *const names[] = {"64", "128"};
  int m = 0;
  FC_CHECK(fc_env_choice("FLASHC_HOPPER_BWD_BR", names, (int)(sizeof names / sizeof names[0]), 1,
                         "flashc_backward (cuda-hopper)", &m));
  *br = m == 1 && p->head_dim <= 64 && mode == FC_HPB_DQ_BULK ? 128 : FC_HPB_BR;
  return FLASHC_OK;
}

/* The second kernel's version (FLASHC_HOPPER_BWD_V, read at every call, for comparisons): 1, the kernel above;
 * 2, hopper_bwd_v2.cuh (FlashAttention-3's order of the wgmma groups, each warpgroup's CUDA-core work beside its
 * own tensor work); 3, 2 with block i + 1's Sᵀ issued behind block i's dK; 4, D = 128: 3 with 3 Q/dO stages; D =
 * 64 (where a 3rd stage does not fit): 3 with that Sᵀ issued before block i's dQ store instead of after it; 5, 6:
 * 3, 4 with dV issued before the dPᵀ wait (D = 128 always does: there 5, 6 run 3, 4; D = 64 runs 2 to 4 with dV
 * issued after dSᵀ is formed, fewer registers). 7: each block's dQ issued one block later (LAG: no barrier of both
 * warpgroups per block, hopper_bwd_v2.cuh; D = 128: 3 with it, D = 64: 2 with it). D = 64: 8, 3 with LAG. D = 128
 * (9, 10 at D = 64 run 2): 8, 7 with the two warpgroups' Pᵀ/dSᵀ phases taking turns (ping-pong); 9, 10: 3 with the
 * Sᵀ/dPᵀ accumulators started at −lse2/c, −D (BIAS; 10 loads D at the block's start); 11: 7 and 9; 12: 2 with LAG
 * (no NEXT); 13: 12 with BIAS (the accumulators biased at the block's start). The second version
 * is built for bulk dQ only (not deterministic: fc_hpb_dq_mode_get runs split there), at D = 64 with Br = 128 only
 * (fc_hpb_br_get); elsewhere 1 runs, silently. Unset: 13 at d > 64 (H100, session 26, bf16 d128, power-capped
 * steady state, 2 rounds: +0.5..1.6 % over 11 at 2k full and causal, 4k, 8k full and causal, and no local memory
 * where 11 spills 8 bytes; 12 0.96-0.98x of 11: configs/hopper-s26-lag-d64.txt; session 25: 11 +2.9..6.6 % over 3,
 * 7 +1.3..3.7 %: bench/results/configs/hopper-s25-lag-bias.txt; 3 was
 * +3.7..9.4 % over 1 in session 8: configs/hopper-bwd-v2.txt), 7 at d ≤ 64 with Br = 128 (session 26, same method:
 * +6.8..13.1 % over 2 at 2k full and causal, 4k, 8k full, 8 +3.9..8.0 %: configs/hopper-s26-lag-d64.txt; 2 was
 * +0.2..2.9 % over 1 at every cell, 3..6 within ±2 %: configs/hopper-bwd-v2-d64.txt). */
static flashc_status fc_hpb_version_get(const fc_problem *p, fc_hpb_dq_mode mode, int br, int *version) {
  static const char *const names[] = {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13"};
  int m = -1; /* -1: unset */
  FC_CHECK(fc_env_choice("FLASHC_HOPPER_BWD_V", names, (int)(sizeof names / sizeof names[0]), -1,
                         "flashc_backward (cuda-hopper)", &m));
  if (p->head_dim > 64)
    *version = mode != FC_HPB_DQ_BULK ? 1 : m < 0 ? 13 : m == 4 || m == 5 ? m - 1 : m + 1; /* 5, 6: 3, 4 */
  else
    *version = br != 128 ? 1 : m < 0 ? 7 : m >= 8 ? 2 : m + 1; /* br = 128: bulk, not deterministic (fc_hpb_br_get) */
  return FLASHC_OK;
}

/* The persistent second version (FLASHC_HOPPER_BWD_PERSIST, read at every call, for comparisons): 1 runs
 * fc_hopper_bwd_v2p_kernel (hopper_bwd_v2.cuh: one CTA per SM walking the tiles) where the default version of the
 * second kernel would run (D = 128: 13, 11, or 3, whose form it has; D = 64: 2; bulk dQ, not deterministic); elsewhere,
 * and with another version
 * set, the single-tile kernels run, silently. 3 (for tests): the same with at most 3 CTAs, so that small problems
 * walk many tiles per CTA. Unset or 0: off. H100, session 10 (bench/results/configs/hopper-bwd-persist.txt): in
 * its best order (dynamic) +0.7..4.3 % over the single-tile kernel at 512–1k, −2..5 % at 4k–16k; not the default.
 * *max_ctas: 0 off, else the grid's cap. */
static flashc_status fc_hpb_persist_get(const fc_problem *p, int version, int *max_ctas) {
  static const char *const names[] = {"0", "1", "3"};
  int m = 0;
  FC_CHECK(fc_env_choice("FLASHC_HOPPER_BWD_PERSIST", names, (int)(sizeof names / sizeof names[0]), 0,
                         "flashc_backward (cuda-hopper)", &m));
  const bool runs =
      m > 0 && (p->head_dim > 64 ? version == 3 || version == 11 || version == 13 : version == 2 || version == 7);
  *max_ctas = !runs ? 0 : m == 2 ? 3 : INT32_MAX;
  return FLASHC_OK;
}

/* The head-dim-256 kernel (FLASHC_HOPPER_BWD_D256, read at every call, like the variables above; only at head dims
 * past 128): 4 (unset) runs the backward at d = 129 .. 256 with fc_hopper_bwd_d256_kernel<T, NEXT = true, WHOLE =
 * true, EDV = true> (hopper_bwd_d256.cuh: each consumer warpgroup one whole product at N = 64, Sᵀ or dPᵀ, and dV
 * issued before the block's barrier B), 3 the same with dV after B, 1 with WHOLE = false (half of both at N = 32 each,
 * above the shared-memory rate), 2 that without NEXT (every wgmma group waited for within its block); 0 refuses those
 * head dims, so that auto takes cuda-mma's backward. H100, session 10 (bf16, 16k tokens; bench/results/configs/
 * hopper-bwd-d256.txt): 1 runs 1.0–1.26× cuDNN, 1.5–1.7× SDPA flash, 1.4× cuda-mma; 3 +0.9..5.9 % over 1 at every
 * cell, 2 0.88–0.99× of 1. Session 27 (configs/hopper-s27-d256-bwd.txt): 4 +0.9..2.0 % over 3 (three A/B runs).
 * *variant: 0 off, else the value. */
static flashc_status fc_hpb_d256_get(int *variant) {
  static const char *const names[] = {"0", "1", "2", "3", "4"};
  return fc_env_choice("FLASHC_HOPPER_BWD_D256", names, (int)(sizeof names / sizeof names[0]), 4,
                       "flashc_backward (cuda-hopper)", variant);
}

/* The columns of one tile of the blocked dQ sum (w of fc_bwd_dq_blocked_index), or 0 (red.global.add). */
static int fc_hpb_dq_tile_w(fc_hpb_dq_mode mode, int d) { return mode == FC_HPB_DQ_BULK ? d / 2 : 0; }

/* Dynamic shared memory of one CTA: the tiles, lse2/D rows, barriers, and 1024 bytes of slack for the
 * alignment. D = 128, 2 stages: 64 + 64 + 16 + 1 KB + … = 146 KB (bulk: + 32 KB); D = 64, 3 stages:
 * 32 + 48 + 16 + … = 98 KB (bulk: + 16 KB). D = 64 with Br = 128, 3 stages, bulk: sK, sV 32 KB + sQ, sdO
 * 3 × 32 KB + sdS 32 KB + sdQ 2 × 16 KB + sLD 3 KB + 56 + 1024 = 200760 bytes (196 KB ≤ 227 KB; a 4th stage
 * would need 233 KB). */
static size_t fc_hpb_smem_bytes(int d, int stages, int dq_tile_w, int br) {
  return (size_t)2 * FC_HPB_BC * d * 2 + (size_t)stages * 2 * br * d * 2 + (size_t)FC_HPB_BC * br * 2 +
         (size_t)2 * br * dq_tile_w * 4 + (size_t)stages * 2 * br * 4 + 8 * (1 + 2 * stages) + 1024;
}

/* The second version (hopper_bwd_v2.cuh): sK, sV, the stages, sdS twice, sdQ 2 × 16 KB, lse2/D rows, barriers
 * and the alignment slack. D = 128 (Br = 64), 2 stages: 198696 bytes; 3: 231992. D = 64 (Br = 128), 2 stages:
 * 32 + 64 + 64 + 32 KB + 2 KB + 40 + 1024 = 199720 bytes (3 stages would need 233528, past the 232448 allowed). */
static size_t fc_hpb_v2_smem_bytes(int d, int stages) {
  const size_t br = d == 64 ? 128 : FC_HPB_BR;
  return 2 * FC_HPB_BC * (size_t)d * 2 + (size_t)stages * 2 * br * d * 2 + 2 * FC_HPB_BC * br * 2 +
         2 * FC_BWD_DQ_TILE * (size_t)64 * 4 + (size_t)stages * 2 * br * 4 + 8 * (1 + 2 * (size_t)stages) + 1024;
}

typedef void (*fc_hpb_kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
                                 const fc_hopper_bwd_args);

/* The D = 256 kernel (hopper_bwd_d256.cuh): Bc = 64 keys per CTA, FC_HPB256_SMEM = 231224 bytes of shared memory;
 * FLASHC_HOPPER_BWD_D256 = 1: NEXT, 2: without, 3: WHOLE (with NEXT) (fc_hpb_d256_get). */
template <typename T>
static flashc_status fc_hpb_launch_d256(const fc_problem *p, const CUtensorMap maps[4], const fc_hopper_bwd_args *a,
                                        int grid) {
  int variant = 0;
  FC_CHECK(fc_hpb_d256_get(&variant));
  const fc_hpb_kernel_fn kernel = variant == 2   ? fc_hopper_bwd_d256_kernel<T, false, false, false>
                                  : variant == 3 ? fc_hopper_bwd_d256_kernel<T, true, true, false>
                                  : variant == 4 ? fc_hopper_bwd_d256_kernel<T, true, true, true>
                                                 : fc_hopper_bwd_d256_kernel<T, true, false, false>;
  const size_t smem = FC_HPB256_SMEM;
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_backward: backend cuda-hopper (head dim 256)"));
  kernel<<<grid, FC_HPB_THREADS, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a);
  FC_LAUNCH_CHECK("fc_hopper_bwd_d256_kernel");
  return FLASHC_OK;
}

template <typename T, int D, int STAGES, int BR>
static flashc_status fc_hpb_launch(const fc_problem *p, fc_hpb_dq_mode mode, const CUtensorMap maps[4],
                                   const fc_hopper_bwd_args *a, int grid) {
  fc_hpb_kernel_fn kernel;
  if constexpr (BR != FC_HPB_BR) /* the bulk kernel only (fc_hpb_br_get) */
    kernel = fc_hopper_bwd_kernel<T, D, STAGES, false, true, true, BR>;
  else if (mode == FC_HPB_DQ_BULK)
    kernel = fc_hopper_bwd_kernel<T, D, STAGES, false, true, true, BR>;
  else if (mode == FC_HPB_DQ_SPLIT)
    kernel = p->deterministic ? fc_hopper_bwd_kernel<T, D, STAGES, true, true, false, BR>
                              : fc_hopper_bwd_kernel<T, D, STAGES, false, true, false, BR>;
  else
    kernel = p->deterministic ? fc_hopper_bwd_kernel<T, D, STAGES, true, false, false, BR>
                              : fc_hopper_bwd_kernel<T, D, STAGES, false, false, false, BR>;
  const size_t smem = fc_hpb_smem_bytes(D, STAGES, fc_hpb_dq_tile_w(mode, D), BR);
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_backward: backend cuda-hopper"));
  kernel<<<grid, FC_HPB_THREADS, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a);
  FC_LAUNCH_CHECK("fc_hopper_bwd_kernel");
  return FLASHC_OK;
}

/* The second version (version 2 .. 11: fc_hpb_version_get). D = 64: Br = 128, 2 stages; 4 = 3 with the next block's
 * Sᵀ issued before the dQ store (EARLY_S); 5, 6 = 3, 4 with dV issued before the dPᵀ wait (EARLY_DV, D = 128's
 * order); 7, 8 = 2, 3 with LAG. */
template <typename T, int D>
static flashc_status fc_hpb_launch_v2(const fc_problem *p, int version, const CUtensorMap maps[4],
                                      const fc_hopper_bwd_args *a, int grid) {
  const int stages = D == 128 && version == 4 ? 3 : 2;
  fc_hpb_kernel_fn kernel;
  if constexpr (D == 64)
    kernel = version == 2   ? fc_hopper_bwd_v2_kernel<T, 2, false, 64, false, false>
             : version == 3 ? fc_hopper_bwd_v2_kernel<T, 2, true, 64, false, false>
             : version == 4 ? fc_hopper_bwd_v2_kernel<T, 2, true, 64, true, false>
             : version == 5 ? fc_hopper_bwd_v2_kernel<T, 2, true, 64, false, true>
             : version == 6 ? fc_hopper_bwd_v2_kernel<T, 2, true, 64, true, true>
             : version == 7 ? fc_hopper_bwd_v2_kernel<T, 2, false, 64, false, false, 1>
                            : fc_hopper_bwd_v2_kernel<T, 2, true, 64, false, false, 1>;
  else
    kernel = version == 2    ? fc_hopper_bwd_v2_kernel<T, 2, false, 128, false, true>
             : version == 3  ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true>
             : version == 7  ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true, 1>
             : version == 8  ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true, 2>
             : version == 9  ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true, 0, 1>
             : version == 10 ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true, 0, 2>
             : version == 11 ? fc_hopper_bwd_v2_kernel<T, 2, true, 128, false, true, 1, 1>
             : version == 12 ? fc_hopper_bwd_v2_kernel<T, 2, false, 128, false, true, 1>
             : version == 13 ? fc_hopper_bwd_v2_kernel<T, 2, false, 128, false, true, 1, 1>
                             : fc_hopper_bwd_v2_kernel<T, 3, true, 128, false, true>;
  const size_t smem = fc_hpb_v2_smem_bytes(D, stages);
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_backward: backend cuda-hopper"));
  kernel<<<grid, FC_HPB_THREADS, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a);
  FC_LAUNCH_CHECK("fc_hopper_bwd_v2_kernel");
  return FLASHC_OK;
}

/* FLASHC_HOPPER_BWD_SCHED (comparisons): the order of the persistent kernel's tiles. stride and dynamic walk the
 * single-tile kernel's order, key block fastest (every key block of one (sequence, kv head) pair, then the next
 * pair: the CTAs at work read the same Q_i, dO_i and add into the same dQ_i rows at about the same time); stride
 * hands CTA x the tiles x, x + grid, ...; dynamic lets each CTA claim the next tile after its last fill (greedy, as
 * the hardware hands out the single-tile kernel's CTAs: with a causal mask the tiles differ in length). grouped: the
 * forward's L2 groups with key block 0 of every pair of a group first (session 9's first draft; H100, session 10:
 * L2 hit rate 71 -> 48 % at d128 s512, 90 -> 62 % causal 4k, 0.75-0.98x the single-tile kernel). Unset: dynamic. */
enum { FC_HPB_SCHED_STRIDE = 0, FC_HPB_SCHED_DYNAMIC = 1, FC_HPB_SCHED_GROUPED = 2 };
static flashc_status fc_hpb_sched_get(int *order) {
  static const char *const names[] = {"stride", "dynamic", "grouped"}; /* FC_HPB_SCHED_* order */
  return fc_env_choice("FLASHC_HOPPER_BWD_SCHED", names, (int)(sizeof names / sizeof names[0]), FC_HPB_SCHED_DYNAMIC,
                       "flashc_backward (cuda-hopper)", order);
}

/* The persistent second version (fc_hpb_persist_get): grid = min(SMs, tiles), the tiles in the order `order`
 * (fc_hpb_sched_get; fc_hopper_bwd_v2p_kernel says how a tile maps to a key block); claim: the dynamic order's
 * counter in the workspace. Shared memory: the single-tile kernel's + kv_empty and the tile ring (48 bytes): D = 128
 * 198744 bytes, D = 64 199768. */
template <typename T, int D>
static flashc_status fc_hpb_launch_v2p(const fc_problem *p, const CUtensorMap maps[4], const fc_hopper_bwd_args *a,
                                       int max_ctas, int order, int32_t *claim) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const fc_hopper_bwd_args,
                 const fc_hp_sched);
  if constexpr (D == 64)
    kernel = fc_hopper_bwd_v2p_kernel<T, 2, false, 64, false, false>; /* version 2, D = 64's default */
  else
    kernel = fc_hopper_bwd_v2p_kernel<T, 2, true, 128, false, true>; /* version 3, D = 128's default */
  const size_t smem = fc_hpb_v2_smem_bytes(D, 2) + 8 + 20 * FC_HP_TILE_RING;
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_backward: backend cuda-hopper (persistent)"));
  const int64_t sq = p->cu_seqlens_q ? p->total_q / p->batch : p->seqlen_q;
  const int64_t qdo_bytes_per_bh = 2 * (int64_t)a->group * sq * D * 2;
  fc_hp_sched sc =
      fc_hp_make_sched(a->n_blocks, a->heads_kv * (int)p->batch, qdo_bytes_per_bh, 1, FC_HP_L2_GROUP_BYTES);
  if (order != FC_HPB_SCHED_GROUPED) sc.group_bh = 1; /* pair by pair, key block 0 first */
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  int grid = sc.tiles < props.num_sms ? sc.tiles : props.num_sms; /* one CTA per SM (its shared memory) */
  if (grid > max_ctas) grid = max_ctas;
  if (grid <= 0) return FLASHC_OK;
  fc_hp_sched walk = fc_hp_sched_for_grid(sc, grid, 0);
  if (order == FC_HPB_SCHED_DYNAMIC) { /* zeroed on the call's stream before every launch, as the forward's */
    walk.claim = claim;
    FC_CUDA_CHECK(cudaMemsetAsync(claim, 0, sizeof(int32_t), fc_stream(p)));
  }
  kernel<<<grid, FC_HPB_THREADS, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a, walk);
  FC_LAUNCH_CHECK("fc_hopper_bwd_v2p_kernel");
  return FLASHC_OK;
}

/* Tile shapes per head dim: <D, Q/dO stages, Br>; the kernel's version (D = 64: with Br = 128 only). */
template <typename T>
static flashc_status fc_hpb_run(const fc_problem *p, fc_hpb_dq_mode mode, int br, int version,
                                int persist /* max CTAs */, int order, int32_t *claim, const CUtensorMap maps[4],
                                const fc_hopper_bwd_args *a, const fc_bwd_rows_args *rows, int grid) {
  FC_CHECK(fc_bwd_rows_prep<T>(p, *rows));
  if (p->head_dim > 128) /* fc_hopper_bwd_supports let it through: FLASHC_HOPPER_BWD_D256 = 1, 2 or 3 */
    FC_CHECK(fc_hpb_launch_d256<T>(p, maps, a, grid));
  else if (persist && p->head_dim > 64)
    FC_CHECK((fc_hpb_launch_v2p<T, 128>(p, maps, a, persist, order, claim)));
  else if (persist)
    FC_CHECK((fc_hpb_launch_v2p<T, 64>(p, maps, a, persist, order, claim)));
  else if (p->head_dim > 64 && version > 1)
    FC_CHECK((fc_hpb_launch_v2<T, 128>(p, version, maps, a, grid)));
  else if (p->head_dim <= 64 && br == 128 && version > 1)
    FC_CHECK((fc_hpb_launch_v2<T, 64>(p, version, maps, a, grid)));
  else if (p->head_dim <= 64 && br == 128)
    FC_CHECK((fc_hpb_launch<T, 64, 3, 128>(p, mode, maps, a, grid)));
  else if (p->head_dim <= 64)
    FC_CHECK((fc_hpb_launch<T, 64, 3, FC_HPB_BR>(p, mode, maps, a, grid)));
  else
    FC_CHECK((fc_hpb_launch<T, 128, 2, FC_HPB_BR>(p, mode, maps, a, grid)));
  return fc_bwd_rows_convert<T>(p, rows);
}

static size_t fc_hpb_round256(size_t n) { return (n + 255) / 256 * 256; }

/* Two neighbouring elements of a row can be one aligned 32-bit store. */
static int fc_hpb_vec16(const fc_view *v) {
  return (uintptr_t)v->data % 16 == 0 && v->stride_b % 8 == 0 && v->stride_s % 8 == 0 && v->stride_h % 8 == 0;
}

/* The keys per CTA (Bc) of the dK/dV kernel that runs this head dim. */
static int fc_hpb_bc(int64_t head_dim) { return head_dim > 128 ? (int)FC_HPB256_BC : (int)FC_HPB_BC; }

flashc_status fc_hopper_bwd_head_dim_max(int *max) {
  int d256 = 0;
  FC_CHECK(fc_hpb_d256_get(&d256));
  *max = d256 ? 256 : 128;
  return FLASHC_OK;
}

flashc_status fc_hopper_bwd_supports(const fc_problem *p) {
  if (p->heads_kv > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_kv %lld exceeds 2^31-1 on backend cuda-hopper",
                    (long long)p->heads_kv);
  if (p->head_dim > 128) { /* the D = 256 kernel unless FLASHC_HOPPER_BWD_D256 = 0 (then hopper_supports refuses) */
    int d256 = 0;
    FC_CHECK(fc_hpb_d256_get(&d256));
    if (d256 && p->deterministic)
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "deterministic backward at head_dim %lld (> 128) is not built on backend cuda-hopper",
                      (long long)p->head_dim);
  }
  int grid = 0;
  FC_CHECK(fc_mma_grid("flashc_backward", fc_cdiv(p->seqlen_k, fc_hpb_bc(p->head_dim)), p->heads_kv, p->batch, &grid));
  FC_CHECK(fc_hp_check_view(p, &p->dout, true, "dout"));
  return FLASHC_OK;
}

flashc_status fc_hopper_backward(const fc_problem *p) {
  fc_hpb_dq_mode mode;
  int br = FC_HPB_BR, version = 1;
  FC_CHECK(fc_hpb_dq_mode_get(p, &mode));
  FC_CHECK(fc_hpb_br_get(p, mode, &br));
  FC_CHECK(fc_hpb_version_get(p, mode, br, &version));
  int persist = 0, order = FC_HPB_SCHED_STRIDE;
  FC_CHECK(fc_hpb_persist_get(p, version, &persist));
  if (persist) FC_CHECK(fc_hpb_sched_get(&order));
  /* Padded row buffers: each sequence's rows rounded up to FC_BWD_ROWS_PAD. */
  fc_bwd_rows_args rows;
  memset(&rows, 0, sizeof rows);
  int64_t *cu_pad_host = NULL;
  if (p->cu_seqlens_q) {
    void *h;
    FC_CHECK(fc_host_workspace(p, (size_t)(p->batch + 1) * sizeof(int64_t), &h));
    cu_pad_host = (int64_t *)h;
    cu_pad_host[0] = 0;
    for (int64_t s = 0; s < p->batch; s++) {
      const int64_t len = (int64_t)p->cu_seqlens_q[s + 1] - p->cu_seqlens_q[s];
      cu_pad_host[s + 1] = cu_pad_host[s] + fc_cdiv(len, FC_BWD_ROWS_PAD) * FC_BWD_ROWS_PAD;
    }
    rows.total_pad = cu_pad_host[p->batch];
  } else {
    rows.sq_pad = fc_cdiv(p->seqlen_q, FC_BWD_ROWS_PAD) * FC_BWD_ROWS_PAD;
    rows.total_pad = p->batch * rows.sq_pad;
  }
  const int D = fc_hp_d_tile(p->head_dim);
  /* The blocked sum's tile width: D = 256 always adds 64 × 64 tiles (FLASHC_HOPPER_BWD_DQ does not apply there) */
  const int dq_tile_w = D == 256 ? FC_HPB256_DQ_W : fc_hpb_dq_tile_w(mode, D);
  const size_t cu_bytes = fc_mma_cu_seqlens_bytes(p);
  const size_t pad_bytes = cu_pad_host ? fc_hpb_round256((size_t)(p->batch + 1) * sizeof(int64_t)) : 0;
  const size_t row_bytes = fc_hpb_round256((size_t)(p->heads_q * rows.total_pad) * sizeof(float));
  /* The dQ sum: [total_q][hq][D], or blocked over the padded rows (bulk) */
  const int64_t dq_rows = dq_tile_w > 0 ? p->heads_q * rows.total_pad : p->total_q * p->heads_q;
  const size_t dq_bytes = fc_hpb_round256((size_t)(dq_rows * D) * sizeof(float));
  const size_t ticket_bytes = p->deterministic ? (size_t)(p->heads_q * rows.total_pad / FC_HPB_BR) * sizeof(int) : 0;
  const size_t claim_bytes = persist && order == FC_HPB_SCHED_DYNAMIC ? 256 : 0; /* the claim counter */
  const int n_blocks = (int)fc_cdiv(p->seqlen_k, fc_hpb_bc(p->head_dim));
  const int split = fc_gqa_split(p, n_blocks, 1, 4); /* one dK/dV CTA per SM (its shared memory) */
  const size_t gqa_at = cu_bytes + pad_bytes + 2 * row_bytes + dq_bytes + fc_hpb_round256(ticket_bytes) + claim_bytes;
  char *ws = NULL;
  FC_CHECK(fc_device_workspace(p, gqa_at + fc_gqa_workspace_bytes(p, split), (void **)&ws));
  int32_t *claim =
      claim_bytes ? (int32_t *)(ws + cu_bytes + pad_bytes + 2 * row_bytes + dq_bytes + ticket_bytes) : NULL;
  const cudaStream_t stream = fc_stream(p);
  const int32_t *cu_q = NULL, *cu_k = NULL;
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, &cu_q, &cu_k));
  const int64_t *cu_pad = NULL;
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
  rows.cu_q = cu_q, rows.cu_pad = cu_pad;
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
  a.cu_q = cu_q, a.cu_k = cu_k, a.cu_pad = cu_pad;
  a.seqlen_q = (int)p->seqlen_q, a.seqlen_k = (int)p->seqlen_k;
  a.sq_pad = rows.sq_pad, a.total_pad = rows.total_pad;
  a.heads_q = (int)p->heads_q, a.heads_kv = (int)p->heads_kv * split;
  a.group = (int)(p->heads_q / p->heads_kv) / split, a.kv_split = split;
  a.head_dim = (int)p->head_dim;
  a.n_blocks = n_blocks;
  a.scale = p->scale;
  a.scale_log2 = p->scale * 1.4426950408889634f;
  a.window_left = p->window_left, a.window_right = p->window_right, a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  a.dk_vec = fc_hpb_vec16(&dk), a.dv_vec = fc_hpb_vec16(&dv);

  int grid = 0;
  FC_CHECK(fc_mma_grid("flashc_backward", a.n_blocks, a.heads_kv, p->batch, &grid));
  a.n_pairs = (int)(p->batch * a.heads_kv); /* fits: fc_mma_grid refused a grid past 2^31 − 1 CTAs */
  FC_CHECK(fc_tail_from(p, "FLASHC_BWD_TAIL", a.n_blocks, a.n_pairs, NULL, 0, 0, &a.tail_from)); /* one CTA per SM */
  CUtensorMap maps[4];
  FC_CHECK(fc_hp_encode_box(p, &p->q, true, "q", br, "flashc_backward", &maps[0]));
  FC_CHECK(fc_hp_encode_box(p, &p->k, false, "k", fc_hpb_bc(p->head_dim), "flashc_backward", &maps[1]));
  FC_CHECK(fc_hp_encode_box(p, &p->v, false, "v", fc_hpb_bc(p->head_dim), "flashc_backward", &maps[2]));
  FC_CHECK(fc_hp_encode_box(p, &p->dout, true, "dout", br, "flashc_backward", &maps[3]));
  if (p->dtype == FLASHC_F16)
    FC_CHECK(fc_hpb_run<__half>(p, mode, br, version, persist, order, claim, maps, &a, &rows, grid));
  else
    FC_CHECK(fc_hpb_run<__nv_bfloat16>(p, mode, br, version, persist, order, claim, maps, &a, &rows, grid));
  return split > 1 ? fc_gqa_reduce(p, split, &dk, &dv) : FLASHC_OK;
}

#if FC_HP_TRACE
FC_HP_TRACE_READERS(fc_hopper_bwd) /* fc_hopper_bwd_trace_reset, fc_hopper_bwd_trace_read: tools/hopper/trace_bwd.py */
#endif
