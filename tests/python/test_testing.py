"""The test framework (python -m flashc.testing) and bench/compare.py: metrics, the reference engines, rows,
files, and that a wrong kernel fails."""

import csv
import importlib.util
import pathlib

import numpy as np
import pytest

import flashc
from flashc.testing import cli, configs, engine, impls, metrics, reference

from conftest import CPU_BACKENDS, need_backend, randn

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = ["--repeats", "3", "--warmup", "1"]


def test_flops_follow_targets():
    c = configs.Config("x", 2, 8, 1024, 64)
    full = 4 * 2 * 8 * 1024 * 1024 * 64
    assert metrics.flops(c, False, "fwd") == full
    assert metrics.flops(c, True, "fwd") == full / 2
    assert metrics.flops(c, True, "bwd") == 2.5 * full / 2
    w = configs.Config("w", 1, 1, 10, 4, seqlen_k=20)
    assert metrics.flops(w, False, "fwd", window=(2, 1)) == 4 * 4 * metrics.visible_pairs(10, 20, False, (2, 1))
    assert metrics.bytes_moved(c, "f32", "fwd") == 4 * 4 * 2 * 1024 * 8 * 64 + 4 * 2 * 8 * 1024


@pytest.mark.parametrize(
    "sq,sk,causal,window,align",
    [
        (10, 20, True, None, "bottom-right"),
        (20, 10, True, None, "bottom-right"),
        (7, 7, False, (2, 3), "top-left"),
        (9, 5, True, (1, None), "top-left"),
        (5, 9, False, (None, 0), "bottom-right"),
    ],
)
def test_visible_pairs_count_the_mask(sq, sk, causal, window, align):
    mask = reference.visible(sq, sk, causal, window, align)
    assert metrics.visible_pairs(sq, sk, causal, window, align) == mask.sum()


def test_error_metrics():
    ref = np.array([1.0, -2.0, 0.5, 0.0])
    err = metrics.errors(ref + np.array([0.0, 0.1, 0.0, -0.2]), ref)
    assert err["max_abs"] == pytest.approx(0.2) and err["mean_abs"] == pytest.approx(0.075)
    assert err["mse"] == pytest.approx((0.01 + 0.04) / 4)
    assert err["rel_l2"] == pytest.approx(np.sqrt(0.05) / np.linalg.norm(ref))
    assert metrics.passes(err, 0.1) and not metrics.passes(err, 0.099)  # bar: tolerance · max(1, max|ref| = 2)
    bad = metrics.errors(np.array([np.nan, 0, 0, 0]), ref)
    assert np.isnan(bad["max_abs"]) and not metrics.passes(bad, 1e9)


def test_slices_cover_the_edges():
    s = reference.choose_slices(4, 8, 2, samples=3)
    assert len(s) == 3 and (s[0].b, s[0].g) == (0, 0) and (s[-1].b, s[-1].g) == (3, 1) and s[0].group == 4
    assert len(reference.choose_slices(2, 4, 4, samples=None)) == 8


def test_reference_engines_agree(rng, cpu_ref):
    """numpy, cpu-ref and (with torch) torch-fp64 compute the same fp64 attention: three implementations."""
    q, dout = randn(rng, (2, 33, 4, 16)), randn(rng, (2, 33, 4, 16))
    k, v = randn(rng, (2, 47, 2, 16)), randn(rng, (2, 47, 2, 16))
    engines = ["numpy", "cpu-ref"] + (["torch-fp64"] if impls.torch_or_none() else [])
    results = {}
    for e in engines:
        ref = reference.Reference(q, k, v, dout, True, (9, None), None, "bottom-right", engine=e)
        ((o, lse),) = ref.forward()
        results[e] = (o, lse, *ref.backward()[0])
    for e in engines[1:]:
        for a, b, what in zip(results["numpy"], results[e], ("o", "lse", "dq", "dk", "dv")):
            tol = 1e-6 if what == "lse" else 1e-12  # lse is float32 in the C API
            np.testing.assert_allclose(
                np.where(np.isneginf(b), 0, b), np.where(np.isneginf(a), 0, a), atol=tol, err_msg=f"{e} {what}"
            )


def test_sampled_reference_matches_the_full_one(rng):
    q, k, v, dout = (randn(rng, (3, 20, 4, 8)) for _ in range(4))
    full = reference.Reference(q, k, v, dout, False, None, None, "bottom-right", engine="numpy")
    part = reference.Reference(q, k, v, dout, False, None, None, "bottom-right", samples=2, engine="numpy")
    assert part.sampled and "2/12" in part.describe()
    ((o, lse),) = full.forward()
    got_o, got_lse = part.pick_forward(o, lse)
    for g, gl, (wo, wl) in zip(got_o, got_lse, part.forward()):
        np.testing.assert_allclose(g, wo, atol=1e-12)
        np.testing.assert_allclose(gl, wl, atol=1e-12)
    ((dq, dk, dv),) = full.backward()
    for got, want in zip(part.pick_backward(dq, dk, dv), part.backward()):
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, atol=1e-12)


class _Wrong(impls.Impl):
    """A 'kernel' that forgets the scale: the framework must fail it."""

    name = "flashc:wrong"

    def prepare(self, inputs, case, pass_):
        q, k, v, _ = inputs[0].numpy()
        out = {}

        def call():
            out["o"] = reference.numpy_forward(q, k, v, case.causal, scale=1.0)[0]

        return impls.Runner(calls=[call], outputs=lambda: (out["o"],))


def test_a_wrong_kernel_fails_and_a_right_one_passes(cpu_ref):
    case = impls.Case(cfg=configs.Config("t", 1, 2, 24, 16), dtype="f32", causal=True)
    right = impls.flashc_impls("cpu", ["cpu-ref"])
    rows = engine.run_case(case, [_Wrong()] + right, ["fwd"], engine.Options(repeats=3, warmup=1, ref_engine="numpy"))
    assert [r["status"] for r in rows] == ["FAIL", "pass"]
    assert rows[0]["max_abs_err"] > 0.01 and rows[1]["max_abs_err"] < 1e-6


def test_cli_runs_and_saves(tmp_path, capsys):
    name = CPU_BACKENDS[0] if CPU_BACKENDS else pytest.skip("no host backend")
    need_backend("cpu-ref")
    code = cli.main(
        [
            "--mode",
            "both",
            "--kernel",
            name,
            "--no-gpu-reference",
            "--config",
            "1/2/40/16",
            "--config",
            "2/4:2/33:50/8",
            "--causal",
            "--save-results",
            "--output-dir",
            str(tmp_path),
        ]
        + FAST
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "FORWARD" in out and "BACKWARD" in out and f"flashc:{name}" in out
    rows = list(csv.DictReader(open(tmp_path / "experiment_results_both.csv")))
    assert list(rows[0])[: len(engine.SCHEMA)] == engine.SCHEMA
    mine = [r for r in rows if r["impl"] == f"flashc:{name}"]
    assert {r["pass"] for r in mine} == {"fwd", "bwd"} and all(r["status"] == "pass" for r in mine)
    assert all(float(r["ms"]) > 0 and float(r["tflops"]) > 0 and r["causal"] == "1" for r in mine)
    assert (tmp_path / "experiment_results_both_summary.txt").exists()
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "kernel_comparison.png").exists() and (tmp_path / "kernel_comparison_bwd.png").exists()


def test_cli_seqlen_experiment_and_skips(tmp_path, capsys, cpu_ref):
    # f64 exists only on cpu-ref: every other host backend gives a skipped row, never an error
    code = cli.main(
        [
            "--mode",
            "forward",
            "--seqlen-experiment",
            "--seqlens",
            "16,48",
            "--dtype",
            "f64",
            "--kernel",
            ",".join(CPU_BACKENDS),
            "--no-peers",
            "--save-results",
            "--output-dir",
            str(tmp_path),
        ]
        + FAST
    )
    assert code == 0, capsys.readouterr().out
    rows = list(csv.DictReader(open(tmp_path / "seqlen_results.csv")))
    assert {r["seqlen_q"] for r in rows} == {"16", "48"}
    for r in rows:
        b = next(b for b in flashc.backends() if f"flashc:{b.name}" == r["impl"])
        assert r["status"] == ("pass" if "f64" in b.dtypes else "skipped"), r
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "seqlen_scaling.png").exists()


def test_max_ref_seqlen_samples_the_reference(capsys, cpu_ref):
    code = cli.main(
        ["--kernel", "cpu-ref", "--config", "2/4/40/8", "--max-ref-seqlen", "32", "--ref-samples", "2", "--no-peers"]
        + FAST
    )
    out = capsys.readouterr().out
    assert code == 0 and "skipped" in out and "--max-ref-seqlen 32" in out, out


def test_compare_writes_the_results_schema(tmp_path, capsys, cpu_ref):
    spec = importlib.util.spec_from_file_location("compare", ROOT / "bench" / "compare.py")
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    out_csv = tmp_path / "r.csv"
    code = compare.main(
        [
            "--device",
            "cpu",
            "--config",
            "1/2/24/8",
            "--backends",
            "cpu-ref",
            "--peers",
            "cpu",
            "--causal",
            "both",
            "--csv",
            str(out_csv),
            "--repeats",
            "30",
            "--warmup",
            "1",
        ]
    )
    assert code == 0, capsys.readouterr().out
    rows = list(csv.DictReader(open(out_csv)))
    assert list(rows[0])[:20] == engine.SCHEMA
    assert len(rows) == 2 * 2 * 2  # (cpu-ref, torch:cpu) x (full, causal) x (fwd, bwd)
    r = next(r for r in rows if r["impl"] == "flashc:cpu-ref")
    assert r["world"] == "1" and r["status"] == "pass" and float(r["max_abs_err"]) < 1e-5 and r["repeats"] == "30"


def test_time_based_warmup_runs_for_its_seconds():
    """timing.time_calls(warmup_s=...) keeps calling, untimed, until the time has passed, then times `repeats`."""
    import time

    from flashc.testing import timing

    seen = []

    def call():
        seen.append(time.perf_counter())
        time.sleep(0.002)

    t0 = time.perf_counter()
    out = timing.time_calls([call], "cpu", warmup=1, repeats=3, warmup_s=0.1)
    assert out["repeats"] == 3 and len(out["samples"]) == 3
    assert time.perf_counter() - t0 >= 0.1
    assert len(seen) >= 3 + 1 + 10  # the timed calls, the counted warm-up and at least 0.1 s / 2 ms / 2 more
    assert len(timing.time_calls([call], "cpu", warmup=1, repeats=3)["samples"]) == 3
