/* threads.h — the default thread count of a CPU ring rank (threads.c). */
#ifndef FLASHC_RING_THREADS_H
#define FLASHC_RING_THREADS_H

/* A rank's share of its node: node_cores / local_ranks, at most my_cores (its CPU affinity), at least 1. */
int fc_ring_split_cores(int local_ranks, int node_cores, int my_cores);

/* The same for this process: the online processors, shared by local_ranks ranks (the size of the ring's
 * MPI_COMM_TYPE_SHARED split), capped by this process's affinity. For a ring call whose handle has threads 0. */
int fc_ring_cpu_threads(int local_ranks);

#endif
