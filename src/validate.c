/*
 * validate.c — every check of the caller's input, before any data is touched, and the choice of backend.
 *
 * fc_prepare turns the public arguments of flashc_forward/flashc_backward into an fc_problem and picks the
 * backend that will run it. It reads only shapes, strides, params and the host cu_seqlens arrays (device ones are
 * not read: flashc.h, cu_seqlens_device); it never dereferences a tensor's data. Every failure names the operation and
 * the offending value.
 */
#include "internal.h"
#include "philox.h"

#include <stdio.h>
#include <string.h>

#define INVALID(...) fc_error(FLASHC_ERR_INVALID_ARGUMENT, __VA_ARGS__)

static const char *const dim_names[4] = {"batch", "seqlen", "heads", "head_dim"};

/* One tensor: non-null, known dtype, sizes >= 0 of which heads and head_dim >= 1, stride[3] == 1,
 * non-negative strides, the furthest element addressable without overflow, and data that is non-NULL and
 * aligned to the element size wherever the view has an element. *span is the offset of the last element,
 * or −1 for a view with none (batch or seqlen 0), whose data is never read and may be NULL. */
flashc_status fc_check_tensor(const char *op, const char *name, const flashc_tensor *t, int64_t *span) {
  if (!t) return INVALID("%s: %s is NULL", op, name);
  size_t es = flashc_dtype_size(t->dtype);
  if (es == 0) return INVALID("%s: %s.dtype %d is not a flashc_dtype", op, name, (int)t->dtype);
  bool empty = false;
  for (int d = 0; d < 4; d++) {
    if (t->size[d] < 0)
      return INVALID("%s: %s.size[%d] (%s) is %lld; sizes must be >= 0", op, name, d, dim_names[d],
                     (long long)t->size[d]);
    if (t->size[d] == 0 && d >= 2)
      return INVALID("%s: %s.size[%d] (%s) is 0; heads and head_dim must be >= 1 (batch and seqlen may be 0: an "
                     "empty call)",
                     op, name, d, dim_names[d]);
    empty |= t->size[d] == 0;
  }
  for (int d = 0; d < 4; d++) {
    if (t->stride[d] < 0)
      return INVALID("%s: %s.stride[%d] (%s) is %lld; strides must be >= 0", op, name, d, dim_names[d],
                     (long long)t->stride[d]);
  }
  if (t->stride[3] != 1 && t->size[3] > 1)
    return INVALID("%s: %s.stride[3] (head_dim) is %lld; it must be 1", op, name, (long long)t->stride[3]);
  *span = -1;
  if (empty) return FLASHC_OK; /* no element: nothing is addressed, so no offset can overflow */
  int64_t last = 0;            /* offset of the last element */
  for (int d = 0; d < 4; d++) {
    int64_t reach;
    if (!fc_mul_ok(t->size[d] - 1, t->stride[d], &reach) || !fc_add_ok(last, reach, &last))
      return INVALID("%s: %s's sizes and strides overflow a 64-bit offset", op, name);
  }
  int64_t bytes;
  if (!fc_add_ok(last, 1, &bytes) || !fc_mul_ok(bytes, (int64_t)es, &bytes) || (uint64_t)bytes > (uint64_t)SIZE_MAX)
    return INVALID("%s: %s spans more bytes than this machine can address", op, name);
  if (!t->data)
    return INVALID("%s: %s.data is NULL; only a view with no element (batch or seqlen 0) may have NULL data", op, name);
  /* Kernels load whole elements (and vectors of them): a misaligned element is undefined behaviour in C and a
   * fault on a GPU, so the contract is element-aligned data, checked here. */
  if ((uintptr_t)t->data % es != 0)
    return INVALID("%s: %s.data (%p) is not aligned to its %zu-byte %s elements; flashc needs element-aligned data", op,
                   name, t->data, es, flashc_dtype_name(t->dtype));
  *span = last;
  return FLASHC_OK;
}

/* An output must not alias itself (two indices, one address): with dims sorted by stride, each stride must
 * pass the reach of the dims inside it. Sufficient, and true of every layout a framework produces. For a
 * tensor that passed fc_check_tensor. */
flashc_status fc_check_no_self_overlap(const char *op, const char *name, const flashc_tensor *t) {
  for (int d = 0; d < 4; d++)
    if (t->size[d] == 0) return FLASHC_OK; /* no element, no alias */
  int order[4] = {0, 1, 2, 3};
  for (int a = 1; a < 4; a++) /* insertion sort by stride, size-1 dims first (they never alias) */
    for (int b = a; b > 0; b--) {
      const flashc_tensor *x = t;
      int i = order[b - 1], j = order[b];
      int64_t ki = x->size[i] == 1 ? -1 : x->stride[i], kj = x->size[j] == 1 ? -1 : x->stride[j];
      if (ki <= kj) break;
      order[b - 1] = j;
      order[b] = i;
    }
  int64_t reach = 0;
  for (int a = 0; a < 4; a++) {
    int d = order[a];
    if (t->size[d] == 1) continue;
    if (t->stride[d] <= reach)
      return INVALID("%s: output %s overlaps itself (stride[%d] = %lld for %s); outputs need distinct "
                     "addresses",
                     op, name, d, (long long)t->stride[d], dim_names[d]);
    reach += (t->size[d] - 1) * t->stride[d]; /* no overflow: bounded by the span checked above */
  }
  return FLASHC_OK;
}

/* Can tensors a and b (same element size) share an element? Their address sets are
 *   a.data + Σ i_k·sa_k   and   b.data + Σ j_k·sb_k.
 * With equal strides that nest (each stride passes the reach of the smaller ones, over both tensors'
 * sizes), a shared element means δ = b − a (in elements) = Σ c_k·s_k with −(nb_k−1) ≤ c_k ≤ na_k−1, and
 * nesting leaves two candidates for each c_k (floor or ceil of δ/s_k): a search of at most 2^4 paths.
 * This accepts what frameworks produce (slices of one packed dQKV buffer interleave without sharing) and
 * reports anything it cannot decide as overlapping. */
static bool share_element(const int64_t *na, const int64_t *nb, const int64_t *s, const int *order, int depth,
                          int64_t delta) {
  if (depth < 0) return delta == 0;
  int d = order[depth];
  int64_t st = s[d], lo = -(nb[d] - 1), hi = na[d] - 1;
  if (st == 0) return share_element(na, nb, s, order, depth - 1, delta); /* the dim moves no address */
  int64_t c0 = delta / st - (delta % st < 0);                            /* floor */
  for (int64_t c = c0; c <= c0 + 1; c++)
    if (c >= lo && c <= hi && share_element(na, nb, s, order, depth - 1, delta - c * st)) return true;
  return false;
}

/* Do the bytes from the first to the last element of two views intersect? (spans in elements, ≥ 0) */
static bool bytes_overlap(const void *a, int64_t span_a, size_t es_a, const void *b, int64_t span_b, size_t es_b) {
  uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  uintptr_t a1 = a0 + (uintptr_t)(span_a + 1) * es_a, b1 = b0 + (uintptr_t)(span_b + 1) * es_b;
  return a1 > b0 && b1 > a0;
}

/* For two non-empty views (spans ≥ 0). Views of different element sizes are judged by their byte ranges. */
static bool may_overlap(const flashc_tensor *a, int64_t span_a, const flashc_tensor *b, int64_t span_b) {
  size_t es = flashc_dtype_size(a->dtype);
  if (!bytes_overlap(a->data, span_a, es, b->data, span_b, flashc_dtype_size(b->dtype)))
    return false; /* disjoint byte ranges: the common case */
  uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
  if (flashc_dtype_size(b->dtype) != es || (a0 > b0 ? a0 - b0 : b0 - a0) % es != 0) return true;
  int64_t s[4], na[4], nb[4];
  int order[4], n = 0;
  for (int d = 0; d < 4; d++) {
    na[d] = a->size[d], nb[d] = b->size[d];
    /* The stride of a size-1 dim moves no address of its view, so the dim steps by the other view's stride
     * (0 when both have size 1). Taking a's stride there would let b's rows along that dim go unseen: an
     * output [1, 1, 1, d] with strides 0 inside a key tensor looked disjoint from it. */
    if (na[d] == 1)
      s[d] = nb[d] == 1 ? 0 : b->stride[d];
    else if (nb[d] == 1)
      s[d] = a->stride[d];
    else if (a->stride[d] != b->stride[d])
      return true;
    else
      s[d] = a->stride[d];
    order[n++] = d;
  }
  for (int x = 1; x < 4; x++) /* sort by stride, ascending */
    for (int y = x; y > 0 && s[order[y - 1]] > s[order[y]]; y--) {
      int t = order[y - 1];
      order[y - 1] = order[y];
      order[y] = t;
    }
  int64_t reach = 0; /* nesting over both tensors' index ranges */
  for (int x = 0; x < 4; x++) {
    int d = order[x];
    if (s[d] == 0) continue;
    if (s[d] <= reach) return true;
    int64_t n_max = na[d] > nb[d] ? na[d] : nb[d];
    if (!fc_mul_ok(n_max - 1, s[d], &n_max) || !fc_add_ok(reach, n_max, &reach)) return true;
  }
  int64_t delta = b0 >= a0 ? (int64_t)((b0 - a0) / es) : -(int64_t)((a0 - b0) / es);
  return share_element(na, nb, s, order, 3, delta);
}

static flashc_status same_size(const char *op, const char *a_name, const flashc_tensor *a, const char *b_name,
                               const flashc_tensor *b, int d) {
  if (a->size[d] != b->size[d])
    return INVALID("%s: %s.size[%d] (%s) is %lld but %s.size[%d] is %lld", op, b_name, d, dim_names[d],
                   (long long)b->size[d], a_name, d, (long long)a->size[d]);
  return FLASHC_OK;
}

static flashc_status check_cu_seqlens(const char *op, const char *name, const int32_t *cu, int64_t n, int64_t total,
                                      int64_t *longest) {
  if (cu[0] != 0) return INVALID("%s: %s[0] is %d; it must be 0", op, name, cu[0]);
  *longest = 0;
  for (int64_t s = 0; s < n; s++) {
    if (cu[s + 1] < cu[s])
      return INVALID("%s: %s decreases at index %lld (%d after %d)", op, name, (long long)s + 1, cu[s + 1], cu[s]);
    int64_t len = (int64_t)cu[s + 1] - cu[s];
    if (len > *longest) *longest = len;
  }
  if (cu[n] != total)
    return INVALID("%s: %s[%lld] is %d but the packed tensor has %lld rows", op, name, (long long)n, cu[n],
                   (long long)total);
  return FLASHC_OK;
}

/* seqused (NULL: every slot is used whole): 0 ≤ seqused[s] ≤ the slot's length. */
static flashc_status check_seqused(const char *op, const char *name, const int32_t *used, const int32_t *cu,
                                   int64_t n) {
  if (!used) return FLASHC_OK;
  for (int64_t s = 0; s < n; s++) {
    const int64_t slot = (int64_t)cu[s + 1] - cu[s];
    if (used[s] < 0 || used[s] > slot)
      return INVALID("%s: %s[%lld] is %d; it must be in [0, %lld], the rows of its cu_seqlens slot", op, name,
                     (long long)s, used[s], (long long)slot);
  }
  return FLASHC_OK;
}

/* Host offsets are read here: a device pointer given as host memory would crash the read (a build without CUDA
 * cannot tell, and reads on). */
static flashc_status check_host_pointer(const char *op, const char *name, const int32_t *cu) {
  if (fc_pointer_is_device(cu) == 1)
    return INVALID("%s: %s is device memory but params.cu_seqlens_device is 0; set it to 1 and give max_seqlen_q/k", op,
                   name);
  return FLASHC_OK;
}

/* Device offsets (flashc.h, cu_seqlens_device): their values are never read here. What can be checked without them
 * is: the caller's longest sequences fit the packed tensors, the offsets fit int32, and no option that needs the
 * offsets on the host (seqused, the debug dropout mask) is asked for. The caller promises the rest. */
static flashc_status check_device_cu_seqlens(const char *op, const flashc_params *pa, fc_problem *p, int is_backward) {
  const int64_t max[2] = {pa->max_seqlen_q, pa->max_seqlen_k}, total[2] = {p->total_q, p->total_k};
  const char *side[2] = {"q", "k"};
  for (int x = 0; x < 2; x++) {
    if (total[x] > INT32_MAX)
      return INVALID("%s: the packed %s has %lld rows; int32 cu_seqlens_%s address at most 2^31-1", op, side[x],
                     (long long)total[x], side[x]);
    if (max[x] < (total[x] > 0) || max[x] > total[x])
      return INVALID("%s: params.max_seqlen_%s is %lld; with device cu_seqlens it must be the longest sequence, in "
                     "[%d, %lld] (the packed %s has %lld rows)",
                     op, side[x], (long long)max[x], total[x] > 0, (long long)total[x], side[x], (long long)total[x]);
  }
  if (pa->seqused_q || pa->seqused_k)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: params.seqused_%s with device cu_seqlens (params.cu_seqlens_device 1) is not supported", op,
                    pa->seqused_q ? "q" : "k");
  if (pa->dropout_mask && !is_backward)
    return fc_error(FLASHC_ERR_UNSUPPORTED,
                    "%s: params.dropout_mask (the debug mask) with device cu_seqlens (params.cu_seqlens_device 1) is "
                    "not supported",
                    op);
  p->seqlen_q = max[0], p->seqlen_k = max[1];
  p->cu_seqlens_device = 1;
  return FLASHC_OK;
}

unsigned fc_problem_features(const fc_problem *p) {
  return (p->softcap != 0.0f ? FC_FEATURE_SOFTCAP : 0u) | (p->alibi_slopes ? FC_FEATURE_ALIBI : 0u) |
         (p->head_dim_v != p->head_dim ? FC_FEATURE_HEAD_DIM_V : 0u) |
         (p->seqused_q || p->seqused_k ? FC_FEATURE_SEQUSED : 0u) | (p->attn_mask ? FC_FEATURE_ATTN_MASK : 0u) |
         (p->dropout_p > 0.0f || p->dropout_mask ? FC_FEATURE_DROPOUT : 0u) |
         (p->cu_seqlens_device ? FC_FEATURE_CU_SEQLENS_DEVICE : 0u);
}

flashc_status fc_check_features(const char *op, const char *who, unsigned have, const fc_problem *p) {
  static const struct {
    unsigned bit;
    const char *what;
  } names[] = {
      {FC_FEATURE_SOFTCAP, "softcap"},
      {FC_FEATURE_ALIBI, "ALiBi (alibi_slopes)"},
      {FC_FEATURE_HEAD_DIM_V, "a head dim of V different from Q/K's"},
      {FC_FEATURE_SEQUSED, "seqused_q/seqused_k"},
      {FC_FEATURE_ATTN_MASK, "attn_mask (a bias or boolean mask)"},
      {FC_FEATURE_DROPOUT, "dropout (dropout_p, dropout_mask)"},
      {FC_FEATURE_CU_SEQLENS_DEVICE, "device cu_seqlens (params.cu_seqlens_device)"},
  };
  const unsigned missing = fc_problem_features(p) & ~have;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (missing & names[i].bit) {
      if (names[i].bit == FC_FEATURE_HEAD_DIM_V)
        return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: %s (v.size[3] %lld, q.size[3] %lld) is not supported on %s", op,
                        names[i].what, (long long)p->head_dim_v, (long long)p->head_dim, who);
      return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: %s is not supported on %s", op, names[i].what, who);
    }
  return FLASHC_OK;
}

flashc_status fc_check_disjoint(const char *op, const char *out_name, const flashc_tensor *out, int64_t out_span,
                                const char *in_name, const flashc_tensor *in, int64_t in_span) {
  if (out == in)
    return INVALID("%s: %s and %s are the same flashc_tensor; output %s needs memory of its own", op, out_name, in_name,
                   out_name);
  if (out_span < 0 || in_span < 0) return FLASHC_OK; /* an empty view has no element to share */
  if (may_overlap(out, out_span, in, in_span))
    return INVALID("%s: output %s shares memory with %s; outputs need memory of their own", op, out_name, in_name);
  return FLASHC_OK;
}

static fc_view view_of(const flashc_tensor *t, bool varlen) {
  fc_view v = {t->data, varlen ? 0 : t->stride[0], t->stride[1], t->stride[2]};
  return v;
}

/* Does backend `b` accept problem `p` whose tensors live on `device`? On refusal, the last-error message
 * says why. */
static flashc_status backend_accepts(const fc_backend *b, const fc_problem *p, const char *op, int on_device) {
  char why[160];
  if (b->usable && !b->usable(why, sizeof why))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: backend %s is not usable here: %s", op, b->name, why);
  if (p->is_backward && !b->backward)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: backend %s has no backward pass", op, b->name);
  if (!(b->dtypes & (1u << p->dtype)))
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: dtype %s is not supported on backend %s", op,
                    flashc_dtype_name(p->dtype), b->name);
  if (p->head_dim > b->max_head_dim)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: head_dim %lld exceeds %d on backend %s", op, (long long)p->head_dim,
                    b->max_head_dim, b->name);
  if (p->head_dim < b->min_head_dim)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: head_dim %lld is below %d on backend %s", op, (long long)p->head_dim,
                    b->min_head_dim, b->name);
  char who[64];
  snprintf(who, sizeof who, "backend %s", b->name);
  FC_CHECK(fc_check_features(op, who, b->features, p));
  const int max_v = b->max_head_dim_v ? b->max_head_dim_v : b->max_head_dim;
  if (p->head_dim_v > max_v)
    return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: head_dim_v (v.size[3]) %lld exceeds %d on backend %s", op,
                    (long long)p->head_dim_v, max_v, b->name);
  if (on_device >= 0 && on_device != (b->device == FLASHC_DEVICE_CUDA))
    return INVALID("%s: the tensors are in %s memory but backend %s needs %s memory", op,
                   on_device ? "CUDA device" : "host", b->name, b->device == FLASHC_DEVICE_CUDA ? "device" : "host");
  /* An empty problem runs no kernel (api.c writes its results), so a kernel's own limits do not apply. */
  if (b->supports && !fc_problem_is_empty(p)) FC_CHECK(b->supports(p));
  return FLASHC_OK;
}

/* Where the tensors live: 1 device, 0 host, -1 unknown; mixed is an error. */
static flashc_status locate(const char *op, const void *const *ptrs, const char *const *names, int n, int *where) {
  *where = -1;
  for (int i = 0; i < n; i++) {
    if (!ptrs[i]) continue;
    int w = fc_pointer_is_device(ptrs[i]);
    if (w < 0) continue;
    if (*where >= 0 && w != *where)
      return INVALID("%s: %s is in %s memory but the tensors before it are not", op, names[i], w ? "device" : "host");
    *where = w;
  }
  return FLASHC_OK;
}

flashc_status fc_params_read(const char *op, const flashc_params *params, flashc_params *out) {
  *out = flashc_params_default();
  if (!params) return FLASHC_OK;
  const size_t size = params->struct_size;
  if (size < sizeof(size_t))
    return INVALID("%s: params.struct_size is %zu: build params with flashc_params_default()", op, size);
  if (size > sizeof(flashc_params))
    return INVALID("%s: params.struct_size is %zu, more than this library's flashc_params (%zu bytes): the caller "
                   "was built against a newer flashc.h than this library (%s)",
                   op, size, sizeof(flashc_params), flashc_version_string());
  /* the caller's fields over the defaults; fields past its struct keep theirs */
  memcpy((char *)out + sizeof(size_t), (const char *)params + sizeof(size_t), size - sizeof(size_t));
  out->struct_size = sizeof(flashc_params);
  return FLASHC_OK;
}

/* ---- attn_mask and dbias ---------------------------------------------------------------------------- */
static const char *const mask_dim_names[4] = {"batch", "heads_q", "seqlen_q", "seqlen_k"};

/* One of attn_mask / dbias, of logical sizes n = [batch, heads_q, seqlen_q, seqlen_k] and element size es: strides
 * ≥ 0, the furthest element addressable, a pointer that is non-NULL and aligned where there is an element. *span:
 * the offset of the last element, −1 when there is none. */
static flashc_status check_mask_view(const char *op, const char *name, const void *data, const int64_t stride[4],
                                     const int64_t n[4], size_t es, int64_t *span) {
  *span = -1;
  int64_t last = 0;
  for (int d = 0; d < 4; d++)
    if (stride[d] < 0)
      return INVALID("%s: %s_stride[%d] (%s) is %lld; strides must be >= 0 (0 broadcasts)", op, name, d,
                     mask_dim_names[d], (long long)stride[d]);
  /* No element: never read or written, so no offset can overflow (whichever dim is empty, as for tensors). */
  for (int d = 0; d < 4; d++)
    if (n[d] == 0) return FLASHC_OK;
  for (int d = 0; d < 4; d++) {
    int64_t reach;
    if (!fc_mul_ok(n[d] - 1, stride[d], &reach) || !fc_add_ok(last, reach, &last))
      return INVALID("%s: %s's strides overflow a 64-bit offset over [%lld, %lld, %lld, %lld]", op, name,
                     (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3]);
  }
  int64_t bytes;
  if (!fc_add_ok(last, 1, &bytes) || !fc_mul_ok(bytes, (int64_t)es, &bytes) || (uint64_t)bytes > (uint64_t)SIZE_MAX)
    return INVALID("%s: %s spans more bytes than this machine can address", op, name);
  if (!data) return INVALID("%s: %s is NULL", op, name);
  if ((uintptr_t)data % es != 0)
    return INVALID("%s: %s (%p) is not aligned to its %zu-byte elements", op, name, data, es);
  *span = last;
  return FLASHC_OK;
}

/* attn_mask (forward and backward) and dbias (backward): their flags, strides and memory; dbias, an output, must
 * not alias itself (over the dimensions it does not sum) nor any tensor, lse or the mask. */
static flashc_status check_attn_mask(const char *op, const flashc_params *pa, fc_problem *p, bool varlen,
                                     const flashc_tensor *const *ts, const char *const *names, const int64_t *span,
                                     int nt, const float *lse, int64_t lse_elems) {
  if (!pa->attn_mask) {
    if (p->is_backward && pa->dbias)
      return INVALID("%s: params.dbias is set but params.attn_mask is NULL; dbias is the gradient of a float mask", op);
    return FLASHC_OK;
  }
  if (pa->attn_mask_is_bool != 0 && pa->attn_mask_is_bool != 1)
    return INVALID("%s: params.attn_mask_is_bool is %d; use 0 (a bias of the call's dtype) or 1 (uint8)", op,
                   pa->attn_mask_is_bool);
  if (varlen)
    return INVALID("%s: params.attn_mask is set with cu_seqlens; varlen calls do not take an attn_mask (pad the batch "
                   "and use a dense call)",
                   op);
  const int64_t n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  const size_t mask_es = pa->attn_mask_is_bool ? 1 : flashc_dtype_size(p->dtype), es = flashc_dtype_size(p->dtype);
  int64_t mask_span, dbias_span;
  FC_CHECK(check_mask_view(op, "params.attn_mask", pa->attn_mask, pa->attn_mask_stride, n, mask_es, &mask_span));
  p->attn_mask = pa->attn_mask;
  p->attn_mask_is_bool = pa->attn_mask_is_bool;
  for (int d = 0; d < 4; d++) p->attn_mask_stride[d] = pa->attn_mask_stride[d];
  if (!p->is_backward || !pa->dbias) return FLASHC_OK; /* the forward ignores dbias: one params serves both calls */
  if (pa->attn_mask_is_bool)
    return INVALID("%s: params.dbias is set but params.attn_mask is boolean; only a float bias has a gradient", op);
  FC_CHECK(check_mask_view(op, "params.dbias", pa->dbias, pa->dbias_stride, n, es, &dbias_span));
  if (dbias_span >= 0) {
    /* No two summed-apart elements at one address: the dimensions with a stride, sorted by it, nest. */
    int order[4], m = 0;
    for (int d = 0; d < 4; d++)
      if (pa->dbias_stride[d] != 0 && n[d] > 1) order[m++] = d;
    for (int a = 1; a < m; a++)
      for (int b = a; b > 0 && pa->dbias_stride[order[b - 1]] > pa->dbias_stride[order[b]]; b--) {
        const int t = order[b - 1];
        order[b - 1] = order[b];
        order[b] = t;
      }
    int64_t reach = 0;
    for (int a = 0; a < m; a++) {
      const int d = order[a];
      if (pa->dbias_stride[d] <= reach)
        return INVALID("%s: output params.dbias overlaps itself (dbias_stride[%d] = %lld for %s); use a stride of 0 "
                       "to sum over a dimension",
                       op, d, (long long)pa->dbias_stride[d], mask_dim_names[d]);
      reach += (n[d] - 1) * pa->dbias_stride[d];
    }
    for (int j = 0; j < nt; j++)
      if (span[j] >= 0 &&
          bytes_overlap(pa->dbias, dbias_span, es, ts[j]->data, span[j], flashc_dtype_size(ts[j]->dtype)))
        return INVALID("%s: output params.dbias shares memory with %s; outputs need memory of their own", op, names[j]);
    const bool on_lse =
        lse && lse_elems > 0 && bytes_overlap(pa->dbias, dbias_span, es, lse, lse_elems - 1, sizeof(float));
    if (on_lse || (mask_span >= 0 && bytes_overlap(pa->dbias, dbias_span, es, pa->attn_mask, mask_span, mask_es)))
      return INVALID("%s: output params.dbias shares memory with %s; outputs need memory of their own", op,
                     on_lse ? "lse" : "params.attn_mask");
  }
  p->dbias = pa->dbias;
  for (int d = 0; d < 4; d++) p->dbias_stride[d] = pa->dbias_stride[d];
  return FLASHC_OK;
}

/* Dropout: p = 0 or 2^−17 ≤ p < 1 − 2^−17; the debug mask (forward only) within its size limit and apart from every
 * other argument. */
static flashc_status check_dropout(const char *op, const flashc_params *pa, fc_problem *p,
                                   const flashc_tensor *const *ts, const char *const *names, const int64_t *span,
                                   int nt, const float *lse, int64_t lse_elems) {
  if (!(pa->dropout_p >= 0.0f && pa->dropout_p < 1.0f))
    return INVALID("%s: params.dropout_p is %g; it must be 0 (off) or in (0, 1)", op, (double)pa->dropout_p);
  /* The rule draws 16 bits per weight (philox.h): a p whose t16 rounds to 0 or 2^16 would drop no weight, or
   * all of them, yet scale the kept ones by 1/(1 − p); refused rather than run as another p. */
  const uint32_t t16 = fc_dropout_threshold(pa->dropout_p);
  if (pa->dropout_p > 0.0f && (t16 == 0u || t16 >= 65536u))
    return INVALID("%s: params.dropout_p is %.9g; dropout draws 16 bits per weight, so a nonzero p must be in "
                   "[2^-17, 1 - 2^-17) (it is quantised to a multiple of 2^-16)",
                   op, (double)pa->dropout_p);
  p->dropout_p = pa->dropout_p;
  p->dropout_threshold = t16;
  p->dropout_seed = pa->dropout_seed;
  p->dropout_offset = pa->dropout_offset;
  if (p->is_backward || !pa->dropout_mask) return FLASHC_OK; /* the backward ignores it: one params serves both */
  /* [batch, heads_q, seqlen_q, seqlen_k]: each factor < 2^31 (validated), so the products are checked one by one. */
  const int64_t limit = (int64_t)1 << 28, n[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
  int64_t elems = 1;
  for (int d = 0; d < 4; d++)
    if (!fc_mul_ok(elems, n[d], &elems) || elems > limit) {
      elems = -1;
      break;
    }
  if (elems < 0)
    return INVALID("%s: params.dropout_mask of [%lld, %lld, %lld, %lld] elements exceeds 2^28; it is a debug output "
                   "for small calls",
                   op, (long long)n[0], (long long)n[1], (long long)n[2], (long long)n[3]);
  if (elems > 0) {
    for (int j = 0; j < nt; j++)
      if (span[j] >= 0 &&
          bytes_overlap(pa->dropout_mask, elems - 1, 1, ts[j]->data, span[j], flashc_dtype_size(ts[j]->dtype)))
        return INVALID("%s: output params.dropout_mask shares memory with %s; outputs need memory of their own", op,
                       names[j]);
    if (lse && lse_elems > 0 && bytes_overlap(pa->dropout_mask, elems - 1, 1, lse, lse_elems - 1, sizeof(float)))
      return INVALID("%s: output params.dropout_mask shares memory with lse; outputs need memory of their own", op);
    if (p->attn_mask) {
      const int64_t m[4] = {p->batch, p->heads_q, p->seqlen_q, p->seqlen_k};
      int64_t mask_span = 0;
      for (int d = 0; d < 4; d++) mask_span += (m[d] - 1) * p->attn_mask_stride[d]; /* checked: no overflow */
      if (bytes_overlap(pa->dropout_mask, elems - 1, 1, p->attn_mask, mask_span,
                        p->attn_mask_is_bool ? 1 : flashc_dtype_size(p->dtype)))
        return INVALID("%s: output params.dropout_mask shares memory with params.attn_mask; outputs need memory of "
                       "their own",
                       op);
    }
  }
  p->dropout_mask = pa->dropout_mask;
  return FLASHC_OK;
}

flashc_status fc_prepare(const char *op, flashc_handle h, const flashc_params *params, const flashc_tensor *q,
                         const flashc_tensor *k, const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                         const flashc_tensor *dout, const flashc_tensor *dq, const flashc_tensor *dk,
                         const flashc_tensor *dv, int is_backward, fc_problem *p, const fc_backend **chosen) {
  if (!h) return INVALID("%s: handle is NULL", op);
  flashc_params whole;
  FC_CHECK(fc_params_read(op, params, &whole));
  const flashc_params *pa = &whole;
  memset(p, 0, sizeof *p);
  p->is_backward = is_backward;

  /* Each tensor alone. */
  const flashc_tensor *ts[8] = {q, k, v, o, dout, dq, dk, dv};
  const char *names[8] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
  int nt = is_backward ? 8 : 4;
  int64_t span[8];
  for (int i = 0; i < nt; i++) FC_CHECK(fc_check_tensor(op, names[i], ts[i], &span[i]));

  /* One dtype for all. */
  for (int i = 1; i < nt; i++)
    if (ts[i]->dtype != q->dtype)
      return INVALID("%s: %s.dtype is %s but q.dtype is %s; all tensors share one dtype", op, names[i],
                     flashc_dtype_name(ts[i]->dtype), flashc_dtype_name(q->dtype));

  /* Shapes: q-like tensors match q, kv-like match k, except along head_dim: o and dout take v's (V's head dim may
   * differ from Q/K's), dq and dk q's. */
  for (int d = 0; d < 4; d++) {
    if (d != 1 && d != 2) FC_CHECK(same_size(op, "q", q, "k", k, d));
    FC_CHECK(same_size(op, d == 3 ? "v" : "q", d == 3 ? v : q, "o", o, d));
    if (d != 3) FC_CHECK(same_size(op, "k", k, "v", v, d));
    if (is_backward) {
      FC_CHECK(same_size(op, d == 3 ? "v" : "q", d == 3 ? v : q, "dout", dout, d));
      FC_CHECK(same_size(op, "q", q, "dq", dq, d));
      FC_CHECK(same_size(op, "k", k, "dk", dk, d));
      FC_CHECK(same_size(op, "v", v, "dv", dv, d));
    }
  }
  int64_t hq = q->size[2], hkv = k->size[2];
  if (hq % hkv != 0)
    return INVALID("%s: heads_q %lld is not a multiple of heads_kv %lld", op, (long long)hq, (long long)hkv);

  /* Params. */
  if (!isfinite(pa->scale)) return INVALID("%s: params.scale is not finite", op);
  if (pa->causal != 0 && pa->causal != 1) return INVALID("%s: params.causal is %d; use 0 or 1", op, pa->causal);
  if (pa->align != FLASHC_ALIGN_BOTTOM_RIGHT && pa->align != FLASHC_ALIGN_TOP_LEFT)
    return INVALID("%s: params.align %d is not a flashc_causal_align", op, (int)pa->align);
  if (pa->deterministic != 0 && pa->deterministic != 1)
    return INVALID("%s: params.deterministic is %d; use 0 or 1", op, pa->deterministic);

  bool varlen = pa->cu_seqlens_q || pa->cu_seqlens_k;
  if (pa->cu_seqlens_device != 0 && pa->cu_seqlens_device != 1)
    return INVALID("%s: params.cu_seqlens_device is %d; use 0 (host offsets) or 1 (device offsets)", op,
                   pa->cu_seqlens_device);
  if (pa->cu_seqlens_device && !varlen)
    return INVALID("%s: params.cu_seqlens_device is 1 but cu_seqlens_q/k are NULL; it describes varlen offsets", op);
  p->dtype = q->dtype;
  p->heads_q = hq;
  p->heads_kv = hkv;
  p->head_dim = q->size[3];
  p->head_dim_v = v->size[3];
  if ((pa->seqused_q || pa->seqused_k) && !varlen)
    return INVALID("%s: params.seqused_%s is set without cu_seqlens; seqused needs varlen", op,
                   pa->seqused_q ? "q" : "k");
  if (varlen) {
    if (!pa->cu_seqlens_q || !pa->cu_seqlens_k)
      return INVALID("%s: params.cu_seqlens_%s is NULL but cu_seqlens_%s is set; varlen needs both", op,
                     pa->cu_seqlens_q ? "k" : "q", pa->cu_seqlens_q ? "q" : "k");
    if (pa->num_seqs < 1 || pa->num_seqs > INT32_MAX)
      return INVALID("%s: params.num_seqs is %lld; varlen needs 1 .. 2^31-1 sequences", op, (long long)pa->num_seqs);
    if (q->size[0] != 1)
      return INVALID("%s: varlen tensors are packed with batch 1, but q.size[0] is %lld", op, (long long)q->size[0]);
    p->batch = pa->num_seqs;
    p->total_q = q->size[1];
    p->total_k = k->size[1];
    p->cu_seqlens_q = pa->cu_seqlens_q;
    p->cu_seqlens_k = pa->cu_seqlens_k;
    if (pa->cu_seqlens_device) {
      FC_CHECK(check_device_cu_seqlens(op, pa, p, is_backward));
    } else {
      FC_CHECK(check_host_pointer(op, "params.cu_seqlens_q", pa->cu_seqlens_q));
      FC_CHECK(check_host_pointer(op, "params.cu_seqlens_k", pa->cu_seqlens_k));
      FC_CHECK(check_cu_seqlens(op, "params.cu_seqlens_q", pa->cu_seqlens_q, pa->num_seqs, p->total_q, &p->seqlen_q));
      FC_CHECK(check_cu_seqlens(op, "params.cu_seqlens_k", pa->cu_seqlens_k, pa->num_seqs, p->total_k, &p->seqlen_k));
      FC_CHECK(check_seqused(op, "params.seqused_q", pa->seqused_q, pa->cu_seqlens_q, pa->num_seqs));
      FC_CHECK(check_seqused(op, "params.seqused_k", pa->seqused_k, pa->cu_seqlens_k, pa->num_seqs));
      p->seqused_q = pa->seqused_q;
      p->seqused_k = pa->seqused_k;
    }
  } else {
    p->batch = q->size[0];
    p->seqlen_q = q->size[1];
    p->seqlen_k = k->size[1];
    p->total_q = p->batch * p->seqlen_q; /* no overflow: q's span was checked */
    p->total_k = p->batch * p->seqlen_k;
  }
  int64_t lse_elems;
  if (!fc_mul_ok(p->total_q, hq, &lse_elems) || (uint64_t)lse_elems > SIZE_MAX / sizeof(float))
    return INVALID("%s: lse would need more than 2^63 bytes", op);
  if (lse_elems > 0) { /* with no query row there is no lse to read or write: NULL is fine */
    if (is_backward && !lse) return INVALID("%s: lse is NULL; backward needs the forward's lse", op);
    if ((uintptr_t)lse % sizeof(float) != 0)
      return INVALID("%s: lse (%p) is not aligned to 4-byte floats; flashc needs element-aligned data", op,
                     (const void *)lse);
  }
  if (p->seqlen_q > INT32_MAX || p->seqlen_k > INT32_MAX)
    return INVALID("%s: a sequence of %lld rows exceeds 2^31-1", op,
                   (long long)(p->seqlen_q > p->seqlen_k ? p->seqlen_q : p->seqlen_k));

  p->scale = pa->scale != 0.0f ? pa->scale : (float)(1.0 / sqrt((double)p->head_dim));
  p->window_left = pa->window_left < 0 ? -1 : pa->window_left;
  p->window_right = pa->window_right < 0 ? -1 : pa->window_right;
  /* A window wider than both sequences changes nothing; capping it keeps i + shift ± window inside int64
   * in fc_key_range and fc_visible whatever the caller passes (INT64_MAX included). */
  const int64_t window_cap = (int64_t)1 << 40;
  if (p->window_left > window_cap) p->window_left = window_cap;
  if (p->window_right > window_cap) p->window_right = window_cap;
  if (pa->causal) p->window_right = 0; /* causal: no key right of the diagonal */
  p->bottom_right = pa->align == FLASHC_ALIGN_BOTTOM_RIGHT;
  p->deterministic = pa->deterministic;
  if (pa->num_splits < 0)
    return INVALID("%s: params.num_splits is %d; it must be 0 (the backend chooses), 1 (no split) or more", op,
                   pa->num_splits);
  p->num_splits = pa->num_splits;
  /* softcap·tanh(s/softcap) needs a finite positive cap; 0 (the default) means none. */
  if (!(pa->softcap >= 0.0f) || !isfinite(pa->softcap))
    return INVALID("%s: params.softcap is %g; it must be 0 (off) or finite and > 0", op, (double)pa->softcap);
  p->softcap = pa->softcap;
  if (pa->alibi_slopes) {
    /* The slopes may be device memory: only the pointer and the stride are checked here, never the values. */
    if ((uintptr_t)pa->alibi_slopes % sizeof(float) != 0)
      return INVALID("%s: params.alibi_slopes (%p) is not aligned to 4-byte floats", op,
                     (const void *)pa->alibi_slopes);
    int64_t reach;
    if (pa->alibi_stride_batch < 0 || !fc_mul_ok(p->batch > 0 ? p->batch - 1 : 0, pa->alibi_stride_batch, &reach) ||
        !fc_add_ok(reach, hq, &reach))
      return INVALID("%s: params.alibi_stride_batch is %lld; it must be 0 (one slope per head) or >= 0 with "
                     "[batch, heads_q] slopes addressable",
                     op, (long long)pa->alibi_stride_batch);
    if (pa->alibi_stride_batch != 0 && pa->alibi_stride_batch < hq)
      return INVALID("%s: params.alibi_stride_batch is %lld, less than heads_q %lld: the slopes of two sequences "
                     "would overlap",
                     op, (long long)pa->alibi_stride_batch, (long long)hq);
    p->alibi_slopes = pa->alibi_slopes;
    p->alibi_stride_batch = pa->alibi_stride_batch;
  }

  /* Outputs (o in forward; dq, dk, dv in backward): no self-aliasing, and not the memory of any other tensor,
   * nor the same struct. lse is an output of the forward (checked against q, k, v, o) and an input of the
   * backward (dq, dk, dv must not overlap it); being a bare pointer, it is judged by its byte range. */
  const int out_first = is_backward ? 5 : 3;
  for (int i = out_first; i < nt; i++) {
    FC_CHECK(fc_check_no_self_overlap(op, names[i], ts[i]));
    for (int j = 0; j < nt; j++)
      if (j != i) FC_CHECK(fc_check_disjoint(op, names[i], ts[i], span[i], names[j], ts[j], span[j]));
  }
  if (lse && lse_elems > 0)
    for (int j = is_backward ? out_first : 0; j < nt; j++)
      if (span[j] >= 0 &&
          bytes_overlap(lse, lse_elems - 1, sizeof(float), ts[j]->data, span[j], flashc_dtype_size(ts[j]->dtype)))
        return is_backward
                   ? INVALID("%s: output %s shares memory with lse; outputs need memory of their own", op, names[j])
                   : INVALID("%s: output lse shares memory with %s; outputs need memory of their own", op, names[j]);
  FC_CHECK(check_attn_mask(op, pa, p, varlen, ts, names, span, nt, lse, lse_elems));
  FC_CHECK(check_dropout(op, pa, p, ts, names, span, nt, lse, lse_elems));

  p->q = view_of(q, varlen);
  p->k = view_of(k, varlen);
  p->v = view_of(v, varlen);
  p->o = view_of(o, varlen);
  if (is_backward) {
    p->dout = view_of(dout, varlen);
    p->dq = view_of(dq, varlen);
    p->dk = view_of(dk, varlen);
    p->dv = view_of(dv, varlen);
  }
  p->lse = (float *)lse;
  p->threads = h->threads > 0 ? h->threads : fc_cpu_count();
  p->stream = h->stream;
  p->handle = h;

  /* A fixed backend that lacks a feature of the call says so before where the data lives is judged (its ALiBi
   * slopes in host memory beside device tensors would otherwise be reported instead). */
  if (h->fixed) {
    char who[64];
    snprintf(who, sizeof who, "backend %s", h->fixed->name);
    FC_CHECK(fc_check_features(op, who, h->fixed->features, p));
  }

  /* Where the data lives decides which backends can touch it. */
  const void *ptrs[15];
  const char *pnames[15];
  int np = 0;
  for (int i = 0; i < nt; i++) {
    ptrs[np] = ts[i]->data;
    pnames[np++] = names[i];
  }
  ptrs[np] = lse;
  pnames[np++] = "lse";
  ptrs[np] = pa->alibi_slopes;
  pnames[np++] = "params.alibi_slopes";
  ptrs[np] = p->attn_mask;
  pnames[np++] = "params.attn_mask";
  ptrs[np] = p->dbias;
  pnames[np++] = "params.dbias";
  ptrs[np] = p->dropout_mask;
  pnames[np++] = "params.dropout_mask";
  if (p->cu_seqlens_device) { /* where the tensors live, as the other device pointers */
    ptrs[np] = p->cu_seqlens_q;
    pnames[np++] = "params.cu_seqlens_q";
    ptrs[np] = p->cu_seqlens_k;
    pnames[np++] = "params.cu_seqlens_k";
  }
  int on_device;
  FC_CHECK(locate(op, ptrs, pnames, np, &on_device));

  if (h->fixed) {
    FC_CHECK(backend_accepts(h->fixed, p, op, on_device));
    *chosen = h->fixed;
    return FLASHC_OK;
  }
  /* auto: the best backend that accepts the call; if none does, say why each refused. */
  char reasons[400] = "";
  size_t used = 0;
  for (int i = 0; i < fc_backend_total; i++) {
    const fc_backend *b = fc_backends[i];
    if (!b) continue;
    if (backend_accepts(b, p, op, on_device) == FLASHC_OK) {
      fc_clear_error();
      *chosen = b;
      return FLASHC_OK;
    }
    const char *msg = flashc_last_error();
    size_t skip = strlen(op) + 2; /* drop the repeated "op: " */
    if (strncmp(msg, op, strlen(op)) != 0) skip = 0;
    if (used < sizeof reasons)
      used += (size_t)snprintf(reasons + used, sizeof reasons - used, "%s%s", used ? "; " : "", msg + skip);
  }
  return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: no backend accepts this call (%s)", op, reasons);
}

/* For the other entry points (kvcache.c): where their pointers live, as locate() above. */
flashc_status fc_locate(const char *op, const void *const *ptrs, const char *const *names, int n, int *where) {
  return locate(op, ptrs, names, n, where);
}
