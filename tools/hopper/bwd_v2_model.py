"""A model of the protocol of cuda-hopper's second backward kernel (src/cuda/hopper_bwd_v2.cuh, FLASHC_HOPPER_BWD_V =
2, 3, 4 at D = 128; at D = 64 with Br = 128 dV is issued after the dP^T wait instead of before it, 4 issues the
next block's S^T before the dQ store instead of after it, 5 and 6 are 3 and 4 with D = 128's dV order), run under
random interleavings. Agents: the producer thread (TMA fills of the Q_i/dO_i/lse2_i/D_i stages), the two consumer
warpgroups (each one agent: its 128 threads pass every step together, through the wgmma .sync.aligned instructions
and its own named barrier), and the asynchronous units: TMA copies landing, each warpgroup's wgmma groups
completing in order, bulk reduce-adds finishing their reads of sdQ.

Checks, each at the moment it matters:
  - no deadlock; every stage fill lands before its readers run, in the right phase (the right block);
  - a TMA fill never starts on a stage that a warpgroup still holds (from its first read of the block until its
    release arrival) or that an in-flight wgmma reads;
  - a wgmma reading sdS finds both warpgroups' dS^T rows of its own block; nobody writes a buffer of sdS that an
    in-flight wgmma reads;
  - sdQ: a warpgroup writes its tile only when no bulk add still reads it, and the bulk add reads the right block;
  - registers: S^T, dP^T, dQ are read only after their group retired; the packed P^T / dS^T fragments are
    rewritten only after the dV / dK group that reads them retired; dK, dV are read at the end after all groups.
The model also runs deliberately broken protocols (MUTATIONS) and fails if it does not catch each of them.

    python3 tools/hopper/bwd_v2_model.py      (D = 128: versions 2, 3, 4; D = 64: 2 .. 6; 0..7 blocks; GQA-sized runs;
                                               300 seeds each; each mutation in every kernel it concerns)
"""
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from protocol_model import MBar  # noqa: E402  (the mbarrier semantics, shared with the forward's model)


class Violation(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Violation(msg)


MUTATIONS = {
    "single_sds": "one sdS buffer (with the single barrier per block)",
    "release_before_dk": "NEXT: the stage released before the wait that retires dK",
    "no_wait_read": "the sdQ tile rewritten without waiting for the last bulk add's read",
    "store_dq_early": "dQ stored before the wait that retires it",
    "next_wrong_parity": "NEXT: block it + 1's full-wait with block it's parity",
    "v2_wait1_end": "V = 2: the iteration ends with wait 1 (dK still in flight) and releases the stage",
    "late_dv_wait1": "D = 64: wait 1 for dP^T (as D = 128 does, but with dV not yet issued: dP^T still in flight)",
}


def simulate(n_iter, stages, nxt, seed, mutation=None, early_dv=True, early_s=False):
    """early_dv: D = 128's order (dV issued before the dP^T wait); False: D = 64's (dV after dS^T is formed).
    early_s (with nxt, D = 64's V = 4): block it + 1's S^T issued before the dQ store instead of after it."""
    assert not early_s or nxt
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
    bar3 = {"arrived": 0, "gen": 0}
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

    def wait_groups(c, n):
        yield lambda: len(groups[c]) <= n

    def barrier3(c):
        gen = bar3["gen"]
        bar3["arrived"] += 1
        if bar3["arrived"] == 2:
            bar3["arrived"], bar3["gen"] = 0, gen + 1
        yield lambda: bar3["gen"] != gen

    def consumer(c):
        last_dv = last_dk = None  # the blocks whose dV / dK read the packed fragments now in registers
        if nxt and n_iter > 0:
            yield lambda: full[0].passed(0)
            holds[0].add(c)
            issue(c, "S", 0, [(("stage", 0), 0), (("sK",), None)])
        for it in range(n_iter):
            s, u = it % stages, it // stages
            buf = 0 if mutation == "single_sds" else it & 1
            if nxt:
                yield from wait_groups(c, 0)
                need(c, "S", it, "S^T")
                issue(c, "dP", it, [(("stage", s), it)])
            else:
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
            check(not inflight_reads(("sds", buf, c)), f"wg{c} writes sdS[{buf}] under a wgmma that reads it")
            sds[buf][c] = it
            yield
            if mutation != "no_wait_read":
                yield lambda: not bulk_reads[c]
            yield from barrier3(c)
            issue(c, "dQ", it, [(("sds", buf, 0), it), (("sds", buf, 1), it)])
            issue(c, "dK", it, [(("stage", s), it)])
            yield
            def issue_next():  # NEXT: block it + 1's S^T (the last block: its own again, discarded)
                nx = it + 1 if it + 1 < n_iter else it
                s1 = nx % stages
                parity = ((it // stages) & 1) if mutation == "next_wrong_parity" else ((nx // stages) & 1)
                if mutation == "release_before_dk":
                    holds[s].discard(c)
                    empty[s].arrive()
                yield lambda: full[s1].passed(parity)
                holds[s1].add(c)
                issue(c, "S", nx, [(("stage", s1), nx)])

            if mutation != "store_dq_early":
                yield from wait_groups(c, 1)
            if early_s:  # D = 64, V = 4: before the dQ store
                yield from issue_next()
            need(c, "dQ", it, "dQ")
            check(not bulk_reads[c], f"wg{c} writes its sdQ tile while a bulk add reads it")
            sdq[c] = it
            bulk_reads[c].append(it)
            yield
            if nxt:
                if not early_s:
                    yield from issue_next()
                yield from wait_groups(c, 1)
                need(c, "dK", it, "dK (stage release)")
                if mutation != "release_before_dk":
                    holds[s].discard(c)
                    empty[s].arrive()
            else:
                yield from wait_groups(c, 1 if mutation == "v2_wait1_end" else 0)
                holds[s].discard(c)
                empty[s].arrive()
        yield from wait_groups(c, 0)
        yield lambda: not bulk_reads[c]
        for it in range(n_iter):
            need(c, "dK", it, "dK at the end")
            need(c, "dV", it, "dV at the end")
        done[1 + c] = True

    # Each run draws how fast each kind of unit is against the agents (1: as likely as an agent's step; 0.03: it
    # lags for tens of steps), so that the slow-copy and slow-wgmma schedules that expose a missing wait are met
    # often, not by rare luck.
    speed = {"agent": 1.0, **{k: rng.choice((1.0, 0.2, 0.03)) for k in ("tma", "wgmma", "bulk")}}
    agents = [producer(), consumer(0), consumer(1)]
    active = [True, True, True]
    blocked = [None, None, None]  # the condition an agent waits for (None: runnable)
    while True:
        events = []
        for i in range(3):
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
            break
        kind, x = rng.choices(events, weights=[speed[k] for k, _ in events])[0]
        if kind == "agent":
            try:
                blocked[x] = next(agents[x])
            except StopIteration:
                active[x] = False
        elif kind == "tma":
            s, blk = tma.pop(x)
            check(not inflight_reads(("stage", s)), f"block {blk} lands in stage {s} under a wgmma")
            stage_block[s] = blk
            full[s].complete_tx(1)
        elif kind == "wgmma":
            g = groups[x].pop(0)  # groups complete in order
            retired[x].add((g["name"], g["block"]))
        else:
            blk = bulk_reads[x].pop(0)
            check(sdq[x] == blk, f"bulk add of block {blk} read wg{x}'s tile holding block {sdq[x]}")
    # No runnable agent and no event left: a deadlock unless all are done.
    if not all(done):
        raise Violation(f"deadlock: done {done}, groups {[len(g) for g in groups]}, tma {tma}")


VERSIONS = {  # name: (stages, NEXT, early_dv, early_s)
    "D128 V2": (2, False, True, False), "D128 V3": (2, True, True, False), "D128 V4": (3, True, True, False),
    "D64 V2": (2, False, False, False), "D64 V3": (2, True, False, False), "D64 V4": (2, True, False, True),
    "D64 V5": (2, True, True, False), "D64 V6": (2, True, True, True),
}


def main():
    failures = 0
    runs = 0
    for version, (stages, nxt, early_dv, early_s) in VERSIONS.items():
        for n_iter in list(range(0, 8)) + [13, 24]:
            for seed in range(300):
                runs += 1
                try:
                    simulate(n_iter, stages, nxt, seed, early_dv=early_dv, early_s=early_s)
                except Violation as e:
                    failures += 1
                    if failures < 10:
                        print(f"{version} n_iter {n_iter} seed {seed}: {e}")
    print(f"protocol: {runs - failures}/{runs} interleavings clean")
    missed = 0
    for m, what in MUTATIONS.items():
        nxt_needed = m in ("release_before_dk", "next_wrong_parity")
        # each mutation must be caught in every kernel it concerns (the D = 64 ones only there), not in one of them
        kernels = [(n, v) for n, v in VERSIONS.items() if (v[1] or not nxt_needed) and
                   (not m.startswith("late_dv") or not v[2]) and (m != "v2_wait1_end" or not v[1])]
        for name, (stages, nxt, early_dv, early_s) in kernels:
            caught = False
            for n_iter in (2, 3, 5, 8):
                for seed in range(300):
                    try:
                        simulate(n_iter, stages, nxt, seed, mutation=m, early_dv=early_dv, early_s=early_s)
                    except Violation:
                        caught = True
                        break
                if caught:
                    break
            print(f"mutation {m:18s} {name:8s} ({what}): {'caught' if caught else 'NOT CAUGHT'}")
            missed += not caught
    ok = failures == 0 and missed == 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
