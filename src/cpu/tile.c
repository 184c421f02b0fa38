/* tile.c — tiles between the caller's tensors and fp32 scratch, masks, block numbering (see tile.h). */
#include "tile.h"

#include "../philox.h"

#include <string.h>

/* y[c] = mul · x[c] for c < n, x being n values of the caller's dtype at element `offset` of `base`. */
void fc_tile_load_run(const fc_cpu_kernels *kern, flashc_dtype dtype, const void *base, int64_t offset, int64_t n,
                      float mul, float *y) {
  switch (dtype) {
  case FLASHC_F32: kern->load_f32((const float *)base + offset, y, n, mul); break;
  case FLASHC_F16: kern->load_f16((const uint16_t *)base + offset, y, n, mul); break;
  case FLASHC_BF16: kern->load_bf16((const uint16_t *)base + offset, y, n, mul); break;
  case FLASHC_F64: /* not a dtype of the `cpu` backend; kept total for safety */
    for (int64_t c = 0; c < n; c++) y[c] = mul * (float)((const double *)base)[offset + c];
    break;
  }
}

static int64_t row_offset(const fc_rows *at, int64_t r) {
  return fc_offset(at->v, at->s, at->start, at->row0 + r, at->h);
}

void fc_tile_load(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ld) {
  const int64_t d = fc_row_dim(p, at.v), dp = fc_pad8(d);
  for (int64_t r = 0; r < at.rows; r++) {
    float *out = dst + r * ld;
    fc_tile_load_run(kern, p->dtype, at.v->data, row_offset(&at, r), d, mul, out);
    for (int64_t c = d; c < dp; c++) out[c] = 0.0f;
  }
}

void fc_tile_pack_t(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ps) {
  const int64_t d = fc_row_dim(p, at.v), nr = kern->nr;
  if (p->dtype == FLASHC_F32 && mul == 1.0f && at.rows > 0) {
    /* Nothing to convert: a panel's rows are transposed straight from the caller's (rows of one head are
     * stride_s apart, fc_offset). */
    const float *src = (const float *)at.v->data + row_offset(&at, 0);
    for (int64_t r0 = 0; r0 < at.rows; r0 += nr)
      kern->transpose(src + r0 * at.v->stride_s, at.v->stride_s, at.rows - r0 < nr ? at.rows - r0 : nr, d,
                      dst + r0 / nr * ps, nr);
  } else {
    /* Eight rows at a time, converted into fp32 rows, then transposed into their panel in 8 × 8 blocks: eight
     * consecutive rows from a multiple of 8 lie in one panel (nr is a multiple of 8). */
    enum { LD = 512 }; /* head_dim ≤ 256 and head_dim_v ≤ 512 on the cpu backend */
    float rows8[8 * LD];
    for (int64_t r0 = 0; r0 < at.rows; r0 += 8) {
      const int64_t n = at.rows - r0 < 8 ? at.rows - r0 : 8;
      for (int64_t i = 0; i < n; i++)
        fc_tile_load_run(kern, p->dtype, at.v->data, row_offset(&at, r0 + i), d, mul, rows8 + i * LD);
      kern->transpose(rows8, LD, n, d, dst + r0 / nr * ps + r0 % nr, nr);
    }
  }
  const int64_t tail = at.rows % nr; /* the last panel's rows past the tile: zero, a run of floats per column */
  if (tail)
    for (int64_t c = 0; c < d; c++)
      memset(dst + at.rows / nr * ps + c * nr + tail, 0, (size_t)(nr - tail) * sizeof *dst);
}

void fc_tile_pack(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ps) {
  const int64_t d = fc_row_dim(p, at.v), nr = kern->nr, cols = fc_round_up(d, nr);
  for (int64_t r = 0; r < at.rows; r++) {
    const int64_t offset = row_offset(&at, r);
    for (int64_t c0 = 0; c0 < cols; c0 += nr) {
      float *out = dst + c0 / nr * ps + r * nr;
      const int64_t n = d - c0 < nr ? d - c0 : nr;
      fc_tile_load_run(kern, p->dtype, at.v->data, offset + c0, n, mul, out);
      for (int64_t c = n; c < nr; c++) out[c] = 0.0f;
    }
  }
}

void fc_tile_store(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, const float *src,
                   int64_t ld) {
  const int64_t d = fc_row_dim(p, at.v);
  for (int64_t r = 0; r < at.rows; r++) {
    const float *in = src + r * ld;
    const int64_t offset = row_offset(&at, r);
    switch (p->dtype) {
    case FLASHC_F32: kern->store_f32(in, (float *)at.v->data + offset, d, mul); break;
    case FLASHC_F16: kern->store_f16(in, (uint16_t *)at.v->data + offset, d, mul); break;
    case FLASHC_BF16: kern->store_bf16(in, (uint16_t *)at.v->data + offset, d, mul); break;
    case FLASHC_F64:
      for (int64_t c = 0; c < d; c++) ((double *)at.v->data)[offset + c] = (double)(mul * in[c]);
      break;
    }
  }
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

void fc_tile_score_mods(const fc_score_mods *m, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float *S,
                        int64_t lds, float *T) {
  for (int64_t r = 0; r < rows; r++) {
    float *S_r = S + r * lds;
    if (m->cap2 != 0.0f) {
      float *T_r = T ? T + r * lds : NULL;
      for (int64_t c = 0; c < cols; c++) {
        const float t = tanhf(S_r[c]);
        if (T_r) T_r[c] = t;
        S_r[c] = m->cap2 * t;
      }
    }
    if (m->slope2 != 0.0f) {
      const int64_t diag = i0 + r + m->sk - m->sq - j0; /* |diag − c| is the distance of key j0 + c */
      for (int64_t c = 0; c < cols; c++) S_r[c] -= m->slope2 * (float)(diag > c ? diag - c : c - diag);
    }
  }
}

void fc_tile_attn_mask(const fc_cpu_kernels *kern, const fc_problem *p, int64_t s, int64_t h, int64_t i0, int64_t rows,
                       int64_t j0, int64_t cols, float *S, int64_t lds) {
  const int64_t *st = p->attn_mask_stride;
  enum { CHUNK = 256 }; /* a bias row converted at a time: the widest key block of either pass */
  float bias[CHUNK];
  for (int64_t r = 0; r < rows; r++) {
    const int64_t at = fc_attn_mask_offset(st, s, h, i0 + r, j0);
    float *S_r = S + r * lds;
    if (p->attn_mask_is_bool) {
      const uint8_t *m = (const uint8_t *)p->attn_mask + at;
      for (int64_t c = 0; c < cols; c++) S_r[c] = m[c * st[3]] ? S_r[c] : -INFINITY;
    } else if (st[3] == 1) { /* a contiguous row: the SIMD conversion, log2 e applied on the way */
      for (int64_t c0 = 0; c0 < cols; c0 += CHUNK) {
        const int64_t n = cols - c0 < CHUNK ? cols - c0 : CHUNK;
        fc_tile_load_run(kern, p->dtype, p->attn_mask, at + c0, n, 1.4426950408889634f, bias);
        for (int64_t c = 0; c < n; c++) S_r[c0 + c] += bias[c];
      }
    } else {
      for (int64_t c = 0; c < cols; c++)
        S_r[c] += 1.4426950408889634f * (float)fc_load(p->attn_mask, p->dtype, at + c * st[3]);
    }
  }
}

bool fc_attn_mask_removes_all(const fc_problem *p, int64_t s, int64_t h, int64_t i, int64_t lo, int64_t hi) {
  if (!p->attn_mask) return false;
  const int64_t at = fc_attn_mask_offset(p->attn_mask_stride, s, h, i, 0), st = p->attn_mask_stride[3];
  for (int64_t j = lo; j < hi; j++)
    if (p->attn_mask_is_bool ? ((const uint8_t *)p->attn_mask)[at + j * st] != 0
                             : fc_load(p->attn_mask, p->dtype, at + j * st) != -INFINITY)
      return false;
  return true;
}

void fc_dropout_keep_row(const fc_problem *p, int64_t s, int64_t h, int64_t sk, int64_t i, int64_t j0, int64_t n,
                         uint8_t *keep) {
  /* Philox4x32-10 (philox.h) on up to LANES blocks side by side, one array per counter word, so that each round is
   * a loop over independent lanes the compiler vectorises (32 × 32 → 64-bit products); the same bits as
   * fc_philox4x32_10 (tests/test_dropout.c compares them). Block x of the row serves keys 8x .. 8x + 7. */
  enum { LANES = 16 };
  const uint64_t bh = (uint64_t)(s * p->heads_q + h), row = (uint64_t)i * fc_dropout_row_blocks(sk);
  const uint32_t T = p->dropout_threshold << 16; /* fc_dropout_block_bits' comparison */
  const int64_t j_end = j0 + n;
  for (int64_t x0 = j0 / FC_DROPOUT_KEYS; x0 * FC_DROPOUT_KEYS < j_end; x0 += LANES) {
    uint32_t c0[LANES], c1[LANES], c2[LANES], c3[LANES];
    for (int b = 0; b < LANES; b++) {
      const uint64_t c = p->dropout_offset + row + (uint64_t)(x0 + b);
      c0[b] = (uint32_t)c, c1[b] = (uint32_t)(c >> 32), c2[b] = (uint32_t)bh, c3[b] = (uint32_t)(bh >> 32);
    }
    uint32_t k0 = (uint32_t)p->dropout_seed, k1 = (uint32_t)(p->dropout_seed >> 32);
    for (int r = 0; r < 10; r++) {
      if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
      for (int b = 0; b < LANES; b++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0[b], p1 = (uint64_t)0xCD9E8D57u * c2[b];
        const uint32_t n0_ = (uint32_t)(p1 >> 32) ^ c1[b] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[b] ^ k1;
        c1[b] = (uint32_t)p1, c3[b] = (uint32_t)p0, c0[b] = n0_, c2[b] = n2;
      }
    }
    for (int b = 0; b < LANES; b++) {
      const uint32_t u[4] = {c0[b], c1[b], c2[b], c3[b]};
      for (int k = 0; k < FC_DROPOUT_KEYS; k++) { /* half k: word k/2, low half first */
        const int64_t j = (x0 + b) * FC_DROPOUT_KEYS + k;
        if (j >= j0 && j < j_end) keep[j - j0] = (k & 1 ? u[k / 2] : u[k / 2] << 16) >= T;
      }
    }
  }
}

void fc_dropout_apply(const uint8_t *keep, int64_t n, float mul, float *x) {
  for (int64_t c = 0; c < n; c++) x[c] *= keep[c] ? mul : 0.0f;
}

/* Rows of sequence s on one side: its used rows (fc_seq_q/k). */
static int64_t seq_rows(const fc_problem *p, int keys, int64_t s) {
  int64_t start, len;
  if (keys)
    fc_seq_k(p, s, &start, &len);
  else
    fc_seq_q(p, s, &start, &len);
  return len;
}

int64_t fc_blocks_count(const fc_problem *p, int keys, int64_t size) {
  if (!p->cu_seqlens_q) return p->batch * (((keys ? p->seqlen_k : p->seqlen_q) + size - 1) / size);
  int64_t n = 0;
  for (int64_t s = 0; s < p->batch; s++) n += (seq_rows(p, keys, s) + size - 1) / size;
  return n;
}

void fc_blocks_init(fc_blocks *b, const fc_problem *p, int keys, int64_t size, int64_t *first_storage) {
  const int64_t batch = p->batch;
  b->size = size;
  b->batch = batch;
  if (!p->cu_seqlens_q) {
    b->first = NULL;
    b->per_seq = ((keys ? p->seqlen_k : p->seqlen_q) + size - 1) / size;
    b->total = batch * b->per_seq;
    return;
  }
  first_storage[0] = 0;
  for (int64_t s = 0; s < batch; s++)
    first_storage[s + 1] = first_storage[s] + (seq_rows(p, keys, s) + size - 1) / size;
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
