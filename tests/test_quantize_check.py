"""A saved artifact is reloaded and must generate before it is sealed: NaN logits or one token over and over is a
failed quantization with that reason. Real checkpoints, real loads."""

import json
import shutil

import pytest

from harness.quantize.smoke import ArtifactCheckFailed, check_artifact_generates

pytestmark = pytest.mark.slow


def _tiny_llama(tmp_path, demo_checkpoint, name: str, tamper):
    """A small random Llama with the demo model's tokenizer, saved after `tamper` edits its weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.loads((demo_checkpoint / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         max_position_embeddings=512, dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        tamper(model)
    target = tmp_path / name
    model.save_pretrained(target)
    for file in demo_checkpoint.iterdir():
        if file.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(file, target / file.name)
    return target


def test_a_real_checkpoint_passes(demo_checkpoint):
    result = check_artifact_generates(demo_checkpoint, source=demo_checkpoint)
    assert "Paris" in result.replies[0] and all(n > 0 for n in result.new_tokens)
    assert result.perplexity == result.source_perplexity and 1 < result.perplexity < 1000


def test_fluent_looking_noise_is_a_failed_quantization(tmp_path, demo_checkpoint):
    """Random weights emit varied tokens (no NaN, no repetition): only perplexity against the source tells."""
    noise = _tiny_llama(tmp_path, demo_checkpoint, "noise", lambda model: None)
    with pytest.raises(ArtifactCheckFailed, match=r"generates noise: perplexity [\d,.]+ on a probe text, "
                                                  r"[\d,]+x the source model's"):
        check_artifact_generates(noise, source=demo_checkpoint)


def test_nan_weights_are_a_failed_quantization(tmp_path, demo_checkpoint):
    def poison(model):
        model.model.layers[0].self_attn.o_proj.weight[0, 0] = float("nan")

    with pytest.raises(ArtifactCheckFailed, match="non-finite logits"):
        check_artifact_generates(_tiny_llama(tmp_path, demo_checkpoint, "nan", poison))


def test_one_token_over_and_over_is_a_failed_quantization(tmp_path, demo_checkpoint):
    def flatten(model):  # every logit equal: greedy picks token 0 at every step
        model.lm_head.weight.zero_()

    with pytest.raises(ArtifactCheckFailed, match="one token over and over"):
        check_artifact_generates(_tiny_llama(tmp_path, demo_checkpoint, "flat", flatten))


def test_an_unloadable_checkpoint_is_a_failed_quantization(tmp_path, demo_checkpoint):
    broken = tmp_path / "broken"
    shutil.copytree(demo_checkpoint, broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ArtifactCheckFailed, match="does not load"):
        check_artifact_generates(broken)


def test_llm_int8_threshold_of_the_recipe_reaches_bitsandbytes(tmp_path, demo_checkpoint):
    from harness.quantize.base import Recipe
    from harness.quantize.bnb_int8 import BnbInt8Quantizer

    source = _tiny_llama(tmp_path, demo_checkpoint, "source", lambda model: None)
    out = tmp_path / "int8"
    out.mkdir()
    BnbInt8Quantizer().quantize(source, Recipe("int8", bits=8, calibration_samples=0,
                                               extra={"llm_int8_threshold": 3.5}), [], out)
    saved = json.loads((out / "config.json").read_text())["quantization_config"]
    assert saved["load_in_8bit"] is True and saved["llm_int8_threshold"] == 3.5
