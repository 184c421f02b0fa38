/* dtype.c — f16 and bf16 conversions written apart from the library's bit tricks: the value is rounded by
 * exact arithmetic on doubles (a float divided by a power of two is exact in double, and nearbyint rounds
 * half to even in the default rounding mode), then encoded. Slow and obviously right: the tests' inputs,
 * the baseline's roundings and test_dtype's fallback reference. */
#include "harness.h"

#include <math.h>
#include <string.h>

uint16_t th_f32_to_f16(float f) {
  uint16_t sign = signbit(f) ? 0x8000u : 0;
  if (isnan(f)) return sign | 0x7e00u;
  double a = fabs((double)f);
  /* 65504 is the largest f16; its successor would be 2^16, so the midpoint 65520 and above round to inf
   * (a tie goes to the even 2^16, which is inf). */
  if (a >= 65520.0) return sign | 0x7c00u;
  double quantum;
  if (a < 0x1p-14) {
    quantum = 0x1p-24; /* subnormals: fixed spacing */
  } else {
    int e;
    frexp(a, &e);                     /* a in [2^(e-1), 2^e) */
    quantum = ldexp(1.0, e - 1 - 10); /* 10 fraction bits */
  }
  double r = nearbyint(a / quantum) * quantum;
  if (r < 0x1p-14) return sign | (uint16_t)(r / 0x1p-24);
  int e;
  double m = frexp(r, &e); /* r = m·2^e, m in [0.5, 1) */
  return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((m * 2.0 - 1.0) * 1024.0);
}

float th_f16_to_f32(uint16_t h) {
  unsigned e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  double v;
  if (e == 0)
    v = ldexp((double)m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexp((double)(1024 + m), (int)e - 25);
  return (float)((h & 0x8000u) ? -v : v);
}

uint16_t th_f32_to_bf16(float f) {
  uint16_t sign = signbit(f) ? 0x8000u : 0;
  if (isnan(f)) return sign | 0x7fc0u;
  double a = fabs((double)f);
  /* The largest bf16 is 0x1.fep127; the midpoint to 2^128 (and above) rounds to inf, a tie to the even 2^128. */
  if (a >= 0x1.ffp127) return sign | 0x7f80u;
  double quantum;
  if (a < 0x1p-126) {
    quantum = 0x1p-133; /* f32 subnormal range: 7 fraction bits below 2^-126 */
  } else {
    int e;
    frexp(a, &e);
    quantum = ldexp(1.0, e - 1 - 7); /* 7 fraction bits */
  }
  float r = (float)(nearbyint(a / quantum) * quantum); /* exact: r is a bf16 value, so a float */
  uint32_t bits;
  memcpy(&bits, &r, 4);
  return sign | (uint16_t)(bits >> 16);
}

float th_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16; /* bf16 is the top half of an f32 by definition */
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

double th_round(flashc_dtype dtype, double x) {
  switch (dtype) {
  case FLASHC_F32: return (float)x;
  case FLASHC_F16: return th_f16_to_f32(th_f32_to_f16((float)x));
  case FLASHC_BF16: return th_bf16_to_f32(th_f32_to_bf16((float)x));
  case FLASHC_F64: return x;
  }
  return NAN;
}

double th_unit_roundoff(flashc_dtype dtype) {
  switch (dtype) {
  case FLASHC_F32: return 0x1p-24;
  case FLASHC_F16: return 0x1p-11;
  case FLASHC_BF16: return 0x1p-8;
  case FLASHC_F64: return 0x1p-53;
  }
  return NAN;
}

double th_load(const void *base, flashc_dtype dtype, int64_t i) {
  switch (dtype) {
  case FLASHC_F32: return ((const float *)base)[i];
  case FLASHC_F16: return th_f16_to_f32(((const uint16_t *)base)[i]);
  case FLASHC_BF16: return th_bf16_to_f32(((const uint16_t *)base)[i]);
  case FLASHC_F64: return ((const double *)base)[i];
  }
  return NAN;
}

void th_store(void *base, flashc_dtype dtype, int64_t i, double x) {
  switch (dtype) {
  case FLASHC_F32: ((float *)base)[i] = (float)x; break;
  case FLASHC_F16: ((uint16_t *)base)[i] = th_f32_to_f16((float)x); break;
  case FLASHC_BF16: ((uint16_t *)base)[i] = th_f32_to_bf16((float)x); break;
  case FLASHC_F64: ((double *)base)[i] = x; break;
  }
}
