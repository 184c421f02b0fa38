/*
 * test_features.c — softcap, ALiBi, a head dim of V different from Q/K's, and seqused_q/k (varlen), forward and
 * backward, on the backends that implement them (cpu-ref, cpu), and their refusal everywhere else.
 *
 *   1. cpu-ref (f64) against this file's own fp64 attention (`oracle`, written from flashc.h's definitions, not
 *      from the library's helpers), to 1e-12 of the largest value: the oracle is not checked against itself.
 *   2. cpu (f32, bf16) against cpu-ref in f64 on the same (rounded) inputs: outputs poisoned first, every
 *      element written and finite, nothing written outside the views, odd lengths, seqlen_q ≠ seqlen_k, key
 *      blocks past the tiles' widths, GQA, windows, varlen, both causal alignments, strided layouts.
 *   3. seqused: rows past the used lengths are NaN in q, k, v and dout (so a read of them shows), and their
 *      outputs are exactly o = 0, lse = −inf, dq = dk = dv = 0.
 *   4. Refusals: invalid params (FLASHC_ERR_INVALID_ARGUMENT, outputs untouched), an older caller's struct_size
 *      (the new fields take their defaults), `auto` picking a backend that implements the call, and every
 *      CUDA backend (and ring attention) refusing each feature it lacks with FLASHC_ERR_UNSUPPORTED; on a GPU
 *      through the API, else through the one check they share (skipped parts say "no CUDA device").
 *   5. cuda-hopper (softcap, ALiBi) against the same oracle, bf16 and f16, forward and backward: head dims 64,
 *      128, 256, every kernel its plans pick (persistent with split rounds, the one-tile kernel from 8192 keys,
 *      the deterministic backward), masks, GQA (the group split), varlen, odd lengths, tiny and huge caps,
 *      slopes per head and per sequence in device memory. Skipped without a GPU ("no CUDA device").
 *   6. cuda-mma's seqused against the same oracle, bf16 and f16, forward and backward, with the unused rows NaN as in
 *      3: seqused_q alone, seqused_k alone, both, whole slots, used lengths of 0 (no query, no key), several query
 *      and key blocks, causal (both alignments), a window, GQA (the group split), the deterministic backward, head
 *      dims 32 to 256. Skipped without a GPU ("no CUDA device").
 *   7. cuda-mma's softcap and ALiBi against the same oracle, bf16 and f16, forward and backward: section 5's cases and
 *      the rest of its plans (head dims 32 to 256, rows not 16-byte aligned, the split keys, a negative scale, the
 *      deterministic dQ pass). Skipped without a GPU ("no CUDA device").
 */
#include "harness.h"
#include "internal.h"

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fcase {
  const char *name;
  int64_t batch, sq, sk, hq, hkv, d, dv;
  float scale, softcap;
  int alibi; /* 0 none, 1 one slope per head, 2 per (sequence, head) */
  int causal;
  flashc_causal_align align;
  int64_t wl, wr;
  int num_seqs; /* varlen when > 0: slot lengths lens_q/k, used lengths used_q/k (NULL: whole slots) */
  const int32_t *lens_q, *lens_k, *used_q, *used_k;
  th_layout layout;
  int deterministic;
} fcase;

static const int32_t lq[] = {37, 0, 5, 64, 1}, lk[] = {29, 7, 0, 70, 300};
static const int32_t uq[] = {30, 0, 5, 13, 0}, uk[] = {29, 3, 0, 1, 257};

#define PLAIN .wl = -1, .wr = -1
/* Rows leave the fields after the last one they need at 0 (dense, whole slots, BSHD). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const fcase cases[] = {
    {"softcap", 2, 37, 53, 2, 2, 40, 40, 1.0f, 5.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"softcap-causal", 1, 113, 203, 2, 2, 59, 59, 0.0f, 2.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"softcap-causal-tl", 1, 97, 31, 1, 1, 16, 16, 1.0f, 3.0f, 0, 1, FLASHC_ALIGN_TOP_LEFT, PLAIN},
    {"softcap-window(20,7)", 1, 130, 300, 2, 1, 32, 32, 0.5f, 4.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 20, 7},
    {"softcap-gqa-4:2", 2, 65, 65, 4, 2, 64, 64, 0.0f, 1.5f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"softcap-varlen-causal", 1, 0, 0, 2, 1, 24, 24, 1.0f, 6.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk},
    {"alibi-causal", 2, 129, 129, 3, 3, 32, 32, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"alibi-per-batch-sq<sk", 2, 17, 301, 2, 1, 48, 48, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"alibi-causal-tl-sq>sk", 1, 60, 23, 2, 2, 8, 8, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_TOP_LEFT, PLAIN},
    {"alibi-softcap-gqa-causal", 1, 150, 280, 4, 1, 64, 64, 1.0f, 8.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN,
     .layout = TH_STRIDED},
    {"alibi-varlen", 1, 0, 0, 2, 2, 16, 16, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk},
    {"seqused-varlen", 1, 0, 0, 2, 1, 32, 32, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk, uq, uk},
    {"seqused-causal-softcap-alibi", 1, 0, 0, 2, 2, 24, 40, 1.0f, 3.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq,
     lk, uq, uk},
    {"seqused-k-only-window",   1, 0, 0, 1,  1,  16,   16, 0.0f, 0.0f, 0, 0,
     FLASHC_ALIGN_BOTTOM_RIGHT, 9, 2, 5, lq, lk, NULL, uk},
    {"seqused-q-only", 1, 0, 0, 2, 2, 16, 16, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk, uq},
    {"dv 192/128", 1, 67, 93, 2, 1, 192, 128, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"dv 128/64", 2, 33, 45, 2, 2, 128, 64, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"dv 64/128", 1, 41, 300, 2, 2, 64, 128, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"dv 64/256", 1, 29, 31, 2, 1, 64, 256, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .layout = TH_BHSD},
    {"dv 64/512", 1, 19, 27, 1, 1, 64, 512, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"dv 59/111 all-features", 1, 0, 0, 2, 1, 59, 111, 1.0f, 4.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk,
     uq, uk},
};
#pragma GCC diagnostic pop
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- one problem: its shapes, params and host arrays -------------------------------------------------- */
typedef struct prob {
  th_attn a; /* a.head_dim is q/k's */
  int64_t dv;
  int32_t cu_q[8], cu_k[8];
  float slopes[64];
} prob;

static void prob_init(prob *P, const fcase *c) {
  memset(P, 0, sizeof *P);
  th_attn *a = &P->a;
  *a = th_attn_dense(c->batch, c->sq, c->sk, c->hq, c->hkv, c->d);
  a->params.causal = c->causal, a->params.align = c->align, a->params.scale = c->scale;
  a->params.window_left = c->wl, a->params.window_right = c->wr;
  a->params.softcap = c->softcap, a->params.deterministic = c->deterministic;
  P->dv = c->dv;
  if (c->num_seqs) {
    th_attn_varlen(a, c->lens_q, c->lens_k, c->num_seqs, P->cu_q, P->cu_k);
    a->params.seqused_q = c->used_q, a->params.seqused_k = c->used_k;
  }
  if (c->alibi) {
    /* ALiBi's geometric slopes 2^(−8(h+1)/H), varied per sequence when there is one slope per (sequence, head). */
    const int64_t seqs = th_num_seqs(a);
    for (int64_t s = 0; s < (c->alibi == 2 ? seqs : 1); s++)
      for (int64_t h = 0; h < a->heads_q; h++)
        P->slopes[s * a->heads_q + h] =
            (float)(pow(2.0, -8.0 * (double)(h + 1) / (double)a->heads_q) * (1.0 + 0.5 * s));
    a->params.alibi_slopes = P->slopes;
    a->params.alibi_stride_batch = c->alibi == 2 ? a->heads_q : 0;
  }
}

/* Sequence s's slot (first row, length) and used length on one side, read from flashc.h's definitions. */
static void seq_side(const prob *P, int64_t s, bool keys, int64_t *b, int64_t *start, int64_t *slot, int64_t *used) {
  th_seq_rows(&P->a, s, keys, b, start, slot);
  const int32_t *u = keys ? P->a.params.seqused_k : P->a.params.seqused_q;
  *used = u ? u[s] : *slot;
}

/* ---- the independent oracle: fp64, dense BSHD arrays --------------------------------------------------- */
/* Element c of row (b, r, h) of a dense [B, S, H, D] array. */
#define AT(x, S, H, D, b, r, h, c) (x)[((((b) * (S) + (r)) * (H) + (h)) * (D)) + (c)]

/* o, lse (forward) and, when dout is not NULL, dq, dk, dv, for every row: rows of no key and unused rows give
 * o = 0, lse = −inf and zero gradients. Scores as flashc.h defines them: s = scale·q·k; s ← cap·tanh(s/cap);
 * s ← s − slope·|i + sk − sq − j| with sq, sk the used lengths; then the mask and the softmax. */
static void oracle(const prob *P, const double *q, const double *k, const double *v, const double *dout, double *o,
                   double *lse, double *dq, double *dk, double *dv) {
  const th_attn *a = &P->a;
  const int64_t B = a->batch, Sq = a->seqlen_q, Sk = a->seqlen_k, Hq = a->heads_q, Hk = a->heads_kv, D = a->head_dim,
                DV = P->dv, group = Hq / Hk;
  const double scale = th_scale(a), cap = a->params.softcap;
  memset(o, 0, (size_t)(B * Sq * Hq * DV) * sizeof *o);
  for (int64_t i = 0; i < th_lse_numel(a); i++) lse[i] = -INFINITY;
  if (dout) {
    memset(dq, 0, (size_t)(B * Sq * Hq * D) * sizeof *dq);
    memset(dk, 0, (size_t)(B * Sk * Hk * D) * sizeof *dk);
    memset(dv, 0, (size_t)(B * Sk * Hk * DV) * sizeof *dv);
  }
  double *S = malloc((size_t)(Sk + 1) * sizeof *S), *T = malloc((size_t)(Sk + 1) * sizeof *T);
  if (!S || !T) abort();
  for (int64_t s = 0; s < th_num_seqs(a); s++) {
    int64_t b, q0, qslot, nq, bk, k0, kslot, nk;
    seq_side(P, s, false, &b, &q0, &qslot, &nq);
    seq_side(P, s, true, &bk, &k0, &kslot, &nk);
    for (int64_t h = 0; h < Hq; h++) {
      const int64_t hk = h / group;
      const double slope = a->params.alibi_slopes ? a->params.alibi_slopes[s * a->params.alibi_stride_batch + h] : 0.0;
      for (int64_t i = 0; i < nq; i++) {
        int64_t lo, hi;
        th_key_range(a, nq, nk, i, &lo, &hi);
        if (lo >= hi) continue;
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; j++) {
          double x = 0;
          for (int64_t c = 0; c < D; c++) x += AT(q, Sq, Hq, D, b, q0 + i, h, c) * AT(k, Sk, Hk, D, b, k0 + j, hk, c);
          x *= scale;
          T[j] = cap > 0 ? tanh(x / cap) : 0.0;
          S[j] = (cap > 0 ? cap * T[j] : x) - slope * fabs((double)(i + nk - nq - j));
          if (S[j] > m) m = S[j];
        }
        double l = 0;
        for (int64_t j = lo; j < hi; j++) l += S[j] = exp(S[j] - m); /* S becomes exp(S − m) */
        for (int64_t j = lo; j < hi; j++) S[j] /= l;                 /* then P */
        for (int64_t j = lo; j < hi; j++)
          for (int64_t c = 0; c < DV; c++)
            AT(o, Sq, Hq, DV, b, q0 + i, h, c) += S[j] * AT(v, Sk, Hk, DV, b, k0 + j, hk, c);
        lse[th_lse_index(a, s, h, i)] = m + log(l);
        if (!dout) continue;
        double Dsum = 0;
        for (int64_t c = 0; c < DV; c++)
          Dsum += AT(dout, Sq, Hq, DV, b, q0 + i, h, c) * AT(o, Sq, Hq, DV, b, q0 + i, h, c);
        for (int64_t j = lo; j < hi; j++) {
          double dP = 0;
          for (int64_t c = 0; c < DV; c++) {
            dP += AT(dout, Sq, Hq, DV, b, q0 + i, h, c) * AT(v, Sk, Hk, DV, b, k0 + j, hk, c);
            AT(dv, Sk, Hk, DV, b, k0 + j, hk, c) += S[j] * AT(dout, Sq, Hq, DV, b, q0 + i, h, c);
          }
          const double dS = S[j] * (dP - Dsum) * (cap > 0 ? 1 - T[j] * T[j] : 1.0);
          for (int64_t c = 0; c < D; c++) {
            AT(dq, Sq, Hq, D, b, q0 + i, h, c) += scale * dS * AT(k, Sk, Hk, D, b, k0 + j, hk, c);
            AT(dk, Sk, Hk, D, b, k0 + j, hk, c) += scale * dS * AT(q, Sq, Hq, D, b, q0 + i, h, c);
          }
        }
      }
    }
  }
  free(S), free(T);
}

/* ---- comparing ----------------------------------------------------------------------------------------- */
/* max |x − ref| ≤ tol·max(1, max |ref|), NaN failing; records a failure naming what. */
static bool close_to(const char *what, const double *x, const double *ref, int64_t n, double tol) {
  double err = 0, rmax = 0;
  int64_t worst = 0;
  for (int64_t i = 0; i < n; i++) {
    if (fabs(ref[i]) > rmax) rmax = fabs(ref[i]);
    const double e = ref[i] == x[i] ? 0.0 : fabs(x[i] - ref[i]);
    if (!(e <= err)) err = e, worst = i;
  }
  return th_check(err <= tol * fmax(1.0, rmax),
                  "%s: max|err| %.3g > %.1g x max(1, %.3g) (element %lld: %.17g vs %.17g)", what, err, tol, rmax,
                  (long long)worst, x[worst], ref[worst]);
}

static bool lse_close(const char *what, const float *x, const double *ref, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++) {
    const bool ok = isinf(ref[i]) ? x[i] == ref[i] : fabs((double)x[i] - ref[i]) <= tol * fmax(1.0, fabs(ref[i]));
    if (!th_check(ok, "%s: lse[%lld] is %.9g, expected %.9g", what, (long long)i, (double)x[i], ref[i])) return false;
  }
  return true;
}

/* Rows of the q side (keys 0) or k side past the used lengths: NaN in an input (set = 1, dense copy too), or
 * checked to be exactly 0 in an output. Returns the nonzero count when checking. */
static int64_t unused_rows(const prob *P, th_tensor *t, double *dense, bool keys, bool set) {
  const flashc_tensor *v = &t->view;
  int64_t bad = 0;
  for (int64_t s = 0; s < th_num_seqs(&P->a); s++) {
    int64_t b, start, slot, used;
    seq_side(P, s, keys, &b, &start, &slot, &used);
    for (int64_t r = start + used; r < start + slot; r++)
      for (int64_t h = 0; h < v->size[2]; h++)
        for (int64_t c = 0; c < v->size[3]; c++) {
          const int64_t i = th_index(v, b, r, h, c);
          if (set) {
            th_store(v->data, v->dtype, i, NAN);
            dense[((b * v->size[1] + r) * v->size[2] + h) * v->size[3] + c] = NAN;
          } else {
            bad += th_load(v->data, v->dtype, i) != 0.0;
          }
        }
  }
  return bad;
}

/* ---- one case on one backend and dtype ---------------------------------------------------------------- */
static void run(const th_backend *be, const fcase *c, flashc_dtype dtype, double tol_fwd, double tol_bwd, th_rng *rng) {
  prob P;
  prob_init(&P, c);
  const th_attn *a = &P.a;
  const flashc_params *pa = &a->params;
  const int64_t B = a->batch, Sq = a->seqlen_q, Sk = a->seqlen_k, Hq = a->heads_q, Hk = a->heads_kv, D = a->head_dim,
                DV = P.dv;
  char what[160];
  snprintf(what, sizeof what, "%s on %s (%s, %s)", c->name, be->info.name, flashc_dtype_name(dtype),
           th_layout_name(c->layout));
  th_tensor q = th_tensor_new(dtype, c->layout, B, Sq, Hq, D), k = th_tensor_new(dtype, c->layout, B, Sk, Hk, D),
            v = th_tensor_new(dtype, c->layout, B, Sk, Hk, DV), o = th_tensor_new(dtype, c->layout, B, Sq, Hq, DV),
            dout = th_tensor_new(dtype, c->layout, B, Sq, Hq, DV), dq = th_tensor_new(dtype, c->layout, B, Sq, Hq, D),
            dk = th_tensor_new(dtype, c->layout, B, Sk, Hk, D), dv = th_tensor_new(dtype, c->layout, B, Sk, Hk, DV);
  th_fill_normal(&q, rng), th_fill_normal(&k, rng), th_fill_normal(&v, rng), th_fill_normal(&dout, rng);
  double *xq = th_dense(&q), *xk = th_dense(&k), *xv = th_dense(&v), *xdo = th_dense(&dout);
  if (pa->seqused_q || pa->seqused_k) { /* what lies past the used rows must never be read */
    unused_rows(&P, &q, xq, false, true), unused_rows(&P, &dout, xdo, false, true);
    unused_rows(&P, &k, xk, true, true), unused_rows(&P, &v, xv, true, true);
  }
  const int64_t nlse = th_lse_numel(a), nq = B * Sq * Hq, nk = B * Sk * Hk;
  double *ro = malloc((size_t)(nq * DV) * sizeof(double)), *rlse = malloc((size_t)nlse * sizeof(double)),
         *rdq = malloc((size_t)(nq * D) * sizeof(double)), *rdk = malloc((size_t)(nk * D) * sizeof(double)),
         *rdv = malloc((size_t)(nk * DV) * sizeof(double));
  float *lse = malloc((size_t)(nlse + 1) * sizeof(float));
  if (!ro || !rlse || !rdq || !rdk || !rdv || !lse) abort();
  oracle(&P, xq, xk, xv, xdo, ro, rlse, rdq, rdk, rdv);

  bool ok = true;
  /* A CUDA backend reads the slopes where the tensors live: a device copy (the harness mirrors only tensors). */
  flashc_params dev_params = *pa;
  void *dev_slopes = NULL;
  (void)dev_slopes; /* a build without CUDA never sets it */
  if (be->info.device == FLASHC_DEVICE_CUDA && pa->alibi_slopes) {
#ifdef FLASHC_TEST_CUDA
    if (!th_check(cudaMalloc(&dev_slopes, sizeof P.slopes) == cudaSuccess &&
                      cudaMemcpy(dev_slopes, P.slopes, sizeof P.slopes, cudaMemcpyHostToDevice) == cudaSuccess,
                  "%s: the slopes' device copy failed", what))
      goto done;
    dev_params.alibi_slopes = (const float *)dev_slopes;
#endif
  }
  pa = &dev_params;
  flashc_status st = th_forward(be, pa, &q, &k, &v, &o, lse, nlse);
  if (!th_check(st == FLASHC_OK, "%s: forward: %s: %s", what, flashc_status_string(st), flashc_last_error())) goto done;
  ok &= th_check_output(&o, what) == 0;
  double *xo = th_dense(&o);
  snprintf(what + strlen(what), sizeof what - strlen(what), " o");
  ok &= close_to(what, xo, ro, nq * DV, tol_fwd);
  what[strlen(what) - 2] = '\0';
  ok &= lse_close(what, lse, rlse, nlse, dtype == FLASHC_F64 ? 1e-6 : tol_fwd);
  free(xo);

  st = th_backward(be, pa, &q, &k, &v, &o, lse, nlse, &dout, &dq, &dk, &dv);
  if (!th_check(st == FLASHC_OK, "%s: backward: %s: %s", what, flashc_status_string(st), flashc_last_error()))
    goto done;
  ok &= th_check_output(&dq, what) == 0 && th_check_output(&dk, what) == 0 && th_check_output(&dv, what) == 0;
  const th_tensor *g[3] = {&dq, &dk, &dv};
  const double *rg[3] = {rdq, rdk, rdv};
  const int64_t ng[3] = {nq * D, nk * D, nk * DV};
  const char *gname[3] = {"dq", "dk", "dv"};
  for (int t = 0; t < 3; t++) {
    double *x = th_dense(g[t]);
    char w[200];
    snprintf(w, sizeof w, "%s %s", what, gname[t]);
    ok &= close_to(w, x, rg[t], ng[t], tol_bwd);
    free(x);
  }
  if (pa->seqused_q || pa->seqused_k) {
    const int64_t bad = unused_rows(&P, &o, NULL, false, false) + unused_rows(&P, &dq, NULL, false, false) +
                        unused_rows(&P, &dk, NULL, true, false) + unused_rows(&P, &dv, NULL, true, false);
    ok &= th_check(bad == 0, "%s: %lld elements of rows past seqused are not 0", what, (long long)bad);
  }
  if (ok) printf("PASS %s\n", what);
done:
#ifdef FLASHC_TEST_CUDA
  if (dev_slopes) cudaFree(dev_slopes);
#endif
  free(xq), free(xk), free(xv), free(xdo), free(ro), free(rlse), free(rdq), free(rdk), free(rdv), free(lse);
  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o), th_tensor_free(&dout);
  th_tensor_free(&dq), th_tensor_free(&dk), th_tensor_free(&dv);
}

/* ---- refusals ---------------------------------------------------------------------------------------- */
/* A small f32 problem on `backend`, with params changed by the caller and o of head dim o_dv (v's: dv); returns the
 * status, and checks that a failed call left o poisoned. */
static flashc_status small_call_o(const char *backend, const flashc_params *pa, int64_t d, int64_t dv, int64_t o_dv,
                                  int varlen, char *backend_ran) {
  flashc_handle h;
  flashc_status st = flashc_create(&h, backend);
  if (st != FLASHC_OK) return st;
  const int64_t rows = varlen ? 7 : 5;
  th_tensor q = th_tensor_new(FLASHC_F32, TH_BSHD, 1, rows, 2, d),
            k = th_tensor_new(FLASHC_F32, TH_BSHD, 1, rows, 2, d),
            v = th_tensor_new(FLASHC_F32, TH_BSHD, 1, rows, 2, dv),
            o = th_tensor_new(FLASHC_F32, TH_BSHD, 1, rows, 2, o_dv);
  th_rng rng;
  th_rng_init(&rng, 7);
  th_fill_normal(&q, &rng), th_fill_normal(&k, &rng), th_fill_normal(&v, &rng), th_poison(&o);
  float lse[14];
  st = flashc_forward(h, pa, &q.view, &k.view, &v.view, &o.view, lse);
  if (st != FLASHC_OK) th_check(th_all_poison(&o), "a refused call (%s) wrote its output", flashc_last_error());
  if (backend_ran) snprintf(backend_ran, 32, "%s", flashc_handle_last_backend(h));
  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o);
  flashc_destroy(h);
  return st;
}

static flashc_status small_call(const char *backend, const flashc_params *pa, int64_t d, int64_t dv, int varlen,
                                char *backend_ran) {
  return small_call_o(backend, pa, d, dv, dv, varlen, backend_ran);
}

static void expect(flashc_status got, flashc_status want, const char *needle, const char *what) {
  const char *msg = flashc_last_error();
  if (th_check(got == want, "%s: status %s, expected %s (%s)", what, flashc_status_string(got),
               flashc_status_string(want), msg) &&
      want != FLASHC_OK)
    if (th_check(strstr(msg, needle) != NULL, "%s: message '%s' does not name '%s'", what, msg, needle))
      printf("PASS %s: %s\n", what, msg);
}

static void test_refusals(void) {
  static const int32_t cu[3] = {0, 3, 7}, over[2] = {4, 4}, neg[2] = {-1, 2}, used[2] = {2, 4};
  static const float slopes[4] = {0.5f, 0.25f, 0.1f, 0.05f};
  flashc_params p = flashc_params_default();

  p.softcap = -1.0f;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "params.softcap is -1", "softcap -1");
  p.softcap = NAN;
  expect(small_call("cpu-ref", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "params.softcap", "softcap NaN");
  p.softcap = INFINITY;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "params.softcap", "softcap inf");
  p = flashc_params_default();
  p.seqused_q = used;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "seqused_q is set without cu_seqlens",
         "seqused without varlen");
  p.cu_seqlens_q = cu, p.cu_seqlens_k = cu, p.num_seqs = 2;
  p.seqused_q = over;
  expect(small_call("cpu", &p, 8, 8, 1, NULL), FLASHC_ERR_INVALID_ARGUMENT, "params.seqused_q[0] is 4",
         "seqused past its slot");
  p.seqused_q = NULL, p.seqused_k = neg;
  expect(small_call("cpu", &p, 8, 8, 1, NULL), FLASHC_ERR_INVALID_ARGUMENT, "params.seqused_k[0] is -1",
         "seqused negative");
  p = flashc_params_default();
  p.alibi_slopes = slopes, p.alibi_stride_batch = 1;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "alibi_stride_batch is 1",
         "alibi stride below heads");
  p.alibi_stride_batch = -2;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "alibi_stride_batch is -2",
         "alibi stride negative");
  p.alibi_slopes = (const float *)((const char *)slopes + 2), p.alibi_stride_batch = 0;
  expect(small_call("cpu", &p, 8, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT, "alibi_slopes", "alibi misaligned");
  p = flashc_params_default();
  expect(small_call("cpu", &p, 8, 600, 0, NULL), FLASHC_ERR_UNSUPPORTED, "head_dim_v (v.size[3]) 600 exceeds 512",
         "head_dim_v 600 on cpu");

  /* o must take v's head dim, dq/dk q's: a mismatch names the tensors. */
  expect(small_call_o("cpu", &p, 8, 16, 8, 0, NULL), FLASHC_ERR_INVALID_ARGUMENT,
         "o.size[3] (head_dim) is 8 but v.size[3] is 16", "o with q's head dim");

  /* An older caller (struct_size ending before softcap) gets the defaults: its stray bytes there are ignored. */
  {
    flashc_params old = flashc_params_default(), plain = flashc_params_default();
    old.softcap = 3.0f, old.alibi_slopes = slopes, old.seqused_q = over;
    old.struct_size = offsetof(flashc_params, softcap);
    flashc_handle h;
    flashc_create(&h, "cpu");
    th_tensor q = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 9, 2, 8), o1 = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 9, 2, 8),
              o2 = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 9, 2, 8);
    th_rng rng;
    th_rng_init(&rng, 5);
    th_fill_normal(&q, &rng);
    flashc_status s1 = flashc_forward(h, &old, &q.view, &q.view, &q.view, &o1.view, NULL);
    flashc_status s2 = flashc_forward(h, &plain, &q.view, &q.view, &q.view, &o2.view, NULL);
    if (th_check(s1 == FLASHC_OK && s2 == FLASHC_OK, "older struct_size: %s", flashc_last_error()) &&
        th_check(memcmp(o1.alloc, o2.alloc, o1.alloc_bytes) == 0,
                 "older struct_size: the fields past it were read (o differs from the plain call's)"))
      printf("PASS an older caller's struct_size gives the new fields their defaults\n");
    th_tensor_free(&q), th_tensor_free(&o1), th_tensor_free(&o2);
    flashc_destroy(h);
  }

  /* auto runs a call with host tensors and any feature on a backend that implements it. */
  {
    char ran[32] = "";
    p = flashc_params_default();
    p.softcap = 2.0f, p.alibi_slopes = slopes;
    flashc_status s = small_call("auto", &p, 8, 24, 0, ran);
    if (th_check(s == FLASHC_OK, "auto with softcap, ALiBi and head_dim_v: %s", flashc_last_error()) &&
        th_check(strcmp(ran, "cpu") == 0, "auto ran '%s', expected cpu", ran))
      printf("PASS auto picks cpu for softcap + ALiBi + head dims 8/24\n");
  }

  /* Every backend but cpu-ref and cpu lacks every feature but the softcap and ALiBi of cuda-hopper and cuda-mma
   * (sections 5 and 7), their seqused (cuda-mma: section 6; cuda-hopper: tests/python/test_seqused_hopper.py) and
   * their head dim of V (their pairs of head dims: tests/python/test_head_dim_v_cuda.py, test_head_dim_v_hopper.py),
   * and the one check names it and the backend. */
  fc_problem base;
  memset(&base, 0, sizeof base);
  base.head_dim = base.head_dim_v = 64;
  const char *const feats[4] = {"softcap", "ALiBi", "head dim of V", "seqused"};
  for (int f = 0; f < 4; f++) {
    fc_problem pf = base;
    if (f == 0) pf.softcap = 1.0f;
    if (f == 1) pf.alibi_slopes = slopes;
    if (f == 2) pf.head_dim_v = 128;
    if (f == 3) pf.seqused_k = used;
    for (int i = 0; i < fc_backend_total; i++) {
      const fc_backend *b = fc_backends[i];
      if (!b) continue;
      char who[64], what[96];
      snprintf(who, sizeof who, "backend %s", b->name);
      snprintf(what, sizeof what, "%s on %s", feats[f], b->name);
      const bool has = strcmp(b->name, "cpu") == 0 || strcmp(b->name, "cpu-ref") == 0 ||
                       strcmp(b->name, "cuda-hopper") == 0 || strcmp(b->name, "cuda-mma") == 0;
      expect(fc_check_features("flashc_forward", who, b->features, &pf), has ? FLASHC_OK : FLASHC_ERR_UNSUPPORTED, who,
             what);
    }
    char what[96];
    snprintf(what, sizeof what, "%s on ring attention", feats[f]);
    expect(fc_check_features("flashc_ring_forward", "ring attention", 0u, &pf), FLASHC_ERR_UNSUPPORTED,
           "is not supported on ring attention", what);
  }
}

/* On a GPU, each usable CUDA backend refuses softcap (but cuda-hopper and cuda-mma, which run it: sections 5 and 7), a
 * head dim of V of its own (cuda-mma, cuda-hopper: a pair of head dims they have no kernel for, 64 with 32) and seqused
 * (but cuda-mma and cuda-hopper, which run it: section 6, tests/python/test_seqused_hopper.py) through the public API
 * (ALiBi's slopes would need device memory: its refusal is the shared check above). */
static void test_cuda_refusals(void) {
  static const int32_t cu[2] = {0, 16}, used[1] = {9};
  int tried = 0;
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || info.device != FLASHC_DEVICE_CUDA || !info.usable) continue;
    th_backend be;
    if (!th_backend_open(&be, info.name)) continue;
    tried++;
    for (int f = 0; f < 3; f++) {
      if (f == 0 && (strcmp(info.name, "cuda-hopper") == 0 || strcmp(info.name, "cuda-mma") == 0)) continue;
      const bool pairs = strcmp(info.name, "cuda-mma") == 0 || strcmp(info.name, "cuda-hopper") == 0;
      if (f == 2 && pairs) continue; /* they run seqused */
      const int64_t dv = f != 1 ? 64 : pairs ? 32 : 128;
      flashc_params p = flashc_params_default();
      if (f == 0) p.softcap = 2.0f;
      if (f == 2) p.cu_seqlens_q = cu, p.cu_seqlens_k = cu, p.num_seqs = 1, p.seqused_k = used;
      th_tensor q = th_tensor_new(FLASHC_BF16, TH_BSHD, 1, 16, 2, 64),
                v = th_tensor_new(FLASHC_BF16, TH_BSHD, 1, 16, 2, dv),
                o = th_tensor_new(FLASHC_BF16, TH_BSHD, 1, 16, 2, dv);
      th_rng rng;
      th_rng_init(&rng, 11);
      th_fill_normal(&q, &rng), th_fill_normal(&v, &rng);
      float lse[32];
      char what[96], needle[96];
      snprintf(what, sizeof what, "%s refuses %s", info.name, f == 0 ? "softcap" : f == 1 ? "head_dim_v" : "seqused");
      snprintf(needle, sizeof needle, "not supported on backend %s", info.name);
      expect(th_forward(&be, &p, &q, &q, &v, &o, lse, 32), FLASHC_ERR_UNSUPPORTED, needle, what);
      th_tensor_free(&q), th_tensor_free(&v), th_tensor_free(&o);
    }
    th_backend_close(&be);
  }
  if (!tried) printf("SKIP CUDA backends' refusals through the API: no CUDA device\n");
}

/* ---- cuda-hopper's softcap and ALiBi ---------------------------------------------------------------------------- */
/* Head dims its tiles run (64, 128, 256, and 96 padded to 128) with rows TMA can address (strides multiples of 8
 * elements), and shapes that reach each kernel of its plans: the persistent forward at D = 64 (3 consumers), 128 and
 * 256, its split last rounds (unmasked, dense, more tiles than SMs: 20 heads × 8 query blocks), the one-tile forward
 * (D = 256 with a mask; D = 128 causal from 8192 keys), the backward's D = 64, 128, 256 kernels and the deterministic
 * one, GQA with few CTAs (the group split, common/gqa.cu). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const fcase hopper_cases[] = {
    {"hopper softcap d64", 2, 97, 203, 4, 4, 64, 64, 0.0f, 5.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper softcap-causal d128", 1, 257, 1025, 2, 2, 128, 128, 0.0f, 30.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper softcap tiny cap gqa d128", 1, 130, 300, 4, 1, 128, 128, 1.0f, 0.05f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper softcap huge cap d256", 2, 113, 203, 2, 2, 256, 256, 0.0f, 1e4f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper softcap window(100,7) d256", 1, 300, 300, 2, 2, 256, 256, 0.0f, 8.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 100,
     7},
    {"hopper softcap window(30,-1) d96", 1, 200, 170, 2, 2, 96, 96, 0.0f, 3.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 30,
     -1},
    {"hopper alibi-causal d64", 2, 129, 129, 3, 3, 64, 64, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper alibi per-batch gqa sq<sk d128", 2, 17, 301, 2, 1, 128, 128, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper alibi-causal-tl sq>sk d64", 1, 260, 123, 2, 2, 64, 64, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_TOP_LEFT, PLAIN},
    {"hopper alibi-softcap mqa causal d256 bhsd", 1, 150, 280, 4, 1, 256, 256, 1.0f, 8.0f, 2, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .layout = TH_BHSD},
    {"hopper alibi-softcap varlen causal d64", 1, 0, 0, 2, 1, 64, 64, 1.0f, 6.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, 5, lq, lk},
    {"hopper alibi varlen window(9,2) d128", 1, 0, 0, 2, 2, 128, 128, 0.0f, 0.0f, 1, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 9, 2,
     5, lq, lk},
    {"hopper alibi-softcap varlen d256", 1, 0, 0, 2, 2, 256, 256, 0.0f, 4.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5,
     lq, lk},
    {"hopper alibi-softcap split rounds d128", 1, 1024, 384, 20, 20, 128, 128, 0.0f, 20.0f, 1, 0,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper alibi-softcap one-tile causal 8192 keys d128", 1, 200, 8192, 1, 1, 128, 128, 0.0f, 15.0f, 1, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"hopper alibi-softcap deterministic causal d64", 2, 150, 333, 4, 2, 64, 64, 0.0f, 5.0f, 2, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .deterministic = 1},
    {"hopper softcap deterministic window(64,64) d128", 1, 333, 250, 2, 1, 128, 128, 0.0f, 2.0f, 0, 0,
     FLASHC_ALIGN_BOTTOM_RIGHT, 64, 64, .deterministic = 1},
    {"hopper alibi deterministic varlen d128", 1, 0, 0, 4, 2, 128, 128, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, 5, lq, lk, .deterministic = 1},
    /* softcap alone: its short form in the backward's whole blocks (hopper/bwd_launch.cuh, FC_HPB_FORM_CAP) */
    {"hopper softcap-causal whole blocks d64", 1, 700, 700, 2, 1, 64, 64, 0.0f, 20.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper softcap-causal whole blocks deterministic d128", 1, 600, 640, 2, 2, 128, 128, 0.0f, 10.0f, 0, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .deterministic = 1},
    {"hopper softcap whole blocks d192", 1, 300, 400, 2, 2, 192, 192, 0.0f, 7.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    /* ALiBi's linear form (every visible key left of ALiBi's diagonal): long enough for blocks that need no mask in
     * each backward kernel (D = 64, 128, 256, deterministic) and the forward's tiles */
    {"hopper alibi-causal linear d128", 1, 700, 700, 2, 2, 128, 128, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper alibi-causal linear gqa sq<sk d64", 2, 300, 901, 4, 2, 64, 64, 0.0f, 0.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper alibi-causal-tl linear sq<sk d128", 1, 300, 700, 2, 2, 128, 128, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_TOP_LEFT,
     PLAIN},
    {"hopper alibi-causal linear d192", 1, 400, 400, 2, 1, 192, 192, 0.0f, 0.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"hopper alibi window(200,0) linear d128", 1, 600, 650, 2, 2, 128, 128, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     200, 0},
    {"hopper alibi-causal linear deterministic d128", 1, 600, 600, 2, 2, 128, 128, 0.0f, 0.0f, 2, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .deterministic = 1},
    {"hopper alibi-causal linear deterministic d64", 1, 600, 600, 2, 1, 64, 64, 0.0f, 0.0f, 1, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .deterministic = 1},
};
#pragma GCC diagnostic pop
#define NHOPPER ((int)(sizeof hopper_cases / sizeof hopper_cases[0]))

/* Cases a..b (two lists, so that a backend can run another's cases and its own) in bf16 and f16 on `backend` where
 * it is usable, cpu's bf16 tolerances (fp16's rounding is finer, so they bound it too). The backend must run each call
 * itself: no refusal is accepted. */
static void run_gpu_cases(const char *backend, const char *what, const fcase *a, int na, const fcase *b, int nb,
                          th_rng *rng) {
  bool usable = false;
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, backend) == 0) usable = info.usable;
  }
  th_backend be;
  if (!usable || !th_backend_open(&be, backend)) {
    printf("SKIP %s %s against the oracle: no CUDA device (or not a GPU it runs on)\n", backend, what);
    return;
  }
  for (int i = 0; i < na + nb; i++) {
    const fcase *c = i < na ? &a[i] : &b[i - na];
    run(&be, c, FLASHC_BF16, 2e-2, 4e-2, rng);
    run(&be, c, FLASHC_F16, 2e-2, 4e-2, rng);
  }
  th_backend_close(&be);
}

/* ---- cuda-mma's seqused ------------------------------------------------------------------------------------------ */
/* Slots of several query and key blocks (cuda-mma's forward tiles 128 query rows; its backward 64 or 128 rows by 64 or
 * 128 keys) with used lengths that end inside a block, on a block edge, at 0 and at the slot's end, and a second set:
 * sequence 0 uses no key of its 29 (its used queries see none: o = 0, lse = −inf), sequence 3 half of its keys. */
static const int32_t mq2[] = {300, 130, 0, 17}, mk2[] = {260, 400, 5, 200};
static const int32_t mu_q2[] = {257, 0, 0, 16}, mu_k2[] = {131, 400, 5, 128};
static const int32_t uk0[] = {0, 7, 0, 35, 300};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
/* One case per line or two, as the other tables. */
/* clang-format off */
static const fcase mma_seqused_cases[] = {
    {"mma seqused d64", 1, 0, 0, 2, 2, 64, 64, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk, uq, uk},
    {"mma seqused blocks causal d128", 1, 0, 0, 2, 2, 128, 128, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 4,
     mq2, mk2, mu_q2, mu_k2},
    {"mma seqused blocks gqa 4:1 d64", 1, 0, 0, 4, 1, 64, 64, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 4,
     mq2, mk2, mu_q2, mu_k2},
    {"mma seqused-q only causal-tl d32", 1, 0, 0, 2, 1, 32, 32, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_TOP_LEFT, PLAIN, 4, mq2,
     mk2, mu_q2},
    {"mma seqused-k only window(9,2) d96", 1, 0, 0, 2, 2, 96, 96, 0.5f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 9, 2, 5,
     lq, lk, NULL, uk},
    {"mma seqused-k 0 used causal gqa 2:1 d128", 1, 0, 0, 4, 2, 128, 128, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, 5, lq, lk, uq, uk0},
    {"mma seqused whole slots d64", 1, 0, 0, 2, 2, 64, 64, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq,
     lk, lq, lk},
    {"mma seqused deterministic gqa 4:2 d64", 1, 0, 0, 4, 2, 64, 64, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, 4, mq2, mk2, mu_q2, mu_k2, .deterministic = 1},
    {"mma seqused deterministic d256", 1, 0, 0, 2, 2, 256, 256, 0.0f, 0.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5,
     lq, lk, uq, uk, .deterministic = 1},
    {"mma seqused d256 bhsd", 1, 0, 0, 2, 1, 256, 256, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 4, mq2, mk2,
     mu_q2, mu_k2, .layout = TH_BHSD},
    {"mma seqused d40 strided", 1, 0, 0, 2, 2, 40, 40, 0.0f, 0.0f, 0, 1, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 5, lq, lk,
     uq, uk, .layout = TH_STRIDED},
};
/* clang-format on */
#pragma GCC diagnostic pop
#define NMMA_SEQUSED ((int)(sizeof mma_seqused_cases / sizeof mma_seqused_cases[0]))

/* ---- cuda-mma's softcap and ALiBi -------------------------------------------------------------------------------- */
/* cuda-hopper's cases (section 5: head dims 64, 96, 128, 256, masks, GQA, varlen, the deterministic backward) and
 * these, which reach the rest of cuda-mma's plans: head dims 32, 160, 192 and 40 (padded to 64, rows not 16-byte
 * aligned: the kernels without cp.async), the split keys (a few query rows against thousands of keys, dense and
 * varlen), a negative scale (the kernels negate Q and take |scale|), the deterministic dQ pass at d256, GQA 8:1 (the
 * group split), seqused (the used lengths set ALiBi's distances). */
static const int32_t ml_q[] = {3, 1, 0, 2}, ml_k[] = {2100, 4000, 7, 1};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const fcase mma_mod_cases[] = {
    {"mma softcap d32", 2, 97, 203, 4, 4, 32, 32, 0.0f, 5.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"mma alibi-softcap causal d40 strided", 1, 150, 131, 2, 1, 40, 40, 0.0f, 3.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, .layout = TH_STRIDED},
    {"mma alibi-softcap window(40,3) d160", 1, 200, 260, 2, 2, 160, 160, 0.0f, 6.0f, 1, 0, FLASHC_ALIGN_BOTTOM_RIGHT,
     40, 3},
    {"mma alibi causal-tl sq>sk d192", 1, 230, 150, 2, 1, 192, 192, 0.0f, 0.0f, 2, 1, FLASHC_ALIGN_TOP_LEFT, PLAIN},
    {"mma softcap split keys d128", 1, 1, 4096, 8, 2, 128, 128, 0.0f, 10.0f, 0, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"mma alibi-softcap split keys causal d64", 2, 5, 3000, 4, 1, 64, 64, 0.0f, 7.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"mma alibi split keys varlen d256", 1, 0, 0, 2, 2, 256, 256, 0.0f, 0.0f, 2, 0, FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, 4,
     ml_q, ml_k},
    {"mma alibi-softcap negative scale causal d64", 2, 130, 140, 2, 2, 64, 64, -0.2f, 4.0f, 1, 1,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN},
    {"mma softcap negative scale deterministic d128", 1, 129, 200, 2, 1, 128, 128, -0.1f, 2.0f, 0, 0,
     FLASHC_ALIGN_BOTTOM_RIGHT, PLAIN, .deterministic = 1},
    {"mma alibi-softcap deterministic window(50,50) d256", 1, 200, 190, 2, 2, 256, 256, 0.0f, 9.0f, 2, 0,
     FLASHC_ALIGN_BOTTOM_RIGHT, 50, 50, .deterministic = 1},
    {"mma alibi-softcap gqa 8:1 causal d96", 1, 140, 300, 8, 1, 96, 96, 0.0f, 5.0f, 1, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN},
    {"mma seqused alibi-softcap causal d128", 1, 0, 0, 2, 2, 128, 128, 0.0f, 3.0f, 2, 1, FLASHC_ALIGN_BOTTOM_RIGHT,
     PLAIN, 4, mq2, mk2, mu_q2, mu_k2},
};
#pragma GCC diagnostic pop
#define NMMA_MOD ((int)(sizeof mma_mod_cases / sizeof mma_mod_cases[0]))

int main(void) {
  th_begin("test_features");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  th_backend ref, cpu;
  if (th_backend_open(&ref, "cpu-ref")) {
    for (int i = 0; i < NCASES; i++) run(&ref, &cases[i], FLASHC_F64, 1e-12, 1e-12, &rng);
    th_backend_close(&ref);
  }
  if (th_backend_open(&cpu, "cpu")) {
    for (int i = 0; i < NCASES; i++) run(&cpu, &cases[i], FLASHC_F32, 2e-5, 1e-4, &rng);
    for (int i = 0; i < NCASES; i++) run(&cpu, &cases[i], FLASHC_BF16, 2e-2, 4e-2, &rng);
    th_backend_close(&cpu);
  }
  test_refusals();
  test_cuda_refusals();
  run_gpu_cases("cuda-hopper", "softcap/ALiBi", hopper_cases, NHOPPER, NULL, 0, &rng);
  run_gpu_cases("cuda-mma", "seqused", mma_seqused_cases, NMMA_SEQUSED, NULL, 0, &rng);
  run_gpu_cases("cuda-mma", "softcap/ALiBi", hopper_cases, NHOPPER, mma_mod_cases, NMMA_MOD, &rng);
  return th_end();
}
