/* comm_nccl.c — the ring's device transport over NCCL point-to-point, on a stream of its own.
 *
 * Streams: the blocks are computed on the caller's stream (the handle's); every exchange runs on the
 * transport's communication stream, which first waits (event) for the work queued before it on the compute
 * stream — the send reads what that work wrote — and the compute stream waits (event) for an exchange only
 * where it reads the block received. So the K/V transfer of step t + 1 overlaps the compute of step t.
 *
 * Nothing on the host blocks while the ring is queued; at the end the host waits for the queued steps one
 * by one, polling the CUDA events and NCCL's asynchronous error, and gives up (ncclCommAbort) when a step
 * made no progress for timeout_ms. The communicator the ring creates itself (bootstrap) is non-blocking, so
 * that its creation can time out as well.
 *
 * libflashc does not link NCCL: the first NCCL ring loads it (dlopen, RTLD_LOCAL) and resolves the few
 * functions it calls. A process has one NCCL: the one already loaded is used when there is one (PyTorch's
 * bundled copy, say); linking the system's libnccl.so.2 instead made it load first and shadow torch's, which
 * then failed to import (undefined symbol). nccl.h gives only the types and the prototypes. */
#include "ring.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_AGREE = 64 };

/* ---- NCCL, loaded at run time ---------------------------------------------------------------------------- */
/* Every NCCL function the ring calls. The pointers take their types from nccl.h's prototypes (__typeof__, a
 * GNU C extension that gcc and clang accept in C11 mode), so a call is checked as if NCCL were linked. */
#define FC_NCCL_FUNCTIONS(X)                                                                                           \
  X(ncclGetErrorString)                                                                                                \
  X(ncclGetLastError)                                                                                                  \
  X(ncclGetUniqueId)                                                                                                   \
  X(ncclCommInitRankConfig)                                                                                            \
  X(ncclCommFinalize)                                                                                                  \
  X(ncclCommDestroy)                                                                                                   \
  X(ncclCommAbort)                                                                                                     \
  X(ncclCommGetAsyncError)                                                                                             \
  X(ncclCommCount)                                                                                                     \
  X(ncclCommUserRank)                                                                                                  \
  X(ncclCommCuDevice)                                                                                                  \
  X(ncclGroupStart)                                                                                                    \
  X(ncclGroupEnd)                                                                                                      \
  X(ncclSend)                                                                                                          \
  X(ncclRecv)                                                                                                          \
  X(ncclAllReduce)

#define FC_NCCL_POINTER(f) __typeof__(f) *f;
static struct { FC_NCCL_FUNCTIONS(FC_NCCL_POINTER) } nccl;
#undef FC_NCCL_POINTER

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;
static int nccl_loaded;
static char nccl_why[512]; /* why loading failed */

/* The library to load when the process has none: the soname, which the loader finds on its usual path;
 * then the one this build was configured with (FLASHC_NCCL_PATH, cmake/ring.cmake), often in the CUDA
 * toolkit's directory, which is not on that path. */
static void *open_nccl(void) {
  /* RTLD_NOLOAD: only if one is loaded already. It matches the soname, wherever that copy came from. */
  void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h) return h;
  h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  const char *first = dlerror();
  snprintf(nccl_why, sizeof nccl_why, "%s", first ? first : "libnccl.so.2: not found");
#ifdef FLASHC_NCCL_PATH
  h = dlopen(FLASHC_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  const char *second = dlerror();
  size_t n = strlen(nccl_why);
  snprintf(nccl_why + n, sizeof nccl_why - n, "; %s", second ? second : FLASHC_NCCL_PATH ": not found");
#endif
  return NULL;
}

/* Resolves every function of the table. dlsym returns void *: each pointer is stored through memcpy, as ISO C
 * has no cast from an object pointer to a function pointer. */
static void load_nccl(void) {
  void *h = open_nccl();
  if (!h) return;
#define FC_NCCL_RESOLVE(f)                                                                                             \
  {                                                                                                                    \
    void *sym = dlsym(h, #f);                                                                                          \
    if (!sym) {                                                                                                        \
      snprintf(nccl_why, sizeof nccl_why, "the loaded libnccl.so.2 has no %s (NCCL 2.14 or newer is needed)", #f);     \
      return;                                                                                                          \
    }                                                                                                                  \
    memcpy(&nccl.f, &sym, sizeof sym);                                                                                 \
  }
  FC_NCCL_FUNCTIONS(FC_NCCL_RESOLVE)
#undef FC_NCCL_RESOLVE
  nccl_loaded = 1; /* the handle stays open: the pointers live as long as the process */
}

/* Loads NCCL once per process; every later call gives the same answer. */
static flashc_status need_nccl(const char *op) {
  pthread_once(&nccl_once, load_nccl);
  if (nccl_loaded) return FLASHC_OK;
  return fc_error(FLASHC_ERR_UNSUPPORTED,
                  "%s: cannot load NCCL (%s); install NCCL 2.14 or newer (libnccl.so.2) "
                  "where the dynamic loader finds it, or set LD_LIBRARY_PATH to its directory",
                  op, nccl_why);
}

flashc_status fc_cuda_error(cudaError_t e, const char *what, const char *file, int line); /* common/runtime.cu */

#define CUDA_OK(call)                                                                                                  \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    if (e_ != cudaSuccess) return fc_cuda_error(e_, #call, __FILE__, __LINE__);                                        \
  } while (0)

typedef struct nccl_transport {
  fc_ring_comm base;
  ncclComm_t comm;
  int owned; /* created by the ring (bootstrap): destroyed with it; else the caller's */
  int dead;  /* aborted after a failure */
  int device;
  cudaStream_t stream;                /* communication */
  cudaEvent_t queued;                 /* the compute work an exchange waits for */
  cudaEvent_t done[FC_RING_CHANNELS]; /* each channel's last exchange */
  cudaEvent_t *marks;                 /* one per step of the call in flight */
  int n_marks, cap_marks;
  int64_t *agree_host, *agree_dev; /* pinned host and device buffers of the agreement */
} nccl_transport;

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void nap(long us) {
  struct timespec t = {0, us * 1000};
  nanosleep(&t, NULL);
}

static void abort_comm(nccl_transport *t) {
  if (t->dead) return;
  nccl.ncclCommAbort(t->comm); /* stops this rank's NCCL kernels, so the streams drain */
  t->dead = 1;
}

static flashc_status nccl_failure(nccl_transport *t, ncclResult_t r, const char *what) {
  const char *detail = t->comm ? nccl.ncclGetLastError(t->comm) : "";
  flashc_status s =
      fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: %s failed on rank %d of %d: %s%s%s", what, t->base.rank,
               t->base.world, nccl.ncclGetErrorString(r), detail && *detail ? ": " : "", detail ? detail : "");
  abort_comm(t);
  return s;
}

static flashc_status timed_out(nccl_transport *t, const char *what, int64_t waited) {
  int w = t->base.world, r = t->base.rank;
  abort_comm(t);
  return fc_error(FLASHC_ERR_COMMUNICATION,
                  "ring attention: %s on rank %d of %d made no progress for %lld ms (the ring's timeout): a peer "
                  "(rank %d or %d) died, stalled or never called; the NCCL communicator was aborted. Raise the "
                  "timeout with flashc_ring_set_timeout or FLASHC_RING_TIMEOUT_MS",
                  what, r, w, (long long)waited, (r + w - 1) % w, (r + 1) % w);
}

/* A non-blocking communicator's call may return ncclInProgress: poll its state until it settles. */
static flashc_status settle(nccl_transport *t, ncclResult_t r, const char *what) {
  int64_t start = now_ms();
  long sleep_us = 1;
  while (r == ncclInProgress) {
    if (nccl.ncclCommGetAsyncError(t->comm, &r) != ncclSuccess) break;
    if (r != ncclInProgress) break;
    if (t->base.timeout_ms > 0 && now_ms() - start >= t->base.timeout_ms) return timed_out(t, what, now_ms() - start);
    nap(sleep_us);
    if (sleep_us < 1000) sleep_us *= 2;
  }
  return r == ncclSuccess ? FLASHC_OK : nccl_failure(t, r, what);
}

/* Wait for an event, no longer than timeout_ms, watching NCCL's asynchronous errors. */
static flashc_status wait_event(nccl_transport *t, cudaEvent_t ev, const char *what) {
  int64_t start = now_ms();
  long sleep_us = 1;
  for (;;) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return FLASHC_OK;
    if (e != cudaErrorNotReady) return fc_cuda_error(e, what, __FILE__, __LINE__);
    ncclResult_t async = ncclSuccess;
    if (nccl.ncclCommGetAsyncError(t->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
      return nccl_failure(t, async, what);
    int64_t waited = now_ms() - start;
    if (t->base.timeout_ms > 0 && waited >= t->base.timeout_ms) return timed_out(t, what, waited);
    nap(sleep_us);
    if (sleep_us < 1000) sleep_us *= 2;
  }
}

static flashc_status dead_error(nccl_transport *t) {
  return fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: the NCCL communicator of rank %d was aborted",
                  t->base.rank);
}

static flashc_status nccl_agree(fc_ring_comm *c, const int64_t *mine, int64_t *lo, int64_t *hi, int n) {
  nccl_transport *t = (nccl_transport *)c;
  if (t->dead) return dead_error(t);
  if (n > MAX_AGREE) return fc_error(FLASHC_ERR_INTERNAL, "ring attention: %d values to agree on", n);
  /* min(x) and −min(−x) = max(x) in one reduction */
  for (int i = 0; i < n; i++) {
    t->agree_host[i] = mine[i];
    t->agree_host[n + i] = -mine[i];
  }
  size_t bytes = 2 * (size_t)n * sizeof(int64_t);
  CUDA_OK(cudaMemcpyAsync(t->agree_dev, t->agree_host, bytes, cudaMemcpyHostToDevice, t->stream));
  FC_CHECK(settle(t,
                  nccl.ncclAllReduce(t->agree_dev, t->agree_dev, 2 * (size_t)n, ncclInt64, ncclMin, t->comm, t->stream),
                  "the ranks' agreement on the call (ncclAllReduce)"));
  CUDA_OK(cudaMemcpyAsync(t->agree_host, t->agree_dev, bytes, cudaMemcpyDeviceToHost, t->stream));
  CUDA_OK(cudaEventRecord(t->done[0], t->stream));
  FC_CHECK(wait_event(t, t->done[0], "the ranks' agreement on the call (ncclAllReduce)"));
  for (int i = 0; i < n; i++) {
    lo[i] = t->agree_host[i];
    hi[i] = -t->agree_host[n + i];
  }
  return FLASHC_OK;
}

static flashc_status nccl_start(fc_ring_comm *c, int ch, const void *send, void *recv, size_t bytes, void *stream) {
  nccl_transport *t = (nccl_transport *)c;
  if (t->dead) return dead_error(t);
  /* The send reads what the compute stream wrote, and the receive overwrites what it read: wait for it. */
  CUDA_OK(cudaEventRecord(t->queued, (cudaStream_t)stream));
  CUDA_OK(cudaStreamWaitEvent(t->stream, t->queued, 0));
  int next = (c->rank + 1) % c->world, prev = (c->rank + c->world - 1) % c->world;
  ncclResult_t r = nccl.ncclGroupStart();
  if (r == ncclSuccess) r = nccl.ncclSend(send, bytes, ncclUint8, next, t->comm, t->stream);
  if (r == ncclSuccess || r == ncclInProgress) r = nccl.ncclRecv(recv, bytes, ncclUint8, prev, t->comm, t->stream);
  ncclResult_t end = nccl.ncclGroupEnd(); /* always: a group left open would swallow later calls */
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  FC_CHECK(settle(t, r, ch == FC_RING_KV ? "the exchange of K/V blocks" : "the exchange of dK/dV"));
  CUDA_OK(cudaEventRecord(t->done[ch], t->stream));
  return FLASHC_OK;
}

static flashc_status nccl_wait(fc_ring_comm *c, int ch, void *stream) {
  nccl_transport *t = (nccl_transport *)c;
  CUDA_OK(cudaStreamWaitEvent((cudaStream_t)stream, t->done[ch], 0));
  return FLASHC_OK;
}

static flashc_status nccl_mark(fc_ring_comm *c, void *stream) {
  nccl_transport *t = (nccl_transport *)c;
  if (t->n_marks == t->cap_marks) {
    int cap = t->cap_marks ? 2 * t->cap_marks : 16;
    cudaEvent_t *more = realloc(t->marks, sizeof(cudaEvent_t) * (size_t)cap);
    if (!more) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "ring attention: %d events", cap);
    t->marks = more;
    for (int i = t->cap_marks; i < cap; i++) {
      cudaError_t e = cudaEventCreateWithFlags(&t->marks[i], cudaEventDisableTiming);
      if (e != cudaSuccess) {
        t->cap_marks = i;
        return fc_cuda_error(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
      }
    }
    t->cap_marks = cap;
  }
  CUDA_OK(cudaEventRecord(t->marks[t->n_marks++], (cudaStream_t)stream));
  return FLASHC_OK;
}

/* The host waits for the queued steps in order; each may take up to timeout_ms after the one before. */
static flashc_status nccl_finish(fc_ring_comm *c, void *stream) {
  nccl_transport *t = (nccl_transport *)c;
  FC_CHECK(nccl_mark(c, stream)); /* the work queued after the last step: storing the outputs */
  int n = t->n_marks;
  t->n_marks = 0;
  for (int i = 0; i < n; i++) FC_CHECK(wait_event(t, t->marks[i], "a step of the ring (NCCL)"));
  return FLASHC_OK;
}

static void nccl_abandon(fc_ring_comm *c) {
  nccl_transport *t = (nccl_transport *)c;
  t->n_marks = 0;
  abort_comm(t); /* queued exchanges would otherwise wait forever for peers that left */
}

static void release(nccl_transport *t) {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(t->device);
  if (t->stream) {
    if (!t->dead) cudaStreamSynchronize(t->stream);
    cudaStreamDestroy(t->stream);
  }
  if (t->owned && !t->dead && t->comm) {
    /* Finalize flushes what is queued (a non-blocking communicator reports it as in progress), then the
     * communicator is freed; a finalize that does not settle in time ends in an abort instead. */
    if (settle(t, nccl.ncclCommFinalize(t->comm), "ncclCommFinalize") == FLASHC_OK) nccl.ncclCommDestroy(t->comm);
    fc_clear_error();
  }
  if (t->queued) cudaEventDestroy(t->queued);
  for (int ch = 0; ch < FC_RING_CHANNELS; ch++)
    if (t->done[ch]) cudaEventDestroy(t->done[ch]);
  for (int i = 0; i < t->cap_marks; i++) cudaEventDestroy(t->marks[i]);
  free(t->marks);
  if (t->agree_host) cudaFreeHost(t->agree_host);
  if (t->agree_dev) cudaFree(t->agree_dev);
  cudaGetLastError(); /* teardown errors are not the next call's */
  if (prev >= 0) cudaSetDevice(prev);
  free(t);
}

static void nccl_close(fc_ring_comm *c) { release((nccl_transport *)c); }

/* The stream, events and agreement buffers of a transport over t->comm, on t->device (current). */
static flashc_status setup(nccl_transport *t) {
  t->base.name = "NCCL";
  t->base.agree = nccl_agree;
  t->base.start = nccl_start;
  t->base.wait = nccl_wait;
  t->base.mark = nccl_mark;
  t->base.finish = nccl_finish;
  t->base.abandon = nccl_abandon;
  t->base.close = nccl_close;
  CUDA_OK(cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking));
  CUDA_OK(cudaEventCreateWithFlags(&t->queued, cudaEventDisableTiming));
  for (int ch = 0; ch < FC_RING_CHANNELS; ch++) CUDA_OK(cudaEventCreateWithFlags(&t->done[ch], cudaEventDisableTiming));
  CUDA_OK(cudaMallocHost((void **)&t->agree_host, 2 * MAX_AGREE * sizeof(int64_t)));
  CUDA_OK(cudaMalloc((void **)&t->agree_dev, 2 * MAX_AGREE * sizeof(int64_t)));
  return FLASHC_OK;
}

flashc_status fc_ring_nccl_wrap(void *nccl_comm, int64_t timeout_ms, fc_ring_comm **out) {
  const char *op = "flashc_ring_create_nccl";
  FC_CHECK(need_nccl(op));
  nccl_transport *t = calloc(1, sizeof *t);
  if (!t) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "%s: %zu bytes", op, sizeof *t);
  t->comm = (ncclComm_t)nccl_comm;
  t->base.timeout_ms = timeout_ms;
  ncclResult_t r = nccl.ncclCommCount(t->comm, &t->base.world);
  if (r == ncclSuccess) r = nccl.ncclCommUserRank(t->comm, &t->base.rank);
  if (r == ncclSuccess) r = nccl.ncclCommCuDevice(t->comm, &t->device);
  if (r != ncclSuccess) {
    flashc_status s = fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: nccl_comm is not a usable ncclComm_t: %s", op,
                               nccl.ncclGetErrorString(r));
    free(t);
    return s;
  }
  int prev;
  flashc_status s = fc_ring_cuda_enter(t->device, &prev);
  if (s == FLASHC_OK) {
    s = setup(t);
    fc_ring_cuda_leave(prev);
  }
  if (s != FLASHC_OK) {
    t->dead = 1; /* the caller's communicator is left alone */
    release(t);
    return s;
  }
  *out = &t->base;
  return FLASHC_OK;
}

flashc_status fc_ring_nccl_bootstrap(fc_ring_comm *mpi, int device, fc_ring_comm **out) {
  nccl_transport *t = calloc(1, sizeof *t);
  if (!t) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "ring attention: %zu bytes", sizeof *t);
  t->device = device;
  t->owned = 1;
  t->dead = 1; /* until the communicator exists */
  t->base.rank = mpi->rank;
  t->base.world = mpi->world;
  t->base.timeout_ms = mpi->timeout_ms;
  /* Rank 0 makes the unique id (or fails, and says so to everyone: no rank may wait for it then). */
  struct {
    int32_t status;
    ncclUniqueId id;
  } msg;
  enum { NO_NCCL = -1 }; /* rank 0 could not load NCCL */
  memset(&msg, 0, sizeof msg);
  flashc_status loaded = need_nccl("ring attention");
  if (mpi->rank == 0) msg.status = loaded == FLASHC_OK ? (int32_t)nccl.ncclGetUniqueId(&msg.id) : NO_NCCL;
  flashc_status s = mpi->broadcast(mpi, &msg, sizeof msg);
  if (s == FLASHC_OK && loaded != FLASHC_OK)
    s = need_nccl("ring attention"); /* its message again: the broadcast came after it */
  else if (s == FLASHC_OK && msg.status == NO_NCCL)
    s = fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: rank 0 could not load NCCL (see its message)");
  else if (s == FLASHC_OK && msg.status != ncclSuccess)
    s = fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: ncclGetUniqueId failed on rank 0: %s",
                 nccl.ncclGetErrorString((ncclResult_t)msg.status));
  if (s == FLASHC_OK) {
    /* Non-blocking, so that a rank that never joins makes the others time out instead of hang. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = nccl.ncclCommInitRankConfig(&t->comm, mpi->world, msg.id, mpi->rank, &config);
    if (r == ncclSuccess || r == ncclInProgress) {
      t->dead = 0;
      s = settle(t, r, "ncclCommInitRankConfig (the ring's NCCL communicator)");
    } else {
      s = fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: ncclCommInitRankConfig failed on rank %d: %s", mpi->rank,
                   nccl.ncclGetErrorString(r));
    }
  }
  if (s == FLASHC_OK) s = setup(t);
  if (s != FLASHC_OK) {
    abort_comm(t);
    release(t);
    return s;
  }
  *out = &t->base;
  return FLASHC_OK;
}

int fc_ring_nccl_device(const fc_ring_comm *c) { return ((const nccl_transport *)c)->device; }

flashc_status fc_ring_cuda_pick_device(int local_rank, int *device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    cudaGetLastError();
    return fc_error(FLASHC_ERR_UNSUPPORTED, "ring attention: no CUDA device (%s)",
                    e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  }
  *device = local_rank % n;
  return FLASHC_OK;
}

flashc_status fc_ring_cuda_enter(int device, int *prev) {
  *prev = -1;
  CUDA_OK(cudaGetDevice(prev));
  if (*prev != device) CUDA_OK(cudaSetDevice(device));
  return FLASHC_OK;
}

void fc_ring_cuda_leave(int prev) {
  if (prev >= 0) cudaSetDevice(prev);
}
