#!/usr/bin/env python3
"""tools/profile/kernel_times.py — per-kernel GPU time of one backward call of flashc's tensor-core backends and of
PyTorch SDPA's flash and cudnn backends, side by side, through torch.profiler (CUPTI; no ncu needed):

    PYTHONPATH=python FLASHC_LIBRARY=build-gpu/libflashc.so python3 tools/profile/kernel_times.py [D/S/CAUSAL ...]

A case D/S/CAUSAL (default 64/1024/0 64/2048/0 64/16384/0 128/1024/0 128/16384/0 64/1024/1) runs on docs/targets.md's
shapes (16k tokens, model width 2048: batch = 16384 / S, heads = 2048 / D), bf16, q/k/v/dO as contiguous [b, s, h, d]
tensors (PyTorch gets [b, h, s, d] views of the same memory). Each implementation is called 3 times, then 10 times
under the profiler; printed: the mean µs per call of all its kernels and of its largest six. It found
that the backward's row passes, not its main kernel, made cuda-mma lose at seqlen 1k (convert 195 µs vs
FlashAttention-2's 80, plus a 41 µs memset).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashc

CALLS = 10


def kernel_times(fn):
    """{kernel name: [total µs over CALLS calls, launches]} of CALLS calls of fn, after 3 untimed ones."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            rows.setdefault(e.name, [0.0, 0])
            rows[e.name][0] += e.device_time
            rows[e.name][1] += 1
    return rows


def main(argv):
    cases = [(64, 1024, 0), (64, 2048, 0), (64, 16384, 0), (128, 1024, 0), (128, 16384, 0), (64, 1024, 1)]
    if argv:
        cases = [tuple(int(x) for x in a.split("/")) for a in argv]
    for d, s, causal in cases:
        b, h = 16384 // s, 2048 // d
        q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out = {}
        for backend in ("cuda-mma", "cuda-hopper"):
            o, lse = flashc.attention(q, k, v, causal=bool(causal), backend=backend, return_lse=True)
            out[backend] = kernel_times(flashc.prepare_backward(do, q, k, v, o, lse, bool(causal), backend=backend))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        dot = do.transpose(1, 2)
        for name, which in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(which):
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                out[name] = kernel_times(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True))
        print(f"\n== d{d} s{s} causal{causal} bf16 b{b} h{h} (µs per call)")
        for impl, rows in out.items():
            total = sum(t for t, _ in rows.values()) / CALLS
            top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:6]
            print(f"  {impl:12s} total {total:8.1f}  " +
                  "; ".join(f"{name[:50]} {t / CALLS:.1f} x{n // CALLS}" for name, (t, n) in top))


if __name__ == "__main__":
    main(sys.argv[1:])
