/*
 * flash_bwd.c — cpu: the backward pass of tiled FlashAttention-2 (Dao, "FlashAttention-2", algorithm 2).
 *
 * P is recomputed tile by tile from the forward's lse, so no s×s matrix is kept:
 *   P = 2^(S − lse·log2 e) with S = (scale·log2 e) Q_i K_jᵀ, modified (softcap, ALiBi) and masked
 *   dV_j += (P ∘ Z)ᵀ dO_i,  dP = Z ∘ (dO_i V_jᵀ),  dS = P ∘ (dP − D_i),  dK_j += scale dSᵀ Q_i,  dQ_i += scale dS K_j
 * (under a softcap dS is taken through its tanh, dS ∘ (1 − tanh²), from the recomputed scores)
 * with D_i = rowsum(dO_i ∘ O_i) (= Σ_j P_ij dP_ij, the softmax Jacobian's correction): five tile products.
 * Z = keep / (1 − p) is dropout's mask (flashc.h), regenerated from its seed and offset (1 without dropout).
 * attn_mask enters S after the modifiers (fc_tile_attn_mask); the gradient of a float bias, dbias = dS (before the
 * softcap's tanh: the bias is added after it), is kept whole in fp32 scratch [batch, heads_q, seqlen_q, seqlen_k],
 * each element written by the one tile that computes it, and pass 2 sums it over the dims dbias broadcasts.
 *
 * Two passes over fc_parallel_for:
 *   0. per (sequence, query head, query block): D_i, and the block's dQ accumulator set to 0;
 *   1. per (sequence, kv head, key block K_j): K_jᵀ, K_j and V_jᵀ packed once, dK_j and dV_j accumulated in
 *      the task's scratch over every query head of the kv head's group (GQA sums over them) and every query
 *      block that sees K_j, then stored. dQ_i += dS K_j goes to an fp32 accumulator shared by the key blocks
 *      of row block i.
 * The dQ accumulation is deterministic without atomics on the data: each accumulator block has a ticket,
 * the number of key blocks that have added to it, and key block j adds its product only when every key block
 * before it has (it waits for its turn, then adds and passes the ticket on). So dQ_i is summed in the order
 * j = 0, 1, 2 ... whatever the threads and their timing: bit-identical results run to run and at every
 * thread count. The product itself is computed before the wait, into scratch; only the addition waits.
 * Waits are short and never circular: tasks are handed out in increasing order with the key blocks of one
 * head in increasing order, so the block a task waits for started before it and is running or done; and
 * ordering tasks by key block first (j-major, over heads and sequences) keeps the key blocks in flight far
 * apart. The last key block to add stores dQ_i.
 */
#include "flash.h"
#include "kernels.h"
#include "scratch.h"
#include "tile.h"

#include <sched.h>
#include <stdatomic.h>
#include <string.h>

/* Keys per task (Bc) and query rows per step (Br). Per step the task streams Q_i and dO_i (converted once,
 * the left operands of S and dP and the right ones of dK and dV) against its K_j, V_j, packed once; a wide
 * K_j amortises that streaming over more keys. Measured on Zen 3 (one thread, s 2048): Br 96 against Bc 256
 * ran 8–12% faster than 64 × 128 at head_dim 64 and 128; the tiles of a worker then take ~600 KB at head_dim
 * 64 (K_jᵀ, K_j, V_jᵀ, dK_j, dV_j are 64 KB each), more than L2, and still ran faster than smaller ones.
 * Br = 96 is a multiple of the micro-tiles' rows (6 and 8). Bc is lowered (128, 64) while there would be
 * fewer than 32 tasks, so that small problems still spread over threads; it depends on the shape only, not
 * on the thread count, so that dQ (summed per key block) is bit-identical at every thread count. */
typedef struct {
  int64_t br, bc;
} bwd_sizes;

static bwd_sizes sizes_for(const fc_problem *p) {
  bwd_sizes z = {.br = 96, .bc = 256};
  while (z.bc > 64 && p->heads_kv * fc_blocks_count(p, 1, z.bc) < 32) z.bc /= 2;
  return z;
}

typedef struct {
  float *Q, *dO;   /* Q_i [br][ld], dO_i  [br][ldv]  (pass 0: O_i in Q, rows of dvp) */
  float *Kt, *Vt;  /* K_jᵀ (carrying fc_score_mul), V_jᵀ: panels of keys [d, dv rows], stride d·nr, dv·nr */
  float *K;        /* K_j  [bc][ld] */
  float *S, *dP;   /* S then P; dP then dS  [br][bc] */
  float *Th;       /* under a softcap: tanh of the scores' argument [br][bc] (else NULL) */
  float *dK, *dV;  /* dK_j [bc][dp], dV_j  [bc][dvp] */
  float *dQ;       /* dS K_j  [br][dp], before it is added to the accumulator */
  float *lse2, *D; /* lse·log2 e, D_i  [br] */
} bwd_tiles;

static size_t bwd_tiles_carve(const fc_cpu_kernels *kern, const fc_problem *p, bwd_sizes z, char *base, bwd_tiles *t) {
  const int64_t d = p->head_dim, dv = p->head_dim_v, dp = fc_pad8(d), dvp = fc_pad8(dv), ld = fc_tile_ld(dp),
                ldv = fc_tile_ld(dvp), bcn = fc_round_up(z.bc, kern->nr);
  fc_carve c = {base, 0};
  t->Q = fc_carve_floats(&c, z.br * (ld > dvp ? ld : dvp));
  t->dO = fc_carve_floats(&c, z.br * ldv);
  t->Kt = fc_carve_floats(&c, bcn * d);
  t->Vt = fc_carve_floats(&c, bcn * dv);
  t->K = fc_carve_floats(&c, z.bc * ld);
  t->S = fc_carve_floats(&c, z.br * z.bc);
  t->dP = fc_carve_floats(&c, z.br * z.bc);
  t->Th = p->softcap > 0.0f ? fc_carve_floats(&c, z.br * z.bc) : NULL;
  t->dK = fc_carve_floats(&c, z.bc * dp);
  t->dV = fc_carve_floats(&c, z.bc * dvp);
  t->dQ = fc_carve_floats(&c, z.br * dp);
  t->lse2 = fc_carve_floats(&c, z.br);
  t->D = fc_carve_floats(&c, z.br);
  return c.used;
}

/* The turn of a dQ accumulator block: how many key blocks have added to it. One per cache line, so that
 * passing one on does not disturb the neighbours. */
typedef struct {
  _Alignas(64) atomic_int added;
} dq_ticket;

typedef struct {
  const fc_problem *p;
  const fc_cpu_kernels *kern;
  bwd_sizes z;
  fc_blocks q_blocks, k_blocks;
  float *D;          /* D_i for every row and query head, indexed like lse */
  float *dq_acc;     /* dQ (without the scale) for every row and query head: row fc_lse_index of dp floats */
  dq_ticket *ticket; /* per (query head, query block): h·q_blocks.total + g */
  atomic_int *fp64;  /* set when a value left fp32: the call is redone by cpu-ref (flash.h) */
  float *dS_all;     /* with dbias: dS of every (row, query head) as lse is indexed, rows of seqlen_k; else NULL */
  fc_scratch scratch;
} bwd_ctx;

/* One sequence, as every task needs it. */
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

/* The keys that row block ib of a sequence sees, exactly: [*lo, *hi), empty if lo ≥ hi. (Each row sees an
 * interval whose ends grow with the row, and neighbouring rows' intervals touch, so the union over the block
 * is one interval from the first row's start to the last row's end.) Key block jb adds to the block's dQ iff
 * it meets this range, so the key blocks that add are the consecutive ones from lo / bc to (hi − 1) / bc. */
static void block_keys(const bwd_ctx *ctx, const seq_info *q, int64_t ib, int64_t *lo, int64_t *hi) {
  const int64_t i0 = ib * ctx->z.br, in = q->sq - i0 < ctx->z.br ? q->sq - i0 : ctx->z.br;
  fc_keys_seen(ctx->p, q->shift, q->sk, i0, i0 + in, lo, hi);
}

/* ---- pass 0: D_i = rowsum(dO_i ∘ O_i), dQ accumulator = 0 --------------------------------------------- */
static void d_task(void *vctx, int64_t t, int worker) {
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t h = t / ctx->q_blocks.total, g = t % ctx->q_blocks.total, dp = fc_pad8(p->head_dim), dv = p->head_dim_v,
                dvp = fc_pad8(dv);
  int64_t s, ib;
  fc_blocks_find(&ctx->q_blocks, g, &s, &ib);
  const seq_info q = seq_of(p, s);
  const int64_t Br = ctx->z.br, i0 = ib * Br, in = q.sq - i0 < Br ? q.sq - i0 : Br;
  bwd_tiles T;
  bwd_tiles_carve(kern, p, ctx->z, fc_scratch_worker(&ctx->scratch, worker), &T);
  fc_tile_load(kern, p, (fc_rows){&p->o, s, q.q0, i0, in, h}, 1.0f, T.Q, dvp);
  fc_tile_load(kern, p, (fc_rows){&p->dout, s, q.q0, i0, in, h}, 1.0f, T.dO, dvp);
  const int64_t first = fc_lse_index(p, s, q.q0, h, i0); /* the block's rows are consecutive in lse */
  for (int64_t r = 0; r < in; r++) ctx->D[first + r] = kern->dot(T.dO + r * dvp, T.Q + r * dvp, dv);
  /* A row whose D_i or lse_i is not finite, other than the lse −inf of a row that sees no key, cannot be done
   * in fp32 (flash.h): a NaN or infinite input, or a forward whose scores passed fp32's range. */
  for (int64_t r = 0; r < in; r++) {
    const float lse = p->lse[first + r];
    int64_t lo, hi;
    fc_key_range(p, q.shift, i0 + r, q.sk, &lo, &hi);
    /* (A row whose keys attn_mask removes all is such a row too: its gradients are 0.) */
    if (!isfinite(ctx->D[first + r]) ||
        !(isfinite(lse) || (lse == -INFINITY && (lo >= hi || fc_attn_mask_removes_all(p, s, h, i0 + r, lo, hi)))))
      atomic_store_explicit(ctx->fp64, 1, memory_order_relaxed);
  }
  memset(ctx->dq_acc + first * dp, 0, (size_t)(in * dp) * sizeof(float));
  atomic_init(&ctx->ticket[h * ctx->q_blocks.total + g].added, 0);
  int64_t lo, hi;
  block_keys(ctx, &q, ib, &lo, &hi);
  if (lo >= hi) /* no key block will add to it: its rows see no key, dq = 0 */
    fc_tile_store(kern, p, (fc_rows){&p->dq, s, q.q0, i0, in, h}, 0.0f, ctx->dq_acc + first * dp, dp);
}

/* ---- pass 1: dK_j, dV_j, and dQ_i through the accumulators --------------------------------------------- */
static void wait_for_turn(atomic_int *added, int turn) {
  for (int spins = 0; atomic_load_explicit(added, memory_order_acquire) != turn; spins++) {
    if (spins < 100) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      sched_yield(); /* the key block before this one is computing, maybe on a core this thread shares */
    }
  }
}

/* Task t → (sequence s, kv head hk, key block jb): key block first, so that each head's key blocks come in
 * increasing order and the first key blocks, which see the most queries under a causal mask, start first. */
static void task_block(const bwd_ctx *ctx, int64_t t, int64_t *s, int64_t *hk, int64_t *jb) {
  const fc_blocks *b = &ctx->k_blocks;
  const int64_t hkv = ctx->p->heads_kv;
  if (b->first) { /* varlen: global key block numbers are in order within each sequence */
    *hk = t % hkv;
    fc_blocks_find(b, t / hkv, s, jb);
    return;
  }
  const int64_t chains = b->batch * hkv, c = t % chains;
  *jb = t / chains;
  *s = c / hkv;
  *hk = c % hkv;
}

/* The five products of tile (i, j) for query head h: rows [a, b) of Q_i see keys of K_j, and those rows
 * see keys [c0, c1) of it (c0 rounded down to a panel). Leaves dS K_j in T->dQ rows [a, b). */
static void tile_step(const bwd_ctx *ctx, const bwd_tiles *T, const seq_info *q, int64_t h, int64_t i0, int64_t a,
                      int64_t b, int64_t j0, int64_t jn) {
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t d = p->head_dim, dp = fc_pad8(d), ld = fc_tile_ld(dp), dv = p->head_dim_v, dvp = fc_pad8(dv),
                ldv = fc_tile_ld(dvp), nr = kern->nr, Bc = ctx->z.bc, rows = b - a;
  int64_t lo, hi;
  fc_keys_seen(p, q->shift, q->sk, i0 + a, i0 + b, &lo, &hi);
  const int64_t c0 = (lo > j0 ? lo - j0 : 0) / nr * nr, c1 = hi - j0 < jn ? hi - j0 : jn, w = fc_pad8(c1) - c0;

  /* Q_i, dO_i rows [a, b): the left operand of S and dP, the right one (read in place as panels of their
   * columns) of dK and dV. */
  float *Q = T->Q + a * ld, *dO = T->dO + a * ldv;
  fc_tile_load(kern, p, (fc_rows){&p->q, q->s, q->q0, i0 + a, rows, h}, 1.0f, Q, ld);
  fc_tile_load(kern, p, (fc_rows){&p->dout, q->s, q->q0, i0 + a, rows, h}, 1.0f, dO, ldv);
  const int64_t first = fc_lse_index(p, q->s, q->q0, h, i0 + a);
  for (int64_t r = 0; r < rows; r++) {
    T->lse2[a + r] = p->lse[first + r] * FC_LOG2E;
    T->D[a + r] = ctx->D[first + r];
  }

  /* S = Q_i K_jᵀ (modified, masked), dP = dO_i V_jᵀ, over columns [c0, c0 + w). */
  float *S = T->S + a * Bc + c0, *dS = T->dP + a * Bc + c0, *Th = T->Th ? T->Th + a * Bc + c0 : NULL;
  kern->gemm(rows, w, d, Q, ld, 1, T->Kt + c0 / nr * d * nr, d * nr, nr, S, Bc, 0);
  const fc_score_mods mods = fc_score_mods_of(p, q->s, h, q->sq, q->sk);
  if (fc_score_mods_on(&mods)) fc_tile_score_mods(&mods, i0 + a, rows, j0 + c0, w, S, Bc, Th);
  if (p->attn_mask) fc_tile_attn_mask(kern, p, q->s, h, i0 + a, rows, j0 + c0, c1 - c0, S, Bc);
  fc_tile_mask(p, q->shift, q->sk, i0 + a, rows, j0 + c0, c1 - c0, w, S, Bc);
  kern->gemm(rows, w, dv, dO, ldv, 1, T->Vt + c0 / nr * dv * nr, dv * nr, nr, dS, Bc, 0);

  /* P = 2^(S − lse·log2 e), dS = P ∘ (Z ∘ dP − D_i), then P ∘ Z for dV */
  const int drop = p->dropout_p > 0.0f;
  const float rp = drop ? (float)(1.0 / (1.0 - (double)p->dropout_p)) : 1.0f;
  for (int64_t r = 0; r < rows; r++) {
    if (T->lse2[a + r] == -INFINITY) { /* a row that saw no key in the forward: P = 0 (2^(S + inf) is not) */
      memset(S + r * Bc, 0, (size_t)w * sizeof(float));
      memset(dS + r * Bc, 0, (size_t)w * sizeof(float));
    } else {
      uint8_t keep[256]; /* c1 − c0 ≤ Bc ≤ 256 */
      if (drop) {
        fc_dropout_keep_row(p, q->s, h, q->sk, i0 + a + r, j0 + c0, c1 - c0, keep);
        fc_dropout_apply(keep, c1 - c0, rp, dS + r * Bc);
      }
      kern->softmax_grad_row(S + r * Bc, dS + r * Bc, w, T->lse2[a + r], T->D[a + r]);
      if (drop) fc_dropout_apply(keep, c1 - c0, rp, S + r * Bc);
      if (ctx->dS_all) /* dbias: this tile is the only writer of these elements */
        memcpy(ctx->dS_all + (first + r) * q->sk + j0 + c0, dS + r * Bc, (size_t)(c1 - c0) * sizeof(float));
      /* Through the softcap: ∂(cap·tanh(x))/∂(cap·x) = 1 − tanh²(x). */
      if (Th)
        for (int64_t c = 0; c < w; c++) dS[r * Bc + c] *= 1.0f - Th[r * Bc + c] * Th[r * Bc + c];
    }
  }

  /* dV_j += Pᵀ dO_i, dK_j += dSᵀ Q_i (scale at the store), over key rows [c0, c1) */
  kern->gemm(c1 - c0, dvp, rows, S, 1, Bc, dO, nr, ldv, T->dV + c0 * dvp, dvp, 1);
  kern->gemm(c1 - c0, dp, rows, dS, 1, Bc, Q, nr, ld, T->dK + c0 * dp, dp, 1);
  /* dS K_j, added to dQ_i in the caller's turn (scale at the store) */
  kern->gemm(rows, dp, c1 - c0, dS, Bc, 1, T->K + c0 * ld, nr, ld, T->dQ + a * dp, dp, 0);
}

static void dkdv_task(void *vctx, int64_t t, int worker) {
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t group = p->heads_q / p->heads_kv, d = p->head_dim, dp = fc_pad8(d), dv = p->head_dim_v,
                dvp = fc_pad8(dv), nr = kern->nr;
  int64_t s, hk, jb;
  task_block(ctx, t, &s, &hk, &jb);
  const seq_info q = seq_of(p, s);
  const int64_t Bc = ctx->z.bc, Br = ctx->z.br, j0 = jb * Bc, jn = q.sk - j0 < Bc ? q.sk - j0 : Bc;
  bwd_tiles T;
  bwd_tiles_carve(kern, p, ctx->z, fc_scratch_worker(&ctx->scratch, worker), &T);

  /* K_jᵀ carries scale·log2 e (scale / softcap under a softcap: fc_score_mul), so that S is in base 2 while Q_i,
   * and K_j for dQ, stay plain. */
  fc_tile_pack_t(kern, p, (fc_rows){&p->k, s, q.k0, j0, jn, hk}, fc_score_mul(p), T.Kt, d * nr);
  fc_tile_pack_t(kern, p, (fc_rows){&p->v, s, q.k0, j0, jn, hk}, 1.0f, T.Vt, dv * nr);
  fc_tile_load(kern, p, (fc_rows){&p->k, s, q.k0, j0, jn, hk}, 1.0f, T.K, fc_tile_ld(dp));
  memset(T.dK, 0, (size_t)(jn * dp) * sizeof *T.dK);
  memset(T.dV, 0, (size_t)(jn * dvp) * sizeof *T.dV);

  int64_t i_lo, i_hi;
  fc_rows_seeing(p, q.shift, q.sq, j0, j0 + jn, &i_lo, &i_hi);
  const int64_t g0 = ctx->q_blocks.first ? ctx->q_blocks.first[s] : s * ctx->q_blocks.per_seq;
  for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
    for (int64_t ib = i_lo / Br; ib * Br < i_hi; ib++) {
      int64_t lo, hi;
      block_keys(ctx, &q, ib, &lo, &hi);
      if (lo >= hi || lo >= j0 + jn || hi <= j0) continue; /* this key block does not add to dQ_i */
      const int64_t i0 = ib * Br, in = q.sq - i0 < Br ? q.sq - i0 : Br;
      int64_t a, b;
      fc_tile_rows(p, q.shift, q.sq, i0, in, j0, jn, &a, &b);
      if (a < b) tile_step(ctx, &T, &q, h, i0, a, b, j0, jn);

      /* dQ_i += dS K_j, in turn: after key blocks lo / Bc .. jb − 1 */
      dq_ticket *ticket = &ctx->ticket[h * ctx->q_blocks.total + g0 + ib];
      const int turn = (int)(jb - lo / Bc), adders = (int)((hi - 1) / Bc - lo / Bc + 1);
      wait_for_turn(&ticket->added, turn);
      float *acc = ctx->dq_acc + fc_lse_index(p, s, q.q0, h, i0) * dp;
      for (int64_t r = a; r < b; r++)
        for (int64_t c = 0; c < dp; c++) acc[r * dp + c] += T.dQ[r * dp + c];
      if (turn + 1 == adders) { /* the last: dQ_i is complete */
        if (!fc_all_finite(acc, in * dp)) atomic_store_explicit(ctx->fp64, 1, memory_order_relaxed);
        fc_tile_store(kern, p, (fc_rows){&p->dq, s, q.q0, i0, in, h}, p->scale, acc, dp);
      }
      atomic_store_explicit(&ticket->added, turn + 1, memory_order_release);
    }
  }
  /* A gradient that overflowed (from finite inputs and a finite lse: values near 3e38) is redone in fp64. */
  if (!fc_all_finite(T.dK, jn * dp) || !fc_all_finite(T.dV, jn * dvp))
    atomic_store_explicit(ctx->fp64, 1, memory_order_relaxed);
  /* Every key row is written, those that no query sees with 0. */
  fc_tile_store(kern, p, (fc_rows){&p->dk, s, q.k0, j0, jn, hk}, p->scale, T.dK, dp);
  fc_tile_store(kern, p, (fc_rows){&p->dv, s, q.k0, j0, jn, hk}, 1.0f, T.dV, dvp);
}

/* ---- pass 2: dbias, dS summed over the dims whose dbias_stride is 0 -------------------------------------- */
/* The extent of dimension d of [batch, heads_q, seqlen_q, seqlen_k] that dbias keeps: 1 where it sums. */
static int64_t dbias_kept(const fc_problem *p, int d) {
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  return p->dbias_stride[d] != 0 ? n[d] : 1;
}

/* One element row (b, h, i) of dbias: its sums in fp64 in a fixed order (sequence, head, row), so the result does
 * not depend on the threads; chunks of keys keep the sums on the stack. */
static void dbias_task(void *vctx, int64_t t, int worker) {
  (void)worker;
  const bwd_ctx *ctx = vctx;
  const fc_problem *p = ctx->p;
  const int64_t ni = dbias_kept(p, 2), nh = dbias_kept(p, 1), sk = p->seqlen_k, sq = p->seqlen_q, hq = p->heads_q;
  const int64_t oi = t % ni, oh = t / ni % nh, ob = t / ni / nh, *st = p->dbias_stride;
  const bool all_b = st[0] == 0, all_h = st[1] == 0, all_i = st[2] == 0;
  const int64_t at = fc_attn_mask_offset(st, ob, oh, oi, 0);
  enum { CHUNK = 64 };
  double total = 0.0; /* along the keys too, when dbias sums them */
  for (int64_t j0 = 0; j0 < sk; j0 += CHUNK) {
    const int64_t n = sk - j0 < CHUNK ? sk - j0 : CHUNK;
    double acc[CHUNK] = {0};
    for (int64_t s = all_b ? 0 : ob; s < (all_b ? p->batch : ob + 1); s++)
      for (int64_t h = all_h ? 0 : oh; h < (all_h ? hq : oh + 1); h++)
        for (int64_t i = all_i ? 0 : oi; i < (all_i ? sq : oi + 1); i++) {
          const float *row = ctx->dS_all + ((s * hq + h) * sq + i) * sk + j0;
          for (int64_t c = 0; c < n; c++) acc[c] += row[c];
        }
    if (st[3] == 0)
      for (int64_t c = 0; c < n; c++) total += acc[c];
    else
      for (int64_t c = 0; c < n; c++) fc_store(p->dbias, p->dtype, at + (j0 + c) * st[3], acc[c]);
  }
  if (st[3] == 0) fc_store(p->dbias, p->dtype, at, total);
}

flashc_status fc_cpu_flash_backward(const fc_problem *p) {
  const fc_cpu_kernels *kern = fc_cpu_kernels_pick();
  const int64_t d = p->head_dim, dp = fc_pad8(d);
  bwd_ctx ctx = {.p = p, .kern = kern, .z = sizes_for(p)};
  const bwd_sizes z = ctx.z;
  const int varlen = p->cu_seqlens_q != NULL;
  const int64_t q_blocks = fc_blocks_count(p, 0, z.br), k_blocks = fc_blocks_count(p, 1, z.bc);
  /* Shared: D and the dQ accumulators for every (row, query head), the tickets, the block numberings of
   * varlen sequences. */
  const size_t D_bytes = fc_align_up((size_t)(p->heads_q * p->total_q) * sizeof(float));
  const size_t acc_bytes = fc_align_up((size_t)(p->heads_q * p->total_q * dp) * sizeof(float));
  const size_t ticket_bytes = (size_t)(p->heads_q * q_blocks) * sizeof(dq_ticket);
  const size_t first_bytes = fc_align_up(varlen ? (size_t)(p->batch + 1) * sizeof(int64_t) : 0);
  int64_t dS_elems = 0; /* dbias: dS of the whole call (attn_mask is dense only: total_q = batch·seqlen_q) */
  if (p->dbias && (!fc_mul_ok(p->heads_q * p->total_q, p->seqlen_k, &dS_elems) ||
                   (uint64_t)dS_elems > (SIZE_MAX - 2 * FC_SCRATCH_ALIGN) / sizeof(float) / 2))
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY,
                    "flashc_backward (cpu): dbias needs dS of %lld x %lld x %lld floats, "
                    "more than this machine can address",
                    (long long)p->heads_q, (long long)p->total_q, (long long)p->seqlen_k);
  const size_t dS_bytes = fc_align_up((size_t)dS_elems * sizeof(float));
  bwd_tiles unused;
  FC_CHECK(fc_scratch_get(p, p->heads_kv * k_blocks, D_bytes + acc_bytes + ticket_bytes + 2 * first_bytes + dS_bytes,
                          bwd_tiles_carve(kern, p, z, NULL, &unused), &ctx.scratch));
  char *shared = ctx.scratch.shared;
  ctx.D = (float *)shared;
  ctx.dq_acc = (float *)(shared + D_bytes);
  ctx.ticket = (dq_ticket *)(shared + D_bytes + acc_bytes);
  int64_t *q_first = (int64_t *)(shared + D_bytes + acc_bytes + ticket_bytes),
          *k_first = q_first + first_bytes / sizeof(int64_t);
  if (p->dbias) { /* every element a tile does not write (hidden keys, rows that see none) is 0 */
    ctx.dS_all = (float *)((char *)k_first + first_bytes);
    memset(ctx.dS_all, 0, (size_t)dS_elems * sizeof(float));
  }
  fc_blocks_init(&ctx.q_blocks, p, 0, z.br, q_first);
  fc_blocks_init(&ctx.k_blocks, p, 1, z.bc, k_first);

  atomic_int fp64 = 0;
  ctx.fp64 = &fp64;
  const int threads = ctx.scratch.threads;
  if (ctx.q_blocks.total > 0) fc_parallel_for(threads, p->heads_q * ctx.q_blocks.total, d_task, &ctx);
  if (!atomic_load(&fp64) && ctx.k_blocks.total > 0)
    fc_parallel_for(threads, p->heads_kv * ctx.k_blocks.total, dkdv_task, &ctx);
  if (atomic_load(&fp64)) return fc_backend_cpu_ref.backward(p); /* writes every dq, dk, dv (and dbias) again */
  if (p->dbias) fc_parallel_for(threads, dbias_kept(p, 0) * dbias_kept(p, 1) * dbias_kept(p, 2), dbias_task, &ctx);
  return FLASHC_OK;
}
