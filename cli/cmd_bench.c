/*
 * cmd_bench.c — `flashc bench`: validate, then time, each backend over a sweep of sequence lengths.
 *
 * Per sequence length the inputs are generated once; per backend and pass a runner holds every buffer
 * before the timed loop starts, so nothing is allocated while timing. Results go to a table on stdout and,
 * with --csv, to rows in the schema of bench/results (docs/targets.md).
 */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_BACKENDS = 16 };
#define AUTO_CHECK_MAX_FLOP 1e10 /* cpu-ref in f64 does about this many in seconds to a minute */

static const char *const csv_header = "date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,"
                                      "causal,pass,world,threads,ms,tflops,gbps,max_abs_err,rel_l2_err";

static double forward_flops(const cli_shape *s, bool causal) {
  /* Q·Kᵀ over head_dim and P·V over head_dim_v, 2 FLOP per multiply-add */
  double f = 2.0 * (double)s->batch * (double)s->heads_q * (double)s->seqlen_q * (double)s->seqlen_k *
             (double)(s->head_dim + s->head_dim_v);
  return causal && s->seqlen_q == s->seqlen_k ? f / 2 : f;
}

/* Bytes a pass must move at least once: fwd reads q, k, v and writes o, lse; bwd reads q, k, v, o, do,
 * lse and writes dq, dk, dv. */
static double pass_bytes(const cli_shape *s, flashc_dtype dtype, bool backward) {
  double e = (double)flashc_dtype_size(dtype), nq = (double)cli_q_elems(s), nk = (double)cli_k_elems(s),
         nv = (double)cli_v_elems(s), no = (double)cli_o_elems(s);
  double lse = 4.0 * (double)cli_lse_elems(s);
  return backward ? e * (2 * nq + 2 * nk + 2 * nv + 2 * no) + lse : e * (nq + nk + nv + no) + lse;
}

/* A CSV field: quoted when it holds a comma, a quote or a newline. */
static void csv_field(FILE *f, const char *s) {
  if (!strpbrk(s, ",\"\n")) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* The backends to time: "all" (every runnable one that takes dtype and head_dim) or a comma list, each
 * of which must be able to run. */
static int select_backends(const cli_options *o, flashc_dtype dtype, flashc_backend_info *list, int *n) {
  *n = 0;
  char why[256];
  if (strcmp(o->backend, "all") == 0) {
    for (int i = 0; i < flashc_backend_count() && *n < MAX_BACKENDS; i++) {
      flashc_backend_info info;
      if (flashc_backend_get(i, &info) != FLASHC_OK) continue;
      if (!cli_backend_runnable(&info, why, sizeof why))
        fprintf(stderr, "flashc bench: skipping %s: %s\n", info.name, why);
      else if (!(info.dtypes & (1u << dtype)))
        fprintf(stderr, "flashc bench: skipping %s: no %s\n", info.name, flashc_dtype_name(dtype));
      else if (o->head_dim < info.min_head_dim || o->head_dim > info.max_head_dim)
        fprintf(stderr, "flashc bench: skipping %s: head_dim %lld outside %d..%d\n", info.name, (long long)o->head_dim,
                info.min_head_dim, info.max_head_dim);
      else
        list[(*n)++] = info;
    }
    return *n ? CLI_OK
              : cli_error("no usable backend takes dtype %s and head_dim %lld", flashc_dtype_name(dtype),
                          (long long)o->head_dim);
  }
  const char *p = o->backend;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char name[64];
    if (len == 0 || len >= sizeof name) return cli_error("--backend: '%s' is not a list NAME,NAME,...", o->backend);
    if (*n == MAX_BACKENDS) return cli_error("--backend: more than %d backends", MAX_BACKENDS);
    memcpy(name, p, len);
    name[len] = '\0';
    flashc_backend_info *info = &list[*n];
    if (cli_backend_info(name, info)) return CLI_ERROR;
    if (!cli_backend_runnable(info, why, sizeof why))
      return cli_error("--backend: %s is not usable here: %s", name, why);
    if (!(info->dtypes & (1u << dtype)))
      return cli_error("--backend: %s does not support --dtype %s", name, flashc_dtype_name(dtype));
    if (o->head_dim < info->min_head_dim || o->head_dim > info->max_head_dim)
      return cli_error("--backend: %s supports head_dim %d..%d, not --head-dim %lld", name, info->min_head_dim,
                       info->max_head_dim, (long long)o->head_dim);
    (*n)++;
    if (!comma) break;
    p = comma + 1;
  }
  return CLI_OK;
}

/* A progress bar on stderr, only when stderr is a terminal: the table (stdout) and redirected logs stay
 * clean. progress_clear() wipes it before a table row is printed. */
enum { BAR_WIDTH = 30, BAR_LINE = BAR_WIDTH + 60 };

static void progress(int done, int total, const char *what) {
  if (!isatty(STDERR_FILENO)) return;
  int filled = total ? done * BAR_WIDTH / total : BAR_WIDTH;
  fprintf(stderr, "\r[");
  for (int i = 0; i < BAR_WIDTH; i++) fputc(i < filled ? '#' : '.', stderr);
  fprintf(stderr, "] %d/%d %-40.40s", done, total, what);
  fflush(stderr);
}

static void progress_clear(void) {
  if (!isatty(STDERR_FILENO)) return;
  fprintf(stderr, "\r%*s\r", BAR_LINE, "");
  fflush(stderr);
}

/* Sets of inputs a CUDA backend rotates over: enough that one call does not find the last one's data
 * in L2 (50 MB on an H100), bounded by CLI_MAX_SETS. */
static int sets_for(const cli_shape *s, flashc_dtype dtype) {
  double bytes = pass_bytes(s, dtype, true);
  int n = (int)ceil(256e6 / (bytes > 1 ? bytes : 1));
  return n < 1 ? 1 : n > CLI_MAX_SETS ? CLI_MAX_SETS : n;
}

typedef struct bench_row {
  const flashc_backend_info *info;
  const cli_shape *shape;
  bool backward, checked;
  double ms, tflops, gbps, max_abs, rel_l2;
  int check_rc;
} bench_row;

/* mask: "full", "causal", and "+mask" after either with --attn-mask. */
static void print_row(const bench_row *r, flashc_dtype dtype, const char *mask) {
  char shape[64], abs_s[16] = "-", l2_s[16] = "-";
  snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld", (long long)r->shape->batch, (long long)r->shape->heads_q,
           (long long)r->shape->seqlen_q, (long long)r->shape->head_dim);
  if (r->checked) {
    snprintf(abs_s, sizeof abs_s, "%.2e", r->max_abs);
    snprintf(l2_s, sizeof l2_s, "%.2e", r->rel_l2);
  }
  printf("%-12s %-5s %-20s %-11s %-4s %10.3f %9.4g %9.4g %10s %10s  %s\n", r->info->name, flashc_dtype_name(dtype),
         shape, mask, r->backward ? "bwd" : "fwd", r->ms, r->tflops, r->gbps, abs_s, l2_s,
         !r->checked             ? "-"
         : r->check_rc == CLI_OK ? "PASS"
                                 : "FAIL");
  fflush(stdout);
}

static void csv_row(FILE *f, const bench_row *r, const cli_options *o, flashc_dtype dtype, const char *date) {
  char device[256], impl[80], num[64];
  if (r->info->device == FLASHC_DEVICE_CUDA)
    cli_device_name(device, sizeof device);
  else
    cli_cpu_name(device, sizeof device);
  const char *commit = getenv("FLASHC_COMMIT");
  int threads = r->info->device == FLASHC_DEVICE_CUDA ? 0
                : o->threads > 0                      ? o->threads
                                                      : (int)sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(impl, sizeof impl, "flashc:%s", r->info->name);
  csv_field(f, date);
  fputc(',', f);
  csv_field(f, device);
  fputc(',', f);
  csv_field(f, commit && *commit ? commit : "unknown");
  fputc(',', f);
  csv_field(f, impl);
  const cli_shape *s = r->shape;
  fprintf(f, ",%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,%s,1,%d,%.6g,%.6g,%.6g,", flashc_dtype_name(dtype),
          (long long)s->batch, (long long)s->heads_q, (long long)s->heads_kv, (long long)s->seqlen_q,
          (long long)s->seqlen_k, (long long)s->head_dim, o->causal, r->backward ? "bwd" : "fwd", threads, r->ms,
          r->tflops, r->gbps);
  if (r->checked) {
    snprintf(num, sizeof num, "%.3e,%.3e", r->max_abs, r->rel_l2);
    fputs(num, f);
  } else {
    fputc(',', f);
  }
  fputc('\n', f);
  fflush(f);
}

/* One backend, one shape, one pass: check (when asked), then time. *status: the library's answer to the last call
 * (FLASHC_ERR_UNSUPPORTED: the backend refuses the call's features). */
static int measure(const cli_options *o, flashc_dtype dtype, const cli_inputs *in, const flashc_params *params,
                   const cli_outputs *ref, bench_row *row, double *ms_buf, flashc_status *status) {
  cli_runner r;
  int sets = row->info->device == FLASHC_DEVICE_CUDA ? sets_for(&in->shape, dtype) : 1;
  *status = FLASHC_OK;
  if (cli_runner_open(&r, row->info->name, dtype, o->threads, in, params, sets, row->backward)) return CLI_ERROR;
  int rc = CLI_OK;
  if (ref) {
    cli_outputs out;
    rc = cli_runner_poison(&r, 0, false) || cli_runner_forward(&r, 0) ||
         (row->backward && (cli_runner_poison(&r, 0, true) || cli_runner_backward(&r, 0))) ||
         cli_runner_fetch(&r, 0, row->backward, &out);
    if (!rc) {
      cli_outputs part = row->backward ? (cli_outputs){NULL, NULL, out.dq, out.dk, out.dv}
                                       : (cli_outputs){out.o, out.lse, NULL, NULL, NULL};
      row->check_rc = cli_report(&part, ref, &in->shape, dtype, true, &row->max_abs, &row->rel_l2);
      row->checked = true;
      cli_outputs_free(&out);
    }
  }
  if (!rc) rc = cli_runner_time(&r, row->backward, o->warmup, o->repeats, ms_buf);
  *status = r.status;
  cli_runner_close(&r);
  if (rc) return CLI_ERROR;
  row->ms = cli_median(ms_buf, o->repeats);
  double seconds = row->ms * 1e-3;
  double flops = forward_flops(&in->shape, o->causal) * (row->backward ? 2.5 : 1.0);
  row->tflops = seconds > 0 ? flops / seconds / 1e12 : 0;
  row->gbps = seconds > 0 ? pass_bytes(&in->shape, dtype, row->backward) / seconds / 1e9 : 0;
  return CLI_OK;
}

int cmd_bench(int argc, char **argv) {
  for (int i = 0; i < argc; i++) /* attention over a KV cache has options of its own (cmd_decode.c) */
    if (strcmp(argv[i], "--decode") == 0) return cmd_bench_decode(argc, argv);
  for (int i = 0; i < argc; i++) /* a packed batch is checked, not timed, here */
    if (strncmp(argv[i], "--varlen-", 9) == 0 || strncmp(argv[i], "--seqused-", 10) == 0)
      return cli_error("%.*s: bench times dense batches only; check a packed batch with flashc check --varlen-q ...",
                       (int)strcspn(argv[i], "="), argv[i]);
  cli_options o;
  int rc = cli_parse_options(CLI_BENCH, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  flashc_dtype dtype = (flashc_dtype)o.dtype;
  flashc_backend_info backends[MAX_BACKENDS];
  int n_backends;
  if (select_backends(&o, dtype, backends, &n_backends)) return CLI_ERROR;
  if (o.heads % o.heads_kv != 0)
    return cli_error("--heads %lld is not a multiple of --heads-kv %lld", (long long)o.heads, (long long)o.heads_kv);

  FILE *csv = NULL;
  if (o.csv) {
    struct stat st;
    bool fresh = stat(o.csv, &st) != 0 || st.st_size == 0;
    if (!(csv = fopen(o.csv, "a"))) return cli_error("--csv: cannot open '%s' for appending", o.csv);
    if (fresh) fprintf(csv, "%s\n", csv_header);
  }
  char date[32];
  time_t now = time(NULL);
  struct tm utc;
  gmtime_r(&now, &utc);
  strftime(date, sizeof date, "%Y-%m-%d", &utc);

  double *ms_buf = malloc((size_t)o.repeats * sizeof(double));
  if (!ms_buf) {
    if (csv) fclose(csv);
    return cli_error("out of memory");
  }
  flashc_params params = cli_params(&o);
  bool passes[2] = {o.mode != CLI_MODE_BWD, o.mode != CLI_MODE_FWD};
  int total = 0, done = 0;
  for (int b = 0; b < n_backends; b++) total += o.seqlens.n * (passes[0] + (passes[1] && backends[b].has_backward));

  char mask[16];
  snprintf(mask, sizeof mask, "%s%s", o.causal ? "causal" : "full", o.attn_mask ? "+mask" : "");
  printf("%-12s %-5s %-20s %-11s %-4s %10s %9s %9s %10s %10s  %s\n", "backend", "dtype", "shape (b h s d)", "mask",
         "pass", "ms", "TFLOP/s", "GB/s", "max_abs", "rel_l2", "check");
  int check_failed = 0;
  bool refused[MAX_BACKENDS] = {false}; /* under --backend all: refuses the call's features, skipped from then on */
  const bool all = strcmp(o.backend, "all") == 0;
  rc = CLI_OK;
  for (int si = 0; si < o.seqlens.n && !rc; si++) {
    cli_shape s = {o.batch, o.seqlens.v[si], o.seqlens.v[si], o.heads, o.heads_kv, o.head_dim, o.head_dim_v};
    cli_inputs in;
    if (cli_generate(&s, dtype, o.seed, &in) || cli_attach_mask(o.attn_mask, o.seed, &in)) {
      cli_inputs_free(&in);
      rc = CLI_ERROR;
      break;
    }
    bool check = o.check == 1 || (o.check < 0 && forward_flops(&s, o.causal) <= AUTO_CHECK_MAX_FLOP);
    cli_outputs ref;
    memset(&ref, 0, sizeof ref);
    if (check) {
      progress(done, total, "validating against cpu-ref (f64)");
      if (cli_reference(&in, &params, passes[1], o.threads, &ref)) {
        cli_inputs_free(&in);
        rc = CLI_ERROR;
        break;
      }
    }
    for (int b = 0; b < n_backends && !rc; b++)
      for (int p = 0; p < 2 && !rc; p++) {
        if (!passes[p] || refused[b]) continue;
        if (p == 1 && !backends[b].has_backward) {
          fprintf(stderr, "flashc bench: %s has no backward pass; timing forward only\n", backends[b].name);
          continue;
        }
        char what[96];
        snprintf(what, sizeof what, "%s seqlen %lld %s", backends[b].name, (long long)s.seqlen_q, p ? "bwd" : "fwd");
        progress(done, total, what);
        bench_row row = {.info = &backends[b], .shape = &s, .backward = p == 1};
        flashc_status status;
        rc = measure(&o, dtype, &in, &params, check ? &ref : NULL, &row, ms_buf, &status);
        if (rc && all && status == FLASHC_ERR_UNSUPPORTED) { /* its message is printed above */
          progress_clear();
          fprintf(stderr, "flashc bench: skipping %s: it refuses this call\n", backends[b].name);
          refused[b] = true;
          rc = CLI_OK;
          continue;
        }
        if (rc) break;
        done++;
        progress_clear();
        print_row(&row, dtype, mask);
        if (csv) csv_row(csv, &row, &o, dtype, date);
        if (row.checked && row.check_rc != CLI_OK) check_failed = 1;
      }
    cli_outputs_free(&ref);
    cli_inputs_free(&in);
  }
  progress_clear();
  free(ms_buf);
  if (csv && fclose(csv) != 0 && !rc) rc = cli_error("--csv: write error on '%s'", o.csv);
  if (rc) return CLI_ERROR;
  if (check_failed) fprintf(stderr, "flashc bench: a check FAILED (see the check column)\n");
  return check_failed ? CLI_CHECK_FAILED : CLI_OK;
}
