/*
 * test_gradcheck.c — cpu-ref's backward against central finite differences of its own forward, in fp64.
 *
 * With the loss L = Σ dout∘o, dL/dx for every element x of q, k and v is
 *   (L(x + h) − L(x − h)) / 2h,
 * whose truncation error is h²/6·L''' and whose rounding error is about u64·|L|/h; h = 1e-5·max(1, |x|)
 * keeps both near 1e-10 of the gradient's magnitude (the largest seen over many seeds: 8e-10). cpu-ref
 * recomputes the softmax in fp64 rather than trusting the fp32 lse it is handed, so its gradients must agree
 * to 1e-8 of the largest gradient of each tensor: ten times the method's error, and tight enough that a
 * single fp32 intermediate (6e-8) or the fp32 lse (u32·|lse|, about 1e-7) fails, as it must in the oracle.
 * Tiny shapes keep it fast: full, causal (both alignments, and rows that see no key), a window, GQA 2:1,
 * varlen, seqlen_q ≠ seqlen_k; softcap (through its tanh), ALiBi, both, and a head dim of V of its own.
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gcase {
  const char *name;
  int64_t batch, sq, sk, hq, hkv, d;
  int causal;
  flashc_causal_align align;
  int64_t wl, wr;
  const int32_t *lens_q, *lens_k;
  int num_seqs;
  int64_t dv;    /* V's head dim; 0: d */
  float softcap; /* 0: off */
  int alibi;     /* 1: slopes per head (stride 0), 2: per (sequence, head) */
} gcase;

static const int32_t lq[] = {3, 0, 2, 4, 1}, lk[] = {2, 3, 0, 4, 5};

static const gcase cases[] = {
    {"full", 2, 5, 6, 2, 2, 4, 0, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f, 0},
    {"causal", 1, 6, 6, 2, 2, 4, 1, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f, 0},
    {"causal-7x4 (rows without keys)", 1, 7, 4, 1, 1, 3, 1, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f,
     0},
    {"causal-tl-3x7", 1, 3, 7, 2, 1, 4, 1, FLASHC_ALIGN_TOP_LEFT, -1, -1, NULL, NULL, 0, 0, 0.0f, 0},
    {"window(2,1)", 1, 7, 7, 1, 1, 3, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 2, 1, NULL, NULL, 0, 0, 0.0f, 0},
    {"gqa-2:1", 1, 4, 5, 4, 2, 4, 0, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f, 0},
    {"sq7-sk3", 2, 7, 3, 1, 1, 5, 0, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f, 0},
    {"varlen-causal", 1, 0, 0, 2, 1, 4, 1, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, lq, lk, 5, 0, 0.0f, 0},
    /* scale·q·k reaches a few units with these shapes: caps of 0.7 and 2 bend the scores well into tanh */
    {"softcap-0.7", 2, 5, 6, 2, 1, 4, 0, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.7f, 0},
    {"softcap-2-causal", 1, 6, 5, 2, 2, 4, 1, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 2.0f, 0},
    {"alibi-causal", 1, 6, 7, 2, 2, 4, 1, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, NULL, NULL, 0, 0, 0.0f, 1},
    {"alibi-per-seq-varlen", 1, 0, 0, 2, 1, 3, 0, FLASHC_ALIGN_BOTTOM_RIGHT, -1, -1, lq, lk, 5, 0, 0.0f, 2},
    {"softcap-alibi-gqa-window", 1, 7, 6, 4, 2, 3, 0, FLASHC_ALIGN_BOTTOM_RIGHT, 2, 1, NULL, NULL, 0, 0, 1.5f, 1},
    {"dv-6/d-3-softcap", 2, 4, 5, 2, 1, 3, 1, FLASHC_ALIGN_TOP_LEFT, -1, -1, NULL, NULL, 0, 6, 1.0f, 0},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* L = Σ dout∘o after a forward on cpu-ref; NAN if the call failed. */
static double loss(const th_backend *ref, const th_attn *a, th_tensor *q, th_tensor *k, th_tensor *v, th_tensor *o,
                   const double *dout) {
  if (th_forward(ref, &a->params, q, k, v, o, NULL, 0) != FLASHC_OK) return NAN;
  const double *x = o->view.data; /* f64 BSHD: the view is the dense array */
  double sum = 0;
  for (int64_t i = 0; i < th_numel(&o->view); i++) sum += dout[i] * x[i];
  return sum;
}

static void run_case(const th_backend *ref, const gcase *c, th_rng *rng) {
  th_attn a;
  memset(&a, 0, sizeof a);
  int32_t cu_q[8] = {0}, cu_k[8] = {0};
  float slopes[64];
  const int64_t dv = c->dv ? c->dv : c->d;
  a.params = flashc_params_default();
  a.params.softcap = c->softcap;
  a.params.causal = c->causal;
  a.params.align = c->align;
  a.params.window_left = c->wl;
  a.params.window_right = c->wr;
  a.batch = c->batch, a.seqlen_q = c->sq, a.seqlen_k = c->sk, a.heads_q = c->hq, a.heads_kv = c->hkv, a.head_dim = c->d;
  if (c->lens_q) {
    for (int s = 0; s < c->num_seqs; s++) cu_q[s + 1] = cu_q[s] + c->lens_q[s], cu_k[s + 1] = cu_k[s] + c->lens_k[s];
    a.params.cu_seqlens_q = cu_q, a.params.cu_seqlens_k = cu_k, a.params.num_seqs = c->num_seqs;
    a.batch = 1, a.seqlen_q = cu_q[c->num_seqs], a.seqlen_k = cu_k[c->num_seqs];
  }
  if (c->alibi) { /* slopes of a few tenths: biases as large as the scores */
    for (int i = 0; i < 64; i++) slopes[i] = 0.1f + 0.05f * (float)i;
    a.params.alibi_slopes = slopes;
    a.params.alibi_stride_batch = c->alibi == 2 ? a.heads_q : 0;
  }
  th_tensor q = th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, a.head_dim);
  th_tensor k = th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, a.head_dim);
  th_tensor v = th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, dv);
  th_tensor o = th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, dv);
  th_tensor dout = th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, dv);
  th_tensor g[3] = {th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_q, a.heads_q, a.head_dim),
                    th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, a.head_dim),
                    th_tensor_new(FLASHC_F64, TH_BSHD, a.batch, a.seqlen_k, a.heads_kv, dv)};
  th_fill_normal(&q, rng), th_fill_normal(&k, rng), th_fill_normal(&v, rng), th_fill_normal(&dout, rng);
  int64_t nlse = th_lse_numel(&a);
  float *lse = calloc((size_t)nlse, sizeof *lse);
  if (!lse) abort();

  flashc_status s = th_forward(ref, &a.params, &q, &k, &v, &o, lse, nlse);
  if (s == FLASHC_OK) s = th_backward(ref, &a.params, &q, &k, &v, &o, lse, nlse, &dout, &g[0], &g[1], &g[2]);
  if (!th_check(s == FLASHC_OK, "%s: cpu-ref: %s: %s", c->name, flashc_status_string(s), flashc_last_error()))
    goto done;

  const char *names[3] = {"dq", "dk", "dv"};
  th_tensor *x[3] = {&q, &k, &v};
  const double *dd = dout.view.data;
  char line[3][96];
  bool all = true;
  for (int t = 0; t < 3; t++) {
    double *xs = x[t]->view.data, *gs = g[t].view.data;
    int64_t n = th_numel(&x[t]->view);
    double *fd = calloc((size_t)n, sizeof *fd);
    if (!fd) abort();
    double gmax = 0, err = 0;
    int64_t worst = 0;
    for (int64_t i = 0; i < n; i++) {
      double x0 = xs[i], h = 1e-5 * fmax(1.0, fabs(x0));
      xs[i] = x0 + h;
      double lp = loss(ref, &a, &q, &k, &v, &o, dd);
      xs[i] = x0 - h;
      double lm = loss(ref, &a, &q, &k, &v, &o, dd);
      xs[i] = x0;
      fd[i] = (lp - lm) / (2 * h);
      if (fabs(fd[i]) > gmax) gmax = fabs(fd[i]);
    }
    for (int64_t i = 0; i < n; i++) {
      double e = fabs(gs[i] - fd[i]);
      if (!(e <= err)) err = e, worst = i; /* NaN counts as the worst */
    }
    bool ok = err <= 1e-8 * gmax && gmax > 0;
    snprintf(line[t], sizeof line[t], "%s max|g-fd| %.1e of max|g| %.2e (elem %lld)", names[t], err, gmax,
             (long long)worst);
    if (!ok) th_fail("%s: %s: gradient %.17g vs finite difference %.17g", c->name, line[t], gs[worst], fd[worst]);
    all &= ok;
    free(fd);
  }
  /* Rows that see no key: their dq is exactly 0 (the finite difference is 0 there as well). */
  uint8_t *empty = th_empty_rows(&a);
  const double *dq = g[0].view.data;
  int64_t nonzero = 0, row = a.heads_q * a.head_dim;
  for (int64_t r = 0; r < a.batch * a.seqlen_q; r++)
    if (empty[r])
      for (int64_t e = 0; e < row; e++) nonzero += dq[r * row + e] != 0.0;
  free(empty);
  all &= th_check(nonzero == 0, "%s: %lld dq elements of rows that see no key are not 0", c->name, (long long)nonzero);
  if (all) printf("PASS %-32s %s | %s | %s\n", c->name, line[0], line[1], line[2]);
done:
  th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o), th_tensor_free(&dout);
  th_tensor_free(&g[0]), th_tensor_free(&g[1]), th_tensor_free(&g[2]);
  free(lse);
}

int main(void) {
  th_begin("test_gradcheck");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  th_backend ref;
  if (th_backend_open(&ref, "cpu-ref")) {
    for (int i = 0; i < NCASES; i++) run_case(&ref, &cases[i], &rng);
    th_backend_close(&ref);
  }
  return th_end();
}
