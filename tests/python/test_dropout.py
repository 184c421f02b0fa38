"""Attention dropout (flashc.h, "Dropout") through the numpy and torch entry points and the torch operators.

The returned mask is checked against flashc.h's definition, recomputed here with an independent numpy Philox4x32-10
(checked against Random123's known-answer vectors); cpu-ref (f64) against this file's own numpy fp64 attention given
that mask (`oracle`), forward and backward, and cpu (f32) against cpu-ref; the torch entry point against plain torch
fp64 autograd given the mask, its determinism under torch.manual_seed, and the operators under opcheck. cuda-mma
(bf16, f16) against cpu-ref given the same seed and offset, its mask bit for bit (cuda-hopper:
test_dropout_hopper.py); the other CUDA backends must refuse dropout. The CUDA tests skip with "no CUDA device" where
there is none.
"""

import numpy as np
import pytest
from conftest import BACKENDS, need_torch_ops

import flashc

CUDA_BACKENDS = [n for n, b in BACKENDS.items() if b.device == "cuda" and b.usable]
REFUSING = [n for n in CUDA_BACKENDS if n not in ("cuda-mma", "cuda-hopper")]  # these two run dropout


# ---- an independent Philox4x32-10 and the mask's definition ----------------------------------------------
def philox(ctr, key):
    """Philox4x32-10 of uint64 arrays holding 32-bit words: ctr (4, n), key (2, n) -> (4, n)."""
    c = [np.asarray(x, np.uint64) & 0xFFFFFFFF for x in ctr]
    k0, k1 = (np.asarray(x, np.uint64) & 0xFFFFFFFF for x in key)
    m = np.uint64(0xFFFFFFFF)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & m, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & m]
    return np.stack(c)


def test_philox_known_answers():
    # Random123, tests/kat_vectors: the "philox4x32 10" lines (counter, key, result)
    kat = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for ctr, key, want in kat:
        got = philox([[x] for x in ctr], [[x] for x in key])[:, 0]
        assert [int(x) for x in got] == want


def keep_mask(p, seed, offset, batch, heads, sq, sk):
    """keep [batch, heads, sq, sk] by flashc.h's rule (dense calls; lengths sq, sk): element (i, j) takes 16-bit half
    j % 8 of block offset + i·ceil(sk / 8) + j // 8, kept when it is >= t16 = floor(p·2^16 + 1/2)."""
    t16 = int(np.floor(float(np.float32(p)) * 2.0**16 + 0.5))
    i, j = np.meshgrid(np.arange(sq, dtype=np.uint64), np.arange(sk, dtype=np.uint64), indexing="ij")
    i, j = i.reshape(-1), j.reshape(-1)
    nb = np.uint64((sk + 7) // 8)
    out = np.empty((batch, heads, sq, sk), bool)
    for b in range(batch):
        for h in range(heads):
            n = np.uint64(offset) + i * nb + j // np.uint64(8)  # uint64 arithmetic wraps mod 2^64
            bh = np.full_like(n, b * heads + h)
            lo, hi = np.uint64(0xFFFFFFFF), np.uint64(32)
            words = philox([n & lo, n >> hi, bh & lo, bh >> hi],
                           [np.full_like(n, seed & 0xFFFFFFFF), np.full_like(n, seed >> 32)])  # fmt: skip
            half = j % np.uint64(8)  # bits 16·(half % 2) of word half // 2
            word = words[(half // np.uint64(2)).astype(np.int64), np.arange(n.size)]
            u = (word >> (np.uint64(16) * (half % np.uint64(2)))) & np.uint64(0xFFFF)
            out[b, h] = (u >= t16).reshape(sq, sk)
    return out


def test_keep_rate():
    """The keep rate of 2·4·96·203 elements within 5 sigma of 1 − t16/2^16, overall and per 16-bit half of the block
    (j % 8), and the definition's offset arithmetic: a row's blocks follow the previous row's, offsets wrap mod 2^64."""
    for p in (0.1, 0.5, 0.9):
        mask = keep_mask(p, 0x9E3779B97F4A7C15, 2**64 - 5, 2, 4, 96, 203)
        keep = 1.0 - np.floor(float(np.float32(p)) * 65536 + 0.5) / 65536
        for m in [mask] + [mask[..., h::8] for h in range(8)]:
            n = m.size
            assert abs(m.sum() - n * keep) < 5 * np.sqrt(n * keep * (1 - keep)), (p, m.sum(), n * keep)
    # row 1 of sk = 9 keys starts at block 2 (ceil(9 / 8)): the same bits as offset + 2 with row 0
    a, b = keep_mask(0.5, 3, 10, 1, 1, 2, 9), keep_mask(0.5, 3, 12, 1, 1, 1, 9)
    assert np.array_equal(a[0, 0, 1], b[0, 0, 0])


# ---- the oracle --------------------------------------------------------------------------------------------
def oracle(q, k, v, dout, keep, p, *, causal=False):
    """(o, lse, dq, dk, dv) in fp64 given the keep mask [B, H, Sq, Sk]; causal bottom-right."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    scale = float(np.float32(1 / np.sqrt(D)))
    Z = keep / (1.0 - float(np.float32(p)))  # the C API takes p as a float
    kk, vv = (np.repeat(x, H // Hk, axis=2) for x in (k, v))
    S = scale * np.einsum("bihd,bjhd->bhij", q, kk)
    if causal:
        S = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq, S, -np.inf)
    m = S.max(-1, keepdims=True)
    P = np.exp(S - m)
    lse = (m + np.log(P.sum(-1, keepdims=True)))[..., 0]
    P = P / P.sum(-1, keepdims=True)
    o = np.einsum("bhij,bjhd->bihd", P * Z, vv)
    dP = Z * np.einsum("bihd,bjhd->bhij", dout, vv)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = scale * np.einsum("bhij,bjhd->bihd", dS, kk)
    dk = scale * np.einsum("bhij,bihd->bjhd", dS, q).reshape(B, Sk, Hk, H // Hk, D).sum(3)
    dv = np.einsum("bhij,bihd->bjhd", P * Z, dout).reshape(B, Sk, Hk, H // Hk, D).sum(3)
    return o, lse, dq, dk, dv


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def inputs(rng, B, Sq, Sk, H, Hk, D, dtype=np.float64):
    q = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    k, v = (rng.standard_normal((B, Sk, Hk, D)).astype(dtype) for _ in range(2))
    dout = rng.standard_normal((B, Sq, H, D)).astype(dtype)
    return q, k, v, dout


# ---- numpy -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "B,Sq,Sk,H,Hk,D,causal,p",
    [(2, 17, 23, 2, 2, 16, False, 0.1), (1, 33, 40, 4, 2, 32, True, 0.5), (2, 9, 70, 2, 1, 8, False, 0.9)],
)
def test_numpy_against_oracle(rng, B, Sq, Sk, H, Hk, D, causal, p):
    q, k, v, dout = inputs(rng, B, Sq, Sk, H, Hk, D)
    seed, offset = int(rng.integers(0, 2**63)) * 2 + 1, int(rng.integers(0, 2**40))
    o, lse, mask = flashc.attention(q, k, v, causal=causal, backend="cpu-ref", return_lse=True, dropout_p=p,
                                    seed=seed, offset=offset, return_dropout_mask=True)  # fmt: skip
    assert mask.dtype == bool and mask.shape == (B, H, Sq, Sk)
    assert np.array_equal(mask, keep_mask(p, seed, offset, B, H, Sq, Sk))
    want = oracle(q, k, v, dout, mask, p, causal=causal)
    grads = flashc.attention_backward(dout, q, k, v, o, lse, causal=causal, backend="cpu-ref", dropout_p=p,
                                      seed=seed, offset=offset)  # fmt: skip
    for got, ref in zip((o, lse, *grads), want):
        assert rel(got, ref) < 1e-7 if got is lse else rel(got, ref) < 1e-12
    # cpu in f32 on the same mask
    q32, k32, v32, d32 = (x.astype(np.float32) for x in (q, k, v, dout))
    o32, lse32, m32 = flashc.attention(q32, k32, v32, causal=causal, backend="cpu", return_lse=True, dropout_p=p,
                                       seed=seed, offset=offset, return_dropout_mask=True)  # fmt: skip
    assert np.array_equal(m32, mask)
    g32 = flashc.attention_backward(d32, q32, k32, v32, o32, lse32, causal=causal, backend="cpu", dropout_p=p,
                                    seed=seed, offset=offset)  # fmt: skip
    for got, ref in zip((o32, *g32), (want[0], *want[2:])):
        assert rel(got, ref) < 1e-4


def test_numpy_varlen_mask_layout(rng):
    cu_q, cu_k = np.array([0, 5, 5, 17], np.int32), np.array([0, 9, 12, 40], np.int32)
    H, D = 2, 8
    q = rng.standard_normal((17, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((40, H, D)).astype(np.float32) for _ in range(2))
    o, mask = flashc.attention_varlen(q, k, v, cu_q, cu_k, dropout_p=0.4, seed=7, offset=3, return_dropout_mask=True)
    assert mask.shape == (3, H, 12, 28)
    for s in range(3):
        sq, sk = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        want = keep_mask(0.4, 7, 3, s + 1, H, sq, sk)[s]  # the sequence's (s, h) counters
        assert np.array_equal(mask[s, :, :sq, :sk], want)
        assert not mask[s, :, sq:].any() and not mask[s, :, :, sk:].any()
        if sq == 0:
            continue
        # each sequence alone, as a dense call of batch 1, with the mask the varlen call returned for it
        qs, ks, vs = q[cu_q[s] : cu_q[s + 1]], k[cu_k[s] : cu_k[s + 1]], v[cu_k[s] : cu_k[s + 1]]
        ref = oracle(qs[None], ks[None], vs[None], np.zeros_like(qs[None]), mask[s : s + 1, :, :sq, :sk], 0.4)[0]
        assert rel(o[cu_q[s] : cu_q[s + 1]], ref[0]) < 1e-5


def test_numpy_determinism_and_p0(rng):
    q, k, v, _ = inputs(rng, 1, 20, 20, 2, 2, 16, np.float32)
    a = flashc.attention(q, k, v, dropout_p=0.5, seed=1)
    assert np.array_equal(a, flashc.attention(q, k, v, dropout_p=0.5, seed=1))
    assert not np.array_equal(a, flashc.attention(q, k, v, dropout_p=0.5, seed=2))
    assert not np.array_equal(a, flashc.attention(q, k, v, dropout_p=0.5, seed=1, offset=100))
    assert np.array_equal(flashc.attention(q, k, v, dropout_p=0.0, seed=5), flashc.attention(q, k, v))


def test_numpy_refusals(rng):
    q, k, v, _ = inputs(rng, 1, 8, 8, 1, 1, 8, np.float32)
    with pytest.raises(ValueError, match="seed"):
        flashc.attention(q, k, v, dropout_p=0.1)
    # 1e-6 and 1 - 2^-17: 16-bit thresholds 0 and 2^16 (flashc.h)
    for p in (-0.1, 1.0, 1.5, float("nan"), 1e-6, 1 - 2**-17):
        with pytest.raises(ValueError, match="dropout_p"):
            flashc.attention(q, k, v, dropout_p=p, seed=1)
    for p in (2**-17, 1 - 2**-16):  # the range's edges: thresholds 1 and 2^16 - 1
        flashc.attention(q, k, v, dropout_p=p, seed=1)
    with pytest.raises(TypeError):
        flashc.attention(q, k, v, dropout_p="0.1", seed=1)
    with pytest.raises(TypeError):
        flashc.attention(q, k, v, dropout_p=0.1, seed=1.5)


@pytest.mark.parametrize("name", REFUSING or [pytest.param("cuda", marks=pytest.mark.skip("no CUDA device"))])
def test_cuda_backends_refuse(name):
    torch = pytest.importorskip("torch")
    q = torch.randn(1, 8, 1, 16, device="cuda")
    with pytest.raises(NotImplementedError, match="dropout"):
        flashc.attention(q, q, q, backend=name, dropout_p=0.1, seed=1)


@pytest.mark.skipif("cuda-mma" not in CUDA_BACKENDS, reason="no CUDA device")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "B,Sq,Sk,H,Hk,D,causal,p",
    [(2, 130, 203, 4, 2, 64, True, 0.1), (1, 77, 301, 2, 2, 128, False, 0.5), (1, 3, 1500, 2, 1, 32, False, 0.5)],
)
def test_cuda_mma_against_cpu_ref(rng, dtype, B, Sq, Sk, H, Hk, D, causal, p):
    torch = pytest.importorskip("torch")
    q, k, v, dout = inputs(rng, B, Sq, Sk, H, Hk, D)
    tq, tk, tv, tdo = (torch.tensor(x, dtype=getattr(torch, dtype), device="cuda") for x in (q, k, v, dout))
    q, k, v, dout = (x.float().cpu().double().numpy() for x in (tq, tk, tv, tdo))  # the 16-bit values, exactly
    seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**40))
    kw = dict(causal=causal, dropout_p=p, seed=seed, offset=offset)
    o, lse, mask = flashc.attention(q, k, v, backend="cpu-ref", return_lse=True, return_dropout_mask=True, **kw)
    grads = flashc.attention_backward(dout, q, k, v, o, lse, backend="cpu-ref", **kw)
    go, glse, gmask = flashc.attention(tq, tk, tv, backend="cuda-mma", return_lse=True, return_dropout_mask=True, **kw)
    assert np.array_equal(gmask.cpu().numpy().astype(bool), mask)
    ggrads = flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="cuda-mma", **kw)
    assert rel(glse.cpu().double().numpy(), lse) < 1e-3
    for got, ref in zip((go, *ggrads), (o, *grads)):
        assert rel(got.cpu().double().numpy(), ref) < 2e-2


@pytest.mark.skipif("cuda-mma" not in CUDA_BACKENDS, reason="no CUDA device")
def test_torch_cuda_generator_reserves_the_counters():
    """flashc.torch draws seed and offset from the CUDA generator and moves it past the call's counters,
    seqlen_q·ceil(seqlen_k / 8) blocks rounded up to 4: the next call's mask is the one at that offset."""
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    q = torch.randn(1, 37, 2, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 45, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gen = torch.cuda.default_generators[q.device.index or 0]
    torch.manual_seed(5)
    base, seed = gen.get_offset(), gen.initial_seed()
    a = ft.attention(q, k, v, dropout_p=0.25, backend="cuda-mma")
    step = (37 * ((45 + 7) // 8) + 3) // 4 * 4
    assert gen.get_offset() - base == step
    b = ft.attention(q, k, v, dropout_p=0.25, backend="cuda-mma")
    for got, offset in ((a, base), (b, base + step)):
        want = flashc.attention(q, k, v, dropout_p=0.25, seed=seed, offset=offset, backend="cuda-mma")
        assert torch.equal(got, want)


# ---- torch -------------------------------------------------------------------------------------------------
def test_torch_against_plain_torch():
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    g = torch.Generator().manual_seed(3)
    B, Sq, Sk, H, Hk, D, p = 2, 19, 27, 4, 2, 16, 0.3
    q = torch.randn(B, Sq, H, D, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, Sk, Hk, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    o = ft.attention(q, k, v, causal=True, dropout_p=p, seed=99, offset=4)
    dout = torch.randn(o.shape, generator=g, dtype=torch.float64)
    o.backward(dout)
    _, mask = flashc.attention(q.detach(), k.detach(), v.detach(), causal=True, dropout_p=p, seed=99, offset=4,
                               return_dropout_mask=True)  # fmt: skip
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    s = torch.einsum("bihd,bjhd->bhij", qq, kk.repeat_interleave(H // Hk, 2)) * float(np.float32(D**-0.5))
    s = s.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq), float("-inf"))
    ref = torch.einsum(
        "bhij,bjhd->bihd", s.softmax(-1) * mask / (1 - float(np.float32(p))), vv.repeat_interleave(H // Hk, 2)
    )
    ref.backward(dout)
    assert (o - ref).abs().max() < 1e-12
    for a, b in ((q.grad, qq.grad), (k.grad, kk.grad), (v.grad, vv.grad)):
        assert (a - b).abs().max() < 1e-12


def test_torch_determinism():
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    q, k, v = (torch.randn(1, 24, 2, 16) for _ in range(3))
    torch.manual_seed(11)
    a = ft.attention(q, k, v, dropout_p=0.5)
    b = ft.attention(q, k, v, dropout_p=0.5)  # the generator moved on: another mask
    torch.manual_seed(11)
    assert torch.equal(a, ft.attention(q, k, v, dropout_p=0.5))
    assert not torch.equal(a, b)
    assert torch.equal(ft.attention(q, k, v, dropout_p=0.0), ft.attention(q, k, v))
    # the backward regenerates the forward's mask: autograd's gradients equal the numpy path's with the same seed
    qq = q.clone().requires_grad_()
    o = ft.attention(qq, k, v, dropout_p=0.5, seed=5)
    o.sum().backward()
    o2, lse = flashc.attention(q, k, v, dropout_p=0.5, seed=5, return_lse=True)
    dq = flashc.attention_backward(torch.ones_like(o2), q, k, v, o2, lse, dropout_p=0.5, seed=5)[0]
    assert torch.equal(o.detach(), o2) and torch.allclose(qq.grad, dq)


def test_torch_operators():
    torch, _ops = need_torch_ops()
    from torch.library import opcheck

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, s, 2, 16, generator=g) for s in (6, 9, 9))
    opts = (None, True, -1, -1, False, "cpu", -1, False, 0.0, None, None, None, None)
    drop = (0.25, -12345, 8)
    out, lse = torch.ops.flashc.fwd(q, k, v, None, None, *opts, *drop)
    assert not torch.equal(out, torch.ops.flashc.fwd(q, k, v, None, None, *opts)[0])
    opcheck(torch.ops.flashc.fwd, (q, k, v, None, None, *opts, *drop))
    dout = torch.randn(out.shape, generator=g)
    opcheck(torch.ops.flashc.bwd, (dout, q, k, v, out, lse, None, None, *opts, *drop))
    dq, dk, dv = torch.ops.flashc.bwd(dout, q, k, v, out, lse, None, None, *opts, *drop)
    qq = q.clone().requires_grad_()
    o2 = torch.ops.flashc.fwd(qq, k, v, None, None, *opts, *drop)[0]
    (gq,) = torch.autograd.grad(o2, (qq,), dout)  # the operator's autograd passes the dropout arguments on
    assert torch.equal(gq, dq)

    def f(q_):
        import flashc.torch as ft

        return ft.attention(q_, k, v, causal=True, backend="cpu", dropout_p=0.25, seed=7)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q), f(q))
