/* ladder/naive_args.cuh — what the CUDA-core rungs (naive, fa1, fa2_fp32) pass to their kernels: the views of the
 * validated problem, the mask, and the per-sequence bookkeeping (dense batch or varlen cu_seqlens copied to
 * the device). Written with the first rung; the later rungs reuse it so that one sequence is found, and one
 * mask is evaluated, the same way on every rung. */
#ifndef FLASHC_CUDA_NAIVE_ARGS_CUH
#define FLASHC_CUDA_NAIVE_ARGS_CUH

#include "common/common.cuh"

#include <string.h>

/* One tensor: base pointer and strides (elements) for batch, seq and head; the head_dim stride is 1. */
typedef struct fc_cc_view {
  float *data;
  int64_t sb, ss, sh;
} fc_cc_view;

typedef struct fc_cc_args {
  fc_cc_view q, k, v, o;       /* forward and backward */
  fc_cc_view dout, dq, dk, dv; /* backward only */
  float *lse;                  /* NULL in a forward that does not want it */
  const int32_t *cu_q, *cu_k;  /* device copies of params.cu_seqlens_q/k, or NULL when dense */
  int32_t batch, heads_q, heads_kv, group, head_dim;
  int32_t seqlen_q, seqlen_k;                     /* dense: the seqlens; varlen: the longest sequence */
  int64_t total_q;                                /* packed rows of q (lse of a varlen problem is [heads_q, total_q]) */
  int64_t window_left, window_right, mask_offset; /* as fc_problem: < 0 unbounded; causal is window_right 0 */
  int32_t bottom_right;
  float scale;
} fc_cc_args;

/* One sequence of the batch. Rows are numbered from 0 within the sequence. */
typedef struct fc_cc_seq {
  int64_t q_start, k_start; /* first row in the tensor's seq dimension (varlen: cu_seqlens; dense: 0) */
  int64_t q_row0;           /* the sequence's first row among all packed rows: workspace row index base */
  int32_t sq, sk;
  int64_t shift; /* query row i has its diagonal at key i + shift */
} fc_cc_seq;

static __device__ __forceinline__ fc_cc_seq fc_cc_seq_get(const fc_cc_args &a, int s) {
  fc_cc_seq q;
  if (a.cu_q) {
    q.q_start = a.cu_q[s];
    q.k_start = a.cu_k[s];
    q.q_row0 = q.q_start;
    q.sq = a.cu_q[s + 1] - a.cu_q[s];
    q.sk = a.cu_k[s + 1] - a.cu_k[s];
  } else {
    q.q_start = 0;
    q.k_start = 0;
    q.q_row0 = (int64_t)s * a.seqlen_q;
    q.sq = a.seqlen_q;
    q.sk = a.seqlen_k;
  }
  q.shift = (a.bottom_right ? (int64_t)q.sk - q.sq : 0) + a.mask_offset;
  return q;
}

/* The sequence that owns packed query row `row` (varlen: the last s with cu_q[s] <= row). */
static __device__ __forceinline__ int fc_cc_seq_of_q_row(const fc_cc_args &a, int64_t row) {
  if (!a.cu_q) return (int)(row / a.seqlen_q);
  int lo = 0, hi = a.batch; /* invariant: cu_q[lo] <= row < cu_q[hi] */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (a.cu_q[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
static __device__ __forceinline__ int fc_cc_seq_of_k_row(const fc_cc_args &a, int64_t row) {
  if (!a.cu_k) return (int)(row / a.seqlen_k);
  int lo = 0, hi = a.batch;
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (a.cu_k[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* Element offset of (sequence s starting at tensor row `start`, row, head h) in view v: 64-bit. */
static __device__ __forceinline__ int64_t fc_cc_off(const fc_cc_view &v, int s, int64_t start, int64_t row, int h) {
  return (int64_t)s * v.sb + (start + row) * v.ss + (int64_t)h * v.sh;
}

/* Index of (sequence s, head h, row i) in lse and in every [heads_q, rows] fp32 buffer laid out like it. */
static __device__ __forceinline__ int64_t fc_cc_lse_idx(const fc_cc_args &a, int s, const fc_cc_seq &q, int h,
                                                        int64_t i) {
  if (a.cu_q) return (int64_t)h * a.total_q + q.q_start + i;
  return ((int64_t)s * a.heads_q + h) * a.seqlen_q + i;
}

/* Visible keys of query row i: [*lo, *hi) within [0, sk); empty when *lo >= *hi. The same rule as
 * fc_key_range in internal.h: d = i + shift, keys d − window_left ..= d + window_right. */
static __device__ __forceinline__ void fc_cc_key_range(const fc_cc_args &a, int64_t shift, int64_t i, int32_t sk,
                                                       int32_t *lo, int32_t *hi) {
  int64_t d = i + shift;
  int64_t l = a.window_left < 0 ? 0 : d - a.window_left;
  int64_t h = a.window_right < 0 ? (int64_t)sk : d + a.window_right + 1;
  if (l < 0) l = 0;
  if (h > sk) h = sk;
  if (l > sk) l = sk;
  if (h < 0) h = 0;
  *lo = (int32_t)l;
  *hi = (int32_t)h;
}

/* Query rows that see at least one key of [c0, c1): [*lo, *hi) within [0, sq). The inverse of the rule above:
 * row i sees key j iff j − window_right ≤ i + shift ≤ j + window_left. */
static __device__ __forceinline__ void fc_cc_query_range(const fc_cc_args &a, int64_t shift, int64_t c0, int64_t c1,
                                                         int32_t sq, int32_t *lo, int32_t *hi) {
  int64_t l = a.window_right < 0 ? 0 : c0 - a.window_right - shift;
  int64_t h = a.window_left < 0 ? (int64_t)sq : c1 - 1 + a.window_left - shift + 1;
  if (l < 0) l = 0;
  if (h > sq) h = sq;
  if (l > sq) l = sq;
  if (h < 0) h = 0;
  *lo = (int32_t)l;
  *hi = (int32_t)h;
}

/* ---- host side --------------------------------------------------------------------------------------- */
static inline fc_cc_view fc_cc_view_of(const fc_view &v) {
  fc_cc_view c = {(float *)v.data, v.stride_b, v.stride_s, v.stride_h};
  return c;
}

/* Bytes of workspace for the device copy of the cu_seqlens (0 when dense), rounded for alignment. */
static inline size_t fc_cc_seqlens_bytes(const fc_problem *p) {
  return p->cu_seqlens_q ? (size_t)(2 * (p->batch + 1) * sizeof(int32_t) + 255) / 256 * 256 : 0;
}

/* Rounds a workspace carve-out up to 256 bytes so that every piece starts aligned. */
static inline size_t fc_cc_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* The argument block; for varlen, copies the host cu_seqlens into `ws` (fc_cc_seqlens_bytes of device memory)
 * on the handle's stream. */
static inline flashc_status fc_cc_args_make(const fc_problem *p, void *ws, fc_cc_args *a) {
  memset(a, 0, sizeof *a);
  a->q = fc_cc_view_of(p->q);
  a->k = fc_cc_view_of(p->k);
  a->v = fc_cc_view_of(p->v);
  a->o = fc_cc_view_of(p->o);
  if (p->is_backward) {
    a->dout = fc_cc_view_of(p->dout);
    a->dq = fc_cc_view_of(p->dq);
    a->dk = fc_cc_view_of(p->dk);
    a->dv = fc_cc_view_of(p->dv);
  }
  a->lse = p->lse;
  a->batch = (int32_t)p->batch;
  a->heads_q = (int32_t)p->heads_q;
  a->heads_kv = (int32_t)p->heads_kv;
  a->group = (int32_t)(p->heads_q / p->heads_kv);
  a->head_dim = (int32_t)p->head_dim;
  a->seqlen_q = (int32_t)p->seqlen_q;
  a->seqlen_k = (int32_t)p->seqlen_k;
  a->total_q = p->total_q;
  a->window_left = p->window_left;
  a->window_right = p->window_right;
  a->mask_offset = p->mask_offset;
  a->bottom_right = p->bottom_right;
  a->scale = p->scale;
  if (p->cu_seqlens_q) {
    int32_t *cu = (int32_t *)ws;
    size_t n = (size_t)(p->batch + 1) * sizeof(int32_t);
    FC_CUDA_CHECK(cudaMemcpyAsync(cu, p->cu_seqlens_q, n, cudaMemcpyHostToDevice, fc_stream(p)));
    FC_CUDA_CHECK(cudaMemcpyAsync(cu + p->batch + 1, p->cu_seqlens_k, n, cudaMemcpyHostToDevice, fc_stream(p)));
    a->cu_q = cu;
    a->cu_k = cu + p->batch + 1;
  }
  return FLASHC_OK;
}

/* The limits every CUDA-core rung shares: 32-bit head counts and batch (the kernels index them with int). */
static inline flashc_status fc_cc_supports_common(const fc_problem *p, const char *backend) {
  if (p->heads_q > INT32_MAX || p->batch > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: heads_q %lld or batch %lld exceeds 2^31-1", backend,
                    (long long)p->heads_q, (long long)p->batch);
  return FLASHC_OK;
}

#endif /* FLASHC_CUDA_NAIVE_ARGS_CUH */
