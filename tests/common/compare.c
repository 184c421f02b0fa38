/* compare.c — error metrics and FlashAttention's rule: a backend may be at most k times as wrong as the
 * plain low-precision computation, plus a floor. */
#include "harness.h"

#include <math.h>
#include <stdio.h>

th_err th_compare(const double *x, const double *ref, int64_t n) {
  th_err e = {0, 0, 0, 0, 0, 0};
  e.ref_max = th_abs_max(ref, n);
  /* Relative error near a zero of the reference says nothing; measure it against a thousandth of the
   * tensor's magnitude at least. */
  double rel_floor = e.ref_max > 0 ? 1e-3 * e.ref_max : 1e-300;
  double sum_abs = 0, sum_sq = 0, ref_sq = 0;
  int64_t counted = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(x[i]) && isinf(ref[i]) && (x[i] > 0) == (ref[i] > 0)) continue; /* −inf lse on both sides */
    if (!isfinite(x[i]) || !isfinite(ref[i])) {
      e.mismatched_inf++;
      continue;
    }
    double d = fabs(x[i] - ref[i]);
    if (d > e.max_abs) e.max_abs = d;
    double r = d / fmax(fabs(ref[i]), rel_floor);
    if (r > e.max_rel) e.max_rel = r;
    sum_abs += d;
    sum_sq += d * d;
    ref_sq += ref[i] * ref[i];
    counted++;
  }
  e.mean_abs = counted ? sum_abs / (double)counted : 0;
  e.rel_l2 = ref_sq > 0 ? sqrt(sum_sq / ref_sq) : sqrt(sum_sq);
  if (e.mismatched_inf) e.max_abs = INFINITY;
  return e;
}

double th_abs_max(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

th_verdict th_judge(const double *x, const double *base, const double *ref, int64_t n, double k, double floor_abs) {
  th_verdict v;
  v.err = th_compare(x, ref, n);
  if (base) {
    v.base = th_compare(base, ref, n);
  } else {
    th_err zero = {0, 0, 0, 0, v.err.ref_max, 0};
    v.base = zero;
  }
  v.tol = k * v.base.max_abs + floor_abs;
  /* A non-finite baseline would make the tolerance infinite: that is a harness bug, so it fails too. */
  v.pass = v.err.mismatched_inf == 0 && v.base.mismatched_inf == 0 && v.err.max_abs <= v.tol;
  return v;
}

void th_format_verdict(char *buf, size_t len, const char *name, const th_verdict *v) {
  snprintf(buf, len, "%s %.2e<=%.2e (base %.2e, mean %.1e, rel %.1e, l2 %.1e%s)", name, v->err.max_abs, v->tol,
           v->base.max_abs, v->err.mean_abs, v->err.max_rel, v->err.rel_l2,
           v->err.mismatched_inf ? ", non-finite mismatch" : "");
}
