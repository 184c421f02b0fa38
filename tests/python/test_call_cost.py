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
from flashc import _ops, _torch_fast  # noqa: E402
from flashc import kvcache as kvc  # noqa: E402
from conftest import spy  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_fast.AVAILABLE, reason=f"no torch extension: {_torch_fast.WHY}")

PACKAGE = pathlib.Path(flashc.__file__).resolve().parent
SLOW_PATH = {PACKAGE / "_ops.py", PACKAGE / "_lib.py", PACKAGE / "_api.py", PACKAGE / "_arrays.py"}


def _inputs(shape=(1, 16, 8, 64), grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).requires_grad_(grad) for _ in range(3))


def _modifiers(kind: str, shape=(1, 16, 8, 64)) -> dict:
    """attention()'s keyword arguments for a call with ALiBi slopes and/or an attn_mask (no gradient) for q, k, v of
    shape [b, s, h, d]: "plain" none, "alibi" slopes [h], "mask" a bool padding mask [b, 1, 1, s] that hides the last
    quarter of the keys of every sequence but the first."""
    b, s, h, _ = shape
    if kind == "plain":
        return {}
    if kind == "alibi":
        return dict(alibi_slopes=2.0 ** -torch.arange(1.0, h + 1))
    lens = torch.tensor([s] + [s - s // 4] * (b - 1))
    return dict(attn_mask=(torch.arange(s) < lens[:, None])[:, None, None, :])


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


@pytest.mark.parametrize("kind", ["plain", "alibi", "mask"])
def test_forward_runs_no_python_of_the_ctypes_path(kind):
    q, k, v = _inputs()
    kw = _modifiers(kind)

    def call():
        with torch.no_grad():
            ft.attention(q, k, v, causal=True, **kw)

    call()  # warm: the options cache, the handle
    files = _python_frames(call)
    assert not _ctypes_files(files), f"the forward ran {_ctypes_files(files)}"
    ours = [name for f, name in files if f.parent == PACKAGE]
    # attention and _torch_fast.forward (the common call's short path), where the ctypes path runs some 20
    # (fwd_impl, _readable x3, _run, _check_backend, _handle, ...)
    assert len(ours) <= 3, f"{len(ours)} Python frames of flashc per forward: {ours}"


@pytest.mark.parametrize("kind", ["plain", "alibi", "mask"])
def test_forward_backward_runs_no_python_of_the_ctypes_path(kind):
    q, k, v = _inputs(grad=True)
    dout = torch.randn_like(q)
    kw = _modifiers(kind)

    def call():
        ft.attention(q, k, v, causal=True, **kw).backward(dout)

    call()
    files = _python_frames(call)
    assert not _ctypes_files(files), f"forward+backward ran {_ctypes_files(files)}"


@pytest.mark.parametrize("kind", ["plain", "alibi", "mask"])
def test_python_path_is_what_the_structural_tests_would_catch(monkeypatch, kind):
    # The check above can fail: through _ops (the path without the extension) the same call runs _ops.py.
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    q, k, v = _inputs()
    kw = _modifiers(kind)
    with torch.no_grad():
        files = _python_frames(lambda: ft.attention(q, k, v, causal=True, **kw))
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


@pytest.mark.parametrize("kind", ["plain", "alibi", "mask"])
def test_extension_is_cheaper_than_the_python_path(monkeypatch, kind):
    q, k, v = _inputs()
    kw = _modifiers(kind)

    def fast():
        ft._kernels = _torch_fast
        with torch.no_grad():
            ft.attention(q, k, v, causal=True, **kw)

    def slow():
        ft._kernels = _torch_fast.PYTHON_PATH
        with torch.no_grad():
            ft.attention(q, k, v, causal=True, **kw)

    monkeypatch.setattr(ft, "_kernels", _torch_fast)  # restored after the test
    best = _best_of(fast, slow)
    # The ctypes path adds ~30 us of Python to a ~30 us call here (ALiBi or a mask: more); the margin leaves room
    # for a noisy machine.
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


# ---- ALiBi and an attn_mask without its gradient: the same short path -----------------------------------------
def _mixed(seed=8):
    """q [2, 19, 4, 32] over k, v [2, 23, 2, 32] (GQA; seqlen_q != seqlen_k: the mask's 4 dimensions differ), dout."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 19, 4, 32), (2, 23, 2, 32), (2, 23, 2, 32), (2, 19, 4, 32))
    return tuple(torch.randn(*shape, generator=g) for shape in shapes)


def _modifier_cases(seed=9) -> dict:
    """name -> attention()'s keyword arguments for _mixed's shapes, one layout the C API's fields describe each."""
    g = torch.Generator().manual_seed(seed)
    pad = torch.arange(23) < torch.tensor([23, 11])[:, None]  # [b, s_k]: the second sequence has 11 keys
    bias = torch.randn(2, 4, 23, 19, generator=g).transpose(-1, -2)  # [b, h, s_q, s_k], not contiguous
    return {
        "alibi": dict(alibi_slopes=torch.rand(4, generator=g)),
        "alibi-batch": dict(alibi_slopes=torch.rand(2, 4, generator=g)),
        "bool-padding": dict(attn_mask=pad[:, None, None, :]),
        "bool-expanded": dict(attn_mask=pad[:, None, None, :].expand(2, 4, 19, 23)),  # stride 0 on sizes > 1
        "float-2d": dict(attn_mask=torch.randn(19, 23, generator=g)),
        "alibi-float": dict(alibi_slopes=torch.rand(2, 4, generator=g), attn_mask=bias),
    }


@pytest.mark.parametrize("case", list(_modifier_cases()))
def test_modifiers_take_the_extension_and_match_python_path(monkeypatch, case):
    q, k, v, dout = _mixed()
    kw = _modifier_cases()[case]
    ran, fell_back = [], []
    spy(monkeypatch, _torch_fast, ("_fwd", "_bwd"), ran)
    spy(monkeypatch, _ops, ("fwd_impl", "bwd_impl"), fell_back)

    def run(backend, dtype=torch.float32):
        xs = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
        args = {n: t.to(dtype) if n == "attn_mask" and t.is_floating_point() else t for n, t in kw.items()}
        out, lse = ft.attention(*xs, causal=True, backend=backend, return_lse=True, **args)
        out.backward(dout.to(dtype))
        with torch.no_grad():  # forward alone: the same out and lse
            again = ft.attention(*xs, causal=True, backend=backend, return_lse=True, **args)
        assert torch.equal(again[0], out.detach()) and torch.equal(again[1], lse)
        return [out.detach(), lse] + [x.grad for x in xs]

    fast = run("auto")
    assert flashc.last_backend() == "cpu"
    assert not fell_back, "the extension refused the call: it ran through _ops"
    # the operators ran with the slopes and the mask as given (their last two arguments)
    assert [name for name, _ in ran] == ["_fwd", "_bwd", "_fwd"]
    for _, a in ran:
        assert a[-2] is kw.get("alibi_slopes") and a[-1] is kw.get("attn_mask")
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    slow = run("auto")
    ref = run("cpu-ref", torch.float64)
    for a, b, r in zip(fast, slow, ref):
        assert torch.equal(a, b)  # the same C calls on the same data: bit-identical
        torch.testing.assert_close(a.double(), r.double(), atol=2e-5, rtol=2e-5)


def test_mask_that_needs_its_gradient_keeps_the_general_autograd(monkeypatch):
    # A float mask that requires grad runs flashc.torch's _Function: the forward through the extension, the backward
    # (with dbias) through _ops; mask.grad is the Python path's to the bit.
    q, k, v, dout = _mixed()
    bias = _modifier_cases()["alibi-float"]["attn_mask"]
    backward_calls = []
    spy(monkeypatch, _ops, ("bwd_impl",), backward_calls)

    def run():
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        m = bias.detach().clone().requires_grad_()
        out = ft.attention(*xs, causal=True, attn_mask=m)
        out.backward(dout)
        return [out.detach(), m.grad] + [x.grad for x in xs]

    fast = run()
    assert len(backward_calls) == 1 and backward_calls[0][1][21] is True  # want_dbias
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    slow = run()
    assert fast[1] is not None and fast[1].shape == bias.shape
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "case",
    [
        dict(alibi_slopes=torch.rand(2, 4).double()),  # converted to float32
        dict(alibi_slopes=torch.rand(4, 2).t()),  # not contiguous: copied
        dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]),  # a list: flashc.torch's general path makes it a tensor
        dict(attn_mask=torch.randn(19, 23).double()),  # converted to q's dtype
        dict(attn_mask=[[True] * 23] * 19),  # a list: made a tensor
    ],
    ids=["alibi-float64", "alibi-strided", "alibi-list", "mask-float64", "mask-list"],
)
def test_modifiers_the_python_path_converts_give_its_results(monkeypatch, case):
    q, k, v, dout = _mixed()

    def run():
        xs = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out, lse = ft.attention(*xs, causal=True, return_lse=True, **case)
        out.backward(dout)
        return [out.detach(), lse] + [x.grad for x in xs]

    fast = run()
    monkeypatch.setattr(ft, "_kernels", _torch_fast.PYTHON_PATH)
    for a, b in zip(fast, run()):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "case",
    [
        dict(alibi_slopes=torch.rand(3)),  # not one slope per query head
        dict(alibi_slopes=torch.rand(3, 4)),  # not one row per sequence
        dict(alibi_slopes=torch.rand(1, 2, 4)),  # rank 3
        dict(attn_mask=torch.ones(19, 22, dtype=torch.bool)),  # does not broadcast to [b, h_q, s_q, s_k]
        dict(attn_mask=torch.ones(2, 2, 19, 23, dtype=torch.bool)),  # k's heads, not q's
        dict(attn_mask=torch.ones(23, dtype=torch.bool)),  # rank 1
        dict(attn_mask=torch.ones(1, 2, 1, 1, 23, dtype=torch.bool)),  # rank 5
        dict(attn_mask=torch.ones(19, 23, dtype=torch.int32)),  # neither bool nor float
    ],
)
def test_modifier_errors_are_the_python_paths(monkeypatch, case):
    q, k, v, _ = _mixed()
    errors = []
    for kernels in (_torch_fast, _torch_fast.PYTHON_PATH):
        monkeypatch.setattr(ft, "_kernels", kernels)
        for grad in (False, True):
            xs = [x.detach().clone().requires_grad_(grad) for x in (q, k, v)]
            with pytest.raises(Exception) as e:
                ft.attention(*xs, causal=True, **case)
            errors.append((type(e.value), str(e.value)))
    assert errors[0][1].startswith("flashc: ") and len(set(errors)) == 1, errors


def test_packed_tensors_with_a_mask_raise_the_python_paths_error():
    # flashc::fwd's kernel with cu_seqlens and an attn_mask: the extension refuses it, _ops says why.
    q, k, v, _ = (x.reshape(-1, *x.shape[2:]) for x in _mixed())
    cu_q, cu_k = torch.tensor([0, 19, 38], dtype=torch.int32), torch.tensor([0, 23, 46], dtype=torch.int32)
    opts = (None, True, -1, -1, False, "auto", -1, False, 0.0)
    errors = []
    for impl in (_torch_fast.fwd_impl, _ops.fwd_impl):
        with pytest.raises(ValueError) as e:
            impl(q, k, v, cu_q, cu_k, *opts, None, None, None, torch.ones(19, 23, dtype=torch.bool))
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "packed (varlen)" in errors[0]


def test_operators_run_the_modifiers_through_the_extension(monkeypatch):
    # torch.ops.flashc.fwd / bwd (what torch.compile and torch.export call) on CPU tensors: the extension's kernels,
    # the same results as _ops's; flashc_ext's schemas take the slopes and the mask by name, or not at all.
    q, k, v, dout = _mixed()
    kw = _modifier_cases()["alibi-float"]
    slopes, mask = kw["alibi_slopes"], kw["attn_mask"]
    opts = (None, True, -1, -1, False, "auto", -1, False, 0.0)
    ran, fell_back = [], []
    spy(monkeypatch, _torch_fast, ("_fwd", "_bwd"), ran)
    spy(monkeypatch, _ops, ("fwd_impl", "bwd_impl"), fell_back)
    out, lse = torch.ops.flashc.fwd(q, k, v, None, None, *opts, None, None, slopes, mask)
    grads = torch.ops.flashc.bwd(dout, q, k, v, out, lse, None, None, *opts, None, None, slopes, mask)
    assert [name for name, _ in ran] == ["_fwd", "_bwd"] and not fell_back
    monkeypatch.undo()
    want = _ops.fwd_impl(q, k, v, None, None, *opts, None, None, slopes, mask)
    assert all(torch.equal(a, b) for a, b in zip((out, lse), want))
    want = _ops.bwd_impl(dout, q, k, v, out, lse, None, None, *opts, None, None, slopes, mask)
    assert all(torch.equal(a, b) for a, b in zip(grads, want))
    oid = _torch_fast.options_id(opts)
    named = torch.ops.flashc_ext.fwd(q, k, v, None, None, oid, alibi_slopes=slopes, attn_mask=mask)
    assert all(torch.equal(a, b) for a, b in zip(named, (out, lse)))
    plain = torch.ops.flashc_ext.fwd(q, k, v, None, None, oid)  # the schema's defaults: neither
    assert torch.equal(plain[0], _ops.fwd_impl(q, k, v, None, None, *opts)[0]) and not torch.equal(plain[0], out)


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
