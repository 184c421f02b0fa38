"""GPU check of cuda-hopper's backward (H100/H200): correctness against an fp64 reference, then timings against
the backward of PyTorch SDPA (flash, cudnn) and of cuda-mma on the shapes of docs/targets.md. Run through
tools/hopper/gpu.sh (steps bwd-smoke, bwd, bwd-sanitize, bwd-bench), or:

    python3 tools/hopper/check_bwd.py --lib build-gpu/libflashc.so [--quick | --tiny] [--no-bench | --no-check]
        [--modes env,bulk] [--bench-modes env] [--rounds 1] [--no-peers] [--bench-d 64,128]

Modes (the library reads FLASHC_HOPPER_BWD_DQ, _BR, _V, _PERSIST and _D256 at every call): env
(the variables as this script found them: the defaults when unset, i.e. bulk128 where it applies), bulk, split,
each (dQ paths, Br = 64), bulk128 (bulk with Br = 128 query rows per block; built for d <= 64 only, so it runs only
there and not in deterministic mode, where the library would run the Br = 64 kernel anyway), v2, v3, v4 (bulk at
D = 128 with the second kernel, FLASHC_HOPPER_BWD_V = 2, 3, 4: src/cuda/hopper_bwd_v2.cuh; d > 64 only, not
deterministic), v2d64 .. v8d64 (bulk128 with the second kernel at D = 64, Br = 128, FLASHC_HOPPER_BWD_V = 2 .. 8: 4
there issues the next block's S^T before the dQ store, 5 and 6 are 3 and 4 with dV issued before the dP^T wait, 7
and 8 are 2 and 3 with each block's dQ issued a block later (LAG; 7 the default); d <= 64 only, not deterministic),
p (the defaults with FLASHC_HOPPER_BWD_PERSIST=1: the persistent second kernel, one CTA per SM walking the tiles,
where the default second kernel runs: D = 128 V 13 (V 3's form), D = 64 V 7 (V 2's form); not deterministic),
p3 (the same with the grid capped at 3 CTAs, FLASHC_HOPPER_BWD_PERSIST=3, so that even the small checks walk many
tiles per CTA: the phases across tiles, empty tiles, varlen); both in the default dynamic order; ps, p3s the same in
the stride order, pg in the grouped one (FLASHC_HOPPER_BWD_SCHED); d256 (FLASHC_HOPPER_BWD_D256=1: the head-dim-256
kernel, src/cuda/hopper_bwd_d256.cuh, at 128 < d <= 256 only, not deterministic; the d = 256 cases run in the modes
d256, d256p, d256w, d256e and in env unless env sets FLASHC_HOPPER_BWD_D256=0), d256p (the same kernel without its
next-block S^T issue, FLASHC_HOPPER_BWD_D256=2: every wgmma group waited for within its block), d256w
(FLASHC_HOPPER_BWD_D256=3, WHOLE: each consumer warpgroup one whole product at N = 64, consumer 0 all of S^T and P^T,
consumer 1 all of dP^T and dS^T), d256e (FLASHC_HOPPER_BWD_D256=4, the library's default: WHOLE with dV issued before
the block's barrier B, dO released there: EDV). Every check runs in each of --modes that applies to it; the timings
time cuda-hopper in each of --bench-modes, interleaved per shape (--rounds times, the median), the first mode being
the reference of the ratio columns; --bench-d picks their head dims. An A/B of two modes
without the peers:

    python3 tools/hopper/check_bwd.py --no-check --bench-modes bulk,bulk128 --rounds 3 --no-peers
    python3 tools/hopper/check_bwd.py --no-check --bench-modes bulk,v2,v3,v4 --rounds 3 --no-peers
    python3 tools/hopper/check_bwd.py --no-check --bench-modes bulk128,v2d64,v3d64,v4d64,v5d64,v6d64 --rounds 3 \
        --no-peers
    python3 tools/hopper/check_bwd.py --no-check --bench-modes env,p --rounds 3 --no-peers
    python3 tools/hopper/check_bwd.py --no-check --bench-modes d256,d256p --bench-d 256   # vs cuda-mma, flash, cudnn
    python3 tools/hopper/check_bwd.py --no-check --bench-modes d256,d256w --bench-d 256 --rounds 3

What cuda-hopper's backward cannot address (rows not 16-byte aligned, head dims past 128 with
FLASHC_HOPPER_BWD_D256=0, deterministic mode past 128) it must refuse, and auto must fall back to another
backend.

Correctness rule (FlashAttention's): for each of dq, dk, dv, the kernel's max |error| against the fp64 reference
is at most 3x the error of the same maths done plainly in the kernel's precision (matmuls in bf16/fp16, softmax
and sums in fp32, D from the 16-bit o), + 1e-4. dq, dk, dv are poisoned with NaN before every call; o and lse
come from cuda-hopper's forward (verified). Keys no query sees must get dk = dv = 0 and queries that see no key
dq = 0 (the reference says so, the NaN poison catches rows never written).
"""
import argparse
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for gpucheck
from gpucheck import (Flashc, Results, cu_seqlens, make, peer_ms, reference, sdpa_backward_ms, timeit,  # noqa: E402
                      visible)

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="build-gpu/libflashc.so")
ap.add_argument("--quick", action="store_true", help="a few shapes only (smoke test, about a minute)")
ap.add_argument("--tiny", action="store_true", help="two small shapes (racecheck, which is slow)")
ap.add_argument("--no-check", action="store_true")
ap.add_argument("--no-bench", action="store_true")
ap.add_argument("--modes", default="env,bulk", help="correctness: each case in each mode that applies to it")
ap.add_argument("--bench-modes", default="env", help="timings: cuda-hopper in each mode; the first is the reference")
ap.add_argument("--rounds", type=int, default=1, help="timings: interleaved rounds over the modes (median)")
ap.add_argument("--no-peers", action="store_true", help="timings: cuda-hopper only (no cuda-mma, flash, cudnn)")
ap.add_argument("--bench-d", default="64,128", help="timings: the head dims (256: with --bench-modes d256)")
args = ap.parse_args()

os.environ.pop("FLASHC_HOPPER", None)  # the backend must not be hidden here
MODE_VARS = ("FLASHC_HOPPER_BWD_DQ", "FLASHC_HOPPER_BWD_BR", "FLASHC_HOPPER_BWD_V", "FLASHC_HOPPER_BWD_PERSIST",
             "FLASHC_HOPPER_BWD_SCHED", "FLASHC_HOPPER_BWD_D256")


def _mode(dq, br, v="1", persist=None, sched=None, d256=None):
    """None: unset (the library's default)."""
    return {"FLASHC_HOPPER_BWD_DQ": dq, "FLASHC_HOPPER_BWD_BR": br, "FLASHC_HOPPER_BWD_V": v,
            "FLASHC_HOPPER_BWD_PERSIST": persist, "FLASHC_HOPPER_BWD_SCHED": sched, "FLASHC_HOPPER_BWD_D256": d256}


MODES = {"env": {v: os.environ.get(v) for v in MODE_VARS},
         "bulk": _mode("bulk", "64"), "split": _mode("split", "64"), "each": _mode("each", "64"),
         "bulk128": _mode("bulk", "128"),
         "v2": _mode("bulk", "64", "2"), "v3": _mode("bulk", "64", "3"), "v4": _mode("bulk", "64", "4"),
         "v2d64": _mode("bulk", "128", "2"), "v3d64": _mode("bulk", "128", "3"), "v4d64": _mode("bulk", "128", "4"),
         "v5d64": _mode("bulk", "128", "5"), "v6d64": _mode("bulk", "128", "6"),
         "v7d64": _mode("bulk", "128", "7"), "v8d64": _mode("bulk", "128", "8"),
         "p": _mode(None, None, None, "1"), "p3": _mode(None, None, None, "3"),
         "ps": _mode(None, None, None, "1", "stride"), "p3s": _mode(None, None, None, "3", "stride"),
         "pg": _mode(None, None, None, "1", "grouped"),
         "d256": _mode(None, None, None, None, None, "1"), "d256p": _mode(None, None, None, None, None, "2"),
         "d256w": _mode(None, None, None, None, None, "3"), "d256e": _mode(None, None, None, None, None, "4")}
D256_MODES = ("d256", "d256p", "d256w", "d256e")  # the head-dim-256 kernel's variants (FLASHC_HOPPER_BWD_D256 = 1..4)
modes, bench_modes = args.modes.split(","), args.bench_modes.split(",")
for m in modes + bench_modes:
    if m not in MODES:
        sys.exit(f"unknown mode {m!r} (known: {', '.join(MODES)})")
bench_dims = [int(x) for x in args.bench_d.split(",")]


def set_mode(name):
    for var, value in MODES[name].items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


def mode_applies(name, d, deterministic=0):
    """bulk128 changes the kernel only at d <= 64 and outside deterministic mode (elsewhere Br = 64 runs); v2..v4
    only at d > 64 and outside deterministic mode (elsewhere the first kernel runs); v2d64..v6d64 (the second
    kernel at D = 64, Br = 128) only at d <= 64 and outside deterministic mode (deterministic runs Br = 64's split
    kernel with its turns; at d > 64 they would run the D = 128 second version, which v2, v3 check); p, p3 (the
    persistent second kernel; ps, p3s, pg: its stride and grouped orders) outside deterministic mode, at both
    head dims. Past d = 128 only the head-dim-256 kernel runs: modes d256, d256p, d256w, d256e and env (unless env
    turns it off with FLASHC_HOPPER_BWD_D256=0), not deterministic (refused there); d256, d256p, d256w, d256e do not
    apply at d <= 128 (they would repeat env)."""
    if d > 128:
        gated_env = name == "env" and MODES["env"]["FLASHC_HOPPER_BWD_D256"] != "0"
        return not deterministic and (name in D256_MODES or gated_env)
    if name in D256_MODES:
        return False
    if name in ("p", "p3", "ps", "p3s", "pg"):
        return not deterministic
    if name.endswith("d64") or name == "bulk128":
        return d <= 64 and not deterministic
    if name in ("v2", "v3", "v4"):
        return d > 64 and not deterministic
    return True


fc = Flashc(args.lib)
OK, UNSUPPORTED = fc.OK, fc.UNSUPPORTED
res = Results(verbose=True)  # every case's line, passed or not
record = res.record


def params(causal=0, align=0, wl=-1, wr=-1, cu=None, deterministic=0):
    return fc.params(causal, align, wl, wr, cu=cu, deterministic=deterministic)


def forward(backend, p, q, k, v, o, lse):
    return fc.forward(backend, p, q, k, v, o, lse)


def backward(backend, p, q, k, v, o, lse, dout, dq, dk, dv):
    return fc.backward(backend, p, q, k, v, o, lse, dout, dq, dk, dv)


def grads(q, k, v, dout, scale, vis, low=None):
    """dq, dk, dv [1, s, h, d] in fp64 of one sequence ([1, s, h, d] slices) from the fp64 maths; with low = a
    16-bit dtype, the plain low-precision computation instead (gpucheck.reference: matmuls in that dtype, softmax
    and sums in fp32, D from o rounded to it, the gradients rounded to it as the kernel's are), whose error sets
    the tolerance. GQA: k, v shared by groups of query heads, their gradients summed over the group."""
    r = reference(q[0], k[0], v[0], scale, vis, low=low, do=dout[0])
    return [x[None].double() for x in r[2:]]


def nan_like(x, layout=None):
    """NaN in x's shape (and, for dense layouts, strides; or laid out as `layout` says): the kernel must write
    every element."""
    if layout:
        return make(*x.shape, x.dtype, layout, fill=float("nan"))
    return torch.full_like(x, float("nan"))


def problem(dtype, b, sq, sk, hq, hkv, d, causal, align, wl, wr, layout, varlen):
    """Inputs, o and lse (cuda-hopper's forward) and the per-sequence slices."""
    if varlen:
        cu_q, cu_k, seqs = cu_seqlens(varlen)
        q, k, v = (make(1, n, h, d, dtype, layout) for n, h in ((cu_q[-1], hq), (cu_k[-1], hkv), (cu_k[-1], hkv)))
        cu = (cu_q, cu_k)
    else:
        q, k, v = (make(b, n, h, d, dtype, layout) for n, h in ((sq, hq), (sk, hkv), (sk, hkv)))
        seqs = [(bb, 0, sq, 0, sk) for bb in range(b)]
        cu = None
    dout = make(q.shape[0], q.shape[1], hq, d, dtype, layout)
    o = torch.empty_like(q)
    lse = torch.empty(hq * q.shape[0] * q.shape[1], device="cuda")
    return q, k, v, dout, o, lse, seqs, cu


def check(dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd", varlen=None,
          deterministic=0, grad_layout=None):
    """One case (fresh random inputs, one reference) in every mode of --modes that applies to it; grad_layout:
    dq, dk, dv laid out so (e.g. "odd": rows not 16-byte aligned, which the dK/dV stores must handle)."""
    case = (f"{str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} w({wl},{wr}) "
            f"{layout}" + (f" varlen{varlen}" if varlen else "") + (" deterministic" if deterministic else "") +
            (f" grads {grad_layout}" if grad_layout else ""))
    if not any(mode_applies(m, d, deterministic) for m in modes):
        return  # d > 128 in modes that do not run the head-dim-256 kernel
    q, k, v, dout, o, lse, seqs, cu = problem(dtype, b, sq, sk, hq, hkv, d, causal, align, wl, wr, layout, varlen)
    p, keep = params(causal, align, wl, wr, cu=cu, deterministic=deterministic)
    set_mode("env")
    st = forward("cuda-hopper", p, q, k, v, o, lse)
    if st != OK:
        record(f"{modes[0]:8s} {case}", False, f"forward status {st}: {fc.last_error()}")
        return
    refs = {}  # per sequence: the fp64 reference and the plain low-precision error, shared by the modes
    for mode in modes:
        if mode_applies(mode, d, deterministic):
            set_mode(mode)
            check_mode(f"{mode:8s} {case}", dtype, d, causal, align, wl, wr, deterministic, q, k, v, dout, o, lse,
                       seqs, p, refs, grad_layout)
    set_mode("env")
    del keep


def check_mode(tag, dtype, d, causal, align, wl, wr, deterministic, q, k, v, dout, o, lse, seqs, p, refs,
               grad_layout=None):
    dq, dk, dv = nan_like(q, grad_layout), nan_like(k, grad_layout), nan_like(v, grad_layout)
    st = backward("cuda-hopper", p, q, k, v, o, lse, dout, dq, dk, dv)
    torch.cuda.synchronize()
    if st != OK:
        record(tag, False, f"backward status {st}: {fc.last_error()}")
        return
    if deterministic:  # a second run, freshly poisoned, must give the same bits
        again = [nan_like(x) for x in (q, k, v)]
        st = backward("cuda-hopper", p, q, k, v, o, lse, dout, *again)
        torch.cuda.synchronize()
        same = st == OK and all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                                for x, y in zip((dq, dk, dv), again))
        record(tag + " (bit-identical rerun)", same, f"status {st}")
    scale = 1.0 / math.sqrt(d)
    err, err_plain, bad = [0.0] * 3, [0.0] * 3, []
    for bb, qs, ql, ks, kl in seqs:
        got = (dq[bb:bb + 1, qs:qs + ql].double(), dk[bb:bb + 1, ks:ks + kl].double(),
               dv[bb:bb + 1, ks:ks + kl].double())
        for name, x in zip(("dq", "dk", "dv"), got):
            if torch.isnan(x).any():
                bad.append(f"NaN in {name}")
        if ql == 0 or kl == 0:  # nothing attends: every gradient of the sequence is 0
            for name, x in zip(("dq", "dk", "dv"), got):
                if x.numel() and x.abs().max() != 0:
                    bad.append(f"{name} not 0 in an empty sequence")
            continue
        if (bb, qs, ks) not in refs:
            vis = visible(ql, kl, causal, align, wl, wr)
            a_ = (q[bb:bb + 1, qs:qs + ql], k[bb:bb + 1, ks:ks + kl], v[bb:bb + 1, ks:ks + kl],
                  dout[bb:bb + 1, qs:qs + ql], scale, vis)
            ref, plain = grads(*a_), grads(*a_, low=dtype)
            refs[(bb, qs, ks)] = (ref, [(plain[n] - ref[n]).abs().max().item() for n in range(3)])
            del plain
        ref, e_plain = refs[(bb, qs, ks)]
        for n in range(3):
            err[n] = max(err[n], (got[n] - ref[n]).abs().max().item())
            err_plain[n] = max(err_plain[n], e_plain[n])
    tol = [3 * e + 1e-4 for e in err_plain]
    ok = not bad and all(e <= t for e, t in zip(err, tol))
    info = " ".join(f"{n} {e:.1e}/{t:.1e}" for n, e, t in zip(("dq", "dk", "dv"), err, tol))
    record(tag, ok, info + (" " + " ".join(sorted(set(bad))) if bad else ""))


def check_refusals(dtype):
    """What cuda-hopper must refuse (UNSUPPORTED, auto falling back): views TMA cannot address, head dims past 256,
    head dims past 128 with FLASHC_HOPPER_BWD_D256=0, and deterministic mode at d = 256 with the kernel on."""
    def attempt(tag, q, k, v, dout, p, expect_msg):
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[2] * q.shape[0] * q.shape[1], device="cuda")
        if forward("auto", p, q, k, v, o, lse) != OK:
            record(tag, False, f"forward: {fc.last_error()}")
            return None
        dq, dk, dv = nan_like(q), nan_like(k), nan_like(v)
        st = backward("cuda-hopper", p, q, k, v, o, lse, dout, dq, dk, dv)
        msg = fc.last_error()
        g = (nan_like(q), nan_like(k), nan_like(v))
        st2 = backward("auto", p, q, k, v, o, lse, dout, *g)
        torch.cuda.synchronize()
        fell = fc.last_backend("auto")
        ok = (st == UNSUPPORTED and expect_msg in msg and st2 == OK and fell != "cuda-hopper" and
              not any(torch.isnan(x).any() for x in g))
        record(tag + " (must refuse)", ok, f"status {st} ({msg}); auto ran {fell!r} with status {st2}")

    gate = os.environ.pop("FLASHC_HOPPER_BWD_D256", None)
    odd = [make(1, 300, 4, 64, dtype, "odd") for _ in range(4)]
    attempt(f"{str(dtype)[6:]:8s} odd strides", *odd, params()[0], "stride")
    os.environ["FLASHC_HOPPER_BWD_D256"] = "0"
    big = [make(1, 300, 4, 192, dtype, "bshd") for _ in range(4)]
    attempt(f"{str(dtype)[6:]:8s} d192 with FLASHC_HOPPER_BWD_D256=0", *big, params()[0], "192")
    if any(m in modes for m in D256_MODES) or gate != "0":
        d256 = [make(1, 300, 4, 256, dtype, "bshd") for _ in range(4)]
        attempt(f"{str(dtype)[6:]:8s} d256 with FLASHC_HOPPER_BWD_D256=0", *d256, params()[0], "256")
        os.environ.pop("FLASHC_HOPPER_BWD_D256", None)  # the default: the kernel on
        attempt(f"{str(dtype)[6:]:8s} d256 deterministic", *d256, params(deterministic=1)[0], "deterministic")
    if gate is None:
        os.environ.pop("FLASHC_HOPPER_BWD_D256", None)
    else:
        os.environ["FLASHC_HOPPER_BWD_D256"] = gate


def correctness():
    torch.manual_seed(0)
    shapes = [(1, 1), (97, 97), (257, 257), (1025, 1025), (113, 203), (203, 113), (1, 147), (1024, 1023)]
    masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
    layouts = ["bshd", "bhsd", "padded"]
    dims = (64, 128)
    d256 = any(mode_applies(m, 256) for m in modes)  # the head-dim-256 kernel: mode d256 (or env with its gate)
    if args.quick:
        shapes, masks = [(97, 97), (257, 257), (203, 113), (1024, 1023)], [dict(), dict(causal=1)]
    if args.tiny:  # d = 128 too when a mode runs only there (the sanitizers of v2..v4) or differs there (p, p3)
        shapes, masks = [(97, 97), (203, 113)], [dict(causal=1)]
        dims = (64, 128) if any(m in ("v2", "v3", "v4", "p", "p3") for m in modes) else (64,)
    if d256:  # every shape and mask above at d = 256 too (odd seqlens, causal both alignments, windows, GQA 2:1,
        dims += (256,)  # rows that see no key: (203, 113) causal align 1), and the odd gradient layout below
    n = 0
    for dtype in (torch.bfloat16, torch.float16):
        for d in dims:
            for sq, sk in shapes:
                for m in masks:
                    n += 1
                    check(dtype, 2, sq, sk, 4, 2, d, layout=layouts[n % 3], **m)  # GQA 2:1
        for d in dims:  # gradients whose rows are not 16-byte aligned: the dK/dV stores element by element
            check(dtype, 1, 203, 257, 4, 2, d, causal=1, grad_layout="odd")
        if args.tiny:
            continue
        check(dtype, 1, 257, 300, 4, 2, 100, causal=1, layout="padded")  # d = 100 runs as D = 128
        check(dtype, 1, 0, 0, 4, 2, 128, causal=1, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
        check_refusals(dtype)
        if d256:  # D = 256: a head dim it pads (column tails), varlen with empty sequences, MQA, a long causal one
            check(dtype, 1, 257, 300, 4, 2, 200, causal=1, layout="padded")  # d = 200 runs as D = 256
            check(dtype, 1, 0, 0, 4, 2, 256, causal=1, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
            check(dtype, 1, 0, 0, 4, 4, 256, wl=20, wr=5, varlen=([1, 1025, 64], [1, 1025, 130]))
            check(dtype, 1, 300, 300, 8, 1, 256, layout="bhsd")  # MQA: one CTA walks all 8 query heads
            if not args.quick:
                check(dtype, 1, 4096, 4096, 2, 2, 256, causal=1, align=1)
        if args.quick:
            continue
        check(dtype, 1, 300, 300, 8, 1, 128)  # MQA
        check(dtype, 1, 4096, 4096, 2, 2, 128, causal=1)
        check(dtype, 1, 257, 300, 4, 2, 40, layout="padded")  # d = 40 runs as D = 64
        check(dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd", varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
        check(dtype, 1, 0, 0, 4, 4, 64, wl=20, wr=5, varlen=([1, 1025, 64], [1, 1025, 130]))
    # Deterministic mode last: its dQ turns wait on other CTAs, so a wrong turn hangs (gpu.sh's timeout) and
    # should not hide the results above.
    if not args.tiny:
        for dtype in (torch.bfloat16, torch.float16):
            check(dtype, 2, 1025, 1025, 4, 2, 128, causal=1, deterministic=1)
            check(dtype, 2, 257, 300, 4, 2, 64, wl=100, wr=30, layout="bhsd", deterministic=1)
            check(dtype, 1, 0, 0, 4, 2, 128, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]),
                  deterministic=1)
            if not args.quick:
                check(dtype, 1, 4096, 4096, 8, 1, 64, causal=1, align=1, deterministic=1)
    print(f"correctness: {res.passed()}", flush=True)


# ---- timings -----------------------------------------------------------------------------------------------
def bench():
    timer = lambda fn: timeit(fn, reps=20, warmup=3)  # noqa: E731
    ref, others = bench_modes[0], bench_modes[1:]
    print(f"\n== backward TFLOP/s on {torch.cuda.get_device_name()}, bf16, 16k tokens, width 2048 "
          f"(flops = 2.5 x 4.b.h.s^2.d, halved for causal); hopper = mode {ref}"
          + (f", {args.rounds} interleaved rounds (median)" if args.rounds > 1 else "") + " ==", flush=True)
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'hopper':>8} {'mma':>8} {'flash':>8} {'cudnn':>8} "
          f"{'hp/cudnn':>8} {'hp/flash':>8}" + "".join(f" {m[:8]:>8} {'/' + ref[:7]:>8}" for m in others), flush=True)
    seqlens = (1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    for d in bench_dims:
        for causal in (0, 1):
            for s in seqlens:
                b, h = 16384 // s, 2048 // d
                q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
                res = {}
                qv, kv, vv, dov = (x.transpose(1, 2) for x in (q, k, v, do))  # [b, s, h, d] views
                o = torch.empty_like(qv)
                lse = torch.empty(b * h * s, device="cuda")
                g = [torch.empty_like(x) for x in (qv, kv, vv)]
                p, _ = params(causal=causal, align=1)
                set_mode("env")
                forward("cuda-hopper", p, qv, kv, vv, o, lse)
                # cuda-hopper in each mode, interleaved: round r times every mode once, odd rounds in reverse
                runs = {m: [] for m in bench_modes if mode_applies(m, d)}
                for r in range(max(1, args.rounds)):
                    for m in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                        set_mode(m)
                        if backward("cuda-hopper", p, qv, kv, vv, o, lse, dov, *g) != OK:
                            print(m, fc.last_error())
                            runs[m].append(float("nan"))
                            continue
                        runs[m].append(timer(lambda: backward("cuda-hopper", p, qv, kv, vv, o, lse, dov, *g)))
                set_mode("env")
                hp = {m: sorted(t)[len(t) // 2] for m, t in runs.items()}
                res["cuda-hopper"] = hp.get(ref, float("nan"))
                for name in ("cuda-mma",):
                    if args.no_peers or backward(name, p, qv, kv, vv, o, lse, dov, *g) != OK:
                        if not args.no_peers:
                            print(name, fc.last_error())
                        res[name] = float("nan")
                        continue
                    res[name] = timer(lambda: backward(name, p, qv, kv, vv, o, lse, dov, *g))
                for name in ("flash", "cudnn"):
                    res[name] = float("nan") if args.no_peers else peer_ms(
                        name, lambda: sdpa_backward_ms(name, q, k, v, do, causal, timer), quiet=True)
                tf = {kk: flops / ms / 1e9 for kk, ms in res.items()}
                extra = ""
                for m in others:
                    t = flops / hp[m] / 1e9 if m in hp else float("nan")
                    extra += f" {t:8.1f} {t / tf['cuda-hopper']:8.3f}"
                print(f"{d:4d} {causal:6d} {s:6d} {tf['cuda-hopper']:8.1f} {tf['cuda-mma']:8.1f} {tf['flash']:8.1f} "
                      f"{tf['cudnn']:8.1f} {tf['cuda-hopper'] / tf['cudnn']:8.2f} "
                      f"{tf['cuda-hopper'] / tf['flash']:8.2f}" + extra, flush=True)
                del q, k, v, do, o, g


t0 = time.time()
if not args.no_check:
    correctness()
if not args.no_bench:
    bench()
res.summary(t0, groups=modes if not args.no_check else (), shown=20)
