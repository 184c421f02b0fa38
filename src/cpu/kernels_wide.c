/*
 * kernels_wide.c — a test vehicle, never picked on its own: kernels_simd.h with the shape of
 * kernels_avx512.c (16 lanes, 8 × 2 micro-tiles, 32-float panels, partial vectors at the panel edge) built
 * from pairs of AVX2 vectors. FLASHC_CPU_KERNELS=wide runs the `cpu` backend on it, so that everything of the
 * AVX-512 kernels except their intrinsics is tested on any AVX2 machine. Slow (the accumulators spill).
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

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
FC_WIDE __m256 lane_mask8(int n) { /* lanes [0, n) of 8 */
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
FC_WIDE wide w_loadn(const float *p, int n) {
  const __m256 lo = _mm256_maskload_ps(p, _mm256_castps_si256(lane_mask8(n)));
  const __m256 hi = n > 8 ? _mm256_maskload_ps(p + 8, _mm256_castps_si256(lane_mask8(n - 8))) : _mm256_setzero_ps();
  return w_make(lo, hi);
}
FC_WIDE void w_storen(float *p, wide v, int n) {
  _mm256_maskstore_ps(p, _mm256_castps_si256(lane_mask8(n)), v.lo);
  if (n > 8) _mm256_maskstore_ps(p + 8, _mm256_castps_si256(lane_mask8(n - 8)), v.hi);
}
FC_WIDE float w_hmax(wide v) {
  __m256 m8 = _mm256_max_ps(v.lo, v.hi);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
FC_WIDE float w_hsum(wide v) {
  __m256 s8 = _mm256_add_ps(v.lo, v.hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
FC_WIDE __m256 pow2_minus1_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23));
}
FC_WIDE __m256 round8(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
FC_WIDE __m256 zero_below8(__m256 r, __m256 x, float b) {
  return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(b), _CMP_NLT_UQ));
}
FC_WIDE __m256 load_f16_8(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
FC_WIDE void store_f16_8(uint16_t *p, __m256 v) {
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
FC_WIDE __m256 load_bf16_8(const uint16_t *p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}
FC_WIDE void store_bf16_8(uint16_t *p, __m256 v) { /* as kernels_avx2.c */
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40)), nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
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
#define V_MAX(a, b)           W2(_mm256_max_ps, a, b)
#define V_FMA(a, b, c)        w_make(_mm256_fmadd_ps((a).lo, (b).lo, (c).lo), _mm256_fmadd_ps((a).hi, (b).hi, (c).hi))
#define V_HMAX(v)             w_hmax(v)
#define V_HSUM(v)             w_hsum(v)
#define V_ROUND(x)            w_make(round8((x).lo), round8((x).hi))
#define V_MIN_NAN(x, b)       W2(_mm256_min_ps, b, x)
#define V_POW2_MINUS1(n)      w_make(pow2_minus1_8((n).lo), pow2_minus1_8((n).hi))
#define V_ZERO_BELOW(r, x, b) w_make(zero_below8((r).lo, (x).lo, b), zero_below8((r).hi, (x).hi, b))
#define V_LOAD_F16(p)         w_make(load_f16_8(p), load_f16_8((p) + 8))
#define V_STORE_F16(p, v)     (store_f16_8(p, (v).lo), store_f16_8((p) + 8, (v).hi))
#define V_LOAD_BF16(p)        w_make(load_bf16_8(p), load_bf16_8((p) + 8))
#define V_STORE_BF16(p, v)    (store_bf16_8(p, (v).lo), store_bf16_8((p) + 8, (v).hi))

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_wide(void) { return fc_cpu_features_get().avx2_fma_f16c ? &kernels : NULL; }

#else /* not x86 */

const fc_cpu_kernels *fc_cpu_kernels_wide(void) { return NULL; }

#endif
