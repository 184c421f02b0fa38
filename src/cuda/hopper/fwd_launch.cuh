/* hopper/fwd_launch.cuh — cuda-hopper forward's kernels and launches (hopper/fwd.cu says what they compute and holds
 * the plan), shared by the files that instantiate them: hopper/fwd.cu the plain kernels, hopper/fwd_score_mod.cu those
 * with softcap, ALiBi and attn_mask (SCORE_MOD), hopper/fwd_dropout.cu those with dropout too (DROP), so that the
 * three compile side by side: in one file they were the longest single-architecture compile of the build. */
#ifndef FLASHC_CUDA_HOPPER_FWD_LAUNCH_CUH
#define FLASHC_CUDA_HOPPER_FWD_LAUNCH_CUH

#include "common/common.cuh"
#include "hopper/bwd_api.cuh"
#include "hopper/gemm.cuh"
#include "hopper/ptx.cuh"
#include "hopper/sched.cuh"
#include "hopper/score_mod.cuh"
#include "hopper/tma.cuh"
#include "hopper/trace.cuh"
#include "hopper/wgmma.cuh"
#include "mma/host.cuh"
#include "mma/ptx.cuh"
#include "common/tail_order.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  FC_HP_BR = 128,               /* query rows per CTA: 2 consumer warpgroups × 64 */
  FC_HP_BC = 128,               /* keys per block */
  FC_HP_BC_D256 = 80,           /* keys per block of D = 256 (registers: O 128 + S 40 + 2 P 20) */
  FC_HP_THREADS = 384,          /* producer + 2 consumer warpgroups */
  FC_HP_CONSUMER_WARPS = 8,     /* arrivals that release a stage */
  FC_HP_ROW_BYTES = 128,        /* one swizzled row: 64 16-bit elements */
  FC_HP_HALF_BYTES = 128 * 128, /* one 64-column half of a 128-row tile */
  FC_HP_REGS_PRODUCER = 24,     /* setmaxnreg: 128·24 + 256·240 = 64512 ≤ 65536 */
  FC_HP_REGS_CONSUMER = 240,
  FC_HP_BASE_SLACK = 8,   /* the softmax's base moves once a row's max passes it by 2^8 (fc_hp_softmax_f32) */
  FC_HP_BAR_EPILOGUE = 1, /* named barriers 1, 2: one consumer warpgroup each */
  FC_HP_BAR_TURN = 3,     /* named barriers 3, 4: consumer c may issue its GEMMs */
  /* The persistent kernel at D = 64 (tmastore3): 3 consumer warpgroups, Br = 192, Bc = 128, 512 threads; 128·24 +
   * 384·160 = 64512 ≤ 65536 (S 64 + O 32 + P 32 registers fit in 160, R151 the highest). Named barriers 1, 2, 3 for the
   * epilogues, 4, 5, 6 for the turns (FC_HP_BAR_EPILOGUE + NC + c). */
  FC_HP_REGS_CONSUMER_NC3 = 160, /* the producer keeps FC_HP_REGS_PRODUCER */
};

typedef struct fc_hopper_fwd_args {
  uint16_t *o;
  float *lse; /* NULL: not wanted */
  int64_t o_sb, o_ss, o_sh;
  const int32_t *cu_q, *cu_k;   /* device copies of cu_seqlens, or NULL (dense) */
  const int32_t *end_q, *end_k; /* varlen: where each sequence's rows end (mma/host.cuh: seqused) */
  int seqlen_q, seqlen_k;       /* dense sizes */
  int64_t total_q;              /* varlen lse row stride */
  int heads_q, group;           /* group = heads_q / heads_kv */
  int head_dim;                 /* O's columns: V's head dim (Q's and K's columns past theirs are TMA's zeros) */
  int m_blocks;
  int n_pairs;      /* the one-tile kernels' grid: (sequence, query head) pairs, batch·heads_q */
  int tail_from;    /* the first pair walked query block by query block (common/tail_order.cuh) */
  float scale;      /* > 0 (supports refuses a negative one) */
  float scale_log2; /* scale·log2(e): exponent of S in base 2 */
  int64_t window_left, window_right, mask_offset;
  int bottom_right;
  int o_aligned;  /* rows of o start on 16-byte boundaries: 16-byte stores */
  int own_blocks; /* 1: each consumer warpgroup stops at its own last visible key block (fc_hp_own_blocks) */
  int align_end;  /* the persistent kernel's query blocks end at the sequence's last row (fc_hp_tile_setup) */
  int q_slots;    /* the persistent kernel's Q buffers in use: always 2 (fc_hp_fwd_plan) */
  /* seqused: the sequences' own maps (hopper/tma.cuh, fc_hp_seq_maps), [b][q, k, v, -], at cu_q + seq_maps_at bytes
   * (the workspace, after the offsets: fc_hp_seq_maps_of); 0: the call's maps */
  int seq_maps_at;
} fc_hopper_fwd_args;

#if FC_HOPPER_ARCH
/* Visible keys of query row i: [*lo, *hi), clipped to [0, sk] (empty when *lo >= *hi). */
static __device__ __forceinline__ void fc_hp_row_keys(int64_t i, int64_t shift, int64_t wl, int64_t wr, int sk, int *lo,
                                                      int *hi) {
  const int64_t d = i + shift;
  int64_t a = wl < 0 ? 0 : d - wl, b = wr < 0 ? sk : d + wr + 1;
  a = a < 0 ? 0 : (a > sk ? sk : a);
  b = b < 0 ? 0 : (b > sk ? sk : b);
  *lo = (int)a;
  *hi = (int)b;
}

static __device__ __forceinline__ int64_t fc_hp_floor_div(int64_t a, int64_t b) { return a / b - (a % b < 0); }

/* seqused: the sequences' own maps (fc_hp_seq_maps), NULL without. */
static __device__ __forceinline__ const CUtensorMap *fc_hp_seq_maps_of(const fc_hopper_fwd_args &a) {
  return a.seq_maps_at ? (const CUtensorMap *)((const char *)a.cu_q + a.seq_maps_at) : nullptr;
}

/* The map that a copy of operand i (0 q, 1 k, 2 v) goes through: the call's (tm), or under seqused (sb = the
 * sequence, ≥ 0) the sequence's own (hopper/tma.cuh, fc_hp_seq_maps: the same coordinates, zeros past its used rows).
 * Worked out where each copy is issued, from the parameters and one 32-bit register, so that the producer's 24
 * registers hold nothing more between copies (b kept live as 64 bits: the plain persistent kernels spilled). */
static __device__ __forceinline__ const CUtensorMap *fc_hp_map(const CUtensorMap *seq_maps, int sb, int i,
                                                               const CUtensorMap *tm) {
  return sb >= 0 ? seq_maps + 4 * sb + i : tm;
}
/* seqused: sequence b's maps acquired for the copy engine and prefetched, before a tile's first copy; the sb of
 * fc_hp_map (−1 without seqused). */
static __device__ __forceinline__ int fc_hp_acquire_seq_maps(const CUtensorMap *seq_maps, int64_t b) {
  if (!seq_maps) return -1;
#pragma unroll
  for (int i = 0; i < 3; i++) {
    fc_tma_acquire_map(seq_maps + 4 * b + i);
    fc_tma_prefetch_map(seq_maps + 4 * b + i);
  }
  return (int)b; /* < batch ≤ 2^31 − 1 (fc_mma_grid) */
}

/* The key blocks of a tile that one consumer warpgroup needs, counted from the tile's first (j_begin): up to the
 * block holding the last key its last row sees, at least 1 and at most the tile's n_blocks. Past them every key is
 * masked for all 64 of its rows (a causal or right-window edge runs down the tile), so their S would be all −inf, P
 * all 0, and m, l, O unchanged: the warpgroup skips their GEMMs and softmax and only keeps the turns and the stage
 * hand-overs (the consumers' dummy trips). The tile's blocks run to its last row's edge, the first warpgroups'
 * blocks end earlier where the edge crosses a block boundary inside the tile: Br = 192 with Bc = 128 (the persistent
 * kernel at D = 64) skips 1 block of 64 × 128 in 3 of every 6 warpgroup tiles of a causal head (a tenth of the tensor
 * work at seqlen 2048), D = 256's Bc = 80 about 0.8 of a block per 128-row tile, and a bottom-right alignment whose
 * shift is not a multiple of Bc does likewise. Rows past the sequence (the last tile's) need none: 1, the least the
 * loop runs. Warpgroup-uniform (wg_row0 is). */
static __device__ __forceinline__ int fc_hp_own_blocks(const fc_hopper_fwd_args &a, int wg_row0, int sq, int sk,
                                                       int64_t shift, int bc, int j_begin, int n_blocks) {
  if (!a.own_blocks || n_blocks <= 1) return n_blocks;
  if (wg_row0 >= sq || wg_row0 + 63 < 0) return 1;
  int lo, hi;
  fc_hp_row_keys(min(wg_row0 + 63, sq - 1), shift, a.window_left, a.window_right, sk, &lo, &hi);
  const int n = (hi + bc - 1) / bc - j_begin;
  return n < 1 ? 1 : n > n_blocks ? n_blocks : n;
}

/* A warpgroup's 64 rows of O, staged in shared memory at `rows` (swizzled: 16-byte chunk x of row r at half x / 8,
 * `half` bytes apart, byte r·128 + ((x % 8) ^ (r % 8))·16), to o at O (the sequence's row 0): rows row0 + r < sq
 * and columns < head_dim only, whole 16-byte chunks where o allows, element by element otherwise. */
template <int D>
static __device__ __forceinline__ void fc_hp_store_o_rows(const fc_hopper_fwd_args &a, uint16_t *O, uint32_t rows,
                                                          uint32_t half, int row0, int sq, int ct) {
  for (int idx = ct; idx < 64 * (D / 8); idx += 128) {
    const int r = idx / (D / 8), x = idx % (D / 8), row = row0 + r;
    const int cols = min(a.head_dim - 8 * x, 8);
    if (row >= sq || cols <= 0) continue;
    const uint4 v = fc_ld_shared_v4(rows + (x / 8) * half + r * FC_HP_ROW_BYTES + (((x % 8) ^ (r % 8)) << 4));
    uint16_t *to = O + (int64_t)row * a.o_ss + 8 * x;
    if (a.o_aligned && cols == 8) {
      *(uint4 *)to = v;
    } else {
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 8; e++)
        if (e < cols) to[e] = (uint16_t)(w[e / 2] >> (16 * (e % 2)));
    }
  }
}

/* One butterfly stage of a transpose across a quad: this lane sends its pair of words p where `hi`, q where not, to
 * lane ^ mask (whose `hi` is the other: it sends the other pair), and the pair it receives replaces the one it sent. */
static __device__ __forceinline__ void fc_quad_exchange(uint32_t &p0, uint32_t &p1, uint32_t &q0, uint32_t &q1, bool hi,
                                                        int mask) {
  uint32_t x0 = hi ? p0 : q0, x1 = hi ? p1 : q1;
  x0 = __shfl_xor_sync(0xffffffffu, x0, mask);
  x1 = __shfl_xor_sync(0xffffffffu, x1, mask);
  if (hi)
    p0 = x0, p1 = x1;
  else
    q0 = x0, q1 = x1;
}

/* This thread's two rows of O / l (row0, row0 + 8), packed to 16 bits and stored to o at O (the sequence's row 0)
 * straight from registers: rows < sq and columns < head_dim. For the persistent kernel at D = 256, which has no shared
 * memory left to stage them in. The accumulator gives thread t of a quad columns 8x + 2t, 8x + 2t + 1 of each 8-column
 * chunk x; per 4 chunks the quad transposes those words (two butterfly stages of shuffles), so that thread t holds
 * chunk 4G + t whole and stores it as one 16-byte store where o's rows are aligned: a warp's store then writes 64
 * contiguous bytes of each of 8 rows, where 4-byte stores wrote 16 (those lost 3.5-7 %:
 * bench/results/configs/hopper-fwd-d256-persistent-2026-11-29.txt). */
template <typename T, int D>
static __device__ __forceinline__ void fc_hp_store_o_regs(const fc_hopper_fwd_args &a, uint16_t *O,
                                                          const float (&o)[D / 2], const float (&inv)[2], int row0,
                                                          int sq, int t) {
  const bool hi1 = t & 2, hi0 = t & 1;
#pragma unroll
  for (int rh = 0; rh < 2; rh++) {
    const int row = row0 + 8 * rh;
    uint16_t *to = O + (int64_t)row * a.o_ss;
#pragma unroll
    for (int G = 0; G < D / 32; G++) {
      uint32_t w[4]; /* w[j]: columns 8(4G + j) + 2t, + 1 */
#pragma unroll
      for (int j = 0; j < 4; j++)
        w[j] = fc_pack2<T>(o[4 * (4 * G + j) + 2 * rh] * inv[rh], o[4 * (4 * G + j) + 2 * rh + 1] * inv[rh]);
      /* w as row t of a 4 × 4 matrix of the quad; transposed: w[j] = columns 8(4G + t) + 2j, + 1 */
      fc_quad_exchange(w[0], w[1], w[2], w[3], hi1, 2); /* 2 × 2 blocks of words between lanes t, t ^ 2 */
      fc_quad_exchange(w[0], w[2], w[1], w[3], hi0, 1); /* then single words within each block: t, t ^ 1 */
      const int col = 8 * (4 * G + t);
      if (row >= sq || col >= a.head_dim) continue;
      if (a.o_aligned && col + 8 <= a.head_dim) {
        *(uint4 *)(to + col) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
          if (col + e < a.head_dim) to[col + e] = (uint16_t)(w[e / 2] >> (16 * (e % 2)));
      }
    }
  }
}

/* This warp's 16 rows of a warpgroup's 64 rows of O, packed to 16 bits (ob[2x + rh]: columns 8x + 2t, 8x + 2t + 1
 * of row 16·warp + g + 8·rh, the accumulator's layout), into the swizzled rows at `rows` as fc_hp_store_o_rows
 * reads them: one stmatrix.x4 per 16 columns (chunks x, x + 1 of both row halves), D / 16 instructions where 32-bit
 * stores take D / 4 (cuDNN's epilogue stages O so). Lane l gives the address of row l % 8 of matrix l / 8, that is
 * of row 16·warp + 8·(l / 8 % 2) + l % 8, chunk x + l / 16; x is even, so (x % 8 + l / 16) ^ (l % 8) = (x % 8) ^ k. */
template <int D>
static __device__ __forceinline__ void fc_hp_stage_o(uint32_t rows, uint32_t half, const uint32_t (&ob)[D / 4],
                                                     int warp, int lane) {
  const int i = lane % 8, k = (lane / 16) ^ i;
  const uint32_t row = rows + (16 * warp + 8 * (lane / 8 % 2) + i) * FC_HP_ROW_BYTES;
#pragma unroll
  for (int x = 0; x < D / 8; x += 2) {
    const uint32_t r[4] = {ob[2 * x], ob[2 * x + 1], ob[2 * x + 2], ob[2 * x + 3]};
    fc_stmatrix_x4(row + (x / 8) * half + (((x % 8) ^ k) << 4), r);
  }
}

/* O += P·V_j: Bc/16 k-steps of 16 keys; step kb reads rows 16·kb .. 16·kb + 15 of V_j (two 8-row groups, 1024
 * bytes apart), every 64-column half (Bc·128 bytes apart: the leading offset). */
template <typename T, int D, int BC = FC_HP_BC>
static __device__ __forceinline__ void fc_hp_pv(float (&o)[D / 2], const uint32_t (&p)[BC / 16][4], uint32_t v_tile) {
#pragma unroll
  for (int kb = 0; kb < BC / 16; kb++)
    fc_wgmma_rs<T, D>(o, p[kb], fc_wgmma_desc_off(v_tile, kb * 16 * FC_HP_ROW_BYTES, BC * FC_HP_ROW_BYTES, 1024));
}

/* Masks S (keys outside each row's range → −inf), then the online softmax of one block, P in place of S (fp32):
 *   m' = max(m, rowmax S);  alpha = 2^(c·m − c·m');  P = 2^(c·S − c·m');  l = alpha·l + rowsum P
 * except that m, the base of the exponents, moves only when the row's max passes it by more than
 * FC_HP_BASE_SLACK (in units of c·S, base 2): otherwise m' = m and alpha = 1 exactly, P ≤ 2^FC_HP_BASE_SLACK, and
 * the rescale of O is skipped (fc_hp_rescale_if) where no row of the warp moved its base, which after the first
 * block is nearly always (FlashAttention-4's conditional rescale). Exact: O, l and lse share the base, whatever it
 * is, and 2^8 is far inside fp16's range. A row that has seen only masked keys keeps m = −inf and uses 0 as its
 * base, so every exponent is −inf and P = 0. This thread holds columns 8x + 2t, 8x + 2t + 1 of its two rows
 * (rh = 0, 1); the 4 threads t of a row share its max, and each sums only its own columns of l (summed over the 4 at
 * the end). */
/* The max of v[0 .. N) into v[0], as a tree of depth ceil(log2 N) (N need not be a power of 2: D = 256 has 10). A
 * template: each level's bounds must be constants, so that v stays in registers. */
template <int N> static __device__ __forceinline__ void fc_hp_tree_max(float (&v)[N]) {
  if constexpr (N > 1) {
#pragma unroll
    for (int x = 0; x < N / 2; x++) v[x] = fc_fmax_nan(v[x], v[x + (N + 1) / 2]);
    fc_hp_tree_max<(N + 1) / 2>(*(float(*)[(N + 1) / 2]) v);
  }
}

template <int BC = FC_HP_BC>
static __device__ __forceinline__ void fc_hp_softmax_f32(float (&s)[BC / 2], bool mask, int k0, const int (&lo)[2],
                                                         const int (&hi)[2], int t, float c, float (&m)[2],
                                                         float (&l)[2], float (&alpha)[2]) {
  if (mask) {
#pragma unroll
    for (int x = 0; x < BC / 8; x++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int key = k0 + 8 * x + 2 * t + (e & 1), rh = e >> 1;
        if (key < lo[rh] || key >= hi[rh]) s[4 * x + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int rh = 0; rh < 2; rh++) {
    /* The row's max as a tree (depth log2(BC/4), not a chain of BC/4 dependent FMNMX: the exponentials wait for it,
     * and the consumer's chain of S, softmax and P·V sets the loop's pace; tools/hopper/trace.py). */
    float v[BC / 8];
#pragma unroll
    for (int x = 0; x < BC / 8; x++) v[x] = fc_fmax_nan(s[4 * x + 2 * rh], s[4 * x + 2 * rh + 1]);
    fc_hp_tree_max<BC / 8>(v);
    float mx = fc_fmax_nan(m[rh], v[0]);
    mx = fc_fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fc_fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    /* m = −inf: any key seen moves it. A NaN max (fc_fmax_nan: a NaN score) moves it too, so that the row ends
     * NaN, not with the m = −inf of a row that saw no key. */
    const bool move = mx * c > m[rh] * c + FC_HP_BASE_SLACK || mx != mx;
    const float mb = move ? mx : m[rh];
    const float base = mb == -INFINITY ? 0.0f : mb * c;
    alpha[rh] = move ? fc_exp2(m[rh] * c - base) : 1.0f; /* m = −inf: 0, and O, l are still 0 */
    m[rh] = mb;
    float sum = 0.0f;
#pragma unroll
    for (int x = 0; x < BC / 8; x++) {
      s[4 * x + 2 * rh] = fc_exp2(fmaf(s[4 * x + 2 * rh], c, -base));
      s[4 * x + 2 * rh + 1] = fc_exp2(fmaf(s[4 * x + 2 * rh + 1], c, -base));
      sum += s[4 * x + 2 * rh] + s[4 * x + 2 * rh + 1];
    }
    l[rh] = alpha[rh] * l[rh] + sum;
  }
}

/* P packed to 16 bits in the A-fragment layout of the P·V wgmma: the accumulators of S columns 16·kb ..
 * 16·kb + 15 (8-column blocks 2kb, 2kb + 1) are exactly A's registers for k-step kb. */
template <typename T, int BC = FC_HP_BC>
static __device__ __forceinline__ void fc_hp_pack(const float (&s)[BC / 2], uint32_t (&p)[BC / 16][4]) {
#pragma unroll
  for (int kb = 0; kb < BC / 16; kb++) {
    p[kb][0] = fc_pack2<T>(s[8 * kb + 0], s[8 * kb + 1]);
    p[kb][1] = fc_pack2<T>(s[8 * kb + 2], s[8 * kb + 3]);
    p[kb][2] = fc_pack2<T>(s[8 * kb + 4], s[8 * kb + 5]);
    p[kb][3] = fc_pack2<T>(s[8 * kb + 6], s[8 * kb + 7]);
  }
}

/* The whole softmax of one block: P in fp32, then packed. */
template <typename T, int BC = FC_HP_BC>
static __device__ __forceinline__ void fc_hp_softmax(float (&s)[BC / 2], bool mask, int k0, const int (&lo)[2],
                                                     const int (&hi)[2], int t, float c, float (&m)[2], float (&l)[2],
                                                     float (&alpha)[2], uint32_t (&p)[BC / 16][4]) {
  fc_hp_softmax_f32<BC>(s, mask, k0, lo, hi, t, c, m, l, alpha);
  fc_hp_pack<T, BC>(s, p);
}

template <int D> static __device__ __forceinline__ void fc_hp_rescale(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int x = 0; x < D / 8; x++) {
    o[4 * x + 0] *= alpha[0];
    o[4 * x + 1] *= alpha[0];
    o[4 * x + 2] *= alpha[1];
    o[4 * x + 3] *= alpha[1];
  }
}

/* O's rescale, skipped by the whole warp when none of its rows moved its base (alpha = 1: fc_hp_softmax_f32). Called
 * only where no wgmma is in flight: the branch would otherwise make ptxas serialise the pipeline. */
template <int D> static __device__ __forceinline__ void fc_hp_rescale_if(float (&o)[D / 2], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) fc_hp_rescale<D>(o, alpha);
}

/* Block n's softmax beside P_{n−1}·V_{n−1} in flight, the steady state of both forward kernels' consumer loop: the
 * softmax runs in fp32 in S's registers (DROP: the kernel's P∘keep after it); only the pack into P's registers and O's
 * rescale wait for the P·V. The block boundary (`boundary`: true, from a kernel argument) keeps ptxas from hoisting the
 * wait above the softmax (docs/hopper.md). Before 3b1e0c5 the 2 consumers packed the next P into registers of their own
 * before the wait and copied it after; the branch of the conditional rescale made ptxas serialise that loop (C7513),
 * and this one measured the same without it. MARK: the kernel's trace mark once the wait is over. */
template <typename T, int BC, int DV, class Drop, class Mark>
static __device__ __forceinline__ void
fc_hp_softmax_beside_pv(float (&s)[BC / 2], float (&o)[DV / 2], uint32_t (&p)[BC / 16][4], bool mask, int k0,
                        const int (&lo)[2], const int (&hi)[2], int t, float c, float (&m)[2], float (&l)[2],
                        float (&alpha)[2], bool boundary, Drop drop, Mark mark) {
  fc_hp_softmax_f32<BC>(s, mask, k0, lo, hi, t, c, m, l, alpha);
  drop(s);
  fc_block_boundary(boundary);
  fc_wgmma_wait<0>(); /* P_{n−1}·V_{n−1} is done: O may be rescaled, P replaced */
  fc_fence_regs(o);
  fc_fence_regs(p);
  mark();
  fc_hp_pack<T, BC>(s, p);
  fc_hp_rescale_if<DV>(o, alpha);
}
#endif /* FC_HOPPER_ARCH */

template <typename T, int D, int STAGES, int BC = FC_HP_BC, bool SCORE_MOD = false, int DV = D, bool DROP = false>
__global__ void __launch_bounds__(FC_HP_THREADS, 1)
    fc_hopper_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                         const __grid_constant__ CUtensorMap tm_v, const fc_hopper_fwd_args a, const fc_score_mod md) {
  /* md: softcap, ALiBi and attn_mask (hopper/score_mod.cuh), read by the SCORE_MOD kernels only; a parameter of its
   * own after the others, so that the plain kernels' parameters keep their offsets (and their code its bytes) */
#if FC_HOPPER_ARCH
  /* DV: V's and O's columns (V's head dim of its own, fc_hp_fwd_plan_of); D everywhere else */
  constexpr int HALVES = D / 64, HALVES_V = DV / 64;
  constexpr int NC = 2, BR = FC_HP_BR, CONSUMER_WARPS = FC_HP_CONSUMER_WARPS, BAR_TURN = FC_HP_BAR_TURN;
  constexpr uint32_t Q_BYTES = BR * D * 2, KV_BYTES = BC * D * 2, V_BYTES = BC * DV * 2,
                     Q_HALF_BYTES = BR * FC_HP_ROW_BYTES;
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  /* The swizzle pattern repeats every 1024 bytes of address, for TMA and wgmma alike: align by hand (the
   * launch adds 1024 bytes of slack), whatever the toolchain gives the dynamic block. */
  const uint32_t sQ = (fc_smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t sK = sQ + Q_BYTES, sV = sK + STAGES * KV_BYTES, bars = sV + STAGES * V_BYTES;
  const uint32_t q_full = bars;
#define FULL_K(s)  (bars + 8u * (1 + (s)))
#define FULL_V(s)  (bars + 8u * (1 + STAGES + (s)))
#define EMPTY_K(s) (bars + 8u * (1 + 2 * STAGES + (s)))
#define EMPTY_V(s) (bars + 8u * (1 + 3 * STAGES + (s)))

  /* Which tile: row blocks vary fastest (CTAs running together share K and V in L2), the heaviest causal
   * block of each head first, the last pairs row block by row block (common/tail_order.cuh: a short tail). */
  int blk;
  int64_t bh;
  fc_tail_tile_of_cta(a.m_blocks, a.n_pairs, a.tail_from, &blk, &bh);
  const int mb = a.m_blocks - 1 - blk;
  const int h = (int)(bh % a.heads_q);
  const int64_t b = bh / a.heads_q;
  int q_start = 0, k_start = 0, sq = a.seqlen_q, sk = a.seqlen_k;
  if (a.cu_q) {
    q_start = a.cu_q[b];
    sq = a.end_q[b] - q_start;
    k_start = a.cu_k[b];
    sk = a.end_k[b] - k_start;
  }
  const int i0 = mb * BR;
  if (i0 >= sq) return;                                 /* the whole CTA, before any barrier */
  const int hk = h / a.group, bt = a.cu_q ? 0 : (int)b; /* batch coordinate of the tensor maps */

  /* Key blocks visible to some row of Q_i: [j_begin, j_end). */
  const int64_t shift = (a.bottom_right ? (int64_t)sk - sq : 0) + a.mask_offset;
  int lo_first, hi_first, lo_last, hi_last;
  fc_hp_row_keys(i0, shift, a.window_left, a.window_right, sk, &lo_first, &hi_first);
  fc_hp_row_keys(min(i0 + BR, sq) - 1, shift, a.window_left, a.window_right, sk, &lo_last, &hi_last);
  int j_begin = lo_first / BC;
  int n_blocks = lo_first < hi_last ? (hi_last + BC - 1) / BC - j_begin : 0;
  /* SCORE_MOD: only the key blocks that a boolean mask keeps for some row of Q_i, for the producer and the consumers
   * alike (both read j_begin, n_blocks from here); none left: the consumers write o = 0, lse = −inf */
  if constexpr (SCORE_MOD) fc_hp_mask_range(md, b, h, i0, BR, sq, &j_begin, &n_blocks);

  if (threadIdx.x == 0) {
    fc_mbar_init(q_full, 1);
#pragma unroll
    for (int s = 0; s < STAGES; s++) {
      fc_mbar_init(FULL_K(s), 1); /* the producer's arrive.expect_tx, then the bytes */
      fc_mbar_init(FULL_V(s), 1);
      fc_mbar_init(EMPTY_K(s), CONSUMER_WARPS); /* one arrival per consumer warp */
      fc_mbar_init(EMPTY_V(s), CONSUMER_WARPS);
    }
    fc_mbar_fence_init();
  }
  __syncthreads(); /* the barriers are initialised before anyone waits on them or TMA signals them */

  if (threadIdx.x < 128) {
    /* ---- producer ---------------------------------------------------------------------------------- */
    fc_setmaxnreg_dec<FC_HP_REGS_PRODUCER>();
    if (threadIdx.x == 0) {
      fc_tma_prefetch_map(&tm_q);
      fc_tma_prefetch_map(&tm_k);
      fc_tma_prefetch_map(&tm_v);
      const int sb = fc_hp_acquire_seq_maps(fc_hp_seq_maps_of(a), b);
      fc_mbar_arrive_expect_tx(q_full, Q_BYTES);
#pragma unroll
      for (int hf = 0; hf < HALVES; hf++)
        fc_tma_load_4d(sQ + hf * Q_HALF_BYTES, fc_hp_map(fc_hp_seq_maps_of(a), sb, 0, &tm_q), 64 * hf, q_start + i0, h,
                       bt, q_full);
      /* In the order the consumers use them: K_0, K_1, V_0, K_2, V_1, ... A stage is refilled once both
       * consumers released its previous tile (fill u of a stage waits for the end of use u − 1). */
      for (int n = 0; n <= n_blocks; n++) {
        if (n < n_blocks) {
          const int s = n % STAGES, u = n / STAGES;
          if (u > 0) fc_mbar_wait(EMPTY_K(s), (u - 1) & 1);
          fc_mbar_arrive_expect_tx(FULL_K(s), KV_BYTES);
          const int row = k_start + (j_begin + n) * BC;
#pragma unroll
          for (int hf = 0; hf < HALVES; hf++)
            fc_tma_load_4d(sK + s * KV_BYTES + hf * (BC * FC_HP_ROW_BYTES),
                           fc_hp_map(fc_hp_seq_maps_of(a), sb, 1, &tm_k), 64 * hf, row, hk, bt, FULL_K(s));
        }
        if (n > 0) {
          const int s = (n - 1) % STAGES, u = (n - 1) / STAGES;
          if (u > 0) fc_mbar_wait(EMPTY_V(s), (u - 1) & 1);
          fc_mbar_arrive_expect_tx(FULL_V(s), V_BYTES);
          const int row = k_start + (j_begin + n - 1) * BC;
#pragma unroll
          for (int hf = 0; hf < HALVES_V; hf++)
            fc_tma_load_4d(sV + s * V_BYTES + hf * (BC * FC_HP_ROW_BYTES),
                           fc_hp_map(fc_hp_seq_maps_of(a), sb, 2, &tm_v), 64 * hf, row, hk, bt, FULL_V(s));
        }
      }
    }
  } else {
    /* ---- consumers --------------------------------------------------------------------------------- */
    fc_setmaxnreg_inc<FC_HP_REGS_CONSUMER>();
    /* The warpgroup index through a shuffle: provably the same in every lane, so that the shared-memory
     * descriptors derived from it live in uniform registers (else ptxas moves each into the one uniform
     * register the wgmma reads, between wgmmas, and serialises them). */
    const int cw = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1;
    const int ct = threadIdx.x % 128, warp = ct / 32, lane = ct % 32;
    const int g = lane / 4, t = lane % 4;
    const int wg_row0 = i0 + 64 * cw; /* this warpgroup's first query row */
    /* This warpgroup's blocks [0, n_own) of the CTA's n_blocks (the rest are dummy trips). */
    const int n_own = fc_hp_own_blocks(a, wg_row0, sq, sk, shift, BC, j_begin, n_blocks);
    const uint32_t q_rows = sQ + 64 * cw * FC_HP_ROW_BYTES; /* and its rows of sQ (each half) */
    /* SCORE_MOD: S becomes the modified score x (or tanh(S·k_in) for softcap alone), whose exponent and lse factors
     * fc_hp_softmax_factors gives; S itself for a boolean mask alone (fc_hp_mod_x); lse = m_scale·m + ln l */
    [[maybe_unused]] const bool mod_x = SCORE_MOD && fc_hp_mod_x(md);
    float c = a.scale_log2, m_scale = a.scale;
    if constexpr (SCORE_MOD) fc_hp_softmax_factors(md, mod_x, &c, &m_scale);
    int lo[2], hi[2]; /* the keys each of this thread's two rows sees */
#pragma unroll
    for (int rh = 0; rh < 2; rh++)
      fc_hp_row_keys(wg_row0 + 16 * warp + g + 8 * rh, shift, a.window_left, a.window_right, sk, &lo[rh], &hi[rh]);
    /* SCORE_MOD: this (sequence, head)'s ALiBi slope, and each row's ALiBi distance to key 2t */
    float slope = 0.0f, dist0[2] = {0.0f, 0.0f}, lin_off = 0.0f;
    [[maybe_unused]] bool lin = false; /* ALiBi's linear form (fc_hp_alibi_lin) */
    if constexpr (SCORE_MOD) {
      slope = fc_score_mod_slope(md, b, h);
#pragma unroll
      for (int rh = 0; rh < 2; rh++) dist0[rh] = (float)(wg_row0 + 16 * warp + g + 8 * rh + sk - sq - 2 * t);
      lin = fc_hp_alibi_lin(md, shift, a.window_right, sq, sk, slope, &lin_off);
    }
    /* SCORE_MOD: the class of the block in hand and a boolean mask's keep bits of it (hopper/score_mod.cuh). Block j's
     * class is read one block ahead (its latency under the GEMMs' waits), its bits once block j − 1's S is packed. */
    [[maybe_unused]] int cls = FC_MT_ALL;
    [[maybe_unused]] fc_hp_keep<BC> km;
    auto mask_class = [&](int j) {
      return SCORE_MOD && j < j_begin + n_own ? fc_hp_mask_class(md, b, h, wg_row0, sq, j) : (int)FC_MT_ALL;
    };
    auto mask_next = [&](int next, int j) {
      if constexpr (SCORE_MOD) {
        cls = next;
        fc_hp_mask_bits<BC>(km, md, b, h, next, wg_row0 + 16 * warp + g, sq, sk, j * BC, t);
      }
    };
    /* x, then the mask, of block j's S */
    auto mod_block = [&](float(&s)[BC / 2], int j) {
      if constexpr (SCORE_MOD)
        fc_hp_mod_block<T, BC>(s, md, mod_x, slope, dist0, lin, b, h, cls, km, wg_row0 + 16 * warp + g, sq, sk, j * BC,
                               t);
    };
    /* DROP (dropout): block j's keep bits, drawn at the top of its trip (hopper/score_mod.cuh), and P∘keep after the
     * softmax */
    [[maybe_unused]] fc_hp_drop<BC> kd;
    auto drop_bits = [&](int j) {
      if constexpr (DROP)
        fc_hp_drop_bits<BC>(kd, md, (uint64_t)(b * a.heads_q + h), wg_row0 + 16 * warp + g, sk, j * BC, t);
    };
    auto drop_apply = [&](float(&s)[BC / 2]) {
      if constexpr (DROP) fc_hp_drop_apply<BC>(s, kd);
    };
    /* Key blocks that need no mask for any row of this warpgroup: [j_full_lo, j_full_hi). Block j is whole
     * when it lies before the key tail ((j + 1)·Bc ≤ sk), left of the window's right edge for the first row
     * ((j + 1)·Bc − 1 ≤ wg_row0 + shift + wr) and right of its left edge for the last row
     * (j·Bc ≥ wg_row0 + 63 + shift − wl). Worked out once here, so that the loop tests two ints. */
    int64_t full_hi = sk / BC, full_lo = 0; /* 64-bit: the ring's mask_offset may be far away */
    if (a.window_right >= 0) full_hi = min(full_hi, fc_hp_floor_div(wg_row0 + shift + a.window_right + 1, BC));
    if (a.window_left >= 0) full_lo = -fc_hp_floor_div(-(wg_row0 + 63 + shift - a.window_left), BC);
    const int j_full_hi = (int)max(full_hi, (int64_t)0),
              j_full_lo = (int)min(max(full_lo, (int64_t)0), (int64_t)j_full_hi);
    auto needs_mask = [&](int j) { return j < j_full_lo || j >= j_full_hi; };
    /* Ping-pong: before issuing its GEMMs a consumer waits for its turn (barrier BAR_TURN + c, 256 threads:
     * its own bar.sync and the previous consumer's bar.arrive); after issuing them it hands the turn to the next
     * consumer, c ^ 1 (hopper/fwd_persistent.cuh's 3 consumers go round robin). All
     * take n_blocks + 1 turns (block 0's S, the loop's S + P·V, the last P·V, then a dummy trip's empty turn per
     * block past n_own) whatever their rows (n_blocks is the CTA's, so a warpgroup whose rows all lie past the
     * sequence still takes every turn); consumer 0 goes first (consumer NC − 1 arrives once at the start), and
     * consumer NC − 1's last hand-over is skipped: barrier c then sees n_blocks + 1 arrivals of the other consumer
     * against n_blocks + 1 waits of its own, and no arrival is left pending at exit. A consumer cannot hand over
     * twice before the other one waited: its next turn needs the other's hand-over. */
    auto my_turn = [&]() { fc_named_barrier(BAR_TURN + cw, 256); };
    auto your_turn = [&](bool last) { fc_named_barrier_arrive_if(BAR_TURN + (cw ^ 1), 256, !(last && cw == NC - 1)); };

    float o[DV / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    uint32_t p[BC / 16][4]; /* P of the last block, packed: the A operand of O += P·V */
#pragma unroll
    for (int x = 0; x < DV / 2; x++) o[x] = 0.0f;
    fc_mbar_wait(q_full, 0); /* Q_i has landed (TMA's writes are visible to these threads' loads from here on) */
    /* S = Q_i·K_jᵀ of the key block in K stage k_tile. */
    auto qk = [&](float(&s)[BC / 2], uint32_t k_tile) { fc_hp_ss_kmajor<T, D, BC>(s, q_rows, k_tile); };

    if (n_blocks > 0) {
      fc_named_barrier_arrive_if(BAR_TURN, 256, cw == NC - 1); /* consumer 0 first */
      /* Block 0: S = Q_i·K_0ᵀ, softmax; O is still 0, nothing to rescale. */
      {
        float s[BC / 2];
        mask_next(mask_class(j_begin), j_begin);
        [[maybe_unused]] const int cls_next = mask_class(j_begin + 1);
        drop_bits(j_begin);
        fc_mbar_wait(FULL_K(0), 0);
        my_turn();
        fc_wgmma_fence();
        qk(s, sK);
        fc_wgmma_commit();
        your_turn(false);
        fc_wgmma_wait<0>();
        fc_fence_regs(s);
        fc_mbar_arrive_if(EMPTY_K(0), lane == 0); /* K_0 is read: its stage may be refilled */
        mod_block(s, j_begin);
        fc_hp_softmax_f32<BC>(s, needs_mask(j_begin), j_begin * BC, lo, hi, t, c, m, l, alpha);
        drop_apply(s);
        fc_hp_pack<T, BC>(s, p);
        mask_next(cls_next, j_begin + 1);
      }

      for (int n = 1; n < n_own; n++) {
        const int sn = n % STAGES, un = n / STAGES, sp = (n - 1) % STAGES, up = (n - 1) / STAGES;
        float s[BC / 2];
        [[maybe_unused]] const int cls_next = mask_class(j_begin + n + 1);
        drop_bits(j_begin + n);
        /* V_{n−2} is read: its P·V was waited for at the end of the last trip. Released here, first thing, and
         * not after the wait below (ptxas then serialises the wgmma pipeline: C7513, docs/hopper.md) nor after
         * the next wait for S (one GEMM group later: with 2 stages the producer then refilled the stage too late
         * for the other consumer's next turn, and the tensor cores idled; +2..20 % at D = 128, 256). */
        fc_mbar_arrive_if(EMPTY_V((n + STAGES - 2) % STAGES), lane == 0 && n >= 2);
        /* Issue S = Q_i·K_nᵀ and O += P_{n−1}·V_{n−1} back to back; the softmax of block n runs on the
         * CUDA cores while the second is in flight (it touches neither O nor P_{n−1}). */
        fc_mbar_wait(FULL_K(sn), un & 1);
        fc_mbar_wait(FULL_V(sp), up & 1); /* before the fence: no branch inside a wgmma pipeline stage */
        fc_fence_regs(o);
        fc_fence_regs(p);
        my_turn();
        fc_wgmma_fence();
        qk(s, sK + sn * KV_BYTES);
        fc_wgmma_commit();
        fc_hp_pv<T, DV, BC>(o, p, sV + sp * V_BYTES);
        fc_wgmma_commit();
        your_turn(false);
        fc_wgmma_wait<1>(); /* S is ready; P·V may still run */
        fc_fence_regs(s);
        fc_mbar_arrive_if(EMPTY_K(sn), lane == 0); /* K_n is read */
        mod_block(s, j_begin + n);
        fc_hp_softmax_beside_pv<T, BC, DV>(s, o, p, needs_mask(j_begin + n), (j_begin + n) * BC, lo, hi, t, c, m, l,
                                           alpha, a.head_dim > 0, drop_apply, [] {});
        mask_next(cls_next, j_begin + n + 1);
      }

      /* The last O += P·V (of block n_own − 1). */
      const int sl = (n_own - 1) % STAGES, ul = (n_own - 1) / STAGES;
      fc_mbar_wait(FULL_V(sl), ul & 1);
      fc_fence_regs(o);
      fc_fence_regs(p);
      my_turn();
      fc_wgmma_fence();
      fc_hp_pv<T, DV, BC>(o, p, sV + sl * V_BYTES);
      fc_wgmma_commit();
      your_turn(n_own == n_blocks);
      fc_wgmma_wait<0>();
      fc_fence_regs(o);
      /* The tile's last V stages are not released: no fill waits for them. A warpgroup that stops early
       * (n_own < n_blocks) releases V_{n_own−2} and V_{n_own−1}, whose stages the producer refills for the
       * blocks it skips, then runs one dummy trip per skipped block: a turn (the others' groups of that block
       * take theirs), and the block's K and V stages released after their full waits (so that no arrival falls
       * into the phase of a stage's previous use). An arrival nobody waits for (the tile's last stages) is
       * harmless. */
      if (n_own < n_blocks) {
        fc_mbar_arrive_if(EMPTY_V((n_own + STAGES - 2) % STAGES), lane == 0 && n_own >= 2);
        fc_mbar_arrive_if(EMPTY_V(sl), lane == 0);
        for (int n = n_own; n < n_blocks; n++) {
          const int sn = n % STAGES, un = n / STAGES;
          fc_mbar_wait(FULL_K(sn), un & 1);
          my_turn();
          your_turn(n == n_blocks - 1);
          fc_mbar_arrive_if(EMPTY_K(sn), lane == 0);
          fc_mbar_wait(FULL_V(sn), un & 1);
          fc_mbar_arrive_if(EMPTY_V(sn), lane == 0);
        }
      }
    }

    /* O = O / l and lse = scale·m + ln l; a row that saw no key has m = −inf, l = 0: O = 0, lse = −inf. Dropout:
     * O = Σ P∘keep·V / (l·(1 − p)), l summed over the whole P. */
    uint16_t *O = a.o + b * a.o_sb + (int64_t)q_start * a.o_ss + (int64_t)h * a.o_sh;
    m[1] -= lin_off; /* ALiBi's linear form: row 1's offset (fc_hp_alibi_lin) */
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      float lr = l[rh];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      float inv = m[rh] != -INFINITY ? 1.0f / lr : 0.0f;
      if constexpr (DROP) inv *= md.drop_rp;
#pragma unroll
      for (int x = 0; x < DV / 8; x++) {
        o[4 * x + 2 * rh] *= inv;
        o[4 * x + 2 * rh + 1] *= inv;
      }
      const int row = wg_row0 + 16 * warp + g + 8 * rh;
      if (a.lse && t == 0 && row < sq) {
        const int64_t at = a.cu_q ? (int64_t)h * a.total_q + q_start + row : (b * a.heads_q + h) * a.seqlen_q + row;
        /* __fmul_rn: an overflowed scale·m must give NaN, not fma's −inf (mma/fwd_common.cuh, fc_fwd_row_lse) */
        a.lse[at] = m[rh] != -INFINITY ? __fmul_rn(m[rh], m_scale) + logf(lr) : -INFINITY;
      }
    }

    /* Stage O in this warpgroup's rows of sQ (no wgmma reads them any more: all groups were waited for), in
     * the same swizzled layout, so that the global stores are whole 16-byte chunks of a row. Row r of the
     * warpgroup, 16-byte chunk x (columns 8x .. 8x + 7) lives at half x / 8, byte r·128 + ((x % 8) ^ (r % 8))·16;
     * this thread's rows have r % 8 = g. */
    fc_fence_proxy_async(); /* after the async proxy's reads of sQ, before these generic writes */
    /* Every warp of the warpgroup is past its last wgmma wait before any overwrites the rows of Q_i. */
    fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128);
    {
      uint32_t ob[DV / 4];
#pragma unroll
      for (int x = 0; x < DV / 8; x++)
#pragma unroll
        for (int rh = 0; rh < 2; rh++) ob[2 * x + rh] = fc_pack2<T>(o[4 * x + 2 * rh], o[4 * x + 2 * rh + 1]);
      fc_hp_stage_o<DV>(q_rows, Q_HALF_BYTES, ob, warp, lane);
    }
    fc_named_barrier(FC_HP_BAR_EPILOGUE + cw, 128); /* the warpgroup's O rows are all in shared memory */
    fc_hp_store_o_rows<DV>(a, O, q_rows, Q_HALF_BYTES, wg_row0, sq, ct);
  }
#undef FULL_K
#undef FULL_V
#undef EMPTY_K
#undef EMPTY_V
#endif /* FC_HOPPER_ARCH */
}

#include "hopper/fwd_persistent.cuh"

/* ---- host ------------------------------------------------------------------------------------------------ */
/* Dynamic shared memory of one CTA of br query rows: the tiles (Q and K of d columns, V of dv), the barriers, and
 * 1024 bytes of slack for the alignment. */
static inline size_t fc_hp_smem_bytes(int br, int d, int stages, int bc, int dv) {
  return ((size_t)br * d + (size_t)stages * bc * (d + dv)) * 2 + 8 * (1 + 4 * stages) + 1024;
}

/* The one-tile kernels' grid order (common/tail_order.cuh); a: a copy of the caller's arguments, launched. */
static inline flashc_status fc_hp_tail(const fc_problem *p, const void *kernel, int threads, size_t smem,
                                       fc_hopper_fwd_args *a) {
  a->n_pairs = (int)(p->batch * p->heads_q); /* fits: the caller's fc_mma_grid refused a grid past 2^31 − 1 CTAs */
  return fc_tail_from(p, a->m_blocks, a->n_pairs, kernel, threads, smem, &a->tail_from);
}

/* The one-tile kernel at its tile shape, <D, K/V stages, Bc, V's columns DV>: D = 128: 32 + 2·2·32 = 160 KB; D = 256,
 * Bc = 80: 64 + 2·2·40 = 224 KB of the 227 KB a block may have; D = 192 with DV = 128: 48 + 2·(48 + 32) = 208 KB. */
template <typename T, int D, int STAGES, int BC = FC_HP_BC, bool SCORE_MOD = false, int DV = D, bool DROP = false>
static flashc_status fc_hp_launch(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a0,
                                  const fc_score_mod *md, int grid) {
  fc_hopper_fwd_args a = *a0;
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const fc_hopper_fwd_args,
                 const fc_score_mod) = fc_hopper_fwd_kernel<T, D, STAGES, BC, SCORE_MOD, DV, DROP>;
  const size_t smem = fc_hp_smem_bytes(FC_HP_BR, D, STAGES, BC, DV);
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward: backend cuda-hopper"));
  FC_CHECK(fc_hp_tail(p, (const void *)kernel, FC_HP_THREADS, smem, &a));
  kernel<<<grid, FC_HP_THREADS, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], a, *md);
  FC_LAUNCH_CHECK("fc_hopper_fwd_kernel");
  return FLASHC_OK;
}

/* ---- the persistent kernel's launch ---- */
/* Its shared memory: the one-tile kernel's, plus sO (Br·D·2), the q_empty barrier and the tile ring (two mbarriers
 * and a position per entry; the static orders leave it unused). tmastore3 (Br = 192, D = 64): sQ 24 KB + 3 × (16 +
 * 16) KB + sO 24 KB = 144 KB (+ barriers, ring and slack: 148,632 bytes). */
static inline size_t fc_hp_persistent_smem_bytes(int br, int d, int stages, int bc) {
  const size_t so = d <= 128 ? 2 * (size_t)br * d * 2 : 0; /* sO and Q's second slot (none at D = 256) */
  return fc_hp_smem_bytes(br, d, stages, bc, d) + so + 3 * 8 + (16 + 64) * FC_HP_TILE_RING;
}

/* The dynamic order's claim counter in the device workspace, after the varlen offsets: 256 bytes, so that anything
 * placed after it stays aligned. */
#define FC_HP_CLAIM_BYTES ((size_t)256)

/* A causal-like mask: every query row sees a prefix of the keys (no left window edge), so the query blocks of a head
 * weigh from one key block to all of them. */
static inline bool fc_hp_triangular(const fc_problem *p) { return p->window_left < 0 && p->window_right >= 0; }

/* The orders in which the persistent grid's CTAs take the schedule's positions (hopper/sched.cuh): stride, CTA x the
 * positions x, x + grid, x + 2·grid, ...; or dynamic, each CTA claiming the next position with an atomic counter when
 * it is about to finish a tile (greedy, and the CTAs at work keep neighbouring positions: the L2 groups hold).
 * fc_hp_fwd_plan picks one. */
enum { FC_HP_SCHED_STRIDE = 0, FC_HP_SCHED_DYNAMIC = 1 };

/* The split last rounds: the persistent forward's last rounds split by key blocks (stream-K, fc_hp_sched_split) where
 * every tile weighs the same: no mask, no varlen, the stride order. Its memory, per CTA (SM) and consumer warpgroup:
 * each thread's o, m, l (d/2 + 4 floats) in the workspace, and a flag in the handle's zeroed memory
 * (fc_device_zeroed: the merging CTA resets the flag it waited for, so no call clears them first; a memset before
 * each launch, one more node on the stream, cost what the split won in the steady state). Two consumer warpgroups
 * only: tmastore3's consumers have no registers to spare (the fix-up spilled 32 bytes there), and its 192-row tiles
 * fill 20.7 rounds at d64 (the last partial round costs 1.4 %, against 3 % for d128's 15.5); built for tmastore3, the
 * split won +1.7 % at 2k over the same kernel with the split off, but that kernel, spilling per tile, lost 3 % at 8k to
 * the 2-consumer one (bench/results/configs/hopper-fwd-split-nc3-2026-11-25.txt, A and E). H100
 * (bench/results/configs/hopper-split-2026-11-23.txt): 2048 whole tiles of d128 take as long as 2112 (the idle half
 * round is real: 3 %); with the memset the split won back 0.6-1 % of it in the short form, nothing in the steady state;
 * without it 0.2-3.1 % in the short form (two rounds at 2k, 4k, 8k and 2176 tiles, 7 of 8 pairs ahead), -0.4..+0.9 %
 * steady. The waits: CTA x waits for x + 1 only, at its very end; the hardware starts CTAs in index order, so the
 * lowest CTA still waiting always has its partner running or done, even with fewer SMs free than the grid (NCCL's
 * kernels beside it): no hang. */
typedef struct fc_hp_split_mem {
  float *part;
  int32_t *flags;
} fc_hp_split_mem;
static inline size_t fc_hp_split_part_bytes(int sms, int d) {
  return (size_t)sms * 2 * 128 * (d / 2 + 4) * sizeof(float);
}

/* What a forward call runs: fc_hp_fwd_plan_of (hopper/fwd.cu) chooses it. */
typedef struct fc_hp_fwd_plan {
  bool persistent; /* hopper/fwd_persistent.cuh's kernel; false: the one-tile ping-pong kernel (fc_hopper_fwd_kernel) */
  int d;           /* D: 64, 128 or 256 (fc_hp_d_tile of the larger head dim), or 192 (fc_hp_dv_pair's 192/128) */
  int dv;          /* V's and O's columns DV: D, or 128 with D = 192 */
  int nc;          /* consumer warpgroups, Br = 64·nc query rows per tile */
  int bc;          /* keys per block */
  bool tma_store;  /* the persistent kernel stores O by TMA (else directly from shared memory or registers) */
  int order;       /* FC_HP_SCHED_* (the persistent kernel) */
  bool split;      /* the split last rounds (fc_hp_split_mem) */
} fc_hp_fwd_plan;

/* claim: the dynamic order's counter in the workspace (NULL: the stride order); split: the split rounds' memory
 * (NULL: whole tiles only). */
template <typename T, int D, int STAGES, int NC = 2, int BC = FC_HP_BC, bool SCORE_MOD = false, bool DROP = false>
static flashc_status fc_hp_launch_persistent(const fc_problem *p, const CUtensorMap maps[4],
                                             const fc_hopper_fwd_args *a, const fc_score_mod *md, const fc_hp_sched *sc,
                                             bool tma_store, int32_t *claim, const fc_hp_split_mem *split) {
  void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const fc_hopper_fwd_args,
                 const fc_hp_sched, const fc_score_mod) = nullptr;
  if constexpr (!DROP || D == 64) /* DROP: built at D = 128 with the TMA store only (fc_hp_fwd_plan_of) */
    kernel = fc_hopper_fwd_persistent_kernel<T, D, STAGES, false, NC, BC, SCORE_MOD, DROP>;
  if constexpr (D <= 128) /* D = 256 has no sO to store from */
    if (tma_store) kernel = fc_hopper_fwd_persistent_kernel<T, D, STAGES, true, NC, BC, SCORE_MOD, DROP>;
  if (!kernel) /* the plan never asks for it; a status, not a crash */
    return fc_error(FLASHC_ERR_UNSUPPORTED, "flashc_forward: no cuda-hopper persistent kernel for dropout at D = %d",
                    D);
  const size_t smem = fc_hp_persistent_smem_bytes(64 * NC, D, STAGES, BC);
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward: backend cuda-hopper (persistent)"));
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  /* One CTA per SM (this shared memory and 384 threads of 168 registers, or 512 of 128, allow no second); fewer
   * when there are fewer tiles. */
  const int grid = sc->tiles < props.num_sms ? sc->tiles : props.num_sms;
  if (grid <= 0) return FLASHC_OK;
  fc_hp_sched walk = fc_hp_sched_for_grid(*sc, grid, 0);
  if (claim) {
    /* Zeroed on the call's stream before every launch, rather than reset by the grid's last CTA: a launch that
     * failed or was cut short cannot leave a count that would make the next call skip tiles, and no CTA needs a
     * second atomic to find out that it is the last. */
    walk.claim = claim;
    FC_CUDA_CHECK(cudaMemsetAsync(claim, 0, sizeof(int32_t), fc_stream(p)));
  }
  if (NC == 2 && split && fc_hp_sched_split(&walk, (int)fc_cdiv(p->seqlen_k, BC))) {
    walk.split_flag = split->flags;
    walk.split_part = split->part;
  }
  kernel<<<grid, 128 + 128 * NC, smem, fc_stream(p)>>>(maps[0], maps[1], maps[2], maps[3], *a, walk, *md);
  FC_LAUNCH_CHECK("fc_hopper_fwd_persistent_kernel");
  return FLASHC_OK;
}

/* The persistent forward: the maps (o's only for the TMA store), the schedule, the launch per head dim. nc = 3
 * (D = 64): the caller made q's map with boxes of 192 rows and a->m_blocks from Br = 192; o's map keeps boxes of 64
 * rows (each consumer warpgroup stores its own 64 rows). */
template <typename T, bool SCORE_MOD, bool DROP>
static flashc_status fc_hp_persistent(const fc_problem *p, const CUtensorMap qkv[3], const fc_hopper_fwd_args *a,
                                      const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                      const fc_hp_split_mem *split) {
  const int D = pl->d;
  CUtensorMap maps[4] = {qkv[0], qkv[1], qkv[2], qkv[0]}; /* maps[3]: o's, or unused */
  if (pl->tma_store) FC_CHECK(fc_hp_encode_box(p, &p->o, true, "o", 64, "flashc_forward", &maps[3]));
  const int64_t kv_bytes_per_bh = 2 * (int64_t)(p->cu_seqlens_k ? p->total_k / p->batch : p->seqlen_k) * D * 2;
  /* L2 groups of heads with a causal mask only (hopper/sched.cuh, FC_HP_L2_GROUP_BYTES) */
  const int64_t group_bytes = fc_hp_triangular(p) ? FC_HP_L2_GROUP_BYTES : 0;
  const fc_hp_sched sc =
      fc_hp_make_sched(a->m_blocks, (int)(p->batch * p->heads_q), kv_bytes_per_bh, a->group, group_bytes);
  if (D == 64)
    return fc_hp_launch_persistent<T, 64, 3, 3, FC_HP_BC, SCORE_MOD, DROP>(p, maps, a, md, &sc, pl->tma_store, claim,
                                                                           split);
  if (D == 256) {
    if constexpr (DROP) /* the one-tile kernel runs dropout at D = 256 (fc_hp_fwd_plan_of) */
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "flashc_forward: no cuda-hopper persistent kernel for dropout at D = 256");
    else
      return fc_hp_launch_persistent<T, 256, 2, 2, FC_HP_BC_D256, SCORE_MOD>(p, maps, a, md, &sc, false, claim, split);
  }
  return fc_hp_launch_persistent<T, 128, 2, 2, FC_HP_BC, SCORE_MOD, DROP>(p, maps, a, md, &sc, pl->tma_store, claim,
                                                                          split);
}

/* The plan's kernel for element type T, plain or with the score modifiers; DROP (with SCORE_MOD): and dropout, kernels
 * of their own, so that the keep bits' registers cost only the calls that use them (as a run-time branch of the
 * SCORE_MOD kernels they made the persistent D = 128 kernel without the TMA store spill 344 bytes, and every SCORE_MOD
 * call would have paid for it), built only where the plan runs dropout: the persistent kernel at D = 64 and at D = 128
 * with the TMA store, the one-tile kernel at D = 128 and 256 (fc_hp_fwd_plan_of). */
template <typename T, bool SCORE_MOD, bool DROP = false>
static flashc_status fc_hp_forward_kernels(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a,
                                           const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                           const fc_hp_split_mem *split, int grid) {
  if (pl->persistent) return fc_hp_persistent<T, SCORE_MOD, DROP>(p, maps, a, md, pl, claim, split);
  if constexpr (!SCORE_MOD) /* hopper_supports refuses the score modifiers with V's head dim of its own */
    if (pl->dv != pl->d) return fc_hp_launch<T, 192, 2, FC_HP_BC, false, 128>(p, maps, a, md, grid);
  return pl->d == 256 ? fc_hp_launch<T, 256, 2, FC_HP_BC_D256, SCORE_MOD, 256, DROP>(p, maps, a, md, grid)
                      : fc_hp_launch<T, 128, 2, FC_HP_BC, SCORE_MOD, 128, DROP>(p, maps, a, md, grid);
}

/* fc_hp_forward_kernels for the call's dtype. */
template <bool SCORE_MOD, bool DROP = false>
static flashc_status fc_hp_forward_dtype(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a,
                                         const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                         const fc_hp_split_mem *split, int grid) {
  if (p->dtype == FLASHC_F16)
    return fc_hp_forward_kernels<__half, SCORE_MOD, DROP>(p, maps, a, md, pl, claim, split, grid);
  return fc_hp_forward_kernels<__nv_bfloat16, SCORE_MOD, DROP>(p, maps, a, md, pl, claim, split, grid);
}

/* fc_hp_forward_dtype<true> (hopper/fwd_score_mod.cu) and fc_hp_forward_dtype<true, true> (hopper/fwd_dropout.cu). */
flashc_status fc_hp_forward_score_mod(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a,
                                      const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                      const fc_hp_split_mem *split, int grid);
flashc_status fc_hp_forward_dropout(const fc_problem *p, const CUtensorMap maps[3], const fc_hopper_fwd_args *a,
                                    const fc_score_mod *md, const fc_hp_fwd_plan *pl, int32_t *claim,
                                    const fc_hp_split_mem *split, int grid);

#endif /* FLASHC_CUDA_HOPPER_FWD_LAUNCH_CUH */
