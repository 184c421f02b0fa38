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
is the same. Older torch has only that eager path. The kernels are those of the C++ extension libflashc_torch.so
where it is built (flashc/_torch_fast.py; it also becomes the operators' CPU and CUDA kernels), else ctypes calls
(flashc/_ops.py): the same results and errors either way.

Behaviour as torch.nn.functional.scaled_dot_product_attention where the two meet:
- autocast: under torch.autocast, float32/float16/bfloat16 q, k, v are cast to the autocast dtype (SDPA is
  on autocast's lower-precision list); outside it, q, k and v must share one dtype (TypeError otherwise).
- return_lse=True returns (out, lse): lse is float32 [batch, heads_q, seqlen_q] ([heads_q, total_q] packed)
  and not differentiable (as FlashAttention's); out is.
- A second derivative (backward with create_graph=True, e.g. a gradient penalty) raises RuntimeError: the
  backward is a kernel with no derivative of its own.
- CPU threads: torch.get_num_threads() at the time of each call, unless threads= is given (0: every processor).
- cu_seqlens: int32 offsets. CPU tensors (or lists) are read on the host; CUDA ones beside CUDA tensors go to the
  kernels as they are, as flash_attn_varlen_func takes them: no copy and no synchronisation, so a CUDA graph can
  capture the call. Give max_seqlen_q/max_seqlen_k (the longest sequences, as flash_attn_varlen_func's) with them:
  without, flashc cannot know them without reading the offsets, and sizes its grids for the packed rows (right,
  but slower with many sequences). A sequence longer than the max_seqlen given is cut to its first max_seqlen rows
  (flashc.h, cu_seqlens_device).
- CUDA graphs (torch.cuda.graph, torch.compile(mode="reduce-overhead")): flashc keeps one handle, with its
  device workspace, per thread, device and stream, allocated by its first call. So run the function once
  on the capture stream before capturing (a first call inside a capture raises RuntimeError); a larger
  problem later on that stream grows the workspace, while the graphs captured before keep the old one
  (flashc.h, the handle).
- softcap= and alibi_slopes= (float32 [heads_q] or [batch, heads_q], moved to q's device) as flash_attn's; a v
  with its own head dim needs nothing (out takes it); attention_varlen takes seqused_q=/seqused_k= (int32
  [num_seqs], read on the host like cu_seqlens). attention takes attn_mask= as scaled_dot_product_attention does
  (bool, True = attend, or float, added to the scores; broadcastable to [batch, heads_q, seqlen_q, seqlen_k]; a
  float mask that requires grad gets its gradient). dropout_p= as flash_attn's and SDPA's: the mask's seed and
  offset are drawn from torch's default generator of q's device, as SDPA does (so torch.manual_seed makes runs
  repeat; seed=/offset= pin them), and the backward regenerates the same mask. Only the CPU backends implement
  these so far.
- torch.vmap works (the operators have no batching rule: torch runs them once per batch entry and warns);
  torch.func.grad, jvp and jacrev raise NotImplementedError (use torch.autograd).
"""

from __future__ import annotations


import torch

from . import _api, _ops
from . import _torch_fast as _kernels  # the eager kernels: the C++ extension where built, else _ops

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


def _cacheable(window) -> bool:
    """Whether a cache may hold these arguments: True == 1 and 1 == 1.0 as dict keys, so a key of valid values
    would also answer for invalid ones that compare equal (threads=True, scale=True, softcap=False, a window
    side True). The caches' keys carry the types of scale, threads and softcap; a window is cached only as a
    tuple of two ints or Nones, and looked up only when it holds no bool (_no_bools)."""
    return window is None or (
        type(window) is tuple and len(window) == 2 and all(type(w) is int or w is None for w in window)
    )


def _no_bools(window) -> bool:
    """False for a (left, right) window with a bool side, which a cache lookup would take for 1 or 0."""
    return not (type(window) is tuple and len(window) == 2) or (
        type(window[0]) is not bool and type(window[1]) is not bool
    )


def _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap) -> tuple:
    if _is_compiling():  # traced once: no cache for dynamo to guard on
        return _check_options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    key = (causal, window, scale, backend, causal_align, threads, deterministic, softcap,
           type(scale), type(threads), type(softcap))  # fmt: skip
    try:
        if window is None or _no_bools(window):
            return _options_cache[key]
    except (KeyError, TypeError):  # TypeError: a list window is not hashable
        pass
    opts = _check_options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    if _cacheable(window) and len(_options_cache) < 1024:
        _options_cache[key] = opts
    return opts


# flashc.torch.attention's common call: its options arguments (with the types of scale, threads and softcap) ->
# (the checked tuple, the extension's number for it); filled by _fast_options.
_fast_cache: dict = {}


def _fast_options(key: tuple) -> tuple:
    """(opts, options_id) for attention's fast path, from its arguments' key as attention builds it (raises as
    _options does for invalid ones)."""
    causal, window, scale, backend, causal_align, threads, deterministic, softcap = key[:8]
    opts = _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    entry = (opts, _kernels.options_id(opts))
    if _cacheable(window) and len(_fast_cache) < 1024:
        _fast_cache[key] = entry
    return entry


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
    a numpy array, another integer dtype) checked and converted on the host, through numpy."""
    if isinstance(cu, torch.Tensor) and cu.dtype == torch.int32:
        return cu
    from . import _arrays

    return torch.from_numpy(_arrays.as_cu_seqlens(name, cu))


def _max_seqlen(name: str, m) -> int:
    """max_seqlen_q/k as the operators take them: a non-negative int, 0 (None) when not given."""
    if m is None:
        return 0
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise ValueError(f"flashc: {name} is {m!r}; it must be an int >= 0, the longest sequence (None: not known)")
    return m


def _slopes(alibi_slopes):
    """ALiBi slopes as a tensor (a list or numpy array converted); the operators move it to q's device."""
    if alibi_slopes is None or isinstance(alibi_slopes, torch.Tensor):
        return alibi_slopes
    return torch.as_tensor(alibi_slopes, dtype=torch.float32)


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
# What attention's fast path asks, bound once (each a C call).
_Tensor = torch.Tensor
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_tracing_state = torch._C._get_tracing_state
_grad_enabled = torch.is_grad_enabled
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: _autocast_enabled("cpu") or _autocast_enabled("cuda")
)


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


def _forward(q, k, v, cu_q, cu_k, opts, su_q=None, su_k=None, alibi=None, mask=None, drop=(0.0, 0, 0), splits=0,
             max_seqlen=(0, 0)):  # fmt: skip
    if not _ops.HAVE_OPS or _plain_eager(q, k, v):
        if torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad or (mask is not None and mask.requires_grad)
        ):
            if (
                _kernels.AVAILABLE
                and (mask is None or not mask.requires_grad)  # a mask's gradient (dbias) is _Function's
                and su_q is None
                and su_k is None
                and not (drop[0] or splits)
            ):  # the leaner autograd.Function of the extension's path
                oid = _kernels.options_id(opts)
                return _kernels.Attention.apply(q, k, v, cu_q, cu_k, opts, oid, True, *max_seqlen, alibi, mask)
            return _Function.apply(q, k, v, cu_q, cu_k, su_q, su_k, alibi, mask, *drop, splits, *max_seqlen, *opts)
        return _kernels.fwd_impl(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask, *drop, splits, *max_seqlen)
    if not torch.compiler.is_compiling() and _peek_functorch() is not None:  # dynamo cannot trace the peek
        _refuse_func_transforms()
    if max_seqlen[0] or max_seqlen[1]:
        return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask, *drop, splits, *max_seqlen)
    if splits:
        return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask, *drop, splits)
    if drop[0]:
        return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask, *drop)
    if mask is None:  # the schema without attn_mask, as before it existed
        return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi)
    return _ops.fwd(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask)


def _dropout(dropout_p, seed, offset, q, seqlen_q: int, seqlen_k: int) -> tuple:
    """(p, seed, offset) for the operators, as signed int64s (their schema's int). Unless the caller pins them, seed
    and offset come from torch's default generator of q's device, as SDPA's do: a CUDA generator gives its seed and
    Philox offset and moves the offset past the counters this call uses (flashc.h: seqlen_q·ceil(seqlen_k / 8) per
    sequence and head; varlen passes the packed totals, a bound on every sequence's), rounded up to 4 as PyTorch's
    Philox users do; the CPU generator draws a fresh 64-bit seed (offset 0). Either way torch.manual_seed makes the
    masks repeat, and each call gets a mask of its own."""
    p, seed_u, offset_u = _api.check_dropout(dropout_p, 0 if seed is None else seed, offset)
    if p == 0.0:
        return (0.0, 0, 0)
    if seed is None:
        if q.is_cuda:
            gen = torch.cuda.default_generators[q.device.index if q.device.index is not None else 0]
            seed_u = gen.initial_seed() % 2**64
            base = gen.get_offset()
            gen.set_offset(base + (seqlen_q * ((seqlen_k + 7) // 8) + 3) // 4 * 4)
            offset_u = (base + offset_u) % 2**64
        else:
            seed_u = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64)) % 2**64
    return (p, seed_u - 2**64 if seed_u >= 2**63 else seed_u, offset_u - 2**64 if offset_u >= 2**63 else offset_u)


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
    def forward(ctx, q, k, v, cu_q, cu_k, su_q, su_k, alibi, mask, drop_p, drop_seed, drop_offset, splits, max_q, max_k,
                *opts):  # fmt: skip
        drop = (drop_p, drop_seed, drop_offset)
        out, lse = _kernels.fwd_impl(q, k, v, cu_q, cu_k, *opts, su_q, su_k, alibi, mask, *drop, splits, max_q, max_k)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask)
        ctx.opts = opts
        ctx.drop = drop  # the backward regenerates the same dropout mask
        ctx.max_seqlen = (max_q, max_k)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        _ops.check_double_backward()
        q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask = ctx.saved_tensors
        want_dbias = mask is not None and ctx.needs_input_grad[8]
        more = (*ctx.drop, *ctx.max_seqlen)  # dropout_p, seed and offset, then max_seqlen_q/k
        grads = _kernels.bwd_impl(
            dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts, su_q, su_k, alibi, mask, want_dbias, *more
        )
        dbias = grads[3] if want_dbias else None
        return grads[:3] + (None,) * 5 + (dbias,) + (None,) * (6 + len(ctx.opts))


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
    dropout_p=0.0,
    seed=None,
    offset=0,
    num_splits=0,
):
    """flashc.attention with autograd: gradients flow to q, k and v (and to a float attn_mask that requires grad).
    return_lse=True: (out, lse). attn_mask: as scaled_dot_product_attention's (bool: True = attend; float: added
    to the scores), broadcastable to [batch, heads_q, seqlen_q, seqlen_k]. dropout_p: as flash_attn_func's (applied
    whenever it is > 0, as there: pass 0.0 in evaluation). seed None: seed and offset drawn from torch's generator
    (see the module's docstring); given: the mask of flashc.attention(..., seed=seed, offset=offset). num_splits:
    as flashc.attention's (the forward's key splits on cuda-mma)."""
    # The common call, in as few Python steps as it takes (bench/torch_call_cost.py): plain CPU/CUDA tensors of one
    # dtype, nothing but the options, ALiBi slopes and an attn_mask that needs no gradient (as tensors, which the
    # general path would take as they are), the extension loaded, plain eager mode (_plain_eager's conditions), no
    # autocast. The options are checked once per set of arguments (_fast_options); anything else, and any call
    # the extension refuses (which then runs through the Python path and raises its error), takes the general
    # path below, which does the same.
    kernels = _kernels
    if (
        kernels.AVAILABLE
        and not _is_compiling()
        and (attn_mask is None or (type(attn_mask) is _Tensor and not attn_mask.requires_grad))
        and (alibi_slopes is None or type(alibi_slopes) is _Tensor)
        and not dropout_p
        and not num_splits
        and type(q) is _Tensor
        and type(k) is _Tensor
        and type(v) is _Tensor
        and (q.is_cpu or q.is_cuda)
        and q.dtype == k.dtype == v.dtype
        and not _dispatch_modes()
        and not _function_modes()
        and _tracing_state() is None
        and _peek_functorch() is None
        and not _any_autocast()
    ):
        key = (causal, window, scale, backend, causal_align, threads, deterministic, softcap,
               type(scale), type(threads), type(softcap))  # fmt: skip
        try:
            if window is None or _no_bools(window):  # see _cacheable
                opts, oid = _fast_cache[key]
            else:
                opts, oid = _fast_options(key)
        except (KeyError, TypeError):  # TypeError: a window that is not hashable
            opts, oid = _fast_options(key)
        if (q.requires_grad or k.requires_grad or v.requires_grad) and _grad_enabled():
            return kernels.Attention.apply(q, k, v, None, None, opts, oid, return_lse, 0, 0, alibi_slopes, attn_mask)
        out, lse = kernels.forward(q, k, v, None, None, opts, oid, 0, 0, alibi_slopes, attn_mask)
        return (out, lse) if return_lse else out
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        _not_tensor(q, k, v)
    opts = _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    q, k, v = _cast(q, k, v)
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        attn_mask = torch.as_tensor(attn_mask)
    drop = _dropout(dropout_p, seed, offset, q, q.shape[1], k.shape[1]) if dropout_p else (0.0, 0, 0)
    splits = _api.check_num_splits(num_splits) if num_splits else 0
    out, lse = _forward(
        q, k, v, None, None, opts, alibi=_slopes(alibi_slopes), mask=attn_mask, drop=drop, splits=splits
    )
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
    dropout_p=0.0,
    seed=None,
    offset=0,
    num_splits=0,
    max_seqlen_q=None,
    max_seqlen_k=None,
):
    """flashc.attention_varlen with autograd: packed [total, heads, head_dim] tensors, int32 cu_seqlens on
    the host or, beside CUDA tensors, on the device, with max_seqlen_q/k the longest sequences (as
    flash_attn_varlen_func; see the module's docstring: no host synchronisation, CUDA graphs). seqused_q/k: None,
    or one used length per sequence (flashc.attention_varlen; host offsets only). dropout_p, seed, offset,
    num_splits: as attention()."""
    _api.require_cu_seqlens("flashc.torch.attention_varlen", cu_seqlens_q, cu_seqlens_k)
    _not_tensor(q, k, v)
    opts = _options(causal, window, scale, backend, causal_align, threads, deterministic, softcap)
    cu_q, cu_k = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    su_q, su_k = _lengths("seqused_q", seqused_q), _lengths("seqused_k", seqused_k)
    q, k, v = _cast(q, k, v)
    # a sequence's counters are bounded by the packed totals' product
    drop = _dropout(dropout_p, seed, offset, q, q.shape[0], k.shape[0]) if dropout_p else (0.0, 0, 0)
    splits = _api.check_num_splits(num_splits) if num_splits else 0
    longest = (_max_seqlen("max_seqlen_q", max_seqlen_q), _max_seqlen("max_seqlen_k", max_seqlen_k))
    out, lse = _forward(
        q, k, v, cu_q, cu_k, opts, su_q, su_k, _slopes(alibi_slopes), drop=drop, splits=splits, max_seqlen=longest
    )
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
        out, lse = _kernels.fwd_impl(q, k, v, cu_q, cu_k, *opts)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.opts = opts
        return out

    @staticmethod
    def backward(ctx, dout):
        _ops.check_double_backward()
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _kernels.bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts)
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
