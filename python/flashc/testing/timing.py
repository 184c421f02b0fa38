"""Timing: the median of many repeats after warm-up; CUDA events on the GPU, perf_counter on the host.

A repeat times one call. The calls rotate over several prepared input sets (one callable each), so that no
implementation is timed on data it just left in the caches. Nothing is allocated between a start and an
end mark: the events are created before the loop, and the callables were prepared with their outputs.
"""

from __future__ import annotations

import statistics
import time


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def time_calls(
    calls,
    device: str = "cpu",
    warmup: int = 3,
    repeats: int = 30,
    budget_s: float | None = None,
    min_repeats: int = 3,
    between=None,
    warmup_s: float = 0.0,
) -> dict:
    """{'ms': median, 'repeats': n, 'samples': [ms, ...]} of `repeats` calls after `warmup` untimed ones (at
    least one; fewer when one call already exceeds budget_s).

    budget_s caps the timed loop: with the warm-up's speed, repeats shrink to fit (never below
    min_repeats), so a slow host implementation does not hold a run for minutes. `between` (GPU) is
    enqueued before each timed call, outside its events: an L2 flush.

    warmup_s > 0: the calls first run back to back for that long (after the counted warm-up), so that the
    timed ones see the steady state. On a GPU under its power cap that matters: an H100's SM clock falls once
    about a second of sustained load has filled its power average, so a short run reads a clock set by what
    ran in the second before it (bench/results/profile/hopper-power-2026-11-23.txt).
    """
    calls = list(calls)
    if not calls:
        raise ValueError("nothing to time")
    t0, done = time.perf_counter(), 0
    for i in range(max(1, warmup)):
        calls[i % len(calls)]()
        done += 1
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            break  # a call slower than the budget needs no more warming (a GPU call returns early: no effect)
    _sync(device)
    per_call = (time.perf_counter() - t0) / done
    if warmup_s > 0:
        _run_for(calls, device, warmup_s)
    n = repeats
    if budget_s is not None and per_call > 0:
        n = max(min_repeats, min(repeats, int(budget_s / per_call)))
    if device.startswith("cuda"):
        samples = _time_cuda(calls, n, between)
    else:
        samples = []
        for i in range(n):
            fn = calls[i % len(calls)]
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e3)
    return {"ms": statistics.median(samples), "repeats": n, "samples": samples}


def _run_for(calls, device: str, seconds: float) -> int:
    """Runs the calls in turn until `seconds` of wall time have passed (on the GPU, synchronising every few
    calls so that the queue never runs far ahead of the clock); returns how many ran."""
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        calls[n % len(calls)]()
        n += 1
        if n % 8 == 0:
            _sync(device)
    _sync(device)
    return n


def l2_flush(device: str):
    """A callable that evicts the GPU's L2 (a write of twice its size), or None on the host."""
    if not device.startswith("cuda"):
        return None
    import torch

    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    buf = torch.empty(2 * l2 // 4 + 1024, dtype=torch.int32, device="cuda")
    return buf.zero_


def _time_cuda(calls, n: int, between=None) -> list:
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    stream = torch.cuda.current_stream()
    for i in range(n):
        fn = calls[i % len(calls)]
        if between is not None:
            between()
        starts[i].record(stream)
        fn()
        ends[i].record(stream)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]
