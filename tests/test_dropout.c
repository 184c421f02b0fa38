/*
 * test_dropout.c — attention dropout (flashc.h, "Dropout"): the generator, its statistics, and forward and backward
 * on the backends that implement it (cpu-ref, cpu); its refusal everywhere else.
 *
 *   1. Philox4x32-10 against Random123's known-answer vectors, and the `cpu` backend's lane-parallel generator
 *      (fc_dropout_keep_row) against the scalar definition (philox.h), across a 2^32 carry of the counter.
 *   2. The returned mask against flashc.h's definition, recomputed here from the Philox function alone (counter
 *      words offset + i·⌈sk/8⌉ + ⌊j/8⌋, key halves, 16-bit half j mod 8, the threshold t16), with varlen's padded
 *      layout.
 *   3. Statistics of the mask: the keep rate within 5 sigma of 1 − t16/2^16 for p = 0.1, 0.5, 0.9, per 16-bit half
 *      of the block too; per-row and per-key keep counts whose chi-square stays within 5 sigma of its mean (no row
 *      or column pattern).
 *   4. cpu-ref (f64) against this file's own fp64 attention given the returned mask (`oracle`), to 1e-12: o, lse,
 *      dq, dk, dv; causal, windows, GQA, softcap, varlen. cpu (f32, bf16) against cpu-ref, also with ALiBi and a
 *      boolean attn_mask; cpu bit-identical at 1 and 3 threads; the same seed gives the same bits, another offset
 *      or seed another mask; p = 0 is bit-identical to no dropout.
 *   5. Refusals: p outside [0, 1) (and NaN), p whose 16-bit threshold would be 0 or 2^16 (the edges run), a mask
 *      over 2^28 elements or overlapping o, an older struct_size gives the defaults (no dropout); every CUDA backend
 *      but cuda-mma and cuda-hopper lacks FC_FEATURE_DROPOUT and refuses (a call on the GPU where there is one), and
 *      so does ring attention.
 *   6. cuda-mma (bf16, f16) against cpu-ref (f64) given the same seed and offset: o, lse, dq, dk, dv, each backward
 *      plan (fa2 family, and the deterministic dQ pass), its device-written mask bit for bit against cpu-ref's;
 *      causal, windows, softcap, GQA, varlen, odd lengths, several key blocks, p = 0.1 and 0.5. Skipped without a GPU
 *      ("no CUDA device").
 */
#include "philox.h"
#include "cpu/tile.h"
#include "harness.h"
#include "internal.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- 1. the generator ------------------------------------------------------------------------------------- */
static void test_kat(void) {
  /* Random123, tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words), key (2 words), result. */
  static const uint32_t kat[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d, 0x41c83b0e, 0xa20bc7c6,
       0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb, 0x5001e420,
       0x24126ea1},
  };
  for (int v = 0; v < 3; v++) {
    const fc_philox4 c = {{kat[v][0], kat[v][1], kat[v][2], kat[v][3]}};
    const fc_philox4 u = fc_philox4x32_10(c, kat[v][4], kat[v][5]);
    th_check(u.w[0] == kat[v][6] && u.w[1] == kat[v][7] && u.w[2] == kat[v][8] && u.w[3] == kat[v][9],
             "philox4x32-10 known answer %d: %08x %08x %08x %08x", v, u.w[0], u.w[1], u.w[2], u.w[3]);
  }
}

/* fc_dropout_keep_row (cpu) against fc_dropout_keep (the definition), rows of odd lengths at odd starts, an offset
 * whose low word carries into the high one, and a bh beyond 32 bits; fc_dropout_block_bits against the halves read
 * one by one; the threshold's rounding. */
static void test_row_generator(void) {
  fc_problem p;
  memset(&p, 0, sizeof p);
  p.heads_q = 3;
  p.dropout_p = 0.37f;
  p.dropout_threshold = fc_dropout_threshold(p.dropout_p);
  p.dropout_seed = 0x0123456789abcdefull;
  p.dropout_offset = 0xfffffff0ull;
  int64_t bad = 0;
  const int64_t sks[3] = {1, 37, 300}, ss[2] = {0, (int64_t)1 << 31};
  uint8_t keep[300];
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 2; b++)
      for (int64_t i = 0; i < 70; i += 3)
        for (int64_t j0 = 0; j0 < sks[a]; j0 += 29) {
          const int64_t sk = sks[a], n = sk - j0 < 256 ? sk - j0 : 256, s = ss[b], h = 2;
          fc_dropout_keep_row(&p, s, h, sk, i, j0, n, keep);
          for (int64_t c = 0; c < n; c++)
            bad += keep[c] != fc_dropout_keep(p.dropout_seed, p.dropout_offset, p.dropout_threshold,
                                              (uint64_t)(s * p.heads_q + h), sk, i, j0 + c);
        }
  th_check(bad == 0, "fc_dropout_keep_row differs from fc_dropout_keep in %lld elements", (long long)bad);
  /* The bits of a block: half k is bits 16·(k mod 2) of word ⌊k/2⌋, compared as a 16-bit number; words with
   * halves just below, at and above the threshold, and 0 and 0xffff. */
  int64_t bad_bits = 0;
  const uint32_t ts[4] = {1, 0x8000, 0xfffe, 0xffff};
  for (int a = 0; a < 4; a++)
    for (uint32_t x = 0; x < 4096; x++) {
      const uint32_t t = ts[a], near[5] = {t - 1, t, (t + 1) & 0xffffu, 0, 0xffff};
      fc_philox4 u = {{0, 0, 0, 0}};
      for (int k = 0; k < 8; k++) u.w[k / 2] |= near[(x * 7 + 3 * (uint32_t)k + (x >> k)) % 5] << (16 * (k % 2));
      const uint32_t bits = fc_dropout_block_bits(u, t);
      for (int k = 0; k < 8; k++) bad_bits += (bits >> k & 1u) != (((u.w[k / 2] >> (16 * (k % 2))) & 0xffffu) >= t);
      bad_bits += bits >> 8 != 0;
    }
  th_check(bad_bits == 0, "fc_dropout_block_bits differs from the halves read one by one in %lld bits",
           (long long)bad_bits);
  th_check(fc_dropout_threshold(0.5f) == 0x8000u && fc_dropout_threshold(0.0f) == 0 &&
               fc_dropout_threshold(0x1p-17f) == 1u && fc_dropout_threshold(0x1.fffffep-18f) == 0u &&
               fc_dropout_threshold(0x1.ffffp-1f) == 0x10000u && fc_dropout_threshold(0x1.fffefep-1f) == 0xffffu &&
               fc_dropout_threshold(0.1f) == 6554u,
           "fc_dropout_threshold: 0.5 -> %x, 0.1 -> %u, 2^-17 -> %u, 1 - 2^-17 -> %x", fc_dropout_threshold(0.5f),
           fc_dropout_threshold(0.1f), fc_dropout_threshold(0x1p-17f), fc_dropout_threshold(0x1.ffffp-1f));
}

/* ---- cases ------------------------------------------------------------------------------------------------ */
typedef struct dcase {
  const char *name;
  int64_t batch, sq, sk, hq, hkv, d; /* varlen: batch sequences, sq/sk the longest (the lens below) */
  const int32_t *lens_q, *lens_k;    /* NULL: dense */
  int causal;
  int64_t wl, wr;
  float softcap;
  int alibi, pad_mask; /* not in the oracle: cpu against cpu-ref only */
  float p;
} dcase;

static const int32_t vq[3] = {37, 1, 70}, vk[3] = {50, 9, 301};
static const dcase cases[] = {
    {"plain p0.1", 2, 33, 45, 2, 2, 16, NULL, NULL, 0, -1, -1, 0.0f, 0, 0, 0.1f},
    {"causal gqa p0.5", 2, 64, 64, 4, 2, 32, NULL, NULL, 1, -1, -1, 0.0f, 0, 0, 0.5f},
    {"causal sq>sk p0.9", 1, 50, 23, 2, 1, 24, NULL, NULL, 1, -1, -1, 0.0f, 0, 0, 0.9f},
    {"window softcap sk>256 p0.2", 1, 97, 520, 2, 2, 40, NULL, NULL, 0, 30, 9, 3.0f, 0, 0, 0.2f},
    {"odd 113x203 d59 p0.3", 1, 113, 203, 3, 1, 59, NULL, NULL, 0, -1, -1, 0.0f, 0, 0, 0.3f},
    {"varlen causal gqa p0.25", 3, 70, 301, 4, 2, 16, vq, vk, 1, -1, -1, 0.0f, 0, 0, 0.25f},
    {"alibi causal p0.15", 2, 40, 77, 2, 2, 32, NULL, NULL, 1, -1, -1, 0.0f, 1, 0, 0.15f},
    {"padding mask gqa p0.4", 2, 31, 90, 4, 1, 16, NULL, NULL, 0, -1, -1, 0.0f, 0, 1, 0.4f},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

static int64_t rows_q(const dcase *c) {
  int64_t n = 0;
  if (!c->lens_q) return c->batch * c->sq;
  for (int64_t s = 0; s < c->batch; s++) n += c->lens_q[s];
  return n;
}
static int64_t rows_k(const dcase *c) {
  int64_t n = 0;
  if (!c->lens_k) return c->batch * c->sk;
  for (int64_t s = 0; s < c->batch; s++) n += c->lens_k[s];
  return n;
}
/* Sequence s: its first packed row of q and k (dense: b·seqlen, the BSHD rows of batch b) and its lengths. */
static void seq_of(const dcase *c, int64_t s, int64_t *q0, int64_t *sq, int64_t *k0, int64_t *sk) {
  if (!c->lens_q) {
    *q0 = s * c->sq, *sq = c->sq, *k0 = s * c->sk, *sk = c->sk;
    return;
  }
  *q0 = *k0 = 0;
  for (int64_t x = 0; x < s; x++) *q0 += c->lens_q[x], *k0 += c->lens_k[x];
  *sq = c->lens_q[s], *sk = c->lens_k[s];
}

/* Inputs as packed [rows, heads, d] doubles (dense BSHD is that with rows = batch·seqlen), bf16-exact. */
typedef struct inputs {
  double *q, *k, *v, *dout;
  float slopes[8];
  uint8_t *pad; /* [batch][sk]: the boolean padding mask, 1 = attend */
  int32_t cu_q[8], cu_k[8];
} inputs;

static void inputs_new(inputs *in, const dcase *c, th_rng *r) {
  const int64_t nq = rows_q(c) * c->hq * c->d, nk = rows_k(c) * c->hkv * c->d;
  th_normal_inputs(r, nq, nk, &in->q, &in->k, &in->v, &in->dout);
  for (int h = 0; h < 8; h++) in->slopes[h] = 0.25f / (float)(h + 1);
  in->pad = malloc((size_t)(c->batch * c->sk));
  for (int64_t x = 0; x < c->batch * c->sk; x++) in->pad[x] = x % c->sk < c->sk - 7 * (x / c->sk + 1);
  in->cu_q[0] = in->cu_k[0] = 0;
  for (int64_t s = 0; c->lens_q && s < c->batch; s++)
    in->cu_q[s + 1] = in->cu_q[s] + c->lens_q[s], in->cu_k[s + 1] = in->cu_k[s] + c->lens_k[s];
}

static void inputs_free(inputs *in) { free(in->q), free(in->k), free(in->v), free(in->dout), free(in->pad); }

static flashc_params case_params(const dcase *c, inputs *in, uint64_t seed, uint64_t offset) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal, p.window_left = c->wl, p.window_right = c->wr, p.softcap = c->softcap;
  p.dropout_p = c->p, p.dropout_seed = seed, p.dropout_offset = offset;
  if (c->lens_q) p.cu_seqlens_q = in->cu_q, p.cu_seqlens_k = in->cu_k, p.num_seqs = c->batch;
  if (c->alibi) p.alibi_slopes = in->slopes;
  if (c->pad_mask) {
    p.attn_mask = in->pad, p.attn_mask_is_bool = 1;
    p.attn_mask_stride[0] = c->sk, p.attn_mask_stride[3] = 1;
  }
  return p;
}

/* ---- one run ---------------------------------------------------------------------------------------------- */
typedef struct run_out {
  th_results r;
  uint8_t *mask; /* [batch, hq, sq, sk] */
} run_out;

static void run_free(run_out *r) {
  th_results_free(&r->r), free(r->mask);
  r->mask = NULL;
}

/* A case's tensors in dtype dt: q, k, v, dout from its inputs, o and the gradients new (batch 1 and the packed rows
 * for varlen). */
typedef struct case_tensors {
  th_tensor q, k, v, dout, o, dq, dk, dv;
} case_tensors;

static void case_tensors_new(case_tensors *t, const dcase *c, const inputs *in, flashc_dtype dt) {
  const int64_t B = c->lens_q ? 1 : c->batch, SQ = c->lens_q ? rows_q(c) : c->sq, SK = c->lens_q ? rows_k(c) : c->sk;
  t->q = th_tensor_from_dense(dt, in->q, B, SQ, c->hq, c->d),
  t->k = th_tensor_from_dense(dt, in->k, B, SK, c->hkv, c->d);
  t->v = th_tensor_from_dense(dt, in->v, B, SK, c->hkv, c->d);
  t->dout = th_tensor_from_dense(dt, in->dout, B, SQ, c->hq, c->d);
  t->o = th_tensor_new(dt, TH_BSHD, B, SQ, c->hq, c->d), t->dq = th_tensor_new(dt, TH_BSHD, B, SQ, c->hq, c->d);
  t->dk = th_tensor_new(dt, TH_BSHD, B, SK, c->hkv, c->d), t->dv = th_tensor_new(dt, TH_BSHD, B, SK, c->hkv, c->d);
}

static void case_tensors_free(case_tensors *t) {
  th_tensor *all[8] = {&t->q, &t->k, &t->v, &t->dout, &t->o, &t->dq, &t->dk, &t->dv};
  for (int i = 0; i < 8; i++) th_tensor_free(all[i]);
}

static bool run_case(const dcase *c, inputs *in, const char *name, flashc_dtype dt, int threads, uint64_t seed,
                     uint64_t offset, run_out *out) {
  th_backend be;
  if (!th_backend_open(&be, name)) return false;
  flashc_set_threads(be.handle, threads);
  case_tensors ct;
  case_tensors_new(&ct, c, in, dt);
  const int64_t nlse = rows_q(c) * c->hq, nmask = c->batch * c->hq * c->sq * c->sk;
  flashc_params p = case_params(c, in, seed, offset);
  uint8_t *mask = malloc((size_t)nmask);
  memset(mask, 0xAB, (size_t)nmask);
  p.dropout_mask = mask;
  float *lse = malloc((size_t)nlse * sizeof *lse);
  char what[160];
  snprintf(what, sizeof what, "%s on %s %s (%d threads)", c->name, name, flashc_dtype_name(dt), threads);
  const bool ok = th_forward_backward(&be, &p, &ct.q, &ct.k, &ct.v, &ct.o, lse, nlse, &ct.dout, &ct.dq, &ct.dk, &ct.dv,
                                      what, &out->r);
  if (ok) {
    out->mask = mask;
    mask = NULL;
  }
  free(mask), free(lse);
  case_tensors_free(&ct);
  th_backend_close(&be);
  return ok;
}

/* ---- 2. the mask against the definition ------------------------------------------------------------------- */
static int64_t check_mask_definition(const dcase *c, const uint8_t *mask, uint64_t seed, uint64_t offset,
                                     const char *what) {
  const uint32_t t = (uint32_t)floor((double)c->p * 65536.0 + 0.5);
  int64_t bad = 0;
  for (int64_t s = 0; s < c->batch; s++) {
    int64_t q0, sq, k0, sk;
    seq_of(c, s, &q0, &sq, &k0, &sk);
    for (int64_t h = 0; h < c->hq; h++)
      for (int64_t i = 0; i < c->sq; i++)
        for (int64_t j = 0; j < c->sk; j++) {
          uint8_t want = 0;
          if (i < sq && j < sk) {
            const uint64_t n = offset + (uint64_t)(i * ((sk + 7) / 8) + j / 8), bh = (uint64_t)(s * c->hq + h);
            const fc_philox4 ctr = {{(uint32_t)n, (uint32_t)(n >> 32), (uint32_t)bh, (uint32_t)(bh >> 32)}};
            const uint32_t w = fc_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32)).w[j % 8 / 2];
            want = ((w >> (16 * (j % 2))) & 0xffffu) >= t;
          }
          bad += mask[((s * c->hq + h) * c->sq + i) * c->sk + j] != want;
        }
  }
  th_check(bad == 0, "%s: %lld mask elements differ from flashc.h's definition", what, (long long)bad);
  return bad;
}

/* ---- 4. the oracle: fp64 attention given the mask ------------------------------------------------------------ */
typedef struct oracle_out {
  double *o, *lse, *dq, *dk, *dv;
} oracle_out;

static bool visible(const dcase *c, int64_t sq, int64_t sk, int64_t i, int64_t j) {
  const int64_t diag = i + sk - sq, R = c->causal ? 0 : c->wr;
  return (c->wl < 0 || j >= diag - c->wl) && (R < 0 || j <= diag + R);
}

static void oracle(const dcase *c, const inputs *in, const uint8_t *mask, oracle_out *r) {
  const int64_t d = c->d, group = c->hq / c->hkv, nq = rows_q(c) * c->hq * d, nk = rows_k(c) * c->hkv * d;
  const double scale = (float)(1.0 / sqrt((double)d)), rp = 1.0 / (1.0 - (double)c->p);
  r->o = calloc((size_t)nq, sizeof(double)), r->dq = calloc((size_t)nq, sizeof(double));
  r->dk = calloc((size_t)nk, sizeof(double)), r->dv = calloc((size_t)nk, sizeof(double));
  r->lse = malloc((size_t)(rows_q(c) * c->hq) * sizeof(double));
  double *P = malloc((size_t)c->sk * sizeof *P), *T = malloc((size_t)c->sk * sizeof *T),
         *dP = malloc((size_t)c->sk * sizeof *dP);
  for (int64_t s = 0; s < c->batch; s++) {
    int64_t q0, sq, k0, sk;
    seq_of(c, s, &q0, &sq, &k0, &sk);
    for (int64_t h = 0; h < c->hq; h++)
      for (int64_t i = 0; i < sq; i++) {
        const int64_t at = ((q0 + i) * c->hq + h) * d;
        const double *qi = in->q + at, *doi = in->dout + at;
        const uint8_t *z = mask + ((s * c->hq + h) * c->sq + i) * c->sk;
        const int64_t li = c->lens_q ? h * rows_q(c) + q0 + i : (s * c->hq + h) * c->sq + i;
        double m = -INFINITY, l = 0.0;
        for (int64_t j = 0; j < sk; j++) { /* S = softcap(scale q·k) */
          P[j] = -INFINITY;
          if (!visible(c, sq, sk, i, j)) continue;
          const double *kj = in->k + ((k0 + j) * c->hkv + h / group) * d;
          double x = 0.0;
          for (int64_t e = 0; e < d; e++) x += qi[e] * kj[e];
          x *= scale;
          T[j] = c->softcap > 0.0f ? tanh(x / c->softcap) : 0.0;
          P[j] = c->softcap > 0.0f ? c->softcap * T[j] : x;
          if (P[j] > m) m = P[j];
        }
        r->lse[li] = -INFINITY;
        if (m == -INFINITY) continue;
        for (int64_t j = 0; j < sk; j++) l += P[j] = P[j] == -INFINITY ? 0.0 : exp(P[j] - m);
        r->lse[li] = m + log(l);
        double D = 0.0;
        for (int64_t j = 0; j < sk; j++) { /* o = Σ P Z v; dP = Z do·v; D = Σ P dP */
          P[j] /= l;
          const double Z = z[j] ? rp : 0.0, *vj = in->v + ((k0 + j) * c->hkv + h / group) * d;
          double x = 0.0;
          for (int64_t e = 0; e < d; e++) r->o[at + e] += P[j] * Z * vj[e], x += doi[e] * vj[e];
          dP[j] = Z * x;
          D += P[j] * dP[j];
          for (int64_t e = 0; e < d; e++) r->dv[((k0 + j) * c->hkv + h / group) * d + e] += P[j] * Z * doi[e];
        }
        for (int64_t j = 0; j < sk; j++) { /* dS = P (dP − D) through the softcap */
          if (P[j] == 0.0) continue;
          const double dS = P[j] * (dP[j] - D) * (c->softcap > 0.0f ? 1.0 - T[j] * T[j] : 1.0);
          const double *kj = in->k + ((k0 + j) * c->hkv + h / group) * d;
          for (int64_t e = 0; e < d; e++) {
            r->dq[at + e] += scale * dS * kj[e];
            r->dk[((k0 + j) * c->hkv + h / group) * d + e] += scale * dS * qi[e];
          }
        }
      }
  }
  free(P), free(T), free(dP);
}

static double rel_err(const double *x, const double *ref, int64_t n) {
  double err = 0.0, top = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(ref[i]) && x[i] == ref[i]) continue;
    const double e = fabs(x[i] - ref[i]);
    if (!(e <= err)) err = e;
    if (isfinite(ref[i]) && fabs(ref[i]) > top) top = fabs(ref[i]);
  }
  return err / (top > 0.0 ? top : 1.0);
}

static bool same_bits(const run_out *a, const run_out *b, const dcase *c) {
  const int64_t nq = rows_q(c) * c->hq * c->d, nk = rows_k(c) * c->hkv * c->d, nl = rows_q(c) * c->hq;
  const th_results *x = &a->r, *y = &b->r;
  return !memcmp(x->o, y->o, (size_t)nq * 8) && !memcmp(x->dq, y->dq, (size_t)nq * 8) &&
         !memcmp(x->dk, y->dk, (size_t)nk * 8) && !memcmp(x->dv, y->dv, (size_t)nk * 8) &&
         !memcmp(x->lse, y->lse, (size_t)nl * 8);
}

static void test_case(const dcase *c, th_rng *rng) {
  inputs in;
  inputs_new(&in, c, rng);
  const uint64_t seed = th_rng_u64(rng), offset = th_rng_u64(rng) >> (th_rng_u64(rng) % 64);
  const int64_t nq = rows_q(c) * c->hq * c->d, nk = rows_k(c) * c->hkv * c->d, nl = rows_q(c) * c->hq,
                nmask = c->batch * c->hq * c->sq * c->sk;
  char what[200];
  run_out ref = {0};
  if (!run_case(c, &in, "cpu-ref", FLASHC_F64, 2, seed, offset, &ref)) {
    inputs_free(&in);
    return;
  }
  snprintf(what, sizeof what, "%s cpu-ref mask", c->name);
  check_mask_definition(c, ref.mask, seed, offset, what);
  if (!c->alibi && !c->pad_mask) {
    oracle_out want;
    oracle(c, &in, ref.mask, &want);
    const double e[5] = {rel_err(ref.r.o, want.o, nq), rel_err(ref.r.lse, want.lse, nl), rel_err(ref.r.dq, want.dq, nq),
                         rel_err(ref.r.dk, want.dk, nk), rel_err(ref.r.dv, want.dv, nk)};
    if (th_check(e[0] < 1e-12 && e[1] < 1e-7 && e[2] < 1e-12 && e[3] < 1e-12 && e[4] < 1e-12,
                 "%s: cpu-ref f64 against the fp64 oracle given its mask: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e",
                 c->name, e[0], e[1], e[2], e[3], e[4]))
      printf("PASS %s: cpu-ref = oracle given the returned mask (o %.1e dq %.1e)\n", c->name, e[0], e[2]);
    free(want.o), free(want.lse), free(want.dq), free(want.dk), free(want.dv);
  }

  /* cpu against cpu-ref: f32 and bf16; f32 at 1 and 3 threads bit-identical; the same mask. */
  const flashc_dtype dts[2] = {FLASHC_F32, FLASHC_BF16};
  for (int t = 0; t < 2; t++) {
    run_out got = {0}, again = {0};
    /* against cpu-ref's f64 run on the same inputs (bf16-exact, so every dtype holds them exactly) */
    if (!run_case(c, &in, "cpu", dts[t], 1, seed, offset, &got)) continue;
    const double tol = dts[t] == FLASHC_F32 ? 2e-5 : 2e-2;
    const double e[5] = {rel_err(got.r.o, ref.r.o, nq), rel_err(got.r.lse, ref.r.lse, nl),
                         rel_err(got.r.dq, ref.r.dq, nq), rel_err(got.r.dk, ref.r.dk, nk),
                         rel_err(got.r.dv, ref.r.dv, nk)};
    bool ok = e[1] < 1e-5;
    for (int x = 0; x < 5; x++) ok &= x == 1 || e[x] < tol;
    if (th_check(ok, "%s cpu %s against cpu-ref: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e (tol %.0e)", c->name,
                 flashc_dtype_name(dts[t]), e[0], e[1], e[2], e[3], e[4], tol))
      printf("PASS %s: cpu %s = cpu-ref (o %.1e dq %.1e dk %.1e dv %.1e)\n", c->name, flashc_dtype_name(dts[t]), e[0],
             e[2], e[3], e[4]);
    th_check(memcmp(got.mask, ref.mask, (size_t)nmask) == 0, "%s cpu %s: its mask differs from cpu-ref's", c->name,
             flashc_dtype_name(dts[t]));
    if (dts[t] == FLASHC_F32 && run_case(c, &in, "cpu", dts[t], 3, seed, offset, &again))
      th_check(same_bits(&got, &again, c), "%s cpu f32: 1 and 3 threads differ", c->name);
    run_free(&got), run_free(&again);
  }
  run_free(&ref);
  inputs_free(&in);
}

/* ---- determinism, p = 0, other seeds and offsets ------------------------------------------------------------ */
static void test_determinism(th_rng *rng) {
  const dcase *c = &cases[1];
  inputs in;
  inputs_new(&in, c, rng);
  const int64_t nmask = c->batch * c->hq * c->sq * c->sk;
  run_out a = {0}, b = {0}, other_offset = {0}, other_seed = {0};
  for (int be = 0; be < 2; be++) {
    const char *name = be ? "cpu" : "cpu-ref";
    const flashc_dtype dt = be ? FLASHC_F32 : FLASHC_F64;
    if (!run_case(c, &in, name, dt, 2, 42, 7, &a) || !run_case(c, &in, name, dt, 2, 42, 7, &b) ||
        !run_case(c, &in, name, dt, 2, 42, 8, &other_offset) || !run_case(c, &in, name, dt, 2, 43, 7, &other_seed))
      break;
    th_check(same_bits(&a, &b, c) && !memcmp(a.mask, b.mask, (size_t)nmask), "%s: one seed, two results", name);
    int64_t diff_offset = 0, diff_seed = 0;
    for (int64_t x = 0; x < nmask; x++)
      diff_offset += a.mask[x] != other_offset.mask[x], diff_seed += a.mask[x] != other_seed.mask[x];
    /* two independent masks at p = 0.5 differ in half their elements */
    th_check(diff_offset > nmask / 3 && diff_seed > nmask / 3,
             "%s: another offset changed %lld and another seed %lld of %lld mask elements", name,
             (long long)diff_offset, (long long)diff_seed, (long long)nmask);
    th_check(!same_bits(&a, &other_offset, c), "%s: another offset, the same outputs", name);
    run_free(&a), run_free(&b), run_free(&other_offset), run_free(&other_seed);
  }
  run_free(&a), run_free(&b), run_free(&other_offset), run_free(&other_seed);

  /* p = 0 is no dropout, to the bit, and its mask keeps everything. */
  dcase c0 = *c;
  c0.p = 0.0f;
  for (int be = 0; be < 2; be++) {
    const char *name = be ? "cpu" : "cpu-ref";
    const flashc_dtype dt = be ? FLASHC_F32 : FLASHC_F64;
    th_backend h;
    if (!run_case(&c0, &in, name, dt, 2, 42, 7, &a) || !th_backend_open(&h, name)) break;
    th_tensor q = th_tensor_from_dense(dt, in.q, c->batch, c->sq, c->hq, c->d),
              k = th_tensor_from_dense(dt, in.k, c->batch, c->sk, c->hkv, c->d),
              v = th_tensor_from_dense(dt, in.v, c->batch, c->sk, c->hkv, c->d),
              o = th_tensor_new(dt, TH_BSHD, c->batch, c->sq, c->hq, c->d);
    flashc_params p = flashc_params_default();
    p.causal = 1;
    th_check(flashc_forward(h.handle, &p, &q.view, &k.view, &v.view, &o.view, NULL) == FLASHC_OK, "%s p=0: %s", name,
             flashc_last_error());
    double *plain = th_dense(&o);
    int64_t ones = 0;
    for (int64_t x = 0; x < nmask; x++) ones += a.mask[x] == 1;
    th_check(!memcmp(plain, a.r.o, (size_t)(c->batch * c->sq * c->hq * c->d) * 8) && ones == nmask,
             "%s: dropout_p = 0 differs from no dropout (or its mask drops %lld)", name, (long long)(nmask - ones));
    free(plain);
    th_tensor_free(&q), th_tensor_free(&k), th_tensor_free(&v), th_tensor_free(&o);
    th_backend_close(&h);
    run_free(&a);
  }
  inputs_free(&in);
}

/* ---- 3. statistics ------------------------------------------------------------------------------------------ */
static void test_statistics(void) {
  const float ps[3] = {0.1f, 0.5f, 0.9f};
  enum { BH = 8, SQ = 128, SK = 257 };
  static uint8_t mask[BH * SQ * SK];
  for (int x = 0; x < 3; x++) {
    fc_problem p;
    memset(&p, 0, sizeof p);
    p.heads_q = 4;
    p.dropout_p = ps[x];
    p.dropout_threshold = fc_dropout_threshold(ps[x]);
    p.dropout_seed = 1234567 + (uint64_t)x;
    p.dropout_offset = 99;
    for (int64_t bh = 0; bh < BH; bh++)
      for (int64_t i = 0; i < SQ; i++) fc_dropout_keep_row(&p, bh / 4, bh % 4, SK, i, 0, SK, mask + (bh * SQ + i) * SK);
    const double keep = 1.0 - p.dropout_threshold / 65536.0, n = (double)BH * SQ * SK;
    int64_t kept = 0, lane[8] = {0}, lane_n[8] = {0};
    for (int64_t e = 0; e < (int64_t)BH * SQ * SK; e++) {
      kept += mask[e];
      const int64_t w = e % SK % 8; /* the 16-bit half of the element's block */
      lane[w] += mask[e], lane_n[w]++;
    }
    const double sigma = sqrt(n * keep * (1.0 - keep));
    th_check(fabs((double)kept - n * keep) < 5.0 * sigma, "p %.1f: kept %lld of %.0f, expected %.0f +- %.0f", ps[x],
             (long long)kept, n, n * keep, sigma);
    for (int w = 0; w < 8; w++) {
      const double sw = sqrt(lane_n[w] * keep * (1.0 - keep));
      th_check(fabs((double)lane[w] - lane_n[w] * keep) < 5.0 * sw, "p %.1f: 16-bit half %d keeps %lld of %lld", ps[x],
               w, (long long)lane[w], (long long)lane_n[w]);
    }
    /* Per-row and per-key keep counts: Σ (count − mean)² / variance is chi-square with as many degrees of freedom
     * as counts (mean R, variance 2R), unless rows or keys have a pattern. */
    double chi_rows = 0.0, chi_cols = 0.0;
    for (int64_t r = 0; r < (int64_t)BH * SQ; r++) {
      int64_t k = 0;
      for (int64_t j = 0; j < SK; j++) k += mask[r * SK + j];
      chi_rows += ((double)k - SK * keep) * ((double)k - SK * keep) / (SK * keep * (1.0 - keep));
    }
    for (int64_t j = 0; j < SK; j++) {
      int64_t k = 0;
      for (int64_t r = 0; r < (int64_t)BH * SQ; r++) k += mask[r * SK + j];
      const double m = (double)BH * SQ * keep, v = m * (1.0 - keep);
      chi_cols += ((double)k - m) * ((double)k - m) / v;
    }
    const double R = (double)BH * SQ, C = SK;
    th_check(fabs(chi_rows - R) < 5.0 * sqrt(2.0 * R) && fabs(chi_cols - C) < 5.0 * sqrt(2.0 * C),
             "p %.1f: chi-square of row counts %.0f (expected %.0f +- %.0f), of key counts %.0f (%.0f +- %.0f)", ps[x],
             chi_rows, R, sqrt(2.0 * R), chi_cols, C, sqrt(2.0 * C));
    printf("PASS p %.1f: keep rate %.4f (expected %.4f), chi-square rows %.0f/%.0f keys %.0f/%.0f\n", ps[x],
           (double)kept / n, keep, chi_rows, R, chi_cols, C);
  }
}

/* ---- 5. refusals ------------------------------------------------------------------------------------------- */
static void test_refusals(void) {
  th_backend be;
  if (!th_backend_open(&be, "cpu")) return;
  enum { S = 16, H = 2, D = 8 };
  float *buf = calloc(4 * S * H * D, sizeof(float));
  flashc_tensor q = flashc_tensor_bshd(buf, FLASHC_F32, 1, S, H, D),
                k = flashc_tensor_bshd(buf + S * H * D, FLASHC_F32, 1, S, H, D),
                v = flashc_tensor_bshd(buf + 2 * S * H * D, FLASHC_F32, 1, S, H, D),
                o = flashc_tensor_bshd(buf + 3 * S * H * D, FLASHC_F32, 1, S, H, D);
  for (int x = 0; x < 3 * S * H * D; x++) buf[x] = (float)(x % 7) * 0.1f;
  /* 0x1.fffffep-18 < 2^-17 and 1 - 2^-17 (0x1.ffffp-1): 16-bit thresholds 0 and 2^16 */
  const float bad_p[7] = {-0.1f, 1.0f, 1.5f, NAN, INFINITY, 0x1.fffffep-18f, 0x1.ffffp-1f};
  for (int x = 0; x < 7; x++) {
    flashc_params p = flashc_params_default();
    p.dropout_p = bad_p[x];
    memset(buf + 3 * S * H * D, 0xFF, S * H * D * sizeof(float));
    const flashc_status s = flashc_forward(be.handle, &p, &q, &k, &v, &o, NULL);
    th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "dropout_p"),
             "dropout_p %g: status %d (%s)", (double)bad_p[x], s, flashc_last_error());
    uint32_t first;
    memcpy(&first, buf + 3 * S * H * D, 4);
    th_check(first == 0xFFFFFFFFu, "dropout_p %g: o written by a refused call", (double)bad_p[x]);
  }
  /* The edges of the range run: 2^-17 (t16 = 1) and the float just below 1 - 2^-17 (t16 = 2^16 - 1) */
  const float edge_p[2] = {0x1p-17f, 0x1.fffefep-1f};
  for (int x = 0; x < 2; x++) {
    flashc_params p = flashc_params_default();
    p.dropout_p = edge_p[x];
    th_check(flashc_forward(be.handle, &p, &q, &k, &v, &o, NULL) == FLASHC_OK, "dropout_p %.9g: %s", (double)edge_p[x],
             flashc_last_error());
  }
  /* The mask: overlapping o; over 2^28 elements (65537 x 4096 rows; never touched) */
  flashc_params p = flashc_params_default();
  p.dropout_p = 0.5f;
  p.dropout_mask = (uint8_t *)(buf + 3 * S * H * D);
  flashc_status s = flashc_forward(be.handle, &p, &q, &k, &v, &o, NULL);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "dropout_mask"), "mask over o: %d (%s)", s,
           flashc_last_error());
  float *big = calloc(65537, sizeof(float));
  float *bo_data = calloc(65537, sizeof(float));
  uint8_t one;
  flashc_tensor bq = flashc_tensor_bshd(big, FLASHC_F32, 1, 65537, 1, 1),
                bk = flashc_tensor_bshd(big, FLASHC_F32, 1, 4096, 1, 1),
                bo = flashc_tensor_bshd(bo_data, FLASHC_F32, 1, 65537, 1, 1);
  p.dropout_mask = &one;
  s = flashc_forward(be.handle, &p, &bq, &bk, &bk, &bo, NULL);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "2^28"), "mask of 2^28+ elements: %d (%s)",
           s, flashc_last_error());
  free(big), free(bo_data);

  /* An older caller (struct_size before the dropout fields) gets no dropout, whatever the bytes past it hold. */
  p = flashc_params_default();
  p.dropout_p = 0.5f;
  p.struct_size = offsetof(flashc_params, dropout_p);
  float *o1 = malloc(S * H * D * sizeof(float));
  th_check(flashc_forward(be.handle, &p, &q, &k, &v, &o, NULL) == FLASHC_OK, "older struct_size: %s",
           flashc_last_error());
  memcpy(o1, buf + 3 * S * H * D, S * H * D * sizeof(float));
  p = flashc_params_default();
  th_check(flashc_forward(be.handle, &p, &q, &k, &v, &o, NULL) == FLASHC_OK &&
               !memcmp(o1, buf + 3 * S * H * D, S * H * D * sizeof(float)),
           "an older struct_size did not give dropout's defaults");
  free(o1);
  th_backend_close(&be);

  /* Every CUDA backend but cuda-mma and cuda-hopper refuses dropout (FC_FEATURE_DROPOUT is not in its table entry),
   * naming it; ring attention too. Checked on the table, so without a GPU as well; with one, a real call is refused.
   * cuda-mma runs it (section 6), cuda-hopper too (tests/python/test_dropout_hopper.py). */
  fc_problem fp;
  memset(&fp, 0, sizeof fp);
  fp.dropout_p = 0.1f;
  fp.head_dim = fp.head_dim_v = D;
  int cuda = 0;
  for (int i = 0; i < fc_backend_total; i++) {
    const fc_backend *b = fc_backends[i];
    if (!b) continue;
    const bool has = (b->features & FC_FEATURE_DROPOUT) != 0;
    if (b->device == FLASHC_DEVICE_CPU || strcmp(b->name, "cuda-mma") == 0 || strcmp(b->name, "cuda-hopper") == 0) {
      th_check(has, "backend %s lacks FC_FEATURE_DROPOUT", b->name);
      continue;
    }
    cuda++;
    const flashc_status r = fc_check_features("test", b->name, b->features, &fp);
    th_check(!has && r == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "dropout"),
             "backend %s does not refuse dropout: %s", b->name, flashc_last_error());
    char why[160];
    if (b->usable && !b->usable(why, sizeof why)) continue;
    th_backend gpu;
    if (!th_backend_open(&gpu, b->name)) continue;
    p = flashc_params_default();
    p.dropout_p = 0.1f;
    const flashc_status g = flashc_forward(gpu.handle, &p, &q, &k, &v, &o, NULL);
    th_check(g == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), "dropout"), "%s with dropout: %d (%s)", b->name,
             g, flashc_last_error());
    th_backend_close(&gpu);
  }
  th_check(fc_check_features("test", "ring attention", 0u, &fp) == FLASHC_ERR_UNSUPPORTED,
           "ring attention does not refuse dropout");
  if (cuda == 0) printf("SKIP CUDA backends' refusal of a call: no CUDA device (none compiled in)\n");
  free(buf);
}

/* ---- 6. cuda-mma against cpu-ref ------------------------------------------------------------------------- */
/* Shapes that reach cuda-mma's tiles: several key blocks (64 or 128 keys) and query blocks (128 forward, 64 or 128
 * backward), rows past a block's end, odd sk (a row's last Philox block is partly past its keys), head dims 32 to
 * 256 (40: rows not 16-byte aligned), GQA, varlen, windows and softcap with dropout. No ALiBi or attn_mask here (their
 * inputs would need device copies; ALiBi's kernels are the ones these run). */
#ifdef FLASHC_TEST_CUDA
static const int32_t gq[4] = {130, 1, 0, 77}, gk[4] = {203, 9, 5, 300};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const dcase gpu_cases[] = {
    {"mma p0.1 d64", 2, 200, 333, 2, 2, 64, NULL, NULL, 0, -1, -1, 0.0f, 0, 0, 0.1f},
    {"mma causal gqa p0.5 d128", 1, 257, 300, 4, 2, 128, NULL, NULL, 1, -1, -1, 0.0f, 0, 0, 0.5f},
    {"mma odd 113x203 d40 p0.3", 1, 113, 203, 3, 1, 40, NULL, NULL, 0, -1, -1, 0.0f, 0, 0, 0.3f},
    {"mma window softcap p0.1 d96", 1, 190, 260, 2, 2, 96, NULL, NULL, 0, 40, 3, 5.0f, 0, 0, 0.1f},
    {"mma varlen causal gqa p0.5 d32", 4, 130, 300, 4, 2, 32, gq, gk, 1, -1, -1, 0.0f, 0, 0, 0.5f},
    {"mma causal sq>sk p0.1 d256", 1, 150, 97, 2, 1, 256, NULL, NULL, 1, -1, -1, 0.0f, 0, 0, 0.1f},
    {"mma p0.5 d160 few rows many keys", 2, 3, 2100, 2, 2, 160, NULL, NULL, 0, -1, -1, 0.0f, 0, 0, 0.5f},
};
#pragma GCC diagnostic pop
#define NGPU ((int)(sizeof gpu_cases / sizeof gpu_cases[0]))

/* One forward + backward on a CUDA backend (tensors copied by the harness; the mask in device memory here). */
static bool run_case_gpu(const dcase *c, inputs *in, const th_backend *be, flashc_dtype dt, int deterministic,
                         uint64_t seed, uint64_t offset, run_out *out) {
  case_tensors ct;
  case_tensors_new(&ct, c, in, dt);
  const int64_t nlse = rows_q(c) * c->hq, nmask = c->batch * c->hq * c->sq * c->sk;
  flashc_params p = case_params(c, in, seed, offset);
  p.deterministic = deterministic;
  uint8_t *mask = malloc((size_t)nmask), *dmask = NULL;
  float *lse = malloc((size_t)nlse * sizeof *lse);
  char what[200];
  snprintf(what, sizeof what, "%s on %s %s%s", c->name, be->info.name, flashc_dtype_name(dt),
           deterministic ? " deterministic" : "");
  bool ok = th_check(cudaMalloc((void **)&dmask, (size_t)nmask) == cudaSuccess &&
                         cudaMemset(dmask, 0xAB, (size_t)nmask) == cudaSuccess,
                     "%s: the mask's device memory", what);
  if (ok) {
    p.dropout_mask = dmask;
    flashc_status st = th_forward(be, &p, &ct.q, &ct.k, &ct.v, &ct.o, lse, nlse);
    ok = th_check(st == FLASHC_OK, "%s forward: %s", what, flashc_last_error()) &&
         th_check(cudaMemcpy(mask, dmask, (size_t)nmask, cudaMemcpyDeviceToHost) == cudaSuccess, "%s: mask copy", what);
  }
  if (ok) {
    const flashc_status st =
        th_backward(be, &p, &ct.q, &ct.k, &ct.v, &ct.o, lse, nlse, &ct.dout, &ct.dq, &ct.dk, &ct.dv);
    ok = th_check(st == FLASHC_OK, "%s backward: %s", what, flashc_last_error());
  }
  if (ok) {
    th_check_output(&ct.o, what), th_check_output(&ct.dq, what), th_check_output(&ct.dk, what),
        th_check_output(&ct.dv, what);
    out->r.o = th_dense(&ct.o), out->r.dq = th_dense(&ct.dq), out->r.dk = th_dense(&ct.dk),
    out->r.dv = th_dense(&ct.dv);
    out->r.lse = malloc((size_t)nlse * sizeof(double));
    for (int64_t x = 0; x < nlse; x++) out->r.lse[x] = lse[x];
    out->mask = mask;
    mask = NULL;
  }
  if (dmask) cudaFree(dmask);
  free(mask), free(lse);
  case_tensors_free(&ct);
  return ok;
}
#endif

static void test_cuda_mma(th_rng *rng) {
#ifdef FLASHC_TEST_CUDA
  bool usable = false;
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, "cuda-mma") == 0) usable = info.usable;
  }
  th_backend be;
  if (usable && th_backend_open(&be, "cuda-mma")) {
    for (int ci = 0; ci < NGPU; ci++) {
      const dcase *c = &gpu_cases[ci];
      inputs in;
      inputs_new(&in, c, rng);
      const uint64_t seed = th_rng_u64(rng), offset = th_rng_u64(rng) >> (th_rng_u64(rng) % 64);
      const int64_t nq = rows_q(c) * c->hq * c->d, nk = rows_k(c) * c->hkv * c->d, nl = rows_q(c) * c->hq,
                    nmask = c->batch * c->hq * c->sq * c->sk;
      run_out ref = {0};
      if (run_case(c, &in, "cpu-ref", FLASHC_F64, 2, seed, offset, &ref)) {
        const flashc_dtype dts[2] = {FLASHC_BF16, FLASHC_F16};
        for (int x = 0; x < 4; x++) {
          run_out got = {0};
          const flashc_dtype dt = dts[x % 2];
          if (!run_case_gpu(c, &in, &be, dt, x / 2, seed, offset, &got)) continue;
          const double e[5] = {rel_err(got.r.o, ref.r.o, nq), rel_err(got.r.lse, ref.r.lse, nl),
                               rel_err(got.r.dq, ref.r.dq, nq), rel_err(got.r.dk, ref.r.dk, nk),
                               rel_err(got.r.dv, ref.r.dv, nk)};
          bool ok = e[1] < 1e-3; /* lse: fp32 from 16-bit inputs */
          for (int y = 0; y < 5; y++) ok &= y == 1 || e[y] < 2e-2;
          if (th_check(ok, "%s cuda-mma %s%s against cpu-ref: o %.1e lse %.1e dq %.1e dk %.1e dv %.1e", c->name,
                       flashc_dtype_name(dt), x / 2 ? " deterministic" : "", e[0], e[1], e[2], e[3], e[4]))
            printf("PASS %s: cuda-mma %s%s = cpu-ref (o %.1e dq %.1e dk %.1e dv %.1e)\n", c->name,
                   flashc_dtype_name(dt), x / 2 ? " deterministic" : "", e[0], e[2], e[3], e[4]);
          th_check(memcmp(got.mask, ref.mask, (size_t)nmask) == 0, "%s cuda-mma %s: its mask differs from cpu-ref's",
                   c->name, flashc_dtype_name(dt));
          run_free(&got);
        }
        run_free(&ref);
      }
      inputs_free(&in);
    }
    th_backend_close(&be);
    return;
  }
#else
  (void)rng;
#endif
  printf("SKIP cuda-mma's dropout against cpu-ref: no CUDA device (or not a GPU it runs on)\n");
}

int main(void) {
  th_begin("test_dropout");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  test_kat();
  test_row_generator();
  test_statistics();
  for (int c = 0; c < NCASES; c++)
    if (!th_quick() || c < 2) test_case(&cases[c], &rng);
  test_determinism(&rng);
  test_refusals();
  test_cuda_mma(&rng);
  return th_end();
}
