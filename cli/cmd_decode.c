/*
 * cmd_decode.c — `flashc bench --decode`: attention over a KV cache (flashc_forward_kvcache), timed beside a plain
 * memory copy of the same machine.
 *
 * Decoding reads every cached key and value once per step, so its figure of merit is bandwidth: the bytes of K and
 * V the step must read (Σ_b len_b · heads_kv · head_dim · 2 · element size) divided by the median time. The copy
 * figure is a memcpy of a buffer at least as large as the cache, on as many threads as the attention uses, counted
 * as bytes read + written (as a device-to-device copy is). Per cache length: the caches are built once (dense, or
 * paged with a random permutation of the blocks), the call is checked once against cpu-ref when it is small enough
 * (or --check yes), then warm-up calls and timed repeats; nothing is allocated while timing.
 *
 * The options are parsed here (bench's table in options.c does not know them); `flashc bench` hands its arguments
 * over when they contain --decode.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define AUTO_CHECK_MAX_MAC 3e8 /* cpu-ref's fp64 loops: about a second */

typedef struct decode_opts {
  char backends[256];
  flashc_dtype dtype;
  int64_t batch, heads, heads_kv, head_dim, seqlen_new, page_size;
  int64_t lens[CLI_MAX_LIST];
  int n_lens;
  int append, causal, threads, repeats, warmup, check, num_splits;
  uint64_t seed;
  const char *csv;
} decode_opts;

static void decode_help(void) {
  printf(
      "usage: flashc bench --decode [--backend NAME,...] [--cache-lens N,...] [--batch B --heads H --heads-kv HKV\n"
      "                    --head-dim D --seqlen-new S --page-size P --dtype T] [--append] [--causal]\n"
      "                    [--num-splits N] [--repeats N --warmup N] [--check yes|no|auto] [--threads N] [--csv "
      "FILE]\n\n"
      "Attention over a KV cache (flashc_forward_kvcache, as flash_attn_with_kvcache): S new query rows per sequence\n"
      "against a cache of N keys per sequence, dense (--page-size 0) or paged with a permuted block table. Prints\n"
      "the median time, the bandwidth of the K and V bytes read, and a plain memcpy bandwidth measured in the same\n"
      "run on the same number of threads (bytes read + written), with their ratio.\n\n"
      "options:\n"
      "  --backend NAME,...   backends to time (default cpu)\n"
      "  --cache-lens N,...   keys in each sequence's cache (default 1024,8192); with --append, N - S are cached\n"
      "                       and S appended\n"
      "  --batch B            sequences (default 1)\n"
      "  --heads H            query heads (default 32)\n"
      "  --heads-kv HKV       key/value heads, dividing H (default 8)\n"
      "  --head-dim D         head dimension (default 128)\n"
      "  --seqlen-new S       new query rows per sequence (default 1)\n"
      "  --page-size P        rows per block of a paged cache; 0 = dense (default 0)\n"
      "  --dtype f32|f16|bf16 (default bf16)\n"
      "  --append             also append S new keys and values per call (k_new, v_new)\n"
      "  --causal             causal mask (bottom-right: the last new row sees the last key)\n"
      "  --num-splits N       key splits; 0 = the backend's plan (default 0)\n"
      "  --repeats N          timed calls (default 20)   --warmup N  untimed calls first (default 3)\n"
      "  --check yes|no|auto  compare o and lse with cpu-ref first (auto: small problems; default auto)\n"
      "  --threads N          CPU threads; 0 = all (default 0)\n"
      "  --seed N             of the random data (default 1)\n"
      "  --csv FILE           append rows (bench's columns; pass = decode, impl = flashc:NAME/dense or /pageP,\n"
      "                       and a row impl = copy with the memcpy bandwidth)\n");
}

/* ---- parsing ------------------------------------------------------------------------------------------------ */
static int parse_int(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi)
    return cli_error("%s: '%s' is not an integer in %lld..%lld", flag, s, (long long)lo, (long long)hi);
  *out = v;
  return CLI_OK;
}

static int parse(int argc, char **argv, decode_opts *o) {
  *o = (decode_opts){.dtype = FLASHC_BF16,
                     .batch = 1,
                     .heads = 32,
                     .heads_kv = 8,
                     .head_dim = 128,
                     .seqlen_new = 1,
                     .lens = {1024, 8192},
                     .n_lens = 2,
                     .repeats = 20,
                     .warmup = 3,
                     .check = -1,
                     .seed = 1};
  snprintf(o->backends, sizeof o->backends, "cpu");
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--decode") == 0) continue;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return -1;
    if (strcmp(a, "--append") == 0) {
      o->append = 1;
      continue;
    }
    if (strcmp(a, "--causal") == 0) {
      o->causal = 1;
      continue;
    }
    if (i + 1 >= argc) return cli_error("%s needs a value (see flashc bench --decode --help)", a);
    const char *v = argv[++i];
    int64_t x;
    if (strcmp(a, "--backend") == 0) {
      if (strlen(v) >= sizeof o->backends) return cli_error("--backend: too long");
      snprintf(o->backends, sizeof o->backends, "%s", v);
    } else if (strcmp(a, "--cache-lens") == 0) {
      o->n_lens = 0;
      char buf[512];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_lens == CLI_MAX_LIST) return cli_error("--cache-lens: more than %d lengths", CLI_MAX_LIST);
        if (parse_int("--cache-lens", t, 0, INT32_MAX, &o->lens[o->n_lens++])) return CLI_ERROR;
      }
      if (!o->n_lens) return cli_error("--cache-lens: '%s' is not a list N,N,...", v);
    } else if (strcmp(a, "--dtype") == 0) {
      if (!cli_parse_dtype(v, &o->dtype)) return cli_error("--dtype: '%s' is not f32, f16 or bf16", v);
    } else if (strcmp(a, "--check") == 0) {
      if (strcmp(v, "yes") && strcmp(v, "no") && strcmp(v, "auto"))
        return cli_error("--check: '%s' is not yes, no or auto", v);
      o->check = strcmp(v, "yes") == 0 ? 1 : strcmp(v, "no") == 0 ? 0 : -1;
    } else if (strcmp(a, "--csv") == 0) {
      o->csv = v;
    } else {
      static const struct {
        const char *flag;
        int64_t lo, hi;
        size_t at;
        int is_int;
      } ints[] = {
          {"--batch", 1, 1 << 20, offsetof(decode_opts, batch), 0},
          {"--heads", 1, 4096, offsetof(decode_opts, heads), 0},
          {"--heads-kv", 1, 4096, offsetof(decode_opts, heads_kv), 0},
          {"--head-dim", 1, 256, offsetof(decode_opts, head_dim), 0},
          {"--seqlen-new", 1, 4096, offsetof(decode_opts, seqlen_new), 0},
          {"--page-size", 0, 1 << 20, offsetof(decode_opts, page_size), 0},
          {"--repeats", 1, 100000, offsetof(decode_opts, repeats), 1},
          {"--warmup", 0, 100000, offsetof(decode_opts, warmup), 1},
          {"--threads", 0, 4096, offsetof(decode_opts, threads), 1},
          {"--num-splits", 0, 1 << 20, offsetof(decode_opts, num_splits), 1},
          {"--seed", 0, INT64_MAX, offsetof(decode_opts, seed), 0},
      };
      size_t k = 0;
      while (k < sizeof ints / sizeof ints[0] && strcmp(ints[k].flag, a) != 0) k++;
      if (k == sizeof ints / sizeof ints[0])
        return cli_error("unknown option '%s' for --decode (see flashc bench --decode --help)", a);
      if (parse_int(a, v, ints[k].lo, ints[k].hi, &x)) return CLI_ERROR;
      if (ints[k].is_int)
        *(int *)((char *)o + ints[k].at) = (int)x;
      else
        *(int64_t *)((char *)o + ints[k].at) = x;
    }
  }
  if (o->heads % o->heads_kv)
    return cli_error("--heads %lld is not a multiple of --heads-kv %lld", (long long)o->heads, (long long)o->heads_kv);
  for (int i = 0; i < o->n_lens; i++)
    if (o->append && o->lens[i] < o->seqlen_new)
      return cli_error("--cache-lens %lld is shorter than the %lld rows --append adds", (long long)o->lens[i],
                       (long long)o->seqlen_new);
  return CLI_OK;
}

/* ---- the problem ---------------------------------------------------------------------------------------------- */
typedef struct decode_data {
  int64_t len, capacity, num_blocks, max_blocks;
  void *q, *o, *kc, *vc, *kn, *vn;
  float *lse;
  int32_t *seqlens, *table;
  flashc_tensor tq, to, tkc, tvc, tkn, tvn;
  flashc_kvcache cache;
  flashc_params params;
} decode_data;

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* n random values (uniform in [-√3, √3): variance 1) of dtype; NULL when out of memory. */
static void *random_buffer(flashc_dtype dt, int64_t n, uint64_t *seed) {
  float *f = malloc((size_t)(n > 0 ? n : 1) * sizeof *f);
  void *out = malloc((size_t)(n > 0 ? n : 1) * flashc_dtype_size(dt));
  if (!f || !out) {
    free(f), free(out);
    return NULL;
  }
  for (int64_t i = 0; i < n; i++) f[i] = (float)((double)(next_u64(seed) >> 11) * 0x1p-53 * 3.4641016 - 1.7320508);
  cli_pack(f, out, dt, n);
  free(f);
  return out;
}

static void data_free(decode_data *d) {
  free(d->q), free(d->o), free(d->kc), free(d->vc), free(d->kn), free(d->vn), free(d->lse), free(d->seqlens),
      free(d->table);
  memset(d, 0, sizeof *d);
}

static int data_build(const decode_opts *o, int64_t len, decode_data *d) {
  memset(d, 0, sizeof *d);
  uint64_t seed = o->seed ^ (uint64_t)len * 0x100000001b3ull;
  const flashc_dtype dt = o->dtype;
  const int64_t b = o->batch, sq = o->seqlen_new, hq = o->heads, hkv = o->heads_kv, hd = o->head_dim;
  const int64_t ps = o->page_size, sn = o->append ? sq : 0;
  d->len = len;
  d->capacity = ps ? (len + ps - 1) / ps * ps : len;
  d->max_blocks = ps ? d->capacity / ps : 0;
  d->num_blocks = ps ? b * d->max_blocks : 0;
  const int64_t rows = ps ? d->num_blocks * ps : b * d->capacity;
  d->q = random_buffer(dt, b * sq * hq * hd, &seed);
  d->kc = random_buffer(dt, rows * hkv * hd, &seed);
  d->vc = random_buffer(dt, rows * hkv * hd, &seed);
  d->o = malloc((size_t)(b * sq * hq * hd) * flashc_dtype_size(dt) + 1);
  d->lse = malloc((size_t)(b * hq * sq) * sizeof(float) + 1);
  d->seqlens = malloc((size_t)b * sizeof(int32_t));
  if (sn) {
    d->kn = random_buffer(dt, b * sn * hkv * hd, &seed);
    d->vn = random_buffer(dt, b * sn * hkv * hd, &seed);
  }
  if (ps) d->table = malloc((size_t)(b * d->max_blocks + 1) * sizeof(int32_t));
  if (!d->q || !d->kc || !d->vc || !d->o || !d->lse || !d->seqlens || (sn && (!d->kn || !d->vn)) || (ps && !d->table)) {
    data_free(d);
    return cli_error("out of memory for a cache of %lld keys", (long long)len);
  }
  for (int64_t s = 0; s < b; s++) d->seqlens[s] = (int32_t)(len - sn);
  if (ps) { /* the blocks of all sequences: a random permutation of the pool, as an allocator leaves them */
    for (int64_t i = 0; i < d->num_blocks; i++) d->table[i] = (int32_t)i;
    for (int64_t i = d->num_blocks - 1; i > 0; i--) {
      const int64_t j = (int64_t)(next_u64(&seed) % (uint64_t)(i + 1));
      const int32_t t = d->table[i];
      d->table[i] = d->table[j], d->table[j] = t;
    }
  }
  d->tq = flashc_tensor_bshd(d->q, dt, b, sq, hq, hd);
  d->to = flashc_tensor_bshd(d->o, dt, b, sq, hq, hd);
  d->tkc = flashc_tensor_bshd(d->kc, dt, ps ? d->num_blocks : b, ps ? ps : d->capacity, hkv, hd);
  d->tvc = flashc_tensor_bshd(d->vc, dt, ps ? d->num_blocks : b, ps ? ps : d->capacity, hkv, hd);
  d->cache = flashc_kvcache_default();
  d->cache.k_cache = d->tkc;
  d->cache.v_cache = d->tvc;
  d->cache.cache_seqlens = d->seqlens;
  d->cache.num_splits = o->num_splits;
  if (ps) {
    d->cache.block_table = d->table;
    d->cache.max_blocks_per_seq = d->max_blocks;
  }
  if (sn) {
    d->tkn = flashc_tensor_bshd(d->kn, dt, b, sn, hkv, hd);
    d->tvn = flashc_tensor_bshd(d->vn, dt, b, sn, hkv, hd);
    d->cache.k_new = &d->tkn;
    d->cache.v_new = &d->tvn;
  }
  d->params = flashc_params_default();
  d->params.causal = o->causal;
  return CLI_OK;
}

static int run_once(flashc_handle h, decode_data *d) {
  if (flashc_forward_kvcache(h, &d->tq, &d->cache, &d->to, d->lse, &d->params) != FLASHC_OK)
    return cli_error("%s", flashc_last_error());
  return CLI_OK;
}

/* o and lse of backend `h` against cpu-ref on the same data (the append writes the same rows both times). */
static int check_against_ref(const decode_opts *o, flashc_handle h, decode_data *d, double *max_abs, double *rel_l2,
                             bool *pass) {
  const int64_t n_o = o->batch * o->seqlen_new * o->heads * o->head_dim, n_lse = o->batch * o->heads * o->seqlen_new;
  double *x = malloc((size_t)(n_o + n_lse + 1) * sizeof *x), *ref = malloc((size_t)(n_o + n_lse + 1) * sizeof *ref);
  flashc_handle r = NULL;
  int rc = CLI_ERROR;
  if (!x || !ref) {
    cli_error("out of memory for the check");
    goto done;
  }
  memset(d->o, 0xff, (size_t)n_o * flashc_dtype_size(o->dtype)); /* NaN: an output not written cannot pass */
  memset(d->lse, 0xff, (size_t)n_lse * sizeof(float));
  if (run_once(h, d)) goto done;
  cli_unpack(d->o, o->dtype, x, n_o);
  for (int64_t i = 0; i < n_lse; i++) x[n_o + i] = d->lse[i];
  if (flashc_create(&r, "cpu-ref") != FLASHC_OK) {
    cli_error("%s", flashc_last_error());
    goto done;
  }
  flashc_set_threads(r, o->threads);
  if (run_once(r, d)) goto done;
  cli_unpack(d->o, o->dtype, ref, n_o);
  for (int64_t i = 0; i < n_lse; i++) ref[n_o + i] = d->lse[i];
  cli_error_stats so, sl;
  cli_compare(x, ref, n_o, 0, &so);
  cli_compare(x + n_o, ref + n_o, n_lse, 0, &sl);
  *max_abs = so.max_abs;
  *rel_l2 = so.rel_l2;
  *pass = cli_within(&so, cli_tolerance_for(o->dtype, "o")) && cli_within(&sl, cli_tolerance_for(o->dtype, "lse"));
  rc = CLI_OK;
done:
  flashc_destroy(r);
  free(x), free(ref);
  return rc;
}

/* ---- memcpy bandwidth on T threads ------------------------------------------------------------------------------ */
typedef struct copy_part {
  char *dst;
  const char *src;
  size_t bytes;
} copy_part;

static void *copy_run(void *arg) {
  copy_part *c = arg;
  memcpy(c->dst, c->src, c->bytes);
  return NULL;
}

/* GB/s of read + written bytes: the median of `repeats` copies of `bytes` split over `threads` threads. */
static double copy_bandwidth(size_t bytes, int threads, int repeats, double *ms_out) {
  enum { MAX_T = 256 };
  if (threads > MAX_T) threads = MAX_T;
  char *src = malloc(bytes), *dst = malloc(bytes);
  double *ms = malloc((size_t)repeats * sizeof *ms);
  if (!src || !dst || !ms) {
    free(src), free(dst), free(ms);
    return 0;
  }
  memset(src, 1, bytes), memset(dst, 2, bytes); /* the pages exist before timing */
  copy_part parts[MAX_T];
  pthread_t tid[MAX_T];
  const size_t chunk = (bytes / (size_t)threads + 63) / 64 * 64;
  bool joined[MAX_T];
  for (int rep = -1; rep < repeats; rep++) { /* rep −1 warms up */
    const double t0 = cli_now_ms();
    for (int t = 0; t < threads; t++) {
      const size_t at = (size_t)t * chunk;
      parts[t] = (copy_part){dst + at, src + at, at >= bytes ? 0 : (bytes - at < chunk ? bytes - at : chunk)};
      /* a thread that cannot start copies its part on this one, after the others */
      joined[t] = t > 0 && pthread_create(&tid[t], NULL, copy_run, &parts[t]) == 0;
    }
    copy_run(&parts[0]);
    for (int t = 1; t < threads; t++) {
      if (joined[t])
        pthread_join(tid[t], NULL);
      else
        copy_run(&parts[t]);
    }
    if (rep >= 0) ms[rep] = cli_now_ms() - t0;
  }
  const double med = cli_median(ms, repeats);
  free(src), free(dst), free(ms);
  *ms_out = med;
  return med > 0 ? 2.0 * (double)bytes / (med * 1e-3) / 1e9 : 0;
}

/* ---- the command ------------------------------------------------------------------------------------------ */
static void csv_line(FILE *f, const char *date, const char *device, const char *impl, const decode_opts *o, int64_t len,
                     int threads, double ms, double gbps, bool checked, double max_abs, double rel_l2) {
  const char *commit = getenv("FLASHC_COMMIT");
  fprintf(f, "%s,\"%s\",%s,%s,%s,%lld,%lld,%lld,%lld,%lld,%lld,%d,decode,1,%d,%.6g,,%.6g,", date, device,
          commit && *commit ? commit : "unknown", impl, flashc_dtype_name(o->dtype), (long long)o->batch,
          (long long)o->heads, (long long)o->heads_kv, (long long)o->seqlen_new, (long long)len, (long long)o->head_dim,
          o->causal, threads, ms, gbps);
  if (checked)
    fprintf(f, "%.3e,%.3e\n", max_abs, rel_l2);
  else
    fprintf(f, ",\n");
}

int cmd_bench_decode(int argc, char **argv) {
  decode_opts o;
  int rc = parse(argc, argv, &o);
  if (rc < 0) {
    decode_help();
    return CLI_OK;
  }
  if (rc) return rc;
  const int threads = o.threads > 0 ? o.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  FILE *csv = NULL;
  if (o.csv) {
    struct stat st;
    const bool fresh = stat(o.csv, &st) != 0 || st.st_size == 0;
    if (!(csv = fopen(o.csv, "a"))) return cli_error("--csv: cannot open '%s' for appending", o.csv);
    if (fresh)
      fprintf(csv, "date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,world,"
                   "threads,ms,tflops,gbps,max_abs_err,rel_l2_err\n");
  }
  char date[32], cpu[256];
  const time_t now = time(NULL);
  struct tm utc;
  gmtime_r(&now, &utc);
  strftime(date, sizeof date, "%Y-%m-%d", &utc);
  cli_cpu_name(cpu, sizeof cpu);
  double *ms = malloc((size_t)o.repeats * sizeof *ms);
  if (!ms) return cli_error("out of memory");

  printf("%-10s %-5s %-5s %-7s %-4s %-4s %-6s %9s %10s %10s %6s %9s  %s\n", "backend", "dtype", "batch", "heads", "d",
         "new", "layout", "cache", "ms", "KV GB/s", "copy", "of copy", "check");
  int check_failed = 0;
  rc = CLI_OK;
  for (int li = 0; li < o.n_lens && !rc; li++) {
    decode_data d;
    if (data_build(&o, o.lens[li], &d)) {
      rc = CLI_ERROR;
      break;
    }
    const double kv_bytes = 2.0 * (double)o.batch * (double)o.lens[li] * (double)(o.heads_kv * o.head_dim) *
                            (double)flashc_dtype_size(o.dtype);
    double copy_ms = 0;
    const size_t copy_bytes = (size_t)fmax(kv_bytes, 64e6); /* past the last-level cache */
    const double copy_gbps = copy_bandwidth(copy_bytes, threads, o.repeats < 5 ? 5 : o.repeats, &copy_ms);
    char layout[16];
    snprintf(layout, sizeof layout, o.page_size ? "page%lld" : "dense", (long long)o.page_size);
    if (csv) {
      csv_line(csv, date, cpu, "copy", &o, o.lens[li], threads, copy_ms, copy_gbps, false, 0, 0);
      fflush(csv);
    }
    char list[256];
    snprintf(list, sizeof list, "%s", o.backends);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name && !rc; name = strtok_r(NULL, ",", &save)) {
      flashc_handle h;
      if (flashc_create(&h, name) != FLASHC_OK) {
        rc = cli_error("--backend %s: %s", name, flashc_last_error());
        break;
      }
      flashc_set_threads(h, o.threads);
      const double macs =
          (double)o.batch * (double)o.heads * (double)o.seqlen_new * (double)o.lens[li] * 2.0 * (double)o.head_dim;
      const bool check = o.check == 1 || (o.check < 0 && macs <= AUTO_CHECK_MAX_MAC);
      double max_abs = 0, rel_l2 = 0;
      bool pass = true;
      if (check && check_against_ref(&o, h, &d, &max_abs, &rel_l2, &pass)) rc = CLI_ERROR;
      for (int i = 0; i < o.warmup && !rc; i++) rc = run_once(h, &d);
      for (int i = 0; i < o.repeats && !rc; i++) {
        const double t0 = cli_now_ms();
        rc = run_once(h, &d);
        ms[i] = cli_now_ms() - t0;
      }
      if (!rc) {
        const double med = cli_median(ms, o.repeats), gbps = med > 0 ? kv_bytes / (med * 1e-3) / 1e9 : 0;
        char heads[24], impl[96];
        snprintf(heads, sizeof heads, "%lld/%lld", (long long)o.heads, (long long)o.heads_kv);
        printf("%-10s %-5s %-5lld %-7s %-4lld %-4lld %-6s %9lld %10.4f %10.2f %6.1f %8.0f%%  %s\n",
               flashc_handle_last_backend(h), flashc_dtype_name(o.dtype), (long long)o.batch, heads,
               (long long)o.head_dim, (long long)o.seqlen_new, layout, (long long)o.lens[li], med, gbps, copy_gbps,
               copy_gbps > 0 ? 100.0 * gbps / copy_gbps : 0.0,
               !check ? "-"
               : pass ? "PASS"
                      : "FAIL");
        fflush(stdout);
        if (csv) {
          snprintf(impl, sizeof impl, "flashc:%s/%s", name, layout);
          csv_line(csv, date, cpu, impl, &o, o.lens[li], threads, med, gbps, check, max_abs, rel_l2);
          fflush(csv);
        }
        if (!pass) check_failed = 1;
      }
      flashc_destroy(h);
    }
    data_free(&d);
  }
  free(ms);
  if (csv && fclose(csv) != 0 && !rc) rc = cli_error("--csv: write error on '%s'", o.csv);
  if (rc) return CLI_ERROR;
  if (check_failed) fprintf(stderr, "flashc bench --decode: a check FAILED (see the check column)\n");
  return check_failed ? CLI_CHECK_FAILED : CLI_OK;
}
