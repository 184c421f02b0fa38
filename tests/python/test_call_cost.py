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
from flashc import kvcache as kvc  # noqa: E402

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

    def fast():
        ft._kernels = _torch_fast
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    def slow():
        ft._kernels = _torch_fast.PYTHON_PATH
        with torch.no_grad():
            ft.attention(q, k, v, causal=True)

    monkeypatch.setattr(ft, "_kernels", _torch_fast)  # restored after the test
    best = _best_of(fast, slow)
    # The ctypes path adds ~30 us of Python to a ~30 us call here; the margin leaves room for a noisy machine.
    assert best[0] < 0.85 * best[1], f"extension {best[0] / 20 * 1e6:.1f} us, Python {best[1] / 20 * 1e6:.1f} us"


def _best_of(fast, slow) -> tuple:
    """The least disturbed time of 20 calls of fast() and of slow(), on one torch thread (the call's cost, not
    the thread pool's)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    best = {fast: float("inf"), slow: float("inf")}
    try:
        for _ in range(40):  # interleaved, the best of many: the least disturbed run of each
            for fn in best:
                t0 = time.process_time()
                for _ in range(20):
                    fn()
                best[fn] = min(best[fn], time.process_time() - t0)
    finally:
        torch.set_num_threads(threads)
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


# ---- flashc.attention_with_kvcache: its short path through flashc_ext::kvcache ----------------------------------
def _decode(paged, append, seed=6, dtype=torch.float32):
    """A decoding step's tensors (q, k_cache, v_cache, k, v, cache_seqlens, block_table): batch 2, 2 new rows of 8
    query heads over 2 KV heads, d 32, capacity 64 (pages of 16 in a permuted pool), cached lengths 15 and 40 (the
    first sequence's append crosses a page boundary)."""
    g = torch.Generator().manual_seed(seed)
    table = None
    if paged:
        table = torch.randperm(10, generator=g)[:8].reshape(2, 4).to(torch.int32)
        shape = (10, 16, 2, 32)
    else:
        shape = (2, 64, 2, 32)
    q = torch.randn(2, 2, 8, 32, generator=g)
    kc, vc = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
    k, v = (torch.randn(2, 2, 2, 32, generator=g) for _ in range(2)) if append else (None, None)
    lens = torch.tensor([15, 40], dtype=torch.int32)
    return tuple(x if x is None or not x.is_floating_point() else x.to(dtype) for x in (q, kc, vc, k, v, lens, table))


def _kvcache_path(monkeypatch, fast: bool) -> list:
    """Routes attention_with_kvcache through the extension (fast) or its Python path; returns the list that
    records each run of the Python path's kernel (kvcache._forward)."""
    monkeypatch.setattr(kvc, "_fast", _torch_fast.kvcache if fast else False)
    runs, python_path = [], kvc._forward

    def recorded(*args, **kw):
        runs.append(1)
        return python_path(*args, **kw)

    monkeypatch.setattr(kvc, "_forward", recorded)
    return runs


needs_kvcache = pytest.mark.skipif(_torch_fast.kvcache is None, reason="the extension has no flashc_ext::kvcache")


@needs_kvcache
@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("append", [False, True], ids=["read", "append"])
def test_kvcache_extension_matches_python_path_and_reference(monkeypatch, paged, append):
    calls = [  # (options, out= given)
        (dict(causal=True), False),
        (dict(causal=True, window=(7, 0), num_splits=3, return_lse=True), False),
        (dict(scale=0.3, return_lse=True), True),
        (dict(causal=True, threads=1), True),
    ]
    for opts, given in calls:
        results = {}
        for path in ("extension", "python", "cpu-ref"):
            runs = _kvcache_path(monkeypatch, path != "python")
            dtype = torch.float64 if path == "cpu-ref" else torch.float32
            q, kc, vc, k, v, lens, table = _decode(paged, append, dtype=dtype)
            out = torch.full(q.shape, float("nan"), dtype=dtype) if given else None
            got = flashc.attention_with_kvcache(q, kc, vc, k, v, lens, table, **opts, out=out,
                                                backend="cpu-ref" if path == "cpu-ref" else "auto")  # fmt: skip
            got = got if isinstance(got, tuple) else (got,)
            assert got[0] is out or not given  # out= is what the call returns
            assert flashc.last_backend() == ("cpu-ref" if path == "cpu-ref" else "cpu")
            assert bool(runs) == (path == "python"), f"{path}: the Python path ran {len(runs)} times"
            results[path] = list(got) + [kc, vc]
        for a, b, r in zip(results["extension"], results["python"], results["cpu-ref"]):
            assert torch.equal(a, b), opts  # the same kernel on the same data: bit-identical, caches included
            torch.testing.assert_close(a.double(), r.double(), atol=1e-5, rtol=1e-5)  # lse is fp32 on cpu-ref too


@needs_kvcache
def test_kvcache_errors_are_the_python_paths(monkeypatch):
    q, kc, vc, k, v, lens, table = _decode(paged=True, append=True)
    far = table.clone()
    far[1, 2] = 10  # the block of keys 32..47 of sequence 1: one past the pool
    bad = [
        dict(lens=lens + 40),  # past the capacity: libflashc's ValueError naming the length
        dict(table=far),  # a block outside the pool: its ValueError naming the index
        dict(lens=lens.long()),  # not int32: the Python path's TypeError
        dict(q=q[:, :, :7]),  # 7 query heads over 2 KV heads: libflashc's InvalidArgumentError
        dict(q=q.double()),  # mixed dtypes
        dict(v=None),  # k without v: TypeError
        dict(out=torch.empty(2, 2, 8, 16)),  # out of the wrong shape: ValueError
        dict(out=torch.empty(2, 2, 8, 32, 1)),  # out of the wrong rank: ValueError
        dict(out=torch.empty(2, 2, 8, 64)[..., ::2]),  # out that cannot be written in place: ValueError
        dict(num_splits=-1),  # ValueError
        dict(num_splits=True),  # TypeError
        dict(window=(True, 0)),  # TypeError, after a cached call with (1, 0)
        dict(kc=torch.empty(0, 16, 2, 32)),  # an empty pool: the Python path's own message
    ]
    for case in bad:
        args = dict(q=q, kc=kc, vc=vc, k=k, v=v, lens=lens, table=table, out=None, num_splits=0, window=None) | case
        errors = []
        for fast in (True, False):
            _kvcache_path(monkeypatch, fast)
            caches = (args["kc"].clone(), args["vc"].clone())
            with torch.no_grad():
                flashc.attention_with_kvcache(q, kc, vc, k, v, lens, table, causal=True, window=(1, 0))  # cached
                kc.copy_(caches[0]) if args["kc"] is kc else None
                vc.copy_(caches[1]) if args["vc"] is vc else None
                with pytest.raises(Exception) as e:
                    flashc.attention_with_kvcache(args["q"], args["kc"], args["vc"], args["k"], args["v"], args["lens"],
                                                  args["table"], causal=True, window=args["window"], out=args["out"],
                                                  num_splits=args["num_splits"])  # fmt: skip
            errors.append((type(e.value), str(e.value)))
            assert torch.equal(args["kc"], caches[0]) and torch.equal(args["vc"], caches[1]), "a refused call wrote"
        assert errors[0] == errors[1], case


@needs_kvcache
def test_kvcache_runs_no_python_of_the_ctypes_path(monkeypatch):
    q, kc, vc, k, v, lens, table = _decode(paged=True, append=True)
    out = torch.empty_like(q)

    def call():
        with torch.no_grad():
            flashc.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True, out=out)

    for fast in (True, False):
        _kvcache_path(monkeypatch, fast)
        call()  # warm: the options cache, the handle, the operators' registration
        files = _python_frames(call)
        ours = [name for f, name in files if f.parent == PACKAGE]
        if fast:
            assert not _ctypes_files(files), f"the decode step ran {_ctypes_files(files)}"
            # attention_with_kvcache, _seqlens and _torch_fast.kvcache, where the Python path runs some 30
            assert len(ours) <= 3, f"{len(ours)} Python frames of flashc per decode step: {ours}"
        else:  # the check above can fail: the Python path runs the ctypes marshalling
            assert _ctypes_files(files) and "_forward" in ours


@needs_kvcache
def test_kvcache_short_path_keeps_the_operators_bookkeeping(monkeypatch):
    # Versions of the written tensors move on as the Python path's operator moves them (autograd checks them).
    q, kc, vc, k, v, lens, table = _decode(paged=False, append=True)
    out = torch.empty_like(q)
    runs = _kvcache_path(monkeypatch, True)
    before = (kc._version, vc._version, out._version)
    with torch.no_grad():
        flashc.attention_with_kvcache(q, kc, vc, k, v, lens, out=out)
    assert not runs and all(a > b for a, b in zip((kc._version, vc._version, out._version), before))
    # A call that autograd would record (an input that requires grad, grad enabled) is the Python path's: its
    # operator has no gradient, and says so at backward.
    lq = q.clone().requires_grad_()
    o = flashc.attention_with_kvcache(lq, kc, vc, k, v, lens)
    assert runs and o.requires_grad
    with pytest.raises(RuntimeError):
        o.sum().backward()


@needs_kvcache
def test_kvcache_extension_is_cheaper_than_the_python_path():
    # bench/torch_call_cost.py's decode row: b1, a cache of 256, one new row appended, 8/2 heads, d64, out= given.
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 1, 8, 64, generator=g), *(torch.randn(1, 1, 2, 64, generator=g) for _ in range(2))
    kc, vc = (torch.randn(1, 256, 2, 64, generator=g) for _ in range(2))
    lens, out = torch.full((1,), 255, dtype=torch.int32), torch.empty_like(q)

    def fast():
        kvc._fast = _torch_fast.kvcache
        with torch.no_grad():
            flashc.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True, out=out)

    def slow():
        kvc._fast = False
        with torch.no_grad():
            flashc.attention_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, causal=True, out=out)

    saved = kvc._fast
    try:
        best = _best_of(fast, slow)
    finally:
        kvc._fast = saved
    # The Python path (the custom operator's dispatch, the checks, ctypes) adds ~300 us to a ~60 us call here.
    assert best[0] < 0.5 * best[1], f"extension {best[0] / 20 * 1e6:.1f} us, Python {best[1] / 20 * 1e6:.1f} us"
