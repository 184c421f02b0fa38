"""GPU check of cuda-hopper's backward (H100/H200): correctness against an fp64 reference, then timings against
the backward of PyTorch SDPA (flash, cudnn) and of cuda-mma on the shapes of docs/targets.md. Run through
tools/hopper/gpu.sh (steps bwd-smoke, bwd, bwd-sanitize, bwd-bench), or:

    python3 tools/hopper/check_bwd.py --lib build-gpu/libflashc.so [--quick | --tiny] [--no-bench | --no-check]
        [--dims 64,128,256] [--rounds 1] [--no-peers] [--bench-d 64,128]

The library has one kernel per case (src/cuda/hopper/bwd.cu's fc_hpb_plan): at d <= 64 and d <= 128 the second
dK/dV kernel (src/cuda/hopper/bwd_kernel.cuh), past 128 the head-dim-256 kernel (src/cuda/hopper/bwd_d256.cuh), in
deterministic mode at d <= 128 the first kernel (fc_hopper_bwd_det_kernel) with its dQ turns. --dims picks the head
dims of the correctness cases (each runs its own tile: 64, 128 or 256); the timings time cuda-hopper (the median of
--rounds) beside cuda-mma, SDPA flash and cudnn at --bench-d. A/B comparisons of two builds: tools/hopper/ab.sh.

What cuda-hopper's backward cannot address (rows not 16-byte aligned, deterministic mode past 128) it must refuse,
and auto must fall back to another backend.

Correctness rule (FlashAttention's): for each of dq, dk, dv, the kernel's max |error| against the fp64 reference
is at most 3x the error of the same maths done plainly in the kernel's precision (matmuls in bf16/fp16, softmax
and sums in fp32, D from the 16-bit o), + 1e-4. dq, dk, dv are poisoned with NaN before every call; o and lse
come from cuda-hopper's forward (verified). Keys no query sees must get dk = dv = 0 and queries that see no key
dq = 0 (the reference says so, the NaN poison catches rows never written).
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for gpucheck
from gpucheck import (Flashc, Results, arg_parser, inputs, make, peer_ms, reference, run,  # noqa: E402
                      sdpa_backward_ms, timeit, visible)

ap = arg_parser("build-gpu/libflashc.so", "a few shapes only (smoke test, about a minute)")
ap.add_argument("--tiny", action="store_true", help="two small shapes (racecheck, which is slow)")
ap.add_argument("--dims", default="64,128,256", help="correctness: the head dims of the shape and mask grid")
ap.add_argument("--rounds", type=int, default=1, help="timings: rounds of cuda-hopper per shape (median)")
ap.add_argument("--no-peers", action="store_true", help="timings: cuda-hopper only (no cuda-mma, flash, cudnn)")
ap.add_argument("--bench-d", default="64,128", help="timings: the head dims")
args = ap.parse_args()

os.environ.pop("FLASHC_HOPPER", None)  # the backend must not be hidden here
check_dims = [int(x) for x in args.dims.split(",")]
bench_dims = [int(x) for x in args.bench_d.split(",")]


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
    q, k, v, seqs, cu = inputs(dtype, b, sq, sk, hq, hkv, d, layout, varlen)
    dout = make(q.shape[0], q.shape[1], hq, d, dtype, layout)
    o = torch.empty_like(q)
    lse = torch.empty(hq * q.shape[0] * q.shape[1], device="cuda")
    return q, k, v, dout, o, lse, seqs, cu


def check(dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd", varlen=None,
          deterministic=0, grad_layout=None):
    """One case (fresh random inputs, one reference); grad_layout: dq, dk, dv laid out so (e.g. "odd": rows not
    16-byte aligned, which the dK/dV stores must handle)."""
    case = (f"{str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} w({wl},{wr}) "
            f"{layout}" + (f" varlen{varlen}" if varlen else "") + (" deterministic" if deterministic else "") +
            (f" grads {grad_layout}" if grad_layout else ""))
    if d > 128 and deterministic:
        return  # refused there (check_refusals)
    q, k, v, dout, o, lse, seqs, cu = problem(dtype, b, sq, sk, hq, hkv, d, causal, align, wl, wr, layout, varlen)
    p, keep = params(causal, align, wl, wr, cu=cu, deterministic=deterministic)
    st = forward("cuda-hopper", p, q, k, v, o, lse)
    if st != OK:
        record(case, False, f"forward status {st}: {fc.last_error()}")
        return
    refs = {}  # per sequence: the fp64 reference and the plain low-precision error
    check_mode(case, dtype, d, causal, align, wl, wr, deterministic, q, k, v, dout, o, lse, seqs, p, refs,
               grad_layout)
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
    """What cuda-hopper must refuse (UNSUPPORTED, auto falling back): views TMA cannot address and deterministic
    mode past head dim 128."""
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

    odd = [make(1, 300, 4, 64, dtype, "odd") for _ in range(4)]
    attempt(f"{str(dtype)[6:]:8s} odd strides", *odd, params()[0], "stride")
    big = [make(1, 300, 4, 192, dtype, "bshd") for _ in range(4)]
    attempt(f"{str(dtype)[6:]:8s} d192 deterministic", *big, params(deterministic=1)[0], "deterministic")


def correctness():
    torch.manual_seed(0)
    shapes = [(1, 1), (97, 97), (257, 257), (1025, 1025), (113, 203), (203, 113), (1, 147), (1024, 1023)]
    masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
    layouts = ["bshd", "bhsd", "padded"]
    # every shape and mask at each head dim (odd seqlens, causal both alignments, windows, GQA 2:1, rows that see no
    # key: (203, 113) causal align 1), and the odd gradient layout below
    dims = tuple(check_dims)
    d256 = any(d > 128 for d in dims)  # the head-dim-256 kernel's own cases below
    small = any(d <= 128 for d in dims)  # the D = 64, 128 kernels' (and the deterministic kernel's)
    if args.quick:
        shapes, masks = [(97, 97), (257, 257), (203, 113), (1024, 1023)], [dict(), dict(causal=1)]
    if args.tiny:
        shapes, masks = [(97, 97), (203, 113)], [dict(causal=1)]
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
        if small:
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
        if args.quick or not small:
            continue
        check(dtype, 1, 300, 300, 8, 1, 128)  # MQA
        check(dtype, 1, 4096, 4096, 2, 2, 128, causal=1)
        check(dtype, 1, 257, 300, 4, 2, 40, layout="padded")  # d = 40 runs as D = 64
        check(dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd", varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
        check(dtype, 1, 0, 0, 4, 4, 64, wl=20, wr=5, varlen=([1, 1025, 64], [1, 1025, 130]))
    # Deterministic mode last: its dQ turns wait on other CTAs, so a wrong turn hangs (gpu.sh's timeout) and
    # should not hide the results above.
    if small and not args.tiny:
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
    print(f"\n== backward TFLOP/s on {torch.cuda.get_device_name()}, bf16, 16k tokens, width 2048 "
          f"(flops = 2.5 x 4.b.h.s^2.d, halved for causal)"
          + (f", cuda-hopper the median of {args.rounds} rounds" if args.rounds > 1 else "") + " ==", flush=True)
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'hopper':>8} {'mma':>8} {'flash':>8} {'cudnn':>8} "
          f"{'hp/cudnn':>8} {'hp/flash':>8}", flush=True)
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
                forward("cuda-hopper", p, qv, kv, vv, o, lse)
                runs = []
                for _ in range(max(1, args.rounds)):
                    if backward("cuda-hopper", p, qv, kv, vv, o, lse, dov, *g) != OK:
                        print("cuda-hopper", fc.last_error())
                        runs.append(float("nan"))
                        continue
                    runs.append(timer(lambda: backward("cuda-hopper", p, qv, kv, vv, o, lse, dov, *g)))
                res["cuda-hopper"] = sorted(runs)[len(runs) // 2]
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
                print(f"{d:4d} {causal:6d} {s:6d} {tf['cuda-hopper']:8.1f} {tf['cuda-mma']:8.1f} {tf['flash']:8.1f} "
                      f"{tf['cudnn']:8.1f} {tf['cuda-hopper'] / tf['cudnn']:8.2f} "
                      f"{tf['cuda-hopper'] / tf['flash']:8.2f}", flush=True)
                del q, k, v, do, o, g


run(args, res, correctness, bench, shown=20)
