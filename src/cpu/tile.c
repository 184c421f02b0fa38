/* tile.c — tiles between the caller's tensors and fp32 scratch, masks, block numbering (see tile.h). */
#include "tile.h"

#include <string.h>

/* fc_f16_to_f32 without branches, so that a row of them vectorises (the f16 tiles are converted once per
 * tile, but a branchy conversion would still cost a third of the forward). Every case is computed and one
 * selected: normal numbers rebias the exponent; inf and NaN get the all-ones exponent; zeros and subnormals
 * are placed as 2^-14·(1 + m/1024) and have 2^-14 subtracted, which is exact. */
static inline float f16_to_f32_branchless(uint16_t h) {
  const uint32_t em = (uint32_t)(h & 0x7fffu) << 13, exp = em & 0x0f800000u;
  const uint32_t normal = em + ((uint32_t)(127 - 15) << 23), special = em + ((uint32_t)(255 - 31) << 23);
  uint32_t small = em + ((uint32_t)(127 - 15 + 1) << 23);
  float f;
  memcpy(&f, &small, 4);
  f -= 0x1p-14f;
  memcpy(&small, &f, 4);
  const uint32_t is_special = 0u - (uint32_t)(exp == 0x0f800000u), is_small = 0u - (uint32_t)(exp == 0);
  uint32_t bits = (special & is_special) | (small & is_small) | (normal & ~(is_special | is_small));
  bits |= (uint32_t)(h & 0x8000u) << 16;
  memcpy(&f, &bits, 4);
  return f;
}

/* out[c] = mul · x[c] for c < d, from a row of `dtype` at element `offset`. The dtype is switched on once
 * per row so that the loops are plain conversions. */
static void load_row(const void *base, flashc_dtype dtype, int64_t offset, int64_t d, float mul, float *out) {
  switch (dtype) {
  case FLASHC_F32: {
    const float *x = (const float *)base + offset;
    for (int64_t c = 0; c < d; c++) out[c] = mul * x[c];
    break;
  }
  case FLASHC_F16: {
    const uint16_t *x = (const uint16_t *)base + offset;
    for (int64_t c = 0; c < d; c++) out[c] = mul * f16_to_f32_branchless(x[c]);
    break;
  }
  case FLASHC_BF16: {
    const uint16_t *x = (const uint16_t *)base + offset;
    for (int64_t c = 0; c < d; c++) out[c] = mul * fc_bf16_to_f32(x[c]);
    break;
  }
  case FLASHC_F64: {
    const double *x = (const double *)base + offset;
    for (int64_t c = 0; c < d; c++) out[c] = mul * (float)x[c];
    break;
  }
  }
}

static void store_row(void *base, flashc_dtype dtype, int64_t offset, int64_t d, float mul, const float *in) {
  switch (dtype) {
  case FLASHC_F32: {
    float *x = (float *)base + offset;
    for (int64_t c = 0; c < d; c++) x[c] = mul * in[c];
    break;
  }
  case FLASHC_F16: {
    uint16_t *x = (uint16_t *)base + offset;
    for (int64_t c = 0; c < d; c++) x[c] = fc_f32_to_f16(mul * in[c]);
    break;
  }
  case FLASHC_BF16: {
    uint16_t *x = (uint16_t *)base + offset;
    for (int64_t c = 0; c < d; c++) x[c] = fc_f32_to_bf16(mul * in[c]);
    break;
  }
  case FLASHC_F64: {
    double *x = (double *)base + offset;
    for (int64_t c = 0; c < d; c++) x[c] = (double)(mul * in[c]);
    break;
  }
  }
}

void fc_tile_load(const fc_problem *p, const fc_view *v, int64_t s, int64_t start, int64_t row0, int64_t rows,
                  int64_t h, float mul, float *dst, int64_t ld) {
  const int64_t d = p->head_dim, dp = fc_pad8(d);
  for (int64_t r = 0; r < rows; r++) {
    float *out = dst + r * ld;
    load_row(v->data, p->dtype, fc_offset(v, s, start, row0 + r, h), d, mul, out);
    for (int64_t c = d; c < dp; c++) out[c] = 0.0f;
  }
}

void fc_tile_load_t(const fc_problem *p, const fc_view *v, int64_t s, int64_t start, int64_t row0, int64_t rows,
                    int64_t h, float mul, float *dst, int64_t ld) {
  const int64_t d = p->head_dim, rows_padded = fc_pad8(rows);
  float row[256]; /* head_dim ≤ 256 on the cpu backend */
  for (int64_t r = 0; r < rows; r++) {
    load_row(v->data, p->dtype, fc_offset(v, s, start, row0 + r, h), d, mul, row);
    for (int64_t c = 0; c < d; c++) dst[c * ld + r] = row[c];
  }
  for (int64_t c = 0; c < d; c++)
    for (int64_t r = rows; r < rows_padded; r++) dst[c * ld + r] = 0.0f;
}

void fc_tile_prefetch(const fc_problem *p, const fc_view *v, int64_t s, int64_t start, int64_t row0, int64_t rows,
                      int64_t h) {
  const int64_t elem = (int64_t)flashc_dtype_size(p->dtype), row_bytes = p->head_dim * elem;
  const char *first = (const char *)v->data + fc_offset(v, s, start, row0, h) * elem;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(first + r * v->stride_s * elem + b);
}

void fc_tile_store(const fc_problem *p, const fc_view *v, int64_t s, int64_t start, int64_t row0, int64_t rows,
                   int64_t h, float mul, const float *src, int64_t ld) {
  for (int64_t r = 0; r < rows; r++)
    store_row(v->data, p->dtype, fc_offset(v, s, start, row0 + r, h), p->head_dim, mul, src + r * ld);
}

void fc_tile_mask(const fc_problem *p, int64_t shift, int64_t sk, int64_t i0, int64_t rows, int64_t j0,
                  int64_t valid_cols, int64_t cols, float *S, int64_t lds) {
  for (int64_t r = 0; r < rows; r++) {
    int64_t lo, hi;
    fc_key_range(p, shift, i0 + r, sk, &lo, &hi);
    /* Row r keeps columns [a, b): its visible keys, within the loaded ones. */
    int64_t a = lo - j0, b = hi - j0;
    if (b > valid_cols) b = valid_cols;
    if (a < 0) a = 0;
    if (a > b) a = b = 0; /* no visible key in this tile: mask the whole row (b ≥ a ≥ 0 from here) */
    float *S_r = S + r * lds;
    for (int64_t c = 0; c < a; c++) S_r[c] = -INFINITY;
    for (int64_t c = b; c < cols; c++) S_r[c] = -INFINITY;
  }
}

void fc_blocks_init(fc_blocks *b, const int32_t *cu_seqlens, int64_t batch, int64_t seqlen, int64_t size,
                    int64_t *first_storage) {
  b->size = size;
  b->batch = batch;
  if (!cu_seqlens) {
    b->first = NULL;
    b->per_seq = (seqlen + size - 1) / size;
    b->total = batch * b->per_seq;
    return;
  }
  first_storage[0] = 0;
  for (int64_t s = 0; s < batch; s++) {
    const int64_t len = (int64_t)cu_seqlens[s + 1] - cu_seqlens[s];
    first_storage[s + 1] = first_storage[s] + (len + size - 1) / size;
  }
  b->first = first_storage;
  b->per_seq = 0;
  b->total = first_storage[batch];
}

void fc_blocks_find(const fc_blocks *b, int64_t g, int64_t *s, int64_t *block) {
  if (!b->first) {
    *s = g / b->per_seq;
    *block = g % b->per_seq;
    return;
  }
  /* Bisect for the last sequence whose first block is ≤ g: that passes over the empty sequences before it,
   * which share its first[]. Invariant: first[lo] ≤ g < first[hi]. */
  int64_t lo = 0, hi = b->batch;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (b->first[mid] <= g)
      lo = mid;
    else
      hi = mid;
  }
  *s = lo;
  *block = g - b->first[lo];
}
