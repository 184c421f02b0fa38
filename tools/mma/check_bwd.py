"""GPU check of cuda-mma's backward (the kernels its plan picks: src/cuda/mma/bwd.cu): correctness of dq, dk, dv
against an fp64 reference, then backward TFLOP/s against PyTorch SDPA flash and cudnn on the shapes of
docs/targets.md. Run through tools/mma/bench-bwd.sh, or:

    python3 tools/mma/check_bwd.py --lib build-gpu-mmabwd/libflashc.so [--quick] [--no-check] [--no-bench]
                                   [--csv mma-bwd.csv]

The kernels (fc_mma_bwd_plan_of): fa2pb (dQ staged in shared memory, one bulk add per query block; register-lean
kernels at d <= 128) on sm_90, fa2p elsewhere, fa2 in deterministic mode (and for |scale| < 1e-30), the first
64x64 kernel where the fa2 tiles do not fit the device's shared memory. The cases below cover every head dim,
deterministic mode and a negative scale, so on one GPU they run every kernel the plan picks there.

Correctness rule (FlashAttention's for gradients): per gradient, max |error| against the fp64 reference is at
most 3x the error of the same maths done plainly in the kernel's precision (matmuls in bf16/fp16, softmax and
dS in fp32), + 1e-4. o and lse come from the fp64 reference (o rounded to the dtype), so the forward kernel is
not under test here. dq, dk, dv are poisoned with NaN before every call, including the padding of strided
layouts, which must stay NaN (no write past head_dim). The deterministic mode must give bit-identical
gradients over two runs. Rows that see no key must get dq = 0, keys seen by no query dk = dv = 0, never NaN.
"""
import datetime
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tools/, for the shared modules
from bwd_configs import Spec, main  # noqa: E402
from gpucheck import (CSV_COLUMNS, best_of, git_commit, peer_ms, sdpa_backward_ms, tflops, timeit,  # noqa: E402
                      write_csv)

SPEC = Spec(backend="cuda-mma", dtypes=(torch.bfloat16, torch.float16), bits=torch.int16,
            floor=lambda mag, lse: 1e-4, lib="build-gpu-mmabwd/libflashc.so",
            quick_help="a few shapes, and seqlens 1k/4k/16k in the bench")


def bench(h):
    """Backward TFLOP/s of cuda-mma and of SDPA flash and cudnn (autograd backward only) on docs/targets.md's
    shapes; the CSV (--csv) gets docs/targets.md's columns + config."""
    args, configs = h.args, h.configs
    dev = torch.cuda.get_device_name()
    commit = git_commit()
    rows, table = [], []
    cols = CSV_COLUMNS + ["config"]
    timer = lambda fn: timeit(fn, reps=20, warmup=3)  # noqa: E731
    print(f"\n== backward TFLOP/s on {dev}, 16k tokens, width 2048 (torch: autograd backward only) ==", flush=True)
    seqlens = (1024, 4096, 16384) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
    for dtype in (torch.bfloat16, torch.float16):
        for d in (64, 128, 256):
            for causal in (0, 1):
                for s in seqlens:
                    b, nh = 16384 // s, 2048 // d
                    q, k, v, dout = (torch.randn(b, nh, s, d, device="cuda", dtype=dtype) for _ in range(4))
                    flops = 2.5 * 4 * b * nh * s * s * d / (2 if causal else 1)
                    res = h.time_configs(q, k, v, dout, causal, timer)  # cuda-mma's ms
                    for name in ("flash", "cudnn"):
                        res[name] = peer_ms(name, lambda: sdpa_backward_ms(name, q, k, v, dout, causal, timer))
                    tf = tflops(flops, res)
                    best = best_of(configs, tf)
                    table.append((str(dtype)[6:], d, causal, s, tf, best))
                    print(f"{str(dtype)[6:]:8s} d{d:3d} causal{causal} s{s:5d} " +
                          " ".join(f"{kk} {x:6.1f}" for kk, x in tf.items()) +
                          f"  {best}/flash {tf[best] / tf['flash']:.2f}", flush=True)
                    for kk, ms in res.items():
                        impl = "flashc:cuda-mma" if kk in configs else f"torch:{kk}"
                        rows.append([datetime.date.today().isoformat(), dev, commit, impl, str(dtype)[6:], b, nh, nh,
                                     s, s, d, causal, "bwd", 1, 0, ms, tf[kk], "", "", "", kk if kk in configs else ""])
                    del q, k, v, dout
    if args.csv:
        write_csv(args.csv, cols, rows)
    print(f"\n== backward TFLOP/s, compact ({dev}); ratio = flashc / flash, then / cudnn ==")
    print(f"{'dtype':8s} {'d':>3} {'c':>1} {'seqlen':>6} " + " ".join(f"{c:>6}" for c in configs) +
          f" {'flash':>6} {'cudnn':>6} {'best':>5} {'x flash':>7} {'x cudnn':>7}")
    for dt, d, causal, s, tf, best in table:
        print(f"{dt:8s} {d:3d} {causal:1d} {s:6d} " + " ".join(f"{tf[c]:6.1f}" for c in configs) +
              f" {tf['flash']:6.1f} {tf['cudnn']:6.1f} {best:>5} {tf[best] / tf['flash']:7.2f} "
              f"{tf[best] / tf['cudnn']:7.2f}")


if __name__ == "__main__":
    main(SPEC, bench)
