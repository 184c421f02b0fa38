#!/usr/bin/env python3
"""bench/cpu_vs_torch.py — flashc's `cpu` backend against PyTorch's CPU scaled_dot_product_attention, in one
process, on the same tensors and the same number of threads.

    python bench/cpu_vs_torch.py --threads 16 --csv /tmp/16.csv; python bench/cpu_vs_torch.py --threads 2 --csv /tmp/2.csv
    (bench/results/cpu.csv is the two tables, from the lent GPU machine's Xeon: scripts/cpu-check)
    python bench/cpu_vs_torch.py --threads 2 --head-dims 64 --seqlens 2048 --masks full --passes fwd

flashc comes from the installed package (`FLASHC_CUDA=OFF pip install ./python`) or from a checkout with
PYTHONPATH=python and FLASHC_LIBRARY=build/libflashc.so. Needs torch and numpy.

Method. Per case (batch, heads, seqlen, head_dim, mask) the inputs are random fp32 tensors in PyTorch's
[batch, heads, seqlen, head_dim] layout; flashc reads the same memory as a strided [batch, seqlen, heads,
head_dim] view (no copy). Threads: torch.set_num_threads(N) and flashc's threads=N. Each pass is first run once
per implementation and checked against an fp64 reference on --ref-heads (batch, head) slices (flashc's
outputs are NaN-poisoned before that call); then the two implementations are timed alternately, call by call,
so that both see the same machine, after a short sleep before each call (PyTorch's OpenMP threads spin for a
while after a parallel region and would otherwise take a core from whoever runs next). Reported: the median
of the repeats (--min-repeats … --max-repeats, as many as fit --budget-s per row). Backward rows time the
backward alone: flashc's backward given its own forward's o and lse; PyTorch's autograd.grad through SDPA
(whose CPU kernel also saves and reuses the forward's logsumexp).

Output: a table on stdout and, with --csv, rows in the results schema of docs/targets.md
(date,device,commit,impl,dtype,batch,heads_q,heads_kv,seqlen_q,seqlen_k,head_dim,causal,pass,world,threads,ms,
tflops,gbps,max_abs_err,rel_l2_err) followed by speedup (PyTorch's ms over this row's: > 1 is faster than
PyTorch), repeats, torch_kernel and note. TFLOP/s count 4·b·h·s²·d for the forward (halved for causal) and 2.5×
that for the backward.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time


try:
    import flashc
except ImportError:  # a checkout without `pip install ./python`: FLASHC_LIBRARY names the library
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import flashc

import torch
import torch.nn.functional as F

from flashc.testing.engine import SCHEMA  # the results schema of docs/targets.md, in one place

COLUMNS = SCHEMA + ["speedup", "repeats", "torch_kernel", "note"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    words = lambda s: s.split(",")  # noqa: E731
    p.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dims", type=ints, default=[64, 128], help="comma list (default 64,128)")
    p.add_argument(
        "--seqlens",
        type=ints,
        default=[1024, 2048, 4096, 8192],
        help="comma list (default 1k…8k)",
    )
    p.add_argument("--masks", type=words, default=["full", "causal"], help="full,causal")
    p.add_argument("--passes", type=words, default=["fwd", "bwd"], help="fwd,bwd")
    p.add_argument("--min-repeats", type=int, default=3)
    p.add_argument("--max-repeats", type=int, default=15)
    p.add_argument(
        "--budget-s",
        type=float,
        default=40.0,
        help="timing budget per row pair (default 40 s)",
    )
    p.add_argument(
        "--pause-ms",
        type=float,
        default=20.0,
        help="sleep before each timed call (default 20)",
    )
    p.add_argument(
        "--ref-heads",
        type=int,
        default=1,
        help="(batch, head) slices checked in fp64 (0: none)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device-label",
        default="",
        help="the device column (default: the CPU's model name)",
    )
    p.add_argument("--csv", help="write the rows here (the results schema of docs/targets.md)")
    return p.parse_args(argv)


# ---- the machine and the checkout ------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    if os.environ.get("FLASHC_COMMIT"):
        return os.environ["FLASHC_COMMIT"]
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"],
            capture_output=True,
            text=True,
        )
        if head.returncode != 0:
            return ""
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return ""


# ---- the fp64 reference of one (batch, head) slice -------------------------------------------------------
def reference(q, k, v, dout, causal, scale, chunk=1024):
    """o, dq, dk, dv of one head in float64 (q, k, v, dout: [s, d]), chunked over query rows so that no s×s
    matrix is held: P_c = softmax(scale·q_c kᵀ), dV += P_cᵀ dO_c, dS = P_c∘(dO_c vᵀ − rowsum(dO_c∘o_c)),
    dQ_c = scale·dS k, dK += scale·dSᵀ q_c."""
    q, k, v, dout = (x.double() for x in (q, k, v, dout))
    s = q.shape[0]
    o, dq = torch.empty_like(q), torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    keys = torch.arange(k.shape[0])
    for i0 in range(0, s, chunk):
        rows = torch.arange(i0, min(s, i0 + chunk))
        S = scale * (q[rows] @ k.T)
        if causal:
            S.masked_fill_(keys[None, :] > rows[:, None], float("-inf"))
        P = torch.softmax(S, dim=-1)
        o[rows] = P @ v
        dv += P.T @ dout[rows]
        dP = dout[rows] @ v.T
        dS = P * (dP - (dout[rows] * o[rows]).sum(-1, keepdim=True))
        dq[rows] = scale * (dS @ k)
        dk += scale * (dS.T @ q[rows])
    return o, dq, dk, dv


def errors(got, want):
    """max_abs_err and rel_l2_err over a list of arrays taken as one vector."""
    g = torch.cat([x.double().reshape(-1) for x in got])
    w = torch.cat([x.double().reshape(-1) for x in want])
    if not torch.isfinite(g).all():
        return float("nan"), float("nan")
    return float((g - w).abs().max()), float((g - w).norm() / w.norm())


# ---- one case ----------------------------------------------------------------------------------------------
def timed(fn, pause_s):
    time.sleep(pause_s)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def run_case(args, b, h, s, d, causal, writer, table):
    g = torch.Generator().manual_seed(args.seed + s * 1000 + d * 10 + causal)
    # PyTorch's layout [b, h, s, d]; flashc sees the same memory as [b, s, h, d] through strides.
    q, k, v, dout = (torch.randn(b, h, s, d, generator=g) for _ in range(4))
    scale = 1.0 / d**0.5
    full_flop = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    elem = 4
    nbytes = {
        "fwd": elem * 4 * b * s * h * d + 4 * b * h * s,
        "bwd": elem * 8 * b * s * h * d + 4 * b * h * s,
    }
    flop = {"fwd": full_flop, "bwd": 2.5 * full_flop}
    bshd = lambda x: x.transpose(1, 2)  # noqa: E731

    # flashc: prepared calls (conversion of arguments done once), outputs in PyTorch's layout as well.
    o_f = torch.full((b, h, s, d), float("nan"))
    lse_f = torch.full((b, h, s), float("nan"))
    fwd_f = flashc.prepare_forward(
        bshd(q),
        bshd(k),
        bshd(v),
        causal=causal,
        backend="cpu",
        threads=args.threads,
        out=bshd(o_f),
        lse=lse_f,
    )
    grads_f = [torch.full((b, h, s, d), float("nan")) for _ in range(3)]
    bwd_f = flashc.prepare_backward(
        bshd(dout),
        bshd(q),
        bshd(k),
        bshd(v),
        bshd(o_f),
        lse_f,
        causal=causal,
        backend="cpu",
        threads=args.threads,
        dq=bshd(grads_f[0]),
        dk=bshd(grads_f[1]),
        dv=bshd(grads_f[2]),
    )

    # PyTorch: SDPA with autograd, is_causal (top-left, the same diagonal as flashc's when sq = sk).
    qt, kt, vt = (x.clone().requires_grad_(True) for x in (q, k, v))

    def torch_fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    o_t = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    torch_kernel = type(o_t.grad_fn).__name__ if o_t.grad_fn is not None else ""

    def torch_bwd():
        return torch.autograd.grad(o_t, (qt, kt, vt), dout, retain_graph=True)

    fwd_f()  # flashc's o, lse for its backward (and the checked forward outputs)
    runs = {"fwd": (fwd_f, torch_fwd), "bwd": (bwd_f, torch_bwd)}

    ref = None
    if args.ref_heads > 0:
        ref = [(bi, hi) for bi in range(b) for hi in range(h)][: args.ref_heads]
        ref = {bh: reference(q[bh], k[bh], v[bh], dout[bh], causal, scale) for bh in ref}

    for pass_ in args.passes:
        f_call, t_call = runs[pass_]
        for x in grads_f if pass_ == "bwd" else (o_f,):
            x.fill_(float("nan"))
        f_call()
        t_out = t_call()
        err = {"flashc": ("", ""), "torch": ("", "")}
        if ref is not None:
            for name, outs in (
                ("flashc", [o_f] if pass_ == "fwd" else grads_f),
                ("torch", [t_out] if pass_ == "fwd" else list(t_out)),
            ):
                got, want = [], []
                for bh, r in ref.items():
                    got += [x[bh] for x in outs]
                    want += [r[0]] if pass_ == "fwd" else list(r[1:])
                err[name] = errors(got, want)

        # Timing: alternate the two, one call each, until the budget or max repeats is reached.
        times = {"flashc": [], "torch": []}
        start = time.perf_counter()
        while True:
            times["flashc"].append(timed(f_call, args.pause_ms / 1e3))
            times["torch"].append(timed(t_call, args.pause_ms / 1e3))
            n = len(times["flashc"])
            spent = time.perf_counter() - start
            if n >= args.max_repeats or (n >= args.min_repeats and spent * (n + 1) / n > args.budget_s):
                break
        ms = {name: statistics.median(t) for name, t in times.items()}

        for name, impl in (("flashc", "flashc:cpu"), ("torch", "torch:cpu")):
            row = dict(
                date=datetime.date.today().isoformat(),
                device=args.device_label or cpu_model(),
                commit=args.commit,
                impl=impl,
                dtype="f32",
                batch=b,
                heads_q=h,
                heads_kv=h,
                seqlen_q=s,
                seqlen_k=s,
                head_dim=d,
                causal=int(causal),
                world=1,
                threads=args.threads,
                ms=round(ms[name], 4),
                tflops=round(flop[pass_] / (ms[name] * 1e-3) / 1e12, 6),
                gbps=round(nbytes[pass_] / (ms[name] * 1e-3) / 1e9, 4),
                max_abs_err=err[name][0] if err[name][0] == "" else f"{err[name][0]:.3e}",
                rel_l2_err=err[name][1] if err[name][1] == "" else f"{err[name][1]:.3e}",
                speedup=round(ms["torch"] / ms[name], 4),
                repeats=len(times[name]),
                torch_kernel=torch_kernel if name == "torch" else "",
                note=("FLASHC_CPU_KERNELS=" + os.environ["FLASHC_CPU_KERNELS"])
                if name == "flashc" and os.environ.get("FLASHC_CPU_KERNELS")
                else "",
                **{"pass": pass_},
            )
            if writer:
                writer.writerow(row)
        table.append((d, s, "causal" if causal else "full", pass_, ms, flop[pass_], err))
        line = (
            f"d{d:<4d} s{s:<5d} {'causal' if causal else 'full':6s} {pass_}  "
            f"flashc {ms['flashc']:9.1f} ms {flop[pass_] / ms['flashc'] * 1e-6:6.1f} GFLOP/s   "
            f"torch {ms['torch']:9.1f} ms {flop[pass_] / ms['torch'] * 1e-6:6.1f} GFLOP/s   "
            f"ratio {ms['torch'] / ms['flashc']:5.2f}x   (n={len(times['flashc'])}"
        )
        if ref is not None:
            line += f", max err flashc {err['flashc'][0]:.1e} torch {err['torch'][0]:.1e}"
        print(line + ")", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.commit = git_commit()
    torch.set_num_threads(args.threads)
    print(
        f"flashc {flashc.__version__} ({flashc.library_path}), torch {torch.__version__}, {cpu_model()}, "
        f"{args.threads} threads each",
        flush=True,
    )
    out = open(args.csv, "w", newline="") if args.csv else None  # noqa: SIM115
    writer = csv.DictWriter(out, fieldnames=COLUMNS) if out else None
    if writer:
        writer.writeheader()
    table = []
    try:
        for d in args.head_dims:
            for s in args.seqlens:
                for mask in args.masks:
                    run_case(
                        args,
                        args.batch,
                        args.heads,
                        s,
                        d,
                        mask == "causal",
                        writer,
                        table,
                    )
                    if out:
                        out.flush()
    finally:
        if out:
            out.close()
    worst = min(ms["torch"] / ms["flashc"] for (*_, ms, _f, _e) in table) if table else float("nan")
    print(f"lowest ratio (torch ms / flashc ms): {worst:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
