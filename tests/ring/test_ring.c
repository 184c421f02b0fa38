/*
 * test_ring.c — ring attention over MPI ranks against one device and the fp64 reference (harness.h says how).
 *
 *   mpiexec -n N test_ring               every case; exit 0 iff every check passed on every rank
 *   mpiexec -n N test_ring --fault MODE  the peer-failure check (MODE exit or stall), with FLASHC_RING_FAULT
 *                                        set by scripts/ring-test: every rank that lives must get
 *                                        FLASHC_ERR_COMMUNICATION within the timeout
 *   ... --device NAME                    either of the above with a CUDA backend on device tensors, one GPU per
 *                                        rank (the NCCL path; CUDA builds). Cases the backend cannot run (its
 *                                        dtypes, head dims, supports hook) are skipped and counted.
 *
 * Every rank builds the same whole tensors (one seed, from rank 0), runs its part of the ring, and rank 0
 * gathers the shards and judges. Environment: FLASHC_TEST_SEED (a fixed seed), FLASHC_RING_TEST_VERBOSE=1.
 */
#include "harness.h"

#include <mpi.h>

#include "internal.h" /* fc_store */

#ifdef FLASHC_TEST_CUDA
#include <cuda_runtime.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int rank, world, skipped;
static const char *device_backend; /* --device NAME: a CUDA backend on device tensors (NULL: host) */

/* Every rank's shard bytes into rank 0's whole[world·bytes]. */
static void gather(const void *mine, size_t bytes, void *all) {
  MPI_Gather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
}

static void run_case(const tcase *c, flashc_ring ring, uint64_t seed) {
  whole w;
  whole_make(c, world, seed, &w);
  int on_device = device_backend != NULL;
  outputs local;
  flashc_status s = ring_run_rank(c, ring, world, rank, &w, on_device, &local);
  if (s == FLASHC_ERR_UNSUPPORTED && device_backend) { /* the GPU backend cannot run this case: on every rank */
    if (rank == 0) printf("skip  %-34s (%s: %s)\n", c->name, device_backend, flashc_last_error());
    skipped++;
  } else {
    CHECK(s == FLASHC_OK, "%s: ring forward: %s", c->name, flashc_last_error());
    /* rank 0 collects every rank's shards and puts them in place */
    size_t es = flashc_dtype_size(c->dt), qb = (size_t)(c->B * c->Lq * c->Hq * c->D) * es,
           kb = (size_t)(c->B * c->Lk * c->Hkv * c->D) * es, lb = (size_t)(c->B * c->Hq * c->Lq) * sizeof(float);
    outputs all = {0}, ring_out = {0}, part;
    if (rank == 0) {
      outputs_alloc(&all, c->dt, c->B * c->Lq * c->Hq * c->D * world, c->B * c->Lk * c->Hkv * c->D * world,
                    c->B * c->Hq * c->Lq * world);
      outputs_alloc(&ring_out, c->dt, w.nq, w.nk, w.nlse);
    }
    gather(local.o, qb, all.o);
    gather(local.dq, qb, all.dq);
    gather(local.dk, kb, all.dk);
    gather(local.dv, kb, all.dv);
    gather(local.lse, lb, all.lse);
    int pass = 1;
    if (rank == 0) {
      for (int r = 0; r < world; r++) {
        part.o = (char *)all.o + qb * (size_t)r;
        part.dq = (char *)all.dq + qb * (size_t)r;
        part.dk = (char *)all.dk + kb * (size_t)r;
        part.dv = (char *)all.dv + kb * (size_t)r;
        part.lse = (float *)((char *)all.lse + lb * (size_t)r);
        ring_unshard_outputs(c, world, r, &part, &ring_out);
      }
      pass = ring_judge(c, device_backend ? device_backend : c->backend, on_device, world, &w, &ring_out);
      outputs_free(&all);
      outputs_free(&ring_out);
    }
    MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%s  %-34s (%s, %s%s)\n", pass ? "ok  " : "FAIL", c->name, device_backend ? device_backend : c->backend,
             flashc_dtype_name(c->dt), case_has_backward(c) ? "" : ", forward; backward refused");
  }
  outputs_free(&local);
  whole_free(&w);
}

/* ---- errors: every rank fails alike, and the ring stays usable ---------------------------------------- */
static void test_errors(flashc_ring ring) {
  int failures_before = ring_test_failures();
  int64_t L = 8, H = 2, D = 16, n = L * H * D;
  float *q = calloc((size_t)n, 4), *k = calloc((size_t)n, 4), *v = calloc((size_t)n, 4), *o = calloc((size_t)n, 4);
  float *k2 = calloc((size_t)(L * H * (D + 1)), 4), *v2 = calloc((size_t)(L * H * (D + 1)), 4),
        *q2 = calloc((size_t)(L * H * (D + 1)), 4), *o2 = calloc((size_t)(L * H * (D + 1)), 4);
  for (int64_t i = 0; i < n; i++) q[i] = k[i] = v[i] = (float)ring_uniform();
  flashc_tensor tq = flashc_tensor_bshd(q, FLASHC_F32, 1, L, H, D), tk = flashc_tensor_bshd(k, FLASHC_F32, 1, L, H, D),
                tv = flashc_tensor_bshd(v, FLASHC_F32, 1, L, H, D), to = flashc_tensor_bshd(o, FLASHC_F32, 1, L, H, D);
  flashc_params p = flashc_params_default();
  p.causal = 1;

  /* A rank whose head_dim differs: INVALID_ARGUMENT on all ranks. */
  if (world > 1) {
    flashc_tensor xq = tq, xk = tk, xv = tv, xo = to;
    if (rank == world - 1) {
      xq = flashc_tensor_bshd(q2, FLASHC_F32, 1, L, H, D + 1);
      xk = flashc_tensor_bshd(k2, FLASHC_F32, 1, L, H, D + 1);
      xv = flashc_tensor_bshd(v2, FLASHC_F32, 1, L, H, D + 1);
      xo = flashc_tensor_bshd(o2, FLASHC_F32, 1, L, H, D + 1);
    }
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, &xq, &xk, &xv, &xo, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "head_dim"),
          "mismatched head_dim: got %s (%s)", flashc_status_string(s), flashc_last_error());
  }
  /* One rank's own error (q NULL on rank 0): the same status on all ranks, rank 0 named. */
  {
    flashc_status s =
        flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, rank == 0 ? NULL : &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT, "q NULL on rank 0: got %s (%s)", flashc_status_string(s),
          flashc_last_error());
    CHECK(rank == 0 ? strstr(flashc_last_error(), "q is NULL") != NULL : strstr(flashc_last_error(), "rank 0") != NULL,
          "q NULL on rank 0: message '%s'", flashc_last_error());
  }
  /* Zigzag needs an even local seqlen. */
  {
    flashc_tensor oq = tq, ok = tk, ov = tv, oo = to;
    oq.size[1] = ok.size[1] = ov.size[1] = oo.size[1] = L - 1;
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_ZIGZAG, &oq, &ok, &ov, &oo, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT && strstr(flashc_last_error(), "even"), "odd zigzag: got %s (%s)",
          flashc_status_string(s), flashc_last_error());
    s = flashc_ring_forward(ring, &p, (flashc_ring_layout)7, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_INVALID_ARGUMENT, "layout 7: got %s", flashc_status_string(s));
  }
  /* Varlen and f64 are refused on every rank. */
  {
    int32_t cu[2] = {0, (int32_t)L};
    flashc_params pv = p;
    pv.cu_seqlens_q = pv.cu_seqlens_k = cu;
    pv.num_seqs = 1;
    flashc_status s = flashc_ring_forward(ring, &pv, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_ERR_UNSUPPORTED, "varlen: got %s", flashc_status_string(s));
  }
  /* After all that the ring still works. */
  {
    for (int64_t i = 0; i < n; i++) o[i] = NAN;
    flashc_status s = flashc_ring_forward(ring, &p, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL);
    CHECK(s == FLASHC_OK, "a valid call after errors: %s (%s)", flashc_status_string(s), flashc_last_error());
    int finite = 1;
    for (int64_t i = 0; i < n; i++) finite &= isfinite(o[i]);
    CHECK(finite, "a valid call after errors left non-finite output");
  }
  /* Local errors. */
  CHECK(flashc_ring_forward(NULL, &p, FLASHC_RING_CONTIGUOUS, &tq, &tk, &tv, &to, NULL) == FLASHC_ERR_INVALID_ARGUMENT,
        "NULL ring");
  CHECK(flashc_ring_set_timeout(ring, -1) == FLASHC_ERR_INVALID_ARGUMENT, "negative timeout");
  int r = -1, w = -1;
  CHECK_OK(flashc_ring_info(ring, &r, &w));
  CHECK(r == rank && w == world, "flashc_ring_info: %d/%d, MPI says %d/%d", r, w, rank, world);
  {
    flashc_tensor full = flashc_tensor_bshd(q, FLASHC_F32, 1, 2 * world + 1, 1, 1), shard = full;
    shard.size[1] = 2;
    CHECK(flashc_ring_shard(FLASHC_RING_ZIGZAG, world, rank, &full, &shard) == FLASHC_ERR_INVALID_ARGUMENT,
          "shard of a seqlen that does not split");
  }
  int bad = ring_test_failures() - failures_before, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("%s  errors fail alike on every rank; the ring stays usable\n", any ? "FAIL" : "ok  ");
  free(q), free(k), free(v), free(o), free(q2), free(k2), free(v2), free(o2);
}

/* ---- a peer that dies or stalls ------------------------------------------------------------------------- */

/* ---- a peer that dies or stalls ------------------------------------------------------------------------- */
/* FLASHC_RING_FAULT (set by scripts/ring-test) makes rank 1 exit or stall at step 1 of the forward. Each other
 * rank runs the forward and then the backward: whichever call first depends on rank 1 (a block it never
 * sends, or the backward's agreement it never joins) must fail with FLASHC_ERR_COMMUNICATION within the
 * timeout (plus a step's compute and scheduling slack) — some ranks legitimately finish the forward, since
 * their last block left rank 1 before it died. */
/* The dtype a backend computes in: f32 on the host; on a GPU the first of bf16, f16, f32 it has. */
static flashc_dtype dtype_for(const char *backend) {
  flashc_backend_info info;
  for (int i = 0; i < flashc_backend_count(); i++)
    if (flashc_backend_get(i, &info) == FLASHC_OK && strcmp(info.name, backend) == 0) {
      if (info.device == FLASHC_DEVICE_CPU) return FLASHC_F32;
      flashc_dtype order[3] = {FLASHC_BF16, FLASHC_F16, FLASHC_F32};
      for (int j = 0; j < 3; j++)
        if (info.dtypes & (1u << order[j])) return order[j];
    }
  return FLASHC_F32;
}

static int fault_check(const char *mode) {
  /* On GPUs the first call also creates the NCCL communicator, and an abort takes a moment: more room. */
  const int TIMEOUT_MS = device_backend ? 5000 : 1500;
  flashc_ring ring;
  MPI_Comm comm = MPI_COMM_WORLD;
  const char *backend = device_backend ? device_backend : "cpu";
  int on_device = device_backend != NULL;
  CHECK_OK(flashc_ring_create_mpi(&ring, &comm, backend));
  CHECK_OK(flashc_ring_set_timeout(ring, TIMEOUT_MS));
#ifdef FLASHC_TEST_CUDA
  if (device_backend) cudaSetDevice(flashc_ring_device(ring));
#endif
  flashc_dtype dt = dtype_for(backend);
  int64_t L = 16, H = 2, D = 64, n = L * H * D;
  size_t bytes = (size_t)n * flashc_dtype_size(dt);
  void *host = malloc(bytes);
  for (int64_t i = 0; i < n; i++) fc_store(host, dt, i, ring_uniform());
  void *q = place(on_device, host, bytes), *o = place(on_device, NULL, bytes), *dq = place(on_device, NULL, bytes),
       *dk = place(on_device, NULL, bytes), *dv = place(on_device, NULL, bytes),
       *lse = place(on_device, NULL, (size_t)(L * H) * sizeof(float));
  flashc_tensor t = flashc_tensor_bshd(q, dt, 1, L, H, D), to = flashc_tensor_bshd(o, dt, 1, L, H, D),
                tdq = flashc_tensor_bshd(dq, dt, 1, L, H, D), tdk = flashc_tensor_bshd(dk, dt, 1, L, H, D),
                tdv = flashc_tensor_bshd(dv, dt, 1, L, H, D);
  int faulty = 0, frank = -1, fstep = -1;
  const char *spec = getenv("FLASHC_RING_FAULT");
  if (spec && strchr(spec, ':') && sscanf(strchr(spec, ':') + 1, "%d:%d", &frank, &fstep) == 2) faulty = rank == frank;
  MPI_Barrier(MPI_COMM_WORLD);
  const char *call = "forward";
  struct timespec t0, t1, begin;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  begin = t0;
  flashc_status s = flashc_ring_forward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, lse);
  if (s == FLASHC_OK) {
    call = "backward";
    clock_gettime(CLOCK_MONOTONIC, &t0);
    s = flashc_ring_backward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, lse, &t, &tdq, &tdk, &tdv);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  int ok = s == FLASHC_ERR_COMMUNICATION && ms <= 2.0 * TIMEOUT_MS + 3000.0;
  char why[512];
  snprintf(why, sizeof why, "%s", flashc_last_error());
  /* A later call fails at once: the ring knows it is broken. */
  if (ok) {
    flashc_status again = flashc_ring_forward(ring, NULL, FLASHC_RING_CONTIGUOUS, &t, &t, &t, &to, NULL);
    ok = again == FLASHC_ERR_COMMUNICATION && strstr(flashc_last_error(), "failed earlier");
  }
  printf("RING-FAULT-CHECK mode %s rank %d%s: %s %s after %.0f ms (timeout %d ms): %s -> %s\n", mode, rank,
         faulty ? " (the faulty one)" : "", call, flashc_status_string(s), ms, TIMEOUT_MS, why,
         faulty ? "n/a"
         : ok   ? "ok"
                : "FAIL");
  fflush(stdout);
  flashc_ring_destroy(ring);
  void *placed[] = {q, o, dq, dk, dv, lse};
  for (size_t i = 0; i < sizeof placed / sizeof placed[0]; i++) unplace(on_device, placed[i]);
  free(host);
  /* A peer is gone or out of step: MPI_Finalize could wait for it forever, so the process ends with _exit.
   * Open MPI then ends the whole job, so wait first until every rank that is on time has reported. */
  double deadline_ms = 2.0 * TIMEOUT_MS + 3500.0;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double spent = (t1.tv_sec - begin.tv_sec) * 1e3 + (t1.tv_nsec - begin.tv_nsec) / 1e6;
  if (!faulty && spent < deadline_ms) {
    double rest = deadline_ms - spent;
    struct timespec nap = {(time_t)(rest / 1e3), (long)(fmod(rest, 1e3) * 1e6)};
    nanosleep(&nap, NULL);
  }
  _exit(faulty || ok ? 0 : 1);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ring_test_rank = rank;
  ring_test_verbose = getenv("FLASHC_RING_TEST_VERBOSE") != NULL;
  const char *fault = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--fault") == 0 && i + 1 < argc) {
      fault = argv[++i];
    } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      device_backend = argv[++i];
    } else {
      if (rank == 0) fprintf(stderr, "usage: test_ring [--fault exit|stall] [--device BACKEND]\n");
      MPI_Finalize();
      return 2;
    }
  }
#ifndef FLASHC_TEST_CUDA
  if (device_backend) {
    if (rank == 0) fprintf(stderr, "test_ring: --device needs a CUDA build\n");
    MPI_Finalize();
    return 2;
  }
#endif
  uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  if (getenv("FLASHC_TEST_SEED")) seed = strtoull(getenv("FLASHC_TEST_SEED"), NULL, 10);
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  ring_rng_seed(seed);
  if (fault) return fault_check(fault);
  if (rank == 0)
    printf("test_ring: %d rank(s), %s, seed %llu (FLASHC_TEST_SEED)\n", world,
           device_backend ? device_backend : "host (cpu, cpu-ref)", (unsigned long long)seed);

  MPI_Comm comm = MPI_COMM_WORLD;
  flashc_ring rings[2] = {NULL, NULL};
  const char *backends[2] = {device_backend ? device_backend : "cpu", "cpu-ref"};
  for (int b = 0; b < (device_backend ? 1 : 2); b++) {
    flashc_status s = flashc_ring_create_mpi(&rings[b], &comm, backends[b]);
    CHECK(s == FLASHC_OK, "flashc_ring_create_mpi(%s): %s", backends[b], flashc_last_error());
    if (s == FLASHC_OK) flashc_set_threads(flashc_ring_handle(rings[b]), 1);
  }
#ifdef FLASHC_TEST_CUDA
  if (device_backend && rings[0]) cudaSetDevice(flashc_ring_device(rings[0]));
#endif
  if (rings[0] && (rings[1] || device_backend)) {
    for (int i = 0; i < ring_n_cases; i++) {
      const tcase *c = &ring_cases[i];
      if (device_backend) { /* the GPU backend in place of cpu; its blocks are always native */
        if (!case_has_backward(c) || c->native) continue;
        if (!backend_takes(device_backend, c)) {
          if (rank == 0)
            printf("skip  %-34s (%s has no %s or head_dim %lld)\n", c->name, device_backend, flashc_dtype_name(c->dt),
                   (long long)c->D);
          skipped++;
          continue;
        }
      }
      run_case(c, strcmp(c->backend, "cpu") == 0 ? rings[0] : rings[1], seed + 1000003ull * (uint64_t)i);
    }
    if (!device_backend) test_errors(rings[0]);
  }
  for (int b = 0; b < 2; b++) flashc_ring_destroy(rings[b]);

  int mine = ring_test_failures(), all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("test_ring: %s (%d failed checks over %d ranks; %d cases skipped)\n", all ? "FAILED" : "passed", all, world,
           skipped);
  MPI_Finalize();
  return all ? 1 : 0;
}
