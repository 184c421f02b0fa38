/* create.c — the ring object's life: creation from MPI or NCCL, the settings, destruction. */
#include "ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEFAULT_TIMEOUT_MS = 300000 };

/* FLASHC_RING_TIMEOUT_MS, when set to a number ≥ 0. */
static int64_t timeout_from_env(void) {
  const char *s = getenv("FLASHC_RING_TIMEOUT_MS");
  if (!s || !*s) return DEFAULT_TIMEOUT_MS;
  char *end;
  long long v = strtoll(s, &end, 10);
  return (*end == '\0' && v >= 0) ? (int64_t)v : DEFAULT_TIMEOUT_MS;
}

/* FLASHC_RING_FAULT=exit:RANK:STEP or stall:RANK:STEP — for tests of a peer that dies or stalls: that rank
 * calls _exit, or sleeps 3 timeouts, at the start of step STEP of every ring call. */
static void fault_from_env(flashc_ring r) {
  const char *s = getenv("FLASHC_RING_FAULT");
  if (!s) return;
  char mode[16];
  int rank, step;
  if (sscanf(s, "%15[a-z]:%d:%d", mode, &rank, &step) != 3) return;
  if (strcmp(mode, "exit") == 0) r->fault.mode = FC_RING_FAULT_EXIT;
  if (strcmp(mode, "stall") == 0) r->fault.mode = FC_RING_FAULT_STALL;
  r->fault.rank = rank;
  r->fault.step = step;
}

/* The parts every ring has: the handle and the settings. */
static flashc_status ring_new(const char *op, flashc_ring *out, const char *backend) {
  if (!out) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: ring is NULL", op);
  *out = NULL;
  flashc_ring r = calloc(1, sizeof *r);
  if (!r) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "%s: %zu bytes", op, sizeof *r);
  flashc_status s = flashc_create(&r->handle, backend);
  if (s != FLASHC_OK) {
    free(r);
    return s;
  }
  r->timeout_ms = timeout_from_env();
  r->device = -1;
  fault_from_env(r);
  *out = r;
  return FLASHC_OK;
}

flashc_status flashc_ring_create_mpi(flashc_ring *ring, const void *mpi_comm, const char *backend) {
  const char *op = "flashc_ring_create_mpi";
  if (ring) *ring = NULL;
  if (!mpi_comm) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: mpi_comm is NULL; pass &comm", op);
#ifdef FLASHC_RING_MPI
  flashc_ring r;
  FC_CHECK(ring_new(op, &r, backend));
  flashc_status s = fc_ring_mpi_open(mpi_comm, r->timeout_ms, &r->mpi);
  if (s != FLASHC_OK) {
    flashc_ring_destroy(r);
    return s;
  }
  r->rank = r->mpi->rank;
  r->world = r->mpi->world;
  *ring = r;
  return FLASHC_OK;
#else
  (void)backend;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: this libflashc was built without MPI", op);
#endif
}

flashc_status flashc_ring_create_nccl(flashc_ring *ring, void *nccl_comm, const char *backend) {
  const char *op = "flashc_ring_create_nccl";
  if (ring) *ring = NULL;
  if (!nccl_comm) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: nccl_comm is NULL", op);
#ifdef FLASHC_RING_NCCL
  flashc_ring r;
  FC_CHECK(ring_new(op, &r, backend));
  flashc_status s = fc_ring_nccl_wrap(nccl_comm, r->timeout_ms, &r->nccl);
  if (s != FLASHC_OK) {
    flashc_ring_destroy(r);
    return s;
  }
  r->rank = r->nccl->rank;
  r->world = r->nccl->world;
  r->device = fc_ring_nccl_device(r->nccl);
  *ring = r;
  return FLASHC_OK;
#else
  (void)backend;
  return fc_error(FLASHC_ERR_UNSUPPORTED, "%s: this libflashc was built without NCCL", op);
#endif
}

flashc_status flashc_ring_destroy(flashc_ring r) {
  if (!r) return FLASHC_OK;
  if (r->nccl) r->nccl->close(r->nccl); /* first: it may wait for device work that reads the arenas */
  if (r->mpi) r->mpi->close(r->mpi);
  /* After a failure MPI may still own a cancelled receive into the host arena (a cancel completes when MPI
   * says so, and the ring no longer waits for that): the arena is then left to the process, not freed. */
  if (r->host.base && !r->broken[0]) fc_ring_mem_host.release(r->host.base);
#ifdef FLASHC_RING_NCCL
  if (r->dev.base) {
    int prev;
    if (fc_ring_cuda_enter(r->device, &prev) == FLASHC_OK) {
      fc_ring_mem_device.release(r->dev.base);
      fc_ring_cuda_leave(prev);
    }
  }
#endif
  flashc_destroy(r->handle);
  free(r);
  return FLASHC_OK;
}

flashc_status flashc_ring_info(flashc_ring r, int *rank, int *world) {
  if (!r) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_ring_info: ring is NULL");
  if (rank) *rank = r->rank;
  if (world) *world = r->world;
  return FLASHC_OK;
}

int flashc_ring_device(flashc_ring r) {
  if (!r) return -1;
#ifdef FLASHC_RING_NCCL
  if (r->device < 0 && r->mpi) {
    int local, device;
    if (r->mpi->local_rank(r->mpi, &local) == FLASHC_OK && fc_ring_cuda_pick_device(local, &device) == FLASHC_OK)
      r->device = device;
    fc_clear_error(); /* no device is an answer (−1), not a failure */
  }
#endif
  return r->device;
}

flashc_handle flashc_ring_handle(flashc_ring r) { return r ? r->handle : NULL; }

flashc_status flashc_ring_set_timeout(flashc_ring r, int64_t timeout_ms) {
  if (!r) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_ring_set_timeout: ring is NULL");
  if (timeout_ms < 0)
    return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "flashc_ring_set_timeout: timeout_ms is %lld; use 0 (never) or more",
                    (long long)timeout_ms);
  r->timeout_ms = timeout_ms;
  if (r->mpi) r->mpi->timeout_ms = timeout_ms;
  if (r->nccl) r->nccl->timeout_ms = timeout_ms;
  return FLASHC_OK;
}

flashc_status fc_ring_set_native_partials(flashc_ring r, int native) {
  if (!r) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "fc_ring_set_native_partials: ring is NULL");
  r->native_partials = native != 0;
  return FLASHC_OK;
}
