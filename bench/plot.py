"""bench/plot.py — TFLOP/s against seqlen from a results CSV (the schema of bench/compare.py), one panel per
(pass, head dim, mask), one line per implementation:

    python3 bench/plot.py bench/results/mma.csv --dtype bf16 --out bench/results/mma-bf16.png

Rows of other dtypes are left out; rows without TFLOP/s (skipped, failed) are left out of the lines.

With --speedup (grids whose configurations differ in more than seqlen, such as --grid models): one panel per
pass, one group of bars per configuration, one bar per flashc backend: its time over the fastest PyTorch peer's
in the same run (>1: faster than every peer), with lines at 1.0 and at --bar.

    python3 bench/plot.py bench/results/models.csv --speedup --out bench/results/models.png
"""

import argparse
import csv
import collections

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines that run this
import matplotlib.pyplot as plt  # noqa: E402


def rows(paths, dtype):
    """The rows of `dtype` in the CSV files, in file order."""
    for path in paths:
        with open(path, newline="") as f:
            yield from (row for row in csv.DictReader(f) if row["dtype"] == dtype)


def load(paths, dtype):
    """{(pass, head_dim, causal): {impl: [(seqlen, tflops)]}} of the rows of `dtype`, and the device named."""
    panels = collections.defaultdict(lambda: collections.defaultdict(list))
    device = ""
    for row in rows(paths, dtype):
        if row["tflops"]:
            key = (row["pass"], int(row["head_dim"]), int(row["causal"]))
            panels[key][row["impl"]].append((int(row["seqlen_q"]), float(row["tflops"])))
            device = row["device"]
    return panels, device


def load_ratios(paths, dtype):
    """{pass: {config: {flashc impl: fastest peer ms / its ms}}} in file order, and the device named."""
    times = collections.defaultdict(lambda: collections.defaultdict(dict))
    device = ""
    for row in rows(paths, dtype):
        if row["ms"] and row["status"] not in ("FAIL", "error", "skipped"):
            times[row["pass"]][row["config"]][row["impl"]] = float(row["ms"])
            device = row["device"]
    ratios = {}
    for pas, configs in times.items():
        ratios[pas] = {}
        for config, ms in configs.items():
            peers = [t for impl, t in ms.items() if not impl.startswith("flashc:")]
            if peers:
                ratios[pas][config] = {i: min(peers) / t for i, t in ms.items() if i.startswith("flashc:")}
    return ratios, device


def plot_speedup(args):
    ratios, device = load_ratios(args.csv, args.dtype)
    if not ratios:
        raise SystemExit(f"plot.py: no {args.dtype} rows with a peer in {', '.join(args.csv)}")
    passes = sorted(ratios, key=lambda p: p != "fwd")
    impls = sorted({i for r in ratios.values() for c in r.values() for i in c})
    n = max(len(r) for r in ratios.values())
    fig, axes = plt.subplots(
        len(passes), 1, figsize=(max(8.0, 0.32 * n * len(impls)), 3.4 * len(passes)), squeeze=False
    )
    width = 0.8 / len(impls)
    for ax, pas in zip(axes[:, 0], passes):
        configs = list(ratios[pas])
        for k, impl in enumerate(impls):
            xs = [c + (k - (len(impls) - 1) / 2) * width for c in range(len(configs))]
            ax.bar(xs, [ratios[pas][c].get(impl, 0.0) for c in configs], width, label=impl, color=f"C{k}")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.axhline(args.bar, color="grey", lw=0.8, ls="--")
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(configs, rotation=75, fontsize=6)
        ax.set_ylabel("× fastest peer", fontsize=8)
        ax.set_ylim(0.0, max(1.3, max(v for c in ratios[pas].values() for v in c.values()) * 1.05))
        ax.set_title(pas, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{device}, {args.dtype}: time of the fastest PyTorch peer ÷ flashc's", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(args.out, dpi=110)
    print(f"plot.py: wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--speedup", action="store_true", help="bars of flashc vs the fastest peer per configuration")
    ap.add_argument("--bar", type=float, default=1.05, help="with --speedup: the dashed line (the issue's bar)")
    args = ap.parse_args()
    if args.speedup:
        plot_speedup(args)
        return
    panels, device = load(args.csv, args.dtype)
    if not panels:
        raise SystemExit(f"plot.py: no {args.dtype} rows with TFLOP/s in {', '.join(args.csv)}")
    keys = sorted(panels)
    cols = len({(k[1], k[2]) for k in keys})
    rows = len({k[0] for k in keys})
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.0 * rows), squeeze=False)
    passes = sorted({k[0] for k in keys}, key=lambda p: p != "fwd")
    shapes = sorted({(k[1], k[2]) for k in keys})
    impls = sorted({impl for key in keys for impl in panels[key]})  # one colour per implementation everywhere
    colour = {impl: f"C{i}" for i, impl in enumerate(impls)}
    for key in keys:
        ax = axes[passes.index(key[0])][shapes.index((key[1], key[2]))]
        for impl, points in sorted(panels[key].items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", ms=3, label=impl, color=colour[impl])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{key[0]} d{key[1]} {'causal' if key[2] else 'full'}", fontsize=9)
        ax.set_xlabel("seqlen", fontsize=8)
        ax.set_ylabel("TFLOP/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colour[impl], marker="o", ms=3) for impl in impls]
    fig.legend(handles, impls, loc="lower center", ncol=len(impls), fontsize=8)
    fig.suptitle(f"{device}, {args.dtype}", fontsize=10)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(args.out, dpi=110)
    print(f"plot.py: wrote {args.out}")


if __name__ == "__main__":
    main()
