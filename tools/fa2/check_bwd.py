"""GPU check of cuda-fa2-fp32's backward (the fused kernel at d <= 64 in the atomic mode, the accumulator kernels
elsewhere and the deterministic dQ pass: src/cuda/ladder/fa2_fp32_bwd.cu): correctness of dq, dk, dv against an fp64 reference, then backward TFLOP/s against PyTorch SDPA `efficient` (fp32) on b4 h8 d64 seqlen
1024..8192 and b8 h16 s2048 d64, full and causal. Run through tools/fa2/bench-bwd.sh, or:

    python3 tools/fa2/check_bwd.py --lib build-gpu-fa2bwd/libflashc.so [--quick] [--no-check] [--no-bench]
                                   [--csv fa2-bwd.csv]

Correctness rule: per gradient, max |error| against the fp64 reference is at most 3x the error of the same maths
done plainly in fp32 (TF32 off), + the floor of tests/test_backends.c. o and lse come from the fp64 reference (o
rounded to fp32), so the forward kernel is not under test here. dq, dk, dv are poisoned with NaN before every call,
including the padding of strided layouts, which must stay NaN (no write past head_dim). The deterministic mode must
give bit-identical gradients over two runs. Rows that see no key must get dq = 0, keys seen by no query dk = dv = 0,
never NaN.
"""
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for the shared modules
from bwd_configs import Spec, main  # noqa: E402
from gpucheck import (CSV_COLUMNS, best_of, git_commit, peer_ms, sdpa_backward_ms, tflops, timeit,  # noqa: E402
                      write_csv)


def floor(mag, lse):
    """The floor, as tests/test_backends.c has it: relative to the largest of the three gradients (dS = P∘(dP − D)
    cancels, so dq and dk carry u·|P||dP|·|k| whatever their own size: one key gives dq = 0 exactly, yet the
    kernel's D from the rounded o leaves ~u there), 16u for the kernel's exp2 and rescales, plus 2u·|lse| for
    the fp32 lse that P = 2^(S − lse) starts from."""
    lse_max = lse[torch.isfinite(lse)].abs().max().item() if torch.isfinite(lse).any() else 0.0
    return (16 + 2 * max(1.0, lse_max)) * 2.0**-24 * max(mag.values())


SPEC = Spec(backend="cuda-fa2-fp32", dtypes=(torch.float32,), bits=torch.int32,
            floor=floor, lib="build-gpu-fa2bwd/libflashc.so",
            quick_help="a few shapes, and seqlens 1k/4k in the bench")
torch.backends.cuda.matmul.allow_tf32 = False  # the plain fp32 reference must be fp32


def more_args(ap):
    ap.add_argument("--reps", type=int, default=30, help="timed calls per case (median)")


def bench(h):
    """Backward TFLOP/s of cuda-fa2-fp32 and of SDPA efficient (fp32; autograd backward only), fp32 d64; the CSV
    (--csv) gets the results schema of bench/compare.py, config = fa2bwd."""
    args, configs = h.args, h.configs
    dev = torch.cuda.get_device_name()
    commit = git_commit()
    rows, table = [], []
    cols = CSV_COLUMNS + ["config", "status", "speedup", "baseline", "repeats", "reference", "note"]
    timer = lambda fn: timeit(fn, reps=args.reps, warmup=5)  # noqa: E731
    print(f"\n== backward TFLOP/s on {dev}, fp32 d64 (torch: autograd backward of SDPA efficient only) ==", flush=True)
    shapes = [(4, 8, s) for s in ((1024, 4096) if args.quick else (1024, 2048, 4096, 8192))] + [(8, 16, 2048)]
    d = 64
    for b, nh, s in shapes:
        for causal in (0, 1):
            q, k, v, dout = (torch.randn(b, nh, s, d, device="cuda") for _ in range(4))
            flops = 2.5 * 4 * b * nh * s * s * d / (2 if causal else 1)
            res = h.time_configs(q, k, v, dout, causal, timer)  # cuda-fa2-fp32's ms
            res["efficient"] = peer_ms("efficient", lambda: sdpa_backward_ms("efficient", q, k, v, dout, causal, timer))
            tf = tflops(flops, res)
            best = best_of(configs, tf)
            table.append((b, nh, s, causal, tf, best))
            print(f"b{b} h{nh} s{s:5d} causal{causal} " + " ".join(f"{kk} {x:6.2f}" for kk, x in tf.items()) +
                  f"  {best}/efficient {tf[best] / tf['efficient']:.3f}", flush=True)
            for kk, ms in res.items():
                mine = kk in configs
                rows.append([datetime.date.today().isoformat(), dev, commit,
                             "flashc:cuda-fa2-fp32" if mine else "torch:efficient", "f32", b, nh, nh, s, s, d, causal,
                             "bwd", 1, 0, ms, tf[kk], "", "", "", "fa2bwd",
                             "pass" if mine else "peer", res["efficient"] / ms, "torch:efficient", args.reps, "", ""])
            del q, k, v, dout
    if args.csv:
        write_csv(args.csv, cols, rows)
    print(f"\n== backward TFLOP/s, compact ({dev}); x eff = flashc / SDPA efficient (fp32), >= 1.00 is the goal ==")
    print(f"{'b':>2} {'h':>2} {'seqlen':>6} {'c':>1} " + " ".join(f"{c:>7}" for c in configs) + f" {'eff':>7} " +
          " ".join(f"{'x ' + c:>8}" for c in configs) + f" {'best':>6}")
    for b, nh, s, causal, tf, best in table:
        print(f"{b:2d} {nh:2d} {s:6d} {causal:1d} " + " ".join(f"{tf[c]:7.2f}" for c in configs) +
              f" {tf['efficient']:7.2f} " + " ".join(f"{tf[c] / tf['efficient']:8.3f}" for c in configs) +
              f" {best:>6}")


if __name__ == "__main__":
    main(SPEC, bench, more_args=more_args)
