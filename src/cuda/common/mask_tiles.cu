/* common/mask_tiles.cu — the pass that classifies a boolean attn_mask's blocks (the design: common/mask_tiles.cuh). */
#include "common/mask_tiles.cuh"

/* The shape of the stored tiles, without their memory. */
static void fc_mask_tiles_shape(const fc_problem *p, int bm, int bn, fc_mask_tiles *t) {
  const int64_t *st = p->attn_mask_stride;
  t->bm = bm, t->bn = bn;
  t->nqb = (int)fc_cdiv(p->seqlen_q, bm);
  t->nkb = (int)fc_cdiv(p->seqlen_k, bn);
  t->nqi = st[2] != 0 ? t->nqb : 1;
  t->per_b = st[0] != 0 && p->batch > 1;
  t->per_h = st[1] != 0 && p->heads_q > 1;
  t->planes_h = t->per_h ? (int)p->heads_q : 1;
}

static int64_t fc_mask_tiles_planes(const fc_problem *p, const fc_mask_tiles *t) {
  return (t->per_b ? p->batch : 1) * t->planes_h;
}

static size_t fc_round256_mt(size_t x) { return (x + 255) & ~(size_t)255; }

extern "C" size_t fc_mask_tiles_bytes(const fc_problem *p, int bm, int bn) {
  if (!p->attn_mask || !p->attn_mask_is_bool) return 0;
  fc_mask_tiles t;
  fc_mask_tiles_shape(p, bm, bn, &t);
  const size_t planes = (size_t)fc_mask_tiles_planes(p, &t);
  return fc_round256_mt(planes * t.nqi * t.nkb) + fc_round256_mt(planes * t.nqi * sizeof(int2)) +
         planes * t.nkb * sizeof(int2);
}

/* One CTA per block (a grid-stride loop over them): whether its pairs inside the problem keep any, and all. With a
 * query stride of 0 every row is row 0, so a block reads one row. */
__global__ void fc_mask_tiles_kernel(uint8_t *cls, const uint8_t *mask, int64_t s0, int64_t s1, int64_t s2, int64_t s3,
                                     fc_mask_tiles t, int64_t n_tiles, int sq, int sk) {
  for (int64_t tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
    const int kb = (int)(tile % t.nkb);
    const int64_t row = tile / t.nkb; /* plane · nqi + qi */
    const int qi = (int)(row % t.nqi);
    const int64_t plane = row / t.nqi;
    const int64_t b = t.per_b ? plane / t.planes_h : 0, h = t.per_h ? plane % t.planes_h : 0;
    const int r0 = qi * t.bm, k0 = kb * t.bn;
    const int rows = s2 == 0 ? 1 : min(t.bm, sq - r0), cols = min(t.bn, sk - k0);
    const uint8_t *base = mask + b * s0 + h * s1 + (int64_t)r0 * s2 + (int64_t)k0 * s3;
    int any = 0, all = 1;
    for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
      const int keep = __ldg(base + (int64_t)(e / cols) * s2 + (int64_t)(e % cols) * s3) != 0;
      any |= keep, all &= keep;
    }
    any = __syncthreads_or(any);
    all = __syncthreads_and(all);
    if (threadIdx.x == 0) cls[tile] = all ? FC_MT_ALL : any ? FC_MT_SOME : FC_MT_NONE;
  }
}

/* The ranges: one thread per row of blocks (row_range: key blocks that keep any) and per column (col_range: query
 * blocks), each a scan of its classes. */
__global__ void fc_mask_ranges_kernel(const uint8_t *cls, int2 *row_range, int2 *col_range, fc_mask_tiles t,
                                      int64_t planes) {
  const int64_t n_rows = planes * t.nqi, n = n_rows + planes * t.nkb;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int lo = 0, hi = 0;
    bool seen = false;
    if (i < n_rows) {
      const uint8_t *c = cls + i * t.nkb;
      for (int kb = 0; kb < t.nkb; kb++)
        if (c[kb] != FC_MT_NONE) {
          if (!seen) lo = kb, seen = true;
          hi = kb + 1;
        }
      row_range[i] = make_int2(lo, hi);
    } else {
      const int64_t j = i - n_rows, plane = j / t.nkb;
      const int kb = (int)(j % t.nkb);
      for (int qb = 0; qb < t.nqb; qb++)
        if (cls[(plane * t.nqi + (t.nqi > 1 ? qb : 0)) * t.nkb + kb] != FC_MT_NONE) {
          if (!seen) lo = qb, seen = true;
          hi = qb + 1;
        }
      col_range[j] = make_int2(lo, hi);
    }
  }
}

extern "C" flashc_status fc_mask_tiles_build(const fc_problem *p, int bm, int bn, void *ws, fc_mask_tiles *t) {
  if (!p->attn_mask || !p->attn_mask_is_bool)
    return fc_error(FLASHC_ERR_INTERNAL, "fc_mask_tiles_build: the call has no boolean attn_mask");
  fc_mask_tiles_shape(p, bm, bn, t);
  const int64_t planes = fc_mask_tiles_planes(p, t), n_tiles = planes * t->nqi * t->nkb;
  uint8_t *cls = (uint8_t *)ws;
  int2 *row_range = (int2 *)(cls + fc_round256_mt((size_t)n_tiles));
  int2 *col_range = (int2 *)((uint8_t *)row_range + fc_round256_mt((size_t)(planes * t->nqi) * sizeof(int2)));
  t->cls = cls, t->row_range = row_range, t->col_range = col_range;
  if (n_tiles == 0) return FLASHC_OK;
  const int64_t *st = p->attn_mask_stride;
  const unsigned blocks = (unsigned)(n_tiles < 65536 ? n_tiles : 65536);
  fc_mask_tiles_kernel<<<blocks, 256, 0, fc_stream(p)>>>(cls, (const uint8_t *)p->attn_mask, st[0], st[1], st[2], st[3],
                                                         *t, n_tiles, (int)p->seqlen_q, (int)p->seqlen_k);
  FC_LAUNCH_CHECK("fc_mask_tiles_kernel");
  const int64_t n_ranges = planes * (t->nqi + t->nkb);
  fc_mask_ranges_kernel<<<(unsigned)fc_cdiv(n_ranges < 65536 * 256 ? n_ranges : 65536 * 256, 256), 256, 0,
                          fc_stream(p)>>>(cls, row_range, col_range, *t, planes);
  FC_LAUNCH_CHECK("fc_mask_ranges_kernel");
  return FLASHC_OK;
}
