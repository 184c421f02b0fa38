"""The Python API: attention forward and backward (dense and varlen), prepared calls, backends.

A call is built in two steps. prepare_forward/prepare_backward check in Python only what ctypes or the C
library cannot check (types, ranks, the sizes of lse and cu_seqlens, devices), allocate the outputs that were
not given, fill the ctypes structs and return a Call; `Call.__call__` then runs the C function on a cached
handle: the thread's for the CPU, the thread's for the current CUDA stream on a GPU (flashc.torch's, so that a
CUDA graph capture on a stream flashc has not run on gets a clear error). The public functions do both at once; a
loop or a benchmark keeps the Call and repeats only the C call. Every other check (shapes against each other,
the mask, what a backend supports) is the C library's, and its message comes back in the exception.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import numbers
import threading
import weakref

from . import _arrays, _lib
from ._arrays import np  # None without numpy: only numpy arrays, and conversions that check for it, reach np
from ._lib import InvalidArgumentError, UnsupportedError

_ALIGNS = {"bottom-right": _lib.ALIGN_BOTTOM_RIGHT, "top-left": _lib.ALIGN_TOP_LEFT}


# ---- handles: on the CPU one per thread and backend, so the workspace is reused between calls ----------
# (CUDA calls take flashc.torch's: one per thread, device and stream, _ops._handle)
class _Handle:
    def __init__(self, backend: str):
        h = _lib.Handle()
        _lib.check(_lib.lib.flashc_create(ctypes.byref(h), backend.encode()))
        self.ptr = h
        # flashc_destroy also frees the workspace; the finalizer runs at thread end and at exit.
        self._finalizer = weakref.finalize(self, _lib.lib.flashc_destroy, h)


_local = threading.local()


def _handle(backend: str) -> _Handle:
    cache = getattr(_local, "handles", None)
    if cache is None:
        cache = _local.handles = {}
    h = cache.get(backend)
    if h is None:
        h = cache[backend] = _Handle(backend)
    return h


def last_backend() -> str:
    """The backend that the last successful flashc call on this thread ran ("" before any): with
    backend="auto", the one that was picked."""
    return getattr(_local, "last_backend", "")


# ---- options -------------------------------------------------------------------------------------------
def check_options(causal, window, scale, causal_align, deterministic) -> tuple:
    """The mask and scale options as the C API takes them, (scale or None, causal, window_left, window_right,
    top_left, deterministic), with one set of checks and messages for the numpy and the torch entry points."""
    if causal not in (True, False, 0, 1):
        raise TypeError(f"flashc: causal must be a bool, not {causal!r}")
    wl = wr = -1
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise TypeError(f"flashc: window must be None or (left, right), not {window!r}")
        sides = []
        for side, w in zip(("left", "right"), window):
            if w is None:
                w = -1
            if isinstance(w, bool) or not hasattr(w, "__index__"):
                raise TypeError(f"flashc: window {side} must be an int or None, not {w!r}")
            w = w.__index__()
            if not -(2**63) <= w < 2**63:
                raise ValueError(f"flashc: window {side} {w} does not fit in 64 bits")
            sides.append(max(w, -1))
        wl, wr = sides
    if scale is not None:
        if isinstance(scale, (bool, str, bytes)) or not hasattr(scale, "__float__"):
            raise TypeError(f"flashc: scale must be a float or None, not {scale!r}")
        scale = float(scale)
        if not math.isfinite(scale) or scale == 0.0:
            # 0 means "1/sqrt(head_dim)" in the C API, so a real 0 cannot be passed.
            raise ValueError(f"flashc: scale is {scale}; it must be finite and non-zero (None: 1/sqrt(head_dim))")
        if not 1.1754943508222875e-38 <= abs(scale) <= 3.4028234663852886e38:  # float32's normal range
            raise ValueError(f"flashc: scale {scale} is outside float32 range")
    if causal_align not in _ALIGNS:
        raise ValueError(
            f"flashc: causal_align is {causal_align!r}; use 'bottom-right' (FlashAttention: the "
            "last query sees the last key) or 'top-left' (PyTorch's is_causal)"
        )
    if deterministic not in (True, False, 0, 1):
        raise TypeError(f"flashc: deterministic must be a bool, not {deterministic!r}")
    return scale, bool(causal), wl, wr, causal_align == "top-left", bool(deterministic)


def check_softcap(softcap) -> float:
    """softcap as the C API takes it: 0.0 (or None) for none, else a finite float > 0 (s <- cap*tanh(s/cap))."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, (bool, str, bytes)) or not hasattr(softcap, "__float__"):
        raise TypeError(f"flashc: softcap must be a float (0.0: none), not {softcap!r}")
    cap = float(softcap)
    if not (math.isfinite(cap) and cap >= 0.0):
        raise ValueError(f"flashc: softcap is {cap}; it must be 0.0 (none) or finite and > 0")
    if cap != 0.0 and not 1.1754943508222875e-38 <= cap <= 3.4028234663852886e38:
        raise ValueError(f"flashc: softcap {cap} is outside float32 range")
    return cap


def check_num_splits(num_splits) -> int:
    """num_splits as the C API takes it: 0 (the backend chooses), 1 (no split) or n > 1 (at most n parts)."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"flashc: num_splits must be an int (0: the backend chooses), not {num_splits!r}")
    if not 0 <= int(num_splits) < 2**31:
        raise ValueError(
            f"flashc: num_splits is {num_splits}; it must be 0 (the backend chooses), 1 (no split) or more"
        )
    return int(num_splits)


def check_dropout(dropout_p, seed, offset) -> tuple:
    """Dropout as the C API takes it: (p, seed, offset) with p = 0 or 2^-17 <= p < 1 - 2^-17 and seed, offset as
    unsigned 64-bit integers (a negative int, such as a torch seed, is taken mod 2^64). seed is required when p > 0:
    the backward regenerates the mask from it, so the caller must hold it (there is no hidden generator state to draw
    it from)."""
    if dropout_p is None:
        dropout_p = 0.0
    if isinstance(dropout_p, (bool, str, bytes)) or not hasattr(dropout_p, "__float__"):
        raise TypeError(f"flashc: dropout_p must be a float in [0, 1), not {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"flashc: dropout_p is {p}; it must be in [0, 1) (0: no dropout)")
    if p >= 1.0 - 2.0**-25:  # rounds to 1 in float32, which the C API takes (halfway to 1 - 2^-24 rounds up)
        raise ValueError(f"flashc: dropout_p {p} rounds to 1.0 in float32; it must be below 1")
    # flashc.h draws 16 bits per weight: t16 = floor(p·2^16 + 1/2) of the float32 p must be neither 0 nor 2^16, i.e.
    # float32(p) in [2^-17, 1 - 2^-17); the bounds below are where float32 rounding crosses those (plain floats, so
    # that torch.compile traces it)
    if p > 0.0 and not 2.0**-17 - 2.0**-42 <= p < 1.0 - 2.0**-17 - 2.0**-25:
        raise ValueError(
            f"flashc: dropout_p is {p}; dropout draws 16 bits per weight, so a nonzero p must be in "
            "[2^-17, 1 - 2^-17) (it is quantised to a multiple of 2^-16)"
        )
    words = []
    for name, x in (("seed", seed), ("offset", offset)):
        if x is None:
            if name == "seed" and p > 0.0:
                raise ValueError(
                    "flashc: dropout_p > 0 needs seed= (an int): the backward regenerates the mask from the same "
                    "seed and offset"
                )
            x = 0
        if isinstance(x, bool) or not isinstance(x, numbers.Integral):
            raise TypeError(f"flashc: {name} must be an int, not {x!r}")
        if not -(2**63) <= int(x) < 2**64:
            raise ValueError(f"flashc: {name} is {x}; it must fit 64 bits")
        words.append(int(x) % 2**64)
    return p, words[0], words[1]


def dropout_mask_shape(q, k, varlen: bool, hosts) -> tuple:
    """The debug mask's shape (flashc.h): [batch, heads_q, seqlen_q, seqlen_k]; varlen [num_seqs, heads_q, longest
    seqlen_q, longest seqlen_k]."""
    if not varlen:
        return (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    cq, ck = hosts
    longest = [int(np.diff(c).max()) if c.size > 1 else 0 for c in (cq, ck)]
    return (cq.size - 1, q.shape[1], longest[0], longest[1])


def check_alibi_shape(shape, heads_q: int, batch: int) -> int:
    """ALiBi slopes are [heads_q] (one per head) or [batch, heads_q] (num_seqs for varlen): returns the C API's
    alibi_stride_batch (0 or heads_q)."""
    shape = tuple(shape)
    if shape == (heads_q,):
        return 0
    if shape == (batch, heads_q):
        return heads_q
    raise ValueError(
        f"flashc: alibi_slopes has shape {shape}; expected ({heads_q},) or ({batch}, {heads_q}): [heads_q] or "
        "[batch, heads_q] (num_seqs for varlen)"
    )


def host_seqused(name: str, x, num_seqs: int) -> np.ndarray:
    """seqused_q/k as the host int32 array of num_seqs that the C library reads (from a list, a numpy array or a
    torch tensor on any device); the library checks each against its cu_seqlens slot."""
    _arrays.require_numpy(f"{name} as a {type(x).__name__} (int32 torch tensors need no conversion)")
    if _arrays.is_torch(x):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except Exception as e:
        raise TypeError(f"flashc: {name} is not an array of lengths: {e}") from None
    if a.dtype.kind not in "iu":
        raise TypeError(f"flashc: {name} must hold integers, not {a.dtype}")
    if a.shape != (num_seqs,):
        raise ValueError(f"flashc: {name} has shape {a.shape}; it must be ({num_seqs},): one length per sequence")
    if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
        raise ValueError(f"flashc: {name} holds lengths outside int32")
    return np.require(a, np.int32, ["C", "A"])


def mask_shape_4d(shape, full) -> tuple:
    """attn_mask's shape as SDPA broadcasts it: 2 to 4 dims, right-aligned against full = (batch, heads_q, seqlen_q,
    seqlen_k), each of size 1 or full's; returned with 1s prepended to 4 dims."""
    shape = tuple(int(n) for n in shape)
    s4 = (1,) * (4 - len(shape)) + shape
    if not 2 <= len(shape) <= 4 or any(a not in (1, n) for a, n in zip(s4, full)):
        raise ValueError(
            f"flashc: attn_mask has shape {shape}; it must broadcast to [batch, heads_q, seqlen_q, seqlen_k] = "
            f"{list(full)} (2 to 4 dims, each 1 or the full size), as for scaled_dot_product_attention"
        )
    return s4


def attn_mask_view(attn_mask, q, full) -> tuple:
    """attn_mask as the C API reads it: (the array to keep alive and pass, is_bool, strides[4] in elements with 0
    where it broadcasts). A bool mask is read as uint8 (True = attend); a float one is converted to q's dtype (the
    C API's rule) where it is not already. numpy masks for numpy q, torch masks (moved to q's device) for torch q."""
    if _arrays.is_torch(q):
        import torch

        m = torch.as_tensor(attn_mask).detach()
        if m.device != q.device:
            m = m.to(q.device)
        s4 = mask_shape_4d(m.shape, full)
        m = m.reshape(s4)
        if m.dtype == torch.bool:
            m = m.view(torch.uint8)
        elif m.is_floating_point():
            if m.dtype != q.dtype:
                m = m.to(q.dtype)
        else:
            raise TypeError(f"flashc: attn_mask must be bool or floating point, not {m.dtype}")
        strides = [m.stride(d) if s4[d] > 1 else 0 for d in range(4)]
        return m, m.dtype == torch.uint8, strides
    if _arrays.is_torch(attn_mask):
        attn_mask = attn_mask.detach().cpu().numpy()
    m = np.asarray(attn_mask)
    s4 = mask_shape_4d(m.shape, full)
    if m.dtype == np.bool_:
        m = m.view(np.uint8)
    elif m.dtype.kind == "f" or m.dtype == q.dtype:
        if m.dtype != q.dtype:
            m = m.astype(q.dtype)
    else:
        raise TypeError(f"flashc: attn_mask must be bool or floating point, not {m.dtype}")
    m = m.reshape(s4)
    if any(st < 0 or st % m.itemsize for st in m.strides) or not m.dtype.isnative or not m.flags.aligned:
        m = np.ascontiguousarray(m)
    strides = [m.strides[d] // m.itemsize if s4[d] > 1 else 0 for d in range(4)]
    return m, m.dtype == np.uint8, strides


def _set_attn_mask(params: _lib.Params, q, k, varlen: bool, attn_mask) -> tuple:
    """attn_mask into params; returns (the array to keep, its 4-d shape) or (None, None)."""
    if attn_mask is None:
        return None, None
    if varlen:
        raise ValueError("flashc: attn_mask is not supported with packed (varlen) tensors; pad them to a batch")
    full = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    m, is_bool, strides = attn_mask_view(attn_mask, q, full)
    params.attn_mask = _arrays.data_ptr(m) if _arrays.numel(m) else None
    params.attn_mask_is_bool = int(is_bool)
    params.attn_mask_stride[:] = strides
    return m, tuple(m.shape)


def _features(params: _lib.Params, q, varlen: bool, softcap, alibi_slopes, seqused_q, seqused_k) -> list:
    """softcap, ALiBi and seqused into params; returns the arrays the params point into (to keep alive).
    The slopes go where q lives (the C library reads them there), as float32."""
    params.softcap = check_softcap(softcap)
    keep = []
    if alibi_slopes is not None:
        heads_q = q.shape[-2]
        batch = params.num_seqs if varlen else q.shape[0]
        if _arrays.is_torch(q):
            import torch

            a = torch.as_tensor(alibi_slopes).detach().to(device=q.device, dtype=torch.float32).contiguous()
        else:
            if _arrays.is_torch(alibi_slopes):
                alibi_slopes = alibi_slopes.detach().cpu().numpy()
            a = np.ascontiguousarray(alibi_slopes, dtype=np.float32)
        params.alibi_stride_batch = check_alibi_shape(a.shape, heads_q, batch)
        params.alibi_slopes = ctypes.cast(_arrays.data_ptr(a), ctypes.POINTER(ctypes.c_float))
        keep.append(a)
    for name, x in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if x is None:
            continue
        if not varlen:
            raise ValueError(f"flashc: {name} needs packed (varlen) tensors with cu_seqlens_q/k")
        a = host_seqused(name, x, params.num_seqs)
        setattr(params, name, a.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
        keep.append(a)
    return keep


def _params(causal, window, scale, causal_align, deterministic) -> _lib.Params:
    scale, causal, wl, wr, top_left, deterministic = check_options(causal, window, scale, causal_align, deterministic)
    p = _lib.params_default()
    p.causal, p.window_left, p.window_right = int(causal), wl, wr
    p.scale = scale or 0.0
    p.align = _lib.ALIGN_TOP_LEFT if top_left else _lib.ALIGN_BOTTOM_RIGHT
    p.deterministic = int(deterministic)
    return p


def _check_backend(backend, device: str) -> str:
    """A str, and one whose memory is where the tensors are. The C library finds out where a pointer lives
    through the CUDA runtime, which a build without CUDA lacks: there, a CUDA tensor would be read as host
    memory. So Python refuses device tensors for host backends (and the other way round) itself."""
    if not isinstance(backend, str):
        raise TypeError(
            f"flashc: backend must be a str ('auto' or a name from flashc.backends()), not {type(backend).__name__}"
        )
    on_cuda = device.startswith("cuda")
    known = _backend_devices()  # usable backends only: the library says why the others cannot run
    if backend == "auto":
        if on_cuda and "cuda" not in known.values():
            raise UnsupportedError(
                f"flashc: the tensors are on {device} but this libflashc has no usable CUDA backend "
                "(built with FLASHC_CUDA=OFF or without nvcc, or no device)"
            )
    elif backend in known and (known[backend] == "cuda") != on_cuda:
        raise InvalidArgumentError(
            f"flashc: the tensors are in {'CUDA device' if on_cuda else 'host'} memory ({device}) but backend "
            f"{backend} needs {'CUDA device' if known[backend] == 'cuda' else 'host'} memory"
        )
    return backend


_devices_cache = None


def _backend_devices() -> dict:
    global _devices_cache
    if _devices_cache is None:
        _devices_cache = {b.name: b.device for b in backends() if b.usable}
    return _devices_cache


def _check_threads(threads) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise TypeError(f"flashc: threads must be an int or None, not {threads!r}")
    if not 0 <= int(threads) <= 2**31 - 1:
        raise ValueError(f"flashc: threads is {threads}; use 0 or None for all processors, or a positive count")
    return int(threads)


# ---- a prepared call -----------------------------------------------------------------------------------
class Call:
    """A forward or backward call with its arguments converted once: calling it runs only the C function
    (for loops and benchmarks). Its outputs are the arrays in `outputs`, overwritten by every call. It keeps
    the arrays it describes alive; use it on one thread at a time."""

    def __init__(
        self,
        backward: bool,
        backend: str,
        threads: int,
        params: _lib.Params,
        tensors,
        lse_ptr,
        keep,
        outputs,
        device: str,
    ):
        self._backward = backward
        self.backend = backend
        self._threads = threads
        self._params = params
        self._tensors = tensors
        self._lse = lse_ptr
        self._keep = keep  # the arrays and host arrays (cu_seqlens) the structs point into
        self.outputs = outputs
        self._cuda = None
        if device.startswith("cuda"):
            import torch

            from . import _ops

            self._cuda = torch.cuda
            self._device = torch.device(device)
            self._stream_handle = _ops._handle

    def __call__(self):
        lib = _lib.lib
        t = self._tensors
        ref = ctypes.byref
        if self._cuda is None:
            h = _handle(self.backend)
            _lib.check(lib.flashc_set_stream(h.ptr, None))
            status = self._run(lib, h, t, ref)
        else:
            # flashc.torch's handle of this thread, device and current stream: a CUDA graph captured on a stream
            # flashc has not run on gets its clear error, not an invalidated capture (a handle of another stream
            # would order the call after that stream's work, which a capture cannot wait for).
            index = self._device.index
            if self._cuda.current_device() == index:
                h = self._stream_handle(self.backend, index)
                status = self._run(lib, h, t, ref)
            else:
                with self._cuda.device(self._device):  # the C library works on the current device: the tensors'
                    h = self._stream_handle(self.backend, index)
                    status = self._run(lib, h, t, ref)
        _lib.check(status)
        _local.last_backend = lib.flashc_handle_last_backend(h.ptr).decode()
        return self.outputs

    def _run(self, lib, h, t, ref):
        _lib.check(lib.flashc_set_threads(h.ptr, self._threads))
        if self._backward:
            q, k, v, o, dout, dq, dk, dv = t
            return lib.flashc_backward(
                h.ptr,
                ref(self._params),
                ref(q),
                ref(k),
                ref(v),
                ref(o),
                self._lse,
                ref(dout),
                ref(dq),
                ref(dk),
                ref(dv),
            )
        q, k, v, o = t
        return lib.flashc_forward(h.ptr, ref(self._params), ref(q), ref(k), ref(v), ref(o), self._lse)


def _float_ptr(x):
    """lse's pointer; NULL for an lse with no element (a call without query rows), as the C library takes it."""
    if _arrays.numel(x) == 0:
        return None
    return ctypes.cast(_arrays.data_ptr(x), ctypes.POINTER(ctypes.c_float))


def _same_kind_and_device(named: dict) -> str:
    """All arrays one kind (numpy or torch) on one device; returns the device."""
    items = list(named.items())
    first_name, first = items[0]
    k0, d0 = _arrays.kind(first_name, first), _arrays.device_of(first)
    for name, x in items[1:]:
        if _arrays.kind(name, x) != k0:
            raise TypeError(f"flashc: {name} is a {_arrays.kind(name, x)} array but {first_name} is a {k0} array")
        if _arrays.device_of(x) != d0:
            raise ValueError(f"flashc: {name} is on {_arrays.device_of(x)} but {first_name} is on {d0}")
    return d0


def _varlen(cu_seqlens_q, cu_seqlens_k, params: _lib.Params, q, k):
    """Attach cu_seqlens to params; returns the host arrays (to keep alive) and lse's shape."""
    cq = _arrays.as_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    ck = _arrays.as_cu_seqlens("cu_seqlens_k", cu_seqlens_k)
    if cq.size != ck.size:
        raise ValueError(
            f"flashc: cu_seqlens_q has {cq.size} offsets but cu_seqlens_k has {ck.size}; both need num_seqs + 1"
        )
    params.cu_seqlens_q = cq.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    params.cu_seqlens_k = ck.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    params.num_seqs = cq.size - 1
    return (cq, ck), (q.shape[1], q.shape[0])


def _setup(
    named: dict, varlen: bool, causal, window, scale, backend, causal_align, threads, deterministic, cu_seqlens_q,
    cu_seqlens_k, softcap, alibi_slopes, seqused_q, seqused_k, dropout_p, seed, offset,
) -> tuple:  # fmt: skip
    """What a forward and a backward set up alike, checked in this order: the arrays of `named` (q, k first) as the
    C library reads them, of one kind and device; the options, cu_seqlens, softcap, ALiBi, seqused and dropout into
    params; the backend and the thread count. Returns (the arrays in `named`'s order, device, params, backend,
    threads, the arrays to keep alive, the host cu_seqlens or None, lse's shape)."""
    ndim = 3 if varlen else 4
    named = {n: _arrays.as_input(n, x, ndim) for n, x in named.items()}
    arrays = tuple(named.values())
    q, k = arrays[0], arrays[1]
    device = _same_kind_and_device(named)
    params = _params(causal, window, scale, causal_align, deterministic)
    backend, threads = _check_backend(backend, device), _check_threads(threads)
    keep = list(arrays)
    hosts = None
    if varlen:
        hosts, lse_shape = _varlen(cu_seqlens_q, cu_seqlens_k, params, q, k)
        keep += hosts
    else:
        lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    keep += _features(params, q, varlen, softcap, alibi_slopes, seqused_q, seqused_k)
    params.dropout_p, params.dropout_seed, params.dropout_offset = check_dropout(dropout_p, seed, offset)
    return arrays, device, params, backend, threads, keep, hosts, lse_shape


def _is_contiguous(x) -> bool:
    return x.flags.c_contiguous if _arrays.is_numpy(x) else x.is_contiguous()


# ---- public functions ----------------------------------------------------------------------------------
def require_cu_seqlens(fn: str, cu_seqlens_q, cu_seqlens_k) -> None:
    """The varlen entry points need both offset arrays (None would silently mean the dense layout)."""
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu is None:
            raise TypeError(f"flashc: {fn}: {name} is None; packed (varlen) tensors need cu_seqlens_q and cu_seqlens_k")


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
    out=None,
    lse=None,
    softcap=0.0,
    alibi_slopes=None,
    attn_mask=None,
    dropout_p=0.0,
    seed=None,
    offset=0,
    return_dropout_mask=False,
    num_splits=0,
):
    """Exact attention O = softmax(scale·Q·Kᵀ + mask)·V, as FlashAttention's flash_attn_func.

    q: [batch, seqlen_q, heads_q, head_dim]; k, v: [batch, seqlen_k, heads_kv, head_dim], heads_q a multiple
    of heads_kv (GQA/MQA); v may have a head dim of its own (out takes v's). numpy arrays (float32, float16,
    ml_dtypes.bfloat16, float64) or torch tensors on the CPU or a CUDA device (float32, float16, bfloat16,
    float64), any strides with a unit last stride (others are copied once). Results are new arrays of q's
    kind, device and dtype, unless `out` (and `lse`) are given, which are then written in place.

    causal: mask keys after the diagonal; causal_align puts the diagonal at the bottom-right of the score
      matrix (FlashAttention: query i sees keys j <= i + seqlen_k - seqlen_q) or the top-left (PyTorch).
    window: (left, right) keys each side of the diagonal (None or -1: unbounded); combines with causal.
    scale: None for 1/sqrt(head_dim).
    backend: "auto" (the best usable backend that supports the call) or a name from flashc.backends().
    return_lse: also return lse, float32 [batch, heads_q, seqlen_q] (natural log of the softmax sum;
      -inf where a row sees no key), which attention_backward needs.
    threads: CPU threads (None: all). deterministic: bit-identical backward, run to run.
    softcap: 0.0 (none) or cap > 0: scores s <- cap·tanh(s / cap) before the mask (Gemma-2), as flash_attn.
    alibi_slopes: None, or float32 slopes [heads_q] or [batch, heads_q]: scores minus
      slope·|i + seqlen_k - seqlen_q - j| (ALiBi, as flash_attn), added after softcap.
    attn_mask: None, or a mask as scaled_dot_product_attention takes it, broadcastable to [batch, heads_q,
      seqlen_q, seqlen_k] (2 to 4 dims, e.g. [seqlen_q, seqlen_k] or a [batch, 1, 1, seqlen_k] padding mask):
      bool (True = attend) or float (a bias added to the scores after softcap and ALiBi, converted to q's dtype;
      -inf hides a key). Rows whose keys are all removed give out = 0 and lse = -inf. Not with varlen.
    dropout_p: 0.0 (none) or p in [2^-17, 1 - 2^-17): each attention weight is dropped with probability p (drawn
      with 16 bits: p rounded to a multiple of 2^-16) and the kept ones are scaled by 1/(1 - p) (flash_attn's
      dropout_p); lse stays the undropped softmax's. seed (an int, required when dropout_p > 0) and offset
      (default 0, in Philox blocks) key the mask (Philox4x32-10, flashc.h): the same seed and offset give the same
      mask on every backend, and attention_backward needs them again. A call uses the offsets offset ..
      offset + seqlen_q·ceil(seqlen_k / 8) - 1: a next call should take another seed, or an offset past those, so
      that its mask differs.
    return_dropout_mask: also return the mask, bool [batch, heads_q, seqlen_q, seqlen_k] (True = kept; for every
      element, hidden or not), last in the returned tuple. A debug output for small calls (2^28 elements at most).
    num_splits: the parts each query tile's keys are split into on the GPU (flash_attn's num_splits; decoding):
      0 the backend chooses, 1 none, n > 1 at most n. Only cuda-mma splits; other backends ignore it.
    (The cpu and cpu-ref backends implement softcap, ALiBi, attn_mask, dropout and a head dim of V of its own,
    cuda-hopper softcap, ALiBi, attn_mask (not its gradient) and dropout (its backward up to head dim 128, without a
    float attn_mask), and V's head dims 192/128, 128/64, 64/128 and 64/256 without them, cuda-mma softcap, ALiBi,
    attn_mask and dropout, and V's head dims 192/128, 128/64 and 64/128 without them; the others raise
    NotImplementedError, and "auto" picks one that implements the call.)

    Rows that see no key give output 0. Empty inputs (batch 0, seqlen_q 0 or seqlen_k 0) are valid: the
    results have the inputs' shapes (o = 0 and lse = -inf where queries see no key).

    Errors raise flashc.Error subclasses: ValueError (invalid argument), NotImplementedError (the backend
    cannot do it), MemoryError, RuntimeError; the message is the C library's, naming the offending value.
    """
    call = prepare_forward(
        q, k, v, causal, window, scale, backend, causal_align=causal_align, threads=threads,
        deterministic=deterministic, out=out, lse=lse, softcap=softcap, alibi_slopes=alibi_slopes,
        attn_mask=attn_mask, dropout_p=dropout_p, seed=seed, offset=offset, return_dropout_mask=return_dropout_mask,
        num_splits=num_splits,
    )  # fmt: skip
    return _forward_result(call(), return_lse, return_dropout_mask)


def _forward_result(outputs, return_lse: bool, return_dropout_mask: bool):
    """out, or a tuple of out, lse (return_lse) and the dropout mask (return_dropout_mask), in that order."""
    res = (outputs[0],) + ((outputs[1],) if return_lse else ()) + ((outputs[2],) if return_dropout_mask else ())
    return res if len(res) > 1 else res[0]


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
    out=None,
    lse=None,
    softcap=0.0,
    alibi_slopes=None,
    seqused_q=None,
    seqused_k=None,
    dropout_p=0.0,
    seed=None,
    offset=0,
    return_dropout_mask=False,
    num_splits=0,
):
    """attention() over packed variable-length sequences, as flash_attn_varlen_func.

    q: [total_q, heads_q, head_dim], k, v: [total_k, heads_kv, head_dim]; sequence s owns rows
    cu_seqlens[s] : cu_seqlens[s+1]. cu_seqlens_q/k: num_seqs + 1 non-decreasing int offsets from 0 (a list,
    numpy array or torch tensor on any device: the C API reads them on the host). lse: [heads_q, total_q].
    The mask (causal, window) applies within each sequence. alibi_slopes [batch, heads_q] has num_seqs rows.
    seqused_q/k (FlashAttention-3's): None, or num_seqs ints: sequence s uses only the first seqused[s] rows of
    its slot; rows past them get out = 0, lse = -inf and zero gradients (and the used lengths are the
    sequence's lengths for the mask and ALiBi); cpu-ref, cpu, cuda-mma and cuda-hopper implement it. dropout_p,
    seed, offset, num_splits as attention(); the dropout mask returned is [num_seqs, heads_q, longest seqlen_q,
    longest seqlen_k], False past each sequence's lengths.
    """
    require_cu_seqlens("attention_varlen", cu_seqlens_q, cu_seqlens_k)
    call = prepare_forward(
        q, k, v, causal, window, scale, backend, causal_align=causal_align, threads=threads,
        deterministic=deterministic, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        softcap=softcap, alibi_slopes=alibi_slopes, seqused_q=seqused_q, seqused_k=seqused_k,
        dropout_p=dropout_p, seed=seed, offset=offset, return_dropout_mask=return_dropout_mask, num_splits=num_splits,
    )  # fmt: skip
    return _forward_result(call(), return_lse, return_dropout_mask)


def attention_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal=False,
    window=None,
    scale=None,
    backend="auto",
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    dq=None,
    dk=None,
    dv=None,
    softcap=0.0,
    alibi_slopes=None,
    seqused_q=None,
    seqused_k=None,
    attn_mask=None,
    return_dbias=False,
    dropout_p=0.0,
    seed=None,
    offset=0,
):
    """Gradients (dq, dk, dv) of attention() from the forward's out and lse and the output gradient dout.

    Same options as the forward (pass the same ones). dout, q, k, v, out share one dtype; lse is the
    forward's float32 lse. With cu_seqlens_q/k the tensors are packed as in attention_varlen. dq, dk, dv
    may be given to be written in place (overwritten, not accumulated). return_dbias (a float attn_mask):
    also return the mask's gradient, in its shape and q's dtype, summed over the dims it broadcasts:
    (dq, dk, dv, dbias). With dropout, pass the forward's dropout_p, seed and offset: the mask is regenerated.
    """
    call = prepare_backward(
        dout, q, k, v, out, lse, causal, window, scale, backend, causal_align=causal_align, threads=threads,
        deterministic=deterministic, dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        softcap=softcap, alibi_slopes=alibi_slopes, seqused_q=seqused_q, seqused_k=seqused_k,
        attn_mask=attn_mask, return_dbias=return_dbias, dropout_p=dropout_p, seed=seed, offset=offset,
    )  # fmt: skip
    return call()


def attention_varlen_backward(
    dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, causal=False, window=None, scale=None, backend="auto", **kwargs
):
    """attention_backward for attention_varlen's packed tensors."""
    require_cu_seqlens("attention_varlen_backward", cu_seqlens_q, cu_seqlens_k)
    return attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        causal,
        window,
        scale,
        backend,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        **kwargs,
    )


def prepare_forward(
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
    out=None,
    lse=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    softcap=0.0,
    alibi_slopes=None,
    seqused_q=None,
    seqused_k=None,
    attn_mask=None,
    dropout_p=0.0,
    seed=None,
    offset=0,
    return_dropout_mask=False,
    num_splits=0,
) -> Call:
    """attention() converted once: `call()` runs the forward again on the same arrays and returns
    (out, lse), written in place. q, k, v must not be moved or freed while the call is kept (it keeps a
    reference). With cu_seqlens_q/k the arrays are packed (varlen)."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    (q, k, v), device, params, backend, threads, keep, hosts, lse_shape = _setup(
        {"q": q, "k": k, "v": v}, varlen, causal, window, scale, backend, causal_align, threads, deterministic,
        cu_seqlens_q, cu_seqlens_k, softcap, alibi_slopes, seqused_q, seqused_k, dropout_p, seed, offset,
    )  # fmt: skip
    dtype = _arrays.dtype_code("q", q)
    keep.append(_set_attn_mask(params, q, k, varlen, attn_mask)[0])
    params.num_splits = check_num_splits(num_splits)
    mask = None
    if return_dropout_mask:
        mask = _arrays.empty(dropout_mask_shape(q, k, varlen, hosts), q, uint8=True)
        params.dropout_mask = _arrays.data_ptr(mask) if _arrays.numel(mask) else None
        keep.append(mask)
    o_shape = tuple(q.shape[:-1]) + (v.shape[-1],)  # o takes V's head dim
    if out is None:
        out = _arrays.empty(o_shape, q)
    else:
        _arrays.check_output("out", out, o_shape, dtype, q)
    if lse is None:
        lse = _arrays.empty(lse_shape, q, float32=True)
    else:
        _arrays.check_output("lse", lse, lse_shape, _lib.F32, q)
        if not _is_contiguous(lse):
            raise ValueError("flashc: lse must be contiguous (the C library writes it densely)")
    keep += [out, lse]
    tensors = tuple(_arrays.describe(x) for x in (q, k, v, out))
    outputs = (out, lse) if mask is None else (out, lse, _arrays.as_bool(mask))
    return Call(False, backend, threads, params, tensors, _float_ptr(lse), keep, outputs, device)


def prepare_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal=False,
    window=None,
    scale=None,
    backend="auto",
    *,
    causal_align="bottom-right",
    threads=None,
    deterministic=False,
    dq=None,
    dk=None,
    dv=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    softcap=0.0,
    alibi_slopes=None,
    seqused_q=None,
    seqused_k=None,
    attn_mask=None,
    return_dbias=False,
    dropout_p=0.0,
    seed=None,
    offset=0,
) -> Call:
    """attention_backward() converted once: `call()` returns (dq, dk, dv) (and dbias with return_dbias), written
    in place."""
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    (q, k, v, out, dout), device, params, backend, threads, keep, _, lse_shape = _setup(
        {"q": q, "k": k, "v": v, "out": out, "dout": dout}, varlen, causal, window, scale, backend, causal_align,
        threads, deterministic, cu_seqlens_q, cu_seqlens_k, softcap, alibi_slopes, seqused_q, seqused_k, dropout_p,
        seed, offset,
    )  # fmt: skip
    dtype = _arrays.dtype_code("q", q)
    lse = _arrays.as_lse(lse, lse_shape, q)
    grads = []
    for name, g, like in (("dq", dq, q), ("dk", dk, k), ("dv", dv, v)):
        if g is None:
            g = _arrays.empty(tuple(like.shape), q)
        else:
            _arrays.check_output(name, g, tuple(like.shape), dtype, q)
        grads.append(g)
    mask, mask4 = _set_attn_mask(params, q, k, varlen, attn_mask)
    keep += [lse, mask] + grads
    if return_dbias:
        if mask is None or params.attn_mask_is_bool:
            raise ValueError("flashc: return_dbias needs a float attn_mask (a boolean mask has no gradient)")
        # dbias in the mask's shape, written through a 4-d view whose broadcast dims have stride 0 (summed).
        dbias4 = _arrays.empty(mask4, q)
        params.dbias = _arrays.data_ptr(dbias4) if _arrays.numel(dbias4) else None
        st = _arrays._element_strides(dbias4)
        params.dbias_stride[:] = [st[d] if mask4[d] > 1 else 0 for d in range(4)]
        if hasattr(attn_mask, "shape"):
            mask_shape = tuple(attn_mask.shape)
        else:  # a nested list
            mask_shape = _arrays.require_numpy("attn_mask as a list").shape(attn_mask)
        grads.append(dbias4.reshape(mask_shape))
        keep.append(dbias4)
    tensors = tuple(_arrays.describe(x) for x in (q, k, v, out, dout, *grads[:3]))
    return Call(True, backend, threads, params, tensors, _float_ptr(lse), keep, tuple(grads), device)


# ---- backends ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend of libflashc (flashc_backend_info)."""

    name: str
    summary: str
    device: str  # "cpu" or "cuda"
    has_backward: bool
    dtypes: tuple  # ("f32", "f16", ...)
    min_head_dim: int
    max_head_dim: int
    usable: bool
    why_unusable: str


def backends() -> list:
    """Every backend compiled into the library, best first, usable here or not."""
    lib = _lib.lib
    result = []
    for i in range(lib.flashc_backend_count()):
        info = _lib.backend_info()
        _lib.check(lib.flashc_backend_query(i, ctypes.byref(info)))
        result.append(
            Backend(
                name=info.name.decode(),
                summary=(info.summary or b"").decode(),
                device="cuda" if info.device == _lib.DEVICE_CUDA else "cpu",
                has_backward=bool(info.has_backward),
                dtypes=tuple(n for c, n in _lib.DTYPE_NAMES.items() if info.dtypes & (1 << c)),
                min_head_dim=info.min_head_dim,
                max_head_dim=info.max_head_dim,
                usable=bool(info.usable),
                why_unusable=(info.why_unusable or b"").decode(),
            )
        )
    return result
