/*
 * test_ring.c — ring attention against one device and the fp64 reference, on as many ranks as mpiexec starts.
 *
 *   mpiexec -n N test_ring               every case below; exit 0 iff every check passed on every rank
 *   mpiexec -n N test_ring --fault MODE  the peer-failure check (MODE exit or stall), with FLASHC_RING_FAULT
 *                                        set by scripts/ring-test: every rank that lives must get
 *                                        FLASHC_ERR_COMMUNICATION within the timeout
 *
 * For each case every rank builds the same whole tensors (one seed, from rank 0), takes its shard, runs the
 * ring forward and backward, and rank 0 gathers the shards back. Rank 0 also runs the same backend on one
 * device and the fp64 reference (cpu-ref in f64) on the whole tensors, and asserts for O, lse, dQ, dK, dV:
 *   max|ring − ref| ≤ 2·max|single − ref| + world·2⁻²²·max|ref|
 * (the last term: the f32 roundings of the ≤ 2·world block partials an element sums, a few ulps of f32 that
 * matter only where the backend itself is exact to f32, as cpu-ref is). Rows that see no key
 * must give O = 0, lse = −inf, dQ = 0 exactly, and nothing may be NaN. Outputs are poisoned before each call.
 *
 * Environment: FLASHC_TEST_SEED (a fixed seed), FLASHC_RING_TEST_VERBOSE=1 (errors of every case).
 */
#include <flashc.h>
#include <mpi.h>

#include "internal.h"  /* f16/bf16 conversion */
#include "ring/ring.h" /* fc_ring_set_native_partials */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, world, failures, verbose;

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      failures++;                                                                                                      \
      fprintf(stderr, "FAIL rank %d (%s:%d): ", rank, __FILE__, __LINE__);                                             \
      fprintf(stderr, __VA_ARGS__);                                                                                    \
      fprintf(stderr, "\n");                                                                                           \
    }                                                                                                                  \
  } while (0)

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    flashc_status st_ = (call);                                                                                        \
    CHECK(st_ == FLASHC_OK, "%s -> %s: %s", #call, flashc_status_string(st_), flashc_last_error());                    \
  } while (0)

/* ---- data ------------------------------------------------------------------------------------------- */
static uint64_t rng_state;
static double uniform(void) { /* splitmix64 → [−1, 1) */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (double)(z >> 11) / 4503599627370496.0 - 1.0;
}

static double poison_value(void) { return NAN; }

/* n values in dtype (rounded once) and the same values in f64. */
static void *random_tensor(flashc_dtype dt, int64_t n, double scale, double **as_f64) {
  void *x = malloc((size_t)n * flashc_dtype_size(dt));
  *as_f64 = malloc((size_t)n * sizeof(double));
  for (int64_t i = 0; i < n; i++) {
    fc_store(x, dt, i, scale * uniform());
    (*as_f64)[i] = fc_load(x, dt, i);
  }
  return x;
}

static void poison(void *x, flashc_dtype dt, int64_t n) {
  for (int64_t i = 0; i < n; i++) fc_store(x, dt, i, poison_value());
}

/* max |x − ref| over n values; *nan counts non-finite x where ref is finite. */
static double max_err(const void *x, flashc_dtype dt, const double *ref, int64_t n, int *nan) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = fc_load(x, dt, i);
    if (!isfinite(v)) {
      (*nan)++;
      continue;
    }
    double d = fabs(v - ref[i]);
    if (d > e) e = d;
  }
  return e;
}

static double max_abs(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
  return m;
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
    double d = fabs(x[i] - ref[i]);
    if (d > e) e = d;
  }
  return e;
}

/* ---- cases ------------------------------------------------------------------------------------------ */
typedef struct tcase {
  const char *name;
  const char *backend;
  flashc_dtype dt;
  int64_t B, Lq, Lk, Hq, Hkv, D; /* L: local seqlens (the whole sequence is world·L) */
  int causal;
  int64_t wl, wr;
  flashc_causal_align align;
  flashc_ring_layout layout;
  int native; /* host partials in the input dtype, as on the device */
  int bhsd;   /* shards in [b, h, s, d] memory (strided) */
} tcase;

#define CONTIG FLASHC_RING_CONTIGUOUS
#define ZIGZAG FLASHC_RING_ZIGZAG
#define BR     FLASHC_ALIGN_BOTTOM_RIGHT
#define TL     FLASHC_ALIGN_TOP_LEFT

static const tcase cases[] = {
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
};

static flashc_tensor make_tensor(void *data, flashc_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int bhsd) {
  return bhsd ? flashc_tensor_bhsd(data, dt, b, s, h, d) : flashc_tensor_bshd(data, dt, b, s, h, d);
}

/* Gather every rank's shard (of `bytes`) to rank 0 and put it in its place in the whole tensor. */
static void gather_tensor(const tcase *c, const flashc_tensor *shard, flashc_tensor *full) {
  size_t bytes =
      (size_t)(shard->size[0] * shard->size[1] * shard->size[2] * shard->size[3]) * flashc_dtype_size(shard->dtype);
  char *all = rank == 0 ? malloc(bytes * (size_t)world) : NULL;
  MPI_Gather(shard->data, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    for (int r = 0; r < world; r++) {
      flashc_tensor t = *shard;
      t.data = all + bytes * (size_t)r;
      CHECK_OK(flashc_ring_unshard(c->layout, world, r, &t, full));
    }
    free(all);
  }
}

static void gather_lse(const tcase *c, const float *shard, int64_t lq, float *full) {
  size_t n = (size_t)(c->B * c->Hq * lq);
  float *all = rank == 0 ? malloc(n * sizeof(float) * (size_t)world) : NULL;
  MPI_Gather(shard, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    for (int r = 0; r < world; r++)
      CHECK_OK(flashc_ring_unshard_lse(c->layout, world, r, c->B, c->Hq, lq * world, all + n * (size_t)r, full));
    free(all);
  }
}

static flashc_params params_of(const tcase *c) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal;
  p.window_left = c->wl;
  p.window_right = c->wr;
  p.align = c->align;
  return p;
}

typedef struct outputs {
  void *o, *dq, *dk, *dv;
  float *lse;
} outputs;

static void outputs_alloc(outputs *x, flashc_dtype dt, int64_t nq, int64_t nk, int64_t nlse) {
  size_t es = flashc_dtype_size(dt);
  x->o = malloc((size_t)nq * es);
  x->dq = malloc((size_t)nq * es);
  x->dk = malloc((size_t)nk * es);
  x->dv = malloc((size_t)nk * es);
  x->lse = malloc((size_t)nlse * sizeof(float));
}

static void outputs_free(outputs *x) {
  free(x->o);
  free(x->dq);
  free(x->dk);
  free(x->dv);
  free(x->lse);
}

/* One attention forward + backward on whole tensors with one backend (reference: cpu-ref in f64). */
static flashc_status single(const char *backend, const tcase *c, flashc_dtype dt, void *q, void *k, void *v, void *dout,
                            outputs *out, int64_t sq, int64_t sk) {
  flashc_handle h;
  flashc_status s = flashc_create(&h, backend);
  if (s != FLASHC_OK) return s;
  flashc_set_threads(h, 1);
  flashc_params p = params_of(c);
  flashc_tensor tq = flashc_tensor_bshd(q, dt, c->B, sq, c->Hq, c->D),
                tk = flashc_tensor_bshd(k, dt, c->B, sk, c->Hkv, c->D),
                tv = flashc_tensor_bshd(v, dt, c->B, sk, c->Hkv, c->D),
                tdo = flashc_tensor_bshd(dout, dt, c->B, sq, c->Hq, c->D),
                to = flashc_tensor_bshd(out->o, dt, c->B, sq, c->Hq, c->D),
                tdq = flashc_tensor_bshd(out->dq, dt, c->B, sq, c->Hq, c->D),
                tdk = flashc_tensor_bshd(out->dk, dt, c->B, sk, c->Hkv, c->D),
                tdv = flashc_tensor_bshd(out->dv, dt, c->B, sk, c->Hkv, c->D);
  s = flashc_forward(h, &p, &tq, &tk, &tv, &to, out->lse);
  if (s == FLASHC_OK) s = flashc_backward(h, &p, &tq, &tk, &tv, &to, out->lse, &tdo, &tdq, &tdk, &tdv);
  flashc_destroy(h);
  return s;
}

static void run_case(const tcase *c, flashc_ring ring, uint64_t seed) {
  flashc_dtype dt = c->dt;
  size_t es = flashc_dtype_size(dt);
  int64_t sq = c->Lq * world, sk = c->Lk * world;
  int64_t nq = c->B * sq * c->Hq * c->D, nk = c->B * sk * c->Hkv * c->D, nlse = c->B * c->Hq * sq;
  int64_t lq_n = c->B * c->Lq * c->Hq * c->D, lk_n = c->B * c->Lk * c->Hkv * c->D, llse = c->B * c->Hq * c->Lq;
  rng_state = seed;
  double *q64, *k64, *v64, *do64;
  void *q = random_tensor(dt, nq, 1.5, &q64), *k = random_tensor(dt, nk, 1.5, &k64),
       *v = random_tensor(dt, nk, 1.0, &v64), *dout = random_tensor(dt, nq, 1.0, &do64);

  /* ---- the ring, on every rank ---- */
  flashc_tensor fq = flashc_tensor_bshd(q, dt, c->B, sq, c->Hq, c->D),
                fk = flashc_tensor_bshd(k, dt, c->B, sk, c->Hkv, c->D),
                fv = flashc_tensor_bshd(v, dt, c->B, sk, c->Hkv, c->D),
                fdo = flashc_tensor_bshd(dout, dt, c->B, sq, c->Hq, c->D);
  void *lq = malloc((size_t)lq_n * es), *lk = malloc((size_t)lk_n * es), *lv = malloc((size_t)lk_n * es),
       *ldo = malloc((size_t)lq_n * es);
  flashc_tensor tq = make_tensor(lq, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tk = make_tensor(lk, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tv = make_tensor(lv, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tdo = make_tensor(ldo, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd);
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fq, &tq));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fk, &tk));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fv, &tv));
  CHECK_OK(flashc_ring_shard(c->layout, world, rank, &fdo, &tdo));
  outputs local;
  outputs_alloc(&local, dt, lq_n, lk_n, llse);
  flashc_tensor to = make_tensor(local.o, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tdq = make_tensor(local.dq, dt, c->B, c->Lq, c->Hq, c->D, c->bhsd),
                tdk = make_tensor(local.dk, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd),
                tdv = make_tensor(local.dv, dt, c->B, c->Lk, c->Hkv, c->D, c->bhsd);
  poison(local.o, dt, lq_n);
  for (int64_t i = 0; i < llse; i++) local.lse[i] = NAN;
  flashc_params p = params_of(c);
  CHECK_OK(fc_ring_set_native_partials(ring, c->native));
  CHECK_OK(flashc_ring_forward(ring, &p, c->layout, &tq, &tk, &tv, &to, local.lse));
  /* Repeats are bit-identical (fixed order of blocks and merges). */
  void *o_again = malloc((size_t)lq_n * es);
  flashc_tensor to2 = to;
  to2.data = o_again;
  poison(o_again, dt, lq_n);
  CHECK_OK(flashc_ring_forward(ring, &p, c->layout, &tq, &tk, &tv, &to2, NULL));
  CHECK(memcmp(o_again, local.o, (size_t)lq_n * es) == 0, "%s: a repeated ring forward differs", c->name);
  free(o_again);
  poison(local.dq, dt, lq_n);
  poison(local.dk, dt, lk_n);
  poison(local.dv, dt, lk_n);
  /* cpu-ref's backward recomputes the softmax from q, k, v and cannot run one block: refused on every rank. */
  int backward = strcmp(c->backend, "cpu-ref") != 0;
  flashc_status sb = flashc_ring_backward(ring, &p, c->layout, &tq, &tk, &tv, &to, local.lse, &tdo, &tdq, &tdk, &tdv);
  if (backward)
    CHECK(sb == FLASHC_OK, "%s: ring backward: %s", c->name, flashc_last_error());
  else
    CHECK(sb == FLASHC_ERR_UNSUPPORTED, "%s: ring backward on %s: got %s", c->name, c->backend,
          flashc_status_string(sb));
  CHECK_OK(fc_ring_set_native_partials(ring, 0));

  /* ---- gather on rank 0 (BSHD) ---- */
  outputs ring_out = {0};
  if (rank == 0) outputs_alloc(&ring_out, dt, nq, nk, nlse);
  flashc_tensor go = flashc_tensor_bshd(ring_out.o, dt, c->B, sq, c->Hq, c->D),
                gdq = flashc_tensor_bshd(ring_out.dq, dt, c->B, sq, c->Hq, c->D),
                gdk = flashc_tensor_bshd(ring_out.dk, dt, c->B, sk, c->Hkv, c->D),
                gdv = flashc_tensor_bshd(ring_out.dv, dt, c->B, sk, c->Hkv, c->D);
  /* shards in BSHD order for the gather (a BHSD shard is first copied to a BSHD one) */
  flashc_tensor *locals[4] = {&to, &tdq, &tdk, &tdv}, *fulls[4] = {&go, &gdq, &gdk, &gdv};
  for (int i = 0; i < (backward ? 4 : 1); i++) {
    flashc_tensor dense = *locals[i];
    int64_t n = dense.size[0] * dense.size[1] * dense.size[2] * dense.size[3];
    void *buf = malloc((size_t)n * es);
    dense = flashc_tensor_bshd(buf, dt, dense.size[0], dense.size[1], dense.size[2], dense.size[3]);
    flashc_tensor src = *locals[i];
    for (int64_t b = 0; b < src.size[0]; b++)
      for (int64_t s = 0; s < src.size[1]; s++)
        for (int64_t h = 0; h < src.size[2]; h++)
          memcpy((char *)buf + ((b * src.size[1] + s) * src.size[2] + h) * src.size[3] * (int64_t)es,
                 (char *)src.data + (b * src.stride[0] + s * src.stride[1] + h * src.stride[2]) * (int64_t)es,
                 (size_t)src.size[3] * es);
    gather_tensor(c, &dense, fulls[i]);
    free(buf);
  }
  gather_lse(c, local.lse, c->Lq, ring_out.lse);

  /* ---- rank 0: one device and the reference ---- */
  int pass = 1;
  if (rank == 0) {
    outputs one, ref;
    outputs_alloc(&one, dt, nq, nk, nlse);
    outputs_alloc(&ref, FLASHC_F64, nq, nk, nlse);
    flashc_status s1 = single(c->backend, c, dt, q, k, v, dout, &one, sq, sk);
    CHECK(s1 == FLASHC_OK, "%s: single-device %s: %s", c->name, c->backend, flashc_last_error());
    flashc_status s2 = single("cpu-ref", c, FLASHC_F64, q64, k64, v64, do64, &ref, sq, sk);
    CHECK(s2 == FLASHC_OK, "%s: reference: %s", c->name, flashc_last_error());
    if (s1 == FLASHC_OK && s2 == FLASHC_OK) {
      const char *names[5] = {"O", "lse", "dQ", "dK", "dV"};
      void *rings[5] = {ring_out.o, ring_out.lse, ring_out.dq, ring_out.dk, ring_out.dv};
      void *ones[5] = {one.o, one.lse, one.dq, one.dk, one.dv};
      double *refs[5] = {ref.o, (double *)NULL, ref.dq, ref.dk, ref.dv};
      int64_t counts[5] = {nq, nlse, nq, nk, nk};
      double lse_ref_buf_unused = 0;
      (void)lse_ref_buf_unused;
      /* the reference lse in f64 for comparison */
      double *lse64 = malloc((size_t)nlse * sizeof(double));
      for (int64_t i = 0; i < nlse; i++) lse64[i] = ref.lse[i];
      refs[1] = lse64;
      for (int t = 0; t < (backward ? 5 : 2); t++) {
        int nan_ring = 0, nan_one = 0;
        double e_ring, e_one;
        if (t == 1) {
          e_ring = lse_err(rings[t], refs[t], counts[t], &nan_ring);
          e_one = lse_err(ones[t], refs[t], counts[t], &nan_one);
        } else {
          e_ring = max_err(rings[t], dt, refs[t], counts[t], &nan_ring);
          e_one = max_err(ones[t], dt, refs[t], counts[t], &nan_one);
        }
        double bar = 2 * e_one + world * ldexp(max_abs(refs[t], counts[t]), -22);
        if (c->native && t != 1) {
          /* Native partials (the device's numerics) are each rounded once to the dtype, half an ulp
           * (2^-(p+1) relative, p = 8 for bf16, 11 for f16) of the partial: O is a convex combination of
           * partials, each bounded by max|V|, so one such rounding; a gradient sums up to 2·world of them. */
          int bits = dt == FLASHC_BF16 ? 8 : dt == FLASHC_F16 ? 11 : 24;
          bar += t == 0 ? ldexp(max_abs(v64, nk), -(bits + 1))
                        : 2 * world * ldexp(max_abs(refs[t], counts[t]), -(bits + 1));
        }
        if (verbose || e_ring > bar || nan_ring)
          printf("  %-32s %-3s ring %.3e  single %.3e  bar %.3e  (ring/single %.2f)%s\n", c->name, names[t], e_ring,
                 e_one, bar, e_one > 0 ? e_ring / e_one : 0.0, nan_ring ? "  NaN/-inf mismatch" : "");
        CHECK(nan_ring == 0, "%s: %s has %d non-finite values (or -inf where the reference has none)", c->name,
              names[t], nan_ring);
        CHECK(e_ring <= bar, "%s: %s error %.3e exceeds 2 x single-device %.3e + floor (bar %.3e)", c->name, names[t],
              e_ring, e_one, bar);
        if (nan_ring || e_ring > bar) pass = 0;
      }
      /* Rows that see no key: O = 0, dQ = 0 exactly. */
      for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
          for (int64_t i = 0; i < sq; i++) {
            if (ref.lse[(b * c->Hq + h) * sq + i] != -INFINITY) continue;
            for (int64_t d = 0; d < c->D; d++) {
              int64_t at = ((b * sq + i) * c->Hq + h) * c->D + d;
              if (fc_load(ring_out.o, dt, at) != 0.0 || (backward && fc_load(ring_out.dq, dt, at) != 0.0)) {
                CHECK(0, "%s: row %lld (b %lld h %lld) sees no key but O or dQ is not 0", c->name, (long long)i,
                      (long long)b, (long long)h);
                pass = 0;
                d = c->D;
                i = sq;
              }
            }
          }
      free(lse64);
    } else {
      pass = 0;
    }
    outputs_free(&one);
    outputs_free(&ref);
    outputs_free(&ring_out);
  }
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%s  %-34s (%s, %s%s)\n", pass ? "ok  " : "FAIL", c->name, c->backend, flashc_dtype_name(dt),
           backward ? "" : ", forward; backward refused");
  outputs_free(&local);
  free(lq), free(lk), free(lv), free(ldo);
  free(q), free(k), free(v), free(dout);
  free(q64), free(k64), free(v64), free(do64);
}

/* ---- errors: every rank fails alike, and the ring stays usable ---------------------------------------- */
static void test_errors(flashc_ring ring) {
  int failures_before = failures;
  int64_t L = 8, H = 2, D = 16, n = L * H * D;
  float *q = calloc((size_t)n, 4), *k = calloc((size_t)n, 4), *v = calloc((size_t)n, 4), *o = calloc((size_t)n, 4);
  float *k2 = calloc((size_t)(L * H * (D + 1)), 4), *v2 = calloc((size_t)(L * H * (D + 1)), 4),
        *q2 = calloc((size_t)(L * H * (D + 1)), 4), *o2 = calloc((size_t)(L * H * (D + 1)), 4);
  for (int64_t i = 0; i < n; i++) q[i] = k[i] = v[i] = (float)uniform();
  flashc_tensor tq = flashc_tensor_bshd(q, FLASHC_F32, 1, L, H, D), tk = flashc_tensor_bshd(k, FLASHC_F32, 1, L, H, D),
                tv = flashc_tensor_bshd(v, FLASHC_F32, 1, L, H, D), to = flashc_tensor_bshd(o, FLASHC_F32, 1, L, H, D);
  flashc_params p = flashc_params_default();
  p.causal = 1;

  /* A rank whose head_dim differs: INVALID_ARGUMENT on all ranks. */
  if (world > 1) {
    flashc_tensor xq = tq, xk = tk, xv = tv, xo = to;
    if (rank == world - 1) {
      xq = flashc_tensor_bshd(q2, FLASHC_F32, 1, L, H, D + 1);
      xk = flashc_tensor_bshd(k2, FLASHC_F32, 1, L, H, D + 1);
      xv = flashc_tensor_bshd(v2, FLASHC_F32, 1, L, H, D + 1);
      xo = flashc_tensor_bshd(o2, FLASHC_F32, 1, L, H, D + 1);
    }
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, &xq, &xk, &xv, &xo, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "head_dim"),
          "mismatched head_dim: got %s (%s)", flashc_status_string(s), flashc_last_error());
  }
  /* One rank's own error (q NULL on rank 0): the same status on all ranks, rank 0 named. */
  {
    flashc_status s =
        flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, rank == 0 ? NULL : &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT, "q NULL on rank 0: got %s (%s)", flashc_status_string(s),
          flashc_last_error());
    CHECK(rank == 0 ? strstr(flashc_last_error(), "q is NULL") != NULL : strstr(flashc_last_error(), "rank 0") != NULL,
          "q NULL on rank 0: message '%s'", flashc_last_error());
  }
  /* Zigzag needs an even local seqlen. */
  {
    flashc_tensor oq = tq, ok = tk, ov = tv, oo = to;
    oq.size[1] = ok.size[1] = ov.size[1] = oo.size[1] = L - 1;
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_ZIGZAG, &oq, &ok, &ov, &oo, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "even"), "odd zigzag: got %s (%s)",
          flashc_status_string(s), flashc_last_error());
    s = flashc_ring_forward(ring, &p, (flashc_ring_layout)7, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT, "layout 7: got %s", flashc_status_string(s));
  }
  /* Varlen and f64 are refused on every rank. */
  {
    int32_t cu[2] = {0, (int32_t)L};
    flashc_params pv = p;
    pv.cu_seqlens_q = pv.cu_seqlens_k = cu;
    pv.num_seqs = 1;
    flashc_status s = flashc_ring_forward(ring, &pv, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_UNSUPPORTED, "varlen: got %s", flashc_status_string(s));
  }
  /* After all that the ring still works. */
  {
    for (int64_t i = 0; i < n; i++) o[i] = NAN;
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_OK, "a valid call after errors: %s (%s)", flashc_status_string(s), flashc_last_error());
    int finite = 1;
    for (int64_t i = 0; i < n; i++) finite &= isfinite(o[i]);
    CHECK(finite, "a valid call after errors left non-finite output");
  }
  /* Local errors. */
  CHECK(flashc_ring_forward(NULL, &p, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL) == FLASHC_ERR_INVALID_ARGUMENT,
        "NULL ring");
  CHECK(flashc_ring_set_timeout(ring, -1) == FLASHC_ERR_INVALID_ARGUMENT, "negative timeout");
  int r = -1, w = -1;
  CHECK_OK(flashc_ring_info(ring, &r, &w));
  CHECK(r == rank && w == world, "flashc_ring_info: %d/%d, MPI says %d/%d", r, w, rank, world);
  {
    flashc_tensor full = flashc_tensor_bshd(q, FLASHC_F32, 1, 2 * world + 1, 1, 1), shard = full;
    shard.size[1] = 2;
    CHECK(flashc_ring_shard(FLASHC_RING_ZIGZAG, world, rank, &full, &shard) == FLASHC_ERR_INVALID_ARGUMENT,
          "shard of a seqlen that does not split");
  }
  int bad = failures - failures_before, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s  errors fail alike on every rank; the ring stays usable\n", any ? "FAIL" : "ok  ");
  free(q), free(k), free(v), free(o), free(q2), free(k2), free(v2), free(o2);
}

/* ---- a peer that dies or stalls ------------------------------------------------------------------------- */
/* FLASHC_RING_FAULT (set by scripts/ring-test) makes rank 1 exit or stall at step 1 of the forward. Each other
 * rank runs the forward and then the backward: whichever call first depends on rank 1 (a block it never
 * sends, or the backward's agreement it never joins) must fail with FLASHC_ERR_COMMUNICATION within the
 * timeout (plus a step's compute and scheduling slack) — some ranks legitimately finish the forward, since
 * their last block left rank 1 before it died. */
static int fault_check(const char *mode) {
  enum { TIMEOUT_MS = 1500 };
  flashc_ring ring;
  MPI_Comm comm = MPI_COMM_WORLD;
  CHECK_OK(flashc_ring_create_mpi(&ring, &comm, "cpu"));
  CHECK_OK(flashc_ring_set_timeout(ring, TIMEOUT_MS));
  int64_t L = 8, H = 2, D = 16, n = L * H * D;
  float *q = malloc((size_t)n * 4), *o = malloc((size_t)n * 4), *g = malloc((size_t)n * 4 * 3),
        *lse = malloc((size_t)(L * H) * 4);
  for (int64_t i = 0; i < n; i++) q[i] = (float)uniform();
  flashc_tensor t = flashc_tensor_bshd(q, FLASHC_F32, 1, L, H, D), to = flashc_tensor_bshd(o, FLASHC_F32, 1, L, H, D),
                tdq = flashc_tensor_bshd(g, FLASHC_F32, 1, L, H, D),
                tdk = flashc_tensor_bshd(g + n, FLASHC_F32, 1, L, H, D),
                tdv = flashc_tensor_bshd(g + 2 * n, FLASHC_F32, 1, L, H, D);
  int faulty = 0, frank = -1, fstep = -1;
  const char *spec = getenv("FLASHC_RING_FAULT");
  if (spec && strchr(spec, ':') && sscanf(strchr(spec, ':') + 1, "%d:%d", &frank, &fstep) == 2) faulty = rank == frank;
  MPI_Barrier(MPI_COMM_WORLD);
  const char *call = "forward";
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  flashc_status s = flashc_ring_forward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, lse);
  if (s == FLASHC_OK) {
    call = "backward";
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s = flashc_ring_backward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, lse, &t, &tdq, &tdk, &tdv);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  int ok = s == FLASHC_ERR_COMMUNICATION && ms <= 2.0 * TIMEOUT_MS + 3000.0;
  char why[512];
  snprintf(why, sizeof why, "%s", flashc_last_error());
  /* A later call fails at once: the ring knows it is broken. */
  if (ok) {
    flashc_status again = flashc_ring_forward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, NULL);
    ok = again == FLASHC_ERR_COMMUNICATION && strstr(flashc_last_error(), "failed earlier");
  }
  printf("RING-FAULT-CHECK mode %s rank %d%s: %s %s after %.0f ms (timeout %d ms): %s -> %s\n", mode, rank,
         faulty ? " (the faulty one)" : "", call, flashc_status_string(s), ms, TIMEOUT_MS, why,
         faulty ? "n/a"
         : ok   ? "ok"
                : "FAIL");
  fflush(stdout);
  flashc_ring_destroy(ring);
  free(q), free(o), free(g), free(lse);
  /* A peer is gone or out of step: MPI_Finalize could wait for it forever. */
  _exit(faulty || ok ? 0 : 1);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  verbose = getenv("FLASHC_RING_TEST_VERBOSE") != NULL;
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  if (getenv("FLASHC_TEST_SEED")) seed = strtoull(getenv("FLASHC_TEST_SEED"), NULL, 10);
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  rng_state = seed;
  if (argc == 3 && strcmp(argv[1], "--fault") == 0) return fault_check(argv[2]);
  if (rank == 0) printf("test_ring: %d rank(s), seed %llu (FLASHC_TEST_SEED)\n", world, (unsigned long long)seed);

  MPI_Comm comm = MPI_COMM_WORLD;
  flashc_ring rings[2] = {NULL, NULL};
  const char *backends[2] = {"cpu", "cpu-ref"};
  for (int b = 0; b < 2; b++) {
    flashc_status s = flashc_ring_create_mpi(&rings[b], &comm, backends[b]);
    CHECK(s == FLASHC_OK, "flashc_ring_create_mpi(%s): %s", backends[b], flashc_last_error());
    if (s == FLASHC_OK) flashc_set_threads(flashc_ring_handle(rings[b]), 1);
  }
  if (rings[0] && rings[1]) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      run_case(&cases[i], strcmp(cases[i].backend, "cpu") == 0 ? rings[0] : rings[1], seed + 1000003 * i);
    test_errors(rings[0]);
  }
  for (int b = 0; b < 2; b++) flashc_ring_destroy(rings[b]);

  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("test_ring: %s (%d failed checks over %d ranks)\n", all ? "FAILED" : "passed", all, world);
  MPI_Finalize();
  return all ? 1 : 0;
}
