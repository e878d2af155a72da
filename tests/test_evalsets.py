"""Evalset loading and validation (exact messages), rendering, scoring, calibration, `evalsets check`."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.commands import evalsets as evalsets_command
from harness.errors import UserError
from harness.evalsets import (
    load_evalsets,
    render_messages,
    render_plain,
)
from harness.metrics import score_item

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

QA_ROWS = [
    {"id": "q1", "question": "Where is Normandy?", "context": "Normandy is a region in France.", "answers": ["France"]},
    {"id": "q2", "question": "Who led the Normans?", "context": "Their leader was Rollo.", "answers": ["Rollo"]},
]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """Messages name paths relative to the working directory; the datasets cache goes to tmp."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    return path


def write_spec(path: Path, body: str) -> Path:
    path.write_text(body, encoding="utf-8")
    return path


def problems_of(paths) -> list[str]:
    with pytest.raises(UserError) as caught:
        load_evalsets(paths)
    return caught.value.problems


QA_SPEC = '''name = "faq"
task = "qa"
language = "en"
data = "faq.jsonl"
'''


# ---------------------------------------------------------------- reading data files


def test_malformed_json_line_is_reported_with_its_line(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    with open(tmp_path / "faq.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"id": "q3", "question": "x", "answers": ["a"]\n')
    assert problems_of([tmp_path / "faq.jsonl"]) == [
        "faq.jsonl:3: invalid JSON (Expecting ',' delimiter at column 47)"]


def test_non_utf8_file_is_reported_with_line_and_byte(tmp_path):
    (tmp_path / "latin.jsonl").write_bytes(
        b'{"id": "a", "question": "q", "answers": ["x"]}\n{"id": "b", "question": "caf\xe9", "answers": ["y"]}\n')
    assert problems_of(["latin.jsonl"]) == [
        "latin.jsonl:2: not valid UTF-8 (byte 0xe9 at column 29); save the file as UTF-8"]


@pytest.mark.parametrize("content", [b"", b"\n\n  \n"])
def test_empty_evalset(tmp_path, content):
    (tmp_path / "empty.jsonl").write_bytes(content)
    assert problems_of(["empty.jsonl"]) == ["empty.jsonl: empty evalset (no rows); add at least one item"]


def test_duplicate_ids_name_both_lines(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS + [dict(QA_ROWS[0], question="again?")])
    assert problems_of(["faq.jsonl"]) == [
        "faq.jsonl:3: duplicate id 'q1' (first at line 1); ids must be unique within a set"]


def test_missing_field_is_named(tmp_path):
    rows = QA_ROWS + [{"id": "q3", "question": "What?", "context": "c"}]
    write_jsonl(tmp_path / "faq.jsonl", rows)
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert problems_of(["faq.toml"]) == [
        "faq.jsonl:3: field 'answers' missing (QA rows need answers: a list of strings)"]


def test_answers_must_be_a_list_of_strings(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", [dict(QA_ROWS[0], answers="France"), dict(QA_ROWS[1], answers=[7])])
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert problems_of(["faq.toml"]) == [
        'faq.jsonl:1: field \'answers\' must be a list of strings, got str ("France"); write ["France"]',
        "faq.jsonl:2: field 'answers' item 1 is int, not a string",
    ]


def test_all_problems_across_sets_in_one_error(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", [{"id": "q1", "answers": ["x"]}])
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(UserError) as caught:
        load_evalsets(["faq.toml", "empty.jsonl", "missing.jsonl"])
    assert caught.value.problems == [
        "missing.jsonl: not found; pass a spec (.toml), a directory of specs, or a data file "
        "(.jsonl, .json, .csv, .parquet)",
        "faq.jsonl:1: field 'question' missing (QA rows need a question)",
        "empty.jsonl: empty evalset (no rows); add at least one item",
    ]
    assert str(caught.value).startswith("evalsets: 3 problems; fix them and rerun `quantgate evalsets check`")


# ---------------------------------------------------------------- the spec


def test_unknown_task(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", 'name = "faq"\ntask = "classification"\n')
    assert problems_of(["faq.toml"]) == ["faq.toml:2: task 'classification' unknown; use qa or generation"]


def test_unknown_metric_and_metric_of_the_wrong_task(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC + 'metrics = ["em", "bleu", "rougeL"]\n')
    assert problems_of(["faq.toml"]) == [
        "faq.toml:5: metric 'bleu' unknown; known metrics: em, f1, contains, rouge1, rouge2, rougeL",
        "faq.toml:5: metric 'rougeL' is not a qa metric; qa metrics: em, f1, contains",
    ]


def test_gate_must_be_among_the_metrics(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC + 'metrics = ["em"]\ngate = ["f1"]\n')
    assert problems_of(["faq.toml"]) == ["faq.toml:6: gate metric 'f1' is not in metrics; add it to metrics"]


def test_unknown_spec_key_suggests_the_close_one(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC + 'promt_template = "Q: {question}"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.toml:5: key 'promt_template' unknown (did you mean 'prompt_template'?); known keys: name, task, "
        "language, data, description, max_new_tokens, metrics, gate, system_prompt, prompt_template, "
        "abstain_phrases, columns, few_shot, group, calibration"]


def test_template_field_must_be_question_context_or_instruction(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC + 'prompt_template = "{context} {question} {answer}"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.toml:5: prompt_template field {answer} unknown; use {question}, {context} or {instruction}"]


def test_missing_data_file(tmp_path):
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert problems_of(["faq.toml"]) == [
        "faq.toml: data file faq.jsonl not found (key 'data' is relative to the spec file)"]


def test_invalid_toml(tmp_path):
    write_spec(tmp_path / "faq.toml", 'name = "faq\n')
    [problem] = problems_of(["faq.toml"])
    assert problem.startswith("faq.toml: invalid TOML (")


def test_duplicate_set_names(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    write_spec(tmp_path / "faq_copy.toml", QA_SPEC)
    assert problems_of(["faq.toml", "faq_copy.toml"]) == [
        "faq_copy.toml: set name 'faq' is already used by faq.toml; set names must be unique"]


def test_template_field_missing_in_a_row(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", [QA_ROWS[0], {"id": "q2", "question": "Who?", "answers": ["Rollo"]}])
    write_spec(tmp_path / "faq.toml", QA_SPEC + 'prompt_template = "{context}\\n{question}"\n')
    assert problems_of(["faq.toml"]) == ["faq.jsonl:2: field 'context' missing (the prompt template uses {context})"]


# ---------------------------------------------------------------- formats and layouts


def test_csv_with_column_mapping(tmp_path):
    (tmp_path / "faq.csv").write_text(
        'qid,q,passage,gold\n'
        '007,"Where is Normandy?","Normandy is a region\nin France.","[""France"", ""French Republic""]"\n'
        '2,Who led them?,Their leader was Rollo.,Rollo\n'
        '3,Is it known?,Nothing here.,[]\n',
        encoding="utf-8")
    write_spec(tmp_path / "faq.toml", '''task = "qa"
data = "faq.csv"
[columns]
id = "qid"
question = "q"
context = "passage"
answers = "gold"
''')
    [evalset] = load_evalsets(["faq.toml"])
    assert evalset.name == "faq"
    assert [(i.id, i.answers, i.line) for i in evalset.items] == [
        ("007", ("France", "French Republic"), 2), ("2", ("Rollo",), 4), ("3", (), 5)]
    assert evalset.items[0].context == "Normandy is a region\nin France."


def test_csv_missing_mapped_cell_names_field_and_column(tmp_path):
    (tmp_path / "faq.csv").write_text("qid,q,gold\n1,Where?,\n", encoding="utf-8")
    write_spec(tmp_path / "faq.toml", 'task = "qa"\ndata = "faq.csv"\n'
               '[columns]\nid = "qid"\nquestion = "q"\nanswers = "gold"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.csv:2: field 'answers' (column 'gold') missing (QA rows need answers: a list of strings)"]


def test_column_mapping_to_a_missing_column(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC + '[columns]\nquestion = "q"\n')
    problems = problems_of(["faq.toml"])
    assert problems[0] == ("faq.toml:5: columns.question = 'q' but faq.jsonl has no column 'q' "
                           "(it has: answers, context, id, question)")


def test_csv_ragged_row_names_its_line(tmp_path):
    (tmp_path / "faq.csv").write_text('id,question,answers\n1,Where?,Paris\n2,"Who, really?",Rollo,x\n',
                                      encoding="utf-8")
    assert problems_of(["faq.csv"]) == [
        "faq.csv:3: 4 cells but the header has 3 (check quoting: a cell with a comma or a line break needs "
        "double quotes)"]


def test_json_array_file(tmp_path):
    (tmp_path / "faq.json").write_text(json.dumps(QA_ROWS), encoding="utf-8")
    [evalset] = load_evalsets(["faq.json"])
    assert [i.id for i in evalset.items] == ["q1", "q2"]


def test_parquet_file(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame(QA_ROWS).to_parquet(tmp_path / "faq.parquet")
    [evalset] = load_evalsets(["faq.parquet"])
    assert evalset.task == "qa" and [i.id for i in evalset.items] == ["q1", "q2"]
    assert evalset.items[1].line == 2 and evalset.items[1].answers == ("Rollo",)


def test_parquet_problems_name_the_row(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame([QA_ROWS[0], dict(QA_ROWS[1], id="q1")]).to_parquet(tmp_path / "faq.parquet")
    assert problems_of(["faq.parquet"]) == [
        "faq.parquet:row 2: duplicate id 'q1' (first at row 1); ids must be unique within a set"]


def test_directory_of_specs_loads_sorted(tmp_path):
    specs = tmp_path / "sets"
    specs.mkdir()
    write_jsonl(specs / "b_qa.jsonl", QA_ROWS)
    write_spec(specs / "b_qa.toml", 'task = "qa"\n')  # data defaults to the spec's stem
    write_jsonl(specs / "a_sum.jsonl", [{"id": "s1", "context": "Long text.", "reference": "Short."}])
    write_spec(specs / "a_sum.toml", 'task = "generation"\ndata = "a_sum.jsonl"\n')
    assert [s.name for s in load_evalsets([specs])] == ["a_sum", "b_qa"]


def test_directory_without_specs(tmp_path):
    (tmp_path / "nothing").mkdir()
    assert problems_of(["nothing"]) == ["nothing: no *.toml evalset specs in this directory"]


def test_bare_jsonl_infers_qa_with_defaults(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    [evalset] = load_evalsets(["faq.jsonl"])
    assert (evalset.name, evalset.task, evalset.language, evalset.spec_path) == ("faq", "qa", "auto", None)
    assert evalset.metrics == ("em", "f1", "contains") and evalset.gate == ("f1",)
    assert evalset.max_new_tokens == 48
    assert "{context}" in evalset.prompt_template and "{question}" in evalset.prompt_template


def test_bare_jsonl_infers_generation_from_references(tmp_path):
    write_jsonl(tmp_path / "notes.jsonl", [
        {"id": "n1", "context": "The meeting moved to Friday.", "references": ["Meeting on Friday.", "Friday."]}])
    [evalset] = load_evalsets(["notes.jsonl"])
    assert evalset.task == "generation" and evalset.metrics == ("rouge1", "rouge2", "rougeL")
    assert evalset.gate == ("rougeL",) and evalset.items[0].references == ("Meeting on Friday.", "Friday.")


def test_bare_jsonl_without_answers_or_references(tmp_path):
    write_jsonl(tmp_path / "odd.jsonl", [{"id": "x", "text": "hello"}])
    assert problems_of(["odd.jsonl"]) == [
        "odd.jsonl: cannot tell the task: rows have neither 'answers' (qa) nor 'reference'/'references' "
        "(generation); add those fields or a spec with task = ..."]


def test_generation_reference_and_references_are_merged(tmp_path):
    write_jsonl(tmp_path / "s.jsonl", [
        {"id": "a", "context": "x", "reference": "one", "references": ["one", "two"]}])
    [evalset] = load_evalsets(["s.jsonl"])
    assert evalset.items[0].references == ("one", "two")


# ---------------------------------------------------------------- hashing and caching


def test_content_hash_follows_content_not_mtime(tmp_path):
    data = write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    first = load_evalsets(["faq.jsonl"])[0]
    stat = data.stat()
    os.utime(data, (stat.st_atime + 100, stat.st_mtime + 100))
    assert load_evalsets(["faq.jsonl"])[0].content_hash == first.content_hash
    # same size, same mtime, different content: a cache keyed by mtime would serve the old rows
    data.write_text(data.read_text().replace("France", "Franca"))
    os.utime(data, (stat.st_atime + 100, stat.st_mtime + 100))
    changed = load_evalsets(["faq.jsonl"])[0]
    assert changed.content_hash != first.content_hash
    assert changed.items[0].answers == ("Franca",)


def test_content_hash_includes_the_spec(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    before = load_evalsets(["faq.toml"])[0].content_hash
    write_spec(tmp_path / "faq.toml", QA_SPEC + "max_new_tokens = 16\n")
    assert load_evalsets(["faq.toml"])[0].content_hash != before


# ---------------------------------------------------------------- prompts and scores


FEW_SHOT_SPEC = QA_SPEC + '''system_prompt = "Be brief."
prompt_template = "Context: {context}\\nQuestion: {question}"
abstain_phrases = ["cannot be answered"]

[[few_shot]]
context = "Paris is in France."
question = "Where is Paris?"
answer = "France"
'''


def test_render_messages_with_system_and_few_shot(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", FEW_SHOT_SPEC)
    [evalset] = load_evalsets(["faq.toml"])
    assert render_messages(evalset, evalset.items[1]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Context: Paris is in France.\nQuestion: Where is Paris?"},
        {"role": "assistant", "content": "France"},
        {"role": "user", "content": "Context: Their leader was Rollo.\nQuestion: Who led the Normans?"},
    ]
    assert render_plain(evalset, evalset.items[1]) == (
        "Be brief.\n\n"
        "Context: Paris is in France.\nQuestion: Where is Paris?\nAnswer: France\n\n"
        "Context: Their leader was Rollo.\nQuestion: Who led the Normans?\nAnswer:")


def test_score_item_qa_and_unanswerable(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS + [
        {"id": "q3", "question": "Who?", "context": "Nothing.", "answers": []}])
    write_spec(tmp_path / "faq.toml", FEW_SHOT_SPEC)
    [evalset] = load_evalsets(["faq.toml"])
    q1, _, q3 = evalset.items
    assert score_item(evalset, q1, "In France.") == {"em": 0.0, "f1": pytest.approx(200 / 3), "contains": 100.0}
    assert score_item(evalset, q3, "This cannot be answered.") == {"em": 100.0, "f1": 100.0, "contains": 100.0}
    assert score_item(evalset, q3, "Rollo") == {"em": 0.0, "f1": 0.0, "contains": 0.0}


def test_score_item_auto_language_per_item(tmp_path):
    write_jsonl(tmp_path / "mixed.jsonl", [
        {"id": "zh", "question": "首都是哪里？", "context": "中国的首都是北京。", "answers": ["北京"]},
        {"id": "en", "question": "Capital?", "context": "The capital is Paris.", "answers": ["Paris"]}])
    [evalset] = load_evalsets(["mixed.jsonl"])
    zh, en = evalset.items
    assert score_item(evalset, zh, "北京。")["em"] == 100.0
    assert score_item(evalset, en, "The Paris!")["em"] == 100.0


def test_score_item_generation_chinese(tmp_path):
    write_jsonl(tmp_path / "zh_sum.jsonl", [{"id": "a", "context": "长文。", "reference": "今天天气不错"}])
    write_spec(tmp_path / "zh_sum.toml", 'task = "generation"\nlanguage = "zh"\n')
    [evalset] = load_evalsets(["zh_sum.toml"])
    assert score_item(evalset, evalset.items[0], "今天天气很好")["rouge1"] == pytest.approx(200 / 3)
    assert evalset.tokenizer == "char-cjk+word-latin"  # recorded in report.json evalsets.*.tokenizer


# ---------------------------------------------------------------- language and clusters

ZH_ROWS = [
    {"id": "z1", "question": "退款期限是多少天？", "context": "购买后三十天内可以申请退款。", "answers": ["三十天"]},
    {"id": "z2", "question": "客服几点上班？", "context": "客服每天早上九点上班。", "answers": ["九点"]},
]


def test_english_spec_over_chinese_text_is_refused(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", ZH_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert problems_of(["faq.toml"]) == [
        'faq.toml:3: language = "en" but 100% of the letters in faq.jsonl (questions, contexts, references) are '
        'CJK: English tokenization cannot score Chinese text; set language = "zh" (or "auto" for a mixed set)']


def test_chinese_spec_over_english_text_is_refused(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC.replace('"en"', '"zh"'))
    assert problems_of(["faq.toml"]) == [
        'faq.toml:3: language = "zh" but only 0% of the letters in faq.jsonl (questions, contexts, references) are '
        'CJK (a Chinese set has more than 30%); set language = "en" (or "auto" for a mixed set)']


def test_language_auto_and_matching_languages_load(tmp_path):
    write_jsonl(tmp_path / "zh.jsonl", ZH_ROWS)
    write_spec(tmp_path / "zh.toml", QA_SPEC.replace('"en"', '"zh"').replace("faq", "zh"))
    write_jsonl(tmp_path / "mixed.jsonl", ZH_ROWS + QA_ROWS)
    write_spec(tmp_path / "mixed.toml", QA_SPEC.replace('"en"', '"auto"').replace("faq", "mixed"))
    assert [s.language for s in load_evalsets(["zh.toml", "mixed.toml"])] == ["zh", "auto"]


def test_check_command_refuses_a_language_mismatch(tmp_path, capsys):
    write_jsonl(tmp_path / "faq.jsonl", ZH_ROWS)
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert evalsets_command.run(argparse.Namespace(paths=["faq.toml"], allow_outside_paths=False)) == 2
    err = capsys.readouterr().err
    assert 'faq.toml:3: language = "en" but 100% of the letters in faq.jsonl' in err and 'set language = "zh"' in err


SQUAD_STYLE = [
    {"id": f"q{i}", "doc": f"d{i // 3}", "question": f"Question {i}?", "context": f"Passage {i // 2}.",
     "answers": ["x"]} for i in range(6)
] + [{"id": "q6", "doc": 7, "question": "Without a context?", "answers": ["y"]}]
OPEN_SPEC = QA_SPEC + 'prompt_template = "Q: {question}"\n'  # a row may leave out the context


def test_items_cluster_by_context_by_default(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", SQUAD_STYLE)
    write_spec(tmp_path / "faq.toml", OPEN_SPEC)
    [evalset] = load_evalsets(["faq.toml"])
    assert evalset.cluster_by == "context" and evalset.group is None
    assert evalset.clusters() == {f"q{i}": f"Passage {i // 2}." for i in range(6)}  # q6: its own cluster


def test_spec_group_names_the_cluster_column(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", SQUAD_STYLE)
    write_spec(tmp_path / "faq.toml", OPEN_SPEC + 'group = "doc"\n')
    [evalset] = load_evalsets(["faq.toml"])
    assert evalset.cluster_by == "doc" and evalset.items[0].group == "d0"
    assert evalset.clusters() == {**{f"q{i}": f"d{i // 3}" for i in range(6)}, "q6": "7"}


def test_spec_group_problems(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", SQUAD_STYLE)
    write_spec(tmp_path / "faq.toml", OPEN_SPEC + 'group = "doc_id"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.toml:6: group = 'doc_id' but faq.jsonl has no column 'doc_id' (it has: answers, context, doc, id, "
        "question)"]
    write_jsonl(tmp_path / "faq.jsonl", [dict(SQUAD_STYLE[0], doc=None), dict(SQUAD_STYLE[1], doc=[1])])
    write_spec(tmp_path / "faq.toml", OPEN_SPEC + 'group = "doc"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.jsonl:1: field 'doc' missing (the spec's group names it; every row needs one)",
        "faq.jsonl:2: field 'doc' (the group) must be a string or an integer, got list",
    ]


# ---------------------------------------------------------------- the command


def test_check_command_lists_sets(tmp_path, capsys):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS + [{"id": "q3", "question": "Who?", "context": "-", "answers": []}])
    write_spec(tmp_path / "faq.toml", QA_SPEC)
    assert evalsets_command.run(argparse.Namespace(paths=["faq.toml"], allow_outside_paths=False)) == 0
    assert capsys.readouterr().out == (
        "faq: qa, en, 3 items (1 unanswerable), metrics em,f1,contains (gate f1) [faq.toml]\n")


def test_check_command_prints_problems_and_exits_2(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert evalsets_command.run(argparse.Namespace(paths=["empty.jsonl"], allow_outside_paths=False)) == 2
    assert capsys.readouterr().err == (
        "quantgate: error: evalsets: 1 problem; fix them and rerun `quantgate evalsets check`\n"
        "  - empty.jsonl: empty evalset (no rows); add at least one item\n")


def test_check_command_parses_its_arguments():
    parser = argparse.ArgumentParser()
    evalsets_command.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["evalsets", "check", "a.toml", "dir"])
    assert args.paths == ["a.toml", "dir"] and args.func is evalsets_command.run


# ---------------------------------------------------------------- bundled and shared sets


def test_bundled_evalsets_load():
    evalsets = load_evalsets([REPO / "evalsets"])
    assert evalsets and all(len(s.items) > 0 for s in evalsets)
    assert {s.language for s in evalsets} >= {"en", "zh"}
    for evalset in evalsets:
        item = evalset.items[0]
        assert render_messages(evalset, item)[-1]["role"] == "user"
        gold = (item.answers or item.references or ("",))[0]
        assert all(v == 100.0 for v in score_item(evalset, item, gold).values())


def test_shared_benchmark_specs_load_with_manifest_counts():
    if not (SHARED_DATA / "MANIFEST.json").exists():
        pytest.skip(f"{SHARED_DATA} not present")
    counts = {entry["file"]: entry["items"] for entry in json.loads((SHARED_DATA / "MANIFEST.json").read_text())}
    with pytest.raises(UserError, match="lies outside the spec's directory"):  # ../shared/data: only when asked
        load_evalsets([REPO / "benchmarks" / "shared_evalsets"])
    evalsets = {s.name: s for s in load_evalsets([REPO / "benchmarks" / "shared_evalsets"], allow_outside_paths=True)}
    assert set(evalsets) == {"squad_200", "squad_unanswerable_50", "cmrc_200", "cnndm_summeval_100"}
    for evalset in evalsets.values():
        assert len(evalset.items) == counts[evalset.data_path.name]
    assert all(not item.answers for item in evalsets["squad_unanswerable_50"].items)
    assert evalsets["cmrc_200"].language == "zh" and evalsets["cnndm_summeval_100"].task == "generation"
    assert all(len(item.references) >= 1 for item in evalsets["cnndm_summeval_100"].items)


# ---------------------------------------------------------------- rendering pinned to the fixture

RENDERING_FIXTURE = REPO / "tests" / "fixtures" / "evalset_rendering.json"


def _sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8")).hexdigest()


def bundled_rendering() -> dict:
    """Every bundled set as its spec loads it and as a bare data file (default template, "auto" language): its
    settings, content hash and items, with digests of each item's text fields and of its plain and chat prompts
    (the first item's prompts in full, to read). The fixture holds what harness/evalsets.py (one module, before
    the package) produced; the package must produce the same, byte for byte."""
    loads = [("spec", spec) for spec in sorted((REPO / "evalsets").glob("*.toml"))]
    loads += [("bare", data) for data in sorted((REPO / "evalsets").glob("*.jsonl"))]
    rendered = {}
    for how, path in loads:
        [evalset] = load_evalsets([path])
        first = evalset.items[0]
        rendered[f"{how}:{path.name}"] = {
            "name": evalset.name, "task": evalset.task, "language": evalset.language,
            "content_hash": evalset.content_hash, "prompt_template": evalset.prompt_template,
            "system_prompt": evalset.system_prompt, "few_shot": [vars(ex) for ex in evalset.few_shot],
            "max_new_tokens": evalset.max_new_tokens, "metrics": list(evalset.metrics),
            "gate": list(evalset.gate), "abstain_phrases": list(evalset.abstain_phrases),
            "group": evalset.group, "tokenizer": evalset.tokenizer, "clusters_sha256": _sha256(evalset.clusters()),
            "first_plain": render_plain(evalset, first), "first_messages": render_messages(evalset, first),
            "items": [{"id": item.id, "line": item.line, "group": item.group, "answers": list(item.answers),
                       "references": list(item.references),
                       "text_sha256": _sha256([item.question, item.context, item.instruction]),
                       "plain_sha256": _sha256(render_plain(evalset, item)),
                       "messages_sha256": _sha256(render_messages(evalset, item))} for item in evalset.items],
        }
    return rendered


def test_bundled_rendering_matches_the_fixture():
    expected = json.loads(RENDERING_FIXTURE.read_text(encoding="utf-8"))
    actual = bundled_rendering()
    assert list(actual) == list(expected)
    for key in expected:  # one set at a time: a failure names the set, and pytest's diff stays readable
        assert actual[key] == expected[key], key


# ---------------------------------------------------------------- the spec model, the package's imports


def test_spec_keys_are_the_models_fields():
    from harness.evalsets.spec import SPEC_KEYS, SpecTable

    assert sorted(SPEC_KEYS) == sorted(SpecTable.model_fields)


def test_wrong_keys_are_reported_unknown_first_then_in_check_order(tmp_path):
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    write_spec(tmp_path / "faq.toml", 'few_shot = 7\ncolumns = {x = "y", question = 1, context = 2}\n'
                                      'max_new_tokens = true\nmetrics = ["f1", 3]\nlanguage = 1\nname = "a b"\n'
                                      'task = "qa"\nmodle = 1\n')
    known = ("name, task, language, data, description, max_new_tokens, metrics, gate, system_prompt, "
             "prompt_template, abstain_phrases, columns, few_shot, group, calibration")
    assert problems_of(["faq.toml"]) == [
        f"faq.toml:8: key 'modle' unknown; known keys: {known}",
        "faq.toml:6: name 'a b' may only use letters, digits, '_', '-' and '.' (it names checks and files)",
        'faq.toml:5: key \'language\' must be a string ("en", "zh" or "auto"), got int',
        "faq.toml:3: key 'max_new_tokens' must be a positive integer, got bool",
        "faq.toml:4: key 'metrics' must be a list of metric names, got list",
        "faq.toml:2: columns.x: 'x' is not a row field; use one of id, question, context, instruction, answers, "
        "reference, references",
        "faq.toml:2: columns.question must be a column name (a string)",
        "faq.toml:2: columns.context must be a column name (a string)",
        "faq.toml:1: few_shot must be an array of tables ([[few_shot]] blocks)",
    ]


def test_a_wrong_key_counts_as_not_given_and_loading_goes_on(tmp_path):
    # max_new_tokens = 0 and the unknown column field are reported; the valid mapping context -> doc still applies
    write_jsonl(tmp_path / "faq.jsonl", [{"id": "q1", "question": "Where?", "doc": "In France.", "answers": [7]}])
    write_spec(tmp_path / "faq.toml", 'task = "qa"\nmax_new_tokens = 0\n[columns]\nbar = "x"\ncontext = "doc"\n')
    assert problems_of(["faq.toml"]) == [
        "faq.toml:2: key 'max_new_tokens' must be a positive integer, got 0",
        "faq.toml:3: columns.bar: 'bar' is not a row field; use one of id, question, context, instruction, answers, "
        "reference, references",
        "faq.jsonl:1: field 'answers' item 1 is int, not a string",
    ]


def test_importing_the_package_leaves_the_environment_alone():
    code = ("import os, sys; before = dict(os.environ); import harness.evalsets, harness.metrics; "
            "assert dict(os.environ) == before; assert 'datasets' not in sys.modules; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "HF_DATASETS_OFFLINE"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_loading_data_puts_datasets_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    write_jsonl(tmp_path / "faq.jsonl", QA_ROWS)
    load_evalsets(["faq.jsonl"])
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_the_shared_prefix_is_the_token_prefix_every_prompt_opens_with():
    from harness.evalsets.prompts import Prompt, shared_prefix_tokens

    def prompt(*ids):
        return Prompt("faq", str(ids), "text", len(ids), 4, ids)

    assert shared_prefix_tokens([prompt(1, 2, 3, 4), prompt(1, 2, 3, 9), prompt(1, 2, 7)]) == 2
    assert shared_prefix_tokens([prompt(5, 6), prompt(5, 6)]) == 2  # identical prompts share all of it
    assert shared_prefix_tokens([prompt(1, 2), prompt(3, 2)]) == 0
    assert shared_prefix_tokens([prompt(1, 2)]) == 0  # one prompt shares with nothing
    assert shared_prefix_tokens([prompt(1, 2), Prompt("faq", "x", "text", 2, 4)]) == 0  # no ids: not counted
