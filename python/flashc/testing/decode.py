"""Decoding over a KV cache (issue #49): flashc.attention_with_kvcache beside SDPA given the same cache as dense
tensors, and the machine's copy bandwidth measured in the same run. Used by `bench/compare.py --grid decode`.

One shape is (batch, seqlen_new query rows, cache length L per sequence, heads_q/heads_kv, head_dim); a ragged
shape's sequences hold different lengths, sequence b of B the first L − ⌊b·L / 2B⌋ rows (L down to just over L/2, as
a serving batch's requests differ), and its rows' seqlen_k is L, the longest. Its cache is allocated once, dense
[batch, capacity, heads_kv, d] (capacity: L rounded up to the largest page size), and read three ways over the same
memory:
  dense       flashc with the dense cache (page_size 0);
  paged P     flashc with that memory seen as [batch·capacity / P, P, heads_kv, d] pages and a shuffled block
              table (each sequence's pages scattered over the pool, as a serving engine's allocator leaves them);
  SDPA        torch's scaled_dot_product_attention on the dense cache's first L rows, [b, h, L, d] views
              (enable_gqa for heads_q ≠ heads_kv; causal bottom-right through causal_lower_right for
              seqlen_new > 1), pinned to one backend; a ragged shape gives it a boolean attn_mask [b, 1, n, L] of
              each sequence's keys (bottom-right causal within its length), as a padded dense batch is run, and
              the efficient backend beside the given ones (flash takes no mask).
Each row is checked first against the fp64 reference on (batch, kv-head) slices of what it reads (the paged
rows gather their pages), then timed (L2 flushed between GPU calls). The calls attend over cache_seqlens (L, or
the ragged lengths) and append nothing (SDPA has no append: the rows time the same work). flashc writes into an
output allocated once (out=, poisoned with NaN before the check), as a decoding loop does; SDPA allocates its own
in each call.

gbps = bytes of K and V read (Σ cache_seqlens · heads_kv · 2·d · element size) ÷ time; the `copy` row's gbps is a
plain copy's read + write bandwidth (device to device on a GPU, memory to memory on the host), the ceiling
issue #49 measures against. speedup = the fastest SDPA row's time ÷ the row's, within one shape.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os

import numpy as np

from . import metrics
from .impls import NUMPY_DTYPES, to_numpy64, torch_missing_reason, torch_or_none
from .reference import choose_slices, numpy_forward
from .timing import time_calls

# Rows carry engine.COLUMNS' keys (bench/compare.py writes its own selection of them) and the page size.
EXTRA_COLUMNS = ["page_size"]
PAGE_SIZES = (16, 256)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    batch: int
    seqlen_new: int  # query rows per sequence: 1 decoding, a few for speculative decoding
    cache_len: int  # keys per sequence (cache_seqlens)
    heads: int
    heads_kv: int
    head_dim: int
    ragged: bool = False  # sequence b holds L − ⌊b·L / 2B⌋ keys, not L

    @property
    def name(self) -> str:
        name = f"decode-b{self.batch}-n{self.seqlen_new}-L{self.cache_len}-h{self.heads}:{self.heads_kv}"
        return name + "-ragged" if self.ragged else name

    def lengths(self) -> list:
        """Each sequence's keys (cache_seqlens): L, or ragged L − ⌊b·L / 2B⌋ for sequence b."""
        if not self.ragged:
            return [self.cache_len] * self.batch
        return [self.cache_len - b * self.cache_len // (2 * self.batch) for b in range(self.batch)]

    @property
    def capacity(self) -> int:
        """Rows per sequence in the cache: L rounded up to the largest page size (whole pages for every layout)."""
        return math.ceil(self.cache_len / max(PAGE_SIZES)) * max(PAGE_SIZES)

    def kv_bytes(self, dtype: str, rows: int = 0) -> int:
        """Bytes of K and V in `rows` rows per sequence (default: each sequence's length, what a call reads)."""
        keys = self.batch * rows if rows else sum(self.lengths())
        return keys * self.heads_kv * 2 * self.head_dim * metrics.DTYPE_BYTES[dtype]


def decode_grid(
    seqlens_new=(1, 4),
    batches=(1, 8, 64),
    cache_lens=(1024, 8192, 32768, 131072),
    heads=((32, 8), (64, 8), (32, 32)),
    head_dim=128,
    ragged=((8, 16384), (64, 16384), (8, 65536), (64, 65536)),
) -> list:
    """Issue #49's grid; the defaults are the GPU's, QUICK_GRID a host-sized one. ragged: (batch, L) shapes of
    different lengths per sequence (the first heads, one new row), after the rest; every sequence of the GPU's holds
    at least 8k keys."""
    return [
        DecodeConfig(b, n, L, hq, hkv, head_dim)
        for hq, hkv in heads
        for n in seqlens_new
        for b in batches
        for L in cache_lens
    ] + [DecodeConfig(b, 1, L, *heads[0], head_dim, ragged=True) for b, L in ragged]


QUICK_GRID = dict(seqlens_new=(1, 4), batches=(1, 3), cache_lens=(40, 300), heads=((4, 2), (4, 4)), head_dim=32,
                  ragged=((3, 300),))  # fmt: skip


# ---- one shape ---------------------------------------------------------------------------------------------------
class _Shape:
    """The inputs of one shape on one device: q, the dense cache and its first L rows as numpy or torch."""

    def __init__(self, cfg: DecodeConfig, dtype: str, device: str, seed: int):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.capacity = cfg.capacity
        self.rng = np.random.default_rng(seed)
        shape_q = (cfg.batch, cfg.seqlen_new, cfg.heads, cfg.head_dim)
        shape_c = (cfg.batch, self.capacity, cfg.heads_kv, cfg.head_dim)
        if device == "cpu":
            dt = NUMPY_DTYPES[dtype]
            self.q = self.rng.standard_normal(shape_q, dtype=np.float32).astype(dt)
            self.k = self.rng.standard_normal(shape_c, dtype=np.float32).astype(dt)
            self.v = self.rng.standard_normal(shape_c, dtype=np.float32).astype(dt)
            self.lens = np.array(cfg.lengths(), dtype=np.int32)
        else:  # generated on the device: a host copy of a large cache would take longer than the whole row
            import torch

            tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
            g = torch.Generator(device="cuda").manual_seed(seed)
            self.q = torch.randn(shape_q, generator=g, device="cuda", dtype=torch.float32).to(tdt)
            self.k = torch.randn(shape_c, generator=g, device="cuda", dtype=tdt)
            self.v = torch.randn(shape_c, generator=g, device="cuda", dtype=tdt)
            self.lens = torch.tensor(cfg.lengths(), dtype=torch.int32, device="cuda")

    def paged(self, page: int):
        """(k_pool, v_pool, block_table): the same memory as pages of `page` rows, a shuffled table."""
        cfg, n = self.cfg, self.capacity // page
        pool_shape = (cfg.batch * n, page, cfg.heads_kv, cfg.head_dim)
        table = self.rng.permutation(cfg.batch * n).astype(np.int32).reshape(cfg.batch, n)
        if self.device != "cpu":
            import torch

            table = torch.from_numpy(table).to("cuda")
        return self.k.reshape(pool_shape), self.v.reshape(pool_shape), table

    def logical(self, x, b: int, g: int, page: int, table) -> np.ndarray:
        """Sequence b's keys (its first cache_seqlens rows) of kv head g, float64 [len, d], read the way a layout
        reads them."""
        if page:  # x: the pool [blocks, page, hkv, d]; gathered where it lives, then one copy of [L, d]
            idx = table[b].astype(np.int64) if isinstance(table, np.ndarray) else table[b].long()
            seq = x[idx][:, :, g].reshape(-1, self.cfg.head_dim)
        else:
            seq = x[b, :, g]
        return to_numpy64(seq[: self.cfg.lengths()[b]])


def _reference_errors(shape: _Shape, out, page: int, k, v, table, samples) -> dict:
    """Errors of `out` [b, n, hq, d] against the fp64 reference on sampled (batch, kv-head) slices."""
    cfg = shape.cfg
    group = cfg.heads // cfg.heads_kv
    got, want = [], []
    q = shape.q
    for sl in choose_slices(cfg.batch, cfg.heads, cfg.heads_kv, samples):
        qs = to_numpy64(q[sl.b : sl.b + 1, :, sl.g * group : (sl.g + 1) * group])
        ks = shape.logical(k, sl.b, sl.g, page, table)[None, :, None]
        vs = shape.logical(v, sl.b, sl.g, page, table)[None, :, None]
        o, _ = numpy_forward(qs, ks, vs, causal=True)
        want.append(o)
        got.append(to_numpy64(out[sl.b : sl.b + 1, :, sl.g * group : (sl.g + 1) * group]))
    return metrics.errors(got, want)


def _sdpa_call(shape: _Shape, backend: str):
    """SDPA on the dense cache's first L rows, pinned to `backend` ('cpu': PyTorch's own choice)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    cfg = shape.cfg

    def t(x):
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) if x.dtype.name == "bfloat16" else (
                torch.from_numpy(x))  # fmt: skip
        return x

    q = t(shape.q).transpose(1, 2)
    k, v = (t(x)[:, : cfg.cache_len].transpose(1, 2) for x in (shape.k, shape.v))
    kwargs = dict(enable_gqa=cfg.heads != cfg.heads_kv)
    if cfg.ragged:  # row i of sequence b sees its keys j <= len_b - n + i (built once, outside the timed call)
        lens = torch.tensor(cfg.lengths(), device=q.device)[:, None, None]
        i = torch.arange(cfg.seqlen_new, device=q.device)[None, :, None]
        j = torch.arange(cfg.cache_len, device=q.device)[None, None, :]
        kwargs["attn_mask"] = (j <= lens - cfg.seqlen_new + i)[:, None]
    elif cfg.seqlen_new > 1:  # one row sees every key; more rows need the bottom-right causal mask
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(cfg.seqlen_new, cfg.cache_len)
    if backend == "cpu":
        ctx = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]  # fmt: skip

        def ctx():
            return sdpa_kernel(which)

    def call():
        with ctx():
            return F.scaled_dot_product_attention(q, k, v, **kwargs).transpose(1, 2)

    return call


def _copy_row(device: str, nbytes: int, opts) -> dict:
    """A plain copy of nbytes: read + write bytes ÷ time (the bandwidth ceiling of a call that reads its cache)."""
    if device == "cpu":
        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        calls = [lambda: np.copyto(dst, src)]
    else:
        import torch

        src = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        calls = [lambda: dst.copy_(src)]
    t = time_calls(calls, device, opts.warmup, opts.repeats, None, opts.min_repeats)
    ms = t["ms"]
    mib = nbytes / (1 << 20)
    where = "device to device" if device != "cpu" else "host memory to host memory"
    return dict(
        impl="copy",
        config=f"copy-{mib:g}MiB",
        ms=ms,
        repeats=t["repeats"],
        gbps=2 * nbytes / (ms * 1e-3) / 1e9,
        status="timed",
        note=f"{where} copy of {mib:g} MiB; gbps counts read + write",
    )


def run(
    cfgs, dtype: str, device: str, flashc_names, peers, opts, max_cache_gib: float, samples, threads=0, on_row=None
) -> list:
    """Rows of the decode grid: a copy row, then per shape flashc dense and paged, and the SDPA peers."""
    import flashc

    common = dict(date=datetime.date.today().isoformat(), device=opts.device_label, commit=opts.commit, world=1)
    rows = []

    def emit(row):
        row = {**common, **row}
        rows.append(row)
        if on_row:
            on_row(row)
        return row

    copy_bytes = (1 << 30) if device != "cpu" else (64 << 20)
    emit(dict(_copy_row(device, copy_bytes, opts), dtype="", threads=0, **{"pass": "copy"}))
    torch = torch_or_none()
    flush = opts.flush if device != "cpu" else None
    for cfg in cfgs:
        base = dict(
            dtype=dtype, batch=cfg.batch, heads_q=cfg.heads, heads_kv=cfg.heads_kv, seqlen_q=cfg.seqlen_new,
            seqlen_k=cfg.cache_len, head_dim=cfg.head_dim, causal=1, config=cfg.name, **{"pass": "fwd"},
        )  # fmt: skip
        if cfg.ragged:
            base["note"] = f"ragged: cache_seqlens {cfg.cache_len} down to {min(cfg.lengths())}"
        layouts = [0, *PAGE_SIZES]
        here = peers
        if cfg.ragged and peers and "cpu" not in peers and "efficient" not in peers:
            here = [*peers, "efficient"]  # flash takes no attn_mask
        impl_rows = [(f"flashc:{n}", p) for n in flashc_names for p in layouts] + [(f"torch:{p}", 0) for p in here]
        gib = cfg.kv_bytes(dtype, cfg.capacity) / (1 << 30)
        if gib > max_cache_gib:
            for name, page in impl_rows:
                emit(dict(base, impl=name, page_size=page, status="skipped",
                          note=f"cache {gib:.1f} GiB above --max-cache-gib {max_cache_gib:g}"))  # fmt: skip
            continue
        shape = _Shape(cfg, dtype, device, opts.seed)
        nbytes = cfg.kv_bytes(dtype)
        flop = 4.0 * sum(cfg.lengths()) * cfg.heads * cfg.seqlen_new * cfg.head_dim
        n_slices = len(choose_slices(cfg.batch, cfg.heads, cfg.heads_kv, samples))
        described = f"numpy f64, {n_slices}/{cfg.batch * cfg.heads_kv} (batch, kv-head) slices"
        host_threads = (threads or os.cpu_count() or 1) if device == "cpu" else 0
        shape_rows = []
        for name, page in impl_rows:
            row = dict(base, impl=name, page_size=page, threads=host_threads)
            try:
                if name.startswith("flashc:"):
                    k, v, table = shape.paged(page) if page else (shape.k, shape.v, None)
                    backend = name.split(":", 1)[1]

                    o_buf = shape.q.new_full(shape.q.shape, float("nan")) if hasattr(shape.q, "new_full") else \
                        np.full(shape.q.shape, np.nan, dtype=shape.q.dtype)  # fmt: skip

                    def call(q=shape.q, k=k, v=v, lens=shape.lens, table=table, backend=backend, n=host_threads,
                             o_buf=o_buf):  # fmt: skip
                        return flashc.attention_with_kvcache(
                            q, k, v, cache_seqlens=lens, block_table=table, causal=True, backend=backend,
                            threads=n or None, out=o_buf,
                        )  # fmt: skip
                else:
                    reason = torch_missing_reason()
                    if reason:
                        raise NotImplementedError(reason)
                    if device == "cuda" and not torch.cuda.is_available():
                        raise NotImplementedError("no CUDA device")
                    k, v, table = shape.k, shape.v, None
                    call = _sdpa_call(shape, name.split(":", 1)[1])
                out = call()
                err = _reference_errors(shape, out, page, k, v, table, samples)
                ok = metrics.passes(err, opts.tolerance or metrics.DEFAULT_TOLERANCE[dtype])
                t = time_calls([call], device, opts.warmup, opts.repeats, None, opts.min_repeats, between=flush)
                ms = t["ms"]
                row.update(
                    ms=ms, repeats=t["repeats"], tflops=flop / (ms * 1e-3) / 1e12, gbps=nbytes / (ms * 1e-3) / 1e9,
                    max_abs_err=err["max_abs"], rel_l2_err=err["rel_l2"], mean_abs_err=err["mean_abs"], mse=err["mse"],
                    max_rel_err=err["max_rel"], reference=described,
                )  # fmt: skip
                if name.startswith("flashc:"):
                    row["status"] = "pass" if ok else "FAIL"
                    if not ok:
                        row["note"] = f"max_abs_err {err['max_abs']:.3g} > tolerance"
                else:
                    row["status"] = "peer"
            except NotImplementedError as e:
                msg = str(e)
                row.update(status="skipped", note=msg if msg.startswith(("unsupported", "no CUDA", "torch")) else
                           f"unsupported: {msg}")  # fmt: skip
            except Exception as e:  # noqa: BLE001 — a peer that does not take the case is a skip; flashc's failure an error
                first = (str(e).strip().splitlines() or [""])[0][:200]
                if name.startswith("torch:"):
                    row.update(status="skipped", note=f"{type(e).__name__}: {first}")
                else:
                    row.update(status="error", note=f"{type(e).__name__}: {e}")
            shape_rows.append(row)
        peers_ms = [r["ms"] for r in shape_rows if r["impl"].startswith("torch:") and isinstance(r.get("ms"), float)]
        for r in shape_rows:
            if peers_ms and isinstance(r.get("ms"), float) and r["ms"] > 0:
                best = min(peers_ms)
                r["speedup"] = best / r["ms"]
                r["baseline"] = next(x["impl"] for x in shape_rows if x.get("ms") == best)
            emit(r)
        shape = None  # this shape's cache is freed before the next one is allocated
        if device != "cpu" and torch is not None:
            torch.cuda.empty_cache()
    return rows
