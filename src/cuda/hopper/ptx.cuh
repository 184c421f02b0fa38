/* hopper/ptx.cuh — the sm_90a instructions of cuda-hopper other than wgmma.mma_async itself: mbarriers, the
 * bulk tensor copy (TMA), wgmma fences and groups, shared-memory matrix descriptors, setmaxnreg, named
 * barriers. One small inline function each, operating on 32-bit shared-memory addresses.
 *
 * Everything here is compiled only in the sm_90a device pass (FC_HOPPER_ARCH = 1): the library is also built
 * for sm_80, where none of these instructions exist, and there the kernels that would use them have empty
 * bodies (the host never launches them: see hopper_usable). The bulk-group section at the end needs only
 * sm_90 (FC_BULK_ARCH = 1): cuda-mma's backward uses it too. */
#ifndef FLASHC_CUDA_HOPPER_PTX_CUH
#define FLASHC_CUDA_HOPPER_PTX_CUH

#include <cuda.h> /* CUtensorMap (a type only: no driver call is linked) */
#include <stdint.h>

/* __CUDA_ARCH_FEAT_SM90_ALL: nvcc's mark of the architecture-specific target sm_90a (wgmma and setmaxnreg
 * exist only there; plain sm_90 has TMA and mbarriers but not these). */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FC_HOPPER_ARCH 1
#else
#define FC_HOPPER_ARCH 0
#endif

#if FC_HOPPER_ARCH

/* ---- mbarrier ------------------------------------------------------------------------------------------ */
/* A barrier in shared memory (8 bytes, 8-byte aligned) whose phase completes when `count` arrivals have
 * been made and every byte announced by arrive.expect_tx has landed. Phases alternate parity 0, 1, 0 ... */
static __device__ __forceinline__ void fc_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Makes the initialisations visible to the other threads and to the async proxy (the copy engine), before the
 * CTA barrier that follows. */
static __device__ __forceinline__ void fc_mbar_fence_init(void) {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/* One arrival that also announces `bytes` more bytes to come from the copy engine in this phase. */
static __device__ __forceinline__ void fc_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* One arrival from this thread when `pred` holds. Predicated inside the asm, not branched around: a branch
 * between a wgmma and its wait makes ptxas serialise the wgmma pipeline (C7513). */
static __device__ __forceinline__ void fc_mbar_arrive_if(uint32_t bar, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(bar),
               "r"((int)pred)
               : "memory");
}
/* Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and the phase
 * "before" it (parity 1) counts as completed. try_wait suspends the thread for a while before it says no.
 * The retry loop lives inside the asm statement: written as a C loop, it lets the compiler move register
 * work across it, and ptxas then serialises the wgmma pipeline around it (C7513). */
static __device__ __forceinline__ void fc_mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nFC_MBAR_WAIT_%=:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra FC_MBAR_WAIT_%=;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}

/* ---- TMA: cp.async.bulk.tensor ------------------------------------------------------------------------- */
static __device__ __forceinline__ void fc_tma_prefetch_map(const CUtensorMap *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}
/* Before the first copy through a tensor map in global memory (hopper/tma.cuh, fc_hp_seq_maps): its bytes were
 * written through the generic proxy (a copy from the host before the launch), the copy engine reads them through the
 * tensormap proxy, which may still hold the map that an earlier call left at that address; the acquire makes this
 * call's bytes the ones it reads (CUDA C++ Programming Guide, tensor maps in global memory). */
static __device__ __forceinline__ void fc_tma_acquire_map(const CUtensorMap *map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"((uint64_t)map) : "memory");
}
/* Copies the box of the 4-d tensor `map` whose first element has coordinates (c0, c1, c2, c3) (innermost
 * first) into shared memory at dst, laid out as the map says (here: rows of 128 bytes, 128-byte swizzle);
 * elements outside the tensor land as zeros. Completion: the box's bytes count against `bar`'s expected
 * transaction bytes. */
static __device__ __forceinline__ void fc_tma_load_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                      int c3, uint32_t bar) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
               "%5}], [%6];\n" ::"r"(dst),
               "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
               : "memory");
}

/* ---- wgmma: fences, groups, descriptors ---------------------------------------------------------------- */
/* Orders this thread's earlier register accesses (accumulators, A fragments) before the wgmma.mma_async that
 * follow. Needed before the first wgmma and whenever those registers were touched by other instructions. */
static __device__ __forceinline__ void fc_wgmma_fence(void) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
/* Closes the wgmma.mma_async issued since the last commit into one group. */
static __device__ __forceinline__ void fc_wgmma_commit(void) {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/* Waits until at most N committed groups are pending. */
template <int N> static __device__ __forceinline__ void fc_wgmma_wait(void) {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* The compiler sees a wgmma's accumulators as written when the asm statement runs, not when the group
 * completes: passing each one through an empty volatile asm after the wait (and before the next fence) keeps
 * every use of them on the right side of the wait. */
template <int N> static __device__ __forceinline__ void fc_fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> static __device__ __forceinline__ void fc_fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int x = 0; x < 4; x++) asm volatile("" : "+r"(r[i][x])::"memory");
}

/* Shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), 128-byte swizzle:
 *   bits  0–13 start address >> 4     bits 16–29 leading-dimension byte offset >> 4
 *   bits 32–45 stride-dimension byte offset >> 4     bits 49–51 base offset (0: the swizzle pattern repeats
 *   from 1024-byte boundaries, which all our tiles start on)     bits 62–63 swizzle mode (1 = 128 bytes).
 * K-major operand (Q_i, K_j): rows of 128 bytes (64 elements of the head dim), 8-row groups 1024 bytes apart
 * (stride offset); the leading offset is unused with swizzling. MN-major operand (V_j): the 8-row groups of
 * the k dimension are 1024 bytes apart (stride offset) and the leading offset jumps between 64-column
 * blocks of the n dimension.
 * The operand at `base` + `off`: a tile at `base` (16-byte aligned) and a compile-time offset `off` into it (a
 * k-step, a 64-column half), written so that the descriptor of `base` is computed once per tile and each k-step
 * adds off / 16 to its low word: one uniform add per descriptor instead of five (add, mask, shift, or, move),
 * which ptxas cannot derive itself (it does not know that base is aligned, nor that base + off < 2^18). Both hold
 * for every tile here: shared addresses stay below 228 KB, so the start-address field never carries into the
 * leading offset. Before this helper (e83bcb3), ~20 % of the forward's executed instructions were this arithmetic. */
static __device__ __forceinline__ uint64_t fc_wgmma_desc_off(uint32_t base, uint32_t off, uint32_t leading_bytes,
                                                             uint32_t stride_bytes) {
  const uint32_t lo = (((base & 0x3FFFF) >> 4) | ((leading_bytes & 0x3FFFF) >> 4) << 16) + (off >> 4);
  const uint32_t hi = ((stride_bytes & 0x3FFFF) >> 4) | 1u << 30;
  return (uint64_t)hi << 32 | lo;
}

/* ---- registers and barriers ---------------------------------------------------------------------------- */
/* Hands registers back to (dec) or takes them from (inc) the CTA's pool; every thread of the warpgroup runs it. */
template <int N> static __device__ __forceinline__ void fc_setmaxnreg_dec(void) {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> static __device__ __forceinline__ void fc_setmaxnreg_inc(void) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
/* A barrier among `threads` threads only (a warpgroup), on hardware barrier `id` (0 is __syncthreads'). */
static __device__ __forceinline__ void fc_named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* Counts this thread's warp towards barrier `id` of `threads` without waiting, when `pred` holds (predicated
 * inside the asm: no branch near the wgmma pipeline). */
static __device__ __forceinline__ void fc_named_barrier_arrive_if(int id, int threads, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id), "r"(threads),
               "r"((int)pred)
               : "memory");
}
/* Ends ptxas's basic block here: a branch (taken when `taken` holds) over a nanosleep, which ptxas can neither
 * remove nor see through when `taken` comes from a kernel argument. ptxas schedules a wgmma.wait_group near the
 * top of its basic block, ahead of independent work that the source put before it (docs/hopper.md); a boundary
 * just before the wait keeps that work beside the wgmma in flight. The nanosleep (never run when `taken` holds)
 * is harmless either way. */
static __device__ __forceinline__ void fc_block_boundary(bool taken) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %0, 0;\n@p bra.uni FC_BLOCK_BOUNDARY_%=;\nnanosleep.u32 0;\n"
               "FC_BLOCK_BOUNDARY_%=:\n}\n" ::"r"((int)taken)
               : "memory");
}
/* A flag between CTAs. The post releases this thread's earlier writes (and, after a barrier, those the barrier
 * ordered before it) at GPU scope; the wait spins with acquire loads until the flag reads `want`, sleeping
 * `sleep_ns` between reads, all inside one asm statement (the compiler cannot hoist or split the loop). Used by
 * the persistent forward's split rounds and the backward's deterministic dQ tickets. */
static __device__ __forceinline__ void fc_flag_post(int32_t *flag, int32_t v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(v) : "memory");
}
static __device__ __forceinline__ void fc_flag_wait(const int32_t *flag, int32_t want, uint32_t sleep_ns) {
  asm volatile("{\n.reg .pred p;\n.reg .b32 v;\nFC_FLAG_WAIT_%=:\nld.acquire.gpu.global.b32 v, [%0];\n"
               "setp.ne.s32 p, v, %1;\n@p nanosleep.u32 %2;\n@p bra FC_FLAG_WAIT_%=;\n}\n" ::"l"(flag),
               "r"(want), "r"(sleep_ns)
               : "memory");
}
static __device__ __forceinline__ void fc_st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
static __device__ __forceinline__ uint4 fc_ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
/* stmatrix.x4 (sm_90): four 8 × 8 matrices of 16-bit values from the mma/wgmma fragment layout (register i of
 * lane 4g + t: row g, columns 2t, 2t + 1 of matrix i) into shared memory; lane l gives the address of row l % 8 of
 * matrix l / 8 (16 bytes each). One instruction where 32-bit stores take four. */
static __device__ __forceinline__ void fc_stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
/* One 16-byte store to global memory (`to` 16-byte aligned). In asm because NVVM split the C form `*(uint4 *)to = v`
 * inside the backward's epilogue into four 4-byte stores (ncu, 2026-11-24: 4x the L2 sectors of dK/dV). */
static __device__ __forceinline__ void fc_st_global_v4(void *to, uint4 v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(to), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

/* ---- TMA store: cp.async.bulk.tensor, shared → global (the persistent variant's epilogue) ------------------ */
/* Copies the box at smem `src` (laid out as the map says) into the 4-d tensor `map` at coordinates (c0 .. c3);
 * elements outside the tensor are not written (the clipping that keeps rows past the sequence untouched). The
 * copy joins this thread's current bulk async-group. The source must have been written through the generic
 * proxy before a fence.proxy.async by each writer and a barrier that orders them before this thread. */
static __device__ __forceinline__ void fc_tma_store_4d(const CUtensorMap *map, uint32_t src, int c0, int c1, int c2,
                                                       int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"((uint64_t)map),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
#endif /* FC_HOPPER_ARCH */

/* ---- bulk groups and the async proxy: plain sm_90 (no "a" features), also used by cuda-mma's backward ---------- */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FC_BULK_ARCH 1
#else
#define FC_BULK_ARCH 0
#endif

#if FC_BULK_ARCH
/* Orders this thread's generic-proxy shared-memory accesses against the async proxy (TMA, wgmma, bulk copies). */
static __device__ __forceinline__ void fc_fence_proxy_async(void) {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Two neighbouring floats (8-byte aligned) into shared memory: the staging of a bulk add's source. */
static __device__ __forceinline__ void fc_st_shared_f32x2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
/* Adds `bytes` (a multiple of 16, both addresses 16-byte aligned) of fp32 from shared memory into global memory
 * through the copy engine, element by element (atomically per element, in no set order); completes with the
 * bulk group that fc_bulk_commit closes. */
static __device__ __forceinline__ void fc_bulk_reduce_add_f32(float *dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"((uint64_t)dst),
               "r"(src), "r"(bytes)
               : "memory");
}
/* Closes this thread's bulk copies issued since the last commit into one bulk async-group. */
static __device__ __forceinline__ void fc_bulk_commit(void) {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/* Waits until at most N of this thread's bulk groups still read their shared-memory source (after which the
 * source may be overwritten; their global writes may still be on the way). */
template <int N> static __device__ __forceinline__ void fc_bulk_wait_read(void) {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/* fc_bulk_wait_read<0> in thread tid = 0 only (the one that issues), predicated rather than branched around, so
 * that no branch splits the caller's basic block (cuda-mma's backward: fewer spills at 255 registers). */
static __device__ __forceinline__ void fc_bulk_wait_read0_in_thread0(uint32_t tid) {
  asm volatile("{\n.reg .pred p0;\nsetp.eq.u32 p0, %0, 0;\n@p0 cp.async.bulk.wait_group.read 0;\n}\n" ::"r"(tid)
               : "memory");
}
/* Waits until at most N of this thread's bulk groups are pending at all (their writes are done). */
template <int N> static __device__ __forceinline__ void fc_bulk_wait(void) {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif /* FC_BULK_ARCH */
#endif /* FLASHC_CUDA_HOPPER_PTX_CUH */
