"""The fidelity ladder's builders (#42): simulated round-to-nearest rungs (benchmarks/rtn_ladder.py) and decoys
(benchmarks/decoys.py), on a tiny bf16 Llama with tied embeddings (as the demo model) and a word-level tokenizer
built here, so nothing is fetched; and how benchmarks/fidelity_bench.py sorts and fits their rows."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from benchmarks.decoys import Decoy, _cjk_bytes, build_decoy, slice_token_ids  # noqa: E402
from benchmarks.fidelity_bench import (DEFAULT_RUNGS, fit, ladder_rows, parse_rungs, render_fidelity_bench,  # noqa: E402
                                       run_formats)
from benchmarks.rtn_ladder import LADDER, RtnScheme, build_rung, fake_quantize  # noqa: E402
from harness.candidates import check_against_baseline, not_runnable_here, read_candidate  # noqa: E402
from harness.errors import UserError  # noqa: E402

WORDS = ["<unk>", "<s>", "</s>", *"0123456789", "12", "北京", "中国", "是", "首都", "the", "capital", "of", "is",
         "answer", ".", ",", "?"]
DIGITS = tuple(range(3, 14))  # '0'..'9' and '12'
CJK = (14, 15, 16, 17)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """A tiny bf16 Llama, tied head, input widths 96 and 160 (not multiples of 128: short last groups)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    target = tmp_path_factory.mktemp("tiny-baseline")
    words = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(target)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=64, bos_token_id=1, eos_token_id=2, dtype="bfloat16")
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(target)
    return target


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for f in sorted(path.glob("*.safetensors")) for k, v in load_file(f).items()}


def _step(group, scheme: RtnScheme):
    levels = 2 ** scheme.bits - 1
    if scheme.symmetric:
        return group.abs().amax() / (levels / 2)
    return (group.amax().clamp(min=0) - group.amin().clamp(max=0)) / levels


@pytest.mark.parametrize("scheme", LADDER, ids=lambda s: s.name)
def test_rtn_weights_lie_on_the_grid(scheme):
    weight = (torch.randn(24, 160, generator=torch.Generator().manual_seed(3)) * 0.05).to(torch.bfloat16)
    restored = fake_quantize(weight, scheme)
    assert restored.dtype == torch.bfloat16 and restored.shape == weight.shape
    for start in range(0, 160, scheme.group_size):  # 160 = 128 + a short group of 32
        original, group = weight[:, start:start + scheme.group_size].float(), \
            restored[:, start:start + scheme.group_size].float()
        for row in range(weight.shape[0]):
            assert group[row].unique().numel() <= 2 ** scheme.bits
            half_step = _step(original[row], scheme) / 2
            # within half a step of the grid, plus the cast to bf16 (8 significant bits)
            assert (group[row] - original[row]).abs().max() <= half_step + original[row].abs().max() * 2 ** -8
    if scheme.bits <= 4:  # a coarse grid moves most weights
        assert (restored != weight).float().mean() > 0.5


def test_a_short_last_group_keeps_its_own_range():
    weight = torch.cat([torch.full((1, 128), 8.0), torch.linspace(-0.01, 0.01, 32).view(1, 32)], 1)
    restored = fake_quantize(weight, RtnScheme(4, 128, True))
    assert restored[0, 128:].unique().numel() > 8  # not rounded to 0 by the first group's scale of 8 / 7.5


def test_symmetric_and_asymmetric_grids_differ():
    weight = torch.rand(8, 64, generator=torch.Generator().manual_seed(4))  # all positive: half a symmetric grid idles
    sym, asym = fake_quantize(weight, RtnScheme(4, 32, True)), fake_quantize(weight, RtnScheme(4, 32, False))
    assert not torch.equal(sym, asym)
    assert (asym - weight).abs().mean() < 0.7 * (sym - weight).abs().mean()  # twice the levels over [0, max]
    assert (sym < 0).sum() == 0 and all(sym[row, :32].unique().numel() <= 8 for row in range(8))  # 0..7 steps


def test_weights_already_on_the_grid_come_back_bit_exact():
    steps = torch.arange(-8, 8, dtype=torch.float32).repeat(2, 2) * 2 ** -6  # -8..7 steps of 1/64, two groups of 32
    assert torch.equal(fake_quantize(steps.to(torch.bfloat16), RtnScheme(4, 32, False)), steps.to(torch.bfloat16))
    wide = torch.cat([torch.tensor([-128.0, 127.0]), torch.arange(-63.0, 63.0)]).view(1, 128) * 2 ** -10
    assert torch.equal(fake_quantize(wide.to(torch.bfloat16), RtnScheme(8, 128, False)), wide.to(torch.bfloat16))
    zeros = torch.zeros(3, 40, dtype=torch.bfloat16)
    assert torch.equal(fake_quantize(zeros, RtnScheme(3, 32, True)), zeros)
    # the symmetric grid has no +max (2^b levels, zero in the middle), so the same steps move there
    assert not torch.equal(fake_quantize(steps.to(torch.bfloat16), RtnScheme(4, 32, True)), steps.to(torch.bfloat16))


def test_a_rung_changes_only_the_linear_weights_and_is_judged_as_a_candidate(baseline, tmp_path):
    scheme = RtnScheme(3, 32, False)
    rung = build_rung(baseline, tmp_path / "rungs", scheme)
    before, after = _tensors(baseline), _tensors(rung)
    assert before.keys() == after.keys() and "lm_head.weight" not in after  # tied: the head is the embedding
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    linear = {name for name in before if name.endswith(("_proj.weight",))}
    assert changed == linear and len(linear) == 14  # 7 projections x 2 layers; embeddings and norms bit-exact
    assert all(after[name].dtype == torch.bfloat16 for name in after)
    config = json.loads((rung / "config.json").read_text())
    assert config["quantization_config"]["weight_bits"] == 3 and config["quantization_config"]["weight_symmetric"] \
        is False
    # the checks harness/candidates.py runs on --candidate before anything is loaded
    candidate = read_candidate(scheme.name, str(rung))
    assert check_against_baseline(candidate, json.loads((baseline / "config.json").read_text()), baseline,
                                  allow_tokenizer_mismatch=False) == []
    assert candidate.format_spec().bits == 16 and candidate.weight_format() is None  # planned as stored: 16-bit
    assert not_runnable_here(candidate, cuda=False) is None
    # vLLM does not know the method: the served backend refuses it with the reason, never --quantization <it>
    refusal = candidate.format_spec().serving_on("vllm").refusal
    assert refusal and "judge it with the transformers backend" in refusal
    # transformers skips the unknown method and loads the stored weights as they are
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(rung, dtype=torch.bfloat16)
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, after["model.layers.0.self_attn.q_proj.weight"])
    # cached by (source fingerprint, scheme) and deterministic
    stamp = (rung / "model.safetensors").stat().st_mtime_ns
    assert build_rung(baseline, tmp_path / "rungs", scheme) == rung
    assert (rung / "model.safetensors").stat().st_mtime_ns == stamp
    again = build_rung(baseline, tmp_path / "elsewhere", scheme)
    assert (again / "model.safetensors").read_bytes() == (rung / "model.safetensors").read_bytes()
    assert build_rung(baseline, tmp_path / "rungs", RtnScheme(3, 32, True)) != rung


def test_a_digit_decoy_changes_only_the_digit_rows_of_the_head(baseline, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert slice_token_ids(AutoTokenizer.from_pretrained(baseline), "digits") == DIGITS
    decoy = build_decoy(baseline, tmp_path / "rungs", Decoy("digits", "lm_head"))
    before, after = _tensors(baseline), _tensors(decoy)
    embed = before["model.embed_tokens.weight"]
    assert set(after) == set(before) | {"lm_head.weight"}  # untied, so the input embeddings stay the baseline's
    assert all(torch.equal(before[name], after[name]) for name in before)
    head = after["lm_head.weight"]
    differs = {i for i in range(len(WORDS)) if not torch.equal(head[i], embed[i])}
    assert differs == set(DIGITS)
    assert torch.equal(head[list(DIGITS)], embed[list(DIGITS[1:] + DIGITS[:1])])  # each digit takes the next's row
    assert json.loads((decoy / "config.json").read_text())["tie_word_embeddings"] is False
    ids = torch.tensor([[1, 23, 22, 14, 20, 21, 3, 4]])
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(baseline, dtype=torch.float32)(ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(decoy, dtype=torch.float32)(ids).logits
    others = [i for i in range(len(WORDS)) if i not in DIGITS]
    assert torch.allclose(theirs[..., others], ours[..., others], rtol=0, atol=1e-5)
    assert torch.allclose(theirs[..., list(DIGITS)], ours[..., list(DIGITS[1:] + DIGITS[:1])], rtol=0, atol=1e-5)
    read_candidate("decoy", str(decoy))  # accepted as a --candidate


def test_an_embedding_decoy_and_the_cjk_slice(baseline, tmp_path):
    from transformers import AutoTokenizer

    assert slice_token_ids(AutoTokenizer.from_pretrained(baseline), "cjk") == CJK
    decoy = build_decoy(baseline, tmp_path / "rungs", Decoy("cjk", "embed", "scale", 0.5))
    before, after = _tensors(baseline), _tensors(decoy)
    assert torch.equal(after["lm_head.weight"], before["model.embed_tokens.weight"])  # the head keeps its rows
    embed_before, embed_after = before["model.embed_tokens.weight"], after["model.embed_tokens.weight"]
    assert {i for i in range(len(WORDS)) if not torch.equal(embed_before[i], embed_after[i])} == set(CJK)
    assert torch.equal(embed_after[list(CJK)], (embed_before[list(CJK)].float() * 0.5).to(torch.bfloat16))
    config = json.loads((decoy / "config.json").read_text())["quantization_config"]
    assert (config["decoy_slice"], config["decoy_tokens"], config["decoy_examples"][0]) == ("cjk", 4, "北京")


def test_cjk_byte_pieces_of_a_byte_level_tokenizer():
    for piece, cjk in (("是".encode(), True), (b" " + "中国".encode(), True), ("是".encode() + b"\xe4\xba", True),
                       (b"\xe4", True), (b"\xa6", False), (b"\xe3\x81", False), ("ab".encode(), False),
                       ("是a".encode(), False), (b"\xe4\xba\xe4", False)):
        assert _cjk_bytes(piece) is cjk, piece


def _report_format(name, verdict, kl, delta, manifest):
    entry = {"kl": {"value": kl, "ci_low": kl * 0.9, "ci_high": kl * 1.1},
             "top1_agreement": {"value": 100 - 100 * kl, "ci_low": 99 - 100 * kl, "ci_high": 100 - 90 * kl},
             "items": 40, "status": "pass" if kl < 0.04 else "fail"}
    return name, {"role": "candidate", "status": "ok", "verdict": verdict, "rule": "fidelity", "reasons": [],
                  "artifact": {"manifest": manifest}, "fidelity": {"squad_200": entry},
                  "scores": {"squad_200": {"f1": {"gated": True, "delta": delta, "ci_low": delta - 2,
                                                  "ci_high": delta + 2, "margin": 2.0}}}}


def test_the_bench_sorts_rows_by_family_and_fits_without_the_decoys():
    simulated = {"engine": "external", "quantization_config": {"quant_method": "quantgate-simulated",
                                                               "simulated": "round-to-nearest"}}
    decoy = {"engine": "external", "quantization_config": {"quant_method": "quantgate-simulated",
                                                           "simulated": "decoy"}}
    report = {"formats": dict([("baseline", {"role": "baseline", "status": "ok"}),
                               _report_format("int8", "GO", 0.02, -0.4, {"engine": "bitsandbytes"}),
                               _report_format("rtn4-g32-sym", "NO-GO", 0.2, -4.0, simulated),
                               _report_format("decoy-digits-lmhead-permute", "GO", 0.01, -30.0, decoy)])}
    rows = ladder_rows(report)
    assert {r["format"]: r["family"] for r in rows} == {"int8": "format", "rtn4-g32-sym": "rtn",
                                                        "decoy-digits-lmhead-permute": "decoy"}
    fitted = fit(rows)
    assert fitted["points"] == 2  # the decoy's -15 margins at KL 0.01 would bend the slope
    assert fitted["drop_per_nat"] == pytest.approx((0.02 * 0.2 + 0.2 * 2.0) / (0.02 ** 2 + 0.2 ** 2))
    from benchmarks.fidelity_bench import decoy_verdicts

    text = "\n".join(render_fidelity_bench({"rows": rows, "fit": fitted, "items": 40, "command": "quantgate run",
                                            "wall_s": 60, "device": "cpu", "compute_dtype": "bfloat16",
                                            "rungs": list(DEFAULT_RUNGS), "decoys": decoy_verdicts(report)}))
    assert "**GO: decoy-digits-lmhead-permute**" in text and "| rtn4-g32-sym | squad_200 |" in text


def test_rungs_are_named_and_checked():
    assert parse_rungs("default") == DEFAULT_RUNGS and "gptq-extra" not in DEFAULT_RUNGS
    assert parse_rungs("decoys, rtn,fp8") == ("fp8", "rtn", "decoys")
    assert run_formats(parse_rungs("builtin,nvfp4,rtn")) == ("baseline", "int8", "gptq", "awq", "nvfp4", "nvfp4a16")
    with pytest.raises(UserError, match="choose from"):
        parse_rungs("rtn,int4")
