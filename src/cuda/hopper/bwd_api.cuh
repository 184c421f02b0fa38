/* hopper/bwd_api.cuh — what hopper/fwd.cu (the backend entry) calls of cuda-hopper's backward (hopper/bwd.cu). */
#ifndef FLASHC_CUDA_HOPPER_BWD_API_CUH
#define FLASHC_CUDA_HOPPER_BWD_API_CUH

#include "common/common.cuh"

/* Can the backward run this validated backward problem? Called from the backend's `supports` after the checks
 * the forward shares (head dim, scale, q/k/v addressable by TMA). Refuses with FLASHC_ERR_UNSUPPORTED, and a
 * message naming the value, what it cannot address. */
flashc_status fc_hopper_bwd_supports(const fc_problem *p);

/* dq, dk, dv of a problem that fc_hopper_bwd_supports accepted. */
flashc_status fc_hopper_backward(const fc_problem *p);

#endif /* FLASHC_CUDA_HOPPER_BWD_API_CUH */
