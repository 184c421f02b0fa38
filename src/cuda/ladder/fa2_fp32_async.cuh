/* ladder/fa2_fp32_async.cuh — the few PTX instructions of the CUDA-core FlashAttention-2 rung, each behind a small
 * function: asynchronous global→shared copies (cp.async, sm_80+) and the hardware exp2.
 *
 * cp.async with a source size below the copy size fills the rest with zeros: that is how rows past the end of
 * a sequence, and columns past head_dim, become zeros in shared memory without a branch around the copy. The
 * source address must still be a valid one, so callers pass the tensor's base for such lanes. */
#ifndef FLASHC_CUDA_FA2_FP32_ASYNC_CUH
#define FLASHC_CUDA_FA2_FP32_ASYNC_CUH

#include <stdint.h>

/* 16 bytes, both addresses 16-byte aligned; src_bytes is 16 or 0 (then 16 zero bytes land). Cached in L2 only:
 * each K/V tile is read once per CTA, and L1 is better left to shared memory. */
static __device__ __forceinline__ void fc_cp_async_16(void *smem, const void *gmem, int src_bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}

/* 4 bytes, both addresses 4-byte aligned; src_bytes is 4 or 0. The fallback for strides that break 16-byte
 * alignment. */
static __device__ __forceinline__ void fc_cp_async_4(void *smem, const void *gmem, int src_bytes) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}

/* Closes the group of copies this thread issued since the last commit. */
static __device__ __forceinline__ void fc_cp_async_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed groups are still in flight. Other threads' copies are
 * visible only after a barrier that follows their own waits. */
template <int N> static __device__ __forceinline__ void fc_cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 2^x in one MUFU instruction (relative error about 2^-22; −inf gives +0, subnormal results flush to 0, which
 * changes no sum by more than 2^-126). */
static __device__ __forceinline__ float fc_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

#endif /* FLASHC_CUDA_FA2_FP32_ASYNC_CUH */
