/*
 * flash.c — cpu: tiled FlashAttention-2 on CPU threads, the default where there is no GPU.
 *
 * Forward (Dao, "FlashAttention-2", algorithm 1), one task per (sequence, query head, block Q_i of Br rows):
 *   for each block K_j, V_j of Bc keys that a row of Q_i may see:
 *     S = Q_i K_jᵀ                                   (Q_i carries scale·log2 e: scores in base 2)
 *     S = mods(S)                                    (softcap, ALiBi: fc_tile_score_mods, one test per tile)
 *     S = S + bias, or −inf where a boolean mask is 0 (attn_mask: fc_tile_attn_mask, one test per tile)
 *     m_new = max(m, rowmax S),  P = 2^(S − m_new)
 *     l = 2^(m − m_new) l + rowsum P,  O_i = 2^(m − m_new) O_i + (P ∘ keep) V_j,  m = m_new
 *   O_i /= l·(1 − p),  lse = (m + log2 l) · ln 2     (keep, p: dropout's mask and rate; without it keep = 1, p = 0)
 * The s×s score matrix never exists: a worker holds one RG×Bc piece of it at a time. K_j and V_j are packed
 * once per block into the panels the micro-kernel streams, every tile is fp32 (f16/bf16 converted on the way in),
 * the products and the exponentials run in the SIMD kernels of kernels.h. Blocks of keys that no row of Q_i
 * sees (causal, windows) are never loaded. Each row's arithmetic is the same whatever Br and the thread
 * count, so o and lse are bit-identical at every thread count.
 * Backward: flash_bwd.c.
 */
#include "../kvcache.h"
#include "flash.h"
#include "kernels.h"
#include "scratch.h"
#include "tile.h"

#include <string.h>

/* Bc = 256 keys per step, in groups of RG = 24 query rows; Br = up to 1024 query rows per task.
 *   A task streams every visible K_j, V_j of its sequence and packs it, so a taller Q_i does more work per
 *   packed byte, and a wider K_j amortises each row's softmax bookkeeping (its max, rescale, calls) over
 *   more keys. A row group's S tile (24 × 256: 24 KB) stays in L1 from S = Q K_jᵀ through the softmax to
 *   P V_j, while Q_i, O_i, K_jᵀ and V_j come from L2 and L3. Measured on Zen 3 (one thread, s 2048, head_dim
 *   64 and 128), against whole 256 × 64 tiles: 512 × 128 in row groups ran 12–15% faster, 1024 × 256 another
 *   5%; larger tiles and other group heights made no difference. Br is lowered (512 … 64) while there would
 *   be fewer than four tasks per thread: tasks are handed out one at a time, so a thread that runs slower
 *   (a busy neighbour on a shared machine, a core at a lower clock) costs at most about one task at the end,
 *   a quarter of a thread's share rather than a half with two. Each task packs every K_j and V_j it sees,
 *   which took 1.5–2% of a task at Br = 1024 on Zen 3, about twice that per halving of Br. */
enum { BC = 256, RG = 24, BR_MAX = 1024 };

static int64_t rows_per_task(const fc_problem *p) {
  int64_t Br = BR_MAX;
  while (Br > 64 && p->heads_q * fc_blocks_count(p, 0, Br) < 4 * (int64_t)p->threads) Br /= 2;
  return Br;
}

typedef struct {
  float *Q, *Kt, *V, *S, *O, *m, *l;
} fwd_tiles;

/* One worker's tiles (dp, dvp = head_dim, head_dim_v padded to 8); returns the bytes they take (see fc_carve). */
static size_t fwd_tiles_carve(const fc_cpu_kernels *kern, int64_t d, int64_t dv, int64_t Br, char *base, fwd_tiles *t) {
  const int64_t dp = fc_pad8(d), dvp = fc_pad8(dv), nr = kern->nr;
  fc_carve c = {base, 0};
  t->Q = fc_carve_floats(&c, Br * dp);                   /* Q_i   [Br][dp]                        */
  t->Kt = fc_carve_floats(&c, fc_round_up(BC, nr) * d);  /* K_jᵀ  panels of nr keys × d rows      */
  t->V = fc_carve_floats(&c, fc_round_up(dvp, nr) * BC); /* V_j   panels of nr columns × Bc rows   */
  t->S = fc_carve_floats(&c, RG * BC);                   /* S, P  [RG][Bc] of one row group       */
  t->O = fc_carve_floats(&c, Br * dvp);                  /* O_i   [Br][dvp]                       */
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

/* Task t → (query head h, block g): the blocks that see the most keys under a causal mask (the last of a
 * sequence) first, over all heads and sequences, so that the short ones fill in at the end. */
static void task_block(const fwd_ctx *ctx, int64_t t, int64_t *h, int64_t *g) {
  const fc_blocks *b = &ctx->blocks;
  const int64_t hq = ctx->p->heads_q;
  *h = t % hq;
  t /= hq;
  if (b->first) { /* varlen: the blocks of each sequence are numbered in order; take them from the end */
    *g = b->total - 1 - t;
    return;
  }
  const int64_t ib = b->per_seq - 1 - t / b->batch, s = t % b->batch;
  *g = s * b->per_seq + ib;
}

/* q, o: [B, Sq, Hq, D]; k, v: [B, Sk, Hkv, D]; lse: [B, Hq, Sq] (varlen: [Hq, total_q]). */
static void forward_task(void *vctx, int64_t t, int worker) {
  const fwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  int64_t h, g, s, ib, q0, sq, k0, sk;
  task_block(ctx, t, &h, &g);
  fc_blocks_find(&ctx->blocks, g, &s, &ib);
  fc_seq_q(p, s, &q0, &sq);
  fc_seq_k(p, s, &k0, &sk);
  const int64_t shift = fc_mask_shift(p, sq, sk), hk = h / (p->heads_q / p->heads_kv);
  const int64_t d = p->head_dim, dp = fc_pad8(d), dv = p->head_dim_v, dvp = fc_pad8(dv), Br = ctx->blocks.size,
                i0 = ib * Br, in = sq - i0 < Br ? sq - i0 : Br, nr = kern->nr;
  fwd_tiles T;
  fwd_tiles_carve(kern, d, dv, Br, fc_scratch_worker(&ctx->scratch, worker), &T);
  const fc_score_mods mods = fc_score_mods_of(p, s, h, sq, sk);
  const int mods_on = fc_score_mods_on(&mods);
  const int drop = p->dropout_p > 0.0f;
  const float rp = drop ? (float)(1.0 / (1.0 - (double)p->dropout_p)) : 1.0f; /* dropout's 1/(1 − p), at the end */

  /* Q_i = scale·log2(e) · q[i0 : i0+in], so that S = Q_i K_jᵀ is in base-2 units (scale / softcap under a
   * softcap: tanh's argument, fc_score_mul). */
  fc_tile_load(kern, p, (fc_rows){&p->q, s, q0, i0, in, h}, fc_score_mul(p), T.Q, dp);
  memset(T.O, 0, (size_t)(in * dvp) * sizeof *T.O);
  for (int64_t r = 0; r < in; r++) T.m[r] = -INFINITY, T.l[r] = 0.0f;

  /* Key blocks start at multiples of Bc whatever rows this task has, so that a row meets the same blocks in
   * the same order at any Br (and any thread count): its arithmetic does not depend on them. */
  int64_t j_lo, j_hi;
  fc_keys_seen(p, shift, sk, i0, i0 + in, &j_lo, &j_hi);
  for (int64_t j0 = j_lo / BC * BC; j0 < j_hi; j0 += BC) {
    const int64_t jn = j_hi - j0 < BC ? j_hi - j0 : BC;
    /* Only rows [a, b) of Q_i see a key of K_j; the others keep their m, l and O_i. */
    int64_t a, b;
    fc_tile_rows(p, shift, sq, i0, in, j0, jn, &a, &b);
    if (a >= b) continue;
    /* K_jᵀ and V_j packed into the panels the micro-kernel streams (K_j transposed), converted to fp32 on
     * the way. */
    fc_tile_pack_t(kern, p, (fc_rows){&p->k, s, k0, j0, jn, hk}, 1.0f, T.Kt, d * nr);
    /* V_j straight from an fp32 caller's rows (a row-major right operand: panel stride nr, rows stride_s apart) when
     * one row group is all the task has: packing would read V_j once to be read once again (b1 s16 h8 d64: 13 % of
     * the call in copies). The same values in the same order: the same bits. */
    const float *V = T.V;
    int64_t v_ps = BC * nr, v_ld = nr;
    if (p->dtype == FLASHC_F32 && dv == dvp && in <= RG) {
      V = (const float *)p->v.data + fc_offset(&p->v, s, k0, j0, hk);
      v_ps = nr, v_ld = p->v.stride_s;
    } else {
      fc_tile_pack(kern, p, (fc_rows){&p->v, s, k0, j0, jn, hk}, 1.0f, T.V, BC * nr);
    }

    /* Row group by row group, so that its S tile stays in L1: */
    for (int64_t r0 = a; r0 < b; r0 += RG) {
      const int64_t rows = b - r0 < RG ? b - r0 : RG;
      /* The group sees keys up to its last row's bound (it grows with the row): on a causal diagonal or a
       * window's right edge the columns past it are left out of both products and the exponentials. The
       * rows' arithmetic does not change: those columns only ever added 2^−inf = 0. */
      int64_t gl, gh;
      fc_key_range(p, shift, i0 + r0 + rows - 1, sk, &gl, &gh);
      const int64_t gn = gh - j0 < jn ? gh - j0 : jn, gc = fc_pad8(gn);
      /* S = Q_i K_jᵀ, −inf where the mask hides a key (and in the padding columns). */
      kern->gemm(rows, gc, d, T.Q + r0 * dp, dp, 1, T.Kt, d * nr, nr, T.S, BC, 0);
      if (mods_on) fc_tile_score_mods(&mods, i0 + r0, rows, j0, gc, T.S, BC, NULL);
      if (p->attn_mask) fc_tile_attn_mask(kern, p, s, h, i0 + r0, rows, j0, gn, T.S, BC);
      fc_tile_mask(p, shift, sk, i0 + r0, rows, j0, gn, gc, T.S, BC);

      /* m_new = max(m, rowmax S), P = 2^(S − m_new), l = 2^(m − m_new) l + rowsum P, O_i = 2^(m − m_new) O_i */
      for (int64_t r = r0; r < r0 + rows; r++) {
        float *S_r = T.S + (r - r0) * BC;
        const float m_new = fc_max_nan(T.m[r], kern->row_max(S_r, gc));
        /* A row that has seen no key yet has m_new = −inf; subtracting 0 instead gives 2^(−inf) = 0 where
         * −inf − (−inf) would give NaN. (A NaN or +inf m_new gives NaN here: such rows are redone below.) */
        const float m_use = m_new == -INFINITY ? 0.0f : m_new, alpha = exp2f(T.m[r] - m_use);
        T.l[r] = alpha * T.l[r] + kern->exp2_row(S_r, gc, m_use);
        T.m[r] = m_new;
        if (alpha != 1.0f) kern->scale_row(T.O + r * dvp, dvp, alpha);
        /* Dropout after l took the whole row: the softmax's sum (and lse) are dropout's P, not P ∘ keep. */
        if (drop) {
          uint8_t keep[BC];
          fc_dropout_keep_row(p, s, h, sk, i0 + r, j0, gn, keep);
          fc_dropout_apply(keep, gn, 1.0f, S_r);
        }
      }

      /* O_i += P V_j */
      kern->gemm(rows, dvp, gn, T.S, BC, 1, V, v_ps, v_ld, T.O + r0 * dvp, dvp, 1);
    }
  }

  /* O_i /= l·(1 − p), lse = (m + log2 l)·ln 2. A row that saw no key has l = 0: it keeps O = 0 and lse = −inf. */
  for (int64_t r = 0; r < in; r++) {
    const float l = T.l[r];
    kern->scale_row(T.O + r * dvp, dvp, l > 0.0f ? rp / l : 0.0f);
    if (p->lse) p->lse[fc_lse_index(p, s, q0, h, i0 + r)] = l > 0.0f ? (T.m[r] + log2f(l)) * FC_LN2 : -INFINITY;
  }
  fc_tile_store(kern, p, (fc_rows){&p->o, s, q0, i0, in, h}, 1.0f, T.O, dvp);

  /* Rows that left fp32 (flash.h) are redone in fp64: a maximum of NaN or +inf (a NaN score, or an infinite
   * one: an input was not finite, or a score passed fp32's range), or of −inf while the row sees a key (its
   * scores all −inf: infinite inputs, or scores below −3.4e38, but not an attn_mask that removes them all), or an
   * O_i that overflowed (or took a NaN from V through a weight of 0, where the mask removes every key). */
  for (int64_t r = 0; r < in; r++) {
    int64_t lo, hi;
    if (isfinite(T.m[r]) && isfinite(T.l[r]) && fc_all_finite(T.O + r * dvp, dv)) continue;
    fc_key_range(p, shift, i0 + r, sk, &lo, &hi);
    if (T.m[r] == -INFINITY && fc_all_finite(T.O + r * dvp, dv) && fc_attn_mask_removes_all(p, s, h, i0 + r, lo, hi))
      continue;
    if (T.m[r] != -INFINITY || lo < hi) fc_ref_forward_row(p, s, h, i0 + r);
  }
}

static flashc_status flash_forward(const fc_problem *p) {
  fwd_ctx ctx = {.p = p, .kern = fc_cpu_kernels_pick()};
  const int64_t Br = rows_per_task(p), tasks = p->heads_q * fc_blocks_count(p, 0, Br);
  /* Varlen: the block numbering needs batch + 1 counts, in the shared part of the workspace. */
  const size_t first_bytes = p->cu_seqlens_q ? (size_t)(p->batch + 1) * sizeof(int64_t) : 0;
  fwd_tiles unused;
  FC_CHECK(fc_scratch_get(p, tasks, first_bytes,
                          fwd_tiles_carve(ctx.kern, p->head_dim, p->head_dim_v, Br, NULL, &unused), &ctx.scratch));
  fc_blocks_init(&ctx.blocks, p, 0, Br, (int64_t *)ctx.scratch.shared);
  if (ctx.blocks.total == 0) return FLASHC_OK; /* every sequence is empty */
  fc_parallel_for(ctx.scratch.threads, p->heads_q * ctx.blocks.total, forward_task, &ctx);
  return FLASHC_OK;
}

const fc_backend fc_backend_cpu = {
    .name = "cpu",
    .summary = "tiled FlashAttention-2 on CPU threads: SIMD micro-kernels (AVX2, AVX-512, NEON), fp32 accumulation",
    .device = FLASHC_DEVICE_CPU,
    .dtypes = (1u << FLASHC_F32) | (1u << FLASHC_F16) | (1u << FLASHC_BF16),
    .min_head_dim = 1,
    .max_head_dim = 256, /* the row buffer of fc_tile_load_t */
    .usable = NULL,
    .supports = NULL,
    .forward = flash_forward,
    .backward = fc_cpu_flash_backward,
    .forward_kvcache = fc_cpu_forward_kvcache, /* kvcache.c */
    .features = FC_FEATURE_SOFTCAP | FC_FEATURE_ALIBI | FC_FEATURE_HEAD_DIM_V | FC_FEATURE_SEQUSED |
                FC_FEATURE_ATTN_MASK | FC_FEATURE_DROPOUT,
    .max_head_dim_v = 512, /* fc_tile_pack_t's row buffer, and fc_ref_forward_row's */
};
