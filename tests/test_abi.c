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

static void params_abi(void) {
  enum { B = 1, S = 37, H = 2, D = 16 };
  const size_t n = (size_t)B * S * H * D;
  float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  float *o_new = malloc(n * sizeof(float)), *o_old = malloc(n * sizeof(float));
  fill(q, n, 1), fill(k, n, 2), fill(v, n, 3);
  flashc_handle h;
  th_check(flashc_create(&h, "cpu") == FLASHC_OK, "flashc_create: %s", flashc_last_error());
  flashc_tensor tq = flashc_tensor_bshd(q, FLASHC_F32, B, S, H, D), tk = flashc_tensor_bshd(k, FLASHC_F32, B, S, H, D);
  flashc_tensor tv = flashc_tensor_bshd(v, FLASHC_F32, B, S, H, D);
  flashc_tensor to_new = flashc_tensor_bshd(o_new, FLASHC_F32, B, S, H, D);
  flashc_tensor to_old = flashc_tensor_bshd(o_old, FLASHC_F32, B, S, H, D);

  flashc_params p = flashc_params_default();
  th_check(p.struct_size == sizeof(flashc_params), "flashc_params_default sets struct_size (%zu)", p.struct_size);
  p.causal = 1, p.window_left = 5, p.scale = 0.3f;
  th_check(flashc_forward(h, &p, &tq, &tk, &tv, &to_new, NULL) == FLASHC_OK, "forward, today's params: %s",
           flashc_last_error());

  /* An older caller: exactly its bytes on the heap; the library must not read `deterministic` past them. */
  old_params *op = malloc(sizeof *op);
  memset(op, 0, sizeof *op);
  op->struct_size = sizeof *op, op->scale = 0.3f, op->causal = 1, op->align = FLASHC_ALIGN_BOTTOM_RIGHT;
  op->window_left = 5, op->window_right = -1;
  th_check(flashc_forward(h, (const flashc_params *)op, &tq, &tk, &tv, &to_old, NULL) == FLASHC_OK,
           "forward, an older caller's params: %s", flashc_last_error());
  th_check(memcmp(o_new, o_old, n * sizeof(float)) == 0, "an older caller's params give the same output");

  /* Unreadable sizes: 0 (not from flashc_params_default) and larger than the library's. */
  flashc_params bad = p;
  bad.struct_size = 0;
  th_check(flashc_forward(h, &bad, &tq, &tk, &tv, &to_old, NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "flashc_params_default"),
           "struct_size 0 is refused, naming flashc_params_default (got: %s)", flashc_last_error());
  bad.struct_size = sizeof(flashc_params) + 8;
  th_check(flashc_forward(h, &bad, &tq, &tk, &tv, &to_old, NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "newer flashc.h"),
           "a larger struct_size is refused as a newer header's (got: %s)", flashc_last_error());
  flashc_destroy(h);
  free(op), free(q), free(k), free(v), free(o_new), free(o_old);
}

/* num_splits, the last field so far: a caller whose struct ends before it gets 0 (the backend chooses), whatever
 * bytes follow its struct; a negative count from a caller that has the field is refused; backends that do not
 * split (cpu) ignore a count. */
static void num_splits_abi(void) {
  enum { B = 1, S = 19, H = 2, D = 8 };
  const size_t n = (size_t)B * S * H * D;
  float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
  float *o0 = malloc(n * sizeof(float)), *o1 = malloc(n * sizeof(float));
  fill(q, n, 4), fill(k, n, 5), fill(v, n, 6);
  flashc_handle h;
  th_check(flashc_create(&h, "cpu") == FLASHC_OK, "flashc_create: %s", flashc_last_error());
  flashc_tensor tq = flashc_tensor_bshd(q, FLASHC_F32, B, S, H, D), tk = flashc_tensor_bshd(k, FLASHC_F32, B, S, H, D);
  flashc_tensor tv = flashc_tensor_bshd(v, FLASHC_F32, B, S, H, D);
  flashc_tensor t0 = flashc_tensor_bshd(o0, FLASHC_F32, B, S, H, D),
                t1 = flashc_tensor_bshd(o1, FLASHC_F32, B, S, H, D);

  flashc_params p = flashc_params_default();
  th_check(p.num_splits == 0, "flashc_params_default: num_splits 0 (got %d)", p.num_splits);
  p.causal = 1;
  th_check(flashc_forward(h, &p, &tq, &tk, &tv, &t0, NULL) == FLASHC_OK, "forward: %s", flashc_last_error());
  p.num_splits = 7;
  th_check(flashc_forward(h, &p, &tq, &tk, &tv, &t1, NULL) == FLASHC_OK && memcmp(o0, o1, n * sizeof(float)) == 0,
           "cpu ignores num_splits 7: %s", flashc_last_error());
  p.num_splits = -1;
  th_check(flashc_forward(h, &p, &tq, &tk, &tv, &t1, NULL) == FLASHC_ERR_INVALID_ARGUMENT &&
               strstr(flashc_last_error(), "num_splits"),
           "num_splits -1 is refused, naming the field (got: %s)", flashc_last_error());
  /* The same bytes from a caller whose header ends before num_splits: the -1 past its struct is not read. */
  p.struct_size = offsetof(flashc_params, num_splits);
  memset(o1, 0, n * sizeof(float));
  th_check(flashc_forward(h, &p, &tq, &tk, &tv, &t1, NULL) == FLASHC_OK && memcmp(o0, o1, n * sizeof(float)) == 0,
           "a struct without num_splits gets 0, not the bytes after it: %s", flashc_last_error());
  flashc_destroy(h);
  free(q), free(k), free(v), free(o0), free(o1);
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
