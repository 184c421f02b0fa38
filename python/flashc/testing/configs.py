"""The shapes the framework and bench/compare.py run: the CUDA-core FA2 project's ten configurations, the
sequence-length sweep, and the grid of docs/targets.md (16k tokens, model width 2048)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    batch: int
    heads: int  # heads_q
    seqlen: int  # seqlen_q
    head_dim: int
    heads_kv: int = 0  # 0: = heads
    seqlen_k: int = 0  # 0: = seqlen

    @property
    def hkv(self) -> int:
        return self.heads_kv or self.heads

    @property
    def sk(self) -> int:
        return self.seqlen_k or self.seqlen

    def label(self) -> str:
        kv = f"/{self.hkv}" if self.hkv != self.heads else ""
        s = f"{self.seqlen}x{self.sk}" if self.sk != self.seqlen else f"{self.seqlen}"
        return f"{self.name} ({self.batch}/{self.heads}{kv}/{s}/{self.head_dim})"


# B/H/S/D, in the order and with the names of the CUDA-core FA2 project's experiments.
STANDARD = [
    Config("small-1", 1, 1, 128, 64),
    Config("small-2", 2, 4, 256, 64),
    Config("small-3", 2, 8, 256, 64),
    Config("edge-smallseq", 8, 16, 32, 64),
    Config("medium-1", 2, 8, 512, 64),
    Config("edge-nonpow2", 8, 16, 100, 64),
    Config("medium-2", 4, 8, 512, 64),
    Config("large-1", 2, 8, 1024, 64),
    Config("large-2", 4, 12, 1024, 64),
    Config("stress-1", 8, 16, 2048, 64),
]

SEQLENS = [128, 256, 512, 1024, 2048, 4096, 8192]


def seqlen_sweep(seqlens=SEQLENS, batch=4, heads=8, head_dim=64) -> list:
    return [Config(f"seqlen-{s}", batch, heads, s, head_dim) for s in seqlens]


def targets_grid(
    tokens=16384, width=2048, head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384)
) -> list:
    """docs/targets.md: batch = tokens / seqlen, heads = width / head_dim."""
    return [Config(f"d{d}-s{s}", tokens // s, width // d, s, d) for d in head_dims for s in seqlens]


# (name, query heads, kv heads, head dim) from the public model cards (config.json of each).
MODELS = (
    ("llama3-8b", 32, 8, 128),
    ("llama3-70b", 64, 8, 128),
    ("mistral-7b", 32, 8, 128),
    ("qwen2.5-7b", 28, 4, 128),
    ("qwen2.5-0.5b", 14, 2, 64),
    ("gemma2-9b", 16, 8, 256),
    ("phi3-mini", 32, 32, 96),
    ("gpt2-small", 12, 12, 64),
    ("falcon-7b-mqa", 71, 1, 64),
)


def models_grid(tokens=16384, seqlens=(1024, 4096, 8192, 32768), models=MODELS) -> list:
    """Issue #46's models grid: each model's heads at each seqlen, batch = max(1, tokens / seqlen)."""
    return [Config(f"{name}-s{s}", max(1, tokens // s), hq, s, d, hkv) for name, hq, hkv, d in models for s in seqlens]


def parse(spec: str) -> Config:
    """'B/H/S/D', 'B/HQ:HKV/S/D' or 'B/H/SQ:SK/D' (a custom configuration from the command line)."""
    parts = spec.split("/")
    if len(parts) != 4:
        raise ValueError(f"config {spec!r} is not B/H/S/D")
    try:
        b = int(parts[0])
        hq, _, hkv = parts[1].partition(":")
        sq, _, sk = parts[2].partition(":")
        d = int(parts[3])
        cfg = Config(spec, b, int(hq), int(sq), d, int(hkv or 0), int(sk or 0))
    except ValueError:
        raise ValueError(f"config {spec!r} is not B/H/S/D with integers (H may be HQ:HKV, S may be SQ:SK)") from None
    if min(cfg.batch, cfg.heads, cfg.seqlen, cfg.head_dim, cfg.hkv, cfg.sk) < 1 or cfg.heads % cfg.hkv:
        raise ValueError(f"config {spec!r}: sizes must be >= 1 and HQ a multiple of HKV")
    return cfg
