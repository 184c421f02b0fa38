/*
 * ring.h — ring attention inside the library: the ring object, the two transports (MPI for host memory,
 * NCCL for device memory), the memory operations each side provides, and the layout geometry.
 *
 * ring.c runs one algorithm for both sides. It never names MPI, NCCL or CUDA: it moves bytes through an
 * fc_ring_comm and touches buffers through an fc_ring_mem, so the host path (comm_mpi.c + mem_host.c) and
 * the device path (comm_nccl.c + mem_device.cu) cannot drift apart.
 */
#ifndef FLASHC_RING_H
#define FLASHC_RING_H

#include "../internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- transports ------------------------------------------------------------------------------------ */
/* Two exchanges can be in flight at once: K/V of the next step, and (backward) the dK/dV accumulators. */
enum { FC_RING_KV = 0, FC_RING_DKV = 1, FC_RING_CHANNELS = 2 };

/* One transport over a fixed group of `world` ranks. Every wait ends within timeout_ms of the last progress
 * (≤ 0: never times out) with FLASHC_ERR_COMMUNICATION. After any failure the transport is unusable. */
typedef struct fc_ring_comm fc_ring_comm;
struct fc_ring_comm {
  const char *name; /* "MPI", "NCCL" */
  int rank, world;
  int local_ranks; /* ranks on this node (MPI: its MPI_COMM_TYPE_SHARED split; 0 where unknown) */
  int64_t timeout_ms;
  /* Element-wise minimum and maximum over all ranks of n values. Collective. */
  flashc_status (*agree)(fc_ring_comm *c, const int64_t *mine, int64_t *lo, int64_t *hi, int n);
  /* Rank 0's n bytes to every rank. Collective. NULL where the transport has none (NCCL). */
  flashc_status (*broadcast)(fc_ring_comm *c, void *bytes, size_t n);
  /* This rank's index among the ranks of its node (for one GPU per rank). NULL for NCCL. */
  flashc_status (*local_rank)(fc_ring_comm *c, int *local);
  /* Send `bytes` of `send` to rank + 1 and receive as many into `recv` from rank − 1, on channel ch.
   * Device transports order the send after the work already queued on `stream` (it reads what that work
   * wrote). At most one exchange per channel is in flight. */
  flashc_status (*start)(fc_ring_comm *c, int ch, const void *send, void *recv, size_t bytes, void *stream);
  /* The exchange of channel ch is complete before later work on `stream` (host: returns when it is). */
  flashc_status (*wait)(fc_ring_comm *c, int ch, void *stream);
  /* One step of the ring was queued on `stream`: a progress mark for finish's timeout. NULL on the host. */
  flashc_status (*mark)(fc_ring_comm *c, void *stream);
  /* The call's queued work is complete (device: the host waits with the timeout). NULL on the host. */
  flashc_status (*finish)(fc_ring_comm *c, void *stream);
  /* Drop every exchange in flight after a failure, so no buffer is written later. */
  void (*abandon)(fc_ring_comm *c);
  void (*close)(fc_ring_comm *c);
};

/* Parts that exist only in some builds: cmake/ring.cmake compiles comm_mpi.c and defines FLASHC_RING_MPI
 * when MPI is found, and comm_nccl.c + mem_device.cu with FLASHC_RING_NCCL when CUDA and NCCL are. (Not weak
 * symbols: a static libflashc would silently drop the objects that only weak references point to.) */

/* comm_mpi.c (builds with MPI): a transport over a duplicate of *(MPI_Comm *)mpi_comm. Collective. */
flashc_status fc_ring_mpi_open(const void *mpi_comm, int64_t timeout_ms, fc_ring_comm **out);

/* comm_nccl.c (builds with CUDA and NCCL): */
/* A transport over the caller's ncclComm_t (not owned: close leaves it alive). */
flashc_status fc_ring_nccl_wrap(void *nccl_comm, int64_t timeout_ms, fc_ring_comm **out);
/* A new NCCL communicator over the ranks of an MPI transport, on CUDA device `device`. Collective. */
flashc_status fc_ring_nccl_bootstrap(fc_ring_comm *mpi, int device, fc_ring_comm **out);
/* The CUDA device of an NCCL transport. */
int fc_ring_nccl_device(const fc_ring_comm *c);
/* The device for one GPU per rank: local_rank % the number of devices. */
flashc_status fc_ring_cuda_pick_device(int local_rank, int *device);
/* Make `device` current, saving the previous one in *prev; and back. */
flashc_status fc_ring_cuda_enter(int device, int *prev);
void fc_ring_cuda_leave(int prev);

/* ---- memory operations ----------------------------------------------------------------------------- */
/* A [b, s, h, d] region of memory, d contiguous, strides in elements. */
typedef struct fc_tile {
  void *data;
  flashc_dtype dtype;
  int64_t stride_b, stride_s, stride_h;
} fc_tile;

typedef struct fc_shape {
  int64_t b, s, h, d;
} fc_shape;

/* What the algorithm does to buffers, on the host (mem_host.c) or on the device (mem_device.cu). Device
 * operations are queued on ctx->stream; host ones run on ctx->threads threads. */
typedef struct fc_ring_mem {
  flashc_status (*alloc)(size_t bytes, void **ptr);
  void (*release)(void *ptr);
  /* dst[0 .. n) = value */
  flashc_status (*fill)(const fc_problem *ctx, float *dst, int64_t n, float value);
  /* dst = src, converted to dst's dtype (rounding once). */
  flashc_status (*copy)(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst);
  /* dst += src, dst f32. */
  flashc_status (*add)(const fc_problem *ctx, fc_shape shape, fc_tile src, fc_tile dst);
  /* Merge a block's partial attention into the running one, row by row, in f32:
   *   o = o₁ − σ(lse₂ − lse₁)·(o₁ − o₂),   lse = max(lse₁, lse₂) + log1p(exp(−|lse₁ − lse₂|))
   * with (o₁, lse₁) = (acc_o, acc_lse) at rows row0 + s and (o₂, lse₂) = (part_o, part_lse) at rows s.
   * shape is the part's [b, s, heads_q, d]; lse arrays are [b, heads_q, len] with len part_len / acc_len.
   * A side whose lse is −inf saw no key and leaves the other unchanged. */
  flashc_status (*merge)(const fc_problem *ctx, fc_shape shape, fc_tile part_o, const float *part_lse, int64_t part_len,
                         fc_tile acc_o, float *acc_lse, int64_t acc_len, int64_t row0);
} fc_ring_mem;

extern const fc_ring_mem fc_ring_mem_host;   /* mem_host.c */
extern const fc_ring_mem fc_ring_mem_device; /* mem_device.cu (builds with NCCL) */

/* ---- layout geometry ------------------------------------------------------------------------------- */
/* A run of rows of a shard: local rows [row0, row0 + len) are global rows [global0, global0 + len). */
typedef struct fc_ring_seg {
  int64_t row0, len, global0;
} fc_ring_seg;

/* The runs of rank `rank`'s shard of `len` local rows: 1 (contiguous) or 2 (zigzag). Returns the count, or
 * 0 when the layout cannot split len (zigzag needs an even len) or is unknown. */
int fc_ring_segments(flashc_ring_layout layout, int world, int rank, int64_t len, fc_ring_seg seg[2]);

/* ---- the ring object ------------------------------------------------------------------------------- */
typedef enum fc_ring_fault_mode { FC_RING_FAULT_NONE = 0, FC_RING_FAULT_EXIT, FC_RING_FAULT_STALL } fc_ring_fault_mode;

/* Buffers of one side (host or device), carved from one allocation that only grows. */
typedef struct fc_ring_arena {
  void *base;
  size_t size;
} fc_ring_arena;

struct flashc_ring_s {
  int rank, world;
  int64_t timeout_ms;
  flashc_handle handle; /* backend, threads, stream: what a single-device call would use */
  fc_ring_comm *mpi;    /* host exchanges and control (NULL for a ring made from NCCL) */
  fc_ring_comm *nccl;   /* device exchanges (NULL until the first device call of an MPI ring) */
  int device;           /* the CUDA device of nccl */
  int native_partials;  /* 1: host partials in the input dtype, as on the device (tests) */
  fc_ring_arena host, dev;
  char broken[256]; /* "" while usable; else why the ring failed */
  struct {
    fc_ring_fault_mode mode;
    int rank, step;
  } fault; /* FLASHC_RING_FAULT, for tests of peer failure */
};

/* Tests: compute host partials in the input dtype (1), as the device path does, instead of f32 (0). */
flashc_status fc_ring_set_native_partials(flashc_ring ring, int native);

#ifdef __cplusplus
}
#endif
#endif /* FLASHC_RING_H */
