/*
 * test_cpu_threads.c — the `cpu` backend's threads (src/cpu/parallel.c and the task split of flash.c and
 * flash_bwd.c):
 *
 *   thread counts  o, lse, dq, dk, dv bit-identical at 1, 2, 3, 5, 8 and 16 threads (more threads than cores
 *                  included): every row's arithmetic and the order of the dQ sums are fixed by the shape alone;
 *   concurrency    four threads, each with its own handle and thread count, calling forward and backward at
 *                  the same time (the pools are shared by the process), give the same bits;
 *   fork           a child made by fork() after the pools exist computes the same bits (it must not wait for
 *                  the parent's pool threads, which it does not have).
 * Correctness against the reference is test_backends' job; this one checks that threads change nothing.
 */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct shape {
  const char *name;
  int64_t sq, sk, hq, hkv, d;
  int causal;
  int64_t wl, wr; /* window, −1 unbounded */
  flashc_dtype dtype;
} shape;

static const shape shapes[] = {
    {"300-causal-gqa", 300, 300, 4, 2, 64, 1, -1, -1, FLASHC_F32},
    {"517-d128", 517, 517, 2, 2, 128, 0, -1, -1, FLASHC_F32},
    {"257x400-d59-mqa-bf16", 257, 400, 8, 1, 59, 1, -1, -1, FLASHC_BF16},
    {"1000-causal-f16", 1000, 1000, 2, 2, 64, 1, -1, -1, FLASHC_F16},
    {"1500x1300-window", 1500, 1300, 4, 2, 64, 0, 300, 40, FLASHC_F32},
    {"2048-causal", 2048, 2048, 2, 2, 64, 1, -1, -1, FLASHC_F32},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

/* One problem's inputs and one set of outputs (BSHD, batch 1). */
typedef struct run {
  const shape *sh;
  th_tensor q, k, v, dout, o, dq, dk, dv;
  float *lse;
} run;

static void run_init(run *r, const shape *sh, uint64_t seed) {
  th_rng rng;
  th_rng_init(&rng, seed);
  r->sh = sh;
  r->q = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sq, sh->hq, sh->d);
  r->k = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sk, sh->hkv, sh->d);
  r->v = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sk, sh->hkv, sh->d);
  r->dout = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sq, sh->hq, sh->d);
  r->o = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sq, sh->hq, sh->d);
  r->dq = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sq, sh->hq, sh->d);
  r->dk = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sk, sh->hkv, sh->d);
  r->dv = th_tensor_new(sh->dtype, TH_BSHD, 1, sh->sk, sh->hkv, sh->d);
  th_fill_normal(&r->q, &rng), th_fill_normal(&r->k, &rng), th_fill_normal(&r->v, &rng);
  th_fill_normal(&r->dout, &rng);
  r->lse = malloc(sizeof(float) * (size_t)(sh->hq * sh->sq));
  if (!r->lse) abort();
}

static void run_free(run *r) {
  th_tensor *all[] = {&r->q, &r->k, &r->v, &r->dout, &r->o, &r->dq, &r->dk, &r->dv};
  for (int i = 0; i < 8; i++) th_tensor_free(all[i]);
  free(r->lse);
}

/* Forward then backward (from that forward's o and lse) on `threads` threads, outputs poisoned first. */
static bool run_call(run *r, int threads) {
  const shape *sh = r->sh;
  flashc_handle h;
  if (flashc_create(&h, "cpu") != FLASHC_OK || flashc_set_threads(h, threads) != FLASHC_OK) return false;
  flashc_params p = flashc_params_default();
  p.causal = sh->causal, p.window_left = sh->wl, p.window_right = sh->wr;
  th_poison(&r->o), th_poison(&r->dq), th_poison(&r->dk), th_poison(&r->dv);
  memset(r->lse, 0xff, sizeof(float) * (size_t)(sh->hq * sh->sq));
  bool ok = flashc_forward(h, &p, &r->q.view, &r->k.view, &r->v.view, &r->o.view, r->lse) == FLASHC_OK &&
            flashc_backward(h, &p, &r->q.view, &r->k.view, &r->v.view, &r->o.view, r->lse, &r->dout.view, &r->dq.view,
                            &r->dk.view, &r->dv.view) == FLASHC_OK;
  flashc_destroy(h);
  return ok;
}

static bool same_outputs(const run *a, const run *b) {
  return memcmp(a->o.alloc, b->o.alloc, a->o.alloc_bytes) == 0 &&
         memcmp(a->dq.alloc, b->dq.alloc, a->dq.alloc_bytes) == 0 &&
         memcmp(a->dk.alloc, b->dk.alloc, a->dk.alloc_bytes) == 0 &&
         memcmp(a->dv.alloc, b->dv.alloc, a->dv.alloc_bytes) == 0 &&
         memcmp(a->lse, b->lse, sizeof(float) * (size_t)(a->sh->hq * a->sh->sq)) == 0;
}

typedef struct concurrent {
  const run *ref;
  run mine;
  int threads;
  bool ok;
} concurrent;

static void *concurrent_main(void *arg) {
  concurrent *c = arg;
  c->ok = true;
  for (int rep = 0; rep < 3 && c->ok; rep++) c->ok = run_call(&c->mine, c->threads) && same_outputs(&c->mine, c->ref);
  return NULL;
}

int main(void) {
  th_begin("test_cpu_threads");
  const int counts[] = {2, 3, 5, 8, 16};
  const int nshapes = th_quick() ? 3 : NSHAPES;
  for (int i = 0; i < nshapes; i++) {
    const shape *sh = &shapes[i];
    const uint64_t seed = th_seed() + (uint64_t)i;
    run ref;
    run_init(&ref, sh, seed);
    if (!th_check(run_call(&ref, 1), "%s: call on 1 thread failed: %s", sh->name, flashc_last_error())) continue;
    th_check_output(&ref.o, "o"), th_check_output(&ref.dq, "dq"), th_check_output(&ref.dk, "dk");
    th_check_output(&ref.dv, "dv");

    for (size_t t = 0; t < sizeof counts / sizeof *counts; t++) {
      run r;
      run_init(&r, sh, seed);
      th_check(run_call(&r, counts[t]) && same_outputs(&r, &ref), "%s: %d threads differ from 1 thread", sh->name,
               counts[t]);
      run_free(&r);
    }

    concurrent c[4];
    pthread_t tid[4];
    for (int t = 0; t < 4; t++) {
      c[t].ref = &ref, c[t].threads = t + 1;
      run_init(&c[t].mine, sh, seed);
      if (pthread_create(&tid[t], NULL, concurrent_main, &c[t]) != 0) abort();
    }
    for (int t = 0; t < 4; t++) {
      pthread_join(tid[t], NULL);
      th_check(c[t].ok, "%s: concurrent handle on %d threads differs", sh->name, c[t].threads);
      run_free(&c[t].mine);
    }

    if (i == 0) { /* the pools exist now */
      fflush(stdout);
      const pid_t pid = fork();
      if (pid == 0) {
        run r;
        run_init(&r, sh, seed);
        _exit(run_call(&r, 2) && same_outputs(&r, &ref) ? 0 : 3);
      }
      int status = 0;
      th_check(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "%s: a forked child's call failed or differs", sh->name);
    }
    printf("%-22s thread counts 1, 2, 3, 5, 8, 16 and four concurrent handles%s: checked\n", sh->name,
           i == 0 ? " and fork" : "");
    run_free(&ref);
  }
  return th_end();
}
