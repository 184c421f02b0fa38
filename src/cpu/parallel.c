/* parallel.c — fc_parallel_for on a pool of POSIX threads that lives as long as the process.
 *
 * Threads are started once, not per call: a pool of w workers is made the first time a call needs w of
 * them and is then reused by every later call (any handle, any thread) that needs at most w. A caller takes
 * a whole idle pool for the length of its call, so calls from several threads at once (one handle each) run
 * side by side on pools of their own, and a task may itself call fc_parallel_for. Pools are never freed
 * while the process runs; there is one per thread count in use by concurrent callers, which is one in the
 * common case. A child made by fork() starts with no pools (their threads did not survive the fork).
 *
 * Indices are handed out one at a time through an atomic counter, so an uneven workload balances itself, in
 * increasing order: a task may wait for one with a smaller index (that one is already running or done). */
#define _GNU_SOURCE /* sched_getaffinity */
#include "../internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

enum { MAX_THREADS = 256 };

typedef struct fc_job {
  void (*fn)(void *ctx, int64_t i, int worker);
  void *ctx;
  int64_t n;
  atomic_llong next;
} fc_job;

typedef struct fc_pool fc_pool;
typedef struct {
  fc_pool *pool;
  int worker; /* 1 .. workers; the caller is worker 0 */
} fc_seat;

struct fc_pool {
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  fc_job *job;
  uint64_t generation; /* bumped per job, so a worker never runs one job twice */
  int taking_part;     /* workers [1, taking_part] run the current job */
  int running;         /* of those, still working on it */
  int stop;
  int workers;   /* threads started */
  int busy;      /* taken by a caller (guarded by the list's lock) */
  fc_pool *next; /* the list of pools */
  pthread_t tid[MAX_THREADS];
  fc_seat seats[MAX_THREADS];
};

static void run_job(fc_job *job, int worker) {
  for (;;) {
    const int64_t i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
    if (i >= job->n) break;
    job->fn(job->ctx, i, worker);
  }
}

static void *worker_main(void *arg) {
  const fc_seat *seat = arg;
  fc_pool *pool = seat->pool;
  uint64_t seen = 0;
  pthread_mutex_lock(&pool->mu);
  for (;;) {
    while (!pool->stop && (pool->generation == seen || seat->worker > pool->taking_part))
      pthread_cond_wait(&pool->wake, &pool->mu);
    if (pool->stop) break;
    seen = pool->generation;
    fc_job *job = pool->job;
    pthread_mutex_unlock(&pool->mu);
    run_job(job, seat->worker);
    pthread_mutex_lock(&pool->mu);
    if (--pool->running == 0) pthread_cond_signal(&pool->done);
  }
  pthread_mutex_unlock(&pool->mu);
  return NULL;
}

/* ---- the pools ----------------------------------------------------------------------------------------- */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static fc_pool *pools; /* guarded by pools_lock */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* fork() copies only the calling thread: the child must not wait for the pools' threads, which it does not
 * have. The list's lock is held across the fork, so that the child gets it in a known state, and the child
 * forgets the pools. */
static void lock_before_fork(void) { pthread_mutex_lock(&pools_lock); }
static void unlock_in_parent(void) { pthread_mutex_unlock(&pools_lock); }
static void forget_pools_in_child(void) {
  pools = NULL;
  pthread_mutex_unlock(&pools_lock);
}
static void register_atfork(void) { pthread_atfork(lock_before_fork, unlock_in_parent, forget_pools_in_child); }

/* A pool of `workers` threads (fewer if the system refuses some: the job still completes, the caller takes
 * part), or NULL when none could be made. */
static fc_pool *pool_new(int workers) {
  fc_pool *pool = calloc(1, sizeof *pool);
  if (!pool) return NULL;
  if (pthread_mutex_init(&pool->mu, NULL) != 0) goto fail_mu;
  if (pthread_cond_init(&pool->wake, NULL) != 0) goto fail_wake;
  if (pthread_cond_init(&pool->done, NULL) != 0) goto fail_done;
  for (int w = 1; w <= workers; w++) {
    pool->seats[w] = (fc_seat){pool, w};
    if (pthread_create(&pool->tid[w], NULL, worker_main, &pool->seats[w]) != 0) break;
    pool->workers = w;
  }
  if (pool->workers > 0) return pool;
  pthread_cond_destroy(&pool->done);
fail_done:
  pthread_cond_destroy(&pool->wake);
fail_wake:
  pthread_mutex_destroy(&pool->mu);
fail_mu:
  free(pool);
  return NULL;
}

/* An idle pool with at least `workers` threads (the smallest such), made if there is none; NULL if none
 * can be made. */
static fc_pool *pool_take(int workers) {
  pthread_once(&atfork_once, register_atfork);
  pthread_mutex_lock(&pools_lock);
  fc_pool *best = NULL;
  for (fc_pool *p = pools; p; p = p->next)
    if (!p->busy && p->workers >= workers && (!best || p->workers < best->workers)) best = p;
  if (!best && (best = pool_new(workers)) != NULL) {
    best->next = pools;
    pools = best;
  }
  if (best) best->busy = 1;
  pthread_mutex_unlock(&pools_lock);
  return best;
}

static void pool_give_back(fc_pool *pool) {
  pthread_mutex_lock(&pools_lock);
  pool->busy = 0;
  pthread_mutex_unlock(&pools_lock);
}

/* At exit (or unload of the library), stop the idle pools' threads so that none runs in unmapped code. */
__attribute__((destructor)) static void stop_pools(void) {
  pthread_mutex_lock(&pools_lock);
  for (fc_pool *p = pools; p; p = p->next) {
    if (p->busy) continue; /* a caller is still inside: leave it alone */
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int w = 1; w <= p->workers; w++) pthread_join(p->tid[w], NULL);
    p->workers = 0;
    p->busy = 1; /* never taken again */
  }
  pthread_mutex_unlock(&pools_lock);
}

/* ---- the public part ------------------------------------------------------------------------------------ */
int fc_cpu_count(void) {
#if defined(__linux__)
  /* The cores this process may run on (taskset, cgroups' cpusets), not all of the machine's. */
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n >= 1) return n;
  }
#endif
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (int)n;
}

void fc_parallel_for(int threads, int64_t n, void (*fn)(void *ctx, int64_t i, int worker), void *ctx) {
  fc_job job = {.fn = fn, .ctx = ctx, .n = n};
  atomic_init(&job.next, 0);
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads > n) threads = (int)n;
  fc_pool *pool = threads > 1 ? pool_take(threads - 1) : NULL;
  if (!pool) { /* one thread, or no thread could be started: the caller does it all */
    run_job(&job, 0);
    return;
  }
  const int helpers = threads - 1 < pool->workers ? threads - 1 : pool->workers;
  pthread_mutex_lock(&pool->mu);
  pool->job = &job;
  pool->generation++;
  pool->taking_part = helpers;
  pool->running = helpers;
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->mu);

  run_job(&job, 0);

  /* Every helper must be done with `job` (on this stack) before returning. */
  pthread_mutex_lock(&pool->mu);
  while (pool->running > 0) pthread_cond_wait(&pool->done, &pool->mu);
  pthread_mutex_unlock(&pool->mu);
  pool_give_back(pool);
}
