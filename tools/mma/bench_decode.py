"""Decoding-shaped forward calls (a few query rows against a long key cache) on a GPU: flashc beside PyTorch SDPA
(flash, cudnn) in the same run, for cuda-mma's split keys (mma/fwd_split.cuh). Medians of CUDA-event times after
warm-up, L2 flushed before each call; the ratio printed last is each column's time over SDPA flash's (> 1: faster).

    python3 tools/mma/bench_decode.py --lib build-gpu/libflashc.so [--csv out.csv]

Columns: auto (the library's choice: on sm_90 cuda-hopper leaves these calls to cuda-mma's split), cuda-mma with
the split (its own count), cuda-mma whole (num_splits 1: one CTA per query tile and head), cuda-hopper.
Bandwidth: the bytes of K and V read once over the time (the floor of a decoding step).
"""
import argparse
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for gpucheck
from gpucheck import CSV_COLUMNS, Flashc, git_commit, peer_ms, sdpa_forward_ms, timeit, write_csv  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="build-gpu/libflashc.so")
ap.add_argument("--reps", type=int, default=30)
ap.add_argument("--csv", default="")
args = ap.parse_args()

fc = Flashc(args.lib)
CASES = [  # (batch, query rows, keys, heads, head dim)
    (1, 1, 4096, 32, 128),
    (1, 1, 32768, 32, 128),
    (1, 1, 131072, 32, 128),
    (4, 1, 16384, 32, 128),
    (8, 1, 8192, 32, 128),
    (1, 16, 32768, 32, 128),
    (1, 1, 32768, 16, 256),
    (1, 1, 32768, 32, 64),
]
COLS = ["auto", "mma-split", "mma-whole", "hopper", "flash", "cudnn"]
IMPL = {"mma-split": "flashc:cuda-mma", "mma-whole": "flashc:cuda-mma", "hopper": "flashc:cuda-hopper",
        "flash": "torch:flash", "cudnn": "torch:cudnn"}  # fmt: skip
timer = lambda fn: timeit(fn, reps=args.reps, warmup=3, flush_mb=256)  # noqa: E731
dev = torch.cuda.get_device_name()
print(f"== decoding forward, bf16, {dev}: ms (GB/s of K and V) ==", flush=True)
print(f"{'b':>2} {'sq':>3} {'sk':>7} {'h':>3} {'d':>4} " + " ".join(f"{c:>16}" for c in COLS), flush=True)
rows, ratios = [], []
commit = git_commit()
for b, sq, sk, h, d in CASES:
    q = torch.randn(b, h, sq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, h, sk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    qv, kv, vv = (x.transpose(1, 2) for x in (q, k, v))  # [b, s, h, d] views, as flashc takes them
    o = torch.empty_like(qv)
    p, _ = fc.params()
    ms = {}
    for col, backend, splits in (("auto", "auto", 0), ("mma-split", "cuda-mma", 0),
                                 ("mma-whole", "cuda-mma", 1), ("hopper", "cuda-hopper", 0)):  # fmt: skip
        p.num_splits = splits  # 0: the plan's count
        if fc.forward(backend, p, qv, kv, vv, o, None) != fc.OK:
            ms[col] = float("nan")
            continue
        ms[col] = timer(lambda: fc.forward(backend, p, qv, kv, vv, o, None))  # noqa: B023
        if col == "auto":
            auto_ran = fc.last_backend("auto")
    for name in ("flash", "cudnn"):
        ms[name] = peer_ms(name, lambda: sdpa_forward_ms(name, q, k, v, False, timer), quiet=True)  # noqa: B023
    gb = 2 * b * h * sk * d * 2 / 1e9
    print(f"{b:2d} {sq:3d} {sk:7d} {h:3d} {d:4d} " + " ".join(f"{ms[c]:7.3f} ({gb / ms[c] * 1e3:6.0f})" for c in COLS)
          + f"  auto ran {auto_ran}", flush=True)  # fmt: skip
    ratios.append((b, sq, sk, h, d, {c: ms["flash"] / ms[c] for c in COLS}))
    flops = 4 * b * h * sq * sk * d
    for c in COLS:
        impl = IMPL[c] if c != "auto" else f"flashc:auto({auto_ran})"
        note = "num_splits=1" if c == "mma-whole" else ""
        rows.append([datetime.date.today().isoformat(), dev, commit, impl, "bf16", b, h, h, sq, sk, d, 0, "fwd", 1, 0,
                     f"{ms[c]:.5f}", f"{flops / ms[c] / 1e9:.2f}", f"{gb / ms[c] * 1e3:.1f}", "", "",
                     note])  # fmt: skip
print("\n== time of SDPA flash over each column's (> 1: faster than flash) ==", flush=True)
print(f"{'b':>2} {'sq':>3} {'sk':>7} {'h':>3} {'d':>4} " + " ".join(f"{c:>9}" for c in COLS))
for b, sq, sk, h, d, r in ratios:
    print(f"{b:2d} {sq:3d} {sk:7d} {h:3d} {d:4d} " + " ".join(f"{r[c]:9.2f}" for c in COLS))
if args.csv:
    write_csv(args.csv, CSV_COLUMNS + ["note"], rows)
