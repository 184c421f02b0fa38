"""Shared fixtures of the Python package's tests: the backends this libflashc has, random inputs."""

import zlib

import numpy as np
import pytest

import flashc

BACKENDS = {b.name: b for b in flashc.backends()}
CPU_BACKENDS = [n for n, b in BACKENDS.items() if b.device == "cpu" and b.usable]


def need_backend(name):
    """Skip when this build of libflashc lacks a backend (the C library grows rung by rung)."""
    b = BACKENDS.get(name)
    if b is None:
        pytest.skip(f"backend {name} is not in this libflashc ({flashc.library_path})")
    if not b.usable:
        pytest.skip(f"backend {name} is not usable here: {b.why_unusable}")
    return b


def need_torch_ops():
    """torch and flashc._ops, skipping where torch or its custom operators (torch >= 2.4) are missing."""
    torch = pytest.importorskip("torch")
    from flashc import _ops

    if not _ops.HAVE_OPS:
        pytest.skip("torch < 2.4: no operators")
    return torch, _ops


def hopper_skip_reason():
    """Why the cuda-hopper tests cannot run here ("no CUDA device", "no sm_90: ..."), or None when they can."""
    hopper = BACKENDS.get("cuda-hopper")
    if not any(b.device == "cuda" and b.usable for b in BACKENDS.values()):
        return "no CUDA device"
    if hopper is None:
        return "no sm_90: this libflashc has no cuda-hopper"
    if not hopper.usable:
        return f"no sm_90: cuda-hopper is not usable here ({hopper.why_unusable})"
    return None


def cuda_qkv_dv(torch, shape, dtype):
    """Random q, k, v, dout on the GPU of shape (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v):
    v and dout with V's head dim."""
    b, sq, sk, hq, hkv, d, dv = shape
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt, device="cuda") for s in ((b, sq, hq, d), (b, sk, hkv, d)))
    v, dout = (torch.randn(s, dtype=tdt, device="cuda") for s in ((b, sk, hkv, dv), (b, sq, hq, dv)))
    return q, k, v, dout


def need_extension():
    """flashc._torch_fast with the C++ extension loaded, skipping where it is not."""
    from flashc import _torch_fast

    if not _torch_fast.AVAILABLE:
        pytest.skip(f"the C++ extension is not loaded: {_torch_fast.WHY}")
    return _torch_fast


def spy(monkeypatch, module, names, log):
    """Wrap module's functions `names` so that each call appends (name, args) to log before running the function."""
    for name in names:
        real = getattr(module, name)

        def wrapper(*a, real=real, name=name, **kw):
            log.append((name, a))
            return real(*a, **kw)

        monkeypatch.setattr(module, name, wrapper)


def visible(nq, nk, causal=False, window=None, bottom_right=True):
    """[nq, nk] bool: which keys each query row sees. The diagonal is at the bottom-right (FlashAttention's
    alignment) or the top-left; window (left, right), -1 unbounded, counts keys each side of it; causal caps the
    right at 0."""
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    diag = i + (nk - nq if bottom_right else 0)
    left, right = window if window is not None else (-1, -1)
    seen = np.ones((nq, nk), bool)
    if causal:
        seen &= j <= diag
    if left >= 0:
        seen &= j >= diag - left
    if right >= 0:
        seen &= j <= diag + right
    return seen


@pytest.fixture
def cpu_ref():
    return need_backend("cpu-ref")


def cpu_backend_params():
    """One pytest param per host backend this library has (a skip when it has none)."""
    names = CPU_BACKENDS or ["cpu-ref"]
    return [pytest.param(n, id=n) for n in names]


@pytest.fixture
def rng(request):
    # A fresh seed per test (the test's name), so that different tests see different numbers while a
    # failure reproduces.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)
