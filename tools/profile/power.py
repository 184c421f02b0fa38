"""SM clock and board power while one attention call runs back to back, flashc's beside PyTorch SDPA's (one device
call):

    FLASHC_LIBRARY=build-gc/libflashc.so PYTHONPATH=python python3 tools/profile/power.py [--seconds 2.5] [--pass bwd]
        [--cases 64:4096:1,...] [--dtype f16] [--backend cuda-mma --peers flash,cudnn]

Each case (bf16 or --dtype f16, 16k tokens, width 2048) runs for --seconds after 3 warm-up calls, with a pause between
cases, while nvidia-smi samples the SM clock, the power draw, the temperature and the throttle reasons every 20 ms; each
row is the median over the run (the first 0.5 s left out). Under the power cap (H100 SXM: 700 W) the clock a kernel gets
depends on the energy it spends per cycle, so a faster kernel at fixed clocks (ncu) may still lose: the table shows work
per clock (TFLOP/s per GHz) and energy per work (J per PFLOP) beside the time. nvidia-smi's power.draw is an average
over about a second (it climbs for ~1 s after a kernel starts), and the clock steps down again once that average reaches
the cap (bench/results/profile/hopper-power-2026-11-23.txt): runs shorter than ~1.5 s read a mix of states.
An A/B of two kernels is two builds of the library, each run through this script (tools/hopper/ab.sh).
"""
import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402

import flashc  # noqa: E402
from one_call import sdpa_call  # noqa: E402  (this script's folder is on sys.path when it runs)

CASES = "128:2048:0,256:8192:0,128:8192:0,64:4096:1"  # head dim : seqlen : causal
BWD_CASES = "64:2048:0,64:2048:1,128:2048:0,128:2048:1,128:8192:0,256:4096:1"


def run(name, call, flops, seconds, phases):
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0, n = time.time(), 0
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    while time.time() - t0 < seconds:
        for _ in range(10):
            call()
        n += 10
        torch.cuda.synchronize()
    e1.record()
    e1.synchronize()
    ms = e0.elapsed_time(e1) / n
    phases.append(dict(name=name, t0=t0 + 0.5, t1=time.time(), ms=ms, tflops=flops / ms / 1e9))
    time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--log", default="/tmp/power-smi.csv", help="nvidia-smi's samples")
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd",
                    help="bwd: the backward alone (flashc.prepare_backward beside the peers' through autograd.grad), "
                    "FLOPs counted as 2.5 forwards")
    ap.add_argument("--cases", default=None, help=f"D:S:CAUSAL,... (default fwd {CASES}; bwd {BWD_CASES})")
    ap.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    ap.add_argument("--backend", default="cuda-hopper", help="flashc's backend (cuda-hopper, cuda-mma, ...)")
    ap.add_argument("--peers", default="cudnn", help="SDPA backends run after it: cudnn, flash, efficient (comma-separated)")
    a = ap.parse_args()
    spec = a.cases or (BWD_CASES if a.which == "bwd" else CASES)
    cases = [tuple(int(x) for x in c.split(":")) for c in spec.split(",")]
    query = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    with open(a.log, "w") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "20"],
                               stdout=log)
        time.sleep(1.0)
        phases = []
        for d, s, causal in cases:
            causal = bool(causal)
            b, h = 16384 // s, 2048 // d
            dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
            q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(4))
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1) * (2.5 if a.which == "bwd" else 1.0)
            tag = f"{'-bwd' if a.which == 'bwd' else ''} d{d} s{s} c{int(causal)}"
            call = fwd = flashc.prepare_forward(q, k, v, causal=causal, backend=a.backend)
            if a.which == "bwd":
                o, lse = fwd()
                call = flashc.prepare_backward(dout, q, k, v, o, lse, causal=causal, backend=a.backend)
            run(a.backend.replace("cuda-", "") + tag, call, flops, a.seconds, phases)
            for peer in a.peers.split(","):
                run(peer + tag, sdpa_call("sdpa-" + peer, a.which, q, k, v, dout, causal), flops, a.seconds, phases)
        smi.terminate()
    samples = []
    for line in open(a.log):
        p = [x.strip() for x in line.split(",")]
        try:  # nvidia-smi's stamps are the local time, as time.time() is read here
            ts = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((ts, float(p[1]), float(p[2]), float(p[3]), p[4]))
        except (ValueError, IndexError):
            pass
    print(f"{'case':32s} {'ms':>8s} {'TFLOP/s':>8s} {'SM MHz':>7s} {'W':>6s} {'degC':>5s} {'TF/GHz':>7s} {'J/PFLOP':>8s} "
          "throttle")
    for ph in phases:
        sel = [x for x in samples if ph["t0"] <= x[0] <= ph["t1"]]
        if not sel:
            print(f"{ph['name']:32s} no samples")
            continue
        mhz, watts = statistics.median(x[1] for x in sel), statistics.median(x[2] for x in sel)
        print(f"{ph['name']:32s} {ph['ms']:8.3f} {ph['tflops']:8.1f} {mhz:7.0f} {watts:6.0f} "
              f"{statistics.median(x[3] for x in sel):5.0f} {ph['tflops'] / mhz * 1e3:7.0f} {watts / ph['tflops']:8.2f} "
              f"{sorted(set(x[4] for x in sel))}")


if __name__ == "__main__":
    main()
