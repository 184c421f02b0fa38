/* common/fill.cu — the results of an empty problem in device memory (api.c, write_empty_results): zeros in a strided
 * view, −inf in lse. No backend kernel runs for such a problem, so these are the only writes it makes. */
#include "common/common.cuh"

/* x: [n0, n1, n2, row], row contiguous, strides s0, s1, s2 in elements. Element e of the flattened view → its
 * address; only the view's elements are written (a strided o keeps the memory between its rows). T is an
 * unsigned integer of the element's size: all-zero bits are +0 in every dtype. */
template <typename T>
__global__ void fc_zero_rows_kernel(T *x, int64_t n1, int64_t n2, int64_t row, int64_t s0, int64_t s1, int64_t s2,
                                    int64_t total) {
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t d = e % row, r = e / row;
    const int64_t i2 = r % n2, i1 = (r / n2) % n1, i0 = r / n2 / n1;
    x[i0 * s0 + i1 * s1 + i2 * s2 + d] = T(0);
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
static flashc_status fc_zero_rows_launch(const fc_problem *p, void *data, const int64_t n[3], const int64_t st[3],
                                         int64_t row, int64_t total) {
  fc_zero_rows_kernel<T>
      <<<fc_fill_blocks(total), 256, 0, fc_stream(p)>>>((T *)data, n[1], n[2], row, st[0], st[1], st[2], total);
  FC_LAUNCH_CHECK("fc_zero_rows_kernel");
  return FLASHC_OK;
}

extern "C" flashc_status fc_device_zero_rows(const fc_problem *p, void *data, const int64_t n[3],
                                             const int64_t stride[3], int64_t row) {
  const size_t es = flashc_dtype_size(p->dtype);
  const int64_t total = n[0] * n[1] * n[2] * row; /* ≤ the view's span, checked by validation */
  if (total == 0) return FLASHC_OK;
  /* Dense (each stride the size of what it steps over, or a dim of 1): one memset over the elements. */
  bool dense = true;
  int64_t inner = row;
  for (int d = 2; d >= 0; d--) {
    if (n[d] > 1 && stride[d] != inner) dense = false;
    inner *= n[d];
  }
  if (dense) {
    FC_CUDA_CHECK(cudaMemsetAsync(data, 0, (size_t)total * es, fc_stream(p)));
    return FLASHC_OK;
  }
  switch (es) {
  case 2: return fc_zero_rows_launch<uint16_t>(p, data, n, stride, row, total);
  case 4: return fc_zero_rows_launch<uint32_t>(p, data, n, stride, row, total);
  case 8: return fc_zero_rows_launch<uint64_t>(p, data, n, stride, row, total);
  }
  return fc_error(FLASHC_ERR_INTERNAL, "fc_device_zero_rows: element size %zu", es);
}

extern "C" flashc_status fc_device_fill_f32(const fc_problem *p, float *data, int64_t n, float value) {
  if (n == 0) return FLASHC_OK;
  fc_fill_f32_kernel<<<fc_fill_blocks(n), 256, 0, fc_stream(p)>>>(data, n, value);
  FC_LAUNCH_CHECK("fc_fill_f32_kernel");
  return FLASHC_OK;
}
