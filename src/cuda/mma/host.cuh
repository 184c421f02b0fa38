/* mma/host.cuh — the host side shared by cuda-mma's forward (mma/fwd.cu) and
 * backward (mma/bwd.cu): which head dims are compiled, whether cp.async may be
 * used, the varlen sequences on the device, the launch limits. */
#ifndef FLASHC_CUDA_MMA_HOST_CUH
#define FLASHC_CUDA_MMA_HOST_CUH

#include "common/common.cuh"
#include "common/score_mod.cuh"

/* Head dims compiled as template instances, forward and backward; any other d <= 256 runs in the next one up, its
 * columns past d loaded as zeros (they add nothing to Q·Kᵀ and produce columns of O that are never stored).
 * FlashAttention-3's set: d <= 32 runs D = 64 and 129..160 runs D = 192. Kernels of their own (D = 32, 160) cost a
 * fifth of cuda-mma's build for calls no measured model makes; what those calls lose: docs/experiments.md. */
enum { FC_MMA_NDIMS = 5 };
static constexpr int fc_mma_dims[FC_MMA_NDIMS] = {64, 96, 128, 192, 256};
static inline int fc_mma_compiled_dim(int64_t d) {
  for (int i = 0; i < FC_MMA_NDIMS; i++)
    if (d <= fc_mma_dims[i]) return fc_mma_dims[i];
  return 0;
}

/* cp.async copies 16 aligned bytes: every row of the view must start on a
 * 16-byte boundary. */
static inline bool fc_mma_view_aligned(const fc_view *v) {
  return ((uintptr_t)v->data % 16) == 0 && v->stride_b % 8 == 0 && v->stride_s % 8 == 0 && v->stride_h % 8 == 0;
}

/* x ← from over the view [n0, n1, n2, row], each side with its strides (common/fill.cu). */
extern "C" flashc_status fc_device_copy_rows(const fc_problem *p, void *x, const int64_t st[3], const void *from,
                                             const int64_t fst[3], const int64_t n[3], int64_t row);

/* A view whose rows do not start on 16 bytes (an odd head dim or stride, an offset pointer) is staged: the kernels,
 * which copy with cp.async only, read or write a copy in the workspace whose rows are the head dim rounded up to 8
 * elements, copied from the caller's view before the kernels (inputs) and back after them (outputs). Rare calls pay
 * the copies; each kernel is built once (the plain-load kernels they replace were a third of cuda-mma's build time). */
typedef struct fc_mma_stage {
  const fc_view *user; /* the caller's view */
  fc_view view;        /* what the kernels take: *user, or the copy (data set by fc_mma_stage_in) */
  int64_t n[3], cols;  /* batch (1 when varlen), rows, heads; columns */
  size_t at, bytes;    /* the copy's place in the workspace; bytes 0: not staged */
} fc_mma_stage;

/* Plans the staging of view v of p (keys: rows and heads of k, else of q; cols: its head dim) at workspace offset *at,
 * which it advances past the copy (a multiple of 256). */
static inline void fc_mma_stage_plan(const fc_problem *p, const fc_view *v, bool keys, int64_t cols, size_t *at,
                                     fc_mma_stage *s) {
  const bool varlen = p->cu_seqlens_q != NULL;
  s->user = v, s->view = *v, s->cols = cols, s->at = *at, s->bytes = 0;
  s->n[0] = varlen ? 1 : p->batch;
  s->n[1] = keys ? (varlen ? p->total_k : p->seqlen_k) : (varlen ? p->total_q : p->seqlen_q);
  s->n[2] = keys ? p->heads_kv : p->heads_q;
  if (fc_mma_view_aligned(v)) return;
  const int64_t ld = (cols + 7) / 8 * 8;
  s->view.stride_h = ld;
  s->view.stride_s = s->n[2] * ld;
  s->view.stride_b = varlen ? 0 : s->n[1] * s->view.stride_s; /* varlen: stride_b 0, as every varlen view */
  s->bytes = ((size_t)(s->n[0] * s->n[1] * s->view.stride_s) * sizeof(uint16_t) + 255) / 256 * 256;
  *at += s->bytes;
}

/* The copy at ws + s->at, filled from the caller's view where `fill` (inputs; an output whose rows the kernels may
 * leave unwritten, which keep the caller's values: o past a device offset's cut, flashc.h). */
static inline flashc_status fc_mma_stage_in(const fc_problem *p, char *ws, fc_mma_stage *s, bool fill) {
  if (!s->bytes) return FLASHC_OK;
  s->view.data = ws + s->at;
  if (!fill) return FLASHC_OK;
  const int64_t to[3] = {s->view.stride_b, s->view.stride_s, s->view.stride_h};
  const int64_t from[3] = {s->user->stride_b, s->user->stride_s, s->user->stride_h};
  return fc_device_copy_rows(p, s->view.data, to, s->user->data, from, s->n, s->cols);
}

/* An output's copy back into the caller's view. */
static inline flashc_status fc_mma_stage_out(const fc_problem *p, const fc_mma_stage *s) {
  if (!s->bytes) return FLASHC_OK;
  const int64_t to[3] = {s->user->stride_b, s->user->stride_s, s->user->stride_h};
  const int64_t from[3] = {s->view.stride_b, s->view.stride_s, s->view.stride_h};
  return fc_device_copy_rows(p, s->user->data, to, s->view.data, from, s->n, s->cols);
}

/* The varlen sequences on the device: sequence b's rows are [cu_q[b], end_q[b]) of q and [cu_k[b], end_k[b]) of k.
 * The kernels read a sequence's length as end − start, so that seqused (internal.h, fc_seq_q/k) reaches them
 * without a branch: end_q = cu_q + 1 (the slots whole, no copy) or cu_q[b] + seqused_q[b] (likewise k). All NULL for
 * a dense problem. */
typedef struct fc_mma_seqs {
  const int32_t *cu_q, *cu_k, *end_q, *end_k;
} fc_mma_seqs;

/* Bytes of the varlen offsets in the workspace (cu_q, cu_k, then end_q, end_k where seqused asks for them; device
 * offsets: end_q and end_k only), rounded to 256 so that what follows stays aligned. */
static inline size_t fc_mma_cu_seqlens_bytes(const fc_problem *p) {
  if (!p->cu_seqlens_q) return 0;
  if (p->cu_seqlens_device) return ((size_t)p->batch * 2 * sizeof(int32_t) + 255) / 256 * 256;
  const size_t ends = (p->seqused_q ? (size_t)p->batch : 0) + (p->seqused_k ? (size_t)p->batch : 0);
  return (((size_t)(p->batch + 1) * 2 + ends) * sizeof(int32_t) + 255) / 256 * 256;
}

/* The ends under seqused, on the device (common/fill.cu): end[b] += cu[b] over seqused's copy in end, for q and k
 * (either NULL: nothing to do on that side), one launch. */
extern "C" flashc_status fc_device_seq_ends(const fc_problem *p, int32_t *end_q, const int32_t *cu_q, int32_t *end_k,
                                            const int32_t *cu_k);

/* Device offsets (flashc.h, cu_seqlens_device), one launch (common/fill.cu): end[b] = cu[b] + min(cu[b + 1] − cu[b],
 * max_seqlen) for q and k, so that every kernel sees a sequence cut to the caller's max_seqlen (its grid covers no
 * more); and, with pad (the backward's row passes), pad[b] = fc_bwd_pad_offset(cu_q[b], b) for b ≤ batch. */
extern "C" flashc_status fc_device_seq_clamp(const fc_problem *p, int32_t *end_q, int32_t *end_k, int64_t *pad);

/* Copies the caller's host arrays (cu_seqlens, seqused) into `ws` (fc_mma_cu_seqlens_bytes of it) on the stream and
 * points *s at them; the ends are summed there, not on the host, so that no host buffer has to outlive the copies.
 * Device offsets are used where they are, and only their clamped ends are written into `ws` (and the backward's
 * padded row offsets into pad, when not NULL: common/bwd_rows.cuh, fc_bwd_rows_pad). */
static inline flashc_status fc_mma_upload_cu_seqlens(const fc_problem *p, int32_t *ws, int64_t *pad, fc_mma_seqs *s) {
  s->cu_q = s->cu_k = s->end_q = s->end_k = NULL;
  if (!p->cu_seqlens_q) return FLASHC_OK;
  const int64_t n = p->batch;
  if (p->cu_seqlens_device) {
    s->cu_q = p->cu_seqlens_q, s->cu_k = p->cu_seqlens_k;
    s->end_q = ws, s->end_k = ws + n;
    return fc_device_seq_clamp(p, ws, ws + n, pad);
  }
  const cudaStream_t stream = fc_stream(p);
  int32_t *cu_q = ws, *cu_k = ws + n + 1, *end = ws + 2 * (n + 1);
  FC_CUDA_CHECK(
      cudaMemcpyAsync(cu_q, p->cu_seqlens_q, (size_t)(n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  FC_CUDA_CHECK(
      cudaMemcpyAsync(cu_k, p->cu_seqlens_k, (size_t)(n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  int32_t *end_q = NULL, *end_k = NULL;
  if (p->seqused_q) {
    end_q = end, end += n;
    FC_CUDA_CHECK(cudaMemcpyAsync(end_q, p->seqused_q, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  if (p->seqused_k) {
    end_k = end;
    FC_CUDA_CHECK(cudaMemcpyAsync(end_k, p->seqused_k, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  }
  if (end_q || end_k) FC_CHECK(fc_device_seq_ends(p, end_q, cu_q, end_k, cu_k));
  s->cu_q = cu_q, s->cu_k = cu_k;
  s->end_q = end_q ? end_q : cu_q + 1;
  s->end_k = end_k ? end_k : cu_k + 1;
  return FLASHC_OK;
}

/* One CTA per (row block, head, sequence), on a 1-D grid: its size must fit
 * gridDim.x. */
static inline flashc_status fc_mma_grid(const char *op, int64_t blocks, int64_t heads, int64_t batch, int *grid) {
  int64_t n;
  if (!fc_mul_ok(blocks, heads, &n) || !fc_mul_ok(n, batch, &n) || n > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: %lld blocks x %lld heads x %lld sequences exceed "
                    "2^31-1 CTAs on backend cuda-mma",
                    op, (long long)blocks, (long long)heads, (long long)batch);
  *grid = (int)n;
  return FLASHC_OK;
}

/* Raises a kernel's dynamic shared-memory limit, or says that this device
 * cannot give that much. */
static inline flashc_status fc_mma_smem(const void *kernel, size_t bytes, const char *what) {
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  if (bytes > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s needs %zu bytes of shared memory; device %d allows %zu per block", what,
                    bytes, props.device, props.smem_per_block_optin);
  FC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
  return FLASHC_OK;
}

/* How many parts cuda-mma's forward splits the keys of problem p into (mma/fwd.cu; 1: no split). cuda-hopper asks, so
 * that `auto` leaves it the calls whose grid is too small for one query tile per SM to fill the GPU. */
flashc_status fc_mma_fwd_splits(const fc_problem *p, int *splits);

/* Whether cuda-mma's backward has a kernel for problem p on this device (mma/bwd.cu's plan: its shared memory). */
flashc_status fc_mma_bwd_supports(const fc_problem *p);

/* dbias, a float attn_mask's gradient (mma/bwd_score_mod.cu), for the backwards of cuda-mma and cuda-hopper: the
 * bytes of device workspace its fp32 sums need (0: the kernels write dbias itself), the pass before the kernels (md's
 * dbias fields set, what they write zeroed) and the one after (the sums into dbias in the call's dtype). */
size_t fc_mma_dbias_bytes(const fc_problem *p);
flashc_status fc_mma_dbias_begin(const fc_problem *p, fc_score_mod *md, void *ws);
flashc_status fc_mma_dbias_finish(const fc_problem *p, const fc_score_mod *md);

#endif /* FLASHC_CUDA_MMA_HOST_CUH */
