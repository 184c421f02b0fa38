/*
 * philox.h — Philox4x32-10 and the dropout rule built on it (flashc.h, "Dropout"), for C and CUDA alike.
 *
 * Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a
 * 128-bit counter and a 64-bit key to 128 random bits, with no state: any element's random word is computed
 * where it is needed, in any order, on any thread, and every backend gets the same bits. Ten rounds of
 *   (c0, c1, c2, c3) ← (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0))
 * with the key bumped by the Weyl constants (W0, W1) between rounds: Random123's philox4x32 with R = 10, the
 * generator of cuRAND's curand_Philox4x32_10 and of PyTorch's CUDA dropout. tests/test_dropout.c checks it
 * against Random123's published known-answer vectors (tests/kat_vectors).
 */
#ifndef FLASHC_PHILOX_H
#define FLASHC_PHILOX_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FC_PHILOX_FN static inline __host__ __device__
#else
#define FC_PHILOX_FN static inline
#endif

typedef struct fc_philox4 {
  uint32_t w[4];
} fc_philox4;

FC_PHILOX_FN fc_philox4 fc_philox4x32_10(fc_philox4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    if (r > 0) { /* the key schedule: the golden ratio and sqrt(3) − 1, as 32-bit fractions */
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = (uint64_t)0xD2511F53u * c.w[0], p1 = (uint64_t)0xCD9E8D57u * c.w[2];
    const fc_philox4 n = {
        {(uint32_t)(p1 >> 32) ^ c.w[1] ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c.w[3] ^ k1, (uint32_t)p0}};
    c = n;
  }
  return c;
}

/* t = ⌊p·2^32 + 1/2⌋: a word u < t drops its weight. p·2^32 is exact in double (p is a float), and t ≤ 2^32 − 256
 * for p < 1, so it fits. */
FC_PHILOX_FN uint32_t fc_dropout_threshold(float p) {
  return p > 0.0f ? (uint32_t)((double)p * 4294967296.0 + 0.5) : 0u;
}

/* The words of elements 4n .. 4n + 3 of (sequence, head) bh = b·heads_q + h: counter (offset + n, bh), key seed. */
FC_PHILOX_FN fc_philox4 fc_dropout_block(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t n) {
  const uint64_t c = offset + n; /* mod 2^64 */
  const fc_philox4 ctr = {{(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)bh, (uint32_t)(bh >> 32)}};
  return fc_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* keep of element e = i·sk + j of bh: 1 kept, 0 dropped. */
FC_PHILOX_FN int fc_dropout_keep(uint64_t seed, uint64_t offset, uint32_t threshold, uint64_t bh, uint64_t e) {
  return fc_dropout_block(seed, offset, bh, e / 4).w[e % 4] >= threshold;
}

#endif /* FLASHC_PHILOX_H */
