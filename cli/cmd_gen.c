/* cmd_gen.c — `flashc gen`: random inputs as .npy files and meta.json. */
#include "cli.h"

#include <stdio.h>

int cmd_gen(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_GEN, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  if (!o.data) return cli_error("--data DIR is required (the directory to write)");
  cli_shape s = {o.batch, o.seqlen_q, o.seqlen_k, o.heads, o.heads_kv, o.head_dim, o.head_dim_v};
  cli_inputs in;
  if (cli_generate(&s, (flashc_dtype)o.dtype, o.seed, &in)) return CLI_ERROR;
  rc = cli_save(o.data, &in);
  if (!rc)
    printf("wrote q.npy k.npy v.npy do.npy meta.json to %s: batch %lld, seqlen_q %lld, seqlen_k %lld, heads %lld/%lld, "
           "head_dim %lld, %s ('%s' files), seed %llu\n",
           o.data, (long long)s.batch, (long long)s.seqlen_q, (long long)s.seqlen_k, (long long)s.heads_q,
           (long long)s.heads_kv, (long long)s.head_dim, flashc_dtype_name(in.dtype), npy_dtype_descr(in.file_dtype),
           (unsigned long long)o.seed);
  cli_inputs_free(&in);
  return rc;
}
