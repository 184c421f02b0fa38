/*
 * harness.h — what the ring tests share: the cases, the whole tensors of a case from one seed, where tensors
 * live (host memory or the current GPU), one rank's part of a case, and the verdict on a case.
 *
 * test_ring.c runs the ranks as MPI processes (host tensors over MPI, or GPUs over NCCL with --device);
 * test_ring_nccl.c runs them as threads of one process, one GPU each, over ncclCommInitAll (no MPI needed).
 *
 * The verdict, for O, lse, dQ, dK, dV against the fp64 reference (cpu-ref in f64) on the whole tensors:
 *   max|ring − ref| ≤ 2·max|single − ref| + world·2⁻²²·max|ref|
 * where single is the same backend on one device: the last term is the f32 rounding of the up to 2·world
 * block partials an element sums (a few ulps of f32, which matter only where the backend itself is exact to
 * f32, as cpu-ref is). With native partials (the device path: each partial rounded once to bf16/f16) half an
 * ulp of the dtype per partial is added. Rows that see no key must give O = 0, lse = −inf, dQ = 0 exactly, and
 * nothing may be NaN; outputs are poisoned (NaN) before each call.
 */
#ifndef FLASHC_TEST_RING_HARNESS_H
#define FLASHC_TEST_RING_HARNESS_H

#include <flashc.h>

#include <stddef.h>
#include <stdint.h>

/* ---- checks ------------------------------------------------------------------------------------------- */
extern int ring_test_verbose;            /* FLASHC_RING_TEST_VERBOSE: print the errors of every case */
extern _Thread_local int ring_test_rank; /* for messages */
int ring_test_failures(void);            /* failed checks so far, all threads */
void ring_test_fail(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#define CHECK(cond, ...)                                                                                               \
  do {                                                                                                                 \
    if (!(cond)) ring_test_fail(__FILE__, __LINE__, __VA_ARGS__);                                                      \
  } while (0)

#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    flashc_status st_ = (call);                                                                                        \
    CHECK(st_ == FLASHC_OK, "%s -> %s: %s", #call, flashc_status_string(st_), flashc_last_error());                    \
  } while (0)

/* ---- cases -------------------------------------------------------------------------------------------- */
typedef struct tcase {
  const char *name;
  const char *backend; /* "cpu" (a GPU run puts its backend in its place) or "cpu-ref" */
  flashc_dtype dt;
  int64_t B, Lq, Lk, Hq, Hkv, D; /* L: local seqlens; the whole sequence is world·L */
  int causal;
  int64_t wl, wr;
  flashc_causal_align align;
  flashc_ring_layout layout;
  int native; /* host partials in the input dtype, as on the device */
  int bhsd;   /* shards in [b, h, s, d] memory (strided) */
} tcase;

extern const tcase ring_cases[];
extern const int ring_n_cases;

flashc_params case_params(const tcase *c);
flashc_tensor case_tensor(void *data, flashc_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int bhsd);

/* ---- data --------------------------------------------------------------------------------------------- */
void ring_rng_seed(uint64_t seed);
double ring_uniform(void); /* [−1, 1) */

/* The whole tensors of a case over `world` ranks, in the case's dtype and (the same values) in f64. */
typedef struct whole {
  int64_t sq, sk, nq, nk, nlse;
  void *q, *k, *v, *dout;
  double *q64, *k64, *v64, *do64;
} whole;
void whole_make(const tcase *c, int world, uint64_t seed, whole *w);
void whole_free(whole *w);

/* ---- where a call's tensors live: host memory (on_device 0) or the current CUDA device ---------------- */
void *place(int on_device, const void *host, size_t bytes); /* a copy; host NULL: NaN in every dtype */
void fetch(int on_device, void *host, const void *placed, size_t bytes);
void unplace(int on_device, void *p);

/* Outputs on the host: o, dq [B, S, Hq, D] and dk, dv [B, S, Hkv, D] in the dtype, lse [B, Hq, S] f32. */
typedef struct outputs {
  void *o, *dq, *dk, *dv;
  float *lse;
} outputs;
void outputs_alloc(outputs *x, flashc_dtype dt, int64_t nq, int64_t nk, int64_t nlse);
void outputs_free(outputs *x);

/* ---- a case ----------------------------------------------------------------------------------------------- */
/* One rank's part: its shards of w (placed as on_device says), the ring forward (twice: repeats must be
 * bit-identical) and backward, and its outputs fetched into `local` (dense BSHD shards, allocated here).
 * Returns the forward's status (UNSUPPORTED: the backend cannot run the case, on every rank). */
flashc_status ring_run_rank(const tcase *c, flashc_ring ring, int world, int rank, const whole *w, int on_device,
                            outputs *local);
/* Rank `rank`'s dense shards (from ring_run_rank) into their place in the whole outputs. */
void ring_unshard_outputs(const tcase *c, int world, int rank, const outputs *local, outputs *all);

/* The verdict: backend on one device (on_device: the current GPU) and cpu-ref on w, against the whole ring
 * outputs. 1 when every check passed. */
int ring_judge(const tcase *c, const char *backend, int on_device, int world, const whole *w, const outputs *ring);

/* Does backend (by name) take the case's dtype and head_dim? (CUDA backends may still refuse a case in their
 * supports hook: ring_run_rank then returns UNSUPPORTED.) */
int backend_takes(const char *backend, const tcase *c);
/* cpu-ref's backward recomputes the softmax from q, k, v and cannot run one block: the ring refuses it. */
int case_has_backward(const tcase *c);

#endif /* FLASHC_TEST_RING_HARNESS_H */
