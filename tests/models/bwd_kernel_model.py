"""A model of the protocol of cuda-hopper's second backward kernel (src/cuda/hopper/bwd_kernel.cuh,
fc_hopper_bwd_kernel<T, 64> and <T, 128>: the backward's default at head dims <= 128 outside deterministic mode),
run under random interleavings. Agents: the producer thread (TMA fills of the Q_i/dO_i/lse2_i/D_i stages), the two
consumer warpgroups (each one agent: its 128 threads pass every step together, through the wgmma .sync.aligned
instructions and its own named barriers), and the asynchronous units: TMA copies landing, each warpgroup's wgmma
groups completing in order, bulk reduce-adds finishing their reads of sdQ.

The kernel (2 stages; D = 128 issues dV before the dP^T wait, D = 64 after dS^T is formed) issues each block's dQ
one block later (LAG): per block i, S^T and dP^T issued, dV, dS^T into sdS[i % 2] after the FREE barrier of the
other warpgroup (its dQ of block i - 2 has read that buffer) and the wait for the last bulk add's read of its sdQ
tile, READY arrived, then after the other's READY of block i - 1 its dQ of block i - 1 and dK issued; wait 1 (dV,
dQ), FREE arrived, dQ stored to sdQ and one bulk add; wait 0 (dK), the stage released. The last block's dQ after
the loop. bwd_lag_model.py checks the pairwise barriers alone over more blocks. The orders before LAG (the next
block's S^T issued behind dK, earlier still, without LAG) and the persistent form of this kernel were deleted in
commit 9993c62 (their code is at d79fa1c) and are no longer modelled.

Checks, each at the moment it matters:
  - no deadlock; every stage fill lands before its readers run, in the right phase (the right block);
  - a TMA fill never starts on a stage that a warpgroup still holds (from its first read of the block until its
    release arrival) or that an in-flight wgmma reads;
  - a wgmma reading sdS finds both warpgroups' dS^T rows of its own block; nobody writes a buffer of sdS that an
    in-flight wgmma reads; a second arrival at a pairwise barrier whose phase is open is an error;
  - sdQ: a warpgroup writes its tile only when no bulk add still reads it, and the bulk add reads the right block;
  - registers: S^T, dP^T, dQ are read only after their group retired; the packed P^T / dS^T fragments are
    rewritten only after the dV / dK group that reads them retired; dK, dV are read at the end after all groups.
The model also runs deliberately broken protocols (MUTATIONS) and fails if it does not catch each of them.

    python3 tests/models/bwd_kernel_model.py      (D = 128 and D = 64; 0..7, 13, 24 blocks; 300 seeds each; each
                                               mutation in every kernel it concerns)

The machinery (run, step, check, groups_at_most, sync_both, and the runs of clean and broken protocols: clean,
caught, verdict) is shared with bwd_d256_model.py.
"""
import functools
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from protocol_model import MBar  # noqa: E402  (the mbarrier semantics, shared with the forward's model)


class Violation(Exception):
    pass


def groups_at_most(groups, c, n):
    """wgmma.wait_group n of warpgroup c: until at most n of its groups are in flight."""
    yield lambda: len(groups[c]) <= n


def sync_both(bar, c):
    """bar.sync by warpgroup c of a named barrier the two consumer warpgroups share (bar: {"arrived", "gen"})."""
    gen = bar["gen"]
    bar["arrived"] += 1
    if bar["arrived"] == 2:
        bar["arrived"], bar["gen"] = 0, gen + 1
    yield lambda: bar["gen"] != gen


def check(cond, msg):
    if not cond:
        raise Violation(msg)


SEEDS = 300  # random interleavings per block count


def clean(kernels, n_iters):
    """Every kernel's protocol, kernels {name: simulate(n_iter, seed)}, over SEEDS interleavings of each block count
    of n_iters: prints the first failures and the count of clean runs, returns the number of failures."""
    failures = runs = 0
    for name, simulate_one in kernels.items():
        for n_iter in n_iters:
            for seed in range(SEEDS):
                runs += 1
                try:
                    simulate_one(n_iter, seed)
                except (Violation, AssertionError) as e:  # AssertionError: an mbarrier phase over-arrived
                    failures += 1
                    if failures < 10:
                        print(f"{name} n_iter {n_iter} seed {seed}: {e}")
    print(f"protocol: {runs - failures}/{runs} interleavings clean")
    return failures


def caught(simulate_one):
    """Whether a broken protocol, simulate_one(n_iter, seed), fails in some interleaving of 2, 3, 5 or 8 blocks."""
    for n_iter in (2, 3, 5, 8):
        for seed in range(SEEDS):
            try:
                simulate_one(n_iter, seed)
            except (Violation, AssertionError):
                return True
    return False


def verdict(failures, missed):
    """The last line and the exit status: clean runs and every mutation caught."""
    ok = failures == 0 and missed == 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


MUTATIONS = {
    "single_sds": "one sdS buffer (with the pairwise barriers of two)",
    "no_wait_read": "the sdQ tile rewritten without waiting for the last bulk add's read",
    "store_dq_early": "dQ stored before the wait that retires it",
    "wait1_end": "the block ends with wait 1 (dK still in flight) and releases the stage",
    "late_dv_wait1": "D = 64: wait 1 for dP^T (as D = 128 does, but with dV not yet issued: dP^T still in flight)",
    "no_free_sync": "dS^T stored without waiting for the other's dQ of block i - 2 (FREE)",
    "no_ready_sync": "dQ of block i - 1 issued without waiting for the other's rows (READY)",
    "free_before_wait": "FREE arrived before the wait that retires this warpgroup's dQ",
    "tail_no_sync": "the last block's dQ issued without waiting for the other's rows",
}


def step(rng, speed, agents, active, blocked, tma, groups, bulk_reads):
    """One event of a run, drawn with the run's speeds among what can happen now: an agent's next step (taken
    here), a TMA copy landing, a warpgroup's oldest wgmma group or bulk read completing (left to the caller, which
    knows what they touch). Returns (kind, index), or None when nothing can happen (the run is over)."""
    events = []
    for i in range(len(agents)):
        if active[i] and (blocked[i] is None or blocked[i]()):
            events.append(("agent", i))
    for k in range(len(tma)):
        events.append(("tma", k))
    for c in (0, 1):
        if groups[c]:
            events.append(("wgmma", c))
        if bulk_reads[c]:
            events.append(("bulk", c))
    if not events:
        return None
    kind, x = rng.choices(events, weights=[speed[k] for k, _ in events])[0]
    if kind == "agent":
        try:
            blocked[x] = next(agents[x])
        except StopIteration:
            active[x] = False
    return kind, x


def run(rng, agents, done, tma, groups, bulk_reads, retired, land, bulk_read):
    """Drives one run until nothing can happen: the agents (producer, consumer 0, consumer 1) and the asynchronous
    units, each kind at a speed drawn for the run (1: as likely as an agent's step; 0.03: it lags for tens of steps,
    so that the slow-copy and slow-wgmma schedules that expose a missing wait are met often, not by rare luck).
    land(f): TMA copy f (popped from tma) lands; a warpgroup's oldest wgmma group retires into retired[c];
    bulk_read(c, blk): the oldest bulk add of warpgroup c's sdQ tile has read it. A deadlock unless all are done."""
    speed = {"agent": 1.0, **{k: rng.choice((1.0, 0.2, 0.03)) for k in ("tma", "wgmma", "bulk")}}
    active = [True] * len(agents)
    blocked = [None] * len(agents)  # the condition an agent waits for (None: runnable)
    while True:
        ev = step(rng, speed, agents, active, blocked, tma, groups, bulk_reads)
        if ev is None:
            break
        kind, x = ev
        if kind == "tma":
            land(tma.pop(x))
        elif kind == "wgmma":
            g = groups[x].pop(0)  # groups complete in order
            retired[x].add((g["name"], g["block"]))
        elif kind == "bulk":
            bulk_read(x, bulk_reads[x].pop(0))
    if not all(done):
        raise Violation(f"deadlock: done {done}, groups {[len(g) for g in groups]}, tma {tma}")

def simulate(n_iter, stages, seed, mutation=None, early_dv=True):
    """fc_hopper_bwd_kernel's consumers over one tile of n_iter blocks. early_dv: D = 128's order (dV issued before
    the dP^T wait); False: D = 64's (dV after dS^T is formed). Each block's dQ is issued in the next block (LAG), the
    last one's after the loop; READY(c, b) and FREE(c, b) are warpgroup c's pairwise named barriers of sdS buffer b
    (c arrives, the other syncs)."""
    rng = random.Random(seed)
    full = [MBar(1) for _ in range(stages)]
    empty = [MBar(2) for _ in range(stages)]  # one arrival per warpgroup stands for its 128 threads'
    stage_block = [None] * stages  # which block's Q_i, dO_i, lse2_i, D_i the stage holds
    holds = [set() for _ in range(stages)]  # warpgroups holding the stage (first read .. release)
    sds = [[None, None], [None, None]]  # sdS[buffer][warpgroup rows] = block
    sdq = [None, None]  # sdQ tile of each warpgroup = block
    bulk_reads = [[], []]  # per warpgroup: blocks whose bulk add still reads its tile
    groups = [[], []]  # per warpgroup: pending wgmma groups, oldest first: dict(name, block, reads)
    retired = [set(), set()]  # per warpgroup: (name, block) of retired groups
    tma = []  # in-flight fills: (stage, block)
    arrived, synced = {}, {}  # pairwise named barriers ("READY" or "FREE", arriving warpgroup, buffer): counts
    done = [False, False, False]

    def inflight_reads(res):
        return [(c, g) for c in (0, 1) for g in groups[c] if res in g["reads"]]

    def issue(c, name, block, check_reads):
        for res, want in check_reads:
            if res[0] == "stage":
                check(stage_block[res[1]] == want, f"wg{c} {name}[{block}] reads stage {res[1]} holding "
                                                   f"block {stage_block[res[1]]}")
            elif res[0] == "sds":
                check(sds[res[1]][res[2]] == want, f"wg{c} {name}[{block}] reads sdS[{res[1]}] rows {res[2]} of "
                                                   f"block {sds[res[1]][res[2]]}")
        groups[c].append({"name": name, "block": block, "reads": set(r for r, _ in check_reads)})

    def need(c, name, block, what):
        check((name, block) in retired[c], f"wg{c} reads {what} before {name}[{block}] retired")

    def bar_arrive(key):
        """bar.arrive of 128 threads at a 256-thread barrier: a second one before the other side's bar.sync would
        complete the phase without it."""
        check(arrived.get(key, 0) <= synced.get(key, 0), f"second arrival at {key} in an open phase")
        arrived[key] = arrived.get(key, 0) + 1

    def bar_sync(key):
        n = synced.get(key, 0) + 1
        check(n <= arrived.get(key, 0) + 1, f"second bar.sync at {key} in an open phase")
        synced[key] = n
        yield lambda: arrived.get(key, 0) >= n

    def producer():
        for it in range(n_iter):
            s, u = it % stages, it // stages
            if u > 0:
                yield lambda: empty[s].passed((u - 1) & 1)
            check(not holds[s], f"fill of block {it} into stage {s} while warpgroups {holds[s]} hold it")
            check(not inflight_reads(("stage", s)), f"fill of block {it} into stage {s} under a wgmma")
            full[s].arrive(expect_tx=1)
            stage_block[s] = None  # being overwritten
            tma.append((s, it))
        done[0] = True

    wait_groups = functools.partial(groups_at_most, groups)  # wait_groups(c, n): wgmma.wait_group n

    def buf_of(it):
        return 0 if mutation == "single_sds" else it & 1

    def issue_dq(c, blk):  # block blk's dQ: both warpgroups' dS^T rows of its buffer
        b = buf_of(blk)
        issue(c, "dQ", blk, [(("sds", b, 0), blk), (("sds", b, 1), blk)])

    def store_dq(c, blk):  # dQ -> the warpgroup's sdQ tile, one bulk add reading it
        need(c, "dQ", blk, "dQ")
        check(not bulk_reads[c], f"wg{c} writes its sdQ tile while a bulk add reads it")
        sdq[c] = blk
        bulk_reads[c].append(blk)

    def consumer(c):
        o = 1 - c  # the other warpgroup
        last_dv = last_dk = None  # the blocks whose dV / dK read the packed fragments now in registers
        for it in range(n_iter):
            s, u = it % stages, it // stages
            buf = buf_of(it)
            yield lambda: full[s].passed(u & 1)
            holds[s].add(c)
            issue(c, "S", it, [(("stage", s), it)])
            issue(c, "dP", it, [(("stage", s), it)])
            yield from wait_groups(c, 1)
            need(c, "S", it, "S^T")
            check(stage_block[s] == it, f"wg{c} reads lse2 of block {it} from stage {s} = {stage_block[s]}")

            def issue_dv():
                nonlocal last_dv
                if last_dv is not None:
                    need(c, "dV", last_dv, "the P^T fragments it rewrites")
                last_dv = it
                issue(c, "dV", it, [(("stage", s), it)])

            if early_dv:
                issue_dv()
                yield
                yield from wait_groups(c, 1)
            else:  # D = 64: nothing but dP^T is pending here
                yield from wait_groups(c, 1 if mutation == "late_dv_wait1" else 0)
            need(c, "dP", it, "dP^T")
            check(stage_block[s] == it, f"wg{c} reads D_i of block {it} from stage {s} = {stage_block[s]}")
            if last_dk is not None:
                need(c, "dK", last_dk, "the dS^T fragments it rewrites")
            last_dk = it
            if not early_dv:
                issue_dv()
                yield
            if it >= 1:  # block it - 2's bulk add has read the sdQ tile; the other's dQ of it - 2 read sdS[buf]
                if mutation != "no_wait_read":
                    yield lambda: not bulk_reads[c]
                if it >= 2 and mutation != "no_free_sync":
                    yield from bar_sync(("FREE", o, it & 1))
            check(not inflight_reads(("sds", buf, c)), f"wg{c} writes sdS[{buf}] under a wgmma that reads it")
            sds[buf][c] = it
            yield
            bar_arrive(("READY", c, it & 1))
            if it >= 1:  # LAG: block it - 1's dQ, once the other's rows of it are in
                if mutation != "no_ready_sync":
                    yield from bar_sync(("READY", o, (it - 1) & 1))
                issue_dq(c, it - 1)
            issue(c, "dK", it, [(("stage", s), it)])
            yield
            free = it >= 1 and it + 2 <= n_iter  # the other writes buffer (it - 1) % 2 again at block it + 1
            if free and mutation == "free_before_wait":
                bar_arrive(("FREE", c, (it - 1) & 1))
            if mutation != "store_dq_early":
                yield from wait_groups(c, 1)  # dV, block it - 1's dQ
            if it >= 1:
                if free and mutation != "free_before_wait":
                    bar_arrive(("FREE", c, (it - 1) & 1))
                store_dq(c, it - 1)
            yield
            yield from wait_groups(c, 1 if mutation == "wait1_end" else 0)  # dK
            holds[s].discard(c)
            empty[s].arrive()
        if n_iter > 0:  # the last block's dQ (fc_hpb_lag_tail)
            last = n_iter - 1
            if mutation != "tail_no_sync":
                yield from bar_sync(("READY", o, last & 1))
            issue_dq(c, last)
            yield from wait_groups(c, 0)
            if mutation != "no_wait_read":
                yield lambda: not bulk_reads[c]
            store_dq(c, last)
        yield from wait_groups(c, 0)
        yield lambda: not bulk_reads[c]
        for it in range(n_iter):
            need(c, "dK", it, "dK at the end")
            need(c, "dV", it, "dV at the end")
        done[1 + c] = True

    def land(f):
        s, blk = f
        check(not inflight_reads(("stage", s)), f"block {blk} lands in stage {s} under a wgmma")
        stage_block[s] = blk
        full[s].complete_tx(1)

    def bulk_read(c, blk):
        check(sdq[c] == blk, f"bulk add of block {blk} read wg{c}'s tile holding block {sdq[c]}")

    run(rng, [producer(), consumer(0), consumer(1)], done, tma, groups, bulk_reads, retired, land, bulk_read)
    open_phases = {k: (arrived.get(k, 0), synced.get(k, 0)) for k in set(arrived) | set(synced)
                   if arrived.get(k, 0) != synced.get(k, 0)}
    check(not open_phases, f"named barrier phases open at exit (arrivals, syncs): {open_phases}")


VERSIONS = {  # name: (stages, early_dv); FC_HPB_LAG_STAGES = 2 at both head dims
    "D128": (2, True), "D64": (2, False),
}


def simulate_version(stages, early_dv, n_iter, seed, mutation=None):
    return simulate(n_iter, stages, seed, mutation=mutation, early_dv=early_dv)


def main():
    failures = clean({name: functools.partial(simulate_version, stages, early_dv)
                      for name, (stages, early_dv) in VERSIONS.items()}, list(range(0, 8)) + [13, 24])
    missed = 0
    for m, what in MUTATIONS.items():
        # each mutation must be caught in every kernel it concerns (the D = 64 one only there), not in one of them
        kernels = [(n, v) for n, v in VERSIONS.items() if not m.startswith("late_dv") or not v[1]]
        for name, (stages, early_dv) in kernels:
            hit = caught(functools.partial(simulate_version, stages, early_dv, mutation=m))
            print(f"mutation {m:18s} {name:8s} ({what}): {'caught' if hit else 'NOT CAUGHT'}")
            missed += not hit
    return verdict(failures, missed)


if __name__ == "__main__":
    sys.exit(main())
