"""flashc: exact FlashAttention forward and backward from libflashc (C and CUDA C), for numpy and PyTorch.

    import numpy as np, flashc
    q, k, v = (np.random.randn(2, 128, 8, 64).astype(np.float32) for _ in range(3))
    o, lse = flashc.attention(q, k, v, causal=True, return_lse=True)   # [2, 128, 8, 64], [2, 8, 128]
    dq, dk, dv = flashc.attention_backward(np.ones_like(o), q, k, v, o, lse, causal=True)

Arrays are passed to the C library by pointer and strides, never copied unless their layout cannot be
described to it. torch tensors (CPU or CUDA, on the current stream) work the same; flashc.torch adds
autograd (FlashAttentionFunction, the FlashAttention module). `python -m flashc.testing` checks and times
every backend against an fp64 reference and the PyTorch peers.

The library is the one installed in the package, or the one named by the environment variable
FLASHC_LIBRARY. numpy is an extra (pip install flashc[numpy]): flashc.torch needs only torch.
"""

from . import _lib
from ._api import (
    Backend,
    Call,
    attention,
    attention_backward,
    attention_varlen,
    attention_varlen_backward,
    backends,
    last_backend,
    prepare_backward,
    prepare_forward,
)
from ._lib import Error, InvalidArgumentError, OutOfMemoryError, RuntimeFailure, UnsupportedError
from .kvcache import attention_with_kvcache

__version__ = _lib.lib.flashc_version_string().decode()
library_path = _lib.path

__all__ = [
    "Backend",
    "Call",
    "Error",
    "InvalidArgumentError",
    "OutOfMemoryError",
    "RuntimeFailure",
    "UnsupportedError",
    "attention",
    "attention_backward",
    "attention_varlen",
    "attention_varlen_backward",
    "attention_with_kvcache",
    "backends",
    "last_backend",
    "library_path",
    "prepare_backward",
    "prepare_forward",
    "__version__",
]
