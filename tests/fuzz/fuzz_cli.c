/*
 * fuzz_cli.c — libFuzzer target for the command line's option parser (cli/options.c: cli_parse_options, the option
 * table, its value parsers and the packed-batch lists of cli/data.c's cli_varlen_build).
 *
 * An input is a subcommand (its first byte) and its arguments (the rest, split at NUL and newline bytes). Beyond
 * "no crash, no UB" (ASan/UBSan), it checks what the parser promises: it returns CLI_OK, CLI_ERROR or CLI_HELP; an
 * error has said why (cli_error was called); and an accepted command line is within the table's ranges: a
 * packed batch's offsets grow from 0 and stay under 2^31, its rows used within their sequences, the shape of the
 * generation flags positive, and the window's sides -1 or more.
 *   cmake -B build-fuzz -DFLASHC_FUZZ=ON -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz -t fuzz_cli
 *   build-fuzz/tests/fuzz_cli -max_total_time=60 tests/fuzz/corpus/cli
 */
#include "cli.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the CLI's main (cli/flashc.c, not linked here) provides to the parser. */
const char *cli_command = "fuzz";
static int errors; /* cli_error calls during one parse */
int cli_error(const char *fmt, ...) {
  if (fmt == NULL || fmt[0] == '\0') abort(); /* an error without a message */
  errors++;
  return CLI_ERROR;
}
void cli_print_command_help(const char *name) { (void)name; }

enum { MAX_ARGS = 48, MAX_BYTES = 4096 };

static void check_accepted(const cli_options *o) {
  const cli_varlen *v = &o->varlen;
  if (v->num_seqs < 0 || v->num_seqs > CLI_MAX_LIST) abort();
  if (v->num_seqs > 0) {
    if (v->cu_q[0] != 0 || v->cu_k[0] != 0) abort();
    for (int64_t s = 0; s < v->num_seqs; s++) {
      const int32_t lq = v->cu_q[s + 1] - v->cu_q[s], lk = v->cu_k[s + 1] - v->cu_k[s];
      if (lq < 0 || lk < 0) abort();
      if (v->has_used_q && (v->used_q[s] < 0 || v->used_q[s] > lq)) abort();
      if (v->has_used_k && (v->used_k[s] < 0 || v->used_k[s] > lk)) abort();
    }
  }
  const cli_shape s = cli_options_shape(o);
  if (s.batch < 1 || s.seqlen_q < 0 || s.seqlen_k < 0 || s.heads_q < 1 || s.heads_kv < 1 || s.head_dim < 1 ||
      s.head_dim_v < 1)
    abort();
  if (o->window_left < -1 || o->window_right < -1) abort();
  if (o->seqlens.n < 0 || o->seqlens.n > CLI_MAX_LIST) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const unsigned commands[] = {CLI_GEN, CLI_RUN, CLI_CHECK, CLI_BENCH, CLI_LIST, CLI_DEMO, CLI_RING};
  if (size < 1 || size > MAX_BYTES) return 0;
  const unsigned bit = commands[data[0] % (sizeof commands / sizeof commands[0])];
  char buf[MAX_BYTES + 1];
  memcpy(buf, data + 1, size - 1);
  buf[size - 1] = '\0';
  char *argv[MAX_ARGS + 1];
  int argc = 0;
  for (char *p = buf; argc < MAX_ARGS;) { /* tokens between NUL and newline bytes */
    argv[argc++] = p;
    char *end = p + strcspn(p, "\n");
    if (end >= buf + size - 1) break;
    *end = '\0';
    p = end + 1;
  }
  argv[argc] = NULL;
  cli_options o;
  errors = 0;
  const int rc = cli_parse_options(bit, argc, argv, &o);
  if (rc != CLI_OK && rc != CLI_ERROR && rc != CLI_HELP) abort();
  if (rc == CLI_ERROR && errors == 0) abort(); /* refused without saying why */
  if (rc == CLI_OK) check_accepted(&o);
  return 0;
}
