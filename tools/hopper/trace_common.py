"""tools/hopper/trace_common.py — what trace.py (the forward) and trace_bwd.py (the backward) share: the layout of
src/cuda/hopper/trace.cuh's buffer, the options for the cases and for saving and re-reading records, and one traced
call through the library's PREFIX_trace_reset / PREFIX_trace_read (FC_HP_TRACE_READERS)."""
import ctypes

import numpy as np

CTAS, SLOTS, EVENTS = 132, 4, 6144  # hopper/trace.cuh


def add_args(ap, cases, warmup):
    ap.add_argument("--cases", default=cases, help="D:S:CAUSAL,... (bf16, 16k tokens, width 2048)")
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--dump", default=None,
                    help="also save each case's records to DUMP-D-S-CAUSAL[-VARIANT].npz (array buf), for --load")
    ap.add_argument("--load", nargs="+", default=None, help="analyse these --dump files (no GPU, no library)")


def analyse_loaded(a, analyse):
    """--load: analyse each saved record (True), or nothing to do (False)."""
    for path in a.load or []:
        analyse(np.load(path)["buf"], path)
    return bool(a.load)


def cases(spec):
    """(d, s, causal, batch, heads) per D:S:CAUSAL of spec: docs/targets.md's 16k tokens and model width 2048."""
    for c in spec.split(","):
        d, s, causal = (int(x) for x in c.split(":"))
        yield d, s, causal, 16384 // s, 2048 // d


def traced_call(lib, prefix, call, warmup):
    """call() warmup times, then once traced: (ms of that call, the buffer as [CTAS, SLOTS, EVENTS])."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    if getattr(lib, prefix + "_trace_reset")():
        raise RuntimeError(f"{prefix}_trace_reset failed")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    buf = np.zeros(CTAS * SLOTS * EVENTS, dtype=np.uint64)
    read = getattr(lib, prefix + "_trace_read")
    read.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rc = read(buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(buf.nbytes))
    if rc:
        raise RuntimeError(f"{prefix}_trace_read: CUDA error {rc}")
    return start.elapsed_time(end), buf.reshape(CTAS, SLOTS, EVENTS)
