/*
 * ring.c — ring attention: exact attention over a sequence sharded across N ranks.
 *
 * Rank r holds Q_r, K_r, V_r (its rows of the whole sequence). In N steps the K/V blocks travel once around
 * the ring, r → r + 1, while rank r attends Q_r to the block it holds:
 *
 *   step t:  post  send(K/V held) → r + 1,  recv(next K/V) ← r − 1          (hidden under the compute)
 *            compute the local backend on (Q_r, K_src, V_src), src = r − t  (mask shifted to the block's place)
 *            forward:  merge (O_part, lse_part) into the f32 accumulator (O, lse)
 *            backward: dQ_r += dQ_part (f32, stays here); dK/dV_part go into an f32 accumulator that travels
 *                      with the block and arrives home after the last step
 *            wait for the exchange
 *
 * The local call is a backend's own forward/backward on an fc_problem whose views point into the shards and
 * the travelling buffer, with mask_offset = the block's diagonal shift in the whole sequence: a block whose
 * keys a query row cannot see at all is skipped, one seen entirely runs unmasked, the rest masked.
 *
 * Backward of a block: FlashAttention's backward needs only the final O and lse of a row (D = rowsum(dO∘O),
 * P = exp(S − lse)), not the block's own forward, so each block's backward is the backend's backward called
 * with the global O and lse of the shard; the blocks' gradients sum to the whole gradient.
 *
 * Precision. Accumulators (O, lse, dQ, dK, dV) are f32 from the first step to the last and rounded to the
 * output dtype once. A backend writes its outputs in the problem's dtype, so:
 *   - host: blocks are computed in f32 whenever the backend accepts f32 (both CPU backends compute in f32 or
 *     better anyway): the shards are converted once (exactly) and partial results are never rounded, so the
 *     ring matches one device to the accumulation order. K/V travel as f32 (twice the bytes of bf16).
 *   - device (and host with native partials): blocks run in the input dtype, the tensor-core kernels' only
 *     dtype, so each partial O or gradient is rounded once to bf16/f16 before its f32 accumulation. That adds
 *     at most half an ulp of the largest partial per block; the merged O is a convex combination of the
 *     partials (its error stays at one rounding), the gradients are sums over N blocks (their rounding errors
 *     add like a sum of N terms). tests/ring measures both against the same bar.
 *
 * Every rank first agrees on the call (shapes, dtype, params, layout, and whether any rank failed to prepare
 * it) through one reduction, so a mismatch or a local error fails on all ranks before any block moves.
 */
#include "ring.h"
#include "threads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define INVALID(...)     fc_error(FLASHC_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define UNSUPPORTED(...) fc_error(FLASHC_ERR_UNSUPPORTED, __VA_ARGS__)

/* ---- the plan of one call -------------------------------------------------------------------------- */
typedef struct ring_call {
  const char *op;
  flashc_ring r;
  int is_backward;
  flashc_ring_layout layout;
  fc_problem p0; /* the validated local problem on the caller's shards */
  const fc_backend *b;
  int on_device;
  const fc_ring_mem *mem;
  fc_ring_comm *comm; /* moves the blocks: MPI for host memory, NCCL for device memory */
  flashc_dtype cdt;   /* the dtype blocks are computed in */
  size_t csize;
  int64_t B, Lq, Lk, Hq, Hkv, D;
  int64_t shift;  /* the whole sequence's diagonal: query i sees key j ≤ i + shift (+ window_right) */
  int64_t wl, wr; /* windows; −1 unbounded */
  fc_ring_seg qseg[2];
  int nq;
  fc_tile q, o, dout; /* the shards the blocks read: the caller's, or their f32 copies */
  /* buffers (one arena per side) */
  void *kv[2];     /* travelling K then V, [B, Lk, Hkv, D] each, cdt */
  float *dkv[2];   /* travelling dK then dV accumulators, f32 (backward) */
  float *blk;      /* this step's dK/dV, f32 (backward) */
  float *acc;      /* O (forward) or dQ (backward) accumulator, f32 [B, Lq, Hq, D] */
  float *lse;      /* forward: the lse accumulator [B, Hq, Lq]; backward: lse per q run, [B, Hq, len] each */
  void *part;      /* a block's O (forward) or dQ (backward), cdt [B, len, Hq, D] */
  float *part_lse; /* a block's lse [B, Hq, len] (forward) */
  void *dk_part;   /* a block's dK then dV, cdt [B, len, Hkv, D] each (backward) */
  void *packed[3]; /* f32 copies of q, o, dout (host, when the input is f16/bf16) */
} ring_call;

/* ---- helpers --------------------------------------------------------------------------------------- */
static fc_tile tile_of(fc_view v, flashc_dtype dt) { return (fc_tile){v.data, dt, v.stride_b, v.stride_s, v.stride_h}; }

/* A contiguous [b, s, h, d] tile. */
static fc_tile dense(void *data, flashc_dtype dt, int64_t s, int64_t h, int64_t d) {
  return (fc_tile){data, dt, s * h * d, h * d, d};
}

/* The tile from row `row` on. */
static fc_tile from_row(fc_tile t, int64_t row) {
  t.data = (char *)t.data + row * t.stride_s * (int64_t)flashc_dtype_size(t.dtype);
  return t;
}

static fc_view view_of(fc_tile t) { return (fc_view){t.data, t.stride_b, t.stride_s, t.stride_h}; }

/* lse runs of length `len` from row `row` of a [b, h, rows] array: a [b, h, 1, len] tile. */
static fc_tile lse_tile(float *lse, int64_t heads, int64_t rows, int64_t row) {
  return (fc_tile){lse + row, FLASHC_F32, heads * rows, rows, 0};
}

static void fault_point(const struct flashc_ring_s *r, int step) {
  if (r->fault.mode == FC_RING_FAULT_NONE || r->fault.rank != r->rank || r->fault.step != step) return;
  if (r->fault.mode == FC_RING_FAULT_EXIT) {
    fprintf(stderr, "flashc ring: FLASHC_RING_FAULT: rank %d exits at step %d\n", r->rank, step);
    fflush(stderr);
    _exit(3);
  }
  int64_t ms = r->timeout_ms > 0 ? 3 * r->timeout_ms : 10000;
  fprintf(stderr, "flashc ring: FLASHC_RING_FAULT: rank %d stalls %lld ms at step %d\n", r->rank, (long long)ms, step);
  struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* ---- blocks ---------------------------------------------------------------------------------------- */
typedef enum { BLOCK_EMPTY, BLOCK_FULL, BLOCK_PARTIAL } block_kind;

/* Which keys of run ks the queries of run qs see. In block coordinates (i, j) query i sees key j iff
 *   j ≥ i + shift − wl  and  j ≤ i + shift + wr,   shift = qs.global0 − ks.global0 + the global diagonal
 * Row i sees some key iff i + shift + wr ≥ 0 and i + shift − wl ≤ lk − 1; every row sees every key iff the
 * first row's window reaches the last key and the last row's reaches the first. */
static block_kind classify(const ring_call *c, const fc_ring_seg *qs, const fc_ring_seg *ks, int64_t *shift) {
  int64_t sh = qs->global0 - ks->global0 + c->shift, lq = qs->len, lk = ks->len;
  int64_t imin = c->wr < 0 ? 0 : -sh - c->wr, imax = c->wl < 0 ? lq - 1 : lk - 1 - sh + c->wl;
  if (imin < 0) imin = 0;
  if (imax > lq - 1) imax = lq - 1;
  *shift = sh;
  if (imin > imax) return BLOCK_EMPTY;
  bool all = (c->wr < 0 || lk - 1 <= sh + c->wr) && (c->wl < 0 || lq - 1 + sh - c->wl <= 0);
  return all ? BLOCK_FULL : BLOCK_PARTIAL;
}

/* The backend's problem for queries qs against keys ks of the block in `kv`; outputs set by the caller. */
static fc_problem block_problem(const ring_call *c, block_kind kind, int64_t shift, const fc_ring_seg *qs,
                                const fc_ring_seg *ks, void *kv) {
  fc_problem p = c->p0;
  p.dtype = c->cdt;
  p.seqlen_q = qs->len;
  p.seqlen_k = ks->len;
  p.total_q = c->B * qs->len;
  p.total_k = c->B * ks->len;
  p.bottom_right = 0; /* the shift below is the whole diagonal */
  p.mask_offset = kind == BLOCK_FULL ? 0 : shift;
  p.window_left = kind == BLOCK_FULL ? -1 : c->wl;
  p.window_right = kind == BLOCK_FULL ? -1 : c->wr;
  p.q = view_of(from_row(c->q, qs->row0));
  fc_tile k = dense(kv, c->cdt, c->Lk, c->Hkv, c->D);
  fc_tile v = k;
  v.data = (char *)kv + c->B * c->Lk * c->Hkv * c->D * (int64_t)c->csize;
  p.k = view_of(from_row(k, ks->row0));
  p.v = view_of(from_row(v, ks->row0));
  if (c->is_backward) {
    p.o = view_of(from_row(c->o, qs->row0));
    p.dout = view_of(from_row(c->dout, qs->row0));
    p.lse = c->lse + c->B * c->Hq * qs->row0; /* the run's own [B, Hq, len] copy */
    p.dq = view_of(dense(c->part, c->cdt, qs->len, c->Hq, c->D));
    fc_tile dk = dense(c->dk_part, c->cdt, ks->len, c->Hkv, c->D), dv = dk;
    dv.data = (char *)c->dk_part + c->B * ks->len * c->Hkv * c->D * (int64_t)c->csize;
    p.dk = view_of(dk);
    p.dv = view_of(dv);
  } else {
    p.o = view_of(dense(c->part, c->cdt, qs->len, c->Hq, c->D));
    p.lse = c->part_lse;
  }
  return p;
}

/* ---- forward --------------------------------------------------------------------------------------- */
static flashc_status pack_kv(ring_call *c, void *kv) {
  fc_shape shape = {c->B, c->Lk, c->Hkv, c->D};
  fc_tile k = dense(kv, c->cdt, c->Lk, c->Hkv, c->D), v = k;
  v.data = (char *)kv + c->B * c->Lk * c->Hkv * c->D * (int64_t)c->csize;
  FC_CHECK(c->mem->copy(&c->p0, shape, tile_of(c->p0.k, c->p0.dtype), k));
  return c->mem->copy(&c->p0, shape, tile_of(c->p0.v, c->p0.dtype), v);
}

static flashc_status run_forward(ring_call *c) {
  flashc_ring r = c->r;
  const fc_ring_mem *mem = c->mem;
  const fc_problem *ctx = &c->p0;
  fc_ring_comm *comm = c->comm;
  int n = r->world;
  size_t kv_bytes = 2 * (size_t)(c->B * c->Lk * c->Hkv * c->D) * c->csize;
  FC_CHECK(pack_kv(c, c->kv[0]));
  if (c->packed[0]) FC_CHECK(mem->copy(ctx, (fc_shape){c->B, c->Lq, c->Hq, c->D}, tile_of(c->p0.q, c->p0.dtype), c->q));
  /* O = 0, lse = −inf: the state of a row that has seen no key yet. */
  FC_CHECK(mem->fill(ctx, c->acc, c->B * c->Lq * c->Hq * c->D, 0.0f));
  FC_CHECK(mem->fill(ctx, c->lse, c->B * c->Hq * c->Lq, -INFINITY));
  fc_tile acc = dense(c->acc, FLASHC_F32, c->Lq, c->Hq, c->D);
  int cur = 0;
  for (int t = 0; t < n; t++) {
    fault_point(r, t);
    int src = (r->rank - t + n) % n;
    if (t + 1 < n) FC_CHECK(comm->start(comm, FC_RING_KV, c->kv[cur], c->kv[cur ^ 1], kv_bytes, ctx->stream));
    fc_ring_seg ks[2];
    int nk = fc_ring_segments(c->layout, n, src, c->Lk, ks);
    for (int a = 0; a < c->nq; a++)
      for (int j = 0; j < nk; j++) {
        int64_t shift;
        block_kind kind = classify(c, &c->qseg[a], &ks[j], &shift);
        if (kind == BLOCK_EMPTY) continue;
        fc_problem p = block_problem(c, kind, shift, &c->qseg[a], &ks[j], c->kv[cur]);
        FC_CHECK(c->b->forward(&p));
        int64_t len = c->qseg[a].len;
        FC_CHECK(mem->merge(ctx, (fc_shape){c->B, len, c->Hq, c->D}, dense(c->part, c->cdt, len, c->Hq, c->D),
                            c->part_lse, len, acc, c->lse, c->Lq, c->qseg[a].row0));
      }
    if (t + 1 < n) {
      FC_CHECK(comm->wait(comm, FC_RING_KV, ctx->stream));
      cur ^= 1;
    }
    if (comm->mark) FC_CHECK(comm->mark(comm, ctx->stream));
  }
  /* O and lse leave f32 once. */
  FC_CHECK(mem->copy(ctx, (fc_shape){c->B, c->Lq, c->Hq, c->D}, acc, tile_of(c->p0.o, c->p0.dtype)));
  if (c->p0.lse)
    FC_CHECK(mem->copy(ctx, (fc_shape){c->B, c->Hq, 1, c->Lq}, lse_tile(c->lse, c->Hq, c->Lq, 0),
                       lse_tile(c->p0.lse, c->Hq, c->Lq, 0)));
  return comm->finish ? comm->finish(comm, ctx->stream) : FLASHC_OK;
}

/* ---- backward -------------------------------------------------------------------------------------- */
static flashc_status run_backward(ring_call *c) {
  flashc_ring r = c->r;
  const fc_ring_mem *mem = c->mem;
  const fc_problem *ctx = &c->p0;
  fc_ring_comm *comm = c->comm;
  int n = r->world;
  int64_t kv_elems = c->B * c->Lk * c->Hkv * c->D;
  size_t kv_bytes = 2 * (size_t)kv_elems * c->csize, dkv_bytes = 2 * (size_t)kv_elems * sizeof(float);
  fc_shape qshape = {c->B, c->Lq, c->Hq, c->D};
  FC_CHECK(pack_kv(c, c->kv[0]));
  if (c->packed[0]) {
    FC_CHECK(mem->copy(ctx, qshape, tile_of(c->p0.q, c->p0.dtype), c->q));
    FC_CHECK(mem->copy(ctx, qshape, tile_of(c->p0.o, c->p0.dtype), c->o));
    FC_CHECK(mem->copy(ctx, qshape, tile_of(c->p0.dout, c->p0.dtype), c->dout));
  }
  /* Each q run gets its own contiguous [B, Hq, len] lse, the layout a backend reads. */
  for (int a = 0; a < c->nq; a++) {
    int64_t row0 = c->qseg[a].row0, len = c->qseg[a].len;
    FC_CHECK(mem->copy(ctx, (fc_shape){c->B, c->Hq, 1, len}, lse_tile(c->p0.lse, c->Hq, c->Lq, row0),
                       lse_tile(c->lse + c->B * c->Hq * row0, c->Hq, len, 0)));
  }
  FC_CHECK(mem->fill(ctx, c->acc, c->B * c->Lq * c->Hq * c->D, 0.0f));
  FC_CHECK(mem->fill(ctx, c->dkv[0], 2 * kv_elems, 0.0f)); /* the accumulator of our own block, at step 0 */
  fc_tile dq_acc = dense(c->acc, FLASHC_F32, c->Lq, c->Hq, c->D);
  fc_tile dk_blk = dense(c->blk, FLASHC_F32, c->Lk, c->Hkv, c->D), dv_blk = dk_blk;
  dv_blk.data = c->blk + kv_elems;
  int cur = 0, dcur = 0; /* kv[cur]: the block held; dkv[dcur]: its accumulator */
  for (int t = 0; t < n; t++) {
    fault_point(r, t);
    int src = (r->rank - t + n) % n;
    if (t + 1 < n) FC_CHECK(comm->start(comm, FC_RING_KV, c->kv[cur], c->kv[cur ^ 1], kv_bytes, ctx->stream));
    /* dK, dV of this block, from every q run: summed here first, so that the accumulator coming from the
     * previous rank is needed only after all of this step's compute (its transfer hides under it). */
    FC_CHECK(mem->fill(ctx, c->blk, 2 * kv_elems, 0.0f));
    fc_ring_seg ks[2];
    int nk = fc_ring_segments(c->layout, n, src, c->Lk, ks);
    for (int a = 0; a < c->nq; a++)
      for (int j = 0; j < nk; j++) {
        int64_t shift;
        block_kind kind = classify(c, &c->qseg[a], &ks[j], &shift);
        if (kind == BLOCK_EMPTY) continue;
        fc_problem p = block_problem(c, kind, shift, &c->qseg[a], &ks[j], c->kv[cur]);
        FC_CHECK(c->b->backward(&p));
        int64_t ql = c->qseg[a].len, kl = ks[j].len;
        fc_tile dk_part = dense(c->dk_part, c->cdt, kl, c->Hkv, c->D), dv_part = dk_part;
        dv_part.data = (char *)c->dk_part + c->B * kl * c->Hkv * c->D * (int64_t)c->csize;
        FC_CHECK(mem->add(ctx, (fc_shape){c->B, ql, c->Hq, c->D}, dense(c->part, c->cdt, ql, c->Hq, c->D),
                          from_row(dq_acc, c->qseg[a].row0)));
        fc_shape kshape = {c->B, kl, c->Hkv, c->D};
        FC_CHECK(mem->add(ctx, kshape, dk_part, from_row(dk_blk, ks[j].row0)));
        FC_CHECK(mem->add(ctx, kshape, dv_part, from_row(dv_blk, ks[j].row0)));
      }
    /* The block's accumulator: zero (ours, at step 0) or what rank − 1 sent after its step t − 1. */
    if (t > 0) FC_CHECK(comm->wait(comm, FC_RING_DKV, ctx->stream));
    fc_shape both = {2 * c->B, c->Lk, c->Hkv, c->D}; /* dK then dV: 2B batches of one contiguous layout */
    FC_CHECK(mem->add(ctx, both, dense(c->blk, FLASHC_F32, c->Lk, c->Hkv, c->D),
                      dense(c->dkv[dcur], FLASHC_F32, c->Lk, c->Hkv, c->D)));
    if (n > 1) {
      FC_CHECK(comm->start(comm, FC_RING_DKV, c->dkv[dcur], c->dkv[dcur ^ 1], dkv_bytes, ctx->stream));
      dcur ^= 1;
    }
    if (t + 1 < n) {
      FC_CHECK(comm->wait(comm, FC_RING_KV, ctx->stream));
      cur ^= 1;
    }
    if (comm->mark) FC_CHECK(comm->mark(comm, ctx->stream));
  }
  /* After N steps every block is home: rank r's last send carried block r + 1's accumulator to r + 1. */
  if (n > 1) FC_CHECK(comm->wait(comm, FC_RING_DKV, ctx->stream));
  FC_CHECK(mem->copy(ctx, qshape, dq_acc, tile_of(c->p0.dq, c->p0.dtype)));
  fc_shape kvshape = {c->B, c->Lk, c->Hkv, c->D};
  fc_tile dk_acc = dense(c->dkv[dcur], FLASHC_F32, c->Lk, c->Hkv, c->D), dv_acc = dk_acc;
  dv_acc.data = c->dkv[dcur] + kv_elems;
  FC_CHECK(mem->copy(ctx, kvshape, dk_acc, tile_of(c->p0.dk, c->p0.dtype)));
  FC_CHECK(mem->copy(ctx, kvshape, dv_acc, tile_of(c->p0.dv, c->p0.dtype)));
  return comm->finish ? comm->finish(comm, ctx->stream) : FLASHC_OK;
}

/* ---- preparation (local: nothing is sent) ------------------------------------------------------------ */
/* Buffers of one call, carved from the side's arena: offsets first, then one allocation if it must grow. */
static flashc_status place_buffers(ring_call *c) {
  fc_ring_arena *arena = c->on_device ? &c->r->dev : &c->r->host;
  int64_t q_elems = c->B * c->Lq * c->Hq * c->D, kv_elems = c->B * c->Lk * c->Hkv * c->D;
  int64_t qrun = c->qseg[0].len, krun = c->nq == 2 ? c->Lk / 2 : c->Lk;
  size_t cs = c->csize, off = 0, at[16];
  int i = 0;
#define TAKE(bytes) (at[i++] = off, off += ((size_t)(bytes) + 255) & ~(size_t)255)
  TAKE(2 * kv_elems * cs); /* 0, 1: kv */
  TAKE(2 * kv_elems * cs);
  TAKE(q_elems * 4);                                  /* 2: acc */
  TAKE(c->B * c->Hq * c->Lq * 4);                     /* 3: lse */
  TAKE(c->B * qrun * c->Hq * c->D * cs);              /* 4: part */
  TAKE(c->is_backward ? 0 : c->B * c->Hq * qrun * 4); /* 5: part_lse */
  TAKE(c->is_backward ? 2 * kv_elems * 4 : 0);        /* 6, 7: dkv */
  TAKE(c->is_backward ? 2 * kv_elems * 4 : 0);
  TAKE(c->is_backward ? 2 * kv_elems * 4 : 0);                     /* 8: blk */
  TAKE(c->is_backward ? 2 * c->B * krun * c->Hkv * c->D * cs : 0); /* 9: dk_part */
  bool pack = c->cdt != c->p0.dtype;
  TAKE(pack ? q_elems * cs : 0); /* 10..12: packed q, o, dout */
  TAKE(pack && c->is_backward ? q_elems * cs : 0);
  TAKE(pack && c->is_backward ? q_elems * cs : 0);
#undef TAKE
  if (off > arena->size) {
    if (arena->base) c->mem->release(arena->base);
    arena->base = NULL;
    arena->size = 0;
    FC_CHECK(c->mem->alloc(off, &arena->base));
    arena->size = off;
  }
  char *base = arena->base;
  c->kv[0] = base + at[0];
  c->kv[1] = base + at[1];
  c->acc = (float *)(base + at[2]);
  c->lse = (float *)(base + at[3]);
  c->part = base + at[4];
  c->part_lse = (float *)(base + at[5]);
  c->dkv[0] = (float *)(base + at[6]);
  c->dkv[1] = (float *)(base + at[7]);
  c->blk = (float *)(base + at[8]);
  c->dk_part = base + at[9];
  c->q = tile_of(c->p0.q, c->p0.dtype);
  c->o = tile_of(c->p0.o, c->p0.dtype);
  c->dout = tile_of(c->p0.dout, c->p0.dtype);
  if (pack) {
    for (int k = 0; k < 3; k++) c->packed[k] = base + at[10 + k];
    c->q = dense(c->packed[0], c->cdt, c->Lq, c->Hq, c->D);
    c->o = dense(c->packed[1], c->cdt, c->Lq, c->Hq, c->D);
    c->dout = dense(c->packed[2], c->cdt, c->Lq, c->Hq, c->D);
  }
  return FLASHC_OK;
}

/* FlashAttention's backward takes the final lse and O of each row as inputs (P = exp(S − lse), D = rowsum(dO∘O));
 * that is what lets one block's backward run with the whole sequence's statistics. cpu-ref's backward
 * recomputes the softmax from q, k, v alone (the oracle must not inherit a given lse's rounding), so on one
 * block it would normalise over that block's keys only. (A capability bit in fc_backend would say this
 * better than a name.) */
static bool backward_reads_lse(const fc_backend *b) { return strcmp(b->name, "cpu-ref") != 0; }

/* Will the backend take every block of this call? Asked now, so that a refusal fails on every rank through
 * the agreement instead of in the middle of the ring. */
static flashc_status check_blocks(ring_call *c) {
  if (c->is_backward && !backward_reads_lse(c->b))
    return UNSUPPORTED("%s: backend %s's backward recomputes the softmax from q, k, v instead of reading the "
                       "given lse and o, so it cannot run one block of a ring; use cpu (or a CUDA backend)",
                       c->op, c->b->name);
  if (!c->b->supports) return FLASHC_OK;
  fc_ring_seg ks[2];
  int nk = fc_ring_segments(c->layout, c->r->world, c->r->rank, c->Lk, ks);
  for (int a = 0; a < c->nq; a++)
    for (int j = 0; j < nk; j++)
      for (int kind = BLOCK_FULL; kind <= BLOCK_PARTIAL; kind++) {
        fc_problem p = block_problem(c, (block_kind)kind, 0, &c->qseg[a], &ks[j], c->kv[0]);
        FC_CHECK(c->b->supports(&p));
      }
  return FLASHC_OK;
}

static flashc_status prepare(ring_call *c, const flashc_params *params, const flashc_tensor *q, const flashc_tensor *k,
                             const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                             const flashc_tensor *dout, const flashc_tensor *dq, const flashc_tensor *dk,
                             const flashc_tensor *dv, int *entered, int *prev_device) {
  flashc_ring r = c->r;
  const char *op = c->op;
  flashc_params pa;
  FC_CHECK(fc_params_read(op, params, &pa));
  if (pa.cu_seqlens_q || pa.cu_seqlens_k)
    return UNSUPPORTED("%s: varlen (params.cu_seqlens_q/k) is not supported by ring attention", op);
  if (c->layout != FLASHC_RING_CONTIGUOUS && c->layout != FLASHC_RING_ZIGZAG)
    return INVALID("%s: layout %d is not a flashc_ring_layout", op, (int)c->layout);
  FC_CHECK(fc_prepare(op, r->handle, params, q, k, v, o, lse, dout, dq, dk, dv, c->is_backward, &c->p0, &c->b));
  FC_CHECK(fc_check_features(op, "ring attention", 0u, &c->p0)); /* its merge and blocks know none of them */
  if (fc_problem_is_empty(&c->p0)) /* valid for flashc_forward/backward, which need no kernel for it */
    return UNSUPPORTED("%s: ring attention needs non-empty shards, but batch is %lld, local seqlen_q %lld and local "
                       "seqlen_k %lld",
                       op, (long long)c->p0.batch, (long long)c->p0.seqlen_q, (long long)c->p0.seqlen_k);
  c->on_device = c->b->device == FLASHC_DEVICE_CUDA;
  if (c->on_device) {
#ifdef FLASHC_RING_NCCL
    if (flashc_ring_device(r) < 0)
      return UNSUPPORTED("%s: the tensors are in device memory but this rank has no CUDA device", op);
    if (!*entered) {
      FC_CHECK(fc_ring_cuda_enter(r->device, prev_device));
      *entered = 1;
      /* again on the ring's device: backends' checks read the current device */
      FC_CHECK(fc_prepare(op, r->handle, params, q, k, v, o, lse, dout, dq, dk, dv, c->is_backward, &c->p0, &c->b));
    }
    c->mem = &fc_ring_mem_device;
    c->comm = r->nccl; /* NULL until bootstrapped after the agreement */
#else
    (void)entered;
    (void)prev_device;
    return UNSUPPORTED("%s: the tensors are in device memory, which needs NCCL; this libflashc was built "
                       "without it",
                       op);
#endif
  } else {
    if (!r->mpi)
      return UNSUPPORTED("%s: host tensors need a ring made with flashc_ring_create_mpi; this one is over NCCL", op);
    c->mem = &fc_ring_mem_host;
    c->comm = r->mpi;
    /* The handle's thread count unset (0): this rank's share of its node's cores, not every core, so that
     * the node's ranks do not take each other's cores away (fc_ring_cpu_threads). */
    if (r->handle->threads == 0 && r->mpi->local_ranks > 1) c->p0.threads = fc_ring_cpu_threads(r->mpi->local_ranks);
  }
  const fc_problem *p0 = &c->p0;
  if (p0->dtype == FLASHC_F64)
    return UNSUPPORTED("%s: dtype f64 is not supported by ring attention (f32, f16, bf16 are)", op);
  c->B = p0->batch;
  c->Lq = p0->seqlen_q;
  c->Lk = p0->seqlen_k;
  c->Hq = p0->heads_q;
  c->Hkv = p0->heads_kv;
  c->D = p0->head_dim;
  c->nq = fc_ring_segments(c->layout, r->world, r->rank, c->Lq, c->qseg);
  fc_ring_seg ks[2];
  if (!c->nq || !fc_ring_segments(c->layout, r->world, r->rank, c->Lk, ks))
    return INVALID("%s: the zigzag layout needs even local seqlens (two chunks per rank), but q has %lld rows and k "
                   "%lld",
                   op, (long long)c->Lq, (long long)c->Lk);
  int64_t sq = c->Lq * r->world, sk = c->Lk * r->world;
  c->shift = p0->bottom_right ? sk - sq : 0;
  /* A window wider than both sequences together hides nothing: unbounded, and no overflow below. */
  c->wl = p0->window_left >= sq + sk ? -1 : p0->window_left;
  c->wr = p0->window_right >= sq + sk ? -1 : p0->window_right;
  /* Host blocks in f32 when the backend takes it (the header comment says why); else the input dtype. */
  c->cdt = !c->on_device && !r->native_partials && (c->b->dtypes & (1u << FLASHC_F32)) ? FLASHC_F32 : p0->dtype;
  c->csize = flashc_dtype_size(c->cdt);
  FC_CHECK(place_buffers(c));
  return check_blocks(c);
}

/* ---- agreement --------------------------------------------------------------------------------------- */
enum {
  SIG_FAILED, /* min over ranks of (rank·16 + status) of those that failed to prepare; INT64_MAX if none */
  SIG_VERSION,
  SIG_OP,
  SIG_DTYPE,
  SIG_BATCH,
  SIG_LQ,
  SIG_LK,
  SIG_HQ,
  SIG_HKV,
  SIG_D,
  SIG_SCALE,
  SIG_WL,
  SIG_WR,
  SIG_BOTTOM_RIGHT,
  SIG_LAYOUT,
  SIG_DEVICE,
  SIG_CDT,
  SIG_COUNT
};

static const char *const sig_names[SIG_COUNT] = {"",
                                                 "libflashc version",
                                                 "operation",
                                                 "dtype",
                                                 "batch",
                                                 "local seqlen_q",
                                                 "local seqlen_k",
                                                 "heads_q",
                                                 "heads_kv",
                                                 "head_dim",
                                                 "scale (bits)",
                                                 "window_left (causal folded in)",
                                                 "window_right (causal folded in)",
                                                 "causal alignment (bottom-right)",
                                                 "layout",
                                                 "memory (1 = device)",
                                                 "block dtype (native partials)"};

/* All ranks learn whether any failed to prepare, then compare their calls. *lost is set when the exchange
 * itself failed (a peer is gone), which leaves the ring unusable. */
static flashc_status agree(ring_call *c, flashc_status local, const char *local_msg, bool *lost) {
  flashc_ring r = c->r;
  fc_ring_comm *ctl = r->mpi ? r->mpi : r->nccl;
  int64_t sig[SIG_COUNT] = {0}, lo[SIG_COUNT], hi[SIG_COUNT];
  sig[SIG_FAILED] = local == FLASHC_OK ? INT64_MAX : (int64_t)r->rank * 16 + (int64_t)local;
  sig[SIG_VERSION] = FLASHC_VERSION;
  sig[SIG_OP] = c->is_backward;
  if (local == FLASHC_OK) {
    const fc_problem *p = &c->p0;
    uint32_t scale_bits;
    memcpy(&scale_bits, &p->scale, sizeof scale_bits);
    int64_t v[] = {p->dtype,   c->B,  c->Lq, c->Lk,           c->Hq,     c->Hkv,       c->D,
                   scale_bits, c->wl, c->wr, p->bottom_right, c->layout, c->on_device, c->cdt};
    memcpy(&sig[SIG_DTYPE], v, sizeof v);
  }
  flashc_status s = ctl->agree(ctl, sig, lo, hi, SIG_COUNT);
  if (s != FLASHC_OK) {
    *lost = true;
    return s;
  }
  if (local != FLASHC_OK) return fc_error(local, "%s", local_msg); /* our own reason says most */
  if (lo[SIG_FAILED] != INT64_MAX) {
    int who = (int)(lo[SIG_FAILED] / 16);
    flashc_status st = (flashc_status)(lo[SIG_FAILED] % 16);
    return fc_error(st, "%s: rank %d of %d could not prepare the call (%s; its own message says why); no rank ran it",
                    c->op, who, r->world, flashc_status_string(st));
  }
  for (int i = SIG_VERSION; i < SIG_COUNT; i++)
    if (lo[i] != hi[i])
      return INVALID("%s: the ranks disagree on %s (from %lld to %lld; this rank: %lld); every rank must call with "
                     "the same shapes, dtype, params and layout",
                     c->op, sig_names[i], (long long)lo[i], (long long)hi[i], (long long)sig[i]);
  return FLASHC_OK;
}

/* ---- the call ---------------------------------------------------------------------------------------- */
static flashc_status ring_call_run(const char *op, flashc_ring r, const flashc_params *params,
                                   flashc_ring_layout layout, const flashc_tensor *q, const flashc_tensor *k,
                                   const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                                   const flashc_tensor *dout, const flashc_tensor *dq, const flashc_tensor *dk,
                                   const flashc_tensor *dv, int is_backward) {
  if (!r) return INVALID("%s: ring is NULL", op);
  if (r->broken[0])
    return fc_error(FLASHC_ERR_COMMUNICATION, "%s: this ring failed earlier (%s); destroy it and create another", op,
                    r->broken);
  ring_call c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.r = r;
  c.is_backward = is_backward;
  c.layout = layout;
  int entered = 0, prev_device = -1;
  flashc_status s = FLASHC_OK;
#ifdef FLASHC_RING_NCCL
  if (!r->mpi) { /* an NCCL ring agrees over NCCL, on its device */
    s = fc_ring_cuda_enter(r->device, &prev_device);
    entered = s == FLASHC_OK;
  }
#endif
  if (s == FLASHC_OK) s = prepare(&c, params, q, k, v, o, lse, dout, dq, dk, dv, &entered, &prev_device);
  char local_msg[512];
  snprintf(local_msg, sizeof local_msg, "%s", s == FLASHC_OK ? "" : flashc_last_error());
  bool transport_failed = false;
  s = agree(&c, s, local_msg, &transport_failed);
#ifdef FLASHC_RING_NCCL
  if (s == FLASHC_OK && c.on_device && !r->nccl) {
    /* First device call of an MPI ring: every rank is here (they just agreed), so bootstrap NCCL now. */
    s = fc_ring_nccl_bootstrap(r->mpi, r->device, &r->nccl);
    if (s != FLASHC_OK) transport_failed = true;
    c.comm = r->nccl;
  }
#endif
  if (s == FLASHC_OK) {
    c.comm->timeout_ms = r->timeout_ms;
    s = is_backward ? run_backward(&c) : run_forward(&c);
    if (s != FLASHC_OK) {
      /* Peers may be mid-exchange with us: the ring cannot be trusted to line up again. */
      c.comm->abandon(c.comm);
      transport_failed = true;
    }
  }
  if (transport_failed) snprintf(r->broken, sizeof r->broken, "%s", flashc_last_error());
#ifdef FLASHC_RING_NCCL
  if (entered) fc_ring_cuda_leave(prev_device);
#else
  (void)entered;
  (void)prev_device;
#endif
  return s;
}

flashc_status flashc_ring_forward(flashc_ring ring, const flashc_params *params, flashc_ring_layout layout,
                                  const flashc_tensor *q, const flashc_tensor *k, const flashc_tensor *v,
                                  flashc_tensor *o, float *lse) {
  return ring_call_run("flashc_ring_forward", ring, params, layout, q, k, v, o, lse, NULL, NULL, NULL, NULL, 0);
}

flashc_status flashc_ring_backward(flashc_ring ring, const flashc_params *params, flashc_ring_layout layout,
                                   const flashc_tensor *q, const flashc_tensor *k, const flashc_tensor *v,
                                   const flashc_tensor *o, const float *lse, const flashc_tensor *dout,
                                   flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv) {
  return ring_call_run("flashc_ring_backward", ring, params, layout, q, k, v, o, lse, dout, dq, dk, dv, 1);
}
