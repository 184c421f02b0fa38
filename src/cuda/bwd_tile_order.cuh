/* bwd_tile_order.cuh — which (key block, pair) tile each CTA of a key-block-parallel backward grid takes: cuda-mma's
 * and cuda-hopper's dK/dV kernels (one CTA per key block of Bc keys of one (sequence, kv head) pair).
 *
 * CTAs below tail_from·n_blocks take key block x % n_blocks of pair x / n_blocks: every key block of a pair runs at
 * about the same time, sharing its Q_i, dO_i and dQ_i rows in L2 (session 10: the orders that spread the CTAs at
 * work over many pairs lost 2..37 % to L2 misses). The last pairs, from tail_from on, go key block by key block
 * instead: key block 0 of each, then key block 1 of each, ... With a right mask edge (causal) key block 0 is a pair's
 * heaviest tile and its last key block the lightest, so in the key-block-fastest order the grid's last heavy tiles
 * start while the other SMs run out of work (tools/profile/grid_order_model.py: 5.3..6.7 % idle at d128 causal
 * 2k-8k on 132 SMs); in this order the grid ends on its lightest tiles (1.1..1.3 % idle with two waves). Within a
 * pair the key blocks still start in ascending order, which cuda-hopper's deterministic dQ turns need. */
#ifndef FLASHC_CUDA_BWD_TILE_ORDER_CUH
#define FLASHC_CUDA_BWD_TILE_ORDER_CUH

#include "common.cuh"

/* This CTA's key block *jb and pair *bh (= sequence · heads_kv + kv head). 32-bit: the grid is below 2^31 CTAs
 * (fc_mma_grid), and 64-bit divisions would add a call and a stack frame. */
static __device__ __forceinline__ void fc_bwd_tile_of_cta(int n_blocks, int n_pairs, int tail_from, int *jb,
                                                          int64_t *bh) {
  const uint32_t x = blockIdx.x, nb = (uint32_t)n_blocks, split = (uint32_t)tail_from * nb;
  if (x < split) {
    *jb = (int)(x % nb), *bh = x / nb;
    return;
  }
  const uint32_t tail = (uint32_t)(n_pairs - tail_from); /* > 0 here */
  *jb = (int)((x - split) / tail), *bh = tail_from + (x - split) % tail;
}

/* tail_from for a grid of n_pairs × n_blocks CTAs, ctas_per_sm resident per SM. FLASHC_BWD_TAIL: how many waves of
 * CTAs at the grid's end take the key-block-by-key-block order, where a right mask edge makes the tiles unequal:
 * 2 (unset), or 0 (off: key block fastest everywhere), 1, 3, 4 (the model: 1 wave leaves up to 2.5 % idle). */
static inline flashc_status fc_bwd_tail_from(const fc_problem *p, int n_blocks, int n_pairs, int ctas_per_sm,
                                             int *tail_from) {
  static const char *const names[] = {"0", "1", "2", "3", "4"};
  int waves = 2;
  FC_CHECK(
      fc_env_choice("FLASHC_BWD_TAIL", names, (int)(sizeof names / sizeof names[0]), 2, "flashc_backward", &waves));
  *tail_from = n_pairs;
  /* tiles of one length (or no grid): the L2-friendly order alone */
  if (waves == 0 || p->window_right < 0 || n_blocks < 1 || n_pairs < 1) return FLASHC_OK;
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  const int64_t ctas = (int64_t)waves * props.num_sms * (ctas_per_sm > 1 ? ctas_per_sm : 1);
  const int64_t tail = fc_cdiv(ctas, n_blocks);
  *tail_from = tail >= n_pairs ? 0 : n_pairs - (int)tail;
  return FLASHC_OK;
}

#endif /* FLASHC_CUDA_BWD_TILE_ORDER_CUH */
