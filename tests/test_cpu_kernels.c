/*
 * test_cpu_kernels.c — the inner loops of the `cpu` backend (src/cpu/kernels.h), on every kernel table this
 * machine runs (portable; avx2 and wide on AVX2 CPUs; avx512 on AVX-512 CPUs; neon on AArch64):
 *
 *   exp2_row  against exp2 in fp64 rounded to fp32: every float with 2^-20 ≤ |x| ≤ 256 (all of the range
 *             where 2^x is neither 1 nor out of range) and every 257th bit pattern elsewhere (tiny and huge
 *             values, subnormals, ±inf, NaNs); FLASHC_TEST_QUICK=1 takes every 1031st. Within one ulp for
 *             x ≥ −125, 0 below (flushed, as kernels.h says), +inf from 128 on, NaN for NaN, −inf gives 0,
 *             2^0 = 1 exactly; the returned sum against an fp64 sum, with a shift.
 *   rows      row_max, scale_row, dot, softmax_grad_row against plain loops, every length 1 … 70.
 *   dtypes    load_f16/load_bf16 on all 65536 values and store_f16/store_bf16 on specials, the neighbours of
 *             every rounding boundary and random patterns, bit for bit against the scalar conversions of
 *             internal.h (NaN against NaN), at lengths 1 … 40 and with a multiplier.
 *   gemm      random shapes (M 1…23, N 8…104, K 0…70), A plain or transposed, B packed or row-major,
 *             accumulate or not, against an fp64 product, with canaries around C and past column N.
 *   transpose random shapes (rows 1…20, cols 1…70, padded strides), bit for bit, with canaries between the
 *             columns written and around them.
 */
#include "harness.h"
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distance in ulps between two finite floats of the same sign (or zero). */
static double ulps(float got, float want) {
  if (got == want) return 0.0;
  const double spacing = want == 0.0f ? 0x1p-149 : fabs((double)nextafterf(want, INFINITY) - want);
  return fabs((double)got - want) / spacing;
}

/* ---- exp2_row ------------------------------------------------------------------------------------------ */
/* Every table on the same inputs, so that the fp64 reference is computed once. */
static void test_exp2_range(const fc_cpu_kernels *const *tables, int count) {
  enum { CHUNK = 4096, MAX_TABLES = 8 };
  static float x[CHUNK], y[CHUNK], want[CHUNK];
  const uint64_t sparse = th_quick() ? 1031 : 257, dense = th_quick() ? 1031 : 1;
  double worst[MAX_TABLES] = {0};
  float worst_x[MAX_TABLES] = {0};
  int64_t bad[MAX_TABLES] = {0}, n_checked = 0;
  uint64_t bits = 0;
  while (bits <= 0xffffffffull) {
    int n = 0;
    while (n < CHUNK && bits <= 0xffffffffull) {
      const float v = th_bits_f32((uint32_t)bits), a = fabsf(v);
      x[n] = v;
      want[n] = isnan(v) ? NAN : v < -125.0f ? 0.0f : v >= 128.0f ? INFINITY : (float)exp2((double)v);
      n++;
      bits += a >= 0x1p-20f && a <= 256.0f ? dense : sparse;
    }
    n_checked += n;
    for (int t = 0; t < count; t++) {
      const fc_cpu_kernels *k = tables[t];
      memcpy(y, x, sizeof(float) * (size_t)n);
      k->exp2_row(y, n, 0.0f);
      for (int i = 0; i < n; i++) {
        const float xi = x[i], got = y[i];
        bool ok;
        if (isnan(xi)) {
          ok = isnan(got);
        } else if (xi < -125.0f || xi >= 128.0f) {
          ok = th_f32_bits(got) == th_f32_bits(want[i]); /* 0 and +inf exactly */
        } else {
          const double e = isfinite(got) ? ulps(got, want[i]) : INFINITY;
          if (e > worst[t]) worst[t] = e, worst_x[t] = xi;
          ok = e <= 1.0;
        }
        if (!ok && bad[t]++ < 5)
          th_fail("%s exp2(%a = %.9g) = %.9g, want %.9g", k->name, (double)xi, (double)xi, (double)got,
                  (double)want[i]);
      }
    }
  }
  for (int t = 0; t < count; t++) {
    th_check(bad[t] == 0, "%s exp2: %lld of %lld inputs wrong", tables[t]->name, (long long)bad[t],
             (long long)n_checked);
    printf("%-8s exp2 over %lld inputs: worst %.3f ulp (at x = %.9g)\n", tables[t]->name, (long long)n_checked,
           worst[t], (double)worst_x[t]);
  }
}

static void test_exp2(const fc_cpu_kernels *k) {
  /* Specials and the shift argument: 2^(x − shift), the sum returned. */
  float s[5] = {-INFINITY, 0.0f, -1.0f, 3.5f, -200.0f}; /* 2^3.5 = 11.3137085 */
  const float sum = k->exp2_row(s, 5, 0.0f);
  th_check(s[0] == 0.0f && s[1] == 1.0f && s[2] == 0.5f && s[4] == 0.0f, "%s exp2 of -inf, 0, -1, -200", k->name);
  th_check(fabs(sum - (1.0 + 0.5 + exp2(3.5))) <= 1e-6 * sum, "%s exp2_row sum %.9g", k->name, (double)sum);
  th_rng r;
  th_rng_init(&r, th_seed());
  for (int n = 1; n <= 70; n++) {
    float v[70], w[70];
    const float shift = (float)(th_rng_normal(&r) * 10.0);
    for (int i = 0; i < n; i++) v[i] = w[i] = (float)(th_rng_normal(&r) * 10.0) - (i % 7 == 3 ? INFINITY : 0.0f);
    const float got = k->exp2_row(v, n, shift);
    double want = 0.0;
    bool ok = true;
    for (int i = 0; i < n; i++) { /* the difference is rounded to fp32 before 2^ (as the kernel does) */
      const float y = w[i] - shift;
      const double e = y < -125.0f ? 0.0 : exp2((double)y);
      want += e;
      ok &= fabs(v[i] - e) <= 0x1p-23 * e;
    }
    th_check(ok && fabs(got - want) <= 1e-6 * want + 1e-37, "%s exp2_row n %d shift %g: sum %.9g, want %.9g", k->name,
             n, (double)shift, (double)got, want);
  }
}

/* ---- row operations ------------------------------------------------------------------------------------- */
static void test_rows(const fc_cpu_kernels *k) {
  th_rng r;
  th_rng_init(&r, th_seed() + 1);
  int bad = 0;
  for (int n = 1; n <= 70; n++) {
    float x[70], y[70], S[70], dP[70];
    double m = -INFINITY, d = 0.0;
    for (int i = 0; i < n; i++) {
      x[i] = (float)th_rng_normal(&r), y[i] = (float)th_rng_normal(&r);
      m = fmax(m, x[i]), d += (double)x[i] * y[i];
    }
    bad += k->row_max(x, n) != (float)m;
    bad += fabs(k->dot(x, y, n) - d) > 1e-5 * (1.0 + fabs(d));
    const float D = (float)th_rng_normal(&r), shift = (float)th_rng_normal(&r);
    for (int i = 0; i < n; i++) S[i] = x[i], dP[i] = y[i];
    k->softmax_grad_row(S, dP, n, shift, D);
    for (int i = 0; i < n; i++) {
      /* The kernel exponentiates the fp32 difference (its rounding alone can pass 2^-23 relative in P). */
      const double P = exp2((double)(x[i] - shift));
      bad += fabs(S[i] - P) > 0x1p-22 * P || fabs(dP[i] - P * (y[i] - D)) > 1e-6 * P * (fabs(y[i] - D) + 1.0);
    }
    for (int i = 0; i < n; i++) S[i] = x[i];
    k->scale_row(S, n, 0.75f);
    for (int i = 0; i < n; i++) bad += S[i] != 0.75f * x[i];
    float all_masked[70];
    for (int i = 0; i < n; i++) all_masked[i] = -INFINITY;
    bad += k->row_max(all_masked, n) != -INFINITY;
  }
  th_check(bad == 0, "%s row_max, dot, softmax_grad_row, scale_row: %d wrong", k->name, bad);
}

/* ---- dtype conversion ----------------------------------------------------------------------------------- */
static bool same_float(float a, float b) { return (isnan(a) && isnan(b)) || th_f32_bits(a) == th_f32_bits(b); }

static void test_dtypes(const fc_cpu_kernels *k) {
  enum { STORES = 300000 };
  static uint16_t h[STORES];
  static float f[65536], g[STORES];
  int64_t bad = 0;
  for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
  /* Loads: every value, in rows of every length up to 40 (the vector body and its tail). */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0, n = 1; i < 65536; i += n, n = n % 40 + 1) {
      const int len = i + n <= 65536 ? n : 65536 - i;
      (pass ? k->load_bf16 : k->load_f16)(h + i, f + i, len, 1.0f);
    }
    for (int i = 0; i < 65536; i++) {
      const float want = pass ? fc_bf16_to_f32(h[i]) : fc_f16_to_f32(h[i]);
      if (!same_float(f[i], want) && bad++ < 5)
        th_fail("%s load_%s(0x%04x) = %a, want %a", k->name, pass ? "bf16" : "f16", i, (double)f[i], (double)want);
    }
  }
  /* mul is applied in fp32 after the conversion */
  k->load_f16(h + 0x3c00, f, 8, 0.5f);
  for (int i = 0; i < 8; i++) bad += f[i] != 0.5f * fc_f16_to_f32((uint16_t)(0x3c00 + i));

  /* Stores: the neighbours of every value of the narrow type (ties and near-ties around each rounding
   * boundary), specials, random patterns. */
  int n = 0;
  th_rng r;
  th_rng_init(&r, th_seed() + 2);
  for (int pass = 0; pass < 2; pass++) {
    n = 0;
    for (int i = 0; i < 65535; i++) {
      const float v = pass ? fc_bf16_to_f32((uint16_t)i) : fc_f16_to_f32((uint16_t)i);
      const float next = pass ? fc_bf16_to_f32((uint16_t)(i + 1)) : fc_f16_to_f32((uint16_t)(i + 1));
      const float mid = (float)(((double)v + next) / 2);
      g[n++] = v, g[n++] = mid, g[n++] = nextafterf(mid, INFINITY), g[n++] = nextafterf(mid, -INFINITY);
    }
    const float special[] = {0.0f,
                             -0.0f,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             65504.0f,
                             65520.0f,
                             0x1p-24f,
                             0x1p-25f,
                             0x1.8p-25f,
                             0x1p-126f,
                             0x1p-149f,
                             3.4e38f,
                             th_bits_f32(0x7f800001u),
                             th_bits_f32(0xffffffffu)};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) g[n++] = special[i];
    while (n < STORES) g[n++] = th_bits_f32((uint32_t)th_rng_u64(&r));
    for (int i = 0, len = 1; i < n; i += len, len = len % 40 + 1) {
      const int m = i + len <= n ? len : n - i;
      (pass ? k->store_bf16 : k->store_f16)(g + i, h + i, m, 1.0f);
    }
    for (int i = 0; i < n; i++) {
      const uint16_t want = pass ? fc_f32_to_bf16(g[i]) : fc_f32_to_f16(g[i]);
      const bool nan_ok =
          pass ? th_bf16_is_nan(h[i]) && th_bf16_is_nan(want) : th_f16_is_nan(h[i]) && th_f16_is_nan(want);
      if (h[i] != want && !nan_ok && bad++ < 5)
        th_fail("%s store_%s(%a) = 0x%04x, want 0x%04x", k->name, pass ? "bf16" : "f16", (double)g[i], h[i], want);
    }
  }
  th_check(bad == 0, "%s dtype conversions: %lld wrong", k->name, (long long)bad);
}

/* ---- gemm ---------------------------------------------------------------------------------------------- */
#define CANARY 12345.0f

static void test_gemm(const fc_cpu_kernels *k) {
  th_rng r;
  th_rng_init(&r, th_seed() + 3);
  const int nr = k->nr, cases = th_quick() ? 150 : 1500;
  int bad = 0;
  for (int t = 0; t < cases; t++) {
    const int M = 1 + (int)(th_rng_u64(&r) % 23), N = 8 * (1 + (int)(th_rng_u64(&r) % 13)),
              K = (int)(th_rng_u64(&r) % 71);
    const int transposed = (int)(th_rng_u64(&r) & 1), packed = (int)(th_rng_u64(&r) & 1),
              accumulate = (int)(th_rng_u64(&r) & 1);
    const int panels = (N + nr - 1) / nr, ldb = packed ? nr : N + 8 * (int)(th_rng_u64(&r) % 3),
              ps = packed ? K * nr + 16 : nr, ldc = N + 8 * (int)(th_rng_u64(&r) % 3);
    /* A as M×K (a_rs = K + 3, a_cs = 1) or stored transposed (a_rs = 1, a_cs = M + 5). */
    const int64_t a_rs = transposed ? 1 : K + 3, a_cs = transposed ? M + 5 : 1;
    const size_t a_len = (size_t)(transposed ? (K > 0 ? K : 1) * (M + 5) : M * (K + 3)),
                 b_len = (size_t)(packed ? panels * ps : (K > 0 ? K : 1) * ldb) + 64, c_len = (size_t)(M + 2) * ldc;
    float *A = malloc(a_len * sizeof(float)), *B = malloc(b_len * sizeof(float)), *C = malloc(c_len * sizeof(float));
    double *want = malloc((size_t)M * N * sizeof(double));
    if (!A || !B || !C || !want) abort();
    for (size_t i = 0; i < a_len; i++) A[i] = (float)th_rng_normal(&r);
    for (size_t i = 0; i < b_len; i++) B[i] = NAN; /* anything the kernel must not read is NaN */
    float *Bk = malloc((size_t)(K > 0 ? K : 1) * N * sizeof(float));
    for (int kk = 0; kk < K; kk++)
      for (int c = 0; c < N; c++) {
        const float v = (float)th_rng_normal(&r);
        Bk[kk * N + c] = v;
        B[(c / nr) * ps + kk * ldb + c % nr] = v;
      }
    if (packed) /* packed panels are zero past N */
      for (int kk = 0; kk < K; kk++)
        for (int c = N; c < panels * nr; c++) B[(c / nr) * ps + kk * ldb + c % nr] = 0.0f;
    for (size_t i = 0; i < c_len; i++) C[i] = CANARY;
    float *C0 = C + ldc; /* one canary row before */
    for (int i = 0; i < M; i++)
      for (int c = 0; c < N; c++) C0[i * ldc + c] = accumulate ? (float)th_rng_normal(&r) : NAN;
    for (int i = 0; i < M; i++)
      for (int c = 0; c < N; c++) {
        double s = accumulate ? C0[i * ldc + c] : 0.0;
        for (int kk = 0; kk < K; kk++) s += (double)A[i * a_rs + kk * a_cs] * Bk[kk * N + c];
        want[i * N + c] = s;
      }
    k->gemm(M, N, K, A, a_rs, a_cs, B, ps, ldb, C0, ldc, accumulate);
    bool ok = true;
    for (int i = -1; i <= M; i++)
      for (int c = 0; c < ldc; c++) {
        const float got = C0[i * ldc + c];
        if (i < 0 || i == M || c >= N) {
          ok &= got == CANARY;
          continue;
        }
        double mag = accumulate ? fabs(C0[i * ldc + c]) : 0.0;
        for (int kk = 0; kk < K; kk++) mag += fabs((double)A[i * a_rs + kk * a_cs] * Bk[kk * N + c]);
        ok &= fabs(got - want[i * N + c]) <= 1e-6 * (mag + 1.0) * (K + 2);
      }
    if (!ok && bad++ < 5)
      th_fail("%s gemm M %d N %d K %d transposed %d packed %d accumulate %d ldb %d ldc %d", k->name, M, N, K,
              transposed, packed, accumulate, ldb, ldc);
    free(A), free(B), free(C), free(want), free(Bk);
  }
  th_check(bad == 0, "%s gemm: %d of %d shapes wrong", k->name, bad, cases);
}

/* ---- transpose ----------------------------------------------------------------------------------------- */
static void test_transpose(const fc_cpu_kernels *k) {
  th_rng r;
  th_rng_init(&r, th_seed() + 4);
  const int cases = th_quick() ? 100 : 1000;
  int bad = 0;
  for (int t = 0; t < cases; t++) {
    const int rows = 1 + (int)(th_rng_u64(&r) % 20), cols = 1 + (int)(th_rng_u64(&r) % 70),
              lds = cols + (int)(th_rng_u64(&r) % 9), ldd = rows + (int)(th_rng_u64(&r) % 9);
    float *src = malloc((size_t)rows * lds * sizeof(float)), *dst = malloc((size_t)(cols + 2) * ldd * sizeof(float));
    if (!src || !dst) abort();
    for (int i = 0; i < rows * lds; i++) src[i] = (float)th_rng_normal(&r);
    for (int i = 0; i < (cols + 2) * ldd; i++) dst[i] = CANARY;
    k->transpose(src, lds, rows, cols, dst + ldd, ldd); /* one canary row of dst before, one after */
    bool ok = true;
    for (int c = -1; c <= cols; c++)
      for (int i = 0; i < ldd; i++) {
        const float got = dst[(c + 1) * ldd + i];
        ok &= c < 0 || c == cols || i >= rows ? got == CANARY : th_f32_bits(got) == th_f32_bits(src[i * lds + c]);
      }
    if (!ok && bad++ < 5) th_fail("%s transpose rows %d cols %d lds %d ldd %d", k->name, rows, cols, lds, ldd);
    free(src), free(dst);
  }
  th_check(bad == 0, "%s transpose: %d of %d shapes wrong", k->name, bad, cases);
}

int main(void) {
  th_begin("test_cpu_kernels");
  const fc_cpu_kernels *all[] = {fc_cpu_kernels_portable(), fc_cpu_kernels_avx2(), fc_cpu_kernels_wide(),
                                 fc_cpu_kernels_avx512(), fc_cpu_kernels_neon()};
  const fc_cpu_kernels *tables[5];
  int count = 0;
  for (size_t i = 0; i < sizeof all / sizeof *all; i++)
    if (all[i]) tables[count++] = all[i];
  for (int i = 0; i < count; i++) {
    const fc_cpu_kernels *k = tables[i];
    printf("kernels %s (panels of %d)\n", k->name, k->nr);
    test_gemm(k);
    test_transpose(k);
    test_rows(k);
    test_dtypes(k);
    test_exp2(k);
  }
  test_exp2_range(tables, count);
  printf("picked: %s\n", fc_cpu_kernels_pick()->name);
  return th_end();
}
