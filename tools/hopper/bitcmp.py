"""tools/hopper/bitcmp.py — do two builds of libflashc give cuda-hopper's forward the same bits? For a compile-time
experiment (a -D switch in src/cuda/hopper/fwd.cu, tools/hopper/build_trace.sh) that must not change the maths:

    FLASHC_LIBRARY=A/libflashc.so PYTHONPATH=python python3 tools/hopper/bitcmp.py save /tmp/ref.pt
    FLASHC_LIBRARY=B/libflashc.so PYTHONPATH=python python3 tools/hopper/bitcmp.py compare /tmp/ref.pt

One process per library (two copies of libflashc in one process would share a soname). Each case's inputs come from a
seeded generator, so both runs see the same q, k, v; O and lse are saved (save) or compared with torch.equal
(compare: exit 1 and a DIFF line with the largest difference per case that differs). The cases walk the persistent
kernels through what their protocols depend on: many tiles per CTA, partial last query blocks (the warpgroups past the
sequence and their dummy trips), causal masks of both alignments, windows, GQA/MQA, varlen with empty and one-row
sequences, seqlen 1, head dims 59/64/111/128; each with a dense o (the TMA store where the plan runs the persistent
kernel) and with an o of odd head stride (the direct stores), as --outs says. Outputs must also be finite: a NaN that
both builds share is still a failure.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import flashc  # noqa: E402

OUTS = "dense,odd"
CASES = [  # (b, sq, sk, h, hk, d, causal, align, window, varlen cu_seqlens)
    (16, 1000, 1000, 20, 20, 64, False, "top-left", None, None),
    (16, 1000, 1000, 20, 20, 64, True, "top-left", None, None),
    (16, 1000, 1000, 20, 20, 128, False, "top-left", None, None),
    (8, 1000, 1000, 20, 20, 128, True, "top-left", None, None),
    (2, 1025, 1025, 3, 3, 64, True, "top-left", None, None),
    (2, 400, 1000, 3, 3, 64, True, "bottom-right", None, None),
    (2, 1000, 417, 3, 3, 128, True, "bottom-right", None, None),
    (2, 777, 777, 3, 3, 64, False, "top-left", (-1, 37), None),
    (2, 900, 900, 3, 3, 128, False, "top-left", (200, 45), None),
    (3, 513, 513, 4, 2, 111, True, "top-left", None, None),
    (2, 97, 257, 8, 1, 59, False, "top-left", None, None),
    (1, 1, 1, 2, 2, 128, True, "top-left", None, None),
    (1, 1024, 1023, 4, 4, 128, True, "bottom-right", None, None),
    (1, 113, 203, 4, 4, 64, True, "top-left", None, None),
    (1, 0, 0, 4, 2, 128, True, "bottom-right", None, [0, 1, 300, 300, 1325, 2000]),
    (1, 0, 0, 4, 4, 64, False, "top-left", (64, 0), [0, 7, 600, 2100]),
]


def run_case(index, case, out):
    """One case with o as `out` says: dense, or with rows of d + 1 elements (TMA cannot store it)."""
    b, sq, sk, h, hk, d, causal, align, window, varlen = case
    gen = torch.Generator(device="cuda").manual_seed(1000 + index)
    padded = -(-d // 8) * 8  # rows a multiple of 16 bytes, as TMA needs its strides; the view keeps d columns

    def rand(*shape):
        return torch.randn((*shape, padded), generator=gen, device="cuda").to(torch.bfloat16)[..., :d]

    def o_like(q):
        if out == "dense":
            return torch.empty(q.shape, device="cuda", dtype=torch.bfloat16)
        return torch.empty((*q.shape[:-1], d + 1), device="cuda", dtype=torch.bfloat16)[..., :d]

    opts = {"causal": causal, "window": window, "causal_align": align, "backend": "cuda-hopper", "return_lse": True}
    if varlen:
        q, k, v = rand(varlen[-1], h), rand(varlen[-1], hk), rand(varlen[-1], hk)
        return flashc.attention_varlen(q, k, v, varlen, varlen, out=o_like(q), **opts)
    q, k, v = rand(b, sq, h), rand(b, sk, hk), rand(b, sk, hk)
    return flashc.attention(q, k, v, out=o_like(q), **opts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("save", "compare"))
    ap.add_argument("path", help="the reference file (torch.save of {(out, case): (o, lse)})")
    ap.add_argument("--outs", default=OUTS, help=f"o's layouts, comma-separated (default {OUTS})")
    a = ap.parse_args()
    results, bad = {}, 0
    for name in a.outs.split(","):
        for index, case in enumerate(CASES):
            o, lse = run_case(index, case, name)
            torch.cuda.synchronize()
            if not torch.isfinite(o.float()).all():
                print(f"NOT FINITE {name} case {index} {case}")
                bad += 1
            results[(name, index)] = (o.cpu(), lse.cpu())
    if a.mode == "save":
        torch.save(results, a.path)
        print(f"bitcmp: saved {len(results)} results to {a.path}")
        return 1 if bad else 0
    ref = torch.load(a.path)
    for key, (o, lse) in results.items():
        if key not in ref:
            print(f"MISSING {key} in {a.path}")
            bad += 1
            continue
        o0, lse0 = ref[key]
        if not (torch.equal(o, o0) and torch.equal(lse, lse0)):
            bad += 1
            do = (o.float() - o0.float()).abs().max().item()
            dl = (lse - lse0).abs().nan_to_num().max().item()
            print(f"DIFF {key[0]} case {key[1]} {CASES[key[1]]}: max |dO| {do:.3g}, max |dlse| {dl:.3g}")
    print(f"bitcmp: {len(results) - bad}/{len(results)} identical")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
