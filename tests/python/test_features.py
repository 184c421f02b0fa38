"""softcap, ALiBi, a head dim of V of its own and seqused_q/k (varlen) through the numpy and torch entry points.

cpu-ref (f64) is checked against this file's own numpy fp64 attention (`oracle`, written from flashc.h's
definitions), so the C oracle is not checked against itself; cpu (f32) against cpu-ref. Outputs given to the
library are poisoned (NaN) first, so an element it does not write shows. Backends that do not implement a
feature must raise NotImplementedError naming it; CUDA parts skip with "no CUDA device" where there is none.
"""

import numpy as np
import pytest
from conftest import BACKENDS, need_torch_ops, visible

import flashc

CUDA_BACKENDS = [n for n, b in BACKENDS.items() if b.device == "cuda" and b.usable]


# ---- the independent oracle ------------------------------------------------------------------------------
def oracle(q, k, v, dout, *, causal=False, window=None, scale=None, softcap=0.0, slopes=None,
           align="bottom-right", cu_q=None, cu_k=None, used_q=None, used_k=None, keep=None):  # fmt: skip
    """(o, lse, dq, dk, dv) in fp64. q [B, Sq, H, D] (or packed [T, H, D] with cu_q/cu_k), v of its own head dim.
    Scores: s = scale·q·k; s <- cap·tanh(s/cap); s <- s - slope·|i + sk - sq - j| (sq, sk the used lengths);
    then the mask (and keep, a boolean attn_mask broadcast to [B, H, Sq, Sk]: False removes the key; dense only) and
    the softmax. Rows of no key and unused rows give o = 0, lse = -inf and zero gradients."""
    packed = cu_q is not None
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    if packed:
        q, k, v, dout = (x[None] for x in (q, k, v, dout))
    B, Sq, H, D = q.shape
    Hk, DV = k.shape[2], v.shape[3]
    # the C API's scale and softcap are float32: the same numbers here
    scale = float(np.float32(1 / np.sqrt(D) if scale is None else scale))
    softcap = float(np.float32(softcap))
    o = np.zeros((B, Sq, H, DV))
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    lse = np.full((H, Sq) if packed else (B, H, Sq), -np.inf)
    if keep is not None:
        assert not packed, "keep: dense only"
        keep = np.broadcast_to(np.asarray(keep, bool), (B, H, Sq, k.shape[1]))
    seqs = len(cu_q) - 1 if packed else B
    for s in range(seqs):
        b = 0 if packed else s
        q0 = cu_q[s] if packed else 0
        k0 = cu_k[s] if packed else 0
        nq = (used_q[s] if used_q is not None else cu_q[s + 1] - cu_q[s]) if packed else Sq
        nk = (used_k[s] if used_k is not None else cu_k[s + 1] - cu_k[s]) if packed else k.shape[1]
        i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]  # for ALiBi's distances
        vis_all = visible(nq, nk, causal, window, align == "bottom-right")
        for h in range(H):
            vis = vis_all if keep is None else vis_all & keep[b, h]
            hk = h // (H // Hk)
            Q, K, V = q[b, q0 : q0 + nq, h], k[b, k0 : k0 + nk, hk], v[b, k0 : k0 + nk, hk]
            dO = dout[b, q0 : q0 + nq, h]
            X = scale * Q @ K.T
            T = np.tanh(X / softcap) if softcap else np.zeros_like(X)
            S = softcap * T if softcap else X
            if slopes is not None:
                slope = slopes[h] if slopes.ndim == 1 else slopes[s, h]
                S = S - slope * np.abs(i + nk - nq - j)
            S = np.where(vis, S, -np.inf)
            seen = vis.any(axis=1)
            m = np.where(seen, S.max(axis=1, initial=-np.inf), 0.0)
            E = np.where(vis, np.exp(S - m[:, None]), 0.0)
            lsum = E.sum(axis=1)
            P = np.where(seen[:, None], E / np.where(seen, lsum, 1.0)[:, None], 0.0)
            o[b, q0 : q0 + nq, h] = P @ V
            rows = lse[h, q0 : q0 + nq] if packed else lse[b, h, :nq]
            rows[:] = np.where(seen, m + np.log(np.where(seen, lsum, 1.0)), -np.inf)
            dP = dO @ V.T
            dS = P * (dP - (P * dP).sum(axis=1, keepdims=True))
            if softcap:
                dS = dS * (1 - T * T)
            dq[b, q0 : q0 + nq, h] += scale * dS @ K
            dk[b, k0 : k0 + nk, hk] += scale * dS.T @ Q
            dv[b, k0 : k0 + nk, hk] += P.T @ dO
    if packed:
        o, dq, dk, dv = (x[0] for x in (o, dq, dk, dv))
    return o, lse, dq, dk, dv


def randn(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def run(backend, q, k, v, dout, dtype, **kw):
    """Forward and backward through flashc's numpy API into poisoned outputs; returns (o, lse, dq, dk, dv)."""
    packed = "cu_seqlens_q" in kw
    out = np.full(q.shape[:-1] + (v.shape[-1],), np.nan, dtype)
    lse_shape = (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])
    lse = np.full(lse_shape, np.nan, np.float32)
    if packed:
        flashc.attention_varlen(q, k, v, backend=backend, out=out, lse=lse, **kw)
    else:
        flashc.attention(q, k, v, backend=backend, out=out, lse=lse, **kw)
    dq, dk, dv = (np.full(x.shape, np.nan, dtype) for x in (q, k, v))
    flashc.attention_backward(dout, q, k, v, out, lse, backend=backend, dq=dq, dk=dk, dv=dv, **kw)
    assert flashc.last_backend() == backend
    return out, lse, dq, dk, dv


def check_against(got, want, tol, what):
    names = ("o", "lse", "dq", "dk", "dv")
    for name, g, w in zip(names, got, want):
        g = np.asarray(g, np.float64)
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        assert not np.isnan(g).any(), f"{what}: {name} has NaN (an element left unwritten, or a read of poison)"
        inf = np.isinf(w)
        assert np.array_equal(np.isinf(g), inf) and np.all(g[inf] == w[inf]), f"{what}: {name} infinities differ"
        err = np.abs(g[~inf] - w[~inf]).max(initial=0.0)
        t = max(tol, 1e-6) if name == "lse" else tol  # lse is float32 on every backend
        bound = t * max(1.0, np.abs(w[~inf]).max(initial=0.0))
        assert err <= bound, f"{what}: {name} max error {err:.3g} > {bound:.3g}"


# name, (batch, sq, sk, hq, hkv, d, dv), options
CASES = [
    ("softcap", (2, 37, 53, 2, 2, 40, 40), dict(softcap=5.0, scale=1.0)),
    ("softcap-causal", (1, 113, 203, 2, 2, 59, 59), dict(softcap=2.0, causal=True)),
    ("softcap-window", (1, 70, 90, 2, 1, 32, 32), dict(softcap=4.0, window=(20, 7), scale=0.5)),
    ("softcap-gqa-top-left", (2, 33, 21, 4, 2, 16, 16), dict(softcap=1.5, causal=True, causal_align="top-left")),
    ("alibi-causal", (2, 65, 65, 3, 3, 32, 32), dict(alibi="head", causal=True)),
    ("alibi-per-batch", (2, 17, 301, 2, 1, 48, 48), dict(alibi="batch")),
    ("alibi-softcap-gqa", (1, 50, 80, 4, 1, 64, 64), dict(alibi="batch", softcap=8.0, causal=True, scale=1.0)),
    ("dv-192/128", (1, 40, 57, 2, 1, 192, 128), dict(causal=True)),
    ("dv-128/64", (2, 33, 45, 2, 2, 128, 64), {}),
    ("dv-64/128", (1, 41, 90, 2, 2, 64, 128), dict(causal=True)),
    ("dv-64/256", (1, 29, 31, 2, 1, 64, 256), {}),
    ("dv-64/512", (1, 19, 27, 1, 1, 64, 512), dict(softcap=3.0)),
]


def slopes_for(kind, batch, heads):
    """ALiBi's slopes 2^(-8(h+1)/H), varied per sequence for kind "batch"."""
    base = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
    if kind == "head":
        return base.astype(np.float32)
    return (base[None, :] * (1 + 0.5 * np.arange(batch))[:, None]).astype(np.float32)


@pytest.mark.parametrize("name,shape,opts", CASES, ids=[c[0] for c in CASES])
def test_dense_features(name, shape, opts, rng):
    b, sq, sk, hq, hkv, d, dv = shape
    opts = dict(opts)
    if "alibi" in opts:
        opts["alibi_slopes"] = slopes_for(opts.pop("alibi"), b, hq)
    q, k = randn(rng, (b, sq, hq, d), np.float64), randn(rng, (b, sk, hkv, d), np.float64)
    v, dout = randn(rng, (b, sk, hkv, dv), np.float64), randn(rng, (b, sq, hq, dv), np.float64)
    oracle_opts = {key: val for key, val in opts.items() if key not in ("causal_align", "alibi_slopes")}
    want = oracle(q, k, v, dout, align=opts.get("causal_align", "bottom-right"), slopes=opts.get("alibi_slopes"),
                  **oracle_opts)  # fmt: skip
    check_against(run("cpu-ref", q, k, v, dout, np.float64, **opts), want, 1e-12, f"{name} cpu-ref")
    if "cpu" in BACKENDS:
        q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, dout))
        ref = run("cpu-ref", q32, k32, v32, do32, np.float32, **opts)
        got = run("cpu", q32, k32, v32, do32, np.float32, **opts)
        check_against(got, tuple(np.asarray(x, np.float64) for x in ref), 2e-4, f"{name} cpu")


LENS_Q, LENS_K = [37, 0, 5, 64, 1], [29, 7, 0, 70, 300]
USED_Q, USED_K = [30, 0, 5, 13, 0], [29, 3, 0, 1, 257]


@pytest.mark.parametrize(
    "name,opts",
    [
        ("varlen-softcap-causal", dict(softcap=6.0, causal=True)),
        ("varlen-alibi", dict(alibi="batch")),
        ("seqused", dict(seqused_q=USED_Q, seqused_k=USED_K)),
        ("seqused-k-window", dict(seqused_k=USED_K, window=(9, 2))),
        ("seqused-all-features", dict(seqused_q=USED_Q, seqused_k=USED_K, softcap=3.0, alibi="head", causal=True)),
    ],
)
def test_varlen_features(name, opts, rng):
    hq, hkv, d, dv = 2, 1, 24, 40
    cu_q, cu_k = np.cumsum([0] + LENS_Q).astype(np.int32), np.cumsum([0] + LENS_K).astype(np.int32)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    opts = dict(opts)
    if "alibi" in opts:
        opts["alibi_slopes"] = slopes_for(opts.pop("alibi"), len(LENS_Q), hq)
    q, k = randn(rng, (tq, hq, d), np.float64), randn(rng, (tk, hkv, d), np.float64)
    v, dout = randn(rng, (tk, hkv, dv), np.float64), randn(rng, (tq, hq, dv), np.float64)
    # What lies past the used rows must never be read: NaN there shows a read.
    for s in range(len(LENS_Q)):
        if "seqused_q" in opts:
            q[cu_q[s] + USED_Q[s] : cu_q[s + 1]] = np.nan
            dout[cu_q[s] + USED_Q[s] : cu_q[s + 1]] = np.nan
        if "seqused_k" in opts:
            k[cu_k[s] + USED_K[s] : cu_k[s + 1]] = np.nan
            v[cu_k[s] + USED_K[s] : cu_k[s + 1]] = np.nan
    want = oracle(np.nan_to_num(q), np.nan_to_num(k), np.nan_to_num(v), np.nan_to_num(dout), cu_q=cu_q, cu_k=cu_k,
                  used_q=opts.get("seqused_q"), used_k=opts.get("seqused_k"), slopes=opts.get("alibi_slopes"),
                  **{key: val for key, val in opts.items() if key in ("causal", "window", "softcap")})  # fmt: skip
    kw = dict(opts, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    check_against(run("cpu-ref", q, k, v, dout, np.float64, **kw), want, 1e-12, f"{name} cpu-ref")
    if "cpu" in BACKENDS:
        q32, k32, v32, do32 = (x.astype(np.float32) for x in (q, k, v, dout))
        got = run("cpu", q32, k32, v32, do32, np.float32, **kw)
        check_against(got, want, 2e-4, f"{name} cpu")
        if "seqused_q" in opts:  # exactly: rows past the used ones
            for s in range(len(LENS_Q)):
                rows = slice(cu_q[s] + USED_Q[s], cu_q[s + 1])
                assert np.all(got[0][rows] == 0) and np.all(got[2][rows] == 0) and np.all(got[1][:, rows] == -np.inf)


def test_errors():
    q = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="softcap is -1.0"):
        flashc.attention(q, q, q, softcap=-1.0)
    with pytest.raises(ValueError, match="softcap is nan"):
        flashc.attention(q, q, q, softcap=float("nan"))
    with pytest.raises(TypeError, match="softcap must be a float"):
        flashc.attention(q, q, q, softcap="big")
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(3,\); expected \(2,\) or \(1, 2\)"):
        flashc.attention(q, q, q, alibi_slopes=np.ones(3, np.float32))
    packed = q[0]
    cu = np.array([0, 4], np.int32)
    with pytest.raises(ValueError, match=r"seqused_q has shape \(2,\); it must be \(1,\)"):
        flashc.attention_varlen(packed, packed, packed, cu, cu, seqused_q=[1, 2])
    with pytest.raises(ValueError, match=r"seqused_k\[0\] is 5"):  # the C library's check against the slot
        flashc.attention_varlen(packed, packed, packed, cu, cu, seqused_k=[5])
    with pytest.raises(ValueError, match="needs packed"):
        flashc.attention_backward(q, q, q, q, q, np.zeros((1, 2, 4), np.float32), seqused_q=[1])
    # out must take v's head dim
    v = np.ones((1, 4, 2, 16), np.float32)
    with pytest.raises(ValueError, match="out"):
        flashc.attention(q, q, v, out=np.empty((1, 4, 2, 8), np.float32))


def test_auto_picks_a_backend_that_implements_it(rng):
    q = randn(rng, (1, 9, 2, 8), np.float32)
    v = randn(rng, (1, 9, 2, 24), np.float32)
    o = flashc.attention(q, q, v, softcap=2.0, alibi_slopes=np.array([0.5, 0.25], np.float32))
    assert o.shape == (1, 9, 2, 24) and flashc.last_backend() in ("cpu", "cpu-ref")


@pytest.mark.skipif(not CUDA_BACKENDS, reason="no CUDA device")
@pytest.mark.parametrize("backend", CUDA_BACKENDS)
def test_cuda_backends_refuse(backend):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    # cuda-mma and cuda-hopper run V's head dim 128 with Q's 64 (tests/python/test_head_dim_v_cuda.py,
    # test_head_dim_v_hopper.py): a pair they have no kernel for
    pairs = backend in ("cuda-mma", "cuda-hopper")
    v = torch.randn(1, 16, 2, 32 if pairs else 128, device="cuda", dtype=torch.bfloat16)
    if backend not in SCORE_MOD_BACKENDS:  # these run softcap and ALiBi: test_cuda_score_mods
        with pytest.raises(NotImplementedError, match=f"softcap is not supported on backend {backend}"):
            flashc.attention(q, q, q, softcap=2.0, backend=backend)
        with pytest.raises(NotImplementedError, match=f"ALiBi .* is not supported on backend {backend}"):
            flashc.attention(q, q, q, alibi_slopes=torch.ones(2, device="cuda"), backend=backend)
    with pytest.raises(NotImplementedError, match=f"is not supported on backend {backend}"):
        flashc.attention(q, q, v, backend=backend)


# The CUDA backends that run softcap and ALiBi, and the cases: name, (batch, sq, sk, hq, hkv, d), options
SCORE_MOD_BACKENDS = ("cuda-hopper", "cuda-mma")
SCORE_MOD_CASES = [
    ("softcap-causal-d128", (2, 129, 257, 2, 2, 128), dict(softcap=20.0, causal=True)),
    ("alibi-gqa-d64", (1, 100, 300, 4, 2, 64), dict(alibi="head")),
    ("alibi-softcap-window-d256", (2, 77, 200, 2, 1, 256), dict(alibi="batch", softcap=5.0, window=(40, 3))),
    # ALiBi's causal form on cuda-hopper (every visible key left of ALiBi's diagonal: a column term, the row's in lse)
    ("alibi-softcap-causal-d128", (2, 129, 300, 4, 2, 128), dict(alibi="batch", softcap=10.0, causal=True)),
    ("alibi-causal-sq-gt-sk-d64", (1, 200, 150, 2, 1, 64), dict(alibi="head", causal=True)),
    ("alibi-window-left-d128", (1, 333, 333, 2, 2, 128), dict(alibi="head", window=(50, 0))),
    ("softcap-causal-d256", (1, 190, 190, 2, 1, 256), dict(softcap=50.0, causal=True)),
]


def score_mod_inputs(torch, shape, opts, dtype):
    """(q, k, v, dout, slopes, opts without "alibi", the fp64 oracle's (o, lse, dq, dk, dv)) of a GPU score-mod case:
    random 16-bit tensors on the device, the oracle run on exactly those (rounded) values."""
    b, sq, sk, hq, hkv, d = shape
    opts = dict(opts)
    slopes = slopes_for(opts.pop("alibi"), b, hq) if "alibi" in opts else None
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt, device="cuda") for s in ((b, sq, hq, d), (b, sk, hkv, d)))
    v, dout = (torch.randn(s, dtype=tdt, device="cuda") for s in ((b, sk, hkv, d), (b, sq, hq, d)))
    want = oracle(*(x.double().cpu().numpy() for x in (q, k, v, dout)), slopes=slopes, **opts)
    return q, k, v, dout, slopes, opts, want


@pytest.mark.parametrize("backend", SCORE_MOD_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", SCORE_MOD_CASES, ids=[c[0] for c in SCORE_MOD_CASES])
def test_cuda_score_mods(name, shape, opts, dtype, backend, rng):
    """Softcap and ALiBi (torch, slopes on the device) against the fp64 oracle on the rounded inputs."""
    if backend not in CUDA_BACKENDS:
        pytest.skip(f"no CUDA device (or {backend} is not usable on it)")
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    q, k, v, dout, slopes, opts, want = score_mod_inputs(torch, shape, opts, dtype)
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = ft.attention(q, k, v, alibi_slopes=None if slopes is None else torch.tensor(slopes, device="cuda"),
                          backend=backend, return_lse=True, **opts)  # fmt: skip
    o.backward(dout)
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, q.grad, k.grad, v.grad))
    check_against(got, want, 4e-2, f"{name} {backend} {dtype}")


# FlashAttention's rule, with PyTorch as the peer: the same maths done plainly in the inputs' 16-bit type (scores,
# tanh, bias and softmax rounded to it as torch's bf16/f16 ops round them) has some error against the fp64 oracle;
# flashc's may be at most 2x that forward and 3x backward (+ a floor for the elements that are exact in both).
RULE_CASES = [
    ("softcap-30-causal-d128", (2, 512, 512, 4, 4, 128), dict(softcap=30.0, causal=True)),
    ("softcap-5-gqa-d64", (1, 300, 700, 4, 1, 64), dict(softcap=5.0)),
    ("alibi-causal-d128", (2, 512, 512, 4, 2, 128), dict(alibi="head", causal=True)),
]


def plain_torch(q, k, v, dout, *, causal=False, softcap=0.0, slopes=None):
    """(o, dq, dk, dv) of attention in the dtype of q (no fp32 upcast), as flash_attn's tests' attention_ref."""
    torch = pytest.importorskip("torch")
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    ke, ve = (x.repeat_interleave(hq // hkv, dim=2) for x in (k, v))
    s = torch.einsum("bihd,bjhd->bhij", q * (1.0 / d**0.5), ke)
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    if slopes is not None:
        bias = torch.as_tensor(slopes, device=q.device)[:, None, None] * (i + sk - sq - j).abs()  # fp32
        s = (s.float() - bias).to(q.dtype)
    if causal:
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    o = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), ve)
    o.backward(dout)
    return tuple(x.detach().double().cpu().numpy() for x in (o, q.grad, k.grad, v.grad))


@pytest.mark.parametrize("backend", SCORE_MOD_BACKENDS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", RULE_CASES, ids=[c[0] for c in RULE_CASES])
def test_cuda_score_mods_rule(name, shape, opts, dtype, backend, rng):
    """Softcap and ALiBi on the GPU within 2x (forward) / 3x (backward) of plain 16-bit maths' error."""
    if backend not in CUDA_BACKENDS:
        pytest.skip(f"no CUDA device (or {backend} is not usable on it)")
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    q, k, v, dout, slopes, opts, want = score_mod_inputs(torch, shape, opts, dtype)
    plain = plain_torch(q, k, v, dout, slopes=slopes, **opts)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    o = ft.attention(qg, kg, vg, alibi_slopes=None if slopes is None else torch.tensor(slopes, device="cuda"),
                     backend=backend, **opts)  # fmt: skip
    o.backward(dout)
    got = tuple(x.detach().double().cpu().numpy() for x in (o, qg.grad, kg.grad, vg.grad))
    for name_, g, p, w, times in zip(("o", "dq", "dk", "dv"), got, plain, (want[0],) + want[2:], (2, 3, 3, 3)):
        err, err_plain = np.abs(g - w).max(), np.abs(p - w).max()
        assert err <= times * err_plain + 1e-5, (
            f"{name} {backend} {dtype}: {name_} error {err:.3g} > {times} x {err_plain:.3g}"
        )


# ---- cuda-hopper's softcap at the edges of the softmax's range ------------------------------------------------------
# Softcap bounds every score to [−cap, cap]: rows whose scores all lie far below the cap (x ≈ −cap on every key) or far
# above it, at caps from 30 to 100, on each kernel the plan runs (hopper/fwd.cu, fc_hp_fwd_plan_of): the persistent one
# at D = 128 (and its split last rounds, which merge two parts' m and l), at D = 64 with 3 consumers, the one-tile one
# at D = 256 causal and D = 128 causal from 8k. (A fixed softmax base for such calls, no row max, was tried on these
# rows and dropped: docs/experiments.md.)
HOPPER_SOFTCAP_EDGE_CASES = [
    ("cap30-causal-d128-persistent", (2, 300, 300, 2, 2, 128), 30.0, dict(causal=True)),
    ("cap50-d64-persistent3", (1, 250, 400, 4, 2, 64), 50.0, {}),
    ("cap50-causal-d256-onetile", (1, 200, 200, 2, 1, 256), 50.0, dict(causal=True)),
    ("cap50-causal-d128-onetile-8k", (1, 130, 8192, 1, 1, 128), 50.0, dict(causal=True)),
    ("cap50-d128-split", (1, 2304, 1280, 8, 8, 128), 50.0, {}),
    ("cap70-causal-d128", (2, 300, 300, 2, 2, 128), 70.0, dict(causal=True)),
    ("cap100-causal-d128", (2, 300, 300, 2, 2, 128), 100.0, dict(causal=True)),
]


def extreme_rows_inputs(torch, shape, rng):
    """bf16 q, k, v, dout on the device. k = 3 + noise in every column, so rows i % 3 == 0 (q = −3 + noise) score
    scale·q·k ≈ −9·sqrt(d) on every key, far below any cap here, rows i % 3 == 1 (q = 3 + noise) ≈ +9·sqrt(d), and the
    rest (q random) a few units either side of 0."""
    b, sq, sk, hq, hkv, d = shape
    k = 3.0 + 0.5 * rng.standard_normal((b, sk, hkv, d))
    q = rng.standard_normal((b, sq, hq, d))
    q[:, 0::3] = -3.0 + 0.5 * rng.standard_normal(q[:, 0::3].shape)
    q[:, 1::3] = 3.0 + 0.5 * rng.standard_normal(q[:, 1::3].shape)
    v, dout = (rng.standard_normal(s) for s in ((b, sk, hkv, d), (b, sq, hq, d)))
    return tuple(torch.tensor(x, dtype=torch.bfloat16, device="cuda") for x in (q, k, v, dout))


@pytest.mark.parametrize(
    "name,shape,cap,opts", HOPPER_SOFTCAP_EDGE_CASES, ids=[c[0] for c in HOPPER_SOFTCAP_EDGE_CASES]
)
def test_cuda_hopper_softcap_extreme_rows(name, shape, cap, opts, rng):
    """bf16 softcap with rows far below and far above the cap against the fp64 oracle: o, lse and the gradients within
    test_cuda_score_mods' tolerance, and on the extreme rows o within 2^-5 of their largest |o| (a flushed or
    overflowed P is off by all of it) and lse within cap·2^-10 (tanh.approx's ~2^-11 on t, doubled)."""
    if "cuda-hopper" not in CUDA_BACKENDS:
        pytest.skip("no CUDA device (or cuda-hopper is not usable on it)")
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    q, k, v, dout = extreme_rows_inputs(torch, shape, rng)
    want = oracle(*(x.double().cpu().numpy() for x in (q, k, v, dout)), softcap=cap, **opts)
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = ft.attention(qg, kg, vg, softcap=cap, backend="cuda-hopper", return_lse=True, **opts)
    o.backward(dout)
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, qg.grad, kg.grad, vg.grad))
    check_against(got, want, 4e-2, name)
    for rows in (slice(0, None, 3), slice(1, None, 3)):  # every key far below the cap; far above
        o_got, o_want = got[0][:, rows], want[0][:, rows]
        err = np.abs(o_got - o_want).max()
        assert err <= 2**-5 * np.abs(o_want).max(), f"{name}: o of rows {rows} error {err:.3g}"
        err = np.abs(got[1][:, :, rows] - want[1][:, :, rows]).max()
        assert err <= cap * 2**-10 + 1e-3, f"{name}: lse of rows {rows} error {err:.3g}"


# Softcap with rows that see no key or hold a NaN, on each kernel of the plan: (b, sq, sk, hq, hkv, d), options
HOPPER_SOFTCAP_CASES = [
    ("d128-persistent", (2, 300, 300, 2, 2, 128), {}),
    ("d64-persistent3", (2, 250, 300, 2, 1, 64), {}),
    ("causal-d256-onetile", (2, 200, 200, 2, 1, 256), dict(causal=True)),
]


def hopper_softcap_forward(torch, q, k, v, opts, **kw):
    """cuda-hopper's forward (o, lse) with softcap 30 of the 16-bit tensors q, k, v, as fp64 numpy arrays."""
    o, lse = flashc.attention(q, k, v, backend="cuda-hopper", return_lse=True, softcap=30.0, **opts, **kw)
    return o.double().cpu().numpy(), lse.double().cpu().numpy()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", HOPPER_SOFTCAP_CASES, ids=[c[0] for c in HOPPER_SOFTCAP_CASES])
def test_cuda_hopper_softcap_rows_without_keys(name, shape, opts, dtype, rng):
    """Softcap 30 with a boolean attn_mask that removes every key of some rows: row 5 of every sequence (inside a tile
    with other rows) and rows 0..191 of sequence 1 (whole tiles of 128 and 192 rows: no key block is loaded). Those
    rows give o = 0 and lse = -inf exactly, the rest the fp64 oracle's."""
    if "cuda-hopper" not in CUDA_BACKENDS:
        pytest.skip("no CUDA device (or cuda-hopper is not usable on it)")
    torch = pytest.importorskip("torch")
    b, sq, sk, hq, hkv, d = shape
    keep = rng.random((b, 1, sq, sk)) > 0.3
    keep[:, :, 5] = False
    keep[1, :, :192] = False
    tdt = getattr(torch, dtype)
    q, k, v = (torch.tensor(rng.standard_normal(s), dtype=tdt, device="cuda") for s in
               ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))  # fmt: skip
    want = oracle(*(x.double().cpu().numpy() for x in (q, k, v)), np.zeros((b, sq, hq, d)), softcap=30.0, keep=keep,
                  **opts)  # fmt: skip
    got = hopper_softcap_forward(torch, q, k, v, opts, attn_mask=torch.tensor(keep, device="cuda"))
    check_against(got, want[:2], 4e-2, f"{name} {dtype}")
    none = np.isneginf(want[1])  # [b, hq, sq]: the rows that see no key
    assert none[:, :, 5].all() and none[1, :, :192].all()
    assert np.all(got[0].transpose(0, 2, 1, 3)[none] == 0), f"{name} {dtype}: o of a row without keys is not 0"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,shape,opts", HOPPER_SOFTCAP_CASES, ids=[c[0] for c in HOPPER_SOFTCAP_CASES])
def test_cuda_hopper_softcap_nan_row(name, shape, opts, dtype, rng):
    """A NaN in one element of q (row 7 of sequence 0, head 0; the last row of the last sequence and head) makes that
    row's o and lse NaN; every other row as the fp64 oracle's."""
    if "cuda-hopper" not in CUDA_BACKENDS:
        pytest.skip("no CUDA device (or cuda-hopper is not usable on it)")
    torch = pytest.importorskip("torch")
    b, sq, sk, hq, hkv, d = shape
    tdt = getattr(torch, dtype)
    q, k, v = (torch.tensor(rng.standard_normal(s), dtype=tdt, device="cuda") for s in
               ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d)))  # fmt: skip
    q[0, 7, 0, 3] = float("nan")
    q[b - 1, sq - 1, hq - 1, 0] = float("nan")
    with np.errstate(invalid="ignore"):
        want = oracle(*(x.double().cpu().numpy() for x in (q, k, v)), np.zeros((b, sq, hq, d)), softcap=30.0, **opts)
    got = hopper_softcap_forward(torch, q, k, v, opts)
    for what, g, w in zip(("o", "lse"), got, want):
        nan = np.isnan(w)
        assert nan.sum() == 2 * (d if what == "o" else 1), (name, what)
        assert np.array_equal(np.isnan(g), nan), f"{name} {dtype}: {what}'s NaNs are not the NaN rows'"
        err = np.abs(g[~nan] - w[~nan]).max()
        assert err <= 4e-2 * max(1.0, np.abs(w[~nan]).max()), f"{name} {dtype}: {what} error {err:.3g}"


MMA_SEQUSED_CASES = [
    ("seqused-d64", 2, 2, 64, dict(seqused_q=USED_Q, seqused_k=USED_K)),
    ("seqused-causal-gqa-d128", 4, 1, 128, dict(seqused_q=USED_Q, seqused_k=USED_K, causal=True)),
    ("seqused-k-window-d32", 2, 2, 32, dict(seqused_k=USED_K, window=(9, 2))),
    ("seqused-q-deterministic-d96", 2, 1, 96, dict(seqused_q=USED_Q, causal=True, deterministic=True)),
]


@pytest.mark.skipif("cuda-mma" not in CUDA_BACKENDS, reason="no CUDA device (or not sm_80+)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,hq,hkv,d,opts", MMA_SEQUSED_CASES, ids=[c[0] for c in MMA_SEQUSED_CASES])
def test_cuda_mma_seqused(name, hq, hkv, d, opts, dtype, rng):
    """cuda-mma's seqused (torch varlen, NaN past the used rows) against the fp64 oracle on the rounded inputs; the
    rows past the used ones exactly o = 0, lse = -inf and zero gradients."""
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    cu_q, cu_k = np.cumsum([0] + LENS_Q).astype(np.int32), np.cumsum([0] + LENS_K).astype(np.int32)
    tdt = getattr(torch, dtype)
    q, k = (torch.randn(s, dtype=tdt) for s in ((cu_q[-1], hq, d), (cu_k[-1], hkv, d)))
    v, dout = (torch.randn(s, dtype=tdt) for s in ((cu_k[-1], hkv, d), (cu_q[-1], hq, d)))
    used_q, used_k = opts.get("seqused_q", LENS_Q), opts.get("seqused_k", LENS_K)
    for s in range(len(LENS_Q)):  # what lies past the used rows must never be read: NaN there shows a read
        for x, cu, used in ((q, cu_q, used_q), (dout, cu_q, used_q), (k, cu_k, used_k), (v, cu_k, used_k)):
            x[cu[s] + used[s] : cu[s + 1]] = float("nan")
    want = oracle(*(np.nan_to_num(x.double().numpy()) for x in (q, k, v, dout)), cu_q=cu_q, cu_k=cu_k,
                  used_q=opts.get("seqused_q"), used_k=opts.get("seqused_k"),
                  **{key: val for key, val in opts.items() if key in ("causal", "window")})  # fmt: skip
    q, k, v = (x.cuda().requires_grad_() for x in (q, k, v))
    o, lse = ft.attention_varlen(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), backend="cuda-mma",
                                 return_lse=True, **opts)  # fmt: skip
    o.backward(dout.cuda())
    got = tuple(x.detach().double().cpu().numpy() for x in (o, lse, q.grad, k.grad, v.grad))
    check_against(got, want, 4e-2, f"{name} cuda-mma {dtype}")
    for s in range(len(LENS_Q)):  # exactly
        rq, rk = slice(cu_q[s] + used_q[s], cu_q[s + 1]), slice(cu_k[s] + used_k[s], cu_k[s + 1])
        assert np.all(got[0][rq] == 0) and np.all(got[1][:, rq] == -np.inf) and np.all(got[2][rq] == 0), name
        assert np.all(got[3][rk] == 0) and np.all(got[4][rk] == 0), name


# ---- torch ---------------------------------------------------------------------------------------------------
def _torch_grads(fn, q, k, v, dout):
    import torch

    q, k, v = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    o, lse = fn(q, k, v)
    o.backward(torch.tensor(dout))
    return tuple(x.detach().numpy() for x in (o, lse, q.grad, k.grad, v.grad))


def test_torch_features(rng):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    b, sq, sk, hq, hkv, d, dv = 2, 21, 34, 4, 2, 16, 24
    q, k = randn(rng, (b, sq, hq, d), np.float64), randn(rng, (b, sk, hkv, d), np.float64)
    v, dout = randn(rng, (b, sk, hkv, dv), np.float64), randn(rng, (b, sq, hq, dv), np.float64)
    slopes = slopes_for("batch", b, hq)
    want = oracle(q, k, v, dout, causal=True, softcap=2.5, slopes=slopes)
    fn = lambda q, k, v: ft.attention(  # noqa: E731
        q, k, v, causal=True, softcap=2.5, alibi_slopes=torch.tensor(slopes), backend="cpu-ref", return_lse=True
    )
    check_against(_torch_grads(fn, q, k, v, dout), want, 1e-12, "torch cpu-ref")
    with pytest.raises(ValueError, match="softcap"):
        ft.attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), softcap=-2.0)
    # the module takes softcap as an option
    o = ft.FlashAttention(causal=True, softcap=2.5, backend="cpu-ref")(
        torch.tensor(q), torch.tensor(k), torch.tensor(v)
    )
    np.testing.assert_allclose(o.numpy(), oracle(q, k, v, dout, causal=True, softcap=2.5)[0], rtol=0, atol=1e-12)


def test_torch_varlen_seqused(rng):
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    cu_q, cu_k = np.cumsum([0] + LENS_Q).astype(np.int32), np.cumsum([0] + LENS_K).astype(np.int32)
    q, k = randn(rng, (cu_q[-1], 2, 8), np.float64), randn(rng, (cu_k[-1], 1, 8), np.float64)
    v, dout = randn(rng, (cu_k[-1], 1, 8), np.float64), randn(rng, (cu_q[-1], 2, 8), np.float64)
    want = oracle(q, k, v, dout, cu_q=cu_q, cu_k=cu_k, used_q=USED_Q, used_k=USED_K, softcap=4.0, causal=True)
    fn = lambda q, k, v: ft.attention_varlen(  # noqa: E731
        q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), causal=True, softcap=4.0, backend="cpu-ref",
        return_lse=True, seqused_q=torch.tensor(USED_Q, dtype=torch.int32), seqused_k=USED_K,
    )  # fmt: skip
    check_against(_torch_grads(fn, q, k, v, dout), want, 1e-12, "torch varlen seqused")


def test_torch_operators_take_the_features(rng):
    """Through flashc::fwd/bwd: opcheck (schema, fake impl, autograd registration) and torch.compile."""
    torch, _ops = need_torch_ops()
    import flashc.torch as ft

    q = torch.randn(1, 12, 2, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 15, 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 15, 2, 24, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.5, 0.125])
    opts = (None, True, -1, -1, False, "cpu-ref", 0, False)
    torch.library.opcheck(torch.ops.flashc.fwd.default, (q, k, v, None, None, *opts, 3.0, None, None, slopes))
    o, lse = _ops.fwd_impl(q.detach(), k.detach(), v.detach(), None, None, *opts, 3.0, None, None, slopes)
    assert o.shape == (1, 12, 2, 24)
    args = (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse, None, None, *opts, 3.0, None, None, slopes)
    torch.library.opcheck(torch.ops.flashc.bwd.default, args)

    def f(q, k, v):
        return ft.attention(q, k, v, causal=True, softcap=3.0, alibi_slopes=slopes, backend="cpu-ref")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    o1 = compiled(q, k, v)
    o1.sum().backward()
    g1 = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    o2 = f(q, k, v)
    o2.sum().backward()
    torch.testing.assert_close(o1, o2, rtol=0, atol=0)
    for a, b in zip(g1, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
