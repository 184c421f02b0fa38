/*
 * ref_kvcache.c — cpu-ref over a KV cache: the fp64 oracle of flashc_forward_kvcache.
 *
 * The definition, line by line, as ref.c's forward: for query row i of (sequence b, query head h) and the keys
 * j < len_b that the mask lets it see (fc_visible, for seqlen_k = len_b),
 *   S_ij = scale · q_i·k_j
 *   m_i = max_j S_ij,  l_i = Σ_j exp(S_ij − m_i),  o_i = Σ_j exp(S_ij − m_i) v_j / l_i,  lse_i = m_i + log l_i
 * every product and sum in fp64, k_j and v_j read one element at a time from wherever fc_kv_offset says row j
 * is (dense slot or page). A row that sees no key, or only scores of −inf, gives o_i = 0 and lse_i = −inf;
 * NaN propagates as in ref.c. The scores are computed twice (the same bits both times) rather than stored, so
 * the oracle needs no scratch. One task per (sequence, query head); the append comes first.
 */
#include "../kvcache.h"

#include <string.h>

enum { D_MAX = 256 }; /* the largest head_dim of the CPU backends */

static double dot_row(const fc_kv_problem *p, const double *q, int64_t b, int64_t j, int64_t hk) {
  const int64_t at = fc_kv_offset(p, &p->k_cache, b, j, hk);
  double s = 0.0;
  for (int64_t c = 0; c < p->base.head_dim; c++) s += q[c] * fc_load(p->k_cache.data, p->base.dtype, at + c);
  return s;
}

/* max(m, x), NaN as soon as either is. */
static inline double max_nan(double m, double x) { return x > m || x != x ? x : m; }

void fc_ref_kvcache_row(const fc_kv_problem *p, int64_t b, int64_t h, int64_t i) {
  const fc_problem *base = &p->base;
  const int64_t d = base->head_dim, hk = h / (base->heads_q / base->heads_kv), len = fc_kv_len(p, b);
  const int64_t shift = fc_mask_shift(base, base->seqlen_q, len), q_at = fc_offset(&base->q, b, 0, i, h);
  double q[D_MAX], o[D_MAX];
  for (int64_t c = 0; c < d; c++) q[c] = fc_load(base->q.data, base->dtype, q_at + c);
  memset(o, 0, sizeof o);

  double m = -INFINITY, l = 0.0;
  for (int64_t j = 0; j < len; j++)
    if (fc_visible(base, shift, i, j)) m = max_nan(m, (double)base->scale * dot_row(p, q, b, j, hk));
  if (m != -INFINITY) {
    for (int64_t j = 0; j < len; j++) {
      if (!fc_visible(base, shift, i, j)) continue;
      const double e = exp((double)base->scale * dot_row(p, q, b, j, hk) - m);
      const int64_t v_at = fc_kv_offset(p, &p->v_cache, b, j, hk);
      l += e;
      for (int64_t c = 0; c < d; c++) o[c] += e * fc_load(p->v_cache.data, base->dtype, v_at + c);
    }
    for (int64_t c = 0; c < d; c++) o[c] /= l;
  }
  const int64_t o_at = fc_offset(&base->o, b, 0, i, h);
  for (int64_t c = 0; c < d; c++) fc_store(base->o.data, base->dtype, o_at + c, o[c]);
  if (base->lse) base->lse[fc_lse_index(base, b, 0, h, i)] = m == -INFINITY ? -INFINITY : (float)(m + log(l));
}

static void row_task(void *ctx, int64_t t, int worker) {
  (void)worker;
  const fc_kv_problem *p = ctx;
  const int64_t b = t / p->base.heads_q, h = t % p->base.heads_q;
  for (int64_t i = 0; i < p->base.seqlen_q; i++) fc_ref_kvcache_row(p, b, h, i);
}

flashc_status fc_ref_forward_kvcache(const fc_kv_problem *p) {
  fc_kv_append_host(p);
  const int64_t tasks = p->base.batch * p->base.heads_q;
  if (tasks > 0 && p->base.seqlen_q > 0)
    fc_parallel_for(p->base.threads < tasks ? p->base.threads : (int)tasks, tasks, row_task, (void *)p);
  return FLASHC_OK;
}
