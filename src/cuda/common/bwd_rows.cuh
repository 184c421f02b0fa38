/* common/bwd_rows.cuh — the row passes around cuda-hopper's backward kernel, written for any backward that
 * walks query blocks of padded per-row buffers (the logic of cuda-mma's passes 1 and 4, in a header that both
 * could share):
 *   prep:    per query row, D = rowsum(dO∘O) and lse2 = lse·log2(e) into fp32 buffers [hq][total_pad], each
 *            sequence's rows padded to FC_BWD_ROWS_PAD. A padding row, or a row that saw no key (lse = −inf),
 *            gets D = 0 and lse2 = +inf, so that its P = 2^(S·c − lse2) is 0 and it adds nothing to dK, dV.
 *            lse = +inf is a forward that overflowed fp32 (scale·S past 3.4e38): lse2 = NaN, so that the rows'
 *            gradients come out NaN, not the 0 that P = 2^(S·c − inf) would give (fc_bwd_lse2).
 *            With a blocked sum it also zeroes the sum's rows (FlashAttention-2's dot_do_o does the same): one
 *            pass over memory fewer than a separate memset (H100: the memset of 16k tokens × 2048 took 41 µs).
 *   convert: dQ = scale·dQ_accum, the fp32 sum that the key blocks added into, to 16 bits. The sum is either
 *            [total_q][hq][dq_ld] (red.global.add) or blocked in tiles of 64 rows × dq_tile_w columns (the bulk
 *            adds of cuda-hopper and of cuda-mma's fa2pb: fc_bwd_dq_blocked_index).
 * Both are plain CUDA (any architecture). */
#ifndef FLASHC_CUDA_HOPPER_BWD_ROWS_CUH
#define FLASHC_CUDA_HOPPER_BWD_ROWS_CUH

#include "common/common.cuh"
#include "mma/ptx.cuh" /* fc_to_float, fc_from_float */

#include <math.h>

enum { FC_BWD_ROWS_PAD = 128, FC_BWD_ROWS_THREADS = 256, FC_BWD_DQ_TILE = 64 };

/* The blocked layout of the fp32 dQ sum, for adds of a whole tile at a time: head-row hr = h·total_pad + padded
 * row, column c of ld columns (a multiple of w; w = 32 or 64). Per 64 head-rows, per w columns, one tile of
 * 64 × w, row-major; in it, row r's 16-byte chunk x (columns 4x .. 4x + 3) sits at chunk x ^ (2r % (w / 4)), so
 * that the stores of a wgmma accumulator (rows g, columns 8x + 2t in a warp) spread over all 32 banks. */
static __host__ __device__ __forceinline__ int64_t fc_bwd_dq_blocked_index(int64_t hr, int c, int ld, int w) {
  const int r = (int)(hr % FC_BWD_DQ_TILE), cc = c % w;
  return (hr - r) * ld + (int64_t)(c / w) * FC_BWD_DQ_TILE * w + r * w + (((cc / 4) ^ ((2 * r) % (w / 4))) * 4) +
         cc % 4;
}
/* The same layout seen from the first of ROWS head-rows (ROWS a multiple of 64, the first one too): the offset
 * of row r < ROWS, column c, in 32 bits, for a copy of those rows in shared memory that one bulk add sends
 * whole (cuda-mma's backward: fc_bwd_dq_blocked_index(hr0 + r, c, ld, w) − hr0·ld). */
static __host__ __device__ __forceinline__ int fc_bwd_dq_blocked_offset(int r, int c, int ld, int w) {
  const int rt = r % FC_BWD_DQ_TILE, cc = c % w;
  return (r - rt) * ld + (c / w) * FC_BWD_DQ_TILE * w + rt * w + (((cc / 4) ^ ((2 * rt) % (w / 4))) * 4) + cc % 4;
}

typedef struct fc_bwd_rows_args {
  const uint16_t *o, *dout;
  uint16_t *dq;
  int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh;
  const float *lse; /* the forward's: [b, hq, sq], or [hq, total_q] when varlen */
  float *lse2, *dsum;
  const float *dq_accum;
  int dq_ld;
  int dq_tile_w;  /* > 0: the sum has fc_bwd_dq_blocked_index's layout with w = dq_tile_w (rows padded like lse2) */
  float *dq_zero; /* prep: the blocked sum to zero (each CTA its padded rows: one contiguous range), or NULL */
  int dq_vec8;    /* convert of the blocked sum: dQ takes 16-byte stores of 8 columns (set by fc_bwd_rows_convert) */
  int od_lanes;   /* prep: > 0, o and dout take 16-byte loads of 8 columns, od_lanes lanes (a power of two) per row */
  const int32_t *cu_q;   /* device copy of cu_seqlens_q, or NULL (dense) */
  const int32_t *end_q;  /* varlen: where each sequence's rows end (mma/host.cuh: seqused) */
  const int64_t *cu_pad; /* varlen: first padded row of each sequence; NULL when dense */
  int seqlen_q;
  int64_t total_q, total_pad, sq_pad;
  int heads_q, head_dim, n_blocks; /* n_blocks: padded row blocks per (head, sequence) in prep's grid */
  /* (head_dim: dQ's columns; fc_bwd_rows_prep sets it to O's, V's head dim, for its launch) */
  float scale;
} fc_bwd_rows_args;

/* What a CTA of prep's grid (row blocks × hq × sequences) covers: row block blk of head h of sequence b, whose
 * sq rows (varlen: the used rows of its slot) start at q_start ([total_q] rows when varlen) and at padded row pad0. */
typedef struct fc_bwd_rows_cta {
  int blk, h, sq;
  int64_t b, q_start, pad0;
} fc_bwd_rows_cta;

static __device__ __forceinline__ fc_bwd_rows_cta fc_bwd_rows_where(const fc_bwd_rows_args &a) {
  fc_bwd_rows_cta w;
  w.blk = (int)(blockIdx.x % a.n_blocks);
  const int64_t bh = blockIdx.x / a.n_blocks;
  w.h = (int)(bh % a.heads_q);
  w.b = bh / a.heads_q;
  w.q_start = 0, w.pad0 = w.b * a.sq_pad, w.sq = a.seqlen_q;
  if (a.cu_q) {
    w.q_start = a.cu_q[w.b];
    w.sq = a.end_q[w.b] - (int)w.q_start;
    w.pad0 = a.cu_pad[w.b];
  }
  return w;
}

/* lse2 = lse·log2(e) of one row: +inf for a row that saw no key (−inf), so that its P is 0; NaN for a forward that
 * overflowed (+inf), so that its P, and the gradients it reaches, are NaN (the overflow made visible). */
static __device__ __forceinline__ float fc_bwd_lse2(float lse) {
  return lse == -INFINITY ? INFINITY : lse == INFINITY ? __int_as_float(0x7fffffff) : lse * 1.4426950408889634f;
}

/* The dot product of 8 columns of O and dO (x, y: one 16-byte load each). */
template <typename T> static __device__ __forceinline__ float fc_bwd_rows_dot8(uint4 x, uint4 y) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float d = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; k++)
    d += fc_to_float<T>((uint16_t)(xs[k] & 0xffffu)) * fc_to_float<T>((uint16_t)(ys[k] & 0xffffu)) +
         fc_to_float<T>((uint16_t)(xs[k] >> 16)) * fc_to_float<T>((uint16_t)(ys[k] >> 16));
  return d;
}

/* prep: one CTA of 8 warps per FC_BWD_ROWS_PAD padded rows of one head of one sequence. With od_lanes, each row is
 * od_lanes lanes of a warp, each 8 columns (16-byte loads; H100, 16k tokens × 2048: 105 µs with a warp per row and
 * a 2-byte load per lane and column), PREP_ROWS of a thread's rows at a time with all their loads issued before
 * the first use (one row at a time, each row's shuffles and stores held the next row's loads back: 103 µs,
 * 2026-11-24); else a warp per row, the lanes over its columns. Grid: row blocks × hq × sequences. */
enum { FC_BWD_PREP_ROWS = 4 };
template <typename T>
__global__ void __launch_bounds__(FC_BWD_ROWS_THREADS) fc_bwd_rows_prep_kernel(const fc_bwd_rows_args a) {
  const fc_bwd_rows_cta w = fc_bwd_rows_where(a);
  const int blk = w.blk, h = w.h, sq = w.sq;
  const int64_t b = w.b, q_start = w.q_start, pad0 = w.pad0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = FC_BWD_ROWS_THREADS / 32;
  const int pad_rows = (sq + FC_BWD_ROWS_PAD - 1) / FC_BWD_ROWS_PAD * FC_BWD_ROWS_PAD;
  if (blk * FC_BWD_ROWS_PAD >= pad_rows) return; /* past this sequence's padded rows (varlen) */
  /* The blocked sum's rows of this CTA, zeroed first (the stores need not wait for the loads below):
   * FC_BWD_ROWS_PAD head-rows from a multiple of 64 (pad0 and total_pad are multiples of FC_BWD_ROWS_PAD), which
   * the blocked layout keeps in one contiguous range of FC_BWD_ROWS_PAD·ld floats. */
  if (a.dq_zero) {
    float4 *z = (float4 *)(a.dq_zero + ((int64_t)h * a.total_pad + pad0 + (int64_t)blk * FC_BWD_ROWS_PAD) * a.dq_ld);
    for (int t = threadIdx.x; t < FC_BWD_ROWS_PAD * a.dq_ld / 4; t += FC_BWD_ROWS_THREADS)
      z[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const uint16_t *O = a.o + b * a.o_sb + q_start * a.o_ss + (int64_t)h * a.o_sh;
  const uint16_t *dO = a.dout + b * a.do_sb + q_start * a.do_ss + (int64_t)h * a.do_sh;
  const int lanes = a.od_lanes ? a.od_lanes : 32, per_warp = 32 / lanes, sub = lane % lanes;
  const float *lse = a.lse + (a.cu_q ? (int64_t)h * a.total_q + q_start : (b * a.heads_q + h) * a.seqlen_q);
  float *lse2 = a.lse2 + (int64_t)h * a.total_pad + pad0, *dsum = a.dsum + (int64_t)h * a.total_pad + pad0;
  if (a.od_lanes) {
    const int step = warps * per_warp; /* rows per pass of the CTA */
    for (int r0 = warp * per_warp + lane / lanes; r0 < FC_BWD_ROWS_PAD; r0 += FC_BWD_PREP_ROWS * step) {
      uint4 x[FC_BWD_PREP_ROWS], y[FC_BWD_PREP_ROWS];
      float l[FC_BWD_PREP_ROWS];
#pragma unroll
      for (int k = 0; k < FC_BWD_PREP_ROWS; k++) {
        const int r = r0 + k * step, i = blk * FC_BWD_ROWS_PAD + r;
        const bool row = r < FC_BWD_ROWS_PAD && i < sq, cols = row && 8 * sub < a.head_dim;
        x[k] = cols ? *(const uint4 *)(O + (int64_t)i * a.o_ss + 8 * sub) : make_uint4(0, 0, 0, 0);
        y[k] = cols ? *(const uint4 *)(dO + (int64_t)i * a.do_ss + 8 * sub) : make_uint4(0, 0, 0, 0);
        l[k] = row ? lse[i] : -INFINITY;
      }
#pragma unroll
      for (int k = 0; k < FC_BWD_PREP_ROWS; k++) {
        const int r = r0 + k * step, i = blk * FC_BWD_ROWS_PAD + r;
        float d = fc_bwd_rows_dot8<T>(x[k], y[k]);
        for (int off = lanes / 2; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off); /* the row's lanes */
        if (sub == 0 && r < FC_BWD_ROWS_PAD) { /* < pad_rows: whole blocks of FC_BWD_ROWS_PAD */
          lse2[i] = fc_bwd_lse2(l[k]);
          dsum[i] = d;
        }
      }
    }
    return;
  }
  for (int r = warp * per_warp; r < FC_BWD_ROWS_PAD; r += warps * per_warp) {
    const int i = blk * FC_BWD_ROWS_PAD + r + lane / lanes; /* < pad_rows: whole blocks of FC_BWD_ROWS_PAD */
    float d = 0.0f, l2 = INFINITY;
    if (i < sq) {
      for (int c = lane; c < a.head_dim; c += 32)
        d += fc_to_float<T>(O[(int64_t)i * a.o_ss + c]) * fc_to_float<T>(dO[(int64_t)i * a.do_ss + c]);
      l2 = fc_bwd_lse2(lse[i]);
    }
    for (int off = 16; off > 0; off /= 2) d += __shfl_xor_sync(0xffffffffu, d, off); /* over the warp */
    if (lane == 0) {
      lse2[i] = l2;
      dsum[i] = d;
    }
  }
}

/* convert: a grid-stride loop over total_q × hq × head_dim elements. */
template <typename T>
__global__ void __launch_bounds__(FC_BWD_ROWS_THREADS) fc_bwd_rows_convert_kernel(const fc_bwd_rows_args a) {
  const int64_t n = a.total_q * a.heads_q * a.head_dim;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
    const int c = (int)(idx % a.head_dim);
    const int64_t rh = idx / a.head_dim, row = rh / a.heads_q; /* row of [total_q]: (b, i) when dense */
    const int h = (int)(rh % a.heads_q);
    const int64_t b = a.cu_q ? 0 : row / a.seqlen_q, i = a.cu_q ? row : row % a.seqlen_q;
    a.dq[b * a.dq_sb + i * a.dq_ss + (int64_t)h * a.dq_sh + c] =
        fc_from_float<T>(a.scale * a.dq_accum[rh * a.dq_ld + c]);
  }
}

/* convert of a blocked sum: prep's grid (a CTA per FC_BWD_ROWS_PAD padded rows of one head of one sequence). The
 * CTA's rows start at a multiple of 64 head-rows, so row i of the CTA is row i % 64 of its tile. With dq_vec8 each
 * thread converts 8 columns of a row: two 16-byte chunks of the sum (chunks 2y and 2y + 1 of a tile row sit at
 * (2y) ^ s and (2y + 1) ^ s, s even: a pair either way round) and one 16-byte store; H100, 16k tokens × 2048:
 * 195 µs per element, FlashAttention-2's convert 80 µs. */
template <typename T>
__global__ void __launch_bounds__(FC_BWD_ROWS_THREADS) fc_bwd_rows_convert_blocked_kernel(const fc_bwd_rows_args a) {
  const fc_bwd_rows_cta w = fc_bwd_rows_where(a);
  const int blk = w.blk, h = w.h, sq = w.sq;
  const int64_t b = w.b, q_start = w.q_start, pad0 = w.pad0;
  const int row0 = blk * FC_BWD_ROWS_PAD, rows = min(FC_BWD_ROWS_PAD, sq - row0), tw = a.dq_tile_w;
  if (rows <= 0) return;
  uint16_t *dQ = a.dq + (a.cu_q ? 0 : b * a.dq_sb) + (q_start + row0) * a.dq_ss + (int64_t)h * a.dq_sh;
  const float *sum = a.dq_accum + ((int64_t)h * a.total_pad + pad0 + row0) * a.dq_ld;
  if (a.dq_vec8) {
    const int per_row = a.head_dim / 8;
    for (int idx = threadIdx.x; idx < rows * per_row; idx += FC_BWD_ROWS_THREADS) {
      const int i = idx / per_row, c = (idx % per_row) * 8, r = i % FC_BWD_DQ_TILE;
      const int x = (c % tw) / 4, sw = (2 * r) % (tw / 4);
      const float *t = sum + (int64_t)(i - r) * a.dq_ld + (c / tw) * FC_BWD_DQ_TILE * tw + r * tw;
      const float4 lo = *(const float4 *)(t + (x ^ sw) * 4), hi = *(const float4 *)(t + ((x + 1) ^ sw) * 4);
      const float k = a.scale;
      *(uint4 *)(dQ + (int64_t)i * a.dq_ss + c) =
          make_uint4(fc_pack2<T>(k * lo.x, k * lo.y), fc_pack2<T>(k * lo.z, k * lo.w), fc_pack2<T>(k * hi.x, k * hi.y),
                     fc_pack2<T>(k * hi.z, k * hi.w));
    }
    return;
  }
  for (int idx = threadIdx.x; idx < rows * a.head_dim; idx += FC_BWD_ROWS_THREADS) {
    const int i = idx / a.head_dim, c = idx % a.head_dim;
    const int64_t at = fc_bwd_dq_blocked_index((int64_t)h * a.total_pad + pad0 + row0 + i, c, a.dq_ld, tw);
    dQ[(int64_t)i * a.dq_ss + c] = fc_from_float<T>(a.scale * a.dq_accum[at]);
  }
}

/* The first padded row of sequence b under device offsets (flashc.h, cu_seqlens_device), from its first row cu alone,
 * with no sum over the sequences before it (which the host cannot read): roundup(cu, P) + b·P, P = FC_BWD_ROWS_PAD.
 * Sequence b, of l rows (cu' = cu + l the next one's first row), takes roundup(l, P) padded rows, and they end before
 * the next sequence's first: roundup(cu, P) + roundup(l, P) < cu + l + 2P ≤ roundup(cu', P) + 2P, and both ends are
 * multiples of P, so roundup(cu, P) + roundup(l, P) ≤ roundup(cu', P) + P, i.e. pad(b) + roundup(l, P) ≤ pad(b + 1).
 * A sequence's used rows (cut to max_seqlen) are at most l, so no two sequences share a padded row; pad(batch), from
 * cu = total_q, is every row's bound, and every pad is a multiple of P, as the blocked dQ sum needs. */
static __host__ __device__ __forceinline__ int64_t fc_bwd_pad_offset(int64_t cu, int64_t b) {
  return (cu + FC_BWD_ROWS_PAD - 1) / FC_BWD_ROWS_PAD * FC_BWD_ROWS_PAD + b * FC_BWD_ROWS_PAD;
}

/* Launches prep over every padded row of every (head, sequence). */
/* The padded row buffers' rows (lse2, D, the blocked dQ sum): each sequence's query rows rounded up to
 * FC_BWD_ROWS_PAD. Varlen: *cu_pad_host = the padded offsets, batch + 1 of them in the handle's host workspace (the
 * caller copies them to the device), and *sq_pad = 0; dense: *cu_pad_host = NULL and *sq_pad = the padded seqlen_q.
 * Device offsets: *cu_pad_host = NULL and *sq_pad = 0, the offsets being fc_bwd_pad_offset's, which the caller has
 * written on the device (mma/host.cuh, fc_mma_upload_cu_seqlens). *total_pad: the padded rows of every sequence. */
static inline flashc_status fc_bwd_rows_pad(const fc_problem *p, int64_t **cu_pad_host, int64_t *sq_pad,
                                            int64_t *total_pad) {
  *cu_pad_host = NULL, *sq_pad = 0;
  if (!p->cu_seqlens_q) {
    *sq_pad = fc_cdiv(p->seqlen_q, FC_BWD_ROWS_PAD) * FC_BWD_ROWS_PAD;
    *total_pad = p->batch * *sq_pad;
    return FLASHC_OK;
  }
  if (p->cu_seqlens_device) {
    *total_pad = fc_bwd_pad_offset(p->total_q, p->batch);
    return FLASHC_OK;
  }
  void *h;
  FC_CHECK(fc_host_workspace(p, (size_t)(p->batch + 1) * sizeof(int64_t), &h));
  int64_t *pad = (int64_t *)h;
  pad[0] = 0;
  for (int64_t s = 0; s < p->batch; s++) {
    int64_t start, len; /* the used rows (seqused): the passes walk no others */
    fc_seq_q(p, s, &start, &len);
    pad[s + 1] = pad[s] + fc_cdiv(len, FC_BWD_ROWS_PAD) * FC_BWD_ROWS_PAD;
  }
  *cu_pad_host = pad, *total_pad = pad[p->batch];
  return FLASHC_OK;
}

template <typename T> static flashc_status fc_bwd_rows_prep(const fc_problem *p, fc_bwd_rows_args a) {
  a.n_blocks = (int)fc_cdiv(p->seqlen_q, FC_BWD_ROWS_PAD);
  int64_t grid = 0;
  if (!fc_mul_ok(a.n_blocks, p->heads_q, &grid) || !fc_mul_ok(grid, p->batch, &grid) || grid > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "flashc_backward: %lld row blocks x %lld heads x %lld sequences exceed 2^31-1 CTAs",
                    (long long)a.n_blocks, (long long)p->heads_q, (long long)p->batch);
  a.head_dim = (int)p->head_dim_v; /* D = rowsum(dO∘O) runs over O's columns: V's head dim */
  a.od_lanes = 0;
  if (a.head_dim % 8 == 0 && a.head_dim <= 256 && (uintptr_t)a.o % 16 == 0 && (uintptr_t)a.dout % 16 == 0 &&
      a.o_sb % 8 == 0 && a.o_ss % 8 == 0 && a.o_sh % 8 == 0 && a.do_sb % 8 == 0 && a.do_ss % 8 == 0 && a.do_sh % 8 == 0)
    for (a.od_lanes = 1; a.od_lanes < a.head_dim / 8;) a.od_lanes *= 2; /* head_dim_v <= 256: at most 32 */
  fc_bwd_rows_prep_kernel<T><<<(unsigned)grid, FC_BWD_ROWS_THREADS, 0, fc_stream(p)>>>(a);
  FC_LAUNCH_CHECK("fc_bwd_rows_prep_kernel");
  return FLASHC_OK;
}

/* Launches convert over dQ; at most 65536 CTAs, each looping. */
template <typename T> static flashc_status fc_bwd_rows_convert(const fc_problem *p, const fc_bwd_rows_args *a) {
  if (a->dq_tile_w) { /* prep's grid, checked there */
    fc_bwd_rows_args g = *a;
    g.n_blocks = (int)fc_cdiv(p->seqlen_q, FC_BWD_ROWS_PAD);
    g.dq_vec8 = p->head_dim % 8 == 0 && a->dq_tile_w % 8 == 0 && (uintptr_t)a->dq % 16 == 0 && a->dq_sb % 8 == 0 &&
                a->dq_ss % 8 == 0 && a->dq_sh % 8 == 0;
    const int64_t grid = (int64_t)g.n_blocks * p->heads_q * p->batch;
    if (grid == 0) return FLASHC_OK;
    fc_bwd_rows_convert_blocked_kernel<T><<<(unsigned)grid, FC_BWD_ROWS_THREADS, 0, fc_stream(p)>>>(g);
    FC_LAUNCH_CHECK("fc_bwd_rows_convert_blocked_kernel");
    return FLASHC_OK;
  }
  const int64_t n = p->total_q * p->heads_q * p->head_dim;
  const int blocks = (int)(n / FC_BWD_ROWS_THREADS < 65536 ? fc_cdiv(n, FC_BWD_ROWS_THREADS) : 65536);
  if (blocks == 0) return FLASHC_OK;
  fc_bwd_rows_convert_kernel<T><<<blocks, FC_BWD_ROWS_THREADS, 0, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_bwd_rows_convert_kernel");
  return FLASHC_OK;
}

#endif /* FLASHC_CUDA_HOPPER_BWD_ROWS_CUH */
