/* cmd_run.c — `flashc run`: a backend on a data directory; outputs and gradients as .npy files. */
#include "cli.h"

#include <stdio.h>

int cmd_run(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_RUN, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  if (!o.data) return cli_error("--data DIR is required (a directory written by flashc gen, or the same files)");
  if (!o.backend) return cli_error("--backend NAME is required (see flashc list)");
  bool backward = o.mode != CLI_MODE_FWD;
  cli_inputs in;
  if (cli_load(o.data, o.dtype, backward, &in)) return CLI_ERROR;
  if (cli_attach_mask(o.attn_mask, o.seed, &in)) {
    cli_inputs_free(&in);
    return CLI_ERROR;
  }
  flashc_params params = cli_params(&o);
  cli_outputs out;
  double ms_fwd = 0, ms_bwd = 0;
  rc = cli_compute(o.backend, in.dtype, o.threads, &in, &params, backward, &out, &ms_fwd, &ms_bwd);
  if (!rc) {
    const cli_shape *s = &in.shape;
    int64_t q[4] = {s->batch, s->seqlen_q, s->heads_q, s->head_dim};
    int64_t kv[4] = {s->batch, s->seqlen_k, s->heads_kv, s->head_dim};
    int64_t os[4] = {s->batch, s->seqlen_q, s->heads_q, s->head_dim_v},
            vs[4] = {s->batch, s->seqlen_k, s->heads_kv, s->head_dim_v};
    int64_t lse[3] = {s->batch, s->heads_q, s->seqlen_q};
    rc = cli_write_tensor(o.data, "o.npy", out.o, in.file_dtype, 4, os) ||
         cli_write_tensor(o.data, "lse.npy", out.lse, NPY_F4, 3, lse);
    if (!rc && backward)
      rc = cli_write_tensor(o.data, "dq.npy", out.dq, in.file_dtype, 4, q) ||
           cli_write_tensor(o.data, "dk.npy", out.dk, in.file_dtype, 4, kv) ||
           cli_write_tensor(o.data, "dv.npy", out.dv, in.file_dtype, 4, vs);
    if (!rc) {
      printf("%s, %s: forward %.3f ms", o.backend, flashc_dtype_name(in.dtype), ms_fwd);
      if (backward) printf(", backward %.3f ms", ms_bwd);
      printf("; wrote o.npy lse.npy%s to %s\n", backward ? " dq.npy dk.npy dv.npy" : "", o.data);
    }
    rc = rc ? CLI_ERROR : CLI_OK;
  }
  cli_outputs_free(&out);
  cli_inputs_free(&in);
  return rc;
}
