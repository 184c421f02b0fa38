"""flashc as a transformers attention implementation (flashc.hf): small random-weight models on the CPU in fp32,
against attn_implementation="sdpa": logits, gradients, greedy generation, left padding, sliding windows."""

import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install transformers)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the models are built from configs: nothing is downloaded

import flashc.hf  # noqa: E402

from conftest import need_backend  # noqa: E402

SMALL = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA
    max_position_embeddings=64,
    initializer_range=0.3,  # large enough weights that attention is far from uniform
)


def pair(config_cls, **extra):
    """The same random model twice: with "sdpa" and with flashc."""
    name = flashc.hf.register()
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(config_cls(**SMALL, **extra), attn_implementation="sdpa")
    fc = transformers.AutoModelForCausalLM.from_config(config_cls(**SMALL, **extra), attn_implementation=name)
    fc.load_state_dict(ref.state_dict())
    assert fc.config._attn_implementation == name
    return ref.eval(), fc.eval()


def batch(left_pad=0):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :left_pad] = 0
    return ids, mask


def assert_logits_close(got, want, keep):
    err = ((got - want).abs() / want.abs().max())[keep.bool()].max().item()
    assert err <= 1e-5, f"max relative error {err:.3g}"


@pytest.fixture(autouse=True)
def _cpu():
    need_backend("cpu")


def test_register_name_is_one_transformers_accepts():
    assert flashc.hf.register() == "fc_attention"
    assert "flash" not in flashc.hf.NAME
    with pytest.raises(ValueError, match="special-cased"):
        flashc.hf.register("flashc")


@pytest.mark.parametrize("left_pad", [0, 5], ids=["no-padding", "left-padded"])
def test_llama_logits_match_sdpa(left_pad):
    ref, fc = pair(transformers.LlamaConfig)
    ids, mask = batch(left_pad)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = fc(ids, attention_mask=mask).logits
        unmasked = ref(ids).logits
    assert_logits_close(got, want, mask)
    if left_pad:  # the padding changes the answer, so a test that ignored it would fail
        assert (unmasked[1, -1] - want[1, -1]).abs().max() > 1e-2


def test_llama_training_step_gradients_match_sdpa():
    ref, fc = pair(transformers.LlamaConfig)
    ids, mask = batch(left_pad=3)
    for model in (ref, fc):
        model.train()
        model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
    for (name, p), q in zip(ref.named_parameters(), fc.parameters()):
        err = (p.grad - q.grad).abs().max().item() / max(p.grad.abs().max().item(), 1e-30)
        assert err <= 1e-4, f"{name}: relative gradient error {err:.3g}"


def test_llama_greedy_generation_with_left_padding_matches_sdpa():
    ref, fc = pair(transformers.LlamaConfig)
    ids, mask = batch(left_pad=4)
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(fc.generate(ids, **kw), ref.generate(ids, **kw))


@pytest.mark.parametrize("left_pad", [0, 3], ids=["no-padding", "left-padded"])
def test_sliding_window_model_matches_sdpa(left_pad):
    ref, fc = pair(transformers.MistralConfig, sliding_window=5)
    ids, mask = batch(left_pad)
    with torch.no_grad():
        want = ref(ids, attention_mask=mask).logits
        got = fc(ids, attention_mask=mask).logits
    assert_logits_close(got, want, mask)


@pytest.mark.parametrize("left_pad", [0, 5])
def test_padding_as_attn_mask_matches_sdpa(left_pad):
    """register(padding="mask"): a padded batch runs as attn_mask in eager mode (no unpadding), logits and
    gradients as SDPA's."""
    name = flashc.hf.register(padding="mask")
    assert name == "fc_attention_masked" and flashc.hf.register(padding="mask") == name
    ref, _ = pair(transformers.LlamaConfig)
    fc = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL), attn_implementation=name)
    fc.load_state_dict(ref.state_dict())
    ids, mask = batch(left_pad)
    mask[0, 10:] = 0 if not left_pad else 1  # right padding in sequence 0 too
    calls = []
    real = flashc.hf._masked
    flashc.hf._masked = lambda *a: calls.append(1) or real(*a)
    try:
        got = fc.eval()(ids, attention_mask=mask).logits
    finally:
        flashc.hf._masked = real
    assert calls, "the padded batch did not run as attn_mask"
    assert_logits_close(got, ref(ids, attention_mask=mask).logits, mask)
    with pytest.raises(ValueError, match="padding"):
        flashc.hf.register(padding="pad")


def test_caller_masks_run_as_attn_mask():
    """A 4-D mask of the caller's, boolean or additive, that is no padding mask runs as flashc's attn_mask and
    matches SDPA given the same mask."""
    ref, fc = pair(transformers.LlamaConfig)
    ids, _ = batch()
    custom = torch.ones(2, 1, 14, 14, dtype=torch.bool).tril()
    custom[:, :, 7:, :7] = False  # two blocks: not a padding mask
    additive = torch.zeros(2, 1, 14, 14).masked_fill(~custom, torch.finfo(torch.float32).min)
    with torch.no_grad():
        plain = fc(ids).logits
        for m in (custom, additive):
            got = fc(ids, attention_mask=m).logits
            assert_logits_close(got, ref(ids, attention_mask=m).logits, torch.ones(2, 14))
            assert (got - plain).abs().max() > 1e-3  # the mask is not dropped


def test_refusals():
    _, fc = pair(transformers.LlamaConfig)
    x = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="s_aux"):
        flashc.hf.attention_forward(fc.model.layers[0].self_attn, x, x, x, None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match="position_bias"):
        flashc.hf.attention_forward(fc.model.layers[0].self_attn, x, x, x, None, position_bias=torch.zeros(1))


def test_attention_dropout_in_training():
    """attention_dropout reaches flashc in training (drawn from torch's generator: the same seed, the same
    result) and not in evaluation, where the model matches SDPA."""
    ref, fc = pair(transformers.LlamaConfig, attention_dropout=0.5)
    ids, _ = batch()
    fc.train()
    out = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        out.append(fc(ids).logits.detach())
    assert torch.equal(out[0], out[1]) and (out[0] - out[2]).abs().max() > 1e-3
    fc.eval()
    with torch.no_grad():
        assert (out[0] - fc(ids).logits).abs().max() > 1e-3
        assert_logits_close(fc(ids).logits, ref(ids).logits, torch.ones(2, 14))


def test_gemma2_softcap_matches_eager():
    """Gemma-2's attention logit softcapping reaches flashc (transformers' eager attention applies it; its SDPA
    path does not)."""
    name = flashc.hf.register()
    cfg = dict(SMALL, head_dim=8, query_pre_attn_scalar=8, attn_logit_softcapping=1.5, sliding_window=6)
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**cfg), attn_implementation="eager")
    fc = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(**cfg), attn_implementation=name)
    fc.load_state_dict(ref.state_dict())
    ids, mask = batch(left_pad=3)
    with torch.no_grad():
        want = ref.eval()(ids, attention_mask=mask).logits
        got = fc.eval()(ids, attention_mask=mask).logits
        fc.config.attn_logit_softcapping = None
        for layer in fc.model.layers:
            layer.self_attn.attn_logit_softcapping = None
        uncapped = fc(ids, attention_mask=mask).logits
    assert_logits_close(got, want, mask)
    assert ((got - uncapped).abs()[mask.bool()]).max() > 1e-3  # the cap is not dropped


def test_llama_with_padding_compiles_in_one_graph():
    """With padding, torch.compile traces the mask into flashc's attn_mask: no graph break, the eager result."""
    _, fc = pair(transformers.LlamaConfig)
    ids, mask = batch(left_pad=3)
    torch._dynamo.reset()
    compiled = torch.compile(fc, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert_logits_close(compiled(ids, attention_mask=mask).logits, fc(ids, attention_mask=mask).logits, mask)


def test_llama_compiles_in_one_graph():
    """No graph break in a model that calls flashc (without padding: the mask is None)."""
    _, fc = pair(transformers.LlamaConfig)
    ids, _ = batch()
    torch._dynamo.reset()
    compiled = torch.compile(fc, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(ids).logits, fc(ids).logits)
