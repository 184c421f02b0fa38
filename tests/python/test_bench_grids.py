"""flashc.testing with softcap, ALiBi, dropout and a head dim of V of its own (issue #48), and bench/compare.py's
features and decode grids (issues #48 and #49) at host sizes: the reference against a plain loop (its dropout mask
against libflashc's), the grids' rows."""

import csv
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import flashc
from flashc.testing import configs, decode, engine, impls, metrics, reference

from conftest import BACKENDS, CPU_BACKENDS, need_backend, randn

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- the reference -----------------------------------------------------------------------------------------------
def loop_attention(q, k, v, causal, softcap, slopes, scale, z=None):
    """o [b, sq, hq, dv] by loops over (b, h, i) in float64: the paper's formulas, nothing shared with reference.py.
    z [b, hq, sq, sk]: dropout's factors keep / (1 − p), multiplying the softmax's weights."""
    b, sq, hq, _ = q.shape
    sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
    o = np.zeros((b, sq, hq, dv))
    for s in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            for i in range(sq):
                scores = []
                for j in range(sk):
                    if causal and j > i + sk - sq:
                        scores.append(-math.inf)
                        continue
                    x = scale * float(np.dot(q[s, i, h], k[s, j, g]))
                    if softcap:
                        x = softcap * math.tanh(x / softcap)
                    if slopes is not None:
                        x -= float(slopes[h]) * abs(i + sk - sq - j)
                    scores.append(x)
                m = max(scores)
                w = np.array([0.0 if x == -math.inf else math.exp(x - m) for x in scores])
                w = w / w.sum()
                o[s, i, h] = (w if z is None else w * z[s, h, i]) @ v[s, :, g]
    return o


def engines_match_the_loop(q, k, v, dout, softcap, slopes, z=None, **features):
    """Every reference engine (causal, bottom-right) against loop_attention: the forward to 1e-12, the backward
    against central differences of loop_attention (z held fixed; q, k, v small enough for every element), on whole
    tensors and on one (batch, kv-head) slice (ALiBi's slopes and the dropout mask cut with it). features: the
    Reference's own keywords for what z is (dropout_p=, dropout_seed=, dropout_offset=)."""
    scale = reference.effective_scale(None, q.shape[3])

    def o_of():
        return loop_attention(q, k, v, True, softcap, slopes, scale, z)

    want, grads = o_of(), []
    for x in (q, k, v):  # d(sum(o · dout)) / dx
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            keep = x[idx]
            x[idx] = keep + 1e-6
            up = np.sum(o_of() * dout)
            x[idx] = keep - 1e-6
            down = np.sum(o_of() * dout)
            x[idx] = keep
            g[idx] = (up - down) / 2e-6
        grads.append(g)
    engines = ["numpy"] + (["cpu-ref"] if "cpu-ref" in CPU_BACKENDS else [])
    engines += ["torch-fp64"] if impls.torch_or_none() else []
    for e in engines:
        for samples in (None, 1):
            ref = reference.Reference(q, k, v, dout, True, None, None, "bottom-right", samples=samples, engine=e,
                                      softcap=softcap, alibi_slopes=slopes, **features)  # fmt: skip
            assert ref.sampled == (samples == 1)
            (o, _), *_ = ref.forward()
            got_o, _ = ref.pick_forward(want)
            np.testing.assert_allclose(o, got_o[0], atol=1e-12, err_msg=f"{e} samples={samples}")
            for got, w, what in zip(ref.backward()[0], ref.pick_backward(*grads)[0], ("dq", "dk", "dv")):
                np.testing.assert_allclose(got, w, atol=1e-6, err_msg=f"{e} samples={samples} {what}")
    return want


CASES = [
    pytest.param(0.0, False, 6, id="dv"),
    pytest.param(2.0, False, 4, id="softcap"),
    pytest.param(0.0, True, 4, id="alibi"),
    pytest.param(1.5, True, 7, id="softcap-alibi-dv"),
]


@pytest.mark.parametrize("softcap,alibi,dv", CASES)
def test_reference_features_match_a_plain_loop(rng, softcap, alibi, dv):
    """Every reference engine against loop_attention, forward and backward (engines_match_the_loop)."""
    q, k = randn(rng, (1, 5, 4, 3), np.float64), randn(rng, (1, 7, 2, 3), np.float64)
    v, dout = randn(rng, (1, 7, 2, dv), np.float64), randn(rng, (1, 5, 4, dv), np.float64)
    engines_match_the_loop(q, k, v, dout, softcap, configs.alibi_slopes(4) if alibi else None)


# ---- dropout ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed,offset", [(impls.DROPOUT_SEED, 0), (2**40 + 7, 2**64 - 3)])
def test_dropout_keep_is_the_librarys_mask(rng, cpu_ref, seed, offset):
    """reference.Dropout.keep, for the whole call and for a part of it (a sampled slice's sequence and heads), is
    the mask libflashc returns (return_dropout_mask) for the same p, seed and offset: sk = 9 (a row's last Philox
    block one key used), a seed above 2^32, an offset whose blocks wrap past 2^64. (tests/test_dropout.c checks the
    library's Philox against Random123's known answers.)"""
    q, k, v = randn(rng, (3, 7, 4, 8)), randn(rng, (3, 9, 2, 8)), randn(rng, (3, 9, 2, 8))
    _, lib = flashc.attention(q, k, v, dropout_p=0.3, seed=seed, offset=offset, return_dropout_mask=True,
                              backend="cpu-ref")  # fmt: skip
    drop = reference.Dropout(0.3, seed, offset, heads_q=4)
    keep = drop.keep(3, 4, 7, 9)
    assert keep.shape == lib.shape and np.array_equal(keep, lib)
    assert 0.6 < keep.mean() < 0.8  # p = 0.3 drops about 30 %
    assert np.array_equal(drop.part(2, 2).keep(1, 2, 7, 9), lib[2:3, 2:4])


@pytest.mark.parametrize("softcap,dv", [(0.0, 3), (2.0, 5)])
def test_reference_dropout_matches_a_plain_loop(rng, softcap, dv):
    """Every engine's dropout against loop_attention given the same keep mask (engines_match_the_loop), on whole
    tensors and on one slice (where cpu-ref hands the slice to the numpy engine with its part of the call's mask)."""
    q, k = randn(rng, (2, 5, 4, 3), np.float64), randn(rng, (2, 6, 2, 3), np.float64)
    v, dout = randn(rng, (2, 6, 2, dv), np.float64), randn(rng, (2, 5, 4, dv), np.float64)
    drop = reference.Dropout(0.25, 99, 5, heads_q=4)
    z = drop.keep(2, 4, 5, 6) * drop.scale
    want = engines_match_the_loop(q, k, v, dout, softcap, None, z, dropout_p=0.25, dropout_seed=99, dropout_offset=5)
    plain = loop_attention(q, k, v, True, softcap, None, reference.effective_scale(None, 3))
    assert np.abs(want - plain).max() > 1e-2  # dropout moves o


def test_softcap_and_alibi_change_the_reference(rng):
    """The features are not silently dropped: each moves the output."""
    q, k, v = (randn(rng, (1, 6, 2, 4), np.float64) * 3 for _ in range(3))
    plain = reference.numpy_forward(q, k, v, True)[0]
    capped = reference.numpy_forward(q, k, v, True, softcap=1.0)[0]
    biased = reference.numpy_forward(q, k, v, True, alibi_slopes=configs.alibi_slopes(2))[0]
    assert np.abs(capped - plain).max() > 1e-3 and np.abs(biased - plain).max() > 1e-3


def test_alibi_slopes_follow_the_paper():
    s = configs.alibi_slopes(8)
    assert s.dtype == np.float32 and s[0] == 0.5 and s[-1] == 2.0**-8
    np.testing.assert_allclose(configs.alibi_slopes(16)[:2], [2**-0.5, 2**-1.0])


def test_flops_and_bytes_count_the_v_head_dim():
    same = configs.Config("x", 2, 4, 64, 32)
    own = configs.Config("y", 2, 4, 64, 48, head_dim_v=32)
    pairs = 2 * 4 * 64 * 64
    assert metrics.flops(same, False, "bwd") == 2.5 * metrics.flops(same, False, "fwd") == 2.5 * 4 * pairs * 32
    assert metrics.flops(own, False, "fwd") == 2 * pairs * (48 + 32)
    assert metrics.flops(own, False, "bwd") == pytest.approx(2 * pairs * (3 * 48 + 2 * 32))
    assert metrics.flops(own, True, "fwd") == pairs * (48 + 32)
    rows = 2 * 64 * 4
    assert metrics.bytes_moved(own, "bf16", "fwd") == 2 * rows * (48 + 32 + 48 + 32) + rows * 4
    assert metrics.bytes_moved(same, "bf16", "fwd") == 2 * 4 * rows * 32 + rows * 4


def test_features_grid_shapes():
    rows = configs.features_grid()
    assert len(rows) == 12 and {c.seqlen for c, _ in rows} == {4096, 8192}
    for cfg, features in rows:
        assert cfg.batch * cfg.seqlen == 16384 and cfg.heads == 16
        assert (cfg.head_dim, cfg.dv) == ((192, 128) if cfg.name.startswith("dv") else (128, 128))
        impls.Case(cfg=cfg, dtype="bf16", causal=True, **features)  # every feature is a Case field
    names = [cfg.name.split("-")[0] for cfg, _ in rows]
    assert names == ["plain", "softcap30", "alibi", "dropout0.1", "padmask", "dv"] * 2
    assert [f for _, f in rows[:6]] == [{}, {"softcap": 30.0}, {"alibi": True}, {"dropout": 0.1}, {"padding": True}, {}]


def test_padding_mask():
    """Sequence b keeps its first sk − ((b mod 15) + 1)·sk/16 keys (at least one), and causal folds in bottom-right."""
    m = configs.padding_mask(3, 5, 32, causal=False)
    assert m.shape == (3, 1, 5, 32) and m.dtype == bool
    assert [int(m[b, 0, 0].sum()) for b in range(3)] == [30, 28, 26] and m[:, :, :, :26].all()
    c = configs.padding_mask(2, 6, 8, causal=True)
    for b, keep in enumerate((8, 7)):
        for i in range(6):
            assert list(np.flatnonzero(c[b, 0, i])) == list(range(min(keep, i + 2 + 1))), (b, i)
    assert configs.padding_mask(1, 1, 1, causal=True).all()  # never every key of a sequence


# ---- the framework's rows ----------------------------------------------------------------------------------------
def test_features_through_the_engine(cpu_ref):
    """cpu-ref with each feature passes against the numpy reference; torch:cpu takes ALiBi as a float mask and
    V's head dim, and skips softcap with the reason."""
    impl = impls.flashc_impls("cpu", ["cpu-ref"]) + [impls.TorchSDPA("cpu")]
    for cap, alibi, dv in ((3.0, False, 0), (0.0, True, 0), (0.0, False, 24)):
        cfg = configs.Config("t", 2, 4, 20, 16, heads_kv=2, seqlen_k=33, head_dim_v=dv)
        case = impls.Case(cfg=cfg, dtype="f32", causal=True, softcap=cap, alibi=alibi)
        rows = engine.run_case(case, impl, ["fwd", "bwd"], engine.Options(repeats=3, warmup=1, ref_engine="numpy"))
        for r in rows:
            assert r["head_dim_v"] == cfg.dv and r["softcap"] == cap and r["alibi"] == int(alibi)
            if r["impl"] == "flashc:cpu-ref":
                assert r["status"] == "pass" and r["max_abs_err"] < 1e-5, r
            elif impls.torch_or_none() is None:
                assert r["status"] == "skipped"
            elif cap:
                assert r["status"] == "skipped" and "softcap" in r["note"], r
            else:  # bottom-right causal with sq != sk: only the mask built for ALiBi carries it to SDPA
                assert r["status"] == ("peer" if alibi else "skipped"), r
                if alibi:
                    assert r["max_abs_err"] < 1e-4, r


def test_padding_mask_through_the_engine(cpu_ref):
    """A padding case: flashc (cpu-ref, cpu) and SDPA (torch:cpu) get the same boolean mask, causal folded in, and
    pass against the reference forward and backward; the reference moves with the mask (the check is not vacuous)."""
    impl = impls.flashc_impls("cpu", CPU_BACKENDS) + [impls.TorchSDPA("cpu")]
    cfg = configs.Config("t", 3, 4, 40, 16, heads_kv=2)
    case = impls.Case(cfg=cfg, dtype="f32", causal=True, padding=True)
    assert case.attn_mask().shape == (3, 1, 40, 40) and not case.mask_causal
    rows = engine.run_case(case, impl, ["fwd", "bwd"], engine.Options(repeats=3, warmup=1, ref_engine="numpy"))
    assert len(rows) == 2 * len(impl)
    for r in rows:
        assert r["causal"] == 1, r
        if r["impl"].startswith("flashc:"):
            assert r["status"] == "pass" and r["max_abs_err"] < 1e-5, r
        elif impls.torch_or_none() is None:
            assert r["status"] == "skipped", r
        else:
            assert r["status"] == "peer" and r["max_abs_err"] < 1e-4, r
    q, k, v, _ = impls.Inputs(case, 0).numpy()
    plain = reference.Reference(q, k, v, None, True, None, None, "bottom-right", engine="numpy").forward()[0][0]
    masked = reference.Reference(q, k, v, None, True, None, None, "bottom-right", engine="numpy",
                                 attn_mask=case.attn_mask()).forward()[0][0]  # fmt: skip
    assert np.abs(plain - masked).max() > 1e-2


def test_dropout_through_the_engine(rng, cpu_ref):
    """A dropout case: cpu-ref and cpu pass against the reference (cpu-ref's own mask from the seed, and the numpy
    engine's Philox), forward and backward, GQA, seqlen_q != seqlen_k, causal; torch:cpu is skipped with the reason.
    The check is not vacuous: the reference moves with p and with the seed."""
    impl = impls.flashc_impls("cpu", CPU_BACKENDS) + [impls.TorchSDPA("cpu")]
    cfg = configs.Config("t", 2, 4, 21, 16, heads_kv=2, seqlen_k=34)
    case = impls.Case(cfg=cfg, dtype="f32", causal=True, dropout=0.1)
    assert case.features() == {"dropout_p": 0.1, "seed": impls.DROPOUT_SEED}
    for ref_engine in ("numpy", "cpu-ref"):
        rows = engine.run_case(case, impl, ["fwd", "bwd"], engine.Options(repeats=3, warmup=1, ref_engine=ref_engine))
        assert len(rows) == 2 * len(impl)
        for r in rows:
            assert r["dropout"] == 0.1
            if r["impl"].startswith("flashc:"):
                assert r["status"] == "pass" and r["max_abs_err"] < 1e-5, r
            else:  # without torch the row says that first
                assert r["status"] == "skipped" and ("dropout" in r["note"] or not impls.torch_or_none()), r
    q, k, v, _ = impls.Inputs(case, 0).numpy()
    o = {}
    for name, p, seed in (("ref", 0.1, impls.DROPOUT_SEED), ("no dropout", 0.0, 0), ("other seed", 0.1, 1)):
        ref = reference.Reference(q, k, v, None, True, None, None, "bottom-right", engine="numpy", dropout_p=p,
                                  dropout_seed=seed)  # fmt: skip
        o[name] = ref.forward()[0][0]
    assert np.abs(o["ref"] - o["no dropout"]).max() > 1e-2 and np.abs(o["ref"] - o["other seed"]).max() > 1e-2


@pytest.mark.parametrize("name", [n for n, b in BACKENDS.items() if b.device == "cuda"] or ["cuda-mma"])
def test_cuda_backends_refuse_dropout_as_a_skipped_row(name):
    """On a GPU run a CUDA backend that refuses dropout gives a skipped row saying unsupported, not a failure."""
    b = BACKENDS.get(name)
    if b is None or not b.usable:
        pytest.skip(f"no CUDA device (backend {name}: {'not in this build' if b is None else b.why_unusable})")
    torch = impls.torch_or_none()
    if torch is None or not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    cfg = configs.Config("t", 1, 2, 64, 64)
    # in a dtype the backend has (the fp32 teaching rungs have no bf16 kernel), and the backward only where it has one
    case = impls.Case(cfg=cfg, dtype="bf16" if "bf16" in b.dtypes else "f32", causal=True, dropout=0.1)
    passes = ["fwd", "bwd"] if b.has_backward else ["fwd"]
    rows = engine.run_case(case, impls.flashc_impls("cuda", [name]), passes, engine.Options(repeats=3, warmup=1))
    assert len(rows) == len(passes)
    for r in rows:
        if r["status"] == "pass":  # a CUDA backend that implements dropout checks against the same reference
            continue
        assert r["status"] == "skipped" and r["note"].startswith("unsupported") and "dropout" in r["note"], r


class _Refuses(impls.Impl):
    name = "flashc:refuses"

    def prepare(self, inputs, case, pass_):
        raise flashc.UnsupportedError("flashc_forward: backend cuda-mma has no softcap")


def test_a_refusal_is_a_skipped_row_saying_unsupported():
    case = impls.Case(cfg=configs.Config("t", 1, 1, 8, 8), dtype="f32", causal=False, softcap=5.0)
    (row,) = engine.run_case(case, [_Refuses()], ["fwd"], engine.Options(repeats=3, warmup=1, ref_engine="numpy"))
    assert row["status"] == "skipped" and row["note"] == "unsupported: flashc_forward: backend cuda-mma has no softcap"


def test_decode_refusal_is_a_skipped_row(monkeypatch):
    def refuse(*args, **kwargs):
        raise flashc.UnsupportedError("flashc_forward_kvcache: backend cuda-mma does not run a KV cache yet")

    monkeypatch.setattr(flashc, "attention_with_kvcache", refuse)
    cfg = decode.DecodeConfig(1, 1, 20, 2, 1, 8)
    opts = engine.Options(repeats=3, warmup=1)
    rows = decode.run([cfg], "f32", "cpu", ["cuda-mma"], [], opts, 1.0, None)
    assert rows[0]["impl"] == "copy" and rows[0]["gbps"] > 0
    assert [r["page_size"] for r in rows[1:]] == [0, 16, 256]
    for r in rows[1:]:
        assert r["status"] == "skipped" and r["note"].startswith("unsupported: flashc_forward_kvcache"), r


def test_decode_ragged_lengths_reach_the_call_and_the_reference(monkeypatch):
    """A ragged shape's sequences hold L - b*L/2B keys; flashc is called with them and the reference reads them: the
    same call over every sequence's first L rows (lengths not passed on) fails the check."""
    cfg = decode.DecodeConfig(3, 2, 40, 2, 1, 8, ragged=True)
    assert cfg.lengths() == [40, 34, 27] and cfg.name.endswith("-ragged")
    assert cfg.kv_bytes("f32") == (40 + 34 + 27) * 1 * 2 * 8 * 4 and cfg.kv_bytes("f32", cfg.capacity) > 0
    opts = engine.Options(repeats=3, warmup=1)
    rows = decode.run([cfg], "f32", "cpu", ["cpu-ref"], [], opts, 1.0, None)
    assert [r["status"] for r in rows[1:]] == ["pass"] * 3, rows
    assert all(r["note"] == "ragged: cache_seqlens 40 down to 27" for r in rows[1:])
    real = flashc.attention_with_kvcache

    def full_lengths(q, k, v, cache_seqlens=None, **kw):
        return real(q, k, v, cache_seqlens=np.full_like(cache_seqlens, cfg.cache_len), **kw)

    monkeypatch.setattr(flashc, "attention_with_kvcache", full_lengths)
    rows = decode.run([cfg], "f32", "cpu", ["cpu-ref"], [], opts, 1.0, None)
    assert [r["status"] for r in rows[1:]] == ["FAIL"] * 3, rows


# ---- bench/compare.py --quick ------------------------------------------------------------------------------------
def run_compare(tmp_path, grid):
    out_csv = tmp_path / f"{grid}.csv"
    cmd = [sys.executable, str(ROOT / "bench" / "compare.py"), "--grid", grid, "--device", "cpu", "--quick"]
    cmd += ["--backends", ",".join(CPU_BACKENDS), "--csv", str(out_csv), "--repeats", "30", "--warmup", "1"]
    cmd += ["--threads", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(out_csv) as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def test_compare_features_grid_quick(tmp_path):
    need_backend("cpu-ref")
    columns, rows = run_compare(tmp_path, "features")
    assert columns[: len(engine.SCHEMA)] == engine.SCHEMA
    assert columns[-4:] == ["head_dim_v", "softcap", "alibi", "dropout"]
    ours = [r for r in rows if r["impl"].startswith("flashc:")]
    assert len(ours) == 2 * 6 * 2 * len(CPU_BACKENDS)  # seqlens x features x passes x backends
    for r in ours:  # the CPU backends implement every feature: dropout0.1 rows pass against the same mask too
        assert r["status"] == "pass" and r["dtype"] == "bf16" and r["causal"] == "1", r
        assert float(r["max_abs_err"]) < 0.05 and float(r["ms"]) > 0, r
    assert {(r["softcap"], r["alibi"], r["dropout"], r["head_dim"], r["head_dim_v"]) for r in ours} == {
        ("0.0", "0", "0.0", "32", "32"),
        ("30.0", "0", "0.0", "32", "32"),
        ("0.0", "1", "0.0", "32", "32"),
        ("0.0", "0", "0.1", "32", "32"),
        ("0.0", "0", "0.0", "48", "32"),
    }
    assert {r["config"].split("-")[0] for r in ours if r["dropout"] == "0.1"} == {"dropout0.1"}
    assert sum(r["config"].startswith("padmask-") for r in ours) == 2 * 2 * len(CPU_BACKENDS)
    peers = [r for r in rows if r["impl"] == "torch:cpu"]
    assert len(peers) == 2 * 6 * 2
    for r in peers:
        if r["dropout"] != "0.0":
            assert r["status"] == "skipped" and ("dropout" in r["note"] or not impls.torch_or_none()), r
        elif r["softcap"] != "0.0" or impls.torch_or_none() is None:
            assert r["status"] == "skipped" and r["note"], r
        else:
            assert r["status"] == "peer" and float(r["max_abs_err"]) < 0.05, r


def test_compare_decode_grid_quick(tmp_path):
    need_backend("cpu-ref")
    columns, rows = run_compare(tmp_path, "decode")
    assert columns[: len(engine.SCHEMA)] == engine.SCHEMA and columns[-1] == "page_size"
    copy = [r for r in rows if r["impl"] == "copy"]
    assert len(copy) == 1 and float(copy[0]["gbps"]) > 0
    cfgs = decode.decode_grid(**decode.QUICK_GRID)
    by_name = {c.name: c for c in cfgs}
    assert sum(c.ragged for c in cfgs) == 1
    ours = [r for r in rows if r["impl"].startswith("flashc:")]
    assert len(ours) == len(cfgs) * 3 * len(CPU_BACKENDS)  # dense, paged 16, paged 256
    assert {r["page_size"] for r in ours} == {"0", "16", "256"}
    for r in ours:
        assert r["status"] == "pass" and float(r["max_abs_err"]) < 0.05, r
        keys = sum(by_name[r["config"]].lengths())  # the ragged shape's lengths sum to less than batch x L
        kv_bytes = keys * int(r["heads_kv"]) * 2 * int(r["head_dim"]) * 2
        assert float(r["gbps"]) == pytest.approx(kv_bytes / (float(r["ms"]) * 1e-3) / 1e9, rel=1e-9)
    assert {(r["seqlen_q"], r["seqlen_k"]) for r in ours} == {(n, L) for n in ("1", "4") for L in ("40", "300")}
    peers = [r for r in rows if r["impl"] == "torch:cpu"]
    assert len(peers) == len(cfgs)
    if impls.torch_or_none() is not None:
        assert all(r["status"] == "peer" and float(r["max_abs_err"]) < 0.05 for r in peers), peers
        assert all(float(r["speedup"]) > 0 for r in ours)


def test_testing_cli_takes_the_features(capsys, cpu_ref):
    from flashc.testing import cli

    args = ["--mode", "both", "--kernel", ",".join(CPU_BACKENDS), "--config", "1/4:2/40:50/16", "--causal"]
    args += ["--softcap", "20", "--alibi", "--head-dim-v", "24", "--no-peers", "--repeats", "3", "--warmup", "1"]
    code = cli.main(args)
    out = capsys.readouterr().out
    assert code == 0 and "softcap 20 alibi" in out and "1/4:2/40:50/16:24" in out, out
    assert out.count(" pass") >= 2 * len(CPU_BACKENDS), out
    code = cli.main(args + ["--dropout", "0.2"])
    out = capsys.readouterr().out
    assert code == 0 and "softcap 20 alibi dropout 0.2" in out and out.count(" pass") >= 2 * len(CPU_BACKENDS), out
    with pytest.raises(SystemExit):
        cli.parse_args(["--dropout", "1.0"])


def test_compare_only_selects_by_name():
    """--only keeps a grid's configurations by name (features rows are (Config, features) pairs); no match exits."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare", ROOT / "bench" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    models = compare.grid("models")[0]
    picked = [c.name for c in compare.only(models, "gpt2, falcon-7b-mqa-s1024")]
    assert picked == [f"gpt2-small-s{s}" for s in (1024, 4096, 8192, 32768)] + ["falcon-7b-mqa-s1024"]
    features = compare.grid("features", True, "cpu")[0]
    assert {c.name.split("-")[0] for c, _ in compare.only(features, "alibi")} == {"alibi"}
    with pytest.raises(SystemExit, match="no configuration"):
        compare.only(models, "no-such-model")


def test_plot_decode_takes_each_runs_copy_bandwidth(tmp_path):
    """bench/plot.py --decode: a row's bandwidth over the copy row of its own commit (decode.csv keeps configurations
    of two runs), its speedup over the fastest peer of its configuration."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_plot", ROOT / "bench" / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    cols = ["date", "device", "commit", "impl", "dtype", "config", "pass", "ms", "gbps", "status", "page_size"]
    data = [
        ["d", "GPU", "a", "copy", "", "copy-1MiB", "copy", "0.1", "4000", "timed", ""],
        ["d", "GPU", "b", "copy", "", "copy-1MiB", "copy", "0.1", "2000", "timed", ""],
        ["d", "GPU", "a", "flashc:cuda-mma", "bf16", "A", "fwd", "1.0", "3200", "pass", "0"],
        ["d", "GPU", "a", "torch:flash", "bf16", "A", "fwd", "3.0", "1000", "peer", "0"],
        ["d", "GPU", "a", "torch:cudnn", "bf16", "A", "fwd", "2.0", "1500", "peer", "0"],
        ["d", "GPU", "b", "flashc:cuda-mma", "bf16", "B", "fwd", "4.0", "1000", "pass", "16"],
        ["d", "GPU", "b", "flashc:cuda-mma", "bf16", "B", "fwd", "1.0", "9999", "FAIL", "0"],
        ["d", "GPU", "b", "torch:cudnn", "bf16", "B", "fwd", "2.0", "1500", "peer", "0"],
    ]
    path = tmp_path / "decode.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([cols, *data])
    table, device = plot.load_decode([str(path)], "bf16")
    assert device == "GPU" and list(table) == ["A", "B"]
    assert table["A"] == {"cuda-mma": (0.8, 2.0)} and table["B"] == {"cuda-mma p16": (0.5, 0.5)}
    out = tmp_path / "decode.png"
    plot.plot_decode(type("Args", (), dict(csv=[str(path)], dtype="bf16", bar=0.8, out=str(out)))())
    assert out.stat().st_size > 0
