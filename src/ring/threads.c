/* threads.c — how many threads a CPU ring rank computes with when the caller did not say (flashc_set_threads
 * on the ring's handle left at 0).
 *
 * A single call takes every core it may run on. The ranks of a ring on one node run at the same time, so each
 * taking every core oversubscribes the node by the number of local ranks (2 ranks on 2 cores measured 53-63 %
 * "efficiency"); a rank takes its share instead: the node's cores / the ranks on the node (the size of the
 * MPI_COMM_TYPE_SHARED split), never more than its own CPU affinity allows (mpirun may bind a rank to one core
 * or one socket) and at least 1. */
#include "threads.h"

#include "../internal.h" /* fc_cpu_count */

#include <unistd.h>

int fc_ring_split_cores(int local_ranks, int node_cores, int my_cores) {
  if (local_ranks < 1) local_ranks = 1;
  if (node_cores < 1) node_cores = 1;
  int share = node_cores / local_ranks;
  if (my_cores >= 1 && share > my_cores) share = my_cores;
  return share < 1 ? 1 : share;
}

int fc_ring_cpu_threads(int local_ranks) {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  return fc_ring_split_cores(local_ranks, online > 0 && online < (1 << 20) ? (int)online : 1, fc_cpu_count());
}
