/*
 * data.c — the attention inputs: random generation, a directory of .npy files with meta.json, and the
 * conversion between the files' dtype and the compute dtype.
 *
 * A data directory holds q.npy, k.npy, v.npy ([batch, seqlen_q|seqlen_k, heads, head_dim], C order; v's
 * head_dim may differ from q's and k's) and do.npy (the output gradient, shaped like o: q's with v's head_dim), as
 * '<f4' or, for f16 data, '<f2'. numpy has no bf16, so bf16 data is stored as '<f4' files holding bf16-rounded values,
 * and meta.json records "dtype": "bf16".
 */
#include "cli.h"
#include "json.h"
#include "readfile.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const input_names[4] = {"q", "k", "v", "do"};
/* meta.json's keys of a packed batch: lengths of q and k, rows used of each (see cli_varlen_build) */
static const char *const varlen_keys[4] = {"varlen_q", "varlen_k", "seqused_q", "seqused_k"};

int cli_check_shape(const cli_shape *s) {
  if (s->heads_q % s->heads_kv != 0)
    return cli_error("--heads %lld is not a multiple of --heads-kv %lld", (long long)s->heads_q,
                     (long long)s->heads_kv);
  int64_t n;
  if (__builtin_mul_overflow(s->batch, s->seqlen_q, &n) || __builtin_mul_overflow(n, s->heads_q, &n) ||
      __builtin_mul_overflow(n, s->head_dim, &n) || __builtin_mul_overflow(n, (int64_t)sizeof(double), &n) ||
      __builtin_mul_overflow(s->batch, s->seqlen_k, &n) || __builtin_mul_overflow(n, s->heads_kv, &n) ||
      __builtin_mul_overflow(n, s->head_dim > s->head_dim_v ? s->head_dim : s->head_dim_v, &n) ||
      __builtin_mul_overflow(n, (int64_t)sizeof(double), &n) || (uint64_t)n > SIZE_MAX)
    return cli_error("the tensors of batch %lld, seqlen %lld/%lld, heads %lld, head_dim %lld exceed the address space",
                     (long long)s->batch, (long long)s->seqlen_q, (long long)s->seqlen_k, (long long)s->heads_q,
                     (long long)s->head_dim);
  return CLI_OK;
}

/* ---- packed variable-length batches ------------------------------------------------------------------- */
int cli_varlen_build(const cli_list lists[4], const char *const names[4], cli_varlen *v) {
  memset(v, 0, sizeof *v);
  const int n = lists[0].n;
  for (int l = 1; l < 4; l++) {
    if (!lists[l].n) continue;
    if (!n) return cli_error("%s needs %s (the sequences of a packed batch)", names[l], names[0]);
    if (lists[l].n != n)
      return cli_error("%s has %d values and %s %d: one per sequence", names[l], lists[l].n, names[0], n);
  }
  if (n > CLI_MAX_LIST) return cli_error("%s: more than %d sequences", names[0], CLI_MAX_LIST);
  const cli_list *len_k = lists[1].n ? &lists[1] : &lists[0];
  int64_t total_q = 0, total_k = 0;
  for (int i = 0; i < n; i++) {
    const int64_t lq = lists[0].v[i], lk = len_k->v[i];
    if (lq < 0 || lk < 0) return cli_error("%s: sequence %d has a negative length", lq < 0 ? names[0] : names[1], i);
    for (int side = 0; side < 2; side++) {
      const cli_list *used = &lists[2 + side];
      const int64_t length = side ? lk : lq;
      if (used->n && (used->v[i] < 0 || used->v[i] > length))
        return cli_error("%s: sequence %d uses %lld rows but has %lld (each must be 0 to its sequence's length)",
                         names[2 + side], i, (long long)used->v[i], (long long)length);
    }
    if ((total_q += lq) > INT32_MAX || (total_k += lk) > INT32_MAX)
      return cli_error("%s: the packed batch has more than 2^31 - 1 rows", names[total_q > INT32_MAX ? 0 : 1]);
    v->cu_q[i + 1] = (int32_t)total_q;
    v->cu_k[i + 1] = (int32_t)total_k;
    v->used_q[i] = (int32_t)(lists[2].n ? lists[2].v[i] : lq);
    v->used_k[i] = (int32_t)(lists[3].n ? lists[3].v[i] : lk);
  }
  v->num_seqs = n;
  v->has_used_q = lists[2].n > 0;
  v->has_used_k = lists[3].n > 0;
  return CLI_OK;
}

cli_shape cli_options_shape(const cli_options *o) {
  const cli_varlen *v = &o->varlen;
  const bool packed = v->num_seqs > 0;
  return (cli_shape){.batch = packed ? 1 : o->batch,
                     .seqlen_q = packed ? v->cu_q[v->num_seqs] : o->seqlen_q,
                     .seqlen_k = packed ? v->cu_k[v->num_seqs] : o->seqlen_k,
                     .heads_q = o->heads,
                     .heads_kv = o->heads_kv,
                     .head_dim = o->head_dim,
                     .head_dim_v = o->head_dim_v};
}

/* ", name a,b,c" of one list of a packed batch: its lengths (cu: offsets) or its used rows. */
static size_t describe_list(char *out, size_t len, size_t used, const char *name, const int32_t *x, bool cu,
                            int64_t n) {
  for (int64_t i = 0; i < n && used < len; i++)
    used +=
        (size_t)snprintf(out + used, len - used, "%s%lld", i ? "," : name, (long long)(cu ? x[i + 1] - x[i] : x[i]));
  return used < len ? used : len;
}

void cli_varlen_describe(const cli_varlen *v, char *out, size_t len) {
  if (!len) return;
  out[0] = '\0';
  if (!v->num_seqs) return;
  size_t used = describe_list(out, len, 0, " (varlen q ", v->cu_q, true, v->num_seqs);
  used = describe_list(out, len, used, ", k ", v->cu_k, true, v->num_seqs);
  if (v->has_used_q) used = describe_list(out, len, used, ", seqused_q ", v->used_q, false, v->num_seqs);
  if (v->has_used_k) used = describe_list(out, len, used, ", seqused_k ", v->used_k, false, v->num_seqs);
  if (used < len) snprintf(out + used, len - used, ")");
}

void cli_inputs_free(cli_inputs *in) {
  free(in->q);
  free(in->k);
  free(in->v);
  free(in->dout);
  cli_mask_free(&in->mask);
  memset(in, 0, sizeof *in);
}

static float *alloc_floats(int64_t n, const char *what) {
  float *p = malloc((size_t)n * sizeof(float) + 1);
  if (!p) cli_error("out of memory for %s (%lld floats)", what, (long long)n);
  return p;
}

/* ---- generation ------------------------------------------------------------------------------------------ */
/* splitmix64: a fast, well-mixed 64-bit stream; one per tensor so that each is independent of the others'
 * sizes. */
uint64_t cli_random_state(uint64_t seed, int stream) {
  return seed * 0x2545f4914f6cdd1dull + (uint64_t)stream * 0x9e3779b97f4a7c15ull;
}

uint64_t cli_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1]: never 0, so log() below is finite. */
static double uniform(uint64_t *state) { return ((double)(cli_splitmix64(state) >> 11) + 1.0) * 0x1.0p-53; }

/* N(0, 1) by Box–Muller, rounded to dtype. */
static void fill_normal(float *x, int64_t n, uint64_t seed, int stream, flashc_dtype dtype) {
  uint64_t state = cli_random_state(seed, stream);
  const double two_pi = 6.283185307179586;
  for (int64_t i = 0; i < n; i += 2) {
    double r = sqrt(-2.0 * log(uniform(&state))), t = two_pi * uniform(&state);
    x[i] = cli_round_to(dtype, (float)(r * cos(t)));
    if (i + 1 < n) x[i + 1] = cli_round_to(dtype, (float)(r * sin(t)));
  }
}

int cli_generate(const cli_shape *s, flashc_dtype dtype, uint64_t seed, cli_inputs *in) {
  memset(in, 0, sizeof *in);
  if (cli_check_shape(s)) return CLI_ERROR;
  in->shape = *s;
  in->dtype = dtype;
  in->file_dtype = dtype == FLASHC_F16 ? NPY_F2 : NPY_F4;
  in->seed = seed;
  float **dst[4] = {&in->q, &in->k, &in->v, &in->dout};
  int64_t n[4] = {cli_q_elems(s), cli_k_elems(s), cli_v_elems(s), cli_o_elems(s)};
  for (int t = 0; t < 4; t++) {
    *dst[t] = alloc_floats(n[t], input_names[t]);
    if (!*dst[t]) {
      cli_inputs_free(in);
      return CLI_ERROR;
    }
    fill_normal(*dst[t], n[t], seed, t, dtype);
  }
  return CLI_OK;
}

/* ---- files ----------------------------------------------------------------------------------------------- */
int cli_mkdirs(const char *dir) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return cli_error("--data: path too long");
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char saved = *p;
    *p = '\0';
    struct stat st;
    if (mkdir(path, 0777) != 0 && !(errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)))
      return cli_error("--data: cannot create directory '%s': %s", path,
                       errno == EEXIST ? "a file is in the way" : strerror(errno));
    *p = saved;
    if (!saved) break;
  }
  return CLI_OK;
}

static void join(char *out, size_t len, const char *dir, const char *name) { snprintf(out, len, "%s/%s", dir, name); }

int cli_write_tensor(const char *dir, const char *name, const double *x, npy_dtype file_dtype, int ndim,
                     const int64_t *dims) {
  npy_array a = {.dtype = file_dtype, .ndim = ndim};
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= a.shape[i] = dims[i];
  void *buf = malloc((size_t)n * npy_dtype_size(file_dtype) + 1);
  if (!buf) return cli_error("out of memory writing %s", name);
  for (int64_t i = 0; i < n; i++) {
    if (file_dtype == NPY_F2)
      ((uint16_t *)buf)[i] = cli_f32_to_f16((float)x[i]);
    else if (file_dtype == NPY_F4)
      ((float *)buf)[i] = (float)x[i];
    else
      ((double *)buf)[i] = x[i];
  }
  a.data = buf;
  char path[4200], err[600];
  join(path, sizeof path, dir, name);
  int rc = npy_write(path, &a, 0, err, sizeof err);
  free(buf);
  return rc ? cli_error("%s", err) : CLI_OK;
}

static int write_input(const char *dir, const char *name, const float *x, npy_dtype file_dtype, const int64_t *dims) {
  int64_t n = dims[0] * dims[1] * dims[2] * dims[3];
  npy_array a = {.dtype = file_dtype, .ndim = 4, .shape = {dims[0], dims[1], dims[2], dims[3]}};
  void *buf = NULL;
  if (file_dtype == NPY_F2) {
    buf = malloc((size_t)n * 2 + 1);
    if (!buf) return cli_error("out of memory writing %s", name);
    for (int64_t i = 0; i < n; i++) ((uint16_t *)buf)[i] = cli_f32_to_f16(x[i]);
    a.data = buf;
  } else {
    a.data = (void *)x;
  }
  char path[4200], file[64], err[600];
  snprintf(file, sizeof file, "%s.npy", name);
  join(path, sizeof path, dir, file);
  int rc = npy_write(path, &a, 0, err, sizeof err);
  free(buf);
  return rc ? cli_error("%s", err) : CLI_OK;
}

static int write_meta(const char *dir, const cli_inputs *in) {
  char path[4200];
  join(path, sizeof path, dir, "meta.json");
  FILE *f = fopen(path, "w");
  if (!f) return cli_error("cannot create %s: %s", path, strerror(errno));
  const cli_shape *s = &in->shape;
  const int64_t shapes[4][4] = {{s->batch, s->seqlen_q, s->heads_q, s->head_dim},
                                {s->batch, s->seqlen_k, s->heads_kv, s->head_dim},
                                {s->batch, s->seqlen_k, s->heads_kv, s->head_dim_v},
                                {s->batch, s->seqlen_q, s->heads_q, s->head_dim_v}};
  json_writer w;
  json_init(&w, f);
  json_object_begin(&w);
  json_key(&w, "format");
  json_string(&w, "flashc attention data");
  json_key(&w, "format_version");
  json_int(&w, 1);
  json_key(&w, "flashc_version");
  json_string(&w, flashc_version_string());
  json_key(&w, "layout");
  json_string(&w, "bshd");
  json_key(&w, "dtype");
  json_string(&w, flashc_dtype_name(in->dtype));
  json_key(&w, "file_dtype");
  json_string(&w, npy_dtype_descr(in->file_dtype));
  json_key(&w, "seed");
  json_uint(&w, in->seed);
  const char *keys[7] = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v"};
  int64_t vals[7] = {s->batch, s->seqlen_q, s->seqlen_k, s->heads_q, s->heads_kv, s->head_dim, s->head_dim_v};
  for (int i = 0; i < 7; i++) {
    json_key(&w, keys[i]);
    json_int(&w, vals[i]);
  }
  const cli_varlen *v = &in->varlen;
  if (v->num_seqs) { /* the packed batch's lengths (and used rows), as the flags --varlen-q ... take them */
    const int32_t *lists[4] = {v->cu_q, v->cu_k, v->has_used_q ? v->used_q : NULL, v->has_used_k ? v->used_k : NULL};
    for (int l = 0; l < 4; l++) {
      if (!lists[l]) continue;
      json_key(&w, varlen_keys[l]);
      json_array_begin(&w);
      for (int64_t i = 0; i < v->num_seqs; i++) json_int(&w, l < 2 ? lists[l][i + 1] - lists[l][i] : lists[l][i]);
      json_array_end(&w);
    }
  }
  json_key(&w, "shapes");
  json_object_begin(&w);
  for (int t = 0; t < 4; t++) {
    json_key(&w, input_names[t]);
    json_array_begin(&w);
    for (int d = 0; d < 4; d++) json_int(&w, shapes[t][d]);
    json_array_end(&w);
  }
  json_object_end(&w);
  json_object_end(&w);
  int bad = json_finish(&w);
  if (fclose(f) != 0) bad = -1;
  return bad ? cli_error("cannot write %s", path) : CLI_OK;
}

int cli_save(const char *dir, const cli_inputs *in) {
  if (cli_mkdirs(dir)) return CLI_ERROR;
  const cli_shape *s = &in->shape;
  const int64_t shapes[4][4] = {{s->batch, s->seqlen_q, s->heads_q, s->head_dim},
                                {s->batch, s->seqlen_k, s->heads_kv, s->head_dim},
                                {s->batch, s->seqlen_k, s->heads_kv, s->head_dim_v},
                                {s->batch, s->seqlen_q, s->heads_q, s->head_dim_v}};
  const float *src[4] = {in->q, in->k, in->v, in->dout};
  for (int t = 0; t < 4; t++)
    if (src[t] && write_input(dir, input_names[t], src[t], in->file_dtype, shapes[t])) return CLI_ERROR;
  return write_meta(dir, in);
}

/* meta.json's "dtype", "seed" and packed batch ("varlen_q" ...), when the file exists. */
static int read_meta(const char *dir, int *dtype, uint64_t *seed, cli_varlen *varlen) {
  char path[4200];
  join(path, sizeof path, dir, "meta.json");
  *dtype = -1;
  *seed = 0;
  memset(varlen, 0, sizeof *varlen);
  char why[300];
  FILE *f = io_open_regular(path, why, sizeof why); /* a FIFO is refused, not waited on */
  if (!f && errno == ENOENT) return CLI_OK;         /* optional */
  if (!f) return cli_error("%s: %s", path, why);
  char text[1 << 16];
  size_t n = fread(text, 1, sizeof text, f);
  int too_long = n == sizeof text;
  fclose(f);
  if (too_long) return cli_error("%s: longer than %zu bytes; not a flashc meta.json", path, sizeof text - 1);
  json_value v;
  char err[300];
  int found = json_get(text, n, "dtype", &v, err, sizeof err);
  if (found < 0) return cli_error("%s: %s", path, err);
  if (found) {
    flashc_dtype d;
    if (v.type != JSON_STRING || !cli_parse_dtype(v.string, &d))
      return cli_error("%s: \"dtype\" is not \"f32\", \"f16\" or \"bf16\"", path);
    *dtype = (int)d;
  }
  if (json_get(text, n, "seed", &v, err, sizeof err) == 1 && v.type == JSON_NUMBER && v.number >= 0 &&
      v.number < 0x1p64)
    *seed = (uint64_t)v.number;
  cli_list lists[4];
  char names[4][4300];
  const char *name_ptrs[4];
  for (int l = 0; l < 4; l++) {
    memset(&lists[l], 0, sizeof lists[l]);
    snprintf(names[l], sizeof names[l], "%s: \"%s\"", path, varlen_keys[l]);
    name_ptrs[l] = names[l];
    if (json_get(text, n, varlen_keys[l], &v, err, sizeof err) != 1) continue;
    if (v.type != JSON_ARRAY || v.count < 1 || v.count > CLI_MAX_LIST)
      return cli_error("%s is not a list of 1 to %d integers", names[l], CLI_MAX_LIST);
    for (int i = 0; i < (int)v.count; i++) {
      const double x = v.numbers[i];
      if (!(x >= 0 && x <= INT32_MAX && x == floor(x)))
        return cli_error("%s: element %d is not an integer in [0, 2^31 - 1]", names[l], i);
      lists[l].v[i] = (int64_t)x;
    }
    lists[l].n = (int)v.count;
  }
  return cli_varlen_build(lists, name_ptrs, varlen);
}

static bool shape_is(const npy_array *a, const int64_t *dims) {
  return a->ndim == 4 && a->shape[0] == dims[0] && a->shape[1] == dims[1] && a->shape[2] == dims[2] &&
         a->shape[3] == dims[3];
}

int cli_load(const char *dir, int dtype, bool need_dout, cli_inputs *in) {
  memset(in, 0, sizeof *in);
  int meta_dtype;
  uint64_t seed;
  cli_varlen varlen;
  if (read_meta(dir, &meta_dtype, &seed, &varlen)) return CLI_ERROR;
  npy_array a[4];
  memset(a, 0, sizeof a);
  int n_files = 3;
  char path[4200], err[600];
  join(path, sizeof path, dir, "do.npy");
  struct stat st;
  if (need_dout || stat(path, &st) == 0) n_files = 4;
  int rc = CLI_ERROR;
  for (int t = 0; t < n_files; t++) {
    char file[16];
    snprintf(file, sizeof file, "%s.npy", input_names[t]);
    join(path, sizeof path, dir, file);
    if (npy_read(path, &a[t], err, sizeof err)) {
      cli_error("%s%s", err, t == 3 ? " (backward needs do.npy, the output gradient)" : "");
      goto done;
    }
    char shape[200];
    if (a[t].ndim != 4) {
      cli_error("%s: shape %s is not 4-d [batch, seqlen, heads, head_dim]", path,
                npy_shape_string(a[t].ndim, a[t].shape, shape, sizeof shape));
      goto done;
    }
    for (int d = 0; d < 4; d++)
      if (a[t].shape[d] < 1) {
        cli_error("%s: shape %s has an empty dimension", path,
                  npy_shape_string(a[t].ndim, a[t].shape, shape, sizeof shape));
        goto done;
      }
    if (a[t].dtype == NPY_B1) { /* the reader takes bool for masks (--attn-mask); inputs are floats */
      cli_error("%s: dtype |b1 (bool) is not an input's: q, k, v and do are '<f2', '<f4' or '<f8'", path);
      goto done;
    }
    if (a[t].dtype != a[0].dtype) {
      cli_error("%s: dtype %s differs from q.npy's %s", path, npy_dtype_descr(a[t].dtype), npy_dtype_descr(a[0].dtype));
      goto done;
    }
  }
  const int64_t *qs = a[0].shape, *ks = a[1].shape;
  /* v (and with it o, do) may have a head dim of its own */
  cli_shape s = {qs[0], qs[1], ks[1], qs[2], ks[2], qs[3], a[2].shape[3]};
  int64_t kv[4] = {s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v},
          os[4] = {s.batch, s.seqlen_q, s.heads_q, s.head_dim_v};
  char got[200];
  if (ks[0] != qs[0] || ks[3] != qs[3]) {
    cli_error("%s/k.npy: shape %s does not fit q.npy's: batch and head_dim must match", dir,
              npy_shape_string(4, ks, got, sizeof got));
    goto done;
  }
  if (!shape_is(&a[2], kv)) {
    cli_error("%s/v.npy: shape %s differs from k.npy's but for head_dim", dir,
              npy_shape_string(4, a[2].shape, got, sizeof got));
    goto done;
  }
  if (n_files == 4 && !shape_is(&a[3], os)) {
    cli_error("%s/do.npy: shape %s differs from q.npy's with v.npy's head_dim", dir,
              npy_shape_string(4, a[3].shape, got, sizeof got));
    goto done;
  }
  if (s.heads_q % s.heads_kv != 0) {
    cli_error("%s: q.npy has %lld heads, not a multiple of k.npy's %lld", dir, (long long)s.heads_q,
              (long long)s.heads_kv);
    goto done;
  }
  if (varlen.num_seqs &&
      (s.batch != 1 || s.seqlen_q != varlen.cu_q[varlen.num_seqs] || s.seqlen_k != varlen.cu_k[varlen.num_seqs])) {
    cli_error("%s: q.npy and k.npy of batch %lld, seqlen %lld and %lld do not hold meta.json's packed batch (batch 1, "
              "%lld and %lld rows)",
              dir, (long long)s.batch, (long long)s.seqlen_q, (long long)s.seqlen_k,
              (long long)varlen.cu_q[varlen.num_seqs], (long long)varlen.cu_k[varlen.num_seqs]);
    goto done;
  }
  in->shape = s;
  in->varlen = varlen;
  in->file_dtype = a[0].dtype;
  in->seed = seed;
  in->dtype = dtype >= 0             ? (flashc_dtype)dtype
              : meta_dtype >= 0      ? (flashc_dtype)meta_dtype
              : a[0].dtype == NPY_F2 ? FLASHC_F16
                                     : FLASHC_F32;
  float **dst[4] = {&in->q, &in->k, &in->v, &in->dout};
  for (int t = 0; t < n_files; t++) {
    int64_t n = a[t].count;
    if (!(*dst[t] = alloc_floats(n, input_names[t]))) goto done;
    for (int64_t i = 0; i < n; i++) {
      float x = a[t].dtype == NPY_F2   ? cli_f16_to_f32(((const uint16_t *)a[t].data)[i])
                : a[t].dtype == NPY_F4 ? ((const float *)a[t].data)[i]
                                       : (float)((const double *)a[t].data)[i];
      if (!isfinite(x)) {
        cli_error("%s/%s.npy: element %lld is %g; inputs must be finite", dir, input_names[t], (long long)i, (double)x);
        goto done;
      }
      (*dst[t])[i] = cli_round_to(in->dtype, x); /* a no-op for data generated in this dtype */
    }
  }
  rc = CLI_OK;
done:
  for (int t = 0; t < 4; t++) npy_free(&a[t]);
  if (rc) cli_inputs_free(in);
  return rc;
}
