/* cmd_check.c — `flashc check`: a backend against the fp64 reference on the same inputs. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* "b2 sq256 sk256 hq8 hkv8 d64" */
static void describe(const cli_shape *s, const cli_varlen *v, char *out, size_t len) {
  snprintf(out, len, "batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, head_dim %lld", (long long)s->batch,
           (long long)s->seqlen_q, (long long)s->seqlen_k, (long long)s->heads_q, (long long)s->heads_kv,
           (long long)s->head_dim);
  if (s->head_dim_v != s->head_dim) {
    const size_t used = strlen(out);
    snprintf(out + used, len - used, ", head_dim_v %lld", (long long)s->head_dim_v);
  }
  cli_varlen_describe(v, out + strlen(out), len - strlen(out));
}

int cmd_check(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_CHECK, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  if (!o.backend) return cli_error("--backend NAME is required (see flashc list)");
  flashc_backend_info info; /* an unknown name fails here, before anything is printed or generated */
  if (cli_backend_info(o.backend, &info)) return CLI_ERROR;
  if (o.data && o.gen_flags_given)
    return cli_error("--data and the generation flags (--batch, --seqlen-q, ..., --seed) exclude each other: the "
                     "shape comes from the files");
  bool backward = o.mode != CLI_MODE_FWD;
  cli_inputs in;
  if (o.data) {
    if (cli_load(o.data, o.dtype, backward, &in)) return CLI_ERROR;
  } else {
    cli_shape s = cli_options_shape(&o);
    if (cli_generate(&s, o.dtype >= 0 ? (flashc_dtype)o.dtype : FLASHC_F32, o.seed, &in)) return CLI_ERROR;
    in.varlen = o.varlen;
  }
  if (cli_attach_mask(o.attn_mask, o.seed, &in)) {
    cli_inputs_free(&in);
    return CLI_ERROR;
  }
  flashc_params params = cli_params(&o);
  char shape[1400];
  describe(&in.shape, &in.varlen, shape, sizeof shape);
  printf("check %s (%s) against cpu-ref (f64): %s%s%s", o.backend, flashc_dtype_name(in.dtype), shape,
         o.causal ? ", causal" : "", o.causal && o.align == FLASHC_ALIGN_TOP_LEFT ? " (top-left)" : "");
  if (o.window_left >= 0 || o.window_right >= 0)
    printf(", window %lld,%lld", (long long)o.window_left, (long long)o.window_right);
  if (o.scale != 0) printf(", scale %g", (double)o.scale);
  if (o.softcap != 0) printf(", softcap %g", (double)o.softcap);
  if (o.dropout != 0) printf(", dropout %g (seed %llu)", (double)o.dropout, (unsigned long long)o.seed);
  if (o.alibi) printf(", ALiBi");
  if (in.mask.count) {
    char mask[300];
    cli_mask_describe(&in.mask, mask, sizeof mask);
    printf(", %s", mask);
  }
  printf("\n");

  cli_outputs out, ref;
  double ms_fwd = 0, ms_bwd = 0, t0;
  rc = cli_compute(o.backend, in.dtype, o.threads, &in, &params, backward, &out, &ms_fwd, &ms_bwd);
  if (!rc) {
    t0 = cli_now_ms();
    rc = cli_reference(&in, &params, backward, o.threads, &ref);
    if (!rc) {
      printf("%s: forward %.3f ms%s", o.backend, ms_fwd, backward ? "" : "\n");
      if (backward) printf(", backward %.3f ms\n", ms_bwd);
      printf("cpu-ref: %.3f ms\n", cli_now_ms() - t0);
      rc = cli_report(&out, &ref, &in.shape, in.dtype, false, NULL, NULL);
      const int64_t wrong = cli_unused_rows_wrong(&out, &in.shape, &in.varlen);
      if (in.varlen.has_used_q || in.varlen.has_used_k)
        printf("rows past seqused: %lld elements not 0 (lse: not -inf)  %s\n", (long long)wrong,
               wrong ? "FAIL" : "PASS");
      if (wrong) rc = CLI_CHECK_FAILED;
      printf("%s\n", rc == CLI_OK ? "PASS" : "FAIL");
      cli_outputs_free(&ref);
    }
    cli_outputs_free(&out);
  }
  cli_inputs_free(&in);
  return rc;
}
