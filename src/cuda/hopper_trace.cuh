/* hopper_trace.cuh — a timeline of the persistent forward, for development only: compiled in with -DFC_HP_TRACE=1
 * (tools/hopper/trace.py builds such a library and reads it), nothing at all otherwise.
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
__device__ unsigned long long fc_hp_trace_buf[FC_HP_TRACE_CTAS * FC_HP_TRACE_SLOTS * FC_HP_TRACE_EVENTS];

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
#else
#define FC_HP_TRACE_BEGIN(slot, on) static_assert(true, "")
#define FC_HP_MARK(tag, payload)    static_assert(true, "")
#endif

#endif /* FLASHC_CUDA_HOPPER_TRACE_CUH */
