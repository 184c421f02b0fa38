"""`python -m flashc.testing`: check and time flashc backends against the fp64 reference and PyTorch.

See flashc/testing/__init__.py for what each flag does and how long runs are kept practical on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import flashc

from . import configs, engine, impls, metrics, report, timing

MODES = {"forward": ["fwd"], "backward": ["bwd"], "both": ["fwd", "bwd"]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m flashc.testing",
        description="Check flashc backends against an fp64 reference and time them beside the PyTorch peers.",
        epilog="Example: python -m flashc.testing --mode both --kernel cpu --no-gpu-reference",
    )
    p.add_argument(
        "--mode",
        choices=list(MODES),
        default="forward",
        help="forward, backward (the backend's own forward feeds it, untimed) or both",
    )
    p.add_argument(
        "--kernel",
        default=None,
        help="flashc backend(s) to test, comma-separated (see --list); default: the best usable backend of --device",
    )
    p.add_argument(
        "--experiment",
        action="store_true",
        help="every flashc backend and every peer over the ten standard configurations",
    )
    p.add_argument(
        "--seqlen-experiment",
        action="store_true",
        help="sequence-length sweep 128..8192 at batch 4, heads 8, head_dim 64",
    )
    p.add_argument("--seqlens", default=None, help="seqlens of --seqlen-experiment, comma-separated")
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="B/H/S/D",
        help="a custom configuration instead of the standard ten (repeatable; H may be HQ:HKV, S may be SQ:SK)",
    )
    p.add_argument("--dtype", choices=["f32", "f16", "bf16", "f64"], default="f32")
    p.add_argument("--causal", action="store_true", help="causal mask (bottom-right aligned)")
    p.add_argument("--window", default=None, metavar="L,R", help="sliding window, e.g. 128,0 (-1: unbounded)")
    p.add_argument("--softcap", type=float, default=0.0, help="scores s <- cap·tanh(s / cap) (Gemma-2; 0: none)")
    p.add_argument("--alibi", action="store_true", help="ALiBi with the paper's slopes 2^(-8(h+1)/H)")
    p.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        metavar="P",
        help="attention dropout p (0: none); the mask is keyed by a fixed seed, and the reference draws the same",
    )
    p.add_argument("--head-dim-v", type=int, default=0, help="head dim of V and O for every config (0: Q/K's)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="pass if max_abs_err <= tolerance * max(1, max|ref|); default by dtype: "
        + ", ".join(f"{k} {v:g}" for k, v in metrics.DEFAULT_TOLERANCE.items()),
    )
    p.add_argument("--no-stop-on-failure", action="store_true", help="run everything even after a failure")
    p.add_argument("--save-results", action="store_true", help="write CSV, plots and a summary to --output-dir")
    p.add_argument("--output-dir", default="./experiment_results")
    p.add_argument(
        "--no-gpu-reference",
        action="store_true",
        help="run no PyTorch on the GPU: no GPU peers, and the fp64 reference on the host (cpu-ref)",
    )
    p.add_argument("--no-peers", action="store_true", help="only flashc backends, no PyTorch peers")
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=None,
        help="where the default kernel and the peers run; default cuda when usable, else cpu",
    )
    p.add_argument("--repeats", type=int, default=30, help="timed repeats per row (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    p.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="GPU rows: seconds of back-to-back untimed calls before timing (the clock under the power cap settles "
        "after about a second on an H100)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds of timed repeats per host row, at least 3 repeats (default 3; GPU rows always run every repeat)",
    )
    p.add_argument(
        "--input-sets",
        type=int,
        default=None,
        help="input sets the timed calls rotate over (default 1 on cpu, 3 on cuda)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads for host implementations (0: all)")
    p.add_argument(
        "--reference",
        choices=["auto", "cpu-ref", "torch-fp64", "numpy"],
        default="auto",
        help="fp64 reference engine (auto: torch-fp64 on a GPU run, else flashc cpu-ref)",
    )
    p.add_argument(
        "--max-ref-seqlen",
        type=int,
        default=None,
        help="above this seqlen the reference runs on --ref-samples (batch, kv-head) slices and "
        "cpu-ref is not timed (default: 512 with a host reference, unlimited with torch-fp64; "
        "0: unlimited; cpu-ref is then timed up to 1024)",
    )
    p.add_argument("--ref-samples", type=int, default=2, help="slices checked above --max-ref-seqlen")
    p.add_argument("--baseline", default=None, help="impl the speed-up is relative to (default torch:cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="list flashc backends and peers, then exit")
    args = p.parse_args(argv)
    if not (args.softcap >= 0 and args.softcap < float("inf")):
        p.error(f"--softcap {args.softcap}: use 0 (none) or a finite cap > 0")
    if not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout {args.dropout}: use 0 (none) or a probability 0 < p < 1")
    if args.head_dim_v < 0:
        p.error(f"--head-dim-v {args.head_dim_v}: use 0 (Q/K's head dim) or a head dim >= 1")
    return args


def _has_cuda() -> bool:
    torch = impls.torch_or_none()
    return torch is not None and torch.cuda.is_available()


def _resolve(args):
    """Fill defaults that depend on the machine; returns (device, reference engine)."""
    usable = [b for b in flashc.backends() if b.usable]
    device = args.device or ("cuda" if _has_cuda() and any(b.device == "cuda" for b in usable) else "cpu")
    if device == "cuda" and not _has_cuda():
        raise SystemExit("--device cuda needs torch with a CUDA device (flashc's CUDA backends take torch tensors)")
    if args.reference != "auto":
        ref = args.reference
    elif device == "cuda" and not args.no_gpu_reference:
        ref = "torch-fp64"
    else:
        ref = "cpu-ref" if any(b.name == "cpu-ref" for b in usable) else "numpy"
    if args.max_ref_seqlen is None:
        args.max_ref_seqlen = None if ref == "torch-fp64" else 512
    elif args.max_ref_seqlen <= 0:
        args.max_ref_seqlen = None
    if args.time_budget is None:
        args.time_budget = 3.0
    if args.input_sets is None:
        args.input_sets = 3 if device == "cuda" else 1
    return device, ref


def _kernels(args, device):
    if args.experiment:
        return impls.flashc_impls(device, [b.name for b in flashc.backends()], args.max_ref_seqlen or 1024)
    if args.kernel:
        names = [n.strip() for n in args.kernel.split(",") if n.strip()]
        return impls.flashc_impls(device, names, args.max_ref_seqlen or 1024)
    best = next((b for b in flashc.backends() if b.usable and b.device == device), None)
    if best is None:
        raise SystemExit(f"no usable flashc backend for {device}; see --list")
    return impls.flashc_impls(device, [best.name], args.max_ref_seqlen or 1024)


def _print_list():
    print(f"flashc {flashc.__version__} ({flashc.library_path})")
    for b in flashc.backends():
        state = "usable" if b.usable else f"not usable: {b.why_unusable}"
        print(
            f"  flashc:{b.name:<14} {b.device:<5} {','.join(b.dtypes):<16} d {b.min_head_dim}-{b.max_head_dim}"
            f"  {'fwd+bwd' if b.has_backward else 'fwd'}  {state}  — {b.summary}"
        )
    missing = impls.torch_missing_reason()
    print("  torch:cpu            " + (missing or "available"))
    for name in impls.TORCH_SDPA_BACKENDS:
        print(f"  torch:{name:<14} " + (missing or ("available" if _has_cuda() else "needs a CUDA device")))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        _print_list()
        return 0
    device, ref_engine = _resolve(args)
    window = None
    if args.window:
        try:
            window = tuple(int(x) for x in args.window.split(","))
            assert len(window) == 2
        except (ValueError, AssertionError):
            raise SystemExit(f"--window {args.window!r} is not L,R") from None

    if args.config:
        cfgs = [configs.parse(c) for c in args.config]
    elif args.seqlen_experiment:
        seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else configs.SEQLENS
        cfgs = configs.seqlen_sweep(seqlens)
    else:
        cfgs = configs.STANDARD
    chosen = _kernels(args, device)
    peers = [] if args.no_peers else impls.peer_impls(device, gpu=not args.no_gpu_reference)
    all_impls = chosen + peers
    passes = MODES[args.mode]

    opts = engine.Options(
        seed=args.seed,
        warmup=args.warmup,
        warmup_s=args.warmup_s,
        repeats=args.repeats,
        budget_s=args.time_budget,
        input_sets=args.input_sets,
        tolerance=args.tolerance,
        ref_engine=ref_engine,
        max_ref_seqlen=args.max_ref_seqlen,
        ref_samples=args.ref_samples,
        device_label=impls.device_name(device),
        commit=engine.git_commit(),
        baseline=args.baseline,
        flush=timing.l2_flush(device),
    )
    print(
        f"flashc {flashc.__version__} | device {device} ({opts.device_label}) | dtype {args.dtype} | "
        f"{'causal' if args.causal else 'full'}{f' window {window}' if window else ''}"
        f"{f' softcap {args.softcap:g}' if args.softcap else ''}{' alibi' if args.alibi else ''}"
        f"{f' dropout {args.dropout:g}' if args.dropout else ''} | mode {args.mode} | "
        f"reference {ref_engine} f64" + (f", sampled above seqlen {args.max_ref_seqlen}" if args.max_ref_seqlen else "")
    )
    print(f"implementations: {', '.join(i.name for i in all_impls)}")
    print(report.header())

    progress = _progress(len(cfgs) * len(all_impls) * len(passes))
    write = progress.write if progress is not None else print
    rows, failed = [], False
    for cfg in cfgs:
        cfg = dataclasses.replace(cfg, head_dim_v=args.head_dim_v) if args.head_dim_v else cfg
        case = impls.Case(cfg=cfg, dtype=args.dtype, causal=args.causal, window=window, threads=args.threads,
                          softcap=args.softcap, alibi=args.alibi, dropout=args.dropout)  # fmt: skip
        case_rows = engine.run_case(
            case, all_impls, passes, opts, on_row=(lambda row: progress.update(1)) if progress is not None else None
        )
        for row in case_rows:  # after the case, when the speed-ups are known
            write(report.line(row))
        rows += case_rows
        if any(r["status"] in ("FAIL", "error") for r in case_rows):
            failed = True
            if not args.no_stop_on_failure:
                write("stopping at the first failure (--no-stop-on-failure runs everything)")
                break
    if progress is not None:
        progress.close()

    text = report.summary(rows)
    print()
    print(text)
    if args.save_results:
        os.makedirs(args.output_dir, exist_ok=True)
        stem = "seqlen_results" if args.seqlen_experiment else "experiment_results"
        if args.mode != "forward":
            stem += f"_{args.mode}"
        csv_path = os.path.join(args.output_dir, f"{stem}.csv")
        report.write_csv(rows, csv_path)
        with open(os.path.join(args.output_dir, f"{stem}_summary.txt"), "w") as f:
            f.write(text + "\n")
        pngs = report.plots(rows, args.output_dir, seqlen_sweep=args.seqlen_experiment)
        print(f"wrote {csv_path}, {stem}_summary.txt" + "".join(f", {os.path.basename(p)}" for p in pngs))
    return 1 if failed else 0


def _progress(total: int):
    """A tqdm bar on a terminal with tqdm installed; None otherwise (rows are printed either way)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="row", leave=False)
