/*
 * kernels_simd.h — the kernels of kernels.h, written once over a vector of FC_VL floats. Each
 * kernels_<isa>.c defines the primitives below, then includes this file, which defines the static functions
 * and one table, `static const fc_cpu_kernels kernels`. Contracts: kernels.h.
 *
 * What the includer defines:
 *   FC_V, FC_VL      the vector type and its lanes
 *   FC_MR, FC_NV     the micro-tile: FC_MR rows × FC_NV vectors of C held in registers (panels of
 *                    FC_NV·FC_VL columns)
 *   FC_TARGET        the functions' attribute (the ISA's target("...")), or nothing
 *   FC_KERNELS_NAME  the table's name
 *   V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p, v) V_BCAST(p)   (p: float pointers, unaligned)
 *   V_LOADN(p, n) V_STOREN(p, v, n)  the first n lanes only (0 < n < FC_VL; the other lanes read as 0)
 *   V_ADD V_SUB V_MUL V_FMA(a, b, c) = a·b + c, V_HSUM(v)
 *   V_MAX(a, b) V_HMAX(v)  the maximum, NaN when an operand (a lane) is NaN: softmax's running maximum must
 *                          carry a NaN score, not drop it as the ISAs' max instructions do
 *   V_MIN_NAN(x, b)        min(x, b), NaN passing through
 *   V_ROUND(x)             to the nearest whole number (ties to even)
 *   V_POW2_MINUS1(n)       2^(n−1) for whole n in [−125, 128], built in the exponent field: (n + 126) << 23
 *                          (any value for other n, NaN included: those lanes are discarded)
 *   V_ZERO_BELOW(r, x, b)  0 in the lanes where x < b (NaN is not below anything), r elsewhere
 *   V_LOAD_F16(p) V_STORE_F16(p, v) V_LOAD_BF16(p) V_STORE_BF16(p, v)   FC_VL uint16_t values at p;
 *                          stores round to nearest even
 * and optionally
 *   V_TRANSPOSE8(src, lds, dst, ldd)   dst[c·ldd + r] = src[r·lds + c] for r, c < 8 (else element by element)
 *   V_SCALE_ZERO_BELOW(r, n, x, b)     V_ZERO_BELOW(V_MUL(r, V_POW2_MINUS1(n)), x, b) in fewer instructions,
 *                          the same bits (used by 2^x, where r·2^(n−1) is a normal number or overflows)
 */
#include "kernels.h"

#include <math.h>
#include <string.h>

#define FC_NR     (FC_NV * FC_VL)
#define FC_INLINE FC_TARGET __attribute__((always_inline)) static inline

/* ---- C (+)= A·B over panels ------------------------------------------------------------------------- */
/* One micro-tile: FC_MR rows of C against one panel, nv vectors wide (the last one `last` lanes), in
 * registers while k runs over K:
 *   C[r][v] += A[r][k] · B[k][v]      (one broadcast of A[r][k], one FMA per vector)
 * FC_MR·FC_NV accumulators, the panel's FC_NV vectors of row k and one broadcast must fit the register file
 * (AVX2 6×2 + 3 = 15 of 16; AVX-512 8×2 + 3 of 32; NEON 6×4 + 5 of 32), and MR·NV independent sums cover
 * the FMA latency (4 cycles on two pipes: ≥ 8 needed). Rows past the edge of C repeat the last row: computed,
 * never stored. */
FC_INLINE void micro_tile(const int nv, int last, int64_t rows, int64_t K, const float *A, int64_t a_rs, int64_t a_cs,
                          const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  const float *a[FC_MR];
  for (int r = 0; r < FC_MR; r++) a[r] = A + (r < rows ? r : rows - 1) * a_rs;
  FC_V c[FC_MR][FC_NV];
  for (int r = 0; r < FC_MR; r++)
    for (int v = 0; v < FC_NV; v++) c[r][v] = V_ZERO();
      /* The same loop three times, for how A lies, so that the compiler keeps one moving pointer for A instead
       * of one per row: rows contiguous along k (S, dP, P V, dS K), columns contiguous along the rows (Pᵀ,
       * dSᵀ), anything else. Unrolled four times: the pointer increments, the compare and the branch then
       * come once per 4·MR·NV FMAs, and the rows of A are read at fixed offsets from their pointers (one trip
       * per k spends a third of the loop's instructions on them, on AVX-512, which a core that issues 4 to 6
       * instructions a cycle pays for in FMA slots). Each accumulator still sums k in order: the same bits.
       * A packed B (ldb = FC_NR: K_jᵀ, V_j, V_jᵀ) gets a loop of its own, where the rows of B too are read at
       * fixed offsets, one pointer increment per four rows. */
#define FC_MICRO_LOOP(a_rk_address, b_ld)                                                                              \
  _Pragma("GCC unroll 4") for (int64_t k = 0; k < K; k++) {                                                            \
    FC_V b[FC_NV];                                                                                                     \
    for (int v = 0; v < nv; v++) /* N is a multiple of 8: only vectors wider than 8 can end part-way */                \
      b[v] = FC_VL > 8 && v == nv - 1 && last < FC_VL ? V_LOADN(B + k * (b_ld) + v * FC_VL, last)                      \
                                                      : V_LOAD(B + k * (b_ld) + v * FC_VL);                            \
    for (int r = 0; r < FC_MR; r++) {                                                                                  \
      const FC_V a_rk = V_BCAST(a_rk_address);                                                                         \
      for (int v = 0; v < nv; v++) c[r][v] = V_FMA(a_rk, b[v], c[r][v]);                                               \
    }                                                                                                                  \
  }
  if (a_cs == 1 && ldb == FC_NR) {
    FC_MICRO_LOOP(a[r] + k, FC_NR)
  } else if (a_cs == 1) {
    FC_MICRO_LOOP(a[r] + k, ldb)
  } else if (a_rs == 1 && rows >= FC_MR) {
    FC_MICRO_LOOP(A + k * a_cs + r, ldb)
  } else {
    FC_MICRO_LOOP(a[r] + k * a_cs, ldb)
  }
#undef FC_MICRO_LOOP
  for (int r = 0; r < FC_MR && r < rows; r++)
    for (int v = 0; v < nv; v++) {
      float *dst = C + r * ldc + v * FC_VL;
      if (v < nv - 1 || last == FC_VL)
        V_STORE(dst, accumulate ? V_ADD(c[r][v], V_LOAD(dst)) : c[r][v]);
      else
        V_STOREN(dst, accumulate ? V_ADD(c[r][v], V_LOADN(dst, last)) : c[r][v], last);
    }
}

FC_TARGET static void gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_cs, const float *B,
                           int64_t ps, int64_t ldb, float *C, int64_t ldc, int accumulate) {
  /* Whole panels, then at most one narrower one: N is a multiple of 8, so `rest` is too. */
  const int64_t panels = (N + FC_NR - 1) / FC_NR, rest = N % FC_NR;
  const int nv_rest = (int)((rest + FC_VL - 1) / FC_VL), last = (int)(rest - (nv_rest - 1) * FC_VL);
  /* Panels in groups of about 16 KB, each group swept by all rows of A before the next: the group stays in
   * L1 while the MR rows of A in flight come from L1 or L2. */
  int64_t group = (16 * 1024 / (int64_t)sizeof(float)) / ((K > 0 ? K : 1) * FC_NR);
  if (group < 1) group = 1;
  for (int64_t p0 = 0; p0 < panels; p0 += group) {
    const int64_t p1 = p0 + group < panels ? p0 + group : panels;
    for (int64_t r0 = 0; r0 < M; r0 += FC_MR) {
      const float *A_r = A + r0 * a_rs;
      for (int64_t p = p0; p < p1; p++) {
        const float *B_p = B + p * ps;
        float *C_p = C + r0 * ldc + p * FC_NR;
        if (p < panels - 1 || rest == 0) {
          micro_tile(FC_NV, FC_VL, M - r0, K, A_r, a_rs, a_cs, B_p, ldb, C_p, ldc, accumulate);
          continue;
        }
        switch (nv_rest) { /* a constant vector count per call, so each micro_tile unrolls */
        case 1: micro_tile(1, last, M - r0, K, A_r, a_rs, a_cs, B_p, ldb, C_p, ldc, accumulate); break;
#if FC_NV >= 2
        case 2: micro_tile(2, last, M - r0, K, A_r, a_rs, a_cs, B_p, ldb, C_p, ldc, accumulate); break;
#endif
#if FC_NV >= 3
        case 3: micro_tile(3, last, M - r0, K, A_r, a_rs, a_cs, B_p, ldb, C_p, ldc, accumulate); break;
#endif
#if FC_NV >= 4
        case 4: micro_tile(4, last, M - r0, K, A_r, a_rs, a_cs, B_p, ldb, C_p, ldc, accumulate); break;
#endif
        default: break; /* nv_rest < FC_NV: unreachable */
        }
      }
    }
  }
}

/* ---- 2^x ---------------------------------------------------------------------------------------------- */
/* 2^x = 2^n · 2^f with n = round(x) and f = x − n in [−½, ½] (exact: no bit of x is lost). 2^f is a degree-6
 * polynomial 1 + f·q(f), fitted for least maximum relative error on [−½, ½] (3.3e-11 in exact arithmetic,
 * 1.6e-8 = 0.27·2^-24 with its fp32 coefficients); evaluated by Horner with FMAs and scaled exactly, the
 * result is within one ulp (tests/test_cpu_kernels.c checks every float of the range). The scaling is
 * 2 · 2^(n−1), the 2 folded into the coefficients, so that 2^(n−1) is a normal number for every n in
 * [−125, 128] (2^-126 … 2^127): then 2^x is right up to the largest float (x just under 128) and, with x
 * capped at 128, overflows to +inf from 128 on. Below −125 the lanes are set to 0 (2^x < 2.4e-38: softmax
 * weights that no fp32 sum can see; no subnormals), whatever the scaling made of them (−inf included). NaN
 * passes through. The constant term is exactly 1, so 2^0 = 1: the maximum of a softmax row gets weight 1. */
FC_INLINE FC_V exp2_v(FC_V x) {
  const FC_V xc = V_MIN_NAN(x, V_SET1(128.0f));
  const FC_V n = V_ROUND(xc), f = V_SUB(xc, n);
  FC_V p = V_SET1(2.0f * 1.535336196e-04f);
  p = V_FMA(p, f, V_SET1(2.0f * 1.339887502e-03f));
  p = V_FMA(p, f, V_SET1(2.0f * 9.618436918e-03f));
  p = V_FMA(p, f, V_SET1(2.0f * 5.550332367e-02f));
  p = V_FMA(p, f, V_SET1(2.0f * 2.402264774e-01f));
  p = V_FMA(p, f, V_SET1(2.0f * 6.931471825e-01f));
  p = V_FMA(p, f, V_SET1(2.0f));
#ifdef V_SCALE_ZERO_BELOW
  return V_SCALE_ZERO_BELOW(p, n, x, -125.0f);
#else
  return V_ZERO_BELOW(V_MUL(p, V_POW2_MINUS1(n)), x, -125.0f);
#endif
}

/* ---- softmax rows ------------------------------------------------------------------------------------- */
/* Four running maxima: one would chain every vector of the row through the max's latency (4 cycles on Intel
 * cores, against a throughput of two a cycle). The maximum is exact and NaN wins wherever it is, so the result
 * does not depend on how the values are grouped. */
FC_TARGET static float row_max(const float *x, int64_t n) {
  FC_V m = V_SET1(-INFINITY), m1 = m, m2 = m, m3 = m;
  int64_t j = 0;
  for (; j + 4 * FC_VL <= n; j += 4 * FC_VL) {
    m = V_MAX(m, V_LOAD(x + j));
    m1 = V_MAX(m1, V_LOAD(x + j + FC_VL));
    m2 = V_MAX(m2, V_LOAD(x + j + 2 * FC_VL));
    m3 = V_MAX(m3, V_LOAD(x + j + 3 * FC_VL));
  }
  for (; j + FC_VL <= n; j += FC_VL) m = V_MAX(m, V_LOAD(x + j));
  m = V_MAX(V_MAX(m, m1), V_MAX(m2, m3));
  float r = V_HMAX(m);
  for (; j < n; j++) r = x[j] > r || x[j] != x[j] ? x[j] : r; /* a NaN r stays: x > NaN is false */
  return r;
}

/* The last n % FC_VL values go through a full vector padded with −inf (which gives 0), so they round like
 * the others. */
FC_TARGET static float exp2_row(float *x, int64_t n, float shift) {
  const FC_V s = V_SET1(shift);
  FC_V sum = V_ZERO();
  int64_t j = 0;
  for (; j + FC_VL <= n; j += FC_VL) {
    const FC_V e = exp2_v(V_SUB(V_LOAD(x + j), s));
    V_STORE(x + j, e);
    sum = V_ADD(sum, e);
  }
  if (j < n) {
    float tail[FC_VL];
    for (int t = 0; t < FC_VL; t++) tail[t] = j + t < n ? x[j + t] : -INFINITY;
    const FC_V e = exp2_v(V_SUB(V_LOAD(tail), s));
    V_STORE(tail, e);
    for (int t = 0; j + t < n; t++) x[j + t] = tail[t];
    sum = V_ADD(sum, e);
  }
  return V_HSUM(sum);
}

FC_TARGET static void scale_row(float *x, int64_t n, float a) {
  const FC_V a_v = V_SET1(a);
  int64_t j = 0;
  for (; j + FC_VL <= n; j += FC_VL) V_STORE(x + j, V_MUL(a_v, V_LOAD(x + j)));
  for (; j < n; j++) x[j] *= a;
}

/* P = 2^(S − shift), dS = P ∘ (dP − D). */
FC_INLINE void softmax_grad_v(float *S, float *dP, FC_V shift, FC_V D) {
  const FC_V P = exp2_v(V_SUB(V_LOAD(S), shift));
  V_STORE(S, P);
  V_STORE(dP, V_MUL(P, V_SUB(V_LOAD(dP), D)));
}

FC_TARGET static void softmax_grad_row(float *S, float *dP, int64_t n, float shift, float D) {
  const FC_V s = V_SET1(shift), D_v = V_SET1(D);
  int64_t j = 0;
  for (; j + FC_VL <= n; j += FC_VL) softmax_grad_v(S + j, dP + j, s, D_v);
  if (j < n) {
    float S_t[FC_VL], dP_t[FC_VL];
    for (int t = 0; t < FC_VL; t++) S_t[t] = j + t < n ? S[j + t] : -INFINITY, dP_t[t] = j + t < n ? dP[j + t] : 0.0f;
    softmax_grad_v(S_t, dP_t, s, D_v);
    for (int t = 0; j + t < n; t++) S[j + t] = S_t[t], dP[j + t] = dP_t[t];
  }
}

FC_TARGET static float dot(const float *x, const float *y, int64_t n) {
  FC_V acc = V_ZERO();
  int64_t j = 0;
  for (; j + FC_VL <= n; j += FC_VL) acc = V_FMA(V_LOAD(x + j), V_LOAD(y + j), acc);
  float r = V_HSUM(acc);
  for (; j < n; j++) r += x[j] * y[j];
  return r;
}

/* ---- transposition ------------------------------------------------------------------------------------ */
/* Whole 8 × 8 blocks through the ISA's shuffles (8 loads, 24 shuffles, 8 stores for 64 values, against 64
 * scalar loads and stores with a stride), the edges element by element. */
FC_TARGET static void transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
  int64_t r0 = 0;
#ifdef V_TRANSPOSE8
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) V_TRANSPOSE8(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
    for (int64_t r = r0; r < r0 + 8; r++)
      for (int64_t c = c0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
  }
#endif
  for (int64_t r = r0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

/* ---- dtype conversion of rows ------------------------------------------------------------------------- */
/* The last n % FC_VL values go through a full vector in a small buffer, so every element is converted by
 * the same instructions. */
#define FC_CONVERT_ROW(name, in_t, out_t, LOAD, STORE)                                                                 \
  FC_TARGET static void name(const in_t *x, out_t *y, int64_t n, float mul) {                                          \
    const FC_V m = V_SET1(mul);                                                                                        \
    int64_t j = 0;                                                                                                     \
    for (; j + FC_VL <= n; j += FC_VL) STORE(y + j, V_MUL(m, LOAD(x + j)));                                            \
    if (j < n) {                                                                                                       \
      in_t in[FC_VL];                                                                                                  \
      out_t out[FC_VL];                                                                                                \
      memset(in, 0, sizeof in);                                                                                        \
      memcpy(in, x + j, (size_t)(n - j) * sizeof *in);                                                                 \
      STORE(out, V_MUL(m, LOAD(in)));                                                                                  \
      memcpy(y + j, out, (size_t)(n - j) * sizeof *out);                                                               \
    }                                                                                                                  \
  }

FC_CONVERT_ROW(copy_f32, float, float, V_LOAD, V_STORE)
FC_CONVERT_ROW(load_f16, uint16_t, float, V_LOAD_F16, V_STORE)
FC_CONVERT_ROW(load_bf16, uint16_t, float, V_LOAD_BF16, V_STORE)
FC_CONVERT_ROW(store_f16, float, uint16_t, V_LOAD, V_STORE_F16)
FC_CONVERT_ROW(store_bf16, float, uint16_t, V_LOAD, V_STORE_BF16)

static const fc_cpu_kernels kernels = {
    .name = FC_KERNELS_NAME,
    .nr = FC_NR,
    .gemm = gemm,
    .row_max = row_max,
    .exp2_row = exp2_row,
    .scale_row = scale_row,
    .softmax_grad_row = softmax_grad_row,
    .dot = dot,
    .transpose = transpose,
    .load_f32 = copy_f32,
    .load_f16 = load_f16,
    .load_bf16 = load_bf16,
    .store_f32 = copy_f32,
    .store_f16 = store_f16,
    .store_bf16 = store_bf16,
};
