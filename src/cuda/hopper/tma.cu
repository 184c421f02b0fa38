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

/* The view's shape as it is, before fc_hp_fix_strides. */
static fc_hp_map_shape fc_hp_shape_raw(const fc_problem *p, const fc_view *v, bool is_q) {
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
  return s;
}

/* A dim of size 1 gets a stride that TMA accepts (its coordinate is always 0). */
static void fc_hp_fix_strides(fc_hp_map_shape *s) {
  int64_t widest = 8;
  for (int d = 1; d < 4; d++)
    if (s->size[d] > 1 && s->stride[d] > widest) widest = s->stride[d];
  for (int d = 1; d < 4; d++)
    if (s->size[d] == 1) s->stride[d] = (widest + 7) / 8 * 8;
}

fc_hp_map_shape fc_hp_shape(const fc_problem *p, const fc_view *v, bool is_q) {
  fc_hp_map_shape s = fc_hp_shape_raw(p, v, is_q);
  fc_hp_fix_strides(&s);
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

/* The map of the view's first `rows` rows (rows < 0: all of them, as fc_hp_encode_box). */
static flashc_status fc_hp_encode_rows(const fc_problem *p, const fc_view *v, bool is_q, const char *name, int box_rows,
                                       const char *op, int64_t rows, CUtensorMap *map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
  FC_CHECK(fc_hp_encoder(&encode));
  fc_hp_map_shape s = fc_hp_shape_raw(p, v, is_q);
  if (rows >= 0) s.size[1] = rows;
  fc_hp_fix_strides(&s);
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

flashc_status fc_hp_encode_box(const fc_problem *p, const fc_view *v, bool is_q, const char *name, int box_rows,
                               const char *op, CUtensorMap *map) {
  return fc_hp_encode_rows(p, v, is_q, name, box_rows, op, -1, map);
}

size_t fc_hp_seq_maps_bytes(const fc_problem *p) {
  return p->seqused_q || p->seqused_k ? (size_t)p->batch * 4 * sizeof(CUtensorMap) : 0;
}

flashc_status fc_hp_seq_maps(const fc_problem *p, int q_box, int k_box, const char *op, void *ws, size_t at,
                             int *at_int) {
  const size_t bytes = fc_hp_seq_maps_bytes(p);
  *at_int = 0;
  if (!bytes) return FLASHC_OK;
  if (at > INT32_MAX || at % 64 != 0)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: num_seqs %lld puts seqused's tensor maps past 2^31 bytes of the workspace on backend "
                    "cuda-hopper",
                    op, (long long)p->batch);
  void *h = NULL;
  FC_CHECK(fc_host_workspace(p, bytes + 64, &h)); /* malloc'd: 16-byte aligned, and a map is 64 */
  CUtensorMap *maps = (CUtensorMap *)(((uintptr_t)h + 63) & ~(uintptr_t)63);
  for (int64_t b = 0; b < p->batch; b++) {
    int64_t q0, sq, k0, sk;
    fc_seq_q(p, b, &q0, &sq);
    fc_seq_k(p, b, &k0, &sk);
    /* the packed tensors' rows up to the sequence's last used one: the kernels' coordinates stay as they are */
    const int64_t q_end = q0 + sq > 0 ? q0 + sq : 1, k_end = k0 + sk > 0 ? k0 + sk : 1;
    CUtensorMap *m = maps + 4 * b;
    FC_CHECK(fc_hp_encode_rows(p, &p->q, true, "q", q_box, op, q_end, &m[0]));
    FC_CHECK(fc_hp_encode_rows(p, &p->k, false, "k", k_box, op, k_end, &m[1]));
    FC_CHECK(fc_hp_encode_rows(p, &p->v, false, "v", k_box, op, k_end, &m[2]));
    const fc_view *x = p->is_backward ? &p->dout : &p->q;
    FC_CHECK(fc_hp_encode_rows(p, x, true, p->is_backward ? "dout" : "q", q_box, op, q_end, &m[3]));
  }
  /* From pageable memory: the copy has read the buffer when it returns (the next call may reuse it). */
  FC_CUDA_CHECK(cudaMemcpyAsync((char *)ws + at, maps, bytes, cudaMemcpyHostToDevice, fc_stream(p)));
  *at_int = (int)at;
  return FLASHC_OK;
}
