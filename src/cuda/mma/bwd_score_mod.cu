/* mma/bwd_score_mod.cu — cuda-mma backward with softcap, ALiBi, dropout and attn_mask (SCORE_MOD, mma/score_mod.cuh):
 * the passes around the kernels that dbias needs, and a boolean mask's tiles. The kernels themselves, mma/bwd.cu's plan
 * and launches built with SCORE_MOD, are instantiated one dtype a file (mma/bwd_score_mod_f16.cu, _bf16.cu), so that
 * they compile beside the plain ones and beside each other: in one file they were the longest compile of the build. */
#include "mma/bwd_launch.cuh"

/* ---- dbias (flashc.h): dS of every (b, h, i, j), in the call's dtype, summed over the dims whose stride is 0 ----
 * The dK/dV kernel computes each element's dS once (fc_bwd_fa2_p_mod) and writes it:
 *   - nothing summed: straight into dbias, after a pass that zeroes it (the elements no CTA computes: keys the
 *     causal mask or a window hides, rows past the blocks that see a key);
 *   - else: added in fp32 (atomics) into a zeroed workspace, of dbias's own extents (1 along a summed dim) or, with
 *     params.deterministic, of every element [batch, heads_q, seqlen_q, seqlen_k] (one add onto 0 each: exact),
 *     which the last pass sums over the summed dims in a fixed order, in fp64: the atomics' order would otherwise
 *     change the sums' rounding run to run. The last pass writes dbias with its strides in the call's dtype. */
typedef struct fc_dbias_sum {
  int64_t kept[4];  /* dbias's extents: n[d], or 1 where summed */
  int64_t reach[4]; /* summed per element: n[d] where the workspace holds every element of a summed dim, else 1 */
  int64_t ws_st[4]; /* the workspace's strides (0 along a summed dim of dbias's extents) */
  int64_t out_st[4];
  const float *ws;
  void *out;
} fc_dbias_sum;

/* dbias dim d is a sum: a stride of 0 over more than one element. */
static bool fc_dbias_summed(const fc_problem *p, int d) {
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  return n[d] > 1 && p->dbias_stride[d] == 0;
}
static bool fc_dbias_any_sum(const fc_problem *p) {
  return fc_dbias_summed(p, 0) || fc_dbias_summed(p, 1) || fc_dbias_summed(p, 2) || fc_dbias_summed(p, 3);
}

size_t fc_mma_dbias_bytes(const fc_problem *p) {
  if (!p->dbias || !fc_dbias_any_sum(p)) return 0;
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  size_t e = 1;
  for (int d = 0; d < 4; d++) e *= (size_t)(p->deterministic || !fc_dbias_summed(p, d) ? n[d] : 1);
  return (e * sizeof(float) + 255) / 256 * 256;
}

/* Zero of every element of dbias [n0, n1, n2, n3] with its strides. */
__global__ void __launch_bounds__(256)
    fc_mma_dbias_zero_kernel(uint16_t *x, int64_t n1, int64_t n2, int64_t n3, int64_t s0, int64_t s1, int64_t s2,
                             int64_t s3, int64_t total) {
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i3 = e % n3, i2 = e / n3 % n2, i1 = e / n3 / n2 % n1, i0 = e / n3 / n2 / n1;
    x[i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3] = 0;
  }
}

/* One thread per element of dbias: its sum over the workspace (fp64, dims in order b, h, i, j), in the dtype. */
template <typename T> __global__ void __launch_bounds__(256) fc_mma_dbias_sum_kernel(const fc_dbias_sum a) {
  const int64_t total = a.kept[0] * a.kept[1] * a.kept[2] * a.kept[3];
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t o[4] = {e / a.kept[3] / a.kept[2] / a.kept[1], e / a.kept[3] / a.kept[2] % a.kept[1],
                          e / a.kept[3] % a.kept[2], e % a.kept[3]};
    int64_t base = 0, out = 0;
    for (int d = 0; d < 4; d++) base += o[d] * a.ws_st[d], out += o[d] * a.out_st[d];
    double sum = 0.0;
    for (int64_t r0 = 0; r0 < a.reach[0]; r0++)
      for (int64_t r1 = 0; r1 < a.reach[1]; r1++)
        for (int64_t r2 = 0; r2 < a.reach[2]; r2++) {
          const float *row = a.ws + base + r0 * a.ws_st[0] + r1 * a.ws_st[1] + r2 * a.ws_st[2];
          for (int64_t r3 = 0; r3 < a.reach[3]; r3++) sum += (double)row[r3 * a.ws_st[3]];
        }
    ((uint16_t *)a.out)[out] = fc_from_float<T>((float)sum);
  }
}

static unsigned fc_dbias_blocks(int64_t n) { return (unsigned)(n / 256 < 4096 ? fc_cdiv(n, 256) : 4096); }

/* Before the kernels: where they write dS (md->dbias*), zeroed. ws: fc_mma_dbias_bytes of workspace. */
flashc_status fc_mma_dbias_begin(const fc_problem *p, fc_score_mod *md, void *ws) {
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  const int64_t total = n[0] * n[1] * n[2] * n[3];
  if (!p->dbias || total == 0) return FLASHC_OK;
  if (!fc_dbias_any_sum(p)) {
    md->dbias = p->dbias, md->dbias_f32 = 0;
    for (int d = 0; d < 4; d++) md->dbias_st[d] = p->dbias_stride[d];
    const int64_t *st = p->dbias_stride;
    fc_mma_dbias_zero_kernel<<<fc_dbias_blocks(total), 256, 0, fc_stream(p)>>>((uint16_t *)p->dbias, n[1], n[2], n[3],
                                                                               st[0], st[1], st[2], st[3], total);
    FC_LAUNCH_CHECK("fc_mma_dbias_zero_kernel");
    return FLASHC_OK;
  }
  md->dbias = ws, md->dbias_f32 = 1;
  int64_t inner = 1;
  for (int d = 3; d >= 0; d--) { /* compact over the workspace's extents; 0 along a dim it does not keep */
    const bool kept = p->deterministic || !fc_dbias_summed(p, d);
    md->dbias_st[d] = kept ? inner : 0;
    inner *= kept ? n[d] : 1;
  }
  FC_CUDA_CHECK(cudaMemsetAsync(ws, 0, (size_t)inner * sizeof(float), fc_stream(p)));
  return FLASHC_OK;
}

/* After the kernels: the workspace summed into dbias (nothing to do where the kernels wrote dbias itself). */
template <typename T> static flashc_status fc_mma_dbias_end(const fc_problem *p, const fc_score_mod *md) {
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  if (!md->dbias || !md->dbias_f32) return FLASHC_OK;
  fc_dbias_sum a;
  for (int d = 0; d < 4; d++) {
    const bool summed = fc_dbias_summed(p, d);
    a.kept[d] = summed ? 1 : n[d];
    a.reach[d] = summed && p->deterministic ? n[d] : 1;
    a.ws_st[d] = md->dbias_st[d];
    a.out_st[d] = p->dbias_stride[d];
  }
  a.ws = (const float *)md->dbias, a.out = p->dbias;
  const int64_t total = a.kept[0] * a.kept[1] * a.kept[2] * a.kept[3];
  fc_mma_dbias_sum_kernel<T><<<fc_dbias_blocks(total), 256, 0, fc_stream(p)>>>(a);
  FC_LAUNCH_CHECK("fc_mma_dbias_sum_kernel");
  return FLASHC_OK;
}

flashc_status fc_mma_dbias_finish(const fc_problem *p, const fc_score_mod *md) {
  return p->dtype == FLASHC_F16 ? fc_mma_dbias_end<__half>(p, md) : fc_mma_dbias_end<__nv_bfloat16>(p, md);
}

/* ---- a boolean attn_mask's tiles (common/mask_tiles.cuh) ----------------------------------------------------
 * One set at the dK/dV kernel's Br × Bc (its key block's column of query blocks: col_range and the classes), and,
 * where the plan runs the deterministic dQ pass, a second at that pass's FC_BWD_DQ_BR × Bc (its query block's row
 * of key blocks: row_range and the classes). The two shapes differ at every head dim (d64: 128 × 128 and 128 × 64,
 * d256: 64 × 64 and 128 × 32), and a set at a shape that divides both would have each kernel combine several classes
 * per block. */
static size_t fc_round256_bwd(size_t n) { return (n + 255) / 256 * 256; }

size_t fc_mma_bwd_tiles_bytes(const fc_problem *p, const fc_mma_bwd_plan *pl) {
  if (!p->attn_mask || !p->attn_mask_is_bool) return 0;
  const fc_mma_bwd_fa2_tile t = fc_mma_bwd_fa2_tiles[pl->dim];
  const size_t dkdv = fc_round256_bwd(fc_mask_tiles_bytes(p, t.br, t.bc));
  return dkdv + (pl->det_dq ? fc_mask_tiles_bytes(p, FC_BWD_DQ_BR, fc_mma_bwd_dq_bc[pl->dim]) : 0);
}

template <typename T>
static flashc_status fc_mma_bwd_score_mod_as(const fc_problem *p, const fc_mma_bwd_args *a0, const fc_mma_bwd_plan *pl,
                                             void *dbias_ws, void *tiles_ws, fc_mma_bwd_score_mod_fn kernels) {
  fc_mma_bwd_args a = *a0;
  fc_mask_tiles dq_tiles;
  bool dq_own = false;
  if (tiles_ws) { /* the SCORE_MOD kernels are the fa2 family's (fc_mma_bwd_plan_of never picks base for them) */
    const fc_mma_bwd_fa2_tile t = fc_mma_bwd_fa2_tiles[pl->dim];
    FC_CHECK(fc_mask_tiles_build(p, t.br, t.bc, tiles_ws, &a.mod.tiles));
    if (pl->det_dq) {
      void *at = (uint8_t *)tiles_ws + fc_round256_bwd(fc_mask_tiles_bytes(p, t.br, t.bc));
      FC_CHECK(fc_mask_tiles_build(p, FC_BWD_DQ_BR, fc_mma_bwd_dq_bc[pl->dim], at, &dq_tiles));
      dq_own = true;
    }
  }
  FC_CHECK(fc_mma_dbias_begin(p, &a.mod, dbias_ws));
  FC_CHECK(kernels(p, &a, pl, dq_own ? &dq_tiles : nullptr));
  return fc_mma_dbias_end<T>(p, &a.mod);
}

flashc_status fc_mma_bwd_score_mod(const fc_problem *p, const fc_mma_bwd_args *a, const fc_mma_bwd_plan *pl,
                                   void *dbias_ws, void *tiles_ws) {
  if (p->dtype == FLASHC_F16)
    return fc_mma_bwd_score_mod_as<__half>(p, a, pl, dbias_ws, tiles_ws, fc_mma_bwd_score_mod_f16);
  return fc_mma_bwd_score_mod_as<__nv_bfloat16>(p, a, pl, dbias_ws, tiles_ws, fc_mma_bwd_score_mod_bf16);
}
