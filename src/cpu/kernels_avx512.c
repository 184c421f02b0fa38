/*
 * kernels_avx512.c — the `cpu` kernels for x86 CPUs with AVX-512F (Skylake-SP and later Xeons, Zen 4): the
 * primitives of kernels_simd.h on 16-lane zmm vectors. Built with a target attribute, run only after CPUID said
 * yes (kernels.c). bf16 stores stay in integers even where AVX-512 BF16 is: its vcvtneps2bf16 flushes
 * subnormals to zero (test_cpu_kernels caught it on a Xeon), and every table must give the same bits.
 *
 * kernels_wide.c runs kernels_simd.h with this file's shape (16 lanes, 8 × 2 micro-tiles, 32-float panels) on
 * AVX2, so the layout logic is tested wherever AVX2 is; what only hardware can test is the primitives below.
 */
#include "kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "avx2_ops.h"

#define FC_TARGET       __attribute__((target("avx512f,avx2,fma,f16c")))
#define FC_KERNELS_NAME "avx512"
#define FC_V            __m512
#define FC_VL           16
/* 8 rows × 2 vectors: 16 accumulators + 2 panel vectors + 1 broadcast of the 32 zmm registers; 16
 * independent FMAs cover the latency of two FMA pipes. */
#define FC_MR 8
#define FC_NV 2

/* V_MAX, V_HMAX: vmaxps returns b when one operand is NaN, so a NaN a is put back; the reduction is NaN when a lane
 * is. */
#define V_ZERO()        _mm512_setzero_ps()
#define V_SET1(x)       _mm512_set1_ps(x)
#define V_LOAD(p)       _mm512_loadu_ps(p)
#define V_STORE(p, v)   _mm512_storeu_ps(p, v)
#define V_BCAST(p)      _mm512_set1_ps(*(p))
#define V_ADD(a, b)     _mm512_add_ps(a, b)
#define V_SUB(a, b)     _mm512_sub_ps(a, b)
#define V_MUL(a, b)     _mm512_mul_ps(a, b)
#define V_MAX(a, b)     _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a)
#define V_FMA(a, b, c)  _mm512_fmadd_ps(a, b, c)
#define V_HMAX(v)       (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) ? __builtin_nanf("") : _mm512_reduce_max_ps(v))
#define V_HSUM(v)       _mm512_reduce_add_ps(v)
#define V_ROUND(x)      _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_MIN_NAN(x, b) _mm512_min_ps(b, x) /* NaN passes through (the second operand) */
#define V_POW2_MINUS1(n)                                                                                               \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(126)), 23))
#define V_ZERO_BELOW(r, x, b) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(b), _CMP_NLT_UQ), r)
/* r·2^(n−1) as one vscalefps under V_ZERO_BELOW's mask, instead of the conversion, integer add, shift,
 * multiply and masked move of the generic form: 2^x takes 12 vector instructions instead of 15, and on Intel
 * cores every one of them competes with the FMAs for ports 0 and 5. The same bits: in 2^x the product is a
 * normal number, or overflows to +inf, and vscalefps rounds it as the multiply does. */
#define V_SCALE_ZERO_BELOW(r, n, x, b)                                                                                 \
  _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(b), _CMP_NLT_UQ), r,                                     \
                         _mm512_sub_ps(n, _mm512_set1_ps(1.0f)))
#define V_LOADN(p, n)     _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1u), p)
#define V_STOREN(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1u), v)
#define V_LOAD_F16(p)     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define V_STORE_F16(p, v)                                                                                              \
  _mm256_storeu_si256((__m256i *)(void *)(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))
#define V_LOAD_BF16(p)                                                                                                 \
  _mm512_castsi512_ps(                                                                                                 \
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define V_STORE_BF16(p, v) store_bf16_v(p, v)
/* 8 × 8 blocks in ymm halves: a 16 × 16 transpose in zmm would need the rows of K_j in sixteens. */
#define V_TRANSPOSE8(src, lds, dst, ldd) fc_avx2_transpose8(src, lds, dst, ldd)

/* fp32 → bf16 in integers, as kernels_avx2.c: round to nearest even, NaN quieted. */
FC_TARGET __attribute__((always_inline)) static inline void store_bf16_v(uint16_t *p, __m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256((__m256i *)(void *)p, _mm512_cvtepi32_epi16(r));
}

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_avx512(void) {
  const fc_cpu_features f = fc_cpu_features_get();
  if (!f.avx512 || !f.avx2_fma_f16c) return NULL;
  return &kernels;
}

#else /* not x86-64 */

const fc_cpu_kernels *fc_cpu_kernels_avx512(void) { return NULL; }

#endif
