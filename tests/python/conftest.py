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
