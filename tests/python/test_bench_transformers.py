"""bench/transformers.py --quick on the CPU in fp32: a transformers Llama, flashc against "sdpa" (training step,
prefill, greedy decode): the CSV's rows, and that the script's checks hold (same greedy tokens) and can fail."""

import csv
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is built from a config: nothing is downloaded

import flashc.hf  # noqa: E402
from flashc.testing import engine  # noqa: E402

from conftest import need_backend  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "transformers.py"


@pytest.fixture(autouse=True)
def _cpu():
    need_backend("cpu")


def test_quick_run_rows(tmp_path):
    out = tmp_path / "transformers.csv"
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--csv", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with open(out) as f:
        reader = csv.DictReader(f)
        columns, rows = reader.fieldnames, list(reader)
    assert columns[: len(engine.SCHEMA)] == engine.SCHEMA and columns[-1] == "note"
    # flashc's row, then sdpa's, per workload: train-step at 64 and 128, prefill of 128, decode of 8 tokens
    want = [("train-step", 64, 64), ("train-step", 128, 128), ("prefill", 128, 128), ("decode8", 1, 135)]
    assert [(r["pass"], int(r["seqlen_q"]), int(r["seqlen_k"])) for r in rows[::2]] == want
    assert [r["impl"] for r in rows] == ["flashc:cpu", "torch:sdpa"] * 4
    for fc, sd in zip(rows[::2], rows[1::2]):
        for row in (fc, sd):
            assert (row["dtype"], row["batch"], row["heads_q"], row["heads_kv"], row["head_dim"]) == (
                "f32", "1", "4", "2", "32"
            ), row  # fmt: skip
            assert row["causal"] == "1" and row["repeats"] == "3" and float(row["ms"]) > 0, row
        assert fc["status"] == "pass", fc
        speedup = float(fc["speedup"])
        assert speedup == pytest.approx(float(sd["ms"]) / float(fc["ms"]), rel=1e-3), (fc, sd)
        # the note rounds the unrounded ratio to 3 places, the column to 4: compare numbers, not text
        noted = re.search(r"flashc/sdpa ([0-9.]+)x", fc["note"])
        assert noted and float(noted.group(1)) == pytest.approx(speedup, abs=1.01e-3), fc
        tokens = {"train-step": int(fc["seqlen_q"]), "prefill": 128, "decode8": 7}[fc["pass"]]
        for row in (fc, sd):  # tokens/s = the tokens one timed interval makes over its median time
            rate = float(row["note"].split(" tok/s")[0])
            assert rate == pytest.approx(tokens / (float(row["ms"]) / 1e3), rel=1e-3), row
    assert "greedy tokens: same (8 tokens)" in rows[6]["note"]
    assert "same argmax: yes" in rows[4]["note"]
    assert "wrote 8 rows" in r.stdout


def test_padded_batch_runs_both_routes(tmp_path):
    """--padded: a padded batch of 4, flashc through varlen and through attn_mask, each checked against sdpa's
    logits on the real tokens; tokens/s counts the real tokens."""
    out = tmp_path / "padded.csv"
    bench = load_script()
    argv = ["--device", "cpu", "--quick", "--padded", "--skip", "generate", "--seqlens", "64", "--steps", "1"]
    assert bench.main(argv + ["--csv", str(out)]) == 0
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [r["config"].rpartition(" padded")[2].strip() for r in rows] == ["varlen", "attn_mask", ""]
    assert [r["impl"] for r in rows] == ["flashc:cpu", "flashc:cpu", "torch:sdpa"]
    real = 4 * 64 - (0 + 8 + 16 + 24)  # sequence b's last b/8 of 64 tokens are padding
    for r in rows:
        assert r["batch"] == "4" and r["pass"] == "train-step" and float(r["ms"]) > 0
        tok_s = float(r["note"].split(" tok/s")[0])  # ms is rounded to 4 decimals in the row
        assert abs(tok_s - real / (float(r["ms"]) / 1e3)) <= 1e-3 * tok_s, r["note"]
    assert all(r["status"] == "pass" for r in rows[:2])


def load_script():
    spec = importlib.util.spec_from_file_location("bench_transformers", SCRIPT)  # not "transformers": the library's
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_wrong_attention_fails_the_checks(monkeypatch, tmp_path, capsys):
    """flashc's attention made non-causal: the logits, the first token and the greedy tokens differ from sdpa's
    (so the checks of the run above can fail), and the run exits 1."""
    bench = load_script()
    right = flashc.hf.attention_forward

    def wrong(module, query, key, value, attention_mask, *args, is_causal=None, **kwargs):
        return right(module, query, key, value, None, *args, is_causal=False, **kwargs)

    monkeypatch.setattr(flashc.hf, "attention_forward", wrong)
    try:
        out = tmp_path / "wrong.csv"
        assert bench.main(["--device", "cpu", "--quick", "--seqlens", "64", "--steps", "1", "--csv", str(out)]) == 1
    finally:
        monkeypatch.undo()
        flashc.hf.register()  # transformers' registry holds the function it was given: give it the right one back
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert [(r["pass"], r["status"]) for r in rows[::2]] == [("train-step", "FAIL"), ("prefill", "FAIL"),
                                                             ("decode8", "FAIL")]  # fmt: skip
    assert "greedy tokens: differ from token 0" in rows[4]["note"]
    assert "FAIL" in capsys.readouterr().out
