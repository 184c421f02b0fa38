/*
 * ring.c — `flashc ring`: ring attention across MPI ranks (one GPU per rank for CUDA backends).
 *
 *   mpirun -np N flashc ring --data DIR [--out DIR] [...]   every rank reads the whole inputs, takes its shard;
 *   mpirun -np N flashc ring --seqlen S ... --seed N [...]  or generates them from the same seed
 *     --check   rank 0 also runs the same backend on one device and cpu-ref on the whole tensors and
 *               compares (the bar of tests/ring: ring error <= 2 x single-device error + rounding floor)
 *     --bench   per-rank TFLOP/s of the ring and its efficiency: per-rank TFLOP/s over the single-device
 *               TFLOP/s on the whole shape (TARGETS.md); --csv FILE appends rows
 * Rank 0 writes the gathered outputs (o, lse, dq, dk, dv) to --out DIR (default: the --data directory).
 *
 * Its own option parser: the ring's flags (--layout, --check, --bench, --out, --timeout-ms) are not in
 * options.c's table. Every rank runs the same steps; after each step that can fail on one rank alone the
 * ranks agree on the outcome, so that no rank waits in a collective for one that gave up.
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef FLASHC_CLI_MPI
#include <mpi.h>
#endif
#ifdef FLASHC_CLI_CUDA
#include <cuda_runtime.h>
#endif

/* ---- options ----------------------------------------------------------------------------------------- */
typedef struct ring_opts {
  const char *data, *out, *backend, *csv;
  flashc_ring_layout layout;
  cli_mode mode;
  int dtype; /* a flashc_dtype, or −1: from the data (generated: f32) */
  int causal, check, bench;
  flashc_causal_align align;
  int64_t window_left, window_right;
  float scale;
  int64_t threads, batch, seqlen, seqlen_k, heads, heads_kv, head_dim, seed, repeats, warmup, timeout_ms;
  int gen_given;
} ring_opts;

typedef enum { O_STR, O_INT, O_SWITCH, O_SPECIAL } opt_kind;

typedef struct ring_flag {
  const char *name, *arg;
  opt_kind kind;
  size_t offset;
  int64_t min, max;
  int generation;
  const char *help;
} ring_flag;

#define AT(f) offsetof(ring_opts, f)
static const ring_flag flags[] = {
    {"data", "DIR", O_STR, AT(data), 0, 0, 0, "inputs q.npy k.npy v.npy [do.npy] (every rank reads them)"},
    {"out", "DIR", O_STR, AT(out), 0, 0, 0, "where rank 0 writes o, lse, dq, dk, dv (default: --data)"},
    {"backend", "NAME", O_STR, AT(backend), 0, 0, 0, "a backend of `flashc list` (default auto)"},
    {"layout", "contiguous|zigzag", O_SPECIAL, AT(layout), 0, 0, 0,
     "rank r holds rows [r·L, (r+1)·L), or chunks r and 2N-1-r of 2N (causal balance)"},
    {"mode", "fwd|bwd|both", O_SPECIAL, AT(mode), 0, 0, 0, "forward, or forward and backward"},
    {"dtype", "f32|f16|bf16", O_SPECIAL, AT(dtype), 0, 0, 0, "compute dtype (default: the data's, else f32)"},
    {"causal", NULL, O_SWITCH, AT(causal), 0, 0, 0, "causal mask over the whole sequence"},
    {"causal-align", "bottom-right|top-left", O_SPECIAL, AT(align), 0, 0, 0, "the diagonal when sq != sk"},
    {"window", "L,R", O_SPECIAL, AT(window_left), 0, 0, 0, "local attention; -1 = unbounded"},
    {"scale", "S", O_SPECIAL, AT(scale), 0, 0, 0, "softmax scale; 0 = 1/sqrt(head_dim)"},
    {"threads", "N", O_INT, AT(threads), 0, 4096, 0, "CPU threads per rank; 0 = all online processors"},
    {"batch", "B", O_INT, AT(batch), 1, 1 << 20, 1, "batch size"},
    {"seqlen", "S", O_INT, AT(seqlen), 1, 1 << 26, 1, "whole query sequence (a multiple of N, 2N for zigzag)"},
    {"seqlen-k", "SK", O_INT, AT(seqlen_k), 1, 1 << 26, 1, "whole key sequence (default: S)"},
    {"heads", "H", O_INT, AT(heads), 1, 4096, 1, "query heads"},
    {"heads-kv", "HKV", O_INT, AT(heads_kv), 1, 4096, 1, "key/value heads, dividing H (default: H)"},
    {"head-dim", "D", O_INT, AT(head_dim), 1, 1024, 1, "head dimension"},
    {"seed", "N", O_INT, AT(seed), 0, INT64_MAX, 1, "random seed (the same on every rank)"},
    {"check", NULL, O_SWITCH, AT(check), 0, 0, 0, "compare with one device and cpu-ref on rank 0; exit 1 on FAIL"},
    {"bench", NULL, O_SWITCH, AT(bench), 0, 0, 0, "time the ring; per-rank TFLOP/s and efficiency"},
    {"repeats", "N", O_INT, AT(repeats), 1, 100000, 0, "timed calls (median)"},
    {"warmup", "N", O_INT, AT(warmup), 0, 100000, 0, "untimed calls first"},
    {"csv", "FILE", O_STR, AT(csv), 0, 0, 0, "append bench rows (header first when new)"},
    {"timeout-ms", "T", O_INT, AT(timeout_ms), 0, INT64_MAX, 0, "give up on a silent peer (default 300000)"},
};
enum { N_FLAGS = sizeof flags / sizeof flags[0] };

/* The option lines of `flashc ring` (the extra help of its row in flashc.c's table, after "options:"). */
void cmd_ring_help(void) {
  for (int i = 0; i < N_FLAGS; i++) {
    char left[64];
    snprintf(left, sizeof left, "--%s%s%s", flags[i].name, flags[i].arg ? " " : "", flags[i].arg ? flags[i].arg : "");
    printf("  %-32s %s\n", left, flags[i].help);
  }
  printf("\nFLOPs: forward 4*b*hq*sq*sk*d (halved when causal), backward 2.5x; per-rank TFLOP/s divides them by N.\n"
         "Efficiency: per-rank TFLOP/s over one device's on the whole shape (the same backend, rank 0).\n");
}

static void print_help(void) {
  printf("usage: mpirun -np N flashc ring [--data DIR | --seqlen S --heads H ... --seed N] [--backend NAME]\n"
         "                  [--layout contiguous|zigzag] [--causal] [--mode fwd|bwd|both] [--check] [--bench]\n\n"
         "Ring attention over the N ranks: every rank holds 1/N of the sequence of q, k, v (its shard of the\n"
         "whole inputs), K/V blocks travel around the ring, and rank 0 gathers the outputs. CPU backends ring\n"
         "over MPI; CUDA backends over NCCL, one GPU per rank (local rank %% GPUs).\n\noptions:\n");
  cmd_ring_help();
}

static int parse_special(const ring_flag *f, const char *v, ring_opts *o) {
  if (f->offset == AT(layout)) {
    if (strcmp(v, "contiguous") == 0)
      o->layout = FLASHC_RING_CONTIGUOUS;
    else if (strcmp(v, "zigzag") == 0)
      o->layout = FLASHC_RING_ZIGZAG;
    else
      return cli_error("--layout: '%s' is not contiguous or zigzag", v);
  } else if (f->offset == AT(mode)) {
    if (strcmp(v, "fwd") == 0)
      o->mode = CLI_MODE_FWD;
    else if (strcmp(v, "bwd") == 0 || strcmp(v, "both") == 0)
      o->mode = CLI_MODE_BOTH; /* bwd needs the fwd */
    else
      return cli_error("--mode: '%s' is not fwd, bwd or both", v);
  } else if (f->offset == AT(dtype)) {
    flashc_dtype d;
    if (!cli_parse_dtype(v, &d) || d == FLASHC_F64) return cli_error("--dtype: '%s' is not f32, f16 or bf16", v);
    o->dtype = (int)d;
  } else if (f->offset == AT(align)) {
    if (strcmp(v, "bottom-right") == 0)
      o->align = FLASHC_ALIGN_BOTTOM_RIGHT;
    else if (strcmp(v, "top-left") == 0)
      o->align = FLASHC_ALIGN_TOP_LEFT;
    else
      return cli_error("--causal-align: '%s' is not bottom-right or top-left", v);
  } else if (f->offset == AT(window_left)) {
    long long l, r;
    char tail;
    if (sscanf(v, "%lld,%lld%c", &l, &r, &tail) != 2 || l < -1 || r < -1)
      return cli_error("--window: '%s' is not L,R with L, R >= -1", v);
    o->window_left = l;
    o->window_right = r;
  } else if (f->offset == AT(scale)) {
    char *end;
    double s = strtod(v, &end);
    if (*end || !isfinite(s) || s < 0) return cli_error("--scale: '%s' is not a number >= 0", v);
    o->scale = (float)s;
  }
  return CLI_OK;
}

/* CLI_OK, CLI_ERROR (message printed), or −1 for --help. */
static int parse_ring_options(int argc, char **argv, ring_opts *o) {
  memset(o, 0, sizeof *o);
  o->backend = "auto";
  o->mode = CLI_MODE_BOTH;
  o->dtype = -1;
  o->align = FLASHC_ALIGN_BOTTOM_RIGHT;
  o->window_left = o->window_right = -1;
  o->batch = 1, o->seqlen = 1024, o->heads = 8, o->head_dim = 64, o->seed = 1;
  o->repeats = 10, o->warmup = 3, o->timeout_ms = -1;
  int seqlen_k_given = 0, heads_kv_given = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
    if (strncmp(a, "--", 2) != 0) return cli_error("unexpected argument '%s' (see flashc ring --help)", a);
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const ring_flag *f = NULL;
    for (int j = 0; j < N_FLAGS && !f; j++)
      if (strlen(flags[j].name) == len && strncmp(flags[j].name, name, len) == 0) f = &flags[j];
    if (!f) return cli_error("unknown option '--%.*s' (see flashc ring --help)", (int)len, name);
    void *field = (char *)o + f->offset;
    if (f->kind == O_SWITCH) {
      if (eq) return cli_error("--%s takes no value", f->name);
      *(int *)field = 1;
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!v || !*v) return cli_error("--%s needs a value (%s)", f->name, f->arg);
    if (f->kind == O_STR) {
      *(const char **)field = v;
    } else if (f->kind == O_INT) {
      char *end;
      long long x = strtoll(v, &end, 10);
      if (*end || x < f->min || x > f->max)
        return cli_error("--%s: '%s' is not an integer in [%lld, %lld]", f->name, v, (long long)f->min,
                         (long long)f->max);
      *(int64_t *)field = x;
    } else if (parse_special(f, v, o)) {
      return CLI_ERROR;
    }
    o->gen_given |= f->generation;
    seqlen_k_given |= f->offset == AT(seqlen_k);
    heads_kv_given |= f->offset == AT(heads_kv);
  }
  if (!seqlen_k_given) o->seqlen_k = o->seqlen;
  if (!heads_kv_given) o->heads_kv = o->heads;
  if (o->data && o->gen_given)
    return cli_error("--data and the generation flags (--seqlen, --heads, ..., --seed) exclude each other");
  if (!o->out && o->data) o->out = o->data;
  return CLI_OK;
}

#ifdef FLASHC_CLI_MPI
/* ---- helpers ------------------------------------------------------------------------------------------- */
static int rank_, world_;

/* Every rank's rc → the worst: all ranks go on, or all stop. */
static int agree_rc(int rc) {
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

static int fail(flashc_status s) {
  (void)s;
  return cli_error("rank %d: %s", rank_, flashc_last_error());
}

/* Each rank's `bytes` into rank 0's all[world·bytes], in pieces that fit MPI's int counts. */
static void gather_bytes(const void *mine, size_t bytes, void *all) {
  const size_t piece = (size_t)1 << 28;
  char *tmp = rank_ == 0 ? malloc(piece * (size_t)world_) : NULL;
  for (size_t off = 0; off < bytes; off += piece) {
    size_t n = bytes - off < piece ? bytes - off : piece;
    MPI_Gather((const char *)mine + off, (int)n, MPI_BYTE, tmp, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank_ == 0)
      for (int r = 0; r < world_; r++) memcpy((char *)all + (size_t)r * bytes + off, tmp + (size_t)r * n, n);
  }
  free(tmp);
}

static double forward_flops(const cli_shape *s, int causal) {
  double f = 4.0 * (double)s->batch * (double)s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k * s->head_dim;
  return causal && s->seqlen_q == s->seqlen_k ? f / 2 : f;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- the tensors of one rank --------------------------------------------------------------------------- */
/* Whole tensors in the compute dtype on every rank (host), and this rank's shards (host or device). */
typedef struct shards {
  int on_device;
  void *full[4];          /* q k v do, whole, compute dtype (host) */
  void *q, *k, *v, *dout; /* shards */
  void *o, *dq, *dk, *dv; /* shard outputs */
  float *lse;
  flashc_tensor tq, tk, tv, tdo, to, tdq, tdk, tdv;
} shards;

static void *mem_alloc(int on_device, size_t bytes) {
  void *p = NULL;
  if (on_device) {
    if (cli_device_alloc(&p, bytes)) return NULL;
  } else if (!(p = malloc(bytes))) {
    cli_error("rank %d: out of memory (%zu bytes)", rank_, bytes);
  }
  return p;
}

static void mem_free(int on_device, void *p) {
  if (!p) return;
  if (on_device)
    cli_device_free(p);
  else
    free(p);
}

static void shards_free(shards *s) {
  for (int i = 0; i < 4; i++) free(s->full[i]);
  void *dev[] = {s->q, s->k, s->v, s->dout, s->o, s->dq, s->dk, s->dv, s->lse};
  for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) mem_free(s->on_device, dev[i]);
  memset(s, 0, sizeof *s);
}

static int make_shards(const ring_opts *o, const cli_inputs *in, flashc_dtype dt, int on_device, shards *s) {
  memset(s, 0, sizeof *s);
  s->on_device = on_device;
  const cli_shape *sh = &in->shape;
  int64_t lq = sh->seqlen_q / world_, lk = sh->seqlen_k / world_;
  size_t es = flashc_dtype_size(dt);
  int64_t nq = cli_q_elems(sh), nk = cli_k_elems(sh);
  const float *src[4] = {in->q, in->k, in->v, in->dout};
  int64_t n[4] = {nq, nk, nk, nq}, len[4] = {lq, lk, lk, lq},
          heads[4] = {sh->heads_q, sh->heads_kv, sh->heads_kv, sh->heads_q};
  void **local[4] = {&s->q, &s->k, &s->v, &s->dout};
  flashc_tensor *t[4] = {&s->tq, &s->tk, &s->tv, &s->tdo};
  void *host = NULL;
  for (int i = 0; i < 4; i++) {
    if (!src[i]) continue; /* no do: forward only */
    if (!(s->full[i] = mem_alloc(0, (size_t)n[i] * es))) return CLI_ERROR;
    cli_pack(src[i], s->full[i], dt, n[i]);
    flashc_tensor full = flashc_tensor_bshd(s->full[i], dt, sh->batch, n[i] / (sh->batch * heads[i] * sh->head_dim),
                                            heads[i], sh->head_dim);
    size_t bytes = (size_t)(sh->batch * len[i] * heads[i] * sh->head_dim) * es;
    free(host);
    if (!(host = mem_alloc(0, bytes))) return CLI_ERROR;
    flashc_tensor part = flashc_tensor_bshd(host, dt, sh->batch, len[i], heads[i], sh->head_dim);
    flashc_status st = flashc_ring_shard(o->layout, world_, rank_, &full, &part);
    if (st != FLASHC_OK) {
      free(host);
      return fail(st);
    }
    if (!(*local[i] = mem_alloc(on_device, bytes))) {
      free(host);
      return CLI_ERROR;
    }
    if (on_device ? cli_device_upload(*local[i], host, bytes) : (memcpy(*local[i], host, bytes), 0)) {
      free(host);
      return CLI_ERROR;
    }
    *t[i] = flashc_tensor_bshd(*local[i], dt, sh->batch, len[i], heads[i], sh->head_dim);
  }
  free(host);
  size_t qb = (size_t)(sh->batch * lq * sh->heads_q * sh->head_dim) * es,
         kb = (size_t)(sh->batch * lk * sh->heads_kv * sh->head_dim) * es;
  if (!(s->o = mem_alloc(on_device, qb)) ||
      !(s->lse = mem_alloc(on_device, (size_t)(sh->batch * sh->heads_q * lq) * 4)))
    return CLI_ERROR;
  s->to = flashc_tensor_bshd(s->o, dt, sh->batch, lq, sh->heads_q, sh->head_dim);
  if (in->dout) {
    if (!(s->dq = mem_alloc(on_device, qb)) || !(s->dk = mem_alloc(on_device, kb)) ||
        !(s->dv = mem_alloc(on_device, kb)))
      return CLI_ERROR;
    s->tdq = flashc_tensor_bshd(s->dq, dt, sh->batch, lq, sh->heads_q, sh->head_dim);
    s->tdk = flashc_tensor_bshd(s->dk, dt, sh->batch, lk, sh->heads_kv, sh->head_dim);
    s->tdv = flashc_tensor_bshd(s->dv, dt, sh->batch, lk, sh->heads_kv, sh->head_dim);
  }
  return CLI_OK;
}

/* A shard output (host or device) gathered into rank 0's whole tensor as doubles. */
static int gather_output(const ring_opts *o, const shards *s, const flashc_tensor *t, double **whole) {
  size_t es = flashc_dtype_size(t->dtype);
  int64_t n = t->size[0] * t->size[1] * t->size[2] * t->size[3];
  size_t bytes = (size_t)n * es;
  void *host = malloc(bytes), *all = rank_ == 0 ? malloc(bytes * (size_t)world_) : NULL, *full = NULL;
  int rc = host && (rank_ != 0 || all) ? CLI_OK : cli_error("rank %d: out of memory", rank_);
  if (!rc && s->on_device) rc = cli_device_download(host, t->data, bytes);
  if (!rc && !s->on_device) memcpy(host, t->data, bytes);
  rc = agree_rc(rc);
  if (!rc) gather_bytes(host, bytes, all);
  if (!rc && rank_ == 0) {
    flashc_tensor ft = *t;
    ft.size[1] *= world_;
    ft.stride[0] *= world_;
    full = malloc(bytes * (size_t)world_);
    *whole = malloc(sizeof(double) * (size_t)n * (size_t)world_);
    if (!full || !*whole) rc = cli_error("out of memory gathering the outputs");
    ft.data = full;
    for (int r = 0; r < world_ && !rc; r++) {
      flashc_tensor part = *t;
      part.data = (char *)all + bytes * (size_t)r;
      if (flashc_ring_unshard(o->layout, world_, r, &part, &ft) != FLASHC_OK) rc = fail(FLASHC_ERR_INTERNAL);
    }
    if (!rc) cli_unpack(full, t->dtype, *whole, n * world_);
  }
  free(host), free(all), free(full);
  return rc;
}

static int gather_lse(const ring_opts *o, const shards *s, const cli_shape *sh, double **whole) {
  int64_t lq = sh->seqlen_q / world_, n = sh->batch * sh->heads_q * lq;
  size_t bytes = (size_t)n * sizeof(float);
  float *host = malloc(bytes), *all = rank_ == 0 ? malloc(bytes * (size_t)world_) : NULL, *full = NULL;
  int rc = host && (rank_ != 0 || all) ? CLI_OK : cli_error("rank %d: out of memory", rank_);
  if (!rc && s->on_device) rc = cli_device_download(host, s->lse, bytes);
  if (!rc && !s->on_device) memcpy(host, s->lse, bytes);
  rc = agree_rc(rc);
  if (!rc) gather_bytes(host, bytes, all);
  if (!rc && rank_ == 0) {
    full = malloc(bytes * (size_t)world_);
    *whole = malloc(sizeof(double) * (size_t)n * (size_t)world_);
    if (!full || !*whole) rc = cli_error("out of memory gathering lse");
    for (int r = 0; r < world_ && !rc; r++)
      if (flashc_ring_unshard_lse(o->layout, world_, r, sh->batch, sh->heads_q, sh->seqlen_q, all + n * r, full) !=
          FLASHC_OK)
        rc = fail(FLASHC_ERR_INTERNAL);
    for (int64_t i = 0; !rc && i < n * world_; i++) (*whole)[i] = full[i];
  }
  free(host), free(all), free(full);
  return rc;
}

/* ---- --check: the bar of tests/ring --------------------------------------------------------------------- */
static double max_abs_diff(const double *x, const double *ref, int64_t n, int64_t *bad) {
  double e = 0;
  for (int64_t i = 0; i < n; i++) {
    if (isinf(ref[i]) && x[i] == ref[i]) continue; /* lse −inf of a row that sees no key */
    if (!isfinite(x[i])) {
      (*bad)++;
      continue;
    }
    e = fmax(e, fabs(x[i] - ref[i]));
  }
  return e;
}

static double max_abs_finite(const double *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(x[i])) m = fmax(m, fabs(x[i]));
  return m;
}

static int check(const cli_outputs *ring, const cli_outputs *one, const cli_outputs *ref, const cli_shape *sh,
                 flashc_dtype dt, int native, int backward) {
  const char *names[5] = {"o", "lse", "dq", "dk", "dv"};
  double *rs[5] = {ring->o, ring->lse, ring->dq, ring->dk, ring->dv},
         *os[5] = {one->o, one->lse, one->dq, one->dk, one->dv}, *fs[5] = {ref->o, ref->lse, ref->dq, ref->dk, ref->dv};
  int64_t ns[5] = {cli_q_elems(sh), cli_lse_elems(sh), cli_q_elems(sh), cli_k_elems(sh), cli_k_elems(sh)};
  int bits = dt == FLASHC_BF16 ? 8 : dt == FLASHC_F16 ? 11 : 24, rc = CLI_OK;
  printf("%-4s %12s %12s %12s %8s\n", "", "ring err", "single err", "bar", "ratio");
  for (int t = 0; t < (backward ? 5 : 2); t++) {
    int64_t bad = 0, bad_one = 0;
    double er = max_abs_diff(rs[t], fs[t], ns[t], &bad), eo = max_abs_diff(os[t], fs[t], ns[t], &bad_one);
    double m = max_abs_finite(fs[t], ns[t]);
    double bar = 2 * eo + world_ * ldexp(m, -22);
    /* device blocks (native partials) round each partial once to the dtype: see tests/ring/test_ring.c */
    if (native && t != 1) bar += (t == 0 ? 1 : 2 * world_) * ldexp(t == 0 ? 1.0 : m, -(bits + 1));
    int ok = bad == 0 && er <= bar;
    printf("%-4s %12.3e %12.3e %12.3e %8.2f %s\n", names[t], er, eo, bar, eo > 0 ? er / eo : 0.0,
           ok    ? ""
           : bad ? "FAIL (non-finite)"
                 : "FAIL");
    if (!ok) rc = CLI_CHECK_FAILED;
  }
  return rc;
}

/* ---- the command ---------------------------------------------------------------------------------------- */
static int run_ring(const ring_opts *o) {
  cli_inputs in;
  memset(&in, 0, sizeof in);
  int backward = o->mode != CLI_MODE_FWD, rc;
  if (o->data) {
    rc = cli_load(o->data, o->dtype, backward, &in);
  } else {
    cli_shape s = {o->batch, o->seqlen, o->seqlen_k, o->heads, o->heads_kv, o->head_dim};
    rc = cli_check_shape(&s);
    if (!rc) rc = cli_generate(&s, o->dtype >= 0 ? (flashc_dtype)o->dtype : FLASHC_F32, (uint64_t)o->seed, &in);
  }
  int64_t parts = o->layout == FLASHC_RING_ZIGZAG ? 2 * (int64_t)world_ : world_;
  if (!rc && (in.shape.seqlen_q % parts || in.shape.seqlen_k % parts))
    rc = cli_error("seqlens %lld and %lld must be multiples of %lld (%s layout over %d ranks)",
                   (long long)in.shape.seqlen_q, (long long)in.shape.seqlen_k, (long long)parts,
                   o->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous", world_);
  if ((rc = agree_rc(rc))) {
    cli_inputs_free(&in);
    return rc;
  }
  const cli_shape *sh = &in.shape;
  flashc_dtype dt = in.dtype;
  flashc_params params = flashc_params_default();
  params.causal = o->causal;
  params.align = o->align;
  params.window_left = o->window_left;
  params.window_right = o->window_right;
  params.scale = o->scale;

  /* The ring; the backend decides host or device. */
  MPI_Comm comm = MPI_COMM_WORLD;
  flashc_ring ring = NULL;
  flashc_status st = flashc_ring_create_mpi(&ring, &comm, o->backend);
  rc = st == FLASHC_OK ? CLI_OK : fail(st);
  if (!rc) rc = flashc_set_threads(flashc_ring_handle(ring), (int)o->threads) ? fail(FLASHC_ERR_INVALID_ARGUMENT) : 0;
  if (!rc && o->timeout_ms >= 0 && flashc_ring_set_timeout(ring, o->timeout_ms)) rc = fail(FLASHC_ERR_INVALID_ARGUMENT);
  flashc_backend_info info;
  memset(&info, 0, sizeof info);
  const char *backend = o->backend;
  if (!rc && strcmp(backend, "auto") == 0) { /* the best usable backend for the dtype and head_dim */
    for (int i = 0; i < flashc_backend_count(); i++) {
      flashc_backend_get(i, &info);
      if (info.usable && (info.dtypes & (1u << dt)) && sh->head_dim >= info.min_head_dim &&
          sh->head_dim <= info.max_head_dim && (!backward || info.has_backward))
        break;
      info.name = NULL;
    }
    if (!info.name)
      rc = cli_error("no usable backend for %s, head_dim %lld", flashc_dtype_name(dt), (long long)sh->head_dim);
    else
      backend = info.name;
    flashc_ring_destroy(ring); /* again on the chosen backend, so that --check compares the same one */
    ring = NULL;
    st = rc ? FLASHC_OK : flashc_ring_create_mpi(&ring, &comm, backend);
    if (st != FLASHC_OK) rc = fail(st);
    if (!rc) flashc_set_threads(flashc_ring_handle(ring), (int)o->threads);
    if (!rc && o->timeout_ms >= 0) flashc_ring_set_timeout(ring, o->timeout_ms);
  } else if (!rc && cli_backend_info(backend, &info)) {
    rc = CLI_ERROR;
  }
  int on_device = !rc && info.device == FLASHC_DEVICE_CUDA;
#ifdef FLASHC_CLI_CUDA
  if (on_device && cudaSetDevice(flashc_ring_device(ring)) != cudaSuccess)
    rc = cli_error("rank %d: cannot use CUDA device %d", rank_, flashc_ring_device(ring));
#else
  if (on_device) rc = cli_error("backend %s needs a flashc CLI built with the CUDA runtime", backend);
#endif
  shards s;
  memset(&s, 0, sizeof s);
  if (!rc) rc = make_shards(o, &in, dt, on_device, &s);
  if ((rc = agree_rc(rc))) goto done;

  /* One forward (and backward), gathered. */
  st = flashc_ring_forward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse);
  if (st == FLASHC_OK && backward)
    st = flashc_ring_backward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse, &s.tdo, &s.tdq, &s.tdk,
                              &s.tdv);
  if ((rc = agree_rc(st == FLASHC_OK ? CLI_OK : fail(st)))) goto done;
  cli_outputs ring_out;
  memset(&ring_out, 0, sizeof ring_out);
  rc = gather_output(o, &s, &s.to, &ring_out.o);
  if (!rc) rc = gather_lse(o, &s, sh, &ring_out.lse);
  if (!rc && backward) rc = gather_output(o, &s, &s.tdq, &ring_out.dq);
  if (!rc && backward) rc = gather_output(o, &s, &s.tdk, &ring_out.dk);
  if (!rc && backward) rc = gather_output(o, &s, &s.tdv, &ring_out.dv);
  if (rank_ == 0 && !rc) {
    printf("ring: %d rank(s), backend %s (%s), %s layout, %s, batch %lld, seqlen %lld/%lld, heads %lld/%lld, "
           "head_dim %lld%s\n",
           world_, backend, on_device ? "NCCL" : "MPI", o->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous",
           flashc_dtype_name(dt), (long long)sh->batch, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
           (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->head_dim, o->causal ? ", causal" : "");
    if (o->out) { /* outputs in the files' dtype, as `flashc run` writes them */
      int64_t qd[4] = {sh->batch, sh->seqlen_q, sh->heads_q, sh->head_dim},
              kd[4] = {sh->batch, sh->seqlen_k, sh->heads_kv, sh->head_dim},
              ld[3] = {sh->batch, sh->heads_q, sh->seqlen_q};
      npy_dtype fd = o->data ? in.file_dtype : NPY_F4;
      rc = cli_mkdirs(o->out) || cli_write_tensor(o->out, "o.npy", ring_out.o, fd, 4, qd) ||
           cli_write_tensor(o->out, "lse.npy", ring_out.lse, NPY_F4, 3, ld) ||
           (backward && (cli_write_tensor(o->out, "dq.npy", ring_out.dq, fd, 4, qd) ||
                         cli_write_tensor(o->out, "dk.npy", ring_out.dk, fd, 4, kd) ||
                         cli_write_tensor(o->out, "dv.npy", ring_out.dv, fd, 4, kd)));
      if (!rc) printf("wrote %s/o.npy, lse.npy%s\n", o->out, backward ? ", dq.npy, dk.npy, dv.npy" : "");
    }
    if (!rc && o->check) {
      cli_outputs one, ref;
      rc = cli_compute(backend, dt, (int)o->threads, &in, &params, backward, &one, NULL, NULL);
      if (!rc) {
        rc = cli_reference(&in, &params, backward, (int)o->threads, &ref);
        if (!rc) {
          printf("check against one device (%s) and cpu-ref (f64):\n", backend);
          /* device rings compute blocks in the input dtype (native partials); host rings in f32 */
          rc = check(&ring_out, &one, &ref, sh, dt, on_device && dt != FLASHC_F32, backward);
          printf("%s\n", rc == CLI_OK ? "PASS" : "FAIL");
          cli_outputs_free(&ref);
        }
        cli_outputs_free(&one);
      }
    }
  }
  cli_outputs_free(&ring_out);
  if ((rc = agree_rc(rc))) goto done;

  if (o->bench) {
    /* Per rank: median ms of a ring call; rank 0: the same backend on one device, whole shape. */
    int passes = backward ? 2 : 1;
    double *ms = malloc(sizeof(double) * (size_t)o->repeats), med[2] = {0, 0}, single[2] = {0, 0};
    for (int pass = 0; pass < passes && !rc; pass++) {
      for (int64_t i = 0; i < o->warmup + o->repeats && !rc; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = cli_now_ms();
        st = pass == 0 ? flashc_ring_forward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse)
                       : flashc_ring_backward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse, &s.tdo,
                                              &s.tdq, &s.tdk, &s.tdv);
        if (st != FLASHC_OK) rc = fail(st);
        if (i >= o->warmup) ms[i - o->warmup] = cli_now_ms() - t0;
      }
      if (!rc) med[pass] = median(ms, (int)o->repeats);
    }
    free(ms);
    if (!(rc = agree_rc(rc)) && rank_ == 0) {
      cli_runner r;
      double *sm = malloc(sizeof(double) * (size_t)o->repeats);
      rc = cli_runner_open(&r, backend, dt, (int)o->threads, &in, &params, 2, backward);
      for (int pass = 0; pass < passes && !rc; pass++)
        if (!(rc = cli_runner_time(&r, pass == 1, (int)o->warmup, (int)o->repeats, sm)))
          single[pass] = median(sm, (int)o->repeats);
      if (!rc) cli_runner_close(&r);
      free(sm);
    }
    double mine[2] = {med[0], med[1]};
    double *all = rank_ == 0 ? malloc(sizeof(double) * 2 * (size_t)world_) : NULL;
    MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    if (rank_ == 0 && !rc) {
      double f = forward_flops(sh, o->causal);
      char device[128] = "", date[32];
      if (on_device)
        cli_device_name(device, sizeof device);
      else
        cli_cpu_name(device, sizeof device);
      time_t now = time(NULL);
      strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
      FILE *csv = NULL;
      if (o->csv) {
        FILE *probe = fopen(o->csv, "r");
        if (probe) fclose(probe);
        if (!(csv = fopen(o->csv, "a"))) rc = cli_error("--csv %s: cannot open for appending", o->csv);
        if (csv && !probe)
          fprintf(csv, "date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,"
                       "world,threads,ms,tflops,gbps,max_abs_err,rel_l2_err,efficiency\n");
      }
      const char *commit = getenv("FLASHC_COMMIT") ? getenv("FLASHC_COMMIT") : "";
      for (int pass = 0; pass < passes; pass++) {
        double flops = pass ? 2.5 * f : f, one_tf = flops / (single[pass] * 1e9), worst = 0;
        printf("%s: one device %.3f ms, %.3f TFLOP/s\n", pass ? "bwd" : "fwd", single[pass], one_tf);
        for (int r = 0; r < world_; r++) {
          double per_rank = flops / world_ / (all[2 * r + pass] * 1e9);
          printf("  rank %d: %.3f ms, %.3f TFLOP/s per rank, efficiency %.1f %%\n", r, all[2 * r + pass], per_rank,
                 100.0 * per_rank / one_tf);
          worst = fmax(worst, all[2 * r + pass]);
        }
        /* the ring takes as long as its slowest rank */
        double per_rank = flops / world_ / (worst * 1e9);
        printf("  ring (slowest rank): %.3f ms, %.3f TFLOP/s per rank, efficiency %.1f %%\n", worst, per_rank,
               100.0 * per_rank / one_tf);
        const char *row = "%s,%s,%s,flashc:%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%lld,%.4f,%.4f,,,,%.4f\n";
        long long threads = on_device ? 0 : o->threads;
        if (csv) {
          fprintf(csv, row, date, device, commit, backend, flashc_dtype_name(dt), (long long)sh->batch,
                  (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
                  (long long)sh->head_dim, o->causal, pass ? "bwd" : "fwd", 1, threads, single[pass], one_tf, 1.0);
          fprintf(csv, row, date, device, commit, backend, flashc_dtype_name(dt), (long long)sh->batch,
                  (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
                  (long long)sh->head_dim, o->causal, pass ? "bwd" : "fwd", world_, threads, worst, per_rank,
                  per_rank / one_tf);
        }
      }
      if (csv) fclose(csv);
    }
    free(all);
    rc = agree_rc(rc);
  }
done:
  shards_free(&s);
  flashc_ring_destroy(ring);
  cli_inputs_free(&in);
  return rc;
}
#endif /* FLASHC_CLI_MPI */

int cmd_ring(int argc, char **argv) {
  ring_opts o;
  int rc = parse_ring_options(argc, argv, &o);
  if (rc < 0) {
    print_help();
    return CLI_OK;
  }
  if (rc) return rc;
#ifndef FLASHC_CLI_MPI
  return cli_error("this flashc was built without MPI, which ring attention needs (Debian: apt-get install "
                   "libopenmpi-dev, then build again)");
#else
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(NULL, NULL);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_);
  rc = run_ring(&o);
  MPI_Finalize();
  return rc;
#endif
}
