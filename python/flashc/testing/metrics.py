"""FLOP and byte counts of attention, and the error metrics of an output against the fp64 reference.

FLOPs follow docs/targets.md (and FlashAttention's benchmarks): forward 4·b·hq·sq·sk·d (two matmuls of
2·sq·sk·d each), halved for causal when sq = sk; a window (or causal with sq ≠ sk) counts the visible
(query, key) pairs exactly. Backward is 2.5× the forward (five matmuls instead of two). With a head dim of V
of its own (dv), the matmuls that touch V count dv: forward 2·(d + dv) per visible pair (S = QKᵀ, O = PV),
backward 2·(3d + 2dv) (S again, dQ, dK at d; dP = dO·Vᵀ, dV at dv). Bytes are what a kernel must move at
least: its inputs read once and its outputs written once (V, O, dO, dV at dv).
"""

from __future__ import annotations

import math

import numpy as np

DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}


def visible_pairs(sq: int, sk: int, causal: bool, window=None, align="bottom-right") -> int:
    """(query, key) pairs the mask lets through, for one sequence and head (flashc.h's rule)."""
    left, right = (-1, -1) if window is None else tuple(-1 if w is None or w < 0 else int(w) for w in window)
    if causal:
        right = 0
    if left < 0 and right < 0:
        return sq * sk
    shift = sk - sq if align == "bottom-right" else 0
    d = np.arange(sq, dtype=np.int64) + shift
    lo = np.zeros(sq, dtype=np.int64) if left < 0 else np.maximum(d - left, 0)
    hi = np.full(sq, sk, dtype=np.int64) if right < 0 else np.minimum(d + right + 1, sk)
    return int(np.maximum(hi - lo, 0).sum())


def flops(cfg, causal: bool, pass_: str, window=None) -> float:
    d, dv = cfg.head_dim, cfg.dv
    full = 2.0 * cfg.batch * cfg.heads * cfg.seqlen * cfg.sk * (d + dv)
    if causal and window is None and cfg.seqlen == cfg.sk:
        fwd = full / 2  # docs/targets.md's convention, as FlashAttention's benchmark counts it
    elif causal or window is not None:
        fwd = full * visible_pairs(cfg.seqlen, cfg.sk, causal, window) / (cfg.seqlen * cfg.sk)
    else:
        fwd = full
    bwd = 2.5 * fwd if dv == d else fwd * (3 * d + 2 * dv) / (d + dv)
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[pass_]


def bytes_moved(cfg, dtype: str, pass_: str) -> float:
    e = DTYPE_BYTES[dtype]
    rows_q, rows_k = cfg.batch * cfg.seqlen * cfg.heads, cfg.batch * cfg.sk * cfg.hkv
    q, o = rows_q * cfg.head_dim, rows_q * cfg.dv  # q and dq; o and dout
    k, v = rows_k * cfg.head_dim, rows_k * cfg.dv  # k and dk; v and dv
    lse = cfg.batch * cfg.heads * cfg.seqlen * 4
    fwd = e * (q + o + k + v) + lse  # read q k v, write o (+ lse)
    bwd = e * (2 * q + 2 * o + 2 * k + 2 * v) + lse  # read q k v o dout lse, write dq dk dv
    return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[pass_]


def errors(out, ref) -> dict:
    """max_abs, mean_abs, mse, max_rel, rel_l2 of out against ref (arrays, or lists of arrays taken as one
    vector). max_rel floors |ref| at 1e-3·rms(ref), so that entries near zero do not decide it alone. Any
    NaN or inf in out makes every metric NaN (and the row fail)."""
    if isinstance(out, (list, tuple)):
        out = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in out])
        ref = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in ref])
    out = np.asarray(out, dtype=np.float64).ravel()
    ref = np.asarray(ref, dtype=np.float64).ravel()
    if out.shape != ref.shape:
        raise ValueError(f"output has {out.size} elements, reference {ref.size}")
    nan = float("nan")
    if out.size == 0:
        return dict(max_abs=0.0, mean_abs=0.0, mse=0.0, max_rel=0.0, rel_l2=0.0, ref_max=0.0)
    if not np.all(np.isfinite(out)):
        return dict(max_abs=nan, mean_abs=nan, mse=nan, max_rel=nan, rel_l2=nan, ref_max=float(np.abs(ref).max()))
    diff = np.abs(out - ref)
    rms = math.sqrt(float(np.mean(ref * ref)))
    floor = max(1e-3 * rms, np.finfo(np.float64).tiny)
    norm = float(np.linalg.norm(ref))
    return dict(
        max_abs=float(diff.max()),
        mean_abs=float(diff.mean()),
        mse=float(np.mean(diff * diff)),
        max_rel=float((diff / np.maximum(np.abs(ref), floor)).max()),
        rel_l2=float(np.linalg.norm(diff) / norm) if norm > 0 else float(np.linalg.norm(diff)),
        ref_max=float(np.abs(ref).max()),
    )


def lse_max_abs(out_lse, ref_lse) -> float:
    """Max |lse − ref| over rows that see a key; rows that see none must be −inf in both."""
    a = np.asarray(out_lse, dtype=np.float64)
    r = np.asarray(ref_lse, dtype=np.float64)
    masked = np.isneginf(r)
    if np.any(np.isneginf(a) != masked) or np.any(np.isnan(a)):
        return float("nan")
    return float(np.abs(a[~masked] - r[~masked]).max()) if np.any(~masked) else 0.0


# Default pass bars on max_abs, relative to max(1, max|ref|): about 8 units of the last place of the
# dtype at the output's scale, plus room for the sums a kernel does in its own precision.
DEFAULT_TOLERANCE = {"f64": 1e-9, "f32": 1e-3, "f16": 1e-2, "bf16": 4e-2}


def passes(err: dict, tolerance: float) -> bool:
    return bool(np.isfinite(err["max_abs"])) and err["max_abs"] <= tolerance * max(1.0, err["ref_max"])
