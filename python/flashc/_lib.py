"""ctypes declarations of include/flashc.h, the loading of libflashc, and statuses turned into exceptions.

Everything that knows the C ABI lives here: the structs mirror the header field by field (tests/python/
test_abi.py compiles a C program that prints the header's sizes and offsets and compares them with these),
and every function gets its argtypes/restype so that ctypes converts and checks each argument.

The library is found, in order: the path in the environment variable FLASHC_LIBRARY; the libflashc.so that
`pip install ./python` put inside this package (flashc/lib/).
"""

from __future__ import annotations

import ctypes
import os
import pathlib

# ---- enums (flashc.h) ----------------------------------------------------------------------------------
OK, ERR_INVALID_ARGUMENT, ERR_UNSUPPORTED, ERR_OUT_OF_MEMORY, ERR_CUDA, ERR_COMMUNICATION, ERR_INTERNAL = range(7)
F32, F16, BF16, F64 = range(4)
ALIGN_BOTTOM_RIGHT, ALIGN_TOP_LEFT = 0, 1
DEVICE_CPU, DEVICE_CUDA = 0, 1

DTYPE_NAMES = {F32: "f32", F16: "f16", BF16: "bf16", F64: "f64"}
DTYPE_SIZES = {F32: 4, F16: 2, BF16: 2, F64: 8}


class Tensor(ctypes.Structure):
    """flashc_tensor: a 4-d view [batch, seqlen, heads, head_dim]; strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("size", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),
    ]


class Params(ctypes.Structure):
    """flashc_params."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),  # sizeof(flashc_params) as this module knows it
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int),
        ("align", ctypes.c_int),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
        ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
        ("num_seqs", ctypes.c_int64),
        ("deterministic", ctypes.c_int),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
        ("alibi_stride_batch", ctypes.c_int64),
        ("seqused_q", ctypes.POINTER(ctypes.c_int32)),
        ("seqused_k", ctypes.POINTER(ctypes.c_int32)),
        ("attn_mask", ctypes.c_void_p),
        ("attn_mask_is_bool", ctypes.c_int),
        ("attn_mask_stride", ctypes.c_int64 * 4),
        ("dbias", ctypes.c_void_p),
        ("dbias_stride", ctypes.c_int64 * 4),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("dropout_mask", ctypes.c_void_p),
        ("num_splits", ctypes.c_int),
        ("cu_seqlens_device", ctypes.c_int),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
    ]


class BackendInfo(ctypes.Structure):
    """flashc_backend_info."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),  # sizeof(flashc_backend_info) as this module knows it
        ("name", ctypes.c_char_p),
        ("summary", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("has_backward", ctypes.c_int),
        ("dtypes", ctypes.c_uint),
        ("min_head_dim", ctypes.c_int),
        ("max_head_dim", ctypes.c_int),
        ("usable", ctypes.c_int),
        ("why_unusable", ctypes.c_char_p),
    ]


def params_default() -> Params:
    """flashc_params_default() of the header (an inline function there, so not in the library)."""
    return Params(struct_size=ctypes.sizeof(Params), align=ALIGN_BOTTOM_RIGHT, window_left=-1, window_right=-1)


def backend_info() -> BackendInfo:
    """An empty flashc_backend_info for flashc_backend_query, its struct_size set."""
    return BackendInfo(struct_size=ctypes.sizeof(BackendInfo))


Handle = ctypes.c_void_p
_P = ctypes.POINTER


def _declare(lib: ctypes.CDLL) -> None:
    """argtypes/restype of every function we call: ctypes then refuses a wrong argument instead of
    passing garbage."""
    status = ctypes.c_int
    sigs = {
        "flashc_version": (ctypes.c_int, []),
        "flashc_version_string": (ctypes.c_char_p, []),
        "flashc_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "flashc_last_error": (ctypes.c_char_p, []),
        "flashc_backend_count": (ctypes.c_int, []),
        "flashc_backend_query": (status, [ctypes.c_int, _P(BackendInfo)]),
        "flashc_create": (status, [_P(Handle), ctypes.c_char_p]),
        "flashc_destroy": (status, [Handle]),
        "flashc_set_threads": (status, [Handle, ctypes.c_int]),
        "flashc_set_stream": (status, [Handle, ctypes.c_void_p]),
        "flashc_handle_backend": (ctypes.c_char_p, [Handle]),
        "flashc_handle_last_backend": (ctypes.c_char_p, [Handle]),
        "flashc_forward": (
            status,
            [Handle, _P(Params), _P(Tensor), _P(Tensor), _P(Tensor), _P(Tensor), _P(ctypes.c_float)],
        ),
        "flashc_backward": (
            status,
            [
                Handle,
                _P(Params),
                _P(Tensor),
                _P(Tensor),
                _P(Tensor),
                _P(Tensor),
                _P(ctypes.c_float),
                _P(Tensor),
                _P(Tensor),
                _P(Tensor),
                _P(Tensor),
            ],
        ),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _candidates() -> list[pathlib.Path]:
    env = os.environ.get("FLASHC_LIBRARY")
    if env:
        return [pathlib.Path(env)]
    here = pathlib.Path(__file__).resolve().parent
    return [here / "lib" / "libflashc.so", here / "lib64" / "libflashc.so"]


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for path in _candidates():
        if not path.is_file():
            tried.append(f"{path} (no such file)")
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            tried.append(f"{path} ({e})")
            continue
        _declare(lib)
        return lib, str(path)
    hint = (
        "FLASHC_LIBRARY names a library that cannot be loaded"
        if os.environ.get("FLASHC_LIBRARY")
        else "install the package with `pip install ./python` (it builds the library), or set FLASHC_LIBRARY "
        "to the path of a libflashc.so built with CMake"
    )
    raise ImportError("flashc: cannot load libflashc: " + "; ".join(tried) + f". {hint}")


lib, path = _load()

# The header this file mirrors is version 0.x: a library of another major version has another ABI.
HEADER_MAJOR = 0
if lib.flashc_version() // 1_000_000 != HEADER_MAJOR:
    raise ImportError(
        f"flashc: {path} is libflashc {lib.flashc_version_string().decode()}, but this package "
        f"was written for major version {HEADER_MAJOR}"
    )


# ---- errors --------------------------------------------------------------------------------------------
class Error(Exception):
    """Base of every exception that carries a libflashc status. `status` is the number, `status_name` the
    library's words for it ("invalid argument"). Each subclass is also the built-in exception a Python
    caller expects, so `except ValueError` works as well as `except flashc.Error`."""

    status = ERR_INTERNAL
    status_name = ""


class InvalidArgumentError(Error, ValueError):
    """FLASHC_ERR_INVALID_ARGUMENT: the caller's input is wrong."""

    status, status_name = ERR_INVALID_ARGUMENT, "invalid argument"


class UnsupportedError(Error, NotImplementedError):
    """FLASHC_ERR_UNSUPPORTED: valid, but this backend or build cannot do it."""

    status, status_name = ERR_UNSUPPORTED, "unsupported"


class OutOfMemoryError(Error, MemoryError):
    """FLASHC_ERR_OUT_OF_MEMORY: a host or device allocation failed."""

    status, status_name = ERR_OUT_OF_MEMORY, "out of memory"


class RuntimeFailure(Error, RuntimeError):
    """FLASHC_ERR_CUDA, _COMMUNICATION, _INTERNAL: the call was right, running it failed."""


_CLASSES = {
    ERR_INVALID_ARGUMENT: InvalidArgumentError,
    ERR_UNSUPPORTED: UnsupportedError,
    ERR_OUT_OF_MEMORY: OutOfMemoryError,
}


for _cls in (Error, InvalidArgumentError, UnsupportedError, OutOfMemoryError, RuntimeFailure):
    _cls.__module__ = "flashc"  # shown as flashc.InvalidArgumentError, where users import it from


def error(status: int) -> Error:
    """The exception for a non-OK status, carrying the C library's message for this thread."""
    name = (lib.flashc_status_string(status) or b"").decode()
    message = (lib.flashc_last_error() or b"").decode("utf-8", "replace") or name
    exc = _CLASSES.get(status, RuntimeFailure)(message)
    exc.status = status
    exc.status_name = name
    return exc


def check(status: int) -> None:
    if status != OK:
        raise error(status)
