/* mma/fwd.cu — cuda-mma forward: FlashAttention-2 on tensor cores through mma.sync
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
 * {64, 96, 128, 192, 256}; any other d runs in the next D with zero
 * columns. v and o may have a head dim of their own, compiled as DV (the pairs of fc_mma_fwd_dv_pairs).
 *
 * Shared memory (16-bit elements, rows of DS = round_up(D, 64), XOR-swizzled:
 * see mma/tile.cuh): sQ [Br][DS]          Q_i; at the end each warp stages its
 * O rows here sK [STAGES][Bc][DS]  K_j ring buffer, filled by cp.async STAGES −
 * 1 blocks ahead sV [STAGES][Bc][DS]  V_j likewise. Per thread (lane = 4g + t), per M-tile: rows g and g + 8 of the
 * tile, O (D/8 × 4 fp32), S (Bc/8 × 4 fp32), m and l of its two rows; Q (D/16 ×
 * 4 registers) when Q_IN_REGS.
 *
 * Two kernels, one loop: mma/fwd_kernel.cuh's (every call whose shape fits the device's shared memory, the keys
 * split between CTAs where the grid is small: mma/fwd_split.cuh) and this file's, with smaller tiles for devices
 * that give a block less shared memory (sm_80 at d256, sm_86/89 at d192). fc_mma_fwd_plan_of picks the
 * kernel, its tile shape (one table, fc_mma_fwd_shapes) and the split; tools/mma/bench-fwd.sh checks and times
 * it. */
#include "common/common.cuh"
#include "mma/fwd_common.cuh"
#include "mma/fwd_kernel.cuh"
#include "mma/host.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Whether the image built for code_sm holds the SMALL kernels (fc_mma_fwd_shapes): sm_90's 227 KB per block fits the
 * lean shapes at every head dim, so its image has none (common/common.cuh, FC_KERNEL_IN_IMAGE). */
static constexpr bool fc_mma_fwd_small_in_image(int code_sm) { return code_sm / 10 != 9; }

/* MT M-tiles of 16 rows per warp, FC_MMA_BR / (16·MT) warps. The kernel for the SMALL shapes (fc_mma_fwd_shapes);
 * mma/fwd_kernel.cuh's is the same loop with less overhead per key block. */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS>
__global__ void __launch_bounds__(FC_MMA_BR / MT * 2, MIN_BLOCKS) fc_mma_fwd_kernel(const fc_mma_fwd_args a) {
  FC_KERNEL_IN_IMAGE(fc_mma_fwd_small_in_image(FC_CODE_SM))
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
  const int sq = w.sq, sk = w.sk, i0 = w.mb * BR;
  if (i0 >= sq) return;
  const uint16_t *Q, *K, *V; /* row 0 of this sequence */
  int64_t shift;
  int i_last, j_begin, j_end; /* the key blocks visible to some row of this block: [j_begin, j_end) */
  fc_fwd_block<BR, BC>(a, w, i0, &Q, &K, &V, &shift, &i_last, &j_begin, &j_end);
  /* Whether key block j needs the mask: only blocks that cut through the key
   * tail or some row's window. */
  auto needs_mask = [&](int j) {
    const int k0 = j * BC;
    return !(k0 + BC <= sk && (a.window_right < 0 || k0 + BC - 1 <= i0 + shift + a.window_right) &&
             (a.window_left < 0 || k0 >= i_last + shift - a.window_left));
  };
  auto load_kv = [&](int j, int stage) { fc_fwd_load_kv<BC, D, NT>(sK, sV, K, V, a, sk, tid, j, stage); };
  fc_fwd_prologue<BR, BC, D, NT, STAGES>(sQ, sK, sV, Q, K, V, a, i0, sq, sk, j_begin, j_end, tid);
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
      if (jp < j_end) load_kv(jp, sp);
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
    uint32_t pa[MT][NS / 2][4], pk[MT][4];
    fc_fwd_pv<T, MT, NS>(s, pa, pk, [&](int kb) { fc_fwd_pv_step<T, DS, D, MT, NO>(o, pk, kb, Vj, v_lane); });
  }

  fc_fwd_finish<T, D, MT>(a, w, i0, wrow, o, m, l, sQ, lane);
}

/* ---- the plan ------------------------------------------------------------------------------------------ */
/* Tile shape of one compiled head dim: Bc keys per block, stages of the K/V ring, M-tiles per warp
 * (FC_MMA_BR / (16·MT) warps), Q in registers for the whole key loop, CTAs per SM to aim for (the register
 * budget: 65536 / (MIN_BLOCKS · threads), at most 255). bc = 0: no kernel. */
typedef struct fc_mma_fwd_shape {
  int bc, stages, mt, q_in_regs, min_blocks;
} fc_mma_fwd_shape;

/* The kernels: mma/fwd_kernel.cuh's, with the shapes of the call's mask, or this file's with the smaller shapes
 * where the device gives a block too little shared memory for the lean ones (fc_mma_fwd_plan_of). */
enum fc_mma_fwd_row { FC_MMA_FWD_MASKED, FC_MMA_FWD_UNMASKED, FC_MMA_FWD_SMALL, FC_MMA_FWD_NROWS };

/* Shapes by head dim 64 … 256. Measured on the H100 against SDPA flash (tools/mma/bench-fwd.sh; bench/results/
 * configs/), the losers' code in docs/experiments.md:
 *   d ≤ 128: 4 warps × 32 rows (MT = 2: each K_j/V_j fragment feeds two M-tiles, half the ldmatrix per MMA) at 2
 *            CTAs/SM, whose barriers are independent (one CTA's softmax runs beside the other's MMAs); 8 warps ×
 *            16 rows (the first shape, `base`) read d64 0.94× and d128 0.85× flash where this read 1.05× and
 *            0.93× (mma-fwd-configs.csv, a4e082a).
 *   d ≤ 64:  3 K/V stages (2 CTAs of 74 KB fit an SM; from d 96 they would not), so that block j + 1's copies may
 *            still be in flight while block j computes; 2 stages: −0..3 % unmasked, −0..1 % causal
 *            (mma-fwd-limits-2026-11-24.txt, E).
 *   d 96/128 unmasked: Bc = 32 (S in half the registers: the key loop reloads no spilled values, where Bc = 64
 *            reloads 11–16 per block; 2 stages, so that 2 CTAs of 70 KB fit an A100's SM); Bc = 64: −1..−8 %
 *            unmasked, but +1..3 % causal at 2k–8k, hence the row by mask (mma-fwd-limits-2026-11-24.txt, H, H').
 *   d ≥ 192: Bc = 64, 8 warps × 16 rows (half the barriers and softmax passes per key; 192 KB at d 256): d256
 *            0.92× flash where Bc = 32 read 0.82× (mma-fwd-configs.csv).
 *   SMALL:   8 warps × 16 rows, Bc = 32, where the lean shape's shared memory (144 KB at d192, 192 KB at
 *            d256) exceeds what the device gives a block: sm_86/89 (99 KB) at d192, sm_80 (163 KB) at d256.
 *            At d ≤ 128 the lean shapes fit every sm_80+ device (96 KB at most): no kernel there. */
static constexpr fc_mma_fwd_shape fc_mma_fwd_shapes[FC_MMA_FWD_NROWS][FC_MMA_NDIMS] = {
    /* MASKED: a causal mask or a window */
    {{64, 3, 2, 1, 2},
     {64, 2, 2, 0, 2},
     {64, 2, 2, 0, 2},
     {64, 2, 1, 0, 1},
     {64, 2, 1, 0, 1}},
    /* UNMASKED */
    {{64, 3, 2, 1, 2},
     {32, 2, 2, 0, 2},
     {32, 2, 2, 0, 2},
     {64, 2, 1, 0, 1},
     {64, 2, 1, 0, 1}},
    /* SMALL */
    {{0, 0, 0, 0, 0},
     {0, 0, 0, 0, 0},
     {0, 0, 0, 0, 0},
     {32, 2, 1, 1, 1},
     {32, 2, 1, 0, 1}},
};

/* V's head dim different from Q/K's (flashc_params.head_dim_v): the lean kernel compiled with DV, for the pairs of
 * compiled head dims below only (each pair is 4 kernels: 2 dtypes × whole keys, split keys), without SCORE_MOD
 * and without a SMALL shape. Head dims that round up to a pair's (fc_mma_compiled_dim) run there with zero columns.
 *   192/128 (DeepSeek-V2/V3's MLA): d192's shape; 128 KB of shared memory (Q 48, K 48, V 32): sm_80 and sm_90, not
 *           sm_86/89 (99 KB), which refuse it.
 *   128/64, 64/128: d128's masked shape (Bc = 64, 2 stages, MT = 2, Q in shared memory, 2 CTAs/SM): O and S take
 *           at most d128's registers; 80 KB and 64 KB, every sm_80+ device. Not measured against other shapes. */
typedef struct fc_mma_fwd_dv_pair {
  int d, dv; /* compiled head dims of Q/K and of V */
  fc_mma_fwd_shape s;
} fc_mma_fwd_dv_pair;
enum { FC_MMA_DV_NPAIRS = 3 };
static constexpr fc_mma_fwd_dv_pair fc_mma_fwd_dv_pairs[FC_MMA_DV_NPAIRS] = {
    {192, 128, {64, 2, 1, 0, 1}},
    {128, 64, {64, 2, 2, 0, 2}},
    {64, 128, {64, 2, 2, 0, 2}},
};

/* Shared memory of a shape: Q_i [Br][DS], K [stages][Bc][DS], V [stages][Bc][DSV]. */
static size_t fc_mma_fwd_smem(const fc_mma_fwd_shape *s, int d, int dv) {
  return (size_t)(FC_MMA_BR * fc_tile_stride(d) + s->stages * s->bc * (fc_tile_stride(d) + fc_tile_stride(dv))) *
         sizeof(uint16_t);
}

/* The pair (fc_mma_fwd_dv_pairs) of a call whose head_dim_v differs from head_dim; -1 with fc_error's message when
 * cuda-mma has none, or when the call also asks for softcap, ALiBi, dropout or attn_mask (built for DV = D only). */
static int fc_mma_dv_pair(const fc_problem *p, const char *op) {
  const int d = fc_mma_compiled_dim(p->head_dim), dv = fc_mma_compiled_dim(p->head_dim_v);
  int pair = -1;
  for (int i = 0; i < FC_MMA_DV_NPAIRS; i++)
    if (fc_mma_fwd_dv_pairs[i].d == d && fc_mma_fwd_dv_pairs[i].dv == dv) pair = i;
  if (pair < 0) {
    fc_error(FLASHC_ERR_UNSUPPORTED,
             "%s: head_dim_v %lld with head_dim %lld is not supported on backend cuda-mma (its pairs: head_dim "
             "129..192 with head_dim_v 97..128, head_dim 97..128 with head_dim_v 1..64, head_dim 1..64 with "
             "head_dim_v 97..128)",
             op, (long long)p->head_dim_v, (long long)p->head_dim);
    return -1;
  }
  if (p->softcap > 0.0f || p->alibi_slopes != NULL || p->dropout_p > 0.0f || p->attn_mask != NULL) {
    fc_error(FLASHC_ERR_UNSUPPORTED,
             "%s: head_dim_v %lld (with head_dim %lld) together with softcap, ALiBi, dropout or attn_mask is not "
             "supported on backend cuda-mma",
             op, (long long)p->head_dim_v, (long long)p->head_dim);
    return -1;
  }
  return pair;
}

static int fc_mma_dim_index(int64_t head_dim) {
  const int d = fc_mma_compiled_dim(head_dim);
  for (int i = 0; i < FC_MMA_NDIMS; i++)
    if (fc_mma_dims[i] == d) return i;
  return -1;
}

/* What a forward call runs. */
typedef struct fc_mma_fwd_plan {
  int dim;    /* index of the compiled head dim in fc_mma_dims */
  int pair;   /* head_dim_v ≠ head_dim: index in fc_mma_fwd_dv_pairs (row is then unused); else -1 */
  int row;    /* FC_MMA_FWD_*: the kernel and its shape */
  int grid;   /* query tiles: CTAs per part */
  int splits; /* parts the keys of each tile are split into, one CTA each (mma/fwd_split.cuh); 1: none */
} fc_mma_fwd_plan;

static flashc_status fc_mma_fwd_plan_of(const fc_problem *p, fc_mma_fwd_plan *pl) {
  pl->dim = fc_mma_dim_index(p->head_dim);
  if (pl->dim < 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds 256 on backend cuda-mma", (long long)p->head_dim);
  FC_CHECK(fc_mma_grid("flashc_forward", fc_cdiv(p->seqlen_q, FC_MMA_BR), p->heads_q, p->batch, &pl->grid));
  const int d = fc_mma_dims[pl->dim];
  pl->pair = -1;
  if (p->head_dim_v != p->head_dim && (pl->pair = fc_mma_dv_pair(p, "flashc_forward")) < 0)
    return FLASHC_ERR_UNSUPPORTED;
  const int dv = pl->pair >= 0 ? fc_mma_fwd_dv_pairs[pl->pair].dv : d;
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  /* mma/fwd_kernel.cuh's kernel (fewer instructions per key block), its shapes by the call's mask; this file's kernel
   * with the same shapes (`mt2`) read d128 0.88–0.95× flash where lean read 0.93–1.06×, d256 0.79–1.06× (0.84–1.15×)
   * (configs/mma-fwd-lean.txt). Where the device's shared memory is too small for them: SMALL. */
  /* Softcap, ALiBi, dropout and attn_mask: the lean kernel only (SCORE_MOD, mma/score_mod.cuh); the SMALL kernel has
   * none. */
  const bool mod = p->softcap > 0.0f || p->alibi_slopes != NULL || p->dropout_p > 0.0f || p->attn_mask != NULL;
  /* The SCORE_MOD kernels run the masked row's shapes with or without a mask (its own unmasked shapes at d96/d128
   * would be 16 more kernels per image) */
  pl->row = p->window_left >= 0 || p->window_right >= 0 || mod ? FC_MMA_FWD_MASKED : FC_MMA_FWD_UNMASKED;
  if (pl->pair < 0 && fc_mma_fwd_smem(&fc_mma_fwd_shapes[pl->row][pl->dim], d, d) > props.smem_per_block_optin &&
      fc_mma_fwd_shapes[FC_MMA_FWD_SMALL][pl->dim].bc > 0 && fc_mma_fwd_small_in_image(props.code_sm) && !mod)
    pl->row = FC_MMA_FWD_SMALL;
  const fc_mma_fwd_shape *s = pl->pair >= 0 ? &fc_mma_fwd_dv_pairs[pl->pair].s : &fc_mma_fwd_shapes[pl->row][pl->dim];
  const size_t bytes = fc_mma_fwd_smem(s, d, dv);
  if (bytes > props.smem_per_block_optin && pl->pair >= 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_forward: head_dim %d with head_dim_v %d on backend cuda-mma needs %zu bytes of shared "
                    "memory per block; device %d (sm_%d) allows %zu",
                    d, dv, bytes, props.device, props.sm, props.smem_per_block_optin);
  if (bytes > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_forward: head_dim %d on backend cuda-mma needs %zu bytes of shared memory per block%s; "
                    "device %d (sm_%d) allows %zu",
                    d, bytes, mod ? " (with softcap, ALiBi, dropout or attn_mask)" : "", props.device, props.sm,
                    props.smem_per_block_optin);
  /* The split keys: the lean kernel only. params.num_splits 1: none; n > 1: n parts, at most one
   * per key block and FC_SPLIT_MAX; 0: split only a grid that fills less than half of the GPU's slots for its CTAs
   * (CTAs per SM × SMs), then enough parts to fill them, at least 4 key blocks each, at most FC_SPLIT_MAX
   * (FlashAttention-2's split-KV rule; decoding is the case): on the H100 2–4× the one-pass kernel at 1 query row
   * against 4k–128k keys (bench/results/decode.csv). */
  pl->splits = 1;
  if (pl->row == FC_MMA_FWD_SMALL || p->seqlen_k <= 0 || pl->grid < 1 || p->num_splits == 1) return FLASHC_OK;
  const int64_t key_blocks = fc_cdiv(p->seqlen_k, s->bc); /* varlen: the longest sequence's */
  int64_t n = p->num_splits;
  if (n <= 0) {
    const int64_t slots = (int64_t)props.num_sms * s->min_blocks;
    if (2 * (int64_t)pl->grid > slots) return FLASHC_OK;
    n = (slots + pl->grid - 1) / pl->grid;
    if (n > key_blocks / 4) n = key_blocks / 4;
  }
  if (n > key_blocks) n = key_blocks;
  if (n > FC_SPLIT_MAX) n = FC_SPLIT_MAX;
  pl->splits = n >= 2 ? (int)n : 1;
  return FLASHC_OK;
}

flashc_status fc_mma_fwd_splits(const fc_problem *p, int *splits) {
  fc_mma_fwd_plan pl;
  *splits = 1;
  FC_CHECK(fc_mma_fwd_plan_of(p, &pl));
  *splits = pl.splits;
  return FLASHC_OK;
}

/* ---- launch -------------------------------------------------------------------------------------------- */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS, bool LEAN, bool SCORE_MOD,
          int DV = D>
static flashc_status fc_mma_fwd_launch(const fc_problem *p, const fc_mma_fwd_args *a0, int grid) {
  static_assert(DV == D || (LEAN && !SCORE_MOD), "V's own head dim: the lean kernel without SCORE_MOD only");
  fc_mma_fwd_args a_tail = *a0, *const a = &a_tail;
  const size_t smem = (size_t)(FC_MMA_BR * fc_tile_stride(D) + STAGES * BC * (fc_tile_stride(D) + fc_tile_stride(DV))) *
                      sizeof(uint16_t);
  void (*kernel)(const fc_mma_fwd_args);
  if constexpr (SCORE_MOD) /* the lean kernel only (fc_mma_fwd_plan_of) */
    kernel = a->n_splits > 1 ? fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true, true>
                             : fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, false, true>;
  else if constexpr (LEAN)
    kernel = a->n_splits > 1 ? fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true, false, DV>
                             : fc_mma_fwd_lean_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, false, false, DV>;
  else
    kernel = fc_mma_fwd_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS>;
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward: backend cuda-mma"));
  a_tail.n_pairs = (int)(p->batch * p->heads_q); /* fits: fc_mma_grid refused a grid past 2^31 − 1 CTAs */
  FC_CHECK(fc_tail_from(p, a->m_blocks, a_tail.n_pairs, (const void *)kernel, FC_MMA_BR / MT * 2, smem,
                        &a_tail.tail_from)); /* the grid's order (common/tail_order.cuh) */
  kernel<<<dim3(grid, a->n_splits), FC_MMA_BR / MT * 2, smem, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_mma_fwd_kernel");
  if (a->n_splits > 1) { /* the parts of each row merged (mma/fwd_split.cuh) */
    fc_mma_fwd_combine_kernel<T, DV><<<grid, FC_SPLIT_COMBINE_THREADS, 0, fc_stream(p)>>>(*a);
    FC_LAUNCH_CHECK("fc_mma_fwd_combine_kernel");
  }
  return FLASHC_OK;
}

/* The kernel of row R, head dim index I: a compile-time walk over the table, so that adding a head dim or
 * changing a shape needs no new case; a cell without a kernel (bc = 0) compiles nothing, nor SMALL with SCORE_MOD
 * (softcap, ALiBi: fc_mma_fwd_plan_of never picks it). */
template <typename T, bool SCORE_MOD, int R, int I>
static flashc_status fc_mma_fwd_dispatch(const fc_problem *p, const fc_mma_fwd_args *a, const fc_mma_fwd_plan *pl) {
  if constexpr (R < FC_MMA_FWD_NROWS) {
    if constexpr (I < FC_MMA_NDIMS) {
      constexpr fc_mma_fwd_shape s = fc_mma_fwd_shapes[R][I];
      if constexpr (s.bc > 0 && !(SCORE_MOD && R != FC_MMA_FWD_MASKED)) {
        if (pl->row == R && pl->dim == I)
          return fc_mma_fwd_launch<T, fc_mma_dims[I], s.bc, s.stages, s.mt, s.q_in_regs != 0, s.min_blocks,
                                   R != FC_MMA_FWD_SMALL, SCORE_MOD>(p, a, pl->grid);
      }
      return fc_mma_fwd_dispatch<T, SCORE_MOD, R, I + 1>(p, a, pl);
    } else {
      return fc_mma_fwd_dispatch<T, SCORE_MOD, R + 1, 0>(p, a, pl);
    }
  } else {
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_forward: cuda-mma has no kernel for row %d, head dim %d", pl->row,
                    pl->dim < 0 || pl->dim >= FC_MMA_NDIMS ? -1 : fc_mma_dims[pl->dim]);
  }
}

/* The kernel of pair I of fc_mma_fwd_dv_pairs (V's head dim ≠ Q/K's), as the walk above. */
template <typename T, int I = 0>
static flashc_status fc_mma_fwd_dv_dispatch(const fc_problem *p, const fc_mma_fwd_args *a, const fc_mma_fwd_plan *pl) {
  if constexpr (I < FC_MMA_DV_NPAIRS) {
    constexpr fc_mma_fwd_dv_pair q = fc_mma_fwd_dv_pairs[I];
    if (pl->pair == I)
      return fc_mma_fwd_launch<T, q.d, q.s.bc, q.s.stages, q.s.mt, q.s.q_in_regs != 0, q.s.min_blocks, true, false,
                               q.dv>(p, a, pl->grid);
    return fc_mma_fwd_dv_dispatch<T, I + 1>(p, a, pl);
  } else {
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_forward: cuda-mma has no kernel for head_dim_v pair %d", pl->pair);
  }
}

static flashc_status mma_supports(const fc_problem *p) {
  if (fc_mma_dim_index(p->head_dim) < 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds 256 on backend cuda-mma", (long long)p->head_dim);
  /* V's own head dim: the forward's pairs for both directions (the backward runs them at max(head_dim, head_dim_v):
   * mma/bwd.cu), so that the calls a forward takes are those its backward takes */
  if (p->head_dim_v != p->head_dim && fc_mma_dv_pair(p, p->is_backward ? "flashc_backward" : "flashc_forward") < 0)
    return FLASHC_ERR_UNSUPPORTED;
  FC_CHECK(fc_score_mod_check(p, "cuda-mma"));
  if (p->heads_q > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_q %lld exceeds 2^31-1 on backend cuda-mma", (long long)p->heads_q);
  if (p->is_backward) {
    FC_CHECK(fc_mma_bwd_supports(p));
  } else {
    fc_mma_fwd_plan pl;
    FC_CHECK(fc_mma_fwd_plan_of(p, &pl));
  }
  int grid = 0;
  return fc_mma_grid("cuda-mma", fc_cdiv(p->seqlen_q, FC_MMA_BR), p->heads_q, p->batch, &grid);
}

static flashc_status mma_forward(const fc_problem *p) {
  fc_mma_fwd_plan pl;
  FC_CHECK(fc_mma_fwd_plan_of(p, &pl));
  const int splits = pl.splits, grid = pl.grid;
  const int d = pl.pair >= 0 ? fc_mma_fwd_dv_pairs[pl.pair].dv : fc_mma_dims[pl.dim]; /* O's compiled columns */
  /* The parts' O (d floats a row: V's head dim) and lse, FC_MMA_BR rows per CTA of the split grid, after the varlen
   * offsets. */
  const size_t split_rows = (size_t)splits * grid * FC_MMA_BR, cu_bytes = fc_mma_cu_seqlens_bytes(p);
  const size_t split_bytes = splits > 1 ? split_rows * (d + 1) * sizeof(float) : 0;
  /* A boolean attn_mask's tiles (common/mask_tiles.cuh) at the kernel's block, FC_MMA_BR rows × Bc keys: the SCORE_MOD
   * kernel is the lean one only, never SMALL (fc_mma_fwd_plan_of), so the plan's row gives Bc. */
  const int bc = pl.pair >= 0 ? fc_mma_fwd_dv_pairs[pl.pair].s.bc : fc_mma_fwd_shapes[pl.row][pl.dim].bc;
  const size_t tiles_at = (cu_bytes + split_bytes + 255) / 256 * 256;
  const size_t tiles_bytes = p->attn_mask && p->attn_mask_is_bool ? fc_mask_tiles_bytes(p, FC_MMA_BR, bc) : 0;
  /* q, k, v, o whose rows are not on 16 bytes: staged copies (mma/host.cuh), last */
  size_t stage_at = tiles_at + (tiles_bytes + 255) / 256 * 256;
  fc_mma_stage sq, sk, sv, so;
  fc_mma_stage_plan(p, &p->q, false, p->head_dim, &stage_at, &sq);
  fc_mma_stage_plan(p, &p->k, true, p->head_dim, &stage_at, &sk);
  fc_mma_stage_plan(p, &p->v, true, p->head_dim_v, &stage_at, &sv);
  fc_mma_stage_plan(p, &p->o, false, p->head_dim_v, &stage_at, &so);
  char *ws = NULL;
  FC_CHECK(fc_device_workspace(p, stage_at, (void **)&ws));
  FC_CHECK(fc_mma_stage_in(p, ws, &sq, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sk, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &sv, true));
  FC_CHECK(fc_mma_stage_in(p, ws, &so, p->cu_seqlens_device)); /* rows past a cut are left as they are */
  fc_mma_fwd_args a;
  memset(&a, 0, sizeof a);
  fc_mma_seqs seqs;
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, NULL, &seqs));
  a.cu_q = seqs.cu_q, a.cu_k = seqs.cu_k, a.end_q = seqs.end_q, a.end_k = seqs.end_k;
  a.n_splits = splits;
  if (splits > 1) {
    a.split_o = (float *)(ws + cu_bytes);
    a.split_lse = a.split_o + split_rows * d;
  }
  const fc_view *q = &sq.view, *k = &sk.view, *v = &sv.view, *o = &so.view;
  a.q = (const uint16_t *)q->data;
  a.k = (const uint16_t *)k->data;
  a.v = (const uint16_t *)v->data;
  a.o = (uint16_t *)o->data;
  a.lse = p->lse;
  a.q_sb = q->stride_b, a.q_ss = q->stride_s, a.q_sh = q->stride_h;
  a.k_sb = k->stride_b, a.k_ss = k->stride_s, a.k_sh = k->stride_h;
  a.v_sb = v->stride_b, a.v_ss = v->stride_s, a.v_sh = v->stride_h;
  a.o_sb = o->stride_b, a.o_ss = o->stride_s, a.o_sh = o->stride_h;
  a.seqlen_q = (int)p->seqlen_q;
  a.seqlen_k = (int)p->seqlen_k;
  a.total_q = p->total_q;
  a.heads_q = (int)p->heads_q;
  a.group = (int)(p->heads_q / p->heads_kv);
  a.head_dim = (int)p->head_dim;
  a.head_dim_v = (int)p->head_dim_v;
  a.m_blocks = (int)fc_cdiv(p->seqlen_q, FC_MMA_BR);
  a.scale = fabsf(p->scale);
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.negate_q = p->scale < 0.0f;
  a.window_left = p->window_left;
  a.window_right = p->window_right;
  a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  /* Softcap, ALiBi, dropout or attn_mask: the plan's kernel built with SCORE_MOD (mma/score_mod.cuh), which turns S
   * into the modified score x: the exponent's factor is log2 e alone and lse = m + ln l (scale 1). */
  if (fc_mma_score_mod_of(p, &a.mod)) {
    a.scale = 1.0f;
    a.scale_log2 = 1.4426950408889634f;
    if (tiles_bytes) FC_CHECK(fc_mask_tiles_build(p, FC_MMA_BR, bc, ws + tiles_at, &a.mod.tiles));
    if (p->dtype == FLASHC_F16)
      FC_CHECK((fc_mma_fwd_dispatch<__half, true, 0, 0>(p, &a, &pl)));
    else
      FC_CHECK((fc_mma_fwd_dispatch<__nv_bfloat16, true, 0, 0>(p, &a, &pl)));
  } else if (pl.pair >= 0) { /* V's own head dim (fc_mma_dv_pair has refused it with SCORE_MOD) */
    if (p->dtype == FLASHC_F16)
      FC_CHECK(fc_mma_fwd_dv_dispatch<__half>(p, &a, &pl));
    else
      FC_CHECK(fc_mma_fwd_dv_dispatch<__nv_bfloat16>(p, &a, &pl));
  } else if (p->dtype == FLASHC_F16) {
    FC_CHECK((fc_mma_fwd_dispatch<__half, false, 0, 0>(p, &a, &pl)));
  } else {
    FC_CHECK((fc_mma_fwd_dispatch<__nv_bfloat16, false, 0, 0>(p, &a, &pl)));
  }
  return fc_mma_stage_out(p, &so);
}

flashc_status fc_mma_backward(const fc_problem *p); /* mma/bwd.cu */

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
    FC_FEATURE_SOFTCAP | FC_FEATURE_ALIBI | FC_FEATURE_HEAD_DIM_V | FC_FEATURE_SEQUSED | FC_FEATURE_DROPOUT |
        FC_FEATURE_ATTN_MASK | FC_FEATURE_CU_SEQLENS_DEVICE, /* features; validate.c refuses the others */
    0,                       /* max_head_dim_v: max_head_dim; fc_mma_dv_pair refuses the pairs it has no kernel for */
    fc_cuda_forward_kvcache, /* forward_kvcache: mma/decode.cu */
};
