"""No network and no writes outside the output directory and the cache: the environment our processes get."""

import os
import tempfile
from pathlib import Path

import pytest

from harness import cli
from harness.launcher import worker_environment
from harness.sandbox import OFFLINE

LOCATIONS = ("HF_HOME", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR",
             "GPTQMODEL_TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME")


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A user environment with its own HF_HOME, online (conftest's environment_restored puts os.environ and
    tempfile back afterwards)."""
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "users-hf-home"))
    for name in (*OFFLINE, "QUANTGATE_ALLOW_NETWORK", "QUANTGATE_HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "cache"


def test_worker_environment_is_offline_and_inside_the_cache(env):
    worker = worker_environment(os.environ)
    assert all(worker[name] == "1" for name in OFFLINE)
    for name in LOCATIONS:
        assert worker[name].startswith(str(env)), name
    assert worker["HF_HOME"] == str(env / "hf_home")  # the user's HF_HOME is not written to
    assert os.path.isdir(worker["TMPDIR"])


def test_worker_environment_honours_quantgate_hf_home_and_allow_network(env, monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTGATE_HF_HOME", str(tmp_path / "chosen"))
    monkeypatch.setenv("QUANTGATE_ALLOW_NETWORK", "1")
    worker = worker_environment(os.environ)
    assert worker["HF_HOME"] == str(tmp_path / "chosen")
    assert not any(name in worker for name in OFFLINE)


def test_worker_environment_is_made_from_the_environment_it_is_given(env):
    base = {"QUANTGATE_ALLOW_NETWORK": "1", "GPTQMODEL_CPU_WORKERS": "3", "PYTHONPATH": "/elsewhere", "MINE": "x",
            "HF_HOME": "/users/hf"}
    given = dict(base)
    worker = worker_environment(base)
    assert base == given  # not changed
    assert worker["MINE"] == "x" and "QUANTGATE_CACHE" not in worker  # nothing from os.environ
    assert not any(name in worker for name in OFFLINE)  # base allowed the network
    assert worker["GPTQMODEL_CPU_WORKERS"] == "3"  # the user's setting stands
    assert worker["PYTHONPATH"].split(os.pathsep)[1:] == ["/elsewhere"]
    assert worker["HF_HOME"] == str(env / "hf_home")
    for name in LOCATIONS:  # the cache is this process's
        assert worker[name].startswith(str(env)), name
    bare = worker_environment({})
    assert all(bare[name] == "1" for name in OFFLINE)
    assert bare["GPTQMODEL_CPU_WORKERS"] == str(max(1, os.cpu_count() or 1))
    assert "MINE" not in bare and "HOME" not in bare


def test_cli_process_is_confined_before_a_command_runs(env, capsys):
    assert cli.main(["cache", "ls"]) == 0
    assert all(os.environ[name] == "1" for name in OFFLINE)
    for name in LOCATIONS:
        assert os.environ[name].startswith(str(env)), name
    assert tempfile.gettempdir() == str(env / "tmp")


def test_plots_keep_matplotlib_config_in_the_cache(env):
    from harness.report.plots import render_plots
    from harness.report.schema import load_report

    render_plots(load_report(Path(__file__).parent / "fixtures" / "run_example" / "report.json"))
    assert os.environ["MPLCONFIGDIR"] == str(env / "matplotlib")


@pytest.mark.parametrize("allowed", [False, True])
def test_trust_remote_code_travels_in_every_worker_job(env, monkeypatch, tmp_path, allowed):
    from harness import artifacts, cachekeys, pipeline
    from harness.config import RunSpec
    from harness.launcher import WorkerExit
    from harness.policy import Policy
    from harness.quantize.base import Recipe
    from harness.records import RunInputs
    from harness.source import ModelSource

    jobs = []
    def fake_worker(job, *args, **kwargs):
        return jobs.append(job.to_json()) or WorkerExit(0, tmp_path / "log")

    monkeypatch.setattr(pipeline, "run_worker", fake_worker)  # the device job
    monkeypatch.setattr(artifacts, "run_worker", fake_worker)  # the quantize job
    monkeypatch.setattr(artifacts, "quantize_device_key", lambda quantizer, path: {"kind": "cpu"})
    monkeypatch.setattr(cachekeys, "measure_device_key", lambda threads: {"kind": "cpu"})
    model = tmp_path / "model"
    model.mkdir()
    spec = RunSpec(model=str(model), formats=["baseline", "int8"], out=str(tmp_path / "out"), trust_remote_code=allowed)
    inputs = RunInputs(spec, tmp_path / "out", ModelSource(str(model), "hf", model, "sha256:m"), {}, [],
                       Policy(), {"int8": Recipe("int8", bits=8, calibration_samples=0)}, {}, None)
    pipeline.run_format(inputs, "baseline")
    pipeline.run_format(inputs, "int8")  # the fake worker leaves no artifact: quantize is its only job
    assert [job["kind"] for job in jobs] == ["device", "quantize"]
    assert all(job["trust_remote_code"] is allowed for job in jobs)
    assert jobs[0]["seed"] == spec.seed and jobs[1]["recipe"]["seed"] == 0  # --seed reaches every worker


def test_worker_hands_trust_remote_code_to_the_quantizer(monkeypatch, tmp_path):
    import json

    import harness.quantize
    import harness.quantize.smoke
    from harness import worker
    from harness.jobs import QuantizeJob

    seen = {}

    class Quantizer:
        def quantize(self, source_path, recipe, calibration, out_dir, *, trust_remote_code=False):
            seen["trust_remote_code"] = trust_remote_code

    monkeypatch.setattr(harness.quantize, "quantizer_for", lambda name: Quantizer())
    # the artifact check is tested on real checkpoints in tests/test_quantize_check.py
    monkeypatch.setattr(harness.quantize.smoke, "check_artifact_generates",
                        lambda path, **kwargs: harness.quantize.smoke.SmokeResult(("ok",), (1,)))
    (tmp_path / "calibration.json").write_text("[]")
    job = {"out_dir": str(tmp_path / "artifact"), "calibration_path": str(tmp_path / "calibration.json"),
           "recipe": {"format": "int8", "bits": 8}, "manifest": {"engine": "fake"}, "source_path": str(tmp_path),
           "trust_remote_code": True}
    worker.run_quantize(QuantizeJob.from_json(job))
    assert seen == {"trust_remote_code": True}
    assert json.loads((tmp_path / "artifact" / "quantgate_manifest.json").read_text())["engine"] == "fake"


def test_worker_seeds_every_generator_from_the_job():
    import random

    import numpy
    import torch

    from harness.worker import seed_everything

    seed_everything(7)
    first = (random.random(), numpy.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (random.random(), numpy.random.rand(), torch.rand(1).item()) == first
    seed_everything(8)
    assert torch.rand(1).item() != first[2]
