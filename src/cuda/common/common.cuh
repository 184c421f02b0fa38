/* common/common.cuh — what every CUDA rung shares: error checks that become library statuses, the stream, the
 * device's properties. Kernels are CUDA C; this header is included by .cu files only. */
#ifndef FLASHC_CUDA_COMMON_CUH
#define FLASHC_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../../internal.h"

/* A failed CUDA call becomes FLASHC_ERR_CUDA (or OUT_OF_MEMORY) with the call, place and CUDA's words. */
#define FC_CUDA_CHECK(call)                                                                                            \
  do {                                                                                                                 \
    cudaError_t fc_e_ = (call);                                                                                        \
    if (fc_e_ != cudaSuccess) return fc_cuda_error(fc_e_, #call, __FILE__, __LINE__);                                  \
  } while (0)

/* After every launch: configuration errors show up here, not in the launch statement. */
#define FC_LAUNCH_CHECK(kernel_name)                                                                                   \
  do {                                                                                                                 \
    cudaError_t fc_e_ = cudaGetLastError();                                                                            \
    if (fc_e_ != cudaSuccess) return fc_cuda_error(fc_e_, "launch of " kernel_name, __FILE__, __LINE__);               \
  } while (0)

#ifdef __cplusplus
extern "C" {
#endif

flashc_status fc_cuda_error(cudaError_t e, const char *what, const char *file, int line);

/* True when a CUDA device is present and the driver works; else why[len] says what is missing. */
bool fc_cuda_usable(char *why, size_t len);
/* Same, and the current device is at least compute capability `min_sm` (80 for sm_80). */
bool fc_cuda_usable_sm(int min_sm, char *why, size_t len);

/* Properties of the current device, cached per device. */
typedef struct fc_device_props {
  int device, sm, num_sms;
  size_t smem_per_block_optin, smem_per_sm;
  size_t free_mem, total_mem; /* at the time of the first query */
  /* The architecture of the image of this library's device code that the device runs (its PTX version): 90 where
   * the sm_90a image runs, 80 where the sm_80 image, or its PTX JIT-compiled (a GPU newer than the build), does. */
  int code_sm;
} fc_device_props;
flashc_status fc_device_get_props(fc_device_props *out);

/* flashc_forward_kvcache on the GPU (mma/decode.cu): the forward_kvcache of the cuda-mma and cuda-hopper tables. */
flashc_status fc_cuda_forward_kvcache(const struct fc_kv_problem *p);

#ifdef __cplusplus
}
#endif

static inline cudaStream_t fc_stream(const fc_problem *p) { return (cudaStream_t)p->stream; }

/* Kernels that only some images of the device code hold. The build makes one image per architecture of
 * FLASHC_CUDA_ARCHITECTURES (sm_80, whose SASS also runs on sm_86/89 and whose PTX newer GPUs JIT-compile; sm_90a);
 * a plan that never picks a kernel on the devices that run an image (fc_device_props.code_sm tells which image a
 * device runs) need not build it there. FC_KERNEL_IN_IMAGE(held), the first statement of such a kernel, with `held`
 * a constant expression of FC_CODE_SM (this pass's architecture, on code_sm's scale: 80, 90): where it is false the
 * kernel traps and the compiler drops the rest of its body, a fraction of the kernel's compile time. The plan asks
 * the same predicate with the device's code_sm, so no call reaches the trap. */
#ifdef __CUDA_ARCH__
#define FC_CODE_SM (__CUDA_ARCH__ / 10)
#define FC_KERNEL_IN_IMAGE(held)                                                                                       \
  if constexpr (!(held)) {                                                                                             \
    __trap();                                                                                                          \
    return;                                                                                                            \
  }
#else
#define FC_KERNEL_IN_IMAGE(held)
#endif

/* max(a, b), NaN when either is NaN. Softmax's running maximum must carry a NaN score into the row, not drop it
 * as fmaxf (IEEE maxNum) does, so that "max = −inf" means "no key seen" and nothing else, and a NaN row comes
 * out NaN. sm_80 has it as one instruction, max.NaN.f32, at the throughput of max.f32. */
static __device__ __forceinline__ float fc_fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

/* Ceiling division for grids. */
static inline int64_t fc_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif /* FLASHC_CUDA_COMMON_CUH */
