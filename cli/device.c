/*
 * device.c — the few CUDA runtime calls the CLI makes (device buffers, copies, event timing), and the
 * names of the machine's CPU and GPU. Without FLASHC_CLI_CUDA every device call fails with a message, so
 * the rest of the CLI needs no #ifdef.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FLASHC_CLI_CUDA
#include <cuda_runtime_api.h>
#endif

double cli_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int compare_doubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double cli_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void cli_cpu_name(char *out, size_t len) {
  snprintf(out, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *colon = strchr(line, ':');
    if (!colon) continue;
    colon++;
    while (*colon == ' ' || *colon == '\t') colon++;
    size_t n = strcspn(colon, "\n");
    snprintf(out, len, "%.*s", (int)n, colon);
    break;
  }
  fclose(f);
}

#ifdef FLASHC_CLI_CUDA

#define CUDA_OR_FAIL(call)                                                                                             \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess)                                                                                             \
      return cli_error("%s failed: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_));                     \
  } while (0)

int cli_device_alloc(void **ptr, size_t bytes) {
  *ptr = NULL;
  cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    *ptr = NULL;
    return cli_error("cudaMalloc of %zu bytes failed: %s", bytes, cudaGetErrorString(e));
  }
  return CLI_OK;
}

void cli_device_free(void *ptr) {
  if (ptr) cudaFree(ptr);
}

int cli_device_upload(void *dst, const void *src, size_t bytes) {
  CUDA_OR_FAIL(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  return CLI_OK;
}

int cli_device_download(void *dst, const void *src, size_t bytes) {
  CUDA_OR_FAIL(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  return CLI_OK;
}

int cli_device_fill_nan(void *ptr, size_t bytes) {
  CUDA_OR_FAIL(cudaMemset(ptr, 0xff, bytes)); /* all-ones bytes are a NaN in f16, bf16, f32 and f64 */
  return CLI_OK;
}

int cli_device_sync(void) {
  CUDA_OR_FAIL(cudaDeviceSynchronize());
  return CLI_OK;
}

struct cli_device_timer {
  int n;
  cudaEvent_t *start, *stop;
};

int cli_device_timer_create(cli_device_timer **out, int n) {
  *out = NULL;
  cli_device_timer *t = calloc(1, sizeof *t);
  if (!t) return cli_error("out of memory");
  t->start = calloc((size_t)n, sizeof *t->start);
  t->stop = calloc((size_t)n, sizeof *t->stop);
  if (!t->start || !t->stop) {
    cli_device_timer_destroy(t);
    return cli_error("out of memory");
  }
  for (int i = 0; i < n; i++) {
    if (cudaEventCreate(&t->start[i]) != cudaSuccess || cudaEventCreate(&t->stop[i]) != cudaSuccess) {
      cli_device_timer_destroy(t);
      return cli_error("cudaEventCreate failed");
    }
    t->n = i + 1;
  }
  *out = t;
  return CLI_OK;
}

int cli_device_timer_start(cli_device_timer *t, int i) {
  CUDA_OR_FAIL(cudaEventRecord(t->start[i], 0));
  return CLI_OK;
}

int cli_device_timer_stop(cli_device_timer *t, int i) {
  CUDA_OR_FAIL(cudaEventRecord(t->stop[i], 0));
  return CLI_OK;
}

int cli_device_timer_read(cli_device_timer *t, double *ms) {
  for (int i = 0; i < t->n; i++) {
    float v = 0;
    CUDA_OR_FAIL(cudaEventSynchronize(t->stop[i]));
    CUDA_OR_FAIL(cudaEventElapsedTime(&v, t->start[i], t->stop[i]));
    ms[i] = v;
  }
  return CLI_OK;
}

void cli_device_timer_destroy(cli_device_timer *t) {
  if (!t) return;
  for (int i = 0; i < t->n; i++) {
    cudaEventDestroy(t->start[i]);
    cudaEventDestroy(t->stop[i]);
  }
  free(t->start);
  free(t->stop);
  free(t);
}

void cli_device_name(char *out, size_t len) {
  int dev = 0;
  struct cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    snprintf(out, len, "unknown GPU");
    return;
  }
  snprintf(out, len, "%s", prop.name);
}

#else /* no CUDA runtime in this build */

static int no_cuda(void) { return cli_error("this flashc CLI was built without the CUDA runtime"); }

int cli_device_alloc(void **ptr, size_t bytes) {
  (void)bytes;
  *ptr = NULL;
  return no_cuda();
}
void cli_device_free(void *ptr) { (void)ptr; }
int cli_device_upload(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return no_cuda();
}
int cli_device_download(void *dst, const void *src, size_t bytes) {
  (void)dst, (void)src, (void)bytes;
  return no_cuda();
}
int cli_device_fill_nan(void *ptr, size_t bytes) {
  (void)ptr, (void)bytes;
  return no_cuda();
}
int cli_device_sync(void) { return no_cuda(); }
struct cli_device_timer {
  int unused;
};
int cli_device_timer_create(cli_device_timer **t, int n) {
  (void)n;
  *t = NULL;
  return no_cuda();
}
int cli_device_timer_start(cli_device_timer *t, int i) {
  (void)t, (void)i;
  return no_cuda();
}
int cli_device_timer_stop(cli_device_timer *t, int i) {
  (void)t, (void)i;
  return no_cuda();
}
int cli_device_timer_read(cli_device_timer *t, double *ms) {
  (void)t, (void)ms;
  return no_cuda();
}
void cli_device_timer_destroy(cli_device_timer *t) { (void)t; }
void cli_device_name(char *out, size_t len) {
  if (len) out[0] = '\0';
}

#endif
