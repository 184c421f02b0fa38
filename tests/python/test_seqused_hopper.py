"""seqused_q/k on cuda-hopper: forward (o, lse) and backward (dq, dk, dv) against cpu-ref (fp64) on the same 16-bit
inputs, bf16 and f16, with NaN in every row past the used ones (q, k, v, dout), which no result may see.

Under seqused cuda-hopper loads each sequence through tensor maps of its own that end at its last used row, so that
the copy engine brings zeros, not the caller's rows, into the last partial block's GEMMs (hopper/tma.cu,
fc_hp_seq_maps). The cases reach every kernel of both plans: the forward's persistent kernel at D = 64 (3 consumers,
192-row tiles, causal: query blocks aligned to the sequence's end), D = 128 and D = 256 (unmasked), its one-tile kernel
at D = 256 causal and at D = 128 causal with an 8192-key slot; the backward's kernels at D = 64 (Br = 128), D = 128,
D = 256 and the deterministic ones at D = 64 and 128. Used counts: 0, 1, 64, 128 (block aligned), 77 (odd), the whole
slot; seqused_q alone, seqused_k alone and both; GQA and MQA; causal and not. Rows past the used ones must come out
exactly o = 0, lse = -inf, dq = 0, dk = dv = 0. Skips with "no CUDA device" without one, and "no sm_90" where
cuda-hopper is not usable. (seqused with device cu_seqlens is refused by the library for every backend: validate.c.)
"""

import pytest
from conftest import hopper_skip_reason

import flashc

SKIP = hopper_skip_reason()
needs_hopper = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

# Sequences: (slot_q, used_q, slot_k, used_k). Odd counts (77), none (0), one (1), block aligned (64, 128: the
# backward's Br and the forward's Bc), the whole slot, and a slot whose used rows end inside its first block.
SEQS = [
    (200, 77, 300, 77),
    (130, 0, 150, 64),
    (90, 1, 140, 1),
    (300, 128, 260, 128),
    (64, 64, 200, 0),
    (150, 150, 333, 333),
    (257, 193, 129, 100),
]
# One long key slot: the forward at D = 128 with a causal mask takes the one-tile kernel from seqlen_k 8192.
SEQS_LONG = [(100, 77, 8192, 5000), (130, 129, 8192, 8192), (60, 0, 8192, 31)]

# name, (hq, hkv, d), causal, sequences, which side uses seqused ("q", "k" or "qk"), deterministic backward
CASES = [
    pytest.param((2, 2, 64), False, SEQS, "qk", False, id="d64-qk"),
    pytest.param((4, 1, 64), True, SEQS, "qk", False, id="d64-causal-mqa-qk"),
    pytest.param((4, 2, 128), False, SEQS, "qk", False, id="d128-gqa-qk"),
    pytest.param((2, 2, 128), True, SEQS, "q", False, id="d128-causal-q"),
    pytest.param((2, 1, 96), False, SEQS, "k", False, id="d96-mqa-k"),
    pytest.param((2, 2, 256), False, SEQS, "qk", False, id="d256-qk"),
    pytest.param((4, 2, 256), True, SEQS, "qk", False, id="d256-causal-gqa-qk"),
    pytest.param((2, 2, 128), True, SEQS_LONG, "qk", False, id="d128-causal-long-k"),
    pytest.param((2, 2, 64), True, SEQS, "qk", True, id="d64-causal-deterministic"),
    pytest.param((4, 2, 128), False, SEQS, "qk", True, id="d128-gqa-deterministic"),
]


def inputs(torch, dt, hq, hkv, d, seqs, side, seed):
    """Packed q, k, v, dout of dtype dt on the CPU, NaN in the rows past the used ones; cu_seqlens and seqused."""
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = [0], [0]
    for sq, _, sk, _ in seqs:
        cu_q.append(cu_q[-1] + sq)
        cu_k.append(cu_k[-1] + sk)
    q, dout = (torch.randn(cu_q[-1], hq, d, generator=g).to(dt) for _ in range(2))
    k, v = (torch.randn(cu_k[-1], hkv, d, generator=g).to(dt) for _ in range(2))
    used_q = [u if "q" in side else sq for sq, u, _, _ in seqs]
    used_k = [u if "k" in side else sk for _, _, sk, u in seqs]
    for s in range(len(seqs)):  # what lies past the used rows must never be read: NaN there shows a read
        for x, cu, used in ((q, cu_q, used_q), (dout, cu_q, used_q), (k, cu_k, used_k), (v, cu_k, used_k)):
            x[cu[s] + used[s] : cu[s + 1]] = float("nan")
    opts = {}
    if "q" in side:
        opts["seqused_q"] = used_q
    if "k" in side:
        opts["seqused_k"] = used_k
    cu = (torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32))
    return q, k, v, dout, cu, used_q, used_k, opts


def check(got, want, name, tol):
    """got against cpu-ref's want: the same non-finite entries (lse -inf where a row sees no key or is unused), none
    NaN, the finite ones within tol of the largest."""
    import torch

    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape, name
    assert not torch.isnan(got).any(), f"{name}: NaN (a read past the used rows?)"
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin) and torch.equal(got[~fin], want[~fin]), name
    err = (got[fin] - want[fin]).abs().max().item() / max(want[fin].abs().max().item(), 1e-30) if fin.any() else 0.0
    assert err < tol, (name, err)


def check_unused(o, lse, dq, dk, dv, cu, used_q, used_k, name):
    """Rows past the used ones, exactly: o = 0, lse = -inf, dq = 0; keys: dk = dv = 0."""
    cu_q, cu_k = (c.tolist() for c in cu)
    for s in range(len(used_q)):
        rq, rk = slice(cu_q[s] + used_q[s], cu_q[s + 1]), slice(cu_k[s] + used_k[s], cu_k[s + 1])
        assert bool((o[rq] == 0).all()) and bool((lse[:, rq] == float("-inf")).all()), (name, s)
        assert bool((dq[rq] == 0).all()), (name, s)
        assert bool((dk[rk] == 0).all()) and bool((dv[rk] == 0).all()), (name, s)


@needs_hopper
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads,causal,seqs,side,deterministic", CASES)
def test_seqused_against_cpu_ref(dtype, heads, causal, seqs, side, deterministic):
    torch = pytest.importorskip("torch")
    dt = getattr(torch, dtype)
    hq, hkv, d = heads
    q, k, v, dout, cu, used_q, used_k, opts = inputs(torch, dt, hq, hkv, d, seqs, side, hq * 100 + d + len(seqs))

    def run(device, backend, cast):
        xs = [x.to(device=device, dtype=cast) for x in (q, k, v)]
        o, lse = flashc.attention_varlen(*xs, *cu, causal=causal, backend=backend, return_lse=True, **opts)
        assert flashc.last_backend() == backend
        grads = flashc.attention_varlen_backward(
            dout.to(device=device, dtype=cast), *xs, o, lse, *cu, causal=causal, backend=backend,
            deterministic=deterministic, **opts,
        )  # fmt: skip
        assert flashc.last_backend() == backend
        return (o, lse, *grads)

    got = run("cuda", "cuda-hopper", dt)
    want = run("cpu", "cpu-ref", torch.float64)
    for name, g, w in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        check(g, w, f"{name} {dtype}", 1e-4 if name == "lse" else 2e-2)
    check_unused(*(x.cpu() for x in got), cu, used_q, used_k, "cuda-hopper")
    if deterministic:  # bit-identical run to run, seqused or not
        again = run("cuda", "cuda-hopper", dt)
        for name, g, a in zip(("dq", "dk", "dv"), got[2:], again[2:]):
            assert torch.equal(g, a), f"{name}: not bit-identical"


@needs_hopper
def test_auto_runs_seqused_backward_on_hopper():
    """With FC_FEATURE_SEQUSED on cuda-hopper, auto takes it for a seqused backward (no split heuristic there), and the
    result matches an explicit cuda-mma run."""
    torch = pytest.importorskip("torch")
    dt = torch.bfloat16
    q, k, v, dout, cu, used_q, used_k, opts = inputs(torch, dt, 4, 2, 128, SEQS, "qk", 11)
    xs = [x.cuda() for x in (q, k, v)]
    o, lse = flashc.attention_varlen(*xs, *cu, backend="cuda-mma", return_lse=True, **opts)
    got = flashc.attention_varlen_backward(dout.cuda(), *xs, o, lse, *cu, backend="auto", **opts)
    assert flashc.last_backend() == "cuda-hopper"
    want = flashc.attention_varlen_backward(dout.cuda(), *xs, o, lse, *cu, backend="cuda-mma", **opts)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        check(g, w, name, 2e-2)
