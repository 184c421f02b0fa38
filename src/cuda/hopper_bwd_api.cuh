/* hopper_bwd_api.cuh — what hopper.cu (the backend entry) calls of cuda-hopper's backward (hopper_bwd.cu). */
#ifndef FLASHC_CUDA_HOPPER_BWD_API_CUH
#define FLASHC_CUDA_HOPPER_BWD_API_CUH

#include "common.cuh"

/* Can the backward run this validated backward problem? Called from the backend's `supports` after the checks
 * the forward shares (head dim, scale, q/k/v addressable by TMA). Refuses with FLASHC_ERR_UNSUPPORTED, and a
 * message naming the value, what it cannot address. */
flashc_status fc_hopper_bwd_supports(const fc_problem *p);

/* The largest head dim the backward runs: 128, or 256 when FLASHC_HOPPER_BWD_D256 is 1 or 2 (read at every call;
 * the D = 256 kernel is compile-only so far). Fails only on an unknown value of that variable. */
flashc_status fc_hopper_bwd_head_dim_max(int *max);

/* dq, dk, dv of a problem that fc_hopper_bwd_supports accepted. */
flashc_status fc_hopper_backward(const fc_problem *p);

#endif /* FLASHC_CUDA_HOPPER_BWD_API_CUH */
