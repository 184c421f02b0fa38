/*
 * test_varlen_device.c — varlen offsets in device memory (flashc.h, flashc_params.cu_seqlens_device), as
 * flash_attn_varlen_func takes them:
 *   1. Refusals, on the CPU: a cu_seqlens_device that is not 0 or 1, or set without offsets; max_seqlen_q/k outside
 *      [1, the packed rows] (0 allowed only with no row); seqused and the debug dropout mask with device offsets;
 *      every CPU backend refusing device offsets as unsupported, naming the option, and `auto` finding none for host
 *      tensors. Each refusal leaves the outputs unwritten. An older caller's struct (ending before the new fields)
 *      gets host offsets whatever bytes follow it.
 *   2. cuda-mma and cuda-hopper, forward and backward, f16 and bf16: the offsets on the device and the exact longest
 *      lengths give bit-identical o, lse, dk and dv to the same offsets on the host, and dq too where the backward is
 *      deterministic (else to its rounding: its fp32 adds come in any order) (the kernels read the offsets on the
 *      device either way; only the backward's padded row layout differs, which changes no arithmetic): odd lengths,
 *      an empty sequence on each side, causal (both alignments), GQA and MQA (the group split), head dims 64 to 256,
 *      the deterministic backward. Skipped without a GPU ("no CUDA device").
 *   3. A max_seqlen_q below a sequence's length: that sequence is cut to its first max_seqlen_q rows; the rows past
 *      the cut stay unwritten (poison) and the other rows match the host-offset results; nothing outside the tensors
 *      is written. Device offsets with host tensors' memory mixed, and device offsets passed as host ones, are
 *      refused. Skipped without a GPU ("no CUDA device").
 */
#include "harness.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- one packed problem ------------------------------------------------------------------------------- */
enum { MAX_SEQS = 8 };

typedef struct vcase {
  const char *name;
  int n;
  int32_t lens_q[MAX_SEQS], lens_k[MAX_SEQS];
  int hq, hkv, d, causal, top_left, deterministic;
  flashc_dtype dtype;
} vcase;

typedef struct problem {
  int32_t cu_q[MAX_SEQS + 1], cu_k[MAX_SEQS + 1];
  int64_t total_q, total_k, max_q, max_k;
  th_tensor q, k, v, o, dout, dq, dk, dv;
  float *lse;
  int64_t lse_n;
} problem;

static void problem_new(problem *P, const vcase *c, th_rng *rng) {
  memset(P, 0, sizeof *P);
  for (int s = 0; s < c->n; s++) {
    P->cu_q[s + 1] = P->cu_q[s] + c->lens_q[s];
    P->cu_k[s + 1] = P->cu_k[s] + c->lens_k[s];
    if (c->lens_q[s] > P->max_q) P->max_q = c->lens_q[s];
    if (c->lens_k[s] > P->max_k) P->max_k = c->lens_k[s];
  }
  P->total_q = P->cu_q[c->n], P->total_k = P->cu_k[c->n];
  P->q = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_q, c->hq, c->d);
  P->k = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_k, c->hkv, c->d);
  P->v = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_k, c->hkv, c->d);
  P->o = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_q, c->hq, c->d);
  P->dout = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_q, c->hq, c->d);
  P->dq = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_q, c->hq, c->d);
  P->dk = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_k, c->hkv, c->d);
  P->dv = th_tensor_new(c->dtype, TH_BSHD, 1, P->total_k, c->hkv, c->d);
  th_fill_normal(&P->q, rng), th_fill_normal(&P->k, rng), th_fill_normal(&P->v, rng);
  th_fill_normal(&P->dout, rng);
  P->lse_n = P->total_q * c->hq;
  P->lse = malloc((size_t)(P->lse_n > 0 ? P->lse_n : 1) * sizeof(float));
  if (!P->lse) abort();
}

static void problem_free(problem *P) {
  th_tensor *ts[8] = {&P->q, &P->k, &P->v, &P->o, &P->dout, &P->dq, &P->dk, &P->dv};
  for (int i = 0; i < 8; i++) th_tensor_free(ts[i]);
  free(P->lse);
}

static flashc_params params_of(const vcase *c, const problem *P) {
  flashc_params p = flashc_params_default();
  p.causal = c->causal;
  p.align = c->top_left ? FLASHC_ALIGN_TOP_LEFT : FLASHC_ALIGN_BOTTOM_RIGHT;
  p.deterministic = c->deterministic;
  p.cu_seqlens_q = P->cu_q;
  p.cu_seqlens_k = P->cu_k;
  p.num_seqs = c->n;
  return p;
}

/* ---- 1. refusals on the CPU --------------------------------------------------------------------------- */
/* A forward on backend `name` with p must fail with `want`, its message naming `needle`, and write nothing. */
static void expect_refusal(const char *name, const flashc_params *p, problem *P, flashc_status want, const char *needle,
                           const char *what) {
  flashc_status s;
  if (strcmp(name, "auto") == 0) { /* host tensors, so that the library picks among every backend */
    flashc_handle h;
    if (!th_check(flashc_create(&h, "auto") == FLASHC_OK, "flashc_create(auto): %s", flashc_last_error())) return;
    th_poison(&P->o);
    s = flashc_forward(h, p, &P->q.view, &P->k.view, &P->v.view, &P->o.view, P->lse);
    flashc_destroy(h);
  } else {
    th_backend be;
    if (!th_backend_open(&be, name)) return;
    s = th_forward(&be, p, &P->q, &P->k, &P->v, &P->o, P->lse, P->lse_n);
    th_backend_close(&be);
  }
  th_check(s == want && strstr(flashc_last_error(), needle) != NULL, "%s on %s: expected %s naming '%s', got %s: %s",
           what, name, flashc_status_string(want), needle, flashc_status_string(s), flashc_last_error());
  th_check(th_all_poison(&P->o), "%s on %s: a refused call wrote o", what, name);
}

static void refusals(th_rng *rng) {
  const vcase c = {"refusals", 3, {5, 0, 7}, {4, 6, 1}, 2, 1, 16, 1, 0, 0, FLASHC_F32};
  problem P;
  problem_new(&P, &c, rng);
  flashc_params p = params_of(&c, &P);
  p.cu_seqlens_device = 1;
  p.max_seqlen_q = P.max_q, p.max_seqlen_k = P.max_k;
  /* The CPU backends read offsets on the host: device ones are an option they do not take. */
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || info.device != FLASHC_DEVICE_CPU) continue;
    expect_refusal(info.name, &p, &P, FLASHC_ERR_UNSUPPORTED, "cu_seqlens_device", "device offsets");
  }
  expect_refusal("auto", &p, &P, FLASHC_ERR_UNSUPPORTED, "no backend accepts", "device offsets with host tensors");

  flashc_params b = p;
  b.cu_seqlens_device = 2;
  expect_refusal("cpu", &b, &P, FLASHC_ERR_INVALID_ARGUMENT, "cu_seqlens_device is 2", "cu_seqlens_device 2");
  b = flashc_params_default();
  b.cu_seqlens_device = 1;
  expect_refusal("cpu", &b, &P, FLASHC_ERR_INVALID_ARGUMENT, "cu_seqlens_q/k are NULL", "device flag, no offsets");
  const struct {
    int64_t max_q, max_k;
    const char *needle;
  } bad_max[] = {
      {0, 6, "max_seqlen_q is 0"},       /* q has rows: some sequence has one */
      {-1, 6, "max_seqlen_q is -1"},     /* negative */
      {13, 6, "max_seqlen_q is 13"},     /* more than the 12 packed rows */
      {7, 0, "max_seqlen_k is 0"},       /* k has rows */
      {7, 12, "max_seqlen_k is 12"},     /* more than the 11 packed rows */
      {7, INT64_MAX, "max_seqlen_k is"}, /* absurd */
  };
  for (size_t i = 0; i < sizeof bad_max / sizeof bad_max[0]; i++) {
    b = p;
    b.max_seqlen_q = bad_max[i].max_q, b.max_seqlen_k = bad_max[i].max_k;
    expect_refusal("cpu", &b, &P, FLASHC_ERR_INVALID_ARGUMENT, bad_max[i].needle, "max_seqlen out of range");
  }
  const int32_t used[3] = {1, 0, 1};
  b = p;
  b.seqused_k = used;
  expect_refusal("cpu", &b, &P, FLASHC_ERR_UNSUPPORTED, "seqused_k with device cu_seqlens", "seqused");
  uint8_t mask[3 * 2 * 7 * 6];
  b = p;
  b.dropout_p = 0.5f;
  b.dropout_mask = mask;
  expect_refusal("cpu", &b, &P, FLASHC_ERR_UNSUPPORTED, "dropout_mask", "dropout mask");

  /* An older caller's struct ends before cu_seqlens_device: the bytes after it are not read, so its host offsets
   * work (here as cpu-ref computes them), whatever follows. */
  b = params_of(&c, &P);
  b.cu_seqlens_device = 7, b.max_seqlen_q = -5, b.max_seqlen_k = -5;
  b.struct_size = offsetof(flashc_params, cu_seqlens_device);
  th_backend be;
  if (th_backend_open(&be, "cpu-ref")) {
    flashc_status s = th_forward(&be, &b, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
    th_check(s == FLASHC_OK, "a struct without cu_seqlens_device runs with host offsets: %s", flashc_last_error());
    th_backend_close(&be);
  }
  problem_free(&P);
}

/* ---- 2. and 3. on a GPU ------------------------------------------------------------------------------- */
#ifdef FLASHC_TEST_CUDA
static bool usable(const char *name) {
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, name) == 0) return info.usable;
  }
  return false;
}

/* The offsets on the device: [cu_q | cu_k], one allocation (cudaFree the returned pointer). */
static int32_t *device_offsets(const problem *P, int n) {
  int32_t *d = NULL;
  if (!th_check(cudaMalloc((void **)&d, 2 * (size_t)(n + 1) * sizeof(int32_t)) == cudaSuccess, "cudaMalloc offsets"))
    return NULL;
  cudaMemcpy(d, P->cu_q, (size_t)(n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
  cudaMemcpy(d + n + 1, P->cu_k, (size_t)(n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice);
  return d;
}

static void *save(const th_tensor *t) {
  void *x = malloc(t->alloc_bytes);
  if (!x) abort();
  memcpy(x, t->alloc, t->alloc_bytes);
  return x;
}

static bool same_bits(const void *a, const th_tensor *t, const char *what, const char *tensor) {
  return th_check(memcmp(a, t->alloc, t->alloc_bytes) == 0, "%s: %s differs between host and device offsets", what,
                  tensor);
}

/* dQ outside the deterministic backward: fp32 adds in whatever order the key blocks arrive, so two runs may round
 * differently (by an ulp of the 16-bit result), with host offsets as with device ones. */
static bool same_to_rounding(const void *a, const th_tensor *t, const char *what, const char *tensor) {
  const flashc_tensor *v = &t->view;
  int64_t bad = 0;
  for (int64_t r = 0; r < v->size[1]; r++)
    for (int64_t h = 0; h < v->size[2]; h++)
      for (int64_t x = 0; x < v->size[3]; x++) {
        const int64_t i = th_index(v, 0, r, h, x);
        const double want = th_load((const char *)a + ((const char *)v->data - (const char *)t->alloc), v->dtype, i);
        bad += !(fabs(th_load(v->data, v->dtype, i) - want) <= 1e-2 * (1.0 + fabs(want)));
      }
  return th_check(bad == 0, "%s: %lld elements of %s differ between host and device offsets", what, (long long)bad,
                  tensor);
}

/* 2: host offsets, then device offsets, forward and backward; every output bit for bit. */
static void compare_case(const char *backend, const vcase *c, th_rng *rng) {
  char what[160];
  snprintf(what, sizeof what, "%s %s %s d%d hq%d/hkv%d causal %d%s%s", backend, c->name, flashc_dtype_name(c->dtype),
           c->d, c->hq, c->hkv, c->causal, c->top_left ? " top-left" : "", c->deterministic ? " deterministic" : "");
  problem P;
  problem_new(&P, c, rng);
  th_backend be;
  int32_t *dcu = device_offsets(&P, c->n);
  if (!dcu || !th_backend_open(&be, backend)) {
    if (dcu) cudaFree(dcu);
    problem_free(&P);
    return;
  }
  flashc_params host = params_of(c, &P), dev = host;
  dev.cu_seqlens_device = 1;
  dev.cu_seqlens_q = dcu, dev.cu_seqlens_k = dcu + c->n + 1;
  dev.max_seqlen_q = P.max_q, dev.max_seqlen_k = P.max_k;
  float *lse_host = malloc((size_t)(P.lse_n > 0 ? P.lse_n : 1) * sizeof(float));
  void *o_host = NULL, *dq_host = NULL, *dk_host = NULL, *dv_host = NULL;
  if (!lse_host) abort();
  flashc_status s = th_forward(&be, &host, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  if (!th_check(s == FLASHC_OK, "%s: forward, host offsets: %s", what, flashc_last_error())) goto done;
  th_check_output(&P.o, what);
  o_host = save(&P.o);
  memcpy(lse_host, P.lse, (size_t)P.lse_n * sizeof(float));
  s = th_backward(&be, &host, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n, &P.dout, &P.dq, &P.dk, &P.dv);
  if (!th_check(s == FLASHC_OK, "%s: backward, host offsets: %s", what, flashc_last_error())) goto done;
  dq_host = save(&P.dq), dk_host = save(&P.dk), dv_host = save(&P.dv);

  s = th_forward(&be, &dev, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  if (!th_check(s == FLASHC_OK, "%s: forward, device offsets: %s", what, flashc_last_error())) goto done;
  same_bits(o_host, &P.o, what, "o");
  th_check(memcmp(lse_host, P.lse, (size_t)P.lse_n * sizeof(float)) == 0, "%s: lse differs", what);
  /* the backward from the host run's o and lse, so that only the offsets differ */
  memcpy(P.o.alloc, o_host, P.o.alloc_bytes);
  memcpy(P.lse, lse_host, (size_t)P.lse_n * sizeof(float));
  s = th_backward(&be, &dev, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n, &P.dout, &P.dq, &P.dk, &P.dv);
  if (!th_check(s == FLASHC_OK, "%s: backward, device offsets: %s", what, flashc_last_error())) goto done;
  if (c->deterministic)
    same_bits(dq_host, &P.dq, what, "dq");
  else
    same_to_rounding(dq_host, &P.dq, what, "dq");
  same_bits(dk_host, &P.dk, what, "dk");
  same_bits(dv_host, &P.dv, what, "dv");
done:
  free(lse_host), free(o_host), free(dq_host), free(dk_host), free(dv_host);
  cudaFree(dcu);
  th_backend_close(&be);
  problem_free(&P);
}

/* 3: sequence 0 (300 rows) cut to max_seqlen_q 128, not causal (so that its first 128 rows see the same keys). */
static void clamp_case(const char *backend, th_rng *rng) {
  const vcase c = {"cut", 2, {300, 40}, {90, 200}, 4, 2, 64, 0, 0, 0, FLASHC_BF16};
  char what[96];
  snprintf(what, sizeof what, "%s: max_seqlen_q 128 below a sequence of 300", backend);
  problem P;
  problem_new(&P, &c, rng);
  th_backend be;
  int32_t *dcu = device_offsets(&P, c.n);
  if (!dcu || !th_backend_open(&be, backend)) {
    if (dcu) cudaFree(dcu);
    problem_free(&P);
    return;
  }
  flashc_params host = params_of(&c, &P), dev = host;
  dev.cu_seqlens_device = 1;
  dev.cu_seqlens_q = dcu, dev.cu_seqlens_k = dcu + c.n + 1;
  dev.max_seqlen_q = 128, dev.max_seqlen_k = P.max_k;
  void *o_host = NULL;
  flashc_status s = th_forward(&be, &host, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  if (!th_check(s == FLASHC_OK, "%s: host offsets: %s", what, flashc_last_error())) goto done;
  o_host = save(&P.o);
  s = th_forward(&be, &dev, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  if (!th_check(s == FLASHC_OK, "%s: device offsets: %s", what, flashc_last_error())) goto done;
  int64_t bad = 0, unwritten = 0;
  for (int64_t r = 0; r < P.total_q; r++) {
    const bool cut = r >= 128 && r < 300; /* sequence 0's rows past the cut */
    for (int64_t h = 0; h < c.hq; h++)
      for (int64_t x = 0; x < c.d; x++) {
        const int64_t i = th_index(&P.o.view, 0, r, h, x);
        const double got = th_load(P.o.view.data, c.dtype, i), want = th_load(o_host, c.dtype, i);
        if (cut)
          unwritten += ((const uint16_t *)P.o.view.data)[i] == 0xFFFFu;
        else
          bad += !(fabs(got - want) <= 1e-2 * (1.0 + fabs(want)));
      }
  }
  th_check(bad == 0, "%s: %lld elements of the rows before the cut differ from host offsets' results", what,
           (long long)bad);
  th_check(unwritten == (300 - 128) * c.hq * c.d, "%s: %lld of the %d elements past the cut were written", what,
           (long long)((300 - 128) * c.hq * c.d - unwritten), (300 - 128) * c.hq * c.d);
  /* The backward of the cut sequence: runs, and writes only inside the tensors (their padding stays poison). */
  s = th_backward(&be, &dev, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n, &P.dout, &P.dq, &P.dk, &P.dv);
  th_check(s == FLASHC_OK, "%s: backward: %s", what, flashc_last_error());

  /* Device offsets given as host ones would be read on the host: refused. */
  flashc_params wrong = host;
  wrong.cu_seqlens_q = dcu, wrong.cu_seqlens_k = dcu + c.n + 1;
  s = th_forward(&be, &wrong, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "cu_seqlens_device is 0"),
           "%s: device offsets without cu_seqlens_device: expected invalid argument, got %s: %s", backend,
           flashc_status_string(s), flashc_last_error());
  /* Host offsets flagged as device ones, beside device tensors: refused as memory of the wrong kind. */
  wrong = host;
  wrong.cu_seqlens_device = 1, wrong.max_seqlen_q = P.max_q, wrong.max_seqlen_k = P.max_k;
  s = th_forward(&be, &wrong, &P.q, &P.k, &P.v, &P.o, P.lse, P.lse_n);
  th_check(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "params.cu_seqlens_q is in host memory"),
           "%s: host offsets flagged as device: expected invalid argument, got %s: %s", backend,
           flashc_status_string(s), flashc_last_error());
done:
  free(o_host);
  cudaFree(dcu);
  th_backend_close(&be);
  problem_free(&P);
}

static void gpu_cases(th_rng *rng) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("SKIP device offsets on cuda-mma and cuda-hopper: no CUDA device\n");
    return;
  }
  static const vcase cases[] = {
      /* odd lengths, an empty query sequence and an empty key sequence, MQA, causal */
      {"odd", 5, {97, 0, 257, 1, 64}, {113, 5, 0, 130, 64}, 4, 1, 64, 1, 0, 0, FLASHC_BF16},
      {"odd", 5, {97, 0, 257, 1, 64}, {113, 5, 0, 130, 64}, 4, 1, 64, 1, 0, 0, FLASHC_F16},
      /* seqlen_q ≠ seqlen_k, top-left causal, GQA 8/2, head dim 128 */
      {"uneven", 3, {113, 203, 5}, {203, 113, 300}, 8, 2, 128, 1, 1, 0, FLASHC_BF16},
      /* no mask, head dim 96 (the next compiled one up) and 256 */
      {"plain", 4, {1, 129, 64, 200}, {1, 128, 65, 333}, 2, 2, 96, 0, 0, 0, FLASHC_F16},
      {"plain", 2, {150, 33}, {70, 190}, 2, 1, 256, 0, 0, 0, FLASHC_BF16},
      /* the deterministic backward (its dQ turns walk the padded rows) */
      {"det", 3, {129, 7, 300}, {129, 77, 256}, 4, 2, 64, 1, 0, 1, FLASHC_BF16},
      {"det", 3, {129, 7, 300}, {129, 77, 256}, 4, 4, 128, 0, 0, 1, FLASHC_F16},
  };
  const char *backends[2] = {"cuda-mma", "cuda-hopper"};
  for (int b = 0; b < 2; b++) {
    if (!usable(backends[b])) {
      printf("SKIP device offsets on %s: not usable on this device\n", backends[b]);
      continue;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) compare_case(backends[b], &cases[i], rng);
    clamp_case(backends[b], rng);
  }
}
#else
static void gpu_cases(th_rng *rng) {
  (void)rng;
  printf("SKIP device offsets on cuda-mma and cuda-hopper: no CUDA device (built without CUDA)\n");
}
#endif

int main(void) {
  th_begin("test_varlen_device");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  refusals(&rng);
  gpu_cases(&rng);
  return th_end();
}
