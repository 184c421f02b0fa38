/*
 * flashc.h — exact scaled-dot-product attention, forward and backward, from C.
 *
 *   O = softmax(scale · Q·Kᵀ + mask) · V
 *
 * The one public header of libflashc. C11, usable from C++ and with no CUDA header: a CUDA stream is passed
 * as a `void *` (a `cudaStream_t`).
 *
 * Shapes (one sequence of a batch, one head):
 *   q, dq        : [batch, seqlen_q, heads_q,  head_dim]   (any strides, see flashc_tensor)
 *   o, do        : [batch, seqlen_q, heads_q,  head_dim_v] (head_dim_v: V's head dim, may differ: flashc_params)
 *   k, dk        : [batch, seqlen_k, heads_kv, head_dim]
 *   v, dv        : [batch, seqlen_k, heads_kv, head_dim_v]
 *   lse          : [batch, heads_q, seqlen_q], fp32, contiguous; natural log of Σ_j exp(scale·q·k_j)
 * heads_q must be a multiple of heads_kv (GQA; MQA when heads_kv = 1): query head h reads key/value head
 * h / (heads_q / heads_kv).
 *
 * Variable length (as FlashAttention's cu_seqlens): set params.cu_seqlens_q/k to host arrays of num_seqs + 1
 * non-decreasing offsets starting at 0. Then every tensor has batch = 1 and seqlen = the total number of
 * tokens, sequence s owns rows [cu_seqlens[s], cu_seqlens[s+1]) of it, and lse is [heads_q, total_q].
 * The offsets may instead live in device memory, as flash_attn_varlen_func takes them (params.cu_seqlens_device,
 * with max_seqlen_q/k): see flashc_params.
 *
 * Rows of the score matrix that see no key (a causal mask with seqlen_q > seqlen_k, or a window) give
 * output 0, lse −inf and zero gradients: never NaN.
 *
 * Non-finite values follow IEEE arithmetic, as in PyTorch and FlashAttention, on every backend (the CUDA
 * backends' running row maximum is NaN-propagating, max.NaN.f32). A NaN reaches every row that
 * meets it: a NaN in q_i makes o_i and lse_i NaN; a NaN in k_j, or a score of +inf (softmax's exp(inf − inf)),
 * makes NaN every row that sees key j; the backward gives NaN gradients where NaN flows (and, through 0·inf,
 * in dq from a key with an infinite component). A score of −inf weighs nothing, like a masked key; a row
 * that sees no key, or only scores of −inf, gives o = 0 and lse = −inf. Scores or sums past fp32's range
 * (a huge scale, values near 3e38): `cpu` recomputes such rows in fp64 and gives cpu-ref's answer (lse
 * rounds to ±inf past the range); the CUDA backends, computing in fp32, give inf or NaN there, or o = 0 and
 * lse = −inf for a row whose scores all fall below −3.4e38 (their backward of such a forward is not yet held
 * to that rule: cuda-mma and cuda-hopper have given finite gradients of 0 there, issue #43).
 *
 * Empty inputs (as FlashAttention and PyTorch): batch = 0, seqlen_q = 0 or seqlen_k = 0, and varlen batches
 * whose every sequence is empty on one side (total_q = 0 or total_k = 0) are valid calls. Queries that see
 * no key give o = 0 and lse = −inf; the backward gives dq = 0 when there is no key and dk = dv = 0 when there
 * is no query. A tensor's data (and lse) may be NULL exactly when its view has no element. heads = 0 and
 * head_dim = 0 are refused; varlen needs num_seqs ≥ 1. Ring attention refuses empty shards.
 *
 * Aliasing: an output (o and lse in the forward; dq, dk, dv in the backward) must not share an element with
 * itself, another output or an input, and must not be the same flashc_tensor struct as another argument;
 * lse, a bare pointer, must not lie within the bytes from the first to the last element of a tensor it is
 * checked against (the forward's q, k, v, o; the backward's dq, dk, dv). Inputs may share memory freely.
 *
 * Alignment: every tensor's data must be aligned to its element size (2, 4 or 8 bytes) and lse to 4 bytes;
 * a misaligned pointer is refused with FLASHC_ERR_INVALID_ARGUMENT.
 *
 * Every function returns a status. On failure, flashc_last_error() returns a message for this thread that
 * names the operation and the offending value. No function writes output before all input was validated.
 */
#ifndef FLASHC_H
#define FLASHC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version -------------------------------------------------------------------------------------- */
#define FLASHC_VERSION_MAJOR 0
#define FLASHC_VERSION_MINOR 2
#define FLASHC_VERSION_PATCH 0
/* One comparable number that cannot collide as the parts grow: MAJOR·1e6 + MINOR·1e3 + PATCH. */
#define FLASHC_VERSION_CODE(major, minor, patch) ((major)*1000000 + (minor)*1000 + (patch))
#define FLASHC_VERSION                           FLASHC_VERSION_CODE(FLASHC_VERSION_MAJOR, FLASHC_VERSION_MINOR, FLASHC_VERSION_PATCH)

/* The version of the library actually linked (compare with FLASHC_VERSION, the header's). */
int flashc_version(void);
/* "0.2.0" */
const char *flashc_version_string(void);

/* ---- statuses ------------------------------------------------------------------------------------- */
typedef enum flashc_status {
  FLASHC_OK = 0,
  FLASHC_ERR_INVALID_ARGUMENT = 1, /* the caller's input is wrong: a null pointer, a shape mismatch ... */
  FLASHC_ERR_UNSUPPORTED = 2,      /* valid, but this backend (or build) cannot do it               */
  FLASHC_ERR_OUT_OF_MEMORY = 3,    /* host or device allocation failed; the message says how much   */
  FLASHC_ERR_CUDA = 4,             /* a CUDA call failed; the message carries CUDA's own words      */
  FLASHC_ERR_COMMUNICATION = 5,    /* NCCL/MPI failed, a peer died or timed out                     */
  FLASHC_ERR_INTERNAL = 6,         /* a bug in flashc: please report it with the message            */
  FLASHC_STATUS_COUNT              /* the number of statuses (not one): a table indexed by status    */
} flashc_status;

/* A fixed name for a status ("invalid argument"). Never NULL. */
const char *flashc_status_string(flashc_status status);
/* The message of the last failed call on this thread ("" if none). Valid until the next call on this
 * thread. */
const char *flashc_last_error(void);

/* ---- tensors -------------------------------------------------------------------------------------- */
typedef enum flashc_dtype {
  FLASHC_F32 = 0,
  FLASHC_F16 = 1,
  FLASHC_BF16 = 2,
  FLASHC_F64 = 3 /* the reference backend only */
} flashc_dtype;

/* "f32", "f16", "bf16", "f64"; NULL for an unknown value. */
const char *flashc_dtype_name(flashc_dtype dtype);
/* Bytes per element; 0 for an unknown value. */
size_t flashc_dtype_size(flashc_dtype dtype);

/* A 4-d view [batch, seqlen, heads, head_dim] of memory the caller owns. Strides are in elements;
 * stride[3] (along head_dim) must be 1, the others are free (BSHD, BHSD, slices of a packed QKV ...).
 * Output tensors must not overlap themselves, each other or an input (see "Aliasing" above). `data` is host
 * memory for CPU backends and device memory for CUDA backends, aligned to the element size; NULL only for a
 * view with no element. */
typedef struct flashc_tensor {
  void *data;
  flashc_dtype dtype;
  int64_t size[4];   /* batch, seqlen, heads, head_dim */
  int64_t stride[4]; /* in elements */
} flashc_tensor;

/* A contiguous [batch, seqlen, heads, head_dim] tensor (the layout of FlashAttention and of flashc's
 * .npy files). */
flashc_tensor flashc_tensor_bshd(void *data, flashc_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                 int64_t head_dim);
/* A contiguous [batch, heads, seqlen, head_dim] tensor (PyTorch's SDPA layout), described as BSHD. */
flashc_tensor flashc_tensor_bhsd(void *data, flashc_dtype dtype, int64_t batch, int64_t seqlen, int64_t heads,
                                 int64_t head_dim);

/* ---- attention parameters ------------------------------------------------------------------------- */
typedef enum flashc_causal_align {
  /* Query i sees keys j ≤ i + seqlen_k − seqlen_q: the last query sees the last key (FlashAttention). */
  FLASHC_ALIGN_BOTTOM_RIGHT = 0,
  /* Query i sees keys j ≤ i (PyTorch's is_causal). */
  FLASHC_ALIGN_TOP_LEFT = 1
} flashc_causal_align;

/* Start from flashc_params_default() and change what you need. The mask, for query row i and key j of one
 * sequence, with d = i + (align == BOTTOM_RIGHT ? seqlen_k − seqlen_q : 0) the row's diagonal:
 *   causal       : j ≤ d
 *   window (L,R) : d − L ≤ j ≤ d + R, a negative L or R meaning unbounded on that side
 * Causal and a window combine (causal sets R to 0).
 *
 * The score of a visible key, in this order (as FlashAttention):
 *   s = scale · q_i·k_j
 *   softcap > 0  : s ← softcap · tanh(s / softcap)      (Gemma-2, Grok; finite, > 0)
 *   alibi_slopes : s ← s − slope · |i + seqlen_k − seqlen_q − j|   (ALiBi; the bottom-right distance whatever
 *                  `align` is), with slope = alibi_slopes[b · alibi_stride_batch + h] for sequence b and query head
 *                  h: [heads_q] with stride 0, or [batch (num_seqs for varlen), heads_q] with stride heads_q
 * then the mask and the softmax; lse is the log-sum-exp of these scores. The backward differentiates through
 * both (the slopes get no gradient).
 *
 * attn_mask (as PyTorch's scaled_dot_product_attention): [batch|1, heads_q|1, seqlen_q, seqlen_k], element (b, h, i, j)
 * at attn_mask + b·stride[0] + h·stride[1] + i·stride[2] + j·stride[3] (attn_mask_stride, in elements, each ≥ 0; 0
 * broadcasts that dimension, as a [b, 1, 1, seqlen_k] padding mask expanded), in the memory the tensors live in.
 *   attn_mask_is_bool 0: an additive bias of the call's dtype (as SDPA, which takes a float mask of the query's
 *                        dtype): s ← s + bias after softcap and ALiBi, before the causal/window mask; a bias of −inf
 *                        hides the key like a mask
 *   attn_mask_is_bool 1: uint8 elements, nonzero = attend (SDPA's True); a zero removes the key
 * A row whose keys are all removed gives o = 0, lse = −inf and zero gradients. Varlen calls refuse attn_mask.
 * dbias (backward only, NULL: not wanted; needs a float attn_mask): the gradient of the bias, dL/ds, in the call's
 * dtype at dbias + b·dbias_stride[0] + … + j·dbias_stride[3] (strides ≥ 0); a stride of 0 sums the gradient over
 * that dimension (the gradient of a broadcast bias, as SDPA's efficient backend returns it). Every element is
 * written; dbias is an output (see "Aliasing").
 *
 * seqused_q / seqused_k (FlashAttention-3's varlen): sequence s uses only the first seqused[s] rows of its slot
 * [cu_seqlens[s], cu_seqlens[s+1]) (0 ≤ seqused[s] ≤ the slot's length; either array may be given alone). The
 * used lengths are the sequence's lengths for the mask and ALiBi; query rows past them get o = 0, lse = −inf and
 * dq = 0, key rows past them are never read and get dk = dv = 0.
 *
 * V's head dim may differ from Q/K's (v, o, dout, dv: size[3] = head_dim_v; q, k, dq, dk: head_dim); the default
 * scale stays 1/sqrt(head_dim of q). cpu-ref and cpu run any head_dim_v up to 512; cuda-mma head_dim 161..192
 * with head_dim_v 97..128, 97..128 with 33..64 and 33..64 with 97..128 (192/128, 128/64, 64/128 and the head dims that
 * round up to them), cuda-hopper head_dim 129..192 with head_dim_v 65..128, 65..128 with 1..64 and 1..64 with
 * 65..256 (192/128, 128/64, 64/128, 64/256; deterministic backward with 128/64 and 64/128 only), both without softcap,
 * ALiBi, dropout or attn_mask; every other backend refuses it with FLASHC_ERR_UNSUPPORTED.
 *
 * Dropout (dropout_p > 0, as FlashAttention's): each softmax weight P_ij (query row i, key j of sequence b, query
 * head h) is kept and scaled by 1/(1 − p), or dropped:
 *   o_i = Σ_j P_ij Z_ij v_j,   Z_ij = keep_ij / (1 − p)
 * P is the softmax of the scores as without dropout, and so is lse (its log-sum-exp: dropout does not change it).
 * The backward, given the same seed and offset, regenerates Z and differentiates that o: dv_j = Σ_i P_ij Z_ij do_i,
 * dS_ij = P_ij (Z_ij do_i·v_j − D_i) with D_i = do_i·o_i. keep_ij is exactly this, on every backend:
 *   generator : Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the generator
 *               of cuRAND and of PyTorch's CUDA dropout), key (k0, k1) = (seed mod 2^32, seed >> 32)
 *   element   : (b, h, i, j), i and j counted within sequence b (varlen: the sequence's index, its own rows and
 *               keys), sk = the sequence's key count (under seqused_k the used count)
 *   counter   : (c0, c1, c2, c3) with c0 + 2^32·c1 = (offset + i·⌈sk / 8⌉ + ⌊j / 8⌋) mod 2^64 and
 *               c2 + 2^32·c3 = b·heads_q + h: one block per 8 consecutive keys of a row, rows block-aligned (a
 *               block never holds keys of two rows)
 *   u         : half j mod 8 of the block's 128 bits read as eight 16-bit halves, half k = (word ⌊k/2⌋ >> 16·(k mod
 *               2)) & 0xffff (words numbered as Random123 returns them): one call serves 8 keys
 *   keep_ij   : u ≥ t16, t16 = ⌊p·2^16 + 1/2⌋ (p·2^16 is exact in double): a weight is dropped with probability
 *               t16 / 2^16, p quantised to a multiple of 2^−16 (FlashAttention-2 quantises it to 2^−8), while kept
 *               weights are scaled by 1/(1 − p) of p itself. p < 2^−17 or p ≥ 1 − 2^−17 (t16 0 or 2^16) is refused.
 * Why this rule: a GPU kernel holds a row's keys in runs of 8·n starting at multiples of 8, which are exactly n blocks
 * (no run straddles a block or a row), and 16-bit draws halve the Philox calls of 32-bit ones: dropout costs a
 * fraction of the attention it rides on. Elements the mask hides have a keep_ij too, unused. A call consumes the
 * counters offset .. offset + seqlen_q·⌈seqlen_k / 8⌉ − 1 of each (b, h) (varlen: each sequence its own lengths):
 * the next call should start past them (or take another seed), else its mask repeats this one's.
 * dropout_mask (forward only, a debug output; NULL: not wanted): keep_ij of every element, hidden or not, as uint8
 * [batch, heads_q, seqlen_q, seqlen_k], contiguous (varlen: [num_seqs, heads_q, longest seqlen_q, longest
 * seqlen_k], 0 past each sequence's lengths), in the memory the tensors live in; at most 2^28 elements. It is an
 * output (see "Aliasing"). The backward ignores it. */
typedef struct flashc_params {
  size_t struct_size;          /* sizeof(flashc_params) where the caller was compiled: flashc_params_default sets it */
  float scale;                 /* 0: 1/sqrt(head_dim) */
  int causal;                  /* 0 or 1 */
  flashc_causal_align align;   /* where the diagonal sits when seqlen_q ≠ seqlen_k */
  int64_t window_left;         /* −1: unbounded */
  int64_t window_right;        /* −1: unbounded */
  const int32_t *cu_seqlens_q; /* NULL, or array of num_seqs + 1 offsets (varlen); host unless cu_seqlens_device */
  const int32_t *cu_seqlens_k; /* NULL, or array of num_seqs + 1 offsets (varlen); host unless cu_seqlens_device */
  int64_t num_seqs;            /* with cu_seqlens */
  int deterministic;           /* backward: bit-identical gradients run to run (may be slower) */
  /* Score modifiers and varlen extents (cpu-ref and cpu implement them all, cuda-hopper softcap, ALiBi, seqused and
   * attn_mask (not dbias), cuda-mma softcap, ALiBi, seqused and attn_mask; every other backend refuses a call that
   * uses one with FLASHC_ERR_UNSUPPORTED, and `auto` picks one that accepts it). */
  float softcap;               /* 0: off; > 0: s ← softcap·tanh(s / softcap) on s = scale·q·k, before the mask */
  const float *alibi_slopes;   /* NULL: off; fp32 slopes, in the memory the tensors live in (see above) */
  int64_t alibi_stride_batch;  /* elements between the slopes of sequence b and b + 1; 0: one slope per head */
  const int32_t *seqused_q;    /* NULL, or (varlen only) host array of num_seqs: rows of each q slot used */
  const int32_t *seqused_k;    /* NULL, or (varlen only) host array of num_seqs: rows of each k slot used */
  const void *attn_mask;       /* NULL: none; else a bias or boolean mask (see above), where the tensors live */
  int attn_mask_is_bool;       /* 0: bias of the call's dtype; 1: uint8, nonzero = attend */
  int64_t attn_mask_stride[4]; /* batch, head, query, key; in elements, ≥ 0; 0: broadcast */
  void *dbias;                 /* backward: NULL, or the bias's gradient (an output), as attn_mask lives */
  int64_t dbias_stride[4];     /* batch, head, query, key; in elements, ≥ 0; 0: summed over that dimension */
  /* Attention dropout (see "Dropout" above; cpu-ref, cpu, cuda-mma and cuda-hopper implement it, cuda-hopper's
   * backward at head dims up to 128 and without a float attn_mask). */
  float dropout_p;         /* 0: off; else 2^−17 ≤ p < 1 − 2^−17, the probability that a weight is dropped */
  uint64_t dropout_seed;   /* Philox key */
  uint64_t dropout_offset; /* Philox counter base, in blocks (8 keys of a row each) */
  uint8_t *dropout_mask;   /* forward, debug: NULL, or [batch, heads_q, seqlen_q, seqlen_k] uint8 (1 = kept) out */
  /* Forward: the parts each query tile's keys are split into, one CTA each, merged after (split-KV, for grids too
   * small to fill the GPU, such as decoding). 0: the backend chooses (the default); 1: no split; n > 1: at most n
   * parts (one per key block, 64 at most). Negative is refused. Only cuda-mma splits (rows on 16 bytes); the other
   * backends ignore it, and under `auto` a call that cuda-mma would split 4 ways or more runs there. */
  int num_splits;
  /* Varlen offsets in device memory (cuda-mma and cuda-hopper, forward and backward; every other backend refuses
   * them with FLASHC_ERR_UNSUPPORTED), as flash_attn_varlen_func takes them. cu_seqlens_device 1: cu_seqlens_q/k
   * point to device memory, on the tensors' device, which flashc never reads on the host: a call waits for
   * nothing, and after one call of its shape outside a capture (the handle's workspace grows then) it can be
   * captured in a CUDA graph, whose replays read the offsets as they are then. The caller
   * gives the longest sequence of each side in max_seqlen_q/k (0 ≤ max_seqlen ≤ the packed tensor's rows; 0 only
   * when it has none), and promises what the host would otherwise check: cu_seqlens[0] = 0, non-decreasing,
   * cu_seqlens[num_seqs] = the packed rows. A sequence longer than max_seqlen is cut to its first max_seqlen
   * rows (queries) or keys, so that nothing outside the tensors is read or written: o and lse of its rows past
   * the cut are left unwritten, and the gradients of the rows past the cut (dq; dk, dv) are unspecified.
   * seqused_q/k and dropout_mask are refused with device offsets. cu_seqlens_device 0 (the default): host
   * offsets, and max_seqlen_q/k are ignored. */
  int cu_seqlens_device;
  int64_t max_seqlen_q;
  int64_t max_seqlen_k;
} flashc_params;

/* The struct grows at its end as flashc gains features. flashc_params_default is compiled into the caller, so
 * struct_size is the size the caller knows: a library built with a later header reads only those fields and
 * gives the ones after them their defaults (an older caller keeps working); a struct_size larger than the
 * library's (a caller built against a newer header) is refused. Build params from this function, not from
 * {0}: a struct_size of 0 is refused too. */
static inline flashc_params flashc_params_default(void) {
  flashc_params p;
  p.struct_size = sizeof p;
  p.scale = 0.0f;
  p.causal = 0;
  p.align = FLASHC_ALIGN_BOTTOM_RIGHT;
  p.window_left = -1;
  p.window_right = -1;
  p.cu_seqlens_q = NULL;
  p.cu_seqlens_k = NULL;
  p.num_seqs = 0;
  p.deterministic = 0;
  p.softcap = 0.0f;
  p.alibi_slopes = NULL;
  p.alibi_stride_batch = 0;
  p.seqused_q = NULL;
  p.seqused_k = NULL;
  p.attn_mask = NULL;
  p.attn_mask_is_bool = 0;
  p.dbias = NULL;
  for (int d = 0; d < 4; d++) p.attn_mask_stride[d] = p.dbias_stride[d] = 0;
  p.dropout_p = 0.0f;
  p.dropout_seed = 0;
  p.dropout_offset = 0;
  p.dropout_mask = NULL;
  p.num_splits = 0;
  p.cu_seqlens_device = 0;
  p.max_seqlen_q = 0;
  p.max_seqlen_k = 0;
  return p;
}

/* ---- backends ------------------------------------------------------------------------------------- */
typedef enum flashc_device { FLASHC_DEVICE_CPU = 0, FLASHC_DEVICE_CUDA = 1 } flashc_device;

typedef struct flashc_backend_info {
  size_t struct_size;       /* sizeof(flashc_backend_info) where the caller was compiled (flashc_backend_get) */
  const char *name;         /* "cpu-ref", "cpu", "cuda-naive", ... */
  const char *summary;      /* one line: what the rung adds */
  flashc_device device;     /* where the tensors must live */
  int has_backward;         /* 1 if flashc_backward works */
  unsigned dtypes;          /* bit (1u << flashc_dtype) per supported dtype */
  int min_head_dim;         /* inclusive */
  int max_head_dim;         /* inclusive */
  int usable;               /* compiled in and runnable on this machine now */
  const char *why_unusable; /* "" when usable, else the reason ("no CUDA device") */
} flashc_backend_info;

/* The number of backends compiled into this library (usable here or not). */
int flashc_backend_count(void);
/* Fills the first info->struct_size bytes of *info for backend index 0 ≤ i < flashc_backend_count(); the order is
 * best first. An older caller's smaller struct gets the fields it has; a struct_size larger than the library's
 * is refused. flashc_backend_get sets struct_size to the caller's sizeof and calls it. */
flashc_status flashc_backend_query(int i, flashc_backend_info *info);
static inline flashc_status flashc_backend_get(int i, flashc_backend_info *info) {
  if (info) info->struct_size = sizeof *info;
  return flashc_backend_query(i, info);
}

/* ---- handle --------------------------------------------------------------------------------------- */
/* A handle carries the backend, the CPU thread count, the CUDA stream and a workspace that grows as
 * needed (so repeated calls of one shape allocate nothing). A handle is not thread-safe: use one per
 * thread. CUDA graphs: a call cannot be captured while the workspace must grow (the first call of a shape: run
 * it once outside the capture, on the same handle), and once a call of the handle was captured, a workspace that
 * grows later keeps its old memory for the graphs until flashc_destroy, which the graphs must not outlive. */
typedef struct flashc_handle_s *flashc_handle;

/* backend: a name from flashc_backend_get, or "auto" (or NULL): per call, the best usable backend that
 * supports the call and the memory its tensors live in. */
flashc_status flashc_create(flashc_handle *handle, const char *backend);
flashc_status flashc_destroy(flashc_handle handle); /* NULL is fine */
/* CPU threads, at most; 0 = the processors this process may run on (its CPU affinity; the default). A small call
 * runs on fewer (one per 2^18 multiply-adds of Q·Kᵀ: a thread's wake-up would cost more than its share). The `cpu`
 * backend's results do not depend on the count: they are bit-identical at every thread count. */
flashc_status flashc_set_threads(flashc_handle handle, int threads);
/* CUDA stream (a cudaStream_t) for the work of CUDA backends; NULL = the legacy default stream. Calls
 * return once the work is enqueued on it. Changing the stream orders the new one after the work already
 * enqueued on the old one (they share the handle's device workspace); one handle per stream avoids that wait. */
flashc_status flashc_set_stream(flashc_handle handle, void *cuda_stream);
/* The backend the handle was created with ("auto" or a name). */
const char *flashc_handle_backend(flashc_handle handle);
/* The backend the last successful call on this handle actually ran ("" before any). */
const char *flashc_handle_last_backend(flashc_handle handle);

/* ---- attention ------------------------------------------------------------------------------------ */
/* Forward: o = attention(q, k, v); lse may be NULL. q, k, v, o share one dtype. */
flashc_status flashc_forward(flashc_handle handle, const flashc_params *params, const flashc_tensor *q,
                             const flashc_tensor *k, const flashc_tensor *v, flashc_tensor *o, float *lse);

/* Backward: from the forward's o and lse and the output gradient dout, write dq, dk, dv (same shapes as
 * q, k, v; overwritten, not accumulated). All tensors share one dtype; lse is the forward's. */
flashc_status flashc_backward(flashc_handle handle, const flashc_params *params, const flashc_tensor *q,
                              const flashc_tensor *k, const flashc_tensor *v, const flashc_tensor *o, const float *lse,
                              const flashc_tensor *dout, flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);

/* ==== ring attention (context parallelism) ============================================================ */
/* N ranks each hold one shard of the sequence of q, k, v (and of o, lse, dout, dq, dk, dv). K and V travel
 * around the ring while every rank attends its queries to the block it holds, so each rank ends with its
 * shard of exact attention over the whole sequence: the same result as one device, up to rounding.
 *
 * Host tensors run on a CPU backend over MPI; device tensors on a CUDA backend over NCCL (one GPU per rank).
 * Every ring function except the shard helpers is collective: all ranks call it, in the same order, with
 * the same shapes, params and layout (checked: a mismatch fails on every rank with
 * FLASHC_ERR_INVALID_ARGUMENT). A rank that dies or never arrives makes the others fail with
 * FLASHC_ERR_COMMUNICATION once no progress was made for the timeout; the ring is then unusable (destroy
 * it). Params (causal, window, align) describe the whole sequence of seqlen N·(local seqlen); varlen
 * (cu_seqlens) is not supported. dtypes f32, f16, bf16; heads and head dims as the backend supports. */
typedef struct flashc_ring_s *flashc_ring;

typedef enum flashc_ring_layout {
  /* rank r holds rows [r·L, (r+1)·L) of the whole sequence (L = the local seqlen) */
  FLASHC_RING_CONTIGUOUS = 0,
  /* the sequence in 2N chunks of L/2 rows; rank r holds chunk r, then chunk 2N−1−r: every rank gets the
   * same share of a causal mask's work. L must be even. */
  FLASHC_RING_ZIGZAG = 1
} flashc_ring_layout;

/* A ring over the ranks of an MPI communicator: mpi_comm points to an MPI_Comm (pass &comm), so this header
 * needs no mpi.h. MPI must be initialised (MPI_Init is enough: the ring calls MPI only from the thread that
 * calls it). The ring duplicates the communicator and sets MPI_ERRORS_RETURN on its copy only.
 * backend: as flashc_create ("auto", NULL, or a name). For device tensors the ring creates an NCCL
 * communicator from this one at the first device call, on CUDA device local_rank % device count (see
 * flashc_ring_device); device tensors must live there. */
flashc_status flashc_ring_create_mpi(flashc_ring *ring, const void *mpi_comm, const char *backend);
/* A ring over a caller's NCCL communicator (an ncclComm_t), for device tensors only, on the communicator's
 * device. The ring borrows it: destroy does not free it. But once a call returned FLASHC_ERR_COMMUNICATION the
 * ring has aborted it (ncclCommAbort, which frees it): do not use or destroy it then. A blocking communicator
 * (NCCL's default) can block the host inside NCCL while connecting to a peer that is gone; one made
 * non-blocking (ncclConfig_t.blocking = 0) lets the timeout cover that too. */
flashc_status flashc_ring_create_nccl(flashc_ring *ring, void *nccl_comm, const char *backend);
flashc_status flashc_ring_destroy(flashc_ring ring); /* NULL is fine; not collective for MPI rings */

/* This rank and the number of ranks. */
flashc_status flashc_ring_info(flashc_ring ring, int *rank, int *world);
/* The CUDA device device calls use: −1 when there is none. */
int flashc_ring_device(flashc_ring ring);
/* The handle the ring computes with: set its threads (CPU) or stream (CUDA) with flashc_set_threads /
 * flashc_set_stream. Owned by the ring. NULL for a NULL ring. */
flashc_handle flashc_ring_handle(flashc_ring ring);
/* Give up on a peer after timeout_ms without progress; 0 waits forever. Default: the environment variable
 * FLASHC_RING_TIMEOUT_MS, else 300000 (5 minutes). Local: set the same on every rank. */
flashc_status flashc_ring_set_timeout(flashc_ring ring, int64_t timeout_ms);

/* Forward on this rank's shards: q [batch, L_q, heads_q, d], k, v [batch, L_k, heads_kv, d] → o (as q)
 * and lse [batch, heads_q, L_q] (may be NULL). Device calls return once the result is complete. */
flashc_status flashc_ring_forward(flashc_ring ring, const flashc_params *params, flashc_ring_layout layout,
                                  const flashc_tensor *q, const flashc_tensor *k, const flashc_tensor *v,
                                  flashc_tensor *o, float *lse);
/* Backward on this rank's shards, from the ring forward's o and lse: dq, dk, dv (overwritten). */
flashc_status flashc_ring_backward(flashc_ring ring, const flashc_params *params, flashc_ring_layout layout,
                                   const flashc_tensor *q, const flashc_tensor *k, const flashc_tensor *v,
                                   const flashc_tensor *o, const float *lse, const flashc_tensor *dout,
                                   flashc_tensor *dq, flashc_tensor *dk, flashc_tensor *dv);

/* Host-memory helpers, not collective. shard copies rank `rank`'s rows of a whole tensor [b, S, h, d] into
 * shard [b, S/world, h, d] (same dtype); unshard copies them back into their place in `full`. S must be a
 * multiple of world (contiguous) or of 2·world (zigzag). Both tensors are checked as flashc_forward's are
 * (sizes, strides, offsets that overflow, NULL and alignment), and the one written must not overlap the other. */
flashc_status flashc_ring_shard(flashc_ring_layout layout, int world, int rank, const flashc_tensor *full,
                                flashc_tensor *shard);
flashc_status flashc_ring_unshard(flashc_ring_layout layout, int world, int rank, const flashc_tensor *shard,
                                  flashc_tensor *full);
/* The same for lse: full [batch, heads, seqlen], shard [batch, heads, seqlen / world], contiguous fp32,
 * checked alike (batch ≥ 0, heads ≥ 1, sizes whose offsets fit). */
flashc_status flashc_ring_shard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                    int64_t seqlen, const float *full, float *shard);
flashc_status flashc_ring_unshard_lse(flashc_ring_layout layout, int world, int rank, int64_t batch, int64_t heads,
                                      int64_t seqlen, const float *shard, float *full);
/* ==== end of ring attention =========================================================================== */

/* ==== attention over a KV cache (decoding) ============================================================ */
/* Inference steps: a few new query rows per sequence attend over the keys and values that earlier steps left in
 * a cache, as FlashAttention's flash_attn_with_kvcache. The cache is dense (one slot of `capacity` rows per
 * sequence) or paged (blocks of page_size rows anywhere in a pool, listed per sequence in a block table):
 *
 *   q, o            : [batch, seqlen_q, heads_q, head_dim]          (seqlen_q: the new rows; 1 when decoding)
 *   k_cache, v_cache: dense  [batch, capacity, heads_kv, head_dim]
 *                     paged  [num_blocks, page_size, heads_kv, head_dim]; key j of sequence b is row
 *                            j % page_size of block block_table[b·block_table_stride + j / page_size]
 *   block_table     : NULL (dense), or int32 [batch, max_blocks_per_seq]: capacity = max_blocks_per_seq·page_size
 *   cache_seqlens   : int32 [batch], the keys already in each sequence's cache; NULL: every cache is full
 *   k_new, v_new    : NULL, or [batch, seqlen_new, heads_kv, head_dim]: written in place into the cache at rows
 *                     cache_seqlens[b] .. cache_seqlens[b] + seqlen_new − 1 before attending
 *   lse             : NULL, or [batch, heads_q, seqlen_q] fp32
 * Sequence b attends over its first len_b = cache_seqlens[b] + seqlen_new keys (seqlen_new = 0 without k_new)
 * with the mask of flashc_params for seqlen_k = len_b: with the default align, causal is bottom-right within each
 * sequence (query row i sees keys j ≤ i + len_b − seqlen_q: the last new row sees the last key); windows and
 * GQA/MQA as in flashc_forward. A row that sees no key (len_b = 0, or a mask) gives o = 0 and lse = −inf.
 *
 * block_table and cache_seqlens live where the tensors do: host memory for CPU backends, device memory for CUDA
 * backends (so that a call needs no host synchronisation). On the host every length and every block index the
 * call uses is checked before anything is written: len_b ≤ capacity, the first ⌈len_b / page_size⌉ entries of
 * each row of block_table in [0, num_blocks) (entries past them are never read, and may hold anything), and no
 * row that one sequence appends is a row another sequence uses. On the device the host cannot read them without
 * waiting for the GPU, so the CUDA kernels check instead, and never read or write outside the caches: a sequence
 * whose length is negative or past the capacity, or one of whose first ⌈len_b / page_size⌉ block-table entries lies
 * outside [0, num_blocks), appends nothing and gets o = NaN and lse = NaN (the call still returns FLASHC_OK); rows
 * appended into a block that another sequence also uses leave that sequence's results unspecified. The CUDA backends
 * (cuda-mma and cuda-hopper, sm_80+) take f16 and bf16 and head_dim ≤ 256. Their call waits for nothing on the host
 * and allocates only when the handle's device workspace must grow (the first call of a shape), so after one call
 * outside a capture, on the same handle and stream, it can be captured in a CUDA graph; a replay reads
 * cache_seqlens and block_table as they are then.
 *
 * Aliasing: o and lse must not share memory with anything else; with k_new, the caches are outputs too and must
 * not share an element with each other, q, o, k_new or v_new. dtypes: one for q, o and every tensor here. */
typedef struct flashc_kvcache {
  size_t struct_size;           /* sizeof(flashc_kvcache) where the caller was compiled: flashc_kvcache_default */
  flashc_tensor k_cache;        /* dense [batch, capacity, heads_kv, d] or paged [num_blocks, page_size, heads_kv, d] */
  flashc_tensor v_cache;        /* the same sizes as k_cache */
  const int32_t *block_table;   /* NULL: dense caches; else [batch, max_blocks_per_seq] block indices */
  int64_t max_blocks_per_seq;   /* columns of block_table */
  int64_t block_table_stride;   /* elements between rows of block_table; 0: max_blocks_per_seq */
  const int32_t *cache_seqlens; /* [batch] keys in each cache before this call; NULL: every cache is full */
  const flashc_tensor *k_new;   /* NULL, or [batch, seqlen_new, heads_kv, d], appended before attending */
  const flashc_tensor *v_new;   /* NULL exactly when k_new is */
  int num_splits;               /* key splits merged through the lse: 0 = the plan chooses; else at most */
} flashc_kvcache;

/* As flashc_params: the library reads struct_size bytes and gives later fields their defaults; a struct_size
 * larger than the library's is refused. Build the struct from this function. */
static inline flashc_kvcache flashc_kvcache_default(void) {
  const flashc_tensor none = {NULL, FLASHC_F32, {0, 0, 0, 0}, {0, 0, 0, 0}};
  flashc_kvcache c;
  c.struct_size = sizeof c;
  c.k_cache = none;
  c.v_cache = none;
  c.block_table = NULL;
  c.max_blocks_per_seq = 0;
  c.block_table_stride = 0;
  c.cache_seqlens = NULL;
  c.k_new = NULL;
  c.v_new = NULL;
  c.num_splits = 0;
  return c;
}

/* o = attention(q, the cache after appending k_new/v_new); see above. params: scale, causal, align, windows
 * (NULL: the defaults); varlen (cu_seqlens, seqused) is refused as invalid here, softcap and ALiBi as unsupported
 * (not yet). The `cpu` backend's results are bit-identical at every thread count (its key splits depend on the
 * shape and num_splits only). Returns once the work is done (CPU) or enqueued on the handle's stream (CUDA). */
flashc_status flashc_forward_kvcache(flashc_handle handle, const flashc_tensor *q, const flashc_kvcache *cache,
                                     flashc_tensor *o, float *lse, const flashc_params *params);
/* ==== end of attention over a KV cache ================================================================ */

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_H */
