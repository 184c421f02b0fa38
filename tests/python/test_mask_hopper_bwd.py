"""attn_mask in cuda-hopper's backward (dq, dk, dv, and dbias: every kernel, not with softcap, which cuda-mma runs
under auto).

The forward runs on cpu-ref in float64 (o, lse); cuda-hopper's backward is given those o and lse, cast to the 16-bit
dtype, and the 16-bit q, k, v, dout, and is checked against cpu-ref's float64 backward on the same rounded inputs,
with test_mask.py's tolerance for cuda-mma (2e-2 of the largest gradient). Cases: each head dim's kernel (64, 128,
256; deterministic at 64 and 128), random boolean masks and float biases with some -inf, padding masks [B, 1, 1, Sk]
with per-sequence lengths (not block aligned, block aligned, 1, 0: every key removed, zero gradients), left padding,
causal + padding, Sq != Sk, GQA (groups 2 and 4) and the mask shapes (B, H, Sq, Sk), (B, 1, Sq, Sk), (Sq, Sk),
(B, 1, 1, Sk). Skipped with the reason where cuda-hopper is not usable (no CUDA device, not sm_90).
"""

import numpy as np
import pytest
from conftest import BACKENDS

import flashc

HOPPER = BACKENDS.get("cuda-hopper")
if HOPPER is None or not HOPPER.usable:
    pytest.skip(
        "no CUDA device" if HOPPER is None else f"cuda-hopper: {HOPPER.why_unusable} (no sm_90)",
        allow_module_level=True,
    )
torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


def lengths_mask(B, Sq, Sk, lens, left=False, rows=False):
    """A padding mask: sequence b keeps lens[b] keys (the last ones with left padding); [B, 1, 1, Sk], or
    [B, 1, Sq, Sk] with rows (the same row repeated, as a padding mask expanded by hand)."""
    j = np.arange(Sk)[None, :]
    lens = np.asarray(lens)[:, None]
    keep = j >= Sk - lens if left else j < lens
    m = keep[:, None, None, :]
    return np.ascontiguousarray(np.broadcast_to(m, (B, 1, Sq, Sk))) if rows else m


def random_mask(rng, shape, kind):
    if kind == "bool":
        return rng.random(shape) > 0.3
    m = rng.standard_normal(shape)
    m[rng.random(shape) < 0.05] = -np.inf
    return m


def check(rng, dtype, B, Sq, Sk, H, Hk, D, mask, causal=False, deterministic=False, dbias=False):
    """cuda-hopper's backward against cpu-ref's, both from cpu-ref's float64 forward (dbias: the bias's gradient
    too, every element of it poisoned first by the library's zero pass or written)."""
    dt = getattr(torch, dtype)
    q, dout = (torch.from_numpy(rng.standard_normal((B, Sq, H, D))).to(dt) for _ in range(2))
    k, v = (torch.from_numpy(rng.standard_normal((B, Sk, Hk, D))).to(dt) for _ in range(2))
    q64, k64, v64, do64 = (x.double().numpy() for x in (q, k, v, dout))  # the 16-bit values, exactly
    if mask.dtype == bool:
        gm = torch.from_numpy(np.ascontiguousarray(mask)).cuda()
        m = mask
    else:
        gm = torch.from_numpy(np.ascontiguousarray(mask)).to("cuda", dt)  # -inf stays -inf in 16 bits
        m = gm.double().cpu().numpy()  # the bias as the GPU sees it
    kw = dict(causal=causal, scale=0.25)
    o, lse = flashc.attention(q64, k64, v64, backend="cpu-ref", return_lse=True, attn_mask=m, **kw)
    want = flashc.attention_backward(do64, q64, k64, v64, o, lse, backend="cpu-ref", attn_mask=m, return_dbias=dbias,
                                     **kw)  # fmt: skip
    cuda = [x.cuda() for x in (dout, q, k, v)]
    go = torch.from_numpy(o).to("cuda", dt)
    glse = torch.from_numpy(lse).to("cuda", torch.float32)
    got = flashc.attention_backward(*cuda[:4], go, glse, backend="cuda-hopper", attn_mask=gm,
                                    deterministic=deterministic, return_dbias=dbias, **kw)  # fmt: skip
    torch.cuda.synchronize()
    assert flashc.last_backend() == "cuda-hopper"
    assert len(got) == len(want) == (4 if dbias else 3)
    for name, a, b in zip(("dq", "dk", "dv", "dbias"), got, want):
        a = a.double().cpu().numpy()
        assert a.shape == b.shape and np.isfinite(a).all(), name
        err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)
        assert err < 2e-2, (name, err)
    if deterministic:  # bit-identical repeats
        again = flashc.attention_backward(*cuda[:4], go, glse, backend="cuda-hopper", attn_mask=gm,
                                          deterministic=True, return_dbias=dbias, **kw)  # fmt: skip
        assert all(torch.equal(x, y) for x, y in zip(got, again))
    return got, want


DTYPES = ["bfloat16", "float16"]
HEAD_DIMS = [64, 128, 256]


# ---- random masks and biases, every mask shape -----------------------------------------------------------------
# (B, Sq, Sk, H, Hk, mask shape, causal): several of each kernel's key blocks (128 keys; 64 at d 256) and query
# blocks (64 rows; 128 at d 64), edges not block aligned.
SHAPES = [
    pytest.param(2, 200, 256, 2, 2, lambda B, H, Sq, Sk: (B, H, Sq, Sk), False, id="bhss"),
    pytest.param(2, 130, 300, 4, 2, lambda B, H, Sq, Sk: (B, 1, Sq, Sk), False, id="b1ss-gqa2"),
    pytest.param(1, 257, 384, 4, 1, lambda B, H, Sq, Sk: (Sq, Sk), True, id="ss-causal-gqa4"),
    pytest.param(2, 97, 203, 2, 2, lambda B, H, Sq, Sk: (B, 1, 1, Sk), False, id="b11s"),
    pytest.param(2, 300, 130, 2, 2, lambda B, H, Sq, Sk: (B, H, Sq, Sk), True, id="sq>sk-causal"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,shape,causal", SHAPES)
def test_random_masks(rng, dtype, kind, D, B, Sq, Sk, H, Hk, shape, causal):
    mask = random_mask(rng, shape(B, H, Sq, Sk), kind)
    if mask.ndim == 4 and mask.shape[2] > 1:  # a row whose keys are all removed: zero gradients, no NaN
        mask[..., 3, :] = False if kind == "bool" else -np.inf
    check(rng, dtype, B, Sq, Sk, H, Hk, D, mask, causal)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("D", [64, 128])
def test_deterministic(rng, kind, D):
    mask = random_mask(rng, (2, 1, 200, 300), kind)
    check(rng, "bfloat16", 2, 200, 300, 4, 2, D, mask, causal=True, deterministic=True)


# ---- padding masks ------------------------------------------------------------------------------------------------
# Sequence lengths of a batch of 4 (Sk = 1000): not block aligned, block aligned (a multiple of 128 and of 64), 1,
# (a length of 0, every key removed, is test_every_key_removed).
LENS = [1000, 517, 256, 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("left", [False, True], ids=["right-pad", "left-pad"])
@pytest.mark.parametrize("rows", [False, True], ids=["b11s", "b1ss"])
def test_padding(rng, dtype, D, left, rows):
    B, Sq, Sk, H, Hk = 4, 160, 1000, 4, 2
    check(rng, dtype, B, Sq, Sk, H, Hk, D, lengths_mask(B, Sq, Sk, LENS, left, rows))


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_padding_causal_gqa4(rng, D):
    B, S, H, Hk = 3, 384, 8, 2
    check(rng, "bfloat16", B, S, S, H, Hk, D, lengths_mask(B, S, S, [384, 129, 256]), causal=True)


@pytest.mark.parametrize("D", HEAD_DIMS)
def test_every_key_removed(rng, D):
    B, Sq, Sk, H = 2, 150, 260, 2
    mask = lengths_mask(B, Sq, Sk, [0, 200])
    (dq, dk, dv), _ = check(rng, "bfloat16", B, Sq, Sk, H, H, D, mask)
    assert not dq[0].any() and not dk[0].any() and not dv[0].any()  # sequence 0 sees no key: zero gradients
    assert not dk[1, 200:].any() and not dv[1, 200:].any()  # its padded keys


# ---- dbias --------------------------------------------------------------------------------------------------------
# Every kernel writes dS into dbias (fc_hpb_dbias_put): straight in the dtype for (B, H, Sq, Sk), into fp32 sums for
# the shapes that broadcast a dim (summed over heads, batch or rows), with GQA, causal and Sq > Sk; the deterministic
# kernel into fp32 elements of their own, summed in order (bit-identical repeats).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("B,Sq,Sk,H,Hk,shape,causal", SHAPES)
def test_dbias(rng, dtype, D, B, Sq, Sk, H, Hk, shape, causal):
    mask = random_mask(rng, shape(B, H, Sq, Sk), "float")
    check(rng, dtype, B, Sq, Sk, H, Hk, D, mask, causal, dbias=True)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("shape", [(2, 1, 200, 300), (200, 300)], ids=["b1ss", "ss"])
def test_dbias_deterministic(rng, D, shape):
    check(rng, "bfloat16", 2, 200, 300, 4, 2, D, random_mask(rng, shape, "float"), True, True, dbias=True)


@pytest.mark.parametrize("D,opts,why", [(128, dict(softcap=5.0), "softcap"), (256, dict(softcap=2.0), "softcap")])
def test_dbias_refused_where_not_built(D, opts, why):
    q = torch.randn(1, 64, 2, D, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    o, lse = flashc.attention(q, q, q, backend="cuda-mma", attn_mask=bias, return_lse=True,
                              softcap=opts.get("softcap", 0.0))  # fmt: skip
    with pytest.raises(NotImplementedError, match=f"dbias.*{why}"):
        flashc.attention_backward(q, q, q, q, o, lse, backend="cuda-hopper", attn_mask=bias, return_dbias=True, **opts)
    dq, dk, dv, db = flashc.attention_backward(q, q, q, q, o, lse, attn_mask=bias, return_dbias=True, **opts)  # auto
    assert flashc.last_backend() != "cuda-hopper" and db.shape == bias.shape
