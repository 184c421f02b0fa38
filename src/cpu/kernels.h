/*
 * kernels.h — the inner loops of the `cpu` backend: a register-blocked fp32 matrix product over packed
 * panels, the row operations of the softmax (a vectorised 2^x among them) and the dtype conversion of rows.
 *
 * One table per instruction set, all written once in kernels_simd.h over a vector type and instantiated by
 *   kernels_avx512.c   AVX-512F, 16 lanes
 *   kernels_avx2.c     AVX2 + FMA + F16C, 8 lanes
 *   kernels_neon.c     Arm NEON (AdvSIMD), 4 lanes, built where the compiler targets AArch64
 *   kernels_portable.c the compiler's generic vectors, 4 lanes: any other CPU
 *   kernels_wide.c     a test vehicle: the 16-lane layout of AVX-512 run on AVX2, never picked on its own
 * fc_cpu_kernels_pick chooses one per call from CPUID (kernels.c).
 *
 * Every tile product of FlashAttention-2 is one call of `gemm`:
 *   forward   S = Q_i K_jᵀ,  O_i += P V_j
 *   backward  S = Q_i K_jᵀ,  dP = dO_i V_jᵀ,  dV_j += Pᵀ dO_i,  dK_j += dSᵀ Q_i,  dQ_i += dS K_j
 * A (the left operand) is read through two strides, so Pᵀ and dSᵀ are the tiles themselves with the strides
 * swapped. B (the right operand) is packed: see "panels" below.
 */
#ifndef FLASHC_CPU_KERNELS_H
#define FLASHC_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The right operand B[K×N] of a product is read in panels of nr columns: element (k, c) at
 *   B[(c / nr)·ps + k·ldb + c % nr].
 * Packed (ldb = nr, ps ≥ K·nr, the panel stride), each panel is K rows of nr contiguous floats: the
 * micro-kernel streams one panel from start to end while MR rows of A are broadcast against it, so B is read
 * once per MR rows of C with unit stride (K_jᵀ and V_jᵀ are packed so, their transposition done once per tile).
 * A row-major matrix with rows of ldb floats is the same thing with ps = nr (a tile already in scratch needs
 * no copy). Either way rows [k0, K) of B are B + k0·ldb with the same ps and ldb. Packed panels are zero in
 * the columns past N. */

typedef struct fc_cpu_kernels {
  const char *name; /* "avx512", "avx2", "neon", "portable", "wide" */
  int nr;           /* panel width in floats: 16 or 32, a multiple of 8 */

  /* C[M×N] = (accumulate ? C : 0) + A[M×K]·B[K×N]: A[r][k] at A[r·a_rs + k·a_cs], B as above, C row-major
   * with leading dimension ldc. N must be a multiple of 8; no column of B or C at or past N is touched.
   * K may be 0. */
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs, const float *B, int64_t ps,
               int64_t ldb, float *C, int64_t ldc, int accumulate);

  /* max_j x_j over n ≥ 1 values (−inf when every value is −inf, NaN when one is NaN). */
  float (*row_max)(const float *x, int64_t n);
  /* x_j ← 2^(x_j − shift) in place, returning Σ_j of the new x_j. `shift` is finite, or the sum is NaN (or 0
   * for shift = −inf and every x_j = −inf: a row that sees no key subtracts 0 instead). 2^y is within
   * one ulp for y ≥ −125, 0 below (2^y < 2.4e-38: softmax weights that no fp32 sum can see), +inf from 128
   * on, NaN for NaN; −inf gives 0 and 0 gives 1. */
  float (*exp2_row)(float *x, int64_t n, float shift);
  /* x_j ← a·x_j. */
  void (*scale_row)(float *x, int64_t n, float a);
  /* The backward's softmax for one row: P_j = 2^(S_j − shift) (as exp2_row), then
   * dS_j = P_j·(dP_j − D); S becomes P and dP becomes dS. */
  void (*softmax_grad_row)(float *S, float *dP, int64_t n, float shift, float D);
  /* Σ_j x_j·y_j. */
  float (*dot)(const float *x, const float *y, int64_t n);
  /* dst[c·ldd + r] = src[r·lds + c] for r < rows, c < cols: rows of K_j or V_j, already fp32, into the
   * panels of a right operand (fc_tile_pack_t), 8 × 8 blocks at a time where the ISA has the shuffles. */
  void (*transpose)(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd);

  /* Rows between the caller's dtypes and fp32 scratch: y_j = mul·x_j, rounded to nearest even on the way
   * down (overflow gives inf, NaN stays NaN). */
  void (*load_f32)(const float *x, float *y, int64_t n, float mul);
  void (*load_f16)(const uint16_t *x, float *y, int64_t n, float mul);
  void (*load_bf16)(const uint16_t *x, float *y, int64_t n, float mul);
  void (*store_f32)(const float *x, float *y, int64_t n, float mul);
  void (*store_f16)(const float *x, uint16_t *y, int64_t n, float mul);
  void (*store_bf16)(const float *x, uint16_t *y, int64_t n, float mul);
} fc_cpu_kernels;

/* Each table, or NULL when this build cannot make it (another architecture) or this CPU cannot run it. */
const fc_cpu_kernels *fc_cpu_kernels_avx512(void);
const fc_cpu_kernels *fc_cpu_kernels_avx2(void);
const fc_cpu_kernels *fc_cpu_kernels_neon(void);
const fc_cpu_kernels *fc_cpu_kernels_wide(void);
const fc_cpu_kernels *fc_cpu_kernels_portable(void); /* never NULL */

/* The kernels for this call: FLASHC_CPU_KERNELS=<name> forces one (tests check every table this machine
 * runs; an unknown or unusable name falls back to the automatic choice), else the fastest this CPU runs
 * that has been verified on hardware (see kernels.c on AVX-512). */
const fc_cpu_kernels *fc_cpu_kernels_pick(void);

/* What CPUID and the OS report (x86; all zero elsewhere): read once. */
typedef struct fc_cpu_features {
  int avx2_fma_f16c; /* AVX2, FMA and F16C, with the OS saving ymm state */
  int avx512;        /* AVX-512 F, with the OS saving zmm and mask state */
} fc_cpu_features;
fc_cpu_features fc_cpu_features_get(void);

#endif /* FLASHC_CPU_KERNELS_H */
