/*
 * test_dtype.c — the library's software f16 and bf16 conversions (src/internal.h).
 *
 *   f16 → f32: all 65536 values, against the compiler's _Float16 where it has one and against the harness's
 *              slow decoder; every non-NaN f16 survives f16 → f32 → f16.
 *   f32 → f16: round to nearest even, against _Float16 (and the harness's slow reference, itself checked
 *              against _Float16 here) on every f16 value, its f32 neighbours, the midpoints between f16
 *              values and their neighbours (ties, subnormals, the overflow threshold), specials, and random
 *              bit patterns.
 *   bf16:      nearest even against the slow reference on the same kinds of inputs; NaN stays NaN (also
 *              a NaN whose payload lies only in the low 16 bits, which plain truncation would turn into inf).
 */
#include "harness.h"
#include "internal.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#if defined(__FLT16_MAX__)
#define HAVE_FLOAT16 1
static uint16_t f16_hw(float f) { /* the compiler's conversion, bits */
  _Float16 h = (_Float16)f;
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}
static _Float16 f16_of_bits(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, 2);
  return h;
}
#else
#define HAVE_FLOAT16 0
#define f16_hw       NULL
#endif

static int64_t mismatches;
static void mismatch(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void mismatch(const char *fmt, ...) {
  if (mismatches++ < 10) {
    va_list ap;
    va_start(ap, fmt);
    printf("  mismatch: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
  }
}

/* ---- f16 → f32, exhaustive --------------------------------------------------------------------------- */
static void f16_to_f32_all(void) {
  mismatches = 0;
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float lib = fc_f16_to_f32(h), ref = th_f16_to_f32(h);
#if HAVE_FLOAT16
    float hw = (float)f16_of_bits(h);
    if (isnan(hw) != isnan(ref) || (!isnan(hw) && th_f32_bits(hw) != th_f32_bits(ref)))
      mismatch("harness decoder 0x%04x: %a, _Float16 %a", h, (double)ref, (double)hw);
#endif
    if (th_f16_is_nan(h)) {
      if (!isnan(lib) || signbit(lib) != signbit(ref))
        mismatch("fc_f16_to_f32(0x%04x) = %a; expected a NaN", h, (double)lib);
      if (!th_f16_is_nan(fc_f32_to_f16(lib))) mismatch("NaN 0x%04x does not stay NaN through f32", h);
      continue;
    }
    if (th_f32_bits(lib) != th_f32_bits(ref))
      mismatch("fc_f16_to_f32(0x%04x) = %a; expected %a", h, (double)lib, (double)ref);
    uint16_t back = fc_f32_to_f16(lib);
    if (back != h) mismatch("0x%04x -> %a -> 0x%04x: no round trip", h, (double)lib, back);
  }
  th_check(mismatches == 0, "f16 -> f32: %lld mismatches over all 65536 values", (long long)mismatches);
  if (!mismatches)
    printf("ok   f16 -> f32 and back: all 65536 values%s\n", HAVE_FLOAT16 ? " (and _Float16 agrees)" : "");
}

/* ---- f32 → f16 and bf16: one check for both encoders -------------------------------------------------- */
/* An encoder under test: the library's, the harness's slow reference, and the compiler's where it has one (_Float16:
 * f16 only), which the reference must match and which then decides. */
typedef struct encoder {
  const char *name; /* "f16": fc_f32_to_f16, th_f32_to_f16 */
  uint16_t (*lib)(float), (*ref)(float), (*hw)(float);
  bool (*is_nan)(uint16_t);
  int64_t checked;
} encoder;

static encoder f16_enc = {"f16", fc_f32_to_f16, th_f32_to_f16, f16_hw, th_f16_is_nan, 0};
static encoder bf16_enc = {"bf16", fc_f32_to_bf16, th_f32_to_bf16, NULL, th_bf16_is_nan, 0};

static void check_encode(encoder *e, float f) {
  e->checked++;
  uint16_t lib = e->lib(f), ref = e->ref(f);
  if (isnan(f)) {
    if (!e->is_nan(lib) || (lib >> 15) != (ref >> 15))
      mismatch("fc_f32_to_%s(NaN 0x%08x) = 0x%04x; expected a NaN of its sign", e->name, th_f32_bits(f), lib);
    return;
  }
  if (e->hw) {
    uint16_t hw = e->hw(f);
    if (ref != hw) mismatch("harness th_f32_to_%s(%a) = 0x%04x, _Float16 0x%04x", e->name, (double)f, ref, hw);
    ref = hw;
  }
  if (lib != ref)
    mismatch("fc_f32_to_%s(%a = 0x%08x) = 0x%04x; expected 0x%04x", e->name, (double)f, th_f32_bits(f), lib, ref);
}

/* f and its f32 neighbours, both signs. */
static void with_neighbours(float f, encoder *e) {
  float below = nextafterf(f, -INFINITY), above = nextafterf(f, INFINITY);
  float xs[3] = {below, f, above};
  for (int i = 0; i < 3; i++) check_encode(e, xs[i]), check_encode(e, -xs[i]);
}

static void specials(encoder *e) {
  float xs[] = {0.0f,        FLT_MIN,     FLT_MAX,   FLT_TRUE_MIN, INFINITY,        65504.0f,
                65519.0f,    65520.0f,    65536.0f,  1e10f,        0x1p-24f,        0x1p-25f,
                0x1.8p-25f,  0x1p-26f,    0x1p-14f,  0x1.ff8p-15f, 3.0f * 0x1p-25f, 0x1.fep127f,
                0x1.ffp127f, 0x1.fdp127f, 0x1p-126f, 0x1p-133f,    0x1p-134f};
  for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) with_neighbours(xs[i], e);
  uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0x7fffffffu, 0x7fa00000u, 0x7f800100u, 0xffc00000u, 0xff800001u};
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_encode(e, th_bits_f32(nans[i]));
}

static void f32_to_f16_many(th_rng *r) {
  mismatches = 0;
  f16_enc.checked = 0;
  for (uint32_t i = 0; i < 0x7c00u; i++) { /* every finite non-negative f16, and its upper midpoint */
    float v = th_f16_to_f32((uint16_t)i), next = th_f16_to_f32((uint16_t)(i + 1));
    with_neighbours(v, &f16_enc);
    with_neighbours(v + (next - v) / 2, &f16_enc); /* exact: 12 significant bits fit in f32 */
  }
  specials(&f16_enc);
  for (int i = 0; i < (th_quick() ? 200000 : 2000000); i++) {
    check_encode(&f16_enc, th_bits_f32((uint32_t)th_rng_u64(r)));                             /* any bits */
    check_encode(&f16_enc, (float)(th_rng_uniform(r) * 140000.0 - 70000.0));                  /* f16's range */
    check_encode(&f16_enc, (float)ldexp(th_rng_uniform(r), -14 - (int)(th_rng_u64(r) % 12))); /* subnormals */
  }
  th_check(mismatches == 0, "f32 -> f16: %lld mismatches in %lld values", (long long)mismatches,
           (long long)f16_enc.checked);
  if (!mismatches)
    printf("ok   f32 -> f16: %lld values agree with %s\n", (long long)f16_enc.checked,
           HAVE_FLOAT16 ? "_Float16 and the harness's reference" : "the harness's reference (no _Float16 here)");
}

/* ---- bf16 -------------------------------------------------------------------------------------------- */
static void bf16_all(th_rng *r) {
  mismatches = 0;
  bf16_enc.checked = 0;
  for (uint32_t i = 0; i < 65536; i++) { /* decode: exhaustive; encode: each value, midpoints, neighbours */
    uint16_t h = (uint16_t)i;
    float lib = fc_bf16_to_f32(h), ref = th_bf16_to_f32(h);
    if (th_bf16_is_nan(h)) {
      if (!isnan(lib)) mismatch("fc_bf16_to_f32(0x%04x) = %a; expected a NaN", h, (double)lib);
      continue;
    }
    if (th_f32_bits(lib) != th_f32_bits(ref))
      mismatch("fc_bf16_to_f32(0x%04x) = %a; expected %a", h, (double)lib, (double)ref);
    if (fc_f32_to_bf16(lib) != h) mismatch("bf16 0x%04x does not round-trip", h);
    if ((h & 0x7fffu) < 0x7f80u) {
      float mid = th_bits_f32(((uint32_t)h << 16) | 0x8000u); /* halfway to the next bf16 */
      with_neighbours(lib, &bf16_enc);
      with_neighbours(mid, &bf16_enc);
    }
  }
  specials(&bf16_enc);
  for (int i = 0; i < (th_quick() ? 200000 : 2000000); i++)
    check_encode(&bf16_enc, th_bits_f32((uint32_t)th_rng_u64(r)));
  th_check(mismatches == 0, "bf16: %lld mismatches in %lld values", (long long)mismatches, (long long)bf16_enc.checked);
  if (!mismatches)
    printf("ok   bf16: all 65536 decode and round-trip; %lld f32 values round to nearest even\n",
           (long long)bf16_enc.checked);
}

/* ---- fc_load / fc_store: one rounding per store, every dtype ----------------------------------------- */
static void load_store(th_rng *r) {
  mismatches = 0;
  for (int dt = 0; dt <= FLASHC_F64; dt++) {
    unsigned char buf[8 * 4];
    for (int i = 0; i < 10000; i++) {
      double x = th_rng_normal(r) * ldexp(1.0, (int)(th_rng_u64(r) % 20) - 10);
      fc_store(buf, (flashc_dtype)dt, 3, x);
      double got = fc_load(buf, (flashc_dtype)dt, 3), want = th_round((flashc_dtype)dt, x);
      if (got != want)
        mismatch("%s: store %a, load %a; expected %a", flashc_dtype_name((flashc_dtype)dt), x, got, want);
    }
  }
  th_check(mismatches == 0, "fc_load/fc_store: %lld mismatches", (long long)mismatches);
  if (!mismatches) printf("ok   fc_store then fc_load rounds once to each dtype\n");
}

int main(void) {
  th_begin("test_dtype");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  f16_to_f32_all();
  f32_to_f16_many(&rng);
  bf16_all(&rng);
  load_store(&rng);
  return th_end();
}
