import json

import pytest

from harness.errors import UserError
from harness.source import fingerprint, resolve_source


def test_missing_model_path(tmp_path):
    with pytest.raises(UserError, match="no such file or directory"):
        resolve_source(str(tmp_path / "nope"))


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="no weights"):
        resolve_source(str(tmp_path))


def test_directory_without_config(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        resolve_source(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    with pytest.raises(UserError, match="must be a .gguf"):
        resolve_source(str(path))


def test_gguf_of_unsupported_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UserError, match="GGUF architecture 'rwkv' is not supported"):
        resolve_source(str(path))


def test_unreadable_gguf(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF-not-really")
    with pytest.raises(UserError, match="not a readable GGUF file"):
        resolve_source(str(path))


def test_fingerprint_follows_content_not_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 10)
    first = fingerprint(model)
    assert fingerprint(model) == first
    (model / "model.safetensors").write_bytes(b"b" * 11)
    assert fingerprint(model) != first
