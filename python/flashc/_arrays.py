"""numpy arrays and torch tensors seen as flashc_tensor views, without copying.

A flashc_tensor is a data pointer, a dtype and sizes and strides in elements for [batch, seqlen, heads,
head_dim]; the C library takes any non-negative strides as long as the head_dim stride is 1. So an array is
passed as it is: its own pointer and strides. An input is copied only where the C API cannot describe it
(a head_dim stride other than 1, a negative stride, a misaligned or byte-swapped numpy buffer). An output
the caller hands in must already fit, since a copy would not be written back.

Everything the C library reads through a raw pointer that has no size of its own (lse, cu_seqlens) is
checked here: a wrong size there would make the library read out of bounds instead of failing.

An array with no element (batch or seqlen 0) is a valid argument: it is passed with a NULL pointer and
contiguous strides, as the C library takes it (its results: flashc.h, "Empty inputs").
"""

from __future__ import annotations

import math
import sys

from . import _lib

# numpy is optional (pip install flashc[numpy]): flashc.torch needs only torch. Without it np is None, no array
# is a numpy array, and what needs numpy (numpy inputs, offsets given as lists) raises require_numpy's ImportError.
try:
    import numpy as np
except ImportError:
    np = None
try:
    import ml_dtypes  # numpy's bfloat16
except ImportError:
    ml_dtypes = None

_NUMPY_DTYPES = {}
if np is not None:
    _NUMPY_DTYPES = {np.dtype(np.float32): _lib.F32, np.dtype(np.float16): _lib.F16, np.dtype(np.float64): _lib.F64}
    if ml_dtypes is not None:
        _NUMPY_DTYPES[np.dtype(ml_dtypes.bfloat16)] = _lib.BF16


def require_numpy(what: str):
    """numpy, or an ImportError that says what needed it and how to get it."""
    if np is None:
        raise ImportError(f"flashc: {what} needs numpy, which is not installed: pip install 'flashc[numpy]'")
    return np


def is_numpy(x) -> bool:
    return np is not None and isinstance(x, np.ndarray)


def _torch():
    """torch if it was imported by someone: a torch tensor cannot exist otherwise, so flashc never imports
    it itself (numpy users do not pay its import time)."""
    return sys.modules.get("torch")


def is_torch(x) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def _torch_dtypes():
    t = _torch()
    return {t.float32: _lib.F32, t.float16: _lib.F16, t.bfloat16: _lib.BF16, t.float64: _lib.F64}


def kind(name: str, x) -> str:
    """'numpy' or 'torch'; TypeError for anything else (None, lists, other array types), ImportError for an
    array-like where numpy is not installed."""
    if is_numpy(x):
        return "numpy"
    if is_torch(x):
        if x.layout != _torch().strided:
            raise TypeError(f"flashc: {name} has layout {x.layout}; pass a dense (strided) tensor")
        return "torch"
    if x is not None:  # an array-like, for the numpy API
        require_numpy(f"{name} as a {type(x).__name__} (flashc's numpy API)")
    raise TypeError(f"flashc: {name} must be a numpy.ndarray or a torch.Tensor, not {type(x).__name__}")


def dtype_code(name: str, x) -> int:
    """The flashc_dtype of an array; TypeError for a dtype flashc has no kernel for."""
    if is_numpy(x):
        code = _NUMPY_DTYPES.get(x.dtype.newbyteorder("=")) if x.dtype.kind in "fV" else None
    else:
        code = _torch_dtypes().get(x.dtype)
    if code is None:
        raise TypeError(
            f"flashc: {name}.dtype is {x.dtype}; flashc takes float32, float16, bfloat16 "
            "(ml_dtypes.bfloat16 for numpy) and float64 (cpu-ref only)"
        )
    return code


def device_of(x) -> str:
    """'cpu' for numpy; the torch device ('cpu', 'cuda:0')."""
    if is_numpy(x):
        return "cpu"
    dev = x.device
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"flashc: tensors on device '{dev}' are not supported (only cpu and cuda)")
    if dev.type == "cuda" and dev.index is None:  # never for a real tensor; be explicit all the same
        return f"cuda:{_torch().cuda.current_device()}"
    return str(dev)


def numel(x) -> int:
    return x.size if is_numpy(x) else x.numel()


def _element_strides(x) -> tuple[int, ...] | None:
    """Strides in elements, or None where the C API cannot describe the layout."""
    if numel(x) == 0:
        # Nothing is read or written through an empty array, and numpy gives them arbitrary strides (and
        # pointers): described as contiguous, never copied.
        return tuple(math.prod(int(n) for n in x.shape[i + 1 :]) for i in range(x.ndim))
    if is_numpy(x):
        item = x.itemsize
        if any(s % item for s in x.strides) or not x.flags.aligned or not x.dtype.isnative:
            return None
        strides = tuple(s // item for s in x.strides)
    else:
        if x.layout != _torch().strided:
            return None
        strides = tuple(x.stride())
    if any(s < 0 for s in strides):
        return None
    if x.shape[-1] > 1 and strides[-1] != 1:
        return None
    return strides


def as_input(name: str, x, ndim: int):
    """x itself when the C library can read it, else a contiguous copy. Checks kind, dtype and rank."""
    kind(name, x)
    dtype_code(name, x)
    if x.ndim != ndim:
        layout = "[batch, seqlen, heads, head_dim]" if ndim == 4 else "[total_tokens, heads, head_dim]"
        raise ValueError(f"flashc: {name} has {x.ndim} dimensions {tuple(x.shape)}; expected {ndim}: {layout}")
    device_of(x)
    if _element_strides(x) is not None:
        return x
    if is_numpy(x):
        # a copy always (ascontiguousarray would return a contiguous but misaligned array as it is)
        return np.array(x, dtype=x.dtype.newbyteorder("="), order="C", copy=True)
    return x.contiguous()


def check_output(name: str, x, shape: tuple[int, ...], dtype: int, like) -> None:
    """A caller-provided output must be the right kind, shape, dtype and device, writable, and describable
    without a copy (a copy would not be written back)."""
    if kind(name, x) != kind("q", like):
        raise TypeError(f"flashc: {name} is a {kind(name, x)} array but q is a {kind('q', like)} array")
    if dtype_code(name, x) != dtype:
        raise TypeError(f"flashc: {name}.dtype is {x.dtype} but it must be {_lib.DTYPE_NAMES[dtype]}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"flashc: {name} has shape {tuple(x.shape)}; expected {tuple(shape)}")
    if device_of(x) != device_of(like):
        raise ValueError(f"flashc: {name} is on {device_of(x)} but q is on {device_of(like)}")
    if is_numpy(x) and not x.flags.writeable:
        raise ValueError(f"flashc: {name} is a read-only array")
    if is_numpy(x) and numel(x) and not x.flags.aligned:
        raise ValueError(
            f"flashc: {name} is not aligned to its {x.itemsize}-byte elements; flashc needs element-aligned "
            "outputs (pass a fresh array)"
        )
    if _element_strides(x) is None:
        raise ValueError(
            f"flashc: {name} has strides {tuple(_raw_strides(x))} that flashc cannot write "
            "through (the last stride must be 1 and none negative); pass a contiguous array"
        )


def _raw_strides(x):
    return x.strides if is_numpy(x) else x.stride()


def data_ptr(x) -> int:
    return x.ctypes.data if is_numpy(x) else x.data_ptr()


def describe(x) -> _lib.Tensor:
    """The flashc_tensor of a 4-d [b, s, h, d] or a 3-d packed [total, h, d] array (batch 1), with the
    array's own dtype (the C library checks that all agree)."""
    strides = _element_strides(x)
    assert strides is not None, "as_input/check_output let through a layout the C API cannot take"
    if x.ndim == 3:
        size, strides = (1,) + tuple(x.shape), (0,) + strides
    else:
        size = tuple(x.shape)
    t = _lib.Tensor()
    t.data = data_ptr(x) if numel(x) else None  # NULL for a view with no element
    t.dtype = dtype_code("tensor", x)
    t.size[:] = [int(s) for s in size]
    t.stride[:] = [int(s) for s in strides]
    return t


def empty(shape: tuple[int, ...], like, float32: bool = False, uint8: bool = False):
    """An uninitialised array of q's kind, device and dtype (or float32, for lse; uint8 for the dropout mask)."""
    if is_numpy(like):
        dtype = np.float32 if float32 else np.uint8 if uint8 else like.dtype.newbyteorder("=")
        return np.empty(shape, dtype=dtype)
    t = _torch()
    return t.empty(shape, dtype=t.float32 if float32 else t.uint8 if uint8 else like.dtype, device=like.device)


def as_bool(x):
    """A uint8 array of 0 and 1 seen as bool, without a copy."""
    if is_numpy(x):
        return x.view(np.bool_)
    return x.view(_torch().bool)


def as_lse(x, shape: tuple[int, ...], like):
    """lse for backward: float32, exactly `shape`, q's kind and device; made contiguous if it is not (the
    C library reads it as a dense array through a bare pointer)."""
    if kind("lse", x) != kind("q", like):
        raise TypeError(f"flashc: lse is a {kind('lse', x)} array but q is a {kind('q', like)} array")
    if dtype_code("lse", x) != _lib.F32:
        raise TypeError(
            f"flashc: lse.dtype is {x.dtype}; it must be float32 (as attention(..., return_lse=True) returns it)"
        )
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"flashc: lse has shape {tuple(x.shape)}; expected {tuple(shape)} "
            "([batch, heads_q, seqlen_q], or [heads_q, total_q] for varlen)"
        )
    if device_of(x) != device_of(like):
        raise ValueError(f"flashc: lse is on {device_of(x)} but q is on {device_of(like)}")
    if is_numpy(x):
        return np.require(x, np.float32, ["C", "A"])  # contiguous and aligned: read through a bare pointer
    return x.contiguous()


def as_cu_seqlens(name: str, x) -> np.ndarray:
    """cu_seqlens as the host int32 array the C library reads: from a list, a numpy array or a torch tensor
    (on any device; a CUDA tensor is copied to the host, the C API takes host offsets)."""
    if x is None:
        raise TypeError(f"flashc: {name} is None; varlen attention needs both cu_seqlens arrays")
    require_numpy(f"{name} as a {type(x).__name__} (int32 torch tensors need no conversion)")
    if is_torch(x):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except Exception as e:  # ragged lists and other things numpy refuses
        raise TypeError(f"flashc: {name} is not an array of offsets: {e}") from None
    if a.dtype.kind not in "iu" and not (a.dtype.kind in "f" and a.size and np.all(a == np.round(a))):
        raise TypeError(f"flashc: {name} must hold integers, not {a.dtype}")
    if a.ndim != 1 or a.size < 2:
        raise ValueError(f"flashc: {name} has shape {a.shape}; it must be 1-d with num_seqs + 1 >= 2 offsets")
    if a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max:
        raise ValueError(f"flashc: {name} holds offsets outside int32")
    return np.require(a, np.int32, ["C", "A"])
