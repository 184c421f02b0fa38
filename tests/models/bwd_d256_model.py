"""A model of the protocol of cuda-hopper's head-dim-256 backward kernel (src/cuda/hopper/bwd_d256.cuh: WHOLE with
EDV, the one D = 256 kernel), run under random interleavings with bwd_kernel_model.py's machinery. The orders before it
(the split products with the next block's Sᵀ issued early, without that, WHOLE without EDV) were deleted in commit
9993c62 (their code is at d79fa1c) and are no longer modelled. Agents: the producer thread (Q_i, lse2_i into a
ring of 2 stages; dO_i, D_i into one buffer), the two consumer warpgroups (each one agent: its 128 threads pass every
step together), and the asynchronous units: TMA copies landing, each warpgroup's wgmma groups completing in order,
bulk reduce-adds finishing their reads of sdQ.

Checks, each at the moment it matters:
  - no deadlock; every fill lands before its readers run, in the right phase (the right block);
  - a fill never starts on a Q stage or the dO buffer that a warpgroup still holds (first read .. release) or that an
    in-flight wgmma reads;
  - the dV, dQ, dK wgmmas find both warpgroups' halves of Pᵀ, dSᵀ of their own block in sP/sdS; nobody writes a
    buffer of sP/sdS that an in-flight wgmma (of either warpgroup) reads;
  - WHOLE (warpgroup 0 computes all of Sᵀ and writes all of Pᵀ, warpgroup 1 all of dPᵀ and, after named barrier P,
    reads Pᵀ back and writes all of dSᵀ; ps[buffer][0] stands for sP, ps[buffer][1] for sdS): warpgroup 1 reads the
    Pᵀ of its own block, over the whole read (nobody rewrites it meanwhile); barrier P is modelled as the hardware
    counts it (arrivals of either warpgroup; bar.arrive does not wait);
  - EDV (WHOLE with dV issued before barrier B: warpgroup 0 once its Pᵀ is in sP, warpgroup 1 right after barrier P,
    both releasing dO_i once their dV retired, before B): dV finds Pᵀ of its block in sP and dO_i in the buffer;
  - sdQ: a warpgroup writes its tile (twice per block) only when no bulk add still reads it, and each bulk add reads
    what it was issued for;
  - registers: Sᵀ, dPᵀ, both dQ halves are read only after their group retired; dK, dV at the end after all.
Deliberately broken protocols (MUTATIONS) must each be caught in every kernel they concern.

    python3 tests/models/bwd_d256_model.py      (0..9, 13, 24 blocks; 300 seeds each; the mutations)
"""
import functools
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bwd_kernel_model import caught, check, clean, groups_at_most, run, sync_both, verdict  # noqa: E402
from protocol_model import MBar  # noqa: E402

MUTATIONS = {
    "single_ps": "one sP/sdS buffer (with the single barrier per block)",
    "release_do_before_dv": "dO released before the wait that retires dV",
    "release_q_before_dk": "the Q stage released before the wait that retires dK",
    "no_wait_read": "dQ_0 written into sdQ without waiting for the last block's second bulk read",
    "no_wait_read_half": "dQ_1 written into sdQ without waiting for dQ_0's bulk read",
    "dq1_early": "dQ_1 stored after the wait that retires dV and dQ_0 only",
    "no_bar_p": "WHOLE: warpgroup 1 reads Pᵀ without waiting at barrier P",
    "p_arrive_early": "WHOLE: warpgroup 0 arrives at barrier P before it writes Pᵀ",
    "p_arrive_after_b": "WHOLE: warpgroup 0 arrives at barrier P after barrier B",
    "whole_next_do_parity": "WHOLE: warpgroup 1's early dPᵀ waits for dO with block it's parity",
    "edv_before_bar_p": "EDV: warpgroup 1 issues dV before barrier P",
    "edv_no_do_wait": "EDV: warpgroup 0 issues dV without its wait for dO_i",
}


def simulate(n_iter, seed, mutation=None):
    """The kernel's consumers over n_iter query blocks: each block's Sᵀ (warpgroup 0) or dPᵀ (1) issued in the trip
    before (the last trip issues its own block's again, discarded), dV issued before barrier B."""
    rng = random.Random(seed)
    q_full, q_empty = [MBar(1), MBar(1)], [MBar(2), MBar(2)]  # one arrival per warpgroup stands for its 128 threads'
    do_full, do_empty = MBar(1), MBar(2)
    q_block, do_block = [None, None], [None]  # which block each buffer holds (None: being written)
    q_holds, do_holds = [set(), set()], set()
    ps = [[None, None], [None, None]]  # sP/sdS [buffer][warpgroup's half] = block
    sdq = [None, None]  # each warpgroup's tile: (block, half)
    bulk_reads = [[], []]
    groups = [[], []]
    retired = [set(), set()]
    tma = []  # in-flight fills: ("q", s, block) or ("do", 0, block)
    bar3 = {"arrived": 0, "gen": 0}
    barp = {"arrived": 0, "gen": 0}  # named barrier P: completes at two warpgroups' arrivals, whoever's
    done = [False, False, False]

    def inflight_reads(res):
        return [(c, g) for c in (0, 1) for g in groups[c] if res in g["reads"]]

    def issue(c, name, block, reads):
        for res, want in reads:
            have = {"q": lambda r: q_block[r[1]], "do": lambda r: do_block[0], "ps": lambda r: ps[r[1]][r[2]],
                    "sK": lambda r: want}[res[0]](res)
            check(have == want, f"wg{c} {name}[{block}] reads {res} holding block {have}")
        groups[c].append({"name": name, "block": block, "reads": set(r for r, _ in reads)})

    def need(c, name, block, what):
        check((name, block) in retired[c], f"wg{c} reads {what} before {name}[{block}] retired")

    wait_groups = functools.partial(groups_at_most, groups)  # wait_groups(c, n): wgmma.wait_group n
    barrier3 = functools.partial(sync_both, bar3)  # barrier3(c): the two warpgroups' 256-thread barrier

    def barp_arrive():
        barp["arrived"] += 1
        if barp["arrived"] == 2:
            barp["arrived"], barp["gen"] = 0, barp["gen"] + 1

    def barp_sync():
        gen = barp["gen"]
        barp_arrive()
        yield lambda: barp["gen"] != gen

    def whole_first(c, it):
        """WHOLE: the wait before this warpgroup's product of block it (Sᵀ: Q_i; dPᵀ: dO_i) and its issue."""
        if c == 0:
            yield lambda: q_full[it & 1].passed((it >> 1) & 1)
            q_holds[it & 1].add(c)
            issue(c, "S", it, [(("q", it & 1), it), (("sK",), None)])
        else:
            parity = (it - 1 if mutation == "whole_next_do_parity" and it > 0 else it) & 1
            yield lambda: do_full.passed(parity)
            do_holds.add(c)
            issue(c, "dP", it, [(("do",), it)])

    def whole_ps(c, it, s, u, buf):
        """WHOLE: Pᵀ (warpgroup 0) or dSᵀ (1) into buffer buf, barrier P, the wait for the other fill."""
        yield from wait_groups(c, 0)
        need(c, "S" if c == 0 else "dP", it, "Sᵀ" if c == 0 else "dPᵀ")
        if c == 0:
            check(q_block[s] == it, f"wg0 reads lse2 of block {it} from stage {s} = {q_block[s]}")
            if mutation == "p_arrive_early":
                barp_arrive()
            check(not inflight_reads(("ps", buf, 0)), f"wg0 writes sP[{buf}] under a wgmma that reads it")
            ps[buf][0] = None  # being written
            yield
            ps[buf][0] = it
            if mutation not in ("p_arrive_early", "p_arrive_after_b"):
                barp_arrive()
            if mutation != "edv_no_do_wait":
                yield lambda: do_full.passed(it & 1)  # dO_i for dV
            do_holds.add(c)
            yield from early_dv(c, it, buf)
        else:
            if mutation == "edv_before_bar_p":
                yield from early_dv(c, it, buf, wait=False)
            if mutation != "no_bar_p":
                yield from barp_sync()
            if mutation != "edv_before_bar_p":
                yield from early_dv(c, it, buf, wait=False)
            check(ps[buf][0] == it, f"wg1 reads Pᵀ of block {it} from sP[{buf}] holding {ps[buf][0]}")
            check(do_block[0] == it, f"wg1 reads D_i of block {it} from dO's buffer = {do_block[0]}")
            yield
            check(ps[buf][0] == it, f"wg1's read of Pᵀ of block {it}: sP[{buf}] rewritten to {ps[buf][0]} under it")
            check(not inflight_reads(("ps", buf, 1)), f"wg1 writes sdS[{buf}] under a wgmma that reads it")
            ps[buf][1] = it
            yield
            yield from early_dv_release(c, it)
            # Q_i for dK. Warpgroup 0 waited for it before barrier B already, so leaving this out breaks nothing the
            # model sees: the kernel keeps it so that each reader of a fill has its own acquire of the fill's barrier.
            yield lambda: q_full[s].passed(u & 1)
            q_holds[s].add(c)

    def early_dv(c, it, buf, wait=True):
        """EDV: dV_j += Pᵀ·dO_i issued before barrier B (it reads sP and dO only); warpgroup 0 waits for it and
        releases dO_i at once, warpgroup 1 after its dSᵀ (early_dv_release)."""
        issue(c, "dV", it, [(("ps", buf, 0), it), (("do",), it)])
        yield
        if wait:
            yield from early_dv_release(c, it)

    def q_release(c, s):
        q_holds[s].discard(c)
        q_empty[s].arrive()

    def early_dv_release(c, it):
        if mutation == "release_do_before_dv":
            do_holds.discard(c)
            do_empty.arrive()
        yield from wait_groups(c, 0)
        need(c, "dV", it, "dV")
        if mutation != "release_do_before_dv":
            do_holds.discard(c)
            do_empty.arrive()

    def producer():
        for it in range(n_iter):
            s, u = it & 1, it >> 1
            if u > 0:
                yield lambda: q_empty[s].passed((u - 1) & 1)
            check(not q_holds[s], f"Q fill of block {it} into stage {s} while warpgroups {q_holds[s]} hold it")
            check(not inflight_reads(("q", s)), f"Q fill of block {it} into stage {s} under a wgmma")
            q_full[s].arrive(expect_tx=1)
            q_block[s] = None
            tma.append(("q", s, it))
            yield
            if it > 0:
                yield lambda: do_empty.passed((it - 1) & 1)
            check(not do_holds, f"dO fill of block {it} while warpgroups {do_holds} hold it")
            check(not inflight_reads(("do",)), f"dO fill of block {it} under a wgmma")
            do_full.arrive(expect_tx=1)
            do_block[0] = None
            tma.append(("do", 0, it))
        done[0] = True

    def store_dq(c, it, half):
        check(not bulk_reads[c], f"wg{c} writes dQ_{half} of block {it} into its sdQ tile under a bulk read")
        sdq[c] = (it, half)
        bulk_reads[c].append((it, half))

    def consumer(c):
        if n_iter > 0:
            yield from whole_first(c, 0)
        for it in range(n_iter):
            s, u = it & 1, it >> 1
            buf = 0 if mutation == "single_ps" else it & 1
            yield from whole_ps(c, it, s, u, buf)
            if mutation != "no_wait_read":
                yield lambda: not bulk_reads[c]
            yield from barrier3(c)  # B
            if mutation == "p_arrive_after_b" and c == 0:
                barp_arrive()
            both = [(("ps", buf, 0), it), (("ps", buf, 1), it)]
            issue(c, "dQ0", it, both + [(("sK",), None)])
            issue(c, "dQ1", it, both + [(("sK",), None)])
            issue(c, "dK", it, both + [(("q", s), it)])
            yield
            yield from wait_groups(c, 2)
            need(c, "dV", it, "dV")
            need(c, "dQ0", it, "dQ_0")
            if mutation == "release_q_before_dk":
                q_release(c, s)
            store_dq(c, it, 0)
            yield
            yield from whole_first(c, it + 1 if it + 1 < n_iter else it)
            if mutation != "dq1_early":
                yield from wait_groups(c, 2)
            need(c, "dQ1", it, "dQ_1")
            if mutation != "no_wait_read_half":
                yield lambda: not bulk_reads[c]
            store_dq(c, it, 1)
            yield
            yield from wait_groups(c, 1)
            need(c, "dK", it, "dK (Q stage release)")
            if mutation != "release_q_before_dk":
                q_release(c, s)
        yield from wait_groups(c, 0)
        yield lambda: not bulk_reads[c]
        for it in range(n_iter):
            need(c, "dK", it, "dK at the end")
            need(c, "dV", it, "dV at the end")
        yield from barrier3(c)  # the epilogue's
        done[1 + c] = True

    def land(f):
        what, s, blk = f
        if what == "q":
            check(not inflight_reads(("q", s)), f"Q of block {blk} lands in stage {s} under a wgmma")
            q_block[s] = blk
            q_full[s].complete_tx(1)
        else:
            check(not inflight_reads(("do",)), f"dO of block {blk} lands under a wgmma")
            do_block[0] = blk
            do_full.complete_tx(1)

    def bulk_read(c, got):
        check(sdq[c] == got, f"bulk add of {got} read wg{c}'s tile holding {sdq[c]}")

    run(rng, [producer(), consumer(0), consumer(1)], done, tma, groups, bulk_reads, retired, land, bulk_read)


def main():
    failures = clean({"D256": simulate}, list(range(0, 10)) + [13, 24])
    missed = 0
    for m, what in MUTATIONS.items():
        hit = caught(functools.partial(simulate, mutation=m))
        print(f"mutation {m:20s} ({what}): {'caught' if hit else 'NOT CAUGHT'}")
        missed += not hit
    return verdict(failures, missed)


if __name__ == "__main__":
    sys.exit(main())
