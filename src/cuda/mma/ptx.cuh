/* mma/ptx.cuh — the PTX instructions of the mma.sync rungs (sm_80+), one small inline function each.
 *
 * Fragment layouts of mma.sync.aligned.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
 * g = lane / 4 (groupID) and t = lane % 4 (thread in group). Every register holds two 16-bit values, the
 * lower column in the low half:
 *   A (16×16, row-major)  a[0]: (g, 2t..2t+1)    a[1]: (g+8, 2t..2t+1)    a[2]: (g, 2t+8..)    a[3]: (g+8, 2t+8..)
 *   B (16×8, "col")       b[0]: (k = 2t..2t+1, n = g)                     b[1]: (k = 2t+8..2t+9, n = g)
 *   C (16×8, fp32)        c[0], c[1]: (g, 2t..2t+1)                       c[2], c[3]: (g+8, 2t..2t+1)
 * ldmatrix.m8n8 gives thread `lane` the pair (lane / 4, 2·(lane % 4)..+1) of each 8×8 matrix whose eight
 * row addresses came from lanes 8i..8i+7; with .trans it gives (2·(lane % 4)..+1, lane / 4) instead. So one
 * ldmatrix.x4 fills an A fragment, or the B fragments of two n-blocks, straight from shared memory.
 *
 * C's layout is A's layout cut in half: the accumulators of two neighbouring n-blocks, packed to 16 bits,
 * are exactly an A fragment (c[0..1] of block 2k → a[0], c[2..3] → a[1]; block 2k+1 → a[2], a[3]). That is
 * how P = softmax(S) stays in registers and feeds P·V. */
#ifndef FLASHC_CUDA_MMA_PTX_CUH
#define FLASHC_CUDA_MMA_PTX_CUH

#include "common/common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

static __device__ __forceinline__ uint32_t fc_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- cp.async: global → shared without passing through registers --------------------------------------- */
/* Copies 16 bytes; only the first src_bytes (0..16) are read, the rest of the
 * 16 are zero-filled, so a row past the end of a sequence (src_bytes 0) or a
 * partial head-dim chunk lands as zeros. .cg: skip L1, the tile is read once
 * per CTA. */
static __device__ __forceinline__ void fc_cp_async16(uint32_t dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
static __device__ __forceinline__ void fc_cp_async_commit(void) {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Wait until at most N of this thread's committed groups are still in flight.
 */
template <int N> static __device__ __forceinline__ void fc_cp_async_wait(void) {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- ldmatrix ------------------------------------------------------------------------------------------ */
static __device__ __forceinline__ void fc_ldmatrix_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
static __device__ __forceinline__ void fc_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* ---- mma.sync m16n8k16, fp32 accumulate: c += a·b ------------------------------------------------------ */
template <typename T>
static __device__ __forceinline__ void fc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);

template <> __device__ __forceinline__ void fc_mma<__half>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void fc_mma<__nv_bfloat16>(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ---- conversions --------------------------------------------------------------------------------------- */
/* Two floats → one register of two 16-bit values, lo in the low half (round to
 * nearest even). */
template <typename T> static __device__ __forceinline__ uint32_t fc_pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t fc_pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *(uint32_t *)&h;
}
template <> __device__ __forceinline__ uint32_t fc_pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&h;
}
template <typename T> static __device__ __forceinline__ float fc_to_float(uint16_t bits);
template <> __device__ __forceinline__ float fc_to_float<__half>(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
template <> __device__ __forceinline__ float fc_to_float<__nv_bfloat16>(uint16_t bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
template <typename T> static __device__ __forceinline__ uint16_t fc_from_float(float x);
template <> __device__ __forceinline__ uint16_t fc_from_float<__half>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
template <> __device__ __forceinline__ uint16_t fc_from_float<__nv_bfloat16>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* *p += (a, b, c, d), four consecutive floats at a 16-byte aligned address, without returning the old
 * value: one vector reduction on sm_90, four scalar ones before. */
static __device__ __forceinline__ void fc_red_add4(float *p, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
  atomicAdd(p + 2, c);
  atomicAdd(p + 3, d);
#endif
}

/* 2^x on the special-function unit; 2^−inf = +0, which is what a masked score
 * must become. */
static __device__ __forceinline__ float fc_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* 2^x on the FMA pipe, for kernels whose exponentials queue on the special-function unit (16 a clock per SM on
 * sm_90, an eighth of what the FMA pipe does): computing some of them here shortens that queue (FlashAttention-4's
 * trick). Cody–Waite: x = n + f, n = ⌊x⌋ (adding 1.5·2^23 rounding down leaves n in the low mantissa bits of t),
 * 2^f by a degree-3 polynomial with p(0) = 1 exactly (minimax relative error on [0, 1), fitted in fp32 Horner form:
 * 8.6e-5, under fp16's half ulp 2.4e-4 and bf16's 2e-3), times 2^n built in the exponent field as
 * (t << 23) + 0x3F800000 (t's bits are 0x4B400000 + n; a shift by 23 keeps the low 9 bits, which are 0 in
 * 0x4B400000, so it leaves n << 23): one IMAD and one multiply, exact. x is clamped at −127 first: a masked score
 * (−inf) gives n = −127, whose 2^n is built as +0, so the product is +0, as ex2.approx gives; so does x in
 * (−127, −126) (ex2.approx.ftz: 0). The clamp keeps NaN (fc_fmax_nan), and the multiply carries it to the result:
 * adding n to p's exponent bits, one instruction less, turned a NaN into a finite number. For x < 128 (no
 * overflow to inf). */
static __device__ __forceinline__ float fc_exp2_poly(float x) {
  x = fc_fmax_nan(x, -127.0f);
  const float t = __fadd_rd(x, 12582912.0f);
  const float f = x - (t - 12582912.0f);
  const float p = fmaf(fmaf(fmaf(0.07706719636917114f, f, 0.22764481604099274f), f, 0.6951168179512024f), f, 1.0f);
  return p * __int_as_float((__float_as_int(t) << 23) + 0x3F800000);
}

/* A value the same in every lane of a (whole, converged) warp, through redux.sync, whose result the compiler holds in
 * a uniform register: a sequence's numbers loaded from cu_seqlens are not known to be uniform otherwise, and the
 * kernels' loop bookkeeping (block and head counters, row offsets, pointers) then takes vector registers beside the
 * MMAs' accumulators instead of living in the uniform datapath (the backward's LEAN kernels, the forward's lean
 * kernel). */
static __device__ __forceinline__ int fc_warp_same(int v) { return (int)__reduce_or_sync(0xffffffffu, (unsigned)v); }
static __device__ __forceinline__ int64_t fc_warp_same64(int64_t v) {
  const uint64_t u = (uint64_t)v;
  return (int64_t)((uint64_t)(uint32_t)fc_warp_same((int)(uint32_t)u) |
                   (uint64_t)(uint32_t)fc_warp_same((int)(uint32_t)(u >> 32)) << 32);
}

#endif /* FLASHC_CUDA_MMA_PTX_CUH */
