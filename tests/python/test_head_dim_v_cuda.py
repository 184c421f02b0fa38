"""cuda-mma with a head dim of V different from Q/K's (issue #48): the forward (o, lse) and the backward (dq, dk, dv)
against cpu-ref in float64 on the same rounded 16-bit inputs, for the pairs of head dims it has kernels for (192/128,
DeepSeek-V2/V3's; 128/64; 64/128; and smaller head dims that run in them with zero columns), bf16 and f16, causal
and not, GQA, odd lengths, seqlen_q != seqlen_k, split keys, the deterministic dQ, varlen; and that it refuses a pair
it has no kernel for, or one of its pairs with softcap, with NotImplementedError naming head_dim_v. Every test skips
with "no CUDA device" where cuda-mma cannot run.
"""

import numpy as np
import pytest
from conftest import BACKENDS, cuda_qkv_dv

import flashc

MMA = BACKENDS.get("cuda-mma")
pytestmark = pytest.mark.skipif(MMA is None or not MMA.usable, reason="no CUDA device (or not sm_80+)")

# 16-bit inputs, fp32 accumulation: the same bound as the other cuda-mma tests against the fp64 oracle
TOL = 4e-2


def check(got, want, what):
    """Each of got's arrays within TOL·max(1, max |want|) of want's, with want's infinities (lse of rows that see
    no key) exactly, and no NaN (an element left unwritten)."""
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        assert not np.isnan(g).any(), f"{what}: {name} has NaN"
        inf = np.isinf(w)
        assert np.array_equal(np.isinf(g), inf) and np.all(g[inf] == w[inf]), f"{what}: {name} infinities differ"
        err = np.abs(g[~inf] - w[~inf]).max(initial=0.0)
        bound = TOL * max(1.0, np.abs(w[~inf]).max(initial=0.0))
        assert err <= bound, f"{what}: {name} max error {err:.3g} > {bound:.3g}"


def reference(q, k, v, dout, **opts):
    """cpu-ref's (o, lse, dq, dk, dv) in float64 on the values of the 16-bit torch tensors."""
    q, k, v, dout = (x.detach().double().cpu().numpy() for x in (q, k, v, dout))
    if "cu_seqlens_q" in opts:
        cu_q, cu_k = opts["cu_seqlens_q"], opts["cu_seqlens_k"]
        rest = {key: val for key, val in opts.items() if not key.startswith("cu_seqlens")}
        o, lse = flashc.attention_varlen(q, k, v, cu_q, cu_k, backend="cpu-ref", return_lse=True, **rest)
    else:
        o, lse = flashc.attention(q, k, v, backend="cpu-ref", return_lse=True, **opts)
    dq, dk, dv = flashc.attention_backward(dout, q, k, v, o, lse, backend="cpu-ref", **opts)
    return o, lse, dq, dk, dv


# name, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v), options
CASES = [
    ("192/128", (2, 200, 200, 4, 4, 192, 128), {}),
    ("192/128-causal-gqa", (1, 257, 300, 8, 2, 192, 128), dict(causal=True)),
    ("192/128-window-sq<sk", (1, 100, 333, 2, 1, 192, 128), dict(window=(64, 0))),
    ("192/128-split-keys", (1, 3, 700, 2, 1, 192, 128), dict(num_splits=4)),
    ("192/128-deterministic", (2, 130, 70, 2, 2, 192, 128), dict(causal=True, deterministic=True)),
    ("128/64-causal-sq>sk", (2, 129, 77, 4, 2, 128, 64), dict(causal=True)),
    ("128/64-decode", (1, 1, 1000, 2, 1, 128, 64), {}),
    ("64/128", (2, 300, 211, 2, 2, 64, 128), {}),
    ("64/128-causal-gqa-deterministic", (1, 190, 190, 6, 2, 64, 128), dict(causal=True, deterministic=True)),
    ("170/100-zero-columns", (1, 70, 90, 2, 2, 170, 100), dict(causal=True)),
    ("100/50-zero-columns", (1, 65, 33, 3, 1, 100, 50), {}),
    ("40/120-zero-columns", (2, 17, 129, 2, 2, 40, 120), dict(scale=-0.3)),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", CASES, ids=[c[0] for c in CASES])
def test_dense(name, shape, opts, dtype):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    torch.manual_seed(0)
    q, k, v, dout = cuda_qkv_dv(torch, shape, dtype)
    want = reference(q, k, v, dout, **{key: val for key, val in opts.items() if key != "num_splits"})
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = ft.attention(q, k, v, backend="cuda-mma", return_lse=True, **opts)
    o.backward(dout)
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, q.grad, k.grad, v.grad))
    check(got, want, f"{name} cuda-mma {dtype}")


def test_unaligned_rows():
    """Rows that do not start on 16 bytes (head dims 192 + 1 and 128 + 3 of storage): the kernels' plain loads."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    tdt = torch.bfloat16
    q = torch.randn(1, 90, 2, 193, dtype=tdt, device="cuda")[..., :192]
    k = torch.randn(1, 111, 2, 193, dtype=tdt, device="cuda")[..., :192]
    v = torch.randn(1, 111, 2, 131, dtype=tdt, device="cuda")[..., :128]
    dout = torch.randn(1, 90, 2, 128, dtype=tdt, device="cuda")
    want = reference(q, k, v, dout, causal=True)
    o, lse = flashc.attention(q, k, v, causal=True, backend="cuda-mma", return_lse=True)
    dq, dk, dv = flashc.attention_backward(dout, q, k, v, o, lse, causal=True, backend="cuda-mma")
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, dq, dk, dv))
    check(got, want, "unaligned 192/128 cuda-mma")


LENS_Q, LENS_K = [37, 0, 5, 64, 1, 200], [29, 7, 0, 70, 300, 150]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d,dv,causal", [(192, 128, True), (128, 64, False), (64, 128, True)])
def test_varlen(d, dv, causal, dtype):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    torch.manual_seed(2)
    hq, hkv = 4, 2
    cu_q, cu_k = np.cumsum([0] + LENS_Q).astype(np.int32), np.cumsum([0] + LENS_K).astype(np.int32)
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt, device="cuda") for s in ((int(cu_q[-1]), hq, d), (int(cu_k[-1]), hkv, d)))
    v, dout = (torch.randn(s, dtype=tdt, device="cuda") for s in ((int(cu_k[-1]), hkv, dv), (int(cu_q[-1]), hq, dv)))
    want = reference(q, k, v, dout, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = ft.attention_varlen(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), causal=causal, backend="cuda-mma",
                                 return_lse=True)  # fmt: skip
    o.backward(dout)
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, q.grad, k.grad, v.grad))
    check(got, want, f"varlen {d}/{dv} causal={causal} cuda-mma {dtype}")


@pytest.mark.parametrize("d,dv", [(64, 32), (192, 64), (256, 128), (128, 96), (96, 120)])
def test_refuses_pairs_without_a_kernel(d, dv):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 16, 2, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 16, 2, dv, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match=f"head_dim_v {dv} with head_dim {d} is not supported on backend "):
        flashc.attention(q, q, v, backend="cuda-mma")
    o = torch.zeros(1, 16, 2, dv, dtype=torch.bfloat16, device="cuda")
    lse = torch.zeros(1, 2, 16, dtype=torch.float32, device="cuda")
    with pytest.raises(NotImplementedError, match=f"flashc_backward: head_dim_v {dv} with head_dim {d}"):
        flashc.attention_backward(o, q, q, v, o, lse, backend="cuda-mma")


def test_refuses_a_pair_with_softcap():
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 16, 2, 192, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match="head_dim_v 128 .* softcap"):
        flashc.attention(q, q, v, softcap=5.0, backend="cuda-mma")


def test_auto_runs_a_pair_on_cuda():
    """auto with device tensors of a pair cuda-mma has: a CUDA backend runs it (not refused for head_dim_v)."""
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 33, 2, 192, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 33, 2, 128, dtype=torch.bfloat16, device="cuda")
    o = flashc.attention(q, q, v)
    assert o.shape == (1, 33, 2, 128) and BACKENDS[flashc.last_backend()].device == "cuda"
