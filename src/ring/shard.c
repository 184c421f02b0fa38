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
  if (seqlen < 1 || seqlen % parts)
    return INVALID("%s: seqlen %lld is not a positive multiple of %lld (%s layout over %d ranks)", op,
                   (long long)seqlen, (long long)parts, layout_name(layout), world);
  *len = seqlen / world;
  return FLASHC_OK;
}

/* Copy rows of `seg` between the whole tensor and the shard; to_shard picks the direction. */
static flashc_status move_rows(const char *op, flashc_ring_layout layout, int world, int rank,
                               const flashc_tensor *full, const flashc_tensor *shard, int to_shard) {
  if (!full || !shard || !full->data || !shard->data)
    return INVALID("%s: %s is NULL", op, !full || !full->data ? "full" : "shard");
  if (full->dtype != shard->dtype)
    return INVALID("%s: shard.dtype is %s but full.dtype is %s", op, flashc_dtype_name(shard->dtype),
                   flashc_dtype_name(full->dtype));
  size_t es = flashc_dtype_size(full->dtype);
  if (es == 0) return INVALID("%s: dtype %d is not a flashc_dtype", op, (int)full->dtype);
  int64_t len;
  FC_CHECK(local_len(op, layout, world, rank, full->size[1], &len));
  if (shard->size[0] != full->size[0] || shard->size[1] != len || shard->size[2] != full->size[2] ||
      shard->size[3] != full->size[3])
    return INVALID("%s: shard is [%lld, %lld, %lld, %lld] but rank %d of %d needs [%lld, %lld, %lld, %lld]", op,
                   (long long)shard->size[0], (long long)shard->size[1], (long long)shard->size[2],
                   (long long)shard->size[3], rank, world, (long long)full->size[0], (long long)len,
                   (long long)full->size[2], (long long)full->size[3]);
  for (int d = 0; d < 4; d++)
    if (full->stride[d] < 0 || shard->stride[d] < 0) return INVALID("%s: stride[%d] is negative", op, d);
  if ((full->stride[3] != 1 && full->size[3] > 1) || (shard->stride[3] != 1 && shard->size[3] > 1))
    return INVALID("%s: stride[3] (head_dim) must be 1", op);
  fc_ring_seg seg[2];
  int ns = fc_ring_segments(layout, world, rank, len, seg);
  size_t row_bytes = (size_t)full->size[3] * es;
  for (int i = 0; i < ns; i++)
    for (int64_t b = 0; b < full->size[0]; b++)
      for (int64_t s = 0; s < seg[i].len; s++)
        for (int64_t h = 0; h < full->size[2]; h++) {
          char *f = (char *)full->data +
                    (b * full->stride[0] + (seg[i].global0 + s) * full->stride[1] + h * full->stride[2]) * (int64_t)es;
          char *l = (char *)shard->data +
                    (b * shard->stride[0] + (seg[i].row0 + s) * shard->stride[1] + h * shard->stride[2]) * (int64_t)es;
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

static flashc_status move_lse(const char *op, flashc_ring_layout layout, int world, int rank, int64_t batch,
                              int64_t heads, int64_t seqlen, float *full, float *shard, int to_shard) {
  if (!full || !shard) return INVALID("%s: %s is NULL", op, !full ? "full" : "shard");
  if (batch < 1 || heads < 1)
    return INVALID("%s: batch %lld and heads %lld must be >= 1", op, (long long)batch, (long long)heads);
  int64_t len;
  FC_CHECK(local_len(op, layout, world, rank, seqlen, &len));
  fc_ring_seg seg[2];
  int ns = fc_ring_segments(layout, world, rank, len, seg);
  for (int64_t bh = 0; bh < batch * heads; bh++)
    for (int i = 0; i < ns; i++) {
      float *f = full + bh * seqlen + seg[i].global0, *l = shard + bh * len + seg[i].row0;
      memcpy(to_shard ? l : f, to_shard ? f : l, (size_t)seg[i].len * sizeof(float));
    }
  return FLASHC_OK;
}

flashc_status flashc_ring_shard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                    int64_t seqlen, const float *full, float *shard) {
  return move_lse("flashc_ring_shard_lse", layout, world, rank, batch, heads, seqlen, (float *)full, shard, 1);
}

flashc_status flashc_ring_unshard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                      int64_t seqlen, const float *shard, float *full) {
  return move_lse("flashc_ring_unshard_lse", layout, world, rank, batch, heads, seqlen, full, (float *)shard, 0);
}
