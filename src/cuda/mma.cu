/* mma.cu — cuda-mma forward: FlashAttention-2 on tensor cores through mma.sync
 * (sm_80+).
 *
 *   for each query block Q_i (Br = 128 rows, one CTA; each warp owns MT tiles
 * of 16 rows): for each key block j (Bc keys) that the mask leaves visible to
 * some row of Q_i: S = Q_i·K_jᵀ                          (m16n8k16; Q_i
 * fragments in registers or read from sQ, K_j fragments via ldmatrix, shared by
 * the warp's MT tiles) m' = max(m, rowmax S);  P = 2^(c·S − c·m');  l = 2^(c·(m
 * − m'))·l + rowsum P   (c = scale·log2 e) O = 2^(c·(m − m'))·O + P·V_j (P
 * stays in registers as the A operand; V_j via ldmatrix.trans) O /= l;  lse =
 * scale·m + ln l
 *
 * Shapes: q, o [b, sq, hq, d]; k, v [b, sk, hkv, d] (any strides, in elements);
 * lse [b, hq, sq] or [hq, total_q] (varlen). The head dim d is compiled as D in
 * {32, 64, 96, 128, 160, 192, 256}; any other d runs in the next D with zero
 * columns.
 *
 * Shared memory (16-bit elements, rows of DS = round_up(D, 64), XOR-swizzled:
 * see mma_tile.cuh): sQ [Br][DS]          Q_i; at the end each warp stages its
 * O rows here sK [STAGES][Bc][DS]  K_j ring buffer, filled by cp.async STAGES −
 * 1 blocks ahead sV [STAGES][Bc][DS]  V_j likewise. Per thread (lane = 4g + t), per M-tile: rows g and g + 8 of the
 * tile, O (D/8 × 4 fp32), S (Bc/8 × 4 fp32), m and l of its two rows; Q (D/16 ×
 * 4 registers) when Q_IN_REGS.
 *
 * Tile shapes per head dim come from one table, fc_mma_fwd_configs: "lean3u"
 * and "lean3" (the defaults without and with a mask: mt2's shapes in
 * mma_fwd_lean.cuh's kernel, 3 stages at d ≤ 64, lean3u with Bc = 32 at d 96 and
 * 128), "lean" (2 stages everywhere), "mt2" (the first kernel, mma_fwd_steps.cuh),
 * "base" (FLASHC_MMA_FWD_CONFIG, for comparisons);
 * tools/mma/bench-fwd.sh checks and times them all. */
#include "common.cuh"
#include "mma_fwd_common.cuh"
#include "mma_fwd_lean.cuh"
#include "mma_host.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* MT M-tiles of 16 rows per warp, FC_MMA_BR / (16·MT) warps. */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS, bool ALIGNED>
__global__ void __launch_bounds__(FC_MMA_BR / MT * 2, MIN_BLOCKS) fc_mma_fwd_kernel(const fc_mma_fwd_args a) {
  constexpr int BR = FC_MMA_BR, NW = BR / (16 * MT), NT = NW * 32, DS = fc_tile_stride(D);
  constexpr int KD = D / 16; /* k-steps of Q·Kᵀ over the head dim */
  constexpr int NS = BC / 8; /* n-blocks of S */
  constexpr int NO = D / 8;  /* n-blocks of O */
  constexpr int QKD = Q_IN_REGS ? KD : 1;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sQ = smem, *sK = sQ + BR * DS, *sV = sK + STAGES * BC * DS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wrow = warp * MT * 16; /* the warp's first row in the block; tile mt
                                      starts at wrow + 16·mt */

  const fc_fwd_where w = fc_fwd_locate(a);
  const int64_t b = w.b, q_start = w.q_start, k_start = w.k_start;
  const int h = w.h, mb = w.mb, sq = w.sq, sk = w.sk;
  const int i0 = mb * BR;
  if (i0 >= sq) return;
  const int hk = h / a.group;
  const uint16_t *Q = a.q + b * a.q_sb + q_start * a.q_ss + (int64_t)h * a.q_sh; /* row 0 of this sequence */
  const uint16_t *K = a.k + b * a.k_sb + k_start * a.k_ss + (int64_t)hk * a.k_sh;
  const uint16_t *V = a.v + b * a.v_sb + k_start * a.v_ss + (int64_t)hk * a.v_sh;

  /* Key blocks visible to some row of this block: [j_begin, j_end). Rows past
   * sq are padding. */
  const int64_t shift = (a.bottom_right ? (int64_t)sk - sq : 0) + a.mask_offset;
  const int i_last = min(i0 + BR, sq) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  fc_row_keys(i0, shift, a.window_left, a.window_right, sk, &lo_first, &hi_first);
  fc_row_keys(i_last, shift, a.window_left, a.window_right, sk, &lo_last, &hi_last);
  const int j_begin = lo_first / BC;
  const int j_end = lo_first < hi_last ? (hi_last + BC - 1) / BC : j_begin;
  /* Whether key block j needs the mask: only blocks that cut through the key
   * tail or some row's window. */
  auto needs_mask = [&](int j) {
    const int k0 = j * BC;
    return !(k0 + BC <= sk && (a.window_right < 0 || k0 + BC - 1 <= i0 + shift + a.window_right) &&
             (a.window_left < 0 || k0 >= i_last + shift - a.window_left));
  };
  auto load_k = [&](int j, int stage) {
    fc_fwd_load_tile<BC, D, NT, ALIGNED>(sK + stage * BC * DS, K + (int64_t)j * BC * a.k_ss, a.k_ss, sk - j * BC,
                                         a.head_dim, tid, K);
  };
  auto load_v = [&](int j, int stage) {
    fc_fwd_load_tile<BC, D, NT, ALIGNED>(sV + stage * BC * DS, V + (int64_t)j * BC * a.v_ss, a.v_ss, sk - j * BC,
                                         a.head_dim, tid, V);
  };

  fc_fwd_load_tile<BR, D, NT, ALIGNED>(sQ, Q + (int64_t)i0 * a.q_ss, a.q_ss, sq - i0, a.head_dim, tid, Q);
  fc_cp_async_commit();
  /* Prologue: the first STAGES − 1 key blocks, one commit group each (empty
   * groups keep the count). */
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    const int j = j_begin + s;
    if (j < j_end) load_k(j, s), load_v(j, s);
    fc_cp_async_commit();
  }
  fc_cp_async_wait<STAGES - 1>(); /* Q's group is the oldest */
  __syncthreads();                /* every thread's part of Q_i has landed */
  const uint32_t neg = a.negate_q ? 0x80008000u : 0u;
  const uint32_t q_lane = fc_fwd_lane<DS>(FC_FRAG_A, lane), k_lane = fc_fwd_lane<DS>(FC_FRAG_B, lane),
                 v_lane = fc_fwd_lane<DS>(FC_FRAG_BT, lane);
  const uint32_t sQ_u = fc_smem_u32(sQ);
  uint32_t qf[MT][QKD][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        fc_ldmatrix_x4(qf[mt][kk], fc_fwd_addr<DS>(sQ_u, q_lane, wrow + 16 * mt, kk));
#pragma unroll
        for (int x = 0; x < 4; x++) qf[mt][kk][x] ^= neg;
      }
  }

  float o[MT][NO][4];
  fc_fwd_zero<MT, NO>(o);
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  for (int j = j_begin; j < j_end; j++) {
    const int n = j - j_begin;
    fc_cp_async_wait<STAGES - 2>(); /* this thread's copies of block j have landed */
    /* Block j is visible to every warp, and every warp is done with block j −
     * 1, whose stage the prefetch below overwrites. */
    __syncthreads();
    {
      const int jp = j + STAGES - 1, sp = (n + STAGES - 1) % STAGES;
      if (jp < j_end) load_k(jp, sp), load_v(jp, sp);
      fc_cp_async_commit();
    }
    const uint32_t Kj = fc_smem_u32(sK + (n % STAGES) * BC * DS), Vj = fc_smem_u32(sV + (n % STAGES) * BC * DS);

    /* S = Q_i·K_jᵀ, raw dot products: the scale is folded into the exponent
     * below. */
    float s[MT][NS][4];
    fc_fwd_zero<MT, NS>(s);
#pragma unroll
    for (int kk = 0; kk < KD; kk++)
      fc_fwd_qk_step<T, DS, MT, NS, QKD, Q_IN_REGS>(s, qf, kk, sQ_u, q_lane, wrow, neg, Kj, k_lane);
    if (needs_mask(j)) fc_fwd_mask<MT, NS>(s, i0 + wrow, shift, a.window_left, a.window_right, sk, j * BC, g, t);

    /* m' = max(m, rowmax S); O, l rescaled; P = 2^(c·S − c·m'); l += rowsum
     * P. */
    fc_fwd_max_rescale<MT, NS, NO>(s, m, l, o, a.scale_log2);
    float base[MT][2];
    fc_fwd_bases<MT>(m, a.scale_log2, base);
    fc_fwd_exp<MT, NS>(s, l, base, a.scale_log2, 0, NS);

    /* O += P·V_j: P packed to 16 bits one k-step (16 keys) at a time. */
#pragma unroll
    for (int kb = 0; kb < BC / 16; kb++) {
      uint32_t pa[MT][NS / 2][4];
      fc_fwd_pack<T, MT, NS>(s, pa, 2 * kb, 2 * kb + 2);
      uint32_t pk[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < 4; x++) pk[mt][x] = pa[mt][kb][x];
      fc_fwd_pv_step<T, DS, D, MT, NO>(o, pk, kb, Vj, v_lane);
    }
  }

  fc_fwd_finish<T, D, MT, ALIGNED>(a, w, i0, wrow, o, m, l, sQ, lane);
}

/* ---- configurations
 * ------------------------------------------------------------------------------------
 */
/* Tile shape of one compiled head dim: Bc keys per block, stages of the K/V
 * ring, M-tiles per warp (FC_MMA_BR / (16·MT) warps), Q in registers for the
 * whole key loop, CTAs per SM to aim for (the register budget: 65536 /
 * (MIN_BLOCKS · threads), at most 255). */
typedef struct fc_mma_fwd_shape {
  int bc, stages, mt, q_in_regs, min_blocks;
  int lean; /* 1: mma_fwd_lean.cuh's kernel */
} fc_mma_fwd_shape;

enum {
  FC_MMA_NDIMS = 7,
  FC_MMA_NCONFIGS = 5,
  FC_MMA_FWD_BASE = 1,
  FC_MMA_FWD_DEFAULT = 3 /* lean3 */,
  FC_MMA_FWD_DEFAULT_UNMASKED = 4 /* lean3u */
};
static constexpr int fc_mma_dims[FC_MMA_NDIMS] = {32, 64, 96, 128, 160, 192, 256};

/* Rows, by head dim 32 … 256 (FLASHC_MMA_FWD_CONFIG picks one; unset, lean3u
 * or lean3 by the call's mask (fc_mma_fwd_config, e78db97); lean, the default
 * before them (ee97bcd): H100 bf16 vs SDPA flash in one run, d128 0.93–1.06×
 * where mt2 read 0.88–0.95×, d256 0.84–1.15× (0.79–1.06×), d64 1.00–1.14×).
 * Measured on the H100 against SDPA flash, geometric mean over bf16 and
 * fp16, seqlen 1k/4k/16k (tools/mma/bench-fwd.sh, 2026-11-22):
 *   mt2      (the first default) d ≤ 128: 4 warps × 32 rows (MT = 2: each K_j/V_j fragment feeds
 *            two M-tiles, half the ldmatrix per MMA) at 2 CTAs/SM, whose
 *            barriers are independent (one CTA's softmax runs beside the
 *            other's MMAs): d64 1.05×, d128 0.93× (base 0.94×, 0.85×).
 *            d ≥ 160: Bc = 64 (half the barriers and softmax passes per key;
 *            192 KB at d 256): d256 0.92× (base 0.82×). Where the device gives
 *            a block less shared memory (A100: d256), base's shape runs.
 *   base     8 warps × 16 rows, Bc = 64 (32 from d 160): the first shapes.
 *   lean     mt2's shapes in mma_fwd_lean.cuh's kernel: fewer
 *            instructions per key block (no per-fragment negation or swizzle
 *            XOR, unpredicated copies of whole blocks, the mask test hoisted).
 *   lean3    lean with 3 stages of the K/V ring at d ≤ 64 (2 CTAs of 74 KB
 *            fit an SM; from d 96 they would not), so that block j + 1's
 *            copies may still be in flight while block j computes: the
 *            default for calls with a causal mask or a window (d64 vs lean,
 *            5 rounds of the grid on the H100: +0..3 % unmasked, +0..1 %
 *            causal, median per cell; bench/results/configs/
 *            mma-fwd-limits-2026-11-24.txt, E).
 *   lean3u   lean3 with Bc = 32 at d 96/128 (S in half the registers: the
 *            key loop reloads no spilled values, where Bc = 64 reloads 11–16
 *            per block; 2 stages, so that 2 CTAs of 70 KB fit an A100's SM):
 *            the default for calls without a mask (d128 vs lean: +1..8 %
 *            unmasked, but −1..−3 % causal at 2k–8k, hence the choice by
 *            mask; mma-fwd-limits-2026-11-24.txt, H and H').
 * Tried and dropped (0.73–0.85×): issuing S_{j+1} = Q·K_{j+1}ᵀ before the
 * softmax of block j, and weaving its k-steps into the exponentials (the extra
 * accumulators cost the second CTA per SM, which overlapped better). */
static constexpr fc_mma_fwd_shape fc_mma_fwd_configs[FC_MMA_NCONFIGS][FC_MMA_NDIMS] = {
    /* mt2 */
    {{64, 2, 2, 1, 2, 0},
     {64, 2, 2, 1, 2, 0},
     {64, 2, 2, 0, 2, 0},
     {64, 2, 2, 0, 2, 0},
     {64, 2, 1, 0, 1, 0},
     {64, 2, 1, 0, 1, 0},
     {64, 2, 1, 0, 1, 0}},
    /* base */
    {{64, 2, 1, 1, 2, 0},
     {64, 2, 1, 1, 2, 0},
     {64, 2, 1, 1, 1, 0},
     {64, 2, 1, 1, 1, 0},
     {32, 2, 1, 1, 1, 0},
     {32, 2, 1, 1, 1, 0},
     {32, 2, 1, 0, 1, 0}},
    /* lean */
    {{64, 2, 2, 1, 2, 1},
     {64, 2, 2, 1, 2, 1},
     {64, 2, 2, 0, 2, 1},
     {64, 2, 2, 0, 2, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1}},
    /* lean3 */
    {{64, 3, 2, 1, 2, 1},
     {64, 3, 2, 1, 2, 1},
     {64, 2, 2, 0, 2, 1},
     {64, 2, 2, 0, 2, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1}},
    /* lean3u */
    {{64, 3, 2, 1, 2, 1},
     {64, 3, 2, 1, 2, 1},
     {32, 2, 2, 0, 2, 1},
     {32, 2, 2, 0, 2, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1},
     {64, 2, 1, 0, 1, 1}},
};
static const char *const fc_mma_fwd_config_names[FC_MMA_NCONFIGS] = {"mt2", "base", "lean", "lean3", "lean3u"};

static size_t fc_mma_fwd_smem(const fc_mma_fwd_shape *s, int d) {
  return (size_t)(FC_MMA_BR + 2 * s->stages * s->bc) * fc_tile_stride(d) * sizeof(uint16_t);
}

/* The configuration FLASHC_MMA_FWD_CONFIG names (read at every call, so that a
 * benchmark can switch); unset, lean3 for a call with a causal mask or a
 * window and lean3u for one without. */
static flashc_status fc_mma_fwd_config(const fc_problem *p, int *config) {
  const int masked = p->window_left >= 0 || p->window_right >= 0;
  return fc_env_choice("FLASHC_MMA_FWD_CONFIG", fc_mma_fwd_config_names, FC_MMA_NCONFIGS,
                       masked ? FC_MMA_FWD_DEFAULT : FC_MMA_FWD_DEFAULT_UNMASKED, "flashc_forward (cuda-mma)", config);
}

/* Which row of the table runs head dim d (index i of fc_mma_dims): the
 * configuration's, or base's where the configuration's shared memory exceeds
 * what this device gives a block; fails when base's does too. */
static flashc_status fc_mma_fwd_pick(const char *op, int config, int i, int *row) {
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  const int d = fc_mma_dims[i];
  *row = fc_mma_fwd_smem(&fc_mma_fwd_configs[config][i], d) <= props.smem_per_block_optin ? config : FC_MMA_FWD_BASE;
  const size_t bytes = fc_mma_fwd_smem(&fc_mma_fwd_configs[*row][i], d);
  if (bytes > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: head_dim %d on backend cuda-mma needs %zu bytes of "
                    "shared memory per block; device %d "
                    "(sm_%d) allows %zu",
                    op, d, bytes, props.device, props.sm, props.smem_per_block_optin);
  return FLASHC_OK;
}

/* ---- launch
 * --------------------------------------------------------------------------------------------
 */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS, bool LEAN>
static flashc_status fc_mma_fwd_launch(const fc_problem *p, const fc_mma_fwd_args *a0, int grid) {
  fc_mma_fwd_args a_tail = *a0, *const a = &a_tail;
  const size_t smem = (size_t)(FC_MMA_BR + 2 * STAGES * BC) * fc_tile_stride(D) * sizeof(uint16_t);
  /* Rows that cp.async cannot copy (not 16-byte aligned) take the slower kernel
   * with plain loads. */
  void (*kernel)(const fc_mma_fwd_args);
  if constexpr (LEAN)
    kernel = a->n_splits > 1 ? fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true, true>
             : a->aligned    ? fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true>
                             : fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, false>;
  else
    kernel = a->aligned ? fc_mma_fwd_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true>
                        : fc_mma_fwd_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, false>;
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward: backend cuda-mma"));
  a_tail.n_pairs = (int)(p->batch * p->heads_q); /* fits: fc_mma_grid refused a grid past 2^31 − 1 CTAs */
  FC_CHECK(fc_tail_from(p, a->m_blocks, a_tail.n_pairs, (const void *)kernel, FC_MMA_BR / MT * 2, smem,
                        &a_tail.tail_from)); /* the grid's order (tail_order.cuh) */
  kernel<<<dim3(grid, a->n_splits), FC_MMA_BR / MT * 2, smem, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_mma_fwd_kernel");
  if (a->n_splits > 1) { /* the parts of each row merged (mma_fwd_split.cuh) */
    fc_mma_fwd_combine_kernel<T, D><<<grid, FC_SPLIT_COMBINE_THREADS, 0, fc_stream(p)>>>(*a);
    FC_LAUNCH_CHECK("fc_mma_fwd_combine_kernel");
  }
  return FLASHC_OK;
}

/* Row C, head dim index I of the table, as template arguments. */
template <typename T, int C, int I>
static flashc_status fc_mma_fwd_launch_at(const fc_problem *p, const fc_mma_fwd_args *a, int grid) {
  constexpr fc_mma_fwd_shape s = fc_mma_fwd_configs[C][I];
  return fc_mma_fwd_launch<T, fc_mma_dims[I], s.bc, s.stages, s.mt, s.q_in_regs != 0, s.min_blocks, s.lean != 0>(p, a,
                                                                                                                 grid);
}

/* The kernel of row `config`, head dim index `i`: a compile-time walk over the
 * table, so that adding a row or a head dim needs no new case. */
template <typename T, int C, int I>
static flashc_status fc_mma_fwd_dispatch(const fc_problem *p, const fc_mma_fwd_args *a, int grid, int config, int i) {
  if constexpr (C < FC_MMA_NCONFIGS) {
    if constexpr (I < FC_MMA_NDIMS) {
      if (config == C && i == I) return fc_mma_fwd_launch_at<T, C, I>(p, a, grid);
      return fc_mma_fwd_dispatch<T, C, I + 1>(p, a, grid, config, i);
    } else {
      return fc_mma_fwd_dispatch<T, C + 1, 0>(p, a, grid, config, i);
    }
  } else {
    return fc_error(FLASHC_ERR_INTERNAL,
                    "flashc_forward: cuda-mma has no kernel for configuration "
                    "%d, head dim %d",
                    config, i < 0 || i >= FC_MMA_NDIMS ? -1 : fc_mma_dims[i]);
  }
}

static int fc_mma_dim_index(int64_t head_dim) {
  const int d = fc_mma_compiled_dim(head_dim);
  for (int i = 0; i < FC_MMA_NDIMS; i++)
    if (fc_mma_dims[i] == d) return i;
  return -1;
}

static flashc_status mma_supports(const fc_problem *p) {
  const int i = fc_mma_dim_index(p->head_dim);
  if (i < 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds 256 on backend cuda-mma", (long long)p->head_dim);
  if (p->heads_q > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_q %lld exceeds 2^31-1 on backend cuda-mma", (long long)p->heads_q);
  if (!p->is_backward) { /* the backward's shared memory is mma_bwd.cu's to
                            check */
    int config = 0, row = 0;
    FC_CHECK(fc_mma_fwd_config(p, &config));
    FC_CHECK(fc_mma_fwd_pick("flashc_forward", config, i, &row));
  }
  int grid = 0;
  return fc_mma_grid("cuda-mma", fc_cdiv(p->seqlen_q, FC_MMA_BR), p->heads_q, p->batch, &grid);
}

/* How many parts the keys of each tile are split into (mma_fwd_split.cuh): 1 unless the grid of `ctas` tiles fills
 * less than half of the GPU's slots for them (CTAs per SM × SMs), then enough parts to fill it, at least 4 key
 * blocks each, at most FC_SPLIT_MAX (FlashAttention-2's split-KV rule of thumb; decoding shapes are the case). Only
 * the lean kernel on aligned rows splits. FLASHC_MMA_FWD_SPLITS: auto (unset) or a count, for tests and
 * comparisons. */
static flashc_status fc_mma_fwd_split_count(const fc_problem *p, int ctas, const fc_mma_fwd_shape *s, int *splits) {
  static const char *const names[] = {"auto", "1", "2", "3", "4", "5", "8", "16", "64"};
  static const int counts[] = {0, 1, 2, 3, 4, 5, 8, 16, 64};
  int pick = 0;
  FC_CHECK(fc_env_choice("FLASHC_MMA_FWD_SPLITS", names, (int)(sizeof names / sizeof names[0]), 0,
                         "flashc_forward (cuda-mma)", &pick));
  *splits = 1;
  const bool aligned = fc_mma_view_aligned(&p->q) && fc_mma_view_aligned(&p->k) && fc_mma_view_aligned(&p->v) &&
                       fc_mma_view_aligned(&p->o); /* the split kernel is the aligned one's */
  if (!s->lean || !aligned || p->seqlen_k <= 0 || ctas < 1) return FLASHC_OK;
  const int64_t key_blocks = fc_cdiv(p->seqlen_k, s->bc); /* varlen: the longest sequence's */
  if (pick > 0) {
    *splits = (int)(key_blocks < counts[pick] ? (key_blocks > 0 ? key_blocks : 1) : counts[pick]);
    return FLASHC_OK;
  }
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  const int64_t slots = (int64_t)props.num_sms * s->min_blocks;
  if (2 * (int64_t)ctas > slots) return FLASHC_OK;
  int64_t n = (slots + ctas - 1) / ctas;
  if (n > key_blocks / 4) n = key_blocks / 4;
  if (n > FC_SPLIT_MAX) n = FC_SPLIT_MAX;
  *splits = n >= 2 ? (int)n : 1;
  return FLASHC_OK;
}

/* What a forward call runs: the head dim's index i in the table, its row, the grid of query tiles and the parts
 * the keys are split into. */
static flashc_status fc_mma_fwd_plan(const fc_problem *p, int *i, int *row, int *grid, int *splits) {
  const int m_blocks = (int)fc_cdiv(p->seqlen_q, FC_MMA_BR);
  FC_CHECK(fc_mma_grid("flashc_forward", m_blocks, p->heads_q, p->batch, grid));
  *i = fc_mma_dim_index(p->head_dim);
  if (*i < 0)
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_forward: cuda-mma has no kernel for head_dim %lld",
                    (long long)p->head_dim);
  int config = 0;
  FC_CHECK(fc_mma_fwd_config(p, &config));
  FC_CHECK(fc_mma_fwd_pick("flashc_forward", config, *i, row));
  return fc_mma_fwd_split_count(p, *grid, &fc_mma_fwd_configs[*row][*i], splits);
}

flashc_status fc_mma_fwd_splits(const fc_problem *p, int *splits) {
  int i = 0, row = 0, grid = 0;
  return fc_mma_fwd_plan(p, &i, &row, &grid, splits);
}

static flashc_status mma_forward(const fc_problem *p) {
  int i = 0, row = 0, grid = 0, splits = 1;
  FC_CHECK(fc_mma_fwd_plan(p, &i, &row, &grid, &splits));
  /* The parts' O (D floats a row) and lse, FC_MMA_BR rows per CTA of the split grid, after the varlen offsets. */
  const size_t split_rows = (size_t)splits * grid * FC_MMA_BR, cu_bytes = fc_mma_cu_seqlens_bytes(p);
  const size_t split_bytes = splits > 1 ? split_rows * (fc_mma_dims[i] + 1) * sizeof(float) : 0;
  void *ws = NULL;
  FC_CHECK(fc_device_workspace(p, cu_bytes + split_bytes, &ws));
  fc_mma_fwd_args a;
  memset(&a, 0, sizeof a);
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, &a.cu_q, &a.cu_k));
  a.n_splits = splits;
  if (splits > 1) {
    a.split_o = (float *)((uint8_t *)ws + cu_bytes);
    a.split_lse = a.split_o + split_rows * fc_mma_dims[i];
  }
  a.q = (const uint16_t *)p->q.data;
  a.k = (const uint16_t *)p->k.data;
  a.v = (const uint16_t *)p->v.data;
  a.o = (uint16_t *)p->o.data;
  a.lse = p->lse;
  a.q_sb = p->q.stride_b, a.q_ss = p->q.stride_s, a.q_sh = p->q.stride_h;
  a.k_sb = p->k.stride_b, a.k_ss = p->k.stride_s, a.k_sh = p->k.stride_h;
  a.v_sb = p->v.stride_b, a.v_ss = p->v.stride_s, a.v_sh = p->v.stride_h;
  a.o_sb = p->o.stride_b, a.o_ss = p->o.stride_s, a.o_sh = p->o.stride_h;
  a.seqlen_q = (int)p->seqlen_q;
  a.seqlen_k = (int)p->seqlen_k;
  a.total_q = p->total_q;
  a.heads_q = (int)p->heads_q;
  a.group = (int)(p->heads_q / p->heads_kv);
  a.head_dim = (int)p->head_dim;
  a.m_blocks = (int)fc_cdiv(p->seqlen_q, FC_MMA_BR);
  a.scale = fabsf(p->scale);
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.negate_q = p->scale < 0.0f;
  a.window_left = p->window_left;
  a.window_right = p->window_right;
  a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  a.aligned = fc_mma_view_aligned(&p->q) && fc_mma_view_aligned(&p->k) && fc_mma_view_aligned(&p->v) &&
              fc_mma_view_aligned(&p->o);
  if (p->dtype == FLASHC_F16) return fc_mma_fwd_dispatch<__half, 0, 0>(p, &a, grid, row, i);
  return fc_mma_fwd_dispatch<__nv_bfloat16, 0, 0>(p, &a, grid, row, i);
}

flashc_status fc_mma_backward(const fc_problem *p); /* mma_bwd.cu */

static bool mma_usable(char *why, size_t len) { return fc_cuda_usable_sm(80, why, len); }

extern "C" const fc_backend fc_backend_cuda_mma = {
    "cuda-mma",
    "FlashAttention-2 on tensor cores: mma.sync, ldmatrix, cp.async pipeline, "
    "swizzled shared memory (sm_80+)",
    FLASHC_DEVICE_CUDA,
    (1u << FLASHC_F16) | (1u << FLASHC_BF16),
    1,
    256,
    mma_usable,
    mma_supports,
    mma_forward,
    fc_mma_backward,
    0,    /* features: the plain call only (validate.c refuses the others) */
    0,    /* max_head_dim_v */
    NULL, /* forward_kvcache */
};
