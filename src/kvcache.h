/*
 * kvcache.h — attention over a KV cache (flashc_forward_kvcache) as the backends see it: the validated call and
 * the address of a cache row, dense or paged.
 *
 * src/kvcache.c checks the caller's arguments and builds an fc_kv_problem; a backend's forward_kvcache
 * (fc_backend, internal.h) appends k_new/v_new into the cache and attends. The embedded fc_problem carries what
 * a plain forward has (q, o, lse, dtype, shapes, scale, mask, threads), so the mask helpers of internal.h and the
 * tile helpers of src/cpu apply unchanged; its k and v views are unused (the cache is read through
 * fc_kv_offset) and its seqlen_k is the longest len_b.
 */
#ifndef FLASHC_KVCACHE_H
#define FLASHC_KVCACHE_H

#include "internal.h"

#ifdef __cplusplus
extern "C" { /* src/cuda/mma/decode.cu reads the problem */
#endif

typedef struct fc_kv_problem {
  fc_problem base;
  /* stride_b steps one sequence (dense) or one block (paged). */
  fc_view k_cache, v_cache;
  fc_view k_new, v_new;       /* data NULL without new keys */
  int64_t seqlen_new;         /* rows of k_new (0 without) */
  int64_t capacity;           /* keys a sequence's cache can hold */
  int64_t page_size;          /* 0: dense */
  int64_t num_blocks;         /* paged: blocks in the pool */
  const int32_t *block_table; /* NULL: dense; else row b at block_table + b·block_table_stride */
  int64_t block_table_stride;
  const int32_t *cache_seqlens; /* NULL: every cache is full */
  int num_splits;               /* the caller's; 0: the backend chooses */
} fc_kv_problem;

/* Keys already in sequence b's cache before the call. */
static inline int64_t fc_kv_cached(const fc_kv_problem *p, int64_t b) {
  return p->cache_seqlens ? p->cache_seqlens[b] : p->capacity;
}

/* len_b: the keys sequence b attends over, the appended ones included. */
static inline int64_t fc_kv_len(const fc_kv_problem *p, int64_t b) { return fc_kv_cached(p, b) + p->seqlen_new; }

/* Element offset of key/value row j (< capacity) of sequence b, head h, in cache view c. */
static inline int64_t fc_kv_offset(const fc_kv_problem *p, const fc_view *c, int64_t b, int64_t j, int64_t h) {
  if (!p->block_table) return b * c->stride_b + j * c->stride_s + h * c->stride_h;
  const int64_t block = p->block_table[b * p->block_table_stride + j / p->page_size];
  return block * c->stride_b + (j % p->page_size) * c->stride_s + h * c->stride_h;
}

/* Rows of key j.. of sequence b that lie contiguously in one page (or the rest of the dense slot), at most n. */
static inline int64_t fc_kv_run(const fc_kv_problem *p, int64_t j, int64_t n) {
  if (!p->block_table) return n;
  const int64_t left = p->page_size - j % p->page_size;
  return left < n ? left : n;
}

/* The host backends' append: k_new/v_new rows into the cache at rows cached_b .. cached_b + seqlen_new − 1
 * (src/kvcache.c). A plain copy: the dtype is the same. */
void fc_kv_append_host(const fc_kv_problem *p);

/* The oracle for one query row (src/cpu/ref_kvcache.c): o and lse of row i of query head h of sequence b, in
 * fp64, over the cache as it is (after the append). The `cpu` backend redoes with it the rows that leave fp32. */
void fc_ref_kvcache_row(const fc_kv_problem *p, int64_t b, int64_t h, int64_t i);

/* The backends' entry points (src/cpu/ref_kvcache.c, src/cpu/kvcache.c; the CUDA backends' one,
 * fc_cuda_forward_kvcache of src/cuda/mma/decode.cu, is declared in src/cuda/common/common.cuh, which their tables
 * see). */
flashc_status fc_ref_forward_kvcache(const fc_kv_problem *p);
flashc_status fc_cpu_forward_kvcache(const fc_kv_problem *p);

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_KVCACHE_H */
