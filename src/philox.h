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

/* The dropout rule (flashc.h, "Dropout"). Keys j of a row i of (sequence, head) bh go in groups of 8, each group
 * one Philox block: counter (offset + i·⌈sk/8⌉ + ⌊j/8⌋, bh), key seed, its 128 bits read as eight 16-bit halves
 * (half k: bits 16·(k mod 2) of word ⌊k/2⌋), key j taking half j mod 8. A block never straddles two rows, so a
 * kernel's run of keys that starts at a multiple of 8 is whole blocks, and a 16-bit draw per key makes one Philox
 * call serve 8 keys instead of 4. */
enum { FC_DROPOUT_KEYS = 8 }; /* keys per Philox block */

/* t16 = ⌊p·2^16 + 1/2⌋: a half h < t16 drops its weight, so p is quantised to a multiple of 2^−16. p·2^16 is exact
 * in double (p is a float). validate.c refuses the p whose t16 would be 0 or 2^16 (p < 2^−17, p ≥ 1 − 2^−17): no
 * weight, or every weight, would be dropped, while the kept ones are still scaled by 1/(1 − p). */
FC_PHILOX_FN uint32_t fc_dropout_threshold(float p) { return p > 0.0f ? (uint32_t)((double)p * 65536.0 + 0.5) : 0u; }

/* ⌈sk/8⌉: the blocks of one row of sk keys; a call uses sq·⌈sk/8⌉ counters per (sequence, head). */
FC_PHILOX_FN uint64_t fc_dropout_row_blocks(int64_t sk) {
  return (uint64_t)(sk + FC_DROPOUT_KEYS - 1) / FC_DROPOUT_KEYS;
}

/* Block n of (sequence, head) bh = b·heads_q + h: Philox4x32-10 of counter (offset + n mod 2^64, bh), key seed. */
FC_PHILOX_FN fc_philox4 fc_dropout_block(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t n) {
  const uint64_t c = offset + n; /* mod 2^64 */
  const fc_philox4 ctr = {{(uint32_t)c, (uint32_t)(c >> 32), (uint32_t)bh, (uint32_t)(bh >> 32)}};
  return fc_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* The keep bits of a block's 8 keys: bit k = (half k ≥ t16). Both halves of a word compare as 32-bit numbers
 * against t16·2^16 (hi ≥ t16 ⇔ w ≥ t16·2^16; lo ≥ t16 ⇔ (w << 16) ≥ t16·2^16): no half is extracted. */
FC_PHILOX_FN uint32_t fc_dropout_block_bits(fc_philox4 u, uint32_t t16) {
  const uint32_t T = t16 << 16;
  uint32_t bits = 0u;
  for (int w = 0; w < 4; w++) bits |= (uint32_t)(u.w[w] << 16 >= T) << (2 * w) | (uint32_t)(u.w[w] >= T) << (2 * w + 1);
  return bits;
}

/* keep of element (i, j) of bh in a row of sk keys: 1 kept, 0 dropped. The definition, one block per element. */
FC_PHILOX_FN int fc_dropout_keep(uint64_t seed, uint64_t offset, uint32_t t16, uint64_t bh, int64_t sk, int64_t i,
                                 int64_t j) {
  const uint64_t n = (uint64_t)i * fc_dropout_row_blocks(sk) + (uint64_t)j / FC_DROPOUT_KEYS;
  return (int)(fc_dropout_block_bits(fc_dropout_block(seed, offset, bh, n), t16) >> (j % FC_DROPOUT_KEYS) & 1u);
}

#endif /* FLASHC_PHILOX_H */
