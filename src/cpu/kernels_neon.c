/*
 * kernels_neon.c — the `cpu` kernels for 64-bit Arm (AdvSIMD, part of every AArch64 CPU): the primitives of
 * kernels_simd.h on 4-lane q registers. Built only where the compiler targets AArch64.
 */
#include "kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#define FC_TARGET
#define FC_KERNELS_NAME "neon"
#define FC_V            float32x4_t
#define FC_VL           4
/* 6 rows × 4 vectors: 24 accumulators + 4 panel vectors + 1 broadcast of the 32 q registers. */
#define FC_MR 6
#define FC_NV 4

#define FC_NEON __attribute__((always_inline)) static inline

/* vcvt saturates, so n out of range (−inf) gives some value, discarded by the caller. */
FC_NEON float32x4_t n_pow2_minus1(float32x4_t n) {
  return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(126)), 23));
}
/* vclt is false for NaN, so NaN keeps r. */
FC_NEON float32x4_t n_zero_below(float32x4_t r, float32x4_t x, float b) {
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(r), vcltq_f32(x, vdupq_n_f32(b))));
}
FC_NEON float32x4_t n_loadn(const float *p, int n) {
  float t[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) t[i] = p[i];
  return vld1q_f32(t);
}
FC_NEON void n_storen(float *p, float32x4_t v, int n) {
  float t[4];
  vst1q_f32(t, v);
  for (int i = 0; i < n; i++) p[i] = t[i];
}
FC_NEON float32x4_t n_load_f16(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
/* vcvt rounds by FPCR, whose default mode is round to nearest even. */
FC_NEON void n_store_f16(uint16_t *p, float32x4_t v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
FC_NEON float32x4_t n_load_bf16(const uint16_t *p) { return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)); }
/* Round to nearest even in integers, NaN quieted (as kernels_avx2.c). */
FC_NEON void n_store_bf16(uint16_t *p, float32x4_t v) {
  const uint32x4_t x = vreinterpretq_u32_f32(v);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(1));
  uint32x4_t r = vshrq_n_u32(vaddq_u32(x, vaddq_u32(lsb, vdupq_n_u32(0x7fff))), 16);
  const uint32x4_t nan = vmvnq_u32(vceqq_f32(v, v));
  r = vbslq_u32(nan, vorrq_u32(vshrq_n_u32(x, 16), vdupq_n_u32(0x40)), r);
  vst1_u16(p, vmovn_u32(r));
}

#define V_ZERO()              vdupq_n_f32(0.0f)
#define V_SET1(x)             vdupq_n_f32(x)
#define V_LOAD(p)             vld1q_f32(p)
#define V_STORE(p, v)         vst1q_f32(p, v)
#define V_BCAST(p)            vld1q_dup_f32(p)
#define V_LOADN(p, n)         n_loadn(p, n)
#define V_STOREN(p, v, n)     n_storen(p, v, n)
#define V_ADD(a, b)           vaddq_f32(a, b)
#define V_SUB(a, b)           vsubq_f32(a, b)
#define V_MUL(a, b)           vmulq_f32(a, b)
#define V_MAX(a, b)           vmaxq_f32(a, b) /* fmax: NaN when an operand is NaN (fmaxnm would drop it) */
#define V_FMA(a, b, c)        vfmaq_f32(c, a, b)
#define V_HMAX(v)             vmaxvq_f32(v) /* fmaxv: NaN when a lane is NaN */
#define V_HSUM(v)             vaddvq_f32(v)
#define V_ROUND(x)            vrndnq_f32(x)
#define V_MIN_NAN(x, b)       vminq_f32(x, b) /* fmin returns NaN when an operand is NaN */
#define V_POW2_MINUS1(n)      n_pow2_minus1(n)
#define V_ZERO_BELOW(r, x, b) n_zero_below(r, x, b)
#define V_LOAD_F16(p)         n_load_f16(p)
#define V_STORE_F16(p, v)     n_store_f16(p, v)
#define V_LOAD_BF16(p)        n_load_bf16(p)
#define V_STORE_BF16(p, v)    n_store_bf16(p, v)

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_neon(void) { return &kernels; }

#else /* not AArch64 */

const fc_cpu_kernels *fc_cpu_kernels_neon(void) { return NULL; }

#endif
