#!/usr/bin/env python3
"""tools/hopper/trace.py — where the persistent forward's time goes, read off its own timeline (a development tool):

    tools/hopper/build_trace.sh build-gc build-tr
    FLASHC_LIBRARY=build-tr/libflashc.so PYTHONPATH=python python3 tools/hopper/trace.py [--cases 128:2048:0,...]
        [--variants default,default+KEY=VAL] [--dump PREFIX]
    python3 tools/hopper/trace.py --load PREFIX-128-2048-0-default.npz ...   (no GPU: a --dump's records again)

A library built with -DFC_HP_TRACE=1 (src/cuda/hopper/trace.cuh) has the producer's thread and thread 0 of each
consumer warpgroup write the SM's clock at marks in hopper/fwd_persistent.cuh. Each case (bf16, docs/targets.md's shapes: 16k
tokens, width 2048) runs --warmup calls, then one traced call; printed (medians over the first 132 CTAs, in SM cycles):
  - a trip of the key loop, split at its marks (waits for K/V, for the turn, for S, the softmax beside P·V, the rest);
  - the tile boundary of each consumer, from its last P·V's turn to the next tile's first S issued, split at its
    marks (the last P·V's wait, normalisation, the epilogue's barriers and store, the next tile's set-up, the wait
    for Q_i, for K_0, for the turn), then block 0 (S_0's wait, its softmax, up to the first trip's issue);
  - per tile: its span (first S issued to the next tile's) against n_blocks trips, the excess in trips;
  - the producer's Q_i: from its issue to the consumers' wait for it, and from the last release to its issue.
The marks cost a global store each (a few per cent): read the shape, not the absolute speed. Tags: the producer 20
tile, 21 Q issued, 22 K_n's stage free, 23 V_n's; consumers 1 tile (payload n_blocks | n_own << 8), 2 Q landed, 3 K_0
landed, 4 S_0's turn, 5 S_0 done, 6 softmax_0 done, 7 trip n's K/V landed, 8 its turn, 9 its S done, 10 its P·V done, 19 its
rescale done, 11 last V landed, 12 last P·V's turn, 13 its P·V done, 14 a dummy trip's turn, 15 epilogue start, 16 sO free,
17 sO written, 18 stored, 24 right after 1 (the cost of a mark itself); the split rounds' fix-up (where the plan
takes them: unmasked, no varlen, the stride order) 25 its start (payload 0 a tail part, 2 a head part), 26 flag raised
/ seen, 27 merged.
"""
import argparse
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profile"))
import numpy as np  # noqa: E402
from trace_common import CTAS, SLOTS, add_args, analyse_loaded, cases, traced_call  # noqa: E402

MARK = {1: "tile", 2: "Q", 3: "K0", 4: "S0-turn", 5: "S0-done", 6: "softmax0", 11: "lastV", 12: "lastPV-turn",
        13: "lastPV-done", 14: "dummy", 15: "epi", 16: "sO-free", 17: "sO-written", 18: "stored"}
BOUNDARY = {2, 3, 4, 5, 6, 12, 13, 14, 15, 16, 17, 18}


def events(words):
    """[(tag, payload, clock)] of one recorder, up to its first empty word."""
    out = []
    for w in words:
        w = int(w)
        if w == 0:
            break
        out.append((w >> 56, (w >> 40) & 0xFFFF, w & 0xFFFFFFFFFF))
    return out


def tiles(evs, start_tag):
    """The recorder's events cut into tiles at start_tag: [(payload, clock of the cut, [(tag, payload, clock)])]."""
    out = []
    for e in evs:
        if e[0] == start_tag:
            out.append((e[1], e[2], []))
        elif out:
            out[-1][2].append(e)
    return out


def first(ev, tag, payload=None):
    for e in ev:
        if e[0] == tag and (payload is None or e[1] == payload):
            return e[2]
    return None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def add(row, name, a, b):
    if a is not None and b is not None:
        row.setdefault(name, []).append(b - a)


def analyse(buf, title):
    trip, block0, bound, phase = {}, {}, {}, {}
    period_all, tile_spans, q_lat, q_rel, spans, mark_cost = [], [], [], [], [], []
    for cta in range(CTAS):
        prod = tiles(events(buf[cta, 0]), 20)
        cons = [[t for t in tiles(events(buf[cta, slot]), 1) if t[0] & 0xFF] for slot in range(1, SLOTS)]
        cons = [c for c in cons if c]  # loaded tiles of each consumer warpgroup that recorded
        if not cons:
            continue
        clocks = [e[2] for c in cons for t in c for e in t[2]]
        spans.append(max(clocks) - min(clocks))
        for c, ts in enumerate(cons):
            row, trow = bound.setdefault(c, {}), trip.setdefault(c, {})
            for ti, (pay, cut, ev) in enumerate(ts):
                add({"m": mark_cost}, "m", cut, first(ev, 24))
                for n in range(2, pay >> 8):  # trips 2 .. n_own - 1: steady ones
                    t19p, t7, t8, t9, t10, t19 = (first(ev, g, x) for g, x in
                                                  ((19, n - 1), (7, n), (8, n), (9, n), (10, n), (19, n)))
                    add(trow, "K/V wait", t19p, t7)
                    add(trow, "turn wait", t7, t8)
                    add(trow, "S issued+waited", t8, t9)
                    add(trow, "softmax, P.V wait", t9, t10)
                    add(trow, "pack/rescale", t10, t19)
                    if c == 0:
                        add({"p": period_all}, "p", t8, first(ev, 8, n + 1))
                    elif ti < len(cons[0]):  # the phase: this consumer's turn after consumer 0's, same trip
                        add(phase.setdefault(c, {}), "p", first(cons[0][ti][2], 8, n), t8)
                add(block0, "S_0 issued+waited", first(ev, 4), first(ev, 5))
                add(block0, "softmax_0", first(ev, 5), first(ev, 6))
                add(block0, "to trip 1's turn", first(ev, 6), first(ev, 8, 1))
                if ti + 1 == len(ts):
                    continue
                _, cut, nxt = ts[ti + 1]
                if c == 0:
                    t4, n4 = first(ev, 4), first(nxt, 4)
                    if t4 is not None and n4 is not None:
                        tile_spans.append((n4 - t4, pay & 0xFF))
                # the boundary as it ran: this tile's marks from its last P.V's turn on, the next tile's up to its
                # softmax_0, in clock order (the epilogue may sit on either side of the cut)
                t12 = first(ev, 12)
                t6 = first(nxt, 6)
                if t12 is None or t6 is None:
                    continue
                seq = [(e[2], e[0]) for e in ev if e[2] >= t12 and e[0] in BOUNDARY]
                seq += [(cut, 1)] + [(e[2], e[0]) for e in nxt if e[2] <= t6 and e[0] in BOUNDARY]
                seq.sort()
                key = tuple(tag for _, tag in seq)
                gaps = [b[0] - a_[0] for a_, b in zip(seq, seq[1:])]
                row.setdefault(key, []).append(gaps)
                add(row.setdefault("span", {}), "12->4", t12, first(nxt, 4))
        for ti, (_, _, ev) in enumerate(prod):
            q = first(ev, 21)
            if q is None or ti >= len(cons[0]):
                continue
            land = first(cons[0][ti][2], 2)
            if land is not None:
                q_lat.append(land - q)
            rel = [first(cs[ti - 1][2], 11) for cs in cons if 0 < ti <= len(cs)]
            rel = [r for r in rel if r is not None]
            if rel:
                q_rel.append(q - max(rel))
    period = med(period_all)
    fmt = lambda d: ", ".join(f"{k} {med(v):.0f}" for k, v in d.items())  # noqa: E731
    print(f"\n== {title}: CTA span {med(spans):.0f} cycles (median; longest {max(spans, default=0):.0f}); trip period "
          f"(consumer 0) {period:.0f}")
    for c, row in sorted(trip.items()):
        print(f"  trip {c}:      {fmt(row)}")
    for c, row in sorted(phase.items()):
        q = sorted(row["p"])
        print(f"  phase {c}:     turn after consumer 0's, same trip: median {med(q):.0f} (quartiles "
              f"{q[len(q) // 4]:.0f} .. {q[3 * len(q) // 4]:.0f}), {med(q) / period:.2f} of a period")
    print(f"  block 0:     {fmt(block0)}")
    for c, row in sorted(bound.items()):
        span = row.pop("span", {}).get("12->4", [])
        if not row:
            continue
        key, runs = max(row.items(), key=lambda kv: len(kv[1]))
        gaps = [med([r[i] for r in runs]) for i in range(len(key) - 1)]
        steps = ", ".join(f"{MARK[a_]}>{MARK[b]} {gp:.0f}" for a_, b, gp in zip(key, key[1:], gaps))
        print(f"  boundary {c}:  last P.V's turn to next S_0 issued {med(span):.0f}; as run ({len(runs)} of "
              f"{sum(len(v) for v in row.values())} tiles): {steps}")
    if tile_spans and period == period:
        ex = [(span - nb * period) / period for span, nb in tile_spans]
        print(f"  per tile:    span - n_blocks x period = {med(ex):.2f} trips (median of {len(ex)}; n_blocks median "
              f"{med([nb for _, nb in tile_spans]):.0f})")
    print(f"  Q_i:         last release -> issue {med(q_rel):.0f}, issue -> consumer 0 sees it {med(q_lat):.0f}")
    if mark_cost:
        print(f"  a mark:      {med(mark_cost):.0f} cycles from one mark to the next with nothing between (tags 1, 24): "
              f"every split above includes about that much")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, "128:2048:0,128:2048:1,64:2048:0,128:16384:0", 20)
    ap.add_argument("--variants", default="default", help="as tools/profile/power.py's (default[+KEY=VAL])")
    a = ap.parse_args()
    if analyse_loaded(a, analyse):
        return
    import flashc  # the GPU run only: --load needs numpy alone
    import torch
    from power import set_env
    lib = ctypes.CDLL(os.environ["FLASHC_LIBRARY"])
    for d, s, causal, b, h in cases(a.cases):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for variant in a.variants.split(","):
            set_env(variant)
            fwd = flashc.prepare_forward(q, k, v, causal=bool(causal), backend="cuda-hopper")
            ms, buf = traced_call(lib, "fc_hopper", fwd, a.warmup)
            if a.dump:
                np.savez_compressed(f"{a.dump}-{d}-{s}-{causal}-{variant}.npz", buf=buf)
            analyse(buf, f"d{d} s{s} c{causal} {variant} ({ms:.3f} ms traced)")
            set_env("default")


if __name__ == "__main__":
    main()
