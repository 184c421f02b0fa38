/* common/runtime.cu — the CUDA side of the library that is not a kernel: errors to statuses, device discovery,
 * where a pointer lives, and the handle's device workspace. */
#include "common/common.cuh"

#include <dlfcn.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

extern "C" flashc_status fc_cuda_error(cudaError_t e, const char *what, const char *file, int line) {
  const char *base = strrchr(file, '/');
  flashc_status s = e == cudaErrorMemoryAllocation ? FLASHC_ERR_OUT_OF_MEMORY : FLASHC_ERR_CUDA;
  return fc_error(s, "%s failed at %s:%d: %s (%s)", what, base ? base + 1 : file, line, cudaGetErrorString(e),
                  cudaGetErrorName(e));
}

/* -1 unknown, 0 no device, 1 devices present: the answer does not change while the process runs. */
static int device_state = -1;
static char device_why[160];

extern "C" bool fc_cuda_usable(char *why, size_t len) {
  if (device_state < 0) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      cudaGetLastError(); /* clear it: this is an answer, not a failure */
      /* The runtime says "driver version is insufficient" also where there is no driver at all. */
      void *driver = e == cudaErrorInsufficientDriver ? dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) : NULL;
      if (driver) dlclose(driver);
      snprintf(device_why, sizeof device_why, "no CUDA device (%s)",
               e == cudaErrorInsufficientDriver && !driver ? "no CUDA driver / no GPU: libcuda.so.1 not found"
               : e != cudaSuccess                          ? cudaGetErrorString(e)
                                                           : "0 devices");
      device_state = 0;
    } else {
      device_state = 1;
    }
  }
  if (!device_state && why) snprintf(why, len, "%s", device_why);
  return device_state == 1;
}

/* Launched never: its attributes tell which image of the device code a device runs (fc_device_props.code_sm). */
__global__ void fc_image_probe_kernel(void) {}

extern "C" flashc_status fc_device_get_props(fc_device_props *out) {
  enum { MAX_DEVICES = 64 };
  static fc_device_props cache[MAX_DEVICES];
  static int cached[MAX_DEVICES];
  int dev = 0;
  FC_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < MAX_DEVICES && cached[dev]) {
    *out = cache[dev];
    return FLASHC_OK;
  }
  cudaDeviceProp prop;
  FC_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  fc_device_props p;
  p.device = dev;
  p.sm = prop.major * 10 + prop.minor;
  p.num_sms = prop.multiProcessorCount;
  p.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  p.smem_per_sm = prop.sharedMemPerMultiprocessor;
  FC_CUDA_CHECK(cudaMemGetInfo(&p.free_mem, &p.total_mem));
  cudaFuncAttributes image;
  const cudaError_t e = cudaFuncGetAttributes(&image, fc_image_probe_kernel);
  if (e != cudaSuccess) {
    cudaGetLastError(); /* not sticky: the next launch must not report it */
    return fc_error(FLASHC_ERR_CUDA,
                    "device %d (sm_%d) runs no image of this libflashc's device code: add its architecture to "
                    "FLASHC_CUDA_ARCHITECTURES (%s)",
                    dev, p.sm, cudaGetErrorName(e));
  }
  p.code_sm = image.ptxVersion;
  if (dev >= 0 && dev < MAX_DEVICES) {
    cache[dev] = p;
    cached[dev] = 1;
  }
  *out = p;
  return FLASHC_OK;
}

extern "C" bool fc_cuda_usable_sm(int min_sm, char *why, size_t len) {
  if (!fc_cuda_usable(why, len)) return false;
  fc_device_props p;
  if (fc_device_get_props(&p) != FLASHC_OK) {
    if (why) snprintf(why, len, "%s", flashc_last_error());
    return false;
  }
  if (p.sm < min_sm) {
    if (why) snprintf(why, len, "device %d is sm_%d; this backend needs sm_%d or newer", p.device, p.sm, min_sm);
    return false;
  }
  return true;
}

extern "C" int fc_pointer_is_device(const void *ptr) {
  if (!fc_cuda_usable(NULL, 0)) return 0; /* no device: no device memory can exist */
  cudaPointerAttributes attr;
  cudaError_t e = cudaPointerGetAttributes(&attr, ptr);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

/* Notes on the handle whether the call's stream is capturing a CUDA graph (the graph then holds the buffers' addresses:
 * see flashc_handle_s.captured). A stream whose status cannot be read counts as capturing: keeping memory is safe. */
static void fc_note_capture(const fc_problem *p) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)p->stream, &status) != cudaSuccess) {
    cudaGetLastError();
    status = cudaStreamCaptureStatusActive;
  }
  if (status != cudaStreamCaptureStatusNone) p->handle->captured = 1;
}

/* The handle's buffer *mem (on device `device`) is being replaced: freed (cudaFree waits for work that may still use
 * it), or, once a graph captured a call of the handle, retired until the handle is destroyed. */
static flashc_status fc_device_replace(struct flashc_handle_s *h, void **mem, int device) {
  if (h->captured) {
    fc_retired_mem *r = (fc_retired_mem *)realloc(h->retired, (size_t)(h->n_retired + 1) * sizeof *h->retired);
    if (!r) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "keeping a CUDA graph's workspace: host allocation failed");
    h->retired = r;
    h->retired[h->n_retired].mem = *mem;
    h->retired[h->n_retired++].device = device;
  } else {
    FC_CUDA_CHECK(cudaFree(*mem));
  }
  *mem = NULL;
  return FLASHC_OK;
}

extern "C" flashc_status fc_device_workspace(const fc_problem *p, size_t bytes, void **ptr) {
  struct flashc_handle_s *h = p->handle;
  int dev = 0;
  FC_CUDA_CHECK(cudaGetDevice(&dev));
  fc_note_capture(p);
  if (h->device_ws && (bytes > h->device_ws_size || dev != h->device_ws_device)) {
    FC_CHECK(fc_device_replace(h, &h->device_ws, h->device_ws_device));
    h->device_ws_size = 0;
  }
  if (!h->device_ws && bytes > 0) {
    cudaError_t e = cudaMalloc(&h->device_ws, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      h->device_ws = NULL;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      cudaGetLastError();
      return fc_error(FLASHC_ERR_OUT_OF_MEMORY,
                      "device workspace of %zu bytes (%.2f GiB) could not be allocated on device %d "
                      "(%.2f GiB free): %s",
                      bytes, bytes / 1073741824.0, dev, free_b / 1073741824.0, cudaGetErrorString(e));
    }
    h->device_ws_size = bytes;
    h->device_ws_device = dev;
  }
  *ptr = h->device_ws;
  return FLASHC_OK;
}

extern "C" flashc_status fc_device_zeroed(const fc_problem *p, size_t bytes, void **ptr) {
  struct flashc_handle_s *h = p->handle;
  int dev = 0;
  FC_CUDA_CHECK(cudaGetDevice(&dev));
  fc_note_capture(p);
  if (h->device_zero && (bytes > h->device_zero_size || dev != h->device_zero_device)) {
    FC_CHECK(fc_device_replace(h, &h->device_zero, h->device_zero_device));
    h->device_zero_size = 0;
  }
  if (!h->device_zero && bytes > 0) {
    cudaError_t e = cudaMalloc(&h->device_zero, bytes);
    /* once, on the call's stream (ordered before its kernels): the users keep it zero */
    if (e == cudaSuccess) e = cudaMemsetAsync(h->device_zero, 0, bytes, (cudaStream_t)p->stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (h->device_zero) cudaFree(h->device_zero);
      h->device_zero = NULL;
      return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "zeroed device memory of %zu bytes on device %d: %s", bytes, dev,
                      cudaGetErrorString(e));
    }
    h->device_zero_size = bytes;
    h->device_zero_device = dev;
  }
  *ptr = h->device_zero;
  return FLASHC_OK;
}

extern "C" flashc_status fc_device_stream_switch(struct flashc_handle_s *h, void *old_stream, void *new_stream) {
  if (!h->device_ws) return FLASHC_OK; /* no GPU call yet: nothing can be pending */
  int prev = 0;
  FC_CUDA_CHECK(cudaGetDevice(&prev));
  FC_CUDA_CHECK(cudaSetDevice(h->device_ws_device));
  cudaEvent_t done = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(done, (cudaStream_t)old_stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)new_stream, done, 0);
  if (done) cudaEventDestroy(done); /* the wait keeps what it needs */
  cudaSetDevice(prev);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fc_error(FLASHC_ERR_CUDA,
                    "flashc_set_stream: ordering the new stream after the old one's work on the handle's workspace "
                    "failed: %s",
                    cudaGetErrorString(e));
  }
  return FLASHC_OK;
}

/* Frees *mem on its device (the caller's device is restored) and clears the pointer; errors are dropped: the handle is
 * going away. */
static void fc_device_free_on(void **mem, int device) {
  if (*mem) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    cudaFree(*mem);
    cudaSetDevice(prev);
    cudaGetLastError();
  }
  *mem = NULL;
}

extern "C" void fc_device_workspace_free(struct flashc_handle_s *h) {
  fc_device_free_on(&h->device_ws, h->device_ws_device);
  h->device_ws_size = 0;
  fc_device_free_on(&h->device_zero, h->device_zero_device);
  h->device_zero_size = 0;
  for (int i = 0; i < h->n_retired; i++) fc_device_free_on(&h->retired[i].mem, h->retired[i].device);
  free(h->retired);
  h->retired = NULL;
  h->n_retired = 0;
}
