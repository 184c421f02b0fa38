/* hopper/gemm.cuh — the product that cuda-hopper's forward and backward both issue as wgmma from shared memory:
 *   acc (64 × N, fp32) = A·Bᵀ over the head dim (D/16 k-steps of 16 columns),
 * A (64 rows) and B (N rows) both K-major, each stored in 64-column halves of 128-byte rows with the 128-byte
 * swizzle; A's halves are 128·128 bytes apart (A is 64 rows of a 128-row tile), B's N·128 bytes apart.
 *   forward (hopper/fwd.cu):      S  = Q_i·K_jᵀ    A = the warpgroup's 64 rows of Q_i,  B = K_j,    N = Bc
 *   backward (hopper/bwd.cu): Sᵀ = K_j·Q_iᵀ    A = the warpgroup's 64 keys of K_j,  B = Q_i,    N = Br
 *                             dPᵀ = V_j·dO_iᵀ  A = the warpgroup's 64 keys of V_j,  B = dO_i,   N = Br
 * Step kk reads columns 16·kk .. 16·kk + 15, which sit 32·(kk % 4) bytes into the rows of half kk / 4 (the
 * hardware applies the swizzle to the address bits, so an offset inside the 128-byte row composes with it). The
 * first step writes acc without reading it: a fresh value per block, so that the softmax's writes into the last
 * one never land on registers of a wgmma still in flight (docs/hopper.md, ptxas lesson 6). (S with Q_i's rows in
 * registers, an RS wgmma, measured no faster: docs/experiments.md, pingpongq; its code is at d79fa1c.) */
#ifndef FLASHC_CUDA_HOPPER_GEMM_CUH
#define FLASHC_CUDA_HOPPER_GEMM_CUH

#include "hopper/wgmma.cuh"

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

#endif /* FC_HOPPER_ARCH */

#endif /* FLASHC_CUDA_HOPPER_GEMM_CUH */
