"""bench/plot.py — TFLOP/s against seqlen from a results CSV (the schema of bench/compare.py), one panel per
(pass, head dim, mask), one line per implementation:

    python3 bench/plot.py bench/results/mma.csv --dtype bf16 --out bench/results/mma-bf16.png

Rows of other dtypes are left out; rows without TFLOP/s (skipped, failed) are left out of the lines.

With --speedup (grids whose configurations differ in more than seqlen, such as --grid models): one panel per
pass, one group of bars per configuration, one bar per flashc backend: its time over the fastest PyTorch peer's
in the same run (>1: faster than every peer), with lines at 1.0 and at --bar.

    python3 bench/plot.py bench/results/models.csv --speedup --out bench/results/models.png

With --decode (--grid decode's CSV, issue #49): per configuration, one bar per flashc backend and cache layout (dense,
pages of 16 and 256 rows): above, its achieved bandwidth (gbps: bytes of K and V read) over the copy bandwidth of
the run its rows come from (the `copy` row of the same commit), with a line at --bar (0.8 there); below, the fastest
PyTorch peer's time over its own, on a log scale, with a line at 1.0.

    python3 bench/plot.py bench/results/decode.csv --decode --bar 0.8 --out bench/results/decode.png
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


def load_decode(paths, dtype):
    """{config: {label: (gbps / the copy gbps of its commit, fastest peer ms / its ms or None)}} in file order, the
    device named. label: the backend, and the page size where the cache is paged."""
    copy, table, device = {}, collections.defaultdict(dict), ""
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row["impl"] == "copy" and row["gbps"]:
                    copy[row["commit"]] = float(row["gbps"])
    peers = collections.defaultdict(list)
    for row in rows(paths, dtype):
        if row["ms"] and row["status"] == "peer":
            peers[row["config"]].append(float(row["ms"]))
    for row in rows(paths, dtype):
        if row["impl"].startswith("flashc:") and row["status"] == "pass" and row["gbps"] and row["commit"] in copy:
            page = row.get("page_size") or "0"
            label = row["impl"].split(":", 1)[1] + ("" if page == "0" else f" p{page}")
            best = min(peers[row["config"]]) if peers[row["config"]] else None
            table[row["config"]][label] = (
                float(row["gbps"]) / copy[row["commit"]],
                best / float(row["ms"]) if best else None,
            )
            device = row["device"]
    return table, device


def plot_decode(args):
    table, device = load_decode(args.csv, args.dtype)
    if not table:
        raise SystemExit(f"plot.py: no passing {args.dtype} flashc rows with a copy row in {', '.join(args.csv)}")
    configs = list(table)
    labels = sorted({lab for c in table.values() for lab in c})
    width = 0.8 / len(labels)
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 0.09 * len(configs) * len(labels)), 7.5))
    for k, lab in enumerate(labels):
        xs = [c + (k - (len(labels) - 1) / 2) * width for c in range(len(configs))]
        frac = [table[c].get(lab, (0.0, None))[0] for c in configs]
        speed = [table[c].get(lab, (0.0, None))[1] or 0.0 for c in configs]
        axes[0].bar(xs, frac, width, label=lab, color=f"C{k}")
        axes[1].bar(xs, speed, width, label=lab, color=f"C{k}")
    axes[0].axhline(args.bar, color="grey", lw=0.8, ls="--")
    axes[0].set_ylabel("bandwidth ÷ copy's", fontsize=8)
    axes[1].axhline(1.0, color="black", lw=0.8)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("× fastest peer", fontsize=8)
    for ax in axes:
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(configs, rotation=75, fontsize=5)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left", ncol=len(labels))
    fig.suptitle(f"{device}, {args.dtype}: decoding over a KV cache (dense and paged)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(args.out, dpi=100)
    print(f"plot.py: wrote {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", required=True)
    ap.add_argument("--speedup", action="store_true", help="bars of flashc vs the fastest peer per configuration")
    ap.add_argument("--decode", action="store_true", help="bandwidth over the copy's and speedup per decode config")
    ap.add_argument("--bar", type=float, default=1.05, help="--speedup, --decode: the dashed line (the issue's bar)")
    args = ap.parse_args()
    if args.decode:
        plot_decode(args)
        return
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
