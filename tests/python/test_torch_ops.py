"""flashc as PyTorch operators (torch.ops.flashc.fwd / bwd): opcheck, torch.compile(fullgraph=True), torch.export,
fake and meta tensors, lse on the autograd path, the double-backward refusal, autocast, threads, vmap."""

import threading
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402
from flashc import _ops  # noqa: E402
from flashc.testing.reference import numpy_backward, numpy_forward  # noqa: E402

from conftest import need_backend, need_extension, spy  # noqa: E402

needs_ops = pytest.mark.skipif(not _ops.HAVE_OPS, reason=f"torch {torch.__version__} has no torch.library.custom_op")
# The operators' option arguments: scale, causal, window_left, window_right, top_left, backend, threads,
# deterministic.
OPTS = (None, True, 5, -1, False, "auto", -1, False)


def t(rng, *shape, dtype=torch.float32, grad=False):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype).requires_grad_(grad)


def qkv(rng, grad=False, b=2, sq=13, sk=17, hq=4, hk=2, d=16):
    return t(rng, b, sq, hq, d, grad=grad), t(rng, b, sk, hk, d, grad=grad), t(rng, b, sk, hk, d, grad=grad)


def packed(rng, grad=False):
    cq, ck = torch.tensor([0, 5, 5, 12], dtype=torch.int32), torch.tensor([0, 3, 9, 16], dtype=torch.int32)
    return (t(rng, 12, 4, 8, grad=grad), t(rng, 16, 2, 8, grad=grad), t(rng, 16, 2, 8, grad=grad)), (cq, ck)


@needs_ops
def test_opcheck_dense(rng):
    q, k, v = qkv(rng, grad=True)
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, None, None, *OPTS))
    o, lse = _ops.fwd_impl(q.detach(), k.detach(), v.detach(), None, None, *OPTS)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, None, None, *OPTS)
    torch.library.opcheck(torch.ops.flashc.bwd.default, args)


@needs_ops
def test_opcheck_varlen(rng):
    (q, k, v), (cq, ck) = packed(rng, grad=True)
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, cq, ck, *OPTS))
    o, lse = _ops.fwd_impl(q.detach(), k.detach(), v.detach(), cq, ck, *OPTS)
    assert lse.shape == (4, 12)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, cq, ck, *OPTS)
    torch.library.opcheck(torch.ops.flashc.bwd.default, args)


def test_eager_and_operator_paths_agree(rng):
    """flashc.torch.attention runs the kernels directly in plain eager mode; the operator gives the same bits."""
    q, k, v = qkv(rng)
    o, lse = ft.attention(q, k, v, causal=True, window=(5, None), return_lse=True)
    if _ops.HAVE_OPS:
        o2, lse2 = torch.ops.flashc.fwd(q, k, v, None, None, *OPTS)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)
    ro, rlse = numpy_forward(*(x.double().numpy() for x in (q, k, v)), True, (5, None))
    np.testing.assert_allclose(o.double().numpy(), ro, atol=2e-5)
    np.testing.assert_allclose(lse.double().numpy(), rlse, atol=2e-5)


@needs_ops
def test_num_splits_reaches_the_operator(rng):
    """num_splits, flashc::fwd's last argument (the forward's key splits; the CPU backends ignore a count): opcheck
    passes with it, the bits and the gradients are the default's, and a negative count comes back refused by the C
    library (so it reaches flashc_params), through the operator and through flashc.torch.attention."""
    q, k, v = qkv(rng, grad=True)
    extra = (0.0, None, None, None, None, 0.0, 0, 0)  # softcap ... dropout_offset, at their defaults
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, None, None, *OPTS, *extra, 3))
    o, lse = torch.ops.flashc.fwd(q, k, v, None, None, *OPTS, *extra, 3)
    o0, lse0 = torch.ops.flashc.fwd(q, k, v, None, None, *OPTS)
    assert torch.equal(o, o0) and torch.equal(lse, lse0)
    with pytest.raises(ValueError, match="params.num_splits is -1"):
        torch.ops.flashc.fwd(q.detach(), k.detach(), v.detach(), None, None, *OPTS, *extra, -1)
    g = torch.autograd.grad(ft.attention(q, k, v, causal=True, num_splits=2).sum(), (q, k, v))
    g0 = torch.autograd.grad(ft.attention(q, k, v, causal=True).sum(), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(g, g0))
    with pytest.raises(ValueError, match="num_splits is -2"):
        ft.attention(q, k, v, num_splits=-2)


@needs_ops
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_compile_fullgraph_forward_and_backward(rng, varlen):
    if varlen:
        (q, k, v), (cq, ck) = packed(rng, grad=True)
        fn = lambda q, k, v: ft.attention_varlen(q, k, v, cq, ck, causal=True)  # noqa: E731
    else:
        q, k, v = qkv(rng, grad=True)
        fn = lambda q, k, v: ft.attention(q, k, v, causal=True, window=(4, 2), scale=0.3)  # noqa: E731
    dout = torch.randn(q.shape)

    def step(q, k, v):
        return (fn(q, k, v) * dout).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    compiled(q, k, v).backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    step(q, k, v).backward()
    for g, x in zip(got, (q, k, v)):
        torch.testing.assert_close(g, x.grad, atol=1e-6, rtol=1e-6)


@needs_ops
@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_export(rng, strict):
    class Attn(torch.nn.Module):
        def forward(self, q, k, v):
            return ft.attention(q, k, v, causal=True, return_lse=True)

    q, k, v = qkv(rng)
    ep = torch.export.export(Attn(), (q, k, v), strict=strict)
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.flashc.fwd.default in targets, targets
    o, lse = ep.module()(q, k, v)
    want_o, want_lse = ft.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)


@needs_ops
def test_meta_and_fake_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k = torch.empty(2, 9, 4, 16, device="meta"), torch.empty(2, 11, 2, 16, device="meta")
    o, lse = ft.attention(q, k, k, causal=True, return_lse=True)
    assert o.device.type == "meta" and o.shape == q.shape and lse.shape == (2, 4, 9) and lse.dtype == torch.float32
    with FakeTensorMode():
        q, k = torch.empty(20, 4, 16, dtype=torch.bfloat16), torch.empty(30, 2, 16, dtype=torch.bfloat16)
        cu = torch.tensor([0, 20], dtype=torch.int32)
        o, lse = ft.attention_varlen(q, k, k, cu, torch.tensor([0, 30], dtype=torch.int32), return_lse=True)
        assert o.shape == q.shape and o.dtype == torch.bfloat16 and lse.shape == (4, 20)
        with pytest.raises(TypeError, match="k.dtype is torch.float32 but q.dtype is torch.bfloat16"):
            torch.ops.flashc.fwd(q, k.float(), k, cu, cu, *OPTS)


def test_return_lse_on_the_autograd_path(rng):
    q, k, v = qkv(rng, grad=True)
    o, lse = ft.attention(q, k, v, causal=True, return_lse=True)
    assert o.requires_grad and not lse.requires_grad, "lse is not differentiable (FlashAttention's rule)"
    _, want_lse = flashc.attention(q.detach(), k.detach(), v.detach(), causal=True, return_lse=True)
    assert torch.equal(lse, want_lse)
    dout = torch.randn(o.shape)
    (o * dout).sum().backward()
    want = numpy_backward(*(x.detach().double().numpy() for x in (dout, q, k, v)), True)
    for x, w in zip((q, k, v), want):
        np.testing.assert_allclose(x.grad.double().numpy(), w, atol=1e-4)


@pytest.mark.parametrize("path", ["eager", "operator"])
def test_double_backward_is_refused(rng, path):
    """A gradient penalty whose loss is linear in o: its second-order term runs through the backward kernel,
    which has no derivative, so create_graph=True must raise, not return a silently wrong gradient."""
    if path == "operator" and not _ops.HAVE_OPS:
        pytest.skip("no operators in this torch")
    q, k, v = qkv(rng, grad=True)
    w = torch.randn(q.shape)
    if path == "eager":
        o = ft.attention(q, k, v, causal=True)
    else:
        o, _ = torch.ops.flashc.fwd(q, k, v, None, None, *OPTS)
    with pytest.raises(RuntimeError, match="flashc: attention has no second derivative"):
        torch.autograd.grad((o * w).sum(), (q, k, v), create_graph=True)
    # Without create_graph the same gradient is fine.
    o = ft.attention(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad((o * w).sum(), (q, k, v))
    assert not dq.requires_grad and torch.isfinite(dq).all()


def test_autocast_casts_as_sdpa_does(rng):
    q, k, v = qkv(rng, hk=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = ft.attention(q, k, v, causal=True, causal_align="top-left")
        want = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
    assert o.dtype == want.dtype == torch.bfloat16
    # The same numbers as flashc on inputs cast by hand (the cast is the only thing autocast adds).
    by_hand = ft.attention(*(x.bfloat16() for x in (q, k, v)), causal=True, causal_align="top-left")
    assert torch.equal(o, by_hand)
    torch.testing.assert_close(o.float(), want.transpose(1, 2).float(), atol=3e-2, rtol=3e-2)


def test_mixed_dtypes_are_refused_as_sdpa_refuses_them(rng):
    q, k, v = qkv(rng)
    with pytest.raises(RuntimeError):
        torch.nn.functional.scaled_dot_product_attention(q.bfloat16(), k, v)
    with pytest.raises(TypeError, match="k.dtype is torch.float32 but q.dtype is torch.bfloat16"):
        ft.attention(q.bfloat16(), k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast both are cast, as SDPA does
        assert ft.attention(q.bfloat16(), k, v).dtype == torch.bfloat16


def _host_threads(backend: str) -> int:
    """The thread count flashc.torch last set on this thread's host handle: in the C++ extension where it runs the
    calls (flashc/_torch_fast.py), else in the Python path's handle cache."""
    from flashc import _torch_fast

    if _torch_fast.AVAILABLE:
        return _torch_fast.host_threads(backend)
    return _ops._tls.handles[(backend, -1, 0)].threads


def test_cpu_threads_follow_torch(rng):
    need_backend("cpu")
    q, k, v = qkv(rng)
    before = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            ft.attention(q, k, v, backend="cpu")
            assert _host_threads("cpu") == n
        ft.attention(q, k, v, backend="cpu", threads=3)
        assert _host_threads("cpu") == 3
    finally:
        torch.set_num_threads(before)


@needs_ops
def test_vmap_runs_and_func_grad_is_refused(rng):
    q, k, v = (t(rng, 3, 2, 7, 2, 8) for _ in range(3))
    with warnings.catch_warnings():  # torch's note that it loops over the batch (no batching rule), once a process
        warnings.simplefilter("ignore", UserWarning)
        o = torch.vmap(lambda q, k, v: ft.attention(q, k, v, causal=True))(q, k, v)
    for i in range(3):
        assert torch.equal(o[i], ft.attention(q[i], k[i], v[i], causal=True))
    with pytest.raises(NotImplementedError, match="flashc: torch.func.grad"):
        torch.func.grad(lambda q: ft.attention(q, k[0], v[0]).sum())(q[0])


def test_varlen_offsets_as_lists_and_int64(rng):
    (q, k, v), (cq, ck) = packed(rng)
    o = ft.attention_varlen(q, k, v, cq, ck, causal=True)
    assert torch.equal(o, ft.attention_varlen(q, k, v, cq.tolist(), ck.long(), causal=True))
    with pytest.raises(ValueError, match="4 offsets and cu_seqlens_k 3"):
        ft.attention_varlen(q, k, v, cq, ck[:3])


# ---- CUDA (scripts/gpu-check) ----------------------------------------------------------------------------------
def _cuda_backend():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    b = next((b for b in flashc.backends() if b.device == "cuda" and b.usable and b.has_backward), None)
    if b is None:
        pytest.skip("this libflashc has no usable CUDA backend with a backward")
    return b


@needs_ops
def test_cuda_opcheck_and_compile(rng):
    _cuda_backend()
    q, k, v = (x.to("cuda", torch.bfloat16).requires_grad_(True) for x in qkv(rng, d=64))
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, None, None, *OPTS))
    o, lse = torch.ops.flashc.fwd(q.detach(), k.detach(), v.detach(), None, None, *OPTS)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, None, None, *OPTS)
    torch.library.opcheck(torch.ops.flashc.bwd.default, args)
    step = lambda q, k, v: ft.attention(q, k, v, causal=True).float().square().sum()  # noqa: E731
    torch._dynamo.reset()
    torch.compile(step, fullgraph=True)(q, k, v).backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    step(q, k, v).backward()
    for g, x in zip(got, (q, k, v)):
        torch.testing.assert_close(g, x.grad)


@needs_ops
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen-host-offsets"])
def test_cuda_graph_capture_matches_eager(rng, varlen):
    """Capturable: no host synchronisation inside the call (varlen with host cu_seqlens), once flashc has run on
    the capture stream."""
    _cuda_backend()
    if varlen:
        (q, k, v), (cq, ck) = packed(rng)
        fn = lambda: ft.attention_varlen(q, k, v, cq, ck, causal=True)  # noqa: E731
    else:
        q, k, v = qkv(rng, d=64)
        fn = lambda: ft.attention(q, k, v, causal=True)  # noqa: E731
    q, k, v = (x.to("cuda", torch.bfloat16) for x in (q, k, v))
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="first flashc call on a CUDA stream cannot be captured"):
        with torch.cuda.graph(graph, stream=side):  # a stream flashc has not run on yet
            fn()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream (flashc's workspace for that stream)
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        got = fn()
    for x in (q, k, v):
        x.normal_()
    want = fn()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@needs_ops
def test_cuda_compile_reduce_overhead(rng):
    _cuda_backend()
    q, k, v = (x.to("cuda", torch.bfloat16) for x in qkv(rng, d=64))
    fn = lambda q, k, v: ft.attention(q, k, v, causal=True) * 2  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        got = compiled(q, k, v)
    assert torch.equal(got, fn(q, k, v))


def test_cuda_first_call_on_a_new_thread_takes_the_extension(rng, monkeypatch):
    """A thread that has made no CUDA call has no current context (torch's autograd threads are such threads): its
    first forward and backward still run through the C++ extension (it makes the device's primary context current
    before asking the driver whether the stream captures), not through the Python path after a failed driver call."""
    _cuda_backend()
    _torch_fast = need_extension()
    fell_back = []
    spy(monkeypatch, _ops, ("fwd_impl", "bwd_impl"), fell_back)
    q, k, v = (x.to("cuda", torch.bfloat16) for x in qkv(rng, d=64))
    dout = torch.randn_like(q)
    torch.cuda.synchronize()
    got, errors = {}, []

    def work():
        try:
            opts = (None, True, -1, -1, False, "auto", -1, False, 0.0)  # flashc.torch's defaults, causal
            oid = _torch_fast.options_id(opts)
            o, lse = _torch_fast.forward(q, k, v, None, None, opts, oid)
            got["o"] = o
            got["grads"] = _torch_fast.backward(dout, q, k, v, o, lse, None, None, opts, oid)
            torch.cuda.synchronize()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert not errors, errors
    assert fell_back == []  # the Python path was not taken
    assert torch.equal(got["o"], ft.attention(q, k, v, causal=True))
