/*
 * internal.h — what every backend sees: the validated problem, the backend table entry, errors, workspace.
 *
 * Data flows one way: caller → api.c → validate.c (builds an fc_problem, checks everything) → the backend
 * table (backends.c) → a backend's forward/backward. A backend receives only validated problems; it may
 * still refuse one with FLASHC_ERR_UNSUPPORTED through its `supports` hook, before anything is written.
 */
#ifndef FLASHC_INTERNAL_H
#define FLASHC_INTERNAL_H

#include "flashc.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------------------------------------- */
/* Sets this thread's last-error message (printf format) and returns `status`, so that
 *   return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_forward: q is NULL");
 * reads as one statement. */
flashc_status fc_error(flashc_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fc_clear_error(void);

/* Carry a non-OK status up. */
#define FC_CHECK(call)                                                                                                 \
  do {                                                                                                                 \
    flashc_status fc_check_status_ = (call);                                                                           \
    if (fc_check_status_ != FLASHC_OK) return fc_check_status_;                                                        \
  } while (0)

/* ---- the validated problem ------------------------------------------------------------------------- */
/* One tensor after validation: base pointer and strides in elements for batch, seq and head (the head_dim
 * stride is 1). For varlen problems stride_b is 0 and a sequence starts at row cu_seqlens[s]. */
typedef struct fc_view {
  void *data;
  int64_t stride_b, stride_s, stride_h;
} fc_view;

typedef struct fc_problem {
  flashc_dtype dtype;
  int64_t batch;    /* number of sequences (num_seqs for varlen) */
  int64_t seqlen_q; /* dense: the seqlen; varlen: the longest sequence */
  int64_t seqlen_k;
  int64_t total_q; /* rows of q over all sequences (batch·seqlen_q when dense) */
  int64_t total_k;
  int64_t heads_q, heads_kv, head_dim;
  int64_t head_dim_v; /* of v, o, dout, dv; head_dim is q's and k's */
  float scale;        /* resolved: never 0 */
  /* Score modifiers (flashc.h), applied to scale·q·k in this order before the mask: softcap (0: off) and
   * ALiBi, slope alibi_slopes[s·alibi_stride_batch + h] (NULL: off), see fc_alibi_slope. */
  float softcap;
  const float *alibi_slopes;
  int64_t alibi_stride_batch;
  /* NULL, or host arrays of batch: sequence s uses the first seqused[s] rows of its cu_seqlens slot. fc_seq_q and
   * fc_seq_k return those lengths, so a backend sees only the used rows; api.c writes the results of the others. */
  const int32_t *seqused_q, *seqused_k;
  /* attn_mask (flashc.h; dense calls only): NULL, or element (s, h, i, j) at attn_mask + fc_attn_mask_offset; a bias
   * of p's dtype added after the modifiers (attn_mask_is_bool 0), or uint8 with 0 removing the key (1). dbias
   * (backward, NULL: not wanted; float masks only): dL/ds, summed over the dimensions whose dbias_stride is 0. */
  const void *attn_mask;
  int attn_mask_is_bool;
  int64_t attn_mask_stride[4];
  void *dbias;
  int64_t dbias_stride[4];
  /* Dropout (flashc.h; 0: off): weight (s, h, i, j) is kept iff fc_dropout_keep (philox.h) says so, and kept ones are
   * scaled by 1/(1 − dropout_p). dropout_mask (forward, NULL: not wanted) is written by api.c, not the backends. */
  float dropout_p;
  uint32_t dropout_threshold; /* fc_dropout_threshold(dropout_p): t16, 1 … 2^16 − 1 */
  uint64_t dropout_seed, dropout_offset;
  uint8_t *dropout_mask;
  /* Mask, per sequence: key j is visible to query i iff
   *   (window_left  < 0 || j >= i + shift − window_left) && (window_right < 0 || j <= i + shift + window_right)
   * with shift = fc_mask_shift(p, seqlen_q_of_seq, seqlen_k_of_seq). Causal is folded in as window_right = 0. */
  int64_t window_left, window_right;
  int bottom_right;    /* 1: shift = sk − sq (+ mask_offset); 0: shift = mask_offset */
  int64_t mask_offset; /* extra diagonal shift (ring attention: a block's position); 0 from the public API */
  const int32_t *cu_seqlens_q, *cu_seqlens_k; /* NULL when dense; arrays of batch + 1 */
  /* 1: cu_seqlens_q/k are device memory that the host never reads (flashc.h, cu_seqlens_device): seqlen_q/k are
   * the caller's max_seqlen_q/k, and fc_seq_q/k, which read the offsets on the host, must not be called. */
  int cu_seqlens_device;
  int deterministic;
  int num_splits; /* flashc_params.num_splits (≥ 0): 0 the backend's choice, 1 none, n > 1 at most n parts */

  fc_view q, k, v, o;       /* forward and backward */
  fc_view dout, dq, dk, dv; /* backward only */
  float *lse;               /* dense: [batch, heads_q, seqlen_q]; varlen: [heads_q, total_q]. May be NULL
                               in forward. Contiguous. */
  int is_backward;

  /* from the handle */
  int threads;                    /* ≥ 1, resolved */
  void *stream;                   /* cudaStream_t */
  struct flashc_handle_s *handle; /* for fc_workspace */
} fc_problem;

/* No query row or no key row at all (batch, seqlen_q or seqlen_k 0, or every sequence empty on one side): the
 * results are known without a kernel, and api.c writes them (fc_prepare lets such a problem through without
 * asking the backend's `supports`). */
static inline bool fc_problem_is_empty(const fc_problem *p) { return p->total_q == 0 || p->total_k == 0; }

/* Rows of sequence s: [*start, *start + *len) of the packed tensor (varlen, the used rows of its slot), or
 * [0, seqlen) of batch s. Host offsets only (not p->cu_seqlens_device). */
static inline void fc_seq_q(const fc_problem *p, int64_t s, int64_t *start, int64_t *len) {
  if (p->cu_seqlens_q) {
    *start = p->cu_seqlens_q[s];
    *len = p->seqused_q ? p->seqused_q[s] : (int64_t)p->cu_seqlens_q[s + 1] - p->cu_seqlens_q[s];
  } else {
    *start = 0;
    *len = p->seqlen_q;
  }
}
static inline void fc_seq_k(const fc_problem *p, int64_t s, int64_t *start, int64_t *len) {
  if (p->cu_seqlens_k) {
    *start = p->cu_seqlens_k[s];
    *len = p->seqused_k ? p->seqused_k[s] : (int64_t)p->cu_seqlens_k[s + 1] - p->cu_seqlens_k[s];
  } else {
    *start = 0;
    *len = p->seqlen_k;
  }
}

/* Element offset of row `row` (within sequence s, which starts at `start`), head h, in view v. */
static inline int64_t fc_offset(const fc_view *v, int64_t s, int64_t start, int64_t row, int64_t h) {
  return s * v->stride_b + (start + row) * v->stride_s + h * v->stride_h;
}

/* Index into lse of (sequence s starting at q row `start`, head h, row i). */
static inline int64_t fc_lse_index(const fc_problem *p, int64_t s, int64_t start, int64_t h, int64_t i) {
  if (p->cu_seqlens_q) return h * p->total_q + start + i;
  return (s * p->heads_q + h) * p->seqlen_q + i;
}

/* The diagonal shift of one sequence of sq queries and sk keys. */
static inline int64_t fc_mask_shift(const fc_problem *p, int64_t sq, int64_t sk) {
  return (p->bottom_right ? sk - sq : 0) + p->mask_offset;
}

/* Visible keys of query row i: [*lo, *hi) clipped to [0, sk). Empty when *lo >= *hi. */
static inline void fc_key_range(const fc_problem *p, int64_t shift, int64_t i, int64_t sk, int64_t *lo, int64_t *hi) {
  int64_t d = i + shift;
  int64_t a = p->window_left < 0 ? 0 : d - p->window_left;
  int64_t b = p->window_right < 0 ? sk : d + p->window_right + 1;
  if (a < 0) a = 0;
  if (b > sk) b = sk;
  *lo = a;
  *hi = b;
}

/* ALiBi's slope of sequence s, query head h (0 without ALiBi): the bias of query i and key j of a sequence of sq
 * queries and sk keys is −slope·|i + sk − sq − j| (fc_alibi_dist). */
static inline double fc_alibi_slope(const fc_problem *p, int64_t s, int64_t h) {
  return p->alibi_slopes ? p->alibi_slopes[s * p->alibi_stride_batch + h] : 0.0;
}

static inline double fc_alibi_dist(int64_t sq, int64_t sk, int64_t i, int64_t j) {
  const int64_t x = i + sk - sq - j;
  return (double)(x < 0 ? -x : x);
}

/* Element offset of (sequence s, query head h, query i, key j) in attn_mask or dbias, given their strides. */
static inline int64_t fc_attn_mask_offset(const int64_t stride[4], int64_t s, int64_t h, int64_t i, int64_t j) {
  return s * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
}

static inline bool fc_visible(const fc_problem *p, int64_t shift, int64_t i, int64_t j) {
  int64_t d = i + shift;
  return (p->window_left < 0 || j >= d - p->window_left) && (p->window_right < 0 || j <= d + p->window_right);
}

/* ---- dtype conversion (software, so the C library needs no half-precision compiler support) -------- */
static inline float fc_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        e++;
        man <<= 1;
      } while (!(man & 0x400u));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

/* Round to nearest even, with overflow to inf and correct subnormals. */
static inline uint16_t fc_f32_to_f16(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0)); /* inf/nan */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                                   /* overflow */
  if (ax < 0x38800000u) { /* below 2^-14: an f16 subnormal (or zero) in units of 2^-24 */
    float a;
    __builtin_memcpy(&a, &ax, 4);
    return (uint16_t)(sign | (uint32_t)rintf(a * 16777216.0f)); /* exact scaling; round to nearest even */
  }
  uint32_t r = ax + 0xc8000fffu + ((ax >> 13) & 1u); /* rebias exponent (−112 << 23) and round to even */
  return (uint16_t)(sign | (r >> 13));
}

static inline float fc_bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

static inline uint16_t fc_f32_to_bf16(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);                                           /* round to nearest even */
  return (uint16_t)(x >> 16);
}

/* Load element i of a buffer of `dtype` as double / store a double into it (rounding once). */
static inline double fc_load(const void *base, flashc_dtype dtype, int64_t i) {
  switch (dtype) {
  case FLASHC_F32: return ((const float *)base)[i];
  case FLASHC_F16: return fc_f16_to_f32(((const uint16_t *)base)[i]);
  case FLASHC_BF16: return fc_bf16_to_f32(((const uint16_t *)base)[i]);
  case FLASHC_F64: return ((const double *)base)[i];
  }
  return NAN;
}
static inline void fc_store(void *base, flashc_dtype dtype, int64_t i, double x) {
  switch (dtype) {
  case FLASHC_F32: ((float *)base)[i] = (float)x; break;
  case FLASHC_F16: ((uint16_t *)base)[i] = fc_f32_to_f16((float)x); break;
  case FLASHC_BF16: ((uint16_t *)base)[i] = fc_f32_to_bf16((float)x); break;
  case FLASHC_F64: ((double *)base)[i] = x; break;
  }
}

/* ---- backends -------------------------------------------------------------------------------------- */
/* Features a call may use beyond the plain ones every backend has (flashc.h): a backend's `features` says which
 * it implements, and validate.c refuses a call that needs one it lacks, naming it (fc_check_features). */
enum {
  FC_FEATURE_SOFTCAP = 1u << 0,
  FC_FEATURE_ALIBI = 1u << 1,
  FC_FEATURE_HEAD_DIM_V = 1u << 2, /* V's head dim ≠ Q/K's */
  FC_FEATURE_SEQUSED = 1u << 3,
  FC_FEATURE_ATTN_MASK = 1u << 4,         /* attn_mask (and its gradient dbias) */
  FC_FEATURE_DROPOUT = 1u << 5,           /* dropout_p > 0, or its debug mask */
  FC_FEATURE_CU_SEQLENS_DEVICE = 1u << 6, /* varlen offsets in device memory (params.cu_seqlens_device) */
};

struct fc_kv_problem; /* kvcache.h */

typedef struct fc_backend {
  const char *name;
  const char *summary;
  flashc_device device;
  unsigned dtypes; /* 1u << flashc_dtype */
  int min_head_dim, max_head_dim;
  /* NULL, or: is this backend runnable on this machine? Writes a reason into why[len] when not. */
  bool (*usable)(char *why, size_t len);
  /* NULL, or: can it run this validated problem? FLASHC_OK, or FLASHC_ERR_UNSUPPORTED with fc_error's
   * message ("head_dim 300 exceeds 256 on backend cuda-mma"). Called before any data is touched. */
  flashc_status (*supports)(const fc_problem *p);
  flashc_status (*forward)(const fc_problem *p);
  flashc_status (*backward)(const fc_problem *p); /* NULL: forward only */
  /* The CUDA rungs (C++17: positional initialisers) list these three last, as 0, 0, NULL: no feature. */
  unsigned features;  /* FC_FEATURE_* it implements */
  int max_head_dim_v; /* with FC_FEATURE_HEAD_DIM_V: the largest head_dim_v (0: max_head_dim) */
  /* NULL, or flashc_forward_kvcache on a validated call (src/kvcache.h): append, then attend. */
  flashc_status (*forward_kvcache)(const struct fc_kv_problem *p);
} fc_backend;

/* The table, best first (backends.c). */
extern const fc_backend *const fc_backends[];
extern const int fc_backend_total;
const fc_backend *fc_backend_find(const char *name);

/* ---- the handle ----------------------------------------------------------------------------------- */
struct fc_retired_mem { /* a device buffer a CUDA graph may still use (flashc_handle_s.retired) */
  void *mem;
  int device;
};
struct flashc_handle_s {
  char backend[32];         /* as created: "auto" or a backend name */
  const fc_backend *fixed;  /* NULL for auto */
  const char *last_backend; /* name of the backend the last successful call ran */
  int threads;              /* 0 = all processors */
  void *stream;
  void *host_ws;
  size_t host_ws_size;
  void *device_ws;
  size_t device_ws_size;
  int device_ws_device; /* the CUDA device device_ws lives on */
  void *device_zero;    /* fc_device_zeroed: device memory that every kernel using it leaves zero */
  size_t device_zero_size;
  int device_zero_device;
  /* A call captured in a CUDA graph holds the addresses of device_ws and device_zero: once one was (captured), a
   * buffer that grows is not freed but kept here (retired, with its device) until the handle is destroyed, so that
   * the graph's replays still read and write memory of their own (common/runtime.cu). */
  int captured;
  struct fc_retired_mem *retired;
  int n_retired;
};

/* ---- validation (validate.c) ---------------------------------------------------------------------- */
/* Checks every argument of a forward (is_backward 0: dout/dq/dk/dv NULL) or backward call, fills *p and
 * picks the backend (*chosen): the handle's own, or for "auto" the best one that accepts the call. `op`
 * names the entry point in messages. Touches no tensor data. */
/* The caller's params (NULL: the defaults) as this library's struct: the fields the caller's struct_size covers,
 * the defaults after them; a struct_size the library cannot read is refused. */
flashc_status fc_params_read(const char *op, const flashc_params *params, flashc_params *out);
flashc_status fc_prepare(const char *op, flashc_handle h, const flashc_params *params, const flashc_tensor *q,
                         const flashc_tensor *k, const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                         const flashc_tensor *dout, const flashc_tensor *dq, const flashc_tensor *dk,
                         const flashc_tensor *dv, int is_backward, fc_problem *p, const fc_backend **chosen);

/* The FC_FEATURE_* that problem p uses. */
unsigned fc_problem_features(const fc_problem *p);
/* FLASHC_OK when `have` covers what p uses, else FLASHC_ERR_UNSUPPORTED naming the first feature missing and
 * `who` ("backend cuda-mma", "ring attention"). */
flashc_status fc_check_features(const char *op, const char *who, unsigned have, const fc_problem *p);

/* The checks of one tensor, for other entry points that take tensors (the ring's shard helpers): see
 * validate.c. fc_check_tensor sets *span to the offset of the last element, −1 when the view has none. */
flashc_status fc_check_tensor(const char *op, const char *name, const flashc_tensor *t, int64_t *span);
/* Output `t` (checked) has no two indices at one address. */
flashc_status fc_check_no_self_overlap(const char *op, const char *name, const flashc_tensor *t);
/* Output `out` is not the struct `in` and shares no element with it (spans from fc_check_tensor). */
flashc_status fc_check_disjoint(const char *op, const char *out_name, const flashc_tensor *out, int64_t out_span,
                                const char *in_name, const flashc_tensor *in, int64_t in_span);
/* Where pointers live (NULL ones skipped): *where 1 device, 0 host, −1 unknown; pointers in both are refused,
 * naming the first that disagrees. */
flashc_status fc_locate(const char *op, const void *const *ptrs, const char *const *names, int n, int *where);

/* ---- workspace and threads ------------------------------------------------------------------------- */
/* Host scratch memory owned by the handle, grown on demand (so a repeated call allocates nothing).
 * Returns FLASHC_ERR_OUT_OF_MEMORY with the byte count on failure. Valid until the next call on the handle. */
flashc_status fc_host_workspace(const fc_problem *p, size_t bytes, void **ptr);
/* The same for device memory (CUDA builds only; defined in src/cuda/common/runtime.cu). */
flashc_status fc_device_workspace(const fc_problem *p, size_t bytes, void **ptr);
/* Device memory of the handle that is zero when a kernel starts: allocated and zeroed once (again when it must grow
 * or the device changes), and every kernel that uses it must leave it zero again (e.g. flags between CTAs, each
 * raised and then reset within the launch), so that no call has to clear it first. A kernel that dies leaves the
 * context unusable (CUDA errors in kernels are sticky), so no later call can read what it left. */
flashc_status fc_device_zeroed(const fc_problem *p, size_t bytes, void **ptr);
/* flashc_set_stream's hook: work already enqueued on the old stream may still use the device workspace, so
 * the new stream waits for it (an event, not a host sync: legal while a graph is being captured). No-op
 * without CUDA or before the handle's first GPU call. */
flashc_status fc_device_stream_switch(struct flashc_handle_s *h, void *old_stream, void *new_stream);

/* The results of an empty problem in device memory (api.c), on p's stream: zero every element of the view of
 * n[0] × n[1] × n[2] rows of `row` contiguous elements of p's dtype (strides in elements, honoured: the memory
 * between rows is not touched), and set n floats to `value`. src/cuda/common/fill.cu; FLASHC_ERR_UNSUPPORTED without
 * CUDA. */
flashc_status fc_device_zero_rows(const fc_problem *p, void *data, const int64_t n[3], const int64_t stride[3],
                                  int64_t row);
flashc_status fc_device_fill_f32(const fc_problem *p, float *data, int64_t n, float value);
/* The results of the rows past seqused in device memory (api.c), on p's stream, in one launch: o = 0 and lse = −inf
 * (forward), dq = 0 past seqused_q and dk = dv = 0 past seqused_k (backward). Uses the device workspace. */
flashc_status fc_device_unused_rows(const fc_problem *p);
/* params.dropout_mask in device memory (api.c), on p's stream: keep of every element by philox.h's rule, 0 past each
 * sequence's lengths. */
flashc_status fc_device_dropout_mask(const fc_problem *p);

/* Runs fn(ctx, i, worker) for i in [0, n) on up to `threads` threads (the calling thread included) and
 * returns when all are done. Work is handed out dynamically, one index at a time and in increasing order, each
 * to a thread that runs it to the end: a task may wait for one with a smaller index (the `cpu` backward does),
 * which is running or done. `worker` in [0, threads) identifies the thread, so a task can use per-thread
 * scratch (slice worker of a workspace). */
void fc_parallel_for(int threads, int64_t n, void (*fn)(void *ctx, int64_t i, int worker), void *ctx);

/* The processors this process may run on (its CPU affinity on Linux, else the online ones), ≥ 1. */
int fc_cpu_count(void);

/* Where a pointer lives, for builds with CUDA: 1 device (or managed) memory, 0 host, −1 unknown. Without
 * CUDA it returns 0. Lets `auto` pick a backend that can touch the caller's tensors. */
int fc_pointer_is_device(const void *ptr);

/* Checked size arithmetic: false on overflow. */
static inline bool fc_mul_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool fc_add_ok(int64_t a, int64_t b, int64_t *out) { return !__builtin_add_overflow(a, b, out); }

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_INTERNAL_H */
