"""What the GPU check scripts (tools/mma/check_fwd.py, tools/mma/check_bwd.py, tools/fa2/check_bwd.py,
tools/hopper/check.py, tools/hopper/check_bwd.py) share: libflashc through the ctypes mirror of flashc.h that the
Python package keeps (python/flashc/_lib.py, whose offsets tests/python/test_package.py checks against the header),
the mask, the fp64 reference, a case's random inputs in the strided layouts under test, the verdict on a forward's
o and lse, the record of results and its summary, the common options and the order of a run, and the timing of a
call against the PyTorch SDPA peers.

The scripts run as `python3 tools/<dir>/<script>.py` from the repository root; each puts tools/ on sys.path and
imports this module. Nothing here needs numpy or the package's other modules: only torch (and a GPU for the
calls; the reference, the mask and `make` take a device).
"""
import argparse
import ctypes
import importlib.util
import math
import os
import pathlib
import subprocess
import sys
import time

import torch

_LIB_PY = pathlib.Path(__file__).resolve().parents[1] / "python" / "flashc" / "_lib.py"
DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}  # flashc_dtype


def load_api(path):
    """python/flashc/_lib.py loaded on its own (not the package, which wants numpy and ml_dtypes), on the library
    at `path`: the module with `lib` (every function declared), Tensor, Params and the status numbers."""
    os.environ["FLASHC_LIBRARY"] = os.path.abspath(path)  # the one place _lib.py looks first
    spec = importlib.util.spec_from_file_location("flashc_ctypes", _LIB_PY)
    api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(api)
    return api


class Flashc:
    """libflashc at `path`, a handle per backend name (created on first use; a script cannot go on without
    it), and the calls with torch [b, s, h, d] views of any strides."""

    def __init__(self, path):
        self.api = load_api(path)
        self.lib = self.api.lib
        self.OK, self.INVALID = self.api.OK, self.api.ERR_INVALID_ARGUMENT
        self.UNSUPPORTED = self.api.ERR_UNSUPPORTED
        self._handles = {}

    def last_error(self):
        return self.lib.flashc_last_error().decode()

    def handle(self, name):
        if name not in self._handles:
            h = ctypes.c_void_p()
            if self.lib.flashc_create(ctypes.byref(h), name.encode()) != self.OK:
                sys.exit(f"flashc_create({name}): {self.last_error()}")
            self._handles[name] = h
        return self._handles[name]

    def last_backend(self, name):
        """The backend that ran the last call of handle `name` (auto names the one it chose)."""
        return self.lib.flashc_handle_last_backend(self.handle(name)).decode()

    def tensor(self, x):
        """A torch [b, s, h, d] view (any strides) as a flashc_tensor."""
        t = self.api.Tensor(x.data_ptr(), DTYPE[x.dtype])
        for i in range(4):
            t.size[i], t.stride[i] = x.shape[i], x.stride(i)
        return t

    def params(self, causal=0, align=0, wl=-1, wr=-1, scale=0.0, cu=None, deterministic=0):
        """flashc_params, and what must outlive it (the cu_seqlens arrays it points into)."""
        p = self.api.params_default()
        p.scale, p.causal, p.align, p.window_left, p.window_right = scale, causal, align, wl, wr
        p.deterministic = deterministic
        keep = None
        if cu is not None:
            keep = [(ctypes.c_int32 * len(c))(*c) for c in cu]
            p.cu_seqlens_q = ctypes.cast(keep[0], ctypes.POINTER(ctypes.c_int32))
            p.cu_seqlens_k = ctypes.cast(keep[1], ctypes.POINTER(ctypes.c_int32))
            p.num_seqs = len(cu[0]) - 1
        return p, keep

    @staticmethod
    def _floats(x):
        return ctypes.cast(x.data_ptr(), ctypes.POINTER(ctypes.c_float)) if x is not None else None

    def forward(self, backend, p, q, k, v, o, lse):
        ts = [self.tensor(x) for x in (q, k, v, o)]
        return self.lib.flashc_forward(self.handle(backend), ctypes.byref(p), *[ctypes.byref(t) for t in ts],
                                       self._floats(lse))

    def backward(self, backend, p, q, k, v, o, lse, do, dq, dk, dv):
        ts = [self.tensor(x) for x in (q, k, v, o)]
        gs = [self.tensor(x) for x in (do, dq, dk, dv)]
        return self.lib.flashc_backward(self.handle(backend), ctypes.byref(p), *[ctypes.byref(t) for t in ts],
                                        self._floats(lse), *[ctypes.byref(t) for t in gs])


# ---- inputs ------------------------------------------------------------------------------------------------
def make_with_buffer(b, s, h, d, dtype, layout, fill=None, device="cuda"):
    """[b, s, h, d] in `dtype` laid out as `layout` says (random, or `fill`), and the whole buffer under it:
    bshd, bhsd (a transposed view), padded (head stride a multiple of 8 elements, + 8: rows aligned, not
    contiguous), odd (head stride d + 1: rows not 16-byte aligned, which kernels with TMA or 16-byte loads must
    refuse or load plainly). The dtype comes first and the slice last: .to() of a strided view would make a
    contiguous copy and lose the layout under test."""
    shape = {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "padded": (b, s, h, (d + 7) // 8 * 8 + 8),
             "odd": (b, s, h, d + 1)}[layout]
    if fill is None:
        buf = torch.randn(shape, device=device, dtype=dtype)
    else:
        buf = torch.full(shape, fill, device=device, dtype=dtype)
    x = buf.transpose(1, 2) if layout == "bhsd" else buf[..., :d]
    return x, buf


def make(b, s, h, d, dtype, layout, fill=None, device="cuda"):
    """make_with_buffer's view alone."""
    return make_with_buffer(b, s, h, d, dtype, layout, fill, device)[0]


def cu_seqlens(varlen):
    """(lens_q, lens_k) -> cu_q, cu_k and the sequences as (batch 0, q start, q len, k start, k len)."""
    cu_q, cu_k = [0], [0]
    for lq, lk in zip(*varlen):
        cu_q.append(cu_q[-1] + lq)
        cu_k.append(cu_k[-1] + lk)
    seqs = [(0, cu_q[i], cu_q[i + 1] - cu_q[i], cu_k[i], cu_k[i + 1] - cu_k[i]) for i in range(len(cu_q) - 1)]
    return cu_q, cu_k, seqs


def inputs(dtype, b, sq, sk, hq, hkv, d, layout, varlen=None):
    """Random q, k, v laid out as `layout` says, the sequences as (batch, q start, q len, k start, k len), and
    cu = (cu_q, cu_k) for Flashc.params: varlen = (lens_q, lens_k) packs its sequences in batch 1 (b, sq, sk
    unused), else cu is None and every batch holds one sequence of sq queries and sk keys."""
    if varlen:
        cu_q, cu_k, seqs = cu_seqlens(varlen)
        b, nq, nk, cu = 1, cu_q[-1], cu_k[-1], (cu_q, cu_k)
    else:
        seqs = [(bb, 0, sq, 0, sk) for bb in range(b)]
        nq, nk, cu = sq, sk, None
    q, k, v = (make(b, n, h, d, dtype, layout) for n, h in ((nq, hq), (nk, hkv), (nk, hkv)))
    return q, k, v, seqs, cu


# ---- reference ---------------------------------------------------------------------------------------------
REF_DEVICE = "cuda"  # where check_forward computes its references (run() sets it from --cpu-reference)


def visible(sq, sk, causal, align, wl, wr, device="cuda"):
    """[sq, sk] bool: key j visible to query i (flashc.h's mask; align 0 = bottom-right)."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    d = i + (sk - sq if align == 0 else 0)
    if causal:
        wr = 0
    vis = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if wl >= 0:
        vis &= j >= d - wl
    if wr >= 0:
        vis &= j <= d + wr
    return vis


def reference(q, k, v, scale, vis, low=None, do=None):
    """One sequence: q [sq, hq, d], k, v [sk, hkv, d]. Returns o [sq, hq, d], lse [hq, sq] and, given do
    [sq, hq, d], dq [sq, hq, d], dk, dv [sk, hkv, d]: in fp64 (low=None), or done plainly with matmuls in `low`
    and the rest in fp32, whose error sets the tolerance:
    P = softmax(scale·Q·Kᵀ), O = P·V, dV = Pᵀ·dO, dP = dO·Vᵀ, D = rowsum(dO∘O) with O rounded to `low` as the
    kernel's stored o is, dS = P∘(dP − D), dQ = scale·dS·K, dK = scale·dSᵀ·Q, dK and dV summed over each GQA
    group. Rows that see no key: o 0, lse -inf, dq 0."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    dt = low or torch.float64
    acc = torch.float32 if low else torch.float64
    tiny = 1e-30 if low else 1e-300
    qq = q.to(dt).transpose(0, 1)
    kk = k.to(dt).repeat_interleave(g, dim=1).transpose(0, 1)
    vv = v.to(dt).repeat_interleave(g, dim=1).transpose(0, 1)
    s = (qq @ kk.transpose(-1, -2)).to(acc) * scale
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)  # noqa: E741 - the paper's ℓ
    p = torch.where(l > 0, e / l.clamp_min(tiny), torch.zeros_like(e))
    lse = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(l[..., 0].clamp_min(tiny)),
                      torch.full_like(l[..., 0], float("-inf")))
    o = (p.to(dt) @ vv).to(acc)
    if do is None:
        return o.transpose(0, 1), lse
    dd = do.to(dt).transpose(0, 1)
    dv = (p.to(dt).transpose(-1, -2) @ dd).to(acc)
    dp = (dd @ vv.transpose(-1, -2)).to(acc)
    dsum = (dd.to(acc) * o.to(dt).to(acc)).sum(-1, keepdim=True)
    ds = p * (dp - dsum)
    dq = (ds.to(dt) @ kk).to(acc) * scale
    dk = (ds.to(dt).transpose(-1, -2) @ qq).to(acc) * scale
    sk, d = k.shape[0], k.shape[2]
    dk = dk.view(hkv, g, sk, d).sum(1)
    dv = dv.view(hkv, g, sk, d).sum(1)
    if low:  # the kernel stores its gradients in the 16-bit dtype: round the plain ones the same way, else a case
        dq, dk, dv = (x.to(dt).to(acc) for x in (dq, dk, dv))  # with plain error ~0 (sq = 1) gets < half an ulp
    return o.transpose(0, 1), lse, dq.transpose(0, 1), dk.transpose(0, 1), dv.transpose(0, 1)


def check_forward(record, tag, dtype, q, k, v, o, lse, seqs, mask, varlen):
    """Records under `tag` whether o (and lse, unless None) of a forward on q, k, v pass FlashAttention's rule:
    max |error| against the fp64 reference at most 2x the plain low-precision computation's + 1e-4, lse within
    2e-3 and -inf exactly where the reference's is; no NaN; sequences with no key give o = 0, lse = -inf.
    mask = (causal, align, window_left, window_right); lse laid out as flashc.h says ([hq, total rows] with varlen,
    else [b, hq, sq])."""
    b, sq, hq, d = q.shape
    rows = b * sq
    scale = 1.0 / math.sqrt(d)
    err = err_plain = err_lse = 0.0
    bad = []
    for bb, qs, ql, ks, kl in seqs:
        if ql == 0:
            continue
        ox = o[bb:bb + 1, qs:qs + ql].double()
        lx = None
        if lse is not None:
            lx = lse.view(hq, rows)[:, qs:qs + ql][None] if varlen else lse.view(b, hq, sq)[bb:bb + 1]
        if kl == 0:  # no key at all: output 0, lse -inf
            if torch.isnan(ox).any() or ox.abs().max() != 0:
                bad.append("rows with no key are not 0")
            if lx is not None and not bool((torch.isinf(lx) & (lx < 0)).all()):
                bad.append("rows with no key: lse is not -inf")
            continue
        one = (q[bb, qs:qs + ql].to(REF_DEVICE), k[bb, ks:ks + kl].to(REF_DEVICE), v[bb, ks:ks + kl].to(REF_DEVICE),
               scale, visible(ql, kl, *mask, device=REF_DEVICE))
        o_ref, lse_ref = (x[None].double().to(q.device) for x in reference(*one))  # [1, sq, hq, d], [1, hq, sq]
        o_plain = reference(*one, low=dtype)[0][None].double().to(q.device)
        if torch.isnan(ox).any():
            bad.append("NaN in o")
        err = max(err, (ox - o_ref).abs().max().item())
        err_plain = max(err_plain, (o_plain - o_ref).abs().max().item())
        if lx is not None:
            if torch.isnan(lx).any():
                bad.append("NaN in lse")
            inf_ref = torch.isinf(lse_ref)
            if not torch.equal(torch.isinf(lx) & (lx < 0), inf_ref):
                bad.append("lse -inf pattern differs")
            if (~inf_ref).any():
                err_lse = max(err_lse, (lx.double()[~inf_ref] - lse_ref[~inf_ref]).abs().max().item())
    tol = 2 * err_plain + 1e-4
    ok = not bad and err <= tol and err_lse <= 2e-3
    record(tag, ok, f"err {err:.2e} (plain {err_plain:.2e}, tol {tol:.2e}) lse {err_lse:.1e} {' '.join(bad)}")


# ---- results -----------------------------------------------------------------------------------------------
class Results:
    """Every check's (tag, ok, info); a failure is printed when it happens (with verbose, a pass too)."""

    def __init__(self, verbose=False):
        self.results, self.failures, self.verbose = [], [], verbose

    def record(self, tag, ok, info):
        self.results.append((tag, ok, info))
        if not ok:
            self.failures.append((tag, info))
        if self.verbose:
            print(("ok   " if ok else "FAIL ") + tag + " " + info, flush=True)
        elif not ok:
            print("FAIL", tag, info, flush=True)

    def passed(self):
        return f"{len(self.results) - len(self.failures)}/{len(self.results)} passed"

    def count(self, prefix):
        """Cases whose tag starts with `prefix`, and how many of them failed."""
        return (sum(1 for tg, _, _ in self.results if tg.startswith(prefix)),
                sum(1 for tg, _ in self.failures if tg.startswith(prefix)))

    def summary(self, t0, groups=(), shown=30):
        """The last lines of a run (started at time t0), and the exit, 1 if anything failed: per group (a tag
        prefix) its count, then the first `shown` failures."""
        print(f"\n== summary ({time.time() - t0:.0f} s) ==")
        print(f"checks: {self.passed()}")
        for group in groups:
            n, nf = self.count(group + " ")
            print(f"  {group}: {n - nf}/{n} passed")
        for tag, info in self.failures[:shown]:
            print("  FAIL", tag, info)
        sys.exit(1 if self.failures else 0)


def arg_parser(lib, quick_help):
    """The options of every GPU check script: --lib (the library under test, default `lib`), --quick (help
    `quick_help`), --no-check, --no-bench; a script adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=lib)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--no-check", action="store_true", help="skip the correctness cases")
    ap.add_argument("--no-bench", action="store_true", help="skip the timings")
    ap.add_argument("--cpu-reference", action="store_true", help="compute the forward references on the CPU "
                    "(under compute-sanitizer: torch's cuBLAS kernels are not flashc's to check)")
    return ap


def run(args, res, correctness, bench, groups=(), shown=30):
    """correctness() unless --no-check, then bench() unless --no-bench, then res's summary and the exit (1 if
    anything failed)."""
    global REF_DEVICE
    REF_DEVICE = "cpu" if args.cpu_reference else "cuda"
    t0 = time.time()
    if not args.no_check:
        correctness()
    if not args.no_bench:
        bench()
    res.summary(t0, groups=groups, shown=shown)


# ---- timings -----------------------------------------------------------------------------------------------
_flush = {}


def timeit(fn, reps, warmup, flush_mb=64):
    """Median ms of `reps` calls after `warmup` calls, L2 flushed (untimed) before each."""
    if flush_mb not in _flush:
        _flush[flush_mb] = torch.empty(flush_mb << 20, dtype=torch.int8, device="cuda")
    flush = _flush[flush_mb]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def sdpa_backend(name):
    """torch's SDPBackend for "flash", "cudnn", "efficient"."""
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def sdpa_forward_ms(name, q, k, v, causal, timer):
    """`timer` of SDPA's forward with backend `name` on [b, h, s, d] tensors."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(sdpa_backend(name)):
        return timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))


def sdpa_backward_ms(name, q, k, v, dout, causal, timer):
    """`timer` of the autograd backward alone of SDPA with backend `name` on [b, h, s, d] tensors."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    qt, kt, vt = (x.detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel(sdpa_backend(name)):
        out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
    return timer(lambda: torch.autograd.grad(out, (qt, kt, vt), dout, retain_graph=True))


def peer_ms(name, time_it, quiet=False):
    """time_it(), or nan where the peer cannot run this shape (said unless quiet)."""
    try:
        return time_it()
    except Exception as e:  # noqa: BLE001 - a peer that cannot run this shape is reported as nan
        if not quiet:
            print(name, "failed:", str(e).split("\n")[0][:120], flush=True)
        return float("nan")


def tflops(flops, ms):
    """{impl: TFLOP/s} from {impl: ms}."""
    return {kk: flops / t / 1e9 for kk, t in ms.items()}


def best_of(names, tf):
    """The name of the highest TFLOP/s among `names` (nan counts as none)."""
    return max(names, key=lambda c: -1.0 if math.isnan(tf[c]) else tf[c])


def git_commit():
    """The commit under test: $FLASHC_COMMIT (a snapshot without .git, as the device runs), else git's HEAD."""
    if os.environ.get("FLASHC_COMMIT"):
        return os.environ["FLASHC_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


# docs/targets.md's columns of a results CSV
CSV_COLUMNS = ["date", "device", "commit", "impl", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
               "head_dim", "causal", "pass", "world", "threads", "ms", "tflops", "gbps", "max_abs_err", "rel_l2_err"]


def write_csv(path, cols, rows):
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for r in rows:
            f.write(",".join(str(x) for x in r) + "\n")
