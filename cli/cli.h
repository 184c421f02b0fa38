/*
 * cli.h — what the parts of the `flashc` command-line tool share.
 *
 *   flashc.c    the subcommand table (drives dispatch and --help) and main
 *   options.c   the option table: every flag, which subcommands take it, its parser and its help line
 *   convert.c   f32 <-> f16/bf16/f64 conversion (round to nearest even)
 *   data.c      the attention inputs: generate, load from a directory, save; meta.json
 *   mask.c      --attn-mask: a boolean mask or float bias from a .npy file, or generated (random-bool, padding)
 *   runner.c    one backend on one problem: buffers (host or CUDA device), forward, backward, timing
 *   device.c    the CUDA runtime calls (FLASHC_CLI_CUDA builds only) and the device's name
 *   metrics.c   error metrics against the fp64 reference and the per-dtype tolerances
 *   cmd_*.c     one file per subcommand
 *
 * Tensors are [batch, seqlen, heads, head_dim] in C order (flashc_tensor_bshd); lse is [batch, heads_q,
 * seqlen_q] fp32. Exit codes: 0 ok, 1 a check failed, 2 a usage, input or runtime error.
 */
#ifndef FLASHC_CLI_H
#define FLASHC_CLI_H

#include "flashc.h"
#include "npy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { CLI_HELP = -1, CLI_OK = 0, CLI_CHECK_FAILED = 1, CLI_ERROR = 2 };

/* ---- messages ----------------------------------------------------------------------------------------- */
/* The running subcommand ("run"), for message prefixes. */
extern const char *cli_command;
/* Prints "flashc <command>: <message>\n" on stderr and returns CLI_ERROR. */
int cli_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---- options ------------------------------------------------------------------------------------------ */
typedef enum { CLI_MODE_FWD = 1, CLI_MODE_BWD = 2, CLI_MODE_BOTH = 3 } cli_mode;
enum { CLI_MAX_LIST = 32 };

/* The values of a list option (OPT_LIST: --seqlens N,N,...). */
typedef struct cli_list {
  int64_t v[CLI_MAX_LIST];
  int n; /* 0: not given */
} cli_list;

/* A packed variable-length batch (flashc_params.cu_seqlens_q/k, seqused_q/k): sequence s owns rows
 * [cu_q[s], cu_q[s+1]) of q (and o, do, dq) and [cu_k[s], cu_k[s+1]) of k (v, dk, dv); the tensors have batch 1
 * and seqlen cu_q[num_seqs] / cu_k[num_seqs]. */
typedef struct cli_varlen {
  int64_t num_seqs; /* 0: a dense batch */
  int32_t cu_q[CLI_MAX_LIST + 1], cu_k[CLI_MAX_LIST + 1];
  int32_t used_q[CLI_MAX_LIST], used_k[CLI_MAX_LIST]; /* rows of each slot used, where has_used_q/k */
  int has_used_q, has_used_k;
} cli_varlen;

/* Every option of every subcommand; options.c knows which subcommand accepts which. */
typedef struct cli_options {
  const char *data;    /* --data DIR */
  const char *backend; /* --backend NAME (bench: NAME,... or all) */
  cli_mode mode;
  int dtype; /* a flashc_dtype, or -1: from the data */
  int causal;
  flashc_causal_align align;
  int64_t window_left, window_right;
  float scale;
  float softcap;         /* 0: off */
  int alibi;             /* --alibi: ALiBi's slopes 2^(−8(h+1)/H) */
  float dropout;         /* --dropout P: attention dropout's rate, keyed by --seed (offset 0); 0: off */
  const char *attn_mask; /* --attn-mask PATH.npy|random-bool|padding; NULL: none */
  int threads;           /* 0: all online processors */
  int64_t batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
  int64_t head_dim_v; /* V's head dim (the generated v, o, do); --head-dim-v, else head_dim */
  uint64_t seed;
  cli_list seqlens;
  /* --varlen-q/k, --seqused-q/k (n 0: not given), and the packed batch they make (varlen.num_seqs 0: dense) */
  cli_list varlen_q, varlen_k, seqused_q, seqused_k;
  cli_varlen varlen;
  int repeats, warmup;
  const char *csv;
  int check; /* bench: 1 yes, 0 no, -1 auto; ring: 1 when --check was given */
  /* ring */
  const char *out; /* --out DIR: where rank 0 writes the outputs */
  flashc_ring_layout layout;
  int bench;          /* --bench */
  int64_t timeout_ms; /* −1: the library's default */
  /* which of the generation flags were given (check, ring: they exclude --data) */
  int gen_flags_given;
  int batch_given, seqlen_q_given, seqlen_k_given, heads_kv_given;
} cli_options;

typedef enum {
  CLI_GEN = 1u << 0,
  CLI_RUN = 1u << 1,
  CLI_CHECK = 1u << 2,
  CLI_BENCH = 1u << 3,
  CLI_LIST = 1u << 4,
  CLI_DEMO = 1u << 5,
  CLI_RING = 1u << 6
} cli_command_bit;

/* Defaults for subcommand `bit`, then argv parsed into *o. Returns CLI_OK, CLI_ERROR (a message was
 * printed) or CLI_HELP when --help was asked for (the command's help was printed: the command exits with 0). */
int cli_parse_options(unsigned bit, int argc, char **argv, cli_options *o);
/* The option lines of subcommand `bit`'s help. */
void cli_print_options(unsigned bit);

/* ---- dtype conversion (convert.c) --------------------------------------------------------------------- */
uint16_t cli_f32_to_f16(float x);
float cli_f16_to_f32(uint16_t h);
uint16_t cli_f32_to_bf16(float x);
float cli_bf16_to_f32(uint16_t h);
/* x rounded to `dtype` and back (f32 and f64: unchanged). */
float cli_round_to(flashc_dtype dtype, float x);
/* n values of f32 into a buffer of `dtype` (rounding once). */
void cli_pack(const float *src, void *dst, flashc_dtype dtype, int64_t n);
/* n values of a buffer of `dtype` into doubles (exact). */
void cli_unpack(const void *src, flashc_dtype dtype, double *dst, int64_t n);
/* "f32" "f16" "bf16" → *dtype; false for anything else. */
bool cli_parse_dtype(const char *s, flashc_dtype *dtype);

/* ---- the problem and its data (data.c) ----------------------------------------------------------------- */
typedef struct cli_shape {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
  int64_t head_dim_v; /* of v, o, do, dv */
} cli_shape;

/* Elements of q (and dq), k (dk), v (dv), o (do). */
static inline int64_t cli_q_elems(const cli_shape *s) { return s->batch * s->seqlen_q * s->heads_q * s->head_dim; }
static inline int64_t cli_k_elems(const cli_shape *s) { return s->batch * s->seqlen_k * s->heads_kv * s->head_dim; }
static inline int64_t cli_v_elems(const cli_shape *s) { return s->batch * s->seqlen_k * s->heads_kv * s->head_dim_v; }
static inline int64_t cli_o_elems(const cli_shape *s) { return s->batch * s->seqlen_q * s->heads_q * s->head_dim_v; }
static inline int64_t cli_lse_elems(const cli_shape *s) { return s->batch * s->heads_q * s->seqlen_q; }

/* An attention mask as the C API takes it (flashc_params.attn_mask): its elements in C order over `shape`, which
 * broadcasts to [batch, heads_q, seqlen_q, seqlen_k] (each dimension 1 or the full size; stride 0 where it is 1). */
typedef struct cli_mask {
  int is_bool;       /* 1: keep (nonzero = attend); 0: bias */
  int64_t shape[4];  /* batch|1, heads_q|1, seqlen_q|1, seqlen_k|1 */
  int64_t stride[4]; /* in elements; 0 on a broadcast dimension */
  int64_t count;     /* elements held; 0: no mask */
  uint8_t *keep;     /* is_bool */
  float *bias;       /* !is_bool: values of the compute dtype (rounded to it), finite or −inf */
  char source[96];   /* for messages: the file's name, "random-bool" or "padding" */
} cli_mask;

/* The inputs on the host as f32, already representable in `dtype` (bf16/f16 values are rounded). */
typedef struct cli_inputs {
  cli_shape shape;
  flashc_dtype dtype;      /* compute dtype */
  npy_dtype file_dtype;    /* of the files read or written: outputs use it */
  uint64_t seed;           /* 0 when unknown (loaded data without meta.json) */
  float *q, *k, *v, *dout; /* dout NULL when the data has none (forward only) */
  cli_mask mask;           /* --attn-mask (count 0: none); cli_attach_mask sets it */
  cli_varlen varlen;       /* a packed batch (num_seqs 0: dense); shape.batch is 1 then */
} cli_inputs;

/* The state of random stream `stream` of a seed, and its next 64 bits (splitmix64): each generated tensor draws
 * from a stream of its own (q 0, k 1, v 2, do 3, the attention mask 4). */
uint64_t cli_random_state(uint64_t seed, int stream);
uint64_t cli_splitmix64(uint64_t *state);
/* A packed batch from its lists: lengths of q, of k (n 0: the same as q's), rows used of each q and k slot (n 0: all).
 * names[4] name the lists in messages ("--varlen-q", or meta.json's keys). CLI_OK, or CLI_ERROR with a message (a
 * list without lengths of q, counts that differ, a used count past its sequence, totals past 2^31 - 1). */
int cli_varlen_build(const cli_list lists[4], const char *const names[4], cli_varlen *v);
/* The shape of the generation flags: --batch, --seqlen-q, --seqlen-k; or, with --varlen-q, batch 1 and the totals. */
cli_shape cli_options_shape(const cli_options *o);
/* " (varlen q 1,7,33, k 1,7,33, seqused_q 1,5,20)" for messages (out[len]); "" for a dense batch. */
void cli_varlen_describe(const cli_varlen *v, char *out, size_t len);
/* Checks the shape flags (ranges, heads_q % heads_kv); CLI_OK or CLI_ERROR with a message. */
int cli_check_shape(const cli_shape *s);
/* Random N(0, 1) inputs from a seed, rounded to dtype. */
int cli_generate(const cli_shape *s, flashc_dtype dtype, uint64_t seed, cli_inputs *in);
/* q.npy k.npy v.npy [do.npy] and meta.json of dir; dtype: a flashc_dtype or -1 (meta.json's, else the
 * files'). need_dout: do.npy must exist. */
int cli_load(const char *dir, int dtype, bool need_dout, cli_inputs *in);
/* Writes q k v do .npy and meta.json into dir (created). */
int cli_save(const char *dir, const cli_inputs *in);
void cli_inputs_free(cli_inputs *in);

/* ---- the attention mask (mask.c) ------------------------------------------------------------------------ */
/* --attn-mask SPEC for the inputs' shape and compute dtype, into in->mask: a .npy file (bool: a boolean mask; f2, f4,
 * f8: a bias, rounded to the compute dtype), or "random-bool" / "padding", generated from `seed`. CLI_OK, or
 * CLI_ERROR with a message that names the file and its shape or value. */
int cli_attach_mask(const char *spec, uint64_t seed, cli_inputs *in);
void cli_mask_free(cli_mask *m);
/* "bool (2, 1, 1, 203) from padding" for the check's header line. */
void cli_mask_describe(const cli_mask *m, char *out, size_t len);
/* Writes a tensor of doubles to dir/name as npy dtype `file_dtype`, shape [ndim] dims. */
int cli_write_tensor(const char *dir, const char *name, const double *x, npy_dtype file_dtype, int ndim,
                     const int64_t *dims);
/* Creates a directory and its parents (mkdir -p). */
int cli_mkdirs(const char *dir);

/* ---- one backend on one problem (runner.c) ------------------------------------------------------------ */
enum { CLI_MAX_SETS = 4 };

/* Outputs as doubles on the host (NULL for what was not computed). */
typedef struct cli_outputs {
  double *o, *lse, *dq, *dk, *dv;
} cli_outputs;

typedef struct cli_set {
  void *q, *k, *v, *dout, *o, *dq, *dk, *dv; /* compute dtype; device memory for CUDA backends */
  float *lse;
} cli_set;

typedef struct cli_runner {
  flashc_handle handle;
  void *alibi; /* with ALiBi: the slopes for shape.heads_q, where the backend reads them (params points here) */
  void *mask;  /* with the inputs' mask: it in the compute dtype (bool: uint8), where the backend reads it */
  flashc_status status; /* of the last forward or backward call */
  flashc_backend_info info;
  flashc_dtype dtype;
  int on_device; /* 1: the sets live in CUDA device memory */
  int n_sets;
  int backward; /* buffers for backward were allocated */
  cli_shape shape;
  cli_varlen varlen; /* the inputs' packed batch, which params.cu_seqlens_q/k and seqused_q/k point into */
  flashc_params params;
  cli_set set[CLI_MAX_SETS];
} cli_runner;

/* The backend's info by name; CLI_ERROR with a message when unknown. */
int cli_backend_info(const char *name, flashc_backend_info *info);
/* Can this CLI run the backend? (usable, and a CUDA backend needs a FLASHC_CLI_CUDA build). why[len]. */
bool cli_backend_runnable(const flashc_backend_info *info, char *why, size_t len);

/* Opens a runner: a handle on `backend`, `n_sets` copies of the inputs converted to `dtype` (on the device
 * for CUDA backends), output buffers (backward ones when `backward`); the inputs' mask, if any, goes into the
 * params. */
int cli_runner_open(cli_runner *r, const char *backend, flashc_dtype dtype, int threads, const cli_inputs *in,
                    const flashc_params *params, int n_sets, bool backward);
void cli_runner_close(cli_runner *r);
/* Fills the outputs of set s (o and lse, or with `backward` dq, dk, dv) with NaN, so that an output the
 * backend forgets to write cannot pass. */
int cli_runner_poison(cli_runner *r, int s, bool backward);
int cli_runner_forward(cli_runner *r, int s);
int cli_runner_backward(cli_runner *r, int s);
/* Copies set s's outputs into freshly allocated doubles (backward ones when `backward`). */
int cli_runner_fetch(cli_runner *r, int s, bool backward, cli_outputs *out);
void cli_outputs_free(cli_outputs *out);
/* Runs `warmup` untimed then `repeats` timed calls of forward (backward when `backward`), rotating over
 * the sets, and writes each call's milliseconds into ms[repeats]. Allocates nothing inside the loop. */
int cli_runner_time(cli_runner *r, bool backward, int warmup, int repeats, double *ms);
/* Forward then backward with poisoned outputs on set 0, fetching the results: the whole job of run,
 * check and demo. Milliseconds of each pass (wall clock, including device sync) into ms_fwd/ms_bwd. */
int cli_compute(const char *backend, flashc_dtype dtype, int threads, const cli_inputs *in, const flashc_params *params,
                bool backward, cli_outputs *out, double *ms_fwd, double *ms_bwd);

/* ---- CUDA (device.c) ----------------------------------------------------------------------------------- */
/* All return CLI_OK or CLI_ERROR with a message; without FLASHC_CLI_CUDA they fail with "built without
 * CUDA". */
int cli_device_alloc(void **ptr, size_t bytes);
void cli_device_free(void *ptr);
int cli_device_upload(void *dst, const void *src, size_t bytes);
int cli_device_download(void *dst, const void *src, size_t bytes);
int cli_device_fill_nan(void *ptr, size_t bytes);
int cli_device_sync(void);
/* Per-call device timing with events recorded on the default stream: n pairs, created before the loop. */
typedef struct cli_device_timer cli_device_timer;
int cli_device_timer_create(cli_device_timer **t, int n);
int cli_device_timer_start(cli_device_timer *t, int i);
int cli_device_timer_stop(cli_device_timer *t, int i);
/* After the loop: waits for the events, ms[n]. */
int cli_device_timer_read(cli_device_timer *t, double *ms);
void cli_device_timer_destroy(cli_device_timer *t);
/* The GPU's name, or "" without CUDA. */
void cli_device_name(char *out, size_t len);
/* The CPU's model name from /proc/cpuinfo ("unknown CPU" if absent). */
void cli_cpu_name(char *out, size_t len);
double cli_now_ms(void);
/* The median of v[0..n) (n >= 1); sorts v in place. */
double cli_median(double *v, int n);

/* ---- errors against the reference (metrics.c) ----------------------------------------------------------- */
typedef struct cli_error_stats {
  double max_abs, mean_abs, mse, max_rel, rel_l2;
  double ref_max_abs; /* max |ref| */
  double scale;       /* what max_abs is judged against: max(max|ref|, floor) */
  int64_t bad;        /* NaN, or ±inf where the reference differs */
} cli_error_stats;

typedef struct cli_tolerance {
  double rel_l2;  /* ‖x − ref‖₂ / ‖ref‖₂ (floored, see cli_compare) */
  double max_abs; /* max |x − ref| / scale */
} cli_tolerance;

/* Statistics of x against ref; floor_rms (>= 0) is the least RMS the errors are judged on: rel_l2 divides
 * by max(‖ref‖₂, floor_rms·√n) and `scale` = max(max|ref|, floor_rms). */
void cli_compare(const double *x, const double *ref, int64_t n, double floor_rms, cli_error_stats *st);
/* The tolerance of an output ("o", "lse", "dq", ...) computed in `dtype`. */
cli_tolerance cli_tolerance_for(flashc_dtype dtype, const char *output);
bool cli_within(const cli_error_stats *st, cli_tolerance tol);
/* Elements of the backend's outputs past a packed batch's seqused rows that are not what the library defines there
 * (o, dq, dk, dv exactly 0; lse −inf); 0 for a dense batch or without seqused. */
int64_t cli_unused_rows_wrong(const cli_outputs *out, const cli_shape *s, const cli_varlen *v);
/* The help text paragraph that states the tolerances. */
void cli_print_tolerances(void);

/* Compares every output of `out` with `ref` (those present in both), prints a table, returns CLI_OK or
 * CLI_CHECK_FAILED. worst_* receive the largest max_abs and rel_l2 (may be NULL). */
int cli_report(const cli_outputs *out, const cli_outputs *ref, const cli_shape *s, flashc_dtype dtype, bool quiet,
               double *worst_abs, double *worst_rel_l2);

/* ---- subcommands ---------------------------------------------------------------------------------------- */
int cmd_gen(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_decode(int argc, char **argv); /* cmd_decode.c: `flashc bench --decode` */
int cmd_list(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_ring(int argc, char **argv); /* ring.c: ring attention across MPI ranks */
void cmd_ring_help(void);            /* the paragraph after its options: FLOPs and efficiency */
/* Prints the help of a subcommand by name (from the table in flashc.c). */
void cli_print_command_help(const char *name);

/* Params from the options (causal, align, window, scale, softcap, dropout with the seed; with --alibi, alibi_slopes
 * points to slopes for o->heads heads, which cli_runner_open replaces by slopes for the data's heads where the backend
 * reads them). */
flashc_params cli_params(const cli_options *o);
/* ALiBi's slopes of the paper, 2^(−8(h+1)/H) for heads h < H, in a buffer of this process (valid until the
 * next call); NULL when H is larger than it holds. */
const float *cli_alibi_slopes(int64_t heads);
/* Runs the reference (cpu-ref, in f64 when it has it) on the inputs. */
int cli_reference(const cli_inputs *in, const flashc_params *params, bool backward, int threads, cli_outputs *ref);

#endif /* FLASHC_CLI_H */
