/* ladder/naive.cu — rung 1 of the CUDA ladder: attention with the score matrix materialised in device memory.
 *
 *   forward : S = scale·Q·Kᵀ (masked entries −inf) ; P = softmax_rows(S), lse = log Σ exp S ; O = P·V
 *   backward: P = exp(S − lse) ; D = rowsum(dO∘O) ; dP = dO·Vᵀ ; dS = P∘(dP − D)
 *             dV = Pᵀ·dO ; dK = scale·dSᵀ·Q ; dQ = scale·dS·K        (dK, dV summed over a GQA group)
 *
 * Each line is its own kernel, one thread (or one warp, for a row reduction) per output element, reading and
 * writing global memory only. Correct and simple, and O(b·h·sq·sk) memory: the score matrices of every head of
 * every sequence live in the workspace at once, so the rung refuses (FLASHC_ERR_OUT_OF_MEMORY, with the bytes
 * it wanted) what the device cannot hold. The later rungs are measured against it.
 *
 * Score layout: sequence s owns heads_q·sq_s·sk_s floats from off[s] on, as [head][i][j].
 */
#include "ladder/naive_args.cuh"

#include <stdio.h>

enum { NAIVE_THREADS = 256, NAIVE_MAX_BLOCKS = 8192 };

/* ---- kernels ----------------------------------------------------------------------------------------- */

/* S = scale·Q·Kᵀ over visible (i, j); −inf elsewhere. blockIdx.y strides over (sequence, head). */
__global__ void __launch_bounds__(NAIVE_THREADS) naive_scores_kernel(fc_cc_args a, const int64_t *off, float *S) {
  for (int64_t sh = blockIdx.y; sh < (int64_t)a.batch * a.heads_q; sh += gridDim.y) {
    int s = (int)(sh / a.heads_q), h = (int)(sh % a.heads_q), hk = h / a.group;
    fc_cc_seq q = fc_cc_seq_get(a, s);
    int64_t n = (int64_t)q.sq * q.sk;
    float *Sh = S + off[s] + (int64_t)h * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
      int32_t i = (int32_t)(e / q.sk), j = (int32_t)(e % q.sk), lo, hi;
      fc_cc_key_range(a, q.shift, i, q.sk, &lo, &hi);
      float x = -INFINITY;
      if (j >= lo && j < hi) {
        const float *qi = a.q.data + fc_cc_off(a.q, s, q.q_start, i, h);
        const float *kj = a.k.data + fc_cc_off(a.k, s, q.k_start, j, hk);
        float acc = 0.0f;
        for (int c = 0; c < a.head_dim; c++) acc = fmaf(qi[c], kj[c], acc);
        x = acc * a.scale;
      }
      Sh[e] = x;
    }
  }
}

static __device__ __forceinline__ float naive_warp_max(float x) {
  for (int m = 16; m > 0; m >>= 1) x = fc_fmax_nan(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}
static __device__ __forceinline__ float naive_warp_sum(float x) {
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

/* Query row r of the score matrices, r = packed query row·heads_q + head: its sequence s, head h, row i within
 * the sequence, and S, that row of S. */
typedef struct naive_qrow {
  float *S;
  fc_cc_seq q;
  int s, h;
  int32_t i;
} naive_qrow;

static __device__ __forceinline__ naive_qrow naive_row(const fc_cc_args &a, const int64_t *off, float *S, int64_t r) {
  const int h = (int)(r % a.heads_q);
  const int64_t prow = r / a.heads_q;
  const int s = fc_cc_seq_of_q_row(a, prow);
  const fc_cc_seq q = fc_cc_seq_get(a, s);
  const int32_t i = (int32_t)(prow - q.q_row0);
  return naive_qrow{S + off[s] + ((int64_t)h * q.sq + i) * q.sk, q, s, h, i};
}

/* P = softmax(S) in place, lse = m + log l. A row that sees no key gets P = 0 and lse = −inf: m = −inf there,
 * and exp(S − m) would be exp(−inf + inf) = NaN. Only there: the maximum carries a NaN score (fc_fmax_nan), so a
 * NaN row comes out NaN. */
__global__ void __launch_bounds__(NAIVE_THREADS) naive_softmax_kernel(fc_cc_args a, const int64_t *off, float *S) {
  int lane = threadIdx.x % 32;
  int64_t rows = a.total_q * a.heads_q, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    const naive_qrow w = naive_row(a, off, S, r); /* one warp per row */
    const fc_cc_seq &q = w.q;
    float *row = w.S;
    float m = -INFINITY;
    for (int32_t j = lane; j < q.sk; j += 32) m = fc_fmax_nan(m, row[j]);
    m = naive_warp_max(m);
    float l = 0.0f;
    if (m != -INFINITY)
      for (int32_t j = lane; j < q.sk; j += 32) l += expf(row[j] - m);
    l = naive_warp_sum(l);
    float inv = m != -INFINITY ? 1.0f / l : 0.0f;
    for (int32_t j = lane; j < q.sk; j += 32) row[j] = m != -INFINITY ? expf(row[j] - m) * inv : 0.0f;
    if (a.lse && lane == 0) a.lse[fc_cc_lse_idx(a, w.s, q, w.h, w.i)] = m != -INFINITY ? m + logf(l) : -INFINITY;
  }
}

/* out = M·X, times scale when SCALED, for a score-layout matrix M (P or dS) and a key-side view X (v or k), one
 * thread per (packed row, head, column): out[i, h, c] = Σ_j M[h][i][j]·X[j, h / group, c]. The forward's O = P·V
 * and the backward's dQ = scale·dS·K. */
template <bool SCALED>
static __device__ __forceinline__ void naive_scores_times(const fc_cc_args &a, const int64_t *off, const float *M,
                                                          const fc_cc_view &X, const fc_cc_view &out) {
  int64_t n = a.total_q * a.heads_q * a.head_dim;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    int c = (int)(e % a.head_dim);
    const naive_qrow w = naive_row(a, off, (float *)M, e / a.head_dim);
    const int s = w.s, h = w.h, hk = h / a.group;
    const fc_cc_seq &q = w.q;
    float acc = 0.0f;
    for (int32_t j = 0; j < q.sk; j++) acc = fmaf(w.S[j], X.data[fc_cc_off(X, s, q.k_start, j, hk) + c], acc);
    out.data[fc_cc_off(out, s, q.q_start, w.i, h) + c] = SCALED ? acc * a.scale : acc;
  }
}

/* O = P·V. */
__global__ void __launch_bounds__(NAIVE_THREADS) naive_pv_kernel(fc_cc_args a, const int64_t *off, const float *P) {
  naive_scores_times<false>(a, off, P, a.v, a.o);
}

/* Backward, per row: P = exp(S − lse) in place (0 where masked), and D = rowsum(dO∘O) into Dbuf[prow·hq + h]. */
__global__ void __launch_bounds__(NAIVE_THREADS)
    naive_probs_kernel(fc_cc_args a, const int64_t *off, float *S, float *Dbuf) {
  int lane = threadIdx.x % 32;
  int64_t rows = a.total_q * a.heads_q, nwarps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += nwarps) {
    const naive_qrow w = naive_row(a, off, S, r); /* one warp per row */
    const int s = w.s, h = w.h;
    const int32_t i = w.i;
    const fc_cc_seq &q = w.q;
    float *row = w.S;
    float lse = a.lse[fc_cc_lse_idx(a, s, q, h, i)];
    for (int32_t j = lane; j < q.sk; j += 32)
      row[j] = (row[j] == -INFINITY || lse == -INFINITY) ? 0.0f : expf(row[j] - lse);
    const float *o = a.o.data + fc_cc_off(a.o, s, q.q_start, i, h);
    const float *dout = a.dout.data + fc_cc_off(a.dout, s, q.q_start, i, h);
    float d = 0.0f;
    for (int c = lane; c < a.head_dim; c += 32) d = fmaf(dout[c], o[c], d);
    d = naive_warp_sum(d);
    if (lane == 0) Dbuf[r] = d;
  }
}

/* dS = P∘(dP − D) with dP = dO·Vᵀ, one thread per score element (P and dS are separate buffers). */
__global__ void __launch_bounds__(NAIVE_THREADS)
    naive_dscores_kernel(fc_cc_args a, const int64_t *off, const float *P, const float *Dbuf, float *dS) {
  for (int64_t sh = blockIdx.y; sh < (int64_t)a.batch * a.heads_q; sh += gridDim.y) {
    int s = (int)(sh / a.heads_q), h = (int)(sh % a.heads_q), hk = h / a.group;
    fc_cc_seq q = fc_cc_seq_get(a, s);
    int64_t n = (int64_t)q.sq * q.sk, base = off[s] + (int64_t)h * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
      int32_t i = (int32_t)(e / q.sk), j = (int32_t)(e % q.sk);
      float p = P[base + e], ds = 0.0f;
      if (p != 0.0f) { /* masked (and underflowed) entries have P = 0, hence dS = 0 */
        const float *dout = a.dout.data + fc_cc_off(a.dout, s, q.q_start, i, h);
        const float *v = a.v.data + fc_cc_off(a.v, s, q.k_start, j, hk);
        float dp = 0.0f;
        for (int c = 0; c < a.head_dim; c++) dp = fmaf(dout[c], v[c], dp);
        ds = p * (dp - Dbuf[(q.q_row0 + i) * a.heads_q + h]);
      }
      dS[base + e] = ds;
    }
  }
}

/* dQ = scale·dS·K. */
__global__ void __launch_bounds__(NAIVE_THREADS) naive_dq_kernel(fc_cc_args a, const int64_t *off, const float *dS) {
  naive_scores_times<true>(a, off, dS, a.k, a.dq);
}

/* dV = Pᵀ·dO and dK = scale·dSᵀ·Q summed over the query heads of the GQA group, one thread per
 * (packed key row, kv head, column): each gradient element has one writer, so no atomics. */
__global__ void __launch_bounds__(NAIVE_THREADS)
    naive_dkdv_kernel(fc_cc_args a, const int64_t *off, const float *P, const float *dS, int64_t total_k) {
  int64_t n = total_k * a.heads_kv * a.head_dim;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
    int c = (int)(e % a.head_dim);
    int64_t r = e / a.head_dim, krow = r / a.heads_kv;
    int hk = (int)(r % a.heads_kv);
    int s = fc_cc_seq_of_k_row(a, krow);
    fc_cc_seq q = fc_cc_seq_get(a, s);
    int32_t j = (int32_t)(krow - (a.cu_k ? q.k_start : (int64_t)s * a.seqlen_k));
    float dv = 0.0f, dk = 0.0f;
    for (int g = 0; g < a.group; g++) {
      int h = hk * a.group + g;
      int64_t base = off[s] + (int64_t)h * q.sq * q.sk + j;
      for (int32_t i = 0; i < q.sq; i++) {
        float p = P[base + (int64_t)i * q.sk], ds = dS[base + (int64_t)i * q.sk];
        dv = fmaf(p, a.dout.data[fc_cc_off(a.dout, s, q.q_start, i, h) + c], dv);
        dk = fmaf(ds, a.q.data[fc_cc_off(a.q, s, q.q_start, i, h) + c], dk);
      }
    }
    a.dv.data[fc_cc_off(a.dv, s, q.k_start, j, hk) + c] = dv;
    a.dk.data[fc_cc_off(a.dk, s, q.k_start, j, hk) + c] = dk * a.scale;
  }
}

/* ---- host -------------------------------------------------------------------------------------------- */

static int naive_blocks(int64_t work) {
  int64_t b = fc_cdiv(work, NAIVE_THREADS);
  return (int)(b < 1 ? 1 : b > (int64_t)NAIVE_MAX_BLOCKS ? (int64_t)NAIVE_MAX_BLOCKS : b);
}

/* Grid of the per-score-element kernels: x over the elements of the largest (sequence, head) matrix, y over
 * (sequence, head) pairs; both stride, so any size fits. */
static dim3 naive_score_grid(const fc_problem *p) {
  int64_t sh = p->batch * p->heads_q;
  return dim3((unsigned)naive_blocks(p->seqlen_q * p->seqlen_k), (unsigned)(sh > 65535 ? 65535 : sh), 1);
}

/* Score offsets per sequence (host, then device), and the total count of score elements. */
static flashc_status naive_offsets(const fc_problem *p, int64_t **host_off, int64_t *total) {
  void *mem;
  FC_CHECK(fc_host_workspace(p, (size_t)(p->batch + 1) * sizeof(int64_t), &mem));
  int64_t *off = (int64_t *)mem, acc = 0;
  for (int64_t s = 0; s < p->batch; s++) {
    int64_t q0, sq, k0, sk, n;
    fc_seq_q(p, s, &q0, &sq);
    fc_seq_k(p, s, &k0, &sk);
    off[s] = acc;
    if (!fc_mul_ok(sq, sk, &n) || !fc_mul_ok(n, p->heads_q, &n) || !fc_add_ok(acc, n, &acc))
      return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "cuda-naive: the score matrices need more than 2^63 elements");
    (void)q0;
    (void)k0;
  }
  off[p->batch] = acc;
  *host_off = off;
  *total = acc;
  return FLASHC_OK;
}

/* Workspace of `bytes` for `matrices` score matrices of `scores` elements each: refused up front when the
 * device does not have the memory free, and again if the allocation itself fails. */
static flashc_status naive_workspace(const fc_problem *p, int64_t scores, int matrices, size_t extra, void **ws) {
  int64_t elems, bytes;
  if (!fc_mul_ok(scores, matrices, &elems) || !fc_mul_ok(elems, (int64_t)sizeof(float), &bytes) ||
      !fc_add_ok(bytes, (int64_t)extra, &bytes))
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "cuda-naive: %d score matrices of %lld elements overflow 64 bits",
                    matrices, (long long)scores);
  struct flashc_handle_s *h = p->handle;
  if ((size_t)bytes > h->device_ws_size) {
    size_t free_b = 0, total_b = 0;
    FC_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if ((size_t)bytes > free_b + h->device_ws_size) /* the handle's old workspace is released first */
      return fc_error(FLASHC_ERR_OUT_OF_MEMORY,
                      "cuda-naive: the materialised scores need %lld bytes (%.1f MiB: %d x %lld fp32 elements) of "
                      "device memory but %zu bytes (%.1f MiB) are free; cuda-fa2-fp32 needs O(seqlen) memory",
                      (long long)bytes, bytes / 1048576.0, matrices, (long long)scores, free_b, free_b / 1048576.0);
  }
  flashc_status st = fc_device_workspace(p, (size_t)bytes, ws);
  if (st == FLASHC_ERR_OUT_OF_MEMORY) {
    char why[256];
    snprintf(why, sizeof why, "%s", flashc_last_error());
    return fc_error(st, "cuda-naive: the materialised scores need %lld bytes of device memory: %s", (long long)bytes,
                    why);
  }
  return st;
}

static bool naive_usable(char *why, size_t len) { return fc_cuda_usable_sm(80, why, len); }

static flashc_status naive_supports(const fc_problem *p) { return fc_cc_supports_common(p, "cuda-naive"); }

/* Carves the workspace: cu_seqlens, score offsets, then the score matrices. */
static flashc_status naive_setup(const fc_problem *p, int matrices, size_t extra, fc_cc_args *a, int64_t **off_dev,
                                 float **scores, int64_t *total) {
  int64_t *off_host = NULL;
  FC_CHECK(naive_offsets(p, &off_host, total));
  size_t cu_bytes = fc_cc_seqlens_bytes(p), off_bytes = fc_cc_align((size_t)(p->batch + 1) * sizeof(int64_t));
  void *ws;
  FC_CHECK(naive_workspace(p, *total, matrices, cu_bytes + off_bytes + fc_cc_align(extra), &ws));
  char *cursor = (char *)ws;
  FC_CHECK(fc_cc_args_make(p, cursor, a));
  cursor += cu_bytes;
  *off_dev = (int64_t *)cursor;
  FC_CUDA_CHECK(cudaMemcpyAsync(*off_dev, off_host, (size_t)(p->batch + 1) * sizeof(int64_t), cudaMemcpyHostToDevice,
                                fc_stream(p)));
  cursor += off_bytes;
  *scores = (float *)cursor;
  return FLASHC_OK;
}

static flashc_status naive_forward(const fc_problem *p) {
  fc_cc_args a;
  int64_t *off = NULL, total = 0;
  float *S = NULL;
  FC_CHECK(naive_setup(p, 1, 0, &a, &off, &S, &total));
  cudaStream_t st = fc_stream(p);
  naive_scores_kernel<<<naive_score_grid(p), NAIVE_THREADS, 0, st>>>(a, off, S);
  FC_LAUNCH_CHECK("naive_scores_kernel");
  naive_softmax_kernel<<<naive_blocks(p->total_q * p->heads_q * 32), NAIVE_THREADS, 0, st>>>(a, off, S);
  FC_LAUNCH_CHECK("naive_softmax_kernel");
  naive_pv_kernel<<<naive_blocks(p->total_q * p->heads_q * p->head_dim), NAIVE_THREADS, 0, st>>>(a, off, S);
  FC_LAUNCH_CHECK("naive_pv_kernel");
  return FLASHC_OK;
}

static flashc_status naive_backward(const fc_problem *p) {
  fc_cc_args a;
  int64_t *off = NULL, total = 0;
  float *P = NULL;
  size_t d_bytes = (size_t)(p->total_q * p->heads_q) * sizeof(float);
  FC_CHECK(naive_setup(p, 2, d_bytes, &a, &off, &P, &total));
  float *dS = P + total, *Dbuf = dS + total;
  cudaStream_t st = fc_stream(p);
  naive_scores_kernel<<<naive_score_grid(p), NAIVE_THREADS, 0, st>>>(a, off, P);
  FC_LAUNCH_CHECK("naive_scores_kernel");
  naive_probs_kernel<<<naive_blocks(p->total_q * p->heads_q * 32), NAIVE_THREADS, 0, st>>>(a, off, P, Dbuf);
  FC_LAUNCH_CHECK("naive_probs_kernel");
  naive_dscores_kernel<<<naive_score_grid(p), NAIVE_THREADS, 0, st>>>(a, off, P, Dbuf, dS);
  FC_LAUNCH_CHECK("naive_dscores_kernel");
  naive_dq_kernel<<<naive_blocks(p->total_q * p->heads_q * p->head_dim), NAIVE_THREADS, 0, st>>>(a, off, dS);
  FC_LAUNCH_CHECK("naive_dq_kernel");
  naive_dkdv_kernel<<<naive_blocks(p->total_k * p->heads_kv * p->head_dim), NAIVE_THREADS, 0, st>>>(a, off, P, dS,
                                                                                                    p->total_k);
  FC_LAUNCH_CHECK("naive_dkdv_kernel");
  return FLASHC_OK;
}

extern "C" const fc_backend fc_backend_cuda_naive = {
    "cuda-naive",
    "materialised scores: S = QKᵀ, row softmax and PV as separate kernels; O(seqlen²) memory",
    FLASHC_DEVICE_CUDA,
    1u << FLASHC_F32,
    1,
    256,
    naive_usable,
    naive_supports,
    naive_forward,
    naive_backward,
    0,    /* features: the plain call only (validate.c refuses the others) */
    0,    /* max_head_dim_v */
    NULL, /* forward_kvcache */
};
