/* mma/tile.cuh — shared-memory tiles of the mma.sync rungs: the XOR swizzle,
 * the cp.async tile loader with predicated tails, and the ldmatrix addresses
 * into a tile.
 *
 * A tile holds ROWS rows of a [rows, head_dim] matrix of 16-bit values. A row
 * takes DS = D rounded up to 64 elements (a multiple of 128 bytes), cut into
 * 16-byte chunks; chunk c of row r is stored at chunk c ^ (r % 8). ldmatrix
 * reads one chunk column from 8 consecutive rows at a time, and cp.async writes
 * whole rows: with the swizzle, the 8 chunks of either access sit in 8
 * different groups of 4 banks, so neither access has a bank conflict (without
 * it, all 8 rows of a column would share one bank group: 8-way). */
#ifndef FLASHC_CUDA_MMA_TILE_CUH
#define FLASHC_CUDA_MMA_TILE_CUH

#include "mma/ptx.cuh"

/* Elements per tile row in shared memory for a compiled head dim D. */
static constexpr __host__ __device__ int fc_tile_stride(int D) { return (D + 63) / 64 * 64; }

/* Element offset of chunk c (elements 8c..8c+7) of row r in a tile of row
 * stride DS. */
template <int DS> static __device__ __forceinline__ int fc_tile_off(int r, int c) {
  return r * DS + ((c ^ (r & 7)) << 3);
}

/* Copies rows [0, ROWS) of a row-major matrix (`src` = its row 0, `stride`
 * elements between rows) into a swizzled tile, by NT threads. Row r is present
 * when r < rows_left and column x when x < d; everything else lands as zeros,
 * so tails need no special case in the maths (a zero key scores 0 and is
 * masked; a zero column of Q and K adds nothing to a dot product). `safe` is
 * any readable address, handed to the copies that read nothing.
 *
 * Rows start on 16-byte boundaries (the host stages views whose rows do not:
 * mma/host.cuh, fc_mma_stage), so cp.async copies 16 bytes at once and returns
 * before they land (the caller commits and waits). */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void fc_load_tile(uint16_t *tile, const uint16_t *src, int64_t stride, int rows_left,
                                                    int d, int tid, const uint16_t *safe) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, TOTAL = ROWS * CH;
#pragma unroll
  for (int base = 0; base < TOTAL; base += NT) {
    const int idx = base + tid;
    if (TOTAL % NT != 0 && idx >= TOTAL) break;
    const int r = idx / CH, c = idx % CH;
    const int cols = r < rows_left ? min(max(d - 8 * c, 0), 8) : 0; /* valid elements in this chunk */
    const uint16_t *from = src + (int64_t)r * stride + 8 * c;
    uint16_t *to = tile + fc_tile_off<DS>(r, c);
    fc_cp_async16(fc_smem_u32(to), cols > 0 ? from : safe, 2 * cols);
  }
}

/* Threads of NT that copy a tile of head dim D walking rows (mma/fwd_steps.cuh, fc_fwd_load_tile_walk): a multiple
 * of 8 chunk rows, so that each thread's rows share their swizzle; 0: none (fc_load_tile above serves). */
template <int D, int NT> static constexpr int fc_walk_threads() { return NT / (8 * (D / 8)) * (8 * (D / 8)); }

/* ldmatrix.x4 addresses into a tile (see mma/ptx.cuh for which lane gets what). Each lane reads one row and
 * one chunk column of every group of 8 chunks: with the swizzle, chunk c of that row sits at
 * (c & ~7) | ((c & 7) ^ (row & 7)). Row offsets of a fragment are multiples of 8 (they keep row & 7), so a
 * lane's address is its own offset for the chunk's place in the group (4 values: c & 7 = 2·i + half) plus
 * compile-time constants: fc_frag_lane computes the 4 offsets once, fc_frag_addr adds the constants.
 *   FC_FRAG_A:   an A fragment: rows row0..row0+15, the 16 columns of k-step kk (rows = M, columns = K)
 *   FC_FRAG_B:   B fragments of two n-blocks from a tile stored [n][k] (K_j in S = Q·K_jᵀ): rows n0..n0+15,
 *                k-step kk → {b0, b1} of n-block n0 and {b0, b1} of n-block n0 + 8
 *   FC_FRAG_BT:  the same from a tile stored [k][n] (V_j in P·V_j), read with .trans: rows k0..k0+15, the
 *                columns of n-blocks 2·kk and 2·kk + 1 → {b0, b1} of each */
enum fc_frag_kind { FC_FRAG_A, FC_FRAG_B, FC_FRAG_BT };

/* The row of the fragment this lane addresses, and which 8-column half of its 16 columns. */
static __device__ __forceinline__ void fc_frag_row_half(fc_frag_kind kind, int lane, int *row, int *half) {
  if (kind == FC_FRAG_A) {
    *row = lane & 15, *half = lane >> 4;
  } else if (kind == FC_FRAG_B) {
    *row = (lane & 7) + ((lane >> 4) << 3), *half = (lane >> 3) & 1;
  } else {
    *row = (lane & 7) + (((lane >> 3) & 1) << 3), *half = lane >> 4;
  }
}

template <int DS> static __device__ __forceinline__ void fc_frag_lane(uint32_t off[4], fc_frag_kind kind, int lane) {
  int row, half;
  fc_frag_row_half(kind, lane, &row, &half);
#pragma unroll
  for (int i = 0; i < 4; i++) off[i] = 2u * (uint32_t)(row * DS + (((2 * i + half) ^ (row & 7)) << 3));
}

/* Shared address of the fragment at tile row `row0` (a multiple of 8) and
 * k-step (or n-block pair) `kk`; `tile` is the tile's shared address. */
template <int DS>
static __device__ __forceinline__ uint32_t fc_frag_addr(uint32_t tile, const uint32_t off[4], int row0, int kk) {
  return tile + off[kk & 3] + (uint32_t)(2 * row0 * DS + (kk >> 2) * 128);
}

/* The same offsets for N chunk-column pairs first..first+N−1 (a run-time start:
 * a warp's own columns), without the group-of-8 shortcut: fc_frag_addr_at(tile,
 * off, row0, i) addresses pair first + i. */
template <int DS, int N>
static __device__ __forceinline__ void fc_frag_cols(uint32_t off[N], fc_frag_kind kind, int lane, int first) {
  int row, half;
  fc_frag_row_half(kind, lane, &row, &half);
#pragma unroll
  for (int i = 0; i < N; i++) {
    const int c = 2 * (first + i) + half;
    off[i] = 2u * (uint32_t)(row * DS + (((c & ~7) | ((c & 7) ^ (row & 7))) << 3));
  }
}
template <int DS> static __device__ __forceinline__ uint32_t fc_frag_addr_at(uint32_t tile, uint32_t off, int row0) {
  return tile + off + (uint32_t)(2 * row0 * DS);
}

/* Keys visible to query row i of a sequence: [lo, hi) within [0, sk) (empty
 * when lo >= hi), from the problem's window (causal is window_right = 0) and
 * the diagonal shift. */
static __device__ __forceinline__ void fc_row_keys(int64_t i, int64_t shift, int64_t window_left, int64_t window_right,
                                                   int sk, int *lo, int *hi) {
  int64_t a = window_left < 0 ? 0 : i + shift - window_left;
  int64_t b = window_right < 0 ? sk : i + shift + window_right + 1;
  a = a < 0 ? 0 : (a > sk ? sk : a);
  b = b < 0 ? 0 : (b > sk ? sk : b);
  *lo = (int)a;
  *hi = (int)b;
}

#endif /* FLASHC_CUDA_MMA_TILE_CUH */
