/*
 * runner.c — one backend on one problem: the handle, the buffers in the compute dtype (in CUDA device
 * memory for CUDA backends), forward, backward, fetching results and timing.
 *
 * Everything is allocated when the runner opens; the forward/backward calls and the timing loop allocate
 * nothing (the library's handle keeps its workspace between calls of one shape).
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_backend_info(const char *name, flashc_backend_info *info) {
  int n = flashc_backend_count();
  char known[512] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    if (flashc_backend_get(i, info) != FLASHC_OK) continue;
    if (strcmp(info->name, name) == 0) return CLI_OK;
    if (used < sizeof known)
      used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", info->name);
  }
  return cli_error("--backend: unknown backend '%s' (known: %s; see flashc list)", name, known);
}

bool cli_backend_runnable(const flashc_backend_info *info, char *why, size_t len) {
  if (!info->usable) {
    snprintf(why, len, "%s", info->why_unusable);
    return false;
  }
#ifndef FLASHC_CLI_CUDA
  if (info->device == FLASHC_DEVICE_CUDA) {
    snprintf(why, len, "this flashc CLI was built without the CUDA runtime");
    return false;
  }
#endif
  if (len) why[0] = '\0';
  return true;
}

static size_t q_bytes(const cli_runner *r) { return (size_t)cli_q_elems(&r->shape) * flashc_dtype_size(r->dtype); }
static size_t k_bytes(const cli_runner *r) { return (size_t)cli_k_elems(&r->shape) * flashc_dtype_size(r->dtype); }
static size_t v_bytes(const cli_runner *r) { return (size_t)cli_v_elems(&r->shape) * flashc_dtype_size(r->dtype); }
static size_t o_bytes(const cli_runner *r) { return (size_t)cli_o_elems(&r->shape) * flashc_dtype_size(r->dtype); }
static size_t lse_bytes(const cli_runner *r) { return (size_t)cli_lse_elems(&r->shape) * sizeof(float); }

static int alloc_buffer(cli_runner *r, void **p, size_t bytes) {
  if (r->on_device) return cli_device_alloc(p, bytes);
  *p = malloc(bytes ? bytes : 1);
  return *p ? CLI_OK : cli_error("out of memory (%zu bytes)", bytes);
}

static void free_buffer(cli_runner *r, void *p) {
  if (r->on_device)
    cli_device_free(p);
  else
    free(p);
}

/* f32 host values → a buffer of the compute dtype (host or device); `staging` holds q_bytes at least. */
static int upload(cli_runner *r, void *dst, const float *src, int64_t n, void *staging) {
  if (!r->on_device) {
    cli_pack(src, dst, r->dtype, n);
    return CLI_OK;
  }
  cli_pack(src, staging, r->dtype, n);
  return cli_device_upload(dst, staging, (size_t)n * flashc_dtype_size(r->dtype));
}

static const char *dtype_list(unsigned dtypes, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  for (int d = FLASHC_F32; d <= FLASHC_F64; d++)
    if ((dtypes & (1u << d)) && used < len)
      used += (size_t)snprintf(out + used, len - used, "%s%s", used ? ", " : "", flashc_dtype_name((flashc_dtype)d));
  return out;
}

/* The mask in the compute dtype (bool: uint8) where the backend reads it, and the params that point to it. */
static int open_mask(cli_runner *r, const cli_mask *m) {
  const size_t bytes = (size_t)m->count * (m->is_bool ? 1 : flashc_dtype_size(r->dtype));
  void *host = m->is_bool ? (void *)m->keep : malloc(bytes + 1);
  if (!host) return cli_error("out of memory for the attention mask");
  if (!m->is_bool) cli_pack(m->bias, host, r->dtype, m->count);
  int rc = alloc_buffer(r, &r->mask, bytes);
  if (!rc) rc = r->on_device ? cli_device_upload(r->mask, host, bytes) : (memcpy(r->mask, host, bytes), CLI_OK);
  if (!m->is_bool) free(host);
  if (rc) return CLI_ERROR;
  r->params.attn_mask = r->mask;
  r->params.attn_mask_is_bool = m->is_bool;
  for (int d = 0; d < 4; d++) r->params.attn_mask_stride[d] = m->stride[d];
  return CLI_OK;
}

int cli_runner_open(cli_runner *r, const char *backend, flashc_dtype dtype, int threads, const cli_inputs *in,
                    const flashc_params *params, int n_sets, bool backward) {
  memset(r, 0, sizeof *r);
  if (cli_backend_info(backend, &r->info)) return CLI_ERROR;
  char why[256], list[64];
  if (!cli_backend_runnable(&r->info, why, sizeof why))
    return cli_error("backend %s is not usable here: %s", backend, why);
  if (!(r->info.dtypes & (1u << dtype)))
    return cli_error("backend %s does not support dtype %s (it has: %s)", backend, flashc_dtype_name(dtype),
                     dtype_list(r->info.dtypes, list, sizeof list));
  if (in->shape.head_dim < r->info.min_head_dim || in->shape.head_dim > r->info.max_head_dim)
    return cli_error("backend %s supports head_dim %d..%d, not %lld", backend, r->info.min_head_dim,
                     r->info.max_head_dim, (long long)in->shape.head_dim);
  if (backward && !r->info.has_backward) return cli_error("backend %s has no backward pass (use --mode fwd)", backend);
  if (backward && !in->dout) return cli_error("backward needs do (the output gradient), and the data has none");
  if (flashc_create(&r->handle, backend) != FLASHC_OK) return cli_error("%s", flashc_last_error());
  if (flashc_set_threads(r->handle, threads) != FLASHC_OK) {
    cli_runner_close(r);
    return cli_error("%s", flashc_last_error());
  }
  r->dtype = dtype;
  r->on_device = r->info.device == FLASHC_DEVICE_CUDA;
  r->n_sets = r->on_device ? (n_sets < 1 ? 1 : n_sets > CLI_MAX_SETS ? CLI_MAX_SETS : n_sets) : 1;
  r->backward = backward;
  r->shape = in->shape;
  r->params = *params;
  r->varlen = in->varlen;
  if (r->varlen.num_seqs) { /* a packed batch: the offsets and used rows from the runner's own copy */
    r->params.cu_seqlens_q = r->varlen.cu_q;
    r->params.cu_seqlens_k = r->varlen.cu_k;
    r->params.num_seqs = r->varlen.num_seqs;
    r->params.seqused_q = r->varlen.has_used_q ? r->varlen.used_q : NULL;
    r->params.seqused_k = r->varlen.has_used_k ? r->varlen.used_k : NULL;
  }
  if (params->alibi_slopes) { /* the slopes for the data's heads, where the backend reads them */
    const float *slopes = cli_alibi_slopes(r->shape.heads_q);
    const size_t bytes = (size_t)r->shape.heads_q * sizeof(float);
    if (!slopes) {
      cli_runner_close(r);
      return cli_error("--alibi: %lld heads are more than the slopes buffer holds", (long long)r->shape.heads_q);
    }
    if (alloc_buffer(r, &r->alibi, bytes) ||
        (r->on_device ? cli_device_upload(r->alibi, slopes, bytes) : (memcpy(r->alibi, slopes, bytes), CLI_OK))) {
      cli_runner_close(r);
      return CLI_ERROR;
    }
    r->params.alibi_slopes = r->alibi;
    r->params.alibi_stride_batch = 0;
  }
  if (in->mask.count && open_mask(r, &in->mask)) {
    cli_runner_close(r);
    return CLI_ERROR;
  }

  void *staging = NULL;
  const size_t most = q_bytes(r) > k_bytes(r) ? q_bytes(r) : k_bytes(r),
               most_v = o_bytes(r) > v_bytes(r) ? o_bytes(r) : v_bytes(r);
  if (r->on_device && !(staging = malloc(most > most_v ? most : most_v))) {
    cli_runner_close(r);
    return cli_error("out of memory for the upload buffer");
  }
  int64_t nq = cli_q_elems(&r->shape), nk = cli_k_elems(&r->shape), nv = cli_v_elems(&r->shape),
          no = cli_o_elems(&r->shape);
  for (int s = 0; s < r->n_sets; s++) {
    cli_set *b = &r->set[s];
    int bad = alloc_buffer(r, &b->q, q_bytes(r)) || alloc_buffer(r, &b->k, k_bytes(r)) ||
              alloc_buffer(r, &b->v, v_bytes(r)) || alloc_buffer(r, &b->o, o_bytes(r)) ||
              alloc_buffer(r, (void **)&b->lse, lse_bytes(r));
    if (!bad && backward)
      bad = alloc_buffer(r, &b->dout, o_bytes(r)) || alloc_buffer(r, &b->dq, q_bytes(r)) ||
            alloc_buffer(r, &b->dk, k_bytes(r)) || alloc_buffer(r, &b->dv, v_bytes(r));
    if (!bad)
      bad = upload(r, b->q, in->q, nq, staging) || upload(r, b->k, in->k, nk, staging) ||
            upload(r, b->v, in->v, nv, staging) || (backward && upload(r, b->dout, in->dout, no, staging));
    if (bad) {
      free(staging);
      cli_runner_close(r);
      return CLI_ERROR;
    }
  }
  free(staging);
  return CLI_OK;
}

void cli_runner_close(cli_runner *r) {
  for (int s = 0; s < CLI_MAX_SETS; s++) {
    cli_set *b = &r->set[s];
    void *all[9] = {b->q, b->k, b->v, b->dout, b->o, b->dq, b->dk, b->dv, b->lse};
    for (int i = 0; i < 9; i++)
      if (all[i]) free_buffer(r, all[i]);
  }
  if (r->alibi) free_buffer(r, r->alibi);
  if (r->mask) free_buffer(r, r->mask);
  flashc_destroy(r->handle);
  memset(r, 0, sizeof *r);
}

static int fill_nan(cli_runner *r, void *p, size_t bytes) {
  if (r->on_device) return cli_device_fill_nan(p, bytes);
  memset(p, 0xff, bytes); /* all-ones bytes are a NaN in f16, bf16, f32 and f64 */
  return CLI_OK;
}

int cli_runner_poison(cli_runner *r, int s, bool backward) {
  cli_set *b = &r->set[s];
  if (!backward) return fill_nan(r, b->o, o_bytes(r)) || fill_nan(r, b->lse, lse_bytes(r)) ? CLI_ERROR : CLI_OK;
  return fill_nan(r, b->dq, q_bytes(r)) || fill_nan(r, b->dk, k_bytes(r)) || fill_nan(r, b->dv, v_bytes(r)) ? CLI_ERROR
                                                                                                            : CLI_OK;
}

static flashc_tensor q_like(const cli_runner *r, void *data) {
  const cli_shape *s = &r->shape;
  return flashc_tensor_bshd(data, r->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim);
}

static flashc_tensor k_like(const cli_runner *r, void *data) {
  const cli_shape *s = &r->shape;
  return flashc_tensor_bshd(data, r->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim);
}

static flashc_tensor v_like(const cli_runner *r, void *data) {
  const cli_shape *s = &r->shape;
  return flashc_tensor_bshd(data, r->dtype, s->batch, s->seqlen_k, s->heads_kv, s->head_dim_v);
}

static flashc_tensor o_like(const cli_runner *r, void *data) {
  const cli_shape *s = &r->shape;
  return flashc_tensor_bshd(data, r->dtype, s->batch, s->seqlen_q, s->heads_q, s->head_dim_v);
}

int cli_runner_forward(cli_runner *r, int s) {
  cli_set *b = &r->set[s];
  flashc_tensor q = q_like(r, b->q), k = k_like(r, b->k), v = v_like(r, b->v), o = o_like(r, b->o);
  if ((r->status = flashc_forward(r->handle, &r->params, &q, &k, &v, &o, b->lse)) != FLASHC_OK)
    return cli_error("backend %s: %s", r->info.name, flashc_last_error());
  return CLI_OK;
}

int cli_runner_backward(cli_runner *r, int s) {
  cli_set *b = &r->set[s];
  flashc_tensor q = q_like(r, b->q), k = k_like(r, b->k), v = v_like(r, b->v), o = o_like(r, b->o);
  flashc_tensor dout = o_like(r, b->dout), dq = q_like(r, b->dq), dk = k_like(r, b->dk), dv = v_like(r, b->dv);
  if ((r->status = flashc_backward(r->handle, &r->params, &q, &k, &v, &o, b->lse, &dout, &dq, &dk, &dv)) != FLASHC_OK)
    return cli_error("backend %s: %s", r->info.name, flashc_last_error());
  return CLI_OK;
}

void cli_outputs_free(cli_outputs *out) {
  free(out->o);
  free(out->lse);
  free(out->dq);
  free(out->dk);
  free(out->dv);
  memset(out, 0, sizeof *out);
}

/* One buffer of n elements of `dtype` (f32 for lse) into fresh doubles. */
static int fetch_one(cli_runner *r, const void *src, flashc_dtype dtype, int64_t n, double **out) {
  size_t bytes = (size_t)n * flashc_dtype_size(dtype);
  *out = malloc((size_t)n * sizeof(double) + 1);
  if (!*out) return cli_error("out of memory fetching results");
  if (!r->on_device) {
    cli_unpack(src, dtype, *out, n);
    return CLI_OK;
  }
  void *host = malloc(bytes + 1);
  if (!host) return cli_error("out of memory fetching results");
  int rc = cli_device_download(host, src, bytes);
  if (!rc) cli_unpack(host, dtype, *out, n);
  free(host);
  return rc;
}

int cli_runner_fetch(cli_runner *r, int s, bool backward, cli_outputs *out) {
  memset(out, 0, sizeof *out);
  cli_set *b = &r->set[s];
  int64_t nq = cli_q_elems(&r->shape), nk = cli_k_elems(&r->shape), nl = cli_lse_elems(&r->shape),
          nv = cli_v_elems(&r->shape), no = cli_o_elems(&r->shape);
  int bad = fetch_one(r, b->o, r->dtype, no, &out->o) || fetch_one(r, b->lse, FLASHC_F32, nl, &out->lse);
  if (!bad && backward)
    bad = fetch_one(r, b->dq, r->dtype, nq, &out->dq) || fetch_one(r, b->dk, r->dtype, nk, &out->dk) ||
          fetch_one(r, b->dv, r->dtype, nv, &out->dv);
  if (bad) cli_outputs_free(out);
  return bad ? CLI_ERROR : CLI_OK;
}

static int call(cli_runner *r, bool backward, int s) {
  return backward ? cli_runner_backward(r, s) : cli_runner_forward(r, s);
}

int cli_runner_time(cli_runner *r, bool backward, int warmup, int repeats, double *ms) {
  if (backward) /* the backward reads the forward's o and lse: one untimed forward per set */
    for (int s = 0; s < r->n_sets; s++)
      if (cli_runner_forward(r, s)) return CLI_ERROR;
  for (int i = 0; i < warmup; i++)
    if (call(r, backward, i % r->n_sets)) return CLI_ERROR;
  if (!r->on_device) {
    for (int i = 0; i < repeats; i++) {
      double t0 = cli_now_ms();
      if (call(r, backward, i % r->n_sets)) return CLI_ERROR;
      ms[i] = cli_now_ms() - t0;
    }
    return CLI_OK;
  }
  /* CUDA: events around each call on the default stream (the handle's stream), rotating over the input
   * sets so that a repeat does not find the previous one's data in L2. */
  cli_device_timer *t;
  if (cli_device_sync() || cli_device_timer_create(&t, repeats)) return CLI_ERROR;
  int rc = CLI_OK;
  for (int i = 0; i < repeats && !rc; i++)
    rc = cli_device_timer_start(t, i) || call(r, backward, i % r->n_sets) || cli_device_timer_stop(t, i);
  if (!rc) rc = cli_device_timer_read(t, ms);
  cli_device_timer_destroy(t);
  return rc ? CLI_ERROR : CLI_OK;
}

int cli_compute(const char *backend, flashc_dtype dtype, int threads, const cli_inputs *in, const flashc_params *params,
                bool backward, cli_outputs *out, double *ms_fwd, double *ms_bwd) {
  memset(out, 0, sizeof *out);
  cli_runner r;
  if (cli_runner_open(&r, backend, dtype, threads, in, params, 1, backward)) return CLI_ERROR;
  int rc = cli_runner_poison(&r, 0, false);
  double t0 = cli_now_ms();
  if (!rc) rc = cli_runner_forward(&r, 0) || (r.on_device && cli_device_sync());
  if (ms_fwd) *ms_fwd = cli_now_ms() - t0;
  if (!rc && backward) {
    rc = cli_runner_poison(&r, 0, true);
    t0 = cli_now_ms();
    if (!rc) rc = cli_runner_backward(&r, 0) || (r.on_device && cli_device_sync());
    if (ms_bwd) *ms_bwd = cli_now_ms() - t0;
  }
  if (!rc) rc = cli_runner_fetch(&r, 0, backward, out);
  cli_runner_close(&r);
  return rc ? CLI_ERROR : CLI_OK;
}

int cli_reference(const cli_inputs *in, const flashc_params *params, bool backward, int threads, cli_outputs *ref) {
  flashc_backend_info info;
  if (cli_backend_info("cpu-ref", &info)) return cli_error("the reference backend cpu-ref is not in this build");
  /* In f64 the reference's own rounding is far below any backend's, so its error is the backend's alone. */
  flashc_dtype d = (info.dtypes & (1u << FLASHC_F64)) ? FLASHC_F64 : FLASHC_F32;
  return cli_compute("cpu-ref", d, threads, in, params, backward, ref, NULL, NULL);
}

flashc_params cli_params(const cli_options *o) {
  flashc_params p = flashc_params_default();
  p.causal = o->causal;
  p.align = o->align;
  p.window_left = o->window_left;
  p.window_right = o->window_right;
  p.scale = o->scale;
  p.softcap = o->softcap;
  p.dropout_p = o->dropout; /* the library refuses a rate outside [0, 1), naming it */
  p.dropout_seed = o->seed;
  if (o->alibi) p.alibi_slopes = cli_alibi_slopes(o->heads);
  return p;
}

const float *cli_alibi_slopes(int64_t heads) {
  static float slopes[1 << 16];
  if (heads < 1 || heads > (int64_t)(sizeof slopes / sizeof slopes[0])) return NULL;
  for (int64_t h = 0; h < heads; h++) slopes[h] = (float)exp2(-8.0 * (double)(h + 1) / (double)heads);
  return slopes;
}
