/* ladder/fa2_fp32_bwd.cu — the backward pass of cuda-fa2-fp32 (FlashAttention-2, Algorithm 2), fp32 on CUDA cores.
 *
 *   pre-pass : D = rowsum(dO∘O)                         (one warp per row and head)
 *   main     : one CTA per (sequence, kv head, key block K_j/V_j of Bc keys), K_j and V_j in shared memory,
 *              dK_j and dV_j in registers; for every query head of the GQA group and every query block Q_i
 *              that can see K_j:
 *                S  = Q_i·K_jᵀ ; P = 2^(S·scale·log2 e − lse·log2 e)  (P recomputed from the forward's lse)
 *                dP = dO_i·V_jᵀ ; dS = P∘(dP − D_i)
 *                dV_j += Pᵀ·dO_i ; dK_j += dSᵀ·Q_i
 *                dQ_i += dS·K_j                          (fp32 atomicAdd into a workspace accumulator)
 *              then dK_j·scale and dV_j are written once: each has one owner, so they need no atomics.
 *   post-pass: dq = scale·dQ accumulator.
 *
 * params.deterministic = 1 replaces the atomics (whose order of arrival changes the fp32 sum from run to run)
 * with a second kernel, one CTA per query block, that recomputes S, P, dP and dS for every visible key block
 * and accumulates dQ_i in registers: 3 more products of the 5 per tile pair, bit-identical results.
 *
 * Thread layout (ladder/fa2_fp32_tile.cuh): S, dP and dS tiles (Br×Bc) as in the forward, thread (ty, tx) owning rows
 * ty + 8·a and columns tx + 16·b. dK and dV tiles (Bc×D): thread (cc, ng), tid = cc + (Bc/4)·ng, owns the 4
 * keys 4·cc .. 4·cc + 3 and the float4 column chunks ng, ng + NG, ... (NG = 128·4/Bc), 32 accumulators per
 * product for every bucket. dQ tiles (Br×D): rows as S, column chunks tx, tx + 16, ...
 *
 * Tiles per head-dim bucket, shared memory of the main kernel (K, V, Q, dO, P, dS tiles; lse and D), and the
 * CTAs per SM that registers are budgeted for (__launch_bounds__):
 *   D 64 : Br 32, Bc 64 — 71 KB, 3 CTAs per SM (168 registers), or 2 for grids under two waves
 *   D 128: Br 32, Bc 32 — 78 KB, 2 CTAs per SM
 *   D 256: Br 32, Bc 16 — 102 KB, 2 CTAs per SM
 * Br 32 rather than 64 for D 64: with Br 64 the P, dP and dK, dV accumulators need more than 255 registers.
 *
 * The D 64 bucket in the atomic mode runs the fused kernel (fa2_bwd_dkdv_direct_kernel: dQ added into dq itself,
 * no copy pass; key blocks of most work first). Measured on the H100 (tools/fa2/bench-bwd.sh, bench/results/
 * configs/fa2-bwd-configs.csv, b4 h8 s1k-8k and b8 h16 s2k, d64): fused 1.04-1.74x SDPA efficient, the kernels
 * above (dQ in an fp32 buffer, then copied) 1.02-1.23x, fused with Q/dO double-buffered (2 barriers per tile pair)
 * 1.01-1.71x: fused is ahead or within 3% of the best everywhere but b4 h8 s2048 causal (double-buffered +14%).
 */
#include "ladder/fa2_fp32_tile.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

template <int D, int BR, int BC> struct fa2_bwd_cfg {
  static constexpr int TM = BR / 8, TN = BC / 16, NC = D / 64; /* S/dP/dS and dQ sub-tiles */
  static constexpr int CCH = BC / 4, NG = FA2_THREADS / CCH;   /* dK/dV: key chunks × column groups */
  static constexpr int NCH = D / 4 / NG;                       /* float4 column chunks per thread */
  static constexpr int LD = D + 4, LDP = FA2_LDP(BC);
  static constexpr int MAIN_FLOATS = 2 * BC * LD + 2 * BR * LD + 2 * BR * LDP + 2 * BR;
  static constexpr int DQ_FLOATS = 2 * BR * LD + 2 * BC * LD + BR * LDP + 2 * BR;
  static constexpr int STAGE_FLOATS = 2 * BR * LD + 2 * BR;        /* the fused kernel: its Q_i, dO_i, lse_i, D_i */
  static constexpr int DIRECT_FLOATS = 2 * BC * LD + 2 * BR * LDP; /* + STAGE_FLOATS */
  static_assert(BR % 8 == 0 && BC % 16 == 0 && D % 64 == 0, "tile shape does not fit the 8x16 thread grid");
  static_assert(FA2_THREADS % CCH == 0 && (D / 4) % NG == 0 && NCH >= 1, "dK/dV tile does not fit 128 threads");
};

/* ---- pre- and post-pass ------------------------------------------------------------------------------ */

/* Row r of the one-warp-per-row passes, r = packed query row·heads_q + head: its sequence s, head h, and row i
 * within the sequence. */
typedef struct fa2_qrow {
  fc_cc_seq q;
  int s, h;
  int64_t i;
} fa2_qrow;

static __device__ __forceinline__ fa2_qrow fa2_qrow_of(const fc_cc_args &a, int64_t r) {
  const int64_t prow = r / a.heads_q;
  const int h = (int)(r % a.heads_q), s = fc_cc_seq_of_q_row(a, prow);
  const fc_cc_seq q = fc_cc_seq_get(a, s);
  return fa2_qrow{q, s, h, prow - q.q_row0};
}

/* D = rowsum(dO∘O) per (packed row, head), stored like lse. One warp per row. With zero_dq (the direct kernels
 * below, which add dQ straight into dq) the same warp also sets the row of dq to 0: one pass over the rows
 * instead of a memset, and no accumulator. */
__global__ void __launch_bounds__(256) fa2_bwd_dot_kernel(fc_cc_args a, float *Dbuf, int zero_dq) {
  const int lane = (int)threadIdx.x % 32;
  const int64_t rows = a.total_q * a.heads_q, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    const fa2_qrow w = fa2_qrow_of(a, r);
    const fc_cc_seq &q = w.q;
    const int s = w.s, h = w.h;
    const int64_t i = w.i;
    const float *o = a.o.data + fc_cc_off(a.o, s, q.q_start, i, h);
    const float *dout = a.dout.data + fc_cc_off(a.dout, s, q.q_start, i, h);
    float acc = 0.0f;
    for (int c = lane; c < a.head_dim; c += 32) acc = fmaf(dout[c], o[c], acc);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (lane == 0) Dbuf[fc_cc_lse_idx(a, s, q, h, i)] = acc;
    if (zero_dq) {
      float *dq = a.dq.data + fc_cc_off(a.dq, s, q.q_start, i, h);
      for (int c = lane; c < a.head_dim; c += 32) dq[c] = 0.0f;
    }
  }
}

/* dq = scale·accumulator; the accumulator is [packed row][head][dpad] fp32. One warp per (row, head). */
__global__ void __launch_bounds__(256) fa2_bwd_dq_copy_kernel(fc_cc_args a, const float *dq_acc, int dpad) {
  const int lane = (int)threadIdx.x % 32;
  const int64_t rows = a.total_q * a.heads_q, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    const fa2_qrow w = fa2_qrow_of(a, r);
    float *dq = a.dq.data + fc_cc_off(a.dq, w.s, w.q.q_start, w.i, w.h);
    const float *acc = dq_acc + r * dpad;
    for (int c = lane; c < a.head_dim; c += 32) dq[c] = a.scale * acc[c];
  }
}

/* ---- one tile pair ----------------------------------------------------------------------------------- */

/* P and dS of the thread's sub-tile for query rows i0 + ty + 8·a against keys c0 + tx + 16·b:
 *   S = Q_i·K_jᵀ ; P = 2^(S·cs − lse·log2 e), 0 where masked ; dP = dO_i·V_jᵀ ; dS = P∘(dP − D_i).
 * Masked entries are set to 0 after the exp2: a row that sees no key has lse = −inf and 2^(+inf) there. */
template <int D, int BR, int BC>
static __device__ __forceinline__ void fa2_bwd_tile(float (&P)[BR / 8][BC / 16], float (&dS)[BR / 8][BC / 16],
                                                    const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                                    const float *Ls, const float *Ds, const fa2_rows &vis, int32_t c0,
                                                    float cs) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, TN = C::TN, LD = C::LD;
  const int tx = (int)threadIdx.x % 16, ty = (int)threadIdx.x / 16;
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) P[i][j] = dS[i][j] = 0.0f;
  fa2_gemm_nt<TM, TN, D, LD, LD, 8, 16>(P, Qs + ty * LD, Ks + tx * LD);
#pragma unroll
  for (int i = 0; i < TM; i++) {
    const float lse2 = Ls[ty + 8 * i] * FA2_LOG2E;
    const int32_t lo = fa2_row_lo(vis, i), hi = fa2_row_hi(vis, i);
    const bool edge = c0 < lo || c0 + BC > hi;
#pragma unroll
    for (int j = 0; j < TN; j++) {
      const int32_t col = c0 + tx + 16 * j;
      const float p = fc_exp2(fmaf(P[i][j], cs, -lse2));
      P[i][j] = edge && (col < lo || col >= hi) ? 0.0f : p;
    }
  }
  fa2_gemm_nt<TM, TN, D, LD, LD, 8, 16>(dS, dOs + ty * LD, Vs + tx * LD);
#pragma unroll
  for (int i = 0; i < TM; i++) {
    const float Di = Ds[ty + 8 * i];
#pragma unroll
    for (int j = 0; j < TN; j++) dS[i][j] = P[i][j] * (dS[i][j] - Di);
  }
}

/* One (K_j, Q_i) pair of the dK/dV kernels: P and dS of the tile into shared memory (each thread's products below
 * read every thread's), then dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i into this thread's chunks. */
template <int D, int BR, int BC>
static __device__ __forceinline__ void
fa2_bwd_tile_dkdv(float4 (&dv)[4][fa2_bwd_cfg<D, BR, BC>::NCH], float4 (&dk)[4][fa2_bwd_cfg<D, BR, BC>::NCH], float *Ps,
                  float *dSs, const float *Qs, const float *dOs, const float *Ks, const float *Vs, const float *Ls,
                  const float *Ds, const fa2_rows &vis, int32_t c0, float cs, int tx, int ty, int cc, int ng) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, TN = C::TN, NG = C::NG, NCH = C::NCH, LD = C::LD, LDP = C::LDP;
  float P[TM][TN], dS[TM][TN];
  fa2_bwd_tile<D, BR, BC>(P, dS, Qs, dOs, Ks, Vs, Ls, Ds, vis, c0, cs);
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int j = 0; j < TN; j++) {
      Ps[(ty + 8 * i) * LDP + tx + 16 * j] = P[i][j];
      dSs[(ty + 8 * i) * LDP + tx + 16 * j] = dS[i][j];
    }
  __syncthreads(); /* P and dS visible to every thread */

  /* dV_j += Pᵀ·dO_i ; dK_j += dSᵀ·Q_i */
  fa2_gemm_tn<1, NCH, BR, LDP, LD, 0, 4 * NG>(dv, Ps + 4 * cc, dOs + 4 * ng);
  fa2_gemm_tn<1, NCH, BR, LDP, LD, 0, 4 * NG>(dk, dSs + 4 * cc, Qs + 4 * ng);
}

/* This thread's part of dS·K_j (rows ty + 8i, float4 columns tx + 16c), dS from shared memory. */
template <int D, int BR, int BC>
static __device__ __forceinline__ void fa2_bwd_dq_tile(float4 (&dq)[BR / 8][D / 64], const float *dSs, const float *Ks,
                                                       int tx, int ty) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, NC = C::NC, LD = C::LD, LDP = C::LDP;
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int c = 0; c < NC; c++) dq[i][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  fa2_gemm_nn<TM, NC, BC, LDP, LD, 8, 64>(dq, dSs + ty * LDP, Ks + tx * 4);
}

/* Q_i, dO_i, lse_i and D_i of query head h, rows i0 .. i0 + BR − 1 (zeros past the sequence) → shared memory. */
template <int D, int BR>
static __device__ __forceinline__ void fa2_bwd_load_q(const fc_cc_args &a, const float *Dbuf, int s, const fc_cc_seq &q,
                                                      int h, int32_t i0, bool vec, float *Qs, float *dOs, float *Ls,
                                                      float *Ds) {
  constexpr int LD = D + 4;
  const int32_t rows = min(BR, q.sq - i0);
  fa2_load_tile_async<BR, D, LD>(Qs, a.q.data + fc_cc_off(a.q, s, q.q_start, i0, h), a.q.ss, rows, a.head_dim, vec,
                                 a.q.data);
  fa2_load_tile_async<BR, D, LD>(dOs, a.dout.data + fc_cc_off(a.dout, s, q.q_start, i0, h), a.dout.ss, rows, a.head_dim,
                                 vec, a.dout.data);
  const int64_t li = fc_cc_lse_idx(a, s, q, h, i0);
  fa2_load_rows_async<BR>(Ls, a.lse + li, rows, a.lse);
  fa2_load_rows_async<BR>(Ds, Dbuf + li, rows, Dbuf);
}

/* g[0..3] += v, atomically: one 16-byte reduction on sm_90+, four 4-byte ones before. */
static __device__ __forceinline__ void fa2_atomic_add4(float *g, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd((float4 *)g, v);
#else
  atomicAdd(g + 0, v.x);
  atomicAdd(g + 1, v.y);
  atomicAdd(g + 2, v.z);
  atomicAdd(g + 3, v.w);
#endif
}

/* scale·dQ_i, this thread's sub-tile (rows i0 + ty + 8·i, float4 columns tx + 16·c), → dq of query head h: added
 * when ATOMIC (the fused kernel: one key block's part of the sum), else stored (the deterministic kernel: the
 * whole sum). */
template <int D, int BR, bool ATOMIC>
static __device__ __forceinline__ void fa2_bwd_write_dq(const fc_cc_args &a, int s, const fc_cc_seq &q, int h,
                                                        int32_t i0, const float4 (&dq)[BR / 8][D / 64], int tx, int ty,
                                                        int d, int vec) {
#pragma unroll
  for (int i = 0; i < BR / 8; i++) {
    const int32_t row = i0 + ty + 8 * i;
    if (row >= q.sq) continue;
    float *g = a.dq.data + fc_cc_off(a.dq, s, q.q_start, row, h);
#pragma unroll
    for (int c = 0; c < D / 64; c++) {
      const int col = (tx + 16 * c) * 4;
      if (ATOMIC) {
        const float4 v =
            make_float4(dq[i][c].x * a.scale, dq[i][c].y * a.scale, dq[i][c].z * a.scale, dq[i][c].w * a.scale);
        if (vec) {
          if (col >= d) continue;
          fa2_atomic_add4(g + col, v);
        } else {
#pragma unroll
          for (int x = 0; x < 4; x++)
            if (col + x < d) atomicAdd(g + col + x, fa2_at(v, x));
        }
      } else {
        fa2_store4(g + col,
                   make_float4(dq[i][c].x * a.scale, dq[i][c].y * a.scale, dq[i][c].z * a.scale, dq[i][c].w * a.scale),
                   col, d, vec);
      }
    }
  }
}

/* ---- the dK/dV kernels: dK_j, dV_j (and dQ by atomics) ----------------------------------------------------- */

/* One CTA of either dK/dV kernel (the main one, DIRECT = false, and the fused one below): key block kb of
 * (sequence, kv head) pair sh. The kernels differ only in the order of their blocks, the order of their tiles in
 * shared memory (the pointers), and where dQ_i += dS·K_j goes: the fused kernel adds scale·dS·K_j into dq itself;
 * the main kernel adds dS·K_j into the fp32 accumulator dq_acc when atomic_dq, and leaves dQ to its own kernel
 * otherwise (deterministic mode). Thread (tx, ty) owns rows of S, dS and dQ; (cc, ng) keys and columns of dK, dV. */
template <int D, int BR, int BC, bool DIRECT>
static __device__ __forceinline__ void fa2_bwd_dkdv_cta(const fc_cc_args &a, const float *Dbuf, float *dq_acc,
                                                        int64_t sh, int32_t kb, int vec, int atomic_dq, float *Ks,
                                                        float *Vs, float *Qs, float *dOs, float *Ps, float *dSs,
                                                        float *Ls, float *Ds, int tx, int ty, int cc, int ng) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, NC = C::NC, NG = C::NG, NCH = C::NCH, LD = C::LD;

  const int hk = (int)(sh % a.heads_kv), s = (int)(sh / a.heads_kv);
  const fc_cc_seq q = fc_cc_seq_get(a, s);
  const int32_t c0 = kb * BC;
  if (c0 >= q.sk) return;
  const int32_t cols = min(BC, q.sk - c0), d = a.head_dim;

  /* Query blocks with a row that sees a key of K_j; the same for every head of the group. */
  int32_t qlo, qhi;
  fc_cc_query_range(a, q.shift, c0, c0 + cols, q.sq, &qlo, &qhi);
  const int32_t qb0 = qlo / BR, nqb = qlo < qhi ? (qhi - qb0 * BR + BR - 1) / BR : 0;
  const int32_t n_it = nqb * a.group;

  fa2_load_tile_async<BC, D, LD>(Ks, a.k.data + fc_cc_off(a.k, s, q.k_start, c0, hk), a.k.ss, cols, d, vec, a.k.data);
  fa2_load_tile_async<BC, D, LD>(Vs, a.v.data + fc_cc_off(a.v, s, q.k_start, c0, hk), a.v.ss, cols, d, vec, a.v.data);
  if (n_it > 0) fa2_bwd_load_q<D, BR>(a, Dbuf, s, q, hk * a.group, qb0 * BR, vec, Qs, dOs, Ls, Ds);
  fc_cp_async_commit();

  float4 dv[4][NCH], dk[4][NCH];
#pragma unroll
  for (int x = 0; x < 4; x++)
#pragma unroll
    for (int c = 0; c < NCH; c++) dv[x][c] = dk[x][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float cs = a.scale * FA2_LOG2E;

  for (int32_t it = 0; it < n_it; it++) {
    const int h = hk * a.group + it / nqb;
    const int32_t i0 = (qb0 + it % nqb) * BR;
    const fa2_rows vis = fa2_rows_of(a, q.shift, i0 + ty, q.sq, q.sk);
    fc_cp_async_wait<0>();
    __syncthreads(); /* Q_i, dO_i, lse_i, D_i (and K_j, V_j) visible; every thread is done with the previous P, dS */

    fa2_bwd_tile_dkdv<D, BR, BC>(dv, dk, Ps, dSs, Qs, dOs, Ks, Vs, Ls, Ds, vis, c0, cs, tx, ty, cc, ng);
    __syncthreads(); /* every thread is done with Q_i, dO_i, lse_i, D_i: the next ones may land */

    if (it + 1 < n_it) {
      const int32_t nit = it + 1;
      fa2_bwd_load_q<D, BR>(a, Dbuf, s, q, hk * a.group + nit / nqb, (qb0 + nit % nqb) * BR, vec, Qs, dOs, Ls, Ds);
      fc_cp_async_commit();
    }

    if (DIRECT) { /* dq_i += scale·dS·K_j, added into dq itself (zeroed by the pre-pass) */
      float4 dq[TM][NC];
      fa2_bwd_dq_tile<D, BR, BC>(dq, dSs, Ks, tx, ty);
      fa2_bwd_write_dq<D, BR, true>(a, s, q, h, i0, dq, tx, ty, d, vec);
    } else if (atomic_dq) { /* dQ_i += dS·K_j, added into the fp32 accumulator */
      float4 dq[TM][NC];
      fa2_bwd_dq_tile<D, BR, BC>(dq, dSs, Ks, tx, ty);
#pragma unroll
      for (int i = 0; i < TM; i++) {
        const int32_t row = i0 + ty + 8 * i;
        if (row >= q.sq) continue;
        float *acc = dq_acc + ((q.q_row0 + row) * a.heads_q + h) * D;
#pragma unroll
        for (int c = 0; c < NC; c++) fa2_atomic_add4(acc + (tx + 16 * c) * 4, dq[i][c]);
      }
    }
  }
  fc_cp_async_wait<0>(); /* nothing may be in flight when the CTA exits (no step: K_j and V_j still are) */

  /* dK_j = scale·Σ dSᵀ·Q, dV_j = Σ Pᵀ·dO: rows 4·cc + x, column chunks ng + NG·c. */
#pragma unroll
  for (int x = 0; x < 4; x++) {
    const int32_t key = c0 + 4 * cc + x;
    if (key >= q.sk) continue;
    float *gk = a.dk.data + fc_cc_off(a.dk, s, q.k_start, key, hk),
          *gv = a.dv.data + fc_cc_off(a.dv, s, q.k_start, key, hk);
#pragma unroll
    for (int c = 0; c < NCH; c++) {
      const int col = (ng + NG * c) * 4;
      fa2_store4(gk + col,
                 make_float4(dk[x][c].x * a.scale, dk[x][c].y * a.scale, dk[x][c].z * a.scale, dk[x][c].w * a.scale),
                 col, d, vec);
      fa2_store4(gv + col, dv[x][c], col, d, vec);
    }
  }
}

/* MINB: CTAs per SM the register budget must allow (65536 / (128·MINB) registers per thread). */
template <int D, int BR, int BC, int MINB>
__global__ void __launch_bounds__(FA2_THREADS, MINB)
    fa2_bwd_dkdv_kernel(fc_cc_args a, const float *Dbuf, float *dq_acc, int32_t nkb, int vec, int atomic_dq) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int LD = C::LD, LDP = C::LDP;
  extern __shared__ float4 fc_smem[];
  float *Ks = (float *)fc_smem, *Vs = Ks + BC * LD, *Qs = Vs + BC * LD, *dOs = Qs + BR * LD, *Ps = dOs + BR * LD,
        *dSs = Ps + BR * LDP, *Ls = dSs + BR * LDP, *Ds = Ls + BR;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16, cc = tid % C::CCH, ng = tid / C::CCH;

  const int32_t kb = (int32_t)(blockIdx.x % nkb);
  const int64_t sh = blockIdx.x / nkb;
  fa2_bwd_dkdv_cta<D, BR, BC, false>(a, Dbuf, dq_acc, sh, kb, vec, atomic_dq, Ks, Vs, Qs, dOs, Ps, dSs, Ls, Ds, tx, ty,
                                     cc, ng);
}

/* ---- the fused kernel (D 64, atomic mode): dQ straight into dq, heaviest key blocks first -------------- */

/* The main kernel's maths with two changes, each aimed at a cost the base kernel pays:
 *   - dQ_i += scale·dS·K_j is added straight into dq, which the pre-pass zeroed: no accumulator memset and no
 *     copy pass (2 of the 4 launches, and 3 passes over a rows × D fp32 buffer; about 1.5 % at s1024 b4 h8);
 *   - block → (key block, head) is key-block major within groups of hg (sequence, kv head) pairs: under a causal
 *     mask K_0 sees the most query blocks, so the longest CTAs start first and the grid ends on short ones
 *     (the forward's "last query block first"); hg ≈ CTAs in flight / key blocks keeps the heads in flight,
 *     and so their Q, dO in L2, as few as in the base order.
 * One Q/dO/lse/D stage: the next block's lands during the dQ product, after a third barrier per tile pair. */
template <int D, int BR, int BC, int MINB>
__global__ void __launch_bounds__(FA2_THREADS, MINB)
    fa2_bwd_dkdv_direct_kernel(fc_cc_args a, const float *Dbuf, int32_t nkb, int32_t hg, int64_t nsh, int vec) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int LD = C::LD, LDP = C::LDP;
  extern __shared__ float4 fc_smem[];
  float *Ks = (float *)fc_smem, *Vs = Ks + BC * LD, *Ps = Vs + BC * LD, *dSs = Ps + BR * LDP, *Qs = dSs + BR * LDP,
        *dOs = Qs + BR * LD, *Ls = dOs + BR * LD, *Ds = Ls + BR;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16, cc = tid % C::CCH, ng = tid / C::CCH;

  const int64_t per_group = (int64_t)hg * nkb, grp = blockIdx.x / per_group;
  const int32_t r = (int32_t)(blockIdx.x % per_group);
  const int32_t hn = (int32_t)min((int64_t)hg, nsh - grp * hg); /* the last group may hold fewer pairs */
  const int32_t kb = r / hn;
  const int64_t sh = grp * hg + r % hn;
  fa2_bwd_dkdv_cta<D, BR, BC, true>(a, Dbuf, NULL, sh, kb, vec, 1, Ks, Vs, Qs, dOs, Ps, dSs, Ls, Ds, tx, ty, cc, ng);
}

/* ---- deterministic dQ: one CTA per (sequence, head, query block) ------------------------------------- */

/* Deterministic mode only: budgeted for 2 CTAs per SM whatever the main kernel uses, so that one instantiation
 * serves every register budget of the main kernel. */
template <int D, int BR, int BC>
__global__ void __launch_bounds__(FA2_THREADS, 2)
    fa2_bwd_dq_kernel(fc_cc_args a, const float *Dbuf, int32_t nqb, int vec) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  constexpr int TM = C::TM, TN = C::TN, NC = C::NC, LD = C::LD, LDP = C::LDP;
  extern __shared__ float4 fc_smem[];
  float *Qs = (float *)fc_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BC * LD, *dSs = Vs + BC * LD,
        *Ls = dSs + BR * LDP, *Ds = Ls + BR;
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;

  fa2_qblock blk; /* as the forward's: the last query block first, and the key tiles it sees */
  if (!fa2_qblock_of<BR, BC>(a, nqb, &blk)) return;
  const fc_cc_seq q = blk.q;
  const int s = blk.s, h = blk.h, hk = blk.hk;
  const int32_t i0 = blk.i0, kb0 = blk.kb0, ntiles = blk.ntiles, d = a.head_dim;
  const float *Kg = a.k.data + fc_cc_off(a.k, s, q.k_start, 0, hk),
              *Vg = a.v.data + fc_cc_off(a.v, s, q.k_start, 0, hk);

  fa2_bwd_load_q<D, BR>(a, Dbuf, s, q, h, i0, vec, Qs, dOs, Ls, Ds);
  if (ntiles > 0) {
    fa2_load_tile_async<BC, D, LD>(Ks, Kg + kb0 * a.k.ss, a.k.ss, q.sk - kb0, d, vec, a.k.data);
    fa2_load_tile_async<BC, D, LD>(Vs, Vg + kb0 * a.v.ss, a.v.ss, q.sk - kb0, d, vec, a.v.data);
  }
  fc_cp_async_commit();

  const fa2_rows vis = fa2_rows_of(a, q.shift, i0 + ty, q.sq, q.sk);
  float4 dq[TM][NC];
#pragma unroll
  for (int i = 0; i < TM; i++) {
#pragma unroll
    for (int c = 0; c < NC; c++) dq[i][c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const float cs = a.scale * FA2_LOG2E;
  fc_cp_async_wait<0>();
  __syncthreads(); /* Q_i, dO_i, lse_i, D_i, K_0, V_0 visible */

  for (int32_t t = 0; t < ntiles; t++) {
    const int32_t c0 = kb0 + t * BC;
    float P[TM][TN], dS[TM][TN];
    fa2_bwd_tile<D, BR, BC>(P, dS, Qs, dOs, Ks, Vs, Ls, Ds, vis, c0, cs);
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
      for (int j = 0; j < TN; j++) dSs[(ty + 8 * i) * LDP + tx + 16 * j] = dS[i][j];
    __syncthreads(); /* dS visible; every thread is done with V_j */

    if (t + 1 < ntiles) { /* V_{j+1} lands during dQ += dS·K_j */
      fa2_load_tile_async<BC, D, LD>(Vs, Vg + (int64_t)(c0 + BC) * a.v.ss, a.v.ss, q.sk - (c0 + BC), d, vec, a.v.data);
      fc_cp_async_commit();
    }
    fa2_gemm_nn<TM, NC, BC, LDP, LD, 8, 64>(dq, dSs + ty * LDP, Ks + tx * 4);
    __syncthreads(); /* every thread is done with K_j and dS */

    if (t + 1 < ntiles) {
      fa2_load_tile_async<BC, D, LD>(Ks, Kg + (int64_t)(c0 + BC) * a.k.ss, a.k.ss, q.sk - (c0 + BC), d, vec, a.k.data);
      fc_cp_async_commit();
      fc_cp_async_wait<0>();
      __syncthreads(); /* K_{j+1} and V_{j+1} visible */
    }
  }

  fa2_bwd_write_dq<D, BR, false>(a, s, q, h, i0, dq, tx, ty, d, vec);
}

/* ---- host -------------------------------------------------------------------------------------------- */

static int fa2_bwd_blocks(int64_t threads) {
  int64_t b = fc_cdiv(threads, 256);
  return (int)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

/* One backward with tile configuration <D, BR, BC, MINB> (the dispatcher below picks it by head_dim). */
template <int D, int BR, int BC, int MINB> static flashc_status fa2_bwd_run(const fc_problem *p) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  const int64_t rows = p->total_q * p->heads_q, d = p->head_dim, b = p->batch;
  const size_t cu_bytes = fc_cc_seqlens_bytes(p), d_bytes = fc_cc_align((size_t)rows * sizeof(float)),
               acc_bytes = p->deterministic ? 0 : fc_cc_align((size_t)(rows * D) * sizeof(float));
  void *ws;
  FC_CHECK(fc_device_workspace(p, cu_bytes + d_bytes + acc_bytes, &ws));
  fc_cc_args a;
  FC_CHECK(fc_cc_args_make(p, ws, &a));
  float *Dbuf = (float *)((char *)ws + cu_bytes), *dq_acc = p->deterministic ? NULL : (float *)((char *)Dbuf + d_bytes);
  const cudaStream_t st = fc_stream(p);
  const int vec = fa2_view_vec(&p->q, b, p->heads_q, d) && fa2_view_vec(&p->k, b, p->heads_kv, d) &&
                  fa2_view_vec(&p->v, b, p->heads_kv, d) && fa2_view_vec(&p->o, b, p->heads_q, d) &&
                  fa2_view_vec(&p->dout, b, p->heads_q, d) && fa2_view_vec(&p->dq, b, p->heads_q, d) &&
                  fa2_view_vec(&p->dk, b, p->heads_kv, d) && fa2_view_vec(&p->dv, b, p->heads_kv, d);

  /* pre-pass: D = rowsum(dO∘O); the dQ accumulator starts at 0 */
  if (dq_acc) FC_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, (size_t)(rows * D) * sizeof(float), st));
  fa2_bwd_dot_kernel<<<fa2_bwd_blocks(rows * 32), 256, 0, st>>>(a, Dbuf, 0);
  FC_LAUNCH_CHECK("fa2_bwd_dot_kernel");

  /* dK, dV (and dQ by atomics) */
  const int32_t nkb = (int32_t)fc_cdiv(p->seqlen_k, BC);
  const size_t smem = C::MAIN_FLOATS * sizeof(float);
  FC_CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_dkdv_kernel<D, BR, BC, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
  fa2_bwd_dkdv_kernel<D, BR, BC, MINB><<<(unsigned)((int64_t)nkb * p->heads_kv * b), FA2_THREADS, smem, st>>>(
      a, Dbuf, dq_acc, nkb, vec, !p->deterministic);
  FC_LAUNCH_CHECK("fa2_bwd_dkdv_kernel");

  if (p->deterministic) { /* dQ without atomics */
    const int32_t nqb = (int32_t)fc_cdiv(p->seqlen_q, BR);
    const size_t smem_dq = C::DQ_FLOATS * sizeof(float);
    FC_CUDA_CHECK(
        cudaFuncSetAttribute(fa2_bwd_dq_kernel<D, BR, BC>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dq));
    fa2_bwd_dq_kernel<D, BR, BC>
        <<<(unsigned)((int64_t)nqb * p->heads_q * b), FA2_THREADS, smem_dq, st>>>(a, Dbuf, nqb, vec);
    FC_LAUNCH_CHECK("fa2_bwd_dq_kernel");
  } else { /* post-pass: dq = scale·accumulator */
    fa2_bwd_dq_copy_kernel<<<fa2_bwd_blocks(rows * 32), 256, 0, st>>>(a, dq_acc, D);
    FC_LAUNCH_CHECK("fa2_bwd_dq_copy_kernel");
  }
  return FLASHC_OK;
}

/* One backward through the fused kernel <D, BR, BC, MINB>: pre-pass (D and dq = 0), then that kernel. */
template <int D, int BR, int BC, int MINB> static flashc_status fa2_bwd_run_direct(const fc_problem *p, int num_sms) {
  typedef fa2_bwd_cfg<D, BR, BC> C;
  const int64_t rows = p->total_q * p->heads_q, d = p->head_dim, b = p->batch;
  const size_t cu_bytes = fc_cc_seqlens_bytes(p), d_bytes = fc_cc_align((size_t)rows * sizeof(float));
  void *ws;
  FC_CHECK(fc_device_workspace(p, cu_bytes + d_bytes, &ws));
  fc_cc_args a;
  FC_CHECK(fc_cc_args_make(p, ws, &a));
  float *Dbuf = (float *)((char *)ws + cu_bytes);
  const cudaStream_t st = fc_stream(p);
  const int vec = fa2_view_vec(&p->q, b, p->heads_q, d) && fa2_view_vec(&p->k, b, p->heads_kv, d) &&
                  fa2_view_vec(&p->v, b, p->heads_kv, d) && fa2_view_vec(&p->o, b, p->heads_q, d) &&
                  fa2_view_vec(&p->dout, b, p->heads_q, d) && fa2_view_vec(&p->dq, b, p->heads_q, d) &&
                  fa2_view_vec(&p->dk, b, p->heads_kv, d) && fa2_view_vec(&p->dv, b, p->heads_kv, d);

  fa2_bwd_dot_kernel<<<fa2_bwd_blocks(rows * 32), 256, 0, st>>>(a, Dbuf, 1);
  FC_LAUNCH_CHECK("fa2_bwd_dot_kernel");

  /* hg (sequence, kv head) pairs per key-block-major group: about one grid's worth of CTAs in flight. */
  const int32_t nkb = (int32_t)fc_cdiv(p->seqlen_k, BC);
  const int64_t nsh = p->heads_kv * b, in_flight = (int64_t)MINB * num_sms;
  const int64_t hg = in_flight / nkb < 1 ? 1 : in_flight / nkb > nsh ? nsh : in_flight / nkb;
  const size_t smem = (size_t)(C::DIRECT_FLOATS + C::STAGE_FLOATS) * sizeof(float);
  FC_CUDA_CHECK(cudaFuncSetAttribute(fa2_bwd_dkdv_direct_kernel<D, BR, BC, MINB>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  fa2_bwd_dkdv_direct_kernel<D, BR, BC, MINB>
      <<<(unsigned)(nkb * nsh), FA2_THREADS, smem, st>>>(a, Dbuf, nkb, (int32_t)hg, nsh, vec);
  FC_LAUNCH_CHECK("fa2_bwd_dkdv_direct_kernel");
  return FLASHC_OK;
}

/* The D 64 bucket in the atomic mode: the fused kernel; other head dims and deterministic mode: the kernels with
 * the dQ accumulator (or the deterministic dQ pass). */
flashc_status fc_fa2_fp32_backward(const fc_problem *p) {
  switch (fa2_head_bucket(p->head_dim)) {
  case 64: {
    /* 3 CTAs per SM (168 registers, a few reloads from local memory) do more per SM than 2 (255 registers), but
     * a grid of fewer than two waves of 3 per SM ends with a partial wave that leaves SMs with one CTA, too few
     * warps to hide latency; 2 per SM pack such grids better (measured on an H200: s1024 b4 h8, 512 CTAs,
     * 0.80 ms with 3 and 0.67 ms with 2; b8 h16 s2048, 4096 CTAs, 9.4 ms with 3 and 10.0 ms with 2). */
    fc_device_props props;
    FC_CHECK(fc_device_get_props(&props));
    const int64_t ctas = fc_cdiv(p->seqlen_k, 64) * p->heads_kv * p->batch;
    const bool small = ctas < 2 * 3 * (int64_t)props.num_sms;
    if (!p->deterministic)
      return small ? fa2_bwd_run_direct<64, 32, 64, 2>(p, props.num_sms)
                   : fa2_bwd_run_direct<64, 32, 64, 3>(p, props.num_sms);
    if (small) return fa2_bwd_run<64, 32, 64, 2>(p);
    return fa2_bwd_run<64, 32, 64, 3>(p);
  }
  case 128: return fa2_bwd_run<128, 32, 32, 2>(p);
  default: return fa2_bwd_run<256, 32, 16, 2>(p);
  }
}
