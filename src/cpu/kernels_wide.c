/*
 * kernels_wide.c — a test vehicle, never picked on its own: kernels_simd.h with the shape of
 * kernels_avx512.c (16 lanes, 8 × 2 micro-tiles, 32-float panels, partial vectors at the panel edge) built
 * from pairs of AVX2 vectors. FLASHC_CPU_KERNELS=wide runs the `cpu` backend on it, so that everything of the
 * AVX-512 kernels except their intrinsics is tested on any AVX2 machine. Slow (the accumulators spill).
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "avx2_ops.h"

#define FC_TARGET       __attribute__((target("avx2,fma,f16c")))
#define FC_KERNELS_NAME "wide"
#define FC_VL           16
#define FC_MR           8
#define FC_NV           2

typedef struct {
  __m256 lo, hi; /* lanes 0–7, 8–15 */
} wide;
#define FC_V wide

#define FC_WIDE FC_TARGET __attribute__((always_inline)) static inline

FC_WIDE wide w_make(__m256 lo, __m256 hi) {
  wide w = {lo, hi};
  return w;
}
FC_WIDE wide w_loadn(const float *p, int n) {
  const __m256 lo = _mm256_maskload_ps(p, fc_avx2_lane_mask8(n));
  const __m256 hi = n > 8 ? _mm256_maskload_ps(p + 8, fc_avx2_lane_mask8(n - 8)) : _mm256_setzero_ps();
  return w_make(lo, hi);
}
FC_WIDE void w_storen(float *p, wide v, int n) {
  _mm256_maskstore_ps(p, fc_avx2_lane_mask8(n), v.lo);
  if (n > 8) _mm256_maskstore_ps(p + 8, fc_avx2_lane_mask8(n - 8), v.hi);
}

/* Each primitive is its AVX2 form on both halves. */
#define W2(op, a, b)          w_make(op((a).lo, (b).lo), op((a).hi, (b).hi))
#define V_ZERO()              w_make(_mm256_setzero_ps(), _mm256_setzero_ps())
#define V_SET1(x)             w_make(_mm256_set1_ps(x), _mm256_set1_ps(x))
#define V_LOAD(p)             w_make(_mm256_loadu_ps(p), _mm256_loadu_ps((p) + 8))
#define V_STORE(p, v)         (_mm256_storeu_ps(p, (v).lo), _mm256_storeu_ps((p) + 8, (v).hi))
#define V_BCAST(p)            w_make(_mm256_broadcast_ss(p), _mm256_broadcast_ss(p))
#define V_LOADN(p, n)         w_loadn(p, n)
#define V_STOREN(p, v, n)     w_storen(p, v, n)
#define V_ADD(a, b)           W2(_mm256_add_ps, a, b)
#define V_SUB(a, b)           W2(_mm256_sub_ps, a, b)
#define V_MUL(a, b)           W2(_mm256_mul_ps, a, b)
#define V_MAX(a, b)           W2(fc_avx2_max_nan8, a, b)
#define V_FMA(a, b, c)        w_make(_mm256_fmadd_ps((a).lo, (b).lo, (c).lo), _mm256_fmadd_ps((a).hi, (b).hi, (c).hi))
#define V_HMAX(v)             fc_avx2_hmax8(fc_avx2_max_nan8((v).lo, (v).hi))
#define V_HSUM(v)             fc_avx2_hsum8(_mm256_add_ps((v).lo, (v).hi))
#define V_ROUND(x)            w_make(fc_avx2_round8((x).lo), fc_avx2_round8((x).hi))
#define V_MIN_NAN(x, b)       W2(_mm256_min_ps, b, x)
#define V_POW2_MINUS1(n)      w_make(fc_avx2_pow2_minus1_8((n).lo), fc_avx2_pow2_minus1_8((n).hi))
#define V_ZERO_BELOW(r, x, b) w_make(fc_avx2_zero_below8((r).lo, (x).lo, b), fc_avx2_zero_below8((r).hi, (x).hi, b))
#define V_LOAD_F16(p)         w_make(fc_avx2_load_f16_8(p), fc_avx2_load_f16_8((p) + 8))
#define V_STORE_F16(p, v)     (fc_avx2_store_f16_8(p, (v).lo), fc_avx2_store_f16_8((p) + 8, (v).hi))
#define V_LOAD_BF16(p)        w_make(fc_avx2_load_bf16_8(p), fc_avx2_load_bf16_8((p) + 8))
#define V_STORE_BF16(p, v)    (fc_avx2_store_bf16_8(p, (v).lo), fc_avx2_store_bf16_8((p) + 8, (v).hi))

#define V_TRANSPOSE8(src, lds, dst, ldd) fc_avx2_transpose8(src, lds, dst, ldd)

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_wide(void) { return fc_cpu_features_get().avx2_fma_f16c ? &kernels : NULL; }

#else /* not x86 */

const fc_cpu_kernels *fc_cpu_kernels_wide(void) { return NULL; }

#endif
