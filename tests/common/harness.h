/*
 * harness.h — what the C tests share (the .c files of tests/common): the run's seed and random numbers, failures and
 * the summary, environment filters, dtype rounding written independently of the library, tensors in several layouts
 * with poisoned padding, the plain attention used as the low-precision baseline and as an fp64 cross-check of the
 * oracle, error metrics, and calls of a backend with its data moved where it must live.
 *
 * Organised like ggml's test-backend-ops: every backend is checked against the fp64 oracle `cpu-ref` on one
 * case list, with FlashAttention's rule: a backend's max error is at most k times the error of the same
 * maths done plainly in the same low precision (k = 2 forward, 3 backward), plus a small floor.
 */
#ifndef FLASHC_TEST_HARNESS_H
#define FLASHC_TEST_HARNESS_H

#include "flashc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ---- bit patterns ------------------------------------------------------------------------------------ */
static inline uint32_t th_f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
static inline float th_bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
static inline bool th_f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
static inline bool th_bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu); }

/* ---- the run: seed, failures, environment (harness.c) -------------------------------------------- */
/* The run's seed: FLASHC_TEST_SEED if set, else fresh from time and pid. Printed at the start and, when a
 * check failed, at the end, so that a failing run can be repeated exactly. */
uint64_t th_seed(void);
/* Prints "<prog>: seed N" once; call at the start of main. */
void th_begin(const char *prog);
/* Records a failure and prints "FAIL: ..." (printf format). */
void th_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
int th_failures(void);
/* Prints the summary ("<prog>: N checks, M failures", the seed on failure) and returns main's exit code. */
int th_end(void);
/* Counts one check (for the summary); returns `ok` so that `if (!th_check(x, ...))` reads naturally. The
 * message is printed as a failure when !ok. */
bool th_check(bool ok, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* FLASHC_TEST_QUICK=1: a small subset (for sanitizer runs). */
bool th_quick(void);
/* Is `name` in the comma list of environment variable `var`? True when the variable is unset or empty. */
bool th_env_list_has(const char *var, const char *name);
/* Seconds on a monotonic clock. */
double th_now(void);

/* ---- random numbers (harness.c): xoshiro256** seeded by splitmix64 -------------------------------- */
typedef struct th_rng {
  uint64_t s[4];
} th_rng;
void th_rng_init(th_rng *r, uint64_t seed);
uint64_t th_rng_u64(th_rng *r);
double th_rng_uniform(th_rng *r); /* [0, 1) */
double th_rng_normal(th_rng *r);  /* N(0, 1) */
/* A problem's dense inputs (malloc; the caller frees): q and dout of nq elements, k and v of nk, N(0, 1) rounded
 * to bf16 so that every dtype holds them exactly; drawn in pairs, q[x] and dout[x], then k[x] and v[x]. */
void th_normal_inputs(th_rng *r, int64_t nq, int64_t nk, double **q, double **k, double **v, double **dout);

/* ---- dtypes, written apart from the library's own conversions (dtype.c) --------------------------- */
/* Nearest-even rounding by exact arithmetic on doubles: slow, but obviously right. */
uint16_t th_f32_to_f16(float f);
float th_f16_to_f32(uint16_t h);
uint16_t th_f32_to_bf16(float f);
float th_bf16_to_f32(uint16_t h);
/* x rounded to the nearest value of `dtype` (f32, f16 and bf16 round the float nearest x). */
double th_round(flashc_dtype dtype, double x);
/* u, the unit roundoff of `dtype`: 2^-24 (f32), 2^-11 (f16), 2^-8 (bf16), 2^-53 (f64). */
double th_unit_roundoff(flashc_dtype dtype);
/* One element of a buffer of `dtype`. */
double th_load(const void *base, flashc_dtype dtype, int64_t i);
void th_store(void *base, flashc_dtype dtype, int64_t i, double x);

/* ---- tensors (tensor.c) ------------------------------------------------------------------------------ */
typedef enum th_layout {
  TH_BSHD,    /* contiguous [batch, seqlen, heads, head_dim] */
  TH_BHSD,    /* contiguous [batch, heads, seqlen, head_dim] */
  TH_STRIDED, /* [heads, batch, seqlen, head_dim] order with padding at every level and before the data */
  TH_LAYOUT_COUNT
} th_layout;
const char *th_layout_name(th_layout layout);

/* A tensor the harness owns: a view into an allocation whose bytes outside the view stay poisoned, so a
 * backend that reads outside its view reads NaN and one that writes outside it is caught. */
typedef struct th_tensor {
  flashc_tensor view; /* host memory */
  void *alloc;        /* the whole allocation */
  int64_t alloc_elems;
  size_t alloc_bytes;
  uint8_t *in_view; /* per allocation element: 1 inside the view */
} th_tensor;

/* The poison byte: 0xFF makes every dtype NaN (0xFFFF is a NaN in f16 and bf16, 0xFFFFFFFF in f32 ...). */
#define TH_POISON_BYTE 0xFF

th_tensor th_tensor_new(flashc_dtype dtype, th_layout layout, int64_t batch, int64_t seqlen, int64_t heads,
                        int64_t head_dim);
void th_tensor_free(th_tensor *t);
/* Element offset of [b, s, h, d] in the view. */
int64_t th_index(const flashc_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d);
/* Every byte of the allocation to TH_POISON_BYTE. */
void th_poison(th_tensor *t);
/* Random N(0, 1) values rounded to the dtype, never zero, in the view; poison elsewhere. */
void th_fill_normal(th_tensor *t, th_rng *r);
/* A contiguous BSHD copy of the view as doubles (malloc; the caller frees). */
double *th_dense(const th_tensor *t);
/* Elements in the view (b·s·h·d). */
int64_t th_numel(const flashc_tensor *t);
/* A BSHD tensor of `dtype` holding dense values (they must be representable). */
th_tensor th_tensor_from_dense(flashc_dtype dtype, const double *x, int64_t batch, int64_t seqlen, int64_t heads,
                               int64_t head_dim);
/* After a call: are all elements of the view written (no poison left) and finite, and is the padding still
 * poison (nothing written outside the view)? Records a failure naming `what` and the first bad elements;
 * returns how many there were. */
int64_t th_check_output(const th_tensor *t, const char *what);
/* Does the allocation still hold only poison (a failed call wrote nothing)? */
bool th_all_poison(const th_tensor *t);

/* ---- the attention problem as the harness sees it (naive.c) ----------------------------------------- */
typedef struct th_attn {
  int64_t batch, seqlen_q, seqlen_k; /* tensor sizes: varlen packs with batch 1 and the totals */
  int64_t heads_q, heads_kv, head_dim;
  flashc_params params;
} th_attn;

/* A problem of these sizes (one sequence per batch entry) with flashc_params_default(). */
th_attn th_attn_dense(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                      int64_t head_dim);
/* Makes a varlen problem of num_seqs sequences of lens_q[s] queries and lens_k[s] keys: cu_q and cu_k (num_seqs + 1
 * entries each, the caller's, to outlive a) get the offsets, a->params points at them, and the tensors pack the
 * sequences in batch 1 (a->batch, seqlen_q and seqlen_k become 1 and the totals). */
void th_attn_varlen(th_attn *a, const int32_t *lens_q, const int32_t *lens_k, int num_seqs, int32_t *cu_q,
                    int32_t *cu_k);
int64_t th_num_seqs(const th_attn *a);
/* Rows of sequence s in the tensors: batch index, first row and length. */
void th_seq_rows(const th_attn *a, int64_t s, bool keys, int64_t *batch_index, int64_t *start, int64_t *len);
/* Visible keys of query row i of a sequence of sq queries and sk keys: [*lo, *hi), empty when lo >= hi. */
void th_key_range(const th_attn *a, int64_t sq, int64_t sk, int64_t i, int64_t *lo, int64_t *hi);
float th_scale(const th_attn *a);
/* lse elements and the index of (sequence s, head h, row i); the layout of flashc.h. */
int64_t th_lse_numel(const th_attn *a);
int64_t th_lse_index(const th_attn *a, int64_t s, int64_t h, int64_t i);
/* Per q row of the tensors (batch·seqlen_q entries, [b][row]): 1 when the row sees no key. */
uint8_t *th_empty_rows(const th_attn *a);

/* Plain attention on dense BSHD arrays, materialising each score row.
 *   model f64 : everything in double (the cross-check of the oracle).
 *   otherwise : the "plain low-precision" baseline: S = QKᵀ accumulated in fp32 and rounded to the dtype,
 *               softmax in fp32 with P rounded to the dtype, O = PV accumulated in fp32, rounded.
 * lse (may be NULL) in the layout of flashc.h, −inf for rows that see no key. */
void th_naive_forward(const th_attn *a, flashc_dtype model, const double *q, const double *k, const double *v,
                      double *o, double *lse);
/* The backward of the same computation, in the same style: dP = dO·Vᵀ rounded, D = rowsum(P∘dP) in fp32,
 * dS = P∘(dP − D) rounded, dQ = scale·dS·K, dK = scale·dSᵀ·Q, dV = Pᵀ·dO accumulated in fp32, rounded. */
void th_naive_backward(const th_attn *a, flashc_dtype model, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv);

/* ---- metrics and FlashAttention's rule (compare.c) ------------------------------------------------ */
typedef struct th_err {
  double max_abs, mean_abs, max_rel, rel_l2;
  double ref_max;         /* max |ref| over finite elements */
  int64_t mismatched_inf; /* elements where exactly one of x, ref is infinite (or either is NaN) */
} th_err;
/* x against ref, n elements. Equal infinities count as no error. max_rel divides by max(|ref|, 1e-3·ref_max)
 * so that it stays meaningful near zeros. */
th_err th_compare(const double *x, const double *ref, int64_t n);

typedef struct th_verdict {
  th_err err, base;
  double tol;
  bool pass;
} th_verdict;
/* max_abs(x) ≤ k·max_abs(baseline) + floor_abs (base NULL: the floor alone). */
th_verdict th_judge(const double *x, const double *base, const double *ref, int64_t n, double k, double floor_abs);
/* max |x| over the finite elements. */
double th_abs_max(const double *x, int64_t n);
/* "max 1.2e-03 <= 2.4e-03 (base 1.0e-03) mean ... rel ... l2 ..." into buf. */
void th_format_verdict(char *buf, size_t len, const char *name, const th_verdict *v);

/* ---- backends and calls (device.c) ------------------------------------------------------------------ */
typedef struct th_backend {
  flashc_backend_info info;
  flashc_handle handle;
} th_backend;
/* Creates a handle on backend `name`; false (with a failure recorded) when that fails. */
bool th_backend_open(th_backend *b, const char *name);
void th_backend_close(th_backend *b);

/* A forward call on b with data where b needs it: the outputs (o, and lse if not NULL) are poisoned first
 * (host and device); inputs are copied to the device for a CUDA backend and the outputs back. Returns the
 * library's status; harness-side CUDA failures are recorded and return FLASHC_ERR_CUDA. */
flashc_status th_forward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                         const th_tensor *v, th_tensor *o, float *lse, int64_t lse_numel);
flashc_status th_backward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                          const th_tensor *v, const th_tensor *o, const float *lse, int64_t lse_numel,
                          const th_tensor *dout, th_tensor *dq, th_tensor *dk, th_tensor *dv);

/* What one forward + backward gave, as dense doubles (malloc; th_results_free frees): o, dq, dk, dv in BSHD and
 * lse in the layout of flashc.h. */
typedef struct th_results {
  double *o, *lse, *dq, *dk, *dv;
} th_results;
void th_results_free(th_results *r);
/* Forward, then backward, of `params` on b with host tensors (CPU backends), lse holding lse_numel floats. Each
 * status and each output (written, finite, nothing outside its view) is checked under the name `what`; on
 * success r holds the results. False when a call failed (recorded), r then untouched. */
bool th_forward_backward(const th_backend *b, const flashc_params *params, const th_tensor *q, const th_tensor *k,
                         const th_tensor *v, th_tensor *o, float *lse, int64_t lse_numel, const th_tensor *dout,
                         th_tensor *dq, th_tensor *dk, th_tensor *dv, const char *what, th_results *r);

#endif /* FLASHC_TEST_HARNESS_H */
