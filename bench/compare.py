#!/usr/bin/env python3
"""bench/compare.py — flashc backends and the PyTorch peers, timed in one process on the same tensors.

    python bench/compare.py --grid fp32-ladder --csv bench/results/fp32-ladder.csv
    python bench/compare.py --grid targets --dtype bf16,f16 --pass fwd,bwd --csv bench/results/targets.csv
    python bench/compare.py --grid cpu --device cpu --threads 2 --csv bench/results/cpu-vs-ref.csv
    python bench/compare.py --config 4/16/4096/128 --causal both --backends cuda-mma --peers flash,cudnn
    python bench/compare.py --grid features --csv bench/results/features.csv
    python bench/compare.py --grid decode --csv bench/results/decode.csv
    python bench/compare.py --grid decode --device cpu --quick      (host-sized shapes, as the tests run it)
    python bench/compare.py --grid models --only gpt2,falcon --causal causal --csv part.csv   (some of a grid)

Grids (--grid):
  fp32-ladder  the ten configurations of the CUDA-core FA2 project, the seqlen sweep 128…8192 at batch 4,
               heads 8, head_dim 64, full and causal, fp32; peers torch:efficient and torch:math.
  targets      docs/targets.md: 16384 tokens (batch = 16384 / seqlen), model width 2048 (heads = 2048 / head_dim),
               head_dim 64/128/256, seqlen 512…16k, full and causal, bf16 (--dtype bf16,f16 for both);
               peers torch:flash and torch:cudnn.
  models       the heads of public models (Llama-3-8B/70B, Mistral-7B, Qwen2.5-7B/0.5B, Gemma-2-9B, Phi-3-mini,
               GPT-2 small, Falcon-7B's MQA) at seqlen 1k/4k/8k/32k, batch = max(1, 16k tokens / seqlen), causal,
               bf16; peers torch:flash and torch:cudnn (enable_gqa, or K/V expanded where a backend lacks it).
  cpu          docs/targets.md's CPU table: 1/8/2048/64 and 1/8/4096/128, full and causal, fp32; peer torch:cpu.
  features     issue #48 side by side: plain, softcap 30, ALiBi (slopes 2^(−8(h+1)/H)), dropout 0.1 (a fixed
               seed; the reference draws the same Philox mask), a padded batch's boolean attn_mask (padmask:
               configs.padding_mask, the causal mask folded in, the same [b, 1, s, s] tensor for flashc and SDPA)
               at d 128, and Q/K 192 with V 128, seqlen 4k and 8k, 16 heads, batch = 16k tokens / seqlen, causal,
               bf16; peers torch:flash, cudnn and efficient where they take the case (ALiBi as a float attn_mask;
               no SDPA softcap, and SDPA's dropout draws another mask: skipped). A backend that refuses a feature
               gives a skipped row saying so. The CSV adds head_dim_v, softcap, alibi and dropout columns.
  decode       issue #49: flashc.attention_with_kvcache over a dense and a paged (16, 256) cache, seqlen_new 1 and
               4, batch 1/8/64, cache length 1k…128k, heads 32/8, 64/8, 32/32, d 128, bf16, causal, then ragged
               batches (8 and 64 sequences of L = 16k and 64k down to L/2 keys, one new row, heads 32/8); peers
               torch:flash and cudnn on the same cache as dense tensors (ragged: with a mask of each sequence's
               keys, and torch:efficient beside them); a `copy` row with the copy bandwidth of the same run.
               gbps = bytes of K and V read ÷ time. Shapes whose cache exceeds --max-cache-gib are rows marked
               skipped. Method in python/flashc/testing/decode.py. The CSV adds page_size.
--quick runs features and decode at host sizes (seqlen 128/256, head dims 32 and 48:32; caches of 40 and 300
keys, batch 1 and 3 (and 3 ragged sequences of 300 down to 200 keys), heads 4/2 and 4/4, d 32) with the same
variants: a CPU check of the full grids' code.

Method. Each case builds --input-sets sets of random inputs (default: enough to pass twice the GPU's L2,
3 to 16) and every implementation prepares one call per set up front (conversion and output allocation
happen there; flashc through flashc.prepare_forward/prepare_backward). Each is first checked against the
fp64 reference (outputs poisoned with NaN before), then timed: --warmup calls, then --repeats (≥ 30) calls
rotating over the sets, each between two CUDA events, with an L2 flush enqueued before each start event
(outside the timed region); the median is reported. --warmup-s S first runs each implementation back to back
for S seconds, so that the timed calls see the clock the GPU settles at under its power cap (an H100 needs about
a second of sustained load; without it a row reads a clock set by what ran just before). PyTorch's own ops
allocate their outputs from its caching allocator inside their calls: that is their cost as users see it.
Backward rows time the backward alone (flashc: its backward kernel given its own forward's o and lse; PyTorch:
autograd.grad through SDPA).

Errors vs the fp64 reference (torch float64 on the GPU, or flashc's cpu-ref on the host) are computed on
every row; above --max-ref-seqlen (default 4096 on the GPU, 512 on the host) on --ref-samples (batch,
kv-head) slices of it. --no-check skips them.

Output: a table on stdout, and with --csv the rows in the results schema of docs/targets.md
(date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,world,threads,
ms,tflops,gbps,max_abs_err,rel_l2_err) followed by config,status,speedup,baseline,repeats,reference,note.
`speedup` is the fastest peer's time over the row's (>1: faster than every peer that ran).
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

try:
    import flashc
except ImportError:  # run from a checkout without `pip install ./python` (then FLASHC_LIBRARY names the lib)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import flashc

from flashc.testing import configs, decode, engine, impls, report, timing  # noqa: E402

COLUMNS = engine.SCHEMA + ["config", "status", "speedup", "baseline", "repeats", "reference", "note"]
FEATURE_COLUMNS = COLUMNS + ["head_dim_v", "softcap", "alibi", "dropout"]
DECODE_COLUMNS = COLUMNS + decode.EXTRA_COLUMNS


def grid(name: str, quick: bool = False, device: str = "cuda") -> tuple:
    """(configs, dtypes, masks, peers) of a named grid; a config may be (Config, features: impls.Case fields)."""
    if name == "fp32-ladder":
        seen, cfgs = set(), []
        for c in configs.STANDARD + configs.seqlen_sweep() + [configs.Config("stress-1", 8, 16, 2048, 64)]:
            key = (c.batch, c.heads, c.seqlen, c.head_dim)
            if key not in seen:
                seen.add(key)
                cfgs.append(c)
        return cfgs, ["f32"], [False, True], ["efficient", "math"]
    if name == "targets":
        return configs.targets_grid(), ["bf16"], [False, True], ["flash", "cudnn"]
    if name == "models":
        return configs.models_grid(), ["bf16"], [True], ["flash", "cudnn"]
    if name == "features":
        small = dict(tokens=512, heads=2, head_dim=32, seqlens=(128, 256), dv_pair=(48, 32)) if quick else {}
        peers = ["cpu"] if device == "cpu" else ["flash", "cudnn", "efficient"]
        return configs.features_grid(**small), ["bf16"], [True], peers
    if name == "decode":
        peers = ["cpu"] if device == "cpu" else ["flash", "cudnn"]
        return decode.decode_grid(**(decode.QUICK_GRID if quick else {})), ["bf16"], [True], peers
    if name == "cpu":
        return (
            [configs.Config("cpu-2k", 1, 8, 2048, 64), configs.Config("cpu-4k", 1, 8, 4096, 128)],
            ["f32"],
            [False, True],
            ["cpu"],
        )
    raise SystemExit(f"unknown grid {name!r}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
        epilog="See the header of bench/compare.py for the method.",
    )
    p.add_argument(
        "--grid",
        choices=["fp32-ladder", "targets", "models", "cpu", "features", "decode"],
        default=None,
        help="a named grid (default: fp32-ladder; --config replaces it)",
    )
    p.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="B/H/S/D",
        help="custom configurations instead of a grid (repeatable; H may be HQ:HKV, S may be SQ:SK)",
    )
    p.add_argument(
        "--only",
        default=None,
        metavar="TEXT,...",
        help="only the grid's configurations whose name contains one of these (e.g. gpt2,falcon,phi3-mini-s32768)",
    )
    p.add_argument(
        "--backends", default=None, help="flashc backends, comma-separated (default: every usable backend of --device)"
    )
    p.add_argument(
        "--peers",
        default=None,
        help="PyTorch peers, comma-separated, from cpu,flash,efficient,cudnn,math, or none (default: the grid's)",
    )
    p.add_argument("--pass", dest="passes", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    p.add_argument("--dtype", default=None, help="f32, f16, bf16 (comma-separated; default: the grid's)")
    p.add_argument("--causal", choices=["full", "causal", "both"], default="both")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    p.add_argument("--csv", default=None, help="write the rows here (results schema of docs/targets.md)")
    p.add_argument("--append", action="store_true", help="append to --csv instead of replacing it")
    p.add_argument("--repeats", type=int, default=30, help="timed calls per row, at least 30 (median)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        help="GPU: run each implementation back to back for this many seconds before its timed calls (e.g. 1.5: "
        "the H100 reaches its power-capped clock after about a second; default 0, the short form docs/targets.md used)",
    )
    p.add_argument("--input-sets", type=int, default=None, help="input sets to rotate over (default: see header)")
    p.add_argument(
        "--order",
        choices=("flashc-first", "peers-first"),
        default="flashc-first",
        help="which implementations of a case run first (default flashc-first)",
    )
    p.add_argument("--no-flush", action="store_true", help="no L2 flush between timed GPU calls")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for host implementations (0: all)")
    p.add_argument("--no-check", action="store_true", help="time only; no errors against the reference")
    p.add_argument("--reference", choices=["auto", "cpu-ref", "torch-fp64", "numpy"], default="auto")
    p.add_argument("--max-ref-seqlen", type=int, default=None)
    p.add_argument("--ref-samples", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="features and decode grids at host sizes (see the header)")
    p.add_argument(
        "--max-cache-gib",
        type=float,
        default=None,
        help="decode: skip shapes whose K+V cache is larger (default 40 on a GPU, 1 on the host)",
    )
    args = p.parse_args(argv)
    if args.repeats < 30:
        p.error("--repeats must be at least 30 (the median of fewer is not a benchmark figure)")
    return args


def _input_sets(cfg, dtype: str, device: str, passes) -> int:
    if device != "cuda":
        return 1
    import torch

    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    e = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}[dtype]
    per_set = e * (4 * cfg.batch * cfg.seqlen * cfg.heads + 4 * cfg.batch * cfg.sk * cfg.hkv) * cfg.head_dim
    return max(3, min(16, math.ceil(2 * l2 / max(per_set, 1))))


def only(cfgs: list, texts: str) -> list:
    """The configurations of a grid whose name contains one of the comma-separated texts (a grid row may be
    (Config, features)); none left is an error, not an empty run."""
    wanted = [t.strip() for t in texts.split(",") if t.strip()]
    kept = [c for c in cfgs if any(t in (c[0] if isinstance(c, tuple) else c).name for t in wanted)]
    if not kept:
        raise SystemExit(f"--only {texts}: no configuration of the grid matches")
    return kept


def main(argv=None) -> int:
    args = parse_args(argv)
    torch = impls.torch_or_none()
    has_cuda = torch is not None and torch.cuda.is_available()
    device = args.device or ("cuda" if has_cuda else "cpu")
    if device == "cuda" and not has_cuda:
        raise SystemExit("--device cuda needs torch with a CUDA device")
    grid_name = args.grid or ("fp32-ladder" if device == "cuda" else "cpu")
    cfgs, dtypes, masks, peer_names = grid(grid_name, args.quick, device)
    if args.only:
        cfgs = only(cfgs, args.only)
    if args.config:
        cfgs = [configs.parse(c) for c in args.config]
    if args.dtype:
        dtypes = [d.strip() for d in args.dtype.split(",")]
    masks = {"full": [False], "causal": [True], "both": masks}[args.causal]
    if args.peers:
        peer_names = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",")]
    passes = [p.strip() for p in args.passes.split(",")]
    if not set(passes) <= {"fwd", "bwd"}:
        raise SystemExit(f"--pass {args.passes}: use fwd, bwd or fwd,bwd")

    names = (
        [n.strip() for n in args.backends.split(",")]
        if args.backends
        else [b.name for b in flashc.backends() if b.usable and b.device == device]
    )
    ref = args.reference
    if ref == "auto":
        ref = "torch-fp64" if device == "cuda" else "cpu-ref"
    max_ref = args.max_ref_seqlen if args.max_ref_seqlen is not None else (4096 if ref == "torch-fp64" else 512)
    chosen = impls.flashc_impls(device, names, max_ref if max_ref > 0 else 1024)
    peers = [impls.TorchSDPA(p) for p in peer_names]
    # The order within each case: the GPU's clocks drift over a sustained run, so the first implementation of a case
    # may read a few % apart from the same one timed later; peers-first checks that a ratio does not hang on it.
    all_impls = peers + chosen if args.order == "peers-first" else chosen + peers

    opts = engine.Options(
        seed=args.seed,
        warmup=args.warmup,
        warmup_s=args.warmup_s,
        repeats=args.repeats,
        check=not args.no_check,
        ref_engine=ref,
        max_ref_seqlen=max_ref if max_ref > 0 else None,
        ref_samples=args.ref_samples,
        device_label=impls.device_name(device),
        commit=engine.git_commit(str(pathlib.Path(__file__).resolve().parent)),
        baseline="best-peer",
        flush=None if args.no_flush else timing.l2_flush(device),
        budget_s=None,
    )
    print(
        f"flashc {flashc.__version__} ({flashc.library_path}) | {opts.device_label} | grid {grid_name} | "
        f"reference {ref if opts.check else 'none'} | {', '.join(i.name for i in all_impls)}"
    )
    print(report.header())
    if grid_name == "decode":
        return _decode(args, cfgs, dtypes, peer_names, names, device, opts)
    columns = FEATURE_COLUMNS if grid_name == "features" else COLUMNS
    rows = []
    for dtype in dtypes:
        for causal in masks:
            for item in cfgs:
                cfg, features = item if isinstance(item, tuple) else (item, {})
                opts.input_sets = args.input_sets or _input_sets(cfg, dtype, device, passes)
                case = impls.Case(cfg=cfg, dtype=dtype, causal=causal, threads=args.threads, **features)
                case_rows = engine.run_case(case, all_impls, passes, opts)
                for r in case_rows:
                    print(report.line(r))
                rows += case_rows
                if args.csv:  # after each case, so an interrupted run keeps what it measured
                    report.write_csv(case_rows, args.csv, columns, append=args.append or len(rows) > len(case_rows))
                if device == "cuda":
                    torch.cuda.empty_cache()
    print()
    print(report.summary(rows))
    if args.csv:
        print(f"wrote {len(rows)} rows to {args.csv}")
    return 1 if any(r.get("status") in ("FAIL", "error") for r in rows) else 0


def _decode(args, cfgs, dtypes, peer_names, names, device, opts) -> int:
    """--grid decode: decode.run per dtype, rows written as they come."""
    if args.config:
        raise SystemExit("--grid decode takes no --config (its shapes are decode configurations)")
    max_gib = args.max_cache_gib if args.max_cache_gib is not None else (40.0 if device == "cuda" else 1.0)
    rows = []

    def on_row(row):
        print(report.line(row))
        rows.append(row)
        if args.csv:
            report.write_csv([row], args.csv, DECODE_COLUMNS, append=args.append or len(rows) > 1)

    for dtype in dtypes:
        decode.run(cfgs, dtype, device, names, peer_names, opts, max_gib, args.ref_samples, args.threads, on_row)
    print()
    print(report.summary(rows))
    if args.csv:
        print(f"wrote {len(rows)} rows to {args.csv}")
    return 1 if any(r.get("status") in ("FAIL", "error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
