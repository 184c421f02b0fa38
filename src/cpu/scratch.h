/*
 * scratch.h — per-worker scratch for the CPU backends, carved from the handle's host workspace.
 *
 * One fc_host_workspace call per backend call (a second call may move the buffer), laid out as
 *   [shared bytes][worker 0][worker 1]...[worker T−1]
 * with every part 64-byte aligned (a cache line; also what AVX loads like best). A task finds its slice by
 * the `worker` index fc_parallel_for hands it, so no task allocates.
 */
#ifndef FLASHC_CPU_SCRATCH_H
#define FLASHC_CPU_SCRATCH_H

#include "../internal.h"

enum { FC_SCRATCH_ALIGN = 64 };

typedef struct fc_scratch {
  char *shared;  /* the shared bytes, or NULL when none were asked for */
  char *workers; /* slice w starts at workers + w·stride */
  size_t stride;
  int threads; /* the thread count to pass to fc_parallel_for: every worker index is below it */
} fc_scratch;

static inline size_t fc_align_up(size_t n) { return (n + FC_SCRATCH_ALIGN - 1) / FC_SCRATCH_ALIGN * FC_SCRATCH_ALIGN; }

/* The threads worth starting for `tasks` tasks: never more than p->threads, the tasks, the 256 that
 * fc_parallel_for starts at most, or one per FC_WORK_PER_THREAD multiply-adds of Q·Kᵀ (batch · heads_q · seqlen_q ·
 * seqlen_k · the larger head dim; seqlens the longest under varlen). A helper thread costs its wake-up and the join,
 * a few microseconds, and far more where another runtime's threads spin on the same cores: PyTorch's intra-op
 * threads do after each of its calls, and b1 s16 h8 d64 (131k multiply-adds, 17 µs on one thread) took 52.6 µs per
 * flashc.torch.attention at 2 threads against 29.7 at 1 (bench/torch_call_cost.py, a 2-core Xeon). 2^18 is about
 * 10 µs of the cpu backend's work at that size: s32 (4× the work) already ran faster on 2 threads (40.6 against
 * 49.0 µs, flashc_forward from C). Threads never change the bits (the tasks' arithmetic depends on the shape). */
enum { FC_WORK_PER_THREAD = 1 << 18 };
static inline int fc_scratch_threads(const fc_problem *p, int64_t tasks) {
  int64_t t = p->threads;
  if (t > tasks) t = tasks;
  const double d = (double)(p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v),
               work = (double)p->batch * (double)p->heads_q * (double)p->seqlen_q * (double)p->seqlen_k * d;
  if ((double)t * FC_WORK_PER_THREAD > work) t = (int64_t)(work / FC_WORK_PER_THREAD);
  if (t > 256) t = 256;
  return t < 1 ? 1 : (int)t;
}

static inline flashc_status fc_scratch_get(const fc_problem *p, int64_t tasks, size_t shared_bytes,
                                           size_t per_worker_bytes, fc_scratch *out) {
  out->threads = fc_scratch_threads(p, tasks);
  out->stride = fc_align_up(per_worker_bytes);
  size_t shared = fc_align_up(shared_bytes), workers, total;
  if (__builtin_mul_overflow(out->stride, (size_t)out->threads, &workers) ||
      __builtin_add_overflow(shared, workers, &total) || __builtin_add_overflow(total, FC_SCRATCH_ALIGN, &total))
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "CPU scratch of %d workers x %zu bytes overflows size_t", out->threads,
                    per_worker_bytes);
  void *base;
  FC_CHECK(fc_host_workspace(p, total, &base));
  char *aligned = (char *)(((uintptr_t)base + FC_SCRATCH_ALIGN - 1) & ~(uintptr_t)(FC_SCRATCH_ALIGN - 1));
  out->shared = shared_bytes ? aligned : NULL;
  out->workers = aligned + shared;
  return FLASHC_OK;
}

static inline void *fc_scratch_worker(const fc_scratch *s, int worker) {
  return s->workers + (size_t)worker * s->stride;
}

/* Carving one worker's slice into tiles: each call takes n floats, 64-byte aligned. With base NULL it only
 * counts, so one function both sizes the slice (before the workspace exists) and lays it out. */
typedef struct fc_carve {
  char *base;
  size_t used;
} fc_carve;

static inline float *fc_carve_floats(fc_carve *c, int64_t n) {
  float *out = c->base ? (float *)(c->base + c->used) : NULL;
  c->used += fc_align_up((size_t)n * sizeof(float));
  return out;
}

#endif /* FLASHC_CPU_SCRATCH_H */
