/*
 * flashc.c — the `flashc` command: one table of subcommands drives dispatch, `flashc --help` and each
 * subcommand's --help (whose option lines come from the option table in options.c).
 *
 *   flashc demo                          start here: generate, run the best backend, check it
 *   flashc list                          the backends, usable here or not
 *   flashc gen   --data DIR ...          random inputs as .npy files
 *   flashc run   --data DIR --backend B  outputs (and gradients) as .npy files
 *   flashc check --backend B ...         errors against the fp64 reference; exit 1 on FAIL
 *   flashc bench --backend B,... ...     timings, TFLOP/s, GB/s; CSV rows (--decode: over a KV cache)
 *   mpirun -np N flashc ring ...         ring attention across MPI ranks (ring.c)
 */
#include "cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *cli_command = "";

int cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "flashc%s%s: ", cli_command[0] ? " " : "", cli_command);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return CLI_ERROR;
}

typedef struct cli_subcommand {
  const char *name;
  unsigned bit; /* its options in options.c */
  int (*run)(int argc, char **argv);
  const char *summary; /* one line, for `flashc --help` */
  const char *usage;
  const char *description; /* the paragraph under the usage line */
  void (*extra_help)(void);
} cli_subcommand;

/* --attn-mask's values (cli/mask.c), under the options of run, check and bench. */
static void mask_help(void) {
  printf("--attn-mask, as SDPA's attn_mask: PATH.npy of a shape that broadcasts to [batch, heads, seqlen_q, seqlen_k]\n"
         "(numpy's rule: aligned on the right, each dimension 1 or the full size; [seqlen_q, seqlen_k] serves every\n"
         "batch and head): bool ('|b1', True = attend), or a float bias added to the scores ('<f2', '<f4', '<f8',\n"
         "rounded to the compute dtype; -inf hides a key; bf16 as '<f4' files). Generated instead: random-bool "
         "([batch, 1, seqlen_q,\n"
         "seqlen_k], each True with probability 1/2, from --seed) or padding ([batch, 1, 1, seqlen_k]: sequence b of\n"
         "B hides its last floor((b+1)*seqlen_k/(2B)) keys). A row that sees no key gets o = 0. A backend without\n"
         "masks refuses the call, saying so.\n");
}

static void run_extra_help(void) { mask_help(); }

static void check_extra_help(void) {
  cli_print_tolerances();
  printf("\n");
  mask_help();
}

static void bench_extra_help(void) {
  printf("FLOPs: forward 4*b*hq*sq*sk*d (halved when causal), backward 2.5x the forward. GB/s: the bytes of the\n"
         "tensors each pass must read and write once. Timing: warm-up calls, then the median of the repeats;\n"
         "CUDA backends are timed with CUDA events and rotate over up to %d copies of the inputs. CSV columns:\n"
         "date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,world,\n"
         "threads,ms,tflops,gbps,max_abs_err,rel_l2_err (commit from $FLASHC_COMMIT). Errors are the worst over\n"
         "the pass's outputs (o, lse / dq, dk, dv), empty when not checked; a failed check makes the exit code 1.\n"
         "--backend all skips a backend that refuses the call's features (--attn-mask, --dropout, ...) and says so;\n"
         "the FLOPs of a masked call count the keys the mask hides.\n",
         CLI_MAX_SETS);
  printf("\n");
  mask_help();
}

static const cli_subcommand subcommands[] = {
    {"demo", CLI_DEMO, cmd_demo, "start here: a small problem on the best backend, checked against cpu-ref",
     "flashc demo [--backend NAME] [--threads N]",
     "Generates batch 2, heads 8, seqlen 512, head_dim 64 (fp32 on a CPU backend, bf16 on a GPU backend),\n"
     "runs forward and backward on the best usable backend (the first of `flashc list` that fits), checks both\n"
     "against the fp64 reference and prints a short table. Exit 0 when it passes.",
     NULL},
    {"list", CLI_LIST, cmd_list, "the backends of this build: usable or not (and why), dtypes, head dims",
     "flashc list", "Lists the backends best first, as `auto` tries them.", NULL},
    {"gen", CLI_GEN, cmd_gen, "write random inputs q, k, v, do as .npy files and meta.json",
     "flashc gen --data DIR [--batch B --seqlen-q SQ --seqlen-k SK --heads H --heads-kv HKV --head-dim D\n"
     "                  --seed N --dtype f32|f16|bf16] [--varlen-q N,... --varlen-k N,... --seqused-q N,...\n"
     "                  --seqused-k N,...]",
     "Writes q.npy, k.npy, v.npy, do.npy ([batch, seqlen, heads, head_dim], N(0,1) values) and meta.json to\n"
     "DIR (created). f16 data is stored as '<f2'; bf16 has no numpy dtype, so it is stored as '<f4' files of\n"
     "bf16-rounded values with \"dtype\": \"bf16\" in meta.json. With --varlen-q the batch is packed\n"
     "(FlashAttention's varlen): the tensors are [1, total, heads, head_dim] and meta.json records the lengths\n"
     "(\"varlen_q\", \"varlen_k\", \"seqused_q\", \"seqused_k\"), which run and check read back.",
     NULL},
    {"run", CLI_RUN, cmd_run, "run a backend on a data directory; write o, lse (and dq, dk, dv) as .npy",
     "flashc run --data DIR --backend NAME --mode fwd|bwd|both [--dtype f32|f16|bf16] [--causal]\n"
     "                  [--causal-align bottom-right|top-left] [--window L,R] [--scale S] [--attn-mask M]\n"
     "                  [--threads N]",
     "Reads DIR's inputs, converts them to the compute dtype, runs the backend and writes o.npy and lse.npy\n"
     "([batch, heads, seqlen_q], '<f4'), and for bwd/both dq.npy, dk.npy, dv.npy, in the dtype of the input\n"
     "files. bwd runs the forward first (it needs o and lse) and writes its outputs too.",
     run_extra_help},
    {"check", CLI_CHECK, cmd_check, "compare a backend with the fp64 reference (cpu-ref); exit 1 on FAIL",
     "flashc check [--data DIR | generation flags] --backend NAME [--mode ...] [attention options]",
     "Runs the backend and cpu-ref (in f64, on exactly the same inputs, already rounded to the compute dtype)\n"
     "and prints, per output (o, lse, dq, dk, dv), the max abs, mean abs, MSE, max relative and relative L2\n"
     "error, then PASS or FAIL. Without --data the inputs are generated from the generation flags.",
     check_extra_help},
    {"bench", CLI_BENCH, cmd_bench, "time backends over sequence lengths; table on stdout, CSV rows",
     "flashc bench [--backend NAME,...|all] [--seqlens N,...] [--batch B --heads H --heads-kv HKV --head-dim D\n"
     "                  --dtype T --causal --mode fwd|bwd|both] [--repeats N --warmup N] [--check yes|no|auto]\n"
     "                  [--attn-mask random-bool|padding|PATH.npy] [--csv FILE] [--threads N]",
     "For each sequence length (seqlen_q = seqlen_k) and backend: validates against cpu-ref (see --check),\n"
     "then times the forward and/or backward pass and prints backend, shape, median ms, TFLOP/s and GB/s.\n"
     "With --decode: attention over a KV cache instead, beside a memcpy bandwidth (flashc bench --decode --help).",
     bench_extra_help},
    {"ring", CLI_RING, cmd_ring, "ring attention across MPI ranks: mpirun -np N flashc ring ... (--check, --bench)",
     "mpirun -np N flashc ring [--data DIR | generation flags] [--backend NAME] [--layout contiguous|zigzag] ...",
     "Ring attention over the MPI ranks (CPU backends over MPI, CUDA backends over NCCL, one GPU per rank):\n"
     "every rank takes its shard of the whole inputs, rank 0 gathers the outputs.",
     cmd_ring_help},
};
enum { N_SUBCOMMANDS = sizeof subcommands / sizeof subcommands[0] };

static void print_main_help(void) {
  printf("flashc %s — exact attention (FlashAttention) in C and CUDA C\n\n"
         "usage: flashc <command> [options]    (flashc <command> --help for its options)\n\n"
         "commands:\n",
         flashc_version_string());
  for (int i = 0; i < N_SUBCOMMANDS; i++) printf("  %-7s %s\n", subcommands[i].name, subcommands[i].summary);
  printf("\nTensors are [batch, seqlen, heads, head_dim] in C order; lse is [batch, heads, seqlen_q] fp32.\n"
         "Exit codes: 0 ok, 1 a check failed, 2 a usage, input or runtime error (the message says which).\n");
}

void cli_print_command_help(const char *name) {
  for (int i = 0; i < N_SUBCOMMANDS; i++) {
    const cli_subcommand *c = &subcommands[i];
    if (strcmp(c->name, name) != 0) continue;
    printf("usage: %s\n\n%s\n\noptions:\n", c->usage, c->description);
    cli_print_options(c->bit);
    if (c->extra_help) {
      printf("\n");
      c->extra_help();
    }
    return;
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    print_main_help();
    return CLI_ERROR;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
    if (argc > 2 && strcmp(name, "help") == 0) {
      for (int i = 0; i < N_SUBCOMMANDS; i++)
        if (strcmp(subcommands[i].name, argv[2]) == 0) {
          cli_print_command_help(argv[2]);
          return CLI_OK;
        }
      return cli_error("unknown command '%s' (see flashc --help)", argv[2]);
    }
    print_main_help();
    return CLI_OK;
  }
  if (strcmp(name, "--version") == 0) {
    printf("flashc %s\n", flashc_version_string());
    return CLI_OK;
  }
  for (int i = 0; i < N_SUBCOMMANDS; i++)
    if (strcmp(subcommands[i].name, name) == 0) {
      cli_command = name;
      return subcommands[i].run(argc - 2, argv + 2);
    }
  char names[200] = "";
  size_t used = 0;
  for (int i = 0; i < N_SUBCOMMANDS && used < sizeof names; i++)
    used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", subcommands[i].name);
  return cli_error("unknown command '%s' (commands: %s; see flashc --help)", name, names);
}
