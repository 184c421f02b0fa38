/*
 * kernels.h — the inner loops of the `cpu` backend: a small fp32 matrix product and the two row operations
 * of the softmax. Two versions: portable C (any architecture) and AVX2+FMA (kernels_avx2.c), picked once per
 * call by fc_cpu_kernels_pick from what the CPU reports.
 *
 * Every tile product of FlashAttention-2 is one call of `gemm`:
 *   forward   S = Q_i K_jᵀ,  O_i += P V_j
 *   backward  dV_j += Pᵀ dO_i,  dP = dO_i V_jᵀ,  dK_j += dSᵀ Q_i,  dQ_i += dS K_j
 * A is read through two strides, so a transposed operand (Pᵀ, dSᵀ) is the same memory with the strides
 * swapped, and the right operand is row-major (K_jᵀ and V_jᵀ are stored transposed for that).
 */
#ifndef FLASHC_CPU_KERNELS_H
#define FLASHC_CPU_KERNELS_H

#include <stdint.h>

typedef struct fc_cpu_kernels {
  const char *name; /* "avx2" or "portable" */
  /* C[M×N] = (accumulate ? C : 0) + A[M×K]·B[K×N], with A[r][k] at A[r·a_rs + k·a_cs] and B, C row-major
   * (leading dimensions ldb, ldc). N must be a multiple of 8; K may be 0. */
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int64_t ldb,
               float *C, int64_t ldc, int accumulate);
  /* max_j x_j over n ≥ 1 values (−inf when every value is −inf). */
  float (*row_max)(const float *x, int64_t n);
  /* x_j ← 2^(x_j − shift) in place (−inf gives 0); returns Σ_j of the new x_j. `shift` must be finite. */
  float (*exp2_row)(float *x, int64_t n, float shift);
} fc_cpu_kernels;

extern const fc_cpu_kernels fc_cpu_kernels_portable;

/* The AVX2+FMA kernels when this build targets x86 and the CPU has both, else NULL. */
const fc_cpu_kernels *fc_cpu_kernels_avx2(void);

/* The fastest kernels this CPU runs. The environment variable FLASHC_CPU_KERNELS=portable forces the
 * portable ones (so tests can check both on one machine). */
const fc_cpu_kernels *fc_cpu_kernels_pick(void);

#endif /* FLASHC_CPU_KERNELS_H */
