/*
 * test_nonfinite.c — NaN, infinities and values past fp32's range, on every usable backend (flashc.h,
 * "Non-finite values").
 *
 * Each case changes one row of random inputs (a NaN in a query row, a NaN, +inf or −inf in a key) or scales
 * them towards fp32's limits (a scale of 1e38, values up to 2e38). The oracle cpu-ref is checked against what
 * the semantics say, row by row (which rows are NaN, which see no key and give o = 0, lse = −inf, which are
 * finite), and every backend against cpu-ref element by element: NaN where it is NaN, the same infinity where
 * it is infinite, and close where it is finite. Outputs are poisoned first (the poison is a NaN of its own
 * bits, told apart from a computed one), so an unwritten element fails too.
 *
 * The backward is checked where its pattern does not depend on the order of a backend's tiles: no mask where
 * an input is not finite, so that a row that meets a NaN meets it whole (with a mask, a kernel multiplies a hidden
 * key's 0 weight by its NaN within a tile, as a dense PyTorch product does everywhere). On CUDA backends, which compute
 * in fp32, the cases past fp32's range only have to make the overflow visible: each row matches cpu-ref or holds a
 * non-finite value, never a wrong finite one.
 *
 * Environment: FLASHC_TEST_BACKENDS=cpu,cuda-mma (only these), FLASHC_TEST_SEED=n (repeat a run).
 */
#include "harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the cases ------------------------------------------------------------------------------------------ */
typedef enum { NONE, NAN_Q, NAN_K, POS_INF_K, NEG_INF_K } change;

typedef struct nf_case {
  const char *name;
  int64_t sq, sk;
  int causal; /* bottom-right */
  int bwd;    /* check the backward too */
  change what;
  int64_t row;          /* the query (head 0) or key row changed */
  float scale;          /* 0: 1/√d */
  double qk_mul, v_mul; /* q, k and v multiplied by these */
  int range;            /* past fp32's range: a fp32 backend may give non-finite rows (see the top) */
} nf_case;

enum { HQ = 2, HKV = 1, D = 40 }; /* GQA: both query heads read the changed key */

static const nf_case cases[] = {
    {"nan-query-row", 70, 70, 0, 1, NAN_Q, 5, 0.0f, 1, 1, 0},
    {"nan-query-row-causal", 70, 70, 1, 0, NAN_Q, 20, 0.0f, 1, 1, 0},
    {"nan-key", 70, 70, 0, 1, NAN_K, 10, 0.0f, 1, 1, 0},
    {"nan-key-causal", 70, 70, 1, 0, NAN_K, 10, 0.0f, 1, 1, 0},
    {"pos-inf-key-causal", 70, 70, 1, 0, POS_INF_K, 10, 0.0f, 1, 1, 0},
    {"neg-inf-key", 70, 70, 0, 1, NEG_INF_K, 10, 0.0f, 1, 1, 0},
    /* sq > sk, bottom-right: rows 0..19 see no key and keep o = 0, lse = −inf beside NaN rows (≥ 50) */
    {"nan-key-masked-rows", 70, 50, 1, 0, NAN_K, 30, 0.0f, 1, 1, 0},
    {"scale-1e38", 70, 70, 0, 1, NONE, 0, 1e38f, 1, 1, 1},
    /* |scale| < 1e-30: cuda-mma's backward takes fa2 with the deterministic dQ pass even when not asked for */
    {"scale-1e-35", 70, 70, 1, 1, NONE, 0, 1e-35f, 1, 1, 0},
    {"qk-near-max", 70, 70, 0, 1, NONE, 0, 0.0f, 4e37, 1, 1},
    {"v-near-max", 70, 70, 1, 1, NONE, 0, 0.0f, 1, 5e37, 1},
};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- one problem: inputs, and cpu-ref's outputs ---------------------------------------------------------- */
typedef struct problem {
  const nf_case *c;
  flashc_dtype dt;
  th_attn a;
  th_tensor q, k, v, dout;
  double *o_ref, *lse_ref, *dq_ref, *dk_ref, *dv_ref;
} problem;

static void set(th_tensor *t, flashc_dtype dt, int64_t s, int64_t h, int64_t c, double x) {
  th_store(t->view.data, dt, th_index(&t->view, 0, s, h, c), x);
}
static double get(const th_tensor *t, flashc_dtype dt, int64_t s, int64_t h, int64_t c) {
  return th_load(t->view.data, dt, th_index(&t->view, 0, s, h, c));
}

static void scale_all(th_tensor *t, flashc_dtype dt, int64_t rows, int64_t heads, double mul) {
  for (int64_t s = 0; s < rows; s++)
    for (int64_t h = 0; h < heads; h++)
      for (int64_t c = 0; c < D; c++) set(t, dt, s, h, c, mul * get(t, dt, s, h, c));
}

static void setup(problem *p, const nf_case *c, flashc_dtype dt, th_rng *rng) {
  memset(p, 0, sizeof *p);
  p->c = c, p->dt = dt;
  p->a = (th_attn){.batch = 1, .seqlen_q = c->sq, .seqlen_k = c->sk, .heads_q = HQ, .heads_kv = HKV, .head_dim = D};
  p->a.params = flashc_params_default();
  p->a.params.causal = c->causal;
  p->a.params.align = FLASHC_ALIGN_BOTTOM_RIGHT;
  p->a.params.scale = c->scale;
  p->q = th_tensor_new(dt, TH_BSHD, 1, c->sq, HQ, D);
  p->k = th_tensor_new(dt, TH_BSHD, 1, c->sk, HKV, D);
  p->v = th_tensor_new(dt, TH_BSHD, 1, c->sk, HKV, D);
  p->dout = th_tensor_new(dt, TH_BSHD, 1, c->sq, HQ, D);
  th_fill_normal(&p->q, rng), th_fill_normal(&p->k, rng), th_fill_normal(&p->v, rng), th_fill_normal(&p->dout, rng);
  /* An infinite component 0 of a key gives every query an infinite score of the sign of its component 0:
   * made positive, so that the sign is the key's. */
  if (c->what == POS_INF_K || c->what == NEG_INF_K)
    for (int64_t s = 0; s < c->sq; s++)
      for (int64_t h = 0; h < HQ; h++) set(&p->q, dt, s, h, 0, fabs(get(&p->q, dt, s, h, 0)));
  if (c->qk_mul != 1) scale_all(&p->q, dt, c->sq, HQ, c->qk_mul), scale_all(&p->k, dt, c->sk, HKV, c->qk_mul);
  if (c->v_mul != 1) scale_all(&p->v, dt, c->sk, HKV, c->v_mul);
  switch (c->what) {
  case NAN_Q: set(&p->q, dt, c->row, 0, 3, NAN); break;
  case NAN_K: set(&p->k, dt, c->row, 0, 7, NAN); break;
  case POS_INF_K: set(&p->k, dt, c->row, 0, 0, INFINITY); break;
  case NEG_INF_K: set(&p->k, dt, c->row, 0, 0, -INFINITY); break;
  case NONE: break;
  }
}

static void teardown(problem *p) {
  th_tensor_free(&p->q), th_tensor_free(&p->k), th_tensor_free(&p->v), th_tensor_free(&p->dout);
  free(p->o_ref), free(p->lse_ref), free(p->dq_ref), free(p->dk_ref), free(p->dv_ref);
}

/* ---- element checks ------------------------------------------------------------------------------------- */
/* Is element i of a buffer of dtype dt the poison (TH_POISON_BYTE in every byte)? */
static bool is_poison(const void *base, flashc_dtype dt, int64_t i) {
  const size_t n = flashc_dtype_size(dt);
  const uint8_t *b = (const uint8_t *)base + (size_t)i * n;
  for (size_t j = 0; j < n; j++)
    if (b[j] != TH_POISON_BYTE) return false;
  return true;
}

/* x against cpu-ref's r: NaN ⇔ NaN, the same infinity, else |x − r| ≤ tol. */
static bool same(double x, double r, double tol) {
  if (isnan(r)) return isnan(x);
  if (isinf(r)) return x == r;
  return isfinite(x) && fabs(x - r) <= tol;
}

static double tol_for(flashc_dtype dt, const double *ref, int64_t n) {
  return (dt == FLASHC_F32 ? 2e-4 : 3e-2) * fmax(th_abs_max(ref, n), 1.0);
}

/* Compares a backend's view t with cpu-ref's dense ref row by row ([s][h][D]). relaxed: a row that differs
 * passes when the backend's row holds a non-finite value (an overflow made visible). Returns the number of
 * rows that failed; prints the first. */
static int64_t compare_rows(const char *who, const char *what, const th_tensor *t, const double *ref, int64_t rows,
                            int64_t heads, flashc_dtype dt, bool relaxed, int64_t *relaxed_rows) {
  const double tol = tol_for(dt, ref, rows * heads * D);
  int64_t bad = 0;
  for (int64_t s = 0; s < rows; s++)
    for (int64_t h = 0; h < heads; h++) {
      bool ok = true, finite = true, poison = false;
      int64_t first = -1;
      for (int64_t c = 0; c < D; c++) {
        const int64_t at = th_index(&t->view, 0, s, h, c);
        const double x = th_load(t->view.data, dt, at), r = ref[(s * heads + h) * D + c];
        poison |= is_poison(t->view.data, dt, at);
        finite &= isfinite(x) != 0;
        if (!same(x, r, tol) && first < 0) first = c, ok = false;
      }
      if (poison)
        ok = false;
      else if (!ok && relaxed && !finite)
        ok = true, ++*relaxed_rows;
      if (!ok && bad++ == 0) {
        const int64_t c = first < 0 ? 0 : first;
        th_fail("%s %s: row %lld head %lld col %lld: %g, cpu-ref %g%s", who, what, (long long)s, (long long)h,
                (long long)c, th_load(t->view.data, dt, th_index(&t->view, 0, s, h, c)), ref[(s * heads + h) * D + c],
                poison ? " (poison: not written)" : "");
      }
    }
  return bad;
}

static int64_t compare_lse(const char *who, const float *lse, const double *ref, int64_t n, bool relaxed,
                           int64_t *relaxed_rows) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) {
    bool ok = same(lse[i], ref[i], 1e-4 * fmax(fabs(ref[i]), 1.0)) && !is_poison(lse, FLASHC_F32, i);
    if (!ok && relaxed && !isfinite(lse[i]) && !is_poison(lse, FLASHC_F32, i)) ok = true, ++*relaxed_rows;
    if (!ok && bad++ == 0) th_fail("%s lse[%lld]: %g, cpu-ref %g", who, (long long)i, lse[i], ref[i]);
  }
  return bad;
}

/* ---- the oracle, against the semantics ----------------------------------------------------------------- */
/* Does query row i (of head h) meet the changed input? The NaN query row only in head 0; a changed key in
 * every row that sees it. */
static bool row_meets(const problem *p, int64_t h, int64_t i) {
  const nf_case *c = p->c;
  int64_t lo, hi;
  th_key_range(&p->a, c->sq, c->sk, i, &lo, &hi);
  switch (c->what) {
  case NAN_Q: return i == c->row && h == 0;
  case NAN_K:
  case POS_INF_K: return lo <= c->row && c->row < hi;
  default: return false;
  }
}

static double *dense_lse(const float *lse, int64_t n) {
  double *x = malloc((size_t)n * sizeof *x);
  for (int64_t i = 0; i < n; i++) x[i] = lse[i];
  return x;
}

/* Row by row: NaN rows exactly where the change reaches, o = 0 and lse = −inf where no key is seen, finite
 * elsewhere (lse may be +inf past fp32's range). */
static void check_oracle_forward(const problem *p) {
  const nf_case *c = p->c;
  int64_t wrong = 0;
  for (int64_t h = 0; h < HQ; h++)
    for (int64_t i = 0; i < c->sq; i++) {
      int64_t lo, hi;
      th_key_range(&p->a, c->sq, c->sk, i, &lo, &hi);
      const double *o = p->o_ref + (i * HQ + h) * D, lse = p->lse_ref[th_lse_index(&p->a, 0, h, i)];
      bool ok = true;
      if (row_meets(p, h, i)) {
        ok = isnan(lse);
        for (int64_t x = 0; x < D; x++) ok &= isnan(o[x]) != 0;
      } else if (lo >= hi) {
        ok = lse == -INFINITY;
        for (int64_t x = 0; x < D; x++) ok &= o[x] == 0.0;
      } else {
        ok = !isnan(lse) && (lse != -INFINITY || c->range); /* past the range: ±inf, rounded from fp64 */
        for (int64_t x = 0; x < D; x++) ok &= isfinite(o[x]) != 0;
      }
      if (!ok && wrong++ == 0)
        th_fail("%s: cpu-ref forward row %lld head %lld: o[0] %g lse %g breaks the semantics", c->name, (long long)i,
                (long long)h, o[0], lse);
    }
  th_check(wrong == 0, "%s: cpu-ref forward: %lld rows break the semantics", c->name, (long long)wrong);
}

static int64_t count_nan(const double *x, int64_t n) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) k += isnan(x[i]) != 0;
  return k;
}

/* The backward cases have no mask: a NaN query row makes its dq row and every dk, dv NaN and nothing else;
 * a NaN key everything; a key with a −inf component (weight 0) that component of every dq row (0·inf in
 * dq = dS·K, as in PyTorch), and dk, dv stay finite. */
static void check_oracle_backward(const problem *p) {
  const nf_case *c = p->c;
  const int64_t nq = c->sq * HQ * D, nk = c->sk * HKV * D;
  int64_t want_dq = 0, want_dkv = 0;
  switch (c->what) {
  case NAN_Q: want_dq = D, want_dkv = nk; break;
  case NAN_K: want_dq = nq, want_dkv = nk; break;
  case NEG_INF_K: want_dq = c->sq * HQ; break; /* column 0 of dq, the key's infinite one */
  default: break;
  }
  const int64_t got_dq = count_nan(p->dq_ref, nq), got_dk = count_nan(p->dk_ref, nk), got_dv = count_nan(p->dv_ref, nk);
  th_check(got_dq == want_dq && got_dk == want_dkv && got_dv == want_dkv,
           "%s: cpu-ref backward: NaN in dq %lld (want %lld), dk %lld and dv %lld (want %lld)", c->name,
           (long long)got_dq, (long long)want_dq, (long long)got_dk, (long long)got_dv, (long long)want_dkv);
  if (c->what == NAN_Q)
    for (int64_t x = 0; x < D; x++)
      if (!isnan(p->dq_ref[(c->row * HQ + 0) * D + x])) {
        th_fail("%s: cpu-ref dq of the NaN row is not NaN", c->name);
        break;
      }
}

static bool reference(problem *p, const th_backend *ref) {
  const nf_case *c = p->c;
  const int64_t nl = th_lse_numel(&p->a);
  th_tensor o = th_tensor_new(p->dt, TH_BSHD, 1, c->sq, HQ, D);
  float *lse = malloc((size_t)nl * sizeof *lse);
  flashc_status s = th_forward(ref, &p->a.params, &p->q, &p->k, &p->v, &o, lse, nl);
  bool ok =
      th_check(s == FLASHC_OK, "%s: cpu-ref forward: %s: %s", c->name, flashc_status_string(s), flashc_last_error());
  if (ok) {
    p->o_ref = th_dense(&o), p->lse_ref = dense_lse(lse, nl);
    check_oracle_forward(p);
  }
  if (ok && c->bwd) {
    th_tensor dq = th_tensor_new(p->dt, TH_BSHD, 1, c->sq, HQ, D), dk = th_tensor_new(p->dt, TH_BSHD, 1, c->sk, HKV, D),
              dv = th_tensor_new(p->dt, TH_BSHD, 1, c->sk, HKV, D);
    s = th_backward(ref, &p->a.params, &p->q, &p->k, &p->v, &o, lse, nl, &p->dout, &dq, &dk, &dv);
    ok =
        th_check(s == FLASHC_OK, "%s: cpu-ref backward: %s: %s", c->name, flashc_status_string(s), flashc_last_error());
    if (ok) {
      p->dq_ref = th_dense(&dq), p->dk_ref = th_dense(&dk), p->dv_ref = th_dense(&dv);
      check_oracle_backward(p);
    }
    th_tensor_free(&dq), th_tensor_free(&dk), th_tensor_free(&dv);
  }
  th_tensor_free(&o);
  free(lse);
  return ok;
}

/* ---- one backend ---------------------------------------------------------------------------------------- */
static bool exact_backend(const th_backend *b) {
  return strcmp(b->info.name, "cpu") == 0 || strcmp(b->info.name, "cpu-ref") == 0;
}

static void run_backend(const th_backend *b, const problem *p) {
  const nf_case *c = p->c;
  const bool relaxed = c->range && !exact_backend(b);
  const int64_t nl = th_lse_numel(&p->a);
  char who[160];
  snprintf(who, sizeof who, "%s %s %s", c->name, b->info.name, flashc_dtype_name(p->dt));
  th_tensor o = th_tensor_new(p->dt, TH_BSHD, 1, c->sq, HQ, D);
  float *lse = malloc((size_t)nl * sizeof *lse);
  int64_t relaxed_rows = 0;
  const int failures = th_failures();
  flashc_status s = th_forward(b, &p->a.params, &p->q, &p->k, &p->v, &o, lse, nl);
  if (s == FLASHC_ERR_UNSUPPORTED && !exact_backend(b)) { /* a refused shape (with a message): not the subject */
    printf("%-40s unsupported (skipped): %s\n", who, flashc_last_error());
    th_tensor_free(&o);
    free(lse);
    return;
  }
  if (th_check(s == FLASHC_OK, "%s forward: %s: %s", who, flashc_status_string(s), flashc_last_error())) {
    int64_t bad = compare_rows(who, "o", &o, p->o_ref, c->sq, HQ, p->dt, relaxed, &relaxed_rows);
    bad += compare_lse(who, lse, p->lse_ref, nl, relaxed, &relaxed_rows);
    th_check(bad == 0, "%s forward: %lld rows differ from cpu-ref", who, (long long)bad);
    if (c->bwd && b->info.has_backward) {
      th_tensor dq = th_tensor_new(p->dt, TH_BSHD, 1, c->sq, HQ, D),
                dk = th_tensor_new(p->dt, TH_BSHD, 1, c->sk, HKV, D),
                dv = th_tensor_new(p->dt, TH_BSHD, 1, c->sk, HKV, D);
      s = th_backward(b, &p->a.params, &p->q, &p->k, &p->v, &o, lse, nl, &p->dout, &dq, &dk, &dv);
      if (s == FLASHC_ERR_UNSUPPORTED && !exact_backend(b))
        printf("%-40s backward unsupported (skipped): %s\n", who, flashc_last_error());
      else if (th_check(s == FLASHC_OK, "%s backward: %s: %s", who, flashc_status_string(s), flashc_last_error())) {
        bad = compare_rows(who, "dq", &dq, p->dq_ref, c->sq, HQ, p->dt, relaxed, &relaxed_rows);
        bad += compare_rows(who, "dk", &dk, p->dk_ref, c->sk, HKV, p->dt, relaxed, &relaxed_rows);
        bad += compare_rows(who, "dv", &dv, p->dv_ref, c->sk, HKV, p->dt, relaxed, &relaxed_rows);
        th_check(bad == 0, "%s backward: %lld rows differ from cpu-ref", who, (long long)bad);
      }
      th_tensor_free(&dq), th_tensor_free(&dk), th_tensor_free(&dv);
    }
  }
  printf("%-40s %s%s\n", who, th_failures() > failures ? "FAILED" : "ok",
         relaxed_rows ? " (rows past fp32's range came out non-finite, as fp32 gives them)" : "");
  th_tensor_free(&o);
  free(lse);
}

int main(void) {
  th_begin("test_nonfinite");
  th_rng rng;
  th_rng_init(&rng, th_seed());
  th_backend ref;
  if (!th_backend_open(&ref, "cpu-ref")) return th_end();

  const int count = flashc_backend_count();
  th_backend *backends = calloc((size_t)count, sizeof *backends);
  int nb = 0;
  for (int i = 0; i < count; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK || !th_env_list_has("FLASHC_TEST_BACKENDS", info.name)) continue;
    if (!info.usable) {
      printf("%s: skipped (%s)\n", info.name, info.why_unusable);
      continue;
    }
    if (th_backend_open(&backends[nb], info.name)) nb++;
  }

  for (int ci = 0; ci < NCASES; ci++) {
    const nf_case *c = &cases[ci];
    /* f32 where a backend has it, else bf16 (fp32's range in 8 bits of mantissa); f16 cannot hold the values
     * near 3e38. The reference runs in each dtype that some backend needs. */
    for (int dt = FLASHC_F32; dt <= FLASHC_BF16; dt++) {
      if (dt == FLASHC_F16) continue;
      int users = 0;
      for (int i = 0; i < nb; i++) {
        const unsigned m = backends[i].info.dtypes;
        const int pick = (m & (1u << FLASHC_F32)) ? FLASHC_F32 : FLASHC_BF16;
        users += (m & (1u << pick)) && pick == dt && D >= backends[i].info.min_head_dim &&
                 D <= backends[i].info.max_head_dim;
      }
      if (!users) continue;
      problem p;
      setup(&p, c, (flashc_dtype)dt, &rng);
      if (reference(&p, &ref))
        for (int i = 0; i < nb; i++) {
          const unsigned m = backends[i].info.dtypes;
          const int pick = (m & (1u << FLASHC_F32)) ? FLASHC_F32 : FLASHC_BF16;
          if (pick == dt && (m & (1u << dt))) run_backend(&backends[i], &p);
        }
      teardown(&p);
    }
  }
  for (int i = 0; i < nb; i++) th_backend_close(&backends[i]);
  free(backends);
  th_backend_close(&ref);
  return th_end();
}
