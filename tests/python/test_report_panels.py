"""The testing report's plots say what they show: the speed-up panel names its baseline, or says that no
peer ran (instead of drawing bars that are all 1.0), and every panel has a legend."""

import pytest

from flashc.testing import report
from flashc.testing.engine import add_speedups


def row(impl, ms, config="c1"):
    return {
        "config": config, "dtype": "f32", "causal": 0, "pass": "fwd", "batch": 1, "heads_q": 2, "heads_kv": 2,
        "seqlen_q": 64, "seqlen_k": 64, "head_dim": 32, "impl": impl, "ms": ms, "tflops": 1.0, "gbps": 1.0,
    }  # fmt: skip


def test_speedup_title_without_a_peer():
    rows = [row("flashc:cpu", 2.0), row("flashc:cpu", 3.0, config="c2")]
    add_speedups(rows)
    assert [r["speedup"] for r in rows] == [1.0, 1.0]
    title, shown = report.speedup_title(rows)
    assert not shown
    assert "no peer ran" in title


def test_speedup_title_names_the_baseline():
    rows = [row("flashc:cpu", 2.0), row("torch:cpu", 4.0)]
    add_speedups(rows)
    title, shown = report.speedup_title(rows)
    assert shown
    assert "torch:cpu" in title
    assert rows[0]["speedup"] == pytest.approx(2.0)


def test_every_panel_has_a_legend(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen = []
    monkeypatch.setattr(plt.Figure, "savefig", lambda fig, *a, **k: seen.append(fig), raising=True)
    for rows, panels_with_bars in (([row("flashc:cpu", 2.0), row("torch:cpu", 4.0)], 4), ([row("flashc:cpu", 2.0)], 3)):
        add_speedups(rows)
        seen.clear()
        report.plots(rows, str(tmp_path))
        (fig,) = seen
        with_bars = [ax for ax in fig.axes if ax.patches]
        assert len(with_bars) == panels_with_bars
        assert all(ax.get_legend() is not None for ax in with_bars), [ax.get_title() for ax in with_bars]
        titles = [ax.get_title() for ax in fig.axes]
        assert any(t.startswith("speed-up") for t in titles), titles
        assert ("no peer ran" in " ".join(titles)) == (panels_with_bars == 3)
