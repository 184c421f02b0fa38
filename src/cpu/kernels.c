/*
 * kernels.c — which kernels of kernels.h this CPU runs: what CPUID and the OS report, read once, and the
 * choice per call.
 */
#include "kernels.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* The AVX-512 kernels passed test_cpu_kernels, test_backends, test_cpu_threads and test_gradcheck on the lent
 * GPU machine's Xeon (AVX-512F/BW/BF16; scripts/cpu-check, 2026-11-22), so the automatic choice takes them
 * first. FLASHC_CPU_KERNELS=avx2|wide|portable|neon|avx512 forces a table (tests, benchmarks). */
enum { AVX512_VERIFIED_ON_HARDWARE = 1 };

/* ---- CPU features -------------------------------------------------------------------------------------- */
#if defined(__x86_64__) || defined(__i386__)
/* The register state the OS saves on a context switch (XCR0): AVX needs SSE and ymm (bits 1, 2), AVX-512
 * also the mask and zmm registers (bits 5, 6, 7). Only valid when CPUID says OSXSAVE. */
static unsigned long long xcr0(void) {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((unsigned long long)hi << 32) | lo;
}

static fc_cpu_features detect(void) {
  fc_cpu_features f = {0, 0};
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
  if (!osxsave || !avx) return f;
  const unsigned long long xcr = xcr0();
  if ((xcr & 0x6) != 0x6 || __get_cpuid_max(0, NULL) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1;
  f.avx2_fma_f16c = avx2 && fma && f16c;
  f.avx512 = avx512f && (xcr & 0xe0) == 0xe0;
  return f;
}
#else
static fc_cpu_features detect(void) { return (fc_cpu_features){0, 0}; }
#endif

fc_cpu_features fc_cpu_features_get(void) {
  /* Packed into one atomic word: threads that race to fill it in store the same value. */
  static atomic_int cached = 0; /* bit 0: filled in; bits 1–2: the features */
  int bits = atomic_load_explicit(&cached, memory_order_relaxed);
  if (!bits) {
    const fc_cpu_features f = detect();
    bits = 1 | f.avx2_fma_f16c << 1 | f.avx512 << 2;
    atomic_store_explicit(&cached, bits, memory_order_relaxed);
  }
  return (fc_cpu_features){(bits >> 1) & 1, (bits >> 2) & 1};
}

/* ---- the choice ---------------------------------------------------------------------------------------- */
static const fc_cpu_kernels *by_name(const char *name) {
  if (strcmp(name, "avx512") == 0) return fc_cpu_kernels_avx512();
  if (strcmp(name, "avx2") == 0) return fc_cpu_kernels_avx2();
  if (strcmp(name, "neon") == 0) return fc_cpu_kernels_neon();
  if (strcmp(name, "wide") == 0) return fc_cpu_kernels_wide();
  if (strcmp(name, "portable") == 0) return fc_cpu_kernels_portable();
  return NULL;
}

const fc_cpu_kernels *fc_cpu_kernels_pick(void) {
  const char *force = getenv("FLASHC_CPU_KERNELS");
  if (force && *force) {
    const fc_cpu_kernels *k = by_name(force);
    if (k) return k;
  }
  const fc_cpu_kernels *k = AVX512_VERIFIED_ON_HARDWARE ? fc_cpu_kernels_avx512() : NULL;
  if (!k) k = fc_cpu_kernels_avx2();
  if (!k) k = fc_cpu_kernels_neon();
  return k ? k : fc_cpu_kernels_portable();
}
