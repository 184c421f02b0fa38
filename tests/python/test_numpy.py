"""The numpy path: every host backend against the package's independent fp64 reference (numpy,
flashc.testing.reference), on odd shapes, GQA, masks, varlen and strided views; outputs in place."""

import ml_dtypes
import numpy as np
import pytest

import flashc
from flashc.testing.reference import numpy_backward, numpy_forward

from conftest import BACKENDS, cpu_backend_params, need_backend, randn

# Max |error| / max(1, max|ref|) allowed per dtype: well above what an exact kernel does in that precision,
# far below what a wrong mask, scale or head mapping gives (errors of order 1).
TOL = {np.float64: 1e-10, np.float32: 2e-5, np.float16: 4e-3, ml_dtypes.bfloat16: 3e-2}
# The backward reads the forward's lse, which the API keeps in float32 whatever the dtype; the one float64
# backend (cpu-ref, the oracle) recomputes its statistics in float64, so float64 keeps its bar.
TOL_BACKWARD = TOL


def close(got, want, dtype, what="", tol=TOL):
    got = np.asarray(got, dtype=np.float64)
    assert np.all(np.isfinite(got)), f"{what}: NaN or inf in the output"
    err = np.abs(got - want).max() if got.size else 0.0
    bound = tol[dtype] * max(1.0, np.abs(want).max() if want.size else 0.0)
    assert err <= bound, f"{what}: max |error| {err:.3g} > {bound:.3g}"


def backend_dtypes(name):
    b = need_backend(name)
    names = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
    return [names[d] for d in b.dtypes]


def run_case(
    name, rng, b, sq, sk, hq, hkv, d, dtype, causal=False, window=None, align="bottom-right", scale=None, backward=True
):
    if dtype not in backend_dtypes(name):
        pytest.skip(f"{name} has no {np.dtype(dtype).name}")
    q, k, v = randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hkv, d), dtype), randn(rng, (b, sk, hkv, d), dtype)
    opts = dict(causal=causal, window=window, scale=scale, causal_align=align)
    o, lse = flashc.attention(q, k, v, backend=name, return_lse=True, **opts)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == (b, hq, sq) and lse.dtype == np.float32
    assert flashc.last_backend() == name
    ro, rl = numpy_forward(q, k, v, causal, window, scale, align)
    close(o, ro, dtype, "o")
    assert np.array_equal(np.isneginf(lse), np.isneginf(rl)), "lse is -inf exactly where a row sees no key"
    fin = ~np.isneginf(rl)
    assert np.abs(lse[fin] - rl[fin]).max(initial=0) <= 1e-4 * max(1, np.abs(rl[fin]).max(initial=0)) + (
        0 if dtype in (np.float32, np.float64) else 1e-2
    )
    if not backward or not BACKENDS[name].has_backward:
        return
    dout = randn(rng, o.shape, dtype)
    dq, dk, dv = flashc.attention_backward(dout, q, k, v, o, lse, backend=name, **opts)
    want = numpy_backward(dout, q, k, v, causal, window, scale, align)
    for got, ref, what in zip((dq, dk, dv), want, ("dq", "dk", "dv")):
        assert got.shape == ref.shape and got.dtype == q.dtype
        close(got, ref, dtype, what, TOL_BACKWARD)


@pytest.mark.parametrize("name", cpu_backend_params())
@pytest.mark.parametrize(
    "b,sq,sk,hq,hkv,d",
    [
        (1, 1, 1, 1, 1, 8),  # the smallest problem
        (2, 97, 97, 4, 4, 59),  # odd seqlen and head dim
        (1, 113, 203, 6, 2, 32),  # unequal lengths, GQA 3:1
        (2, 1, 147, 4, 1, 64),  # one query, MQA
        (1, 257, 65, 2, 2, 111),  # more queries than keys
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_matches_reference_f32(name, rng, b, sq, sk, hq, hkv, d, causal):
    run_case(name, rng, b, sq, sk, hq, hkv, d, np.float32, causal=causal)


@pytest.mark.parametrize("name", cpu_backend_params())
@pytest.mark.parametrize("dtype", [np.float64, np.float16, ml_dtypes.bfloat16], ids=["f64", "f16", "bf16"])
def test_dtypes(name, rng, dtype):
    run_case(name, rng, 2, 65, 80, 4, 2, 64, dtype, causal=True)


@pytest.mark.parametrize("name", cpu_backend_params())
@pytest.mark.parametrize(
    "window,causal,align",
    [
        ((16, 8), False, "bottom-right"),
        ((0, 0), False, "bottom-right"),  # each query sees one key
        ((32, None), True, "bottom-right"),
        ((None, 3), False, "top-left"),
        (None, True, "top-left"),  # PyTorch's is_causal
    ],
)
def test_masks(name, rng, window, causal, align):
    run_case(name, rng, 1, 70, 90, 2, 1, 32, np.float32, causal=causal, window=window, align=align)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_fully_masked_rows(name, rng):
    """Causal with sq > sk (bottom-right): the first sq - sk rows see no key: o = 0, lse = -inf, no NaN."""
    need_backend(name)
    q, k, v = randn(rng, (1, 40, 2, 16)), randn(rng, (1, 10, 2, 16)), randn(rng, (1, 10, 2, 16))
    o, lse = flashc.attention(q, k, v, causal=True, backend=name, return_lse=True)
    assert np.all(o[:, :30] == 0) and np.all(np.isneginf(lse[:, :, :30])) and np.all(np.isfinite(lse[:, :, 30:]))
    run_case(name, rng, 1, 40, 10, 2, 2, 16, np.float32, causal=True)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_scale(name, rng):
    run_case(name, rng, 1, 33, 33, 2, 2, 16, np.float32, scale=0.37)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_strided_views_are_not_copied(name, rng):
    """Slices of a packed QKV and a [b, h, s, d] tensor seen as [b, s, h, d]: passed by strides, and the result
    equals the one from contiguous copies."""
    need_backend(name)
    qkv = randn(rng, (2, 50, 3, 4, 32))  # [b, s, 3, h, d]
    q, v = qkv[:, :, 0], qkv[:, :, 2]
    assert not q.flags.c_contiguous
    bhsd = randn(rng, (2, 4, 50, 32))
    k2 = bhsd.transpose(0, 2, 1, 3)  # [b, s, h, d] view of BHSD memory
    o = flashc.attention(q, k2, v, causal=True, backend=name)
    want = flashc.attention(*(np.ascontiguousarray(x) for x in (q, k2, v)), causal=True, backend=name)
    np.testing.assert_array_equal(o, want)
    close(o, numpy_forward(q, k2, v, True)[0], np.float32)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_layouts_the_c_api_cannot_take_are_copied(name, rng):
    need_backend(name)
    q = randn(rng, (1, 20, 2, 16))
    k = randn(rng, (1, 20, 2, 32))[..., ::2]  # head_dim stride 2
    v = randn(rng, (1, 20, 2, 16))[:, ::-1]  # negative seqlen stride
    swapped = q.astype(">f4")  # byte-swapped
    o = flashc.attention(swapped, k, v, backend=name)
    close(o, numpy_forward(q, k, v)[0], np.float32)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_outputs_in_place(name, rng):
    need_backend(name)
    q, k, v = (randn(rng, (1, 30, 2, 16)) for _ in range(3))
    big = np.full((1, 30, 2, 48), np.nan, dtype=np.float32)
    out = big[..., 16:32]  # a strided output is written through its strides
    lse = np.full((1, 2, 30), np.nan, dtype=np.float32)
    got = flashc.attention(q, k, v, backend=name, out=out, lse=lse, return_lse=True)
    assert got[0] is out and got[1] is lse
    assert np.all(np.isnan(big[..., :16])) and np.all(np.isnan(big[..., 32:])), "writes stay inside the view"
    ro, rl = numpy_forward(q, k, v)
    close(out, ro, np.float32)
    close(lse, rl, np.float32)
    if BACKENDS[name].has_backward:
        dout = randn(rng, q.shape)
        grads = [np.full(x.shape, np.nan, dtype=np.float32) for x in (q, k, v)]
        dq, dk, dv = flashc.attention_backward(
            dout, q, k, v, out, lse, backend=name, dq=grads[0], dk=grads[1], dv=grads[2]
        )
        assert dq is grads[0] and dk is grads[1] and dv is grads[2]
        for got_, want in zip(grads, numpy_backward(dout, q, k, v)):
            close(got_, want, np.float32)


@pytest.mark.parametrize("name", cpu_backend_params())
@pytest.mark.parametrize("causal", [False, True])
def test_varlen(name, rng, causal):
    """Packed sequences give what each sequence gives alone (lengths 1, 17, 0 and 40 for q; 5, 17, 3, 33 for
    k: an empty query sequence, and sq > sk with causal = fully masked rows)."""
    need_backend(name)
    lq, lk = [1, 17, 0, 40], [5, 17, 3, 33]
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
    hq, hkv, d = 4, 2, 24
    q, k, v = randn(rng, (cq[-1], hq, d)), randn(rng, (ck[-1], hkv, d)), randn(rng, (ck[-1], hkv, d))
    o, lse = flashc.attention_varlen(q, k, v, cq, ck.tolist(), causal=causal, backend=name, return_lse=True)
    assert o.shape == q.shape and lse.shape == (hq, cq[-1])
    dout = randn(rng, q.shape)
    grads = None
    if BACKENDS[name].has_backward:
        grads = flashc.attention_varlen_backward(dout, q, k, v, o, lse, cq, ck, causal=causal, backend=name)
    for s in range(len(lq)):
        qs, ks = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
        if lq[s] == 0:
            continue
        ro, rl = numpy_forward(q[None, qs], k[None, ks], v[None, ks], causal)
        close(o[qs], ro[0], np.float32, f"o of sequence {s}")
        assert np.array_equal(np.isneginf(lse[:, qs]), np.isneginf(rl[0]))
        if grads is not None:
            want = numpy_backward(dout[None, qs], q[None, qs], k[None, ks], v[None, ks], causal)
            for got, ref, what, sl in zip(grads, want, ("dq", "dk", "dv"), (qs, ks, ks)):
                close(got[sl], ref[0], np.float32, f"{what} of sequence {s}")


def test_auto_picks_a_backend_that_accepts_the_call(rng, cpu_ref):
    q, k, v = (randn(rng, (1, 9, 1, 8), np.float64) for _ in range(3))
    flashc.attention(q, k, v)
    assert flashc.last_backend() == "cpu-ref", "only cpu-ref has f64"


def test_prepared_calls_rerun_in_place(rng, cpu_ref):
    q, k, v = (randn(rng, (1, 12, 2, 8)) for _ in range(3))
    call = flashc.prepare_forward(q, k, v, causal=True, backend="cpu-ref")
    o, lse = call.outputs
    o[...] = np.nan
    assert call() is call.outputs and np.all(np.isfinite(o))
    q[...] = randn(rng, q.shape)  # new values, same memory: the next call sees them
    call()
    close(o, numpy_forward(q, k, v, True)[0], np.float32)


def test_threads_and_determinism(rng, cpu_ref):
    q, k, v = (randn(rng, (2, 64, 2, 16)) for _ in range(3))
    a = flashc.attention(q, k, v, backend="cpu-ref", threads=1, deterministic=True)
    b = flashc.attention(q, k, v, backend="cpu-ref", threads=2, deterministic=True)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_threads_call_at_once(name, rng):
    """ctypes drops the GIL during a call: threads run flashc at once, each on its own handle."""
    import threading

    need_backend(name)
    inputs = [tuple(randn(rng, (1, 64, 2, 32)) for _ in range(3)) for _ in range(4)]
    want = [flashc.attention(*x, backend=name, threads=1) for x in inputs]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                np.testing.assert_array_equal(flashc.attention(*inputs[i], backend=name, threads=1), want[i])
        except Exception as e:  # noqa: BLE001 — reported below, in the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
