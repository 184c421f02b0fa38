"""Every bad input raises the right exception with the C library's message, and nothing crashes."""

import numpy as np
import pytest

import flashc

from conftest import BACKENDS, need_backend, randn


@pytest.fixture
def qkv(rng, cpu_ref):
    return tuple(randn(rng, (1, 16, 2, 8)) for _ in range(3))


def raises(exc, match, fn, *args, **kwargs):
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    return info.value


# ---- caught in Python: things ctypes would pass as garbage -------------------------------------------------
@pytest.mark.parametrize(
    "bad,match",
    [
        (None, "numpy.ndarray or a torch.Tensor, not NoneType"),
        ([[1.0]], "not list"),
        (3.0, "not float"),
        (np.zeros((1, 16, 2, 8), dtype=np.int32), "int32"),
        (np.zeros((1, 16, 2, 8), dtype=np.complex64), "complex64"),
    ],
)
def test_non_arrays_and_wrong_dtypes_are_type_errors(qkv, bad, match):
    q, k, v = qkv
    raises(TypeError, match, flashc.attention, bad, k, v)
    raises(TypeError, match, flashc.attention, q, k, bad)


def test_wrong_rank(qkv):
    q, k, v = qkv
    raises(ValueError, "q has 3 dimensions", flashc.attention, q[0], k, v)
    raises(ValueError, "k has 4 dimensions", flashc.attention_varlen, q[0], k, v[0], [0, 16], [0, 16])


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(backend=3), TypeError, "backend must be a str"),
        (dict(backend="nope"), ValueError, "unknown backend 'nope'"),
        (dict(causal="yes"), TypeError, "causal must be a bool"),
        (dict(window=5), TypeError, "window must be None or"),
        (dict(window=(1,)), TypeError, "window must be None or"),
        (dict(window=(1.5, 2)), TypeError, "window left must be an int"),
        (dict(scale=0.0), ValueError, "non-zero"),
        (dict(scale=float("nan")), ValueError, "finite"),
        (dict(scale=1e300), ValueError, "float32 range"),
        (dict(scale="x"), TypeError, "scale must be a float"),
        (dict(causal_align="middle"), ValueError, "causal_align"),
        (dict(threads=-1), ValueError, "threads is -1"),
        (dict(threads=1.5), TypeError, "threads must be an int"),
        (dict(deterministic=None), TypeError, "deterministic must be a bool"),
        (dict(num_splits=-1), ValueError, "num_splits is -1"),
        (dict(num_splits=2**31), ValueError, "num_splits is 2147483648"),
        (dict(num_splits=1.0), TypeError, "num_splits must be an int"),
        (dict(num_splits=True), TypeError, "num_splits must be an int"),
    ],
)
def test_bad_options(qkv, kwargs, exc, match):
    raises(exc, match, flashc.attention, *qkv, **kwargs)


def test_num_splits_is_ignored_where_nothing_splits(qkv):
    """A backend that does not split keys (cpu) ignores num_splits: the same bits as the default."""
    out = flashc.attention(*qkv, causal=True, backend="cpu")
    for n in (1, 3, 64):
        assert np.array_equal(flashc.attention(*qkv, causal=True, backend="cpu", num_splits=n), out)


# ---- caught by the C library: the exception carries its message -------------------------------------------
def test_shape_mismatches_carry_the_c_message(rng, qkv):
    q, k, v = qkv
    e = raises(ValueError, r"^flashc_forward: .*head_dim", flashc.attention, q, randn(rng, (1, 16, 2, 4)), v)
    assert isinstance(e, flashc.InvalidArgumentError) and isinstance(e, flashc.Error)
    assert e.status == 1 and e.status_name == "invalid argument"
    raises(ValueError, "not a multiple of heads_kv", flashc.attention, randn(rng, (1, 16, 3, 8)), k, v)
    raises(ValueError, "batch", flashc.attention, randn(rng, (2, 16, 2, 8)), k, v)
    raises(ValueError, "dtype", flashc.attention, q, k.astype(np.float16), v)
    # batch and seqlen 0 are valid (test_empty.py); heads and head_dim 0 are not
    raises(ValueError, "heads and head_dim must be >= 1", flashc.attention, q[:, :, :0], k, v)
    raises(ValueError, "heads and head_dim must be >= 1", flashc.attention, q[..., :0], k[..., :0], v[..., :0])


def test_output_aliasing_an_input_is_refused(qkv):
    q, k, v = qkv
    raises(ValueError, "shares memory with", flashc.attention, q, k, v, out=q)


def test_output_with_zero_strides_inside_an_input_is_refused(rng):
    """Issue 43 row 2: an output [1, 1, 1, d] with strides 0 whose memory is a row of k: the overlap test
    must use the real extent of both views."""
    q, k, v = randn(rng, (1, 1, 1, 8)), randn(rng, (1, 16, 1, 8)), randn(rng, (1, 16, 1, 8))
    saved = k.copy()
    out = np.lib.stride_tricks.as_strided(k[0, 5], (1, 1, 1, 8), (0, 0, 0, 4))
    raises(ValueError, "output o shares memory with k", flashc.attention, q, k, v, out=out, backend="cpu-ref")
    np.testing.assert_array_equal(k, saved)


def test_lse_inside_another_tensor_is_refused(qkv, cpu_ref):
    """Issue 43 row 3: lse is an output of the forward (overlap-checked like o) and an input of the backward
    (dq, dk, dv must not overlap it)."""
    q, k, v = qkv
    saved = q.copy()
    lse_in_q = q.reshape(-1)[8 : 8 + 32].reshape(1, 2, 16)
    raises(ValueError, "output lse shares memory with q", flashc.attention, q, k, v, lse=lse_in_q)
    np.testing.assert_array_equal(q, saved)
    o, lse = flashc.attention(q, k, v, return_lse=True, backend="cpu-ref")
    buf = np.empty(32 + q.size, np.float32)
    buf[:32] = lse.reshape(-1)
    dq = buf[16 : 16 + q.size].reshape(q.shape)  # its first 16 floats are lse's last
    raises(
        ValueError,
        "output dq shares memory with lse",
        flashc.attention_backward,
        o,
        q,
        k,
        v,
        o,
        buf[:32].reshape(lse.shape),
        dq=dq,
        backend="cpu-ref",
    )


def _misaligned(shape):
    """A float32 array one byte off its element alignment."""
    n = int(np.prod(shape))
    return np.empty(n * 4 + 1, np.uint8)[1 : 1 + n * 4].view(np.float32).reshape(shape)


def test_misaligned_arrays(rng, cpu_ref):
    """Issue 43 row 12: the C library refuses data not aligned to its element size; Python copies a misaligned
    input (the result is the aligned one's) and refuses a misaligned output with a message that says so."""
    q, k, v = (randn(rng, (1, 16, 2, 8)) for _ in range(3))
    qm = _misaligned(q.shape)
    qm[...] = q
    assert not qm.flags.aligned
    np.testing.assert_array_equal(
        flashc.attention(qm, k, v, backend="cpu-ref"), flashc.attention(q, k, v, backend="cpu-ref")
    )
    raises(ValueError, "not aligned to its 4-byte elements", flashc.attention, q, k, v, out=_misaligned(q.shape))
    raises(ValueError, "not aligned", flashc.attention, q, k, v, lse=_misaligned((1, 2, 16)))


def test_unsupported_is_not_implemented(rng):
    b = need_backend("cpu")
    if "f64" not in b.dtypes:
        q = randn(rng, (1, 8, 1, 8), np.float64)
        e = raises(NotImplementedError, "f64", flashc.attention, q, q, q, backend="cpu")
        assert isinstance(e, flashc.UnsupportedError) and e.status == 2
    big = randn(rng, (1, 2, 1, b.max_head_dim + 1))
    raises(NotImplementedError, "head_dim", flashc.attention, big, big, big, backend="cpu")


@pytest.mark.parametrize("name", [n for n, b in BACKENDS.items() if not b.usable] or ["(none)"])
def test_unusable_backends_say_why(rng, name):
    if name == "(none)":
        pytest.skip("every backend of this library is usable here")
    q = randn(rng, (1, 8, 1, 16))
    e = raises(NotImplementedError, "not usable here", flashc.attention, q, q, q, backend=name)
    assert BACKENDS[name].why_unusable in str(e)


# ---- outputs -----------------------------------------------------------------------------------------------
def test_bad_outputs(qkv):
    q, k, v = qkv
    raises(ValueError, "shape", flashc.attention, q, k, v, out=np.empty((1, 16, 2, 9), np.float32))
    raises(TypeError, "must be f32", flashc.attention, q, k, v, out=np.empty(q.shape, np.float16))
    ro = np.empty(q.shape, np.float32)
    ro.flags.writeable = False
    raises(ValueError, "read-only", flashc.attention, q, k, v, out=ro)
    raises(ValueError, "strides", flashc.attention, q, k, v, out=np.empty((1, 16, 2, 16), np.float32)[..., ::2])
    raises(
        ValueError,
        "overlaps itself",
        flashc.attention,
        q,
        k,
        v,
        out=np.lib.stride_tricks.as_strided(np.empty(16, np.float32), q.shape, (0, 0, 0, 4)),
    )
    raises(ValueError, "lse has shape", flashc.attention, q, k, v, lse=np.empty((1, 16, 2), np.float32))
    raises(ValueError, "contiguous", flashc.attention, q, k, v, lse=np.empty((1, 2, 32), np.float32)[..., ::2])


# ---- backward and varlen: raw pointers whose size only Python can check -----------------------------------
def test_bad_lse(qkv):
    q, k, v = qkv
    o, lse = flashc.attention(q, k, v, return_lse=True, backend="cpu-ref")
    raises(TypeError, "lse", flashc.attention_backward, o, q, k, v, o, None, backend="cpu-ref")
    raises(ValueError, "lse has shape", flashc.attention_backward, o, q, k, v, o, lse[:, :, :-1], backend="cpu-ref")
    raises(TypeError, "float32", flashc.attention_backward, o, q, k, v, o, lse.astype(np.float64), backend="cpu-ref")
    raises(ValueError, "dout", flashc.attention_backward, o[:, :8], q, k, v, o, lse, backend="cpu-ref")
    # a transposed lse is copied, not misread
    t = np.ascontiguousarray(lse.transpose(0, 2, 1)).transpose(0, 2, 1)
    g1 = flashc.attention_backward(o, q, k, v, o, t, backend="cpu-ref")
    g2 = flashc.attention_backward(o, q, k, v, o, lse, backend="cpu-ref")
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "cq,ck,exc,match",
    [
        (None, [0, 16], TypeError, "cu_seqlens_q is None"),
        ([0, 16], [0, 8, 16], ValueError, "has 3"),
        ([0], [0], ValueError, "num_seqs \\+ 1 >= 2"),
        ([[0, 16]], [[0, 16]], ValueError, "1-d"),
        ([0, 8.5, 16], [0, 8, 16], TypeError, "integers"),
        ([0, 2**40], [0, 16], ValueError, "int32"),
        ([0, 10, 8, 16], [0, 5, 10, 16], ValueError, "decreases"),
        ([0, 15], [0, 16], ValueError, "packed tensor has 16 rows"),
        ([1, 16], [0, 16], ValueError, "must be 0"),
        ("abc", [0, 16], TypeError, "integers"),
    ],
)
def test_bad_cu_seqlens(qkv, cq, ck, exc, match):
    q, k, v = (x[0] for x in qkv)
    raises(exc, match, flashc.attention_varlen, q, k, v, cq, ck)


def test_varlen_backward_needs_both_offsets(qkv):
    q, k, v = (x[0] for x in qkv)
    raises(TypeError, "cu_seqlens", flashc.attention_varlen_backward, q, q, k, v, q, None, None, [0, 16])


def test_random_garbage_never_crashes(rng, cpu_ref):
    """Random shapes, strides, dtypes and options: each call succeeds or raises TypeError, ValueError or
    NotImplementedError; the process survives."""
    dtypes = [np.float32, np.float16, np.float64, np.int8]
    for _ in range(300):

        def arr():
            shape = tuple(int(x) for x in rng.integers(0, 4, size=int(rng.integers(2, 6))))
            a = np.zeros(shape, dtype=dtypes[rng.integers(len(dtypes))])
            if a.ndim and rng.random() < 0.3:
                a = np.flip(a, axis=int(rng.integers(a.ndim)))
            return a

        args = [arr() for _ in range(3)]
        kwargs = {}
        if rng.random() < 0.3:
            kwargs["window"] = tuple(int(x) for x in rng.integers(-3, 3, size=2))
        if rng.random() < 0.3:
            kwargs["backend"] = ["cpu", "cpu-ref", "auto", "x"][rng.integers(4)]
        try:
            flashc.attention(*args, **kwargs)
        except (TypeError, ValueError, NotImplementedError):
            pass


def test_device_tensors_never_reach_a_host_backend(cpu_ref):
    """A library built without CUDA cannot tell a device pointer from a host one, so Python refuses CUDA
    tensors for host backends itself (checked here on the guard; test_cuda.py checks it with real tensors)."""
    from flashc import _api

    with pytest.raises(ValueError, match="needs host memory"):
        _api._check_backend("cpu-ref", "cuda:0")
    if not any(b.device == "cuda" and b.usable for b in flashc.backends()):
        with pytest.raises(NotImplementedError, match="no usable CUDA backend"):
            _api._check_backend("auto", "cuda:0")
    assert _api._check_backend("cpu-ref", "cpu") == "cpu-ref"
