/* shard.c — which rows of the whole sequence a rank holds (contiguous or zigzag), and the host helpers that
 * cut a whole tensor into a rank's shard and put a shard back. */
#include "ring.h"

#include <string.h>

#define INVALID(...) fc_error(FLASHC_ERR_INVALID_ARGUMENT, __VA_ARGS__)

int fc_ring_segments(flashc_ring_layout layout, int world, int rank, int64_t len, fc_ring_seg seg[2]) {
  if (world < 1 || rank < 0 || rank >= world || len < 1) return 0;
  switch (layout) {
  case FLASHC_RING_CONTIGUOUS: seg[0] = (fc_ring_seg){0, len, (int64_t)rank * len}; return 1;
  case FLASHC_RING_ZIGZAG: {
    /* 2N chunks of C rows: rank r holds chunk r (rows [r·C, (r+1)·C)) and chunk 2N−1−r, so under a causal
     * mask rank r's queries see r + (2N−1−r) + 1 = 2N chunk pairs' worth of keys, the same on every rank. */
    if (len % 2) return 0;
    int64_t c = len / 2;
    seg[0] = (fc_ring_seg){0, c, (int64_t)rank * c};
    seg[1] = (fc_ring_seg){c, c, (int64_t)(2 * world - 1 - rank) * c};
    return 2;
  }
  }
  return 0;
}

static const char *layout_name(flashc_ring_layout layout) {
  return layout == FLASHC_RING_CONTIGUOUS ? "contiguous" : layout == FLASHC_RING_ZIGZAG ? "zigzag" : "unknown";
}

/* The local seqlen of a whole sequence of `seqlen` rows, or an error naming why it does not split. */
static flashc_status local_len(const char *op, flashc_ring_layout layout, int world, int rank, int64_t seqlen,
                               int64_t *len) {
  if (layout != FLASHC_RING_CONTIGUOUS && layout != FLASHC_RING_ZIGZAG)
    return INVALID("%s: layout %d is not a flashc_ring_layout", op, (int)layout);
  if (world < 1) return INVALID("%s: world is %d; it must be >= 1", op, world);
  if (rank < 0 || rank >= world) return INVALID("%s: rank %d is outside [0, %d)", op, rank, world);
  int64_t parts = layout == FLASHC_RING_ZIGZAG ? 2 * (int64_t)world : world;
  if (seqlen % parts)
    return INVALID("%s: seqlen %lld is not a multiple of %lld (%s layout over %d ranks)", op, (long long)seqlen,
                   (long long)parts, layout_name(layout), world);
  *len = seqlen / world;
  return FLASHC_OK;
}

/* Copy the rows of this rank's segments between the whole tensor and the shard; to_shard picks the direction.
 * Both views pass the checks of flashc_forward's tensors (fc_check_tensor: sizes, strides, offsets that fit,
 * NULL data only for an empty view, alignment), and the one written must not overlap itself or the other. */
static flashc_status move_rows(const char *op, flashc_ring_layout layout, int world, int rank,
                               const flashc_tensor *full, const flashc_tensor *shard, int to_shard) {
  int64_t full_span, shard_span;
  FC_CHECK(fc_check_tensor(op, "full", full, &full_span));
  FC_CHECK(fc_check_tensor(op, "shard", shard, &shard_span));
  if (full->dtype != shard->dtype)
    return INVALID("%s: shard.dtype is %s but full.dtype is %s", op, flashc_dtype_name(shard->dtype),
                   flashc_dtype_name(full->dtype));
  int64_t len = 0;
  FC_CHECK(local_len(op, layout, world, rank, full->size[1], &len));
  if (shard->size[0] != full->size[0] || shard->size[1] != len || shard->size[2] != full->size[2] ||
      shard->size[3] != full->size[3])
    return INVALID("%s: shard is [%lld, %lld, %lld, %lld] but rank %d of %d needs [%lld, %lld, %lld, %lld]", op,
                   (long long)shard->size[0], (long long)shard->size[1], (long long)shard->size[2],
                   (long long)shard->size[3], rank, world, (long long)full->size[0], (long long)len,
                   (long long)full->size[2], (long long)full->size[3]);
  const flashc_tensor *out = to_shard ? shard : full, *in = to_shard ? full : shard;
  FC_CHECK(fc_check_no_self_overlap(op, to_shard ? "shard" : "full", out));
  FC_CHECK(fc_check_disjoint(op, to_shard ? "shard" : "full", out, to_shard ? shard_span : full_span,
                             to_shard ? "full" : "shard", in, to_shard ? full_span : shard_span));
  fc_ring_seg seg[2];
  int ns = fc_ring_segments(layout, world, rank, len, seg); /* 0 when len is 0: nothing to copy */
  const int64_t es = (int64_t)flashc_dtype_size(full->dtype);
  const size_t row_bytes = (size_t)(full->size[3] * es);
  /* Every offset below is at most its view's span (checked above), so none overflows. Heads outside rows:
   * an lse (seqlen stride 1) copies runs of consecutive rows. */
  for (int i = 0; i < ns; i++)
    for (int64_t b = 0; b < full->size[0]; b++)
      for (int64_t h = 0; h < full->size[2]; h++)
        for (int64_t s = 0; s < seg[i].len; s++) {
          char *f = (char *)full->data +
                    (b * full->stride[0] + (seg[i].global0 + s) * full->stride[1] + h * full->stride[2]) * es;
          char *l = (char *)shard->data +
                    (b * shard->stride[0] + (seg[i].row0 + s) * shard->stride[1] + h * shard->stride[2]) * es;
          if (to_shard)
            memcpy(l, f, row_bytes);
          else
            memcpy(f, l, row_bytes);
        }
  return FLASHC_OK;
}

flashc_status flashc_ring_shard(flashc_ring_layout layout, int world, int rank, const flashc_tensor *full,
                                flashc_tensor *shard) {
  return move_rows("flashc_ring_shard", layout, world, rank, full, shard, 1);
}

flashc_status flashc_ring_unshard(flashc_ring_layout layout, int world, int rank, const flashc_tensor *shard,
                                  flashc_tensor *full) {
  return move_rows("flashc_ring_unshard", layout, world, rank, full, shard, 0);
}

/* lse [batch, heads, seqlen], contiguous fp32, as a tensor [batch, seqlen, heads, 1], so that move_rows and its
 * checks serve it too. Sizes that overflow saturate the strides, which fc_check_tensor then reports. */
static flashc_tensor lse_view(const float *lse, int64_t batch, int64_t heads, int64_t seqlen) {
  int64_t hs;
  if (!fc_mul_ok(heads, seqlen, &hs)) hs = INT64_MAX;
  flashc_tensor t = {(void *)lse, FLASHC_F32, {batch, seqlen, heads, 1}, {hs, 1, seqlen, 1}};
  return t;
}

static flashc_status move_lse(const char *op, flashc_ring_layout layout, int world, int rank, int64_t batch,
                              int64_t heads, int64_t seqlen, const float *full, const float *shard, int to_shard) {
  /* The shard's seqlen is the local one; an invalid layout, world or rank is reported by move_rows. */
  int64_t parts = layout == FLASHC_RING_ZIGZAG ? 2 * (int64_t)world : world;
  int64_t len = world >= 1 && seqlen >= 0 && seqlen % parts == 0 ? seqlen / world : 0;
  flashc_tensor f = lse_view(full, batch, heads, seqlen), l = lse_view(shard, batch, heads, len);
  return move_rows(op, layout, world, rank, &f, &l, to_shard);
}

flashc_status flashc_ring_shard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                    int64_t seqlen, const float *full, float *shard) {
  return move_lse("flashc_ring_shard_lse", layout, world, rank, batch, heads, seqlen, full, shard, 1);
}

flashc_status flashc_ring_unshard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                      int64_t seqlen, const float *shard, float *full) {
  return move_lse("flashc_ring_unshard_lse", layout, world, rank, batch, heads, seqlen, full, shard, 0);
}
