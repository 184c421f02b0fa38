/* hopper/bwd_launch.cuh — cuda-hopper backward's dK/dV kernels, their device helpers and their launch (hopper/bwd.cu
 * says what they compute and holds the plan), shared by the files that instantiate them, one feature form each, so
 * that they compile side by side (in one file they were the longest compile of the build): hopper/bwd.cu the plain
 * kernels and those for V's head dim of its own, hopper/bwd_score_mod.cu those with softcap, ALiBi and a boolean
 * attn_mask (SCORE_MOD), hopper/bwd_bias.cu those with a float attn_mask too (ADD), hopper/bwd_dropout.cu those with
 * dropout (DROP). */
#ifndef FLASHC_CUDA_HOPPER_BWD_LAUNCH_CUH
#define FLASHC_CUDA_HOPPER_BWD_LAUNCH_CUH

#include "common/tail_order.cuh"
#include "common/common.cuh"
#include "common/gqa.cuh"
#include "hopper/bwd_api.cuh"
#include "common/bwd_rows.cuh"
#include "hopper/gemm.cuh"
#include "hopper/ptx.cuh"
#include "hopper/score_mod.cuh"
#include "hopper/tma.cuh"
#include "hopper/trace.cuh"
#include "hopper/wgmma.cuh"
#include "mma/host.cuh"
#include "mma/ptx.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Trace marks (hopper/trace.cuh, built with -DFC_HP_TRACE=1; tools/hopper/trace_bwd.py reads them): mark k of block
 * (or fill) n in slot `slot` (0 the producer, 1 + c consumer warpgroup c's thread 0) at index 16·n + k, tag k. */
#if FC_HP_TRACE
#define FC_HPB_MARK_AT(slot, n, k) fc_hp_mark_at((slot), 16u * (uint32_t)(n) + (k), (k), (uint32_t)(n))
#else
#define FC_HPB_MARK_AT(slot, n, k) ((void)0)
#endif

enum {
  FC_HPB_BR = 64,             /* query rows per block of the loop (Br; the second version: 128 at D = 64) */
  FC_HPB_BC = 128,            /* keys per CTA: 2 consumer warpgroups × 64 */
  FC_HPB_THREADS = 384,       /* producer + 2 consumer warpgroups */
  FC_HPB_CONSUMER_WARPS = 8,  /* arrivals that release a stage */
  FC_HPB_ROW_BYTES = 128,     /* one swizzled row: 64 16-bit elements */
  FC_HPB_KV_HALF = 128 * 128, /* one 64-column half of K_j or V_j (Bc rows) */
  FC_HPB_Q_HALF = 64 * 128,   /* one 64-column half of Q_i or dO_i (Br = 64 rows; Br·128 bytes in general) */
  FC_HPB_REGS_PRODUCER = 24,  /* setmaxnreg: 128·24 + 256·240 = 64512 ≤ 65536 */
  FC_HPB_REGS_CONSUMER = 240,
  FC_HPB_BAR_DS = 1,     /* named barriers 1, 2: one consumer warpgroup each (its rows of sdS) */
  FC_HPB_BAR_DS_ALL = 3, /* named barrier 3: both consumer warpgroups (dQ: each reads the other's rows) */
  /* The lagged version (hopper/bwd_kernel.cuh, LAG): pairwise barriers of the two consumer warpgroups, 128 arrivals
   * (bar.arrive, warpgroup c) + 128 (bar.sync, the other) each */
  FC_HPB_BAR_READY = 4,  /* 4 + 2c + b: warpgroup c's dSᵀ rows are in sdS buffer b */
  FC_HPB_BAR_FREE = 8,   /* 8 + 2c + b: warpgroup c's dQ wgmmas have read sdS buffer b */
  FC_HPB_LAG_STAGES = 2, /* Q/dO stages of the lagged version (a third does not fit its shared memory) */
};

typedef struct fc_hopper_bwd_args {
  uint16_t *dk, *dv;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  const float *lse2, *dsum; /* [hq][total_pad], rows padded per sequence (common/bwd_rows.cuh) */
  float *dq_accum;          /* [total_q][hq][D] fp32 */
  int *dq_ticket;           /* deterministic: [hq][total_pad / Br] turns of the dQ adds, zeroed per call */
  const int32_t *cu_q, *cu_k, *end_q, *end_k; /* varlen: sequence b's rows [cu[b], end[b]) (mma/host.cuh) */
  const int64_t *cu_pad;
  int seqlen_q, seqlen_k;
  int64_t sq_pad, total_pad;
  /* GQA: each kv head's `group` query heads are split into kv_split parts (fc_gqa_part_heads: as even as the count
   * allows), one CTA per part and key block, each writing its part's dK/dV (into a workspace that fc_gqa_reduce
   * sums). heads_kv counts those parts (the real kv heads · kv_split), and a tile's hk is one: it reads K/V head
   * hk / kv_split and the part's query heads h0 .. h0 + nh − 1. */
  int heads_q, heads_kv, group, head_dim;
  int kv_split;     /* query-head parts per kv head; 1: one CTA walks the whole group */
  int n_blocks;     /* key blocks per (kv head part, sequence) */
  int n_pairs;      /* (sequence, kv head part) pairs: batch·heads_kv */
  int tail_from;    /* the single-tile kernels' first pair walked key block by key block (common/tail_order.cuh) */
  float scale;      /* > 0 (supports refuses a negative one) */
  float scale_log2; /* scale·log2(e) */
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
  int dk_vec, dv_vec; /* eight neighbouring elements may be stored as one 16-byte chunk */
  /* seqused: the sequences' own maps (hopper/tma.cuh, fc_hp_seq_maps), [b][q, k, v, dout], at cu_q + seq_maps_at
   * bytes (the workspace, after the offsets: fc_hpb_maps_of); 0: the kernels' map parameters */
  int seq_maps_at;
  /* softcap and ALiBi (hopper/score_mod.cuh): read by the SCORE_MOD kernels only; last, so that the plain kernels'
   * arguments keep their offsets */
  fc_score_mod mod;
  /* dV's columns, V's head dim (head_dim: Q's, K's, dQ's and dK's), read by the DV_COLS kernels only; after mod, so
   * that the other arguments keep their offsets. A call whose head dims differ runs at the larger one's tile
   * (fc_hpb_dim): each tensor's columns past its own come in as TMA's zeros, which add nothing to Sᵀ = K_j·Q_iᵀ,
   * dPᵀ = V_j·dO_iᵀ or the gradients' other columns */
  int head_dim_v;
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
 * same range). BC: 64 for the D = 256 kernel (hopper/bwd_d256.cuh). */
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
  int jb, hk, h0, nh, k0, sk, sq, q_start, k_start, bt, i_begin, n_i, n_iter; /* h0, nh: the part's query heads */
  int64_t b, pad0, shift;
};

/* Tile (jb, bh = b·heads_kv + hk) of key blocks of BC keys. False: k0 ≥ sk (a key block past a shorter sequence of a
 * varlen batch: nothing to do). NARROW (the SCORE_MOD kernels but the deterministic one, whose dQ turns need the key
 * blocks that see a query block to be consecutive): with a boolean attn_mask's tiles, the query blocks are cut to the
 * column's range that keeps any pair (common/mask_tiles.cuh; the union over the part's query heads), so that key
 * blocks a padding mask removes whole walk none. The producer and the consumers take the same tile from here. */
template <int BR, int BC = FC_HPB_BC, bool NARROW = false>
static __device__ __forceinline__ bool fc_hpb_tile_from(const fc_hopper_bwd_args &a, int jb, int64_t bh,
                                                        fc_hpb_tile *ti) {
  ti->jb = jb;
  /* 32-bit: bh < batch·heads_kv (n_pairs, an int). A 64-bit division is a call whose result ptxas kept on the stack
   * until the epilogue in the D = 256 kernel (8 bytes of local memory per CTA). */
  const int pair = (int)bh;
  ti->hk = pair % a.heads_kv;
  ti->b = pair / a.heads_kv;
  fc_gqa_part_heads(ti->hk, a.group, a.kv_split, &ti->h0, &ti->nh);
  ti->q_start = 0, ti->k_start = 0, ti->sq = a.seqlen_q, ti->sk = a.seqlen_k;
  ti->pad0 = ti->b * a.sq_pad;
  if (a.cu_q) {
    ti->q_start = a.cu_q[ti->b];
    ti->sq = a.end_q[ti->b] - ti->q_start;
    ti->k_start = a.cu_k[ti->b];
    ti->sk = a.end_k[ti->b] - ti->k_start;
    ti->pad0 = a.cu_pad[ti->b];
  }
  ti->k0 = jb * BC;
  if (ti->k0 >= ti->sk) return false;
  ti->bt = a.cu_q ? 0 : (int)ti->b; /* batch coordinate of the tensor maps */
  ti->shift = (a.bottom_right ? (int64_t)ti->sk - ti->sq : 0) + a.mask_offset;
  fc_hpb_query_blocks<BR, BC>(ti->k0, ti->sq, ti->sk, ti->shift, a.window_left, a.window_right, &ti->i_begin, &ti->n_i);
  if constexpr (NARROW) {
    const fc_mask_tiles &mt = a.mod.tiles;
    if (mt.cls && ti->n_i > 0) {
      int lo = ti->i_begin + ti->n_i, hi = ti->i_begin; /* the union of the heads' ranges, within the mask's */
      for (int h = ti->h0; h < ti->h0 + (mt.per_h ? ti->nh : 1); h++) {
        const int2 r = fc_mask_col_range(mt, ti->b, h, jb);
        if (r.x < r.y) lo = min(lo, r.x), hi = max(hi, r.y);
      }
      lo = max(lo, ti->i_begin), hi = min(hi, ti->i_begin + ti->n_i);
      ti->i_begin = lo, ti->n_i = max(hi - lo, 0);
    }
  }
  ti->n_iter = ti->nh * ti->n_i; /* (query head, query block) pairs, head-major */
  return true;
}

/* The tile of this CTA in the single-tile kernels (common/tail_order.cuh: the grid's last pairs key block by key
 * block where a right mask edge makes the tiles unequal). */
template <int BR, int BC = FC_HPB_BC, bool NARROW = false>
static __device__ __forceinline__ bool fc_hpb_tile_of_cta(const fc_hopper_bwd_args &a, fc_hpb_tile *ti) {
  int jb;
  int64_t bh;
  fc_tail_tile_of_cta(a.n_blocks, a.n_pairs, a.tail_from, &jb, &bh);
  return fc_hpb_tile_from<BR, BC, NARROW>(a, jb, bh, ti);
}

/* The tile's first key row of dk or dv (g, with that view's strides): where its dK_j or dV_j goes. */
static __device__ __forceinline__ uint16_t *fc_hpb_key_rows(uint16_t *g, int64_t sb, int64_t ss, int64_t sh,
                                                            const fc_hpb_tile &ti) {
  return g + ti.b * sb + (int64_t)ti.k_start * ss + (int64_t)ti.hk * sh;
}

/* The maps the producer loads tile ti through (q, k, v, dout): the kernel's map parameters, or under seqused
 * (a.seq_maps_at) the sequence's own (hopper/tma.cuh, fc_hp_seq_maps: the same coordinates), whose boxes bring zeros
 * past its used rows: Q_i, dO_i of its last query block and K_j, V_j of its last key block are then zero there, not the
 * caller's rows past seqused (possibly NaN, which P = 0 or dSᵀ = 0 would not cancel in dV, dK, dQ: 0·NaN = NaN).
 * Acquired for the copy engine before their first copy (fc_tma_acquire_map). SEQ false: the parameters alone (ADD,
 * a float attn_mask, is dense only: without this branch its kernels, spilling already, spilled 8-36 bytes more). */
struct fc_hpb_maps {
  const CUtensorMap *q, *k, *v, *x;
};
template <bool SEQ = true>
static __device__ __forceinline__ fc_hpb_maps fc_hpb_maps_of(const fc_hopper_bwd_args &a, const fc_hpb_tile &ti,
                                                             const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                                             const CUtensorMap *tm_v, const CUtensorMap *tm_do) {
  if (!SEQ || !a.seq_maps_at) return {tm_q, tm_k, tm_v, tm_do};
  const CUtensorMap *s = (const CUtensorMap *)((const char *)a.cu_q + a.seq_maps_at) + 4 * ti.b;
#pragma unroll
  for (int i = 0; i < 4; i++) fc_tma_acquire_map(s + i);
  return {s, s + 1, s + 2, s + 3};
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
  int h0, nh; /* the part's query heads (common/gqa.cuh) */
  fc_gqa_part_heads(hk, a.group, a.kv_split, &h0, &nh);
  for (int it = 0; it < n_iter; it++) {
    const int s = it % STAGES, u = it / STAGES;
    const int hh = h0 + it / n_i, q0 = (i_begin + it % n_i) * BR;
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

/* How both D = 64/128 dK/dV kernels start: thread 0 initialises the barriers and every thread waits for that. */
template <int STAGES> static __device__ __forceinline__ void fc_hpb_start(uint32_t bars) {
  if (threadIdx.x == 0) {
    fc_hpb_init_barriers<STAGES>(bars);
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */
}

/* Their producer warpgroup (threads 0 .. 127): fewer registers; thread 0 loads the CTA's tiles (fc_hpb_produce) with
 * the TMA maps of the tile's sequence. The consumers' side stays in the kernels: ptxas gives a region the registers
 * of the setmaxnreg that dominates it, so the consumers' code must be reached from theirs alone. */
template <int D, int BR, int STAGES, bool ADD>
static __device__ __forceinline__ void
fc_hpb_producer(const fc_hopper_bwd_args &a, const fc_hpb_tile &ti, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                const CUtensorMap *tm_v, const CUtensorMap *tm_do, uint32_t sK, uint32_t sV, uint32_t sQ, uint32_t sdO,
                uint32_t sLD, uint32_t bars) {
  fc_setmaxnreg_dec<FC_HPB_REGS_PRODUCER>();
  if (threadIdx.x == 0 && ti.n_iter > 0) {
    const fc_hpb_maps mp = fc_hpb_maps_of<!ADD>(a, ti, tm_q, tm_k, tm_v, tm_do); /* seqused: the sequence's own */
    fc_hpb_produce<D, BR, STAGES>(mp.q, mp.k, mp.v, mp.x, a, sK, sV, sQ, sdO, sLD, bars, ti.hk, ti.bt, ti.k_start,
                                  ti.k0, ti.q_start, ti.pad0, ti.i_begin, ti.n_i, ti.n_iter);
  }
}

/* A consumer thread's place: its warpgroup cw (0 or 1), its thread ct, warp and lane in it, and the row g and column
 * pair t of an mma fragment that the lane holds. */
typedef struct fc_hpb_place {
  int cw, ct, warp, lane, g, t;
} fc_hpb_place;

/* A consumer thread's place, after its warpgroup takes the registers the producer gave up. cw through a shuffle:
 * provably warp-uniform, so that the descriptors derived from it live in uniform registers (hopper/fwd.cu explains
 * why that matters). */
static __device__ __forceinline__ fc_hpb_place fc_hpb_consumer() {
  fc_setmaxnreg_inc<FC_HPB_REGS_CONSUMER>();
  const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
  const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
  const int g = lane / 4, t = lane % 4;
  return {cw, ct, warp, lane, g, t};
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
 * q0 + 8x + 2t + (e & 1); lse2_i at sL. MASKED: queries and keys past the sequence and pairs outside the mask are
 * zeroed (a query row past the sequence has lse2 = +inf, but its Sᵀ may be NaN: zero rows, or the next sequence's,
 * times a key with an infinite component). WITH_DS: dSᵀ = Pᵀ∘(dPᵀ − D_i) in the same pass (D_i at sD), when dPᵀ is
 * ready already (fc_hopper_bwd_det_kernel). l2_pre: lse2_i loaded already (fc_hpb_ld_rows), else loaded here. POLY: of
 * every 8 exponentials, how many fc_exp2_poly computes on the FMA pipe (the rest: ex2 on the special-function unit;
 * H100: 1 of 8 ran 1.005-1.016x at D = 128, 2 or 3 of 8 0.97-0.995x, bench/results/configs/
 * hopper-bwd-exp-trace-2026-11-24.txt; the forward's softmax lost 6-14 % with 2-4 of 8). */
template <int BR, bool MASKED, bool WITH_DS, int POLY>
static __device__ __forceinline__ void fc_hpb_p_pass(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t sL,
                                                     uint32_t sD, float c, int t, int q0, int key0, int sq, int sk,
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
        if (!(key < sk && q0 + qc < sq && fc_hpb_visible(q0 + qc, key, shift, wl, wr))) p = 0.0f;
      }
      st[4 * x + e] = p;
      if constexpr (WITH_DS) dpt[4 * x + e] = p * (dpt[4 * x + e] - ((e & 1) ? dr.y : dr.x));
    }
  }
}

/* fc_hpb_p_pass for the block of keys k0 .. k0 + BC − 1 and queries q0 .. q0 + BR − 1, masked only where some pair
 * of it is cut. Whether it is whole is tested once, around two loops: with the test inside the loop (`if (!whole
 * && !visible) p = 0`), ptxas branched per element and unmasked blocks ran ~6 instructions per element instead of
 * 2 (ncu's source view at commit 5ef3b40: 3x the branches of cuDNN's kernel, the exponentials a third of the
 * samples). */
template <int BR, bool WITH_DS, int BC = FC_HPB_BC, int POLY = 0>
static __device__ __forceinline__ void
fc_hpb_p_from_s(float (&st)[BR / 2], float (&dpt)[BR / 2], uint32_t sL, uint32_t sD, float c, int t, int q0, int k0,
                int key0, int sq, int sk, int64_t shift, int64_t wl, int64_t wr, const float2 *l2_pre = nullptr) {
  const bool whole = k0 + BC <= sk && q0 + BR <= sq && (wr < 0 || k0 + BC - 1 <= q0 + shift + wr) &&
                     (wl < 0 || k0 >= q0 + BR - 1 + shift - wl);
  if (whole)
    fc_hpb_p_pass<BR, false, WITH_DS, POLY>(st, dpt, sL, sD, c, t, q0, key0, sq, sk, shift, wl, wr, l2_pre);
  else
    fc_hpb_p_pass<BR, true, WITH_DS, POLY>(st, dpt, sL, sD, c, t, q0, key0, sq, sk, shift, wl, wr, l2_pre);
}

/* The SCORE_MOD kernels' P pass (hopper/score_mod.cuh): Sᵀ → x = the modified score, Pᵀ = 2^(x·log2 e − lse2_i),
 * masked as fc_hpb_p_pass, and g = 1 − tanh² (CAP) for dSᵀ, with what each kernel keeps of them (MODE):
 *   FC_HPB_MOD_DS    st ← Pᵀ, y ← Pᵀ∘g∘(y − D_i) (y = dPᵀ ready: fc_hopper_bwd_det_kernel)
 *   FC_HPB_MOD_PACK  pp ← Pᵀ, pg ← Pᵀ∘g, both packed to 16 bits (dV's A; dSᵀ's factor, as fc_hpb_ds_from_pg reads it:
 *                    hopper/bwd_kernel.cuh, where the fp32 Pᵀ∘g beside Sᵀ's and dPᵀ's accumulators spilled 864 bytes at
 *                    D = 64; the D = 256 kernel rounds Pᵀ to 16 bits before dSᵀ likewise)
 *   FC_HPB_MOD_TWO   st ← Pᵀ, y ← Pᵀ∘g (hopper/bwd_d256.cuh: Pᵀ for dV, Pᵀ∘g for the other warpgroup's dSᵀ)
 * The exponentials all run on the special-function unit (no fc_exp2_poly: softcap's tanh fills the FMA pipe).
 * attn_mask (flashc.h: after softcap and ALiBi x ← x + bias, or P = 0 where a boolean mask removes the pair, as
 * cpu-ref and cuda-mma's fc_bwd_fa2_p_mod, so that Pᵀ is the forward's P for its lse) acts in the MASKED pass only:
 * element 4x + e stays only where bit 4x + e of mb.keep is set (fc_hpb_mask_block), and a float bias (`bias` not
 * NULL: this thread's first element, query q0 + 2t and key key0) is read there, one element at a time (the 8 lanes of
 * a t: 8 consecutive keys of one row) and only for pairs inside the sequence (the mask has no others). The keep bits
 * are run-time data of the one MASKED pass, not a pass of their own: each further variant of the pass (a block
 * removed whole skipping the exponentials; the mask's elements loaded in a pass of their own) made every SCORE_MOD
 * kernel spill, 500-1600 bytes at D = 64 and D = 128 (ptxas, nvcc 13.0, sm_90a). The float bias's loads spill too
 * (100-600 bytes), so the kernels that read one are instantiations of their own (ADD: fc_hpb_kernel), and softcap,
 * ALiBi and boolean masks keep the SCORE_MOD kernels' registers. */
enum { FC_HPB_MOD_DS = 0, FC_HPB_MOD_PACK = 1, FC_HPB_MOD_TWO = 2 };
/* A block's attn_mask as the MASKED pass applies it (fc_hpb_mask_block): keep bit 4x + e of word (4x + e) / 32 for
 * query q0 + 8x + 2t + (e & 1) and key key0 + 8·(e >> 1), the layout of fc_hpb_p_pass_mod; all set without a boolean
 * mask. */
template <int BR> struct fc_hpb_mblock { uint32_t keep[BR / 64]; };
/* The exponent's forms of fc_hpb_p_pass_mod: any modifier, or in whole blocks (no mask to apply) two short ones */
enum { FC_HPB_FORM_ANY = 0, FC_HPB_FORM_ALIBI_LIN = 1, FC_HPB_FORM_CAP = 2 };
template <typename T, int BR, bool MASKED, bool CAP, int MODE, int FORM = FC_HPB_FORM_ANY>
static __device__ __forceinline__ void
fc_hpb_p_pass_mod(float (&st)[BR / 2], float (&y)[BR / 2], uint32_t (&pp)[BR / 16][4], uint32_t (&pg)[BR / 16][4],
                  uint32_t sL, uint32_t sD, int t, int q0, int key0, int sq, int sk, int64_t shift, int64_t wl,
                  int64_t wr, const fc_score_mod &md, float slope, const float2 *l2_pre, const fc_hpb_mblock<BR> &mb,
                  const unsigned short *bias) {
  static_assert(FORM == FC_HPB_FORM_ANY || !MASKED, "the short forms: whole blocks");
  static_assert(FORM != FC_HPB_FORM_ALIBI_LIN || !CAP, "ALiBi's linear form: without softcap");
  static_assert(FORM != FC_HPB_FORM_CAP || CAP, "softcap's form: softcap");
  constexpr bool LIN = FORM == FC_HPB_FORM_ALIBI_LIN;
  /* ALiBi: key key0 + 8·rh and query q0 + 8x + 2t + e % 2 are |w[rh] + 8x + e % 2| apart */
  const float w[2] = {(float)(q0 + 2 * t + sk - sq - key0), (float)(q0 + 2 * t + sk - sq - key0 - 8)};
  /* LIN (ALiBi's linear form, fc_hpb_p_from_s_mod: every distance ≥ 0): the exponent x·log2 e − lse2 is
   * Sᵀ·k + a[rh] + c(x, e % 2) with k = scale·log2 e, a[rh] = −slope·log2 e·w[rh] of the key and
   * c = −slope·log2 e·(8x + e % 2) − lse2 of the query, made once for both keys: two operations per score where the
   * general form takes four (scale, distance, |·|·slope, exponent). FC_HPB_FORM_CAP (softcap without ALiBi): the
   * exponent x·log2 e − lse2 = tanh(Sᵀ·k_in)·(cap·log2 e) − lse2, one FMA after the tanh where the general form
   * takes three (cap·tanh, the ALiBi term, exponent). */
  const float sl2 = slope * 1.4426950408889634f, k2 = md.k_in * 1.4426950408889634f;
  const float cap2 = md.k_out * 1.4426950408889634f;
  const float a2[2] = {-sl2 * w[0], -sl2 * w[1]};
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    const float2 l2 = l2_pre ? l2_pre[x] : fc_hpb_ld_shared_f32x2(sL + 4 * (8 * x + 2 * t));
    const float2 dr =
        MODE == FC_HPB_MOD_DS ? fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t)) : make_float2(0.0f, 0.0f);
    [[maybe_unused]] float c2[2];
    if constexpr (LIN) {
      c2[0] = fmaf(-sl2, (float)(8 * x), -l2.x);
      c2[1] = fmaf(-sl2, (float)(8 * x + 1), -l2.y);
    }
    float pv[4], gv[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float g = 1.0f, xs = 0.0f;
      if constexpr (FORM == FC_HPB_FORM_CAP) {
        xs = fc_tanh(st[4 * x + e] * md.k_in); /* tanh, not x: the exponent's factor takes the cap */
        g = fmaf(-xs, xs, 1.0f);
      } else if constexpr (!LIN) {
        xs = fc_mod_score<CAP>(st[4 * x + e], md, slope, fabsf(w[e >> 1] + (float)(8 * x + (e & 1))), &g);
      }
      [[maybe_unused]] bool keep = true;
      if constexpr (MASKED) {
        const int qc = 8 * x + 2 * t + (e & 1), key = key0 + 8 * (e >> 1);
        const bool in = key < sk && q0 + qc < sq;
        if (bias && in)
          xs += fc_to_float<T>(
              __ldg(bias + (int64_t)(8 * x + (e & 1)) * md.bias_st[2] + (int64_t)(8 * (e >> 1)) * md.bias_st[3]));
        keep =
            in && fc_hpb_visible(q0 + qc, key, shift, wl, wr) && (mb.keep[(4 * x + e) / 32] >> ((4 * x + e) % 32) & 1u);
      }
      float p;
      if constexpr (LIN)
        p = fc_exp2(fmaf(st[4 * x + e], k2, a2[e >> 1] + c2[e & 1]));
      else if constexpr (FORM == FC_HPB_FORM_CAP)
        p = fc_exp2(fmaf(xs, cap2, (e & 1) ? -l2.y : -l2.x));
      else
        p = fc_exp2(fmaf(xs, 1.4426950408889634f, (e & 1) ? -l2.y : -l2.x));
      if constexpr (MASKED) {
        if (!keep) p = 0.0f;
      }
      pv[e] = p;
      if constexpr (MODE == FC_HPB_MOD_DS) {
        st[4 * x + e] = p;
        y[4 * x + e] = p * g * (y[4 * x + e] - ((e & 1) ? dr.y : dr.x));
      } else if constexpr (MODE == FC_HPB_MOD_PACK) {
        gv[e] = p * g;
      } else {
        st[4 * x + e] = p;
        y[4 * x + e] = p * g;
      }
    }
    if constexpr (MODE == FC_HPB_MOD_PACK) { /* s[8kb + 2r], s[8kb + 2r + 1] are A's register r of k-step kb */
      pp[x / 2][2 * (x % 2)] = fc_pack2<T>(pv[0], pv[1]);
      pp[x / 2][2 * (x % 2) + 1] = fc_pack2<T>(pv[2], pv[3]);
      pg[x / 2][2 * (x % 2)] = fc_pack2<T>(gv[0], gv[1]);
      pg[x / 2][2 * (x % 2) + 1] = fc_pack2<T>(gv[2], gv[3]);
    }
  }
}

/* The block of keys k0 .. k0 + BC − 1 (this thread's key0, key0 + 8) and queries q0 .. q0 + BR − 1 of plane (b, h) of
 * attn_mask: its class (common/mask_tiles.cuh; ALL without a mask, SOME for a float bias), and *mb. A boolean mask's
 * FC_MT_SOME block reads this thread's elements here (pairs outside the sequence are not read: the MASKED pass removes
 * them anyway), a NONE block clears every bit. Called at the block's start, before its wgmmas, where the accumulators
 * of Sᵀ and dPᵀ are not live yet. A mask whose query stride is 0 (a padding mask [b, 1, 1, sk]) has two elements per
 * thread, its keys'; else the rows are read 8 elements per trip of a loop that is not unrolled: with all BR/2 loads
 * unrolled (their 64-bit addresses computed ahead) the D = 64 kernel spilled 170 more bytes. */
template <int BR, int BC>
static __device__ __forceinline__ int fc_hpb_mask_block(const fc_score_mod &md, int64_t b, int h, int q0, int k0,
                                                        int key0, int t, int sq, int sk, fc_hpb_mblock<BR> *mb) {
#pragma unroll
  for (int w = 0; w < BR / 64; w++) mb->keep[w] = ~0u;
  if (!md.bias) return FC_MT_ALL;
  if (!md.bias_bool || !md.tiles.cls) return FC_MT_SOME;
  const int cls = fc_mask_tile(md.tiles, b, h, q0 / BR, k0 / BC);
  if (cls == FC_MT_SOME) {
    const int64_t *ms = md.bias_st;
    const unsigned char *m = (const unsigned char *)md.bias + b * ms[0] + (int64_t)h * ms[1] +
                             (int64_t)(q0 + 2 * t) * ms[2] + (int64_t)key0 * ms[3];
    const bool k_in = key0 < sk, k8_in = key0 + 8 < sk;
    if (ms[2] == 0) { /* bits 4x, 4x + 1: key key0; 4x + 2, 4x + 3: key key0 + 8 */
      const uint32_t w = (k_in && __ldg(m) ? 0x33333333u : 0u) | (k8_in && __ldg(m + 8 * ms[3]) ? 0xccccccccu : 0u);
#pragma unroll
      for (int i = 0; i < BR / 64; i++) mb->keep[i] = w;
    } else {
#pragma unroll
      for (int i = 0; i < BR / 64; i++) { /* word i: x = 8i .. 8i + 7 */
        uint32_t w = 0u;
#pragma unroll 2
        for (int xi = 0; xi < 8; xi++) {
          const int q = q0 + 2 * t + 8 * (8 * i + xi);
          const unsigned char *r = m + (int64_t)(8 * (8 * i + xi)) * ms[2];
          const uint32_t nib = (q < sq && k_in && __ldg(r) ? 1u : 0u) |
                               (q + 1 < sq && k_in && __ldg(r + ms[2]) ? 2u : 0u) |
                               (q < sq && k8_in && __ldg(r + 8 * ms[3]) ? 4u : 0u) |
                               (q + 1 < sq && k8_in && __ldg(r + ms[2] + 8 * ms[3]) ? 8u : 0u);
          w |= nib << (4 * xi);
        }
        mb->keep[i] = w;
      }
    }
  } else if (cls == FC_MT_NONE) {
#pragma unroll
    for (int w = 0; w < BR / 64; w++) mb->keep[w] = 0u;
  }
  return cls;
}

/* fc_hpb_p_pass_mod over the block of keys k0 .. k0 + BC − 1 and queries q0 .. q0 + BR − 1 of query head hh of
 * sequence b: masked only where the block is cut (fc_hpb_p_from_s) or attn_mask's class mcls is not FC_MT_ALL
 * (fc_hpb_mask_block: mb), softcap chosen once per block (uniform). */
template <typename T, int BR, int MODE, int BC = FC_HPB_BC, bool ADD = false>
static __device__ __forceinline__ void
fc_hpb_p_from_s_mod(float (&st)[BR / 2], float (&y)[BR / 2], uint32_t (&pp)[BR / 16][4], uint32_t (&pg)[BR / 16][4],
                    uint32_t sL, uint32_t sD, int t, int q0, int k0, int key0, int sq, int sk, int64_t shift,
                    int64_t wl, int64_t wr, const fc_score_mod &md, float slope, int64_t b, int hh, int mcls,
                    const fc_hpb_mblock<BR> &mb, const float2 *l2_pre = nullptr) {
  const bool whole = mcls == FC_MT_ALL && k0 + BC <= sk && q0 + BR <= sq &&
                     (wr < 0 || k0 + BC - 1 <= q0 + shift + wr) && (wl < 0 || k0 >= q0 + BR - 1 + shift - wl);
  /* a float bias: this thread's first element (query q0 + 2t, key key0) of plane (b, hh) */
  const int64_t *ms = md.bias_st;
  const unsigned short *bias = ADD ? (const unsigned short *)md.bias + b * ms[0] + (int64_t)hh * ms[1] +
                                         (int64_t)(q0 + 2 * t) * ms[2] + (int64_t)key0 * ms[3]
                                   : nullptr;
  if (md.k_out > 0.0f) {
    if (whole && !ADD && !md.alibi)
      fc_hpb_p_pass_mod<T, BR, false, true, MODE, FC_HPB_FORM_CAP>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk, shift,
                                                                   wl, wr, md, slope, l2_pre, mb, bias);
    else if (whole)
      fc_hpb_p_pass_mod<T, BR, false, true, MODE>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk, shift, wl, wr, md, slope,
                                                  l2_pre, mb, bias);
    else
      fc_hpb_p_pass_mod<T, BR, true, true, MODE>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk, shift, wl, wr, md, slope,
                                                 l2_pre, mb, bias);
  } else {
    /* ALiBi's linear form where every visible key is left of ALiBi's diagonal (fc_hp_alibi_lin's condition, as under
     * a bottom-right causal mask), in the whole blocks (a float bias's are never whole: fc_hpb_mask_block) */
    if (whole && !ADD && md.alibi && wr >= 0 && shift + wr <= (int64_t)sk - sq)
      fc_hpb_p_pass_mod<T, BR, false, false, MODE, FC_HPB_FORM_ALIBI_LIN>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk,
                                                                          shift, wl, wr, md, slope, l2_pre, mb, bias);
    else if (whole)
      fc_hpb_p_pass_mod<T, BR, false, false, MODE>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk, shift, wl, wr, md, slope,
                                                   l2_pre, mb, bias);
    else
      fc_hpb_p_pass_mod<T, BR, true, false, MODE>(st, y, pp, pg, sL, sD, t, q0, key0, sq, sk, shift, wl, wr, md, slope,
                                                  l2_pre, mb, bias);
  }
}

/* SCORE_MOD: dSᵀ = (Pᵀ∘g)∘(dPᵀ − D_i) in place of dPᵀ, Pᵀ∘g packed to 16 bits by fc_hpb_p_pass_mod (FC_HPB_MOD_PACK:
 * s[8kb + 2r], s[8kb + 2r + 1] in pg[kb][r]). BIASED as fc_hpb_ds_from_dp. */
template <typename T, int BR, bool BIASED>
static __device__ __forceinline__ void fc_hpb_ds_from_pg(float (&dpt)[BR / 2], const uint32_t (&pg)[BR / 16][4],
                                                         uint32_t sD, int t) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    const float2 dr = BIASED ? make_float2(0.0f, 0.0f) : fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t));
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const uint32_t w = pg[x / 2][2 * (x % 2) + e / 2];
      dpt[4 * x + e] =
          fc_to_float<T>((uint16_t)(e & 1 ? w >> 16 : w & 0xffffu)) * (dpt[4 * x + e] - ((e & 1) ? dr.y : dr.x));
    }
  }
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

/* ---- dropout (flashc.h, "Dropout"; the forward's side: hopper/score_mod.cuh) ---------------------------------------
 * In Sᵀ's layout a thread holds keys key0, key0 + 8 (key0 = the warp's first key + g) of queries q0 + 8x + 2t + e % 2:
 * a query's 8 consecutive keys (one Philox block) are one element of each of the 8 lanes g of a t. So the 8 lanes of a
 * t split the blocks of their Br/4 queries × 2 key blocks (cuda-mma's fa2 Sᵀ layout, fc_drop_group_bits with G = 8,
 * mma/score_mod.cuh): Br/16 Philox calls per lane, then a 3-step transpose across the 8 lanes (one shuffle per word
 * each). The bits are drawn before the block's wgmmas (where Sᵀ's and dPᵀ's accumulators are not live) and applied as
 * cpu-ref differentiates o = Σ P∘Z·v (Z = keep/(1 − p)): dV from Pᵀ∘keep (the 1/(1 − p) once, on dV at the end),
 * dSᵀ = Pᵀ∘g∘(Z∘dPᵀ − D_i). Element 4x + e (query run 2x + e % 2, key block e / 2) is bit
 * fc_hpb_drop_bit(x, e). */
template <int BR> struct fc_hpb_drop { uint32_t w[BR / 64]; };
static __device__ __forceinline__ constexpr int fc_hpb_drop_bit(int x, int e) { return 4 * x + 2 * (e & 1) + (e >> 1); }
template <int BR>
static __device__ __forceinline__ void fc_hpb_drop_bits(fc_hpb_drop<BR> &kd, const fc_score_mod &md, uint64_t bh,
                                                        int q0, int key0, int sk, int g, int t) {
  static_assert(fc_drop_group<8, BR / 4, 2>::W == BR / 64, "one bit per element");
  fc_drop_group_bits<8, BR / 4, 2>(kd.w, md, bh, (int64_t)q0 + 2 * t, 8, 1, sk, (key0 - g) / 8, g);
}
/* y ← keep ? y·mul : 0 (Sᵀ's layout). BIASED: y holds dPᵀ − D_i (fc_hpb_bias_init), and leaves as Z∘dPᵀ (D_i read
 * from sD), so that fc_hpb_ds_from_pg<T, BR, false> subtracts D_i after. */
template <int BR, bool BIASED = false>
static __device__ __forceinline__ void fc_hpb_drop_apply(float (&y)[BR / 2], const fc_hpb_drop<BR> &kd, float mul,
                                                         uint32_t sD = 0, int t = 0) {
#pragma unroll
  for (int x = 0; x < BR / 8; x++) {
    const float2 dr = BIASED ? fc_hpb_ld_shared_f32x2(sD + 4 * (8 * x + 2 * t)) : make_float2(0.0f, 0.0f);
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int i = fc_hpb_drop_bit(x, e);
      const float v = BIASED ? y[4 * x + e] + ((e & 1) ? dr.y : dr.x) : y[4 * x + e];
      y[4 * x + e] = (kd.w[i / 32] >> (i % 32)) & 1u ? v * mul : 0.0f;
    }
  }
}
/* Pᵀ packed to 16 bits (pp[kb][r]: elements 8kb + 2r, 8kb + 2r + 1, as fc_hpb_p_pass_mod packs them) ← Pᵀ∘keep: the
 * dropped halves cleared. */
template <int BR>
static __device__ __forceinline__ void fc_hpb_drop_packed(uint32_t (&pp)[BR / 16][4], const fc_hpb_drop<BR> &kd) {
#pragma unroll
  for (int kb = 0; kb < BR / 16; kb++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int x = 2 * kb + r / 2, e = 2 * (r % 2), i0 = fc_hpb_drop_bit(x, e), i1 = fc_hpb_drop_bit(x, e + 1);
      const uint32_t m = ((kd.w[i0 / 32] >> (i0 % 32)) & 1u ? 0x0000ffffu : 0u) |
                         ((kd.w[i1 / 32] >> (i1 % 32)) & 1u ? 0xffff0000u : 0u);
      pp[kb][r] &= m;
    }
}

/* BIAS (hopper/bwd_kernel.cuh): Sᵀ's and dPᵀ's accumulators start at −lse2_i/c (ST) and −D_i (DP) (the stage's rows at
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
      /* fc_fmax_nan: a NaN lse (a row that met a NaN in the forward) stays NaN, and so does its P. */
      const float bx = fc_fmax_nan(-l2.x * inv_c, -3.4e38f), by = fc_fmax_nan(-l2.y * inv_c, -3.4e38f);
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
 * (hopper/gemm.cuh's fc_hp_ss_kmajor, two products interleaved, with the halves of the two tiles of different heights:
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

/* The second version's dQ path: this warpgroup's dQ product (64 rows × NQ columns, the wgmma accumulator layout) into
 * its shared-memory tile, then one thread adds the whole tile to `dst` in the fp32 sum (one bulk reduce-add). The tile
 * is the sum's blocked layout (fc_bwd_dq_blocked_index, w = W): NQ / W tiles of 64 rows × W columns one after the
 * other, which is where the sum keeps them when NQ is all its ld columns (Br = 128: W = 32, NQ = D = 64). Row 16·warp +
 * g + 8·rh, columns 8x + 2t, + 1: in sub-tile x / (W / 8), the row's 16-byte chunk 2·(x % (W / 8)) + t / 2, stored at
 * that chunk ^ (2g % (W / 4)). The caller has made sure the last add from this tile has read it. */
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

/* The end of the dK/dV kernels at D ≤ 128: dK_j = scale·dK_j and dV_j (this warpgroup's keys k0 + 64·cw .., the
 * accumulators' rows 16·warp + g (+ 8), columns 8x + 2t, + 1) into global memory through shared memory, so that the
 * global stores are whole 16-byte chunks of rows: stored from the accumulators as 32-bit pairs, half of every 32-byte
 * sector was wasted (ncu). `stage` is where they are staged: the Q/dO stage ring, 2 × 64 × D × 2 bytes per warpgroup
 * at least: free once both consumer warpgroups are past the barrier below (every fill has been consumed and every
 * wgmma retired; the producer issues nothing more). The smem tile is swizzled by 16-byte chunks (chunk x of row r at
 * x ^ r % 8) so that both the pair writes and the chunk reads are free of bank conflicts. DV_COLS: dV has V's head dim
 * (a.head_dim_v) of columns, not Q/K's (a flag, so that the kernels built without it keep their code). */
template <typename T, int D, bool DV_COLS = false>
static __device__ __forceinline__ void fc_hpb_store_dkdv(const float (&dk)[D / 2], const float (&dv)[D / 2],
                                                         uint32_t stage, const fc_hopper_bwd_args &a, uint16_t *dK,
                                                         uint16_t *dV, int k0, int sk, int cw, int ct) {
  constexpr uint32_t TILE = 64 * D * 2;
  const int warp = ct / 32, g = ct % 32 / 4, t = ct % 4;
  const uint32_t tk = stage + cw * 2 * TILE, tv = tk + TILE;
  fc_named_barrier(FC_HPB_BAR_DS_ALL, 256); /* both warpgroups are done with the stages */
  fc_fence_proxy_async();                   /* after the async proxy's use of this memory, before these writes */
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
  fc_hpb_store_tile<D>(tv, dV, a.dv_ss, k0 + 64 * cw, sk, DV_COLS ? a.head_dim_v : a.head_dim, a.dv_vec, ct);
}
#endif /* FC_HOPPER_ARCH */

#if FC_HOPPER_ARCH
/* dbias (a float attn_mask's gradient): this thread's dSᵀ (keys key0, key0 + 8 × queries q0 + 8x + 2t, + 1: the
 * accumulator layout) into (sequence b, query head hh)'s plane of md.dbias, in the call's dtype or added to fp32 sums
 * (mma/bwd_score_mod.cu's passes around the kernel zero it first and sum it after), the pairs inside the sequence
 * only: each pair of a (query head, key block) is computed by one CTA, so that the deterministic mode's sums (over
 * every pair's own fp32 element, mma/bwd_score_mod.cu) stay in order. dbias = dS = Pᵀ∘(dPᵀ − D_i) (no softcap:
 * fc_hopper_bwd_supports). The stores are 16-bit and a row of keys apart (the fragment's pairs are queries): the
 * price of a gradient few calls ask for, in the ADD kernels only. */
template <typename T, int BR>
static __device__ __forceinline__ void fc_hpb_dbias_put(const fc_score_mod &md, int64_t b, int hh,
                                                        const float (&ds)[BR / 2], int q0, int key0, int sq, int sk,
                                                        int t) {
  void *const plane = fc_dbias_plane(md, b, hh);
#pragma unroll
  for (int x = 0; x < BR / 8; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int key = key0 + 8 * (e >> 1), query = q0 + 8 * x + 2 * t + (e & 1);
      if (key < sk && query < sq)
        fc_dbias_put<T>(md, plane, query * md.dbias_st[2] + key * md.dbias_st[3], ds[4 * x + e]);
    }
}

#endif /* FC_HOPPER_ARCH */

/* The deterministic dK/dV kernel. dQ_i is split between the two consumer warpgroups by columns: warpgroup c computes
 * columns N·c .. N·c + N − 1 (N = D / 2) over all 128 keys of K_j (both warpgroups' rows of dSᵀ), so that every
 * element of dQ_i gets one fp32 reduction per CTA instead of two (ncu: the backward is L2-bound on these reductions;
 * the split ran 1.20-1.31x each warpgroup adding its own keys' share at D = 128, seqlen ≥ 1k,
 * bench/results/configs/hopper-bwd-dq-split-h100.txt). The price: both warpgroups meet at a barrier before and after
 * writing dSᵀ. The adds are red.global.add in a fixed order (the tickets above), into the [total_q][hq][D] sum. */
template <typename T, int D, int STAGES, bool SCORE_MOD = false, bool ADD = false, bool DV_COLS = false,
          bool DROP = false>
__global__ void __launch_bounds__(FC_HPB_THREADS, 1)
    fc_hopper_bwd_det_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                             const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                             const fc_hopper_bwd_args a) {
#if FC_HOPPER_ARCH
  constexpr int BR = FC_HPB_BR;
  constexpr int NQ = D / 2; /* columns of one dQ product */
  static_assert(FC_BWD_ROWS_PAD % BR == 0, "a query block stays inside its sequence's padded rows");
  constexpr uint32_t KV_BYTES = FC_HPB_BC * D * 2, Q_BYTES = BR * D * 2, ROWS_BYTES = BR * 4;
  constexpr uint32_t DS_BYTES = FC_HPB_BC * BR * 2;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* Aligned by hand to 1024 bytes (the swizzle pattern's period); the launch adds the slack. */
  const uint32_t sK = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sV = sK + KV_BYTES, sQ = sV + KV_BYTES, sdO = sQ + STAGES * Q_BYTES, sdS = sdO + STAGES * Q_BYTES;
  const uint32_t sLD = sdS + DS_BYTES, bars = sLD + STAGES * 2 * ROWS_BYTES;
  const uint32_t kv_full = bars;
#define FULL(s)  (bars + 8u * (1 + (s)))
#define EMPTY(s) (bars + 8u * (1 + STAGES + (s)))

  /* Which tile (fc_hpb_tile_of_cta). */
  fc_hpb_tile ti;
  if (!fc_hpb_tile_of_cta<BR>(a, &ti)) return; /* the whole CTA, before any barrier */
  const int jb = ti.jb, sq = ti.sq, sk = ti.sk, k0 = ti.k0;
  const int i_begin = ti.i_begin, n_i = ti.n_i, n_iter = ti.n_iter;
  const int64_t pad0 = ti.pad0, shift = ti.shift;
  const int64_t q_row0 = a.cu_q ? ti.q_start : ti.b * a.seqlen_q; /* the sequence's first row of the dQ sum */
  int prev_begin = 0, prev_n = 0;                                 /* the previous key block's query blocks */
  if (jb > 0)
    fc_hpb_query_blocks<BR>(k0 - FC_HPB_BC, sq, sk, shift, a.window_left, a.window_right, &prev_begin, &prev_n);

  fc_hpb_start<STAGES>(bars);
  if (threadIdx.x < 128) {
    fc_hpb_producer<D, BR, STAGES, ADD>(a, ti, &tm_q, &tm_k, &tm_v, &tm_do, sK, sV, sQ, sdO, sLD, bars);
  } else { /* the consumers */
    const auto [cw, ct, warp, lane, g, t] = fc_hpb_consumer();
    const uint32_t k_rows = sK + 64 * cw * FC_HPB_ROW_BYTES; /* this warpgroup's 64 keys (in each half) */
    const uint32_t v_rows = sV + 64 * cw * FC_HPB_ROW_BYTES;
    const uint32_t ds_rows = sdS + 64 * cw * FC_HPB_ROW_BYTES; /* and its 64 rows of dSᵀ */
    const int key0 = k0 + 64 * cw + 16 * warp + g;             /* this thread's keys: key0, key0 + 8 */
    const float c = a.scale_log2;

    float dk[D / 2], dv[D / 2];
#pragma unroll
    for (int x = 0; x < D / 2; x++) dk[x] = dv[x] = 0.0f;
    if (n_iter > 0) fc_mbar_wait(kv_full, 0); /* K_j, V_j have landed */

    float st[BR / 2], dpt[BR / 2];
    for (int it = 0; it < n_iter; it++) {
      const int s = it % STAGES, u = it / STAGES;
      const int hh = ti.h0 + it / n_i, q0 = (i_begin + it % n_i) * BR;
      const uint32_t q_tile = sQ + s * Q_BYTES, do_tile = sdO + s * Q_BYTES;
      const uint32_t sL = sLD + s * 2 * ROWS_BYTES, sD = sL + ROWS_BYTES;
      int *ticket = NULL;
      /* SCORE_MOD: the block's attn_mask, loaded before the wgmmas (fc_hpb_mask_block) */
      [[maybe_unused]] fc_hpb_mblock<BR> mb;
      [[maybe_unused]] const int mcls =
          SCORE_MOD ? fc_hpb_mask_block<BR, FC_HPB_BC>(a.mod, ti.b, hh, q0, k0, key0, t, sq, sk, &mb) : (int)FC_MT_ALL;
      /* DROP: the block's dropout keep bits, before the wgmmas too */
      [[maybe_unused]] fc_hpb_drop<BR> kd;
      if constexpr (DROP) fc_hpb_drop_bits<BR>(kd, a.mod, (uint64_t)(ti.b * a.heads_q + hh), q0, key0, sk, g, t);
      /* Sᵀ = K_j·Q_iᵀ, dPᵀ = V_j·dO_iᵀ */
      fc_mbar_wait(FULL(s), u & 1); /* Q_i, dO_i, lse2_i, D_i have landed */
      fc_fence_regs(dk);
      fc_fence_regs(dv);
      fc_wgmma_fence();
      fc_hpb_sdp<T, D, BR>(st, dpt, k_rows, v_rows, q_tile, do_tile);
      fc_wgmma_commit();
      fc_wgmma_wait<0>();
      fc_fence_regs(st);
      fc_fence_regs(dpt);

      /* Pᵀ = 2^(c·Sᵀ − lse2_i), masked, and dSᵀ = Pᵀ∘(dPᵀ − D_i) in one pass (SCORE_MOD: of the modified
       * scores, dSᵀ through tanh). */
      if constexpr (SCORE_MOD) {
        uint32_t unused[BR / 16][4];
        /* DROP: dSᵀ from Z∘dPᵀ, and dV from Pᵀ∘Z (1/(1 − p) in Z here: this kernel's Pᵀ is still fp32) */
        if constexpr (DROP) fc_hpb_drop_apply<BR>(dpt, kd, a.mod.drop_rp);
        fc_hpb_p_from_s_mod<T, BR, FC_HPB_MOD_DS, FC_HPB_BC, ADD>(
            st, dpt, unused, unused, sL, sD, t, q0, k0, key0, sq, sk, shift, a.window_left, a.window_right, a.mod,
            fc_score_mod_slope(a.mod, ti.b, hh), ti.b, hh, mcls, mb);
        if constexpr (DROP) fc_hpb_drop_apply<BR>(st, kd, a.mod.drop_rp);
        if constexpr (ADD)
          if (a.mod.dbias) fc_hpb_dbias_put<T, BR>(a.mod, ti.b, hh, dpt, q0, key0, sq, sk, t);
      } else {
        fc_hpb_p_from_s<BR, true>(st, dpt, sL, sD, c, t, q0, k0, key0, sq, sk, shift, a.window_left, a.window_right);
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

      /* dSᵀ into this warpgroup's rows of sdS, swizzled as TMA would write it: row r (a key), 16-byte chunk x
       * (queries 8x .. 8x + 7) at r·128 + ((x ^ (r % 8))·16); this thread's rows have r % 8 = g. */
      fc_fence_proxy_async(); /* after the async proxy's reads of sdS (the last dQ wgmma), before these writes */
      /* Every warp of both warpgroups (whose dQ wgmmas read these rows) is past the last block's dQ wgmma wait:
       * none still reads sdS. */
      fc_named_barrier(FC_HPB_BAR_DS_ALL, 256);
#pragma unroll
      for (int x = 0; x < BR / 8; x++)
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
          const int r = 16 * warp + g + 8 * rh;
          /* dpt[4x + 2rh], dpt[4x + 2rh + 1], packed above as dsp[x / 2][2·(x % 2) + rh] */
          fc_st_shared_u32(ds_rows + r * FC_HPB_ROW_BYTES + ((x ^ g) << 4) + 4 * t, dsp[x / 2][2 * (x % 2) + rh]);
        }
      fc_fence_proxy_async();                   /* these generic writes, before the async proxy (wgmma) reads them */
      fc_named_barrier(FC_HPB_BAR_DS_ALL, 256); /* both warpgroups' dSᵀ rows are in shared memory */

      /* dV_j += Pᵀ·dO_i, dK_j += dSᵀ·Q_i */
      fc_wgmma_fence();
      fc_hpb_dkdv<T, D, BR>(dv, dk, pp, dsp, q_tile, do_tile);
      fc_wgmma_commit();

      /* dQ_i (columns NQ·cw ..) += dS·K_j over all 128 keys, added into the fp32 sum: lanes t and t ^ 1 swap
       * halves so that each red adds four consecutive columns of one row (even lane: row g, odd lane: row g + 8).
       * Rows past the sequence are skipped (their dS is 0, but the rows belong to another one). */
      const bool odd = t & 1;
      const int qrow = q0 + 16 * warp + g + (odd ? 8 : 0);
      float *dq_row = a.dq_accum + ((q_row0 + qrow) * a.heads_q + hh) * (int64_t)D + 4 * (t >> 1);
      /* Wait for this warpgroup's turn (fc_flag_wait); the previous key block saw query block q0 / Br iff it
       * lies in that block's range. */
      const int ib = q0 / BR;
      const bool first = cw == 0 && !(prev_n > 0 && ib >= prev_begin && ib < prev_begin + prev_n);
      ticket = a.dq_ticket + ((int64_t)hh * a.total_pad + pad0 + q0) / BR;
      if (ct == 0 && !first) fc_flag_wait(ticket, 2 * jb + cw, 32);
      fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* the whole warpgroup adds after the acquire */
      {
        const int col0 = NQ * cw; /* this product's first column of dQ_i */
        float dq[NQ / 2];
        fc_wgmma_fence();
        /* keys 0 .. 63 (warpgroup 0's dSᵀ rows), then 64 .. 127 */
        const uint32_t k_cols = sK + (col0 / 64) * FC_HPB_KV_HALF + (col0 % 64) * 2;
        fc_hpb_dq<T, NQ>(dq, sdS, k_cols);
        fc_hpb_dq<T, NQ, false>(dq, sdS + 64 * FC_HPB_ROW_BYTES, k_cols + 64 * FC_HPB_ROW_BYTES);
        fc_wgmma_commit();
        fc_wgmma_wait<0>();
        fc_fence_regs(dq);
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
      __threadfence();                           /* this thread's adds are performed ... */
      fc_named_barrier(FC_HPB_BAR_DS + cw, 128); /* ... every thread's, before the turn passes on */
      if (ct == 0) fc_flag_post(ticket, 2 * jb + cw + 1);
      /* dV, dK of this block are done (the waits above covered them) */
      fc_wgmma_wait<0>();
      fc_fence_regs(dk);
      fc_fence_regs(dv);
      /* Q_i, dO_i, lse2_i, D_i of stage s are read: it may be refilled. Every consumer thread arrives: an
       * arrive releases only the arriving thread's own reads of sL/sD (racecheck found the next bulk fill
       * racing with the other lanes' reads when lane 0 arrived for its warp). */
      fc_mbar_arrive_if(EMPTY(s), true);
    }

    uint16_t *dK = fc_hpb_key_rows(a.dk, a.dk_sb, a.dk_ss, a.dk_sh, ti);
    uint16_t *dV = fc_hpb_key_rows(a.dv, a.dv_sb, a.dv_ss, a.dv_sh, ti);
    static_assert(2 * STAGES * Q_BYTES >= 2 * 2 * 64 * D * 2, "the stage ring holds both warpgroups' dK, dV tiles");
    fc_hpb_store_dkdv<T, D, DV_COLS>(dk, dv, sQ, a, dK, dV, k0, sk, cw, ct);
  }
#undef FULL
#undef EMPTY
#endif /* FC_HOPPER_ARCH */
}

/* The second version (D = 64, 128): its own file, sharing the helpers above. */
#include "hopper/bwd_kernel.cuh"
/* The D = 256 kernel: its own file, sharing the helpers above. */
#include "hopper/bwd_d256.cuh"

/* ---- the launch (host) ------------------------------------------------------------------------------------------- */
typedef void (*fc_hpb_kernel_fn)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
                                 const fc_hopper_bwd_args);

/* The dK/dV kernels the backward has. */
typedef enum {
  FC_HPB_D64,      /* fc_hopper_bwd_kernel<T, 64>: Br = 128, bulk dQ, LAG */
  FC_HPB_D128,     /* fc_hopper_bwd_kernel<T, 128>: Br = 64, bulk dQ, LAG and BIAS */
  FC_HPB_DET_D64,  /* fc_hopper_bwd_det_kernel<T, 64, 3>: deterministic, split dQ with tickets */
  FC_HPB_DET_D128, /* fc_hopper_bwd_det_kernel<T, 128, 2>: the same */
  FC_HPB_D256,     /* fc_hopper_bwd_d256_kernel<T>: EDV */
  FC_HPB_D192_128, /* fc_hopper_bwd_d256_kernel<T, false, false, true, 3, 2>: the pair 192/128's halves only */
} fc_hpb_kernel_id;

/* The backward's plan for one call. */
typedef struct fc_hpb_plan_t {
  fc_hpb_kernel_id kernel;
  int br;        /* query rows per block: the box of the Q and dO tensor maps */
  int dq_tile_w; /* the blocked dQ sum's tile width (fc_bwd_dq_blocked_index), 0: [total_q][hq][D] by red.global.add */
  size_t smem;   /* dynamic shared memory per CTA */
  const char *name; /* "launch of <kernel>", for errors */
} fc_hpb_plan_t;

/* SCORE_MOD: the same kernel built with softcap, ALiBi and attn_mask (hopper/score_mod.cuh). DROP (with SCORE_MOD,
 * not ADD): and dropout, a variant of its own, so that the keep bits' registers cost only the calls that use them
 * (in the SCORE_MOD kernels as a run-time branch, they spilled 12–28 more bytes of stores at D = 128); none at D = 256
 * (fc_hopper_bwd_supports refuses dropout there, and dropout with a float attn_mask: `auto` runs them on cuda-mma). */
template <typename T, bool SCORE_MOD, bool ADD = false, bool DROP = false>
static fc_hpb_kernel_fn fc_hpb_kernel(fc_hpb_kernel_id id) {
  static_assert(!DROP || (SCORE_MOD && !ADD), "dropout: the SCORE_MOD kernels without a float bias");
  switch (id) {
  case FC_HPB_D64: return fc_hopper_bwd_kernel<T, 64, SCORE_MOD, ADD, false, DROP>;
  case FC_HPB_D128: return fc_hopper_bwd_kernel<T, 128, SCORE_MOD, ADD, false, DROP>;
  case FC_HPB_DET_D64: return fc_hopper_bwd_det_kernel<T, 64, 3, SCORE_MOD, ADD, false, DROP>;
  case FC_HPB_DET_D128: return fc_hopper_bwd_det_kernel<T, 128, 2, SCORE_MOD, ADD, false, DROP>;
  case FC_HPB_D192_128: return nullptr; /* head_dim_v = head_dim here: never planned */
  default:
    if constexpr (DROP)
      return nullptr; /* refused before the plan (fc_hopper_bwd_supports) */
    else
      return fc_hopper_bwd_d256_kernel<T, SCORE_MOD, ADD>;
  }
}

/* V's head dim of its own: the plan's kernel built with DV_COLS (dV stored for head_dim_v columns), for the kernels
 * that the pairs' larger head dims pick (D = 128, deterministic D = 128, D = 256 and its 192/128 halves), without
 * SCORE_MOD (hopper_supports refuses it with such a pair): 8 kernels. */
template <typename T> static fc_hpb_kernel_fn fc_hpb_dv_kernel(fc_hpb_kernel_id id) {
  switch (id) {
  case FC_HPB_D128: return fc_hopper_bwd_kernel<T, 128, false, false, true>;
  case FC_HPB_DET_D128: return fc_hopper_bwd_det_kernel<T, 128, 2, false, false, true>;
  case FC_HPB_D256: return fc_hopper_bwd_d256_kernel<T, false, false, true>;
  case FC_HPB_D192_128: return fc_hopper_bwd_d256_kernel<T, false, false, true, 3, 2>;
  default: return NULL; /* D = 64: no pair runs there (fc_hpb_dim > 64) */
  }
}

/* The plan's dK/dV kernel in one form for element type T, launched on the call's stream: fc_hpb_kernel<T, SCORE_MOD,
 * ADD, DROP>, or, plain with V's head dim of its own, fc_hpb_dv_kernel<T> (if constexpr: only the plain form's file
 * instantiates those). */
template <typename T, bool SCORE_MOD, bool ADD = false, bool DROP = false>
static flashc_status fc_hpb_launch(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                   const fc_hopper_bwd_args *a, int grid) {
  fc_hpb_kernel_fn kernel;
  if constexpr (SCORE_MOD) /* hopper_supports refuses the score modifiers with V's head dim of its own */
    kernel = fc_hpb_kernel<T, true, ADD, DROP>(pl->kernel);
  else
    kernel = p->head_dim_v != p->head_dim ? fc_hpb_dv_kernel<T>(pl->kernel) : fc_hpb_kernel<T, false>(pl->kernel);
  if (!kernel) /* fc_hopper_bwd_supports refuses what has no kernel; kept as a status, not a crash */
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: cuda-hopper has no kernel for head_dim %lld, head_dim_v %lld%s",
                    (long long)p->head_dim, (long long)p->head_dim_v, a->mod.drop_on ? " with dropout" : "");
  FC_CHECK(fc_mma_smem((const void *)kernel, pl->smem, "flashc_backward: backend cuda-hopper"));
  kernel<<<grid, FC_HPB_THREADS, pl->smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a);
  const cudaError_t e = cudaGetLastError(); /* FC_LAUNCH_CHECK with the plan's kernel name */
  if (e != cudaSuccess) return fc_cuda_error(e, pl->name, __FILE__, __LINE__);
  return FLASHC_OK;
}

/* fc_hpb_launch for the call's dtype. */
template <bool SCORE_MOD, bool ADD = false, bool DROP = false>
static flashc_status fc_hpb_launch_dtype(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                         const fc_hopper_bwd_args *a, int grid) {
  if (p->dtype == FLASHC_F16) return fc_hpb_launch<__half, SCORE_MOD, ADD, DROP>(p, pl, maps, a, grid);
  return fc_hpb_launch<__nv_bfloat16, SCORE_MOD, ADD, DROP>(p, pl, maps, a, grid);
}

/* The feature forms' launches, each in a file of its own: fc_hpb_launch_dtype<true> (hopper/bwd_score_mod.cu),
 * <true, true> (hopper/bwd_bias.cu) and <true, false, true> (hopper/bwd_dropout.cu); hopper/bwd.cu's fc_hpb_run picks
 * one, or launches the plain form itself. */
flashc_status fc_hpb_launch_score_mod(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                      const fc_hopper_bwd_args *a, int grid);
flashc_status fc_hpb_launch_bias(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                 const fc_hopper_bwd_args *a, int grid);
flashc_status fc_hpb_launch_dropout(const fc_problem *p, const fc_hpb_plan_t *pl, const CUtensorMap maps[4],
                                    const fc_hopper_bwd_args *a, int grid);

#endif /* FLASHC_CUDA_HOPPER_BWD_LAUNCH_CUH */
