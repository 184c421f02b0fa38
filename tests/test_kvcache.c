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
 * aliasing, struct sizes, params of other calls) are refused with a message naming the value, nothing written;
 * and the CUDA backends refuse the call (FLASHC_ERR_UNSUPPORTED), skipped with "no CUDA device" where there is none.
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
    const size_t es = es_of(dt);
    unsigned char *want_k = malloc(k.kc_bytes + 1), *want_v = malloc(k.kc_bytes + 1);
    memcpy(want_k, kc0, k.kc_bytes), memcpy(want_v, vc0, k.kc_bytes);
    for (int64_t s = 0; s < c->batch; s++)
      for (int64_t t = 0; t < c->sn; t++)
        for (int64_t hh = 0; hh < c->hkv; hh++) {
          const int64_t at = k.seqlens[s] + t;
          memcpy(want_k + cache_index(c, &k, &k.kc, s, at, hh) * (int64_t)es,
                 (char *)k.kn.data + th_index(&k.kn, s, t, hh, 0) * (int64_t)es, (size_t)c->d * es);
          memcpy(want_v + cache_index(c, &k, &k.vc, s, at, hh) * (int64_t)es,
                 (char *)k.vn.data + th_index(&k.vn, s, t, hh, 0) * (int64_t)es, (size_t)c->d * es);
        }
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

/* ---- the CUDA backends refuse the call (this slice) -------------------------------------------------------- */
static void cuda_refuses(void) {
  int seen = 0;
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || info.device != FLASHC_DEVICE_CUDA) continue;
    seen++;
    if (!info.usable) {
      printf("skip %s: %s\n", info.name, info.why_unusable);
      continue;
    }
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
  if (!seen) printf("skip CUDA backends: no CUDA device (this build has none)\n");
}

int main(void) {
  th_begin("test_kvcache");
  correctness();
  bad_calls();
  cuda_refuses();
  return th_end();
}
