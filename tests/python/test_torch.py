"""The torch path on the CPU: tensors by data_ptr and strides, autograd, gradcheck in float64 on cpu-ref."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402
from flashc.testing.reference import numpy_backward, numpy_forward  # noqa: E402

from conftest import cpu_backend_params, need_backend  # noqa: E402


def t(rng, *shape, dtype=torch.float32, grad=False):
    x = torch.from_numpy(rng.standard_normal(shape)).to(dtype)
    return x.requires_grad_(grad)


def close(got, want, tol):
    got = got.detach().double().numpy()
    assert np.all(np.isfinite(got))
    err = np.abs(got - want).max()
    assert err <= tol * max(1.0, np.abs(want).max()), f"max |error| {err:.3g}"


@pytest.mark.parametrize("name", cpu_backend_params())
@pytest.mark.parametrize(
    "dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2), (torch.float16, 4e-3)], ids=["f32", "bf16", "f16"]
)
def test_forward_backward_match_the_reference(name, rng, dtype, tol):
    b = need_backend(name)
    if {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype] not in b.dtypes:
        pytest.skip(f"{name} has no {dtype}")
    q, k, v = t(rng, 2, 37, 6, 40, dtype=dtype), t(rng, 2, 53, 2, 40, dtype=dtype), t(rng, 2, 53, 2, 40, dtype=dtype)
    o, lse = flashc.attention(q, k, v, causal=True, window=(20, None), backend=name, return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == dtype and o.shape == q.shape and lse.dtype == torch.float32
    ro, _ = numpy_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), True, (20, None))
    close(o, ro, tol)
    if not b.has_backward:
        return
    dout = t(rng, *q.shape, dtype=dtype)
    grads = flashc.attention_backward(dout, q, k, v, o, lse, causal=True, window=(20, None), backend=name)
    want = numpy_backward(*(x.double().numpy() for x in (dout, q, k, v)), True, (20, None))
    for g, w in zip(grads, want):
        assert g.dtype == dtype
        close(g, w, tol)


@pytest.mark.parametrize("name", cpu_backend_params())
def test_autograd_gives_the_reference_gradients(name, rng):
    b = need_backend(name)
    if not b.has_backward:
        pytest.skip(f"{name} has no backward")
    q, k, v = (t(rng, 2, 45, 4, 32, grad=True) for _ in range(3))
    bhsd = t(rng, 2, 4, 45, 32).requires_grad_(True)
    k_view = bhsd.transpose(1, 2)  # non-contiguous [b, s, h, d] view: its gradient flows back through it
    o = ft.attention(q, k_view, v, causal=True, backend=name)
    (o * o).sum().backward()
    qn, kn, vn = (x.detach().double().numpy() for x in (q, k_view, v))
    ro, _ = numpy_forward(qn, kn, vn, True)
    want = numpy_backward(2 * ro, qn, kn, vn, True)
    close(q.grad, want[0], 1e-4)
    close(bhsd.grad.transpose(1, 2), want[1], 1e-4)
    close(v.grad, want[2], 1e-4)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(causal=False),
        dict(causal=True),
        dict(causal=True, window=(3, None), scale=0.3),
        dict(causal=True, causal_align="top-left"),
    ],
    ids=["full", "causal", "window-scale", "top-left"],
)
def test_gradcheck_fp64_cpu_ref(rng, kwargs, cpu_ref):
    q = t(rng, 1, 7, 4, 8, dtype=torch.float64, grad=True)
    k = t(rng, 1, 9, 2, 8, dtype=torch.float64, grad=True)  # GQA 2:1, sq != sk
    v = t(rng, 1, 9, 2, 8, dtype=torch.float64, grad=True)
    fn = lambda q, k, v: ft.attention(q, k, v, backend="cpu-ref", **kwargs)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_gradcheck_varlen(rng, cpu_ref):
    cq, ck = torch.tensor([0, 3, 8], dtype=torch.int32), [0, 4, 6]
    q = t(rng, 8, 2, 4, dtype=torch.float64, grad=True)
    k = t(rng, 6, 1, 4, dtype=torch.float64, grad=True)
    v = t(rng, 6, 1, 4, dtype=torch.float64, grad=True)
    fn = lambda q, k, v: ft.attention_varlen(q, k, v, cq, ck, causal=True, backend="cpu-ref")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_module(rng, cpu_ref):
    m = ft.FlashAttention(causal=True, backend="cpu-ref")
    assert "causal=True" in repr(m) and list(m.parameters()) == []
    q, k, v = (t(rng, 1, 10, 2, 8, grad=True) for _ in range(3))
    m(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    packed = [x[0].detach().requires_grad_(True) for x in (q, k, v)]
    out = m(*packed, [0, 4, 10], [0, 4, 10])
    assert out.shape == (10, 2, 8)


def test_matches_pytorch_sdpa(rng, cpu_ref):
    """Against PyTorch itself (top-left causal is PyTorch's is_causal)."""
    q, k, v = t(rng, 2, 30, 4, 16), t(rng, 2, 40, 4, 16), t(rng, 2, 40, 4, 16)
    o = flashc.attention(q, k, v, causal=True, causal_align="top-left", backend="cpu-ref")
    want = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True)
    torch.testing.assert_close(o, want.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_outputs_in_place_and_cu_seqlens_tensors(rng, cpu_ref):
    q, k, v = (t(rng, 12, 2, 8) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    got = flashc.attention_varlen(
        q, k, v, torch.tensor([0, 5, 12]), torch.tensor([0, 5, 12]), out=out, backend="cpu-ref"
    )
    assert got is out and torch.isfinite(out).all()


def test_torch_errors(rng, cpu_ref):
    q = t(rng, 1, 8, 2, 8)
    with pytest.raises(TypeError, match="numpy array but q is a torch"):
        flashc.attention(q, q.numpy(), q)
    with pytest.raises(TypeError, match="int32"):
        flashc.attention(q, q.to(torch.int32), q)
    with pytest.raises(ValueError, match="device 'meta'"):
        flashc.attention(q, q.to("meta"), q)
    with pytest.raises(ValueError, match="lse is on|lse has shape"):
        o, lse = flashc.attention(q, q, q, return_lse=True)
        flashc.attention_backward(o, q, q, q, o, lse[:, :1])
    with pytest.raises(TypeError, match="sparse|layout|strides|torch"):
        flashc.attention(q.to_sparse(), q, q)
