/*
 * kernels_avx2.c — the inner loops of the `cpu` backend for x86 CPUs with AVX2 and FMA (contracts in
 * kernels.h). The library is built for a baseline x86-64, so these functions carry their own target
 * attribute and are only called after the CPU said it has both extensions (fc_cpu_kernels_avx2).
 */
#include "kernels.h"

#include <math.h>
#include <stddef.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define FC_AVX2        __attribute__((target("avx2,fma")))
#define FC_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) static inline

/* ---- C (+)= A·B ------------------------------------------------------------------------------------ */
/* The micro-tile is MR rows × NV vectors of 8 columns, held in registers while k runs over K:
 *   C[r][n..n+8) += A[r][k] · B[k][n..n+8)       (one broadcast of A[r][k], one FMA per vector)
 * MR = 6, NV = 2 gives 12 accumulators: an FMA has a latency of 4–5 cycles on two ports, so about 10
 * independent sums are needed to keep both busy; 12 + 2 vectors of B + 1 broadcast fit in the 16 ymm
 * registers. */
enum { MR = 6 };

FC_AVX2_INLINE void micro_tile(const int NV, int64_t rows, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                               const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  const float *a[MR];
  for (int r = 0; r < MR; r++) /* rows past the edge of C repeat the last one: computed, never stored */
    a[r] = A + (r < rows ? r : rows - 1) * a_rs;
  __m256 c[MR][2];
  for (int r = 0; r < MR; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k++) {
    __m256 b[2];
    for (int v = 0; v < NV; v++) b[v] = _mm256_loadu_ps(B + k * ldb + 8 * v);
    for (int r = 0; r < MR; r++) {
      const __m256 a_rk = _mm256_broadcast_ss(a[r] + k * a_cs);
      for (int v = 0; v < NV; v++) c[r][v] = _mm256_fmadd_ps(a_rk, b[v], c[r][v]);
    }
  }
  for (int r = 0; r < rows && r < MR; r++)
    for (int v = 0; v < NV; v++) {
      float *dst = C + r * ldc + 8 * v;
      _mm256_storeu_ps(dst, accumulate ? _mm256_add_ps(c[r][v], _mm256_loadu_ps(dst)) : c[r][v]);
    }
}

FC_AVX2 static void gemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                              const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  for (int64_t r0 = 0; r0 < M; r0 += MR) {
    const int64_t rows = M - r0, n16 = N / 16 * 16;
    const float *A_r = A + r0 * a_rs;
    float *C_r = C + r0 * ldc;
    for (int64_t n = 0; n < n16; n += 16) micro_tile(2, rows, K, A_r, a_rs, a_cs, B + n, ldb, C_r + n, ldc, accumulate);
    if (n16 < N) /* N is a multiple of 8: at most one vector left */
      micro_tile(1, rows, K, A_r, a_rs, a_cs, B + n16, ldb, C_r + n16, ldc, accumulate);
  }
}

/* ---- softmax rows ---------------------------------------------------------------------------------- */
FC_AVX2_INLINE float horizontal_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

FC_AVX2_INLINE float horizontal_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* 2^x = 2^n · 2^f with n = round(x) and f = x − n in [−½, ½]; 2^f = e^(f·ln 2) by its Taylor series to
 * degree 7, whose remainder (½ ln 2)^8 / 8! · √2 < 1e-8 is below fp32's rounding; 2^n is built in the
 * exponent field. Below −126 (2^x a subnormal, or x = −inf) the result is 0: these are softmax weights next
 * to a maximum of 1, far below what fp32 sums can resolve. */
FC_AVX2_INLINE __m256 exp2_ps(__m256 x) {
  const __m256 normal = _mm256_cmp_ps(x, _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(127.0f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(1.5252733804059838e-05f); /* (ln 2)^k / k!, k = 7 down to 0 */
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.5403530393381606e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428441e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284770e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821576e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910070e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994530e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(two_n)), normal);
}

FC_AVX2 static float row_max_avx2(const float *x, int64_t n) {
  __m256 m8 = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + j));
  float m = horizontal_max(m8);
  for (; j < n; j++) m = x[j] > m ? x[j] : m;
  return m;
}

FC_AVX2 static float exp2_row_avx2(float *x, int64_t n, float shift) {
  const __m256 shift8 = _mm256_set1_ps(shift);
  __m256 sum8 = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), shift8));
    _mm256_storeu_ps(x + j, e);
    sum8 = _mm256_add_ps(sum8, e);
  }
  if (j < n) { /* the last n % 8 values, padded with −inf (which gives 0), so they round like the rest */
    float tail[8];
    for (int t = 0; t < 8; t++) tail[t] = j + t < n ? x[j + t] : -INFINITY;
    const __m256 e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(tail), shift8));
    _mm256_storeu_ps(tail, e);
    for (int t = 0; j + t < n; t++) x[j + t] = tail[t];
    sum8 = _mm256_add_ps(sum8, e);
  }
  return horizontal_sum(sum8);
}

static const fc_cpu_kernels kernels_avx2 = {
    .name = "avx2",
    .gemm = gemm_avx2,
    .row_max = row_max_avx2,
    .exp2_row = exp2_row_avx2,
};

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) {
  /* The CPU model is read by the runtime's constructor at load time (no __builtin_cpu_init needed). */
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &kernels_avx2;
  return NULL;
}

#else /* not x86: the portable kernels serve */

const fc_cpu_kernels *fc_cpu_kernels_avx2(void) { return NULL; }

#endif
