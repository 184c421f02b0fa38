"""GPU check of cuda-fa2-fp32's backward, every configuration (FLASHC_FA2_BWD_CONFIG): correctness of dq, dk, dv
against an fp64 reference, then backward TFLOP/s against PyTorch SDPA `efficient` (fp32) on b4 h8 d64 seqlen
1024..8192 and b8 h16 s2048 d64, full and causal. Run through tools/fa2/bench-bwd.sh, or:

    python3 tools/fa2/check_bwd.py --lib build-gpu-fa2bwd/libflashc.so [--quick] [--no-check] [--no-bench]
                                   [--configs base,fused,pipe] [--csv fa2-bwd.csv]

Correctness rule: per gradient, max |error| against the fp64 reference is at most 3x the error of the same maths
done plainly in fp32 (TF32 off), + the floor of tests/test_backends.c. o and lse come from the fp64 reference (o
rounded to fp32), so the forward kernel is not under test here. dq, dk, dv are poisoned with NaN before every call,
including the padding of strided layouts, which must stay NaN (no write past head_dim). The deterministic mode must
give bit-identical gradients over two runs. Rows that see no key must get dq = 0, keys seen by no query dk = dv = 0,
never NaN. The candidates cover head dims <= 64 in the atomic mode; other head dims and deterministic mode run the
base kernels whatever the variable says (checked all the same).
"""
import argparse
import ctypes
import datetime
import math
import os
import subprocess
import sys
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="build-gpu-fa2bwd/libflashc.so")
ap.add_argument("--quick", action="store_true", help="a few shapes, and seqlens 1k/4k in the bench")
ap.add_argument("--no-check", action="store_true")
ap.add_argument("--no-bench", action="store_true")
ap.add_argument("--configs", default="base,fused,pipe")
ap.add_argument("--csv", default="", help="write the bench rows here (TARGETS.md's columns + config)")
ap.add_argument("--reps", type=int, default=30, help="timed calls per case (median)")
args = ap.parse_args()
CONFIGS = args.configs.split(",")

lib = ctypes.CDLL(os.path.abspath(args.lib))
I64 = ctypes.c_int64


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("size", I64 * 4), ("stride", I64 * 4)]


class Params(ctypes.Structure):
    _fields_ = [("scale", ctypes.c_float), ("causal", ctypes.c_int), ("align", ctypes.c_int),
                ("window_left", I64), ("window_right", I64),
                ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)), ("cu_seqlens_k", ctypes.POINTER(ctypes.c_int32)),
                ("num_seqs", I64), ("deterministic", ctypes.c_int)]


lib.flashc_last_error.restype = ctypes.c_char_p
lib.flashc_params_default.restype = Params
DTYPE = {torch.float32: 0}
OK = 0
INVALID_ARGUMENT = 1
BACKEND = b"cuda-fa2-fp32"
torch.backends.cuda.matmul.allow_tf32 = False  # the plain fp32 reference must be fp32


def as_tensor(x):
    """A torch [b, s, h, d] view (any strides) as a flashc_tensor."""
    t = Tensor(x.data_ptr(), DTYPE[x.dtype])
    for i in range(4):
        t.size[i], t.stride[i] = x.shape[i], x.stride(i)
    return t


_handle = ctypes.c_void_p()
if lib.flashc_create(ctypes.byref(_handle), BACKEND) != OK:
    sys.exit(f"flashc_create(cuda-fa2-fp32): {lib.flashc_last_error().decode()}")


def params(causal=0, align=0, wl=-1, wr=-1, scale=0.0, cu=None, det=0):
    p = lib.flashc_params_default()
    p.scale, p.causal, p.align, p.window_left, p.window_right = scale, causal, align, wl, wr
    p.deterministic = det
    keep = None
    if cu is not None:
        keep = [(ctypes.c_int32 * len(c))(*c) for c in cu]
        p.cu_seqlens_q = ctypes.cast(keep[0], ctypes.POINTER(ctypes.c_int32))
        p.cu_seqlens_k = ctypes.cast(keep[1], ctypes.POINTER(ctypes.c_int32))
        p.num_seqs = len(cu[0]) - 1
    return p, keep


def backward(config, p, q, k, v, o, lse, do, dq, dk, dv):
    os.environ["FLASHC_FA2_BWD_CONFIG"] = config  # read by the library at every call
    ts = [as_tensor(x) for x in (q, k, v, o)]
    td = [as_tensor(x) for x in (do, dq, dk, dv)]
    return lib.flashc_backward(_handle, ctypes.byref(p), *[ctypes.byref(t) for t in ts],
                               ctypes.c_void_p(lse.data_ptr()), *[ctypes.byref(t) for t in td])


def forward(p, q, k, v, o, lse):
    ts = [as_tensor(x) for x in (q, k, v, o)]
    return lib.flashc_forward(_handle, ctypes.byref(p), *[ctypes.byref(t) for t in ts], ctypes.c_void_p(lse.data_ptr()))


# ---- reference ---------------------------------------------------------------------------------------------
def visible(sq, sk, causal, align, wl, wr):
    """[sq, sk] bool: key j visible to query i (flashc.h's mask; align 0 = bottom-right)."""
    i = torch.arange(sq, device="cuda")[:, None]
    j = torch.arange(sk, device="cuda")[None, :]
    d = i + (sk - sq if align == 0 else 0)
    if causal:
        wr = 0
    vis = torch.ones(sq, sk, dtype=torch.bool, device="cuda")
    if wl >= 0:
        vis &= j >= d - wl
    if wr >= 0:
        vis &= j <= d + wr
    return vis


def reference(q, k, v, do, scale, vis, low=None):
    """One sequence: q, do [sq, hq, d], k, v [sk, hkv, d]. Returns o, lse [hq, sq], dq [sq, hq, d],
    dk, dv [sk, hkv, d] in fp64 (low=None), or done plainly with matmuls in `low` and the rest in fp32:
    P = softmax(scale·Q·Kᵀ), dV = Pᵀ·dO, dP = dO·Vᵀ, D = rowsum(dO∘O), dS = P∘(dP − D), dQ = scale·dS·K,
    dK = scale·dSᵀ·Q, dK and dV summed over each GQA group."""
    hq, hkv = q.shape[1], k.shape[1]
    g = hq // hkv
    dt = low or torch.float64
    acc = torch.float32 if low else torch.float64
    tiny = 1e-30 if low else 1e-300
    qq, dd = q.to(dt).transpose(0, 1), do.to(dt).transpose(0, 1)
    kk = k.to(dt).repeat_interleave(g, dim=1).transpose(0, 1)
    vv = v.to(dt).repeat_interleave(g, dim=1).transpose(0, 1)
    s = (qq @ kk.transpose(-1, -2)).to(acc) * scale
    s = s.masked_fill(~vis, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = torch.where(l > 0, e / l.clamp_min(tiny), torch.zeros_like(e))
    lse = torch.where(l[..., 0] > 0, m[..., 0] + torch.log(l[..., 0].clamp_min(tiny)),
                      torch.full_like(l[..., 0], float("-inf")))
    o = (p.to(dt) @ vv).to(acc)
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


def make(b, s, h, d, dtype, layout, fill=None):
    """[b, s, h, d] in `dtype` laid out as `layout` says (random, or `fill`), and the whole buffer under it.
    The dtype comes first and the slice last: .to() of a strided view would make a contiguous copy."""
    shape = {"bshd": (b, s, h, d), "bhsd": (b, h, s, d), "padded": (b, s, h, (d + 7) // 8 * 8 + 8),
             "odd": (b, s, h, d + 1)}[layout]
    buf = torch.randn(shape, device="cuda", dtype=dtype) if fill is None else torch.full(
        shape, fill, device="cuda", dtype=dtype)
    x = buf.transpose(1, 2) if layout == "bhsd" else buf[..., :d]
    return x, buf


results, failures = [], []


def record(tag, ok, info):
    results.append((tag, ok, info))
    if not ok:
        failures.append((tag, info))
        print("FAIL", tag, info, flush=True)


def check(config, dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd", varlen=None,
          scale=0.0, det=0):
    tag = (f"{config:5s} {str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} "
           f"w({wl},{wr}) {layout}" + (f" varlen{varlen}" if varlen else "") + (f" scale{scale}" if scale else "")
           + (" det" if det else ""))
    if varlen:
        cu_q, cu_k = [0], [0]
        for lq, lk in zip(*varlen):
            cu_q.append(cu_q[-1] + lq)
            cu_k.append(cu_k[-1] + lk)
        nb, nq, nk = 1, cu_q[-1], cu_k[-1]
        seqs = [(0, cu_q[i], cu_q[i + 1] - cu_q[i], cu_k[i], cu_k[i + 1] - cu_k[i]) for i in range(len(cu_q) - 1)]
        p, keep = params(causal, align, wl, wr, scale, cu=(cu_q, cu_k), det=det)
    else:
        nb, nq, nk = b, sq, sk
        seqs = [(bb, 0, sq, 0, sk) for bb in range(b)]
        p, keep = params(causal, align, wl, wr, scale, det=det)
    q, _ = make(nb, nq, hq, d, dtype, layout)
    k, _ = make(nb, nk, hkv, d, dtype, layout)
    v, _ = make(nb, nk, hkv, d, dtype, layout)
    do, _ = make(nb, nq, hq, d, dtype, layout)
    sc = scale if scale else 1.0 / math.sqrt(d)
    # o and lse from the fp64 reference; lse as flashc lays it out: [b, hq, sq], or [hq, total_q] when varlen
    o, _ = make(nb, nq, hq, d, dtype, layout, fill=0.0)
    lse = torch.full((hq, nb * nq) if varlen else (nb, hq, nq), float("-inf"), device="cuda")
    refs = []
    for bb, qs, ql, ks, kl in seqs:
        if ql == 0 or kl == 0:  # an empty sequence: no output, lse -inf, zero gradients
            z = lambda n, h: torch.zeros(n, h, d, device="cuda", dtype=torch.float64)  # noqa: E731
            r = rl = (z(ql, hq), torch.full((hq, ql), float("-inf"), device="cuda", dtype=torch.float64),
                      z(ql, hq), z(kl, hkv), z(kl, hkv))
        else:
            vis = visible(ql, kl, causal, align, wl, wr)
            one = (q[bb, qs:qs + ql], k[bb, ks:ks + kl], v[bb, ks:ks + kl], do[bb, qs:qs + ql], sc, vis)
            r = reference(*one)
            rl = reference(*one, low=dtype)
        o[bb, qs:qs + ql] = r[0].to(dtype)
        if varlen:
            lse[:, qs:qs + ql] = r[1].float()
        else:
            lse[bb] = r[1].float()
        refs.append((r, rl))
    runs = []
    for _ in range(2 if det else 1):
        dq, dq_buf = make(nb, nq, hq, d, dtype, layout, fill=float("nan"))
        dk, dk_buf = make(nb, nk, hkv, d, dtype, layout, fill=float("nan"))
        dv, dv_buf = make(nb, nk, hkv, d, dtype, layout, fill=float("nan"))
        st = backward(config, p, q, k, v, o, lse, do, dq, dk, dv)
        torch.cuda.synchronize()
        if st != OK:
            record(tag, False, f"status {st}: {lib.flashc_last_error().decode()}")
            return
        runs.append((dq, dk, dv, dq_buf, dk_buf, dv_buf))
    dq, dk, dv, dq_buf, dk_buf, dv_buf = runs[0]
    bad = []
    if det and not all(torch.equal(a.view(torch.int32), b_.view(torch.int32)) for a, b_ in zip(runs[0][:3], runs[1][:3])):
        bad.append("deterministic runs differ")
    if layout in ("padded", "odd"):
        for name, buf in (("dq", dq_buf), ("dk", dk_buf), ("dv", dv_buf)):
            if not torch.isnan(buf[..., d:].float()).all():
                bad.append(f"{name}: padding past head_dim was written")
    err = {"dq": 0.0, "dk": 0.0, "dv": 0.0}
    plain, mag = dict(err), dict(err)
    for (bb, qs, ql, ks, kl), (r, rl) in zip(seqs, refs):
        got = {"dq": dq[bb, qs:qs + ql], "dk": dk[bb, ks:ks + kl], "dv": dv[bb, ks:ks + kl]}
        want = {"dq": (r[2], rl[2]), "dk": (r[3], rl[3]), "dv": (r[4], rl[4])}
        for name in err:
            x = got[name].double()
            if x.numel() == 0:
                continue
            if torch.isnan(x).any():
                bad.append(f"NaN in {name}")
                continue
            err[name] = max(err[name], (x - want[name][0]).abs().max().item())
            plain[name] = max(plain[name], (want[name][1].double() - want[name][0]).abs().max().item())
            mag[name] = max(mag[name], want[name][0].abs().max().item())
    # The floor, as tests/test_backends.c has it: relative to the largest of the three gradients (dS = P∘(dP − D)
    # cancels, so dq and dk carry u·|P||dP|·|k| whatever their own size: one key gives dq = 0 exactly, yet the
    # kernel's D from the rounded o leaves ~u there), 16u for the kernel's exp2 and rescales, plus 2u·|lse| for
    # the fp32 lse that P = 2^(S − lse) starts from.
    lse_max = lse[torch.isfinite(lse)].abs().max().item() if torch.isfinite(lse).any() else 0.0
    floor = (16 + 2 * max(1.0, lse_max)) * 2.0**-24 * max(mag.values())
    tol = {n: 3 * plain[n] + floor for n in err}
    ok = not bad and all(err[n] <= tol[n] for n in err)
    record(tag, ok, " ".join(f"{n} {err[n]:.1e}/{tol[n]:.1e}" for n in err) + " " + " ".join(bad))


def correctness():
    torch.manual_seed(0)
    shapes = [(1, 1), (97, 97), (257, 257), (1025, 1025), (113, 203), (203, 113), (1024, 1023), (1, 147)]
    masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
    dims = [59, 111, 64, 128, 256]
    layouts = ["bshd", "bhsd", "padded", "odd"]
    if args.quick:
        shapes, masks = [(97, 97), (1025, 1025), (203, 113)], [dict(), dict(causal=1)]
    for config in CONFIGS:
        for dtype in (torch.float32,):
            n = 0
            for sq, sk in shapes:
                for m in masks:
                    for d in (dims if max(sq, sk) <= 257 or args.quick else dims[n % 5:n % 5 + 1] + [128]):
                        n += 1
                        b, h = (2, 4)
                        check(config, dtype, b, sq, sk, h, h // 2, d, layout=layouts[n % 4], **m)  # GQA 2:1
            for d in (32, 40, 80, 96, 150, 160, 192):  # every compiled head dim, and padded ones
                check(config, dtype, 1, 257, 300, 4, 2, d, causal=d % 3 == 0, layout=layouts[d % 4])
            check(config, dtype, 1, 300, 300, 8, 1, 128, causal=1)  # MQA
            check(config, dtype, 1, 257, 257, 4, 4, 64, scale=-0.1)  # negative scale: scores from -Q
            check(config, dtype, 1, 0, 0, 4, 2, 128, causal=1, varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
            check(config, dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd",
                  varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
            check(config, dtype, 1, 0, 0, 4, 4, 256, wl=50, wr=10, layout="padded",
                  varlen=([129, 200, 1], [300, 64, 33]))
            for d in (64, 128, 256):  # deterministic: bit-identical over two runs, and right
                check(config, dtype, 2, 1025, 1025, 4, 2, d, causal=1, det=1)
                check(config, dtype, 1, 203, 113, 4, 2, d + 3 if d < 256 else d, layout="odd", det=1)
            if args.quick:
                break
    unknown_config()
    print(f"correctness: {len(results) - len(failures)}/{len(results)} passed", flush=True)


def unknown_config():
    """An unknown FLASHC_FA2_BWD_CONFIG is FLASHC_ERR_INVALID_ARGUMENT with the known names, and no write."""
    q, k, v, do = (torch.randn(1, 64, 2, 64, device="cuda") for _ in range(4))
    o, lse = torch.zeros_like(q), torch.zeros(1, 2, 64, device="cuda")
    dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
    p, _ = params()
    st = backward("no-such-config", p, q, k, v, o, lse, do, dq, dk, dv)
    msg = lib.flashc_last_error().decode()
    ok = st == INVALID_ARGUMENT and all(c in msg for c in ("base", "fused", "pipe")) and torch.isnan(dq).all()
    record("unknown FLASHC_FA2_BWD_CONFIG", ok, f"status {st}: {msg}")


# ---- timings -----------------------------------------------------------------------------------------------
def timeit(fn, reps=30):
    """Median ms of `reps` calls after warm-up, L2 flushed (untimed) before each."""
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
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


def bench():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    dev = torch.cuda.get_device_name()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    rows, table = [], []
    cols = ["date", "device", "commit", "impl", "dtype", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k",
            "head_dim", "causal", "pass", "world", "threads", "ms", "tflops", "gbps", "max_abs_err", "rel_l2_err",
            "config", "status", "speedup", "baseline", "repeats", "reference", "note"]
    print(f"\n== backward TFLOP/s on {dev}, fp32 d64 (torch: autograd backward of SDPA efficient only) ==", flush=True)
    shapes = [(4, 8, s) for s in ((1024, 4096) if args.quick else (1024, 2048, 4096, 8192))] + [(8, 16, 2048)]
    d = 64
    for b, h, s in shapes:
        for causal in (0, 1):
            q, k, v, dout = (torch.randn(b, h, s, d, device="cuda") for _ in range(4))
            flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
            res = {}
            qv, kv, vv, dov = (x.transpose(1, 2) for x in (q, k, v, dout))  # [b, s, h, d] views
            o = torch.empty_like(qv)
            lse = torch.empty(b * h * s, device="cuda")
            dq, dk, dv = torch.empty_like(qv), torch.empty_like(kv), torch.empty_like(vv)
            p, _ = params(causal=causal, align=1)
            if forward(p, qv, kv, vv, o, lse) != OK:
                print("forward:", lib.flashc_last_error().decode(), flush=True)
            for config in CONFIGS:
                if backward(config, p, qv, kv, vv, o, lse, dov, dq, dk, dv) != OK:
                    print(config, lib.flashc_last_error().decode(), flush=True)
                    res[config] = float("nan")
                    continue
                res[config] = timeit(lambda: backward(config, p, qv, kv, vv, o, lse, dov, dq, dk, dv), args.reps)
            try:
                qt, kt, vt = (x.detach().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                    out = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal))
                res["efficient"] = timeit(lambda: torch.autograd.grad(out, (qt, kt, vt), dout, retain_graph=True),
                                          args.reps)
                del out, qt, kt, vt
            except Exception as e:  # noqa: BLE001 - a peer that cannot run this shape is reported as nan
                print("efficient failed:", str(e).split("\n")[0][:120], flush=True)
                res["efficient"] = float("nan")
            tf = {kk: flops / ms / 1e9 for kk, ms in res.items()}
            best = max(CONFIGS, key=lambda c: tf[c] if tf[c] == tf[c] else -1)
            table.append((b, h, s, causal, tf, best))
            print(f"b{b} h{h} s{s:5d} causal{causal} " + " ".join(f"{kk} {x:6.2f}" for kk, x in tf.items()) +
                  f"  {best}/efficient {tf[best] / tf['efficient']:.3f}", flush=True)
            for kk, ms in res.items():
                mine = kk in CONFIGS
                rows.append([datetime.date.today().isoformat(), dev, commit,
                             "flashc:cuda-fa2-fp32" if mine else "torch:efficient", "f32", b, h, h, s, s, d, causal,
                             "bwd", 1, 0, ms, tf[kk], "", "", "", f"fa2bwd-{kk}" if mine else "fa2bwd",
                             "pass" if mine else "peer", res["efficient"] / ms, "torch:efficient", args.reps, "",
                             f"FLASHC_FA2_BWD_CONFIG={kk}" if mine else ""])
            del q, k, v, dout, o, dq, dk, dv, qv, kv, vv, dov
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(",".join(cols) + "\n")
            for r in rows:
                f.write(",".join(str(x) for x in r) + "\n")
    print(f"\n== backward TFLOP/s, compact ({dev}); x eff = config / SDPA efficient (fp32), >= 1.00 is the goal ==")
    print(f"{'b':>2} {'h':>2} {'seqlen':>6} {'c':>1} " + " ".join(f"{c:>7}" for c in CONFIGS) + f" {'eff':>7} " +
          " ".join(f"{'x ' + c:>8}" for c in CONFIGS) + f" {'best':>6}")
    for b, h, s, causal, tf, best in table:
        print(f"{b:2d} {h:2d} {s:6d} {causal:1d} " + " ".join(f"{tf[c]:7.2f}" for c in CONFIGS) +
              f" {tf['efficient']:7.2f} " + " ".join(f"{tf[c] / tf['efficient']:8.3f}" for c in CONFIGS) +
              f" {best:>6}")

t0 = time.time()
if not args.no_check:
    correctness()
if not args.no_bench:
    bench()
print(f"\n== summary ({time.time() - t0:.0f} s) ==")
print(f"checks: {len(results) - len(failures)}/{len(results)} passed")
for config in CONFIGS:
    n = sum(1 for tg, _, _ in results if tg.startswith(config + " "))
    nf = sum(1 for tg, _ in failures if tg.startswith(config + " "))
    print(f"  {config}: {n - nf}/{n} passed")
for tag, info in failures[:30]:
    print("  FAIL", tag, info)
sys.exit(1 if failures else 0)
