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
#include "common/mask_tiles.cuh"

#include <stdint.h>
#include <string.h>

/* The call's modifiers as both directions' kernel arguments carry them (filled by fc_score_mod_of). */
typedef struct fc_score_mod {
  const float *alibi; /* device slopes, NULL: no ALiBi; sequence b, query head h: alibi[b·alibi_sb + h] */
  int64_t alibi_sb;
  float k_in;  /* softcap: scale / cap (x = cap·tanh(S·k_in)); else scale (x = scale·S) */
  float k_out; /* softcap: cap; 0: no softcap */
  /* Dropout (flashc.h, "Dropout"; cuda-mma and cuda-hopper: the SCORE_MOD kernels carry it as a run-time branch, so
   * the name SCORE_MOD now covers more than the score). drop_on: dropout_p > 0; keep iff the 16-bit half ≥ drop_t; a
   * kept weight is scaled by drop_rp = 1/(1 − p), computed as the CPU backends do. */
  int drop_on;
  uint32_t drop_t;
  float drop_rp;
  uint64_t drop_seed, drop_offset;
  /* attn_mask (flashc.h; a run-time branch of the SCORE_MOD kernels: mma/score_mod.cuh, hopper/score_mod.cuh). bias
   * NULL: none; else element (b, h, i, j) at bias + b·bias_st[0] + h·bias_st[1] + i·bias_st[2] + j·bias_st[3]: a
   * 16-bit bias of the call's dtype (bias_bool 0) or uint8, 0 removing the key (1). bias_pair: keys j, j + 1 (j even)
   * of a row are one aligned 4-byte (bool: 2-byte) word, so that the forward's layout loads each pair at once. */
  const void *bias;
  int bias_bool, bias_pair;
  int64_t bias_st[4];
  /* A boolean mask's blocks at the kernel's block shape (common/mask_tiles.cuh), built by the backend before its
   * kernels: tiles.cls NULL where none was built (a float bias, or no mask), and every block then reads the mask. */
  fc_mask_tiles tiles;
  /* dbias (backward; set by mma/bwd_score_mod.cu): NULL: not wanted; else dS of element (b, h, i, j) goes to dbias +
   * b·dbias_st[0] + … + j·dbias_st[3], stored in the call's dtype (dbias_f32 0) or added to an fp32 buffer (1). */
  void *dbias;
  int dbias_f32;
  int64_t dbias_st[4];
} fc_score_mod;

/* The modifiers of problem p (zeros, NULL: the plain call), and whether it has any (dropout and attn_mask count: the
 * backends without them refuse them in validate.c before this runs). */
static inline bool fc_score_mod_of(const fc_problem *p, fc_score_mod *m) {
  m->alibi = p->alibi_slopes;
  m->alibi_sb = p->alibi_stride_batch;
  m->k_out = p->softcap > 0.0f ? p->softcap : 0.0f;
  m->k_in = p->softcap > 0.0f ? p->scale / p->softcap : p->scale;
  m->drop_on = p->dropout_p > 0.0f;
  m->drop_t = p->dropout_threshold;
  m->drop_rp = m->drop_on ? (float)(1.0 / (1.0 - (double)p->dropout_p)) : 1.0f;
  m->drop_seed = p->dropout_seed, m->drop_offset = p->dropout_offset;
  m->bias = p->attn_mask;
  m->bias_bool = p->attn_mask_is_bool;
  m->bias_pair = 0;
  memset(&m->tiles, 0, sizeof m->tiles);
  for (int d = 0; d < 4; d++) m->bias_st[d] = p->attn_mask_stride[d], m->dbias_st[d] = 0;
  m->dbias = NULL;
  m->dbias_f32 = 0;
  return p->softcap > 0.0f || p->alibi_slopes != NULL || m->drop_on || m->bias != NULL;
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

/* tanh(x) as the special-function unit's tanh.approx.f32 (sm_75+): one operation, and nothing on the FMA pipe,
 * which the softmax around it already keeps busy (at D = 128 the forward spends more FMA-pipe cycles per score than
 * tensor-core ones once a twelve-operation tanh is added). Its relative error (~2^-11) puts up to cap·2^-11 on a
 * capped score, below the 16-bit rounding of that score in plain maths (bf16 2^-9, f16 2^-11 relative): the rule's
 * tests (tests/python/test_features.py, test_cuda_score_mods_rule) compare against exactly that. The backward's
 * recomputed P uses the same function, so P matches the forward's lse. NaN stays NaN, ±inf gives ±1. */
static __device__ __forceinline__ float fc_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
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
/* The same with softcap decided at run time (md.k_out > 0): tanh.approx is one MUFU op, so one body serves calls with
 * and without softcap. */
static __device__ __forceinline__ float fc_mod_score_any(float s, const fc_score_mod &md, float slope, float dist,
                                                         float *g) {
  const bool cap = md.k_out > 0.0f;
  const float th = fc_tanh(s * md.k_in);
  *g = cap ? fmaf(-th, th, 1.0f) : 1.0f;
  return fmaf(-slope, dist, cap ? md.k_out * th : s * md.k_in);
}

#endif /* FLASHC_CUDA_COMMON_SCORE_MOD_CUH */
