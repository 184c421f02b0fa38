"""attn_mask (a float bias or a boolean mask, broadcast as scaled_dot_product_attention broadcasts it) and the
gradient of a float bias, through the numpy and torch entry points and the torch operators.

cpu-ref (f64) is checked against this file's own numpy fp64 attention (`oracle`), and cpu (f32) against cpu-ref;
the torch entry points against torch.nn.functional.scaled_dot_product_attention on the CPU (fp64 and fp32) for
bool and float masks, broadcast shapes, a padding mask, rows whose keys are all masked, GQA, causal + mask, and the
mask's gradient (gradcheck). Outputs given to the library are poisoned (NaN) first. cuda-mma (bf16, f16) is
checked against cpu-ref on the same rounded inputs, with random masks and with structured boolean ones (padding, a
removed block inside the rows: blocks kept whole, cut, and removed; cuda-hopper: test_mask_hopper.py and
test_mask_hopper_bwd.py); the other CUDA backends must refuse attn_mask; both skip with "no CUDA device" where there
is none.
"""

import numpy as np
import pytest
from conftest import BACKENDS, need_torch_ops

import flashc

CUDA_BACKENDS = [n for n, b in BACKENDS.items() if b.device == "cuda" and b.usable]
# cuda-mma and cuda-hopper implement attn_mask (tests/python/test_mask_hopper*.py)
REFUSING = [n for n in CUDA_BACKENDS if n not in ("cuda-mma", "cuda-hopper")]


# ---- the independent oracle ------------------------------------------------------------------------------
def oracle(q, k, v, dout, mask, *, causal=False, scale=None):
    """(o, lse, dq, dk, dv, dS) in fp64 for q [B, Sq, H, D], k, v [B, Sk, Hk, D] and a mask broadcastable to
    [B, H, Sq, Sk] (bool: True = attend; float: added to scale·q·k). Causal is bottom-right. Rows with every key
    removed give o = 0, lse = -inf and zero gradients; dS [B, H, Sq, Sk] is the bias's gradient before summing."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = float(np.float32(1 / np.sqrt(D) if scale is None else scale))
    kk, vv = (np.repeat(x, H // Hk, axis=2) for x in (k, v))  # GQA: query head h reads kv head h // (H / Hk)
    S = scale * np.einsum("bihd,bjhd->bhij", q, kk)
    mask = np.broadcast_to(np.asarray(mask), (B, H, Sq, Sk))
    keep = mask if mask.dtype == bool else np.isfinite(mask) | (mask > 0)
    if mask.dtype != bool:
        S = S + mask.astype(np.float64)
    if causal:
        keep = keep & (np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq)
    S = np.where(keep, S, -np.inf)
    m = S.max(-1, keepdims=True)
    dead = m == -np.inf
    P = np.where(dead, 0.0, np.exp(S - np.where(dead, 0.0, m)))
    rowsum = P.sum(-1, keepdims=True)
    P = np.where(dead, 0.0, P / np.where(dead, 1.0, rowsum))
    lse = np.where(dead[..., 0], -np.inf, (m + np.log(np.where(dead, 1.0, rowsum)))[..., 0])
    o = np.einsum("bhij,bjhd->bihd", P, vv)
    dP = np.einsum("bihd,bjhd->bhij", dout, vv)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = scale * np.einsum("bhij,bjhd->bihd", dS, kk)
    dk = scale * np.einsum("bhij,bihd->bjhd", dS, q).reshape(B, Sk, Hk, H // Hk, D).sum(3)
    dv = np.einsum("bhij,bihd->bjhd", P, dout).reshape(B, Sk, Hk, H // Hk, D).sum(3)
    return o, lse, dq, dk, dv, dS


def reduce_to(dS, shape):
    """dS [B, H, Sq, Sk] summed into a mask shape of 2 to 4 dims (the gradient of a broadcast bias)."""
    s4 = (1,) * (4 - len(shape)) + tuple(shape)
    return dS.sum(axis=tuple(d for d in range(4) if s4[d] == 1 and dS.shape[d] != 1), keepdims=True).reshape(shape)


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(x), fin) and np.all(x[~fin] == ref[~fin])
    return np.abs(x[fin] - ref[fin]).max(initial=0.0) / max(np.abs(ref[fin]).max(initial=0.0), 1e-30)


def make_mask(rng, shape, kind):
    if kind == "bool":
        m = rng.random(shape) > 0.3
    else:
        m = rng.standard_normal(shape)
        m[rng.random(shape) < 0.05] = -np.inf
    return m


# (B, Sq, Sk, H, Hk, D, mask shape as a function of them, causal)
SHAPES = [
    pytest.param(2, 13, 17, 2, 2, 16, lambda B, H, Sq, Sk: (B, H, Sq, Sk), False, id="full"),
    pytest.param(2, 9, 31, 4, 2, 16, lambda B, H, Sq, Sk: (B, 1, 1, Sk), False, id="padding-gqa"),
    pytest.param(1, 40, 40, 2, 1, 32, lambda B, H, Sq, Sk: (Sq, Sk), True, id="2d-causal-mqa"),
    pytest.param(3, 7, 300, 2, 2, 8, lambda B, H, Sq, Sk: (1, H, Sq, Sk), False, id="heads-long"),
    pytest.param(2, 21, 11, 2, 2, 16, lambda B, H, Sq, Sk: (H, 1, Sk), True, id="3d-causal-sq>sk"),
]


# ---- numpy ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,shape,causal", SHAPES)
def test_numpy_against_oracle(rng, kind, B, Sq, Sk, H, Hk, D, shape, causal):
    q, dout = rng.standard_normal((B, Sq, H, D)), rng.standard_normal((B, Sq, H, D))
    k, v = rng.standard_normal((B, Sk, Hk, D)), rng.standard_normal((B, Sk, Hk, D))
    mshape = shape(B, H, Sq, Sk)
    mask = make_mask(rng, mshape, kind)
    o_ref, lse_ref, dq_ref, dk_ref, dv_ref, dS = oracle(q, k, v, dout, mask, causal=causal)
    for backend, dtype, tol in (("cpu-ref", np.float64, 1e-12), ("cpu", np.float32, 3e-5)):
        if backend not in BACKENDS:
            continue
        qq, kk, vv, dd = (x.astype(dtype) for x in (q, k, v, dout))
        out = np.full(o_ref.shape, np.nan, dtype)
        o, lse = flashc.attention(qq, kk, vv, causal=causal, backend=backend, return_lse=True, out=out,
                                  attn_mask=mask)  # fmt: skip
        assert rel(o, o_ref) < tol and rel(lse, lse_ref) < max(tol, 1e-6), backend
        res = flashc.attention_backward(dd, qq, kk, vv, o, lse, causal=causal, backend=backend, attn_mask=mask,
                                        dq=np.full(q.shape, np.nan, dtype), return_dbias=kind == "float")  # fmt: skip
        for got, ref in zip(res[:3], (dq_ref, dk_ref, dv_ref)):
            assert rel(got, ref) < tol, backend
        if kind == "float":
            dbias = res[3]
            assert dbias.shape == mshape and dbias.dtype == dtype
            ref = reduce_to(dS, mshape)
            err = np.abs(dbias - ref).max() / max(np.abs(dS).max(), 1e-30)  # judged against dS's size
            assert err < tol, (backend, err)


def test_numpy_dead_rows_and_refusals(rng):
    B, Sq, Sk, H, D = 2, 6, 10, 2, 8
    q, k, v = (rng.standard_normal((B, s, H, D)).astype(np.float32) for s in (Sq, Sk, Sk))
    mask = np.ones((B, 1, Sq, Sk), bool)
    mask[0, 0, 2] = False  # query row 2 of sequence 0 sees no key
    bias = np.zeros((B, 1, Sq, Sk), np.float32)
    bias[1, 0, 4] = -np.inf
    for backend in ("cpu", "cpu-ref"):
        for m, (b, i) in ((mask, (0, 2)), (bias, (1, 4))):
            o, lse = flashc.attention(q, k, v, backend=backend, return_lse=True, attn_mask=m)
            assert np.all(o[b, i] == 0) and np.all(lse[b, :, i] == -np.inf) and np.isfinite(o).all()
            dq, dk, dv = flashc.attention_backward(np.ones_like(o), q, k, v, o, lse, backend=backend, attn_mask=m)
            assert np.all(dq[b, i] == 0) and all(np.isfinite(x).all() for x in (dq, dk, dv))
    with pytest.raises(ValueError, match="attn_mask has shape"):
        flashc.attention(q, k, v, attn_mask=np.ones((3, Sq, Sk), bool))
    with pytest.raises(ValueError, match="varlen"):
        flashc.prepare_forward(q[0], k[0], v[0], cu_seqlens_q=[0, Sq], cu_seqlens_k=[0, Sk], attn_mask=mask[0, 0])
    with pytest.raises(ValueError, match="return_dbias needs a float attn_mask"):
        o, lse = flashc.attention(q, k, v, return_lse=True, attn_mask=mask)
        flashc.attention_backward(o, q, k, v, o, lse, attn_mask=mask, return_dbias=True)
    with pytest.raises(TypeError, match="bool or floating point"):
        flashc.attention(q, k, v, attn_mask=np.ones((Sq, Sk), np.int32))


@pytest.mark.skipif(not REFUSING, reason="no CUDA device")
@pytest.mark.parametrize("backend", REFUSING)
def test_cuda_backends_refuse(backend):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        flashc.attention(q, q, q, backend=backend, attn_mask=torch.ones(8, 8, dtype=torch.bool, device="cuda"))


# ---- torch ---------------------------------------------------------------------------------------------
def _sdpa(torch, q, k, v, mask, causal):
    """SDPA in [B, S, H, D] (flashc's layout); causal bottom-right as a bool mask (SDPA's is top-left)."""
    import torch.nn.functional as F

    Sq, Sk = q.shape[1], k.shape[1]
    if causal:
        tri = torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq)
        mask = (mask & tri) if mask.dtype == torch.bool else mask.masked_fill(~tri, float("-inf"))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    # scale 0.25 is exact in float32 (flashc's scale is a float32)
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True, scale=0.25).transpose(1, 2)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,shape,causal", SHAPES)
def test_torch_against_sdpa(dtype, kind, B, Sq, Sk, H, Hk, D, shape, causal):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    dt = getattr(torch, dtype)
    backend = "cpu-ref" if dtype == "float64" else "cpu"
    g = torch.Generator().manual_seed(B * 1000 + Sq * 10 + Sk)
    q = torch.randn(B, Sq, H, D, dtype=dt, generator=g, requires_grad=True)
    k = torch.randn(B, Sk, Hk, D, dtype=dt, generator=g, requires_grad=True)
    v = torch.randn(B, Sk, Hk, D, dtype=dt, generator=g, requires_grad=True)
    mshape = shape(B, H, Sq, Sk)
    if kind == "bool":
        mask = torch.rand(mshape, generator=g) > 0.3
        mask[..., 0] = True  # SDPA gives NaN for a row with every key masked; flashc gives 0 (tested above)
    else:
        mask = torch.randn(mshape, dtype=dt, generator=g).requires_grad_()
    if causal and Sq > Sk:  # rows above the bottom-right diagonal see no key: NaN in SDPA
        return pytest.skip("SDPA has no answer for rows that see no key")
    o = ft.attention(q, k, v, causal=causal, scale=0.25, backend=backend, attn_mask=mask)
    ref = _sdpa(torch, q, k, v, mask, causal)
    tol = 1e-10 if dtype == "float64" else 2e-5
    assert (o - ref).abs().max().item() < tol
    dout = torch.randn(o.shape, dtype=dt, generator=g)
    wrt = (q, k, v) + ((mask,) if kind == "float" else ())
    got, want = torch.autograd.grad(o, wrt, dout), torch.autograd.grad(ref, wrt, dout)
    for a, b in zip(got, want):
        assert a.shape == b.shape and (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


def test_torch_gradcheck_dbias():
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, s, 2, 8, dtype=torch.float64, generator=g) for s in (5, 7, 7))
    for shape in ((2, 2, 5, 7), (2, 1, 1, 7), (5, 7), (1, 2, 1, 7)):
        m = torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
        assert torch.autograd.gradcheck(lambda m_: ft.attention(q, k, v, attn_mask=m_, backend="cpu-ref"), (m,))
        qq = q.clone().requires_grad_()
        assert torch.autograd.gradcheck(
            lambda q_, m_: ft.attention(q_, k, v, causal=True, attn_mask=m_, backend="cpu-ref"), (qq, m)
        )


def test_torch_operators():
    torch, _ops = need_torch_ops()
    from torch.library import opcheck

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, s, 2, 16, generator=g) for s in (6, 9, 9))
    m = torch.randn(2, 1, 6, 9, generator=g)
    opts = (None, False, -1, -1, False, "cpu", -1, False, 0.0, None, None, None)
    out, lse = torch.ops.flashc.fwd(q, k, v, None, None, *opts, m)
    old = torch.ops.flashc.fwd(q, k, v, None, None, *opts[:8])[0]  # the schema before attn_mask still runs
    assert not torch.equal(out, old)
    opcheck(torch.ops.flashc.fwd, (q, k, v, None, None, *opts, m))
    opcheck(torch.ops.flashc.fwd, (q, k, v, None, None, *opts, m > 0))
    dout = torch.randn(out.shape, generator=g)
    opcheck(torch.ops.flashc.bwd_dbias, (dout, q, k, v, out, lse, None, None, *opts, m))
    dq, dk, dv, db = torch.ops.flashc.bwd_dbias(dout, q, k, v, out, lse, None, None, *opts, m)
    assert db.shape == m.shape
    # through the operator's autograd (as torch.compile sees it)
    mm, qq = m.clone().requires_grad_(), q.clone().requires_grad_()
    o2 = torch.ops.flashc.fwd(qq, k, v, None, None, *opts, mm)[0]
    gq, gm = torch.autograd.grad(o2, (qq, mm), dout)
    assert torch.allclose(gq, dq) and torch.allclose(gm, db)

    def f(q_, m_):
        import flashc.torch as ft

        return ft.attention(q_, k, v, attn_mask=m_, backend="cpu")

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.allclose(compiled(q, m), f(q, m))


# ---- cuda-mma against cpu-ref ----------------------------------------------------------------------------
# Several of cuda-mma's key and query blocks; (B, Sq, Sk, H, Hk, D, mask shape, causal). Even Sk with a contiguous
# mask: two keys of a row per load; odd Sk and a sliced mask (key stride 2): one element at a time.
MMA_SHAPES = [
    pytest.param(2, 200, 256, 2, 2, 64, lambda B, H, Sq, Sk: (B, H, Sq, Sk), False, id="full"),
    pytest.param(2, 130, 300, 4, 2, 128, lambda B, H, Sq, Sk: (B, 1, 1, Sk), False, id="padding-gqa"),
    pytest.param(1, 257, 384, 2, 1, 64, lambda B, H, Sq, Sk: (Sq, Sk), True, id="2d-causal-mqa"),
    pytest.param(2, 150, 203, 2, 2, 96, lambda B, H, Sq, Sk: (1, H, Sq, Sk), False, id="heads-odd-sk"),
    pytest.param(2, 97, 160, 2, 2, 32, lambda B, H, Sq, Sk: (B, 1, Sq, Sk), True, id="batch-causal"),
]


@pytest.mark.skipif("cuda-mma" not in CUDA_BACKENDS, reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,shape,causal", MMA_SHAPES)
def test_cuda_mma_against_cpu_ref(dtype, kind, B, Sq, Sk, H, Hk, D, shape, causal):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(B * 1000 + Sq * 10 + Sk)
    q, dout = (torch.randn(B, Sq, H, D, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(B, Sk, Hk, D, generator=g).to(dt) for _ in range(2))
    mshape = shape(B, H, Sq, Sk)
    if kind == "bool":
        mask = torch.rand(mshape, generator=g) > 0.3
    else:
        mask = torch.randn(mshape, generator=g).to(dt)
        mask[torch.rand(mshape, generator=g) < 0.05] = float("-inf")
    if mshape[-2] > 1:  # a row whose keys are all removed: o = 0, lse = -inf, no NaN
        mask[..., 3, :] = False if kind == "bool" else float("-inf")

    def run(device, backend, cast):
        xs = [x.to(device=device, dtype=cast).requires_grad_() for x in (q, k, v)]
        m = mask.to(device=device, dtype=mask.dtype if kind == "bool" else cast)
        if Sk % 2:  # a sliced mask: key stride 2
            wide = torch.zeros(mshape[:-1] + (2 * Sk,), dtype=m.dtype, device=device)
            wide[..., ::2] = m
            m = wide[..., ::2]
        if kind == "float":
            m.requires_grad_()
        o, lse = ft.attention(*xs, causal=causal, scale=0.25, backend=backend, attn_mask=m, return_lse=True)
        grads = torch.autograd.grad(o, xs + ([m] if kind == "float" else []), dout.to(device=device, dtype=cast))
        return [x.detach().double().cpu() for x in (o, lse, *grads)]

    got = run("cuda", "cuda-mma", dt)
    want = run("cpu", "cpu-ref", torch.float64)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv", "dbias"), got, want):
        assert a.shape == b.shape, name
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin) and torch.equal(a[~fin], b[~fin]), name  # -inf lse where dead
        err = (a[fin] - b[fin]).abs().max().item() / max(b[fin].abs().max().item(), 1e-30)
        assert err < (1e-4 if name == "lse" else 2e-2), (name, err)


# Structured boolean masks, whose blocks cuda-mma classifies (a block keeps none, all or some of its pairs) and whose
# kept key (query) blocks its forward (backward) walks alone (src/cuda/common/mask_tiles.cuh); a random mask keeps
# some pairs of every block. Lengths per plane: Sk, Sk - 1, Sk - 65, 1 (none block-aligned), 128 (block-aligned) and
# 0 (every key removed: o = 0, lse = -inf, zero gradients).
def _lengths(n, Sk):
    return [(Sk, Sk - 1, Sk - 65, 1, 128, 0)[p % 6] for p in range(n)]


def _right_padding(torch, B, H, Sq, Sk):  # SDPA's padding mask [B, 1, 1, Sk]
    keep = torch.arange(Sk)[None, :] < torch.tensor(_lengths(B, Sk))[:, None]
    return keep[:, None, None, :], (B, 1, 1, Sk)


def _left_padding(torch, B, H, Sq, Sk):  # [B, 1, Sq, Sk], every row the same
    keep = torch.arange(Sk)[None, :] >= Sk - torch.tensor(_lengths(B, Sk))[:, None]
    return keep[:, None, None, :].expand(B, 1, Sq, Sk).contiguous(), (B, 1, Sq, Sk)


def _head_padding(torch, B, H, Sq, Sk):  # [B, H, 1, Sk]: each head of a GQA group its own length
    keep = torch.arange(Sk)[None, :] < torch.tensor(_lengths(B * H, Sk))[:, None]
    return keep.reshape(B, H, 1, Sk), (B, H, 1, Sk)


def _hole(torch, B, H, Sq, Sk):  # [B, 1, Sq, Sk]: keys [128, 256) removed (a block inside each row's range), and
    keep = torch.ones(B, 1, Sq, Sk, dtype=torch.bool)  # the last 37 keys of the rows from Sq / 2 (a cut block)
    keep[..., 128:256] = False
    keep[:, :, Sq // 2 :, Sk - 37 :] = False
    keep[1, :, 5] = False  # and one row of sequence 1 with every key removed
    return keep, (B, 1, Sq, Sk)


# (B, Sq, Sk, H, Hk, D, mask, causal)
MMA_STRUCTURED = [
    pytest.param(6, 130, 300, 4, 2, 64, _right_padding, False, id="right-padding-gqa"),
    pytest.param(6, 200, 140, 2, 2, 128, _right_padding, True, id="right-padding-causal-sq>sk"),
    pytest.param(3, 150, 260, 2, 1, 32, _left_padding, True, id="left-padding-causal-mqa"),
    pytest.param(2, 64, 200, 4, 1, 96, _head_padding, False, id="per-head-padding-mqa"),
    pytest.param(2, 200, 400, 2, 2, 64, _hole, False, id="hole"),
    pytest.param(2, 77, 520, 2, 2, 256, _hole, True, id="hole-causal-d256"),
]


@pytest.mark.skipif("cuda-mma" not in CUDA_BACKENDS, reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("mode", ["atomic", "deterministic", "split"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,make,causal", MMA_STRUCTURED)
def test_cuda_mma_structured_bool_masks(dtype, mode, B, Sq, Sk, H, Hk, D, make, causal):
    """o, lse, dq, dk, dv of cuda-mma against cpu-ref with masks whose blocks are none, all and some kept; each of
    the backward's dQ ways (atomic in the dK/dV kernel, or the deterministic dQ pass, whose blocks differ) and the
    forward's split keys (its parts share the kept range)."""
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(B * 1000 + Sq * 10 + Sk)
    q, dout = (torch.randn(B, Sq, H, D, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(B, Sk, Hk, D, generator=g).to(dt) for _ in range(2))
    mask, mshape = make(torch, B, H, Sq, Sk)
    assert tuple(mask.shape) == mshape

    def run(device, backend, cast, **opts):
        xs = [x.to(device=device, dtype=cast).requires_grad_() for x in (q, k, v)]
        m = mask.to(device=device)
        o, lse = ft.attention(*xs, causal=causal, scale=0.25, backend=backend, attn_mask=m, return_lse=True, **opts)
        grads = torch.autograd.grad(o, xs, dout.to(device=device, dtype=cast))
        return [x.detach().double().cpu() for x in (o, lse, *grads)]

    opts = {"deterministic": mode == "deterministic", "num_splits": 3 if mode == "split" else 0}
    got = run("cuda", "cuda-mma", dt, **opts)
    want = run("cpu", "cpu-ref", torch.float64)
    dead = torch.isinf(want[1])  # [B, H, Sq]: rows whose keys are all removed
    assert dead.any() == (make is not _left_padding), "the case's rows with every key removed"
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, name
        fin = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), fin) and torch.equal(a[~fin], b[~fin]), name  # -inf lse where dead
        err = (a[fin] - b[fin]).abs().max().item() / max(b[fin].abs().max().item(), 1e-30)
        assert err < (1e-4 if name == "lse" else 2e-2), (name, err)
    rows = dead.transpose(1, 2)  # [B, Sq, H], as o and dq
    assert torch.all(got[0][rows] == 0) and torch.all(got[2][rows] == 0), "o = dq = 0 where every key is removed"
