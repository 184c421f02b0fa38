/*
 * test_abi.c — the C ABI can grow: a caller compiled against an older, smaller flashc_params or
 * flashc_backend_info keeps working with this library, and a struct the library cannot read is refused.
 *
 * "Older" structs are declared here as the prefixes a previous header would have had. Each lives in a heap
 * block of exactly its size, so that a library reading or writing past it is caught by AddressSanitizer (CI
 * runs this test under ASan + UBSan), and the result of a call through it is compared with the same call
 * through today's struct.
 */
#include <flashc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* flashc_params as a header without `deterministic` had it: every field up to num_seqs. */
typedef struct old_params {
  size_t struct_size;
  float scale;
  int causal;
  flashc_causal_align align;
  int64_t window_left, window_right;
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
  int64_t num_seqs;
} old_params;

/* flashc_backend_info as a header without `why_unusable` had it. */
typedef struct old_info {
  size_t struct_size;
  const char *name, *summary;
  flashc_device device;
  int has_backward;
  unsigned dtypes;
  int min_head_dim, max_head_dim, usable;
} old_info;

_Static_assert(offsetof(flashc_params, num_seqs) == offsetof(old_params, num_seqs), "old_params is a prefix");
_Static_assert(offsetof(flashc_backend_info, usable) == offsetof(old_info, usable), "old_info is a prefix");

static void fill(float *x, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
}

/* A small f32 problem on a cpu handle: q, k, v filled from `seed`, two outputs to compare calls with. */
typedef struct small {
  size_t n; /* elements of each tensor */
  float *q, *k, *v, *o[2];
  flashc_tensor tq, tk, tv, to[2];
  flashc_handle h;
} small;

static void small_new(small *c, int64_t seqlen, int64_t head_dim, unsigned seed) {
  const int64_t B = 1, H = 2;
  c->n = (size_t)(B * seqlen * H * head_dim);
  float **x[5] = {&c->q, &c->k, &c->v, &c->o[0], &c->o[1]};
  flashc_tensor *t[5] = {&c->tq, &c->tk, &c->tv, &c->to[0], &c->to[1]};
  for (int i = 0; i < 5; i++) {
    *x[i] = malloc(c->n * sizeof(float));
    if (i < 3) fill(*x[i], c->n, seed + (unsigned)i);
    *t[i] = flashc_tensor_bshd(*x[i], FLASHC_F32, B, seqlen, H, head_dim);
  }
  th_check(flashc_create(&c->h, "cpu") == FLASHC_OK, "flashc_create: %s", flashc_last_error());
}

static void small_free(small *c) {
  flashc_destroy(c->h);
  free(c->q), free(c->k), free(c->v), free(c->o[0]), free(c->o[1]);
}

static void params_abi(void) {
  small c;
  small_new(&c, 37, 16, 1);

  flashc_params p = flashc_params_default();
  th_check(p.struct_size == sizeof(flashc_params), "flashc_params_default sets struct_size (%zu)", p.struct_size);
  p.causal = 1, p.window_left = 5, p.scale = 0.3f;
  th_check(flashc_forward(c.h, &p, &c.tq, &c.tk, &c.tv, &c.to[0], NULL) == FLASHC_OK, "forward, today's params: %s",
           flashc_last_error());

  /* An older caller: exactly its bytes on the heap; the library must not read `deterministic` past them. */
  old_params *op = malloc(sizeof *op);
  memset(op, 0, sizeof *op);
  op->struct_size = sizeof *op, op->scale = 0.3f, op->causal = 1, op->align = FLASHC_ALIGN_BOTTOM_RIGHT;
  op->window_left = 5, op->window_right = -1;
  th_check(flashc_forward(c.h, (const flashc_params *)op, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_OK,
           "forward, an older caller's params: %s", flashc_last_error());
  th_check(memcmp(c.o[0], c.o[1], c.n * sizeof(float)) == 0, "an older caller's params give the same output");

  /* Unreadable sizes: 0 (not from flashc_params_default) and larger than the library's. */
  flashc_params bad = p;
  bad.struct_size = 0;
  th_check(flashc_forward(c.h, &bad, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "flashc_params_default"),
           "struct_size 0 is refused, naming flashc_params_default (got: %s)", flashc_last_error());
  bad.struct_size = sizeof(flashc_params) + 8;
  th_check(flashc_forward(c.h, &bad, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "newer flashc.h"),
           "a larger struct_size is refused as a newer header's (got: %s)", flashc_last_error());
  small_free(&c);
  free(op);
}

/* num_splits, the last field so far: a caller whose struct ends before it gets 0 (the backend chooses), whatever
 * bytes follow its struct; a negative count from a caller that has the field is refused; backends that do not
 * split (cpu) ignore a count. */
static void num_splits_abi(void) {
  small c;
  small_new(&c, 19, 8, 4);

  flashc_params p = flashc_params_default();
  th_check(p.num_splits == 0, "flashc_params_default: num_splits 0 (got %d)", p.num_splits);
  p.causal = 1;
  th_check(flashc_forward(c.h, &p, &c.tq, &c.tk, &c.tv, &c.to[0], NULL) == FLASHC_OK, "forward: %s",
           flashc_last_error());
  p.num_splits = 7;
  th_check(flashc_forward(c.h, &p, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_OK &&
               memcmp(c.o[0], c.o[1], c.n * sizeof(float)) == 0,
           "cpu ignores num_splits 7: %s", flashc_last_error());
  p.num_splits = -1;
  th_check(flashc_forward(c.h, &p, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "num_splits"),
           "num_splits -1 is refused, naming the field (got: %s)", flashc_last_error());
  /* The same bytes from a caller whose header ends before num_splits: the -1 past its struct is not read. */
  p.struct_size = offsetof(flashc_params, num_splits);
  memset(c.o[1], 0, c.n * sizeof(float));
  th_check(flashc_forward(c.h, &p, &c.tq, &c.tk, &c.tv, &c.to[1], NULL) == FLASHC_OK &&
               memcmp(c.o[0], c.o[1], c.n * sizeof(float)) == 0,
           "a struct without num_splits gets 0, not the bytes after it: %s", flashc_last_error());
  small_free(&c);
}

static void backend_info_abi(void) {
  for (int i = 0; i < flashc_backend_count(); i++) {
    flashc_backend_info info;
    th_check(flashc_backend_get(i, &info) == FLASHC_OK, "flashc_backend_get(%d): %s", i, flashc_last_error());
    old_info *oi = malloc(sizeof *oi); /* exactly an older caller's struct: nothing may be written past it */
    oi->struct_size = sizeof *oi;
    th_check(flashc_backend_query(i, (flashc_backend_info *)oi) == FLASHC_OK, "query(%d), an older struct: %s", i,
             flashc_last_error());
    th_check(oi->struct_size == sizeof *oi && strcmp(oi->name, info.name) == 0 && oi->usable == info.usable &&
                 oi->dtypes == info.dtypes && oi->max_head_dim == info.max_head_dim,
             "query(%d) fills an older struct's fields as today's (%s)", i, info.name);
    free(oi);
  }
  flashc_backend_info info;
  info.struct_size = sizeof info + 1;
  th_check(flashc_backend_query(0, &info) == FLASHC_ERR_INVALID_ARGUMENT, "a larger struct_size is refused");
  info.struct_size = 0;
  th_check(flashc_backend_query(0, &info) == FLASHC_ERR_INVALID_ARGUMENT, "struct_size 0 is refused");
}

static void statuses(void) {
  for (int s = 0; s < FLASHC_STATUS_COUNT; s++)
    th_check(strcmp(flashc_status_string((flashc_status)s), "unknown status") != 0, "status %d has a name", s);
  th_check(strcmp(flashc_status_string(FLASHC_STATUS_COUNT), "unknown status") == 0,
           "FLASHC_STATUS_COUNT is not a status");
}

int main(void) {
  th_begin("test_abi");
  params_abi();
  num_splits_abi();
  backend_info_abi();
  statuses();
  return th_end();
}
