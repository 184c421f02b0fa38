/* hopper/trace.cuh — a timeline of the persistent forward (and of the backward's version-2 kernels), for development
 * only: compiled in with -DFC_HP_TRACE=1 (tools/hopper/trace.py and trace_bwd.py read such a library), nothing at all
 * otherwise.
 *
 * One thread per role records events: the producer's thread (slot 0) and thread 0 of each consumer warpgroup (slot
 * 1 + c). An event is one 64-bit word in fc_hp_trace_buf[CTA][slot][k]: the tag (8 bits), a payload (16 bits) and
 * the SM's clock (clock64, low 40 bits), written where the code passes a mark, so that a reader can see how long a
 * warpgroup waited for what (a turn, a stage, Q, its own wgmma) and where a tile boundary spends its time. Tags are
 * listed in tools/hopper/trace.py; 0 is an empty word. The marks cost a global store each: a traced run is a few
 * per cent slower than the real one, and the reader compares shapes of the timeline, not absolute speed. */
#ifndef FLASHC_CUDA_HOPPER_TRACE_CUH
#define FLASHC_CUDA_HOPPER_TRACE_CUH

#ifndef FC_HP_TRACE
#define FC_HP_TRACE 0
#endif

enum { FC_HP_TRACE_CTAS = 132, FC_HP_TRACE_SLOTS = 4, FC_HP_TRACE_EVENTS = 6144 };

#if FC_HP_TRACE
/* static: each traced translation unit (hopper/fwd.cu, hopper/bwd.cu) has its own, read through its own functions */
static __device__ unsigned long long fc_hp_trace_buf[FC_HP_TRACE_CTAS * FC_HP_TRACE_SLOTS * FC_HP_TRACE_EVENTS];

/* An event at a fixed index: for code that knows where it is (the backward: block `it`, mark k at it·16 + k)
 * without a counter carried through its functions. */
static __device__ __forceinline__ void fc_hp_mark_at(int slot, uint32_t idx, uint32_t tag, uint32_t payload) {
  if (blockIdx.x < FC_HP_TRACE_CTAS && idx < FC_HP_TRACE_EVENTS)
    fc_hp_trace_buf[((size_t)blockIdx.x * FC_HP_TRACE_SLOTS + slot) * FC_HP_TRACE_EVENTS + idx] =
        ((unsigned long long)tag << 56) | ((unsigned long long)(payload & 0xffffu) << 40) |
        ((unsigned long long)clock64() & 0xffffffffffull);
}

/* Declares this thread's recorder: slot `slot` of its CTA, recording only when `on` (and within the first CTAs). */
#define FC_HP_TRACE_BEGIN(slot, on)                                                                                    \
  unsigned long long *fc_tr_p =                                                                                        \
      fc_hp_trace_buf + ((size_t)blockIdx.x * FC_HP_TRACE_SLOTS + (slot)) * FC_HP_TRACE_EVENTS;                        \
  uint32_t fc_tr_n = 0;                                                                                                \
  const bool fc_tr_on = (on) && blockIdx.x < FC_HP_TRACE_CTAS
#define FC_HP_MARK(tag, payload)                                                                                       \
  do {                                                                                                                 \
    if (fc_tr_on && fc_tr_n < FC_HP_TRACE_EVENTS)                                                                      \
      fc_tr_p[fc_tr_n++] = ((unsigned long long)(tag) << 56) |                                                         \
                           ((unsigned long long)((uint32_t)(payload)&0xffffu) << 40) |                                 \
                           ((unsigned long long)clock64() & 0xffffffffffull);                                          \
  } while (0)
/* The trace build's readers, PREFIX_trace_reset and PREFIX_trace_read (for tools/hopper/trace*.py, through ctypes;
 * one pair per traced translation unit): zero this unit's timeline before a call, copy it out after (bytes ≤ sizeof
 * fc_hp_trace_buf). 0 on success, the CUDA error otherwise. */
#define FC_HP_TRACE_READERS(prefix)                                                                                    \
  extern "C" __attribute__((visibility("default"))) int prefix##_trace_reset(void) {                                   \
    void *at = NULL;                                                                                                   \
    cudaError_t e = cudaGetSymbolAddress(&at, fc_hp_trace_buf);                                                        \
    if (e == cudaSuccess) e = cudaMemset(at, 0, sizeof fc_hp_trace_buf);                                               \
    return (int)e;                                                                                                     \
  }                                                                                                                    \
  extern "C" __attribute__((visibility("default"))) int prefix##_trace_read(void *to, size_t bytes) {                  \
    if (bytes > sizeof fc_hp_trace_buf) bytes = sizeof fc_hp_trace_buf;                                                \
    return (int)cudaMemcpyFromSymbol(to, fc_hp_trace_buf, bytes);                                                      \
  }
#else
#define FC_HP_TRACE_BEGIN(slot, on) static_assert(true, "")
#define FC_HP_MARK(tag, payload)    static_assert(true, "")
#endif

#endif /* FLASHC_CUDA_HOPPER_TRACE_CUH */
