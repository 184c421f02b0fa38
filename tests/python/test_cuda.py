"""The torch path on a GPU: CUDA tensors by data_ptr and strides, on the current stream, results on the same
device. Skipped, with the reason, where torch or a CUDA device is missing."""


import numpy as np

import pytest

import flashc
from flashc.testing.reference import numpy_backward, numpy_forward

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import flashc.torch as ft  # noqa: E402

CUDA_BACKENDS = [b for b in flashc.backends() if b.device == "cuda"]
if not CUDA_BACKENDS:
    pytest.skip("this libflashc was built without CUDA backends (FLASHC_CUDA=OFF or no nvcc)", allow_module_level=True)
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f32": 1e-3, "f16": 1e-2, "bf16": 4e-2}


def params():
    out = []
    for b in CUDA_BACKENDS:
        for d in b.dtypes:
            if d in DTYPES:
                marks = [] if b.usable else [pytest.mark.skip(reason=f"{b.name}: {b.why_unusable}")]
                out.append(pytest.param(b, d, id=f"{b.name}-{d}", marks=marks))
    return out


def close(got, want, tol):
    got = got.detach().double().cpu().numpy()
    assert np.all(np.isfinite(got))
    err = np.abs(got - want).max()
    assert err <= tol * max(1.0, np.abs(want).max()), f"max |error| {err:.3g}"


@pytest.mark.parametrize("b,dtype", params())
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_backend_matches_reference(b, dtype, causal, rng):
    d = 64 if b.min_head_dim <= 64 <= b.max_head_dim else b.min_head_dim
    dt = DTYPES[dtype]
    q = torch.from_numpy(rng.standard_normal((2, 97, 4, d))).to("cuda", dt)
    k = torch.from_numpy(rng.standard_normal((2, 130, 2, d))).to("cuda", dt)
    v = torch.from_numpy(rng.standard_normal((2, 130, 2, d))).to("cuda", dt)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # flashc runs on the current stream: here a side stream
        side.wait_stream(torch.cuda.default_stream())
        o, lse = flashc.attention(q, k, v, causal=causal, backend=b.name, return_lse=True)
    side.synchronize()
    assert o.device == q.device and o.dtype == dt and lse.device == q.device
    assert flashc.last_backend() == b.name
    n = [x.double().cpu().numpy() for x in (q, k, v)]
    close(o, numpy_forward(*n, causal)[0], TOL[dtype])
    if b.has_backward:
        dout = torch.randn_like(q)
        grads = flashc.attention_backward(dout, q, k, v, o, lse, causal=causal, backend=b.name)
        torch.cuda.synchronize()
        for g, w in zip(grads, numpy_backward(dout.double().cpu().numpy(), *n, causal)):
            close(g, w, 2 * TOL[dtype])


def test_autograd_on_cuda(rng):
    b = next((b for b in CUDA_BACKENDS if b.usable and b.has_backward and "f32" in b.dtypes), None)
    if b is None:
        pytest.skip("no usable CUDA backend with an f32 backward")
    q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", requires_grad=True) for _ in range(3))
    ft.attention(q, k, v, causal=True, backend=b.name).sum().backward()
    assert q.grad.device == q.device and torch.isfinite(q.grad).all()


def test_host_memory_on_a_cuda_backend_is_refused(rng):
    b = next((b for b in CUDA_BACKENDS if b.usable), None)
    if b is None:
        pytest.skip("no usable CUDA backend")
    q = rng.standard_normal((1, 8, 1, 64)).astype(np.float32)
    with pytest.raises(ValueError, match="host memory"):
        flashc.attention(q, q, q, backend=b.name)
    qt = torch.from_numpy(q)
    with pytest.raises(ValueError, match="is on cpu but q is on cuda"):
        flashc.attention(qt.cuda(), qt, qt.cuda(), backend=b.name)


HOPPER = next((b for b in CUDA_BACKENDS if b.name == "cuda-hopper"), None)


def hopper_out(shape, o_tma):
    """An output for flashc.attention's out=: dense (the persistent forward stores O by TMA) or with an odd head stride
    (TMA cannot address it: the persistent kernel's direct stores, unaligned)."""
    if o_tma:
        return torch.empty(shape, device="cuda", dtype=torch.bfloat16)
    return torch.empty((*shape[:-1], shape[-1] + 1), device="cuda", dtype=torch.bfloat16)[..., : shape[-1]]


@pytest.mark.skipif(HOPPER is None or not HOPPER.usable, reason="cuda-hopper is not usable here (sm_90 only)")
@pytest.mark.parametrize("o_tma", [True, False], ids=["tma-store", "direct-stores"])
def test_hopper_persistent_walks_many_tiles(o_tma, rng):
    """The persistent forward with many tiles per CTA (2000-odd tiles over the SMs) and a partial last query block in
    every head, where the last warpgroups' rows lie past the sequence and run dummy trips: the producer hands each tile
    to the consumers through the tile ring, and the next tile may only be taken after those trips (a draft that took it
    before them hung here with 3 consumers). D = 64 (3 consumers), 128, 256 (O stored from registers); an o that TMA
    stores and one it cannot (the direct stores). O's error against SDPA in fp32 at most twice that of SDPA in bf16
    (plus one bf16 ulp of each element: O's own rounding);
    the same bits run to run."""
    for d, causal in ((64, False), (64, True), (128, False), (128, True), (256, False)):
        q, k, v = (torch.from_numpy(rng.standard_normal((16, 1000, 20, d))).to("cuda", torch.bfloat16)
                   for _ in range(3))
        outs = [flashc.attention(q, k, v, causal=causal, backend="cuda-hopper", out=hopper_out(q.shape, o_tma))
                for _ in range(2)]
        dense = flashc.attention(q, k, v, causal=causal, backend="cuda-hopper", out=hopper_out(q.shape, True))
        torch.cuda.synchronize()
        case = f"d {d} causal {causal} o_tma {o_tma}"
        assert torch.equal(outs[0], outs[1]), case
        assert torch.equal(outs[0], dense), f"{case}: the stores differ from the TMA store's"  # the same maths
        sdpa = torch.nn.functional.scaled_dot_product_attention
        ref = sdpa(*(x.float().transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)
        plain = sdpa(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(1, 2)  # bf16 peer
        err, err_plain = ((x.float() - ref).abs().max().item() for x in (outs[0], plain))
        # Each element within twice SDPA's worst error plus one bf16 ulp of its own size: storing O in bf16 may round
        # an element a whole ulp away where SDPA's happened not to (a 1000-key row of this input, seed of this test:
        # 0.85938 for 0.86328, cuda-hopper and cuda-mma alike, where SDPA's worst was 0.00128).
        ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(2.0**-126))) - 7)
        over = ((outs[0].float() - ref).abs() > 2 * err_plain + ulp).sum().item()
        assert over == 0, f"{case}: {over} elements past the bound; max error {err}, bf16 SDPA's {err_plain}"


@pytest.mark.skipif(HOPPER is None or not HOPPER.usable, reason="cuda-hopper is not usable here (sm_90 only)")
def test_hopper_split_rounds(rng):
    """The persistent forward's last rounds split by key blocks (stream-K: a tile cut between two CTAs, the later one
    merging the other's O, m, l), which the plan takes for unmasked dense problems in the stride order (D = 128 above
    1024 keys, D = 256 from 4096) whose tiles do not fill whole rounds of the SMs (more tiles than an H100's or H200's
    132 SMs, not a multiple of them): a partial last key block, GQA, rows past the sequence, d 100 (padded to 128),
    d 200 (padded to 256), direct stores and TMA stores. O within 2x bf16 SDPA's error of fp32 SDPA's, lse within 1e-3
    of fp32's, and deterministic (bit for bit run to run)."""
    cases = [  # (b, hq, hkv, sq, sk, d, o_tma)
        (2, 16, 16, 2048, 2048, 128, True),
        (3, 12, 4, 1000, 1900, 128, True),
        (2, 10, 10, 3000, 1100, 100, False),
        (2, 12, 12, 1000, 4096, 256, True),  # D = 256: one Q slot, O stored from registers
        (3, 12, 4, 700, 4100, 200, False),
    ]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for b, hq, hkv, sq, sk, d, o_tma in cases:
        dp = -(-d // 8) * 8
        q = torch.from_numpy(rng.standard_normal((b, sq, hq, dp))).to("cuda", torch.bfloat16)[..., :d]
        k, v = (torch.from_numpy(rng.standard_normal((b, sk, hkv, dp))).to("cuda", torch.bfloat16)[..., :d]
                for _ in range(2))
        out = [flashc.attention(q, k, v, backend="cuda-hopper", return_lse=True, out=hopper_out(q.shape, o_tma))
               for _ in range(2)]
        torch.cuda.synchronize()
        case = f"b {b} h {hq}/{hkv} sq {sq} sk {sk} d {d} o_tma {o_tma}"
        assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1]), case
        rep = hq // hkv
        qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
        kf, vf = kf.repeat_interleave(rep, dim=1), vf.repeat_interleave(rep, dim=1)
        ref = sdpa(qf, kf, vf).transpose(1, 2)
        plain = sdpa(q.transpose(1, 2), *(x.to(torch.bfloat16) for x in (kf, vf))).transpose(1, 2)
        lse_ref = torch.logsumexp(qf @ kf.transpose(-1, -2) * d**-0.5, dim=-1)  # (b, h, sq)
        o, lse = out[0]
        err, err_plain = (o.float() - ref).abs().max().item(), (plain.float() - ref).abs().max().item()
        assert err <= 2 * err_plain + 1e-3, f"{case}: max error {err}, bf16 SDPA's {err_plain}"
        lse_err = (lse.reshape(lse_ref.shape) - lse_ref).abs().max().item()
        assert lse_err <= 1e-3, f"{case}: lse error {lse_err}"


@pytest.mark.skipif(HOPPER is None or not HOPPER.usable, reason="cuda-hopper is not usable here (sm_90 only)")
def test_hopper_mask_edges(rng):
    """The Hopper forward where a causal or right-window edge runs through a tile: each consumer warpgroup stops at its
    own last visible key block, and the persistent kernel's query blocks end at the sequence's last row (causal-like
    masks). Br = 192 with Bc = 128 (D = 64), D = 256's Bc = 80 (the one-tile kernel), bottom-right shifts that are not
    a multiple of Bc, seqlens that 192 does not divide. O finite, within 2x bf16 SDPA's error of fp32 SDPA's (the mask
    given explicitly), and lse within 1e-3 of fp32's."""
    cases = [  # (sq, sk, d, causal, align, window)
        (1025, 1025, 64, True, "top-left", None),
        (2048, 2048, 64, True, "top-left", None),
        (400, 1000, 64, True, "bottom-right", None),
        (1000, 417, 64, True, "bottom-right", None),
        (777, 777, 64, False, "top-left", (-1, 37)),
        (900, 900, 128, False, "top-left", (200, 45)),
        (1000, 1000, 128, True, "top-left", None),
        (1025, 1025, 256, True, "top-left", None),
        (300, 700, 256, True, "bottom-right", None),
        (513, 513, 111, True, "top-left", None),
    ]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for sq, sk, d, causal, align, window in cases:
        dp = -(-d // 8) * 8  # rows padded to a multiple of 8 elements, as TMA needs its strides
        q, k, v = (torch.from_numpy(rng.standard_normal((2, s, 3, dp))).to("cuda", torch.bfloat16)[..., :d]
                   for s in (sq, sk, sk))
        o, lse = flashc.attention(q, k, v, causal=causal, window=window, causal_align=align, backend="cuda-hopper",
                                  return_lse=True)
        torch.cuda.synchronize()
        case = f"sq {sq} sk {sk} d {d} causal {causal} {align} window {window}"
        assert torch.isfinite(o.float()).all(), case
        i, j = torch.arange(sq, device="cuda")[:, None], torch.arange(sk, device="cuda")[None, :]
        shift = sk - sq if align == "bottom-right" else 0
        left, right = (-1, 0) if causal else window
        mask = j <= i + shift + right
        if left >= 0:
            mask &= j >= i + shift - left
        qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))
        ref = sdpa(qf, kf, vf, attn_mask=mask).transpose(1, 2)
        plain = sdpa(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask).transpose(1, 2)
        err, err_plain = (o.float() - ref).abs().max().item(), (plain.float() - ref).abs().max().item()
        assert err <= 2 * err_plain + 1e-3, f"{case}: max error {err}, bf16 SDPA's {err_plain}"
        lse_ref = torch.logsumexp((qf @ kf.transpose(-1, -2) * d**-0.5).masked_fill(~mask, float("-inf")), dim=-1)
        lse = lse.reshape(lse_ref.shape)
        no_key = torch.isneginf(lse_ref)  # rows that see no key: lse −inf on both sides (their difference is NaN)
        assert torch.equal(torch.isneginf(lse), no_key), f"{case}: rows with lse −inf differ"
        lse_err = (lse - lse_ref).masked_fill(no_key, 0.0).abs().max().item()
        assert lse_err <= 1e-3, f"{case}: lse error {lse_err}"


def tensor_core_backends():
    out = []
    for name in ("cuda-hopper", "cuda-mma"):
        b = next((b for b in CUDA_BACKENDS if b.name == name), None)
        usable = b is not None and b.usable and b.has_backward
        out.append(pytest.param(name, id=name, marks=[] if usable else [
            pytest.mark.skip(reason=f"{name} is not usable here" + (f": {b.why_unusable}" if b else ""))]))
    return out


@pytest.mark.parametrize("backend", tensor_core_backends())
def test_backward_tile_order_gives_the_same_bits(backend, rng):
    """The tensor-core backwards' dK/dV grids walk their last two waves' (sequence, kv head) pairs key block by key
    block where a right mask edge makes the tiles differ in length (src/cuda/common/tail_order.cuh). Deterministic mode's dQ
    adds take turns key block by key block and must still make progress in that order (a run that finishes is the
    check), and give the same bits run to run. Cases with the whole grid in the tail order and with both orders, D =
    64, 128, 256, GQA, bottom-right shifts, a window; the gradients within 3x bf16 SDPA's error of fp32 SDPA's."""
    cases = [  # (b, hq, hkv, sq, sk, d, causal, align, window)
        (2, 6, 3, 1000, 1000, 64, True, "top-left", None),
        (4, 24, 24, 1000, 1000, 64, True, "top-left", None),
        (3, 16, 8, 700, 1100, 128, True, "bottom-right", None),
        (2, 8, 8, 900, 1500, 128, True, "bottom-right", None),
        (2, 4, 4, 999, 999, 128, False, "top-left", (300, 45)),
        (2, 4, 2, 777, 777, 256, True, "top-left", None),
    ]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for b, hq, hkv, sq, sk, d, causal, align, window in cases:
        q = torch.from_numpy(rng.standard_normal((b, sq, hq, d))).to("cuda", torch.bfloat16)
        k, v = (torch.from_numpy(rng.standard_normal((b, sk, hkv, d))).to("cuda", torch.bfloat16) for _ in range(2))
        dout = torch.from_numpy(rng.standard_normal((b, sq, hq, d))).to("cuda", torch.bfloat16)
        kw = dict(causal=causal, window=window, causal_align=align, backend=backend)
        o, lse = flashc.attention(q, k, v, return_lse=True, **kw)
        case = f"b {b} h {hq}/{hkv} sq {sq} sk {sk} d {d} causal {causal} {align} window {window}"
        grads = {"2": flashc.attention_backward(dout, q, k, v, o, lse, **kw)}
        if d <= 128 or backend == "cuda-mma":
            det = [flashc.attention_backward(dout, q, k, v, o, lse, deterministic=True, **kw) for _ in range(2)]
            for name, got, want in zip("qkv", det[0], det[1]):
                assert torch.equal(got, want), f"{case}: deterministic d{name} differs run to run"
        torch.cuda.synchronize()
        # the default order's gradients against fp32 SDPA's (GQA: k, v repeated over their query heads)
        rep = hq // hkv
        # the mask as an explicit one (SDPA's is_causal is top-left only)
        i, j = torch.arange(sq, device="cuda")[:, None], torch.arange(sk, device="cuda")[None, :]
        if causal:
            mask = j <= i + (sk - sq if align == "bottom-right" else 0)
        else:
            mask = (j >= i - window[0]) & (j <= i + window[1])

        def grads_of(dt):
            x = [t.to(dt).transpose(1, 2).detach().requires_grad_() for t in (q, k, v)]
            kk, vv = (t.repeat_interleave(rep, dim=1) for t in x[1:])
            y = sdpa(x[0], kk, vv, attn_mask=mask)
            y.backward(dout.to(dt).transpose(1, 2))
            return [t.grad.transpose(1, 2) for t in x]

        ref, plain = grads_of(torch.float32), grads_of(torch.bfloat16)
        for name, got, r, p in zip("qkv", grads["2"], ref, plain):
            err, err_plain = (got.float() - r).abs().max().item(), (p.float() - r).abs().max().item()
            assert err <= 3 * err_plain + 1e-3, f"{case}: d{name} max error {err}, bf16 SDPA's {err_plain}"


@pytest.mark.parametrize("backend", tensor_core_backends())
def test_forward_tile_order_gives_the_same_bits(backend, rng):
    """The one-tile forwards (cuda-mma's; cuda-hopper's ping-pong kernel, which its plan runs at d 129-256 with a mask
    and at d 65-128 with a causal mask from 8192 keys) walk their last two waves' (sequence, query head) pairs query
    block by query block under a causal or right-window mask (common/tail_order.cuh): O and lse the same bits run to run, O
    within 2x bf16 SDPA's error of fp32 SDPA's."""
    cases = [  # (b, hq, hkv, sq, sk, d, align, window)
        (2, 6, 3, 1000, 1000, 64, "top-left", None),
        (4, 24, 24, 700, 700, 128, "top-left", None),
        (2, 8, 4, 900, 1500, 128, "bottom-right", None),
        (1, 4, 2, 1000, 8192, 128, "bottom-right", None),
        (2, 4, 4, 999, 999, 256, "top-left", (-1, 45)),
        (2, 4, 4, 777, 900, 200, "bottom-right", None),
    ]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for b, hq, hkv, sq, sk, d, align, window in cases:
        q = torch.from_numpy(rng.standard_normal((b, sq, hq, d))).to("cuda", torch.bfloat16)
        k, v = (torch.from_numpy(rng.standard_normal((b, sk, hkv, d))).to("cuda", torch.bfloat16)
                for _ in range(2))
        kw = dict(causal=window is None, window=window, causal_align=align, backend=backend, return_lse=True)
        out = {"2": flashc.attention(q, k, v, **kw), "again": flashc.attention(q, k, v, **kw)}
        torch.cuda.synchronize()
        case = f"{backend} b {b} h {hq}/{hkv} sq {sq} sk {sk} d {d} {align} window {window}"
        assert torch.equal(out["2"][0], out["again"][0]) and torch.equal(out["2"][1], out["again"][1]), case
        i, j = torch.arange(sq, device="cuda")[:, None], torch.arange(sk, device="cuda")[None, :]
        shift = sk - sq if align == "bottom-right" else 0
        mask = j <= i + shift + (window[1] if window else 0)
        rep = hq // hkv
        ref, plain = (sdpa(q.to(dt).transpose(1, 2), *(t.to(dt).transpose(1, 2).repeat_interleave(rep, dim=1)
                                                         for t in (k, v)), attn_mask=mask).transpose(1, 2)
                      for dt in (torch.float32, torch.bfloat16))
        err, err_plain = ((x.float() - ref).abs().max().item() for x in (out["2"][0], plain))
        assert err <= 2 * err_plain + 1e-3, f"{case}: max error {err}, bf16 SDPA's {err_plain}"


MMA = next((b for b in CUDA_BACKENDS if b.name == "cuda-mma"), None)


@pytest.mark.skipif(MMA is None or not MMA.usable, reason="cuda-mma is not usable here (sm_80+ only)")
def test_mma_split_keys(rng):
    """cuda-mma's forward with each tile's keys split between CTAs and the parts combined (mma/fwd_split.cuh). Forced
    counts (num_splits=) on shapes with masks that leave some parts of a row empty (causal both ways,
    windows, rows that see no key), GQA, varlen with a sequence of no keys, d 59/128/256, parts of one key block;
    then the automatic count (num_splits=0) on decoding shapes (1 and 7 query rows against 5000 keys), where it must
    split. Every
    result within bf16's tolerance of the fp64 reference (lse within 2e-3, -inf where a row sees no key, outputs
    poisoned with NaN first), each split deterministic and different in its bits from the whole walk (so it ran)."""

    def run(q, k, v, splits, **kw):
        kw["num_splits"] = splits
        d = q.shape[-1]
        out = torch.full(q.shape[:-1] + (-(-d // 8) * 8,), float("nan"), device="cuda", dtype=q.dtype)[..., :d]
        if "cu" in kw:
            cq, ck = kw.pop("cu")
            lse = torch.full((q.shape[1], q.shape[0]), float("nan"), device="cuda")
            flashc.attention_varlen(q, k, v, cq, ck, backend="cuda-mma", out=out, lse=lse, **kw)
        else:
            lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device="cuda")
            flashc.attention(q, k, v, backend="cuda-mma", out=out, lse=lse, **kw)
        torch.cuda.synchronize()
        return out, lse

    def check(o, lse, q, k, v, what, **kw):
        n = [x.double().cpu().numpy() for x in (q, k, v)]
        o_ref, lse_ref = numpy_forward(*n, **kw)
        close(o, o_ref, TOL["bf16"])
        got = lse.double().cpu().numpy()
        assert np.array_equal(np.isneginf(got), np.isneginf(lse_ref)), f"{what}: lse's -inf rows differ"
        fin = np.isfinite(lse_ref)
        assert np.abs(got[fin] - lse_ref[fin]).max(initial=0.0) <= 2e-3, f"{what}: lse"

    def bf16(*shape):  # rows padded to 16 bytes (d 59 as a view of 64 columns): the split needs aligned rows
        d = shape[-1]
        x = torch.from_numpy(rng.standard_normal(shape[:-1] + (-(-d // 8) * 8,))).to("cuda", torch.bfloat16)
        return x[..., :d]

    cases = [  # (b, sq, sk, hq, hkv, d, mask kwargs, splits)
        (2, 97, 1030, 4, 2, 64, dict(causal=True), 3),
        (1, 300, 700, 2, 2, 128, dict(causal=True, causal_align="top-left"), 5),
        (2, 1, 4000, 8, 1, 128, dict(), 16),
        (1, 257, 2000, 2, 1, 59, dict(window=(64, 16)), 4),
        (1, 130, 90, 2, 2, 256, dict(causal=True, causal_align="top-left"), 8),  # parts of < 1 key block each
        (3, 33, 1200, 4, 4, 128, dict(window=(-1, 0)), 2),
    ]
    for b, sq, sk, hq, hkv, d, kw, splits in cases:
        q, k, v = bf16(b, sq, hq, d), bf16(b, sk, hkv, d), bf16(b, sk, hkv, d)
        what = f"b {b} sq {sq} sk {sk} h {hq}/{hkv} d {d} {kw} splits {splits}"
        whole = run(q, k, v, 1, **kw)
        part = run(q, k, v, splits, **kw)
        again = run(q, k, v, splits, **kw)
        assert torch.equal(part[0], again[0]) and torch.equal(part[1], again[1]), f"{what}: not deterministic"
        assert not torch.equal(part[0], whole[0]), f"{what}: the same bits as the whole walk (no split taken?)"
        align = kw.get("causal_align", "bottom-right")
        ref_kw = dict(causal=kw.get("causal", False), window=kw.get("window"), align=align)
        check(*part, q, k, v, what, **ref_kw)

    # varlen: sequences of 1, 0 and 900 query rows, one with no keys at all
    cq, ck = [0, 1, 1, 901], [0, 1500, 1500, 1500]
    q, k, v = bf16(901, 4, 128), bf16(1500, 2, 128), bf16(1500, 2, 128)
    o, lse = run(q, k, v, 4, cu=(cq, ck))
    assert torch.isinf(lse[:, 1:]).all() and (o[1:] == 0).all(), "rows of a sequence with no key"
    check(o[None, :1], lse[None, :, :1], q[None, :1], k[None, :1500], v[None, :1500], "varlen seq 0")

    # auto on decoding shapes: the count is chosen and the split runs; under backend="auto" cuda-hopper leaves them
    # to cuda-mma
    for sq in (1, 7):
        q, k, v = bf16(1, sq, 8, 128), bf16(1, 5000, 8, 128), bf16(1, 5000, 8, 128)
        o, lse = run(q, k, v, 0)
        whole = run(q, k, v, 1)
        assert not torch.equal(o, whole[0]), f"sq {sq}: the automatic count did not split"
        check(o, lse, q, k, v, f"auto sq {sq}")
        flashc.attention(q, k, v)
        assert flashc.last_backend() == "cuda-mma", flashc.last_backend()
