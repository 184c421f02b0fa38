"""Attention over a KV cache (decoding), as FlashAttention's flash_attn_with_kvcache: flashc_forward_kvcache.

    o = flashc.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                      block_table=table, causal=True)

q [batch, seqlen_q, heads_q, head_dim] (the new rows: 1 when decoding, a few for speculative decoding) attends
over each sequence's cached keys, after k/v [batch, seqlen_new, heads_kv, head_dim] were written into the cache
in place at rows cache_seqlens[b] ... The cache is dense, k_cache/v_cache [batch, capacity, heads_kv, head_dim],
or paged, [num_blocks, page_size, heads_kv, head_dim] with block_table [batch, max_blocks] (int32) naming the
blocks of each sequence. numpy arrays and torch tensors, on the CPU or (f16, bf16) on a CUDA device, where
cache_seqlens and block_table live on the device too: the call then waits for nothing on the host and can be captured
in a CUDA graph (after one call outside the capture on the same stream); device tables the host cannot check make
the sequences they break come out NaN instead of raising.

For torch the call is the operator torch.ops.flashc.fwd_kvcache, registered with torch.library.custom_op as
mutating k_cache and v_cache, with a fake implementation, so torch.compile and FakeTensorMode see one opaque
operator whose outputs they know. It is registered when this module is imported with torch already imported,
else at the first call on torch tensors. It has no gradient (inference). In plain eager mode a call runs through
the C++ extension's flashc_ext::kvcache instead where it is built (flashc/_torch_fast.py: the operator's Python
layers cost ~300 us a call on the CPU), with the same results and errors.

The C struct flashc_kvcache is mirrored here (KVCache); its size is checked against the library's own at the
first call (the library names its size when refusing a struct_size larger than it).
"""

# torch.library.custom_op reads the operator's schema from its annotations, evaluated where the operator is defined
# (inside torch_op, where Tensor is imported): no `from __future__ import annotations` here, and typing.Optional
# because Python 3.9 has no `X | None`.
# ruff: noqa: UP045
import ctypes
import numbers
import sys
from typing import Optional

from . import _api, _arrays, _lib
from ._arrays import np  # None without numpy: reached by numpy arrays only


class KVCache(ctypes.Structure):
    """flashc_kvcache (flashc.h)."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("k_cache", _lib.Tensor),
        ("v_cache", _lib.Tensor),
        ("block_table", ctypes.POINTER(ctypes.c_int32)),
        ("max_blocks_per_seq", ctypes.c_int64),
        ("block_table_stride", ctypes.c_int64),
        ("cache_seqlens", ctypes.POINTER(ctypes.c_int32)),
        ("k_new", ctypes.POINTER(_lib.Tensor)),
        ("v_new", ctypes.POINTER(_lib.Tensor)),
        ("num_splits", ctypes.c_int),
    ]


# A library older than this module (FLASHC_LIBRARY) lacks the function: `import flashc` still works, the call says why.
_fn = getattr(_lib.lib, "flashc_forward_kvcache", None)
if _fn is not None:
    _fn.restype = ctypes.c_int
    _fn.argtypes = [
        _lib.Handle,
        ctypes.POINTER(_lib.Tensor),
        ctypes.POINTER(KVCache),
        ctypes.POINTER(_lib.Tensor),
        ctypes.POINTER(ctypes.c_float),
        ctypes.POINTER(_lib.Params),
    ]


# ---- checks shared by numpy and torch ------------------------------------------------------------------------
def _int_array_ptr(name: str, x, ndim: int, device: str):
    """(pointer, row stride) of an int32 array the C library reads through a bare pointer: cache_seqlens [batch]
    or block_table [batch, max_blocks], where the tensors are. Its size is checked here (the library cannot see
    it), and its device: a library without CUDA would read a device pointer as host memory."""
    if not _arrays.is_numpy(x) and not _arrays.is_torch(x):
        raise TypeError(f"flashc: {name} must be an int32 numpy array or torch tensor, not {type(x).__name__}")
    if _arrays.device_of(x) != device:
        raise ValueError(f"flashc: {name} is on {_arrays.device_of(x)} but q is on {device}; they live together")
    if _arrays.is_torch(x):
        import torch

        if x.dtype != torch.int32:
            raise TypeError(f"flashc: {name} must be int32, not {x.dtype}")
        strides = x.stride()
    else:
        if x.dtype != np.int32 or not x.dtype.isnative:
            raise TypeError(f"flashc: {name} must be an int32 numpy array or torch tensor, not {_what(x)}")
        if not x.flags.aligned:
            raise ValueError(f"flashc: {name} is not aligned to 4 bytes")
        strides = tuple(s // 4 for s in x.strides)
    if x.ndim != ndim:
        shape = "[batch]" if ndim == 1 else "[batch, max_blocks]"
        raise ValueError(f"flashc: {name} has shape {tuple(x.shape)}; expected {shape}")
    if x.shape[-1] > 1 and strides[-1] != 1 or any(s < 0 for s in strides):
        raise ValueError(f"flashc: {name} has strides {tuple(strides)}; its last stride must be 1")
    ptr = ctypes.cast(_arrays.data_ptr(x), ctypes.POINTER(ctypes.c_int32)) if _arrays.numel(x) else None
    return ptr, (int(strides[0]) if ndim == 2 else 0)


def _what(x) -> str:
    return f"{type(x).__name__} {getattr(x, 'dtype', '')}".strip()


def _cache_tensor(name: str, x, written: bool) -> _lib.Tensor:
    """A cache as it is: a copy would not be written back (and would copy the whole cache at every step)."""
    _arrays.kind(name, x)
    _arrays.dtype_code(name, x)
    if x.ndim != 4:
        raise ValueError(
            f"flashc: {name} has {x.ndim} dimensions {tuple(x.shape)}; expected 4: [batch, capacity, heads_kv, "
            "head_dim] or [num_blocks, page_size, heads_kv, head_dim]"
        )
    if written and _arrays.is_numpy(x) and not x.flags.writeable:
        raise ValueError(f"flashc: {name} is read-only, but k/v are appended into it")
    if _arrays.numel(x) and _arrays._element_strides(x) is None:
        raise ValueError(
            f"flashc: {name} has strides {tuple(_arrays._raw_strides(x))} that flashc cannot read in place (the last "
            "stride must be 1, none negative, elements aligned); the cache is used where it is, never copied"
        )
    return _arrays.describe(x)


def _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, params, backend, threads, num_splits, out, lse):
    """Describe everything and call flashc_forward_kvcache on q's device (the arrays already checked by kind)."""
    if _fn is None:
        raise NotImplementedError(f"flashc: {_lib.path} has no flashc_forward_kvcache (an older libflashc)")
    device = _arrays.device_of(q)
    tensors = [_arrays.describe(q), _cache_tensor("k_cache", k_cache, k is not None)]
    tensors.append(_cache_tensor("v_cache", v_cache, k is not None))
    c = KVCache(struct_size=ctypes.sizeof(KVCache), k_cache=tensors[1], v_cache=tensors[2])
    keep = []
    if k is not None or v is not None:
        if k is None or v is None:
            raise TypeError("flashc: k and v (the new keys and values) are given together or not at all")
        kn, vn = _arrays.describe(k), _arrays.describe(v)
        keep += [kn, vn]
        c.k_new, c.v_new = ctypes.pointer(kn), ctypes.pointer(vn)
    if cache_seqlens is not None:
        c.cache_seqlens, _ = _int_array_ptr("cache_seqlens", cache_seqlens, 1, device)
        if cache_seqlens.shape[0] != q.shape[0]:
            raise ValueError(f"flashc: cache_seqlens has {cache_seqlens.shape[0]} lengths for a batch of {q.shape[0]}")
    if block_table is not None:
        c.block_table, stride = _int_array_ptr("block_table", block_table, 2, device)
        if block_table.shape[0] != q.shape[0]:
            raise ValueError(f"flashc: block_table has {block_table.shape[0]} rows for a batch of {q.shape[0]}")
        c.max_blocks_per_seq, c.block_table_stride = int(block_table.shape[1]), stride
    if not 0 <= int(num_splits) < 2**31:
        raise ValueError(f"flashc: num_splits is {num_splits}; use 0 (the plan chooses) or a positive count")
    c.num_splits = int(num_splits)
    o_t = _arrays.describe(out)
    lse_ptr = None
    if lse is not None and _arrays.numel(lse):
        lse_ptr = ctypes.cast(_arrays.data_ptr(lse), ctypes.POINTER(ctypes.c_float))
    lib = _lib.lib

    def call(h):
        _lib.check(lib.flashc_set_threads(h.ptr, threads))
        return _fn(h.ptr, ctypes.byref(tensors[0]), ctypes.byref(c), ctypes.byref(o_t), lse_ptr, ctypes.byref(params))

    if device.startswith("cuda"):
        import torch

        from . import _ops

        index = torch.device(device).index
        with torch.cuda.device(index):  # the C library works on the current device: the tensors'
            # flashc.torch's handle of this thread, device and current stream: a capture on a stream flashc has not
            # run on gets its clear error instead of an invalidated capture (another stream's handle would order it
            # after that stream's work, which a capture cannot wait for).
            h = _ops._handle(backend, index)
            status = call(h)
    else:
        h = _api._handle(backend)
        _lib.check(lib.flashc_set_stream(h.ptr, None))
        status = call(h)
    _lib.check(status)
    _api._local.last_backend = lib.flashc_handle_last_backend(h.ptr).decode()


def _check_out(name: str, x, shape: tuple, like, float32: bool = False) -> None:
    """out= and lse= as the call writes them: q's kind and device, the output's shape and dtype, written in place."""
    _arrays.kind(name, x)
    if _arrays.is_torch(x) != _arrays.is_torch(like) or _arrays.device_of(x) != _arrays.device_of(like):
        raise ValueError(f"flashc: {name} is on {_arrays.device_of(x)} but q is on {_arrays.device_of(like)}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"flashc: {name} has shape {tuple(x.shape)}; the call writes {tuple(shape)}")
    if _arrays.is_torch(like):  # the dtype written, found without allocating (out= serves loops that allocate nothing)
        want = _arrays._torch().float32 if float32 else like.dtype
    else:
        want = np.dtype(np.float32) if float32 else like.dtype.newbyteorder("=")
    if x.dtype != want:
        raise TypeError(f"flashc: {name}.dtype is {x.dtype}; the call writes {want}")
    if _arrays.is_numpy(x) and not x.flags.writeable:
        raise ValueError(f"flashc: {name} is read-only")
    if _arrays._element_strides(x) is None:  # written where it is: a copy would not be seen by the caller
        raise ValueError(
            f"flashc: {name} has strides {tuple(_arrays._raw_strides(x))} that flashc cannot write through (the "
            "last stride must be 1, none negative, elements aligned); pass a contiguous array"
        )


def _forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal, window_left, window_right,
             backend, threads, num_splits, out=None, lse=None, want_lse=True):  # fmt: skip
    """Runs the call into out and lse (allocated where None: lse only if want_lse); for numpy arrays and (inside
    the operators) torch tensors. Returns (out, lse)."""
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if k is not None:
        named["k"] = k
    if v is not None:
        named["v"] = v
    device = _api._same_kind_and_device(named)
    q = _arrays.as_input("q", q, 4)
    k = None if k is None else _arrays.as_input("k", k, 4)
    v = None if v is None else _arrays.as_input("v", v, 4)
    backend, threads = _api._check_backend(backend, device), _api._check_threads(threads)
    params = _api._params(causal, (window_left, window_right), scale, "bottom-right", False)
    lse_shape = (q.shape[0], q.shape[2], q.shape[1])
    if out is None:
        out = _arrays.empty(tuple(q.shape), q)
    else:
        _check_out("out", out, tuple(q.shape), q)
    if lse is not None:
        _check_out("lse", lse, lse_shape, q, float32=True)
    elif want_lse:
        lse = _arrays.empty(lse_shape, q, float32=True)
    _run(q, k_cache, v_cache, k, v, cache_seqlens, block_table, params, backend, threads, num_splits, out, lse)
    return out, lse


def _seqlens(cache_seqlens, q, like):
    """An int (flash_attn's shorthand: every sequence) as an int32 array of q's kind, on the cache's device."""
    if cache_seqlens is None or not isinstance(cache_seqlens, numbers.Integral) or isinstance(cache_seqlens, bool):
        return cache_seqlens
    if not -(2**31) <= int(cache_seqlens) < 2**31:
        raise ValueError(f"flashc: cache_seqlens {cache_seqlens} does not fit in int32")
    if _arrays.is_torch(q):
        import torch

        return torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32, device=like.device)
    return np.full(q.shape[0], int(cache_seqlens), dtype=np.int32)


# attention_with_kvcache's short path for torch tensors: _torch_fast.kvcache, False where the extension is not
# loaded, None until the first call on a torch tensor (numpy users never import torch through flashc).
_fast = None


def _fast_path(q):
    global _fast
    if not _arrays.is_torch(q):
        return None
    from . import _torch_fast

    try:  # the operators exist after a first call on torch tensors, whichever path runs it (torch.compile needs them)
        torch_op()
        torch_op_out()
    except NotImplementedError:  # a torch without custom_op: the Python path says so
        pass
    _fast = _torch_fast.kvcache or False
    return _fast


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    cache_seqlens=None,
    block_table=None,
    causal=False,
    window=None,
    scale=None,
    return_lse=False,
    *,
    backend="auto",
    threads=None,
    num_splits=0,
    out=None,
):
    """Attention of q over a KV cache, after appending k/v into it in place (flash_attn_with_kvcache's meaning).

    q: [batch, seqlen_q, heads_q, head_dim]. k_cache, v_cache: dense [batch, capacity, heads_kv, head_dim], or
      paged [num_blocks, page_size, heads_kv, head_dim] with block_table. Used in place, never copied: with k/v
      they are written (rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of sequence b).
    k, v: None, or the new keys and values [batch, seqlen_new, heads_kv, head_dim].
    cache_seqlens: int32 [batch] (numpy, or a torch tensor where the cache is), or an int for every sequence:
      the keys in each cache before this call. None: every cache is full.
    block_table: None (dense), or int32 [batch, max_blocks]: block b's j-th key is row j % page_size of block
      block_table[b, j // page_size]. Entries past a sequence's length are not read.
    causal: bottom-right within each sequence (query row i sees keys j <= i + len - seqlen_q, len =
      cache_seqlens[b] + seqlen_new). window: (left, right) around that diagonal. scale: None = 1/sqrt(head_dim).
    return_lse: also return lse, float32 [batch, heads_q, seqlen_q].
    backend, threads: as flashc.attention. num_splits: key splits (0: the backend chooses).
    out: None, or an array/tensor [batch, seqlen_q, heads_q, head_dim] of q's dtype and device that the output is
      written into and returned (no allocation for it: a decoding loop, or a CUDA graph, reuses one buffer).

    Bad lengths or block indices raise ValueError naming them, before anything is written.
    """
    cache_seqlens = _seqlens(cache_seqlens, q, k_cache)
    # A plain eager call on torch tensors, in a few C++ calls where the C++ extension is built (_torch_fast.kvcache:
    # flashc_ext::kvcache); None from it means this is not such a call, or it was refused: the Python path below
    # then runs it, with its result or its error.
    fast = _fast if _fast is not None else _fast_path(q)
    if fast:
        done = fast(q, k_cache, v_cache, k, v, cache_seqlens, block_table, causal, window, scale, return_lse, backend,
                    threads, num_splits, out)  # fmt: skip
        if done is not None:
            return done
    scale, causal, wl, wr, _, _ = _api.check_options(causal, window, scale, "bottom-right", False)
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
        raise TypeError(f"flashc: num_splits must be an int, not {num_splits!r}")
    if _arrays.is_torch(q):
        threads = -1 if threads is None else _api._check_threads(threads)
        opts = (scale, causal, wl, wr, backend, threads, int(num_splits))
        if out is None:
            o, lse = torch_op()(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *opts)
        else:
            _arrays.kind("out", out)
            _check_out("out", out, tuple(q.shape), q)
            lse = _arrays.empty((q.shape[0], q.shape[2], q.shape[1]), q, float32=True) if return_lse else None
            torch_op_out()(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, *opts)
            o = out
    else:
        o, lse = _forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal, wl, wr, backend,
                          threads, int(num_splits), out=out, want_lse=return_lse)  # fmt: skip
    return (o, lse) if return_lse else o


# ---- the torch operator ----------------------------------------------------------------------------------------
_op = None


def torch_op():
    """torch.ops.flashc.fwd_kvcache, registered at the first need (torch >= 2.4)."""
    global _op
    if _op is not None:
        return _op
    import torch

    if not all(hasattr(torch.library, f) for f in ("custom_op", "register_fake")):
        raise NotImplementedError(f"flashc: attention_with_kvcache needs torch >= 2.4 (torch.library.custom_op), "
                                  f"not {torch.__version__}")  # fmt: skip
    from torch import Tensor

    @torch.library.custom_op("flashc::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
    def fwd_kvcache(
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        k: Optional[Tensor],
        v: Optional[Tensor],
        cache_seqlens: Optional[Tensor],
        block_table: Optional[Tensor],
        scale: Optional[float],
        causal: bool,
        window_left: int,
        window_right: int,
        backend: str,
        threads: int,
        num_splits: int,
    ) -> tuple[Tensor, Tensor]:
        n = threads if threads >= 0 else torch.get_num_threads()
        return _forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal, window_left,
                        window_right, backend, n, num_splits)  # fmt: skip

    @fwd_kvcache.register_fake
    def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, *_opts):
        for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
            if x is not None and x.dim() != 4:
                raise ValueError(f"flashc: {name} has {x.dim()} dimensions {tuple(x.shape)}; expected 4")
        for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
            if x is not None and x.dtype != q.dtype:
                raise TypeError(f"flashc: {name}.dtype is {x.dtype} but q.dtype is {q.dtype}; one dtype for all")
        b, sq, hq, _d = q.shape
        return q.new_empty(q.shape), q.new_empty((b, hq, sq), dtype=torch.float32)

    _op = fwd_kvcache
    return _op


_op_out = None


def torch_op_out():
    """torch.ops.flashc.fwd_kvcache_out: the call with out= (and lse, when wanted) written in place, so that a
    decoding step allocates nothing (torch >= 2.4; registered with torch_op)."""
    global _op_out
    if _op_out is not None:
        return _op_out
    import torch

    torch_op()  # the version check, and the functional operator beside this one
    from torch import Tensor

    @torch.library.custom_op("flashc::fwd_kvcache_out", mutates_args=("k_cache", "v_cache", "out", "lse"))
    def fwd_kvcache_out(
        q: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        k: Optional[Tensor],
        v: Optional[Tensor],
        cache_seqlens: Optional[Tensor],
        block_table: Optional[Tensor],
        out: Tensor,
        lse: Optional[Tensor],
        scale: Optional[float],
        causal: bool,
        window_left: int,
        window_right: int,
        backend: str,
        threads: int,
        num_splits: int,
    ) -> None:
        n = threads if threads >= 0 else torch.get_num_threads()
        _forward(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, causal, window_left, window_right,
                 backend, n, num_splits, out=out, lse=lse, want_lse=False)  # fmt: skip

    @fwd_kvcache_out.register_fake
    def _(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, *_opts):
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(
                f"flashc: out is {tuple(out.shape)} {out.dtype}; the call writes {tuple(q.shape)} {q.dtype}"
            )

    _op_out = fwd_kvcache_out
    return _op_out


if "torch" in sys.modules:  # registered now, so that torch.compile finds the operators before it traces a call
    try:
        torch_op()
        torch_op_out()
    except NotImplementedError:
        pass
