/*
 * test_empty.c — empty inputs are valid calls with known results, on every usable backend (flashc.h, "Empty
 * inputs"): batch 0, seqlen_q 0, seqlen_k 0, and packed (varlen) batches whose every sequence is empty on one
 * side.
 *   no query row        : forward writes nothing; backward dk = dv = 0 (no query gives them a gradient)
 *   no key row          : forward o = 0 and lse = −inf on every row; backward dq = 0
 * A view with no element is passed with NULL data. The outputs that have elements are strided (padding between
 * rows, heads and batches) and poisoned first: after the call every element of the view must be +0 (bits 0) or
 * −inf exactly, and every byte outside it still poison. An lse of no element is given a poisoned buffer anyway,
 * which must stay untouched. CUDA backends get device memory (skipped with "no CUDA device" where there is none).
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- buffers on the host or the device ---------------------------------------------------------------- */
typedef struct buf {
  flashc_tensor view; /* data: in `mem` (host or device), NULL when the view has no element */
  void *mem;          /* the allocation the view lies in, poisoned outside the view */
  size_t bytes;
  bool device;
} buf;

static bool cuda_ok(int ok, const char *what) { return th_check(ok, "test harness: %s failed", what); }

static void *mem_alloc(size_t bytes, bool device) {
#ifdef FLASHC_TEST_CUDA
  if (device) {
    void *p = NULL;
    if (!cuda_ok(cudaMalloc(&p, bytes) == cudaSuccess, "cudaMalloc")) return NULL;
    return p;
  }
#endif
  (void)device;
  void *p = malloc(bytes);
  if (!p) abort();
  return p;
}

static void mem_free(void *p, bool device) {
#ifdef FLASHC_TEST_CUDA
  if (device) {
    if (p) cudaFree(p);
    return;
  }
#endif
  (void)device;
  free(p);
}

static void mem_poison(void *p, size_t bytes, bool device) {
#ifdef FLASHC_TEST_CUDA
  if (device) {
    cuda_ok(cudaMemset(p, TH_POISON_BYTE, bytes) == cudaSuccess, "cudaMemset");
    return;
  }
#endif
  (void)device;
  memset(p, TH_POISON_BYTE, bytes);
}

/* The allocation's bytes on the host (malloc; the caller frees). */
static uint8_t *mem_read(const void *p, size_t bytes, bool device) {
  uint8_t *h = malloc(bytes ? bytes : 1);
  if (!h) abort();
#ifdef FLASHC_TEST_CUDA
  if (device) {
    cuda_ok(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize after the call");
    cuda_ok(cudaMemcpy(h, p, bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "cudaMemcpy to host");
    return h;
  }
#endif
  (void)device;
  memcpy(h, p, bytes);
  return h;
}

/* A [b, s, h, d] view with padding at every level (odd counts, so no stride is a product of sizes) and 5
 * elements before the data. No element: NULL data, no allocation. Every byte poisoned (the inputs too: an empty
 * call reads none of them). */
static buf buf_new(flashc_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, bool device) {
  buf x;
  memset(&x, 0, sizeof x);
  x.device = device;
  int64_t st2 = d + 3, st1 = h * st2 + 1, st0 = s * st1 + 7;
  x.view = (flashc_tensor){NULL, dt, {b, s, h, d}, {st0, st1, st2, 1}};
  if (b * s * h * d == 0) return x;
  size_t es = flashc_dtype_size(dt);
  x.bytes = (size_t)(5 + b * st0 + 9) * es;
  x.mem = mem_alloc(x.bytes, device);
  if (!x.mem) return x;
  mem_poison(x.mem, x.bytes, device);
  x.view.data = (char *)x.mem + 5 * es;
  return x;
}

static void buf_free(buf *x) {
  mem_free(x->mem, x->device);
  memset(x, 0, sizeof *x);
}

/* Every element of the view +0 (all bits 0) and every other byte poison. */
static bool expect_zero(const char *who, const char *name, const buf *x) {
  if (!x->mem) return true;
  uint8_t *h = mem_read(x->mem, x->bytes, x->device);
  size_t es = flashc_dtype_size(x->view.dtype), off = (size_t)((char *)x->view.data - (char *)x->mem);
  uint8_t *in_view = calloc(x->bytes, 1);
  if (!in_view) abort();
  const flashc_tensor *t = &x->view;
  int64_t bad_zero = 0, bad_pad = 0;
  for (int64_t b = 0; b < t->size[0]; b++)
    for (int64_t s = 0; s < t->size[1]; s++)
      for (int64_t hh = 0; hh < t->size[2]; hh++)
        for (int64_t d = 0; d < t->size[3]; d++) {
          size_t e = off + (size_t)th_index(t, b, s, hh, d) * es;
          for (size_t i = 0; i < es; i++) {
            in_view[e + i] = 1;
            bad_zero += h[e + i] != 0;
          }
        }
  for (size_t i = 0; i < x->bytes; i++) bad_pad += !in_view[i] && h[i] != TH_POISON_BYTE;
  free(in_view);
  free(h);
  /* both checks report, whatever the first found */
  const bool zero_ok = th_check(bad_zero == 0, "%s: %s: %lld bytes of the view are not 0 (it must be +0 exactly)", who,
                                name, (long long)bad_zero);
  const bool pad_ok =
      th_check(bad_pad == 0, "%s: %s: %lld bytes outside the view were written", who, name, (long long)bad_pad);
  return zero_ok && pad_ok;
}

/* lse: n floats of −inf exactly (n = 0: the buffer is still poison). */
static bool expect_lse(const char *who, const void *lse, size_t cap, int64_t n, bool device) {
  uint8_t *h = mem_read(lse, cap * sizeof(float), device);
  int64_t bad = 0, touched = 0;
  for (size_t i = 0; i < cap; i++) {
    uint32_t bits;
    memcpy(&bits, h + i * 4, 4);
    if ((int64_t)i < n)
      bad += bits != th_f32_bits(-INFINITY);
    else
      touched += bits != 0xFFFFFFFFu;
  }
  free(h);
  const bool inf_ok =
      th_check(bad == 0, "%s: lse: %lld of %lld values are not -inf", who, (long long)bad, (long long)n);
  const bool rest_ok =
      th_check(touched == 0, "%s: lse: %lld floats past its %lld were written", who, (long long)touched, (long long)n);
  return inf_ok && rest_ok;
}

/* ---- the cases --------------------------------------------------------------------------------------- */
typedef struct ecase {
  const char *name;
  int64_t batch, sq, sk; /* tensor sizes; varlen: batch 1 and the totals */
  int causal;
  const int32_t *cu_q, *cu_k; /* varlen offsets, or NULL */
  int64_t num_seqs;
} ecase;

static const int32_t cu_none[] = {0, 0, 0}, cu_q5[] = {0, 2, 5}, cu_k6[] = {0, 6, 6};
static const ecase cases[] = {
    {"batch 0", 0, 7, 9, 0, NULL, NULL, 0},
    {"seqlen_q 0", 2, 0, 9, 0, NULL, NULL, 0},
    {"seqlen_k 0", 2, 7, 0, 0, NULL, NULL, 0},
    {"seqlen_k 0 causal", 3, 5, 0, 1, NULL, NULL, 0},
    {"seqlen_q 0 and seqlen_k 0", 2, 0, 0, 0, NULL, NULL, 0},
    {"varlen: every q sequence empty", 1, 0, 6, 0, cu_none, cu_k6, 2},
    {"varlen: every k sequence empty", 1, 5, 0, 1, cu_q5, cu_none, 2},
};

enum { HQ = 4, HKV = 2, LSE_CAP = 64 };

static void run_case(const flashc_backend_info *info, flashc_handle h, const ecase *c, flashc_dtype dt, int64_t d) {
  const bool dev = info->device == FLASHC_DEVICE_CUDA, varlen = c->cu_q != NULL;
  char who[160];
  snprintf(who, sizeof who, "%s %s %s d%lld", info->name, flashc_dtype_name(dt), c->name, (long long)d);
  flashc_params p = flashc_params_default();
  p.causal = c->causal;
  if (varlen) p.cu_seqlens_q = c->cu_q, p.cu_seqlens_k = c->cu_k, p.num_seqs = c->num_seqs;
  buf q = buf_new(dt, c->batch, c->sq, HQ, d, dev), k = buf_new(dt, c->batch, c->sk, HKV, d, dev);
  buf v = buf_new(dt, c->batch, c->sk, HKV, d, dev), o = buf_new(dt, c->batch, c->sq, HQ, d, dev);
  const int64_t total_q = c->batch * c->sq, n_lse = total_q * HQ, total_k = c->batch * c->sk;
  float *lse = mem_alloc(LSE_CAP * sizeof(float), dev);
  if (!lse || n_lse > LSE_CAP) abort();
  mem_poison(lse, LSE_CAP * sizeof(float), dev);

  /* forward: o = 0 and lse = −inf when there are queries but no keys; nothing written without queries */
  flashc_status s = flashc_forward(h, &p, &q.view, &k.view, &v.view, &o.view, lse);
  bool ok = th_check(s == FLASHC_OK, "%s: forward: %s: %s", who, flashc_status_string(s), flashc_last_error());
  if (ok) {
    ok &= expect_zero(who, "o", &o);
    ok &= expect_lse(who, lse, LSE_CAP, total_k == 0 ? n_lse : 0, dev);
    ok &= th_check(strcmp(flashc_handle_last_backend(h), info->name) == 0, "%s: last backend is '%s'", who,
                   flashc_handle_last_backend(h));
  }
  /* lse NULL is fine in the forward */
  s = flashc_forward(h, &p, &q.view, &k.view, &v.view, &o.view, NULL);
  ok &= th_check(s == FLASHC_OK, "%s: forward without lse: %s: %s", who, flashc_status_string(s), flashc_last_error());

  if (info->has_backward) {
    buf dout = buf_new(dt, c->batch, c->sq, HQ, d, dev), dq = buf_new(dt, c->batch, c->sq, HQ, d, dev);
    buf dk = buf_new(dt, c->batch, c->sk, HKV, d, dev), dv = buf_new(dt, c->batch, c->sk, HKV, d, dev);
    /* lse as the forward left it (−inf rows, or untouched poison that must not be read); NULL when it has
     * no element */
    const float *blse = n_lse ? lse : NULL;
    s = flashc_backward(h, &p, &q.view, &k.view, &v.view, &o.view, blse, &dout.view, &dq.view, &dk.view, &dv.view);
    bool bok = th_check(s == FLASHC_OK, "%s: backward: %s: %s", who, flashc_status_string(s), flashc_last_error());
    if (bok) {
      bok &= expect_zero(who, "dq", &dq);
      bok &= expect_zero(who, "dk", &dk);
      bok &= expect_zero(who, "dv", &dv);
    }
    ok &= bok;
    buf_free(&dout), buf_free(&dq), buf_free(&dk), buf_free(&dv);
  }
  if (ok) printf("ok   %s\n", who);
  buf_free(&q), buf_free(&k), buf_free(&v), buf_free(&o);
  mem_free(lse, dev);
}

/* What stays refused about empty calls, and the data rule: NULL only without elements. */
static void refusals(void) {
  flashc_handle h;
  if (!th_check(flashc_create(&h, "auto") == FLASHC_OK, "flashc_create(auto): %s", flashc_last_error())) return;
  float x[64];
  flashc_tensor q = flashc_tensor_bshd(NULL, FLASHC_F32, 0, 4, 0, 8), k = flashc_tensor_bshd(x, FLASHC_F32, 0, 4, 1, 8);
  flashc_tensor v = k, o = q;
  flashc_status s = flashc_forward(h, NULL, &q, &k, &v, &o, NULL);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "heads and head_dim must be >= 1"),
           "heads 0 with batch 0 is refused (got %s: %s)", flashc_status_string(s), flashc_last_error());
  /* seqlen_k 0: o has elements, so its data must be there */
  q = flashc_tensor_bshd(x, FLASHC_F32, 1, 2, 1, 8), o = flashc_tensor_bshd(NULL, FLASHC_F32, 1, 2, 1, 8);
  k = v = flashc_tensor_bshd(NULL, FLASHC_F32, 1, 0, 1, 8);
  s = flashc_forward(h, NULL, &q, &k, &v, &o, NULL);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "o.data is NULL"),
           "seqlen_k 0 with o.data NULL is refused (got %s: %s)", flashc_status_string(s), flashc_last_error());
  /* backward with queries needs lse, even without keys */
  float g[3][16];
  o.data = g[0];
  flashc_tensor dout = q, dq = flashc_tensor_bshd(g[1], FLASHC_F32, 1, 2, 1, 8), dk = k, dv = v;
  dout.data = g[2];
  s = flashc_backward(h, NULL, &q, &k, &v, &o, NULL, &dout, &dq, &dk, &dv);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "lse is NULL"),
           "backward with seqlen_k 0 and lse NULL is refused (got %s: %s)", flashc_status_string(s),
           flashc_last_error());
  /* varlen still needs at least one sequence */
  int32_t cu[1] = {0};
  flashc_params p = flashc_params_default();
  p.cu_seqlens_q = p.cu_seqlens_k = cu, p.num_seqs = 0;
  q = o = flashc_tensor_bshd(NULL, FLASHC_F32, 1, 0, 1, 8);
  k = v = q;
  s = flashc_forward(h, &p, &q, &k, &v, &o, NULL);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "num_seqs is 0"),
           "varlen with num_seqs 0 is refused (got %s: %s)", flashc_status_string(s), flashc_last_error());
  flashc_destroy(h);
  printf("ok   refusals: heads 0, NULL data with elements, lse NULL with queries, num_seqs 0\n");
}

int main(void) {
  th_begin("test_empty");
  int n = flashc_backend_count(), ran = 0, cuda_seen = 0;
  for (int i = 0; i < n; i++) {
    flashc_backend_info info;
    if (!th_check(flashc_backend_get(i, &info) == FLASHC_OK, "flashc_backend_get(%d)", i)) continue;
    if (info.device == FLASHC_DEVICE_CUDA) cuda_seen = 1;
    if (!info.usable) {
      printf("skip %s: %s\n", info.name, info.why_unusable);
      continue;
    }
#ifndef FLASHC_TEST_CUDA
    if (info.device == FLASHC_DEVICE_CUDA) {
      printf("skip %s: the tests were built without the CUDA runtime\n", info.name);
      continue;
    }
#endif
    th_backend be;
    if (!th_backend_open(&be, info.name)) continue;
    int64_t d = 64 < info.min_head_dim ? info.min_head_dim : 64 > info.max_head_dim ? info.max_head_dim : 64;
    for (int dt = 0; dt <= FLASHC_F64; dt++) {
      if (!(info.dtypes & (1u << dt))) continue;
      for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(&info, be.handle, &cases[c], dt, d);
    }
    th_backend_close(&be);
    ran++;
  }
  if (!cuda_seen) printf("note no CUDA backend in this build: no CUDA device checked\n");
  th_check(ran > 0, "no usable backend ran");
  refusals();
  return th_end();
}
