/* common/fill.cu — the results that api.c writes in device memory: those of an empty problem (write_empty_results:
 * zeros in a strided view, −inf in lse; no backend kernel runs for such a problem, so these are the only writes it
 * makes) and those of the rows past seqused (write_unused_rows), and the sequences' ends under seqused or under device
 * offsets that the kernels read (mma/host.cuh), the debug dropout mask (write_dropout_mask), and cuda-mma's staged
 * copies of views whose rows are not on 16 bytes (mma/host.cuh, fc_mma_stage). */
#include "common/bwd_rows.cuh" /* fc_bwd_pad_offset */
#include "common/common.cuh"
#include "../../philox.h"

#include <math.h>
#include <string.h>

/* x: [n0, n1, n2, row], row contiguous, strides s0, s1, s2 in elements: x ← from (the same shape, strides f0, f1, f2),
 * or zeros where from is NULL. One warp per row, its lanes over the row's elements: the row's address is worked out
 * once (64-bit divisions per element made a staged copy of 15 MB take 4× its memory time), and only the view's
 * elements are written (a strided o keeps the memory between its rows). T is an unsigned integer of the element's
 * size: all-zero bits are +0 in every dtype. */
typedef struct fc_rows_shape {
  int64_t n1, n2, row, s0, s1, s2, f0, f1, f2;
} fc_rows_shape;

template <typename T> __global__ void fc_rows_kernel(T *x, const T *from, const fc_rows_shape sh, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * blockDim.x / 32;
  for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int64_t i2 = r % sh.n2, i1 = (r / sh.n2) % sh.n1, i0 = r / sh.n2 / sh.n1;
    T *to = x + i0 * sh.s0 + i1 * sh.s1 + i2 * sh.s2;
    if (from) {
      const T *src = from + i0 * sh.f0 + i1 * sh.f1 + i2 * sh.f2;
      for (int64_t d = lane; d < sh.row; d += 32) to[d] = src[d];
    } else {
      for (int64_t d = lane; d < sh.row; d += 32) to[d] = T(0);
    }
  }
}

__global__ void fc_fill_f32_kernel(float *x, int64_t n, float value) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    x[i] = value;
}

/* A grid-stride loop: enough blocks to fill the GPU, never more than the grid allows. */
static unsigned fc_fill_blocks(int64_t n) {
  const int64_t b = fc_cdiv(n, 256);
  return (unsigned)(b < 4096 ? b : 4096);
}

template <typename T>
static flashc_status fc_rows_launch(const fc_problem *p, void *x, const void *from, const fc_rows_shape *sh,
                                    int64_t total) {
  const int64_t rows = total / sh->row;
  fc_rows_kernel<T><<<fc_fill_blocks(rows * 32), 256, 0, fc_stream(p)>>>((T *)x, (const T *)from, *sh, rows);
  FC_LAUNCH_CHECK("fc_rows_kernel");
  return FLASHC_OK;
}

/* x ← from (NULL: zeros) over the view [n0, n1, n2, row] with strides st of x and fst of from (NULL when from is). */
extern "C" flashc_status fc_device_copy_rows(const fc_problem *p, void *x, const int64_t st[3], const void *from,
                                             const int64_t fst[3], const int64_t n[3], int64_t row) {
  const size_t es = flashc_dtype_size(p->dtype);
  const int64_t total = n[0] * n[1] * n[2] * row; /* ≤ the view's span, checked by validation */
  if (total == 0) return FLASHC_OK;
  const fc_rows_shape sh = {n[1], n[2], row, st[0], st[1], st[2], fst ? fst[0] : 0, fst ? fst[1] : 0, fst ? fst[2] : 0};
  switch (es) {
  case 2: return fc_rows_launch<uint16_t>(p, x, from, &sh, total);
  case 4: return fc_rows_launch<uint32_t>(p, x, from, &sh, total);
  case 8: return fc_rows_launch<uint64_t>(p, x, from, &sh, total);
  }
  return fc_error(FLASHC_ERR_INTERNAL, "fc_device_copy_rows: element size %zu", es);
}

extern "C" flashc_status fc_device_zero_rows(const fc_problem *p, void *data, const int64_t n[3],
                                             const int64_t stride[3], int64_t row) {
  const int64_t total = n[0] * n[1] * n[2] * row;
  if (total == 0) return FLASHC_OK;
  /* Dense (each stride the size of what it steps over, or a dim of 1): one memset over the elements. */
  bool dense = true;
  int64_t inner = row;
  for (int d = 2; d >= 0; d--) {
    if (n[d] > 1 && stride[d] != inner) dense = false;
    inner *= n[d];
  }
  if (dense) {
    FC_CUDA_CHECK(cudaMemsetAsync(data, 0, (size_t)total * flashc_dtype_size(p->dtype), fc_stream(p)));
    return FLASHC_OK;
  }
  return fc_device_copy_rows(p, data, stride, NULL, NULL, n, row);
}

extern "C" flashc_status fc_device_fill_f32(const fc_problem *p, float *data, int64_t n, float value) {
  if (n == 0) return FLASHC_OK;
  fc_fill_f32_kernel<<<fc_fill_blocks(n), 256, 0, fc_stream(p)>>>(data, n, value);
  FC_LAUNCH_CHECK("fc_fill_f32_kernel");
  return FLASHC_OK;
}

/* ---- seqused: the ends of the sequences, and the rows past them ---------------------------------------------- */
/* end[b] = cu[b] + used[b] for b < n, over used's copy in end (mma/host.cuh, fc_mma_upload_cu_seqlens): blocks over
 * q's ends first, then k's. */
__global__ void fc_seq_ends_kernel(int32_t *end_q, const int32_t *cu_q, int32_t *end_k, const int32_t *cu_k,
                                   int64_t n) {
  const int64_t nq = end_q ? n : 0, total = nq + (end_k ? n : 0);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    if (i < nq)
      end_q[i] += cu_q[i];
    else
      end_k[i - nq] += cu_k[i - nq];
  }
}

extern "C" flashc_status fc_device_seq_ends(const fc_problem *p, int32_t *end_q, const int32_t *cu_q, int32_t *end_k,
                                            const int32_t *cu_k) {
  const int64_t n = (end_q ? p->batch : 0) + (end_k ? p->batch : 0);
  if (n == 0) return FLASHC_OK;
  fc_seq_ends_kernel<<<fc_fill_blocks(n), 256, 0, fc_stream(p)>>>(end_q, cu_q, end_k, cu_k, p->batch);
  FC_LAUNCH_CHECK("fc_seq_ends_kernel");
  return FLASHC_OK;
}

/* Device offsets (flashc.h, cu_seqlens_device; mma/host.cuh, fc_mma_upload_cu_seqlens): the ends of the sequences cut
 * to max_seqlen (a length below 0, an offset the caller promised would not decrease, counts as 0), and with pad the
 * backward's padded row offsets (common/bwd_rows.cuh, fc_bwd_pad_offset), b ≤ n. */
__global__ void fc_seq_clamp_kernel(const int32_t *cu_q, const int32_t *cu_k, int32_t *end_q, int32_t *end_k,
                                    int64_t *pad, int64_t n, int max_q, int max_k) {
  for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b <= n; b += (int64_t)gridDim.x * blockDim.x) {
    if (b < n) {
      end_q[b] = cu_q[b] + min(max(cu_q[b + 1] - cu_q[b], 0), max_q);
      end_k[b] = cu_k[b] + min(max(cu_k[b + 1] - cu_k[b], 0), max_k);
    }
    if (pad) pad[b] = fc_bwd_pad_offset(cu_q[b], b);
  }
}

extern "C" flashc_status fc_device_seq_clamp(const fc_problem *p, int32_t *end_q, int32_t *end_k, int64_t *pad) {
  fc_seq_clamp_kernel<<<fc_fill_blocks(p->batch + 1), 256, 0, fc_stream(p)>>>(
      p->cu_seqlens_q, p->cu_seqlens_k, end_q, end_k, pad, p->batch, (int)p->seqlen_q, (int)p->seqlen_k);
  FC_LAUNCH_CHECK("fc_seq_clamp_kernel");
  return FLASHC_OK;
}

/* The outputs of the rows past seqused (flashc.h): per sequence s, the rows [cu[s] + used[s], cu[s + 1]) of each view,
 * every head and column, set to 0, and lse of those query rows to −inf. Up to three views (forward: o; backward: dq,
 * dk, dv), each on the q side or the k side; used NULL: that side's slots are whole. */
typedef struct fc_unused_view {
  void *data;
  int64_t ss, sh; /* row and head strides, in elements (varlen: stride_b is 0) */
  int heads, dim, keys;
} fc_unused_view;
typedef struct fc_unused_args {
  fc_unused_view v[3];
  int nv;
  float *lse; /* [heads_q, total_q], or NULL */
  int64_t total_q, batch;
  int heads_q;
  const int32_t *cu[2], *used[2]; /* [0]: q, [1]: k (device copies) */
} fc_unused_args;

/* One block per sequence at a time (a grid-stride loop over them), its threads over the elements of its unused rows.
 * T: an unsigned integer of the element's size (all-zero bits are +0 in every dtype). */
template <typename T> __global__ void fc_unused_rows_kernel(const fc_unused_args a) {
  for (int64_t s = blockIdx.x; s < a.batch; s += gridDim.x) {
    for (int x = 0; x < a.nv; x++) {
      const fc_unused_view &v = a.v[x];
      if (!a.used[v.keys]) continue;
      const int64_t first = (int64_t)a.cu[v.keys][s] + a.used[v.keys][s], per_row = (int64_t)v.heads * v.dim;
      const int64_t n = ((int64_t)a.cu[v.keys][s + 1] - first) * per_row;
      for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
        const int64_t r = first + e / per_row, h = e % per_row / v.dim, c = e % v.dim;
        ((T *)v.data)[r * v.ss + h * v.sh + c] = T(0);
      }
    }
    if (a.lse && a.used[0]) {
      const int64_t first = (int64_t)a.cu[0][s] + a.used[0][s], rows = (int64_t)a.cu[0][s + 1] - first;
      for (int64_t e = threadIdx.x; e < rows * a.heads_q; e += blockDim.x)
        a.lse[e / rows * a.total_q + first + e % rows] = -INFINITY;
    }
  }
}

extern "C" flashc_status fc_device_unused_rows(const fc_problem *p) {
  if (!p->seqused_q && !p->seqused_k) return FLASHC_OK;
  fc_unused_args a;
  memset(&a, 0, sizeof a);
  a.total_q = p->total_q, a.batch = p->batch, a.heads_q = (int)p->heads_q;
  /* The sequences on the device, in the workspace: the backend's kernels that read its earlier contents were
   * enqueued on this stream before these copies, so they are done with them when the copies run. */
  const int64_t n = p->batch;
  const size_t bytes = ((size_t)(n + 1) * 2 + (p->seqused_q ? n : 0) + (p->seqused_k ? n : 0)) * sizeof(int32_t);
  void *ws = NULL;
  FC_CHECK(fc_device_workspace(p, bytes, &ws));
  int32_t *at = (int32_t *)ws;
  const cudaStream_t stream = fc_stream(p);
  const int32_t *host[2][2] = {{p->cu_seqlens_q, p->seqused_q}, {p->cu_seqlens_k, p->seqused_k}};
  for (int side = 0; side < 2; side++) {
    FC_CUDA_CHECK(
        cudaMemcpyAsync(at, host[side][0], (size_t)(n + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    a.cu[side] = at, at += n + 1;
    if (!host[side][1]) continue;
    FC_CUDA_CHECK(cudaMemcpyAsync(at, host[side][1], (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    a.used[side] = at, at += n;
  }
  /* forward: o (and lse); backward: dq on the q side, dk and dv on the k side */
  const fc_view *views[3] = {&p->dq, &p->dk, &p->dv};
  const int64_t heads[3] = {p->heads_q, p->heads_kv, p->heads_kv}, dims[3] = {p->head_dim, p->head_dim, p->head_dim_v};
  if (!p->is_backward) views[0] = &p->o, a.lse = p->lse;
  for (int x = 0; x < (p->is_backward ? 3 : 1); x++) {
    fc_unused_view &v = a.v[a.nv++];
    v.data = views[x]->data, v.ss = views[x]->stride_s, v.sh = views[x]->stride_h;
    v.heads = (int)heads[x], v.dim = (int)(p->is_backward ? dims[x] : p->head_dim_v), v.keys = x > 0;
  }
  const unsigned blocks = (unsigned)(n < 4096 ? n : 4096);
  switch (flashc_dtype_size(p->dtype)) {
  case 2: fc_unused_rows_kernel<uint16_t><<<blocks, 256, 0, stream>>>(a); break;
  case 4: fc_unused_rows_kernel<uint32_t><<<blocks, 256, 0, stream>>>(a); break;
  case 8: fc_unused_rows_kernel<uint64_t><<<blocks, 256, 0, stream>>>(a); break;
  default: return fc_error(FLASHC_ERR_INTERNAL, "fc_device_unused_rows: element size %zu", flashc_dtype_size(p->dtype));
  }
  FC_LAUNCH_CHECK("fc_unused_rows_kernel");
  return FLASHC_OK;
}

/* ---- the dropout mask (debug) ------------------------------------------------------------------------------- */
/* keep_ij of sequence s's planes (heads_q of them, each SQ × SK, the sequence's sq × sk corner used), one thread per
 * Philox block (8 keys of a row): philox.h's rule, as api.c's host loop writes it. */
__global__ void fc_dropout_mask_kernel(uint8_t *mask, int64_t heads, int64_t sq, int64_t sk, int64_t SQ, int64_t SK,
                                       uint64_t bh0, uint64_t seed, uint64_t offset, uint32_t threshold) {
  const int64_t nb = (int64_t)fc_dropout_row_blocks(sk), per = sq * nb, total = heads * per;
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < total; x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t h = x / per, n = x % per, i = n / nb, j0 = n % nb * FC_DROPOUT_KEYS;
    const uint32_t bits =
        fc_dropout_block_bits(fc_dropout_block(seed, offset, bh0 + (uint64_t)h, (uint64_t)n), threshold);
    uint8_t *row = mask + h * SQ * SK + i * SK;
    for (int64_t j = j0; j < j0 + FC_DROPOUT_KEYS && j < sk; j++) row[j] = (uint8_t)(bits >> (j - j0) & 1u);
  }
}

extern "C" flashc_status fc_device_dropout_mask(const fc_problem *p) {
  const int64_t SQ = p->seqlen_q, SK = p->seqlen_k;
  /* 0 past each sequence's lengths (varlen): the whole mask first, then each sequence's corner */
  FC_CUDA_CHECK(cudaMemsetAsync(p->dropout_mask, 0, (size_t)(p->batch * p->heads_q * SQ * SK), fc_stream(p)));
  for (int64_t s = 0; s < p->batch; s++) {
    int64_t start, sq, sk;
    fc_seq_q(p, s, &start, &sq);
    fc_seq_k(p, s, &start, &sk);
    if (sq <= 0 || sk <= 0) continue;
    const int64_t n = p->heads_q * sq * (int64_t)fc_dropout_row_blocks(sk);
    fc_dropout_mask_kernel<<<fc_fill_blocks(n), 256, 0, fc_stream(p)>>>(
        p->dropout_mask + s * p->heads_q * SQ * SK, p->heads_q, sq, sk, SQ, SK, (uint64_t)(s * p->heads_q),
        p->dropout_seed, p->dropout_offset, p->dropout_threshold);
    FC_LAUNCH_CHECK("fc_dropout_mask_kernel");
  }
  return FLASHC_OK;
}
