/* flash.h — what the `cpu` backend's forward (flash.c) and backward (flash_bwd.c) share. */
#ifndef FLASHC_CPU_FLASH_H
#define FLASHC_CPU_FLASH_H

#include "../internal.h"

/* Scores are kept in base 2: S = (scale·log2 e) q·k, so softmax's e^x becomes 2^x (one exp2 per score). */
#define FC_LOG2E 1.4426950408889634f
#define FC_LN2   0.6931471805599453f

/* dq, dk, dv of FlashAttention-2 (flash_bwd.c). */
flashc_status fc_cpu_flash_backward(const fc_problem *p);

/* The way out of fp32. A row of scores that is not finite, from non-finite inputs (NaN, ±inf) or from finite
 * ones whose scores or sums pass fp32's range (a huge scale, values near 3e38), is computed in fp64 as cpu-ref
 * computes it: the forward recomputes such rows one by one, the backward the whole call (ref.c). So `cpu`
 * gives cpu-ref's answer wherever fp32 cannot, at cpu-ref's speed for those rows only. */
/* o and lse of query row i of (sequence s, query head h), from q, k, v. */
void fc_ref_forward_row(const fc_problem *p, int64_t s, int64_t h, int64_t i);
extern const fc_backend fc_backend_cpu_ref;

/* max(m, x), NaN as soon as either is: a NaN, once met, stays (x > NaN is false). */
static inline float fc_max_nan(float m, float x) { return x > m || x != x ? x : m; }

/* Whether all n values are finite: the exponent field of each is not all ones. Branch-free, so that the
 * compiler vectorises it. */
static inline int fc_all_finite(const float *x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t c = 0; c < n; c++) {
    uint32_t b;
    __builtin_memcpy(&b, x + c, sizeof b);
    bad |= (~b & 0x7f800000u) == 0;
  }
  return !bad;
}

#endif /* FLASHC_CPU_FLASH_H */
