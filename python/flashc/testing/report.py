"""Rows to people: a table on stdout, a CSV, plots and a text summary.

Plots (matplotlib, optional): per configuration, time, speed-up, TFLOP/s and bandwidth for every
implementation, each panel with its legend (one figure per pass: kernel_comparison[_bwd].png; the speed-up
panel names its baseline, or says that no peer ran), and for a sequence-length sweep the time
and TFLOP/s against seqlen on log axes (seqlen_scaling[_bwd].png).
"""

from __future__ import annotations

import csv
import math
import os
import statistics

from .engine import COLUMNS


def _fmt(x, spec) -> str:
    if x is None or x == "":
        return "-"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else format(x, spec)
    return str(x)


TABLE = [
    ("config", "config", "<24", "s"),
    ("impl", "impl", "<18", "s"),
    ("dtype", "dtype", "<5", "s"),
    ("causal", "causal", "<6", "s"),
    ("pass", "pass", "<4", "s"),
    ("ms", "ms", ">10", ".4g"),
    ("speedup", "speedup", ">8", ".3g"),
    ("tflops", "TFLOP/s", ">8", ".3g"),
    ("gbps", "GB/s", ">8", ".4g"),
    ("max_abs_err", "max_abs", ">9", ".2e"),
    ("mean_abs_err", "mean_abs", ">9", ".2e"),
    ("mse", "mse", ">9", ".2e"),
    ("max_rel_err", "max_rel", ">9", ".2e"),
    ("rel_l2_err", "rel_l2", ">9", ".2e"),
    ("status", "status", "<7", "s"),
]


def shape_label(row: dict) -> str:
    """'stress-1 8/16/2048/64', or just the shape for a custom --config (its name is the shape); a head dim of V
    of its own as D:DV, a paged cache's page size after the shape; a row without a shape (copy) its name."""
    if row.get("heads_q") in (None, ""):
        return str(row["config"])
    hq = f"{row['heads_q']}" + (f":{row['heads_kv']}" if row["heads_kv"] != row["heads_q"] else "")
    s = f"{row['seqlen_q']}" + (f":{row['seqlen_k']}" if row["seqlen_k"] != row["seqlen_q"] else "")
    d = f"{row['head_dim']}" + (
        f":{row['head_dim_v']}" if row.get("head_dim_v", row["head_dim"]) != row["head_dim"] else ""
    )
    shape = f"{row['batch']}/{hq}/{s}/{d}" + (f" page {row['page_size']}" if row.get("page_size") else "")
    return shape if row["config"] == shape else f"{row['config']} {shape}"


def header() -> str:
    return " ".join(format(title, width) for _, title, width, _ in TABLE)


def line(row: dict) -> str:
    cells = []
    for key, _, width, spec in TABLE:
        value = row.get(key)
        if key == "config":
            value = shape_label(row)
        text = _fmt(value, spec) if spec != "s" else ("-" if value in (None, "") else str(value))
        cells.append(format(text, width))
    text = " ".join(cells)
    if row.get("status") in ("skipped", "error", "FAIL") and row.get("note"):
        text += f"  ({row['note']})"
    return text


def write_csv(rows: list, path: str, columns=COLUMNS, append: bool = False) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not (append and os.path.exists(path) and os.path.getsize(path) > 0)
    with open(path, "a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({c: ("" if r.get(c) is None else r.get(c, "")) for c in columns})


def summary(rows: list) -> str:
    """Per implementation and pass: mean time, speed-up, TFLOP/s and GB/s over the rows it ran (the CUDA-core
    FA2 project's results table), then the counts and every failure."""
    out = []
    for pass_ in dict.fromkeys(r["pass"] for r in rows):
        title = {"fwd": "FORWARD", "bwd": "BACKWARD", "fwdbwd": "BACKWARD"}.get(pass_, pass_.upper())
        out.append(f"{title} ({pass_})")
        out.append(
            f"  {'impl':<20} {'rows':>4} {'mean ms':>11} {'mean speedup':>13} {'mean TFLOP/s':>13} "
            f"{'mean GB/s':>10} {'worst max_abs':>14}"
        )
        impls = []
        for r in rows:
            if r["pass"] == pass_ and r["impl"] not in impls:
                impls.append(r["impl"])
        for impl in impls:
            mine = [r for r in rows if r["pass"] == pass_ and r["impl"] == impl and isinstance(r.get("ms"), float)]
            if not mine:
                out.append(f"  {impl:<20} {0:>4}   (skipped everywhere)")
                continue

            def mean(key, mine=mine):
                vals = [r[key] for r in mine if isinstance(r.get(key), float) and not math.isnan(r[key])]
                return statistics.fmean(vals) if vals else float("nan")

            errs = [r["max_abs_err"] for r in mine if isinstance(r.get("max_abs_err"), float)]
            worst = max(errs) if errs else float("nan")
            out.append(
                f"  {impl:<20} {len(mine):>4} {mean('ms'):>11.4g} {mean('speedup'):>13.3g} "
                f"{mean('tflops'):>13.3g} {mean('gbps'):>10.4g} {worst:>14.2e}"
            )
    counts = {}
    for r in rows:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    out.append("rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    bad = [r for r in rows if r.get("status") in ("FAIL", "error")]
    for r in bad:
        out.append(f"  {r['status']}: {r['impl']} {r['pass']} {shape_label(r)}: {r.get('note', '')}")
    return "\n".join(out)


def speedup_title(rows: list) -> tuple[str, bool]:
    """The speed-up panel's title, and whether it has anything to show. A speed-up is a row's time against its
    group's baseline (engine.add_speedups); where no other implementation ran, every row is its own baseline
    and every bar would be 1.0, which the panel then says instead of drawing."""
    bases = sorted({r["baseline"] for r in rows if r.get("baseline")})
    if not any(r.get("baseline") and r["baseline"] != r["impl"] for r in rows):
        return "speed-up: no peer ran (each row would be 1.0 against itself)", False
    return f"speed-up over {', '.join(bases)} (higher is faster)", True


def plots(rows: list, outdir: str, seqlen_sweep: bool = False) -> list:
    """PNG files written (none, with a note on stderr, when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import sys

        print("flashc.testing: matplotlib is not installed; no plots (pip install matplotlib)", file=sys.stderr)
        return []
    os.makedirs(outdir, exist_ok=True)
    written = []
    for pass_ in dict.fromkeys(r["pass"] for r in rows):
        mine = [r for r in rows if r["pass"] == pass_ and isinstance(r.get("ms"), float)]
        if not mine:
            continue
        suffix = "" if pass_ == "fwd" else f"_{pass_}"
        impls = list(dict.fromkeys(r["impl"] for r in mine))
        configs = list(dict.fromkeys(shape_label(r) for r in mine))
        labels = [c.replace(" ", "\n") for c in configs]
        if seqlen_sweep:
            fig, axes = plt.subplots(1, 2, figsize=(13, 5))
            for impl in impls:
                pts = sorted((r["seqlen_q"], r["ms"], r["tflops"]) for r in mine if r["impl"] == impl)
                axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
                axes[1].plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=impl)
            for ax, what in zip(axes, ("time (ms)", "TFLOP/s")):
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel("seqlen")
                ax.set_ylabel(what)
                ax.grid(True, which="both", alpha=0.3)
            for ax in axes:
                ax.legend(fontsize=8)
            fig.suptitle(
                f"sequence-length scaling ({pass_}, batch {mine[0]['batch']}, heads {mine[0]['heads_q']}, "
                f"head_dim {mine[0]['head_dim']}, {mine[0]['dtype']})"
            )
            path = os.path.join(outdir, f"seqlen_scaling{suffix}.png")
        else:
            fig, axes = plt.subplots(2, 2, figsize=(max(12, 1.3 * len(configs) + 4), 10))
            width = 0.8 / max(1, len(impls))
            speedup_label, speedup_shown = speedup_title(mine)
            for ax, (key, title, log) in zip(
                axes.ravel(),
                (
                    ("ms", "time (ms)", True),
                    ("speedup", speedup_label, True),
                    ("tflops", "TFLOP/s", False),
                    ("gbps", "GB/s", False),
                ),
            ):
                if key == "speedup" and not speedup_shown:
                    ax.set_title(title)
                    ax.text(
                        0.5,
                        0.5,
                        "no peer ran:\nnothing to compare with",
                        ha="center",
                        va="center",
                        transform=ax.transAxes,
                    )
                    ax.set_xticks([])
                    ax.set_yticks([])
                    continue
                for i, impl in enumerate(impls):
                    ys = []
                    for c in configs:
                        r = next((r for r in mine if r["impl"] == impl and shape_label(r) == c), None)
                        ys.append(r.get(key, float("nan")) if r else float("nan"))
                    ax.bar([j + i * width for j in range(len(configs))], ys, width, label=impl)
                ax.set_title(title)
                ax.set_xticks([j + 0.4 - width / 2 for j in range(len(configs))])
                ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
                if log:
                    ax.set_yscale("log")
                ax.grid(True, axis="y", alpha=0.3)
                ax.legend(fontsize=8)  # every panel: each is read on its own
            fig.suptitle(f"implementations compared ({pass_}, {mine[0]['dtype']})")
            path = os.path.join(outdir, f"kernel_comparison{suffix}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
