/*
 * kvcache.c — cpu over a KV cache: decoding on CPU threads, keys split between tasks and merged through the lse.
 *
 * Decoding is bound by memory bandwidth: a step reads every cached key and value once and does 4·d flops per key
 * and query row. So a task takes one sequence b, a block of HB kv heads and every query row that reads them: per kv
 * head hk, the g = heads_q / heads_kv heads of its group times the seqlen_q new rows, as one tile Q of G = g·seqlen_q
 * rows (row r is query row r / g of query head hk·g + r % g). K and V are read once for all of them, and a key's
 * rows of the HB heads are read together: in the usual [.., seq, heads, d] layout they are adjacent, so the task
 * streams memory in order (one head per task instead read 256 of every 2048 bytes and ran at less than half the
 * bandwidth, h 32/8, d 128, bf16). Long caches are cut into splits of keys, one task each, so that one sequence
 * keeps every thread busy; each task leaves a partial (O_s unnormalised, m_s, l_s per row) and a second pass merges
 * them (FlashAttention's split-KV, "flash decoding"):
 *   M = max_s m_s,  L = Σ_s 2^(m_s − M) l_s,  O = Σ_s 2^(m_s − M) O_s / L,  lse = (M + log2 L) · ln 2
 * Within a task the loop is flash.c's: per block K_j, V_j of Bc keys, gathered from the pages and converted to fp32,
 *   S = Q K_jᵀ (base 2),  m_new = max(m, rowmax S),  P = 2^(S − m_new),  l = 2^(m − m_new) l + rowsum P,
 *   O = 2^(m − m_new) O + P V_j
 * with the products in the SIMD gemm of kernels.h. The splits depend on the shape only (the longest len_b and
 * cache.num_splits), never on the thread count, and the merge sums the splits in order: o and lse are
 * bit-identical at every thread count. Rows that leave fp32 are redone by the oracle (ref_kvcache.c), as flash.c
 * does.
 */
#include "../kvcache.h"
#include "flash.h"
#include "kernels.h"
#include "scratch.h"
#include "tile.h"

#include <string.h>

/* Bc = 64 keys per block: a task holds K_jᵀ and V_j of up to HB = 8 heads (h 32/8: every head of a sequence), about
 * 600 KB at d = 128, within L2. Up to RB = 128 query rows per task (over its heads: decoding has G = g·seqlen_q ≤ 128
 * for every common head layout); row groups of RG = 24 keep a group's S tile in L1 through the softmax. A split is
 * SPLIT_KEYS = 1024 keys by default: with d = 128 in bf16 that is 256 KB of K and V per head against a partial of
 * G·(d + 2) floats, so the merge costs well under 1% while an 8k-token cache already gives 8 tasks per head block.
 * Splits double while there would be more than MAX_TASKS tasks (a large batch fills the threads already, and each
 * split's partial takes memory), and halve down to MIN_SPLIT keys while there would be fewer than MIN_TASKS: one
 * sequence of 1k keys at heads 32/8 is otherwise one task, one thread of the machine's. */
enum { BC = 64, RB = 128, RG = 24, HB_MAX = 8, SPLIT_KEYS = 1024, MIN_SPLIT = 256, MIN_TASKS = 16, MAX_TASKS = 4096 };
enum { KT_LD = BC + 16 };

typedef struct {
  float *Q, *K8, *Kt, *V, *S, *row, *part;
} kv_tiles;

typedef struct {
  const fc_kv_problem *kp;
  const fc_cpu_kernels *kern;
  int64_t g, G;          /* query heads per kv head; query rows per kv head */
  int64_t hb, nhb;       /* kv heads per task, head blocks */
  int64_t R, nrb;        /* rows per head in a task (≤ RB), row blocks (more than 1 only when hb = 1) */
  int64_t nsplit, split; /* splits, and the keys of each (a multiple of Bc) */
  int64_t part_floats;   /* one task's partial: hb·R·dp + 2·hb·R floats, rounded to 16 */
  int64_t v_head, v_ld;  /* V_j in the tiles: head x's at V + x·v_head, rows v_ld apart (whole_keys: [Bc][hb][dp]) */
  bool whole_keys;       /* a key's rows of consecutive kv heads adjacent in both caches, d a multiple of 8 */
  float *parts;          /* every task's partial, when nsplit > 1 */
  fc_scratch scratch;
} kv_ctx;

/* One worker's tiles; `part` (a task's partial) only when the task finalises its rows itself (one split). */
static size_t kv_tiles_carve(const kv_ctx *ctx, int64_t d, bool own_part, char *base, kv_tiles *t) {
  const int64_t dp = fc_pad8(d), hb = ctx->hb;
  fc_carve c = {base, 0};
  t->Q = fc_carve_floats(&c, hb * ctx->R * dp);         /* Q      [hb][R][dp], scale·log2 e applied */
  t->K8 = fc_carve_floats(&c, hb * 8 * dp);             /* 8 keys of each head as loaded          */
  t->Kt = fc_carve_floats(&c, hb * d * KT_LD);          /* K_jᵀ   [hb][d][KT_LD]: right operands  */
  t->V = fc_carve_floats(&c, hb * BC * fc_tile_ld(dp)); /* V_j  [hb][Bc][ld] or [Bc][hb][dp]      */
  t->S = fc_carve_floats(&c, RG * BC);                  /* S, P   [RG][Bc]                        */
  t->row = fc_carve_floats(&c, dp);                     /* one merged output row                 */
  t->part = fc_carve_floats(&c, own_part ? ctx->part_floats : 0);
  return c.used;
}

/* Row j of sequence b, kv head hk in view c (the problem's pages): its place, and one row into fp32. */
static fc_rows key_row(const kv_ctx *ctx, const fc_view *c, int64_t b, int64_t j, int64_t hk) {
  const fc_kv_problem *kp = ctx->kp;
  fc_rows at = {c, b, 0, j, 1, hk};
  if (kp->block_table) {
    at.s = kp->block_table[b * kp->block_table_stride + j / kp->page_size];
    at.row0 = j % kp->page_size;
  }
  return at;
}
static void load_row(const kv_ctx *ctx, const fc_view *c, int64_t b, int64_t j, int64_t hk, float *dst) {
  fc_tile_load(ctx->kern, &ctx->kp->base, key_row(ctx, c, b, j, hk), 1.0f, dst, fc_pad8(ctx->kp->base.head_dim));
}
/* Key j's rows of kv heads [hk0, hk0 + nh) as one run (whole_keys): nh·d values into dst. */
static void load_key(const kv_ctx *ctx, const fc_view *c, int64_t b, int64_t j, int64_t hk0, int64_t nh, float *dst) {
  const fc_rows at = key_row(ctx, c, b, j, hk0);
  fc_tile_load_run(ctx->kern, ctx->kp->base.dtype, c->data, fc_offset(c, at.s, 0, at.row0, hk0),
                   nh * ctx->kp->base.head_dim, 1.0f, dst);
}

/* K_jᵀ and V_j of keys [j0, j0 + jn) for heads [hk0, hk0 + nh), key by key so that memory is read in order:
 * K through 8-key groups transposed into Kt (columns [jn, pad8(jn)) zeroed, so that the padding columns of S are
 * finite before the mask sets them to −inf), V row-major. */
static void gather(const kv_ctx *ctx, int64_t b, int64_t hk0, int64_t nh, int64_t j0, int64_t jn, kv_tiles *T) {
  const fc_kv_problem *kp = ctx->kp;
  const int64_t d = kp->base.head_dim, dp = fc_pad8(d), gc = fc_pad8(jn), hb = ctx->hb;
  for (int64_t r0 = 0; r0 < jn; r0 += 8) {
    const int64_t n = jn - r0 < 8 ? jn - r0 : 8;
    if (ctx->whole_keys) { /* one call per key and cache: K8 [8][hb][dp], V [Bc][hb][dp] */
      for (int64_t r = r0; r < r0 + n; r++) {
        load_key(ctx, &kp->k_cache, b, j0 + r, hk0, nh, T->K8 + (r - r0) * hb * dp);
        load_key(ctx, &kp->v_cache, b, j0 + r, hk0, nh, T->V + r * ctx->v_ld);
      }
      for (int64_t x = 0; x < nh; x++)
        ctx->kern->transpose(T->K8 + x * dp, hb * dp, n, d, T->Kt + x * d * KT_LD + r0, KT_LD);
      continue;
    }
    for (int64_t r = r0; r < r0 + n; r++) /* K8 [hb][8][dp], V [hb][Bc][v_ld] */
      for (int64_t x = 0; x < nh; x++) {
        load_row(ctx, &kp->k_cache, b, j0 + r, hk0 + x, T->K8 + (x * 8 + r - r0) * dp);
        load_row(ctx, &kp->v_cache, b, j0 + r, hk0 + x, T->V + x * ctx->v_head + r * ctx->v_ld);
      }
    for (int64_t x = 0; x < nh; x++)
      ctx->kern->transpose(T->K8 + x * 8 * dp, dp, n, d, T->Kt + x * d * KT_LD + r0, KT_LD);
  }
  if (gc > jn)
    for (int64_t x = 0; x < nh; x++)
      for (int64_t c = 0; c < d; c++) memset(T->Kt + (x * d + c) * KT_LD + jn, 0, (size_t)(gc - jn) * sizeof(float));
}

/* The task's place: sequence b, heads [*hk0, *hk0 + *nh), rows [*r0, *r0 + *n) of each head's G. */
static void task_place(const kv_ctx *ctx, int64_t u, int64_t *b, int64_t *hk0, int64_t *nh, int64_t *r0, int64_t *n) {
  const int64_t rb = u % ctx->nrb, hb = u / ctx->nrb % ctx->nhb, hkv = ctx->kp->base.heads_kv;
  *b = u / ctx->nrb / ctx->nhb;
  *hk0 = hb * ctx->hb;
  *nh = hkv - *hk0 < ctx->hb ? hkv - *hk0 : ctx->hb;
  *r0 = rb * RB;
  *n = ctx->G - *r0 < RB ? ctx->G - *r0 : RB;
}

/* The merged rows of unit u (sequence, head block, row block) from its nsplit partials at parts (stride
 * part_floats): o and lse. */
static void finalize(const kv_ctx *ctx, int64_t u, const float *parts, float *row) {
  const fc_kv_problem *kp = ctx->kp;
  const fc_problem *p = &kp->base;
  const fc_cpu_kernels *kern = ctx->kern;
  int64_t b, hk0, nh, r0, n;
  task_place(ctx, u, &b, &hk0, &nh, &r0, &n);
  const int64_t d = p->head_dim, dp = fc_pad8(d), R = ctx->R, m_at = ctx->hb * R * dp, l_at = m_at + ctx->hb * R;
  const int64_t len = fc_kv_len(kp, b), shift = fc_mask_shift(p, p->seqlen_q, len);
  for (int64_t x = 0; x < nh; x++)
    for (int64_t r = 0; r < n; r++) {
      const int64_t k = x * R + r, i = (r0 + r) / ctx->g, h = (hk0 + x) * ctx->g + (r0 + r) % ctx->g;
      float M = -INFINITY, L = 0.0f;
      for (int64_t s = 0; s < ctx->nsplit; s++) M = fc_max_nan(M, parts[s * ctx->part_floats + m_at + k]);
      memset(row, 0, (size_t)dp * sizeof *row);
      if (M != -INFINITY) {
        for (int64_t s = 0; s < ctx->nsplit; s++) {
          const float *part = parts + s * ctx->part_floats, m_s = part[m_at + k];
          if (m_s == -INFINITY) continue; /* a split in which the row saw no key adds nothing */
          const float alpha = exp2f(m_s - M);
          L += alpha * part[l_at + k];
          for (int64_t c = 0; c < d; c++) row[c] += alpha * part[k * dp + c];
        }
        kern->scale_row(row, dp, L > 0.0f ? 1.0f / L : 0.0f);
      }
      /* Rows that left fp32 (flash.h): a maximum of NaN or ±inf, a sum or an output that is not finite. A row with
       * M = −inf and a visible key saw only scores of −inf (or below fp32's range): the oracle decides. */
      if (!(isfinite(M) && isfinite(L) && fc_all_finite(row, d))) {
        int64_t lo, hi;
        fc_key_range(p, shift, i, len, &lo, &hi);
        if (M != -INFINITY || lo < hi) {
          fc_ref_kvcache_row(kp, b, h, i);
          continue;
        }
      }
      fc_tile_store(kern, p, (fc_rows){&p->o, b, 0, i, 1, h}, 1.0f, row, dp);
      if (p->lse) p->lse[fc_lse_index(p, b, 0, h, i)] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * FC_LN2;
    }
}

/* Task t = unit·nsplit + split, unit = (b·nhb + head block)·nrb + row block: its rows against the keys of the split. */
static void split_task(void *vctx, int64_t t, int worker) {
  const kv_ctx *ctx = vctx;
  const fc_kv_problem *kp = ctx->kp;
  const fc_problem *p = &kp->base;
  const fc_cpu_kernels *kern = ctx->kern;
  const int64_t sp = t % ctx->nsplit, u = t / ctx->nsplit;
  int64_t b, hk0, nh, r0, n;
  task_place(ctx, u, &b, &hk0, &nh, &r0, &n);
  const int64_t d = p->head_dim, dp = fc_pad8(d), nr = kern->nr, g = ctx->g, R = ctx->R;
  const int64_t len = fc_kv_len(kp, b), sq = p->seqlen_q, shift = fc_mask_shift(p, sq, len);
  kv_tiles T;
  kv_tiles_carve(ctx, d, ctx->nsplit == 1, fc_scratch_worker(&ctx->scratch, worker), &T);
  float *O = ctx->nsplit == 1 ? T.part : ctx->parts + t * ctx->part_floats, *m = O + ctx->hb * R * dp,
        *l = m + ctx->hb * R;
  memset(O, 0, (size_t)(ctx->hb * R * dp) * sizeof *O);
  for (int64_t k = 0; k < ctx->hb * R; k++) m[k] = -INFINITY, l[k] = 0.0f;

  /* The keys this task may need: those any of its rows sees, within the split. */
  int64_t j_lo, j_hi;
  fc_keys_seen(p, shift, len, r0 / g, (r0 + n - 1) / g + 1, &j_lo, &j_hi);
  const int64_t split_lo = sp * ctx->split, split_hi = split_lo + ctx->split;
  if (j_lo < split_lo) j_lo = split_lo;
  if (j_hi > split_hi) j_hi = split_hi;

  if (j_lo < j_hi) /* Q = scale·log2(e)·q, row by row (the g heads of a query row are adjacent rows) */
    for (int64_t x = 0; x < nh; x++)
      for (int64_t r = 0; r < n; r++) {
        const int64_t i = (r0 + r) / g, h = (hk0 + x) * g + (r0 + r) % g;
        fc_tile_load(kern, p, (fc_rows){&p->q, b, 0, i, 1, h}, p->scale * FC_LOG2E, T.Q + (x * R + r) * dp, dp);
      }
  /* Blocks start at multiples of Bc (splits are multiples of Bc), so a row meets the same blocks in the same order
   * whatever its task's other rows. */
  for (int64_t j0 = j_lo / BC * BC; j0 < j_hi; j0 += BC) {
    const int64_t jn = j_hi - j0 < BC ? j_hi - j0 : BC, gc = fc_pad8(jn);
    int64_t ilo, ihi;
    fc_rows_seeing(p, shift, sq, j0, j0 + jn, &ilo, &ihi);
    const int64_t a = (ilo * g > r0 ? ilo * g : r0) - r0, bb = (ihi * g < r0 + n ? ihi * g : r0 + n) - r0;
    if (a >= bb) continue;
    gather(ctx, b, hk0, nh, j0, jn, &T);

    for (int64_t x = 0; x < nh; x++) {
      const float *Q = T.Q + x * R * dp, *Kt = T.Kt + x * d * KT_LD, *V = T.V + x * ctx->v_head;
      float *O_x = O + x * R * dp, *m_x = m + x * R, *l_x = l + x * R;
      for (int64_t q0 = a; q0 < bb; q0 += RG) {
        const int64_t rows = bb - q0 < RG ? bb - q0 : RG;
        /* S = Q K_jᵀ, −inf where the mask hides a key (and in the padding columns). */
        kern->gemm(rows, gc, d, Q + q0 * dp, dp, 1, Kt, nr, KT_LD, T.S, BC, 0);
        for (int64_t r = q0; r < q0 + rows; r++)
          fc_tile_mask(p, shift, len, (r0 + r) / g, 1, j0, jn, gc, T.S + (r - q0) * BC, BC);
        /* m_new = max(m, rowmax S), P = 2^(S − m_new), l = 2^(m − m_new) l + rowsum P, O = 2^(m − m_new) O */
        for (int64_t r = q0; r < q0 + rows; r++) {
          float *S_r = T.S + (r - q0) * BC;
          const float m_new = fc_max_nan(m_x[r], kern->row_max(S_r, gc));
          /* A row that has seen no key yet subtracts 0, not −inf (flash.c). */
          const float m_use = m_new == -INFINITY ? 0.0f : m_new, alpha = exp2f(m_x[r] - m_use);
          l_x[r] = alpha * l_x[r] + kern->exp2_row(S_r, gc, m_use);
          m_x[r] = m_new;
          if (alpha != 1.0f) kern->scale_row(O_x + r * dp, dp, alpha);
        }
        /* O += P V_j */
        kern->gemm(rows, dp, jn, T.S, BC, 1, V, nr, ctx->v_ld, O_x + q0 * dp, dp, 1);
      }
    }
  }
  if (ctx->nsplit == 1) finalize(ctx, u, O, T.row);
}

static void merge_task(void *vctx, int64_t u, int worker) {
  const kv_ctx *ctx = vctx;
  kv_tiles T;
  kv_tiles_carve(ctx, ctx->kp->base.head_dim, false, fc_scratch_worker(&ctx->scratch, worker), &T);
  finalize(ctx, u, ctx->parts + u * ctx->nsplit * ctx->part_floats, T.row);
}

flashc_status fc_cpu_forward_kvcache(const fc_kv_problem *kp) {
  fc_kv_append_host(kp);
  const fc_problem *p = &kp->base;
  if (p->batch == 0 || p->seqlen_q == 0) return FLASHC_OK; /* no query row: the append was all */
  kv_ctx ctx = {.kp = kp, .kern = fc_cpu_kernels_pick()};
  const int64_t dp = fc_pad8(p->head_dim), keys = p->seqlen_k; /* the longest len_b */
  ctx.g = p->heads_q / p->heads_kv;
  ctx.G = ctx.g * p->seqlen_q;
  ctx.R = ctx.G < RB ? ctx.G : RB;
  ctx.nrb = (ctx.G + RB - 1) / RB;
  ctx.hb = ctx.nrb > 1 ? 1 : RB / ctx.G; /* heads whose rows fit one task together */
  if (ctx.hb > HB_MAX) ctx.hb = HB_MAX;
  if (ctx.hb > p->heads_kv) ctx.hb = p->heads_kv;
  ctx.nhb = (p->heads_kv + ctx.hb - 1) / ctx.hb;
  ctx.part_floats = fc_round_up(ctx.hb * ctx.R * (dp + 2), 16);
  /* A key's rows of a head block in one load where the caches lay them side by side ([.., seq, heads, d], the usual
   * layout): one conversion call per key and cache instead of one per head (decoding b1, heads 8/2, d 64, a cache of
   * 256 keys: 512 calls instead of 1024 per step). */
  ctx.whole_keys =
      dp == p->head_dim && ctx.hb > 1 && kp->k_cache.stride_h == p->head_dim && kp->v_cache.stride_h == p->head_dim;
  ctx.v_head = ctx.whole_keys ? dp : BC * fc_tile_ld(dp);
  ctx.v_ld = ctx.whole_keys ? ctx.hb * dp : fc_tile_ld(dp);
  const int64_t units = p->batch * ctx.nhb * ctx.nrb; /* tasks per split */
  /* The caller's splits are a request: more than 4 × MAX_TASKS tasks would only add partials to merge. */
  const int64_t most = kp->num_splits > 0 ? 4 * MAX_TASKS : MAX_TASKS;
  ctx.split = kp->num_splits > 0 ? fc_round_up((keys + kp->num_splits - 1) / kp->num_splits, BC) : SPLIT_KEYS;
  while (units * ((keys + ctx.split - 1) / ctx.split) > most && ctx.split < keys) ctx.split *= 2;
  while (kp->num_splits <= 0 && units * ((keys + ctx.split - 1) / ctx.split) < MIN_TASKS && ctx.split > MIN_SPLIT)
    ctx.split /= 2;
  if (ctx.split < BC) ctx.split = BC;
  ctx.nsplit = keys > ctx.split ? (keys + ctx.split - 1) / ctx.split : 1;

  const int64_t tasks = units * ctx.nsplit;
  size_t shared = 0;
  if (ctx.nsplit > 1 && __builtin_mul_overflow((size_t)tasks, (size_t)ctx.part_floats * sizeof(float), &shared))
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "flashc_forward_kvcache (cpu): partials of %lld tasks overflow size_t",
                    (long long)tasks);
  kv_tiles unused;
  FC_CHECK(fc_scratch_get(p, tasks, shared, kv_tiles_carve(&ctx, p->head_dim, ctx.nsplit == 1, NULL, &unused),
                          &ctx.scratch));
  ctx.parts = (float *)ctx.scratch.shared;
  fc_parallel_for(ctx.scratch.threads, tasks, split_task, &ctx);
  if (ctx.nsplit > 1) fc_parallel_for(ctx.scratch.threads, units, merge_task, &ctx);
  return FLASHC_OK;
}
