"""flashc as an attention implementation of Hugging Face transformers.

    import flashc.hf, transformers
    name = flashc.hf.register()                    # "fc_attention"
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=name)

register() adds an attention function (transformers.AttentionInterface) and a mask function
(transformers.AttentionMaskInterface) under one name; register(padding="mask") registers the variant that runs padded
batches as attn_mask in eager mode too (below), under its own name. The name holds no "flash": transformers takes any
attn_implementation containing "flash" for FlashAttention and tries to load flash_attn or a hub kernel for it
(transformers.utils.generic.is_flash_attention_requested), and one containing "sdpa" or "flex_attention"
for those implementations.

Masks. The mask function builds the same 4-D boolean mask as "sdpa" (transformers' sdpa_mask: None when the
attention is plainly causal or full) and remembers, on that mask, the 2-D key padding it was built from. The
attention function then
- without a mask: runs flashc on the [batch, seqlen, heads, head_dim] views of q, k, v, causal as the module
  says (FlashAttention's bottom-right diagonal, right for a KV cache), with the module's sliding window;
- with a mask that carries its padding, in eager mode (padding="varlen", the default): removes the padded tokens (the
  queries are the last q_len positions of the keys, as in self-attention with or without a cache), checks that the
  mask is exactly the causal / sliding-window pattern over the remaining tokens, and runs flashc's varlen path (no
  work on padding); padded query rows get output 0. The check costs one comparison of the mask per mask object
  (layers that share a mask share the check); it and the unpadding read the mask on the host. With
  padding="mask" such a mask runs as attn_mask, as below: no host reads and no copies, but the padded query rows are
  computed (the kernels skip the key blocks a padding mask removes whole);
- with any other mask (a 4-D mask of the caller's, boolean or additive; prefix-LM or bidirectional image-token
  overlays; packed sequences; a padding mask that fails the check), and with every mask while torch.compile
  traces: passes it as flashc's attn_mask, as SDPA takes it, so nothing is read on the host and a model with
  padding compiles in one graph too.
Attention dropout (dropout_p, drawn from torch's generator as SDPA's is) and Gemma-2's logit softcapping are passed
to flashc; attention sinks (s_aux) and position biases are refused.
"""

from __future__ import annotations

import torch

from . import torch as ft

NAME = "fc_attention"


def register(name: str | None = None, padding: str = "varlen") -> str:
    """Register flashc with transformers under `name` and return the name, for `attn_implementation=`. padding:
    how a padded batch runs in eager mode, "varlen" (unpadded; the default name "fc_attention") or "mask" (as
    attn_mask; the default name "fc_attention_masked"). On an H200 a padded Llama training batch ran at the same speed
    both ways (bench/transformers.py --padded: 1.244x and 1.242x SDPA); "mask" skips varlen's host reads of the
    padding (its offsets and a check per layer) and computes the padded rows. Under torch.compile every mask runs as
    attn_mask. Idempotent."""
    if padding not in ("varlen", "mask"):
        raise ValueError(f"flashc: padding={padding!r}; use 'varlen' or 'mask'")
    if name is None:
        name = NAME if padding == "varlen" else NAME + "_masked"
    if "flash" in name or "sdpa" in name or "flex_attention" in name or "/" in name:
        raise ValueError(
            f"flashc: attention implementation name {name!r} would be taken by transformers for another "
            "implementation (names containing 'flash', 'sdpa', 'flex_attention' or '/' are special-cased)"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward if padding == "varlen" else attention_forward_masked)
    AttentionMaskInterface.register(name, mask)
    return name


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, attention_mask=None, **kwargs):
    """transformers' sdpa_mask, with the key padding it was built from attached (for attention_forward)."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask

    m = sdpa_mask(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, **kwargs,
    )  # fmt: skip
    if m is not None and not torch.compiler.is_compiling():  # traced: the attention takes it as attn_mask
        device = kwargs.get("device", m.device)
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            keys = torch.ones(batch_size, kv_length, dtype=torch.bool, device=device)
        else:
            keys = padding[:, kv_offset : kv_offset + kv_length].to(device=device, dtype=torch.bool)
        m._flashc_keys = keys  # [batch, kv_length]: which keys are tokens (True) or padding
        m._flashc_checked = {}
        # Plainly causal with the last query on the last key, no padding: known from the arguments, not from the
        # mask's values, so that a compiled graph (where sdpa_mask cannot skip the mask) needs no data-dependent
        # check. A static cache (keys past the last query, not yet written) is not aligned so: checked.
        aligned = (
            all(isinstance(x, int) for x in (q_offset, kv_offset)) and q_offset + q_length == kv_offset + kv_length
        )
        plain = kwargs.get("mask_function", causal_mask_function) is causal_mask_function
        m._flashc_causal = padding is None and plain and aligned
    return m


def _window(sliding_window):
    # transformers' sliding window of w tokens: a query sees itself and the w - 1 before it (FlashAttention's
    # window_size=(w - 1, w - 1) with causal).
    return None if sliding_window is None else (sliding_window - 1, sliding_window - 1)


def _refuse(kwargs, position_bias=None):
    if kwargs.get("s_aux") is not None:
        raise ValueError("flashc: s_aux (attention sinks) is not supported by the flashc attention implementation")
    if position_bias is not None:
        raise ValueError("flashc: position_bias is not supported by the flashc attention implementation")


def _features(dropout, softcap) -> dict:
    """flashc's keywords for the module's dropout and softcap, only where set."""
    out = {}
    if dropout:
        out["dropout_p"] = float(dropout)
    if softcap:
        out["softcap"] = float(softcap)
    return out


def _masked(q, k, v, mask, scaling, feats):
    """The mask as flashc's attn_mask, as SDPA takes it: boolean (True: attend) or additive (in q's dtype)."""
    m = mask if mask.dtype == torch.bool else mask.to(q.dtype)
    return ft.attention(q, k, v, attn_mask=m, scale=scaling, **feats)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    is_causal: bool | None = None,
    position_bias: torch.Tensor | None = None,
    softcap: float | None = None,
    flashc_padding: str = "varlen",
    **kwargs,
):
    """transformers' attention interface: query [b, heads_q, q_len, d], key/value [b, heads_kv, kv_len, d]
    (GQA through heads_kv); returns (attn_output [b, q_len, heads_q, d], None). flashc_padding: register()'s
    padding, how a padded batch runs in eager mode."""
    _refuse(kwargs, position_bias)
    feats = _features(dropout, softcap)
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = _window(sliding_window)
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # [b, s, h, d] views, no copy
    if attention_mask is None:
        return ft.attention(q, k, v, causal=causal, window=window, scale=scaling, **feats), None
    if getattr(attention_mask, "_flashc_causal", False):
        return ft.attention(q, k, v, causal=True, window=window, scale=scaling, **feats), None
    keys = getattr(attention_mask, "_flashc_keys", None)
    if keys is None or torch.compiler.is_compiling() or flashc_padding == "mask":
        return _masked(q, k, v, attention_mask, scaling, feats), None
    b, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
    queries = keys[:, -q_len:]
    if not _padding_only(attention_mask, keys, queries, causal, sliding_window):
        return _masked(q, k, v, attention_mask, scaling, feats), None
    if bool(keys.all()):  # a mask over no padding (a window, or a cache): the dense path computes it
        return ft.attention(q, k, v, causal=causal, window=window, scale=scaling, **feats), None
    idx_q, idx_k = queries.reshape(-1).nonzero().squeeze(1), keys.reshape(-1).nonzero().squeeze(1)
    zero = torch.zeros(1, dtype=torch.int32)
    cu_q = torch.cat([zero, queries.sum(1).cumsum(0).to("cpu", torch.int32)])  # host offsets
    cu_k = torch.cat([zero, keys.sum(1).cumsum(0).to("cpu", torch.int32)])
    packed = [x.reshape(b * n, *x.shape[2:]).index_select(0, i) for x, n, i in ((q, q_len, idx_q), (k, kv_len, idx_k),
                                                                                (v, kv_len, idx_k))]  # fmt: skip
    out = ft.attention_varlen(*packed, cu_q, cu_k, causal=causal, window=window, scale=scaling, **feats)
    full = out.new_zeros(b * q_len, *out.shape[1:]).index_copy(0, idx_q, out)
    return full.view(b, q_len, *out.shape[1:]), None


def attention_forward_masked(module, query, key, value, attention_mask, *args, **kwargs):
    """attention_forward with padding="mask": a padded batch's mask runs as attn_mask in eager mode too."""
    return attention_forward(module, query, key, value, attention_mask, *args, flashc_padding="mask", **kwargs)


def _padding_only(m, keys, queries, causal, sliding_window) -> bool:
    """Whether the mask is what the varlen path computes: per sequence, over its tokens only, the causal diagonal
    at the bottom right and the sliding window, counted in tokens. Checked once per mask object and pattern."""
    pattern = (causal, sliding_window, queries.shape[1])
    if pattern in m._flashc_checked:
        return m._flashc_checked[pattern]
    kpos = keys.long().cumsum(1) - 1  # [b, kv]: a key's index among its sequence's tokens
    qpos = queries.long().cumsum(1) - 1
    shift = (keys.sum(1) - queries.sum(1))[:, None, None]  # bottom-right: the last query sees the last key
    diag = qpos[:, :, None] + shift  # [b, q, 1]: the row's diagonal
    want = keys[:, None, :].expand(-1, qpos.shape[1], -1)
    if causal:
        want = want & (kpos[:, None, :] <= diag)
    if sliding_window is not None:
        want = want & (kpos[:, None, :] > diag - sliding_window)
        if not causal:
            want = want & (kpos[:, None, :] < diag + sliding_window)
    got = m.to(torch.bool)
    rows = queries[:, :, None]  # padded queries' rows are not compared: their output is 0
    ok = got.dim() == 4 and got.shape[1] == 1 and bool(((got[:, 0] == want) | ~rows).all())
    m._flashc_checked[pattern] = ok
    return ok
