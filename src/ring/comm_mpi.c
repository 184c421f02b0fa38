/* comm_mpi.c — the ring's host transport over MPI point-to-point, with a deadline on every wait.
 *
 * The ring works on its own duplicate of the caller's communicator, with MPI_ERRORS_RETURN so that a failure
 * becomes a status rather than the end of the process. Nothing blocks inside MPI: every operation is
 * non-blocking and polled with MPI_Test until it completes, fails, or makes no progress for timeout_ms. */
#include "ring.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TAG_BASE = 0x7a10 }; /* + channel */
enum { MAX_AGREE = 64 };
/* MPI counts are int: larger messages go as several of at most 1 GiB, matched in order (MPI does not let
 * messages of one sender, tag and communicator overtake each other). */
#define MAX_MESSAGE ((size_t)1 << 30)

typedef struct mpi_transport {
  fc_ring_comm base;
  MPI_Comm comm;
  int local_rank;
  MPI_Request *req[FC_RING_CHANNELS];
  int nreq[FC_RING_CHANNELS], cap[FC_RING_CHANNELS];
  /* Collectives' buffers live here, not on a stack: a collective that timed out cannot be cancelled (MPI
   * forbids it) and may still complete if the late peer arrives, writing into them. */
  int64_t *coll; /* 4·MAX_AGREE values */
  int stuck;     /* a collective timed out: it and its buffers belong to MPI from now on */
} mpi_transport;

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void nap(long us) {
  struct timespec t = {0, us * 1000};
  nanosleep(&t, NULL);
}

static flashc_status mpi_failure(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
  return fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: %s failed: %s", what, msg);
}

/* Requests that will never be waited for again: cancel what can be, and let MPI forget them. Their buffers
 * must then outlive the ring (see flashc_ring_destroy). */
static void drop_requests(MPI_Request *reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&reqs[i]);
      MPI_Request_free(&reqs[i]);
    }
}

/* Poll until all n requests complete, one fails, or timeout_ms pass. The naps grow to 1 ms: short enough not
 * to add latency that matters next to a block of attention, long enough to leave the cores to ranks that
 * still compute (ranks may share cores). Point-to-point requests that time out are cancelled; a collective
 * one cannot be, and is left to MPI (m->stuck). */
static flashc_status wait_requests(mpi_transport *m, MPI_Request *reqs, int n, const char *what, bool collective) {
  int64_t start = now_ms();
  long sleep_us = 1;
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS || (!done && m->base.timeout_ms > 0 && now_ms() - start >= m->base.timeout_ms)) {
      if (collective)
        m->stuck = 1;
      else
        drop_requests(reqs, n);
    }
    if (rc != MPI_SUCCESS) return mpi_failure(rc, what);
    if (done) return FLASHC_OK;
    int64_t waited = now_ms() - start;
    if (m->base.timeout_ms > 0 && waited >= m->base.timeout_ms) {
      int w = m->base.world, r = m->base.rank;
      return fc_error(FLASHC_ERR_COMMUNICATION,
                      "ring attention: %s on rank %d of %d made no progress for %lld ms (the ring's timeout): a "
                      "peer (rank %d or %d) died, stalled or never called; raise it with flashc_ring_set_timeout "
                      "or FLASHC_RING_TIMEOUT_MS",
                      what, r, w, (long long)waited, (r + w - 1) % w, (r + 1) % w);
    }
    nap(sleep_us);
    if (sleep_us < 1000) sleep_us *= 2;
  }
}

static flashc_status mpi_agree(fc_ring_comm *c, const int64_t *mine, int64_t *lo, int64_t *hi, int n) {
  mpi_transport *m = (mpi_transport *)c;
  if (n > MAX_AGREE)
    return fc_error(FLASHC_ERR_INTERNAL, "ring attention: %d values to agree on (max %d)", n, MAX_AGREE);
  if (m->stuck) return fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: an earlier collective never completed");
  /* One reduction gives both extremes: min(x) and −min(−x) = max(x). */
  int64_t *send = m->coll, *recv = m->coll + 2 * MAX_AGREE;
  for (int i = 0; i < n; i++) {
    send[i] = mine[i];
    send[n + i] = -mine[i];
  }
  MPI_Request req;
  int rc = MPI_Iallreduce(send, recv, 2 * n, MPI_INT64_T, MPI_MIN, m->comm, &req);
  if (rc != MPI_SUCCESS) return mpi_failure(rc, "the ranks' agreement on the call (MPI_Iallreduce)");
  FC_CHECK(wait_requests(m, &req, 1, "the ranks' agreement on the call (MPI_Iallreduce)", true));
  for (int i = 0; i < n; i++) {
    lo[i] = recv[i];
    hi[i] = -recv[n + i];
  }
  return FLASHC_OK;
}

static flashc_status mpi_broadcast(fc_ring_comm *c, void *bytes, size_t n) {
  mpi_transport *m = (mpi_transport *)c;
  if (n > 4 * MAX_AGREE * sizeof(int64_t))
    return fc_error(FLASHC_ERR_INTERNAL, "ring attention: broadcast of %zu bytes", n);
  if (m->stuck) return fc_error(FLASHC_ERR_COMMUNICATION, "ring attention: an earlier collective never completed");
  memcpy(m->coll, bytes, n);
  MPI_Request req;
  int rc = MPI_Ibcast(m->coll, (int)n, MPI_BYTE, 0, m->comm, &req);
  if (rc != MPI_SUCCESS) return mpi_failure(rc, "MPI_Ibcast");
  FC_CHECK(wait_requests(m, &req, 1, "MPI_Ibcast", true));
  memcpy(bytes, m->coll, n);
  return FLASHC_OK;
}

static flashc_status mpi_local_rank(fc_ring_comm *c, int *local) {
  *local = ((mpi_transport *)c)->local_rank;
  return FLASHC_OK;
}

static flashc_status mpi_start(fc_ring_comm *c, int ch, const void *send, void *recv, size_t bytes, void *stream) {
  (void)stream;
  mpi_transport *m = (mpi_transport *)c;
  int chunks = (int)((bytes + MAX_MESSAGE - 1) / MAX_MESSAGE);
  if (2 * chunks > m->cap[ch]) {
    MPI_Request *more = realloc(m->req[ch], sizeof(MPI_Request) * 2 * (size_t)chunks);
    if (!more) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "ring attention: %d MPI requests", 2 * chunks);
    m->req[ch] = more;
    m->cap[ch] = 2 * chunks;
  }
  int next = (c->rank + 1) % c->world, prev = (c->rank + c->world - 1) % c->world, n = 0;
  MPI_Request *req = m->req[ch];
  /* Receives first, so an arriving message finds its buffer already posted. */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < chunks; i++) {
      size_t off = (size_t)i * MAX_MESSAGE, len = bytes - off < MAX_MESSAGE ? bytes - off : MAX_MESSAGE;
      int rc = pass == 0
                   ? MPI_Irecv((char *)recv + off, (int)len, MPI_BYTE, prev, TAG_BASE + ch, m->comm, &req[n])
                   : MPI_Isend((const char *)send + off, (int)len, MPI_BYTE, next, TAG_BASE + ch, m->comm, &req[n]);
      if (rc != MPI_SUCCESS) {
        drop_requests(req, n);
        m->nreq[ch] = 0;
        return mpi_failure(rc, pass == 0 ? "MPI_Irecv of the next block" : "MPI_Isend of the current block");
      }
      n++;
    }
  m->nreq[ch] = n;
  return FLASHC_OK;
}

static flashc_status mpi_wait(fc_ring_comm *c, int ch, void *stream) {
  (void)stream;
  mpi_transport *m = (mpi_transport *)c;
  int n = m->nreq[ch];
  m->nreq[ch] = 0;
  return wait_requests(m, m->req[ch], n, ch == FC_RING_KV ? "the exchange of K/V blocks" : "the exchange of dK/dV",
                       false);
}

static void mpi_abandon(fc_ring_comm *c) {
  mpi_transport *m = (mpi_transport *)c;
  for (int ch = 0; ch < FC_RING_CHANNELS; ch++) {
    drop_requests(m->req[ch], m->nreq[ch]);
    m->nreq[ch] = 0;
  }
}

static void mpi_close(fc_ring_comm *c) {
  mpi_transport *m = (mpi_transport *)c;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    mpi_abandon(c);
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  }
  for (int ch = 0; ch < FC_RING_CHANNELS; ch++) free(m->req[ch]);
  if (!m->stuck) free(m->coll); /* else MPI may still write it: left to the process */
  free(m);
}

flashc_status fc_ring_mpi_open(const void *mpi_comm, int64_t timeout_ms, fc_ring_comm **out) {
  const char *op = "flashc_ring_create_mpi";
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: MPI is %s", op,
                    finalized ? "already finalized" : "not initialized (call MPI_Init first)");
  MPI_Comm user = *(const MPI_Comm *)mpi_comm;
  if (user == MPI_COMM_NULL) return fc_error(FLASHC_ERR_INVALID_ARGUMENT, "%s: *mpi_comm is MPI_COMM_NULL", op);
  mpi_transport *m = calloc(1, sizeof *m);
  if (!m) return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "%s: %zu bytes", op, sizeof *m);
  m->coll = malloc(4 * MAX_AGREE * sizeof(int64_t));
  if (!m->coll) {
    free(m);
    return fc_error(FLASHC_ERR_OUT_OF_MEMORY, "%s: %zu bytes", op, 4 * MAX_AGREE * sizeof(int64_t));
  }
  m->comm = MPI_COMM_NULL;
  m->base.timeout_ms = timeout_ms;
  m->base.name = "MPI";
  m->base.agree = mpi_agree;
  m->base.broadcast = mpi_broadcast;
  m->base.local_rank = mpi_local_rank;
  m->base.start = mpi_start;
  m->base.wait = mpi_wait;
  m->base.abandon = mpi_abandon;
  m->base.close = mpi_close;

  /* Our own communicator: the ring's messages never match the caller's, and its errors return. */
  MPI_Request req;
  int rc = MPI_Comm_idup(user, &m->comm, &req);
  flashc_status s = rc == MPI_SUCCESS ? FLASHC_OK : mpi_failure(rc, "MPI_Comm_idup");
  if (s == FLASHC_OK) s = wait_requests(m, &req, 1, "MPI_Comm_idup (every rank must create the ring)", true);
  if (m->stuck) return s; /* MPI may still complete the duplicate into m->comm: m is left to it */
  if (s == FLASHC_OK && (rc = MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS)
    s = mpi_failure(rc, "MPI_Comm_set_errhandler");
  if (s == FLASHC_OK) {
    MPI_Comm_rank(m->comm, &m->base.rank);
    MPI_Comm_size(m->comm, &m->base.world);
    /* The rank within this node (one GPU per rank) and the node's ranks (their share of its cores). Blocking,
     * but every rank has just joined the dup. */
    MPI_Comm node;
    rc = MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->base.rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) {
      s = mpi_failure(rc, "MPI_Comm_split_type");
    } else {
      MPI_Comm_rank(node, &m->local_rank);
      MPI_Comm_size(node, &m->base.local_ranks);
      MPI_Comm_free(&node);
    }
  }
  if (s != FLASHC_OK) {
    if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
    free(m->coll);
    free(m);
    return s;
  }
  *out = &m->base;
  return FLASHC_OK;
}
