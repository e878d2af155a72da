"""harness/jsonl.py: one object per line, errors naming FILE:LINE."""

import json

import pytest

from harness.errors import UserError
from harness.jsonl import read_jsonl, read_jsonl_numbered


def test_reads_objects_skipping_blank_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1}\r\n\n   \n{"id": "b", "text": "x\\u2028y"}\n')
    assert read_jsonl(path) == [{"id": 1}, {"id": "b", "text": "x\u2028y"}]
    assert [n for n, _ in read_jsonl_numbered(path)] == [1, 4]


def test_a_raw_line_separator_inside_a_string_is_not_a_line_break(tmp_path):
    path = tmp_path / "s.jsonl"  # json.dumps(..., ensure_ascii=False) writes U+2028 as is; splitlines() splits on it
    path.write_text(json.dumps({"prediction": "a\u2028b\u0085c"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_jsonl(path) == [{"prediction": "a\u2028b\u0085c"}]


def test_bad_json_names_the_file_and_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2,\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"s\.jsonl:3: not valid JSON \(.+ at column \d+\); expected one JSON "
                                        r"object per line$"):
        read_jsonl(path)


def test_a_line_that_is_not_an_object(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"s\.jsonl:2: expected a JSON object, got an array; re-run it$"):
        read_jsonl(path, fix="re-run it")


def test_unreadable_and_not_utf8(tmp_path):
    with pytest.raises(UserError, match=r"missing\.jsonl: cannot read \(.+\); check the path"):
        read_jsonl(tmp_path / "missing.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": "caf\xe9"}\n')
    with pytest.raises(UserError, match=r"latin1\.jsonl:2: not valid UTF-8 \(byte 0xe9 at column 12\); save the file as "
                                        r"UTF-8$"):
        read_jsonl(path)
