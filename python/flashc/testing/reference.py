"""The fp64 reference: attention forward and backward done plainly in float64 (with softcap, ALiBi, dropout and
a head dim of V of its own, as flashc.h defines them), and sampling for shapes where the full reference would be
too slow.

Three engines compute the same thing:
  numpy      — this file, materialised scores in numpy float64; independent of libflashc (the tests use it
               to check cpu-ref itself);
  cpu-ref    — flashc's own fp64 oracle backend, on float64 copies of the inputs (the default on the host);
  torch-fp64 — materialised scores in torch float64 on the GPU, with autograd for the backward (fast where
               a GPU is there).
All take the inputs as the kernel saw them (already rounded to its dtype) and upcast them to float64, so the
error measured is the kernel's alone.

Sampling: a (batch, kv-head) slice — one sequence, one key/value head and the query heads that read it — is
independent of every other. For a large shape the reference is computed on a few such slices, and the
kernel's output is compared on those slices only (Reference.slices says which); ALiBi's slopes are cut to the
slice's query heads.

Dropout: the keep mask is flashc.h's, bit for bit: Philox4x32-10 keyed by the seed, its counter made of the offset,
the element's row and group of 8 keys (one block, eight 16-bit halves, per 8 keys of a row) and the (sequence, query
head) pair of the whole call. cpu-ref draws it itself from the seed and offset when it computes the whole call; the
numpy and torch-fp64 engines, and cpu-ref on a sampled slice (a slice's own call would number its sequence and heads
from 0), get it from `Dropout.keep`, this file's numpy Philox (tests/python/test_bench_grids.py checks it against the
mask libflashc returns).
"""

from __future__ import annotations

import dataclasses

import numpy as np


def effective_scale(scale, head_dim: int) -> float:
    """The scale as the C API carries it (flashc_params.scale is a float): 1/sqrt(head_dim) or the given one,
    rounded to float32. The reference uses exactly that number, so fp64 results agree to fp64 rounding."""
    return float(np.float32(1.0 / np.sqrt(head_dim) if scale is None else scale))


# ---- masks ---------------------------------------------------------------------------------------------
def visible(sq: int, sk: int, causal: bool, window=None, align: str = "bottom-right") -> np.ndarray:
    """[sq, sk] bool: key j visible to query i (flashc.h: d = i + (sk − sq if bottom-right else 0);
    causal: j ≤ d; window (L, R): d − L ≤ j ≤ d + R, negative or None meaning unbounded)."""
    left, right = (-1, -1) if window is None else tuple(-1 if w is None or w < 0 else int(w) for w in window)
    if causal:
        right = 0
    d = np.arange(sq)[:, None] + (sk - sq if align == "bottom-right" else 0)
    j = np.arange(sk)[None, :]
    m = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        m &= j >= d - left
    if right >= 0:
        m &= j <= d + right
    return m


# ---- dropout -------------------------------------------------------------------------------------------
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 (Salmon et al., SC 2011; Random123's philox4x32 with R = 10) of 32-bit words held in uint64
    arrays (or ints, broadcast): (c0, c1, c2, c3) ← (hi(M1·c2) ⊕ c1 ⊕ k0, lo(M1·c2), hi(M0·c0) ⊕ c3 ⊕ k1, lo(M0·c0))
    ten times, the key bumped by the Weyl constants between rounds. Returns the four words, [4, n]."""
    w32 = np.uint64(0xFFFFFFFF)
    c = [np.asarray(x, dtype=np.uint64) & w32 for x in (c0, c1, c2, c3)]
    k0, k1 = (np.asarray(x, dtype=np.uint64) & w32 for x in (k0, k1))
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & w32, (k1 + np.uint64(0xBB67AE85)) & w32
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]  # < 2^64: no wrap
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & w32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & w32]
    return np.stack(np.broadcast_arrays(*c))


@dataclasses.dataclass(frozen=True)
class Dropout:
    """flashc.h's dropout of one call (p, seed, offset; heads_q of the whole call), seen from a part of it whose
    first sequence is b0 and first query head h0 (whole: the part is the call itself)."""

    p: float
    seed: int
    offset: int = 0
    heads_q: int = 1
    b0: int = 0
    h0: int = 0
    whole: bool = True

    @property
    def p32(self) -> float:
        return float(np.float32(self.p))  # the C API carries p as a float

    @property
    def scale(self) -> float:
        """1 / (1 − p): what a kept weight is multiplied by."""
        return 1.0 / (1.0 - self.p32)

    def part(self, b0: int, h0: int) -> Dropout:
        """The same call seen from sequence b0 and query head h0 of this part."""
        return dataclasses.replace(self, b0=self.b0 + b0, h0=self.h0 + h0, whole=False)

    @property
    def t16(self) -> int:
        """The 16-bit threshold ⌊p·2^16 + 1/2⌋ of the float32 p: a half below it drops its weight."""
        return int(np.floor(self.p32 * 65536.0 + 0.5))

    def keep(self, batch: int, heads: int, sq: int, sk: int) -> np.ndarray:
        """bool [batch, heads, sq, sk] of this part: element (i, j) of (sequence b, query head h) takes 16-bit half
        j mod 8 (half k: bits 16·(k mod 2) of word ⌊k/2⌋) of Philox4x32-10(counter (offset + i·⌈sk/8⌉ + ⌊j/8⌋ mod
        2^64, b·heads_q + h), key (seed mod 2^32, seed >> 32)) and is kept when that half is ≥ t16."""
        nb = (sk + 7) // 8
        n = np.uint64(self.offset % 2**64) + np.arange(sq * nb, dtype=np.uint64)  # wraps mod 2^64; row i: i·nb + x
        seed = self.seed % 2**64
        t = np.uint64(self.t16)
        out = np.empty((batch, heads, sq, sk), dtype=bool)
        for b in range(batch):
            for h in range(heads):
                bh = (self.b0 + b) * self.heads_q + self.h0 + h
                words = philox4x32_10(n, n >> np.uint64(32), bh % 2**32, bh >> 32, seed % 2**32, seed >> 32)
                halves = np.stack([words[k // 2] >> np.uint64(16 * (k % 2)) & np.uint64(0xFFFF) for k in range(8)])
                out[b, h] = halves.T.reshape(sq, nb * 8)[:, :sk] >= t
        return out


def _dropout_factor(dropout, q, k):
    """Z = keep / (1 − p) [b, hq, sq, sk] for q's batch and query heads, or None without dropout."""
    if dropout is None:
        return None
    return dropout.keep(q.shape[0], q.shape[2], q.shape[1], k.shape[1]) * dropout.scale


# ---- numpy engine --------------------------------------------------------------------------------------
def alibi_bias(slopes, sq: int, sk: int) -> np.ndarray:
    """[b|1, hq, sq, sk]: −slope·|i + sk − sq − j| (flashc.h's ALiBi, bottom-right whatever the causal alignment),
    for slopes [hq] or [b, hq] (float32 in the C API: the reference uses those float32 values)."""
    a = np.asarray(slopes, dtype=np.float32).astype(np.float64)
    a = a[None] if a.ndim == 1 else a
    dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :]).astype(np.float64)
    return -a[:, :, None, None] * dist[None, None]


def _scores(q, k, scale, mask, softcap=0.0, alibi_slopes=None):
    """S[b, h, i, j] = scale · q_i · k_j for query head h (k head h / group), capped (cap·tanh(S / cap)) and
    biased by ALiBi when asked, −inf where masked. Also returns K per query head and tanh(S / cap) (None
    without softcap), the factor the backward's dS needs."""
    hq, hkv = q.shape[2], k.shape[2]
    kk = np.repeat(k, hq // hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    t = None
    if softcap:
        t = np.tanh(s / softcap)
        s = softcap * t
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes, q.shape[1], k.shape[1])
    return np.where(mask if mask.ndim == 4 else mask[None, None], s, -np.inf), kk, t


def _visible(sq: int, sk: int, causal, window, align, attn_mask):
    """visible(), and a boolean attn_mask ([b|1, h|1, sq, sk], True: attend) on top of it where one is given."""
    mask = visible(sq, sk, causal, window, align)
    return mask if attn_mask is None else mask[None, None] & np.asarray(attn_mask, dtype=bool)


def numpy_forward(
    q,
    k,
    v,
    causal=False,
    window=None,
    scale=None,
    align="bottom-right",
    softcap=0.0,
    alibi_slopes=None,
    dropout=None,
    attn_mask=None,
):
    """(o, lse) in float64 for [b, s, h, d] arrays (v and o may have their own head dim); rows that see no key
    give o = 0, lse = −inf. dropout (a Dropout for these sequences and heads): o = (P ∘ Z)·V with Z = keep / (1 − p);
    lse stays the undropped softmax's. attn_mask: a boolean mask [b|1, h|1, sq, sk] (True: attend), or None."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    scale = effective_scale(scale, q.shape[3])
    mask = _visible(q.shape[1], k.shape[1], causal, window, align, attn_mask)
    s, _, _ = _scores(q, k, scale, mask, softcap, alibi_slopes)
    m = s.max(axis=3, keepdims=True)
    empty = np.isneginf(m)
    p = np.exp(s - np.where(empty, 0.0, m))
    rowsum = p.sum(axis=3, keepdims=True)
    p = p / np.where(empty, 1.0, rowsum)
    z = _dropout_factor(dropout, q, k)
    vv = np.repeat(v, q.shape[2] // v.shape[2], axis=2)
    o = np.einsum("bhij,bjhd->bihd", p if z is None else p * z, vv)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, rowsum)))[..., 0]
    return o, lse


def numpy_backward(
    dout,
    q,
    k,
    v,
    causal=False,
    window=None,
    scale=None,
    align="bottom-right",
    softcap=0.0,
    alibi_slopes=None,
    dropout=None,
    attn_mask=None,
):
    """(dq, dk, dv) in float64: dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)) (times 1 − tanh²(S / cap) with
    softcap: the derivative of cap·tanh(x / cap); ALiBi's bias is a constant), dQ = scale·dS·K,
    dK = scale·dSᵀ·Q, dV = Pᵀ·dO, with the query heads of a group summed into their key/value head. With dropout
    (flashc.h): O = (P ∘ Z)·V, dV = (P ∘ Z)ᵀ·dO and dS = P ∘ (Z ∘ dP − rowsum(dO ∘ O))."""
    dout, q, k, v = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v))
    scale = effective_scale(scale, q.shape[3])
    g = q.shape[2] // k.shape[2]
    mask = _visible(q.shape[1], k.shape[1], causal, window, align, attn_mask)
    s, kk, t = _scores(q, k, scale, mask, softcap, alibi_slopes)
    m = s.max(axis=3, keepdims=True)
    empty = np.isneginf(m)
    p = np.exp(s - np.where(empty, 0.0, m))
    p = p / np.where(empty, 1.0, p.sum(axis=3, keepdims=True))
    z = _dropout_factor(dropout, q, k)
    pz = p if z is None else p * z
    vv = np.repeat(v, g, axis=2)
    o = np.einsum("bhij,bjhd->bihd", pz, vv)
    dp = np.einsum("bihd,bjhd->bhij", dout, vv)
    if z is not None:
        dp = dp * z
    delta = np.einsum("bihd,bihd->bhi", dout, o)[..., None]
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = scale * np.einsum("bhij,bjhd->bihd", ds, kk)
    dk = scale * np.einsum("bhij,bihd->bjhd", ds, q)
    dv = np.einsum("bhij,bihd->bjhd", pz, dout)
    b, sk, hkv, d = k.shape
    dk = dk.reshape(b, sk, hkv, g, d).sum(axis=3)
    dv = dv.reshape(b, sk, hkv, g, v.shape[3]).sum(axis=3)
    return dq, dk, dv


# ---- slices --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Slice:
    """Sequence b and key/value head g, with the query heads g·G … (g+1)·G − 1 that read it."""

    b: int
    g: int
    group: int

    def q(self, x):  # [b, s, hq, d] → [1, s, G, d]
        return x[self.b : self.b + 1, :, self.g * self.group : (self.g + 1) * self.group]

    def kv(self, x):  # [b, s, hkv, d] → [1, s, 1, d]
        return x[self.b : self.b + 1, :, self.g : self.g + 1]

    def lse(self, x):  # [b, hq, s] → [1, G, s]
        return x[self.b : self.b + 1, self.g * self.group : (self.g + 1) * self.group]

    def mask(self, x):  # attn_mask [b|1, hq|1, sq, sk] → [1, G|1, sq, sk]; None stays None
        if x is None:
            return None
        x = x[self.b : self.b + 1] if x.shape[0] > 1 else x
        return x[:, self.g * self.group : (self.g + 1) * self.group] if x.shape[1] > 1 else x

    def slopes(self, x):  # ALiBi [hq] → [G], [b, hq] → [1, G]; None stays None
        if x is None:
            return None
        heads = slice(self.g * self.group, (self.g + 1) * self.group)
        return x[heads] if np.ndim(x) == 1 else x[self.b : self.b + 1, heads]


def choose_slices(batch: int, heads_q: int, heads_kv: int, samples: int | None, seed: int = 0) -> list:
    """All (batch, kv-head) slices, or `samples` of them spread over the batch and heads (always the first
    and, when there are two or more, the last, so the edges of the tensors are covered)."""
    group = heads_q // heads_kv
    pairs = [(b, g) for b in range(batch) for g in range(heads_kv)]
    if samples is None or samples >= len(pairs):
        return [Slice(b, g, group) for b, g in pairs]
    rng = np.random.default_rng(seed)
    picked = {0, len(pairs) - 1} if samples >= 2 else {0}
    rest = [i for i in range(len(pairs)) if i not in picked]
    picked |= set(rng.choice(rest, size=max(0, samples - len(picked)), replace=False).tolist()) if rest else set()
    return [Slice(*pairs[i], group) for i in sorted(picked)]


# ---- the reference of one case -------------------------------------------------------------------------
class Reference:
    """fp64 forward (o, lse) and backward (dq, dk, dv) of one set of inputs, on all slices or a sample.

    The arrays passed in are numpy arrays in the kernel's dtype (bf16 as ml_dtypes.bfloat16). Results are
    kept per slice; `compare_*` slice a kernel's full output the same way and return error metrics.
    """

    def __init__(
        self,
        q,
        k,
        v,
        dout,
        causal,
        window,
        scale,
        align,
        samples=None,
        engine="cpu-ref",
        seed=0,
        softcap=0.0,
        alibi_slopes=None,
        dropout_p=0.0,
        dropout_seed=0,
        dropout_offset=0,
        attn_mask=None,
    ):
        self.q, self.k, self.v, self.dout = q, k, v, dout
        self.attn_mask = attn_mask  # boolean [b|1, hq|1, sq, sk], or None
        self.opts = dict(causal=causal, window=window, scale=scale, align=align, softcap=softcap)
        self.alibi_slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, dtype=np.float32)
        b, _, hq, _ = q.shape
        self.dropout = Dropout(dropout_p, dropout_seed, dropout_offset, hq) if dropout_p else None
        self.slices = choose_slices(b, hq, k.shape[2], samples, seed)
        self.total_slices = b * k.shape[2]
        self.engine = engine
        self._fwd = None
        self._bwd = None

    @property
    def sampled(self) -> bool:
        return len(self.slices) < self.total_slices

    def describe(self) -> str:
        what = f"{self.engine} f64"
        if self.sampled:
            what += f", {len(self.slices)}/{self.total_slices} (batch, kv-head) slices"
            if self.dropout is not None and self.engine == "cpu-ref":
                what += " (numpy f64 there: dropout)"
        return what

    # Whole tensors at once when nothing is sampled (one call, all threads busy), else slice by slice.
    def _parts(self):
        if not self.sampled:
            return [None]
        return self.slices

    @staticmethod
    def _cut(part, x, kind):
        if part is None:
            return x
        return {"q": part.q, "kv": part.kv, "lse": part.lse, "slopes": part.slopes, "mask": part.mask}[kind](x)

    def _dropout(self, part):
        """The call's dropout seen from a part (None: whole tensors), or None without dropout."""
        if self.dropout is None or part is None:
            return self.dropout
        return self.dropout.part(part.b, part.g * part.group)

    def forward(self):
        if self._fwd is None:
            out = []
            for part in self._parts():
                q, k, v = self._cut(part, self.q, "q"), self._cut(part, self.k, "kv"), self._cut(part, self.v, "kv")
                a = self._cut(part, self.alibi_slopes, "slopes")
                m = self._cut(part, self.attn_mask, "mask")
                out.append(
                    _ENGINES[self.engine].forward(
                        q, k, v, **self.opts, alibi_slopes=a, dropout=self._dropout(part), attn_mask=m
                    )
                )
            self._fwd = out
        return self._fwd

    def backward(self):
        if self._bwd is None:
            out = []
            for part, (o, lse) in zip(self._parts(), self.forward()):
                q, k, v = self._cut(part, self.q, "q"), self._cut(part, self.k, "kv"), self._cut(part, self.v, "kv")
                dout = self._cut(part, self.dout, "q")
                a = self._cut(part, self.alibi_slopes, "slopes")
                drop = self._dropout(part)
                m = self._cut(part, self.attn_mask, "mask")
                out.append(
                    _ENGINES[self.engine].backward(
                        dout, q, k, v, o, lse, **self.opts, alibi_slopes=a, dropout=drop, attn_mask=m
                    )
                )
            self._bwd = out
        return self._bwd

    def pick_forward(self, o, lse=None):
        """The kernel's (o, lse) cut to the reference's slices, as lists aligned with forward()."""
        parts = self._parts()
        os_ = [np.asarray(self._cut(p, o, "q")) for p in parts]
        ls = None if lse is None else [np.asarray(self._cut(p, lse, "lse")) for p in parts]
        return os_, ls

    def pick_backward(self, dq, dk, dv):
        parts = self._parts()
        return [
            (np.asarray(self._cut(p, dq, "q")), np.asarray(self._cut(p, dk, "kv")), np.asarray(self._cut(p, dv, "kv")))
            for p in parts
        ]


# ---- engines -------------------------------------------------------------------------------------------
class _Numpy:
    @staticmethod
    def forward(q, k, v, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None, attn_mask=None):
        return numpy_forward(q, k, v, causal, window, scale, align, softcap, alibi_slopes, dropout, attn_mask)

    @staticmethod
    def backward(
        dout, q, k, v, o, lse, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None,
        attn_mask=None,
    ):  # fmt: skip
        return numpy_backward(dout, q, k, v, causal, window, scale, align, softcap, alibi_slopes, dropout, attn_mask)


class _CpuRef:
    """cpu-ref on float64 copies. With dropout on a sampled slice (dropout.whole False) the numpy engine computes
    it instead: cpu-ref would number the slice's sequence and heads from 0 and draw another mask."""

    @staticmethod
    def forward(q, k, v, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None, attn_mask=None):
        import flashc

        if dropout is not None and not dropout.whole:
            return numpy_forward(q, k, v, causal, window, scale, align, softcap, alibi_slopes, dropout, attn_mask)
        q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        return flashc.attention(
            q, k, v, causal=causal, window=window, scale=scale, causal_align=align, backend="cpu-ref", return_lse=True,
            **_features(softcap, alibi_slopes, dropout, attn_mask),
        )  # fmt: skip

    @staticmethod
    def backward(
        dout, q, k, v, o, lse, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None,
        attn_mask=None,
    ):  # fmt: skip
        import flashc

        if dropout is not None and not dropout.whole:
            return numpy_backward(
                dout, q, k, v, causal, window, scale, align, softcap, alibi_slopes, dropout, attn_mask
            )  # fmt: skip
        dout, q, k, v = (np.asarray(x, dtype=np.float64) for x in (dout, q, k, v))
        return flashc.attention_backward(
            dout, q, k, v, o, lse, causal=causal, window=window, scale=scale, causal_align=align, backend="cpu-ref",
            **_features(softcap, alibi_slopes, dropout, attn_mask),
        )  # fmt: skip


def _features(softcap, alibi_slopes, dropout=None, attn_mask=None) -> dict:
    """The feature keywords of a call, only where set: a libflashc without them still runs the plain cases."""
    out = {}
    if attn_mask is not None:
        out["attn_mask"] = np.asarray(attn_mask, dtype=bool)
    if softcap:
        out["softcap"] = softcap
    if alibi_slopes is not None:
        out["alibi_slopes"] = np.ascontiguousarray(alibi_slopes, dtype=np.float32)
    if dropout is not None:
        out.update(dropout_p=dropout.p, seed=dropout.seed, offset=dropout.offset)
    return out


class _TorchFp64:
    """Materialised scores in torch float64 (on the GPU when there is one), one (batch, kv-head) slice at a
    time, so that memory stays at one slice's scores (16k × 16k × 8 bytes per query head at most)."""

    @staticmethod
    def _one(
        q, k, v, causal, window, scale, align, dout=None, softcap=0.0, alibi_slopes=None, dropout=None, attn_mask=None
    ):
        import torch

        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        t = [torch.from_numpy(np.ascontiguousarray(np.asarray(x, dtype=np.float64))).to(dev) for x in (q, k, v)]
        for x in t:
            x.requires_grad_(dout is not None)
        q_, k_, v_ = t
        g = q_.shape[2] // k_.shape[2]
        sc = effective_scale(scale, q_.shape[3])
        mask = torch.from_numpy(_visible(q_.shape[1], k_.shape[1], causal, window, align, attn_mask)).to(dev)
        kk, vv = k_.repeat_interleave(g, dim=2), v_.repeat_interleave(g, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q_, kk) * sc
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if alibi_slopes is not None:
            s = s + torch.from_numpy(alibi_bias(alibi_slopes, q_.shape[1], k_.shape[1])).to(dev)
        s = s.masked_fill(~mask, float("-inf"))
        # Softmax written out so that a row that sees no key gives p = 0 and finite gradients.
        m = s.detach().amax(dim=3, keepdim=True)
        empty = torch.isneginf(m)
        e = torch.exp(s - m.masked_fill(empty, 0.0))
        rowsum = e.sum(dim=3, keepdim=True)
        p = e / rowsum.masked_fill(empty, 1.0)
        lse = (m + torch.log(rowsum.detach())).masked_fill(empty, float("-inf"))[..., 0]
        z = _dropout_factor(dropout, q, k)
        if z is not None:  # autograd through P ∘ Z gives flashc.h's dropout backward
            p = p * torch.from_numpy(z).to(dev)
        o = torch.einsum("bhij,bjhd->bihd", p, vv)
        if dout is None:
            return o.detach().cpu().numpy(), lse.detach().cpu().numpy()
        d = torch.from_numpy(np.ascontiguousarray(np.asarray(dout, dtype=np.float64))).to(dev)
        grads = torch.autograd.grad(o, (q_, k_, v_), d)
        return tuple(x.cpu().numpy() for x in grads)

    @staticmethod
    def _each_slice(q, k):
        group = q.shape[2] // k.shape[2]
        return [Slice(b, g, group) for b in range(q.shape[0]) for g in range(k.shape[2])]

    @staticmethod
    def _slice_dropout(dropout, sl):
        return None if dropout is None else dropout.part(sl.b, sl.g * sl.group)

    @classmethod
    def forward(
        cls, q, k, v, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None, attn_mask=None
    ):
        o = np.empty((*q.shape[:3], v.shape[3]), dtype=np.float64)
        lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float64)
        for sl in cls._each_slice(q, k):
            sl.q(o)[...], sl.lse(lse)[...] = cls._one(
                sl.q(q), sl.kv(k), sl.kv(v), causal, window, scale, align, None, softcap, sl.slopes(alibi_slopes),
                cls._slice_dropout(dropout, sl), sl.mask(attn_mask),
            )  # fmt: skip
        return o, lse

    @classmethod
    def backward(
        cls, dout, q, k, v, o, lse, causal, window, scale, align, softcap=0.0, alibi_slopes=None, dropout=None,
        attn_mask=None,
    ):  # fmt: skip
        dq, dk, dv = (np.empty(x.shape, dtype=np.float64) for x in (q, k, v))
        for sl in cls._each_slice(q, k):
            sl.q(dq)[...], sl.kv(dk)[...], sl.kv(dv)[...] = cls._one(
                sl.q(q), sl.kv(k), sl.kv(v), causal, window, scale, align, sl.q(dout), softcap, sl.slopes(alibi_slopes),
                cls._slice_dropout(dropout, sl), sl.mask(attn_mask),
            )  # fmt: skip
        return dq, dk, dv


_ENGINES = {"numpy": _Numpy, "cpu-ref": _CpuRef, "torch-fp64": _TorchFp64}
ENGINES = tuple(_ENGINES)
