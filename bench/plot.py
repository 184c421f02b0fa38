"""bench/plot.py — TFLOP/s against seqlen from a results CSV (the schema of bench/compare.py), one panel per
(pass, head dim, mask), one line per implementation:

    python3 bench/plot.py bench/results/mma.csv --dtype bf16 --out bench/results/mma-bf16.png

Rows of other dtypes are left out; rows without TFLOP/s (skipped, failed) are left out of the lines.
"""
import argparse
import csv
import collections

import matplotlib

matplotlib.use("Agg")  # files only: no display on the machines that run this
import matplotlib.pyplot as plt  # noqa: E402


def load(paths, dtype):
    """{(pass, head_dim, causal): {impl: [(seqlen, tflops)]}} of the rows of `dtype`, and the device named."""
    panels = collections.defaultdict(lambda: collections.defaultdict(list))
    device = ""
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["dtype"] != dtype or not row["tflops"]:
                    continue
                key = (row["pass"], int(row["head_dim"]), int(row["causal"]))
                panels[key][row["impl"]].append((int(row["seqlen_q"]), float(row["tflops"])))
                device = row["device"]
    return panels, device


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
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
