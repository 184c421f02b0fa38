/*
 * test_mask.c — attn_mask (an additive bias or a boolean mask, broadcast through strides) and its gradient dbias,
 * forward and backward, on the backends that implement them (cpu-ref, cpu, cuda-mma; cuda-hopper's forward:
 * tests/python/test_mask_hopper.py), and their refusal everywhere else.
 *
 *   1. cpu-ref (f64) against this file's own fp64 attention (`oracle`, written from flashc.h's definitions), to
 *      1e-12 of the largest value: o, lse, dq, dk, dv and dbias, for every broadcast pattern of the mask and of
 *      dbias (a stride of 0 sums the gradient over that dimension).
 *   2. cpu (f32, bf16) against cpu-ref in f64 on the same rounded inputs: outputs and dbias poisoned first, every
 *      element written and finite, nothing written outside dbias's elements; causal, windows, GQA, softcap, odd
 *      lengths, seqlen_q ≠ seqlen_k, key blocks past the tiles' widths.
 *   3. Rows whose keys are all removed (a boolean row of zeros, a bias row of −inf, a padding mask): o = 0,
 *      lse = −inf, zero gradients, never NaN.
 *   4. Refusals (FLASHC_ERR_INVALID_ARGUMENT, outputs untouched): varlen with a mask, dbias with a boolean mask or
 *      without a mask, negative strides, a bad attn_mask_is_bool, dbias overlapping itself or another tensor; an
 *      older caller's struct_size gives the new fields their defaults; every other backend (ring attention and
 *      the KV-cache call too) refuses attn_mask with FLASHC_ERR_UNSUPPORTED.
 *   5. cuda-mma (bf16, f16) against cpu-ref in f64 where a GPU runs it (else SKIP "no CUDA device"): every case
 *      (structured boolean masks too: padding left and right, per sequence and per head, a removed block inside the
 *      rows, a sequence whose keys are all removed), with the mask's views as above (one element at a time), dense
 *      (two keys of a row at once), and deterministic (dbias's sums in a fixed order: the same bits on a second
 *      run); dead rows as in 3.
 */
#include "harness.h"
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

/* Broadcast patterns: which of [batch, heads_q, seqlen_q, seqlen_k] the mask (or dbias) has; the others have
 * stride 0. */
enum { B = 1, H = 2, Q = 4, K = 8, FULL = B | H | Q | K };

typedef struct mcase {
  const char *name;
  int64_t batch, sq, sk, hq, hkv, d;
  int is_bool;
  int mask_dims;  /* the dims the mask has */
  int dbias_dims; /* the dims dbias keeps (float masks); −1: no dbias */
  int causal;
  flashc_causal_align align;
  int64_t wl, wr;
  float softcap;
  int dead_rows; /* 1: some rows have every key removed (bool 0 / bias −inf) */
  int pattern;   /* a boolean mask's values: MASK_RANDOM, or one of the structured patterns below */
} mcase;

/* Structured boolean masks, whose blocks cuda-mma's kernels classify (none, all or some of a block's pairs kept) and
 * whose ranges of kept blocks they walk (src/cuda/common/mask_tiles.cuh); random masks keep some pairs of every
 * block. RIGHT / LEFT: plane p (its sequence and head, in the mask's own dims) keeps its first / last len keys and
 * removes the others (right / left padding), len = sk, sk − 1, sk − 65, 1, 128 (block-aligned) or 0 (every key
 * removed: o = 0, lse = −inf, zero gradients) by p mod 6. HOLE: every row loses keys [128, 256) (whole blocks inside
 * its range), and the rows from sq / 2 the last 37 keys too. */
enum { MASK_RANDOM = 0, MASK_RIGHT, MASK_LEFT, MASK_HOLE };

#define BR FLASHC_ALIGN_BOTTOM_RIGHT
#define TL FLASHC_ALIGN_TOP_LEFT
static const mcase cases[] = {
    {"bias full", 2, 37, 53, 2, 2, 40, 0, FULL, FULL, 0, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bias [1,h,sq,sk] dbias summed over batch", 2, 29, 31, 3, 1, 16, 0, H | Q | K, H | Q | K, 0, BR, -1, -1, 0.0f, 0,
     MASK_RANDOM},
    {"bias [b,1,sq,sk] gqa causal", 2, 41, 41, 4, 2, 32, 0, B | Q | K, B | Q | K, 1, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bias 2-d [sq,sk] dbias 2-d", 2, 19, 300, 2, 2, 24, 0, Q | K, Q | K, 0, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bias [b,1,1,sk] padding, dbias full", 3, 33, 45, 2, 1, 8, 0, B | K, FULL, 0, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bias full, dbias [1,1,1,sk]", 1, 17, 23, 2, 2, 16, 0, FULL, K, 0, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bias softcap causal-tl sq>sk", 1, 60, 23, 2, 2, 32, 0, FULL, FULL, 1, TL, -1, -1, 3.0f, 1, MASK_RANDOM},
    {"bias window(20,7) dead rows", 1, 130, 300, 2, 1, 32, 0, B | H | Q | K, H | K, 0, BR, 20, 7, 0.0f, 1, MASK_RANDOM},
    {"bias, dbias [b,h,sq,1] (0 exactly)", 2, 21, 40, 2, 1, 16, 0, FULL, B | H | Q, 0, BR, -1, -1, 0.0f, 0,
     MASK_RANDOM},
    {"bias no dbias", 2, 65, 270, 2, 2, 64, 0, FULL, -1, 1, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bool full", 2, 37, 53, 2, 2, 40, 1, FULL, -1, 0, BR, -1, -1, 0.0f, 1, MASK_RANDOM},
    {"bool [b,1,1,sk] padding gqa", 3, 50, 61, 4, 1, 32, 1, B | K, -1, 0, BR, -1, -1, 0.0f, 0, MASK_RANDOM},
    {"bool [1,1,sq,sk] causal", 1, 113, 203, 2, 2, 59, 1, Q | K, -1, 1, BR, -1, -1, 0.0f, 1, MASK_RANDOM},
    {"bool prefix-lm softcap sk>256", 1, 97, 520, 2, 2, 16, 1, FULL, -1, 0, BR, -1, -1, 2.0f, 1, MASK_RANDOM},
    /* several of cuda-mma's key and query blocks (64-128 keys, 64-128 queries) */
    {"bias [1,1,sq,sk] causal gqa d128 dead rows", 2, 300, 512, 4, 2, 128, 0, Q | K, Q | K, 1, BR, -1, -1, 0.0f, 1,
     MASK_RANDOM},
    {"bool [b,1,sq,sk] causal-tl d64 dead rows", 2, 257, 384, 2, 1, 64, 1, B | Q | K, -1, 1, TL, -1, -1, 0.0f, 1,
     MASK_RANDOM},
    {"bias [1,h,sq,sk] softcap d96 dbias over batch", 2, 200, 256, 2, 2, 96, 0, H | Q | K, H | Q | K, 0, BR, -1, -1,
     5.0f, 0, MASK_RANDOM},
    /* structured boolean masks: blocks that keep none, all or some pairs, and key ranges left empty */
    {"bool [b,1,1,sk] right padding gqa d64", 6, 70, 300, 4, 2, 64, 1, B | K, -1, 0, BR, -1, -1, 0.0f, 1, MASK_RIGHT},
    {"bool [b,h,1,sk] right padding per head mqa", 2, 64, 200, 4, 1, 32, 1, B | H | K, -1, 0, BR, -1, -1, 0.0f, 1,
     MASK_RIGHT},
    {"bool [b,1,sq,sk] left padding causal sq<sk", 3, 150, 260, 2, 1, 32, 1, B | Q | K, -1, 1, BR, -1, -1, 0.0f, 0,
     MASK_LEFT},
    {"bool [b,1,sq,sk] right padding causal sq>sk", 6, 200, 140, 2, 2, 64, 1, B | Q | K, -1, 1, BR, -1, -1, 0.0f, 1,
     MASK_RIGHT},
    {"bool [b,1,sq,sk] a removed block inside rows", 2, 200, 400, 2, 2, 64, 1, B | Q | K, -1, 0, BR, -1, -1, 0.0f, 0,
     MASK_HOLE},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- the mask and dbias in memory ---------------------------------------------------------------------- */
/* A 4-d [batch, heads_q, sq, sk] view with stride 0 on the dims `dims` lacks, over a padded allocation: every
 * kept dim's stride leaves a gap (so that nothing written outside the elements goes unnoticed) and the key
 * stride is 2 when `gap` (an element between keys). dense: no gaps and the data 8 bytes into the allocation
 * (contiguous rows on even element boundaries: cuda-mma then loads two keys of a row at once). */
typedef struct mview {
  void *data, *alloc;
  int64_t n[4], stride[4], alloc_elems, offset;
  size_t es;
} mview;

static mview mview_new(const int64_t n[4], int dims, size_t es, bool gap, bool dense) {
  mview m = {.es = es, .offset = dense ? (int64_t)(8 / es) : 3};
  int64_t st = gap && !dense ? 2 : 1;
  for (int d = 3; d >= 0; d--) {
    m.n[d] = n[d];
    const bool kept = dims & (1 << d);
    m.stride[d] = kept ? st : 0;
    if (kept) st = st * n[d] + (dense ? 0 : 5); /* a gap of 5 elements after each row of this dim */
  }
  m.alloc_elems = m.offset + st + 8;
  m.alloc = malloc((size_t)m.alloc_elems * es);
  memset(m.alloc, TH_POISON_BYTE, (size_t)m.alloc_elems * es);
  m.data = (char *)m.alloc + m.offset * (int64_t)es;
  return m;
}

static int64_t mview_at(const mview *m, int64_t b, int64_t h, int64_t i, int64_t j) {
  return b * m->stride[0] + h * m->stride[1] + i * m->stride[2] + j * m->stride[3];
}

/* ---- the oracle -------------------------------------------------------------------------------------- */
/* Dense BSHD doubles in; o, lse ([b][h][i]), dq, dk, dv, and the full dS [b][h][i][j] out. bias(b, h, i, j) is the
 * mask's value as flashc.h defines it: a finite or −inf bias, or (boolean) 0 = removed, else attend. */
typedef struct oracle_in {
  const mcase *c;
  const double *q, *k, *v, *dout;
  const double *mask; /* [b][h][i][j] expanded: a bias, or 0/1 for a boolean mask */
  double scale;
} oracle_in;

static bool oracle_visible(const mcase *c, int64_t i, int64_t j) {
  const int64_t diag = i + (c->align == BR ? c->sk - c->sq : 0);
  const int64_t R = c->causal ? 0 : c->wr;
  return (c->wl < 0 || j >= diag - c->wl) && (R < 0 || j <= diag + R);
}

static void oracle(const oracle_in *in, double *o, double *lse, double *dq, double *dk, double *dv, double *dS) {
  const mcase *c = in->c;
  const int64_t d = c->d, group = c->hq / c->hkv;
  double *S = malloc((size_t)c->sk * sizeof *S), *T = malloc((size_t)c->sk * sizeof *T);
  memset(dk, 0, (size_t)(c->batch * c->sk * c->hkv * d) * sizeof *dk);
  memset(dv, 0, (size_t)(c->batch * c->sk * c->hkv * d) * sizeof *dv);
  for (int64_t b = 0; b < c->batch; b++)
    for (int64_t h = 0; h < c->hq; h++)
      for (int64_t i = 0; i < c->sq; i++) {
        const double *qi = in->q + ((b * c->sq + i) * c->hq + h) * d,
                     *doi = in->dout + ((b * c->sq + i) * c->hq + h) * d;
        double *oi = o + ((b * c->sq + i) * c->hq + h) * d, *dqi = dq + ((b * c->sq + i) * c->hq + h) * d;
        double *dSi = dS + ((b * c->hq + h) * c->sq + i) * c->sk;
        const double *mi = in->mask + ((b * c->hq + h) * c->sq + i) * c->sk;
        double m = -INFINITY;
        for (int64_t j = 0; j < c->sk; j++) {
          S[j] = -INFINITY;
          T[j] = 0.0;
          dSi[j] = 0.0;
          if (!oracle_visible(c, i, j) || (c->is_bool && mi[j] == 0.0)) continue;
          const double *kj = in->k + ((b * c->sk + j) * c->hkv + h / group) * d;
          double x = 0.0;
          for (int64_t e = 0; e < d; e++) x += qi[e] * kj[e];
          x *= in->scale;
          if (c->softcap > 0.0f) T[j] = tanh(x / c->softcap), x = c->softcap * T[j];
          if (!c->is_bool) x += mi[j];
          S[j] = x;
          if (x > m) m = x;
        }
        memset(oi, 0, (size_t)d * sizeof *oi);
        memset(dqi, 0, (size_t)d * sizeof *dqi);
        lse[(b * c->hq + h) * c->sq + i] = -INFINITY;
        if (m == -INFINITY) continue; /* every key removed: o = 0, lse = −inf, no gradient */
        double l = 0.0;
        for (int64_t j = 0; j < c->sk; j++) l += S[j] = exp(S[j] - m); /* exp(−inf) = 0 for the removed */
        lse[(b * c->hq + h) * c->sq + i] = m + log(l);
        double D = 0.0;
        for (int64_t j = 0; j < c->sk; j++) {
          S[j] /= l; /* P */
          const double *vj = in->v + ((b * c->sk + j) * c->hkv + h / group) * d;
          double dP = 0.0;
          for (int64_t e = 0; e < d; e++) oi[e] += S[j] * vj[e], dP += doi[e] * vj[e];
          dSi[j] = dP; /* dP for now */
          D += S[j] * dP;
        }
        for (int64_t j = 0; j < c->sk; j++) {
          dSi[j] = S[j] * (dSi[j] - D); /* the bias's gradient */
          const double dx = dSi[j] * (c->softcap > 0.0f ? 1.0 - T[j] * T[j] : 1.0) * in->scale;
          const double *kj = in->k + ((b * c->sk + j) * c->hkv + h / group) * d;
          double *dkj = dk + ((b * c->sk + j) * c->hkv + h / group) * d,
                 *dvj = dv + ((b * c->sk + j) * c->hkv + h / group) * d;
          for (int64_t e = 0; e < d; e++) dqi[e] += dx * kj[e], dkj[e] += dx * qi[e], dvj[e] += S[j] * doi[e];
        }
      }
  free(S);
  free(T);
}

/* The full dS summed into the dims `dims` keeps, as dense [b|1][h|1][i|1][j|1]. */
static double *reduce_dS(const mcase *c, const double *dS, int dims, int64_t *count) {
  const int64_t n[4] = {c->batch, c->hq, c->sq, c->sk};
  int64_t m[4], total = 1;
  for (int d = 0; d < 4; d++) m[d] = dims & (1 << d) ? n[d] : 1, total *= m[d];
  double *out = calloc((size_t)total, sizeof *out);
  for (int64_t b = 0; b < n[0]; b++)
    for (int64_t h = 0; h < n[1]; h++)
      for (int64_t i = 0; i < n[2]; i++)
        for (int64_t j = 0; j < n[3]; j++)
          out[(((m[0] > 1 ? b : 0) * m[1] + (m[1] > 1 ? h : 0)) * m[2] + (m[2] > 1 ? i : 0)) * m[3] +
              (m[3] > 1 ? j : 0)] += dS[((b * n[1] + h) * n[2] + i) * n[3] + j];
  *count = total;
  return out;
}

/* dbias's elements (as reduce_dS orders them) read back from its view; checks the padding is still poison. */
static double *read_dbias(const mview *m, flashc_dtype dt, int dims, const char *what) {
  int64_t k[4];
  for (int d = 0; d < 4; d++) k[d] = dims & (1 << d) ? m->n[d] : 1;
  const int64_t total = k[0] * k[1] * k[2] * k[3];
  double *out = malloc((size_t)total * sizeof *out);
  uint8_t *touched = calloc((size_t)m->alloc_elems, 1);
  int64_t e = 0, bad = 0;
  for (int64_t b = 0; b < k[0]; b++)
    for (int64_t h = 0; h < k[1]; h++)
      for (int64_t i = 0; i < k[2]; i++)
        for (int64_t j = 0; j < k[3]; j++) {
          const int64_t at = mview_at(m, b, h, i, j);
          touched[m->offset + at] = 1;
          out[e] = th_load(m->data, dt, at);
          if (!isfinite(out[e++])) bad++;
        }
  th_check(bad == 0, "%s: %lld dbias elements not written or not finite", what, (long long)bad);
  int64_t outside = 0;
  for (int64_t x = 0; x < m->alloc_elems; x++) {
    if (touched[x]) continue;
    const uint8_t *p = (const uint8_t *)m->alloc + x * (int64_t)m->es;
    for (size_t y = 0; y < m->es; y++) outside += p[y] != TH_POISON_BYTE;
  }
  th_check(outside == 0, "%s: %lld bytes written outside dbias's elements", what, (long long)outside);
  free(touched);
  return out;
}

/* The largest error over the largest reference value, or over `floor` when that is larger (a dbias summed over
 * the keys is 0 in exact arithmetic, softmax being shift-invariant: its error is judged against dS's size). */
static double rel_err_floor(const double *x, const double *ref, int64_t n, double floor) {
  double err = 0.0, top = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(ref[i]) && x[i] == ref[i]) continue;
    const double e = fabs(x[i] - ref[i]);
    if (!(e <= err)) err = e; /* NaN counts as an error */
    if (isfinite(ref[i]) && fabs(ref[i]) > top) top = fabs(ref[i]);
  }
  if (floor > top) top = floor;
  return err / (top > 0.0 ? top : 1.0);
}

static double rel_err(const double *x, const double *ref, int64_t n) { return rel_err_floor(x, ref, n, 0.0); }

/* ---- one case on one backend and dtype ------------------------------------------------------------------- */
typedef struct run_out {
  th_results r;
  double *dbias;
  int64_t dbias_n;
} run_out;

static void run_free(run_out *r) {
  th_results_free(&r->r), free(r->dbias);
  r->dbias = NULL, r->dbias_n = 0;
}

/* Inputs (dense doubles) of one case, drawn once: q, k, v, dout ~ N(0, 1), the mask expanded. */
typedef struct inputs {
  double *q, *k, *v, *dout, *mask; /* mask: [b][h][i][j] of the values its broadcast view holds */
} inputs;

static void inputs_new(inputs *in, const mcase *c, th_rng *r) {
  const int64_t nq = c->batch * c->sq * c->hq * c->d, nk = c->batch * c->sk * c->hkv * c->d;
  th_normal_inputs(r, nq, nk, &in->q, &in->k, &in->v, &in->dout);
  /* The mask's own values, one per element of its view, then expanded: bf16-exact biases in [−3, 3) (some
   * −inf), or booleans with ~30% removed. Dead rows: query rows 1 and 5 (when they exist) lose every key. */
  const int64_t n[4] = {c->batch, c->hq, c->sq, c->sk};
  int64_t m[4];
  for (int d = 0; d < 4; d++) m[d] = c->mask_dims & (1 << d) ? n[d] : 1;
  const int64_t own_n = m[0] * m[1] * m[2] * m[3];
  double *own = malloc((size_t)own_n * sizeof *own);
  for (int64_t x = 0; x < own_n; x++) {
    const double u = th_rng_uniform(r);
    own[x] = c->is_bool ? (u < 0.3 ? 0.0 : 1.0) : (u < 0.05 ? -INFINITY : th_round(FLASHC_BF16, 6.0 * u - 3.0));
  }
  if (c->pattern != MASK_RANDOM)
    for (int64_t x = 0; x < own_n; x++) {
      const int64_t j = x % m[3], i = x / m[3] % m[2], plane = x / (m[3] * m[2]); /* plane: b·m[1] + h */
      const int64_t lens[6] = {c->sk, c->sk - 1, c->sk - 65, 1, 128, 0}, len = lens[plane % 6];
      bool keep = true;
      if (c->pattern == MASK_RIGHT) keep = j < len;
      if (c->pattern == MASK_LEFT) keep = j >= c->sk - len;
      if (c->pattern == MASK_HOLE) keep = !(j >= 128 && j < 256) && !(2 * i >= c->sq && j >= c->sk - 37);
      own[x] = keep ? 1.0 : 0.0;
    }
  if (c->dead_rows && m[2] > 1 && c->pattern == MASK_RANDOM)
    for (int64_t x = 0; x < own_n; x++) {
      const int64_t i = x / m[3] % m[2];
      if (i == 1 || i == 5) own[x] = c->is_bool ? 0.0 : -INFINITY;
    }
  in->mask = malloc((size_t)(n[0] * n[1] * n[2] * n[3]) * sizeof(double));
  for (int64_t b = 0; b < n[0]; b++)
    for (int64_t h = 0; h < n[1]; h++)
      for (int64_t i = 0; i < n[2]; i++)
        for (int64_t j = 0; j < n[3]; j++)
          in->mask[((b * n[1] + h) * n[2] + i) * n[3] + j] =
              own[(((m[0] > 1 ? b : 0) * m[1] + (m[1] > 1 ? h : 0)) * m[2] + (m[2] > 1 ? i : 0)) * m[3] +
                  (m[3] > 1 ? j : 0)];
  free(own);
}

static void inputs_free(inputs *in) { free(in->q), free(in->k), free(in->v), free(in->dout), free(in->mask); }

static flashc_params case_params(const mcase *c) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal, p.align = c->align, p.window_left = c->wl, p.window_right = c->wr, p.softcap = c->softcap;
  return p;
}

/* th_forward_backward on a CUDA backend: the mask and dbias allocations copied to device memory (p's pointers moved
 * there), dbias's copied back into its host allocation after the backward. */
static bool run_on_device(const th_backend *be, flashc_params *p, const mview *mask, mview *dbias, const th_tensor *q,
                          const th_tensor *k, const th_tensor *v, th_tensor *o, float *lse, int64_t nlse,
                          const th_tensor *dout, th_tensor *dq, th_tensor *dk, th_tensor *dv, const char *what,
                          th_results *r) {
#ifdef FLASHC_TEST_CUDA
  char *dmask = NULL, *ddbias = NULL;
  const size_t mask_bytes = (size_t)mask->alloc_elems * mask->es;
  const size_t dbias_bytes = dbias->alloc ? (size_t)dbias->alloc_elems * dbias->es : 0;
  bool ok = th_check(
      cudaMalloc((void **)&dmask, mask_bytes) == cudaSuccess &&
          cudaMemcpy(dmask, mask->alloc, mask_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
          (!dbias_bytes || (cudaMalloc((void **)&ddbias, dbias_bytes) == cudaSuccess &&
                            cudaMemcpy(ddbias, dbias->alloc, dbias_bytes, cudaMemcpyHostToDevice) == cudaSuccess)),
      "%s: the mask's and dbias's device memory", what);
  if (ok) {
    p->attn_mask = dmask + mask->offset * (int64_t)mask->es;
    if (dbias_bytes) p->dbias = ddbias + dbias->offset * (int64_t)dbias->es;
    flashc_status s = th_forward(be, p, q, k, v, o, lse, nlse);
    ok = th_check(s == FLASHC_OK, "%s forward: %s", what, flashc_last_error());
    if (ok) {
      s = th_backward(be, p, q, k, v, o, lse, nlse, dout, dq, dk, dv);
      ok = th_check(s == FLASHC_OK, "%s backward: %s", what, flashc_last_error());
    }
    if (ok && dbias_bytes)
      ok = th_check(cudaMemcpy(dbias->alloc, ddbias, dbias_bytes, cudaMemcpyDeviceToHost) == cudaSuccess,
                    "%s: dbias's copy back", what);
  }
  if (ok) {
    th_check_output(o, what), th_check_output(dq, what), th_check_output(dk, what), th_check_output(dv, what);
    r->o = th_dense(o), r->dq = th_dense(dq), r->dk = th_dense(dk), r->dv = th_dense(dv);
    r->lse = malloc((size_t)nlse * sizeof(double));
    for (int64_t x = 0; x < nlse; x++) r->lse[x] = lse[x];
  }
  cudaFree(dmask), cudaFree(ddbias);
  return ok;
#else
  (void)be, (void)p, (void)mask, (void)dbias, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)nlse, (void)dout;
  (void)dq, (void)dk, (void)dv, (void)r;
  return th_check(false, "%s: a CUDA backend in a build without CUDA", what);
#endif
}

/* Forward and backward of case c on backend `name` in dtype dt, the mask and dbias in views as mview_new makes
 * them (dense or not), deterministic or not. On a CUDA backend the mask and dbias (its whole allocation, poison
 * included) are copied to the device and dbias back. false when a call failed (recorded). */
static bool run_case(const mcase *c, const inputs *in, const char *name, flashc_dtype dt, bool dense, int deterministic,
                     run_out *out) {
  th_backend be;
  if (!th_backend_open(&be, name)) return false;
  th_tensor q = th_tensor_from_dense(dt, in->q, c->batch, c->sq, c->hq, c->d),
            k = th_tensor_from_dense(dt, in->k, c->batch, c->sk, c->hkv, c->d),
            v = th_tensor_from_dense(dt, in->v, c->batch, c->sk, c->hkv, c->d),
            dout = th_tensor_from_dense(dt, in->dout, c->batch, c->sq, c->hq, c->d),
            o = th_tensor_new(dt, TH_BSHD, c->batch, c->sq, c->hq, c->d),
            dq = th_tensor_new(dt, TH_BSHD, c->batch, c->sq, c->hq, c->d),
            dk = th_tensor_new(dt, TH_BSHD, c->batch, c->sk, c->hkv, c->d),
            dv = th_tensor_new(dt, TH_BSHD, c->batch, c->sk, c->hkv, c->d);
  const int64_t n[4] = {c->batch, c->hq, c->sq, c->sk}, nlse = c->batch * c->hq * c->sq;
  mview mask = mview_new(n, c->mask_dims, c->is_bool ? 1 : flashc_dtype_size(dt), c->mask_dims == (B | K), dense);
  for (int64_t b = 0; b < (c->mask_dims & B ? n[0] : 1); b++)
    for (int64_t h = 0; h < (c->mask_dims & H ? n[1] : 1); h++)
      for (int64_t i = 0; i < (c->mask_dims & Q ? n[2] : 1); i++)
        for (int64_t j = 0; j < (c->mask_dims & K ? n[3] : 1); j++) {
          const double x = in->mask[((b * n[1] + h) * n[2] + i) * n[3] + j];
          if (c->is_bool)
            ((uint8_t *)mask.data)[mview_at(&mask, b, h, i, j)] = x != 0.0 ? (uint8_t)(1 + (j % 3) * 100) : 0;
          else
            th_store(mask.data, dt, mview_at(&mask, b, h, i, j), x);
        }
  mview dbias = {0};
  flashc_params p = case_params(c);
  p.deterministic = deterministic;
  p.attn_mask = mask.data;
  p.attn_mask_is_bool = c->is_bool;
  memcpy(p.attn_mask_stride, mask.stride, sizeof p.attn_mask_stride);
  if (c->dbias_dims >= 0) {
    dbias = mview_new(n, c->dbias_dims, flashc_dtype_size(dt), false, dense);
    p.dbias = dbias.data;
    memcpy(p.dbias_stride, dbias.stride, sizeof p.dbias_stride);
  }
  float *lse = malloc((size_t)nlse * sizeof *lse);
  memset(lse, TH_POISON_BYTE, (size_t)nlse * sizeof *lse);
  th_poison(&o), th_poison(&dq), th_poison(&dk), th_poison(&dv);
  char what[200];
  snprintf(what, sizeof what, "%s on %s %s%s%s", c->name, name, flashc_dtype_name(dt), dense ? " dense" : "",
           deterministic ? " deterministic" : "");
  bool ok;
  if (be.info.device == FLASHC_DEVICE_CUDA) {
    ok = run_on_device(&be, &p, &mask, &dbias, &q, &k, &v, &o, lse, nlse, &dout, &dq, &dk, &dv, what, &out->r);
  } else {
    ok = th_forward_backward(&be, &p, &q, &k, &v, &o, lse, nlse, &dout, &dq, &dk, &dv, what, &out->r);
  }
  if (ok) {
    if (c->dbias_dims >= 0) {
      out->dbias = read_dbias(&dbias, dt, c->dbias_dims, what);
      int64_t k4[4], total = 1;
      for (int d = 0; d < 4; d++) k4[d] = c->dbias_dims & (1 << d) ? n[d] : 1, total *= k4[d];
      out->dbias_n = total;
    }
  }
  free(lse), free(mask.alloc), free(dbias.alloc);
  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&dout), th_tensor_free(&o);
  th_tensor_free(&dq), th_tensor_free(&dk), th_tensor_free(&dv);
  th_backend_close(&be);
  return ok;
}

/* Rows whose keys are all removed: exactly o = 0, lse = −inf and dq = 0 (their dS, hence dbias's share, is 0). */
static void check_dead_rows(const mcase *c, const inputs *in, const run_out *r, const char *what) {
  int64_t dead = 0, bad = 0;
  for (int64_t b = 0; b < c->batch; b++)
    for (int64_t h = 0; h < c->hq; h++)
      for (int64_t i = 0; i < c->sq; i++) {
        bool any = false;
        for (int64_t j = 0; j < c->sk && !any; j++) {
          const double m = in->mask[((b * c->hq + h) * c->sq + i) * c->sk + j];
          any = oracle_visible(c, i, j) && (c->is_bool ? m != 0.0 : m != -INFINITY);
        }
        if (any) continue;
        dead++;
        bad += r->r.lse[(b * c->hq + h) * c->sq + i] != -INFINITY;
        for (int64_t e = 0; e < c->d; e++) {
          const int64_t at = ((b * c->sq + i) * c->hq + h) * c->d + e;
          bad += r->r.o[at] != 0.0 || r->r.dq[at] != 0.0;
        }
      }
  if (c->dead_rows) th_check(dead > 0, "%s: the case has no row whose keys are all removed", what);
  th_check(bad == 0, "%s: %lld values of rows with every key removed are not o = 0, lse = -inf, dq = 0", what,
           (long long)bad);
}

/* ---- 5. cuda-mma against cpu-ref --------------------------------------------------------------------------- */
/* Whether cuda-mma runs here: built in, and a GPU it runs on. */
static bool cuda_mma_usable(void) {
  flashc_backend_info info;
  for (int i = 0; i < flashc_backend_count(); i++)
    if (flashc_backend_get(i, &info) == FLASHC_OK && !strcmp(info.name, "cuda-mma")) return info.usable;
  return false;
}

/* Case c on cuda-mma against cpu-ref's results (ref; dbias of nb elements): bf16 with the views' gaps (the mask read
 * one element at a time), f16 dense (two keys at once where seqlen_k is even), bf16 dense and deterministic (dbias's
 * sums in a fixed order, the bits the same on a second run). */
static void test_cuda_mma(const mcase *c, const inputs *in, const run_out *ref, int64_t nb, double dS_top) {
  if (!cuda_mma_usable()) return; /* reported once, in main */
  const int64_t nq = c->batch * c->sq * c->hq * c->d, nk = c->batch * c->sk * c->hkv * c->d,
                nlse = c->batch * c->hq * c->sq;
  const struct {
    flashc_dtype dt;
    bool dense;
    int det;
  } runs[3] = {{FLASHC_BF16, false, 0}, {FLASHC_F16, true, 0}, {FLASHC_BF16, true, 1}};
  for (int x = 0; x < 3; x++) {
    run_out got = {0};
    char what[200];
    snprintf(what, sizeof what, "%s cuda-mma %s%s%s", c->name, flashc_dtype_name(runs[x].dt),
             runs[x].dense ? " dense" : "", runs[x].det ? " deterministic" : "");
    if (!run_case(c, in, "cuda-mma", runs[x].dt, runs[x].dense, runs[x].det, &got)) continue;
    const double e[6] = {
        rel_err(got.r.o, ref->r.o, nq),   rel_err(got.r.lse, ref->r.lse, nlse),
        rel_err(got.r.dq, ref->r.dq, nq), rel_err(got.r.dk, ref->r.dk, nk),
        rel_err(got.r.dv, ref->r.dv, nk), got.dbias ? rel_err_floor(got.dbias, ref->dbias, nb, dS_top) : 0.0};
    bool ok = true;
    for (int y = 0; y < 6; y++) ok &= e[y] < (y == 1 ? 1e-4 : 2e-2); /* lse: fp32 sums of 16-bit inputs */
    if (th_check(ok, "%s against cpu-ref: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e dbias %.1e", what, e[0], e[1], e[2],
                 e[3], e[4], e[5]))
      printf("PASS %s = cpu-ref (max rel err o %.1e dq %.1e dk %.1e dbias %.1e)\n", what, e[0], e[2], e[3], e[5]);
    check_dead_rows(c, in, &got, what);
    if (runs[x].det && got.dbias) { /* deterministic: the same dbias bits again */
      run_out again = {0};
      if (run_case(c, in, "cuda-mma", runs[x].dt, true, 1, &again) &&
          th_check(memcmp(again.dbias, got.dbias, (size_t)nb * sizeof(double)) == 0 &&
                       memcmp(again.r.dq, got.r.dq, (size_t)nq * sizeof(double)) == 0,
                   "%s: dbias or dq differs on a second run", what))
        printf("PASS %s: dbias and dq bit-identical on a second run\n", what);
      run_free(&again);
    }
    run_free(&got);
  }
}

static void test_case(const mcase *c, th_rng *rng) {
  inputs in;
  inputs_new(&in, c, rng);
  const int64_t nq = c->batch * c->sq * c->hq * c->d, nk = c->batch * c->sk * c->hkv * c->d,
                nlse = c->batch * c->hq * c->sq, nS = nlse * c->sk;
  double *o = malloc((size_t)nq * sizeof(double)), *dq = malloc((size_t)nq * sizeof(double)),
         *dk = malloc((size_t)nk * sizeof(double)), *dv = malloc((size_t)nk * sizeof(double)),
         *lse = malloc((size_t)nlse * sizeof(double)), *dS = malloc((size_t)nS * sizeof(double));
  const oracle_in oi = {
      c, in.q, in.k, in.v, in.dout, in.mask, (float)(1.0 / sqrt((double)c->d))}; /* flashc's scale is a float */
  oracle(&oi, o, lse, dq, dk, dv, dS);
  int64_t nb = 0;
  double *dbias = c->dbias_dims >= 0 ? reduce_dS(c, dS, c->dbias_dims, &nb) : NULL;
  const double dS_top = th_abs_max(dS, nS);

  /* 1. cpu-ref in f64 against the oracle. */
  run_out ref = {0};
  char what[160];
  snprintf(what, sizeof what, "%s cpu-ref f64", c->name);
  if (run_case(c, &in, "cpu-ref", FLASHC_F64, false, 0, &ref)) {
    const double e[6] = {rel_err(ref.r.o, o, nq),   rel_err(ref.r.lse, lse, nlse),
                         rel_err(ref.r.dq, dq, nq), rel_err(ref.r.dk, dk, nk),
                         rel_err(ref.r.dv, dv, nk), dbias ? rel_err_floor(ref.dbias, dbias, nb, dS_top) : 0.0};
    /* lse is stored as fp32: 1e-7 of it */
    if (th_check(e[0] < 1e-12 && e[1] < 1e-7 && e[2] < 1e-12 && e[3] < 1e-12 && e[4] < 1e-12 && e[5] < 1e-12,
                 "%s against the oracle: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e dbias %.1e", what, e[0], e[1], e[2],
                 e[3], e[4], e[5]))
      printf("PASS %s = oracle (dbias %s)\n", what, dbias ? "checked" : "none");
    check_dead_rows(c, &in, &ref, what);
  }
  /* 2. cpu in f32 and bf16 against cpu-ref in f64 (the inputs are bf16-exact, so both see the same values). */
  const flashc_dtype dts[2] = {FLASHC_F32, FLASHC_BF16};
  for (int t = 0; t < 2 && ref.r.o; t++) {
    run_out got = {0};
    snprintf(what, sizeof what, "%s cpu %s", c->name, flashc_dtype_name(dts[t]));
    if (!run_case(c, &in, "cpu", dts[t], false, 0, &got)) continue;
    const double tol = dts[t] == FLASHC_F32 ? 2e-5 : 2e-2;
    const double e[6] = {
        rel_err(got.r.o, ref.r.o, nq),   rel_err(got.r.lse, ref.r.lse, nlse),
        rel_err(got.r.dq, ref.r.dq, nq), rel_err(got.r.dk, ref.r.dk, nk),
        rel_err(got.r.dv, ref.r.dv, nk), dbias ? rel_err_floor(got.dbias, ref.dbias, nb, dS_top) : 0.0};
    bool ok = true;
    for (int x = 0; x < 6; x++) ok &= e[x] < (x == 1 ? 1e-5 : tol);
    if (th_check(ok, "%s against cpu-ref: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e dbias %.1e (tol %.0e)", what, e[0],
                 e[1], e[2], e[3], e[4], e[5], tol))
      printf("PASS %s = cpu-ref (max rel err o %.1e dq %.1e dbias %.1e)\n", what, e[0], e[2], e[5]);
    check_dead_rows(c, &in, &got, what);
    run_free(&got);
  }
  /* 5. cuda-mma in bf16 and f16 against cpu-ref in f64, where a GPU runs it. */
  if (ref.r.o) test_cuda_mma(c, &in, &ref, nb, dS_top);
  run_free(&ref);
  free(o), free(dq), free(dk), free(dv), free(lse), free(dS), free(dbias);
  inputs_free(&in);
}

/* ---- 4. refusals ------------------------------------------------------------------------------------------ */
static void test_refusals(void) {
  th_backend be;
  if (!th_backend_open(&be, "cpu")) return;
  const int64_t b = 2, sq = 5, sk = 6, h = 2, d = 8;
  th_tensor q = th_tensor_new(FLASHC_F32, TH_BSHD, b, sq, h, d), k = th_tensor_new(FLASHC_F32, TH_BSHD, b, sk, h, d),
            v = th_tensor_new(FLASHC_F32, TH_BSHD, b, sk, h, d), o = th_tensor_new(FLASHC_F32, TH_BSHD, b, sq, h, d),
            dq = th_tensor_new(FLASHC_F32, TH_BSHD, b, sq, h, d), dk = th_tensor_new(FLASHC_F32, TH_BSHD, b, sk, h, d),
            dv = th_tensor_new(FLASHC_F32, TH_BSHD, b, sk, h, d);
  th_rng r;
  th_rng_init(&r, 7);
  th_fill_normal(&q, &r), th_fill_normal(&k, &r), th_fill_normal(&v, &r), th_fill_normal(&o, &r);
  float bias[2 * 2 * 5 * 6], dbias[2 * 2 * 5 * 6], lse[2 * 2 * 5];
  for (int x = 0; x < 2 * 2 * 5 * 6; x++) bias[x] = (float)(x % 7) * 0.25f;
  for (int x = 0; x < 20; x++) lse[x] = 1.0f;
  const flashc_params base = flashc_params_default();
  const int64_t full[4] = {h * sq * sk, sq * sk, sk, 1};

  struct {
    const char *what, *needle;
    int backward;
    flashc_params p;
  } bad[10];
  int nb = 0;
#define BAD(w, n, bw)                                                                                                  \
  bad[nb].what = (w), bad[nb].needle = (n), bad[nb].backward = (bw), bad[nb].p = base;                                 \
  bad[nb].p.attn_mask = bias;                                                                                          \
  memcpy(bad[nb].p.attn_mask_stride, full, sizeof full);                                                               \
  flashc_params *P = &bad[nb++].p
  {
    BAD("attn_mask_is_bool 2", "attn_mask_is_bool is 2", 0);
    P->attn_mask_is_bool = 2;
  }
  {
    BAD("a negative stride", "attn_mask_stride[2] (seqlen_q) is -6", 0);
    P->attn_mask_stride[2] = -6;
  }
  {
    BAD("dbias with a boolean mask", "only a float bias has a gradient", 1);
    P->attn_mask_is_bool = 1;
    P->dbias = dbias;
    memcpy(P->dbias_stride, full, sizeof full);
  }
  {
    BAD("dbias without a mask", "dbias is set but params.attn_mask is NULL", 1);
    P->attn_mask = NULL;
    P->dbias = dbias;
  }
  {
    BAD("dbias overlapping itself", "dbias overlaps itself", 1);
    P->dbias = dbias;
    memcpy(P->dbias_stride, full, sizeof full);
    P->dbias_stride[2] = 3; /* rows of 6 keys 3 apart */
  }
  {
    BAD("dbias on dq's memory", "dbias shares memory with dq", 1);
    P->dbias = dq.view.data;
  }
  {
    BAD("dbias on the mask's memory", "dbias shares memory with params.attn_mask", 1);
    P->dbias = bias;
    memcpy(P->dbias_stride, full, sizeof full);
  }
  {
    BAD("a misaligned bias", "is not aligned", 0);
    P->attn_mask = (const char *)bias + 2;
  }
#undef BAD
  for (int x = 0; x < nb; x++) {
    th_poison(&o), th_poison(&dq), th_poison(&dk), th_poison(&dv);
    memcpy(dbias, bias, sizeof dbias);
    const flashc_status s = bad[x].backward
                                ? flashc_backward(be.handle, &bad[x].p, &q.view, &k.view, &v.view, &q.view, lse,
                                                  &q.view, &dq.view, &dk.view, &dv.view)
                                : flashc_forward(be.handle, &bad[x].p, &q.view, &k.view, &v.view, &o.view, lse);
    const bool untouched = bad[x].backward ? th_all_poison(&dq) && th_all_poison(&dk) && th_all_poison(&dv) &&
                                                 memcmp(dbias, bias, sizeof dbias) == 0
                                           : th_all_poison(&o);
    if (th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), bad[x].needle) && untouched,
                 "%s: status %d, message \"%s\" (wanted \"%s\"), outputs %s", bad[x].what, (int)s, flashc_last_error(),
                 bad[x].needle, untouched ? "untouched" : "WRITTEN"))
      printf("PASS refused: %s\n", bad[x].what);
  }

  /* Varlen with a mask. */
  {
    const int32_t cu_q[3] = {0, 4, 10}, cu_k[3] = {0, 5, 12};
    th_tensor vq = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 10, h, d),
              vk = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 12, h, d),
              vo = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 10, h, d);
    th_fill_normal(&vq, &r), th_fill_normal(&vk, &r), th_poison(&vo);
    flashc_params p = base;
    p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k, p.num_seqs = 2, p.attn_mask = bias;
    const flashc_status s = flashc_forward(be.handle, &p, &vq.view, &vk.view, &vk.view, &vo.view, NULL);
    if (th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "varlen") && th_all_poison(&vo),
                 "varlen with attn_mask: status %d, \"%s\"", (int)s, flashc_last_error()))
      printf("PASS refused: varlen with attn_mask\n");
    th_tensor_free(&vq), th_tensor_free(&vk), th_tensor_free(&vo);
  }

  /* An older caller (struct_size ending before attn_mask) gets no mask: stray bytes there are ignored. */
  {
    flashc_params old = base, plain = base;
    memset((char *)&old + offsetof(flashc_params, attn_mask), 0x5A,
           sizeof old - offsetof(flashc_params, attn_mask)); /* garbage where the newer fields are */
    old.struct_size = offsetof(flashc_params, attn_mask);
    th_tensor o2 = th_tensor_new(FLASHC_F32, TH_BSHD, b, sq, h, d);
    const flashc_status s1 = flashc_forward(be.handle, &old, &q.view, &k.view, &v.view, &o.view, NULL);
    const flashc_status s2 = flashc_forward(be.handle, &plain, &q.view, &k.view, &v.view, &o2.view, NULL);
    double *x = th_dense(&o), *y = th_dense(&o2);
    if (th_check(s1 == FLASHC_OK && s2 == FLASHC_OK, "older struct_size: %s", flashc_last_error()) &&
        th_check(memcmp(x, y, (size_t)th_numel(&o.view) * sizeof *x) == 0,
                 "older struct_size: the fields past it were read (o differs from the plain call's)"))
      printf("PASS an older caller's struct_size gives attn_mask and dbias their defaults\n");
    free(x), free(y);
    th_tensor_free(&o2);
  }

  /* The forward ignores dbias (one params serves both calls), even a bad one. */
  {
    flashc_params p = base;
    p.attn_mask = bias;
    memcpy(p.attn_mask_stride, full, sizeof full);
    p.dbias = q.view.data;
    const flashc_status s = flashc_forward(be.handle, &p, &q.view, &k.view, &v.view, &o.view, lse);
    if (th_check(s == FLASHC_OK, "forward with params.dbias set: %s", flashc_last_error()))
      printf("PASS the forward ignores params.dbias\n");
  }

  /* Every backend without the feature refuses it, through the one check they share (fc_check_features); on a GPU
   * the CUDA ones through the API as well. */
  {
    fc_problem pr;
    memset(&pr, 0, sizeof pr);
    pr.attn_mask = bias;
    pr.head_dim = pr.head_dim_v = d;
    int refused = 0, others = 0;
    for (int i = 0; i < fc_backend_total; i++) {
      const fc_backend *bk = fc_backends[i];
      if (!bk) continue;
      const bool has = (bk->features & FC_FEATURE_ATTN_MASK) != 0;
      th_check(has == (!strcmp(bk->name, "cpu") || !strcmp(bk->name, "cpu-ref") || !strcmp(bk->name, "cuda-mma") ||
                       !strcmp(bk->name, "cuda-hopper")),
               "backend %s: attn_mask feature %d", bk->name, (int)has);
      if (has) continue;
      others++;
      const flashc_status s = fc_check_features("flashc_forward", bk->name, bk->features, &pr);
      refused += th_check(s == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "attn_mask"),
                          "backend %s does not refuse attn_mask: %s", bk->name, flashc_last_error());
      flashc_backend_info info;
      for (int j = 0; j < flashc_backend_count(); j++)
        if (flashc_backend_get(j, &info) == FLASHC_OK && !strcmp(info.name, bk->name) && !info.usable)
          printf("SKIP %s through the API: no CUDA device (%s)\n", bk->name, info.why_unusable);
    }
    const flashc_status s = fc_check_features("flashc_ring_forward", "ring attention", 0u, &pr);
    if (others == 0) printf("SKIP the CUDA backends: no CUDA device (none built in)\n");
    if (th_check(s == FLASHC_ERR_UNSUPPORTED, "ring attention does not refuse attn_mask") && refused == others)
      printf("PASS %d other backends and ring attention refuse attn_mask\n", others);
  }

  /* flashc_forward_kvcache refuses attn_mask (not yet). */
  {
    flashc_kvcache cache = flashc_kvcache_default();
    cache.k_cache = k.view, cache.v_cache = v.view;
    flashc_params p = base;
    p.attn_mask = bias;
    const flashc_status s = flashc_forward_kvcache(be.handle, &q.view, &cache, &o.view, NULL, &p);
    if (th_check(s == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "attn_mask"),
                 "kvcache with attn_mask: status %d, \"%s\"", (int)s, flashc_last_error()))
      printf("PASS flashc_forward_kvcache refuses attn_mask\n");
  }

  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o), th_tensor_free(&dq);
  th_tensor_free(&dk), th_tensor_free(&dv);
  th_backend_close(&be);
}

int main(void) {
  th_begin("test_mask");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  for (int c = 0; c < NCASES; c++)
    if (!th_quick() || c % 4 == 0) test_case(&cases[c], &rng);
  if (!cuda_mma_usable()) printf("SKIP cuda-mma against cpu-ref: no CUDA device (or not a GPU it runs on)\n");
  test_refusals();
  return th_end();
}
