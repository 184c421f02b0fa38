"""The shapes the framework and bench/compare.py run: the CUDA-core FA2 project's ten configurations, the
sequence-length sweep, and the grid of docs/targets.md (16k tokens, model width 2048)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    batch: int
    heads: int  # heads_q
    seqlen: int  # seqlen_q
    head_dim: int
    heads_kv: int = 0  # 0: = heads
    seqlen_k: int = 0  # 0: = seqlen
    head_dim_v: int = 0  # 0: = head_dim (V, O, dO and dV have their own head dim, as DeepSeek-V2/V3's 192/128)

    @property
    def hkv(self) -> int:
        return self.heads_kv or self.heads

    @property
    def sk(self) -> int:
        return self.seqlen_k or self.seqlen

    @property
    def dv(self) -> int:
        return self.head_dim_v or self.head_dim

    def label(self) -> str:
        kv = f"/{self.hkv}" if self.hkv != self.heads else ""
        s = f"{self.seqlen}x{self.sk}" if self.sk != self.seqlen else f"{self.seqlen}"
        d = f"{self.head_dim}:{self.dv}" if self.dv != self.head_dim else f"{self.head_dim}"
        return f"{self.name} ({self.batch}/{self.heads}{kv}/{s}/{d})"


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


# Issue #48's features measured side by side: (name, the Case fields it sets, V with its own head dim).
FEATURES = (
    ("plain", {}, False),
    ("softcap30", {"softcap": 30.0}, False),
    ("alibi", {"alibi": True}, False),
    ("dropout0.1", {"dropout": 0.1}, False),
    ("padmask", {"padding": True}, False),
    ("dv", {}, True),
)


def features_grid(tokens=16384, heads=16, head_dim=128, seqlens=(4096, 8192), dv_pair=(192, 128)) -> list:
    """Issue #48: (Config, features) per seqlen and feature, batch = max(1, tokens / seqlen), features the
    impls.Case fields of the row (softcap=, alibi=, dropout=; {} for plain); the "dv" rows take their Q/K and V
    head dims from dv_pair (DeepSeek-V2/V3's 192/128), the others head_dim."""
    out = []
    for s in seqlens:
        for name, features, own_dv in FEATURES:
            d, dv = dv_pair if own_dv else (head_dim, 0)
            label = f"{name}-d{d}:{dv}-s{s}" if own_dv else f"{name}-d{d}-s{s}"
            out.append((Config(label, max(1, tokens // s), heads, s, d, head_dim_v=dv), dict(features)))
    return out


def padding_mask(batch: int, sq: int, sk: int, causal: bool) -> np.ndarray:
    """A padded batch's boolean mask [batch, 1, sq, sk] (True: attend) as transformers hands it to SDPA: sequence
    b's last ((b mod 15) + 1)·sk/16 keys are padding (never all of them), and with `causal` the bottom-right causal
    mask is folded in (SDPA takes attn_mask or is_causal, not both, so the mask carries both)."""
    keep = np.ones((batch, 1, sq, sk), dtype=bool)
    for b in range(batch):
        keep[b, :, :, max(1, sk - ((b % 15) + 1) * sk // 16) :] = False
    if causal:
        keep &= np.tri(sq, sk, sk - sq, dtype=bool)[None, None]
    return keep


def alibi_slopes(heads: int) -> np.ndarray:
    """ALiBi's slopes (Press et al., 2022): 2^(−8(h+1)/H) for head h of H, in float32 (what the C API reads)."""
    return np.array([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], dtype=np.float32)


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
