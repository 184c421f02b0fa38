/*
 * kernels_avx2.c — the `cpu` kernels for x86 CPUs with AVX2, FMA and F16C (Haswell, Zen and later): the
 * primitives of kernels_simd.h on 8-lane ymm vectors. The library is built for a baseline x86-64, so the
 * functions carry their own target attribute and run only after CPUID said yes (kernels.c).
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define FC_TARGET       __attribute__((target("avx2,fma,f16c")))
#define FC_KERNELS_NAME "avx2"
#define FC_V            __m256
#define FC_VL           8
/* 6 rows × 2 vectors: 12 accumulators + 2 vectors of the panel + 1 broadcast = 15 of the 16 ymm registers,
 * and 12 independent FMAs per k cover the 4-cycle latency of the two FMA pipes. */
#define FC_MR 6
#define FC_NV 2

#define V_ZERO()       _mm256_setzero_ps()
#define V_SET1(x)      _mm256_set1_ps(x)
#define V_LOAD(p)      _mm256_loadu_ps(p)
#define V_STORE(p, v)  _mm256_storeu_ps(p, v)
#define V_BCAST(p)     _mm256_broadcast_ss(p)
#define V_ADD(a, b)    _mm256_add_ps(a, b)
#define V_SUB(a, b)    _mm256_sub_ps(a, b)
#define V_MUL(a, b)    _mm256_mul_ps(a, b)
#define V_MAX(a, b)    _mm256_max_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ROUND(x)     _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
/* minps returns its second operand when one is NaN: with x second, NaN passes through. */
#define V_MIN_NAN(x, b) _mm256_min_ps(b, x)
#define V_POW2_MINUS1(n)                                                                                               \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23))
/* "not less than, unordered": true for NaN, so NaN keeps r. */
#define V_ZERO_BELOW(r, x, b) _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(b), _CMP_NLT_UQ))
#define V_LOAD_F16(p)         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define V_STORE_F16(p, v)     _mm_storeu_si128((__m128i *)(void *)(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT))
#define V_LOAD_BF16(p)                                                                                                 \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define V_STORE_BF16(p, v) store_bf16_v(p, v)
#define V_LOADN(p, n)      load_n(p, n)
#define V_STOREN(p, v, n)  store_n(p, v, n)

FC_TARGET __attribute__((always_inline)) static inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
#define V_HMAX(v) hmax(v)

FC_TARGET __attribute__((always_inline)) static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#define V_HSUM(v) hsum(v)

/* The first n lanes (n < 8). Unused with 8 lanes, where every row of a panel is whole vectors. */
FC_TARGET __attribute__((always_inline)) static inline __m256i lane_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
FC_TARGET __attribute__((always_inline)) static inline __m256 load_n(const float *p, int n) {
  return _mm256_maskload_ps(p, lane_mask(n));
}
FC_TARGET __attribute__((always_inline)) static inline void store_n(float *p, __m256 v, int n) {
  _mm256_maskstore_ps(p, lane_mask(n), v);
}

/* fp32 → bf16, round to nearest even: add 0x7fff plus the lowest kept bit, keep the top half. NaN keeps its
 * top half with the quiet bit set (rounding could carry it into inf). */
FC_TARGET __attribute__((always_inline)) static inline void store_bf16_v(uint16_t *p, __m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40)), nan);
  /* 8 × 32-bit → 8 × 16-bit: packus works within 128-bit halves, the permute joins them. */
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) { return fc_cpu_features_get().avx2_fma_f16c ? &kernels : NULL; }

#else /* not x86 */

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) { return NULL; }

#endif
