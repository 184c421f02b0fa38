/* mma_peak.cu — the ceiling of mma.sync.m16n8k16 (bf16 in, fp32 accumulate) on
 * this GPU: every warp issues independent MMAs on register operands, no
 * memory in the loop, so the tensor pipe is the only limit. It says how far
 * cuda-mma's forward (docs/ladder.md) is from what mma.sync can do at all on
 * the device (on sm_90 wgmma reaches more; mma.sync is the sm_80 path).
 *
 *   nvcc -O3 -arch=sm_90a -o /tmp/mma_peak tools/profile/mma_peak.cu && /tmp/mma_peak
 *
 * Prints TFLOP/s for 1–4 warps per SM sub-partition and the cycles per MMA
 * and sub-partition that it implies at the clock read from the device.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                                       \
  do {                                                                                                                 \
    cudaError_t e_ = (x);                                                                                              \
    if (e_ != cudaSuccess) {                                                                                           \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                      \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

enum { CHAINS = 8, ITERS = 4096 };

__global__ void mma_loop(float *out, uint32_t seed) {
  uint32_t a[4], b[2];
  for (int i = 0; i < 4; i++) a[i] = seed * (threadIdx.x + 1 + i) | 0x3f803f80u;
  for (int i = 0; i < 2; i++) b[i] = seed ^ (threadIdx.x * 7 + i) | 0x3f803f80u;
  float c[CHAINS][4] = {};
  for (int it = 0; it < ITERS; it++) {
#pragma unroll
    for (int k = 0; k < CHAINS; k++)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                   "{%0,%1,%2,%3};\n"
                   : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
  float s = 0;
  for (int k = 0; k < CHAINS; k++) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s; /* keeps the loop alive */
}

int main(void) {
  int dev = 0, sms = 0, khz = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, dev));
  printf("%s, %d SMs, max clock %.0f MHz\n", prop.name, sms, khz / 1e3);
  float *out = NULL;
  CHECK(cudaMalloc(&out, (size_t)sms * 4 * 16 * 32 * sizeof(float)));
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0));
  CHECK(cudaEventCreate(&t1));
  printf("warps/SMSP  TFLOP/s  cycles per MMA per SMSP (at max clock)\n");
  for (int wps = 1; wps <= 4; wps++) {
    /* two CTAs per SM of 2·wps warps each: 4·wps warps per SM, wps per SMSP */
    const int ctas = sms * 2, per_cta = 2 * wps * 32;
    float best = 1e30f;
    for (int rep = 0; rep < 7; rep++) {
      CHECK(cudaEventRecord(t0));
      mma_loop<<<ctas, per_cta>>>(out, 12345u + rep);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(t1));
      CHECK(cudaEventSynchronize(t1));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      if (rep > 0 && ms < best) best = ms;
    }
    const double flop = 2.0 * 16 * 8 * 16 * CHAINS * (double)ITERS * (ctas * per_cta / 32);
    const double tflops = flop / (best * 1e-3) / 1e12;
    const double mma_per_smsp = (double)CHAINS * ITERS * (ctas * per_cta / 32) / (4.0 * sms);
    printf("%10d  %7.1f  %6.2f\n", wps, tflops, best * 1e-3 * khz * 1e3 / mma_per_smsp);
  }
  CHECK(cudaFree(out));
  return 0;
}
