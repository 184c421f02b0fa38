/*
 * kernels.c — the portable inner loops of the `cpu` backend (plain C that compilers vectorise for whatever
 * they target) and the run-time choice between them and the AVX2+FMA ones. The contracts are in kernels.h.
 */
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* C = (accumulate ? C : 0) + A·B, one row of C at a time: the inner loop runs along a row of B and of C,
 * contiguous, so it vectorises on any target. */
static void gemm_portable(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs, const float *B,
                          int64_t ldb, float *C, int64_t ldc, int accumulate) {
  for (int64_t r = 0; r < M; r++) {
    float *restrict c_r = C + r * ldc;
    if (!accumulate) memset(c_r, 0, (size_t)N * sizeof *c_r);
    for (int64_t k = 0; k < K; k++) {
      const float a = A[r * a_rs + k * a_cs];
      const float *restrict b_k = B + k * ldb;
      for (int64_t n = 0; n < N; n++) c_r[n] += a * b_k[n];
    }
  }
}

static float row_max_portable(const float *x, int64_t n) {
  float m = x[0];
  for (int64_t j = 1; j < n; j++) m = x[j] > m ? x[j] : m;
  return m;
}

static float exp2_row_portable(float *x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; j++) sum += x[j] = exp2f(x[j] - shift);
  return sum;
}

const fc_cpu_kernels fc_cpu_kernels_portable = {
    .name = "portable",
    .gemm = gemm_portable,
    .row_max = row_max_portable,
    .exp2_row = exp2_row_portable,
};

const fc_cpu_kernels *fc_cpu_kernels_pick(void) {
  const char *force = getenv("FLASHC_CPU_KERNELS");
  if (force && strcmp(force, "portable") == 0) return &fc_cpu_kernels_portable;
  const fc_cpu_kernels *avx2 = fc_cpu_kernels_avx2();
  return avx2 ? avx2 : &fc_cpu_kernels_portable;
}
