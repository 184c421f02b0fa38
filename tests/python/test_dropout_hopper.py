"""Attention dropout on cuda-hopper (flashc.h, "Dropout"; hopper/score_mod.cuh, hopper/bwd_launch.cuh), against cpu-ref.

Given the same seed and offset cuda-hopper's o, lse (bf16, f16) and dq, dk, dv are checked against cpu-ref (fp64, on
the same 16-bit inputs), its debug mask bit for bit against cpu-ref's and cuda-mma's, over head dims 64/128/256, causal
or not, odd lengths, seqlen_q != seqlen_k, GQA, varlen, softcap, and the deterministic backward. The bits the kernels
themselves apply are read back exactly: with V = I on a run of visible keys (every other key's score far below), o's
entries are P∘Z of those keys, nonzero where kept; with dO = I likewise dV's, so the forward's and the backward's keep
bits are compared with the mask bit for bit at key blocks past the first. The same seed twice gives identical bits, and
the keep rate seen by the kernel is within 5 sigma of 1 − p. cuda-hopper has no dropout in the D = 256 backward nor
in the backward with a float attn_mask: it must refuse them, naming dropout, and `auto` must run them on cuda-mma. Every test skips with "no CUDA device" where
cuda-hopper cannot run (no GPU, not sm_90, or no torch with CUDA).
"""

import numpy as np
import pytest
from conftest import BACKENDS

import flashc

HOPPER = BACKENDS.get("cuda-hopper")
MMA = BACKENDS.get("cuda-mma")
pytestmark = pytest.mark.skipif(
    HOPPER is None or not HOPPER.usable,
    reason="no CUDA device (cuda-hopper "
    + ("is not in this build)" if HOPPER is None else f"is not usable here: {HOPPER.why_unusable})"),
)


def need_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    return torch


def rel(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / max(np.abs(ref).max(), 1e-30))


def host(x):
    return x.float().cpu().double().numpy()


def make(rng, torch, dtype, qshape, kshape):
    """q, dout of qshape and k, v of kshape as 16-bit CUDA tensors, and their exact fp64 values."""
    t = [torch.tensor(rng.standard_normal(s), dtype=getattr(torch, dtype), device="cuda")
         for s in (qshape, kshape, kshape, qshape)]  # fmt: skip
    return t, [host(x) for x in t]


def against_cpu_ref(t, n, kw, varlen=None, bwd=True):
    """cuda-hopper's (o, lse, mask, dq, dk, dv) against cpu-ref's on the same inputs and options; varlen: cu_q, cu_k."""
    tq, tk, tv, tdo = t
    q, k, v, dout = n
    fwd = flashc.attention_varlen if varlen else flashc.attention
    bwd_fn = flashc.attention_varlen_backward if varlen else flashc.attention_backward
    cu = tuple(varlen) if varlen else ()
    o, lse, mask = fwd(q, k, v, *cu, backend="cpu-ref", return_lse=True, return_dropout_mask=True, **kw)
    go, glse, gmask = fwd(tq, tk, tv, *cu, backend="cuda-hopper", return_lse=True, return_dropout_mask=True, **kw)
    assert flashc.last_backend() == "cuda-hopper"
    assert np.array_equal(gmask.cpu().numpy().astype(bool), mask)
    lse_ref, lse_got = np.asarray(lse), glse.cpu().double().numpy()
    fin = np.isfinite(lse_ref)
    assert np.array_equal(fin, np.isfinite(lse_got))
    assert rel(lse_got[fin], lse_ref[fin]) < 1e-3
    assert rel(host(go), o) < 2e-2
    if not bwd:
        return go, glse
    grads = bwd_fn(dout, q, k, v, o, lse, *cu, backend="cpu-ref", **kw)
    ggrads = bwd_fn(tdo, tq, tk, tv, go, glse, *cu, backend="cuda-hopper", **kw)
    for name, got, ref in zip(("dq", "dk", "dv"), ggrads, grads):
        assert rel(host(got), ref) < 2e-2, name
    return go, glse


# ---- against cpu-ref -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(
    "B,Sq,Sk,H,Hk,D,causal,p,softcap",
    [
        (2, 130, 203, 4, 2, 64, True, 0.1, 0.0),
        (1, 77, 301, 2, 2, 128, False, 0.5, 0.0),
        (1, 257, 257, 2, 1, 128, True, 0.1, 0.0),
        (2, 200, 61, 2, 2, 64, True, 0.3, 0.0),  # seqlen_q > seqlen_k: the first 139 rows see no key
        (1, 150, 333, 4, 1, 128, True, 0.2, 30.0),  # softcap with GQA
        (1, 129, 190, 2, 2, 64, False, 0.7, 5.0),
    ],
)
def test_hopper_against_cpu_ref(rng, dtype, B, Sq, Sk, H, Hk, D, causal, p, softcap):
    torch = need_torch()
    t, n = make(rng, torch, dtype, (B, Sq, H, D), (B, Sk, Hk, D))
    seed, offset = int(rng.integers(0, 2**63)), int(rng.integers(0, 2**40))
    kw = dict(causal=causal, dropout_p=p, seed=seed, offset=offset, softcap=softcap)
    against_cpu_ref(t, n, kw)


@pytest.mark.parametrize("D", [64, 128])
def test_hopper_deterministic_backward(rng, D):
    """The deterministic dK/dV kernel (hopper/bwd_launch.cuh) with dropout: against cpu-ref, and bit-identical twice."""
    torch = need_torch()
    t, n = make(rng, torch, "bfloat16", (2, 190, 4, D), (2, 250, 2, D))
    kw = dict(causal=True, dropout_p=0.25, seed=12345, offset=77, deterministic=True)
    go, glse = against_cpu_ref(t, n, kw)
    tq, tk, tv, tdo = t
    a = flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="cuda-hopper", **kw)
    b = flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="cuda-hopper", **kw)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("D", [64, 128])
def test_hopper_varlen(rng, dtype, D):
    """Varlen (O stored without TMA: D = 64's persistent kernel, D = 128's one-tile kernel): each sequence its own
    (b, h) counters and lengths; one empty sequence, odd lengths."""
    torch = need_torch()
    cu_q, cu_k = np.array([0, 70, 70, 263], np.int32), np.array([0, 131, 140, 460], np.int32)
    t, n = make(rng, torch, dtype, (263, 4, D), (460, 2, D))
    kw = dict(causal=True, dropout_p=0.15, seed=99, offset=1 << 33)
    against_cpu_ref(t, n, kw, varlen=(cu_q, cu_k))
    kw = dict(causal=False, dropout_p=0.4, seed=5, offset=0, softcap=20.0)
    against_cpu_ref(t, n, kw, varlen=(cu_q, cu_k))


def test_hopper_d256_forward_and_backward_refusal(rng):
    """D = 256 (Bc = 80: 10 Philox blocks per row, in groups of 8 and 2): the forward against cpu-ref; the backward
    refused on cuda-hopper, naming dropout, and run on cuda-mma under auto."""
    torch = need_torch()
    t, n = make(rng, torch, "bfloat16", (1, 150, 2, 256), (1, 211, 2, 256))
    kw = dict(causal=True, dropout_p=0.2, seed=3, offset=40)
    go, glse = against_cpu_ref(t, n, kw, bwd=False)
    tq, tk, tv, tdo = t
    with pytest.raises(NotImplementedError, match="dropout"):
        flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="cuda-hopper", **kw)
    q, k, v, dout = n
    o, lse = flashc.attention(q, k, v, backend="cpu-ref", return_lse=True, **kw)
    grads = flashc.attention_backward(dout, q, k, v, o, lse, backend="cpu-ref", **kw)
    ggrads = flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="auto", **kw)
    assert flashc.last_backend() == "cuda-mma"
    for got, ref in zip(ggrads, grads):
        assert rel(host(got), ref) < 2e-2


def test_hopper_float_mask_backward_refusal(rng):
    """Dropout with a float attn_mask: the forward on cuda-hopper; its backward refused there, naming dropout, and run
    on cuda-mma under auto, against cpu-ref."""
    torch = need_torch()
    t, n = make(rng, torch, "bfloat16", (1, 70, 2, 64), (1, 90, 2, 64))
    bias = rng.standard_normal((1, 2, 70, 90))
    tb = torch.tensor(bias, dtype=torch.bfloat16, device="cuda")
    kw = dict(dropout_p=0.2, seed=8, offset=16)
    tq, tk, tv, tdo = t
    q, k, v, dout = n
    hb = host(tb)
    o, lse = flashc.attention(q, k, v, backend="cpu-ref", return_lse=True, attn_mask=hb, **kw)
    grads = flashc.attention_backward(dout, q, k, v, o, lse, backend="cpu-ref", attn_mask=hb, **kw)
    go, glse = flashc.attention(tq, tk, tv, backend="cuda-hopper", return_lse=True, attn_mask=tb, **kw)
    assert rel(host(go), o) < 2e-2
    with pytest.raises(NotImplementedError, match="dropout"):
        flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="cuda-hopper", attn_mask=tb, **kw)
    ggrads = flashc.attention_backward(tdo, tq, tk, tv, go, glse, backend="auto", attn_mask=tb, **kw)
    assert flashc.last_backend() == "cuda-mma"
    for got, ref in zip(ggrads, grads):
        assert rel(host(got), ref) < 2e-2


# ---- the kernels' own bits -------------------------------------------------------------------------------------
def probe(torch, D, Sq, Sk, k_lo, H=2):
    """q, k, v, dout (bf16) such that row i's softmax is uniform over keys k_lo .. k_lo + D − 1 and 0 elsewhere (their
    scores −100·100·scale below), v = I on those keys and dout = I on the rows (Sq ≤ D): o[i, c] = P∘Z of key k_lo + c
    and dv[k_lo + c, i] = P∘Z of row i, each rp/D where kept and exactly 0 where dropped."""
    q = torch.zeros(1, Sq, H, D, device="cuda", dtype=torch.bfloat16)
    q[..., 0] = 100.0
    k = torch.zeros(1, Sk, H, D, device="cuda", dtype=torch.bfloat16)
    k[:, :k_lo, :, 0] = -100.0
    k[:, k_lo + D :, :, 0] = -100.0
    v = torch.zeros(1, Sk, H, D, device="cuda", dtype=torch.bfloat16)
    v[0, k_lo : k_lo + D] = torch.eye(D, device="cuda", dtype=torch.bfloat16)[:, None, :]
    dout = torch.zeros(1, Sq, H, D, device="cuda", dtype=torch.bfloat16)
    dout[0] = torch.eye(D, device="cuda", dtype=torch.bfloat16)[:Sq, None, :]
    return q, k, v, dout


@pytest.mark.parametrize("D,Sq,Sk,k_lo", [(64, 64, 400, 264), (128, 100, 300, 136), (128, 128, 128, 0),
                                          (256, 90, 500, 176)])  # fmt: skip
def test_hopper_applies_the_mask_bit_for_bit(D, Sq, Sk, k_lo):
    torch = need_torch()
    q, k, v, dout = probe(torch, D, Sq, Sk, k_lo)
    kw = dict(dropout_p=0.3, seed=0xDEADBEEF12345, offset=1000)
    o, lse, mask = flashc.attention(q, k, v, backend="cuda-hopper", return_lse=True, return_dropout_mask=True, **kw)
    torch.cuda.synchronize()
    want = mask.cpu().numpy().astype(bool)[0, :, :, k_lo : k_lo + D]  # [H, Sq, D]
    got = (o.float().cpu().numpy()[0] > 0).transpose(1, 0, 2)  # o[0, i, h, c] → [H, Sq, D]
    assert np.array_equal(got, want)
    assert not (o.float() < 0).any()
    if D > 128:
        return  # no dropout in the D = 256 backward (test_hopper_d256_forward_and_backward_refusal)
    _, _, dv = flashc.attention_backward(dout, q, k, v, o, lse, backend="cuda-hopper", **kw)
    # dv[0, k_lo + c, h, i] → [h, i, c]
    got_v = (dv.float().cpu().numpy()[0, k_lo : k_lo + D, :, :Sq] > 1e-6).transpose(1, 2, 0)
    assert np.array_equal(got_v, want)


def test_hopper_keep_rate_and_reproducibility():
    """The kernel's own keep bits (probe) over 2·128·128 elements × 8 seeds: the kept fraction within 5 sigma of
    1 − t16/2^16; the same seed and offset twice give identical o, another seed another mask."""
    torch = need_torch()
    q, k, v, _ = probe(torch, 128, 128, 128, 0)
    for p in (0.1, 0.5, 0.9):
        kept, n = 0, 0
        for seed in range(8):
            o = flashc.attention(q, k, v, backend="cuda-hopper", dropout_p=p, seed=seed, offset=seed << 20)
            kept += int((o > 0).sum())
            n += o.numel()
        keep = 1.0 - np.floor(float(np.float32(p)) * 65536 + 0.5) / 65536
        assert abs(kept - n * keep) < 5 * np.sqrt(n * keep * (1 - keep)), (p, kept, n * keep)
    a = flashc.attention(q, k, v, backend="cuda-hopper", dropout_p=0.5, seed=1, offset=2)
    assert torch.equal(a, flashc.attention(q, k, v, backend="cuda-hopper", dropout_p=0.5, seed=1, offset=2))
    assert not torch.equal(a, flashc.attention(q, k, v, backend="cuda-hopper", dropout_p=0.5, seed=2, offset=2))


@pytest.mark.skipif(MMA is None or not MMA.usable, reason="no CUDA device (cuda-mma)")
def test_hopper_and_mma_draw_the_same_bits(rng):
    """cuda-hopper's and cuda-mma's debug masks, and the bits their kernels apply (probe), are identical."""
    torch = need_torch()
    t, _ = make(rng, torch, "bfloat16", (2, 133, 2, 128), (2, 171, 2, 128))
    kw = dict(causal=True, dropout_p=0.35, seed=2024, offset=5, return_dropout_mask=True)
    masks = [flashc.attention(*t[:3], backend=b, **kw)[1] for b in ("cuda-hopper", "cuda-mma")]
    assert torch.equal(masks[0], masks[1])
    q, k, v, _ = probe(torch, 128, 100, 300, 136)
    kw = dict(dropout_p=0.35, seed=2024, offset=5)
    o = [flashc.attention(q, k, v, backend=b, **kw) for b in ("cuda-hopper", "cuda-mma")]
    assert torch.equal(o[0] > 0, o[1] > 0)
