"""Host time per call of flashc's torch entry points against torch.nn.functional.scaled_dot_product_attention.

    python bench/torch_call_cost.py                       # CPU, fp32, b1 s16 h8 d64, causal
    python bench/torch_call_cost.py --device cuda         # CUDA, bf16 (host time: the GPU work is tiny)

At this shape the attention itself is a few microseconds, so what is measured is the cost of getting a call
from Python into the kernel: argument conversion, dispatch, autograd bookkeeping. Each row times `--calls`
calls in a loop, `--repeats` times after a warm-up (the rows taking turns, so that a change in the machine's
load weighs on all of them alike), and prints the median per call and the ratio to SDPA's of the same
direction. flashc.torch.attention runs its kernels directly in plain eager mode: through the C++ extension
libflashc_torch.so where it is built (torch.ops.flashc_ext.fwd/bwd, python/flashc/_torch_ext.cpp), else through
ctypes; the "(Python path)" rows force the latter in the same run, and FLASHC_TORCH_EXT=0 keeps the extension
out altogether. torch.ops.flashc.fwd is the registered operator that compiled and exported graphs call; its
CPU and CUDA kernels are the extension's where it is loaded. flashc.prepare_forward()() is the C call with
nothing around it: the floor of every flashc row (on the CPU at this shape, the cpu backend's own fixed cost
is most of it). Forward rows run under torch.no_grad() on tensors that do not require grad; forward +
backward rows run o.backward(dout) on leaves that do. On CUDA the loop is synchronised once at its end, so a
row is the host's cost whenever the GPU keeps up (it does at this
shape). flashc runs with torch's thread count, as flashc.torch does.

The ALiBi and mask rows time the same calls with alibi_slopes= (float32 [heads], on the device) or attn_mask= (a bool
padding mask [b, 1, 1, s] that hides the last quarter of the keys of every sequence but the first, on the device,
needing no gradient). SDPA has no ALiBi: its row there takes the slopes' bias as a float attn_mask [1, heads, s, s],
made once, as models that run ALiBi on SDPA do; its mask row takes the same bool mask.

The decode rows time one decoding step as a serving loop makes it, at a fixed shape: flashc.attention_with_kvcache
with batch 1, one new query row of 8 heads, d 64, appending one key/value row of 2 heads into a dense cache of 256
rows at cache_seqlens 255 (an int32 tensor where the cache is: the same row each call), causal, out= given;
SDPA (enable_gqa) attends the same 256 cached keys through [b, h, s, d] views and appends nothing, so its row is
the cheaper of the two by the append. attention_with_kvcache runs through the extension's flashc_ext::kvcache
where it is built; "(Python path)" forces the ctypes path through the operator torch.ops.flashc.fwd_kvcache_out.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import flashc
import flashc.torch as ft
from flashc import _torch_fast
from flashc import kvcache as _kvcache


def time_rows(rows, calls: int, repeats: int, sync, clock) -> list:
    """Median microseconds per call of each row. The rows take turns within each repeat, so that a change
    in the machine's load during the run weighs on all of them alike."""
    for _, _, fn in rows:  # warm-up: handles, workspaces, caches
        for _ in range(max(3, calls // 10)):
            fn()
    sync()
    times = [[] for _ in rows]
    for _ in range(repeats):
        for i, (_, _, fn) in enumerate(rows):
            t0 = clock()
            for _ in range(calls):
                fn()
            sync()
            times[i].append((clock() - t0) / calls * 1e6)
    return [statistics.median(t) for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    ap.add_argument("--shape", default="1,16,8,64", help="batch,seqlen,heads,head_dim")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="wall: time.perf_counter; cpu: this process's CPU time (steadier on a shared machine; CPU only)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
    b, s, h, d = (int(x) for x in args.shape.split(","))
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=g).to(dev, dtype) for _ in range(3))
    dout = torch.randn(b, s, h, d, generator=g).to(dev, dtype)
    # SDPA takes [b, h, s, d]: pass transposed views, as a model that keeps [b, s, h, d] activations would.
    qt, kt, vt, dt = (x.transpose(1, 2) for x in (q, k, v, dout))
    lq, lk, lv = (x.clone().requires_grad_(True) for x in (q, k, v))
    lqt, lkt, lvt = (x.clone().transpose(1, 2).requires_grad_(True) for x in (q, k, v))

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    def sdpa_fwd_bwd():
        F.scaled_dot_product_attention(lqt, lkt, lvt, is_causal=True).backward(dt)

    def flashc_torch_fwd():
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    def flashc_torch_fwd_bwd():
        ft.attention(lq, lk, lv, causal=True).backward(dout)

    # ALiBi and a padding mask (see the docstring), and SDPA's forms of them.
    slopes = (2.0 ** -torch.arange(1.0, h + 1)).to(dev)
    pos = torch.arange(s, device=dev)
    alibi_bias = (-slopes[:, None, None] * (pos[:, None] - pos[None, :]).abs()).to(dtype)[None]  # [1, h, s, s]
    alibi_bias = alibi_bias.masked_fill(pos[None, :] > pos[:, None], float("-inf"))  # causal, in the bias
    pad = (pos < torch.tensor([s] + [s - s // 4] * (b - 1), device=dev)[:, None])[:, None, None, :]  # [b, 1, 1, s]
    pad_causal = pad & (pos[None, :] <= pos[:, None])  # SDPA takes a mask or is_causal, not both

    def forward(fn, *xs, **kw):
        """A forward row: fn(*xs, **kw) under torch.no_grad()."""

        def run():
            with torch.no_grad():
                fn(*xs, **kw)

        return run

    def forward_backward(fn, grad, *xs, **kw):
        """A forward + backward row: fn(*xs, **kw).backward(grad)."""
        return lambda: fn(*xs, **kw).backward(grad)

    sdpa = F.scaled_dot_product_attention
    alibi_fwd = forward(ft.attention, q, k, v, causal=True, alibi_slopes=slopes)
    alibi_fwd_bwd = forward_backward(ft.attention, dout, lq, lk, lv, causal=True, alibi_slopes=slopes)
    mask_fwd = forward(ft.attention, q, k, v, causal=True, attn_mask=pad)
    mask_fwd_bwd = forward_backward(ft.attention, dout, lq, lk, lv, causal=True, attn_mask=pad)

    def flashc_api_fwd():
        flashc.attention(q, k, v, causal=True)

    def python_path(fn):
        """fn with flashc.torch's kernels taken from the ctypes path instead of the extension."""

        def run():
            ft._kernels = _torch_fast.PYTHON_PATH
            try:
                fn()
            finally:
                ft._kernels = _torch_fast

        return run

    if _torch_fast.AVAILABLE:  # the options as flashc.torch packs them: (scale ... softcap) -> one int
        oid = _torch_fast.options_id((None, True, -1, -1, False, "auto", -1, False, 0.0))

    def extension_fwd():  # the extension's operator alone, as flashc.torch calls it
        with torch.no_grad():
            torch.ops.flashc_ext.fwd(q, k, v, None, None, oid)

    prepared = flashc.prepare_forward(q, k, v, causal=True, threads=torch.get_num_threads())

    def operator_fwd():  # the registered operator, as torch.compile and torch.export see it
        with torch.no_grad():
            torch.ops.flashc.fwd(q, k, v, None, None, None, True, -1, -1, False, "auto", -1, False)

    # One decoding step (see the docstring): q [1, 1, 8, 64] over a [1, 256, 2, 64] cache, appending row 255.
    kv_q = torch.randn(1, 1, 8, 64, generator=g).to(dev, dtype)
    k_cache, v_cache = (torch.randn(1, 256, 2, 64, generator=g).to(dev, dtype) for _ in range(2))
    k_new, v_new = (torch.randn(1, 1, 2, 64, generator=g).to(dev, dtype) for _ in range(2))
    kv_lens = torch.full((1,), 255, dtype=torch.int32, device=dev)
    kv_out = torch.empty_like(kv_q)
    kv_qt, kv_kt, kv_vt = (x.transpose(1, 2) for x in (kv_q, k_cache, v_cache))

    def sdpa_decode():
        with torch.no_grad():
            F.scaled_dot_product_attention(kv_qt, kv_kt, kv_vt, enable_gqa=True)

    def flashc_decode():
        with torch.no_grad():
            flashc.attention_with_kvcache(kv_q, k_cache, v_cache, k_new, v_new, cache_seqlens=kv_lens, causal=True,
                                          out=kv_out)  # fmt: skip

    def python_path_decode():
        """flashc_decode with attention_with_kvcache's Python path instead of the extension."""
        fast = _kvcache._fast
        _kvcache._fast = False
        try:
            flashc_decode()
        finally:
            _kvcache._fast = fast

    if _torch_fast.kvcache is not None:  # attention_with_kvcache's options as one int, as its short path packs them
        kv_oid = _torch_fast._kv_options((True, None, None, "auto", None, type(None), type(None), dev.type == "cuda"))

    def extension_decode():  # the extension's operator alone, as attention_with_kvcache calls it
        with torch.no_grad():
            torch.ops.flashc_ext.kvcache(kv_q, k_cache, v_cache, k_new, v_new, kv_lens, None, kv_out, kv_oid, 0, False)

    ext = _torch_fast.AVAILABLE
    kv_ext = _torch_fast.kvcache is not None
    rows = [
        ("forward", "sdpa", sdpa_fwd),
        ("forward", "flashc.torch.attention", flashc_torch_fwd),
        *([("forward", "  (Python path)", python_path(flashc_torch_fwd))] if ext else []),
        *([("forward", "torch.ops.flashc_ext.fwd", extension_fwd)] if ext else []),
        ("forward", "flashc.attention", flashc_api_fwd),
        ("forward", "flashc.prepare_forward()()", prepared),
        *([("forward", "torch.ops.flashc.fwd", operator_fwd)] if hasattr(torch.ops.flashc, "fwd") else []),
        ("forward+backward", "sdpa", sdpa_fwd_bwd),
        ("forward+backward", "flashc.torch.attention", flashc_torch_fwd_bwd),
        *([("forward+backward", "  (Python path)", python_path(flashc_torch_fwd_bwd))] if ext else []),
        ("forward ALiBi", "sdpa", forward(sdpa, qt, kt, vt, attn_mask=alibi_bias)),
        ("forward ALiBi", "flashc.torch.attention", alibi_fwd),
        *([("forward ALiBi", "  (Python path)", python_path(alibi_fwd))] if ext else []),
        ("fwd+bwd ALiBi", "sdpa", forward_backward(sdpa, dt, lqt, lkt, lvt, attn_mask=alibi_bias)),
        ("fwd+bwd ALiBi", "flashc.torch.attention", alibi_fwd_bwd),
        *([("fwd+bwd ALiBi", "  (Python path)", python_path(alibi_fwd_bwd))] if ext else []),
        ("forward mask", "sdpa", forward(sdpa, qt, kt, vt, attn_mask=pad_causal)),
        ("forward mask", "flashc.torch.attention", mask_fwd),
        *([("forward mask", "  (Python path)", python_path(mask_fwd))] if ext else []),
        ("fwd+bwd mask", "sdpa", forward_backward(sdpa, dt, lqt, lkt, lvt, attn_mask=pad_causal)),
        ("fwd+bwd mask", "flashc.torch.attention", mask_fwd_bwd),
        *([("fwd+bwd mask", "  (Python path)", python_path(mask_fwd_bwd))] if ext else []),
        ("decode", "sdpa", sdpa_decode),
        ("decode", "attention_with_kvcache", flashc_decode),
        *([("decode", "  (Python path)", python_path_decode)] if kv_ext else []),
        *([("decode", "torch.ops.flashc_ext.kvcache", extension_decode)] if kv_ext else []),
    ]
    print(
        f"# torch {torch.__version__}, flashc {flashc.__version__}, {dev.type} {str(dtype).replace('torch.', '')}, "
        f"b{b} s{s} h{h} d{d} causal, torch threads {torch.get_num_threads()}, "
        f"{args.clock} clock, median of {args.repeats} x {args.calls} calls; decode: b1, 1 new row, cache 256, "
        "8/2 heads, d64"
    )
    print("# extension: " + ("libflashc_torch.so" if ext else f"none ({_torch_fast.WHY})"))
    print(f"{'direction':<17} {'entry point':<28} {'us/call':>8} {'x sdpa':>7}")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    base = {}
    for (direction, name, _), us in zip(rows, time_rows(rows, args.calls, args.repeats, sync, clock)):
        if name == "sdpa":
            base[direction] = us
        print(f"{direction:<17} {name:<28} {us:8.1f} {us / base[direction]:7.2f}")


if __name__ == "__main__":
    main()
