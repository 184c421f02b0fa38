/*
 * flash.c — cpu: tiled FlashAttention-2 on CPU threads, the default where there is no GPU.
 *
 * Forward (Dao, "FlashAttention-2", algorithm 1), one task per (sequence, query head, block Q_i of Br rows):
 *   for each block K_j, V_j of Bc keys that a row of Q_i may see:
 *     S = Q_i K_jᵀ                                   (Q_i carries scale·log2 e: scores in base 2)
 *     m_new = max(m, rowmax S),  P = 2^(S − m_new)
 *     l = 2^(m − m_new) l + rowsum P,  O_i = 2^(m − m_new) O_i + P V_j,  m = m_new
 *   O_i /= l,  lse = (m + log2 l) · ln 2
 * The s×s score matrix never exists: a worker holds one Br×Bc tile of it. Tiles are fp32 (f16/bf16 are
 * converted once per tile), the products run in the micro-kernels of kernels.h (AVX2+FMA when the CPU has
 * it). Blocks of keys that no row of Q_i sees (causal, windows) are never loaded.
 * Backward: flash_bwd.c.
 */
#include "flash.h"
#include "kernels.h"
#include "scratch.h"
#include "tile.h"

#include <string.h>

/* Bc = 64 keys per step; Br query rows per task: 256 up to head_dim 64, else 128. Every task streams all its
 * visible K_j, V_j from the caller's tensors, so a taller Q_i does more work per streamed byte (at head_dim
 * 64, 128 rows ran ~8% faster than 64 and 256 another ~5%), as long as the tiles of one task (Q_i, K_jᵀ,
 * V_j, S, O_i: 224 KB at head_dim 64, 416 KB at 256) fit a core's 512 KB L2. */
enum { BC = 64 };

static int64_t rows_per_task(int64_t dp) { return dp <= 64 ? 256 : 128; }

typedef struct {
  float *Q, *Kt, *V, *S, *O, *m, *l;
} fwd_tiles;

/* One worker's tiles (dp = head_dim padded to 8); returns the bytes they take (see fc_carve). */
static size_t fwd_tiles_carve(int64_t dp, char *base, fwd_tiles *t) {
  const int64_t Br = rows_per_task(dp);
  fc_carve c = {base, 0};
  t->Q = fc_carve_floats(&c, Br * dp);  /* Q_i   [Br][dp] */
  t->Kt = fc_carve_floats(&c, dp * BC); /* K_jᵀ  [dp][Bc] */
  t->V = fc_carve_floats(&c, BC * dp);  /* V_j   [Bc][dp] */
  t->S = fc_carve_floats(&c, Br * BC);  /* S, P  [Br][Bc] */
  t->O = fc_carve_floats(&c, Br * dp);  /* O_i   [Br][dp] */
  t->m = fc_carve_floats(&c, Br);
  t->l = fc_carve_floats(&c, Br);
  return c.used;
}

typedef struct {
  const fc_problem *p;
  const fc_cpu_kernels *kern;
  fc_blocks blocks; /* query blocks of Br rows */
  fc_scratch scratch;
} fwd_ctx;

/* q, o: [B, Sq, Hq, D]; k, v: [B, Sk, Hkv, D]; lse: [B, Hq, Sq] (varlen: [Hq, total_q]). */
static void forward_task(void *vctx, int64_t t, int worker) {
  const fwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  /* The last blocks of a sequence see the most keys under a causal mask: hand them out first, so the
   * short tasks fill in at the end. */
  const int64_t h = t / ctx->blocks.total, g = ctx->blocks.total - 1 - t % ctx->blocks.total;
  int64_t s, ib, q0, sq, k0, sk;
  fc_blocks_find(&ctx->blocks, g, &s, &ib);
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  const int64_t shift = fc_mask_shift(p, sq, sk), hk = h / (p->heads_q / p->heads_kv);
  const int64_t d = p->head_dim, dp = fc_pad8(d), Br = rows_per_task(dp), i0 = ib * Br,
                in = sq - i0 < Br ? sq - i0 : Br;
  fwd_tiles T;
  fwd_tiles_carve(dp, fc_scratch_worker(&ctx->scratch, worker), &T);

  /* Q_i = scale·log2(e) · q[i0 : i0+in], so that S = Q_i K_jᵀ is in base-2 units. */
  fc_tile_load(p, &p->q, s, q0, i0, in, h, p->scale * FC_LOG2E, T.Q, dp);
  memset(T.O, 0, (size_t)(in * dp) * sizeof *T.O);
  for (int64_t r = 0; r < in; r++) T.m[r] = -INFINITY, T.l[r] = 0.0f;

  int64_t j_lo, j_hi;
  fc_keys_seen(p, shift, sk, i0, i0 + in, &j_lo, &j_hi);
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += BC) {
    const int64_t jn = j_hi - j0 < BC ? j_hi - j0 : BC, nc = fc_pad8(jn);
    /* Only rows [a, b) of Q_i see a key of K_j; the others keep their m, l and O_i. */
    int64_t a, b;
    fc_tile_rows(p, shift, sq, i0, in, j0, jn, &a, &b);
    if (a >= b) continue;
    fc_tile_load_t(p, &p->k, s, k0, j0, jn, hk, 1.0f, T.Kt, BC);
    fc_tile_load(p, &p->v, s, k0, j0, jn, hk, 1.0f, T.V, dp);
    if (j0 + BC < j_hi) { /* the next K_j, V_j: fetched while this tile is computed */
      const int64_t next = j_hi - (j0 + BC) < BC ? j_hi - (j0 + BC) : BC;
      fc_tile_prefetch(p, &p->k, s, k0, j0 + BC, next, hk);
      fc_tile_prefetch(p, &p->v, s, k0, j0 + BC, next, hk);
    }

    /* S = Q_i K_jᵀ, −inf where the mask hides a key (and in the padding columns). */
    kern->gemm(b - a, nc, d, T.Q + a * dp, dp, 1, T.Kt, BC, T.S + a * BC, BC, 0);
    fc_tile_mask(p, shift, sk, i0 + a, b - a, j0, jn, nc, T.S + a * BC, BC);

    /* m_new = max(m, rowmax S), P = 2^(S − m_new), l = 2^(m − m_new) l + rowsum P, O_i = 2^(m − m_new) O_i. */
    for (int64_t r = a; r < b; r++) {
      float *S_r = T.S + r * BC, *O_r = T.O + r * dp;
      const float row_max = kern->row_max(S_r, nc), m_new = row_max > T.m[r] ? row_max : T.m[r];
      /* A row that has seen no key yet has m_new = −inf; subtracting 0 instead gives 2^(−inf) = 0 where
       * −inf − (−inf) would give NaN. */
      const float m_use = m_new == -INFINITY ? 0.0f : m_new, alpha = exp2f(T.m[r] - m_use);
      T.l[r] = alpha * T.l[r] + kern->exp2_row(S_r, nc, m_use);
      T.m[r] = m_new;
      if (alpha != 1.0f)
        for (int64_t c = 0; c < dp; c++) O_r[c] *= alpha;
    }

    /* O_i += P V_j */
    kern->gemm(b - a, dp, jn, T.S + a * BC, BC, 1, T.V, dp, T.O + a * dp, dp, 1);
  }

  /* O_i /= l, lse = (m + log2 l)·ln 2. A row that saw no key has l = 0: it keeps O = 0 and lse = −inf. */
  for (int64_t r = 0; r < in; r++) {
    const float l = T.l[r], inv_l = l > 0.0f ? 1.0f / l : 0.0f;
    for (int64_t c = 0; c < dp; c++) T.O[r * dp + c] *= inv_l;
    if (p->lse) p->lse[fc_lse_index(p, s, q0, h, i0 + r)] = l > 0.0f ? (T.m[r] + log2f(l)) * FC_LN2 : -INFINITY;
  }
  fc_tile_store(p, &p->o, s, q0, i0, in, h, 1.0f, T.O, dp);
}

static flashc_status flash_forward(const fc_problem *p) {
  fwd_ctx ctx = {.p = p, .kern = fc_cpu_kernels_pick()};
  const int64_t Br = rows_per_task(fc_pad8(p->head_dim));
  /* Varlen: the block numbering needs batch + 1 counts, in the shared part of the workspace. Sized before
   * the workspace exists, so the tasks are counted with an upper bound: one block per row. */
  const size_t first_bytes = p->cu_seqlens_q ? (size_t)(p->batch + 1) * sizeof(int64_t) : 0;
  fwd_tiles unused;
  const int64_t tasks_bound = p->heads_q * (p->cu_seqlens_q ? p->total_q : p->batch * ((p->seqlen_q + Br - 1) / Br));
  FC_CHECK(
      fc_scratch_get(p, tasks_bound, first_bytes, fwd_tiles_carve(fc_pad8(p->head_dim), NULL, &unused), &ctx.scratch));
  fc_blocks_init(&ctx.blocks, p->cu_seqlens_q, p->batch, p->seqlen_q, Br, (int64_t *)ctx.scratch.shared);
  if (ctx.blocks.total == 0) return FLASHC_OK; /* every sequence is empty */
  fc_parallel_for(ctx.scratch.threads, p->heads_q * ctx.blocks.total, forward_task, &ctx);
  return FLASHC_OK;
}

const fc_backend fc_backend_cpu = {
    .name = "cpu",
    .summary = "tiled FlashAttention-2 on CPU threads, fp32 accumulation, AVX2+FMA when available",
    .device = FLASHC_DEVICE_CPU,
    .dtypes = (1u << FLASHC_F32) | (1u << FLASHC_F16) | (1u << FLASHC_BF16),
    .min_head_dim = 1,
    .max_head_dim = 256, /* the row buffer of fc_tile_load_t */
    .usable = NULL,
    .supports = NULL,
    .forward = flash_forward,
    .backward = fc_cpu_flash_backward,
};
