"""Issue #6 item 4: seqlen 2^20 forward and backward on one 80 GB GPU, checked exactly on sampled rows.

    python3 tools/mma/million.py --lib build-gpu/libflashc.so [--masks full,causal] [--csv million.csv]
    python3 tools/mma/million.py --lib build-cpu/libflashc.so --device cpu --backend cpu --seqlen 2048 --heads 2

Per mask: fresh random q, k, v, dO [b, s, h, d]; O, lse, dQ, dK, dV poisoned with NaN and written in place by
one flashc forward and one backward (each timed once). Memory: torch's peak and the device-wide used memory
(flashc's workspace is cudaMalloc'd outside torch's allocator) beyond the caller's tensors, per (b·h·s) row.
Check (numpy, float64, exact): on --rows query rows spread over the sequence (first and last included) O, lse
and dQ from q, k, v, dO alone; on --cols key rows dK and dV, which need every query row's P = exp(S - lse) and
D = rowsum(dO∘O): those use the kernel's lse (checked on the sampled rows first) and the kernel's O. Every
output must also be finite everywhere (the NaN poison overwritten). Exits 1 on any failure.
"""

import argparse
import csv
import datetime
import math
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
CHUNK = 65536  # query rows per step of the dK/dV reference, and per slice of the finiteness check
# P and dS are rounded to 16 bits before their matmuls and the outputs are stored in 16 bits (unit roundoff
# 2^-8 for bf16), so a row is off by ~2e-3 relative: these bounds leave a 5-10x margin.
TOL_ROW_REL = {"o": 1e-2, "dq": 2e-2, "dk": 2e-2, "dv": 2e-2}  # worst row's ||err|| / ||ref||
TOL_O_ABS = 2e-2
TOL_LSE = 1e-3  # |lse - ref| <= TOL_LSE·max(1, |ref|)
# Linear in s is a few vectors per (b·h·s) row (cuda-mma's backward: an fp32 dQ accumulator, 4·d bytes, and
# two fp32 row statistics); materialised fp32 scores would be 4·s bytes per row, 4 MiB at s = 2^20.
MAX_EXTRA_BYTES_PER_ROW_PER_D = 16
TABLE = (  # the summary: title, format of the run_mask row's fields
    ("mask", "{mask:<6}"), ("fwd ms", "{fwd_ms:9.1f}"), ("bwd ms", "{bwd_ms:9.1f}"), ("fwd TF/s", "{fwd_tflops:8.1f}"),
    ("bwd TF/s", "{bwd_tflops:8.1f}"), ("used GiB", "{used_gib:8.2f}"), ("extra GiB", "{extra_gib:9.3f}"),
    ("B/row", "{extra_per_row:6.0f}"), ("O rel", "{o_rel:.2e}"), ("lse err", "{lse_abs:.2e}"),
    ("dQ rel", "{dq_rel:.2e}"), ("dK rel", "{dk_rel:.2e}"), ("dV rel", "{dv_rel:.2e}"), ("", "{verdict}"),
)  # fmt: skip


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default="", help="libflashc.so to load (sets FLASHC_LIBRARY)")
    ap.add_argument("--seqlen", type=int, default=1 << 20)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--masks", default="full,causal", help="comma-separated: full, causal")
    ap.add_argument("--backend", default="cuda-mma")
    ap.add_argument("--deterministic", action="store_true", help="flashc's deterministic backward")
    ap.add_argument("--rows", type=int, default=64, help="query rows checked (O, lse, dQ)")
    ap.add_argument("--cols", type=int, default=16, help="key rows checked (dK, dV)")
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu with a CPU backend")
    ap.add_argument("--csv", default="", help="append rows with docs/targets.md's columns (+ memory) here")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for mask in args.masks.split(","):
        if mask not in ("full", "causal"):
            ap.error(f"--masks: {mask!r} is neither full nor causal")
    return args


def load_flashc(lib):
    """flashc reads FLASHC_LIBRARY when it is imported, so the path is set before the import."""
    if lib:
        os.environ["FLASHC_LIBRARY"] = str(pathlib.Path(lib).resolve())
    if (ROOT / "python" / "flashc").is_dir():
        sys.path.insert(0, str(ROOT / "python"))
    import flashc

    return flashc


def spread(n, count):
    """count indices evenly over [0, n), the first and the last included."""
    return np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(np.int64))


def make_tensors(shape, dev, dtype):
    """q, k, v, dO random (scores ~ N(0, 1): softmax neither uniform nor one-hot); O, lse, dQ, dK, dV NaN, so
    that an element the kernels never wrote shows."""
    b, s, h, _ = shape
    t = {n: torch.randn(shape, device=dev, dtype=dtype) for n in ("q", "k", "v", "do")}
    t |= {n: torch.full(shape, math.nan, device=dev, dtype=dtype) for n in ("o", "dq", "dk", "dv")}
    t["lse"] = torch.full((b, h, s), math.nan, device=dev, dtype=torch.float32)
    return t


def device_used(dev):
    """Bytes in use on the whole device (CUDA context, torch's cache, flashc's own cudaMalloc)."""
    if dev.type != "cuda":
        return 0
    free, total = torch.cuda.mem_get_info(dev)
    return total - free


def run_once(flashc, t, causal, scale, args, dev):
    """One forward, one backward, in place into t; returns (fwd s, bwd s, most device memory used after one)."""
    opts = dict(causal=causal, scale=scale, backend=args.backend, deterministic=args.deterministic)
    fwd = flashc.prepare_forward(t["q"], t["k"], t["v"], out=t["o"], lse=t["lse"], **opts)
    grads = dict(dq=t["dq"], dk=t["dk"], dv=t["dv"])
    bwd = flashc.prepare_backward(t["do"], t["q"], t["k"], t["v"], t["o"], t["lse"], **grads, **opts)
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda _: None
    times, used = [], []
    for call in (fwd, bwd):  # the backward reads the forward's O and lse: in order
        sync(dev)
        start = time.perf_counter()
        call()
        sync(dev)
        times.append(time.perf_counter() - start)
        used.append(device_used(dev))  # the handle keeps its workspace after the call: sampling sees it
    return times[0], times[1], max(used)


# ---- the fp64 reference on the sampled rows -----------------------------------------------------------------
def head_f64(x, bi, h):
    """x[bi, :, h] as float64 numpy [s, d], one head at a time: 1 GiB per tensor on the host at s = 2^20.
    Converted where x lives (a GPU converts 2^27 elements at once; a host thread takes ~1 s)."""
    return x[bi, :, h].double().contiguous().cpu().numpy()


def reference_rows(qr, K, V, dOr, rows, causal, scale):
    """Exact o, lse, dq of the sampled query rows of one head from its whole K, V, and dq's error floor.
    S = scale·q_i·Kᵀ (causal: keys j <= i), P = softmax(S), o_i = P·V, lse_i = log Σ_j exp(S_ij);
    dP = dO_i·Vᵀ, D_i = dO_i·o_i (this exact o_i), dS = P∘(dP − D_i), dq_i = scale·dS·K.
    dP − D_i cancels: a row that sees one key (causal row 0) has P = 1, dP = D and dq exactly 0, where a
    kernel's fp32 rounding is not. Its error is measured against 1e-5 of the terms' size before cancelling,
    scale·|dO_i|·Σ_j P_ij |v_j| |k_j| (~100x fp32 rounding; below a row of 2^20 keys' |dq_i|)."""
    o, dq, lse = np.empty_like(qr), np.empty_like(qr), np.empty(len(rows))
    floor = 1e-5 * scale * np.linalg.norm(dOr, axis=1)
    vk = np.sqrt(np.einsum("jd,jd->j", V, V) * np.einsum("jd,jd->j", K, K))
    for a in range(0, len(rows), 16):  # 16 rows x 2^20 keys x 8 B: 128 MiB per temporary
        r = slice(a, a + 16)
        n = int(rows[r].max()) + 1 if causal else K.shape[0]  # causal: no row of the group sees key n or later
        Kn, Vn = K[:n], V[:n]
        S = (qr[r] @ Kn.T) * scale
        if causal:
            S[np.arange(n)[None, :] > rows[r, None]] = -np.inf
        m = S.max(axis=1, keepdims=True)
        S -= m
        P = np.exp(S, out=S)
        sum_p = P.sum(axis=1, keepdims=True)
        P /= sum_p
        lse[r] = (m + np.log(sum_p))[:, 0]
        o[r] = P @ Vn
        dS = dOr[r] @ Vn.T
        dS -= np.sum(dOr[r] * o[r], axis=1, keepdims=True)
        dS *= P
        dq[r] = scale * (dS @ Kn)
        floor[r] *= P @ vk[:n]
    return o, lse, dq, floor


def reference_cols(Q, dO, D, lse, Kc, Vc, cols, causal, scale):
    """Exact dk, dv of the sampled key rows of one head. Every query row contributes, through
    P_ij = exp(S_ij − lse_i) with the kernel's lse and D_i = dO_i·O_i with the kernel's O (recomputing O for
    every row would be the whole forward in fp64): dv_j = Σ_i P_ij dO_i, dk_j = scale·Σ_i P_ij (dO_i·v_j − D_i) q_i."""
    dk, dv = np.zeros_like(Kc), np.zeros_like(Vc)
    for a in range(0, Q.shape[0], CHUNK):
        r = slice(a, a + CHUNK)
        S = (Q[r] @ Kc.T) * scale
        if causal:
            S[cols[None, :] > np.arange(a, a + S.shape[0])[:, None]] = -np.inf
        P = np.exp(S - lse[r, None])
        dv += P.T @ dO[r]
        dS = P * (dO[r] @ Vc.T - D[r, None])
        dk += scale * (dS.T @ Q[r])
    return dk, dv


def row_errors(got, ref, floor=0.0):
    """max |got − ref| and the worst row's ||got − ref|| / max(||ref||, floor): each row on its own, so that a
    row of small norm (causal: the last keys' dk, dv are ~1e-6 of the first's) cannot hide behind a large one.
    NaN in got gives NaN, which fails every bound."""
    err = got - ref
    rel = np.linalg.norm(err, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), np.maximum(floor, 1e-300))
    return float(np.abs(err).max()), float(rel.max())


def check(t, rows, cols, causal, scale, dev):
    """Errors of the kernels' outputs on the sampled rows, worst over every (batch, head): {name: (abs, rel)}."""
    rows_t, cols_t = torch.as_tensor(rows, device=dev), torch.as_tensor(cols, device=dev)

    def pick(name, idx):  # the sampled rows of every head: small enough to copy whole
        return t[name][:, idx].double().cpu().numpy()

    got = {n: pick(n, rows_t) for n in ("o", "dq")} | {n: pick(n, cols_t) for n in ("dk", "dv")}
    got["lse"] = t["lse"][:, :, rows_t].double().cpu().numpy()
    qr, dor = pick("q", rows_t), pick("do", rows_t)
    worst = {n: (0.0, 0.0) for n in ("o", "lse", "dq", "dk", "dv")}
    b, _, heads, _ = t["q"].shape
    for bi in range(b):
        for h in range(heads):
            start = time.perf_counter()
            K, V = head_f64(t["k"], bi, h), head_f64(t["v"], bi, h)
            o, lse, dq, dq_floor = reference_rows(qr[bi, :, h], K, V, dor[bi, :, h], rows, causal, scale)
            errs = {"o": row_errors(got["o"][bi, :, h], o), "dq": row_errors(got["dq"][bi, :, h], dq, dq_floor)}
            lse_err = float((np.abs(got["lse"][bi, h] - lse) / np.maximum(1.0, np.abs(lse))).max())
            errs["lse"] = (lse_err, lse_err)
            Kc, Vc = K[cols], V[cols]
            del K, V  # the host holds 2 heads' worth at most
            Q, dO = head_f64(t["q"], bi, h), head_f64(t["do"], bi, h)
            D = np.einsum("id,id->i", head_f64(t["o"], bi, h), dO)
            lse_all = t["lse"][bi, h].double().cpu().numpy()
            dk, dv = reference_cols(Q, dO, D, lse_all, Kc, Vc, cols, causal, scale)
            errs["dk"], errs["dv"] = row_errors(got["dk"][bi, :, h], dk), row_errors(got["dv"][bi, :, h], dv)
            for n, e in errs.items():  # max() would drop a NaN: keep it, so that it fails
                worst[n] = tuple(new if not new <= old else old for new, old in zip(e, worst[n]))
            print(f"  check b{bi} h{h}: {time.perf_counter() - start:.1f} s", flush=True)
    return worst


# ---- one mask: run, measure, check ---------------------------------------------------------------------------
def all_finite(x):
    """Every element written (the NaN poison gone) and finite; in slices of the sequence to bound the temporary."""
    return all(bool(torch.isfinite(c).all()) for c in torch.split(x, CHUNK, dim=x.dim() - 2))


def verdicts(worst, finite, extra_per_row, head_dim):
    """PASS/FAIL lines, each bound with its measured value."""
    lines = []

    def bound(what, value, tol):
        lines.append(f"{'PASS' if value <= tol else 'FAIL'} {what}: {value:.3e} (bound {tol:.1e})")  # NaN: FAIL

    bound("O max abs err", worst["o"][0], TOL_O_ABS)
    bound("lse max |err|/max(1,|lse|)", worst["lse"][0], TOL_LSE)
    for n, tol in TOL_ROW_REL.items():
        bound(f"{n} worst row rel L2 err", worst[n][1], tol)
    for n, ok in finite.items():
        lines.append(f"{'PASS' if ok else 'FAIL'} {n} finite everywhere (the NaN poison overwritten)")
    if not math.isnan(extra_per_row):
        bound("extra device bytes per (b·h·s) row", extra_per_row, MAX_EXTRA_BYTES_PER_ROW_PER_D * head_dim)
    return lines


def run_mask(flashc, mask, args, dev, dtype, baseline):
    """Allocate, run, measure and check one mask; returns its summary row."""
    causal = mask == "causal"
    torch.manual_seed(args.seed + causal)
    scale = float(np.float32(1 / math.sqrt(args.head_dim)))  # the fp32 value the kernels use
    t = make_tensors((args.batch, args.seqlen, args.heads, args.head_dim), dev, dtype)
    caller = sum(x.numel() * x.element_size() for x in t.values())
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    fwd_s, bwd_s, used = run_once(flashc, t, causal, scale, args, dev)
    bhs = args.batch * args.heads * args.seqlen
    flops = 4 * bhs * args.seqlen * args.head_dim * (0.5 if causal else 1.0)
    row = dict(mask=mask, fwd_ms=fwd_s * 1e3, bwd_ms=bwd_s * 1e3, fwd_tflops=flops / fwd_s / 1e12)
    row.update(bwd_tflops=2.5 * flops / bwd_s / 1e12, used_gib=math.nan, extra_gib=math.nan, extra_per_row=math.nan)
    if dev.type == "cuda":
        torch_extra = torch.cuda.max_memory_allocated(dev) - caller  # ~0: flashc allocates nothing through torch
        extra = used - baseline - caller
        row.update(used_gib=used / 2**30, extra_gib=extra / 2**30, extra_per_row=extra / bhs)
        print(f"{mask}: caller's tensors {caller / 2**30:.2f} GiB, torch peak {torch_extra / 2**20:+.1f} MiB beyond "
              f"them; device used {used / 2**30:.2f} GiB = {baseline / 2**30:.2f} before + caller's + "
              f"{extra / 2**30:.3f} GiB extra = {extra / bhs:.1f} bytes per (b·h·s) row (fp32 scores: "
              f"{4 * args.seqlen})")  # fmt: skip
    print(f"{mask}: forward {fwd_s * 1e3:.1f} ms ({row['fwd_tflops']:.1f} TFLOP/s), "
          f"backward {bwd_s * 1e3:.1f} ms ({row['bwd_tflops']:.1f} TFLOP/s)", flush=True)  # fmt: skip
    finite = {n: all_finite(t[n]) for n in ("o", "lse", "dq", "dk", "dv")}
    start = time.perf_counter()
    worst = check(t, spread(args.seqlen, args.rows), spread(args.seqlen, args.cols), causal, scale, dev)
    print(f"{mask}: reference took {time.perf_counter() - start:.1f} s (dK, dV: P and D from the kernel's lse, O)")
    lines = verdicts(worst, finite, row["extra_per_row"], args.head_dim)
    print("\n".join(f"  {mask}: {line}" for line in lines))
    row.update({f"{n}_{kind}": e for n, pair in worst.items() for kind, e in zip(("abs", "rel"), pair)})
    row["verdict"] = "FAIL" if any(line.startswith("FAIL") for line in lines) else "PASS"
    return row


def csv_rows(summary, args, dev):
    """docs/targets.md's columns, a fwd and a bwd row per mask, + used_gib, extra_gib, extra_per_row."""
    commit = os.environ.get("FLASHC_COMMIT", "")  # a copy of the tree without .git (the device runs) says so here
    if not commit:
        try:
            git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
            commit = git.stdout.strip() or "unknown"
        except OSError:
            commit = "unknown"
    common = dict(
        date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        commit=commit, impl=f"flashc:{args.backend}", dtype=args.dtype, batch=args.batch, heads_q=args.heads,
        heads_kv=args.heads, seqlen_q=args.seqlen, seqlen_k=args.seqlen, head_dim=args.head_dim,
    )  # fmt: skip
    for r in summary:
        for p, names in (("fwd", ("o",)), ("bwd", ("dq", "dk", "dv"))):
            yield {**common, "causal": int(r["mask"] == "causal"), "pass": p, "world": 1,
                   "threads": 0 if dev.type == "cuda" else os.cpu_count(), "ms": f"{r[p + '_ms']:.3f}",
                   "tflops": f"{r[p + '_tflops']:.2f}", "gbps": "",
                   "max_abs_err": f"{max(r[n + '_abs'] for n in names):.3e}",
                   "rel_l2_err": f"{max(r[n + '_rel'] for n in names):.3e}",
                   **{k: f"{r[k]:.3f}" for k in ("used_gib", "extra_gib", "extra_per_row")}}  # fmt: skip


def main():
    args = parse_args()
    flashc = load_flashc(args.lib)
    dev, dtype = torch.device(args.device), DTYPES[args.dtype]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "host"
    print(f"flashc {flashc.__version__} ({flashc.library_path}), backend {args.backend}, {name}")
    # At the default shape a tensor has 2^31 elements (4 GiB): the sampled last row of the last head reads and
    # writes its last element, 2^31 - 1 elements and 2^32 - 2 bytes from its start.
    elems = args.batch * args.seqlen * args.heads * args.head_dim
    big = " (byte offsets pass 2^31: 64-bit offsets needed)" if elems * dtype.itemsize > 2**31 else ""
    print(f"b {args.batch} s {args.seqlen} h {args.heads} d {args.head_dim} {args.dtype}: b·h·s·d = {elems} = "
          f"2^{math.log2(elems):.2f} elements per tensor, {elems * dtype.itemsize / 2**30:.2f} GiB{big}")  # fmt: skip
    # A small call first: loads the kernels (their code takes device memory, which must not count as extra)
    # and fails fast on a backend that cannot run, before the big tensors are allocated.
    run_once(flashc, make_tensors((1, 256, args.heads, args.head_dim), dev, dtype), True, None, args, dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    baseline = device_used(dev)
    summary = []
    for mask in args.masks.split(","):
        summary.append(run_mask(flashc, mask, args, dev, dtype, baseline))
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the next mask's fresh tensors need the space
    print("\n" + " | ".join(f"{title:<{len(fmt.format(**summary[0]))}}" for title, fmt in TABLE))
    for r in summary:
        print(" | ".join(fmt.format(**r) for _, fmt in TABLE))
    if args.csv:
        rows = list(csv_rows(summary, args, dev))
        new = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
        with open(args.csv, "a", newline="") as f:
            w = csv.DictWriter(f, list(rows[0]))
            if new:
                w.writeheader()
            w.writerows(rows)
    ok = all(r["verdict"] == "PASS" for r in summary)
    print("PASS: every mask" if ok else "FAIL: see the FAIL lines above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
