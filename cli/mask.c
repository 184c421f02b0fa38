/*
 * mask.c — `--attn-mask`: an attention mask as PyTorch's scaled_dot_product_attention takes it (attn_mask), for the
 * inputs of run, check and bench.
 *
 *   PATH.npy     a boolean mask ('|b1': True = attend) or an additive float bias ('<f2', '<f4', '<f8'), rounded to
 *                the call's dtype as SDPA takes a bias of the query's dtype (numpy has no bf16: a bf16 bias is an
 *                '<f4' file, as bf16 data is); its shape broadcasts to [batch, heads_q, seqlen_q, seqlen_k] by
 *                numpy's rule: aligned on the right, each dimension 1 or the full size, missing leading ones taken
 *                as 1 ([seqlen_q, seqlen_k] serves every batch and head)
 *   random-bool  [batch, 1, seqlen_q, seqlen_k] bool, each element True with probability 1/2, from --seed
 *   padding      [batch, 1, 1, seqlen_k] bool: sequence b of B hides its last ⌊(b + 1)·seqlen_k / (2B)⌋ keys (the
 *                padding of a batch of unequal lengths; the last sequence loses half its keys, none loses more)
 *
 * The mask stays in its broadcast shape: the library reads it through strides that are 0 on the broadcast
 * dimensions, so a [batch, 1, 1, seqlen_k] padding mask costs batch·seqlen_k bytes, not the whole score matrix.
 * The file goes through the same .npy reader as the inputs (src/io/npy.c, fuzzed).
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The mask's random stream: q, k, v, do use 0..3 (data.c). */
enum { MASK_STREAM = 4 };

static const char *const dim_names[4] = {"batch", "heads", "seqlen_q", "seqlen_k"};

void cli_mask_free(cli_mask *m) {
  free(m->keep);
  free(m->bias);
  memset(m, 0, sizeof *m);
}

/* C-order strides of `shape`, 0 on every dimension of size 1 (which the library then broadcasts). */
static void set_strides(cli_mask *m) {
  int64_t step = 1;
  for (int d = 3; d >= 0; d--) {
    m->stride[d] = m->shape[d] == 1 ? 0 : step;
    step *= m->shape[d];
  }
  m->count = step;
}

/* [batch, heads, seqlen_q, seqlen_k] of the inputs. */
static void full_shape(const cli_shape *s, int64_t full[4]) {
  full[0] = s->batch, full[1] = s->heads_q, full[2] = s->seqlen_q, full[3] = s->seqlen_k;
}

static int alloc_keep(cli_mask *m) {
  int64_t bytes;
  if (__builtin_mul_overflow(m->shape[0], m->shape[1], &bytes) || __builtin_mul_overflow(bytes, m->shape[2], &bytes) ||
      __builtin_mul_overflow(bytes, m->shape[3], &bytes) || (uint64_t)bytes >= SIZE_MAX ||
      !(m->keep = malloc((size_t)bytes + 1)))
    return cli_error("--attn-mask: %s: out of memory for a [%lld, %lld, %lld, %lld] mask", m->source,
                     (long long)m->shape[0], (long long)m->shape[1], (long long)m->shape[2], (long long)m->shape[3]);
  return CLI_OK;
}

/* ---- generated masks -------------------------------------------------------------------------------------- */
static int generate_random_bool(const cli_shape *s, uint64_t seed, cli_mask *m) {
  m->is_bool = 1;
  m->shape[0] = s->batch, m->shape[1] = 1, m->shape[2] = s->seqlen_q, m->shape[3] = s->seqlen_k;
  if (alloc_keep(m)) return CLI_ERROR;
  set_strides(m);
  uint64_t state = cli_random_state(seed, MASK_STREAM);
  for (int64_t i = 0; i < m->count; i++) m->keep[i] = (uint8_t)(cli_splitmix64(&state) >> 63);
  return CLI_OK;
}

static int generate_padding(const cli_shape *s, cli_mask *m) {
  m->is_bool = 1;
  m->shape[0] = s->batch, m->shape[1] = 1, m->shape[2] = 1, m->shape[3] = s->seqlen_k;
  if (alloc_keep(m)) return CLI_ERROR;
  set_strides(m);
  for (int64_t b = 0; b < s->batch; b++) {
    /* (b + 1)·seqlen_k < 2^24·2^20·2 by the options' bounds: no overflow */
    const int64_t hidden = (b + 1) * s->seqlen_k / (2 * s->batch);
    for (int64_t j = 0; j < s->seqlen_k; j++) m->keep[b * s->seqlen_k + j] = j < s->seqlen_k - hidden;
  }
  return CLI_OK;
}

/* ---- a .npy file -------------------------------------------------------------------------------------------- */
/* The file's shape, aligned on the right, into m->shape; an error names the file, its shape and the first dimension
 * that does not broadcast. */
static int broadcast_shape(const char *path, const npy_array *a, const cli_shape *s, cli_mask *m) {
  int64_t full[4];
  full_shape(s, full);
  char shape[200];
  npy_shape_string(a->ndim, a->shape, shape, sizeof shape);
  if (a->ndim > 4)
    return cli_error("--attn-mask: %s: shape %s has %d dimensions; a mask has at most 4 and broadcasts to [batch, "
                     "heads, seqlen_q, seqlen_k] = [%lld, %lld, %lld, %lld]",
                     path, shape, a->ndim, (long long)full[0], (long long)full[1], (long long)full[2],
                     (long long)full[3]);
  for (int d = 0; d < 4; d++) {
    const int i = d - (4 - a->ndim); /* the file's dimension aligned with d, or < 0: missing (1) */
    m->shape[d] = i >= 0 ? a->shape[i] : 1;
    if (m->shape[d] != 1 && m->shape[d] != full[d])
      return cli_error("--attn-mask: %s: shape %s does not broadcast to [batch, heads, seqlen_q, seqlen_k] = [%lld, "
                       "%lld, %lld, %lld]: its %s dimension is %lld, not 1 or %lld",
                       path, shape, (long long)full[0], (long long)full[1], (long long)full[2], (long long)full[3],
                       dim_names[d], (long long)m->shape[d], (long long)full[d]);
  }
  set_strides(m);
  return CLI_OK;
}

static int load_file(const char *path, const cli_inputs *in, cli_mask *m) {
  npy_array a;
  char err[600];
  if (npy_read(path, &a, err, sizeof err)) return cli_error("--attn-mask: %s", err);
  int rc = broadcast_shape(path, &a, &in->shape, m);
  if (!rc && a.dtype == NPY_B1) {
    m->is_bool = 1;
    if (!(m->keep = malloc((size_t)m->count + 1))) rc = cli_error("--attn-mask: %s: out of memory", path);
    for (int64_t i = 0; !rc && i < m->count; i++) m->keep[i] = ((const uint8_t *)a.data)[i] != 0;
  } else if (!rc) {
    if (!(m->bias = malloc((size_t)m->count * sizeof(float) + 1)))
      rc = cli_error("--attn-mask: %s: out of memory", path);
    for (int64_t i = 0; !rc && i < m->count; i++) {
      const double x = a.dtype == NPY_F2   ? (double)cli_f16_to_f32(((const uint16_t *)a.data)[i])
                       : a.dtype == NPY_F4 ? (double)((const float *)a.data)[i]
                                           : ((const double *)a.data)[i];
      const float r = cli_round_to(in->dtype, (float)x);
      /* −inf hides a key, as a False would; NaN or +inf would make the row's softmax NaN */
      if (isnan(r) || r == INFINITY)
        rc = cli_error("--attn-mask: %s: element %lld is %g%s%s; a bias must be finite or -inf", path, (long long)i, x,
                       isnan(x) || isinf(x) ? "" : ", +inf in ",
                       isnan(x) || isinf(x) ? "" : flashc_dtype_name(in->dtype));
      m->bias[i] = r;
    }
  }
  npy_free(&a);
  return rc;
}

int cli_attach_mask(const char *spec, uint64_t seed, cli_inputs *in) {
  cli_mask *m = &in->mask;
  cli_mask_free(m);
  if (!spec) return CLI_OK;
  if (in->varlen.num_seqs) return cli_error("--attn-mask: a packed batch (--varlen-q) takes no mask");
  snprintf(m->source, sizeof m->source, "%s", spec);
  int rc = strcmp(spec, "random-bool") == 0 ? generate_random_bool(&in->shape, seed, m)
           : strcmp(spec, "padding") == 0   ? generate_padding(&in->shape, m)
                                            : load_file(spec, in, m);
  if (rc) cli_mask_free(m);
  return rc;
}

void cli_mask_describe(const cli_mask *m, char *out, size_t len) {
  snprintf(out, len, "attn_mask %s [%lld, %lld, %lld, %lld] from %s", m->is_bool ? "bool" : "bias",
           (long long)m->shape[0], (long long)m->shape[1], (long long)m->shape[2], (long long)m->shape[3], m->source);
}
