/* hopper/sched.cuh — the tile schedule of cuda-hopper's persistent forward (hopper/fwd_persistent.cuh; the persistent
 * backward walks it too, hopper/bwd_kernel.cuh): which (query block, head, sequence) tile the k-th loop trip of each
 * CTA works on.
 *
 * The grid is one CTA per SM; CTA x takes tiles x, x + grid, x + 2·grid, ... of one linear order (a static
 * schedule: no counter to reset between calls, and producer and consumers of a CTA derive the same tiles
 * without talking). The order, after the FlashAttention-3 paper's longest-processing-time-first scheduler:
 *
 *   tile t → head group  G  = t / (group_bh · m_blocks)        (group_bh (sequence, head) pairs whose K and V
 *            within     w  = t % (group_bh · m_blocks)          together fit in a share of L2)
 *            query block mb = m_blocks − 1 − w / size(G)        (the last query block first: with a causal mask
 *            pair       bh = G · group_bh + w % size(G)          or a right window it sees the most keys)
 *
 * so that the CTAs running at once work on the same few heads (their K, V stay in L2) and, within a group,
 * every head's heaviest causal blocks come first and the light ones fill the tail. Full attention loses
 * nothing by it: all its tiles weigh the same.
 *
 * Which CTA takes which position of that order (hopper/fwd.cu's fc_hp_fwd_plan picks): stride, CTA x the positions x,
 * x + grid, x + 2·grid, ..., or dynamic (below). The CTAs walk `slots` slots and skip a slot whose position is past
 * the last tile. (snake, round r walked forwards in even rounds and backwards in odd ones, lost to dynamic and is no
 * longer chosen: docs/experiments.md. Its field and fc_hp_slot_tile's branch stay until the backward, which shares
 * this struct, drops its argument to fc_hp_sched_for_grid; the forward's kernels keep their code as measured.)
 *
 * Or dynamic (FlashAttention-3's persistent scheduler): CTA x takes position x first, then each CTA's producer
 * claims the next free position with an atomicAdd on a counter zeroed before the launch (position grid + the
 * counter's old value) when it has issued the last load of its current tile, and hands it to its consumers through
 * a ring in shared memory (hopper/fwd_persistent.cuh). Greedy LPT: the CTA that finishes first takes the next heaviest
 * tile, and the CTAs running at once still hold consecutive positions of the order, inside the same L2 group. */
#ifndef FLASHC_CUDA_HOPPER_SCHED_CUH
#define FLASHC_CUDA_HOPPER_SCHED_CUH

#include "hopper/ptx.cuh"

#include <stdint.h>

typedef struct fc_hp_sched {
  int64_t slots;  /* what the CTAs walk: tiles (stride, dynamic) or tiles rounded up to a multiple of grid (snake) */
  int32_t *claim; /* dynamic: the claim counter (device workspace, zeroed before each launch); NULL: static orders */
  int grid;       /* CTAs (the launch's, set by fc_hp_sched_for_grid) */
  int snake;      /* 1: snake order, 0: stride */
  int tiles;      /* m_blocks · bh_total (≤ 2^31 − 1: the host checks) */
  int m_blocks;   /* query blocks per (sequence, head) */
  int bh_total;   /* sequences · heads_q */
  int group_bh;   /* (sequence, head) pairs per L2 group, 1 .. bh_total */
  /* The split last rounds (stream-K; fc_hp_sched_split): slots [0, slots) walk whole tiles as above, then CTA x works
   * on key-block units [split_u0 + x·split_units / grid, split_u0 + (x + 1)·split_units / grid) of the tiles after
   * them (unit u: key block u % n_kb of tile u / n_kb). split_units = 0: none. */
  int64_t split_u0, split_units;
  int n_kb;            /* key blocks per tile (every tile the same: no mask, no varlen) */
  float *split_part;   /* per (CTA, consumer warpgroup): the partial O, m, l of the tile it starts in (fp32) */
  int32_t *split_flag; /* per (CTA, consumer warpgroup): 1 once its partial is written; its reader resets it */
} fc_hp_sched;

/* The L2 budget a group's K and V may take with a causal mask. Measured with ncu on the H100
 * (bench/results/configs/hopper-fwd-l2-groups-2026-11-23.txt): with 24 MB, about half of
 * the 50 MB, the persistent forward read 1.4–2.6× the compulsory bytes from DRAM (K and V evicted before the group's
 * last query block read them: H100's L2 is two halves that mirror lines read from both, and Q, O stream through
 * it too) and spent 3–6 % more energy per FLOP, which the H100's power cap turns into time; with 8 MB it reads
 * each byte once. Without a mask every tile weighs the same and a group buys nothing: one pair per group
 * (group_bytes 0), query blocks fastest, the order of the one-tile grid. */
#define FC_HP_L2_GROUP_BYTES ((int64_t)8 << 20)

/* The schedule of a problem: kv_bytes_per_bh = the K and V bytes one (sequence, head) pair reads. GQA shares K
 * and V among `group` query heads, so a group holds that many more pairs for the same bytes. group_bytes: the
 * group's budget (FC_HP_L2_GROUP_BYTES), ≤ 0 for one pair per group. */
static inline fc_hp_sched fc_hp_make_sched(int m_blocks, int bh_total, int64_t kv_bytes_per_bh, int group,
                                           int64_t group_bytes) {
  fc_hp_sched s;
  s.tiles = (int)((int64_t)m_blocks * bh_total);
  s.m_blocks = m_blocks;
  s.bh_total = bh_total;
  int64_t g = kv_bytes_per_bh > 0 ? group_bytes / kv_bytes_per_bh * (group > 0 ? group : 1) : bh_total;
  if (g < 1) g = 1;
  if (g > bh_total) g = bh_total;
  s.group_bh = (int)g;
  s.grid = 1, s.snake = 0, s.slots = s.tiles;
  s.claim = NULL;
  s.split_u0 = 0, s.split_units = 0, s.n_kb = 0;
  s.split_part = NULL, s.split_flag = NULL;
  return s;
}

/* The schedule as a grid of `grid` CTAs walks it, in snake order or not. */
static inline fc_hp_sched fc_hp_sched_for_grid(fc_hp_sched s, int grid, int snake) {
  s.grid = grid > 0 ? grid : 1;
  s.snake = snake;
  s.slots = snake ? (s.tiles + (int64_t)s.grid - 1) / s.grid * s.grid : s.tiles;
  return s;
}

/* Stream-K for the last rounds (hopper/fwd.cu's fc_hp_fwd_plan takes it; tiles of equal weight only: no mask, no
 * varlen, the stride order). A grid of equal tiles on `grid` SMs ends with a partial round: 2048 tiles of d128
 * take 15.5 rounds on 132 SMs, so half the SMs idle for the last tile's time (3 % of the call;
 * tools/profile/grid_order_model.py). Here the rounds but the last whole one and the partial one stay whole tiles; the
 * remaining tiles' key blocks are cut into `grid` equal ranges, one per CTA after its whole tiles. A range covers at
 * least one tile's worth of key blocks, so a tile is cut at most once: the head part (key blocks 0 .. e − 1) ends CTA
 * x's range, the tail part (e .. n_kb − 1) starts CTA x + 1's. CTA x + 1 writes its tail part's unnormalised O, m and l
 * (split_part) right after its whole tiles and raises its flag; CTA x merges them into its head part at its very end,
 * normally long after. A CTA only waits for one with a larger index, which the hardware starts no later: no cycle of
 * waits even when fewer CTAs than the grid run at once. n_kb: key blocks per tile (≥ 2); false: not worth it (no
 * partial round, or fewer tiles than CTAs). */
static inline bool fc_hp_sched_split(fc_hp_sched *s, int n_kb) {
  if (s->snake || s->claim || n_kb < 2 || s->tiles <= s->grid || s->tiles % s->grid == 0) return false;
  const int64_t whole = ((int64_t)s->tiles / s->grid - 1) * s->grid; /* tiles walked whole */
  s->slots = whole;
  s->n_kb = n_kb;
  s->split_u0 = whole * n_kb;
  s->split_units = ((int64_t)s->tiles - whole) * n_kb;
  return true;
}

/* The position in the order of this CTA's slot `slot` (slot = blockIdx.x + k·grid); ≥ tiles: nothing to do. */
static __host__ __device__ __forceinline__ int64_t fc_hp_slot_tile(const fc_hp_sched &s, int64_t slot) {
  if (!s.snake) return slot;
  const int64_t r = slot / s.grid, x = slot - r * s.grid;
  return r * s.grid + ((r & 1) ? s.grid - 1 - x : x);
}

/* Tile t of the schedule: its query block *mb and (sequence, head) pair *bh (b = bh / heads_q, h = bh % heads_q).
 * 32-bit: every intermediate is below tiles ≤ 2^31 − 1. */
static __host__ __device__ __forceinline__ void fc_hp_tile_at(const fc_hp_sched &s, int t, int *mb, int *bh) {
  const int per_group = s.group_bh * s.m_blocks;
  const int group = t / per_group, w = t - group * per_group;
  const int first = group * s.group_bh;
  const int size = s.bh_total - first < s.group_bh ? s.bh_total - first : s.group_bh;
  const int row = w / size;
  *mb = s.m_blocks - 1 - row;
  *bh = first + (w - row * size);
}

/* ---- the dynamic order: positions handed from the producer to the consumers (the forward's persistent kernel,
 * hopper/fwd_persistent.cuh, and the backward's, hopper/bwd_kernel.cuh) ------------------------------------------ */
/* Entries of the dynamic order's tile ring: the position claimed after tile f goes to entry f % FC_HP_TILE_RING. */
enum { FC_HP_TILE_RING = 2 };
#if FC_HOPPER_ARCH
/* The tile ring at `ring`: tile_full [FC_HP_TILE_RING], tile_empty [FC_HP_TILE_RING], then the positions. */
#define FC_HP_TILE_FULL(e)  (ring + 8u * (e))
#define FC_HP_TILE_EMPTY(e) (ring + 8u * (FC_HP_TILE_RING + (e)))
#define FC_HP_TILE_POS(e)   (ring + 16u * FC_HP_TILE_RING + 4u * (e))

/* Dynamic order: the position after this CTA's current tile (grid + the counter's old value: positions 0 .. grid − 1
 * are the CTAs' first tiles), −1 once the order is exhausted. The counter ends at `tiles` (one claim per tile past the
 * first grid, one failed claim per CTA): no overflow. Through a shuffle (one thread alone): a value ptxas can keep in
 * uniform registers, as the static orders' slots are, so that the tile set-up fits the producer's 24 registers. */
static __device__ __forceinline__ int64_t fc_hp_claim_position(const fc_hp_sched &sc) {
  const int64_t next = (int64_t)gridDim.x + atomicAdd(sc.claim, 1);
  return __shfl_sync(1u, next < sc.tiles ? (int)next : -1, 0);
}

/* Dynamic order, the producer (the persistent backward): claims the position after its tile `fill` and publishes it
 * in the ring (−1: none left). Fill f ≥ FC_HP_TILE_RING of an entry waits for the consumers' release of fill
 * f − FC_HP_TILE_RING (its empty barrier's phase f / FC_HP_TILE_RING − 1). The store is ordered before the arrival
 * (mbarrier.arrive releases, the consumers' try_wait acquires). */
static __device__ __forceinline__ int64_t fc_hp_claim(const fc_hp_sched &sc, uint32_t ring, uint32_t fill) {
  const int64_t next = fc_hp_claim_position(sc);
  const uint32_t e = fill % FC_HP_TILE_RING, u = fill / FC_HP_TILE_RING;
  if (u > 0) fc_mbar_wait(FC_HP_TILE_EMPTY(e), (u - 1) & 1);
  fc_st_shared_u32(FC_HP_TILE_POS(e), (uint32_t)next); /* −1: 0xffffffff */
  fc_mbar_arrive_if(FC_HP_TILE_FULL(e), true);
  return next;
}

/* Dynamic order, a consumer warp: the position published after its tile `use` (−1: no more). Lane 0 reads it and
 * shuffles it to the warp (a value provably the same in every lane), then releases the entry: the read is done
 * before the arrival that lets the producer overwrite it. */
static __device__ __forceinline__ int64_t fc_hp_take(uint32_t ring, uint32_t use, int lane) {
  const uint32_t e = use % FC_HP_TILE_RING;
  fc_mbar_wait(FC_HP_TILE_FULL(e), (use / FC_HP_TILE_RING) & 1);
  int pos = 0;
  if (lane == 0) asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(pos) : "r"(FC_HP_TILE_POS(e)) : "memory");
  pos = __shfl_sync(0xffffffffu, pos, 0);
  fc_mbar_arrive_if(FC_HP_TILE_EMPTY(e), lane == 0);
  return pos;
}
#endif /* FC_HOPPER_ARCH */

#endif /* FLASHC_CUDA_HOPPER_SCHED_CUH */
