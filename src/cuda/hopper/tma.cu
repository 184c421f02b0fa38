/* hopper/tma.cu — the host side of cuda-hopper's TMA (hopper/tma.cuh): shapes, checks and tensor maps of the
 * views, for the forward and the backward. */
#include "hopper/tma.cuh"

#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */

/* cuTensorMapEncodeTiled, from the driver the runtime already loaded: the library links no libcuda. */
static flashc_status fc_hp_encoder(PFN_cuTensorMapEncodeTiled_v12000 *fn) {
  static PFN_cuTensorMapEncodeTiled_v12000 cached = NULL;
  if (!cached) {
    void *ptr = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !ptr) {
      cudaGetLastError();
      return fc_error(FLASHC_ERR_CUDA, "backend cuda-hopper: the driver has no cuTensorMapEncodeTiled (%s, query %d)",
                      cudaGetErrorString(e), (int)q);
    }
    cached = (PFN_cuTensorMapEncodeTiled_v12000)ptr;
  }
  *fn = cached;
  return FLASHC_OK;
}

fc_hp_map_shape fc_hp_shape(const fc_problem *p, const fc_view *v, bool is_q) {
  fc_hp_map_shape s;
  /* V's head dim for v, o, dout (head_dim_v may differ from q's and k's head_dim): a tile's columns past a tensor's
   * own come in as zeros */
  const bool v_cols = v == &p->v || v == &p->o || v == &p->dout || v == &p->dv;
  s.size[0] = v_cols ? p->head_dim_v : p->head_dim;
  s.size[1] = is_q ? (p->cu_seqlens_q ? p->total_q : p->seqlen_q) : (p->cu_seqlens_k ? p->total_k : p->seqlen_k);
  s.size[2] = is_q ? p->heads_q : p->heads_kv;
  s.size[3] = p->cu_seqlens_q ? 1 : p->batch;
  s.stride[0] = 1;
  s.stride[1] = v->stride_s;
  s.stride[2] = v->stride_h;
  s.stride[3] = v->stride_b;
  int64_t widest = 8;
  for (int d = 1; d < 4; d++)
    if (s.size[d] > 1 && s.stride[d] > widest) widest = s.stride[d];
  for (int d = 1; d < 4; d++)
    if (s.size[d] == 1) s.stride[d] = (widest + 7) / 8 * 8;
  return s;
}

flashc_status fc_hp_check_view(const fc_problem *p, const fc_view *v, bool is_q, const char *name) {
  const fc_hp_map_shape s = fc_hp_shape(p, v, is_q);
  if ((uintptr_t)v->data % 16 != 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s.data is not 16-byte aligned; backend cuda-hopper loads it with TMA",
                    name);
  static const char *const dim_names[4] = {"head_dim", "seqlen", "heads", "batch"};
  for (int d = 1; d < 4; d++) {
    if (s.stride[d] % 8 != 0 || s.stride[d] >= ((int64_t)1 << 39))
      return fc_error(FLASHC_ERR_UNSUPPORTED,
                      "%s's %s stride is %lld elements; backend cuda-hopper (TMA) needs a multiple of 8 below 2^39",
                      name, dim_names[d], (long long)s.stride[d]);
    if (s.size[d] > INT32_MAX)
      return fc_error(FLASHC_ERR_UNSUPPORTED, "%s has %lld %s; backend cuda-hopper addresses at most 2^31-1", name,
                      (long long)s.size[d], dim_names[d]);
  }
  return FLASHC_OK;
}

flashc_status fc_hp_encode_box(const fc_problem *p, const fc_view *v, bool is_q, const char *name, int box_rows,
                               const char *op, CUtensorMap *map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
  FC_CHECK(fc_hp_encoder(&encode));
  const fc_hp_map_shape s = fc_hp_shape(p, v, is_q);
  cuuint64_t dims[4], strides[3];
  for (int d = 0; d < 4; d++) dims[d] = (cuuint64_t)s.size[d];
  for (int d = 1; d < 4; d++) strides[d - 1] = (cuuint64_t)s.stride[d] * 2;
  const cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, elem_strides[4] = {1, 1, 1, 1};
  const CUresult r =
      encode(map, p->dtype == FLASHC_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
             v->data, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fc_error(FLASHC_ERR_CUDA,
                    "%s: backend cuda-hopper: cuTensorMapEncodeTiled failed for %s (CUresult %d; dims "
                    "%llu %llu %llu %llu, byte strides %llu %llu %llu)",
                    op, name, (int)r, (unsigned long long)dims[0], (unsigned long long)dims[1],
                    (unsigned long long)dims[2], (unsigned long long)dims[3], (unsigned long long)strides[0],
                    (unsigned long long)strides[1], (unsigned long long)strides[2]);
  return FLASHC_OK;
}
