/*
 * test_api.c — the small contracts of flashc.h: version, statuses, dtypes, tensor helpers, params defaults,
 * the backend list, handles, "auto" dispatch, and the per-thread last error.
 */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...) th_check((cond), __VA_ARGS__)

static void version(void) {
  CHECK(flashc_version() == FLASHC_VERSION, "flashc_version() %d, header FLASHC_VERSION %d", flashc_version(),
        FLASHC_VERSION);
  CHECK(FLASHC_VERSION == FLASHC_VERSION_MAJOR * 1000000 + FLASHC_VERSION_MINOR * 1000 + FLASHC_VERSION_PATCH,
        "FLASHC_VERSION is MAJOR·1e6 + MINOR·1e3 + PATCH");
  CHECK(FLASHC_VERSION_CODE(1, 0, 0) > FLASHC_VERSION_CODE(0, 999, 999), "version codes order as versions do");
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", FLASHC_VERSION_MAJOR, FLASHC_VERSION_MINOR, FLASHC_VERSION_PATCH);
  CHECK(strcmp(flashc_version_string(), want) == 0, "flashc_version_string() \"%s\", expected \"%s\"",
        flashc_version_string(), want);
  printf("ok   version %s (%d)\n", flashc_version_string(), flashc_version());
}

static void statuses(void) {
  const char *seen[7];
  for (int s = 0; s <= FLASHC_ERR_INTERNAL; s++) {
    const char *str = flashc_status_string((flashc_status)s);
    CHECK(str && *str, "flashc_status_string(%d) is empty", s);
    seen[s] = str ? str : "";
    for (int t = 0; t < s; t++)
      CHECK(strcmp(seen[t], seen[s]) != 0, "statuses %d and %d share the string \"%s\"", t, s, seen[s]);
  }
  CHECK(strcmp(flashc_status_string(FLASHC_OK), "ok") == 0, "FLASHC_OK is \"ok\"");
  CHECK(strcmp(flashc_status_string(FLASHC_ERR_INVALID_ARGUMENT), "invalid argument") == 0,
        "FLASHC_ERR_INVALID_ARGUMENT is \"invalid argument\"");
  CHECK(strcmp(flashc_status_string(FLASHC_ERR_UNSUPPORTED), "unsupported") == 0,
        "FLASHC_ERR_UNSUPPORTED is \"unsupported\"");
  const char *unknown = flashc_status_string((flashc_status)99);
  CHECK(unknown != NULL && *unknown, "flashc_status_string(99) is not NULL or empty");
  printf("ok   statuses: %s / %s / %s / %s / %s / %s / %s; 99: %s\n", seen[0], seen[1], seen[2], seen[3], seen[4],
         seen[5], seen[6], unknown ? unknown : "(null)");
}

static void dtypes(void) {
  const char *names[4] = {"f32", "f16", "bf16", "f64"};
  size_t sizes[4] = {4, 2, 2, 8};
  for (int d = 0; d < 4; d++) {
    const char *n = flashc_dtype_name((flashc_dtype)d);
    CHECK(n && strcmp(n, names[d]) == 0, "flashc_dtype_name(%d) is \"%s\", expected \"%s\"", d, n ? n : "(null)",
          names[d]);
    CHECK(flashc_dtype_size((flashc_dtype)d) == sizes[d], "flashc_dtype_size(%s) is %zu", names[d],
          flashc_dtype_size((flashc_dtype)d));
  }
  CHECK(flashc_dtype_name((flashc_dtype)4) == NULL, "flashc_dtype_name(4) is NULL");
  CHECK(flashc_dtype_size((flashc_dtype)4) == 0, "flashc_dtype_size(4) is 0");
  printf("ok   dtypes f32/f16/bf16/f64 of 4/2/2/8 bytes; unknown: NULL, 0\n");
}

static void tensors(void) {
  double x;
  flashc_tensor a = flashc_tensor_bshd(&x, FLASHC_BF16, 2, 3, 5, 7);
  int64_t want_a[4] = {3 * 5 * 7, 5 * 7, 7, 1};
  flashc_tensor b = flashc_tensor_bhsd(&x, FLASHC_F16, 2, 3, 5, 7);
  int64_t want_b[4] = {5 * 3 * 7, 7, 3 * 7, 1};
  int64_t sizes[4] = {2, 3, 5, 7};
  for (int d = 0; d < 4; d++) {
    CHECK(a.size[d] == sizes[d] && b.size[d] == sizes[d], "tensor size[%d]", d);
    CHECK(a.stride[d] == want_a[d], "bshd stride[%d] is %lld, expected %lld", d, (long long)a.stride[d],
          (long long)want_a[d]);
    CHECK(b.stride[d] == want_b[d], "bhsd stride[%d] is %lld, expected %lld", d, (long long)b.stride[d],
          (long long)want_b[d]);
  }
  CHECK(a.data == &x && b.data == &x && a.dtype == FLASHC_BF16 && b.dtype == FLASHC_F16, "tensor data and dtype");
  printf("ok   flashc_tensor_bshd strides {105, 35, 7, 1}, flashc_tensor_bhsd {105, 7, 21, 1} for [2, 3, 5, 7]\n");
}

static void params(void) {
  flashc_params p = flashc_params_default();
  CHECK(p.scale == 0.0f && p.causal == 0 && p.align == FLASHC_ALIGN_BOTTOM_RIGHT && p.window_left == -1 &&
            p.window_right == -1 && p.cu_seqlens_q == NULL && p.cu_seqlens_k == NULL && p.num_seqs == 0 &&
            p.deterministic == 0,
        "flashc_params_default: scale 0, not causal, bottom-right, window (-1, -1), dense, not deterministic");
  printf("ok   params defaults\n");
}

static void backends(void) {
  int n = flashc_backend_count();
  CHECK(n >= 2, "flashc_backend_count() is %d; cpu-ref and cpu at least", n);
  bool has_ref = false, has_cpu = false;
  const char *names[64];
  for (int i = 0; i < n && i < 64; i++) {
    flashc_backend_info info;
    memset(&info, 0, sizeof info);
    if (!CHECK(flashc_backend_get(i, &info) == FLASHC_OK, "flashc_backend_get(%d): %s", i, flashc_last_error()))
      continue;
    names[i] = info.name ? info.name : "";
    CHECK(info.name && *info.name, "backend %d has no name", i);
    CHECK(info.summary && *info.summary, "backend %s has no summary", names[i]);
    for (int j = 0; j < i; j++) CHECK(strcmp(names[j], names[i]) != 0, "backend name %s appears twice", names[i]);
    CHECK(info.why_unusable != NULL, "backend %s: why_unusable is NULL", names[i]);
    if (info.usable)
      CHECK(info.why_unusable && info.why_unusable[0] == '\0', "usable backend %s has why_unusable \"%s\"", names[i],
            info.why_unusable ? info.why_unusable : "");
    else
      CHECK(info.why_unusable && info.why_unusable[0] != '\0', "unusable backend %s does not say why", names[i]);
    CHECK(info.min_head_dim >= 1 && info.min_head_dim <= info.max_head_dim, "backend %s: head dims [%d, %d]", names[i],
          info.min_head_dim, info.max_head_dim);
    CHECK(info.dtypes != 0 && (info.dtypes & ~0xfu) == 0, "backend %s: dtypes 0x%x", names[i], info.dtypes);
    CHECK(info.device == FLASHC_DEVICE_CPU || info.device == FLASHC_DEVICE_CUDA, "backend %s: device %d", names[i],
          (int)info.device);
    if (strcmp(names[i], "cpu-ref") == 0) {
      has_ref = true;
      CHECK(info.usable && info.device == FLASHC_DEVICE_CPU && info.has_backward && info.dtypes == 0xfu,
            "cpu-ref: usable, on the CPU, with backward, every dtype");
    }
    if (strcmp(names[i], "cpu") == 0) {
      has_cpu = true;
      unsigned low = (1u << FLASHC_F32) | (1u << FLASHC_F16) | (1u << FLASHC_BF16);
      CHECK(info.usable && info.device == FLASHC_DEVICE_CPU && info.has_backward && (info.dtypes & low) == low,
            "cpu: usable, on the CPU, with backward, f32/f16/bf16");
      CHECK(info.max_head_dim >= 256, "cpu: max_head_dim %d; FlashAttention's head dims go to 256", info.max_head_dim);
    }
    printf("ok   backend %d: %-12s %-4s bwd %d dtypes 0x%x head_dim [%d, %d] %s%s\n", i, names[i],
           info.device == FLASHC_DEVICE_CUDA ? "cuda" : "cpu", info.has_backward, info.dtypes, info.min_head_dim,
           info.max_head_dim, info.usable ? "usable" : "unusable: ", info.why_unusable ? info.why_unusable : "");
  }
  CHECK(has_ref, "backend cpu-ref is missing");
  CHECK(has_cpu, "backend cpu is missing");
  /* best first: cpu before cpu-ref (auto must prefer the fast one) */
  int iref = -1, icpu = -1;
  for (int i = 0; i < n && i < 64; i++) {
    if (strcmp(names[i], "cpu-ref") == 0) iref = i;
    if (strcmp(names[i], "cpu") == 0) icpu = i;
  }
  CHECK(iref < 0 || icpu < 0 || icpu < iref, "cpu (%d) comes before cpu-ref (%d) in the best-first order", icpu, iref);
}

static void handles(void) {
  flashc_handle h = NULL;
  CHECK(flashc_create(&h, NULL) == FLASHC_OK && h, "flashc_create(NULL name): %s", flashc_last_error());
  CHECK(strcmp(flashc_handle_backend(h), "auto") == 0, "a handle created with NULL is \"auto\", not \"%s\"",
        flashc_handle_backend(h));
  CHECK(strcmp(flashc_handle_last_backend(h), "") == 0, "last backend before any call is \"\"");
  CHECK(flashc_set_threads(h, 0) == FLASHC_OK && flashc_set_threads(h, 1) == FLASHC_OK &&
            flashc_set_threads(h, 2) == FLASHC_OK,
        "flashc_set_threads 0, 1, 2");
  CHECK(flashc_set_stream(h, NULL) == FLASHC_OK, "flashc_set_stream(NULL)");
  CHECK(flashc_destroy(h) == FLASHC_OK, "flashc_destroy");
  CHECK(flashc_destroy(NULL) == FLASHC_OK, "flashc_destroy(NULL) is fine");
  CHECK(strcmp(flashc_handle_backend(NULL), "") == 0 && strcmp(flashc_handle_last_backend(NULL), "") == 0,
        "flashc_handle_backend/last_backend(NULL) are \"\"");
  int n = flashc_backend_count();
  for (int i = 0; i < n; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK) continue;
    flashc_status s = flashc_create(&h, info.name);
    if (info.usable) {
      if (CHECK(s == FLASHC_OK, "flashc_create(%s): %s", info.name, flashc_last_error())) {
        CHECK(strcmp(flashc_handle_backend(h), info.name) == 0, "handle of %s reports \"%s\"", info.name,
              flashc_handle_backend(h));
        flashc_destroy(h);
      }
    } else {
      CHECK(s == FLASHC_ERR_UNSUPPORTED && strstr(flashc_last_error(), info.name),
            "flashc_create(%s) on an unusable backend: %s: \"%s\"", info.name, flashc_status_string(s),
            flashc_last_error());
    }
  }
  printf("ok   handles: create, threads, stream, destroy, one per backend\n");
}

/* "auto" on host memory: cpu for f32/f16/bf16 (the best CPU backend), cpu-ref for f64. */
static void auto_dispatch(th_rng *r) {
  flashc_handle h;
  if (!CHECK(flashc_create(&h, "auto") == FLASHC_OK, "flashc_create(auto): %s", flashc_last_error())) return;
  flashc_dtype dts[2] = {FLASHC_F32, FLASHC_F64};
  const char *want[2] = {"cpu", "cpu-ref"};
  for (int i = 0; i < 2; i++) {
    th_tensor q = th_tensor_new(dts[i], TH_BSHD, 1, 9, 2, 16), k = th_tensor_new(dts[i], TH_BSHD, 1, 11, 2, 16);
    th_tensor v = th_tensor_new(dts[i], TH_BSHD, 1, 11, 2, 16), o = th_tensor_new(dts[i], TH_BSHD, 1, 9, 2, 16);
    th_tensor dq = th_tensor_new(dts[i], TH_BSHD, 1, 9, 2, 16), dk = th_tensor_new(dts[i], TH_BSHD, 1, 11, 2, 16);
    th_tensor dv = th_tensor_new(dts[i], TH_BSHD, 1, 11, 2, 16), dout = th_tensor_new(dts[i], TH_BSHD, 1, 9, 2, 16);
    th_fill_normal(&q, r), th_fill_normal(&k, r), th_fill_normal(&v, r), th_fill_normal(&dout, r);
    float lse[2 * 9];
    flashc_status s = flashc_forward(h, NULL, &q.view, &k.view, &v.view, &o.view, lse);
    if (CHECK(s == FLASHC_OK, "auto forward %s: %s", flashc_dtype_name(dts[i]), flashc_last_error()))
      CHECK(strcmp(flashc_handle_last_backend(h), want[i]) == 0,
            "auto forward %s on host memory ran \"%s\", expected %s", flashc_dtype_name(dts[i]),
            flashc_handle_last_backend(h), want[i]);
    s = flashc_backward(h, NULL, &q.view, &k.view, &v.view, &o.view, lse, &dout.view, &dq.view, &dk.view, &dv.view);
    if (CHECK(s == FLASHC_OK, "auto backward %s: %s", flashc_dtype_name(dts[i]), flashc_last_error()))
      CHECK(strcmp(flashc_handle_last_backend(h), want[i]) == 0, "auto backward %s ran \"%s\", expected %s",
            flashc_dtype_name(dts[i]), flashc_handle_last_backend(h), want[i]);
    CHECK(strcmp(flashc_handle_backend(h), "auto") == 0, "the handle still says auto");
    th_tensor *ts[8] = {&q, &k, &v, &o, &dq, &dk, &dv, &dout};
    for (int j = 0; j < 8; j++) th_tensor_free(ts[j]);
  }
  flashc_destroy(h);
  printf("ok   auto on host memory runs cpu for f32 and cpu-ref for f64\n");
}

/* The last error belongs to the thread that made it. */
static void *other_thread(void *arg) {
  const char **out = arg;
  *out = strdup(flashc_last_error());
  flashc_set_threads(NULL, 1); /* an error of this thread only */
  return NULL;
}

static void last_error_per_thread(void) {
  flashc_set_threads(NULL, 1);
  char mine[256];
  snprintf(mine, sizeof mine, "%s", flashc_last_error());
  CHECK(strstr(mine, "flashc_set_threads") != NULL, "the last error names the failed call: \"%s\"", mine);
  const char *theirs = NULL;
  pthread_t t;
  if (!CHECK(pthread_create(&t, NULL, other_thread, &theirs) == 0, "pthread_create")) return;
  pthread_join(t, NULL);
  CHECK(theirs && theirs[0] == '\0', "a new thread sees an empty last error, not \"%s\"", theirs ? theirs : "(null)");
  CHECK(strcmp(flashc_last_error(), mine) == 0, "another thread's error did not replace this thread's");
  free((void *)theirs);
  printf("ok   the last error is per thread\n");
}

int main(void) {
  th_begin("test_api");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  version();
  statuses();
  dtypes();
  tensors();
  params();
  backends();
  handles();
  auto_dispatch(&rng);
  last_error_per_thread();
  return th_end();
}
