#!/usr/bin/env python3
"""tools/profile/kernel_times.py — per-kernel GPU time of one backward call of flashc's tensor-core backends and of
PyTorch SDPA's flash and cudnn backends, side by side, through torch.profiler (CUPTI; no ncu needed):

    PYTHONPATH=python FLASHC_LIBRARY=build-gpu/libflashc.so python3 tools/profile/kernel_times.py [D/S/CAUSAL ...]

A case D/S/CAUSAL (default 64/1024/0 64/2048/0 64/16384/0 128/1024/0 128/16384/0 64/1024/1) runs on docs/targets.md's
shapes (16k tokens, model width 2048: batch = 16384 / S, heads = 2048 / D); a case MODEL/S (a name of
flashc.testing.configs.MODELS, causal) on that model's heads with batch = max(1, 16384 / S), PyTorch given
enable_gqa=True, or K/V expanded to the query heads where its backend refuses that (its time then includes the sum of
the expanded dK/dV), as in the models grid. bf16, q/k/v/dO as contiguous [b, s, h, d] tensors (PyTorch gets
[b, h, s, d] views of the same memory). Each implementation is called 3 times, then 10 times under the profiler;
printed: the mean µs per call of all its kernels and of its largest six. It found that the backward's row passes,
not its main kernel, made cuda-mma lose at seqlen 1k (convert 195 µs vs FlashAttention-2's 80, plus a 41 µs memset),
and that the GQA parts' sum (common/gqa.cu) took 151 µs of cuda-hopper's 1002 at Qwen2.5-7B's heads, seqlen 1k.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashc
from flashc.testing.configs import MODELS

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
        cases = [tuple(x if i == 0 and not x.isdigit() else int(x) for i, x in enumerate(a.split("/"))) for a in argv]
    models = {name: (hq, hkv, d) for name, hq, hkv, d in MODELS}
    for case in cases:
        if isinstance(case[0], str):
            (h, hkv, d), s, causal = models[case[0]], case[1], 1
            b = max(1, 16384 // s)
        else:
            d, s, causal = case
            b, h, hkv = 16384 // s, 2048 // d, 2048 // d
        q, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        out = {}
        for backend in ("cuda-mma", "cuda-hopper"):
            o, lse = flashc.attention(q, k, v, causal=bool(causal), backend=backend, return_lse=True)
            out[backend] = kernel_times(flashc.prepare_backward(do, q, k, v, o, lse, bool(causal), backend=backend))
        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        dot = do.transpose(1, 2)
        for name, which in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(which):
                try:
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=h != hkv)
                except RuntimeError:  # no GQA in this backend: K/V expanded, autograd sums the groups
                    kx, vx = (x.repeat_interleave(h // hkv, dim=1) for x in (kt, vt))
                    o = F.scaled_dot_product_attention(qt, kx, vx, is_causal=bool(causal))
                out[name] = kernel_times(lambda: torch.autograd.grad(o, (qt, kt, vt), dot, retain_graph=True))
        print(f"\n== d{d} s{s} causal{causal} bf16 b{b} h{h}/{hkv} (µs per call)")
        for impl, rows in out.items():
            total = sum(t for t, _ in rows.values()) / CALLS
            top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:6]
            print(f"  {impl:12s} total {total:8.1f}  " +
                  "; ".join(f"{name[:50]} {t / CALLS:.1f} x{n // CALLS}" for name, (t, n) in top))


if __name__ == "__main__":
    main(sys.argv[1:])
