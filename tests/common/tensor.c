/* tensor.c — tensors the harness owns, in several layouts, with poison everywhere outside the view. */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *th_layout_name(th_layout layout) {
  switch (layout) {
  case TH_BSHD: return "bshd";
  case TH_BHSD: return "bhsd";
  case TH_STRIDED: return "strided";
  case TH_LAYOUT_COUNT: break;
  }
  return "?";
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "test harness: out of memory (%zu bytes)\n", n);
    abort(); /* the harness, not the library: nothing sensible is left to test */
  }
  return p;
}

int64_t th_index(const flashc_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
  return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
}

int64_t th_numel(const flashc_tensor *t) { return t->size[0] * t->size[1] * t->size[2] * t->size[3]; }

th_tensor th_tensor_new(flashc_dtype dtype, th_layout layout, int64_t batch, int64_t seqlen, int64_t heads,
                        int64_t head_dim) {
  th_tensor t;
  memset(&t, 0, sizeof t);
  int64_t B = batch, S = seqlen, H = heads, D = head_dim, lead = 0, tail = 0;
  int64_t st[4];
  switch (layout) {
  case TH_BHSD: st[0] = H * S * D, st[1] = D, st[2] = S * D, st[3] = 1; break;
  case TH_STRIDED:
    /* Heads outermost, then batch, then rows, each level padded by an odd count so that no stride is a
     * product of the sizes and a kernel that assumes contiguity reads poison. */
    st[3] = 1;
    st[1] = D + 3;
    st[0] = S * st[1] + 5;
    st[2] = B * st[0] + 7;
    lead = 11;
    tail = 13;
    break;
  default: /* TH_BSHD */ st[0] = S * H * D, st[1] = H * D, st[2] = D, st[3] = 1; break;
  }
  int64_t last = (B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + (D - 1);
  size_t es = flashc_dtype_size(dtype);
  t.alloc_elems = lead + last + 1 + tail;
  t.alloc_bytes = (size_t)t.alloc_elems * es;
  t.alloc = xmalloc(t.alloc_bytes);
  memset(t.alloc, TH_POISON_BYTE, t.alloc_bytes);
  t.view.data = (char *)t.alloc + (size_t)lead * es;
  t.view.dtype = dtype;
  t.view.size[0] = B, t.view.size[1] = S, t.view.size[2] = H, t.view.size[3] = D;
  memcpy(t.view.stride, st, sizeof st);
  t.in_view = xmalloc((size_t)t.alloc_elems);
  memset(t.in_view, 0, (size_t)t.alloc_elems);
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++)
      for (int64_t h = 0; h < H; h++)
        for (int64_t d = 0; d < D; d++) t.in_view[lead + th_index(&t.view, b, s, h, d)] = 1;
  return t;
}

void th_tensor_free(th_tensor *t) {
  free(t->alloc);
  free(t->in_view);
  memset(t, 0, sizeof *t);
}

void th_poison(th_tensor *t) { memset(t->alloc, TH_POISON_BYTE, t->alloc_bytes); }

void th_fill_normal(th_tensor *t, th_rng *r) {
  th_poison(t);
  const flashc_tensor *v = &t->view;
  for (int64_t b = 0; b < v->size[0]; b++)
    for (int64_t s = 0; s < v->size[1]; s++)
      for (int64_t h = 0; h < v->size[2]; h++)
        for (int64_t d = 0; d < v->size[3]; d++) {
          double x;
          do x = th_round(v->dtype, th_rng_normal(r));
          while (x == 0.0);
          th_store(v->data, v->dtype, th_index(v, b, s, h, d), x);
        }
}

double *th_dense(const th_tensor *t) {
  const flashc_tensor *v = &t->view;
  double *x = xmalloc((size_t)th_numel(v) * sizeof *x);
  int64_t n = 0;
  for (int64_t b = 0; b < v->size[0]; b++)
    for (int64_t s = 0; s < v->size[1]; s++)
      for (int64_t h = 0; h < v->size[2]; h++)
        for (int64_t d = 0; d < v->size[3]; d++) x[n++] = th_load(v->data, v->dtype, th_index(v, b, s, h, d));
  return x;
}

th_tensor th_tensor_from_dense(flashc_dtype dtype, const double *x, int64_t batch, int64_t seqlen, int64_t heads,
                               int64_t head_dim) {
  th_tensor t = th_tensor_new(dtype, TH_BSHD, batch, seqlen, heads, head_dim);
  int64_t n = th_numel(&t.view);
  for (int64_t i = 0; i < n; i++) th_store(t.view.data, dtype, i, x[i]);
  return t;
}

static bool is_poison(const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++)
    if (c[i] != TH_POISON_BYTE) return false;
  return true;
}

int64_t th_check_output(const th_tensor *t, const char *what) {
  const flashc_tensor *v = &t->view;
  size_t es = flashc_dtype_size(v->dtype);
  int64_t unwritten = 0, nonfinite = 0, outside = 0;
  for (int64_t b = 0; b < v->size[0]; b++)
    for (int64_t s = 0; s < v->size[1]; s++)
      for (int64_t h = 0; h < v->size[2]; h++)
        for (int64_t d = 0; d < v->size[3]; d++) {
          int64_t i = th_index(v, b, s, h, d);
          if (is_poison((const char *)v->data + (size_t)i * es, es)) {
            if (unwritten++ < 3)
              th_fail("%s[%lld,%lld,%lld,%lld] holds the poison bit pattern (never written, or a NaN "
                      "computed from poison read outside an input's view)",
                      what, (long long)b, (long long)s, (long long)h, (long long)d);
          } else if (!isfinite(th_load(v->data, v->dtype, i))) {
            if (nonfinite++ < 3)
              th_fail("%s[%lld,%lld,%lld,%lld] is %g", what, (long long)b, (long long)s, (long long)h, (long long)d,
                      th_load(v->data, v->dtype, i));
          }
        }
  for (int64_t i = 0; i < t->alloc_elems; i++)
    if (!t->in_view[i] && !is_poison((const char *)t->alloc + (size_t)i * es, es))
      if (outside++ < 3)
        th_fail("%s: element %lld of the allocation, outside the view, was written", what, (long long)i);
  if (unwritten > 3 || nonfinite > 3 || outside > 3)
    th_fail("%s: %lld unwritten, %lld non-finite, %lld written outside the view in all", what, (long long)unwritten,
            (long long)nonfinite, (long long)outside);
  return unwritten + nonfinite + outside;
}

bool th_all_poison(const th_tensor *t) { return is_poison(t->alloc, t->alloc_bytes); }
