/*
 * flash_bwd.c — cpu: the backward pass of tiled FlashAttention-2 (Dao, "FlashAttention-2", algorithm 2).
 *
 * P is recomputed tile by tile from the forward's lse, so no s×s matrix is kept:
 *   P = 2^(S − lse·log2 e) with S = (scale·log2 e) Q_i K_jᵀ, masked
 *   dV_j += Pᵀ dO_i,  dP = dO_i V_jᵀ,  dS = P ∘ (dP − D_i),  dK_j += scale dSᵀ Q_i,  dQ_i += scale dS K_j
 * with D_i = rowsum(dO_i ∘ O_i) (= Σ_j P_ij dP_ij, the softmax Jacobian's correction).
 *
 * For bit-identical gradients without atomics, each gradient row is written by exactly one task, in three
 * passes over fc_parallel_for:
 *   0. D_i, one task per (sequence, query head, query block);
 *   1. dK_j, dV_j, one task per (sequence, kv head, key block of Bc rows): it loops over the query heads of
 *      the kv head's group (GQA sums over them) and over the query rows that may see K_j;
 *   2. dQ_i, one task per (sequence, query head, query block of Br rows), over the key blocks it may see.
 * This recomputes S and dP twice (7 tile products per tile instead of FlashAttention-2's 5) and buys
 * determinism at every thread count.
 */
#include "flash.h"
#include "kernels.h"
#include "scratch.h"
#include "tile.h"

#include <string.h>

/* Block sizes, per call. Each pass streams one operand pair from the caller's tensors (Q_i, dO_i in pass 1;
 * K_j, V_j in pass 2) and keeps its own block in scratch, so a larger own block streams less: at head_dim
 * ≤ 64, 256-row blocks against 128-row (pass 1) and 64-key (pass 2) chunks ran ~5% faster than 128-row
 * blocks, although pass 1's tiles (580 KB) pass a core's 512 KB L2. Wider heads use half the rows (tiles of
 * 384 KB at head_dim 128, ~700 KB at 256). */
typedef struct {
  int64_t k_block; /* pass 1: keys per task */
  int64_t q_chunk; /* pass 1: query rows per step */
  int64_t q_block; /* passes 0 and 2: query rows per task */
  int64_t k_chunk; /* pass 2: keys per step */
} bwd_blocks;

static bwd_blocks blocks_for(int64_t dp) {
  if (dp <= 64) return (bwd_blocks){.k_block = 256, .q_chunk = 128, .q_block = 256, .k_chunk = 64};
  return (bwd_blocks){.k_block = 128, .q_chunk = 64, .q_block = 128, .k_chunk = 64};
}

/* The tiles of one task: `br` query rows against `bc` keys (pass 1: q_chunk × k_block; pass 2:
 * q_block × k_chunk). */
typedef struct {
  int64_t br, bc;
  float *Q, *dO;   /* Q_i, dO_i  [br][dp]  (pass 0: O_i in Q) */
  float *Kt, *Vt;  /* K_jᵀ, V_jᵀ [dp][bc] */
  float *S, *dP;   /* S then P; dP then dS  [br][bc] */
  float *lse2, *D; /* lse·log2 e, D_i  [br] */
  float *dK, *dV;  /* pass 1: dK_j, dV_j  [bc][dp] */
  float *K_j, *dQ; /* pass 2: K_j [bc][dp], dQ_i [br][dp] (the same memory as dK, dV) */
} bwd_tiles;

static size_t bwd_tiles_carve(int64_t dp, int64_t br, int64_t bc, char *base, bwd_tiles *t) {
  fc_carve c = {base, 0};
  t->br = br, t->bc = bc;
  t->Q = fc_carve_floats(&c, br * dp);
  t->dO = fc_carve_floats(&c, br * dp);
  t->Kt = fc_carve_floats(&c, dp * bc);
  t->Vt = fc_carve_floats(&c, dp * bc);
  t->S = fc_carve_floats(&c, br * bc);
  t->dP = fc_carve_floats(&c, br * bc);
  t->lse2 = fc_carve_floats(&c, br);
  t->D = fc_carve_floats(&c, br);
  t->dK = t->K_j = fc_carve_floats(&c, bc * dp);
  t->dV = t->dQ = fc_carve_floats(&c, (br > bc ? br : bc) * dp);
  return c.used;
}

typedef struct {
  const fc_problem *p;
  const fc_cpu_kernels *kern;
  bwd_blocks sizes;
  fc_blocks q_blocks, k_blocks;
  float *D; /* D_i for every row and query head, indexed like lse */
  fc_scratch scratch;
} bwd_ctx;

/* One sequence and head pair, as every task needs it. */
typedef struct {
  int64_t s, q0, sq, k0, sk, shift;
} seq_info;

static seq_info seq_of(const fc_problem *p, int64_t s) {
  seq_info q = {.s = s};
  fc_seq_q(p, s, &q.q0, &q.sq);
  fc_seq_k(p, s, &q.k0, &q.sk);
  q.shift = fc_mask_shift(p, q.sq, q.sk);
  return q;
}

/* ---- pass 0: D_i = rowsum(dO_i ∘ O_i) ---------------------------------------------------------------- */
static void d_task(void *vctx, int64_t t, int worker) {
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const int64_t h = t / ctx->q_blocks.total, d = p->head_dim, dp = fc_pad8(d);
  int64_t s, ib;
  fc_blocks_find(&ctx->q_blocks, t % ctx->q_blocks.total, &s, &ib);
  const seq_info q = seq_of(p, s);
  const int64_t Br = ctx->sizes.q_block, i0 = ib * Br, in = q.sq - i0 < Br ? q.sq - i0 : Br;
  bwd_tiles T;
  bwd_tiles_carve(dp, Br, ctx->sizes.k_chunk, fc_scratch_worker(&ctx->scratch, worker), &T);
  fc_tile_load(p, &p->o, s, q.q0, i0, in, h, 1.0f, T.Q, dp);
  fc_tile_load(p, &p->dout, s, q.q0, i0, in, h, 1.0f, T.dO, dp);
  for (int64_t r = 0; r < in; r++) {
    float D = 0.0f;
    for (int64_t c = 0; c < d; c++) D += T.dO[r * dp + c] * T.Q[r * dp + c];
    ctx->D[fc_lse_index(p, s, q.q0, h, i0 + r)] = D;
  }
}

/* ---- the tile both passes share ---------------------------------------------------------------------- */
/* Tile row r is query i0 + r and tile column c is key j0 + c, with Q_i, dO_i, K_jᵀ, V_jᵀ loaded (one of Q_i,
 * K_jᵀ carrying scale·log2 e) and lse2, D of the rows in T. For rows [r0, r1) and columns [c0, c1) (c0 a
 * multiple of 8; the columns run on to a multiple of 8, masked):
 *   S = Q_i K_jᵀ (masked),  P = 2^(S − lse·log2 e)   → T->S
 *   dP = dO_i V_jᵀ,  dS = P ∘ (dP − D_i)              → T->dP */
static void p_and_ds(const bwd_ctx *ctx, const bwd_tiles *T, const seq_info *q, int64_t i0, int64_t r0, int64_t r1,
                     int64_t j0, int64_t c0, int64_t c1) {
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t d = p->head_dim, dp = fc_pad8(d), bc = T->bc, rows = r1 - r0, w = fc_pad8(c1) - c0;
  float *S = T->S + r0 * bc + c0, *dS = T->dP + r0 * bc + c0;

  kern->gemm(rows, w, d, T->Q + r0 * dp, dp, 1, T->Kt + c0, bc, S, bc, 0);
  fc_tile_mask(p, q->shift, q->sk, i0 + r0, rows, j0 + c0, c1 - c0, w, S, bc);
  for (int64_t r = 0; r < rows; r++) {
    float *P_r = S + r * bc;
    if (T->lse2[r0 + r] == -INFINITY) /* the row sees no key: P = 0 (2^(S + inf) would be inf or NaN) */
      memset(P_r, 0, (size_t)w * sizeof *P_r);
    else
      kern->exp2_row(P_r, w, T->lse2[r0 + r]);
  }

  kern->gemm(rows, w, d, T->dO + r0 * dp, dp, 1, T->Vt + c0, bc, dS, bc, 0);
  for (int64_t r = 0; r < rows; r++) {
    const float *P_r = S + r * bc, D = T->D[r0 + r];
    float *dS_r = dS + r * bc;
    for (int64_t c = 0; c < w; c++) dS_r[c] = P_r[c] * (dS_r[c] - D);
  }
}

/* lse·log2 e and D_i of rows [i0, i0+in) of query head h. */
static void load_row_stats(const bwd_ctx *ctx, const bwd_tiles *T, const seq_info *q, int64_t h, int64_t i0,
                           int64_t in) {
  for (int64_t r = 0; r < in; r++) {
    const int64_t at = fc_lse_index(ctx->p, q->s, q->q0, h, i0 + r);
    T->lse2[r] = ctx->p->lse[at] * FC_LOG2E;
    T->D[r] = ctx->D[at];
  }
}

/* ---- pass 1: dK_j, dV_j ------------------------------------------------------------------------------- */
static void dkdv_task(void *vctx, int64_t t, int worker) {
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t hk = t / ctx->k_blocks.total, group = p->heads_q / p->heads_kv, d = p->head_dim, dp = fc_pad8(d);
  int64_t s, jb;
  fc_blocks_find(&ctx->k_blocks, t % ctx->k_blocks.total, &s, &jb);
  const seq_info q = seq_of(p, s);
  const int64_t Bc = ctx->sizes.k_block, Br = ctx->sizes.q_chunk, j0 = jb * Bc, jn = q.sk - j0 < Bc ? q.sk - j0 : Bc;
  bwd_tiles T;
  bwd_tiles_carve(dp, Br, Bc, fc_scratch_worker(&ctx->scratch, worker), &T);

  /* K_jᵀ carries scale·log2 e, so that Q_i stays plain for dK_j += dSᵀ Q_i. */
  fc_tile_load_t(p, &p->k, s, q.k0, j0, jn, hk, p->scale * FC_LOG2E, T.Kt, Bc);
  fc_tile_load_t(p, &p->v, s, q.k0, j0, jn, hk, 1.0f, T.Vt, Bc);
  memset(T.dK, 0, (size_t)(jn * dp) * sizeof *T.dK);
  memset(T.dV, 0, (size_t)(jn * dp) * sizeof *T.dV);

  int64_t i_lo, i_hi;
  fc_rows_seeing(p, q.shift, q.sq, j0, j0 + jn, &i_lo, &i_hi);
  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t i0 = i_lo; i0 < i_hi; i0 += Br) {
      const int64_t in = i_hi - i0 < Br ? i_hi - i0 : Br;
      fc_tile_load(p, &p->q, s, q.q0, i0, in, h, 1.0f, T.Q, dp);
      fc_tile_load(p, &p->dout, s, q.q0, i0, in, h, 1.0f, T.dO, dp);
      if (i0 + Br < i_hi) { /* the next Q_i, dO_i: fetched while this tile is computed */
        const int64_t next = i_hi - (i0 + Br) < Br ? i_hi - (i0 + Br) : Br;
        fc_tile_prefetch(p, &p->q, s, q.q0, i0 + Br, next, h);
        fc_tile_prefetch(p, &p->dout, s, q.q0, i0 + Br, next, h);
      }
      load_row_stats(ctx, &T, &q, h, i0, in);
      /* Only keys [c0, c1) of K_j are seen by these rows (c0 rounded down to whole vectors). */
      int64_t lo, hi;
      fc_keys_seen(p, q.shift, q.sk, i0, i0 + in, &lo, &hi);
      const int64_t c0 = (lo > j0 ? lo - j0 : 0) / 8 * 8, c1 = hi - j0 < jn ? hi - j0 : jn;
      if (c0 >= c1) continue;
      p_and_ds(ctx, &T, &q, i0, 0, in, j0, c0, c1);
      /* dV_j += Pᵀ dO_i */
      kern->gemm(c1 - c0, dp, in, T.S + c0, 1, Bc, T.dO, dp, T.dV + c0 * dp, dp, 1);
      /* dK_j += dSᵀ Q_i  (scale at the store) */
      kern->gemm(c1 - c0, dp, in, T.dP + c0, 1, Bc, T.Q, dp, T.dK + c0 * dp, dp, 1);
    }
  }
  /* Every key row is written, those that no query sees with 0. */
  fc_tile_store(p, &p->dk, s, q.k0, j0, jn, hk, p->scale, T.dK, dp);
  fc_tile_store(p, &p->dv, s, q.k0, j0, jn, hk, 1.0f, T.dV, dp);
}

/* ---- pass 2: dQ_i ------------------------------------------------------------------------------------- */
/* dst[c·ld + r] = src[r·dp + c]: K_jᵀ from K_j, already converted, instead of a second pass over memory. */
static void transpose(const float *src, int64_t rows, int64_t d, int64_t dp, float *dst, int64_t ld) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < d; c++) dst[c * ld + r] = src[r * dp + c];
  for (int64_t c = 0; c < d; c++)
    for (int64_t r = rows; r < fc_pad8(rows); r++) dst[c * ld + r] = 0.0f;
}

static void dq_task(void *vctx, int64_t t, int worker) {
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  /* Longest tasks (last blocks, under a causal mask) first, as in the forward. */
  const int64_t h = t / ctx->q_blocks.total, g = ctx->q_blocks.total - 1 - t % ctx->q_blocks.total;
  const int64_t hk = h / (p->heads_q / p->heads_kv), d = p->head_dim, dp = fc_pad8(d);
  int64_t s, ib;
  fc_blocks_find(&ctx->q_blocks, g, &s, &ib);
  const seq_info q = seq_of(p, s);
  const int64_t Br = ctx->sizes.q_block, Bc = ctx->sizes.k_chunk, i0 = ib * Br, in = q.sq - i0 < Br ? q.sq - i0 : Br;
  bwd_tiles T;
  bwd_tiles_carve(dp, Br, Bc, fc_scratch_worker(&ctx->scratch, worker), &T);

  /* Q_i carries scale·log2 e here; K_j (and K_jᵀ) is plain, for dQ_i += dS K_j. */
  fc_tile_load(p, &p->q, s, q.q0, i0, in, h, p->scale * FC_LOG2E, T.Q, dp);
  fc_tile_load(p, &p->dout, s, q.q0, i0, in, h, 1.0f, T.dO, dp);
  load_row_stats(ctx, &T, &q, h, i0, in);
  memset(T.dQ, 0, (size_t)(in * dp) * sizeof *T.dQ);

  int64_t j_lo, j_hi;
  fc_keys_seen(p, q.shift, q.sk, i0, i0 + in, &j_lo, &j_hi);
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += Bc) {
    const int64_t jn = j_hi - j0 < Bc ? j_hi - j0 : Bc;
    /* Only rows [a, b) of Q_i see a key of K_j. */
    int64_t a, b;
    fc_tile_rows(p, q.shift, q.sq, i0, in, j0, jn, &a, &b);
    if (a >= b) continue;
    fc_tile_load(p, &p->k, s, q.k0, j0, jn, hk, 1.0f, T.K_j, dp);
    transpose(T.K_j, jn, d, dp, T.Kt, Bc);
    fc_tile_load_t(p, &p->v, s, q.k0, j0, jn, hk, 1.0f, T.Vt, Bc);
    if (j0 + Bc < j_hi) { /* the next K_j, V_j: fetched while this tile is computed */
      const int64_t next = j_hi - (j0 + Bc) < Bc ? j_hi - (j0 + Bc) : Bc;
      fc_tile_prefetch(p, &p->k, s, q.k0, j0 + Bc, next, hk);
      fc_tile_prefetch(p, &p->v, s, q.k0, j0 + Bc, next, hk);
    }
    p_and_ds(ctx, &T, &q, i0, a, b, j0, 0, jn);
    /* dQ_i += dS K_j  (scale at the store) */
    kern->gemm(b - a, dp, jn, T.dP + a * Bc, Bc, 1, T.K_j, dp, T.dQ + a * dp, dp, 1);
  }
  fc_tile_store(p, &p->dq, s, q.q0, i0, in, h, p->scale, T.dQ, dp);
}

flashc_status fc_cpu_flash_backward(const fc_problem *p) {
  const int64_t dp = fc_pad8(p->head_dim);
  bwd_ctx ctx = {.p = p, .kern = fc_cpu_kernels_pick(), .sizes = blocks_for(dp)};
  const bwd_blocks z = ctx.sizes;
  const int varlen = p->cu_seqlens_q != NULL;
  /* Shared: D for every (row, query head), then the block numberings of varlen sequences. */
  const size_t D_bytes = fc_align_up((size_t)(p->heads_q * p->total_q) * sizeof(float));
  const size_t first_bytes = fc_align_up(varlen ? (size_t)(p->batch + 1) * sizeof(int64_t) : 0);
  /* Sized before the workspace holds the varlen numbering, so the thread count uses an upper bound. */
  const int64_t tasks_bound =
      varlen ? p->heads_q * (p->total_q + p->total_k)
             : p->heads_q * p->batch *
                   ((p->seqlen_q + z.q_block - 1) / z.q_block + (p->seqlen_k + z.k_block - 1) / z.k_block);
  bwd_tiles unused;
  const size_t pass1 = bwd_tiles_carve(dp, z.q_chunk, z.k_block, NULL, &unused),
               pass2 = bwd_tiles_carve(dp, z.q_block, z.k_chunk, NULL, &unused);
  FC_CHECK(fc_scratch_get(p, tasks_bound, D_bytes + 2 * first_bytes, pass1 > pass2 ? pass1 : pass2, &ctx.scratch));
  ctx.D = (float *)ctx.scratch.shared;
  int64_t *q_first = (int64_t *)(ctx.scratch.shared + D_bytes), *k_first = q_first + first_bytes / sizeof(int64_t);
  fc_blocks_init(&ctx.q_blocks, p->cu_seqlens_q, p->batch, p->seqlen_q, z.q_block, q_first);
  fc_blocks_init(&ctx.k_blocks, p->cu_seqlens_k, p->batch, p->seqlen_k, z.k_block, k_first);

  const int threads = ctx.scratch.threads;
  if (ctx.q_blocks.total > 0) fc_parallel_for(threads, p->heads_q * ctx.q_blocks.total, d_task, &ctx);
  if (ctx.k_blocks.total > 0) fc_parallel_for(threads, p->heads_kv * ctx.k_blocks.total, dkdv_task, &ctx);
  if (ctx.q_blocks.total > 0) fc_parallel_for(threads, p->heads_q * ctx.q_blocks.total, dq_task, &ctx);
  return FLASHC_OK;
}
