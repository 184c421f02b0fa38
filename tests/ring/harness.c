/* harness.c — the ring tests' shared parts (see harness.h). */
#include "harness.h"

#include "internal.h"  /* fc_load/fc_store: f16/bf16 conversion */
#include "ring/ring.h" /* fc_ring_set_native_partials */

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- checks ------------------------------------------------------------------------------------------- */
int ring_test_verbose;
_Thread_local int ring_test_rank;
static atomic_int failures;

int ring_test_failures(void) { return atomic_load(&failures); }

void ring_test_fail(const char *file, int line, const char *fmt, ...) {
  atomic_fetch_add(&failures, 1);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  fprintf(stderr, "FAIL rank %d (%s:%d): %s\n", ring_test_rank, base ? base + 1 : file, line, msg);
}

/* ---- cases -------------------------------------------------------------------------------------------- */
#define CONTIG FLASHC_RING_CONTIGUOUS
#define ZIGZAG FLASHC_RING_ZIGZAG
#define BR     FLASHC_ALIGN_BOTTOM_RIGHT
#define TL     FLASHC_ALIGN_TOP_LEFT

const tcase ring_cases[] = {
    /* name                        backend  dtype        B  Lq  Lk  Hq Hkv  D  causal wl  wr  align layout nat bhsd */
    {"full, odd shard, GQA, d59", "cpu", FLASHC_F32, 2, 13, 13, 4, 2, 59, 0, -1, -1, BR, CONTIG, 0, 0},
    {"causal contiguous, MQA", "cpu", FLASHC_F32, 1, 16, 16, 4, 1, 64, 1, -1, -1, BR, CONTIG, 0, 0},
    {"causal zigzag, d111", "cpu", FLASHC_F32, 1, 14, 14, 3, 3, 111, 1, -1, -1, BR, ZIGZAG, 0, 0},
    {"causal zigzag bf16, GQA", "cpu", FLASHC_BF16, 2, 16, 16, 4, 2, 64, 1, -1, -1, BR, ZIGZAG, 0, 0},
    {"full contiguous f16", "cpu", FLASHC_F16, 1, 11, 11, 2, 1, 32, 0, -1, -1, BR, CONTIG, 0, 0},
    {"causal zigzag f16, strided", "cpu", FLASHC_F16, 2, 10, 10, 4, 2, 40, 1, -1, -1, BR, ZIGZAG, 0, 1},
    {"causal, sq = 2 sk, top-left", "cpu", FLASHC_BF16, 1, 16, 8, 2, 2, 32, 1, -1, -1, TL, CONTIG, 0, 0},
    {"causal, sq = 2 sk, masked rows", "cpu", FLASHC_F32, 1, 16, 8, 2, 1, 32, 1, -1, -1, BR, CONTIG, 0, 0},
    {"window (9, 3) zigzag", "cpu", FLASHC_F32, 1, 12, 12, 2, 2, 48, 0, 9, 3, BR, ZIGZAG, 0, 0},
    {"causal window 5 contiguous", "cpu", FLASHC_BF16, 1, 12, 12, 2, 1, 16, 1, 5, -1, BR, CONTIG, 0, 0},
    {"seqlen 1 per rank, causal", "cpu", FLASHC_F32, 1, 1, 1, 2, 1, 16, 1, -1, -1, BR, CONTIG, 0, 0},
    {"causal zigzag, cpu-ref", "cpu-ref", FLASHC_F32, 1, 12, 12, 2, 1, 64, 1, -1, -1, BR, ZIGZAG, 0, 0},
    {"full contiguous bf16, cpu-ref", "cpu-ref", FLASHC_BF16, 1, 9, 9, 2, 2, 24, 0, -1, -1, BR, CONTIG, 0, 0},
    /* the device path's numerics (partials rounded to bf16/f16), on the host */
    {"native bf16 causal zigzag", "cpu", FLASHC_BF16, 1, 16, 16, 4, 2, 64, 1, -1, -1, BR, ZIGZAG, 1, 0},
    {"native f16 full contiguous", "cpu", FLASHC_F16, 1, 12, 12, 2, 1, 32, 0, -1, -1, BR, CONTIG, 1, 0},
    /* sizes the GPU backends' tiles see whole (head dims 64/128, longer shards) */
    {"gpu: causal zigzag bf16 d128", "cpu", FLASHC_BF16, 1, 128, 128, 4, 2, 128, 1, -1, -1, BR, ZIGZAG, 0, 0},
    {"gpu: full contiguous f16 d64", "cpu", FLASHC_F16, 2, 96, 96, 4, 4, 64, 0, -1, -1, BR, CONTIG, 0, 0},
};
const int ring_n_cases = (int)(sizeof ring_cases / sizeof ring_cases[0]);

flashc_params case_params(const tcase *c) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal;
  p.window_left = c->wl;
  p.window_right = c->wr;
  p.align = c->align;
  return p;
}

flashc_tensor case_tensor(void *data, flashc_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int bhsd) {
  return bhsd ? flashc_tensor_bhsd(data, dt, b, s, h, d) : flashc_tensor_bshd(data, dt, b, s, h, d);
}

int case_has_backward(const tcase *c) { return strcmp(c->backend, "cpu-ref") != 0; }

int backend_takes(const char *backend, const tcase *c) {
  flashc_backend_info info;
  for (int i = 0; i < flashc_backend_count(); i++)
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, backend) == 0)
      return info.usable && (info.dtypes & (1u << c->dt)) && c->D >= info.min_head_dim && c->D <= info.max_head_dim;
  return 0;
}

/* ---- data --------------------------------------------------------------------------------------------- */
static uint64_t rng_state;
void ring_rng_seed(uint64_t seed) { rng_state = seed; }
double ring_uniform(void) { /* splitmix64 → [−1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

/* n values in dtype (rounded once) and the same values in f64. */
static void *random_tensor(flashc_dtype dt, int64_t n, double scale, double **as_f64) {
  void *x = malloc((size_t)n * flashc_dtype_size(dt));
  *as_f64 = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    fc_store(x, dt, i, scale * ring_uniform());
    (*as_f64)[i] = fc_load(x, dt, i);
  }
  return x;
}

void whole_make(const tcase *c, int world, uint64_t seed, whole *w) {
  w->sq = c->Lq * world;
  w->sk = c->Lk * world;
  w->nq = c->B * w->sq * c->Hq * c->D;
  w->nk = c->B * w->sk * c->Hkv * c->D;
  w->nlse = c->B * c->Hq * w->sq;
  ring_rng_seed(seed);
  /* q and k a little larger than v: softmax rows with some contrast */
  w->q = random_tensor(c->dt, w->nq, 1.5, &w->q64);
  w->k = random_tensor(c->dt, w->nk, 1.5, &w->k64);
  w->v = random_tensor(c->dt, w->nk, 1.0, &w->v64);
  w->dout = random_tensor(c->dt, w->nq, 1.0, &w->do64);
}

void whole_free(whole *w) {
  free(w->q), free(w->k), free(w->v), free(w->dout);
  free(w->q64), free(w->k64), free(w->v64), free(w->do64);
}

/* ---- placement ---------------------------------------------------------------------------------------- */
void *place(int on_device, const void *host, size_t bytes) {
#ifdef FLASHC_TEST_CUDA
  if (on_device) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes) != cudaSuccess) {
      CHECK(0, "cudaMalloc of %zu bytes failed", bytes);
      return NULL;
    }
    if (host)
      cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    else
      cudaMemset(d, 0xff, bytes); /* all-ones bytes: NaN in f32, f16 and bf16 */
    return d;
  }
#else
  CHECK(!on_device, "device memory in a build without CUDA");
#endif
  void *h = malloc(bytes);
  if (host)
    memcpy(h, host, bytes);
  else
    memset(h, 0xff, bytes);
  return h;
}

void fetch(int on_device, void *host, const void *placed, size_t bytes) {
#ifdef FLASHC_TEST_CUDA
  if (on_device) {
    CHECK(cudaMemcpy(host, placed, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy to the host failed");
    return;
  }
#endif
  (void)on_device;
  memmove(host, placed, bytes);
}

void unplace(int on_device, void *p) {
#ifdef FLASHC_TEST_CUDA
  if (on_device) {
    cudaFree(p);
    return;
  }
#endif
  (void)on_device;
  free(p);
}

void outputs_alloc(outputs *x, flashc_dtype dt, int64_t nq, int64_t nk, int64_t nlse) {
  size_t es = flashc_dtype_size(dt);
  x->o = malloc((size_t)nq * es);
  x->dq = malloc((size_t)nq * es);
  x->dk = malloc((size_t)nk * es);
  x->dv = malloc((size_t)nk * es);
  x->lse = malloc((size_t)nlse * sizeof(float));
}

void outputs_free(outputs *x) {
  free(x->o), free(x->dq), free(x->dk), free(x->dv), free(x->lse);
  memset(x, 0, sizeof *x);
}

/* A [b, s, h, d] tensor of any strides into a dense BSHD buffer. */
static void to_dense(const flashc_tensor *t, void *dense) {
  size_t es = flashc_dtype_size(t->dtype);
  for (int64_t b = 0; b < t->size[0]; b++)
    for (int64_t s = 0; s < t->size[1]; s++)
      for (int64_t h = 0; h < t->size[2]; h++)
        memcpy((char *)dense + ((b * t->size[1] + s) * t->size[2] + h) * t->size[3] * (int64_t)es,
               (const char *)t->data + (b * t->stride[0] + s * t->stride[1] + h * t->stride[2]) * (int64_t)es,
               (size_t)t->size[3] * es);
}

/* ---- one rank's part ------------------------------------------------------------------------------------ */
flashc_status ring_run_rank(const tcase *c, flashc_ring ring, int world, int rank, const whole *w, int on_device,
                            outputs *local) {
  flashc_dtype dt = c->dt;
  size_t es = flashc_dtype_size(dt);
  int64_t lq_n = c->B * c->Lq * c->Hq * c->D, lk_n = c->B * c->Lk * c->Hkv * c->D, llse = c->B * c->Hq * c->Lq;
  size_t qb = (size_t)lq_n * es, kb = (size_t)lk_n * es, lb = (size_t)llse * sizeof(float);
  outputs_alloc(local, dt, lq_n, lk_n, llse);

  /* shards on the host (in the case's layout: BSHD or strided BHSD), then where the ring computes */
  flashc_tensor fq = flashc_tensor_bshd(w->q, dt, c->B, w->sq, c->Hq, c->D),
                fk = flashc_tensor_bshd(w->k, dt, c->B, w->sk, c->Hkv, c->D),
                fv = flashc_tensor_bshd(w->v, dt, c->B, w->sk, c->Hkv, c->D),
                fdo = flashc_tensor_bshd(w->dout, dt, c->B, w->sq, c->Hq, c->D);
  void *hq = malloc(qb), *hk = malloc(kb), *hv = malloc(kb), *hdo = malloc(qb);
  flashc_tensor tq = case_tensor(hq, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tk = case_tensor(hk, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tv = case_tensor(hv, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tdo = case_tensor(hdo, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd);
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fq, &tq));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fk, &tk));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fv, &tv));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fdo, &tdo));
  void *pq = place(on_device, hq, qb), *pk = place(on_device, hk, kb), *pv = place(on_device, hv, kb),
       *pdo = place(on_device, hdo, qb), *po = place(on_device, NULL, qb), *plse = place(on_device, NULL, lb),
       *pdq = place(on_device, NULL, qb), *pdk = place(on_device, NULL, kb), *pdv = place(on_device, NULL, kb),
       *po2 = place(on_device, NULL, qb);
  void *placed[] = {pq, pk, pv, pdo, po, plse, pdq, pdk, pdv, po2};
  tq.data = pq, tk.data = pk, tv.data = pv, tdo.data = pdo;
  flashc_tensor to = case_tensor(po, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tdq = case_tensor(pdq, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tdk = case_tensor(pdk, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tdv = case_tensor(pdv, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd), to2 = to;
  to2.data = po2;
  flashc_params p = case_params(c);

  CHECK_OK(fc_ring_set_native_partials(ring, c->native));
  flashc_status sf = flashc_ring_forward(ring, &p, c->layout, &tq, &tk, &tv, &to, plse);
  if (sf == FLASHC_OK) {
    /* Repeats are bit-identical (fixed order of blocks and merges). */
    CHECK_OK(flashc_ring_forward(ring, &p, c->layout, &tq, &tk, &tv, &to2, NULL));
    void *a = malloc(qb), *b = malloc(qb);
    fetch(on_device, a, po, qb);
    fetch(on_device, b, po2, qb);
    CHECK(memcmp(a, b, qb) == 0, "%s: a repeated ring forward differs", c->name);
    free(a), free(b);
    flashc_status sb = flashc_ring_backward(ring, &p, c->layout, &tq, &tk, &tv, &to, plse, &tdo, &tdq, &tdk, &tdv);
    if (case_has_backward(c))
      CHECK(sb == FLASHC_OK, "%s: ring backward: %s", c->name, flashc_last_error());
    else
      CHECK(sb == FLASHC_ERR_UNSUPPORTED, "%s: ring backward on %s: got %s", c->name, c->backend,
            flashc_status_string(sb));
    /* dense BSHD host copies of the shards */
    flashc_tensor *outs[4] = {&to, &tdq, &tdk, &tdv};
    void *dst[4] = {local->o, local->dq, local->dk, local->dv};
    size_t bytes[4] = {qb, qb, kb, kb};
    for (int i = 0; i < 4; i++) {
      void *h = malloc(bytes[i]);
      fetch(on_device, h, outs[i]->data, bytes[i]);
      flashc_tensor t = *outs[i];
      t.data = h;
      to_dense(&t, dst[i]);
      free(h);
    }
    fetch(on_device, local->lse, plse, lb);
  }
  CHECK_OK(fc_ring_set_native_partials(ring, 0));
  for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++) unplace(on_device, placed[i]);
  free(hq), free(hk), free(hv), free(hdo);
  return sf;
}

void ring_unshard_outputs(const tcase *c, int world, int rank, const outputs *local, outputs *all) {
  flashc_dtype dt = c->dt;
  int64_t sq = c->Lq * world, sk = c->Lk * world;
  flashc_tensor parts[4] = {flashc_tensor_bshd(local->o, dt, c->B, c->Lq, c->Hq, c->D),
                            flashc_tensor_bshd(local->dq, dt, c->B, c->Lq, c->Hq, c->D),
                            flashc_tensor_bshd(local->dk, dt, c->B, c->Lk, c->Hkv, c->D),
                            flashc_tensor_bshd(local->dv, dt, c->B, c->Lk, c->Hkv, c->D)},
                wholes[4] = {flashc_tensor_bshd(all->o, dt, c->B, sq, c->Hq, c->D),
                             flashc_tensor_bshd(all->dq, dt, c->B, sq, c->Hq, c->D),
                             flashc_tensor_bshd(all->dk, dt, c->B, sk, c->Hkv, c->D),
                             flashc_tensor_bshd(all->dv, dt, c->B, sk, c->Hkv, c->D)};
  for (int i = 0; i < 4; i++) CHECK_OK(flashc_ring_unshard(c->layout, world, rank, &parts[i], &wholes[i]));
  CHECK_OK(flashc_ring_unshard_lse(c->layout, world, rank, c->B, c->Hq, sq, local->lse, all->lse));
}

/* ---- the verdict ---------------------------------------------------------------------------------------- */
/* One forward + backward on the whole tensors with one backend (the reference: cpu-ref in f64, host). */
static flashc_status single(const char *backend, const tcase *c, flashc_dtype dt, int on_device, const void *q,
                            const void *k, const void *v, const void *dout, outputs *out, int64_t sq, int64_t sk) {
  flashc_handle h;
  flashc_status s = flashc_create(&h, backend);
  if (s != FLASHC_OK) return s;
  flashc_set_threads(h, 1);
  flashc_params p = case_params(c);
  size_t es = flashc_dtype_size(dt), qb = (size_t)(c->B * sq * c->Hq * c->D) * es,
         kb = (size_t)(c->B * sk * c->Hkv * c->D) * es, lb = (size_t)(c->B * c->Hq * sq) * sizeof(float);
  void *pq = place(on_device, q, qb), *pk = place(on_device, k, kb), *pv = place(on_device, v, kb),
       *pdo = place(on_device, dout, qb), *po = place(on_device, NULL, qb), *pdq = place(on_device, NULL, qb),
       *pdk = place(on_device, NULL, kb), *pdv = place(on_device, NULL, kb), *plse = place(on_device, NULL, lb);
  flashc_tensor tq = flashc_tensor_bshd(pq, dt, c->B, sq, c->Hq, c->D),
                tk = flashc_tensor_bshd(pk, dt, c->B, sk, c->Hkv, c->D),
                tv = flashc_tensor_bshd(pv, dt, c->B, sk, c->Hkv, c->D),
                tdo = flashc_tensor_bshd(pdo, dt, c->B, sq, c->Hq, c->D),
                to = flashc_tensor_bshd(po, dt, c->B, sq, c->Hq, c->D),
                tdq = flashc_tensor_bshd(pdq, dt, c->B, sq, c->Hq, c->D),
                tdk = flashc_tensor_bshd(pdk, dt, c->B, sk, c->Hkv, c->D),
                tdv = flashc_tensor_bshd(pdv, dt, c->B, sk, c->Hkv, c->D);
  s = flashc_forward(h, &p, &tq, &tk, &tv, &to, plse);
  if (s == FLASHC_OK) s = flashc_backward(h, &p, &tq, &tk, &tv, &to, plse, &tdo, &tdq, &tdk, &tdv);
  fetch(on_device, out->o, po, qb); /* cudaMemcpy waits for the work on the default stream */
  fetch(on_device, out->lse, plse, lb);
  fetch(on_device, out->dq, pdq, qb);
  fetch(on_device, out->dk, pdk, kb);
  fetch(on_device, out->dv, pdv, kb);
  void *all[] = {pq, pk, pv, pdo, po, pdq, pdk, pdv, plse};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) unplace(on_device, all[i]);
  flashc_destroy(h);
  return s;
}

/* max |x − ref| over n values; *bad counts non-finite x. */
static double max_err(const void *x, flashc_dtype dt, const double *ref, int64_t n, int *bad) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = fc_load(x, dt, i);
    if (!isfinite(v)) {
      (*bad)++;
      continue;
    }
    e = fmax(e, fabs(v - ref[i]));
  }
  return e;
}

/* lse: finite reference values compared, −inf ones must be −inf. */
static double lse_err(const float *x, const double *ref, int64_t n, int *bad) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ref[i] == -INFINITY) {
      if (x[i] != -INFINITY) (*bad)++;
      continue;
    }
    if (!isfinite(x[i])) {
      (*bad)++;
      continue;
    }
    e = fmax(e, fabs(x[i] - ref[i]));
  }
  return e;
}

static double max_abs(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i])) m = fmax(m, fabs(x[i]));
  return m;
}

int ring_judge(const tcase *c, const char *backend, int on_device, int world, const whole *w, const outputs *ring) {
  flashc_dtype dt = c->dt;
  int64_t nq = w->nq, nk = w->nk, nlse = w->nlse;
  int backward = case_has_backward(c), pass = 1, fails_before = ring_test_failures();
  outputs one, ref;
  outputs_alloc(&one, dt, nq, nk, nlse);
  outputs_alloc(&ref, FLASHC_F64, nq, nk, nlse);
  flashc_status s1 = single(backend, c, dt, on_device, w->q, w->k, w->v, w->dout, &one, w->sq, w->sk);
  CHECK(s1 == FLASHC_OK, "%s: single-device %s: %s", c->name, backend, flashc_last_error());
  flashc_status s2 = single("cpu-ref", c, FLASHC_F64, 0, w->q64, w->k64, w->v64, w->do64, &ref, w->sq, w->sk);
  CHECK(s2 == FLASHC_OK, "%s: reference: %s", c->name, flashc_last_error());
  if (s1 == FLASHC_OK && s2 == FLASHC_OK) {
    const char *names[5] = {"O", "lse", "dQ", "dK", "dV"};
    const void *rings[5] = {ring->o, ring->lse, ring->dq, ring->dk, ring->dv};
    const void *ones[5] = {one.o, one.lse, one.dq, one.dk, one.dv};
    double *lse64 = malloc((size_t)nlse * sizeof(double));
    for (int64_t i = 0; i < nlse; i++) lse64[i] = ref.lse[i];
    const double *refs[5] = {ref.o, lse64, ref.dq, ref.dk, ref.dv};
    int64_t counts[5] = {nq, nlse, nq, nk, nk};
    for (int t = 0; t < (backward ? 5 : 2); t++) {
      int bad_ring = 0, bad_one = 0;
      double e_ring = t == 1 ? lse_err(rings[t], refs[t], counts[t], &bad_ring)
                             : max_err(rings[t], dt, refs[t], counts[t], &bad_ring);
      double e_one =
          t == 1 ? lse_err(ones[t], refs[t], counts[t], &bad_one) : max_err(ones[t], dt, refs[t], counts[t], &bad_one);
      double bar = 2 * e_one + world * ldexp(max_abs(refs[t], counts[t]), -22);
      if ((c->native || on_device) && t != 1) {
        /* Native partials (the device's numerics) are each rounded once to the dtype, half an ulp (2^-(p+1)
         * relative, p = 8 for bf16, 11 for f16) of the partial: O is a convex combination of partials, each
         * bounded by max|V|, so one such rounding; a gradient sums up to 2·world of them. */
        int bits = dt == FLASHC_BF16 ? 8 : dt == FLASHC_F16 ? 11 : 24;
        bar += t == 0 ? ldexp(max_abs(w->v64, nk), -(bits + 1))
                      : 2 * world * ldexp(max_abs(refs[t], counts[t]), -(bits + 1));
      }
      if (ring_test_verbose || e_ring > bar || bad_ring)
        printf("  %-32s %-3s ring %.3e  single %.3e  bar %.3e  (ring/single %.2f)%s\n", c->name, names[t], e_ring,
               e_one, bar, e_one > 0 ? e_ring / e_one : 0.0, bad_ring ? "  NaN/-inf mismatch" : "");
      CHECK(bad_ring == 0, "%s: %s has %d non-finite values (or -inf where the reference has none)", c->name, names[t],
            bad_ring);
      CHECK(e_ring <= bar, "%s: %s error %.3e exceeds 2 x single-device %.3e + floor (bar %.3e)", c->name, names[t],
            e_ring, e_one, bar);
    }
    /* Rows that see no key: O = 0, dQ = 0 exactly. */
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t h = 0; h < c->Hq; h++)
        for (int64_t i = 0; i < w->sq; i++) {
          if (ref.lse[(b * c->Hq + h) * w->sq + i] != -INFINITY) continue;
          for (int64_t d = 0; d < c->D; d++) {
            int64_t at = ((b * w->sq + i) * c->Hq + h) * c->D + d;
            if (fc_load(ring->o, dt, at) != 0.0 || (backward && fc_load(ring->dq, dt, at) != 0.0)) {
              CHECK(0, "%s: row %lld (b %lld h %lld) sees no key but O or dQ is not 0", c->name, (long long)i,
                    (long long)b, (long long)h);
              d = c->D;
              i = w->sq;
            }
          }
        }
    free(lse64);
  }
  pass = ring_test_failures() == fails_before;
  outputs_free(&one);
  outputs_free(&ref);
  return pass;
}
