/* cmd_list.c — `flashc list`: the backends of this build, best first, from flashc_backend_get. */
#include "cli.h"

#include <stdio.h>

int cmd_list(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_LIST, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  int n = flashc_backend_count();
  printf("%-12s %-6s %-6s %-16s %-9s %-8s %s\n", "backend", "usable", "device", "dtypes", "head_dim", "backward",
         "summary");
  for (int i = 0; i < n; i++) {
    flashc_backend_info info;
    if (flashc_backend_get(i, &info) != FLASHC_OK) return cli_error("%s", flashc_last_error());
    char why[256], dtypes[64] = "", dims[32];
    bool runnable = cli_backend_runnable(&info, why, sizeof why);
    size_t used = 0;
    for (int d = FLASHC_F32; d <= FLASHC_F64; d++)
      if (info.dtypes & (1u << d) && used < sizeof dtypes)
        used += (size_t)snprintf(dtypes + used, sizeof dtypes - used, "%s%s", used ? "," : "",
                                 flashc_dtype_name((flashc_dtype)d));
    snprintf(dims, sizeof dims, "%d..%d", info.min_head_dim, info.max_head_dim);
    printf("%-12s %-6s %-6s %-16s %-9s %-8s %s\n", info.name, runnable ? "yes" : "no",
           info.device == FLASHC_DEVICE_CUDA ? "cuda" : "cpu", dtypes, dims, info.has_backward ? "yes" : "no",
           info.summary);
    if (!runnable) printf("%-12s   not usable: %s\n", "", why);
  }
  if (n == 0) printf("(no backends in this build)\n");
  return CLI_OK;
}
