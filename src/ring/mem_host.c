/* mem_host.c — the ring's buffer operations in host memory: fill, copy with conversion, accumulate, and the
 * merge of partial attention through the log-sum-exp. Rows are spread over the handle's threads. */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

static flashc_status host_alloc(size_t bytes, void **ptr) {
  *ptr = malloc(bytes ? bytes : 1);
  if (!*ptr)
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY,
                    "ring attention: %zu bytes (%.2f GiB) of host buffers could not be "
                    "allocated",
                    bytes, bytes / 1073741824.0);
  return FLASHC_OK;
}

static void host_release(void *ptr) { free(ptr); }

/* ---- rows spread over threads ---------------------------------------------------------------------- */
/* A row is (b, s, h): d contiguous elements. fn(job, row, b, s, h) runs once per row. */
typedef struct row_job {
  fc_shape shape;
  int64_t rows, chunk;
  void (*fn)(const struct row_job *job, int64_t b, int64_t s, int64_t h);
  fc_tile src, dst;
  const float *part_lse;
  float *acc_lse;
  int64_t part_len, acc_len, row0;
  float value;
} row_job;

static void run_chunk(void *ctx, int64_t i, int worker) {
  (void)worker;
  const row_job *job = ctx;
  int64_t end = (i + 1) * job->chunk < job->rows ? (i + 1) * job->chunk : job->rows;
  for (int64_t r = i * job->chunk; r < end; r++) {
    int64_t h = r % job->shape.h, bs = r / job->shape.h;
    job->fn(job, bs / job->shape.s, bs % job->shape.s, h);
  }
}

/* Small jobs stay on the calling thread: starting threads costs more than they would save. */
static void run_rows(const fc_problem *ctx, row_job *job) {
  job->rows = job->shape.b * job->shape.s * job->shape.h;
  int threads = ctx->threads;
  if (job->rows * job->shape.d < (1 << 16)) threads = 1;
  int64_t pieces = (int64_t)threads * 8;
  job->chunk = (job->rows + pieces - 1) / pieces;
  if (job->chunk < 1) job->chunk = 1;
  fc_parallel_for(threads, (job->rows + job->chunk - 1) / job->chunk, run_chunk, job);
}

static inline char *row_ptr(const fc_tile *t, int64_t b, int64_t s, int64_t h) {
  return (char *)t->data + (b * t->stride_b + s * t->stride_s + h * t->stride_h) * (int64_t)flashc_dtype_size(t->dtype);
}

/* Row of n elements of any dtype → f32. */
static void load_row(const void *src, flashc_dtype dt, int64_t n, float *out) {
  switch (dt) {
  case FLASHC_F32: memcpy(out, src, (size_t)n * sizeof(float)); return;
  case FLASHC_BF16:
    for (int64_t i = 0; i < n; i++) out[i] = fc_bf16_to_f32(((const uint16_t *)src)[i]);
    return;
  case FLASHC_F16:
    for (int64_t i = 0; i < n; i++) out[i] = fc_f16_to_f32(((const uint16_t *)src)[i]);
    return;
  case FLASHC_F64:
    for (int64_t i = 0; i < n; i++) out[i] = (float)((const double *)src)[i];
    return;
  }
}

enum { MAX_ROW = 1024 }; /* rows longer than this are done in pieces */

/* ---- fill ------------------------------------------------------------------------------------------ */
static void fill_row(const row_job *job, int64_t b, int64_t s, int64_t h) {
  float *d = (float *)row_ptr(&job->dst, b, s, h);
  for (int64_t i = 0; i < job->shape.d; i++) d[i] = job->value;
}

static flashc_status host_fill(const fc_problem *ctx, float *dst, int64_t n, float value) {
  if (n <= 0) return FLASHC_OK;
  /* n as rows of up to 4096 values, the last one short */
  int64_t width = n < 4096 ? n : 4096, full_rows = n / width, rest = n - full_rows * width;
  row_job job = {.shape = {1, full_rows, 1, width}, .fn = fill_row, .value = value};
  job.dst = (fc_tile){dst, FLASHC_F32, 0, width, 0};
  if (full_rows) run_rows(ctx, &job);
  for (int64_t i = 0; i < rest; i++) dst[full_rows * width + i] = value;
  return FLASHC_OK;
}

/* ---- copy ------------------------------------------------------------------------------------------ */
static void copy_row(const row_job *job, int64_t b, int64_t s, int64_t h) {
  const char *src = row_ptr(&job->src, b, s, h);
  char *dst = row_ptr(&job->dst, b, s, h);
  int64_t d = job->shape.d;
  if (job->src.dtype == job->dst.dtype) {
    memcpy(dst, src, (size_t)d * flashc_dtype_size(job->src.dtype));
    return;
  }
  float buf[MAX_ROW];
  size_t ss = flashc_dtype_size(job->src.dtype), ds = flashc_dtype_size(job->dst.dtype);
  for (int64_t i0 = 0; i0 < d; i0 += MAX_ROW) {
    int64_t n = d - i0 < MAX_ROW ? d - i0 : MAX_ROW;
    load_row(src + i0 * (int64_t)ss, job->src.dtype, n, buf);
    for (int64_t i = 0; i < n; i++) fc_store(dst + i0 * (int64_t)ds, job->dst.dtype, i, buf[i]);
  }
}

static flashc_status host_copy(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst) {
  row_job job = {.shape = shape, .fn = copy_row, .src = src, .dst = dst};
  run_rows(ctx, &job);
  return FLASHC_OK;
}

/* ---- add ------------------------------------------------------------------------------------------- */
static void add_row(const row_job *job, int64_t b, int64_t s, int64_t h) {
  const char *src = row_ptr(&job->src, b, s, h);
  float *dst = (float *)row_ptr(&job->dst, b, s, h);
  size_t ss = flashc_dtype_size(job->src.dtype);
  float buf[MAX_ROW];
  for (int64_t i0 = 0; i0 < job->shape.d; i0 += MAX_ROW) {
    int64_t n = job->shape.d - i0 < MAX_ROW ? job->shape.d - i0 : MAX_ROW;
    load_row(src + i0 * (int64_t)ss, job->src.dtype, n, buf);
    for (int64_t i = 0; i < n; i++) dst[i0 + i] += buf[i];
  }
}

static flashc_status host_add(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst) {
  row_job job = {.shape = shape, .fn = add_row, .src = src, .dst = dst};
  run_rows(ctx, &job);
  return FLASHC_OK;
}

/* ---- merge ----------------------------------------------------------------------------------------- */
/* Row (b, s, h) of the part merges into row (b, row0 + s, h) of the accumulator:
 *   w = σ(lse₂ − lse₁) = e^lse₂ / (e^lse₁ + e^lse₂)       the part's share of the softmax mass
 *   o = o₁ − w·(o₁ − o₂)                                  (= (1 − w)·o₁ + w·o₂)
 *   lse = max(lse₁, lse₂) + log1p(e^−|lse₁ − lse₂|)       (= log(e^lse₁ + e^lse₂))
 * Only exponentials of non-positive numbers are taken, so nothing overflows; a −inf side saw no key. */
static void merge_row(const row_job *job, int64_t b, int64_t s, int64_t h) {
  float *l1 = &job->acc_lse[(b * job->shape.h + h) * job->acc_len + job->row0 + s];
  float l2 = job->part_lse[(b * job->shape.h + h) * job->part_len + s];
  if (l2 == -INFINITY) return;
  const char *o2 = row_ptr(&job->src, b, s, h);
  float *o1 = (float *)row_ptr(&job->dst, b, job->row0 + s, h);
  size_t ss = flashc_dtype_size(job->src.dtype);
  float buf[MAX_ROW];
  if (*l1 == -INFINITY) {
    for (int64_t i0 = 0; i0 < job->shape.d; i0 += MAX_ROW) {
      int64_t n = job->shape.d - i0 < MAX_ROW ? job->shape.d - i0 : MAX_ROW;
      load_row(o2 + i0 * (int64_t)ss, job->src.dtype, n, o1 + i0);
    }
    *l1 = l2;
    return;
  }
  float delta = l2 - *l1;
  float e = expf(-fabsf(delta));
  float w = delta >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  for (int64_t i0 = 0; i0 < job->shape.d; i0 += MAX_ROW) {
    int64_t n = job->shape.d - i0 < MAX_ROW ? job->shape.d - i0 : MAX_ROW;
    load_row(o2 + i0 * (int64_t)ss, job->src.dtype, n, buf);
    for (int64_t i = 0; i < n; i++) o1[i0 + i] -= w * (o1[i0 + i] - buf[i]);
  }
  *l1 = fmaxf(*l1, l2) + log1pf(e);
}

static flashc_status host_merge(const fc_problem *ctx, fc_shape shape, fc_tile part_o, const float *part_lse,
                                int64_t part_len, fc_tile acc_o, float *acc_lse, int64_t acc_len, int64_t row0) {
  row_job job = {.shape = shape,
                 .fn = merge_row,
                 .src = part_o,
                 .dst = acc_o,
                 .part_lse = part_lse,
                 .acc_lse = acc_lse,
                 .part_len = part_len,
                 .acc_len = acc_len,
                 .row0 = row0};
  run_rows(ctx, &job);
  return FLASHC_OK;
}

const fc_ring_mem fc_ring_mem_host = {
    .alloc = host_alloc,
    .release = host_release,
    .fill = host_fill,
    .copy = host_copy,
    .add = host_add,
    .merge = host_merge,
};
