/*
 * test_ring_nccl.c — ring attention over NCCL in one process: one thread and one GPU per rank, communicators
 * from ncclCommInitAll, so it runs where MPI is not installed. Cases and verdict: harness.h.
 *
 *   test_ring_nccl [--backend NAME] [--gpus N]      every case the backend takes; exit 0 iff all passed,
 *                                                   77 (skipped) without a GPU
 *   test_ring_nccl ... --stall                      rank 1 stalls at step 1 (FLASHC_RING_FAULT=stall:1:1):
 *                                                   the others must fail with FLASHC_ERR_COMMUNICATION in time
 *   test_ring_nccl ... --bench [--seqlen-per-gpu S --heads H --head-dim D --full --contiguous --repeats N]
 *                                                   per-GPU TFLOP/s of the ring (fwd, bwd, fwd+bwd, bf16) and
 *                                                   its efficiency against one GPU on the whole sequence
 *                                                   (docs/targets.md: b1 h32 d128, 32k tokens per GPU, causal zigzag)
 * NAME defaults to the best usable CUDA backend with a backward pass.
 */
#include "harness.h"

#include "internal.h" /* fc_store */

#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_GPUS = 16, SKIP = 77 };

static int gpus;
static const char *backend;
static flashc_ring rings[MAX_GPUS];
/* A ring that failed with FLASHC_ERR_COMMUNICATION has aborted (and so freed) its communicator. */
static int comm_gone[MAX_GPUS];
static pthread_barrier_t barrier;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the ranks as threads ------------------------------------------------------------------------------ */
typedef struct rank_job {
  int rank;
  const tcase *c;
  const whole *w;
  outputs local;
  flashc_status status;
  char error[512];
  /* bench */
  int bench_pass; /* 0 forward, 1 backward */
  int repeats;
  double *ms;
  flashc_tensor q, k, v, o, dout, dq, dk, dv;
  float *lse;
  flashc_params params;
  flashc_ring_layout layout;
} rank_job;

static void *case_thread(void *arg) {
  rank_job *j = arg;
  ring_test_rank = j->rank;
  cudaSetDevice(flashc_ring_device(rings[j->rank]));
  j->status = ring_run_rank(j->c, rings[j->rank], gpus, j->rank, j->w, 1, &j->local);
  if (j->status == FLASHC_ERR_COMMUNICATION) comm_gone[j->rank] = 1;
  snprintf(j->error, sizeof j->error, "%s", j->status == FLASHC_OK ? "" : flashc_last_error());
  return NULL;
}

static void run_threads(void *(*fn)(void *), rank_job *jobs) {
  pthread_t t[MAX_GPUS];
  for (int r = 0; r < gpus; r++) pthread_create(&t[r], NULL, fn, &jobs[r]);
  for (int r = 0; r < gpus; r++) pthread_join(t[r], NULL);
}

static int run_case(const tcase *c, uint64_t seed) {
  whole w;
  whole_make(c, gpus, seed, &w);
  rank_job jobs[MAX_GPUS];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < gpus; r++) jobs[r] = (rank_job){.rank = r, .c = c, .w = &w};
  run_threads(case_thread, jobs);
  int skipped = 0;
  if (jobs[0].status == FLASHC_ERR_UNSUPPORTED) { /* the backend cannot run this case: on every rank */
    printf("skip  %-34s (%s: %s)\n", c->name, backend, jobs[0].error);
    skipped = 1;
  } else {
    for (int r = 0; r < gpus; r++) CHECK(jobs[r].status == FLASHC_OK, "%s: rank %d: %s", c->name, r, jobs[r].error);
    outputs all;
    outputs_alloc(&all, c->dt, w.nq, w.nk, w.nlse);
    for (int r = 0; r < gpus; r++) ring_unshard_outputs(c, gpus, r, &jobs[r].local, &all);
    cudaSetDevice(0);
    int pass = ring_judge(c, backend, 1, gpus, &w, &all);
    printf("%s  %-34s (%s, %s)\n", pass ? "ok  " : "FAIL", c->name, backend, flashc_dtype_name(c->dt));
    outputs_free(&all);
  }
  for (int r = 0; r < gpus; r++) outputs_free(&jobs[r].local);
  whole_free(&w);
  return skipped;
}

/* ---- a stalled rank -------------------------------------------------------------------------------------- */
static void *stall_thread(void *arg) {
  rank_job *j = arg;
  ring_test_rank = j->rank;
  cudaSetDevice(flashc_ring_device(rings[j->rank]));
  double t0 = now_ms();
  /* Two forwards: on 2 GPUs rank 0 legitimately finishes the first (rank 1 sent its only block before it
   * stalled), and the second's first transfer needs rank 1. */
  j->status = FLASHC_OK;
  for (int call = 0; call < 2 && j->status == FLASHC_OK; call++)
    j->status =
        flashc_ring_forward(rings[j->rank], &j->params, FLASHC_RING_CONTIGUOUS, &j->q, &j->k, &j->v, &j->o, NULL);
  j->ms = malloc(sizeof(double));
  j->ms[0] = now_ms() - t0;
  snprintf(j->error, sizeof j->error, "%s", flashc_last_error());
  return NULL;
}

static void stall_check(void) {
  const int timeout_ms = 5000;
  int64_t L = 256, H = 2, D = 64, n = L * H * D;
  flashc_dtype dt = FLASHC_BF16;
  void *host = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) fc_store(host, dt, i, ring_uniform());
  rank_job jobs[MAX_GPUS];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < gpus; r++) {
    cudaSetDevice(flashc_ring_device(rings[r]));
    CHECK_OK(flashc_ring_set_timeout(rings[r], timeout_ms));
    void *q = place(1, host, (size_t)n * 2), *o = place(1, NULL, (size_t)n * 2);
    jobs[r] = (rank_job){.rank = r, .params = flashc_params_default()};
    jobs[r].q = jobs[r].k = jobs[r].v = flashc_tensor_bshd(q, dt, 1, L, H, D);
    jobs[r].o = flashc_tensor_bshd(o, dt, 1, L, H, D);
  }
  run_threads(stall_thread, jobs);
  for (int r = 0; r < gpus; r++) {
    comm_gone[r] = jobs[r].status == FLASHC_ERR_COMMUNICATION;
    int ok = r == 1 || (jobs[r].status == FLASHC_ERR_COMMUNICATION && jobs[r].ms[0] <= 2.0 * timeout_ms + 5000);
    printf("%s  rank %d%s: %s after %.0f ms: %s\n", ok ? "ok  " : "FAIL", r, r == 1 ? " (stalled)" : "",
           flashc_status_string(jobs[r].status), jobs[r].ms[0], jobs[r].error);
    CHECK(ok, "rank %d did not fail with a communication error within the timeout", r);
    cudaSetDevice(flashc_ring_device(rings[r]));
    unplace(1, jobs[r].q.data);
    unplace(1, jobs[r].o.data);
    free(jobs[r].ms);
  }
  free(host);
}

/* ---- bench ----------------------------------------------------------------------------------------------- */
static void *bench_thread(void *arg) {
  rank_job *j = arg;
  cudaSetDevice(flashc_ring_device(rings[j->rank]));
  flashc_ring ring = rings[j->rank];
  /* Every thread makes every call, failed or not, so that all pass the barrier as often (a failed ring fails
   * again at once). Two untimed calls first. */
  for (int i = -2; i < j->repeats; i++) {
    pthread_barrier_wait(&barrier);
    double t0 = now_ms();
    flashc_status s = j->bench_pass == 0
                          ? flashc_ring_forward(ring, &j->params, j->layout, &j->q, &j->k, &j->v, &j->o, j->lse)
                          : flashc_ring_backward(ring, &j->params, j->layout, &j->q, &j->k, &j->v, &j->o, j->lse,
                                                 &j->dout, &j->dq, &j->dk, &j->dv);
    if (i >= 0) j->ms[i] = now_ms() - t0; /* the call returns once its result is complete */
    if (s != FLASHC_OK && j->status == FLASHC_OK) {
      j->status = s;
      snprintf(j->error, sizeof j->error, "%s", flashc_last_error());
    }
  }
  return NULL;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int bench(int64_t per_gpu, int64_t heads, int64_t head_dim, int causal, flashc_ring_layout layout, int repeats) {
  flashc_dtype dt = FLASHC_BF16;
  int64_t S = per_gpu * gpus, nq = S * heads * head_dim, lq = per_gpu * heads * head_dim;
  size_t qb = (size_t)nq * 2, lb = (size_t)lq * 2;
  printf("bench: %s, bf16, b1 h%lld d%lld, %lld tokens per GPU x %d GPUs = %lld, %s, %s layout\n", backend,
         (long long)heads, (long long)head_dim, (long long)per_gpu, gpus, (long long)S, causal ? "causal" : "full",
         layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous");
  void *whole_t[4];
  for (int t = 0; t < 4; t++) { /* q, k, v, dout: random bf16 */
    whole_t[t] = malloc(qb);
    for (int64_t i = 0; i < nq; i++) fc_store(whole_t[t], dt, i, ring_uniform());
  }
  flashc_params params = flashc_params_default();
  params.causal = causal;
  /* the ring */
  rank_job jobs[MAX_GPUS];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < gpus; r++) {
    cudaSetDevice(flashc_ring_device(rings[r]));
    rank_job *j = &jobs[r];
    *j = (rank_job){.rank = r, .repeats = repeats, .params = params, .layout = layout};
    j->ms = malloc(sizeof(double) * (size_t)repeats);
    flashc_tensor *in[4] = {&j->q, &j->k, &j->v, &j->dout};
    void *part = malloc(lb);
    for (int t = 0; t < 4; t++) {
      flashc_tensor full = flashc_tensor_bshd(whole_t[t], dt, 1, S, heads, head_dim),
                    shard = flashc_tensor_bshd(part, dt, 1, per_gpu, heads, head_dim);
      CHECK_OK(flashc_ring_shard(layout, gpus, r, &full, &shard));
      *in[t] = flashc_tensor_bshd(place(1, part, lb), dt, 1, per_gpu, heads, head_dim);
    }
    free(part);
    j->o = flashc_tensor_bshd(place(1, NULL, lb), dt, 1, per_gpu, heads, head_dim);
    j->dq = flashc_tensor_bshd(place(1, NULL, lb), dt, 1, per_gpu, heads, head_dim);
    j->dk = flashc_tensor_bshd(place(1, NULL, lb), dt, 1, per_gpu, heads, head_dim);
    j->dv = flashc_tensor_bshd(place(1, NULL, lb), dt, 1, per_gpu, heads, head_dim);
    j->lse = place(1, NULL, (size_t)(heads * per_gpu) * sizeof(float));
  }
  double ring_ms[2] = {0, 0}, one_ms[2] = {0, 0};
  for (int pass = 0; pass < 2; pass++) {
    for (int r = 0; r < gpus; r++) jobs[r].bench_pass = pass;
    run_threads(bench_thread, jobs);
    for (int r = 0; r < gpus; r++) comm_gone[r] |= jobs[r].status == FLASHC_ERR_COMMUNICATION;
    for (int r = 0; r < gpus; r++)
      if (jobs[r].status != FLASHC_OK) {
        printf("FAIL  ring %s on rank %d: %s\n", pass ? "backward" : "forward", r, jobs[r].error);
        return 1;
      }
    /* a repeat takes as long as its slowest rank */
    double *worst = malloc(sizeof(double) * (size_t)repeats);
    for (int i = 0; i < repeats; i++) {
      worst[i] = 0;
      for (int r = 0; r < gpus; r++) worst[i] = jobs[r].ms[i] > worst[i] ? jobs[r].ms[i] : worst[i];
    }
    ring_ms[pass] = median(worst, repeats);
    free(worst);
  }
  for (int r = 0; r < gpus; r++) {
    cudaSetDevice(flashc_ring_device(rings[r]));
    void *p[] = {jobs[r].q.data,  jobs[r].k.data,  jobs[r].v.data,  jobs[r].dout.data, jobs[r].o.data,
                 jobs[r].dq.data, jobs[r].dk.data, jobs[r].dv.data, jobs[r].lse};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) unplace(1, p[i]);
    free(jobs[r].ms);
  }
  /* one GPU on the whole sequence, same backend */
  cudaSetDevice(0);
  flashc_handle h;
  CHECK_OK(flashc_create(&h, backend));
  flashc_tensor t[4], o, dq, dk, dv;
  for (int i = 0; i < 4; i++) t[i] = flashc_tensor_bshd(place(1, whole_t[i], qb), dt, 1, S, heads, head_dim);
  o = flashc_tensor_bshd(place(1, NULL, qb), dt, 1, S, heads, head_dim);
  dq = flashc_tensor_bshd(place(1, NULL, qb), dt, 1, S, heads, head_dim);
  dk = flashc_tensor_bshd(place(1, NULL, qb), dt, 1, S, heads, head_dim);
  dv = flashc_tensor_bshd(place(1, NULL, qb), dt, 1, S, heads, head_dim);
  float *lse = place(1, NULL, (size_t)(heads * S) * sizeof(float));
  double *ms = malloc(sizeof(double) * (size_t)repeats);
  for (int pass = 0; pass < 2; pass++) {
    for (int i = -2; i < repeats; i++) {
      cudaDeviceSynchronize();
      double t0 = now_ms();
      flashc_status s = pass == 0 ? flashc_forward(h, &params, &t[0], &t[1], &t[2], &o, lse)
                                  : flashc_backward(h, &params, &t[0], &t[1], &t[2], &o, lse, &t[3], &dq, &dk, &dv);
      cudaDeviceSynchronize();
      CHECK(s == FLASHC_OK, "one GPU: %s", flashc_last_error());
      if (i >= 0) ms[i] = now_ms() - t0;
    }
    one_ms[pass] = median(ms, repeats);
  }
  free(ms);
  flashc_destroy(h);
  void *p[] = {t[0].data, t[1].data, t[2].data, t[3].data, o.data, dq.data, dk.data, dv.data, lse};
  for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) unplace(1, p[i]);
  for (int i = 0; i < 4; i++) free(whole_t[i]);

  double f = 4.0 * (double)heads * (double)S * (double)S * (double)head_dim * (causal ? 0.5 : 1.0);
  const char *names[3] = {"fwd", "bwd", "fwd+bwd"};
  for (int k = 0; k < 3; k++) {
    double flops = k == 0 ? f : k == 1 ? 2.5 * f : 3.5 * f;
    double rm = k < 2 ? ring_ms[k] : ring_ms[0] + ring_ms[1], om = k < 2 ? one_ms[k] : one_ms[0] + one_ms[1];
    double per_gpu_tf = flops / gpus / (rm * 1e9), one_tf = flops / (om * 1e9);
    printf("%-8s ring %9.3f ms  %7.1f TFLOP/s per GPU | one GPU %9.3f ms  %7.1f TFLOP/s | efficiency %5.1f %%\n",
           names[k], rm, per_gpu_tf, om, one_tf, 100.0 * per_gpu_tf / one_tf);
  }
  return 0;
}

/* ---- main ------------------------------------------------------------------------------------------------ */
static const char *best_cuda_backend(void) {
  flashc_backend_info info;
  for (int i = 0; i < flashc_backend_count(); i++)
    if (flashc_backend_get(i, &info) == FLASHC_OK && info.device == FLASHC_DEVICE_CUDA && info.usable &&
        info.has_backward &&
        strcmp(info.name, "cuda-hopper") != 0) /* the ring is benchmarked on cuda-mma (scripts/gpu-ring) */
      return info.name;
  return NULL;
}

int main(int argc, char **argv) {
  int want = 0, do_bench = 0, stall = 0, causal = 1, repeats = 10;
  int64_t per_gpu = 32768, heads = 32, head_dim = 128;
  flashc_ring_layout layout = FLASHC_RING_ZIGZAG;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--backend") == 0 && v)
      backend = argv[++i];
    else if (strcmp(a, "--gpus") == 0 && v)
      want = atoi(argv[++i]);
    else if (strcmp(a, "--bench") == 0)
      do_bench = 1;
    else if (strcmp(a, "--stall") == 0)
      stall = 1;
    else if (strcmp(a, "--seqlen-per-gpu") == 0 && v)
      per_gpu = atoll(argv[++i]);
    else if (strcmp(a, "--heads") == 0 && v)
      heads = atoll(argv[++i]);
    else if (strcmp(a, "--head-dim") == 0 && v)
      head_dim = atoll(argv[++i]);
    else if (strcmp(a, "--repeats") == 0 && v)
      repeats = atoi(argv[++i]);
    else if (strcmp(a, "--full") == 0)
      causal = 0;
    else if (strcmp(a, "--contiguous") == 0)
      layout = FLASHC_RING_CONTIGUOUS;
    else {
      fprintf(stderr, "usage: test_ring_nccl [--backend NAME] [--gpus N] [--stall] [--bench [--seqlen-per-gpu S "
                      "--heads H --head-dim D --full --contiguous --repeats N]]\n");
      return 2;
    }
  }
  ring_test_verbose = getenv("FLASHC_RING_TEST_VERBOSE") != NULL;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    printf("test_ring_nccl: skipped, no CUDA device\n");
    return SKIP;
  }
  gpus = want > 0 && want < count ? want : count;
  if (gpus > MAX_GPUS) gpus = MAX_GPUS;
  if (!backend && !(backend = best_cuda_backend())) {
    printf("test_ring_nccl: skipped, no usable CUDA backend with a backward pass in this build\n");
    return SKIP;
  }
  if (stall && gpus < 2) {
    printf("test_ring_nccl: --stall needs 2 GPUs\n");
    return SKIP;
  }
  if (stall) setenv("FLASHC_RING_FAULT", "stall:1:1", 1); /* read when the rings are created */
  uint64_t seed = (uint64_t)time(NULL);
  if (getenv("FLASHC_TEST_SEED")) seed = strtoull(getenv("FLASHC_TEST_SEED"), NULL, 10);
  ring_rng_seed(seed);
  printf("test_ring_nccl: %d GPU(s), backend %s, seed %llu\n", gpus, backend, (unsigned long long)seed);

  ncclComm_t comms[MAX_GPUS];
  int devs[MAX_GPUS];
  for (int r = 0; r < gpus; r++) devs[r] = r;
  ncclResult_t nr = ncclCommInitAll(comms, gpus, devs);
  if (nr != ncclSuccess) {
    printf("FAIL  ncclCommInitAll: %s\n", ncclGetErrorString(nr));
    return 1;
  }
  for (int r = 0; r < gpus; r++) {
    CHECK_OK(flashc_ring_create_nccl(&rings[r], comms[r], backend));
    CHECK(flashc_ring_device(rings[r]) == r, "ring %d is on device %d", r, flashc_ring_device(rings[r]));
  }
  pthread_barrier_init(&barrier, NULL, (unsigned)gpus);
  int skipped = 0;
  if (ring_test_failures() == 0) {
    if (stall) {
      stall_check();
    } else if (do_bench) {
      bench(per_gpu, heads, head_dim, causal, layout, repeats);
    } else {
      for (int i = 0; i < ring_n_cases; i++) {
        const tcase *c = &ring_cases[i];
        if (!case_has_backward(c) || c->native) continue; /* the device's blocks are always native */
        if (!backend_takes(backend, c)) {
          printf("skip  %-34s (%s has no %s or head_dim %lld)\n", c->name, backend, flashc_dtype_name(c->dt),
                 (long long)c->D);
          skipped++;
          continue;
        }
        skipped += run_case(c, seed + 1000003ull * (uint64_t)i);
      }
    }
  }
  for (int r = 0; r < gpus; r++) flashc_ring_destroy(rings[r]);
  for (int r = 0; r < gpus; r++)
    if (!comm_gone[r]) ncclCommDestroy(comms[r]);
  pthread_barrier_destroy(&barrier);
  int fails = ring_test_failures();
  printf("test_ring_nccl: %s (%d failed checks; %d cases skipped)\n", fails ? "FAILED" : "passed", fails, skipped);
  return fails ? 1 : 0;
}
