/* common/score_mod.cuh — the score modifiers, softcap and ALiBi, as the CUDA backends' kernels apply them (cuda-mma:
 * mma/score_mod.cuh; cuda-hopper: hopper/score_mod.cuh, each with the functions of its accumulator layout). flashc.h
 * defines the score of a visible key as
 *   x = scale·q·k;   softcap > 0: x ← cap·tanh(x / cap);   ALiBi: x ← x − slope·|i + sk − sq − j|
 * then the mask and the softmax. The plain kernels fold the scale into the exponent (P = 2^(c·S − c·m), c =
 * scale·log2 e, lse = scale·m + ln l); the cap acts on scale·S, not on S, so the kernels built with SCORE_MOD (a
 * template flag: the plain kernels' code does not change) turn S into x in place first and run the same softmax
 * with c = log2 e and lse = m + ln l. Softcap and ALiBi are run-time choices inside that one variant (uniform
 * branches around whole blocks), so that each kernel has one feature instantiation, not three.
 *
 * The backward recomputes P = 2^(x·log2 e − lse2) from the same x and differentiates through tanh:
 * dx/dS = scale·(1 − tanh²), and the kernels apply the scale to dK, dQ at the end as they do without softcap, so
 * only dSᵀ gains the factor g = 1 − tanh². ALiBi is a constant of the call: no gradient. */
#ifndef FLASHC_CUDA_COMMON_SCORE_MOD_CUH
#define FLASHC_CUDA_COMMON_SCORE_MOD_CUH

#include "common/common.cuh"

#include <stdint.h>

/* The call's modifiers as both directions' kernel arguments carry them (filled by fc_score_mod_of). */
typedef struct fc_score_mod {
  const float *alibi; /* device slopes, NULL: no ALiBi; sequence b, query head h: alibi[b·alibi_sb + h] */
  int64_t alibi_sb;
  float k_in;  /* softcap: scale / cap (x = cap·tanh(S·k_in)); else scale (x = scale·S) */
  float k_out; /* softcap: cap; 0: no softcap */
  /* Dropout (flashc.h, "Dropout"; cuda-mma only: the SCORE_MOD kernels carry it as a third run-time branch, so the
   * name SCORE_MOD now covers more than the score). drop_on: dropout_p > 0; keep iff the Philox word ≥ drop_t; a kept
   * weight is scaled by drop_rp = 1/(1 − p), computed as the CPU backends do. */
  int drop_on;
  uint32_t drop_t;
  float drop_rp;
  uint64_t drop_seed, drop_offset;
} fc_score_mod;

/* The modifiers of problem p (zeros, NULL: the plain call), and whether it has any (dropout counts: the backends
 * without it refuse it in validate.c before this runs). */
static inline bool fc_score_mod_of(const fc_problem *p, fc_score_mod *m) {
  m->alibi = p->alibi_slopes;
  m->alibi_sb = p->alibi_stride_batch;
  m->k_out = p->softcap > 0.0f ? p->softcap : 0.0f;
  m->k_in = p->softcap > 0.0f ? p->scale / p->softcap : p->scale;
  m->drop_on = p->dropout_p > 0.0f;
  m->drop_t = p->dropout_threshold;
  m->drop_rp = m->drop_on ? (float)(1.0 / (1.0 - (double)p->dropout_p)) : 1.0f;
  m->drop_seed = p->dropout_seed, m->drop_offset = p->dropout_offset;
  return p->softcap > 0.0f || p->alibi_slopes != NULL || m->drop_on;
}

/* What the CUDA kernels cannot represent: |scale| / softcap past fp32's range (a cap below ~1e-38·|scale|), which
 * would turn a score of 0 into 0·inf = NaN where flashc.h's definition gives tanh(0) = 0. Refused, not answered
 * wrongly. */
static inline flashc_status fc_score_mod_check(const fc_problem *p, const char *who) {
  if (p->softcap > 0.0f && !(fabsf(p->scale / p->softcap) <= 3.4e38f))
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "softcap %g with scale %g: scale/softcap overflows fp32 on backend %s (the cap is too small)",
                    (double)p->softcap, (double)p->scale, who);
  return FLASHC_OK;
}

/* min(a, b), NaN when either is NaN (fc_fmax_nan's twin): a NaN score must stay NaN through the clamp below. */
static __device__ __forceinline__ float fc_fmin_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a || b != b ? __int_as_float(0x7fffffff) : fminf(a, b);
#endif
}

/* tanh(x) to 3.2e-7 relative (2.6 ulp; measured in fp32 over 1e-30 .. 20 against double tanh, plus rcp.approx's
 * ulp): Eigen's rational minimax p(x)/q(x) of degrees 13/6 on x clamped to ±7.905 (where it reaches 1 in fp32), one
 * reciprocal on the special-function unit and 12 FMA-pipe operations. Not tanh.approx.f32: its documented bound is
 * ~2^-11, which puts an error of up to cap·2^-11 on the capped score, as large as fp16's own rounding of the score
 * (2^-11 relative) and far above it where a huge cap leaves small scores nearly linear; the rule (error ≤ 2x that of
 * the same maths done plainly in 16 bits) could not be shown for it without a GPU to measure. libdevice's tanhf
 * costs two special-function operations (ex2, rcp) where this costs one, and the softmax's exponentials already
 * queue on that unit (16 a clock per SM); the FMA pipe (128 a clock) has room. The backward's recomputed P uses the
 * same function, so that P matches the forward's lse. NaN stays NaN (the clamps propagate it), ±inf gives ±1. */
static __device__ __forceinline__ float fc_tanh(float x) {
  x = fc_fmin_nan(fc_fmax_nan(x, -7.90531110763549805f), 7.90531110763549805f);
  const float x2 = x * x;
  float p = fmaf(x2, -2.76076847742355e-16f, 2.00018790482477e-13f);
  p = fmaf(x2, p, -8.60467152213735e-11f);
  p = fmaf(x2, p, 5.12229709037114e-08f);
  p = fmaf(x2, p, 1.48572235717979e-05f);
  p = fmaf(x2, p, 6.37261928875436e-04f);
  p = fmaf(x2, p, 4.89352455891786e-03f);
  p *= x;
  float q = fmaf(x2, 1.19825839466702e-06f, 1.18534705686654e-04f);
  q = fmaf(x2, q, 2.26843463243900e-03f);
  q = fmaf(x2, q, 4.89352518554385e-03f);
  return __fdividef(p, q);
}

/* This thread's ALiBi slope for sequence b, query head h (0 without ALiBi). */
static __device__ __forceinline__ float fc_score_mod_slope(const fc_score_mod &md, int64_t b, int h) {
  return md.alibi ? __ldg(md.alibi + b * md.alibi_sb + h) : 0.0f;
}

/* The backward's score element s (unscaled, as the MMA leaves it) → x, and *g = 1 − tanh² (CAP; 1 without softcap),
 * dS's factor. dist: the ALiBi distance |i + sk − sq − j| of the element (any finite value when slope = 0, which
 * then adds an exact −0: one FMA instead of a branch per element). */
template <bool CAP>
static __device__ __forceinline__ float fc_mod_score(float s, const fc_score_mod &md, float slope, float dist,
                                                     float *g) {
  float x;
  if constexpr (CAP) {
    const float th = fc_tanh(s * md.k_in);
    *g = fmaf(-th, th, 1.0f);
    x = md.k_out * th;
  } else {
    *g = 1.0f;
    x = s * md.k_in;
  }
  return fmaf(-slope, dist, x);
}

#endif /* FLASHC_CUDA_COMMON_SCORE_MOD_CUH */
