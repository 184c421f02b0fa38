/* ladder/fa2_fp32_tile.cuh — what the forward (ladder/fa2_fp32.cu) and backward (ladder/fa2_fp32_bwd.cu) kernels of the
 * CUDA-core FlashAttention-2 rung share: the thread layout, tile loaders (global → shared), the visible keys of a
 * thread's rows and of a query block, and register-tiled products of shared-memory tiles.
 *
 * Thread layout. A CTA is 128 threads. For a Br×Bc tile of scores the threads form 8 row groups × 16 column
 * groups, tid = 16·ty + tx: thread (ty, tx) owns rows ty + 8·a (a < Br/8) and columns tx + 16·b (b < Bc/16).
 * The 16 threads of a row group are one half-warp, so row maxima and sums are 4 shuffles. Rows and columns are
 * interleaved (not contiguous blocks) because that makes the 8 lanes of each quarter-warp read 8 consecutive
 * rows, which the padding below puts on 8 different 16-byte bank groups.
 *
 * Shared-memory layout (bank conflicts are avoided by padding, not swizzling):
 *   Q, K, V, dO tiles: [rows][D + 4] floats. Row r starts at 16-byte group r·(D/4 + 1) ≡ r (mod 8) for D a
 *     multiple of 32, so a quarter-warp reading float4s of 8 consecutive rows hits 8 distinct bank groups; a
 *     quarter-warp reading 8 consecutive float4s of one row is contiguous.
 *   P, dS tiles: [Br][FA2_LDP(Bc)] floats with FA2_LDP ≡ 16 (mod 32): the scalar stores of a warp (two row
 *     groups × 16 columns) land on 32 distinct banks.
 *
 * Vector (16-byte) global accesses need head_dim % 4 == 0, every stride % 4 == 0 and 16-byte aligned bases;
 * the host checks that at run time and passes `vec`; otherwise the same loaders move 4 bytes at a time.
 */
#ifndef FLASHC_CUDA_FA2_FP32_TILE_CUH
#define FLASHC_CUDA_FA2_FP32_TILE_CUH

#include "ladder/fa2_fp32_async.cuh"
#include "ladder/naive_args.cuh"

enum { FA2_THREADS = 128 };

#define FA2_LOG2E 1.4426950408889634f
#define FA2_LN2   0.69314718055994531f

/* Row stride of a P or dS tile of Bc columns: ≥ Bc, a multiple of 4 (float4 rows), ≡ 16 (mod 32). */
#define FA2_LDP(bc) ((bc) % 32 == 16 ? (bc) : (bc) + 16)

/* Element i (0..3) of a float4, for loops that the compiler unrolls so that i is a constant. */
static __device__ __forceinline__ float fa2_at(const float4 &v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* ---- loaders ----------------------------------------------------------------------------------------- */

/* Issues cp.async copies of a ROWS × D tile into shared memory `sm` (row stride LD): row r of the tile is
 * global g + r·stride. Rows ≥ valid_rows and columns ≥ d become zeros; `safe` is any valid global address, used
 * as the source of those (nothing is read from it). The caller commits and waits.
 * Vector path: thread t copies column chunk t % (D/4) of rows t / (D/4) + RSTEP·n, so a warp moves whole
 * 256-byte row pieces and the per-copy work is one predicate and one pointer step. */
template <int ROWS, int D, int LD>
static __device__ __forceinline__ void fa2_load_tile_async(float *sm, const float *g, int64_t stride, int valid_rows,
                                                           int d, bool vec, const float *safe) {
  if (vec) {
    constexpr int C4 = D / 4, RSTEP = FA2_THREADS / C4;
    static_assert(FA2_THREADS % C4 == 0 && ROWS % RSTEP == 0, "tile rows do not split evenly over the threads");
    const int r0 = (int)threadIdx.x / C4, c = ((int)threadIdx.x % C4) * 4;
    const bool col_ok = c < d;
    const float *src = g + r0 * stride + c;
    const int64_t step = RSTEP * stride;
    float *dst = sm + r0 * LD + c;
    /* Not unrolled: unrolled, the compiler keeps one 64-bit address per copy alive across the whole tile loop
     * of the caller, which costs more registers than the loop costs instructions. */
#pragma unroll 1
    for (int r = r0; r < ROWS; r += RSTEP, src += step, dst += RSTEP * LD) {
      const bool ok = col_ok && r < valid_rows;
      fc_cp_async_16(dst, ok ? src : safe, ok ? 16 : 0);
    }
  } else {
    constexpr int N = ROWS * D;
#pragma unroll 4
    for (int e = (int)threadIdx.x; e < N; e += FA2_THREADS) {
      int r = e / D, c = e % D;
      bool ok = r < valid_rows && c < d;
      fc_cp_async_4(sm + r * LD + c, ok ? g + r * stride + c : safe, ok ? 4 : 0);
    }
  }
}

/* ROWS consecutive fp32 values (lse or D of consecutive query rows) into shared memory; zeros past valid. */
template <int ROWS>
static __device__ __forceinline__ void fa2_load_rows_async(float *sm, const float *g, int valid, const float *safe) {
  for (int r = (int)threadIdx.x; r < ROWS; r += FA2_THREADS)
    fc_cp_async_4(sm + r, r < valid ? g + r : safe, r < valid ? 4 : 0);
}

/* ---- visible keys of a thread's rows -------------------------------------------------------------------- */
/* The rows of a thread are r0 + 8·a. Row r sees keys [max(r + shift − window_left, 0), min(r + shift +
 * window_right + 1, sk)); both ends move with r, so two numbers per thread describe all its rows. They are
 * clamped to ±2^30 (an unbounded side, or a bound far outside [0, sk]) so that r0-relative arithmetic stays in
 * 32 bits. A row past the sequence (r ≥ sq, the tile's padding) sees no key: its zero query times a key with an
 * infinite component is NaN, which the backward's P must not carry into dK, dV. */
typedef struct fa2_rows {
  int32_t lo0, hi0, sk, left; /* left: sq − r0, rows r0 + 8·a < sq are in the sequence */
} fa2_rows;

static __device__ __forceinline__ fa2_rows fa2_rows_of(const fc_cc_args &a, int64_t shift, int32_t r0, int32_t sq,
                                                       int32_t sk) {
  const int64_t big = (int64_t)1 << 30, dg = (int64_t)r0 + shift;
  int64_t lo = a.window_left < 0 ? -big : dg - a.window_left;
  int64_t hi = a.window_right < 0 ? big : dg + a.window_right + 1;
  lo = lo < -big ? -big : lo > big ? big : lo;
  hi = hi < -big ? -big : hi > big ? big : hi;
  fa2_rows r = {(int32_t)lo, (int32_t)hi, sk, sq - r0};
  return r;
}
static __device__ __forceinline__ int32_t fa2_row_lo(const fa2_rows &r, int i) { return max(r.lo0 + 8 * i, 0); }
static __device__ __forceinline__ int32_t fa2_row_hi(const fa2_rows &r, int i) {
  return 8 * i < r.left ? min(r.hi0 + 8 * i, r.sk) : 0;
}

/* ---- a query block's place and the key tiles it sees ---------------------------------------------------- */
/* The kernels with one CTA per (sequence, query head, query block Q_i of BR rows): the forward and the
 * deterministic dQ pass. Block → (sequence, head, query block) takes the last query block first: under a causal
 * mask it sees the most keys, and starting the longest CTAs first shortens the tail of the grid. */
typedef struct fa2_qblock {
  fc_cc_seq q;
  int s, h, hk;        /* sequence, query head, its kv head */
  int32_t i0, rows;    /* Q_i: rows i0 .. i0 + rows − 1 of the sequence */
  int32_t kb0, ntiles; /* the key tiles some row of Q_i sees: ntiles tiles of BC keys from key kb0 on */
} fa2_qblock;

/* This CTA's query block; false when it starts past the end of its sequence (a shorter one of a varlen batch):
 * the CTA has nothing to do. */
template <int BR, int BC>
static __device__ __forceinline__ bool fa2_qblock_of(const fc_cc_args &a, int32_t nqb, fa2_qblock *b) {
  const int32_t qb = nqb - 1 - (int32_t)(blockIdx.x % nqb);
  const int64_t sh = blockIdx.x / nqb;
  const int h = (int)(sh % a.heads_q), s = (int)(sh / a.heads_q), hk = h / a.group;
  const fc_cc_seq q = fc_cc_seq_get(a, s);
  const int32_t i0 = qb * BR;
  if (i0 >= q.sq) return false;
  const int32_t rows = min(BR, q.sq - i0);

  /* Keys that some row of Q_i sees: both bounds of a row's range grow with the row, so the first row has the
   * lowest start and the last row the highest end. */
  int32_t klo, khi, unused;
  fc_cc_key_range(a, q.shift, i0, q.sk, &klo, &unused);
  fc_cc_key_range(a, q.shift, i0 + rows - 1, q.sk, &unused, &khi);
  const int32_t kb0 = klo / BC * BC, ntiles = klo < khi ? (khi - kb0 + BC - 1) / BC : 0;
  *b = fa2_qblock{q, s, h, hk, i0, rows, kb0, ntiles};
  return true;
}

/* ---- products of shared-memory tiles ----------------------------------------------------------------- */
/* Each thread accumulates its own sub-tile in registers; all loops unroll so that the accumulators stay in
 * registers. The loads are float4 (LDS.128): per 4 steps of k a thread loads TM + TN float4s for 4·TM·TN FMAs. */

/* acc[i][j] += Σ_k A[i·SA][k] · B[j·SB][k] — both operands k-contiguous (S = Q·Kᵀ, dP = dO·Vᵀ). A and B point
 * at the thread's first row; LDA, LDB are row strides. */
template <int TM, int TN, int K, int LDA, int LDB, int SA, int SB>
static __device__ __forceinline__ void fa2_gemm_nt(float (&acc)[TM][TN], const float *A, const float *B) {
#pragma unroll(K <= 64 ? K / 4 : 4)
  for (int k = 0; k < K; k += 4) {
    float4 b[TN];
#pragma unroll
    for (int j = 0; j < TN; j++) b[j] = *(const float4 *)(B + j * SB * LDB + k);
#pragma unroll
    for (int i = 0; i < TM; i++) {
      float4 x = *(const float4 *)(A + i * SA * LDA + k);
#pragma unroll
      for (int j = 0; j < TN; j++) {
        acc[i][j] = fmaf(x.x, b[j].x, acc[i][j]);
        acc[i][j] = fmaf(x.y, b[j].y, acc[i][j]);
        acc[i][j] = fmaf(x.z, b[j].z, acc[i][j]);
        acc[i][j] = fmaf(x.w, b[j].w, acc[i][j]);
      }
    }
  }
}

/* acc[i][c] += Σ_k A[i·SA][k] · B[k][c·SC .. c·SC + 3] — A k-contiguous, B k-major in float4 chunks
 * (O += P·V, dQ += dS·K). acc[i][c] holds 4 consecutive output columns. */
template <int TM, int NC, int K, int LDA, int LDB, int SA, int SC>
static __device__ __forceinline__ void fa2_gemm_nn(float4 (&acc)[TM][NC], const float *A, const float *B) {
#pragma unroll(K <= 64 ? K / 4 : 4)
  for (int k = 0; k < K; k += 4) {
    float4 a[TM];
#pragma unroll
    for (int i = 0; i < TM; i++) a[i] = *(const float4 *)(A + i * SA * LDA + k);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      float4 b[NC];
#pragma unroll
      for (int c = 0; c < NC; c++) b[c] = *(const float4 *)(B + (k + kk) * LDB + c * SC);
#pragma unroll
      for (int i = 0; i < TM; i++) {
        float x = fa2_at(a[i], kk);
#pragma unroll
        for (int c = 0; c < NC; c++) {
          acc[i][c].x = fmaf(x, b[c].x, acc[i][c].x);
          acc[i][c].y = fmaf(x, b[c].y, acc[i][c].y);
          acc[i][c].z = fmaf(x, b[c].z, acc[i][c].z);
          acc[i][c].w = fmaf(x, b[c].w, acc[i][c].w);
        }
      }
    }
  }
}

/* acc[4m + x][c] += Σ_k A[k][m·SM + x] · B[k][c·SC .. c·SC + 3] — both operands k-major (outer products:
 * dV += Pᵀ·dO, dK += dSᵀ·Q, where the thread owns 4·MC rows of dV and NC float4 chunks of its columns). */
template <int MC, int NC, int K, int LDA, int LDB, int SM, int SC>
static __device__ __forceinline__ void fa2_gemm_tn(float4 (&acc)[4 * MC][NC], const float *A, const float *B) {
#pragma unroll(K <= 64 ? 8 : 4)
  for (int k = 0; k < K; k++) {
    float4 a[MC], b[NC];
#pragma unroll
    for (int m = 0; m < MC; m++) a[m] = *(const float4 *)(A + k * LDA + m * SM);
#pragma unroll
    for (int c = 0; c < NC; c++) b[c] = *(const float4 *)(B + k * LDB + c * SC);
#pragma unroll
    for (int m = 0; m < MC; m++)
#pragma unroll
      for (int x = 0; x < 4; x++) {
        float y = fa2_at(a[m], x);
#pragma unroll
        for (int c = 0; c < NC; c++) {
          acc[4 * m + x][c].x = fmaf(y, b[c].x, acc[4 * m + x][c].x);
          acc[4 * m + x][c].y = fmaf(y, b[c].y, acc[4 * m + x][c].y);
          acc[4 * m + x][c].z = fmaf(y, b[c].z, acc[4 * m + x][c].z);
          acc[4 * m + x][c].w = fmaf(y, b[c].w, acc[4 * m + x][c].w);
        }
      }
  }
}

/* ---- row reductions over the 16 threads (one half-warp) of a row group -------------------------------- */
static __device__ __forceinline__ float fa2_row_max(float x) {
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) x = fc_fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}
static __device__ __forceinline__ float fa2_row_sum(float x) {
#pragma unroll
  for (int m = 8; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

/* Stores 4 consecutive values at g[0..3] (columns col..col+3 of a row of d columns): one 16-byte store on the
 * vector path, else the in-range scalars. */
static __device__ __forceinline__ void fa2_store4(float *g, float4 v, int col, int d, bool vec) {
  if (vec) {
    if (col < d) *(float4 *)g = v;
  } else {
#pragma unroll
    for (int x = 0; x < 4; x++)
      if (col + x < d) g[x] = fa2_at(v, x);
  }
}

/* ---- host -------------------------------------------------------------------------------------------- */
/* Can a view be moved in 16-byte pieces? Strides of dimensions of size 1 never move a pointer, so they do not
 * count. */
static inline bool fa2_view_vec(const fc_view *v, int64_t batch, int64_t heads, int64_t d) {
  return d % 4 == 0 && (uintptr_t)v->data % 16 == 0 && (batch == 1 || v->stride_b % 4 == 0) && v->stride_s % 4 == 0 &&
         (heads == 1 || v->stride_h % 4 == 0);
}

/* The compile-time head-dim bucket that holds head_dim (columns past head_dim are zeros in shared memory). */
static inline int fa2_head_bucket(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

flashc_status fc_fa2_fp32_backward(const fc_problem *p); /* ladder/fa2_fp32_bwd.cu */

#endif /* FLASHC_CUDA_FA2_FP32_TILE_CUH */
