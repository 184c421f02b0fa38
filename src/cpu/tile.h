/*
 * tile.h — what the tiled `cpu` forward and backward share: tiles moved between the caller's tensors (any
 * dtype, any strides) and fp32 scratch, in the two layouts the kernels read (row-major for a left operand,
 * panels for a right one: kernels.h), the mask of a tile, the ranges of keys and queries that a block can
 * see, and the numbering of the row blocks of every sequence as one list of tasks.
 *
 * A row-major tile of head_dim d has a row length (leading dimension) of at least fc_pad8(d) with the
 * padding columns written as 0: the kernels work on whole groups of 8 floats.
 */
#ifndef FLASHC_CPU_TILE_H
#define FLASHC_CPU_TILE_H

#include "../internal.h"
#include "kernels.h"

static inline int64_t fc_pad8(int64_t n) { return (n + 7) / 8 * 8; }
static inline int64_t fc_round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* The row length of a row-major tile that the kernels stream down (a right operand): rows of a power-of-two
 * number of cache lines would all fall in a few of L1's sets (64 sets of 64 bytes: rows of 256 bytes use
 * 16 of them, rows of 512 bytes 8) and evict each other long before L1 is full; one more line per row
 * spreads them over all sets. */
static inline int64_t fc_tile_ld(int64_t dp) { return dp % 32 == 0 ? dp + 16 : dp; }

/* Rows [row0, row0 + rows) of head h of sequence s (which starts at packed row `start`) of view v. In
 * every function below, element (r, c) is mul · v[row0 + r][c], converted once from the caller's dtype, and d
 * is the view's row length: fc_row_dim (head_dim_v for v, o, dout, dv; head_dim for the others). */
typedef struct fc_rows {
  const fc_view *v;
  int64_t s, start, row0, rows, h;
} fc_rows;

static inline int64_t fc_row_dim(const fc_problem *p, const fc_view *v) {
  return v == &p->v || v == &p->o || v == &p->dout || v == &p->dv ? p->head_dim_v : p->head_dim;
}

/* Row-major: dst[r·ld + c] for c < d; columns [d, fc_pad8(d)) are set to 0. */
void fc_tile_load(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ld);
/* n consecutive elements of the dtype from base + offset (in elements), times mul, into dst as fp32. */
void fc_tile_load_run(const fc_cpu_kernels *kern, flashc_dtype dtype, const void *base, int64_t offset, int64_t n,
                      float mul, float *dst);

/* Packed panels (kernels.h) of the rows, for a right operand B = the rows transposed (K = d, N = the rows):
 * element (r, c) at dst[(r / nr)·ps + c·nr + r % nr]; rows [rows, ⌈rows/nr⌉·nr) are set to 0. ps ≥ d·nr.
 * A row-major tile (fc_tile_load) is already a right operand B = the rows (K = the rows, N = d). */
void fc_tile_pack_t(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ps);

/* Packed panels of nr columns of the rows, for a right operand B = the rows (K = the rows, N = fc_pad8(d)):
 * element (r, c) at dst[(c / nr)·ps + r·nr + c % nr]; columns [d, ⌈d/nr⌉·nr) are set to 0. ps ≥ rows·nr.
 * The same operand as a row-major tile (fc_tile_load), with each panel's rows contiguous: the micro-kernel
 * streams one panel from start to end, at a stride it knows at compile time. */
void fc_tile_pack(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, float *dst, int64_t ps);

/* v[row0 + r][c] = mul · src[r·ld + c] for c < d, rounded once into the caller's dtype. */
void fc_tile_store(const fc_cpu_kernels *kern, const fc_problem *p, fc_rows at, float mul, const float *src,
                   int64_t ld);

/* S[r][c] = −inf where query i0 + r may not see key j0 + c, and for the padding columns c in
 * [valid_cols, cols): S = Q_i K_jᵀ becomes the masked score tile. sk is the sequence's key count. */
void fc_tile_mask(const fc_problem *p, int64_t shift, int64_t sk, int64_t i0, int64_t rows, int64_t j0,
                  int64_t valid_cols, int64_t cols, float *S, int64_t lds);

/* Softcap and ALiBi on a tile of base-2 scores (flash.h), before the mask: for query i0 + r and key j0 + c,
 *   softcap: S ← cap·log2 e · tanh(S), S holding x = (scale / cap)·q·k (the tile's operand carries scale / cap)
 *   ALiBi:   S ← S − slope·log2 e · |i + sk − sq − j|
 * T (NULL, or a tile like S) gets tanh(x) for the backward's dS. A tile without them is not touched: the caller
 * tests fc_score_mods_on once per tile. */
typedef struct fc_score_mods {
  float cap2;   /* softcap · log2 e; 0: no softcap */
  float slope2; /* ALiBi slope · log2 e; 0: no ALiBi */
  int64_t sq, sk;
} fc_score_mods;

static inline fc_score_mods fc_score_mods_of(const fc_problem *p, int64_t s, int64_t h, int64_t sq, int64_t sk) {
  fc_score_mods m = {p->softcap * 1.4426950408889634f, (float)(fc_alibi_slope(p, s, h) * 1.4426950408889634), sq, sk};
  return m;
}
static inline int fc_score_mods_on(const fc_score_mods *m) { return m->cap2 != 0.0f || m->slope2 != 0.0f; }

/* The multiplier of q·k that the tile's operand carries: scale·log2 e (base-2 scores), or scale / cap under
 * softcap (tanh's argument; fc_tile_score_mods turns it into a base-2 score). */
static inline float fc_score_mul(const fc_problem *p) {
  return p->softcap > 0.0f ? p->scale / p->softcap : p->scale * 1.4426950408889634f;
}

void fc_tile_score_mods(const fc_score_mods *m, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float *S,
                        int64_t lds, float *T);

/* attn_mask (fc_problem) on a tile of base-2 scores, after the modifiers and before fc_tile_mask: for query i0 + r
 * of (sequence s, query head h) and key j0 + c, c < cols (the keys loaded; the padding columns are left alone),
 *   a bias:          S ← S + log2 e · bias
 *   a boolean mask:  S ← −inf where the mask is 0
 * The caller tests p->attn_mask once per tile. */
void fc_tile_attn_mask(const fc_cpu_kernels *kern, const fc_problem *p, int64_t s, int64_t h, int64_t i0, int64_t rows,
                       int64_t j0, int64_t cols, float *S, int64_t lds);

/* Whether attn_mask removes every key of [lo, hi) from query i of (sequence s, query head h), a boolean mask by its
 * zeros or a bias by −inf: such a row's o = 0, lse = −inf and zero gradients are its exact answer, not a sign of
 * leaving fp32 (flash.h). false without a mask. */
bool fc_attn_mask_removes_all(const fc_problem *p, int64_t s, int64_t h, int64_t i, int64_t lo, int64_t hi);

/* Dropout (flashc.h, philox.h) of query row i of (sequence s, query head h) over keys [j0, j0 + n) of a sequence of
 * sk keys: keep[c] = 1 where the weight of key j0 + c is kept, 0 where it is dropped. */
void fc_dropout_keep_row(const fc_problem *p, int64_t s, int64_t h, int64_t sk, int64_t i, int64_t j0, int64_t n,
                         uint8_t *keep);
/* x[c] ← x[c]·mul where keep[c], x[c]·0 where not (0, or NaN from a non-finite x: IEEE, as cpu-ref multiplies). */
void fc_dropout_apply(const uint8_t *keep, int64_t n, float mul, float *x);

/* [*j_lo, *j_hi): a superset of the keys that any of the queries [i0, i1) may see (the mask's bounds grow
 * with i, so it runs from the first row's lower bound to the last row's upper bound). Empty if lo ≥ hi. */
static inline void fc_keys_seen(const fc_problem *p, int64_t shift, int64_t sk, int64_t i0, int64_t i1, int64_t *j_lo,
                                int64_t *j_hi) {
  int64_t unused;
  fc_key_range(p, shift, i0, sk, j_lo, &unused);
  fc_key_range(p, shift, i1 - 1, sk, &unused, j_hi);
}

/* [*i_lo, *i_hi): the queries of a sequence of sq rows that may see one of the keys [j0, j1). Query i sees
 * [i + shift − L, i + shift + R]; it meets [j0, j1) iff i ≥ j0 − shift − R and i < j1 − shift + L (a negative
 * L or R removes that bound). */
static inline void fc_rows_seeing(const fc_problem *p, int64_t shift, int64_t sq, int64_t j0, int64_t j1, int64_t *i_lo,
                                  int64_t *i_hi) {
  /* A window wider than any sequence is unbounded in effect; capping it keeps the sums below from overflowing. */
  const int64_t cap = INT64_C(1) << 40, L = p->window_left < cap ? p->window_left : cap,
                R = p->window_right < cap ? p->window_right : cap;
  int64_t lo = R < 0 ? 0 : j0 - shift - R;
  int64_t hi = L < 0 ? sq : j1 - shift + L;
  *i_lo = lo < 0 ? 0 : lo;
  *i_hi = hi > sq ? sq : hi;
}

/* The rows of a tile, queries [i0, i0+in) against keys [j0, j0+jn), that may see one of its keys, as
 * [*r_lo, *r_hi) relative to i0 (empty if r_lo ≥ r_hi): a causal diagonal or a window's edge cuts a tile,
 * and the rows above the cut need no work. */
static inline void fc_tile_rows(const fc_problem *p, int64_t shift, int64_t sq, int64_t i0, int64_t in, int64_t j0,
                                int64_t jn, int64_t *r_lo, int64_t *r_hi) {
  int64_t lo, hi;
  fc_rows_seeing(p, shift, sq, j0, j0 + jn, &lo, &hi);
  *r_lo = (lo > i0 ? lo : i0) - i0;
  *r_hi = (hi < i0 + in ? hi : i0 + in) - i0;
}

/* The blocks of `size` rows of every sequence, numbered 0 .. total−1 in sequence order, so that one
 * fc_parallel_for index names (sequence, block). */
typedef struct fc_blocks {
  int64_t size;
  int64_t batch;
  int64_t total;
  int64_t per_seq;      /* dense: blocks per sequence */
  const int64_t *first; /* varlen: first[s] = blocks of the sequences before s (batch + 1 entries), else NULL */
} fc_blocks;

/* The number of blocks of `size` rows over all sequences of p's queries (keys 0) or keys (keys 1), the used rows
 * under seqused (fc_seq_q/k): what fc_blocks_init's total will be, before any storage exists. */
int64_t fc_blocks_count(const fc_problem *p, int keys, int64_t size);

/* `first_storage`: batch + 1 int64 for varlen (unused otherwise). */
void fc_blocks_init(fc_blocks *b, const fc_problem *p, int keys, int64_t size, int64_t *first_storage);
/* Block g → its sequence *s and its index *block within that sequence. */
void fc_blocks_find(const fc_blocks *b, int64_t g, int64_t *s, int64_t *block);

#endif /* FLASHC_CPU_TILE_H */
