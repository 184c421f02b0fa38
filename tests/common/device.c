/* device.c — a backend's handle, and calls with the data where the backend needs it: host memory for CPU
 * backends; for CUDA backends a device copy of every allocation (padding included, so poison travels too),
 * outputs poisoned on the device with cudaMemset 0xFF, and the outputs copied back after the call. */
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime_api.h>
#endif

bool th_backend_open(th_backend *b, const char *name) {
  memset(b, 0, sizeof *b);
  int n = flashc_backend_count();
  for (int i = 0; i < n; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, name) == 0) {
      b->info = info;
      flashc_status s = flashc_create(&b->handle, name);
      if (s != FLASHC_OK) {
        th_fail("flashc_create(%s): %s: %s", name, flashc_status_string(s), flashc_last_error());
        return false;
      }
      return true;
    }
  }
  th_fail("backend %s is not in this build of libflashc", name);
  return false;
}

void th_backend_close(th_backend *b) {
  flashc_destroy(b->handle);
  b->handle = NULL;
}

static void poison_lse(float *lse, int64_t n) {
  if (lse) memset(lse, TH_POISON_BYTE, (size_t)n * sizeof *lse);
}

#ifdef FLASHC_TEST_CUDA
/* A device mirror of a harness tensor: same strides, same offset of the view in its allocation. */
typedef struct mirror {
  void *dev;
  size_t bytes;
  flashc_tensor view;
} mirror;

static bool cuda_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return true;
  th_fail("test harness: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
  return false;
}

/* upload: copy the host allocation; else poison the device allocation. */
static bool mirror_new(mirror *m, const void *host, size_t bytes, const flashc_tensor *view, const void *alloc,
                       bool upload) {
  memset(m, 0, sizeof *m);
  m->bytes = bytes;
  if (!cuda_ok(cudaMalloc(&m->dev, bytes), "cudaMalloc")) return false;
  bool ok = upload ? cuda_ok(cudaMemcpy(m->dev, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device")
                   : cuda_ok(cudaMemset(m->dev, TH_POISON_BYTE, bytes), "cudaMemset");
  if (view) {
    m->view = *view;
    m->view.data = (char *)m->dev + ((const char *)view->data - (const char *)alloc);
  }
  return ok;
}

static bool mirror_tensor(mirror *m, const th_tensor *t, bool upload) {
  return mirror_new(m, t->alloc, t->alloc_bytes, &t->view, t->alloc, upload);
}

static bool mirror_back(const mirror *m, void *host) {
  return m->dev && cuda_ok(cudaMemcpy(host, m->dev, m->bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

static void mirror_free(mirror *m) {
  if (m->dev) cudaFree(m->dev);
  m->dev = NULL;
}

/* The call has been enqueued; wait for it, so that a fault inside a kernel is reported here. */
static bool cuda_sync(void) { return cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the call"); }
#endif

flashc_status th_forward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                         const th_tensor *v, th_tensor *o, float *lse, int64_t lse_numel) {
  th_poison(o);
  poison_lse(lse, lse_numel);
  if (b->info.device != FLASHC_DEVICE_CUDA)
    return flashc_forward(b->handle, params, &q->view, &k->view, &v->view, &o->view, lse);
#ifdef FLASHC_TEST_CUDA
  mirror mq = {0}, mk = {0}, mv = {0}, mo = {0}, mlse = {0}; /* zeroed: a failed start frees only what it got */
  flashc_status s = FLASHC_ERR_CUDA;
  bool ok = mirror_tensor(&mq, q, true) && mirror_tensor(&mk, k, true) && mirror_tensor(&mv, v, true) &&
            mirror_tensor(&mo, o, false) &&
            (!lse || mirror_new(&mlse, NULL, (size_t)lse_numel * sizeof(float), NULL, NULL, false));
  if (ok) {
    s = flashc_forward(b->handle, params, &mq.view, &mk.view, &mv.view, &mo.view, lse ? mlse.dev : NULL);
    /* the outputs come back even from a refused call: it must not have written them */
    if (!cuda_sync() || !mirror_back(&mo, o->alloc) || (lse && !mirror_back(&mlse, lse))) s = FLASHC_ERR_CUDA;
  }
  mirror_free(&mq), mirror_free(&mk), mirror_free(&mv), mirror_free(&mo), mirror_free(&mlse);
  return s;
#else
  th_fail("backend %s needs device memory but the tests were built without CUDA", b->info.name);
  return FLASHC_ERR_CUDA;
#endif
}

flashc_status th_backward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                          const th_tensor *v, const th_tensor *o, const float *lse, int64_t lse_numel,
                          const th_tensor *dout, th_tensor *dq, th_tensor *dk, th_tensor *dv) {
  th_poison(dq), th_poison(dk), th_poison(dv);
  if (b->info.device != FLASHC_DEVICE_CUDA)
    return flashc_backward(b->handle, params, &q->view, &k->view, &v->view, &o->view, lse, &dout->view, &dq->view,
                           &dk->view, &dv->view);
#ifdef FLASHC_TEST_CUDA
  mirror mq = {0}, mk = {0}, mv = {0}, mo = {0}, mlse = {0}, mdo = {0}, mdq = {0}, mdk = {0}, mdv = {0};
  flashc_status s = FLASHC_ERR_CUDA;
  bool ok = mirror_tensor(&mq, q, true) && mirror_tensor(&mk, k, true) && mirror_tensor(&mv, v, true) &&
            mirror_tensor(&mo, o, true) &&
            (!lse || mirror_new(&mlse, lse, (size_t)lse_numel * sizeof(float), NULL, NULL, true)) &&
            mirror_tensor(&mdo, dout, true) && mirror_tensor(&mdq, dq, false) && mirror_tensor(&mdk, dk, false) &&
            mirror_tensor(&mdv, dv, false);
  if (ok) {
    s = flashc_backward(b->handle, params, &mq.view, &mk.view, &mv.view, &mo.view, lse ? mlse.dev : NULL, &mdo.view,
                        &mdq.view, &mdk.view, &mdv.view);
    if (!cuda_sync() || !mirror_back(&mdq, dq->alloc) || !mirror_back(&mdk, dk->alloc) || !mirror_back(&mdv, dv->alloc))
      s = FLASHC_ERR_CUDA;
  }
  mirror_free(&mq), mirror_free(&mk), mirror_free(&mv), mirror_free(&mo), mirror_free(&mlse);
  mirror_free(&mdo), mirror_free(&mdq), mirror_free(&mdk), mirror_free(&mdv);
  return s;
#else
  (void)lse_numel;
  th_fail("backend %s needs device memory but the tests were built without CUDA", b->info.name);
  return FLASHC_ERR_CUDA;
#endif
}

void th_results_free(th_results *r) {
  free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
  memset(r, 0, sizeof *r);
}

bool th_forward_backward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                         const th_tensor *v, th_tensor *o, float *lse, int64_t lse_numel, const th_tensor *dout,
                         th_tensor *dq, th_tensor *dk, th_tensor *dv, const char *what, th_results *r) {
  flashc_status s = flashc_forward(b->handle, params, &q->view, &k->view, &v->view, &o->view, lse);
  if (!th_check(s == FLASHC_OK, "%s forward: %s", what, flashc_last_error())) return false;
  s = flashc_backward(b->handle, params, &q->view, &k->view, &v->view, &o->view, lse, &dout->view, &dq->view, &dk->view,
                      &dv->view);
  if (!th_check(s == FLASHC_OK, "%s backward: %s", what, flashc_last_error())) return false;
  th_check_output(o, what), th_check_output(dq, what), th_check_output(dk, what), th_check_output(dv, what);
  r->o = th_dense(o), r->dq = th_dense(dq), r->dk = th_dense(dk), r->dv = th_dense(dv);
  r->lse = malloc((size_t)lse_numel * sizeof(double));
  for (int64_t x = 0; x < lse_numel; x++) r->lse[x] = lse[x];
  return true;
}
