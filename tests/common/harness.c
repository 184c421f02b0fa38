/* harness.c — the run: its seed, failures and summary, environment filters, random numbers. */
#include "harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *prog_name = "test";
static uint64_t run_seed;
static bool seed_ready;
static int n_checks, n_failures;

uint64_t th_seed(void) {
  if (!seed_ready) {
    const char *env = getenv("FLASHC_TEST_SEED");
    if (env && *env) {
      run_seed = strtoull(env, NULL, 0);
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      run_seed = ((uint64_t)ts.tv_sec * 1000000007u) ^ ((uint64_t)ts.tv_nsec << 16) ^ (uint64_t)getpid();
      run_seed &= 0xffffffffffffull; /* short enough to type back in */
    }
    seed_ready = true;
  }
  return run_seed;
}

void th_begin(const char *prog) {
  prog_name = prog;
  setvbuf(stdout, NULL, _IOLBF, 0); /* lines reach ctest's log in order with stderr */
  printf("%s: seed %llu (repeat with FLASHC_TEST_SEED=%llu)\n", prog, (unsigned long long)th_seed(),
         (unsigned long long)th_seed());
}

static void vfail(const char *fmt, va_list ap) {
  n_failures++;
  printf("FAIL: ");
  vprintf(fmt, ap);
  printf("\n");
}

void th_fail(const char *fmt, ...) {
  n_checks++;
  va_list ap;
  va_start(ap, fmt);
  vfail(fmt, ap);
  va_end(ap);
}

bool th_check(bool ok, const char *fmt, ...) {
  n_checks++;
  if (!ok) {
    va_list ap;
    va_start(ap, fmt);
    vfail(fmt, ap);
    va_end(ap);
  }
  return ok;
}

int th_failures(void) { return n_failures; }

int th_end(void) {
  printf("%s: %d checks, %d failures\n", prog_name, n_checks, n_failures);
  if (n_failures) {
    printf("%s: FAILED; seed %llu (repeat with FLASHC_TEST_SEED=%llu)\n", prog_name, (unsigned long long)th_seed(),
           (unsigned long long)th_seed());
    return 1;
  }
  printf("%s: passed\n", prog_name);
  return 0;
}

bool th_quick(void) {
  const char *env = getenv("FLASHC_TEST_QUICK");
  return env && *env && strcmp(env, "0") != 0;
}

bool th_env_list_has(const char *var, const char *name) {
  const char *list = getenv(var);
  if (!list || !*list) return true;
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    while (len && *p == ' ') p++, len--;
    while (len && p[len - 1] == ' ') len--;
    if (len == n && strncmp(p, name, n) == 0) return true;
    if (!end) break;
    p = end + 1;
  }
  return false;
}

double th_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- random numbers --------------------------------------------------------------------------------- */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void th_rng_init(th_rng *r, uint64_t seed) {
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t th_rng_u64(th_rng *r) {
  uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return out;
}

double th_rng_uniform(th_rng *r) { return (double)(th_rng_u64(r) >> 11) * 0x1p-53; }

double th_rng_normal(th_rng *r) {
  /* Box–Muller; 1 − u keeps the logarithm's argument in (0, 1]. */
  double u = 1.0 - th_rng_uniform(r), w = th_rng_uniform(r);
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w);
}

void th_normal_inputs(th_rng *r, int64_t nq, int64_t nk, double **q, double **k, double **v, double **dout) {
  *q = malloc((size_t)nq * sizeof(double)), *dout = malloc((size_t)nq * sizeof(double));
  *k = malloc((size_t)nk * sizeof(double)), *v = malloc((size_t)nk * sizeof(double));
  for (int64_t x = 0; x < nq; x++)
    (*q)[x] = th_round(FLASHC_BF16, th_rng_normal(r)), (*dout)[x] = th_round(FLASHC_BF16, th_rng_normal(r));
  for (int64_t x = 0; x < nk; x++)
    (*k)[x] = th_round(FLASHC_BF16, th_rng_normal(r)), (*v)[x] = th_round(FLASHC_BF16, th_rng_normal(r));
}
