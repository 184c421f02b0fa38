/* mma/host.cuh — the host side shared by cuda-mma's forward (mma/fwd.cu) and
 * backward (mma/bwd.cu): which head dims are compiled, whether cp.async may be
 * used, the varlen offsets on the device, the launch limits. */
#ifndef FLASHC_CUDA_MMA_HOST_CUH
#define FLASHC_CUDA_MMA_HOST_CUH

#include "common/common.cuh"

/* Head dims compiled as template instances; any other d <= 256 runs in the next
 * one up, its columns past d loaded as zeros (they add nothing to Q·Kᵀ and
 * produce columns of O that are never stored). */
static inline int fc_mma_compiled_dim(int64_t d) {
  static const int dims[] = {32, 64, 96, 128, 160, 192, 256};
  for (int i = 0; i < (int)(sizeof dims / sizeof dims[0]); i++)
    if (d <= dims[i]) return dims[i];
  return 0;
}

/* cp.async copies 16 aligned bytes: every row of the view must start on a
 * 16-byte boundary. */
static inline bool fc_mma_view_aligned(const fc_view *v) {
  return ((uintptr_t)v->data % 16) == 0 && v->stride_b % 8 == 0 && v->stride_s % 8 == 0 && v->stride_h % 8 == 0;
}

/* The varlen offsets, copied from the caller's host arrays into `ws` (2·(batch
 * + 1) int32) on the stream; *cu_q = *cu_k = NULL for a dense problem. */
static inline flashc_status fc_mma_upload_cu_seqlens(const fc_problem *p, int32_t *ws, const int32_t **cu_q,
                                                     const int32_t **cu_k) {
  *cu_q = *cu_k = NULL;
  if (!p->cu_seqlens_q) return FLASHC_OK;
  size_t n = (size_t)(p->batch + 1) * sizeof(int32_t);
  FC_CUDA_CHECK(cudaMemcpyAsync(ws, p->cu_seqlens_q, n, cudaMemcpyHostToDevice, fc_stream(p)));
  FC_CUDA_CHECK(cudaMemcpyAsync(ws + p->batch + 1, p->cu_seqlens_k, n, cudaMemcpyHostToDevice, fc_stream(p)));
  *cu_q = ws;
  *cu_k = ws + p->batch + 1;
  return FLASHC_OK;
}

/* Bytes of the varlen offsets in the workspace, rounded to 256 so that what
 * follows stays aligned. */
static inline size_t fc_mma_cu_seqlens_bytes(const fc_problem *p) {
  return p->cu_seqlens_q ? ((size_t)(p->batch + 1) * 2 * sizeof(int32_t) + 255) / 256 * 256 : 0;
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

#endif /* FLASHC_CUDA_MMA_HOST_CUH */
