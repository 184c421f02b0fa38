/*
 * test_errors.c — every bad input is refused with its status and a message that names the offending value,
 * and a refused call writes nothing: its outputs still hold the poison, its inputs their values.
 *
 * Each check starts from a valid call (the fixture), breaks one thing, and expects a status and substrings
 * of flashc_last_error(). Argument errors are found before any backend is chosen, so they are checked on
 * an "auto" handle; what depends on a backend (f64 on cpu, head_dim beyond a limit) on that backend.
 */
#include "harness.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fixture: a valid forward and backward call ------------------------------------------------ */
enum { B = 2, SQ = 4, SK = 5, H = 2, D = 8 };

typedef struct fixture {
  flashc_dtype dtype;
  th_tensor q, k, v, o, dout, dq, dk, dv;
  float lse[B * 4 * SQ]; /* room for every fixture (heads_q up to 4) */
  uint8_t *saved[5];     /* the inputs' bytes, to see that nothing wrote them */
} fixture;

/* One call: views copied from the fixture (a check changes them), and what to pass. */
typedef struct call {
  flashc_handle handle;
  flashc_params params;
  const flashc_params *pparams;
  flashc_tensor q, k, v, o, dout, dq, dk, dv;
  const flashc_tensor *pq, *pk, *pv, *pdout;
  flashc_tensor *po, *pdq, *pdk, *pdv;
  float *lse;
} call;

static fixture fx;
static flashc_handle h_auto;

static void fixture_init(fixture *f, flashc_dtype dtype, int64_t hq, int64_t hkv, int64_t d, th_rng *r) {
  memset(f, 0, sizeof *f);
  f->dtype = dtype;
  f->q = th_tensor_new(dtype, TH_BSHD, B, SQ, hq, d);
  f->k = th_tensor_new(dtype, TH_BSHD, B, SK, hkv, d);
  f->v = th_tensor_new(dtype, TH_BSHD, B, SK, hkv, d);
  f->o = th_tensor_new(dtype, TH_BSHD, B, SQ, hq, d);
  f->dout = th_tensor_new(dtype, TH_BSHD, B, SQ, hq, d);
  f->dq = th_tensor_new(dtype, TH_BSHD, B, SQ, hq, d);
  f->dk = th_tensor_new(dtype, TH_BSHD, B, SK, hkv, d);
  f->dv = th_tensor_new(dtype, TH_BSHD, B, SK, hkv, d);
  th_fill_normal(&f->q, r), th_fill_normal(&f->k, r), th_fill_normal(&f->v, r), th_fill_normal(&f->dout, r);
  th_fill_normal(&f->o, r); /* the backward's input o; a forward check poisons it first */
  const th_tensor *in[5] = {&f->q, &f->k, &f->v, &f->dout, &f->o};
  for (int i = 0; i < 5; i++) {
    f->saved[i] = malloc(in[i]->alloc_bytes);
    if (!f->saved[i]) abort();
    memcpy(f->saved[i], in[i]->alloc, in[i]->alloc_bytes);
  }
}

static void fixture_free(fixture *f) {
  th_tensor *t[8] = {&f->q, &f->k, &f->v, &f->o, &f->dout, &f->dq, &f->dk, &f->dv};
  for (int i = 0; i < 8; i++) th_tensor_free(t[i]);
  for (int i = 0; i < 5; i++) free(f->saved[i]);
}

/* In place: the call points into itself. */
static void valid_call(call *c, const fixture *f, flashc_handle h) {
  memset(c, 0, sizeof *c);
  c->handle = h;
  c->params = flashc_params_default();
  c->pparams = &c->params;
  c->q = f->q.view, c->k = f->k.view, c->v = f->v.view, c->o = f->o.view;
  c->dout = f->dout.view, c->dq = f->dq.view, c->dk = f->dk.view, c->dv = f->dv.view;
  c->pq = &c->q, c->pk = &c->k, c->pv = &c->v, c->po = &c->o, c->pdout = &c->dout;
  c->pdq = &c->dq, c->pdk = &c->dk, c->pdv = &c->dv;
  c->lse = (float *)f->lse;
}

/* Every needle must be in the message. */
static bool has_all(const char *msg, const char *needles[], int n, const char **missing) {
  for (int i = 0; i < n; i++)
    if (!strstr(msg, needles[i])) {
      *missing = needles[i];
      return false;
    }
  return true;
}

/* Runs the call (forward or backward) and checks status, message and that nothing was written. The needles
 * follow the expected status, NULL-terminated. */
static void expect(const char *what, fixture *f, call *c, int backward, flashc_status want, ...) {
  th_tensor *outs[3] = {&f->o, NULL, NULL};
  int n_out = 1;
  if (backward) {
    outs[0] = &f->dq, outs[1] = &f->dk, outs[2] = &f->dv;
    n_out = 3;
    memcpy(f->o.alloc, f->saved[4], f->o.alloc_bytes); /* an input here; a forward check poisoned it */
  } else {
    memset(f->lse, TH_POISON_BYTE, sizeof f->lse);
  }
  for (int i = 0; i < n_out; i++) th_poison(outs[i]);
  flashc_status s = backward ? flashc_backward(c->handle, c->pparams, c->pq, c->pk, c->pv, c->po, c->lse, c->pdout,
                                               c->pdq, c->pdk, c->pdv)
                             : flashc_forward(c->handle, c->pparams, c->pq, c->pk, c->pv, c->po, c->lse);
  const char *msg = flashc_last_error();
  const char *needles[8];
  int n = 0;
  va_list ap;
  va_start(ap, want);
  for (const char *x; n < 8 && (x = va_arg(ap, const char *)) != NULL;) needles[n++] = x;
  va_end(ap);
  const char *missing = "";
  bool ok = th_check(s == want, "%s: status %s, expected %s (message: \"%s\")", what, flashc_status_string(s),
                     flashc_status_string(want), msg);
  if (want != FLASHC_OK) {
    ok &= th_check(has_all(msg, needles, n, &missing), "%s: message \"%s\" lacks \"%s\"", what, msg, missing);
    bool untouched = true;
    for (int i = 0; i < n_out; i++) untouched &= th_all_poison(outs[i]);
    if (!backward)
      for (size_t i = 0; i < sizeof f->lse; i++) untouched &= ((unsigned char *)f->lse)[i] == TH_POISON_BYTE;
    ok &= th_check(untouched, "%s: a refused call wrote to its outputs", what);
  }
  const th_tensor *in[5] = {&f->q, &f->k, &f->v, &f->dout, backward ? &f->o : NULL};
  for (int i = 0; i < 5; i++)
    if (in[i])
      ok &= th_check(memcmp(in[i]->alloc, f->saved[i], in[i]->alloc_bytes) == 0, "%s: an input was written", what);
  if (ok) printf("ok   %-52s %s: %s\n", what, flashc_status_string(s), want == FLASHC_OK ? "" : msg);
}

#define INVALID FLASHC_ERR_INVALID_ARGUMENT
#define UNSUPP  FLASHC_ERR_UNSUPPORTED

/* ---- the checks ------------------------------------------------------------------------------------- */
static const char *const dim[4] = {"batch", "seqlen", "heads", "head_dim"};

static void null_pointers(void) {
  call c;
  valid_call(&c, &fx, NULL);
  expect("forward: handle NULL", &fx, &c, 0, INVALID, "handle is NULL", NULL);
  valid_call(&c, &fx, NULL);
  expect("backward: handle NULL", &fx, &c, 1, INVALID, "handle is NULL", NULL);
  const char *names[8] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  for (int i = 0; i < 8; i++) {
    char what[96], needle[32];
    int bwd = i >= 4;
    valid_call(&c, &fx, h_auto);
    switch (i) {
    case 0: c.pq = NULL; break;
    case 1: c.pk = NULL; break;
    case 2: c.pv = NULL; break;
    case 3: c.po = NULL; break;
    case 4: c.pdout = NULL; break;
    case 5: c.pdq = NULL; break;
    case 6: c.pdk = NULL; break;
    default: c.pdv = NULL; break;
    }
    snprintf(what, sizeof what, "%s: %s NULL", bwd ? "backward" : "forward", names[i]);
    snprintf(needle, sizeof needle, "%s is NULL", names[i]);
    expect(what, &fx, &c, bwd, INVALID, needle, NULL);

    valid_call(&c, &fx, h_auto);
    flashc_tensor *t[8] = {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv};
    t[i]->data = NULL;
    snprintf(what, sizeof what, "%s: %s.data NULL", bwd ? "backward" : "forward", names[i]);
    snprintf(needle, sizeof needle, "%s.data is NULL", names[i]);
    expect(what, &fx, &c, bwd, INVALID, needle, NULL);
  }
  valid_call(&c, &fx, h_auto);
  c.lse = NULL;
  expect("backward: lse NULL", &fx, &c, 1, INVALID, "lse is NULL", NULL);
}

static void shapes(void) {
  char what[96], n1[32], n2[32];
  for (int d = 0; d < 4; d++) {
    call c;
    valid_call(&c, &fx, h_auto); /* o against q */
    c.o.size[d] += 3;
    snprintf(what, sizeof what, "forward: o.size[%d] (%s) differs from q", d, dim[d]);
    snprintf(n1, sizeof n1, "o.size[%d]", d);
    snprintf(n2, sizeof n2, "%lld", (long long)c.o.size[d]);
    expect(what, &fx, &c, 0, INVALID, n1, n2, dim[d], NULL);

    valid_call(&c, &fx, h_auto); /* v against k */
    c.v.size[d] += 2;
    snprintf(what, sizeof what, "forward: v.size[%d] (%s) differs from k", d, dim[d]);
    snprintf(n1, sizeof n1, "v.size[%d]", d);
    snprintf(n2, sizeof n2, "%lld", (long long)c.v.size[d]);
    expect(what, &fx, &c, 0, INVALID, n1, n2, NULL);
  }
  /* k and v together against q: batch and head_dim must match (seqlen and heads may differ) */
  int dims[2] = {0, 3};
  for (int i = 0; i < 2; i++) {
    int d = dims[i];
    call c;
    valid_call(&c, &fx, h_auto);
    c.k.size[d] += 1, c.v.size[d] += 1;
    snprintf(what, sizeof what, "forward: k and v %s differ from q", dim[d]);
    snprintf(n1, sizeof n1, "k.size[%d]", d);
    snprintf(n2, sizeof n2, "%lld", (long long)c.k.size[d]);
    expect(what, &fx, &c, 0, INVALID, n1, n2, dim[d], NULL);
  }
  /* backward: dout and dq against q, dk against k, dv against v */
  const char *names[4] = {"dout", "dq", "dk", "dv"};
  for (int t = 0; t < 4; t++)
    for (int d = 0; d < 4; d++) {
      call c;
      valid_call(&c, &fx, h_auto);
      flashc_tensor *x[4] = {&c.dout, &c.dq, &c.dk, &c.dv};
      x[t]->size[d] += 1;
      snprintf(what, sizeof what, "backward: %s.size[%d] (%s) differs", names[t], d, dim[d]);
      snprintf(n1, sizeof n1, "%s.size[%d]", names[t], d);
      snprintf(n2, sizeof n2, "%lld", (long long)x[t]->size[d]);
      expect(what, &fx, &c, 1, INVALID, n1, n2, NULL);
    }
  /* batch and seqlen 0 are valid (tests/test_empty.c); heads and head_dim 0 are refused, negative sizes too */
  call c;
  valid_call(&c, &fx, h_auto);
  c.q.size[2] = 0, c.o.size[2] = 0;
  expect("forward: q.size[2] (heads) = 0", &fx, &c, 0, INVALID, "q.size[2]", "heads", "is 0", "must be >= 1", NULL);
  valid_call(&c, &fx, h_auto);
  c.k.size[3] = c.v.size[3] = c.q.size[3] = c.o.size[3] = 0;
  expect("forward: head_dim 0", &fx, &c, 0, INVALID, "q.size[3]", "head_dim", "is 0", "must be >= 1", NULL);
  valid_call(&c, &fx, h_auto);
  c.dk.size[2] = 0;
  expect("backward: dk.size[2] (heads) = 0", &fx, &c, 1, INVALID, "dk.size[2]", "is 0", NULL);
  valid_call(&c, &fx, h_auto);
  c.q.size[1] = -1, c.o.size[1] = -1;
  expect("forward: q.size[1] = -1", &fx, &c, 0, INVALID, "q.size[1]", "is -1", "sizes must be >= 0", NULL);
  valid_call(&c, &fx, h_auto);
  c.k.size[0] = c.v.size[0] = -2;
  expect("forward: k.size[0] = -2", &fx, &c, 0, INVALID, "k.size[0]", "is -2", NULL);
  /* an empty view may have NULL data, one with an element may not */
  valid_call(&c, &fx, h_auto);
  c.q.size[1] = c.o.size[1] = 0;
  c.k.data = NULL;
  expect("forward: k.data NULL with seqlen_q 0", &fx, &c, 0, INVALID, "k.data is NULL", "no element", NULL);
}

/* Tensors of heads_q 3 against heads_kv 2. */
static void gqa_heads(th_rng *r) {
  fixture f3;
  fixture_init(&f3, FLASHC_F32, 3, 2, D, r);
  call c;
  valid_call(&c, &f3, h_auto);
  expect("forward: heads_q 3, heads_kv 2", &f3, &c, 0, INVALID, "heads_q 3", "heads_kv 2", NULL);
  fixture_free(&f3);
}

static void strides(void) {
  call c;
  valid_call(&c, &fx, h_auto);
  c.q.stride[3] = 2;
  expect("forward: q.stride[3] = 2", &fx, &c, 0, INVALID, "q.stride[3]", "2", "must be 1", NULL);
  valid_call(&c, &fx, h_auto);
  c.dk.stride[3] = 0;
  expect("backward: dk.stride[3] = 0", &fx, &c, 1, INVALID, "dk.stride[3]", "must be 1", NULL);
  valid_call(&c, &fx, h_auto);
  c.k.stride[1] = -16;
  expect("forward: negative k.stride[1]", &fx, &c, 0, INVALID, "k.stride[1]", "-16", NULL);
  valid_call(&c, &fx, h_auto);
  c.o.stride[0] = -1;
  expect("forward: negative o.stride[0]", &fx, &c, 0, INVALID, "o.stride[0]", "-1", NULL);

  /* Sizes near 2^62: (size − 1)·stride overflows int64 ... */
  valid_call(&c, &fx, h_auto);
  c.q.size[1] = (int64_t)1 << 62, c.o.size[1] = c.q.size[1];
  c.q.stride[1] = 16;
  expect("forward: q offsets overflow (size 2^62, stride 16)", &fx, &c, 0, INVALID, "q", "overflow", NULL);
  /* ... or the sum over dimensions does */
  valid_call(&c, &fx, h_auto);
  c.v.size[1] = 2, c.v.stride[1] = (int64_t)1 << 62; /* each product fits: 2^62; batch adds another 2^62 */
  c.v.stride[0] = (int64_t)1 << 62;
  c.k.size[1] = 2;
  expect("forward: v offsets overflow in the sum", &fx, &c, 0, INVALID, "v", "overflow", NULL);
  /* offsets fit int64 but the bytes do not */
  valid_call(&c, &fx, h_auto);
  c.q.size[1] = (int64_t)1 << 61, c.o.size[1] = c.q.size[1];
  c.q.stride[1] = 2;
  expect("forward: q spans more than 2^63 bytes", &fx, &c, 0, INVALID, "q", "bytes", NULL);

  /* outputs must not alias themselves */
  valid_call(&c, &fx, h_auto);
  c.o.stride[1] = 0;
  expect("forward: o.stride[1] = 0 (rows overlap)", &fx, &c, 0, INVALID, "o", "overlaps itself", NULL);
  valid_call(&c, &fx, h_auto);
  c.dv.stride[2] = D / 2;
  expect("backward: dv heads overlap (stride[2] = head_dim/2)", &fx, &c, 1, INVALID, "dv", "overlaps itself", NULL);
  /* ... nor share memory with an input or another output */
  valid_call(&c, &fx, h_auto);
  c.o.data = c.q.data;
  expect("forward: o.data == q.data", &fx, &c, 0, INVALID, "o", "shares memory with", "q", NULL);
  valid_call(&c, &fx, h_auto);
  c.dq.data = c.dout.data;
  expect("backward: dq.data == dout.data", &fx, &c, 1, INVALID, "dq", "shares memory with", "dout", NULL);
  valid_call(&c, &fx, h_auto);
  c.dv.data = c.dk.data;
  expect("backward: dv.data == dk.data", &fx, &c, 1, INVALID, "shares memory with", NULL);
  valid_call(&c, &fx, h_auto);
  c.o.data = (char *)c.q.data + D * flashc_dtype_size(c.q.dtype); /* one head further: rows overlap */
  expect("forward: o starts one head into q", &fx, &c, 0, INVALID, "o", "shares memory with", "q", NULL);
  valid_call(&c, &fx, h_auto);
  c.dk.data = (char *)c.dq.data + 3 * flashc_dtype_size(c.q.dtype); /* misaligned by 3 elements */
  expect("backward: dk starts 3 elements into dq", &fx, &c, 1, INVALID, "dk", "shares memory with", "dq", NULL);
}

/* Issue rows 1-3: an output that is the same struct as another tensor, an output whose size-1 dims have stride 0
 * inside an input (the overlap test must use every view's real extent), and lse inside another tensor. */
static void aliasing(void) {
  call c;
  valid_call(&c, &fx, h_auto);
  c.po = &c.k; /* flashc_forward(h, &p, &q, &k, &v, &k, lse) */
  /* so that shapes pass, o (= k) shaped like q: k and v narrowed to SQ rows (a view past q's memory could overlap
   * whatever lies after it, and the overlap would be reported first) */
  c.k.size[1] = c.v.size[1] = SQ;
  expect("forward: o is the same struct as k", &fx, &c, 0, INVALID, "o and k are the same flashc_tensor", NULL);
  valid_call(&c, &fx, h_auto);
  c.po = &c.q;
  expect("forward: o is the same struct as q", &fx, &c, 0, INVALID, "o and q", "same flashc_tensor", NULL);
  valid_call(&c, &fx, h_auto);
  c.pdk = &c.dq, c.pdv = &c.dq; /* dq, dk, dv as one struct */
  c.k = c.v = c.q;              /* (shapes of k, v as q's, so that shapes pass) */
  c.k.data = fx.k.view.data, c.v.data = fx.v.view.data;
  expect("backward: dq, dk, dv one struct", &fx, &c, 1, INVALID, "dq and dk are the same flashc_tensor", NULL);
  valid_call(&c, &fx, h_auto);
  c.pdv = &c.dk;
  c.v = c.k;
  c.v.data = fx.v.view.data;
  expect("backward: dk and dv one struct", &fx, &c, 1, INVALID, "dk and dv", "same flashc_tensor", NULL);
  valid_call(&c, &fx, h_auto);
  c.pdout = &c.dq; /* an input struct that is an output */
  expect("backward: dout is the same struct as dq", &fx, &c, 1, INVALID, "dq and dout", "same flashc_tensor", NULL);

  /* o [1, 1, 1, D] with strides {0, 0, 0, 1}, its memory row 2 of k [1, SK, 1, D] (one query, one head) */
  valid_call(&c, &fx, h_auto);
  for (int i = 0; i < 4; i++) {
    flashc_tensor *t[4] = {&c.q, &c.k, &c.v, &c.o};
    t[i]->size[0] = 1, t[i]->size[2] = 1;
  }
  c.q.size[1] = 1, c.o.size[1] = 1;
  c.o.stride[0] = c.o.stride[1] = c.o.stride[2] = 0;
  c.o.data = (char *)c.k.data + 2 * c.k.stride[1] * flashc_dtype_size(c.k.dtype);
  expect("forward: o [1,1,1,d] strides 0 inside k", &fx, &c, 0, INVALID, "output o shares memory with k", NULL);
  c.o.data = (char *)c.v.data + (SK - 1) * c.v.stride[1] * flashc_dtype_size(c.v.dtype); /* v's last row */
  expect("forward: o [1,1,1,d] strides 0 on v's last row", &fx, &c, 0, INVALID, "output o shares memory with v", NULL);
  /* backward: dk [1, 1, 1, D] with strides 0 inside dout [1, SQ, 1, D] */
  valid_call(&c, &fx, h_auto);
  {
    flashc_tensor *t[8] = {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv};
    for (int i = 0; i < 8; i++) t[i]->size[0] = 1, t[i]->size[2] = 1;
  }
  c.k.size[1] = c.v.size[1] = c.dk.size[1] = c.dv.size[1] = 1;
  c.dk.stride[0] = c.dk.stride[1] = c.dk.stride[2] = 0;
  c.dk.data = (char *)c.dout.data + 3 * c.dout.stride[1] * flashc_dtype_size(c.dout.dtype);
  expect("backward: dk [1,1,1,d] strides 0 inside dout", &fx, &c, 1, INVALID, "output dk shares memory with dout",
         NULL);

  /* lse: an output of the forward, overlap-checked like o */
  const char *in_names[4] = {"q", "k", "v", "o"};
  for (int i = 0; i < 4; i++) {
    char what[80], needle[64];
    valid_call(&c, &fx, h_auto);
    const flashc_tensor *t[4] = {&c.q, &c.k, &c.v, &c.o};
    c.lse = (float *)t[i]->data + 3; /* inside, not at the start */
    snprintf(what, sizeof what, "forward: lse inside %s", in_names[i]);
    snprintf(needle, sizeof needle, "output lse shares memory with %s", in_names[i]);
    expect(what, &fx, &c, 0, INVALID, needle, NULL);
  }
  /* the last lse element on q's first element: the ranges touch by one float */
  {
    float *buf = malloc(sizeof(float) * (B * H * SQ + B * SQ * H * D)); /* lse then q, adjacent */
    if (!buf) abort();
    for (int i = 0; i < B * SQ * H * D; i++) buf[B * H * SQ + i] = 1.0f;
    c.q.data = buf + B * H * SQ - 1;
    c.lse = buf;
    expect("forward: lse's last float is q's first", &fx, &c, 0, INVALID, "output lse shares memory with q", NULL);
    c.q.data = buf + B * H * SQ; /* adjacent, not overlapping: accepted */
    expect("forward: lse just before q (adjacent) is fine", &fx, &c, 0, FLASHC_OK, NULL);
    free(buf);
  }
  /* backward: lse is an input there, and dq, dk, dv must not overlap it */
  const char *grads[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    char what[80], needle[64];
    valid_call(&c, &fx, h_auto);
    const flashc_tensor *t[3] = {&c.dq, &c.dk, &c.dv};
    c.lse = (float *)t[i]->data + 1;
    snprintf(what, sizeof what, "backward: lse inside %s", grads[i]);
    snprintf(needle, sizeof needle, "output %s shares memory with lse", grads[i]);
    expect(what, &fx, &c, 1, INVALID, needle, NULL);
  }
}

/* Issue row 12: data must be aligned to its element size (lse to 4 bytes); anything else is refused, naming
 * the tensor. */
static void alignment(void) {
  const char *names[8] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  for (int i = 0; i < 8; i++) {
    char what[80], needle[32];
    call c;
    valid_call(&c, &fx, h_auto);
    flashc_tensor *t[8] = {&c.q, &c.k, &c.v, &c.o, &c.dout, &c.dq, &c.dk, &c.dv};
    t[i]->data = (char *)t[i]->data + 1 + i % 3; /* 1, 2 or 3 bytes off a float */
    snprintf(what, sizeof what, "%s: %s.data misaligned by %d", i >= 4 ? "backward" : "forward", names[i], 1 + i % 3);
    snprintf(needle, sizeof needle, "%s.data", names[i]);
    expect(what, &fx, &c, i >= 4, INVALID, needle, "not aligned", "4-byte", NULL);
  }
  for (int bwd = 0; bwd < 2; bwd++) {
    call c;
    valid_call(&c, &fx, h_auto);
    c.lse = (float *)((char *)fx.lse + 2);
    expect(bwd ? "backward: lse misaligned" : "forward: lse misaligned", &fx, &c, bwd, INVALID, "lse", "not aligned",
           NULL);
  }
}

/* The converse: gradients written as slices of one packed [b, s, 3, h, d] buffer interleave without
 * sharing an element, and must be accepted (FlashAttention's qkvpacked layout). */
static void packed_gradients_accepted(void) {
  enum { S = 6 };
  float in[4][B * S * H * D], dqkv[B * S * 3 * H * D], lse[B * H * S];
  th_rng r;
  th_rng_init(&r, th_seed() + 7);
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < B * S * H * D; i++) in[t][i] = (float)th_rng_normal(&r);
  flashc_tensor q = flashc_tensor_bshd(in[0], FLASHC_F32, B, S, H, D), k = q, v = q, dout = q;
  k.data = in[1], v.data = in[2], dout.data = in[3];
  flashc_tensor o = flashc_tensor_bshd(dqkv, FLASHC_F32, B, S, H, D); /* scratch for the forward's o */
  float o_buf[B * S * H * D];
  o.data = o_buf;
  flashc_handle h;
  th_check(flashc_create(&h, "cpu-ref") == FLASHC_OK, "create cpu-ref");
  th_check(flashc_forward(h, NULL, &q, &k, &v, &o, lse) == FLASHC_OK, "packed: forward: %s", flashc_last_error());
  flashc_tensor g[3];
  for (int t = 0; t < 3; t++) {
    g[t] = flashc_tensor_bshd(dqkv + t * H * D, FLASHC_F32, B, S, H, D);
    g[t].stride[0] = S * 3 * H * D, g[t].stride[1] = 3 * H * D;
  }
  flashc_status st = flashc_backward(h, NULL, &q, &k, &v, &o, lse, &dout, &g[0], &g[1], &g[2]);
  th_check(st == FLASHC_OK, "packed dq/dk/dv slices of one buffer are accepted: %s", flashc_last_error());
  flashc_destroy(h);
}

static void dtypes(void) {
  call c;
  valid_call(&c, &fx, h_auto);
  c.k.dtype = FLASHC_F16;
  expect("forward: k f16, q f32", &fx, &c, 0, INVALID, "k.dtype", "f16", "f32", NULL);
  valid_call(&c, &fx, h_auto);
  c.dv.dtype = FLASHC_BF16;
  expect("backward: dv bf16, q f32", &fx, &c, 1, INVALID, "dv.dtype", "bf16", NULL);
  valid_call(&c, &fx, h_auto);
  c.q.dtype = (flashc_dtype)7;
  expect("forward: q.dtype 7", &fx, &c, 0, INVALID, "q.dtype", "7", NULL);
  valid_call(&c, &fx, h_auto);
  c.o.dtype = (flashc_dtype)-1;
  expect("forward: o.dtype -1", &fx, &c, 0, INVALID, "o.dtype", "-1", NULL);
}

static void params(void) {
  call c;
  valid_call(&c, &fx, h_auto);
  c.params.causal = 2;
  expect("forward: causal 2", &fx, &c, 0, INVALID, "causal", "2", NULL);
  valid_call(&c, &fx, h_auto);
  c.params.align = (flashc_causal_align)5;
  expect("forward: align 5", &fx, &c, 0, INVALID, "align", "5", NULL);
  valid_call(&c, &fx, h_auto);
  c.params.deterministic = 3;
  expect("backward: deterministic 3", &fx, &c, 1, INVALID, "deterministic", "3", NULL);
  valid_call(&c, &fx, h_auto);
  c.params.num_splits = -1;
  expect("forward: num_splits -1", &fx, &c, 0, INVALID, "num_splits", "-1", NULL);
  c.params.num_splits = INT_MIN;
  expect("backward: num_splits INT_MIN", &fx, &c, 1, INVALID, "num_splits", "-2147483648", NULL);
  float bad[3] = {NAN, INFINITY, -INFINITY};
  const char *names[3] = {"NaN", "inf", "-inf"};
  for (int i = 0; i < 3; i++) {
    char what[64];
    valid_call(&c, &fx, h_auto);
    c.params.scale = bad[i];
    snprintf(what, sizeof what, "forward: scale %s", names[i]);
    expect(what, &fx, &c, 0, INVALID, "scale", "not finite", NULL);
  }
}

/* Packed tensors of 6 query rows and 7 key rows in two sequences. */
static void varlen(th_rng *r) {
  fixture f;
  memset(&f, 0, sizeof f);
  f.dtype = FLASHC_F32;
  f.q = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 6, H, D);
  f.o = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 6, H, D);
  f.dout = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 6, H, D);
  f.dq = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 6, H, D);
  f.k = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 7, H, D);
  f.v = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 7, H, D);
  f.dk = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 7, H, D);
  f.dv = th_tensor_new(FLASHC_F32, TH_BSHD, 1, 7, H, D);
  th_fill_normal(&f.q, r), th_fill_normal(&f.k, r), th_fill_normal(&f.v, r), th_fill_normal(&f.dout, r);
  th_fill_normal(&f.o, r);
  const th_tensor *in[5] = {&f.q, &f.k, &f.v, &f.dout, &f.o};
  for (int i = 0; i < 5; i++) {
    f.saved[i] = malloc(in[i]->alloc_bytes);
    if (!f.saved[i]) abort();
    memcpy(f.saved[i], in[i]->alloc, in[i]->alloc_bytes);
  }
  int32_t cq[] = {0, 2, 6}, ck[] = {0, 3, 7};
  call c;
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = cq, c.params.num_seqs = 2;
  expect("varlen: only cu_seqlens_q set", &f, &c, 0, INVALID, "cu_seqlens_k is NULL", NULL);
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_k = ck, c.params.num_seqs = 2;
  expect("varlen: only cu_seqlens_k set", &f, &c, 0, INVALID, "cu_seqlens_q is NULL", NULL);

  int32_t c0[] = {1, 2, 6};
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = c0, c.params.cu_seqlens_k = ck, c.params.num_seqs = 2;
  expect("varlen: cu_seqlens_q[0] = 1", &f, &c, 0, INVALID, "cu_seqlens_q[0] is 1", NULL);
  int32_t dec[] = {0, 4, 3, 7};
  int32_t cq3[] = {0, 2, 4, 6};
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = cq3, c.params.cu_seqlens_k = dec, c.params.num_seqs = 3;
  expect("varlen: cu_seqlens_k decreases", &f, &c, 0, INVALID, "cu_seqlens_k", "decreases", "index 2", NULL);
  int32_t last[] = {0, 2, 5};
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = last, c.params.cu_seqlens_k = ck, c.params.num_seqs = 2;
  expect("varlen: cu_seqlens_q ends at 5 of 6 rows", &f, &c, 0, INVALID, "cu_seqlens_q[2] is 5", "6 rows", NULL);
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = cq, c.params.cu_seqlens_k = ck, c.params.num_seqs = 0;
  expect("varlen: num_seqs 0", &f, &c, 0, INVALID, "num_seqs is 0", NULL);
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = cq, c.params.cu_seqlens_k = ck, c.params.num_seqs = -3;
  expect("varlen: num_seqs -3", &f, &c, 0, INVALID, "num_seqs is -3", NULL);
  valid_call(&c, &f, h_auto);
  c.params.cu_seqlens_q = cq, c.params.cu_seqlens_k = ck, c.params.num_seqs = 2;
  /* batch 2 of 3 rows each: the same memory, described as two batches */
  c.q.size[0] = c.o.size[0] = c.dout.size[0] = c.dq.size[0] = 2;
  c.q.size[1] = c.o.size[1] = c.dout.size[1] = c.dq.size[1] = 3;
  c.k.size[0] = c.v.size[0] = c.dk.size[0] = c.dv.size[0] = 2;
  c.k.size[1] = c.v.size[1] = c.dk.size[1] = c.dv.size[1] = 3;
  expect("varlen: batch 2", &f, &c, 1, INVALID, "batch 1", "q.size[0] is 2", NULL);
  fixture_free(&f);
}

/* What only a backend can refuse: f64 on cpu, a head_dim beyond a backend's limit. */
static void backend_limits(th_rng *r) {
  int n = flashc_backend_count();
  for (int i = 0; i < n; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || !info.usable || info.device != FLASHC_DEVICE_CPU) continue;
    flashc_handle h;
    if (!th_check(flashc_create(&h, info.name) == FLASHC_OK, "flashc_create(%s): %s", info.name, flashc_last_error()))
      continue;
    char what[96], lim[32], hd[32];
    if (!(info.dtypes & (1u << FLASHC_F64))) {
      fixture f;
      fixture_init(&f, FLASHC_F64, H, H, D, r);
      call c;
      valid_call(&c, &f, h);
      snprintf(what, sizeof what, "%s: f64", info.name);
      expect(what, &f, &c, 0, UNSUPP, "f64", info.name, NULL);
      fixture_free(&f);
    }
    /* head_dim 300, and one past the backend's limit when that is not 300 */
    int dims[2] = {300, info.max_head_dim + 1};
    for (int j = 0; j < 2; j++) {
      if (dims[j] <= info.max_head_dim || (j == 1 && dims[1] == 300) || dims[j] > 4096) continue;
      fixture f;
      fixture_init(&f, FLASHC_F32, H, H, dims[j], r);
      call c;
      valid_call(&c, &f, h);
      snprintf(what, sizeof what, "%s: head_dim %d (limit %d)", info.name, dims[j], info.max_head_dim);
      snprintf(hd, sizeof hd, "%d", dims[j]);
      snprintf(lim, sizeof lim, "%d", info.max_head_dim);
      expect(what, &f, &c, 0, UNSUPP, hd, lim, info.name, NULL);
      fixture_free(&f);
    }
    if (info.max_head_dim >= 300)
      printf("note %s: max_head_dim %d, so head_dim 300 is supported there\n", info.name, info.max_head_dim);
    flashc_destroy(h);
  }
}

/* The valid call itself: it runs (params NULL means the defaults). */
static void valid_calls(void) {
  call c;
  valid_call(&c, &fx, h_auto);
  c.pparams = NULL;
  if (flashc_backend_count() == 0) {
    printf("note no backend is built: the valid calls are refused as unsupported\n");
    expect("forward: valid, no backend", &fx, &c, 0, UNSUPP, "no backend", NULL);
    return;
  }
  expect("forward: params NULL (defaults)", &fx, &c, 0, FLASHC_OK, NULL);
  th_check(th_check_output(&fx.o, "o of the valid forward") == 0, "the valid forward wrote o");
  memcpy(fx.saved[4], fx.o.alloc, fx.o.alloc_bytes); /* the backward's o is now this forward's */
  valid_call(&c, &fx, h_auto);
  c.pparams = NULL;
  expect("backward: params NULL (defaults)", &fx, &c, 1, FLASHC_OK, NULL);
}

static void expect_status(const char *what, flashc_status got, flashc_status want, const char *needle1,
                          const char *needle2) {
  const char *msg = flashc_last_error();
  bool ok = th_check(got == want, "%s: status %s, expected %s (\"%s\")", what, flashc_status_string(got),
                     flashc_status_string(want), msg);
  ok &=
      th_check(!needle1 || strstr(msg, needle1), "%s: message \"%s\" lacks \"%s\"", what, msg, needle1 ? needle1 : "");
  ok &=
      th_check(!needle2 || strstr(msg, needle2), "%s: message \"%s\" lacks \"%s\"", what, msg, needle2 ? needle2 : "");
  if (ok) printf("ok   %-52s %s: %s\n", what, flashc_status_string(got), msg);
}

/* Issue row 8: the ring's host shard helpers validate their tensors as flashc_forward does (sizes, strides,
 * offsets that overflow, NULL and misaligned data, an output overlapping the input), and still move the right
 * rows. */
static void shard_helpers(void) {
  enum { W = 2, S = 8, HH = 3, DD = 4, L = S / W };
  float full[2 * S * HH * DD], part[2 * L * HH * DD], back[2 * S * HH * DD];
  for (int i = 0; i < 2 * S * HH * DD; i++) full[i] = (float)i;
  const flashc_ring_layout lay[2] = {FLASHC_RING_CONTIGUOUS, FLASHC_RING_ZIGZAG};
  for (int li = 0; li < 2; li++) {
    memset(back, 0, sizeof back);
    for (int r = 0; r < W; r++) {
      flashc_tensor tf = flashc_tensor_bshd(full, FLASHC_F32, 2, S, HH, DD);
      flashc_tensor tp = flashc_tensor_bshd(part, FLASHC_F32, 2, L, HH, DD);
      flashc_tensor tb = flashc_tensor_bshd(back, FLASHC_F32, 2, S, HH, DD);
      th_check(flashc_ring_shard(lay[li], W, r, &tf, &tp) == FLASHC_OK, "shard: %s", flashc_last_error());
      th_check(flashc_ring_unshard(lay[li], W, r, &tp, &tb) == FLASHC_OK, "unshard: %s", flashc_last_error());
    }
    th_check(memcmp(full, back, sizeof full) == 0, "shard then unshard (layout %d) gives the tensor back", li);
    float lfull[2 * HH * S], lpart[2 * HH * L], lback[2 * HH * S];
    for (int i = 0; i < 2 * HH * S; i++) lfull[i] = (float)i, lback[i] = -1.0f;
    for (int r = 0; r < W; r++) {
      th_check(flashc_ring_shard_lse(lay[li], W, r, 2, HH, S, lfull, lpart) == FLASHC_OK, "shard_lse: %s",
               flashc_last_error());
      th_check(flashc_ring_unshard_lse(lay[li], W, r, 2, HH, S, lpart, lback) == FLASHC_OK, "unshard_lse: %s",
               flashc_last_error());
    }
    th_check(memcmp(lfull, lback, sizeof lfull) == 0, "lse shard then unshard (layout %d) gives it back", li);
  }
  /* rank 1's contiguous shard is rows [L, 2L) of every batch and head */
  {
    flashc_tensor tf = flashc_tensor_bshd(full, FLASHC_F32, 2, S, HH, DD);
    flashc_tensor tp = flashc_tensor_bshd(part, FLASHC_F32, 2, L, HH, DD);
    th_check(flashc_ring_shard(FLASHC_RING_CONTIGUOUS, W, 1, &tf, &tp) == FLASHC_OK, "shard rank 1");
    th_check(part[0] == full[L * HH * DD] && part[L * HH * DD] == full[S * HH * DD + L * HH * DD],
             "rank 1's shard starts at row L of each batch");
  }

  typedef struct bad {
    const char *what;
    int field; /* 0 size, 1 stride */
    int tensor, dim;
    int64_t value;
    const char *n1, *n2;
  } bad;
  const bad cases[] = {
      {"size[3] = -1", 0, 0, 3, -1, "full.size[3]", "is -1"},
      {"batch -3", 0, 0, 0, -3, "full.size[0]", "is -3"},
      {"shard batch -3", 0, 1, 0, -3, "shard.size[0]", "is -3"},
      {"batch INT64_MAX/2", 0, 0, 0, INT64_MAX / 2, "full", "overflow"},
      {"stride[0] INT64_MAX/2", 1, 0, 0, INT64_MAX / 2, "full", "more bytes than"},
      {"shard stride[1] INT64_MAX/2", 1, 1, 1, INT64_MAX / 2, "shard", "overflow"},
      {"stride[2] -1", 1, 0, 2, -1, "full.stride[2]", "-1"},
      {"heads 0", 0, 0, 2, 0, "full.size[2]", "must be >= 1"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    for (int un = 0; un < 2; un++) {
      flashc_tensor tf = flashc_tensor_bshd(full, FLASHC_F32, 2, S, HH, DD);
      flashc_tensor tp = flashc_tensor_bshd(part, FLASHC_F32, 2, L, HH, DD);
      flashc_tensor *t = cases[i].tensor ? &tp : &tf;
      if (cases[i].field)
        t->stride[cases[i].dim] = cases[i].value;
      else
        t->size[cases[i].dim] = cases[i].value;
      if (!cases[i].field && !cases[i].tensor && cases[i].dim != 1) /* the shard's shape follows the full one's */
        tp.size[cases[i].dim] = cases[i].value;
      char what[96];
      snprintf(what, sizeof what, "flashc_ring_%sshard: %s", un ? "un" : "", cases[i].what);
      flashc_status st = un ? flashc_ring_unshard(FLASHC_RING_CONTIGUOUS, W, 0, &tp, &tf)
                            : flashc_ring_shard(FLASHC_RING_CONTIGUOUS, W, 0, &tf, &tp);
      expect_status(what, st, INVALID, cases[i].n1, cases[i].n2);
    }
  float lfull[2 * HH * S], lpart[2 * HH * L];
  expect_status("flashc_ring_shard_lse: batch INT64_MAX/2",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, INT64_MAX / 2, HH, S, lfull, lpart), INVALID,
                "flashc_ring_shard_lse", "overflow");
  expect_status("flashc_ring_shard_lse: heads INT64_MAX/2",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, INT64_MAX / 2, S, lfull, lpart), INVALID,
                "overflow", NULL);
  expect_status("flashc_ring_shard_lse: batch -1",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, -1, HH, S, lfull, lpart), INVALID, "size[0]",
                "is -1");
  expect_status("flashc_ring_unshard_lse: seqlen -4",
                flashc_ring_unshard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, HH, -4, lpart, lfull), INVALID, "size[1]",
                "is -4");
  expect_status("flashc_ring_shard_lse: heads 0",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, 0, S, lfull, lpart), INVALID, "heads",
                "must be >= 1");
  expect_status("flashc_ring_shard_lse: full NULL",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, HH, S, NULL, lpart), INVALID,
                "full.data is NULL", NULL);
  expect_status("flashc_ring_shard_lse: shard misaligned",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, HH, S, lfull, (float *)((char *)lpart + 1)),
                INVALID, "shard.data", "not aligned");
  expect_status("flashc_ring_shard_lse: shard inside full",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 2, HH, S, lfull, lfull + 4), INVALID,
                "output shard shares memory with full", NULL);
  expect_status("flashc_ring_shard_lse: batch 0, NULL pointers (nothing to move)",
                flashc_ring_shard_lse(FLASHC_RING_CONTIGUOUS, W, 0, 0, HH, S, NULL, NULL), FLASHC_OK, NULL, NULL);
  {
    flashc_tensor tf = flashc_tensor_bshd(full, FLASHC_F32, 2, S, HH, DD);
    flashc_tensor tp = flashc_tensor_bshd(full + 8, FLASHC_F32, 2, L, HH, DD);
    expect_status("flashc_ring_shard: shard inside full", flashc_ring_shard(FLASHC_RING_CONTIGUOUS, W, 0, &tf, &tp),
                  INVALID, "output shard shares memory with full", NULL);
    expect_status("flashc_ring_unshard: full is the shard struct",
                  flashc_ring_unshard(FLASHC_RING_CONTIGUOUS, 1, 0, &tf, &tf), INVALID, "same flashc_tensor", NULL);
    tp = flashc_tensor_bshd(part, FLASHC_F32, 2, L, HH, DD);
    tf.data = (char *)full + 2;
    expect_status("flashc_ring_shard: full misaligned", flashc_ring_shard(FLASHC_RING_CONTIGUOUS, W, 0, &tf, &tp),
                  INVALID, "full.data", "not aligned");
    tf = flashc_tensor_bshd(NULL, FLASHC_F32, 0, S, HH, DD), tp = flashc_tensor_bshd(NULL, FLASHC_F32, 0, L, HH, DD);
    expect_status("flashc_ring_shard: batch 0, NULL data (nothing to move)",
                  flashc_ring_shard(FLASHC_RING_ZIGZAG, W, 1, &tf, &tp), FLASHC_OK, NULL, NULL);
    expect_status("flashc_ring_shard: full NULL", flashc_ring_shard(FLASHC_RING_ZIGZAG, W, 1, NULL, &tp), INVALID,
                  "full is NULL", NULL);
  }
}

static void handles(void) {
  flashc_handle h = (flashc_handle)&h; /* not NULL: a failed create must reset it */
  expect_status("flashc_create: unknown backend", flashc_create(&h, "no-such-backend"), INVALID,
                "unknown backend 'no-such-backend'", "auto");
  th_check(h == NULL, "flashc_create: a failed create leaves *handle NULL");
  const char *msg = flashc_last_error();
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) == FLASHC_OK)
      th_check(strstr(msg, info.name) != NULL, "flashc_create: the message \"%s\" does not list backend %s", msg,
               info.name);
  }
  expect_status("flashc_create: handle pointer NULL", flashc_create(NULL, "auto"), INVALID, "handle", NULL);
  expect_status("flashc_set_threads: -1", flashc_set_threads(h_auto, -1), INVALID, "threads", "-1");
  expect_status("flashc_set_threads: handle NULL", flashc_set_threads(NULL, 1), INVALID, "handle", NULL);
  expect_status("flashc_set_stream: handle NULL", flashc_set_stream(NULL, NULL), INVALID, "handle", NULL);
  flashc_backend_info info;
  expect_status("flashc_backend_get: index -1", flashc_backend_get(-1, &info), INVALID, "-1", NULL);
  expect_status("flashc_backend_get: index count", flashc_backend_get(flashc_backend_count(), &info), INVALID, "index",
                NULL);
  expect_status("flashc_backend_get: info NULL", flashc_backend_get(0, NULL), INVALID, "info", NULL);
}

int main(void) {
  th_begin("test_errors");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  if (!th_check(flashc_create(&h_auto, "auto") == FLASHC_OK, "flashc_create(auto): %s", flashc_last_error()))
    return th_end();
  fixture_init(&fx, FLASHC_F32, H, H, D, &rng);
  null_pointers();
  shapes();
  gqa_heads(&rng);
  strides();
  aliasing();
  alignment();
  dtypes();
  params();
  varlen(&rng);
  backend_limits(&rng);
  handles();
  shard_helpers();
  valid_calls();
  packed_gradients_accepted();
  fixture_free(&fx);
  flashc_destroy(h_auto);
  return th_end();
}
