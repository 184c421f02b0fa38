"""One case (a shape, a dtype, a mask) through every implementation: check against the fp64 reference, then
time. Used by `python -m flashc.testing` and bench/compare.py; both write the rows this returns.

Order per implementation and pass: prepare (all conversion and allocation), poison the outputs, run once,
compare with the reference, then time (warm-up, repeats rotating over the input sets). A backend that
refuses the case (unsupported) gives a row marked skipped with its reason, never an exception.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import warnings

import numpy as np

from . import metrics
from .impls import Case, Inputs
from .reference import Reference
from .timing import time_calls

# The results schema of docs/targets.md, then the framework's own columns.
SCHEMA = [
    "date",
    "device",
    "commit",
    "impl",
    "dtype",
    "batch",
    "heads_q",
    "heads_kv",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "causal",
    "pass",
    "world",
    "threads",
    "ms",
    "tflops",
    "gbps",
    "max_abs_err",
    "rel_l2_err",
]
EXTRA = [
    "config",
    "status",
    "speedup",
    "mean_abs_err",
    "mse",
    "max_rel_err",
    "lse_max_abs_err",
    "repeats",
    "reference",
    "note",
]
COLUMNS = SCHEMA + EXTRA


@dataclasses.dataclass
class Options:
    seed: int = 0
    warmup: int = 3
    warmup_s: float = 0.0  # GPU rows: seconds of back-to-back calls before timing (timing.time_calls)
    repeats: int = 30
    budget_s: float | None = None  # per host row (GPU rows always run every repeat), see timing.time_calls
    min_repeats: int = 3
    input_sets: int = 1
    tolerance: float | None = None  # None: metrics.DEFAULT_TOLERANCE[dtype]
    ref_engine: str = "cpu-ref"
    max_ref_seqlen: int | None = None  # above it, the reference runs on `ref_samples` slices
    ref_samples: int = 2
    check: bool = True  # False: time only (errors left empty)
    device_label: str = ""
    commit: str = ""
    baseline: str | None = None  # impl the speed-up is relative to (see add_speedups)
    flush: object = None  # GPU: () -> None run before each timed call, outside the events (an L2 flush)


def git_commit(path: str | None = None) -> str:
    """The short commit of the repository at `path` (or the working directory), FLASHC_COMMIT if set."""
    if os.environ.get("FLASHC_COMMIT"):
        return os.environ["FLASHC_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", path or os.getcwd(), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _base_row(case: Case, impl, pass_: str, opts: Options) -> dict:
    cfg = case.cfg
    return dict(
        date=datetime.date.today().isoformat(),
        device=opts.device_label,
        commit=opts.commit,
        impl=impl.name,
        dtype=case.dtype,
        batch=cfg.batch,
        heads_q=cfg.heads,
        heads_kv=cfg.hkv,
        seqlen_q=cfg.seqlen,
        seqlen_k=cfg.sk,
        head_dim=cfg.head_dim,
        causal=int(bool(case.causal)),
        world=1,
        threads=(case.threads or os.cpu_count() or 1) if impl.device == "cpu" else 0,
        config=cfg.name,
        # Columns of the features grid (bench/compare.py --grid features); other files leave them out.
        head_dim_v=cfg.dv,
        softcap=case.softcap,
        alibi=int(bool(case.alibi)),
        dropout=case.dropout,
        **{"pass": pass_},
    )


def _compare(ref: Reference, pass_: str, outs) -> dict:
    """Error metrics of an implementation's outputs (float64 numpy) against the reference's slices."""
    if pass_ == "fwd":
        o = outs[0]
        lse = outs[1] if len(outs) > 1 else None
        got_o, got_lse = ref.pick_forward(o, lse)
        want = ref.forward()
        err = metrics.errors(got_o, [w[0] for w in want])
        if got_lse is not None:
            err["lse_max_abs"] = max(metrics.lse_max_abs(g, w[1]) for g, w in zip(got_lse, want))
        return err
    got = ref.pick_backward(*outs)
    want = ref.backward()
    return metrics.errors([x for g in got for x in g], [x for w in want for x in w])


def run_case(case: Case, impls: list, passes: list, opts: Options, on_row=None) -> list:
    """Rows for every (pass, implementation) of one case. `on_row(row)` is called as each row is done."""
    cfg = case.cfg
    inputs = [Inputs(case, opts.seed + i) for i in range(max(1, opts.input_sets))]
    samples = (
        opts.ref_samples if opts.max_ref_seqlen is not None and max(cfg.seqlen, cfg.sk) > opts.max_ref_seqlen else None
    )
    q, k, v, dout = inputs[0].numpy()
    ref = Reference(
        q,
        k,
        v,
        dout,
        case.causal,
        case.window,
        case.scale,
        case.align,
        samples=samples,
        engine=opts.ref_engine,
        seed=opts.seed,
        softcap=case.softcap,
        alibi_slopes=case.alibi_slopes,
        dropout_p=case.dropout,
        dropout_seed=case.dropout_seed,
        attn_mask=case.attn_mask(),
    )
    tol = opts.tolerance if opts.tolerance is not None else metrics.DEFAULT_TOLERANCE[case.dtype]
    rows = []
    for pass_ in passes:
        flop = metrics.flops(cfg, case.causal, pass_, case.window)
        nbytes = metrics.bytes_moved(cfg, case.dtype, pass_)
        for impl in impls:
            row = _base_row(case, impl, pass_, opts)
            reason = impl.skip(case, pass_)
            if reason is None:
                try:
                    row.update(_measure(impl, inputs, case, pass_, ref, opts, tol, flop, nbytes))
                except NotImplementedError as e:  # the backend's own refusal: a skip, not a failure
                    reason = str(e) if str(e).startswith("unsupported") else f"unsupported: {e}"
                except Exception as e:  # noqa: BLE001 — any other failure is reported in the row
                    if is_peer(impl):  # a PyTorch backend that does not run this shape
                        reason = f"{type(e).__name__}: {_first_line(e)}"
                    else:
                        row.update(status="error", note=f"{type(e).__name__}: {e}")
            if reason is not None:
                row.update(status="skipped", note=reason)
            rows.append(row)
            if on_row:
                on_row(row)
    add_speedups(rows, opts.baseline)
    return rows


def is_peer(impl) -> bool:
    return not impl.name.startswith("flashc:")


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


def _measure(impl, inputs, case, pass_, ref, opts, tol, flop, nbytes) -> dict:
    if is_peer(impl):  # PyTorch warns as it declines a backend; the row says it instead
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _measure_one(impl, inputs, case, pass_, ref, opts, tol, flop, nbytes)
    return _measure_one(impl, inputs, case, pass_, ref, opts, tol, flop, nbytes)


def _measure_one(impl, inputs, case, pass_, ref, opts, tol, flop, nbytes) -> dict:
    runner = impl.prepare(inputs, case, pass_)
    out = {}
    with runner.context():
        if opts.check:
            if runner.poison:
                runner.poison()
            runner.calls[0]()
            err = _compare(ref, pass_, runner.outputs())
            ok = metrics.passes(err, tol)
            is_flashc = not is_peer(impl)
            out.update(
                max_abs_err=err["max_abs"],
                rel_l2_err=err["rel_l2"],
                mean_abs_err=err["mean_abs"],
                mse=err["mse"],
                max_rel_err=err["max_rel"],
                lse_max_abs_err=err.get("lse_max_abs", ""),
                reference=ref.describe(),
            )
            # Peers are listed for comparison; only flashc's own backends can fail the run.
            out["status"] = ("pass" if ok else "FAIL") if is_flashc else "peer"
            if not ok:
                out["note"] = f"max_abs_err {err['max_abs']:.3g} > tolerance {tol:g}·max(1, max|ref|)"
        else:
            out["status"] = "peer" if is_peer(impl) else "timed"
        on_gpu = impl.device == "cuda"
        t = time_calls(
            runner.calls,
            impl.device,
            opts.warmup,
            opts.repeats,
            None if on_gpu else opts.budget_s,
            opts.min_repeats,
            between=opts.flush if on_gpu else None,
            warmup_s=opts.warmup_s if on_gpu else 0.0,
        )
    ms = t["ms"]
    out.update(
        ms=ms,
        repeats=t["repeats"],
        tflops=flop / (ms * 1e-3) / 1e12 if ms > 0 else float("nan"),
        gbps=nbytes / (ms * 1e-3) / 1e9 if ms > 0 else float("nan"),
    )
    return out


def add_speedups(rows: list, baseline: str | None = None) -> None:
    """speedup = baseline ms / row ms within one (config, dtype, causal, pass). The baseline is `baseline`
    when it has a time there, else torch:cpu, else the first timed row (as the CUDA-core FA2 project
    measured against PyTorch on the CPU); baseline "best-peer" is the fastest PyTorch row of the group."""
    groups = {}
    for r in rows:
        key = (r["config"], r["dtype"], r["causal"], r["pass"], r["batch"], r["heads_q"], r["seqlen_q"], r["head_dim"])
        groups.setdefault(key, []).append(r)
    for group in groups.values():
        timed = [r for r in group if isinstance(r.get("ms"), float) and np.isfinite(r["ms"])]
        if not timed:
            continue
        if baseline == "best-peer":
            peers = [r for r in timed if not r["impl"].startswith("flashc:")]
            if not peers:
                continue
            base = min(peers, key=lambda r: r["ms"])
        else:
            base = next((r for name in (baseline, "torch:cpu") for r in timed if name and r["impl"] == name), timed[0])
        for r in timed:
            r["speedup"] = base["ms"] / r["ms"] if r["ms"] > 0 else float("nan")
            r["baseline"] = base["impl"]
