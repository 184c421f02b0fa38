"""Varlen offsets on the tensors' device with max_seqlen_q/k, as flash_attn_varlen_func takes them
(flashc_params.cu_seqlens_device): flashc.torch passes CUDA cu_seqlens straight to the kernels, so a call waits for
nothing on the host and a CUDA graph can capture the forward and the backward, whose replays read the offsets as
they are then. On the CPU: max_seqlen's checks, and host offsets unchanged by it (opcheck with the new arguments).
The CUDA cases skip with "no CUDA device"."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402
from flashc import _ops  # noqa: E402
from conftest import need_extension, spy  # noqa: E402

needs_ops = pytest.mark.skipif(not _ops.HAVE_OPS, reason=f"torch {torch.__version__} has no torch.library.custom_op")
OPTS = (None, True, -1, -1, False, "auto", -1, False)  # scale ... deterministic, as the operators take them
LENS_Q, LENS_K = [97, 0, 130, 1], [113, 5, 64, 130]  # odd lengths, an empty query sequence


def offsets(lens, device="cpu"):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def packed(gen, lens_q, lens_k, hq=4, hk=2, d=64, dtype=torch.float32, device="cpu", grad=False):
    def t(rows, heads):
        x = torch.randn(rows, heads, d, generator=gen, dtype=torch.float32).to(device, dtype)
        return x.requires_grad_(grad)

    return t(sum(lens_q), hq), t(sum(lens_k), hk), t(sum(lens_k), hk)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(47)


# ---- CPU -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 2.5, True, "7"])
def test_max_seqlen_is_checked(gen, bad):
    q, k, v = packed(gen, LENS_Q, LENS_K)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        ft.attention_varlen(q, k, v, offsets(LENS_Q), offsets(LENS_K), max_seqlen_q=bad)


def test_host_offsets_ignore_max_seqlen(gen):
    """With offsets on the host the library reads the lengths itself: max_seqlen changes no bit, forward or
    backward (through the autograd path that carries it)."""
    q, k, v = packed(gen, LENS_Q, LENS_K, grad=True)
    cq, ck = offsets(LENS_Q), offsets(LENS_K)
    o = ft.attention_varlen(q, k, v, cq, ck, causal=True)
    g = torch.autograd.grad(o.square().sum(), (q, k, v))
    o2 = ft.attention_varlen(q, k, v, cq, ck, causal=True, max_seqlen_q=130, max_seqlen_k=130)
    g2 = torch.autograd.grad(o2.square().sum(), (q, k, v))
    assert torch.equal(o, o2)
    assert all(torch.equal(a, b) for a, b in zip(g, g2))


@needs_ops
def test_opcheck_with_max_seqlen(gen):
    q, k, v = packed(gen, LENS_Q, LENS_K, grad=True)
    cq, ck = offsets(LENS_Q), offsets(LENS_K)
    extra = (0.0, None, None, None, None, 0.0, 0, 0, 0)  # softcap ... num_splits, at their defaults
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, cq, ck, *OPTS, *extra, 130, 130))
    o, lse = torch.ops.flashc.fwd(q.detach(), k.detach(), v.detach(), cq, ck, *OPTS, *extra, 130, 130)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, cq, ck, *OPTS, *extra[:-1], 130, 130)
    torch.library.opcheck(torch.ops.flashc.bwd.default, args)


# ---- CUDA ----------------------------------------------------------------------------------------------------------
def _cuda_backends():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    names = [b.name for b in flashc.backends() if b.name in ("cuda-mma", "cuda-hopper") and b.usable]
    if not names:
        pytest.skip("no usable cuda-mma or cuda-hopper here (a build without CUDA, or a GPU before sm_80)")
    return names


@pytest.mark.parametrize("backend", ["cuda-mma", "cuda-hopper"])
def test_device_offsets_match_host_offsets(gen, backend):
    """The same call with the offsets on the device and the exact longest lengths gives the bits of host offsets,
    forward and backward, GQA and causal; torch's sync debug mode sees no synchronising call in it."""
    if backend not in _cuda_backends():
        pytest.skip(f"{backend} is not usable here")
    q, k, v = packed(gen, LENS_Q, LENS_K, dtype=torch.bfloat16, device="cuda", grad=True)
    dout = torch.randn_like(q)
    kw = dict(causal=True, backend=backend, deterministic=True)  # dQ's adds in a fixed order: bits comparable
    o = ft.attention_varlen(q, k, v, offsets(LENS_Q), offsets(LENS_K), **kw)
    g = torch.autograd.grad(o, (q, k, v), dout)
    cq, ck = offsets(LENS_Q, "cuda"), offsets(LENS_K, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o2 = ft.attention_varlen(q, k, v, cq, ck, max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K), **kw)
        g2 = torch.autograd.grad(o2, (q, k, v), dout)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(o, o2)
    assert all(torch.equal(a, b) for a, b in zip(g, g2))
    # max_seqlen not known: the packed rows bound it, a different grid and the same results to rounding
    o3 = ft.attention_varlen(q, k, v, cq, ck, **kw)
    torch.testing.assert_close(o3, o, atol=2e-2, rtol=2e-2)


def test_device_offsets_take_the_extension(gen, monkeypatch):
    """With the C++ extension loaded, a varlen call with device offsets runs through flashc_ext::fwd and bwd (no
    Python marshalling of the call), given max_seqlen_q/k; the operators ran (a refusal there would fall back)."""
    _cuda_backends()
    ran = []
    spy(monkeypatch, need_extension(), ("_fwd", "_bwd"), ran)
    q, k, v = packed(gen, LENS_Q, LENS_K, dtype=torch.bfloat16, device="cuda", grad=True)
    cq, ck = offsets(LENS_Q, "cuda"), offsets(LENS_K, "cuda")
    o = ft.attention_varlen(q, k, v, cq, ck, causal=True, max_seqlen_q=max(LENS_Q), max_seqlen_k=max(LENS_K))
    o.float().square().sum().backward()
    # max_seqlen_q/k by position in the schemas: fwd(q, k, v, cu_q, cu_k, options, max_q, max_k, alibi, mask),
    # bwd(dout, q, k, v, out, lse, cu_q, cu_k, options, max_q, max_k, alibi, mask)
    at = {"_fwd": slice(6, 8), "_bwd": slice(9, 11)}
    assert [(name, tuple(a[at[name]])) for name, a in ran] == [("_fwd", (130, 130)), ("_bwd", (130, 130))]


def test_cuda_graph_captures_varlen_forward_and_backward(gen):
    """Forward + backward through flashc.torch with device offsets, captured once, replayed with new q, k, v, dout
    and new offsets (the same totals, sequences no longer than max_seqlen): the replay gives what an eager call on
    the new data gives, so the kernels read the offsets on the device at replay time."""
    backend = _cuda_backends()[0]
    lens_q2, lens_k2 = [30, 130, 67, 1], [130, 2, 50, 130]  # new splits of the same totals (228 and 312 rows)
    assert sum(lens_q2) == sum(LENS_Q) and sum(lens_k2) == sum(LENS_K)
    max_q, max_k = 130, 130
    q, k, v = packed(gen, LENS_Q, LENS_K, dtype=torch.bfloat16, device="cuda", grad=True)
    dout = torch.randn_like(q)
    cq, ck = offsets(LENS_Q, "cuda"), offsets(LENS_K, "cuda")

    def step():
        o = ft.attention_varlen(
            q, k, v, cq, ck, causal=True, backend=backend, deterministic=True, max_seqlen_q=max_q, max_seqlen_k=max_k
        )
        return (o, *torch.autograd.grad(o, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on the capture stream: flashc's handle and workspace for it
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        captured = step()

    with torch.no_grad():
        for x in (q, k, v, dout):
            x.normal_()
        cq.copy_(offsets(lens_q2, "cuda"))
        ck.copy_(offsets(lens_k2, "cuda"))
    graph.replay()
    torch.cuda.synchronize()
    got = [x.clone() for x in captured]
    want = step()  # eager, on the same data and offsets
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        assert torch.equal(a, b), f"{name}: the replay differs from an eager call on the new offsets"
    # and the new offsets really changed the problem: host offsets of the old split give another o
    old = ft.attention_varlen(q, k, v, offsets(LENS_Q), offsets(LENS_K), causal=True, backend=backend)
    assert not torch.equal(old, want[0])
    # and with the new split on the host, the same o as the replay's (to rounding: another grid may run)
    new = ft.attention_varlen(q, k, v, offsets(lens_q2), offsets(lens_k2), causal=True, backend=backend)
    torch.testing.assert_close(new, got[0], atol=2e-2, rtol=2e-2)
