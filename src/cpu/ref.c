/*
 * ref.c — cpu-ref: the fp64 oracle every other backend is checked against.
 *
 * Plain loops in the order of the definition, every product and sum in fp64, so that the only rounding
 * that matters is the final store into the caller's dtype. It supports every feature of fc_problem (all
 * dtypes including f64, head_dim 1..256 and a head_dim_v of V up to 512, GQA/MQA, varlen with seqused, windows
 * and causal in both alignments, softcap, ALiBi, attn_mask and its gradient dbias, dropout, any strides) and reads the
 * mask element by element through fc_visible, independently of the key ranges the fast backends derive from it. Speed
 * is not a goal; being obviously right is.
 *
 * Forward: one task per (sequence, query head). Backward: one task per (sequence, kv head), which owns the
 * dk/dv rows of its kv head and the dq rows of the query heads that share it, so no two tasks write the same
 * row and the result does not depend on the thread count.
 */
#include "../kvcache.h"
#include "../philox.h"
#include "flash.h"
#include "scratch.h"

#include <string.h>

/* One row of head_dim elements of view v, as fp64. */
static void load_row(const fc_view *v, flashc_dtype dtype, int64_t offset, int64_t d, double *out) {
  for (int64_t c = 0; c < d; c++) out[c] = fc_load(v->data, dtype, offset + c);
}

static void store_row(const fc_view *v, flashc_dtype dtype, int64_t offset, int64_t d, const double *in) {
  for (int64_t c = 0; c < d; c++) fc_store(v->data, dtype, offset + c, in[c]);
}

static double dot(const double *a, const double *b, int64_t d) {
  double s = 0.0;
  for (int64_t c = 0; c < d; c++) s += a[c] * b[c];
  return s;
}

/* ---- forward ---------------------------------------------------------------------------------------- */
/* For query row i of one (sequence, head), over the keys j it may see (fc_visible):
 *   S_ij = mods(scale · q_i·k_j)              (1)  mods: softcap, then ALiBi (score below)
 *   m_i = max_j S_ij,  l_i = Σ_j exp(S_ij − m_i)
 *   P_ij = exp(S_ij − m_i) / l_i              (2)
 *   o_i = Σ_j P_ij Z_ij v_j                   (3)  Z: dropout's keep_ij / (1 − p) (philox.h), else 1
 *   lse_i = m_i + log l_i
 * A row that sees no key (or only scores of −inf, which weigh nothing) has no softmax: o_i = 0, lse_i = −inf.
 * Non-finite values follow IEEE arithmetic as in PyTorch: the maximum propagates NaN (max_nan), so a NaN
 * score, or a +inf one (exp(inf − inf)), makes l_i, o_i and lse_i NaN, and m_i = −inf means "no key seen"
 * and nothing else. */

/* max(m, x), NaN as soon as either is: a NaN, once met, stays (x > NaN is false). */
static inline double max_nan(double m, double x) { return x > m || x != x ? x : m; }

/* What the score of query i and key j of one (sequence, head) needs beyond q·k: the scale, softcap, the ALiBi
 * slope, the sequence's lengths (ALiBi's distance) and its plane of attn_mask (element (i, j) at mask + base +
 * i·st_i + j·st_j). */
typedef struct {
  double scale, cap, slope;
  int64_t sq, sk;
  const void *mask; /* NULL: none */
  int is_bool;
  flashc_dtype dtype; /* of a bias */
  int64_t base, st_i, st_j;
  /* dropout (drop 0: off): Z_ij = keep_ij · rp, keep_ij from (seed, offset, threshold) for element (i, j) of bh */
  int drop;
  double rp;
  uint64_t seed, offset, bh;
  uint32_t threshold;
} score_fn;

static score_fn score_of(const fc_problem *p, int64_t s, int64_t h, int64_t sq, int64_t sk) {
  score_fn f = {.scale = p->scale, .cap = p->softcap, .slope = fc_alibi_slope(p, s, h), .sq = sq, .sk = sk};
  if (p->attn_mask) {
    f.mask = p->attn_mask;
    f.is_bool = p->attn_mask_is_bool;
    f.dtype = p->dtype;
    f.base = fc_attn_mask_offset(p->attn_mask_stride, s, h, 0, 0);
    f.st_i = p->attn_mask_stride[2];
    f.st_j = p->attn_mask_stride[3];
  }
  if (p->dropout_p > 0.0f) {
    f.drop = 1;
    f.rp = 1.0 / (1.0 - (double)p->dropout_p);
    f.seed = p->dropout_seed;
    f.offset = p->dropout_offset;
    f.threshold = p->dropout_threshold;
    f.bh = (uint64_t)(s * p->heads_q + h);
  }
  return f;
}

/* Dropout's Z_ij: 1 without dropout, else 1/(1 − p) where weight (i, j) is kept and 0 where it is dropped. */
static double dropout_z(const score_fn *f, int64_t i, int64_t j) {
  if (!f->drop) return 1.0;
  return fc_dropout_keep(f->seed, f->offset, f->threshold, f->bh, f->sk, i, j) ? f->rp : 0.0;
}

/* Key j takes part in row i: the causal/window mask lets it through (fc_visible) and a boolean attn_mask does not
 * remove it. */
static bool sees(const fc_problem *p, const score_fn *f, int64_t shift, int64_t i, int64_t j) {
  if (!fc_visible(p, shift, i, j)) return false;
  return !(f->mask && f->is_bool && ((const uint8_t *)f->mask)[f->base + i * f->st_i + j * f->st_j] == 0);
}

/* S_ij from x = q_i·k_j: s = scale·x, s ← cap·tanh(s / cap) (softcap), s ← s − slope·|i + sk − sq − j| (ALiBi),
 * s ← s + bias_ij (a float attn_mask). *t (may be NULL) gets tanh(s / cap), what the backward's dS needs (0 without
 * softcap). */
static double score(const score_fn *f, double x, int64_t i, int64_t j, double *t) {
  double S = f->scale * x;
  if (f->cap > 0.0) {
    const double th = tanh(S / f->cap);
    if (t) *t = th;
    S = f->cap * th;
  } else if (t) {
    *t = 0.0;
  }
  if (f->slope != 0.0) S -= f->slope * fc_alibi_dist(f->sq, f->sk, i, j);
  if (f->mask && !f->is_bool) S += fc_load(f->mask, f->dtype, f->base + i * f->st_i + j * f->st_j);
  return S;
}

/* The rows k_j, v_j of one (sequence s, kv head hk) as fp64: from K, V (all rows, loaded once per task) or,
 * where there is no room for them, read one at a time into buf (2·d doubles). */
typedef struct {
  const fc_problem *p;
  int64_t s, k0, hk;
  const double *K, *V;
  double *buf; /* d + dv doubles */
} kv_rows;

static const double *key_row(const kv_rows *kv, int64_t j) {
  const int64_t d = kv->p->head_dim;
  if (kv->K) return kv->K + j * d;
  load_row(&kv->p->k, kv->p->dtype, fc_offset(&kv->p->k, kv->s, kv->k0, j, kv->hk), d, kv->buf);
  return kv->buf;
}

static const double *value_row(const kv_rows *kv, int64_t j) {
  const int64_t d = kv->p->head_dim, dv = kv->p->head_dim_v;
  if (kv->V) return kv->V + j * dv;
  load_row(&kv->p->v, kv->p->dtype, fc_offset(&kv->p->v, kv->s, kv->k0, j, kv->hk), dv, kv->buf + d);
  return kv->buf + d;
}

/* o_i (dv doubles) and the return value lse_i of query row i (q_i as fp64), over the sk keys of kv. S: room
 * for the sk scores, or NULL to compute each score twice (the same bits both times). */
static double forward_row(const kv_rows *kv, const score_fn *f, int64_t shift, int64_t i, int64_t sk, const double *q,
                          double *S, double *o) {
  const fc_problem *p = kv->p;
  const int64_t d = p->head_dim, dv = p->head_dim_v;
  double m = -INFINITY;
  for (int64_t j = 0; j < sk; j++) { /* (1) */
    if (!sees(p, f, shift, i, j)) continue;
    const double S_ij = score(f, dot(q, key_row(kv, j), d), i, j, NULL);
    if (S) S[j] = S_ij;
    m = max_nan(m, S_ij);
  }
  double l = 0.0;
  memset(o, 0, (size_t)dv * sizeof *o);
  if (m == -INFINITY) return -INFINITY;
  for (int64_t j = 0; j < sk; j++) { /* (2) and (3), with the division by l_i left to the end */
    if (!sees(p, f, shift, i, j)) continue;
    const double e = exp((S ? S[j] : score(f, dot(q, key_row(kv, j), d), i, j, NULL)) - m), ez = e * dropout_z(f, i, j);
    l += e; /* the softmax's sum, which dropout does not change */
    const double *v = value_row(kv, j);
    for (int64_t c = 0; c < dv; c++) o[c] += ez * v[c];
  }
  for (int64_t c = 0; c < dv; c++) o[c] /= l;
  return m + log(l);
}

typedef struct {
  const fc_problem *p;
  fc_scratch scratch;
} ref_ctx;

/* K, V of kv head hk of sequence s (sk rows) as fp64 rows of d and dv: read once per task instead of once per
 * query row. */
static void load_kv(const fc_problem *p, int64_t s, int64_t k0, int64_t sk, int64_t hk, double *K, double *V) {
  for (int64_t j = 0; j < sk; j++) {
    load_row(&p->k, p->dtype, fc_offset(&p->k, s, k0, j, hk), p->head_dim, K + j * p->head_dim);
    load_row(&p->v, p->dtype, fc_offset(&p->v, s, k0, j, hk), p->head_dim_v, V + j * p->head_dim_v);
  }
}

/* Per-worker fp64 scratch of the forward: K (seqlen_k × d), V (seqlen_k × dv) | S (seqlen_k) | q_i (d), o_i (dv). */
static size_t forward_scratch_bytes(const fc_problem *p) {
  const int64_t dd = p->head_dim + p->head_dim_v;
  return (size_t)(p->seqlen_k * dd + p->seqlen_k + dd) * sizeof(double);
}

/* q, o: [B, Sq, Hq, D]; k, v: [B, Sk, Hkv, D]; lse: [B, Hq, Sq] (varlen: [Hq, total_q]). */
static void forward_task(void *vctx, int64_t t, int worker) {
  const ref_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const int64_t s = t / p->heads_q, h = t % p->heads_q, hk = h / (p->heads_q / p->heads_kv), d = p->head_dim;
  int64_t q0, sq, k0, sk;
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  const int64_t shift = fc_mask_shift(p, sq, sk), dv = p->head_dim_v;
  double *K = fc_scratch_worker(&ctx->scratch, worker), *V = K + p->seqlen_k * d, *S = V + p->seqlen_k * dv,
         *q = S + p->seqlen_k, *o = q + d;
  load_kv(p, s, k0, sk, hk, K, V);
  const kv_rows kv = {.p = p, .s = s, .k0 = k0, .hk = hk, .K = K, .V = V};
  const score_fn f = score_of(p, s, h, sq, sk);

  for (int64_t i = 0; i < sq; i++) {
    load_row(&p->q, p->dtype, fc_offset(&p->q, s, q0, i, h), d, q);
    const double lse = forward_row(&kv, &f, shift, i, sk, q, S, o);
    store_row(&p->o, p->dtype, fc_offset(&p->o, s, q0, i, h), dv, o);
    if (p->lse) p->lse[fc_lse_index(p, s, q0, h, i)] = (float)lse;
  }
}

void fc_ref_forward_row(const fc_problem *p, int64_t s, int64_t h, int64_t i) {
  enum { D_MAX = 256, DV_MAX = 512 }; /* the largest head_dim and head_dim_v of any backend */
  const int64_t hk = h / (p->heads_q / p->heads_kv), d = p->head_dim;
  int64_t q0, sq, k0, sk;
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  double q[D_MAX] = {0}, o[DV_MAX], buf[D_MAX + DV_MAX];
  const kv_rows kv = {.p = p, .s = s, .k0 = k0, .hk = hk, .buf = buf};
  const score_fn f = score_of(p, s, h, sq, sk);
  load_row(&p->q, p->dtype, fc_offset(&p->q, s, q0, i, h), d, q);
  const double lse = forward_row(&kv, &f, fc_mask_shift(p, sq, sk), i, sk, q, NULL, o);
  store_row(&p->o, p->dtype, fc_offset(&p->o, s, q0, i, h), p->head_dim_v, o);
  if (p->lse) p->lse[fc_lse_index(p, s, q0, h, i)] = (float)lse;
}

static flashc_status ref_forward(const fc_problem *p) {
  ref_ctx ctx = {.p = p};
  const int64_t tasks = p->batch * p->heads_q;
  FC_CHECK(fc_scratch_get(p, tasks, 0, forward_scratch_bytes(p), &ctx.scratch));
  fc_parallel_for(ctx.scratch.threads, tasks, forward_task, &ctx);
  return FLASHC_OK;
}

/* ---- backward --------------------------------------------------------------------------------------- */
/* Everything is recomputed in fp64 from q, k, v and dout: the oracle must not inherit the rounding of the
 * o and lse it is given. With L the loss and dX = ∂L/∂X, each gradient undoes one forward line:
 *   (3) o_i = Σ_j P_ij Z_ij v_j   →  dv_j += P_ij Z_ij do_i            dP_ij = Z_ij do_i·v_j (Z: dropout)
 *   (2) P_ij = softmax_j(S_ij)    →  dS_ij = P_ij (dP_ij − D_i),       D_i = Σ_j P_ij dP_ij  (= do_i·o_i)
 *   (1) S_ij = mods(scale q_i·k_j) →  dq_i = scale Σ_j dS'_ij k_j,     dk_j += scale dS'_ij q_i
 *       with dS' = dS · (1 − tanh²(scale q_i·k_j / cap)) under softcap (ALiBi's bias is a constant: dS' = dS).
 * For GQA, dk_j and dv_j sum over every query head of the group that reads kv head hk. */

/* Per-worker fp64 scratch of the backward: K, dK (seqlen_k × d each), V, dV (seqlen_k × dv each) | P, dP, T
 * (seqlen_k) | q_i, dq_i (d each), do_i (dv). */
static size_t backward_scratch_bytes(const fc_problem *p) {
  const int64_t d = p->head_dim, dv = p->head_dim_v;
  return (size_t)(2 * p->seqlen_k * (d + dv) + 3 * p->seqlen_k + 2 * d + dv) * sizeof(double);
}

/* One task: sequence s, kv head hk, and the query heads h of its group. */
static void backward_task(void *vctx, int64_t t, int worker) {
  const ref_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const int64_t s = t / p->heads_kv, hk = t % p->heads_kv, group = p->heads_q / p->heads_kv, d = p->head_dim;
  int64_t q0, sq, k0, sk;
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  const int64_t shift = fc_mask_shift(p, sq, sk), dv = p->head_dim_v, n = p->seqlen_k * d, nv = p->seqlen_k * dv;
  const double scale = p->scale;
  double *K = fc_scratch_worker(&ctx->scratch, worker), *dK = K + n, *V = dK + n, *dV = V + nv, *P = dV + nv,
         *dP = P + p->seqlen_k, *T = dP + p->seqlen_k, *q = T + p->seqlen_k, *dq = q + d, *dout = dq + d;
  load_kv(p, s, k0, sk, hk, K, V);
  memset(dK, 0, (size_t)(sk * d) * sizeof *dK);
  memset(dV, 0, (size_t)(sk * dv) * sizeof *dV);

  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    const score_fn f = score_of(p, s, h, sq, sk);
    for (int64_t i = 0; i < sq; i++) {
      load_row(&p->q, p->dtype, fc_offset(&p->q, s, q0, i, h), d, q);
      load_row(&p->dout, p->dtype, fc_offset(&p->dout, s, q0, i, h), dv, dout);
      memset(dq, 0, (size_t)d * sizeof *dq);

      /* The forward again: S_ij (1) into P (tanh of the softcap into T), m_i, then P_ij = exp(S_ij − m_i) / l_i
       * (2). */
      double m = -INFINITY;
      for (int64_t j = 0; j < sk; j++) {
        P[j] = 0.0;
        if (!sees(p, &f, shift, i, j)) continue;
        P[j] = score(&f, dot(q, K + j * d, d), i, j, &T[j]);
        m = max_nan(m, P[j]);
      }
      if (m != -INFINITY) { /* else the row sees no key: P = 0 and every gradient of the row is 0 */
        double l = 0.0;
        for (int64_t j = 0; j < sk; j++)
          if (sees(p, &f, shift, i, j)) l += P[j] = exp(P[j] - m);
        /* A NaN l (a NaN or +inf score) reaches every key the row sees, and only those: a hidden key stays 0. */
        for (int64_t j = 0; j < sk; j++)
          if (sees(p, &f, shift, i, j)) P[j] /= l;

        /* Undo (3): dv_j += P_ij Z_ij do_i, dP_ij = Z_ij do_i·v_j; D_i = Σ_j P_ij dP_ij. */
        double D = 0.0;
        for (int64_t j = 0; j < sk; j++) {
          dP[j] = 0.0;
          /* Hidden keys take no part. A key the row sees does, with P_ij = 0 too: its k_j and v_j enter the
           * products (so an infinite k_j makes dq_i NaN through 0·inf, as in PyTorch's matrix products). */
          if (!sees(p, &f, shift, i, j)) continue;
          const double z = dropout_z(&f, i, j), pz = P[j] * z;
          dP[j] = z * dot(dout, V + j * dv, dv);
          D += P[j] * dP[j];
          for (int64_t c = 0; c < dv; c++) dV[j * dv + c] += pz * dout[c];
        }

        /* Undo (2) and (1): dS_ij = P_ij (dP_ij − D_i), through the softcap's tanh; dq_i = scale Σ_j dS_ij k_j;
         * dk_j += scale dS_ij q_i. */
        for (int64_t j = 0; j < sk; j++) {
          if (!sees(p, &f, shift, i, j)) continue;
          const double dS = P[j] * (dP[j] - D) * (f.cap > 0.0 ? 1.0 - T[j] * T[j] : 1.0);
          for (int64_t c = 0; c < d; c++) {
            dq[c] += scale * dS * K[j * d + c];
            dK[j * d + c] += scale * dS * q[c];
          }
        }
      }
      store_row(&p->dq, p->dtype, fc_offset(&p->dq, s, q0, i, h), d, dq);
    }
  }
  for (int64_t j = 0; j < sk; j++) { /* every key row is written, those no query sees with 0 */
    store_row(&p->dk, p->dtype, fc_offset(&p->dk, s, k0, j, hk), d, dK + j * d);
    store_row(&p->dv, p->dtype, fc_offset(&p->dv, s, k0, j, hk), dv, dV + j * dv);
  }
}

/* ---- dbias ------------------------------------------------------------------------------------------- */
/* The bias enters (1) after the modifiers, so its gradient is dS_ij itself (before softcap's tanh factor):
 *   dbias_ij = Σ dS_ij = Σ P_ij (dP_ij − D_i)   over (sequence, query head, i, j) of the dims dbias sums (stride 0).
 * A pass of its own, one task per element row (b, h, i) that dbias keeps (1 along a summed dim): each recomputes
 * the rows it sums from q, k, v and dout, in a fixed order, so no two tasks write one element and the sums do not
 * depend on the thread count. Scratch per worker: P, dP, the row sums (seqlen_k each), q_i, do_i and a k/v row. */
static size_t dbias_scratch_bytes(const fc_problem *p) {
  return (size_t)(3 * p->seqlen_k + 2 * (p->head_dim + p->head_dim_v)) * sizeof(double);
}

/* acc[j] += dS_ij of query row i of (sequence s, query head h). */
static void add_dS_row(const fc_problem *p, int64_t s, int64_t h, int64_t i, double *P, double *dP, double *q,
                       double *dout, double *buf, double *acc) {
  const int64_t hk = h / (p->heads_q / p->heads_kv), d = p->head_dim, dv = p->head_dim_v;
  int64_t q0, sq, k0, sk;
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  const int64_t shift = fc_mask_shift(p, sq, sk);
  const kv_rows kv = {.p = p, .s = s, .k0 = k0, .hk = hk, .buf = buf};
  const score_fn f = score_of(p, s, h, sq, sk);
  load_row(&p->q, p->dtype, fc_offset(&p->q, s, q0, i, h), d, q);
  load_row(&p->dout, p->dtype, fc_offset(&p->dout, s, q0, i, h), dv, dout);
  double m = -INFINITY, l = 0.0, D = 0.0;
  for (int64_t j = 0; j < sk; j++)
    if (sees(p, &f, shift, i, j)) m = max_nan(m, P[j] = score(&f, dot(q, key_row(&kv, j), d), i, j, NULL));
  if (m == -INFINITY) return; /* a row that sees no key: dS = 0 */
  for (int64_t j = 0; j < sk; j++)
    if (sees(p, &f, shift, i, j)) l += P[j] = exp(P[j] - m);
  for (int64_t j = 0; j < sk; j++) {
    if (!sees(p, &f, shift, i, j)) continue;
    P[j] /= l;
    dP[j] = dropout_z(&f, i, j) * dot(dout, value_row(&kv, j), dv);
    D += P[j] * dP[j];
  }
  for (int64_t j = 0; j < sk; j++)
    if (sees(p, &f, shift, i, j)) acc[j] += P[j] * (dP[j] - D);
}

/* The extent of dimension d of [batch, heads_q, seqlen_q, seqlen_k] that dbias keeps: 1 where it sums. */
static int64_t dbias_kept(const fc_problem *p, int d) {
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  return p->dbias_stride[d] != 0 ? n[d] : 1;
}

static void dbias_task(void *vctx, int64_t t, int worker) {
  const ref_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const int64_t ni = dbias_kept(p, 2), nh = dbias_kept(p, 1), sk = p->seqlen_k;
  const int64_t oi = t % ni, oh = t / ni % nh, ob = t / ni / nh;
  double *P = fc_scratch_worker(&ctx->scratch, worker), *dP = P + sk, *acc = dP + sk, *q = acc + sk,
         *dout = q + p->head_dim, *buf = dout + p->head_dim_v;
  memset(acc, 0, (size_t)sk * sizeof *acc);
  const bool all_b = p->dbias_stride[0] == 0, all_h = p->dbias_stride[1] == 0, all_i = p->dbias_stride[2] == 0;
  for (int64_t s = all_b ? 0 : ob; s < (all_b ? p->batch : ob + 1); s++)
    for (int64_t h = all_h ? 0 : oh; h < (all_h ? p->heads_q : oh + 1); h++)
      for (int64_t i = all_i ? 0 : oi; i < (all_i ? p->seqlen_q : oi + 1); i++)
        add_dS_row(p, s, h, i, P, dP, q, dout, buf, acc);
  const int64_t at = fc_attn_mask_offset(p->dbias_stride, ob, oh, oi, 0);
  if (p->dbias_stride[3] == 0) {
    double sum = 0.0;
    for (int64_t j = 0; j < sk; j++) sum += acc[j];
    fc_store(p->dbias, p->dtype, at, sum);
  } else {
    for (int64_t j = 0; j < sk; j++) fc_store(p->dbias, p->dtype, at + j * p->dbias_stride[3], acc[j]);
  }
}

static flashc_status ref_dbias(const fc_problem *p) {
  ref_ctx ctx = {.p = p};
  const int64_t tasks = dbias_kept(p, 0) * dbias_kept(p, 1) * dbias_kept(p, 2);
  FC_CHECK(fc_scratch_get(p, tasks, 0, dbias_scratch_bytes(p), &ctx.scratch));
  fc_parallel_for(ctx.scratch.threads, tasks, dbias_task, &ctx);
  return FLASHC_OK;
}

static flashc_status ref_backward(const fc_problem *p) {
  ref_ctx ctx = {.p = p};
  const int64_t tasks = p->batch * p->heads_kv;
  FC_CHECK(fc_scratch_get(p, tasks, 0, backward_scratch_bytes(p), &ctx.scratch));
  fc_parallel_for(ctx.scratch.threads, tasks, backward_task, &ctx);
  return p->dbias ? ref_dbias(p) : FLASHC_OK;
}

const fc_backend fc_backend_cpu_ref = {
    .name = "cpu-ref",
    .summary = "fp64 reference: plain loops, the oracle every backend is checked against",
    .device = FLASHC_DEVICE_CPU,
    .dtypes = (1u << FLASHC_F32) | (1u << FLASHC_F16) | (1u << FLASHC_BF16) | (1u << FLASHC_F64),
    .min_head_dim = 1,
    .max_head_dim = 256,
    .features = FC_FEATURE_SOFTCAP | FC_FEATURE_ALIBI | FC_FEATURE_HEAD_DIM_V | FC_FEATURE_SEQUSED |
                FC_FEATURE_ATTN_MASK | FC_FEATURE_DROPOUT,
    .max_head_dim_v = 512,
    .usable = NULL,
    .supports = NULL,
    .forward = ref_forward,
    .backward = ref_backward,
    .forward_kvcache = fc_ref_forward_kvcache, /* ref_kvcache.c */
};
