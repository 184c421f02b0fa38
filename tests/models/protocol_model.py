"""A model of cuda-hopper's forward mbarrier protocols (src/cuda/hopper/fwd.cu, hopper/fwd_persistent.cuh), run under random
interleavings: the producer thread and the consumer warps (2 warpgroups x 4; 3 x 4 in the persistent kernel at
D = 64) execute the kernel's barrier operations in the kernel's order; TMA copies land at random later times. Checks:
no deadlock, every consumer read finds the tile it expects in its stage, and no copy overwrites a stage that a
consumer is still reading.

    python3 tests/models/protocol_model.py

The kernels modelled are the ones that run (fc_hp_fwd_plan_of): the one-tile ping-pong kernel (fc_hopper_fwd_kernel
at D = 128 and 256: 2 consumers, 2 stages; simulate), and the persistent kernel (fc_hopper_fwd_persistent_kernel) at
D = 64 (3 consumers, 3 stages, two Q slots), D = 128 (2 consumers, 2 stages, two Q slots) and D = 256 (2 consumers,
2 stages, one Q slot: no room for a second; PERSISTENT_SHAPES). The other variants (simple, overlap, the one-tile
kernel with 3 consumers, 3 stages at D = 64 with 2 consumers, one Q slot at D <= 128) were deleted in commit 9993c62
(their code is at d79fa1c) and are no longer modelled. Both kernels' warpgroups stop at their own last key block
(fc_hp_own_blocks) and run dummy trips for the rest of the tile's blocks.

The persistent kernel (tile ring and dummy trips): the round-robin turns form one chain over all the CTA's tiles, the
last consumer arriving once before the first tile and consumer 0 taking the last hand-over with one more bar.sync
after its last tile. The producer publishes every tile with rows in a 2-entry tile ring guarded by
mbarriers before its loads, then an end marker; the consumer warps take each tile from the ring (the next one only
after the dummy trips: blocks past a warpgroup's own last block, one turn each and their K and V released unused);
Q_i has two slots (one at D = 256). Under static orders (each CTA's list of tiles given: the stride order) and under
the dynamic order (fc_hp_fwd_plan_of's choice at D = 64 and 128 with a causal-like mask, and at D = 128 unmasked up to
1024 keys: 1..3 CTAs share a claim counter; every position with rows must be walked by one CTA).

A tile is "in use" from the wgmma that reads it until the wgmma.wait_group that covers that wgmma, whatever
the release does; so a release that comes too early shows up as a copy overwriting a tile in use. The model
also runs itself against deliberately broken protocols (MUTATIONS) and fails if it does not catch them.

mbarrier semantics modelled (PTX ISA): a phase completes when its pending arrival count reaches 0 and its
transaction count is 0; try_wait.parity(P) succeeds once the phase of parity P has completed, i.e. when the
current phase's parity differs from P (a fresh barrier is in phase 0, so parity 1 passes at once).
Named barriers of the ping-pong are modelled too (bar.sync counts itself and waits; bar.arrive counts only).
"""
import functools
import random
import sys


class MBar:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, expect_tx=0):
        assert self.pending > 0, "more arrivals than the count in one phase"
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        assert self.tx >= 0, "bytes landed before they were announced"
        self._maybe_complete()

    def passed(self, parity):
        return (self.phase & 1) != parity


class NamedBar:
    def __init__(self, threads):
        self.threads, self.arrived, self.generation = threads, 0, 0

    def add(self, n):
        self.arrived += n
        assert self.arrived <= self.threads, "named barrier over-subscribed"
        if self.arrived == self.threads:
            self.arrived = 0
            self.generation += 1

    def sync(self, n):
        """bar.sync by n threads: arrive, then wait for the phase to complete."""
        target = self.generation + 1
        self.add(n)
        while self.generation < target:
            yield "blocked"


def wait(bar, parity):
    """mbarrier try_wait on `parity` until it passes."""
    while not bar.passed(parity):
        yield "blocked"


class Smem:
    """A CTA's shared-memory stages that TMA fills: bufs[kind][stage] holds the tile that landed there last, in_flight
    the copies issued and not landed yet (bar, kind, stage, tile), readers the warps whose wgmma reads a stage."""

    def __init__(self, stages, q_slots):
        self.bufs = {"Q": [None] * q_slots, "K": [None] * stages, "V": [None] * stages}
        self.readers = {(kind, s): set() for kind, b in self.bufs.items() for s in range(len(b))}
        self.in_flight = []

    def tma(self, bar, kind, stage, tile):
        if self.readers[(kind, stage)]:
            raise AssertionError(f"TMA overwrites {kind} stage {stage} while {self.readers[(kind, stage)]} read it")
        self.in_flight.append((bar, kind, stage, tile))

    def read(self, kind, s, tile, who):
        found = self.bufs[kind][s]
        assert found == tile, f"{who} expected {kind}{tile} in stage {s}, found {kind}{found}"
        self.readers[(kind, s)].add(who)

    def done(self, kind, s, who):  # the wgmma.wait_group covering the read of this tile
        self.readers[(kind, s)].discard(who)


MUTATIONS = {
    "v_released_at_wait1": "the loop releases V_{n-1} after wait_group 1 (its P.V may still run)",
    "producer_skips_empty_wait": "producer refills a K stage without waiting for its release",
    "consumer_wrong_parity": "consumers wait for full_k with the parity of the next use",
    "pingpong_no_skip": "consumer 1 hands the turn over after its last group too",
    "pingpong_wrong_skip": "consumer 0, not the last consumer, skips its last hand-over",
    "dummy_no_turn": "a warpgroup's dummy trips release K and V but take no turn",
    "dummy_last_v_kept": "a warpgroup that stops early keeps V_{own-1} (as a tile's last V) before its dummy trips",
}
ONE_TILE_DUMMY_MUTATIONS = ("dummy_no_turn", "dummy_last_v_kept")


def simulate(n_blocks, stages, seed, mutation=None, own=None):
    """The one-tile ping-pong kernel (fc_hopper_fwd_kernel): 2 consumer warpgroups taking turns, each issuing S_n and
    P_{n-1}.V_{n-1} back to back and releasing V_{n-2} at the start of trip n. own: each warpgroup's own key blocks
    (1 .. n_blocks, fc_hp_own_blocks), None for all: past them it releases V_{own-2} and V_{own-1} and runs one dummy
    trip per block (a turn, then K and V released after their full waits)."""
    rng = random.Random(seed)
    nc = 2  # consumer warpgroups
    q_full = MBar(1)
    full_k = [MBar(1) for _ in range(stages)]
    full_v = [MBar(1) for _ in range(stages)]
    empty_k = [MBar(4 * nc) for _ in range(stages)]
    empty_v = [MBar(4 * nc) for _ in range(stages)]
    turn = [NamedBar(256) for _ in range(nc)]  # one per consumer warpgroup; counted in warps of 32
    smem = Smem(stages, 1)
    tma, read, done = smem.tma, smem.read, smem.done

    def producer():
        q_full.arrive(expect_tx=1)
        tma(q_full, "Q", 0, 0)
        for n in range(n_blocks + 1):
            if n < n_blocks:
                s, u = n % stages, n // stages
                if u > 0 and mutation != "producer_skips_empty_wait":
                    yield from wait(empty_k[s], (u - 1) & 1)
                full_k[s].arrive(expect_tx=1)
                tma(full_k[s], "K", s, n)
            if n > 0:
                s, u = (n - 1) % stages, (n - 1) // stages
                if u > 0:
                    yield from wait(empty_v[s], (u - 1) & 1)
                full_v[s].arrive(expect_tx=1)
                tma(full_v[s], "V", s, n - 1)
            yield "step"

    def release(bar):
        bar.arrive()

    def consumer(cw, warp):
        who = (cw, warp)
        n_own = n_blocks if own is None else own[cw]

        def my_turn():
            yield from turn[cw].sync(32)

        def your_turn(last):
            skipper = 0 if mutation == "pingpong_wrong_skip" else nc - 1
            if mutation == "pingpong_no_skip" or not (last and cw == skipper):
                turn[cw ^ 1].add(32)  # the other consumer's turn

        yield from wait(q_full, 0)
        if n_blocks == 0:
            return
        if cw == nc - 1:
            turn[0].add(32)  # consumer 0 first
        # block 0
        yield from wait(full_k[0], 0)
        yield from my_turn()
        read("K", 0, 0, who)
        your_turn(False)
        yield "wgmma"
        done("K", 0, who)  # wait_group 0
        release(empty_k[0])
        for n in range(1, n_own):
            sn, un, sp, up = n % stages, n // stages, (n - 1) % stages, (n - 1) // stages
            pk = (un + 1) & 1 if mutation == "consumer_wrong_parity" else un & 1
            if n >= 2 and mutation != "v_released_at_wait1":  # V_{n-2}: its P.V was waited for last trip
                release(empty_v[(n - 2) % stages])
            yield from wait(full_k[sn], pk)
            yield from wait(full_v[sp], up & 1)
            yield from my_turn()
            read("K", sn, n, who)
            read("V", sp, n - 1, who)
            your_turn(False)
            yield "wgmma"
            done("K", sn, who)  # wait_group 1: S done, P.V may still run
            release(empty_k[sn])
            if mutation == "v_released_at_wait1":
                release(empty_v[sp])
            yield "softmax"
            yield "wgmma"
            done("V", sp, who)  # wait_group 0: P.V done
        sl, ul = (n_own - 1) % stages, (n_own - 1) // stages
        yield from wait(full_v[sl], ul & 1)
        yield from my_turn()
        read("V", sl, n_own - 1, who)
        your_turn(n_own == n_blocks)
        yield "wgmma"
        done("V", sl, who)  # the tile's last two V stages are never released: no fill waits for them
        if n_own < n_blocks:  # the producer refills V_{own-2}'s and V_{own-1}'s stages for the skipped blocks
            if n_own >= 2:
                release(empty_v[(n_own - 2) % stages])
            if mutation != "dummy_last_v_kept":
                release(empty_v[sl])
            for n in range(n_own, n_blocks):  # dummy trips: every key masked for this warpgroup's rows
                sn, un = n % stages, n // stages
                yield from wait(full_k[sn], un & 1)
                if mutation != "dummy_no_turn":
                    yield from my_turn()
                    your_turn(n == n_blocks - 1)
                release(empty_k[sn])
                yield from wait(full_v[sn], un & 1)
                release(empty_v[sn])

    def end_check():  # nothing left pending on the turn barriers
        assert all(b.arrived == 0 for b in turn), \
            f"named barrier arrivals left pending at exit: {[b.arrived for b in turn]}"

    actors = [producer()] + [consumer(cw, w) for cw in range(nc) for w in range(4)]
    run_ctas([(actors, smem, end_check)], rng)


# ---- the persistent kernel (src/cuda/hopper/fwd_persistent.cuh): one CTA over several tiles ------------------------
PERSISTENT_MUTATIONS = {
    "p_counts_per_tile": "stage and parity counted from 0 in every tile, not over the CTA's life",
    "p_last_v_kept": "the tile's last V stage is never released (as the one-tile kernel may)",
    "p_q_released_first": "Q_i released at the start of the tile, before its S wgmmas",
    "p_q_not_waited": "the producer loads the next Q_i without waiting for its slot's q_empty",
    "p_q_one_slot": "two Q slots in the parity arithmetic, but every Q_i loaded into slot 0",
    "p_take_before_dummy": "the next tile taken from the ring before this tile's dummy trips (it hung)",
    "p_dummy_no_turn": "a warpgroup's dummy trips release K and V but take no turn",
    "p_dummy_v_kept": "a dummy trip releases K only, never V",
    # tmastore3 (3 consumers, turns chained across tiles)
    "p3_counts_of_two": "3 consumers with the 2-consumer arrival counts (8) on q_empty and the empty barriers",
    "p3_skip_per_tile": "the last consumer skips its hand-over after every tile's last group, as the one-tile kernel",
    "p3_no_final_wait": "consumer 0 does not take the last hand-over at the end of the CTA's life",
    "p3_turn_in_empty_tile": "the last consumer hands the turn over once in a tile with no key block",
}

# the dynamic order (src/cuda/hopper/fwd.cu's fc_hp_fwd_plan_of): several CTAs claim positions of one order with a shared
# counter
DYNAMIC_MUTATIONS = {
    "d_consumer_skips_tile": "consumer 1 takes the next ring entry at once after its first loaded one from the ring, "
                             "skipping a tile the producer loads",
    "d_ring_not_waited": "the producer overwrites a ring entry without waiting for the consumers' release",
    "d_claim_without_grid": "the claim forgets the grid: positions 0 .. grid - 1 are handed out twice",
    "d_no_sentinel": "the producer stops without publishing the end marker",
}

TILE_RING = 2  # entries of the tile ring (FC_HP_TILE_RING)
Q_SLOTS = 2  # Q_i buffers (use u in slot u % Q_SLOTS); 1 at D = 256, where sQ and the K/V ring fill shared memory


class Order:
    """Where a CTA's tiles come from. Static: its own list (tile id = index in it). Dynamic: one list of all
    positions (weights[t]: key blocks of position t, 0 = no load, None = no row in its sequence: never published)
    shared by `grid` CTAs; CTA c takes position c first, then its producer claims grid + counter (the kernel's
    atomicAdd) after each tile's loads. own[t]: each consumer warpgroup's own key blocks of tile t (1 .. n_blocks,
    fc_hp_own_blocks; the rest are its dummy trips), or None for all n_blocks."""

    def __init__(self, weights, grid=None, own=None):
        self.weights, self.grid, self.counter, self.own = weights, grid, 0, own or {}
        self.walked = []  # (cta, position) for each position a CTA's consumers walked


def persistent_cta(order, cta, stages, mutation, nc, q_slots=Q_SLOTS):
    """One CTA of the persistent kernel (tile ring, dummy trips): (actors, smem, end_check). The producer
    walks the positions of `order` (static: the CTA's list; dynamic: claimed), publishes each tile with rows in the
    2-entry tile ring before its loads, then an end marker; every consumer warp takes each tile from the ring (the
    first at its start, the next after the last P.V and the dummy trips of the one before). Q_i in q_slots slots (2;
    1 at D = 256: the next tile's Q_i lands once every warp waited for this tile's last S)."""
    dynamic = order.grid is not None
    arrivals = 8 if mutation == "p3_counts_of_two" else 4 * nc  # one per consumer warp
    q_full = [MBar(1) for _ in range(q_slots)]
    q_empty = [MBar(arrivals) for _ in range(q_slots)]
    full_k = [MBar(1) for _ in range(stages)]
    full_v = [MBar(1) for _ in range(stages)]
    empty_k = [MBar(arrivals) for _ in range(stages)]
    empty_v = [MBar(arrivals) for _ in range(stages)]
    tile_full = [MBar(1) for _ in range(TILE_RING)]
    # lane 0 of each consumer warp reads the entry, shuffles it to its warp and arrives (rather than every
    # lane reading it and lane 0 arriving after a __syncwarp: racecheck flagged that)
    tile_empty = [MBar(4 * nc) for _ in range(TILE_RING)]
    ring = [None] * TILE_RING  # (fill number, position): the fill number checks that a reader gets its entry
    turn = [NamedBar(256) for _ in range(nc)]
    turn_order = []  # the consumer whose warp 0 passed a turn, in order
    walked = {}  # consumer warp -> the positions it walked
    smem = Smem(stages, q_slots)
    tma, read, done = smem.tma, smem.read, smem.done
    per_tile = mutation == "p_counts_per_tile"

    def n_own(t, cw):
        own = order.own.get(t)
        return order.weights[t] if own is None else own[cw]

    def publish(fill, pos):
        """The producer's tile `fill` (-1: the end marker) into the ring."""
        e, u = fill % TILE_RING, fill // TILE_RING
        if u > 0 and mutation != "d_ring_not_waited":
            yield from wait(tile_empty[e], (u - 1) & 1)
        ring[e] = (fill, pos)
        tile_full[e].arrive()

    def take(use, who):
        e = use % TILE_RING
        yield from wait(tile_full[e], (use // TILE_RING) & 1)
        fill, pos = ring[e]
        assert fill == use, f"{who} took ring fill {fill} in place of {use}"
        yield "read"
        tile_empty[e].arrive()
        return pos

    def next_position(ti):
        """The position after ti (static: the next of the list; dynamic: claimed, -1 when none is left)."""
        if not dynamic:
            return ti + 1 if ti + 1 < len(order.weights) else -1
        nxt = order.counter + (0 if mutation == "d_claim_without_grid" else order.grid)  # the atomicAdd
        order.counter += 1
        yield "claimed"
        return nxt if nxt < len(order.weights) else -1

    def producer():
        kfill = vfill = qfill = tfill = 0
        ti = (cta if cta < len(order.weights) else -1) if dynamic else (0 if order.weights else -1)
        while ti >= 0:
            n_blocks = order.weights[ti]
            if n_blocks is not None:  # rows in its sequence: published, loaded when it sees a key
                yield from publish(tfill, ti)
                tfill += 1
                if n_blocks and per_tile:
                    kfill = vfill = 0
                for n in range(n_blocks + 1 if n_blocks else 0):
                    if n < n_blocks:
                        s, u = kfill % stages, kfill // stages
                        if u > 0:
                            yield from wait(empty_k[s], (u - 1) & 1)
                        full_k[s].arrive(expect_tx=1)
                        tma(full_k[s], "K", s, (ti, n))
                        kfill += 1
                    if n == 0:
                        qs = 0 if mutation == "p_q_one_slot" else qfill % q_slots
                        qu = qfill // q_slots
                        if qu > 0 and mutation != "p_q_not_waited":
                            yield from wait(q_empty[qs], (qu - 1) & 1)
                        q_full[qs].arrive(expect_tx=1)
                        tma(q_full[qs], "Q", qs, ti)
                        qfill += 1
                    else:
                        s, u = vfill % stages, vfill // stages
                        if u > 0:
                            yield from wait(empty_v[s], (u - 1) & 1)
                        full_v[s].arrive(expect_tx=1)
                        tma(full_v[s], "V", s, (ti, n - 1))
                        vfill += 1
                    yield "step"
            ti = yield from next_position(ti)
        if mutation != "d_no_sentinel":
            yield from publish(tfill, -1)

    def consumer(cw, warp):
        who = (cta, cw, warp)
        walked[(cw, warp)] = []

        def my_turn():
            yield from turn[cw].sync(32)
            if warp == 0:
                turn_order.append(cw)

        def your_turn(last):
            if not (last and cw == nc - 1 and mutation == "p3_skip_per_tile"):
                turn[(cw + 1) % nc].add(32)  # round robin, the tile's last group included

        if cw == nc - 1:
            turn[0].add(32)  # consumer 0 first, once for the CTA's life
        kuse = vuse = quse = tuse = 0
        skipped = False  # mutation d_consumer_skips_tile
        ti = yield from take(tuse, who)
        tuse += 1
        while ti >= 0:
            n_blocks = order.weights[ti]
            walked[(cw, warp)].append(ti)
            if n_blocks == 0 and mutation == "p3_turn_in_empty_tile" and cw == nc - 1:
                turn[0].add(32)
            taken = False
            if n_blocks:
                own = n_own(ti, cw)
                if per_tile:
                    kuse = vuse = 0
                qs = 0 if mutation == "p_q_one_slot" else quse % q_slots
                yield from wait(q_full[qs], (quse // q_slots) & 1)
                if mutation == "p_q_released_first":
                    q_empty[qs].arrive()
                s0 = kuse % stages
                yield from wait(full_k[s0], (kuse // stages) & 1)
                yield from my_turn()
                read("Q", qs, ti, who)
                read("K", s0, (ti, 0), who)
                your_turn(False)
                yield "wgmma"
                done("Q", qs, who)
                done("K", s0, who)
                empty_k[s0].arrive()
                kuse += 1
                for n in range(1, own):
                    sn, sp = kuse % stages, vuse % stages
                    if n >= 2:
                        empty_v[(vuse - 1) % stages].arrive()  # V_{n-2}: its P.V was waited for last trip
                    yield from wait(full_k[sn], (kuse // stages) & 1)
                    yield from wait(full_v[sp], (vuse // stages) & 1)
                    yield from my_turn()
                    read("Q", qs, ti, who)
                    read("K", sn, (ti, n), who)
                    read("V", sp, (ti, n - 1), who)
                    your_turn(False)
                    yield "wgmma"
                    done("Q", qs, who)  # wait_group 1: S done
                    done("K", sn, who)
                    empty_k[sn].arrive()
                    yield "softmax"
                    yield "wgmma"
                    done("V", sp, who)  # wait_group 0
                    kuse += 1
                    vuse += 1
                sl = vuse % stages
                yield from wait(full_v[sl], (vuse // stages) & 1)
                if mutation != "p_q_released_first":
                    q_empty[qs].arrive()  # every S of the tile was waited for
                if own >= 2:
                    empty_v[(vuse - 1) % stages].arrive()  # V_{own-2}
                yield from my_turn()
                read("V", sl, (ti, own - 1), who)
                your_turn(own == n_blocks)
                yield "wgmma"
                done("V", sl, who)
                if mutation != "p_last_v_kept":
                    empty_v[sl].arrive()  # V_{own-1}
                vuse += 1
                quse += 1
                if mutation == "p_take_before_dummy" and own < n_blocks:
                    nxt = yield from take(tuse, who)
                    tuse += 1
                    taken = True
                for n in range(own, n_blocks):  # dummy trips: masked for all this warpgroup's rows
                    sn, sp = kuse % stages, vuse % stages
                    yield from wait(full_k[sn], (kuse // stages) & 1)
                    if mutation != "p_dummy_no_turn":
                        yield from my_turn()
                        your_turn(n == n_blocks - 1)
                    empty_k[sn].arrive()
                    yield from wait(full_v[sp], (vuse // stages) & 1)
                    if mutation != "p_dummy_v_kept":
                        empty_v[sp].arrive()
                    kuse += 1
                    vuse += 1
            yield "epilogue"
            if taken:
                ti = nxt
            else:
                ti = yield from take(tuse, who)
                tuse += 1
            if mutation == "d_consumer_skips_tile" and cw == 1 and not skipped and ti >= 0 and order.weights[ti]:
                skipped = True
                ti = yield from take(tuse, who)
                tuse += 1
        if cw == 0 and mutation != "p3_no_final_wait":
            yield from my_turn()  # the last consumer's last hand-over (or its first arrival: no tile loaded)

    def end_check():
        assert all(b.arrived == 0 for b in turn), \
            f"CTA {cta}: named barrier arrivals left pending at exit: {[b.arrived for b in turn]}"
        seqs = set(tuple(w) for w in walked.values())
        assert len(seqs) == 1, f"CTA {cta}: its consumer warps walked different tiles: {walked}"
        seq = seqs.pop()
        order.walked += [(cta, t) for t in seq]
        groups = sum(order.weights[t] + 1 for t in seq if order.weights[t])
        want = [c for _ in range(groups) for c in range(nc)] + [0]
        assert turn_order == want, f"CTA {cta}: turns taken in the order {turn_order}, not round robin {want}"

    actors = [producer()] + [consumer(cw, w) for cw in range(nc) for w in range(4)]
    return actors, smem, end_check


def run_ctas(ctas, rng):
    """Random interleaving of every CTA's producer and consumer warps, and of its copies' landing; ctas: (actors,
    smem, end_check) each, end_check() run once all is done."""
    actors = [(c, a) for c, cta in enumerate(ctas) for a in cta[0]]
    alive = list(range(len(actors)))
    stuck = 0
    while alive or any(c[1].in_flight for c in ctas):
        pending = [c[1] for c in ctas if c[1].in_flight]
        if pending and (not alive or rng.random() < 0.3):
            smem = rng.choice(pending)
            bar, kind, s, tile = smem.in_flight.pop(rng.randrange(len(smem.in_flight)))
            smem.bufs[kind][s] = tile
            bar.complete_tx(1)
            stuck = 0
            continue
        i = rng.choice(alive)
        try:
            r = next(actors[i][1])
            stuck = stuck + 1 if r == "blocked" else 0
        except StopIteration:
            alive.remove(i)
            stuck = 0
        if stuck > 5000 and not pending:
            raise AssertionError(f"deadlock: actors {alive} (of CTAs {sorted({actors[i][0] for i in alive})}) "
                                 "blocked forever")
    for c in ctas:
        c[2]()


def simulate_persistent(tiles, stages, seed, mutation=None, nc=2, own=None, q_slots=Q_SLOTS):
    """tiles: per tile of this CTA, its number of visible key blocks (0: no load at all, the epilogue only), or
    None for a tile with no row in its sequence (never published); own: {tile: each consumer's own blocks}. Models
    Q_i in q_slots slots, the K/V rings with fill/use counts kept over all tiles, the dummy trips and the ping-pong
    turns chained round robin over the CTA's life. Checks the order in which the consumers' warps 0 pass their turns:
    0, 1, (2,) 0, 1, (2,) ..."""
    rng = random.Random(seed)
    run_ctas([persistent_cta(Order(tiles, own=own), 0, stages, mutation, nc, q_slots)], rng)


def simulate_dynamic(weights, grid, stages, seed, mutation=None, nc=2, own=None, q_slots=Q_SLOTS):
    """The dynamic order: `grid` CTAs over the positions `weights` (as simulate_persistent's tiles), each CTA's
    producer claiming positions with the shared counter and handing them to its consumers through the tile ring,
    under random interleavings (so which CTA gets which position varies). Checks, besides each CTA's protocol, that
    all the warps of a CTA walk the same positions and that every position with rows is walked by exactly one CTA."""
    rng = random.Random(seed)
    order = Order(weights, grid, own)
    run_ctas([persistent_cta(order, c, stages, mutation, nc, q_slots) for c in range(grid)], rng)
    got = sorted(t for _, t in order.walked)
    want = [t for t, w in enumerate(weights) if w is not None]
    assert got == want, f"positions walked {got}, not each of {want} once"


def random_tiles(rng, n_min, n_max):
    return [None if rng.random() < 0.15 else rng.choice([0, 1, 1, 2, 3, 4, 5, 6])
            for _ in range(rng.randint(n_min, n_max))]


def random_own(rng, weights, nc):
    """Each consumer's own key blocks for about half the tiles of 2+ blocks (the others: all of them)."""
    return {t: tuple(rng.randint(1, w) for _ in range(nc))
            for t, w in enumerate(weights) if w and w >= 2 and rng.random() < 0.5}


DUMMY_MUTATIONS = ("p_take_before_dummy", "p_dummy_no_turn", "p_dummy_v_kept")
# (consumer warpgroups, Q slots, K/V stages) of the persistent kernels that run (hopper/fwd.cu's fc_hp_persistent):
# D = 128 (2 consumers, two Q slots, 2 stages), D = 256 (2, one Q slot, 2), D = 64 (tmastore3: 3, two Q slots, 3)
PERSISTENT_SHAPES = ((2, 2, 2), (2, 1, 2), (3, 2, 3))
D256_SHAPE = ((2, 1, 2),)
# the dynamic order runs at D = 64 and 128 only (fc_hp_fwd_plan_of: D = 256's persistent kernel runs unmasked, in the
# stride order, which the static orders model)
DYNAMIC_SHAPES = ((2, 2, 2), (3, 2, 3))
ONE_SLOT_MUTATIONS = ("p_q_released_first", "p_q_not_waited")  # checked again in D = 256's shape alone


def first_failure(cases):
    """Runs each (description, run) of `cases` until one fails: the failure's description and error (None when
    every run passed), and the number of runs that passed."""
    runs = 0
    for what, one in cases:
        try:
            one()
        except AssertionError as e:
            return f"{what}: {e}", runs
        runs += 1
    return None, runs


def persistent_cases(mutation=None, seeds=40, shapes=PERSISTENT_SHAPES):
    """Random tile lists (1..6 tiles of 0..6 key blocks, some with no rows, some with dummy trips) under random
    interleavings, in each shape of PERSISTENT_SHAPES."""
    for nc, q_slots, stages in shapes:
        for seed in range(seeds):
            rng = random.Random(1000 + seed)
            tiles = random_tiles(rng, 1, 6)
            if mutation and not any(tiles):
                tiles.append(3)
            if mutation and sum(1 for t in tiles if t) < 2:
                tiles += [2, 4]  # the cross-tile mutations need two loaded tiles to show
            if mutation == "p3_turn_in_empty_tile" and 0 not in tiles:
                tiles.insert(1, 0)
            own = random_own(rng, tiles, nc)
            if mutation in DUMMY_MUTATIONS:  # a tile whose first warpgroup runs dummy trips, then another
                own[len(tiles)] = (1,) + (5,) * (nc - 1)
                tiles += [5, 3]
            yield (f"persistent nc={nc} q_slots={q_slots} stages={stages} tiles={tiles} own={own} seed={seed}",
                   functools.partial(simulate_persistent, tiles, stages, seed, mutation, nc, own, q_slots))


def dynamic_cases(mutation=None, seeds=40):
    """The dynamic order: 1..3 CTAs over 1..12 positions (at least one per CTA, as the host's grid = min(tiles,
    SMs)), random weights with tiles without rows, empty tiles and dummy trips, in each shape of DYNAMIC_SHAPES."""
    for nc, q_slots, stages in DYNAMIC_SHAPES:
        for seed in range(seeds):
            rng = random.Random(5000 + seed)
            grid = rng.randint(1, 3)
            weights = random_tiles(rng, grid, 12)
            if mutation:
                weights += [rng.choice([0, None, 2]) for _ in range(3)] + [3, 1, 2] * grid  # several tiles per CTA
            own = random_own(rng, weights, nc)
            yield (f"dynamic nc={nc} q_slots={q_slots} stages={stages} grid={grid} weights={weights} seed={seed}",
                   functools.partial(simulate_dynamic, weights, grid, stages, seed, mutation, nc, own, q_slots))


def one_tile_cases(mutation=None, seeds=60):
    """The one-tile kernel over 0..9 key blocks, about half the runs of 2+ blocks with dummy trips."""
    stages = 2  # the one-tile kernel's K/V stages at D = 128 and 256 (fc_hp_launch<T, D, 2>)
    for n_blocks in range(0, 10):
        for seed in range(seeds):
            rng = random.Random(3000 + 100 * n_blocks + seed)
            own = None  # about half the runs of 2+ blocks with dummy trips, in one or both warpgroups
            if n_blocks >= 2 and rng.random() < 0.5:
                own = (rng.randint(1, n_blocks), rng.randint(1, n_blocks))
            if mutation in ONE_TILE_DUMMY_MUTATIONS and n_blocks >= 2:
                own = (rng.randint(1, n_blocks - 1), n_blocks)
            yield (f"one-tile stages={stages} n_blocks={n_blocks} own={own} seed={seed}",
                   functools.partial(simulate, n_blocks, stages, seed, mutation, own))


def main():
    failures = 0
    one_slot = functools.partial(persistent_cases, shapes=D256_SHAPE)  # caught with one Q slot too (D = 256)
    broken = ([(m, "", one_tile_cases) for m in MUTATIONS] + [(m, "", persistent_cases) for m in PERSISTENT_MUTATIONS]
              + [(m, " (one Q slot)", one_slot) for m in ONE_SLOT_MUTATIONS]
              + [(m, "", dynamic_cases) for m in DYNAMIC_MUTATIONS])
    for mutation, note, cases in broken:  # the model must catch each of these
        err, _ = first_failure(cases(mutation, seeds=20))
        print(f"mutation {mutation}{note}: {'caught: ' + err if err else 'NOT CAUGHT'}")
        failures += err is None
    runs = 0
    for cases, seeds in ((one_tile_cases, 60), (persistent_cases, 300), (dynamic_cases, 150)):
        err, passed = first_failure(cases(seeds=seeds))
        runs += passed
        if err:
            print("FAIL", err)
            failures += 1
    print(f"{runs} passed, {failures} failed (protocol model: the one-tile ping-pong kernel, 2 stages, "
          f"0..9 key blocks; the persistent kernel at D = 64, 128, 256 (PERSISTENT_SHAPES) over random tile lists, "
          f"static and dynamic orders; {len(broken)} broken protocols must be caught)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
