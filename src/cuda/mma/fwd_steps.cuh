/* mma/fwd_steps.cuh — the steps of one key block of cuda-mma's forward
 * (mma/fwd.cu), as small inline functions that both of its pipelines call: S =
 * Q_i·K_jᵀ one k-step at a time, the mask, the online softmax's max and
 * rescale, P = 2^(c·S − c·m) for a range of S's n-blocks, O += P·V_j; and the
 * tile loader with few registers across the key loop.
 *
 * Per thread (lane = 4g + t) and M-tile mt of 16 rows: s[mt][x][e] is the score
 * of row g + 8·(e >> 1) and key 8x + 2t + (e & 1) of the block; o[mt][x][e]
 * likewise for column 8x + 2t + (e & 1) of O; m and l are indexed [mt][rh] with
 * rh = e >> 1. P, packed to 16 bits, is the A fragment of P·V: pa[mt][kb] holds
 * keys 16kb..16kb+15 (see mma/ptx.cuh: C's layout is A's cut in half). */
#ifndef FLASHC_CUDA_MMA_FWD_STEPS_CUH
#define FLASHC_CUDA_MMA_FWD_STEPS_CUH

#include "common/common.cuh"
#include "mma/tile.cuh"

#include <math.h>

/* ldmatrix.x4 addresses with one register per lane instead of mma/tile.cuh's
 * four (fc_frag_lane): the swizzled chunk (2i + half) ^ (row & 7) of
 * fc_frag_lane's offset i is (half ^ (row & 7)) ^ 2i, and a tile, a row offset
 * of 8 rows and a group of 8 chunks are all multiples of 128 bytes, so that the
 * 2i part is an XOR on bits 5–6 of the final address. fc_fwd_lane gives the
 * byte offset of i = 0 for this lane; fc_fwd_addr the address of the fragment
 * at tile row row0 (a multiple of 8) and k-step (or n-block pair) kk, as
 * fc_frag_addr does. Needs tiles on 128-byte boundaries (smem is
 * __align__(128), every tile a multiple). */
template <int DS> static __device__ __forceinline__ uint32_t fc_fwd_lane(fc_frag_kind kind, int lane) {
  int row, half;
  fc_frag_row_half(kind, lane, &row, &half);
  return 2u * (uint32_t)(row * DS) + ((uint32_t)(half ^ (row & 7)) << 4);
}
template <int DS>
static __device__ __forceinline__ uint32_t fc_fwd_addr(uint32_t tile, uint32_t lane_off, int row0, int kk) {
  return (tile + lane_off + (uint32_t)(2 * row0 * DS + (kk >> 2) * 128)) ^ ((uint32_t)(kk & 3) << 5);
}

/* acc[mt][2p], acc[mt][2p + 1] += a[mt]·B for the NP pairs p of n-blocks of B over one k-step, B's two n-blocks one
 * ldmatrix.x4 (TRANS: .trans) at B_AT(p) that serves the MT tiles of A. */
template <typename T, int MT, int NP, bool TRANS, class BAt>
static __device__ __forceinline__ void fc_fwd_mma_pairs(float (*acc)[2 * NP][4], const uint32_t (*a)[4], BAt b_at) {
#pragma unroll
  for (int p = 0; p < NP; p++) {
    uint32_t b[4];
    if constexpr (TRANS)
      fc_ldmatrix_x4_trans(b, b_at(p));
    else
      fc_ldmatrix_x4(b, b_at(p));
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      fc_mma<T>(acc[mt][2 * p], a[mt], b[0], b[1]);
      fc_mma<T>(acc[mt][2 * p + 1], a[mt], b[2], b[3]);
    }
  }
}

/* S += Q_i·K_jᵀ over k-step kk (16 columns of the head dim), for all MT tiles of the warp: each K_j fragment (at
 * K_AT(p), n-blocks 2p and 2p + 1) serves the MT tiles. Q comes from registers (qf, Q_IN_REGS) or from sQ at Q_AT(mt),
 * negated by `neg` when the scale is negative (0 where sQ holds −Q_i already). */
template <typename T, int MT, int NS, int QKD, bool Q_IN_REGS, class QAt, class KAt>
static __device__ __forceinline__ void fc_fwd_qk(float (*s)[NS][4], const uint32_t (*qf)[QKD][4], int kk, uint32_t neg,
                                                 QAt q_at, KAt k_at) {
  uint32_t qa[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    if constexpr (Q_IN_REGS) {
#pragma unroll
      for (int x = 0; x < 4; x++) qa[mt][x] = qf[mt][kk][x];
    } else {
      fc_ldmatrix_x4(qa[mt], q_at(mt));
#pragma unroll
      for (int x = 0; x < 4; x++) qa[mt][x] ^= neg;
    }
  }
  fc_fwd_mma_pairs<T, MT, NS / 2, false>(s, qa, k_at);
}

/* fc_fwd_qk from sQ at the warp's row wrow and K_j's stage Kj, through the lane offsets q_lane and k_lane. */
template <typename T, int DS, int MT, int NS, int QKD, bool Q_IN_REGS>
static __device__ __forceinline__ void fc_fwd_qk_step(float (*s)[NS][4], const uint32_t (*qf)[QKD][4], int kk,
                                                      uint32_t sQ, uint32_t q_lane, int wrow, uint32_t neg, uint32_t Kj,
                                                      uint32_t k_lane) {
  fc_fwd_qk<T, MT, NS, QKD, Q_IN_REGS>(
      s, qf, kk, neg, [&](int mt) { return fc_fwd_addr<DS>(sQ, q_lane, wrow + 16 * mt, kk); },
      [&](int p) { return fc_fwd_addr<DS>(Kj, k_lane, 16 * p, kk); });
}

template <int MT, int NS> static __device__ __forceinline__ void fc_fwd_zero(float (*s)[NS][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < NS; x++) s[mt][x][0] = s[mt][x][1] = s[mt][x][2] = s[mt][x][3] = 0.0f;
}

/* Keys outside a row's visible range [lo, hi) score −inf. k0 is the block's
 * first key; this thread's rows are row0 + 16·mt + g + 8·rh (row0: the warp's
 * first row in the sequence). The ranges are recomputed here rather than kept
 * in registers: only the few blocks that cut through the diagonal, a window or
 * the key tail pay. REL (the lean kernel's): the keys relative to this thread's
 * first column, each row's range becoming [lo − k0 − 2t, hi − k0 − 2t) once and
 * each element comparing it with its compile-time column 8x + (e & 1), so that no
 * key index is kept per element (the absolute keys, at d 128, pushed the
 * predicates into bit masks: ~200 more instructions per masked block). */
template <int MT, int NS, bool REL = false>
static __device__ __forceinline__ void fc_fwd_mask(float (*s)[NS][4], int row0, int64_t shift, int64_t window_left,
                                                   int64_t window_right, int sk, int k0, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      int lo, hi;
      fc_row_keys(row0 + 16 * mt + g + 8 * rh, shift, window_left, window_right, sk, &lo, &hi);
      if constexpr (REL) {
        const int first = k0 + 2 * t; /* lo, hi, k0 in [0, sk]: no overflow */
        lo -= first, hi -= first;
      }
#pragma unroll
      for (int x = 0; x < NS; x++)
#pragma unroll
        for (int e = 2 * rh; e < 2 * rh + 2; e++) {
          const int key = REL ? 8 * x + (e & 1) : k0 + 8 * x + 2 * t + (e & 1);
          if (key < lo || key >= hi) s[mt][x][e] = -INFINITY;
        }
    }
}

/* m' = max(m, rowmax S), then O and l rescaled by 2^(c·(m − m')), lazily: while
 * no row of the warp has grown its max by more than 2^8, m stays where it was
 * and P may reach 256 (exact in fp16/bf16, and l uses the same base), which
 * spares the O·alpha multiplies of most blocks. c = scale_log2. The maxima
 * carry NaN (fc_fmax_nan), and a NaN max always moves m: a row that met a NaN
 * score must not keep m = −inf, which means "no key seen" at the end. */
template <int MT, int NS, int NO>
static __device__ __forceinline__ void fc_fwd_max_rescale(const float (*s)[NS][4], float (*m)[2], float (*l)[2],
                                                          float (*o)[NO][4], float scale_log2) {
  float mx[MT][2];
  bool grow = false;
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
      float v = m[mt][rh];
#pragma unroll
      for (int x = 0; x < NS; x++) v = fc_fmax_nan(v, fc_fmax_nan(s[mt][x][2 * rh], s[mt][x][2 * rh + 1]));
      v = fc_fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 1)); /* the 4 threads of a row share its max */
      v = fc_fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
      mx[mt][rh] = v;
      /* m = −inf, v finite: true; both −inf: NaN, false; v NaN: true */
      grow |= (v - m[mt][rh]) * scale_log2 > 8.0f || v != v;
    }
  if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int rh = 0; rh < 2; rh++) {
        /* A row that has seen only masked keys keeps m = −inf and uses 0 as its
         * base (never inf − inf). */
        const float base = mx[mt][rh] == -INFINITY ? 0.0f : mx[mt][rh] * scale_log2;
        const float alpha = fc_exp2(m[mt][rh] * scale_log2 - base);
        m[mt][rh] = mx[mt][rh];
        l[mt][rh] *= alpha;
#pragma unroll
        for (int x = 0; x < NO; x++) {
          o[mt][x][2 * rh] *= alpha;
          o[mt][x][2 * rh + 1] *= alpha;
        }
      }
  }
}

/* Base of the exponent of each row: c·m, or 0 for a row that has seen only
 * masked keys (its scores are all −inf, so that P = 2^−inf = 0). */
template <int MT>
static __device__ __forceinline__ void fc_fwd_bases(const float (*m)[2], float scale_log2, float (*base)[2]) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++) base[mt][rh] = m[mt][rh] == -INFINITY ? 0.0f : m[mt][rh] * scale_log2;
}

/* P = 2^(c·S − base) for n-blocks [x0, x1) of S, in place; l += this thread's
 * part of rowsum P. The loops run over all NS n-blocks and test the range, so
 * that they unroll whole and the test folds away once the caller's own loop is
 * unrolled and x0, x1 are constants. */
template <int MT, int NS>
static __device__ __forceinline__ void fc_fwd_exp(float (*s)[NS][4], float (*l)[2], const float (*base)[2],
                                                  float scale_log2, int x0, int x1) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int rh = 0; rh < 2; rh++)
#pragma unroll
      for (int x = 0; x < NS; x++) {
        if (x < x0 || x >= x1) continue;
        s[mt][x][2 * rh] = fc_exp2(fmaf(s[mt][x][2 * rh], scale_log2, -base[mt][rh]));
        s[mt][x][2 * rh + 1] = fc_exp2(fmaf(s[mt][x][2 * rh + 1], scale_log2, -base[mt][rh]));
        l[mt][rh] += s[mt][x][2 * rh] + s[mt][x][2 * rh + 1];
      }
}

/* P of n-blocks [x0, x1) packed to 16 bits into the A fragments pa (n-block x →
 * half x & 1 of pa[x / 2]). */
template <typename T, int MT, int NS>
static __device__ __forceinline__ void fc_fwd_pack(const float (*s)[NS][4], uint32_t (*pa)[NS / 2][4], int x0, int x1) {
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int x = 0; x < NS; x++) {
      if (x < x0 || x >= x1) continue;
      pa[mt][x / 2][2 * (x & 1)] = fc_pack2<T>(s[mt][x][0], s[mt][x][1]);
      pa[mt][x / 2][2 * (x & 1) + 1] = fc_pack2<T>(s[mt][x][2], s[mt][x][3]);
    }
}

/* O += P·V_j over k-step kb (keys 16kb..16kb+15); each V_j fragment
 * (ldmatrix.x4.trans: two n-blocks of O) serves the MT tiles. */
template <typename T, int DS, int D, int MT, int NO>
static __device__ __forceinline__ void fc_fwd_pv_step(float (*o)[NO][4], const uint32_t (*pa)[4], int kb, uint32_t Vj,
                                                      uint32_t v_lane) {
  fc_fwd_mma_pairs<T, MT, D / 16, true>(o, pa, [&](int dp) { return fc_fwd_addr<DS>(Vj, v_lane, 16 * kb, dp); });
}

/* O += P·V_j: P packed to 16 bits one k-step (16 keys) at a time, each k-step's A fragments (keys 16kb..16kb+15) in pk
 * before PV(kb), the kernel's O += P·V_j over that k-step. pa and pk are the caller's, declared where this loop
 * stood in its kernel: as locals of this function they changed the large kernels' register allocation. */
template <typename T, int MT, int NS, class PV>
static __device__ __forceinline__ void fc_fwd_pv(const float (*s)[NS][4], uint32_t (*pa)[NS / 2][4], uint32_t (*pk)[4],
                                                 PV pv) {
#pragma unroll
  for (int kb = 0; kb < NS / 2; kb++) {
    fc_fwd_pack<T, MT, NS>(s, pa, 2 * kb, 2 * kb + 2);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int x = 0; x < 4; x++) pk[mt][x] = pa[mt][kb][x];
    pv(kb);
  }
}

/* fc_load_tile with the few registers a thread needs across
 * the key loop: each thread keeps one chunk column c and rows r0, r0 + R, r0 +
 * 2R, … (R = NT / CH rows per pass, a multiple of 8, so that every row of the
 * thread has the same swizzle and its shared addresses differ by constants),
 * walking one global pointer down the rows. fc_load_tile's general indexing let
 * the compiler precompute every chunk's global and shared offset once, outside
 * the key loop: 3 registers a chunk, which with MT = 2 at d 128 (16 chunks of K
 * and V a thread) spilled. The empty asm hides the pointer's arithmetic
 * progression, so that the compiler cannot turn it back into per-chunk offsets.
 * Where NT is not a multiple of 8·CH (d 96: 12 chunks a row, 128 threads; d 160, 192 at 256) the first
 * fc_walk_threads of them copy (at d 96: 96 threads, 8 rows a pass) and the rest copy nothing: mma/tile.cuh's
 * loader, which these dims took before, spent more on its per-chunk division, predicates and addresses (and
 * spilled 92 bytes at d 96) than the idle threads cost. cuda-mma's causal forward, bf16, 32 heads, H200: d 96
 * 18–21 % faster (b16 s1k 467 → 382 µs, b1 s32k 21.1 → 17.4 ms), d 160 7–9 %, d 192 5–7 %.
 */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void fc_fwd_load_tile_walk(uint16_t *tile, const uint16_t *src, int64_t stride,
                                                             int rows_left, int d, int tid, const uint16_t *safe) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, NTL = fc_walk_threads<D, NT>(), R = NTL / CH;
  static_assert(NTL > 0 && R % 8 == 0, "a thread's rows must share their swizzle");
  if (NTL < NT && tid >= NTL) return;
  const int c = tid % CH, r0 = tid / CH;
  const int bytes = 2 * min(max(d - 8 * c, 0), 8); /* valid bytes of this chunk column */
  const uint16_t *from = src + (int64_t)r0 * stride + 8 * c;
  const uint32_t to = fc_smem_u32(tile + fc_tile_off<DS>(r0, c));
#pragma unroll
  for (int k = 0; k * R < ROWS; k++) {
    const int r = r0 + k * R;
    if (ROWS % R != 0 && r >= ROWS) break;
    const bool in = r < rows_left && bytes > 0;
    fc_cp_async16(to + (uint32_t)(k * R * DS * 2), in ? from : safe, in ? bytes : 0);
    from += R * stride;
    asm("" : "+l"(from));
  }
}

/* A tile: cp.async through the walking loader where its row pattern fits, else
 * mma/tile.cuh's loader. */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void fc_fwd_load_tile(uint16_t *tile, const uint16_t *src, int64_t stride,
                                                        int rows_left, int d, int tid, const uint16_t *safe) {
  if constexpr (fc_walk_threads<D, NT>() > 0)
    fc_fwd_load_tile_walk<ROWS, D, NT>(tile, src, stride, rows_left, d, tid, safe);
  else
    fc_load_tile<ROWS, D, NT>(tile, src, stride, rows_left, d, tid, safe);
}

/* cp.async of 16 bytes that are all present (no zero-fill operand). */
static __device__ __forceinline__ void fc_cp_async16_whole(uint32_t dst, const void *src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

/* A whole tile (ROWS rows present, every chunk full: head_dim = D) into the swizzled tile at shared address
 * `tile`, in fc_fwd_load_tile_walk's pattern (thread: chunk column tid % CH, rows tid / CH + k·R) without its
 * predicates (cuda-mma's forward and the decode kernel's dense blocks). */
template <int ROWS, int D, int NT>
static __device__ __forceinline__ void fc_lean_load_whole(uint32_t tile, const uint16_t *src, int64_t stride, int tid) {
  constexpr int DS = fc_tile_stride(D), CH = D / 8, NTL = fc_walk_threads<D, NT>(), R = NTL / CH;
  static_assert(NTL > 0 && R % 8 == 0, "a thread's rows must share their swizzle");
  if (NTL < NT && tid >= NTL) return;
  const int c = tid % CH, r0 = tid / CH;
  const uint16_t *from = src + (int64_t)r0 * stride + 8 * c;
  const uint32_t to = tile + 2u * (uint32_t)fc_tile_off<DS>(r0, c);
#pragma unroll
  for (int k = 0; k * R < ROWS; k++) {
    if (ROWS % R != 0 && r0 + k * R >= ROWS) break;
    fc_cp_async16_whole(to + (uint32_t)(k * R * DS * 2), from);
    from += R * stride;
    asm("" : "+l"(from)); /* one 64-bit add a row, not a register pair per row (see fc_fwd_load_tile_walk) */
  }
}

#endif /* FLASHC_CUDA_MMA_FWD_STEPS_CUH */
