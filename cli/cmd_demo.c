/* cmd_demo.c — `flashc demo`: what a new user runs first. A modest problem on the best usable backend,
 * forward and backward, checked against the fp64 reference, in a few seconds. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

/* The dtype the demo uses on a backend: bf16 (then f16) on a GPU, f32 on a CPU; -1 if none fits. */
static int demo_dtype(const flashc_backend_info *info) {
  static const flashc_dtype gpu[3] = {FLASHC_BF16, FLASHC_F16, FLASHC_F32};
  if (info->device == FLASHC_DEVICE_CUDA) {
    for (int i = 0; i < 3; i++)
      if (info->dtypes & (1u << gpu[i])) return (int)gpu[i];
    return -1;
  }
  return (info->dtypes & (1u << FLASHC_F32)) ? FLASHC_F32 : -1;
}

/* The first backend of flashc_backend_get's order that runs here, takes head_dim `d` and has a dtype. */
static int pick_backend(int64_t d, flashc_backend_info *best) {
  int n = flashc_backend_count();
  for (int i = 0; i < n; i++) {
    char why[256];
    if (flashc_backend_get(i, best) != FLASHC_OK || !cli_backend_runnable(best, why, sizeof why)) continue;
    if (d < best->min_head_dim || d > best->max_head_dim || demo_dtype(best) < 0) continue;
    return CLI_OK;
  }
  return cli_error("no usable backend for the demo (see flashc list)");
}

static void row(const char *backend, flashc_dtype dtype, const char *pass, double ms, double max_abs, double rel_l2,
                int result) {
  printf("%-12s %-5s %-4s %10.2f %11.3e %11.3e  %s\n", backend, flashc_dtype_name(dtype), pass, ms, max_abs, rel_l2,
         result == CLI_OK ? "PASS" : "FAIL");
}

int cmd_demo(int argc, char **argv) {
  cli_options o;
  int rc = cli_parse_options(CLI_DEMO, argc, argv, &o);
  if (rc != CLI_OK) return rc == CLI_HELP ? CLI_OK : rc;
  const cli_shape s = {2, 512, 512, 8, 8, 64, 64};
  flashc_backend_info info;
  if (o.backend) {
    char why[256];
    if (cli_backend_info(o.backend, &info)) return CLI_ERROR;
    if (!cli_backend_runnable(&info, why, sizeof why))
      return cli_error("backend %s is not usable here: %s", o.backend, why);
    if (demo_dtype(&info) < 0) return cli_error("backend %s has no dtype the demo uses (f32, f16, bf16)", o.backend);
  } else if (pick_backend(s.head_dim, &info)) {
    return CLI_ERROR;
  }
  flashc_dtype dtype = (flashc_dtype)demo_dtype(&info);
  bool backward = info.has_backward != 0;
  printf("flashc demo: attention forward%s on batch %lld, heads %lld, seqlen %lld, head_dim %lld, %s\n"
         "backend %s (%s): %s\n\n",
         backward ? " and backward" : "", (long long)s.batch, (long long)s.heads_q, (long long)s.seqlen_q,
         (long long)s.head_dim, flashc_dtype_name(dtype), info.name, info.device == FLASHC_DEVICE_CUDA ? "GPU" : "CPU",
         info.summary);
  cli_inputs in;
  if (cli_generate(&s, dtype, 1, &in)) return CLI_ERROR;
  flashc_params params = flashc_params_default();
  cli_outputs out, ref;
  double ms_fwd = 0, ms_bwd = 0, t0 = 0, ms_ref = 0;
  rc = cli_compute(info.name, dtype, o.threads, &in, &params, backward, &out, &ms_fwd, &ms_bwd);
  if (!rc) {
    t0 = cli_now_ms();
    rc = cli_reference(&in, &params, backward, o.threads, &ref);
    ms_ref = cli_now_ms() - t0;
    if (rc) cli_outputs_free(&out);
  }
  if (rc) {
    cli_inputs_free(&in);
    return CLI_ERROR;
  }
  printf("%-12s %-5s %-4s %10s %11s %11s  %s\n", "backend", "dtype", "pass", "ms", "max_abs", "rel_l2", "result");
  double abs_f, l2_f, abs_b = 0, l2_b = 0;
  cli_outputs fwd_only = {out.o, out.lse, NULL, NULL, NULL}, bwd_only = {NULL, NULL, out.dq, out.dk, out.dv};
  int rc_f = cli_report(&fwd_only, &ref, &s, dtype, true, &abs_f, &l2_f);
  row(info.name, dtype, "fwd", ms_fwd, abs_f, l2_f, rc_f);
  int rc_b = CLI_OK;
  if (backward) {
    rc_b = cli_report(&bwd_only, &ref, &s, dtype, true, &abs_b, &l2_b);
    row(info.name, dtype, "bwd", ms_bwd, abs_b, l2_b, rc_b);
  }
  rc = rc_f || rc_b ? CLI_CHECK_FAILED : CLI_OK;
  printf("\nreference: cpu-ref in f64, %.0f ms. Errors are the worst over o, lse (fwd) and dq, dk, dv (bwd).\n"
         "%s\n\nnext: flashc list | flashc check --backend %s --causal | flashc bench --backend %s --seqlens "
         "512,1024\n",
         ms_ref, rc == CLI_OK ? "PASS" : "FAIL: see flashc check for every error metric", info.name, info.name);
  cli_outputs_free(&out);
  cli_outputs_free(&ref);
  cli_inputs_free(&in);
  return rc;
}
