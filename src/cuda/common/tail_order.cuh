/* common/tail_order.cuh — which tile each CTA of a one-CTA-per-tile grid takes, where a mask makes the tiles of one
 * (sequence, head) pair differ in length: cuda-mma's and cuda-hopper's dK/dV kernels (a tile: a key block of a
 * (sequence, kv head) pair) and their one-tile forwards (a query block of a (sequence, query head) pair).
 *
 * Each pair's tiles are numbered heaviest first (under a causal mask: key block 0 in the backward, the last query
 * block in the forward). CTAs below tail_from·n_blocks take tile x % n_blocks of pair x / n_blocks: the tiles of a
 * pair run at about the same time, sharing its K/V (forward) or Q_i, dO_i and dQ_i rows (backward) in L2 (H100,
 * 2026-11-23: orders that spread the CTAs at work over many pairs lost 2..37 % to L2 misses). The last pairs, from
 * tail_from on, go tile by tile instead: tile 0 of each, then tile 1 of each, ... In the pair-by-pair order the grid's
 * last heavy tiles start while the other SMs run out of work (tools/profile/grid_order_model.py: 5.3..6.7 % idle at
 * d128 causal 2k-8k on 132 SMs, backward); in this order the grid ends on its lightest tiles (1.1..1.3 % with two
 * waves). Within a pair the tiles still start in order, which cuda-hopper's deterministic dQ turns need to make
 * progress. */
#ifndef FLASHC_CUDA_TAIL_ORDER_CUH
#define FLASHC_CUDA_TAIL_ORDER_CUH

#include "common/common.cuh"

/* This CTA's tile *blk (0: the pair's heaviest) and pair *bh. 32-bit: the grid is below 2^31 CTAs (fc_mma_grid), and
 * 64-bit divisions would add a call and a stack frame. */
static __device__ __forceinline__ void fc_tail_tile_of_cta(int n_blocks, int n_pairs, int tail_from, int *blk,
                                                           int64_t *bh) {
  const uint32_t x = blockIdx.x, nb = (uint32_t)n_blocks, split = (uint32_t)tail_from * nb;
  if (x < split || tail_from >= n_pairs) { /* the second: arguments left zero mean the plain order */
    *blk = (int)(x % nb), *bh = x / nb;
    return;
  }
  const uint32_t tail = (uint32_t)(n_pairs - tail_from);
  *blk = (int)((x - split) / tail), *bh = tail_from + (x - split) % tail;
}

/* tail_from for a grid of n_pairs × n_blocks CTAs of `kernel` (threads, smem: its launch), as many resident per SM as
 * the occupancy calculator says (kernel NULL: one): the last FC_TAIL_WAVES waves of CTAs take the tile-by-tile order,
 * where a right mask edge (causal) makes the tiles unequal. Two waves: the list-scheduling model leaves 0.5-1.3 %
 * idle with them, up to 2.5 % with one (tools/profile/grid_order_model.py); against the pair-by-pair order, causal,
 * steady state: backward +2.0..3.4 % (bench/results/configs/hopper-bwd-tail-2026-11-23.txt), forward +2.9..7.4 %
 * (cuda-mma) and +3.7..5.1 % (cuda-hopper's one-tile kernel at d256; configs/tail-fwd-2026-11-23.txt). Other wave
 * counts were a switch until d79fa1c. The occupancy query only where the order applies: an unmasked call asks
 * nothing of the runtime. */
enum { FC_TAIL_WAVES = 2 };
static inline flashc_status fc_tail_from(const fc_problem *p, int n_blocks, int n_pairs, const void *kernel,
                                         int threads, size_t smem, int *tail_from) {
  const int waves = FC_TAIL_WAVES;
  *tail_from = n_pairs;
  /* tiles of one length (or no grid): the L2-friendly order alone */
  if (p->window_right < 0 || n_blocks < 1 || n_pairs < 1) return FLASHC_OK;
  int ctas_per_sm = 1;
  if (kernel) FC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, threads, smem));
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  const int64_t ctas = (int64_t)waves * props.num_sms * (ctas_per_sm > 1 ? ctas_per_sm : 1);
  const int64_t tail = fc_cdiv(ctas, n_blocks);
  *tail_from = tail >= n_pairs ? 0 : n_pairs - (int)tail;
  return FLASHC_OK;
}

#endif /* FLASHC_CUDA_TAIL_ORDER_CUH */
