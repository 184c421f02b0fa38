/* mma/fwd_split.cuh — cuda-mma's forward with the keys split between CTAs (FlashAttention's split-KV, "Flash-
 * Decoding"), for calls whose grid of query tiles would leave most of the GPU idle: decoding (a few query rows
 * against a long cache), or a few heads of a long sequence. Each tile runs as n_splits CTAs (blockIdx.y = part),
 * CTA y walking the y-th of n_splits equal ranges of the tile's visible key blocks; it writes, per query row, its
 * part's O / l (fp32) and lse = scale·m + ln l, and a second kernel combines the parts of each row:
 *
 *   lse = ln Σ_y e^(lse_y);   O = Σ_y e^(lse_y − lse) · O_y
 *
 * exactly the online softmax's merge of two blocks, applied once to n_splits of them. A part that no key of a row
 * reaches has lse_y = −inf and weight 0; a row no part reaches gets O = 0 and lse = −inf, as the one-pass kernel
 * gives. The partials live in the handle's device workspace, laid out by CTA so that the combine needs no mapping
 * from rows to tokens: part y of CTA x, row r of its tile (FC_MMA_BR rows) at (y·gridDim.x + x)·FC_MMA_BR + r, with
 * D floats of O each (D: V's compiled head dim, the kernels' DV). The number of parts depends on the problem and the SM
 * count only: the same bits run to run on one GPU model. */
#ifndef FLASHC_CUDA_MMA_FWD_SPLIT_CUH
#define FLASHC_CUDA_MMA_FWD_SPLIT_CUH

#include "mma/fwd_common.cuh"

/* Part `part` of n_splits of the key blocks [*j_begin, *j_end): equal ranges, the last ones a block shorter. */
static __device__ __forceinline__ void fc_fwd_split_range(int n_splits, int part, int *j_begin, int *j_end) {
  const int n = *j_end - *j_begin, per = n / n_splits, extra = n % n_splits;
  const int first = *j_begin + part * per + min(part, extra);
  *j_begin = first;
  *j_end = first + per + (part < extra ? 1 : 0);
}

/* The end of a part's CTA (instead of fc_fwd_finish): O / l and lse of this part for each of the thread's rows
 * that lies in the sequence; l = 0 (no key of this part visible): O 0, lse −inf. */
template <int D, int MT>
static __device__ __forceinline__ void fc_fwd_finish_split(const fc_mma_fwd_args &a, int sq, int i0, int wrow,
                                                           const float (*o)[D / 8][4], const float (*m)[2],
                                                           const float (*l)[2], int lane) {
  const int g = lane / 4, t = lane % 4;
  const int64_t tile_row0 = ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * FC_MMA_BR;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      const float lr = fc_fwd_quad_sum(l[mt][rh]);
      const int r = wrow + 16 * mt + g + 8 * rh;
      if (i0 + r >= sq) continue;
      const float inv = m[mt][rh] != -INFINITY ? 1.0f / lr : 0.0f;
      float *to = a.split_o + (tile_row0 + r) * D;
#pragma unroll
      for (int x = 0; x < D / 8; x++)
        *(float2 *)(to + 8 * x + 2 * t) = make_float2(o[mt][x][2 * rh] * inv, o[mt][x][2 * rh + 1] * inv);
      if (t == 0) a.split_lse[tile_row0 + r] = fc_fwd_row_lse(m[mt][rh], lr, a.scale);
    }
}

enum { FC_SPLIT_COMBINE_THREADS = 128, FC_SPLIT_MAX = 64 };

/* The combine: one CTA per tile of the split kernel's grid (the same blockIdx.x, so fc_fwd_locate names the same
 * rows), a warp per row, the lanes over the head dim's columns. */
template <typename T, int D>
__global__ void __launch_bounds__(FC_SPLIT_COMBINE_THREADS) fc_mma_fwd_combine_kernel(const fc_mma_fwd_args a) {
  const fc_fwd_where w = fc_fwd_locate(a);
  const int i0 = w.mb * FC_MMA_BR;
  if (i0 >= w.sq) return; /* the split kernel's CTAs of this tile returned as well: no partials */
  const int rows = min(FC_MMA_BR, w.sq - i0), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t parts = a.n_splits, ctas = gridDim.x;
  uint16_t *O = a.o + w.b * a.o_sb + w.q_start * a.o_ss + (int64_t)w.h * a.o_sh;
  for (int r = warp; r < rows; r += FC_SPLIT_COMBINE_THREADS / 32) {
    const int64_t at = (int64_t)blockIdx.x * FC_MMA_BR + r; /* row r of part 0; part y is y·ctas·Br further */
    float mx = -INFINITY;
    for (int y = 0; y < parts; y++) mx = fc_fmax_nan(mx, a.split_lse[at + y * ctas * FC_MMA_BR]); /* NaN stays */
    float sum = 0.0f;
    if (mx != -INFINITY)
      for (int y = 0; y < parts; y++) sum += expf(a.split_lse[at + y * ctas * FC_MMA_BR] - mx);
    const float lse = mx == -INFINITY ? -INFINITY : mx + logf(sum);
    const int row = i0 + r;
    for (int c = lane; c < a.head_dim_v; c += 32) { /* O's columns: V's head dim */
      float acc = 0.0f;
      if (mx != -INFINITY)
        for (int y = 0; y < parts; y++) {
          const float ly = a.split_lse[at + y * ctas * FC_MMA_BR];
          if (ly != -INFINITY) acc += expf(ly - lse) * a.split_o[(at + y * ctas * FC_MMA_BR) * D + c];
        }
      O[(int64_t)row * a.o_ss + c] = fc_from_float<T>(acc);
    }
    if (a.lse && lane == 0) {
      const int64_t l_at =
          a.cu_q ? (int64_t)w.h * a.total_q + w.q_start + row : ((int64_t)w.b * a.heads_q + w.h) * a.seqlen_q + row;
      a.lse[l_at] = lse;
    }
  }
}

#endif /* FLASHC_CUDA_MMA_FWD_SPLIT_CUH */
