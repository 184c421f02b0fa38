"""What the framework runs: flashc backends and the PyTorch peers, behind one interface.

An Impl says whether it can run a case (`skip` returns the reason when it cannot) and prepares a Runner per
pass: one callable per input set (the timed calls) and the outputs of the first set after a checked run.
Preparing does every conversion and allocation, so a timed call is the kernel call and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import ml_dtypes
import numpy as np

import flashc

from . import configs

NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f64": np.float64}
TORCH_SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
# The Philox key of a dropout case: fixed, so that a row's mask is the same run to run and the reference (cpu-ref
# from the same seed, or reference.Dropout's numpy Philox) draws the same one.
DROPOUT_SEED = 0x5EED


_torch_error = None  # the ImportError of the first failed `import torch`


def torch_or_none():
    global _torch_error
    try:
        import torch
    except ImportError as e:
        _torch_error = _torch_error or e
        return None
    return torch


def torch_missing_reason():
    """None when torch imports; else why not, in words: not installed, or installed but failing to import (a
    broken install, or a library clash), with the import's own error."""
    if torch_or_none() is not None:
        return None
    e = _torch_error
    if isinstance(e, ModuleNotFoundError) and e.name == "torch":
        return "torch is not installed (pip install torch)"
    return f"torch is installed but fails to import: {type(e).__name__}: {e}"


@dataclasses.dataclass
class Case:
    cfg: object  # configs.Config
    dtype: str
    causal: bool
    window: object = None
    scale: object = None
    align: str = "bottom-right"
    threads: int = 0  # host threads, 0 = all
    softcap: float = 0.0  # 0: none; else s <- cap·tanh(s / cap) before the softmax
    alibi: bool = False  # ALiBi with the paper's slopes for cfg.heads (configs.alibi_slopes)
    dropout: float = 0.0  # 0: none; else p, the mask keyed by dropout_seed (offset 0)
    dropout_seed: int = DROPOUT_SEED
    # A padded batch's boolean attn_mask with the causal mask folded in (configs.padding_mask), given to flashc and
    # SDPA alike as attn_mask [b, 1, sq, sk] with causal off: the same mask for both, as transformers passes it.
    padding: bool = False

    def attn_mask(self):
        """The boolean mask of a padding case (numpy [b, 1, sq, sk]), or None; built once per case."""
        if not self.padding:
            return None
        if getattr(self, "_mask", None) is None:
            self._mask = configs.padding_mask(self.cfg.batch, self.cfg.seqlen, self.cfg.sk, bool(self.causal))
        return self._mask

    @property
    def mask_causal(self) -> bool:
        """The causal flag of the calls: off where the padding mask carries it."""
        return bool(self.causal) and not self.padding

    @property
    def alibi_slopes(self):
        """float32 [heads_q], or None without ALiBi."""
        return configs.alibi_slopes(self.cfg.heads) if self.alibi else None

    def features(self) -> dict:
        """softcap=, alibi_slopes= and dropout_p= with seed= as flashc's calls take them, only those set (a plain
        case passes none). The backward gets the same seed, so it regenerates the forward's mask."""
        out = {}
        if self.softcap:
            out["softcap"] = self.softcap
        if self.alibi:
            out["alibi_slopes"] = self.alibi_slopes
        if self.dropout:
            out.update(dropout_p=self.dropout, seed=self.dropout_seed)
        return out


class Inputs:
    """One set of random inputs of a case, in the case's dtype (rounded once, so that every implementation
    and the reference see the same numbers): numpy arrays, and torch tensors per device on demand."""

    def __init__(self, case: Case, seed: int):
        cfg, rng = case.cfg, np.random.default_rng(seed)
        dt = NUMPY_DTYPES[case.dtype]

        def randn(*shape):
            return rng.standard_normal(shape, dtype=np.float32).astype(dt)

        self.q = randn(cfg.batch, cfg.seqlen, cfg.heads, cfg.head_dim)
        self.k = randn(cfg.batch, cfg.sk, cfg.hkv, cfg.head_dim)
        self.v = randn(cfg.batch, cfg.sk, cfg.hkv, cfg.dv)
        self.dout = randn(cfg.batch, cfg.seqlen, cfg.heads, cfg.dv)
        self._torch = {}

    def numpy(self):
        return self.q, self.k, self.v, self.dout

    def torch(self, device: str):
        """(q, k, v, dout) as torch tensors [b, s, h, d] on `device` (the host ones share numpy's memory)."""
        if device not in self._torch:
            import torch

            def conv(a):
                t = (
                    torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
                    if a.dtype == ml_dtypes.bfloat16
                    else torch.from_numpy(a)
                )
                return t.to(device) if device != "cpu" else t

            self._torch[device] = tuple(conv(a) for a in self.numpy())
        return self._torch[device]


def to_numpy64(x) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.detach().to("cpu").double().numpy()


def _poison(x) -> None:
    if isinstance(x, np.ndarray):
        x[...] = np.nan
    else:
        x.fill_(float("nan"))


@dataclasses.dataclass
class Runner:
    calls: list  # one per input set; each runs the pass once
    outputs: object  # () -> outputs of input set 0, as float64 numpy arrays
    poison: object = None  # () -> None: fill set 0's outputs with NaN before the checked run
    context: object = contextlib.nullcontext  # entered around the checked run and the timed loop


class Impl:
    name = ""
    device = "cpu"

    def skip(self, case: Case, pass_: str) -> str | None:
        return None

    def prepare(self, inputs: list, case: Case, pass_: str) -> Runner:
        raise NotImplementedError


# ---- flashc --------------------------------------------------------------------------------------------
class FlashcImpl(Impl):
    """One flashc backend. On the host it runs on the numpy arrays; on a GPU on the torch CUDA tensors."""

    def __init__(self, info: flashc.Backend, max_seqlen: int | None = None):
        self.info = info
        self.name = f"flashc:{info.name}"
        self.device = info.device
        self.max_seqlen = max_seqlen  # cpu-ref is O(s²) fp64 without tiling: too slow to time past this

    def skip(self, case, pass_):
        b, cfg = self.info, case.cfg
        if not b.usable:
            return f"not usable here: {b.why_unusable}"
        if case.dtype not in b.dtypes:
            return f"no {case.dtype} kernel (has {', '.join(b.dtypes)})"
        if not b.min_head_dim <= cfg.head_dim <= b.max_head_dim:
            return f"head_dim {cfg.head_dim} outside [{b.min_head_dim}, {b.max_head_dim}]"
        if pass_ == "bwd" and not b.has_backward:
            return "no backward"
        if self.max_seqlen is not None and max(cfg.seqlen, cfg.sk) > self.max_seqlen:
            return f"seqlen above --max-ref-seqlen {self.max_seqlen} (the fp64 oracle is too slow to time here)"
        return None

    def _arrays(self, inp: Inputs):
        return inp.numpy() if self.device == "cpu" else inp.torch("cuda")

    def _opts(self, case, mask):
        return dict(
            causal=case.mask_causal,
            window=case.window,
            scale=case.scale,
            backend=self.info.name,
            causal_align=case.align,
            threads=case.threads or None,
            **case.features(),
            **({} if mask is None else {"attn_mask": mask}),
        )

    def prepare(self, inputs, case, pass_):
        calls = []
        mask = case.attn_mask()
        if mask is not None and self.device != "cpu":  # where the tensors live, once
            import torch

            mask = torch.from_numpy(mask).to(self.device)
        for inp in inputs:
            q, k, v, dout = self._arrays(inp)
            fwd = flashc.prepare_forward(q, k, v, **self._opts(case, mask))
            if pass_ == "fwd":
                calls.append(fwd)
            else:
                o, lse = fwd()  # this backend's own forward gives the backward its o and lse
                calls.append(flashc.prepare_backward(dout, q, k, v, o, lse, **self._opts(case, mask)))
        first = calls[0]

        def poison():
            for x in first.outputs:
                _poison(x)

        def outputs():
            return tuple(to_numpy64(x) for x in first.outputs)

        return Runner(calls=calls, outputs=outputs, poison=poison)


# ---- PyTorch -------------------------------------------------------------------------------------------
class TorchSDPA(Impl):
    """torch.nn.functional.scaled_dot_product_attention: on the host with PyTorch's own choice ('cpu'), or on
    a GPU pinned to one backend through torch.nn.attention.sdpa_kernel ('flash', 'efficient', 'cudnn',
    'math'). The inputs are flashc's [b, s, h, d] tensors seen as [b, h, s, d] (a transposed view, as a
    FlashAttention user would pass them).

    ALiBi reaches SDPA as an explicit float attn_mask [1, heads_q, sq, sk] in the inputs' dtype (the bias, −inf
    where the causal mask hides a key: SDPA takes attn_mask or is_causal, not both), built before the timed
    calls; backends without a float mask (flash) decline it and their row says so. In bf16 the bias is rounded
    to bf16, so a peer's error there is larger than flashc's fused bias. Softcap cannot be a mask (it changes
    the scores themselves): SDPA rows skip it. V's own head dim is passed as it is; each backend takes it or
    declines."""

    def __init__(self, backend: str):
        self.backend = backend
        self.name = f"torch:{backend}"
        self.device = "cpu" if backend == "cpu" else "cuda"

    def skip(self, case, pass_):
        torch = torch_or_none()
        if torch is None:
            return torch_missing_reason()
        if self.device == "cuda" and not torch.cuda.is_available():
            return "no CUDA device"
        if case.window is not None:
            return "SDPA has no sliding window"
        if case.softcap:
            return "SDPA has no softcap (cap·tanh(s / cap) changes the scores; an additive attn_mask cannot express it)"
        if case.dropout:
            return "SDPA's dropout draws its mask from torch's generator, not flashc's Philox stream: nothing to check"
        if case.mask_causal and case.cfg.seqlen != case.cfg.sk and case.align != "top-left" and not case.alibi:
            return "SDPA's is_causal is top-left aligned; this case is bottom-right"
        return None

    def _context(self):
        if self.backend == "cpu":
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        which = {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION,
            "math": SDPBackend.MATH,
        }[self.backend]
        return sdpa_kernel(which)

    def _takes_gqa(self, kwargs, like) -> bool:
        """Whether this backend runs enable_gqa=True (a tiny call: PyTorch raises where its kernel has no GQA)."""
        import torch
        import torch.nn.functional as F

        q = torch.zeros(1, 2, 8, like.shape[-1], device=self.device, dtype=like.dtype)
        kv = torch.zeros(1, 1, 8, like.shape[-1], device=self.device, dtype=like.dtype)
        if "attn_mask" in kwargs:  # the probe's own mask, of the probe's shape
            kwargs = dict(kwargs, attn_mask=torch.zeros(1, 2, 8, 8, device=self.device, dtype=like.dtype))
        try:
            with self._context():
                F.scaled_dot_product_attention(q, kv, kv, **kwargs, enable_gqa=True)
            return True
        except RuntimeError:
            return False

    def _alibi_mask(self, case, inp):
        """ALiBi as SDPA's float attn_mask [1, heads_q, sq, sk] in the inputs' dtype, −inf where hidden; built
        head by head on the device (a float64 host copy of it would be 8 GiB at 16 heads × 8k × 8k)."""
        import torch

        from .reference import visible

        cfg, like = case.cfg, inp.torch(self.device)[0]
        i = torch.arange(cfg.seqlen, device=self.device, dtype=torch.float64)[:, None]
        j = torch.arange(cfg.sk, device=self.device, dtype=torch.float64)[None, :]
        dist = (i + (cfg.sk - cfg.seqlen) - j).abs()  # flashc.h: |i + sk − sq − j|
        hidden = ~torch.from_numpy(visible(cfg.seqlen, cfg.sk, case.causal, None, case.align)).to(self.device)
        mask = torch.empty(1, cfg.heads, cfg.seqlen, cfg.sk, device=self.device, dtype=like.dtype)
        for h, slope in enumerate(case.alibi_slopes.astype(np.float64)):
            mask[0, h] = (-slope * dist).masked_fill_(hidden, float("-inf")).to(like.dtype)
        return mask

    def prepare(self, inputs, case, pass_):
        import torch
        import torch.nn.functional as F

        cfg = case.cfg
        rep = cfg.heads // cfg.hkv
        kwargs = dict(is_causal=bool(case.causal), scale=case.scale)
        if case.alibi:
            kwargs = dict(is_causal=False, scale=case.scale, attn_mask=self._alibi_mask(case, inputs[0]))
        if case.padding:  # the same boolean mask flashc gets, on this device
            mask = torch.from_numpy(case.attn_mask()).to(self.device)
            kwargs = dict(is_causal=False, scale=case.scale, attn_mask=mask)
        # GQA: enable_gqa where the backend takes it, else K/V expanded to the query heads before the timed calls
        # (their backward's dK/dV then come per query head and are summed per group outside them).
        expand = rep > 1 and not self._takes_gqa(kwargs, inputs[0].torch(self.device)[0])
        if rep > 1 and not expand:
            kwargs["enable_gqa"] = True
        calls, firsts = [], []
        for inp in inputs:
            q, k, v, dout = inp.torch(self.device)
            if expand:
                k, v = (x.repeat_interleave(rep, dim=2) for x in (k, v))
            if pass_ == "fwd":
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                calls.append(lambda qt=qt, kt=kt, vt=vt: F.scaled_dot_product_attention(qt, kt, vt, **kwargs))
                firsts.append(None)
            else:
                leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
                with self._context():
                    o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves), **kwargs)
                g = dout.transpose(1, 2)
                calls.append(lambda o=o, leaves=leaves, g=g: torch.autograd.grad(o, leaves, g, retain_graph=True))
                firsts.append(leaves)
        first_call = calls[0]

        def outputs():
            with self._context():
                r = first_call()
            if pass_ == "fwd":
                return (to_numpy64(r.transpose(1, 2)),)
            if expand:  # [b, s, hq, d] -> the group sums [b, s, hkv, d]
                r = (r[0], *(x.unflatten(2, (cfg.hkv, rep)).sum(3) for x in r[1:]))
            return tuple(to_numpy64(x) for x in r)

        if self.backend == "cpu" and case.threads:
            torch.set_num_threads(case.threads)
        return Runner(calls=calls, outputs=outputs, context=self._context)


def flashc_impls(device: str, names=None, max_seqlen: int | None = None) -> list:
    """The flashc backends for a device (or the named ones, in the given order)."""
    known = {b.name: b for b in flashc.backends()}
    if names:
        missing = [n for n in names if n not in known]
        if missing:
            raise SystemExit(f"unknown flashc backend(s) {', '.join(missing)}; this library has: {', '.join(known)}")
        chosen = [known[n] for n in names]
    else:
        chosen = [b for b in known.values() if b.device == device]
    return [FlashcImpl(b, max_seqlen if b.name == "cpu-ref" else None) for b in chosen]


def peer_impls(device: str, gpu: bool = True, which=None) -> list:
    """PyTorch peers: torch:cpu always (it is skipped without torch), the GPU SDPA backends on a GPU run."""
    peers = [TorchSDPA("cpu")]
    if device == "cuda" and gpu:
        peers += [TorchSDPA(b) for b in TORCH_SDPA_BACKENDS]
    if which is not None:
        peers = [p for p in peers if p.backend in which]
    return peers


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        torch = torch_or_none()
        return torch.cuda.get_device_name() if torch is not None and torch.cuda.is_available() else "cuda"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return sys.platform
