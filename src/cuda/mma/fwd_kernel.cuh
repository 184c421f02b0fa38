/* mma/fwd_kernel.cuh — cuda-mma's forward kernel (the one that runs wherever its tiles fit the device's shared
 * memory: mma/fwd.cu's fc_mma_fwd_plan_of): the maths and pipeline of mma/fwd.cu's fc_mma_fwd_kernel, with the
 * per-block overhead that kernel's SASS showed moved out of the key loop (docs/ladder.md, cuda-mma, has the counts):
 *   - Q_i is negated once in shared memory (a negative scale), not in every
 *     fragment read from sQ (4 LOP3 per ldmatrix of Q);
 *   - each ldmatrix operand keeps its 4 swizzle variants in registers, so that
 *     an address is one register plus an immediate (no XOR per ldmatrix);
 *   - a key block that is whole (all Bc rows present, head_dim = D) is copied
 *     by cp.async without the per-chunk predicates and zero-fill sizes;
 *   - the blocks that need no mask form one range [j_plain0, j_plain1),
 *     computed once: two compares per block instead of the 64-bit window
 *     tests; the mask itself compares each element's compile-time column
 *     with the row's range shifted once (fc_fwd_mask, REL). */
#ifndef FLASHC_CUDA_MMA_FWD_LEAN_CUH
#define FLASHC_CUDA_MMA_FWD_LEAN_CUH

#include "mma/fwd_common.cuh"
#include "mma/fwd_split.cuh"

/* floor(x / y) and ceil(x / y) for y > 0 and x of either sign. */
static __device__ __forceinline__ int64_t fc_floor_div(int64_t x, int64_t y) {
  return x >= 0 ? x / y : -((-x + y - 1) / y);
}
static __device__ __forceinline__ int64_t fc_ceil_div(int64_t x, int64_t y) { return -fc_floor_div(-x, y); }

/* The 4 swizzle variants of a lane's ldmatrix address into a tile at shared
 * address `tile` (a multiple of 128): x[i] = tile + (lane offset ^ 32i), so
 * that fc_fwd_addr(tile, off, row0, kk) = x[kk & 3] + 2·row0·DS + (kk >> 2)·128
 * (see fc_fwd_lane: the XOR touches bits 5–6 only, which adding multiples of
 * 128 leaves alone). The empty asm keeps the compiler from recomputing them in
 * the loop (that is the XOR per ldmatrix this saves). */
template <int DS>
static __device__ __forceinline__ void fc_lean_lane(uint32_t x[4], uint32_t tile, fc_frag_kind kind, int lane) {
  const uint32_t off = fc_fwd_lane<DS>(kind, lane);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    x[i] = tile + (off ^ ((uint32_t)i << 5));
    asm("" : "+r"(x[i]));
  }
}

/* S += Q_i·K_jᵀ over k-step kk, as fc_fwd_qk_step, from the address variants
 * qx (sQ at the warp's first row) and kj (K_j's stage). Q is already negated. */
template <typename T, int DS, int MT, int NS, int QKD, bool Q_IN_REGS>
static __device__ __forceinline__ void fc_lean_qk_step(float (*s)[NS][4], const uint32_t (*qf)[QKD][4], int kk,
                                                       const uint32_t qx[4], const uint32_t kj[4]) {
  fc_fwd_qk<T, MT, NS, QKD, Q_IN_REGS>(
      s, qf, kk, 0u, [&](int mt) { return qx[kk & 3] + (uint32_t)(2 * 16 * mt * DS + (kk >> 2) * 128); },
      [&](int p) { return kj[kk & 3] + (uint32_t)(2 * 16 * p * DS + (kk >> 2) * 128); });
}

/* O += P·V_j over k-step kb, as fc_fwd_pv_step, from V_j's address variants
 * vj. */
template <typename T, int DS, int D, int MT, int NO>
static __device__ __forceinline__ void fc_lean_pv_step(float (*o)[NO][4], const uint32_t (*pa)[4], int kb,
                                                       const uint32_t vj[4]) {
  fc_fwd_mma_pairs<T, MT, D / 16, true>(
      o, pa, [&](int dp) { return vj[dp & 3] + (uint32_t)(2 * 16 * kb * DS + (dp >> 2) * 128); });
}

/* The kernel: mma/fwd.cu's fc_mma_fwd_kernel (same template arguments, same
 * shared-memory layout and launch) with the changes listed at the top. SCORE_MOD: softcap and ALiBi
 * (mma/score_mod.cuh), S turned into the modified score before the mask; the host passes scale 1 and
 * scale_log2 = log2 e, so that the softmax and the end below are the plain kernel's. Dropout is a third run-time
 * branch of the same variant: P∘keep multiplies V, O gains 1/(1 − p) at the end; attn_mask a fourth: the bias added
 * to the modified score (or −inf where a boolean mask removes the key), in every block of a float bias; a boolean
 * mask's tiles (common/mask_tiles.cuh) narrow the key range and leave the mask unread in the blocks it keeps whole. A
 * row whose keys are all removed keeps m = −inf: O = 0, lse = −inf, as a row that sees no key.
 * DV: V's compiled head dim where it differs from Q/K's D (V_j's tile, P·V_j and O are DV columns wide; sV's rows
 * have stride fc_tile_stride(DV)); DV = D for every call whose V has Q's head dim. */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS, bool SPLIT = false,
          bool SCORE_MOD = false, int DV = D>
__global__ void __launch_bounds__(FC_MMA_BR / MT * 2, MIN_BLOCKS) fc_mma_fwd_lean_kernel(const fc_mma_fwd_args a) {
  constexpr int BR = FC_MMA_BR, NW = BR / (16 * MT), NT = NW * 32, DS = fc_tile_stride(D);
  constexpr int KD = D / 16; /* k-steps of Q·Kᵀ over the head dim */
  constexpr int NS = BC / 8; /* n-blocks of S */
  constexpr int NO = DV / 8; /* n-blocks of O */
  constexpr int QKD = Q_IN_REGS ? KD : 1;
  constexpr int CH = D / 8; /* 16-byte chunks of a row of Q */
  constexpr bool WALK = fc_walk_threads<D, NT>() > 0, WALK_V = fc_walk_threads<DV, NT>() > 0;
  constexpr int DSV = fc_tile_stride(DV);
  constexpr uint32_t TILE = BC * DS * 2;    /* bytes of one stage of K */
  constexpr uint32_t TILE_V = BC * DSV * 2; /* of V */
  static_assert(DV == D || BR * DSV <= BR * DS + STAGES * BC * (DS + DSV),
                "fc_fwd_finish stages O's Br rows at the start of shared memory");
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sQ = smem, *sK = sQ + BR * DS, *sV = sK + STAGES * BC * DS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wrow = warp * MT * 16; /* the warp's first row in the block */

  fc_fwd_where w = fc_fwd_locate(a);
  /* The varlen numbers, loaded from cu_seqlens, made uniform (fc_warp_same) where that frees vector registers: the
   * plain d128 key loop then spills 11 values, not 19, and runs 4 % faster (H200, b16 s1k to b1 s32k). Elsewhere it
   * cost: d96's loop gained spills (2-4 % slower), the score-mod kernels spill stores, the 64/128 pair's loop 93
   * instructions; the other dims' loops do not change. */
  constexpr bool UNIFORM_SEQ = D == 128 && DV == D && !SCORE_MOD;
  if (UNIFORM_SEQ && a.cu_q) {
    w.q_start = fc_warp_same64(w.q_start), w.k_start = fc_warp_same64(w.k_start);
    w.sq = fc_warp_same(w.sq), w.sk = fc_warp_same(w.sk);
  }
  const int64_t b = w.b;
  const int h = w.h, mb = w.mb, sq = w.sq, sk = w.sk, i0 = mb * BR;
  if (i0 >= sq) return;
  const uint16_t *Q, *K, *V;
  int64_t shift;
  int i_last, j_begin, j_end; /* the key blocks visible to some row of this block: [j_begin, j_end) */
  fc_fwd_block<BR, BC>(a, w, i0, &Q, &K, &V, &shift, &i_last, &j_begin, &j_end);
  /* SCORE_MOD with a boolean attn_mask's tiles (built at Br × Bc: mma/fwd.cu; the design: common/mask_tiles.cuh):
   * only the key blocks that keep some pair of this row block, taken before the split so that its parts divide what
   * is left. A range left empty runs no block: m stays −inf, so O = 0 and lse = −inf, as for rows that see no key
   * (a split's parts likewise, and their merge then gives the same). */
  if constexpr (SCORE_MOD) fc_mask_cut_row(a.mod.tiles, b, h, mb, &j_begin, &j_end);
  if constexpr (SPLIT) fc_fwd_split_range(a.n_splits, (int)blockIdx.y, &j_begin, &j_end); /* this CTA's part */
  /* Blocks that every row of the block sees whole, which need no mask: key
   * block j is such when (j + 1)·Bc <= min(sk, i0 + shift + window_right + 1)
   * (no key past the tail or right of the first row's window) and j·Bc >=
   * i_last + shift − window_left (none left of the last row's window): j in
   * [j_plain0, j_plain1), which may be empty. */
  int64_t key_end = sk;
  if (a.window_right >= 0) key_end = min(key_end, (int64_t)i0 + shift + a.window_right + 1);
  const int64_t plain1 = fc_floor_div(key_end, BC);
  const int64_t plain0 = a.window_left < 0 ? 0 : fc_ceil_div((int64_t)i_last + shift - a.window_left, BC);
  const int j_plain1 = (int)max((int64_t)j_begin, min(plain1, (int64_t)j_end));
  const int j_plain0 = (int)max((int64_t)j_begin, min(plain0, (int64_t)j_end));
  const bool whole_cols = a.head_dim == D;                 /* every chunk of a row of K present */
  const bool whole_cols_v = fc_fwd_v_cols<D, DV>(a) == DV; /* of V */
  /* SCORE_MOD: this (sequence, head)'s ALiBi slope, and each row's ALiBi distance to key 2t */
  [[maybe_unused]] float slope = 0.0f, dist0[SCORE_MOD ? MT : 1][2];
  if constexpr (SCORE_MOD) {
    slope = fc_score_mod_slope(a.mod, b, h);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) dist0[mt][rh] = (float)(i0 + wrow + 16 * mt + g + 8 * rh + sk - sq - 2 * t);
  }
  /* SCORE_MOD with attn_mask: this (sequence, head)'s plane of it */
  [[maybe_unused]] const void *bias_plane = nullptr;
  if constexpr (SCORE_MOD) {
    if (a.mod.bias) bias_plane = fc_bias_plane(a.mod, b, h);
  }
  auto load_kv = [&](int j, int stage) { fc_fwd_load_kv<BC, D, NT, DV>(sK, sV, K, V, a, sk, tid, j, stage); };
  fc_fwd_prologue<BR, BC, D, NT, STAGES, DV>(sQ, sK, sV, Q, K, V, a, i0, sq, sk, j_begin, j_end, tid);
  if (a.negate_q) {
    /* A negative scale: S = (−Q_i)·K_jᵀ with |scale|, the sign flipped once
     * here. */
    for (int idx = tid; idx < BR * CH; idx += NT) {
      uint4 *p = (uint4 *)(sQ + fc_tile_off<DS>(idx / CH, idx % CH));
      uint4 v = *p;
      v.x ^= 0x80008000u, v.y ^= 0x80008000u, v.z ^= 0x80008000u, v.w ^= 0x80008000u;
      *p = v;
    }
    __syncthreads(); /* Q_i is negated before any warp reads its fragments */
  }
  uint32_t qx[4], kx[4], vx[4];
  fc_lean_lane<DS>(qx, fc_smem_u32(sQ) + 2u * (uint32_t)(wrow * DS), FC_FRAG_A, lane);
  fc_lean_lane<DS>(kx, fc_smem_u32(sK), FC_FRAG_B, lane);
  fc_lean_lane<DSV>(vx, fc_smem_u32(sV), FC_FRAG_BT, lane);
  uint32_t qf[MT][QKD][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int kk = 0; kk < KD; kk++)
        fc_ldmatrix_x4(qf[mt][kk], qx[kk & 3] + (uint32_t)(2 * 16 * mt * DS + (kk >> 2) * 128));
  }

  float o[MT][NO][4];
  fc_fwd_zero<MT, NO>(o);
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  int stage = 0; /* K_j and V_j's stage of the ring: (j − j_begin) mod STAGES */
  for (int j = j_begin; j < j_end; j++) {
    fc_cp_async_wait<STAGES - 2>(); /* this thread's copies of block j have landed */
    /* Block j is visible to every warp, and every warp is done with block j −
     * 1, whose stage the prefetch below overwrites. */
    __syncthreads();
    {
      const int jp = j + STAGES - 1, sp = stage == 0 ? STAGES - 1 : stage - 1;
      if (jp < j_end) {
        bool whole = false;
        if constexpr (WALK && WALK_V) {
          whole = whole_cols && (DV == D || whole_cols_v) && jp * BC <= sk - BC;
          if (whole) {
            fc_lean_load_whole<BC, D, NT>(fc_smem_u32(sK) + sp * TILE, K + (int64_t)(jp * BC) * a.k_ss, a.k_ss, tid);
            fc_lean_load_whole<BC, DV, NT>(fc_smem_u32(sV) + sp * TILE_V, V + (int64_t)(jp * BC) * a.v_ss, a.v_ss, tid);
          }
        }
        if (!whole) load_kv(jp, sp);
      }
      fc_cp_async_commit();
    }
    uint32_t kj[4], vj[4];
#pragma unroll
    for (int i = 0; i < 4; i++) kj[i] = kx[i] + stage * TILE, vj[i] = vx[i] + stage * TILE_V;

    /* SCORE_MOD with dropout: this block's keep bits, before S exists (fc_mma_drop_bits) */
    [[maybe_unused]] uint32_t km[(MT * NS * 4 + 31) / 32];
    if constexpr (SCORE_MOD) {
      if (a.mod.drop_on)
        fc_mma_drop_bits<MT, NS>(km, a.mod, (uint64_t)(b * a.heads_q + h), i0 + wrow + g, sk, j * BC, t);
    }

    /* S = Q_i·K_jᵀ, raw dot products: the scale is folded into the exponent
     * below. */
    float s[MT][NS][4];
    fc_fwd_zero<MT, NS>(s);
#pragma unroll
    for (int kk = 0; kk < KD; kk++) fc_lean_qk_step<T, DS, MT, NS, QKD, Q_IN_REGS>(s, qf, kk, qx, kj);
    if constexpr (SCORE_MOD) {
      fc_mma_mod_scores<MT, NS>(s, a.mod, slope, dist0, j * BC);
      /* A boolean mask's tiles: block j's class, one for the whole CTA (its rows are one row of blocks). ALL reads no
       * mask element; SOME and NONE (a hole inside the range) read them. Read here, not held across the MMAs, and
       * NONE not skipped: a `continue` or a value live across S = Q·Kᵀ made ptxas spill twice as much at d96/d128. */
      if (a.mod.bias && (!a.mod.tiles.cls || fc_mask_tile(a.mod.tiles, b, h, mb, j) != FC_MT_ALL))
        fc_mma_bias_scores<T, MT, NS>(s, a.mod, bias_plane, i0 + wrow + g, sq, sk, j * BC, t);
    }
    if (j < j_plain0 || j >= j_plain1)
      fc_fwd_mask<MT, NS, true>(s, i0 + wrow, shift, a.window_left, a.window_right, sk, j * BC, g, t);

    /* m' = max(m, rowmax S); O, l rescaled; P = 2^(c·S − c·m'); l += rowsum
     * P. */
    fc_fwd_max_rescale<MT, NS, NO>(s, m, l, o, a.scale_log2);
    float base[MT][2];
    fc_fwd_bases<MT>(m, a.scale_log2, base);
    fc_fwd_exp<MT, NS>(s, l, base, a.scale_log2, 0, NS);
    /* SCORE_MOD with dropout: l has summed the whole P (lse does not change); P∘keep multiplies V. */
    if constexpr (SCORE_MOD) {
      if (a.mod.drop_on) fc_mma_drop_apply<MT, NS>(s, km, 1.0f);
    }

    /* O += P·V_j: P packed to 16 bits one k-step (16 keys) at a time. */
    uint32_t pa[MT][NS / 2][4], pk[MT][4];
    fc_fwd_pv<T, MT, NS>(s, pa, pk, [&](int kb) { fc_lean_pv_step<T, DSV, DV, MT, NO>(o, pk, kb, vj); });
    stage = stage == STAGES - 1 ? 0 : stage + 1;
  }

  /* Dropout: O = Σ P∘keep·V / (l·(1 − p)), the 1/(1 − p) here (flash.c's order). */
  if constexpr (SCORE_MOD) {
    if (a.mod.drop_on) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < NO; x++)
#pragma unroll
          for (int e = 0; e < 4; e++) o[mt][x][e] *= a.mod.drop_rp;
    }
  }

  /* A compile-time switch: the split's end, beside the other, made ptxas spill more in the d128 Bc = 64 loop. */
  if constexpr (SPLIT)
    fc_fwd_finish_split<DV, MT>(a, sq, i0, wrow, o, m, l, lane);
  else
    fc_fwd_finish<T, D, MT, DV>(a, w, i0, wrow, o, m, l, sQ, lane);
}

#endif /* FLASHC_CUDA_MMA_FWD_LEAN_CUH */
