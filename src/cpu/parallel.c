/* parallel.c — a minimal parallel-for on POSIX threads.
 *
 * Threads are started per call: attention calls are long (milliseconds and up) next to the ~20 µs it
 * costs to start a few threads, and owning no pool means no state to tear down, no fork hazards and
 * nothing shared between handles. Indices are handed out one at a time through an atomic counter, so an
 * uneven workload (causal rows) balances itself. */
#include "../internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

typedef struct {
  void (*fn)(void *ctx, int64_t i, int worker);
  void *ctx;
  int64_t n;
  atomic_llong next;
} fc_job;

typedef struct {
  fc_job *job;
  int worker;
} fc_worker;

static void *run_job(void *arg) {
  fc_worker *w = arg;
  for (;;) {
    int64_t i = atomic_fetch_add(&w->job->next, 1);
    if (i >= w->job->n) break;
    w->job->fn(w->job->ctx, i, w->worker);
  }
  return NULL;
}

int fc_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

void fc_parallel_for(int threads, int64_t n, void (*fn)(void *ctx, int64_t i, int worker), void *ctx) {
  enum { MAX_THREADS = 256 };
  fc_job job = {.fn = fn, .ctx = ctx, .n = n};
  atomic_init(&job.next, 0);
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads > n) threads = (int)n;
  if (threads < 1) threads = 1;
  pthread_t tid[MAX_THREADS];
  fc_worker workers[MAX_THREADS];
  int started = 0;
  for (int t = 1; t < threads; t++) {
    workers[t] = (fc_worker){&job, t};
    if (pthread_create(&tid[started], NULL, run_job, &workers[t]) != 0) break; /* fewer threads, same result */
    started++;
  }
  workers[0] = (fc_worker){&job, 0};
  run_job(&workers[0]);
  for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);
}
