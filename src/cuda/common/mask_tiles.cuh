/* common/mask_tiles.cuh — a boolean attn_mask's blocks, classified once per call so that the kernels skip the blocks
 * it removes whole and read it only where it cuts a block.
 *
 * A padding mask (SDPA's [b, 1, 1, sk] or [b, 1, sq, sk] with the padded keys False) removes whole key blocks past
 * each sequence's length and keeps every other pair but those of one block per row of blocks; a kernel that loaded the
 * mask at every element paid for it in every block (cuda-mma: 0.41–0.52× SDPA given the same mask). A pass before the
 * kernels reads the mask once (the attention kernels would read it once per block otherwise) and writes, for every
 * block of bm rows × bn keys of each plane of the mask, whether it keeps none, all or some of its pairs, and for every
 * row of blocks and every column of blocks the range that keeps any: the forward walks keys [lo, hi) of its row of
 * blocks, the backward's key-block CTAs queries [lo, hi) of their column; inside a range, a block that keeps all of
 * its pairs runs the plain code and only FC_MT_SOME (or NONE inside the range) blocks load mask elements.
 *
 * Planes: the mask's broadcast dims (stride 0) are not repeated: plane (b, h) of the call reads plane
 * (b if stride[0] else 0, h if stride[1] else 0), and with stride[2] = 0 every row of blocks is the same (one row of
 * blocks is kept: qi = 0). A float bias has no tiles (every block adds it). Pairs outside the problem (rows ≥
 * seqlen_q, keys ≥ seqlen_k: a block at the edge) do not count: a block whose pairs inside are all kept is ALL. */
#ifndef FLASHC_CUDA_COMMON_MASK_TILES_CUH
#define FLASHC_CUDA_COMMON_MASK_TILES_CUH

#include "common/common.cuh"

#include <stdint.h>

enum { FC_MT_NONE = 0, FC_MT_ALL = 1, FC_MT_SOME = 2 };

/* The tiles of one call at one block shape, in device memory (the call's workspace), as the kernels take them. */
typedef struct fc_mask_tiles {
  const uint8_t *cls;    /* [planes_b][planes_h][nqi][nkb]: FC_MT_* of each block */
  const int2 *row_range; /* [planes_b][planes_h][nqi]: key blocks [x, y) that keep any pair (x = y: none) */
  const int2 *col_range; /* [planes_b][planes_h][nkb]: query blocks [x, y) that keep any pair (x = y: none) */
  int bm, bn;            /* rows and keys per block */
  int nqb, nkb;          /* blocks: ⌈seqlen_q / bm⌉, ⌈seqlen_k / bn⌉ */
  int nqi;               /* rows of blocks stored: nqb, or 1 where the mask's query stride is 0 */
  int planes_h;          /* heads stored: heads_q, or 1 where the head stride is 0 */
  int per_b, per_h;      /* 1 where the mask has a plane of its own per sequence / per head, else 0 */
} fc_mask_tiles;

/* Index of plane (b, h)'s row of blocks qb in cls / row_range (× nkb for cls). */
static __host__ __device__ __forceinline__ int64_t fc_mask_tiles_row(const fc_mask_tiles &t, int64_t b, int64_t h,
                                                                     int64_t qb) {
  const int64_t plane = (t.per_b ? b : 0) * t.planes_h + (t.per_h ? h : 0);
  return plane * t.nqi + (t.nqi > 1 ? qb : 0);
}
/* Block (qb, kb) of plane (b, h): FC_MT_*. */
static __device__ __forceinline__ int fc_mask_tile(const fc_mask_tiles &t, int64_t b, int64_t h, int qb, int kb) {
  return __ldg(t.cls + fc_mask_tiles_row(t, b, h, qb) * t.nkb + kb);
}
/* The key blocks of plane (b, h)'s row of blocks qb that keep any pair: [lo, hi). */
static __device__ __forceinline__ int2 fc_mask_row_range(const fc_mask_tiles &t, int64_t b, int64_t h, int qb) {
  return t.row_range[fc_mask_tiles_row(t, b, h, qb)];
}
/* Key blocks [*lo, *hi) cut to those of plane (b, h)'s row of blocks qb that keep any pair (left as they are without
 * tiles); none left: *hi = *lo. */
static __device__ __forceinline__ void fc_mask_cut_row(const fc_mask_tiles &t, int64_t b, int64_t h, int qb, int *lo,
                                                       int *hi) {
  if (!t.cls) return;
  const int2 kept = fc_mask_row_range(t, b, h, qb);
  *lo = max(*lo, kept.x);
  *hi = max(*lo, min(*hi, kept.y));
}
/* The query blocks of plane (b, h)'s column of blocks kb that keep any pair: [lo, hi). */
static __device__ __forceinline__ int2 fc_mask_col_range(const fc_mask_tiles &t, int64_t b, int64_t h, int kb) {
  const int64_t plane = (t.per_b ? b : 0) * t.planes_h + (t.per_h ? h : 0);
  return t.col_range[plane * t.nkb + kb];
}

#ifdef __cplusplus
extern "C" {
#endif
/* Workspace bytes that fc_mask_tiles_build needs for problem p at blocks of bm × bn (0 without a boolean mask). */
size_t fc_mask_tiles_bytes(const fc_problem *p, int bm, int bn);
/* Classifies p's boolean attn_mask at blocks of bm × bn into ws (fc_mask_tiles_bytes(p, bm, bn) bytes of device
 * memory, 256-byte aligned) on the call's stream, and fills *t. p must have a boolean attn_mask. */
flashc_status fc_mask_tiles_build(const fc_problem *p, int bm, int bn, void *ws, fc_mask_tiles *t);
#ifdef __cplusplus
}
#endif

#endif /* FLASHC_CUDA_COMMON_MASK_TILES_CUH */
