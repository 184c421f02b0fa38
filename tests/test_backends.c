/*
 * test_backends.c — every backend against the fp64 oracle on one case list (ggml's test-backend-ops).
 *
 * For each case and dtype: random inputs rounded to the dtype; the reference is cpu-ref run in f64 on the
 * same values; the baseline is plain attention in the dtype (tests/common/naive.c). A backend passes when
 *   max_abs_err(backend) ≤ k·max_abs_err(baseline) + floor,   k = 2 forward, 3 backward
 * (FlashAttention's rule), and when every output element was written, nothing outside the views was, no
 * value is NaN or inf, and rows that see no key give o = 0, lse = −inf and dq = 0. For f64 (cpu-ref only)
 * the reference is this harness's own fp64 attention instead: the oracle is checked by a second, independent
 * one. Backward runs from the backend's own forward outputs, as a user would call it.
 *
 * Also: bit-identical gradients with params.deterministic = 1, a forward repeated 20 times (races), and the
 * same o with lse = NULL.
 *
 * Environment: FLASHC_TEST_BACKENDS=cpu,cuda-mma (only these), FLASHC_TEST_CASES=substring,...,
 * FLASHC_TEST_QUICK=1 (a small subset), FLASHC_TEST_SEED=n (repeat a run).
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the case list ------------------------------------------------------------------------------------ */
#define F32  (1u << FLASHC_F32)
#define F16  (1u << FLASHC_F16)
#define BF16 (1u << FLASHC_BF16)
#define F64  (1u << FLASHC_F64)
#define LOW  (F32 | F16 | BF16)

enum {
  QUICK = 1u << 0,   /* in the FLASHC_TEST_QUICK subset */
  DETERM = 1u << 1,  /* backward twice with params.deterministic = 1: bit-identical */
  LSENULL = 1u << 2, /* forward again with lse = NULL: the same o */
};

typedef struct tcase {
  const char *name;
  int64_t batch, sq, sk, hq, hkv, d;
  int causal;
  flashc_causal_align align;
  int64_t wl, wr; /* window; −1 unbounded */
  th_layout layout;
  unsigned dtypes, flags;
  float scale;                    /* 0: default */
  const int32_t *lens_q, *lens_k; /* varlen: per-sequence lengths (num_seqs of them), else NULL */
  int num_seqs;
} tcase;

#define BR FLASHC_ALIGN_BOTTOM_RIGHT
#define TL FLASHC_ALIGN_TOP_LEFT
/* name, batch, sq, sk, hq, hkv, d, causal, align, window, layout, dtypes, flags */
#define DENSE(name, b, sq, sk, hq, hkv, d, causal, align, wl, wr, layout, dtypes, flags)                               \
  { name, b, sq, sk, hq, hkv, d, causal, align, wl, wr, layout, dtypes, flags, 0.0f, NULL, NULL, 0 }

/* Varlen: lengths per sequence, one of 1 and ones of 0 on either side (queries that see no key; keys that
 * no query sees). */
static const int32_t vq[] = {1, 37, 0, 100, 64, 9}, vk[] = {5, 37, 3, 100, 0, 1};
static const int32_t vq2[] = {7, 1, 130}, vk2[] = {7, 60, 90};
static const int32_t vq3[] = {1, 9, 0, 13, 6}, vk3[] = {4, 9, 2, 0, 11};

static const tcase cases[] = {
    /* small shapes that cover every feature: the FLASHC_TEST_QUICK subset (sanitizer runs), run always */
    DENSE("small-37x23-causal", 1, 37, 23, 2, 2, 32, 1, BR, -1, -1, TH_BSHD, LOW | F64, QUICK), /* 14 empty rows */
    DENSE("small-23x37-causal-tl", 1, 23, 37, 2, 2, 48, 1, TL, -1, -1, TH_BHSD, LOW, QUICK),
    DENSE("small-d59-mqa", 1, 31, 45, 4, 1, 59, 0, BR, -1, -1, TH_BSHD, LOW | F64, QUICK),
    DENSE("small-win8-3", 1, 60, 70, 2, 2, 32, 0, BR, 8, 3, TH_BSHD, LOW | F64, QUICK),
    DENSE("small-strided-gqa", 2, 31, 45, 4, 2, 40, 0, BR, -1, -1, TH_STRIDED, LOW, QUICK),
    {"small-varlen", 1, 0, 0, 2, 2, 32, 0, BR, -1, -1, TH_BHSD, LOW | F64, QUICK | DETERM | LSENULL, 0.0f, vq3, vk3, 5},
    /* past the first query block (256 or 128 rows in cpu) and key tile (64), with padded head dims: the
     * tile edges, in the quick subset too so that the sanitizers see them */
    DENSE("tiles-300x270-causal-d72", 1, 300, 270, 2, 1, 72, 1, BR, -1, -1, TH_BSHD, F16, QUICK),
    DENSE("tiles-140x150-d130-win40-20", 1, 140, 150, 2, 2, 130, 0, BR, 40, 20, TH_BHSD, BF16, QUICK),
    DENSE("tiles-200x300-d200-gqa", 1, 200, 300, 4, 2, 200, 0, BR, -1, -1, TH_BSHD, BF16, QUICK),
    /* decoding: few query rows against many keys (cuda-mma splits the keys between CTAs: mma/fwd_split.cuh) */
    DENSE("decode-1x2000-gqa", 1, 1, 2000, 4, 2, 128, 1, BR, -1, -1, TH_BSHD, LOW, QUICK),
    DENSE("decode-5x3000-win100", 2, 5, 3000, 2, 2, 64, 0, BR, 100, 0, TH_BSHD, LOW, QUICK | DETERM),
    /* seqlens */
    DENSE("s1", 2, 1, 1, 3, 3, 64, 0, BR, -1, -1, TH_BSHD, LOW | F64, QUICK | LSENULL),
    DENSE("s7", 2, 7, 7, 2, 2, 32, 0, BR, -1, -1, TH_BSHD, LOW | F64, QUICK | DETERM),
    DENSE("s100", 1, 100, 100, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, LOW | F64, 0),
    DENSE("s129-causal", 2, 129, 129, 2, 2, 64, 1, BR, -1, -1, TH_BSHD, LOW, DETERM),
    DENSE("s257", 1, 257, 257, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, F32 | BF16, 0),
    DENSE("s1000", 1, 1000, 1000, 1, 1, 64, 0, BR, -1, -1, TH_BSHD, F16, 0),
    DENSE("s1025-causal", 1, 1025, 1025, 1, 1, 64, 1, BR, -1, -1, TH_BSHD, F16, 0),
    DENSE("s1000-causal", 1, 1000, 1000, 1, 1, 64, 1, BR, -1, -1, TH_BSHD, F32, 0),
    /* seqlen_q ≠ seqlen_k, both ways */
    DENSE("113x203", 1, 113, 203, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("203x113", 1, 203, 113, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("113x203-causal", 1, 113, 203, 2, 2, 64, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("203x113-causal", 1, 203, 113, 2, 2, 64, 1, BR, -1, -1, TH_BSHD, LOW | F64, 0), /* 90 empty rows */
    DENSE("1024x1023-causal", 1, 1024, 1023, 1, 1, 64, 1, BR, -1, -1, TH_BSHD, BF16, 0),
    DENSE("1x147", 2, 1, 147, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("1x147-causal", 2, 1, 147, 2, 2, 64, 1, BR, -1, -1, TH_BSHD, F16, 0),
    /* causal, top-left */
    DENSE("113x203-causal-tl", 1, 113, 203, 2, 2, 64, 1, TL, -1, -1, TH_BSHD, LOW, 0),
    DENSE("203x113-causal-tl", 1, 203, 113, 2, 2, 64, 1, TL, -1, -1, TH_BSHD, LOW, 0),
    DENSE("1x147-causal-tl", 2, 1, 147, 2, 2, 64, 1, TL, -1, -1, TH_BSHD, F32, 0),
    /* head dims */
    DENSE("d8", 1, 97, 97, 2, 2, 8, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d32", 1, 97, 97, 2, 2, 32, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d59", 1, 97, 97, 2, 2, 59, 0, BR, -1, -1, TH_BSHD, LOW | F64, 0),
    DENSE("d80", 1, 97, 97, 2, 2, 80, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d96", 1, 97, 97, 2, 2, 96, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d111", 1, 97, 113, 2, 2, 111, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d128", 1, 97, 97, 2, 2, 128, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d160", 1, 97, 97, 2, 2, 160, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d192", 1, 97, 97, 2, 2, 192, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("d256", 1, 97, 130, 2, 2, 256, 1, BR, -1, -1, TH_BSHD, LOW, 0),
    /* batch and heads, GQA, MQA */
    DENSE("b3h4", 3, 65, 80, 4, 4, 32, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    DENSE("gqa8", 2, 77, 77, 16, 2, 64, 1, BR, -1, -1, TH_BSHD, LOW, DETERM),
    DENSE("mqa", 1, 90, 130, 6, 1, 64, 0, BR, -1, -1, TH_BSHD, LOW, 0),
    /* GQA groups split between CTAs (src/cuda/common/gqa.cu): partial dK/dV summed per kv head, strided outputs */
    DENSE("gqa4-d128-causal-strided", 2, 300, 300, 8, 2, 128, 1, BR, -1, -1, TH_STRIDED, LOW, QUICK | DETERM),
    DENSE("mqa-d256-causal", 1, 200, 260, 4, 1, 256, 1, BR, -1, -1, TH_BHSD, BF16, 0),
    DENSE("gqa3-d96-win", 1, 150, 170, 6, 2, 96, 0, BR, 40, 10, TH_BSHD, F16, DETERM),
    DENSE("gqa4-d60-causal", 2, 150, 150, 8, 2, 60, 1, BR, -1, -1, TH_BSHD, LOW, QUICK), /* sums of 2-byte columns */
    /* windows (causal folds in as R = 0) */
    DENSE("win16-0", 1, 200, 200, 2, 2, 64, 0, BR, 16, 0, TH_BSHD, LOW, 0),
    DENSE("win32-8", 1, 150, 180, 2, 2, 64, 0, BR, 32, 8, TH_BSHD, LOW | F64, 0),
    DENSE("win0-0", 1, 64, 64, 2, 2, 64, 0, BR, 0, 0, TH_BSHD, LOW, 0),
    DENSE("win16-left", 1, 120, 120, 2, 2, 64, 0, BR, 16, -1, TH_BSHD, F16, 0),
    DENSE("win8-right", 1, 120, 100, 2, 2, 64, 0, TL, -1, 8, TH_BSHD, BF16, 0),
    DENSE("win8-causal-150x100", 1, 150, 100, 2, 2, 64, 1, BR, 8, -1, TH_BSHD, F32, 0), /* 50 empty rows */
    /* layouts */
    DENSE("s129-bhsd", 2, 129, 129, 2, 2, 64, 1, BR, -1, -1, TH_BHSD, LOW, 0),
    DENSE("113x203-strided", 2, 113, 203, 4, 2, 64, 0, BR, -1, -1, TH_STRIDED, LOW, 0),
    DENSE("gqa-bhsd-tl", 1, 60, 90, 8, 2, 96, 1, TL, -1, -1, TH_BHSD, F16, 0),
    /* an explicit scale */
    {"scale0.3", 1, 80, 80, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, F32 | BF16, 0, 0.3f, NULL, NULL, 0},
    /* varlen */
    {"varlen", 1, 0, 0, 2, 2, 64, 0, BR, -1, -1, TH_BSHD, LOW | F64, DETERM | LSENULL, 0.0f, vq, vk, 6},
    {"varlen-causal", 1, 0, 0, 4, 2, 64, 1, BR, -1, -1, TH_BSHD, LOW, QUICK, 0.0f, vq, vk, 6},
    {"varlen-causal-tl-strided", 1, 0, 0, 2, 1, 59, 1, TL, -1, -1, TH_STRIDED, LOW, 0, 0.0f, vq2, vk2, 3},
    {"varlen-win-bhsd", 1, 0, 0, 2, 2, 64, 0, BR, 20, 4, TH_BHSD, F16 | F64, 0, 0.0f, vq2, vk2, 3},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- tolerances ------------------------------------------------------------------------------------- */
/* Floors, as a fraction of the reference's largest magnitude.
 *   f16, bf16: a backend's output is stored in the dtype, which alone costs up to u·|x| (u the unit
 *     roundoff), and the baseline may round luckily where the backend's largest error lands; two
 *     roundings' worth, 4u, covers that. The baseline's own error (several u) dominates anyway.
 *   f32: the final rounding is no longer what dominates: a FlashAttention-style kernel evaluates exp2 of a
 *     scaled argument (the product scale·log2 e and x·(scale·log2 e) are each rounded, and a vector exp2 is
 *     good to a couple of ulps), rescales its running sums by exp(m_old − m_new) once per key tile and
 *     divides by l at the end: each step costs up to u·|O| more than the plain computation, and a legitimate
 *     fp32 kernel measures up to ~2.4× the baseline's error. 16u (9.5e-7 relative) absorbs those few extra
 *     roundings and is still 100× under the 1e-4 bar, so any lower internal precision (tf32, bf16, fp16:
 *     1e-3) fails.
 *   lse is fp32 for every dtype, m + log l with the reference's lse itself rounded to fp32: 8u of fp32. */
#define K_FWD 2.0
#define K_BWD 3.0
static double floor_out(flashc_dtype dt) { return (dt == FLASHC_F32 ? 16.0 : 4.0) * th_unit_roundoff(dt); }
#define FLOOR_LSE (8.0 * 0x1p-24)
/* f64 against this harness's fp64 attention: both sum up to a few thousand terms in a different order, so
 * they agree to ~1e-13 of the magnitude; 1e-10 leaves room and still catches anything that is not fp64
 * arithmetic (one fp32 rounding is 6e-8). */
#define FLOOR_F64 1e-10
/* Backward, relative to the largest of the three reference gradients: dS = P∘(dP − D) cancels, so dq and dk
 * carry an error of u·|P||dP|·|k| whatever their own size (a row that sees one key has dq = 0 exactly, yet a
 * FlashAttention backward that takes D = rowsum(dO∘O) from the rounded O leaves ~u there): the scale of
 * the gradients, not of each one, is what the rounding follows. Plus one term for the API's fp32 lse: a
 * backward that uses it (P = exp(scale·S − lse)) scales each row of P by 1 ± u32·|lse|; twice that is the
 * allowance. The oracle recomputes the softmax in fp64 (src/cpu/ref.c), so for f64 neither applies and
 * cpu-ref's f64 backward is held to FLOOR_F64 of each gradient's own magnitude. */
static double floor_bwd(flashc_dtype dt, double lse_abs_max) {
  return floor_out(dt) + 2.0 * 0x1p-24 * fmax(1.0, lse_abs_max);
}

/* ---- one case on every backend ---------------------------------------------------------------------- */
typedef struct runner {
  th_backend *backends;
  int nb;
  th_backend *ref;
  th_rng rng;
  int *pass, *fail, *unsupported; /* per backend */
} runner;

typedef struct problem {
  const tcase *c;
  flashc_dtype dt;
  th_attn a;
  int32_t cu_q[16], cu_k[16];
  char label[96]; /* aligned, for the verdict lines */
  char tag[96];   /* compact, for failure messages */
  th_tensor q, k, v, dout;
  double *qd, *kd, *vd, *dod;
  /* reference and baseline, dense BSHD (lse in the layout of flashc.h) */
  double *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
  double *o_base, *lse_base, *dq_base, *dk_base, *dv_base;
  double lse_abs_max;
  uint8_t *empty; /* per q row: sees no key */
  int64_t nq, nk, nlse;
} problem;

static void *xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size);
  if (!p) abort();
  return p;
}

static bool is_strict(const th_backend *b, flashc_dtype dt) {
  /* cpu-ref must run every case, cpu every case but f64. */
  return strcmp(b->info.name, "cpu-ref") == 0 || (strcmp(b->info.name, "cpu") == 0 && dt != FLASHC_F64);
}

static void setup(problem *p, const tcase *c, flashc_dtype dt, th_rng *rng) {
  memset(p, 0, sizeof *p);
  p->c = c;
  p->dt = dt;
  th_attn *a = &p->a;
  *a = th_attn_dense(c->batch, c->sq, c->sk, c->hq, c->hkv, c->d);
  a->params.causal = c->causal, a->params.align = c->align, a->params.scale = c->scale;
  a->params.window_left = c->wl, a->params.window_right = c->wr;
  if (c->lens_q) th_attn_varlen(a, c->lens_q, c->lens_k, c->num_seqs, p->cu_q, p->cu_k);
  snprintf(p->label, sizeof p->label, "%-26s %-4s %-7s", c->name, flashc_dtype_name(dt), th_layout_name(c->layout));
  snprintf(p->tag, sizeof p->tag, "%s/%s/%s", c->name, flashc_dtype_name(dt), th_layout_name(c->layout));
  p->q = th_tensor_new(dt, c->layout, a->batch, a->seqlen_q, a->heads_q, a->head_dim);
  p->k = th_tensor_new(dt, c->layout, a->batch, a->seqlen_k, a->heads_kv, a->head_dim);
  p->v = th_tensor_new(dt, c->layout, a->batch, a->seqlen_k, a->heads_kv, a->head_dim);
  p->dout = th_tensor_new(dt, c->layout, a->batch, a->seqlen_q, a->heads_q, a->head_dim);
  th_fill_normal(&p->q, rng), th_fill_normal(&p->k, rng), th_fill_normal(&p->v, rng);
  th_fill_normal(&p->dout, rng);
  p->qd = th_dense(&p->q), p->kd = th_dense(&p->k), p->vd = th_dense(&p->v), p->dod = th_dense(&p->dout);
  p->nq = th_numel(&p->q.view), p->nk = th_numel(&p->k.view), p->nlse = th_lse_numel(a);
  p->empty = th_empty_rows(a);
}

static void teardown(problem *p) {
  th_tensor_free(&p->q), th_tensor_free(&p->k), th_tensor_free(&p->v), th_tensor_free(&p->dout);
  double *ds[] = {p->qd,     p->kd,     p->vd,     p->dod,      p->o_ref,   p->lse_ref, p->dq_ref,
                  p->dk_ref, p->dv_ref, p->o_base, p->lse_base, p->dq_base, p->dk_base, p->dv_base};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) free(ds[i]);
  free(p->empty);
}

static double *lse_to_double(const float *lse, int64_t n) {
  double *x = xcalloc((size_t)n, sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = lse[i];
  return x;
}

/* The reference: cpu-ref in f64 on the same values (f64 cases: this harness's fp64 attention). */
static bool reference(problem *p, th_backend *ref) {
  const th_attn *a = &p->a;
  p->o_ref = xcalloc((size_t)p->nq, sizeof(double));
  p->lse_ref = xcalloc((size_t)p->nlse, sizeof(double));
  p->dq_ref = xcalloc((size_t)p->nq, sizeof(double));
  p->dk_ref = xcalloc((size_t)p->nk, sizeof(double));
  p->dv_ref = xcalloc((size_t)p->nk, sizeof(double));
  if (p->dt == FLASHC_F64) {
    th_naive_forward(a, FLASHC_F64, p->qd, p->kd, p->vd, p->o_ref, p->lse_ref);
    th_naive_backward(a, FLASHC_F64, p->qd, p->kd, p->vd, p->dod, p->dq_ref, p->dk_ref, p->dv_ref);
  } else {
    int64_t B = a->batch, Sq = a->seqlen_q, Sk = a->seqlen_k, Hq = a->heads_q, Hk = a->heads_kv, D = a->head_dim;
    th_tensor q = th_tensor_from_dense(FLASHC_F64, p->qd, B, Sq, Hq, D),
              k = th_tensor_from_dense(FLASHC_F64, p->kd, B, Sk, Hk, D);
    th_tensor v = th_tensor_from_dense(FLASHC_F64, p->vd, B, Sk, Hk, D),
              dout = th_tensor_from_dense(FLASHC_F64, p->dod, B, Sq, Hq, D);
    th_tensor o = th_tensor_new(FLASHC_F64, TH_BSHD, B, Sq, Hq, D),
              dq = th_tensor_new(FLASHC_F64, TH_BSHD, B, Sq, Hq, D);
    th_tensor dk = th_tensor_new(FLASHC_F64, TH_BSHD, B, Sk, Hk, D),
              dv = th_tensor_new(FLASHC_F64, TH_BSHD, B, Sk, Hk, D);
    float *lse = xcalloc((size_t)p->nlse, sizeof *lse);
    bool ok = true;
    flashc_status s = th_forward(ref, &a->params, &q, &k, &v, &o, lse, p->nlse);
    if (s != FLASHC_OK) {
      th_fail("%s: reference forward (cpu-ref, f64): %s: %s", p->tag, flashc_status_string(s), flashc_last_error());
      ok = false;
    } else {
      s = th_backward(ref, &a->params, &q, &k, &v, &o, lse, p->nlse, &dout, &dq, &dk, &dv);
      if (s != FLASHC_OK) {
        th_fail("%s: reference backward (cpu-ref, f64): %s: %s", p->tag, flashc_status_string(s), flashc_last_error());
        ok = false;
      }
    }
    if (ok) {
      double *x;
      x = th_dense(&o), memcpy(p->o_ref, x, (size_t)p->nq * sizeof *x), free(x);
      x = th_dense(&dq), memcpy(p->dq_ref, x, (size_t)p->nq * sizeof *x), free(x);
      x = th_dense(&dk), memcpy(p->dk_ref, x, (size_t)p->nk * sizeof *x), free(x);
      x = th_dense(&dv), memcpy(p->dv_ref, x, (size_t)p->nk * sizeof *x), free(x);
      for (int64_t i = 0; i < p->nlse; i++) p->lse_ref[i] = lse[i];
    }
    th_tensor *ts[] = {&q, &k, &v, &dout, &o, &dq, &dk, &dv};
    for (size_t i = 0; i < 8; i++) th_tensor_free(ts[i]);
    free(lse);
    if (!ok) return false;
  }
  for (int64_t i = 0; i < p->nlse; i++)
    if (isfinite(p->lse_ref[i]) && fabs(p->lse_ref[i]) > p->lse_abs_max) p->lse_abs_max = fabs(p->lse_ref[i]);
  return true;
}

/* The plain low-precision computation of the same thing (none for f64: the floor alone applies). */
static void baseline(problem *p) {
  if (p->dt == FLASHC_F64) return;
  p->o_base = xcalloc((size_t)p->nq, sizeof(double));
  p->lse_base = xcalloc((size_t)p->nlse, sizeof(double));
  p->dq_base = xcalloc((size_t)p->nq, sizeof(double));
  p->dk_base = xcalloc((size_t)p->nk, sizeof(double));
  p->dv_base = xcalloc((size_t)p->nk, sizeof(double));
  th_naive_forward(&p->a, p->dt, p->qd, p->kd, p->vd, p->o_base, p->lse_base);
  th_naive_backward(&p->a, p->dt, p->qd, p->kd, p->vd, p->dod, p->dq_base, p->dk_base, p->dv_base);
}

/* Rows that see no key: the output row is exactly 0 (and lse −inf); every other lse is finite. */
static bool check_empty_rows(const problem *p, const char *who, const char *what, const th_tensor *t,
                             const float *lse) {
  const th_attn *a = &p->a;
  int64_t bad = 0;
  for (int64_t s = 0; s < th_num_seqs(a); s++) {
    int64_t b, start, len;
    th_seq_rows(a, s, false, &b, &start, &len);
    for (int64_t h = 0; h < a->heads_q; h++)
      for (int64_t i = 0; i < len; i++) {
        bool empty = p->empty[b * a->seqlen_q + start + i];
        if (lse) {
          float l = lse[th_lse_index(a, s, h, i)];
          bool ok = empty ? (isinf(l) && l < 0) : isfinite(l);
          if (!ok && bad++ < 3)
            th_fail("%s %s: lse[seq %lld, head %lld, row %lld] is %g; expected %s", who, p->tag, (long long)s,
                    (long long)h, (long long)i, (double)l, empty ? "-inf (the row sees no key)" : "a finite value");
        }
        if (!empty || !t) continue;
        for (int64_t d = 0; d < a->head_dim; d++) {
          double x = th_load(t->view.data, t->view.dtype, th_index(&t->view, b, start + i, h, d));
          if (x != 0.0 && bad++ < 3)
            th_fail("%s %s: %s[%lld,%lld,%lld,%lld] = %g in a row that sees no key; expected 0", who, p->tag, what,
                    (long long)b, (long long)(start + i), (long long)h, (long long)d, x);
        }
      }
  }
  return bad == 0;
}

static bool same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* UNSUPPORTED is a report for most backends and a failure for cpu-ref and cpu; other errors fail. Returns
 * true when the call ran. */
static bool call_ran(runner *r, const th_backend *b, const problem *p, const char *pass, flashc_status s) {
  if (s == FLASHC_OK) return true;
  if (s == FLASHC_ERR_UNSUPPORTED && !is_strict(b, p->dt)) {
    printf("skip %-12s %s %s unsupported: %s\n", b->info.name, p->label, pass, flashc_last_error());
    r->unsupported[b - r->backends]++;
    return false;
  }
  th_fail("%-12s %s %s: %s: %s", b->info.name, p->label, pass, flashc_status_string(s), flashc_last_error());
  r->fail[b - r->backends]++;
  return false;
}

static void verdict_line(runner *r, const th_backend *b, const problem *p, const char *pass, bool ok,
                         const char *detail) {
  if (th_check(ok, "%-12s %s %s %s", b->info.name, p->label, pass, detail)) {
    printf("PASS %-12s %s %s %s\n", b->info.name, p->label, pass, detail);
    r->pass[b - r->backends]++;
  } else {
    r->fail[b - r->backends]++;
  }
}

/* Forward into o and lse; true when it ran (then the verdict has been printed). */
static bool run_forward(runner *r, const th_backend *b, problem *p, th_tensor *o, float *lse) {
  const th_attn *a = &p->a;
  const char *who = b->info.name;
  flashc_status s = th_forward(b, &a->params, &p->q, &p->k, &p->v, o, lse, p->nlse);
  if (!call_ran(r, b, p, "fwd", s)) return false;
  char what[160];
  snprintf(what, sizeof what, "%s %s o", who, p->tag);
  bool ok = th_check_output(o, what) == 0;
  ok &= check_empty_rows(p, who, "o", o, lse);
  double *od = th_dense(o), *lsed = lse_to_double(lse, p->nlse);
  bool f64 = p->dt == FLASHC_F64;
  double o_mag = th_abs_max(p->o_ref, p->nq);
  th_verdict vo =
      th_judge(od, p->o_base, p->o_ref, p->nq, f64 ? 0 : K_FWD, (f64 ? FLOOR_F64 : floor_out(p->dt)) * o_mag);
  th_verdict vl = th_judge(lsed, p->lse_base, p->lse_ref, p->nlse, f64 ? 0 : K_FWD, FLOOR_LSE * p->lse_abs_max);
  free(od), free(lsed);
  char line[800], part[2][320];
  th_format_verdict(part[0], sizeof part[0], "o", &vo);
  th_format_verdict(part[1], sizeof part[1], "lse", &vl);
  snprintf(line, sizeof line, "%s | %s", part[0], part[1]);
  verdict_line(r, b, p, "fwd", ok && vo.pass && vl.pass, line);

  if (p->c->flags & LSENULL) { /* lse is optional: the same o without it */
    th_tensor o2 = th_tensor_new(p->dt, p->c->layout, a->batch, a->seqlen_q, a->heads_q, a->head_dim);
    s = th_forward(b, &a->params, &p->q, &p->k, &p->v, &o2, NULL, 0);
    if (call_ran(r, b, p, "fwd lse=NULL", s))
      verdict_line(r, b, p, "fwd", same_bytes(o->alloc, o2.alloc, o->alloc_bytes),
                   "lse=NULL gives the same o, bit for bit");
    th_tensor_free(&o2);
  }
  return true;
}

typedef struct grads {
  th_tensor dq, dk, dv;
} grads;

static grads grads_new(const problem *p) {
  const th_attn *a = &p->a;
  grads g = {th_tensor_new(p->dt, p->c->layout, a->batch, a->seqlen_q, a->heads_q, a->head_dim),
             th_tensor_new(p->dt, p->c->layout, a->batch, a->seqlen_k, a->heads_kv, a->head_dim),
             th_tensor_new(p->dt, p->c->layout, a->batch, a->seqlen_k, a->heads_kv, a->head_dim)};
  return g;
}

static void grads_free(grads *g) { th_tensor_free(&g->dq), th_tensor_free(&g->dk), th_tensor_free(&g->dv); }

/* Backward from this backend's own o and lse, as a user would call it. */
static void run_backward(runner *r, const th_backend *b, problem *p, const th_tensor *o, const float *lse) {
  flashc_params params = p->a.params;
  params.deterministic = (p->c->flags & DETERM) ? 1 : 0;
  grads g = grads_new(p);
  flashc_status s = th_backward(b, &params, &p->q, &p->k, &p->v, o, lse, p->nlse, &p->dout, &g.dq, &g.dk, &g.dv);
  if (!call_ran(r, b, p, "bwd", s)) {
    grads_free(&g);
    return;
  }
  const th_tensor *t[3] = {&g.dq, &g.dk, &g.dv};
  const double *ref[3] = {p->dq_ref, p->dk_ref, p->dv_ref}, *base[3] = {p->dq_base, p->dk_base, p->dv_base};
  const char *names[3] = {"dq", "dk", "dv"};
  int64_t n[3] = {p->nq, p->nk, p->nk};
  bool f64 = p->dt == FLASHC_F64, ok = true;
  double grad_mag =
      fmax(th_abs_max(p->dq_ref, p->nq), fmax(th_abs_max(p->dk_ref, p->nk), th_abs_max(p->dv_ref, p->nk)));
  char line[1100], part[3][320], what[160];
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "%s %s %s", b->info.name, p->tag, names[i]);
    ok &= th_check_output(t[i], what) == 0;
    double *x = th_dense(t[i]);
    double floor_abs = f64 ? FLOOR_F64 * th_abs_max(ref[i], n[i]) : floor_bwd(p->dt, p->lse_abs_max) * grad_mag;
    th_verdict v = th_judge(x, base[i], ref[i], n[i], f64 ? 0 : K_BWD, floor_abs);
    th_format_verdict(part[i], sizeof part[i], names[i], &v);
    ok &= v.pass;
    free(x);
  }
  ok &= check_empty_rows(p, b->info.name, "dq", &g.dq, NULL);
  snprintf(line, sizeof line, "%s | %s | %s", part[0], part[1], part[2]);
  verdict_line(r, b, p, "bwd", ok, line);

  if (params.deterministic) { /* a second call must give the same bits */
    grads g2 = grads_new(p);
    s = th_backward(b, &params, &p->q, &p->k, &p->v, o, lse, p->nlse, &p->dout, &g2.dq, &g2.dk, &g2.dv);
    if (call_ran(r, b, p, "bwd (deterministic, again)", s))
      verdict_line(r, b, p, "bwd",
                   same_bytes(g.dq.alloc, g2.dq.alloc, g.dq.alloc_bytes) &&
                       same_bytes(g.dk.alloc, g2.dk.alloc, g.dk.alloc_bytes) &&
                       same_bytes(g.dv.alloc, g2.dv.alloc, g.dv.alloc_bytes),
                   "deterministic=1: a second call gives bit-identical dq, dk, dv");
    grads_free(&g2);
  }
  grads_free(&g);
}

static void run_backend(runner *r, const th_backend *b, problem *p) {
  const th_attn *a = &p->a;
  th_tensor o = th_tensor_new(p->dt, p->c->layout, a->batch, a->seqlen_q, a->heads_q, a->head_dim);
  float *lse = xcalloc((size_t)p->nlse, sizeof *lse);
  if (run_forward(r, b, p, &o, lse) && b->info.has_backward) run_backward(r, b, p, &o, lse);
  th_tensor_free(&o);
  free(lse);
}

static bool case_selected(const tcase *c) {
  if (th_quick() && !(c->flags & QUICK)) return false;
  const char *list = getenv("FLASHC_TEST_CASES");
  if (!list || !*list) return true;
  char buf[256];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ","))
    if (strstr(c->name, tok)) return true;
  return false;
}

/* ---- races: one medium forward repeated; every repeat must give the same bits ------------------------ */
static void race_test(runner *r, const th_backend *b) {
  bool quick = th_quick();
  int repeats = quick ? 4 : 20;
  flashc_dtype dt = FLASHC_F16;
  if (!(b->info.dtypes & (1u << dt))) dt = FLASHC_F32;
  th_attn a;
  memset(&a, 0, sizeof a);
  a.params = flashc_params_default();
  a.params.causal = 1;
  /* A GPU needs enough blocks in flight to race (b2 h8 s1025: 72 row blocks of 128 and more); a CPU backend
   * is checked on a shape its threads still split several ways. */
  bool gpu = b->info.device == FLASHC_DEVICE_CUDA;
  int64_t len = quick ? 70 : gpu ? 1025 : 257;
  a.batch = gpu ? 2 : 1, a.seqlen_q = len, a.seqlen_k = len, a.heads_q = gpu ? 8 : 4, a.heads_kv = 2;
  a.head_dim = gpu ? 128 : 64;
  if (a.head_dim > b->info.max_head_dim) a.head_dim = 64;
  th_tensor q = th_tensor_new(dt, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, a.head_dim);
  th_tensor k = th_tensor_new(dt, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, a.head_dim);
  th_tensor v = th_tensor_new(dt, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, a.head_dim);
  th_tensor o0 = th_tensor_new(dt, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, a.head_dim);
  th_tensor o = th_tensor_new(dt, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, a.head_dim);
  th_fill_normal(&q, &r->rng), th_fill_normal(&k, &r->rng), th_fill_normal(&v, &r->rng);
  int64_t nlse = th_lse_numel(&a);
  float *lse0 = xcalloc((size_t)nlse, sizeof *lse0), *lse = xcalloc((size_t)nlse, sizeof *lse);
  char label[128];
  snprintf(label, sizeof label, "races: b%lld h%lld/2 s%lld d%lld causal %s, %d repeats", (long long)a.batch,
           (long long)a.heads_q, (long long)a.seqlen_q, (long long)a.head_dim, flashc_dtype_name(dt), repeats);
  flashc_status s = th_forward(b, &a.params, &q, &k, &v, &o0, lse0, nlse);
  if (s == FLASHC_OK) {
    int moved = 0;
    for (int i = 1; i < repeats && s == FLASHC_OK; i++) {
      s = th_forward(b, &a.params, &q, &k, &v, &o, lse, nlse);
      if (s == FLASHC_OK && (!same_bytes(o.alloc, o0.alloc, o.alloc_bytes) || !same_bytes(lse, lse0, (size_t)nlse * 4)))
        moved++;
    }
    if (s != FLASHC_OK) {
      th_fail("%-12s %s: %s: %s", b->info.name, label, flashc_status_string(s), flashc_last_error());
      r->fail[b - r->backends]++;
    } else if (moved) {
      th_fail("%-12s %s: %d of %d repeats differ from the first (a race?)", b->info.name, label, moved, repeats - 1);
      r->fail[b - r->backends]++;
    } else {
      th_check(true, "races");
      printf("PASS %-12s %s: identical\n", b->info.name, label);
      r->pass[b - r->backends]++;
    }
  } else if (s == FLASHC_ERR_UNSUPPORTED && !is_strict(b, dt)) {
    printf("skip %-12s %s unsupported: %s\n", b->info.name, label, flashc_last_error());
    r->unsupported[b - r->backends]++;
  } else {
    th_fail("%-12s %s: %s: %s", b->info.name, label, flashc_status_string(s), flashc_last_error());
    r->fail[b - r->backends]++;
  }
  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o0), th_tensor_free(&o);
  free(lse0), free(lse);
}

/* One case in each of its dtypes: inputs, the oracle, the baseline, then every backend under test. */
static void run_case(runner *r, const tcase *c) {
  if (!case_selected(c)) return;
  double tc = th_now();
  for (int dt = 0; dt <= FLASHC_F64; dt++) {
    if (!(c->dtypes & (1u << dt))) continue;
    problem p;
    setup(&p, c, (flashc_dtype)dt, &r->rng);
    if (reference(&p, r->ref)) {
      baseline(&p);
      for (int i = 0; i < r->nb; i++) run_backend(r, &r->backends[i], &p);
    }
    teardown(&p);
  }
  printf("---- %s: %.2f s\n", c->name, th_now() - tc);
}

/* GQA/MQA group sizes 1 .. GROUP_MAX (query heads per KV head), one case each, deterministic backward checked
 * bit-identical in every one: odd lengths; 1 or 2 KV heads; a head dim, a dtype and a layout in turn; every
 * other one causal, every fourth a window, every fifth varlen (vq2/vk2: three sequences). The GPU backends split a
 * group between CTAs and sum the parts' dK/dV (src/cuda/common/gqa.cu): every way a group divides is here. */
#define GROUP_MAX 32
static tcase group_case(int g, char *name, size_t cap) {
  static const int64_t dims[] = {64, 32, 128, 40};
  static const unsigned dtypes[] = {BF16, F16, F32};
  static const th_layout layouts[] = {TH_BSHD, TH_BHSD, TH_STRIDED};
  const int64_t hkv = g % 3 == 0 ? 2 : 1;
  tcase c = DENSE("", 1 + g % 2, 31 + (7 * g) % 40, 45 + (11 * g) % 50, g * hkv, hkv, dims[g % 4], g % 2, BR, -1, -1,
                  layouts[g % 3], dtypes[g % 3], DETERM);
  if (g % 4 == 2) c.wl = 17, c.wr = 5;
  if (g % 5 == 0) c.lens_q = vq2, c.lens_k = vk2, c.num_seqs = 3, c.batch = 1;
  if (g == 5 || g == 7 || g == 16 || g == 32) c.flags |= QUICK;
  snprintf(name, cap, "group%d%s%s%s", g, c.causal ? "-causal" : "", c.wl >= 0 ? "-win17-5" : "",
           c.lens_q ? "-varlen" : "");
  c.name = name;
  return c;
}

/* A name in FLASHC_TEST_BACKENDS that no compiled backend has (a typo, or a CUDA rung in a CPU build). */
static void warn_unknown_backends(void) {
  const char *list = getenv("FLASHC_TEST_BACKENDS");
  if (!list || !*list) return;
  char buf[512];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *tok = strtok(buf, ", "); tok; tok = strtok(NULL, ", ")) {
    bool known = false;
    for (int i = 0; i < flashc_backend_count(); i++) {
      flashc_backend_info info;
      if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, tok) == 0) known = true;
    }
    if (!known) printf("note: FLASHC_TEST_BACKENDS names %s, which this build of libflashc lacks\n", tok);
  }
}

int main(void) {
  th_begin("test_backends");
  double t0 = th_now();
  runner r;
  memset(&r, 0, sizeof r);
  th_rng_init(&r.rng, th_seed());

  /* The oracle, whether or not cpu-ref is among the backends under test. */
  th_backend ref;
  if (!th_backend_open(&ref, "cpu-ref")) {
    th_fail("the fp64 oracle cpu-ref is missing: nothing can be checked");
    return th_end();
  }

  int count = flashc_backend_count();
  th_backend *backends = xcalloc((size_t)count, sizeof *backends);
  int nb = 0;
  for (int i = 0; i < count; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK) {
      th_fail("flashc_backend_get(%d): %s", i, flashc_last_error());
      continue;
    }
    if (!th_env_list_has("FLASHC_TEST_BACKENDS", info.name)) {
      printf("%s: skipped (not in FLASHC_TEST_BACKENDS)\n", info.name);
      continue;
    }
    if (!info.usable) {
      printf("%s: skipped (%s)\n", info.name, info.why_unusable);
      if (strcmp(info.name, "cpu") == 0 || strcmp(info.name, "cpu-ref") == 0)
        th_fail("%s must be usable everywhere", info.name);
      continue;
    }
    if (th_backend_open(&backends[nb], info.name)) nb++;
  }
  r.backends = backends;
  r.nb = nb;
  r.pass = xcalloc((size_t)count, sizeof(int)), r.fail = xcalloc((size_t)count, sizeof(int));
  r.unsupported = xcalloc((size_t)count, sizeof(int));
  warn_unknown_backends();
  if (nb == 0) printf("note: no backend selected\n");
  r.ref = &ref;

  for (int ci = 0; ci < NCASES; ci++) run_case(&r, &cases[ci]);
  for (int g = 1; g <= GROUP_MAX; g++) {
    char name[64];
    const tcase c = group_case(g, name, sizeof name);
    run_case(&r, &c);
  }
  for (int i = 0; i < nb; i++) race_test(&r, &backends[i]);

  int pass = 0, fail = 0, unsupported = 0;
  for (int i = 0; i < nb; i++) {
    printf("summary %-12s %4d passed, %3d failed, %3d unsupported\n", backends[i].info.name, r.pass[i], r.fail[i],
           r.unsupported[i]);
    pass += r.pass[i], fail += r.fail[i], unsupported += r.unsupported[i];
  }
  printf("test_backends: %d passed, %d failed, %d unsupported (skipped) on %d backends in %.1f s\n", pass, fail,
         unsupported, nb, th_now() - t0);
  free(r.pass), free(r.fail), free(r.unsupported);
  for (int i = 0; i < nb; i++) th_backend_close(&backends[i]);
  th_backend_close(&ref);
  free(backends);
  return th_end();
}
