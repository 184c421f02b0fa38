/* mma/decode.cu — attention over a KV cache on the GPU (flashc_forward_kvcache of cuda-mma and cuda-hopper): a few new
 * query rows per sequence against a long cache, dense or paged, with the new keys appended in place first.
 *
 * Decoding reads every cached key and value once and does little with each (4·d flops per key and query row): it
 * is bound by the bandwidth at which K and V stream in, and needs (1) each K/V element read once per KV head, not
 * once per query head, (2) 16-byte copies kept in flight on every SM. So:
 *   - GQA packing: the g = heads_q / heads_kv query heads of KV head hk and the seqlen_q new rows form one tile of
 *     R = seqlen_q·g rows (row r is query row r / g of head hk·g + r % g), computed by one CTA in one M-tile of
 *     DEC_BR = 16 rows (more rows: more row blocks, adjacent in the grid so that they meet K/V in L2);
 *   - split keys ("flash-decoding"): the key blocks a tile sees are cut into n_splits ranges, one CTA each, so that
 *     batch × heads_kv × row blocks × n_splits CTAs fill the GPU (fc_dec_splits); each writes its rows' O and lse
 *     to the workspace and counts itself done on the tile's counter, and the tile's last CTA merges them through
 *     the lse (fc_dec_merge; the same sums as mma/fwd_split.cuh's combine):
 *         lse = ln Σ_s e^(lse_s),   O = Σ_s e^(lse_s − lse) · O_s
 *     The counters live in the handle's zeroed memory (fc_device_zeroed), which the last CTA leaves zero again,
 *     so no call clears them first and a CUDA graph's replays find them zero. The merge cost is n_splits · 16 ·
 *     (d + 1) floats per tile, read from L2, against the tile's K and V. It was a second kernel (a programmatic
 *     dependent on sm_90; no counters, no fences), which took 5.4-6.6 µs at batch 1 on an H200 where cuDNN's
 *     reduction takes 1.9-2.8 µs (bench/results/checks/decode-host-vs-gpu-h200-2026-12-01.txt); with the last CTA's
 *     merge the kernel takes 37.1 / 12.2 / 37.3 µs at heads 32:32 8k / 32:8 8k / 32:8 32k where the two kernels
 *     took 39.9 / 15.7 / 41.9 (cuDNN 35.5 / 11.0 / 36.5; torch.profiler, L2 warm;
 *     bench/results/checks/decode-last-cta-merge-h200-2026-12-01.txt), but where a tile holds 16 rows (4 new rows
 *     at a group of 4 or 8) it took 2.6-3.3 µs more than the two kernels at batch 1, 8k keys: that one CTA reads
 *     all the tile's partials after its own keys. So a KV head of more than DEC_CTA_MERGE_ROWS query rows keeps the
 *     second kernel (fc_dec_merge_kernel: a warp per row over the whole GPU) and no counters;
 *   - inside a CTA the 4 warps split each block of DEC_BC = 64 keys (16 keys each) over the same 16 rows, and merge
 *     their (m, l, O) through shared memory at the end: few rows need no row split, and each warp still does whole
 *     m16n8k16 steps;
 *   - K/V tiles come in by cp.async, STAGES blocks in a ring (3 where shared memory allows: two blocks in flight
 *     while one is computed; fc_dec_smem), each 16-byte chunk from wherever its row lives (dense slot or page; a
 *     paged block's rows are looked up once, a block ahead, by one thread per row: fc_dec_page_of); a dense block
 *     whose keys are all present by the forward's walking loader (fc_lean_load_whole), without per-chunk tests.
 * Per warp and key block j (the steps of mma/fwd_steps.cuh, with one M-tile):
 *     S = Q·K_wᵀ (16 × 16);  m' = max(m, rowmax S);  P = 2^(c·S − c·m');  l = 2^(c·(m − m'))·l + rowsum P;
 *     O = 2^(c·(m − m'))·O + P·V_w                                                        (c = |scale|·log2 e)
 *
 * Lengths and block tables live on the device: the kernels read them, the host never does (no synchronisation, so
 * a call can be captured in a CUDA graph). A sequence whose length is negative or past the capacity, or one of
 * whose used block-table entries is outside [0, num_blocks), is never read or written: the append skips it and its
 * outputs are NaN (every CTA checks the entries of the pages it reads, and its share of all the sequence's pages so
 * that the splits together check every one). The append is its own launch before the attention on the same
 * stream, which orders the two.
 *
 * Shapes: q, o [batch, seqlen_q, heads_q, d]; caches [batch, capacity, heads_kv, d] or [num_blocks, page_size,
 * heads_kv, d]; k_new, v_new [batch, seqlen_new, heads_kv, d]; lse [batch, heads_q, seqlen_q]; any strides, in
 * elements. d is compiled as D in {64, 128, 256}; a smaller d runs in the next D with zero columns (the bytes read
 * are d's: the copies of the columns past d read nothing). f16 and bf16. */
#include "../../kvcache.h"
#include "common/common.cuh"
#include "mma/fwd_split.cuh"
#include "mma/host.cuh"

#include <math.h>
#include <string.h>

static const char *const OP = "flashc_forward_kvcache";

enum {
  DEC_BR = 16,              /* query rows per CTA: one M-tile */
  DEC_WARPS = 4,            /* each takes 16 keys of a block */
  DEC_NT = DEC_WARPS * 32,  /* threads per CTA */
  DEC_BC = DEC_WARPS * 16,  /* keys per block */
  DEC_SPLIT_MAX = 128,      /* key splits per tile, at most */
  DEC_CTA_MERGE_ROWS = 8,   /* query rows per KV head up to which a tile's last CTA merges its splits (fc_dec_launch) */
  DEC_MERGE_THREADS = 128,  /* the merge kernel's CTA: 4 warps, a row each */
  DEC_SHARE_KEYS = 2048,    /* keys per split below which a split's CTA has an SM to itself (fc_dec_splits) */
  DEC_APPEND_THREADS = 256, /* the append kernel's CTA */
};

/* Shared memory of a CTA: Q's 16 rows and a ring of STAGES blocks of K and V, rows of fc_tile_stride(D) elements,
 * and for a paged cache STAGES buffers of the blocks' row offsets (fc_dec_page_of: 1 KB each). STAGES = 3 where it
 * fits (d 64 and 128: 100 KB at d 128 (103 KB paged), two CTAs per H100 SM, so that each has two blocks in flight
 * while it computes a third: the bytes in flight an SM needs to stream at HBM bandwidth), else 2 (d 128 on GPUs that
 * give a block 99 KB, d 256: 136 KB (138 KB paged), within an A100's 163 KB). */
static constexpr __host__ __device__ size_t fc_dec_smem(int D, int stages, bool paged) {
  return (size_t)(DEC_BR + 2 * stages * DEC_BC) * fc_tile_stride(D) * sizeof(uint16_t) +
         (paged ? (size_t)stages * DEC_BC * 2 * sizeof(int64_t) : 0);
}

typedef struct fc_dec_args {
  const uint16_t *q;
  uint16_t *o;
  float *lse;        /* NULL: not wanted */
  uint16_t *kc, *vc; /* the caches (written by the append only) */
  const uint16_t *kn, *vn;
  int64_t q_sb, q_ss, q_sh, o_sb, o_ss, o_sh;
  int64_t k_sb, k_ss, k_sh, v_sb, v_ss, v_sh; /* sb: one sequence (dense) or one block (paged) */
  int64_t kn_sb, kn_ss, kn_sh, vn_sb, vn_ss, vn_sh;
  const int32_t *table; /* NULL: dense */
  int64_t table_stride, num_blocks;
  int page_size;          /* 0: dense */
  const int32_t *seqlens; /* NULL: every cache full */
  int capacity;           /* keys a sequence's cache holds (≤ 2^31 − 1, checked on the host) */
  int seqlen_q, seqlen_new, heads_q, heads_kv, group, head_dim;
  int rows, row_blocks, n_splits; /* rows = seqlen_q·group; row blocks of DEC_BR */
  float scale_log2, scale;        /* |scale|·log2 e, |scale| */
  uint32_t neg;                   /* 0x80008000 when scale < 0: Q's fragments negated */
  int64_t window_left, window_right;
  int bottom_right;
  float *part_o, *part_lse; /* n_splits > 1: [tile][split][DEC_BR] rows of D floats, and their lse */
  int *counts;              /* n_splits > 1: [tile] CTAs of the tile done (fc_device_zeroed: zero between launches) */
} fc_dec_args;

/* ---- device helpers ---------------------------------------------------------------------------------------- */
/* Keys sequence b attends over (its cached ones and the appended ones), in *len clamped to [0, capacity]; false
 * when its length is unusable (negative, or past the capacity). */
static __device__ __forceinline__ bool fc_dec_length(const fc_dec_args &a, int64_t b, int *len) {
  const int64_t cached = a.seqlens ? (int64_t)a.seqlens[b] : (int64_t)a.capacity, n = cached + a.seqlen_new;
  *len = (int)(n < 0 ? 0 : n > a.capacity ? a.capacity : n);
  return cached >= 0 && n <= a.capacity;
}

/* Does one of this thread's share of the block-table entries of keys [k0, k1) of sequence b (k1 ≤ capacity: within
 * the row) name a block outside the pool? The threads of the CTA share the entries out, so the answer for all of
 * them is __syncthreads_or of every thread's (which the caller takes, one barrier for all its ranges). Dense: no. */
static __device__ __forceinline__ int fc_dec_pages_bad(const fc_dec_args &a, int64_t b, int k0, int k1) {
  int bad = 0;
  if (a.page_size && k0 < k1) {
    const int32_t *row = a.table + b * a.table_stride;
    const int last = (k1 - 1) / a.page_size, step = (int)blockDim.x;
    /* Four entries per round, all loaded before any is compared: four loads in flight rather than one after the
     * other (the row of a long cache has thousands of entries, and nothing is copied before the check ends). */
    for (int e = k0 / a.page_size + (int)threadIdx.x; e <= last; e += 4 * step) {
      int32_t blk[4];
#pragma unroll
      for (int u = 0; u < 4; u++) blk[u] = u * step <= last - e ? row[e + u * step] : 0;
#pragma unroll
      for (int u = 0; u < 4; u++) bad |= blk[u] < 0 || blk[u] >= a.num_blocks;
    }
  }
  return bad;
}

/* Element offset of key j of sequence b in a cache of strides (sb, ss), head 0: the dense slot, or the page that
 * the block table names (checked by fc_dec_pages_bad before). */
static __device__ __forceinline__ int64_t fc_dec_key_at(const fc_dec_args &a, int64_t b, int j, int64_t sb,
                                                        int64_t ss) {
  if (!a.page_size) return b * sb + (int64_t)j * ss;
  const int64_t blk = a.table[b * a.table_stride + j / a.page_size];
  return blk * sb + (int64_t)(j % a.page_size) * ss;
}

/* One 16-byte chunk of a tile by plain loads (rows that cp.async cannot copy: not 16-byte aligned): the first
 * `cols` elements from `from`, zeros after. */
static __device__ __forceinline__ void fc_dec_copy_chunk(uint16_t *to, const uint16_t *from, int cols) {
  uint32_t w[4];
#pragma unroll
  for (int x = 0; x < 4; x++) {
    const uint32_t lo = 2 * x < cols ? from[2 * x] : 0u, hi = 2 * x + 1 < cols ? from[2 * x + 1] : 0u;
    w[x] = lo | hi << 16;
  }
  *(uint4 *)to = make_uint4(w[0], w[1], w[2], w[3]);
}

/* One chunk into a swizzled tile: by cp.async (ALIGNED; the caller commits and waits) or by plain loads. cols = 0
 * lands zeros and reads nothing (`from` may then be any readable address). */
template <bool ALIGNED>
static __device__ __forceinline__ void fc_dec_chunk(uint16_t *to, const uint16_t *from, int cols) {
  if constexpr (ALIGNED)
    fc_cp_async16(fc_smem_u32(to), from, 2 * cols);
  else
    fc_dec_copy_chunk(to, from, cols);
}

/* The CTA's DEC_BR query rows r0.. of KV head hk, sequence b (row r: query row r / g of head hk·g + r % g) into sQ;
 * rows past R and columns past d as zeros. */
template <int D, bool ALIGNED>
static __device__ __forceinline__ void fc_dec_load_q(uint16_t *sQ, const fc_dec_args &a, int64_t b, int hk, int r0) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, TOTAL = DEC_BR * CH;
  static_assert(TOTAL % DEC_NT == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int base = 0; base < TOTAL; base += DEC_NT) {
    const int idx = base + (int)threadIdx.x, r = idx / CH, c = idx % CH, rr = r0 + r;
    const int cols = rr < a.rows ? min(max(a.head_dim - 8 * c, 0), 8) : 0;
    const uint16_t *from = a.q;
    if (cols > 0)
      from += b * a.q_sb + (int64_t)(rr / a.group) * a.q_ss + (int64_t)(hk * a.group + rr % a.group) * a.q_sh + 8 * c;
    fc_dec_chunk<ALIGNED>(sQ + fc_tile_off<DS>(r, c), from, cols);
  }
}

/* Paged caches: the rows of a key block are looked up once per block, not once per 16-byte chunk. The per-chunk
 * lookup put a load of the table entry and an integer division in front of each chunk's cp.async, for K and for V
 * (two dependent loads per chunk, issued one after the other), and held paged decoding to half the dense
 * bandwidth. Here thread t = 64·m + r looks up key row r of a block in K (m = 0) or V (m = 1): one entry, one
 * division per block; it writes the row's element offset (head hk) into rows[r][m] of one of STAGES buffers in
 * shared memory, where the block's chunks read it (fc_dec_load_kv). The kernel looks block j + STAGES up while it
 * computes block j, so that the entry's load waits behind the block's mma's, not in front of a copy. */
typedef struct fc_dec_page {
  int32_t blk; /* the block the table names; −1: no key (past len, or a block this CTA does not read) */
  int row;     /* the key's row in it */
} fc_dec_page;

/* This thread's key row of key block j (read only when j < j_end: blocks past them are never copied). */
static __device__ __forceinline__ fc_dec_page fc_dec_page_of(const fc_dec_args &a, const int32_t *table_row, int j,
                                                             int j_end, int len) {
  if (j >= j_end) return {-1, 0};
  const int key = j * DEC_BC + (int)threadIdx.x % DEC_BC;
  if (key >= len) return {-1, 0};
  const int page = key / a.page_size; /* 32-bit: key < capacity ≤ 2^31 − 1 */
  return {table_row[page], key - page * a.page_size};
}

/* The offset of page row p into its place in a buffer of row offsets; (sb, ss, head): this thread's cache's block
 * and row strides and head hk's offset. */
static __device__ __forceinline__ void fc_dec_page_put(int64_t *rows, fc_dec_page p, int64_t sb, int64_t ss,
                                                       int64_t head) {
  rows[2 * (threadIdx.x % DEC_BC) + threadIdx.x / DEC_BC] = (int64_t)p.blk * sb + (int64_t)p.row * ss + head;
}

/* K and V of key block j (keys 64j..64j + 63; those ≥ len as zeros) of sequence b, KV head hk, into one stage of
 * the ring. A dense chunk computes its row's address; a paged one reads it from `rows` (fc_dec_page_put: [r][K, V]
 * element offsets, head hk's included). */
template <int D, bool ALIGNED, bool PAGED>
static __device__ __forceinline__ void fc_dec_load_kv(uint16_t *sK, uint16_t *sV, const fc_dec_args &a, int64_t b,
                                                      int hk, int j, int len, const int64_t *rows) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, TOTAL = DEC_BC * CH;
  static_assert(TOTAL % DEC_NT == 0, "every thread copies the same number of chunks");
  const uint16_t *K = a.kc + (int64_t)hk * a.k_sh, *V = a.vc + (int64_t)hk * a.v_sh;
#pragma unroll
  for (int base = 0; base < TOTAL; base += DEC_NT) {
    const int idx = base + (int)threadIdx.x, r = idx / CH, c = idx % CH, key = j * DEC_BC + r;
    const int cols = key < len ? min(max(a.head_dim - 8 * c, 0), 8) : 0;
    const uint16_t *kf = a.q, *vf = a.q; /* readable, never read (cols = 0) */
    if (cols > 0) {
      if constexpr (PAGED) {
        const longlong2 at = *(const longlong2 *)(rows + 2 * r); /* K's and V's offsets in one 16-byte load */
        kf = a.kc + at.x + 8 * c;
        vf = a.vc + at.y + 8 * c;
      } else {
        kf = K + (b * a.k_sb + (int64_t)key * a.k_ss) + 8 * c;
        vf = V + (b * a.v_sb + (int64_t)key * a.v_ss) + 8 * c;
      }
    }
    fc_dec_chunk<ALIGNED>(sK + fc_tile_off<DS>(r, c), kf, cols);
    fc_dec_chunk<ALIGNED>(sV + fc_tile_off<DS>(r, c), vf, cols);
  }
}

/* ---- kernels ------------------------------------------------------------------------------------------------- */
/* The append: one CTA per sequence writes k_new/v_new rows t = 0..seqlen_new − 1 into its cache at key
 * cached_b + t, unless its length or one of its block-table entries is unusable (then nothing). */
__global__ void __launch_bounds__(DEC_APPEND_THREADS) fc_dec_append_kernel(const fc_dec_args a) {
  const int64_t b = blockIdx.x;
  int len;
  const bool length_ok = fc_dec_length(a, b, &len);
  const bool pages_ok = !__syncthreads_or(fc_dec_pages_bad(a, b, 0, len)); /* every thread: a barrier */
  if (!length_ok || !pages_ok) return;
  const int cached = len - a.seqlen_new, d = a.head_dim;
  const int64_t per_row = (int64_t)a.heads_kv * d, n = a.seqlen_new * per_row;
  for (int64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
    const int t = (int)(idx / per_row), h = (int)(idx % per_row / d), c = (int)(idx % d);
    a.kc[fc_dec_key_at(a, b, cached + t, a.k_sb, a.k_ss) + h * a.k_sh + c] =
        a.kn[b * a.kn_sb + t * a.kn_ss + h * a.kn_sh + c];
    a.vc[fc_dec_key_at(a, b, cached + t, a.v_sb, a.v_ss) + h * a.v_sh + c] =
        a.vn[b * a.vn_sb + t * a.vn_ss + h * a.vn_sh + c];
  }
}

/* One row's weights in the merge of its key splits, by one warp (this thread: lane): lse = ln Σ_y e^(lse_y) over the
 * S splits (split y's lse at lse_y[y·DEC_BR]; CG: read past L1, for the last CTA, which reads what other CTAs of its
 * grid wrote) and each split's weight e^(lse_y − lse) into w[y·w_stride] (0 where lse_y or lse is −inf; a NaN lse_y
 * makes them NaN). Returns lse. */
template <bool CG>
static __device__ __forceinline__ float fc_dec_row_weights(const float *lse_y, int S, float *w, int w_stride,
                                                            int lane) {
  constexpr int YPL = DEC_SPLIT_MAX / 32;
  float ly[YPL], mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < YPL; k++) {
    const int y = lane + 32 * k;
    ly[k] = y >= S ? -INFINITY : CG ? __ldcg(lse_y + y * DEC_BR) : lse_y[y * DEC_BR];
    mx = fc_fmax_nan(mx, ly[k]); /* NaN stays */
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fc_fmax_nan(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < YPL; k++) sum += mx == -INFINITY ? 0.0f : expf(ly[k] - mx); /* e^−inf = 0 */
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = mx == -INFINITY ? -INFINITY : mx + logf(sum);
#pragma unroll
  for (int k = 0; k < YPL; k++) {
    const int y = lane + 32 * k;
    if (y < S) w[y * w_stride] = mx == -INFINITY || ly[k] == -INFINITY ? 0.0f : expf(ly[k] - lse);
  }
  return lse;
}

/* The merge of one tile's splits, by the tile's last CTA (n_splits > 1: fc_dec_kernel): per row,
 *     lse = ln Σ_y e^(lse_y),   O = Σ_y e^(lse_y − lse) · O_y
 * over the S = n_splits partials [y][DEC_BR][D] of the tile, whose first R rows hold query rows. At batch 1 a tile
 * holds few rows (R = 1 at heads 32/32, 4 at 32/8) and up to DEC_SPLIT_MAX splits, so the threads are spread over
 * the splits as well as the columns. First the weights: a warp per row, its lanes over the splits (lane x: splits x,
 * x + 32, ...), the row's lse by shuffles, the weights e^(lse_y − lse) into sW. Then O: a split's rows hold F = R·C
 * float4s of columns < d (C = ⌈d / 4⌉ per row); thread t sums float4 f = t (t + 128, ... while F ≥ 128) over every
 * split, or where F < 128 float4 t % F over the splits of group p = t / F (p, p + P, ..., P = ⌊128 / F⌋ groups),
 * the groups' sums meeting in sAcc. Each thread loads U splits' float4s before it weights any (loads independent of
 * the weights: 128·U 16-byte loads in flight in the CTA), and its first U are issued before the weights are
 * computed. (The separate kernel this replaced measured the layouts: one CTA per row with its threads over the
 * splits and then the columns, three barriers and each column's loads behind a test of the weight, took 6.3 µs at
 * batch 1, heads 32/8, 128k keys, 32 splits on an H200; a warp per row that read every split's lse again for each
 * column took longer than the attention.) A split that no key of the row reached (lse −inf) has weight 0 and adds
 * nothing (its product is not taken); a row that no split reached gets o = 0 and lse −inf; a NaN lse (a NaN score,
 * or an unusable sequence) makes the row NaN. The sums run in a fixed order whichever CTA is last: the same bits
 * run to run. smem: DEC_SPLIT_MAX·DEC_BR + 4·DEC_NT floats. */
template <typename T, int D>
static __device__ __forceinline__ void fc_dec_merge(const fc_dec_args &a, int64_t tile, int64_t b, int hk, int r0,
                                                    float *smem) {
  constexpr int U = D <= 128 ? 16 : 8; /* float4 loads in flight per thread: 64 (32) registers */
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, S = a.n_splits;
  const int R = min((int)DEC_BR, a.rows - r0), C = (a.head_dim + 3) / 4, F = R * C;
  const int P = F >= DEC_NT ? 1 : DEC_NT / F, p = F >= DEC_NT ? 0 : tid / F;
  const float *part_lse = a.part_lse + tile * S * DEC_BR, *part_o = a.part_o + tile * S * DEC_BR * D;
  float *sW = smem;                                       /* [split][DEC_BR]: e^(lse_y − lse) */
  float4 *sAcc = (float4 *)(sW + DEC_SPLIT_MAX * DEC_BR); /* [group][F]: the groups' sums (P > 1) */

  /* This thread's float4 f, and the first split y0 of its next U: y0, y0 + P, ..., y0 + (U − 1)·P. */
  int f = F >= DEC_NT ? tid : tid % F, y0 = p;
  bool more = p < P; /* threads past P groups of F have nothing to sum */
  float4 v[U];
  auto load = [&]() {
    const float *at = part_o + (f / C) * D + 4 * (f % C);
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int y = y0 + u * P;
      v[u] = y < S ? __ldcg((const float4 *)(at + (int64_t)y * DEC_BR * D)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  if (more) load(); /* in flight while the weights are computed */

  /* lse = ln Σ_y e^(lse_y) per row, and the weights. */
  for (int r = warp; r < R; r += DEC_WARPS) {
    const float lse = fc_dec_row_weights<true>(part_lse + r, S, sW + r, DEC_BR, lane);
    if (a.lse && lane == 0) {
      const int rr = r0 + r, i = rr / a.group, h = hk * a.group + rr % a.group;
      a.lse[(b * a.heads_q + h) * a.seqlen_q + i] = lse;
    }
  }
  __syncthreads(); /* the weights are visible to every thread */

  /* O = Σ_y w_y · O_y, U splits at a time; a float4 summed over its splits goes out (or to its group's sum). */
  auto out = [&](int f_, float4 x) {
    const int rr = r0 + f_ / C, c = 4 * (f_ % C), i = rr / a.group, h = hk * a.group + rr % a.group;
    uint16_t *O = a.o + b * a.o_sb + (int64_t)i * a.o_ss + (int64_t)h * a.o_sh + c;
    const float e[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; k++)
      if (c + k < a.head_dim) O[k] = fc_from_float<T>(e[k]);
  };
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  while (more) {
    const int r = f / C;
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int y = y0 + u * P;
      const float w = y < S ? sW[y * DEC_BR + r] : 0.0f;
      if (w != 0.0f) { /* a weight of 0 adds nothing, whatever the partial holds; a NaN one makes the row NaN */
        acc.x = fmaf(w, v[u].x, acc.x), acc.y = fmaf(w, v[u].y, acc.y);
        acc.z = fmaf(w, v[u].z, acc.z), acc.w = fmaf(w, v[u].w, acc.w);
      }
    }
    y0 += U * P;
    if (y0 >= S) { /* float4 f is summed over this thread's splits */
      if (P > 1)
        sAcc[p * F + f] = acc;
      else
        out(f, acc);
      acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      f += DEC_NT, y0 = p, more = f < F; /* P > 1: F < DEC_NT, one float4 per thread */
    }
    if (more) load();
  }
  if (P > 1) { /* P is the CTA's: every thread is at this barrier */
    __syncthreads();
    if (tid < F) {
      float4 x = sAcc[tid];
      for (int q = 1; q < P; q++) {
        const float4 y = sAcc[q * F + tid];
        x.x += y.x, x.y += y.y, x.z += y.z, x.w += y.w;
      }
      out(tid, x);
    }
  }
}

/* Whether the image built for code_sm holds the kernel of head dim D with STAGES K/V stages: the two-stage d128
 * kernel is for blocks with less shared memory than three stages take (sm_86/89: 99 KB), so sm_90's image (227 KB)
 * has none (common/common.cuh, FC_KERNEL_IN_IMAGE; fc_dec_dispatch asks the same). */
static constexpr bool fc_dec_in_image(int code_sm, int D, int STAGES) {
  return !(code_sm / 10 == 9 && D == 128 && STAGES == 2);
}

/* The attention: CTA x = ((b·heads_kv + hk)·n_splits + split)·row_blocks + rb computes rows 16·rb.. of KV head hk
 * of sequence b against its split of the key blocks (the row blocks of one split are neighbours: they read the
 * same K/V at about the same time, from L2 after the first). PAGED: a block table (a.page_size > 0). One split: it
 * writes o and lse; more: its partials, and the last of the tile's CTAs to finish merges them (fc_dec_merge), or,
 * without counts (a.counts NULL: more than DEC_CTA_MERGE_ROWS rows per KV head), fc_dec_merge_kernel after it. */
template <typename T, int D, int STAGES, bool ALIGNED, bool PAGED>
__global__ void __launch_bounds__(DEC_NT, 2) fc_dec_kernel(const fc_dec_args a) {
  FC_KERNEL_IN_IMAGE(fc_dec_in_image(FC_CODE_SM, D, STAGES))
  constexpr int DS = fc_tile_stride(D), KD = D / 16, NO = D / 8;
  constexpr bool Q_IN_REGS = D <= 128; /* at d 256, Q's 64 registers beside O's 128 would spill */
  constexpr int QKD = Q_IN_REGS ? KD : 1;
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t *sQ = smem, *sK = sQ + DEC_BR * DS, *sV = sK + STAGES * DEC_BC * DS;
  int64_t *sRows = (int64_t *)(sV + STAGES * DEC_BC * DS); /* PAGED: [STAGES][DEC_BC][K, V] row offsets */
  static_assert(DEC_NT == 2 * DEC_BC, "a thread per key row of a block, in K and in V (fc_dec_page_of)");
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  int64_t x = blockIdx.x;
  const int rb = (int)(x % a.row_blocks);
  x /= a.row_blocks;
  const int split = (int)(x % a.n_splits);
  x /= a.n_splits;
  const int hk = (int)(x % a.heads_kv);
  const int64_t b = x / a.heads_kv;
  const int r0 = rb * DEC_BR;

  /* The key blocks some row of this CTA sees (rows' ranges grow with the query row, so the first row's start
   * and the last row's end bound them), then this split's part of them. */
  int len;
  const bool length_ok = fc_dec_length(a, b, &len);
  const int64_t shift = a.bottom_right ? (int64_t)len - a.seqlen_q : 0;
  int lo[2], hi[2]; /* visible keys of this thread's rows g and g + 8 */
#pragma unroll
  for (int rh = 0; rh < 2; rh++)
    fc_row_keys((r0 + g + 8 * rh) / a.group, shift, a.window_left, a.window_right, len, &lo[rh], &hi[rh]);
  int lo_first, hi_first, lo_last, hi_last;
  fc_row_keys(r0 / a.group, shift, a.window_left, a.window_right, len, &lo_first, &hi_first);
  fc_row_keys((min(r0 + DEC_BR, a.rows) - 1) / a.group, shift, a.window_left, a.window_right, len, &lo_last, &hi_last);
  int j_begin = lo_first / DEC_BC, j_end = lo_first < hi_last ? (hi_last + DEC_BC - 1) / DEC_BC : j_begin;
  fc_fwd_split_range(a.n_splits, split, &j_begin, &j_end);

  /* Paged: the rows of block j_begin + n go to buffer n % STAGES (fc_dec_page_of), those of the first STAGES blocks
   * here; and the check of the pages it reads, and of its share of all the sequence's pages (the splits of a tile
   * together cover them). One barrier serves both: the rows' loads and the check's are in flight together. The
   * rows are looked up before the check's answer is known, but only for keys < len ≤ capacity: entries within the
   * table's row, whatever they hold; a bad entry's offset is never used (no block is read then). */
  const int32_t *table_row = PAGED ? a.table + b * a.table_stride : NULL;
  const bool page_v = tid >= DEC_BC; /* this thread looks up rows of V (else K): warps 2 and 3 */
  const int64_t page_sb = page_v ? a.v_sb : a.k_sb, page_ss = page_v ? a.v_ss : a.k_ss;
  const int64_t page_head = (int64_t)hk * (page_v ? a.v_sh : a.k_sh);
  bool pages_ok = true;
  if constexpr (PAGED) {
    int c_begin = 0, c_end = (len + DEC_BC - 1) / DEC_BC;
    fc_fwd_split_range(a.n_splits, split, &c_begin, &c_end);
    int bad = fc_dec_pages_bad(a, b, j_begin * DEC_BC, min(j_end * DEC_BC, len));
    if (c_begin != j_begin || c_end != j_end) /* else the same entries: rows that see every key (plain decoding) */
      bad |= fc_dec_pages_bad(a, b, c_begin * DEC_BC, min(c_end * DEC_BC, len));
#pragma unroll
    for (int s = 0; s < STAGES; s++)
      fc_dec_page_put(sRows + s * DEC_BC * 2, fc_dec_page_of(a, table_row, j_begin + s, j_end, len), page_sb, page_ss,
                      page_head);
    pages_ok = !__syncthreads_or(bad); /* every thread: the rows are visible to all after it */
  }
  const bool ok = length_ok && pages_ok;
  if (!ok) j_end = j_begin; /* read nothing: the rows come out NaN */

  /* A dense block whose keys are all < len, of rows that are whole (head_dim = D), comes in by the walking loader
   * (fc_lean_load_whole: a pointer per thread stepped down its rows, no per-chunk index arithmetic or predicate);
   * the rest (the last block, paged caches, unaligned rows, d 256) chunk by chunk. */
  constexpr bool WHOLE = ALIGNED && !PAGED && fc_walk_threads<D, DEC_NT>() > 0;
  const bool whole_cols = a.head_dim == D;
  const uint16_t *Kb = a.kc + (int64_t)hk * a.k_sh + b * a.k_sb, *Vb = a.vc + (int64_t)hk * a.v_sh + b * a.v_sb;
  auto load_kv = [&](int j, int stage) {
    if constexpr (WHOLE)
      if (whole_cols && (j + 1) * DEC_BC <= len) {
        fc_lean_load_whole<DEC_BC, D, DEC_NT>(fc_smem_u32(sK + stage * DEC_BC * DS), Kb + (int64_t)j * DEC_BC * a.k_ss,
                                              a.k_ss, tid);
        fc_lean_load_whole<DEC_BC, D, DEC_NT>(fc_smem_u32(sV + stage * DEC_BC * DS), Vb + (int64_t)j * DEC_BC * a.v_ss,
                                              a.v_ss, tid);
        return;
      }
    fc_dec_load_kv<D, ALIGNED, PAGED>(sK + stage * DEC_BC * DS, sV + stage * DEC_BC * DS, a, b, hk, j, len,
                                      sRows + stage * DEC_BC * 2);
  };
  fc_dec_load_q<D, ALIGNED>(sQ, a, b, hk, r0);
  fc_cp_async_commit();
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) { /* one commit group per block, empty ones too: the counts stay fixed */
    if (j_begin + s < j_end) load_kv(j_begin + s, s);
    fc_cp_async_commit();
  }
  fc_cp_async_wait<STAGES - 1>(); /* Q's group is the oldest */
  __syncthreads();                /* every thread's part of Q has landed */

  const uint32_t q_lane = fc_fwd_lane<DS>(FC_FRAG_A, lane), k_lane = fc_fwd_lane<DS>(FC_FRAG_B, lane),
                 v_lane = fc_fwd_lane<DS>(FC_FRAG_BT, lane);
  const uint32_t sQ_u = fc_smem_u32(sQ);
  uint32_t qf[1][QKD][4];
  if constexpr (Q_IN_REGS) {
#pragma unroll
    for (int kk = 0; kk < KD; kk++) {
      fc_ldmatrix_x4(qf[0][kk], fc_fwd_addr<DS>(sQ_u, q_lane, 0, kk));
#pragma unroll
      for (int e = 0; e < 4; e++) qf[0][kk][e] ^= a.neg;
    }
  }
  float o[1][NO][4];
  fc_fwd_zero<1, NO>(o);
  float m[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.0f, 0.0f}};

  for (int j = j_begin; j < j_end; j++) {
    const int n = j - j_begin;
    fc_cp_async_wait<STAGES - 2>(); /* this thread's copies of block j have landed */
    /* Block j is visible to every warp, and every warp is done with block j − 1, whose stage the prefetch below
     * overwrites. */
    __syncthreads();
    {
      const int jp = j + STAGES - 1;
      if (jp < j_end) load_kv(jp, (n + STAGES - 1) % STAGES);
      fc_cp_async_commit();
    }
    /* Paged: block j + STAGES's row, its table entry loading while this block computes; written at the end of the
     * step into buffer n % STAGES, whose rows (block j's) were last read by block j's copies, STAGES − 1 steps ago. */
    fc_dec_page next = {-1, 0};
    if constexpr (PAGED) next = fc_dec_page_of(a, table_row, j + STAGES, j_end, len);
    /* This warp's 16 keys: rows 16·warp.. of the stage (a multiple of 8 rows: the swizzle is unchanged). */
    const int stage = n % STAGES, k0 = j * DEC_BC + 16 * warp;
    const uint32_t Kw = fc_smem_u32(sK + (stage * DEC_BC + 16 * warp) * DS);
    const uint32_t Vw = fc_smem_u32(sV + (stage * DEC_BC + 16 * warp) * DS);

    /* S = Q·K_wᵀ, raw dot products (|scale| goes into the exponent; a negative scale negated Q). */
    float s[1][2][4];
    fc_fwd_zero<1, 2>(s);
#pragma unroll
    for (int kk = 0; kk < KD; kk++)
      fc_fwd_qk_step<T, DS, 1, 2, QKD, Q_IN_REGS>(s, qf, kk, sQ_u, q_lane, 0, a.neg, Kw, k_lane);
    /* Keys a row does not see score −inf (the keys past len among them, loaded as zeros); where both of this
     * thread's rows see all 16 of the warp's keys (every block but the last, in plain decoding) nothing is masked. */
    if (k0 < max(lo[0], lo[1]) || k0 + 16 > min(hi[0], hi[1])) {
#pragma unroll
      for (int nb = 0; nb < 2; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int key = k0 + 8 * nb + 2 * t + (e & 1), rh = e >> 1;
          if (key < lo[rh] || key >= hi[rh]) s[0][nb][e] = -INFINITY;
        }
    }
    /* m' = max(m, rowmax S); O, l rescaled; P = 2^(c·S − c·m'); l += rowsum P; O += P·V_w. */
    fc_fwd_max_rescale<1, 2, NO>(s, m, l, o, a.scale_log2);
    float base[1][2];
    fc_fwd_bases<1>(m, a.scale_log2, base);
    fc_fwd_exp<1, 2>(s, l, base, a.scale_log2, 0, 2);
    uint32_t pa[1][1][4];
    fc_fwd_pack<T, 1, 2>(s, pa, 0, 2);
    fc_fwd_pv_step<T, DS, D, 1, NO>(o, pa[0], 0, Vw, v_lane);
    /* Read by block j + STAGES's copies, after the next step's barrier. */
    if constexpr (PAGED) fc_dec_page_put(sRows + stage * DEC_BC * 2, next, page_sb, page_ss, page_head);
  }

#if __CUDA_ARCH__ >= 900
  /* The merge kernel (a programmatic dependent on sm_90, where it runs) may be scheduled once every CTA is here: its
   * griddepcontrol.wait still waits for this grid to complete */
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  /* The warps' partials merged through shared memory (the ring is free once every copy has landed and every warp
   * has left the loop): per row, M = max_w m_w, L = Σ_w 2^(c·(m_w − M))·l_w, O = Σ_w 2^(c·(m_w − M))·O_w / L. */
  static_assert((DEC_WARPS * DEC_BR * (D + 3) + DEC_BR) * sizeof(float) <= 2 * STAGES * DEC_BC * DS * sizeof(uint16_t),
                "the warps' partials fit in the K/V ring");
  fc_cp_async_wait<0>();
  __syncthreads();
  float *sO = (float *)sK;                 /* [warp][row][D]: O_w, unnormalised */
  float *sM = sO + DEC_WARPS * DEC_BR * D; /* [warp][row]: m_w (raw scores) */
  float *sL = sM + DEC_WARPS * DEC_BR;     /* [warp][row]: l_w */
  float *sC = sL + DEC_WARPS * DEC_BR;     /* [warp][row]: 2^(c·(m_w − M)) / L */
  float *sLse = sC + DEC_WARPS * DEC_BR;   /* [row] */
#pragma unroll
  for (int rh = 0; rh < 2; rh++) {
    const float lr = fc_fwd_quad_sum(l[0][rh]);
    if (t == 0) sM[warp * DEC_BR + g + 8 * rh] = m[0][rh], sL[warp * DEC_BR + g + 8 * rh] = lr;
  }
#pragma unroll
  for (int nb = 0; nb < NO; nb++)
#pragma unroll
    for (int e = 0; e < 4; e++) sO[(warp * DEC_BR + g + 8 * (e >> 1)) * D + 8 * nb + 2 * t + (e & 1)] = o[0][nb][e];
  __syncthreads();
  if (tid < DEC_BR) {
    float M = -INFINITY, L = 0.0f, alpha[DEC_WARPS];
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) M = fc_fmax_nan(M, sM[w * DEC_BR + tid]);
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) { /* M = −inf: no warp saw a key, every weight 0 */
      alpha[w] = M == -INFINITY ? 0.0f : exp2f((sM[w * DEC_BR + tid] - M) * a.scale_log2);
      L += alpha[w] * sL[w * DEC_BR + tid];
    }
    const float inv = M == -INFINITY ? 0.0f : 1.0f / L;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) sC[w * DEC_BR + tid] = ok ? alpha[w] * inv : NAN;
    sLse[tid] = ok ? fc_fwd_row_lse(M, L, a.scale) : NAN;
  }
  __syncthreads();

  /* Out: o and lse (one split), or this split's rows of the partials. */
  const int64_t tile = (b * a.heads_kv + hk) * a.row_blocks + rb, part_row = (tile * a.n_splits + split) * DEC_BR;
  for (int idx = tid; idx < DEC_BR * D; idx += DEC_NT) {
    const int r = idx / D, c = idx % D, rr = r0 + r;
    if (rr >= a.rows || c >= a.head_dim) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) { /* a weight of 0 adds nothing, even where a masked V was not finite */
      const float cw = sC[w * DEC_BR + r];
      if (cw != 0.0f) v += cw * sO[(w * DEC_BR + r) * D + c];
    }
    const int i = rr / a.group, h = hk * a.group + rr % a.group;
    if (a.n_splits == 1)
      a.o[b * a.o_sb + (int64_t)i * a.o_ss + (int64_t)h * a.o_sh + c] = fc_from_float<T>(v);
    else
      a.part_o[(part_row + r) * D + c] = v;
  }
  if (tid < DEC_BR && r0 + tid < a.rows) {
    const int rr = r0 + tid, i = rr / a.group, h = hk * a.group + rr % a.group;
    if (a.n_splits > 1)
      a.part_lse[part_row + tid] = sLse[tid];
    else if (a.lse)
      a.lse[(b * a.heads_q + h) * a.seqlen_q + i] = sLse[tid];
  }
  if (a.n_splits == 1 || !a.counts) return; /* no counts: the merge kernel merges (fc_dec_launch) */

  /* The tile's count: the CTA that brings it to n_splits is the last of the tile's CTAs to finish, and merges. Release
   * (CUTLASS's barrier does the same): every thread's partials precede thread 0's fence through the barrier, and the
   * fence precedes its atomic. Acquire: the atomic that makes it last precedes its second fence, which precedes every
   * thread's loads of the other CTAs' partials through __syncthreads_or; the merge loads them from L2 (ld.cg), where
   * the other CTAs' fences put them. No other CTA touches the count again in this launch, so the last resets it:
   * the next launch on the stream (a call, a graph's replay) finds it zero, as fc_device_zeroed's users leave it.
   * The merge reuses the ring (every thread has read its part of sO and sC before the barrier). */
  __syncthreads();
  int last = 0;
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(a.counts + tile, 1) == a.n_splits - 1;
    if (last) {
      __threadfence();
      a.counts[tile] = 0;
    }
  }
  if (!__syncthreads_or(last)) return;
  static_assert((DEC_SPLIT_MAX * DEC_BR + 4 * DEC_NT) * sizeof(float) <= 2 * STAGES * DEC_BC * DS * sizeof(uint16_t),
                "the merge's weights and sums fit in the K/V ring");
  fc_dec_merge<T, D>(a, tile, b, hk, r0, (float *)sK);
}

/* The merge of the splits where a KV head has more than DEC_CTA_MERGE_ROWS query rows (fc_dec_launch): one warp per
 * row of a tile (sequence, KV head, row block; a grid-stride loop over them), so that the rows of few tiles (batch-1
 * decoding: one tile per KV head) spread over the SMs instead of all falling to each tile's last CTA.
 * The lanes read the splits' lse once (lane y: splits y, y + 32, ...), reduce them to the row's lse by shuffles and
 * leave the weights (fc_dec_row_weights, as the last CTA's merge) e^(lse_s − lse) in shared memory; then each lane sums its columns (float2 pairs, the warp's
 * loads 256 contiguous bytes) over the splits, its loads independent of the weights so that 8 splits' loads are in
 * flight at once. (One CTA per row, its threads over the splits and then the columns, with three barriers and each
 * column's loads behind a test of the weight, took 6.3 µs at batch 1, heads 32/8, 128k keys, 32 splits on an H200,
 * where cuDNN's reduction takes 2.9; a warp per row that read every split's lse again for each column took longer
 * than the attention.) A split that no key of the row reached (lse −inf) has weight 0 and adds nothing (its partial
 * is 0, and its product is not taken); a row that no split reached gets o = 0 and lse −inf; a NaN lse (a NaN score,
 * or an unusable sequence) makes the row NaN. On sm_90 it is launched as a programmatic dependent of the attention
 * (fc_dec_launch), which lets its CTAs start while the attention's last CTAs finish: griddepcontrol.wait holds each
 * until the attention grid has completed and its writes are visible. */
template <typename T, int D>
__global__ void __launch_bounds__(DEC_MERGE_THREADS) fc_dec_merge_kernel(const fc_dec_args a, int64_t n_rows) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  constexpr int WARPS = DEC_MERGE_THREADS / 32, CPL = D / 64; /* float2 pairs per lane */
  __shared__ float w[WARPS][DEC_SPLIT_MAX];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t x = (int64_t)blockIdx.x * WARPS + warp; x < n_rows; x += (int64_t)gridDim.x * WARPS) {
    const int64_t tile = x / DEC_BR; /* x is uniform over the warp: so are the branches below */
    const int r = (int)(x % DEC_BR), rb = (int)(tile % a.row_blocks), hk = (int)(tile / a.row_blocks % a.heads_kv);
    const int64_t b = tile / a.row_blocks / a.heads_kv;
    const int r0 = rb * DEC_BR;
    if (r >= a.rows - r0) continue;                       /* past the last row of the last row block */
    const int64_t first = tile * a.n_splits * DEC_BR + r; /* the row in split y: first + y·DEC_BR */
    const float lse = fc_dec_row_weights<false>(a.part_lse + first, a.n_splits, w[warp], 1, lane);
    __syncwarp();
    float2 acc[CPL];
#pragma unroll
    for (int j = 0; j < CPL; j++) acc[j] = make_float2(0.0f, 0.0f);
    const float *part = a.part_o + first * D + 2 * lane;
#pragma unroll 8
    for (int y = 0; y < a.n_splits; y++) {
      const float wy = w[warp][y];
#pragma unroll
      for (int j = 0; j < CPL; j++) {
        const float2 v = *(const float2 *)(part + (int64_t)y * DEC_BR * D + 64 * j);
        if (wy != 0.0f) acc[j].x = fmaf(wy, v.x, acc[j].x), acc[j].y = fmaf(wy, v.y, acc[j].y);
      }
    }
    const int rr = r0 + r, i = rr / a.group, h = hk * a.group + rr % a.group;
    uint16_t *O = a.o + b * a.o_sb + (int64_t)i * a.o_ss + (int64_t)h * a.o_sh;
#pragma unroll
    for (int j = 0; j < CPL; j++) {
      const int c = 64 * j + 2 * lane;
      if (c < a.head_dim) O[c] = fc_from_float<T>(acc[j].x);
      if (c + 1 < a.head_dim) O[c + 1] = fc_from_float<T>(acc[j].y);
    }
    if (a.lse && lane == 0) a.lse[(b * a.heads_q + h) * a.seqlen_q + i] = lse;
    __syncwarp(); /* w is read before the warp's next row writes it */
  }
}

/* ---- host ---------------------------------------------------------------------------------------------------- */

/* ---- host ---------------------------------------------------------------------------------------------------- */
/* The compiled head dim that runs d (0: none). */
static int fc_dec_dim(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0; }

/* The plan: key splits per tile. `tiles` CTAs (sequences × KV heads × row blocks) alone leave SMs idle when there
 * are fewer than the GPU's slots (SMs × CTAs per SM), and an idle SM streams nothing; so the count that makes the
 * grid's last wave fullest, after FlashAttention-2's rule (num_splits_heuristic): the fewest splits whose efficiency
 * waves / ⌈waves⌉ is within 95 % of the best, waves = tiles · n / slots (FlashAttention-2 takes 85 %: at batch 1,
 * heads 32/8, d 128 on an H200 that picked 29 splits, 19.0 / 44.4 / 140.3 µs at 8k / 32k / 128k keys in CUDA graphs,
 * where 95 % picks 32: 17.6 / 43.0 / 132.5 µs; bench/results/checks/gpu-check-decode-merge-h200-2026-11-30.txt;
 * batch 8 takes 4 either way; these and fc_dec_splits' figures were measured with the separate merge kernel, before
 * the last CTA merged; not re-measured since). At most DEC_SPLIT_MAX, and at least 2 key blocks (128 keys) per split of
 * the capacity: below that a split's partial (16 · (d + 1) floats) and its share of the merge (which the tile's last
 * CTA reads from L2 after the split's end) cost about what it saves. The lengths are on the device, so the capacity
 * stands for the longest; the splits of a shorter sequence are shorter (or empty, and cheap). A caller's count
 * (num_splits > 0) is taken as it is, up to one split per key block of the capacity and DEC_SPLIT_MAX. Depends on the
 * shape and the device only: the same bits run to run on one GPU model. */
static int fc_dec_fill(int64_t tiles, int64_t most, int64_t slots) {
  if (tiles >= slots) return 1;
  double eff[DEC_SPLIT_MAX + 1], best = 0.0;
  for (int64_t n = 1; n <= most; n++) {
    const double waves = (double)(tiles * n) / (double)slots;
    eff[n] = waves / ceil(waves);
    if (eff[n] > best) best = eff[n];
  }
  for (int64_t n = 1; n <= most; n++)
    if (eff[n] >= 0.95 * best) return (int)n;
  return 1;
}

/* The slots count every CTA an SM holds (per_sm, two at d 128), but a second CTA per SM pays only where each split
 * streams long enough: below DEC_SHARE_KEYS keys per split, the count that fills one CTA per SM. H200, batch 1,
 * heads 32/8, d 128, the public call timed with events: 16 splits (one CTA per SM) against 32 (two) took 22.9 /
 * 49.7 µs against 25.1 / 52.1 at 8k / 32k keys, and 145.5 against 141.7 µs at 128k (4k keys per split); 24 splits
 * (192 CTAs, SMs unevenly shared) were slower than either at 32k and 128k. */
static int fc_dec_splits(int64_t tiles, int64_t capacity, int64_t sms, int per_sm, int requested) {
  const int64_t key_blocks = fc_cdiv(capacity, DEC_BC);
  int64_t most = requested > 0 ? (requested < key_blocks ? requested : key_blocks) : key_blocks / 2;
  if (most > DEC_SPLIT_MAX) most = DEC_SPLIT_MAX;
  if (most < 1) most = 1;
  if (requested > 0) return (int)most;
  int n = fc_dec_fill(tiles, most, sms * per_sm);
  if (per_sm > 1 && n > 1 && capacity < (int64_t)n * DEC_SHARE_KEYS) n = fc_dec_fill(tiles, most, sms);
  return n;
}

/* One attention launch of D and STAGES: the kernel for the layout (paged or dense, 16-byte aligned rows or not), its
 * split count (fc_dec_splits, from the CTAs per SM the occupancy calculator gives), and with more than one split the
 * partials in the handle's workspace and a counter per tile in its zeroed memory; the tiles' last CTAs merge, so the
 * launch is the whole call (after the append), up to DEC_CTA_MERGE_ROWS query rows per KV head; above, the merge kernel
 * (a programmatic dependent on sm_90) merges instead. */
template <typename T, int D, int STAGES>
static flashc_status fc_dec_launch(const fc_kv_problem *kp, fc_dec_args *a, bool aligned) {
  const fc_problem *p = &kp->base;
  const bool paged = a->page_size > 0;
  void (*kernel)(const fc_dec_args) =
      paged ? (aligned ? fc_dec_kernel<T, D, STAGES, true, true> : fc_dec_kernel<T, D, STAGES, false, true>)
            : (aligned ? fc_dec_kernel<T, D, STAGES, true, false> : fc_dec_kernel<T, D, STAGES, false, false>);
  const size_t smem = fc_dec_smem(D, STAGES, paged);
  FC_CHECK(fc_mma_smem((const void *)kernel, smem, "flashc_forward_kvcache: the CUDA decode kernel"));
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  int per_sm = 0;
  FC_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)kernel, DEC_NT, smem));
  const int64_t tiles = p->batch * p->heads_kv * a->row_blocks;
  a->n_splits = fc_dec_splits(tiles, kp->capacity, props.num_sms, per_sm > 0 ? per_sm : 1, kp->num_splits);
  int64_t ctas;
  if (!fc_mul_ok(tiles, a->n_splits, &ctas) || ctas > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: %lld sequences x %lld KV heads x %d row blocks x %d splits exceed 2^31-1 CTAs on the CUDA "
                    "backends",
                    OP, (long long)p->batch, (long long)p->heads_kv, a->row_blocks, a->n_splits);
  if (a->n_splits > 1) { /* the partials (D floats of O and one lse per row of each split of each tile), the counts */
    const size_t rows = (size_t)ctas * DEC_BR;
    void *ws = NULL, *counts = NULL;
    FC_CHECK(fc_device_workspace(p, rows * (D + 1) * sizeof(float), &ws));
    a->part_o = (float *)ws;
    a->part_lse = a->part_o + rows * D;
    /* From offset 0: no other kernel of this call uses the zeroed memory, and the other calls on the handle (the
     * hopper forward's flags) are ordered with this one on its stream. */
    if (a->rows <= DEC_CTA_MERGE_ROWS) {
      FC_CHECK(fc_device_zeroed(p, (size_t)tiles * sizeof(int), &counts));
      a->counts = (int *)counts;
    } else {
      a->counts = NULL; /* the merge kernel's */
    }
  }
  kernel<<<(unsigned)ctas, DEC_NT, smem, fc_stream(p)>>>(*a);
  FC_LAUNCH_CHECK("fc_dec_kernel");
  if (a->n_splits > 1 && !a->counts) {
    const int64_t n_rows = tiles * DEC_BR; /* < 2^31 · 16: tiles · n_splits ≤ 2^31 − 1 above */
    const int64_t warps = DEC_MERGE_THREADS / 32, blocks = (n_rows + warps - 1) / warps;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(blocks < (1 << 20) ? blocks : (1 << 20))), cfg.blockDim = dim3(DEC_MERGE_THREADS);
    cfg.stream = fc_stream(p);
    /* sm_90: a programmatic dependent of the attention (the merge kernel's griddepcontrol.wait orders the two) */
    cudaLaunchAttribute dep;
    dep.id = cudaLaunchAttributeProgrammaticStreamSerialization, dep.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &dep, cfg.numAttrs = props.code_sm >= 90 ? 1 : 0; /* the image whose merge waits */
    FC_CUDA_CHECK(cudaLaunchKernelEx(&cfg, fc_dec_merge_kernel<T, D>, *a, n_rows));
    FC_LAUNCH_CHECK("fc_dec_merge_kernel");
  }
  return FLASHC_OK;
}

template <typename T> static flashc_status fc_dec_dispatch(const fc_kv_problem *kp, fc_dec_args *a, bool aligned) {
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  switch (fc_dec_dim(kp->base.head_dim)) {
  case 64: return fc_dec_launch<T, 64, 3>(kp, a, aligned);
  case 128:
    return fc_dec_smem(128, 3, a->page_size > 0) <= props.smem_per_block_optin ||
                   !fc_dec_in_image(props.code_sm, 128, 2)
               ? fc_dec_launch<T, 128, 3>(kp, a, aligned)
               : fc_dec_launch<T, 128, 2>(kp, a, aligned);
  default: return fc_dec_launch<T, 256, 2>(kp, a, aligned);
  }
}

extern "C" flashc_status fc_cuda_forward_kvcache(const fc_kv_problem *kp) {
  const fc_problem *p = &kp->base;
  if (p->dtype != FLASHC_F16 && p->dtype != FLASHC_BF16)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: dtype %s is not supported by the CUDA decode kernel (f16, bf16)", OP,
                    flashc_dtype_name(p->dtype));
  if (!fc_dec_dim(p->head_dim))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: head_dim %lld exceeds 256 on the CUDA backends", OP,
                    (long long)p->head_dim);
  /* Keys, rows and heads are ints in the kernels. */
  const int64_t group = p->heads_q / p->heads_kv, rows = p->seqlen_q * group;
  if (kp->capacity > INT32_MAX || rows > INT32_MAX - DEC_BR || p->heads_q > INT32_MAX || kp->seqlen_new > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: a cache of %lld keys or %lld query rows per KV head (seqlen_q %lld x %lld heads) exceed the "
                    "CUDA backends' 2^31-1",
                    OP, (long long)kp->capacity, (long long)rows, (long long)p->seqlen_q, (long long)group);
  if (p->batch == 0) return FLASHC_OK;
  if (p->batch > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: batch %lld exceeds 2^31-1 on the CUDA backends", OP,
                    (long long)p->batch);

  fc_dec_args a;
  memset(&a, 0, sizeof a);
  a.q = (const uint16_t *)p->q.data;
  a.o = (uint16_t *)p->o.data;
  a.lse = p->lse;
  a.kc = (uint16_t *)kp->k_cache.data;
  a.vc = (uint16_t *)kp->v_cache.data;
  a.kn = (const uint16_t *)kp->k_new.data;
  a.vn = (const uint16_t *)kp->v_new.data;
  a.q_sb = p->q.stride_b, a.q_ss = p->q.stride_s, a.q_sh = p->q.stride_h;
  a.o_sb = p->o.stride_b, a.o_ss = p->o.stride_s, a.o_sh = p->o.stride_h;
  a.k_sb = kp->k_cache.stride_b, a.k_ss = kp->k_cache.stride_s, a.k_sh = kp->k_cache.stride_h;
  a.v_sb = kp->v_cache.stride_b, a.v_ss = kp->v_cache.stride_s, a.v_sh = kp->v_cache.stride_h;
  a.kn_sb = kp->k_new.stride_b, a.kn_ss = kp->k_new.stride_s, a.kn_sh = kp->k_new.stride_h;
  a.vn_sb = kp->v_new.stride_b, a.vn_ss = kp->v_new.stride_s, a.vn_sh = kp->v_new.stride_h;
  a.table = kp->block_table;
  a.table_stride = kp->block_table_stride;
  a.num_blocks = kp->num_blocks;
  a.page_size = kp->block_table ? (int)kp->page_size : 0; /* ≤ capacity ≤ 2^31 − 1 */
  a.seqlens = kp->cache_seqlens;
  a.capacity = (int)kp->capacity;
  a.seqlen_q = (int)p->seqlen_q;
  a.seqlen_new = (int)kp->seqlen_new;
  a.heads_q = (int)p->heads_q;
  a.heads_kv = (int)p->heads_kv;
  a.group = (int)group;
  a.head_dim = (int)p->head_dim;
  a.rows = (int)rows;
  a.row_blocks = (int)fc_cdiv(rows, DEC_BR);
  a.scale = fabsf(p->scale);
  a.scale_log2 = a.scale * 1.4426950408889634f;
  a.neg = p->scale < 0.0f ? 0x80008000u : 0u;
  a.window_left = p->window_left;
  a.window_right = p->window_right;
  a.bottom_right = p->bottom_right;

  if (kp->seqlen_new > 0) { /* before the attention, on the same stream */
    fc_dec_append_kernel<<<(unsigned)p->batch, DEC_APPEND_THREADS, 0, fc_stream(p)>>>(a);
    FC_LAUNCH_CHECK("fc_dec_append_kernel");
  }
  if (p->seqlen_q == 0) return FLASHC_OK;
  /* cp.async copies 16 aligned bytes: q's and the caches' rows must start on 16-byte boundaries. */
  const bool aligned =
      fc_mma_view_aligned(&p->q) && fc_mma_view_aligned(&kp->k_cache) && fc_mma_view_aligned(&kp->v_cache);
  if (p->dtype == FLASHC_F16) return fc_dec_dispatch<__half>(kp, &a, aligned);
  return fc_dec_dispatch<__nv_bfloat16>(kp, &a, aligned);
}
