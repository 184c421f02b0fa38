"""SM clock and board power while one forward call runs back to back, cuda-hopper beside cuDNN's (one device call):

    FLASHC_LIBRARY=build-gc/libflashc.so PYTHONPATH=python python3 tools/profile/power.py [--seconds 2.5]
        [--d128-variants tmastore,pingpongq]

Each case (bf16, 16k tokens, width 2048) runs for --seconds after 3 warm-up calls, with a pause between cases, while
nvidia-smi samples the SM clock, the power draw, the temperature and the throttle reasons every 20 ms; each row is
the median over the run (the first 0.5 s left out). Under the power cap (H100 SXM: 700 W) the clock a kernel gets
depends on the energy it spends per cycle, so a faster kernel at fixed clocks (ncu) may still lose: the table shows
work per clock (TFLOP/s per GHz) and energy per work (J per PFLOP) beside the time.
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
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashc  # noqa: E402

CASES = ((128, 2048, False), (256, 8192, False), (128, 8192, False), (64, 4096, True))  # head dim, seqlen, causal


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
    ap.add_argument("--d128-variants", default="tmastore",
                    help="FLASHC_HOPPER_VARIANT values run beside the default (pingpong in these d = 128 cases) at "
                    "d = 128, comma-separated, each with FLASHC_HOPPER_SCHED=dynamic (read by the persistent kernels "
                    "only); e.g. tmastore,pingpongq")
    a = ap.parse_args()
    query = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    with open(a.log, "w") as log:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "20"],
                               stdout=log)
        time.sleep(1.0)
        phases = []
        for d, s, causal in CASES:
            b, h = 16384 // s, 2048 // d
            q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4.0 * b * h * s * s * d / (2 if causal else 1)
            for variant in ["default"] + (a.d128_variants.split(",") if d == 128 and a.d128_variants else []):
                if variant == "default":
                    os.environ.pop("FLASHC_HOPPER_VARIANT", None)
                else:
                    os.environ["FLASHC_HOPPER_VARIANT"], os.environ["FLASHC_HOPPER_SCHED"] = variant, "dynamic"
                fwd = flashc.prepare_forward(q, k, v, causal=causal, backend="cuda-hopper")
                run(f"hopper-{variant} d{d} s{s} c{int(causal)}", fwd, flops, a.seconds, phases)
                os.environ.pop("FLASHC_HOPPER_VARIANT", None)
                os.environ.pop("FLASHC_HOPPER_SCHED", None)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            run(f"cudnn d{d} s{s} c{int(causal)}", cudnn, flops, a.seconds, phases)
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
