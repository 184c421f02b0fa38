/* mma.cu — cuda-mma forward: FlashAttention-2 on tensor cores through mma.sync (sm_80+).
 *
 *   for each query block Q_i (Br = 128 rows, one CTA; each warp owns MT tiles of 16 rows):
 *     for each key block j (Bc keys) that the mask leaves visible to some row of Q_i:
 *       S = Q_i·K_jᵀ                          (m16n8k16; Q_i fragments in registers or read from sQ,
 *                                              K_j fragments via ldmatrix, shared by the warp's MT tiles)
 *       m' = max(m, rowmax S);  P = 2^(c·S − c·m');  l = 2^(c·(m − m'))·l + rowsum P   (c = scale·log2 e)
 *       O = 2^(c·(m − m'))·O + P·V_j           (P stays in registers as the A operand; V_j via
 *                                              ldmatrix.trans)
 *     O /= l;  lse = scale·m + ln l
 *
 * Shapes: q, o [b, sq, hq, d]; k, v [b, sk, hkv, d] (any strides, in elements); lse [b, hq, sq] or
 * [hq, total_q] (varlen). The head dim d is compiled as D in {32, 64, 96, 128, 160, 192, 256}; any other d
 * runs in the next D with zero columns.
 *
 * Shared memory (16-bit elements, rows of DS = round_up(D, 64), XOR-swizzled: see mma_tile.cuh):
 *   sQ [Br][DS]          Q_i; at the end each warp stages its O rows here
 *   sK [STAGES][Bc][DS]  K_j ring buffer, filled by cp.async STAGES − 1 blocks ahead
 *   sV [STAGES][Bc][DS]  V_j likewise
 * Per thread (lane = 4g + t), per M-tile: rows g and g + 8 of the tile, O (D/8 × 4 fp32), S (Bc/8 × 4 fp32),
 * m and l of its two rows; Q (D/16 × 4 registers) when Q_IN_REGS. */
#include "common.cuh"
#include "mma_host.cuh"
#include "mma_tile.cuh"

#include <math.h>
#include <string.h>

enum { FC_MMA_BR = 128 }; /* query rows per CTA: warps × M-tiles per warp × 16 */

typedef struct fc_mma_fwd_args {
  const uint16_t *q, *k, *v;
  uint16_t *o;
  float *lse; /* NULL: not wanted */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh;
  const int32_t *cu_q, *cu_k; /* device copies of cu_seqlens, or NULL (dense) */
  int seqlen_q, seqlen_k;     /* dense sizes */
  int64_t total_q;            /* varlen lse row stride */
  int heads_q, group;         /* group = heads_q / heads_kv */
  int head_dim, m_blocks;
  float scale_log2; /* |scale|·log2(e): exponent of S in base 2 */
  float scale;      /* |scale| */
  int negate_q;     /* scale < 0: use −Q and |scale| (the scores are the same) */
  int64_t window_left, window_right, mask_offset;
  int bottom_right, aligned;
} fc_mma_fwd_args;

/* MT M-tiles of 16 rows per warp, FC_MMA_BR / (16·MT) warps. */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS, bool ALIGNED>
__global__ void __launch_bounds__(FC_MMA_BR / MT * 2, MIN_BLOCKS) fc_mma_fwd_kernel(const fc_mma_fwd_args a) {
  constexpr int BR = FC_MMA_BR, NW = BR / (16 * MT), NT = NW * 32, DS = fc_tile_stride(D);
  constexpr int KD = D / 16; /* k-steps of Q·Kᵀ over the head dim */
  constexpr int NS = BC / 8; /* n-blocks of S */
  constexpr int NO = D / 8;  /* n-blocks of O */
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sQ = smem, *sK = sQ + BR * DS, *sV = sK + STAGES * BC * DS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wrow = warp * MT * 16; /* the warp's first row in the block; tile mt starts at wrow + 16·mt */

  /* Which tile: row blocks vary fastest (CTAs running together share K and V in L2), the heaviest causal
   * block of each head first (a short tail). */
  const int mb = a.m_blocks - 1 - (int)(blockIdx.x % a.m_blocks);
  const int64_t bh = blockIdx.x / a.m_blocks;
  const int h = (int)(bh % a.heads_q);
  const int64_t b = bh / a.heads_q;
  int64_t q_start = 0, k_start = 0;
  int sq = a.seqlen_q, sk = a.seqlen_k;
  if (a.cu_q) {
    q_start = a.cu_q[b];
    sq = a.cu_q[b + 1] - (int)q_start;
    k_start = a.cu_k[b];
    sk = a.cu_k[b + 1] - (int)k_start;
  }
  const int i0 = mb * BR;
  if (i0 >= sq) return;
  const int hk = h / a.group;
  const uint16_t *Q = a.q + b * a.q_sb + q_start * a.q_ss + (int64_t)h * a.q_sh; /* row 0 of this sequence */
  const uint16_t *K = a.k + b * a.k_sb + k_start * a.k_ss + (int64_t)hk * a.k_sh;
  const uint16_t *V = a.v + b * a.v_sb + k_start * a.v_ss + (int64_t)hk * a.v_sh;
  uint16_t *O = a.o + b * a.o_sb + q_start * a.o_ss + (int64_t)h * a.o_sh;

  /* Key blocks visible to some row of this block: [j_begin, j_end). Rows past sq are padding. */
  const int64_t shift = (a.bottom_right ? (int64_t)sk - sq : 0) + a.mask_offset;
  const int i_last = min(i0 + BR, sq) - 1;
  int lo_first, hi_first, lo_last, hi_last;
  fc_row_keys(i0, shift, a.window_left, a.window_right, sk, &lo_first, &hi_first);
  fc_row_keys(i_last, shift, a.window_left, a.window_right, sk, &lo_last, &hi_last);
  const int j_begin = lo_first / BC;
  const int j_end = lo_first < hi_last ? (hi_last + BC - 1) / BC : j_begin;
  /* This thread's rows and the keys each sees. */
  int row_lo[MT][2], row_hi[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++)
      fc_row_keys(i0 + wrow + 16 * mt + g + 8 * rh, shift, a.window_left, a.window_right, sk, &row_lo[mt][rh],
                  &row_hi[mt][rh]);

  fc_load_tile<BR, D, NT, ALIGNED>(sQ, Q + (int64_t)i0 * a.q_ss, a.q_ss, sq - i0, a.head_dim, tid, Q);
  fc_cp_async_commit();
  /* Prologue: the first STAGES − 1 key blocks, one commit group each (empty groups keep the count). */
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    const int j = j_begin + s;
    if (j < j_end) {
      fc_load_tile<BC, D, NT, ALIGNED>(sK + s * BC * DS, K + (int64_t)j * BC * a.k_ss, a.k_ss, sk - j * BC, a.head_dim,
                                       tid, K);
      fc_load_tile<BC, D, NT, ALIGNED>(sV + s * BC * DS, V + (int64_t)j * BC * a.v_ss, a.v_ss, sk - j * BC, a.head_dim,
                                       tid, V);
    }
    fc_cp_async_commit();
  }

  fc_cp_async_wait<STAGES - 1>(); /* Q's group is the oldest */
  __syncthreads();                /* every thread's part of Q_i has landed */
  const uint32_t neg = a.negate_q ? 0x80008000u : 0u;
  uint32_t q_lane[4], k_lane[4], v_lane[4];
  fc_frag_lane<DS>(q_lane, FC_FRAG_A, lane);
  fc_frag_lane<DS>(k_lane, FC_FRAG_B, lane);
  fc_frag_lane<DS>(v_lane, FC_FRAG_BT, lane);
  const uint32_t sQ_u = fc_smem_u32(sQ);
  uint32_t qf[Q_IN_REGS ? MT : 1][Q_IN_REGS ? KD : 1][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int kk = 0; kk < KD; kk++) {
        fc_ldmatrix_x4(qf[mt][kk], fc_frag_addr<DS>(sQ_u, q_lane, wrow + 16 * mt, kk));
#pragma unroll
        for (int x = 0; x < 4; x++) qf[mt][kk][x] ^= neg;
      }
  }

  float o[MT][NO][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int n = 0; n < NO; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  for (int j = j_begin; j < j_end; j++) {
    const int n = j - j_begin;
    fc_cp_async_wait<STAGES - 2>(); /* this thread's copies of block j have landed */
    /* Block j is visible to every warp, and every warp is done with block j − 1, whose stage the prefetch
     * below overwrites. */
    __syncthreads();
    {
      const int jp = j + STAGES - 1, sp = (n + STAGES - 1) % STAGES;
      if (jp < j_end) {
        fc_load_tile<BC, D, NT, ALIGNED>(sK + sp * BC * DS, K + (int64_t)jp * BC * a.k_ss, a.k_ss, sk - jp * BC,
                                         a.head_dim, tid, K);
        fc_load_tile<BC, D, NT, ALIGNED>(sV + sp * BC * DS, V + (int64_t)jp * BC * a.v_ss, a.v_ss, sk - jp * BC,
                                         a.head_dim, tid, V);
      }
      fc_cp_async_commit();
    }
    const uint32_t Kj = fc_smem_u32(sK + (n % STAGES) * BC * DS), Vj = fc_smem_u32(sV + (n % STAGES) * BC * DS);

    /* S = Q_i·K_jᵀ, raw dot products: the scale is folded into the exponent below. Each K_j fragment
     * serves all MT tiles of the warp. */
    float s[MT][NS][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int x = 0; x < NS; x++) s[mt][x][0] = s[mt][x][1] = s[mt][x][2] = s[mt][x][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        if constexpr (Q_IN_REGS) {
#pragma unroll
          for (int x = 0; x < 4; x++) qa[mt][x] = qf[mt][kk][x];
        } else {
          fc_ldmatrix_x4(qa[mt], fc_frag_addr<DS>(sQ_u, q_lane, wrow + 16 * mt, kk));
#pragma unroll
          for (int x = 0; x < 4; x++) qa[mt][x] ^= neg;
        }
      }
#pragma unroll
      for (int p = 0; p < NS / 2; p++) {
        uint32_t kb[4];
        fc_ldmatrix_x4(kb, fc_frag_addr<DS>(Kj, k_lane, 16 * p, kk));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          fc_mma<T>(s[mt][2 * p], qa[mt], kb[0], kb[1]);
          fc_mma<T>(s[mt][2 * p + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    /* Mask: only blocks that cut through the key tail or some row's window pay for it. */
    const int k0 = j * BC;
    const bool full = k0 + BC <= sk && (a.window_right < 0 || k0 + BC - 1 <= i0 + shift + a.window_right) &&
                      (a.window_left < 0 || k0 >= i_last + shift - a.window_left);
    if (!full) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int x = 0; x < NS; x++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int key = k0 + 8 * x + 2 * t + (e & 1), rh = e >> 1;
            if (key < row_lo[mt][rh] || key >= row_hi[mt][rh]) s[mt][x][e] = -INFINITY;
          }
    }

    /* Online softmax, per row: m' = max(m, rowmax S); rescale O and l by 2^(c·(m − m')); P = 2^(c·S − c·m').
     * Rescaling is lazy: while no row of the warp has grown its max by more than 2^8, m stays where it was
     * and P may reach 256 (exact in fp16/bf16, and the same base is used for l), which spares the O·alpha
     * multiplies of most blocks. A row that has seen only masked keys keeps m = −inf and uses 0 as its base,
     * so that every exponent is −inf and P = 0 (never inf − inf). */
    float mx[MT][2];
    bool grow = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        float v = m[mt][rh];
#pragma unroll
        for (int x = 0; x < NS; x++) v = fmaxf(v, fmaxf(s[mt][x][2 * rh], s[mt][x][2 * rh + 1]));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1)); /* the 4 threads of a row share its max */
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
        mx[mt][rh] = v;
        grow |= (v - m[mt][rh]) * a.scale_log2 > 8.0f; /* m = −inf, v finite: true; both −inf: NaN, false */
      }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int rh = 0; rh < 2; rh++) {
          const float base = mx[mt][rh] == -INFINITY ? 0.0f : mx[mt][rh] * a.scale_log2;
          const float alpha = fc_exp2(m[mt][rh] * a.scale_log2 - base);
          m[mt][rh] = mx[mt][rh];
          l[mt][rh] *= alpha;
#pragma unroll
          for (int x = 0; x < NO; x++) {
            o[mt][x][2 * rh] *= alpha;
            o[mt][x][2 * rh + 1] *= alpha;
          }
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const float base = m[mt][rh] == -INFINITY ? 0.0f : m[mt][rh] * a.scale_log2;
#pragma unroll
        for (int x = 0; x < NS; x++) {
          s[mt][x][2 * rh] = fc_exp2(fmaf(s[mt][x][2 * rh], a.scale_log2, -base));
          s[mt][x][2 * rh + 1] = fc_exp2(fmaf(s[mt][x][2 * rh + 1], a.scale_log2, -base));
          l[mt][rh] += s[mt][x][2 * rh] + s[mt][x][2 * rh + 1]; /* this thread's columns; summed at the end */
        }
      }

      /* O += P·V_j: the accumulators of S n-blocks 2kb and 2kb+1, packed to 16 bits, are the A fragment of
       * k-step kb. Each V_j fragment serves all MT tiles. */
#pragma unroll
    for (int kb = 0; kb < BC / 16; kb++) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        pa[mt][0] = fc_pack2<T>(s[mt][2 * kb][0], s[mt][2 * kb][1]);
        pa[mt][1] = fc_pack2<T>(s[mt][2 * kb][2], s[mt][2 * kb][3]);
        pa[mt][2] = fc_pack2<T>(s[mt][2 * kb + 1][0], s[mt][2 * kb + 1][1]);
        pa[mt][3] = fc_pack2<T>(s[mt][2 * kb + 1][2], s[mt][2 * kb + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; dp++) {
        uint32_t vb[4];
        fc_ldmatrix_x4_trans(vb, fc_frag_addr<DS>(Vj, v_lane, 16 * kb, dp));
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
          fc_mma<T>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          fc_mma<T>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
  }

  /* O = O / l and lse = scale·m + ln l; a row that saw no key has l = 0: O = 0, lse = −inf. */
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      float lr = l[mt][rh];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
#pragma unroll
      for (int x = 0; x < NO; x++) {
        o[mt][x][2 * rh] *= inv;
        o[mt][x][2 * rh + 1] *= inv;
      }
      const int row = i0 + wrow + 16 * mt + g + 8 * rh;
      if (a.lse && t == 0 && row < sq) {
        const int64_t at =
            a.cu_q ? (int64_t)h * a.total_q + q_start + row : ((int64_t)b * a.heads_q + h) * a.seqlen_q + row;
        a.lse[at] = lr > 0.0f ? m[mt][rh] * a.scale + logf(lr) : -INFINITY;
      }
    }

  /* Store O through shared memory, so that global stores are whole 16-byte chunks of a row. Each warp uses
   * the rows of sQ that only it has read (its Q fragments): a warp barrier is enough. */
  uint16_t *sO = sQ;
  __syncwarp(); /* lanes wrote rows other lanes read through ldmatrix at the start: order them explicitly */
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < NO; x++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        const int r = wrow + 16 * mt + g + 8 * rh;
        *(uint32_t *)(sO + fc_tile_off<DS>(r, x) + 2 * t) = fc_pack2<T>(o[mt][x][2 * rh], o[mt][x][2 * rh + 1]);
      }
  __syncwarp();
  for (int idx = lane; idx < 16 * MT * NO; idx += 32) {
    const int r = wrow + idx / NO, c = idx % NO, row = i0 + r;
    const int cols = min(a.head_dim - 8 * c, 8);
    if (row >= sq || cols <= 0) continue;
    const uint16_t *from = sO + fc_tile_off<DS>(r, c);
    uint16_t *to = O + (int64_t)row * a.o_ss + 8 * c;
    if (ALIGNED && cols == 8) {
      *(uint4 *)to = *(const uint4 *)from;
    } else {
      for (int x = 0; x < cols; x++) to[x] = from[x];
    }
  }
}

/* ---- launch -------------------------------------------------------------------------------------------- */
template <typename T, int D, int BC, int STAGES, int MT, bool Q_IN_REGS, int MIN_BLOCKS>
static flashc_status fc_mma_fwd_launch(const fc_problem *p, const fc_mma_fwd_args *a, int grid) {
  const size_t smem = (size_t)(FC_MMA_BR + 2 * STAGES * BC) * fc_tile_stride(D) * sizeof(uint16_t);
  /* Rows that cp.async cannot copy (not 16-byte aligned) take the slower kernel with plain loads. */
  void (*kernel)(const fc_mma_fwd_args) = a->aligned
                                              ? fc_mma_fwd_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, true>
                                              : fc_mma_fwd_kernel<T, D, BC, STAGES, MT, Q_IN_REGS, MIN_BLOCKS, false>;
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward: backend cuda-mma"));
  kernel<<<grid, FC_MMA_BR / MT * 2, smem, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_mma_fwd_kernel");
  return FLASHC_OK;
}

/* Tile shapes per head dim: <D, Bc keys per block, cp.async stages, M-tiles per warp, Q in registers, CTAs
 * per SM to aim for (the register budget: 2 → at most 128 registers a thread with 8 warps)>. */
template <typename T>
static flashc_status fc_mma_fwd_dispatch(const fc_problem *p, const fc_mma_fwd_args *a, int grid) {
  switch (fc_mma_compiled_dim(p->head_dim)) {
  case 32: return fc_mma_fwd_launch<T, 32, 64, 2, 1, true, 2>(p, a, grid);
  case 64: return fc_mma_fwd_launch<T, 64, 64, 2, 1, true, 2>(p, a, grid);
  case 96: return fc_mma_fwd_launch<T, 96, 64, 2, 1, true, 1>(p, a, grid);
  case 128: return fc_mma_fwd_launch<T, 128, 64, 2, 1, true, 1>(p, a, grid);
  case 160: return fc_mma_fwd_launch<T, 160, 32, 2, 1, true, 1>(p, a, grid);
  case 192: return fc_mma_fwd_launch<T, 192, 32, 2, 1, true, 1>(p, a, grid);
  case 256: return fc_mma_fwd_launch<T, 256, 32, 2, 1, false, 1>(p, a, grid);
  }
  return fc_error(FLASHC_ERR_INTERNAL, "flashc_forward: cuda-mma has no kernel for head_dim %lld",
                  (long long)p->head_dim);
}

static flashc_status mma_supports(const fc_problem *p) {
  if (!fc_mma_compiled_dim(p->head_dim))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "head_dim %lld exceeds 256 on backend cuda-mma", (long long)p->head_dim);
  if (p->heads_q > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "heads_q %lld exceeds 2^31-1 on backend cuda-mma", (long long)p->heads_q);
  int grid = 0;
  return fc_mma_grid("cuda-mma", fc_cdiv(p->seqlen_q, FC_MMA_BR), p->heads_q, p->batch, &grid);
}

static flashc_status mma_forward(const fc_problem *p) {
  const int m_blocks = (int)fc_cdiv(p->seqlen_q, FC_MMA_BR);
  int grid = 0;
  FC_CHECK(fc_mma_grid("flashc_forward", m_blocks, p->heads_q, p->batch, &grid));
  void *ws = NULL;
  FC_CHECK(fc_device_workspace(p, fc_mma_cu_seqlens_bytes(p), &ws));
  fc_mma_fwd_args a;
  memset(&a, 0, sizeof a);
  FC_CHECK(fc_mma_upload_cu_seqlens(p, (int32_t *)ws, &a.cu_q, &a.cu_k));
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
  a.m_blocks = m_blocks;
  a.scale = fabsf(p->scale);
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.negate_q = p->scale < 0.0f;
  a.window_left = p->window_left;
  a.window_right = p->window_right;
  a.mask_offset = p->mask_offset;
  a.bottom_right = p->bottom_right;
  a.aligned = fc_mma_view_aligned(&p->q) && fc_mma_view_aligned(&p->k) && fc_mma_view_aligned(&p->v) &&
              fc_mma_view_aligned(&p->o);
  if (p->dtype == FLASHC_F16) return fc_mma_fwd_dispatch<__half>(p, &a, grid);
  return fc_mma_fwd_dispatch<__nv_bfloat16>(p, &a, grid);
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
};
