/*
 * convert.c — f32 <-> f16 / bf16 / f64 for the CLI's data, round to nearest even.
 *
 * The CLI keeps inputs as f32 on the host and converts once into the compute dtype; results come back as
 * doubles (exact for every dtype) for the metrics and the .npy files.
 */
#include "cli.h"

#include <math.h>
#include <string.h>

static uint32_t bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return b;
}

static float float_of(uint32_t b) {
  float x;
  memcpy(&x, &b, 4);
  return x;
}

/* f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
uint16_t cli_f32_to_f16(float x) {
  uint32_t b = bits_of(x);
  uint16_t sign = (uint16_t)(b >> 16 & 0x8000u);
  uint32_t e32 = b >> 23 & 0xffu, man = b & 0x7fffffu;
  if (e32 == 0xffu) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u | man >> 13 : 0)); /* inf, NaN stays NaN */
  int32_t e = (int32_t)e32 - 127 + 15;                                                  /* the f16 biased exponent */
  if (e >= 31) return (uint16_t)(sign | 0x7c00u); /* beyond 65504 rounds to inf (65520 and up) */
  if (e <= 0) {
    /* An f16 subnormal is m·2^-24. In those units the value is full·2^(e-14), i.e. full >> (14 - e) with
     * the shifted-out bits deciding the rounding; below half of 2^-24 (e < -10) it rounds to 0. */
    if (e < -10) return sign;
    uint32_t full = man | 0x800000u;
    int shift = 14 - e;
    uint32_t q = full >> shift, rem = full & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++; /* may carry into the smallest normal: still right */
    return (uint16_t)(sign | q);
  }
  uint32_t q = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++; /* a carry into the exponent is the right rounding */
  return (uint16_t)(sign | q);
}

float cli_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = h >> 10 & 0x1fu, man = h & 0x3ffu;
  if (e == 0) { /* zero or subnormal: man·2^-24, exact in f32 */
    float v = ldexpf((float)man, -24);
    return sign ? -v : v;
  }
  if (e == 31) return float_of(sign | 0x7f800000u | man << 13);
  return float_of(sign | (e + 127 - 15) << 23 | man << 13);
}

/* bf16: the top 16 bits of an f32. */
uint16_t cli_f32_to_bf16(float x) {
  uint32_t b = bits_of(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)(b >> 16 | 0x40u); /* NaN: keep it a (quiet) NaN */
  b += 0x7fffu + (b >> 16 & 1u);                                           /* ties to even */
  return (uint16_t)(b >> 16);
}

float cli_bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

float cli_round_to(flashc_dtype dtype, float x) {
  switch (dtype) {
  case FLASHC_F16: return cli_f16_to_f32(cli_f32_to_f16(x));
  case FLASHC_BF16: return cli_bf16_to_f32(cli_f32_to_bf16(x));
  default: return x;
  }
}

void cli_pack(const float *src, void *dst, flashc_dtype dtype, int64_t n) {
  switch (dtype) {
  case FLASHC_F32: memcpy(dst, src, (size_t)n * sizeof(float)); break;
  case FLASHC_F16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = cli_f32_to_f16(src[i]);
    break;
  case FLASHC_BF16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = cli_f32_to_bf16(src[i]);
    break;
  case FLASHC_F64:
    for (int64_t i = 0; i < n; i++) ((double *)dst)[i] = src[i];
    break;
  }
}

void cli_unpack(const void *src, flashc_dtype dtype, double *dst, int64_t n) {
  switch (dtype) {
  case FLASHC_F32:
    for (int64_t i = 0; i < n; i++) dst[i] = ((const float *)src)[i];
    break;
  case FLASHC_F16:
    for (int64_t i = 0; i < n; i++) dst[i] = cli_f16_to_f32(((const uint16_t *)src)[i]);
    break;
  case FLASHC_BF16:
    for (int64_t i = 0; i < n; i++) dst[i] = cli_bf16_to_f32(((const uint16_t *)src)[i]);
    break;
  case FLASHC_F64: memcpy(dst, src, (size_t)n * sizeof(double)); break;
  }
}

bool cli_parse_dtype(const char *s, flashc_dtype *dtype) {
  if (strcmp(s, "f32") == 0)
    *dtype = FLASHC_F32;
  else if (strcmp(s, "f16") == 0)
    *dtype = FLASHC_F16;
  else if (strcmp(s, "bf16") == 0)
    *dtype = FLASHC_BF16;
  else
    return false;
  return true;
}
