"""GPU check of cuda-hopper (H100/H200): correctness against an fp64 reference, then timings against PyTorch
SDPA (flash, cudnn) on the shapes of docs/targets.md. Run through tools/hopper/gpu.sh, or:

    python3 tools/hopper/check.py --lib build-gpu/libflashc.so [--quick] [--no-bench]

Correctness rule (FlashAttention's): the kernel's max |error| against the fp64 reference is at most 2x the error
of the same maths done plainly in the kernel's precision (matmuls in bf16/fp16, softmax in fp32), + 1e-4.
Outputs and lse are poisoned with NaN before every call; lse must match to 2e-3 and be -inf exactly where a
row sees no key. Every case runs the library's own plan for it (src/cuda/hopper/fwd.cu, fc_hp_fwd_plan): the persistent
kernel with 3 consumer warpgroups at d <= 64, with 2 at d <= 128 (the one-tile ping-pong kernel with a causal mask from
8192 keys), the persistent D = 256 kernel without a mask and the one-tile one with a mask at d > 128; the TMA store of o
where TMA can address o, direct stores where it cannot; the dynamic or stride order and the split last rounds where the
plan takes them. The timings take q, k, v as contiguous [b, s, h, d] tensors (--layout bshd, the layout users and
bench/compare.py pass) or as head-major memory passed as [b, s, h, d] views (--layout bhsd). The "many tiles"
cases give each CTA of the persistent grid several tiles (Br = 128 and, at d <= 64, Br = 192), among them tiles with
no visible key and tiles past their sequence, with the TMA store of o and without.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for gpucheck
from gpucheck import (Flashc, Results, arg_parser, check_forward, inputs, make, peer_ms, run,  # noqa: E402
                      sdpa_forward_ms, timeit)

ap = arg_parser("build-gpu/libflashc.so", "a few shapes only (smoke test)")
ap.add_argument("--tiny", action="store_true", help="two small shapes, causal only (racecheck, which is slow)")
ap.add_argument("--many-tiles", action="store_true", help="only short cases with several tiles per CTA of the "
                "persistent grid, bf16: compute-sanitizer (racecheck too) on the tile ring and the split rounds")
ap.add_argument("--bench-d", default="64,128,256", help="head dims timed (default 64,128,256)")
ap.add_argument("--layout", choices=("bshd", "bhsd"), default="bshd",
                help="memory of q, k, v, o in the timings: bshd = contiguous [b, s, h, d] tensors (default: what "
                "bench/compare.py and users pass); bhsd = head-major [b, h, s, d] memory passed as [b, s, h, d] views")
args = ap.parse_args()

os.environ.pop("FLASHC_HOPPER", None)  # the backend must not be hidden here
fc = Flashc(args.lib)
OK, UNSUPPORTED = fc.OK, fc.UNSUPPORTED
res = Results()
record = res.record


def forward(backend, p, q, k, v, o, lse):
    return fc.forward(backend, p, q, k, v, o, lse)


def check(dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd", want_lse=True, varlen=None,
          expect=OK, o_layout="bshd"):
    """One case (fresh random inputs) against the reference. o is laid out as o_layout says (any strides: cuda-hopper
    takes every o)."""
    case = (f"{str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} "
            f"w({wl},{wr}) {layout}" + (f" o:{o_layout}" if o_layout != "bshd" else "") +
            (f" varlen{len(varlen[0])}" if varlen else ""))
    q, k, v, seqs, cu = inputs(dtype, b, sq, sk, hq, hkv, d, layout, varlen)
    p, keep = fc.params(causal, align, wl, wr, cu=cu)
    o = make(*q.shape, dtype, o_layout, fill=float("nan"))
    lse = torch.full((hq * q.shape[0] * q.shape[1],), float("nan"), device="cuda") if want_lse else None
    st = forward("cuda-hopper", p, q, k, v, o, lse)
    torch.cuda.synchronize()
    if expect != OK:
        msg = fc.last_error()
        o2 = torch.full(q.shape, float("nan"), device="cuda", dtype=dtype)
        st2 = forward("auto", p, q, k, v, o2, None)
        fell_back = fc.last_backend("auto")
        record(case + " (must refuse)", st == expect and st2 == OK and fell_back != "cuda-hopper",
               f"status {st} ({msg}); auto ran {fell_back!r} with status {st2}")
    elif st != OK:
        record(case, False, f"status {st}: {fc.last_error()}")
    else:
        check_forward(record, case, dtype, q, k, v, o, lse, seqs, (causal, align, wl, wr), varlen)
    del keep


def sanitizer_tiles(dtype):
    """Short tiles, more per CTA of the persistent grid than the tile ring's two entries (400-800 tiles on 132 SMs),
    and little data, so that compute-sanitizer's racecheck gets through: unmasked (tmastore's split rounds cut tiles;
    tmastore3 walks whole ones) and bottom-right causal with sq > sk (tiles without a load between loaded ones)."""
    check(dtype, 1, 130, 130, 400, 100, 64)
    check(dtype, 1, 130, 130, 300, 75, 128)
    check(dtype, 1, 130, 4096, 150, 30, 256)  # D = 256 (Bc 80): one Q slot, O from registers, split rounds (4096 keys)
    check(dtype, 1, 300, 100, 400, 100, 64, causal=1, align=0)


def many_tiles(dtype):
    """Cases with several tiles per CTA of the persistent grid (one CTA per SM: 132 on an H100), so that the
    barrier phases carried from tile to tile, the skipped tiles and the epilogue/next-tile overlap are exercised
    (the other cases have fewer tiles than SMs). o in several layouts: tmastore's TMA store where TMA can address
    o, its fallback to direct stores where it cannot (odd strides, varlen)."""
    check(dtype, 4, 1025, 1025, 16, 4, 128, o_layout="bhsd")  # 9 x 64 = 576 tiles, full
    check(dtype, 2, 1100, 300, 32, 8, 128, causal=1, align=0, layout="bhsd",  # bottom-right: rows < 800 see
          o_layout="padded")  # no key (tiles without a load between tiles with)
    rng = torch.Generator().manual_seed(7)
    lens_q = [int(x) for x in torch.randint(0, 700, (40,), generator=rng)]
    lens_k = [max(0, lq + int(x)) for lq, x in zip(lens_q, torch.randint(-50, 200, (40,), generator=rng))]
    lens_q[3], lens_k[5], lens_q[9], lens_k[9] = 0, 0, 1, 1
    check(dtype, 1, 0, 0, 8, 2, 64, causal=1, varlen=(lens_q, lens_k))  # 40 sequences: many skipped tiles
    # d 64 (tmastore3: Br = 192, 6 x 64 = 384 tiles, ~3 per CTA) with the TMA store: rows >= 400 see no key (top-left
    # window), so each CTA's list opens with tiles without a load (the heaviest-first order puts the last query
    # blocks first) before loaded ones; the last block's rows 1100..1151 are clipped by the store
    check(dtype, 2, 1100, 300, 32, 8, 64, align=1, wl=100, wr=0, layout="bhsd")
    # d 64, full, TMA store: several loaded tiles per CTA, 384 (Br 192); tmastore's split rounds (2 consumers only)
    check(dtype, 4, 1025, 1025, 16, 4, 64)
    if args.quick:
        return
    check(dtype, 1, 0, 0, 8, 2, 128, varlen=(lens_q, lens_k), layout="bhsd")
    check(dtype, 1, 2049, 2049, 32, 4, 64, wl=100, wr=50, layout="padded",  # 17 x 32 tiles; o rows of 65
          o_layout="odd")  # elements: TMA cannot store them, tmastore falls back to direct stores
    check(dtype, 2, 1025, 1025, 32, 32, 111, causal=1, align=1, layout="padded",  # d 111 (D = 128): the TMA
          o_layout="odd")  # store clips columns 111.. (o's rows of 112 elements are 16-byte aligned)


def head_dim_256(dtype):
    """Head dims 129..256 run as D = 256 (Bc = 80, 2 stages): full, causal both alignments, windows, GQA, varlen,
    padded layouts, d 192 and 129 (zero-filled columns), a key tail that is not a multiple of 80. Unmasked dense cases
    run the persistent D = 256 kernel (one Q slot, O stored from registers: no room for sO) with several tiles per CTA:
    whole tiles below 4096 keys, the split rounds from 4096; masked ones the one-tile ping-pong kernel."""
    check(dtype, 2, 97, 97, 4, 2, 256)
    check(dtype, 2, 1025, 1025, 20, 4, 256, layout="bhsd")  # whole tiles (the plan's choice below 4096 keys)
    check(dtype, 2, 1025, 4096, 20, 4, 256, layout="bhsd")  # the split rounds (from 4096 keys)
    check(dtype, 2, 1025, 1025, 4, 2, 256, causal=1, align=1, layout="bhsd")
    check(dtype, 2, 203, 113, 4, 2, 256, causal=1, align=0)
    check(dtype, 1, 0, 0, 4, 2, 256, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))  # unmasked varlen
    if args.quick:
        return
    check(dtype, 1, 1, 1, 2, 1, 256)
    check(dtype, 2, 1024, 1023, 4, 4, 256, wl=200, wr=0, layout="padded")
    check(dtype, 1, 4096, 4096, 2, 1, 256, causal=1)
    check(dtype, 2, 257, 333, 4, 2, 192, layout="padded", o_layout="odd")
    check(dtype, 2, 300, 300, 4, 2, 129, causal=1, layout="padded", want_lse=False)
    check(dtype, 1, 0, 0, 4, 2, 256, causal=1, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))


def correctness():
    torch.manual_seed(0)
    shapes = [(1, 1), (97, 97), (1025, 1025), (4096, 4096), (113, 203), (203, 113), (1, 147), (1024, 1023)]
    masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
    layouts = ["bshd", "bhsd", "padded"]
    if args.quick:
        shapes, masks = [(97, 97), (1025, 1025), (203, 113)], [dict(), dict(causal=1)]
    if args.tiny:
        shapes, masks = [(97, 97), (203, 113)], [dict(causal=1)]
    if args.many_tiles:
        sanitizer_tiles(torch.bfloat16)
        return
    n = 0
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128):
            for sq, sk in shapes:
                for m in masks:
                    n += 1
                    b, h = (1, 2) if max(sq, sk) >= 4096 else (2, 4)
                    check(dtype, b, sq, sk, h, h // 2, d, layout=layouts[n % 3], **m)  # GQA 2:1
        if args.tiny:
            continue
        many_tiles(dtype)
        head_dim_256(dtype)
        if args.quick:
            continue
        check(dtype, 1, 300, 300, 8, 1, 128)  # MQA
        check(dtype, 2, 300, 300, 4, 4, 64, causal=1, want_lse=False)
        check(dtype, 1, 257, 300, 4, 2, 100, layout="padded")  # d = 100 runs as D = 128
        check(dtype, 1, 257, 300, 4, 2, 40, causal=1, layout="padded")  # d = 40 runs as D = 64
        check(dtype, 1, 0, 0, 4, 2, 128, causal=1, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
        check(dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd",
              varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
        check(dtype, 1, 300, 300, 4, 4, 64, layout="odd", expect=UNSUPPORTED)  # TMA cannot: auto falls back
    print(f"correctness: {res.passed()}", flush=True)


# ---- timings -----------------------------------------------------------------------------------------------
def bench():
    timer = lambda fn: timeit(fn, reps=30, warmup=5)  # noqa: E731
    print(f"\n== forward TFLOP/s on {torch.cuda.get_device_name()}, bf16, 16k tokens, width 2048, q/k/v/o "
          f"{args.layout} ==", flush=True)
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'flashc':>8} {'flash':>8} {'cudnn':>8} {'ours/cudnn':>10}",
          flush=True)
    seqlens = (1024, 4096, 16384) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    for d in (int(x) for x in args.bench_d.split(",")):
        for causal in (0, 1):
            for s in seqlens:
                b, h = 16384 // s, 2048 // d
                if args.layout == "bshd":  # flashc takes the tensors, SDPA [b, h, s, d] views of them
                    qv, kv, vv = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    q, k, v = (x.transpose(1, 2) for x in (qv, kv, vv))
                else:  # head-major memory: SDPA takes the tensors, flashc [b, s, h, d] views of them
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                res = {}
                o = torch.empty_like(qv)  # the same layout as q (empty_like keeps a view's strides)
                lse = torch.empty(b * h * s, device="cuda")
                p, _ = fc.params(causal=causal, align=1)
                if forward("cuda-hopper", p, qv, kv, vv, o, lse) != OK:
                    print(f"d {d} causal {causal} seqlen {s}: {fc.last_error()}")
                    res["flashc"] = float("nan")
                else:
                    res["flashc"] = timer(lambda: forward("cuda-hopper", p, qv, kv, vv, o, lse))
                for name in ("flash", "cudnn"):
                    res[name] = peer_ms(name, lambda: sdpa_forward_ms(name, q, k, v, causal, timer), quiet=True)
                tf = {kk: flops / ms / 1e9 for kk, ms in res.items()}
                print(f"{d:4d} {causal:6d} {s:6d} {tf['flashc']:8.1f} {tf['flash']:8.1f} {tf['cudnn']:8.1f} "
                      f"{tf['flashc'] / tf['cudnn']:10.2f}", flush=True)
                del q, k, v, qv, kv, vv, o


run(args, res, correctness, bench, shown=20)
