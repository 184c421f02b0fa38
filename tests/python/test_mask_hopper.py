"""attn_mask on cuda-hopper: its forward (o, lse) against cpu-ref (fp64) on the same 16-bit inputs, bf16 and f16.

Every kernel the forward's plan picks runs a case (the persistent kernel at D = 64 with 3 consumers, at D = 128 and
D = 256; the one-tile kernel at D = 256 with a causal mask and at D = 128 causal from seqlen_k 8192) with boolean masks
(random, padding with per-sequence lengths: whole, not block aligned, block aligned, 1 key, none; left padding; a run
of keys removed in the middle of the rows), float biases with some -inf, causal + padding, seqlen_q != seqlen_k, GQA,
and the mask shapes SDPA broadcasts ((B, H, Sq, Sk), (B, 1, Sq, Sk), (Sq, Sk), (B, 1, 1, Sk), and an expanded view
with stride 0). Odd seqlen_k and sliced masks take the element-by-element loads, even ones the paired loads.

The backward of a cuda-hopper forward runs on cuda-hopper (with a float bias's gradient, dbias), through auto and on
cuda-mma: each against cpu-ref (tests/python/test_mask_hopper_bwd.py checks
cuda-hopper's backward itself on every kernel). Skips with "no CUDA device" without one, and "no sm_90" where
cuda-hopper is not usable.
"""

import pytest
from conftest import hopper_skip_reason

import flashc

SKIP = hopper_skip_reason()
needs_hopper = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


def _bc(D):
    """cuda-hopper's forward keys per block (hopper/fwd.cu: 80 at D = 256, else 128)."""
    return 80 if D > 128 else 128


def _lengths(B, Sk, D):
    """Per-sequence key lengths: all, not block aligned, block aligned, one key, none (cycled over the batch)."""
    bc = _bc(D)
    return [[Sk, Sk - 37, max(bc, (Sk // 2) // bc * bc), 1, 0][b % 5] for b in range(B)]


def make_mask(torch, g, kind, B, H, Sq, Sk, D, shape, dt):
    """The mask of one case, on the CPU: bool, or a float bias of dtype dt."""
    full = (B, H, Sq, Sk)
    if kind == "bool":
        return torch.rand(shape, generator=g) > 0.3
    if kind == "float":
        m = torch.randn(shape, generator=g)
        m[torch.rand(shape, generator=g) < 0.05] = float("-inf")
        return m.to(dt)
    j = torch.arange(Sk)
    keep = torch.zeros(B, Sk, dtype=torch.bool)
    for b, n in enumerate(_lengths(B, Sk, D)):
        if kind == "padding":
            keep[b] = j < n
        elif kind == "left":  # left padding: the first Sk - n keys removed
            keep[b] = j >= Sk - n
        elif kind == "middle":  # whole blocks removed in the middle of the rows, then a run not block aligned
            lo, hi = (_bc(D), 3 * _bc(D)) if b % 2 == 0 else (70, 333)
            keep[b] = (j < lo) | (j >= hi)
    m = keep[:, None, None, :]
    if shape == "expanded":  # [B, H, Sq, Sk] with strides (Sk, 0, 0, 1)
        return m.expand(full)
    return m.expand(shape).contiguous()


# (B, Sq, Sk, H, Hk, D, mask kind, mask shape (or "expanded"), causal)
CASES = [
    pytest.param(2, 200, 300, 2, 2, 128, "bool", "BHSS", False, id="bool-full-d128"),
    pytest.param(2, 150, 203, 2, 2, 64, "bool", "B1SS", False, id="bool-batch-d64-odd-sk"),
    pytest.param(1, 170, 250, 2, 1, 256, "bool", "SS", False, id="bool-2d-d256-mqa"),
    pytest.param(2, 130, 256, 4, 2, 128, "float", "BHSS", False, id="float-full-d128-gqa"),
    pytest.param(1, 200, 203, 2, 2, 256, "float", "SS", True, id="float-2d-d256-causal-odd-sk"),
    pytest.param(2, 300, 300, 2, 1, 64, "float", "B11S", True, id="float-padding-shape-d64-causal"),
    pytest.param(5, 256, 384, 2, 1, 128, "padding", "B11S", False, id="padding-d128"),
    pytest.param(5, 200, 384, 4, 2, 64, "padding", "B11S", False, id="padding-d64-gqa"),
    pytest.param(5, 160, 400, 2, 2, 256, "padding", "B11S", False, id="padding-d256"),
    pytest.param(5, 130, 384, 2, 2, 128, "padding", "expanded", False, id="padding-expanded-d128"),
    pytest.param(5, 100, 300, 2, 2, 128, "padding", "B1SS", False, id="padding-rows-d128"),
    pytest.param(3, 1, 300, 2, 2, 128, "padding", "B11S", False, id="padding-one-row-d128"),
    pytest.param(5, 130, 384, 2, 2, 128, "left", "B11S", False, id="left-padding-d128"),
    pytest.param(5, 210, 400, 2, 2, 64, "left", "B11S", True, id="left-padding-d64-causal"),
    pytest.param(2, 256, 640, 2, 2, 128, "middle", "B11S", False, id="middle-d128"),
    pytest.param(2, 130, 640, 2, 2, 256, "middle", "B11S", False, id="middle-d256"),
    pytest.param(5, 384, 384, 2, 2, 128, "padding", "B11S", True, id="causal-padding-d128"),
    pytest.param(5, 300, 200, 2, 1, 64, "padding", "B11S", True, id="causal-padding-d64-sq>sk"),
    pytest.param(5, 200, 300, 2, 2, 256, "padding", "B11S", True, id="causal-padding-d256"),
    pytest.param(2, 256, 8192, 1, 1, 128, "padding", "B11S", True, id="causal-padding-d128-long"),
]

SHAPES = {
    "BHSS": lambda B, H, Sq, Sk: (B, H, Sq, Sk),
    "B1SS": lambda B, H, Sq, Sk: (B, 1, Sq, Sk),
    "SS": lambda B, H, Sq, Sk: (Sq, Sk),
    "B11S": lambda B, H, Sq, Sk: (B, 1, 1, Sk),
}


def inputs(torch, dt, B, Sq, Sk, H, Hk, D, kind, shape, seed):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(B, Sq, H, D, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(B, Sk, Hk, D, generator=g).to(dt) for _ in range(2))
    mshape = "expanded" if shape == "expanded" else SHAPES[shape](B, H, Sq, Sk)
    mask = make_mask(torch, g, kind, B, H, Sq, Sk, D, mshape, dt)
    return q, k, v, dout, mask


def on(torch, x, device, dtype=None):
    """x on device (as dtype); an expanded mask keeps its stride-0 view (the kernels read the broadcast)."""
    if x.dtype != torch.bool and dtype is not None:
        x = x.to(dtype)
    if x.stride().count(0):
        return x[:, :1, :1, :].to(device).expand(x.shape)
    return x.to(device)


def check(got, want, name, tol):
    """got against cpu-ref's want: the same non-finite entries (lse -inf where a row keeps no key), the finite ones
    within tol of the largest."""
    import torch

    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape, name
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin) and torch.equal(got[~fin], want[~fin]), name
    err = (got[fin] - want[fin]).abs().max().item() / max(want[fin].abs().max().item(), 1e-30) if fin.any() else 0.0
    assert err < tol, (name, err)


@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,D,kind,shape,causal", CASES)
def test_forward_against_cpu_ref(dtype, B, Sq, Sk, H, Hk, D, kind, shape, causal):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    q, k, v, _, mask = inputs(torch, dt, B, Sq, Sk, H, Hk, D, kind, shape, B * 1000 + Sq * 10 + Sk + D)

    def run(device, backend, cast):
        xs = [x.to(device=device, dtype=cast) for x in (q, k, v)]
        o, lse = flashc.attention(
            *xs, causal=causal, backend=backend, attn_mask=on(torch, mask, device, cast), return_lse=True
        )
        return o, lse

    o, lse = run("cuda", "cuda-hopper", dt)
    o_ref, lse_ref = run("cpu", "cpu-ref", torch.float64)
    check(o, o_ref, "o", 2e-2)
    check(lse, lse_ref, "lse", 1e-4)
    dead = torch.isinf(lse_ref) & (lse_ref < 0)  # rows that keep no key: o = 0 exactly, lse = -inf
    if kind in ("padding", "left") and B >= 5:
        assert bool(dead[4].all())  # the sequence of length 0
    o_rows = o.double().cpu().permute(0, 2, 1, 3)  # [B, H, Sq, D], as lse
    assert bool((o_rows[dead] == 0).all())


def _small(torch, dt, kind):
    """A cuda-hopper forward's inputs for the backward checks: padding or a float bias, GQA, two key blocks."""
    shape = "B11S" if kind == "padding" else "BHSS"
    return inputs(torch, dt, 3, 150, 300, 4, 2, 128, kind, shape, 7)


@needs_hopper
@pytest.mark.parametrize("kind", ["padding", "float"])
@pytest.mark.parametrize("backend", ["auto", "cuda-hopper", "cuda-mma"])
def test_backward_of_hopper_forward(kind, backend):
    """o, lse from cuda-hopper's forward, the backward on cuda-hopper, through auto and on cuda-mma, against cpu-ref's
    gradients, a float bias's gradient too."""
    torch = pytest.importorskip("torch")
    dt = torch.bfloat16
    q, k, v, dout, mask = _small(torch, dt, kind)
    xs = [x.cuda() for x in (q, k, v)]
    m = on(torch, mask, "cuda", dt)
    o, lse = flashc.attention(*xs, backend="cuda-hopper", attn_mask=m, return_lse=True)
    want_dbias = kind == "float"
    got = flashc.attention_backward(dout.cuda(), *xs, o, lse, backend=backend, attn_mask=m, return_dbias=want_dbias)
    rs = [x.double() for x in (q, k, v)]
    mr = on(torch, mask, "cpu", torch.float64)
    o_ref, lse_ref = flashc.attention(*rs, backend="cpu-ref", attn_mask=mr, return_lse=True)
    want = flashc.attention_backward(
        dout.double(), *rs, o_ref, lse_ref, backend="cpu-ref", attn_mask=mr, return_dbias=want_dbias
    )
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        check(a, b, name, 2e-2)


@needs_hopper
@pytest.mark.parametrize("kind", ["bool", "padding", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_with_mask(kind, causal):
    """softcap with attn_mask on cuda-hopper, o, lse and the gradients against cpu-ref: a boolean mask keeps softcap's
    scores as tanh(S*scale/cap), the cap in the softmax's factors (hopper/score_mod.cuh, fc_hp_cap_t), a float bias
    is added to cap*tanh; long enough for whole key blocks in the forward and the backward."""
    torch = pytest.importorskip("torch")
    dt = torch.bfloat16
    shape = "B11S" if kind == "padding" else "BHSS"
    q, k, v, dout, mask = inputs(torch, dt, 5 if kind == "padding" else 2, 400, 600, 2, 1, 128, kind, shape, 11)
    xs = [x.cuda() for x in (q, k, v)]
    m = on(torch, mask, "cuda", dt)
    kw = dict(causal=causal, softcap=5.0)
    o, lse = flashc.attention(*xs, backend="cuda-hopper", attn_mask=m, return_lse=True, **kw)
    got = flashc.attention_backward(dout.cuda(), *xs, o, lse, backend="cuda-hopper", attn_mask=m, **kw)
    rs = [x.double() for x in (q, k, v)]
    mr = on(torch, mask, "cpu", torch.float64)
    o_ref, lse_ref = flashc.attention(*rs, backend="cpu-ref", attn_mask=mr, return_lse=True, **kw)
    want = flashc.attention_backward(dout.double(), *rs, o_ref, lse_ref, backend="cpu-ref", attn_mask=mr, **kw)
    check(o, o_ref, "o", 2e-2)
    check(lse, lse_ref, "lse", 1e-4)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        check(a, b, name, 2e-2)


@needs_hopper
@pytest.mark.parametrize("kind", ["bool", "padding", "float"])
@pytest.mark.parametrize("causal,sq,sk", [(False, 400, 600), (True, 400, 600), (True, 200, 8192)])
def test_alibi_with_mask(kind, causal, sq, sk):
    """ALiBi with attn_mask on cuda-hopper, o, lse and the gradients against cpu-ref (ALiBi's general and linear
    forms beside the mask's classes of blocks); 8192 keys causal run the one-tile forward, the others the persistent
    one."""
    torch = pytest.importorskip("torch")
    dt = torch.bfloat16
    shape = "B11S" if kind == "padding" else "BHSS"
    q, k, v, dout, mask = inputs(torch, dt, 3 if kind == "padding" else 1, sq, sk, 2, 1, 128, kind, shape, 12)
    xs = [x.cuda() for x in (q, k, v)]
    m = on(torch, mask, "cuda", dt)
    slopes = torch.tensor([0.5, 0.0625], dtype=torch.float32)
    kw = dict(causal=causal)
    o, lse = flashc.attention(*xs, backend="cuda-hopper", attn_mask=m, alibi_slopes=slopes.cuda(), return_lse=True,
                              **kw)  # fmt: skip
    got = flashc.attention_backward(dout.cuda(), *xs, o, lse, backend="cuda-hopper", attn_mask=m,
                                    alibi_slopes=slopes.cuda(), **kw)  # fmt: skip
    rs = [x.double() for x in (q, k, v)]
    mr = on(torch, mask, "cpu", torch.float64)
    o_ref, lse_ref = flashc.attention(*rs, backend="cpu-ref", attn_mask=mr, alibi_slopes=slopes, return_lse=True, **kw)
    want = flashc.attention_backward(dout.double(), *rs, o_ref, lse_ref, backend="cpu-ref", attn_mask=mr,
                                     alibi_slopes=slopes, **kw)  # fmt: skip
    check(o, o_ref, "o", 2e-2)
    check(lse, lse_ref, "lse", 1e-4)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        check(a, b, name, 2e-2)


@needs_hopper
def test_torch_autograd_through_auto():
    """flashc.torch with backend auto: forward and backward of a padding mask on the GPU against cpu-ref."""
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    dt = torch.float16
    q, k, v, dout, mask = _small(torch, dt, "padding")
    xs = [x.cuda().requires_grad_() for x in (q, k, v)]
    o = ft.attention(*xs, attn_mask=mask.cuda())
    got = torch.autograd.grad(o, xs, dout.cuda())
    rs = [x.double().requires_grad_() for x in (q, k, v)]
    o_ref = ft.attention(*rs, backend="cpu-ref", attn_mask=mask)
    want = torch.autograd.grad(o_ref, rs, dout.double())
    check(o.detach(), o_ref.detach(), "o", 2e-2)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        check(a, b, name, 2e-2)


def test_lengths_cover_the_cases():
    """The padding lengths hold every case the file names: whole, not aligned, block aligned, 1, 0 (a test of the
    cases themselves, so that a change to _lengths cannot quietly drop one)."""
    for D in (64, 128, 256):
        Sk, bc = 400, _bc(D)
        n = _lengths(5, Sk, D)
        assert n[0] == Sk and n[1] % bc != 0 and n[2] % bc == 0 and 0 < n[2] < Sk and n[3] == 1 and n[4] == 0
