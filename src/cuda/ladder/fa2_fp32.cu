/* ladder/fa2_fp32.cu — rung 3 of the CUDA ladder: FlashAttention-2 (Dao 2023) on CUDA cores, fp32 in and out.
 * This file: the forward pass and the backend's table entry. The backward pass is ladder/fa2_fp32_bwd.cu; the thread
 * layout, tile loaders and register-tiled products both use are in ladder/fa2_fp32_tile.cuh.
 *
 * Forward, one CTA per (sequence, query head, query block Q_i of Br rows); the K/V blocks are the inner loop:
 *
 *   Q_i ← Q_i·scale·log2(e)                        (once: S is then in base-2 units, P = 2^(S − m) is one ex2)
 *   for each key block j that some row of Q_i can see:
 *     S = Q_i·K_jᵀ                                 (Br×Bc, masked entries −inf)
 *     m_new = max(m, rowmax S) ; P = 2^(S − m_new) ; α = 2^(m − m_new)
 *     l = α·l + rowsum P ; O = α·O + P·V_j ; m = m_new
 *   O = O / l ; lse = (m + log2 l)·ln 2             (a row that saw no key: O = 0, lse = −inf)
 *
 * Each thread owns TM = Br/8 rows × Bc/16 columns of S and the same TM rows × D/16 columns of O (thread
 * coarsening: every float4 read from shared memory feeds 4·TM or 4·TN FMAs). K_j and V_j travel by cp.async:
 * K_{j+1} is in flight during O += P·V_j, and V_{j+1} during the next S = Q·Kᵀ. P goes through shared memory
 * because the thread that computes an element of S is not the one that needs it in P·V.
 *
 * Tiles per head-dim bucket (D = 64, 128, 256; smaller head dims are zero-padded to the bucket), shared memory
 * (Q_i, K_j, V_j, P) and the CTAs per SM that registers are budgeted for (__launch_bounds__):
 *   D 64 : Br 64, Bc 64 — 71 KB, 2 CTAs per SM (254 registers: measured faster than 3 CTAs at 168)
 *   D 128: Br 64, Bc 32 — 78 KB, 2 CTAs per SM
 *   D 256: Br 32, Bc 32 — 104 KB, 2 CTAs per SM
 */
#include "ladder/fa2_fp32_tile.cuh"

template <int D, int BR, int BC> struct fa2_fwd_cfg {
  static constexpr int TM = BR / 8, TN = BC / 16, NC = D / 64; /* NC float4 chunks of O columns per thread */
  static constexpr int LD = D + 4, LDP = FA2_LDP(BC);
  static constexpr int SMEM_FLOATS = BR * LD + 2 * BC * LD + BR * LDP;
  static_assert(BR % 8 == 0 && BC % 16 == 0 && D % 64 == 0, "tile shape does not fit the 8x16 thread grid");
};

/* Q_i → shared memory, multiplied by `mul` (scale·log2 e); rows ≥ rows and columns ≥ d are zeros. Plain loads:
 * Q is read once per CTA, and the multiply has to happen on the way. */
template <int BR, int D, int LD>
static __device__ __forceinline__ void fa2_load_q_scaled(float *sm, const float *g, int64_t stride, int rows, int d,
                                                         bool vec, float mul) {
  if (vec) {
    constexpr int C4 = D / 4, RSTEP = FA2_THREADS / C4;
    static_assert(BR % RSTEP == 0, "every thread copies the same number of float4s");
    const int r0 = (int)threadIdx.x / C4, c = ((int)threadIdx.x % C4) * 4;
#pragma unroll
    for (int r = r0; r < BR; r += RSTEP) {
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < rows && c < d) x = *(const float4 *)(g + r * stride + c);
      *(float4 *)(sm + r * LD + c) = make_float4(x.x * mul, x.y * mul, x.z * mul, x.w * mul);
    }
  } else {
    for (int e = (int)threadIdx.x; e < BR * D; e += FA2_THREADS) {
      int r = e / D, c = e % D;
      sm[r * LD + c] = r < rows && c < d ? g[r * stride + c] * mul : 0.0f;
    }
  }
}

/* MINB: CTAs per SM the register budget must allow (65536 / (128·MINB) registers per thread). */
template <int D, int BR, int BC, int MINB>
__global__ void __launch_bounds__(FA2_THREADS, MINB) fa2_fwd_kernel(fc_cc_args a, int32_t nqb, int vec) {
  typedef fa2_fwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, TN = C::TN, NC = C::NC, LD = C::LD, LDP = C::LDP;
  extern __shared__ float4 fc_smem[];
  float *Qs = (float *)fc_smem, *Ks = Qs + BR * LD, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;

  /* Block → (sequence, head, query block Q_i, last first) and the key tiles some row of Q_i sees */
  fa2_qblock blk;
  if (!fa2_qblock_of<BR, BC>(a, nqb, &blk)) return;
  const fc_cc_seq q = blk.q;
  const int s = blk.s, h = blk.h, hk = blk.hk;
  const int32_t i0 = blk.i0, rows = blk.rows, kb0 = blk.kb0, ntiles = blk.ntiles, d = a.head_dim;

  const float *Kg = a.k.data + fc_cc_off(a.k, s, q.k_start, 0, hk),
              *Vg = a.v.data + fc_cc_off(a.v, s, q.k_start, 0, hk);
  if (ntiles > 0) { /* K_0 and V_0 in flight while Q_i is loaded */
    fa2_load_tile_async<BC, D, LD>(Ks, Kg + kb0 * a.k.ss, a.k.ss, q.sk - kb0, d, vec, a.k.data);
    fc_cp_async_commit();
    fa2_load_tile_async<BC, D, LD>(Vs, Vg + kb0 * a.v.ss, a.v.ss, q.sk - kb0, d, vec, a.v.data);
    fc_cp_async_commit();
  }
  fa2_load_q_scaled<BR, D, LD>(Qs, a.q.data + fc_cc_off(a.q, s, q.q_start, i0, h), a.q.ss, rows, d, vec,
                               a.scale * FA2_LOG2E);

  const fa2_rows vis = fa2_rows_of(a, q.shift, i0 + ty, q.sq, q.sk); /* visible keys of this thread's rows */
  float m[TM], l[TM]; /* running max (base 2) and this thread's share of the running sum */
  float4 o[TM][NC];
#pragma unroll
  for (int i = 0; i < TM; i++) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; c++) o[i][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  fc_cp_async_wait<1>();
  __syncthreads(); /* Q_i and K_0 visible to every thread (V_0 may still be in flight) */

  for (int32_t t = 0; t < ntiles; t++) {
    const int32_t c0 = kb0 + t * BC;

    /* S = Q_i·K_jᵀ */
    float S[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int j = 0; j < TN; j++) S[i][j] = 0.0f;
    fa2_gemm_nt<TM, TN, D, LD, LD, 8, 16>(S, Qs + ty * LD, Ks + tx * LD);

    /* Mask only the rows whose visible range does not cover the whole tile (diagonal, window edges, the
     * sequence's end); elsewhere the tile is used as is. */
#pragma unroll
    for (int i = 0; i < TM; i++) {
      const int32_t lo = fa2_row_lo(vis, i), hi = fa2_row_hi(vis, i);
      if (c0 < lo || c0 + BC > hi)
#pragma unroll
        for (int j = 0; j < TN; j++) {
          const int32_t col = c0 + tx + 16 * j;
          if (col < lo || col >= hi) S[i][j] = -INFINITY;
        }
    }

    /* Online softmax: m_new = max(m, rowmax S), P = 2^(S − m_new), l = α·l + rowsum P, O = α·O. While a row
     * has seen only masked keys m_new is −inf; subtracting 0 instead keeps 2^(−inf − (−inf)) = NaN out and
     * still gives P = 0, α = 0. The maxima carry NaN (fc_fmax_nan): a NaN score makes the row NaN. */
#pragma unroll
    for (int i = 0; i < TM; i++) {
      float mt = S[i][0];
#pragma unroll
      for (int j = 1; j < TN; j++) mt = fc_fmax_nan(mt, S[i][j]);
      const float m_new = fc_fmax_nan(m[i], fa2_row_max(mt)), m_use = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = fc_exp2(m[i] - m_use);
      m[i] = m_new;
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < TN; j++) {
        S[i][j] = fc_exp2(S[i][j] - m_use);
        rs += S[i][j];
      }
      l[i] = l[i] * alpha + rs;
#pragma unroll
      for (int c = 0; c < NC; c++) {
        o[i][c].x *= alpha;
        o[i][c].y *= alpha;
        o[i][c].z *= alpha;
        o[i][c].w *= alpha;
      }
#pragma unroll
      for (int j = 0; j < TN; j++) Ps[(ty + 8 * i) * LDP + tx + 16 * j] = S[i][j];
    }
    fc_cp_async_wait<0>();
    __syncthreads(); /* P and V_j visible to every thread; every thread is done reading K_j */

    if (t + 1 < ntiles) { /* K_{j+1} lands while O += P·V_j runs */
      fa2_load_tile_async<BC, D, LD>(Ks, Kg + (int64_t)(c0 + BC) * a.k.ss, a.k.ss, q.sk - (c0 + BC), d, vec, a.k.data);
      fc_cp_async_commit();
    }

    /* O += P·V_j */
    fa2_gemm_nn<TM, NC, BC, LDP, LD, 8, 64>(o, Ps + ty * LDP, Vs + tx * 4);

    fc_cp_async_wait<0>();
    __syncthreads(); /* K_{j+1} visible; every thread is done reading P and V_j */

    if (t + 1 < ntiles) { /* V_{j+1} lands while the next S = Q·Kᵀ runs */
      fa2_load_tile_async<BC, D, LD>(Vs, Vg + (int64_t)(c0 + BC) * a.v.ss, a.v.ss, q.sk - (c0 + BC), d, vec, a.v.data);
      fc_cp_async_commit();
    }
  }

  /* O = O / l, lse = (m + log2 l)·ln 2. l is summed over the row group's 16 threads only now: every thread
   * scaled its share by the same α's. m = −inf: the row saw no key (O = 0, lse = −inf); a NaN m or l, NaN. */
#pragma unroll
  for (int i = 0; i < TM; i++) {
    const int32_t row = i0 + ty + 8 * i;
    const float lsum = fa2_row_sum(l[i]), inv = m[i] != -INFINITY ? 1.0f / lsum : 0.0f;
    if (row >= q.sq) continue;
    float *og = a.o.data + fc_cc_off(a.o, s, q.q_start, row, h);
#pragma unroll
    for (int c = 0; c < NC; c++) {
      const int col = (tx + 16 * c) * 4;
      float4 v = make_float4(o[i][c].x * inv, o[i][c].y * inv, o[i][c].z * inv, o[i][c].w * inv);
      fa2_store4(og + col, v, col, d, vec);
    }
    if (a.lse && tx == 0)
      a.lse[fc_cc_lse_idx(a, s, q, h, row)] = m[i] != -INFINITY ? (m[i] + log2f(lsum)) * FA2_LN2 : -INFINITY;
  }
}

/* ---- host -------------------------------------------------------------------------------------------- */

/* One forward with tile configuration <D, BR, BC, MINB> (the dispatcher below picks it by head_dim). */
template <int D, int BR, int BC, int MINB> static flashc_status fa2_fwd_run(const fc_problem *p) {
  typedef fa2_fwd_cfg<D, BR, BC> C;
  void *ws = NULL;
  const size_t cu_bytes = fc_cc_seqlens_bytes(p);
  if (cu_bytes) FC_CHECK(fc_device_workspace(p, cu_bytes, &ws));
  fc_cc_args a;
  FC_CHECK(fc_cc_args_make(p, ws, &a));
  const int64_t b = p->batch, d = p->head_dim;
  const int vec = fa2_view_vec(&p->q, b, p->heads_q, d) && fa2_view_vec(&p->k, b, p->heads_kv, d) &&
                  fa2_view_vec(&p->v, b, p->heads_kv, d) && fa2_view_vec(&p->o, b, p->heads_q, d);
  const size_t smem = C::SMEM_FLOATS * sizeof(float);
  const int32_t nqb = (int32_t)fc_cdiv(p->seqlen_q, BR);
  const int64_t blocks = (int64_t)nqb * p->heads_q * p->batch; /* ≤ 2^31 − 1: fa2_supports */
  FC_CUDA_CHECK(
      cudaFuncSetAttribute(fa2_fwd_kernel<D, BR, BC, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  fa2_fwd_kernel<D, BR, BC, MINB><<<(unsigned)blocks, FA2_THREADS, smem, fc_stream(p)>>>(a, nqb, vec);
  FC_LAUNCH_CHECK("fa2_fwd_kernel");
  return FLASHC_OK;
}

static bool fa2_usable(char *why, size_t len) { return fc_cuda_usable_sm(80, why, len); }

static flashc_status fa2_supports(const fc_problem *p) {
  FC_CHECK(fc_cc_supports_common(p, "cuda-fa2-fp32"));
  /* The grids are one dimension of (blocks of ≥ 16 rows) × heads × sequences: the smallest block decides. */
  int64_t blocks = fc_cdiv(p->seqlen_q > p->seqlen_k ? p->seqlen_q : p->seqlen_k, 16) * p->heads_q * p->batch;
  if (blocks > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "cuda-fa2-fp32: %lld blocks of rows exceed one grid (2^31-1)",
                    (long long)blocks);
  return FLASHC_OK;
}

static flashc_status fa2_forward(const fc_problem *p) {
  switch (fa2_head_bucket(p->head_dim)) {
  case 64: return fa2_fwd_run<64, 64, 64, 2>(p); /* 2 CTAs per SM, 254 registers: 9 % faster than 3 with 168 */
  case 128: return fa2_fwd_run<128, 64, 32, 2>(p);
  default: return fa2_fwd_run<256, 32, 32, 2>(p);
  }
}

extern "C" const fc_backend fc_backend_cuda_fa2_fp32 = {
    "cuda-fa2-fp32",
    "FlashAttention-2 on CUDA cores in fp32: register-tiled, cp.async K/V tiles, atomic or deterministic dQ",
    FLASHC_DEVICE_CUDA,
    1u << FLASHC_F32,
    1,
    256,
    fa2_usable,
    fa2_supports,
    fa2_forward,
    fc_fa2_fp32_backward,
    0,    /* features: the plain call only (validate.c refuses the others) */
    0,    /* max_head_dim_v */
    NULL, /* forward_kvcache */
};
