/* naive.c — plain attention that materialises each score row: the low-precision baseline of
 * FlashAttention's rule, and (in f64) an oracle written apart from cpu-ref.
 *
 * One code path serves both models: values are held in doubles and `fl` rounds every arithmetic result to
 * float in the low-precision model (a sum or product of floats computed in double and rounded once is the
 * correctly rounded float result, since 53 ≥ 2·24 + 2), and `rt` rounds to the dtype where a plain
 * implementation stores a tensor: S, P, O (forward) and dP, dS, dQ, dK, dV (backward). In the f64 model both
 * are the identity. The mask is this file's own reading of flashc.h, not the library's helpers. */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

th_attn th_attn_dense(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                      int64_t head_dim) {
  th_attn a = {batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, flashc_params_default()};
  return a;
}

void th_attn_varlen(th_attn *a, const int32_t *lens_q, const int32_t *lens_k, int num_seqs, int32_t *cu_q,
                    int32_t *cu_k) {
  cu_q[0] = cu_k[0] = 0;
  for (int s = 0; s < num_seqs; s++) cu_q[s + 1] = cu_q[s] + lens_q[s], cu_k[s + 1] = cu_k[s] + lens_k[s];
  a->params.cu_seqlens_q = cu_q, a->params.cu_seqlens_k = cu_k, a->params.num_seqs = num_seqs;
  a->batch = 1, a->seqlen_q = cu_q[num_seqs], a->seqlen_k = cu_k[num_seqs];
}

int64_t th_num_seqs(const th_attn *a) { return a->params.cu_seqlens_q ? a->params.num_seqs : a->batch; }

void th_seq_rows(const th_attn *a, int64_t s, bool keys, int64_t *batch_index, int64_t *start, int64_t *len) {
  const int32_t *cu = keys ? a->params.cu_seqlens_k : a->params.cu_seqlens_q;
  if (cu) {
    *batch_index = 0;
    *start = cu[s];
    *len = (int64_t)cu[s + 1] - cu[s];
  } else {
    *batch_index = s;
    *start = 0;
    *len = keys ? a->seqlen_k : a->seqlen_q;
  }
}

void th_key_range(const th_attn *a, int64_t sq, int64_t sk, int64_t i, int64_t *lo, int64_t *hi) {
  /* flashc.h: the row's diagonal is d = i + (sk − sq) bottom-right, i top-left; causal: j ≤ d; a window
   * (L, R): d − L ≤ j ≤ d + R with a negative side unbounded; causal sets R to 0. */
  int64_t d = i + (a->params.align == FLASHC_ALIGN_BOTTOM_RIGHT ? sk - sq : 0);
  int64_t left = a->params.window_left, right = a->params.causal ? 0 : a->params.window_right;
  int64_t l = left < 0 ? 0 : d - left, h = right < 0 ? sk : d + right + 1;
  *lo = l < 0 ? 0 : l;
  *hi = h > sk ? sk : h;
}

float th_scale(const th_attn *a) {
  return a->params.scale != 0.0f ? a->params.scale : (float)(1.0 / sqrt((double)a->head_dim));
}

int64_t th_lse_numel(const th_attn *a) { return a->batch * a->seqlen_q * a->heads_q; }

int64_t th_lse_index(const th_attn *a, int64_t s, int64_t h, int64_t i) {
  int64_t b, start, len;
  th_seq_rows(a, s, false, &b, &start, &len);
  if (a->params.cu_seqlens_q) return h * a->seqlen_q + start + i;
  return (b * a->heads_q + h) * a->seqlen_q + i;
}

uint8_t *th_empty_rows(const th_attn *a) {
  uint8_t *e = calloc((size_t)(a->batch * a->seqlen_q), 1);
  if (!e) abort();
  for (int64_t s = 0; s < th_num_seqs(a); s++) {
    int64_t bq, sq0, sq, bk, sk0, sk, lo, hi;
    th_seq_rows(a, s, false, &bq, &sq0, &sq);
    th_seq_rows(a, s, true, &bk, &sk0, &sk);
    for (int64_t i = 0; i < sq; i++) {
      th_key_range(a, sq, sk, i, &lo, &hi);
      e[bq * a->seqlen_q + sq0 + i] = lo >= hi;
    }
  }
  return e;
}

typedef struct model {
  flashc_dtype dtype;
  bool low; /* fp32 arithmetic */
} model;

static inline double fl(const model *m, double x) { return m->low ? (double)(float)x : x; }
static inline double rt(const model *m, double x) { return m->low ? th_round(m->dtype, x) : x; }

/* Offsets of row r, head h in dense BSHD arrays. */
static inline int64_t q_at(const th_attn *a, int64_t b, int64_t r, int64_t h) {
  return ((b * a->seqlen_q + r) * a->heads_q + h) * a->head_dim;
}
static inline int64_t k_at(const th_attn *a, int64_t b, int64_t r, int64_t h) {
  return ((b * a->seqlen_k + r) * a->heads_kv + h) * a->head_dim;
}

/* P_j (j in [lo, hi)) of query row qi against keys of one sequence: S = rt(Σ q·k), x = scale·S,
 * P = rt(exp(x − m) / l). Returns lse = m + log l. */
static double softmax_row(const th_attn *a, const model *m, const double *qi, const double *k, int64_t bk, int64_t sk0,
                          int64_t kvh, int64_t lo, int64_t hi, double *p) {
  double scale = th_scale(a), mx = -INFINITY;
  for (int64_t j = lo; j < hi; j++) {
    const double *kj = k + k_at(a, bk, sk0 + j, kvh);
    double acc = 0;
    for (int64_t d = 0; d < a->head_dim; d++) acc = fl(m, acc + fl(m, qi[d] * kj[d]));
    p[j] = fl(m, scale * rt(m, acc));
    if (p[j] > mx) mx = p[j];
  }
  double l = 0;
  for (int64_t j = lo; j < hi; j++) {
    p[j] = fl(m, exp(fl(m, p[j] - mx)));
    l = fl(m, l + p[j]);
  }
  for (int64_t j = lo; j < hi; j++) p[j] = rt(m, fl(m, p[j] / l));
  return fl(m, mx + fl(m, log(l)));
}

/* Plain attention row by row: the forward into o and lse (either may be NULL) and, given dout, the backward into
 * dq, dk, dv. Both directions recompute the same P of each row, as a plain backward does from q and k. */
static void naive(const th_attn *a, flashc_dtype dtype, const double *q, const double *k, const double *v, double *o,
                  double *lse, const double *dout, double *dq, double *dk, double *dv) {
  model m = {dtype, dtype != FLASHC_F64};
  int64_t D = a->head_dim, group = a->heads_q / a->heads_kv;
  size_t nk = dout ? (size_t)(a->batch * a->seqlen_k * a->heads_kv * D) : 0;
  size_t row = (size_t)(a->seqlen_k > 0 ? a->seqlen_k : 1);
  double *p = malloc(row * sizeof *p), *ds = malloc(row * sizeof *ds);
  double *dk_acc = calloc(nk ? nk : 1, sizeof *dk_acc), *dv_acc = calloc(nk ? nk : 1, sizeof *dv_acc);
  if (!p || !ds || !dk_acc || !dv_acc) abort();
  double scale = th_scale(a);
  for (int64_t s = 0; s < th_num_seqs(a); s++) {
    int64_t bq, sq0, sq, bk, sk0, sk;
    th_seq_rows(a, s, false, &bq, &sq0, &sq);
    th_seq_rows(a, s, true, &bk, &sk0, &sk);
    for (int64_t h = 0; h < a->heads_q; h++)
      for (int64_t i = 0; i < sq; i++) {
        int64_t lo, hi, kvh = h / group;
        th_key_range(a, sq, sk, i, &lo, &hi);
        const double *qi = q + q_at(a, bq, sq0 + i, h);
        double l = lo < hi ? softmax_row(a, &m, qi, k, bk, sk0, kvh, lo, hi, p) : -INFINITY;
        /* no key: output 0, lse −inf, no gradient */
        if (lse) lse[th_lse_index(a, s, h, i)] = m.low ? (double)(float)l : l;
        if (o) {
          /* O = P·V */
          double *oi = o + q_at(a, bq, sq0 + i, h);
          for (int64_t d = 0; d < D; d++) {
            double acc = 0;
            for (int64_t j = lo; j < hi; j++) acc = fl(&m, acc + fl(&m, p[j] * v[k_at(a, bk, sk0 + j, kvh) + d]));
            oi[d] = rt(&m, acc);
          }
        }
        if (!dout) continue;
        const double *doi = dout + q_at(a, bq, sq0 + i, h);
        double *dqi = dq + q_at(a, bq, sq0 + i, h);
        /* dP = dO·Vᵀ, D_i = Σ_j P_ij dP_ij, dS = P∘(dP − D_i) */
        double rowsum = 0;
        for (int64_t j = lo; j < hi; j++) {
          const double *vj = v + k_at(a, bk, sk0 + j, kvh);
          double acc = 0;
          for (int64_t d = 0; d < D; d++) acc = fl(&m, acc + fl(&m, doi[d] * vj[d]));
          ds[j] = rt(&m, acc); /* dP for now */
          rowsum = fl(&m, rowsum + fl(&m, p[j] * ds[j]));
        }
        for (int64_t j = lo; j < hi; j++) ds[j] = rt(&m, fl(&m, p[j] * fl(&m, ds[j] - rowsum)));
        /* dQ_i = scale·Σ_j dS_ij K_j; dK_j += dS_ij Q_i; dV_j += P_ij dO_i */
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = lo; j < hi; j++) acc = fl(&m, acc + fl(&m, ds[j] * k[k_at(a, bk, sk0 + j, kvh) + d]));
          dqi[d] = lo < hi ? rt(&m, fl(&m, scale * acc)) : 0;
        }
        for (int64_t j = lo; j < hi; j++) {
          double *dkj = dk_acc + k_at(a, bk, sk0 + j, kvh), *dvj = dv_acc + k_at(a, bk, sk0 + j, kvh);
          for (int64_t d = 0; d < D; d++) {
            dkj[d] = fl(&m, dkj[d] + fl(&m, ds[j] * qi[d]));
            dvj[d] = fl(&m, dvj[d] + fl(&m, p[j] * doi[d]));
          }
        }
      }
  }
  for (size_t e = 0; e < nk; e++) {
    dk[e] = rt(&m, fl(&m, scale * dk_acc[e]));
    dv[e] = rt(&m, dv_acc[e]);
  }
  free(p);
  free(ds);
  free(dk_acc);
  free(dv_acc);
}

void th_naive_forward(const th_attn *a, flashc_dtype dtype, const double *q, const double *k, const double *v,
                      double *o, double *lse) {
  naive(a, dtype, q, k, v, o, lse, NULL, NULL, NULL, NULL);
}

void th_naive_backward(const th_attn *a, flashc_dtype dtype, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv) {
  naive(a, dtype, q, k, v, NULL, NULL, dout, dq, dk, dv);
}
