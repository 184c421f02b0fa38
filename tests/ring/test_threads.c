/* test_threads.c — the default threads of a CPU ring rank (src/ring/threads.c): the node's cores shared by
 * its ranks, capped by the rank's affinity, never 0. No MPI needed. */
#include "ring/threads.h"

#include <stdio.h>

static int failures;

static void expect(int local_ranks, int node_cores, int my_cores, int want) {
  int got = fc_ring_split_cores(local_ranks, node_cores, my_cores);
  if (got != want) {
    printf("FAIL fc_ring_split_cores(local_ranks %d, node_cores %d, my_cores %d) = %d, expected %d\n", local_ranks,
           node_cores, my_cores, got, want);
    failures++;
  }
}

int main(void) {
  expect(1, 8, 8, 8);    /* one rank: every core */
  expect(2, 2, 2, 1);    /* 2 ranks on 2 cores, not bound (--oversubscribe): one core each */
  expect(4, 64, 64, 16); /* 4 ranks on 64 cores */
  expect(4, 64, 32, 16); /* bound to a socket of 32: the node's share still fits */
  expect(2, 64, 1, 1);   /* bound to one core: that core */
  expect(3, 8, 8, 2);    /* the remainder stays idle rather than oversubscribe */
  expect(8, 2, 2, 1);    /* more ranks than cores: at least 1 */
  expect(0, 0, 0, 1);    /* nonsense counts: still a usable 1 */
  int mine = fc_ring_cpu_threads(1);
  if (mine < 1) {
    printf("FAIL fc_ring_cpu_threads(1) = %d\n", mine);
    failures++;
  }
  printf("%s ring thread split (this process, one rank: %d threads)\n", failures ? "FAIL" : "ok  ", mine);
  return failures ? 1 : 0;
}
