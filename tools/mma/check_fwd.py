"""GPU check of cuda-mma's forward (the kernels its plan picks: src/cuda/mma/fwd.cu's fc_mma_fwd_plan_of): correctness
against an fp64 reference, with the keys of each tile split as the plan chooses (num_splits 0) and in forced counts,
then TFLOP/s against PyTorch SDPA (flash, cudnn) on the shapes of docs/targets.md.
Run through tools/mma/bench-fwd.sh, or:

    python3 tools/mma/check_fwd.py --lib build-mmafwd-gpu/libflashc.so [--quick] [--no-check] [--no-bench]
                                   [--splits 0,1,3,64] [--csv results.csv]

Correctness rule (FlashAttention's): the kernel's max |error| against the fp64 reference is at most 2x the error
of the same maths done plainly in the kernel's precision (matmuls in bf16/fp16, softmax in fp32), + 1e-4.
Outputs and lse are poisoned with NaN before every call; lse must match to 2e-3 and be -inf exactly where a row
sees no key (its output 0). Every case runs for every count of --splits (flashc_params.num_splits: 0 the plan's
choice, 1 none, n > 1 at most n parts), so that a failure names the count.
The timings are medians of CUDA-event times after warm-up, L2 flushed before each call; the table printed last
gives cuda-mma's TFLOP/s over SDPA flash's in the same run (the bar: >= 1.1 at seqlen >= 1k).
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for gpucheck
from gpucheck import (Flashc, Results, arg_parser, check_forward, inputs, make, peer_ms, run,  # noqa: E402
                      sdpa_forward_ms, timeit)

ap = arg_parser("build-mmafwd-gpu/libflashc.so", "fewer shapes and seqlens (smoke test)")
ap.add_argument("--splits", default="0,1,3,64", help="num_splits of the correctness cases (0: the plan's choice)")
ap.add_argument("--dtypes", default="bf16,fp16")
ap.add_argument("--dims", default="64,128,256", help="head dims of the timings")
ap.add_argument("--masks", default="0,1", help="causal values of the timings")
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--csv", default="", help="also write the timings here (docs/targets.md's columns)")
args = ap.parse_args()

fc = Flashc(args.lib)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
OK, INVALID = fc.OK, fc.INVALID
DIMS = [int(x) for x in args.dims.split(",")]
MASKS = [int(x) for x in args.masks.split(",")]
res = Results()
record = res.record


def forward(p, q, k, v, o, lse):
    return fc.forward("cuda-mma", p, q, k, v, o, lse)


def check(splits, dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd", want_lse=True,
          varlen=None):
    tag = (f"splits {splits:<3d} {str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} "
           f"w({wl},{wr}) {layout}" + (f" varlen{varlen}" if varlen else ""))
    q, k, v, seqs, cu = inputs(dtype, b, sq, sk, hq, hkv, d, layout, varlen)
    p, keep = fc.params(causal, align, wl, wr, cu=cu)
    p.num_splits = splits
    o = torch.full(q.shape, float("nan"), device="cuda", dtype=dtype)
    lse = torch.full((hq * q.shape[0] * q.shape[1],), float("nan"), device="cuda") if want_lse else None
    st = forward(p, q, k, v, o, lse)
    torch.cuda.synchronize()
    if st != OK:
        record(tag, False, f"status {st}: {fc.last_error()}")
    else:
        check_forward(record, tag, dtype, q, k, v, o, lse, seqs, (causal, align, wl, wr), varlen)
    del keep


def correctness():
    torch.manual_seed(0)
    shapes = [(1, 1), (97, 97), (257, 257), (1025, 1025), (113, 203), (203, 113), (1, 147), (1024, 1023)]
    masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
    dims = (59, 64, 111, 128, 256)
    layouts = ["bshd", "bhsd", "padded", "odd"]
    if args.quick:
        shapes, masks, dims = [(97, 97), (1025, 1025), (203, 113)], [dict(), dict(causal=1)], (64, 128, 256)
    n = 0
    for splits in (int(x) for x in args.splits.split(",")):
        t0 = time.time()
        for dtype in (torch.bfloat16, torch.float16):
            # fp16 differs from bf16 only in the MMA and the packing of P: fewer shapes
            for d in dims:
                few = [(97, 97), (1025, 1025), (113, 203)]
                for sq, sk in (shapes if dtype == torch.bfloat16 or args.quick else few):
                    for m in masks:
                        n += 1
                        check(splits, dtype, 2, sq, sk, 4, 2, d, layout=layouts[n % 4], **m)  # GQA 2:1
            for d in (32, 96, 160, 192):  # the other compiled head dims, once each (quick too: sanitizer runs)
                check(splits, dtype, 1, 257, 300, 4, 2, d, causal=1, layout="padded")
            if args.quick:
                continue
            check(splits, dtype, 1, 300, 300, 8, 1, 128)  # MQA
            check(splits, dtype, 2, 300, 300, 4, 4, 64, causal=1, want_lse=False)
            check(splits, dtype, 1, 1025, 1025, 2, 2, 256, layout="odd", causal=1)
            check(splits, dtype, 1, 0, 0, 4, 2, 128, causal=1,
                  varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
            check(splits, dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd",
                  varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
            check(splits, dtype, 1, 0, 0, 4, 2, 256, wl=64, wr=8, layout="odd", varlen=([200, 1, 129], [300, 64, 0]))
        print(f"splits {splits}: {res.count(f'splits {splits:<3d} ')[0]} cases in "
              f"{time.time() - t0:.0f} s, failures so far {len(res.failures)}", flush=True)
    # A negative count is the caller's error, refused before any write.
    q = make(1, 64, 2, 64, torch.bfloat16, "bshd")
    o = torch.full(q.shape, float("nan"), device="cuda", dtype=q.dtype)
    p, _ = fc.params()
    p.num_splits = -1
    st = forward(p, q, q, q, o, None)
    record("num_splits -1", st == INVALID and bool(torch.isnan(o).all()), f"status {st}: {fc.last_error()}")
    print(f"correctness: {res.passed()}", flush=True)


# ---- timings -----------------------------------------------------------------------------------------------
def bench():
    configs = ["cuda-mma"]  # the plan's kernels (num_splits 0)
    timer = lambda fn: timeit(fn, reps=args.reps, warmup=3, flush_mb=256)  # noqa: E731
    dev = torch.cuda.get_device_name()
    print(f"\n== forward TFLOP/s on {dev}, 16k tokens, width 2048 ==", flush=True)
    cols = configs + ["flash", "cudnn"]
    print(f"{'dtype':>5} {'d':>4} {'causal':>6} {'seqlen':>6} " + " ".join(f"{c:>8}" for c in cols), flush=True)
    seqlens = (1024, 4096, 16384) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    table = []  # (dtype, d, causal, seqlen, {impl: tflops})
    csv = open(args.csv, "a") if args.csv else None
    if csv and csv.tell() == 0:
        csv.write("date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,world,"
                  "threads,ms,tflops,gbps,max_abs_err,rel_l2_err\n")
    for dname in args.dtypes.split(","):
        dtype = DTYPES[dname]
        for d in DIMS:
            for causal in MASKS:
                for s in seqlens:
                    b, h = 16384 // s, 2048 // d
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))
                    flops = 4 * b * h * s * s * d / (2 if causal else 1)
                    ms = {}
                    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))  # [b, s, h, d] views of the same memory
                    o = torch.empty_like(qv)
                    lse = torch.empty(b * h * s, device="cuda")
                    p, _ = fc.params(causal=causal, align=1)
                    for config in configs:
                        if forward(p, qv, kv, vv, o, lse) != OK:
                            print(config, fc.last_error(), flush=True)
                            ms[config] = float("nan")
                            continue
                        ms[config] = timer(lambda: forward(p, qv, kv, vv, o, lse))
                    for name in ("flash", "cudnn"):
                        ms[name] = peer_ms(name, lambda: sdpa_forward_ms(name, q, k, v, causal, timer), quiet=True)
                    tf = {kk: flops / t / 1e9 for kk, t in ms.items()}
                    table.append((dname, d, causal, s, tf))
                    print(f"{dname:>5} {d:4d} {causal:6d} {s:6d} " + " ".join(f"{tf[c]:8.1f}" for c in cols),
                          flush=True)
                    if csv:
                        for impl, t in ms.items():
                            name = f"torch:{impl}" if impl in ("flash", "cudnn") else f"flashc:{impl}"
                            csv.write(f"{time.strftime('%Y-%m-%d')},{dev},,{name},{dname},{b},{h},{h},{s},{s},{d},"
                                      f"{causal},fwd,1,0,{t:.4f},{tf[impl]:.2f},,,\n")
                    del q, k, v, o
    if csv:
        csv.close()

    # The table the next step reads: cuda-mma's TFLOP/s over flash's, per cell; then per (d, causal) the worst cell
    # at seqlen >= 1k (the bar is >= 1.1 everywhere there).
    print(f"\n== ratio to SDPA flash (same run); bar: >= 1.10 at seqlen >= 1k ==", flush=True)
    print(f"{'dtype':>5} {'d':>4} {'c':>2} {'seqlen':>6} " + " ".join(f"{c:>8}" for c in configs) + f" {'cudnn':>8}")
    for dname, d, causal, s, tf in table:
        print(f"{dname:>5} {d:4d} {causal:2d} {s:6d} " + " ".join(f"{tf[c] / tf['flash']:8.2f}" for c in configs) +
              f" {tf['cudnn'] / tf['flash']:8.2f}")
    print(f"\n== worst ratio to flash over seqlen >= 1k (both dtypes), per head dim and mask ==")
    print(f"{'d':>4} {'c':>2} " + " ".join(f"{c:>8}" for c in configs) + "  best")
    for d in DIMS:
        for causal in MASKS:
            cells = [tf for _, dd, cc, s, tf in table if dd == d and cc == causal and s >= 1024]
            worst = {c: min(tf[c] / tf["flash"] for tf in cells) for c in configs}
            best = max(configs, key=lambda c: worst[c] if worst[c] == worst[c] else -1)
            print(f"{d:4d} {causal:2d} " + " ".join(f"{worst[c]:8.2f}" for c in configs) + f"  {best}")


run(args, res, correctness, bench, shown=30)
