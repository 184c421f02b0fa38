/*
 * fuzz_api.c — libFuzzer target for the C API: the `cpu` backend against the `cpu-ref` oracle.
 *
 * The input bytes decode into one call (forward or backward), its dtype, shapes (batch ≤ 3, seqlens ≤ 64,
 * heads ≤ 9, head_dim ≤ 64 and now and then > 256), a layout per tensor (BSHD, BHSD, any order of the outer
 * dims with padding, broadcast inputs, packed QKV / dQKV), params (scale, causal, align, windows, varlen
 * offsets), up to three mutations that make the call invalid or odd (negative or overflowing strides, an
 * output that aliases an input or another output, lse inside a tensor, bad cu_seqlens, a dtype or shape
 * mismatch, a misaligned or NULL pointer, a bad param), and a seed for the data. The bytes after the seed (absent
 * from older inputs, which so keep their meaning) add the params of issue 48: softcap (small, large, tiny; or
 * negative, NaN, ±inf), ALiBi slopes per head or per sequence and head (or a stride under heads_q, negative or
 * overflowing, a misaligned pointer), a head dim of V's own (v, o, dout, dv; 0 and 513 among them), seqused_q/k on
 * varlen calls (some past their slot, or set without varlen), an attn_mask, boolean or a bias of the call's dtype
 * with broadcast (stride 0), strided or padded dims (or a negative or overflowing stride, a bad is_bool, a
 * misaligned pointer, a varlen call), and dbias in the backward summed over the dims of stride 0 (or with a
 * negative stride, overlapping itself, without a mask or with a boolean one). Slopes, mask and dbias get buffers
 * of exactly the bytes they span; dbias, an output, is poisoned, checked as o is and compared with cpu-ref's; the
 * rows past seqused hold NaN, which no output may show.
 *
 * Every buffer is malloc'ed to exactly the bytes its views span, so ASan catches any access outside them.
 * The call runs on cpu-ref, then (from the same bytes, at the same addresses) on cpu. It aborts, printing the
 * case, when
 *   - the status is not the one the contract calls for, judged from what the call receives (check_contract,
 *     and the bytes each view really covers): INVALID_ARGUMENT for a broken rule, OK for a valid call (empty
 *     tensors included, NULL data where a view has no element), UNSUPPORTED only where flashc_backend_get says
 *     the backend lacks the dtype or head_dim; either where the contract leaves it open (an output whose span
 *     meets another view's without a shared element, in a layout the overlap test need not decide);
 *   - cpu and cpu-ref disagree on the status, or a failure has no message naming the operation;
 *   - a failed call changed any byte of any buffer (outputs are poisoned first, so this also says "untouched");
 *   - a successful call left an output element unwritten (still the poison), or wrote any byte outside its
 *     output views (an input, the padding between rows);
 *   - cpu's outputs (o and lse, or dq, dk, dv) differ from cpu-ref's by more than a bound derived from the
 *     data (the rounding of fp32 scores, amplified by exp, plus the rounding of the sums and of the output
 *     dtype); NaN must meet NaN and ±inf the same inf;
 *   - cpu's result changes with the thread count (it promises bit-identical results at every count).
 * Data with NaN/Inf (a flag of the input) is compared with NaN == NaN: both backends must put NaN in the same
 * places. FLASHC_FUZZ_VERBOSE=1 prints every case with the statuses. The seed corpus (tests/fuzz/corpus/api) is
 * named by what each file calls: valid calls of every feature, and the invalid ones of issue 43; the files of
 * issue 48's params are older files with the feature bytes appended (decode_features reads them: a flag byte, then
 * each feature's own bytes).
 *   CC=clang scripts/build build-fuzz -DFLASHC_FUZZ=ON -DFLASHC_CUDA=OFF -DFLASHC_BUILD_CLI=OFF
 *   build-fuzz/tests/fuzz_api -max_total_time=60 -timeout=10 tests/fuzz/corpus/api
 */
#include "flashc.h"
#include "harness.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- input bytes and the data's random numbers ------------------------------------------------------ */
typedef struct {
  const uint8_t *p;
  size_t n, i;
} reader;

/* Past the end every byte reads 0: a short input is a plain case. */
static unsigned rd(reader *r) { return r->i < r->n ? r->p[r->i++] : 0u; }

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double uniform(uint64_t *s) { return (double)(splitmix(s) >> 11) * 0x1p-53; } /* [0, 1) */

/* ---- dtypes --------------------------------------------------------------------------------------------- */
/* f16 and bf16 through the tests' own conversions (tests/common/dtype.c, written apart from the library's). */
static size_t esize(flashc_dtype t) { return flashc_dtype_size(t) ? flashc_dtype_size(t) : 4; }

static double load(const unsigned char *p, flashc_dtype t) {
  switch (t) {
  case FLASHC_F32: {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  case FLASHC_F16:
  case FLASHC_BF16: {
    uint16_t h;
    memcpy(&h, p, 2);
    return t == FLASHC_F16 ? th_f16_to_f32(h) : th_bf16_to_f32(h);
  }
  case FLASHC_F64: {
    double d;
    memcpy(&d, p, 8);
    return d;
  }
  }
  return NAN;
}
static void store(unsigned char *p, flashc_dtype t, double x) {
  float f = (float)x;
  uint16_t h;
  switch (t) {
  case FLASHC_F32: memcpy(p, &f, 4); break;
  case FLASHC_F16: h = th_f32_to_f16(f), memcpy(p, &h, 2); break;
  case FLASHC_BF16: h = th_f32_to_bf16(f), memcpy(p, &h, 2); break;
  case FLASHC_F64: memcpy(p, &x, 8); break;
  default: memcpy(p, &f, 4); break;
  }
}
/* Outputs are filled with a signalling-NaN pattern no arithmetic produces, to see what a call wrote. */
static void poison(unsigned char *p, size_t es) {
  static const unsigned char f32[4] = {0xA5, 0xA5, 0xA5, 0x7F}, f16[2] = {0xA5, 0x7D};
  static const unsigned char f64[8] = {0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xF5, 0x7F};
  memcpy(p, es == 2 ? f16 : es == 8 ? f64 : f32, es);
}
static int is_poison(const unsigned char *p, size_t es) {
  unsigned char q[8];
  poison(q, es);
  return memcmp(p, q, es) == 0;
}

/* ---- the case ----------------------------------------------------------------------------------------- */
enum { Q, K, V, O, DOUT, DQ, DK, DV, NT, LSE = NT, NV };
static const char *const tnames[NV] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv", "lse"};
enum { EXPECT_OK, EXPECT_ANY, EXPECT_INVALID };
/* Buffers past the views': params.attn_mask, params.dbias and params.alibi_slopes, each exactly its span. */
enum { MASK_B = NV, DBIAS_B, SLOPE_B, NB };
/* The params of issue 48 (softcap, ALiBi, V's head dim, seqused, attn_mask, dbias), drawn from the bytes after the
 * data's seed: an input that ends before them (every older one) reads 0, none of them. */
enum { F_SOFTCAP = 1, F_ALIBI = 2, F_HDV = 4, F_SEQUSED = 8, F_MASK = 16, F_DBIAS = 32 };

typedef struct {
  flashc_tensor t;
  int buf;        /* the buffer it lives in, -1 for none (NULL data) */
  size_t pos;     /* byte position in the buffer of its lowest element */
  int64_t lo, hi; /* element offsets of its lowest and highest element from t.data; hi < lo: no element */
  size_t misalign;
  int null_data;
  int fake; /* strides that overflow: the view gets one element of memory, the call must refuse it */
} tview;

typedef struct {
  unsigned char *p, *snap, *ref; /* the buffer; its bytes before the calls; after cpu-ref's */
  unsigned char *out;            /* 1 where an output may write */
  size_t bytes;
} buffer;

typedef struct {
  int backward, threads, threads2;
  flashc_dtype dtype;
  int64_t batch, sq, sk, hq, hkv, d, dv; /* dv: V's head dim (v, o, dout, dv), d: Q/K's (q, k, dq, dk) */
  int varlen, lse_null, nonfinite, nseq_arr, nseq_dec;
  int32_t cu_q[9], cu_k[9]; /* the lengths the data was laid out with */
  int32_t *cu_q_arr, *cu_k_arr;
  flashc_params prm;
  tview tv[NV];
  const flashc_tensor *arg[NT]; /* what the call receives (NULL, or a tensor of another name) */
  float *lse;
  buffer buf[NB];
  int nbuf;
  /* issue 48's params, as decode_features drew them (F_* bits in feat) */
  size_t feat_at; /* the input byte the features start at (an input ending there has none) */
  unsigned feat, hdv_byte, alibi_byte, alibi_vals, mask_byte, mask_vals, mask_bad, dbias_byte;
  size_t alibi_mis, mask_mis;   /* bytes by which the slopes' / the mask's pointer is misaligned */
  int64_t alibi_floats;         /* floats in the slopes' buffer */
  unsigned char used_raw[2][8]; /* seqused choices per sequence (q, k) */
  int used_which;               /* bit 0: seqused_q, bit 1: seqused_k */
  int32_t *used_arr[2];         /* the arrays passed: num_seqs entries each */
  int used_nan;                 /* rows past seqused hold NaN: no output may be NaN */
  int64_t mn[4];                /* attn_mask's and dbias's logical sizes [batch, heads_q, seqlen_q, seqlen_k] */
  int mask_fake;                /* attn_mask's strides overflow: one element of memory, the call must refuse */
  int expect;
  unsigned mutated; /* kinds of mutation applied */
  char why[512];
} fcase;

static void note(fcase *c, int expect, const char *fmt, ...) {
  if (expect > c->expect) c->expect = expect;
  size_t n = strlen(c->why);
  if (n + 2 >= sizeof c->why) return;
  if (n) c->why[n++] = ';', c->why[n++] = ' ', c->why[n] = '\0';
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->why + n, sizeof c->why - n, fmt, ap);
  va_end(ap);
}

static int is_output(const fcase *c, int t) { return c->backward ? (t == DQ || t == DK || t == DV) : t == O; }
static int n_tensors(const fcase *c) { return c->backward ? NT : 4; }
static int64_t elems(const flashc_tensor *t) { return t->size[0] * t->size[1] * t->size[2] * t->size[3]; }

/* Element-offset range of a view, with any signs of strides. */
static void extent(tview *v) {
  v->lo = 0, v->hi = 0;
  for (int d = 0; d < 4; d++) {
    if (v->t.size[d] <= 0) {
      v->lo = 0, v->hi = -1;
      return;
    }
    int64_t r = (v->t.size[d] - 1) * v->t.stride[d];
    if (r < 0)
      v->lo += r;
    else
      v->hi += r;
  }
}
static size_t view_bytes(const tview *v) {
  return v->hi < v->lo ? 0 : (size_t)(v->hi - v->lo + 1) * esize(v->t.dtype) + v->misalign;
}

static int lse_count(const fcase *c) {
  int64_t n = c->varlen ? c->hq * c->sq : c->batch * c->hq * c->sq;
  return (int)(n > 0 ? n : 0);
}

static void print_case(const fcase *c) {
  fprintf(stderr, "fuzz_api: %s %s batch %lld seqlen_q %lld seqlen_k %lld heads %lld/%lld head_dim %lld\n",
          c->backward ? "backward" : "forward", flashc_dtype_name(c->dtype) ? flashc_dtype_name(c->dtype) : "?",
          (long long)c->batch, (long long)c->sq, (long long)c->sk, (long long)c->hq, (long long)c->hkv,
          (long long)c->d);
  fprintf(stderr, "  params: scale %g causal %d align %d window (%lld, %lld) deterministic %d num_seqs %lld",
          (double)c->prm.scale, c->prm.causal, (int)c->prm.align, (long long)c->prm.window_left,
          (long long)c->prm.window_right, c->prm.deterministic, (long long)c->prm.num_seqs);
  for (int w = 0; w < 2; w++) {
    const int32_t *a = w ? c->prm.cu_seqlens_k : c->prm.cu_seqlens_q;
    fprintf(stderr, " cu_seqlens_%c", w ? 'k' : 'q');
    if (!a) fprintf(stderr, " NULL");
    for (int i = 0; a && i < c->nseq_arr; i++) fprintf(stderr, "%s%d", i ? "," : " ", a[i]);
  }
  fprintf(stderr, "\n  threads %d, data %s\n", c->threads, c->nonfinite ? "with NaN/Inf" : "finite");
  const flashc_params *p = &c->prm;
  fprintf(stderr,
          "  features (from byte %zu) 0x%x: softcap %g, alibi_slopes %s (stride %lld, %lld floats%s), head_dim_v %lld",
          c->feat_at, c->feat, (double)p->softcap, p->alibi_slopes ? "set" : "NULL", (long long)p->alibi_stride_batch,
          (long long)c->alibi_floats, c->alibi_mis ? ", misaligned" : "", (long long)c->dv);
  for (int w = 0; w < 2; w++) {
    const int32_t *u = w ? p->seqused_k : p->seqused_q;
    fprintf(stderr, ", seqused_%c", w ? 'k' : 'q');
    if (!u) fprintf(stderr, " NULL");
    for (int s = 0; u && s < (c->varlen && p->num_seqs >= 1 ? p->num_seqs : 1); s++)
      fprintf(stderr, "%s%d", s ? "," : " ", u[s]);
  }
  fprintf(stderr,
          "\n  attn_mask %s is_bool %d stride [%lld,%lld,%lld,%lld] over [%lld,%lld,%lld,%lld]%s; dbias %s stride "
          "[%lld,%lld,%lld,%lld]\n",
          p->attn_mask ? "set" : "NULL", p->attn_mask_is_bool, (long long)p->attn_mask_stride[0],
          (long long)p->attn_mask_stride[1], (long long)p->attn_mask_stride[2], (long long)p->attn_mask_stride[3],
          (long long)c->mn[0], (long long)c->mn[1], (long long)c->mn[2], (long long)c->mn[3],
          c->mask_mis ? " misaligned" : "", p->dbias ? "set" : "NULL", (long long)p->dbias_stride[0],
          (long long)p->dbias_stride[1], (long long)p->dbias_stride[2], (long long)p->dbias_stride[3]);
  for (int t = 0; t < NV; t++) {
    const tview *v = &c->tv[t];
    if (t >= n_tensors(c) && t != LSE) continue;
    if (t == LSE) {
      if (c->lse)
        fprintf(stderr, "  lse: [%d] buffer %d at byte %zu\n", lse_count(c), v->buf, v->pos);
      else
        fprintf(stderr, "  lse: NULL\n");
      continue;
    }
    int a = -1;
    for (int u = 0; u < NT; u++)
      if (c->arg[t] == &c->tv[u].t) a = u;
    fprintf(stderr, "  %s%s%s: %s size [%lld,%lld,%lld,%lld] stride [%lld,%lld,%lld,%lld] buffer %d at byte %zu%s%s\n",
            tnames[t], a >= 0 && a != t ? " = struct " : "", a >= 0 && a != t ? tnames[a] : "",
            c->arg[t] ? (flashc_dtype_name(v->t.dtype) ? flashc_dtype_name(v->t.dtype) : "bad dtype") : "NULL",
            (long long)v->t.size[0], (long long)v->t.size[1], (long long)v->t.size[2], (long long)v->t.size[3],
            (long long)v->t.stride[0], (long long)v->t.stride[1], (long long)v->t.stride[2], (long long)v->t.stride[3],
            v->buf, v->pos, v->t.data ? "" : " data NULL", v->misalign ? " misaligned" : "");
  }
  fprintf(stderr, "  expected: %s (%s)\n",
          c->expect == EXPECT_OK        ? "OK"
          : c->expect == EXPECT_INVALID ? "invalid argument"
                                        : "either",
          c->why);
}

static void fail(const fcase *c, const char *fmt, ...) {
  print_case(c);
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_api: FAILED: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

/* ---- decoding: shapes, layouts, params ------------------------------------------------------------------- */
static const int64_t head_dims[16] = {1, 2, 3, 4, 5, 7, 8, 13, 16, 17, 24, 32, 33, 48, 59, 64};

/* Strides of a view of sizes n: the outer dims b, s, h nested in the order `perm` picks (0: BSHD, 1: BHSD,
 * others), each with up to 3 elements of padding; or broadcast (stride 0) along some of b, s, h. */
static void layout(reader *r, flashc_tensor *t, int allow_broadcast) {
  static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  unsigned m = rd(r), pads = rd(r);
  const int *perm = perms[(m & 7) % 6];
  int64_t s = t->size[3] > 0 ? t->size[3] : 1;
  if (m & 8) s += pads & 3; /* padding inside a row */
  t->stride[3] = 1;
  for (int a = 2; a >= 0; a--) {
    int d = perm[a];
    t->stride[d] = s;
    s *= t->size[d] > 0 ? t->size[d] : 1;
    if (m & 16) s += (pads >> (2 * a + 2)) & 3;
  }
  if (allow_broadcast && (m & 0xE0) == 0xE0)
    for (int d = 0; d < 3; d++)
      if (pads & (1u << d)) t->stride[d] = 0;
}

/* V's head dim when it has its own: small ones as Q/K's, the large ones models use (192/128 as DeepSeek's MLA), 0
 * (refused) and 513 (past the 512 that cpu and cpu-ref take: UNSUPPORTED). */
static int64_t head_dim_v_of(unsigned v) {
  static const int64_t big[8] = {96, 128, 160, 192, 256, 512, 513, 0};
  return v < 200 ? head_dims[v & 15] : big[v & 7];
}

static void decode(reader *r, fcase *c) {
  unsigned b = rd(r);
  c->backward = b & 1;
  static const flashc_dtype dts[8] = {FLASHC_F32, FLASHC_F32,  FLASHC_F32, FLASHC_F32,
                                      FLASHC_F16, FLASHC_BF16, FLASHC_F32, FLASHC_F64};
  c->dtype = dts[(b >> 1) & 7];
  c->lse_null = !c->backward && ((b >> 4) & 3) == 3;
  c->varlen = ((b >> 6) & 3) == 3;
  unsigned t = rd(r);
  c->threads = 1 + (int)(t & 3);
  c->threads2 = (t & 4) ? 1 + (int)((t >> 3) & 3) : 0; /* a second cpu run at another count */
  if (c->threads2 == c->threads) c->threads2 = 0;

  /* Shapes: small on purpose (a run must take milliseconds); 0 rows now and then. */
  unsigned v = rd(r);
  c->batch = v < 10 ? 0 : 1 + v % 3;
  v = rd(r);
  c->sq = v < 10 ? 0 : 1 + (int64_t)(v * v) / 1040;
  v = rd(r);
  c->sk = v < 10 ? 0 : 1 + (int64_t)(v * v) / 1040;
  v = rd(r);
  c->hkv = 1 + v % 3;
  c->hq = c->hkv * (1 + (v >> 2) % 3);
  v = rd(r);
  c->d = v == 255 ? 257 + (rd(r) & 63) : head_dims[v & 15]; /* > 256: UNSUPPORTED on both */
  c->dv = c->feat & F_HDV ? head_dim_v_of(c->hdv_byte) : c->d;
  /* A budget of work per call: under ASan and libFuzzer's comparison tracing, cpu-ref's backward runs at a few
   * million multiply-adds a second, and a fuzzer wants hundreds of calls a second. V's head dim counts half. */
  const int64_t cost =
      c->dv == c->d ? (c->d > 256 ? 1 : c->d) : ((c->d > 256 ? 1 : c->d) + (c->dv > 512 ? 1 : c->dv)) / 2;
  while (c->batch * c->hq * c->sq * c->sk * (cost > 0 ? cost : 1) > ((int64_t)1 << 19))
    if (c->sq > c->sk)
      c->sq /= 2;
    else
      c->sk /= 2;

  c->prm = flashc_params_default();
  v = rd(r);
  static const float scales[8] = {0.0f, 0.0f, 0.0f, 0.5f, -0.7f, 3.0f, 1e-30f, 0.02f};
  c->prm.scale = scales[v & 7];
  c->prm.causal = (v >> 3) & 1;
  c->prm.align = (v >> 4) & 1 ? FLASHC_ALIGN_TOP_LEFT : FLASHC_ALIGN_BOTTOM_RIGHT;
  c->prm.deterministic = (v >> 5) & 1;
  c->nonfinite = ((v >> 6) & 3) == 3;
  v = rd(r);
  static const int64_t wins[8] = {-1, -1, 0, 1, 3, 17, INT64_MAX, -5};
  c->prm.window_left = (v & 8) ? wins[v & 7] : -1;
  c->prm.window_right = (v & 128) ? wins[(v >> 4) & 7] : -1;

  if (c->varlen) { /* lengths 0 .. 24 per sequence: batch 1 of total rows */
    int n = 1 + (int)(rd(r) % 4);
    c->prm.num_seqs = c->nseq_dec = n;
    c->cu_q[0] = c->cu_k[0] = 0;
    for (int s = 0; s < n; s++) {
      unsigned a = rd(r), e = rd(r);
      c->cu_q[s + 1] = c->cu_q[s] + (a < 20 ? 0 : (int32_t)(a % 25));
      c->cu_k[s + 1] = c->cu_k[s] + (e < 20 ? 0 : (int32_t)(e % 25));
    }
    c->batch = 1, c->sq = c->cu_q[n], c->sk = c->cu_k[n];
  }

  for (int i = 0; i < NT; i++) {
    flashc_tensor *x = &c->tv[i].t;
    int qlike = i == Q || i == O || i == DOUT || i == DQ, vlike = i == V || i == O || i == DOUT || i == DV;
    x->dtype = c->dtype;
    x->size[0] = c->batch, x->size[1] = qlike ? c->sq : c->sk, x->size[2] = qlike ? c->hq : c->hkv;
    x->size[3] = vlike ? c->dv : c->d;
    layout(r, x, !is_output(c, i));
    c->arg[i] = x;
  }
  /* Packed QKV ([b, s, 3, h, d], as frameworks' fused projections give) and packed dQKV: interleaved views of
   * one buffer that share no element, so valid. In forward, o may join the pack ([b, s, 4, h, d]). */
  unsigned pk = rd(r);
  if (c->sq == c->sk && c->hq == c->hkv && c->dv == c->d && (pk & 3) != 0) {
    int inputs = pk & 1, outputs = (pk >> 1) & 1 && c->backward, with_o = !c->backward && (pk & 4);
    int np = 3 + with_o;
    for (int g = 0; g < 2; g++) {
      if (!(g ? outputs : inputs)) continue;
      int first = g ? DQ : Q;
      for (int a = 0; a < np; a++) {
        tview *x = &c->tv[first + a];
        x->t.stride[2] = c->d, x->t.stride[1] = np * c->hq * c->d, x->t.stride[0] = c->sq * np * c->hq * c->d;
        x->buf = first, x->pos = (size_t)(a * c->hq * c->d) * esize(c->dtype);
      }
    }
  }
}

/* ---- mutations: each says whether it makes the call invalid ------------------------------------------------ */
static int pick_dim_gt1(const flashc_tensor *t, unsigned sel) {
  for (int a = 0; a < 3; a++) {
    int d = (int)((sel + (unsigned)a) % 3);
    if (t->size[d] > 1) return d;
  }
  return -1;
}

static int any_element(const fcase *c, int t) { return elems(&c->tv[t].t) > 0 && c->tv[t].t.size[3] > 0; }

static void mutate(reader *r, fcase *c) {
  unsigned kind = rd(r) % 16, a = rd(r), b = rd(r);
  if (c->mutated & (1u << kind) || (kind == 14 && (c->mutated & (1u << 10)))) return; /* none undoes another */
  c->mutated |= 1u << kind;
  int nt = n_tensors(c);
  int t = (int)(a % (unsigned)nt);
  tview *x = &c->tv[t];
  int outs[3] = {c->backward ? DQ : O, DK, DV}, nout = c->backward ? 3 : 1;
  int out = outs[b % (unsigned)nout];
  switch (kind) {
  case 0: { /* negative stride */
    int d = pick_dim_gt1(&x->t, b);
    if (d < 0) return;
    x->t.stride[d] = x->t.stride[d] > 0 ? -x->t.stride[d] : x->t.stride[d] < 0 ? x->t.stride[d] : -1;
    note(c, EXPECT_OK, "%s.stride[%d] < 0", tnames[t], d);
    return;
  }
  case 1: /* head_dim stride other than 1 */
    if (x->t.size[3] < 2) return;
    x->t.stride[3] = b & 1 ? 2 : 0;
    note(c, EXPECT_OK, "%s.stride[3] = %lld", tnames[t], (long long)x->t.stride[3]);
    return;
  case 2: { /* an output with stride 0: on a dim > 1 it overlaps itself */
    tview *y = &c->tv[out];
    int d = (int)(b % 3);
    y->t.stride[d] = 0;
    note(c, EXPECT_OK, "%s.stride[%d] = 0", tnames[out], d);
    return;
  }
  case 3: { /* an output in an input's buffer, at its start */
    int in = (int)(a % (unsigned)nt);
    if (is_output(c, in)) in = Q;
    c->tv[out].buf = c->tv[in].buf >= 0 ? c->tv[in].buf : in, c->tv[out].pos = c->tv[in].pos;
    note(c, EXPECT_OK, "%s placed at %s", tnames[out], tnames[in]);
    return;
  }
  case 4: { /* the same struct as an output and an input (issue 43, row 1) */
    int in = (int)(a % (unsigned)nt);
    if (is_output(c, in)) in = K;
    c->arg[out] = &c->tv[in].t;
    note(c, EXPECT_OK, "struct %s passed as %s", tnames[in], tnames[out]);
    return;
  }
  case 5: { /* two outputs in one buffer, or one struct */
    if (!c->backward) return;
    int o1 = outs[a % 3], o2 = outs[(a + 1 + b % 2) % 3];
    if (b & 4)
      c->arg[o2] = &c->tv[o1].t;
    else
      c->tv[o2].buf = c->tv[o1].buf >= 0 ? c->tv[o1].buf : o1, c->tv[o2].pos = c->tv[o1].pos;
    note(c, EXPECT_OK, "%s %s %s", tnames[o2], b & 4 ? "passed as struct" : "placed at", tnames[o1]);
    return;
  }
  case 6: { /* lse inside a tensor (issue 43, row 3): an output in forward, an input in backward */
    if (c->lse_null) return;
    /* at the first 4-byte boundary from the tensor's start: lse itself stays aligned (a misaligned lse is refused,
     * and the harness writes it as floats), still inside the tensor's bytes */
    c->tv[LSE].buf = x->buf >= 0 ? x->buf : t, c->tv[LSE].pos = (x->pos + x->misalign + 3) / 4 * 4;
    note(c, EXPECT_OK, "lse placed at %s", tnames[t]);
    return;
  }
  case 7: /* bad cu_seqlens */
    if (!c->varlen) return;
    switch (b % 6) {
    case 0: c->cu_q[0] = 1, note(c, EXPECT_INVALID, "cu_seqlens_q[0] = 1"); break;
    case 1: c->cu_k[c->prm.num_seqs] += 1 + (int32_t)(a % 5), note(c, EXPECT_INVALID, "cu_seqlens_k past total"); break;
    case 2:
      if (c->prm.num_seqs < 2) return;
      c->cu_q[1] = c->cu_q[c->prm.num_seqs] + 1, note(c, EXPECT_INVALID, "cu_seqlens_q decreasing");
      break;
    case 3: c->prm.num_seqs = -(int64_t)(a % 3) - 1, note(c, EXPECT_INVALID, "num_seqs < 0"); break;
    case 4: c->nseq_arr = -1, note(c, EXPECT_INVALID, "cu_seqlens_%c NULL", a & 1 ? 'k' : 'q'); break;
    case 5: c->prm.num_seqs = 0, note(c, EXPECT_ANY, "num_seqs 0"); break;
    }
    if (b % 6 == 4) c->nseq_arr = a & 1 ? -2 : -1;
    return;
  case 8: /* dtype mismatch, or no dtype */
    if (t == Q) t = K, x = &c->tv[K];
    x->t.dtype = b & 1 ? (flashc_dtype)(5 + b % 7) : (flashc_dtype)((c->dtype + 1 + b % 3) % 4);
    note(c, EXPECT_OK, "%s.dtype %d", tnames[t], (int)x->t.dtype);
    return;
  case 9: { /* a size changed: a mismatch, or for q and o together a longer sequence (strides of the old one) */
    int d = (int)(b % 4);
    x->t.size[d] += 1 + (int64_t)(a % 2);
    if (d == 1 && t == Q && !c->backward && (b & 4)) c->tv[O].t.size[1] = c->sq = x->t.size[1];
    note(c, EXPECT_OK, "%s%s.size[%d] changed", tnames[t], d == 1 && t == Q && !c->backward && (b & 4) ? " and o" : "",
         d);
    return;
  }
  case 10: /* bad params */
    switch (b % 6) {
    case 0: c->prm.causal = 2 + (int)(a % 3); break;
    case 1: c->prm.align = (flashc_causal_align)(2 + a % 5); break;
    case 2: c->prm.deterministic = -1; break;
    case 3: c->prm.scale = NAN; break;
    case 4: c->prm.scale = b & 8 ? INFINITY : -INFINITY; break;
    case 5: /* heads_q not a multiple of heads_kv */
      if (c->hkv < 2) return;
      for (int i = 0; i < NT; i++)
        if (i == Q || i == O || i == DOUT || i == DQ) c->tv[i].t.size[2] = c->hkv + 1;
      note(c, EXPECT_OK, "heads_q %lld, heads_kv %lld", (long long)c->hkv + 1, (long long)c->hkv);
      return;
    }
    note(c, EXPECT_INVALID, "params (case %u)", b % 6);
    return;
  case 11: /* misaligned data (refused: the new contract) */
    if (esize(x->t.dtype) < 2 || !any_element(c, t)) return;
    x->misalign = 1 + b % (esize(x->t.dtype) - 1);
    note(c, EXPECT_OK, "%s.data misaligned by %zu bytes", tnames[t], x->misalign);
    return;
  case 12: /* NULL data, NULL tensor, NULL lse in backward */
    if (b % 3 == 0) {
      x->null_data = 1;
      note(c, EXPECT_OK, "%s.data NULL", tnames[t]);
    } else if (b % 3 == 1) {
      c->arg[t] = NULL;
      note(c, EXPECT_OK, "%s NULL", tnames[t]);
    } else if (c->backward) {
      c->lse_null = 1;
      note(c, EXPECT_OK, "backward without lse");
    }
    return;
  case 13: { /* a stride that overflows 64 bits */
    int d = pick_dim_gt1(&x->t, b);
    if (d < 0 || x->t.size[d] < 3) return;
    x->t.stride[d] = INT64_MAX / 2, x->fake = 1;
    note(c, EXPECT_OK, "%s.stride[%d] overflows", tnames[t], d);
    return;
  }
  case 14: /* odd valid params */
    switch (b % 4) {
    case 0: c->prm.window_left = INT64_MAX, c->prm.window_right = INT64_MAX - (int64_t)a; break;
    case 1: c->prm.scale = (b & 4) ? 1e4f : 37.0f; break;
    case 2: c->prm.scale = -1e-3f; break;
    case 3: c->prm.window_left = INT64_MIN, c->prm.window_right = -(int64_t)a - 2; break;
    }
    return;
  case 15: /* inputs sharing memory: valid */
    if (b & 1)
      c->arg[V] = &c->tv[K].t;
    else if (c->backward && (b & 2))
      c->arg[DOUT] = &c->tv[Q].t;
    else
      c->tv[V] = c->tv[K], c->tv[V].buf = c->tv[K].buf >= 0 ? c->tv[K].buf : K;
    note(c, EXPECT_OK, "inputs share memory (%u)", b & 3);
    return;
  }
}

/* ---- memory: exact buffers, data, poison --------------------------------------------------------------------- */

/* The view the call receives in slot t (a mutation may pass another tensor's struct there); NULL if none. */
static const tview *slot(const fcase *c, int t) {
  for (int u = 0; u < NT; u++)
    if (c->arg[t] == &c->tv[u].t) return &c->tv[u];
  return NULL;
}
/* A view the harness may walk: it has elements, data, and memory for all of them. */
static int walkable(const tview *v) { return v && v->t.data && !v->fake && v->hi >= v->lo && v->t.size[3] > 0; }

/* Calls f(c, v, at, n, step, es, arg) for every row of view v: its n elements of es bytes lie at byte positions
 * at, at + step, ... of the buffer. */
typedef void (*row_fn)(const fcase *, const tview *, int64_t, int64_t, int64_t, size_t, void *);
static void for_each(const fcase *c, const tview *v, row_fn f, void *arg) {
  if (!walkable(v)) return;
  const flashc_tensor *t = &v->t;
  const size_t es = esize(t->dtype);
  const int64_t base = (unsigned char *)t->data - c->buf[v->buf].p, e = (int64_t)es;
  for (int64_t i0 = 0; i0 < t->size[0]; i0++)
    for (int64_t i1 = 0; i1 < t->size[1]; i1++)
      for (int64_t i2 = 0; i2 < t->size[2]; i2++)
        f(c, v, base + (i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2]) * e, t->size[3], t->stride[3] * e,
          es, arg);
}

typedef struct {
  uint64_t *rng;
  int mode, nonfinite;
} fill_arg;

static void fill_one(const fcase *c, const tview *v, int64_t at, int64_t n, int64_t step, size_t es, void *varg) {
  (void)es;
  for (int64_t k = 0; k < n; k++, at += step) {
    fill_arg *a = varg;
    double x = 2.0 * uniform(a->rng) - 1.0;
    if (a->mode == 1) x *= 4.0;
    if (a->mode == 2) x = ldexp(x, (int)(splitmix(a->rng) % 40) - 20); /* magnitudes 2^-20 .. 2^20 */
    if (a->mode == 3) x = round(x * 3.0);                              /* ties: equal scores, zeros */
    if (a->nonfinite && splitmix(a->rng) % 97 == 0) x = (double[]){NAN, INFINITY, -INFINITY}[splitmix(a->rng) % 3];
    store(c->buf[v->buf].p + at, v->t.dtype, x);
  }
}
static void poison_one(const fcase *c, const tview *v, int64_t at, int64_t n, int64_t step, size_t es, void *arg) {
  (void)arg;
  for (int64_t k = 0; k < n; k++, at += step) poison(c->buf[v->buf].p + at, es);
}

static void place(fcase *c, uint64_t seed, int mode) {
  /* Buffers: every view (and lse) in buffer `buf` at byte `pos`; a buffer is exactly as long as its views reach. */
  size_t need[NV] = {0};
  int used[NV] = {0};
  for (int i = 0; i < NV; i++) {
    tview *v = &c->tv[i];
    if (i == LSE) {
      if (c->lse_null) continue;
      v->lo = 0, v->hi = lse_count(c) - 1, v->t.dtype = FLASHC_F32;
    } else if (v->fake) {
      v->lo = 0, v->hi = 0;
    } else {
      extent(v);
    }
    int b = v->buf >= 0 ? v->buf : i;
    v->buf = b, used[b] = 1;
    size_t end = v->pos + view_bytes(v);
    if (end > need[b]) need[b] = end;
  }
  for (int b = 0; b < NV; b++) {
    buffer *B = &c->buf[b];
    if (!used[b]) continue;
    B->bytes = need[b];
    B->p = malloc(need[b]); /* malloc(0) too: a unique pointer to no byte, for views with no element */
    B->snap = malloc(need[b] + 1);
    B->ref = malloc(need[b] + 1);
    B->out = calloc(need[b] + 1, 1);
    if ((!B->p && need[b]) || !B->snap || !B->ref || !B->out) abort();
    if (need[b]) memset(B->p, 0xFF, need[b]); /* NaN in every dtype: what a backend must never read */
  }
  for (int i = 0; i < NV; i++) {
    tview *v = &c->tv[i];
    if (i == LSE && c->lse_null) continue;
    unsigned char *p = c->buf[v->buf].p;
    if (p) p += v->pos + v->misalign + (size_t)(-v->lo) * esize(v->t.dtype);
    if (i == LSE)
      c->lse = (float *)(void *)p;
    else
      v->t.data = v->null_data || (v->hi < v->lo && (seed & 1)) ? NULL : p;
  }
  if (c->lse && lse_count(c) == 0 && (seed & 2)) c->lse = NULL; /* no query row: NULL is fine */
  /* Inputs get data, then outputs the poison (an output on an input poisons it: the call must fail anyway). */
  uint64_t rng = seed;
  fill_arg fa = {&rng, mode, 0};
  for (int i = 0; i < n_tensors(c); i++) {
    fa.nonfinite = c->nonfinite && i <= V;
    if (!is_output(c, i)) for_each(c, slot(c, i), fill_one, &fa);
  }
  for (int i = 0; i < n_tensors(c); i++)
    if (is_output(c, i)) for_each(c, slot(c, i), poison_one, NULL);
  for (int i = 0; c->lse && i < lse_count(c); i++) {
    if (c->backward) {
      const float x = (float)(uniform(&rng) * 4.0);
      memcpy(c->lse + i, &x, sizeof x); /* no store through a misaligned float pointer, whatever the mutations did */
    } else
      poison((unsigned char *)(c->lse + i), 4);
  }

  /* cu_seqlens: host arrays of exactly num_seqs + 1 entries. */
  if (c->varlen) {
    int nul = c->nseq_arr;
    c->nseq_arr = c->prm.num_seqs >= 0 ? (int)c->prm.num_seqs + 1 : 1;
    c->cu_q_arr = malloc((size_t)c->nseq_arr * 4);
    c->cu_k_arr = malloc((size_t)c->nseq_arr * 4);
    if (!c->cu_q_arr || !c->cu_k_arr) abort();
    memcpy(c->cu_q_arr, c->cu_q, (size_t)c->nseq_arr * 4);
    memcpy(c->cu_k_arr, c->cu_k, (size_t)c->nseq_arr * 4);
    c->prm.cu_seqlens_q = nul == -1 ? NULL : c->cu_q_arr;
    c->prm.cu_seqlens_k = nul == -2 ? NULL : c->cu_k_arr;
  }
}

/* ---- issue 48's params: softcap, ALiBi, V's head dim, seqused, attn_mask, dbias -------------------------------- */

/* Reads the bytes after the data's seed: a flag byte (F_*), then each set feature's own bytes. Only values are drawn
 * here; the buffers they need are sized in place_features, from the shapes the call receives. */
static void decode_features(reader *r, fcase *c) {
  c->feat = rd(r) & 63;
  if (c->feat & F_SOFTCAP) {
    const unsigned v = rd(r);
    static const float caps[8] = {0.0f, 0.05f, 1.0f, 5.0f, 30.0f, 1e6f, 1e-30f, -0.0f}; /* -0: off, valid */
    static const float bad[4] = {-1.0f, NAN, INFINITY, -INFINITY};
    c->prm.softcap = (v & 8) ? bad[(v >> 4) & 3] : caps[v & 7];
  }
  if (c->feat & F_ALIBI) c->alibi_byte = rd(r), c->alibi_vals = rd(r);
  if (c->feat & F_HDV) c->hdv_byte = rd(r);
  if (c->feat & F_SEQUSED) {
    c->used_which = 1 + (int)(rd(r) % 3);
    const int n = c->varlen ? c->nseq_dec : 1;
    for (int s = 0; s < n; s++) c->used_raw[0][s] = (unsigned char)rd(r), c->used_raw[1][s] = (unsigned char)rd(r);
  }
  if (c->feat & F_MASK) c->mask_byte = rd(r), c->mask_vals = rd(r), c->mask_bad = rd(r);
  if (c->feat & F_DBIAS) c->dbias_byte = rd(r);
}

/* Strides of a [batch, heads_q, seqlen_q, seqlen_k] view: broadcast (0) along the dims of bits 0..3 of `bcast`, the
 * others nested keys innermost (keys 2 apart when `spread`), then queries with `pad` elements of padding, then heads
 * and batch (batch inside heads when `swap`). */
static void mask_strides(int64_t st[4], const int64_t n[4], unsigned bcast, int64_t pad, int swap, int spread) {
  const int order[4] = {3, 2, swap ? 0 : 1, swap ? 1 : 0};
  int64_t s = 1;
  for (int a = 0; a < 4; a++) {
    const int d = order[a];
    if (bcast & (1u << d)) {
      st[d] = 0;
      continue;
    }
    if (d == 3 && spread) s = 2;
    st[d] = s;
    s *= n[d] > 0 ? n[d] : 1;
    if (d == 3) s += pad;
  }
}

/* The offset of the last element of a mask-like view (n, st), or −1 with no element; *overflow when it does not fit
 * 64 bits (or the bytes the address space). */
static int64_t mask_last(const int64_t n[4], const int64_t st[4], size_t es, int *overflow) {
  *overflow = 0;
  for (int d = 0; d < 4; d++)
    if (n[d] <= 0) return -1;
  __int128 last = 0;
  for (int d = 0; d < 4; d++) last += (__int128)(n[d] - 1) * st[d];
  if (last < 0) return -1; /* a negative stride: refused before any address is formed */
  if (last >= INT64_MAX || (last + 1) * (__int128)es > (__int128)SIZE_MAX) *overflow = 1;
  return *overflow ? 0 : (int64_t)last;
}

/* A buffer of exactly `bytes` (+ 1 for its copies), 0xFF throughout. */
static void alloc_buffer(buffer *B, size_t bytes) {
  B->bytes = bytes;
  B->p = malloc(bytes);
  B->snap = malloc(bytes + 1), B->ref = malloc(bytes + 1), B->out = calloc(bytes + 1, 1);
  if ((!B->p && bytes) || !B->snap || !B->ref || !B->out) abort();
  if (bytes) memset(B->p, 0xFF, bytes);
}

static int has_dbias(const fcase *c) { return c->prm.dbias != NULL; }

/* Calls f(c, off, b, h, i, j, arg) for each element (b, h, i, j) of the [batch, heads_q, seqlen_q, seqlen_k] view of
 * strides st (offsets in elements). */
typedef void (*mask_fn)(fcase *, int64_t, int64_t, int64_t, int64_t, int64_t, void *);
static void for_each_mask(fcase *c, const int64_t st[4], mask_fn f, void *arg) {
  const int64_t *n = c->mn;
  for (int64_t b = 0; b < n[0]; b++)
    for (int64_t h = 0; h < n[1]; h++)
      for (int64_t i = 0; i < n[2]; i++)
        for (int64_t j = 0; j < n[3]; j++) f(c, b * st[0] + h * st[1] + i * st[2] + j * st[3], b, h, i, j, arg);
}

/* The seqused entry of sequence s (side w: 0 q, 1 k) from its byte: mostly in [0, slot], now and then past it. */
static int32_t used_of(const fcase *c, int w, int s) {
  const unsigned e = c->used_raw[w][s];
  const int32_t *cu = w ? c->cu_k : c->cu_q;
  const int32_t slot = c->varlen && s < 8 ? cu[s + 1] - cu[s] : 0;
  if (e >= 232) return (e & 1) ? slot + 1 : -1 - (int32_t)(e % 3); /* out of range */
  if (e >= 160 || slot <= 0) return slot > 0 ? slot : 0;
  return (int32_t)(e % (unsigned)(slot + 1));
}

static void fill_mask_one(fcase *c, int64_t off, int64_t b, int64_t h, int64_t i, int64_t j, void *arg) {
  (void)b, (void)h, (void)i, (void)j;
  uint64_t *rng = arg;
  unsigned char *p =
      (unsigned char *)c->prm.attn_mask + off * (c->prm.attn_mask_is_bool ? 1 : (int64_t)esize(c->dtype));
  const unsigned zeros = (c->mask_vals >> 2) & 7; /* eighths of the keys removed */
  const int removed = splitmix(rng) % 8 < zeros;
  if (c->prm.attn_mask_is_bool) {
    *p = removed ? 0 : (unsigned char)(1 + splitmix(rng) % 255); /* any nonzero byte attends */
  } else {
    static const double mags[4] = {1.0, 4.0, 0.1, 30.0};
    store(p, c->dtype, removed ? -INFINITY : (2.0 * uniform(rng) - 1.0) * mags[(c->mask_vals >> 5) & 3]);
  }
}
static void mark_dbias_one(fcase *c, int64_t off, int64_t b, int64_t h, int64_t i, int64_t j, void *arg) {
  (void)b, (void)h, (void)i, (void)j;
  const size_t es = esize(c->dtype), at = (size_t)off * es;
  if (arg)
    memset(c->buf[DBIAS_B].out + at, 0xFF, es);
  else
    poison(c->buf[DBIAS_B].p + at, es);
}

typedef struct {
  int64_t q0, sq, k0, sk; /* this sequence's first rows and the lengths it uses (seqused) */
  int64_t nq, nk;         /* its slots' lengths: rows past sq, sk get zeros */
} seqinfo;

static seqinfo seq_of(const fcase *c, int64_t s) {
  seqinfo z;
  if (c->varlen)
    z.q0 = c->cu_q[s], z.sq = c->cu_q[s + 1] - c->cu_q[s], z.k0 = c->cu_k[s], z.sk = c->cu_k[s + 1] - c->cu_k[s];
  else
    z.q0 = s * c->sq, z.sq = c->sq, z.k0 = s * c->sk, z.sk = c->sk;
  z.nq = z.sq, z.nk = z.sk;
  if (c->varlen && c->prm.seqused_q) z.sq = c->prm.seqused_q[s];
  if (c->varlen && c->prm.seqused_k) z.sk = c->prm.seqused_k[s];
  return z;
}
/* Offset (elements) of row `g` (global: s·seqlen + i, or cu_seqlens[s] + i) of head h in tensor t. */
static int64_t row_off(const fcase *c, int t, int64_t s, int64_t g, int64_t h) {
  const flashc_tensor *x = &slot(c, t)->t;
  int64_t len = (t == Q || t == O || t == DOUT || t == DQ) ? c->sq : c->sk;
  return c->varlen ? g * x->stride[1] + h * x->stride[2]
                   : s * x->stride[0] + (g - s * len) * x->stride[1] + h * x->stride[2];
}
/* Whether the backward's lse lies in the buffer of a tensor (issue 43's "lse inside a tensor"). */
static int lse_in_tensor(const fcase *c) {
  if (!c->backward || !c->lse) return 0;
  const int b = c->tv[LSE].buf >= 0 ? c->tv[LSE].buf : LSE;
  for (int u = 0; u < NT; u++)
    if ((c->tv[u].buf >= 0 ? c->tv[u].buf : u) == b) return 1;
  return 0;
}
/* After place(): the slopes, seqused arrays, mask and dbias, each in memory of exactly the bytes it spans. */
static void place_features(fcase *c, uint64_t seed, int mode) {
  uint64_t rng = seed ^ 0x6D61736B5F666561ull; /* apart from the tensors' data, which stays as older inputs had it */
  const flashc_tensor *q = &c->tv[Q].t, *k = &c->tv[K].t;
  const int64_t nseq = c->varlen ? c->prm.num_seqs : q->size[0];
  if (c->feat & F_ALIBI) {
    const unsigned a = c->alibi_byte, hq = (unsigned)(q->size[2] > 0 ? q->size[2] : 1);
    int64_t stride = 0;
    switch (a & 3) {
    case 0: break; /* one slope per head */
    case 1: stride = (int64_t)hq + ((a >> 2) & 3); break;
    case 2: { /* invalid, or valid by the letter (one sequence: the stride is never applied) */
      static const int64_t odd[4] = {-1, 1, INT64_MAX, -((int64_t)1 << 40)};
      stride = odd[(a >> 2) & 3];
      break;
    }
    case 3: c->alibi_mis = 1 + (a >> 2) % 3; break;
    }
    c->prm.alibi_stride_batch = stride;
    int64_t n = hq;
    if (stride > 0 && stride < ((int64_t)1 << 20) && nseq > 1) n += (nseq - 1) * stride;
    c->alibi_floats = n;
    alloc_buffer(&c->buf[SLOPE_B], (size_t)n * 4 + c->alibi_mis);
    const double mag = ldexp(1.0, (int)(c->alibi_vals & 7) - 4);
    for (int64_t i = 0; i < n; i++) {
      const float x = (float)((c->alibi_vals & 8) ? (2.0 * uniform(&rng) - 1.0) * mag : uniform(&rng) * mag);
      memcpy(c->buf[SLOPE_B].p + c->alibi_mis + i * 4, &x, 4);
    }
    c->prm.alibi_slopes = (const float *)(const void *)(c->buf[SLOPE_B].p + c->alibi_mis);
  }
  if (c->feat & F_SEQUSED) {
    const int64_t n = c->varlen && c->prm.num_seqs >= 1 ? c->prm.num_seqs : 1;
    for (int w = 0; w < 2; w++) {
      if (!(c->used_which & (1 << w))) continue;
      if (!(c->used_arr[w] = malloc((size_t)n * sizeof(int32_t)))) abort();
      for (int s = 0; s < n; s++) c->used_arr[w][s] = used_of(c, w, s);
    }
    c->prm.seqused_q = c->used_arr[0], c->prm.seqused_k = c->used_arr[1];
  }
  c->mn[0] = c->varlen ? c->prm.num_seqs : q->size[0], c->mn[1] = q->size[2];
  c->mn[2] = c->varlen ? c->sq : q->size[1], c->mn[3] = c->varlen ? c->sk : k->size[1];
  if (c->varlen) /* the lengths of the mask refused with varlen: the longest sequence's, for a buffer of some size */
    c->mn[2] = c->mn[3] = 1;
  if (c->feat & F_MASK) {
    const unsigned m = c->mask_byte;
    c->prm.attn_mask_is_bool = m & 1;
    mask_strides(c->prm.attn_mask_stride, c->mn, (m >> 1) & 15, (int64_t)(c->mask_vals & 3), (m >> 5) & 1,
                 (m >> 6) & 1);
    size_t es = c->prm.attn_mask_is_bool ? 1 : esize(c->dtype);
    if (m & 128) { /* a broken rule */
      const unsigned b = c->mask_bad;
      switch (b % 4) {
      case 0: { /* a negative stride */
        int64_t *st = &c->prm.attn_mask_stride[(b >> 2) & 3];
        *st = *st > 0 ? -*st : -1;
        break;
      }
      case 1: c->prm.attn_mask_is_bool = b & 4 ? 2 : -1; break;
      case 2:
        if (es > 1)
          c->mask_mis = 1 + (b >> 2) % (es - 1);
        else
          c->prm.attn_mask_is_bool = 7;
        break;
      case 3: { /* strides whose offsets overflow (on a dim of one element: valid, never applied) */
        c->prm.attn_mask_stride[(b >> 2) & 3] = INT64_MAX;
        break;
      }
      }
    }
    es = c->prm.attn_mask_is_bool == 1 ? 1 : esize(c->dtype);
    int overflow;
    const int64_t last = mask_last(c->mn, c->prm.attn_mask_stride, es, &overflow);
    c->mask_fake = overflow;
    if (last >= ((int64_t)1 << 28)) fail(c, "the harness gave attn_mask strides it cannot back with memory");
    alloc_buffer(&c->buf[MASK_B], (overflow ? 1 : (size_t)(last + 1)) * es + c->mask_mis);
    c->prm.attn_mask = c->buf[MASK_B].p + c->mask_mis;
    const int64_t *st = c->prm.attn_mask_stride;
    if (last >= 0 && !overflow && (c->prm.attn_mask_is_bool == 0 || c->prm.attn_mask_is_bool == 1) && st[0] >= 0 &&
        st[1] >= 0 && st[2] >= 0 && st[3] >= 0)
      for_each_mask(c, c->prm.attn_mask_stride, fill_mask_one, &rng);
  }
  if (c->feat & F_DBIAS) {
    const unsigned g = c->dbias_byte;
    mask_strides(c->prm.dbias_stride, c->mn, g & 15, (g >> 4) & 1, (g >> 7) & 1, 0);
    switch ((g >> 5) & 3) {
    case 0: break;
    case 1: { /* a negative stride */
      int64_t *st = &c->prm.dbias_stride[g & 3];
      *st = *st > 0 ? -*st : -1;
      break;
    }
    case 2: /* queries and keys at one stride: the elements meet where both dims are > 1 */
      c->prm.dbias_stride[2] = c->prm.dbias_stride[3] = 1;
      break;
    case 3: c->prm.attn_mask = NULL; break; /* dbias without a mask */
    }
    int overflow;
    const int64_t last = mask_last(c->mn, c->prm.dbias_stride, esize(c->dtype), &overflow);
    if (overflow) abort(); /* the strides above are small */
    alloc_buffer(&c->buf[DBIAS_B], (size_t)(last + 1) * esize(c->dtype));
    c->prm.dbias = c->buf[DBIAS_B].p;
    const int64_t *st = c->prm.dbias_stride;
    if (last >= 0 && st[0] >= 0 && st[1] >= 0 && st[2] >= 0 && st[3] >= 0)
      for_each_mask(c, st, mark_dbias_one, NULL); /* poison: an output */
  }
  /* Rows past seqused are never read: NaN there must not reach any output (finite data only, where NaN has no
   * other source: not f16 with magnitudes up to 2^20, mode 2, which overflow to inf; nor a backward whose lse lies
   * in a tensor: the forward that makes it writes −inf for rows that see no key, which is then that tensor's data). */
  if ((c->feat & F_SEQUSED) && c->varlen && !c->nonfinite && !(mode == 2 && c->dtype == FLASHC_F16) &&
      c->prm.num_seqs == c->nseq_dec && !lse_in_tensor(c))
    for (int64_t s = 0; s < c->nseq_dec; s++) {
      const seqinfo z = seq_of(c, s);
      if (z.sq < 0 || z.sk < 0 || z.sq > z.nq || z.sk > z.nk) return; /* refused: nothing to check */
      for (int t = 0; t < n_tensors(c); t++) {
        const tview *v = slot(c, t);
        const int qside = t == Q || t == DOUT;
        if (is_output(c, t) || t == O || !walkable(v) || v != &c->tv[t]) continue;
        if ((v->t.stride[1] == 0 && v->t.size[1] > 1) || (v->t.stride[2] == 0 && v->t.size[2] > 1))
          continue; /* a broadcast row is a used row too */
        for (int64_t g = (qside ? z.q0 + z.sq : z.k0 + z.sk); g < (qside ? z.q0 + z.nq : z.k0 + z.nk); g++)
          for (int64_t h = 0; g < v->t.size[1] && h < v->t.size[2]; h++)
            for (int64_t e = 0; e < v->t.size[3]; e++) {
              const int64_t at = ((unsigned char *)v->t.data - c->buf[v->buf].p) +
                                 (row_off(c, t, s, g, h) + e * v->t.stride[3]) * (int64_t)esize(v->t.dtype);
              store(c->buf[v->buf].p + at, v->t.dtype, NAN), c->used_nan = 1;
            }
      }
    }
}

/* The contract of issue 48's params, for a call whose tensors passed check_contract. */
static void check_features(fcase *c) {
  const flashc_params *p = &c->prm;
  const int varlen = p->cu_seqlens_q || p->cu_seqlens_k;
  const int64_t hq = c->arg[Q]->size[2];
  if (!(p->softcap >= 0.0f) || isinf(p->softcap)) note(c, EXPECT_INVALID, "softcap %g", (double)p->softcap);
  if (p->alibi_slopes) {
    const int64_t nb = varlen ? p->num_seqs : c->arg[Q]->size[0], st = p->alibi_stride_batch;
    if (c->alibi_mis) note(c, EXPECT_INVALID, "alibi_slopes misaligned");
    if (st < 0) note(c, EXPECT_INVALID, "alibi_stride_batch %lld < 0", (long long)st);
    if (st > 0 && st < hq) note(c, EXPECT_INVALID, "alibi_stride_batch %lld < heads_q", (long long)st);
    if (st > 0 && nb > 1 && (__int128)(nb - 1) * st + hq > INT64_MAX)
      note(c, EXPECT_INVALID, "alibi_stride_batch %lld overflows", (long long)st);
    else if (st >= ((int64_t)1 << 20) && nb > 1)
      fail(c, "the harness gave ALiBi slopes a stride it cannot back with memory");
  }
  if ((p->seqused_q || p->seqused_k) && !varlen) note(c, EXPECT_INVALID, "seqused without varlen");
  if ((p->seqused_q || p->seqused_k) && varlen && p->cu_seqlens_q && p->cu_seqlens_k && p->num_seqs >= 1)
    for (int w = 0; w < 2; w++)
      for (int64_t s = 0; (w ? p->seqused_k : p->seqused_q) && s < p->num_seqs; s++) {
        const int32_t *cu = w ? p->cu_seqlens_k : p->cu_seqlens_q, u = (w ? p->seqused_k : p->seqused_q)[s];
        if (u < 0 || u > cu[s + 1] - cu[s])
          note(c, EXPECT_INVALID, "seqused_%c[%lld] = %d", w ? 'k' : 'q', (long long)s, u);
      }
  const int has = c->mn[0] > 0 && c->mn[1] > 0 && c->mn[2] > 0 && c->mn[3] > 0;
  if (p->attn_mask) {
    if (p->attn_mask_is_bool != 0 && p->attn_mask_is_bool != 1)
      note(c, EXPECT_INVALID, "attn_mask_is_bool %d", p->attn_mask_is_bool);
    if (varlen) note(c, EXPECT_INVALID, "attn_mask with varlen");
    for (int d = 0; d < 4; d++)
      if (p->attn_mask_stride[d] < 0) note(c, EXPECT_INVALID, "attn_mask_stride[%d] < 0", d);
    if (c->mask_fake) note(c, has ? EXPECT_INVALID : EXPECT_ANY, "attn_mask's strides overflow");
    if (c->mask_mis) note(c, has ? EXPECT_INVALID : EXPECT_ANY, "attn_mask misaligned");
  }
  if (!c->backward || !p->dbias) return; /* the forward ignores dbias */
  if (!p->attn_mask)
    note(c, EXPECT_INVALID, "dbias without attn_mask");
  else if (p->attn_mask_is_bool)
    note(c, EXPECT_INVALID, "dbias with a boolean (or invalid) mask");
  int neg = 0;
  for (int d = 0; d < 4; d++)
    if (p->dbias_stride[d] < 0) neg = 1, note(c, EXPECT_INVALID, "dbias_stride[%d] < 0", d);
  if (neg || !has || c->expect == EXPECT_INVALID) return;
  /* Self-overlap, exactly: two elements that the strides do not sum together at one address. */
  int64_t last = 0;
  for (int d = 0; d < 4; d++) last += (c->mn[d] - 1) * p->dbias_stride[d];
  unsigned char *hit = calloc((size_t)last + 1, 1);
  if (!hit) abort();
  int self = 0;
  for (int64_t b = 0; b < (p->dbias_stride[0] ? c->mn[0] : 1); b++)
    for (int64_t h = 0; h < (p->dbias_stride[1] ? c->mn[1] : 1); h++)
      for (int64_t i = 0; i < (p->dbias_stride[2] ? c->mn[2] : 1); i++)
        for (int64_t j = 0; j < (p->dbias_stride[3] ? c->mn[3] : 1); j++) {
          const int64_t o =
              b * p->dbias_stride[0] + h * p->dbias_stride[1] + i * p->dbias_stride[2] + j * p->dbias_stride[3];
          self |= hit[o], hit[o] = 1;
        }
  free(hit);
  if (self) {
    note(c, EXPECT_INVALID, "dbias overlaps itself");
    return;
  }
  /* The library's test (the dims with a stride, sorted by it, nest) may refuse an interleaving it cannot decide. */
  int64_t reach = 0, prev = 0;
  for (int pass = 0; pass < 4; pass++) {
    int best = -1;
    for (int d = 0; d < 4; d++)
      if (p->dbias_stride[d] > prev && c->mn[d] > 1 && (best < 0 || p->dbias_stride[d] < p->dbias_stride[best]))
        best = d;
    if (best < 0) break;
    if (p->dbias_stride[best] <= reach) note(c, EXPECT_ANY, "dbias interleaved (not nested)");
    reach += (c->mn[best] - 1) * p->dbias_stride[best], prev = p->dbias_stride[best];
  }
}

/* Which slots cover each byte: the truth about aliasing, whatever the mutations did on the way. */
typedef struct {
  uint16_t *cov[NV];
  int t, self;
} cover_arg;

static void cover_one(const fcase *c, const tview *v, int64_t at, int64_t n, int64_t step, size_t es, void *varg) {
  cover_arg *a = varg;
  for (int64_t k = 0; k < n; k++, at += step) {
    uint16_t *cv = a->cov[v->buf] + at;
    if (cv[0] & (1u << a->t)) a->self = 1; /* two indices of one view, one address */
    for (size_t b = 0; b < es; b++) cv[b] |= (uint16_t)(1u << a->t);
  }
  (void)c;
}

/* The contract, judged from what the call receives: each tensor alone, then the shapes together. */
static void check_contract(fcase *c) {
  const int nt = n_tensors(c);
  for (int t = 0; t < nt; t++) {
    const tview *v = slot(c, t);
    if (!v) {
      note(c, EXPECT_INVALID, "%s is NULL", tnames[t]);
      continue;
    }
    const flashc_tensor *x = &v->t;
    const int has = elems(x) > 0;
    if (x->size[2] <= 0 || x->size[3] <= 0) note(c, EXPECT_INVALID, "%s has no heads or head_dim", tnames[t]);
    if (!flashc_dtype_name(x->dtype))
      note(c, EXPECT_INVALID, "%s.dtype %d is no dtype", tnames[t], (int)x->dtype);
    else if (x->dtype != c->dtype)
      note(c, EXPECT_INVALID, "%s.dtype differs", tnames[t]);
    for (int d = 0; d < 4; d++)
      if (x->stride[d] < 0) note(c, x->size[d] > 1 ? EXPECT_INVALID : EXPECT_ANY, "%s.stride[%d] < 0", tnames[t], d);
    if (x->stride[3] != 1 && x->size[3] > 1) note(c, EXPECT_INVALID, "%s.stride[3] is not 1", tnames[t]);
    if (v->fake) note(c, has ? EXPECT_INVALID : EXPECT_ANY, "%s's strides overflow", tnames[t]);
    if (v->misalign) note(c, has ? EXPECT_INVALID : EXPECT_ANY, "%s.data misaligned", tnames[t]);
    if (!x->data && has) note(c, EXPECT_INVALID, "%s.data NULL with elements", tnames[t]);
  }
  if (c->backward && !c->lse && lse_count(c) > 0) note(c, EXPECT_INVALID, "backward without lse");
  if (c->expect == EXPECT_INVALID) return;
  const flashc_tensor *q = c->arg[Q], *k = c->arg[K];
  for (int t = 1; t < nt; t++) { /* q-like tensors as q, the others as k; o, dout and dv take v's head dim */
    const flashc_tensor *x = c->arg[t], *like = (t == O || t == DOUT || t == DQ) ? q : k;
    for (int d = 0; d < 4; d++) {
      const int vdim = d == 3 && (t == V || t == O || t == DOUT || t == DV);
      if (t != V && x->size[d] != (vdim ? c->arg[V]->size[3] : like->size[d]))
        note(c, EXPECT_INVALID, "%s.size[%d] differs", tnames[t], d);
      if (t == V && !vdim && x->size[d] != like->size[d]) note(c, EXPECT_INVALID, "v.size[%d] differs", d);
    }
  }
  if (q->size[0] != k->size[0] || q->size[3] != k->size[3]) note(c, EXPECT_INVALID, "q and k differ in batch or d");
  if (k->size[2] > 0 && q->size[2] % k->size[2] != 0) note(c, EXPECT_INVALID, "heads_q not a multiple of heads_kv");
  const int64_t n = c->prm.num_seqs;
  if (c->varlen && n >= 1 && c->prm.cu_seqlens_q && c->prm.cu_seqlens_k &&
      (q->size[0] != 1 || q->size[1] != c->prm.cu_seqlens_q[n] || k->size[1] != c->prm.cu_seqlens_k[n]))
    note(c, EXPECT_INVALID, "varlen: batch is not 1 or cu_seqlens do not end at the rows");
  check_features(c);
}

static void analyse(fcase *c) {
  check_contract(c);
  cover_arg a = {{0}, 0, 0};
  for (int b = 0; b < NV; b++)
    if (c->buf[b].snap && !(a.cov[b] = calloc(c->buf[b].bytes + 1, sizeof(uint16_t)))) abort();
  const int nt = n_tensors(c);
  for (int t = 0; t < nt; t++) {
    const tview *v = slot(c, t);
    a.t = t, a.self = 0;
    for_each(c, v, cover_one, &a);
    if (a.self && is_output(c, t)) note(c, EXPECT_INVALID, "output %s overlaps itself", tnames[t]);
    if (!v || !is_output(c, t)) continue;
    for (int u = 0; u < nt; u++) /* the same struct, or the same data pointer with no element to share */
      if (u != t && c->arg[u] && (c->arg[u] == c->arg[t] || (v->t.data && c->arg[u]->data == v->t.data)))
        note(c, walkable(v) && walkable(slot(c, u)) ? EXPECT_INVALID : EXPECT_ANY, "output %s is %s %s", tnames[t],
             c->arg[u] == c->arg[t] ? "the struct of" : "at the data of", tnames[u]);
  }
  if (c->lse && lse_count(c) > 0) {
    uint16_t *cv = a.cov[c->tv[LSE].buf] + c->tv[LSE].pos;
    for (size_t k = 0; k < (size_t)lse_count(c) * 4; k++) cv[k] |= 1u << LSE;
    /* lse is a bare pointer: inside a tensor's span but on none of its elements may be judged either way. */
    const unsigned char *l0 = (const unsigned char *)c->lse, *l1 = l0 + (size_t)lse_count(c) * 4;
    for (int t = 0; t < nt; t++) {
      const tview *v = slot(c, t);
      if (!walkable(v) || (c->backward && !is_output(c, t))) continue;
      const unsigned char *t0 = (const unsigned char *)v->t.data + v->lo * (int64_t)esize(v->t.dtype);
      const unsigned char *t1 = (const unsigned char *)v->t.data + (v->hi + 1) * (int64_t)esize(v->t.dtype);
      if (l0 < t1 && t0 < l1) note(c, EXPECT_ANY, "lse within the span of %s", tnames[t]);
    }
  }
  for (int b = 0; b < NV; b++)
    for (size_t k = 0; a.cov[b] && k < c->buf[b].bytes; k++) {
      const unsigned m = a.cov[b][k];
      if (!(m & (m - 1))) continue; /* one owner or none */
      for (int t = 0; t <= LSE; t++) {
        if (!(m & (1u << t)) || !(m & ~(1u << t))) continue;
        const int out = t == LSE ? !c->backward : is_output(c, t);
        if (out)
          note(c, EXPECT_INVALID, "output %s shares bytes with another tensor", tnames[t]);
        else if (t == LSE && !(m & ((1u << DQ) | (1u << DK) | (1u << DV))))
          note(c, EXPECT_ANY, "lse (an input) shares bytes with an input");
      }
      if (c->expect == EXPECT_INVALID) break;
    }
  for (int b = 0; b < NV; b++) free(a.cov[b]);
  /* An output whose span meets another view's without a shared element: the overlap test is exact for views of
   * one shape and strides (packed QKV, dQKV), and may refuse other interleavings that it cannot decide. */
  for (int t = 0; t < nt && c->expect == EXPECT_OK; t++) {
    const tview *v = slot(c, t);
    if (!is_output(c, t) || !walkable(v)) continue;
    for (int u = 0; u < nt; u++) {
      const tview *w = slot(c, u);
      if (u == t || !walkable(w) || w->buf != v->buf) continue;
      const int64_t es = (int64_t)esize(v->t.dtype);
      const unsigned char *v0 = (unsigned char *)v->t.data + v->lo * es,
                          *v1 = (unsigned char *)v->t.data + (v->hi + 1) * es;
      const unsigned char *w0 = (unsigned char *)w->t.data + w->lo * es,
                          *w1 = (unsigned char *)w->t.data + (w->hi + 1) * es;
      if (v0 < w1 && w0 < v1 && memcmp(&v->t.size, &w->t.size, sizeof v->t.size) != 0)
        note(c, EXPECT_ANY, "%s interleaved with %s of another shape", tnames[t], tnames[u]);
      else if (v0 < w1 && w0 < v1 && memcmp(&v->t.stride, &w->t.stride, sizeof v->t.stride) != 0)
        note(c, EXPECT_ANY, "%s interleaved with %s of other strides", tnames[t], tnames[u]);
    }
  }
}

/* Bytes an output may write: its view's elements (and lse in forward). */
static void out_one(const fcase *c, const tview *v, int64_t at, int64_t n, int64_t step, size_t es, void *arg) {
  (void)arg;
  for (int64_t k = 0; k < n; k++, at += step) memset(c->buf[v->buf].out + at, 0xFF, es);
}
static void mark_outputs(fcase *c) {
  for (int t = 0; t < n_tensors(c); t++)
    if (is_output(c, t)) for_each(c, slot(c, t), out_one, NULL);
  if (c->lse && !c->backward) memset(c->buf[c->tv[LSE].buf].out + c->tv[LSE].pos, 0xFF, (size_t)lse_count(c) * 4);
  const int64_t *st = c->prm.dbias_stride;
  if (c->backward && has_dbias(c) && st[0] >= 0 && st[1] >= 0 && st[2] >= 0 && st[3] >= 0 && !c->mask_fake)
    for_each_mask(c, st, mark_dbias_one, c);
}

static void free_case(fcase *c) {
  for (int b = 0; b < NB; b++) free(c->buf[b].p), free(c->buf[b].snap), free(c->buf[b].ref), free(c->buf[b].out);
  free(c->cu_q_arr), free(c->cu_k_arr), free(c->used_arr[0]), free(c->used_arr[1]);
}

/* ---- running a backend ------------------------------------------------------------------------------------- */
static flashc_status call(fcase *c, const char *backend, int threads, int backward) {
  flashc_handle h;
  if (flashc_create(&h, backend) != FLASHC_OK) fail(c, "flashc_create(%s): %s", backend, flashc_last_error());
  if (flashc_set_threads(h, threads) != FLASHC_OK) fail(c, "flashc_set_threads: %s", flashc_last_error());
  flashc_tensor *const *a = (flashc_tensor *const *)c->arg;
  flashc_status s = backward ? flashc_backward(h, &c->prm, a[Q], a[K], a[V], a[O], c->lse, a[DOUT], a[DQ], a[DK], a[DV])
                             : flashc_forward(h, &c->prm, a[Q], a[K], a[V], a[O], c->lse);
  const char *op = backward ? "flashc_backward" : "flashc_forward";
  if (s != FLASHC_OK && strncmp(flashc_last_error(), op, strlen(op)) != 0)
    fail(c, "%s on %s: status %s with message '%s', which does not name the operation", op, backend,
         flashc_status_string(s), flashc_last_error());
  if (s == FLASHC_OK && strcmp(flashc_handle_last_backend(h), backend) != 0)
    fail(c, "%s ran on '%s', not %s", op, flashc_handle_last_backend(h), backend);
  flashc_destroy(h);
  return s;
}

static void snapshot(fcase *c, int to_ref) {
  for (int b = 0; b < NB; b++)
    if (c->buf[b].bytes) memcpy(to_ref ? c->buf[b].ref : c->buf[b].snap, c->buf[b].p, c->buf[b].bytes);
}
static void restore(fcase *c) {
  for (int b = 0; b < NB; b++)
    if (c->buf[b].bytes) memcpy(c->buf[b].p, c->buf[b].snap, c->buf[b].bytes);
}

typedef struct {
  const char *backend;
  int t;
} unwritten_arg;
static void unwritten_one(const fcase *c, const tview *v, int64_t at, int64_t n, int64_t step, size_t es, void *varg) {
  const unwritten_arg *a = varg;
  for (int64_t k = 0; k < n; k++, at += step)
    if (is_poison(c->buf[v->buf].p + at, es))
      fail(c, "%s returned OK but left %s's element at byte %lld of buffer %d unwritten", a->backend, tnames[a->t],
           (long long)at, v->buf);
}

static void unwritten_dbias_one(fcase *c, int64_t off, int64_t b, int64_t h, int64_t i, int64_t j, void *arg) {
  if (is_poison(c->buf[DBIAS_B].p + off * (int64_t)esize(c->dtype), esize(c->dtype)))
    fail(c, "%s returned OK but left dbias[%lld, %lld, %lld, %lld] unwritten", (const char *)arg, (long long)b,
         (long long)h, (long long)i, (long long)j);
}

/* After a call: a failure wrote nothing; a success wrote every output element and nothing else. */
static void check_writes(fcase *c, const char *backend, flashc_status s) {
  for (int b = 0; b < NB; b++) {
    const buffer *B = &c->buf[b];
    if (B->bytes == 0 || memcmp(B->p, B->snap, B->bytes) == 0) continue;
    for (size_t i = 0; i < B->bytes; i += 8) { /* 8 bytes at a time: (p ^ snap) & ~out */
      uint64_t p = 0, q = 0, o = 0;
      const size_t n = B->bytes - i < 8 ? B->bytes - i : 8;
      memcpy(&p, B->p + i, n), memcpy(&q, B->snap + i, n), memcpy(&o, B->out + i, n);
      if (s == FLASHC_OK) p &= ~o, q &= ~o;
      if (p == q) continue;
      if (s != FLASHC_OK)
        fail(c, "%s failed (%s: %s) but changed bytes %zu..%zu of buffer %d", backend, flashc_status_string(s),
             flashc_last_error(), i, i + 7, b);
      fail(c, "%s wrote bytes %zu..%zu of buffer %d, outside its outputs", backend, i, i + 7, b);
    }
  }
  if (s != FLASHC_OK) return;
  for (int t = 0; t < n_tensors(c); t++) {
    unwritten_arg a = {backend, t};
    if (is_output(c, t)) for_each(c, slot(c, t), unwritten_one, &a);
  }
  for (int i = 0; c->lse && !c->backward && i < lse_count(c); i++)
    if (is_poison((const unsigned char *)(c->lse + i), 4))
      fail(c, "%s returned OK but left lse[%d] unwritten", backend, i);
  if (c->backward && has_dbias(c)) for_each_mask(c, c->prm.dbias_stride, unwritten_dbias_one, (void *)backend);
}

/* ---- the bound on cpu's error --------------------------------------------------------------------------------- */
static const double U = 0x1p-24;        /* fp32's unit roundoff */
static const double P_FLUSH = 0x1p-125; /* cpu sets softmax weights below this to 0 (kernels_simd.h, exp2_v) */

static double elem(const fcase *c, const unsigned char *const *bufs, int t, int64_t off) {
  const tview *v = slot(c, t);
  int64_t at = ((unsigned char *)v->t.data - c->buf[v->buf].p) + off * (int64_t)esize(v->t.dtype);
  return load(bufs[v->buf] + at, v->t.dtype);
}
static int lse_index(const fcase *c, int64_t s, int64_t g, int64_t h) {
  return (int)(c->varlen ? h * c->sq + g : (s * c->hq + h) * c->sq + (g - s * c->sq));
}

typedef struct {
  double *o, *lse, *dq, *dk, *dv; /* per row: an absolute bound (NaN/inf: no bound) */
  double *db;                     /* per element of dbias's memory (NULL: no dbias) */
} bounds;

/* The attn_mask element (b, h, i, j) from the snapshot: a bias (0 for none), −inf where it removes the key. */
static double mask_at(const fcase *c, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!c->prm.attn_mask) return 0.0;
  const int64_t *st = c->prm.attn_mask_stride, off = b * st[0] + h * st[1] + i * st[2] + j * st[3];
  const unsigned char *p = c->buf[MASK_B].snap + c->mask_mis;
  if (c->prm.attn_mask_is_bool) return p[off] ? 0.0 : -INFINITY;
  return load(p + off * (int64_t)esize(c->dtype), c->dtype);
}

static int visible(const fcase *c, int64_t shift, int64_t i, int64_t j) {
  int64_t wl = c->prm.window_left < 0 ? -1 : c->prm.window_left,
          wr = c->prm.window_right < 0 ? -1 : c->prm.window_right;
  if (wl > ((int64_t)1 << 40)) wl = (int64_t)1 << 40;
  if (wr > ((int64_t)1 << 40)) wr = (int64_t)1 << 40;
  if (c->prm.causal) wr = 0;
  int64_t dg = i + shift;
  return (wl < 0 || j >= dg - wl) && (wr < 0 || j <= dg + wr);
}

/* Per row, from the inputs (fp64): the scores' rounding in fp32, e_ij ≤ γ_d·|scale|·Σ|q||k|, changes P_ij by
 * a factor e^{±e_ij}; so |Δo_i| ≤ 2 max_j e_ij · max|v| plus the rounding of the sums (γ_n). The backward
 * bounds follow dS_ij = P_ij (dP_ij − D_i) through dq = scale·dS·K, dk = scale·dSᵀ·Q, dv = Pᵀ·dO. Loose by
 * a factor 8, but scale-free: they grow with the data's conditioning, not its size. */
static void compute_bounds(const fcase *c, bounds *bd, double rel_out) {
  const unsigned char *snap[NB];
  for (int b = 0; b < NB; b++) snap[b] = c->buf[b].snap;
  const int64_t d = c->d, dvv = c->dv, group = c->hq / c->hkv, nseq = c->varlen ? c->prm.num_seqs : c->batch;
  const double scale = c->prm.scale != 0.0f ? c->prm.scale : (float)(1.0 / sqrt((double)d)), as = fabs(scale);
  const double cap = c->prm.softcap;
  const int64_t dmax = d > dvv ? d : dvv;
  double *qi = malloc(sizeof(double) * (size_t)(3 * dmax)), *doi = qi + dmax, *oi = doi + dmax;
  double *S = malloc(sizeof(double) * (size_t)(c->sk + 1)), *A = malloc(sizeof(double) * (size_t)(c->sk + 1));
  double *TF = malloc(sizeof(double) * (size_t)(c->sk + 1)); /* softcap: the error of tanh's derivative */
  double *Kd = malloc(sizeof(double) * (size_t)(c->sk * d + 1)),
         *Vd = malloc(sizeof(double) * (size_t)(c->sk * dvv + 1));
  if (!qi || !S || !A || !Kd || !Vd || !TF) abort();
  /* dbias sums dS over the dims of stride 0: the terms one element gathers */
  int64_t nsum = 1;
  for (int a = 0; a < 4; a++)
    if (c->prm.dbias_stride[a] == 0) nsum *= c->mn[a] > 0 ? c->mn[a] : 1;
  for (int64_t s = 0; s < nseq; s++) {
    seqinfo z = seq_of(c, s);
    const int64_t shift = c->prm.align == FLASHC_ALIGN_BOTTOM_RIGHT ? z.sk - z.sq : 0;
    const double gd = (double)(d + 8) * U, gn = (double)(z.sk + 8) * U, gm = (double)(z.sq * group + 8) * U;
    for (int64_t h = 0; h < c->hq; h++) {
      const int64_t hk = h / group;
      const double slope = c->prm.alibi_slopes ? (double)c->prm.alibi_slopes[s * c->prm.alibi_stride_batch + h] : 0.0;
      if (h % group == 0) /* this kv head's keys and values, once */
        for (int64_t j = 0; j < z.sk; j++) {
          for (int64_t e = 0; e < d; e++) Kd[j * d + e] = elem(c, snap, K, row_off(c, K, s, z.k0 + j, hk) + e);
          for (int64_t e = 0; e < dvv; e++) Vd[j * dvv + e] = elem(c, snap, V, row_off(c, V, s, z.k0 + j, hk) + e);
        }
      for (int64_t i = 0; i < z.sq; i++) {
        const int64_t g = z.q0 + i, row = h * (c->varlen ? c->sq : c->batch * c->sq) + g;
        for (int64_t e = 0; e < d; e++) qi[e] = elem(c, snap, Q, row_off(c, Q, s, g, h) + e);
        for (int64_t e = 0; c->backward && e < dvv; e++) {
          doi[e] = elem(c, snap, DOUT, row_off(c, DOUT, s, g, h) + e);
          oi[e] = elem(c, snap, O, row_off(c, O, s, g, h) + e);
        }
        double m = -INFINITY, eps = 0.0, vmax = 0.0, kmax = 0.0, bmax = 0.0, cmag = 0.0, qmax = 0.0, domax = 0.0;
        int64_t n = 0;
        for (int64_t e = 0; e < d; e++) qmax = fmax(qmax, fabs(qi[e]));
        for (int64_t e = 0; c->backward && e < dvv; e++)
          cmag += fabs(doi[e] * oi[e]), domax = fmax(domax, fabs(doi[e]));
        for (int64_t j = 0; j < z.sk; j++) {
          S[j] = -INFINITY;
          const double bias = mask_at(c, s, h, i, j);
          if (!visible(c, shift, i, j) || bias == -INFINITY) continue;
          double dot = 0.0, mag = 0.0, dv = 0.0;
          const double *kj = Kd + j * d;
          for (int64_t e = 0; e < d; e++) {
            dot += qi[e] * kj[e], mag += fabs(qi[e] * kj[e]);
            kmax = fmax(kmax, fabs(kj[e]));
          }
          for (int64_t e = 0; e < dvv; e++) {
            const double ve = Vd[j * dvv + e];
            vmax = fmax(vmax, fabs(ve));
            if (c->backward) dv += fabs(doi[e] * ve);
          }
          /* the modifiers, in the header's order; each adds its own fp32 rounding (tanh's derivative is ≤ 1: the
           * score's error does not grow through softcap) */
          double sc = scale * dot, extra = 0.0;
          TF[j] = 0.0;
          if (cap > 0.0) {
            /* The backward's factor 1 − tanh²(x), x = s/cap, from an x off by dx: within [0, its value at |x| − dx],
             * and within 2·dx (the derivative's slope is under 0.77). Ill-conditioned where the cap is tiny. */
            const double x = sc / cap, dx = gd * as * mag / cap + 4.0 * U * (fabs(x) + 1.0);
            const double t = tanh(fmax(0.0, fabs(x) - dx));
            TF[j] = fmin(1.0 - t * t, 2.0 * dx + 8.0 * U);
            sc = cap * tanh(x), extra += 4.0 * U * cap;
          }
          const double al = slope * fabs((double)(i + z.sk - z.sq - j));
          sc = sc - al + bias, extra += 4.0 * U * (fabs(al) + fabs(bias) + fabs(sc));
          S[j] = sc, A[j] = as * mag;
          m = fmax(m, S[j]), eps = fmax(eps, gd * A[j] + extra), bmax = fmax(bmax, dv);
          n++;
        }
        double l = 0.0;
        for (int64_t j = 0; m > -INFINITY && j < z.sk; j++)
          if (S[j] != -INFINITY) l += exp(S[j] - m);
        const double lse = n ? m + log(l) : -INFINITY;
        eps += 4.0 * U * fabs(lse) + (double)(n + 8) * U; /* lse and the base-2 exponent in fp32 */
        if (!c->backward) {
          bd->o[row] = 8.0 * (2.0 * eps + gn + (double)n * P_FLUSH) * vmax;
          bd->lse[row] = 8.0 * (eps + gn + 4.0 * U * fabs(lse));
          continue;
        }
        const double bc = bmax + cmag, F = eps * bc + gd * bc + rel_out * cmag, G = F + 2.0 * gn * bc;
        const double grow = exp(fmin(2.0 * eps, 700.0)); /* cpu's P may exceed the exact one by e^{2·eps} */
        /* A weight cpu flushed to 0 loses its whole term, not a relative part of it. */
        bd->dq[row] = 8.0 * as * kmax * (G * grow + (double)n * P_FLUSH * bc);
        for (int64_t j = 0; n && j < z.sk; j++) {
          if (S[j] == -INFINITY) continue;
          const double P = exp(S[j] - lse) * grow;
          bd->dq[row] += 8.0 * as * kmax * P * bc * TF[j];
          bd->dk[hk * (c->varlen ? c->sk : c->batch * c->sk) + z.k0 + j] += 8.0 * as * qmax * P * bc * TF[j];
          const int64_t krow = hk * (c->varlen ? c->sk : c->batch * c->sk) + z.k0 + j;
          const double ds = P * (G + gm * bc) + P_FLUSH * bc; /* dS_ij's error, before the factor 8 */
          bd->dk[krow] += 8.0 * as * ds * qmax;
          bd->dv[krow] += 8.0 * (P * (eps + gn + gm) + P_FLUSH) * domax;
          if (bd->db) { /* dbias: dS_ij, summed in fp32 over nsum terms */
            const int64_t *st = c->prm.dbias_stride;
            bd->db[s * st[0] + h * st[1] + i * st[2] + j * st[3]] += 8.0 * (ds + (double)(nsum + 8) * U * P * bc);
          }
        }
      }
    }
  }
  free(qi), free(S), free(A), free(Kd), free(Vd), free(TF);
}

/* ---- comparison ------------------------------------------------------------------------------------------------ */
static void compare_value(const fcase *c, const char *what, int64_t at, double r, double x, double tol) {
  if (isnan(r) || isnan(x)) {
    if (isnan(r) && isnan(x)) return;
    fail(c, "%s[%lld]: cpu %.9g, cpu-ref %.9g (NaN must meet NaN)", what, (long long)at, x, r);
  }
  if (r == x) return;
  if ((isnan(tol) || isinf(tol)) && isinf(r) == isinf(x)) return; /* no bound: only the kind of value is compared */
  if (!isnan(tol) && !isinf(r) && !isinf(x) && fabs(r - x) <= tol) return;
  if (isinf(r) != isinf(x)) { /* one overflowed: fine where the bound (inf too) reaches past the largest finite value */
    const flashc_dtype t = strcmp(what, "lse") == 0 ? FLASHC_F32 : c->dtype;
    const double big = t == FLASHC_F16 ? 65504.0 : t == FLASHC_BF16 ? 0x1.FEp127 : t == FLASHC_F32 ? FLT_MAX : DBL_MAX;
    /* on the infinite one's side: the finite one ± the bound, as far as the largest finite value (an unbounded
     * error has either sign: fp32 scores of 5e8 are 32 apart from one rounding, and e^32 times dout overflows) */
    const double fin = isinf(r) ? x : r, inf = isinf(r) ? r : x;
    if (inf > 0.0 ? fin + tol >= big : fin - tol <= -big) return;
  }
  fail(c, "%s[%lld]: cpu %.9g, cpu-ref %.9g, |difference| %.3g > bound %.3g", what, (long long)at, x, r, fabs(r - x),
       tol);
}

static void compare(fcase *c) {
  const flashc_dtype dt = c->dtype;
  /* cpu rounds its fp32 result to the dtype, cpu-ref its fp64 one: one ulp apart near a tie. */
  const double rel_out = dt == FLASHC_F16 ? 0x1p-10 : dt == FLASHC_BF16 ? 0x1p-7 : 2.0 * U;
  const double floor_out = dt == FLASHC_F16 ? 0x1p-24 : dt == FLASHC_BF16 ? 0x1p-133 : 0x1p-148;
  const int64_t nq = c->hq * c->sq * (c->varlen ? 1 : c->batch), nk = c->hkv * c->sk * (c->varlen ? 1 : c->batch);
  bounds bd;
  bd.o = calloc((size_t)nq + 1, sizeof(double)), bd.lse = calloc((size_t)nq + 1, sizeof(double));
  bd.dq = calloc((size_t)nq + 1, sizeof(double)), bd.dk = calloc((size_t)nk + 1, sizeof(double));
  bd.dv = calloc((size_t)nk + 1, sizeof(double));
  if (!bd.o || !bd.lse || !bd.dq || !bd.dk || !bd.dv) abort();
  const size_t es = esize(dt), db_elems = c->buf[DBIAS_B].bytes / es;
  bd.db = c->backward && has_dbias(c) ? calloc(db_elems + 1, sizeof(double)) : NULL;
  if (c->backward && has_dbias(c) && !bd.db) abort();
  compute_bounds(c, &bd, rel_out);

  const unsigned char *cur[NB], *ref[NB];
  for (int b = 0; b < NB; b++) cur[b] = c->buf[b].p, ref[b] = c->buf[b].ref;
  const int64_t nseq = c->varlen ? c->prm.num_seqs : c->batch;
  for (int64_t s = 0; s < nseq; s++) {
    seqinfo z = seq_of(c, s);
    for (int w = 0; w < 2; w++) { /* query rows, then key rows */
      const int64_t heads = w ? c->hkv : c->hq, rows = w ? z.nk : z.nq, r0 = w ? z.k0 : z.q0;
      for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < rows; i++) {
          const int64_t g = r0 + i, row = h * (w ? nk / c->hkv : nq / c->hq) + g;
          const int outs[2][2] = {{c->backward ? DQ : O, -1}, {c->backward ? DK : -1, c->backward ? DV : -1}};
          for (int a = 0; a < 2; a++) {
            const int t = outs[w][a];
            if (t < 0) continue;
            const double rb = t == O ? bd.o[row] : t == DQ ? bd.dq[row] : t == DK ? bd.dk[row] : bd.dv[row];
            for (int64_t e = 0; e < (t == O || t == DV ? c->dv : c->d); e++) {
              const int64_t off = row_off(c, t, s, g, h) + e;
              const double r = elem(c, ref, t, off), x = elem(c, cur, t, off);
              if (c->used_nan && (isnan(r) || isnan(x)))
                fail(c, "%s[%lld] is NaN: a row past seqused (NaN there) was read", tnames[t], (long long)off);
              compare_value(c, tnames[t], off, r, x, rb + rel_out * fabs(r) + floor_out);
            }
          }
          if (w == 0 && !c->backward && c->lse) {
            const int li = lse_index(c, s, g, h);
            const size_t at = c->tv[LSE].pos + (size_t)li * 4;
            compare_value(c, "lse", li, load(ref[c->tv[LSE].buf] + at, FLASHC_F32),
                          load(cur[c->tv[LSE].buf] + at, FLASHC_F32), bd.lse[row]);
          }
        }
    }
  }
  if (bd.db) { /* dbias, element by element of its memory (a summed element once per term: the same value) */
    const int64_t *st = c->prm.dbias_stride;
    for (int64_t b = 0; b < c->mn[0]; b++)
      for (int64_t h = 0; h < c->mn[1]; h++)
        for (int64_t i = 0; i < c->mn[2]; i++)
          for (int64_t j = 0; j < c->mn[3]; j++) {
            const int64_t off = b * st[0] + h * st[1] + i * st[2] + j * st[3];
            const double r = load(ref[DBIAS_B] + off * (int64_t)es, dt), x = load(cur[DBIAS_B] + off * (int64_t)es, dt);
            compare_value(c, "dbias", off, r, x, bd.db[off] + rel_out * fabs(r) + floor_out);
          }
  }
  free(bd.o), free(bd.lse), free(bd.dq), free(bd.dk), free(bd.dv), free(bd.db);
}

/* ---- one input ------------------------------------------------------------------------------------------------- */
static int backend_lacks(const char *name, const fcase *c) {
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || strcmp(info.name, name) != 0) continue;
    /* V's rows: cpu and cpu-ref pad them to 512 elements (flashc_backend_info does not list that limit) */
    return !(info.dtypes & (1u << c->dtype)) || c->d < info.min_head_dim || c->d > info.max_head_dim || c->dv > 512 ||
           (c->backward && !info.has_backward);
  }
  return 1;
}

static void check_status(const fcase *c, const char *backend, flashc_status s) {
  const flashc_status want = c->expect == EXPECT_INVALID ? FLASHC_ERR_INVALID_ARGUMENT
                             : backend_lacks(backend, c) ? FLASHC_ERR_UNSUPPORTED
                                                         : FLASHC_OK;
  if (c->expect == EXPECT_ANY && (s == FLASHC_OK || s == FLASHC_ERR_INVALID_ARGUMENT || s == want)) return;
  if (s != want)
    fail(c, "%s returned %s (%s); expected %s", backend, flashc_status_string(s), s ? flashc_last_error() : "",
         flashc_status_string(want));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size, 0};
  fcase *c = calloc(1, sizeof *c);
  if (!c) abort();
  /* Twice: the features' bytes come last, but V's head dim among them shapes the tensors that decode lays out
   * (the first pass only finds it; no read depends on it). */
  uint64_t seed = 0;
  int mode = 0;
  for (int pass = 0; pass < 2; pass++) {
    const unsigned feat = c->feat, hdv = c->hdv_byte;
    memset(c, 0, sizeof *c);
    c->feat = feat, c->hdv_byte = hdv;
    for (int i = 0; i < NV; i++) c->tv[i].buf = -1;
    r.i = 0;
    decode(&r, c);
    const int nmut = (int)(rd(&r) % 8);
    for (int m = 0; m < (nmut > 4 ? nmut - 4 : 0); m++) mutate(&r, c); /* none in half the inputs */
    seed = 0;
    for (int i = 0; i < 8; i++) seed = seed << 8 | rd(&r);
    mode = (int)(rd(&r) % 4);
    c->feat_at = r.i;
    decode_features(&r, c);
  }
  place(c, seed, mode);
  place_features(c, seed, mode);
  analyse(c);

  /* Backward needs the forward's o and lse: cpu-ref computes them in place, as a caller would. */
  int numeric = 1;
  if (c->backward) {
    flashc_handle h;
    if (flashc_create(&h, "cpu-ref") != FLASHC_OK) abort();
    flashc_tensor *o = (flashc_tensor *)c->arg[O];
    if (!c->lse || !o || flashc_forward(h, &c->prm, c->arg[Q], c->arg[K], c->arg[V], o, c->lse) != FLASHC_OK)
      numeric = 0; /* o and lse keep their random data; only the statuses are compared */
    flashc_destroy(h);
  }
  snapshot(c, 0);
  mark_outputs(c);

  const flashc_status s_ref = call(c, "cpu-ref", c->threads, c->backward);
  check_status(c, "cpu-ref", s_ref);
  check_writes(c, "cpu-ref", s_ref);
  snapshot(c, 1);
  restore(c);
  const flashc_status s_cpu = call(c, "cpu", c->threads, c->backward);
  check_status(c, "cpu", s_cpu);
  check_writes(c, "cpu", s_cpu);
  if (s_ref != s_cpu && !(s_ref == FLASHC_OK && s_cpu == FLASHC_ERR_UNSUPPORTED && backend_lacks("cpu", c)))
    fail(c, "cpu-ref returned %s, cpu %s (%s)", flashc_status_string(s_ref), flashc_status_string(s_cpu),
         flashc_last_error());
  static int verbose = -1; /* FLASHC_FUZZ_VERBOSE=1: print each case and what the backends returned */
  if (verbose < 0) verbose = getenv("FLASHC_FUZZ_VERBOSE") != NULL;
  if (verbose) {
    print_case(c);
    fprintf(stderr, "  cpu-ref: %s, cpu: %s (%s)%s\n", flashc_status_string(s_ref), flashc_status_string(s_cpu),
            flashc_last_error(), numeric ? "" : ", not compared: the forward for o and lse failed");
  }
  if (s_ref == FLASHC_OK && s_cpu == FLASHC_OK && numeric) compare(c);

  if (s_cpu == FLASHC_OK && c->threads2) { /* bit-identical at another thread count */
    for (int b = 0; b < NB; b++)
      if (c->buf[b].p) memcpy(c->buf[b].ref, c->buf[b].p, c->buf[b].bytes);
    restore(c);
    if (call(c, "cpu", c->threads2, c->backward) != FLASHC_OK) fail(c, "cpu failed at %d threads", c->threads2);
    for (int b = 0; b < NB; b++)
      if (c->buf[b].p && memcmp(c->buf[b].ref, c->buf[b].p, c->buf[b].bytes) != 0)
        fail(c, "cpu at %d threads differs from cpu at %d threads (buffer %d)", c->threads2, c->threads, b);
  }
  free_case(c);
  free(c);
  return 0;
}
