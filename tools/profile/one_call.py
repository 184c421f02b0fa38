"""One flashc call, repeated, for a profiler to look at (tools/profile/ncu.sh runs it under Nsight Compute):

    python3 tools/profile/one_call.py --backend cuda-hopper --pass fwd --seqlen 8192 --head-dim 128 [--causal]

The shape is docs/targets.md's: 16k tokens (batch = 16384 / seqlen), model width 2048 (heads = 2048 / head_dim),
bf16 unless --dtype says otherwise, layout [b, s, h, d]. The forward (and for --pass bwd the backward) is
prepared once, run --warmup times, then --calls times between cudaProfilerStart/Stop, so that `ncu
--profile-from-start off` sees only the timed calls and no allocation or warm-up. It also prints the median
time and TFLOP/s of those calls (CUDA events), so a profile is never read without the speed it explains.
With --device cpu it runs on CPU tensors (a smoke test where there is no GPU). --backend sdpa-flash,
sdpa-cudnn or sdpa-efficient runs PyTorch's SDPA pinned to that backend instead (the same tensors seen as
[b, h, s, d]; backward through autograd.grad), so that a profile of a peer's kernels sits beside flashc's.
"""
import argparse
import statistics
import time

import torch

import flashc

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def parse():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen")
    ap.add_argument("--width", type=int, default=2048, help="heads x head_dim")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    return ap.parse_args()


def timed(fn, calls, cuda):
    """Median ms of `calls` runs of fn (CUDA events on the GPU, perf_counter on the CPU)."""
    times = []
    for _ in range(calls):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def sdpa_call(backend, which, q, k, v, dout, causal):
    """A call of torch SDPA pinned to one backend (sdpa-flash, sdpa-cudnn, sdpa-efficient): the forward, or the
    backward alone through autograd.grad. q, k, v, dout are [b, s, h, d]; SDPA sees them as [b, h, s, d].
    tools/profile/power.py runs the peers through it too."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pinned = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
              "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
    if which == "fwd":
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def fwd():
            with sdpa_kernel(pinned):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        return fwd
    leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    with sdpa_kernel(pinned):
        o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves), is_causal=causal)
    g = dout.transpose(1, 2)

    def bwd():
        with sdpa_kernel(pinned):
            return torch.autograd.grad(o, leaves, g, retain_graph=True)

    return bwd


def main():
    a = parse()
    cuda = a.device == "cuda"
    b, h = max(1, a.tokens // a.seqlen), max(1, a.width // a.head_dim)
    shape = (b, a.seqlen, h, a.head_dim)
    q, k, v, dout = (torch.randn(shape, device=a.device, dtype=DTYPES[a.dtype]) for _ in range(4))
    if a.backend.startswith("sdpa-"):
        call, name = sdpa_call(a.backend, a.which, q, k, v, dout, a.causal), a.backend
    else:
        fwd = flashc.prepare_forward(q, k, v, causal=a.causal, backend=a.backend)
        o, lse = fwd()
        call = fwd
        if a.which == "bwd":
            call = flashc.prepare_backward(dout, q, k, v, o, lse, causal=a.causal, backend=a.backend)
        name = flashc.last_backend()
    for _ in range(a.warmup):
        call()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
    ms = timed(call, a.calls, cuda)
    if cuda:
        torch.cuda.cudart().cudaProfilerStop()
    flops = 4.0 * b * h * a.seqlen * a.seqlen * a.head_dim * (2.5 if a.which == "bwd" else 1.0)
    flops /= 2 if a.causal else 1
    print(f"one_call: {name} {a.which} b{b} h{h} s{a.seqlen} d{a.head_dim} {a.dtype} "
          f"{'causal' if a.causal else 'full'}: {ms:.3f} ms, {flops / ms / 1e9:.2f} TFLOP/s (median of {a.calls})")


if __name__ == "__main__":
    main()
