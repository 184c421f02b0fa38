/* hopper_gemm.cuh — the product that cuda-hopper's forward and backward both issue as wgmma from shared memory:
 *   acc (64 × N, fp32) = A·Bᵀ over the head dim (D/16 k-steps of 16 columns),
 * A (64 rows) and B (N rows) both K-major, each stored in 64-column halves of 128-byte rows with the 128-byte
 * swizzle; A's halves are 128·128 bytes apart (A is 64 rows of a 128-row tile), B's N·128 bytes apart.
 *   forward (hopper.cu):      S  = Q_i·K_jᵀ    A = the warpgroup's 64 rows of Q_i,  B = K_j,    N = Bc
 *   backward (hopper_bwd.cu): Sᵀ = K_j·Q_iᵀ    A = the warpgroup's 64 keys of K_j,  B = Q_i,    N = Br
 *                             dPᵀ = V_j·dO_iᵀ  A = the warpgroup's 64 keys of V_j,  B = dO_i,   N = Br
 * Step kk reads columns 16·kk .. 16·kk + 15, which sit 32·(kk % 4) bytes into the rows of half kk / 4 (the
 * hardware applies the swizzle to the address bits, so an offset inside the 128-byte row composes with it). The
 * first step writes acc without reading it: a fresh value per block, so that the softmax's writes into the last
 * one never land on registers of a wgmma still in flight (docs/hopper.md, ptxas lesson 6).
 *
 * The forward's pingpongq variant issues the same S = Q_i·K_jᵀ with A from registers (fc_hp_rs_kmajor): each
 * consumer warpgroup loads its 64 rows of Q_i once per tile (fc_hp_load_a_kmajor), instead of the tensor cores
 * reading them from shared memory again for every key block. */
#ifndef FLASHC_CUDA_HOPPER_GEMM_CUH
#define FLASHC_CUDA_HOPPER_GEMM_CUH

#include "hopper_wgmma.cuh"
#include "mma_ptx.cuh" /* fc_ldmatrix_x4 */

#if FC_HOPPER_ARCH
template <typename T, int D, int N, bool ZERO = true>
static __device__ __forceinline__ void fc_hp_ss_kmajor(float (&acc)[N / 2], uint32_t a_rows, uint32_t b_rows) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint32_t a_off = (kk / 4) * (128 * 128) + (kk % 4) * 32, b_off = (kk / 4) * (N * 128) + (kk % 4) * 32;
    const uint64_t da = fc_wgmma_desc_off(a_rows, a_off, 16, 1024), db = fc_wgmma_desc_off(b_rows, b_off, 16, 1024);
    if (ZERO && kk == 0)
      fc_wgmma_ss_zero<T, N>(acc, da, db);
    else
      fc_wgmma_ss<T, N>(acc, da, db);
  }
}

/* The A operand of fc_hp_ss_kmajor (64 rows from a_rows, K-major, 128-byte swizzle, halves 128·128 bytes apart)
 * loaded into registers as the A fragments of its D/16 k-steps: a[kk] is k-step kk's {a0, a1, a2, a3}. Every thread
 * of the warpgroup calls it (warp, lane: its place in the warpgroup); ldmatrix reads through the generic proxy,
 * so a tile that TMA wrote is read after the wait on its mbarrier (which makes the copy's writes visible).
 *
 * Why ldmatrix.x4 gives the wgmma A fragment: wgmma's A from registers is, per warp w, the A fragment of
 * mma.sync m16n8k16 for rows 16w .. 16w + 15 (PTX ISA, wgmma's register fragment of A for m64nNk16; CUTLASS's
 * ALayout_64x16, ((4,8,4),(2,2,2)):((128,1,16),(64,8,512)) over m + 64·k, says the same): a0 = (row g, k 2t..2t+1),
 * a1 = (g + 8, 2t..), a2 = (g, 2t+8..), a3 = (g + 8, 2t+8..) with g = lane / 4, t = lane % 4, the lower k in the
 * low half. ldmatrix.m8n8.x4 (PTX ISA, ldmatrix) takes the row
 * addresses of matrix i from lanes 8i .. 8i + 7 and gives lane l, in its register i, the two 16-bit elements
 * (row l / 4, columns 2·(l % 4), +1) of matrix i. So lane l names row 16w + (l % 16) and 16-byte chunk
 * 2·(kk % 4) + l / 16 of half kk / 4 (the chunk holds k 8·(l / 16) .. +7 of the step): matrix 0 (lanes 0–7) = rows
 * 0–7, k 0–7 → a0; matrix 1 (lanes 8–15) = rows 8–15, k 0–7 → a1; matrix 2 (lanes 16–23) = rows 0–7, k 8–15 → a2;
 * matrix 3 (lanes 24–31) = rows 8–15, k 8–15 → a3: register i of lane l is exactly a_i. The same layout is what
 * fc_hp_pack gives P for O += P·V, which runs on the device: the two sides meet in the A fragment.
 *
 * The swizzle: chunk x of row r sits at byte r·128 + ((x ^ (r % 8)) << 4) of its half, since a_rows is on a
 * 1024-byte boundary (the swizzle acts on address bits 4–6 XOR 7–9). The 8 lanes of one matrix read rows r .. r + 7
 * with 8 different chunk slots: all 32 banks once, no bank conflict. */
template <int D>
static __device__ __forceinline__ void fc_hp_load_a_kmajor(uint32_t (&a)[D / 16][4], uint32_t a_rows, int warp,
                                                           int lane) {
  const int r = 16 * warp + lane % 16;
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const int x = 2 * (kk % 4) + lane / 16;
    fc_ldmatrix_x4(a[kk], a_rows + (kk / 4) * (128 * 128) + r * 128 + ((x ^ (r % 8)) << 4));
  }
}

/* fc_hp_ss_kmajor with A from registers (fc_hp_load_a_kmajor's fragments): B = b_rows, stepped through k as
 * there; the first step writes acc only (scale-d 0), for the same reason. */
template <typename T, int D, int N>
static __device__ __forceinline__ void fc_hp_rs_kmajor(float (&acc)[N / 2], const uint32_t (&a)[D / 16][4],
                                                       uint32_t b_rows) {
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++) {
    const uint64_t db = fc_wgmma_desc_off(b_rows, (kk / 4) * (N * 128) + (kk % 4) * 32, 16, 1024);
    if (kk == 0)
      fc_wgmma_rs_kmajor_zero<T, N>(acc, a[kk], db);
    else
      fc_wgmma_rs_kmajor<T, N>(acc, a[kk], db);
  }
}
#endif /* FC_HOPPER_ARCH */

#endif /* FLASHC_CUDA_HOPPER_GEMM_CUH */
