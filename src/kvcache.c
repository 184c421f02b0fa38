/*
 * kvcache.c — flashc_forward_kvcache: every check of a KV cache call, the choice of backend, the host append.
 *
 * The order is that of flashc_forward: the arguments alone (tensors, shapes, params; no data is read), then
 * where the data lives and which backend takes the call, then, for a host backend, the host data that says
 * where the cache rows are (cache_seqlens, block_table): every length and every block index the call will use,
 * and that no appended row is a row another sequence uses. Only then is anything written. A CUDA backend's tables
 * are device memory that the host cannot read without waiting for the GPU: they are never dereferenced here, and
 * its kernels check them instead (src/cuda/mma/decode.cu; the problem's seqlen_k stays the capacity). Tensor checks are
 * validate.c's (fc_check_tensor, fc_check_no_self_overlap, fc_check_disjoint); messages name
 * flashc_forward_kvcache and the offending value.
 */
#include "kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const OP = "flashc_forward_kvcache";
#define INVALID(...) fc_error(FLASHC_ERR_INVALID_ARGUMENT, __VA_ARGS__)

static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};

/* ---- the caller's structs ------------------------------------------------------------------------------ */
/* As fc_params_read: the fields the caller's struct_size covers over the defaults. */
static flashc_status read_cache(const flashc_kvcache *cache, flashc_kvcache *out) {
  *out = flashc_kvcache_default();
  if (!cache) return INVALID("%s: cache is NULL", OP);
  const size_t size = cache->struct_size;
  if (size < sizeof(size_t))
    return INVALID("%s: cache.struct_size is %zu: build the cache struct with flashc_kvcache_default()", OP, size);
  if (size > sizeof(flashc_kvcache))
    return INVALID("%s: cache.struct_size is %zu, more than this library's flashc_kvcache (%zu bytes): the caller "
                   "was built against a newer flashc.h than this library (%s)",
                   OP, size, sizeof(flashc_kvcache), flashc_version_string());
  memcpy((char *)out + sizeof(size_t), (const char *)cache + sizeof(size_t), size - sizeof(size_t));
  out->struct_size = sizeof(flashc_kvcache);
  return FLASHC_OK;
}

/* The params this call takes: scale, causal, align, windows. The rest belongs to other calls and is refused
 * rather than ignored. */
static flashc_status check_params(const flashc_params *pa) {
  if (!isfinite(pa->scale)) return INVALID("%s: params.scale is not finite", OP);
  if (pa->causal != 0 && pa->causal != 1) return INVALID("%s: params.causal is %d; use 0 or 1", OP, pa->causal);
  if (pa->align != FLASHC_ALIGN_BOTTOM_RIGHT && pa->align != FLASHC_ALIGN_TOP_LEFT)
    return INVALID("%s: params.align %d is not a flashc_causal_align", OP, (int)pa->align);
  if (pa->deterministic != 0 && pa->deterministic != 1)
    return INVALID("%s: params.deterministic is %d; use 0 or 1", OP, pa->deterministic);
  if (pa->cu_seqlens_q || pa->cu_seqlens_k || pa->num_seqs || pa->seqused_q || pa->seqused_k)
    return INVALID("%s: params.cu_seqlens_q/k, num_seqs and seqused_q/k are for packed (varlen) calls; a KV cache "
                   "call takes its lengths from cache.cache_seqlens",
                   OP);
  if (pa->num_splits != 0)
    return INVALID("%s: params.num_splits is %d; a KV cache call takes its splits from cache.num_splits", OP,
                   pa->num_splits);
  if (pa->softcap != 0.0f || pa->alibi_slopes || pa->attn_mask || pa->dropout_p != 0.0f || pa->dropout_mask)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: params.%s is not supported with a KV cache yet", OP,
                    pa->softcap != 0.0f ? "softcap"
                    : pa->alibi_slopes  ? "alibi_slopes"
                    : pa->attn_mask     ? "attn_mask"
                                        : "dropout_p (dropout_mask)");
  return FLASHC_OK;
}

static flashc_status same_size(const char *a_name, const flashc_tensor *a, int da, const char *b_name,
                               const flashc_tensor *b, int db) {
  if (a->size[da] != b->size[db])
    return INVALID("%s: %s.size[%d] (%s) is %lld but %s.size[%d] (%s) is %lld", OP, b_name, db, dim_names[db],
                   (long long)b->size[db], a_name, da, dim_names[da], (long long)a->size[da]);
  return FLASHC_OK;
}

/* Do the bytes [a, a + a_bytes) and [b, b + b_bytes) intersect? */
static bool bytes_meet(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
  const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  return a_bytes && b_bytes && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

/* ---- the arguments alone ---------------------------------------------------------------------------------- */
enum { T_Q, T_O, T_KC, T_VC, T_KN, T_VN, N_T };
static const char *const t_names[N_T] = {"q", "o", "cache.k_cache", "cache.v_cache", "cache.k_new", "cache.v_new"};

static flashc_status check_arguments(flashc_handle h, const flashc_tensor *q, const flashc_kvcache *c,
                                     const flashc_tensor *o, const float *lse, const flashc_params *pa,
                                     fc_kv_problem *kp) {
  const flashc_tensor *ts[N_T] = {q, o, &c->k_cache, &c->v_cache, c->k_new, c->v_new};
  const bool append = c->k_new || c->v_new;
  if (append && (!c->k_new || !c->v_new))
    return INVALID("%s: cache.%s is NULL but cache.%s is set; new keys need both", OP, c->k_new ? "v_new" : "k_new",
                   c->k_new ? "k_new" : "v_new");
  const int nt = append ? N_T : T_KN;
  int64_t span[N_T] = {-1, -1, -1, -1, -1, -1};
  for (int i = 0; i < nt; i++) FC_CHECK(fc_check_tensor(OP, t_names[i], ts[i], &span[i]));
  for (int i = 1; i < nt; i++)
    if (ts[i]->dtype != q->dtype)
      return INVALID("%s: %s.dtype is %s but q.dtype is %s; all tensors share one dtype", OP, t_names[i],
                     flashc_dtype_name(ts[i]->dtype), flashc_dtype_name(q->dtype));

  /* Shapes: o as q; the caches alike; heads_kv and head_dim from k_cache; k_new/v_new [batch, seqlen_new]. */
  const bool paged = c->block_table != NULL;
  for (int d = 0; d < 4; d++) {
    FC_CHECK(same_size("q", q, d, "o", o, d));
    FC_CHECK(same_size("cache.k_cache", &c->k_cache, d, "cache.v_cache", &c->v_cache, d));
    if (append) FC_CHECK(same_size("cache.k_new", c->k_new, d, "cache.v_new", c->v_new, d));
  }
  FC_CHECK(same_size("q", q, 3, "cache.k_cache", &c->k_cache, 3));
  if (append) {
    FC_CHECK(same_size("q", q, 0, "cache.k_new", c->k_new, 0));
    FC_CHECK(same_size("cache.k_cache", &c->k_cache, 2, "cache.k_new", c->k_new, 2));
    FC_CHECK(same_size("cache.k_cache", &c->k_cache, 3, "cache.k_new", c->k_new, 3));
  }
  const int64_t batch = q->size[0], hq = q->size[2], hkv = c->k_cache.size[2];
  if (hq % hkv != 0)
    return INVALID("%s: heads_q %lld is not a multiple of heads_kv %lld (cache.k_cache.size[2])", OP, (long long)hq,
                   (long long)hkv);

  memset(kp, 0, sizeof *kp);
  if (paged) {
    if (c->k_cache.size[1] < 1)
      return INVALID("%s: cache.k_cache.size[1] (page_size) is %lld; a paged cache needs pages of >= 1 row", OP,
                     (long long)c->k_cache.size[1]);
    if (c->max_blocks_per_seq < 0)
      return INVALID("%s: cache.max_blocks_per_seq is %lld; it must be >= 0", OP, (long long)c->max_blocks_per_seq);
    const int64_t stride = c->block_table_stride ? c->block_table_stride : c->max_blocks_per_seq;
    if (stride < c->max_blocks_per_seq || c->block_table_stride < 0)
      return INVALID("%s: cache.block_table_stride is %lld; rows of %lld entries need a stride >= %lld (0: "
                     "max_blocks_per_seq)",
                     OP, (long long)c->block_table_stride, (long long)c->max_blocks_per_seq,
                     (long long)c->max_blocks_per_seq);
    int64_t reach;
    if (batch > 0 && c->max_blocks_per_seq > 0 &&
        (!fc_mul_ok(batch - 1, stride, &reach) || !fc_add_ok(reach, c->max_blocks_per_seq, &reach) ||
         (uint64_t)reach > SIZE_MAX / sizeof(int32_t)))
      return INVALID("%s: cache.block_table of %lld rows of stride %lld overflows this machine's addresses", OP,
                     (long long)batch, (long long)stride);
    if ((uintptr_t)c->block_table % sizeof(int32_t) != 0)
      return INVALID("%s: cache.block_table (%p) is not aligned to 4-byte int32", OP, (const void *)c->block_table);
    kp->page_size = c->k_cache.size[1];
    kp->num_blocks = c->k_cache.size[0];
    kp->block_table = c->block_table;
    kp->block_table_stride = stride;
    if (!fc_mul_ok(c->max_blocks_per_seq, kp->page_size, &kp->capacity))
      return INVALID("%s: cache.max_blocks_per_seq %lld × page_size %lld overflows", OP,
                     (long long)c->max_blocks_per_seq, (long long)kp->page_size);
  } else {
    if (c->max_blocks_per_seq != 0 || c->block_table_stride != 0)
      return INVALID("%s: cache.max_blocks_per_seq / block_table_stride are set but cache.block_table is NULL (a "
                     "dense cache)",
                     OP);
    FC_CHECK(same_size("q", q, 0, "cache.k_cache", &c->k_cache, 0));
    kp->capacity = c->k_cache.size[1];
  }
  if ((uintptr_t)c->cache_seqlens % sizeof(int32_t) != 0)
    return INVALID("%s: cache.cache_seqlens (%p) is not aligned to 4-byte int32", OP, (const void *)c->cache_seqlens);
  if (c->num_splits < 0)
    return INVALID("%s: cache.num_splits is %d; use 0 (the plan chooses) or > 0", OP, c->num_splits);
  kp->seqlen_new = append ? c->k_new->size[1] : 0;
  if (kp->seqlen_new > kp->capacity)
    return INVALID("%s: cache.k_new has %lld rows but a cache holds %lld", OP, (long long)kp->seqlen_new,
                   (long long)kp->capacity);
  if (!c->cache_seqlens && kp->seqlen_new > 0 && batch > 0)
    return INVALID("%s: cache.cache_seqlens is NULL (every cache full) but cache.k_new has %lld rows to append", OP,
                   (long long)kp->seqlen_new);
  FC_CHECK(check_params(pa));

  /* Outputs: o and lse always; the caches too when new rows are written into them. */
  FC_CHECK(fc_check_no_self_overlap(OP, "o", o));
  for (int j = 0; j < nt; j++)
    if (j != T_O) FC_CHECK(fc_check_disjoint(OP, "o", o, span[T_O], t_names[j], ts[j], span[j]));
  if (append)
    for (int i = T_KC; i <= T_VC; i++) {
      FC_CHECK(fc_check_no_self_overlap(OP, t_names[i], ts[i]));
      for (int j = 0; j < nt; j++)
        if (j != i) FC_CHECK(fc_check_disjoint(OP, t_names[i], ts[i], span[i], t_names[j], ts[j], span[j]));
    }
  const int64_t sq = q->size[1];
  int64_t lse_elems;
  if (!fc_mul_ok(batch * sq, hq, &lse_elems) || (uint64_t)lse_elems > SIZE_MAX / sizeof(float))
    return INVALID("%s: lse would need more than 2^63 bytes", OP);
  if (lse && lse_elems > 0) {
    if ((uintptr_t)lse % sizeof(float) != 0)
      return INVALID("%s: lse (%p) is not aligned to 4-byte floats; flashc needs element-aligned data", OP,
                     (const void *)lse);
    for (int j = 0; j < nt; j++)
      if (span[j] >= 0 && bytes_meet(lse, (size_t)lse_elems * sizeof(float), ts[j]->data,
                                     (size_t)(span[j] + 1) * flashc_dtype_size(ts[j]->dtype)))
        return INVALID("%s: output lse shares memory with %s; outputs need memory of their own", OP, t_names[j]);
  }
  /* The tables are read after the append and while o is written: no output may lie over them. */
  const void *tables[2] = {c->cache_seqlens, c->block_table};
  const char *table_names[2] = {"cache.cache_seqlens", "cache.block_table"};
  size_t table_bytes[2] = {c->cache_seqlens ? (size_t)batch * sizeof(int32_t) : 0, 0};
  if (paged && batch > 0 && c->max_blocks_per_seq > 0)
    table_bytes[1] = (size_t)((batch - 1) * kp->block_table_stride + c->max_blocks_per_seq) * sizeof(int32_t);
  const int outputs[3] = {T_O, T_KC, T_VC};
  for (int t = 0; t < 2; t++) {
    for (int i = 0; i < (append ? 3 : 1); i++) {
      const int j = outputs[i];
      if (span[j] >= 0 &&
          bytes_meet(tables[t], table_bytes[t], ts[j]->data, (size_t)(span[j] + 1) * flashc_dtype_size(ts[j]->dtype)))
        return INVALID("%s: output %s shares memory with %s; outputs need memory of their own", OP, t_names[j],
                       table_names[t]);
    }
    if (lse && lse_elems > 0 && bytes_meet(tables[t], table_bytes[t], lse, (size_t)lse_elems * sizeof(float)))
      return INVALID("%s: output lse shares memory with %s; outputs need memory of their own", OP, table_names[t]);
  }

  /* The problem as a plain forward sees it (mask, scale, q, o, lse), and the cache. */
  fc_problem *p = &kp->base;
  p->dtype = q->dtype;
  p->batch = batch;
  p->seqlen_q = sq;
  p->seqlen_k = kp->capacity; /* lowered to the longest len_b once the lengths are read (host calls) */
  p->total_q = batch * sq;
  p->total_k = batch * kp->capacity;
  p->heads_q = hq;
  p->heads_kv = hkv;
  p->head_dim = q->size[3];
  p->head_dim_v = q->size[3];
  p->scale = pa->scale != 0.0f ? pa->scale : (float)(1.0 / sqrt((double)p->head_dim));
  p->window_left = pa->window_left < 0 ? -1 : pa->window_left;
  p->window_right = pa->window_right < 0 ? -1 : pa->window_right;
  const int64_t window_cap = (int64_t)1 << 40; /* as validate.c: beyond every sequence, and no overflow */
  if (p->window_left > window_cap) p->window_left = window_cap;
  if (p->window_right > window_cap) p->window_right = window_cap;
  if (pa->causal) p->window_right = 0;
  p->bottom_right = pa->align == FLASHC_ALIGN_BOTTOM_RIGHT;
  p->deterministic = pa->deterministic;
  p->q = (fc_view){q->data, q->stride[0], q->stride[1], q->stride[2]};
  p->o = (fc_view){o->data, o->stride[0], o->stride[1], o->stride[2]};
  p->lse = (float *)lse;
  p->threads = h->threads > 0 ? h->threads : fc_cpu_count();
  p->stream = h->stream;
  p->handle = h;
  const flashc_tensor *kc = &c->k_cache, *vc = &c->v_cache;
  kp->k_cache = (fc_view){kc->data, kc->stride[0], kc->stride[1], kc->stride[2]};
  kp->v_cache = (fc_view){vc->data, vc->stride[0], vc->stride[1], vc->stride[2]};
  if (append) {
    kp->k_new = (fc_view){c->k_new->data, c->k_new->stride[0], c->k_new->stride[1], c->k_new->stride[2]};
    kp->v_new = (fc_view){c->v_new->data, c->v_new->stride[0], c->v_new->stride[1], c->v_new->stride[2]};
  }
  kp->cache_seqlens = c->cache_seqlens;
  kp->num_splits = c->num_splits;
  return FLASHC_OK;
}

/* ---- where the data lives, and the backend ---------------------------------------------------------------- */
static flashc_status accepts(const fc_backend *b, const fc_kv_problem *kp, int on_device) {
  char why[160];
  if (b->usable && !b->usable(why, sizeof why))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: backend %s is not usable here: %s", OP, b->name, why);
  if (!b->forward_kvcache)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: backend %s does not run attention over a KV cache yet", OP, b->name);
  if (!(b->dtypes & (1u << kp->base.dtype)))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: dtype %s is not supported on backend %s", OP,
                    flashc_dtype_name(kp->base.dtype), b->name);
  if (kp->base.head_dim > b->max_head_dim || kp->base.head_dim < b->min_head_dim)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: head_dim %lld is outside %d..%d on backend %s", OP,
                    (long long)kp->base.head_dim, b->min_head_dim, b->max_head_dim, b->name);
  if (on_device >= 0 && on_device != (b->device == FLASHC_DEVICE_CUDA))
    return INVALID("%s: the tensors are in %s memory but backend %s needs %s memory", OP,
                   on_device ? "CUDA device" : "host", b->name, b->device == FLASHC_DEVICE_CUDA ? "device" : "host");
  return FLASHC_OK;
}

static flashc_status choose(flashc_handle h, const fc_kv_problem *kp, int on_device, const fc_backend **chosen) {
  if (h->fixed) {
    FC_CHECK(accepts(h->fixed, kp, on_device));
    *chosen = h->fixed;
    return FLASHC_OK;
  }
  char reasons[600] = "";
  size_t used = 0;
  const size_t skip = strlen(OP) + 2; /* drop the repeated "flashc_forward_kvcache: " */
  for (int i = 0; i < fc_backend_total; i++) {
    const fc_backend *b = fc_backends[i];
    if (!b) continue;
    if (accepts(b, kp, on_device) == FLASHC_OK) {
      fc_clear_error();
      *chosen = b;
      return FLASHC_OK;
    }
    if (used < sizeof reasons)
      used +=
          (size_t)snprintf(reasons + used, sizeof reasons - used, "%s%s", used ? "; " : "", flashc_last_error() + skip);
  }
  return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: no backend accepts this call (%s)", OP, reasons);
}

/* ---- host data: lengths, block indices, appended rows ------------------------------------------------------- */
/* One sequence's appended rows that land in one block: rows [lo, hi) of block `block`. */
typedef struct written {
  int64_t block, lo, hi, seq;
} written;

static int written_order(const void *a, const void *b) {
  const written *x = a, *y = b;
  if (x->block != y->block) return x->block < y->block ? -1 : 1;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

/* Rows [lo, hi) of block `block` that sequence `seq` uses: does an appended row of another sequence lie there?
 * w: the n written ranges, sorted by block then lo. */
static const written *written_over(const written *w, int64_t n, int64_t block, int64_t lo, int64_t hi, int64_t seq) {
  int64_t a = 0, b = n; /* the first range of `block` */
  while (a < b) {
    const int64_t mid = a + (b - a) / 2;
    if (w[mid].block < block)
      a = mid + 1;
    else
      b = mid;
  }
  for (; a < n && w[a].block == block; a++)
    if (w[a].seq != seq && w[a].lo < hi && lo < w[a].hi) return &w[a];
  return NULL;
}

static flashc_status check_host_data(fc_kv_problem *kp) {
  const int64_t batch = kp->base.batch;
  int64_t longest = 0;
  for (int64_t b = 0; b < batch; b++) {
    const int64_t cached = fc_kv_cached(kp, b), len = cached + kp->seqlen_new;
    if (cached < 0)
      return INVALID("%s: cache.cache_seqlens[%lld] is %lld; lengths must be >= 0", OP, (long long)b,
                     (long long)cached);
    if (len > kp->capacity)
      return INVALID("%s: sequence %lld needs %lld keys (cache.cache_seqlens[%lld] = %lld + %lld new) but its cache "
                     "holds %lld (%s)",
                     OP, (long long)b, (long long)len, (long long)b, (long long)cached, (long long)kp->seqlen_new,
                     (long long)kp->capacity, kp->block_table ? "max_blocks_per_seq × page_size" : "k_cache.size[1]");
    if (len > longest) longest = len;
  }
  kp->base.seqlen_k = longest;
  kp->base.total_k = 0;
  for (int64_t b = 0; b < batch; b++) kp->base.total_k += fc_kv_len(kp, b);
  if (!kp->block_table) return FLASHC_OK;

  /* Every block a sequence uses exists. */
  const int64_t ps = kp->page_size;
  for (int64_t b = 0; b < batch; b++) {
    const int32_t *row = kp->block_table + b * kp->block_table_stride;
    const int64_t used = (fc_kv_len(kp, b) + ps - 1) / ps;
    for (int64_t c = 0; c < used; c++)
      if (row[c] < 0 || row[c] >= kp->num_blocks)
        return INVALID("%s: cache.block_table[%lld][%lld] is %d, outside the %lld blocks of cache.k_cache (sequence "
                       "%lld uses its first %lld entries)",
                       OP, (long long)b, (long long)c, row[c], (long long)kp->num_blocks, (long long)b,
                       (long long)used);
  }
  if (kp->seqlen_new == 0) return FLASHC_OK;

  /* No appended row is a row that another sequence uses (or appends): it would change that sequence's keys, or
   * two sequences would write one row. The ranges written are few (about one per page the new rows touch), so
   * they are listed and sorted, and each used block is looked up among them. */
  int64_t n = 0, cap = 0;
  for (int64_t b = 0; b < batch; b++) {
    const int64_t first = fc_kv_cached(kp, b) / ps, last = (fc_kv_len(kp, b) - 1) / ps;
    cap += last - first + 1;
  }
  written *w = malloc((size_t)cap * sizeof *w);
  if (!w)
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "%s: %lld bytes to check the appended rows", OP,
                    (long long)((size_t)cap * sizeof *w));
  for (int64_t b = 0; b < batch; b++) {
    const int32_t *row = kp->block_table + b * kp->block_table_stride;
    for (int64_t j = fc_kv_cached(kp, b), end = fc_kv_len(kp, b); j < end;) {
      const int64_t lo = j % ps, rows = fc_kv_run(kp, j, end - j);
      w[n++] = (written){row[j / ps], lo, lo + rows, b};
      j += rows;
    }
  }
  qsort(w, (size_t)n, sizeof *w, written_order);
  flashc_status status = FLASHC_OK;
  for (int64_t b = 0; b < batch && status == FLASHC_OK; b++) {
    const int32_t *row = kp->block_table + b * kp->block_table_stride;
    for (int64_t j = 0, end = fc_kv_len(kp, b); j < end;) {
      const int64_t lo = j % ps, rows = fc_kv_run(kp, j, end - j);
      const written *x = written_over(w, n, row[j / ps], lo, lo + rows, b);
      if (x) {
        status = INVALID("%s: sequence %lld appends rows %lld..%lld of block %lld, which sequence %lld also uses "
                         "(cache.block_table row %lld, entry %lld): blocks that receive new rows must not be shared",
                         OP, (long long)x->seq, (long long)x->lo, (long long)x->hi - 1, (long long)x->block,
                         (long long)b, (long long)b, (long long)(j / ps));
        break;
      }
      j += rows;
    }
  }
  free(w);
  return status;
}

void fc_kv_append_host(const fc_kv_problem *p) {
  if (p->seqlen_new == 0) return;
  const size_t es = flashc_dtype_size(p->base.dtype), row_bytes = (size_t)p->base.head_dim * es;
  for (int64_t b = 0; b < p->base.batch; b++) {
    const int64_t at = fc_kv_cached(p, b);
    for (int64_t t = 0; t < p->seqlen_new; t++)
      for (int64_t h = 0; h < p->base.heads_kv; h++) {
        const int64_t from_k = b * p->k_new.stride_b + t * p->k_new.stride_s + h * p->k_new.stride_h;
        const int64_t from_v = b * p->v_new.stride_b + t * p->v_new.stride_s + h * p->v_new.stride_h;
        memcpy((char *)p->k_cache.data + fc_kv_offset(p, &p->k_cache, b, at + t, h) * (int64_t)es,
               (const char *)p->k_new.data + from_k * (int64_t)es, row_bytes);
        memcpy((char *)p->v_cache.data + fc_kv_offset(p, &p->v_cache, b, at + t, h) * (int64_t)es,
               (const char *)p->v_new.data + from_v * (int64_t)es, row_bytes);
      }
  }
}

/* ---- the entry point ---------------------------------------------------------------------------------------- */
flashc_status flashc_forward_kvcache(flashc_handle h, const flashc_tensor *q, const flashc_kvcache *cache,
                                     flashc_tensor *o, float *lse, const flashc_params *params) {
  if (!h) return INVALID("%s: handle is NULL", OP);
  flashc_params pa;
  flashc_kvcache c;
  FC_CHECK(fc_params_read(OP, params, &pa));
  FC_CHECK(read_cache(cache, &c));
  fc_kv_problem kp;
  FC_CHECK(check_arguments(h, q, &c, o, lse, &pa, &kp));

  const void *ptrs[9] = {q->data,
                         o->data,
                         c.k_cache.data,
                         c.v_cache.data,
                         c.k_new ? c.k_new->data : NULL,
                         c.v_new ? c.v_new->data : NULL,
                         lse,
                         c.cache_seqlens,
                         c.block_table};
  const char *names[9] = {"q",           "o",   "cache.k_cache",       "cache.v_cache",    "cache.k_new",
                          "cache.v_new", "lse", "cache.cache_seqlens", "cache.block_table"};
  int on_device;
  FC_CHECK(fc_locate(OP, ptrs, names, 9, &on_device));
  const fc_backend *b = NULL;
  FC_CHECK(choose(h, &kp, on_device, &b));
  if (b->device == FLASHC_DEVICE_CPU) FC_CHECK(check_host_data(&kp));
  FC_CHECK(b->forward_kvcache(&kp));
  h->last_backend = b->name;
  return FLASHC_OK;
}
