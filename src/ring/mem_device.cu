/* mem_device.cu — the ring's buffer operations in device memory (the twins of mem_host.c): fill, copy with
 * conversion, accumulate, and the merge of partial attention through the log-sum-exp.
 *
 * Every kernel but fill works on rows (b, s, h) of d contiguous elements: one warp per row, four rows per
 * block of 128 threads, lanes striding along d (coalesced). The index arithmetic is 64-bit and done once per
 * row. All work is queued on the call's stream (ctx->stream). */
#include "../cuda/common/common.cuh"
#include "ring.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

enum { ROWS_PER_BLOCK = 4 };

/* ---- elements of any dtype, as f32 ------------------------------------------------------------------- */
static __device__ __forceinline__ float load_f32(const void *base, flashc_dtype dt, int64_t i) {
  switch (dt) {
  case FLASHC_F32: return ((const float *)base)[i];
  case FLASHC_F16: return __half2float(((const __half *)base)[i]);
  case FLASHC_BF16: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
  case FLASHC_F64: return (float)((const double *)base)[i];
  }
  return 0.0f;
}

static __device__ __forceinline__ void store_f32(void *base, flashc_dtype dt, int64_t i, float x) {
  switch (dt) {
  case FLASHC_F32: ((float *)base)[i] = x; break;
  case FLASHC_F16: ((__half *)base)[i] = __float2half_rn(x); break;
  case FLASHC_BF16: ((__nv_bfloat16 *)base)[i] = __float2bfloat16_rn(x); break;
  case FLASHC_F64: ((double *)base)[i] = x; break;
  }
}

/* Element offset of row (b, s, h) of a tile. */
static __device__ __forceinline__ int64_t row_offset(const fc_tile &t, int64_t b, int64_t s, int64_t h) {
  return b * t.stride_b + s * t.stride_s + h * t.stride_h;
}

/* This warp's row (b, s, h) of a shape, or false past the last row. */
static __device__ __forceinline__ bool my_row(const fc_shape &shape, int64_t *b, int64_t *s, int64_t *h) {
  int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
  if (r >= shape.b * shape.s * shape.h) return false;
  *h = r % shape.h;
  int64_t bs = r / shape.h;
  *s = bs % shape.s;
  *b = bs / shape.s;
  return true;
}

static unsigned row_blocks(fc_shape shape) {
  int64_t rows = shape.b * shape.s * shape.h;
  return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

/* ---- kernels ------------------------------------------------------------------------------------------ */
static __global__ void fill_kernel(float *dst, int64_t n, float value) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = value;
}

/* dst = src, converted (rounded once). */
static __global__ void copy_kernel(fc_shape shape, fc_tile src, fc_tile dst) {
  int64_t b, s, h;
  if (!my_row(shape, &b, &s, &h)) return;
  int64_t si = row_offset(src, b, s, h), di = row_offset(dst, b, s, h);
  for (int64_t d = threadIdx.x; d < shape.d; d += 32)
    store_f32(dst.data, dst.dtype, di + d, load_f32(src.data, src.dtype, si + d));
}

/* dst (f32) += src. */
static __global__ void add_kernel(fc_shape shape, fc_tile src, fc_tile dst) {
  int64_t b, s, h;
  if (!my_row(shape, &b, &s, &h)) return;
  int64_t si = row_offset(src, b, s, h), di = row_offset(dst, b, s, h);
  float *out = (float *)dst.data;
  for (int64_t d = threadIdx.x; d < shape.d; d += 32) out[di + d] += load_f32(src.data, src.dtype, si + d);
}

/* Row (b, s, h) of the part into row (b, row0 + s, h) of the accumulator (see fc_ring_mem.merge):
 *   w = σ(lse₂ − lse₁),  o = o₁ − w·(o₁ − o₂),  lse = max(lse₁, lse₂) + log1p(exp(−|lse₁ − lse₂|)) */
static __global__ void merge_kernel(fc_shape shape, fc_tile part, const float *part_lse, int64_t part_len, fc_tile acc,
                                    float *acc_lse, int64_t acc_len, int64_t row0) {
  int64_t b, s, h;
  if (!my_row(shape, &b, &s, &h)) return;
  float *l1p = &acc_lse[(b * shape.h + h) * acc_len + row0 + s];
  float l1 = *l1p, l2 = part_lse[(b * shape.h + h) * part_len + s];
  if (l2 == -INFINITY) return; /* the part saw no key of this row */
  int64_t pi = row_offset(part, b, s, h), ai = row_offset(acc, b, row0 + s, h);
  float *o1 = (float *)acc.data;
  float e = 0.0f, w = 1.0f; /* l1 = −inf: the part replaces the empty accumulator */
  if (l1 != -INFINITY) {
    float delta = l2 - l1;
    e = expf(-fabsf(delta));
    w = delta >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  }
  for (int64_t d = threadIdx.x; d < shape.d; d += 32) {
    float o2 = load_f32(part.data, part.dtype, pi + d);
    o1[ai + d] = l1 == -INFINITY ? o2 : o1[ai + d] - w * (o1[ai + d] - o2);
  }
  /* every lane has read l1 above; one writes the new value */
  if (threadIdx.x == 0) *l1p = l1 == -INFINITY ? l2 : fmaxf(l1, l2) + log1pf(e);
}

/* ---- the operations ----------------------------------------------------------------------------------- */
static flashc_status dev_alloc(size_t bytes, void **ptr) {
  cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *ptr = NULL;
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "ring attention: %zu bytes (%.2f GiB) of device buffers: %s", bytes,
                    bytes / 1073741824.0, cudaGetErrorString(e));
  }
  return FLASHC_OK;
}

static void dev_release(void *ptr) {
  cudaFree(ptr);
  cudaGetLastError();
}

static flashc_status dev_fill(const fc_problem *ctx, float *dst, int64_t n, float value) {
  if (n <= 0) return FLASHC_OK;
  int64_t blocks = (n + 255) / 256;
  fill_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, fc_stream(ctx)>>>(dst, n, value);
  FC_LAUNCH_CHECK("ring fill_kernel");
  return FLASHC_OK;
}

static flashc_status dev_copy(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst) {
  if (shape.b * shape.s * shape.h == 0) return FLASHC_OK;
  copy_kernel<<<row_blocks(shape), dim3(32, ROWS_PER_BLOCK), 0, fc_stream(ctx)>>>(shape, src, dst);
  FC_LAUNCH_CHECK("ring copy_kernel");
  return FLASHC_OK;
}

static flashc_status dev_add(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst) {
  if (shape.b * shape.s * shape.h == 0) return FLASHC_OK;
  add_kernel<<<row_blocks(shape), dim3(32, ROWS_PER_BLOCK), 0, fc_stream(ctx)>>>(shape, src, dst);
  FC_LAUNCH_CHECK("ring add_kernel");
  return FLASHC_OK;
}

static flashc_status dev_merge(const fc_problem *ctx, fc_shape shape, fc_tile part_o, const float *part_lse,
                               int64_t part_len, fc_tile acc_o, float *acc_lse, int64_t acc_len, int64_t row0) {
  if (shape.b * shape.s * shape.h == 0) return FLASHC_OK;
  merge_kernel<<<row_blocks(shape), dim3(32, ROWS_PER_BLOCK), 0, fc_stream(ctx)>>>(shape, part_o, part_lse, part_len,
                                                                                   acc_o, acc_lse, acc_len, row0);
  FC_LAUNCH_CHECK("ring merge_kernel");
  return FLASHC_OK;
}

/* Positional: designated initializers are C++20. Order: alloc, release, fill, copy, add, merge. */
extern "C" const fc_ring_mem fc_ring_mem_device = {dev_alloc, dev_release, dev_fill, dev_copy, dev_add, dev_merge};
