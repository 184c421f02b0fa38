/* ladder/fa1.cu — rung 2 of the CUDA ladder: FlashAttention-1's loop order (Dao et al. 2022, Algorithm 1).
 *
 * The K/V blocks are the outer loop: one launch per key block j. Inside a launch every query block i of every
 * (sequence, head) reads its running state (O_i, m_i, l_i) from global memory, folds in block j and writes it
 * back, so the state makes a round trip to global memory once per key block:
 *
 *   S_ij = scale·Q_i·K_jᵀ                    (masked entries −inf)
 *   m̃ = rowmax(S_ij) ; P̃ = exp(S_ij − m̃) ; l̃ = rowsum(P̃)
 *   m_new = max(m_i, m̃) ; l_new = e^(m_i − m_new)·l_i + e^(m̃ − m_new)·l̃
 *   O_i ← (l_i·e^(m_i − m_new)·O_i + e^(m̃ − m_new)·P̃·V_j) / l_new
 *
 * O stays normalised after every step (as in the paper). A last kernel copies O into the caller's tensor and
 * writes lse = m + log l. The state is fp32 scratch in the workspace: O [row, head, d], m and l [row, head].
 * Forward only: the paper's backward is rung 3's (ladder/fa2_fp32_bwd.cu) with another loop order.
 *
 * Tiles: Br = Bc = 32 rows, 128 threads, any head_dim (loops over d at run time). Shared memory: Q_i, K_j, V_j
 * [32][d] each, S [32][33] (the odd stride keeps the per-row reductions of 32 threads on 32 banks).
 */
#include "ladder/naive_args.cuh"

enum { FA1_BR = 32, FA1_BC = 32, FA1_THREADS = 128, FA1_LDS = FA1_BC + 1 };

static size_t fa1_smem_bytes(int d) {
  return ((size_t)(FA1_BR + 2 * FA1_BC) * d + FA1_BR * FA1_LDS + 2 * FA1_BR) * sizeof(float);
}

/* O = 0, m = −inf, l = 0 for every (packed row, head). */
__global__ void __launch_bounds__(FA1_THREADS) fa1_init_kernel(int64_t rows, int d, float *O, float *m, float *l) {
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * d; e += (int64_t)gridDim.x * blockDim.x) {
    O[e] = 0.0f;
    if (e < rows) {
      m[e] = -INFINITY;
      l[e] = 0.0f;
    }
  }
}

/* Folds key block j into the state of query block (sequence, head, i): blockIdx.x = (s·heads_q + h)·nqb + qb. */
__global__ void __launch_bounds__(FA1_THREADS)
    fa1_block_kernel(fc_cc_args a, int32_t j, int32_t nqb, float *O, float *mbuf, float *lbuf) {
  extern __shared__ float4 fc_smem[];
  const int d = a.head_dim, tid = threadIdx.x;
  float *Qs = (float *)fc_smem, *Ks = Qs + FA1_BR * d, *Vs = Ks + FA1_BC * d, *S = Vs + FA1_BC * d;
  float *coef_o = S + FA1_BR * FA1_LDS, *coef_pv = coef_o + FA1_BR;

  const int32_t qb = (int32_t)(blockIdx.x % nqb);
  const int64_t sh = blockIdx.x / nqb;
  const int h = (int)(sh % a.heads_q), s = (int)(sh / a.heads_q), hk = h / a.group;
  const fc_cc_seq q = fc_cc_seq_get(a, s);
  const int32_t i0 = qb * FA1_BR, c0 = j * FA1_BC;
  if (i0 >= q.sq || c0 >= q.sk) return;
  const int32_t rows = min(FA1_BR, q.sq - i0), cols = min(FA1_BC, q.sk - c0);
  int32_t rlo, rhi; /* rows of the whole sequence that see a key of this block */
  fc_cc_query_range(a, q.shift, c0, c0 + cols, q.sq, &rlo, &rhi);
  if (max(rlo, i0) >= min(rhi, i0 + rows)) return; /* block j is invisible to all of Q_i: state unchanged */

  /* Q_i, K_j, V_j → shared memory; rows past the sequence are zero. */
  for (int e = tid; e < FA1_BR * d; e += FA1_THREADS) {
    int r = e / d, c = e % d;
    Qs[e] = r < rows ? a.q.data[fc_cc_off(a.q, s, q.q_start, i0 + r, h) + c] : 0.0f;
  }
  for (int e = tid; e < FA1_BC * d; e += FA1_THREADS) {
    int r = e / d, c = e % d;
    bool ok = r < cols;
    Ks[e] = ok ? a.k.data[fc_cc_off(a.k, s, q.k_start, c0 + r, hk) + c] : 0.0f;
    Vs[e] = ok ? a.v.data[fc_cc_off(a.v, s, q.k_start, c0 + r, hk) + c] : 0.0f;
  }
  __syncthreads(); /* Q_i, K_j, V_j complete before anyone reads them */

  /* S_ij = scale·Q_i·K_jᵀ, masked entries −inf. */
  for (int e = tid; e < FA1_BR * FA1_BC; e += FA1_THREADS) {
    int r = e / FA1_BC, c = e % FA1_BC;
    int32_t lo, hi;
    fc_cc_key_range(a, q.shift, i0 + r, q.sk, &lo, &hi);
    float x = -INFINITY;
    if (r < rows && c < cols && c0 + c >= lo && c0 + c < hi) {
      float acc = 0.0f;
      for (int k = 0; k < d; k++) acc = fmaf(Qs[r * d + k], Ks[c * d + k], acc);
      x = acc * a.scale;
    }
    S[r * FA1_LDS + c] = x;
  }
  __syncthreads(); /* S complete before the row statistics */

  /* m̃, P̃ = exp(S − m̃), l̃; the new m, l; and the two coefficients of the O update. */
  if (tid < rows) {
    float *Sr = S + tid * FA1_LDS;
    int64_t idx = (q.q_row0 + i0 + tid) * a.heads_q + h;
    float mt = -INFINITY;
    for (int c = 0; c < FA1_BC; c++) mt = fc_fmax_nan(mt, Sr[c]); /* NaN stays: not "sees nothing" */
    if (mt == -INFINITY) { /* this row sees nothing of block j: keep its state, and P̃ = 0 (not exp(−inf + inf)) */
      for (int c = 0; c < FA1_BC; c++) Sr[c] = 0.0f;
      coef_o[tid] = 1.0f;
      coef_pv[tid] = 0.0f;
    } else {
      float lt = 0.0f;
      for (int c = 0; c < FA1_BC; c++) {
        Sr[c] = expf(Sr[c] - mt);
        lt += Sr[c];
      }
      float m_old = mbuf[idx], l_old = lbuf[idx], m_new = fc_fmax_nan(m_old, mt);
      float e_old = expf(m_old - m_new), e_new = expf(mt - m_new); /* m_old = −inf gives e_old = 0 */
      float l_new = e_old * l_old + e_new * lt;
      coef_o[tid] = e_old * l_old / l_new;
      coef_pv[tid] = e_new / l_new;
      mbuf[idx] = m_new;
      lbuf[idx] = l_new;
    }
  }
  __syncthreads(); /* P̃ and the coefficients complete before the O update */

  /* O_i ← coef_o·O_i + coef_pv·P̃·V_j */
  for (int e = tid; e < rows * d; e += FA1_THREADS) {
    int r = e / d, c = e % d;
    float acc = 0.0f;
    for (int k = 0; k < FA1_BC; k++) acc = fmaf(S[r * FA1_LDS + k], Vs[k * d + c], acc);
    float *o = O + ((q.q_row0 + i0 + r) * a.heads_q + h) * d + c;
    *o = coef_o[r] * *o + coef_pv[r] * acc;
  }
}

/* o = O (already normalised), lse = m + log l, or −inf for a row that saw no key (m = −inf: then O is still 0;
 * a NaN m or l gives a NaN lse). */
__global__ void __launch_bounds__(FA1_THREADS)
    fa1_finish_kernel(fc_cc_args a, const float *O, const float *mbuf, const float *lbuf) {
  const int d = a.head_dim;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < a.total_q * a.heads_q * d;
       e += (int64_t)gridDim.x * blockDim.x) {
    int c = (int)(e % d);
    int64_t r = e / d, prow = r / a.heads_q;
    int h = (int)(r % a.heads_q), s = fc_cc_seq_of_q_row(a, prow);
    fc_cc_seq q = fc_cc_seq_get(a, s);
    int64_t i = prow - q.q_row0;
    a.o.data[fc_cc_off(a.o, s, q.q_start, i, h) + c] = O[e];
    if (c == 0 && a.lse)
      a.lse[fc_cc_lse_idx(a, s, q, h, i)] = mbuf[r] != -INFINITY ? mbuf[r] + logf(lbuf[r]) : -INFINITY;
  }
}

/* ---- host -------------------------------------------------------------------------------------------- */

static bool fa1_usable(char *why, size_t len) { return fc_cuda_usable_sm(80, why, len); }

static flashc_status fa1_supports(const fc_problem *p) {
  FC_CHECK(fc_cc_supports_common(p, "cuda-fa1"));
  int64_t blocks = fc_cdiv(p->seqlen_q, FA1_BR) * p->heads_q * p->batch;
  if (blocks > INT32_MAX)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "cuda-fa1: %lld query blocks exceed one grid (2^31-1)", (long long)blocks);
  fc_device_props props;
  FC_CHECK(fc_device_get_props(&props));
  if (fa1_smem_bytes((int)p->head_dim) > props.smem_per_block_optin)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "cuda-fa1: head_dim %lld needs %zu bytes of shared memory; device has %zu",
                    (long long)p->head_dim, fa1_smem_bytes((int)p->head_dim), props.smem_per_block_optin);
  return FLASHC_OK;
}

static int fa1_grid_stride_blocks(int64_t work) {
  int64_t b = fc_cdiv(work, FA1_THREADS);
  return (int)(b < 1 ? 1 : b > 8192 ? 8192 : b);
}

static flashc_status fa1_forward(const fc_problem *p) {
  const int64_t rows = p->total_q * p->heads_q, d = p->head_dim;
  size_t cu_bytes = fc_cc_seqlens_bytes(p), o_bytes = fc_cc_align((size_t)(rows * d) * sizeof(float)),
         ml_bytes = fc_cc_align((size_t)rows * sizeof(float));
  void *ws;
  FC_CHECK(fc_device_workspace(p, cu_bytes + o_bytes + 2 * ml_bytes, &ws));
  fc_cc_args a;
  FC_CHECK(fc_cc_args_make(p, ws, &a));
  float *O = (float *)((char *)ws + cu_bytes), *m = (float *)((char *)O + o_bytes),
        *l = (float *)((char *)m + ml_bytes);
  cudaStream_t st = fc_stream(p);

  size_t smem = fa1_smem_bytes((int)d);
  FC_CUDA_CHECK(cudaFuncSetAttribute(fa1_block_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  fa1_init_kernel<<<fa1_grid_stride_blocks(rows * d), FA1_THREADS, 0, st>>>(rows, (int)d, O, m, l);
  FC_LAUNCH_CHECK("fa1_init_kernel");
  const int32_t nqb = (int32_t)fc_cdiv(p->seqlen_q, FA1_BR), nkb = (int32_t)fc_cdiv(p->seqlen_k, FA1_BC);
  const unsigned blocks = (unsigned)(nqb * p->heads_q * p->batch);
  for (int32_t j = 0; j < nkb; j++) { /* the outer loop of Algorithm 1, in launch order on one stream */
    fa1_block_kernel<<<blocks, FA1_THREADS, smem, st>>>(a, j, nqb, O, m, l);
    FC_LAUNCH_CHECK("fa1_block_kernel");
  }
  fa1_finish_kernel<<<fa1_grid_stride_blocks(rows * d), FA1_THREADS, 0, st>>>(a, O, m, l);
  FC_LAUNCH_CHECK("fa1_finish_kernel");
  return FLASHC_OK;
}

extern "C" const fc_backend fc_backend_cuda_fa1 = {
    "cuda-fa1",
    "FlashAttention-1 loop order: key/value blocks outer, O, m, l rescaled in global memory (forward only)",
    FLASHC_DEVICE_CUDA,
    1u << FLASHC_F32,
    1,
    256,
    fa1_usable,
    fa1_supports,
    fa1_forward,
    NULL,
    0,    /* features: the plain call only (validate.c refuses the others) */
    0,    /* max_head_dim_v */
    NULL, /* forward_kvcache */
};
