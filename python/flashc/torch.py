"""PyTorch: flashc attention as a native operator, with autograd.

    import torch, flashc.torch
    q, k, v = (torch.randn(2, 128, 8, 64, requires_grad=True) for _ in range(3))
    o = flashc.torch.attention(q, k, v, causal=True)       # the operator flashc::fwd when compiled
    o.square().sum().backward()                           # q.grad, k.grad, v.grad from flashc::bwd

Tensors keep flash_attn's layout [batch, seqlen, heads, head_dim] ([total, heads, head_dim] packed, with
cu_seqlens); CUDA tensors run on the current stream. With torch >= 2.4 the calls go through the operators
flashc::fwd and flashc::bwd (flashc/_ops.py), so torch.compile(fullgraph=True), torch.export and fake/meta
tensors work. In plain eager mode the kernels are called directly (through an autograd.Function when a
gradient is needed): the operator's dispatch costs tens of microseconds of Python per call, and the result
is the same. Older torch has only that eager path.

Behaviour as torch.nn.functional.scaled_dot_product_attention where the two meet:
- autocast: under torch.autocast, float32/float16/bfloat16 q, k, v are cast to the autocast dtype (SDPA is
  on autocast's lower-precision list); outside it, q, k and v must share one dtype (TypeError otherwise).
- return_lse=True returns (out, lse): lse is float32 [batch, heads_q, seqlen_q] ([heads_q, total_q] packed)
  and not differentiable (as FlashAttention's); out is.
- A second derivative (backward with create_graph=True, e.g. a gradient penalty) raises RuntimeError: the
  backward is a kernel with no derivative of its own.
- CPU threads: torch.get_num_threads() at the time of each call, unless threads= is given (0: every processor).
- cu_seqlens: int32 offsets. The C API reads them on the host: CPU tensors (or lists) are used as they are;
  CUDA ones are copied to the host on every call, which synchronises the stream and cannot be captured in a
  CUDA graph. Pass host offsets where that matters.
- CUDA graphs (torch.cuda.graph, torch.compile(mode="reduce-overhead")): flashc keeps one handle, with its
  device workspace, per thread, device and stream, allocated by its first call. So run the function once
  on the capture stream before capturing (a first call inside a capture raises RuntimeError), and capture
  the largest problem first: a larger one later on that stream grows the workspace, and graphs captured
  before would read the freed one.
- softcap= and alibi_slopes= (float32 [heads_q] or [batch, heads_q], moved to q's device) as flash_attn's; a v
  with its own head dim needs nothing (out takes it); attention_varlen takes seqused_q=/seqused_k= (int32
  [num_seqs], read on the host like cu_seqlens). attention takes attn_mask= as scaled_dot_product_attention does
  (bool, True = attend, or float, added to the scores; broadcastable to [batch, heads_q, seqlen_q, seqlen_k]; a
  float mask that requires grad gets its gradient). Only the CPU backends implement these so far.
- torch.vmap works (the operators have no batching rule: torch runs them once per batch entry and warns);
  torch.func.grad, jvp and jacrev raise NotImplementedError (use torch.autograd).
"""

from __future__ import annotations


import torch

from . import _api, _ops

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_ALIGNS = ("bottom-right", "top-left")


def _autocast_fns():
    try:
        torch.is_autocast_enabled("cpu")  # torch >= 2.4 takes a device type
        return torch.is_autocast_enabled, torch.get_autocast_dtype
    except TypeError:
        on = {"cpu": torch.is_autocast_cpu_enabled, "cuda": torch.is_autocast_enabled}
        dt = {"cpu": torch.get_autocast_cpu_dtype, "cuda": torch.get_autocast_gpu_dtype}
        return (lambda d: d in on and on[d]()), (lambda d: dt[d]())


_autocast_enabled, _autocast_dtype = _autocast_fns()
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)  # torch < 2.3


def _check_options(causal, window, scale, backend, causal_align, threads, deterministic, softcap=0.0) -> tuple:
    """The operators' option arguments (scale, causal, window_left, window_right, top_left, backend, threads,
    deterministic, softcap) from the user's, with the same checks and messages as flashc.attention."""
    scale, causal, wl, wr, top_left, deterministic = _api.check_options(
        causal, window, scale, causal_align, deterministic
    )
    softcap = _api.check_softcap(softcap)
    if not isinstance(backend, str):
        raise TypeError(
            f"flashc: backend must be a str ('auto' or a name from flashc.backends()), not {type(backend).__name__}"
        )
    if threads is None:
        threads = -1  # torch.get_num_threads() when the kernel runs
    elif isinstance(threads, bool) or not hasattr(threads, "__index__"):
        raise TypeError(f"flashc: threads must be an int or None, not {threads!r}")
    elif not 0 <= threads.__index__() <= 2**31 - 1:
        raise ValueError(f"flashc: threads is {threads}; use None for torch's count, 0 for every processor")
    else:
        threads = threads.__index__()
    return (scale, causal, wl, wr, top_left, backend, threads, deterministic, softcap)


_options_cache: dict = {}


def _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap) -> tuple:
    if _is_compiling():  # traced once: no cache for dynamo to guard on
        return _check_options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    key = (causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    try:
        return _options_cache[key]
    except (KeyError, TypeError):  # TypeError: a list window is not hashable
        pass
    opts = _check_options(*key)
    if isinstance(window, (tuple, type(None))) and len(_options_cache) < 1024:
        _options_cache[key] = opts
    return opts


def _cast(q, k, v):
    """Autocast as for SDPA; outside it, one dtype (SDPA's rule)."""
    dev = "cuda" if q.is_cuda else "cpu" if q.is_cpu else None  # autocast knows no meta
    if dev is not None and _autocast_enabled(dev):
        dt = _autocast_dtype(dev)
        return tuple(x.to(dt) if x.dtype in _FLOATS and x.dtype != dt else x for x in (q, k, v))
    if q.dtype != k.dtype or q.dtype != v.dtype:
        _ops._same_dtype(("q", q), ("k", k), ("v", v))
    return q, k, v


def _offsets(name: str, cu):
    """cu_seqlens as an int32 tensor: int32 tensors as they are (on their device), anything else (a list,
    a numpy array, another integer dtype) checked and converted on the host."""
    if isinstance(cu, torch.Tensor) and cu.dtype == torch.int32:
        return cu
    from . import _arrays

    return torch.from_numpy(_arrays.as_cu_seqlens(name, cu))


def _slopes(alibi_slopes):
    """ALiBi slopes as a tensor (a list or numpy array converted); the operators move it to q's device."""
    if alibi_slopes is None or isinstance(alibi_slopes, torch.Tensor):
        return alibi_slopes
    import numpy as np

    return torch.from_numpy(np.ascontiguousarray(alibi_slopes, dtype=np.float32))


def _lengths(name: str, x):
    """seqused_q/k as an int32 tensor (None stays None)."""
    if x is None or (isinstance(x, torch.Tensor) and x.dtype == torch.int32):
        return x
    from . import _api

    n = x.numel() if isinstance(x, torch.Tensor) else len(x)
    return torch.from_numpy(_api.host_seqused(name, x, n))


def _not_tensor(q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashc.torch: {name} must be a torch.Tensor, not {type(x).__name__}")


_peek_functorch = getattr(getattr(torch._C, "_functorch", None), "peek_interpreter_stack", lambda: None)


def _plain_eager(q, k, v) -> bool:
    """True when nothing but eager autograd will see this call: plain CPU/CUDA tensors, no compiler,
    tracer, dispatch or function mode, no torch.func transform. Then the kernels run directly (through an
    autograd.Function when a gradient is needed) instead of through the registered operator, whose
    dispatch costs tens of microseconds of Python per call (bench/torch_call_cost.py); both paths run the
    same kernels with the same checks, so results are identical."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and type(v) is torch.Tensor
        and (q.is_cpu or q.is_cuda)
        and not torch.compiler.is_compiling()
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and torch._C._get_tracing_state() is None
        and _peek_functorch() is None
    )


def _forward(q, k, v, cu_q, cu_k, opts, su_q=None, su_k=None, alibi=None, mask=None):
    if not _ops.HAVE_OPS or _plain_eager(q, k, v):
        if torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or (mask is not None and mask.requires_grad)
        ):
            return _Function.apply(q, k, v, cu_q, cu_k, su_q, su_k, alibi, mask, *opts)
        return _ops.fwd_impl(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask)
    if not torch.compiler.is_compiling() and _peek_functorch() is not None:  # dynamo cannot trace the peek
        _refuse_func_transforms()
    if mask is None:  # the schema without attn_mask, as before it existed
        return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi)
    return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask)


def _refuse_func_transforms():
    # torch.func.grad/jvp/jacrev cannot run an operator whose autograd is registered with
    # torch.library.register_autograd (torch's message says only "autograd.Function ... setup_context");
    # vmap alone works (torch runs the operator once per batch entry).
    from torch._C._functorch import TransformType, get_interpreter_stack

    kinds = {i.key() for i in get_interpreter_stack() or ()}
    if kinds - {TransformType.Vmap, TransformType.Functionalize}:
        raise NotImplementedError(
            "flashc: torch.func.grad, jvp, jacrev and other torch.func derivative transforms are not "
            "supported (vmap is); use torch.autograd.grad or .backward() for gradients"
        )


class _Function(torch.autograd.Function):
    """The eager path's autograd: flashc::fwd's formula (lse not differentiable, no double backward)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, su_q, su_k, alibi, mask, *opts):
        out, lse = _ops.fwd_impl(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask)
        ctx.opts = opts
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        _ops.check_double_backward()
        q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask = ctx.saved_tensors
        want_dbias = mask is not None and ctx.needs_input_grad[8]
        grads = _ops.bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts, su_q, su_k, alibi, mask, want_dbias)
        dbias = grads[3] if want_dbias else None
        return grads[:3] + (None,) * 5 + (dbias,) + (None,) * len(ctx.opts)


def attention(
    q,
    k,
    v,
    causal=False,
    window=None,
    scale=None,
    backend="auto",
    return_lse=False,
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
    softcap=0.0,
    alibi_slopes=None,
    attn_mask=None,
):
    """flashc.attention with autograd: gradients flow to q, k and v (and to a float attn_mask that requires grad).
    return_lse=True: (out, lse). attn_mask: as scaled_dot_product_attention's (bool: True = attend; float: added
    to the scores), broadcastable to [batch, heads_q, seqlen_q, seqlen_k]."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        _not_tensor(q, k, v)
    opts = _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    q, k, v = _cast(q, k, v)
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        attn_mask = torch.as_tensor(attn_mask)
    out, lse = _forward(q, k, v, None, None, opts, alibi=_slopes(alibi_slopes), mask=attn_mask)
    return (out, lse) if return_lse else out


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
    return_lse=False,
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
    softcap=0.0,
    alibi_slopes=None,
    seqused_q=None,
    seqused_k=None,
):
    """flashc.attention_varlen with autograd: packed [total, heads, head_dim] tensors, int32 cu_seqlens
    (host tensors avoid a synchronising copy; see the module's docstring). seqused_q/k: None, or one used
    length per sequence (flashc.attention_varlen)."""
    _api.require_cu_seqlens("flashc.torch.attention_varlen", cu_seqlens_q, cu_seqlens_k)
    _not_tensor(q, k, v)
    opts = _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    cu_q, cu_k = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    su_q, su_k = _lengths("seqused_q", seqused_q), _lengths("seqused_k", seqused_k)
    q, k, v = _cast(q, k, v)
    out, lse = _forward(q, k, v, cu_q, cu_k, opts, su_q, su_k, _slopes(alibi_slopes))
    return (out, lse) if return_lse else out


class FlashAttentionFunction(torch.autograd.Function):
    """apply(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, scale, backend, causal_align, threads,
    deterministic) -> out, every argument positional. cu_seqlens_q/k None: dense [batch, seqlen, heads,
    head_dim] tensors; given: packed [total, heads, head_dim] ones (varlen). Kept for code that applies it
    directly; attention() and attention_varlen() do the same and also work under torch.compile."""

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
        opts = _check_options(causal, window, scale, backend, causal_align, threads, deterministic)
        cu_q = None if cu_seqlens_q is None else _offsets("cu_seqlens_q", cu_seqlens_q)
        cu_k = None if cu_seqlens_k is None else _offsets("cu_seqlens_k", cu_seqlens_k)
        out, lse = _ops.fwd_impl(q, k, v, cu_q, cu_k, *opts)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.opts = opts
        return out

    @staticmethod
    def backward(ctx, dout):
        _ops.check_double_backward()
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _ops.bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts)
        return (dq, dk, dv) + (None,) * 9


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
        softcap=0.0,
    ):
        super().__init__()
        self.opts = dict(
            causal=causal,
            window=window,
            scale=scale,
            backend=backend,
            causal_align=causal_align,
            threads=threads,
            deterministic=deterministic,
            softcap=softcap,
        )
        _check_options(**self.opts)

    def forward(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None):
        if cu_seqlens_q is not None or cu_seqlens_k is not None:
            return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, **self.opts)
        return attention(q, k, v, **self.opts)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.opts.items())
