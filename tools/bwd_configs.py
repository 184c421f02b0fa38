"""The GPU check of a backend's backward, the kernels its plan picks per call (head dim, mask, deterministic mode,
the device): cuda-mma's (tools/mma/check_bwd.py) and cuda-fa2-fp32's (tools/fa2/check_bwd.py). Those two scripts
say what differs (the backend, its dtypes, the tolerance floor, the bits compared for determinism, the bench and its
peers) and run `main`. A kernel that is not the plan's choice is built and checked as an experiment, from its
commit (docs/experiments.md), not switched on here.

Per case: fresh random inputs; o and lse from the fp64 reference (o rounded to the dtype), so the forward kernel
is not under test; dq, dk, dv poisoned with NaN before every call, including the padding of strided layouts,
which must stay NaN (no write past head_dim); per gradient, max |error| against the fp64 reference at most 3x
the error of the same maths done plainly in the kernel's precision, + the backend's floor; in deterministic mode
two runs bit-identical; no NaN anywhere.
"""
import dataclasses
import math
from typing import Callable

import torch

from gpucheck import Flashc, Results, arg_parser, inputs, make, make_with_buffer, reference, run, visible


@dataclasses.dataclass
class Spec:
    backend: str  # "cuda-mma"
    dtypes: tuple  # the torch dtypes checked, in order
    bits: torch.dtype  # an integer dtype of the same width, to compare two runs bit for bit
    floor: Callable  # floor(mag, lse) -> what is added to 3x the plain error; mag {gradient: max |reference|}
    lib: str  # --lib's default
    quick_help: str  # --quick's help


class Harness:
    def __init__(self, spec, args):
        self.spec, self.args = spec, args
        self.configs = ["flashc"]  # the bench's column of the backend (its plan's kernels)
        self.fc = Flashc(args.lib)
        self.fc.handle(spec.backend)  # a script that cannot create its handle stops here, before any case
        self.res = Results()
        self.OK = self.fc.OK

    def backward(self, p, q, k, v, o, lse, do, dq, dk, dv):
        return self.fc.backward(self.spec.backend, p, q, k, v, o, lse, do, dq, dk, dv)

    def forward(self, p, q, k, v, o, lse):
        return self.fc.forward(self.spec.backend, p, q, k, v, o, lse)

    def time_configs(self, q, k, v, dout, causal, timer):
        """{"flashc": ms of the backward} on [b, h, s, d] inputs passed as [b, s, h, d] views (bottom-right
        causal or full), o and lse from the backend's forward; nan where it fails (said)."""
        fc, res = self.fc, {}
        qv, kv, vv, dov = (x.transpose(1, 2) for x in (q, k, v, dout))  # [b, s, h, d] views
        o = torch.empty_like(qv)
        lse = torch.empty(q.shape[0] * q.shape[1] * q.shape[2], device="cuda")
        dq, dk, dv = torch.empty_like(qv), torch.empty_like(kv), torch.empty_like(vv)
        p, _ = fc.params(causal=causal, align=1)
        if self.forward(p, qv, kv, vv, o, lse) != fc.OK:
            print("forward:", fc.last_error(), flush=True)
        for config in self.configs:
            if self.backward(p, qv, kv, vv, o, lse, dov, dq, dk, dv) != fc.OK:
                print(config, fc.last_error(), flush=True)
                res[config] = float("nan")
                continue
            res[config] = timer(lambda: self.backward(p, qv, kv, vv, o, lse, dov, dq, dk, dv))  # noqa: B023
        return res

    def check(self, config, dtype, b, sq, sk, hq, hkv, d, causal=0, align=0, wl=-1, wr=-1, layout="bshd",
              varlen=None, scale=0.0, det=0):
        tag = (f"{config:5s} {str(dtype)[6:]:8s} b{b} sq{sq} sk{sk} h{hq}/{hkv} d{d} causal{causal} align{align} "
               f"w({wl},{wr}) {layout}" + (f" varlen{varlen}" if varlen else "")
               + (f" scale{scale}" if scale else "") + (" det" if det else ""))
        if self.args.dims and d not in self.args.dims:
            return
        q, k, v, seqs, cu = inputs(dtype, b, sq, sk, hq, hkv, d, layout, varlen)
        nb, nq, nk = q.shape[0], q.shape[1], k.shape[1]
        p, keep = self.fc.params(causal, align, wl, wr, scale, cu=cu, deterministic=det)
        do = make(nb, nq, hq, d, dtype, layout)
        sc = scale if scale else 1.0 / math.sqrt(d)
        # o and lse from the fp64 reference; lse as flashc lays it out: [b, hq, sq], or [hq, total_q] when varlen
        o = make(nb, nq, hq, d, dtype, layout, fill=0.0)
        lse = torch.full((hq, nb * nq) if varlen else (nb, hq, nq), float("-inf"), device="cuda")
        refs = []
        for bb, qs, ql, ks, kl in seqs:
            if ql == 0 or kl == 0:  # an empty sequence: no output, lse -inf, zero gradients
                z = lambda n, h: torch.zeros(n, h, d, device="cuda", dtype=torch.float64)  # noqa: E731
                r = rl = (z(ql, hq), torch.full((hq, ql), float("-inf"), device="cuda", dtype=torch.float64),
                          z(ql, hq), z(kl, hkv), z(kl, hkv))
            else:
                vis = visible(ql, kl, causal, align, wl, wr)
                one = (q[bb, qs:qs + ql], k[bb, ks:ks + kl], v[bb, ks:ks + kl], sc, vis)
                r = reference(*one, do=do[bb, qs:qs + ql])
                rl = reference(*one, low=dtype, do=do[bb, qs:qs + ql])
            o[bb, qs:qs + ql] = r[0].to(dtype)
            if varlen:
                lse[:, qs:qs + ql] = r[1].float()
            else:
                lse[bb] = r[1].float()
            refs.append((r, rl))
        runs = []
        for _ in range(2 if det else 1):
            dq, dq_buf = make_with_buffer(nb, nq, hq, d, dtype, layout, fill=float("nan"))
            dk, dk_buf = make_with_buffer(nb, nk, hkv, d, dtype, layout, fill=float("nan"))
            dv, dv_buf = make_with_buffer(nb, nk, hkv, d, dtype, layout, fill=float("nan"))
            st = self.backward(p, q, k, v, o, lse, do, dq, dk, dv)
            torch.cuda.synchronize()
            if st != self.OK:
                self.res.record(tag, False, f"status {st}: {self.fc.last_error()}")
                return
            runs.append((dq, dk, dv, dq_buf, dk_buf, dv_buf))
        del keep
        dq, dk, dv, dq_buf, dk_buf, dv_buf = runs[0]
        bad = []
        bits = self.spec.bits
        if det and not all(torch.equal(a.view(bits), b_.view(bits)) for a, b_ in zip(runs[0][:3], runs[1][:3])):
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
        floor = self.spec.floor(mag, lse)
        tol = {n: 3 * plain[n] + floor for n in err}
        ok = not bad and all(err[n] <= tol[n] for n in err)
        self.res.record(tag, ok, " ".join(f"{n} {err[n]:.1e}/{tol[n]:.1e}" for n in err) + " " + " ".join(bad))

    def correctness(self, extra=()):
        """Every dtype over odd shapes, masks, head dims, layouts, GQA/MQA, a negative scale,
        varlen with empty sequences, deterministic mode; then each of `extra` (a function of this harness)."""
        check, quick = self.check, self.args.quick
        torch.manual_seed(0)
        shapes = [(1, 1), (97, 97), (257, 257), (1025, 1025), (113, 203), (203, 113), (1024, 1023), (1, 147)]
        masks = [dict(), dict(causal=1, align=0), dict(causal=1, align=1), dict(wl=32, wr=16), dict(wl=200, wr=0)]
        dims = [59, 111, 64, 128, 256]
        layouts = ["bshd", "bhsd", "padded", "odd"]
        if quick:
            shapes, masks = [(97, 97), (1025, 1025), (203, 113)], [dict(), dict(causal=1)]
        for config in self.configs:
            for dtype in self.spec.dtypes:
                n = 0
                for sq, sk in shapes:
                    for m in masks:
                        for d in (dims if max(sq, sk) <= 257 or quick else dims[n % 5:n % 5 + 1] + [128]):
                            n += 1
                            b, h = (2, 4)
                            check(config, dtype, b, sq, sk, h, h // 2, d, layout=layouts[n % 4], **m)  # GQA 2:1
                for d in (32, 40, 80, 96, 150, 160, 192):  # every compiled head dim, and padded ones
                    check(config, dtype, 1, 257, 300, 4, 2, d, causal=d % 3 == 0, layout=layouts[d % 4])
                check(config, dtype, 1, 300, 300, 8, 1, 128, causal=1)  # MQA
                check(config, dtype, 1, 257, 257, 4, 4, 64, scale=-0.1)  # negative scale: scores from -Q
                if not self.args.no_varlen:
                    check(config, dtype, 1, 0, 0, 4, 2, 128, causal=1,
                          varlen=([1, 97, 0, 300, 257, 5], [1, 120, 7, 300, 0, 64]))
                    check(config, dtype, 1, 0, 0, 4, 2, 64, causal=1, align=1, layout="bhsd",
                          varlen=([129, 97, 3, 300], [64, 120, 7, 301]))
                    check(config, dtype, 1, 0, 0, 4, 4, 256, wl=50, wr=10, layout="padded",
                          varlen=([129, 200, 1], [300, 64, 33]))
                for d in (64, 128, 256):  # deterministic: bit-identical over two runs, and right
                    check(config, dtype, 2, 1025, 1025, 4, 2, d, causal=1, det=1)
                    check(config, dtype, 1, 203, 113, 4, 2, d + 3 if d < 256 else d, layout="odd", det=1)
                if quick:
                    break
        for fn in extra:
            fn(self)
        print(f"correctness: {self.res.passed()}", flush=True)


def parse_args(spec, more=None):
    """The command line of both scripts; `more(ap)` adds a script's own options after the common ones."""
    ap = arg_parser(spec.lib, spec.quick_help)
    ap.add_argument("--csv", default="", help="write the bench rows here (docs/targets.md's columns + config)")
    ap.add_argument("--no-varlen", action="store_true",
                    help="skip the varlen cases (under racecheck, PyTorch's reference of their 1-token sequence "
                    "fails with an illegal address inside the sanitizer, before any flashc call)")
    ap.add_argument("--dims", default="", type=lambda t: {int(x) for x in t.split(",") if x},
                    help="check only the cases of these head dims (e.g. 59,64,111,128: racecheck of one kernel)")
    if more:
        more(ap)
    return ap.parse_args()


def main(spec, bench, more_args=None, extra_checks=()):
    """Parse the command line, check (unless --no-check), run `bench(harness)` (unless --no-bench), print the
    summary, exit 1 if anything failed."""
    h = Harness(spec, parse_args(spec, more_args))
    run(h.args, h.res, lambda: h.correctness(extra_checks), lambda: bench(h), groups=h.configs, shown=30)
