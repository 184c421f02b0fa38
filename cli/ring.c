/*
 * ring.c — `flashc ring`: ring attention across MPI ranks (one GPU per rank for CUDA backends).
 *
 *   mpirun -np N flashc ring --data DIR [--out DIR] [...]   every rank reads the whole inputs, takes its shard;
 *   mpirun -np N flashc ring --seqlen S ... --seed N [...]  or generates them from the same seed
 *     --check   rank 0 also runs the same backend on one device and cpu-ref on the whole tensors and
 *               compares (the bar of tests/ring: ring error <= 2 x single-device error + rounding floor)
 *     --bench   per-rank TFLOP/s of the ring and its efficiency: per-rank TFLOP/s over the single-device
 *               TFLOP/s on the whole shape (docs/targets.md); --csv FILE appends rows
 * Rank 0 writes the gathered outputs (o, lse, dq, dk, dv) to --out DIR (default: the --data directory).
 * The options are options.c's (CLI_RING), parsed and refused as every other subcommand's.
 *
 * Failure. Every rank runs the same steps; after each step that can fail on one rank alone the ranks agree on
 * the outcome, so that all go on or all stop with the same exit code. No collective here blocks: each is
 * non-blocking and polled against the ring's timeout, as the library's own waits are. A rank that finds a peer
 * lost (the ring returned FLASHC_ERR_COMMUNICATION, or a collective got no answer within the timeout) prints
 * why and ends the job with MPI_Abort: the lost peer may never exit on its own (a stopped process), so only the
 * launcher can make mpirun return, and a timed-out collective cannot be cancelled to go on without it.
 * The collectives end once the outputs are gathered (and the ring timed); then rank 0 alone writes, checks
 * and times one device, so no rank waits on its work with a deadline that a long --check could pass.
 */
#include "cli.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef FLASHC_CLI_MPI
#include <mpi.h>
#endif
#ifdef FLASHC_CLI_CUDA
#include <cuda_runtime.h>
#endif

/* The paragraph after the options in `flashc ring --help` (flashc.c's table). */
void cmd_ring_help(void) {
  printf("FLOPs: forward 4*b*hq*sq*sk*d (halved when causal), backward 2.5x; per-rank TFLOP/s divides them by N.\n"
         "Efficiency: per-rank TFLOP/s over one device's on the whole shape (the same backend, rank 0).\n"
         "A rank that loses a peer (no progress for the timeout) prints why and ends the job (MPI_Abort).\n");
}

#ifdef FLASHC_CLI_MPI
/* ---- collectives that cannot hang ------------------------------------------------------------------------ */
static int rank_, world_;
static int64_t timeout_ms_; /* the ring's timeout: how long a collective waits for the last rank; 0 = forever */

enum { DEFAULT_TIMEOUT_MS = 300000 }; /* the library's default (flashc_ring_set_timeout) */

/* --timeout-ms, else FLASHC_RING_TIMEOUT_MS, else the default: the library's rule, so that the CLI's
 * collectives and the ring give up after the same time (the CLI sets it on the ring too). */
static int64_t ring_timeout(const cli_options *o) {
  if (o->timeout_ms >= 0) return o->timeout_ms;
  const char *s = getenv("FLASHC_RING_TIMEOUT_MS");
  if (!s || !*s) return DEFAULT_TIMEOUT_MS;
  char *end;
  long long v = strtoll(s, &end, 10);
  return *end == '\0' && v >= 0 ? (int64_t)v : DEFAULT_TIMEOUT_MS;
}

/* This rank cannot go on with the others: say why, then end every rank of the job. */
static _Noreturn void lost(const char *why) {
  fprintf(stderr, "flashc ring: rank %d: %s; ending all %d ranks (MPI_Abort)\n", rank_, why, world_);
  fflush(stdout);
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, CLI_ERROR);
  _exit(CLI_ERROR); /* MPI_Abort does not return; this says so to the compiler */
}

/* Polls a non-blocking collective until it completes, or ends the job after the ring's timeout. The naps grow
 * to 1 ms: ranks may share cores with ranks that still compute. */
static void wait_collective(MPI_Request *req, const char *what) {
  double start = cli_now_ms();
  long nap_us = 1;
  for (;;) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE); /* MPI_COMM_WORLD's errors are fatal: no status to read */
    if (done) return;
    double waited = cli_now_ms() - start;
    if (timeout_ms_ > 0 && waited >= (double)timeout_ms_) {
      char why[300];
      snprintf(why, sizeof why,
               "%s: not every rank answered within %.0f ms (the ring's timeout, --timeout-ms): a rank died or stalled",
               what, waited);
      lost(why); /* the request stays MPI's: nothing here returns to free what it writes */
    }
    struct timespec t = {0, nap_us * 1000};
    nanosleep(&t, NULL);
    if (nap_us < 1000) nap_us *= 2;
  }
}

/* Every rank's rc → the worst: all ranks go on, or all stop. */
static int agree_rc(int rc) {
  int worst = rc;
  MPI_Request req;
  MPI_Iallreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req);
  wait_collective(&req, "the ranks' agreement on a step");
  return worst;
}

static void barrier(void) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  wait_collective(&req, "the barrier before a timed call");
}

static int fail(flashc_status s) {
  (void)s;
  return cli_error("rank %d: %s", rank_, flashc_last_error());
}

/* A ring call's status as this rank's rc. A lost peer ends the job: the ring is unusable, and the other ranks
 * are lost too or will be within the timeout. Other errors the library's agreement gives every rank alike. */
static int ring_rc(flashc_status st) {
  if (st == FLASHC_ERR_COMMUNICATION) lost(flashc_last_error());
  return st == FLASHC_OK ? CLI_OK : fail(st);
}

/* Each rank's `bytes` into rank 0's all[world·bytes], rank r's at r·bytes, in pieces that fit MPI's int
 * counts. Rank 0 receives each piece straight into place through a type of one piece whose extent is `bytes`
 * (no staging buffer). Every rank must have agreed that rank 0 has `all`. */
static void gather_bytes(const void *mine, size_t bytes, void *all) {
  const size_t piece = (size_t)1 << 30;
  for (size_t off = 0; off < bytes; off += piece) {
    size_t n = bytes - off < piece ? bytes - off : piece;
    MPI_Datatype one = MPI_BYTE, spaced = MPI_BYTE;
    if (rank_ == 0) {
      MPI_Type_contiguous((int)n, MPI_BYTE, &one);
      MPI_Type_create_resized(one, 0, (MPI_Aint)bytes, &spaced);
      MPI_Type_commit(&spaced);
    }
    MPI_Request req;
    MPI_Igather((const char *)mine + off, (int)n, MPI_BYTE, rank_ == 0 ? (char *)all + off : NULL, 1, spaced, 0,
                MPI_COMM_WORLD, &req);
    wait_collective(&req, "gathering the outputs on rank 0");
    if (rank_ == 0) {
      MPI_Type_free(&spaced);
      MPI_Type_free(&one);
    }
  }
}

static double forward_flops(const cli_shape *s, int causal) {
  double f = 4.0 * (double)s->batch * (double)s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k * s->head_dim;
  return causal && s->seqlen_q == s->seqlen_k ? f / 2 : f;
}

/* ---- the tensors of one rank --------------------------------------------------------------------------- */
/* This rank's shards of the inputs and its outputs, in the compute dtype (host, or device for CUDA). */
typedef struct shards {
  int on_device;
  void *q, *k, *v, *dout; /* shards */
  void *o, *dq, *dk, *dv; /* shard outputs */
  float *lse;
  flashc_tensor tq, tk, tv, tdo, to, tdq, tdk, tdv;
} shards;

static void *host_alloc(size_t bytes, const char *what) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) cli_error("rank %d: out of memory for %s (%zu bytes)", rank_, what, bytes);
  return p;
}

static void *mem_alloc(int on_device, size_t bytes, const char *what) {
  void *p = NULL;
  if (!on_device) return host_alloc(bytes, what);
  return cli_device_alloc(&p, bytes) ? NULL : p;
}

static void mem_free(int on_device, void *p) {
  if (!p) return;
  if (on_device)
    cli_device_free(p);
  else
    free(p);
}

static void shards_free(shards *s) {
  void *mem[] = {s->q, s->k, s->v, s->dout, s->o, s->dq, s->dk, s->dv, s->lse};
  for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++) mem_free(s->on_device, mem[i]);
  memset(s, 0, sizeof *s);
}

/* Rank rank_'s rows of each whole f32 input, converted to dt (and uploaded for device backends). Only the
 * shards are allocated: the whole tensors are the f32 inputs, read in place. */
static int make_shards(const cli_options *o, const cli_inputs *in, flashc_dtype dt, int on_device, shards *s) {
  static const char *const names[4] = {"the q shard", "the k shard", "the v shard", "the do shard"};
  memset(s, 0, sizeof *s);
  s->on_device = on_device;
  const cli_shape *sh = &in->shape;
  int64_t lq = sh->seqlen_q / world_, lk = sh->seqlen_k / world_;
  size_t es = flashc_dtype_size(dt);
  float *src[4] = {in->q, in->k, in->v, in->dout};
  int64_t whole[4] = {sh->seqlen_q, sh->seqlen_k, sh->seqlen_k, sh->seqlen_q}, len[4] = {lq, lk, lk, lq},
          heads[4] = {sh->heads_q, sh->heads_kv, sh->heads_kv, sh->heads_q};
  void **local[4] = {&s->q, &s->k, &s->v, &s->dout};
  flashc_tensor *t[4] = {&s->tq, &s->tk, &s->tv, &s->tdo};
  for (int i = 0; i < 4; i++) {
    if (!src[i]) continue; /* no do: forward only */
    int64_t n = sh->batch * len[i] * heads[i] * sh->head_dim;
    float *part = host_alloc((size_t)n * sizeof(float), names[i]);
    if (!part) return CLI_ERROR;
    flashc_tensor full = flashc_tensor_bshd(src[i], FLASHC_F32, sh->batch, whole[i], heads[i], sh->head_dim);
    flashc_tensor shard = flashc_tensor_bshd(part, FLASHC_F32, sh->batch, len[i], heads[i], sh->head_dim);
    flashc_status st = flashc_ring_shard(o->layout, world_, rank_, &full, &shard);
    void *mine = NULL;
    int rc = st == FLASHC_OK ? CLI_OK : fail(st);
    if (!rc && dt == FLASHC_F32 && !on_device) {
      mine = part; /* already in place */
      part = NULL;
    } else if (!rc && !(mine = mem_alloc(on_device, (size_t)n * es, names[i]))) {
      rc = CLI_ERROR;
    } else if (!rc && !on_device) {
      cli_pack(part, mine, dt, n);
    } else if (!rc && dt == FLASHC_F32) { /* device */
      rc = cli_device_upload(mine, part, (size_t)n * es);
    } else if (!rc) { /* device, narrower dtype: packed on the host first */
      void *packed = host_alloc((size_t)n * es, names[i]);
      rc = packed ? CLI_OK : CLI_ERROR;
      if (!rc) cli_pack(part, packed, dt, n);
      if (!rc) rc = cli_device_upload(mine, packed, (size_t)n * es);
      free(packed);
    }
    free(part);
    *local[i] = mine; /* freed by shards_free on failure too */
    if (rc) return rc;
    *t[i] = flashc_tensor_bshd(mine, dt, sh->batch, len[i], heads[i], sh->head_dim);
  }
  size_t qb = (size_t)(sh->batch * lq * sh->heads_q * sh->head_dim) * es,
         kb = (size_t)(sh->batch * lk * sh->heads_kv * sh->head_dim) * es;
  if (!(s->o = mem_alloc(on_device, qb, "the o shard")) ||
      !(s->lse = mem_alloc(on_device, (size_t)(sh->batch * sh->heads_q * lq) * sizeof(float), "the lse shard")))
    return CLI_ERROR;
  s->to = flashc_tensor_bshd(s->o, dt, sh->batch, lq, sh->heads_q, sh->head_dim);
  if (in->dout) {
    if (!(s->dq = mem_alloc(on_device, qb, "the dq shard")) || !(s->dk = mem_alloc(on_device, kb, "the dk shard")) ||
        !(s->dv = mem_alloc(on_device, kb, "the dv shard")))
      return CLI_ERROR;
    s->tdq = flashc_tensor_bshd(s->dq, dt, sh->batch, lq, sh->heads_q, sh->head_dim);
    s->tdk = flashc_tensor_bshd(s->dk, dt, sh->batch, lk, sh->heads_kv, sh->head_dim);
    s->tdv = flashc_tensor_bshd(s->dv, dt, sh->batch, lk, sh->heads_kv, sh->head_dim);
  }
  return CLI_OK;
}

/* ---- gathering ------------------------------------------------------------------------------------------ */
/* Every rank's `bytes` of shard memory `mine` (host, or device: downloaded first) into *all[world·bytes] on
 * rank 0 (allocated here; the caller frees it). rc is this rank's outcome so far: every rank calls this, and
 * the ranks agree (on rc and on rank 0's buffer) before any byte moves. */
static int gather_to_root(int rc, const shards *s, const void *mine, size_t bytes, void **all) {
  void *host = NULL;
  *all = NULL;
  if (!rc && s->on_device && !(host = host_alloc(bytes, "an output shard"))) rc = CLI_ERROR;
  if (!rc && s->on_device) rc = cli_device_download(host, mine, bytes);
  if (!rc && rank_ == 0 && !(*all = host_alloc(bytes * (size_t)world_, "the gathered outputs"))) rc = CLI_ERROR;
  if (!(rc = agree_rc(rc))) gather_bytes(s->on_device ? host : mine, bytes, *all);
  free(host);
  return rc;
}

/* A shard output into rank 0's whole tensor as doubles (*whole, rank 0 only). Every buffer holds exactly its
 * data, and rank 0 frees the gathered shards before it allocates the doubles. */
static int gather_output(int rc, const cli_options *o, const shards *s, const flashc_tensor *t, double **whole) {
  int64_t n = t->size[0] * t->size[1] * t->size[2] * t->size[3];
  size_t bytes = (size_t)n * flashc_dtype_size(t->dtype);
  void *all, *full = NULL;
  if ((rc = gather_to_root(rc, s, t->data, bytes, &all)) || rank_ != 0) {
    free(all);
    return rc;
  }
  flashc_tensor ft = *t;
  ft.size[1] *= world_;
  ft.stride[0] *= world_;
  if (!(full = host_alloc(bytes * (size_t)world_, "an output"))) rc = CLI_ERROR;
  ft.data = full;
  for (int r = 0; r < world_ && !rc; r++) {
    flashc_tensor part = *t;
    part.data = (char *)all + bytes * (size_t)r;
    if (flashc_ring_unshard(o->layout, world_, r, &part, &ft) != FLASHC_OK) rc = fail(FLASHC_ERR_INTERNAL);
  }
  free(all);
  if (!rc && !(*whole = host_alloc(sizeof(double) * (size_t)n * (size_t)world_, "an output as doubles")))
    rc = CLI_ERROR;
  if (!rc) cli_unpack(full, t->dtype, *whole, n * world_);
  free(full);
  return rc;
}

/* The same for lse ([batch, heads, seqlen] fp32). */
static int gather_lse(int rc, const cli_options *o, const shards *s, const cli_shape *sh, double **whole) {
  int64_t lq = sh->seqlen_q / world_, n = sh->batch * sh->heads_q * lq;
  size_t bytes = (size_t)n * sizeof(float);
  void *all;
  float *full = NULL;
  if ((rc = gather_to_root(rc, s, s->lse, bytes, &all)) || rank_ != 0) {
    free(all);
    return rc;
  }
  if (!(full = host_alloc(bytes * (size_t)world_, "lse"))) rc = CLI_ERROR;
  for (int r = 0; r < world_ && !rc; r++)
    if (flashc_ring_unshard_lse(o->layout, world_, r, sh->batch, sh->heads_q, sh->seqlen_q, (float *)all + n * r,
                                full) != FLASHC_OK)
      rc = fail(FLASHC_ERR_INTERNAL);
  free(all);
  if (!rc && !(*whole = host_alloc(sizeof(double) * (size_t)n * (size_t)world_, "lse as doubles"))) rc = CLI_ERROR;
  for (int64_t i = 0; !rc && i < n * world_; i++) (*whole)[i] = full[i];
  free(full);
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

/* ---- --bench ------------------------------------------------------------------------------------------- */
/* Every rank: the median ms of its ring calls, forward [0] and backward [1]; rank 0 gets all of them in
 * all[2·world]. Collective. */
static int bench_ring(const cli_options *o, flashc_ring ring, const flashc_params *params, shards *s, int passes,
                      double *all) {
  double *ms = host_alloc(sizeof(double) * (size_t)o->repeats, "the timings");
  double med[2] = {0, 0};
  int rc = agree_rc(ms ? CLI_OK : CLI_ERROR);
  for (int pass = 0; pass < passes && !rc; pass++) {
    for (int i = 0; i < o->warmup + o->repeats && !rc; i++) {
      barrier(); /* every rank starts the call together: the ring is as slow as its last rank */
      double t0 = cli_now_ms();
      flashc_status st = pass == 0
                             ? flashc_ring_forward(ring, params, o->layout, &s->tq, &s->tk, &s->tv, &s->to, s->lse)
                             : flashc_ring_backward(ring, params, o->layout, &s->tq, &s->tk, &s->tv, &s->to, s->lse,
                                                    &s->tdo, &s->tdq, &s->tdk, &s->tdv);
      rc = ring_rc(st); /* an error other than a lost peer is every rank's (the library agrees first) */
      if (i >= o->warmup) ms[i - o->warmup] = cli_now_ms() - t0;
    }
    if (!rc) med[pass] = cli_median(ms, o->repeats);
  }
  free(ms);
  if ((rc = agree_rc(rc))) return rc;
  MPI_Request req;
  MPI_Igather(med, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD, &req);
  wait_collective(&req, "gathering the timings on rank 0");
  return CLI_OK;
}

/* Rank 0, after the ring: the same backend on one device, whole shape; the table and the CSV rows. */
static int bench_report(const cli_options *o, const char *backend, const cli_inputs *in, const flashc_params *params,
                        int on_device, int passes, const double *all) {
  const cli_shape *sh = &in->shape;
  flashc_dtype dt = in->dtype;
  double single[2] = {0, 0};
  double *sm = host_alloc(sizeof(double) * (size_t)o->repeats, "the timings");
  if (!sm) return CLI_ERROR;
  cli_runner one;
  int rc = cli_runner_open(&one, backend, dt, o->threads, in, params, 2, passes == 2), opened = !rc;
  for (int pass = 0; pass < passes && !rc; pass++)
    if (!(rc = cli_runner_time(&one, pass == 1, o->warmup, o->repeats, sm))) single[pass] = cli_median(sm, o->repeats);
  if (opened) cli_runner_close(&one);
  free(sm);
  if (rc) return rc;
  double f = forward_flops(sh, o->causal);
  char device[128] = "", date[32];
  if (on_device)
    cli_device_name(device, sizeof device);
  else
    cli_cpu_name(device, sizeof device);
  time_t now = time(NULL);
  struct tm utc;
  gmtime_r(&now, &utc);
  strftime(date, sizeof date, "%Y-%m-%d", &utc);
  FILE *csv = NULL;
  if (o->csv) {
    struct stat st;
    bool fresh = stat(o->csv, &st) != 0 || st.st_size == 0;
    if (!(csv = fopen(o->csv, "a"))) return cli_error("--csv %s: cannot open for appending", o->csv);
    if (fresh)
      fprintf(csv, "date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,"
                   "world,threads,ms,tflops,gbps,max_abs_err,rel_l2_err,efficiency,layout\n");
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
    const char *row = "%s,%s,%s,flashc:%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,%d,%lld,%.4f,%.4f,,,,%.4f,%s\n";
    const char *layout = o->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous";
    long long threads = on_device ? 0 : o->threads;
    if (csv) {
      fprintf(csv, row, date, device, commit, backend, flashc_dtype_name(dt), (long long)sh->batch,
              (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
              (long long)sh->head_dim, o->causal, pass ? "bwd" : "fwd", 1, threads, single[pass], one_tf, 1.0, layout);
      fprintf(csv, row, date, device, commit, backend, flashc_dtype_name(dt), (long long)sh->batch,
              (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
              (long long)sh->head_dim, o->causal, pass ? "bwd" : "fwd", world_, threads, worst, per_rank,
              per_rank / one_tf, layout);
    }
  }
  if (csv && fclose(csv) != 0) return cli_error("--csv %s: write failed", o->csv);
  return CLI_OK;
}

/* ---- the command ---------------------------------------------------------------------------------------- */
/* The backend to run: --backend, or for auto the best usable one for the dtype, head_dim and pass. */
static int pick_backend(const cli_options *o, const cli_inputs *in, bool backward, flashc_backend_info *info) {
  memset(info, 0, sizeof *info);
  if (strcmp(o->backend, "auto") != 0) return cli_backend_info(o->backend, info);
  for (int i = 0; i < flashc_backend_count(); i++) {
    if (flashc_backend_get(i, info) != FLASHC_OK) continue;
    if (info->usable && (info->dtypes & (1u << in->dtype)) && in->shape.head_dim >= info->min_head_dim &&
        in->shape.head_dim <= info->max_head_dim && (!backward || info->has_backward))
      return CLI_OK;
  }
  return cli_error("no usable backend for %s, head_dim %lld%s", flashc_dtype_name(in->dtype),
                   (long long)in->shape.head_dim, backward ? " with a backward" : "");
}

/* A stage that may take a while, on stderr (rank 0 only; stdout keeps the results), with the time so far. */
static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...) {
  if (rank_ != 0) return;
  static double t0 = -1;
  if (t0 < 0) t0 = cli_now_ms();
  fflush(stdout); /* what rank 0 printed before comes first */
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flashc ring: [%6.1f s] ", (cli_now_ms() - t0) / 1000);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

/* Rank 0's part after the collectives: the header line, the files, --check. */
static int report(const cli_options *o, const char *backend, const cli_inputs *in, const flashc_params *params,
                  int on_device, bool backward, const cli_outputs *ring_out) {
  const cli_shape *sh = &in->shape;
  flashc_dtype dt = in->dtype;
  printf("ring: %d rank(s), backend %s (%s), %s layout, %s, batch %lld, seqlen %lld/%lld, heads %lld/%lld, "
         "head_dim %lld%s\n",
         world_, backend, on_device ? "NCCL" : "MPI", o->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous",
         flashc_dtype_name(dt), (long long)sh->batch, (long long)sh->seqlen_q, (long long)sh->seqlen_k,
         (long long)sh->heads_q, (long long)sh->heads_kv, (long long)sh->head_dim, o->causal ? ", causal" : "");
  int rc = CLI_OK;
  if (o->out) { /* outputs in the files' dtype, as `flashc run` writes them */
    int64_t qd[4] = {sh->batch, sh->seqlen_q, sh->heads_q, sh->head_dim},
            kd[4] = {sh->batch, sh->seqlen_k, sh->heads_kv, sh->head_dim},
            ld[3] = {sh->batch, sh->heads_q, sh->seqlen_q};
    npy_dtype fd = o->data ? in->file_dtype : NPY_F4;
    rc = cli_mkdirs(o->out) || cli_write_tensor(o->out, "o.npy", ring_out->o, fd, 4, qd) ||
                 cli_write_tensor(o->out, "lse.npy", ring_out->lse, NPY_F4, 3, ld) ||
                 (backward && (cli_write_tensor(o->out, "dq.npy", ring_out->dq, fd, 4, qd) ||
                               cli_write_tensor(o->out, "dk.npy", ring_out->dk, fd, 4, kd) ||
                               cli_write_tensor(o->out, "dv.npy", ring_out->dv, fd, 4, kd)))
             ? CLI_ERROR
             : CLI_OK;
    if (!rc) printf("wrote %s/o.npy, lse.npy%s\n", o->out, backward ? ", dq.npy, dk.npy, dv.npy" : "");
  }
  if (!rc && o->check) {
    cli_outputs one, ref;
    progress("check: the whole shape on one device (%s)", backend);
    rc = cli_compute(backend, dt, o->threads, in, params, backward, &one, NULL, NULL);
    if (!rc) {
      progress("check: cpu-ref (f64) on the whole shape: the slow part");
      rc = cli_reference(in, params, backward, o->threads, &ref);
      if (!rc) {
        printf("check against one device (%s) and cpu-ref (f64):\n", backend);
        /* device rings compute blocks in the input dtype (native partials); host rings in f32 */
        rc = check(ring_out, &one, &ref, sh, dt, on_device && dt != FLASHC_F32, backward);
        printf("%s\n", rc == CLI_OK ? "PASS" : "FAIL");
        cli_outputs_free(&ref);
      }
      cli_outputs_free(&one);
    }
  }
  return rc;
}

static int run_ring(const cli_options *o) {
  bool backward = o->mode != CLI_MODE_FWD;
  timeout_ms_ = ring_timeout(o);
  cli_inputs in;
  memset(&in, 0, sizeof in);
  int rc;
  if (o->data) {
    rc = cli_load(o->data, o->dtype, backward, &in);
  } else {
    cli_shape s = {o->batch, o->seqlen_q, o->seqlen_k, o->heads, o->heads_kv, o->head_dim, o->head_dim_v};
    rc = cli_generate(&s, o->dtype >= 0 ? (flashc_dtype)o->dtype : FLASHC_F32, o->seed, &in);
  }
  if (!backward) { /* generated (or found) with the inputs, but a forward has no use for it */
    free(in.dout);
    in.dout = NULL;
  }
  if (!rc && in.shape.head_dim_v != in.shape.head_dim) /* ring attention has one head dim (flashc.h) */
    rc = cli_error("v's head_dim %lld differs from q's %lld, which ring attention does not support",
                   (long long)in.shape.head_dim_v, (long long)in.shape.head_dim);
  int64_t parts = o->layout == FLASHC_RING_ZIGZAG ? 2 * (int64_t)world_ : world_;
  if (!rc && (in.shape.seqlen_q % parts || in.shape.seqlen_k % parts))
    rc = cli_error("seqlens %lld and %lld must be multiples of %lld (%s layout over %d ranks)",
                   (long long)in.shape.seqlen_q, (long long)in.shape.seqlen_k, (long long)parts,
                   o->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous", world_);
  flashc_backend_info info;
  if (!rc) rc = pick_backend(o, &in, backward, &info);
  int on_device = !rc && info.device == FLASHC_DEVICE_CUDA;
#ifndef FLASHC_CLI_CUDA
  if (on_device) rc = cli_error("backend %s needs a flashc CLI built with the CUDA runtime", info.name);
#endif
  if ((rc = agree_rc(rc))) { /* before the ring: creating it is collective */
    cli_inputs_free(&in);
    return rc;
  }
  const cli_shape sh = in.shape;
  const char *backend = info.name;
  flashc_params params = cli_params(o);

  /* The ring; the backend decides host or device. */
  MPI_Comm comm = MPI_COMM_WORLD;
  flashc_ring ring = NULL;
  rc = ring_rc(flashc_ring_create_mpi(&ring, &comm, backend));
  if (!rc && flashc_set_threads(flashc_ring_handle(ring), o->threads) != FLASHC_OK)
    rc = fail(FLASHC_ERR_INVALID_ARGUMENT);
  if (!rc && flashc_ring_set_timeout(ring, timeout_ms_) != FLASHC_OK) rc = fail(FLASHC_ERR_INVALID_ARGUMENT);
#ifdef FLASHC_CLI_CUDA
  if (!rc && on_device && cudaSetDevice(flashc_ring_device(ring)) != cudaSuccess)
    rc = cli_error("rank %d: cannot use CUDA device %d", rank_, flashc_ring_device(ring));
#endif
  shards s;
  memset(&s, 0, sizeof s);
  if (!rc) rc = make_shards(o, &in, in.dtype, on_device, &s);
  /* Only rank 0 needs the whole inputs again (--check, --bench on one device). */
  if (rank_ != 0) {
    float **whole[4] = {&in.q, &in.k, &in.v, &in.dout};
    for (int i = 0; i < 4; i++) free(*whole[i]), *whole[i] = NULL;
  }
  cli_outputs ring_out;
  memset(&ring_out, 0, sizeof ring_out);
  double *times = NULL;
  int passes = backward ? 2 : 1;
  if ((rc = agree_rc(rc))) goto done;

  /* One forward (and backward), gathered on rank 0. */
  progress("ring %s over %d ranks", backward ? "forward and backward" : "forward", world_);
  rc = ring_rc(flashc_ring_forward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse));
  if (!rc && backward)
    rc = ring_rc(flashc_ring_backward(ring, &params, o->layout, &s.tq, &s.tk, &s.tv, &s.to, s.lse, &s.tdo, &s.tdq,
                                      &s.tdk, &s.tdv));
  rc = gather_output(rc, o, &s, &s.to, &ring_out.o);
  rc = gather_lse(rc, o, &s, &sh, &ring_out.lse);
  if (backward) {
    rc = gather_output(rc, o, &s, &s.tdq, &ring_out.dq);
    rc = gather_output(rc, o, &s, &s.tdk, &ring_out.dk);
    rc = gather_output(rc, o, &s, &s.tdv, &ring_out.dv);
  }
  if (o->bench) { /* every rank agrees, even one whose gather failed alone (rank 0, after the bytes came) */
    if (!rc && rank_ == 0 && !(times = host_alloc(sizeof(double) * 2 * (size_t)world_, "the timings"))) rc = CLI_ERROR;
    if (!(rc = agree_rc(rc))) rc = bench_ring(o, ring, &params, &s, passes, times);
  }
  /* The last collective is behind: rank 0 goes on alone. */
  shards_free(&s);
  flashc_ring_destroy(ring);
  ring = NULL;
  if (!rc && rank_ == 0) rc = report(o, backend, &in, &params, on_device, backward, &ring_out);
  if (!rc && rank_ == 0 && o->bench) rc = bench_report(o, backend, &in, &params, on_device, passes, times);
done:
  free(times);
  cli_outputs_free(&ring_out);
  shards_free(&s);
  flashc_ring_destroy(ring);
  cli_inputs_free(&in);
  return rc;
}
#endif /* FLASHC_CLI_MPI */

int cmd_ring(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_RING, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  if (o.data && o.gen_flags_given)
    return cli_error("--data and the generation flags (--batch, --seqlen, ..., --seed) exclude each other: the shape "
                     "comes from the files");
  if (!o.out) o.out = o.data;
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
