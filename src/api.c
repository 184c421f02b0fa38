/* api.c — the public entry points: version, tensors, params, handles, forward and backward. */
#include "internal.h"
#include "philox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int flashc_version(void) { return FLASHC_VERSION; }

#define FC_STR2(x) #x
#define FC_STR(x)  FC_STR2(x)
const char *flashc_version_string(void) {
  return FC_STR(FLASHC_VERSION_MAJOR) "." FC_STR(FLASHC_VERSION_MINOR) "." FC_STR(FLASHC_VERSION_PATCH);
}

const char *flashc_dtype_name(flashc_dtype dtype) {
  switch (dtype) {
  case FLASHC_F32: return "f32";
  case FLASHC_F16: return "f16";
  case FLASHC_BF16: return "bf16";
  case FLASHC_F64: return "f64";
  }
  return NULL;
}

size_t flashc_dtype_size(flashc_dtype dtype) {
  switch (dtype) {
  case FLASHC_F32: return 4;
  case FLASHC_F16:
  case FLASHC_BF16: return 2;
  case FLASHC_F64: return 8;
  }
  return 0;
}

flashc_tensor flashc_tensor_bshd(void *data, flashc_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                 int64_t head_dim) {
  /* Absurd sizes must not overflow here: saturate, and validation names the overflow. */
  int64_t hd, shd;
  if (!fc_mul_ok(heads, head_dim, &hd)) hd = INT64_MAX;
  if (!fc_mul_ok(seqlen, hd, &shd)) shd = INT64_MAX;
  flashc_tensor t = {data, dtype, {batch, seqlen, heads, head_dim}, {shd, hd, head_dim, 1}};
  return t;
}

flashc_tensor flashc_tensor_bhsd(void *data, flashc_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                 int64_t head_dim) {
  int64_t sd, hsd;
  if (!fc_mul_ok(seqlen, head_dim, &sd)) sd = INT64_MAX;
  if (!fc_mul_ok(heads, sd, &hsd)) hsd = INT64_MAX;
  flashc_tensor t = {data, dtype, {batch, seqlen, heads, head_dim}, {hsd, head_dim, sd, 1}};
  return t;
}

/* ---- backends -------------------------------------------------------------------------------------- */
int flashc_backend_count(void) {
  int n = 0;
  for (int i = 0; i < fc_backend_total; i++) n += fc_backends[i] != NULL;
  return n;
}

flashc_status flashc_backend_query(int i, flashc_backend_info *out) {
  if (!out) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_backend_get: info is NULL");
  const size_t size = out->struct_size;
  if (size < sizeof(size_t) || size > sizeof(flashc_backend_info))
    return fc_error(FLASHC_ERR_INVALID_ARGUMENT,
                    "flashc_backend_get: info->struct_size is %zu; it must be sizeof(flashc_backend_info) of the "
                    "caller's flashc.h (this library's: %zu; flashc_backend_get sets it)",
                    size, sizeof(flashc_backend_info));
  flashc_backend_info whole, *info = &whole;
  int seen = 0;
  for (int j = 0; j < fc_backend_total; j++) {
    const fc_backend *b = fc_backends[j];
    if (!b) continue;
    if (seen++ != i) continue;
    static _Thread_local char why[160];
    why[0] = '\0';
    info->name = b->name;
    info->summary = b->summary;
    info->device = b->device;
    info->has_backward = b->backward != NULL;
    info->dtypes = b->dtypes;
    info->min_head_dim = b->min_head_dim;
    info->max_head_dim = b->max_head_dim;
    info->usable = b->usable ? b->usable(why, sizeof why) : 1;
    info->why_unusable = info->usable ? "" : why;
    memcpy((char *)out + sizeof(size_t), (const char *)info + sizeof(size_t), size - sizeof(size_t));
    return FLASHC_OK;
  }
  return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_backend_get: index %d is outside [0, %d)", i,
                  flashc_backend_count());
}

const fc_backend *fc_backend_find(const char *name) {
  for (int i = 0; i < fc_backend_total; i++)
    if (fc_backends[i] && strcmp(fc_backends[i]->name, name) == 0) return fc_backends[i];
  return NULL;
}

/* ---- handle ---------------------------------------------------------------------------------------- */
flashc_status flashc_create(flashc_handle *handle, const char *backend) {
  if (!handle) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_create: handle is NULL");
  *handle = NULL;
  if (!backend) backend = "auto";
  const fc_backend *fixed = NULL;
  if (strcmp(backend, "auto") != 0) {
    fixed = fc_backend_find(backend);
    if (!fixed) {
      char names[400] = "";
      size_t used = 0;
      for (int i = 0; i < fc_backend_total && used < sizeof names; i++)
        if (fc_backends[i]) used += (size_t)snprintf(names + used, sizeof names - used, ", %s", fc_backends[i]->name);
      return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_create: unknown backend '%.64s' (known: auto%s)", backend,
                      names);
    }
    char why[160];
    if (fixed->usable && !fixed->usable(why, sizeof why))
      return fc_error(FLASHC_ERR_UNSUPPORTED, "flashc_create: backend %s is not usable here: %s", fixed->name, why);
  }
  struct flashc_handle_s *h = calloc(1, sizeof *h);
  if (!h) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "flashc_create: %zu bytes", sizeof *h);
  snprintf(h->backend, sizeof h->backend, "%s", fixed ? fixed->name : "auto");
  h->fixed = fixed;
  h->last_backend = "";
  *handle = h;
  return FLASHC_OK;
}

void fc_device_workspace_free(struct flashc_handle_s *h); /* src/cuda/common/runtime.cu, or the stub below */

flashc_status flashc_destroy(flashc_handle h) {
  if (!h) return FLASHC_OK;
  free(h->host_ws);
  fc_device_workspace_free(h);
  free(h);
  return FLASHC_OK;
}

flashc_status flashc_set_threads(flashc_handle h, int threads) {
  if (!h) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_set_threads: handle is NULL");
  if (threads < 0) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_set_threads: threads is %d", threads);
  h->threads = threads;
  return FLASHC_OK;
}

flashc_status flashc_set_stream(flashc_handle h, void *stream) {
  if (!h) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_set_stream: handle is NULL");
  if (stream != h->stream) FC_CHECK(fc_device_stream_switch(h, h->stream, stream));
  h->stream = stream;
  return FLASHC_OK;
}

const char *flashc_handle_backend(flashc_handle h) { return h ? h->backend : ""; }
const char *flashc_handle_last_backend(flashc_handle h) { return h ? h->last_backend : ""; }

flashc_status fc_host_workspace(const fc_problem *p, size_t bytes, void **ptr) {
  struct flashc_handle_s *h = p->handle;
  if (bytes > h->host_ws_size) {
    void *m = malloc(bytes);
    if (!m) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "host workspace of %zu bytes could not be allocated", bytes);
    free(h->host_ws);
    h->host_ws = m;
    h->host_ws_size = bytes;
  }
  *ptr = h->host_ws;
  return FLASHC_OK;
}

/* ---- empty problems --------------------------------------------------------------------------------- */
/* A problem with no query row or no key row runs no kernel: its results are known (flashc.h, "Empty inputs").
 * Forward: every query row sees no key, so o = 0 and lse = −inf (nothing at all when there is no query row).
 * Backward: dq = 0 when there is no key, dk = dv = 0 when there is no query. Written here once for every
 * backend, into the memory the chosen backend works in. */

/* Zero one output view: a q-like (keys 0) or k-like (keys 1) tensor of p with rows of `dim` elements, row by row
 * (strides honoured). */
static flashc_status zero_view(const fc_problem *p, const fc_backend *b, const fc_view *v, int keys, int64_t dim) {
  const bool varlen = p->cu_seqlens_q != NULL;
  int64_t n[3] = {varlen ? 1 : p->batch,
                  keys ? (varlen ? p->total_k : p->seqlen_k) : (varlen ? p->total_q : p->seqlen_q),
                  keys ? p->heads_kv : p->heads_q};
  int64_t st[3] = {v->stride_b, v->stride_s, v->stride_h};
  if (n[0] == 0 || n[1] == 0) return FLASHC_OK; /* no element (its data may be NULL); heads are >= 1 */
  if (b->device == FLASHC_DEVICE_CUDA) return fc_device_zero_rows(p, v->data, n, st, dim);
  size_t es = flashc_dtype_size(p->dtype), row_bytes = (size_t)dim * es;
  for (int64_t i0 = 0; i0 < n[0]; i0++) /* all-zero bits are +0 in every dtype */
    for (int64_t i1 = 0; i1 < n[1]; i1++)
      for (int64_t i2 = 0; i2 < n[2]; i2++)
        memset((char *)v->data + (i0 * st[0] + i1 * st[1] + i2 * st[2]) * (int64_t)es, 0, row_bytes);
  return FLASHC_OK;
}

static flashc_status write_empty_results(const fc_problem *p, const fc_backend *b) {
  if (p->is_backward) {
    if (p->total_k == 0) FC_CHECK(zero_view(p, b, &p->dq, 0, p->head_dim));
    if (p->total_q == 0) {
      FC_CHECK(zero_view(p, b, &p->dk, 1, p->head_dim));
      FC_CHECK(zero_view(p, b, &p->dv, 1, p->head_dim_v));
    }
    return FLASHC_OK;
  }
  FC_CHECK(zero_view(p, b, &p->o, 0, p->head_dim_v));
  const int64_t n_lse = p->total_q * p->heads_q; /* 0, or every row of a call without keys */
  if (!p->lse || n_lse == 0) return FLASHC_OK;
  if (b->device == FLASHC_DEVICE_CUDA) return fc_device_fill_f32(p, p->lse, n_lse, -INFINITY);
  for (int64_t i = 0; i < n_lse; i++) p->lse[i] = -INFINITY;
  return FLASHC_OK;
}

/* ---- rows past seqused ------------------------------------------------------------------------------ */
/* With seqused_q/k a backend sees only the used rows of each slot (fc_seq_q/k); the others' results are known
 * (flashc.h): query rows past seqused_q get o = 0, lse = −inf (forward) and dq = 0 (backward), key rows past
 * seqused_k get dk = dv = 0. Written here once for every backend that implements seqused, after its kernels (on the
 * same stream), where the tensors live. */
static void zero_rows(const fc_problem *p, const fc_view *v, int64_t first, int64_t last, int64_t heads, int64_t dim) {
  const size_t es = flashc_dtype_size(p->dtype);
  for (int64_t r = first; r < last; r++)
    for (int64_t h = 0; h < heads; h++)
      memset((char *)v->data + (r * v->stride_s + h * v->stride_h) * (int64_t)es, 0, (size_t)dim * es);
}

static flashc_status write_unused_rows(const fc_problem *p, const fc_backend *b) {
  if (!p->seqused_q && !p->seqused_k) return FLASHC_OK;
  if (!(b->features & FC_FEATURE_SEQUSED))
    return fc_error(FLASHC_ERR_INTERNAL, "seqused reached backend %s, which does not implement it", b->name);
  if (b->device == FLASHC_DEVICE_CUDA) return fc_device_unused_rows(p);
  for (int64_t s = 0; s < p->batch; s++) {
    int64_t start, used;
    const int64_t q_end = p->cu_seqlens_q[s + 1], k_end = p->cu_seqlens_k[s + 1];
    fc_seq_q(p, s, &start, &used);
    if (!p->is_backward) {
      zero_rows(p, &p->o, start + used, q_end, p->heads_q, p->head_dim_v);
      if (p->lse)
        for (int64_t h = 0; h < p->heads_q; h++)
          for (int64_t r = start + used; r < q_end; r++) p->lse[h * p->total_q + r] = -INFINITY;
      continue;
    }
    zero_rows(p, &p->dq, start + used, q_end, p->heads_q, p->head_dim);
    fc_seq_k(p, s, &start, &used);
    zero_rows(p, &p->dk, start + used, k_end, p->heads_kv, p->head_dim);
    zero_rows(p, &p->dv, start + used, k_end, p->heads_kv, p->head_dim_v);
  }
  return FLASHC_OK;
}

/* ---- the dropout mask (debug) ------------------------------------------------------------------------- */
/* keep_ij of every element (flashc.h, "Dropout") into [batch, heads_q, seqlen_q, seqlen_k], 0 past a varlen
 * sequence's lengths. Written here from the definition, once for every backend, not by the kernels: what they used
 * is checked against it by the tests (they recompute o from this mask). CUDA backends: the same rule in a kernel
 * (common/fill.cu). */
static flashc_status write_dropout_mask(const fc_problem *p, const fc_backend *b) {
  if (!p->dropout_mask) return FLASHC_OK;
  if (b->device == FLASHC_DEVICE_CUDA) return fc_device_dropout_mask(p);
  const int64_t SQ = p->seqlen_q, SK = p->seqlen_k;
  for (int64_t s = 0; s < p->batch; s++) {
    int64_t start, sq, sk;
    fc_seq_q(p, s, &start, &sq);
    fc_seq_k(p, s, &start, &sk);
    for (int64_t h = 0; h < p->heads_q; h++) {
      uint8_t *plane = p->dropout_mask + (s * p->heads_q + h) * SQ * SK;
      const uint64_t bh = (uint64_t)(s * p->heads_q + h);
      memset(plane, 0, (size_t)(SQ * SK));
      const uint64_t nb = fc_dropout_row_blocks(sk);
      for (int64_t i = 0; i < sq; i++)
        for (int64_t x = 0; x < (int64_t)nb; x++) { /* one Philox call per 8 keys of a row */
          const uint32_t bits = fc_dropout_block_bits(
              fc_dropout_block(p->dropout_seed, p->dropout_offset, bh, (uint64_t)i * nb + (uint64_t)x),
              p->dropout_threshold);
          for (int64_t j = x * FC_DROPOUT_KEYS; j < (x + 1) * FC_DROPOUT_KEYS && j < sk; j++)
            plane[i * SK + j] = (uint8_t)(bits >> (j % FC_DROPOUT_KEYS) & 1u);
        }
    }
  }
  return FLASHC_OK;
}

/* ---- attention ------------------------------------------------------------------------------------- */
flashc_status flashc_forward(flashc_handle h, const flashc_params *params, const flashc_tensor *q,
                             const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *o, float *lse) {
  fc_problem p;
  const fc_backend *b;
  FC_CHECK(fc_prepare("flashc_forward", h, params, q, k, v, o, lse, NULL, NULL, NULL, NULL, 0, &p, &b));
  flashc_status s = fc_problem_is_empty(&p) ? write_empty_results(&p, b) : b->forward(&p);
  if (s == FLASHC_OK && !fc_problem_is_empty(&p)) s = write_unused_rows(&p, b);
  if (s == FLASHC_OK) s = write_dropout_mask(&p, b);
  if (s == FLASHC_OK) h->last_backend = b->name;
  return s;
}

flashc_status flashc_backward(flashc_handle h, const flashc_params *params, const flashc_tensor *q,
                              const flashc_tensor *k, const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                              const flashc_tensor *dout, flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv) {
  fc_problem p;
  const fc_backend *b;
  FC_CHECK(fc_prepare("flashc_backward", h, params, q, k, v, o, lse, dout, dq, dk, dv, 1, &p, &b));
  flashc_status s = fc_problem_is_empty(&p) ? write_empty_results(&p, b) : b->backward(&p);
  if (s == FLASHC_OK && !fc_problem_is_empty(&p)) s = write_unused_rows(&p, b);
  if (s == FLASHC_OK) h->last_backend = b->name;
  return s;
}
