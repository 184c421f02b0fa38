"""A model of the pairwise barriers of cuda-hopper's backward at D = 64 and 128 with each block's dQ issued one block
later (LAG: src/cuda/hopper/bwd_kernel.cuh, fc_hopper_bwd_kernel; docs/hopper.md, "The D = 128 kernel (LAG + BIAS)"),
run under random interleavings of the two consumer warpgroups (bwd_kernel_model.py runs the same barriers within the
kernel's whole protocol).

Each warpgroup is one agent (its 128 threads pass every step together). Per block i of n:
  i >= 2: bar.sync FREE(other, i % 2)          the other's dQ of block i - 2 has read sdS[i % 2]
  write its dSᵀ rows of block i into sdS[i % 2]
  bar.arrive READY(me, i % 2)
  i >= 1: bar.sync READY(other, (i - 1) % 2); issue dQ of block i - 1 (reads both warpgroups' rows of sdS[(i-1) % 2])
  wait (the dQ wgmma retires)
  i >= 1 and i + 2 <= n: bar.arrive FREE(me, (i - 1) % 2)
and after the loop: bar.sync READY(other, (n - 1) % 2), dQ of block n - 1 issued and retired.

A named barrier here has two parties (the arriving warpgroup, the syncing one); a phase completes when both are in.
Checks: no deadlock; a second arrival of the same warpgroup in an open phase (the hardware would count it towards
the phase, which then completes early) is an error; a dQ reads rows of its own block from both warpgroups; nobody
writes a buffer an issued, unretired dQ reads; every phase is closed at the end. MUTATIONS must each be caught.

    python3 tests/models/bwd_lag_model.py      (0..9 blocks, 400 seeds each, then every mutation)
"""
import random
import sys

MUTATIONS = {
    "no_free_sync": "the dSᵀ store without waiting for the other's dQ of block i - 2",
    "free_always": "FREE arrived after every dQ (also for blocks no one writes again: open phases)",
    "ready_before_store": "READY arrived before the dSᵀ rows are written",
    "no_ready_sync": "dQ issued without waiting for the other's rows",
    "tail_no_sync": "the last block's dQ without waiting for the other's rows",
}


class Violation(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Violation(msg)


class Barrier:
    """A named barrier with two parties: `arriver` (bar.arrive) and the other warpgroup (bar.sync)."""

    def __init__(self, name, arriver):
        self.name, self.arriver = name, arriver
        self.arrived = 0  # arrivals of the arriving party in the open phase (0 or 1)
        self.waiting = False  # the syncing party is in the open phase
        self.completed = 0

    def arrive(self):
        check(self.arrived == 0, f"{self.name}: a second arrival in an open phase")
        self.arrived = 1
        self._complete()

    def sync_enter(self):
        check(not self.waiting, f"{self.name}: a second sync in an open phase")
        self.waiting = True
        self._complete()
        return self.completed

    def _complete(self):
        if self.arrived and self.waiting:
            self.arrived, self.waiting = 0, False
            self.completed += 1


def program(c, n, mut):
    """The steps of warpgroup c as a list of (op, args)."""
    o = 1 - c
    steps = []
    for i in range(n):
        if i >= 2 and mut != "no_free_sync":
            steps.append(("sync", ("FREE", o, i % 2)))
        if mut == "ready_before_store":
            steps.append(("arrive", ("READY", c, i % 2)))
        steps.append(("write", (i % 2, i)))
        if mut != "ready_before_store":
            steps.append(("arrive", ("READY", c, i % 2)))
        if i >= 1:
            if mut != "no_ready_sync":
                steps.append(("sync", ("READY", o, (i - 1) % 2)))
            steps.append(("issue", ((i - 1) % 2, i - 1)))
            steps.append(("retire", None))
            if i + 2 <= n or mut == "free_always":
                steps.append(("arrive", ("FREE", c, (i - 1) % 2)))
    if n >= 1:
        if mut != "tail_no_sync":
            steps.append(("sync", ("READY", o, (n - 1) % 2)))
        steps.append(("issue", ((n - 1) % 2, n - 1)))
        steps.append(("retire", None))
    return steps


def simulate(n, seed, mut=None):
    rng = random.Random(seed)
    bars = {(k, c, b): Barrier(f"{k}({c},{b})", c) for k in ("READY", "FREE") for c in (0, 1) for b in (0, 1)}
    rows = {(b, c): None for b in (0, 1) for c in (0, 1)}  # which block's rows warpgroup c left in sdS[b]
    inflight = {0: None, 1: None}  # the buffer an issued, unretired dQ of warpgroup c reads
    progs = [program(c, n, mut) for c in (0, 1)]
    pc = [0, 0]
    sync_target = [None, None]  # (barrier, phase count to reach) while a warpgroup waits in a bar.sync
    while pc[0] < len(progs[0]) or pc[1] < len(progs[1]):
        ready = []
        for c in (0, 1):
            if pc[c] >= len(progs[c]):
                continue
            if sync_target[c] is not None:
                bar, target = sync_target[c]
                if bar.completed < target:
                    continue
            ready.append(c)
        check(ready, f"deadlock at steps {pc}")
        c = rng.choice(ready)
        if sync_target[c] is not None:  # the bar.sync it waited in has completed
            sync_target[c] = None
            pc[c] += 1
            continue
        op, arg = progs[c][pc[c]]
        if op == "sync":
            bar = bars[arg]
            before = bar.completed
            bar.sync_enter()
            sync_target[c] = (bar, before + 1)
            continue
        if op == "arrive":
            bars[arg].arrive()
        elif op == "write":
            b, blk = arg
            for w in (0, 1):
                check(inflight[w] != b, f"warpgroup {c} writes sdS[{b}] (block {blk}) under warpgroup {w}'s dQ")
            rows[(b, c)] = blk
        elif op == "issue":
            b, blk = arg
            for w in (0, 1):
                check(rows[(b, w)] == blk, f"warpgroup {c}'s dQ of block {blk} finds warpgroup {w}'s rows of block "
                      f"{rows[(b, w)]} in sdS[{b}]")
            inflight[c] = b
        elif op == "retire":
            inflight[c] = None
        pc[c] += 1
    for bar in bars.values():
        check(bar.arrived == 0 and not bar.waiting, f"{bar.name}: a phase left open at the end")


def main():
    runs = 0
    for n in range(10):
        for seed in range(400):
            simulate(n, seed)
            runs += 1
    caught = 0
    for mut, what in MUTATIONS.items():
        hit = False
        for n in range(10):
            for seed in range(400):
                try:
                    simulate(n, seed, mut)
                except Violation:
                    hit = True
                    break
            if hit:
                break
        if not hit:
            print(f"mutation not caught: {mut} ({what})")
            return 1
        caught += 1
    print(f"{runs} passed, 0 failed (LAG barriers: 0..9 blocks); {caught} broken protocols caught")
    return 0


if __name__ == "__main__":
    sys.exit(main())
