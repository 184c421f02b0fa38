"""Empty inputs are valid calls (flashc.h, "Empty inputs"), as in FlashAttention and PyTorch: batch 0, seqlen_q 0,
seqlen_k 0 and packed batches whose every sequence is empty on one side. Queries that see no key give o = 0 and
lse = -inf; the backward gives dq = 0 without keys and dk = dv = 0 without queries; the results have the shapes of
the inputs."""

import ml_dtypes
import numpy as np
import pytest

import flashc

from conftest import cpu_backend_params, randn

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]
HQ, HKV, D = 4, 2, 16


def _poisoned(shape, dtype):
    return np.full(shape, np.nan, dtype=dtype)


def _assert_zero(name, x):
    """+0 exactly (not -0, not NaN)."""
    bits = x.view(np.uint16 if x.itemsize == 2 else np.uint32)
    assert np.all(bits == 0), f"{name}: {np.count_nonzero(bits)} of {x.size} elements are not +0"


@pytest.mark.parametrize("backend", cpu_backend_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("b,sq,sk", [(0, 7, 9), (2, 0, 9), (2, 7, 0), (2, 0, 0)], ids=["b0", "sq0", "sk0", "both0"])
@pytest.mark.parametrize("causal", [False, True])
def test_dense(rng, backend, dtype, b, sq, sk, causal):
    q = randn(rng, (b, sq, HQ, D), dtype)
    k, v = randn(rng, (b, sk, HKV, D), dtype), randn(rng, (b, sk, HKV, D), dtype)
    # outputs given poisoned, so that what the call leaves in them is seen
    out, lse = _poisoned(q.shape, q.dtype), _poisoned((b, HQ, sq), np.float32)
    o, lse_out = flashc.attention(q, k, v, causal, backend=backend, return_lse=True, out=out, lse=lse)
    assert o is out and lse_out is lse and o.shape == q.shape and lse.shape == (b, HQ, sq)
    _assert_zero("o", o)
    assert np.all(lse == -np.inf)
    # new outputs
    o2, l2 = flashc.attention(q, k, v, causal, backend=backend, return_lse=True)
    assert o2.shape == q.shape and o2.dtype == q.dtype and l2.shape == (b, HQ, sq) and l2.dtype == np.float32
    _assert_zero("o", o2)
    assert np.all(l2 == -np.inf)

    dout = randn(rng, q.shape, dtype)
    dq, dk, dv = (_poisoned(x.shape, x.dtype) for x in (q, k, v))
    g = flashc.attention_backward(dout, q, k, v, o, lse, causal, backend=backend, dq=dq, dk=dk, dv=dv)
    assert g[0] is dq and g[1] is dk and g[2] is dv
    for name, x, like in zip(("dq", "dk", "dv"), g, (q, k, v)):
        assert x.shape == like.shape and x.dtype == like.dtype
        _assert_zero(name, x)


@pytest.mark.parametrize("backend", cpu_backend_params())
def test_varlen_every_sequence_empty_on_one_side(rng, backend):
    # no keys at all: every query row gives o = 0, lse = -inf, dq = 0
    q, k = randn(rng, (5, HQ, D)), randn(rng, (0, HKV, D))
    o, lse = flashc.attention_varlen(q, k, k, [0, 2, 5], [0, 0, 0], backend=backend, return_lse=True)
    assert o.shape == q.shape and lse.shape == (HQ, 5)
    _assert_zero("o", o)
    assert np.all(lse == -np.inf)
    dq, dk, dv = flashc.attention_varlen_backward(o, q, k, k, o, lse, [0, 2, 5], [0, 0, 0], backend=backend)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == k.shape
    _assert_zero("dq", dq)
    # no queries at all: nothing to write forward, dk = dv = 0 backward
    q, k, v = randn(rng, (0, HQ, D)), randn(rng, (6, HKV, D)), randn(rng, (6, HKV, D))
    o, lse = flashc.attention_varlen(q, k, v, [0, 0, 0], [0, 6, 6], causal=True, backend=backend, return_lse=True)
    assert o.shape == (0, HQ, D) and lse.shape == (HQ, 0)
    dq, dk, dv = flashc.attention_varlen_backward(o, q, k, v, o, lse, [0, 0, 0], [0, 6, 6], backend=backend)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    _assert_zero("dk", dk)
    _assert_zero("dv", dv)


def test_empty_views_of_other_arrays(rng, cpu_ref):
    """Slices with no element (whatever their pointer and strides) are accepted and never read or written."""
    big = randn(rng, (2, 8, HQ, D))
    saved = big.copy()
    q = big[:, 3:3]  # seqlen 0, a pointer into big
    k = randn(rng, (2, 8, HKV, D))
    out = big[:, 5:5]
    o = flashc.attention(q, k, k, backend="cpu-ref", out=out)
    assert o.shape == (2, 0, HQ, D)
    np.testing.assert_array_equal(big, saved)
    # a non-empty result next to an empty input: the empty k may be any slice
    q = randn(rng, (2, 3, HQ, D))
    o, lse = flashc.attention(q, big[:, :0, :HKV], big[:, :0, :HKV], backend="cpu-ref", return_lse=True)
    _assert_zero("o", o)
    assert np.all(lse == -np.inf)
    np.testing.assert_array_equal(big, saved)
