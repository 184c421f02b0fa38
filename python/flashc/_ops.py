"""flashc's attention as PyTorch operators: torch.ops.flashc.fwd and torch.ops.flashc.bwd.

    flashc::fwd(q, k, v, cu_seqlens_q?, cu_seqlens_k?, scale?, causal, window_left, window_right, top_left,
                backend, threads, deterministic, softcap=0.0, seqused_q?=None, seqused_k?=None,
                alibi_slopes?=None, attn_mask?=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0,
                num_splits=0) -> (out, lse)
    flashc::bwd(dout, q, k, v, out, lse, cu_seqlens_q?, cu_seqlens_k?, <the same options>) -> (dq, dk, dv)
    flashc::bwd_dbias(<bwd's arguments>, attn_mask) -> (dq, dk, dv, dbias)

Both are registered with torch.library.custom_op (torch >= 2.4): they mutate nothing, have fake (meta)
implementations that give the outputs' shapes, dtypes and layouts, and fwd has its autograd formula
registered on the operator (setup_context saves q, k, v, out, lse; the backward calls flashc::bwd, or
flashc::bwd_dbias when a float attn_mask needs its gradient: dbias in the mask's shape and dtype). So
torch.compile(fullgraph=True), torch.export (strict and non-strict), FakeTensorMode and meta tensors see one
opaque operator with known outputs, and the backward compiles into the same graph. lse is an output of fwd
that autograd treats as non-differentiable (FlashAttention's rule). With older torch the module still loads:
`HAVE_OPS` is False and flashc.torch falls back to an autograd.Function over the same kernels.

Options as the operators take them, already checked by flashc.torch: scale None = 1/sqrt(head_dim); softcap
0.0 = none; alibi_slopes None or float32 [heads_q] / [batch, heads_q] on q's device; window
sides -1 = unbounded; top_left False = FlashAttention's bottom-right causal diagonal; threads -1 = torch's
torch.get_num_threads() at the time of the call, 0 = every processor; backend "auto" or a backend name.
cu_seqlens_q/k (None for dense [b, s, h, d] tensors; int32 offsets for packed [total, h, d] ones): the C API
reads host (CPU) offsets in place; CUDA offsets beside CUDA tensors go to the kernels as they are
(flashc_params.cu_seqlens_device: no copy, no synchronisation, so a CUDA graph can capture the call), with
max_seqlen_q/k, the longest sequences (flash_attn_varlen_func's arguments; 0: not known, and then the packed
rows, a bound that is always right but sizes the grids for one sequence as long as the whole batch). CUDA
offsets beside CPU tensors are copied to the host. seqused_q/k (None, or int32 [num_seqs], varlen only) are read
on the host (refused with device offsets). out takes v's head dim, which may differ from q's.
attn_mask (None, or bool / float, broadcastable to [batch, heads_q, seqlen_q, seqlen_k] as for SDPA; dense only)
is passed through strides, 0 where it broadcasts (a float mask of another dtype than q's is converted).
dropout_p 0.0 = none; dropout_seed and dropout_offset key its mask (flashc.h; the seed as a signed int64, taken mod
2^64): bwd regenerates the mask from the same three, which autograd saves from fwd's inputs. num_splits (fwd only;
flashc_params.num_splits): 0 the backend chooses, 1 no split, n > 1 at most n key parts.

The kernels are the hot path of every torch call, so they do in Python only what the C library cannot:
ranks (the struct needs 4 sizes), the memory each tensor lives in (a CPU-only libflashc cannot tell a device
pointer from a host one) and a unit head_dim stride (copied if not). Everything else, shapes against each
other, one dtype, offsets, the mask, what a backend supports, is validated by libflashc, whose message comes
back in the exception. The structs are packed with struct.pack_into into one per-thread buffer and passed by
address through ctypes prototypes whose arguments are plain integers (the cheapest conversion ctypes has);
handles are cached per thread, backend, device and stream, and the thread count is set only when it changes.
"""

# torch.library.custom_op reads the operators' schemas from their annotations at run time, where Python 3.9
# has no `X | None`: keep typing.Optional there.
# ruff: noqa: UP045
from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from typing import Optional

import torch

from . import _api, _lib

HAVE_OPS = all(hasattr(torch.library, f) for f in ("custom_op", "register_fake", "register_autograd"))

# ---- the C calls ---------------------------------------------------------------------------------------
_vp, _i32 = ctypes.c_void_p, ctypes.c_int


def _proto(name, restype, *argtypes):
    # A prototype over the symbol of the library that _lib loaded: same code, own argtypes (addresses as
    # ints). CFUNCTYPE functions release the GIL during the call, as the CDLL ones do.
    return ctypes.CFUNCTYPE(restype, *argtypes)((name, _lib.lib))


_c_forward = _proto("flashc_forward", _i32, *[_vp] * 7)
_c_backward = _proto("flashc_backward", _i32, *[_vp] * 11)
_c_set_threads = _proto("flashc_set_threads", _i32, _vp, _i32)
_c_set_stream = _proto("flashc_set_stream", _i32, _vp, _vp)
_c_last_backend = _proto("flashc_handle_last_backend", ctypes.c_char_p, _vp)

# The fields of flashc_params that a call sets, and flashc_tensor, as struct formats (native alignment = the C
# compiler's), checked field by field against the ctypes mirrors of _lib (which tests/python/test_package.py
# checks against the header). Fields of flashc_params outside this run (struct_size, later ones) keep the
# values of _lib's defaults, copied once into each thread's buffer.
_PARAM_FIELDS = (("scale", "f"), ("causal", "i"), ("align", "i"), ("window_left", "q"), ("window_right", "q"),
                 ("cu_seqlens_q", "P"), ("cu_seqlens_k", "P"), ("num_seqs", "q"), ("deterministic", "i"),
                 ("softcap", "f"), ("alibi_slopes", "P"), ("alibi_stride_batch", "q"), ("seqused_q", "P"),
                 ("seqused_k", "P"), ("attn_mask", "P"), ("attn_mask_is_bool", "i"), ("attn_mask_stride", "4q"),
                 ("dbias", "P"), ("dbias_stride", "4q"), ("dropout_p", "f"), ("dropout_seed", "Q"),
                 ("dropout_offset", "Q"), ("dropout_mask", "P"))  # fmt: skip
_PARAMS = struct.Struct("@" + "".join(code for _, code in _PARAM_FIELDS))
_P_AT = _lib.Params.scale.offset  # where the run starts inside flashc_params
_NUM_SPLITS, _NUM_SPLITS_AT = struct.Struct("@i"), _lib.Params.num_splits.offset  # set apart from the run, every call
# cu_seqlens_device, max_seqlen_q, max_seqlen_k: likewise set on every call (0, 0, 0 for host offsets)
_DEVICE_CU, _DEVICE_CU_AT = struct.Struct("@i"), _lib.Params.cu_seqlens_device.offset
_MAX_SEQLEN, _MAX_SEQLEN_AT = struct.Struct("@qq"), _lib.Params.max_seqlen_q.offset
_TENSOR = struct.Struct("@Pi4q4q")


def _check_layouts() -> None:
    prefix = "@"
    for name, code in _PARAM_FIELDS:
        at = struct.calcsize(prefix + code) - struct.calcsize(code)
        if getattr(_lib.Params, name).offset - _P_AT != at:
            raise ImportError(f"flashc.torch: flashc_params.{name} is not where _ops.py packs it; update _PARAM_FIELDS")
        prefix += code
    if _lib.Params.max_seqlen_k.offset - _MAX_SEQLEN_AT != 8:
        raise ImportError("flashc.torch: flashc_params.max_seqlen_q/k are not where _ops.py packs them")
    if _TENSOR.size != ctypes.sizeof(_lib.Tensor) or _lib.Tensor.stride.offset != 48:
        raise ImportError("flashc.torch: flashc_tensor is not the layout _ops.py packs; update _TENSOR")


_check_layouts()
_P_BYTES = (ctypes.sizeof(_lib.Params) + 15) // 16 * 16
_T_BYTES = _TENSOR.size
_params_default = getattr(_lib, "params_default", None) or _lib.lib.flashc_params_default

_DTYPES = {torch.float32: _lib.F32, torch.float16: _lib.F16, torch.bfloat16: _lib.BF16, torch.float64: _lib.F64}


class _Handle:
    """One flashc_handle: its workspace is reused between calls; `threads` is the count last set on it."""

    __slots__ = ("ptr", "threads", "__weakref__")

    def __init__(self, backend: str, stream: int):
        h = _lib.Handle()
        _lib.check(_lib.lib.flashc_create(ctypes.byref(h), backend.encode()))
        self.ptr = h.value
        self.threads = None
        weakref.finalize(self, _lib.lib.flashc_destroy, h)  # at thread end, eviction or exit
        if stream:
            _lib.check(_c_set_stream(self.ptr, stream))


class _ThreadState(threading.local):
    def __init__(self):
        # params, then up to 8 tensors (the backward's q, k, v, o, dout, dq, dk, dv)
        self.buf = ctypes.create_string_buffer(_P_BYTES + 8 * _T_BYTES)
        self.base = ctypes.addressof(self.buf)
        defaults = _params_default()
        ctypes.memmove(self.base, ctypes.addressof(defaults), ctypes.sizeof(defaults))
        self.handles = {}


_tls = _ThreadState()
_MAX_HANDLES = 16  # per thread: streams come and go; each handle holds a workspace


def _handle(backend: str, index: int) -> _Handle:
    if index >= 0:
        # One handle per (device, stream): changing a handle's stream would order it after the old one's work.
        key = (backend, index, torch._C._cuda_getCurrentRawStream(index))
    else:
        key = (backend, -1, 0)
    handles = _tls.handles
    h = handles.get(key)
    if h is None:
        if index >= 0 and torch.cuda.is_current_stream_capturing():
            # A new handle allocates its device workspace on its first call, which a capture forbids.
            raise RuntimeError(
                "flashc: the first flashc call on a CUDA stream cannot be captured in a CUDA graph (it "
                "allocates the stream's workspace): run the function once on the capture stream before "
                "capturing, e.g. torch.cuda.graph(g, stream=s) after a warm-up under torch.cuda.stream(s)"
            )
        if len(handles) >= _MAX_HANDLES:
            handles.pop(next(iter(handles)))
        h = handles[key] = _Handle(backend, key[2])
    return h


_backend_ok = set()  # (backend, on_cuda) pairs that _api._check_backend accepted


def _check_backend(backend: str, on_cuda: bool) -> None:
    key = (backend, on_cuda)
    if key not in _backend_ok:
        _api._check_backend(backend, "cuda:0" if on_cuda else "cpu")
        _backend_ok.add(key)


def _readable(name: str, x: torch.Tensor, ndim: int) -> torch.Tensor:
    """x, or a copy with a unit head_dim stride (the one layout rule of the C API that a view can break)."""
    if x.dim() != ndim:
        _bad_rank(name, x, ndim)
    if x.stride(-1) != 1:
        return x.clone(memory_format=torch.contiguous_format)
    return x


def _bad_rank(name: str, x, ndim: int):
    layout = "[batch, seqlen, heads, head_dim]" if ndim == 4 else "[total_tokens, heads, head_dim]"
    raise ValueError(f"flashc: {name} has {x.dim()} dimensions {tuple(x.shape)}; expected {ndim}: {layout}")


def _host_offsets(name: str, cu: torch.Tensor) -> torch.Tensor:
    if cu.dtype != torch.int32 or cu.dim() != 1:
        raise TypeError(f"flashc: {name} must be a 1-d int32 tensor, not {cu.dtype} of shape {tuple(cu.shape)}")
    if not cu.is_cpu:
        cu = cu.to("cpu")  # the C API reads offsets on the host: a synchronising copy
    return cu.contiguous()


def _offsets_of(q, cu_q, cu_k, max_q: int, max_k: int, host_only: bool):
    """(cu_q, cu_k, cu_seqlens_device, max_seqlen_q, max_seqlen_k) for _run: CUDA offsets beside CUDA tensors as
    they are (the kernels read them on the device: nothing here may look at their values, which would wait for
    the stream), any others on the host, and all on the host for host_only (seqused, which the C API takes only
    with host offsets)."""
    if q.is_cuda and cu_q.is_cuda and cu_k.is_cuda and not host_only:
        for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
            if cu.dtype != torch.int32 or cu.dim() != 1:
                raise TypeError(f"flashc: {name} must be a 1-d int32 tensor, not {cu.dtype} of shape {tuple(cu.shape)}")
            if cu.device != q.device:
                raise ValueError(f"flashc: {name} is on {cu.device} but the tensors on {q.device}")
        for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
            if m < 0:
                raise ValueError(f"flashc: {name} is {m}; it must be the longest sequence (0: not known)")
        return cu_q.contiguous(), cu_k.contiguous(), 1, max_q or q.shape[0], max_k  # _run bounds max_k (k's rows)
    return _host_offsets("cu_seqlens_q", cu_q), _host_offsets("cu_seqlens_k", cu_k), 0, 0, 0


def _extras(q, cu_q, su_q, su_k, alibi) -> tuple:
    """(alibi pointer, alibi_stride_batch, seqused_q pointer, seqused_k pointer, tensors to keep alive) for _run:
    the slopes as float32 on q's device, the used lengths as host int32 of num_seqs."""
    packed = cu_q is not None
    keep = []
    ptrs = [0, 0, 0, 0]
    if alibi is not None:
        batch = cu_q.numel() - 1 if packed else q.shape[0]
        ptrs[1] = _api.check_alibi_shape(alibi.shape, q.shape[-2], batch)
        if alibi.dtype != torch.float32 or alibi.device != q.device or not alibi.is_contiguous():
            alibi = alibi.to(device=q.device, dtype=torch.float32).contiguous()
        keep.append(alibi)
        ptrs[0] = alibi.data_ptr()
    for i, (name, su) in enumerate((("seqused_q", su_q), ("seqused_k", su_k))):
        if su is None:
            continue
        if not packed:
            raise ValueError(f"flashc: {name} needs packed (varlen) tensors with cu_seqlens_q/k")
        su = _host_offsets(name, su)
        if su.numel() != cu_q.numel() - 1:
            raise ValueError(f"flashc: {name} has {su.numel()} lengths; it needs one per sequence ({cu_q.numel() - 1})")
        keep.append(su)
        ptrs[2 + i] = su.data_ptr()
    return (*ptrs, keep)


_NO_MASK = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)  # attn_mask, is_bool, its strides, dbias, its strides


def _mask_fields(q, k, packed: bool, mask, dbias4) -> tuple:
    """(the packed attn_mask and dbias fields, the mask tensor to keep alive) for _run. dbias4: None, or the 4-d
    tensor (the mask's shape with 1s prepended) that the gradient is written into, summed over the dims the mask
    broadcasts (stride 0)."""
    if mask is None:
        return _NO_MASK, None
    if packed:
        raise ValueError("flashc: attn_mask is not supported with packed (varlen) tensors; pad them to a batch")
    m, is_bool, strides = _api.attn_mask_view(mask, q, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    fields = [m.data_ptr() if m.numel() else 0, int(is_bool), *strides]
    if dbias4 is None:
        fields += [0, 0, 0, 0, 0]
    else:
        fields += [dbias4.data_ptr() if dbias4.numel() else 0]
        fields += [dbias4.stride(d) if dbias4.shape[d] > 1 else 0 for d in range(4)]
    return tuple(fields), m


def _run(backward: bool, ts, lse, cu_q, cu_k, scale, causal, wl, wr, top_left, backend, threads, det, softcap, su_q,
         su_k, alibi, mask=None, dbias4=None, dropout=(0.0, 0, 0), num_splits=0,
         max_seqlen=(0, 0)) -> None:  # fmt: skip
    """Describe the tensors `ts` ((q, k, v, o) or (q, k, v, o, dout, dq, dk, dv)) and call the C function."""
    q = ts[0]
    on_cuda = q.is_cuda
    if not on_cuda and not q.is_cpu:
        raise ValueError(f"flashc: tensors on device '{q.device}' are not supported (only cpu and cuda)")
    _check_backend(backend, on_cuda)
    buf, base = _tls.buf, _tls.base
    on_device = (0, 0, 0)
    if cu_q is not None and cu_k is not None:
        cu_q, cu_k, *on_device = _offsets_of(q, cu_q, cu_k, *max_seqlen, su_q is not None or su_k is not None)
        if on_device[0]:
            on_device[2] = on_device[2] or ts[1].shape[0]  # not known: the packed key rows
    extras = (0.0, 0, 0, 0, 0)
    if softcap or alibi is not None or su_q is not None or su_k is not None:
        al, al_stride, p_su_q, p_su_k, keep = _extras(q, cu_q, su_q, su_k, alibi)  # keep: alive until the call ends
        extras = (softcap, al, al_stride, p_su_q, p_su_k)
    mask_fields, mask = _mask_fields(q, ts[1], cu_q is not None or cu_k is not None, mask, dbias4)  # mask: kept
    extras += mask_fields
    if dropout[0]:
        extras += (dropout[0], dropout[1] % 2**64, dropout[2] % 2**64, 0)
    else:
        extras += (0.0, 0, 0, 0)
    if cu_q is not None or cu_k is not None:
        if cu_q is None or cu_k is None:
            raise TypeError("flashc: varlen needs both cu_seqlens_q and cu_seqlens_k")
        if cu_q.numel() != cu_k.numel() or cu_q.numel() < 2:
            raise ValueError(
                f"flashc: cu_seqlens_q has {cu_q.numel()} offsets and cu_seqlens_k {cu_k.numel()}; "
                "both need num_seqs + 1 >= 2"
            )
        _PARAMS.pack_into(
            buf,
            _P_AT,
            scale or 0.0,
            causal,
            top_left,
            wl,
            wr,
            cu_q.data_ptr(),
            cu_k.data_ptr(),
            cu_q.numel() - 1,
            det,
            *extras,
        )
        packed = True
    else:
        _PARAMS.pack_into(buf, _P_AT, scale or 0.0, causal, top_left, wl, wr, 0, 0, 0, det, *extras)
        packed = False
    _NUM_SPLITS.pack_into(buf, _NUM_SPLITS_AT, num_splits)
    _DEVICE_CU.pack_into(buf, _DEVICE_CU_AT, on_device[0])
    _MAX_SEQLEN.pack_into(buf, _MAX_SEQLEN_AT, on_device[1], on_device[2])
    off = _P_BYTES
    dtypes = _DTYPES
    index = q.get_device()  # -1 on the CPU
    for x in ts:
        code = dtypes.get(x.dtype)
        if code is None:
            raise TypeError(
                f"flashc: a tensor has dtype {x.dtype}; flashc takes float32, float16, bfloat16 and float64"
            )
        if x.get_device() != index or x.is_cpu == on_cuda:  # another CUDA device, or another device type
            raise ValueError(f"flashc: the tensors are on {x.device} and {q.device}; all must be on one device")
        if packed:
            _TENSOR.pack_into(buf, off, x.data_ptr(), code, 1, *x.shape, 0, *x.stride())
        else:
            _TENSOR.pack_into(buf, off, x.data_ptr(), code, *x.shape, *x.stride())
        off += _T_BYTES
    h = _handle(backend, index)
    n = threads if threads >= 0 else torch.get_num_threads()
    if n != h.threads:
        _lib.check(_c_set_threads(h.ptr, n))
        h.threads = n
    t = base + _P_BYTES
    if backward:
        args = (h.ptr, base, t, t + _T_BYTES, t + 2 * _T_BYTES, t + 3 * _T_BYTES, lse.data_ptr(),
                t + 4 * _T_BYTES, t + 5 * _T_BYTES, t + 6 * _T_BYTES, t + 7 * _T_BYTES)  # fmt: skip
        fn = _c_backward
    else:
        args = (h.ptr, base, t, t + _T_BYTES, t + 2 * _T_BYTES, t + 3 * _T_BYTES, lse.data_ptr())
        fn = _c_forward
    if on_cuda and torch._C._cuda_getDevice() != index:
        with torch.cuda.device(index):  # the C library works on the current device: the tensors'
            status = fn(*args)
    else:
        status = fn(*args)
    if status:
        raise _lib.error(status)
    _api._local.last_backend = backend if backend != "auto" else _c_last_backend(h.ptr).decode()


# ---- the kernels (what the operators run on real tensors) ----------------------------------------------
def _lse_shape(q: torch.Tensor, packed: bool):
    return (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])


def _out_shape(q: torch.Tensor, v: torch.Tensor):
    return (*q.shape[:-1], v.shape[-1])  # o takes V's head dim


def fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right, top_left, backend,
             threads, deterministic, softcap=0.0, seqused_q=None, seqused_k=None, alibi_slopes=None,
             attn_mask=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0, num_splits=0, max_seqlen_q=0,
             max_seqlen_k=0):  # fmt: skip
    nd = 4 if cu_seqlens_q is None else 3
    q, k, v = _readable("q", q, nd), _readable("k", k, nd), _readable("v", v, nd)
    out = q.new_empty(_out_shape(q, v))  # contiguous
    lse = torch.empty(_lse_shape(q, nd == 3), dtype=torch.float32, device=q.device)
    _run(False, (q, k, v, out), lse, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right,
         top_left, backend, threads, deterministic, softcap, seqused_q, seqused_k, alibi_slopes,
         mask=attn_mask, dropout=(dropout_p, dropout_seed, dropout_offset), num_splits=num_splits,
         max_seqlen=(max_seqlen_q, max_seqlen_k))  # fmt: skip
    return out, lse


def bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right,
             top_left, backend, threads, deterministic, softcap=0.0, seqused_q=None, seqused_k=None,
             alibi_slopes=None, attn_mask=None, want_dbias=False, dropout_p=0.0, dropout_seed=0,
             dropout_offset=0, max_seqlen_q=0, max_seqlen_k=0):  # fmt: skip
    """(dq, dk, dv), and dbias (the float attn_mask's gradient, in its shape and dtype) when want_dbias."""
    nd = 4 if cu_seqlens_q is None else 3
    q, k, v = _readable("q", q, nd), _readable("k", k, nd), _readable("v", v, nd)
    out, dout = _readable("out", out, nd), _readable("dout", dout, nd)
    if lse.dtype != torch.float32 or tuple(lse.shape) != _lse_shape(q, nd == 3) or lse.device != q.device:
        raise ValueError(
            f"flashc: lse is {lse.dtype} {tuple(lse.shape)} on {lse.device}; expected float32 "
            f"{_lse_shape(q, nd == 3)} on {q.device}, as the forward returns it"
        )
    lse = lse.contiguous()
    cf = torch.contiguous_format
    dq, dk, dv = (torch.empty_like(x, memory_format=cf) for x in (q, k, v))
    dbias4 = None
    if want_dbias:
        if attn_mask is None or not attn_mask.is_floating_point():
            raise ValueError("flashc: the gradient of attn_mask needs a float mask (a boolean one has none)")
        dbias4 = q.new_empty(_dbias4_shape(attn_mask))
    _run(True, (q, k, v, out, dout, dq, dk, dv), lse, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left,
         window_right, top_left, backend, threads, deterministic, softcap, seqused_q, seqused_k,
         alibi_slopes, mask=attn_mask, dbias4=dbias4, dropout=(dropout_p, dropout_seed, dropout_offset),
         max_seqlen=(max_seqlen_q, max_seqlen_k))  # fmt: skip
    if want_dbias:
        return dq, dk, dv, dbias4.view(attn_mask.shape).to(attn_mask.dtype)
    return dq, dk, dv


def _dbias4_shape(mask) -> tuple:
    """The mask's shape with 1s prepended to 4 dims (its gradient's, before the view back to the mask's shape)."""
    return (1,) * (4 - mask.dim()) + tuple(mask.shape)


def _same_dtype(*named) -> None:
    """SDPA's rule outside autocast: one dtype for q, k, v (checked where fake tensors see it too)."""
    (n0, x0), *rest = named
    for n, x in rest:
        if x.dtype != x0.dtype:
            raise TypeError(
                f"flashc: {n}.dtype is {x.dtype} but {n0}.dtype is {x0.dtype}; q, k and v share one dtype "
                "(cast them, or run under torch.autocast, which casts them as for scaled_dot_product_attention)"
            )


def check_double_backward() -> None:
    # The backward is a kernel with no derivative of its own. With create_graph=True autograd runs the
    # backward with grad mode on; a graph built from it would miss the second-order terms through the
    # kernel, so refuse instead of returning a silently wrong second derivative.
    if torch.is_grad_enabled():
        raise RuntimeError(
            "flashc: attention has no second derivative (double backward): its backward is a kernel that "
            "autograd cannot differentiate. Call backward/autograd.grad without create_graph=True, or use "
            "torch.nn.functional.scaled_dot_product_attention where a gradient of a gradient is needed"
        )


# ---- the operators -------------------------------------------------------------------------------------
if HAVE_OPS:
    from torch import Tensor

    @torch.library.custom_op("flashc::fwd", mutates_args=())
    def fwd(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor],
        scale: Optional[float],
        causal: bool,
        window_left: int,
        window_right: int,
        top_left: bool,
        backend: str,
        threads: int,
        deterministic: bool,
        softcap: float = 0.0,
        seqused_q: Optional[Tensor] = None,
        seqused_k: Optional[Tensor] = None,
        alibi_slopes: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        dropout_p: float = 0.0,
        dropout_seed: int = 0,
        dropout_offset: int = 0,
        num_splits: int = 0,
        max_seqlen_q: int = 0,
        max_seqlen_k: int = 0,
    ) -> tuple[Tensor, Tensor]:
        return fwd_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left, window_right, top_left,
                        backend, threads, deterministic, softcap, seqused_q, seqused_k, alibi_slopes,
                        attn_mask, dropout_p, dropout_seed, dropout_offset, num_splits, max_seqlen_q,
                        max_seqlen_k)  # fmt: skip

    @fwd.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, *_opts):
        _same_dtype(("q", q), ("k", k), ("v", v))
        packed = cu_seqlens_q is not None
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.dim() != (3 if packed else 4):
                _bad_rank(name, x, 3 if packed else 4)
        return q.new_empty(_out_shape(q, v)), q.new_empty(_lse_shape(q, packed), dtype=torch.float32)

    @torch.library.custom_op("flashc::bwd", mutates_args=())
    def bwd(
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor],
        scale: Optional[float],
        causal: bool,
        window_left: int,
        window_right: int,
        top_left: bool,
        backend: str,
        threads: int,
        deterministic: bool,
        softcap: float = 0.0,
        seqused_q: Optional[Tensor] = None,
        seqused_k: Optional[Tensor] = None,
        alibi_slopes: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        dropout_p: float = 0.0,
        dropout_seed: int = 0,
        dropout_offset: int = 0,
        max_seqlen_q: int = 0,
        max_seqlen_k: int = 0,
    ) -> tuple[Tensor, Tensor, Tensor]:
        return bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left,
                        window_right, top_left, backend, threads, deterministic, softcap, seqused_q, seqused_k,
                        alibi_slopes, attn_mask, False, dropout_p, dropout_seed, dropout_offset, max_seqlen_q,
                        max_seqlen_k)  # fmt: skip

    @bwd.register_fake
    def _(dout, q, k, v, out, lse, *_opts):
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    # bwd with the gradient of a float attn_mask as a fourth output (bwd keeps its three, for its callers).
    @torch.library.custom_op("flashc::bwd_dbias", mutates_args=())
    def bwd_dbias(
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor],
        scale: Optional[float],
        causal: bool,
        window_left: int,
        window_right: int,
        top_left: bool,
        backend: str,
        threads: int,
        deterministic: bool,
        softcap: float,
        seqused_q: Optional[Tensor],
        seqused_k: Optional[Tensor],
        alibi_slopes: Optional[Tensor],
        attn_mask: Tensor,
        dropout_p: float = 0.0,
        dropout_seed: int = 0,
        dropout_offset: int = 0,
        max_seqlen_q: int = 0,
        max_seqlen_k: int = 0,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return bwd_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale, causal, window_left,
                        window_right, top_left, backend, threads, deterministic, softcap, seqused_q, seqused_k,
                        alibi_slopes, attn_mask, True, dropout_p, dropout_seed, dropout_offset, max_seqlen_q,
                        max_seqlen_k)  # fmt: skip

    @bwd_dbias.register_fake
    def _(dout, q, k, v, out, lse, *opts):
        mask = opts[14]  # cu_seqlens_q/k, the 8 options, softcap, seqused_q/k, alibi_slopes, attn_mask
        return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), mask.new_empty(mask.shape)

    # scale ... deterministic; then softcap, seqused_q, seqused_k, alibi_slopes, attn_mask, dropout_p, dropout_seed,
    # dropout_offset, num_splits, max_seqlen_q, max_seqlen_k (defaults)
    _N_OPTS = 8
    _EXTRA_DEFAULTS = (0.0, None, None, None, None, 0.0, 0, 0, 0, 0, 0)  # ... dropout's three, num_splits, max_seqlen
    _MASK_AT = 5 + _N_OPTS + 4  # attn_mask's index among fwd's inputs

    def _setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, *rest = inputs
        opts, extra = tuple(rest[:_N_OPTS]), tuple(rest[_N_OPTS:])
        softcap, su_q, su_k, alibi, mask, *dropout, _num_splits, max_q, max_k = extra + _EXTRA_DEFAULTS[len(extra) :]
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask)
        ctx.opts = opts + (softcap,)
        ctx.dropout = tuple(dropout)  # the same mask again in the backward
        ctx.max_seqlen = (max_q, max_k) if max_q or max_k else ()  # given: the backward takes them too
        ctx.n_inputs = len(inputs)
        ctx.mark_non_differentiable(lse)

    def _backward(ctx, dout, _dlse):
        check_double_backward()
        q, k, v, out, lse, cu_q, cu_k, su_q, su_k, alibi, mask = ctx.saved_tensors
        if dout is None:  # only lse was used: it is not differentiable, so nothing flows
            return (None,) * ctx.n_inputs
        # without dropout (and max_seqlen), the schema as before they existed
        drop = ctx.dropout + ctx.max_seqlen if ctx.dropout[0] or ctx.max_seqlen else ()
        if mask is not None and ctx.n_inputs > _MASK_AT and ctx.needs_input_grad[_MASK_AT]:
            dq, dk, dv, dbias = bwd_dbias(
                dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts, su_q, su_k, alibi, mask, *drop
            )
            return (dq, dk, dv) + (None,) * (_MASK_AT - 3) + (dbias,) + (None,) * (ctx.n_inputs - _MASK_AT - 1)
        dq, dk, dv = bwd(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.opts, su_q, su_k, alibi, mask, *drop)
        return (dq, dk, dv) + (None,) * (ctx.n_inputs - 3)

    fwd.register_autograd(_backward, setup_context=_setup_context)
else:  # torch < 2.4: no operators; flashc.torch uses its autograd.Function
    fwd = bwd = bwd_dbias = None
