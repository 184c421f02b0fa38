"""A model of the protocol of cuda-hopper's second backward kernel (src/cuda/hopper_bwd_v2.cuh) in the orders before
LAG (versions 2, 3, 4 at D = 128, their code at commit d79fa1c; LAG's barriers: bwd_lag_model.py; at D = 64 with
Br = 128 dV is issued after the dP^T wait instead of before it, 4 issues the next block's S^T before the dQ store
instead of after it, 5 and 6 are 3 and 4 with D = 128's dV order), run under random interleavings. Agents: the
producer thread (TMA fills of the Q_i/dO_i/lse2_i/D_i stages), the two consumer
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

    python3 tests/models/bwd_v2_model.py      (D = 128: versions 2, 3, 4; D = 64: 2 .. 6; 0..7 blocks; GQA-sized runs;
                                               300 seeds each; each mutation in every kernel it concerns; then the
                                               persistent kernel, fc_hopper_bwd_v2p_kernel: simulate_persist)

The persistent kernel (D = 128 V 3 and D = 64 V 2; its code is at commit d79fa1c): one CTA walking a list of tiles of
random lengths (0 included), with the stage ring numbered across tiles, kv_full/kv_empty phases per loaded tile, the
producer's first STAGES - 1 fills of a tile ahead of its kv_empty wait, and the dK/dV epilogue staged in sdS between
two 256-thread barriers; checked as above plus: K/V never rewritten while a warpgroup uses them or a wgmma reads
them, every wgmma reads the K/V of its own tile, the staging never written under a dQ wgmma nor dS^T written under
staging reads (PERSIST_MUTATIONS must each be caught).
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


MUTATIONS = {
    "single_sds": "one sdS buffer (with the single barrier per block)",
    "release_before_dk": "NEXT: the stage released before the wait that retires dK",
    "no_wait_read": "the sdQ tile rewritten without waiting for the last bulk add's read",
    "store_dq_early": "dQ stored before the wait that retires it",
    "next_wrong_parity": "NEXT: block it + 1's full-wait with block it's parity",
    "v2_wait1_end": "V = 2: the iteration ends with wait 1 (dK still in flight) and releases the stage",
    "late_dv_wait1": "D = 64: wait 1 for dP^T (as D = 128 does, but with dV not yet issued: dP^T still in flight)",
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

    wait_groups = functools.partial(groups_at_most, groups)  # wait_groups(c, n): wgmma.wait_group n
    barrier3 = functools.partial(sync_both, bar3)  # barrier3(c): the two warpgroups' 256-thread barrier

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

    def land(f):
        s, blk = f
        check(not inflight_reads(("stage", s)), f"block {blk} lands in stage {s} under a wgmma")
        stage_block[s] = blk
        full[s].complete_tx(1)

    def bulk_read(c, blk):
        check(sdq[c] == blk, f"bulk add of block {blk} read wg{c}'s tile holding block {sdq[c]}")

    run(rng, [producer(), consumer(0), consumer(1)], done, tma, groups, bulk_reads, retired, land, bulk_read)


PERSIST_MUTATIONS = {
    "no_kv_empty": "persistent: the next tile's K_j, V_j loaded without waiting for kv_empty",
    "kv_wrong_parity": "persistent: kv_full waited with the parity of the tile count minus one",
    "no_epi_start_barrier": "persistent: dK/dV staged in sdS without the 256-thread barrier first",
    "no_epi_end_barrier": "persistent: no 256-thread barrier after the staging reads (next tile's dS^T writes)",
    "ring_restart": "persistent: the stage ring numbered from 0 again per tile (phases out of step)",
    "claim_no_wait": "dynamic order: a tile published without waiting for the takes of the entry's last one",
}
# Not a mutation: NEXT releasing the last block's stage inside the loop, as the single-tile kernel does, while the
# discarded S^T still reads it. The model finds no race there, because the next fill of that stage (ring r + STAGES)
# comes after the producer's kv_empty wait (its pre-fills are r + 1 .. r + STAGES - 1), which the consumers pass only
# after that S^T's wait. The kernel releases it after the wait all the same (fc_hpb_v2_block<…, PERSIST>), so that
# the argument does not hang on the pre-fill count.


def simulate_persist(tiles, stages, nxt, seed, mutation=None, early_dv=True, early_s=False, dynamic=False):
    """fc_hopper_bwd_v2p_kernel: one CTA walking `tiles` (each entry the tile's n_iter; 0: a tile no query block
    sees, which loads nothing and stores zeros). The per-block protocol is simulate()'s; across tiles: the Q/dO
    ring numbered across tiles (fill r: stage r % stages, phase r // stages), the producer's first stages - 1 fills
    of a tile before its kv_empty wait, K_j/V_j (kv_full with the loaded-tile count's parity) after it, the
    consumers' kv_empty arrival after their last wgmma of the tile (NEXT: after the discarded S^T's wait, with the
    last block's stage release), the epilogue staged through sdS between two 256-thread barriers. Blocks are named
    by their ring index r (unique across tiles). dynamic: the dynamic order's tile ring
    (hopper_sched.cuh's fc_hp_claim / fc_hp_take): after its last fill of tile k (a skipped tile too) the producer
    publishes tile k + 1 in entry k % 2, first waiting for both warpgroups to have taken entry k - 2; each warpgroup
    takes entry k after tile k's epilogue. The list itself is the same for both sides, as the claims make it."""
    assert not early_s or nxt
    rng = random.Random(seed)
    full = [MBar(1) for _ in range(stages)]
    empty = [MBar(2) for _ in range(stages)]
    kv_full, kv_empty = MBar(1), MBar(2)
    stage_block = [None] * stages
    holds = [set() for _ in range(stages)]
    kv_tile = [None]  # which tile's K_j, V_j are in sK, sV (None: being written)
    kv_holds = set()  # warpgroups between their kv_full wait and their kv_empty arrival
    sds = [[None, None], [None, None]]  # sdS[buffer][warpgroup rows] = ring index, or ("epi", tile)
    epi_reading = [False, False]  # a warpgroup's staging reads of sdS are under way
    sdq = [None, None]
    bulk_reads = [[], []]
    groups = [[], []]
    retired = [set(), set()]
    tma = []  # in-flight fills: ("stage", s, r) or ("kv", tile)
    bar3 = {"arrived": 0, "gen": 0}
    done = [False, False, False]
    starts = [sum(tiles[:k]) for k in range(len(tiles))]  # each tile's first ring index
    tile_full, tile_empty = [MBar(1), MBar(1)], [MBar(2), MBar(2)]  # the dynamic order's tile ring
    entry, takers = [None, None], [set(), set()]  # the tile published in each entry, who has taken it

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
            elif res[0] == "kv":
                check(kv_tile[0] == want, f"wg{c} {name}[{block}] reads K/V of tile {kv_tile[0]}, wants {want}")
        groups[c].append({"name": name, "block": block, "reads": set(r for r, _ in check_reads)})

    def need(c, name, block, what):
        check((name, block) in retired[c], f"wg{c} reads {what} before {name}[{block}] retired")

    def ring_of(k, it):
        return it if mutation == "ring_restart" else starts[k] + it

    def producer():
        kv_n = 0

        def fill(k, it):
            r = ring_of(k, it)
            s, u = r % stages, r // stages
            if u > 0:
                yield lambda: empty[s].passed((u - 1) & 1)
            check(not holds[s], f"fill of block {r} into stage {s} while warpgroups {holds[s]} hold it")
            check(not inflight_reads(("stage", s)), f"fill of block {r} into stage {s} under a wgmma")
            full[s].arrive(expect_tx=1)
            stage_block[s] = None
            tma.append(("stage", s, r))

        def claim(k):  # after tile k: publish tile k + 1 (the kernel's fc_hp_claim)
            e, u = k % 2, k // 2
            if u > 0 and mutation != "claim_no_wait":
                yield lambda: tile_empty[e].passed((u - 1) & 1)
            check(entry[e] is None or takers[e] == {0, 1}, f"entry {e} rewritten before {takers[e]} took tile "
                                                             f"{entry[e]}")
            entry[e], takers[e] = k + 1, set()
            tile_full[e].arrive()

        for k, n_iter in enumerate(tiles):
            if n_iter == 0:
                if dynamic:
                    yield from claim(k)
                continue
            pre = min(stages - 1, n_iter)
            for it in range(pre):
                yield from fill(k, it)
            if kv_n > 0 and mutation != "no_kv_empty":
                yield lambda n=kv_n: kv_empty.passed((n - 1) & 1)
            check(not kv_holds, f"K/V of tile {k} loaded while warpgroups {kv_holds} use the last ones")
            check(not inflight_reads(("kv",)), f"K/V of tile {k} loaded under a wgmma")
            kv_full.arrive(expect_tx=1)
            kv_tile[0] = None
            tma.append(("kv", k))
            for it in range(pre, n_iter):
                yield from fill(k, it)
            kv_n += 1
            if dynamic:
                yield from claim(k)
        done[0] = True

    wait_groups = functools.partial(groups_at_most, groups)  # wait_groups(c, n): wgmma.wait_group n
    barrier3 = functools.partial(sync_both, bar3)  # barrier3(c): the two warpgroups' 256-thread barrier

    def consumer(c):
        last_dv = last_dk = None
        kv_n = 0
        for k, n_iter in enumerate(tiles):
            if n_iter > 0:
                parity = ((kv_n - 1) & 1) if mutation == "kv_wrong_parity" else (kv_n & 1)
                yield lambda p=parity: kv_full.passed(p)
                kv_holds.add(c)
            dv_blocks, dk_blocks = [], []
            if nxt and n_iter > 0:
                r0 = ring_of(k, 0)
                yield lambda: full[r0 % stages].passed((r0 // stages) & 1)
                holds[r0 % stages].add(c)
                issue(c, "S", r0, [(("stage", r0 % stages), r0), (("kv",), k)])
            for it in range(n_iter):
                r = ring_of(k, it)
                s, u = r % stages, r // stages
                buf = it & 1
                if nxt:
                    yield from wait_groups(c, 0)
                    need(c, "S", r, "S^T")
                    issue(c, "dP", r, [(("stage", s), r), (("kv",), k)])
                else:
                    yield lambda: full[s].passed(u & 1)
                    holds[s].add(c)
                    issue(c, "S", r, [(("stage", s), r), (("kv",), k)])
                    issue(c, "dP", r, [(("stage", s), r), (("kv",), k)])
                    yield from wait_groups(c, 1)
                    need(c, "S", r, "S^T")
                check(stage_block[s] == r, f"wg{c} reads lse2 of block {r} from stage {s} = {stage_block[s]}")

                def issue_dv():
                    nonlocal last_dv
                    if last_dv is not None:
                        need(c, "dV", last_dv, "the P^T fragments it rewrites")
                    last_dv = r
                    dv_blocks.append(r)
                    issue(c, "dV", r, [(("stage", s), r)])

                if early_dv:
                    issue_dv()
                    yield
                    yield from wait_groups(c, 1)
                else:
                    yield from wait_groups(c, 0)
                need(c, "dP", r, "dP^T")
                check(stage_block[s] == r, f"wg{c} reads D_i of block {r} from stage {s} = {stage_block[s]}")
                if last_dk is not None:
                    need(c, "dK", last_dk, "the dS^T fragments it rewrites")
                last_dk = r
                dk_blocks.append(r)
                if not early_dv:
                    issue_dv()
                    yield
                check(not inflight_reads(("sds", buf, c)), f"wg{c} writes sdS[{buf}] under a wgmma that reads it")
                # the staging tiles overlap both warpgroups' dS^T rows (D = 64: buffer 0; D = 128: both buffers)
                check(not any(epi_reading), f"wg{c} writes dS^T of block {r} while staging reads {epi_reading} run")
                sds[buf][c] = r
                yield
                yield lambda: not bulk_reads[c]
                yield from barrier3(c)
                issue(c, "dQ", r, [(("sds", buf, 0), r), (("sds", buf, 1), r), (("kv",), k)])
                issue(c, "dK", r, [(("stage", s), r)])
                yield

                def issue_next():
                    last = it + 1 == n_iter
                    nx = r if last else r + 1
                    s1 = nx % stages
                    yield lambda: full[s1].passed((nx // stages) & 1)
                    holds[s1].add(c)
                    issue(c, "S", nx, [(("stage", s1), nx), (("kv",), k)])

                yield from wait_groups(c, 1)
                if early_s:
                    yield from issue_next()
                need(c, "dQ", r, "dQ")
                check(not bulk_reads[c], f"wg{c} writes its sdQ tile while a bulk add reads it")
                sdq[c] = r
                bulk_reads[c].append(r)
                yield
                if nxt:
                    if not early_s:
                        yield from issue_next()
                    yield from wait_groups(c, 1)
                    need(c, "dK", r, "dK (stage release)")
                    if it + 1 < n_iter:
                        holds[s].discard(c)
                        empty[s].arrive()
                else:
                    yield from wait_groups(c, 0)
                    holds[s].discard(c)
                    empty[s].arrive()
            if nxt:
                yield from wait_groups(c, 0)  # the discarded S^T
                if n_iter > 0:
                    s = ring_of(k, n_iter - 1) % stages
                    holds[s].discard(c)
                    empty[s].arrive()
            check(not groups[c], f"wg{c} ends tile {k} with wgmmas in flight")
            if n_iter > 0:
                kv_holds.discard(c)
                kv_empty.arrive()
                kv_n += 1
            for r in dk_blocks:
                need(c, "dK", r, "dK at the epilogue")
            for r in dv_blocks:
                need(c, "dV", r, "dV at the epilogue")
            # epilogue: barrier, stage dK/dV into sdS (both buffers, conservatively), read it back, barrier
            if mutation != "no_epi_start_barrier":
                yield from barrier3(c)
            check(not inflight_reads(("sds", 0, 0)) and not inflight_reads(("sds", 0, 1)) and
                  not inflight_reads(("sds", 1, 0)) and not inflight_reads(("sds", 1, 1)),
                  f"wg{c} stages dK/dV of tile {k} in sdS under a dQ wgmma")
            epi_reading[c] = True
            for b in (0, 1):
                sds[b][c] = ("epi", k)  # its staging tile covers (at least) rows of its own in each buffer
            yield
            yield
            epi_reading[c] = False
            if mutation != "no_epi_end_barrier":
                yield from barrier3(c)
            if dynamic:  # take the next tile (the kernel's fc_hp_take)
                e = k % 2
                yield lambda e=e, k=k: tile_full[e].passed((k // 2) & 1)
                check(entry[e] == k + 1, f"wg{c} takes tile {entry[e]} from entry {e}, wants {k + 1}")
                takers[e].add(c)
                tile_empty[e].arrive()
        yield lambda: not bulk_reads[c]
        done[1 + c] = True

    def land(f):
        if f[0] == "stage":
            _, s, blk = f
            check(not inflight_reads(("stage", s)), f"block {blk} lands in stage {s} under a wgmma")
            stage_block[s] = blk
            full[s].complete_tx(1)
        else:
            check(not inflight_reads(("kv",)), f"K/V of tile {f[1]} land under a wgmma")
            kv_tile[0] = f[1]
            kv_full.complete_tx(1)

    def bulk_read(c, blk):
        check(sdq[c] == blk, f"bulk add of block {blk} read wg{c}'s tile holding block {sdq[c]}")

    run(rng, [producer(), consumer(0), consumer(1)], done, tma, groups, bulk_reads, retired, land, bulk_read)


PERSIST_VERSIONS = {"D128 V3 persistent": (2, True, True, False), "D64 V2 persistent": (2, False, False, False)}
ORDERS = {"stride": False, "dynamic": True}


def persist_main(rng_tiles=random.Random(1)):
    """Random tile lists (0..5 tiles of 0..6 blocks, zeros included) through the two persistent kernels, then each
    persistent mutation in each kernel it concerns. Returns (failures, missed)."""
    failures = runs = 0
    for version, (stages, nxt, early_dv, early_s) in PERSIST_VERSIONS.items():
        for order, dynamic in ORDERS.items():
            for seed in range(1500):
                tiles = [rng_tiles.choice((0, 1, 1, 2, 3, 4, 5, 6)) for _ in range(rng_tiles.randint(0, 5))]
                runs += 1
                try:
                    simulate_persist(tiles, stages, nxt, seed, early_dv=early_dv, early_s=early_s, dynamic=dynamic)
                except Violation as e:
                    failures += 1
                    if failures < 10:
                        print(f"{version} {order} tiles {tiles} seed {seed}: {e}")
    print(f"persistent protocol: {runs - failures}/{runs} interleavings clean")
    missed = 0
    for m, what in PERSIST_MUTATIONS.items():
        for name, (stages, nxt, early_dv, early_s) in PERSIST_VERSIONS.items():
            caught = False
            for tiles in ([3, 2, 4], [1, 0, 2, 3], [2, 3, 1, 2], [5, 1, 3]):
                for seed in range(300):
                    try:
                        simulate_persist(tiles, stages, nxt, seed, mutation=m, early_dv=early_dv, early_s=early_s,
                                         dynamic=m.startswith("claim"))
                    except (Violation, AssertionError):  # AssertionError: an mbarrier phase over-arrived
                        caught = True
                        break
                if caught:
                    break
            print(f"mutation {m:22s} {name:20s} ({what}): {'caught' if caught else 'NOT CAUGHT'}")
            missed += not caught
    return failures, missed


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
    p_failures, p_missed = persist_main()
    ok = failures == 0 and missed == 0 and p_failures == 0 and p_missed == 0
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
