"""Calibration never comes from the evaluated items: sources, the overlap check, and the report's account of it."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, quantgate
from harness.calibration import (BUNDLED_CORPUS, CalibrationSet, bundled_texts, check_overlap, choose_calibration,
                                 measure_overlap, read_text_file)
from harness.errors import UserError
from harness.evalsets import load_evalsets

BUNDLED_SETS = ROOT / "evalsets"


@pytest.fixture(scope="module")
def evalsets():
    return load_evalsets([BUNDLED_SETS])


def test_default_source_is_the_bundled_corpus_in_both_languages(evalsets):
    calibration = choose_calibration(None, evalsets, 32)
    assert calibration.source == "bundled corpus (evalsets/calibration)"
    assert len(calibration.texts) == 32 and calibration.languages == ("en", "zh")
    first_two = calibration.texts[:2]
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in first_two[0])  # en, zh, en, ...
    assert any("\u4e00" <= ch <= "\u9fff" for ch in first_two[1])


def test_bundled_corpus_is_long_enough_and_never_evaluated(evalsets):
    texts = bundled_texts(["en", "zh"])
    assert len(texts) >= 32
    en = read_text_file(BUNDLED_CORPUS / "en.jsonl", "corpus")
    assert min(len(t) for t in en) >= 1200  # several hundred tokens each (GPTQModel warns under ~256)
    overlap = measure_overlap(texts, evalsets)
    assert overlap.items_overlapping == 0 and overlap.calibration_ngram_share == 0.0
    # and none of the corpus is in an evalset's data file either, byte for byte
    data = "".join(p.read_text(encoding="utf-8") for p in BUNDLED_SETS.glob("*.jsonl"))
    assert not any(t[:200] in data for t in texts)


def test_english_only_sets_get_english_calibration(evalsets):
    english = [e for e in evalsets if e.language == "en"]
    calibration = choose_calibration(None, english, 8)
    assert calibration.languages == ("en",)
    assert not any("\u4e00" <= ch <= "\u9fff" for text in calibration.texts for ch in text)


def _item_texts(evalset) -> list[str]:
    """What the old default calibrated on: contexts, questions and gold references of the evaluated items."""
    return ["\n".join(filter(None, (i.instruction, i.context, i.question, *i.references))) for i in evalset.items]


def test_calibration_built_from_the_evaluated_items_is_refused_naming_set_and_ids(evalsets):
    summaries = next(e for e in evalsets if e.task == "generation" and e.language == "en")
    leaked = CalibrationSet("leaky.jsonl", tuple(_item_texts(summaries)[:5]))
    with pytest.raises(UserError) as caught:
        check_overlap(leaked, evalsets, allowed=False)
    message = str(caught.value)
    assert "overlaps 5 of" in message and f"{summaries.name}/{summaries.items[0].id}" in message
    assert "--allow-calibration-overlap" in message and "--calibration FILE" in message


def test_chinese_overlap_is_found_by_characters(evalsets):
    chinese = next(e for e in evalsets if e.language == "zh" and e.task == "qa")
    overlap = measure_overlap(_item_texts(chinese)[:3], evalsets)
    assert overlap.items_overlapping >= 3
    assert all(key.startswith(chinese.name + "/") for key in overlap.overlapping)


def test_a_single_reference_summary_in_the_calibration_counts(evalsets):
    summaries = next(e for e in evalsets if e.task == "generation" and e.language == "en")
    reference = summaries.items[3].references[0]
    texts = list(bundled_texts(["en"])[:7]) + ["Meeting notes.\n" + reference + "\nEnd of notes."]
    overlap = measure_overlap(texts, evalsets)
    assert f"{summaries.name}/{summaries.items[3].id}" in overlap.overlapping


def test_allowed_overlap_is_recorded(evalsets):
    summaries = next(e for e in evalsets if e.task == "generation")
    checked = check_overlap(CalibrationSet("x", tuple(_item_texts(summaries)[:2])), evalsets, allowed=True)
    assert checked.overlap.allowed and checked.overlap.items_overlapping == 2
    summary = replace(checked, token_counts=(300, 280)).summary(2)
    assert summary["overlap"]["items_overlapping"] == 2 and summary["tokens_min"] == 280


def test_calibration_file_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "cal.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    with pytest.raises(UserError, match=r"cal.jsonl:2: expected a JSON object with a 'text' field"):
        read_text_file(bad, "--calibration")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="no calibration texts"):
        read_text_file(empty, "--calibration")


def test_calibration_jsonl_with_a_raw_line_separator_in_a_string_is_one_text_per_line(tmp_path):
    path = tmp_path / "cal.jsonl"  # ensure_ascii=False writes U+2028 raw; str.splitlines() would split there
    texts = ["first\u2028text", "second text"]
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    assert read_text_file(path, "--calibration") == texts
    plain = tmp_path / "cal.txt"  # one text per line: split on newlines only
    plain.write_text("first\u2028text\r\n\nsecond text\n", encoding="utf-8")
    assert read_text_file(plain, "--calibration") == texts


def test_calibration_jsonl_lines_that_are_not_json_objects_name_the_line(tmp_path):
    bad = tmp_path / "cal.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "cut\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"cal\.jsonl:2: not valid JSON \(.+\); each line needs a JSON object with a "
                                        r"'text' field$"):
        read_text_file(bad, "--calibration")
    bad.write_text('{"text": "fine"}\n["a list"]\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"cal\.jsonl:2: expected a JSON object, got an array"):
        read_text_file(bad, "--calibration")


@pytest.mark.slow
def test_run_refuses_an_overlapping_calibration_file_before_quantizing(demo_cache, tmp_path, evalsets):
    summaries = next(e for e in evalsets if e.task == "generation" and e.language == "en")
    leaky = tmp_path / "traffic.jsonl"
    leaky.write_text("".join(json.dumps({"text": t}) + "\n" for t in _item_texts(summaries)))
    out = tmp_path / "out"
    gptq_artifacts = lambda: set((Path(demo_cache) / "artifacts").glob("gptq-*"))  # noqa: E731 (other tests' too)
    before = gptq_artifacts()
    result = quantgate("run", "--model", "demo", "--formats", "gptq", "--calibration", str(leaky), "--out", str(out),
                       cache=demo_cache, check_codes=(2,))
    assert "overlaps" in result.stderr and summaries.name in result.stderr and "Traceback" not in result.stderr
    assert not (out / "run.json").exists() and gptq_artifacts() == before


def _set_with_split(folder: Path, calibration: str) -> Path:
    folder.mkdir(exist_ok=True)
    rows = [{"id": f"q{i}", "context": f"Plan {i} includes {i} seats and priority support on weekdays.",
             "question": f"How many seats does plan {i} include?", "answers": [str(i)]} for i in range(3)]
    (folder / "faq.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "faq_calibration.jsonl").write_text("".join(
        json.dumps({"text": f"Traffic sample {i}: a customer asks how to rotate an API key on the admin page."})
        + "\n" for i in range(4)))
    spec = folder / "faq.toml"
    spec.write_text(f'name = "faq"\ntask = "qa"\nlanguage = "en"\ncalibration = "{calibration}"\n')
    return spec


def test_an_evalsets_own_calibration_split_is_used_before_the_bundled_corpus(tmp_path):
    evalsets = load_evalsets([_set_with_split(tmp_path / "sets", "faq_calibration.jsonl")])
    calibration = choose_calibration(None, evalsets, 32)
    assert calibration.source == "calibration split of faq (faq_calibration.jsonl)"
    assert len(calibration.texts) == 4 and calibration.texts[0].startswith("Traffic sample 0")
    # --calibration FILE still wins over the split
    traffic = tmp_path / "traffic.txt"
    traffic.write_text("one real prompt\nanother real prompt\n")
    assert choose_calibration(str(traffic), evalsets, 32).texts == ("one real prompt", "another real prompt")


def test_a_calibration_split_that_is_missing_or_is_the_data_itself_is_refused(tmp_path):
    with pytest.raises(UserError) as caught:
        load_evalsets([_set_with_split(tmp_path / "a", "nope.jsonl")])
    assert "faq.toml:4: calibration = 'nope.jsonl'" in " ".join([str(caught.value), *caught.value.problems])
    with pytest.raises(UserError) as caught:
        load_evalsets([_set_with_split(tmp_path / "b", "faq.jsonl")])
    assert "is the evaluated data file itself" in " ".join([str(caught.value), *caught.value.problems])


def test_allowed_overlap_keeps_a_format_from_go():
    from harness.decide import FormatOutcome, decide_format
    from harness.policy import Policy

    scores = {"s": {f"i{n}": {"f1": 50.0 + (n % 7)} for n in range(400)}}
    clean = FormatOutcome("gptq", items=scores, gates={"s": ["f1"]})
    assert decide_format(FormatOutcome("baseline", items=scores, gates={"s": ["f1"]}), clean, Policy()).verdict == "GO"
    leaked = FormatOutcome("gptq", items=scores, gates={"s": ["f1"]}, calibration_overlap=("s/i1", "s/i2"))
    decision = decide_format(FormatOutcome("baseline", items=scores, gates={"s": ["f1"]}), leaked, Policy())
    assert decision.verdict == "INCONCLUSIVE"
    assert any("calibration texts contain 2 evaluated item(s): s/i1, s/i2" in r for r in decision.reasons)
