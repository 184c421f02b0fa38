/*
 * options.c — every flag of every subcommand in one table: its name, the subcommands that take it, how
 * its value parses, and its help line. Parsing and each subcommand's option help both come from it.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
  OPT_STRING,
  OPT_INT,
  OPT_SEED,
  OPT_FLOAT,
  OPT_SWITCH,
  OPT_DTYPE,
  OPT_MODE,
  OPT_ALIGN,
  OPT_WINDOW,
  OPT_LIST,
  OPT_CHECK,
  OPT_LAYOUT
} opt_kind;

typedef struct cli_option {
  const char *name; /* without the leading "--" */
  const char *arg;  /* the value's placeholder in help; NULL for a switch */
  opt_kind kind;
  unsigned commands; /* CLI_GEN | CLI_RUN | ... */
  size_t offset;     /* of the field in cli_options */
  int64_t min, max;  /* OPT_INT, OPT_LIST */
  int generation;    /* a flag that shapes generated data (check: excludes --data) */
  const char *help;
} cli_option;

#define OFF(field) offsetof(cli_options, field)
#define SHAPE      (CLI_GEN | CLI_CHECK)
#define ATTN       (CLI_RUN | CLI_CHECK | CLI_RING)

static const cli_option options[] = {
    {"data", "DIR", OPT_STRING, CLI_GEN | CLI_RUN | CLI_CHECK | CLI_RING, OFF(data), 0, 0, 0,
     "directory of q.npy k.npy v.npy do.npy meta.json"},
    {"out", "DIR", OPT_STRING, CLI_RING, OFF(out), 0, 0, 0, "where rank 0 writes o, lse, dq, dk, dv (default: --data)"},
    {"backend", "NAME", OPT_STRING, CLI_RUN | CLI_CHECK | CLI_DEMO | CLI_RING, OFF(backend), 0, 0, 0,
     "a backend of `flashc list`"},
    {"backend", "NAME,...|all", OPT_STRING, CLI_BENCH, OFF(backend), 0, 0, 0,
     "backends to time; all = every usable one"},
    {"layout", "contiguous|zigzag", OPT_LAYOUT, CLI_RING, OFF(layout), 0, 0, 0,
     "rank r holds rows [r·L, (r+1)·L), or chunks r and 2N-1-r of 2N (causal balance)"},
    {"mode", "fwd|bwd|both", OPT_MODE, CLI_RUN | CLI_CHECK | CLI_BENCH, OFF(mode), 0, 0, 0,
     "forward, backward (after an untimed forward) or both"},
    {"mode", "fwd|bwd|both", OPT_MODE, CLI_RING, OFF(mode), 0, 0, 0, "forward, or forward and backward (bwd = both)"},
    {"dtype", "f32|f16|bf16", OPT_DTYPE, CLI_GEN | CLI_BENCH, OFF(dtype), 0, 0, 0,
     "dtype of the data and the computation"},
    {"dtype", "f32|f16|bf16", OPT_DTYPE, CLI_RUN | CLI_CHECK | CLI_RING, OFF(dtype), 0, 0, 0,
     "compute dtype (default: meta.json's, else f16 for '<f2' files, f32 for '<f4')"},
    {"causal", NULL, OPT_SWITCH, ATTN | CLI_BENCH, OFF(causal), 0, 0, 0, "causal mask"},
    {"causal-align", "bottom-right|top-left", OPT_ALIGN, ATTN, OFF(align), 0, 0, 0,
     "where the diagonal sits when seqlen_q != seqlen_k"},
    {"window", "L,R", OPT_WINDOW, ATTN, OFF(window_left), 0, 0, 0,
     "local attention: keys i-L .. i+R of the diagonal; -1 = unbounded"},
    {"scale", "S", OPT_FLOAT, ATTN, OFF(scale), 0, 0, 0, "softmax scale; 0 = 1/sqrt(head_dim)"},
    {"softcap", "X", OPT_FLOAT, CLI_RUN | CLI_CHECK | CLI_BENCH, OFF(softcap), 0, 0, 0,
     "scores s <- X·tanh(s/X) before the mask (Gemma-2); 0 = off"},
    {"dropout", "P", OPT_FLOAT, CLI_RUN | CLI_CHECK | CLI_BENCH, OFF(dropout), 0, 0, 0,
     "attention dropout: weights dropped with probability P (0 = off; else 2^-17 <= P < 1 - 2^-17), keyed by --seed"},
    {"attn-mask", "M", OPT_STRING, CLI_RUN | CLI_CHECK | CLI_BENCH, OFF(attn_mask), 0, 0, 0,
     "attention mask as SDPA's attn_mask: PATH.npy (bool or float bias), random-bool or padding (see below)"},
    {"alibi", NULL, OPT_SWITCH, CLI_RUN | CLI_CHECK | CLI_BENCH, OFF(alibi), 0, 0, 0,
     "ALiBi: scores minus 2^(-8(h+1)/H)·|i + SK - SQ - j| for head h of H"},
    {"threads", "N", OPT_INT, ATTN | CLI_BENCH | CLI_DEMO, OFF(threads), 0, 4096, 0,
     "CPU threads (per rank); 0 = all online processors"},
    {"batch", "B", OPT_INT, SHAPE | CLI_BENCH | CLI_RING, OFF(batch), 1, 1 << 20, 1, "batch size"},
    {"seqlen-q", "SQ", OPT_INT, SHAPE, OFF(seqlen_q), 1, 1 << 24, 1, "query sequence length"},
    {"seqlen-k", "SK", OPT_INT, SHAPE, OFF(seqlen_k), 1, 1 << 24, 1, "key sequence length (default: SQ)"},
    {"seqlen", "S", OPT_INT, CLI_RING, OFF(seqlen_q), 1, 1 << 26, 1,
     "whole query sequence (a multiple of N ranks, of 2N for zigzag)"},
    {"seqlen-k", "SK", OPT_INT, CLI_RING, OFF(seqlen_k), 1, 1 << 26, 1, "whole key sequence (default: S)"},
    {"heads", "H", OPT_INT, SHAPE | CLI_BENCH | CLI_RING, OFF(heads), 1, 4096, 1, "query heads"},
    {"heads-kv", "HKV", OPT_INT, SHAPE | CLI_BENCH | CLI_RING, OFF(heads_kv), 1, 4096, 1,
     "key/value heads, dividing H (default: H)"},
    {"head-dim", "D", OPT_INT, SHAPE | CLI_BENCH | CLI_RING, OFF(head_dim), 1, 1024, 1, "head dimension"},
    {"head-dim-v", "DV", OPT_INT, SHAPE | CLI_BENCH, OFF(head_dim_v), 1, 1024, 1,
     "head dimension of v (and o, do) when it differs from q/k's (default: D)"},
    {"seed", "N", OPT_SEED, SHAPE | CLI_RING, OFF(seed), 0, 0, 1,
     "random seed of the data, of --dropout's mask and --attn-mask random-bool (ring: the same on every rank)"},
    {"seed", "N", OPT_SEED, CLI_RUN | CLI_BENCH, OFF(seed), 0, 0, 0,
     "seed of --dropout's mask and of --attn-mask random-bool"},
    {"varlen-q", "N,...", OPT_LIST, SHAPE, OFF(varlen_q), 1, 1 << 24, 1,
     "a packed variable-length batch of these query lengths, one per sequence (instead of --batch, --seqlen-q/k)"},
    {"varlen-k", "N,...", OPT_LIST, SHAPE, OFF(varlen_k), 1, 1 << 24, 1,
     "the packed batch's key lengths (default: --varlen-q's)"},
    {"seqused-q", "N,...", OPT_LIST, SHAPE, OFF(seqused_q), 0, 1 << 24, 1,
     "with --varlen-q: query rows used of each sequence (rows past them get o = 0, dq = 0)"},
    {"seqused-k", "N,...", OPT_LIST, SHAPE, OFF(seqused_k), 0, 1 << 24, 1,
     "with --varlen-q: key rows used of each sequence (rows past them are not read; dk = dv = 0)"},
    {"seqlens", "N,...", OPT_LIST, CLI_BENCH, OFF(seqlens), 1, 1 << 24, 0, "sequence lengths (seqlen_q = seqlen_k)"},
    {"repeats", "N", OPT_INT, CLI_BENCH | CLI_RING, OFF(repeats), 1, 100000, 0, "timed calls per measurement (median)"},
    {"warmup", "N", OPT_INT, CLI_BENCH | CLI_RING, OFF(warmup), 0, 100000, 0, "untimed calls first"},
    {"csv", "FILE", OPT_STRING, CLI_BENCH | CLI_RING, OFF(csv), 0, 0, 0, "append rows (header first when new)"},
    {"check", "yes|no|auto", OPT_CHECK, CLI_BENCH, OFF(check), 0, 0, 0,
     "validate against cpu-ref first; auto = when forward <= 1e10 FLOP"},
    {"check", NULL, OPT_SWITCH, CLI_RING, OFF(check), 0, 0, 0,
     "rank 0 compares with one device and cpu-ref; exit 1 on FAIL"},
    {"bench", NULL, OPT_SWITCH, CLI_RING, OFF(bench), 0, 0, 0, "time the ring: per-rank TFLOP/s and efficiency"},
    {"timeout-ms", "T", OPT_INT, CLI_RING, OFF(timeout_ms), 0, INT64_MAX, 0,
     "give up on a silent peer after T ms; 0 = never (default: $FLASHC_RING_TIMEOUT_MS, else 300000)"},
};
enum { N_OPTIONS = sizeof options / sizeof options[0] };

static void set_defaults(unsigned bit, cli_options *o) {
  memset(o, 0, sizeof *o);
  o->mode = CLI_MODE_BOTH;
  o->dtype = -1;
  o->align = FLASHC_ALIGN_BOTTOM_RIGHT;
  o->window_left = o->window_right = -1;
  o->batch = 2;
  o->seqlen_q = 256;
  o->heads = 8;
  o->head_dim = 64;
  o->seed = 1;
  o->check = -1;
  if (bit == CLI_GEN) o->dtype = FLASHC_F32;
  o->timeout_ms = -1;
  if (bit == CLI_RING) {
    o->backend = "auto";
    o->batch = 1;
    o->seqlen_q = 1024;
    o->check = 0; /* a switch here */
    o->repeats = 10;
    o->warmup = 3;
  }
  if (bit == CLI_BENCH) {
    o->backend = "all";
    o->batch = 1;
    o->dtype = FLASHC_F32;
    o->repeats = 10;
    o->warmup = 3;
    o->seqlens = (cli_list){.v = {512, 1024, 2048}, .n = 3};
  }
}

static int parse_int(const char *flag, const char *s, int64_t min, int64_t max, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE) return cli_error("--%s: '%s' is not an integer", flag, s);
  if (v < min || v > max)
    return cli_error("--%s: %lld is outside [%lld, %lld]", flag, v, (long long)min, (long long)max);
  *out = v;
  return CLI_OK;
}

/* The index of s among n words; else −1 after an error that lists them ("is not fwd, bwd or both"). */
static int parse_choice(const cli_option *opt, const char *s, const char *const *words, int n) {
  char list[128] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    if (strcmp(s, words[i]) == 0) return i;
    used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                             i == 0      ? ""
                             : i + 1 < n ? ", "
                                         : " or ",
                             words[i]);
    if (used >= sizeof list) used = sizeof list - 1;
  }
  cli_error("--%s: '%s' is not %s", opt->name, s, list);
  return -1;
}

static int parse_value(const cli_option *opt, const char *s, cli_options *o) {
  void *field = (char *)o + opt->offset;
  switch (opt->kind) {
  case OPT_STRING:
    if (!*s) return cli_error("--%s: empty value", opt->name);
    *(const char **)field = s;
    return CLI_OK;
  case OPT_INT: {
    int64_t v = 0;
    if (parse_int(opt->name, s, opt->min, opt->max, &v)) return CLI_ERROR;
    if (opt->offset == OFF(threads) || opt->offset == OFF(repeats) || opt->offset == OFF(warmup))
      *(int *)field = (int)v;
    else
      *(int64_t *)field = v;
    return CLI_OK;
  }
  case OPT_SEED: {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || !isdigit((unsigned char)*s)) /* strtoull takes " -1" as 2^64 - 1 */
      return cli_error("--%s: '%s' is not a non-negative integer", opt->name, s);
    if (errno == ERANGE) return cli_error("--%s: '%s' is larger than 2^64 - 1", opt->name, s);
    *(uint64_t *)field = v;
    return CLI_OK;
  }
  case OPT_FLOAT: {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end != '\0' || isnan(v) || v < 0 || (isinf(v) && errno != ERANGE))
      return cli_error("--%s: '%s' is not a finite number >= 0", opt->name, s);
    /* Overflow, or underflow to a subnormal or to 0 (which would mean 1/sqrt(head_dim)): refused, not rounded. */
    if (errno == ERANGE)
      return cli_error("--%s: '%s' is outside fp32's range (0, or %g to %g)", opt->name, s, (double)FLT_MIN,
                       (double)FLT_MAX);
    *(float *)field = v;
    return CLI_OK;
  }
  case OPT_SWITCH: return CLI_OK; /* handled by the caller */
  case OPT_DTYPE: {
    flashc_dtype d;
    if (!cli_parse_dtype(s, &d)) return cli_error("--%s: '%s' is not f32, f16 or bf16", opt->name, s);
    *(int *)field = (int)d;
    return CLI_OK;
  }
  case OPT_MODE: {
    static const char *const words[] = {"fwd", "bwd", "both"};
    int i = parse_choice(opt, s, words, 3);
    if (i >= 0) o->mode = (cli_mode[]){CLI_MODE_FWD, CLI_MODE_BWD, CLI_MODE_BOTH}[i];
    return i >= 0 ? CLI_OK : CLI_ERROR;
  }
  case OPT_ALIGN: {
    static const char *const words[] = {"bottom-right", "top-left"};
    int i = parse_choice(opt, s, words, 2);
    if (i >= 0) o->align = (flashc_causal_align[]){FLASHC_ALIGN_BOTTOM_RIGHT, FLASHC_ALIGN_TOP_LEFT}[i];
    return i >= 0 ? CLI_OK : CLI_ERROR;
  }
  case OPT_WINDOW: {
    const char *comma = strchr(s, ',');
    if (!comma) return cli_error("--%s: '%s' is not L,R (two integers, -1 = unbounded)", opt->name, s);
    char left[32];
    size_t n = (size_t)(comma - s);
    if (n >= sizeof left) return cli_error("--%s: '%s' is not L,R", opt->name, s);
    memcpy(left, s, n);
    left[n] = '\0';
    if (parse_int(opt->name, left, -1, INT64_MAX, &o->window_left)) return CLI_ERROR;
    return parse_int(opt->name, comma + 1, -1, INT64_MAX, &o->window_right);
  }
  case OPT_LIST: {
    cli_list *list = field;
    int n = 0;
    const char *p = s;
    for (;;) {
      const char *comma = strchr(p, ',');
      size_t len = comma ? (size_t)(comma - p) : strlen(p);
      char item[32];
      if (len == 0 || len >= sizeof item)
        return cli_error("--%s: '%s' is not a list of integers N,N,...", opt->name, s);
      if (n == CLI_MAX_LIST) return cli_error("--%s: more than %d values", opt->name, CLI_MAX_LIST);
      memcpy(item, p, len);
      item[len] = '\0';
      if (parse_int(opt->name, item, opt->min, opt->max, &list->v[n++])) return CLI_ERROR;
      if (!comma) break;
      p = comma + 1;
    }
    list->n = n;
    return CLI_OK;
  }
  case OPT_CHECK: {
    static const char *const words[] = {"yes", "no", "auto"};
    int i = parse_choice(opt, s, words, 3);
    if (i >= 0) o->check = (int[]){1, 0, -1}[i];
    return i >= 0 ? CLI_OK : CLI_ERROR;
  }
  case OPT_LAYOUT: {
    static const char *const words[] = {"contiguous", "zigzag"};
    int i = parse_choice(opt, s, words, 2);
    if (i >= 0) o->layout = (flashc_ring_layout[]){FLASHC_RING_CONTIGUOUS, FLASHC_RING_ZIGZAG}[i];
    return i >= 0 ? CLI_OK : CLI_ERROR;
  }
  }
  return cli_error("--%s: internal error: unknown option kind", opt->name);
}

static const cli_option *find_option(unsigned bit, const char *name, size_t len) {
  for (int i = 0; i < N_OPTIONS; i++)
    if ((options[i].commands & bit) && strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
      return &options[i];
  return NULL;
}

int cli_parse_options(unsigned bit, int argc, char **argv, cli_options *o) {
  set_defaults(bit, o);
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      cli_print_command_help(cli_command);
      return CLI_HELP;
    }
    if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
      return cli_error("unexpected argument '%s' (options start with --; see flashc %s --help)", a, cli_command);
    const char *name = a + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const cli_option *opt = find_option(bit, name, len);
    if (!opt) return cli_error("unknown option '--%.*s' (see flashc %s --help)", (int)len, name, cli_command);
    if (opt->kind == OPT_SWITCH) {
      if (eq) return cli_error("--%s takes no value", opt->name);
      *(int *)((char *)o + opt->offset) = 1;
      continue;
    }
    const char *value = eq ? eq + 1 : NULL;
    if (!value) {
      if (i + 1 >= argc) return cli_error("--%s needs a value (%s)", opt->name, opt->arg);
      value = argv[++i];
    }
    if (parse_value(opt, value, o)) return CLI_ERROR;
    if (opt->generation) o->gen_flags_given = 1;
    if (opt->offset == OFF(batch)) o->batch_given = 1;
    if (opt->offset == OFF(seqlen_q)) o->seqlen_q_given = 1;
    if (opt->offset == OFF(seqlen_k)) o->seqlen_k_given = 1;
    if (opt->offset == OFF(heads_kv)) o->heads_kv_given = 1;
  }
  if (!o->seqlen_k_given) o->seqlen_k = o->seqlen_q;
  if (!o->heads_kv_given) o->heads_kv = o->heads;
  if (o->head_dim_v == 0) o->head_dim_v = o->head_dim;
  const cli_list lists[4] = {o->varlen_q, o->varlen_k, o->seqused_q, o->seqused_k};
  static const char *const names[4] = {"--varlen-q", "--varlen-k", "--seqused-q", "--seqused-k"};
  if (o->varlen_q.n && (o->batch_given || o->seqlen_q_given || o->seqlen_k_given))
    return cli_error("--varlen-q and --batch, --seqlen-q, --seqlen-k exclude each other: a packed batch has one "
                     "sequence per length");
  return cli_varlen_build(lists, names, &o->varlen);
}

/* The default of an option for subcommand `bit`, as text ("" when there is none worth printing). */
static void default_text(const cli_option *opt, const cli_options *d, char *out, size_t len) {
  const void *field = (const char *)d + opt->offset;
  out[0] = '\0';
  switch (opt->kind) {
  case OPT_STRING:
    if (*(const char *const *)field) snprintf(out, len, "%s", *(const char *const *)field);
    break;
  case OPT_INT:
    /* seqlen_k, heads_kv, head_dim_v: "default: SQ/H/D" in the help; timeout_ms: the help says where it comes from */
    if (opt->offset == OFF(seqlen_k) || opt->offset == OFF(heads_kv) || opt->offset == OFF(head_dim_v) ||
        opt->offset == OFF(timeout_ms))
      break;
    if (opt->offset == OFF(threads) || opt->offset == OFF(repeats) || opt->offset == OFF(warmup))
      snprintf(out, len, "%d", *(const int *)field);
    else
      snprintf(out, len, "%lld", (long long)*(const int64_t *)field);
    break;
  case OPT_SEED: snprintf(out, len, "%" PRIu64, *(const uint64_t *)field); break;
  case OPT_FLOAT: snprintf(out, len, "%g", (double)*(const float *)field); break;
  case OPT_SWITCH: break;
  case OPT_DTYPE:
    if (d->dtype >= 0) snprintf(out, len, "%s", flashc_dtype_name((flashc_dtype)d->dtype));
    break;
  case OPT_MODE:
    snprintf(out, len, "%s", d->mode == CLI_MODE_FWD ? "fwd" : d->mode == CLI_MODE_BWD ? "bwd" : "both");
    break;
  case OPT_ALIGN: snprintf(out, len, "bottom-right"); break;
  case OPT_WINDOW: snprintf(out, len, "-1,-1"); break;
  case OPT_LIST: {
    const cli_list *list = field;
    size_t used = 0;
    for (int i = 0; i < list->n && used < len; i++)
      used += (size_t)snprintf(out + used, len - used, "%s%lld", i ? "," : "", (long long)list->v[i]);
    break;
  }
  case OPT_CHECK: snprintf(out, len, "auto"); break;
  case OPT_LAYOUT: snprintf(out, len, "%s", d->layout == FLASHC_RING_ZIGZAG ? "zigzag" : "contiguous"); break;
  }
}

void cli_print_options(unsigned bit) {
  cli_options d;
  set_defaults(bit, &d);
  for (int i = 0; i < N_OPTIONS; i++) {
    const cli_option *opt = &options[i];
    if (!(opt->commands & bit)) continue;
    char left[64], def[96];
    snprintf(left, sizeof left, "--%s%s%s", opt->name, opt->arg ? " " : "", opt->arg ? opt->arg : "");
    default_text(opt, &d, def, sizeof def);
    printf("  %-38s %s%s%s%s\n", left, opt->help, def[0] ? " (default: " : "", def, def[0] ? ")" : "");
  }
  printf("  %-38s %s\n", "--help, -h", "this text");
}
