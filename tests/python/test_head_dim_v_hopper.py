"""cuda-hopper with a head dim of V different from Q/K's (issue #48): the forward (o, lse) and the backward (dq, dk, dv)
against cpu-ref in float64 on the same rounded 16-bit inputs, for each pair it runs (192/128, DeepSeek-V2/V3's MLA, on
a forward kernel of its own, D = 192 with DV = 128; 128/64, 64/128 and 64/256 on the kernels of the larger head dim
with zero columns; and smaller head dims that round up to a pair's), bf16 and f16, causal and not, seqlen_q !=
seqlen_k, odd lengths (1, 77, 300), GQA, a sliding window, varlen and the deterministic backward where it is built.

FlashAttention's rule: the error against float64 is at most 2x (forward) or 3x (backward) the error of the same
maths done plainly in the 16-bit dtype (torch matmuls on the GPU, softmax in float32, autograd), plus 1e-3 of the
largest reference value. Outputs (o, lse, dq, dk, dv) are poisoned with NaN first, so that an element left unwritten
fails. Also: a pair it has no kernel for (96/160, ...) and a pair with softcap raise NotImplementedError naming
head_dim_v, deterministic 192/128 is refused (auto runs it on cuda-mma), and auto picks cuda-hopper for 192/128.
Skips with "no CUDA device" without one, and "no sm_90" where cuda-hopper is not usable.
"""

import numpy as np
import pytest
from conftest import cuda_qkv_dv, hopper_skip_reason, visible

import flashc

SKIP = hopper_skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _seqs(b, sq, sk, cu_q, cu_k):
    """(query rows, key rows) slices of each sequence: dense batch entries, or the varlen offsets."""
    if cu_q is None:
        return [((i, slice(0, sq)), (i, slice(0, sk))) for i in range(b)]
    cu_q, cu_k = [int(x) for x in cu_q], [int(x) for x in cu_k]
    return [((0, slice(cu_q[i], cu_q[i + 1])), (0, slice(cu_k[i], cu_k[i + 1]))) for i in range(len(cu_q) - 1)]


def plain(torch, q, k, v, dout, causal, window, scale, cu_q=None, cu_k=None):
    """The same attention done plainly in q's dtype on the GPU: S = Q·Kᵀ and O = P·V as 16-bit matmuls, the
    softmax in float32, P rounded to 16 bits, the gradients by autograd. Dense [b, s, h, d], or varlen with a batch
    dim of 1 added by the caller. Returns (o, lse, dq, dk, dv), lse [b, hq, sq] (varlen: [1, hq, total_q])."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    b, sq, hq, _ = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    parts, lse = [], torch.full((b, hq, sq), float("-inf"), device=q.device)
    for (bq, rq), (bk, rk) in _seqs(b, sq, sk, cu_q, cu_k):
        qs, ks, vs = q[bq, rq], k[bk, rk], v[bk, rk]
        ks, vs = (x.repeat_interleave(hq // hkv, dim=1) for x in (ks, vs))
        s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        seen = torch.from_numpy(visible(qs.shape[0], ks.shape[0], causal, window)).to(q.device)
        has_key = seen.any(-1, keepdim=True)
        # rows that see no key: a finite fill (no NaN in the softmax or its gradient), then P = 0
        s = s.float()
        fill = torch.where(has_key, torch.full_like(s, float("-inf")), torch.zeros_like(s))
        s = torch.where(seen, s, fill)
        lse[bq, :, rq] = torch.where(has_key, torch.logsumexp(s, -1, keepdim=True), float("-inf"))[..., 0].detach()
        p = (torch.softmax(s, -1) * has_key).to(q.dtype)
        parts.append(torch.einsum("hqk,khd->qhd", p, vs))
    # dense: one part per batch entry; varlen: the sequences' rows one after another (batch dim 1)
    o = torch.stack(parts) if cu_q is None else torch.cat(parts)[None]
    o.backward(dout)
    return o.detach(), lse, q.grad, k.grad, v.grad


def reference(q, k, v, dout, causal, window, scale, cu_q=None, cu_k=None):
    """cpu-ref's (o, lse, dq, dk, dv) in float64 on the values of the 16-bit torch tensors."""
    q, k, v, dout = (x.detach().double().cpu().numpy() for x in (q, k, v, dout))
    kw = dict(causal=causal, window=window, scale=scale)
    if cu_q is not None:
        o, lse = flashc.attention_varlen(q, k, v, cu_q, cu_k, backend="cpu-ref", return_lse=True, **kw)
        grads = flashc.attention_varlen_backward(dout, q, k, v, o, lse, cu_q, cu_k, backend="cpu-ref", **kw)
    else:
        o, lse = flashc.attention(q, k, v, backend="cpu-ref", return_lse=True, **kw)
        grads = flashc.attention_backward(dout, q, k, v, o, lse, backend="cpu-ref", **kw)
    return (o, lse) + tuple(grads)


def nans(torch, shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def check(what, got, want, peer):
    """FlashAttention's rule per output: max |got − want| ≤ k·max |peer − want| + 1e-3·max(1, max |want|), k = 2 for
    o and lse, 3 for the gradients; want's infinities (lse of rows that see no key) exactly; no NaN (unwritten)."""
    for name, g, w, p in zip(("o", "lse", "dq", "dk", "dv"), got, want, peer):
        g, w, p = (np.asarray(x.detach().double().cpu() if hasattr(x, "detach") else x, np.float64) for x in (g, w, p))
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        assert not np.isnan(g).any(), f"{what}: {name} has NaN (an element left unwritten)"
        inf = np.isinf(w)
        assert np.array_equal(np.isinf(g), inf) and np.all(g[inf] == w[inf]), f"{what}: {name} infinities differ"
        err = np.abs(g[~inf] - w[~inf]).max(initial=0.0)
        err_plain = np.abs(p[~inf] - w[~inf]).max(initial=0.0)
        k = 2 if name in ("o", "lse") else 3
        bound = k * err_plain + 1e-3 * max(1.0, np.abs(w[~inf]).max(initial=0.0))
        assert err <= bound, f"{what}: {name} max error {err:.3g} > {bound:.3g} (plain 16-bit: {err_plain:.3g})"


def run_hopper(torch, q, k, v, dout, causal, window, scale, deterministic=False, cu_q=None, cu_k=None):
    """cuda-hopper's forward, then its backward from that forward's o and lse, every output poisoned first."""
    kw = dict(causal=causal, window=window, scale=scale, backend="cuda-hopper")
    hq, dv = q.shape[-2], v.shape[-1]
    out = nans(torch, q.shape[:-1] + (dv,), q.dtype)
    dq, dk, dvv = nans(torch, q.shape, q.dtype), nans(torch, k.shape, k.dtype), nans(torch, v.shape, v.dtype)
    if cu_q is not None:
        lse = torch.full((hq, q.shape[0]), float("nan"), device="cuda")
        flashc.attention_varlen(q, k, v, cu_q, cu_k, out=out, lse=lse, **kw)
        flashc.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k, dq=dq, dk=dk, dv=dvv,
                                         deterministic=deterministic, **kw)  # fmt: skip
    else:
        lse = torch.full((q.shape[0], hq, q.shape[1]), float("nan"), device="cuda")
        flashc.attention(q, k, v, out=out, lse=lse, **kw)
        flashc.attention_backward(dout, q, k, v, out, lse, dq=dq, dk=dk, dv=dvv, deterministic=deterministic, **kw)
    assert flashc.last_backend() == "cuda-hopper"
    return out, lse, dq, dk, dvv


# name, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v), options
CASES = [
    ("192/128", (2, 300, 300, 4, 4, 192, 128), dict()),
    ("192/128-causal-gqa-sq<sk", (2, 77, 300, 8, 2, 192, 128), dict(causal=True)),
    ("192/128-causal-sq>sk", (1, 300, 77, 2, 1, 192, 128), dict(causal=True)),
    ("192/128-causal-long", (1, 1000, 1000, 2, 2, 192, 128), dict(causal=True)),
    ("192/128-window", (1, 300, 333, 2, 1, 192, 128), dict(window=(64, 0))),
    ("192/128-decode", (2, 1, 300, 4, 1, 192, 128), dict()),
    ("160/96-zero-columns", (1, 77, 300, 2, 2, 160, 96), dict(causal=True, scale=0.3)),
    ("128/64", (2, 300, 77, 4, 2, 128, 64), dict()),
    ("128/64-causal", (1, 300, 300, 2, 2, 128, 64), dict(causal=True)),
    ("128/64-decode", (1, 1, 300, 2, 1, 128, 64), dict()),
    ("104/56-zero-columns", (1, 77, 33, 3, 1, 104, 56), dict()),  # rows on 16 bytes: TMA's strides
    ("64/128", (2, 300, 211, 2, 2, 64, 128), dict()),
    ("64/128-causal-gqa", (1, 300, 300, 6, 2, 64, 128), dict(causal=True)),
    ("40/120-zero-columns", (2, 17, 129, 2, 2, 40, 120), dict(causal=True)),
    ("64/256", (1, 300, 300, 2, 2, 64, 256), dict()),
    ("64/256-causal-gqa-sq<sk", (2, 77, 300, 4, 2, 64, 256), dict(causal=True)),
    ("56/200-zero-columns", (1, 1, 77, 2, 1, 56, 200), dict()),
]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", CASES, ids=[c[0] for c in CASES])
def test_dense(name, shape, opts, dtype):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    causal, window = opts.get("causal", False), opts.get("window")
    scale = opts.get("scale", shape[5] ** -0.5)
    q, k, v, dout = cuda_qkv_dv(torch, shape, dtype)
    want = reference(q, k, v, dout, causal, window, scale)
    peer = plain(torch, q, k, v, dout, causal, window, scale)
    got = run_hopper(torch, q, k, v, dout, causal, window, scale)
    check(f"{name} cuda-hopper {dtype}", got, want, peer)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d,dv", [(128, 64), (64, 128)])
def test_deterministic(d, dv, dtype):
    """The deterministic backward (D = 128's kernel): twice the same bits, and right."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt, device="cuda") for s in ((2, 300, 4, d), (2, 211, 2, d)))
    v, dout = (torch.randn(s, dtype=tdt, device="cuda") for s in ((2, 211, 2, dv), (2, 300, 4, dv)))
    want = reference(q, k, v, dout, True, None, d**-0.5)
    peer = plain(torch, q, k, v, dout, True, None, d**-0.5)
    got = run_hopper(torch, q, k, v, dout, True, None, d**-0.5, deterministic=True)
    check(f"deterministic {d}/{dv} cuda-hopper {dtype}", got, want, peer)
    again = run_hopper(torch, q, k, v, dout, True, None, d**-0.5, deterministic=True)
    for a, g in zip(again[2:], got[2:]):
        assert torch.equal(a, g), f"deterministic {d}/{dv}: two runs differ"


LENS_Q, LENS_K = [77, 1, 300, 0, 64], [300, 77, 1, 5, 129]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d,dv", [(192, 128), (128, 64), (64, 128), (64, 256)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(d, dv, causal, dtype):
    torch = pytest.importorskip("torch")
    torch.manual_seed(2)
    hq, hkv = 4, 2
    cu_q, cu_k = np.cumsum([0] + LENS_Q).astype(np.int32), np.cumsum([0] + LENS_K).astype(np.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt, device="cuda") for s in ((tq, hq, d), (tk, hkv, d)))
    v, dout = (torch.randn(s, dtype=tdt, device="cuda") for s in ((tk, hkv, dv), (tq, hq, dv)))
    scale = d**-0.5
    want = reference(q, k, v, dout, causal, None, scale, cu_q, cu_k)
    p = plain(torch, *(x[None] for x in (q, k, v, dout)), causal, None, scale, cu_q, cu_k)
    peer = (p[0][0], p[1][0], p[2][0], p[3][0], p[4][0])  # the batch dim of 1 off; lse [hq, total_q]
    got = run_hopper(torch, q, k, v, dout, causal, None, scale, cu_q=cu_q, cu_k=cu_k)
    check(f"varlen {d}/{dv} causal={causal} cuda-hopper {dtype}", got, want, peer)


@pytest.mark.parametrize("d,dv", [(96, 160), (256, 128), (192, 64), (128, 96), (192, 256)])
def test_refuses_pairs_without_a_kernel(d, dv):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 16, 2, d, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 16, 2, dv, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(
        NotImplementedError, match=f"head_dim_v {dv} with head_dim {d} is not supported on backend cuda-hopper"
    ):
        flashc.attention(q, q, v, backend="cuda-hopper")
    o = torch.zeros(1, 16, 2, dv, dtype=torch.bfloat16, device="cuda")
    lse = torch.zeros(1, 2, 16, dtype=torch.float32, device="cuda")
    with pytest.raises(NotImplementedError, match=f"flashc_backward: head_dim_v {dv} with head_dim {d}"):
        flashc.attention_backward(o, q, q, v, o, lse, backend="cuda-hopper")


@pytest.mark.parametrize("mod", ["softcap", "alibi"])
def test_refuses_a_pair_with_a_score_modifier(mod):
    torch = pytest.importorskip("torch")
    if mod == "softcap":
        mod = dict(softcap=5.0)
    else:
        mod = dict(alibi_slopes=torch.tensor([0.5, 0.25], dtype=torch.float32, device="cuda"))
    q = torch.randn(1, 16, 2, 192, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(1, 16, 2, 128, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(NotImplementedError, match="head_dim_v 128 .*softcap, ALiBi"):
        flashc.attention(q, q, v, backend="cuda-hopper", **mod)


def test_refuses_deterministic_past_128():
    """192/128 and 64/256 run the D = 256 backward, which adds dQ in no fixed order (auto takes cuda-mma's for
    192/128)."""
    torch = pytest.importorskip("torch")
    for d, dv, what in ((192, 128, "head_dim 192"), (64, 256, "head_dim_v 256")):
        q = torch.randn(1, 16, 2, d, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(1, 16, 2, dv, dtype=torch.bfloat16, device="cuda")
        o, lse = flashc.attention(q, q, v, backend="cuda-hopper", return_lse=True)
        with pytest.raises(NotImplementedError, match=f"deterministic backward at {what}"):
            flashc.attention_backward(o, q, q, v, o, lse, backend="cuda-hopper", deterministic=True)


def test_auto_picks_hopper_for_192_128():
    """auto on sm_90 with a 192/128 call large enough for cuda-hopper (no split keys): cuda-hopper runs it, both
    directions."""
    torch = pytest.importorskip("torch")
    q = torch.randn(2, 1024, 16, 192, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(2, 1024, 16, 128, dtype=torch.bfloat16, device="cuda")
    o, lse = flashc.attention(q, q, v, causal=True, return_lse=True)
    assert flashc.last_backend() == "cuda-hopper"
    assert o.shape == (2, 1024, 16, 128)
    flashc.attention_backward(o, q, q, v, o, lse, causal=True)
    assert flashc.last_backend() == "cuda-hopper"
