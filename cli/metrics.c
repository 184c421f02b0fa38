/*
 * metrics.c — a backend's outputs against the fp64 reference: error statistics, tolerances per dtype,
 * and the table `flashc check` and `flashc demo` print.
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Elements whose reference is below this share of max|ref| are left out of max_rel: relative error near
 * a zero of the output says nothing about the kernel. */
#define REL_FLOOR 1e-3

void cli_compare(const double *x, const double *ref, int64_t n, double floor_rms, cli_error_stats *st) {
  memset(st, 0, sizeof *st);
  for (int64_t i = 0; i < n; i++)
    if (isfinite(ref[i]) && fabs(ref[i]) > st->ref_max_abs) st->ref_max_abs = fabs(ref[i]);
  double sum_abs = 0, sum_sq = 0, ref_sq = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; i++) {
    double r = ref[i], v = x[i];
    if (!isfinite(r) || !isfinite(v)) {
      /* Only an exact match of infinities is right (lse is −inf on a fully masked row); NaN never is. */
      if (!(r == v)) st->bad++;
      continue;
    }
    double d = fabs(v - r);
    if (d > st->max_abs) st->max_abs = d;
    if (fabs(r) >= REL_FLOOR * st->ref_max_abs && fabs(r) > 0 && d / fabs(r) > st->max_rel) st->max_rel = d / fabs(r);
    sum_abs += d;
    sum_sq += d * d;
    ref_sq += r * r;
    counted++;
  }
  if (counted) {
    st->mean_abs = sum_abs / (double)counted;
    st->mse = sum_sq / (double)counted;
  }
  /* The scale errors are judged on: the reference's own, but not below the floor. */
  double norm = fmax(sqrt(ref_sq), floor_rms * sqrt((double)counted));
  st->rel_l2 = norm > 0 ? sqrt(sum_sq) / norm : sqrt(sum_sq);
  st->scale = fmax(st->ref_max_abs, floor_rms);
}

/* Tolerances (also printed by `flashc check --help`):
 *   f32      : rel_l2 <= 1e-5, max_abs <= 1e-4 · max|ref|    (fp32 accumulation over a few thousand terms
 *                                                              stays near 1e-6)
 *   f16      : rel_l2 <= 5e-3, max_abs <= 2e-2 · max|ref|    (rounding the output alone is ~3e-4; the
 *                                                              P and dS operands rounded to f16 add ~1e-3)
 *   bf16     : rel_l2 <= 3e-2, max_abs <= 1e-1 · max|ref|    (8 mantissa bits: unit roundoff 3.9e-3)
 *   lse      : fp32 in every dtype, computed from the same (rounded) inputs: rel_l2 <= 1e-5 for f32,
 *              1e-4 for f16/bf16 (tensor cores may accumulate Q·Kᵀ in a different order). */
cli_tolerance cli_tolerance_for(flashc_dtype dtype, const char *output) {
  bool lse = strcmp(output, "lse") == 0;
  switch (dtype) {
  case FLASHC_F16: return lse ? (cli_tolerance){1e-4, 1e-3} : (cli_tolerance){5e-3, 2e-2};
  case FLASHC_BF16: return lse ? (cli_tolerance){1e-4, 1e-3} : (cli_tolerance){3e-2, 1e-1};
  default: return (cli_tolerance){1e-5, 1e-4};
  }
}

bool cli_within(const cli_error_stats *st, cli_tolerance tol) {
  return st->bad == 0 && st->rel_l2 <= tol.rel_l2 &&
         st->max_abs <= tol.max_abs * (st->ref_max_abs > 0 ? st->ref_max_abs : 1);
}

/* Elements of rows [used, end) of each sequence of a packed tensor x ([rows, heads, dim]: `width` = heads·dim values a
 * row) that are not `want`. */
static int64_t unused_wrong(const double *x, const int32_t *cu, const int32_t *used, int64_t n, int64_t width,
                            double want) {
  int64_t wrong = 0;
  for (int64_t s = 0; x && s < n; s++)
    for (int64_t i = (int64_t)(cu[s] + used[s]) * width; i < (int64_t)cu[s + 1] * width; i++) wrong += !(x[i] == want);
  return wrong;
}

int64_t cli_unused_rows_wrong(const cli_outputs *out, const cli_shape *s, const cli_varlen *v) {
  int64_t wrong = 0;
  if (v->has_used_q) {
    wrong += unused_wrong(out->o, v->cu_q, v->used_q, v->num_seqs, s->heads_q * s->head_dim_v, 0.0) +
             unused_wrong(out->dq, v->cu_q, v->used_q, v->num_seqs, s->heads_q * s->head_dim, 0.0);
    for (int64_t h = 0; out->lse && h < s->heads_q; h++) /* lse is [heads_q, total_q] */
      wrong += unused_wrong(out->lse + h * s->seqlen_q, v->cu_q, v->used_q, v->num_seqs, 1, -INFINITY);
  }
  if (v->has_used_k)
    wrong += unused_wrong(out->dk, v->cu_k, v->used_k, v->num_seqs, s->heads_kv * s->head_dim, 0.0) +
             unused_wrong(out->dv, v->cu_k, v->used_k, v->num_seqs, s->heads_kv * s->head_dim_v, 0.0);
  return wrong;
}

void cli_print_tolerances(void) {
  printf("Tolerances (an output passes when it has no NaN, infinities only where the reference has them, and\n"
         "both bounds hold; rel_l2 = |x - ref|_2 / |ref|_2, max_abs is relative to max|ref|):\n"
         "  dtype   o, dq, dk, dv                         lse (fp32 in every dtype)\n"
         "  f32     rel_l2 <= 1e-5, max_abs <= 1e-4        rel_l2 <= 1e-5, max_abs <= 1e-4\n"
         "  f16     rel_l2 <= 5e-3, max_abs <= 2e-2        rel_l2 <= 1e-4, max_abs <= 1e-3\n"
         "  bf16    rel_l2 <= 3e-2, max_abs <= 1e-1        rel_l2 <= 1e-4, max_abs <= 1e-3\n"
         "dq, dk, dv are judged on a scale of at least a tenth of the largest RMS among the three reference\n"
         "gradients, so that one which cancels to ~0 (dq and dk under --window 0,0) is measured against the size\n"
         "of its terms, not against its own rounding noise.\n"
         "max_rel = max |x - ref| / |ref| over elements with |ref| >= 1e-3 max|ref| (reported, not judged).\n");
}

int cli_report(const cli_outputs *out, const cli_outputs *ref, const cli_shape *s, flashc_dtype dtype, bool quiet,
               double *worst_abs, double *worst_rel_l2) {
  const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
  const double *xs[5] = {out->o, out->lse, out->dq, out->dk, out->dv};
  const double *rs[5] = {ref->o, ref->lse, ref->dq, ref->dk, ref->dv};
  int64_t ns[5] = {cli_o_elems(s), cli_lse_elems(s), cli_q_elems(s), cli_k_elems(s), cli_v_elems(s)};
  int rc = CLI_OK;
  if (worst_abs) *worst_abs = 0;
  if (worst_rel_l2) *worst_rel_l2 = 0;
  if (!quiet)
    printf("%-6s %11s %11s %11s %11s %11s  %-22s %s\n", "output", "max_abs", "mean_abs", "mse", "max_rel", "rel_l2",
           "tolerance (l2, abs)", "result");
  /* The gradients' floor: a tenth of the largest reference gradient RMS (see cli_print_tolerances). */
  double grad_floor = 0;
  for (int i = 2; i < 5; i++) {
    if (!rs[i]) continue;
    double sq = 0;
    for (int64_t j = 0; j < ns[i]; j++) sq += isfinite(rs[i][j]) ? rs[i][j] * rs[i][j] : 0;
    grad_floor = fmax(grad_floor, 0.1 * sqrt(sq / (double)ns[i]));
  }
  for (int i = 0; i < 5; i++) {
    if (!xs[i] || !rs[i]) continue;
    cli_error_stats st;
    cli_compare(xs[i], rs[i], ns[i], i >= 2 ? grad_floor : 0, &st);
    cli_tolerance tol = cli_tolerance_for(dtype, names[i]);
    bool ok = cli_within(&st, tol);
    if (!ok) rc = CLI_CHECK_FAILED;
    if (worst_abs && st.max_abs > *worst_abs) *worst_abs = st.max_abs;
    if (worst_rel_l2 && st.rel_l2 > *worst_rel_l2) *worst_rel_l2 = st.rel_l2;
    if (st.bad && worst_rel_l2) *worst_rel_l2 = INFINITY;
    if (quiet) continue;
    char tols[40];
    snprintf(tols, sizeof tols, "%.0e, %.0e", tol.rel_l2, tol.max_abs);
    printf("%-6s %11.3e %11.3e %11.3e %11.3e %11.3e  %-22s %s", names[i], st.max_abs, st.mean_abs, st.mse, st.max_rel,
           st.rel_l2, tols, ok ? "PASS" : "FAIL");
    if (st.bad) printf(" (%lld NaN/inf elements where the reference is finite)", (long long)st.bad);
    printf("\n");
  }
  return rc;
}
