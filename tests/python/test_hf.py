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


def test_masks_flashc_cannot_represent_are_refused():
    _, fc = pair(transformers.LlamaConfig)
    ids, _ = batch()
    custom = torch.ones(2, 1, 14, 14, dtype=torch.bool).tril()
    custom[:, :, 7:, :7] = False  # two blocks: not a padding mask
    with pytest.raises(ValueError, match="not built by flashc's mask function"):
        fc(ids, attention_mask=custom)
    with pytest.raises(ValueError, match="dropout"):
        flashc.hf.attention_forward(fc.model.layers[0].self_attn, *(torch.randn(1, 4, 3, 8),) * 3, None, dropout=0.1)


def test_llama_compiles_in_one_graph():
    """No graph break in a model that calls flashc (without padding: the mask is None)."""
    _, fc = pair(transformers.LlamaConfig)
    ids, _ = batch()
    torch._dynamo.reset()
    compiled = torch.compile(fc, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(ids).logits, fc(ids).logits)
