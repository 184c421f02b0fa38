"""PyTorch autograd for flashc: `loss.backward()` through flashc's forward and backward kernels.

    import torch, flashc.torch
    q, k, v = (torch.randn(2, 128, 8, 64, requires_grad=True) for _ in range(3))
    o = flashc.torch.attention(q, k, v, causal=True)       # FlashAttentionFunction.apply underneath
    o.square().sum().backward()                           # q.grad, k.grad, v.grad from flashc_backward

The forward saves q, k, v, out and lse (float32, O(b·h·s)); the backward calls flashc.attention_backward
with the same options. Tensors keep flash_attn's layout [batch, seqlen, heads, head_dim]; CUDA tensors run
on the current stream. Double backward is not supported (the backward is itself a kernel).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _api


def _options(causal, window, scale, backend, causal_align, threads, deterministic) -> dict:
    return dict(
        causal=causal,
        window=window,
        scale=scale,
        backend=backend,
        causal_align=causal_align,
        threads=threads,
        deterministic=deterministic,
    )


class FlashAttentionFunction(torch.autograd.Function):
    """apply(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, backend, causal_align, threads,
    deterministic) -> out. cu_seqlens_q/k None: dense [batch, seqlen, heads, head_dim] tensors; given: packed
    [total, heads, head_dim] ones (varlen). Every argument is positional in apply()."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        causal=False,
        window=None,
        scale=None,
        backend="auto",
        causal_align="bottom-right",
        threads=None,
        deterministic=False,
    ):
        opts = _options(causal, window, scale, backend, causal_align, threads, deterministic)
        cu = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
        out, lse = _api.prepare_forward(q, k, v, **cu, **opts)()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = {**opts, **cu}
        ctx.mark_non_differentiable(lse)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _api.attention_backward(dout, q, k, v, out, lse, **ctx.opts)
        return (dq, dk, dv) + (None,) * 9


def attention(
    q,
    k,
    v,
    causal=False,
    window=None,
    scale=None,
    backend="auto",
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
):
    """flashc.attention with autograd: gradients flow to q, k and v."""
    return FlashAttentionFunction.apply(
        q, k, v, None, None, causal, window, scale, backend, causal_align, threads, deterministic
    )


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    causal=False,
    window=None,
    scale=None,
    backend="auto",
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
):
    """flashc.attention_varlen with autograd."""
    _api.require_cu_seqlens("flashc.torch.attention_varlen", cu_seqlens_q, cu_seqlens_k)
    return FlashAttentionFunction.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, backend, causal_align, threads, deterministic
    )


class FlashAttention(torch.nn.Module):
    """Attention as a module: forward(q, k, v) with [batch, seqlen, heads, head_dim] tensors, or
    forward(q, k, v, cu_seqlens_q, cu_seqlens_k) with packed ones. Holds only options, no weights."""

    def __init__(
        self,
        causal=False,
        window=None,
        scale=None,
        backend="auto",
        causal_align="bottom-right",
        threads=None,
        deterministic=False,
    ):
        super().__init__()
        self.opts = _options(causal, window, scale, backend, causal_align, threads, deterministic)

    def forward(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **self.opts)
        return attention(q, k, v, **self.opts)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.opts.items())
