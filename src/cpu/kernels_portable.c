/*
 * kernels_portable.c — the `cpu` kernels for any CPU: kernels_simd.h on the compiler's generic 4-lane vectors
 * (GCC and Clang vector extensions), which become SSE, AdvSIMD, VSX ... or scalar code for whatever the
 * build targets. dtype conversions go lane by lane through the scalar ones of internal.h.
 */
#include "../internal.h"
#include "kernels.h"

typedef float fc_v4 __attribute__((vector_size(16)));
typedef int32_t fc_i4 __attribute__((vector_size(16)));

#define FC_TARGET
#define FC_KERNELS_NAME "portable"
#define FC_V            fc_v4
#define FC_VL           4
/* 4 rows × 2 vectors: 8 accumulators, 2 panel vectors and 1 broadcast fit the 16 registers of SSE. */
#define FC_MR 4
#define FC_NV 2

#define FC_PORTABLE __attribute__((always_inline)) static inline

FC_PORTABLE fc_v4 p_load(const float *p) {
  fc_v4 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
FC_PORTABLE void p_store(float *p, fc_v4 v) { __builtin_memcpy(p, &v, sizeof v); }
FC_PORTABLE fc_v4 p_set1(float x) { return (fc_v4){x, x, x, x}; }
FC_PORTABLE fc_v4 p_select(fc_i4 mask, fc_v4 a, fc_v4 b) { /* a where mask is −1, b where 0 */
  return (fc_v4)(((fc_i4)a & mask) | ((fc_i4)b & ~mask));
}
/* a where a > b or a is NaN, else b (NaN when b is): NaN wins either way. */
FC_PORTABLE fc_v4 p_max(fc_v4 a, fc_v4 b) { return p_select((a > b) | (a != a), a, b); }
/* NaN fails the comparison, so it passes through. */
FC_PORTABLE fc_v4 p_min_nan(fc_v4 x, fc_v4 b) { return p_select(x > b, b, x); }
/* Nearest, ties to even, by adding and subtracting 1.5·2^23 (exact for |x| < 2^22 in the default rounding
 * mode; larger |x| are whole already and come back unchanged or are discarded below −125). */
FC_PORTABLE fc_v4 p_round(fc_v4 x) { return (x + p_set1(0x1.8p23f)) - p_set1(0x1.8p23f); }
/* Lanes outside [−125, 128] (NaN, −inf, very negative) become 0 first, since converting them to an integer
 * is undefined; the caller discards them. */
FC_PORTABLE fc_v4 p_pow2_minus1(fc_v4 n) {
  n = p_select((n >= p_set1(-125.0f)) & (n <= p_set1(128.0f)), n, p_set1(0.0f));
  return (fc_v4)((__builtin_convertvector(n, fc_i4) + 126) << 23);
}
FC_PORTABLE fc_v4 p_zero_below(fc_v4 r, fc_v4 x, float b) { return (fc_v4)((fc_i4)r & ~(x < p_set1(b))); }
FC_PORTABLE float p_hmax(fc_v4 v) {
  float m = v[0];
  for (int i = 1; i < 4; i++) m = v[i] > m || v[i] != v[i] ? v[i] : m;
  return m;
}
FC_PORTABLE float p_hsum(fc_v4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }
FC_PORTABLE fc_v4 p_loadn(const float *p, int n) {
  fc_v4 v = {0, 0, 0, 0};
  for (int i = 0; i < n; i++) v[i] = p[i];
  return v;
}
FC_PORTABLE void p_storen(float *p, fc_v4 v, int n) {
  for (int i = 0; i < n; i++) p[i] = v[i];
}
FC_PORTABLE fc_v4 p_load_f16(const uint16_t *p) {
  return (fc_v4){fc_f16_to_f32(p[0]), fc_f16_to_f32(p[1]), fc_f16_to_f32(p[2]), fc_f16_to_f32(p[3])};
}
FC_PORTABLE void p_store_f16(uint16_t *p, fc_v4 v) {
  for (int i = 0; i < 4; i++) p[i] = fc_f32_to_f16(v[i]);
}
FC_PORTABLE fc_v4 p_load_bf16(const uint16_t *p) {
  return (fc_v4){fc_bf16_to_f32(p[0]), fc_bf16_to_f32(p[1]), fc_bf16_to_f32(p[2]), fc_bf16_to_f32(p[3])};
}
FC_PORTABLE void p_store_bf16(uint16_t *p, fc_v4 v) {
  for (int i = 0; i < 4; i++) p[i] = fc_f32_to_bf16(v[i]);
}

#define V_ZERO()              p_set1(0.0f)
#define V_SET1(x)             p_set1(x)
#define V_LOAD(p)             p_load(p)
#define V_STORE(p, v)         p_store(p, v)
#define V_BCAST(p)            p_set1(*(p))
#define V_LOADN(p, n)         p_loadn(p, n)
#define V_STOREN(p, v, n)     p_storen(p, v, n)
#define V_ADD(a, b)           ((a) + (b))
#define V_SUB(a, b)           ((a) - (b))
#define V_MUL(a, b)           ((a) * (b))
#define V_MAX(a, b)           p_max(a, b)
#define V_FMA(a, b, c)        ((a) * (b) + (c))
#define V_HMAX(v)             p_hmax(v)
#define V_HSUM(v)             p_hsum(v)
#define V_ROUND(x)            p_round(x)
#define V_MIN_NAN(x, b)       p_min_nan(x, b)
#define V_POW2_MINUS1(n)      p_pow2_minus1(n)
#define V_ZERO_BELOW(r, x, b) p_zero_below(r, x, b)
#define V_LOAD_F16(p)         p_load_f16(p)
#define V_STORE_F16(p, v)     p_store_f16(p, v)
#define V_LOAD_BF16(p)        p_load_bf16(p)
#define V_STORE_BF16(p, v)    p_store_bf16(p, v)

#include "kernels_simd.h"

const fc_cpu_kernels *fc_cpu_kernels_portable(void) { return &kernels; }
