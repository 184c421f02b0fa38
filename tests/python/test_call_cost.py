"""flashc.torch's hot path through the C++ extension libflashc_torch.so (flashc/_torch_fast.py): what it runs, that
it gives the Python path's results and errors, and that it costs less. Skipped where the extension is not built
(the library's CMake build makes it where torch >= 2.10 imports; FLASHC_TORCH_EXT=0 keeps it out).

Wall-clock thresholds are flaky on a shared machine, so the cost is asserted through its structure: a call runs no
Python code of the ctypes path (flashc/_ops.py, _lib.py, _api.py, ctypes) and only a few Python frames at all. The
one timed test compares the extension with the Python path in the same process, interleaved, with a wide margin;
bench/torch_call_cost.py measures the ratio to SDPA."""

import pathlib
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402
from flashc import _torch_fast  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_fast.AVAILABLE, reason=f"no torch extension: {_torch_fast.WHY}")

PACKAGE = pathlib.Path(flashc.__file__).resolve().parent
SLOW_PATH = {PACKAGE / "_ops.py", PACKAGE / "_lib.py", PACKAGE / "_api.py", PACKAGE / "_arrays.py"}


def _inputs(shape=(1, 16, 8, 64), grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).requires_grad_(grad) for _ in range(3))


def _python_frames(fn) -> list:
    """(file, function) of the Python functions that fn() calls, in order (sys.setprofile's 'call' events)."""
    files = []

    def hook(frame, event, _arg):
        if event == "call":
            files.append((pathlib.Path(frame.f_code.co_filename).resolve(), frame.f_code.co_name))

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return files


def _ctypes_files(files) -> list:
    """The frames of the ctypes path: the package's argument conversion and marshalling, and ctypes itself
    (_ops.check_double_backward, which only reads torch's grad mode, is the backward's on both paths)."""
    return sorted(
        {f"{f.name}:{name}" for f, name in files if (f in SLOW_PATH or "ctypes" in f.parts)}
        - {"_ops.py:check_double_backward"}
    )


def test_forward_runs_no_python_of_the_ctypes_path():
    q, k, v = _inputs()

    def call():
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    call()  # warm: the options cache, the handle
    files = _python_frames(call)
    assert not _ctypes_files(files), f"the forward ran {_ctypes_files(files)}"
    ours = [name for f, name in files if f.parent == PACKAGE]
    # attention and _torch_fast.forward (the common call's short path), where the ctypes path runs some 20
    # (fwd_impl, _readable x3, _run, _check_backend, _handle, ...)
    assert len(ours) <= 3, f"{len(ours)} Python frames of flashc per forward: {ours}"


def test_forward_backward_runs_no_python_of_the_ctypes_path():
    q, k, v = _inputs(grad=True)
    dout = torch.randn_like(q)

    def call():
        ft.attention(q, k, v, causal=True).backward(dout)

    call()
    files = _python_frames(call)
    assert not _ctypes_files(files), f"forward+backward ran {_ctypes_files(files)}"


def test_python_path_is_what_the_structural_tests_would_catch(monkeypatch):
    # The check above can fail: through _ops (the path without the extension) the same call runs _ops.py.
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    q, k, v = _inputs()
    with torch.no_grad():
        files = _python_frames(lambda: ft.attention(q, k, v, causal=True))
    assert _ctypes_files(files)


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_extension_matches_python_path_and_reference(monkeypatch, varlen):
    q, k, v = _inputs((2, 37, 4, 64), grad=True, seed=1)
    dout = torch.randn(2, 37, 4, 64, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 37, 74], dtype=torch.int32)

    def run(backend, dtype=torch.float32):
        xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        if varlen:
            packed = [x.reshape(74, 4, 64) for x in xs]
            out = ft.attention_varlen(*packed, cu, cu, causal=True, backend=backend).reshape(2, 37, 4, 64)
        else:
            out = ft.attention(*xs, causal=True, backend=backend)
        out.backward(dout.to(dtype))
        return [out.detach()] + [x.grad for x in xs], flashc.last_backend()

    fast, name = run("auto")
    assert name == "cpu"  # the extension reports the backend it ran, as the Python path does
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    slow, _ = run("auto")
    ref, _ = run("cpu-ref", torch.float64)
    for a, b, r in zip(fast, slow, ref):
        assert torch.equal(a, b)  # the same kernel on the same data: bit-identical
        torch.testing.assert_close(a.double(), r, atol=1e-5, rtol=1e-5)


def test_errors_are_the_python_paths(monkeypatch):
    q, k, v = _inputs()
    bad = [
        dict(k=k[:, :, :3]),  # heads that do not divide: libflashc's InvalidArgumentError
        dict(q=q.double()),  # mixed dtypes: flashc.torch's TypeError
        dict(q=q[0]),  # a rank the C API cannot take: _ops's ValueError
    ]
    for case in bad:
        args = dict(q=q, k=k, v=v) | case
        errors = []
        for kernels in (_torch_fast, _torch_fast.PYTHON_PATH):
            monkeypatch.setattr(ft, "_kernels", kernels)
            with pytest.raises(Exception) as e:
                ft.attention(args["q"], args["k"], args["v"], causal=True)
            errors.append((type(e.value), str(e.value)))
        assert errors[0] == errors[1]


def test_extension_is_cheaper_than_the_python_path(monkeypatch):
    q, k, v = _inputs()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the call's cost, not the thread pool's
    try:
        best = _best_of(q, k, v, monkeypatch)
    finally:
        torch.set_num_threads(threads)
    # The ctypes path adds ~30 us of Python to a ~30 us call here; the margin leaves room for a noisy machine.
    assert best[0] < 0.85 * best[1], f"extension {best[0] / 20 * 1e6:.1f} us, Python {best[1] / 20 * 1e6:.1f} us"


def _best_of(q, k, v, monkeypatch) -> tuple:
    """The least disturbed time of 20 forwards through the extension and through the Python path."""

    def fast():
        ft._kernels = _torch_fast
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    def slow():
        ft._kernels = _torch_fast.PYTHON_PATH
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    monkeypatch.setattr(ft, "_kernels", _torch_fast)  # restored after the test
    best = {fast: float("inf"), slow: float("inf")}
    for _ in range(40):  # interleaved, the best of many: the least disturbed run of each
        for fn in best:
            t0 = time.process_time()
            for _ in range(20):
                fn()
            best[fn] = min(best[fn], time.process_time() - t0)
    return best[fast], best[slow]


def test_options_reach_the_extension_as_one_number():
    # The options are checked and packed once per distinct set; the operators take the number.
    a = (None, True, -1, -1, False, "auto", -1, False, 0.0)
    b = (0.125, True, 7, 0, True, "cpu", 1, True, 2.5)
    ia, ib = _torch_fast.options_id(a), _torch_fast.options_id(b)
    assert ia >= 0 and ib >= 0 and ia != ib
    assert _torch_fast.options_id(a) == ia
    _torch_fast._ids.clear()  # the extension answers the same number again for the same set
    assert _torch_fast.options_id(b) == ib
    q, k, v = _inputs((1, 9, 2, 16), seed=3)
    with torch.no_grad():
        out, lse = torch.ops.flashc_ext.fwd(q, k, v, None, None, ib)
        want, want_lse = ft.attention(q, k, v, True, (7, 0), 0.125, "cpu", True, causal_align="top-left",
                                      threads=1, deterministic=True, softcap=2.5)  # fmt: skip
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    with pytest.raises(RuntimeError, match="options -1 were not made"):
        torch.ops.flashc_ext.fwd(q, k, v, None, None, -1)


@pytest.mark.parametrize(
    "good, bad",
    [
        (dict(threads=1), dict(threads=True)),
        (dict(scale=1.0), dict(scale=True)),
        (dict(softcap=0.0), dict(softcap=False)),
        (dict(window=(1, 0)), dict(window=(True, 0))),
        (dict(window=(3, 0)), dict(window=(3, False))),
    ],
)
def test_cached_options_still_refuse_bools(good, bad):
    # True == 1 and False == 0.0 as dict keys: a cached valid call must not answer for the invalid one.
    q, k, v = _inputs((1, 4, 2, 8))
    with torch.no_grad():
        for _ in range(2):
            ft.attention(q, k, v, causal=True, **good)
        with pytest.raises(TypeError, match="flashc: "):
            ft.attention(q, k, v, causal=True, **bad)


def test_fast_path_autograd_matches_python_path(monkeypatch):
    q, k, v = _inputs((2, 21, 4, 32), grad=True, seed=4)
    g = torch.Generator().manual_seed(5)
    dout = torch.randn(2, 21, 4, 32, generator=g)

    def run():
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out, lse = ft.attention(*xs, causal=True, window=(5, 0), return_lse=True)
        assert out.requires_grad and not lse.requires_grad  # lse is not differentiable
        out.backward(dout)
        plain = ft.attention(*xs, causal=True, window=(5, 0))  # without lse: the same out
        assert torch.equal(plain.detach(), out.detach())
        return [out.detach(), lse] + [x.grad for x in xs]

    fast = run()
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    slow = run()
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)


def test_fast_path_refuses_double_backward():
    q, k, v = _inputs(grad=True)
    out = ft.attention(q, k, v, causal=True)
    (g,) = torch.autograd.grad(out.square().sum(), q, create_graph=False)
    assert g.shape == q.shape
    out = ft.attention(q, k, v, causal=True)
    with pytest.raises(RuntimeError, match="no second derivative"):
        torch.autograd.grad(out.square().sum(), q, create_graph=True)


def test_fast_path_leaves_autocast_and_mixed_dtypes_to_the_general_path():
    q, k, v = _inputs((1, 8, 2, 16))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert ft.attention(q, k, v, causal=True).dtype == torch.bfloat16  # cast, as SDPA
    with pytest.raises(TypeError, match="k.dtype is torch.float64"):
        ft.attention(q, k.double(), v, causal=True)
