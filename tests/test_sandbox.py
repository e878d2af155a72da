"""No network and no writes outside the output directory and the cache: the environment our processes get."""

import os
import tempfile

import pytest

from harness import cli
from harness.launcher import worker_environment
from harness.sandbox import OFFLINE

LOCATIONS = ("HF_HOME", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "MPLCONFIGDIR",
             "GPTQMODEL_TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME")


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A user environment with its own HF_HOME, online; os.environ and tempfile are restored afterwards."""
    saved, saved_tempdir = dict(os.environ), tempfile.tempdir
    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "users-hf-home"))
    for name in (*OFFLINE, "QUANTGATE_ALLOW_NETWORK", "QUANTGATE_HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "cache"
    os.environ.clear()
    os.environ.update(saved)
    tempfile.tempdir = saved_tempdir


def test_worker_environment_is_offline_and_inside_the_cache(env):
    worker = worker_environment()
    assert all(worker[name] == "1" for name in OFFLINE)
    for name in LOCATIONS:
        assert worker[name].startswith(str(env)), name
    assert worker["HF_HOME"] == str(env / "hf_home")  # the user's HF_HOME is not written to
    assert os.path.isdir(worker["TMPDIR"])


def test_worker_environment_honours_quantgate_hf_home_and_allow_network(env, monkeypatch, tmp_path):
    monkeypatch.setenv("QUANTGATE_HF_HOME", str(tmp_path / "chosen"))
    monkeypatch.setenv("QUANTGATE_ALLOW_NETWORK", "1")
    worker = worker_environment()
    assert worker["HF_HOME"] == str(tmp_path / "chosen")
    assert not any(name in worker for name in OFFLINE)


def test_cli_process_is_confined_before_a_command_runs(env, capsys):
    assert cli.main(["cache", "ls"]) == 0
    assert all(os.environ[name] == "1" for name in OFFLINE)
    for name in LOCATIONS:
        assert os.environ[name].startswith(str(env)), name
    assert tempfile.gettempdir() == str(env / "tmp")


def test_plots_keep_matplotlib_config_in_the_cache(env):
    from harness.report.plots import render_plots

    render_plots({})
    assert os.environ["MPLCONFIGDIR"] == str(env / "matplotlib")
