/* mma/bwd_launch.cuh — cuda-mma backward's kernels, tiles and launches (mma/bwd.cu says what they compute), shared
 * by the files that instantiate them: mma/bwd.cu the plain kernels, mma/bwd_score_mod_f16.cu and _bf16.cu those with
 * softcap, ALiBi, dropout and attn_mask (SCORE_MOD), one dtype each, so that they compile side by side: together they
 * were the longest file of the build. */
#ifndef FLASHC_CUDA_MMA_BWD_LAUNCH_CUH
#define FLASHC_CUDA_MMA_BWD_LAUNCH_CUH

#include "common/common.cuh"
#include "common/gqa.cuh"
#include "mma/bwd_common.cuh"
#include "mma/bwd_kernel.cuh"
#include "mma/host.cuh"
#include "mma/tile.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- 1. prep: D = rowsum(dO∘O), lse2 = lse·log2(e) (and the blocked dQ sum zeroed): common/bwd_rows.cuh's,
 * shared with cuda-hopper ------------------------------------------------------------------------------------ */

/* ---- 2. dkdv ------------------------------------------------------------------------------------------- */
template <typename T, int D, int BR, int BC, int NW, int QSTAGES, bool ATOMIC_DQ>
__global__ void __launch_bounds__(NW * 32, 1) fc_mma_bwd_dkdv_kernel(const fc_mma_bwd_args a) {
  FC_KERNEL_IN_IMAGE(fc_mma_bwd_in_image(FC_CODE_SM, FC_MMA_BWD_BASE))
  constexpr int NT = NW * 32, DS = fc_tile_stride(D), PS = fc_tile_stride(BR);
  constexpr int KG = BC / 16, WN = NW / KG;     /* key groups; warps per key group */
  constexpr int SQ_N = BR / WN, NSX = SQ_N / 8; /* Sᵀ, dPᵀ: each warp 16 keys × SQ_N queries */
  constexpr int DV_N = D / WN, NDV = DV_N / 8;  /* dK, dV: each warp 16 keys × DV_N columns */
  constexpr int QG = BR / 16, WQ = NW / QG;     /* dQ: query groups; warps per query group */
  constexpr int DQ_N = D / WQ, NDQ = DQ_N / 8;  /* each warp 16 queries × DQ_N columns */
  static_assert(NW % KG == 0 && NW % QG == 0, "warps must tile the key and query groups");
  static_assert(SQ_N % 16 == 0 && DV_N % 16 == 0 && DQ_N % 16 == 0, "warp tiles are pairs of n-blocks");
  static_assert(QSTAGES * BR >= BC, "dK and dV are staged through the sQ and sdO buffers");
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sK = smem, *sV = sK + BC * DS, *sQ = sV + BC * DS, *sdO = sQ + QSTAGES * BR * DS;
  uint16_t *sP = sdO + QSTAGES * BR * DS, *sdS = sP + BC * PS;
  float *sL = (float *)(sdS + BC * PS), *sD = sL + QSTAGES * BR;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int kg = warp % KG, wn = warp / KG; /* Sᵀ and dK/dV role */
  const int qg = warp % QG, wq = warp / QG; /* dQ role */

  int jb, hk, h0, nh; /* the key block, its kv head part and the part's query heads (fc_bwd_kv_of_cta) */
  int64_t b;
  fc_bwd_kv_of_cta(a, &jb, &b, &hk, &h0, &nh);
  const fc_bwd_seq s = FC_BWD_SEQ(a, b);
  const int k0 = jb * BC;
  if (k0 >= s.sk) return;
  const int64_t shift = (a.bottom_right ? (int64_t)s.sk - s.sq : 0) + a.mask_offset;
  int i_begin, n_i; /* the query blocks that see the key block */
  fc_bwd_query_blocks<BR, BC>(a, s, k0, shift, &i_begin, &n_i);
  const int n_iter = nh * n_i; /* (query head, query block) pairs, head-major */

  const uint16_t *K = a.k + b * a.k_sb + (s.k_start + k0) * a.k_ss + (int64_t)(hk / a.kv_split) * a.k_sh;
  const uint16_t *V = a.v + b * a.v_sb + (s.k_start + k0) * a.v_ss + (int64_t)(hk / a.kv_split) * a.v_sh;
  fc_load_tile<BC, D, NT>(sK, K, a.k_ss, s.sk - k0, a.head_dim, tid, K);
  fc_load_tile<BC, D, NT>(sV, V, a.v_ss, s.sk - k0, a.head_dim, tid, V);

  /* Q_i, dO_i, lse2_i, D_i of iteration `it` into buffer `st`. */
#define FC_BWD_ISSUE(it, st)                                                                                           \
  fc_bwd_load_q<BR, D, NT>(sQ + (st)*BR * DS, sdO + (st)*BR * DS, sL + (st)*BR, sD + (st)*BR, a.q, a.dout, a.lse2,     \
                           a.dsum, b * a.q_sb + s.q_start * a.q_ss, b * a.do_sb + s.q_start * a.do_ss, a.q_ss,         \
                           a.do_ss, a.q_sh, a.do_sh, h0 + (it) / n_i, (i_begin + (it) % n_i) * BR, s.sq, a.head_dim,   \
                           a.head_dim, a.total_pad, s.pad0, tid)
  if (n_iter > 0) FC_BWD_ISSUE(0, 0);
  fc_cp_async_commit();

  const uint32_t neg = a.negate_q ? 0x80008000u : 0u;
  uint32_t kv_lane[4], qb_lane[4], p_lane[4], bt_cols[NDV / 2], kt_cols[NDQ / 2], ds_t;
  fc_frag_lane<DS>(kv_lane, FC_FRAG_A, lane);                             /* K_j, V_j rows as A (Sᵀ, dPᵀ) */
  fc_frag_lane<DS>(qb_lane, FC_FRAG_B, lane);                             /* Q_i, dO_i rows as B (Sᵀ, dPᵀ) */
  fc_frag_lane<PS>(p_lane, FC_FRAG_A, lane);                              /* Pᵀ, dSᵀ as A (dV, dK) */
  fc_frag_cols<DS, NDV / 2>(bt_cols, FC_FRAG_BT, lane, wn * (DV_N / 16)); /* dO_i, Q_i as B (dV, dK) */
  fc_frag_cols<DS, NDQ / 2>(kt_cols, FC_FRAG_BT, lane, wq * (DQ_N / 16)); /* K_j as B (dQ) */
  {
    uint32_t tmp[1];
    fc_frag_cols<PS, 1>(tmp, FC_FRAG_B, lane, qg); /* dSᵀ read transposed: dS as A (dQ) */
    ds_t = tmp[0];
  }
  const uint32_t sK_u = fc_smem_u32(sK), sV_u = fc_smem_u32(sV), sP_u = fc_smem_u32(sP), sdS_u = fc_smem_u32(sdS);

  float dk[NDV][4], dv[NDV][4];
#pragma unroll
  for (int x = 0; x < NDV; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) dk[x][e] = dv[x][e] = 0.0f;

  for (int it = 0; it < n_iter; it++) {
    const int st = QSTAGES == 2 ? it % 2 : 0;
    fc_cp_async_wait<0>(); /* this thread's copies of Q_i, dO_i (and K_j, V_j)
                              have landed */
    /* Everyone's copies are visible, and every warp is done with iteration it −
     * 1: its Q/dO buffer and sP, sdS may be overwritten. */
    __syncthreads();
    if (QSTAGES == 2 && it + 1 < n_iter) FC_BWD_ISSUE(it + 1, (it + 1) % 2);
    fc_cp_async_commit();
    const int hh = h0 + it / n_i, q0 = (i_begin + it % n_i) * BR;
    const uint32_t sQ_u = fc_smem_u32(sQ + st * BR * DS), sdO_u = fc_smem_u32(sdO + st * BR * DS);
    const float *L = sL + st * BR, *Dr = sD + st * BR;

    /* Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ for this warp's 16 keys × SQ_N queries.
     */
    float sT[NSX][4], dpT[NSX][4];
    fc_bwd_zero2(sT, dpT);
    uint32_t ka[4], va[4], qb[4], ob[4];
    fc_bwd_mma2<T, D / 16, 1, NSX / 2, DS, DS, false, false, true>(&sT, &dpT, &ka, &va, qb, ob, sK_u, sV_u, kv_lane,
                                                                   16 * kg, sQ_u, sdO_u, qb_lane, wn * SQ_N, neg);

    /* Pᵀ = 2^(Sᵀ·c − lse2), dSᵀ = Pᵀ∘(dPᵀ − D); masked pairs only in blocks the
     * mask cuts. */
    const bool full = k0 + BC <= s.sk && q0 + BR <= s.sq &&
                      (a.window_right < 0 || k0 + BC - 1 <= q0 + shift + a.window_right) &&
                      (a.window_left < 0 || k0 >= q0 + BR - 1 + shift - a.window_left);
#pragma unroll
    for (int x = 0; x < NSX; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int qi = wn * SQ_N + 8 * x + 2 * t + (e & 1), kj = 16 * kg + g + 8 * (e >> 1);
        float p = fc_exp2(fmaf(sT[x][e], a.scale_log2, -L[qi]));
        if (!full && !(k0 + kj < s.sk && q0 + qi < s.sq &&
                       fc_bwd_visible(q0 + qi, k0 + kj, shift, a.window_left, a.window_right)))
          p = 0.0f;
        sT[x][e] = p;
        dpT[x][e] = p * (dpT[x][e] - Dr[qi]);
      }
#pragma unroll
    for (int x = 0; x < NSX; x++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const int r = 16 * kg + g + 8 * rh, c = wn * SQ_N + 8 * x;
        *(uint32_t *)(sP + fc_tile_off<PS>(r, c / 8) + 2 * t) = fc_pack2<T>(sT[x][2 * rh], sT[x][2 * rh + 1]);
        *(uint32_t *)(sdS + fc_tile_off<PS>(r, c / 8) + 2 * t) = fc_pack2<T>(dpT[x][2 * rh], dpT[x][2 * rh + 1]);
      }
    __syncthreads(); /* Pᵀ and dSᵀ of all warps are in shared memory */

    /* dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i (dK's scale is applied once at the
     * end). */
    uint32_t pa[4], da[4], obt[4], qbt[4];
    fc_bwd_mma2<T, BR / 16, 1, NDV / 2, PS, DS, true, false, false>(&dv, &dk, &pa, &da, obt, qbt, sP_u, sdS_u, p_lane,
                                                                    16 * kg, sdO_u, sQ_u, bt_cols, 0, 0u);

    /* dQ_i += dS·K_j: this warp's 16 queries × DQ_N columns, added to the fp32
     * buffer. */
    if constexpr (ATOMIC_DQ) {
      float dq[NDQ][4];
#pragma unroll
      for (int x = 0; x < NDQ; x++) dq[x][0] = dq[x][1] = dq[x][2] = dq[x][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < BC / 16; kk++) {
        uint32_t dsa[4];
        fc_ldmatrix_x4_trans(dsa, fc_frag_addr_at<PS>(sdS_u, ds_t, 16 * kk));
#pragma unroll
        for (int i = 0; i < NDQ / 2; i++) {
          uint32_t kb[4];
          fc_ldmatrix_x4_trans(kb, fc_frag_addr_at<DS>(sK_u, kt_cols[i], 16 * kk));
          fc_mma<T>(dq[2 * i], dsa, kb[0], kb[1]);
          fc_mma<T>(dq[2 * i + 1], dsa, kb[2], kb[3]);
        }
      }
      /* Four consecutive columns per red: lanes t and t^1 swap halves, so that the even lane holds row g
       * and the odd lane row g + 8, columns 8x + 4·(t/2) .. +3 of each. Columns past d add zeros. */
      const bool odd = t & 1;
      const int i = q0 + 16 * qg + g + (odd ? 8 : 0);
      float *row = a.dq_accum + ((s.q_row0 + i) * a.heads_q + hh) * (int64_t)D + wq * DQ_N + 4 * (t >> 1);
#pragma unroll
      for (int x = 0; x < NDQ; x++) {
        const float r0 = __shfl_xor_sync(0xffffffffu, odd ? dq[x][0] : dq[x][2], 1);
        const float r1 = __shfl_xor_sync(0xffffffffu, odd ? dq[x][1] : dq[x][3], 1);
        if (i < s.sq) {
          if (odd)
            fc_red_add4(row + 8 * x, r0, r1, dq[x][2], dq[x][3]);
          else
            fc_red_add4(row + 8 * x, dq[x][0], dq[x][1], r0, r1);
        }
      }
    }
    if (QSTAGES == 1 && it + 1 < n_iter) {
      __syncthreads(); /* every warp is done with this Q_i, dO_i: the single
                          buffer may be refilled */
      FC_BWD_ISSUE(it + 1, 0);
      fc_cp_async_commit();
    }
  }
#undef FC_BWD_ISSUE

  /* dK_j = scale·(dSᵀ·Q summed), dV_j: staged through sQ and sdO (a CTA
   * barrier: other warps may still read them), then stored as whole 16-byte
   * chunks of rows. */
  fc_cp_async_wait<0>(); /* nothing may still land in shared memory (with no
                            iteration, K_j, V_j may) */
  __syncthreads();
  uint16_t *sdK = sQ, *sdV = sdO;
#pragma unroll
  for (int x = 0; x < NDV; x++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = 16 * kg + g + 8 * rh, c = wn * DV_N + 8 * x;
      *(uint32_t *)(sdK + fc_tile_off<DS>(r, c / 8) + 2 * t) =
          fc_pack2<T>(a.scale * dk[x][2 * rh], a.scale * dk[x][2 * rh + 1]);
      *(uint32_t *)(sdV + fc_tile_off<DS>(r, c / 8) + 2 * t) = fc_pack2<T>(dv[x][2 * rh], dv[x][2 * rh + 1]);
    }
  __syncthreads();
  fc_bwd_store_dkdv<BC, D, DS, NT>(a, s, b, hk, k0, sdK, sdV, tid);
}

/* ---- 3. dq (deterministic mode) ------------------------------------------------------------------------ */
/* SCORE_MOD: dS = P∘g∘(dP − D) in place of S (sc) for one block of keys from k0, P = 2^(x·log2 e − lse2) of the
 * modified score x (fc_bwd_fa2_p_mod's maths in the forward's layout: row g + 8·(e >> 1), key k0 + 8x + 2t + (e & 1)),
 * keys outside the row's [lo, hi) P = 0. dist0[rh]: i + sk − sq − 2t of the row (ALiBi). BIAS: x gains attn_mask's
 * element (row[rh], key) of bias_plane (P = 0 where a boolean mask removes it); dbias is the dK/dV kernel's. */
template <typename T, int NS, bool BIAS>
static __device__ __forceinline__ void
fc_bwd_dq_p_mod(float (&sc)[NS][4], const float (&dp)[NS][4], const fc_score_mod &md, float slope,
                const float (&dist0)[2], int k0, const int (&lo)[2], const int (&hi)[2], const float (&l2)[2],
                const float (&dr)[2], int t, const void *bias_plane, const int (&row)[2], int sq, int sk) {
  const float v[2] = {dist0[0] - (float)k0, dist0[1] - (float)k0};
#pragma unroll
  for (int x = 0; x < NS; x++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int key = k0 + 8 * x + 2 * t + (e & 1), rh = e >> 1;
      float g;
      float xs = fc_mod_score_any(sc[x][e], md, slope, fabsf(v[rh] - (float)(8 * x + (e & 1))), &g);
      [[maybe_unused]] bool keep = true;
      if constexpr (BIAS) { /* attn_mask (fc_bwd_fa2_p_mod's): elements inside the sequence only */
        float add = 0.0f;
        if (key < sk && row[rh] < sq)
          keep = fc_bias_one<T>(md, bias_plane, (int64_t)row[rh] * md.bias_st[2] + (int64_t)key * md.bias_st[3], &add);
        xs += add;
      }
      float p = fc_exp2(fmaf(xs, 1.4426950408889634f, -l2[rh]));
      if (key < lo[rh] || key >= hi[rh] || !keep) p = 0.0f;
      sc[x][e] = p * g * (dp[x][e] - dr[rh]);
    }
}

/* The forward's structure with dS in place of P: Br = 128 queries (8 warps × 16
 * rows), K_j/V_j ring. SCORE_MOD: softcap, ALiBi and dropout (mma/score_mod.cuh), P of the modified score and
 * dS = P∘g∘(Z∘dP − D) as the fa2 kernels make them. */
template <typename T, int D, int BC, int STAGES, bool SCORE_MOD = false, bool DV_COLS = false>
__global__ void __launch_bounds__(FC_BWD_DQ_THREADS, 1) fc_mma_bwd_dq_kernel(const fc_mma_bwd_args a) {
  constexpr int BR = FC_BWD_DQ_BR, NT = FC_BWD_DQ_THREADS, DS = fc_tile_stride(D), NS = BC / 8, NO = D / 8;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sQ = smem, *sdO = sQ + BR * DS, *sK = sdO + BR * DS, *sV = sK + STAGES * BC * DS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  const int mb = a.n_blocks - 1 - (int)(blockIdx.x % a.n_blocks);
  const int64_t bh = blockIdx.x / a.n_blocks;
  const int h = (int)(bh % a.heads_q);
  const int64_t b = bh / a.heads_q;
  const fc_bwd_seq s = FC_BWD_SEQ(a, b);
  const int i0 = mb * BR;
  if (i0 >= s.sq) return;
  const int hk = h / a.group; /* the kv head */
  const uint16_t *Q = a.q + b * a.q_sb + s.q_start * a.q_ss + (int64_t)h * a.q_sh;
  const uint16_t *dO = a.dout + b * a.do_sb + s.q_start * a.do_ss + (int64_t)h * a.do_sh;
  const uint16_t *K = a.k + b * a.k_sb + s.k_start * a.k_ss + (int64_t)hk * a.k_sh;
  const uint16_t *V = a.v + b * a.v_sb + s.k_start * a.v_ss + (int64_t)hk * a.v_sh;

  const int64_t shift = (a.bottom_right ? (int64_t)s.sk - s.sq : 0) + a.mask_offset;
  const int i_last = min(i0 + BR, s.sq) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  fc_row_keys(i0, shift, a.window_left, a.window_right, s.sk, &lo_first, &hi_first);
  fc_row_keys(i_last, shift, a.window_left, a.window_right, s.sk, &lo_last, &hi_last);
  int j_begin = lo_first / BC;
  int j_end = lo_first < hi_last ? (hi_last + BC - 1) / BC : j_begin;
  /* SCORE_MOD with a boolean attn_mask's tiles (built at this pass's 128 × Bc: mma/bwd_score_mod.cu; the design:
   * common/mask_tiles.cuh): only the key blocks that keep some pair of this query block. None left: no block, and
   * dQ = 0 is stored, as for rows that see no key. */
  if constexpr (SCORE_MOD) fc_mask_cut_row(a.mod.tiles, b, h, mb, &j_begin, &j_end);
  int row_lo[2], row_hi[2];
  float l2[2], dr[2];
  for (int rh = 0; rh < 2; rh++) {
    const int i = i0 + warp * 16 + g + 8 * rh;
    fc_row_keys(i, shift, a.window_left, a.window_right, s.sk, &row_lo[rh], &row_hi[rh]);
    const int64_t at = (int64_t)h * a.total_pad + s.pad0 + i; /* padded: rows up to i0 + BR exist */
    l2[rh] = a.lse2[at];
    dr[rh] = a.dsum[at];
  }
  /* SCORE_MOD: this (sequence, head)'s ALiBi slope and each row's ALiBi distance to key 2t, i + sk − sq − 2t */
  [[maybe_unused]] float slope = 0.0f, dist0[2];
  if constexpr (SCORE_MOD) {
    slope = fc_score_mod_slope(a.mod, b, h);
    for (int rh = 0; rh < 2; rh++) dist0[rh] = (float)(i0 + warp * 16 + g + 8 * rh + s.sk - s.sq - 2 * t);
  }
  /* SCORE_MOD with attn_mask: this (sequence, head)'s plane of it, and the thread's two rows */
  [[maybe_unused]] const void *bias_plane = nullptr;
  [[maybe_unused]] int brow[2] = {i0 + warp * 16 + g, i0 + warp * 16 + g + 8};
  if constexpr (SCORE_MOD) {
    if (a.mod.bias) bias_plane = fc_bias_plane(a.mod, b, h);
  }

  fc_load_tile<BR, D, NT>(sQ, Q + (int64_t)i0 * a.q_ss, a.q_ss, s.sq - i0, a.head_dim, tid, Q);
  fc_load_tile<BR, D, NT>(sdO, dO + (int64_t)i0 * a.do_ss, a.do_ss, s.sq - i0, fc_bwd_v_cols<DV_COLS>(a), tid, dO);
  fc_cp_async_commit();
#pragma unroll
  for (int st = 0; st < STAGES - 1; st++) {
    const int j = j_begin + st;
    if (j < j_end) {
      fc_load_tile<BC, D, NT>(sK + st * BC * DS, K + (int64_t)j * BC * a.k_ss, a.k_ss, s.sk - j * BC, a.head_dim, tid,
                              K);
      fc_load_tile<BC, D, NT>(sV + st * BC * DS, V + (int64_t)j * BC * a.v_ss, a.v_ss, s.sk - j * BC,
                              fc_bwd_v_cols<DV_COLS>(a), tid, V);
    }
    fc_cp_async_commit();
  }

  const uint32_t neg = a.negate_q ? 0x80008000u : 0u;
  uint32_t a_lane[4], b_lane[4], bt_lane[4];
  fc_frag_lane<DS>(a_lane, FC_FRAG_A, lane);
  fc_frag_lane<DS>(b_lane, FC_FRAG_B, lane);
  fc_frag_lane<DS>(bt_lane, FC_FRAG_BT, lane);
  const uint32_t sQ_u = fc_smem_u32(sQ), sdO_u = fc_smem_u32(sdO);
  float dq[NO][4];
#pragma unroll
  for (int x = 0; x < NO; x++) dq[x][0] = dq[x][1] = dq[x][2] = dq[x][3] = 0.0f;

  for (int j = j_begin; j < j_end; j++) {
    const int n = j - j_begin;
    fc_cp_async_wait<STAGES - 2>();
    __syncthreads(); /* K_j, V_j (and Q, dO) visible; every warp is done with
                        the stage refilled below */
    {
      const int jp = j + STAGES - 1, sp = (n + STAGES - 1) % STAGES;
      if (jp < j_end) {
        fc_load_tile<BC, D, NT>(sK + sp * BC * DS, K + (int64_t)jp * BC * a.k_ss, a.k_ss, s.sk - jp * BC, a.head_dim,
                                tid, K);
        fc_load_tile<BC, D, NT>(sV + sp * BC * DS, V + (int64_t)jp * BC * a.v_ss, a.v_ss, s.sk - jp * BC,
                                fc_bwd_v_cols<DV_COLS>(a), tid, V);
      }
      fc_cp_async_commit();
    }
    const uint32_t Kj = fc_smem_u32(sK + (n % STAGES) * BC * DS), Vj = fc_smem_u32(sV + (n % STAGES) * BC * DS);

    /* SCORE_MOD with a boolean mask's tiles: block j's class, one for the CTA. NONE (a hole inside the range) adds
     * dS = 0: skipped, its copies already issued; ALL reads no mask element; SOME reads them. */
    [[maybe_unused]] int mask_cls = FC_MT_SOME;
    if constexpr (SCORE_MOD) {
      if (a.mod.tiles.cls) {
        mask_cls = fc_mask_tile(a.mod.tiles, b, h, mb, j);
        if (mask_cls == FC_MT_NONE) continue;
      }
    }

    /* SCORE_MOD with dropout: this block's keep bits, before S and dP exist (fc_mma_drop_bits) */
    [[maybe_unused]] uint32_t km[(NS * 4 + 31) / 32];
    if constexpr (SCORE_MOD) {
      if (a.mod.drop_on)
        fc_mma_drop_bits<1, NS>(km, a.mod, (uint64_t)(b * a.heads_q + h), i0 + warp * 16 + g, s.sk, j * BC, t);
    }

    /* S = Q_i·K_jᵀ, dP = dO_i·V_jᵀ */
    float sc[NS][4], dp[NS][4];
    fc_bwd_zero2(sc, dp);
    uint32_t qa[4], oa[4], kb[4], vb[4];
    fc_bwd_mma2<T, D / 16, 1, NS / 2, DS, DS, false, true, false>(&sc, &dp, &qa, &oa, kb, vb, sQ_u, sdO_u, a_lane,
                                                                  warp * 16, Kj, Vj, b_lane, 0, neg);
    /* dS = P∘(dP − D) with P = 2^(S·c − lse2) (SCORE_MOD: dS = P∘g∘(dP − D), P = 2^(x·log2 e − lse2)) */
    if constexpr (SCORE_MOD) {
      /* Dropout: dS = P∘g∘(Z∘dP − D), Z = keep/(1 − p) (flash_bwd.c's form) */
      if (a.mod.drop_on) fc_mma_drop_apply<1, NS>(&dp, km, a.mod.drop_rp);
      if (a.mod.bias && mask_cls != FC_MT_ALL)
        fc_bwd_dq_p_mod<T, NS, true>(sc, dp, a.mod, slope, dist0, j * BC, row_lo, row_hi, l2, dr, t, bias_plane, brow,
                                     s.sq, s.sk);
      else
        fc_bwd_dq_p_mod<T, NS, false>(sc, dp, a.mod, slope, dist0, j * BC, row_lo, row_hi, l2, dr, t, bias_plane, brow,
                                      s.sq, s.sk);
    }
#pragma unroll
    for (int x = 0; x < NS && !SCORE_MOD; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = j * BC + 8 * x + 2 * t + (e & 1), rh = e >> 1;
        float p = fc_exp2(fmaf(sc[x][e], a.scale_log2, -l2[rh]));
        if (key < row_lo[rh] || key >= row_hi[rh]) p = 0.0f;
        sc[x][e] = p * (dp[x][e] - dr[rh]);
      }
      /* dQ_i += dS·K_j: dS packed as the A operand, K_j read transposed as B.
       */
#pragma unroll
    for (int kb = 0; kb < BC / 16; kb++) {
      uint32_t da[4];
      da[0] = fc_pack2<T>(sc[2 * kb][0], sc[2 * kb][1]);
      da[1] = fc_pack2<T>(sc[2 * kb][2], sc[2 * kb][3]);
      da[2] = fc_pack2<T>(sc[2 * kb + 1][0], sc[2 * kb + 1][1]);
      da[3] = fc_pack2<T>(sc[2 * kb + 1][2], sc[2 * kb + 1][3]);
#pragma unroll
      for (int dpi = 0; dpi < D / 16; dpi++) {
        uint32_t kt[4];
        fc_ldmatrix_x4_trans(kt, fc_frag_addr<DS>(Kj, bt_lane, 16 * kb, dpi));
        fc_mma<T>(dq[2 * dpi], da, kt[0], kt[1]);
        fc_mma<T>(dq[2 * dpi + 1], da, kt[2], kt[3]);
      }
    }
  }

  /* dQ = scale·dQ, staged through this warp's own rows of sQ (only it read
   * them); when no key block was visible, Q_i's copies by other threads may
   * still be in flight: wait for all. */
  fc_cp_async_wait<0>();
  __syncthreads();
  uint16_t *dQ = a.dq + b * a.dq_sb + s.q_start * a.dq_ss + (int64_t)h * a.dq_sh;
#pragma unroll
  for (int x = 0; x < NO; x++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const int r = warp * 16 + g + 8 * rh;
      *(uint32_t *)(sQ + fc_tile_off<DS>(r, x) + 2 * t) =
          fc_pack2<T>(a.scale * dq[x][2 * rh], a.scale * dq[x][2 * rh + 1]);
    }
  __syncwarp();
  for (int idx = lane; idx < 16 * NO; idx += 32) {
    const int r = warp * 16 + idx / NO, c = idx % NO, row = i0 + r, cols = min(a.head_dim - 8 * c, 8);
    if (row >= s.sq || cols <= 0) continue;
    const uint16_t *from = sQ + fc_tile_off<DS>(r, c);
    uint16_t *to = dQ + (int64_t)row * a.dq_ss + 8 * c;
    if (cols == 8) {
      *(uint4 *)to = *(const uint4 *)from;
    } else {
      for (int x = 0; x < cols; x++) to[x] = from[x];
    }
  }
}

/* ---- the plan ------------------------------------------------------------------------------------------ */
/* The fa2 family's tiles by head dim: Br × Bc, NW warps, of which WS along Sᵀ's keys, WD along dK/dV's keys and WQ
 * along dQ's queries, NQC columns of dQ at once (mma/bwd_kernel.cuh); lean: fa2pb's kernel is the register-lean one
 * (LEAN) at Bc = 128, +5..28 % over the first at d64 and d128 where that spilled 64–76 bytes
 * (bench/results/configs/mma-bwd-fa2pbl.txt). Against the first kernel's 64 × 64 tiles (base): 1.1–1.5×
 * (configs/mma-bwd-configs.csv). */
typedef struct fc_mma_bwd_fa2_tile {
  int br, bc, nw, ws, wd, wq, nqc, lean;
} fc_mma_bwd_fa2_tile;
static constexpr fc_mma_bwd_fa2_tile fc_mma_bwd_fa2_tiles[FC_MMA_NDIMS] = {
    {128, 128, 8, 4, 4, 4, 32, 1}, {64, 128, 8, 4, 4, 4, 48, 1}, {64, 128, 8, 4, 4, 2, 32, 1},
    {64, 64, 8, 4, 2, 2, 48, 0},   {64, 64, 8, 4, 2, 2, 32, 0}};
/* Q_i, dO_i double-buffered, except where that and fa2pb's dQ tile pass sm_90's 227 KB (d256: 217 KB + 64 KB): one
 * buffer (214 KB), refilled while the block's dQ is computed (mma/bwd_kernel.cuh). */
static constexpr int fc_mma_bwd_fa2_qstages(int d, int br, int bc, bool bulk) {
  return fc_bwd_fa2_smem(d, br, bc, 2, bulk) <= FC_SM90_SMEM_OPTIN ? 2 : 1;
}

/* The base kernel's tiles: Br × Bc, NW warps, Q/dO stages; br = 0: none. It runs where the fa2 tiles' shared memory
 * (161–209 KB) exceeds the device's: every head dim on sm_86/89 (99 KB), where base fits at d ≤ 64 (97 KB), and d256
 * on sm_80 (163 KB; base 145 KB). At d96–192 base would need 113–161 KB, which fits sm_80, where fa2 runs, and not
 * sm_86/89: no device runs it there. */
typedef struct fc_mma_bwd_base_tile {
  int br, bc, nw, qstages;
} fc_mma_bwd_base_tile;
static constexpr fc_mma_bwd_base_tile fc_mma_bwd_base_tiles[FC_MMA_NDIMS] = {
    {64, 128, 8, 2}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}, {64, 64, 8, 1}};
static constexpr size_t fc_mma_bwd_base_smem(int d, fc_mma_bwd_base_tile t) {
  return (size_t)(2 * t.bc + 2 * t.qstages * t.br) * fc_tile_stride(d) * 2 +
         (size_t)2 * t.bc * fc_tile_stride(t.br) * 2 + (size_t)2 * t.qstages * t.br * sizeof(float);
}

/* The deterministic dQ pass (3'): Bc by head dim, two K/V stages. */
static constexpr int fc_mma_bwd_dq_bc[FC_MMA_NDIMS] = {64, 64, 64, 32, 32};
static constexpr size_t fc_mma_bwd_dq_smem(int d, int bc) {
  return (size_t)(2 * FC_BWD_DQ_BR + 2 * 2 * bc) * fc_tile_stride(d) * 2;
}

/* What a backward call runs. */
typedef struct fc_mma_bwd_plan {
  int dim;       /* index of the compiled head dim in fc_mma_dims */
  int kernel;    /* fc_mma_bwd_kernel */
  int dq_tile_w; /* FA2PB: the blocked fp32 dQ sum's tile width (fc_bwd_dq_blocked_index); 0: [total_q][hq][D] */
  bool det_dq; /* dQ by its own pass (3'), in a fixed order: deterministic calls, and those that fa2p/fa2pb cannot take
                */
} fc_mma_bwd_plan;

/* ---- launch -------------------------------------------------------------------------------------------- */
/* The arguments of the row passes (common/bwd_rows.cuh: prep, and the convert of the fp32 dQ sum). */
static inline fc_bwd_rows_args fc_mma_bwd_rows(const fc_mma_bwd_args *a) {
  static_assert((int)FC_BWD_ROWS_PAD == (int)FC_BWD_PADR, "the row passes' blocks are the padded sequences'");
  fc_bwd_rows_args r;
  memset(&r, 0, sizeof r);
  r.o = a->o, r.dout = a->dout, r.dq = a->dq;
  r.o_sb = a->o_sb, r.o_ss = a->o_ss, r.o_sh = a->o_sh, r.do_sb = a->do_sb, r.do_ss = a->do_ss, r.do_sh = a->do_sh;
  r.dq_sb = a->dq_sb, r.dq_ss = a->dq_ss, r.dq_sh = a->dq_sh;
  r.lse = a->lse, r.lse2 = a->lse2, r.dsum = a->dsum;
  r.dq_accum = a->dq_accum, r.dq_ld = a->dq_ld, r.dq_tile_w = a->dq_tile_w;
  r.cu_q = a->cu_q, r.end_q = a->end_q, r.cu_pad = a->cu_pad;
  r.seqlen_q = a->seqlen_q, r.total_q = a->total_q, r.total_pad = a->total_pad, r.sq_pad = a->sq_pad;
  r.heads_q = a->heads_q, r.head_dim = a->head_dim, r.scale = a->scale;
  return r;
}

/* 1. prep; with fa2pb's blocked sum it zeroes the sum too (no memset: fc_mma_backward). */
template <typename T> static flashc_status fc_mma_bwd_prep(const fc_problem *p, const fc_mma_bwd_args *a) {
  fc_bwd_rows_args r = fc_mma_bwd_rows(a);
  r.dq_zero = a->dq_tile_w ? a->dq_accum : NULL;
  return fc_bwd_rows_prep<T>(p, r);
}

/* The dK/dV grid's order (common/tail_order.cuh). After fc_mma_grid: batch·heads_kv fits an int. */
static inline flashc_status fc_mma_bwd_tail(const fc_problem *p, const void *kernel, int threads, size_t smem,
                                            fc_mma_bwd_args *a) {
  a->n_pairs = (int)(p->batch * a->heads_kv);
  return fc_tail_from(p, a->n_blocks, a->n_pairs, kernel, threads, smem, &a->tail_from);
}

/* 2, base. */
template <typename T, int D, int BR, int BC, int NW, int QSTAGES>
static flashc_status fc_mma_bwd_base(const fc_problem *p, const fc_mma_bwd_args *a0, bool det_dq) {
  fc_mma_bwd_args a = *a0;
  const bool atomic = !det_dq;
  int grid = 0;
  a.n_blocks = (int)fc_cdiv(p->seqlen_k, BC);
  FC_CHECK(fc_mma_grid("flashc_backward", a.n_blocks, a.heads_kv, p->batch, &grid));
  const size_t smem = fc_mma_bwd_base_smem(D, fc_mma_bwd_base_tile{BR, BC, NW, QSTAGES});
  void (*dkdv)(const fc_mma_bwd_args) = atomic ? fc_mma_bwd_dkdv_kernel<T, D, BR, BC, NW, QSTAGES, true>
                                               : fc_mma_bwd_dkdv_kernel<T, D, BR, BC, NW, QSTAGES, false>;
  FC_CHECK(fc_mma_smem((const void *)dkdv, smem, "flashc_backward: backend cuda-mma"));
  FC_CHECK(fc_mma_bwd_tail(p, (const void *)dkdv, NW * 32, smem, &a));
  dkdv<<<grid, NW * 32, smem, fc_stream(p)>>>(a);
  FC_LAUNCH_CHECK("fc_mma_bwd_dkdv_kernel");
  return FLASHC_OK;
}

/* 2, the fa2 family (mma/bwd_kernel.cuh): NW warps, one CTA per SM. PDP (fa2p, fa2pb) compiles the atomic-dQ kernel
 * only, fa2 the deterministic one only (the plan's det_dq). BULK: fa2pb (the blocked dQ sum); LEAN: its register-lean
 * kernel. SCORE_MOD: the kernel built with softcap and ALiBi. */
template <typename T, int D, int BR, int BC, int NW, int WS, int WD, int WQ, int NQC, bool PDP, bool BULK, bool LEAN,
          bool SCORE_MOD, bool DV_COLS = false>
static flashc_status fc_mma_bwd_fa2(const fc_problem *p, const fc_mma_bwd_args *a0, bool det_dq) {
  constexpr int QSTAGES = fc_mma_bwd_fa2_qstages(D, BR, BC, BULK);
  constexpr size_t smem = fc_bwd_fa2_smem(D, BR, BC, QSTAGES, BULK);
  fc_mma_bwd_args a = *a0;
  if (PDP == det_dq) /* fc_mma_bwd_plan_of: fa2 with the deterministic dQ, fa2p/fa2pb with the atomic one */
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_backward: cuda-mma's fa2%s kernels have no %s dQ",
                    PDP ? "p/fa2pb" : "", det_dq ? "deterministic" : "atomic");
  if (BULK && a0->dq_tile_w != FC_MMA_DQ_TILE_W)
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_backward: cuda-mma's fa2pb kernel needs the blocked dQ sum");
  int grid = 0;
  a.n_blocks = (int)fc_cdiv(p->seqlen_k, BC);
  FC_CHECK(fc_mma_grid("flashc_backward", a.n_blocks, a.heads_kv, p->batch, &grid));
  void (*dkdv)(const fc_mma_bwd_args) = fc_mma_bwd_fa2_kernel < T, D, BR, BC, NW, QSTAGES, WS, WD, WQ, NQC, PDP,
                     PDP || BULK, BULK, LEAN, SCORE_MOD, DV_COLS > ;
  FC_CHECK(fc_mma_smem((const void *)dkdv, smem, "flashc_backward: backend cuda-mma"));
  FC_CHECK(fc_mma_bwd_tail(p, (const void *)dkdv, NW * 32, smem, &a));
  dkdv<<<grid, NW * 32, smem, fc_stream(p)>>>(a);
  FC_LAUNCH_CHECK("fc_mma_bwd_fa2_kernel");
  return FLASHC_OK;
}

/* 3'/4: dQ from the fp32 buffer (atomic mode), or the deterministic dQ pass (SCORE_MOD: softcap and ALiBi). */
template <typename T, int D, int DQ_BC, bool SCORE_MOD, bool DV_COLS = false>
static flashc_status fc_mma_bwd_finish(const fc_problem *p, const fc_mma_bwd_args *a0, bool det_dq) {
  fc_mma_bwd_args a = *a0;
  const cudaStream_t stream = fc_stream(p);
  if (!det_dq) { /* 4: the fp32 sum, fa2pb's blocked one or [total_q][hq][D], converted as cuda-hopper's is */
    const fc_bwd_rows_args r = fc_mma_bwd_rows(&a);
    return fc_bwd_rows_convert<T>(p, &r);
  }
  int grid = 0;
  a.n_blocks = (int)fc_cdiv(p->seqlen_q, FC_BWD_DQ_BR);
  FC_CHECK(fc_mma_grid("flashc_backward", a.n_blocks, p->heads_q, p->batch, &grid));
  const size_t smem_dq = (size_t)(2 * FC_BWD_DQ_BR + 2 * 2 * DQ_BC) * fc_tile_stride(D) * 2;
  void (*dq)(const fc_mma_bwd_args) = fc_mma_bwd_dq_kernel<T, D, DQ_BC, 2, SCORE_MOD, DV_COLS>;
  FC_CHECK(fc_mma_smem((const void *)dq, smem_dq, "flashc_backward: backend cuda-mma"));
  dq<<<grid, FC_BWD_DQ_THREADS, smem_dq, stream>>>(a);
  FC_LAUNCH_CHECK("fc_mma_bwd_dq_kernel");
  return FLASHC_OK;
}

/* Whether the kernels of compiled head dim d are built with DV_COLS: the larger head dim of each pair of mma/fwd.cu's
 * fc_mma_fwd_dv_pairs (192/128, 128/64, 64/128), at which the backward runs them. */
static constexpr bool fc_mma_bwd_dv_dim(int d) { return d == 128 || d == 192; }

/* Head dim index I of the plan, as template arguments: compile-time walks over the tables, so that a head dim or a
 * tile changes in one place; a cell without a kernel (base's br = 0) compiles nothing, nor DV_COLS at a head dim that
 * no pair runs at. */
template <typename T, bool PDP, bool BULK, bool SCORE_MOD, bool DV_COLS = false, int I = 0>
static flashc_status fc_mma_bwd_fa2_at(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl) {
  if constexpr (I < FC_MMA_NDIMS) {
    constexpr fc_mma_bwd_fa2_tile t = fc_mma_bwd_fa2_tiles[I];
    if constexpr (!DV_COLS || fc_mma_bwd_dv_dim(fc_mma_dims[I])) {
      if (pl->dim == I)
        return fc_mma_bwd_fa2<T, fc_mma_dims[I], t.br, t.bc, t.nw, t.ws, t.wd, t.wq, t.nqc, PDP, BULK,
                              (BULK && t.lean != 0), SCORE_MOD, DV_COLS>(p, a, pl->det_dq);
    }
    return fc_mma_bwd_fa2_at<T, PDP, BULK, SCORE_MOD, DV_COLS, I + 1>(p, a, pl);
  } else {
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_backward: cuda-mma has no fa2 kernel for head dim index %d", pl->dim);
  }
}
template <typename T, int I = 0>
static flashc_status fc_mma_bwd_base_at(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl) {
  if constexpr (I < FC_MMA_NDIMS) {
    constexpr fc_mma_bwd_base_tile t = fc_mma_bwd_base_tiles[I];
    if constexpr (t.br > 0) {
      if (pl->dim == I) return fc_mma_bwd_base<T, fc_mma_dims[I], t.br, t.bc, t.nw, t.qstages>(p, a, pl->det_dq);
    }
    return fc_mma_bwd_base_at<T, I + 1>(p, a, pl);
  } else {
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_backward: cuda-mma has no base kernel for head dim index %d", pl->dim);
  }
}
template <typename T, bool SCORE_MOD, bool DV_COLS = false, int I = 0>
static flashc_status fc_mma_bwd_finish_at(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl) {
  if constexpr (I < FC_MMA_NDIMS) {
    if constexpr (!DV_COLS || fc_mma_bwd_dv_dim(fc_mma_dims[I])) {
      if (pl->dim == I)
        return fc_mma_bwd_finish<T, fc_mma_dims[I], fc_mma_bwd_dq_bc[I], SCORE_MOD, DV_COLS>(p, a, pl->det_dq);
    }
    return fc_mma_bwd_finish_at<T, SCORE_MOD, DV_COLS, I + 1>(p, a, pl);
  } else {
    return fc_error(FLASHC_ERR_INTERNAL, "flashc_backward: cuda-mma has no dQ pass for head dim index %d", pl->dim);
  }
}

/* 1, 2 (the plan's kernel), then 3 or 3' and 4. SCORE_MOD: the kernels built with softcap, ALiBi, dropout and
 * attn_mask (no base kernel: fc_mma_bwd_plan_of never picks it for them). DV_COLS: those built for V's own head dim
 * (fc_bwd_v_cols; no base kernel either: it has no tile at d128 or d192). */
template <typename T, bool SCORE_MOD, bool DV_COLS = false>
static flashc_status fc_mma_bwd_dispatch(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                         const fc_mask_tiles *dq_tiles = nullptr) {
  FC_CHECK(fc_mma_bwd_prep<T>(p, a));
  switch (pl->kernel) {
  case FC_MMA_BWD_FA2: FC_CHECK((fc_mma_bwd_fa2_at<T, false, false, SCORE_MOD, DV_COLS>(p, a, pl))); break;
  case FC_MMA_BWD_FA2P: FC_CHECK((fc_mma_bwd_fa2_at<T, true, false, SCORE_MOD, DV_COLS>(p, a, pl))); break;
  case FC_MMA_BWD_FA2PB: FC_CHECK((fc_mma_bwd_fa2_at<T, true, true, SCORE_MOD, DV_COLS>(p, a, pl))); break;
  default:
    if constexpr (SCORE_MOD || DV_COLS)
      return fc_error(FLASHC_ERR_INTERNAL,
                      "flashc_backward: cuda-mma's base kernel has no softcap, ALiBi or head_dim_v");
    else
      FC_CHECK((fc_mma_bwd_base_at<T>(p, a, pl)));
    break;
  }
  if (dq_tiles) { /* the dQ pass's own blocks (fc_mma_bwd_score_mod) */
    fc_mma_bwd_args ad = *a;
    ad.mod.tiles = *dq_tiles;
    return fc_mma_bwd_finish_at<T, SCORE_MOD, DV_COLS>(p, &ad, pl);
  }
  return fc_mma_bwd_finish_at<T, SCORE_MOD, DV_COLS>(p, a, pl);
}

/* The SCORE_MOD half (mma/bwd_score_mod.cu): fc_mma_bwd_dispatch<T, true> for the call's dtype, with dbias's passes
 * around it; dbias_ws: fc_mma_dbias_bytes(p) of device workspace (dbias's fp32 sums), or NULL where that is 0;
 * tiles_ws: fc_mma_bwd_tiles_bytes(p, pl) of it (a boolean mask's tiles), or NULL where that is 0. */
/* fc_mma_bwd_dispatch<T, true> of one dtype, each in a file of its own (mma/bwd_score_mod_f16.cu, _bf16.cu). */
typedef flashc_status (*fc_mma_bwd_score_mod_fn)(const fc_problem *p, const fc_mma_bwd_args *a,
                                                 const fc_mma_bwd_plan *pl, const fc_mask_tiles *dq_tiles);
flashc_status fc_mma_bwd_score_mod_f16(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                       const fc_mask_tiles *dq_tiles);
flashc_status fc_mma_bwd_score_mod_bf16(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                        const fc_mask_tiles *dq_tiles);
flashc_status fc_mma_bwd_score_mod(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                   void *dbias_ws, void *tiles_ws);
size_t fc_mma_bwd_tiles_bytes(const fc_problem *p, const fc_mma_bwd_plan *pl);

#endif /* FLASHC_CUDA_MMA_BWD_LAUNCH_CUH */
