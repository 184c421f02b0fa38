/* backends.c — the one table of backends, best first. It drives dispatch (`auto` takes the first that
 * accepts a call), flashc_backend_get, `flashc list` and the CLI's help.
 *
 * Each backend defines its fc_backend in its own file. The references are weak so that a build without a
 * part (no CUDA toolkit, a rung not written yet) links with a NULL in its place, which the API skips. */
#include "internal.h"

#define FC_BACKEND(sym) extern const fc_backend sym __attribute__((weak, visibility("hidden")));
FC_BACKEND(fc_backend_cuda_hopper)
FC_BACKEND(fc_backend_cuda_mma)
FC_BACKEND(fc_backend_cuda_wmma)
FC_BACKEND(fc_backend_cuda_fa2_fp32)
FC_BACKEND(fc_backend_cuda_fa1)
FC_BACKEND(fc_backend_cuda_naive)
FC_BACKEND(fc_backend_cpu)
FC_BACKEND(fc_backend_cpu_ref)

const fc_backend *const fc_backends[] = {
    &fc_backend_cuda_hopper,   /* wgmma, TMA, warp specialisation (sm_90a)   */
    &fc_backend_cuda_mma,      /* mma.sync tensor cores (sm_80+)             */
    &fc_backend_cuda_wmma,     /* the wmma API: simplest tensor-core rung    */
    &fc_backend_cuda_fa2_fp32, /* FlashAttention-2 on CUDA cores, fp32       */
    &fc_backend_cuda_fa1,      /* FlashAttention-1 loop order                */
    &fc_backend_cuda_naive,    /* materialised scores                        */
    &fc_backend_cpu,           /* tiled FlashAttention-2 on CPU threads      */
    &fc_backend_cpu_ref,       /* fp64 oracle                                */
};
const int fc_backend_total = (int)(sizeof fc_backends / sizeof fc_backends[0]);
