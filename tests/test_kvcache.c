/*
 * test_kvcache.c — flashc_forward_kvcache (flashc.h, "attention over a KV cache") on cpu-ref and cpu.
 *
 * Every case builds a cache (dense, or paged with a block table whose blocks are a random permutation of a pool
 * larger than needed and whose unused entries hold garbage), new keys to append, and queries; poisons o and lse;
 * runs the call; and checks, against a plain fp64 computation written here (the cache gathered into one dense
 * [len, heads_kv, d] array per sequence, the mask from its definition, softmax attention in double):
 *   o and lse within the dtype's rounding (cpu-ref: one rounding; cpu: fp32 accumulation), every element written;
 *   rows that see no key: o = 0, lse = −inf;
 *   the cache afterwards: the appended rows equal k_new/v_new bit for bit, every other byte unchanged;
 *   cpu bit-identical at 1 and 3 threads.
 * Then bad calls (block indices out of range, lengths past the capacity, a shared block that receives new rows,
 * aliasing, struct sizes, params of other calls) are refused with a message naming the value, nothing written.
 * On a GPU, cuda-mma and cuda-hopper (and auto) run GPU cases with device copies of the same buffers: o and lse
 * against the reference with FlashAttention's rule (≤ 2× the error of the same maths done plainly in bf16/f16,
 * th_naive_forward), the caches afterwards, guard regions around every device buffer; paged with permuted tables,
 * pages of 5, 16, 48 and 256 (a split walking many key blocks, blocks over several pages), appends across a page
 * boundary, GQA 32/8 and MQA, seqlen_new 1..4, causal and windows, empty caches, 1, 2, many and the plan's splits,
 * head dims 59 to 256; and device tables the host cannot check (a block index out of range, a length past the
 * capacity, negative ones): that sequence's outputs NaN, nothing appended for it, the other sequence right. The
 * other CUDA backends refuse the call (FLASHC_ERR_UNSUPPORTED); without a GPU the CUDA part is skipped with "no CUDA
 * device".
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...) th_check((cond), __VA_ARGS__)

enum { MAXB = 8 };

typedef struct kcase {
  const char *name;
  flashc_dtype dtype;
  int64_t batch, sq, sn, hq, hkv, d;
  int64_t page_size; /* 0: dense */
  int64_t capacity;  /* dense: rows per slot; paged: a multiple of page_size */
  int causal;
  int64_t wl, wr;
  int64_t cached[MAXB]; /* keys in each cache before the call; −1: random in [0, capacity − sn] */
  int num_splits;
  int bhsd; /* dense caches in the [batch, heads, seqlen, d] layout */
} kcase;

/* A case's buffers, all on the host. */
typedef struct kbuf {
  flashc_tensor q, o, kc, vc, kn, vn;
  void *q_mem, *o_mem, *kc_mem, *vc_mem, *kn_mem, *vn_mem;
  size_t kc_bytes;
  float *lse;
  int32_t *table, *seqlens;
  int64_t num_blocks, max_blocks, table_stride;
} kbuf;

static size_t es_of(flashc_dtype t) { return flashc_dtype_size(t); }

static void *alloc_fill(th_rng *r, flashc_dtype dt, int64_t n) {
  void *m = malloc((size_t)(n > 0 ? n : 1) * es_of(dt));
  if (!m) abort();
  for (int64_t i = 0; i < n; i++) th_store(m, dt, i, th_round(dt, th_rng_normal(r)));
  return m;
}

static void build(const kcase *c, th_rng *r, kbuf *k) {
  memset(k, 0, sizeof *k);
  const flashc_dtype dt = c->dtype;
  const int64_t b = c->batch, sq = c->sq, hq = c->hq, hkv = c->hkv, d = c->d;
  k->q_mem = alloc_fill(r, dt, b * sq * hq * d);
  k->q = flashc_tensor_bshd(b ? k->q_mem : NULL, dt, b, sq, hq, d);
  k->o_mem = malloc((size_t)(b * sq * hq * d + 1) * es_of(dt));
  k->o = flashc_tensor_bshd(k->o_mem, dt, b, sq, hq, d);
  k->lse = malloc((size_t)(b * hq * sq + 1) * sizeof(float));
  int64_t rows; /* cache rows in the pool */
  if (c->page_size) {
    if (c->capacity % c->page_size) { /* a case list error, not the library's */
      fprintf(stderr, "test_kvcache: case %s: capacity %lld is not whole pages\n", c->name, (long long)c->capacity);
      abort();
    }
    k->max_blocks = c->capacity / c->page_size;
    k->num_blocks = b * k->max_blocks + 3; /* blocks no sequence owns */
    k->table_stride = k->max_blocks + 2;   /* row padding, never read */
    rows = k->num_blocks * c->page_size;
  } else {
    rows = b * c->capacity;
  }
  k->kc_mem = alloc_fill(r, dt, rows * hkv * d);
  k->vc_mem = alloc_fill(r, dt, rows * hkv * d);
  k->kc_bytes = (size_t)(rows * hkv * d) * es_of(dt);
  if (c->page_size) {
    k->kc = flashc_tensor_bshd(k->kc_mem, dt, k->num_blocks, c->page_size, hkv, d);
    k->vc = flashc_tensor_bshd(k->vc_mem, dt, k->num_blocks, c->page_size, hkv, d);
    /* The blocks of all sequences: a random permutation of the pool; unused entries are garbage. */
    int64_t *perm = malloc((size_t)k->num_blocks * sizeof *perm);
    for (int64_t i = 0; i < k->num_blocks; i++) perm[i] = i;
    for (int64_t i = k->num_blocks - 1; i > 0; i--) {
      const int64_t j = (int64_t)(th_rng_u64(r) % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[j], perm[j] = t;
    }
    k->table = malloc((size_t)(b * k->table_stride + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < b * k->table_stride; i++) k->table[i] = (i % 2) ? -7 : 1 << 30;
    for (int64_t s = 0; s < b; s++)
      for (int64_t e = 0; e < k->max_blocks; e++)
        k->table[s * k->table_stride + e] = (int32_t)perm[s * k->max_blocks + e];
    free(perm);
  } else if (c->bhsd) {
    k->kc = flashc_tensor_bhsd(k->kc_mem, dt, b, c->capacity, hkv, d);
    k->vc = flashc_tensor_bhsd(k->vc_mem, dt, b, c->capacity, hkv, d);
  } else {
    k->kc = flashc_tensor_bshd(b ? k->kc_mem : NULL, dt, b, c->capacity, hkv, d);
    k->vc = flashc_tensor_bshd(b ? k->vc_mem : NULL, dt, b, c->capacity, hkv, d);
  }
  if (c->capacity == 0 && !c->page_size) k->kc.data = k->vc.data = NULL;
  k->seqlens = malloc((size_t)(b + 1) * sizeof(int32_t));
  for (int64_t s = 0; s < b; s++) {
    int64_t n = c->cached[s];
    if (n < 0) n = (int64_t)(th_rng_u64(r) % (uint64_t)(c->capacity - c->sn + 1));
    k->seqlens[s] = (int32_t)n;
  }
  if (c->sn) {
    k->kn_mem = alloc_fill(r, dt, b * c->sn * hkv * d);
    k->vn_mem = alloc_fill(r, dt, b * c->sn * hkv * d);
    k->kn = flashc_tensor_bshd(b ? k->kn_mem : NULL, dt, b, c->sn, hkv, d);
    k->vn = flashc_tensor_bshd(b ? k->vn_mem : NULL, dt, b, c->sn, hkv, d);
  }
}

static void release(kbuf *k) {
  free(k->q_mem), free(k->o_mem), free(k->kc_mem), free(k->vc_mem), free(k->kn_mem), free(k->vn_mem);
  free(k->lse), free(k->table), free(k->seqlens);
}

static flashc_kvcache cache_of(const kcase *c, kbuf *k) {
  flashc_kvcache kv = flashc_kvcache_default();
  kv.k_cache = k->kc;
  kv.v_cache = k->vc;
  kv.cache_seqlens = k->seqlens;
  if (c->page_size) {
    kv.block_table = k->table;
    kv.max_blocks_per_seq = k->max_blocks;
    kv.block_table_stride = k->table_stride;
  }
  if (c->sn) kv.k_new = &k->kn, kv.v_new = &k->vn;
  kv.num_splits = c->num_splits;
  return kv;
}

static flashc_params params_of(const kcase *c) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal;
  p.window_left = c->wl;
  p.window_right = c->wr;
  return p;
}

/* Element offset of cache row j of sequence s, head h: from the case's own layout, not the library's. */
static int64_t cache_index(const kcase *c, const kbuf *k, const flashc_tensor *t, int64_t s, int64_t j, int64_t h) {
  if (!c->page_size) return th_index(t, s, j, h, 0);
  return th_index(t, k->table[s * k->table_stride + j / c->page_size], j % c->page_size, h, 0);
}

/* The caches as they must be after the call, from their contents before it (kc0, vc0): k_new/v_new at
 * cache_seqlens for the first nseq sequences, every other element as before (malloc; the caller frees both). */
static void expected_caches(const kcase *c, const kbuf *k, const void *kc0, const void *vc0, int64_t nseq,
                            unsigned char **want_k, unsigned char **want_v) {
  const int64_t es = (int64_t)es_of(c->dtype);
  unsigned char *wk = malloc(k->kc_bytes + 1), *wv = malloc(k->kc_bytes + 1);
  memcpy(wk, kc0, k->kc_bytes), memcpy(wv, vc0, k->kc_bytes);
  for (int64_t s = 0; s < nseq; s++)
    for (int64_t t = 0; t < c->sn; t++)
      for (int64_t hh = 0; hh < c->hkv; hh++) {
        const int64_t at = k->seqlens[s] + t;
        memcpy(wk + cache_index(c, k, &k->kc, s, at, hh) * es,
               (const char *)k->kn.data + th_index(&k->kn, s, t, hh, 0) * es, (size_t)(c->d * es));
        memcpy(wv + cache_index(c, k, &k->vc, s, at, hh) * es,
               (const char *)k->vn.data + th_index(&k->vn, s, t, hh, 0) * es, (size_t)(c->d * es));
      }
  *want_k = wk, *want_v = wv;
}

/* The plain fp64 computation: o [b, sq, hq, d] and lse [b, hq, sq], from the cache as given (before the call)
 * and k_new/v_new, gathered per sequence. */
static void reference(const kcase *c, const kbuf *k, const void *kc0, const void *vc0, double *o, double *lse) {
  const flashc_dtype dt = c->dtype;
  const int64_t d = c->d, g = c->hq / c->hkv;
  const double scale = (float)(1.0 / sqrt((double)d)); /* params.scale is a float */
  for (int64_t s = 0; s < c->batch; s++) {
    const int64_t cached = k->seqlens[s], len = cached + c->sn;
    double *K = malloc((size_t)(len * c->hkv * d + 1) * sizeof *K), *V = malloc((size_t)(len * c->hkv * d + 1) * 8);
    double *S = malloc((size_t)(len + 1) * sizeof *S);
    for (int64_t j = 0; j < len; j++)
      for (int64_t h = 0; h < c->hkv; h++)
        for (int64_t x = 0; x < d; x++) {
          double kv_k, kv_v;
          if (j < cached) {
            kv_k = th_load(kc0, dt, cache_index(c, k, &k->kc, s, j, h) + x);
            kv_v = th_load(vc0, dt, cache_index(c, k, &k->vc, s, j, h) + x);
          } else {
            kv_k = th_load(k->kn.data, dt, th_index(&k->kn, s, j - cached, h, x));
            kv_v = th_load(k->vn.data, dt, th_index(&k->vn, s, j - cached, h, x));
          }
          K[(j * c->hkv + h) * d + x] = kv_k;
          V[(j * c->hkv + h) * d + x] = kv_v;
        }
    for (int64_t h = 0; h < c->hq; h++)
      for (int64_t i = 0; i < c->sq; i++) {
        const int64_t diag = i + len - c->sq, hk = h / g;
        double m = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
          const int seen =
              (!c->causal || j <= diag) && (c->wl < 0 || j >= diag - c->wl) && (c->wr < 0 || j <= diag + c->wr);
          S[j] = -INFINITY;
          if (!seen) continue;
          double dot = 0;
          for (int64_t x = 0; x < d; x++)
            dot += th_load(k->q.data, dt, th_index(&k->q, s, i, h, x)) * K[(j * c->hkv + hk) * d + x];
          S[j] = scale * dot;
          if (S[j] > m) m = S[j];
        }
        double *out = o + ((s * c->sq + i) * c->hq + h) * d, l = 0;
        for (int64_t x = 0; x < d; x++) out[x] = 0;
        if (m == -INFINITY) {
          lse[(s * c->hq + h) * c->sq + i] = -INFINITY;
          continue;
        }
        for (int64_t j = 0; j < len; j++) {
          if (S[j] == -INFINITY) continue;
          const double e = exp(S[j] - m);
          l += e;
          for (int64_t x = 0; x < d; x++) out[x] += e * V[(j * c->hkv + hk) * d + x];
        }
        for (int64_t x = 0; x < d; x++) out[x] /= l;
        lse[(s * c->hq + h) * c->sq + i] = m + log(l);
      }
    free(K), free(V), free(S);
  }
}

/* Runs case c on `backend` with `threads`; checks o, lse and the cache. Returns o's bytes (malloc) for the
 * thread-count comparison, or NULL. */
static void *run_case(const kcase *c, const char *backend, int threads, uint64_t seed, float **lse_out) {
  th_rng r;
  th_rng_init(&r, seed);
  kbuf k;
  build(c, &r, &k);
  const flashc_dtype dt = c->dtype;
  const int64_t n_o = c->batch * c->sq * c->hq * c->d, n_lse = c->batch * c->hq * c->sq;
  void *kc0 = malloc(k.kc_bytes + 1), *vc0 = malloc(k.kc_bytes + 1);
  memcpy(kc0, k.kc_mem, k.kc_bytes), memcpy(vc0, k.vc_mem, k.kc_bytes);
  double *ref_o = malloc((size_t)(n_o + 1) * sizeof *ref_o), *ref_lse = malloc((size_t)(n_lse + 1) * 8);
  reference(c, &k, kc0, vc0, ref_o, ref_lse);
  memset(k.o_mem, TH_POISON_BYTE, (size_t)n_o * es_of(dt));
  memset(k.lse, TH_POISON_BYTE, (size_t)n_lse * sizeof(float));

  flashc_handle h = NULL;
  void *o_copy = NULL;
  if (!CHECK(flashc_create(&h, backend) == FLASHC_OK, "%s: flashc_create(%s): %s", c->name, backend,
             flashc_last_error()))
    goto done;
  flashc_set_threads(h, threads);
  const flashc_kvcache kv = cache_of(c, &k);
  const flashc_params p = params_of(c);
  const flashc_status st = flashc_forward_kvcache(h, &k.q, &kv, &k.o, k.lse, &p);
  if (!CHECK(st == FLASHC_OK, "%s on %s: status %d: %s", c->name, backend, (int)st, flashc_last_error())) goto done;
  CHECK(strcmp(flashc_handle_last_backend(h), backend) == 0, "%s: last backend %s", c->name,
        flashc_handle_last_backend(h));

  /* o and lse: cpu-ref rounds once; cpu accumulates in fp32 (and bf16/f16 inputs are exact in fp32). */
  const double u = th_unit_roundoff(dt), ref_max = th_abs_max(ref_o, n_o);
  const bool oracle = strcmp(backend, "cpu-ref") == 0;
  const double tol_o = (oracle ? 1.01 : 4.0) * u * (ref_max > 1 ? ref_max : 1) + (oracle ? 1e-12 : 2e-6);
  int64_t bad = 0;
  for (int64_t i = 0; i < n_o; i++) {
    const double x = th_load(k.o_mem, dt, i), e = fabs(x - ref_o[i]);
    if (!(e <= tol_o) && bad++ < 3)
      th_fail("%s on %s: o[%lld] = %.9g, reference %.9g (tolerance %.2g)", c->name, backend, (long long)i, x, ref_o[i],
              tol_o);
  }
  CHECK(bad == 0, "%s on %s: %lld elements of o outside the tolerance", c->name, backend, (long long)bad);
  bad = 0;
  for (int64_t i = 0; i < n_lse; i++) {
    const double x = k.lse[i];
    const bool ok = ref_lse[i] == -INFINITY ? x == -INFINITY : fabs(x - ref_lse[i]) <= 2e-6 * (1 + fabs(ref_lse[i]));
    if (!ok && bad++ < 3)
      th_fail("%s on %s: lse[%lld] = %.9g, reference %.9g", c->name, backend, (long long)i, x, ref_lse[i]);
    /* a row that sees no key: o is +0 exactly */
    if (ref_lse[i] == -INFINITY) {
      const int64_t s = i / (c->hq * c->sq), hh = i / c->sq % c->hq, row = i % c->sq;
      for (int64_t x2 = 0; x2 < c->d; x2++)
        if (th_load(k.o_mem, dt, ((s * c->sq + row) * c->hq + hh) * c->d + x2) != 0.0 && bad++ < 3)
          th_fail("%s on %s: row %lld of head %lld sees no key but o is not 0", c->name, backend, (long long)row,
                  (long long)hh);
    }
  }
  CHECK(bad == 0, "%s on %s: %lld lse values (or empty rows) wrong", c->name, backend, (long long)bad);

  /* The cache: the appended rows hold k_new/v_new, every other element is as before. */
  bad = 0;
  {
    unsigned char *want_k, *want_v;
    expected_caches(c, &k, kc0, vc0, c->batch, &want_k, &want_v);
    bad = memcmp(want_k, k.kc_mem, k.kc_bytes) != 0 || memcmp(want_v, k.vc_mem, k.kc_bytes) != 0;
    free(want_k), free(want_v);
  }
  CHECK(!bad, "%s on %s: the cache after the call is not the cache before with k_new/v_new at cache_seqlens", c->name,
        backend);
  o_copy = malloc((size_t)n_o * es_of(dt) + 1);
  memcpy(o_copy, k.o_mem, (size_t)n_o * es_of(dt));
  if (lse_out) {
    *lse_out = malloc((size_t)n_lse * sizeof(float) + 1);
    memcpy(*lse_out, k.lse, (size_t)n_lse * sizeof(float));
  }
done:
  flashc_destroy(h);
  free(kc0), free(vc0), free(ref_o), free(ref_lse);
  release(&k);
  return o_copy;
}

#define R (-1)
static const kcase cases[] = {
    /* name                  dtype       b  sq sn hq hkv d   page cap   causal wl  wr  cached */
    {"dense decode", FLASHC_F32, 3, 1, 0, 4, 2, 64, 0, 300, 0, -1, -1, {R, R, R}, 0, 0},
    {"dense bhsd append", FLASHC_F32, 2, 1, 1, 8, 2, 32, 0, 129, 1, -1, -1, {R, R}, 0, 1},
    {"dense full cache", FLASHC_F32, 2, 2, 0, 2, 2, 16, 0, 77, 1, -1, -1, {77, 77}, 0, 0},
    {"dense append to full", FLASHC_F32, 2, 3, 3, 2, 1, 16, 0, 40, 1, -1, -1, {37, 0}, 0, 0},
    {"dense empty caches", FLASHC_F32, 2, 1, 0, 2, 1, 8, 0, 10, 0, -1, -1, {0, 0}, 0, 0},
    {"dense capacity 0", FLASHC_F32, 2, 1, 0, 2, 1, 8, 0, 0, 0, -1, -1, {0, 0}, 0, 0},
    {"paged 16 decode", FLASHC_F32, 4, 1, 1, 4, 4, 64, 16, 160, 1, -1, -1, {R, R, R, R}, 0, 0},
    {"paged 16 gqa spec", FLASHC_F32, 3, 5, 5, 8, 2, 59, 16, 96, 1, -1, -1, {R, 15, 12}, 0, 0},
    {"paged 256 mqa", FLASHC_F32, 2, 1, 1, 6, 1, 128, 256, 1024, 1, -1, -1, {R, 700}, 0, 0},
    {"paged 256 splits 3", FLASHC_F32, 2, 4, 4, 4, 2, 64, 256, 2048, 1, -1, -1, {1500, 2044}, 3, 0},
    {"paged odd pages", FLASHC_F32, 3, 3, 2, 4, 2, 40, 5, 45, 1, -1, -1, {R, 4, 9}, 0, 0},
    {"paged across a page", FLASHC_F32, 2, 16, 16, 2, 1, 32, 16, 64, 1, -1, -1, {10, 31}, 0, 0},
    {"paged empty + full", FLASHC_F32, 2, 2, 0, 2, 1, 16, 16, 48, 1, -1, -1, {0, 48}, 0, 0},
    {"paged window", FLASHC_F32, 2, 3, 1, 4, 2, 32, 16, 208, 1, 20, -1, {R, 150}, 0, 0},
    {"paged window both sides", FLASHC_F32, 2, 4, 0, 2, 2, 32, 16, 80, 0, 7, 2, {R, 60}, 0, 0},
    {"dense long split", FLASHC_F32, 1, 1, 1, 8, 2, 64, 0, 5000, 1, -1, -1, {4321}, 0, 0},
    {"dense long splits 7", FLASHC_F32, 1, 2, 0, 2, 1, 32, 0, 3000, 0, -1, -1, {2999}, 7, 0},
    {"bf16 paged 16", FLASHC_BF16, 3, 2, 2, 8, 2, 64, 16, 160, 1, -1, -1, {R, R, R}, 0, 0},
    {"f16 dense", FLASHC_F16, 2, 1, 1, 4, 1, 128, 0, 300, 1, -1, -1, {R, R}, 0, 0},
    {"f64 oracle only", FLASHC_F64, 2, 2, 1, 2, 1, 16, 16, 64, 1, -1, -1, {R, R}, 0, 0},
    {"seqlen_q 0, append", FLASHC_F32, 2, 0, 3, 2, 1, 16, 16, 64, 0, -1, -1, {R, R}, 0, 0},
    {"batch 0", FLASHC_F32, 0, 1, 1, 2, 1, 16, 0, 64, 0, -1, -1, {0}, 0, 0},
};
#undef R

static void correctness(void) {
  const int n = (int)(sizeof cases / sizeof cases[0]);
  for (int i = 0; i < n; i++) {
    const kcase *c = &cases[i];
    const uint64_t seed = th_seed() + (uint64_t)i * 7919u;
    void *o_ref = run_case(c, "cpu-ref", 2, seed, NULL);
    free(o_ref);
    if (c->dtype == FLASHC_F64) { /* cpu has no f64: it refuses the call (and auto picks cpu-ref) */
      th_rng r;
      th_rng_init(&r, seed);
      kbuf k;
      build(c, &r, &k);
      flashc_handle h;
      flashc_create(&h, "cpu");
      const flashc_kvcache kv = cache_of(c, &k);
      const flashc_status st = flashc_forward_kvcache(h, &k.q, &kv, &k.o, k.lse, NULL);
      CHECK(st == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "f64"), "%s: cpu gave %d (%s)", c->name,
            (int)st, flashc_last_error());
      flashc_destroy(h);
      release(&k);
      printf("ok   %-26s cpu-ref (cpu refuses f64)\n", c->name);
      continue;
    }
    float *lse1 = NULL, *lse3 = NULL;
    void *o1 = run_case(c, "cpu", 1, seed, &lse1), *o3 = run_case(c, "cpu", 3, seed, &lse3);
    if (o1 && o3) {
      const size_t o_bytes = (size_t)(c->batch * c->sq * c->hq * c->d) * es_of(c->dtype);
      CHECK(memcmp(o1, o3, o_bytes) == 0 && memcmp(lse1, lse3, (size_t)(c->batch * c->hq * c->sq) * 4) == 0,
            "%s: cpu's o and lse differ between 1 and 3 threads", c->name);
    }
    free(o1), free(o3), free(lse1), free(lse3);
    printf("ok   %-26s cpu-ref, cpu (1 and 3 threads)\n", c->name);
  }
}

/* ---- bad calls ------------------------------------------------------------------------------------------ */
/* A fresh paged case (batch 2, page 16, 4 blocks per sequence, cached 20 and 33, 2 new rows) to break. */
static const kcase bad_base = {"bad", FLASHC_F32, 2, 2, 2, 4, 2, 16, 16, 64, 1, -1, -1, {20, 33}, 0, 0};

typedef void (*breaker)(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse);

static void b_index_high(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  k->table[1 * k->table_stride + 2] = (int32_t)k->num_blocks; /* sequence 1 uses entries 0..2 */
}
static void b_index_negative(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  k->table[0] = -1;
}
static void b_length_past(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  k->seqlens[1] = 63; /* + 2 new > 64 */
}
static void b_length_negative(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  k->seqlens[0] = -3;
}
static void b_shared_block(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  /* sequence 0 appends rows 4..5 of its block 1; sequence 1 reads that block as its block 0 (rows 0..15) */
  k->table[1 * k->table_stride + 0] = k->table[1];
}
static void b_v_new_missing(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)p, (void)o, (void)lse;
  kv->v_new = NULL;
}
static void b_struct_size(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)p, (void)o, (void)lse;
  kv->struct_size = sizeof *kv + 8;
}
static void b_o_in_cache(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)lse;
  (*o)->data = k->kc_mem;
}
static void b_lse_in_table(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o;
  *lse = (float *)k->table;
}
static void b_varlen(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)kv, (void)o, (void)lse;
  static const int32_t cu[3] = {0, 1, 2};
  p->cu_seqlens_q = p->cu_seqlens_k = cu;
  p->num_seqs = 2;
}
static void b_softcap(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)kv, (void)o, (void)lse;
  p->softcap = 30.0f;
}
static void b_splits(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)p, (void)o, (void)lse;
  kv->num_splits = -2;
}
static void b_params_splits(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)kv, (void)o, (void)lse;
  p->num_splits = 4; /* the dense call's field: a KV cache call has its own */
}
static void b_v_cache_shape(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)p, (void)o, (void)lse;
  kv->v_cache.size[1] = 8; /* pages of another size */
}
static void b_table_stride(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)k, (void)p, (void)o, (void)lse;
  kv->block_table_stride = 2; /* below max_blocks_per_seq (4) */
}
static void b_k_new_rows(kbuf *k, flashc_kvcache *kv, flashc_params *p, flashc_tensor **o, float **lse) {
  (void)kv, (void)p, (void)o, (void)lse;
  k->kn.size[2] = 1; /* heads_kv 1, the cache has 2 */
  k->vn.size[2] = 1;
}

static void bad_calls(void) {
  static const struct {
    const char *what;
    breaker fn;
    flashc_status want;
    const char *words; /* in the message */
  } bads[] = {
      {"block index past the pool", b_index_high, FLASHC_ERR_INVALID_ARGUMENT, "cache.block_table[1][2]"},
      {"negative block index", b_index_negative, FLASHC_ERR_INVALID_ARGUMENT, "cache.block_table[0][0] is -1"},
      {"length past the capacity", b_length_past, FLASHC_ERR_INVALID_ARGUMENT, "needs 65 keys"},
      {"negative length", b_length_negative, FLASHC_ERR_INVALID_ARGUMENT, "cache.cache_seqlens[0] is -3"},
      {"appending into a shared block", b_shared_block, FLASHC_ERR_INVALID_ARGUMENT, "also uses"},
      {"k_new without v_new", b_v_new_missing, FLASHC_ERR_INVALID_ARGUMENT, "cache.v_new is NULL"},
      {"struct_size too large", b_struct_size, FLASHC_ERR_INVALID_ARGUMENT, "newer flashc.h"},
      {"o inside the cache", b_o_in_cache, FLASHC_ERR_INVALID_ARGUMENT, "output o shares memory with cache.k_cache"},
      {"lse inside the block table", b_lse_in_table, FLASHC_ERR_INVALID_ARGUMENT, "lse shares memory"},
      {"varlen params", b_varlen, FLASHC_ERR_INVALID_ARGUMENT, "cu_seqlens"},
      {"softcap (not yet)", b_softcap, FLASHC_ERR_UNSUPPORTED, "params.softcap is not supported with a KV cache"},
      {"negative num_splits", b_splits, FLASHC_ERR_INVALID_ARGUMENT, "num_splits is -2"},
      {"params.num_splits", b_params_splits, FLASHC_ERR_INVALID_ARGUMENT, "takes its splits from cache.num_splits"},
      {"pages of two sizes", b_v_cache_shape, FLASHC_ERR_INVALID_ARGUMENT, "cache.v_cache.size[1]"},
      {"block table stride", b_table_stride, FLASHC_ERR_INVALID_ARGUMENT, "block_table_stride is 2"},
      {"k_new heads", b_k_new_rows, FLASHC_ERR_INVALID_ARGUMENT, "cache.k_new.size[2]"},
  };
  const char *backends[2] = {"cpu-ref", "cpu"};
  for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++)
    for (int bi = 0; bi < 2; bi++) {
      th_rng r;
      th_rng_init(&r, th_seed() + i);
      kbuf k;
      build(&bad_base, &r, &k);
      flashc_kvcache kv = cache_of(&bad_base, &k);
      flashc_params p = params_of(&bad_base);
      flashc_tensor *o = &k.o;
      float *lse = k.lse;
      bads[i].fn(&k, &kv, &p, &o, &lse);
      kv.k_new = kv.k_new ? &k.kn : NULL; /* the breaker may have changed k_new's sizes in place */
      const int64_t n_o = bad_base.batch * bad_base.sq * bad_base.hq * bad_base.d;
      memset(k.o_mem, TH_POISON_BYTE, (size_t)n_o * 4);
      void *kc0 = malloc(k.kc_bytes), *vc0 = malloc(k.kc_bytes);
      memcpy(kc0, k.kc_mem, k.kc_bytes), memcpy(vc0, k.vc_mem, k.kc_bytes);
      flashc_handle h;
      flashc_create(&h, backends[bi]);
      const flashc_status st = flashc_forward_kvcache(h, &k.q, &kv, o, lse, &p);
      const char *msg = flashc_last_error();
      CHECK(st == bads[i].want && strstr(msg, bads[i].words) && strstr(msg, "flashc_forward_kvcache"),
            "%s on %s: status %d, message \"%s\"; expected %d with \"%s\"", bads[i].what, backends[bi], (int)st, msg,
            (int)bads[i].want, bads[i].words);
      bool untouched = memcmp(kc0, k.kc_mem, k.kc_bytes) == 0 && memcmp(vc0, k.vc_mem, k.kc_bytes) == 0;
      for (int64_t e = 0; e < n_o * 4; e++) untouched &= ((unsigned char *)k.o_mem)[e] == TH_POISON_BYTE;
      CHECK(untouched, "%s on %s: a refused call wrote into o or the cache", bads[i].what, backends[bi]);
      if (bi == 0) printf("ok   refused: %-30s %s\n", bads[i].what, msg);
      flashc_destroy(h);
      free(kc0), free(vc0);
      release(&k);
    }
}

/* ---- the CUDA backends: the same checks on the device ------------------------------------------------------- */
#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>

/* The plain low-precision computation of each sequence (th_naive_forward: S, P and O rounded to the dtype), from the
 * cache as gathered by reference(): the baseline of FlashAttention's rule, max error ≤ 2× the baseline's. */
static void baseline(const kcase *c, const kbuf *k, const void *kc0, const void *vc0, double *o, double *lse) {
  const flashc_dtype dt = c->dtype;
  const int64_t d = c->d, rows_q = c->sq * c->hq * d;
  for (int64_t s = 0; s < c->batch; s++) {
    const int64_t cached = k->seqlens[s], len = cached + c->sn;
    double *q = malloc((size_t)(rows_q + 1) * sizeof *q), *K = malloc((size_t)(len * c->hkv * d + 1) * sizeof *K);
    double *V = malloc((size_t)(len * c->hkv * d + 1) * sizeof *V), *l = malloc((size_t)(c->hq * c->sq + 1) * 8);
    for (int64_t i = 0; i < c->sq; i++)
      for (int64_t h = 0; h < c->hq; h++)
        for (int64_t x = 0; x < d; x++)
          q[(i * c->hq + h) * d + x] = th_load(k->q.data, dt, th_index(&k->q, s, i, h, x));
    for (int64_t j = 0; j < len; j++)
      for (int64_t h = 0; h < c->hkv; h++)
        for (int64_t x = 0; x < d; x++) {
          const bool old = j < cached;
          K[(j * c->hkv + h) * d + x] = old ? th_load(kc0, dt, cache_index(c, k, &k->kc, s, j, h) + x)
                                            : th_load(k->kn.data, dt, th_index(&k->kn, s, j - cached, h, x));
          V[(j * c->hkv + h) * d + x] = old ? th_load(vc0, dt, cache_index(c, k, &k->vc, s, j, h) + x)
                                            : th_load(k->vn.data, dt, th_index(&k->vn, s, j - cached, h, x));
        }
    th_attn a = {1, c->sq, len, c->hq, c->hkv, d, params_of(c)};
    th_naive_forward(&a, dt, q, K, V, o + s * rows_q, l);
    memcpy(lse + s * c->hq * c->sq, l, (size_t)(c->hq * c->sq) * sizeof *l);
    free(q), free(K), free(V), free(l);
  }
}

/* Bytes before and after each device cache, filled with GUARD_BYTE: a write outside the cache shows there. */
enum { GUARD = 4096, GUARD_BYTE = 0x5A };

static bool cuda_ok(cudaError_t e, const char *what) {
  return th_check(e == cudaSuccess, "test_kvcache: %s: %s", what, cudaGetErrorString(e));
}

/* A device copy of `bytes` of host memory (NULL: every byte `fill`), between two guard regions; returns the start
 * of the copy (the allocation starts GUARD bytes before), or NULL after a recorded failure. */
static void *dev_new(const void *host, size_t bytes, int fill) {
  char *m = NULL;
  if (!cuda_ok(cudaMalloc((void **)&m, bytes + 2 * GUARD), "cudaMalloc")) return NULL;
  cuda_ok(cudaMemset(m, GUARD_BYTE, bytes + 2 * GUARD), "cudaMemset");
  if (host)
    cuda_ok(cudaMemcpy(m + GUARD, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  else
    cuda_ok(cudaMemset(m + GUARD, fill, bytes), "cudaMemset");
  return m + GUARD;
}

static void dev_free(void *d) {
  if (d) cudaFree((char *)d - GUARD);
}

/* The copy back into host (bytes), and whether both guard regions are intact. */
static bool dev_back(void *host, const void *d, size_t bytes) {
  unsigned char *all = malloc(bytes + 2 * GUARD);
  bool guards = cuda_ok(cudaMemcpy(all, (const char *)d - GUARD, bytes + 2 * GUARD, cudaMemcpyDeviceToHost),
                        "cudaMemcpy to host");
  for (size_t i = 0; i < GUARD && guards; i++) guards = all[i] == GUARD_BYTE && all[GUARD + bytes + i] == GUARD_BYTE;
  memcpy(host, all + GUARD, bytes);
  free(all);
  return guards;
}

/* How a GPU case is broken after its reference is computed (on the device copy only): sequence 1 of the batch gets
 * a block index out of range, a negative one, a length past the capacity or a negative length. Its outputs must be
 * NaN, nothing appended for it; sequence 0 is unaffected. */
enum { BREAK_NONE, BREAK_INDEX_HIGH, BREAK_INDEX_NEGATIVE, BREAK_LENGTH_PAST, BREAK_LENGTH_NEGATIVE };
static const char *const break_names[] = {"", "block index past the pool", "negative block index",
                                          "length past the capacity", "negative length"};

/* Case c on CUDA backend `backend` ("auto" allowed): the device copies of the host case, outputs poisoned, the call,
 * then o and lse against the fp64 reference with FlashAttention's rule (≤ 2× the plain low-precision computation's
 * error, plus 4u of the output's magnitude, as test_backends.c), rows that see no key exactly 0 and −inf, the
 * caches (appended rows, nothing else, nothing outside them). */
static void gpu_case(const kcase *c, const char *backend, int breakage, uint64_t seed) {
  th_rng r;
  th_rng_init(&r, seed);
  kbuf k;
  build(c, &r, &k);
  const flashc_dtype dt = c->dtype;
  const size_t es = es_of(dt);
  const int64_t n_o = c->batch * c->sq * c->hq * c->d, n_lse = c->batch * c->hq * c->sq;
  const int64_t bad_o = breakage ? n_o / c->batch : n_o, bad_lse = breakage ? n_lse / c->batch : n_lse; /* checked */
  void *kc0 = malloc(k.kc_bytes + 1), *vc0 = malloc(k.kc_bytes + 1);
  memcpy(kc0, k.kc_mem, k.kc_bytes), memcpy(vc0, k.vc_mem, k.kc_bytes);
  double *ref_o = malloc((size_t)(n_o + 1) * 8), *ref_lse = malloc((size_t)(n_lse + 1) * 8);
  double *base_o = malloc((size_t)(n_o + 1) * 8), *base_lse = malloc((size_t)(n_lse + 1) * 8);
  reference(c, &k, kc0, vc0, ref_o, ref_lse);
  baseline(c, &k, kc0, vc0, base_o, base_lse);

  /* The cache as it must be afterwards: k_new/v_new at cache_seqlens, for every sequence that is not broken. */
  unsigned char *want_k, *want_v;
  expected_caches(c, &k, kc0, vc0, breakage ? 1 : c->batch, &want_k, &want_v);
  if (breakage == BREAK_INDEX_HIGH) k.table[1 * k.table_stride + 1] = (int32_t)k.num_blocks + 5;
  if (breakage == BREAK_INDEX_NEGATIVE) k.table[1 * k.table_stride + 0] = -1;
  if (breakage == BREAK_LENGTH_PAST) k.seqlens[1] = (int32_t)(c->capacity - c->sn + 1);
  if (breakage == BREAK_LENGTH_NEGATIVE) k.seqlens[1] = -3;

  /* Device copies: tensors keep their strides, the data pointer moves. */
  const size_t q_bytes = (size_t)n_o * es, kn_bytes = (size_t)(c->batch * c->sn * c->hkv * c->d) * es;
  /* Outputs poisoned: NaN (an element left unwritten fails), or finite where NaN is the expected answer. */
  const int poison = breakage ? 0x11 : TH_POISON_BYTE;
  void *dq = dev_new(k.q_mem, q_bytes, 0), *d_o = dev_new(NULL, q_bytes, poison);
  void *dkc = dev_new(k.kc_mem, k.kc_bytes, 0), *dvc = dev_new(k.vc_mem, k.kc_bytes, 0);
  void *dkn = c->sn ? dev_new(k.kn_mem, kn_bytes, 0) : NULL, *dvn = c->sn ? dev_new(k.vn_mem, kn_bytes, 0) : NULL;
  float *dlse = dev_new(NULL, (size_t)n_lse * sizeof(float), poison);
  int32_t *dlens = dev_new(k.seqlens, (size_t)c->batch * sizeof(int32_t), 0), *dtable = NULL;
  if (c->page_size) dtable = dev_new(k.table, (size_t)(c->batch * k.table_stride) * sizeof(int32_t), 0);
  flashc_tensor q = k.q, o = k.o, kn = k.kn, vn = k.vn;
  q.data = dq, o.data = d_o, kn.data = dkn, vn.data = dvn;
  flashc_kvcache kv = cache_of(c, &k);
  kv.k_cache.data = k.kc.data ? dkc : NULL;
  kv.v_cache.data = k.vc.data ? dvc : NULL;
  kv.cache_seqlens = dlens;
  if (c->page_size) kv.block_table = dtable;
  if (c->sn) kv.k_new = &kn, kv.v_new = &vn;
  const flashc_params p = params_of(c);

  flashc_handle h = NULL;
  const int failures = th_failures();
  char what[160];
  snprintf(what, sizeof what, "%s on %s%s%s", c->name, backend, breakage ? ", " : "", break_names[breakage]);
  if (!CHECK(flashc_create(&h, backend) == FLASHC_OK, "%s: flashc_create: %s", what, flashc_last_error())) goto done;
  const flashc_status st = flashc_forward_kvcache(h, &q, &kv, &o, dlse, &p);
  if (!CHECK(st == FLASHC_OK, "%s: status %d: %s", what, (int)st, flashc_last_error())) goto done;
  if (!cuda_ok(cudaDeviceSynchronize(), what)) goto done;
  CHECK(strncmp(flashc_handle_last_backend(h), "cuda-", 5) == 0, "%s: ran on %s", what, flashc_handle_last_backend(h));

  void *o_host = malloc(q_bytes + 1);
  float *lse = malloc((size_t)n_lse * sizeof(float) + 1);
  unsigned char *kc1 = malloc(k.kc_bytes + 1), *vc1 = malloc(k.kc_bytes + 1);
  bool guards = dev_back(o_host, d_o, q_bytes) && dev_back(lse, dlse, (size_t)n_lse * sizeof(float));
  guards &= dev_back(kc1, dkc, k.kc_bytes) && dev_back(vc1, dvc, k.kc_bytes);
  CHECK(guards, "%s: a write outside o, lse or the caches (a guard region changed)", what);
  double *od = malloc((size_t)(n_o + 1) * 8), *ld = malloc((size_t)(n_lse + 1) * 8);
  for (int64_t i = 0; i < n_o; i++) od[i] = th_load(o_host, dt, i);
  for (int64_t i = 0; i < n_lse; i++) ld[i] = lse[i];
  /* o and lse of the sequences that are not broken (sequence 0 when one is): the rule of test_backends.c */
  const double o_mag = fmax(th_abs_max(ref_o, bad_o), 1e-3);
  const th_verdict vo = th_judge(od, base_o, ref_o, bad_o, 2.0, 4.0 * th_unit_roundoff(dt) * o_mag);
  const th_verdict vl =
      th_judge(ld, base_lse, ref_lse, bad_lse, 2.0, 8.0 * 0x1p-24 * fmax(1.0, th_abs_max(ref_lse, bad_lse)));
  char msg[240];
  th_format_verdict(msg, sizeof msg, "o", &vo);
  CHECK(vo.pass, "%s: %s", what, msg);
  th_format_verdict(msg, sizeof msg, "lse", &vl);
  CHECK(vl.pass, "%s: %s", what, msg);
  int64_t wrong = 0;
  for (int64_t i = 0; i < bad_lse; i++) /* a row that sees no key: o = +0 and lse = −inf exactly */
    if (ref_lse[i] == -INFINITY) {
      const int64_t s = i / (c->hq * c->sq), hh = i / c->sq % c->hq, row = i % c->sq;
      wrong += lse[i] != -INFINITY;
      for (int64_t x = 0; x < c->d; x++) wrong += od[((s * c->sq + row) * c->hq + hh) * c->d + x] != 0.0;
    }
  CHECK(wrong == 0, "%s: %lld values of rows that see no key are not o = 0, lse = -inf", what, (long long)wrong);
  if (breakage) { /* every output of sequence 1 is NaN */
    wrong = 0;
    for (int64_t i = bad_o; i < n_o; i++) wrong += !isnan(od[i]);
    for (int64_t i = bad_lse; i < n_lse; i++) wrong += !isnan(ld[i]);
    CHECK(wrong == 0, "%s: %lld outputs of the broken sequence are not NaN", what, (long long)wrong);
  }
  CHECK(memcmp(kc1, want_k, k.kc_bytes) == 0 && memcmp(vc1, want_v, k.kc_bytes) == 0,
        "%s: the caches after the call are not the caches before with k_new/v_new appended%s", what,
        breakage ? " for sequence 0 only" : "");
  if (th_failures() == failures) printf("ok   %-40s o %.1e (base %.1e)\n", what, vo.err.max_abs, vo.base.max_abs);
  free(o_host), free(lse), free(kc1), free(vc1), free(od), free(ld);
done:
  flashc_destroy(h);
  dev_free(dq), dev_free(d_o), dev_free(dkc), dev_free(dvc), dev_free(dkn), dev_free(dvn), dev_free(dlse);
  dev_free(dlens), dev_free(dtable);
  free(kc0), free(vc0), free(ref_o), free(ref_lse), free(base_o), free(base_lse), free(want_k), free(want_v);
  release(&k);
}

#define R (-1)
static const kcase gpu_cases[] = {
    /* name                       dtype       b  sq sn hq  hkv d    page cap   causal wl   wr  cached  splits bhsd */
    {"gpu dense gqa 32/8", FLASHC_BF16, 2, 1, 1, 32, 8, 128, 0, 700, 1, -1, -1, {R, 650}, 0, 0},
    {"gpu paged 16 gqa spec 4", FLASHC_BF16, 3, 4, 4, 32, 8, 128, 16, 320, 1, -1, -1, {R, 14, 0}, 0, 0},
    {"gpu paged 256 mqa", FLASHC_F16, 2, 1, 1, 32, 1, 64, 256, 1024, 1, -1, -1, {R, 700}, 0, 0},
    {"gpu mqa 64 rows", FLASHC_BF16, 1, 2, 2, 32, 1, 64, 0, 500, 1, -1, -1, {333}, 0, 0},
    {"gpu splits 1", FLASHC_BF16, 2, 1, 0, 8, 2, 128, 0, 3000, 0, -1, -1, {2999, 1234}, 1, 0},
    {"gpu splits 2", FLASHC_BF16, 2, 1, 0, 8, 2, 128, 0, 3000, 0, -1, -1, {2999, 1234}, 2, 0},
    {"gpu splits many", FLASHC_BF16, 1, 4, 4, 16, 2, 128, 256, 4096, 1, -1, -1, {4000}, 64, 0},
    {"gpu long default splits", FLASHC_BF16, 1, 1, 1, 32, 8, 128, 256, 8192, 1, -1, -1, {8100}, 0, 0},
    {"gpu window", FLASHC_BF16, 2, 3, 1, 8, 2, 64, 16, 1024, 1, 100, -1, {R, 900}, 0, 0},
    /* dense whole blocks (the walking loader) next to a window (the per-warp mask skip), lengths on 64-key edges */
    {"gpu dense window whole blocks", FLASHC_BF16, 2, 1, 1, 8, 2, 128, 0, 1024, 1, 100, -1, {1023, 511}, 0, 0},
    {"gpu dense d64 64-key edges", FLASHC_F16, 1, 2, 2, 8, 8, 64, 0, 640, 1, -1, -1, {638}, 3, 0},
    {"gpu window both sides", FLASHC_F16, 2, 4, 0, 4, 2, 96, 0, 80, 0, 7, 2, {R, 60}, 0, 0},
    {"gpu empty caches", FLASHC_BF16, 2, 1, 0, 4, 1, 64, 0, 10, 1, -1, -1, {0, 0}, 0, 0},
    {"gpu paged empty + full", FLASHC_F16, 2, 2, 0, 4, 2, 64, 16, 48, 1, -1, -1, {0, 48}, 3, 0},
    {"gpu capacity 0", FLASHC_BF16, 2, 1, 0, 2, 1, 64, 0, 0, 0, -1, -1, {0, 0}, 0, 0},
    {"gpu head dim 59 (unaligned)", FLASHC_BF16, 2, 2, 2, 4, 2, 59, 16, 96, 1, -1, -1, {R, 15}, 0, 0},
    {"gpu head dim 256", FLASHC_BF16, 1, 1, 1, 8, 2, 256, 0, 600, 1, -1, -1, {555}, 0, 0},
    {"gpu bhsd cache", FLASHC_F16, 2, 1, 1, 8, 2, 128, 0, 257, 1, -1, -1, {R, 256}, 0, 1},
    {"gpu not causal, odd pages", FLASHC_BF16, 3, 3, 2, 6, 3, 40, 5, 45, 0, -1, -1, {R, 4, 9}, 0, 0},
    /* Paged key blocks of 64 rows looked up a block ahead through a ring of row buffers: one split walking many
     * blocks (the ring wraps), pages that do not divide 64 (a block over 2 or 3 pages, a page boundary between a
     * thread's rows), splits that start inside a page, d 256 (2 stages) and d 64, unaligned rows. */
    {"gpu paged 48 one split", FLASHC_BF16, 2, 1, 1, 32, 8, 128, 48, 1440, 1, -1, -1, {R, 1300}, 1, 0},
    {"gpu paged 48 d 64 splits 3", FLASHC_F16, 3, 2, 1, 4, 2, 64, 48, 480, 1, -1, -1, {R, 47, 300}, 3, 0},
    {"gpu paged 256 one split", FLASHC_BF16, 1, 4, 4, 16, 2, 128, 256, 2048, 1, -1, -1, {1900}, 1, 0},
    {"gpu paged 16 d 256 splits 2", FLASHC_BF16, 2, 2, 1, 8, 2, 256, 16, 640, 1, -1, -1, {R, 600}, 2, 0},
    {"gpu paged 48 d 59 one split", FLASHC_BF16, 2, 1, 1, 4, 2, 59, 48, 480, 1, -1, -1, {R, 450}, 1, 0},
    {"gpu paged 48 window", FLASHC_BF16, 2, 3, 1, 8, 2, 128, 48, 960, 1, 200, -1, {R, 900}, 1, 0},
};
/* The broken cases: sequence 1 reads entries 0..2 of its row (33 + 2 keys, pages of 16). */
static const kcase gpu_bad_base = {"gpu bad", FLASHC_BF16, 2, 2, 2, 8, 2, 64, 16, 64, 1, -1, -1, {20, 33}, 0, 0};
#undef R

static bool is_decode_backend(const char *name) {
  return strcmp(name, "cuda-mma") == 0 || strcmp(name, "cuda-hopper") == 0;
}
#endif /* FLASHC_TEST_CUDA */

/* cuda-mma and cuda-hopper against the reference on the GPU cases; the other CUDA backends refuse the call. */
static void cuda_backends(void) {
  int seen = 0, decoders = 0;
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || info.device != FLASHC_DEVICE_CUDA) continue;
    seen++;
    if (!info.usable) {
      printf("skip %s: %s\n", info.name, info.why_unusable);
      continue;
    }
#ifdef FLASHC_TEST_CUDA
    if (is_decode_backend(info.name)) {
      decoders++;
      for (size_t c = 0; c < sizeof gpu_cases / sizeof gpu_cases[0]; c++)
        gpu_case(&gpu_cases[c], info.name, BREAK_NONE, th_seed() + c * 7919u);
      for (int br = BREAK_INDEX_HIGH; br <= BREAK_LENGTH_NEGATIVE; br++)
        gpu_case(&gpu_bad_base, info.name, br, th_seed() + (uint64_t)br);
      continue;
    }
#endif
    th_rng r;
    th_rng_init(&r, th_seed());
    kbuf k;
    build(&bad_base, &r, &k);
    const flashc_kvcache kv = cache_of(&bad_base, &k);
    flashc_handle h;
    flashc_create(&h, info.name);
    /* host tensors: the backend refuses before it would look at where they live */
    const flashc_status st = flashc_forward_kvcache(h, &k.q, &kv, &k.o, k.lse, NULL);
    CHECK(st == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "KV cache"), "%s: status %d (%s)", info.name,
          (int)st, flashc_last_error());
    flashc_destroy(h);
    release(&k);
    printf("ok   %s refuses: %s\n", info.name, flashc_last_error());
  }
#ifdef FLASHC_TEST_CUDA
  /* auto sends device tensors to a CUDA backend */
  if (decoders) gpu_case(&gpu_cases[0], "auto", BREAK_NONE, th_seed());
#else
  (void)decoders;
#endif
  if (!seen) printf("skip CUDA backends: no CUDA device (this build has none)\n");
}

int main(void) {
  th_begin("test_kvcache");
  correctness();
  bad_calls();
  cuda_backends();
  return th_end();
}
