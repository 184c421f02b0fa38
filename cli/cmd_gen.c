/* cmd_gen.c — `flashc gen`: random inputs as .npy files and meta.json. */
#include "cli.h"

#include <stdio.h>

int cmd_gen(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_GEN, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  if (!o.data) return cli_error("--data DIR is required (the directory to write)");
  cli_shape s = cli_options_shape(&o);
  cli_inputs in;
  if (cli_generate(&s, (flashc_dtype)o.dtype, o.seed, &in)) return CLI_ERROR;
  in.varlen = o.varlen;
  rc = cli_save(o.data, &in);
  char varlen[1200];
  cli_varlen_describe(&o.varlen, varlen, sizeof varlen);
  if (!rc)
    printf("wrote q.npy k.npy v.npy do.npy meta.json to %s: batch %lld, seqlen_q %lld, seqlen_k %lld%s, heads "
           "%lld/%lld, head_dim %lld, %s ('%s' files), seed %llu\n",
           o.data, (long long)s.batch, (long long)s.seqlen_q, (long long)s.seqlen_k, varlen, (long long)s.heads_q,
           (long long)s.heads_kv, (long long)s.head_dim, flashc_dtype_name(in.dtype), npy_dtype_descr(in.file_dtype),
           (unsigned long long)o.seed);
  cli_inputs_free(&in);
  return rc;
}
