/*
 * avx2_ops.h — 8-lane AVX2+FMA+F16C primitives shared by kernels_avx2.c (one ymm per vector) and
 * kernels_wide.c (two per vector). Included after <immintrin.h> on x86 only; every function carries the
 * target attribute itself, because the library is built for a baseline x86-64 (kernels.c checks CPUID).
 */
#ifndef FLASHC_CPU_AVX2_OPS_H
#define FLASHC_CPU_AVX2_OPS_H

#include <stdint.h>

#define FC_AVX2_OP __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* max(a, b), NaN when either is: maxps returns b when one is NaN, so a NaN a is ORed back in (the compare's
 * all-ones lanes are a NaN). */
FC_AVX2_OP __m256 fc_avx2_max_nan8(__m256 a, __m256 b) {
  return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}
/* The largest lane, NaN when a lane is NaN. */
FC_AVX2_OP float fc_avx2_hmax8(__m256 v) {
  if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) return __builtin_nanf("");
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
FC_AVX2_OP float fc_avx2_hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
/* Lanes [0, n) of 8 set. */
FC_AVX2_OP __m256i fc_avx2_lane_mask8(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* 2^(n−1) for integral n in the normal range (the exponent field built directly). */
FC_AVX2_OP __m256 fc_avx2_pow2_minus1_8(__m256 n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23));
}
FC_AVX2_OP __m256 fc_avx2_round8(__m256 x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* r where x ≥ b, 0 below. "Not less than, unordered" is true for NaN, so NaN keeps r. */
FC_AVX2_OP __m256 fc_avx2_zero_below8(__m256 r, __m256 x, float b) {
  return _mm256_and_ps(r, _mm256_cmp_ps(x, _mm256_set1_ps(b), _CMP_NLT_UQ));
}
FC_AVX2_OP __m256 fc_avx2_load_f16_8(const uint16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
FC_AVX2_OP void fc_avx2_store_f16_8(uint16_t *p, __m256 v) {
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
FC_AVX2_OP __m256 fc_avx2_load_bf16_8(const uint16_t *p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)p)), 16));
}
/* fp32 → bf16, round to nearest even: add 0x7fff plus the lowest kept bit, keep the top half. NaN keeps its
 * top half with the quiet bit set (rounding could carry it into inf). */
FC_AVX2_OP void fc_avx2_store_bf16_8(uint16_t *p, __m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40)), nan);
  /* 8 × 32-bit → 8 × 16-bit: packus works within 128-bit halves, the permute joins them. */
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(packed));
}
/* dst[c·ldd + r] = src[r·lds + c] for r, c < 8: pairs of rows interleaved (unpack), then pairs of pairs
 * (shuffle), then the 128-bit halves exchanged (permute2f128). */
FC_AVX2_OP void fc_avx2_transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
  __m256 r[8], t[8], u[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);     /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 | a6 b6 a7 b7 */
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);     /* a0 b0 c0 d0 | a4 b4 c4 d4 */
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee); /* column 1 | column 5 */
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; i++) {
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

#endif
