#!/usr/bin/env python3
"""tools/hopper/trace_bwd.py — where the backward's second dK/dV kernel spends a block, read off its own timeline (a
development tool, the backward's counterpart of trace.py):

    tools/hopper/build_variant.sh /tmp/tr src/cuda/hopper/bwd.cu -DFC_HP_TRACE=1
    FLASHC_LIBRARY=/tmp/tr/libflashc.so PYTHONPATH=python python3 tools/hopper/trace_bwd.py [--cases 128:2048:0,...]
        [--dump PREFIX]
    python3 tools/hopper/trace_bwd.py --load PREFIX-128-2048-0.npz ...   (no GPU: a --dump's records again)

A library whose hopper/bwd.cu is built with -DFC_HP_TRACE=1 has thread 0 of each consumer warpgroup write the SM's
clock at ten marks of every block of fc_hpb_lag_block (src/cuda/hopper/bwd_kernel.cuh, MARK(k)) and the
producer's thread two per fill (fc_hpb_produce), for the first 132 CTAs (the first wave of the single-tile kernel:
one per SM). Marks:
  1 block entry   2 Sᵀ ready      3 Pᵀ done        4 dPᵀ ready (D = 128: dV issued before)
  5 dSᵀ formed and packed (D = 64: dV issued after)   6 dSᵀ stored (after sdQ's read and FREE)   7 READY arrived
  8 dV and the last block's dQ ready (READY of the other passed, dQ and dK issued)
  9 dQ tile added (bulk add issued)   10 dK ready
  producer: 0 before the wait for a free stage, 1 after it (fill issued).
The head-dim-256 kernel (src/cuda/hopper/bwd_d256.cuh; cases with D = 256) has its own marks, thread 0 of each
consumer warpgroup:
  1 block entry   2 Sᵀ (warpgroup 0) or dPᵀ (1) ready   3 Pᵀ stored (0) or barrier P passed (1)
  4 dV issued   5 dSᵀ stored (1)   6 dV retired, dO released   7 barrier B passed
  8 dQ_0 ready (dQ, dK issued)   9 dQ_0 tile added   10 the next block's Sᵀ / dPᵀ issued (after its fill's wait)
  11 dQ_1 ready   12 dQ_1 tile added   13 dK ready, Q released
  producer: 0, 1 around the wait for a free Q stage; 2, 3 around the wait for the dO buffer.
Printed per case (bf16, docs/targets.md's shapes: 16k tokens, width 2048), medians over the steady blocks (each CTA's
blocks 2 .. n − 2) of the 132 CTAs, in SM cycles: the block period; each warpgroup's split of a block at its marks;
how far warpgroup 1 runs behind warpgroup 0 (its mark 1 minus 0's, same block); the producer's wait for a stage. A
mark is one global store (a few cycles of issue, a few per cent of the kernel): read the shape, not absolute speed.
"""
import argparse
import ctypes
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "profile"))
import numpy as np  # noqa: E402
from trace_common import CTAS, add_args, analyse_loaded, cases, traced_call  # noqa: E402

PER = 16  # marks per block (FC_HPB_MARK_AT)
NAMES = {1: "entry", 2: "S", 3: "P", 4: "dP", 5: "dS", 6: "dS-st", 7: "ready", 8: "dQ", 9: "dQ-add", 10: "dK"}
SPLITS = [(1, 2, "wait S"), (2, 3, "P pass"), (3, 4, "dV issue, wait dP"), (4, 5, "dS maths, pack"),
          (5, 6, "sdQ read, FREE, dS stmatrix"), (6, 7, "arrive READY"), (7, 8, "READY, dQ/dK issue, wait dQ"),
          (8, 9, "dQ tile + add"), (9, 10, "wait dK"), (10, 1, "release, next entry")]
SUBSPLITS = []  # parts of a split, printed where their marks are there
D256_SPLITS = [(1, 2, "wait Sᵀ (0) / dPᵀ (1)"), (2, 3, "P pass (0) / wait P (1)"), (3, 4, "dV issue"),
               (4, 5, "dS maths, store (1)"), (5, 6, "wait dV, release dO"), (6, 7, "wait Q, barrier B"),
               (7, 8, "dQ/dK issue, wait dQ_0"), (8, 9, "dQ_0 tile + add"), (9, 10, "fill wait, next issue"),
               (10, 11, "wait dQ_1"), (11, 12, "dQ_1 tile + add"), (12, 13, "wait dK, release Q"),
               (13, 1, "next entry")]
D256_SUBSPLITS = [(3, 7, "  P to barrier B")]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def clocks(buf, cta, slot):
    """{block: {mark: clock}} of one recorder (words with a zero clock are empty)."""
    row = buf[cta, slot]
    out = {}
    for idx in np.nonzero(row)[0]:
        n, k = divmod(int(idx), PER)
        out.setdefault(n, {})[k] = int(row[idx]) & 0xFFFFFFFFFF
    return out


def analyse(buf, title, d256=None):
    if d256 is None:  # --load: the case is in the file's name
        d256 = "-256-" in title or "d256" in title
    splits, subsplits = (D256_SPLITS, D256_SUBSPLITS) if d256 else (SPLITS, SUBSPLITS)
    split = {c: {s[2]: [] for s in splits + subsplits} for c in (0, 1)}
    period, lag, prod_wait, do_wait, blocks = [], [], [], [], []
    for cta in range(CTAS):
        wg = [clocks(buf, cta, 1 + c) for c in (0, 1)]
        n_blocks = len(wg[0])
        if n_blocks < 5:
            continue
        blocks.append(n_blocks)
        steady = range(2, n_blocks - 2)
        for c in (0, 1):
            for n in steady:
                m, nx = wg[c].get(n, {}), wg[c].get(n + 1, {})
                for a, b, name in splits + subsplits:
                    end = nx.get(1) if b == 1 else m.get(b)
                    if a in m and end is not None:
                        split[c][name].append(end - m[a])
        for n in steady:
            if 1 in wg[0].get(n, {}) and 1 in wg[0].get(n + 1, {}):
                period.append(wg[0][n + 1][1] - wg[0][n][1])
            if 1 in wg[0].get(n, {}) and 1 in wg[1].get(n, {}):
                lag.append(wg[1][n][1] - wg[0][n][1])
        prod = clocks(buf, cta, 0)
        for n in steady:
            if 0 in prod.get(n, {}) and 1 in prod.get(n, {}):
                prod_wait.append(prod[n][1] - prod[n][0])
            if 2 in prod.get(n, {}) and 3 in prod.get(n, {}):
                do_wait.append(prod[n][3] - prod[n][2])
    print(f"\n== {title}: {len(blocks)} CTAs traced, {med(blocks):.0f} blocks each (median); block period "
          f"(warpgroup 0) {med(period):.0f} cycles")
    print(f"  {'split of a block':28s} {'wg 0':>7s} {'wg 1':>7s}")
    for _, _, name in splits + subsplits:
        if split[0][name] or split[1][name]:
            print(f"  {name:28s} {med(split[0][name]):7.0f} {med(split[1][name]):7.0f}")
    tot = [sum(med(split[c][s[2]]) for s in splits if split[c][s[2]]) for c in (0, 1)]
    print(f"  {'sum of medians':28s} {tot[0]:7.0f} {tot[1]:7.0f}")
    q = sorted(lag)
    if q:
        print(f"  warpgroup 1 behind 0 at entry: median {med(q):.0f} (quartiles {q[len(q) // 4]:.0f} .. "
              f"{q[3 * len(q) // 4]:.0f})")
    print(f"  producer: wait for a free stage, median {med(prod_wait):.0f}" +
          (f"; for the dO buffer, median {med(do_wait):.0f}" if do_wait else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap, "128:2048:0,128:8192:0,64:4096:0", 10)
    a = ap.parse_args()
    if analyse_loaded(a, analyse):
        return
    import flashc  # the GPU run only: --load needs numpy alone
    import torch

    lib = ctypes.CDLL(os.environ["FLASHC_LIBRARY"])
    for d, s, causal, b, h in cases(a.cases):
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = flashc.prepare_forward(q, k, v, causal=bool(causal), backend="cuda-hopper")()
        bwd = flashc.prepare_backward(dout, q, k, v, o, lse, causal=bool(causal), backend="cuda-hopper")
        ms, buf = traced_call(lib, "fc_hopper_bwd", bwd, a.warmup)
        if a.dump:
            np.savez_compressed(f"{a.dump}-{d}-{s}-{causal}.npz", buf=buf)
        analyse(buf, f"d{d} s{s} c{causal} ({ms:.3f} ms traced)", d256=d > 128)


if __name__ == "__main__":
    main()
