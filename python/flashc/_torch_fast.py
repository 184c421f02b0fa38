"""flashc.torch's eager kernels through the C++ extension libflashc_torch.so, where it is built.

fwd_impl and bwd_impl take the arguments of flashc._ops.fwd_impl / bwd_impl and return what they return. A call
that needs nothing but q, k, v (and cu_seqlens: on the host, or beside CUDA tensors on the device with
max_seqlen_q/k), the options and softcap, ALiBi slopes and an attn_mask (not its gradient) runs the operators
flashc_ext::fwd / flashc_ext::bwd of the extension (python/flashc/_torch_ext.cpp): at::Tensor to flashc_tensor
in C++, one cached flashc handle per thread, backend, device and stream, the current CUDA stream. The options
(flashc.torch's checked tuple, scale ... softcap) reach the operators as one int, options_id(opts), made once
per distinct tuple. Any other call (seqused, dbias, dropout, num_splits, later features), and any call the
extension refuses (among them slopes or a mask that the Python path would first convert), runs through
flashc._ops: so the results, and the exceptions with their types and messages, are those of the Python path
whether the extension is there or not. The extension is an accelerator, never a second implementation of the
checks.

flashc.torch.attention's common call (plain tensors, nothing but the options, ALiBi slopes and an attn_mask that
requires no grad, as tensors) calls forward() or Attention.apply() directly, with the options' tuple and id that
it caches per set of user arguments.

flashc.attention_with_kvcache on torch tensors calls kvcache() first: a plain eager call (no autograd to record,
no compile, mode or transform) runs flashc_ext::kvcache, with its options' id cached per set of option
arguments; kvcache() returns None for any other call, or one the extension refuses, and attention_with_kvcache
then runs its Python path (the operators torch.ops.flashc.fwd_kvcache / fwd_kvcache_out), as above.

The extension is looked for next to the libflashc that flashc._lib loaded (FLASHC_LIBRARY, or the package's
own), because it calls that very library: it is bound to it by path at load time. FLASHC_TORCH_EXT=0 (or OFF)
skips it (to compare, or to test the Python path). `AVAILABLE` says whether it loaded, `WHY` why not.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading
import types

import torch

from . import _api, _lib, _ops

EXTENSION = "libflashc_torch.so"


def _load():
    """(extension CDLL, None) or (None, why not)."""
    if os.environ.get("FLASHC_TORCH_EXT", "").upper() in ("0", "OFF"):
        return None, f"FLASHC_TORCH_EXT={os.environ['FLASHC_TORCH_EXT']}"
    path = pathlib.Path(_lib.path).resolve().parent / EXTENSION
    if not path.is_file():
        return None, f"{path} is not built (the library's CMake build makes it where torch >= 2.10 is importable)"
    try:
        torch.ops.load_library(str(path))  # registers flashc_ext::fwd / bwd
        ext = ctypes.CDLL(str(path))
    except (OSError, RuntimeError) as e:  # e.g. a torch older than the stable ABI the extension targets
        return None, f"{path} cannot be loaded: {e}"
    why = ctypes.c_char_p()
    try:
        bind, set_slot = ext.flashc_torch_bind, ext.flashc_torch_set_slot
        ext.flashc_torch_options  # noqa: B018 (present in this version's extension)
    except AttributeError as e:  # an extension of another flashc version
        return None, f"{path} is not this package's: {e}"
    bind.argtypes, bind.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)], ctypes.c_int
    set_slot.argtypes, set_slot.restype = [ctypes.c_void_p], None
    if bind(str(pathlib.Path(_lib.path).resolve()).encode(), ctypes.byref(why)) != 0:
        return None, f"{path} cannot bind to {_lib.path}: {(why.value or b'').decode()}"
    return ext, None


_ext, WHY = _load()
AVAILABLE = _ext is not None

if AVAILABLE:
    # The overloads' C++ callables (OpOverload._op): the same dispatch without OpOverload.__call__'s Python frame.
    _fwd = getattr(torch.ops.flashc_ext.fwd.default, "_op", torch.ops.flashc_ext.fwd.default)
    _bwd = getattr(torch.ops.flashc_ext.bwd.default, "_op", torch.ops.flashc_ext.bwd.default)
    _set_slot = _ext.flashc_torch_set_slot
    _names: dict = {}  # address of a name in libflashc's backend table -> the name
    _local = _api._local  # where flashc.last_backend() reads
    _make_options = _ext.flashc_torch_options
    _make_options.restype = ctypes.c_int64
    _make_options.argtypes = [ctypes.c_double, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                              ctypes.c_char_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double]  # fmt: skip
    _ids: dict = {}  # checked options tuple -> the extension's number for it

    def options_id(opts: tuple) -> int:
        """The number flashc_ext::fwd / bwd take for opts (scale, causal, window_left, window_right, top_left,
        backend, threads, deterministic, softcap, as flashc.torch checks them); -1 when the extension holds no
        more sets (the call then runs through ctypes)."""
        i = _ids.get(opts)
        if i is None:
            scale, causal, wl, wr, top_left, backend, threads, det, softcap = opts
            i = _make_options(scale or 0.0, causal, wl, wr, top_left, backend.encode(), threads, det, softcap)
            if len(_ids) < 4096:
                _ids[opts] = i
        return i

    class _Slot(threading.local):
        """Per thread: the cell the extension writes the address of the last backend's name into."""

        def __init__(self):
            self.cell = ctypes.c_void_p()
            _set_slot(ctypes.addressof(self.cell))

    _slot = _Slot()

    def _name(at: int) -> str:
        """The backend name at this address of libflashc's table (read once per backend)."""
        name = _names[at] = ctypes.string_at(at).decode()
        return name

    def _note_backend(backend: str, cell) -> None:
        """flashc.last_backend() after an extension call, as _ops._run sets it (reading the cell is no call)."""
        if backend != "auto":
            _local.last_backend = backend
            return
        at = cell.value
        _local.last_backend = _names.get(at) or _name(at)

    def forward(q, k, v, cu_q, cu_k, opts: tuple, oid: int, max_q: int = 0, max_k: int = 0, alibi=None, mask=None):
        """(out, lse) of a call with nothing but the options (oid = options_id(opts)), with device offsets the
        longest sequences, and ALiBi slopes and an attn_mask (None: none): through the extension, else (it refused
        the call, or oid is -1) through _ops, which raises the error flashc.torch raises."""
        cell = _slot.cell  # before the call: a thread's first access registers its cell
        try:
            out, lse = _fwd(q, k, v, cu_q, cu_k, oid, max_q, max_k, alibi, mask)
        except Exception:
            return _ops.fwd_impl(q, k, v, cu_q, cu_k, *opts, None, None, alibi, mask, max_seqlen_q=max_q,
                                 max_seqlen_k=max_k)  # fmt: skip
        # flashc.last_backend(), as _note_backend sets it, inline: this runs on every call
        _local.last_backend = opts[5] if opts[5] != "auto" else (_names.get(cell.value) or _name(cell.value))
        return out, lse

    def backward(dout, q, k, v, out, lse, cu_q, cu_k, opts: tuple, oid: int, max_q: int = 0, max_k: int = 0,
                 alibi=None, mask=None):  # fmt: skip
        """(dq, dk, dv) of forward()'s call, as forward() runs it (no gradient of the mask)."""
        cell = _slot.cell
        try:
            grads = _bwd(dout, q, k, v, out, lse, cu_q, cu_k, oid, max_q, max_k, alibi, mask)
        except Exception:
            return _ops.bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, *opts, None, None, alibi, mask,
                                 max_seqlen_q=max_q, max_seqlen_k=max_k)  # fmt: skip
        _local.last_backend = opts[5] if opts[5] != "auto" else (_names.get(cell.value) or _name(cell.value))
        return grads

    def host_threads(backend: str) -> int:
        """The thread count set on this thread's host handle for backend (-1: none yet), as the Python path's
        _ops._tls.handles[(backend, -1, 0)].threads shows it."""
        fn = _ext.flashc_torch_host_threads
        fn.argtypes, fn.restype = [ctypes.c_char_p], ctypes.c_int
        return fn(backend.encode())

    def _default(x) -> bool:
        return x is None or x is False or (type(x) in (int, float) and x == 0)

    def _plain(more, kw, at: int):
        """(max_seqlen_q, max_seqlen_k) when the arguments past attn_mask (want_dbias's) keep their defaults (None,
        False or 0), which the extension's operators assume, but for max_seqlen_q/k (positions at, at + 1 of more,
        or keywords), which they take; else None. Any argument added to _ops.fwd_impl later keeps this path only at
        its default."""
        lens = [0, 0]
        for i, x in enumerate(more):
            if at <= i <= at + 1 and type(x) is int:
                lens[i - at] = x
            elif not _default(x):
                return None
        for name, x in kw.items() if kw else ():
            if name in ("max_seqlen_q", "max_seqlen_k") and type(x) is int:
                lens[name == "max_seqlen_k"] = x
            elif not _default(x):
                return None
        return lens

    def _offsets_fit(q, cu_q, cu_k) -> bool:
        """Dense, host offsets, or offsets on the device beside CUDA tensors (the extension checks the device)."""
        return cu_q is None or (cu_k is not None and ((cu_q.is_cpu and cu_k.is_cpu) or q.is_cuda))

    def fwd_impl(q, k, v, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det, softcap=0.0,
                 su_q=None, su_k=None, alibi=None, mask=None, *more, **kw):  # fmt: skip
        if (
            su_q is None
            and su_k is None
            and _offsets_fit(q, cu_q, cu_k)
            and (lens := _plain(more, kw, 4)) is not None  # after dropout_p, seed, offset, num_splits
        ):
            cell = _slot.cell  # before the call: a thread's first access registers its cell
            try:
                oid = options_id((scale, causal, wl, wr, top_left, backend, threads, det, softcap))
                out, lse = _fwd(q, k, v, cu_q, cu_k, oid, *lens, alibi, mask)
            except Exception:  # the Python path below raises the error flashc.torch raises without the extension
                pass
            else:
                _note_backend(backend, cell)
                return out, lse
        return _ops.fwd_impl(q, k, v, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det, softcap,
                             su_q, su_k, alibi, mask, *more, **kw)  # fmt: skip

    def bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det,
                 softcap=0.0, su_q=None, su_k=None, alibi=None, mask=None, want_dbias=False, *more, **kw):  # fmt: skip
        if (
            su_q is None
            and su_k is None
            and not want_dbias
            and _offsets_fit(q, cu_q, cu_k)
            and (lens := _plain(more, kw, 3)) is not None  # after dropout_p, seed, offset
        ):
            cell = _slot.cell
            try:
                oid = options_id((scale, causal, wl, wr, top_left, backend, threads, det, softcap))
                grads = _bwd(dout, q, k, v, out, lse, cu_q, cu_k, oid, *lens, alibi, mask)
            except Exception:
                pass
            else:
                _note_backend(backend, cell)
                return grads
        return _ops.bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads,
                             det, softcap, su_q, su_k, alibi, mask, want_dbias, *more, **kw)  # fmt: skip

    class Attention(torch.autograd.Function):
        """flashc.torch's autograd for a call with nothing but q, k, v, cu_seqlens, the options, ALiBi slopes and
        an attn_mask that needs no gradient: apply(q, k, v, cu_q, cu_k, opts, options_id(opts), want_lse, max_q,
        max_k, alibi, mask) -> out, or (out, lse) with want_lse; max_q, max_k: the longest sequences, with
        cu_seqlens on the device (else 0); alibi, mask: None when not given (the slopes get no gradient, as on every
        path). flashc.torch's _Function covers every feature; this one does only what such a call needs, which is what
        a forward + backward costs above the kernels: the old-style forward(ctx, ...) (a setup_context would be
        a second Python call), lse an output only when asked for (else a saved intermediate: autograd then
        neither wraps it nor makes a zero gradient for it), no zero-filled gradients (set_materialize_grads:
        dout is None when out is unused). Same formula: lse not differentiable, no double backward."""

        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, opts, oid, want_lse, max_q=0, max_k=0, alibi=None, mask=None):
            out, lse = forward(q, k, v, cu_q, cu_k, opts, oid, max_q, max_k, alibi, mask)
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi, mask)
            ctx.opts = opts
            ctx.oid = oid
            ctx.lens = (max_q, max_k)
            ctx.set_materialize_grads(False)
            if want_lse:
                ctx.mark_non_differentiable(lse)
                return out, lse
            return out

        @staticmethod
        def backward(ctx, dout, _dlse=None):
            if torch.is_grad_enabled():
                _ops.check_double_backward()
            if dout is None:  # only lse was used: it is not differentiable, so nothing flows
                return None, None, None, None, None, None, None, None, None, None, None, None
            q, k, v, out, lse, cu_q, cu_k, alibi, mask = ctx.saved_tensors
            dq, dk, dv = backward(dout, q, k, v, out, lse, cu_q, cu_k, ctx.opts, ctx.oid, *ctx.lens, alibi, mask)
            return dq, dk, dv, None, None, None, None, None, None, None, None, None

    def _bwd_kernel(dout, q, k, v, out, lse, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det,
                    softcap=0.0, su_q=None, su_k=None, alibi=None, mask=None, *more):  # fmt: skip
        """flashc::bwd's kernel: its arguments in its schema's order (no want_dbias there)."""
        return bwd_impl(dout, q, k, v, out, lse, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det,
                        softcap, su_q, su_k, alibi, mask, False, *more)  # fmt: skip

    # The registered operators (what torch.compile and torch.export call) run the same kernels: their CPU and CUDA
    # implementations become these, in place of _ops's custom_op bodies (the same arguments, in schema order;
    # anything these do not take goes to those bodies' own code, _ops.fwd_impl / bwd_impl). flashc::bwd_dbias keeps
    # its own. Their fake implementations and autograd formulas stay _ops's.
    if _ops.HAVE_OPS:
        _ops.fwd.register_kernel(("cpu", "cuda"), fwd_impl)
        _ops.bwd.register_kernel(("cpu", "cuda"), _bwd_kernel)

    # ---- attention_with_kvcache's short path: flashc_ext::kvcache ---------------------------------------------
    _kv = getattr(torch.ops.flashc_ext, "kvcache", None)  # None in an extension older than this module
    _kv = _kv and getattr(_kv.default, "_op", _kv.default)
    _bump = torch._C._increment_version  # takes a sequence of tensors (a tensor alone it would iterate)
    _kv_ids: dict = {}  # attention_with_kvcache's option arguments (with types and q.is_cuda) -> options number

    def _kv_options(key: tuple) -> int:
        """The options number of attention_with_kvcache's option arguments, checked as its Python path checks
        them; -1 where that path would refuse them (it then raises) or the extension holds no more sets."""
        causal, window, scale, backend, threads, _, _, cuda = key
        try:
            scale, causal, wl, wr, _, _ = _api.check_options(causal, window, scale, "bottom-right", False)
            threads = -1 if threads is None else _api._check_threads(threads)
            _api._check_backend(backend, "cuda" if cuda else "cpu")  # host backends never get device pointers
        except Exception:
            return -1
        oid = options_id((scale, causal, wl, wr, False, backend, threads, False, 0.0))
        if _ft._cacheable(window) and len(_kv_ids) < 1024:
            _kv_ids[key] = oid
        return oid

    def _any_requires_grad(*xs) -> bool:
        """Whether a call could record autograd history, which the operator has none for (the Python path's
        operator gives such a call an output whose backward raises)."""
        return any(x is not None and x.requires_grad for x in xs)

    def kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, window, scale, return_lse, backend,
                threads, num_splits, out):  # fmt: skip
        """flashc.attention_with_kvcache's result for its arguments (cache_seqlens as a tensor or None) through
        flashc_ext::kvcache, or None: the call is not a plain eager call on plain tensors with valid options, or
        the extension refused it. The caller then runs its Python path, which gives the same result or raises
        the error it always raised (a refused call has written nothing: the library checks before it appends)."""
        ft, T = _ft, _Tensor
        if not (
            type(q) is T
            and type(k_cache) is T
            and type(v_cache) is T
            and (k is None or type(k) is T)
            and (v is None or type(v) is T)
            and (out is None or type(out) is T)
            and (cache_seqlens is None or type(cache_seqlens) is T)
            and (block_table is None or type(block_table) is T)
            and type(num_splits) is int
            and not (ft._grad_enabled() and _any_requires_grad(q, k_cache, v_cache, k, v, out))
            and not ft._is_compiling()
            and not ft._dispatch_modes()
            and not ft._function_modes()
            and ft._tracing_state() is None
            and ft._peek_functorch() is None
        ):
            return None
        key = (causal, window, scale, backend, threads, type(scale), type(threads), q.is_cuda)
        try:
            oid = _kv_ids[key] if window is None or ft._no_bools(window) else _kv_options(key)
        except (KeyError, TypeError):  # TypeError: a window that is not hashable
            oid = _kv_options(key)
        if oid < 0:
            return None
        cell = _slot.cell  # before the call: a thread's first access registers its cell
        try:
            o, lse = _kv(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, oid, num_splits,
                         True if return_lse else False)  # fmt: skip
        except Exception:
            return None
        # What the Python path's operator does around its kernel: the written tensors' versions move on (so that
        # autograd notices a cache it saved being changed), and flashc.last_backend() names the backend run.
        _bump((k_cache, v_cache) if out is None else (k_cache, v_cache, out))
        _local.last_backend = _names.get(cell.value) or _name(cell.value)
        if out is not None:
            o = out
        return (o, lse) if return_lse else o

    _Tensor = torch.Tensor
    if _kv is None:
        kvcache = None  # noqa: F811

else:
    fwd_impl = _ops.fwd_impl
    bwd_impl = _ops.bwd_impl
    Attention = forward = backward = options_id = kvcache = None

# flashc.torch's kernels as they are without the extension: what tests and bench/torch_call_cost.py put in place of
# this module (flashc.torch._kernels) to run the Python path beside the extension's.
PYTHON_PATH = types.SimpleNamespace(AVAILABLE=False, fwd_impl=_ops.fwd_impl, bwd_impl=_ops.bwd_impl, Attention=None)

# Where the short paths read plain eager mode and the options caches' rules (flashc.torch, which imports this
# module first: bound last, so that either import order works).
from . import torch as _ft  # noqa: E402
