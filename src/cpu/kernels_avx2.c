/*
 * kernels_avx2.c — the `cpu` kernels for x86 CPUs with AVX2, FMA and F16C (Haswell, Zen and later): the
 * primitives of kernels_simd.h on 8-lane ymm vectors. The library is built for a baseline x86-64, so the
 * functions carry their own target attribute and run only after CPUID said yes (kernels.c).
 */
#include "kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#include "avx2_ops.h"

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
#define V_MAX(a, b)    fc_avx2_max_nan8(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_ROUND(x)     fc_avx2_round8(x)
/* minps returns its second operand when one is NaN: with x second, NaN passes through. */
#define V_MIN_NAN(x, b)       _mm256_min_ps(b, x)
#define V_POW2_MINUS1(n)      fc_avx2_pow2_minus1_8(n)
#define V_ZERO_BELOW(r, x, b) fc_avx2_zero_below8(r, x, b)
#define V_LOAD_F16(p)         fc_avx2_load_f16_8(p)
#define V_STORE_F16(p, v)     fc_avx2_store_f16_8(p, v)
#define V_LOAD_BF16(p)        fc_avx2_load_bf16_8(p)
#define V_STORE_BF16(p, v)    fc_avx2_store_bf16_8(p, v)
#define V_LOADN(p, n)         _mm256_maskload_ps(p, fc_avx2_lane_mask8(n))
#define V_STOREN(p, v, n)     _mm256_maskstore_ps(p, fc_avx2_lane_mask8(n), v)
#define V_HMAX(v)             fc_avx2_hmax8(v)
#define V_HSUM(v)             fc_avx2_hsum8(v)

#define V_TRANSPOSE8(src, lds, dst, ldd) fc_avx2_transpose8(src, lds, dst, ldd)

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) { return fc_cpu_features_get().avx2_fma_f16c ? &kernels : NULL; }

#else /* not x86 */

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) { return NULL; }

#endif
